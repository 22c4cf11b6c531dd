"""The Garmin Connect provider: a credentials login through garth, original FIT files, dataset 1.

``GarminProvider`` (in ``provider.py``) is the only name the rest of
Switchyard needs; the registry imports it by path. One concept per module:
``settings`` (``CAIRN_GARMIN_*``), ``session`` (garth login, the in-memory
session per account, every Connect call under the shared budget), ``fit``
(the original download → decoded FIT messages, garmin-fit-sdk), ``mapping``
(FIT + summary → Cairn protojson), ``dataset`` (the archive and its one
parser). This package module imports nothing, so no import cycle.
"""

from __future__ import annotations
