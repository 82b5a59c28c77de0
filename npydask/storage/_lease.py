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

Threads copying from the same open file share one lease (counted on the
:class:`~npydask.storage._handles.OpenFile`); once a writer waits for it,
no new copy joins it, so the writer is held for at most the copies already
under way. The lease breaker's notice is sent as ``SIGURG``, which a
process ignores unless it installed a handler for it (``SIGIO``, the
default, would end the process).
"""

from __future__ import annotations

import fcntl
import signal
from collections.abc import Iterator
from contextlib import contextmanager

from npydask.storage._handles import OpenFile

__all__ = ["truncation_blocked"]

_SETLEASE = getattr(fcntl, "F_SETLEASE", None)
_GETLEASE = getattr(fcntl, "F_GETLEASE", None)
_SETSIG = getattr(fcntl, "F_SETSIG", None)
_NOTICE = int(signal.SIGURG)
"""The signal a lease break is announced with: ignored unless the process handles it."""


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
    held = _join(f)
    try:
        yield held
    finally:
        if held:
            _leave(f)


def _join(f: OpenFile) -> bool:
    """Take the lease, or count one more copy under the lease already held (not one a writer waits for)."""
    if _SETLEASE is None or _GETLEASE is None or _SETSIG is None or not f.local:
        return False
    fd = f.fd
    with f.lock:
        try:
            if f.leases:
                if fcntl.fcntl(fd, _GETLEASE) != fcntl.F_RDLCK:  # (being broken: a writer waits for it)
                    return False
            else:
                fcntl.fcntl(fd, _SETSIG, _NOTICE)  # (before the lease: giving a lease back resets it)
                fcntl.fcntl(fd, _SETLEASE, fcntl.F_RDLCK)
        except OSError:  # EAGAIN (open for writing), EACCES (not the owner), EINVAL (no leases here)...
            return False
        f.leases += 1
    return True


def _leave(f: OpenFile) -> None:
    """One copy fewer under the lease; the last one gives it back."""
    with f.lock:
        f.leases -= 1
        if not f.leases:
            try:
                fcntl.fcntl(f.fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
            except OSError:  # (broken by the kernel after lease-break-time: nothing is held)
                pass
