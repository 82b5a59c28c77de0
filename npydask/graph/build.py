"""One-layer dask arrays over an npydask array-like, built directly for both of dask's array engines.

``dask.array.from_array`` spends most of its time on work npydask has already
done: it normalises the chunks four times, inspects ``getter``'s signature,
tokenizes the chunk grid and converts the meta twice. :func:`chunk_array`
builds the very graph ``from_array(source, chunks, name=name, fancy=False,
inline_array=inline, meta=meta, asarray=False)`` builds, with the same keys and
the same tasks, ``getter_nofancy(source, slices, asarray=False, lock=False)``:

- under dask's legacy engine, a ``HighLevelGraph`` of one lazy ``Blockwise``
  layer (plus the one-key layer holding the source when ``inline=False``), so
  ``optimize_blockwise`` fuses the reads with the operations after them and
  culling needs no materialised graph, exactly as for ``from_array``; the
  layer (:class:`npydask.graph._legacy.ReadLayer`) also materialises and culls
  its one kind of task directly, faster than dask's generic ``Blockwise``
  code at compute time (figures on the performance page);
- under array query planning (``DASK_ARRAY__QUERY_PLANNING=True``), an
  :class:`NpyChunks` expression whose ``_layer`` makes those tasks, named
  ``name`` (where ``from_array``'s expression ignores the name it is given).

The first call checks once, on a tiny array, that this graph equals what
``from_array`` builds in the running dask; where it differs (another dask
version changed these internals) every call goes through ``from_array``.
"""

from __future__ import annotations

import threading
from typing import Any

import dask.array as da
import numpy as np

__all__ = ["chunk_array", "query_planning"]

_builder: Any = None  # the function chunk_array calls, chosen on its first call
_choose_lock = threading.Lock()


def query_planning() -> bool:
    """Whether ``dask.array`` is dask's expression engine (array query planning), fixed at its import."""
    from dask.array.core import Array

    return da.Array is not Array


def chunk_array(
    source: Any,
    chunks: tuple[tuple[int, ...], ...],
    name: str,
    meta: Any,
    *,
    inline: bool = True,
) -> da.Array:
    """A dask array whose every chunk is ``source[slices]``, named ``name``.

    Parameters
    ----------
    source : array-like
        An npydask array-like (``shape``, ``dtype``, ``__getitem__`` with
        slices, ``__dask_tokenize__``): a few hundred bytes, no data.
    chunks : tuple of tuples of int
        Normalised chunks (what ``dask.array.core.normalize_chunks`` returns).
    name : str
        The array's name, already deterministic in the source and chunks.
    meta : array
        An empty array of the chunks' type and dtype.
    inline : bool
        Embed ``source`` in every task (``True``) or hold it under one key,
        ``"original-" + name``, that every task refers to.

    Returns
    -------
    dask.array.Array
        Equal, key for key and task for task, to
        ``from_array(source, chunks, name=name, fancy=False,
        inline_array=inline, meta=meta, asarray=False)``.
    """
    build = _builder or _choose_builder()
    return build(source, chunks, name, meta, inline)


def _direct_builder() -> Any:
    """This engine's direct build: an expression under query planning, a ``ReadLayer`` otherwise."""
    if query_planning():
        from npydask.graph._expr import new_array
    else:
        from npydask.graph._legacy import new_array
    return new_array


def _through_from_array(source: Any, chunks: Any, name: str, meta: Any, inline: bool) -> da.Array:
    return da.from_array(source, chunks=chunks, name=name, fancy=False, inline_array=inline, meta=meta, asarray=False)


def _choose_builder() -> Any:
    """The direct build where it gives ``from_array``'s graph in this dask, else ``from_array`` (once a process)."""
    global _builder
    with _choose_lock:
        if _builder is None:
            try:
                direct = _direct_builder()
                same = _same_as_from_array(direct)
            except Exception:  # another dask's internals: use its public constructor instead
                same = False
            _builder = direct if same else _through_from_array
    return _builder


class _Probe:
    """A tiny array-like for the one-time check against ``from_array``."""

    shape = (3, 2)
    dtype = np.dtype("f4")
    ndim = 2

    def __getitem__(self, index: Any) -> np.ndarray:
        return np.arange(6, dtype=self.dtype).reshape(self.shape)[index]

    def __dask_tokenize__(self) -> str:
        return "npydask.graph.build._Probe"

    def __repr__(self) -> str:
        return "_Probe()"


def _canonical(x: da.Array) -> dict[Any, Any]:
    """``x``'s graph with its name taken out of keys and references: what two builds must share.

    Each key maps to (function, arguments' reprs, keyword arguments, whether
    it produces data), or to the repr of the value it holds.
    """
    name = x.name
    names = {name: "NAME", "original-" + name: "ORIGINAL"}

    def plain(key: Any) -> Any:
        if isinstance(key, tuple) and key and key[0] in names:
            return (names[key[0]], *key[1:])
        return names.get(key, key) if isinstance(key, str) else key

    def argument(arg: Any) -> str:
        key = getattr(arg, "key", None)
        if type(arg).__name__ == "TaskRef":
            return f"ref {plain(key)!r}"
        return repr(getattr(arg, "value", arg))

    graph = x.__dask_graph__()
    out: dict[Any, Any] = {}
    layers = getattr(graph, "layers", None)  # (the legacy engine's HighLevelGraph)
    if layers is not None:
        kinds = {
            k: next(c.__name__ for c in type(v).__mro__ if c.__module__.startswith("dask.")) for k, v in layers.items()
        }
        out[("layers",)] = sorted((repr(plain(k)), kind) for k, kind in kinds.items())
    for key, task in dict(graph).items():
        func = getattr(task, "func", None)
        if func is None:
            out[plain(key)] = repr(getattr(task, "value", task))
        else:
            out[plain(key)] = (func, tuple(map(argument, task.args)), task.kwargs, task.data_producer)
    return out


def _same_as_from_array(build: Any) -> bool:
    """Whether ``build`` gives ``from_array``'s array (name, chunks, meta, tasks, culling, values) here."""
    source, meta = _Probe(), np.empty((0, 0), "f4")
    chunks = ((2, 1), (1, 1))
    for inline in (True, False):
        name = f"npydask-probe-{inline}"
        mine = build(source, chunks, name, meta, inline)
        theirs = _through_from_array(source, chunks, name, meta, inline)
        if mine.name != name or mine.chunks != theirs.chunks or type(mine._meta) is not type(theirs._meta):
            return False
        if _canonical(mine) != _canonical(theirs):
            return False
        values = source[:, :]
        for index in ((slice(None), slice(None)), (slice(1, None), 1), slice(0, 2)):  # the last two cull chunks
            if not np.array_equal(_computed(mine[index]), values[index]):
                return False
    return True


def _computed(x: da.Array) -> np.ndarray:
    """``x`` computed by dask's synchronous scheduler, called directly.

    (``x.compute(scheduler="sync")`` looks for a distributed client first and
    so imports ``distributed``, a large package read at a user's first
    ``from_npy``.)
    """
    import dask
    from dask.array.core import concatenate3
    from dask.local import get_sync

    def blocks(nested: Any) -> Any:
        return [blocks(n) for n in nested] if isinstance(nested, list | tuple) else nested

    (x,) = dask.optimize(x)
    keys = x.__dask_keys__()  # (nested lists, as compute passes them: get_sync's hint says flat)
    return concatenate3(blocks(get_sync(dict(x.__dask_graph__()), keys)))  # type: ignore[arg-type]  # dask's hint
