"""A sampler loader's look-ahead on prefetch threads: its next batches read together, in windows.

A sampler loader knows its epoch's order, so with ``prefetch=K`` (``K >= 4``)
and no ``client`` it reads its batches in *windows* of ``K // 2``
(:func:`window_size`) batches (:func:`~npydask.samplers.read.read_window`):
per file, every box those batches ask of it merged into one set of spans
(:func:`~npydask.plan.lookahead.group_window`), each box cut into its
batch's slot. Grid tiles of the same rows in consecutive batches then share
their per-plane spans, and overlapping rows are read once; random patches
plan the same spans as batch by batch.

The design is a window, not a claim scheme (the reader of batch ``g``
claiming the same file's boxes of ``g+1..g+K-1`` for later readers to wait
on): a window needs no cross-thread bookkeeping of claimed slots, its reads
are planned and issued in one call, and a random-patch epoch reads exactly
what it read batch by batch. Two windows are in flight (:data:`READING`),
each on its own thread, as two prefetch threads read two batches: local
reads are copies bound by a core each.

Bounds, with ``K = prefetch``:

* batches read ahead: at most ``K``, as without windows: the window being
  delivered and the one being read, ``K // 2`` batches each; the window
  after them is asked for once the first is delivered;
* requests in flight: those of two :func:`~npydask.reader.read_boxes_many`
  calls; for objects their range GETs share the store's one pool of
  ``remote_concurrency`` requests, whatever ``K``;
* memory: those ``K`` batches and two windows' span buffers;
* the first batch comes after the first window is read.

A window's reads are counted in its first batch's stats (each merged span
once); every batch counts its own ``patch_bytes``. The schedule counts only
delivered batches, so a state saved mid-window resumes at the first batch
not yet delivered. A read that fails is retried batch by batch, so the
error is raised at the batch whose read failed, after the batches before
it are delivered.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any, NamedTuple

import numpy as np

from npydask.samplers import BoundSampler, PatchBatch, read_patches
from npydask.samplers.read import read_window

__all__ = ["READING", "Failed", "WindowReader", "window_jobs", "window_size"]

READING = 2
"""Windows in flight, each read on its own thread (local reads are copies bound by a core each)."""


def window_size(prefetch: int) -> int:
    """Batches per window for a loader's ``prefetch``: ``prefetch // READING`` (below 2: no windows).

    Examples
    --------
    >>> [window_size(k) for k in (0, 2, 3, 4, 5, 8)]
    [0, 1, 1, 2, 2, 4]
    """
    return prefetch // READING


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
    fetch: Any, epoch: int, batches: Iterable[np.ndarray], k: int, depth: int = READING
) -> Iterator[PatchBatch]:
    """The batches of ``batches`` in order, read ``k`` at a time by ``fetch`` (a LocalFetch of ``depth`` threads).

    Up to ``depth`` windows are asked for at once, the window being
    delivered among them: the next is asked for once a window's batches are
    all delivered, so at most ``depth * k`` batches are read ahead. Windows
    are cut from ``batches`` as they are asked for (an iterator is taken a
    window at a time). The caller closes ``fetch``; windows not delivered
    are cancelled here.
    """
    if k < 1:
        raise ValueError(f"window_jobs needs k >= 1 batches a window, found k={k}")
    source = iter(batches)
    pending: deque[Any] = deque()
    try:
        while True:
            while len(pending) < depth and (job := list(islice(source, k))):
                pending.append(fetch.submit((epoch, job)))
            if not pending:
                return
            for one in fetch.result(pending[0]):
                if isinstance(one, Failed):
                    raise one.error
                yield one
            pending.popleft()
    finally:
        for future in pending:
            fetch.cancel(future)
