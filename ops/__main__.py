"""``python -m ops ...`` is ``switchyard ...`` without the console script installed."""

from __future__ import annotations

import sys

from ops.cli import main

if __name__ == "__main__":
    sys.exit(main())
