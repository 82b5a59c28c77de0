"""Hypothesis strategies for ``.npy`` files, with numpy as the oracle.

- :func:`dtypes`: every dtype numpy writes without pickling, both byte orders,
  structured dtypes with nested fields, subarrays, titles and padding.
- :func:`shapes`: 0-d, empty axes, up to 32 dimensions, few elements.
- :func:`arrays`: arrays of those dtypes and shapes filled with random bytes,
  so every bit pattern (NaN payloads, odd bools, invalid code points) appears.
- :func:`regions`: ``(start, stop)`` arguments in every accepted spelling.
- :func:`save_npy`: write a file with ``numpy.lib.format.write_array`` in a
  chosen format version.

Examples
--------
>>> from hypothesis import given
>>> from npydask.testing.strategies import arrays
>>> @given(arrays())
... def test_roundtrip(x): ...
"""

from __future__ import annotations

import io
import math
import os
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from hypothesis import strategies as st

__all__ = [
    "DATETIME_UNITS",
    "array_bytes",
    "arrays",
    "assert_same_array",
    "dtypes",
    "npy_bytes",
    "region_slices",
    "regions",
    "save_npy",
    "scalar_dtypes",
    "shapes",
    "structured_dtypes",
]

DATETIME_UNITS = ("", "[Y]", "[M]", "[W]", "[D]", "[h]", "[m]", "[s]", "[ms]", "[us]", "[ns]", "[ps]",
                  "[fs]", "[as]", "[5s]", "[25ms]")  # fmt: skip
"""datetime64/timedelta64 units: generic, every unit, and two multiples."""

_FAMILIES: dict[str, tuple[str, ...]] = {
    "bool": ("|b1",),
    "int": ("|i1", "i2", "i4", "i8"),
    "uint": ("|u1", "u2", "u4", "u8"),
    "float": ("f2", "f4", "f8", "g"),
    "complex": ("c8", "c16", "G"),
    "datetime": tuple(f"M8{u}" for u in DATETIME_UNITS),
    "timedelta": tuple(f"m8{u}" for u in DATETIME_UNITS),
    "bytes": ("|S1", "|S2", "|S7"),
    "unicode": ("U1", "U2", "U5"),
    "void": ("|V1", "|V3", "|V8"),
}
# Field names and titles: ASCII, quotes and backslashes (the slow parser path),
# latin-1 (fine in format 1.0) and CJK (needs format 3.0).
_NAME_ALPHABET = "abcxyz_0' \"\\\u00e9\u540d"


def scalar_dtypes(*, byteorders: Sequence[str] = ("<", ">")) -> st.SearchStrategy[np.dtype]:
    """Every non-structured dtype numpy saves without pickle, in ``byteorders`` where meaningful."""

    def spell(code: str) -> st.SearchStrategy[np.dtype]:
        if code.startswith("|"):
            return st.just(np.dtype(code))
        return st.sampled_from([np.dtype(o + code) for o in byteorders])

    return st.sampled_from(list(_FAMILIES.values())).flatmap(st.sampled_from).flatmap(spell)


def _names(draw: Any, n: int, taken: set[str]) -> list[str]:
    names = draw(
        st.lists(
            st.text(_NAME_ALPHABET, min_size=1, max_size=4).filter(lambda s: s not in taken),
            min_size=n,
            max_size=n,
            unique=True,
        )
    )
    taken.update(names)
    return names


@st.composite
def _struct(draw: Any, children: st.SearchStrategy[np.dtype]) -> np.dtype:
    n = draw(st.integers(1, 4))
    taken: set[str] = set()
    names = _names(draw, n, taken)
    formats: list[Any] = []
    for _ in range(n):
        dt = draw(children)
        sub = draw(st.one_of(st.just(()), st.lists(st.integers(1, 3), min_size=1, max_size=2).map(tuple)))
        formats.append(np.dtype((dt, sub)) if sub else dt)
    titles: list[str | None] = [None] * n
    if draw(st.booleans()):
        for i, t in zip(range(n), _names(draw, n, taken)):
            titles[i] = t if draw(st.booleans()) else None
    layout = draw(st.sampled_from(["packed", "aligned", "gaps"]))
    keyed = [((t, nm) if t is not None else nm, f) for nm, t, f in zip(names, titles, formats)]
    if layout == "packed":
        return np.dtype(keyed)
    if layout == "aligned":
        return np.dtype(keyed, align=True)
    offsets = []
    offset = draw(st.integers(0, 3))
    for f in formats:
        offsets.append(offset)
        offset += f.itemsize + draw(st.integers(0, 3))
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "titles": titles, "itemsize": offset})


