"""Objects in S3, GCS, Azure and HTTP servers, through obstore: the :mod:`~npydask.storage.base` interfaces.

One :class:`ObjectSource` per store (``scheme://bucket`` plus
``storage_options`` and a snapshot of the remote settings: a
:class:`~npydask.storage._stores.StoreSpec`) serves every object of a
dataset; it pickles as its spec and finds its store again in whichever
process unpickles it.

Requests, per operation:

* a header: one range GET of the first ``remote_header_bytes`` (4 KiB), a
  second only for a longer header; its response gives the size and ETag (the
  identity), so opening a folder costs its LIST pages plus one GET per object,
  ``remote_concurrency`` in flight;
* a region: its byte runs coalesced across gaps under ``remote_gap_bytes``
  (64 KiB) by the same planner local reads use, spans longer than
  ``remote_part_bytes`` (8 MiB) split into parallel range GETs;
* a group of small objects: each whole object (header and payload) in one
  GET from byte 0, ``remote_concurrency`` in flight;
* an ``.npz`` member: the zip directory read by range (64 KiB blocks), a
  stored member by offset like a file, a deflated one inflated from ranges.

Every GET after the first carries ``If-Match`` with the ETag the object had
when it was opened, and every response's size and ETag are compared too
(plain HTTP servers ignore ``If-Match``): a replaced object fails with
:class:`~npydask.errors.FileChangedError` naming the URL. An object whose
server sends no ETag is refused when opened: ``Last-Modified`` has
one-second resolution and need not change when an object is replaced. The
``storage_options`` entry ``identity`` (:data:`~npydask.storage._stores.IDENTITY_MODES`) changes
that per store: ``"last-modified"`` accepts ``Last-Modified`` where there is
no ETag (compared, not sent), ``"none"`` compares sizes only.

An ``http(s)://`` URL's request target is sent as written and its
``user:password@`` as HTTP Basic auth (:func:`~npydask.storage.urls.http_target`).
"""

from __future__ import annotations

import errno
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from npydask import config
from npydask.cache.keys import EntryKey, cacheable
from npydask.config import ReadOptions
from npydask.errors import FileChangedError, warn
from npydask.format.header import NpyHeader, parse_header
from npydask.format.npz import Member
from npydask.plan.patch_runs import Spans
from npydask.plan.region import ReadPlan, split_span
from npydask.storage._headers import member_header, member_headers, npy_header
from npydask.storage._remote_errors import call
from npydask.storage._runs import read_plan
from npydask.storage._stores import (
    StoreSpec,
    check_not_forked,
    import_obstore,
    run_all,
    run_beside,
    run_each,
    run_files,
    store_for,
)
from npydask.storage.base import Identity, Item, OpenedFile, PieceReader, Scanned, Source
from npydask.storage.identity import HeaderCheck, ObjectIdentity, header_mismatch
from npydask.storage.io_counts import record
from npydask.storage.object_cache import cache_for, cache_on, entry_key, uncached_warning
from npydask.storage.requests import Answer, Policy, scheduler
from npydask.storage.urls import http_target, redact, split_url

if TYPE_CHECKING:
    from npydask.cache.node import NodeCache

__all__ = ["ObjectIdentity", "ObjectSource", "RemoteFile", "clear_sources", "source_for"]

_WARM_STREAK = 64
"""Reads served by the node cache in a row after which a stack's files are read in the calling thread."""

_FILES_KEPT = 8192
"""Objects and ``.npz`` members opened (headers, member places) a source remembers: a header and a few numbers each."""

_BLOCK = 64 * 1024
"""Read-ahead of a header's or zip directory's reads past the first GET."""


