"""A plug-in distribution installed the way pip leaves one: its modules and a ``dist-info`` with entry points.

Switchyard finds providers (``switchyard.providers``) and transcription engines
(``switchyard.engines``) through entry points, so a plug-in shipped on its own
touches no module of this repository. The tests' second provider
(``tests/filedrop.py``) and the capacity bench's null provider and engine
(``bench/plugins``) are installed here into a site directory of their own; a
process with that directory on its ``PYTHONPATH`` finds them as it would find
an installed package.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path


def install_distribution(site: Path, *, name: str, version: str, modules: Sequence[Path],
                         entry_points: Mapping[str, Mapping[str, str]]) -> Path:
    """Copy ``modules`` into ``site`` beside ``<name>-<version>.dist-info`` registering ``entry_points``
    (group → entry name → ``module:attr``); returns ``site`` (for ``PYTHONPATH``)."""
    site.mkdir(parents=True, exist_ok=True)
    for module in modules:
        shutil.copy(module, site / module.name)
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{entry} = {target}\n" for entry, target in targets.items())
        for group, targets in entry_points.items()))
    (info / "top_level.txt").write_text("".join(f"{module.stem}\n" for module in modules))
    return site
