"""Host-to-device copies through a small, reused ring of pinned host buffers.

CuPy's ``alloc_pinned_memory`` draws from a pool that rounds every size up
to a power of two and never gives memory back, so a pinned buffer per read
(a 128 MiB chunk pins 256 MiB, per size, for the life of the process) grows
without bound. Here each thread keeps :data:`SLOTS` page-locked buffers of
:data:`SLOT_BYTES` for the life of the process and moves any amount through
them piece by piece: a piece is filled on the host (a ``pread``, a range
request, a ``memcpy``) while the previous one is still being copied to the
device, and a slot is refilled only once its copy has finished (an event per
slot). Nothing waits for the last copies: they are queued on the current
stream, before anything the caller queues after them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["SLOTS", "SLOT_BYTES", "upload", "upload_array"]

SLOTS = 2
"""Pinned buffers per thread: one filled on the host while the other is copied."""
SLOT_BYTES = 8 * 1024 * 1024
"""Size of each (a power of two: CuPy's pinned pool rounds up to one)."""

_local = threading.local()


class _Slot:
    __slots__ = ("buf", "event", "memory")

    def __init__(self, xp: Any) -> None:
        self.memory = xp.cuda.alloc_pinned_memory(SLOT_BYTES)
        self.buf = np.frombuffer(self.memory, np.uint8, SLOT_BYTES)
        self.event: Any = None  # the last copy out of this slot

    def ready(self) -> np.ndarray:
        """The buffer, once the copy last queued from it has finished."""
        if self.event is not None:
            self.event.synchronize()
            self.event = None
        return self.buf


def _ring(xp: Any) -> list[_Slot]:
    ring = getattr(_local, "ring", None)
    if ring is None:
        ring = _local.ring = [_Slot(xp) for _ in range(SLOTS)]
    return ring


def upload(xp: Any, dest: Any, fill: Callable[[np.ndarray, int], object]) -> int:
    """Fill ``dest`` (a 1-D contiguous ``uint8`` device array) piece by piece through the ring.

    ``fill(buf, at)`` writes bytes ``at .. at + buf.size`` of what ``dest``
    is to hold into ``buf`` (a slice of a pinned slot). Returns the number of
    pieces. The copies are queued on the current stream and not waited for.
    """
    nbytes = int(dest.size)
    ring = _ring(xp)
    pieces = 0
    for at in range(0, nbytes, SLOT_BYTES):
        n = min(SLOT_BYTES, nbytes - at)
        slot = ring[pieces % len(ring)]
        buf = slot.ready()[:n]
        fill(buf, at)
        dest[at : at + n].set(buf)  # (asynchronous: the slot is page-locked)
        event = getattr(xp.cuda, "Event", None)
        if event is None:  # (a stand-in without events: wait for the copy now)
            xp.cuda.get_current_stream().synchronize()
        else:
            slot.event = event(disable_timing=True)
            slot.event.record()
        pieces += 1
    return pieces


def upload_array(host: np.ndarray, xp: Any) -> Any:
    """A C-contiguous host array as a new device array, copied through the ring.

    Of ``xp`` only ``cuda.alloc_pinned_memory``, ``cuda.Event``, ``empty`` and
    ``ndarray.set`` are used: CuPy on a device, a stand-in in the CPU tests.
    """
    result = xp.empty(host.shape, dtype=host.dtype)
    if host.nbytes:
        src = host.reshape(-1).view(np.uint8)

        def fill(buf: np.ndarray, at: int) -> None:
            buf[...] = src[at : at + buf.size]

        upload(xp, result.reshape(-1).view(np.uint8), fill)
    return result
