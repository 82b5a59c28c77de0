"""Pure ROI arithmetic: DALI ``fn.readers.numpy`` region-of-interest arguments.

DALI's numpy reader takes a region of interest (ROI) per file through
``roi_start``/``rel_roi_start``, ``roi_end``/``rel_roi_end``,
``roi_shape``/``rel_roi_shape`` and ``roi_axes``, plus an
``out_of_bounds_policy`` and a ``fill_value``. This module reproduces that
arithmetic exactly (DALI's ``NamedSliceAttr`` and ``ApplySliceBoundsPolicy``):

* Values are given per ROI axis: the k-th value applies to ``roi_axes[k]``
  (default: every axis in order; negative axes count from the end; an axis
  given twice is refused). A single shared value is broadcast to every ROI
  axis (per-file rows are not); any other count must equal the number of ROI
  axes.
* Per axis ``d`` of extent ``n``::

      start = roi_start | rel_roi_start * n | 0
      end   = roi_end                                  (the first given)
            | rel_roi_end * n
            | start + roi_shape                        (start unrounded)
            | (rel_roi_start + rel_roi_shape) * n      (sum in double precision)
            | start + rel_roi_shape * n
            | n

  Relative values are float32 and ``rel * n`` is a float32 product (C++
  ``float * int64_t``); the rest is double precision. An end before its start
  (compared before rounding) raises :class:`~npydask.errors.RoiError`
  whatever the policy; then start and end are rounded half away from zero
  (``llround``), so ``rel_roi_end=0.9`` on an extent of 15 gives 14
  (``0.9f * 15.0f == 13.5f``).
* ``out_of_bounds_policy``: ``"error"`` wants ``0 <= start, end <= n``;
  ``"trim_to_shape"`` clamps both to ``[0, n]``; ``"pad"`` keeps the ROI and
  fills the cells outside the file with ``fill_value`` converted to the dtype
  (integers: rounded half away from zero, saturated to the dtype's range).

A 2-D value (one row per file of the whole list) gives per-file ROIs; an empty
row means "not given" for that file. Nothing here touches a file: the caller
reads :attr:`FileRoi.box` and hands the block to :func:`apply_pad`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from npydask._buffers import exact_empty, raw
from npydask.errors import RoiError
from npydask.plan.region import Box

__all__ = [
    "OUT_OF_BOUNDS_POLICIES",
    "FileRoi",
    "RoiArgs",
    "apply_pad",
    "convert_fill",
    "cutting_roi",
    "fill_like",
    "resolve_roi",
]

OUT_OF_BOUNDS_POLICIES = ("error", "trim_to_shape", "pad")
"""The accepted ``out_of_bounds_policy`` values."""

VALUE_ARGS = ("roi_start", "rel_roi_start", "roi_end", "rel_roi_end", "roi_shape", "rel_roi_shape")
"""The ROI value arguments, in declaration order."""

EXCLUSIVE_PAIRS = (
    ("roi_start", "rel_roi_start"),
    ("roi_end", "rel_roi_end"),
    ("roi_end", "roi_shape"),
    ("roi_end", "rel_roi_shape"),
    ("rel_roi_end", "roi_shape"),
    ("rel_roi_end", "rel_roi_shape"),
    # DALI refuses any two of roi_end, rel_roi_end, roi_shape, rel_roi_shape.
    ("roi_shape", "rel_roi_shape"),
)
"""Arguments that may not be given together (``ValueError`` naming both)."""

_I64_LIMIT = 2**63
_NON_NUMERIC_KINDS = "VSUMmO"

Values = tuple[Any, ...]
"""ROI values of one file: ``int`` for absolute arguments, ``np.float32`` for relative ones."""


@dataclass(frozen=True)
class RoiArgs:
    """Normalised DALI ROI arguments, shared by every file or given per file.

    Build with :meth:`from_user`. Each value argument is ``None`` (not given),
    a tuple of values (shared by every file), or, when its name is in
    :attr:`per_file`, a tuple of rows, one per file (an empty row: not given
    for that file).

    Examples
    --------
    >>> args = RoiArgs.from_user(rel_roi_end=0.9, roi_axes=[0])
    >>> [float(v) for v in args.rel_roi_end]  # float32, as DALI stores it
    [0.8999999761581421]
    >>> resolve_roi(args, (15, 4), "u1").shape
    (14, 4)
    """

    roi_start: Values | None = None
    rel_roi_start: Values | None = None
    roi_end: Values | None = None
    rel_roi_end: Values | None = None
    roi_shape: Values | None = None
    rel_roi_shape: Values | None = None
    roi_axes: tuple[int, ...] | None = None
    out_of_bounds_policy: str = "error"
    fill_value: Any = 0
    per_file: tuple[str, ...] = ()

    @classmethod
    def from_user(
        cls,
        roi_start: Any = None,
        rel_roi_start: Any = None,
        roi_end: Any = None,
        rel_roi_end: Any = None,
        roi_shape: Any = None,
        rel_roi_shape: Any = None,
        roi_axes: Any = None,
        out_of_bounds_policy: str = "error",
        fill_value: Any = 0,
        n_files: int | None = None,
    ) -> RoiArgs:
        """Validate and normalise user ROI arguments (DALI's spelling).

        A scalar is a one-element list; ``None`` or an empty list means "not
        given"; a 2-D value (a list of rows or a 2-D array) gives one row per
        file, ``n_files`` rows when ``n_files`` is given.

        Raises
        ------
        ValueError
            For mutually exclusive arguments, non-integral absolute values,
            non-finite relative values, negative shapes, repeated axes, a
            wrong number of rows, or an unknown policy.
        """
        given = dict(zip(VALUE_ARGS, (roi_start, rel_roi_start, roi_end, rel_roi_end, roi_shape, rel_roi_shape)))
        values: dict[str, Any] = {}
        per_file: list[str] = []
        rows: dict[str, int] = {}
        for name, given_value in given.items():
            value, is_rows = _normalize_arg(name, given_value)
            values[name] = value
            if is_rows:
                per_file.append(name)
                rows[name] = len(value)
        for a, b in EXCLUSIVE_PAIRS:
            if values[a] is not None and values[b] is not None:
                raise ValueError(
                    f"ROI arguments {a} and {b} are mutually exclusive: found {a}={given[a]!r} and "
                    f"{b}={given[b]!r}; give only one of them"
                )
        if n_files is not None:
            for name, n in rows.items():
                if n != n_files:
                    raise ValueError(f"per-file {name} must have one row per file: expected {n_files} rows, found {n}")
        elif len(set(rows.values())) > 1:
            raise ValueError(f"per-file ROI arguments must have the same number of rows, found {rows}")
        if out_of_bounds_policy not in OUT_OF_BOUNDS_POLICIES:
            raise ValueError(
                f"out_of_bounds_policy must be one of {', '.join(map(repr, OUT_OF_BOUNDS_POLICIES))}, "
                f"found {out_of_bounds_policy!r}"
            )
        if isinstance(fill_value, (str, bytes)) or not isinstance(fill_value, numbers.Number):
            raise ValueError(f"fill_value must be a number, found {fill_value!r}")
        return cls(
            **values,
            roi_axes=_normalize_axes(roi_axes),
            out_of_bounds_policy=out_of_bounds_policy,
            fill_value=fill_value,
            per_file=tuple(per_file),
        )

    @property
    def has_roi(self) -> bool:
        """Whether any ROI value argument is given."""
        return any(getattr(self, name) is not None for name in VALUE_ARGS)

    @property
    def n_rows(self) -> int | None:
        """Rows of the per-file arguments, ``None`` when all are shared."""
        return len(getattr(self, self.per_file[0])) if self.per_file else None

    def for_file(self, index: int) -> RoiArgs:
        """The arguments of file ``index``: row ``index`` of every per-file value.

        Raises
        ------
        IndexError
            When ``index`` is not a row of the per-file values.
        """
        if not self.per_file:
            return self
        n = self.n_rows
        assert n is not None
        if not -n <= index < n:
            raise IndexError(f"file index {index} is out of range for per-file ROI arguments with {n} rows")
        picked: dict[str, Any] = {name: getattr(self, name)[index] or None for name in self.per_file}
        return replace(self, **picked, per_file=())


@dataclass(frozen=True)
class FileRoi:
    """The ROI of one file, resolved against its shape and dtype.

    Attributes
    ----------
    start, end : tuple of int
        The ROI in logical (C-order) coordinates, per axis, after the policy
        (clamped for ``"trim_to_shape"``; may lie outside the array for
        ``"pad"``). ``end - start`` is :attr:`shape`.
    box : Box
        The part inside the file, to read: the ROI clamped to ``[0, extent]``.
    pad_before, pad_after : tuple of int
        Per axis, the fill cells before and after the data (zero unless
        the policy is ``"pad"``).
    shape : tuple of int
        The output shape.
    fill_value : numpy scalar or None
        ``fill_value`` converted to the dtype (``"pad"`` only, else ``None``).
    """

    start: tuple[int, ...]
    end: tuple[int, ...]
    box: Box
    pad_before: tuple[int, ...]
    pad_after: tuple[int, ...]
    shape: tuple[int, ...]
    fill_value: Any = None

    @property
    def padded(self) -> bool:
        """Whether any output cell lies outside the file."""
        return any(self.pad_before) or any(self.pad_after)


def resolve_roi(
    args: RoiArgs,
    shape: Sequence[int],
    dtype: Any,
    *,
    index: int = 0,
    source: str = "<array>",
) -> FileRoi:
    """Resolve ``args`` for file ``index`` of ``shape`` and ``dtype`` (DALI arithmetic).

    Raises
    ------
    ValueError
        For a wrong number of values, an axis out of range or repeated, or a
        ``fill_value`` the dtype cannot hold.
    RoiError
        For an end before its start (any policy), bounds outside the array
        with ``out_of_bounds_policy="error"``, or coordinates beyond int64.
    IndexError
        When ``index`` is not a row of per-file arguments.

    Examples
    --------
    >>> args = RoiArgs.from_user(roi_start=[-1, 2], roi_end=[3, 4], out_of_bounds_policy="pad")
    >>> roi = resolve_roi(args, (2, 6), "i2")
    >>> roi.box, roi.pad_before, roi.pad_after, roi.shape
    (Box(start=(0, 2), stop=(2, 4)), (1, 0), (1, 0), (4, 2))
    """
    shape = tuple(int(n) for n in shape)
    dtype = np.dtype(dtype)
    ndim = len(shape)
    row = args.for_file(index)
    axes = _resolve_axes(row.roi_axes, shape, source)
    vals: dict[str, Values | None] = {}
    for name in VALUE_ARGS:
        vals[name] = _per_axis(name, getattr(row, name), len(axes), name in args.per_file, row.roi_axes, shape, source)

    start: list[int] = [0] * ndim
    end: list[int] = list(shape)
    for k, d in enumerate(axes):
        ext = shape[d]
        a, e = _axis_bounds(vals, k, ext)
        for what, x in (("start", a), ("end", e)):
            if isinstance(x, float) and not -_I64_LIMIT <= x <= _I64_LIMIT:
                raise RoiError(
                    f"{source}: ROI {what} on axis {d} is out of the int64 range (array of shape {shape}): found {x!r}"
                )
        if e < a:
            raise RoiError(
                f"{source}: the ROI ends before it starts on axis {d} (array of shape {shape}): "
                f"found start={a!r}, end={e!r}; expected end >= start"
            )
        start[d], end[d] = _round_half_away(a), _round_half_away(e)

    policy = row.out_of_bounds_policy
    if policy == "error":
        for d, (a, e, n) in enumerate(zip(start, end, shape)):
            if not (0 <= a <= n and 0 <= e <= n):
                raise RoiError(
                    f"{source}: ROI start={start} end={end} lies outside the array of shape {shape} on "
                    f"axis {d}: expected 0 <= start <= end <= {n}, found start={a}, end={e}; use "
                    f"out_of_bounds_policy='trim_to_shape' or 'pad'"
                )
    elif policy == "trim_to_shape":
        start = [min(max(a, 0), n) for a, n in zip(start, shape)]
        end = [min(max(e, 0), n) for e, n in zip(end, shape)]
    lo = tuple(min(max(a, 0), n) for a, n in zip(start, shape))
    hi = tuple(min(max(e, 0), n) for e, n in zip(end, shape))
    out = tuple(e - a for a, e in zip(start, end))
    before = tuple(min(m, max(0, -a)) for a, m in zip(start, out))
    after = tuple(m - b - (h - low) for m, b, low, h in zip(out, before, lo, hi))
    fill = None
    if policy == "pad":
        try:
            fill = convert_fill(row.fill_value, dtype)
        except ValueError as e:
            raise ValueError(f"{source} (array of shape {shape}): {e}") from e
    return FileRoi(tuple(start), tuple(end), Box(lo, hi), before, after, out, fill)


def cutting_roi(
    args: RoiArgs, shape: tuple[int, ...], dtype: Any, *, index: int = 0, source: str = "<array>"
) -> FileRoi | None:
    """:func:`resolve_roi`, or ``None`` where the ROI is the whole array, unpadded (nothing to cut).

    Examples
    --------
    >>> cutting_roi(RoiArgs.from_user(roi_start=0), (4,), "u1") is None
    True
    >>> cutting_roi(RoiArgs.from_user(roi_start=1), (4,), "u1").shape
    (3,)
    """
    roi = resolve_roi(args, shape, dtype, index=index, source=source)
    if not roi.padded and roi.box.start == (0,) * len(shape) and roi.box.stop == tuple(shape):
        return None
    return roi


def apply_pad(block: np.ndarray, roi: FileRoi) -> np.ndarray:
    """Place ``block`` (the array read from ``roi.box``) in the ROI's output.

    Returns a C-contiguous array of ``roi.shape``: ``block`` itself (made
    contiguous) when nothing is padded, else ``block`` surrounded by
    ``roi.fill_value``.

    Examples
    --------
    >>> args = RoiArgs.from_user(roi_start=-1, roi_end=3, out_of_bounds_policy="pad", fill_value=9)
    >>> roi = resolve_roi(args, (2,), "u1")
    >>> apply_pad(np.array([1, 2], "u1"), roi)
    array([9, 1, 2, 9], dtype=uint8)
    """
    block = np.asarray(block)
    if block.shape != roi.box.shape:
        raise ValueError(f"block of shape {block.shape} does not match the ROI box of shape {roi.box.shape}")
    if not roi.padded:
        return np.asarray(block, order="C")  # (np.ascontiguousarray makes 0-d arrays 1-d)
    out = fill_like(exact_empty(roi.shape, block.dtype), roi)
    raw(out)[tuple(slice(b, b + n) for b, n in zip(roi.pad_before, block.shape))] = raw(block)  # padding too
    return out


def fill_like(out: np.ndarray, roi: FileRoi) -> np.ndarray:
    """Fill ``out`` with the ROI's pad value (zero bytes for non-numeric dtypes) and return it."""
    if out.dtype.kind in _NON_NUMERIC_KINDS or roi.fill_value is None:
        raw(out)[...] = np.zeros((), raw(out).dtype)  # every byte, structured padding included
    else:
        out[...] = roi.fill_value
    return out


def convert_fill(value: Any, dtype: Any) -> Any:
    """Convert a fill value to ``dtype`` as DALI does (``ConvertSat``).

    Integers are rounded half away from zero and saturated to the dtype's
    range; booleans are ``value != 0``; floating and complex dtypes cast as
    numpy does (``float16`` overflows to ``inf``). Non-numeric dtypes
    (structured, strings, datetimes) take only ``0``, meaning zeros.

    Examples
    --------
    >>> [int(convert_fill(v, t)) for v, t in [(300.6, "u1"), (-3.5, "i1"), (1e30, "i4")]]
    [255, -4, 2147483647]
    """
    dtype = np.dtype(dtype)
    kind = dtype.kind
    is_number = isinstance(value, numbers.Number) and not isinstance(value, (str, bytes))
    if not is_number:  # (a flag, not an isinstance narrowing: numbers.Number types no arithmetic)
        raise ValueError(f"fill_value must be a number, found {value!r}")
    if kind in _NON_NUMERIC_KINDS:
        if value != 0:
            raise ValueError(
                f"fill_value={value!r} cannot fill an array of dtype {dtype}: only 0 (zeros) is supported "
                f"for non-numeric dtypes"
            )
        return np.zeros((), dtype)[()]
    if kind == "c":
        with np.errstate(all="ignore"):
            return np.array(complex(value), dtype=dtype)[()]
    if isinstance(value, numbers.Complex) and not isinstance(value, numbers.Real):
        if complex(value).imag != 0:
            raise ValueError(f"fill_value={value!r} is complex but the dtype {dtype} is not")
        value = complex(value).real
    if kind == "b":
        return np.bool_(value != 0)
    if kind in "iu":
        if isinstance(value, numbers.Integral):
            v = int(value)
        else:
            x = float(value)
            if math.isnan(x):
                raise ValueError(f"fill_value=nan cannot be stored in an array of dtype {dtype}")
            v = _round_half_away(x) if math.isfinite(x) else (1 if x > 0 else -1) * _I64_LIMIT * 2
        info = np.iinfo(dtype)
        return np.array(min(max(v, int(info.min)), int(info.max)), dtype=dtype)[()]
    with np.errstate(all="ignore"):
        try:
            return np.array(value, dtype=dtype)[()]
        except OverflowError:  # a Python int beyond float range
            return np.array(math.inf if value > 0 else -math.inf, dtype=dtype)[()]


def _axis_bounds(vals: dict[str, Values | None], k: int, ext: int) -> tuple[int | float, int | float]:
    """Unrounded (start, end) along ROI axis ``k`` of extent ``ext``; ints stay exact."""
    f_ext = np.float32(ext)
    with np.errstate(over="ignore"):
        a: int | float = 0
        if vals["roi_start"] is not None:
            a = vals["roi_start"][k]
        elif vals["rel_roi_start"] is not None:
            a = float(vals["rel_roi_start"][k] * f_ext)
        if vals["roi_end"] is not None:
            e: int | float = vals["roi_end"][k]
        elif vals["rel_roi_end"] is not None:
            e = float(vals["rel_roi_end"][k] * f_ext)
        elif vals["roi_shape"] is not None:
            e = a + vals["roi_shape"][k]
        elif vals["rel_roi_start"] is not None and vals["rel_roi_shape"] is not None:
            e = (float(vals["rel_roi_start"][k]) + float(vals["rel_roi_shape"][k])) * float(ext)
        elif vals["rel_roi_shape"] is not None:
            e = a + float(vals["rel_roi_shape"][k] * f_ext)
        else:
            e = ext
    return a, e


def _round_half_away(x: int | float) -> int:
    """C's ``llround``: the nearest integer, halves away from zero."""
    if isinstance(x, int):
        return x
    if x < 0:
        return -_round_half_away(-x)
    f = math.floor(x)
    return f + 1 if x - f >= 0.5 else f


def _resolve_axes(roi_axes: tuple[int, ...] | None, shape: tuple[int, ...], source: str) -> tuple[int, ...]:
    ndim = len(shape)
    if roi_axes is None:
        return tuple(range(ndim))
    axes = []
    for axis in roi_axes:
        if not -ndim <= axis < ndim:
            raise ValueError(
                f"{source}: roi_axes={list(roi_axes)} has axis {axis} out of range for the array of shape "
                f"{shape}: expected {-ndim} <= axis < {ndim}"
            )
        axes.append(axis % ndim)
    if len(set(axes)) != len(axes):
        raise ValueError(
            f"{source}: roi_axes={list(roi_axes)} names an axis more than once for the array of shape {shape} "
            f"(negative axes count from the end): found axes {axes}"
        )
    return tuple(axes)


def _per_axis(
    name: str,
    values: Values | None,
    n_axes: int,
    from_rows: bool,
    roi_axes: tuple[int, ...] | None,
    shape: tuple[int, ...],
    source: str,
) -> Values | None:
    """Check the number of values; a shared single value is broadcast (DALI constants)."""
    if values is None or len(values) == n_axes:
        return values
    if len(values) == 1 and not from_rows:
        return values * n_axes
    axes = "roi_axes not given: one per axis" if roi_axes is None else f"one per roi_axes={list(roi_axes)}"
    one = "" if from_rows else ", or 1 for every axis"
    raise ValueError(
        f"{source}: {name} has {len(values)} values {list(values)} but the array of shape {shape} has "
        f"{n_axes} ROI axes ({axes}): expected {n_axes} values{one}"
    )


def _normalize_axes(roi_axes: Any) -> tuple[int, ...] | None:
    if roi_axes is None:
        return None
    raw = roi_axes.tolist() if isinstance(roi_axes, np.ndarray) else roi_axes
    items = list(raw) if isinstance(raw, (list, tuple)) else [raw]
    if not items:
        return None  # DALI: empty axes mean all axes
    axes = []
    for axis in items:
        if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, numbers.Integral):
            raise ValueError(f"roi_axes must be integers, found {roi_axes!r}")
        axes.append(int(axis))
    if len(set(axes)) != len(axes):
        raise ValueError(f"roi_axes names an axis more than once: found {roi_axes!r}")
    return tuple(axes)


