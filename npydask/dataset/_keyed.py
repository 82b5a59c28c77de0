"""What the datasets of dict samples share: one :class:`NpyDataset` per key, all of one length.

:class:`~npydask.dataset.multikey.MultiKeyDataset` (members of the same
``.npz`` archives) and :class:`~npydask.dataset.zipped.ZippedDataset`
(separate datasets paired by position) differ in how they are made and
selected; the facts they give per key are the same, and live here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import dask.array as da

from npydask.dataset.npy_dataset import NpyDataset
from npydask.storage.local import LOCAL

__all__ = ["KeyedDatasets"]


class KeyedDatasets:
    """Immutable datasets by key, of one length: ``keys``, ``members``, ``len``, iteration, per-key facts."""

    __slots__ = ("_members",)
    _members: dict[str, NpyDataset]

    def __setattr__(self, name: str, value: Any) -> None:
        kind = type(self).__name__
        raise AttributeError(f"{kind} is immutable: cannot set {name!r}; select with ds[...] or ds.shard()")

    def __getitem__(self, index: Any) -> Any:  # pragma: no cover - each kind selects its own way
        raise NotImplementedError

    @property
    def keys(self) -> tuple[str, ...]:
        """The keys, in the order given."""
        return tuple(self._members)

    @property
    def members(self) -> dict[str, NpyDataset]:
        """One dataset per key (a new dict each time; the datasets are immutable)."""
        return dict(self._members)

    def _first(self) -> NpyDataset:
        return next(iter(self._members.values()))

    def __len__(self) -> int:
        return len(self._first())

    def __iter__(self) -> Iterator[dict[str, da.Array]]:
        return (self[i] for i in range(len(self)))

    @property
    def dtypes(self) -> dict[str, Any]:
        """Each member's dtype."""
        return {k: d.dtype for k, d in self._members.items()}

    @property
    def shapes(self) -> dict[str, list[tuple[int, ...]]]:
        """Each member's output shapes (after ROI), one per file."""
        return {k: d.shapes for k, d in self._members.items()}

    @property
    def nbytes(self) -> int:
        """Bytes of all members' outputs (after ROI)."""
        return sum(d.nbytes for d in self._members.values())

    def arrays(self) -> list[dict[str, da.Array]]:
        """Every sample as a dict of lazy arrays, in order."""
        return list(self)

    def warm_cache(self, *, progress: bool = True) -> Any:
        """:meth:`NpyDataset.warm_cache <npydask.dataset.npy_dataset.NpyDataset.warm_cache>` for every key at once.

        Keys whose files are local are left to the page cache; every other key
        needs a node cache on (else ``ValueError``), and so does one key at least.
        """
        from npydask.dataset.warm import cache_folder_of, warm

        views: list[Any] = []
        folders = []
        for ds in self._members.values():
            if ds._context.source is LOCAL:
                continue
            folders.append(cache_folder_of(ds._context.source, ds._shown(0) if len(ds) else "an empty dataset"))
            views += ds.views
        if not folders:
            first = self._first()
            cache_folder_of(first._context.source, first._shown(0) if len(first) else "an empty dataset")
        return warm(views, folders[0], progress=progress)
