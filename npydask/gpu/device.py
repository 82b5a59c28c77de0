"""The GPU path: ``device="gpu"`` chunks are CuPy arrays read with kvikio.

:func:`on_device` wraps the host array-likes (one file, optionally cut to a
ROI, or a group of files stacked or concatenated) in a :class:`DeviceArray`
whose ``__getitem__`` returns a ``cupy.ndarray`` with the host semantics:
basic indexing, ROI cells outside the file filled with the fill value, native
byte order (``>f4`` gives ``<f4``), C order for Fortran files. Each task plans
its reads (:mod:`npydask.gpu.plan`: aligned, coalesced, task-sized) and runs
them with :mod:`npydask.gpu._kvikio`; a deflated ``.npz`` member is
inflated on the host and copied over.

Everything is checked where the lazy array is built, not in the tasks:

- CuPy must import (else ``ImportError`` with :data:`INSTALL_HINT`) and a CUDA
  device must be visible (else :class:`~npydask.errors.GpuUnavailableError`),
  found through NVML or the driver's device files without initialising CUDA
  (:mod:`npydask.gpu.process`), so a fork after the check stays safe. A client
  without a GPU therefore cannot build a ``device="gpu"`` graph for GPU
  workers, even though only the workers would read: dask needs a
  ``cupy.ndarray`` meta on the client, and a missing GPU fails at call
  time rather than inside a task. Build the graph where a GPU is (a GPU client,
  or a function submitted to a GPU worker: :data:`WORKER_HINT`).
- The dtype must be one CuPy holds (:func:`check_gpu_dtype`).

``import npydask`` imports none of this module's heavy dependencies: CuPy and
kvikio are imported inside functions.
"""

from __future__ import annotations

import bisect
import dataclasses
import importlib.util
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from npydask.errors import GpuUnavailableError, install_hint
from npydask.gpu.plan import GpuReadOptions, gpu_read_options, native_dtype, plan_gpu_read, through_host
from npydask.gpu.process import check_cuda_fork, note_cuda_use, visible_devices
from npydask.gpu.toolkit import check_toolkit
from npydask.plan.region import Box

__all__ = ["INSTALL_HINT", "WORKER_HINT", "DeviceArray", "array_module", "check_gpu_dtype", "on_device", "require_gpu"]

INSTALL_HINT = "install the GPU extra matching the CUDA driver (the CUDA version nvidia-smi shows): " + install_hint(
    "cupy"
)

WORKER_HINT = (
    "A client without a GPU drives GPU workers by building and reducing the graph on a worker: "
    'client.submit(fn).result(), where fn opens the data with device="gpu" and returns its (small) result'
)
"""What works for a CPU-only client of GPU workers (dask needs CuPy where the graph is built)."""

_CHECKED: tuple[int, str | None] | None = None
"""``(pid, CUDA_VISIBLE_DEVICES)`` when this process last found a device (tasks check again: no second count)."""

_ITEMSIZES = {"b": (1,), "i": (1, 2, 4, 8), "u": (1, 2, 4, 8), "f": (2, 4, 8), "c": (8, 16)}
"""The dtypes CuPy holds: bool, signed and unsigned ints, float16/32/64, complex64/128."""