def _normalize_arg(name: str, raw: Any) -> tuple[Any, bool]:
    """(values or rows or None, whether per file) for one ROI value argument."""
    if raw is None:
        return None, False
    if isinstance(raw, np.ndarray):
        if raw.ndim > 2:
            raise ValueError(
                f"{name} must be a scalar, a list or a list of rows (one per file), found a {raw.ndim}-D array"
            )
        raw = raw.tolist()
    if not _is_sequence(raw):
        return (_convert(name, raw, raw),), False
    items = list(raw)
    if not items:
        return None, False
    nested = [_is_sequence(v) for v in items]
    if not any(nested):
        return tuple(_convert(name, v, raw) for v in items), False
    if not all(nested):
        raise ValueError(f"{name} mixes numbers and rows: expected a list of numbers or a list of rows, found {raw!r}")
    rows = []
    for row in items:
        row = row.tolist() if isinstance(row, np.ndarray) else list(row)
        if any(_is_sequence(v) for v in row):
            raise ValueError(f"{name} must be at most 2-D (one row per file), found {raw!r}")
        rows.append(tuple(_convert(name, v, raw) for v in row))
    return tuple(rows), True


def _is_sequence(value: Any) -> bool:
    return isinstance(value, (list, tuple, np.ndarray)) and not (isinstance(value, np.ndarray) and value.ndim == 0)


def _convert(name: str, value: Any, whole: Any) -> Any:
    """One value: an ``int`` for absolute arguments, an ``np.float32`` for relative ones."""
    if isinstance(value, np.ndarray):
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} values must be real numbers, found {value!r} in {whole!r}")
    shape_arg = name.endswith("roi_shape")
    if name.startswith("rel_"):
        with np.errstate(over="ignore"):
            rel = np.float32(value)
        if not np.isfinite(rel):
            raise ValueError(f"{name} values must be finite float32 numbers, found {value!r} in {whole!r}")
        if shape_arg and rel < 0:
            raise ValueError(f"{name} values must be >= 0, found {value!r} in {whole!r}")
        return rel
    if not isinstance(value, numbers.Integral):
        x = float(value)
        if not math.isfinite(x) or x != math.floor(x):
            raise ValueError(f"{name} values must be integers (absolute coordinates), found {value!r} in {whole!r}")
        value = int(x)
    v = int(value)
    if not -_I64_LIMIT <= v < _I64_LIMIT:
        raise ValueError(f"{name} values must fit in int64, found {value!r} in {whole!r}")
    if shape_arg and v < 0:
        raise ValueError(f"{name} values must be >= 0, found {value!r} in {whole!r}")
    return v
