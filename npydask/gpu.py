"""The GPU path: ``device="gpu"`` chunks are CuPy arrays read with kvikio.

:func:`on_device` wraps the host array-likes (one file, optionally cut to a
ROI, or a group of files stacked or concatenated) in a :class:`DeviceArray`
whose ``__getitem__`` returns a ``cupy.ndarray`` with the host semantics:
basic indexing, ROI cells outside the file filled with the fill value, native
byte order (``>f4`` gives ``<f4``), C order for Fortran files. Each task plans
its reads (:mod:`npydask.gpu_plan`: aligned, coalesced, task-sized) and runs
them with :mod:`npydask.backends.kvikio`; a deflated ``.npz`` member is
inflated on the host and copied over.

Everything is checked where the lazy array is built, not in the tasks:

- CuPy must import (else ``ImportError`` with ``pip install 'npydask[gpu]'``)
  and see a CUDA device (else :class:`~npydask.errors.GpuUnavailableError`).
  CuPy imports on machines without a driver, so ``cupy.cuda.is_available()``
  decides. A client without a GPU therefore cannot build a ``device="gpu"``
  graph for GPU workers, even though only the workers would read: dask needs
  a ``cupy.ndarray`` meta on the client, and SPEC wants the failure at call
  time rather than inside a task. Build the graph where a GPU is (a GPU client,
  or a function submitted to a GPU worker).
- The dtype must be one CuPy holds (:func:`check_gpu_dtype`).

``import npydask`` imports none of this module's heavy dependencies: CuPy and
kvikio are imported inside functions.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from npydask.errors import GpuUnavailableError
from npydask.gpu_plan import GpuReadOptions, gpu_read_options, native_dtype, plan_gpu_read
from npydask.gpu_toolkit import check_toolkit
from npydask.region import Box

__all__ = ["INSTALL_HINT", "DeviceArray", "check_gpu_dtype", "on_device", "require_gpu"]

INSTALL_HINT = "install the GPU extra with: pip install 'npydask[gpu]' (CuPy and kvikio for CUDA 12)"

_ITEMSIZES = {"b": (1,), "i": (1, 2, 4, 8), "u": (1, 2, 4, 8), "f": (2, 4, 8), "c": (8, 16)}
"""The dtypes CuPy holds: bool, signed and unsigned ints, float16/32/64, complex64/128."""


def require_gpu() -> None:
    """Raise unless CuPy imports and sees a usable CUDA device.

    Raises
    ------
    ImportError
        CuPy is not installed (or fails to import).
    GpuUnavailableError
        CuPy is installed but no CUDA device or driver is usable (a ``RuntimeError``).
    """
    try:
        found = importlib.util.find_spec("cupy") is not None
    except ValueError:  # a module in sys.modules without a spec (a stand-in): let the import decide
        found = True
    if not found:
        raise ImportError(f'device="gpu" needs CuPy, which is not installed; {INSTALL_HINT}')
    try:
        import cupy
    except ImportError as e:
        raise ImportError(f'device="gpu": CuPy is installed but fails to import ({e}); {INSTALL_HINT}') from e
    try:
        usable = bool(cupy.cuda.is_available())
    except Exception as e:  # a broken driver install raises from CuPy's C layer
        raise GpuUnavailableError(f'device="gpu": CuPy cannot reach a CUDA device ({e}); {INSTALL_HINT}') from e
    if not usable:
        raise GpuUnavailableError(
            'device="gpu": CuPy is installed but sees no usable CUDA device or driver; '
            f"run on a machine with an NVIDIA GPU, or use device='cpu'. ({INSTALL_HINT})"
        )


def check_gpu_dtype(dtype: Any, path: str | None = None) -> np.dtype:
    """The native-byte-order dtype the device will hold; ``TypeError`` for one CuPy cannot hold.

    CuPy holds bool, signed and unsigned 8-64 bit ints, float16/32/64 and
    complex64/128. Strings (``S``, ``U``), ``void`` and structured dtypes,
    datetimes and timedeltas, long doubles and objects are refused.

    Raises
    ------
    TypeError
        Naming the dtype, the file, and what to do instead.

    Examples
    --------
    >>> check_gpu_dtype(np.dtype(">f4")).str
    '<f4'
    >>> check_gpu_dtype(np.dtype("M8[s]"), "t.npy")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    TypeError: t.npy: dtype datetime64[s] ('<M8[s]') cannot be held by CuPy, ...
    """
    dtype = np.dtype(dtype)
    if dtype.fields is None and dtype.subdtype is None and dtype.itemsize in _ITEMSIZES.get(dtype.kind, ()):
        return native_dtype(dtype)
    kind = dtype.kind
    if dtype.fields is not None:
        how = "select a numeric field, cupy.asarray(x['name'])"
    elif kind in "Mm":
        how = "view it as integers, cupy.asarray(x.view('int64'))"
    elif kind in "fc":
        how = f"convert it, cupy.asarray(x.astype('{'float64' if kind == 'f' else 'complex128'}'))"
    else:
        how = "convert what you need to a numeric dtype on the host first"
    where = f"{path}: " if path else ""
    raise TypeError(
        f"{where}dtype {dtype} ({dtype.str!r}) cannot be held by CuPy, which supports bool, int8-64, "
        f'uint8-64, float16/32/64 and complex64/128; read it with device="cpu" and move a view of a '
        f"supported dtype to the GPU yourself: {how}"
    )


def _array_module() -> Any:
    """CuPy, after checking it sees a device and, once per process, compiles a kernel (tasks fail clearly)."""
    require_gpu()
    import cupy

    check_toolkit(cupy)  # (once per process: NVRTC compiles and runs one tiny kernel, else a clear error)
    return cupy


def on_device(source: Any, options: GpuReadOptions | None = None) -> DeviceArray:
    """The GPU twin of a host array-like: one file (``NpyFileArray``) or a group (``FileGroup``).

    Checks now that CuPy sees a device and that the dtype is one CuPy holds,
    and freezes the GPU read settings (:func:`~npydask.gpu_plan.gpu_read_options`)
    into the array, as the host settings are frozen into each file reference.

    Raises
    ------
    ImportError, GpuUnavailableError
        As :func:`require_gpu`.
    TypeError
        As :func:`check_gpu_dtype`, naming the (first) file.
    """
    require_gpu()
    views = _views(source)
    check_gpu_dtype(views[0].dtype if views else source.dtype, views[0].ref.path if views else None)
    return DeviceArray(source, options or gpu_read_options())


def _views(source: Any) -> Sequence[Any]:
    return source.views if hasattr(source, "views") else (source,)


class DeviceArray:
    """An array-like whose ``__getitem__`` reads a region of one file or a group onto the GPU.

    Holds the host array-like and the GPU read settings only: it pickles as
    paths and header facts, and plans and reads inside each task.
    """

    __slots__ = ("options", "source")

    def __init__(self, source: Any, options: GpuReadOptions | None = None) -> None:
        self.source = source
        self.options = options or GpuReadOptions()

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.source.shape)

    @property
    def dtype(self) -> np.dtype:
        return native_dtype(self.source.dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def meta(self) -> Any:
        """An empty ``cupy.ndarray`` of this dtype and ndim, for ``dask.array.from_array``."""
        return _array_module().empty((0,) * self.ndim, dtype=self.dtype)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"DeviceArray({self.source!r})"

    def __dask_tokenize__(self) -> Any:
        return (self.source.__dask_tokenize__(), "gpu", dataclasses.astuple(self.options))

    def __reduce__(self) -> tuple[Any, ...]:
        return (DeviceArray, (self.source, self.options))

    def __getitem__(self, index: Any) -> Any:
        from npydask.array import split_index

        box, post = split_index(index, self.shape)
        xp = _array_module()
        block = self.read(box, xp)
        if post:
            block = block[post]
            if not block.flags.c_contiguous:
                block = block.copy()
        return block

    def read(self, box: Box, xp: Any) -> Any:
        """Read ``box`` (in this array's coordinates) as a C-contiguous ``xp`` array."""
        source = self.source
        if not hasattr(source, "views"):
            return self._read([(source, box, None)], xp)[0]
        if source.stacked:
            out = xp.empty(box.shape, dtype=self.dtype)
            inner = Box(box.start[1:], box.stop[1:])
            self._read([(source.views[k], inner, out[k - box.start[0]]) for k in range(box.start[0], box.stop[0])], xp)
            return out
        return self._read_joined(box, xp)

    def _read_joined(self, box: Box, xp: Any) -> Any:
        """Files joined along ``axis``: each file's share of ``box`` into its slice of the block."""
        views, axis = self.source.views, self.source.axis
        out = xp.empty(box.shape, dtype=self.dtype)
        lo, hi = box.start[axis], box.stop[axis]
        items, places, end = [], [], 0
        for view in views:
            begin, end = end, end + view.shape[axis]
            a, b = max(lo, begin), min(hi, end)
            if a >= b:
                continue
            start, stop = list(box.start), list(box.stop)
            start[axis], stop[axis] = a - begin, b - begin
            where = tuple(slice(a - lo, b - lo) if d == axis else slice(None) for d in range(len(box.shape)))
            direct = axis == 0  # a slab along axis 0 of a C-contiguous block is C-contiguous
            items.append((view, Box(tuple(start), tuple(stop)), out[where] if direct else None))
            places.append(None if direct else where)
        for where, block in zip(places, self._read(items, xp)):
            if where is not None:
                out[where] = block
        return out

    def _read(self, items: Sequence[tuple[Any, Box, Any]], xp: Any) -> list[Any]:
        """Read each ``(view, box, out)``: planned files through the device reader, deflated ones on the host."""
        from npydask.backends.kvikio import DeviceRead, read_to_device

        results: list[Any] = [None] * len(items)
        jobs, where = [], []
        for k, (view, box, out) in enumerate(items):
            ref = view.ref
            if ref.compressed:  # a deflated .npz member: only the host can inflate it
                host = np.asarray(view.read(box), dtype=native_dtype(ref.header.dtype), order="C")
                block = xp.asarray(host)
                if out is not None:
                    out[...] = block
                    block = out
                results[k] = block
                continue
            size = getattr(ref.identity, "size", None)  # (headers="first" knows only the inode: the header's size)
            size = ref.header.data_offset + ref.header.nbytes if size is None else size
            plan = plan_gpu_read(ref.header, box, file_size=size, roi=view.roi, options=self.options)
            jobs.append(DeviceRead(ref, plan, out))
            where.append(k)
        for k, block in zip(where, read_to_device(jobs, xp)):
            results[k] = block
        return results
