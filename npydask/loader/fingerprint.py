"""What a saved loader state records of its dataset: a fingerprint of the files and what their samples hold.

:func:`dataset_fingerprint` tells a dataset's file list, layout, ROIs,
``.npz`` keys and fill values from another's, so that a state saved over
one dataset is refused by a loader over another
(:func:`describe_difference` says how they differ);
:func:`warn_if_resharded` warns when a loader shards an already sharded
dataset.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from npydask.dataset.multikey import MultiKeyDataset
from npydask.dataset.zipped import ZippedDataset
from npydask.errors import NpyDaskWarning

__all__ = ["CHECKED", "dataset_fingerprint", "describe_difference", "warn_if_resharded"]


def dataset_fingerprint(dataset: Any) -> dict[str, str]:
    """Short facts that tell a dataset's file list and what its samples hold from another's.

    ``"files"`` hashes the file names relative to their common folder, in
    order (so a dataset copied to another disk or node keeps it, while
    another selection, order or shard does not); ``"layout"`` hashes the
    dtype and each output shape (after ROI); ``"roi"`` hashes each file's
    ROI as resolved (start and end per axis, after the policy, so per-file
    ROIs and ROIs of equal shapes at other starts differ), described in
    ``"roi_shown"``; ``"key"`` is the ``.npz`` member(s) read; ``"fill"`` the
    fill value of the cells a ``"pad"`` ROI puts outside a file (``"none"``
    when no cell is outside). Sizes and mtimes are left out (a resumed job
    may run on a copy of its files), and so are ``device``, ``backend`` and
    ``headers``, which change where and how samples are read, not what they hold.

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os
    >>> root = tempfile.mkdtemp()
    >>> for i in range(3): np.save(os.path.join(root, f"{i}.npy"), np.zeros(4))
    >>> ds = npydask.open_dataset(root)
    >>> dataset_fingerprint(ds) == dataset_fingerprint(ds[:]), dataset_fingerprint(ds) == dataset_fingerprint(ds[::-1])
    (True, False)
    >>> moved = npydask.open_dataset(root, roi_start=1, roi_shape=2)
    >>> dataset_fingerprint(moved)["roi_shown"], dataset_fingerprint(ds)["roi_shown"]
    ('start (1,) end (3,) for every file', 'whole files')
    """
    if isinstance(dataset, ZippedDataset):  # (each member's files, dtype, shapes, ROIs and key)
        members = dataset.members
        names = b"\1".join(k.encode() + b"\1" + _names(d.files) for k, d in members.items())
        layout = "|".join(f"{k}|{d.dtype.str}|{d.dtype}|{d.shapes}" for k, d in members.items()).encode()
        key = repr({k: d.views.context.key for k, d in members.items()})
    elif isinstance(dataset, MultiKeyDataset):  # (every member's dtype, shapes and ROIs, in key order)
        members = dataset.members
        layout = "|".join(f"{k}|{d.dtype.str}|{d.dtype}|{d.shapes}" for k, d in members.items()).encode()
        key = repr(list(members))
        names = _names(dataset.files)
    else:
        names = _names(dataset.files)
        members = {"": dataset}
        layout = f"{dataset.dtype.str}|{dataset.dtype}|{dataset.shapes}".encode()
        key = repr(dataset.views.context.key)
    rois = [_rois(d.table) for d in members.values()]
    return {
        "files": _hash(names),
        "layout": _hash(layout),
        "roi": _hash(b"|".join(r[0] for r in rois)),
        "roi_shown": rois[0][1] if len(rois) == 1 else "; ".join(f"{k}: {r[1]}" for k, r in zip(members, rois)),
        "key": key,
        "fill": ", ".join(sorted({f for r in rois for f in r[2]})) or "none",
    }


def _names(files: Sequence[str]) -> bytes:
    """The file names relative to their common folder, in order, as bytes to hash."""
    prefix = os.path.commonprefix(list(files)) if len(files) > 1 else os.path.dirname(files[0]) + os.sep
    cut = max(prefix.rfind(os.sep), prefix.rfind("/")) + 1
    return "\0".join(f[cut:] for f in files).encode("utf-8", "surrogateescape")


def _hash(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _rois(table: Any) -> tuple[bytes, str, set[str]]:
    """A table's per-file ROIs as bytes to hash, a description, and the fill values of padded ones.

    The bytes are the distinct resolved ROIs ``(start, end)`` (``None``: the
    whole file) in order of first use and each row's number among them, so
    equal datasets agree however their tables number their ROIs (a slice,
    a pickled copy, a table opened again).
    """
    ids = table.roi_ids()
    used, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    found = [table.rois[int(u)] for u in used.tolist()]
    facts = [None if r is None else (tuple(map(int, r.start)), tuple(map(int, r.end))) for r in found]
    number: dict[Any, int] = {}
    canon = np.empty(len(used), np.int64)
    for k in np.argsort(first, kind="stable").tolist():
        canon[k] = number.setdefault(facts[k], len(number))
    data = repr(list(number)).encode() + b"|" + canon[inverse.reshape(-1)].astype("<i8").tobytes()
    first_roi = next(iter(number))
    if len(number) > 1:
        shown = (
            f"{len(number)} different ROIs, the first file's {'whole' if first_roi is None else _roi_text(first_roi)}"
        )
    else:
        shown = "whole files" if first_roi is None else f"{_roi_text(first_roi)} for every file"
    fills = {repr(np.asarray(r.fill_value).tolist()) for r in found if r is not None and r.padded}
    return data, shown, fills


def _roi_text(roi: tuple[tuple[int, ...], tuple[int, ...]]) -> str:
    return f"start {roi[0]} end {roi[1]}"


def warn_if_resharded(dataset: Any, shard_id: int, num_shards: int, where: str) -> None:
    """Warn when ``where`` shards a dataset that ``open_dataset`` or ``ds.shard()`` already sharded.

    The shards compound (shard 0 of 2 of shard 0 of 2 is a quarter of the
    files), which is rarely meant: each process should be given one share.
    """
    sharding = getattr(dataset, "sharding", None)
    if num_shards <= 1 or sharding is None:
        return
    warnings.warn(
        f"{where} shards a dataset that is already shard {sharding[0]} of {sharding[1]} (open_dataset(shard_id=, "
        f"num_shards=) or ds.shard()): the shards compound, so this reads about 1/{num_shards} of the dataset's "
        f"{len(dataset)} files, 1/{sharding[1] * num_shards} of the whole list. Shard in one place: open the whole "
        f"dataset and shard here (shard_id={shard_id}, num_shards={num_shards}), or keep the dataset's shard and "
        "leave num_shards=1 here",
        NpyDaskWarning,
        stacklevel=3,
    )


CHECKED = ("files", "layout", "roi", "key", "fill")


def describe_difference(what: str, saved: dict[str, Any], mine: dict[str, str]) -> str:
    """How the saved fingerprint's ``what`` differs from this dataset's, for a message."""
    if what == "files":
        return "its file names (relative to their common folder, in order) differ"
    if what == "layout":
        return "its samples' dtype or shapes (after ROI) differ"
    if what == "roi":
        return f"its ROIs differ (the state's: {saved.get('roi_shown')}; this dataset's: {mine['roi_shown']})"
    if what == "key":
        return f"it reads another .npz key (the state's: {saved.get('key')}; this dataset's: {mine['key']})"
    return (
        f"its fill value for cells outside the files differs (the state's: {saved.get('fill')}; "
        f"this dataset's: {mine['fill']})"
    )
