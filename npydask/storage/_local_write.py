"""Writing local files: temporary names, whole ``pwrite`` loops, and publishing a finished file at once.

A file is written under a hidden temporary name beside its target
(:func:`temporary_name`: ``.<name>.<run>.npydask-tmp``), then moved over the
target by :func:`publish` (a rename, or a hard link where nothing may be
replaced) and its folder synced. The writer's chunk tasks
(:mod:`npydask.write._tasks`) and :class:`npydask.storage.local.LocalTarget` both write this way.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat

__all__ = [
    "NAME_MAX",
    "RUN_HEX",
    "TMP_SUFFIX",
    "check_inside",
    "exists_error",
    "fsync_folder",
    "new_run",
    "publish",
    "pwrite_all",
    "remove_quietly",
    "temporary_name",
]

TMP_SUFFIX = ".npydask-tmp"
"""Ending of every temporary file (never ``.npy``)."""

NAME_MAX = 255
"""Bytes in one file name (Linux, macOS and Windows file systems alike)."""

RUN_HEX = 16
"""Hex digits of the random id of one write call in its temporary names."""

_STEM_BYTES = NAME_MAX - len(b"..") - RUN_HEX - len(b".12345678") - len(TMP_SUFFIX)
"""Bytes of the target's name kept in a temporary name (room for the 8 digits of a task's own copy)."""


def new_run() -> str:
    """A fresh random id for one call's temporary file (shared by its retried tasks, never by two calls)."""
    return secrets.token_hex(RUN_HEX // 2)


def temporary_name(path: str, run: str) -> str:
    """The hidden temporary file beside ``path`` for the write call ``run``: ``.<name>.<run>.npydask-tmp``.

    The target's name is cut to :data:`_STEM_BYTES` bytes on a UTF-8
    character boundary, so the temporary name always fits ``NAME_MAX``.

    Raises
    ------
    OSError
        ``ENAMETOOLONG`` naming ``path`` when its name is over :data:`NAME_MAX` bytes.

    Examples
    --------
    >>> temporary_name("/data/a.npy", "0123abcd")
    '/data/.a.npy.0123abcd.npydask-tmp'
    """
    folder, name = os.path.split(path)
    return os.path.join(folder, f".{_stem(name, path)}.{run}{TMP_SUFFIX}")


def _stem(name: str, path: str) -> str:
    """The first :data:`_STEM_BYTES` bytes of ``name``, never splitting a UTF-8 character.

    Raises ``OSError(ENAMETOOLONG)`` naming ``path`` when ``name`` itself is
    over :data:`NAME_MAX` bytes.
    """
    raw = os.fsencode(name)
    if len(raw) > NAME_MAX:
        raise OSError(
            errno.ENAMETOOLONG,
            f"File name too long: {len(raw)} bytes, the file system allows {NAME_MAX}; use a shorter name",
            path,
        )
    if len(raw) <= _STEM_BYTES:
        return name
    cut = _STEM_BYTES
    while cut and raw[cut] & 0xC0 == 0x80:  # a UTF-8 continuation byte: back up to its lead byte
        cut -= 1
    return os.fsdecode(raw[:cut])


def check_inside(folder: str, root: str, path: str) -> None:
    """Refuse a folder whose real path (symlinks resolved) leaves ``root`` (a real path)."""
    real = os.path.realpath(folder)
    if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
        raise PermissionError(
            errno.EACCES,
            f"the file's folder resolves to {real!r}, outside the output folder {root!r} (a symbolic link "
            f"inside the output folder points out of it); not writing there: remove the link or pick another name",
            path,
        )


def pwrite_all(fd: int, data: memoryview, offset: int, path: str) -> None:
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


def publish(tmp: str, path: str, *, overwrite: bool, sync_folder: bool = True) -> None:
    """Move the finished file ``tmp`` to ``path``, then sync the folder.

    With ``overwrite=False``, only if nothing is at ``path``.
    """
    if overwrite:
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
    if sync_folder:
        fsync_folder(os.path.dirname(path))


def fsync_folder(folder: str) -> None:
    try:
        fd = os.open(folder or ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):  # some file systems refuse fsync on a folder
            os.fsync(fd)
    finally:
        os.close(fd)


def remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def exists_error(path: str, why: str = "exists") -> FileExistsError:
    msg = f"the target {why} and overwrite=False; pass overwrite=True to replace it"
    return FileExistsError(errno.EEXIST, msg, path)
