"""The tasks of a one-layer read graph: one ``getter_nofancy`` task per chunk.

Both engines' layers (:mod:`npydask.graph._legacy`, :mod:`npydask.graph._expr`)
materialise their graphs with :func:`chunk_tasks`, and
:mod:`npydask.graph.build` checks them against ``from_array``'s.
"""

from __future__ import annotations

import itertools
from typing import Any

__all__ = ["chunk_tasks"]


def chunk_tasks(source: Any, chunks: tuple[tuple[int, ...], ...], name: str, inline: bool) -> dict[Any, Any]:
    """The materialised graph of :func:`chunk_array`: one getter task per chunk (and the source's key).

    Examples
    --------
    >>> tasks = chunk_tasks("SOURCE", ((2, 1),), "x", inline=True)
    >>> sorted(tasks)
    [('x', 0), ('x', 1)]
    >>> tasks[("x", 1)].args[1].value
    (slice(2, 3, None),)
    """
    from dask._task_spec import DataNode, Task, TaskRef
    from dask.array.core import getter_nofancy

    dsk: dict[Any, Any] = {}
    if inline:
        held: Any = DataNode(None, source)
    else:
        original = "original-" + name
        dsk[original] = DataNode(original, source)
        held = TaskRef(original)
    bounds = [list(itertools.accumulate(c, initial=0)) for c in chunks]
    for index in itertools.product(*(range(len(c)) for c in chunks)):
        key = (name, *index)
        slices = tuple(slice(b[i], b[i + 1], None) for i, b in zip(index, bounds))
        dsk[key] = Task(
            key, getter_nofancy, held, DataNode(None, slices), _data_producer=True, asarray=False, lock=False
        )
    return dsk