def require_gpu() -> None:
    """Raise unless CuPy imports and a CUDA device is visible, without initialising CUDA.

    A device is visible when NVML (``nvidia-ml-py``) or, without it, the
    driver's device files show one that ``CUDA_VISIBLE_DEVICES`` does not hide
    (:func:`npydask.gpu.process.visible_devices`). Nothing here creates a
    CUDA context, so a process forked after the check (a DataLoader worker)
    can still use CUDA; a process forked after CUDA *was* used is refused
    (:func:`npydask.gpu.process.check_cuda_fork`). A broken toolkit shows
    at the first device read.

    Raises
    ------
    ImportError
        CuPy is not installed (or fails to import).
    GpuUnavailableError
        No CUDA device is visible, or this process was forked after CUDA
        was initialised (a ``RuntimeError``).
    """
    global _CHECKED
    check_cuda_fork()
    try:
        found = importlib.util.find_spec("cupy") is not None
    except ValueError:  # a module in sys.modules without a spec (a stand-in): let the import decide
        found = True
    if not found:
        raise ImportError(f'device="gpu" needs CuPy, which is not installed; {INSTALL_HINT}. {WORKER_HINT}')
    try:
        import cupy  # noqa: F401  (importing CuPy does not initialise CUDA)
    except ImportError as e:
        raise ImportError(f'device="gpu": CuPy is installed but fails to import ({e}); {INSTALL_HINT}') from e
    here = (os.getpid(), os.environ.get("CUDA_VISIBLE_DEVICES"))
    if _CHECKED == here:  # (devices counted once per process: NVML's start costs milliseconds)
        return
    devices = visible_devices()
    if not devices:
        raise GpuUnavailableError(
            f'device="gpu": CuPy is installed but sees no usable CUDA device ({devices.how}); run on a machine '
            f"with an NVIDIA GPU, or use device='cpu'. {WORKER_HINT}. ({INSTALL_HINT})"
        )
    _CHECKED = here


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


def array_module() -> Any:
    """CuPy, after checking it sees a device and, once per process, compiles a kernel (tasks fail clearly)."""
    require_gpu()
    import cupy

    note_cuda_use()  # (a child forked from now on is refused before its first CUDA call)
    check_toolkit(cupy)  # (once per process: NVRTC compiles and runs one tiny kernel, else a clear error)
    return cupy


