"""The counting proxy's faults, measured with real clients against a real server.

Each fault is observed from the client's side (a delay at least as long as
set, the slow tail's share exactly the seeded draws, 503 answers beyond the
rate with obstore's retries off) and in :class:`ProxyCounts`.
"""

from __future__ import annotations

import http.client
import random
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

from npydask.testing._framing import ResponseFramer
from npydask.testing.counting_proxy import CountingProxy, Faults

DATA = bytes(range(256)) * 40  # 10,240 bytes


@pytest.fixture
def server(tmp_path, http_server):
    (tmp_path / "d").mkdir()  # (under a folder: a GET of "/d/a.bin" is an object GET, not a LIST)
    (tmp_path / "d" / "a.bin").write_bytes(DATA)
    return http_server(tmp_path)


def _get(conn: http.client.HTTPConnection, method: str = "GET", path: str = "/d/a.bin") -> tuple[int, bytes, float]:
    start = time.monotonic()
    conn.request(method, path, headers={"Range": "bytes=0-99"} if method == "GET" else {})
    response = conn.getresponse()
    body = response.read()
    return response.status, body, time.monotonic() - start


def test_delay_and_slowdown_hold_every_response_and_change_while_running(server):
    with CountingProxy(server.endpoint, delay=0.05) as proxy:
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        first = [_get(conn) for _ in range(3)] + [_get(conn, "HEAD")]
        proxy.set_faults(slowdown=0.1)
        second = [_get(conn) for _ in range(3)]
        proxy.set_faults(delay=0.0, slowdown=0.0)
        third = [_get(conn) for _ in range(3)]
        conn.close()
        counts = proxy.counts
    assert all(status == 206 and body == DATA[:100] for status, body, _ in first[:3] + second + third)
    assert first[3][:2] == (200, b"")
    assert min(t for *_, t in first) >= 0.05
    assert min(t for *_, t in second) >= 0.15
    assert min(t for *_, t in first) < 0.15 or min(t for *_, t in third) < 0.05  # (the changes took effect)
    assert counts.delayed == 7 and counts.tail == counts.rejected == counts.cancelled == 0
    assert counts.requests == {"GET": 9, "HEAD": 1} and counts.connections == 1


def test_a_held_request_holds_only_its_own_connection(server):
    """While one connection's GET is held 1 s (a tail of every GET), another connection's HEADs go through."""
    with CountingProxy(server.endpoint) as proxy:
        proxy.set_faults(tail_share=1.0, tail_delay=1.0)
        slow = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        fast = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(_get, slow)
            time.sleep(0.1)
            heads = [_get(fast, "HEAD") for _ in range(5)]
            done_while_held = not held.done()
            status, body, took = held.result()
        slow.close()
        fast.close()
        counts = proxy.counts
    assert done_while_held and sum(t for *_, t in heads) < 0.8
    assert (status, body) == (206, DATA[:100]) and took >= 1.0
    assert counts.delayed == counts.tail == 1


def test_slow_tail_share_is_the_seeded_draws_of_gets(server):
    """400 GETs on 16 connections, 10% 0.2 s late: exactly the seeded draws, within a binomial bound, seen late."""
    n, share, late, connections = 400, 0.1, 0.2, 16
    with CountingProxy(server.endpoint, tail_share=share, tail_delay=late, seed=7) as proxy:

        def worker(_: int) -> list[float]:
            conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
            times = []
            for _ in range(n // connections):
                status, body, took = _get(conn)
                assert (status, body) == (206, DATA[:100])
                times.append(took)
            _get(conn, "HEAD")  # (never in the tail)
            conn.close()
            return times

        with ThreadPoolExecutor(connections) as pool:
            times = [t for ts in pool.map(worker, range(connections)) for t in ts]
        counts = proxy.counts
    rng = random.Random(7)
    drawn = sum(rng.random() < share for _ in range(n))
    assert counts.tail == counts.delayed == drawn
    sd = (n * share * (1 - share)) ** 0.5
    assert abs(counts.tail - n * share) < 4 * sd
    seen = sum(t >= late for t in times)
    assert drawn <= seen <= drawn + n // 50, (
        drawn,
        seen,
    )  # (every tail GET was seen late; a few others may be, on a busy machine)
    assert counts.requests == {"GET": n, "HEAD": connections}


def test_rate_above_the_limit_is_answered_slow_down_and_kept_alive(server):
    """One connection: beyond 5 requests in the window, 503 Slow Down with a body; the connection is reused."""
    with CountingProxy(server.endpoint, max_request_rate=5, rate_window=1.0) as proxy:
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        start = time.monotonic()
        answers = [_get(conn) for _ in range(8)] + [_get(conn, "HEAD")]
        elapsed = time.monotonic() - start
        conn.close()
        counts = proxy.counts
    assert elapsed < 1.0  # (all within one window)
    assert [status for status, *_ in answers] == [206] * 5 + [503] * 4
    assert all(
        body.startswith(b'<?xml version="1.0"') and b"<Code>SlowDown</Code>" in body for _, body, _ in answers[5:8]
    )
    assert answers[8][1] == b""  # (a HEAD's 503 has no body)
    assert counts.rejected == 4 and counts.connections == 1
    assert server.stats.requests == 5  # (the rejected requests never reached the server)


