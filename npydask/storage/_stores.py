"""The per-process registry of object stores, their request pool, and the fork guard.

A :class:`StoreSpec` is what a task carries to reach a store: the URL's
``scheme://bucket``, the user's ``storage_options`` (a flat dict for
obstore's store constructor: its config keys and its client keys) and a
snapshot of the remote settings (timeouts, retries, concurrency, part size).
Each process builds the obstore store for a spec once, on first use
(:func:`store_for`), and runs requests on one thread pool per process
(:func:`run_all`): obstore's synchronous calls release the GIL, and a pool
of threads fetched small objects faster than as many coroutines on an event
loop (figures on the performance page).

obstore is not fork-safe: a child forked from a process that has used it
hangs on its first request, even with a new store. The first use records
the process id; a store asked for in another process that inherited that
record (a forked child) raises :class:`RuntimeError` naming the ``spawn``
and ``forkserver`` start methods instead of hanging.

obstore is imported here only, on first use: ``import npydask`` never
imports it, and without it a URL raises :class:`ImportError` with the
install command.
"""

from __future__ import annotations

import contextvars
import os
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from datetime import timedelta
from typing import Any, NamedTuple, TypeVar
from urllib.parse import urlsplit

from npydask import config
from npydask.cache.spec import CacheChoice
from npydask.errors import install_hint
from npydask.storage.urls import OBJECT_SCHEMES, redact

__all__ = [
    "CLIENT_KEYS",
    "RemoteSettings",
    "StoreSpec",
    "check_not_forked",
    "import_obstore",
    "run_all",
    "run_beside",
    "store_for",
]

T = TypeVar("T")
R = TypeVar("R")

CLIENT_KEYS = frozenset(
    (
        "allow_http",
        "allow_invalid_certificates",
        "connect_timeout",
        "default_content_type",
        "default_headers",
        "http1_only",
        "http2_only",
        "pool_idle_timeout",
        "pool_max_idle_per_host",
        "proxy_url",
        "proxy_ca_certificate",
        "proxy_excludes",
        "randomize_addresses",
        "read_timeout",
        "root_certificate",
        "timeout",
        "user_agent",
    )
)
"""``storage_options`` keys that go to obstore's ``client_options`` (every other key goes to its store config)."""

OWN_KEYS = frozenset(("identity",))
"""``storage_options`` keys npydask reads itself (never passed to obstore): see :data:`IDENTITY_MODES`."""

IDENTITY_MODES = ("etag", "last-modified", "none")
"""Values of ``storage_options["identity"]``: what tells an object from its replacement
(``"etag"``, the default: the ETag, required; ``"last-modified"``: the ETag, else ``Last-Modified``;
``"none"``: nothing but the size)."""

FSSPEC_KEYS = {
    "key": "'access_key_id'",
    "secret": "'secret_access_key'",
    "endpoint_url": "'endpoint'",
    "client_kwargs": "'endpoint' and 'region' as keys of their own (client_kwargs={'endpoint_url': ..., "
    "'region_name': ...} of s3fs)",
    "anon": "'skip_signature': True",
}
"""s3fs/fsspec ``storage_options`` names and obstore's keys for them."""

ENDPOINT_KEYS = frozenset(("endpoint", "aws_endpoint", "aws_endpoint_url", "google_service_endpoint", "azure_endpoint"))
"""``storage_options`` keys holding an endpoint URL (checked before obstore sees them: it panics on some)."""

PUBLIC_KEYS = ("endpoint", "region")
"""The only ``storage_options`` that enter a lazy array's name (with the bucket)."""

INSTALL = install_hint("obstore")


AUTO_POOL = 256
"""Threads of a request pool under ``remote_concurrency="auto"``: the controller's largest limit, so jobs wait on
the scheduler's limit, never on the pool."""


