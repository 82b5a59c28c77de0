"""A threaded HTTP/1.1 server on 127.0.0.1 serving a folder by byte range, for ``https://`` tests.

:class:`RangeHTTPServer` answers ``GET`` and ``HEAD`` for files under its root:

- ``Range: bytes=a-b``, ``bytes=a-`` and ``bytes=-n`` (one range): ``206`` with
  ``Content-Range`` and ``Content-Length``; a range starting at or past the end:
  ``416`` with ``Content-Range: bytes */SIZE``. A list of ranges is answered
  with the whole file (``200``), which HTTP allows a server to do.
- ``ETag`` (strong, from size, modification time and inode) and
  ``Last-Modified``; ``send_etag=False`` leaves the ``ETag`` out.
- ``If-Match``: ignored, as plain file servers do (the default), or honoured
  (``honour_if_match=True``: ``412`` when no listed tag matches).
- ``ranges=False`` ignores ``Range`` (always ``200``, the whole file), as some servers do.
- ``send_last_modified=False`` leaves ``Last-Modified`` out (with ``send_etag=False``:
  no version of any kind).
- ``fault="wrong-range"`` answers a range with the same number of bytes from
  the start of the file (and a ``Content-Range`` saying so); ``fault="short-body"``
  promises the range's length but sends half of it and closes the connection.
- ``basic_auth=("user", "password")`` answers ``401`` to a request without
  that HTTP Basic ``Authorization`` header.
- ``404`` for a missing file, a folder, or a path leaving the root.

It counts requests and body bytes sent, and logs each request, so tests can
check that exactly the expected bytes were transferred. A response is counted
just before it is written, so the counters are complete as soon as a client
has its response.

Examples
--------
>>> import tempfile, pathlib, urllib.request
>>> folder = tempfile.TemporaryDirectory()
>>> _ = (pathlib.Path(folder.name) / "a.bin").write_bytes(bytes(range(100)))
>>> with RangeHTTPServer(folder.name) as server:
...     request = urllib.request.Request(server.url("a.bin"), headers={"Range": "bytes=10-13"})
...     with urllib.request.urlopen(request) as response:
...         status, body = response.status, response.read()
>>> folder.cleanup()
>>> status, body, server.stats.requests, server.stats.bytes_sent
(206, b'\\n\\x0b\\x0c\\r', 1, 4)
"""

from __future__ import annotations

import base64
import email.utils
import os
import re
import stat
import threading
import urllib.parse
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import BinaryIO

__all__ = ["RangeHTTPServer", "RequestRecord", "ServerStats"]

_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class RequestRecord:
    """One request the server answered.

    Attributes
    ----------
    method, path
        The request line's method and decoded path (``"/a b.npy"``).
    target
        The request target exactly as received (``"/a%20b.npy?x=1"``): how the client encoded it.
    authorization
        The ``Authorization`` header as received, or ``None``.
    range
        The ``Range`` header as sent, or ``None``.
    status
        The status code answered.
    bytes_sent
        Body bytes sent, as ``Content-Length`` promised them (0 for ``HEAD`` and errors;
        fewer reach a client that hangs up early, or when the file shrinks while sent).
    """

    method: str
    path: str
    range: str | None
    status: int
    bytes_sent: int
    target: str = ""
    authorization: str | None = None


@dataclass
class ServerStats:
    """Counters of a :class:`RangeHTTPServer` (read them after the requests finished).

    Attributes
    ----------
    requests
        Requests answered.
    bytes_sent
        Body bytes sent, all requests together.
    log
        One :class:`RequestRecord` per request, in the order answered.
    """

    requests: int = 0
    bytes_sent: int = 0
    log: list[RequestRecord] = field(default_factory=list)


