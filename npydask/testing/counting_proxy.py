"""A TCP proxy on 127.0.0.1 that counts the bytes it forwards each way.

Point a client at :attr:`CountingProxy.endpoint` instead of the server's: every
byte of every connection is forwarded unchanged and counted, requests headers
included. Bytes are counted just before they are forwarded, so the counts are
complete as soon as a client has its response. S3 signatures survive, since the
client signs the ``Host`` it sends and the proxy does not touch it. The remote
benchmark uses it to count the bytes a read transferred.

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
import urllib.parse
from dataclasses import dataclass

__all__ = ["CountingProxy", "ProxyCounts"]

_BUFFER = 1 << 18


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
    """

    upstream: int = 0
    downstream: int = 0
    connections: int = 0


class CountingProxy:
    """Forward 127.0.0.1:free to ``target`` and count bytes each way.

    Parameters
    ----------
    target
        ``"http://host:port"`` (or ``"host:port"``) of the server to forward to.

    Attributes
    ----------
    endpoint : str
        ``"http://127.0.0.1:PORT"`` to give clients, once started.
    """

    def __init__(self, target: str) -> None:
        parsed = urllib.parse.urlsplit(target if "//" in target else f"//{target}")
        if parsed.hostname is None or parsed.port is None:
            raise ValueError(f"CountingProxy: expected a target 'http://host:port', got {target!r}")
        self.target = (parsed.hostname, parsed.port)
        self._lock = threading.Lock()
        self._up = self._down = self._connections = 0
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
        self._acceptor = threading.Thread(
            target=self._accept, args=(listener,), daemon=True, name="proxy"
        )
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
            return ProxyCounts(self._up, self._down, self._connections)

    def reset(self) -> ProxyCounts:
        """Return the counts so far and start again from zero (open connections keep counting)."""
        with self._lock:
            counts = ProxyCounts(self._up, self._down, self._connections)
            self._up = self._down = self._connections = 0
        return counts

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
        try:
            while True:
                data = source.recv(_BUFFER)
                if not data:
                    break
                with self._lock:  # counted before sent: complete once the peer has them
                    if upstream:
                        self._up += len(data)
                    else:
                        self._down += len(data)
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
