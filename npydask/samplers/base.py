"""What every patch sampler shares: the :class:`Sampler` value object and its :class:`BoundSampler`.

A sampler is a small immutable description (``Uniform((64, 64, 64),
per_file=4)``): equal parameters make equal, equally hashed samplers with
the same :meth:`~Sampler.fingerprint`, which a loader's state records. It
knows nothing of files until :meth:`Sampler.bind` checks it against a dataset
(from headers only: no payload is read) and returns a :class:`BoundSampler`,
which gives the :class:`~npydask.plan.patches.Patch` of any global position
of any epoch, deterministically.
"""

from __future__ import annotations

import abc
import hashlib
import numbers
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from npydask.dataset.multikey import MultiKeyDataset
from npydask.dataset.npy_dataset import NpyDataset
from npydask.dataset.zipped import ZippedDataset
from npydask.errors import RoiError, warn
from npydask.plan.patches import POLICIES, Patch, draw_rng, position_file, unit_order
from npydask.plan.sampling import DEFAULT_SEED, check_int

__all__ = [
    "BoundSampler",
    "Draw",
    "Sampler",
    "UnitBound",
    "check_fill_value",
    "check_patch_shape",
    "check_policy",
    "dataset_members",
    "patch_extents",
    "warn_if_leading_axes_look_spatial",
]


def check_patch_shape(value: object) -> tuple[int, ...]:
    """``patch_shape`` as a tuple of positive ints (one per trailing axis it covers).

    Raises
    ------
    TypeError
        Not a tuple or list of integers (a bare int is refused: it would not
        say how many axes the patch has).
    ValueError
        Empty, or an entry below 1.

    Examples
    --------
    >>> check_patch_shape([64, 64])
    (64, 64)
    >>> check_patch_shape(64)
    Traceback (most recent call last):
    ...
    TypeError: patch_shape must be a tuple of ints, one per trailing axis (e.g. (64, 64, 64)), found 64
    """
    if not isinstance(value, (tuple, list)):
        raise TypeError(
            f"patch_shape must be a tuple of ints, one per trailing axis (e.g. (64, 64, 64)), found {value!r}"
        )
    if not value:
        raise ValueError("patch_shape must cover at least one axis, found ()")
    out = []
    for v in value:
        if isinstance(v, bool) or not hasattr(v, "__index__"):
            raise TypeError(f"patch_shape must hold ints, found {v!r} in {tuple(value)!r}")
        if v.__index__() < 1:
            raise ValueError(f"patch_shape must be positive along every axis, found {tuple(value)!r}")
        out.append(v.__index__())
    return tuple(out)


def check_policy(value: object) -> str:
    """``policy`` checked: ``"inside"`` or ``"pad"``.

    Examples
    --------
    >>> check_policy("pad")
    'pad'
    >>> check_policy("reflect")
    Traceback (most recent call last):
    ...
    ValueError: policy must be one of ('inside', 'pad'), found 'reflect'
    """
    if value not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, found {value!r}")
    return str(value)


