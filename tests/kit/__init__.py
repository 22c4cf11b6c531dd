"""The shared test kit: fleet set-ups, stacks and helpers that more than one test module uses.

Rules (``tests/meta/test_imports.py`` enforces the first two):

- A test module (``tests/test_*.py``) imports helpers from ``tests.kit`` only,
  never from another test module or from ``tests/conftest.py``: a test module
  is a list of tests, and moving or deleting one must never break another.
- The kit never imports a test module.
- Kit fixtures are registered once, in ``tests/conftest.py`` (``pytest_plugins``);
  a test module uses them by name and may override one with a fixture of its own.
- Everything the kit starts binds a free loopback port and lives under the
  test's ``tmp_path`` (or a uniquely named temporary directory), so xdist
  workers and other engineers' runs on the same machine never share one.
"""
