"""A strict stand-in for CuPy and a fake kvikio: CPU tests that fail where a GPU would.

numpy standing in for CuPy hides the mistakes a GPU punishes: numpy accepts
host and device arrays mixed together, and a synchronous fake kvikio that
returns short reads never raises where the real one does. This module holds
stand-ins that behave like the real libraries in those respects, over host
memory:

:class:`ndarray`
    Not a ``numpy.ndarray`` (it wraps one). ``numpy.asarray(x)`` raises
    ``TypeError`` as CuPy does; numpy functions and ufuncs dispatch to the
    stand-in (``__array_function__``, ``__array_ufunc__``) and refuse host
    arrays as CuPy does (``np.concatenate([host, dev])`` and ``dev + host``:
    "Unsupported type"; ``np.stack([dev, host])``: "Argument 'a' has incorrect
    type"); Python and numpy
    scalars mix freely. Reductions return 0-d arrays, ``.get()`` gives numpy,
    ``.set(host)`` checks dtype, shape and contiguity as CuPy does, ``x[...] =
    host`` raises as CuPy's fill does (0-d host arrays fill; advanced indexes copy). Each array remembers the
    device current when it was made; kernels on an array of another device
    raise ``ValueError`` (no peer access).
:data:`cupy`
    A module object for ``sys.modules["cupy"]``: ``asarray`` (host to device),
    ``empty``/``zeros``/``full``/..., ``stack``, ``concatenate``,
    ``get_array_module``, ``asnumpy``, ``ElementwiseKernel``, ``cuda``
    (``Device`` with a current device per thread, ``runtime``, streams and
    events recorded in :attr:`State.log`, ``alloc_pinned_memory`` rounding up
    to a power of two like CuPy's pinned pool, ``is_available``), and every
    other numpy function lifted to stand-in arrays. dask's dispatch
    (``concatenate_lookup``, ``tensordot_lookup``, ``einsum_lookup``,
    ``empty_lookup``, ...) is registered for :class:`ndarray` exactly as
    ``dask.array.backends.register_cupy`` registers ``cupy.ndarray``.
:func:`make_kvikio`
    A fake kvikio modelled on kvikio 26.10 in compatibility mode:
    ``import kvikio`` does not import ``kvikio.defaults`` or
    ``kvikio.cufile_driver`` (import them explicitly, as with the real one);
    ``CuFile(path, "r")`` opens two descriptors (counted process-wide);
    ``pread`` returns a future run on the fake's own pool of
    ``defaults.get("num_threads")`` threads, except device reads under
    ``gds_threshold`` (16 KiB), which run synchronously on the calling thread
    and raise from ``pread`` itself; a read past the end of the file raises
    ``RuntimeError("... POSIX error on pread: EOF")`` instead of returning a
    short count.
:func:`installed`
    A context manager putting both (and a fake ``pynvml`` counting the same
    devices) into ``sys.modules`` and restoring what was there afterwards.

What it cannot show is listed in ``tests/gpu/test_gpu_strict.py``: the order of
work on real CUDA streams, NVRTC and kernel compilation, GPUDirect Storage,
the driver, and speed.

Examples
--------
>>> import numpy as np
>>> with installed() as sim:
...     import cupy
...     x = cupy.asarray(np.arange(6.0).reshape(2, 3))
...     total = x.sum()
...     (type(x).__module__, type(total).__name__, total.ndim, float(total), x.get()[1, 2])
('cupy', 'ndarray', 0, 15.0, np.float64(5.0))
>>> with installed():
...     np.asarray(cupy.zeros(3))  # doctest: +ELLIPSIS
Traceback (most recent call last):
TypeError: Implicit conversion to a NumPy array is not allowed. Please use `.get()` ...

This module imports neither CuPy nor kvikio, and ``import npydask`` does not
import it.
"""

from __future__ import annotations

import ast
import concurrent.futures
import contextlib
import enum
import importlib
import importlib.abc
import importlib.machinery
import itertools
import operator
import os
import sys
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import numpy as np

_Order = Literal["K", "A", "C", "F"]
"""The memory layouts numpy (and CuPy) accept where a copy is made."""
_OrderACF = Literal["A", "C", "F"]
"""The layouts a reshape accepts."""
_OrderCF = Literal["C", "F"]
"""The layouts a new array is allocated in."""
_Casting = Literal["no", "equiv", "safe", "same_kind", "unsafe"]
"""numpy's casting rules."""

__all__ = ["NVRTC_ERROR", "State", "cupy", "installed", "make_kvikio", "ndarray", "state"]

NVRTC_ERROR = (
    "CuPy failed to load libnvrtc.so.13: OSError: libnvrtc.so.13: cannot open shared object file: "
    "No such file or directory"
)
"""What CuPy raises (``RuntimeError``) at the first kernel when NVRTC is missing."""

_COMPARISONS = {"greater", "greater_equal", "less", "less_equal", "equal", "not_equal"}


class CUDARuntimeError(RuntimeError):
    """``cupy_backends.cuda.api.runtime.CUDARuntimeError`` (a ``RuntimeError``)."""


class State:
    """What the stand-in records and how it is configured (reset by :func:`installed`).

    Attributes
    ----------
    devices : int
        Devices the simulated machine has.
    log : list of tuple
        ``(event, detail, thread name, device)`` for stream syncs, event
        records and waits, device switches and kernels (``ElementwiseKernel``).
    nvrtc_broken : bool
        Every kernel (ufuncs, copies, ``fill``, reductions, ``ElementwiseKernel``)
        raises :data:`NVRTC_ERROR` as a CuPy without NVRTC does; allocation,
        ``set`` and ``get`` still work.
    kernels : dict
        Python callables run by ``ElementwiseKernel`` of that name,
        ``f(*inputs_as_numpy) -> numpy result``.
    cuda_pid : int or None
        The process that initialised CUDA (a child forked after it fails its
        first CUDA call with "initialization error", as on a GPU).
    pinned_allocs, pinned_bytes : int
        ``alloc_pinned_memory`` calls and bytes pinned (rounded up to a power of two).
    peer_access : bool
        Whether kernels may touch an array of another device (default no: ``ValueError``).
    """

    def __init__(self, devices: int = 1) -> None:
        self.devices = devices
        self.log: list[tuple[Any, ...]] = []
        self.nvrtc_broken = False
        self.kernels: dict[str, Callable[..., Any]] = {}
        self.cuda_pid: int | None = None
        self.pinned_allocs = 0
        self.pinned_bytes = 0
        self.peer_access = False
        self.local = threading.local()

    def record(self, event: str, detail: Any = None) -> None:
        self.log.append((event, detail, threading.current_thread().name, current_device()))

    def events(self, name: str) -> list[tuple[Any, ...]]:
        """The log entries of one kind (``"synchronize"``, ``"record"``, ``"wait_event"``, ...)."""
        return [e for e in self.log if e[0] == name]


state = State()
"""The stand-in's state; :func:`installed` replaces it with a fresh one."""


