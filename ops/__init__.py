"""Operator tools (the ``switchyard`` script), above the fleet: no live-path module imports them."""

import workers  # noqa: F401  (before any pydantic model: it switches off a start-up cost, see workers/__init__.py)