def check_fill_value(value: object) -> int | float | complex:
    """``fill_value`` checked: a real or complex number (a NumPy scalar becomes a Python one).

    Examples
    --------
    >>> import numpy as np
    >>> check_fill_value(np.float32(0.5)), check_fill_value(-1)
    (0.5, -1)
    >>> check_fill_value(None)
    Traceback (most recent call last):
    ...
    TypeError: fill_value must be a number, found None
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Number):
        raise TypeError(f"fill_value must be a number, found {value!r}")
    item = value.item() if hasattr(value, "item") else value
    if not isinstance(item, (int, float, complex)):  # pragma: no cover - a Number that is none of these
        raise TypeError(f"fill_value must be a number, found {value!r}")
    return item


def dataset_members(dataset: Any) -> dict[str, NpyDataset]:
    """The datasets a sampler reads boxes of, by key (``""`` for a plain :class:`NpyDataset`).

    Raises
    ------
    TypeError
        ``dataset`` is not an ``NpyDataset``, a ``MultiKeyDataset`` or a
        ``ZippedDataset``.

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os
    >>> root = tempfile.mkdtemp(); np.save(os.path.join(root, "a.npy"), np.zeros((4, 4)))
    >>> ds = npydask.open_dataset(root)
    >>> list(dataset_members(ds)), list(dataset_members(npydask.zip_datasets({"x": ds, "y": ds})))
    ([''], ['x', 'y'])
    """
    if isinstance(dataset, NpyDataset):
        return {"": dataset}
    if isinstance(dataset, (MultiKeyDataset, ZippedDataset)):
        return dataset.members
    raise TypeError(
        "a sampler binds to an NpyDataset (open_dataset), a MultiKeyDataset (open_dataset(..., key=[...])) or "
        f"a ZippedDataset (zip_datasets), found {type(dataset).__name__}"
    )


def patch_extents(dataset: Any, patch_shape: Sequence[int], policy: str) -> tuple[tuple[int, ...], ...]:
    """Each file's extent over the patch's trailing axes, checked from the headers (no payload is read).

    Every file needs at least ``len(patch_shape)`` axes, each of at least
    one voxel; the members of a paired dataset must agree over those axes;
    with ``policy="inside"`` every file must hold the patch.

    Raises
    ------
    TypeError
        Not a dataset a sampler takes (:func:`dataset_members`).
    ValueError
        The dataset has no files.
    RoiError
        A file has too few axes, an empty patch axis, members that disagree,
        or (``"inside"``) is smaller than the patch; the message names the
        file, its shape and the patch.

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os
    >>> root = tempfile.mkdtemp()
    >>> for i, n in enumerate((8, 3)): np.save(os.path.join(root, f"{i}.npy"), np.zeros((2, n, 9)))
    >>> patch_extents(npydask.open_dataset(root), (4, 4), "pad")
    ((8, 9), (3, 9))
    >>> patch_extents(npydask.open_dataset(root), (4, 4), "inside")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    npydask.errors.RoiError: file 1 (...1.npy) has shape (2, 3, 9), smaller than the patch (4, 4) (policy='inside'); ...
    """
    members = dataset_members(dataset)
    n = len(dataset)
    if n == 0:
        raise ValueError("a sampler needs a dataset with at least one file, found an empty one")
    nd = len(patch_shape)
    patch = tuple(patch_shape)
    shapes = {k: d.shapes for k, d in members.items()}
    extents = []
    for i in range(n):
        extent: tuple[int, ...] | None = None
        for key, per_file in shapes.items():
            shape = per_file[i]
            if len(shape) < nd:
                raise RoiError(f"{_name(members, key, i)} has shape {shape}: too few axes for a patch of {patch}")
            mine = tuple(shape[len(shape) - nd :])
            if extent is None:
                extent = mine
            elif mine != extent:
                first = next(iter(shapes))
                raise RoiError(
                    f"{_name(members, key, i)} has shape {shape} but {_name(members, first, i)} has "
                    f"{shapes[first][i]}: paired files must agree over the patch's trailing {nd} axes ({patch})"
                )
            if min(mine) < 1 or policy == "inside" and any(e < p for e, p in zip(mine, patch)):
                why = "an empty patch axis" if min(mine) < 1 else "smaller than the patch"
                hint = "" if min(mine) < 1 else "; use policy='pad' to pad it, or a smaller patch"
                raise RoiError(f"{_name(members, key, i)} has shape {shape}, {why} {patch} (policy={policy!r}){hint}")
        assert extent is not None
        extents.append(extent)
    return tuple(extents)


CHANNELS_AT_MOST = 16
"""A leading axis longer than this, and at least as long as the patch's shortest axis, looks spatial."""


