"""Many boxes of one file read together: :func:`read_boxes`, and :func:`read_boxes_many` for a batch's files.

A sampler's patches of one file have their byte runs merged into one set of
spans (:mod:`npydask.plan.patch_runs`), read in one batch
(:mod:`npydask.storage.spans`), then each box is cut out and padded where it
hangs over the file's edges. A local file read by the mapped strategy has
each box copied from the file's one mapping instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, cast

import numpy as np

from npydask import backends
from npydask._buffers import empty
from npydask.backends.mmap import MapError
from npydask.config import ReadOptions
from npydask.format.npz import check_stored
from npydask.plan.patch_runs import BoxLike, PatchRuns, check_outs, cut_boxes, pad_box, plan_boxes
from npydask.plan.region import Box
from npydask.reader.region import FileRef
from npydask.storage import OpenFile, truncation_blocked
from npydask.storage.base import OpenedFile
from npydask.storage.spans import each_file, inflate_spans, read_spans

__all__ = ["MAX_INFLATE_GAP", "BoxesRead", "FileBoxes", "maps_boxes", "probe_offsets", "read_boxes", "read_boxes_many"]


class BoxesRead(NamedTuple):
    """The arrays of boxes of one file read together (:func:`read_boxes`), and what reading them cost.

    The counts add up over calls: a loader sums them per epoch.
    """

    arrays: list[np.ndarray]
    """One array per box, in the order given."""
    bytes_read: int
    """Payload bytes read from the file (the merged spans, gaps included; each byte once)."""
    requests: int
    """Reads issued: ``preadv`` calls for a local file, range GETs for an object (0 for boxes copied from a
    mapping)."""
    patch_bytes: int
    """Bytes of the arrays (padding included)."""


MAX_INFLATE_GAP = 1 << 62
"""A deflated member is inflated once, from the first box's bytes to the last's: every gap is kept."""


def read_boxes(
    ref: FileRef,
    boxes: Sequence[BoxLike],
    *,
    fill_value: Any = 0,
    max_gap: int | None = None,
    out: Sequence[np.ndarray | None] | None = None,
    probe_cache: bool = False,
) -> BoxesRead:
    """Read many boxes of one file together: the union of their bytes, each byte once, then each box cut out.

    Each array equals ``numpy.load(path)[tuple(slice(a, b) for a, b in zip(start, stop))]``
    (values, dtype with its byte order, shape; C-contiguous, fresh and
    writeable) for a box inside the file, for C- and Fortran-ordered files,
    ``.npz`` members and 0-d arrays. A box may name only the trailing axes:
    the leading ones (channels) are read whole. A box may hang over the
    file's edges (negative starts, stops past the extent): its cells outside
    the file hold ``fill_value``, converted to the dtype as
    ``out_of_bounds_policy="pad"`` converts it.

    The boxes' byte runs are merged where they overlap or lie within
    ``max_gap`` bytes of each other (the gap bytes are read and dropped),
    then read in one batch: a local file by a loop of ``preadv`` on one
    descriptor (``O_DIRECT`` with the ``direct_io`` setting), an object by
    concurrent range GETs. Like :meth:`FileRef.read`, the file must still
    be the one ``ref`` was opened on, checked after the reads. A deflated
    ``.npz`` member is inflated once, from its start to the last box's bytes.

    A local file whose ``ref.backend`` is ``"mmap"`` (or ``"auto"`` with the
    ``roi_strategy`` setting ``"mapped"``) has each box copied from the
    file's one mapping instead: only the boxes' bytes are copied, which is
    faster from a warm page cache (no gap bytes) and costs page faults from
    a cold one. ``bytes_read`` then counts the bytes copied, ``requests`` 0.
    The copies are made under a read lease, so no process can truncate the
    file meanwhile (a truncation would end this one with ``SIGBUS``); where
    no lease can be had (the file is open for writing elsewhere, another
    user's, on a file system without leases), ``"auto"`` reads the spans
    and ``"mmap"`` reads each box with ``pread``.
    With ``probe_cache=True`` they are copied from the mapping only when
    their bytes are in the page cache (asked without reading them: the
    first, middle and last run of each box,
    :meth:`~npydask.storage.base.Source.in_memory`), and read as spans
    otherwise: a page fault on a mapping reads ahead around it (the
    device's ``read_ahead_kb``), the spans read just their bytes, several
    at once.

    Parameters
    ----------
    ref : FileRef
        The file, as opened (:meth:`FileRef.open`).
    boxes : sequence of Box
        The boxes, in logical (C-order) coordinates; they may overlap. Any
        object with integer ``start`` and ``stop`` sequences serves (a
        sampler's patch).
    fill_value : number
        The value of cells outside the file.
    max_gap : int, optional
        Bytes of gap bridged between runs; ``ref.options.gap_bytes`` by
        default (the ``gap_bytes`` setting, ``remote_gap_bytes`` for objects).
    out : sequence of numpy.ndarray or None, optional
        One entry per box: a writeable C-contiguous array of the box's shape
        (leading axes included) to fill, or ``None``. Its dtype is the file's
        or the file's in native byte order (the values are then converted, as
        a batch in native order wants them). The arrays returned are these.
    probe_cache : bool
        A file read through its mapping reads its boxes as spans when their
        bytes are not in the page cache (see above).

    Returns
    -------
    BoxesRead
        The arrays, with the bytes read, the requests issued and the bytes of the arrays.

    Raises
    ------
    RoiError
        For a box with more axes than the file, or a stop before its start.
    ValueError
        For a ``fill_value`` the dtype cannot hold, a negative ``max_gap``, or an ``out`` array that does not fit.
    FileChangedError
        If the file is no longer the one ``ref`` was opened on (before or while it was read).
    NpyFormatError
        If the file's header bytes are not the ones in ``ref.check``.

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os
    >>> from npydask.plan.region import Box
    >>> p = os.path.join(tempfile.mkdtemp(), "a.npy"); np.save(p, np.arange(12).reshape(3, 4))
    >>> got = read_boxes(FileRef.open(p), [Box((0, 1), (2, 3)), Box((2, 3), (4, 5))], fill_value=-1)
    >>> got.arrays[1]
    array([[11, -1],
           [-1, -1]])
    >>> got.bytes_read, got.requests
    (88, 1)
    """
    f = ref.source.open(ref.path, ref.identity, key=ref.key, check=ref.check)
    gap = ref.options.gap_bytes if max_gap is None else max_gap
    if f.deflated:
        gap = MAX_INFLATE_GAP
    maps = _maps(ref, f)

    def plan(merge: bool) -> PatchRuns:
        return plan_boxes(
            f.header,
            boxes,
            max_gap=gap,
            max_span=ref.options.max_span_bytes,
            fill_value=fill_value,
            source=f.path,
            merge=merge,
        )

    runs = plan(not maps)  # (a mapping copies each box: no spans to merge)
    if maps and probe_cache and not ref.source.in_memory(f, probe_offsets(runs)):
        maps, runs = False, plan(True)  # (cold: the spans read just their bytes)
    dests = check_outs(runs, out, f.path)
    if maps:
        # (no process can truncate the file while the boxes are copied: a copy never meets SIGBUS)
        with truncation_blocked(cast(OpenFile, f)) as held:
            if held or ref.backend != "auto":  # (backend="mmap" without the lease: each box by pread)
                try:
                    return _read_mapped(f, runs, ref.options, dests)
                except MapError:
                    if ref.backend != "auto":
                        raise
        runs = plan(True)  # (the mapping or the lease was refused: read the spans)
    buffer = empty((runs.bytes_read,), np.uint8)
    whole = Box.whole(f.header.shape)
    if f.deflated:
        done = inflate_spans(f, runs.spans, buffer, verify=any(cut.inside == whole for cut in runs.cuts))
    else:
        done = read_spans(ref.source, f, runs.spans, buffer, ref.options)
    arrays = cut_boxes(runs, buffer, dests)
    _check_whole_members(f, runs, arrays)
    return BoxesRead(arrays, done.nbytes, done.requests, runs.patch_bytes)


def _check_whole_members(f: OpenedFile, runs: PatchRuns, arrays: list[np.ndarray]) -> None:
    """A stored ``.npz`` member read whole by a box: its CRC-32 checked, as :func:`read_region` checks it."""
    member = f.member
    if member is None or not member.stored:
        return
    whole = Box.whole(f.header.shape)
    dtype = f.header.dtype
    for a, cut in zip(arrays, runs.cuts):
        if cut.box == whole:
            a = a if a.dtype.str == dtype.str else a.astype(dtype)  # (an out array in native byte order)
            check_stored(f.read_at, member, f.path, a, f.header.fortran_order)


def maps_boxes(ref: FileRef) -> bool:
    """Whether :func:`read_boxes` copies ``ref``'s boxes from the file's mapping rather than reading spans.

    ``"mmap"``, or ``"auto"`` with the ``roi_strategy`` setting ``"mapped"``
    (and no ``direct_io``), for a file of a source that can map and not a
    deflated ``.npz`` member. With ``probe_cache=True`` such boxes are
    still read as spans where the page cache does not hold them.
    """
    if ref.compressed or not ref.source.mappable:
        return False
    return ref.backend == "mmap" or (
        ref.backend == "auto" and ref.options.roi_strategy == "mapped" and not ref.options.direct_io
    )


def _maps(ref: FileRef, f: OpenedFile) -> bool:
    """:func:`maps_boxes` for the file as opened (a local file, not a deflated member)."""
    return maps_boxes(ref) and f.local and not f.deflated


def probe_offsets(runs: PatchRuns) -> list[int]:
    """File offsets that stand for the boxes' bytes: the first byte of the first, middle and last run of each box.

    Examples
    --------
    >>> import numpy as np
    >>> from npydask.format.header import NpyHeader
    >>> from npydask.plan.region import Box
    >>> h = NpyHeader((1, 0), (4, 4, 4), np.dtype("<f4"), False, 128, 256)
    >>> probe_offsets(plan_boxes(h, [Box((0, 0, 0), (4, 2, 2))], max_gap=0, merge=False))
    [128, 272, 336]
    """
    offsets = []
    for cut in runs.cuts:
        p = cut.plan
        if not p.n_runs:
            continue
        middle = sum((n // 2) * stride for n, stride in zip(p.outer_shape, p.outer_strides))
        offsets += [p.offset, p.offset + middle, p.end - p.run_nbytes]
    return offsets


def _read_mapped(f: OpenedFile, runs: PatchRuns, options: ReadOptions, out: list[np.ndarray | None]) -> BoxesRead:
    """Each box's part inside the file copied from the file's one mapping (the mmap backend), then padded.

    The bytes counted are those copied (overlaps once per box); page faults are not counted as requests.
    """
    mapped = backends.get("mmap")
    dtype = f.header.dtype
    inside = []
    for cut, dest in zip(runs.cuts, out):
        direct = dest is not None and not cut.padded and dest.dtype == dtype and dest.dtype.str == dtype.str
        inside.append(mapped.read(f, cut.plan, options, dest if direct else empty(cut.plan.shape, dtype)))
    f.check_unchanged()
    _check_whole_members(f, runs, inside)
    arrays = [pad_box(runs, cut, a, dest) for cut, a, dest in zip(runs.cuts, inside, out)]
    return BoxesRead(arrays, sum(cut.plan.nbytes for cut in runs.cuts), 0, runs.patch_bytes)


class FileBoxes(NamedTuple):
    """One file and the boxes to read of it, as :func:`read_boxes_many` takes them."""

    ref: FileRef
    boxes: Sequence[BoxLike]
    out: Sequence[np.ndarray | None] | None = None
    """Arrays to fill, one per box (see :func:`read_boxes`), or ``None``."""


def read_boxes_many(
    files: Sequence[FileBoxes], *, fill_value: Any = 0, max_gap: int | None = None, probe_cache: bool = False
) -> list[BoxesRead]:
    """:func:`read_boxes` of each file: objects several at once, local files in turn (``probe_cache`` as there).

    The boxes of one file are read together; list a file once with all its
    boxes (a batch's patches of one volume, a zipped dataset's files
    separately). Objects of a store are read up to 16 at once, their range
    GETs sharing the ``remote_concurrency`` requests in flight.

    Examples
    --------
    >>> import numpy as np, tempfile, os
    >>> from npydask.plan.region import Box
    >>> d = tempfile.mkdtemp(); paths = [os.path.join(d, f"{i}.npy") for i in range(2)]
    >>> for i, p in enumerate(paths): np.save(p, np.full((4, 4), i))
    >>> got = read_boxes_many([FileBoxes(FileRef.open(p), [Box((1, 1), (3, 2))]) for p in paths])
    >>> [r.arrays[0].ravel().tolist() for r in got]
    [[0, 0], [1, 1]]
    """
    concurrent = any(f.ref.source.concurrent for f in files)

    def one(f: FileBoxes) -> BoxesRead:
        return read_boxes(f.ref, f.boxes, fill_value=fill_value, max_gap=max_gap, out=f.out, probe_cache=probe_cache)

    return each_file(one, files, concurrent)