class ObjectSource(Source):
    """The objects of one store (see the module docs for the requests each operation makes).

    Paths are URLs (``s3://bucket/key``); keys are taken from them. Use
    :func:`source_for` to get the one object per spec of a process.
    """

    def __init__(self, spec: StoreSpec) -> None:
        self.spec = spec
        self._prefix = spec.base + "/"
        self._files: OrderedDict[tuple[str, ObjectIdentity, str | None], RemoteFile] = OrderedDict()
        self._keys: dict[tuple[str, ObjectIdentity], EntryKey] = {}
        self._mode = str(spec.option("identity", "etag"))
        self._streak = 0  # (reads served by the node cache in a row, lately; a heuristic, updated racily)
        s = spec.settings
        self._policy = Policy.of(s.hedge, s.hedge_budget, s.limit)

    # -- the interface --------------------------------------------------------------------------

    @property
    def mappable(self) -> bool:
        """Objects cannot be memory-mapped."""
        return False

    @property
    def concurrent(self) -> bool:
        """Requests to a store are sent many at once (each waits on the network)."""
        return True

    def display(self, path: str) -> str:
        """The URL without its query string (a presigned URL's signature) or user info."""
        return redact(path)

    def display_all(self, paths: list[str]) -> list[str]:
        """:meth:`display` of each URL."""
        return list(map(redact, paths))

    @property
    def gap_bytes(self) -> int:
        """The ``remote_gap_bytes`` setting (64 KiB by default)."""
        gap: int = config.get("remote_gap_bytes")
        return gap

    def identity(self, path: str) -> ObjectIdentity:
        """One HEAD request (through the request scheduler: :mod:`npydask.storage.requests`)."""
        store = self.store(path)
        import_obstore()
        meta = call(path, "asking for its size and ETag", scheduler().head, store, self.key(path), self._policy)
        return self.opened(path, meta)

    def opened(self, path: str, meta: Any) -> ObjectIdentity:
        """The identity of an object being opened, from its ``ObjectMeta``; refused where it tells nothing.

        Raises
        ------
        OSError
            For an object without an ETag (unless the store's ``identity`` is
            ``"last-modified"`` and it has a ``Last-Modified``, or ``"none"``).
        """
        mode = self.identity_mode
        identity = ObjectIdentity.of(meta, mode)
        if mode == "none" or identity.etag is not None or identity.modified is not None:
            return identity
        found = (
            "nor a Last-Modified date"
            if mode == "last-modified"
            else ("(Last-Modified has one-second resolution and need not change when an object is replaced)")
        )
        raise OSError(
            errno.EPROTO,
            f"the server sent no ETag {found}, so a replacement of the same size could not be told from the "
            "object opened, and would be read silently: npydask refuses it. Pass storage_options="
            "{'identity': 'last-modified'} to accept Last-Modified where there is no ETag (a replacement within "
            "the same second, or one that keeps the date, is then missed), or {'identity': 'none'} to turn "
            "identity checks off for this store (sizes only)",
            redact(path),
        )

    @property
    def identity_mode(self) -> str:
        """The store's ``identity`` option (see :data:`IDENTITY_MODES`)."""
        return self._mode

    def identities(self, paths: Sequence[str]) -> list[Identity]:
        """One HEAD per object, ``remote_concurrency`` in flight; the first failure raised."""
        found = run_each(self.identity, paths, self.spec.settings.concurrency)
        out: list[Identity] = []
        for result in found:
            if isinstance(result, BaseException):
                raise result
            out.append(result)
        return out

    def scan(self, paths: Sequence[str], key: str | None = None) -> list[Scanned | BaseException]:
        """Identity, header, raw header bytes and whether deflated, ``remote_concurrency`` objects at once."""
        return run_each(lambda p: self._scan(p, key), paths, self.spec.settings.concurrency)

    def scan_members(self, paths: Sequence[str], keys: Sequence[str]) -> list[list[Scanned] | BaseException]:
        """Per object: one GET of its head, the zip directory read once, every member's header; several at once."""

        def one(path: str) -> list[Scanned]:
            identity, read = self._head(path, keep=False)
            found = member_headers(read, identity.size, redact(path), keys)
            for k, (header, raw, member) in zip(keys, found):  # (kept: reading a member needs no zip directory)
                self._keep(RemoteFile(self, path, identity, header, raw, member), k)
            return [(identity, header, raw, not member.stored) for header, raw, member in found]

        return run_each(one, paths, self.spec.settings.concurrency)

    def open(
        self, path: str, expected: Any = None, *, key: str | None = None, check: HeaderCheck | None = None
    ) -> RemoteFile:
        """The object as a :class:`RemoteFile`.

        A plain ``.npy`` object whose identity is known and whose header
        bytes were read from it at that identity (``check.read_there``:
        every task of a dataset opened without an index) costs no request:
        each later read is conditional on the ETag, so the header bytes cannot
        differ from ``check``'s without the read failing. Otherwise its header
        is read (and an ``.npz`` member located), kept in a small per-process
        cache, and compared with ``check`` (a header from an index).
        """
        if (
            expected is not None
            and check is not None
            and check.read_there
            and key is None
            and expected.etag is not None
        ):
            header = parse_header(check.raw, source=redact(path))
            return RemoteFile(self, path, expected, header, check.raw, None)
        cache_key = (path, expected, key)
        hit = self._files.get(cache_key) if expected is not None else None
        if hit is None:
            ident, header, raw, member = self._read_header(path, key)
            if expected is not None and ident != expected:
                raise changed(path, expected, ident)
            hit = self._keep(RemoteFile(self, path, ident, header, raw, member), key)
        if check is not None and hit.raw != check.raw:
            raise header_mismatch(redact(path), check, hit.raw)
        return hit

    def _keep(self, f: RemoteFile, key: str | None) -> RemoteFile:
        """Remember ``f`` (an object or ``.npz`` member opened) for :meth:`open`, the oldest forgotten past
        ``_FILES_KEPT``."""
        self._files[(f.url, f.identity, key)] = f
        while len(self._files) > _FILES_KEPT:
            self._files.popitem(last=False)
        return f

    def read_runs(
        self,
        path: str,
        identity: Any,
        plan: ReadPlan,
        dest: np.ndarray,
        options: ReadOptions,
        check: HeaderCheck | None = None,
    ) -> None:
        """The run grid of ``plan`` by range GETs (coalesced, split, in parallel), each checked against ``identity``.

        A ``check`` not read from this object (an index's header, another
        object's with ``headers="first"``) is compared with the object's
        header (see :meth:`open`): its GET goes out beside the range GETs,
        so it costs no round trip of its own, unless this process read that
        header already.
        """

        def runs() -> None:
            read_plan(RangeReader(self, path, identity), plan, options, dest)

        if check is None or check.read_there or (path, identity, None) in self._files:
            if check is not None and not check.read_there:
                self.open(path, identity, check=check)  # (a cached header: compared here, no request)
            runs()
            return
        run_beside(lambda: self.open(path, identity, check=check), runs, self.spec.settings.concurrency)

    def read_opened(self, f: OpenedFile, plan: ReadPlan, dest: np.ndarray, options: ReadOptions) -> None:
        """The run grid of ``plan`` by range GETs, as :meth:`read_runs` (each conditional on ``f``'s ETag)."""
        opened = cast(RemoteFile, f)  # (a file this source opened)
        read_plan(RangeReader(self, opened.url, opened.identity), plan, options, dest)

    def read_spans(self, f: OpenedFile, spans: Spans, dest: np.ndarray, options: ReadOptions) -> int:
        """All spans' range GETs at once (longer ones split in ``remote_part_bytes`` parts), each conditional on
        ``f``'s ETag."""
        if not len(spans):
            return 0
        opened = cast(RemoteFile, f)  # (a file this source opened)
        return opened.range_reader().read_spans(dest, spans.offsets.tolist(), spans.lengths.tolist())

    def read_runs_many(self, jobs: Sequence[tuple[Any, ...]]) -> None:
        """:meth:`read_runs` of up to ``_FILES_AT_ONCE`` objects at once (their requests share the request pool)."""
        if self._streak >= _WARM_STREAK and self.node_cache() is not None:
            # (the node cache has served every read lately: its hits are CPU work, which threads only fight over)
            for job in jobs:
                self.read_runs(*job)
            return
        run_files(lambda job: self.read_runs(*job), jobs)

    def read_many(self, items: Sequence[Item], dest: memoryview, nbytes: int) -> None:
        """Each whole small object in one GET from byte 0, ``remote_concurrency`` at once; headers checked."""
        out = np.frombuffer(dest, np.uint8) if nbytes else None

        def one(i: int, data: memoryview | None = None) -> None:
            path, identity, offset, check = items[i]
            # (the items carry identities this source made: ObjectIdentity)
            if data is None:
                data = self._get(path, cast(ObjectIdentity, identity), 0, offset + nbytes, "reading the whole object")
            if check is not None and data[: len(check.raw)] != check.raw:
                raise header_mismatch(redact(path), check, bytes(data[: len(check.raw)]))
            if out is not None:
                out[i * nbytes : (i + 1) * nbytes] = np.frombuffer(data, np.uint8, nbytes, offset)

        pending: Sequence[int] = range(len(items))
        cache = self.node_cache()
        if cache is not None:  # (what the node cache holds is read here, without a pool thread each)
            keys = [
                (self._entry_key(path, identity) if cacheable(identity.etag) else None, 0, offset + nbytes)
                for path, identity, offset, _ in cast(Sequence[tuple[str, ObjectIdentity, int, Any]], items)
            ]
            pending = []
            hit_bytes = 0
            for i, data in enumerate(cache.serve_many(keys)):
                if data is None:
                    pending.append(i)
                else:
                    one(i, data)
                    hit_bytes += len(data)
            if len(pending) < len(items):
                record(cache_hits=len(items) - len(pending), cache_hit_bytes=hit_bytes)
        run_all(one, pending, self.spec.settings.concurrency)

    def range_read(self, path: str) -> tuple[_Blocks, int]:
        """A :data:`npydask.format.npz.Read` over the object as it is now (one HEAD), and its size.

        Reads are conditional on the ETag the HEAD found, in 64 KiB blocks
        (a zip directory's reads), larger pieces in one request each.
        """
        identity = self.identity(path)
        return _Blocks(self, path, identity, b""), identity.size

    @property
    def cache_in_use(self) -> bool:
        """Whether reads use a node cache in this process (``cache=`` given, or the ``cache`` setting)."""
        return cache_on(self.spec.cache)

    def warn_uncached(self, paths: Sequence[str], identities: Sequence[Identity]) -> None:
        """One :class:`~npydask.errors.NpyDaskWarning` where the node cache is on but objects cannot use it."""
        text = uncached_warning(self.identity_mode, paths, identities) if self.cache_in_use else None
        if text is not None:
            warn(text)

    def check_process(self, path: str) -> None:
        """Raise :class:`RuntimeError` in a child forked from a process that used obstore.

        See :func:`check_not_forked`.
        """
        check_not_forked(path)

    # -- helpers --------------------------------------------------------------------------------

    def store(self, url: str) -> Any:
        """The obstore store (built once per process; raises in a forked child, naming ``url``).

        An ``http(s)`` URL whose path the key form would change, or with a
        query string (a presigned or SAS URL), gets a store of its own whose
        base is the whole URL, so its target is sent verbatim with each
        request (and its key is ``""``); one with ``user:password@`` gets a
        store sending that Basic authorization.
        """
        check_not_forked(url)
        if self.spec.kind != "http":
            return store_for(self.spec)
        target = http_target(url)
        spec = self.spec if target.base == self.spec.base else self.spec._replace(base=target.base)
        if target.authorization is not None:
            spec = spec._replace(options=_with_header(spec.options, "Authorization", target.authorization))
        return store_for(spec)

    def key(self, url: str) -> str:
        """The object key ``url`` names in this store (for ``http(s)``: in :meth:`store`'s store for it)."""
        if self.spec.kind == "http":
            return http_target(url).key
        if url.startswith(self._prefix):
            return url[len(self._prefix) :]
        return split_url(url).key

    def _get(
        self,
        path: str,
        identity: ObjectIdentity | None,
        start: int,
        stop: int,
        what: str,
        into: memoryview | None = None,
        cached: bool = True,
        kept: list[tuple[int, bytes]] | None = None,
    ) -> memoryview:
        """Bytes ``start..stop`` of the object (conditional on ``identity``), checked: exactly that many.

        The one road of a read's range GETs. Through the node cache where it
        is on and the object may use it (:mod:`~npydask.storage.object_cache`):
        cached runs are taken from it, and only the missing runs are
        requested, each conditional and checked as without it (a replaced
        object fails every request made for it); a read wholly cached sends
        nothing and returns the version opened. ``into`` (``start..stop``
        long, format ``"B"``) receives the bytes and is returned.
        """
        cache = self._cache(identity) if cached else None
        if cache is None:
            data = self._request(path, identity, start, stop, what)[0]
            if into is None:
                return data
            into[:] = data
            return into
        assert identity is not None and identity.etag is not None
        out = memoryview(bytearray(stop - start)) if into is None else into
        key = self._entry_key(path, identity)

        def fetch(lo: int, hi: int) -> tuple[memoryview, bool]:
            data, exact = self._request(path, identity, lo, hi, what)
            if kept is None:
                return data, exact
            if exact:  # (held back: admitted by the caller once the whole was checked)
                kept.append((lo, bytes(data)))
            return data, False

        got = cache.read(key, start, stop, out, fetch, label=redact(path), wait_s=float(self.spec.settings.timeout))
        hit = got.fetches == 0
        record(cache_hits=int(hit), cache_misses=int(not hit), cache_hit_bytes=got.hit_bytes)
        return out

    def _cache(self, identity: ObjectIdentity | None) -> NodeCache | None:
        """The node cache for reads of an object at ``identity`` here, or ``None`` (off, or not cacheable)."""
        if identity is None or not cacheable(identity.etag):
            return None
        return self.node_cache()

    def node_cache(self) -> NodeCache | None:
        """This store's node cache here, or ``None`` (off, or objects identified otherwise than by ETag)."""
        if self._mode != "etag":
            return None
        return cache_for(self.spec.cache)

    def _entry_key(self, path: str, identity: ObjectIdentity) -> EntryKey:
        """The node cache's key of ``path`` at ``identity`` (kept: a read asks for it once per range)."""
        found = self._keys.get((path, identity))
        if found is None:
            assert identity.etag is not None
            if len(self._keys) > 100_000:
                self._keys.clear()
            found = self._keys[(path, identity)] = entry_key(self.spec.public(), path, identity.size, identity.etag)
        return found

    def _held(
        self, cache: NodeCache | None, path: str, identity: ObjectIdentity, start: int, stop: int, into: memoryview
    ) -> bool:
        """Fill ``into`` from ``cache`` (:meth:`node_cache`), in this thread, if it holds all of ``start..stop``.

        Whether it did. Reads served so send no request and wait on no pool thread; the rest go
        through :meth:`_get`.
        """
        if cache is None or not cacheable(identity.etag):
            return False
        if not cache.serve(self._entry_key(path, identity), start, stop, into):
            self._streak = 0
            return False
        record(cache_hits=1, cache_hit_bytes=stop - start)
        self._streak += 1
        return True

    def _request(
        self, path: str, identity: ObjectIdentity | None, start: int, stop: int, what: str
    ) -> tuple[memoryview, bool]:
        """One range GET of ``start..stop`` (conditional on ``identity``), checked; and whether it was exact.

        Exact: the response's range is the one requested and its identity
        the one opened (what the node cache may admit). A response whose
        size or ETag differs raises :class:`~npydask.errors.FileChangedError`.
        Sent through the request scheduler (:mod:`npydask.storage.requests`),
        which may hedge it: the same conditional request sent again.
        """
        import_obstore()
        options: dict[str, Any] = {"range": (start, stop)}
        if identity is not None and identity.etag is not None:
            options["if_match"] = identity.etag
        what = f"{what} (bytes {start}..{stop})"
        store, key = self.store(path), self.key(path)
        answer = call(path, what, scheduler().get, store, key, options, stop - start, self._policy)
        data, meta, got = memoryview(answer.data), answer.meta, answer.range
        _count(answer, len(data))
        if identity is not None:
            found = ObjectIdentity.of(meta, self.identity_mode)
            if found != identity:
                raise changed(path, identity, found)
        if len(data) != stop - start:
            raise FileChangedError(
                errno.EIO,
                f"expected {stop - start} bytes while {what}, the store sent {len(data)}: the object is "
                "shorter than when it was opened; open it again",
                redact(path),
            )
        return data, identity is not None and tuple(got) == (start, stop)

    def _read_header(self, path: str, key: str | None) -> tuple[ObjectIdentity, NpyHeader, bytes, Member | None]:
        """One GET of the first ``remote_header_bytes`` (more only when needed): identity, header, raw, member."""
        identity, read = self._head(path, keep=key is None)
        shown = redact(path)
        if key is None:
            header, raw = npy_header(read, identity.size, shown)
            return identity, header, raw, None
        header, raw, member = member_header(read, identity.size, shown, key)
        return identity, header, raw, member

    def _head(self, path: str, keep: bool) -> tuple[ObjectIdentity, _Blocks]:
        """One GET of the first ``remote_header_bytes``: the identity, and a reader over the object holding them.

        Not read through the node cache (opening asks the store what the object is now). With
        ``keep``, an object this GET read whole is admitted to it (a plain ``.npy``: an ``.npz``
        archive's members are kept only as their reads check them).
        """
        first = self.spec.settings.header_bytes
        import_obstore()
        store, key = self.store(path), self.key(path)

        def get() -> Answer | None:
            try:
                return scheduler().get(store, key, {"range": (0, first)}, first, self._policy)
            except Exception as e:
                if _unsatisfiable(e):
                    return None  # (an empty object: no range of it exists)
                raise

        found = call(path, "reading its header", get)
        if found is None:
            identity = self.identity(path)
            return identity, _Blocks(self, path, identity, b"", cached=False)
        data, meta, got = bytes(found.data), found.meta, found.range
        _count(found, len(data))
        identity = self.opened(path, meta)
        if keep and len(data) == identity.size and tuple(got) == (0, identity.size):
            self._admit_whole(path, identity, data)
        return identity, _Blocks(self, path, identity, data, cached=False)

    def _admit_whole(self, path: str, identity: ObjectIdentity, data: bytes) -> None:
        """Keep an object read whole while opening in the node cache (where it is on and the object may use it)."""
        if data:
            self._admit(path, identity, 0, data)

    def _admit(self, path: str, identity: ObjectIdentity, offset: int, data: bytes) -> None:
        """Keep bytes ``offset..`` of an object, checked by the caller, in the node cache (where it is on)."""
        cache = self._cache(identity)
        if cache is None:
            return
        key = self._entry_key(path, identity)
        out = memoryview(bytearray(len(data)))

        def fetch(lo: int, hi: int) -> tuple[memoryview, bool]:
            return memoryview(data)[lo - offset : hi - offset], True  # (the response the caller checked)

        stop = offset + len(data)
        cache.read(key, offset, stop, out, fetch, label=redact(path), wait_s=float(self.spec.settings.timeout))

    def _scan(self, path: str, key: str | None) -> Scanned:
        identity, header, raw, member = self._read_header(path, key)
        return identity, header, raw, member is not None and not member.stored

    def read_bytes(self, path: str, limit: int | None = None, *, what: str = "file") -> bytes:
        """One GET (a larger object than ``limit``: a range GET of its first ``limit`` bytes instead)."""
        obstore = import_obstore()
        store, key = self.store(path), self.key(path)

        def get() -> bytes:
            result = obstore.get(store, key)
            if limit is None or int(result.meta["size"]) <= limit:
                return bytes(result.bytes())
            return bytes(obstore.get_range(store, key, start=0, length=limit))

        return call(path, f"reading the {what}", get)

    def write_bytes(self, path: str, data: bytes, *, what: str = "file") -> None:
        """One PUT (the store publishes the object whole)."""
        obstore = import_obstore()
        call(path, f"writing the {what}", obstore.put, self.store(path), self.key(path), data)

    def __repr__(self) -> str:
        return f"ObjectSource({self.spec.public()!r})"

    def __reduce__(self) -> tuple[Callable[[StoreSpec], ObjectSource], tuple[StoreSpec]]:
        return source_for, (self.spec,)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectSource) and other.spec == self.spec

    def __hash__(self) -> int:
        return hash(self.spec)


