"""The requests reading a dataset sends, listed from the headers it holds: the input of a traffic plan.

:mod:`npydask.plan.traffic` counts requests; this module says which reads a
dataset's readers make, by the same decisions they take (nothing is read):

* :func:`group_requests`: a block of several files read together (a stack's
  chunk, a loader's batch of whole files), as
  :class:`~npydask.dataset.stacking.FileGroup` reads it: each plain file
  (no ROI, no ``.npz`` key) whose part is one run in one GET from byte 0
  (a whole object for a whole file), every other file a region read; a
  block of one file is a region read;
* :func:`stack_requests`: reading ``ds.stack()`` once (``ds.arrays()`` where
  the shapes differ), chunk by chunk as dask would;
* :func:`objects_of`, :func:`remote_settings`: what opening reads, and the
  settings the reads are shaped by (the store's own for objects; the
  current remote settings for local files, planned as if they were objects).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from npydask import config
from npydask.array import NpyFileArray
from npydask.dataset.stacking import joined_dtype, plain_run
from npydask.plan.region import Box, plan_read
from npydask.plan.sampling import check_int
from npydask.plan.traffic import (
    ObjectFacts,
    Prices,
    RemoteSettings,
    Request,
    TrafficPlan,
    check_cache_bytes,
    count_traffic,
    region_requests,
)
from npydask.storage.object import ObjectSource

__all__ = ["group_requests", "objects_of", "plan_dataset", "remote_settings", "stack_requests", "view_requests"]


def remote_settings(dataset: Any) -> RemoteSettings:
    """The settings ``dataset``'s reads are shaped by: its store's snapshot (objects), else the current settings."""
    views = dataset.views
    source = views.context.source
    options = views.context.options
    if isinstance(source, ObjectSource):
        s = source.spec.settings
        return RemoteSettings(options.gap_bytes, s.part_bytes, s.header_bytes, options.max_span_bytes)
    return RemoteSettings(
        int(config.get("remote_gap_bytes")),
        max(1, int(config.get("remote_part_bytes"))),
        max(64, int(config.get("remote_header_bytes"))),
        options.max_span_bytes,
    )


def objects_of(dataset: Any) -> list[ObjectFacts]:
    """Each file of ``dataset`` as opening reads it: name, size and header length."""
    table = dataset.table
    out = []
    for i, (path, identity, _, _) in enumerate(table.rows()):
        header = table.header(i)
        size = getattr(identity, "size", None)
        if not isinstance(size, int | np.integer):
            size = header.data_offset + header.nbytes
        out.append(ObjectFacts(path, int(size), header.data_offset))
    return out


def view_requests(view: NpyFileArray, box: Box, settings: RemoteSettings) -> list[Request]:
    """The range GETs of reading ``box`` (the view's coordinates) of one file: its part inside the file."""
    _, inside = view.file_box(box)
    if not inside.size:
        return []
    return region_requests(view.ref.path, plan_read(view.ref.header, inside), settings)


def group_requests(views: Sequence[NpyFileArray], inner: Box, settings: RemoteSettings) -> list[Request]:
    """The GETs of reading ``inner`` of each of ``views`` as one block (a stack's chunk, a batch of whole files).

    Several files: each plain file (no ROI, no ``.npz`` key, its part one run
    in the block's dtype) is one GET from byte 0 through its part (the whole
    object for a whole file), as the group's small-object loop reads it;
    others are region reads. One file is a region read.
    """
    if len(views) == 1:
        return view_requests(views[0], inner, settings)
    dtype = joined_dtype(views[0].dtype)
    out: list[Request] = []
    for view in views:
        ref = view.ref
        if view.roi is None and ref.key is None and not ref.options.direct_io:
            run = plain_run(ref.header, inner, dtype)
            if run is not None:
                out.append(Request(ref.path, 0, run[0] + run[1], True))
                continue
        out += view_requests(view, inner, settings)
    return out


def stack_requests(dataset: Any, settings: RemoteSettings) -> Iterator[Request]:
    """The GETs of computing ``dataset.stack()`` once (``dataset.arrays()`` where shapes differ), chunk by chunk."""
    views = dataset.views
    if len(set(dataset.shapes)) == 1:
        chunks = dataset.stack().chunks
        bounds = [np.cumsum((0, *c)).tolist() for c in chunks]
        for lo, hi in itertools.pairwise(bounds[0]):
            block = [views[k] for k in range(lo, hi)]
            for corner in itertools.product(*(list(itertools.pairwise(b)) for b in bounds[1:])):
                inner = Box(tuple(a for a, _ in corner), tuple(b for _, b in corner))
                yield from group_requests(block, inner, settings)
        return
    for i in range(len(dataset)):
        view = views[i]
        bounds = [np.cumsum((0, *c)).tolist() for c in dataset.array(i).chunks]
        for corner in itertools.product(*(list(itertools.pairwise(b)) for b in bounds)):
            yield from view_requests(view, Box(tuple(a for a, _ in corner), tuple(b for _, b in corner)), settings)


def plan_dataset(
    dataset: Any, epochs: int = 1, *, cache_bytes: int | str | None = None, prices: Any = None
) -> TrafficPlan:
    """:meth:`NpyDataset.traffic_plan <npydask.dataset.npy_dataset.NpyDataset.traffic_plan>`: opening, then
    ``epochs`` computes of the stack."""
    epochs = check_int("epochs", epochs, 0)
    settings = remote_settings(dataset)
    return count_traffic(
        objects_of(dataset),
        (stack_requests(dataset, settings) for _ in range(epochs)),
        settings,
        cache_bytes=check_cache_bytes(cache_bytes),
        prices=Prices.of(prices),
    )
