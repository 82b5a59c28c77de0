"""Reading every file's header: batches, progress, and threads only where files show latency."""

from __future__ import annotations

import math

import numpy as np
import pytest


@pytest.mark.parametrize("n", [1, 255, 256, 257, 1000])
@pytest.mark.parametrize("threads", [None, 1, 3])
def test_scan_headers_reports_progress_per_batch_without_changing_results(tmp_path, n, threads):
    from npydask.dataset.scan import _BATCH, scan_headers

    paths = []
    for i in range(n):
        p = tmp_path / f"f{i:04d}.npy"
        np.save(p, np.zeros((i % 3 + 1, 2), ["<f4", ">i2"][i % 2]))
        paths.append(str(p))
    paths.insert(n // 2, str(tmp_path / "missing.npy"))  # a failure in the middle stays in its place
    seen: list[int] = []
    watched = scan_headers(paths, threads=threads, progress=seen.append)
    plain = scan_headers(paths, threads=threads)
    assert [type(r) for r in watched] == [type(r) for r in plain]
    assert [r[1] for r in watched if not isinstance(r, BaseException)] == [
        r[1] for r in plain if not isinstance(r, BaseException)
    ]
    assert isinstance(watched[n // 2], FileNotFoundError)
    for p, r in zip(paths, watched):
        if not isinstance(r, BaseException):
            assert r[1].shape == np.load(p).shape and r[1].dtype == np.load(p).dtype
    assert seen == sorted(seen) and seen[-1] == len(paths)  # counts only grow and end at every file
    assert len(seen) == math.ceil(len(paths) / _BATCH)  # once a batch, never per file


class _ColdAfter:
    """The local source, with the paths in ``cold`` served slowly (as a cold part of a folder is).

    Time is this source's own clock: ``scanning.time`` is patched to it, and each
    call adds 2 ms a cold file and 1 us a warm one (calls on threads add up, as if
    the threads did not overlap). ``scan_headers`` then compares what the files
    cost with its real thresholds (40 us a file to leave, 25 us a file to come
    back), never how loaded the machine running the test is: timed with real
    sleeps, a loaded CI machine once held the warm threaded rounds over the limit.
    """

    mappable = True
    concurrent = False

    def __init__(self, cold, monkeypatch):
        import threading
        import types

        from npydask.dataset import scan as scanning
        from npydask.storage.local import LOCAL

        self.local, self.cold, self.where = LOCAL, set(cold), []
        self.now, self._lock = 0.0, threading.Lock()
        monkeypatch.setattr(scanning, "time", types.SimpleNamespace(perf_counter=lambda: self.now))

    def scan(self, paths, key=None):
        import threading

        cost = (2e-3 if self.cold.intersection(paths) else 1e-6) * len(paths)
        with self._lock:
            self.now += cost
        self.where.append((threading.current_thread().name, len(paths)))
        return self.local.scan(paths, key)


@pytest.mark.parametrize("progress", [False, True])
def test_scan_headers_hands_the_rest_to_threads_once_a_later_batch_is_slow(tmp_path, progress, monkeypatch):
    from npydask.dataset import scan as scanning
    from npydask.dataset.scan import _BATCH, scan_headers

    monkeypatch.setattr(scanning, "_STEP", _STEP := 2 * _BATCH)  # (short slow batches)

    np.save(tmp_path / "a.npy", np.arange(6, dtype="<i2"))
    np.save(tmp_path / "b.npy", np.arange(6, dtype="<i2"))
    cold_from = _BATCH + _STEP  # the first batch and the next step are fast (a.npy); the rest is slow (b.npy)
    n = cold_from + 3 * _STEP
    names = [str(tmp_path / "a.npy")] * cold_from + [str(tmp_path / "b.npy")] * (n - cold_from)
    source = _ColdAfter(names[cold_from:], monkeypatch)
    seen: list[int] = []
    got = scan_headers(names, source=source, progress=seen.append if progress else None)
    assert len(got) == n and all(r[1].shape == (6,) for r in got)
    main = [w for w in source.where if not w[0].startswith("npydask-scan")]
    threaded = [w for w in source.where if w[0].startswith("npydask-scan")]
    assert sum(k for _, k in main) + sum(k for _, k in threaded) == n
    # the fast part ran in this thread; after the first slow batch, the rest ran on the pool
    assert sum(k for _, k in main) == cold_from + (_BATCH if progress else _STEP)
    assert threaded, "a slow batch after a fast first one never handed the rest to threads"
    if progress:
        assert seen[-1] == n and seen == sorted(seen)


def test_scan_headers_comes_back_to_this_thread_once_the_threads_run_at_cache_speed(tmp_path, monkeypatch):
    from npydask.dataset import scan as scanning
    from npydask.dataset.scan import _BATCH, scan_headers

    monkeypatch.setattr(scanning, "_STEP", _STEP := 8 * _BATCH)  # (short slow rounds)

    np.save(tmp_path / "a.npy", np.arange(6, dtype="<i2"))
    np.save(tmp_path / "b.npy", np.arange(6, dtype="<i2"))
    warm_from = _BATCH + _STEP  # the first batch is slow (threads start), the next round is too, the rest is fast
    n = warm_from + 3 * _STEP
    names = [str(tmp_path / "b.npy")] * warm_from + [str(tmp_path / "a.npy")] * (n - warm_from)
    source = _ColdAfter(names[:warm_from], monkeypatch)
    got = scan_headers(names, source=source)
    assert len(got) == n and all(r[1].shape == (6,) for r in got)
    order = ["pool" if name.startswith("npydask-scan") else "main" for name, _ in source.where]
    assert order[0] == "main" and "pool" in order
    # one fast round on the threads, then this thread again for the rest
    assert order[-1] == "main", [(o, k) for (_, k), o in zip(source.where, order)]
    assert sum(k for (name, k), o in zip(source.where, order) if o == "pool") == 2 * _STEP


def test_scan_headers_stays_in_this_thread_with_threads_1_however_slow(tmp_path, monkeypatch):
    from npydask.dataset.scan import _BATCH, scan_headers

    np.save(tmp_path / "a.npy", np.arange(6, dtype="<i2"))
    paths = [str(tmp_path / "a.npy")] * (3 * _BATCH)
    source = _ColdAfter(paths, monkeypatch)
    got = scan_headers(paths, source=source, threads=1)
    assert len(got) == len(paths)
    assert not [w for w in source.where if w[0].startswith("npydask-scan")]
