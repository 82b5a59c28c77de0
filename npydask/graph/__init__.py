"""One-layer dask arrays over an npydask array-like, built directly for both of dask's array engines.

:func:`chunk_array` is the builder (:mod:`npydask.graph.build`); the engine
specific layers are in :mod:`npydask.graph._legacy` and
:mod:`npydask.graph._expr`, which both materialise their tasks with
:func:`chunk_tasks` (:mod:`npydask.graph.tasks`).
"""

from __future__ import annotations

from npydask.graph.build import chunk_array
from npydask.graph.tasks import chunk_tasks

__all__ = ["chunk_array", "chunk_tasks"]