def _cuda() -> None:
    """A CUDA call: initialises CUDA in this process, or fails as in a child forked after it."""
    pid = os.getpid()
    if state.cuda_pid is None:
        state.cuda_pid = pid
    elif state.cuda_pid != pid:
        raise CUDARuntimeError("cudaErrorInitializationError: initialization error")


def _kernel(what: str) -> None:
    _cuda()
    if state.nvrtc_broken:
        raise RuntimeError(NVRTC_ERROR)


def current_device() -> int:
    """The calling thread's current device (0 in every new thread, as in CUDA)."""
    return getattr(state.local, "device", 0)


# --------------------------------------------------------------------------
# Memory pointers and the array.


class MemoryPointer:
    """``cupy.cuda.MemoryPointer``: an allocation (a flat ``uint8`` host array) and a byte offset."""

    __slots__ = ("_base", "_offset", "device_id")

    def __init__(self, base: np.ndarray, offset: int, device_id: int) -> None:
        self._base, self._offset, self.device_id = base, offset, device_id

    @property
    def ptr(self) -> int:
        return int(self._base.ctypes.data) + self._offset

    def __add__(self, offset: int) -> MemoryPointer:
        return MemoryPointer(self._base, self._offset + int(offset), self.device_id)

    def __int__(self) -> int:
        return self.ptr


class _Flags:
    __slots__ = ("c_contiguous", "f_contiguous", "owndata")

    def __init__(self, a: np.ndarray) -> None:
        self.c_contiguous = bool(a.flags.c_contiguous)
        self.f_contiguous = bool(a.flags.f_contiguous)
        self.owndata = bool(a.flags.owndata)

    def __getitem__(self, name: str) -> bool:
        return {"C_CONTIGUOUS": self.c_contiguous, "F_CONTIGUOUS": self.f_contiguous,
                "OWNDATA": self.owndata}[name]  # fmt: skip


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


