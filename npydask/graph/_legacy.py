"""The layer behind :func:`npydask.graph.build.chunk_array` under dask's legacy array engine.

A :class:`ReadLayer` is the ``Blockwise`` layer ``from_array`` makes (so
``optimize_blockwise`` fuses it with what follows, and culling needs no
materialised graph), built without ``from_array``'s bookkeeping and with two
shortcuts for its one shape of task: materialising it makes one getter task
per chunk directly, and culling it knows that a chunk depends on nothing but
the source's key (when the source is not inlined).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dask._task_spec import Task, TaskRef
from dask.array.core import Array, getter_nofancy
from dask.blockwise import Blockwise, blockwise_token
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from dask.layers import ArraySliceDep

from npydask.graph.tasks import chunk_tasks

__all__ = ["ReadLayer", "new_array"]

_TASK_ARGS = (TaskRef(blockwise_token(0)), TaskRef(blockwise_token(1)))


class ReadLayer(Blockwise):
    """``getter_nofancy(source, slices)`` for every chunk: ``graph_from_arraylike``'s layer, made quickly.

    Layers derived from it (culled to some chunks, fused with others, cloned)
    are plain ``Blockwise`` layers, built by dask from its attributes.
    """

    def __init__(self, name: str, source: Any, chunks: tuple[tuple[int, ...], ...], inline: bool) -> None:
        out_ind = tuple(blockwise_token(i, ".") for i in range(len(chunks)))
        slices = "slices-" + name  # (from_array names it tokenize(ArraySliceDep(chunks)): any unique name works)
        held = source if inline else TaskRef("original-" + name)
        task = Task(name, getter_nofancy, *_TASK_ARGS, _data_producer=True, asarray=False, lock=False)
        super().__init__(
            name,
            out_ind,
            task,
            [(held, None), (slices, out_ind)],
            numblocks={slices: tuple(map(len, chunks))},
            io_deps={slices: ArraySliceDep(chunks)},
        )
        self.source = source
        self.chunks = chunks
        self.inline = inline

    @property
    def _dict(self) -> dict[Any, Any]:
        cached = getattr(self, "_cached_dict", None)
        if cached is None:
            if self.output_blocks is not None:  # (dask's own culling keeps the class: let it build)
                return super()._dict
            dsk = chunk_tasks(self.source, self.chunks, self.output, self.inline)
            if not self.inline:
                del dsk["original-" + self.output]  # (that key is the other layer's)
            cached = self._cached_dict = {"dsk": dsk}
        return cached["dsk"]

    def cull(self, keys: Any, all_hlg_keys: Any) -> tuple[Any, Mapping[Any, set[Any]]]:
        name = self.output
        blocks = {key[1:] for key in keys if key[0] == name}
        if self.output_blocks is not None:
            return super().cull(keys, all_hlg_keys)
        needs = set() if self.inline else {"original-" + name}
        deps = {(name, *block): set(needs) for block in blocks}
        if len(blocks) == len(self):
            return self, deps
        return self._cull(blocks), deps


def new_array(source: Any, chunks: tuple[tuple[int, ...], ...], name: str, meta: Any, inline: bool) -> Array:
    """A legacy-engine dask array over ``source``, named ``name``."""
    layer = ReadLayer(name, source, chunks, inline)
    if inline:
        graph = HighLevelGraph({name: layer}, {name: set()})
    else:
        original = "original-" + name
        graph = HighLevelGraph(
            {original: MaterializedLayer({original: source}), name: layer},
            {original: set(), name: {original}},
        )
    return Array(graph, name, chunks, meta=meta, dtype=source.dtype)
