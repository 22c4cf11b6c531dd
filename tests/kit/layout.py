"""Where things are: the repository root and the product packages the import and design-map rules walk."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT_PACKAGES = ("tasks", "bridges", "workers", "ops", "devstack")
