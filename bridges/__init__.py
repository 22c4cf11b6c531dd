import workers  # noqa: F401  (before any pydantic model: it switches off a start-up cost, see workers/__init__.py)
