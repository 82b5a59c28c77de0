"""Datasets paired by position: :func:`zip_datasets`, for images with their labels.

A :class:`ZippedDataset` holds one :class:`~npydask.dataset.npy_dataset.NpyDataset`
per key, all of one length; sample ``i`` is file ``i`` of every member, as a
dict. The members are separate sets of files (images in one folder, labels
in another), each with its own dtype, ndim and ROI; a sampler of
:mod:`npydask.samplers` reads the same box from each, so their shapes must
agree over the patch's trailing axes (checked when the sampler is bound,
since only the sampler knows how many axes its patch has).

Members of one ``.npz`` archive are opened together with
``open_dataset(..., key=["x", "y"])`` (a
:class:`~npydask.dataset.multikey.MultiKeyDataset`, which the samplers also
take); to pair such members with other files, spread them into the dict:
``zip_datasets({**multi.members, "label": labels})``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from npydask.dataset._keyed import KeyedDatasets
from npydask.dataset.multikey import MultiKeyDataset
from npydask.dataset.npy_dataset import NpyDataset

__all__ = ["ZippedDataset", "zip_datasets"]


def zip_datasets(datasets: Mapping[str, NpyDataset]) -> ZippedDataset:
    """Pair datasets by position: sample ``i`` is ``{key: file i of datasets[key]}``.

    Parameters
    ----------
    datasets : mapping of str to NpyDataset
        One dataset per key (``{"image": images, "label": labels}``), all of
        the same length, in the order the samples' dicts list them.
        Members may differ in dtype, ndim and leading axes (an image with a
        channel axis beside a label without one); a sampler checks, when
        bound, that they agree over its patch's trailing axes.

    Returns
    -------
    ZippedDataset

    Raises
    ------
    TypeError
        ``datasets`` is not a mapping, a key is not a str, or a value is not
        an ``NpyDataset`` (a ``MultiKeyDataset``'s members are spread in:
        ``{**multi.members, ...}``).
    ValueError
        No dataset is given, or their lengths differ (the message lists each
        key's length).

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os
    >>> root = tempfile.mkdtemp()
    >>> for d in ("img", "lab"): os.mkdir(os.path.join(root, d))
    >>> for i in range(2):
    ...     np.save(os.path.join(root, "img", f"{i}.npy"), np.full((2, 8, 8), i, "f4"))
    ...     np.save(os.path.join(root, "lab", f"{i}.npy"), np.full((8, 8), i, "u1"))
    >>> z = npydask.zip_datasets({"image": npydask.open_dataset(os.path.join(root, "img")),
    ...                           "label": npydask.open_dataset(os.path.join(root, "lab"))})
    >>> len(z), z.keys, z.shapes["label"][1]
    (2, ('image', 'label'), (8, 8))
    >>> int(z[1]["label"].sum().compute())
    64
    """
    if not isinstance(datasets, Mapping):
        raise TypeError(
            f"zip_datasets takes a dict of datasets ({{'image': ds, 'label': labels}}), found {type(datasets).__name__}"
        )
    members: dict[str, NpyDataset] = {}
    for key, ds in datasets.items():
        if not isinstance(key, str):
            raise TypeError(f"zip_datasets: keys must be str, found {key!r}")
        if isinstance(ds, MultiKeyDataset):
            raise TypeError(
                f"zip_datasets: {key!r} is a MultiKeyDataset (members {list(ds.keys)}); spread its members into "
                f"the dict instead: zip_datasets({{**ds.members, ...}})"
            )
        if not isinstance(ds, NpyDataset):
            raise TypeError(f"zip_datasets: {key!r} must be an NpyDataset (open_dataset), found {type(ds).__name__}")
        members[key] = ds
    return ZippedDataset(members)


class ZippedDataset(KeyedDatasets):
    """Datasets paired by position, made by :func:`zip_datasets`; immutable.

    ``len(z)`` samples; ``z.keys``; ``z["image"]`` the member dataset;
    ``z[i]`` sample ``i`` as a dict of lazy arrays; ``z[a:b]``, ``z[[i, j]]``
    and ``z.shard(k, n)`` the same selection of every member; ``z.shapes``
    and ``z.dtypes`` per key.

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os
    >>> root = tempfile.mkdtemp()
    >>> for i in range(4): np.save(os.path.join(root, f"{i}.npy"), np.zeros((4, 4)))
    >>> ds = npydask.open_dataset(root)
    >>> z = npydask.zip_datasets({"a": ds, "b": ds})
    >>> z
    ZippedDataset(4 samples, members {a: <f8 (4, 4), b: <f8 (4, 4)})
    >>> len(z[1:3]), len(z.shard(0, 2)), z["a"] is ds
    (2, 2, True)
    """

    __slots__ = ()

    def __init__(self, members: Mapping[str, NpyDataset]) -> None:
        members = dict(members)
        if not members:
            raise ValueError("zip_datasets needs at least one dataset: {'image': ds, 'label': labels}")
        lengths = {k: len(d) for k, d in members.items()}
        if len(set(lengths.values())) != 1:
            shown = ", ".join(f"{k!r}: {n}" for k, n in lengths.items())
            raise ValueError(
                f"zip_datasets pairs datasets file by file, so they need the same length; found {shown} files"
            )
        object.__setattr__(self, "_members", members)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ZippedDataset, (self._members,))

    # -- facts ---------------------------------------------------------------
    def __repr__(self) -> str:
        parts = ", ".join(f"{k}: {d.dtype.str} {d.shapes[0]}" if len(d) else f"{k}: empty"
                          for k, d in self._members.items())
        return f"ZippedDataset({len(self)} samples, members {{{parts}}})"

    @property
    def files(self) -> dict[str, list[str]]:
        """Each member's files, in order (as :attr:`shapes`, per key)."""
        return {k: d.files for k, d in self._members.items()}

    @property
    def sharding(self) -> tuple[int, int] | None:
        """The shard ``(shard_id, num_shards)`` every member holds (:attr:`NpyDataset.sharding`), else ``None``.

        ``z.shard(k, n)`` shards each member alike; members sharded apart
        before zipping report ``None`` when their shards differ.
        """
        found = {d.sharding for d in self._members.values()}
        return found.pop() if len(found) == 1 else None

    # -- selection -----------------------------------------------------------
    def __getitem__(self, index: Any) -> Any:
        """``z[key]``: a member dataset; ``z[i]``: a dict of lazy arrays; ``z[a:b]``, ``z[[i, j]]``: sub-datasets."""
        if isinstance(index, str):
            try:
                return self._members[index]
            except KeyError:
                keys = list(self._members)
                raise KeyError(f"no member {index!r} in this ZippedDataset; its keys are {keys}") from None
        picked = {k: d[index] for k, d in self._members.items()}
        if isinstance(index, (slice, list)) or isinstance(index, np.ndarray) and index.ndim > 0:
            return ZippedDataset(picked)
        return picked

    def shard(self, shard_id: int, num_shards: int) -> ZippedDataset:
        """As :meth:`NpyDataset.shard <npydask.NpyDataset.shard>`, for every member alike."""
        return ZippedDataset({k: d.shard(shard_id, num_shards) for k, d in self._members.items()})
