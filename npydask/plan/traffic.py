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
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from npydask.plan.patch_runs import Spans
from npydask.plan.region import ReadPlan, region_spans, split_span

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


@dataclass(frozen=True)
class Prices:
    """Prices of a store, in any one currency: per 1,000 GET requests, per 1,000 LIST requests, per 10^9 bytes.

    A price left ``None`` counts as 0 (npydask builds in no price: take them from the provider's
    price list; transfer within a region is often free).

    Examples
    --------
    >>> Prices(get=0.0004, gb=0.09).cost(gets=10_000, nbytes=2 * 10**9)
    0.184
    """

    get: float | None = None
    list: float | None = None
    gb: float | None = None

    def __post_init__(self) -> None:
        for name in ("get", "list", "gb"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0 or math.isinf(value):
                raise ValueError(
                    f"the {name} price must be a finite number >= 0 (currency per "
                    f"{'10^9 bytes' if name == 'gb' else '1,000 requests'}), found {value!r}"
                )

    @classmethod
    def of(cls, value: Prices | dict[str, Any] | None) -> Prices | None:
        """``value`` as :class:`Prices`: a ``Prices``, a dict of ``"get"``, ``"list"``, ``"gb"``, or ``None``.

        Raises
        ------
        ValueError
            For another key, or a price that is not a finite number >= 0.
        TypeError
            For anything else.

        Examples
        --------
        >>> Prices.of({"get": 0.0004})
        Prices(get=0.0004, list=None, gb=None)
        """
        if value is None or isinstance(value, Prices):
            return value
        if not isinstance(value, dict):
            raise TypeError(f"prices must be a dict such as {{'get': 0.0004, 'gb': 0.09}} or None, found {value!r}")
        unknown = sorted(set(value) - {"get", "list", "gb"})
        if unknown:
            raise ValueError(
                f"prices takes the keys 'get' and 'list' (per 1,000 requests) and 'gb' (per 10^9 bytes), "
                f"found {unknown}"
            )
        return cls(**value)

    def cost(self, *, gets: int = 0, lists: int = 0, nbytes: int = 0) -> float:
        """The cost of ``gets`` GETs, ``lists`` LIST requests and ``nbytes`` bytes transferred."""
        total = (self.get or 0.0) * gets / 1000 + (self.list or 0.0) * lists / 1000 + (self.gb or 0.0) * nbytes / 1e9
        return round(total, 12)


@dataclass(frozen=True)
class EpochTraffic:
    """What one epoch sends.

    Attributes
    ----------
    epoch : int
        The epoch (0 first).
    range_gets, bytes : int
        Range GETs sent and their payload bytes (gap bytes of merged runs included).
    whole_object_gets, whole_object_bytes : int
        GETs of whole small objects (header and payload in one request) and their bytes.
    cache_hits, cache_hit_bytes : int
        Reads the node cache serves wholly (no request sent) and the bytes it serves;
        0 without ``cache_bytes``.
    cost : float or None
        What the epoch's requests and bytes cost at the plan's prices (``None`` without prices).
    """

    epoch: int
    range_gets: int = 0
    bytes: int = 0
    whole_object_gets: int = 0
    whole_object_bytes: int = 0
    cache_hits: int = 0
    cache_hit_bytes: int = 0
    cost: float | None = None

    @property
    def requests(self) -> int:
        """GETs sent: range and whole-object ones."""
        return self.range_gets + self.whole_object_gets

    @property
    def transferred(self) -> int:
        """Bytes sent by the store: ranges and whole objects."""
        return self.bytes + self.whole_object_bytes


_TOTALS = ("range_gets", "bytes", "whole_object_gets", "whole_object_bytes", "cache_hits", "cache_hit_bytes")


@dataclass(frozen=True)
class TrafficPlan:
    """What opening a dataset and each epoch of reading it send to the store, counted before any read.

    Made by ``loader.traffic_plan()``, ``ds.traffic_plan()`` and ``npydask plan``
    from the headers a dataset holds, the sampler's seeded order, the shards,
    the look-ahead windows and the remote settings. ``str()`` is a table;
    :meth:`to_dict` the same as plain values (``npydask plan --json``).

    Attributes
    ----------
    objects : int
        Objects the dataset holds (opening reads each one's header).
    open_list_pages : int
        LIST requests of opening, estimated as one page per 1,000 objects (0 where
        the files were named, not listed).
    open_header_requests, open_bytes : int
        GETs of opening (the headers) and the bytes they transfer.
    epochs : tuple of EpochTraffic
        One per epoch planned, in order.
    cache_bytes : int or None
        The node cache size the plan assumes (``pin`` policy), or ``None``: no cache.
    prices : Prices or None
        The prices the costs were computed with.
    open_cost : float or None
        What opening costs at ``prices``.

    Examples
    --------
    >>> plan = TrafficPlan(objects=2, open_list_pages=1, open_header_requests=2, open_bytes=256,
    ...                    epochs=(EpochTraffic(0, range_gets=4, bytes=4000),
    ...                            EpochTraffic(1, range_gets=4, bytes=4000)))
    >>> plan.range_gets, plan.bytes, plan.cost
    (8, 8000, None)
    >>> print(plan)  # doctest: +NORMALIZE_WHITESPACE
    traffic plan: 2 objects, 2 epochs, no node cache
    opening: 1 LIST page(s), 2 header GET(s), 256 B
    epoch  range GETs  bytes    whole-object GETs  whole-object bytes  cache hits  cost
    0      4           3.9 KiB  0                  0 B                 0           -
    1      4           3.9 KiB  0                  0 B                 0           -
    total  8           7.8 KiB  0                  0 B                 0           -
    """

    objects: int
    open_list_pages: int
    open_header_requests: int
    open_bytes: int
    epochs: tuple[EpochTraffic, ...] = ()
    cache_bytes: int | None = None
    prices: Prices | None = None
    open_cost: float | None = None

    @property
    def range_gets(self) -> int:
        """Range GETs of every epoch planned."""
        return sum(e.range_gets for e in self.epochs)

    @property
    def bytes(self) -> int:
        """Bytes of the range GETs of every epoch planned."""
        return sum(e.bytes for e in self.epochs)

    @property
    def whole_object_gets(self) -> int:
        """Whole-object GETs of every epoch planned."""
        return sum(e.whole_object_gets for e in self.epochs)

    @property
    def whole_object_bytes(self) -> int:
        """Bytes of the whole-object GETs of every epoch planned."""
        return sum(e.whole_object_bytes for e in self.epochs)

    @property
    def cache_hits(self) -> int:
        """Reads the node cache serves, over every epoch planned."""
        return sum(e.cache_hits for e in self.epochs)

    @property
    def cache_hit_bytes(self) -> int:
        """Bytes the node cache serves, over every epoch planned."""
        return sum(e.cache_hit_bytes for e in self.epochs)

    @property
    def cost(self) -> float | None:
        """Opening and every epoch at ``prices``; ``None`` without prices."""
        if self.open_cost is None:
            return None
        return round(self.open_cost + sum(e.cost or 0.0 for e in self.epochs), 12)

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain values (JSON-ready): the fields, the epochs as dicts, and the totals."""
        out: dict[str, Any] = {
            "objects": self.objects,
            "open_list_pages": self.open_list_pages,
            "open_header_requests": self.open_header_requests,
            "open_bytes": self.open_bytes,
            "open_cost": self.open_cost,
            "cache_bytes": self.cache_bytes,
            "prices": None if self.prices is None else asdict(self.prices),
            "epochs": [asdict(e) for e in self.epochs],
            "total": {name: getattr(self, name) for name in _TOTALS},
        }
        out["total"]["cost"] = self.cost
        return out

    def to_json(self) -> str:
        """:meth:`to_dict` as JSON text."""
        return json.dumps(self.to_dict())

    def __str__(self) -> str:
        cache = "no node cache" if self.cache_bytes is None else f"node cache {_size(self.cache_bytes)} (pin)"
        lines = [
            f"traffic plan: {self.objects} objects, {len(self.epochs)} epochs, {cache}",
            f"opening: {self.open_list_pages} LIST page(s), {self.open_header_requests} header GET(s), "
            f"{_size(self.open_bytes)}" + ("" if self.open_cost is None else f", cost {self.open_cost:.6g}"),
        ]
        head = ("epoch", "range GETs", "bytes", "whole-object GETs", "whole-object bytes", "cache hits", "cost")
        rows: list[tuple[str, ...]] = [head]
        for e in self.epochs:
            rows.append(
                _row(
                    str(e.epoch), e.range_gets, e.bytes, e.whole_object_gets, e.whole_object_bytes, e.cache_hits, e.cost
                )
            )
        rows.append(
            _row(
                "total",
                self.range_gets,
                self.bytes,
                self.whole_object_gets,
                self.whole_object_bytes,
                self.cache_hits,
                self.cost,
            )
        )
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        return "\n".join(lines)


def _row(
    name: str, gets: int, nbytes: int, whole: int, whole_bytes: int, hits: int, cost: float | None
) -> tuple[str, ...]:
    return (
        name,
        str(gets),
        _size(nbytes),
        str(whole),
        _size(whole_bytes),
        str(hits),
        "-" if cost is None else f"{cost:.6g}",
    )


def _size(n: int) -> str:
    """Bytes as people read them (binary units)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


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
