"""The ``pread`` backend: positional reads into a preallocated C-order buffer.

The reads themselves are the storage layer's: a local file's
(:func:`npydask.storage.read_local`: spans or scattered runs by the cost model,
``O_DIRECT`` with the ``direct_io`` setting) or an object's range requests
through its source's :meth:`~npydask.storage.base.Source.read_runs` (the
one run planner, :func:`npydask.storage.read_plan`, behind both).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from npydask._buffers import as_bytes
from npydask.backends.base import Backend, destination, finish
from npydask.config import ReadOptions
from npydask.plan.region import ReadPlan
from npydask.storage import OpenFile, read_local

__all__ = ["PreadBackend"]


class PreadBackend(Backend):
    """Positional reads (optionally ``O_DIRECT``) into a fresh C-order array."""

    name: ClassVar[str] = "pread"

    def read(self, f: OpenFile, plan: ReadPlan, options: ReadOptions, out: np.ndarray | None = None) -> np.ndarray:
        result, buffer = destination(plan, f.header.dtype, out)
        if plan.n_runs:
            if isinstance(f, OpenFile):
                read_local(f, plan, options, as_bytes(buffer))
            else:  # an object: its source's range requests (the run planner it shares with local files)
                f.source.read_runs(f.url, f.identity, plan, as_bytes(buffer), options)
        return finish(result, buffer)
