"""Task bodies of the write path: the only writing code that touches files.

A chunk task writes its block's byte runs with ``os.pwrite`` into the
temporary file of its call (:func:`write_chunk`) and reports which file it
wrote: the task that creates the file (``O_EXCL``) stamps it with 16 random
bytes just past the payload's end, and every task reports the stamp it found.
The last task of a file (:func:`finish_file`) first takes the temporary file
away under a name of its own (a rename: nothing else can reach the file under
that name), checks that it carries the one stamp every chunk task reported
and has the array's size plus the stamp, then cuts the stamp off, writes the
header at offset 0, syncs and renames it over the target. (A stamp, not the
inode number: file systems reuse a freed inode's number at once.) A one-chunk file is written
by :func:`write_file` in a single task, into a file of its own created with
``O_EXCL``. The planning that decides what they write is :mod:`npydask.write.npy`'s.

Structured dtypes are copied as raw bytes (a same-size ``V`` view), so the
padding between fields is written as the source holds it, as ``numpy.save``
writes it (numpy's own copies move structured values field by field and
leave the padding uninitialised).
"""

from __future__ import annotations

import errno
import os
import secrets
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from npydask._buffers import as_bytes, raw_copy
from npydask.errors import FileChangedError
from npydask.format.header import NpyHeader
from npydask.plan.region import Box, plan_read
from npydask.storage import TMP_SUFFIX, check_inside, fsync_folder, publish, pwrite_all, remove_quietly

__all__ = [
    "STAMP_BYTES",
    "WRITTEN",
    "ChunkTarget",
    "FileTarget",
    "Written",
    "all_written",
    "as_block",
    "block_runs",
    "finish_file",
    "write_block_task",
    "write_chunk",
    "write_file",
]


STAMP_BYTES = 16
"""Random bytes that mark one temporary file, kept just past its payload until the last step."""

WRITTEN = np.dtype([("nbytes", "<i8"), ("stamp", f"V{STAMP_BYTES}")])
"""What a chunk task returns (as a one-element array): its byte count and the stamp of the file it wrote."""

STAMP_WAIT = 5.0
"""Seconds a task waits for the stamp of a file another task has just created."""

_OPEN_FLAGS = os.O_RDWR | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
_NO_STAMP = bytes(STAMP_BYTES)


class Written(NamedTuple):
    """The bytes one task wrote and the stamp of the file it wrote them to."""

    nbytes: int
    stamp: bytes = _NO_STAMP


@dataclass(frozen=True)
class ChunkTarget:
    """What a chunk task carries besides its chunk.

    Attributes: ``path`` (the target, for messages), ``tmp`` (the temporary
    file shared by the chunk tasks of one call), ``header`` (the output's
    layout, C order), ``make_dirs`` (create missing folders instead of
    failing) and ``root`` (the real path of the output folder every file
    must stay inside, for ``to_npy_files``; ``""`` for none).
    """

    path: str
    tmp: str
    header: NpyHeader
    make_dirs: bool = False
    root: str = ""


@dataclass(frozen=True)
class FileTarget:
    """What the last task of a file carries.

    Attributes: ``preamble`` (magic, version, length and header text: the
    file's first bytes), ``chunk`` (the :class:`ChunkTarget`), ``overwrite``
    and ``sync_folder`` (``fsync`` the folder after the rename; ``to_npy_files``
    does it once per folder at the end instead).
    """

    preamble: bytes
    chunk: ChunkTarget
    overwrite: bool = True
    sync_folder: bool = True

    @property
    def path(self) -> str:
        """The ``.npy`` file to create or replace."""
        return self.chunk.path

    @property
    def tmp(self) -> str:
        """The temporary file."""
        return self.chunk.tmp

    @property
    def size(self) -> int:
        """The finished file's size in bytes."""
        return len(self.preamble) + self.chunk.header.nbytes


def write_chunk(block: Any, target: ChunkTarget, box: Box) -> Written:
    """Write ``block``, the region ``box`` of the output, into the temporary file; say what was written.

    The block is made C-contiguous in the output's dtype, then each byte run
    of the box (one per row piece when the chunk does not span whole rows) is
    written at its offset. Returns the byte count and the file's stamp
    (zeros when there was nothing to write).
    """
    data = as_block(block, target.header, box, target.path)
    if data.nbytes == 0:
        return Written(0)
    fd, stamp = _open_shared(target)
    try:
        _write_runs(fd, data, target, box, target.tmp)
    finally:
        os.close(fd)
    return Written(data.nbytes, stamp)


def write_block_task(block: Any, target: ChunkTarget, block_info: dict | None = None) -> np.ndarray:
    """``map_blocks`` body: write one chunk and return :class:`Written` as a tiny :data:`WRITTEN` array."""
    assert block_info is not None
    location = block_info[0]["array-location"]
    box = Box(tuple(a for a, _ in location), tuple(b for _, b in location))
    out = np.zeros((1,) * len(location), WRITTEN)
    out[...] = tuple(write_chunk(block, target, box))
    return out


