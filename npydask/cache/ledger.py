"""The node cache folder's shared state: its recorded settings, the ledger of bytes held, live processes.

Rules:

- The folder holds, beside the entries (``e/<2 hex>/<entry name>/``)::

      settings.json   {"format", "max_bytes", "policy", "crc"}: recorded when the folder is first used
      ledger          the bytes held and the hit figures (fixed binary, CRC-32 at its end)
      lock            the range locks of fetches (:mod:`.locks`); empty
      procs/<pid>-<token>   one per process using the folder, ``flock``\\ ed for that process's life

- :func:`record_settings` writes ``settings.json`` once (a temporary, then a link that fails if
  another process wrote it first); a process naming another ``max_bytes`` or ``policy`` gets
  ``ValueError`` naming both. A damaged record (its CRC-32 differs) is rewritten.
- The **ledger** counts the bytes of extents held. It is changed under its ``flock``: bytes are
  reserved before an extent is written and given back when the write fails or an extent is
  removed, so a crash can only leave it counting more than is held. It is recounted (every extent
  file's length, from its name) when it is missing or damaged, and when a dead process's
  registration is found: :func:`register` finds those (their ``flock`` is free), removes them and
  their temporaries, and recounts.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import struct
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from .locks import FileLock

__all__ = [
    "ENTRIES",
    "Counts",
    "Ledger",
    "RecordedSettings",
    "SettingsMismatch",
    "extent_name",
    "forget_settings",
    "parse_extent_name",
    "read_settings",
    "record_settings",
    "register",
    "walk_extents",
]

ENTRIES = "e"
_SETTINGS = "settings.json"
_LEDGER = "ledger"
_PROCS = "procs"
_TEMP = ".tmp-"
_LEDGER_FORMAT = struct.Struct("<8sQqqqq")  # magic, version, held, hits, misses, hit_bytes
_MAGIC = b"NPDXLED\x00"


def extent_name(offset: int, length: int) -> str:
    """The file name of the extent ``[offset, offset + length)`` in its entry folder.

    >>> extent_name(4096, 10), parse_extent_name("4096-10"), parse_extent_name(".tmp-x")
    ('4096-10', (4096, 10), None)
    """
    return f"{offset}-{length}"


def parse_extent_name(name: str) -> tuple[int, int] | None:
    """``(offset, length)`` of an extent file's name, or ``None`` for any other name."""
    head, sep, tail = name.partition("-")
    if not sep or not head.isdigit() or not tail.isdigit() or not head.isascii() or not tail.isascii():
        return None
    return int(head), int(tail)


@dataclass(frozen=True)
class RecordedSettings:
    """The bounds a folder was created with."""

    max_bytes: int
    policy: str


class SettingsMismatch(ValueError):
    """The folder records other bounds than the process names (a ``ValueError``)."""


def _encode_settings(found: RecordedSettings) -> bytes:
    body = {"format": 1, "max_bytes": found.max_bytes, "policy": found.policy}
    text = json.dumps(body, sort_keys=True)
    body["crc"] = zlib.crc32(text.encode())
    return json.dumps(body, sort_keys=True).encode()


def _decode_settings(data: bytes) -> RecordedSettings | None:
    try:
        body = json.loads(data.decode())
        crc = body.pop("crc")
        if crc != zlib.crc32(json.dumps(body, sort_keys=True).encode()) or body.get("format") != 1:
            return None
        return RecordedSettings(int(body["max_bytes"]), str(body["policy"]))
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        return None


