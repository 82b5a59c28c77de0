"""Random boxes drawn uniformly: :class:`Uniform`, several per file per epoch."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from npydask._keywords import suggest_keywords
from npydask.plan.patches import Patch, start_range, uniform_starts
from npydask.plan.sampling import DEFAULT_SEED, check_int
from npydask.samplers.base import Sampler, UnitBound, check_fill_value, check_patch_shape, check_policy

__all__ = ["Uniform", "UniformBound"]


class Uniform(Sampler):
    """Boxes of ``patch_shape`` drawn uniformly at random, ``per_file`` per file each epoch.

    Like MONAI's ``RandSpatialCropSamplesd``, TorchIO's ``UniformSampler`` and
    DALI's ROI arguments drawn from ``fn.random.uniform``, but from headers
    only: the loader then reads just the box's bytes.

    Parameters
    ----------
    patch_shape : tuple of int
        The box's size over each file's trailing axes; leading axes
        (channels) are read whole, as with ``roi_axes``.
    per_file : int, default 1
        Patches per file per epoch. The ``per_file`` patches of a file are a
        unit, kept adjacent in the epoch's order (so a file's patches are read
        together); an epoch has ``per_file * len(dataset)`` samples, and
        ``shuffle`` permutes whole units by a generator seeded with
        ``(seed, epoch)``.
    policy : {"inside", "pad"}, default "inside"
        ``"inside"``: every box lies in its file, and binding to a dataset with
        a file smaller than the patch raises :class:`~npydask.errors.RoiError`
        naming it. ``"pad"``: along an axis shorter than the patch the box
        covers the whole axis and hangs over its ends (the file at a uniformly
        drawn offset inside the box, as DALI's ``fn.crop`` places a crop larger
        than its input, and as MONAI's ``SpatialPadd`` before a random crop),
        the rest filled with ``fill_value``; where the patch fits, boxes are
        drawn inside as with ``"inside"``.
    fill_value : number, default 0
        What the part of a padded box outside its file holds.

    Notes
    -----
    Each sample's box depends only on ``(seed, epoch, global position)``: a
    counter-based hash of those numbers (:func:`npydask.plan.patches.uniform_starts`)
    gives its start per axis, the same boxes whatever the number of shards,
    workers or the batch size, and a batch's boxes are drawn together.

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os
    >>> from npydask.samplers import Uniform
    >>> root = tempfile.mkdtemp()
    >>> for i in range(3): np.save(os.path.join(root, f"{i}.npy"), np.zeros((2, 40, 50), "f4"))
    >>> bound = Uniform((16, 16), per_file=2).bind(npydask.open_dataset(root))
    >>> len(bound)
    6
    >>> p = bound.patch(epoch=0, position=3, seed=1)
    >>> p.file, p.shape, p == bound.patch(0, 3, seed=1)
    (1, (16, 16), True)
    >>> all(0 <= a and b <= e for a, b, e in zip(p.start, p.stop, (40, 50)))
    True
    """

    @suggest_keywords
    def __init__(
        self, patch_shape: Sequence[int], *, per_file: int = 1, policy: str = "inside", fill_value: Any = 0
    ) -> None:
        self._set(
            patch_shape=check_patch_shape(patch_shape),
            per_file=check_int("per_file", per_file, 1),
            policy=check_policy(policy),
            fill_value=check_fill_value(fill_value),
        )

    def params(self) -> dict[str, Any]:
        """``patch_shape``, ``per_file``, ``policy`` and ``fill_value``."""
        return {
            "patch_shape": self.patch_shape,
            "per_file": self.per_file,
            "policy": self.policy,
            "fill_value": self.fill_value,
        }

    def _bind(self, extents: tuple[tuple[int, ...], ...], dataset: Any) -> UniformBound:
        return UniformBound(self, extents)


class UniformBound(UnitBound):
    """:class:`Uniform` bound to a dataset (made by :meth:`Uniform.bind <npydask.samplers.Sampler.bind>`).

    Its order of units is :class:`~npydask.samplers.base.UnitBound`'s.

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os
    >>> root = tempfile.mkdtemp(); np.save(os.path.join(root, "a.npy"), np.zeros((2, 20)))
    >>> bound = Uniform((4, 4), per_file=8, policy="pad", fill_value=-1).bind(npydask.open_dataset(root))
    >>> all(-2 <= p.start[0] <= 0 and p.stop[0] >= 2 for p in bound.patches(0, range(8)))  # axis 0 whole, padded
    True
    """

    sampler: Uniform

    def __init__(self, sampler: Uniform, extents: tuple[tuple[int, ...], ...]) -> None:
        super().__init__(sampler, extents)
        self._ranges: tuple[np.ndarray, np.ndarray] | None = None

    def patch(self, epoch: int, position: int, *, seed: int | None = None, shuffle: bool = False) -> Patch:
        return self.patches(epoch, (position,), seed=seed, shuffle=shuffle)[0]

    def patches(
        self, epoch: int, positions: Iterable[int], *, seed: int | None = None, shuffle: bool = False
    ) -> list[Patch]:
        """The boxes of several positions of ``epoch``, drawn together (``uniform_starts``)."""
        epoch = check_int("epoch", epoch, 0)
        seed = DEFAULT_SEED if seed is None else check_int("seed", seed, 0)
        n = len(self)
        pos = [check_int("position", p, 0) for p in positions]
        for p in pos:
            if p >= n:
                raise ValueError(f"position {p} is past the epoch's end: {self!r}")
        if not pos:
            return []
        at = np.array(pos, np.int64)
        files = self.order(epoch, seed=seed, shuffle=shuffle)[at // self.per_file]
        lo, hi = self._start_ranges()
        starts = uniform_starts(seed, epoch, at, lo[files], hi[files]).tolist()
        shape = self.patch_shape
        return [Patch(f, tuple(s), tuple(a + b for a, b in zip(s, shape))) for f, s in zip(files.tolist(), starts)]

    def _start_ranges(self) -> tuple[np.ndarray, np.ndarray]:
        """Each file's smallest and largest start per axis (:func:`~npydask.plan.patches.start_range`), made once."""
        ranges = self._ranges
        if ranges is None:
            extents = np.array(self.extents, np.int64).reshape(self.n_files, len(self.patch_shape))
            patch = np.array(self.patch_shape, np.int64)
            fits = extents >= patch
            if not fits.all():  # (only under "pad": "inside" refused these files when bound)
                for e, p in zip(*np.nonzero(~fits)):
                    start_range(int(extents[e, p]), int(patch[p]), self.policy)  # (raises what it refuses)
            ranges = self._ranges = (np.where(fits, 0, extents - patch), np.where(fits, extents - patch, 0))
        return ranges
