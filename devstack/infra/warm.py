"""Bytecode for what the fleet and the test suite import, written once after ``make setup``."""

from __future__ import annotations

import importlib
import warnings

# What the Procfile's processes, the embedded services and pytest's workers load. pip installs with
# --no-compile (compiling all ~11 000 modules of the venv one by one costs about 20 CPU-s); importing
# these writes the ~2 000 modules they use, so no fleet process or xdist worker compiles them again.
MODULES = ("tasks", "bridges.voicy", "bridges.cairn", "devstack.demo", "devstack.serve", "moto.server",
           "flower.command", "celery.bin.celery", "celery.apps.worker", "celery.apps.beat",
           "kombu.transport.redis", "redbeat", "honcho.command", "faster_whisper", "garth", "fitdecode",
           "pytest", "xdist")


def main() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a library's import-time deprecation notice is not ours to show here
        for name in MODULES:
            importlib.import_module(name)


if __name__ == "__main__":
    main()
