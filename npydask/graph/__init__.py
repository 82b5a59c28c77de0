"""One-layer dask arrays over an npydask array-like, built directly for both of dask's array engines.

:func:`chunk_array` is the builder (:mod:`npydask.graph.build`); the engine
specific layers are in :mod:`npydask.graph._legacy` and
:mod:`npydask.graph._expr`.
"""

from __future__ import annotations

from npydask.graph.build import chunk_array, chunk_tasks

__all__ = ["chunk_array", "chunk_tasks"]
