"""Operator tools: the ``switchyard`` console script and what its verbs run.

Why a package of its own: these tools sit *above* the fleet. They may import
``bridges``, ``tasks`` and ``workers`` to check a deployment, but nothing in
the live path (bridges, tasks, workers) imports them, so a check can grow
(new verbs, new probes) without touching a process that serves jobs.

- ``ops.cli``: the entry point; it knows no verb by name.
- ``ops.commands``: one module per top-level verb (``doctor``, ``health``, ``check``).
- ``ops.doctor``: what ``switchyard doctor`` checks.
- ``ops.health``: what ``switchyard health`` checks (a running fleet).
- ``ops.cairn_check``: the Cairn contract §10 conformance checks.
"""

import workers  # noqa: F401  (before any pydantic model: it switches off a start-up cost, see workers/__init__.py)
