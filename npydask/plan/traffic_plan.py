"""The values of a traffic plan: :class:`TrafficPlan`, one :class:`EpochTraffic` per epoch, and :class:`Prices`.

Made by :func:`npydask.plan.traffic.count_traffic` (see :mod:`npydask.plan.traffic` for what is
counted); frozen, comparable, printable as a table and as plain values (JSON).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["EpochTraffic", "Prices", "TrafficPlan"]


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
