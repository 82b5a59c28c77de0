"""import npydask pulls in none of the optional heavy packages."""

from __future__ import annotations

import subprocess
import sys

import npydask


def test_import_pulls_in_no_extras():
    code = (
        "import sys, npydask\n"
        "heavy = [m for m in ('cupy', 'kvikio', 'zarr', 'torch', 'distributed', 'obstore', 'boto3', 'botocore',\n"
        "                     'npydask.xarray', 'ray', 'npydask.ray', 'npydask.testing',\n"
        "                     'npydask.cache.node', 'npydask.cache.checksum', 'google_crc32c') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import npydask imported {out.stdout.strip()}"


def test_public_names_are_sorted_and_present():
    assert npydask.__all__ == sorted(npydask.__all__)
    for name in npydask.__all__:
        assert hasattr(npydask, name), name
    assert isinstance(npydask.__version__, str) and npydask.__version__.count(".") == 2


def test_help_opens_with_what_npydask_does_and_its_entry_points():
    import pydoc

    text = pydoc.render_doc(npydask, renderer=pydoc.plaintext)
    head = text.split("PACKAGE CONTENTS")[0]
    assert len(head.splitlines()) <= 60, "help(npydask) should fit a screen or two before the contents"
    assert "lazy Dask arrays" in head
    for name in [
        "from_npy",
        "read_region",
        "read_header",
        "open_dataset",
        "NpyDataset",
        "Loader",
        "to_npy",
        "to_npy_files",
        "to_zarr",
        "config",
        "NpyFormatError",
        "npydask.torch",
        "npydask --help",
        "docs/",
    ]:
        assert name in head, f"help(npydask) does not mention {name} before the package contents"
    # the entry-point table names public functions only, and all the main ones
    import re

    listed = set(re.findall(r"^ {8}([A-Za-z_]+)\(", head, flags=re.M))
    assert listed == {
        "from_npy",
        "from_npy_stack",
        "read_region",
        "read_header",
        "open_dataset",
        "Loader",
        "to_npy",
        "to_npy_files",
        "to_zarr",
        "zarr_store",
    }, listed
    assert listed <= set(npydask.__all__)


def test_urls_without_the_remote_extra_name_the_install_command(tmp_path):
    """Without obstore, a URL fails at the call with the install command (local paths are unaffected)."""
    code = (
        "import sys; sys.modules['obstore'] = None\n"
        "import numpy as np, npydask\n"
        f"np.save({str(tmp_path / 'a.npy')!r}, np.arange(3))\n"
        f"assert npydask.from_npy({str(tmp_path / 'a.npy')!r}).sum().compute() == 3\n"
        "for call in (lambda: npydask.read_header('s3://b/k.npy'), lambda: npydask.open_dataset('gs://b/p/'),\n"
        "             lambda: npydask.from_npy('https://h/x.npy')):\n"
        "    try:\n"
        "        call()\n"
        "    except ImportError as e:\n"
        "        print('ImportError:', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 3, out.stdout + out.stderr
    assert all("pip install 'npydask[remote]'" in line for line in lines), lines


def test_without_xarray_npydask_works_and_to_xarray_names_the_install_command(tmp_path):
    """npydask needs no xarray (dask.array imports it when present, npydask never does).

    to_xarray says what to install.
    """
    code = (
        "import sys; sys.modules['xarray'] = None\n"
        "import numpy as np, npydask\n"
        f"np.save({str(tmp_path / 'a.npy')!r}, np.arange(3))\n"
        f"ds = npydask.open_dataset({str(tmp_path)!r})\n"
        "assert int(ds.stack().sum().compute()) == 3\n"
        "try:\n"
        "    ds.to_xarray()\n"
        "except ImportError as e:\n"
        "    print('ImportError:', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "ImportError:" in out.stdout and "pip install 'npydask[xarray]'" in out.stdout, out.stdout + out.stderr


def test_npydask_torch_without_torch_names_the_install_command():
    """Hidden behind a meta-path blocker (as if never installed), torch's absence names the extra."""
    code = (
        "import sys\n"
        "class Blocker:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'torch':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Blocker())\n"
        "for m in [m for m in sys.modules if m.split('.')[0] == 'torch']: del sys.modules[m]\n"
        "import npydask\n"
        "try:\n"
        "    import npydask.torch\n"
        "except ModuleNotFoundError as e:\n"
        "    print(type(e).__name__, e.name, e, sep='|')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    kind, name, message = out.stdout.strip().split("|")
    assert (kind, name) == ("ModuleNotFoundError", "torch"), out.stdout + out.stderr
    assert "npydask.torch needs PyTorch, which is not installed: pip install 'npydask[torch]'" in message
