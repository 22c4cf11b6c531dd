"""A kit plugin run by a pytest of its own, on a test module written for it, under the suite's warning rules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

KIT = Path(__file__).resolve().parent
# The suite's own rules (pyproject.toml ``filterwarnings``): a resource left open is an error.
SUITE_WARNINGS = ("-W", "error::ResourceWarning", "-W", "error::pytest.PytestUnraisableExceptionWarning")
INNER_TIMEOUT_S = 60.0


def run_with_plugin(folder: Path, plugin: str, module: str, text: str, *options: str) -> str:
    """Copy the kit's ``plugin`` module into ``folder``, write ``text`` there as ``module``, run pytest on it
    with the plugin and ``options``, and return what it printed (``-rA``: every outcome named)."""
    (folder / f"{plugin}.py").write_text((KIT / f"{plugin}.py").read_text())
    (folder / module).write_text(text)
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", plugin, *options, "-p", "no:cacheprovider",
                          *SUITE_WARNINGS, "-rA", module], cwd=folder, capture_output=True, text=True,
                         timeout=INNER_TIMEOUT_S)
    return run.stdout