_SOURCES: dict[StoreSpec, ObjectSource] = {}


def source_for(spec: StoreSpec) -> ObjectSource:
    """The one :class:`ObjectSource` of this process for ``spec`` (tasks unpickle to it)."""
    found = _SOURCES.get(spec)
    if found is None:
        found = _SOURCES.setdefault(spec, ObjectSource(spec))
    return found


def clear_sources() -> None:
    """Forget this process's sources and the headers they cached: the next open reads every header again.

    Their stores (connection pools) are kept. For measuring a cold open;
    readers never need it (a cached header is used only at the identity it
    was read at).
    """
    _SOURCES.clear()


def _with_header(options: tuple[tuple[str, Any], ...], name: str, value: str) -> tuple[tuple[str, Any], ...]:
    """``options`` (a :class:`StoreSpec`'s) with ``default_headers`` holding ``name: value`` too."""
    found = dict(options)
    headers = dict(found.get("default_headers", ()))
    headers[name] = value
    found["default_headers"] = tuple(sorted(headers.items()))
    return tuple(sorted(found.items()))


def _count(answer: Answer, nbytes: int) -> None:
    """Record a range GET's figures: every GET sent (a hedge too), the bytes of the answer used."""
    record(requests=answer.sent, bytes_read=nbytes, hedges=int(answer.hedged), hedges_won=int(answer.hedge_won))


