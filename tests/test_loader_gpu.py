"""``Loader(device="gpu")`` on the CPU: which device each prefetch read runs under, and the stream hand-off.

A stand-in for CuPy over host memory keeps a current device per thread (0 in
a new thread, as CUDA does) and logs allocations, events recorded and events
waited on. Whether a real batch lands on the caller's GPU and whether its
copy kernels finish before the consumer reads it only a GPU shows: the
device probe ``loader_torch_gpu`` in ``ci/gpu_probes.py`` checks the values
and the device on one GPU; the device of prefetch threads needs two.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import types

import numpy as np
import pytest

import npydask
from npydask.gpu import device as gpu
from npydask.gpu import process as gpu_process


class _DeviceArray(np.ndarray):
    def set(self, host):
        self[...] = host


class FakeCupy:
    """CuPy's device, stream and event calls over host memory, with a log of who did what where."""

    __name__ = "cupy"
    ndarray = _DeviceArray
    uint8 = np.uint8

    def __init__(self):
        self.log = []
        self.events = itertools.count()
        self.local = threading.local()
        self.cuda = types.SimpleNamespace(
            runtime=types.SimpleNamespace(getDevice=self.current),
            Device=self.Device,
            Event=self.Event,
            get_current_stream=self.stream,
            alloc_pinned_memory=bytearray,
        )

    def current(self):
        return getattr(self.local, "device", 0)

    def note(self, *what):
        self.log.append((*what, threading.current_thread().name, self.current()))

    def empty(self, shape, dtype=float):
        self.note("alloc")
        return np.empty(shape, dtype).view(_DeviceArray)

    def asarray(self, a):
        self.note("alloc")
        return np.asarray(a).view(_DeviceArray)

    def Device(self, device_id):  # noqa: N802 (CuPy's name)
        fake = self

        class _Device:
            def __enter__(self):
                self.before = fake.current()
                fake.local.device = device_id

            def __exit__(self, *exc):
                fake.local.device = self.before

        return _Device()

    def Event(self, disable_timing=False):  # noqa: N802
        fake = self
        number = next(self.events)  # (not id(): a freed event's id is given to the next one)

        class _Event:
            serial = number

            def record(self, stream=None):
                fake.note("record", self.serial)

            def synchronize(self):  # (the pinned ring waits on its buffers' events before reuse)
                fake.note("event synchronize", self.serial)

        return _Event()

    def stream(self):
        fake = self
        return types.SimpleNamespace(synchronize=lambda: None, wait_event=lambda ev: fake.note("wait", ev.serial))


@pytest.fixture
def fake_cupy(monkeypatch):
    xp = FakeCupy()
    monkeypatch.setattr(gpu, "require_gpu", lambda: None)
    monkeypatch.setattr(gpu, "array_module", lambda: xp)
    monkeypatch.setitem(sys.modules, "kvikio", None)  # (the pinned host path: no kvikio)
    return xp


@pytest.fixture
def folder(tmp_path):
    for i in range(10):
        np.save(tmp_path / f"{i}.npy", np.asfortranarray(np.arange(12, dtype=">f4").reshape(3, 4) + i))
    return tmp_path


