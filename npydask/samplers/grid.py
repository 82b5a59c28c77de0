"""Sliding-window tiles for inference: :class:`Grid`, MONAI's ``dense_patch_slices`` layout."""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from typing import Any

from npydask._keywords import suggest_keywords
from npydask.plan.patches import Patch, axis_starts, grid_step
from npydask.samplers.base import BoundSampler, Sampler, check_fill_value, check_patch_shape

__all__ = ["Grid", "GridBound"]


class Grid(Sampler):
    """Every file tiled by overlapping boxes of ``patch_shape``, for sliding-window inference.

    The tiles of MONAI's ``sliding_window_inference`` (``dense_patch_slices``)
    and TorchIO's ``GridSampler``: along each axis tiles start at ``0, step,
    2*step, ...`` and the last is shifted back to end at the file's extent,
    so every voxel is covered and no tile hangs over the edge. Only along an
    axis shorter than the patch is a tile padded with ``fill_value``: it is
    centred over the axis, ``(patch - extent) // 2`` voxels before it, as
    MONAI pads small inputs. The epoch visits every tile of file 0 in raster
    order (last axis fastest), then file 1's, ...; ``shuffle`` and ``seed``
    are ignored (:attr:`BoundSampler.shuffle_ignored`).

    Parameters
    ----------
    patch_shape : tuple of int
        The tile's size over each file's trailing axes (leading axes, such as
        channels, are read whole).
    overlap : float or sequence of float, default 0.25
        The fraction of the tile shared with its neighbour, in ``[0, 1)``
        (one value, or one per axis): the step is
        ``max(1, int(patch * (1 - overlap)))``, as MONAI's.
    overlap_voxels : int or sequence of int, optional
        The overlap in voxels instead, in ``[0, patch)``: the step is
        ``patch - overlap_voxels``. When given it replaces ``overlap``.
    fill_value : number, default 0
        What the padded part of a tile over a file smaller than the patch holds.

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os
    >>> from npydask.samplers import Grid
    >>> root = tempfile.mkdtemp()
    >>> np.save(os.path.join(root, "a.npy"), np.zeros((10, 8), "f4"))
    >>> bound = Grid((4, 8), overlap=0.5).bind(npydask.open_dataset(root))
    >>> [(t.start, t.stop) for t in bound.tiles(0)]
    [((0, 0), (4, 8)), ((2, 0), (6, 8)), ((4, 0), (8, 8)), ((6, 0), (10, 8))]
    >>> len(bound), bound.patch(0, 3) == bound.tiles(0)[3]
    (4, True)
    """

    overlap: float | tuple[float, ...]
    overlap_voxels: int | tuple[int, ...] | None
    step: tuple[int, ...]
    """The step between tiles per axis (from ``overlap`` or ``overlap_voxels``)."""

    @suggest_keywords
    def __init__(
        self,
        patch_shape: Sequence[int],
        *,
        overlap: float | Sequence[float] = 0.25,
        overlap_voxels: int | Sequence[int] | None = None,
        fill_value: Any = 0,
    ) -> None:
        patch = check_patch_shape(patch_shape)
        step = grid_step(patch, overlap, overlap_voxels)
        self._set(
            patch_shape=patch,
            per_file=None,
            policy="pad",
            fill_value=check_fill_value(fill_value),
            overlap=_hashable(overlap),
            overlap_voxels=_hashable(overlap_voxels),
            step=step,
        )

    def params(self) -> dict[str, Any]:
        """``patch_shape``, ``overlap``, ``overlap_voxels`` and ``fill_value``."""
        return {
            "patch_shape": self.patch_shape,
            "overlap": self.overlap,
            "overlap_voxels": self.overlap_voxels,
            "fill_value": self.fill_value,
        }

    def _bind(self, extents: tuple[tuple[int, ...], ...], dataset: Any) -> GridBound:
        return GridBound(self, extents)


def _hashable(value: Any) -> Any:
    """A per-axis list as a tuple of Python numbers; a NumPy scalar as a Python one."""
    if isinstance(value, (list, tuple)) or hasattr(value, "__len__"):
        return tuple(v.item() if hasattr(v, "item") else v for v in value)
    return value.item() if hasattr(value, "item") else value


class GridBound(BoundSampler):
    """:class:`Grid` bound to a dataset: every file's tiles, numbered file by file in raster order.

    Made by :meth:`Grid.bind <npydask.samplers.Sampler.bind>`; see :class:`Grid`'s example.
    """

    sampler: Grid
    shuffle_ignored = True

    def __init__(self, sampler: Grid, extents: tuple[tuple[int, ...], ...]) -> None:
        super().__init__(sampler, extents)
        patch, step = sampler.patch_shape, sampler.step
        self._starts = [[axis_starts(e, p, s) for e, p, s in zip(extent, patch, step)] for extent in extents]
        self._offsets = [0, *itertools.accumulate(math.prod(len(a) for a in axes) for axes in self._starts)]

    def __len__(self) -> int:
        return self._offsets[-1]

    def tile_count(self, file: int) -> int:
        """How many tiles file ``file`` has.

        Examples
        --------
        >>> import numpy as np, npydask, tempfile, os
        >>> root = tempfile.mkdtemp()
        >>> for i, n in enumerate((10, 4)): np.save(os.path.join(root, f"{i}.npy"), np.zeros((n, n)))
        >>> bound = Grid((4, 4), overlap=0).bind(npydask.open_dataset(root))
        >>> bound.tile_count(0), bound.tile_count(1), bound.first_position(1), len(bound)
        (9, 1, 9, 10)
        """
        return self._offsets[file + 1] - self._offsets[file]

    def axis_starts(self, file: int) -> tuple[tuple[int, ...], ...]:
        """File ``file``'s tile starts along each patch axis (increasing): its tiles are their product.

        Raises
        ------
        IndexError
            ``file`` is not a file of the dataset.

        Examples
        --------
        >>> import numpy as np, npydask, tempfile, os
        >>> root = tempfile.mkdtemp(); np.save(os.path.join(root, "a.npy"), np.zeros((10, 3)))
        >>> Grid((4, 4), overlap=0).bind(npydask.open_dataset(root)).axis_starts(0)
        ((0, 4, 6), (0,))
        """
        if not 0 <= file < self.n_files:
            raise IndexError(f"file {file} is out of range for a Grid over {self.n_files} files")
        return tuple(tuple(a) for a in self._starts[file])

    def first_position(self, file: int) -> int:
        """The global position of file ``file``'s first tile."""
        return self._offsets[file]

    def tiles(self, file: int) -> list[Patch]:
        """File ``file``'s tiles in raster order (last axis fastest).

        Raises
        ------
        IndexError
            ``file`` is not a file of the dataset.
        """
        if not 0 <= file < self.n_files:
            raise IndexError(f"file {file} is out of range for a Grid over {self.n_files} files")
        patch = self.patch_shape
        return [
            Patch(file, start, tuple(s + p for s, p in zip(start, patch)))
            for start in itertools.product(*self._starts[file])
        ]

    def patch(self, epoch: int, position: int, *, seed: int | None = None, shuffle: bool = False) -> Patch:
        """Tile ``position`` of the epoch: the same every epoch, whatever ``seed`` and ``shuffle``."""
        self._position(epoch, position, seed)
        file = bisect.bisect_right(self._offsets, position) - 1
        rest = position - self._offsets[file]
        axes = self._starts[file]
        start = []
        for a in reversed(axes):
            rest, i = divmod(rest, len(a))
            start.append(a[i])
        start.reverse()
        return Patch(file, tuple(start), tuple(s + p for s, p in zip(start, self.patch_shape)))