def _unsatisfiable(e: BaseException) -> bool:
    """Whether obstore's ``e`` is a 416 (a range of an empty object)."""
    return "status code: 416" in str(e) and type(e).__module__.startswith("obstore")


def changed(path: str, expected: ObjectIdentity, found: ObjectIdentity) -> FileChangedError:
    """The error for an object whose size or ETag is not the one planned for."""
    return FileChangedError(
        errno.ESTALE,
        f"the object changed after it was opened: expected size {expected.size} and ETag {expected.etag} "
        f"(last modified {expected.modified}), found size {found.size} and ETag {found.etag} "
        f"(last modified {found.modified}); open it again to read its new contents",
        redact(path),
    )


class _Blocks:
    """A :data:`npydask.format.npz.Read` over an object: the first GET's bytes, then 64 KiB blocks, conditional.

    ``cached=False`` for the reads of opening (a header or zip directory):
    they ask the store, not the node cache.
    """

    def __init__(
        self, source: ObjectSource, path: str, identity: ObjectIdentity, first: bytes, cached: bool = True
    ) -> None:
        self.source, self.path, self.identity = source, path, identity
        self.first = first
        self.cached = cached
        self.blocks: dict[int, bytes] = {}

    def __call__(self, offset: int, n: int) -> bytes:
        size = self.identity.size
        n = min(n, max(size - offset, 0))
        if n <= 0:
            return b""
        if offset + n <= len(self.first):
            return self.first[offset : offset + n]
        if n > 4 * _BLOCK:  # (a deflated member's pieces: one request each, not cached)
            return bytes(
                self.source._get(
                    self.path, self.identity, offset, offset + n, "reading an .npz member", cached=self.cached
                )
            )
        out = []
        pos, end = offset, offset + n
        while pos < end:
            index = pos // _BLOCK
            block = self.blocks.get(index)
            if block is None:
                lo = index * _BLOCK
                block = self.blocks[index] = bytes(
                    self.source._get(
                        self.path,
                        self.identity,
                        lo,
                        min(lo + _BLOCK, size),
                        "reading a header or zip directory",
                        cached=self.cached,
                    )
                )
            lo = index * _BLOCK
            piece = block[pos - lo : end - lo]
            out.append(piece)
            pos += len(piece)
        return b"".join(out)