def warn_if_leading_axes_look_spatial(dataset: Any, patch_shape: Sequence[int]) -> None:
    """Warn when a patch leaves whole a leading axis that looks spatial rather than like channels.

    A patch covers the files' trailing axes; the leading ones are read whole,
    as channels are. A leading axis *looks spatial* when it is longer than
    :data:`CHANNELS_AT_MOST` (16) and at least as long as the patch's
    shortest axis: ``patch_shape=(64, 64)`` on ``(128, 128, 128)`` volumes
    reads ``(128, 64, 64)`` boxes, most likely meant as ``(64, 64, 64)`` or
    as slices ``(1, 64, 64)``. One :class:`~npydask.errors.NpyDaskWarning`
    names the first such file; channels (``(4, 128, 128, 128)``) pass silently.

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os, warnings
    >>> root = tempfile.mkdtemp(); np.save(os.path.join(root, "a.npy"), np.zeros((40, 32, 32), "u1"))
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     warn_if_leading_axes_look_spatial(npydask.open_dataset(root), (16, 16))
    >>> "each patch is (40, 16, 16)" in str(caught[0].message), "patch_shape=(16, 16, 16)" in str(caught[0].message)
    (True, True)
    """
    patch = tuple(patch_shape)
    for key, member in dataset_members(dataset).items():
        seen = set()
        for i, shape in enumerate(member.shapes):
            if shape in seen:
                continue
            seen.add(shape)
            lead = shape[: len(shape) - len(patch)]
            if lead and lead[-1] > CHANNELS_AT_MOST and lead[-1] >= min(patch):
                box, cube, slices = (*lead, *patch), (min(patch), *patch), (1, *patch)
                warn(
                    f"patch_shape={patch} covers the last {len(patch)} axes of "
                    f"{_name(dataset_members(dataset), key, i)}, shape {shape}; its leading axes {lead} are kept "
                    f"whole, as channels are, so each patch is {box}. For a {len(patch) + 1}-D patch give that axis "
                    f"too (e.g. patch_shape={cube}), or {slices} for slices of it; leading axes of at most "
                    f"{CHANNELS_AT_MOST} (channels) are kept whole without this warning"
                )
                return


def _name(members: dict[str, NpyDataset], key: str, i: int) -> str:
    """File ``i`` of member ``key`` as a message names it."""
    path = members[key].files[i]
    return f"file {i} ({path})" if key == "" else f"file {i} of {key!r} ({path})"


class Sampler(abc.ABC):
    """A patch sampler: which box of which file each sample of an epoch reads.

    An immutable, picklable value: samplers of one class whose parameters
    show alike (``repr``) are equal, hash alike and have the same
    :meth:`fingerprint`.
    :meth:`bind` checks it against a dataset and returns the
    :class:`BoundSampler` that plans the boxes.

    Attributes
    ----------
    patch_shape : tuple of int
        The box's size over the files' trailing axes.
    per_file : int or None
        Patches drawn from each file per epoch (``None`` where the file's
        size decides, as for :class:`~npydask.samplers.Grid`'s tiles).
    policy : str
        ``"inside"`` (boxes lie in the files) or ``"pad"`` (boxes may hang
        over the edge, filled with ``fill_value``).
    fill_value : number
        What the part of a box outside the file holds.

    Examples
    --------
    >>> from npydask.samplers import Grid, Sampler, Uniform
    >>> isinstance(Uniform((8, 8)), Sampler), Uniform((8, 8)) == Uniform([8, 8]), Grid((8, 8)).per_file
    (True, True, None)
    """

    patch_shape: tuple[int, ...]
    per_file: int | None
    policy: str
    fill_value: int | float | complex

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable: cannot set {name!r}; make a new sampler")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable: cannot delete {name!r}")

    def _set(self, **values: Any) -> None:
        """Set the attributes once, in ``__init__``."""
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @abc.abstractmethod
    def params(self) -> dict[str, Any]:
        """The constructor's arguments, by name, in signature order (what ``repr`` shows and equality compares)."""

    def __repr__(self) -> str:
        first, *rest = self.params().items()
        shown = [repr(first[1])] + [f"{k}={v!r}" for k, v in rest]
        return f"{type(self).__name__}({', '.join(shown)})"

    def __eq__(self, other: object) -> bool:
        """Equal when of one class with parameters shown alike (so ``fill_value=0`` and ``0.0`` differ, as their
        fingerprints do, and a NaN fill equals itself)."""
        if type(other) is not type(self):
            return NotImplemented
        return repr(self) == repr(other)

    def __hash__(self) -> int:
        return hash(repr(self))

    def fingerprint(self) -> str:
        """A short hex digest of the class and its parameters, stable across processes and versions of Python.

        Examples
        --------
        >>> from npydask.samplers import Uniform
        >>> Uniform((8, 8)).fingerprint() == Uniform([8, 8], per_file=1).fingerprint()
        True
        >>> Uniform((8, 8)).fingerprint() == Uniform((8, 8), per_file=2).fingerprint()
        False
        """
        return hashlib.blake2b(repr(self).encode(), digest_size=16).hexdigest()

    def bind(self, dataset: Any) -> BoundSampler:
        """This sampler over ``dataset``: checked from the headers, ready to plan boxes.

        Parameters
        ----------
        dataset : NpyDataset, MultiKeyDataset or ZippedDataset
            The files to draw from; the members of a paired dataset are read
            with the same box, so they must agree over the patch axes.

        Raises
        ------
        TypeError
            Not a dataset a sampler takes.
        ValueError
            An empty dataset.
        RoiError
            A file the patch does not fit (see :func:`patch_extents`).
        """
        extents = patch_extents(dataset, self.patch_shape, self.policy)
        warn_if_leading_axes_look_spatial(dataset, self.patch_shape)
        return self._bind(extents, dataset)

    @abc.abstractmethod
    def _bind(self, extents: tuple[tuple[int, ...], ...], dataset: Any) -> BoundSampler:
        """The bound sampler over files of ``extents`` (checked), from ``dataset``."""