class RemoteSettings(NamedTuple):
    """The remote settings (:mod:`npydask.config`) as a task carries them."""

    connect_timeout: int
    timeout: int
    retries: int
    retry_timeout: int
    concurrency: int
    """Threads of the request pool (and jobs in flight): the ``remote_concurrency`` number, or
    :data:`AUTO_POOL` for ``"auto"`` (the scheduler limits the requests)."""
    part_bytes: int
    header_bytes: int
    limit: str | int = "auto"
    """The ``remote_concurrency`` setting: ``"auto"`` or a number of requests in flight per process."""
    hedge: str | float = "auto"
    """The ``remote_hedge`` setting: ``"auto"``, ``"off"`` or seconds."""
    hedge_budget: float = 0.03
    """The ``remote_hedge_budget`` setting."""

    @classmethod
    def current(cls) -> RemoteSettings:
        """A snapshot of the current settings."""
        get = config.get
        limit = get("remote_concurrency")
        return cls(
            get("remote_connect_timeout"),
            get("remote_timeout"),
            get("remote_retries"),
            get("remote_retry_timeout"),
            AUTO_POOL if limit == "auto" else max(1, limit),
            max(1, get("remote_part_bytes")),
            max(64, get("remote_header_bytes")),
            limit,
            get("remote_hedge"),
            get("remote_hedge_budget"),
        )


class StoreSpec(NamedTuple):
    """Everything needed to build one object store, in any process (hashable, small, picklable)."""

    base: str
    """``scheme://bucket`` (or ``scheme://host[:port]`` for ``http(s)``)."""
    options: tuple[tuple[str, Any], ...]
    """``storage_options`` as sorted ``(key, value)`` pairs (a dict value as sorted pairs too)."""
    settings: RemoteSettings
    cache: CacheChoice = None
    """The node cache reads use (:func:`npydask.cache.spec.cache_choice`): a
    :class:`~npydask.cache.spec.Cache`, ``False`` (off) or ``None`` (the ``cache`` setting where a task
    runs). Not part of the store: specs that differ only here share one store and connection pool."""

    @classmethod
    def of(cls, base: str, storage_options: dict[str, Any] | None, cache: CacheChoice = None) -> StoreSpec:
        """The spec for ``base`` with ``storage_options``, the current settings and the node-cache choice ``cache``.

        Raises
        ------
        TypeError
            If ``storage_options`` is not a dict of str keys.
        ValueError
            For s3fs/fsspec-style keys, an unknown ``identity`` or an endpoint that is no URL
            (see :func:`check_options`).
        """
        if storage_options is None:
            storage_options = {}
        if not isinstance(storage_options, dict) or not all(isinstance(k, str) for k in storage_options):
            raise TypeError(
                f"storage_options must be a dict of obstore store and client options with str keys "
                f"(e.g. {{'endpoint': 'http://127.0.0.1:8333', 'region': 'us-east-1'}}), "
                f"found {type(storage_options).__name__}"
            )
        check_options(base, storage_options)
        pairs = []
        for k, v in sorted(storage_options.items()):
            if isinstance(v, dict):
                v = tuple(sorted(v.items()))
            pairs.append((k.lower(), v))
        return cls(base, tuple(pairs), RemoteSettings.current(), cache)

    @property
    def kind(self) -> str:
        """``"s3"``, ``"gs"``, ``"az"`` or ``"http"``."""
        return OBJECT_SCHEMES[self.base.partition("://")[0].lower()]

    def public(self) -> str:
        """What may be shown and hashed into names: the base and the endpoint and region, never credentials."""
        shown = dict(self.options)
        extra = "".join(f"|{k}={redact(str(shown[k]))}" for k in PUBLIC_KEYS if k in shown)
        return f"{redact(self.base)}{extra}"  # (a URL's own store has the URL, query included, as its base)

    def option(self, name: str, default: Any = None) -> Any:
        """One of the ``storage_options``."""
        return dict(self.options).get(name, default)


