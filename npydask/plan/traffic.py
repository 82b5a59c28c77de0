"""Pure planning of what reading a dataset sends to an object store: requests and bytes, before anything is read.

A traffic plan counts the requests that opening a dataset and each epoch of
reading it would send, from the same read plans the readers execute:

* a region of a file (a ROI, a chunk, a whole file read alone): its byte runs
  merged across gaps of at most ``remote_gap_bytes``
  (:func:`~npydask.plan.region.region_spans`, the rule of every region read),
  each span cut into range GETs of at most ``remote_part_bytes``
  (:func:`~npydask.plan.region.split_span`, as the object reader cuts them);
* the boxes of one file read together (a batch's or a look-ahead window's
  patches): their merged :class:`~npydask.plan.patch_runs.Spans`, cut the same way;
* a group of small objects read whole: one GET per object from byte 0;
* opening: one GET of the first ``remote_header_bytes`` of each object
  (more for a longer header, in 64 KiB blocks) and the pages of the listing.

:class:`Request` is one planned GET; :func:`count_traffic` adds up the
requests of each epoch into :class:`EpochTraffic` and the whole into a
:class:`TrafficPlan`, optionally through a model of the node cache's
``pin`` policy (:class:`PinModel`: extents are admitted until the cache is
full and kept; a read whose bytes are all held is a hit and sends nothing;
one partly held fetches only its missing runs). Prices turn the counts into
a cost. Nothing here touches a file or a store.

What a plan leaves out: retries (obstore's own, after timeouts and 5xx),
hedged requests (at most ``remote_hedge_budget`` of the requests), HEAD
requests of empty objects, and the listing's real page count (estimated as
one page per :data:`LIST_PAGE` objects listed).

Examples
--------
>>> import numpy as np
>>> from npydask.format.header import NpyHeader
>>> from npydask.plan.region import Box, plan_read
>>> s = RemoteSettings(gap_bytes=0, part_bytes=100, header_bytes=4096)
>>> h = NpyHeader((1, 0), (3, 100), np.dtype("u1"), False, 128, 300)
>>> region_requests("s3://b/a.npy", plan_read(h, Box((0, 0), (3, 50))), s)[:2]
[Request(obj='s3://b/a.npy', start=128, stop=178, whole=False), Request(obj='s3://b/a.npy', start=228, stop=278, \
whole=False)]
>>> plan = count_traffic([ObjectFacts("s3://b/a.npy", 428, 128)],
...                      [region_requests("s3://b/a.npy", plan_read(h, Box((0, 0), (3, 100))), s)], s)
>>> plan.open_header_requests, plan.epochs[0].range_gets, plan.epochs[0].bytes, plan.cost is None
(1, 3, 300, True)
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from npydask.plan.patch_runs import Spans
from npydask.plan.region import ReadPlan, region_spans, split_span
from npydask.plan.traffic_plan import EpochTraffic, Prices, TrafficPlan

__all__ = [
    "HEADER_BLOCK",
    "LIST_PAGE",
    "EpochTraffic",
    "ObjectFacts",
    "PinModel",
    "Prices",
    "RemoteSettings",
    "Request",
    "TrafficPlan",
    "check_cache_bytes",
    "count_traffic",
    "header_requests",
    "list_pages",
    "region_requests",
    "spans_requests",
]

HEADER_BLOCK = 64 * 1024
"""Bytes of each read of a header (or zip directory) past the first GET: a header longer than
``remote_header_bytes`` costs one more GET per 64 KiB block it reaches into."""

LIST_PAGE = 1000
"""Keys per page of a listing (S3's ``ListObjectsV2``, GCS and Azure give as many or more)."""


@dataclass(frozen=True)
class RemoteSettings:
    """The settings that shape an object's requests (``remote_gap_bytes``, ``remote_part_bytes``,
    ``remote_header_bytes``; ``max_span_bytes``, the longest span runs are merged into)."""

    gap_bytes: int = 64 * 1024
    part_bytes: int = 8 * 1024 * 1024
    header_bytes: int = 4096
    max_span_bytes: int = 1 << 30


class Request(NamedTuple):
    """One planned GET: bytes ``[start, stop)`` of object ``obj``; ``whole`` for a small object's GET from byte 0."""

    obj: str
    start: int
    stop: int
    whole: bool = False


class ObjectFacts(NamedTuple):
    """What opening an object reads: its name, size and where its payload starts (its header's length)."""

    obj: str
    size: int
    data_offset: int


def region_requests(obj: str, plan: ReadPlan, settings: RemoteSettings) -> list[Request]:
    """The range GETs a region read of ``plan`` sends: its spans (runs merged across gaps), each cut in parts."""
    if not plan.n_runs or not plan.nbytes:
        return []
    co, offsets = region_spans(plan, settings.gap_bytes, settings.max_span_bytes)
    return [
        Request(obj, at, at + n, False)
        for offset in offsets
        for at, n in split_span(offset, co.span_nbytes, settings.part_bytes)
    ]


def spans_requests(obj: str, spans: Spans, settings: RemoteSettings) -> list[Request]:
    """The range GETs a read of ``spans`` (many boxes of one file, merged) sends: each span cut in parts."""
    return [
        Request(obj, at, at + n, False)
        for offset, length in zip(spans.offsets.tolist(), spans.lengths.tolist())
        for at, n in split_span(offset, length, settings.part_bytes)
    ]


def header_requests(size: int, data_offset: int, header_bytes: int) -> tuple[int, int]:
    """GETs and bytes of reading one object's header when it is opened.

    One GET of the first ``header_bytes`` (the whole object when smaller);
    a header reaching past them costs one more GET per 64 KiB block.

    Examples
    --------
    >>> header_requests(1000, 128, 4096), header_requests(10**6, 128, 4096), header_requests(10**6, 5000, 4096)
    ((1, 1000), (1, 4096), (2, 69632))
    """
    first = min(size, header_bytes)
    gets, nbytes = 1, first
    if data_offset > first and size > first:
        for block in range(first // HEADER_BLOCK, (min(data_offset, size) - 1) // HEADER_BLOCK + 1):
            gets += 1
            nbytes += min((block + 1) * HEADER_BLOCK, size) - block * HEADER_BLOCK
    return gets, nbytes


def list_pages(objects: int, page: int = LIST_PAGE) -> int:
    """The pages of a listing of ``objects`` keys, estimated: ``ceil(objects / page)``, at least one.

    Examples
    --------
    >>> list_pages(0), list_pages(1000), list_pages(1001)
    (1, 1, 2)
    """
    return max(1, math.ceil(objects / page))


@dataclass
class PinModel:
    """The node cache's ``pin`` policy over planned requests: extents admitted until ``capacity`` bytes, then kept.

    :meth:`read` answers what a read of ``[start, stop)`` of an object must
    fetch (the runs no admitted extent holds) and admits each fetched run
    that still fits, as the cache does: an extent is the bytes a request
    fetched, never widened.

    Examples
    --------
    >>> m = PinModel(100)
    >>> m.read("a", 0, 60), m.read("a", 0, 60), m.read("a", 40, 120), m.held
    ([(0, 60)], [], [(60, 120)], 60)
    """

    capacity: int
    held: int = 0
    _extents: dict[str, list[tuple[int, int]]] = field(default_factory=dict)

    def read(self, obj: str, start: int, stop: int) -> list[tuple[int, int]]:
        """The runs of ``[start, stop)`` no extent holds (fetched, and admitted while they fit)."""
        have = self._extents.setdefault(obj, [])
        missing: list[tuple[int, int]] = []
        pos = start
        i = max(0, bisect.bisect_right(have, (start, math.inf)) - 1)
        while pos < stop:
            if i < len(have) and have[i][0] <= pos < have[i][1]:
                pos = have[i][1]
                i += 1
                continue
            if i < len(have) and have[i][1] <= pos:
                i += 1
                continue
            nxt = have[i][0] if i < len(have) else stop
            end = min(nxt, stop)
            missing.append((pos, end))
            pos = end
        for lo, hi in missing:
            self.admit(obj, lo, hi)
        return missing

    def admit(self, obj: str, start: int, stop: int) -> None:
        """Keep ``[start, stop)`` (bytes no extent holds yet) if it fits."""
        n = stop - start
        if n <= 0 or self.held + n > self.capacity:
            return
        self.held += n
        bisect.insort(self._extents.setdefault(obj, []), (start, stop))


def check_cache_bytes(value: int | str | None) -> int | None:
    """A node cache size: ``None``, an int >= 0, or text such as ``"10GiB"``; checked.

    Raises
    ------
    ValueError
        For a negative size, or text that is not a size.
    TypeError
        For anything else.

    Examples
    --------
    >>> check_cache_bytes("1 MiB"), check_cache_bytes(0), check_cache_bytes(None)
    (1048576, 0, None)
    """
    if value is None:
        return None
    if isinstance(value, str):
        from dask.utils import parse_bytes

        try:
            value = int(value) if value.strip().isdigit() else int(parse_bytes(value))
        except ValueError as e:
            raise ValueError(f"cache_bytes must be a size such as 10GiB or 1000000, found {value!r}") from e
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"cache_bytes must be a number of bytes (an int or text such as '10GiB'), found {value!r}")
    if value < 0:
        raise ValueError(f"cache_bytes must be >= 0 bytes, found {value!r}")
    return int(value)


def count_traffic(
    objects: Sequence[ObjectFacts],
    epochs: Iterable[Iterable[Request]],
    settings: RemoteSettings,
    *,
    listed: bool = True,
    cache_bytes: int | None = None,
    prices: Prices | None = None,
    first_epoch: int = 0,
) -> TrafficPlan:
    """Add up opening ``objects`` and each epoch's planned :class:`Request` into a :class:`TrafficPlan`.

    Parameters
    ----------
    objects : sequence of ObjectFacts
        The dataset's objects, as opening reads them.
    epochs : iterable of iterables of Request
        Each epoch's requests, in the order the reads send them (each may be a generator).
    settings : RemoteSettings
        ``header_bytes`` prices opening.
    listed : bool
        Whether opening lists the objects (a folder or prefix), else they were named.
    cache_bytes : int, optional
        Model a node cache of this many bytes under ``pin`` (:class:`PinModel`), empty before
        opening: objects read whole while opening (no larger than ``remote_header_bytes``) are
        admitted then, and every read is asked of it first.
    prices : Prices, optional
        Costs computed at these prices (``None``: no costs).
    first_epoch : int
        The number of the first epoch.
    """
    cache_bytes = check_cache_bytes(cache_bytes)
    model = None if cache_bytes is None else PinModel(cache_bytes)
    header_gets = header_bytes = 0
    for o in objects:
        gets, nbytes = header_requests(o.size, o.data_offset, settings.header_bytes)
        header_gets += gets
        header_bytes += nbytes
        if model is not None and 0 < o.size <= settings.header_bytes:
            model.admit(o.obj, 0, o.size)  # (an object the header's GET read whole is kept)
    pages = list_pages(len(objects)) if listed else 0
    done = []
    for k, requests in enumerate(epochs):
        done.append(_epoch(first_epoch + k, requests, model, prices))
    return TrafficPlan(
        len(objects),
        pages,
        header_gets,
        header_bytes,
        tuple(done),
        cache_bytes,
        prices,
        None if prices is None else prices.cost(gets=header_gets, lists=pages, nbytes=header_bytes),
    )


def _epoch(epoch: int, requests: Iterable[Request], model: PinModel | None, prices: Prices | None) -> EpochTraffic:
    gets = nbytes = whole = whole_bytes = hits = hit_bytes = 0
    for obj, start, stop, is_whole in requests:
        n = stop - start
        if n <= 0:
            continue
        if model is None:
            missing = [(start, stop)]
        else:
            missing = model.read(obj, start, stop)
            if not missing:
                hits += 1
                hit_bytes += n
                continue
            hit_bytes += n - sum(b - a for a, b in missing)
        if is_whole and missing == [(start, stop)]:
            whole += 1
            whole_bytes += n
            continue
        gets += len(missing)
        nbytes += sum(b - a for a, b in missing)
    cost = None if prices is None else prices.cost(gets=gets + whole, nbytes=nbytes + whole_bytes)
    return EpochTraffic(epoch, gets, nbytes, whole, whole_bytes, hits, hit_bytes, cost)