def test_obstore_without_retries_sees_503_beyond_the_rate(server):
    obstore = pytest.importorskip("obstore")
    from obstore.store import HTTPStore

    limit, window = 10, 0.5
    with CountingProxy(server.endpoint, max_request_rate=limit / window, rate_window=window) as proxy:
        store = HTTPStore.from_url(
            proxy.endpoint,
            client_options={"allow_http": True},
            retry_config={"max_retries": 0, "retry_timeout": timedelta(seconds=1)},
        )
        ok, errors = 0, []
        start = time.monotonic()
        for _ in range(30):
            try:
                got = obstore.get(store, "d/a.bin", options={"range": (0, 100)})
            except Exception as e:  # noqa: BLE001 - obstore's error for a 503 is a GenericError
                errors.append(str(e))
                continue
            assert bytes(got.bytes()) == DATA[:100]
            ok += 1
        elapsed = time.monotonic() - start
        counts = proxy.counts
    assert ok + len(errors) == 30 and counts.rejected == len(errors) > 0
    assert all("503" in e and "SlowDown" in e for e in errors), errors[:1]
    assert limit <= ok <= limit * (1 + int(elapsed / window)), (ok, elapsed)
    assert server.stats.requests == ok


def test_pipelined_requests_get_the_503_after_the_earlier_response_then_close(server):
    """A rejected request waits for its connection's earlier responses; ``Connection: close`` closes after it."""
    with CountingProxy(server.endpoint, max_request_rate=1, rate_window=1.0) as proxy:
        client = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        body = b"GET /d/a.bin HTTP/1.1\r\n\r\n"  # (a body, not a request)
        client.sendall(
            b"GET /d/a.bin HTTP/1.1\r\nHost: x\r\n\r\n"
            + b"PUT /d/b.bin HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
            + body
            + b"GET /d/a.bin HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        stream = b""
        while chunk := client.recv(1 << 16):
            stream += chunk
        client.close()
        counts = proxy.counts
    first, rest = stream.split(b"\r\n\r\n", 1)
    assert first.startswith(b"HTTP/1.1 200") and rest.startswith(DATA)
    second, third = rest[len(DATA) :].split(b"HTTP/1.1 503 Slow Down", 2)[1:]
    assert b"Connection: keep-alive" in second and b"Connection: close" in third
    assert counts.requests == {"GET": 2, "PUT": 1} and counts.rejected == 2
    assert server.stats.requests == 1


def test_a_client_closing_while_held_cancels_the_request(server):
    with CountingProxy(server.endpoint, delay=2.0) as proxy:
        client = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        client.sendall(b"GET /d/a.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.1)
        client.close()
        deadline = time.monotonic() + 1.5
        while proxy.counts.cancelled == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proxy.counts.cancelled == 1  # (seen before the 2 s were over)
        proxy.set_faults(delay=0.0)
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        assert _get(conn)[:2] == (206, DATA[:100])  # (the proxy goes on)
        conn.close()
    assert [r.method for r in server.stats.log] == ["GET"]


def test_stop_ends_held_requests_at_once(server):
    proxy = CountingProxy(server.endpoint, delay=5.0).start()
    client = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    client.sendall(b"GET /d/a.bin HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(0.1)
    start = time.monotonic()
    proxy.stop()
    assert time.monotonic() - start < 2
    assert client.recv(10) == b""
    client.close()
    assert server.stats.requests == 0


def test_faults_are_checked():
    for bad in [
        {"delay": -1},
        {"slowdown": float("nan")},
        {"tail_share": 1.5},
        {"max_request_rate": 0},
        {"rate_window": 0},
    ]:
        with pytest.raises(ValueError, match=next(iter(bad))):
            Faults(**bad)
    proxy = CountingProxy("http://127.0.0.1:9")
    with pytest.raises(TypeError, match="unknown fault 'tail'"):
        proxy.set_faults(tail=0.1)
    with pytest.raises(ValueError, match="tail_share"):
        CountingProxy("http://127.0.0.1:9", tail_share=-0.1)
    assert proxy.set_faults(tail_share=0.5, tail_delay=1.0) == proxy.faults == Faults(tail_share=0.5, tail_delay=1.0)


@pytest.mark.parametrize("piece", [1, 2, 5, 4096])
def test_response_framer_follows_any_split(piece):
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;x=y\r\nabcd\r\n10\r\n"
        + b"z" * 16
        + b"\r\n0\r\nT: 1\r\n\r\n"
    )
    stream = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n"
        + chunked
        + b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nHTTP/1.1 200"
        b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n"  # (a HEAD's: no body)
        b"HTTP/1.1 304 Not Modified\r\n\r\n"
        b"HTTP/1.1 503 Slow Down\r\nContent-Length: 3\r\n\r\nabc"
    )
    framer = ResponseFramer()
    framer.methods.extend(["PUT", "GET", "GET", "HEAD", "GET", "GET"])
    done = [framer.feed(stream[i : i + piece]) for i in range(0, len(stream), piece)]
    assert sum(done) == 6 and not framer.lost and not framer.methods
    framer = ResponseFramer()
    framer.methods.append("GET")
    assert framer.feed(b"HTTP/1.0 200 OK\r\n\r\nuntil the end") == 0 and framer.lost


def test_many_clients_with_every_fault_at_once(server):
    """Threads on their own connections with a delay, a tail and a rate limit: every answer is whole, counts add up."""
    with CountingProxy(server.endpoint, delay=0.01, tail_share=0.2, tail_delay=0.05, max_request_rate=50) as proxy:

        def worker(_: int) -> list[int]:
            conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
            statuses = []
            for _ in range(20):
                status, body, _ = _get(conn)
                assert (status, body) == (206, DATA[:100]) or (status == 503 and b"SlowDown" in body)
                statuses.append(status)
            conn.close()
            return statuses

        with ThreadPoolExecutor(6) as pool:
            results = [s for ss in pool.map(worker, range(6)) for s in ss]
        counts = proxy.counts
    assert len(results) == 120 and counts.requests == {"GET": 120} and counts.delayed == 120
    assert 0 < counts.rejected == results.count(503) and server.stats.requests == results.count(206)
