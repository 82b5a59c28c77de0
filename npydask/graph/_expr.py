"""The expression behind :func:`npydask.graph.build.chunk_array` under dask's array query planning.

Imported only when query planning is on (``dask.array._array_expr`` is dask's
expression engine for arrays).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from dask._collections import new_collection
from dask.array._array_expr._io import IO
from dask.array.utils import meta_from_array

from npydask.graph.tasks import chunk_tasks

__all__ = ["NpyChunks", "new_array"]


class NpyChunks(IO):
    """A leaf expression: every chunk of an npydask array-like, read by one getter task.

    Its name is the ``array_name`` it is given (deterministic in the file and
    the arguments), not a token of its operands.
    """

    _parameters = ["array_name", "source", "chunks", "meta", "inline"]
    _defaults = {"inline": True}

    @cached_property
    def _name(self) -> str:
        return self.operand("array_name")

    @cached_property
    def _meta(self) -> Any:
        return meta_from_array(self.operand("meta"), dtype=self.source.dtype)  # (as from_array's expression)

    def _layer(self) -> dict[Any, Any]:
        return chunk_tasks(self.source, self.chunks, self._name, self.inline)

    def __str__(self) -> str:
        return f"NpyChunks({self._name})"


def new_array(source: Any, chunks: tuple[tuple[int, ...], ...], name: str, meta: Any, inline: bool) -> Any:
    """A query-planning dask array over ``source``, named ``name``."""
    return new_collection(NpyChunks(name, source, chunks, meta, inline, _determ_token=name))
