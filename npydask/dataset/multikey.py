"""Samples of several ``.npz`` members: ``open_dataset(..., key=["x", "y"])``.

A :class:`MultiKeyDataset` is one :class:`~npydask.dataset.npy_dataset.NpyDataset` per
member over the same files, in the same order and shard. Each member keeps
its own dtype and shapes; ``ds[i]`` and ``ds.stack()`` give dicts of lazy
arrays, the :class:`~npydask.loader.Loader` and the PyTorch adapters give
dict batches and samples.

Files are opened once for all their members: at open, each archive's zip
directory is read once for every member (:meth:`Source.scan_members
<npydask.storage.base.Source.scan_members>`); where a task or a batch reads
the members, they share the archive's descriptor through the handle cache
(:func:`npydask.storage.acquire`), so reading ``k`` members of a
file costs one ``open``, not ``k``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import dask.array as da

from npydask.dataset._keyed import KeyedDatasets
from npydask.dataset.npy_dataset import NpyDataset

__all__ = ["MultiKeyDataset", "member_keys"]


def member_keys(key: Any) -> tuple[str, ...]:
    """``key`` checked as a list of distinct ``.npz`` member names (``"x"`` and ``"x.npy"`` are one member).

    Raises
    ------
    TypeError
        ``key`` is not a list or tuple, or holds something other than a str.
    ValueError
        The list is empty or names a member twice.

    Examples
    --------
    >>> member_keys(["x", "y"])
    ('x', 'y')
    >>> member_keys(["x", "x.npy"])
    Traceback (most recent call last):
    ...
    ValueError: key names member 'x' twice (as 'x' and 'x.npy'); give each .npz member once
    """
    if not isinstance(key, (list, tuple)):
        raise TypeError(
            f"key must be the name of an .npz member (a str) or a list of names, found {type(key).__name__} {key!r}"
        )
    if not key:
        raise ValueError("key=[] names no .npz member: give at least one (key=['x', 'y']), or key=None for .npy files")
    seen: dict[str, str] = {}
    for k in key:
        if not isinstance(k, str):
            raise TypeError(f"key must be a list of .npz member names (str), found {k!r} in {list(key)!r}")
        name = k[:-4] if k.endswith(".npy") else k
        if name in seen:
            raise ValueError(
                f"key names member {name!r} twice (as {seen[name]!r} and {k!r}); give each .npz member once"
            )
        seen[name] = k
    return tuple(key)


class MultiKeyDataset(KeyedDatasets):
    """Files whose samples are dicts of ``.npz`` members; one :class:`NpyDataset` per member.

    Made by :func:`npydask.open_dataset` with ``key=[...]``. ``len(ds)``,
    ``ds.files``, ``ds.keys``, ``ds.members`` (the per-member datasets),
    ``ds.sharding``; ``ds[i]`` is a dict of lazy arrays, ``ds[a:b]`` and
    ``ds[[i, j]]`` are sub-datasets, ``ds.stack()`` a dict of stacked arrays,
    ``ds.shard(k, n)`` a shard. Immutable.

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os
    >>> root = tempfile.mkdtemp()
    >>> for i in range(3):
    ...     np.savez(os.path.join(root, f"{i}.npz"), x=np.full((2, 2), i, "f4"), y=np.int64(i))
    >>> ds = npydask.open_dataset(root, file_filter="*.npz", key=["x", "y"])
    >>> batch = ds.stack()
    >>> batch["x"].shape, batch["y"].dtype, ds[2]["y"].compute().item()
    ((3, 2, 2), dtype('int64'), 2)
    """

    __slots__ = ()

    def __init__(self, members: Mapping[str, NpyDataset]) -> None:
        members = dict(members)
        if not members:
            raise ValueError("a MultiKeyDataset needs at least one member")
        lengths = {len(d) for d in members.values()}
        if len(lengths) != 1:
            raise ValueError(f"every member must cover the same files, found lengths {sorted(lengths)}")
        object.__setattr__(self, "_members", members)

    def __reduce__(self) -> tuple[Any, ...]:
        return (MultiKeyDataset, (self._members,))

    # -- facts ---------------------------------------------------------------
    @property
    def files(self) -> list[str]:
        """The archives, in read order (as :attr:`NpyDataset.files`)."""
        return self._first().files

    @property
    def start_index(self) -> int | None:
        """As :attr:`NpyDataset.start_index`."""
        return self._first().start_index

    @property
    def skipped(self) -> tuple[Any, ...]:
        """The archives ``open_dataset(..., on_error="skip")`` left out, with why.

        Each a :class:`~npydask.dataset.npy_dataset.Skipped`.
        """
        return self._first().skipped

    @property
    def sharding(self) -> tuple[int, int] | None:
        """As :attr:`NpyDataset.sharding`."""
        return self._first().sharding

    @property
    def device(self) -> str:
        """``"cpu"`` or ``"gpu"``: where the lazy arrays are read."""
        return self._first()._device

    def __repr__(self) -> str:
        parts = ", ".join(f"{k}: {d.dtype.str} {d.shapes[0] if len(d) else ()}" for k, d in self._members.items())
        files = self.files
        where = f"{files[0]}{' .. ' + files[-1] if len(files) > 1 else ''}" if files else "no files"
        return f"MultiKeyDataset({len(self)} files, members {{{parts}}}: {where})"

    # -- selection -----------------------------------------------------------
    def __getitem__(self, index: Any) -> Any:
        """``ds[i]``: a dict of lazy arrays; ``ds[a:b]``, ``ds[[i, j]]``: sub-datasets."""
        picked = {k: d[index] for k, d in self._members.items()}
        if isinstance(index, (slice, list)) or hasattr(index, "shape") and getattr(index, "ndim", 0) > 0:
            return MultiKeyDataset(picked)
        return picked

    def shard(self, shard_id: int, num_shards: int) -> MultiKeyDataset:
        """As :meth:`NpyDataset.shard`, for every member."""
        return MultiKeyDataset({k: d.shard(shard_id, num_shards) for k, d in self._members.items()})

    # -- lazy arrays ---------------------------------------------------------
    def stack(self, chunks: Any = None) -> dict[str, da.Array]:
        """Each member's :meth:`NpyDataset.stack`: shape ``(len(ds), *member_shape)``.

        ``chunks`` (one value for every member) overrides the grouping.
        Compute the members together (``dask.compute(ds.stack())``) to read
        them in one pass.
        """
        return {k: d.stack(chunks) for k, d in self._members.items()}

    to_ray = NpyDataset.to_ray
    """This dataset as a ``ray.data.Dataset`` with one tensor column per member, named after it (see
    :func:`npydask.ray.datasource.read_npy`): rows are files, each read task reads every member of its files, and
    ``column`` or ``concatenate=True`` raise ``ValueError``."""


def pick(dataset: Any, indices: Sequence[int]) -> Any:
    """The views of ``indices``: a list for an :class:`NpyDataset`, a dict of lists (per member) otherwise."""
    if isinstance(dataset, MultiKeyDataset):
        return {k: [d.views[i] for i in indices] for k, d in dataset._members.items()}
    views = dataset.views
    return [views[i] for i in indices]