def finish_file(written: Sequence[Any], target: FileTarget) -> None:
    """The last step: take the temporary file, check it, header at offset 0, ``fsync``, rename, sync the folder.

    ``written`` holds what the chunk tasks returned (:data:`WRITTEN` arrays):
    their byte counts must add up to the payload's size, and they must all
    have written the one file that is under the temporary name now (its
    stamp), which must have the payload's size plus the stamp. Otherwise
    (another computation of the same lazy write ran at the same time, or the
    file was replaced, truncated or removed) nothing is published. Any
    failure removes the file taken.
    """
    header = target.chunk.header
    total, stamps = 0, set()
    for w in written:
        for n, stamp in np.asarray(w, dtype=WRITTEN).reshape(-1).tolist():
            total += n
            if n:
                stamps.add(bytes(stamp))
    if total != header.nbytes:
        raise RuntimeError(
            f"{target.path}: the chunk tasks wrote {total} bytes but the array holds "
            f"{header.nbytes}; not publishing an incomplete file"
        )
    if header.nbytes == 0:  # nothing was written: the file is the header alone
        fd, mine = _create_own(target.chunk)
    else:
        fd, mine = _take_tmp(target, stamps)
    try:
        try:
            _write_header(fd, target, mine)
        finally:
            os.close(fd)
        _publish(target, mine)
    except BaseException:
        remove_quietly(mine)
        raise


def write_file(block: Any, target: FileTarget) -> None:
    """Write a whole array (one chunk) in one task: its own file, payload, header, ``fsync``, rename."""
    data = as_block(block, target.chunk.header, Box.whole(target.chunk.header.shape), target.path)
    fd, mine = _create_own(target.chunk)
    try:
        try:
            if data.nbytes:
                _write_runs(fd, data, target.chunk, Box.whole(target.chunk.header.shape), mine)
            _write_header(fd, target, mine)
        finally:
            os.close(fd)
        _publish(target, mine)
    except BaseException:
        remove_quietly(mine)
        raise


def all_written(results: Sequence[Any], folders: Sequence[str]) -> None:
    """The task joining the files of :func:`to_npy_files`: sync each folder once."""
    for folder in folders:
        fsync_folder(folder)


def as_block(block: Any, header: NpyHeader, box: Box, path: str) -> np.ndarray:
    """``block``, the region ``box`` of the output, as a C-contiguous array of the output's dtype (checked)."""
    if not isinstance(block, np.ndarray):
        get = getattr(block, "get", None)  # CuPy arrays copy to the host with .get()
        block = get() if callable(get) and type(block).__module__.startswith("cupy") else np.asarray(block)
    if block.shape != box.shape:
        raise ValueError(
            f"{path}: the chunk at {list(box.start)}..{list(box.stop)} has shape {block.shape}, expected "
            f"{box.shape}; the dask array's chunks do not match its blocks (check map_blocks' chunks=)"
        )
    if block.dtype != header.dtype:
        if not np.can_cast(block.dtype, header.dtype, casting="same_kind"):
            raise TypeError(
                f"{path}: a chunk holds {block.dtype} where the array's dtype is {header.dtype}; "
                f"give map_blocks the right dtype= or cast with astype"
            )
        if header.dtype.names is None:
            return block.astype(header.dtype, order="C")
        cast = np.zeros(block.shape, header.dtype)  # a structured cast: padding zero, not uninitialised
        cast[...] = block
        return cast
    if block.flags.c_contiguous:
        return block
    return raw_copy(block)


def block_runs(data: np.ndarray, header: NpyHeader, box: Box) -> Iterator[tuple[int, memoryview]]:
    """``(file offset, bytes)`` of each byte run of the C-contiguous ``data``, the region ``box`` of the output."""
    plan = plan_read(header, box)
    view, run = memoryview(as_bytes(data)), plan.run_nbytes  # type: ignore[arg-type]  # numpy types ndarray.__buffer__ from Python 3.12
    for k, piece in enumerate(plan.runs()):
        yield piece.offset, view[k * run : (k + 1) * run]


def _write_runs(fd: int, data: np.ndarray, target: ChunkTarget, box: Box, name: str) -> None:
    """``pwrite`` the C-contiguous ``data``, the region ``box`` of the output, at its byte runs in ``name``."""
    for offset, piece in block_runs(data, target.header, box):
        pwrite_all(fd, piece, offset, name)


def _write_header(fd: int, target: FileTarget, name: str) -> None:
    """Size the file (cutting off any stamp), write the header at offset 0 and ``fsync``."""
    os.ftruncate(fd, target.size)
    pwrite_all(fd, memoryview(target.preamble), 0, name)
    os.fsync(fd)


def _own_name(tmp: str) -> str:
    """A name only the caller knows: the temporary name with 8 random hex digits before its ending."""
    return f"{tmp[: -len(TMP_SUFFIX)]}.{secrets.token_hex(4)}{TMP_SUFFIX}"


