"""What every writer of ``.npy`` files shares: headers, the array to write, names and graph helpers.

:mod:`npydask.write.npy` (local files) and :mod:`npydask.write._remote`
(object storage) both plan the header with :func:`plan_header`, check
``align`` with :func:`check_align`, turn the caller's array into a
:class:`WriteInput` with :func:`write_input`, name the outputs with
:func:`output_names` and build their graphs with :func:`graph_of` and
:func:`optimize`.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.core import flatten
from dask.highlevelgraph import HighLevelGraph
from dask.utils import ensure_dict, parse_bytes

from npydask._buffers import as_bytes, raw_copy
from npydask.format.header import MAX_HEADER_BYTES, NpyHeader, format_header
from npydask.storage.where import fspath

__all__ = [
    "MAX_ALIGN",
    "NUMPY_MAX_HEADER",
    "Views",
    "WriteInput",
    "check_align",
    "check_names",
    "digest",
    "graph_of",
    "optimize",
    "output_names",
    "plan_header",
    "write_input",
]

NUMPY_MAX_HEADER = 10_000
"""The longest header text ``numpy.load`` reads by default (its ``max_header_size``)."""
MAX_ALIGN = 9984
"""The largest ``align`` whose padded header ``numpy.load`` still reads by default."""


# --------------------------------------------------------------------------
# Headers


def plan_header(path: str, dtype: np.dtype, shape: tuple[int, ...], align: int = 64) -> tuple[bytes, NpyHeader]:
    """The first bytes of the file (magic, version, length, header text) and its :class:`NpyHeader`.

    Raises
    ------
    ValueError
        When ``align`` would make a header ``numpy.load`` refuses by default.

    Examples
    --------
    >>> preamble, header = plan_header("s3://b/a.npy", np.dtype("<f4"), (3, 4))
    >>> preamble[:6], header.data_offset, header.nbytes
    (b'\\x93NUMPY', 128, 48)
    """
    preamble = _header_bytes(dtype, tuple(shape), align)
    if len(preamble) > MAX_HEADER_BYTES:
        raise ValueError(
            f"{path}: the header for dtype {dtype} would be {len(preamble)} bytes, more than the "
            f"{MAX_HEADER_BYTES} bytes npydask reads back (numpy.load stops at 10,000); use fewer fields"
        )
    if align > 64 and _text_bytes(preamble) > NUMPY_MAX_HEADER >= _text_bytes(_header_bytes(dtype, tuple(shape), 64)):
        raise ValueError(
            f"{path}: align={align} pads the header of dtype {dtype} to {len(preamble)} bytes, over the "
            f"{NUMPY_MAX_HEADER:,} bytes numpy.load reads by default (max_header_size); use a smaller align"
        )
    nbytes = math.prod(shape) * dtype.itemsize
    return preamble, NpyHeader((preamble[6], preamble[7]), tuple(shape), dtype, False, len(preamble), nbytes)


def _text_bytes(preamble: bytes) -> int:
    """The header text's length as ``numpy.load`` measures it (after the magic, version and length field)."""
    return len(preamble) - (10 if preamble[6] == 1 else 12)


@functools.lru_cache(maxsize=256)
def _header_bytes(dtype: np.dtype, shape: tuple[int, ...], align: int) -> bytes:
    return format_header(dtype, shape, False, align=align)


def check_align(align: Any) -> int:
    """``align`` when it is a positive multiple of 64 of at most :data:`MAX_ALIGN`.

    Raises
    ------
    ValueError
        Otherwise, saying why.

    Examples
    --------
    >>> check_align(4096)
    4096
    """
    if isinstance(align, bool) or not isinstance(align, int) or align <= 0 or align % 64:
        raise ValueError(
            f"align must be a positive multiple of 64, found {align!r}: the NPY format puts the payload "
            f"at a multiple of 64 bytes (numpy's ARRAY_ALIGN) so that every dtype is aligned and files map "
            f"well; use 64 (numpy's default) or 4096 for page-aligned payloads (O_DIRECT, mmap)"
        )
    if align > MAX_ALIGN:
        raise ValueError(
            f"align must be at most {MAX_ALIGN}, found {align!r}: a larger one pads the header past the "
            f"{NUMPY_MAX_HEADER:,} bytes numpy.load reads by default (max_header_size); use 4096 for "
            f"page-aligned payloads"
        )
    return align


# --------------------------------------------------------------------------
# The array to write


@dataclass(frozen=True)
class WriteInput:
    """One array to write: a dask array, or a numpy array small enough for one task."""

    array: Any
    dtype: np.dtype
    shape: tuple[int, ...]
    token: str
    one_task: bool


def digest(*parts: Any) -> str:
    """A short hex digest of ``repr(parts)``, for task names.

    Examples
    --------
    >>> len(digest("a.npy", 64, True))
    32
    """
    return hashlib.blake2b(repr(parts).encode("utf8", "surrogateescape"), digest_size=16).hexdigest()


