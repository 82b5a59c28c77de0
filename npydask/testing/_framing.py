"""HTTP/1.1 framing for :class:`~npydask.testing.counting_proxy.CountingProxy`, both ways.

:class:`RequestCounter` splits a client's byte stream into requests (their
kinds counted, their heads' places in the stream given to the proxy, which
holds or answers each); :class:`ResponseFramer` follows a server's responses,
so that the proxy knows when every forwarded request of a connection has been
answered before it answers one itself.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass

__all__ = ["RequestCounter", "RequestHead", "ResponseFramer", "request_kind"]

_MAX_HEAD = 1 << 16
"""A head longer than this ends the framing of a connection (as unframed)."""


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
        self.heads: list[RequestHead] = []
        self.lost = False
        self._head = bytearray()
        self._head_start = 0  # stream offset of the head being read
        self._pos = 0  # stream offset of the next byte fed
        self._body = 0  # body bytes of the current request still to skip

    @property
    def pending_head(self) -> int | None:
        """Stream offset where an incomplete request head begins, or ``None`` (between requests, in a body)."""
        return self._head_start if self._head and not self.lost else None

    def feed(self, data: bytes) -> None:
        """Take the next bytes of the stream (each complete request is added to :attr:`kinds` and :attr:`heads`)."""
        view = memoryview(data)
        pos = self._pos  # the stream offset of view[0]
        self._pos += len(data)
        while view and not self.lost:
            if self._body:
                skip = min(self._body, len(view))
                self._body -= skip
                view = view[skip:]
                pos += skip
                continue
            if not self._head:
                self._head_start = pos
            start = max(0, len(self._head) - 3)  # (the blank line may straddle two pieces)
            self._head += view
            end = self._head.find(b"\r\n\r\n", start)
            if end < 0:
                self.lost = len(self._head) > _MAX_HEAD
                return
            rest = len(self._head) - (end + 4)
            pos += len(view) - rest
            view = view[len(view) - rest :]
            self._request(bytes(self._head[:end]), pos)
            self._head.clear()

    def _request(self, head: bytes, end: int) -> None:
        line, *headers = head.decode("latin-1").split("\r\n")
        method, _, target = line.partition(" ")
        target, _, version = target.rpartition(" ") if " " in target else (target, "", "")
        kind = request_kind(method, target)
        self.kinds[kind] += 1
        close = version.upper() == "HTTP/1.0"
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
            elif name == "connection":
                tokens = {t.strip().lower() for t in value.split(",")}
                close = "close" in tokens or (close and "keep-alive" not in tokens)
        self.heads.append(RequestHead(kind, method, target, self._head_start, end, self._body, close or self.lost))


@dataclass(frozen=True)
class RequestHead:
    """One request's head in a connection's byte stream, as :class:`RequestCounter` framed it.

    Attributes
    ----------
    kind, method, target
        Its kind (:func:`request_kind`), method and request target.
    start, end
        Stream offsets of its first byte and of the byte after its blank line.
    body
        Its ``Content-Length`` (0 without).
    close
        Whether the connection ends after it (``Connection: close``, HTTP/1.0
        without keep-alive, or a body the framer cannot follow).
    """

    kind: str
    method: str
    target: str
    start: int
    end: int
    body: int
    close: bool


_HEAD, _BODY, _SIZE, _CHUNK, _TRAILER = range(5)


class ResponseFramer:
    r"""Count the HTTP/1.1 responses completed in a server's byte stream.

    :attr:`methods` holds the methods of the requests forwarded and not yet
    answered, oldest first (a ``HEAD``'s response has no body). Bodies are
    followed by ``Content-Length`` or chunked encoding; interim ``1xx``
    responses answer nothing. A response delimited by the connection's end,
    a ``101`` or a head it cannot parse ends the framing (:attr:`lost`).

    Examples
    --------
    >>> f = ResponseFramer()
    >>> f.methods.extend(["GET", "HEAD", "GET"])
    >>> stream = (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
    ...           b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n"
    ...           b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
    >>> sum(f.feed(stream[i : i + 7]) for i in range(0, len(stream), 7)), f.lost, len(f.methods)
    (3, False, 0)
    """

    def __init__(self) -> None:
        self.methods: deque[str] = deque()
        self.lost = False
        self._state = _HEAD
        self._skip = 0  # body (or chunk and its CRLF) bytes still to pass
        self._buf = b""  # bytes of a head, chunk-size line or trailer not yet complete

    def feed(self, data: bytes) -> int:
        """Take the next bytes of the stream; return the responses they completed."""
        done = 0
        buf = self._buf + data if self._buf else data
        self._buf = b""
        pos = 0
        while pos < len(buf) and not self.lost:
            if self._skip:
                n = min(self._skip, len(buf) - pos)
                self._skip -= n
                pos += n
                if not self._skip:
                    if self._state == _BODY:
                        done += 1
                        self._state = _HEAD
                    else:  # (the end of a chunk's CRLF)
                        self._state = _SIZE
                continue
            if self._state == _SIZE:
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    break
                try:
                    size = int(buf[pos:end].split(b";")[0].strip(), 16)
                except ValueError:
                    self.lost = True
                    break
                if size == 0:  # the last chunk: its line, trailers and the blank line end at the next CRLFCRLF
                    self._state = _TRAILER
                else:
                    pos = end + 2
                    self._skip = size + 2
                    self._state = _CHUNK
                continue
            end = buf.find(b"\r\n\r\n", pos)
            if end < 0:
                break
            head, pos = buf[pos:end], end + 4
            if self._state == _TRAILER:
                done += 1
                self._state = _HEAD
            else:
                done += self._response(head)
        if not self.lost:
            self._buf = bytes(buf[pos:])
            self.lost = len(self._buf) > _MAX_HEAD
        return done

    def _response(self, head: bytes) -> int:
        line, *headers = head.decode("latin-1").split("\r\n")
        try:
            status = int(line.split(" ", 2)[1])
        except (IndexError, ValueError):
            self.lost = True
            return 0
        if 100 <= status < 200:
            self.lost = status == 101  # (another protocol follows)
            return 0
        method = self.methods.popleft() if self.methods else "GET"
        if method == "HEAD" or status in (204, 304):
            return 1
        length = None
        for h in headers:
            name, _, value = h.partition(":")
            name = name.strip().lower()
            if name == "transfer-encoding" and value.strip().lower() != "identity":
                self._state = _SIZE
                return 0
            if name == "content-length":
                try:
                    length = int(value.strip())
                except ValueError:
                    self.lost = True
                    return 0
        if length is None:  # the body ends with the connection
            self.lost = True
            return 0
        if length == 0:
            return 1
        self._skip = length
        self._state = _BODY
        return 0
