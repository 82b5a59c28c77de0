"""import npydask pulls in none of the optional heavy packages."""

from __future__ import annotations

import subprocess
import sys

import npydask


def test_import_pulls_in_no_extras():
    code = (
        "import sys, npydask\n"
        "heavy = [m for m in ('cupy', 'kvikio', 'zarr', 'torch', 'distributed') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import npydask imported {out.stdout.strip()}"


def test_public_names_are_sorted_and_present():
    assert npydask.__all__ == sorted(npydask.__all__)
    for name in npydask.__all__:
        assert hasattr(npydask, name), name
    assert isinstance(npydask.__version__, str) and npydask.__version__.count(".") == 2
