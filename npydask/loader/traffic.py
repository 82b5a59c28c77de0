"""A loader's traffic plan: the requests of its epochs, listed from its plan and counted by :mod:`npydask.plan.traffic`.

The requests are the reads the loader's readers make, decided the same way
(nothing is read but a ``Foreground`` sampler's label index):

* whole-file batches (no sampler): each batch of the epoch's plan
  (:class:`~npydask.plan.sampling.EpochPlan`) read as one block of files
  (:func:`~npydask.dataset.traffic.group_requests`: small objects whole in
  one GET each, a ROI as merged range GETs);
* a sampler: the shard's batches of the epoch (the sampler's seeded order,
  dealt as the loader deals them), each batch's boxes from the bound sampler;
  with look-ahead windows (``prefetch >= 4``, no ``client``) the boxes of
  ``prefetch // 2`` batches grouped per file
  (:func:`~npydask.plan.lookahead.group_window`), otherwise batch by batch;
  each file's boxes merged into :class:`~npydask.plan.patch_runs.Spans`
  (:func:`~npydask.plan.patch_runs.plan_boxes`, as
  :func:`~npydask.reader.read_boxes` plans them), one request per span or
  ``remote_part_bytes`` part of one; a file cut to a ROI read box by box.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from npydask.dataset.multikey import pick
from npydask.dataset.traffic import group_requests, objects_of, remote_settings, view_requests
from npydask.loader.window import window_size
from npydask.plan.lookahead import group_window, windows
from npydask.plan.patch_runs import plan_boxes
from npydask.plan.patches import Patch
from npydask.plan.region import Box
from npydask.plan.sampling import check_int
from npydask.plan.traffic import (
    ObjectFacts,
    Prices,
    RemoteSettings,
    Request,
    TrafficPlan,
    check_cache_bytes,
    count_traffic,
    spans_requests,
)
from npydask.samplers.base import dataset_members

__all__ = ["loader_requests", "plan_loader"]


def plan_loader(
    loader: Any, epochs: int = 1, *, cache_bytes: int | str | None = None, prices: Any = None
) -> TrafficPlan:
    """:meth:`Loader.traffic_plan <npydask.Loader.traffic_plan>`: opening, then ``epochs`` epochs from ``loader.epoch``.

    Raises
    ------
    ValueError
        A ``Foreground`` sampler without its label index (see
        :meth:`~npydask.samplers.foreground.ForegroundBound.load_index`), a
        negative ``epochs`` or ``cache_bytes``, or a bad price.
    """
    epochs = check_int("epochs", epochs, 0)
    cache = check_cache_bytes(cache_bytes)
    found = Prices.of(prices)
    members = dataset_members(loader.dataset)
    first = next(iter(members.values()))
    settings = remote_settings(first)
    load_index = getattr(loader.bound, "load_index", None)
    if load_index is not None:
        load_index()  # (the draws' candidates, from the index only: no label is read)
    start = loader.epoch
    return count_traffic(
        _objects(members.values()),
        (loader_requests(loader, start + k, settings) for k in range(epochs)),
        settings,
        cache_bytes=cache,
        prices=found,
        first_epoch=start,
    )


def _objects(datasets: Any) -> list[ObjectFacts]:
    """The objects the datasets open, each once (the members of an ``.npz`` dataset share theirs)."""
    seen: dict[str, ObjectFacts] = {}
    for ds in datasets:
        for o in objects_of(ds):
            seen.setdefault(o.obj, o)
    return list(seen.values())


def loader_requests(loader: Any, epoch: int, settings: RemoteSettings) -> Iterator[Request]:
    """The GETs of epoch ``epoch`` of ``loader``, in the order its reads send them."""
    if loader.schedule is None:
        for indices in loader.plan.batches(epoch):
            views = pick(loader.dataset, indices.tolist())
            for block in views.values() if isinstance(views, dict) else [views]:
                yield from _batch_requests(block, settings)
        return
    schedule, bound = loader.schedule, loader.bound
    batches = schedule.epoch_batches()
    k = window_size(loader.prefetch) if loader.client is None else 0
    k = k if k >= 2 else 1
    members = dataset_members(loader.dataset)
    for window in windows(len(batches), k):
        patches = [
            bound.patches(epoch, batches[b].tolist(), seed=schedule.seed, shuffle=schedule.shuffle) for b in window
        ]
        yield from _window_requests(members, patches, bound.fill_value, settings)


def _batch_requests(views: Sequence[Any], settings: RemoteSettings) -> list[Request]:
    """A batch of whole files: one block where the shapes agree, else each file alone."""
    if len({v.shape for v in views}) == 1:
        return group_requests(views, Box.whole(views[0].shape), settings)
    out: list[Request] = []
    for v in views:
        out += view_requests(v, Box.whole(v.shape), settings)
    return out


def _window_requests(
    members: dict[str, Any], batches: list[list[Patch]], fill_value: Any, settings: RemoteSettings
) -> Iterator[Request]:
    """The reads of a window of batches: per member, each file's boxes merged (a ROI'd file box by box)."""
    groups = group_window(batches)
    for member in members.values():
        views = member.views
        for g in groups:
            view = views[g.file]
            ref = view.ref
            if view.roi is None:
                runs = plan_boxes(
                    ref.header,
                    g.boxes,
                    max_gap=settings.gap_bytes,
                    max_span=settings.max_span_bytes,
                    fill_value=fill_value,
                    source=ref.path,
                )
                yield from spans_requests(ref.path, runs.spans, settings)
                continue
            for box in g.boxes:
                yield from view_requests(view, _in_roi(view.shape, box), settings)


def _in_roi(shape: tuple[int, ...], patch: Any) -> Box:
    """A patch's part inside a ROI'd view (leading axes whole), as the sampler's ROI read takes it."""
    lead = len(shape) - len(patch.start)
    lo = [min(max(a, 0), n) for a, n in zip(patch.start, shape[lead:])]
    hi = [max(min(b, n), a) for b, n, a in zip(patch.stop, shape[lead:], lo)]
    return Box((0,) * lead + tuple(lo), tuple(shape[:lead]) + tuple(hi))