def _create_own(target: ChunkTarget) -> tuple[int, str]:
    """Create (``O_EXCL``) and open a file of this task's own for a whole file."""
    name = _own_name(target.tmp)
    return _open_tmp(target, name, os.O_CREAT | os.O_EXCL), name


def _take_tmp(target: FileTarget, stamps: set[bytes]) -> tuple[int, str]:
    """Rename the shared temporary file to a name of this task's own, open it and check it.

    It must carry the one stamp the chunk tasks reported, just past the
    payload, and end there; otherwise it is removed and nothing published.
    (:func:`_write_header` then cuts the stamp off.)
    """
    path, tmp = target.path, target.tmp
    if len(stamps) != 1:
        raise FileChangedError(
            errno.EIO,
            f"the chunk tasks wrote {len(stamps)} different files under the temporary name {tmp!r} (another "
            f"computation of this same lazy write ran at the same time, or the file was replaced): "
            f"not publishing; compute the write again",
            path,
        )
    mine = _own_name(tmp)
    try:
        os.rename(tmp, mine)  # from here on no other task can open the file
    except FileNotFoundError:
        raise FileChangedError(
            errno.ENOENT,
            f"the temporary file {tmp!r} is gone (another computation of this same lazy write published or "
            f"removed it): not publishing; compute the write again",
            path,
        ) from None
    try:
        fd = os.open(mine, _OPEN_FLAGS)
        try:
            size, found = os.fstat(fd).st_size, os.pread(fd, STAMP_BYTES, target.size)
            if found not in stamps or size != target.size + STAMP_BYTES:
                what = "another file" if found not in stamps else f"{size - STAMP_BYTES} bytes"
                raise FileChangedError(
                    errno.EIO,
                    f"the temporary file {tmp!r} is {what}, expected the file the chunk tasks wrote, of "
                    f"{target.size} bytes (it was replaced, truncated or extended meanwhile): not publishing; "
                    f"compute the write again",
                    path,
                )
        except BaseException:
            os.close(fd)
            raise
    except BaseException:
        remove_quietly(mine)
        raise
    return fd, mine


def _open_shared(target: ChunkTarget) -> tuple[int, bytes]:
    """Open the call's shared temporary file and return it with its stamp, creating and stamping it if absent."""
    try:
        fd = _open_tmp(target, target.tmp, os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        pass
    else:
        stamp = _NO_STAMP
        while stamp == _NO_STAMP:
            stamp = secrets.token_bytes(STAMP_BYTES)
        try:
            pwrite_all(fd, memoryview(stamp), target.header.data_offset + target.header.nbytes, target.tmp)
        except BaseException:
            os.close(fd)
            raise
        return fd, stamp
    try:
        fd = _open_tmp(target, target.tmp, 0)
    except FileNotFoundError:
        raise FileChangedError(
            errno.ENOENT,
            f"the temporary file {target.tmp!r} is gone (another computation of this same lazy write published "
            f"or removed it): compute the write again",
            target.path,
        ) from None
    try:
        return fd, _read_stamp(fd, target)
    except BaseException:
        os.close(fd)
        raise


def _read_stamp(fd: int, target: ChunkTarget) -> bytes:
    """The stamp of a file another task created, waiting (up to :data:`STAMP_WAIT`) while it is still empty.

    A file without a stamp that is not empty was taken by a last step (which
    cut the stamp off): this computation can no longer write into it.
    """
    end = target.header.data_offset + target.header.nbytes
    deadline = time.monotonic() + STAMP_WAIT
    while True:
        size = os.fstat(fd).st_size  # first: an empty file grows only by its stamp, whose bytes are in by then
        stamp = os.pread(fd, STAMP_BYTES, end)
        if len(stamp) == STAMP_BYTES and stamp != _NO_STAMP:
            return stamp
        if size:
            raise FileChangedError(
                errno.ENOENT,
                f"the temporary file {target.tmp!r} was taken by the last step of another computation of this "
                f"same lazy write: compute the write again",
                target.path,
            )
        if time.monotonic() > deadline:
            raise FileChangedError(
                errno.EIO,
                f"the temporary file {target.tmp!r} is still empty, without its stamp, after {STAMP_WAIT:g} s "
                f"(the task that created it died?): remove it and compute the write again",
                target.path,
            )
        time.sleep(0.001)


def _open_tmp(target: ChunkTarget, name: str, create: int) -> int:
    """Open ``name`` (in the target's folder) for writing, first checking the folder stays inside ``root``."""
    folder = os.path.dirname(name)
    if target.root:
        check_inside(folder, target.root, target.path)
    try:
        return os.open(name, _OPEN_FLAGS | create, 0o666)
    except FileNotFoundError:
        if not target.make_dirs:
            raise
        os.makedirs(folder, exist_ok=True)
        return os.open(name, _OPEN_FLAGS | create, 0o666)


def _publish(target: FileTarget, tmp: str) -> None:
    """Move the finished file ``tmp`` to the target, then sync the folder."""
    publish(tmp, target.path, overwrite=target.overwrite, sync_folder=target.sync_folder)
