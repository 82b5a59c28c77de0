"""Where a dataset's adapters live: dotted paths, imported on first use.

:meth:`NpyDataset.to_ray <npydask.NpyDataset.to_ray>` and
:meth:`~npydask.NpyDataset.to_xarray` hand the dataset to adapters that live
in higher wings (``npydask.ray``, ``npydask.xarray``). ``dataset/`` never
imports them by name: :func:`adapter` looks the dotted path up in
:data:`EXPORTS` and imports its module when a method is first called (the
way ``fsspec`` finds its filesystems), so the layers stay one-way and
``import npydask`` imports neither adapter.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, NamedTuple

from npydask.errors import missing

__all__ = ["EXPORTS", "Export", "adapter"]


class Export(NamedTuple):
    """An adapter: its dotted path, the module it cannot work without (``None``: it checks itself) and who needs it."""

    path: str
    needs: str | None = None
    what: str = ""


EXPORTS: dict[str, Export] = {
    "to_ray": Export("npydask.ray.datasource.dataset_to_ray"),
    "to_xarray": Export("npydask.xarray.dataset_to_xarray", "xarray", "NpyDataset.to_xarray"),
}
"""Method name -> the adapter it calls."""


def adapter(name: str) -> Callable[..., Any]:
    """The adapter ``name`` of :data:`EXPORTS`, its module imported now.

    Raises
    ------
    ImportError
        The module the adapter needs is not installed (the message names the extra).

    >>> adapter("to_ray").__name__
    'dataset_to_ray'
    """
    export = EXPORTS[name]
    if export.needs is not None:
        try:
            importlib.import_module(export.needs)
        except ImportError as e:
            raise ImportError(missing(export.needs, export.what)) from e
    module, _, attr = export.path.rpartition(".")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]
