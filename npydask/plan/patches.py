"""Pure patch planning: which box of which file each sample of an epoch reads.

Everything here maps numbers to numbers (no files, no dask), so the samplers
of :mod:`npydask.samplers` are tested without data:

* **Boxes.** A :class:`Patch` is a file index and a box ``[start, stop)``
  over the file's trailing *patch axes* (leading axes, such as channels, are
  kept whole). A box may hang over the edge of the file (a negative start, a
  stop beyond the extent) only under a padding policy; the reader fills
  what lies outside with the sampler's ``fill_value``.
* **Draws.** Every random choice for global position ``p`` of ``epoch``
  depends only on ``(seed, epoch, p)``: a sample's box never depends on the
  number of shards, workers or the batch size, nor on which samples were
  drawn before it. Uniform boxes come from :func:`draw_words`, a
  counter-based hash computed for a whole batch at once
  (:func:`uniform_starts`); samplers that make several dependent choices
  per sample (foreground oversampling) use a generator per position,
  :func:`draw_rng`.
* **Order.** An epoch of ``per_file`` patches per file has
  ``per_file * n_files`` samples in *units*: the ``per_file`` patches of one
  file are adjacent (so one file's patches are read together). With
  ``shuffle`` the units are permuted by a generator seeded only with
  ``(seed, epoch)`` (:func:`unit_order`); position ``p`` is patch ``k`` of
  unit ``p // per_file`` (:func:`position_file`).
* **Placement.** :func:`uniform_start` draws a box inside the file (or, with
  ``"pad"``, over a file smaller than the patch), :func:`shift_inside` moves
  a box centred on a voxel inside the file (MONAI's
  ``correct_crop_centers``), :func:`grid_starts` lays out sliding-window
  tiles (MONAI's ``dense_patch_slices``).

Examples
--------
Three files, two patches each, shuffled: each unit's two positions name the
same file, and the draws repeat exactly:

>>> order = unit_order(3, 2, seed=7, epoch=0, shuffle=True)
>>> [position_file(order, 2, p).file for p in range(6)] == [int(f) for f in order for _ in range(2)]
True
>>> lo, hi = np.zeros((2, 2), np.int64), np.array([[68, 48], [68, 48]])
>>> a = uniform_starts(7, 0, [4, 5], lo, hi)
>>> a.tolist() == uniform_starts(7, 0, [5, 4], lo, hi)[::-1].tolist()
True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from npydask.errors import RoiError
from npydask.plan.sampling import DEFAULT_SEED, check_int, epoch_order

__all__ = [
    "POLICIES",
    "Patch",
    "Slot",
    "axis_starts",
    "draw_rng",
    "draw_words",
    "grid_starts",
    "grid_step",
    "patch_index",
    "position_file",
    "shift_inside",
    "start_range",
    "uniform_start",
    "uniform_starts",
    "unit_order",
]

POLICIES = ("inside", "pad")
"""Where a box may lie: ``"inside"`` the file, or hanging over its edge (``"pad"``, filled)."""

# The spawn key that keeps the per-position draws apart from every other generator seeded with
# (seed, epoch, ...): without it, position 0's generator would be epoch_order's (numpy's SeedSequence
# pads short entropy with zeros, so [seed, epoch] and [seed, epoch, 0] are one seed).
_DRAWS = 0x9A7C4


@dataclass(frozen=True)
class Patch:
    """One sample's box: file ``file``, voxels ``[start, stop)`` over the trailing patch axes.

    ``start`` may be negative and ``stop`` beyond the file's extent only for
    a padding policy (the part outside the file is filled). Leading axes of
    the file (channels) are not part of the box: they are read whole.

    Examples
    --------
    >>> p = Patch(3, (-2, 0), (6, 4))
    >>> p.shape, p.file
    ((8, 4), 3)
    """

    file: int
    start: tuple[int, ...]
    stop: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.start) != len(self.stop):
            raise ValueError(f"a Patch's start {self.start} and stop {self.stop} must have as many axes")
        if any(b <= a for a, b in zip(self.start, self.stop)):
            raise ValueError(
                f"a Patch must hold at least one voxel per axis, found start {self.start} stop {self.stop}"
            )

    @property
    def shape(self) -> tuple[int, ...]:
        """The box's size per patch axis (``stop - start``)."""
        return tuple(b - a for a, b in zip(self.start, self.stop))


