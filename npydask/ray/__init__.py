"""A Ray Data datasource over npydask datasets (extra ``ray``; Ray is imported lazily).

:func:`read_npy` reads a folder, a list of files or a URL prefix into a
``ray.data.Dataset``; :class:`NpyDatasource` is the datasource behind it, and
``NpyDataset.to_ray`` hands an opened dataset over. The implementation is in
:mod:`npydask.ray.datasource`.
"""

from __future__ import annotations

from typing import Any

from npydask.ray.datasource import RowRange, check_arrow_dtype, dataset_to_ray, plan_row_ranges, read_npy

__all__ = ["NpyDatasource", "RowRange", "check_arrow_dtype", "dataset_to_ray", "plan_row_ranges", "read_npy"]


def __getattr__(name: str) -> Any:
    """``NpyDatasource``, made on first access (Ray is imported then)."""
    if name == "NpyDatasource":
        from npydask.ray import datasource

        return datasource.NpyDatasource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
