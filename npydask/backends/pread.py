"""The ``pread`` backend: positional reads into a preallocated C-order buffer.

The reads themselves are the source's (:meth:`Source.read_opened
<npydask.storage.base.Source.read_opened>`): a local file's preads (spans
or scattered runs by the cost model, ``O_DIRECT`` with the ``direct_io``
setting), an object's range requests; one run planner,
:func:`npydask.storage.read_plan`, behind both.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from npydask._buffers import as_bytes
from npydask.backends.base import Backend, destination, finish
from npydask.config import ReadOptions
from npydask.plan.region import ReadPlan
from npydask.storage.base import OpenedFile, Source
from npydask.storage.local import LOCAL

__all__ = ["PreadBackend"]


class PreadBackend(Backend):
    """Positional reads (optionally ``O_DIRECT``) into a fresh C-order array, by the file's source."""

    name: ClassVar[str] = "pread"

    def read(
        self,
        f: OpenedFile,
        plan: ReadPlan,
        options: ReadOptions,
        out: np.ndarray | None = None,
        *,
        source: Source = LOCAL,
    ) -> np.ndarray:
        result, buffer = destination(plan, f.header.dtype, out)
        if plan.n_runs:
            source.read_opened(f, plan, as_bytes(buffer), options)
        return finish(result, buffer)