class RangeHTTPServer:
    """Serve a folder on 127.0.0.1 with single-range GETs, ETags and an optional If-Match check.

    Parameters
    ----------
    root
        The folder served; ``/a/b.npy`` is ``root/a/b.npy``.
    honour_if_match
        ``True``: answer ``412`` when ``If-Match`` names no current tag.
        ``False`` (default): ignore ``If-Match``, as plain servers do.
    ranges
        ``False``: ignore ``Range`` and send whole files.
    send_etag
        ``False``: send no ``ETag`` (``Last-Modified`` only).
    send_last_modified
        ``False``: send no ``Last-Modified``.
    fault
        ``None`` (default), ``"wrong-range"`` (a range answered with bytes from
        the start of the file) or ``"short-body"`` (half the promised body,
        then the connection closed).
    basic_auth
        ``(user, password)``: refuse (``401``) requests without that HTTP Basic authorization.

    Attributes
    ----------
    endpoint : str
        ``"http://127.0.0.1:PORT"`` once started.
    stats : ServerStats
        Requests and bytes counted since start or the last :meth:`reset_stats`.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        honour_if_match: bool = False,
        ranges: bool = True,
        send_etag: bool = True,
        send_last_modified: bool = True,
        fault: str | None = None,
        basic_auth: tuple[str, str] | None = None,
    ) -> None:
        if fault not in (None, "wrong-range", "short-body"):
            raise ValueError(f"fault must be None, 'wrong-range' or 'short-body', found {fault!r}")
        self.root = Path(root).resolve()
        self.send_last_modified = send_last_modified
        self.fault = fault
        self.authorization = None if basic_auth is None else _basic(*basic_auth)
        self.honour_if_match = honour_if_match
        self.ranges = ranges
        self.send_etag = send_etag
        self.stats = ServerStats()
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> RangeHTTPServer:
        """Bind a free port on 127.0.0.1 and serve in a background thread; return ``self``."""
        if self._httpd is not None:
            return self
        handler = type("Handler", (_Handler,), {"server_state": self})
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        httpd.daemon_threads = True
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            daemon=True,
            name=f"RangeHTTPServer-{self.port}",
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, close the listening socket and join the thread (safe to call twice)."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    @property
    def port(self) -> int:
        """The port served on (only while started)."""
        if self._httpd is None:
            raise RuntimeError("RangeHTTPServer is not started")
        return self._httpd.server_address[1]

    @property
    def endpoint(self) -> str:
        """``"http://127.0.0.1:PORT"``."""
        return f"http://127.0.0.1:{self.port}"

    def url(self, relative: str) -> str:
        """The URL of ``root/relative``, percent-encoded (spaces and non-ASCII allowed)."""
        return f"{self.endpoint}/{urllib.parse.quote(relative)}"

    def etag(self, relative: str) -> str:
        """The ``ETag`` the server sends now for ``root/relative`` (quoted)."""
        return _etag(os.stat(self.root / relative))

    def reset_stats(self) -> ServerStats:
        """Return the counters so far and start new ones."""
        with self._lock:
            stats, self.stats = self.stats, ServerStats()
        return stats

    def _record(self, record: RequestRecord) -> None:
        with self._lock:
            self.stats.requests += 1
            self.stats.bytes_sent += record.bytes_sent
            self.stats.log.append(record)

    def __enter__(self) -> RangeHTTPServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self.endpoint if self._httpd is not None else "stopped"
        return f"RangeHTTPServer({str(self.root)!r}, {where})"


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")


def _etag(st: os.stat_result) -> str:
    return f'"{st.st_size:x}-{st.st_mtime_ns:x}-{st.st_ino:x}"'


def _parse_range(header: str, size: int) -> tuple[int, int] | None | str:
    """``(start, stop)`` for one satisfiable range, ``"unsatisfiable"``, or ``None`` (serve all)."""
    match = _RANGE.fullmatch(header.strip())
    if match is None:
        return None  # a list of ranges or another unit: ignored, the whole file is sent
    first, last = match.groups()
    if not first and not last:
        return None
    if not first:  # suffix: the last n bytes
        n = int(last)
        return (max(size - n, 0), size) if n > 0 and size > 0 else "unsatisfiable"
    start = int(first)
    stop = size if not last else min(int(last) + 1, size)
    if last and int(last) < start:
        return None  # syntactically invalid: ignored
    return (start, stop) if start < size else "unsatisfiable"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_state: RangeHTTPServer

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - keep tests quiet
        pass

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, *, body: bool) -> None:
        state = self.server_state
        relative = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/")
        range_header = self.headers.get("Range")
        if state.authorization is not None and self.headers.get("Authorization") != state.authorization:
            challenge = {"WWW-Authenticate": 'Basic realm="npydask"'}
            return self._finish(HTTPStatus.UNAUTHORIZED, relative, range_header, challenge)
        path = (state.root / relative).resolve()
        try:
            if not path.is_relative_to(state.root):
                raise FileNotFoundError(relative)
            f = open(path, "rb")
        except OSError:  # missing, a folder, unreadable, outside the root
            return self._finish(HTTPStatus.NOT_FOUND, relative, range_header)
        with f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                return self._finish(HTTPStatus.NOT_FOUND, relative, range_header)
            etag = _etag(st)
            headers = {"Accept-Ranges": "bytes" if state.ranges else "none"}
            if state.send_last_modified:
                headers["Last-Modified"] = email.utils.formatdate(st.st_mtime, usegmt=True)
            if state.send_etag:
                headers["ETag"] = etag
            if_match = self.headers.get("If-Match")
            if state.honour_if_match and if_match is not None and not _matches(if_match, etag):
                return self._finish(HTTPStatus.PRECONDITION_FAILED, relative, range_header, headers)
            size = st.st_size
            span = _parse_range(range_header, size) if range_header and state.ranges else None
            if span == "unsatisfiable":
                headers["Content-Range"] = f"bytes */{size}"
                return self._finish(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE, relative, range_header, headers)
            if span is None:
                status, start, stop = HTTPStatus.OK, 0, size
            else:
                assert isinstance(span, tuple)
                status, (start, stop) = HTTPStatus.PARTIAL_CONTENT, span
                if state.fault == "wrong-range":
                    start, stop = 0, stop - start
                headers["Content-Range"] = f"bytes {start}-{stop - 1}/{size}"
            length = stop - start
            if body and state.fault == "short-body" and status == HTTPStatus.PARTIAL_CONTENT:
                stop = start + length // 2
                self.close_connection = True
            sent = stop - start if body else 0
            state._record(self._record_of(relative, range_header, int(status), sent))
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(length))
            self.end_headers()
            if body:
                self._send_body(f, start, stop)

    def _record_of(self, relative: str, range_header: str | None, status: int, sent: int) -> RequestRecord:
        return RequestRecord(
            self.command, "/" + relative, range_header, status, sent, self.path, self.headers.get("Authorization")
        )

    def _send_body(self, f: BinaryIO, start: int, stop: int) -> None:
        fd = f.fileno()
        while start < stop:
            chunk = os.pread(fd, min(_CHUNK, stop - start), start)
            if not chunk:  # the file shrank under us: close rather than send short
                self.close_connection = True
                return
            self.wfile.write(chunk)
            start += len(chunk)

    def _finish(
        self,
        status: HTTPStatus,
        relative: str,
        range_header: str | None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.server_state._record(self._record_of(relative, range_header, int(status), 0))
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", "0")
        self.end_headers()


def _matches(if_match: str, etag: str) -> bool:
    tags = [t.strip() for t in if_match.split(",")]
    return "*" in tags or etag in tags
