"""npydask: NumPy ``.npy`` files as lazy Dask arrays.

Each chunk is a tiny task that carries only a path, the header facts and a
region; whichever worker runs it reads exactly that region (``pread`` or a
memory mapping). Headers are parsed strictly and never evaluated; object
arrays are refused, never unpickled.

Main entry points (``help(npydask.<name>)`` for each)::

    from_npy(path, chunks="auto")      one file, or an .npz member (key=), as a lazy dask array
    from_npy_stack(dirname)            a dask.array.to_npy_stack folder, its pickled info never run
    read_region(path, start, stop)     a box of a file as a numpy array, reading only its bytes
    read_header(path)                  shape, dtype, order, payload offset: an NpyHeader
    open_dataset(file_root, ...)       many files, NVIDIA DALI fn.readers.numpy style (filter,
                                       file lists, ROIs, shards): an NpyDataset with ds[i],
                                       ds.stack(), ds.concatenate(axis)
    Loader(dataset, batch_size)        training batches epoch after epoch (shuffle, shards,
                                       resume); npydask.torch adapts datasets to PyTorch
    to_npy(x, path)                    write a dask array as one .npy file, chunks in parallel
    to_npy_files(arrays, folder)       one .npy file per array (or per file of a dataset)
    to_zarr(x, store)                  zarr v3, dask chunks aligned to zarr shards
    zarr_store(url, storage_options)   the zarr store to_zarr wrote through, to read it back

``config`` holds the read settings (environment-variable twins, usable as a
context manager). Errors: ``NpyFormatError`` (a ``ValueError``: not a valid
``.npy`` file), ``RoiError`` (a ``ValueError``: a region outside the array),
``FileChangedError`` (an ``OSError`` raised by a task whose file changed),
``GpuUnavailableError``; missing files raise the builtin ``OSError``
subclasses. Several files go through ``open_dataset``, not ``from_npy``.

More: the documentation in ``docs/`` (user guides, DALI parity, settings, the API,
measured figures; the README links into it), the command line
(``npydask --help``: info, stats, convert, demo, bench) and ``examples/``.

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

from npydask import config, samplers
from npydask.array import from_npy
from npydask.cache.spec import Cache
from npydask.dataset.npy_dataset import NpyDataset
from npydask.dataset.npy_stack import from_npy_stack
from npydask.dataset.open import open_dataset
from npydask.dataset.zipped import zip_datasets
from npydask.errors import FileChangedError, GpuUnavailableError, NpyDaskWarning, NpyFormatError, RoiError
from npydask.format.header import NpyHeader, parse_header
from npydask.loader import Loader
from npydask.plan.traffic_plan import TrafficPlan
from npydask.reader import read_header, read_region
from npydask.storage.io_counts import io_stats
from npydask.write.npy import to_npy, to_npy_files
from npydask.write.zarr import to_zarr
from npydask.write.zarr_store import zarr_store

__version__ = "0.1.0"

__all__ = [
    "Cache",
    "FileChangedError",
    "GpuUnavailableError",
    "Loader",
    "NpyDaskWarning",
    "NpyDataset",
    "NpyFormatError",
    "NpyHeader",
    "RoiError",
    "TrafficPlan",
    "__version__",
    "config",
    "from_npy",
    "from_npy_stack",
    "io_stats",
    "open_dataset",
    "parse_header",
    "read_header",
    "read_region",
    "samplers",
    "to_npy",
    "to_npy_files",
    "to_zarr",
    "zarr_store",
    "zip_datasets",
]
