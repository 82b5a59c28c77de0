"""Task bodies of the write path: the only writing code that touches files.

A chunk task writes its block's byte runs with ``os.pwrite`` into the
temporary file (:func:`write_chunk`); the last task of a file sets its size,
writes the header at offset 0, syncs and renames it over the target
(:func:`finish_file`); a one-chunk file is written by :func:`write_file` in a
single task. The planning that decides what they write is
:mod:`npydask.writer`'s.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from npydask.header import NpyHeader
from npydask.region import Box, plan_read

__all__ = [
    "ChunkTarget",
    "FileTarget",
    "all_written",
    "exists_error",
    "finish_file",
    "write_block_task",
    "write_chunk",
    "write_file",
]



@dataclass(frozen=True)
class ChunkTarget:
    """What a chunk task carries besides its chunk.

    Attributes: ``path`` (the target, for messages), ``tmp`` (the temporary
    file), ``header`` (the output's layout, C order) and ``make_dirs``
    (create missing folders instead of failing).
    """

    path: str
    tmp: str
    header: NpyHeader
    make_dirs: bool = False


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




def write_chunk(block: Any, target: ChunkTarget, box: Box) -> int:
    """Write ``block``, the region ``box`` of the output, into the temporary file; return its byte count.

    The block is made C-contiguous in the output's dtype, then each byte run
    of the box (one per row piece when the chunk does not span whole rows) is
    written at its offset.
    """
    data = _as_block(block, target.header, box, target.path)
    if data.nbytes == 0:
        return 0
    plan = plan_read(target.header, box)
    view, run = memoryview(data.reshape(-1).view(np.uint8)), plan.run_nbytes
    fd = _open_tmp(target)
    try:
        for k, piece in enumerate(plan.runs()):
            _pwrite_all(fd, view[k * run : (k + 1) * run], piece.offset, target.tmp)
    finally:
        os.close(fd)
    return data.nbytes


def write_block_task(block: Any, target: ChunkTarget, block_info: dict | None = None) -> np.ndarray:
    """``map_blocks`` body: write one chunk and return its byte count as a tiny array."""
    assert block_info is not None
    location = block_info[0]["array-location"]
    box = Box(tuple(a for a, _ in location), tuple(b for _, b in location))
    return np.full((1,) * len(location), write_chunk(block, target, box), dtype=np.int64)


def finish_file(written: Sequence[Any], target: FileTarget) -> None:
    """The last step: size, header at offset 0, ``fsync``, rename over the target, sync the folder.

    ``written`` holds the byte counts the chunk tasks returned; their sum must
    be the payload's size. Any failure removes the temporary file.
    """
    try:
        total = sum(int(np.sum(w)) for w in written)
        if total != target.chunk.header.nbytes:
            raise RuntimeError(
                f"{target.path}: the chunk tasks wrote {total} bytes but the array holds "
                f"{target.chunk.header.nbytes}; not publishing an incomplete file"
            )
        fd = _open_tmp(target.chunk)
        try:
            os.ftruncate(fd, target.size)
            _pwrite_all(fd, memoryview(target.preamble), 0, target.tmp)
            os.fsync(fd)
        finally:
            os.close(fd)
        _publish(target)
    except BaseException:
        _remove_quietly(target.tmp)
        raise


def write_file(block: Any, target: FileTarget) -> None:
    """Write a whole array (one chunk) in one task: payload, header, ``fsync``, rename."""
    try:
        written = write_chunk(block, target.chunk, Box.whole(target.chunk.header.shape))
    except BaseException:
        _remove_quietly(target.tmp)
        raise
    finish_file([written], target)


def all_written(results: Sequence[Any], folders: Sequence[str]) -> None:
    """The task joining the files of :func:`to_npy_files`: sync each folder once."""
    for folder in folders:
        _fsync_folder(folder)


def _as_block(block: Any, header: NpyHeader, box: Box, path: str) -> np.ndarray:
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
        block = block.astype(header.dtype)
    return np.asarray(block, order="C")  # not ascontiguousarray: it makes 0-d arrays 1-d


def _open_tmp(target: ChunkTarget) -> int:
    flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)  # never O_TRUNC: chunks share the file
    try:
        return os.open(target.tmp, flags, 0o666)
    except FileNotFoundError:
        if not target.make_dirs:
            raise
        os.makedirs(os.path.dirname(target.tmp), exist_ok=True)
        return os.open(target.tmp, flags, 0o666)


def _pwrite_all(fd: int, data: memoryview, offset: int, path: str) -> None:
    try:
        while data:
            n = os.pwrite(fd, data, offset)
            if n <= 0:
                raise OSError(errno.EIO, f"pwrite wrote nothing at offset {offset}", path)
            data, offset = data[n:], offset + n
    except OSError as e:
        if e.filename is None:  # ENOSPC, EIO, ...: name the file
            raise OSError(e.errno, f"{e.strerror} (writing {len(data)} bytes at offset {offset})", path) from e
        raise


def _publish(target: FileTarget) -> None:
    """Move the finished temporary file to the target, then sync the folder."""
    path, tmp = target.path, target.tmp
    if target.overwrite:
        with contextlib.suppress(OSError):  # keep the replaced file's permissions
            os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
        os.replace(tmp, path)
    else:
        try:  # a hard link never replaces a file that appeared meanwhile
            os.link(tmp, path)
        except FileExistsError:
            raise exists_error(path, "appeared while it was being written") from None
        except OSError:  # no hard links on this file system
            if os.path.lexists(path):
                raise exists_error(path, "appeared while it was being written") from None
            os.replace(tmp, path)
        else:
            os.unlink(tmp)
    if target.sync_folder:
        _fsync_folder(os.path.dirname(path))


def _fsync_folder(folder: str) -> None:
    try:
        fd = os.open(folder or ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):  # some file systems refuse fsync on a folder
            os.fsync(fd)
    finally:
        os.close(fd)


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def exists_error(path: str, why: str = "exists") -> FileExistsError:
    msg = f"the target {why} and overwrite=False; pass overwrite=True to replace it"
    return FileExistsError(errno.EEXIST, msg, path)