class BoundSampler(abc.ABC):
    """A sampler bound to a dataset: the :class:`~npydask.plan.patches.Patch` of every position of an epoch.

    Pure numbers once made (the files' extents over the patch axes), so it
    pickles small and plans the same boxes in every process. ``len(b)`` is
    the number of samples in an epoch; :meth:`patch` gives position
    ``position``'s box, deterministic in ``(seed, epoch, position)``.

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os
    >>> from npydask.samplers import Uniform
    >>> root = tempfile.mkdtemp(); np.save(os.path.join(root, "a.npy"), np.zeros((30, 30)))
    >>> bound = Uniform((10, 10), per_file=3).bind(npydask.open_dataset(root))
    >>> len(bound), bound.n_files, bound.extents, bound.policy
    (3, 1, ((30, 30),), 'inside')
    >>> [p.shape for p in bound.patches(0, range(3), seed=5)]
    [(10, 10), (10, 10), (10, 10)]
    """

    shuffle_ignored: bool = False
    """True where the order is fixed and ``shuffle`` changes nothing (:class:`~npydask.samplers.Grid`)."""

    def __init__(self, sampler: Sampler, extents: tuple[tuple[int, ...], ...]) -> None:
        self.sampler = sampler
        self.extents = extents

    @property
    def patch_shape(self) -> tuple[int, ...]:
        """The sampler's ``patch_shape``."""
        return self.sampler.patch_shape

    @property
    def policy(self) -> str:
        """The sampler's ``policy``: ``"inside"`` or ``"pad"``."""
        return self.sampler.policy

    @property
    def fill_value(self) -> int | float | complex:
        """What the part of a box outside its file holds."""
        return self.sampler.fill_value

    @property
    def n_files(self) -> int:
        """The number of files (samples of the dataset) it draws from."""
        return len(self.extents)

    @abc.abstractmethod
    def __len__(self) -> int:
        """Samples per epoch."""

    @abc.abstractmethod
    def patch(self, epoch: int, position: int, *, seed: int | None = None, shuffle: bool = False) -> Patch:
        """Position ``position``'s box in ``epoch``; ``seed=None`` is :data:`~npydask.plan.sampling.DEFAULT_SEED`.

        Raises
        ------
        TypeError, ValueError
            ``epoch``, ``position`` or ``seed`` not a non-negative integer, or
            ``position`` past the epoch's end (``len(self)``).
        """

    def patches(
        self, epoch: int, positions: Iterable[int], *, seed: int | None = None, shuffle: bool = False
    ) -> list[Patch]:
        """The boxes of several positions of ``epoch`` (a batch), in the order given."""
        return [self.patch(epoch, p, seed=seed, shuffle=shuffle) for p in positions]

    def __repr__(self) -> str:
        return f"{self.sampler!r}.bind({self.n_files} files, {len(self)} samples per epoch)"

    def __getstate__(self) -> dict[str, Any]:
        """What pickles: the sampler and the extents (caches are rebuilt where it is unpickled)."""
        return {"sampler": self.sampler, "extents": self.extents}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["sampler"], state["extents"])  # type: ignore[misc]

    def _position(self, epoch: int, position: int, seed: int | None) -> tuple[int, int, int]:
        """``(epoch, position, seed)`` checked, ``seed=None`` made :data:`DEFAULT_SEED`."""
        epoch = check_int("epoch", epoch, 0)
        position = check_int("position", position, 0)
        seed = DEFAULT_SEED if seed is None else check_int("seed", seed, 0)
        if position >= len(self):
            raise ValueError(f"position {position} is past the epoch's end: {self!r}")
        return epoch, position, seed