def write_input(x: Any, what: str, limit: int | None = None) -> WriteInput:
    """Check one array; numpy arrays up to ``limit`` bytes (one dask chunk) stay numpy, for one task.

    Raises
    ------
    ValueError
        For an object dtype or unknown chunk sizes, naming ``what``.

    Examples
    --------
    >>> w = write_input(np.arange(3), "to_npy")
    >>> w.shape, w.one_task
    ((3,), True)
    """
    if isinstance(x, da.Array):
        _check_dtype(x.dtype, what)
        if any(math.isnan(n) for n in x.shape):
            raise ValueError(f"{what}: the array's shape {x.shape} has unknown sizes; call x.compute_chunk_sizes()")
        return WriteInput(x, x.dtype, tuple(int(n) for n in x.shape), x.name, math.prod(x.numblocks) == 1)
    array = np.asarray(x)
    _check_dtype(array.dtype, what)
    if array.nbytes > (limit or int(parse_bytes(dask.config.get("array.chunk-size")))):
        if array.dtype.names is None:
            return write_input(da.asarray(array), what)
        # from_array copies a numpy array first, and numpy's copy loses structured padding: give it views
        meta = np.empty((0,) * array.ndim, array.dtype)
        return write_input(da.from_array(Views(array), chunks="auto", asarray=False, meta=meta), what)
    # a digest of dtype, shape and values (much cheaper than dask's tokenize for many small arrays)
    h = hashlib.blake2b(repr((array.dtype.descr, array.dtype.str, array.shape)).encode("utf8"), digest_size=16)
    if array.size and array.dtype.itemsize:
        h.update(as_bytes(raw_copy(array)))  # type: ignore[arg-type]  # numpy types ndarray.__buffer__ from Python 3.12
    return WriteInput(array, array.dtype, array.shape, h.hexdigest(), True)


class Views:
    """A numpy array behind ``dask.array.from_array`` that hands out views, never a copy of the array."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape

    @property
    def dtype(self) -> np.dtype:
        return self.array.dtype

    @property
    def ndim(self) -> int:
        return self.array.ndim

    def __getitem__(self, index: Any) -> np.ndarray:
        return self.array[index]

    def __dask_tokenize__(self) -> Any:
        return ("npydask.write._graph.Views", tokenize(self.array))


def _check_dtype(dtype: np.dtype, what: str) -> None:
    if dtype.hasobject:
        raise ValueError(
            f"{what}: cannot write dtype {dtype}: it holds Python objects, which the .npy format stores only "
            f"by pickling (npydask never pickles); convert to a numeric, string or structured dtype first"
        )


# --------------------------------------------------------------------------
# Names


def output_names(names: Sequence[str | os.PathLike[str]] | None, count: int) -> list[str]:
    """The relative paths of ``count`` outputs: :func:`check_names` of ``names``, or ``00000.npy``, ...

    Raises
    ------
    ValueError
        For a name count other than ``count``, or bad names (see :func:`check_names`).

    Examples
    --------
    >>> output_names(None, 2)
    ['00000.npy', '00001.npy']
    """
    if names is None:
        return [f"{i:0{max(5, len(str(count - 1)))}d}.npy" for i in range(count)]
    if len(names := list(names)) != count:
        raise ValueError(f"names has {len(names)} entries for {count} arrays; give one name per array")
    return check_names(names)


def check_names(names: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Normalise output names into distinct relative paths ending in ``.npy``.

    Raises
    ------
    ValueError
        For an absolute or escaping (``..``) name, one that names no file
        (empty, or ending in a separator or in ``.``), a name given twice, or
        a file that another name needs as a folder.

    Examples
    --------
    >>> check_names(["a", "b.npy", "sub/./c"])
    ['a.npy', 'b.npy', 'sub/c.npy']
    """
    out: list[str] = []
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        text = fspath(name)
        parts = [p for p in text.replace(os.sep, "/").split("/") if p not in ("", ".")]
        if os.path.isabs(text) or text.startswith("/"):
            raise ValueError(f"names[{i}] = {text!r} must be a relative path inside the output folder")
        if ".." in parts:
            raise ValueError(f"names[{i}] = {text!r} escapes the output folder ('..'); use a path inside it")
        if not parts or text.endswith(("/", os.sep)) or text.replace(os.sep, "/").rsplit("/", 1)[-1] == ".":
            raise ValueError(
                f"names[{i}] = {text!r} names no file (it ends in a folder: '/', '.' or nothing); give a file "
                f"name such as 'a' or 'sub/a'"
            )
        rel = "/".join(parts)
        rel += "" if rel.endswith(".npy") else ".npy"
        if rel in seen:
            raise ValueError(
                f"names[{seen[rel]}] = {names[seen[rel]]!r} and names[{i}] = {text!r} both write {rel!r}; "
                f"give every array its own name"
            )
        seen[rel] = i
        out.append(rel)
    clash = sorted({r.rsplit("/", k)[0] for r in out for k in range(1, r.count("/") + 1)}.intersection(seen))
    if clash:
        raise ValueError(f"{clash[0]!r} is both a file and the folder of another file in names; rename one")
    return [r.replace("/", os.sep) for r in out]


# --------------------------------------------------------------------------
# Graphs


def graph_of(x: Any) -> tuple[dict, list]:
    """A collection's graph as one flat dict (culled where cheap), and its keys in C order of blocks.

    One flat graph keeps dask's culling linear in the number of tasks (with a
    layer per file it culls each layer against every key).
    """
    graph, keys = x.__dask_graph__(), list(flatten(x.__dask_keys__()))
    if isinstance(graph, HighLevelGraph):
        graph = graph.cull(set(keys))
    return ensure_dict(graph), keys


def optimize(x: da.Array) -> da.Array:
    """Fuse the chunk tasks with the tasks that make them, under either array engine."""
    fuse = getattr(x, "optimize", None)  # (array expressions, under query planning, have it)
    if callable(fuse):
        return fuse()
    (x,) = dask.optimize(x)
    return x
