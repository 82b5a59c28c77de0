"""npydask: NumPy ``.npy`` files as lazy Dask arrays.

Each chunk is a tiny task that carries only a path, header facts and a region;
the worker that runs it reads exactly that region.

Examples
--------
>>> import numpy as np, npydask, tempfile, os
>>> p = os.path.join(tempfile.mkdtemp(), "vol.npy"); np.save(p, np.arange(24.0).reshape(2, 3, 4))
>>> npydask.read_header(p).shape
(2, 3, 4)
>>> x = npydask.from_npy(p)
>>> float(x[1].sum().compute())
210.0
"""

from __future__ import annotations

from npydask import config
from npydask.array import from_npy
from npydask.dataset import NpyDataset, open_dataset
from npydask.errors import FileChangedError, GpuUnavailableError, NpyDaskWarning, NpyFormatError, RoiError
from npydask.header import NpyHeader, parse_header
from npydask.loader import Loader
from npydask.reader import read_header, read_region
from npydask.writer import to_npy, to_npy_files
from npydask.zarr_writer import to_zarr

__version__ = "0.1.0"

__all__ = [
    "FileChangedError",
    "GpuUnavailableError",
    "Loader",
    "NpyDaskWarning",
    "NpyDataset",
    "NpyFormatError",
    "NpyHeader",
    "RoiError",
    "__version__",
    "config",
    "from_npy",
    "open_dataset",
    "parse_header",
    "read_header",
    "read_region",
    "to_npy",
    "to_npy_files",
    "to_zarr",
]