def on_device(source: Any, options: GpuReadOptions | None = None) -> DeviceArray:
    """The GPU twin of a host array-like: one file (``NpyFileArray``) or a group (``FileGroup``).

    Checks now that CuPy sees a device and that the dtype is one CuPy holds,
    and freezes the GPU read settings (:func:`~npydask.gpu.plan.gpu_read_options`)
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
        return array_module().empty((0,) * self.ndim, dtype=self.dtype)

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
        from npydask.plan.region import split_index

        box, post = split_index(index, self.shape)
        xp = array_module()
        block = self.read(box, xp)
        if post:
            block = block[post]
            if not block.flags.c_contiguous:
                block = block.copy()
        return block

    def read(self, box: Box, xp: Any) -> Any:
        """Read ``box`` (in this array's coordinates) as a C-contiguous ``xp`` array.

        A block whose first file plans small reads (:func:`~npydask.gpu.plan.through_host`),
        or lies in object storage, is read by the host path (its tight loop,
        per-header memo and request concurrency) and copied to the device once.
        """
        source = self.source
        plans: dict[tuple[Any, ...], Any] = {}  # per distinct (header, ROI, size, box): its plan
        if not hasattr(source, "views"):
            met: list[tuple[Any, Box, Any]] = [(source, box, None)]
        elif source.stacked:
            inner = Box(box.start[1:], box.stop[1:])
            met = [(source.views[box.start[0]], inner, None)] if box.stop[0] > box.start[0] else []
        else:
            parts = self._met(box)
            met = [(view, part, None) for view, part, _ in parts[:1]]
        if met and math.prod(box.shape) > 0 and self._through_host(met[0][0], met[0][1], plans):
            return self._read_host(box, xp)
        if not hasattr(source, "views"):
            return self._read([(source, box, None)], xp, plans)[0]
        out = xp.empty(box.shape, dtype=self.dtype)
        if source.stacked:
            views = source.views
            self._read([(views[k], inner, out[k - box.start[0]]) for k in range(box.start[0], box.stop[0])], xp, plans)
            return out
        direct = source.axis == 0  # a slab along axis 0 of a C-contiguous block is C-contiguous
        items = [(view, part, out[where] if direct else None) for view, part, where in parts]
        for (_, _, where), block in zip(parts, self._read(items, xp, plans)):
            if not direct:
                out[where] = block
        return out

    def _met(self, box: Box) -> list[tuple[Any, Box, tuple[slice, ...]]]:
        """Files joined along ``axis``: ``(view, part, where)`` for each file ``box`` meets (bisected,
        as the host FileGroup does: a view is made per file over a table), ``where`` in the block."""
        views, axis, offsets = self.source.views, self.source.axis, self.source.offsets
        lo, hi = box.start[axis], box.stop[axis]
        items = []
        first = max(0, bisect.bisect_right(offsets, lo) - 1)
        last = min(len(offsets) - 1, bisect.bisect_left(offsets, hi))
        for k in range(first, last):
            begin, end = offsets[k], offsets[k + 1]
            a, b = max(lo, begin), min(hi, end)
            if a >= b:
                continue
            start, stop = list(box.start), list(box.stop)
            start[axis], stop[axis] = a - begin, b - begin
            where = tuple(slice(a - lo, b - lo) if d == axis else slice(None) for d in range(len(box.shape)))
            items.append((views[k], Box(tuple(start), tuple(stop)), where))
        return items

    def _plan(self, view: Any, box: Box, plans: dict[tuple[Any, ...], Any]) -> Any:
        """The plan of ``box`` of ``view``, worked out once per distinct header, ROI, size and box."""
        ref = view.ref
        size = getattr(ref.identity, "size", None)  # (headers="first" knows only the inode: the header's size)
        size = ref.header.data_offset + ref.header.nbytes if size is None else size
        key = (id(ref.header), id(view.roi), size, box)  # (the views live as long as the dict: ids are safe)
        plan = plans.get(key)
        if plan is None:
            plan = plans[key] = plan_gpu_read(ref.header, box, file_size=size, roi=view.roi, options=self.options)
        return plan

    def _through_host(self, view: Any, box: Box, plans: dict[tuple[Any, ...], Any]) -> bool:
        """Whether a block whose first file is ``view`` is read on the host and copied once."""
        ref = view.ref
        if ref.compressed or ref.source.concurrent:  # inflated on the host; fetched with the CPU's concurrency
            return True
        return through_host(self._plan(view, box, plans), self.options)

    def _read_host(self, box: Box, xp: Any) -> Any:
        """``box`` read by the host path (the CPU reader: its loops, memo, concurrency), then one copy."""
        source = self.source
        if hasattr(source, "views"):
            host = source[tuple(slice(a, b) for a, b in zip(box.start, box.stop))]
        else:
            host = source.read(box)
        return to_device(np.asarray(host, dtype=self.dtype, order="C"), xp)

    def _read(self, items: Sequence[tuple[Any, Box, Any]], xp: Any, plans: dict[tuple[Any, ...], Any]) -> list[Any]:
        """Read each ``(view, box, out)``: planned files through the device reader, deflated ones on the host."""
        from npydask.gpu._kvikio import DeviceRead, read_to_device

        results: list[Any] = [None] * len(items)
        jobs, where = [], []
        for k, (view, box, out) in enumerate(items):
            ref = view.ref
            if ref.compressed:  # a deflated .npz member: only the host can inflate it
                block = to_device(np.asarray(view.read(box), dtype=native_dtype(ref.header.dtype), order="C"), xp)
                if out is not None:
                    out[...] = block
                    block = out
                results[k] = block
                continue
            jobs.append(DeviceRead(ref, self._plan(view, box, plans), out))
            where.append(k)
        for k, block in zip(where, read_to_device(jobs, xp)):
            results[k] = block
        return results


def to_device(host: np.ndarray, xp: Any) -> Any:
    """A C-contiguous host array copied to ``xp``'s device (one host-to-device copy, through the
    thread's ring of pinned buffers: :mod:`npydask.gpu._pinned`); numpy standing in keeps it."""
    if xp is np:
        return host
    from npydask.gpu._pinned import upload_array

    return upload_array(host, xp)