class RemoteFile:
    """An object opened for a backend: its URL, identity, header and (for ``.npz``) member.

    The object-store twin of :class:`~npydask.storage.OpenFile` (both are an
    :class:`~npydask.storage.base.OpenedFile`): ``read_at`` is a
    conditional range GET, its source's
    :meth:`~ObjectSource.read_opened` reads its runs, and there is nothing
    to close.
    """

    local = False
    """Never mapped (see :func:`npydask.reader.choose_backend`)."""

    def __init__(
        self,
        source: ObjectSource,
        path: str,
        identity: ObjectIdentity,
        header: NpyHeader,
        raw: bytes,
        member: Member | None,
    ) -> None:
        self.source = source
        self.path = redact(path)
        self.url = path
        self.identity = identity
        self.header = header
        self.raw = raw
        self.member = member

    @property
    def deflated(self) -> bool:
        """Whether this is a deflated ``.npz`` member (only inflating reads it)."""
        return self.member is not None and not self.member.stored

    def read_at(self, offset: int, n: int) -> bytes:
        """Up to ``n`` bytes at ``offset`` (fewer only at the end): one conditional range GET."""
        n = min(n, max(self.identity.size - offset, 0))
        if n <= 0:
            return b""
        # (a deflated member's pieces reach the node cache only through a whole read's piece_reader)
        unkept: list[tuple[int, bytes]] | None = [] if self.deflated else None
        return bytes(self.source._get(self.url, self.identity, offset, offset + n, "reading", kept=unkept))

    def range_reader(self) -> RangeReader:
        """A reader of this object's byte ranges (parallel conditional range GETs), for readers of spans."""
        return RangeReader(self.source, self.url, self.identity)

    def piece_reader(self) -> PieceReader:
        """A :meth:`read_at` whose fetched pieces reach the node cache only by :meth:`~PieceReader.keep`.

        For a deflated member read whole: its pieces are kept once its CRC-32 matched. What the
        cache holds already is served from it.
        """
        return _KeptPieces(self)

    def check_unchanged(self) -> None:
        """Nothing to do: every response was checked against the identity as it came."""