class Draw(NamedTuple):
    """A position of a unit-ordered epoch: its file, its number ``k`` among the file's patches, and its generator."""

    file: int
    k: int
    rng: np.random.Generator


class UnitBound(BoundSampler):
    """A bound sampler drawing ``per_file`` patches per file each epoch, a file's patches adjacent (a unit).

    The order and the per-position generators every random sampler shares
    (:func:`~npydask.plan.patches.unit_order`,
    :func:`~npydask.plan.patches.draw_rng`); a subclass says where a draw's
    box lies (:meth:`patch`, from :meth:`locate`).

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os
    >>> from npydask.samplers import Uniform
    >>> root = tempfile.mkdtemp()
    >>> for i in range(4): np.save(os.path.join(root, f"{i}.npy"), np.zeros((9, 9)))
    >>> bound = Uniform((3, 3), per_file=2).bind(npydask.open_dataset(root))
    >>> bound.order(0).tolist(), sorted(bound.order(1, seed=3, shuffle=True).tolist())
    ([0, 1, 2, 3], [0, 1, 2, 3])
    >>> d = bound.locate(1, 5, seed=3, shuffle=True)
    >>> (d.file, d.k) == (int(bound.order(1, seed=3, shuffle=True)[2]), 1)
    True
    """

    def __init__(self, sampler: Sampler, extents: tuple[tuple[int, ...], ...]) -> None:
        super().__init__(sampler, extents)
        if sampler.per_file is None:
            raise ValueError(f"{sampler!r} draws no fixed number of patches per file")
        self.per_file: int = sampler.per_file
        self._orders: dict[tuple[int, int, bool], np.ndarray] = {}

    def __len__(self) -> int:
        return self.per_file * self.n_files

    def order(self, epoch: int, *, seed: int | None = None, shuffle: bool = False) -> np.ndarray:
        """The file of each unit of ``epoch`` (:func:`~npydask.plan.patches.unit_order`), cached for recent epochs."""
        seed = DEFAULT_SEED if seed is None else check_int("seed", seed, 0)
        key = (check_int("epoch", epoch, 0), seed, bool(shuffle))
        order = self._orders.get(key)
        if order is None:
            order = unit_order(self.n_files, self.per_file, seed, epoch, bool(shuffle))
            order.setflags(write=False)
            if len(self._orders) >= 4:  # a few epochs (a loader prefetching across an epoch's end); safe under threads
                self._orders = {}
            self._orders[key] = order
        return order

    def locate(self, epoch: int, position: int, *, seed: int | None = None, shuffle: bool = False) -> Draw:
        """Position ``position`` of ``epoch``: its file, its ``k`` in the unit and its generator (checked values)."""
        epoch, position, seed = self._position(epoch, position, seed)
        slot = position_file(self.order(epoch, seed=seed, shuffle=shuffle), self.per_file, position)
        return Draw(slot.file, slot.k, draw_rng(seed, epoch, position))
