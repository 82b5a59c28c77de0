"""Local reads of many spans: several ``preadv`` calls in flight, and asking the page cache without reading."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from npydask.config import read_options
from npydask.errors import FileChangedError
from npydask.plan.patch_runs import Spans
from npydask.storage import _local_read, acquire, pages_cached
from npydask.storage._local_read import SPAN_SPLIT_BYTES, read_local_spans
from npydask.testing import drop_page_cache


def _file(tmp_path: Path, nbytes: int, seed: int = 0) -> tuple[str, np.ndarray]:
    """A ``.npy`` file of random bytes, and the whole file's bytes (offsets below are the file's)."""
    path = str(tmp_path / "blob.npy")
    np.save(path, np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8))
    return path, np.fromfile(path, np.uint8)


def _spans(rng: np.random.Generator, size: int, n: int, longest: int) -> Spans:
    """``n`` disjoint spans of ``[0, size)`` in a shuffled buffer order."""
    starts = np.sort(rng.choice(size // longest, n, replace=False)) * longest
    lengths = rng.integers(1, longest, n)
    order = rng.permutation(n)
    offsets, lengths = starts[order].astype(np.int64), lengths[order].astype(np.int64)
    positions = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return Spans(offsets, lengths, positions)


def _expected(data: np.ndarray, spans: Spans) -> np.ndarray:
    return np.concatenate([data[o : o + n] for o, n in zip(spans.offsets.tolist(), spans.lengths.tolist())])


def test_many_spans_are_read_on_several_threads_each_byte_in_place(tmp_path: Path) -> None:
    path, data = _file(tmp_path, 24 << 20)
    f = acquire(path)
    rng = np.random.default_rng(1)
    spans = _spans(rng, len(data), 300, 64 << 10)
    assert spans.nbytes >= SPAN_SPLIT_BYTES
    seen: set[str] = set()
    real = _local_read._read_spans

    def spy(*args: object) -> None:
        seen.add(threading.current_thread().name)
        real(*args)  # type: ignore[arg-type]

    dest = np.zeros(spans.nbytes, np.uint8)
    _local_read._read_spans = spy  # type: ignore[assignment]
    try:
        assert read_local_spans(f, spans, dest, read_options()) == 300
    finally:
        _local_read._read_spans = real  # type: ignore[assignment]
    np.testing.assert_array_equal(dest, _expected(data, spans))
    assert len(seen) > 1 and all(name.startswith("npydask-spans") for name in seen)
    # a few small spans: the caller's thread alone
    small = Spans(spans.offsets[:3], np.minimum(spans.lengths[:3], 100), np.array([0, 100, 200], np.int64))
    small = small._replace(positions=np.concatenate([[0], np.cumsum(small.lengths)[:-1]]).astype(np.int64))
    dest = np.zeros(small.nbytes, np.uint8)
    assert read_local_spans(f, small, dest, read_options()) == 3
    np.testing.assert_array_equal(dest, _expected(data, small))


def test_span_reads_from_many_threads_at_once_never_mix_their_bytes(tmp_path: Path) -> None:
    path, data = _file(tmp_path, 16 << 20, seed=2)
    f = acquire(path)
    bad: list[str] = []

    def worker(k: int) -> None:
        rng = np.random.default_rng(100 + k)
        for _ in range(25):
            spans = _spans(rng, len(data), 120, 96 << 10)
            dest = np.empty(spans.nbytes, np.uint8)
            read_local_spans(f, spans, dest, read_options())
            if not np.array_equal(dest, _expected(data, spans)):
                bad.append(f"thread {k}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


def test_a_span_past_the_end_fails_with_the_file_named(tmp_path: Path) -> None:
    path, data = _file(tmp_path, 8 << 20, seed=3)
    f = acquire(path)
    n = 1 << 20
    spans = Spans(
        np.array([0, 2 * n, len(data) - n // 2, 4 * n], np.int64),
        np.full(4, n, np.int64),
        np.arange(4, dtype=np.int64) * n,
    )
    with pytest.raises(FileChangedError, match="file ended at byte") as e:
        read_local_spans(f, spans, np.empty(4 * n, np.uint8), read_options())
    assert e.value.filename == path


@pytest.mark.skipif(not hasattr(os, "RWF_NOWAIT"), reason="RWF_NOWAIT is Linux's")
def test_pages_cached_asks_without_reading(tmp_path: Path) -> None:
    path, data = _file(tmp_path, 8 << 20, seed=4)
    f = acquire(path)
    assert pages_cached(f, [0, 4 << 20, len(data) - 1])  # (just written)
    if not drop_page_cache(path):
        pytest.skip("this file system keeps a file's pages in memory (tmpfs): nothing to evict")
    f = acquire(path)
    offsets = [0, 4 << 20, len(data) - 1]
    assert not pages_cached(f, offsets)
    assert not pages_cached(f, offsets)  # (asking read nothing)
    os.preadv(f.fd, [memoryview(bytearray(4096))], 4 << 20)  # one page read
    assert pages_cached(f, [4 << 20])
    assert pages_cached(f, [])