class _KeptPieces(PieceReader):
    """The pieces of one read of an object, fetched unkept, kept in the node cache on :meth:`keep`."""

    def __init__(self, f: RemoteFile) -> None:
        super().__init__(self._read)
        self.f = f
        self.fetched: list[tuple[int, bytes]] = []

    def _read(self, offset: int, n: int) -> bytes:
        f = self.f
        n = min(n, max(f.identity.size - offset, 0))
        if n <= 0:
            return b""
        return bytes(f.source._get(f.url, f.identity, offset, offset + n, "reading an .npz member", kept=self.fetched))

    def keep(self) -> None:
        """Admit every piece fetched exactly to the node cache (where it is on)."""
        for offset, data in self.fetched:
            self.f.source._admit(self.f.url, self.f.identity, offset, data)
        self.fetched.clear()


class RangeReader:
    """Reads byte ranges of one object into buffers: parts of at most ``remote_part_bytes``, in parallel.

    The remote twin of the pread backend's local reader (the same two
    methods), so one run-grid planner (:func:`npydask.storage.read_plan`)
    serves both.
    """

    def __init__(self, source: ObjectSource, url: str, identity: ObjectIdentity) -> None:
        self.source, self.url, self.identity = source, url, identity

    def read_into(self, dest: np.ndarray, offset: int) -> None:
        """Fill ``dest`` (``uint8``) from ``offset``."""
        self.read_many([[dest.data]], len(dest), [offset])  # (.data: the array's memoryview)

    def read_many(self, iovecs: Sequence[list[memoryview]], size: int, offsets: Sequence[int]) -> None:
        """Read ``size`` bytes at each offset into the matching ``[memoryview]``, all at once."""
        part = self.source.spec.settings.part_bytes
        jobs = []
        for bufs, offset in zip(iovecs, offsets):
            buf = bufs[0].cast("B") if bufs[0].format != "B" else bufs[0]
            for at, n in split_span(offset, size, part):  # (the split a traffic plan counts)
                jobs.append((buf[at - offset : at - offset + n], at))
        self._get_all(jobs)

    def read_spans(self, dest: np.ndarray, offsets: Sequence[int], lengths: Sequence[int]) -> int:
        """Read each ``lengths[k]`` bytes at ``offsets[k]`` into ``dest`` back to back, all at once; the GETs made."""
        part = self.source.spec.settings.part_bytes
        buf = dest.data
        jobs = []
        at = 0
        for offset, n in zip(offsets, lengths):
            for lo, k in split_span(offset, n, part):
                jobs.append((buf[at + lo - offset : at + lo - offset + k], lo))
            at += n
        self._get_all(jobs)
        return len(jobs)

    def _get_all(self, jobs: list[tuple[memoryview, int]]) -> None:
        """Each ``(buffer, offset)``: one conditional range GET filling it, ``remote_concurrency`` in flight."""
        source, url, identity = self.source, self.url, self.identity

        def one(job: tuple[memoryview, int]) -> None:
            buf, offset = job
            source._get(url, identity, offset, offset + len(buf), "reading a region", into=buf)

        cache = source.node_cache()
        pending = [job for job in jobs if not source._held(cache, url, identity, job[1], job[1] + len(job[0]), job[0])]
        run_all(one, pending, source.spec.settings.concurrency)
