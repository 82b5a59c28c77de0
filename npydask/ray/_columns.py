"""numpy blocks as Ray Data's Arrow columns, and the dtypes Arrow has no tensor type for.

Used by :mod:`npydask.ray.datasource`'s read tasks. pyarrow and Ray's tensor
extension types are imported inside the functions that need them, so
importing this module imports neither.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from npydask.dataset.scan import dtype_name

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

__all__ = ["check_arrow_dtype", "column_type", "ragged_column", "tensor_column"]

_VIEWS = {
    "c": "a view of (real, imag) pairs, np.save(p, a.view('float{bits}').reshape(*a.shape, 2))",
    "M": "its integer counts, np.save(p, a.view('int64')) (the unit in the file name or metadata)",
    "m": "its integer counts, np.save(p, a.view('int64')) (the unit in the file name or metadata)",
    "V": "one file per field (np.save(p, a['field'])) or its raw bytes, a.view('uint8').reshape(*a.shape, {size})",
    "S": "its raw bytes, a.view('uint8').reshape(*a.shape, {size})",
    "f": "float64 (a.astype('float64'), which rounds) or its raw bytes, a.view('uint8').reshape(*a.shape, {size})",
}


def check_arrow_dtype(dtype: np.dtype, path: str) -> None:
    """Refuse a dtype Arrow has no tensor type for, naming it and the view to save instead.

    Examples
    --------
    >>> check_arrow_dtype(np.dtype(">f4"), "a.npy")
    >>> check_arrow_dtype(np.dtype("c8"), "a.npy")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: a.npy holds complex64 (<c8), which Arrow (and so Ray Data) has no tensor type for: save a view of ...
    """
    kind = dtype.kind
    refused = kind in "cMmVS" or dtype.fields is not None or (kind == "f" and dtype.itemsize > 8)
    if not refused:
        return
    hint = _VIEWS["V" if dtype.fields is not None else kind].format(bits=dtype.itemsize * 4, size=dtype.itemsize)
    raise TypeError(
        f"{path} holds {dtype_name(dtype)}, which Arrow (and so Ray Data) has no tensor type for: save {hint}, "
        "or read it as a dask array with npydask.open_dataset(...).stack()"
    )


def tensor_column(block: np.ndarray) -> Any:
    """Rows of ``block`` (C-contiguous) as one Arrow column, sharing ``block``'s memory (bools are bit-packed).

    Rows of one element are a plain Arrow array; others Ray's tensor extension type.
    """
    from ray.data.extensions import ArrowTensorArray

    return ArrowTensorArray.from_numpy(block)


def ragged_column(rows: list[np.ndarray]) -> Any:
    """Rows of different shapes as one column of Ray's variable-shaped tensor type."""
    from ray.data.extensions import ArrowVariableShapedTensorArray

    holder = np.empty(len(rows), dtype=object)
    holder[:] = rows
    return ArrowVariableShapedTensorArray.from_numpy(holder)


def column_type(row_shape: tuple[int, ...] | None, dtype: np.dtype, ndim: int) -> pa.DataType:
    """The Arrow type of the blocks' tensor column.

    Rows of ``row_shape``, or (``None``) ``ndim``-d rows of different shapes.
    """
    import pyarrow as pa

    if row_shape is None:
        from ray.data.extensions import ArrowVariableShapedTensorType

        return ArrowVariableShapedTensorType(pa.from_numpy_dtype(dtype), ndim)
    if row_shape == ():
        return pa.from_numpy_dtype(dtype)
    return tensor_column(np.empty((0, *row_shape), dtype)).type
