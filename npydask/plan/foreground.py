"""Foreground candidates of a label array, and the draws centred on them (pure: arrays in, numbers out).

The :class:`~npydask.samplers.Foreground` sampler centres a fraction ``p`` of
its patches on labelled voxels. This module holds what that takes, without
files:

* **Candidates.** :class:`CandidateBuilder` takes a label array slab by slab
  (planes of the first patch axis, leading axes such as channels whole) and
  keeps, per class, up to ``limit`` voxel positions as flat ``int64``
  indices into the patch axes' extent. A voxel belongs to class ``c`` when
  its label value (any of them, where the label has leading axes) equals
  ``c``; by default the classes are every non-zero value found (NaN is no
  class). Where a class has more voxels than ``limit``, the ones kept are a
  uniform sample without replacement: each position gets a pseudo-random
  priority from a fixed hash of the position and ``seed``, and the ``limit``
  lowest priorities stay. The sample therefore depends only on the label,
  ``limit`` and ``seed``, never on the slab size or on the machine.
* **Memory.** The caller decides the slab (:func:`slab_planes` picks the
  planes for about :data:`SLAB_VOXELS` voxels, at least one plane); besides
  the slab, adding one holds a boolean mask of it and, for its labelled
  voxels only, up to about 64 bytes each (positions, values, priorities and their
  sort order), plus the kept ``limit`` positions and priorities per class.
  A 512^3 ``uint8`` label is never held whole.
* **A draw** (:func:`draw`): with probability ``p`` a class is chosen
  (uniformly among the classes present in the file, or by ``ratios``: classes
  absent from the file drop out and the others' ratios are renormalised),
  then one of its candidates, and the box is shifted to lie inside the
  volume while containing it (MONAI's ``correct_crop_centers``). Otherwise,
  or when the file has no candidate at all (MONAI falls back the same way
  when a label has no foreground), the box is drawn uniformly inside.

Examples
--------
>>> label = np.zeros((4, 5), np.uint8); label[1, 2] = 3; label[3, 0] = 1
>>> b = CandidateBuilder(label.shape, 2)
>>> for first in range(0, 4, 2):
...     b.add(label[first:first + 2], first)
>>> c = b.result()
>>> c.classes, [p.tolist() for p in c.positions], c.counts
((1, 3), [[15], [7]], (1, 1))
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from npydask.plan.patches import shift_inside, uniform_start

__all__ = [
    "SLAB_VOXELS",
    "CandidateBuilder",
    "Candidates",
    "ForegroundDraw",
    "choose_class",
    "draw",
    "normalized_ratios",
    "slab_planes",
]

SLAB_VOXELS = 1 << 21
"""How many label voxels :func:`slab_planes` aims a slab at (2 Mi: eight planes of 512 x 512)."""

Scalar = bool | int | float
"""A class value: a label value as a Python scalar."""


@dataclass(frozen=True, eq=False)
class Candidates:
    """The candidate voxels of one label file, per class.

    Attributes
    ----------
    extent : tuple of int
        The label's shape over the patch axes (its trailing axes).
    classes : tuple
        The class values, as Python scalars: the ones asked for (in their
        order, present or not), or every non-zero value found (ascending).
    positions : tuple of numpy.ndarray
        Per class, up to ``limit`` flat ``int64`` indices into ``extent``,
        ascending.
    counts : tuple of int
        Per class, how many voxels of it the file has (before the bound).
    """

    extent: tuple[int, ...]
    classes: tuple[Scalar, ...]
    positions: tuple[np.ndarray, ...]
    counts: tuple[int, ...]

    @property
    def present(self) -> tuple[bool, ...]:
        """Per class, whether the file has any voxel of it."""
        return tuple(len(p) > 0 for p in self.positions)

    def coordinates(self, label: int) -> np.ndarray:
        """The candidates of class number ``label`` as an ``(n, ndim)`` ``int64`` array of coordinates."""
        return np.stack(np.unravel_index(self.positions[label], self.extent), axis=-1).astype(np.int64)


@dataclass(frozen=True)
class ForegroundDraw:
    """One planned box: its ``start`` over the patch axes and what it is centred on.

    Attributes
    ----------
    start : tuple of int
        The box's first voxel over the patch axes.
    class_index : int or None
        The number of the class whose voxel the box contains, counted in
        :attr:`Candidates.classes` (the ``classes=`` given, or the non-zero
        values found, ascending); ``None`` for a uniform draw.
    center : tuple of int or None
        That voxel (inside the box, not always at its centre).
    class_value : bool, int, float or None
        The label value of that class (``Candidates.classes[class_index]``),
        the value a MONAI user calls the label; ``None`` for a uniform draw.

    ``label`` is a deprecated name of ``class_index`` (a class's number,
    not its label value).
    """

    start: tuple[int, ...]
    class_index: int | None = None
    center: tuple[int, ...] | None = None
    class_value: Scalar | None = None

    @property
    def label(self) -> int | None:
        """Deprecated: ``class_index`` (the class's number); ``class_value`` is its label value."""
        warnings.warn(
            "ForegroundDraw.label is deprecated: it is the class's number (now class_index), not its label value "
            "(class_value)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.class_index


def slab_planes(shape: Sequence[int], patch_ndim: int, voxels: int = SLAB_VOXELS) -> int:
    """Planes of the first patch axis per slab, for about ``voxels`` label voxels a slab (at least one plane).

    ``shape`` is the label's whole shape; axes before the last ``patch_ndim``
    are kept whole in every slab.

    Examples
    --------
    >>> slab_planes((512, 512, 512), 3)
    8
    >>> slab_planes((2, 10, 4000, 4000), 3)
    1
    """
    lead = len(shape) - patch_ndim
    plane = math.prod(shape[:lead]) * math.prod(shape[lead + 1 :])
    return max(1, min(shape[lead], voxels // max(plane, 1)))


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _priorities(positions: np.ndarray, seed: int) -> np.ndarray:
    """splitmix64 of ``positions + seed * golden``: one fixed, well-mixed ``uint64`` per position (a bijection)."""
    with np.errstate(over="ignore"):
        z = positions.astype(np.uint64) + np.uint64(seed & 0xFFFFFFFFFFFFFFFF) * _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


class CandidateBuilder:
    """Collects the candidates of one label array from its slabs, in order (see the module docstring).

    Parameters
    ----------
    shape : sequence of int
        The label's whole shape.
    patch_ndim : int
        How many trailing axes the patches cover (the label's extent).
    classes : sequence of scalars, optional
        The classes to collect; every non-zero value by default.
    limit : int
        The most positions kept per class.
    seed : int
        Picks the sample where a class has more voxels than ``limit``.

    Raises
    ------
    ValueError
        A ``patch_ndim`` the shape has no room for, ``limit`` below 1, or
        duplicate ``classes``.
    """

    def __init__(
        self,
        shape: Sequence[int],
        patch_ndim: int,
        *,
        classes: Sequence[Scalar] | None = None,
        limit: int = 10_000,
        seed: int = 0,
    ) -> None:
        shape = tuple(int(n) for n in shape)
        if not 1 <= patch_ndim <= len(shape):
            raise ValueError(f"a label of shape {shape} has no {patch_ndim} trailing patch axes")
        if limit < 1:
            raise ValueError(f"candidates must be at least 1, found {limit}")
        self.shape = shape
        self.lead = len(shape) - patch_ndim
        self.extent = shape[self.lead :]
        self.limit = int(limit)
        self.seed = int(seed)
        self.classes = None if classes is None else tuple(classes)
        if self.classes is not None and len(set(self.classes)) != len(self.classes):
            raise ValueError(f"classes must be distinct, found {list(self.classes)!r}")
        self._kept: dict[Scalar, tuple[np.ndarray, np.ndarray]] = {}
        self._counts: dict[Scalar, int] = {}
        self._next = 0

    def add(self, slab: np.ndarray, first: int) -> None:
        """Take ``slab``: the label's planes ``first, first + 1, ...`` of the first patch axis, the other axes whole.

        Raises
        ------
        ValueError
            If the slab does not continue where the last one stopped, or its shape is not the label's.
        """
        lead, extent = self.lead, self.extent
        if first != self._next:
            raise ValueError(f"expected the slab starting at plane {self._next}, found one starting at {first}")
        depth = slab.shape[lead] if slab.ndim == len(self.shape) else -1
        expected = self.shape[:lead] + (depth,) + extent[1:]
        if slab.shape != expected or first + depth > extent[0]:
            raise ValueError(
                f"expected a slab of shape {self.shape[:lead] + ('k',) + extent[1:]} within the label's "
                f"{extent[0]} planes, found shape {slab.shape} at plane {first}"
            )
        self._next = first + depth
        rows = slab.reshape(math.prod(self.shape[:lead]), -1)
        if self.classes is None:
            mask = rows != 0
            if rows.dtype.kind in "fc":
                mask &= ~np.isnan(rows)
        else:
            mask = np.isin(rows, np.asarray(self.classes))
        which, pos = np.nonzero(mask)
        del mask
        values = rows[which, pos]
        if lead and len(pos):  # one entry per (voxel, value), however many leading elements share it
            order = np.lexsort((values, pos))
            pos, values = pos[order], values[order]
            keep = np.ones(len(pos), bool)
            keep[1:] = (pos[1:] != pos[:-1]) | (values[1:] != values[:-1])
            pos, values = pos[keep], values[keep]
        pos = pos.astype(np.int64) + first * math.prod(extent[1:])
        order = np.argsort(values, kind="stable")
        found, starts = np.unique(values[order], return_index=True)
        ends = [*starts[1:].tolist(), len(order)]
        for value, a, b in zip(found.tolist(), starts.tolist(), ends):
            self._merge(value, pos[order[a:b]])

    def _merge(self, value: Scalar, pos: np.ndarray) -> None:
        self._counts[value] = self._counts.get(value, 0) + len(pos)
        prio = _priorities(pos, self.seed)
        old = self._kept.get(value)
        if old is not None:
            pos, prio = np.concatenate([old[0], pos]), np.concatenate([old[1], prio])
        if len(pos) > self.limit:
            keep = np.argpartition(prio, self.limit - 1)[: self.limit]
            pos, prio = pos[keep], prio[keep]
        self._kept[value] = (pos, prio)

    def result(self) -> Candidates:
        """The candidates, once every plane has been added.

        Raises
        ------
        ValueError
            If planes are missing.
        """
        if self._next != self.extent[0]:
            raise ValueError(f"expected all {self.extent[0]} planes of the label, found {self._next}")
        empty = np.empty(0, np.int64)
        classes = tuple(sorted(self._kept)) if self.classes is None else self.classes
        positions = tuple(np.sort(self._kept[c][0]) if c in self._kept else empty for c in classes)
        counts = tuple(self._counts.get(c, 0) for c in classes)
        return Candidates(self.extent, tuple(_scalar(c) for c in classes), positions, counts)


def _scalar(value: object) -> Scalar:
    item = value.item() if isinstance(value, np.generic) else value
    if not isinstance(item, (bool, int, float)):
        raise TypeError(f"a class must be a real number, found {value!r}")
    return item


def normalized_ratios(ratios: Sequence[float], n_classes: int) -> tuple[float, ...]:
    """``ratios`` checked against ``n_classes`` (finite, not negative, not all zero) and divided by their sum.

    Raises
    ------
    ValueError
        On a length that is not ``n_classes`` or an unusable value.

    Examples
    --------
    >>> normalized_ratios([1, 3], 2)
    (0.25, 0.75)
    """
    values = [float(r) for r in ratios]
    if len(values) != n_classes:
        raise ValueError(f"ratios must give one value per class ({n_classes}), found {len(values)}: {list(ratios)!r}")
    if not all(math.isfinite(r) and r >= 0 for r in values) or not sum(values) > 0:
        raise ValueError(f"ratios must be finite, not negative and not all zero, found {list(ratios)!r}")
    total = sum(values)
    return tuple(r / total for r in values)


def choose_class(
    rng: np.random.Generator, present: Sequence[bool], ratios: Sequence[float] | None = None
) -> int | None:
    """A class number among the ``present`` ones: uniformly, or by ``ratios`` renormalised over them.

    ``None`` when no class is present, or every present class has ratio 0.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> choose_class(rng, [False, True, False]), choose_class(rng, [False, False])
    (1, None)
    """
    idx = [i for i, here in enumerate(present) if here]
    if ratios is not None:
        idx = [i for i in idx if ratios[i] > 0]
    if not idx:
        return None
    if ratios is None or len(idx) == 1:
        return idx[int(rng.integers(len(idx)))]
    weights = np.array([ratios[i] for i in idx], np.float64)
    return idx[int(rng.choice(len(idx), p=weights / weights.sum()))]


def draw(
    rng: np.random.Generator,
    candidates: Candidates,
    patch: Sequence[int],
    *,
    p: float,
    ratios: Sequence[float] | None = None,
) -> ForegroundDraw:
    """One box inside the volume: centred on a candidate with probability ``p``, else uniform.

    The generator is used in a fixed order (one uniform number, then the
    class, then the candidate, or the uniform start), so a draw is a
    function of the generator's seed.

    Examples
    --------
    >>> label = np.zeros((10, 10), np.uint8); label[7, 8] = 1
    >>> b = CandidateBuilder(label.shape, 2); b.add(label, 0)
    >>> d = draw(np.random.default_rng(0), b.result(), (4, 4), p=1.0)
    >>> d.class_index, d.class_value, d.center, d.start
    (0, 1, (7, 8), (5, 6))
    """
    extent, patch = candidates.extent, tuple(patch)
    if rng.random() < p:
        chosen = choose_class(rng, candidates.present, ratios)
        if chosen is not None:
            positions = candidates.positions[chosen]
            flat = int(positions[int(rng.integers(len(positions)))])
            center = tuple(int(i) for i in np.unravel_index(flat, extent))
            return ForegroundDraw(shift_inside(center, extent, patch), chosen, center, candidates.classes[chosen])
    return ForegroundDraw(uniform_start(rng, extent, patch, "inside"))
