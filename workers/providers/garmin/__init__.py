"""The Garmin Connect provider: a credentials login through garth, original FIT files, dataset 1."""

# Imports nothing: the registry imports ``provider.GarminProvider`` by path, with no import cycle.
from __future__ import annotations
