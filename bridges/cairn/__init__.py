"""The Cairn bridge (``python -m bridges cairn``), one module per concept; it imports no ``tasks``."""
