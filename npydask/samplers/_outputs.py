"""Where the :class:`~npydask.samplers.Stitcher` puts each file's result, plane range by plane range.

* :class:`ArrayOutput`: a NumPy array, kept.
* :class:`NpyOutput`: ``<folder>/<name>.npy`` through a storage target (a
  local temporary file renamed into place when complete, or one PUT).
* :class:`ZarrOutput`: the array ``<name>`` of a zarr v3 group, through the
  store :func:`npydask.zarr_store` opens (written chunk by chunk as planes
  become final; chunks span a tile step of planes, so few are written twice).
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from npydask.samplers._paths import source_for
from npydask.storage.base import Source, Target
from npydask.storage.local import LocalTarget
from npydask.storage.urls import is_url, redact
from npydask.write.npy import check_names, plan_header
from npydask.write.zarr import check_zarr_dtype
from npydask.write.zarr_store import require_zarr, zarr_store

__all__ = ["ArrayOutput", "NpyOutput", "Output", "ZarrOutput", "is_zarr", "output_names", "zarr_group"]


def is_zarr(out: str) -> bool:
    """Whether ``out`` names a zarr group (it ends in ``.zarr``) rather than a folder of ``.npy`` files."""
    return out.rstrip("/").endswith(".zarr")


def output_names(files: list[str], zarr: bool) -> list[str]:
    """Each file's output name: its base name (``.npy`` kept for a folder, dropped for a zarr array).

    Raises
    ------
    ValueError
        Two files share a base name.
    """
    names = check_names([f.rsplit("/", 1)[-1].split("?", 1)[0] for f in files])
    return [n.removesuffix(".npy") for n in names] if zarr else names


class Output:
    """One file's result being written: planes ``[first, first + n)`` of the first patch axis at a time."""

    def __init__(self, shape: tuple[int, ...], nc: int) -> None:
        self.shape, self.nc = shape, nc

    def write(self, first: int, value: np.ndarray) -> None:
        """Store ``value``: planes ``first, ...`` of the first patch axis, every channel."""
        raise NotImplementedError

    def finish(self) -> Any:
        """The result: the array, or where it was written."""
        raise NotImplementedError


class ArrayOutput(Output):
    """A NumPy array, returned as it is."""

    def __init__(self, shape: tuple[int, ...], nc: int, dtype: np.dtype) -> None:
        super().__init__(shape, nc)
        self.array = np.empty(shape, dtype)

    def write(self, first: int, value: np.ndarray) -> None:
        self.array[(*(slice(None),) * self.nc, slice(first, first + value.shape[self.nc]))] = value

    def finish(self) -> np.ndarray:
        return self.array


class NpyOutput(Output):
    """``where`` (a local path or an object URL), its header written first, each channel's planes at their offsets."""

    def __init__(self, shape: tuple[int, ...], nc: int, dtype: np.dtype, where: str, data_source: Source) -> None:
        super().__init__(shape, nc)
        self.where = where
        preamble, header = plan_header(where, dtype, shape)
        size = header.data_offset + header.nbytes
        self.target: Target
        if is_url(where):
            from npydask.storage.object_write import ObjectTarget

            self.target = ObjectTarget(source_for(where, data_source)[0], where, size)  # type: ignore[arg-type]
        else:
            os.makedirs(os.path.dirname(where), exist_ok=True)
            self.target = LocalTarget(where, size)
        self.target.write_block(0, preamble)
        self.offset = header.data_offset
        self.plane = math.prod(shape[nc + 1 :]) * dtype.itemsize

    def write(self, first: int, value: np.ndarray) -> None:
        channels, depth = self.shape[: self.nc], self.shape[self.nc]
        for c in np.ndindex(*channels):
            n = int(np.ravel_multi_index(c, channels)) if c else 0
            self.target.write_block(self.offset + (n * depth + first) * self.plane, np.ascontiguousarray(value[c]))

    def finish(self) -> str:
        self.target.finish()
        return redact(self.where) if is_url(self.where) else self.where


class ZarrOutput(Output):
    """The array ``name`` in the zarr group ``group`` (made or replaced), chunks a tile step of planes deep."""

    def __init__(self, shape: tuple[int, ...], nc: int, dtype: np.dtype, group: Any, name: str, step: int) -> None:
        super().__init__(shape, nc)
        plane = [min(n, 256) for n in shape[nc + 1 :]]
        chunks = (*(1,) * nc, min(step, shape[nc]), *plane)
        self.array = group.create_array(name, shape=shape, dtype=check_zarr_dtype(dtype), chunks=chunks,
                                        overwrite=True)
        self.shown = name

    def write(self, first: int, value: np.ndarray) -> None:
        self.array[(*(slice(None),) * self.nc, slice(first, first + value.shape[self.nc]))] = value

    def finish(self) -> Any:
        return self.array


def zarr_group(out: str, data_source: Source) -> Any:
    """The zarr group at ``out`` (a local path or URL; an object URL in the dataset's bucket with its options)."""
    zarr = require_zarr("Stitcher(out='....zarr')")
    options = None
    if is_url(out):
        source, _ = source_for(out, data_source)
        spec = getattr(source, "spec", None)
        if source is data_source and spec is not None:
            options = dict(spec.options)
    store = zarr_store(out if is_url(out) else os.path.abspath(out), options)
    return zarr.open_group(store, mode="a", zarr_format=3)