class Slot(NamedTuple):
    """Where a global position falls: the file it reads and its number ``k`` among that file's patches."""

    file: int
    k: int


def draw_rng(seed: int, epoch: int, position: int) -> np.random.Generator:
    """The generator of every random choice for global position ``position`` of ``epoch``.

    ``np.random.default_rng(np.random.SeedSequence([seed, epoch, position], spawn_key=...))``:
    one independent stream per position, so a sample's box depends only on
    ``(seed, epoch, position)``, never on sharding, workers, batch size or
    the order in which positions are drawn.

    Raises
    ------
    TypeError, ValueError
        A value that is not a non-negative integer.

    Examples
    --------
    >>> int(draw_rng(0, 1, 5).integers(1000)) == int(draw_rng(0, 1, 5).integers(1000))
    True
    >>> int(draw_rng(0, 1, 5).integers(10**9)) == int(draw_rng(0, 1, 6).integers(10**9))
    False
    """
    seed = check_int("seed", seed, 0)
    epoch = check_int("epoch", epoch, 0)
    position = check_int("position", position, 0)
    return np.random.default_rng(np.random.SeedSequence([seed, epoch, position], spawn_key=(_DRAWS,)))


_U64 = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)
_UNIT = 2.0**-53


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, element by element on a ``uint64`` array (wrapping arithmetic)."""
    z = (z ^ (z >> _S30)) * _MIX1
    z = (z ^ (z >> _S27)) * _MIX2
    out: np.ndarray = z ^ (z >> _S31)
    return out


def draw_words(seed: int, epoch: int, positions: Sequence[int] | np.ndarray, n: int) -> np.ndarray:
    """``n`` random 64-bit words for each of ``positions`` of ``epoch``: a ``(len(positions), n)`` ``uint64`` array.

    Word ``j`` of position ``p`` is a counter-based hash of ``(seed, epoch,
    p, j)``: SplitMix64's finaliser (the mixer numpy's ``SeedSequence`` and
    Java's ``SplittableRandom`` build on) applied in a chain, so a word
    depends only on those four numbers. A batch's words take a few numpy
    operations, whatever its size, where seeding a generator per position
    costs more than the draws themselves. ``seed`` is taken modulo ``2**64``.

    Raises
    ------
    TypeError, ValueError
        A value that is not a non-negative integer.

    Examples
    --------
    >>> w = draw_words(0, 1, [5, 6], 3)
    >>> w.shape, w.dtype.name, bool((w[1] == draw_words(0, 1, [6], 3)[0]).all())
    ((2, 3), 'uint64', True)
    >>> bool((w[0] != w[1]).all()), bool((draw_words(1, 1, [5], 3) != w[0]).all())
    (True, True)
    """
    seed = check_int("seed", seed, 0)
    epoch = check_int("epoch", epoch, 0)
    n = check_int("n", n, 0)
    pos = np.asarray(positions)
    if pos.ndim != 1 or (pos.size and (pos.dtype.kind not in "iu" or int(pos.min()) < 0)):
        pos = np.array([check_int("position", p, 0) for p in np.ravel(np.asarray(positions, dtype=object))])
    key = _mix(np.array([seed & _U64], np.uint64) ^ np.uint64(_DRAWS))
    key = _mix(key ^ np.array([epoch & _U64], np.uint64) + _GOLDEN)
    per_position = _mix(key ^ (pos.astype(np.uint64) + _GOLDEN))
    words = per_position[:, None] + _GOLDEN * np.arange(1, n + 1, dtype=np.uint64)
    return _mix(words)


def uniform_starts(
    seed: int, epoch: int, positions: Sequence[int] | np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    """Boxes' starts drawn uniformly in ``[lo, hi]`` per position and axis, from :func:`draw_words`.

    ``lo`` and ``hi`` are ``(len(positions), ndim)`` integer arrays (each
    position's :func:`start_range` per axis); the start along an axis is
    ``lo + floor(u * (hi - lo + 1))`` for ``u`` the word's top 53 bits as a
    fraction of one (every start equally likely, to within ``2**-53``).

    Raises
    ------
    ValueError
        ``lo`` and ``hi`` of another shape, or ``hi < lo``.

    Examples
    --------
    >>> s = uniform_starts(0, 0, range(1000), np.zeros((1000, 1), np.int64), np.full((1000, 1), 9))
    >>> int(s.min()), int(s.max()), len(np.unique(s))
    (0, 9, 10)
    """
    lo = np.asarray(lo, np.int64)
    hi = np.asarray(hi, np.int64)
    words = draw_words(seed, epoch, positions, lo.shape[-1] if lo.ndim == 2 else 0)
    if lo.shape != hi.shape or lo.shape != words.shape:
        raise ValueError(f"lo {lo.shape} and hi {hi.shape} must both be (positions, axes) = {words.shape[:1]} x axes")
    count = hi - lo + 1
    if count.size and int(count.min()) < 1:
        raise ValueError("every hi must be at least its lo")
    offset = ((words >> _S11).astype(np.float64) * _UNIT * count).astype(np.int64)
    starts: np.ndarray = lo + np.minimum(offset, count - 1)
    return starts


def unit_order(n_files: int, per_file: int, seed: int | None, epoch: int, shuffle: bool) -> np.ndarray:
    """The file index of each unit of ``epoch``, in the order the epoch visits them.

    A unit is the ``per_file`` patches of one file, so there are ``n_files``
    units; without ``shuffle`` they follow the files' order, with it they are
    permuted by a generator seeded only with ``(seed, epoch)`` (the Loader's
    :func:`~npydask.plan.sampling.epoch_order`; ``seed=None`` is
    :data:`~npydask.plan.sampling.DEFAULT_SEED`). ``per_file`` is checked but
    does not change the order.

    Examples
    --------
    >>> unit_order(4, 2, seed=0, epoch=0, shuffle=False).tolist()
    [0, 1, 2, 3]
    >>> sorted(unit_order(4, 2, seed=0, epoch=3, shuffle=True).tolist())
    [0, 1, 2, 3]
    """
    check_int("per_file", per_file, 1)
    return epoch_order(n_files, epoch, shuffle=bool(shuffle), seed=DEFAULT_SEED if seed is None else seed)


def position_file(order: np.ndarray, per_file: int, position: int) -> Slot:
    """Global position ``position`` as ``(file, k)``: patch ``k`` of unit ``position // per_file``.

    ``order`` is :func:`unit_order`'s; an epoch has ``per_file * len(order)``
    positions.

    Raises
    ------
    ValueError
        ``position`` is negative or past the epoch's end.

    Examples
    --------
    >>> position_file(np.array([2, 0, 1]), 4, 5)
    Slot(file=0, k=1)
    """
    per_file = check_int("per_file", per_file, 1)
    position = check_int("position", position, 0)
    total = per_file * len(order)
    if position >= total:
        raise ValueError(
            f"position {position} is past the epoch's end: it has {total} samples "
            f"({per_file} per file x {len(order)} files)"
        )
    unit, k = divmod(position, per_file)
    return Slot(int(order[unit]), k)


def start_range(extent: int, patch: int, policy: str) -> tuple[int, int]:
    """The smallest and largest start of a box of ``patch`` voxels along an axis of ``extent``.

    ``"inside"``: ``[0, extent - patch]`` (``extent < patch`` raises
    :class:`~npydask.errors.RoiError`, a ``ValueError``; samplers check
    every file when bound, and their message names the file). ``"pad"``: the
    same where the patch fits; along an axis shorter than the patch, the
    box covers the whole axis and hangs over one or both ends,
    ``[extent - patch, 0]``, as DALI's ``fn.crop`` places a crop larger than its
    input (``crop_pos`` in ``[0, 1]``, ``out_of_bounds_policy="pad"``) and as
    MONAI pads (``SpatialPadd``) before cropping.

    Examples
    --------
    >>> start_range(10, 4, "inside"), start_range(3, 5, "pad")
    ((0, 6), (-2, 0))
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, found {policy!r}")
    if extent < 1:
        raise RoiError(f"an axis of extent {extent} holds no voxel for a patch to cover")
    if extent >= patch:
        return 0, extent - patch
    if policy == "inside":
        raise RoiError(f"a patch of {patch} voxels does not fit inside an axis of {extent} with policy='inside'")
    return extent - patch, 0


def uniform_start(
    rng: np.random.Generator, extent: Sequence[int], patch: Sequence[int], policy: str
) -> tuple[int, ...]:
    """A box's start drawn uniformly per axis over :func:`start_range`.

    With ``"inside"`` every box lies in the file; with ``"pad"`` a box hangs
    over the edge only along axes shorter than the patch, where it covers the
    whole axis (the file lies inside the box at a uniformly drawn offset).
    Every box overlaps the file.

    Examples
    --------
    >>> rng = draw_rng(0, 0, 0)
    >>> all(0 <= s <= 90 for s in uniform_start(rng, (100, 100), (10, 10), "inside"))
    True
    >>> s = uniform_start(rng, (3, 100), (5, 10), "pad")
    >>> -2 <= s[0] <= 0 <= s[1] <= 90
    True
    """
    if len(extent) != len(patch):
        raise ValueError(f"extent {tuple(extent)} and patch {tuple(patch)} must have as many axes")
    bounds = [start_range(e, p, policy) for e, p in zip(extent, patch)]
    return tuple(int(rng.integers(lo, hi + 1)) for lo, hi in bounds)


def shift_inside(center: Sequence[int], extent: Sequence[int], patch: Sequence[int]) -> tuple[int, ...]:
    """The start of a box of ``patch`` containing voxel ``center``, shifted to lie inside the file.

    Per axis the box starts at ``center - patch // 2`` (so ``center`` is at
    the box's middle, MONAI's ``SpatialCrop(roi_center=...)``), moved the
    least needed to lie in ``[0, extent)`` (MONAI's ``correct_crop_centers``):
    ``center`` stays inside the box, not always at its middle. Along an axis
    shorter than the patch the box covers the whole axis
    (:func:`start_range` with ``"pad"``).

    Raises
    ------
    ValueError
        ``center`` lies outside the file, or the lengths differ.

    Examples
    --------
    >>> shift_inside((50, 2, 97), (100, 100, 100), (10, 10, 10))
    (45, 0, 90)
    >>> shift_inside((1,), (3,), (6,))
    (-2,)
    """
    if not len(center) == len(extent) == len(patch):
        raise ValueError(
            f"center {tuple(center)}, extent {tuple(extent)} and patch {tuple(patch)} must have as many axes"
        )
    out = []
    for c, e, p in zip(center, extent, patch):
        if not 0 <= c < e:
            raise ValueError(f"center {tuple(center)} lies outside the file's extent {tuple(extent)}")
        lo, hi = start_range(e, p, "pad")
        out.append(int(min(max(c - p // 2, lo), hi)))
    return tuple(out)


def grid_step(
    patch: Sequence[int], overlap: float | Sequence[float] = 0.25, overlap_voxels: int | Sequence[int] | None = None
) -> tuple[int, ...]:
    """The step between sliding-window tiles per axis.

    ``max(1, int(patch * (1 - overlap)))`` (MONAI's ``sliding_window_inference``),
    or ``patch - overlap_voxels`` when ``overlap_voxels`` is given (it
    replaces ``overlap``). Each may be one value for every axis or one per
    axis.

    Raises
    ------
    TypeError
        A value of the wrong type.
    ValueError
        ``overlap`` outside ``[0, 1)``, ``overlap_voxels`` outside
        ``[0, patch)``, or a per-axis list of the wrong length.

    Examples
    --------
    >>> grid_step((128, 128, 128), 0.25), grid_step((4, 3), overlap_voxels=(1, 2)), grid_step((1,), 0.5)
    ((96, 96, 96), (3, 1), (1,))
    """
    patch = tuple(check_int("patch_shape", p, 1) for p in patch)
    if overlap_voxels is not None:
        voxels = _per_axis("overlap_voxels", overlap_voxels, len(patch))
        steps = []
        for p, v in zip(patch, voxels):
            v = check_int("overlap_voxels", v, 0)
            if v >= p:
                raise ValueError(
                    f"overlap_voxels must be below the patch along each axis, found {v} for a patch of {p}"
                )
            steps.append(p - v)
        return tuple(steps)
    fractions = _per_axis("overlap", overlap, len(patch))
    steps = []
    for p, f in zip(patch, fractions):
        if isinstance(f, bool) or not isinstance(f, (int, float, np.integer, np.floating)):
            raise TypeError(f"overlap must be a number in [0, 1), found {f!r}")
        if not 0 <= f < 1:
            raise ValueError(f"overlap must be in [0, 1), found {f!r}")
        steps.append(max(1, int(p * (1 - float(f)))))
    return tuple(steps)


def _per_axis(name: str, value: object, ndim: int) -> list[object]:
    """``value`` as one entry per axis: a scalar repeated, or a sequence of ``ndim`` entries."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be a number or one number per patch axis, found {value!r}")
    if isinstance(value, Sequence) or isinstance(value, np.ndarray):
        items = list(value)
        if len(items) != ndim:
            raise ValueError(f"{name} must have one entry per patch axis ({ndim}), found {value!r}")
        return items
    return [value] * ndim


def axis_starts(extent: int, patch: int, step: int) -> list[int]:
    """The tile starts along one axis: ``0, step, 2*step, ...``, the last shifted back to end at ``extent``.

    MONAI's ``dense_patch_slices``: as many tiles as it takes for one to
    reach the end. An axis shorter than the patch has one tile, centred
    over the axis as MONAI's ``sliding_window_inference`` pads it (``(patch -
    extent) // 2`` before, the rest after), so its start is negative.

    Examples
    --------
    >>> axis_starts(512, 128, 96), axis_starts(10, 4, 4), axis_starts(3, 6, 1)
    ([0, 96, 192, 288, 384], [0, 4, 6], [-1])
    """
    extent = check_int("extent", extent, 1)
    patch = check_int("patch", patch, 1)
    step = check_int("step", step, 1)
    if step > patch:
        raise ValueError(f"a step of {step} is longer than the patch ({patch}): tiles would leave voxels uncovered")
    if extent <= patch:
        return [-((patch - extent) // 2)]
    count = math.ceil((extent - patch) / step) + 1
    return [min(i * step, extent - patch) for i in range(count)]


def grid_starts(extent: Sequence[int], patch: Sequence[int], step: Sequence[int]) -> list[tuple[int, ...]]:
    """Every tile's start over a file of ``extent``, in raster order (last axis fastest).

    Per axis :func:`axis_starts`; the tiles are their product. Every voxel is
    covered and the last tile along each axis ends at the extent.

    Examples
    --------
    >>> grid_starts((10, 6), (4, 6), (4, 3))
    [(0, 0), (4, 0), (6, 0)]
    >>> len(grid_starts((512, 512, 512), (128, 128, 128), (96, 96, 96)))
    125
    """
    if not len(extent) == len(patch) == len(step):
        raise ValueError(f"extent {tuple(extent)}, patch {tuple(patch)} and step {tuple(step)} must have as many axes")
    axes = [axis_starts(e, p, s) for e, p, s in zip(extent, patch, step)]
    grids = np.meshgrid(*[np.asarray(a, np.int64) for a in axes], indexing="ij")
    flat = np.stack([g.reshape(-1) for g in grids], axis=1) if axes else np.zeros((1, 0), np.int64)
    return [tuple(int(v) for v in row) for row in flat]


def patch_index(patches: Sequence[Patch]) -> dict[str, np.ndarray]:
    """A batch's boxes as arrays: ``"file"`` (int64, B), ``"start"`` and ``"stop"`` (int64, B x patch ndim).

    The ``index`` the Loader yields with ``with_index=True``.

    Examples
    --------
    >>> ix = patch_index([Patch(0, (0, 1), (2, 3)), Patch(4, (5, 6), (7, 8))])
    >>> ix["file"].tolist(), ix["start"].tolist(), ix["stop"].shape
    ([0, 4], [[0, 1], [5, 6]], (2, 2))
    """
    ndim = len(patches[0].start) if patches else 0
    return {
        "file": np.array([p.file for p in patches], np.int64),
        "start": np.array([p.start for p in patches], np.int64).reshape(len(patches), ndim),
        "stop": np.array([p.stop for p in patches], np.int64).reshape(len(patches), ndim),
    }
