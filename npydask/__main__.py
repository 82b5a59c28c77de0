"""``python -m npydask``: the same as the ``npydask`` command."""

from __future__ import annotations

import sys

from npydask.cli import main

if __name__ == "__main__":
    sys.exit(main())
