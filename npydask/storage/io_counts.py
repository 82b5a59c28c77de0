"""Counting what reads of objects cost: requests, bytes, node-cache hits, throttled requests, hedges.

The object source records each range GET it sends and each read the node
cache served (:func:`record`) into every collector open in the calling
context (a :class:`contextvars.ContextVar`): :func:`collect` opens one for a
block of code. The request pools of :mod:`npydask.storage._stores` run each
job in the context that submitted it, and dask's threaded scheduler does
too, so the requests a compute makes on local threads land in the collector
of the block that started it. Reads in other processes (a cluster's workers)
are counted where they run: a Loader collects inside each batch's task and
returns the figures with the batch.

:func:`io_stats` is the public form: ``with npydask.io_stats() as s:
x.compute()`` fills ``s`` (an :class:`IoStats`) when the block exits.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, fields

__all__ = ["FIGURES", "IoStats", "collect", "io_stats", "record"]


@dataclass
class IoStats:
    """What the object reads of a block of code cost (filled when :func:`io_stats`' block exits).

    Attributes
    ----------
    requests : int
        Range GETs sent to object stores, hedges included (each retry of obstore's own is not counted apart).
    bytes_read : int
        Bytes of the answers used (a cancelled hedge's or loser's bytes are not counted).
    cache_hits : int
        Reads served wholly from the node cache (no request).
    cache_misses : int
        Reads through the node cache that fetched at least one byte run.
    cache_hit_bytes : int
        Bytes served from the node cache.
    throttled : int
        Requests that finally failed (after obstore's retries) with HTTP 503, ``SlowDown`` or a timeout.
    hedges : int
        Range GETs sent again because the first was not answered within the hedge delay (in ``requests``
        too; see the ``remote_hedge`` setting).
    hedges_won : int
        Hedges whose answer was the one used (the first request was cancelled).

    Examples
    --------
    >>> IoStats(requests=2, bytes_read=10)
    IoStats(requests=2, bytes_read=10, cache_hits=0, cache_misses=0, cache_hit_bytes=0, throttled=0, hedges=0, \
hedges_won=0)
    """

    requests: int = 0
    bytes_read: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    cache_hit_bytes: int = 0
    throttled: int = 0
    hedges: int = 0
    hedges_won: int = 0


FIGURES = tuple(f.name for f in fields(IoStats))
"""The figures an :class:`IoStats` holds, in order."""

_open: ContextVar[tuple[IoStats, ...]] = ContextVar("npydask_io_collectors", default=())
_lock = threading.Lock()


def record(
    *,
    requests: int = 0,
    bytes_read: int = 0,
    cache_hits: int = 0,
    cache_misses: int = 0,
    cache_hit_bytes: int = 0,
    throttled: int = 0,
    hedges: int = 0,
    hedges_won: int = 0,
) -> None:
    """Add these figures to every collector open in the calling context (nothing when none is).

    Examples
    --------
    >>> with collect() as counts:
    ...     record(requests=1, bytes_read=4096)
    >>> counts.requests, counts.bytes_read
    (1, 4096)
    """
    collectors = _open.get()
    if not collectors:
        return
    with _lock:
        for c in collectors:
            c.requests += requests
            c.bytes_read += bytes_read
            c.cache_hits += cache_hits
            c.cache_misses += cache_misses
            c.cache_hit_bytes += cache_hit_bytes
            c.throttled += throttled
            c.hedges += hedges
            c.hedges_won += hedges_won


@contextmanager
def collect() -> Iterator[IoStats]:
    """A collector of the figures recorded in this block (and in jobs it submits to npydask's pools).

    The collector is live: a read still running on another thread after the
    block ends may add to it. Collectors nest: an inner block's figures count
    in the outer one too.
    """
    counts = IoStats()
    token = _open.set((*_open.get(), counts))
    try:
        yield counts
    finally:
        _open.reset(token)


@contextmanager
def io_stats() -> Iterator[IoStats]:
    """The object-store figures of the computes in a ``with`` block: requests, bytes, node-cache hits, throttling.

    Counts the reads made in this process: on the calling thread, npydask's
    request threads and dask's local (threaded) scheduler. Reads on a
    cluster's worker processes are not counted here (a
    :class:`~npydask.loader.Loader` counts its batches' reads where they run:
    :meth:`~npydask.loader.Loader.stats`). Local files are not counted (they
    are read by the operating system's page cache, not requests).

    Yields
    ------
    IoStats
        Filled when the block exits: later reads do not change it.

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "a.npy"); np.save(p, np.arange(4))
    >>> with npydask.io_stats() as s:
    ...     _ = npydask.from_npy(p).sum().compute()
    >>> s.requests, s.cache_hits
    (0, 0)
    """
    shown = IoStats()
    with collect() as counts:
        try:
            yield shown
        finally:
            with _lock:
                for name in FIGURES:
                    setattr(shown, name, getattr(counts, name))
