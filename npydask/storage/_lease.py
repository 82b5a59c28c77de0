"""Keeping a file's size while bytes are copied from its mapping: :func:`truncation_blocked`.

A process that touches a mapped page past the end of a file, because
another process truncated it, is killed by ``SIGBUS``; no check made before
the copy closes that window. A read lease (``fcntl(F_SETLEASE, F_RDLCK)``)
does: while it is held, no process can open the file for writing or
truncate it (the kernel holds such a call until the lease is given back,
and grants no lease while the file is open for writing). A copy from the
mapping is therefore made only under a lease; where none can be had (a file
open for writing elsewhere, another user's file without ``CAP_LEASE``, a
network file system, leases turned off), the caller reads with ``pread``
instead, which a truncation turns into a short read, not a signal.

Threads copying from the same open file share one lease, counted here per
process and per open file description (the members of one ``.npz``
archive are read through their archive's descriptor, so one member's copy
giving the lease back must not end another's); once a writer waits for it, no new copy joins it, so the writer is
held for at most the copies already under way. A lease belongs to an open
file description, which a forked child shares with its parent (one giving
the lease back would give back the other's): a child leases through a
descriptor of its own, opened on the same file (``/proc/self/fd``). The
lease breaker's notice is sent as ``SIGURG``, which a process ignores
unless it installed a handler for it (``SIGIO``, the default, would end the
process).
"""

from __future__ import annotations

import fcntl
import io
import os
import signal
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

from npydask.storage._handles import OpenFile

__all__ = ["truncation_blocked"]

_SETLEASE = getattr(fcntl, "F_SETLEASE", None)
_GETLEASE = getattr(fcntl, "F_GETLEASE", None)
_SETSIG = getattr(fcntl, "F_SETSIG", None)
_NOTICE = int(signal.SIGURG)
"""The signal a lease break is announced with: ignored unless the process handles it."""


class _Lease:
    """This process's lease on one open file: the descriptor it is taken on, and the copies under it."""

    __slots__ = ("fd", "copies", "own")

    def __init__(self, fd: int, own: io.FileIO | None) -> None:
        self.fd = fd
        self.copies = 0
        self.own = own
        """A descriptor opened for the lease (in a forked child), closed with this record."""


_guard = threading.Lock()
_leases: weakref.WeakKeyDictionary[io.FileIO, _Lease] = weakref.WeakKeyDictionary()
"""Keyed by the open file, not by its :class:`OpenFile`: the members of one ``.npz`` archive share its descriptor."""


def _forget_after_fork() -> None:
    """In a forked child: the parent's leases are not this process's (and a lock held at the fork stays held)."""
    global _guard, _leases
    _guard, _leases = threading.Lock(), weakref.WeakKeyDictionary()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


@contextmanager
def truncation_blocked(f: OpenFile) -> Iterator[bool]:
    """Hold a read lease on ``f`` for the ``with`` block; yields whether one is held.

    While it yields ``True`` no process can truncate the file, so its
    mapping can be copied from without the risk of ``SIGBUS``; on
    ``False`` the caller reads another way.

    Examples
    --------
    >>> import numpy as np, os, tempfile
    >>> from npydask.storage import acquire
    >>> p = os.path.join(tempfile.mkdtemp(), "a.npy"); np.save(p, np.zeros(4))
    >>> with truncation_blocked(acquire(p)) as held:
    ...     isinstance(held, bool)
    True
    """
    lease = _join(f)
    try:
        yield lease is not None
    finally:
        if lease is not None:
            _leave(lease)


def _join(f: OpenFile) -> _Lease | None:
    """Take the lease, or count one more copy under the lease already held (not one a writer waits for)."""
    if _SETLEASE is None or _GETLEASE is None or _SETSIG is None or not f.local:
        return None
    with _guard:
        lease = _leases.get(f.file)
        try:
            if lease is None:
                own = None if f.pid == os.getpid() else io.FileIO(f"/proc/self/fd/{f.fd}", "r")
                lease = _leases[f.file] = _Lease(f.fd if own is None else own.fileno(), own)
            if lease.copies:
                if fcntl.fcntl(lease.fd, _GETLEASE) != fcntl.F_RDLCK:  # (being broken: a writer waits for it)
                    return None
            else:
                fcntl.fcntl(lease.fd, _SETSIG, _NOTICE)  # (before the lease: giving a lease back resets it)
                fcntl.fcntl(lease.fd, _SETLEASE, fcntl.F_RDLCK)
        except OSError:  # EAGAIN (open for writing), EACCES (not the owner), EINVAL (no leases here)...
            return None
        lease.copies += 1
    return lease


def _leave(lease: _Lease) -> None:
    """One copy fewer under the lease; the last one gives it back."""
    with _guard:
        lease.copies -= 1
        if not lease.copies:
            try:
                fcntl.fcntl(lease.fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
            except OSError:  # (broken by the kernel after lease-break-time: nothing is held)
                pass
