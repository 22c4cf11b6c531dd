"""The domain: Voicy and Cairn job logic, leases, engines and providers; no Celery here."""

from __future__ import annotations

import os
import sys

# garth depends on logfire, whose pydantic plugin pydantic loads at the first model class a process
# defines: that imports logfire, OpenTelemetry, requests and rich in every worker, pool child, bridge
# and CLI run, for a plugin that does nothing unless logfire is configured. An operator who uses it
# sets ``PYDANTIC_DISABLE_PLUGINS`` themselves (an empty value enables every plugin).
PYDANTIC_PLUGINS_OFF = "logfire-plugin"  # pydantic's PYDANTIC_DISABLE_PLUGINS: comma-separated entry-point names

os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", PYDANTIC_PLUGINS_OFF)

# httpx's ``__init__`` imports its command-line client (``httpx._main``: rich, pygments, click)
# whenever those are installed, and logfire (garth's dependency again) installs rich: a start-up
# cost in every fleet process for the ``httpx`` console command, which none of them runs.
# ``None`` in ``sys.modules`` makes that import fail,
# and httpx then defines a ``main`` that only prints how to install its CLI; the ``httpx``
# command itself, a process of its own that never imports this package, is untouched.
HTTPX_CLI_MODULE = "httpx._main"
if "httpx" not in sys.modules:
    sys.modules.setdefault(HTTPX_CLI_MODULE, None)  # type: ignore[arg-type]
