"""The buffer pool: large chunk buffers reused once no array views them, never wrong data."""

from __future__ import annotations

import gc
import multiprocessing
import threading
import time

import numpy as np
import pytest

import npydask
from npydask import _buffers as _pool
from npydask._buffers import MIN_BYTES, BufferPool, empty, pooled

MiB = 1 << 20


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_small_arrays_are_plain_numpy():
    a = empty((10, 10), "<f8")
    assert a.flags.owndata and not pooled(a)
    assert empty((0,), "f4").shape == (0,)
    assert empty((MIN_BYTES // 8 - 1,), "f8").flags.owndata


@pytest.mark.parametrize("dtype", ["<f4", ">i8", "u1", "c16", [("a", "<i4"), ("b", ">f8")], "S3"])
def test_large_arrays_are_pooled_writeable_and_c_ordered(dtype):
    n = MIN_BYTES // np.dtype(dtype).itemsize + 3
    a = empty((n,), dtype)
    assert pooled(a) and a.flags.writeable and a.flags.c_contiguous and not a.flags.owndata
    assert a.shape == (n,) and a.dtype == np.dtype(dtype)
    assert address(a) % 4096 == 0
    b = empty((4, MiB), "<f4").reshape(2, 2, MiB)
    assert pooled(b) and pooled(b[1, :, 3:]) and pooled(b.T)


def test_a_buffer_returns_when_its_last_view_is_gone_and_is_handed_out_again():
    p = BufferPool()
    a = p.take(5 * MiB, limit=64 * MiB)
    where = address(a)
    view = a[100:].view("<f4")[::3]
    del a
    gc.collect()
    assert p.idle_bytes == 0, "a live view must keep the buffer out of the pool"
    del view
    assert p.idle_bytes == 6 * MiB  # rounded up to 2 MiB
    again = p.take(5 * MiB + 17, limit=64 * MiB)
    assert address(again) == where and p.idle_bytes == 0
    other = p.take(9 * MiB, limit=64 * MiB)  # another size: a new buffer
    assert address(other) != where


def test_the_cap_drops_buffers_beyond_it():
    p = BufferPool()
    held = [p.take(4 * MiB, limit=8 * MiB) for _ in range(3)]
    del held
    assert p.idle_bytes == 8 * MiB
    p.trim(0)
    assert p.idle_bytes == 0


def test_pool_bytes_zero_turns_pooling_off():
    with npydask.config.set(pool_bytes=0):
        a = empty((2 * MiB,), "<f4")
    assert a.flags.owndata and not pooled(a)


def test_idle_buffers_are_released_after_a_while(monkeypatch):
    monkeypatch.setattr(_pool, "IDLE_SECONDS", 0.05)
    p = BufferPool()
    a = p.take(4 * MiB, limit=64 * MiB)
    del a
    assert p.idle_bytes == 4 * MiB
    deadline = time.monotonic() + 5
    while p.idle_bytes and time.monotonic() < deadline:
        time.sleep(0.02)
    assert p.idle_bytes == 0


def _child_idle(q) -> None:
    q.put(_pool.pool().idle_bytes)


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_a_forked_child_starts_with_an_empty_pool():
    a = empty((2 * MiB,), "<f4")
    del a
    assert _pool.pool().idle_bytes > 0
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    child = ctx.Process(target=_child_idle, args=(q,))
    child.start()
    got = q.get(timeout=30)
    child.join(30)
    assert got == 0


def test_threads_never_share_a_buffer():
    """Each thread writes its own pattern into pooled buffers and reads it back intact."""
    errors = []

    def work(k: int) -> None:
        for i in range(30):
            a = empty((MiB + k,), "<f4")
            a[:] = k * 1000 + i
            time.sleep(0)
            if not (a == k * 1000 + i).all():
                errors.append((k, i))
            del a

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@pytest.mark.parametrize("order", ["C", "F"])
def test_repeated_reads_through_the_pool_equal_numpy(tmp_path, order):
    """Reused buffers hold the previous chunk's bytes: every read must overwrite all of them."""
    a = (
        np.asfortranarray(np.arange(3 * 512 * 1024, dtype="<f4").reshape(3, 512, 1024))
        if order == "F"
        else (np.arange(3 * 512 * 1024, dtype="<f4").reshape(3, 512, 1024))
    )
    b = -a
    pa, pb = tmp_path / "a.npy", tmp_path / "b.npy"
    np.save(pa, a)
    np.save(pb, b)
    for _ in range(3):
        for p, want in ((pa, a), (pb, b)):
            x = npydask.from_npy(p, chunks=(2, 512, 1024), backend="pread")
            got = x.compute(scheduler="threads")
            np.testing.assert_array_equal(got, want)
            block = npydask.read_region(p, (1, 0, 0), (3, 512, 1024))
            np.testing.assert_array_equal(block, want[1:3])
    ds = npydask.open_dataset(
        tmp_path, roi_start=(0, 100, 0), roi_shape=(3, 600, 1024), out_of_bounds_policy="pad", fill_value=5
    )
    for _ in range(2):
        got = ds.stack().compute(scheduler="threads")
        want = np.full((2, 3, 600, 1024), 5, "<f4")
        want[0, :, :412] = a[:, 100:]
        want[1, :, :412] = b[:, 100:]
        np.testing.assert_array_equal(got, want)