def check_options(base: str, storage_options: dict[str, Any]) -> None:
    """Refuse what obstore would misread or panic on: s3fs/fsspec names, a bad ``identity``, a malformed endpoint.

    Raises
    ------
    ValueError
        Naming the key and what to pass instead (never a value that may be a credential).

    Examples
    --------
    >>> check_options("s3://b", {"endpoint": "http://127.0.0.1:8333", "identity": "etag"})
    >>> check_options("s3://b", {"key": "AK", "secret": "SK"})  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    ValueError: s3://b: storage_options are obstore's store options, not s3fs/fsspec's:
    use 'access_key_id' for 'key', ...
    """
    where = redact(base)
    names = {k.lower(): k for k in storage_options}
    fsspec = [f"{FSSPEC_KEYS[k]} for {names[k]!r}" for k in FSSPEC_KEYS if k in names]
    if fsspec:
        raise ValueError(
            f"{where}: storage_options are obstore's store options, not s3fs/fsspec's: use {', '.join(fsspec)}"
        )
    mode = storage_options.get(names.get("identity", "identity"), "etag")
    if mode not in IDENTITY_MODES:
        raise ValueError(
            f"{where}: storage_options['identity'] must be one of {', '.join(map(repr, IDENTITY_MODES))}, "
            f"found {mode!r}"
        )
    for k in ENDPOINT_KEYS & names.keys():
        check_endpoint(where, f"storage_options[{names[k]!r}]", storage_options[names[k]])


def check_endpoint(where: str, label: str, value: object) -> None:
    """Raise ``ValueError`` unless ``value`` is an ``http(s)://host[:port][/path]`` URL (no spaces, no controls).

    Examples
    --------
    >>> check_endpoint("s3://b", "storage_options['endpoint']", "http://127.0.0.1:8333")
    >>> check_endpoint("s3://b", "storage_options['endpoint']", "http://127.0.0.1: 8333")
    Traceback (most recent call last):
    ...
    ValueError: s3://b: storage_options['endpoint'] must be an endpoint URL such as 'http://127.0.0.1:8333' or ...
    """
    text = value if isinstance(value, str) else ""
    try:
        parts = urlsplit(text)
        fine = parts.scheme.lower() in ("http", "https") and bool(parts.hostname) and (parts.port or 0) >= 0
    except ValueError:  # (a port that is no number)
        fine = False
    if not fine or not text.isprintable() or any(c.isspace() for c in text):
        shown = repr(redact(text)) if isinstance(value, str) else type(value).__name__
        raise ValueError(
            f"{where}: {label} must be an endpoint URL such as 'http://127.0.0.1:8333' or "
            f"'https://s3.example.com' (a scheme and host, no spaces), found {shown}"
        )


_lock = threading.Lock()
_stores: dict[StoreSpec, Any] = {}
_pools: dict[tuple[int, str, int], ThreadPoolExecutor] = {}
_owner_pid: int | None = None
"""The process that first used obstore (a forked child inherits it and must not use obstore)."""


def import_obstore() -> Any:
    """The ``obstore`` module, or ``ImportError`` with the install command."""
    try:
        import obstore
    except ImportError as e:
        raise ImportError(
            f"reading or writing object-store URLs (s3://, gs://, az://, http(s)://) needs obstore: {INSTALL}"
        ) from e
    return obstore


def check_not_forked(url: str) -> None:
    """Raise if this process was forked from one that already used obstore (it would hang).

    Raises
    ------
    RuntimeError
        In such a forked child, naming ``url`` and the start methods to use.
    """
    global _owner_pid
    pid = os.getpid()
    if _owner_pid is None:
        _owner_pid = pid
    elif _owner_pid != pid:
        raise RuntimeError(
            f"{redact(url)}: this process was forked from one that had already used the object store client "
            f"(obstore, process {_owner_pid}), which is not fork-safe: a request here would hang. Start worker "
            "processes with the 'spawn' or 'forkserver' method instead, e.g. "
            "DataLoader(..., multiprocessing_context='spawn') or multiprocessing.set_start_method('forkserver')"
        )


