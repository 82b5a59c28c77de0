"""A TCP proxy on 127.0.0.1 that counts the bytes it forwards each way.

Point a client at :attr:`CountingProxy.endpoint` instead of the server's: every
byte of every connection is forwarded unchanged and counted, requests headers
included. Bytes are counted just before they are forwarded, so the counts are
complete as soon as a client has its response. S3 signatures survive, since the
client signs the ``Host`` it sends and the proxy does not touch it. The remote benchmark uses it to count the
bytes a read transferred and the requests it made.

Requests are counted from the client's byte stream by a small HTTP/1.1 framer
(:class:`RequestCounter`): each request line is classified, then its headers
and its ``Content-Length`` body are skipped, so a body that happens to hold
``GET /`` is not a request. A ``GET`` of a bucket rather than an object (a
path with at most one segment, or a query with ``list-type=``: S3's
``ListObjects``) counts as a ``LIST``. A connection whose request body is
framed otherwise (``Transfer-Encoding: chunked``) stops being counted there
and is reported in :attr:`ProxyCounts.unframed`.

Examples
--------
>>> import pathlib, tempfile, urllib.request
>>> from npydask.testing.http_range import RangeHTTPServer
>>> folder = tempfile.TemporaryDirectory()
>>> _ = (pathlib.Path(folder.name) / "a.bin").write_bytes(b"x" * 1000)
>>> with RangeHTTPServer(folder.name) as server, CountingProxy(server.endpoint) as proxy:
...     with urllib.request.urlopen(proxy.endpoint + "/a.bin") as response:
...         body = response.read()
>>> folder.cleanup()
>>> len(body), proxy.counts.connections, proxy.counts.downstream > 1000 > proxy.counts.upstream
(1000, 1, True)
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["CountingProxy", "ProxyCounts", "RequestCounter", "request_kind"]

_BUFFER = 1 << 18
_MAX_HEAD = 1 << 16
"""Request line plus headers longer than this end the counting of a connection (as unframed)."""


@dataclass(frozen=True)
class ProxyCounts:
    """Bytes forwarded by a :class:`CountingProxy`.

    Attributes
    ----------
    upstream
        Bytes from clients to the server (requests).
    downstream
        Bytes from the server to clients (responses, headers included).
    connections
        Client connections accepted.
    requests
        Requests forwarded, by kind: ``"GET"`` (of an object), ``"LIST"`` (a
        ``GET`` of a bucket: see the module docs), ``"HEAD"``, ``"PUT"``, ...
        (the method). Kinds never seen are absent.
    unframed
        Connections whose requests stopped being counted (a chunked or
        oversized request); 0 when ``requests`` is complete.
    """

    upstream: int = 0
    downstream: int = 0
    connections: int = 0
    requests: dict[str, int] = field(default_factory=dict)
    unframed: int = 0

    def count(self, kind: str) -> int:
        """Requests of ``kind`` (``"GET"``, ``"LIST"``, ``"HEAD"``, ...), 0 if none."""
        return self.requests.get(kind, 0)


def request_kind(method: str, target: str) -> str:
    """The kind a request counts as: its method, or ``"LIST"`` for a ``GET`` of a bucket.

    Examples
    --------
    >>> request_kind("GET", "/bucket/a/b.npy"), request_kind("GET", "/bucket?list-type=2&prefix=a%2F")
    ('GET', 'LIST')
    >>> request_kind("GET", "/bucket/"), request_kind("HEAD", "/bucket/k")
    ('LIST', 'HEAD')
    """
    path, _, query = target.partition("?")
    if method == "GET" and ("list-type=" in query or path.strip("/").count("/") == 0):
        return "LIST"
    return method


class RequestCounter:
    r"""Count the HTTP/1.1 requests in one connection's client-to-server byte stream.

    Feed it the bytes in any pieces; :attr:`kinds` counts request kinds
    (:func:`request_kind`). Bodies are skipped by ``Content-Length``; a
    chunked body (or a head over 64 KiB) ends the counting (:attr:`lost`).

    Examples
    --------
    >>> c = RequestCounter()
    >>> stream = b"GET /b/k HTTP/1.1\r\nHost: x\r\n\r\nPUT /b/k HTTP/1.1\r\nContent-Length: 9\r\n\r\nGET /b/k "
    >>> for i in range(len(stream)):
    ...     c.feed(stream[i : i + 1])
    >>> dict(c.kinds), c.lost
    ({'GET': 1, 'PUT': 1}, False)
    """

    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()
        self.lost = False
        self._head = bytearray()
        self._body = 0  # body bytes of the current request still to skip

    def feed(self, data: bytes) -> None:
        """Take the next bytes of the stream."""
        view = memoryview(data)
        while view and not self.lost:
            if self._body:
                skip = min(self._body, len(view))
                self._body -= skip
                view = view[skip:]
                continue
            start = max(0, len(self._head) - 3)  # (the blank line may straddle two pieces)
            self._head += view
            end = self._head.find(b"\r\n\r\n", start)
            if end < 0:
                self.lost = len(self._head) > _MAX_HEAD
                return
            rest = len(self._head) - (end + 4)
            view = view[len(view) - rest :]
            self._request(bytes(self._head[:end]))
            self._head.clear()

    def _request(self, head: bytes) -> None:
        line, *headers = head.decode("latin-1").split("\r\n")
        method, _, target = line.partition(" ")
        self.kinds[request_kind(method, target.rpartition(" ")[0] or target)] += 1
        for h in headers:
            name, _, value = h.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                try:
                    self._body = int(value.strip())
                except ValueError:  # (not HTTP the framer understands: stop counting here)
                    self.lost = True
            elif name == "transfer-encoding" and value.strip().lower() != "identity":
                self.lost = True


class CountingProxy:
    """Forward 127.0.0.1:free to ``target`` and count bytes each way.

    Parameters
    ----------
    target
        ``"http://host:port"`` (or ``"host:port"``) of the server to forward to.
    rate
        Bytes per second from the server to the clients, shared by all
        connections (a link's bandwidth, as a token bucket paced per
        forwarded block of up to 256 KiB); ``None`` forwards as fast as the
        sockets go. No latency is added.

    Attributes
    ----------
    endpoint : str
        ``"http://127.0.0.1:PORT"`` to give clients, once started.
    """

    def __init__(self, target: str, rate: float | None = None) -> None:
        if rate is not None and not rate > 0:
            raise ValueError(f"CountingProxy: rate must be a positive number of bytes per second or None, got {rate!r}")
        self.rate = rate
        self._link_free_at = 0.0  # (monotonic) when the emulated link has sent what it was given
        parsed = urllib.parse.urlsplit(target if "//" in target else f"//{target}")
        if parsed.hostname is None or parsed.port is None:
            raise ValueError(f"CountingProxy: expected a target 'http://host:port', got {target!r}")
        self.target = (parsed.hostname, parsed.port)
        self._lock = threading.Lock()
        self._up = self._down = self._connections = self._unframed = 0
        self._requests: Counter[str] = Counter()
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._acceptor: threading.Thread | None = None
        self._threads: list[threading.Thread] = []

    def start(self) -> CountingProxy:
        """Listen on a free port of 127.0.0.1 and accept in a background thread; return ``self``."""
        if self._listener is not None:
            return self
        listener = socket.create_server(("127.0.0.1", 0))
        self._listener = listener
        self._acceptor = threading.Thread(target=self._accept, args=(listener,), daemon=True, name="proxy")
        self._acceptor.start()
        return self

    def stop(self) -> None:
        """Close the listener and every open connection, join the threads (safe twice)."""
        listener, self._listener = self._listener, None
        if listener is None:
            return
        _shutdown(listener)  # wakes the thread blocked in accept(); close() alone does not
        listener.close()
        if self._acceptor is not None:  # after this no connection is added
            self._acceptor.join(timeout=15)
            self._acceptor = None
        with self._lock:
            sockets = list(self._sockets)
        for s in sockets:
            _shutdown(s)
        for thread in self._threads:
            thread.join(timeout=10)
        self._threads = []

    @property
    def port(self) -> int:
        """The port clients connect to (only while started)."""
        if self._listener is None:
            raise RuntimeError("CountingProxy is not started")
        return self._listener.getsockname()[1]

    @property
    def endpoint(self) -> str:
        """``"http://127.0.0.1:PORT"``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def counts(self) -> ProxyCounts:
        """The counts so far."""
        with self._lock:
            return self._counts()

    def reset(self) -> ProxyCounts:
        """Return the counts so far and start again from zero (open connections keep counting)."""
        with self._lock:
            counts = self._counts()
            self._up = self._down = self._connections = self._unframed = 0
            self._requests = Counter()
        return counts

    def _pace(self, n: int) -> None:
        """Wait until the shared link has carried ``n`` more bytes at :attr:`rate`."""
        with self._lock:
            now = time.monotonic()
            done = max(now, self._link_free_at) + n / self.rate  # type: ignore[operator]
            self._link_free_at = done
        if done > now:
            time.sleep(done - now)

    def _counts(self) -> ProxyCounts:
        return ProxyCounts(self._up, self._down, self._connections, dict(self._requests), self._unframed)

    def __enter__(self) -> CountingProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # the listener was closed: stop accepting
                return
            try:
                server = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()  # the server is down: the client sees the connection dropped
                continue
            server.settimeout(None)
            with self._lock:
                self._connections += 1
                self._sockets.update((client, server))
            self._threads = [t for t in self._threads if t.is_alive()]
            pair = _Pair()
            for source, sink, upstream in ((client, server, True), (server, client, False)):
                thread = threading.Thread(
                    target=self._pump,
                    args=(source, sink, upstream, pair),
                    daemon=True,
                    name="proxy-pump",
                )
                thread.start()
                self._threads.append(thread)

    def _pump(self, source: socket.socket, sink: socket.socket, upstream: bool, pair: _Pair) -> None:
        framer = RequestCounter() if upstream else None
        try:
            while True:
                data = source.recv(_BUFFER)
                if not data:
                    break
                with self._lock:  # counted before sent: complete once the peer has them
                    if framer is None:
                        self._down += len(data)
                    else:
                        self._up += len(data)
                        if not framer.lost:
                            framer.kinds.clear()
                            framer.feed(data)
                            self._requests.update(framer.kinds)
                            self._unframed += framer.lost
                if self.rate is not None and framer is None:
                    self._pace(len(data))
                sink.sendall(data)
        except OSError:
            pass
        finally:
            _shutdown(sink, socket.SHUT_WR)  # pass the end on; the other direction may go on
            with self._lock:
                pair.open_directions -= 1
                last = pair.open_directions == 0
                if last:
                    self._sockets.difference_update((source, sink))
            if last:
                source.close()
                sink.close()


@dataclass
class _Pair:
    """A client connection and its server connection; closed when both directions ended."""

    open_directions: int = 2


def _shutdown(s: socket.socket, how: int = socket.SHUT_RDWR) -> None:
    try:
        s.shutdown(how)
    except OSError:
        pass