class ndarray:  # noqa: N801 (CuPy's name)
    """A device array over host memory that is not a ``numpy.ndarray``.

    Built as CuPy's: ``ndarray(shape, dtype)`` allocates on the current
    device, ``ndarray(shape, dtype, memptr=buf.data + offset, strides=...)``
    views an allocation (negative strides included).
    """

    __module__ = "cupy"
    __slots__ = ("_a", "_device")

    def __init__(self, shape: Any, dtype: Any = float, memptr: MemoryPointer | None = None,
                 strides: Any = None, order: _OrderCF = "C") -> None:  # fmt: skip
        if memptr is None:
            _cuda()
            self._a = np.empty(shape, dtype, order=order)
            self._device = current_device()
        else:
            self._a = np.ndarray(shape, dtype, buffer=memptr._base, offset=memptr._offset, strides=strides)
            self._device = memptr.device_id

    @classmethod
    def _wrap(cls, a: np.ndarray, device: int | None = None) -> ndarray:
        x = object.__new__(cls)
        x._a = a
        x._device = current_device() if device is None else device
        return x

    # ---- attributes
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: _Flags(self._a))

    @property
    def device(self) -> Device:
        return Device(self._device)

    @property
    def data(self) -> MemoryPointer:
        root = _root(self._a)
        if not (root.flags.c_contiguous or root.flags.f_contiguous):
            raise NotImplementedError("strict_cupy: .data of a view of a non-contiguous allocation")
        flat = np.ndarray((root.nbytes,), np.uint8, buffer=root)
        return MemoryPointer(flat, int(self._a.ctypes.data) - int(root.ctypes.data), self._device)

    @property
    def base(self) -> Any:
        return None if self._a.base is None else ndarray._wrap(_root(self._a), self._device)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        iface = dict(self._a.__array_interface__)
        iface["version"] = 3
        iface.pop("descr", None)
        iface["stream"] = 1
        return iface

    @property
    def T(self) -> ndarray:  # noqa: N802
        return self._view(self._a.T)

    # ---- no implicit host conversion
    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise TypeError(
            "Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a NumPy "
            "array explicitly."
        )

    def __iter__(self) -> Iterator[ndarray]:
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __repr__(self) -> str:
        return repr(self._a)

    def __bool__(self) -> bool:
        return bool(self.get())

    def __int__(self) -> int:
        return int(self.get())

    def __float__(self) -> float:
        return float(self.get())

    def __complex__(self) -> complex:
        return complex(self.get())

    def __reduce__(self) -> tuple[Any, ...]:
        return (_from_host, (self.get(),))

    # ---- host transfer
    def get(self, stream: Any = None, order: _Order = "C", out: Any = None, blocking: bool = True) -> np.ndarray:
        """A numpy copy (``cupy.ndarray.get``)."""
        _cuda()
        if out is not None:
            out[...] = self._a
            return out
        return np.array(self._a, order=order)

    def set(self, arr: Any, stream: Any = None) -> None:
        """Copy a host ``numpy.ndarray`` of the same dtype and shape in (``cupy.ndarray.set``)."""
        _cuda()
        if not isinstance(arr, np.ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if self.dtype != arr.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        if self.shape != arr.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        if not (self._a.flags.c_contiguous or self._a.flags.f_contiguous):
            raise RuntimeError("Cannot set to non-contiguous array")
        self._a[...] = arr

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> Any:  # fmt: skip
        state.record("dlpack", self.shape)
        return self._a.__dlpack__()  # (a CPU capsule: torch.from_dlpack gives a CPU tensor here)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._a.__dlpack_device__()

    # ---- views and copies
    def _view(self, a: np.ndarray) -> ndarray:
        return ndarray._wrap(a, self._device)

    def _here(self) -> np.ndarray:
        """The host array, after checking a kernel may touch it from the current device."""
        if self._device != current_device() and not state.peer_access:
            raise ValueError(
                f"The device where the array resides ({self._device}) is different from the current device "
                f"({current_device()}). Peer access is unavailable between these devices."
            )
        return self._a

    def reshape(self, *shape: Any, order: _OrderACF = "C") -> ndarray:
        dims: Sequence[Any] = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        view = self._a.reshape(dims, order=order)
        if not np.shares_memory(view, self._a) and self.size:
            _kernel("reshape copy")
        return self._view(view)

    def view(self, dtype: Any = None) -> ndarray:
        return self._view(self._a.view(dtype))

    def transpose(self, *axes: Any) -> ndarray:
        return self._view(self._a.transpose(*axes))

    def swapaxes(self, a: int, b: int) -> ndarray:
        return self._view(self._a.swapaxes(a, b))

    def squeeze(self, axis: Any = None) -> ndarray:
        return self._view(self._a.squeeze(axis))

    def ravel(self, order: _OrderACF = "C") -> ndarray:
        return self.reshape(-1, order=order)

    def astype(self, dtype: Any, order: _Order = "K", casting: Any = None, subok: Any = None,
               copy: bool = True) -> ndarray:  # fmt: skip
        if not copy and np.dtype(dtype) == self.dtype:
            return self
        _kernel("astype")
        return ndarray._wrap(self._here().astype(dtype, order=order), current_device())

    def copy(self, order: _Order = "C") -> ndarray:
        _kernel("copy")
        return ndarray._wrap(self._here().copy(order=order), current_device())

    def flatten(self, order: _Order = "C") -> ndarray:
        return self.copy(order).reshape(-1)

    def fill(self, value: Any) -> None:
        _kernel("fill")
        self._here().fill(value)

    def item(self) -> Any:
        return self.get().item()

    def tolist(self) -> Any:
        return self.get().tolist()

    def __getitem__(self, key: Any) -> ndarray:
        a = self._a[_index(key)]
        if isinstance(a, np.generic):
            a = np.asarray(a)
        if not np.shares_memory(a, self._a) and a.size:
            _kernel("take")  # (advanced indexing copies on the device)
        return self._view(a)

    def __setitem__(self, key: Any, value: Any) -> None:
        _kernel("setitem")
        if isinstance(value, ndarray):
            value = value._here()
        elif isinstance(value, np.ndarray) and value.dtype == object:
            raise TypeError(f"Unsupported type {type(value)}")
        elif isinstance(value, np.ndarray) and value.shape != () and _basic(key):
            # CuPy's basic-index assignment of anything but a CuPy array is ``fill``: a host array
            # other than 0-d is refused there (advanced indexes copy it host to device instead)
            raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
        self._here()[_index(key)] = value

    # ---- numpy protocols
    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return _run_ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        module: Any = cupy
        try:
            for part in func.__module__.split(".")[1:]:
                module = getattr(module, part)
            ours = getattr(module, func.__name__)
        except AttributeError:
            return NotImplemented
        if ours is func:
            return NotImplemented
        if not all(issubclass(t, (ndarray, np.ndarray)) for t in types):
            return NotImplemented
        return ours(*args, **kwargs)

    # ---- reductions and a few methods as CuPy has them
    def sum(self, *a: Any, **k: Any) -> Any:
        return cupy.sum(self, *a, **k)

    def prod(self, *a: Any, **k: Any) -> Any:
        return cupy.prod(self, *a, **k)

    def min(self, *a: Any, **k: Any) -> Any:
        return cupy.amin(self, *a, **k)

    def max(self, *a: Any, **k: Any) -> Any:
        return cupy.amax(self, *a, **k)

    def mean(self, *a: Any, **k: Any) -> Any:
        return cupy.mean(self, *a, **k)

    def std(self, *a: Any, **k: Any) -> Any:
        return cupy.std(self, *a, **k)

    def var(self, *a: Any, **k: Any) -> Any:
        return cupy.var(self, *a, **k)

    def any(self, *a: Any, **k: Any) -> Any:
        return cupy.any(self, *a, **k)

    def all(self, *a: Any, **k: Any) -> Any:
        return cupy.all(self, *a, **k)

    def argmax(self, *a: Any, **k: Any) -> Any:
        return cupy.argmax(self, *a, **k)

    def argmin(self, *a: Any, **k: Any) -> Any:
        return cupy.argmin(self, *a, **k)

    def cumsum(self, *a: Any, **k: Any) -> Any:
        return cupy.cumsum(self, *a, **k)

    def dot(self, other: Any) -> Any:
        return cupy.dot(self, other)

    def conj(self) -> Any:
        return cupy.conj(self)

    def nonzero(self) -> Any:
        return cupy.nonzero(self)

    def clip(self, *a: Any, **k: Any) -> Any:
        return cupy.clip(self, *a, **k)

    def round(self, *a: Any, **k: Any) -> Any:
        return cupy.round(self, *a, **k)

    real = property(lambda self: self._view(self._a.real))
    imag = property(lambda self: self._view(self._a.imag))


def _unary(name: str) -> Callable[..., Any]:
    ufunc = getattr(np, name)

    def op(self: ndarray) -> Any:
        return ufunc(self)

    return op


def _binary(name: str, reflected: bool = False) -> Callable[..., Any]:
    ufunc = getattr(np, name)

    def op(self: ndarray, other: Any) -> Any:
        return ufunc(other, self) if reflected else ufunc(self, other)

    return op


for _name, _ufunc in [("add", "add"), ("sub", "subtract"), ("mul", "multiply"), ("truediv", "true_divide"),
                      ("floordiv", "floor_divide"), ("mod", "remainder"), ("pow", "power"), ("and", "bitwise_and"),
                      ("or", "bitwise_or"), ("xor", "bitwise_xor"), ("lshift", "left_shift"),
                      ("rshift", "right_shift"), ("matmul", "matmul")]:  # fmt: skip
    setattr(ndarray, f"__{_name}__", _binary(_ufunc))
    setattr(ndarray, f"__r{_name}__", _binary(_ufunc, reflected=True))
for _name, _ufunc in [("lt", "less"), ("le", "less_equal"), ("gt", "greater"), ("ge", "greater_equal"),
                      ("eq", "equal"), ("ne", "not_equal")]:  # fmt: skip
    setattr(ndarray, f"__{_name}__", _binary(_ufunc))
for _name, _ufunc in [("neg", "negative"), ("pos", "positive"), ("abs", "absolute"), ("invert", "invert")]:
    setattr(ndarray, f"__{_name}__", _unary(_ufunc))
ndarray.__hash__ = None  # type: ignore[assignment]


def _from_host(a: np.ndarray) -> ndarray:
    _cuda()
    return ndarray._wrap(np.array(a), current_device())


def _basic(key: Any) -> bool:
    """Whether ``key`` is a basic index (integers, slices, ``...``, ``None``): no index arrays or lists."""
    parts = key if isinstance(key, tuple) else (key,)
    return all(k is None or k is Ellipsis or isinstance(k, (slice, int, np.integer)) for k in parts)


def _index(key: Any) -> Any:
    """An index for the wrapped array: stand-in index arrays unwrapped (host ones are allowed, as in CuPy)."""
    if isinstance(key, tuple):
        return tuple(k._here() if isinstance(k, ndarray) else k for k in key)
    return key._here() if isinstance(key, ndarray) else key


def _device_args(args: Any, what: str) -> Any:
    """``args`` with stand-in arrays unwrapped; a host ``numpy.ndarray`` anywhere raises as in CuPy."""
    if isinstance(args, ndarray):
        return args._here()
    if isinstance(args, np.ndarray):
        raise TypeError(what if what else f"Unsupported type {type(args)}")
    if isinstance(args, (list, tuple)):
        return type(args)(_device_args(a, what) for a in args)
    if isinstance(args, dict):
        return {k: _device_args(v, what) for k, v in args.items()}
    return args


def _wrap_result(result: Any) -> Any:
    if isinstance(result, np.ndarray):
        return ndarray._wrap(result)
    if isinstance(result, np.generic):
        return ndarray._wrap(np.asarray(result))  # (CuPy's reductions give 0-d arrays, not scalars)
    if isinstance(result, tuple):
        return tuple(_wrap_result(r) for r in result)
    if isinstance(result, list):
        return [_wrap_result(r) for r in result]
    return result


def _run_ufunc(ufunc: np.ufunc, method: str, inputs: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if method not in ("__call__", "outer", "at", "reduce", "accumulate", "reduceat"):
        return NotImplemented
    prepared = []
    for x in inputs:
        if isinstance(x, np.ndarray) and x.ndim == 0 and ufunc.__name__ in _COMPARISONS:
            x = x.item()  # (CuPy's workaround for numpy/numpy#12142)
        if not isinstance(x, (ndarray, np.ndarray, np.generic, int, float, complex, bool)):
            return NotImplemented
        prepared.append(x)
    _kernel(ufunc.__name__)
    args = _device_args(tuple(prepared), "")
    if "out" in kwargs:
        out = kwargs["out"]
        out = out if isinstance(out, tuple) else (out,)
        if not all(isinstance(o, ndarray) for o in out if o is not None):
            raise TypeError(f"Unsupported type {type(out[0])}")
        kwargs = {**kwargs, "out": tuple(o._here() if o is not None else None for o in out)}
    result = ufunc(*args, **kwargs) if method == "__call__" else getattr(ufunc, method)(*args, **kwargs)
    return _wrap_result(result)


# --------------------------------------------------------------------------
# The module's functions.


def asarray(a: Any, dtype: Any = None, order: Any = None, *, blocking: bool = False) -> ndarray:
    """A stand-in array: host arrays and sequences are copied host to device; stand-in arrays pass through."""
    if isinstance(a, ndarray):
        return a if dtype is None or np.dtype(dtype) == a.dtype else a.astype(dtype)
    if hasattr(a, "__cuda_array_interface__") or type(a).__module__.startswith("cupy"):
        raise TypeError(f"strict_cupy: cannot take {type(a)} (another device array type)")
    _cuda()
    return ndarray._wrap(np.array(a, dtype=dtype, order=order or "K"))


def array(obj: Any, dtype: Any = None, copy: bool = True, order: _Order = "K", ndmin: int = 0) -> ndarray:
    if isinstance(obj, ndarray):
        out = obj.astype(dtype or obj.dtype, order=order) if copy else asarray(obj, dtype)
        return out.reshape((1,) * (ndmin - out.ndim) + out.shape) if ndmin > out.ndim else out
    _cuda()
    return ndarray._wrap(np.array(obj, dtype=dtype, order=order, ndmin=ndmin))


def asnumpy(a: Any, stream: Any = None, order: _Order = "C", out: Any = None, blocking: bool = True) -> np.ndarray:
    if isinstance(a, ndarray):
        return a.get(stream, order, out)
    return np.asarray(a, order=order)


def get_array_module(*args: Any) -> Any:
    return cupy if any(isinstance(a, ndarray) for a in args) else np


def _alloc(make: Callable[..., np.ndarray], *args: Any, **kwargs: Any) -> ndarray:
    _cuda()
    return ndarray._wrap(make(*args, **kwargs))


def empty(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    out = _alloc(np.empty, shape, dtype, order=order)
    state.record("alloc", out.nbytes)
    return out


def zeros(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    _kernel("zeros")
    return _alloc(np.zeros, shape, dtype, order=order)


def ones(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    _kernel("ones")
    return _alloc(np.ones, shape, dtype, order=order)


def full(shape: Any, fill_value: Any, dtype: Any = None, order: str = "C") -> ndarray:
    _kernel("full")
    if isinstance(fill_value, ndarray):
        fill_value = fill_value._here()
    return _alloc(np.full, shape, fill_value, dtype, order=order)


def empty_like(a: Any, dtype: Any = None, order: str = "K", subok: Any = None, shape: Any = None) -> ndarray:
    return _alloc(np.empty_like, _device_args(a, ""), dtype, order, shape=shape)


def zeros_like(a: Any, dtype: Any = None, order: str = "K", subok: Any = None, shape: Any = None) -> ndarray:
    _kernel("zeros_like")
    return _alloc(np.zeros_like, _device_args(a, ""), dtype, order, shape=shape)


def ones_like(a: Any, dtype: Any = None, order: str = "K", subok: Any = None, shape: Any = None) -> ndarray:
    _kernel("ones_like")
    return _alloc(np.ones_like, _device_args(a, ""), dtype, order, shape=shape)


def full_like(a: Any, fill_value: Any, dtype: Any = None, order: str = "K", subok: Any = None,
              shape: Any = None) -> ndarray:  # fmt: skip
    _kernel("full_like")
    return _alloc(np.full_like, _device_args(a, ""), fill_value, dtype, order, shape=shape)


def concatenate(
    tup: Any, axis: int | None = 0, out: Any = None, *, dtype: Any = None, casting: _Casting = "same_kind"
) -> ndarray:
    """``cupy.concatenate``: every input a stand-in array (a host one raises ``TypeError``)."""
    arrays = list(tup)
    if not arrays:
        raise ValueError("Cannot concatenate from empty tuple")
    for a in arrays:
        if not isinstance(a, ndarray):
            raise TypeError(f"Unsupported type {type(a)}")  # (CuPy 14.2's words, seen on a device)
        if a.ndim == 0:
            raise TypeError("zero-dimensional arrays cannot be concatenated")
    _kernel("concatenate")
    got = np.concatenate([a._here() for a in arrays], axis=axis, dtype=dtype, casting=casting)
    if out is not None:
        out[...] = ndarray._wrap(got)
        return out
    return ndarray._wrap(got)


def stack(tup: Any, axis: int = 0, out: Any = None, *, dtype: Any = None, casting: _Casting = "same_kind") -> ndarray:
    """``cupy.stack``: expands each input and concatenates (host inputs raise as there)."""
    arrays = list(tup)
    for a in arrays:
        if not isinstance(a, ndarray):  # (CuPy's expand_dims refuses it first)
            t = type(a)
            got = f"{t.__module__}.{t.__name__}"
            raise TypeError(f"Argument 'a' has incorrect type (expected cupy._core.core._ndarray_base, got {got})")
    if not arrays:
        raise ValueError("need at least one array to stack")
    expanded = [ndarray._wrap(np.expand_dims(a._a, axis), a._device) for a in arrays]
    return concatenate(expanded, axis=axis, out=out, dtype=dtype, casting=casting)


def vstack(tup: Any, *, dtype: Any = None, casting: _Casting = "same_kind") -> ndarray:
    return concatenate([atleast_2d(a) for a in tup], 0, dtype=dtype, casting=casting)


def hstack(tup: Any, *, dtype: Any = None, casting: _Casting = "same_kind") -> ndarray:
    arrays = [atleast_1d(a) for a in tup]
    return concatenate(arrays, 0 if arrays and arrays[0].ndim == 1 else 1, dtype=dtype, casting=casting)


def atleast_1d(a: Any) -> ndarray:
    return a.reshape(1) if isinstance(a, ndarray) and a.ndim == 0 else _lift(np.atleast_1d)(a)


def atleast_2d(a: Any) -> ndarray:
    return _lift(np.atleast_2d)(a)


def ascontiguousarray(a: Any, dtype: Any = None) -> ndarray:
    if not isinstance(a, ndarray):
        return asarray(np.ascontiguousarray(a, dtype=dtype))
    if a.flags.c_contiguous and (dtype is None or np.dtype(dtype) == a.dtype):
        return a
    _kernel("copy")
    return ndarray._wrap(np.ascontiguousarray(a._here(), dtype=dtype))


def asfortranarray(a: Any, dtype: Any = None) -> ndarray:
    _kernel("copy")
    return ndarray._wrap(np.asfortranarray(_device_args(asarray(a), ""), dtype=dtype))


def amin(a: Any, *args: Any, **kwargs: Any) -> Any:
    return _lift(np.amin)(a, *args, **kwargs)


def amax(a: Any, *args: Any, **kwargs: Any) -> Any:
    return _lift(np.amax)(a, *args, **kwargs)


def _lift(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` on stand-in arrays: a host array among the arguments raises ``TypeError`` as in CuPy."""

    def lifted(*args: Any, **kwargs: Any) -> Any:
        _kernel(func.__name__)
        return _wrap_result(func(*_device_args(args, ""), **_device_args(kwargs, "")))

    lifted.__name__ = lifted.__qualname__ = getattr(func, "__name__", "lifted")
    lifted.__doc__ = f"``{lifted.__name__}`` on stand-in arrays (numpy's, lifted)."
    return lifted


# --------------------------------------------------------------------------
# cupy.cuda


class Device:
    """``cupy.cuda.Device``: a context manager making ``id`` the calling thread's current device."""

    def __init__(self, device: Any = None) -> None:
        self.id = current_device() if device is None else int(getattr(device, "id", device))
        self._previous: list[int] = []

    def _check(self) -> None:
        _cuda()
        if not 0 <= self.id < state.devices:
            raise CUDARuntimeError("cudaErrorInvalidDevice: invalid device ordinal")

    def use(self) -> None:
        self._check()
        state.local.device = self.id
        state.record("set_device", self.id)

    def __enter__(self) -> Device:
        self._check()
        self._previous.append(current_device())
        state.local.device = self.id
        return self

    def __exit__(self, *exc: Any) -> None:
        state.local.device = self._previous.pop()

    def synchronize(self) -> None:
        _cuda()
        state.record("device_synchronize", self.id)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"<CUDA Device {self.id}>"


_stream_ids = itertools.count(1)


class Stream:
    """``cupy.cuda.Stream``; ``synchronize``, ``record`` and ``wait_event`` go to :attr:`State.log`."""

    null: Stream

    def __init__(self, null: bool = False, non_blocking: bool = False, ptds: bool = False) -> None:
        self.ptr = 0 if null else next(_stream_ids)
        self.non_blocking = non_blocking
        self.device_id = current_device()
        self._previous: list[Stream] = []

    def synchronize(self) -> None:
        _cuda()
        state.record("synchronize", self.ptr)

    def record(self, event: Event | None = None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event

    def wait_event(self, event: Event) -> None:
        _cuda()
        state.record("wait_event", (self.ptr, event.id))

    def use(self) -> Stream:
        _cuda()
        state.local.stream = self
        return self

    def __enter__(self) -> Stream:
        self._previous.append(get_current_stream())
        state.local.stream = self
        return self

    def __exit__(self, *exc: Any) -> None:
        state.local.stream = self._previous.pop()

    @property
    def done(self) -> bool:
        return True

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Stream) and other.ptr == self.ptr

    def __hash__(self) -> int:
        return hash(self.ptr)


Stream.null = Stream(null=True)
_event_ids = itertools.count(1)


class Event:
    """``cupy.cuda.Event``; ``record`` and ``synchronize`` go to :attr:`State.log`."""

    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False) -> None:
        _cuda()
        self.id = next(_event_ids)
        self.stream: Stream | None = None

    def record(self, stream: Stream | None = None) -> None:
        _cuda()
        self.stream = get_current_stream() if stream is None else stream
        state.record("record", (self.stream.ptr, self.id))

    def synchronize(self) -> None:
        _cuda()
        state.record("event_synchronize", self.id)

    @property
    def done(self) -> bool:
        return True


def get_current_stream(device_id: int | None = None) -> Stream:
    _cuda()
    return getattr(state.local, "stream", None) or Stream.null


class PinnedMemoryPointer(bytearray):
    """``cupy.cuda.PinnedMemoryPointer``: page-locked host memory (a ``bytearray`` here)."""

    @property
    def ptr(self) -> int:
        return int(np.frombuffer(self, np.uint8).ctypes.data) if len(self) else 0

    def size(self) -> int:
        return len(self)


def alloc_pinned_memory(size: int) -> PinnedMemoryPointer:
    """Pinned memory from "CuPy's pinned pool": the size rounded up to 512 bytes, then to a power of two; counted."""
    _cuda()
    units = -(-int(size) // 512) * 512  # (CuPy's pool: whole 512-byte units, then the next power of two)
    rounded = 1 << (units - 1).bit_length() if size > 0 else 0
    state.pinned_allocs += 1
    state.pinned_bytes += rounded
    return PinnedMemoryPointer(rounded)


def is_available() -> bool:
    _cuda()  # (cudaGetDeviceCount initialises CUDA)
    return state.devices > 0


def _get_device() -> int:
    _cuda()
    return current_device()


def _set_device(device: int) -> None:
    Device(device).use()


def _device_count() -> int:
    _cuda()
    return state.devices


runtime = types.SimpleNamespace(
    getDevice=_get_device, setDevice=_set_device, getDeviceCount=_device_count,
    runtimeGetVersion=lambda: 13000, driverGetVersion=lambda: 13000, CUDARuntimeError=CUDARuntimeError,
)  # fmt: skip


_OPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.Mod: operator.mod, ast.BitAnd: operator.and_, ast.BitOr: operator.or_, ast.BitXor: operator.xor,
    ast.LShift: operator.lshift, ast.RShift: operator.rshift,
}  # fmt: skip
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Invert: operator.invert,
}


def _params(text: str) -> list[tuple[str, str]]:
    """``"int32 x, T y"`` as ``[("int32", "x"), ("T", "y")]``."""
    return [tuple(p.split()[-2:]) for p in text.split(",") if p.strip()]  # type: ignore[misc]


def _arith(node: ast.AST, names: dict[str, Any]) -> Any:
    """An arithmetic expression of names and numbers, computed with numpy (nothing else is accepted)."""
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.left, names), _arith(node.right, names))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_arith(node.operand, names))
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    raise NotImplementedError(
        f"strict_cupy: {ast.unparse(node)!r} is beyond the stand-in's arithmetic; set strict_cupy.state.kernels[name]"
    )


class ElementwiseKernel:
    """``cupy.ElementwiseKernel`` run on the host.

    The operation runs by the Python callable :attr:`State.kernels` holds for
    ``name`` (``f(*inputs as numpy) -> numpy``), else when it is arithmetic
    (``y = x * 2 + 1``; statements separated by ``;``, names, numbers and
    ``+ - * / % & | ^ << >> ~``), computed with numpy in the output's dtype;
    anything else raises ``NotImplementedError``. With
    :attr:`State.nvrtc_broken` calling it raises :data:`NVRTC_ERROR`
    (CuPy compiles at the first call).
    """

    def __init__(self, in_params: str, out_params: str, operation: str, name: str = "kernel", **kwargs: Any) -> None:
        self.in_params, self.out_params, self.operation, self.name = in_params, out_params, operation, name

    def __call__(self, *args: Any, size: int | None = None, **kwargs: Any) -> Any:
        _kernel(self.name)
        state.record("kernel", self.name)
        if any(isinstance(a, np.ndarray) for a in args):
            raise TypeError(f"Unsupported type {np.ndarray}")
        host = [a._here() if isinstance(a, ndarray) else a for a in args]
        impl = state.kernels.get(self.name)
        if impl is not None:
            return _wrap_result(impl(*host))
        ins, outs = _params(self.in_params), _params(self.out_params)
        names = {name: value for (_, name), value in zip(ins, host)}
        shape = np.broadcast_shapes(*(np.shape(h) for h in host[: len(ins)])) if size is None else (size,)
        typed = {t: np.asarray(v).dtype for (t, _), v in zip(ins, host)}
        given = host[len(ins) :]
        results = []
        for k, (kind, name) in enumerate(outs):
            dtype = typed.get(kind) or np.dtype(kind)
            names[name] = given[k] if k < len(given) else np.empty(shape, dtype)
            results.append(names[name])
        for statement in ast.parse(self.operation.replace(";", "\n")).body:
            if not (
                isinstance(statement, ast.Assign)
                and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)
                and statement.targets[0].id in names
            ):
                raise NotImplementedError(
                    f"strict_cupy: kernel {self.name!r}: set strict_cupy.state.kernels[{self.name!r}] to run it"
                )  # fmt: skip
            target = names[statement.targets[0].id]
            target[...] = _arith(statement.value, names)
        wrapped = [ndarray._wrap(r) for r in results]
        return wrapped[0] if len(wrapped) == 1 else tuple(wrapped)


# --------------------------------------------------------------------------
# The module object.


class _CupyModule(types.ModuleType):
    """``cupy``: the functions above, and every other numpy function lifted to stand-in arrays."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            value = getattr(np, name)
        except AttributeError:
            raise AttributeError(f"module 'cupy' (strict stand-in) has no attribute {name!r}") from None
        if isinstance(value, type) or isinstance(value, (np.dtype, types.ModuleType)) or not callable(value):
            return value
        lifted = _lift(value)
        setattr(self, name, lifted)
        return lifted


cupy = _CupyModule("cupy", "A strict stand-in for CuPy over host memory (npydask.testing.strict_cupy).")
cupy.__spec__ = None  # (importlib.util.find_spec("cupy") raises ValueError for it, as for any stand-in)
cuda = types.ModuleType("cupy.cuda")
for _f in (Device, Stream, Event, get_current_stream, alloc_pinned_memory, is_available, MemoryPointer,
           PinnedMemoryPointer):  # fmt: skip
    setattr(cuda, _f.__name__, _f)
cuda.runtime = runtime  # type: ignore[attr-defined]
for _g in (ndarray, asarray, array, asnumpy, get_array_module, empty, zeros, ones, full, empty_like, zeros_like,
           ones_like, full_like, concatenate, stack, vstack, hstack, atleast_1d, atleast_2d, ascontiguousarray,
           asfortranarray, amin, amax, ElementwiseKernel):  # fmt: skip
    setattr(cupy, _g.__name__, _g)
cupy.cuda = cuda  # type: ignore[attr-defined]
cupy.min, cupy.max = amin, amax  # type: ignore[attr-defined]
cupy.__version__ = "14.2.0"  # type: ignore[attr-defined]


def _register_dask() -> list[tuple[Any, Any, Any]]:
    """Register :class:`ndarray` with dask as ``register_cupy`` does for ``cupy.ndarray``; return what to undo."""
    import importlib

    from dask.sizeof import sizeof

    # (modules by name: under array query planning ``dask.array.backends`` is a function, not the module)
    backends = importlib.import_module("dask.array.backends")
    chunk_types = importlib.import_module("dask.array.chunk_types")
    dispatch = importlib.import_module("dask.array.dispatch")

    undo: list[tuple[Any, Any, Any]] = []

    def put(lookup: Any, key: Any, func: Any) -> None:
        undo.append((lookup, key, lookup._lookup.get(key, _MISSING)))
        lookup.register(key, func)

    put(dispatch.concatenate_lookup, ndarray, concatenate)
    put(dispatch.take_lookup, ndarray, cupy.take)
    put(dispatch.tensordot_lookup, ndarray, cupy.tensordot)
    put(dispatch.percentile_lookup, ndarray, backends.percentile)
    put(dispatch.numel_lookup, ndarray, backends._numel_arraylike)
    put(dispatch.nannumel_lookup, ndarray, backends._nannumel)
    put(dispatch.empty_lookup, ndarray, empty)
    put(dispatch.to_numpy_dispatch, ndarray, lambda data, **kwargs: asnumpy(data, **kwargs))
    put(dispatch.to_cupy_dispatch, np.ndarray, lambda data, **kwargs: asarray(data, **kwargs))

    def _einsum(*args: Any, **kwargs: Any) -> Any:
        kwargs.pop("casting", None)
        kwargs.pop("order", None)
        return cupy.einsum(*args, **kwargs)

    put(dispatch.einsum_lookup, ndarray, _einsum)
    put(sizeof, ndarray, lambda x: int(x.nbytes))  # (dask.sizeof's lazy "cupy" registration stays for real CuPy)
    if ndarray not in chunk_types._HANDLED_CHUNK_TYPES:
        chunk_types.register_chunk_type(ndarray)
        undo.append((chunk_types, ndarray, _MISSING))
    return undo


_MISSING = object()


def _chunk_types() -> Any:
    from dask.array import chunk_types

    return chunk_types


# --------------------------------------------------------------------------
# The fake kvikio.


_EOF = "KvikIO failure at: /kvikio/cpp/include/kvikio/detail/posix_io.hpp:173: POSIX error on pread: EOF"
_OPEN = "Unable to open file. Linux system/library function call error at: /kvikio/cpp/src/file_utils.cpp:160"


class CompatMode(enum.IntEnum):
    """``kvikio.CompatMode``."""

    OFF = 0
    ON = 1
    AUTO = 2


class _Settings:
    """A kvikio settings module's ``get``/``set`` (``set`` works as a context manager too)."""

    def __init__(self, values: dict[str, Any], on_set: Callable[[str, Any], None] | None = None,
                 readonly: tuple[str, ...] = ()) -> None:  # fmt: skip
        self.values, self.on_set, self.readonly = values, on_set, readonly

    def get(self, name: str) -> Any:
        if name not in self.values:
            raise KeyError(name)
        return self.values[name]

    def set(self, *config: Any) -> contextlib.AbstractContextManager[None]:
        if len(config) == 2 and isinstance(config[0], str):
            config = ({config[0]: config[1]},)
        if len(config) != 1 or not isinstance(config[0], dict):
            raise ValueError("Valid arguments are set(config: dict) or set(key: str, value: Any)")
        old = {}
        for key, value in config[0].items():
            if key not in self.values or key in self.readonly:
                raise KeyError(key)
            old[key] = self.values[key]
            self._put(key, value)
        settings = self

        class _Undo(contextlib.AbstractContextManager):  # type: ignore[type-arg]
            def __exit__(self, *exc: Any) -> None:
                for key, value in old.items():
                    settings._put(key, value)

        return _Undo()

    def _put(self, key: str, value: Any) -> None:
        if key == "compat_mode":
            value = CompatMode(value)
        self.values[key] = value
        if self.on_set is not None:
            self.on_set(key, value)


class IOFuture:
    """``kvikio.IOFuture``: ``get()`` once (a second raises, as ``std::future::get`` does), ``done()``."""

    def __init__(self, parts: list[concurrent.futures.Future[int]] | None = None, value: int | None = None) -> None:
        self._parts, self._value, self._taken = parts, value, False

    def get(self) -> int:
        if self._taken:
            raise RuntimeError("std::future_error: No associated state")
        self._taken = True
        if self._parts is None:
            return int(self._value or 0)
        return sum(p.result() for p in self._parts)

    def done(self) -> bool:
        return self._parts is None or all(p.done() for p in self._parts)


class FakeKvikio(types.ModuleType):
    """A fake ``kvikio`` (26.10, compatibility mode, no GDS). Build one with :func:`make_kvikio`.

    Attributes
    ----------
    open_descriptors : int
        Descriptors its open ``CuFile`` s hold now (two each), process-wide.
    max_descriptors : int
        The most held at once.
    descriptor_limit : int or None
        Opening past it fails as ``EMFILE`` does (``RuntimeError`` "Too many open files").
    reads : list of tuple
        ``(path, file_offset, size, how, thread name, buffer kind)`` per ``pread``;
        ``how`` is ``"sync"`` (under ``gds_threshold``) or ``"pool"``.
    on_pread : callable or None
        ``on_pread(path, file_offset, size)`` runs at each ``pread`` before it
        reads (a test truncating the file there sees kvikio's EOF error).
    """

    def __init__(self) -> None:
        super().__init__("kvikio", "A fake kvikio 26.10 (npydask.testing.strict_cupy).")
        self.__version__ = "26.10.00"
        self.__path__: list[str] = []  # (a package: kvikio.defaults and kvikio.cufile_driver are imported apart)
        self.CompatMode = CompatMode
        self.open_descriptors = self.max_descriptors = 0
        self.descriptor_limit: int | None = None
        self.reads: list[tuple[Any, ...]] = []
        self.on_pread: Callable[[str, int, int], None] | None = None
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        nthreads = os.environ.get("KVIKIO_NTHREADS") or os.environ.get("KVIKIO_NUM_THREADS") or 1
        mode = {"ON": 1, "OFF": 0, "AUTO": 2}.get(os.environ.get("KVIKIO_COMPAT_MODE", "AUTO").upper(), 2)
        values = {"compat_mode": CompatMode(mode), "num_threads": int(nthreads), "task_size": 4 << 20,
                  "gds_threshold": 16 << 10, "bounce_buffer_size": 16 << 20, "http_max_attempts": 3,
                  "http_status_codes": [429, 500, 502, 503, 504], "http_timeout": 60,
                  "auto_direct_io_read": False, "auto_direct_io_write": True}  # fmt: skip
        settings = _Settings(values, self._changed)
        defaults = types.ModuleType("kvikio.defaults")
        defaults.get, defaults.set = settings.get, settings.set  # type: ignore[attr-defined]
        defaults.is_compat_mode_preferred = lambda: True  # type: ignore[attr-defined]  # (no GDS here)
        driver = _Settings({"is_gds_available": False, "major_version": 1, "minor_version": 15,
                            "allow_compat_mode": True, "per_buffer_cache_size": 0, "poll_mode": False,
                            "poll_thresh_size": 4, "max_device_cache_size": 0, "max_pinned_memory_size": 0},
                           readonly=("is_gds_available", "major_version", "minor_version", "allow_compat_mode",
                                     "per_buffer_cache_size"))  # fmt: skip
        cufile_driver = types.ModuleType("kvikio.cufile_driver")
        cufile_driver.get, cufile_driver.set = driver.get, driver.set  # type: ignore[attr-defined]
        self._submodules = {"kvikio.defaults": defaults, "kvikio.cufile_driver": cufile_driver}
        self._settings = settings
        self.CuFile = _cufile_class(self)

    def _changed(self, key: str, value: Any) -> None:
        if key == "num_threads":
            with self._lock:
                old, self._pool = self._pool, None
            if old is not None:
                old.shutdown(wait=True)

    def pool(self) -> concurrent.futures.ThreadPoolExecutor:
        """The fake's thread pool (``num_threads`` threads named ``kvikio-<n>``)."""
        with self._lock:
            if self._pool is None:
                n = int(self._settings.values["num_threads"])
                self._pool = concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix="kvikio")
            return self._pool

    def shutdown(self) -> None:
        """Stop the thread pool (:func:`installed` does on exit)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def _take(self, n: int) -> None:
        with self._lock:
            if self.descriptor_limit is not None and self.open_descriptors + n > self.descriptor_limit:
                raise RuntimeError(f"{_OPEN}: Too many open files")
            self.open_descriptors += n
            self.max_descriptors = max(self.max_descriptors, self.open_descriptors)

    def _give(self, n: int) -> None:
        with self._lock:
            self.open_descriptors -= n


def _buffer(buf: Any, size: int | None) -> tuple[np.ndarray, str, int]:
    """The flat bytes of ``buf`` (a stand-in device array or a host buffer), its kind and the size to read."""
    if isinstance(buf, ndarray):
        a, kind = buf._a, "device"
    else:
        a, kind = np.asarray(memoryview(buf)) if not isinstance(buf, np.ndarray) else buf, "host"
    if not (a.flags.c_contiguous or a.flags.f_contiguous):
        raise ValueError("Array must be contiguous")
    flat = a.reshape(-1, order="A").view(np.uint8)
    if size is None:
        size = flat.size
    elif size > flat.size:
        raise ValueError("Size is greater than the size of the buffer")
    return flat, kind, int(size)


def _read_exact(fd: int, dest: np.ndarray, offset: int) -> int:
    """POSIX reads until ``dest`` is full; a read at the end of the file raises as kvikio's does."""
    done = 0
    while done < dest.size:
        got = os.preadv(fd, [dest[done:].data], offset + done)
        if got == 0:
            raise RuntimeError(_EOF)
        done += got
    return done


def _cufile_class(kv: FakeKvikio) -> type:
    class CuFile:
        """``kvikio.CuFile`` in compatibility mode over two real descriptors."""

        def __init__(self, file: Any, flags: str = "r") -> None:
            self.path = os.fspath(file)
            how = {"r": os.O_RDONLY, "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "r+": os.O_RDWR,
                   "a": os.O_WRONLY | os.O_CREAT}[flags]  # fmt: skip
            kv._take(2)
            fds = []
            try:
                for direct in (False, True):
                    try:
                        fds.append(os.open(self.path, how | (getattr(os, "O_DIRECT", 0) if direct else 0), 0o644))
                    except OSError as e:
                        if direct and fds:  # (no O_DIRECT here, as on tmpfs: a plain second descriptor)
                            fds.append(os.open(self.path, how, 0o644))
                        else:
                            raise RuntimeError(f"{_OPEN}: {e.strerror}") from None
            except BaseException:
                for fd in fds:
                    os.close(fd)
                kv._give(2)
                raise
            self._fd, self._fd_direct = fds
            self._closed = False

        def fileno(self) -> int:
            return self._fd

        def close(self) -> None:
            if not self._closed:
                self._closed = True
                os.close(self._fd)
                os.close(self._fd_direct)
                kv._give(2)

        def closed(self) -> bool:
            return self._closed

        def __enter__(self) -> CuFile:
            return self

        def __exit__(self, *exc: Any) -> None:
            self.close()

        def pread(self, buf: Any, size: int | None = None, file_offset: int = 0,
                  task_size: int | None = None) -> IOFuture:  # fmt: skip
            flat, kind, size = _buffer(buf, size)
            if kind == "device":
                _cuda()
            settings = kv._settings.values
            sync = kind == "device" and size < settings["gds_threshold"]
            kv.reads.append((self.path, file_offset, size, "sync" if sync else "pool",
                             threading.current_thread().name, kind))  # fmt: skip
            state.record("pread", (self.path, file_offset, size))
            if kv.on_pread is not None:
                kv.on_pread(self.path, file_offset, size)
            if self._closed:
                raise RuntimeError("KvikIO failure: the file handle is closed")
            if sync:  # kvikio's shortcut: POSIX on the calling thread, raising here, a ready future
                return IOFuture(value=_read_exact(self._fd, flat[:size], file_offset))
            task = int(task_size or settings["task_size"])
            pool, fd = kv.pool(), self._fd
            parts = [pool.submit(_read_exact, fd, flat[at : min(at + task, size)], file_offset + at)
                     for at in range(0, size, task)] or [pool.submit(lambda: 0)]  # fmt: skip
            return IOFuture(parts)

        def read(self, buf: Any, size: int | None = None, file_offset: int = 0, dev_offset: int = 0) -> int:
            if not isinstance(buf, ndarray):
                raise ValueError("Non-CUDA buffers not supported")
            return self.pread(buf, size, file_offset).get()

        def pwrite(self, buf: Any, size: int | None = None, file_offset: int = 0,
                   task_size: int | None = None) -> IOFuture:  # fmt: skip
            flat, _, size = _buffer(buf, size)
            return IOFuture(value=os.pwrite(self._fd, flat[:size].tobytes(), file_offset))

        def write(self, buf: Any, size: int | None = None, file_offset: int = 0, dev_offset: int = 0) -> int:
            if not isinstance(buf, ndarray):
                raise ValueError("Non-CUDA buffers not supported")
            return self.pwrite(buf, size, file_offset).get()

    return CuFile


def make_kvikio() -> FakeKvikio:
    """A fresh fake kvikio (its own settings, pool and counts)."""
    return FakeKvikio()


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``kvikio.defaults`` and ``kvikio.cufile_driver`` on request.

    Each sets the attribute on the parent as a real import does.
    """

    def __init__(self, kvikio: FakeKvikio) -> None:
        self.kvikio = kvikio

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name in self.kvikio._submodules and sys.modules.get("kvikio") is self.kvikio:
            return importlib.machinery.ModuleSpec(name, self)
        return None

    def create_module(self, spec: Any) -> Any:
        return self.kvikio._submodules[spec.name]

    def exec_module(self, module: Any) -> None:
        pass


def _fake_pynvml() -> types.ModuleType:
    """``pynvml``: counts the simulated devices without initialising CUDA."""
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError = type("NVMLError", (Exception,), {})  # type: ignore[attr-defined]
    nvml.nvmlInit = lambda: None  # type: ignore[attr-defined]
    nvml.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetCount = lambda: state.devices  # type: ignore[attr-defined]
    return nvml


def _import_bystanders() -> None:
    """Import now the modules that capture ``cupy`` or ``pynvml`` when first imported, so they keep the real ones.

    (``distributed.diagnostics.nvml`` keeps the ``pynvml`` it found at import for
    the process, ``zarr.core.buffer.gpu`` the ``cupy``: imported first under
    :func:`installed`, they would keep the fakes.)
    """
    for name in ("dask.array", "distributed.diagnostics.nvml", "zarr.core.buffer.gpu"):
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


_NAMES = ("cupy", "cupy.cuda", "cupy.cuda.runtime", "kvikio", "kvikio.defaults", "kvikio.cufile_driver", "pynvml")


@contextlib.contextmanager
def installed(devices: int = 1, kvikio: bool = True) -> Iterator[types.SimpleNamespace]:
    """Put the stand-in CuPy (and a fresh fake kvikio, and a fake ``pynvml``) into ``sys.modules``.

    Parameters
    ----------
    devices : int
        Devices the simulated machine has.
    kvikio : bool
        Install the fake kvikio; ``False`` makes ``import kvikio`` fail
        (the pinned-host-memory path).

    Yields
    ------
    types.SimpleNamespace
        ``cupy`` (the module), ``kvikio`` (the fake or ``None``), ``state``
        (the fresh :class:`State`).

    Everything is restored on exit, and the fake kvikio's threads stopped.
    """
    global state
    _import_bystanders()
    saved: dict[str, Any] = {name: sys.modules.get(name, _MISSING) for name in _NAMES}  # (modules or _MISSING)
    old_state, state = state, State(devices)
    fake = make_kvikio() if kvikio else None
    finder = _SubmoduleFinder(fake) if fake is not None else None
    undo = _register_dask()
    sys.modules.update({"cupy": cupy, "cupy.cuda": cuda, "pynvml": _fake_pynvml()})
    sys.modules.pop("kvikio.defaults", None)
    sys.modules.pop("kvikio.cufile_driver", None)
    sys.modules["kvikio"] = fake  # type: ignore[assignment]  # typeshed: modules only; None makes import kvikio raise ImportError
    if finder is not None:
        sys.meta_path.insert(0, finder)
    try:
        yield types.SimpleNamespace(cupy=cupy, kvikio=fake, state=state)
    finally:
        if finder is not None:
            sys.meta_path.remove(finder)
            fake.shutdown()  # type: ignore[union-attr]
        for name, module in saved.items():
            if module is _MISSING:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        for lookup, key, before in undo:
            if lookup is _chunk_types():
                lookup._HANDLED_CHUNK_TYPES.remove(key)
            elif before is _MISSING:
                lookup._lookup.pop(key, None)
            else:
                lookup._lookup[key] = before
        state = old_state