def structured_dtypes(
    children: st.SearchStrategy[np.dtype] | None = None, *, max_leaves: int = 6
) -> st.SearchStrategy[np.dtype]:
    """Structured dtypes: nested fields, subarray fields, titles, padding and aligned layouts."""
    base = scalar_dtypes() if children is None else children
    return _struct(st.recursive(base, _struct, max_leaves=max_leaves))


def dtypes(*, structured: bool = True, max_itemsize: int = 4096) -> st.SearchStrategy[np.dtype]:
    """Every dtype numpy writes without pickling (see the module docstring)."""
    strategy = scalar_dtypes()
    if structured:
        strategy = st.one_of(strategy, strategy, structured_dtypes())
    return strategy.filter(lambda d: 0 < d.itemsize <= max_itemsize)


@st.composite
def shapes(
    draw: Any, *, min_dims: int = 0, max_dims: int = 32, max_elements: int = 2000, max_side: int | None = None
) -> tuple[int, ...]:
    """Shapes of ``min_dims..max_dims`` axes whose non-zero extents multiply to at most ``max_elements``.

    About one shape in eight has an empty axis.
    """
    ndim = draw(st.integers(min_dims, max_dims))
    budget = max(max_elements, 1)
    dims = []
    for _ in range(ndim):
        hi = budget if max_side is None else min(budget, max_side)
        d = draw(st.integers(1, max(hi, 1)))
        dims.append(d)
        budget = max(budget // d, 1)
    dims = draw(st.permutations(dims)) if dims else []
    if ndim and draw(st.integers(0, 7)) == 0:
        dims[draw(st.integers(0, ndim - 1))] = 0
    return tuple(dims)


def array_bytes(seed: int, nbytes: int, fill: str = "random") -> bytes:
    """``nbytes`` bytes: random from ``seed``, or all 0x00 / all 0xFF / a byte ramp."""
    if fill == "zeros":
        return bytes(nbytes)
    if fill == "ones":
        return b"\xff" * nbytes
    if fill == "ramp":
        return bytes(i % 251 for i in range(nbytes))
    return np.random.default_rng(seed).bytes(nbytes)


@st.composite
def arrays(
    draw: Any,
    dtype: np.dtype | st.SearchStrategy[np.dtype] | None = None,
    shape: tuple[int, ...] | st.SearchStrategy[tuple[int, ...]] | None = None,
    *,
    max_nbytes: int = 1 << 16,
    max_dims: int = 32,
) -> np.ndarray:
    """C-contiguous arrays built with ``np.frombuffer`` over random bytes.

    ``dtype`` and ``shape`` may be fixed values or strategies; by default
    :func:`dtypes` and :func:`shapes` with at most ``max_nbytes`` of data.
    """
    if dtype is None:
        dtype = dtypes()
    dt = draw(dtype) if isinstance(dtype, st.SearchStrategy) else np.dtype(dtype)
    if shape is None:
        shape = shapes(max_dims=max_dims, max_elements=max(1, max_nbytes // dt.itemsize))
    shp = draw(shape) if isinstance(shape, st.SearchStrategy) else tuple(shape)
    nbytes = math.prod(shp) * dt.itemsize
    fill = draw(st.sampled_from(["random", "random", "random", "zeros", "ones", "ramp"]))
    data = array_bytes(draw(st.integers(0, 2**32 - 1)), nbytes, fill)
    return np.frombuffer(data, dtype=dt).reshape(shp).copy()


@st.composite
def regions(draw: Any, shape: Sequence[int]) -> tuple[Any, Any]:
    """``(start, stop)`` with ``0 <= start <= stop <= shape``, in any accepted spelling.

    Each is ``None``, a list or a tuple (of Python or numpy ints), possibly
    shorter than ``len(shape)`` (the remaining axes are then whole). Use
    :func:`region_slices` to get the matching numpy index.
    """
    shape = tuple(shape)
    start, stop = [], []
    for n in shape:
        a = draw(st.integers(0, n))
        start.append(a)
        stop.append(draw(st.integers(a, n)))

    def spell(values: list[int], default: tuple[int, ...]) -> Any:
        form = draw(st.sampled_from(["full", "full", "short", "none"]))
        if form == "none":
            return None
        if form == "short":
            values = values[: draw(st.integers(0, len(values)))]
        kind = draw(st.sampled_from(["list", "tuple", "numpy"]))
        if kind == "numpy":
            return [np.int64(v) for v in values]
        return tuple(values) if kind == "tuple" else list(values)

    return spell(start, (0,) * len(shape)), spell(stop, shape)


def region_slices(shape: Sequence[int], start: Any, stop: Any) -> tuple[slice, ...]:
    """The numpy index that a ``(start, stop)`` from :func:`regions` means.

    For a 0-d array the index is ``()``, which makes numpy return a scalar (in
    native byte order); append ``...`` to keep a 0-d array.
    """
    shape = tuple(shape)
    lo = [int(v) for v in (start or ())] + [0] * (len(shape) - len(start or ()))
    hi = [int(v) for v in (stop or ())] + list(shape[len(stop or ()) :])
    return tuple(slice(a, b) for a, b in zip(lo, hi))


def npy_bytes(array: np.ndarray, version: tuple[int, int] | None = None, order: str = "C") -> bytes:
    """The bytes of an ``.npy`` file holding ``array`` (see :func:`save_npy`)."""
    if order not in ("C", "F"):
        raise ValueError(f"order must be 'C' or 'F', found {order!r}")
    array = np.asfortranarray(array) if order == "F" else np.ascontiguousarray(array)
    with warnings.catch_warnings():
        # "Stored array in format 2.0/3.0" when numpy picks the version itself.
        warnings.simplefilter("ignore", UserWarning)
        buf = io.BytesIO()
        try:
            np.lib.format.write_array(buf, array, version=version, allow_pickle=False)
        except ValueError:  # UnicodeEncodeError included: the header does not fit `version`
            if version is None:
                raise
            buf = io.BytesIO()
            np.lib.format.write_array(buf, array, version=None, allow_pickle=False)
    return buf.getvalue()


def save_npy(
    path: str | os.PathLike[str],
    array: np.ndarray,
    version: tuple[int, int] | None = None,
    order: str = "C",
) -> str:
    """Write ``array`` with ``numpy.lib.format.write_array`` and return the path as a string.

    ``order="F"`` stores a Fortran-ordered payload (numpy writes
    ``fortran_order: True`` only when the array is not also C-contiguous).
    A ``version`` the header cannot be stored in (format 1.0 holds at most
    65,535 header bytes; 1.0 and 2.0 hold only latin-1 field names) falls
    back to numpy's automatic choice, as ``numpy.save`` does; read the
    version back with ``numpy.lib.format.read_magic``.
    """
    data = npy_bytes(array, version, order)
    path = os.fspath(path)
    with open(path, "wb") as f:
        f.write(data)
    return path


def _leaves(a: np.ndarray) -> Iterator[np.ndarray]:
    """The non-structured parts of ``a``, field by field (padding bytes are not values)."""
    if a.dtype.names is None:
        yield a
        return
    for name in a.dtype.names:
        yield from _leaves(a[name])


def assert_same_array(actual: np.ndarray, expected: np.ndarray) -> None:
    """Same dtype (byte order, fields, offsets and titles included), shape and values, bit for bit.

    Values are compared as bytes, field by field, so NaN payloads, odd bools and
    invalid code points count while the padding between fields (which numpy's
    own copies do not preserve) does not.
    """
    assert isinstance(actual, np.ndarray), type(actual)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.dtype.str == expected.dtype.str, (actual.dtype.str, expected.dtype.str)
    assert actual.dtype.descr == expected.dtype.descr, (actual.dtype.descr, expected.dtype.descr)
    assert actual.dtype.fields == expected.dtype.fields, (actual.dtype.fields, expected.dtype.fields)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    for got, want in zip(_leaves(actual), _leaves(expected), strict=True):
        assert got.shape == want.shape, (got.shape, want.shape)
        assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes(), got.dtype
