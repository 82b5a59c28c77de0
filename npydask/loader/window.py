"""A sampler loader's look-ahead on prefetch threads: windows of ``prefetch`` batches read together.

A sampler loader knows its epoch's order, so with ``prefetch=K`` (``K >= 2``)
and no ``client`` it reads the next ``K`` batches as one *window*
(:func:`~npydask.samplers.read.read_window`): per file, every box those
batches ask of it merged into one set of spans
(:func:`~npydask.plan.lookahead.group_window`), each box cut into its
batch's slot. Grid tiles of the same rows in consecutive batches then
share their per-plane spans, and overlapping rows are read once; random
patches plan the same spans as batch by batch.

The design is a window, not a claim scheme (the reader of batch ``g``
claiming the same file's boxes of ``g+1..g+K-1`` for later readers to wait
on): a window needs no cross-thread bookkeeping of claimed slots, its
reads are planned and issued in one call, and a random-patch epoch reads
exactly what it read batch by batch. Two windows are read at once, on two
threads (:data:`READING`): local reads are copies bound by a core each, and
one reading thread ran random patches of local files at half the speed of
the two per-batch threads, the same bytes read.

Bounds, with ``K = prefetch``:

* requests in flight: those of two :func:`~npydask.reader.read_boxes_many`
  calls; for objects their range GETs share the store's one pool of
  ``remote_concurrency`` requests, never more whatever ``K``;
* memory: the window being delivered (at most ``K`` batches) and the two
  being read (``2K`` batches and their files' span buffers): at most ``3K``
  batches and two windows' spans;
* the first batch comes after the first window is read, alone; then
  windows ``w + 1`` and ``w + 2`` are read while window ``w``'s batches
  are consumed.

A window's reads are counted in its first batch's stats (each merged span
once); every batch counts its own ``patch_bytes``. The schedule counts
only delivered batches, so a state saved mid-window resumes at the first
batch not yet delivered. A read that fails is retried batch by batch, so
the error is raised at the batch whose read failed, after the batches
before it are delivered.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from npydask.plan.lookahead import windows
from npydask.samplers import BoundSampler, PatchBatch, read_patches
from npydask.samplers.read import read_window

__all__ = ["READING", "Failed", "WindowReader", "window_jobs"]

READING = 2
"""Windows read at once, each on its own thread (local reads are copies bound by a core each)."""


class Failed(NamedTuple):
    """A batch of a window whose read raised ``error`` (raised when that batch is due)."""

    error: BaseException


class WindowReader:
    """Reads a window of a sampler loader: ``(epoch, [positions, ...])`` to a list of PatchBatch (or Failed)."""

    def __init__(self, dataset: Any, bound: BoundSampler, seed: int | None, shuffle: bool) -> None:
        self.dataset, self.bound, self.seed, self.shuffle = dataset, bound, seed, shuffle

    def __call__(self, job: tuple[int, list[np.ndarray]], device: str) -> list[PatchBatch | Failed]:
        epoch, window = job
        batches = [self.bound.patches(epoch, p.tolist(), seed=self.seed, shuffle=self.shuffle) for p in window]
        try:
            return list(read_window(self.dataset, batches, self.bound, device=device))
        except Exception:  # (which batch's read failed: retried one by one, the error kept for that batch)
            done: list[PatchBatch | Failed] = []
            for patches in batches:
                try:
                    done.append(read_patches(self.dataset, patches, self.bound, device=device))
                except Exception as e:
                    done.append(Failed(e))
                    break
            return done


def window_jobs(
    fetch: Any, epoch: int, batches: list[np.ndarray], k: int, depth: int = READING
) -> Iterator[PatchBatch]:
    """The batches of ``batches`` in order, read ``k`` at a time by ``fetch`` (a LocalFetch of ``depth`` threads).

    The first window is read alone (the first batch waits for one window);
    from then on up to ``depth`` windows are read while the previous one's
    batches are delivered. The caller closes ``fetch``; windows not
    delivered are cancelled here.
    """
    jobs = [[batches[i] for i in w] for w in windows(len(batches), k)]
    pending: deque[Any] = deque(fetch.submit((epoch, job)) for job in jobs[:1])
    submitted = len(pending)
    try:
        for _ in range(len(jobs)):
            got = fetch.result(pending.popleft())
            while submitted < len(jobs) and len(pending) < depth:
                pending.append(fetch.submit((epoch, jobs[submitted])))
                submitted += 1
            for one in got:
                if isinstance(one, Failed):
                    raise one.error
                yield one
    finally:
        for future in pending:
            fetch.cancel(future)