@pytest.mark.parametrize("prefetch", [1, 2])
def test_prefetch_reads_run_on_the_callers_device_and_hand_over_by_event(folder, fake_cupy, prefetch):
    xp = fake_cupy
    ds = npydask.open_dataset(folder)
    loader = npydask.Loader(ds, 3, device="gpu", prefetch=prefetch, with_index=True)
    with xp.Device(2):  # the caller's device (torch.cuda.set_device(rank) under DDP)
        got = []
        for batch, idx in loader:
            xp.note("yield")
            assert isinstance(batch, _DeviceArray)
            np.testing.assert_array_equal(batch, np.stack([np.load(ds.files[i]) for i in idx]).astype("<f4"))
            got += idx.tolist()
    assert got == list(range(10))
    reads = [e for e in xp.log if e[0] == "alloc"]
    assert reads and all(e[-2].startswith("npydask-loader") and e[-1] == 2 for e in reads), reads
    # each batch: an event recorded on the reading thread (under device 2) after its reads, then waited on by the
    # consumer (the main thread) before the batch is yielded
    # (the pinned ring records events of its own for its buffers, waited on by event.synchronize, not by a stream)
    every = [e for e in xp.log if e[0] == "record"]
    assert all(e[-2].startswith("npydask-loader") and e[-1] == 2 for e in every), every
    waited = {e[1] for e in xp.log if e[0] == "wait"}
    records = [e for e in every if e[1] in waited]
    assert len(records) == 4
    for record in records:
        at = xp.log.index(record)
        wait = next(k for k, e in enumerate(xp.log) if e[0] == "wait" and e[1] == record[1])
        assert xp.log[wait][-2] == threading.current_thread().name and at < wait
        assert xp.log[wait + 1][0] == "yield"  # the wait comes right before the batch is handed over


def test_without_prefetch_reads_run_in_the_callers_thread_with_no_hand_off(folder, fake_cupy):
    xp = fake_cupy
    with xp.Device(1):
        batches = list(npydask.Loader(npydask.open_dataset(folder), 4, device="gpu", prefetch=0))
    assert len(batches) == 3
    assert {e[-2:] for e in xp.log if e[0] == "alloc"} == {(threading.current_thread().name, 1)}
    assert not [
        e for e in xp.log if e[0] == "wait"
    ]  # no hand-off (the ring's own events are not waited on by a stream)


def _iterate_in_child(loader):
    try:
        next(iter(loader))
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "read"


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork:DeprecationWarning")  # (3.12+)
def test_a_loader_iterated_in_a_child_forked_after_cuda_was_used_is_refused(folder, fake_cupy, monkeypatch):
    import multiprocessing

    loader = npydask.Loader(npydask.open_dataset(folder), 4, device="gpu")
    monkeypatch.setattr(gpu_process, "_CUDA_PID", os.getpid())
    with multiprocessing.get_context("fork").Pool(1) as pool:
        said = pool.apply(_iterate_in_child, (loader,))
    assert said.startswith("GpuUnavailableError") and "num_workers=0" in said
    monkeypatch.setattr(gpu_process, "_CUDA_PID", None)
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply(_iterate_in_child, (loader,)) == "read"


def test_a_sampler_window_is_read_on_the_callers_device_and_handed_over_by_event(tmp_path, fake_cupy):
    from npydask.samplers import Grid

    xp = fake_cupy
    arrays = [np.arange(8 * 10, dtype="<f4").reshape(8, 10) + 100 * i for i in range(3)]
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"{i}.npy", a)
    ds = npydask.open_dataset(tmp_path)
    loader = npydask.Loader(ds, 2, sampler=Grid((4, 4), fill_value=-1), device="gpu", prefetch=6, with_index=True)
    with npydask.config.set(patch_read="spans"), xp.Device(2):
        n = 0
        for batch, index in loader:
            xp.note("yield")
            assert isinstance(batch, _DeviceArray)
            for slot, f, a, b in zip(batch, index["file"], index["start"], index["stop"]):
                want = np.full((4, 4), -1, "<f4")
                cut = arrays[f][a[0] : b[0], a[1] : b[1]]
                want[: cut.shape[0], : cut.shape[1]] = cut
                np.testing.assert_array_equal(slot, want)
            n += 1
    assert n == len(loader)
    reads = [e for e in xp.log if e[0] == "alloc"]
    assert reads and all(e[-2].startswith("npydask-loader") and e[-1] == 2 for e in reads), reads
    # one hand-off per window of three batches, waited on by the consumer before the window's first batch
    mine = [e[0] for e in xp.log if e[-2] == threading.current_thread().name]
    assert mine == (["wait", "yield", "yield", "yield"] * n)[: len(mine)] and mine.count("yield") == n
    waited = {e[1] for e in xp.log if e[0] == "wait"}
    assert all(e[-2].startswith("npydask-loader") for e in xp.log if e[0] == "record" and e[1] in waited)
