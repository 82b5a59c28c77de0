"""Datasets paired file by file: :func:`zip_datasets`, for images with their labels.

A :class:`ZippedDataset` holds one :class:`~npydask.dataset.npy_dataset.NpyDataset`
per key, all of one length; sample ``i`` is file ``i`` of every member, as a
dict (the files' names checked, :mod:`npydask.dataset.pairing`). The members
are separate sets of files (images in one folder, labels in another), each
with its own dtype, ndim and ROI; a sampler of
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

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from npydask._keywords import suggest_keywords
from npydask.dataset._keyed import KeyedDatasets
from npydask.dataset.multikey import MultiKeyDataset
from npydask.dataset.npy_dataset import NpyDataset
from npydask.dataset.order import natural_key
from npydask.dataset.pairing import PAIRINGS, Mismatch, first_mismatch, join_order, pairing_names, relative_names

__all__ = ["ZippedDataset", "zip_datasets"]


@suggest_keywords
def zip_datasets(
    datasets: Mapping[str, NpyDataset], *, pair_by: str = "checked", key: Callable[[str], str] | None = None
) -> ZippedDataset:
    """Pair datasets file by file: sample ``i`` is ``{key: file i of datasets[key]}``, the files' names checked.

    Parameters
    ----------
    datasets : mapping of str to NpyDataset
        One dataset per key (``{"image": images, "label": labels}``), all of
        the same length, in the order the samples' dicts list them.
        Members may differ in dtype, ndim and leading axes (an image with a
        channel axis beside a label without one); a sampler checks, when
        bound, that they agree over its patch's trailing axes.
    pair_by : {"checked", "name", "position"}, default "checked"
        How files are paired. ``"checked"`` pairs them by position and
        refuses a position whose files' names differ (see Notes);
        ``"name"`` joins the files on those names, putting every member in
        the first member's order; ``"position"`` pairs by position unchecked.
    key : callable, optional
        From a file's relative name (its path relative to the folder all of
        its member's files share, without ``.npy``: ``"ct_1_seg"``,
        ``"sub/case_001_0000"``) to the name it pairs on, used instead of
        removing the common affixes (with ``"checked"`` or ``"name"``).

    Returns
    -------
    ZippedDataset

    Raises
    ------
    TypeError
        ``datasets`` is not a mapping, a key is not a str, a value is not
        an ``NpyDataset`` (a ``MultiKeyDataset``'s members are spread in:
        ``{**multi.members, ...}``), ``key`` is not callable or returns
        something else than a str.
    ValueError
        No dataset is given, their lengths differ (the message lists each
        key's length), an unknown ``pair_by``; with ``"checked"``, files
        paired at one position whose names differ (the message names the
        first such pair, how many differ, and the fix); with ``"name"``,
        a name missing from a member or held twice by one.

    Notes
    -----
    A file's pairing name is its relative name (as ``key`` takes it) without
    what all of its member's names share at their start and at their end:
    ``ct_1`` and ``ct_1_seg`` both pair on ``1``, nnU-Net's
    ``case_001_0000`` and ``case_001`` on ``001``. The shared parts are cut
    only where a digit does not meet a digit, so images ``ct_10`` ..
    ``ct_19`` pair on ``10`` .. ``19``, not on ``0`` .. ``9``; a member of
    one file pairs on ``""`` (whatever single file the others hold). Two
    folders whose names sort differently byte-wise (``ct_10.npy`` before
    ``ct_1_seg.npy``, since ``0`` < ``_``) would pair the wrong files by
    position: ``"checked"`` refuses them and names the fix, usually
    ``sort="natural"`` in both ``open_dataset`` calls.

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
    if not isinstance(pair_by, str) or pair_by not in PAIRINGS:
        raise ValueError(
            f"pair_by must be one of {PAIRINGS}: 'checked' (by position, names checked), 'name' (joined on the "
            f"names) or 'position' (unchecked), found {pair_by!r}"
        )
    if key is not None and not callable(key):
        raise TypeError(f"key must be a callable from a file's relative name to its pairing name, found {key!r}")
    members: dict[str, NpyDataset] = {}
    for name, ds in datasets.items():
        if not isinstance(name, str):
            raise TypeError(f"zip_datasets: keys must be str, found {name!r}")
        if isinstance(ds, MultiKeyDataset):
            raise TypeError(
                f"zip_datasets: {name!r} is a MultiKeyDataset (members {list(ds.keys)}); spread its members into "
                f"the dict instead: zip_datasets({{**ds.members, ...}})"
            )
        if not isinstance(ds, NpyDataset):
            raise TypeError(f"zip_datasets: {name!r} must be an NpyDataset (open_dataset), found {type(ds).__name__}")
        members[name] = ds
    zipped = ZippedDataset(members)  # (checks the count and the lengths)
    if pair_by == "position" or len(members) == 1:
        return zipped
    files = {k: d.files for k, d in members.items()}
    names = {k: _pairing_names(k, f, key) for k, f in files.items()}
    if pair_by == "name":
        order = join_order(names, lambda k, i: repr(files[k][i]))
        return ZippedDataset({k: d if order[k] == list(range(len(d))) else d[order[k]] for k, d in members.items()})
    mismatch = first_mismatch(names)
    if mismatch is not None:
        raise ValueError(_mismatch_message(mismatch, files, names, key))
    return zipped


def _pairing_names(member: str, files: list[str], key: Callable[[str], str] | None) -> list[str]:
    """The names member ``member``'s files pair on: ``key`` of their relative names, or those without affixes."""
    relative = relative_names(files)
    if key is None:
        return pairing_names(relative)
    out = []
    for name in relative:
        got = key(name)
        if not isinstance(got, str):
            raise TypeError(f"zip_datasets: key({name!r}) must return a str (the name it pairs on), found {got!r}")
        out.append(got)
    return out


def _mismatch_message(
    m: Mismatch, files: dict[str, list[str]], names: dict[str, list[str]], key: Callable[[str], str] | None
) -> str:
    """The ``pair_by="checked"`` refusal: the first pair that differs, how many do, and what to do."""
    shown = " with ".join(f"{k!r} file {files[k][m.position]!r} (name {n!r})" for k, n in m.names.items())
    how = "as key= gives them" if key is not None else "once the affixes common to each member's files are removed"
    natural = []
    for k, col in names.items():  # (each member's pairing names in the natural order of its files' names)
        relative = relative_names(files[k])
        natural.append([col[i] for i in sorted(range(len(col)), key=lambda i: natural_key(relative[i]))])
    if all(col == natural[0] for col in natural[1:]):
        why = (
            " The members' files sort differently byte-wise, and natural order (numbers by value) would pair "
            "them right: pass sort='natural' to each open_dataset call."
        )
    else:
        why = ""
    return (
        f"zip_datasets pairs files by position and their names differ: sample {m.position} pairs {shown}, "
        f"names compared {how}: {m.differ} of {len(next(iter(files.values())))} samples would pair files of "
        f"different cases.{why} Pass pair_by='name' to join the files on these names, key= "
        "(a function from a file's relative name to the name it pairs on) where the names need more than "
        "removing common affixes, or pair_by='position' to pair by position unchecked"
    )


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
        parts = ", ".join(
            f"{k}: {d.dtype.str} {d._shapes_shown()}" if len(d) else f"{k}: empty" for k, d in self._members.items()
        )
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
