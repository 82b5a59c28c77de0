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

Faults
------
The proxy also plays a slow or throttling store (:class:`Faults`), set at
construction or changed while it runs (:meth:`CountingProxy.set_faults`, safe
from any thread). Each request, once its head has arrived, is held back
before it is forwarded, so its response starts that much later and no other
connection waits: ``delay`` (a link's round trip, e.g. 0.02 s) plus
``slowdown`` (a uniformly slow store, e.g. 0.2 s) for every request, plus
``tail_delay`` for a seeded ``tail_share`` of object GETs (a slow tail, e.g. 1%
late by 2 s). Then, above ``max_request_rate`` requests a second over a
sliding ``rate_window`` (1 s), the proxy answers the request itself with S3's
``503 Slow Down`` (an XML ``<Error><Code>SlowDown</Code>...``, with a
``Content-Length``, keeping the connection unless the request asked to close
it) once the connection's earlier requests are answered, and never forwards
it. :attr:`ProxyCounts.delayed`, ``tail``, ``rejected`` and ``cancelled``
count what happened; a client that closes its connection while a request is
held cancels it (nothing is forwarded). Connections whose requests cannot be
framed (see above) are forwarded without faults. The second example below
adds a 50 ms round trip, then allows one request a second.

Examples
--------
>>> import pathlib, tempfile, urllib.request
>>> from npydask.testing.http_range import RangeHTTPServer
>>> folder = tempfile.TemporaryDirectory()
>>> _ = (pathlib.Path(folder.name) / "a.bin").write_bytes(b"x" * 1000)
>>> with RangeHTTPServer(folder.name) as server, CountingProxy(server.endpoint) as proxy:
...     with urllib.request.urlopen(proxy.endpoint + "/a.bin") as response:
...         body = response.read()
>>> len(body), proxy.counts.connections, proxy.counts.downstream > 1000 > proxy.counts.upstream
(1000, 1, True)

>>> import time, urllib.error
>>> with RangeHTTPServer(folder.name) as server, CountingProxy(server.endpoint, delay=0.05) as proxy:
...     start = time.monotonic()
...     with urllib.request.urlopen(proxy.endpoint + "/a.bin") as response:
...         took = time.monotonic() - start
...     _ = proxy.set_faults(delay=0.0, max_request_rate=1)  # (one request in the last second already)
...     try:
...         urllib.request.urlopen(proxy.endpoint + "/a.bin")
...     except urllib.error.HTTPError as error:
...         with error:
...             answer = error.code, b"<Code>SlowDown</Code>" in error.read()
>>> folder.cleanup()
>>> took >= 0.05, answer, proxy.counts.delayed, proxy.counts.rejected
(True, (503, True), 1, 1)
"""

from __future__ import annotations

import dataclasses
import selectors
import socket
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from npydask.testing._faults import Admission, Faults, slow_down
from npydask.testing._framing import RequestCounter, RequestHead, ResponseFramer, request_kind

__all__ = ["CountingProxy", "Faults", "ProxyCounts", "RequestCounter", "RequestHead", "request_kind"]

_BUFFER = 1 << 18


@dataclass(frozen=True)
class ProxyCounts:
    """Bytes forwarded by a :class:`CountingProxy`.

    Attributes
    ----------
    upstream
        Bytes from clients to the server (requests).
    downstream
        Bytes from the server to clients (responses, headers included; the
        proxy's own ``503`` answers too).
    connections
        Client connections accepted.
    requests
        Requests clients sent, by kind: ``"GET"`` (of an object), ``"LIST"`` (a
        ``GET`` of a bucket: see the module docs), ``"HEAD"``, ``"PUT"``, ...
        (the method). Kinds never seen are absent.
    unframed
        Connections whose requests stopped being counted (a chunked or
        oversized request); 0 when ``requests`` is complete.
    delayed
        Requests held back by a fault (``delay``, ``slowdown`` or the tail).
    tail
        Object GETs drawn into the slow tail (also counted in ``delayed``).
    rejected
        Requests the proxy answered ``503 Slow Down`` itself, never forwarded
        (counted in ``requests`` too).
    cancelled
        Requests whose client closed the connection while they were held
        (never forwarded).
    """

    upstream: int = 0
    downstream: int = 0
    connections: int = 0
    requests: dict[str, int] = field(default_factory=dict)
    unframed: int = 0
    delayed: int = 0
    tail: int = 0
    rejected: int = 0
    cancelled: int = 0

    def count(self, kind: str) -> int:
        """Requests of ``kind`` (``"GET"``, ``"LIST"``, ``"HEAD"``, ...), 0 if none."""
        return self.requests.get(kind, 0)


class CountingProxy:
    """Forward 127.0.0.1:free to ``target``, count bytes each way, and inject faults.

    Parameters
    ----------
    target
        ``"http://host:port"`` (or ``"host:port"``) of the server to forward to.
    rate
        Bytes per second from the server to the clients, shared by all
        connections (a link's bandwidth, as a token bucket paced per
        forwarded block of up to 256 KiB); ``None`` forwards as fast as the
        sockets go.
    delay, slowdown, tail_share, tail_delay, max_request_rate, rate_window, seed
        The faults applied to each request (:class:`Faults`; none by default);
        :meth:`set_faults` changes them while the proxy runs.

    Attributes
    ----------
    endpoint : str
        ``"http://127.0.0.1:PORT"`` to give clients, once started.
    """

    def __init__(
        self,
        target: str,
        rate: float | None = None,
        *,
        delay: float = 0.0,
        slowdown: float = 0.0,
        tail_share: float = 0.0,
        tail_delay: float = 0.0,
        max_request_rate: float | None = None,
        rate_window: float = 1.0,
        seed: int = 0,
    ) -> None:
        if rate is not None and not rate > 0:
            raise ValueError(f"CountingProxy: rate must be a positive number of bytes per second or None, got {rate!r}")
        self.rate = rate
        self._link_free_at = 0.0  # (monotonic) when the emulated link has sent what it was given
        parsed = urllib.parse.urlsplit(target if "//" in target else f"//{target}")
        if parsed.hostname is None or parsed.port is None:
            raise ValueError(f"CountingProxy: expected a target 'http://host:port', got {target!r}")
        self.target = (parsed.hostname, parsed.port)
        self._admission = Admission(
            Faults(delay, slowdown, tail_share, tail_delay, max_request_rate, rate_window, seed)
        )
        self._lock = threading.Lock()
        self._up = self._down = self._connections = self._unframed = 0
        self._delayed = self._tail = self._rejected = self._cancelled = 0
        self._requests: Counter[str] = Counter()
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._acceptor: threading.Thread | None = None
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()

    @property
    def faults(self) -> Faults:
        """The faults applied to the next request."""
        return self._admission.faults

    def set_faults(self, **changes: Any) -> Faults:
        """Change some of the faults (the keywords of :class:`Faults`) from the next request on; return them.

        Safe to call from any thread while clients run; a request already held
        keeps the time it was given.

        Examples
        --------
        >>> proxy = CountingProxy("http://127.0.0.1:9", delay=0.02)
        >>> proxy.set_faults(slowdown=0.2).hold_base
        0.22
        >>> proxy.faults.delay, proxy.faults.slowdown
        (0.02, 0.2)
        """
        names = [f.name for f in dataclasses.fields(Faults)]
        for name in changes:
            if name not in names:
                raise TypeError(
                    f"CountingProxy.set_faults: unknown fault {name!r}; expected some of {', '.join(names)}"
                )
        faults = dataclasses.replace(self._admission.faults, **changes)
        self._admission.replace(faults)
        return faults

    def start(self) -> CountingProxy:
        """Listen on a free port of 127.0.0.1 and accept in a background thread; return ``self``."""
        if self._listener is not None:
            return self
        self._stopping.clear()
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
        self._stopping.set()  # (ends the holds)
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
            self._delayed = self._tail = self._rejected = self._cancelled = 0
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
        return ProxyCounts(
            self._up,
            self._down,
            self._connections,
            dict(self._requests),
            self._unframed,
            self._delayed,
            self._tail,
            self._rejected,
            self._cancelled,
        )

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
            pair = _Pair(client, server)
            for pump in (self._pump_up, self._pump_down):
                thread = threading.Thread(target=pump, args=(pair,), daemon=True, name="proxy-pump")
                thread.start()
                self._threads.append(thread)

    def _pump_up(self, pair: _Pair) -> None:
        """Client to server: count, frame, hold, answer 503 or forward each request."""
        framer = RequestCounter()
        held = _Held(pair.server)
        try:
            while True:
                data = pair.client.recv(_BUFFER)
                if not data:
                    break
                with self._lock:
                    self._up += len(data)
                    framer.heads.clear()
                    if not framer.lost:
                        framer.kinds.clear()
                        framer.feed(data)
                        self._requests.update(framer.kinds)
                        self._unframed += framer.lost
                    heads = list(framer.heads)
                held.data += data
                for head in heads:
                    held.release(head.start)
                    if not self._serve(head, pair, held):
                        return
                pending = framer.pending_head
                held.release(held.end if pending is None else pending)  # (an incomplete head waits)
        except OSError:
            pass
        finally:
            self._end(pair.client, pair.server, pair)

    def _serve(self, head: RequestHead, pair: _Pair, held: _Held) -> bool:
        """Hold ``head``'s request, then forward it or answer it; ``False`` when the connection is to end."""
        hold, tail = self._admission.hold(head.kind)
        if hold > 0:
            with self._lock:
                self._delayed += 1
                self._tail += tail
            if not self._hold(pair.client, hold):
                with self._lock:
                    self._cancelled += 1
                return False
        if not self._admission.admit():
            held.drop_to = head.end + head.body  # (never forwarded, its body neither)
            with self._lock:
                self._rejected += 1
            return self._answer(head, pair)
        with pair.cond:
            pair.framer.methods.append(head.method)
            pair.forwarded += 1
        held.release(head.end)
        return True

    def _hold(self, client: socket.socket, seconds: float) -> bool:
        """Wait ``seconds``; ``False`` as soon as the client closes its connection or the proxy stops."""
        deadline = time.monotonic() + seconds
        with selectors.DefaultSelector() as watch:
            watch.register(client, selectors.EVENT_READ)
            while (left := deadline - time.monotonic()) > 0:
                if not watch.select(left):
                    continue
                try:
                    more = client.recv(1, socket.MSG_PEEK)
                except OSError:
                    return False
                if not more:  # the client closed (or the proxy is stopping)
                    return False
                # the client sent more (a pipelined request): wait out the time without watching
                return not self._stopping.wait(max(0.0, deadline - time.monotonic()))
        return not self._stopping.is_set()

    def _answer(self, head: RequestHead, pair: _Pair) -> bool:
        """Answer ``head`` ``503 Slow Down`` once its connection's earlier requests are answered."""
        with pair.cond:
            pair.cond.wait_for(lambda: pair.answered >= pair.forwarded or pair.down_done or pair.framer.lost)
            close = head.close or pair.down_done
        answer = slow_down(head.target, head=head.method == "HEAD", close=close)
        with self._lock:
            self._down += len(answer)
        pair.client.sendall(answer)
        return not close

    def _pump_down(self, pair: _Pair) -> None:
        """Server to client: count, pace and forward; note the responses completed."""
        try:
            while True:
                data = pair.server.recv(_BUFFER)
                if not data:
                    break
                with self._lock:  # counted before sent: complete once the peer has them
                    self._down += len(data)
                if self.rate is not None:
                    self._pace(len(data))
                pair.client.sendall(data)
                with pair.cond:
                    if not pair.framer.lost:
                        pair.answered += pair.framer.feed(data)
                    pair.cond.notify_all()
        except OSError:
            pass
        finally:
            with pair.cond:
                pair.down_done = True
                pair.cond.notify_all()
            self._end(pair.server, pair.client, pair)

    def _end(self, source: socket.socket, sink: socket.socket, pair: _Pair) -> None:
        """One direction ended: pass the end on (the other may go on); close both once both ended."""
        _shutdown(sink, socket.SHUT_WR)
        with self._lock:
            pair.open_directions -= 1
            last = pair.open_directions == 0
            if last:
                self._sockets.difference_update((source, sink))
        if last:
            source.close()
            sink.close()


class _Pair:
    """A client connection and its server connection; closed when both directions ended."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.open_directions = 2
        self.cond = threading.Condition()
        self.framer = ResponseFramer()  # (the server's responses; its methods: requests forwarded)
        self.forwarded = self.answered = 0
        self.down_done = False


class _Held:
    """Bytes of a client's stream received but neither forwarded nor dropped yet."""

    def __init__(self, sink: socket.socket) -> None:
        self.sink = sink
        self.data = bytearray()
        self.base = 0  # stream offset of data[0]
        self.drop_to = 0  # stream offset below which bytes are dropped (a rejected request and its body)

    @property
    def end(self) -> int:
        return self.base + len(self.data)

    def release(self, upto: int) -> None:
        """Forward (or drop) the bytes below stream offset ``upto``."""
        n = upto - self.base
        if n <= 0:
            return
        keep = min(max(self.drop_to - self.base, 0), n)
        if keep < n:
            self.sink.sendall(self.data[keep:n])
        del self.data[:n]
        self.base = upto


def _shutdown(s: socket.socket, how: int = socket.SHUT_RDWR) -> None:
    try:
        s.shutdown(how)
    except OSError:
        pass
