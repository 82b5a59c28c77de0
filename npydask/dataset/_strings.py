"""Strings packed into one buffer: the byte columns of :mod:`npydask.dataset.table`.

A column of strings is one ``bytes`` buffer and int64 end offsets (row ``i``
is ``data[ends[i-1]:ends[i]]``), encoded as UTF-8 with ``surrogateescape``
(what ``os.fsencode`` does on POSIX: file names that are not UTF-8 come back
byte for byte). Pure: no I/O, numpy only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ENCODING", "Strings", "encode", "gather", "human_bytes", "pack", "starts_of", "unpack"]

ENCODING = ("utf-8", "surrogateescape")
"""How names and strings are stored (``os.fsencode`` on POSIX, independent of the locale)."""


def encode(text: str, what: str) -> bytes:
    """``text`` as stored; ``ValueError`` naming ``what`` for a lone surrogate no name can hold."""
    try:
        return text.encode(*ENCODING)
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{what} {text!r} cannot be stored: it holds {e.object[e.start : e.end]!r}, "
            "which no file name or URL can hold; pass the name the listing gave"
        ) from e


def gather(buf: bytes, starts: np.ndarray, ends: np.ndarray) -> tuple[bytes, np.ndarray]:
    """The byte ranges ``[starts, ends)`` of ``buf`` packed one after another, and their new end offsets."""
    lens = ends - starts
    new_ends = np.cumsum(lens, dtype=np.int64)
    total = int(new_ends[-1]) if len(new_ends) else 0
    if total == 0:
        return b"", new_ends
    pos = np.arange(total, dtype=np.int64) + np.repeat(starts - (new_ends - lens), lens)
    return np.frombuffer(buf, np.uint8)[pos].tobytes(), new_ends


def pack(texts: Iterable[str], what: str) -> tuple[bytes, np.ndarray]:
    """Strings as one buffer and int64 end offsets (fast when they are ASCII: one encode for all)."""
    texts = list(texts)
    joined = "".join(texts)
    if joined.isascii():
        return joined.encode("ascii"), np.cumsum(np.fromiter(map(len, texts), np.int64, len(texts)))
    encoded = [encode(t, what) for t in texts]
    return b"".join(encoded), np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)))


def starts_of(ends: np.ndarray, base: int) -> np.ndarray:
    """Start offsets of the rows whose end offsets are ``ends``, the first starting at ``base``."""
    if not len(ends):
        return ends
    return np.concatenate((np.array([base], np.int64), ends[:-1]))


def unpack(buf: bytes, starts: np.ndarray, ends: np.ndarray) -> list[str]:
    """The strings ``buf[starts[i]:ends[i]]``, decoded (one decode for all when they are ASCII).

    Only the bytes between the first start and the last end are looked at,
    so a few rows of a large shared buffer (a table slice) cost their own bytes.
    """
    if not len(ends):
        return []
    lo, hi = int(starts.min()), int(ends.max())
    part = buf[lo:hi]
    a, b = (starts - lo).tolist(), (ends - lo).tolist()
    if part.isascii():
        text = part.decode("ascii")
        return [text[i:j] for i, j in zip(a, b)]
    return [part[i:j].decode(*ENCODING) for i, j in zip(a, b)]


@dataclass(frozen=True, eq=False)
class Strings:
    """A column of optional strings: one buffer, end offsets, and which rows are ``None``."""

    data: bytes
    ends: np.ndarray
    missing: np.ndarray | None = None
    """Bool per row, ``True`` where the value is ``None`` (``None``: no row is)."""
    base: int = 0
    """Where row 0 starts in ``data`` (non-zero in a slice, which shares its buffer)."""

    @classmethod
    def of(cls, values: Sequence[str | None], what: str) -> Strings:
        """Pack ``values`` (``None`` allowed)."""
        missing = np.fromiter((v is None for v in values), bool, len(values))
        data, ends = pack(("" if v is None else v for v in values), what)
        ends.flags.writeable = False
        if missing.any():
            missing.flags.writeable = False
            return cls(data, ends, missing)
        return cls(data, ends)

    def __len__(self) -> int:
        return len(self.ends)

    def starts(self) -> np.ndarray:
        """Where each row starts in :attr:`data`."""
        return starts_of(self.ends, self.base)

    def values(self, a: int, b: int) -> list[str | None]:
        """Rows ``a..b``."""
        out: list[str | None] = list(unpack(self.data, self.starts()[a:b], self.ends[a:b]))
        if self.missing is not None:
            for k in np.flatnonzero(self.missing[a:b]).tolist():
                out[k] = None
        return out

    def __getitem__(self, index: slice) -> Strings:
        """Rows ``a:b`` (step 1), sharing the buffer: O(1)."""
        a, b, _ = index.indices(len(self))
        b = max(a, b)
        base = self.base if a == 0 else int(self.ends[a - 1])
        return Strings(self.data, self.ends[a:b], None if self.missing is None else self.missing[a:b], base)

    def take(self, idx: np.ndarray) -> Strings:
        """Rows ``idx`` (any order, repeats allowed), re-packed."""
        data, ends = gather(self.data, self.starts()[idx], self.ends[idx])
        ends.flags.writeable = False
        missing = None if self.missing is None else self.missing[idx]
        return Strings(data, ends, None if missing is None or not missing.any() else missing)

    def digest(self, h: Any) -> None:
        """Feed a compact form (equal for equal values however sliced) to the hash ``h``."""
        t = self.take(np.arange(len(self)))
        h.update(t.data)
        h.update(np.ascontiguousarray(t.ends).tobytes())
        h.update(b"-" if t.missing is None else np.packbits(t.missing).tobytes())


def human_bytes(n: int) -> str:
    """A byte count in binary units, as the dataset's repr shows it.

    >>> human_bytes(512), human_bytes(1536), human_bytes(3 << 30)
    ('512 B', '1.5 KiB', '3.0 GiB')
    """
    size: float = n
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size} B"  # pragma: no cover