def _read_small(dir_fd: int, name: str, limit: int = 1 << 16) -> bytes | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def _publish(dir_fd: int, name: str, data: bytes, *, replace: bool) -> bool:
    """Write ``data`` as ``name`` atomically; with ``replace=False`` only if ``name`` does not exist yet."""
    temp = f"{_TEMP}{name}-{os.getpid()}-{secrets.token_hex(6)}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
    try:
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if replace:
            os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            return True
        try:
            os.link(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            return True
        except FileExistsError:
            return False
    finally:
        try:
            os.unlink(temp, dir_fd=dir_fd)
        except OSError:
            pass


def record_settings(dir_fd: int, folder: str, wanted: RecordedSettings) -> None:
    """Record ``wanted`` in a new folder, or check it against what the folder records.

    Raises
    ------
    SettingsMismatch
        When the folder records another ``max_bytes`` or ``policy``.
    """
    for _ in range(3):
        found = _decode_settings(_read_small(dir_fd, _SETTINGS) or b"")
        if found is None:
            damaged = _read_small(dir_fd, _SETTINGS) is not None
            if _publish(dir_fd, _SETTINGS, _encode_settings(wanted), replace=damaged):
                return
            continue
        if found != wanted:
            raise SettingsMismatch(
                f"cache folder {folder!r} was created with max_bytes={found.max_bytes} and policy={found.policy!r}; "
                f"this process names max_bytes={wanted.max_bytes} and policy={wanted.policy!r}: use the same "
                f"values on every process of the node, or run `npydask cache clear {folder}` to start it afresh"
            )
        return


def read_settings(dir_fd: int) -> RecordedSettings | None:
    """The bounds the folder records, or ``None`` (none yet, or a damaged record)."""
    return _decode_settings(_read_small(dir_fd, _SETTINGS) or b"")


def forget_settings(dir_fd: int) -> None:
    """Remove the recorded bounds (the next process to use the folder records its own)."""
    try:
        os.unlink(_SETTINGS, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


@dataclass(frozen=True)
class Counts:
    """The ledger's figures."""

    held: int = 0
    hits: int = 0
    misses: int = 0
    hit_bytes: int = 0


class Ledger:
    """The folder's ledger file: bytes held and hit figures, changed under its ``flock``."""

    def __init__(self, dir_fd: int) -> None:
        self.dir_fd = dir_fd
        fd = os.open(_LEDGER, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
        self.fd = fd
        self.lock = FileLock(fd)

    def close(self) -> None:
        """Close the ledger file."""
        os.close(self.fd)

    def read(self) -> Counts | None:
        """The figures, or ``None`` when the ledger is new or damaged (call under :attr:`lock`)."""
        data = os.pread(self.fd, _LEDGER_FORMAT.size + 4, 0)
        if len(data) != _LEDGER_FORMAT.size + 4:
            return None
        (crc,) = struct.unpack_from("<I", data, _LEDGER_FORMAT.size)
        if crc != zlib.crc32(data[: _LEDGER_FORMAT.size]):
            return None
        magic, version, held, hits, misses, hit_bytes = _LEDGER_FORMAT.unpack_from(data)
        if magic != _MAGIC or version != 1 or min(held, hits, misses, hit_bytes) < 0:
            return None
        return Counts(held, hits, misses, hit_bytes)

    def write(self, counts: Counts) -> None:
        """Replace the figures (call under :attr:`lock`)."""
        body = _LEDGER_FORMAT.pack(_MAGIC, 1, counts.held, counts.hits, counts.misses, counts.hit_bytes)
        os.pwrite(self.fd, body + struct.pack("<I", zlib.crc32(body)), 0)

    def current(self) -> Counts:
        """The figures, recounted first when the ledger is new or damaged (call under :attr:`lock`)."""
        found = self.read()
        return self.recount() if found is None else found

    def recount(self, temporaries_of: frozenset[int] = frozenset()) -> Counts:
        """Count the bytes held again from the extent files' names, the hit figures kept (call under :attr:`lock`).

        Temporaries of the processes ``temporaries_of`` (dead ones) found on the way are removed.
        """
        old = self.read() or Counts()
        held = sum(length for _, _, length in walk_extents(self.dir_fd, temporaries_of))
        found = Counts(held, old.hits, old.misses, old.hit_bytes)
        self.write(found)
        return found

    def give_back(self, n: int) -> None:
        """Count ``n`` bytes fewer held (an extent removed, or a reservation not used); takes :attr:`lock`."""
        with self.lock:
            found = self.current()
            self.write(Counts(max(0, found.held - n), found.hits, found.misses, found.hit_bytes))


def _names(dir_fd: int, path: str) -> list[str]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return []
    try:
        return os.listdir(fd)
    except OSError:
        return []
    finally:
        os.close(fd)


def walk_entries(dir_fd: int) -> Iterator[str]:
    """The entry folders' paths (relative to the cache folder)."""
    for fan in sorted(_names(dir_fd, ENTRIES)):
        if len(fan) == 2:
            for name in _names(dir_fd, f"{ENTRIES}/{fan}"):
                if len(name) == 64:
                    yield f"{ENTRIES}/{fan}/{name}"


def walk_extents(dir_fd: int, temporaries_of: frozenset[int] = frozenset()) -> Iterator[tuple[str, int, int]]:
    """``(path, offset, length)`` of every extent file; temporaries of the processes ``temporaries_of`` removed."""
    for entry in walk_entries(dir_fd):
        for name in _names(dir_fd, entry):
            found = parse_extent_name(name)
            if found is not None:
                yield f"{entry}/{name}", found[0], found[1]
            elif name.startswith(_TEMP) and _temp_pid(name) in temporaries_of:
                try:
                    os.unlink(f"{entry}/{name}", dir_fd=dir_fd)
                except OSError:
                    pass


def _temp_pid(name: str) -> int | None:
    parts = name.rsplit("-", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def register(dir_fd: int, ledger: Ledger) -> int:
    """Register this process in the folder; clean up after dead ones. Returns the registration's descriptor.

    A dead process's registration (its ``flock`` is free) is removed with its temporaries, and the
    ledger recounted. The registration is made under a temporary name, locked, then renamed, so
    another process never takes a live one for dead.
    """
    try:
        os.mkdir(_PROCS, 0o700, dir_fd=dir_fd)
    except FileExistsError:
        pass
    dead: set[int] = set()
    for name in _names(dir_fd, _PROCS):
        if name.startswith("."):
            continue
        path = f"{_PROCS}/{name}"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dir_fd)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # (alive)
        try:
            pid = name.split("-")[0]
            if pid.isdigit():
                dead.add(int(pid))
            os.unlink(path, dir_fd=dir_fd)
        except OSError:
            pass
        finally:
            os.close(fd)
    token = secrets.token_hex(6)
    temp = f"{_PROCS}/.new-{os.getpid()}-{token}"
    fd = os.open(temp, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.rename(temp, f"{_PROCS}/{os.getpid()}-{token}", src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    _remove_stale_new(dir_fd)
    with ledger.lock:
        if dead or ledger.read() is None:
            ledger.recount(frozenset(dead))
            for name in _names(dir_fd, "."):
                if name.startswith(_TEMP) and _temp_pid(name) in dead:
                    try:
                        os.unlink(name, dir_fd=dir_fd)
                    except OSError:
                        pass
    return fd


def _remove_stale_new(dir_fd: int) -> None:
    """Registrations a process died before renaming (older than a minute, their lock free)."""
    for name in _names(dir_fd, _PROCS):
        if not name.startswith(".new-"):
            continue
        path = f"{_PROCS}/{name}"
        try:
            if time.time() - os.stat(path, dir_fd=dir_fd, follow_symlinks=False).st_mtime < 60:
                continue
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dir_fd)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.unlink(path, dir_fd=dir_fd)
        except OSError:
            pass
        finally:
            os.close(fd)
