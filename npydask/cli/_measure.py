"""Measuring a step where it runs: wall time, bytes read and peak anonymous memory.

The two counts come from Linux's ``/proc`` and are ``None`` where it lacks them:

- **bytes read**: the ``rchar`` line of ``/proc/self/io``, the kernel's count
  of the bytes its read calls (``read``, ``pread``, ``preadv``, ...) returned
  to this process, from any thread, from files and sockets alike, whether
  they came from the page cache or the disk. A memory mapping's pages are
  faulted in, not read, so they are not counted. Reading ``/proc/self/io``
  is itself a read call: its own bytes are measured and taken off.
- **peak memory**: ``RssAnon`` of ``/proc/self/status``, the resident
  anonymous memory of the process (what it allocated itself; the pages of a
  mapped file are page cache, counted as ``RssFile``), sampled every
  :data:`SAMPLE_S` seconds by a thread while the step runs (numpy releases
  the GIL while it reads and sums), and once more at the end. The figure is
  the peak above the value at the start of the run; memory freed before
  the run and still held by the allocator or npydask's buffer pool would
  hide what the step allocates again, so callers release it first (the
  ``before`` callable of :func:`measure`).

Examples
--------
>>> import os, tempfile
>>> p = os.path.join(tempfile.mkdtemp(), "f.bin")
>>> with open(p, "wb") as f:
...     _ = f.write(bytes(1 << 20))
>>> def read():
...     with open(p, "rb", buffering=0) as f:
...         return len(f.read())
>>> m = measure(read, runs=3)
>>> m.value, m.seconds > 0, m.bytes_read is None or m.bytes_read >= 1 << 20
(1048576, True, True)
"""

from __future__ import annotations

import gc
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["SAMPLE_S", "Measured", "anon_bytes", "bytes_read", "measure"]

SAMPLE_S = 0.001
"""How often the memory sampler reads ``/proc/self/status`` while a step runs."""


@dataclass(frozen=True)
class Measured:
    """What :func:`measure` found for one step.

    Attributes
    ----------
    seconds : float
        The median wall time of the measured runs.
    bytes_read : int or None
        The median bytes read per run (``rchar``); ``None`` without
        ``/proc/self/io``, and when memory is sampled (the sampler's own
        reads of ``/proc`` would count).
    peak_anon : int or None
        The largest rise of ``RssAnon`` over the runs; ``None`` unless asked
        for, or without ``/proc/self/status``.
    value : Any
        What the last run returned.
    """

    seconds: float
    bytes_read: int | None
    peak_anon: int | None
    value: Any


def _proc_field(path: str, name: str, scale: int) -> int | None:
    """The integer after ``name:`` in a ``/proc`` file, times ``scale``; ``None`` if absent."""
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key == name:
                    return int(rest.split()[0]) * scale
    except (OSError, ValueError, IndexError):
        return None
    return None


def bytes_read() -> int | None:
    """The bytes read calls have returned to this process so far (``rchar``), or ``None``."""
    return _proc_field("/proc/self/io", "rchar", 1)


def anon_bytes() -> int | None:
    """This process's resident anonymous memory now (``RssAnon``, bytes), or ``None``."""
    return _proc_field("/proc/self/status", "RssAnon", 1024)


class _PeakSampler:
    """Samples ``RssAnon`` on a thread between ``start()`` and ``stop()``; ``rise`` is the peak above the start."""

    def __init__(self) -> None:
        self.base = anon_bytes()
        self.peak = self.base
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="npydask-demo-memory", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(SAMPLE_S):
            self._sample()

    def _sample(self) -> None:
        now = anon_bytes()
        if now is not None and self.peak is not None and now > self.peak:
            self.peak = now

    def stop(self) -> int | None:
        self._done.set()
        self._thread.join()
        self._sample()
        return None if self.base is None or self.peak is None else self.peak - self.base


def _read_during(step: Callable[[], Any]) -> tuple[Any, float, int | None]:
    """``step()``, its wall time, and the bytes read during it (less the reads of the counter itself)."""
    r0 = bytes_read()
    r1 = bytes_read()  # r1 - r0: what one reading of the counter adds to it
    t0 = time.perf_counter()
    value = step()
    seconds = time.perf_counter() - t0
    r2 = bytes_read()
    if r0 is None or r1 is None or r2 is None:
        return value, seconds, None
    return value, seconds, max((r2 - r1) - (r1 - r0), 0)


def measure(
    step: Callable[[], Any],
    *,
    runs: int = 3,
    warm_up: bool = True,
    before: Callable[[], None] | None = None,
    memory: bool = False,
) -> Measured:
    """Run ``step`` ``runs`` times and return its median time and bytes read, and its peak memory.

    Parameters
    ----------
    step : callable
        The work, called with no arguments.
    runs : int
        How many measured runs (the median is reported).
    warm_up : bool
        Run ``step`` once, unmeasured, first (imports and first-call costs
        are not what is measured).
    before : callable, optional
        Called, unmeasured, before every run (warm-up included): to empty
        caches, so that every run does the whole work.
    memory : bool
        Sample ``RssAnon`` during every run (bytes read are then not counted).
    """
    if runs < 1:
        raise ValueError(f"runs must be at least 1, found {runs!r}")
    if warm_up:
        if before is not None:
            before()
        step()
    seconds: list[float] = []
    reads: list[int | None] = []
    rises: list[int | None] = []
    value = None
    for _ in range(runs):
        if before is not None:
            before()
        if memory:
            gc.collect()  # (garbage of earlier work freed during the run would hide the step's own rise)
            sampler = _PeakSampler()
            t0 = time.perf_counter()
            value = step()
            seconds.append(time.perf_counter() - t0)
            rises.append(sampler.stop())
            reads.append(None)
        else:
            value, took, nread = _read_during(step)
            seconds.append(took)
            reads.append(nread)
    known_reads = [r for r in reads if r is not None]
    known_rises = [r for r in rises if r is not None]
    return Measured(
        seconds=statistics.median(seconds),
        bytes_read=int(statistics.median(known_reads)) if len(known_reads) == runs else None,
        peak_anon=max(known_rises) if memory and len(known_rises) == runs else None,
        value=value,
    )