def store_for(spec: StoreSpec) -> Any:
    """The obstore store for ``spec`` in this process (built on first use).

    Raises
    ------
    ImportError
        Without obstore.
    RuntimeError
        In a forked child (see :func:`check_not_forked`).
    ValueError
        If obstore refuses a ``storage_options`` key or value.
    """
    check_not_forked(spec.base)
    if spec.cache is not None:
        spec = spec._replace(cache=None)  # (the cache choice is not the store's: one pool whatever it is)
    found = _stores.get(spec)
    if found is not None:
        return found
    with _lock:
        found = _stores.get(spec)
        if found is None:
            found = _stores[spec] = _build(spec)
    return found


def _build(spec: StoreSpec) -> Any:
    import_obstore()
    from obstore.store import from_url

    store_config: dict[str, Any] = {}
    client: dict[str, Any] = {}
    for k, v in spec.options:
        if k in OWN_KEYS:
            continue
        if k == "default_headers" and isinstance(v, tuple):
            v = dict(v)
        (client if k in CLIENT_KEYS else store_config)[k] = v
    env_prefix = {"s3": "AWS_", "gs": "GOOGLE_", "az": "AZURE_"}.get(spec.kind, "-")
    for name in _ENDPOINT_ENV:
        if name.startswith(env_prefix) and os.environ.get(name):
            check_endpoint(spec.public(), f"the environment variable {name}", os.environ[name])
    s = spec.settings
    client.setdefault("connect_timeout", f"{s.connect_timeout}s")
    client.setdefault("timeout", f"{s.timeout}s")
    if "allow_http" not in client and _http_allowed(spec, store_config):
        client["allow_http"] = True  # (client_options given here would otherwise drop the environment's)
    retry = {
        "max_retries": s.retries,
        "retry_timeout": timedelta(seconds=s.retry_timeout),
        "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=5), "base": 2},
    }
    try:
        # (obstore's overloads want the store kind's TypedDict config; this one is built at run time, for any kind)
        return from_url(  # type: ignore[call-overload]
            spec.base, config=store_config or None, client_options=client, retry_config=retry
        )
    except BaseException as e:  # (obstore's configuration errors embed no request; its panics are BaseExceptions)
        if not isinstance(e, Exception) and type(e).__name__ != "PanicException":
            raise
        kind = type(e).__name__
        error = ValueError(
            f"{spec.public()}: the object store client (obstore) could not build a store for this bucket or "
            f"host with storage_options keys {sorted(k for k, _ in spec.options)} ({kind}: {_first_line(e)}): "
            "check the URL's bucket, host and port, and see obstore's store and client options for the "
            "accepted keys"
        )
    raise error  # (outside the except block: it holds no reference to obstore's error)


_ENDPOINT_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT", "AWS_ENDPOINT_URL_S3", "GOOGLE_SERVICE_ENDPOINT", "AZURE_ENDPOINT")
_ALLOW_HTTP_ENV = ("ALLOW_HTTP", "AWS_ALLOW_HTTP", "GOOGLE_ALLOW_HTTP", "AZURE_ALLOW_HTTP")


