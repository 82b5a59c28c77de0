"""The node cache folder's entries as a scan finds them, and their removal (for bounds and upkeep).

Rules:

- An entry folder holds extent files named ``<offset>-<length>`` and a ``meta`` file (the
  object's URL without query, the object hash, its size and when the entry was made, CRC-32
  checked); a damaged ``meta`` reads as unknown, never as an error.
- Removing an extent gives its bytes back to the ledger only when this process's ``unlink``
  removed it, so two processes removing one file count it once.
"""

from __future__ import annotations

import json
import os
import threading
import time
import zlib
from dataclasses import dataclass

from .ledger import ENTRIES, Ledger, parse_extent_name, walk_entries

__all__ = [
    "UNUSED_S",
    "Entry",
    "pin_index",
    "read_meta",
    "remove_empty_fans",
    "remove_entry",
    "remove_extent",
    "scan",
    "write_meta",
]

UNUSED_S = 7 * 24 * 3600
"""Under ``pin``, entries unused this long are removed first when room is needed."""
_META = "meta"


def _crc(text: str) -> int:
    return zlib.crc32(text.encode())


def read_meta(efd: int) -> dict[str, object] | None:
    try:
        fd = os.open(_META, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=efd)
    except OSError:
        return None
    try:
        body = json.loads(os.read(fd, 1 << 16).decode())
        crc = body.pop("crc")
        if crc != _crc(json.dumps(body, sort_keys=True)):
            return None
        return dict(body)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)


def _write_small(efd: int, name: str, data: bytes) -> None:
    temp = f".tmp-{name}-{os.getpid()}-{threading.get_ident()}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600, dir_fd=efd)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.rename(temp, name, src_dir_fd=efd, dst_dir_fd=efd)


@dataclass(frozen=True)
class Entry:
    path: str
    object: str
    label: str
    created: float
    mtime: float
    extents: tuple[tuple[str, int, float], ...]

    @property
    def held(self) -> int:
        return sum(length for _, length, _ in self.extents)


def scan(dir_fd: int) -> list[Entry]:
    out = []
    for path in walk_entries(dir_fd):
        try:
            efd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dir_fd)
        except OSError:
            continue
        try:
            mtime = os.fstat(efd).st_mtime
            meta = read_meta(efd) or {}
            extents = []
            for name in os.listdir(efd):
                found = parse_extent_name(name)
                if found is None:
                    continue
                try:
                    extents.append((name, found[1], os.stat(name, dir_fd=efd, follow_symlinks=False).st_mtime))
                except OSError:
                    continue
        except OSError:
            continue
        finally:
            os.close(efd)
        created = meta.get("created")
        out.append(
            Entry(
                path,
                str(meta.get("object", path)),
                str(meta.get("label", "")),
                float(created) if isinstance(created, (int, float)) else 0.0,
                mtime,
                tuple(extents),
            )
        )
    return out


def pin_index(entries: list[Entry]) -> tuple[dict[str, list[Entry]], list[Entry]]:
    """Entries per object, and those ``pin`` lets go first: superseded versions, then the unused, oldest first."""
    by_object: dict[str, list[Entry]] = {}
    for e in entries:
        by_object.setdefault(e.object, []).append(e)
    old = time.time() - UNUSED_S
    superseded = [
        e for group in by_object.values() if len(group) > 1 for e in group if e.created < max(g.created for g in group)
    ]
    seen = {e.path for e in superseded}
    unused = sorted((e for e in entries if e.mtime < old and e.path not in seen), key=lambda e: e.mtime)
    return by_object, sorted(superseded, key=lambda e: e.mtime) + unused


def remove_extent(dir_fd: int, entry: str, name: str, length: int, ledger: Ledger) -> int:
    try:
        os.unlink(f"{entry}/{name}", dir_fd=dir_fd)
    except OSError:
        return 0
    ledger.give_back(length)
    return length


def remove_entry(dir_fd: int, entry: str, ledger: Ledger) -> int:
    """Remove an entry folder's extents and the folder; the bytes given back."""
    freed = 0
    try:
        efd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return 0
    try:
        names = os.listdir(efd)
    except OSError:
        names = []
    finally:
        os.close(efd)
    for name in names:
        found = parse_extent_name(name)
        if found is not None:
            freed += remove_extent(dir_fd, entry, name, found[1], ledger)
        else:
            try:
                os.unlink(f"{entry}/{name}", dir_fd=dir_fd)
            except OSError:
                pass
    try:
        os.rmdir(entry, dir_fd=dir_fd)
    except OSError:
        pass
    return freed


def remove_empty_fans(dir_fd: int) -> None:
    """Remove the entries' fan-out folders and their parent where empty (nothing else is touched)."""
    for fan in range(256):
        try:
            os.rmdir(f"{ENTRIES}/{fan:02x}", dir_fd=dir_fd)
        except OSError:
            pass
    try:
        os.rmdir(ENTRIES, dir_fd=dir_fd)
    except OSError:
        pass


def write_meta(efd: int, label: str, object_hash: str, size: int) -> None:
    """Write an entry's ``meta`` file where it has none (or a damaged one)."""
    if read_meta(efd) is not None:
        return
    body = {"label": label, "object": object_hash, "size": size, "created": time.time()}
    text = json.dumps(body, sort_keys=True)
    body["crc"] = _crc(text)
    _write_small(efd, _META, json.dumps(body, sort_keys=True).encode())