def _http_allowed(spec: StoreSpec, store_config: dict[str, Any]) -> bool:
    """Whether plain http is the user's explicit choice: an ``http://`` URL or endpoint, or ``*ALLOW_HTTP`` set."""
    endpoints = [spec.base, str(store_config.get("endpoint", store_config.get("aws_endpoint", "")))]
    endpoints += [os.environ.get(name, "") for name in _ENDPOINT_ENV]
    if any(e.lower().startswith("http://") for e in endpoints):
        return True
    return any(os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on") for name in _ALLOW_HTTP_ENV)


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S*")


def _first_line(e: BaseException) -> str:
    """The first line of ``e``'s message, any URL in it elided (it may hold a query string)."""
    text = str(e).strip().splitlines()
    return _URL.sub("<url>", text[0][:300]) if text else ""


def _pool(concurrency: int, name: str = "npydask-remote") -> ThreadPoolExecutor:
    """This process's pool ``name`` of ``concurrency`` threads.

    A forked child gets its own: its parent's threads do not exist in it.
    """
    key = (os.getpid(), name, concurrency)
    pool = _pools.get(key)
    if pool is None:
        with _lock:
            pool = _pools.get(key)
            if pool is None:
                pool = _pools[key] = ThreadPoolExecutor(concurrency, thread_name_prefix=name)
    return pool


def run_all(fn: Callable[[T], R], items: Sequence[T] | Iterable[T], concurrency: int) -> list[R]:
    """``[fn(item) for item in items]`` with up to ``concurrency`` calls in flight; the first error is raised.

    A single item runs in the caller's thread; more go to the process's
    request pool. On an error the calls not yet started are cancelled and the ones
    running are waited for (they write into buffers the caller owns).
    """
    items = list(items)
    if len(items) <= 1 or concurrency <= 1:
        return [fn(item) for item in items]
    return _run_on(_pool(concurrency), fn, items)


def _run_on(pool: ThreadPoolExecutor, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """Each call on ``pool``; on an error the rest is cancelled, the running ones waited for, the first raised.

    Each call runs in a copy of the submitting context, so what it records
    (:mod:`npydask.storage.io_counts`) lands in the caller's collectors.
    """
    futures = [pool.submit(contextvars.copy_context().run, fn, item) for item in items]
    _, pending = wait(futures, return_when=FIRST_EXCEPTION)
    if pending:
        for f in pending:
            f.cancel()
        wait(pending)
        for f in futures:
            if not f.cancelled() and f.exception() is not None:
                raise f.exception()  # type: ignore[misc]
    return [f.result() for f in futures]


def run_beside(side: Callable[[], object], main: Callable[[], R], concurrency: int) -> R:
    """``main()`` in this thread while ``side()`` (a request that waits on nothing else) runs on the request pool.

    Both have finished when this returns or raises (``main`` writes into
    buffers the caller owns); ``side``'s error is raised first, as it
    explains ``main``'s (an object's header that differs from the one relied
    on, and its runs that then fail too).

    Examples
    --------
    >>> seen = []
    >>> run_beside(lambda: seen.append("side"), lambda: "main", 4), seen
    ('main', ['side'])
    """
    if concurrency <= 1:
        side()
        return main()
    future = _pool(concurrency).submit(contextvars.copy_context().run, side)  # (counted as the caller's)
    try:
        result = main()
    except BaseException as main_error:
        error = future.exception()  # (waits for it)
        if error is not None:
            raise error from main_error  # (main's error is its cause, and its context)
        raise
    future.result()
    return result


_FILES_AT_ONCE = 16


def run_files(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``fn`` over ``items`` (files) on a second pool of ``_FILES_AT_ONCE`` threads.

    For work per file that itself issues requests through :func:`run_all`
    (a ROI: a request per plane): a separate pool, so a file's thread
    waiting for its requests never holds a request thread.
    """
    if len(items) <= 1:
        return [fn(item) for item in items]
    return run_on("npydask-remote-files", _FILES_AT_ONCE, fn, items)


def run_on(name: str, width: int, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``fn`` over ``items`` on this process's pool ``name`` of ``width`` threads, errors as :func:`run_all`'s.

    For work above the request pools that waits on them: its own pool, which its jobs never submit to.
    """
    return _run_on(_pool(width, name), fn, items)


def run_each(fn: Callable[[T], R], items: Sequence[T], concurrency: int) -> list[R | BaseException]:
    """Like :func:`run_all`, but each call's ``OSError``/``ValueError``/``KeyError`` comes back in its place."""

    def safe(item: T) -> R | BaseException:
        try:
            return fn(item)
        except (OSError, ValueError, KeyError) as e:
            return e

    return run_all(safe, items, concurrency)
