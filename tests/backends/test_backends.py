"""Host backends: the shared conformance suite, then what is particular to each.

Every backend (and ``pread`` with ``O_DIRECT``) passes
:class:`~npydask.testing.conformance.BackendConformance`. The tests below add
O_DIRECT alignment and fallback, how many bytes a region read really asks
for, the zero-copy mapping, the ``auto`` choice, and the per-process handle
cache under replacement, eviction, deletion and threads.
"""

from __future__ import annotations

import errno
import fcntl
import gc
import mmap
import os
import struct
import threading
import types
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import npydask
from npydask import config
from npydask.backends import mmap as mmap_backend
from npydask.errors import FileChangedError, NpyDaskWarning
from npydask.plan.region import Box, plan_read
from npydask.reader import FileRef, choose_backend, read_region
from npydask.storage import _handles
from npydask.storage import _local_read as pread_backend
from npydask.testing.conformance import (
    BackendConformance,
    assert_same_array,
    direct_io_supported,
    expected_region,
    random_regions,
    sample_array,
)

O_DIRECT = getattr(os, "O_DIRECT", 0)


class TestPread(BackendConformance):
    backend_name = "pread"


class TestPreadDirect(BackendConformance):
    backend_name = "pread"
    direct_io = True


class TestMmap(BackendConformance):
    backend_name = "mmap"


class TestAuto(BackendConformance):
    backend_name = "auto"


# --------------------------------------------------------------------------
# Helpers


def write_padded_v2(path: Path, array: np.ndarray, data_offset: int = 4096) -> None:
    """Write a version 2.0 file by hand whose header is padded so the payload starts at ``data_offset``."""
    text = "{'descr': %r, 'fortran_order': False, 'shape': %r, }" % (array.dtype.str, array.shape)
    hlen = data_offset - 12  # magic (6) + version (2) + uint32 length (4)
    assert len(text) < hlen
    header = (text.ljust(hlen - 1) + "\n").encode("latin1")
    path.write_bytes(b"\x93NUMPY\x02\x00" + struct.pack("<I", hlen) + header + np.ascontiguousarray(array).tobytes())


class PreadvCounter:
    """Wraps ``os.preadv``: records (O_DIRECT?, offset, length, buffer address) per call."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail: object = None) -> None:
        self.calls: list[tuple[bool, int, int, int]] = []
        self._real = os.preadv
        self._fail = fail
        self._lock = threading.Lock()
        # _local_read.py and _handles.py both call os.preadv through the os module.
        monkeypatch.setattr(pread_backend.os, "preadv", self)
        monkeypatch.setattr(_handles.os, "preadv", self)

    def __call__(self, fd: int, buffers: list, offset: int, *args: int) -> int:
        direct = bool(fcntl.fcntl(fd, fcntl.F_GETFL) & O_DIRECT) if O_DIRECT else False
        length = sum(memoryview(b).nbytes for b in buffers)
        address = np.frombuffer(buffers[0], np.uint8).ctypes.data if length else 0
        with self._lock:
            self.calls.append((direct, offset, length, address))
        if self._fail is not None and self._fail(direct, offset, length, address):
            raise OSError(errno.EINVAL, "Invalid argument (simulated)")
        return self._real(fd, buffers, offset, *args)

    @property
    def total(self) -> int:
        return sum(c[2] for c in self.calls)


# --------------------------------------------------------------------------
# O_DIRECT


@pytest.fixture
def direct_ok(tmp_path: Path) -> None:
    if not O_DIRECT or not direct_io_supported(tmp_path):
        pytest.skip(f"the file system of {tmp_path} refuses O_DIRECT")


@pytest.mark.usefixtures("direct_ok")
def test_direct_io_header_padded_to_4096(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "padded.npy"
    values = sample_array((6, 1024), "<f4", seed=1)  # 4 KiB rows: payload aligned to the page
    write_padded_v2(path, values)
    header = npydask.read_header(path)
    assert (header.version, header.data_offset, header.nbytes) == ((2, 0), 4096, 6 * 4096)
    full = np.load(path)
    np.testing.assert_array_equal(full, values)
    counter = PreadvCounter(monkeypatch)
    regions = [((0, 0), (6, 1024)), ((2, 0), (3, 1024)), ((1, 1), (5, 1023)), ((5, 1000), (6, 1024)), ((0, 7), (6, 9))]
    with config.set(direct_io=True):
        for start, stop in regions:
            assert_same_array(read_region(str(path), start, stop), expected_region(full, start, stop), f"{start}")
    direct = [c for c in counter.calls if c[0]]
    assert direct, "no read went through the O_DIRECT descriptor"
    assert len(direct) == len(counter.calls), "a read fell back to the page cache"
    for _, offset, length, address in direct:
        assert offset % 4096 == 0 and length % 4096 == 0 and address % 4096 == 0, (offset, length, address)


@pytest.mark.usefixtures("direct_ok")
def test_direct_io_pieces_and_tail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Large reads go in aligned pieces; the tail of a file not a page multiple needs no fallback."""
    monkeypatch.setattr(pread_backend, "_DIRECT_PIECE", 3 * 4096)
    values = sample_array((5001,), ">f8", seed=2)  # 40 KiB payload, not page-sized
    path = tmp_path / "tail.npy"
    np.save(path, values)
    # A strict kernel refuses an unaligned O_DIRECT read even at EOF: never ask for one.
    counter = PreadvCounter(monkeypatch, fail=lambda direct, off, n, addr: direct and (off % 4096 or addr % 4096))
    with config.set(direct_io=True):
        for start, stop in [(0, 5001), (4990, 5001), (5000, 5001), (100, 4500), (1, 5000)]:
            got = read_region(path, (start,), (stop,))
            assert_same_array(got, values[start:stop], f"[{start}, {stop})")
    assert all(c[0] for c in counter.calls), "fell back to the page cache"


def test_direct_io_fallback_on_tmpfs() -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm")
    if direct_io_supported(shm):
        pytest.skip("this kernel's tmpfs accepts O_DIRECT (Linux >= 6.6): nothing falls back")
    path = shm / f"npydask-test-{os.getpid()}.npy"
    values = sample_array((50, 40), "<i4", seed=3)
    np.save(path, values)
    try:
        with config.set(direct_io=True), pytest.warns(NpyDaskWarning, match="O_DIRECT"):
            got = read_region(path, (3, 4), (40, 30))
        assert_same_array(got, values[3:40, 4:30], "fallback")
    finally:
        path.unlink()


def test_direct_io_fallback_when_open_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "a.npy"
    values = sample_array((30, 20), "<f8", seed=4)
    np.save(path, values)
    real_open = os.open

    def refusing_open(p, flags, *args, **kwargs):
        if flags & O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument (simulated)", p)
        return real_open(p, flags, *args, **kwargs)

    monkeypatch.setattr(_handles.os, "open", refusing_open)
    with config.set(direct_io=True):
        with pytest.warns(NpyDaskWarning, match="O_DIRECT") as record:
            assert_same_array(read_region(path, (1, 2), (29, 19)), values[1:29, 2:19], "first read")
        assert len(record) == 1
        assert str(path) in str(record[0].message)
        # Warned once per file: the second read is silent (warnings are errors here).
        assert_same_array(read_region(path), values, "second read")


def test_direct_io_fallback_when_read_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "a.npy"
    values = sample_array((30, 20), ">u2", seed=5)
    np.save(path, values)
    PreadvCounter(monkeypatch, fail=lambda direct, *_: direct)
    with config.set(direct_io=True):
        with pytest.warns(NpyDaskWarning, match="O_DIRECT"):
            assert_same_array(read_region(path, (0, 3), (30, 4)), values[:, 3:4], "first read")
        assert_same_array(read_region(path), values, "second read")


@pytest.mark.usefixtures("direct_ok")
def test_direct_handle_is_shared_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "a.npy"
    np.save(path, np.arange(10_000, dtype="<f4"))
    f = _handles.acquire(str(path))
    barrier = threading.Barrier(8)

    def grab(_: int) -> object:
        barrier.wait(timeout=30)
        return f.direct_file()

    with ThreadPoolExecutor(8) as pool:
        handles = list(pool.map(grab, range(8)))
    assert len({id(h) for h in handles}) == 1, "concurrent callers opened several O_DIRECT descriptors"
    assert fcntl.fcntl(handles[0].fileno(), fcntl.F_GETFL) & O_DIRECT
    # The O_DIRECT handle is opened by path: a file replaced meanwhile is refused, not read.
    _handles.clear_cache()
    g = _handles.acquire(str(path))
    np.save(tmp_path / "new.npy", np.zeros(10_000, "<f4"))
    os.replace(tmp_path / "new.npy", path)
    with pytest.raises(FileChangedError) as info:
        g.direct_file()
    assert str(path) in str(info.value)


# --------------------------------------------------------------------------
# Only the region's bytes are read


@pytest.fixture(scope="module")
def volume(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A 64x256x256 float32 file (16 MiB) in C and in Fortran order."""
    folder = tmp_path_factory.mktemp("volume")
    values = np.arange(64 * 256 * 256, dtype="<f4").reshape(64, 256, 256)
    c_path, f_path = folder / "c.npy", folder / "f.npy"
    np.save(c_path, values)
    np.save(f_path, np.asfortranarray(values))
    return str(c_path), str(f_path)


ROW = ((10, 20, 0), (11, 21, 256))
CUBE = ((30, 100, 100), (34, 104, 104))


@pytest.mark.parametrize("gap", [0, 4096, 64 * 1024])
@pytest.mark.parametrize("direct", [False, True], ids=["page-cache", "direct"])
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("region", [ROW, CUBE], ids=["row", "cube"])
def test_reads_only_the_region(
    volume: tuple[str, str], monkeypatch: pytest.MonkeyPatch, region, order: str, direct: bool, gap: int, tmp_path: Path
) -> None:
    if direct and not (O_DIRECT and direct_io_supported(Path(volume[0]).parent)):
        pytest.skip("O_DIRECT refused here")
    path = volume[0] if order == "C" else volume[1]
    header = npydask.read_header(path)
    _handles.acquire(path)  # the header read is not part of the count
    plan = plan_read(header, Box(*region))
    counter = PreadvCounter(monkeypatch)
    with config.set(gap_bytes=gap, direct_io=direct):
        got = read_region(path, *region)
    expected = np.arange(64 * 256 * 256, dtype="<f4").reshape(64, 256, 256)[tuple(slice(a, b) for a, b in zip(*region))]
    assert_same_array(got, expected, "region")
    # Each gap read over is at most `gap` bytes; O_DIRECT rounds each read out to pages.
    bound = plan.nbytes + (plan.n_runs - 1) * gap
    if direct:
        bound += len(counter.calls) * 2 * 4096
    assert plan.nbytes <= counter.total <= bound, (counter.total, bound, plan)
    if gap == 0 and not direct:
        assert counter.total == plan.nbytes
    if order == "C" or gap <= config.get("gap_bytes"):
        # (In a Fortran file these regions are runs just under 64 KiB apart: a 64 KiB gap
        # setting merges them by design, so only the bound above holds there.)
        assert counter.total <= header.nbytes // (10 if direct else 100)


def test_mmap_maps_each_open_file_once(volume: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """One mapping of the payload per open file, shared by every region read from it."""
    lengths: list[int] = []

    def counting_mmap(fd, length, *args, **kwargs):
        lengths.append(length)
        return mmap.mmap(fd, length, *args, **kwargs)

    fake = types.SimpleNamespace(**{k: getattr(mmap, k) for k in dir(mmap) if k.isupper()}, mmap=counting_mmap)
    monkeypatch.setattr(mmap_backend, "mmap", fake)
    path = volume[0]
    header = npydask.read_header(path)
    expected = np.load(path, mmap_mode="r")
    for region in (ROW, CUBE, ROW):
        got = read_region(path, *region, backend="mmap")
        assert_same_array(got, np.ascontiguousarray(expected[tuple(slice(a, b) for a, b in zip(*region))]), "region")
    assert lengths == [header.data_offset + header.nbytes]
    _handles.clear_cache()  # a new open file maps anew
    read_region(path, *ROW, backend="mmap")
    assert len(lengths) == 2


# --------------------------------------------------------------------------
# Zero-copy mapping and the auto choice


def test_mmap_zero_copy_for_contiguous_c_regions(save) -> None:
    values = sample_array((8, 5, 6), ">f8", seed=6)
    path = save(values)
    for start, stop in [(None, None), ((2,), (5,)), ((3, 1, 0), (4, 4, 6)), ((7, 4, 2), (8, 5, 5))]:
        got = read_region(path, start, stop, backend="mmap")
        assert not got.flags.owndata and not got.flags.writeable, (start, stop)
        assert got.flags.c_contiguous
        np.testing.assert_array_equal(got, np.load(path)[tuple(slice(a, b) for a, b in zip(start or (), stop or ()))])
    # Copies: a strided region, a Fortran file, and an out= given.
    fpath = save(values, order="F")
    copies = [
        read_region(path, (0, 0, 1), (8, 5, 3), backend="mmap"),
        read_region(fpath, backend="mmap"),
        read_region(fpath, (1, 1, 1), (3, 4, 5), backend="mmap"),
    ]
    for got in copies:
        assert got.flags.owndata and got.flags.writeable and got.flags.c_contiguous
    out = np.empty((8, 5, 6), ">f8")
    assert read_region(path, out=out, backend="mmap") is out
    np.testing.assert_array_equal(out, values)


def test_pread_returns_fresh_writeable_arrays(save) -> None:
    path = save(sample_array((8, 5), "<i4", seed=7))
    got = read_region(path, backend="pread")
    assert got.flags.owndata and got.flags.writeable
    got[:] = 0
    np.testing.assert_array_equal(read_region(path), np.load(path))


def test_choose_backend(save, monkeypatch: pytest.MonkeyPatch) -> None:
    values = sample_array((6, 7, 8), "<f4", seed=8)
    c = _handles.acquire(save(values))
    f = _handles.acquire(save(values, order="F"))

    def chosen(of, region, out=None, name="auto") -> str:
        return choose_backend(name, of, plan_read(of.header, Box(*region)), out).name

    whole = ((0, 0, 0), (6, 7, 8))
    assert chosen(c, whole) == "mmap"
    assert chosen(c, ((2, 0, 0), (4, 7, 8))) == "mmap"  # whole rows: contiguous
    assert chosen(c, ((2, 3, 1), (3, 4, 7))) == "mmap"  # one run
    assert chosen(c, ((0, 0, 0), (6, 7, 4))) == "pread"  # strided
    assert chosen(c, whole, out=np.empty((6, 7, 8), "<f4")) == "pread"  # copied anyway
    assert chosen(f, whole) == "pread"  # Fortran: transposed copy
    assert chosen(f, ((0, 0, 2), (6, 1, 3))) == "mmap"  # one contiguous Fortran column, same layout
    assert chosen(c, ((0, 0, 0), (0, 0, 0))) == "mmap"  # empty: nothing read either way
    monkeypatch.setattr(c, "local", False)
    assert chosen(c, whole) == "pread"  # no mappings on network file systems
    monkeypatch.setattr(c, "local", True)
    monkeypatch.setattr("npydask.reader.region._on_distributed_worker", lambda: True)
    assert chosen(c, whole) == "pread"  # workers account for and spill what they hold
    for name in ("pread", "mmap"):
        assert chosen(f, whole, name=name) == name
        assert chosen(c, whole, out=np.empty((6, 7, 8), "<f4"), name=name) == name


def test_unknown_backend(save) -> None:
    path = save(np.zeros(3))
    with pytest.raises(ValueError, match="backend"):
        read_region(path, backend="bogus")
    with pytest.raises(ValueError, match="backend"):
        FileRef.open(path, "bogus")
    with pytest.raises(ValueError, match="unknown backend"):
        npydask.backends.get("bogus")
    assert set(npydask.backends.available()) >= {"pread", "mmap"}


# --------------------------------------------------------------------------
# The handle cache


def test_cache_reuses_one_open_file(save, monkeypatch: pytest.MonkeyPatch) -> None:
    path = save(sample_array((20, 30), "<f8", seed=9))
    opened: list[str] = []
    real = _handles.open_regular

    def counting(p, *args, **kwargs):
        opened.append(p)
        return real(p, *args, **kwargs)

    monkeypatch.setattr(_handles, "open_regular", counting)
    first = _handles.acquire(path)
    for k in range(20):
        read_region(path, (k,), (k + 1,), backend=("pread", "mmap", "auto")[k % 3])
    ref = FileRef.open(path)
    for k in range(5):
        ref.read(Box((k, 0), (k + 2, 30)))
    assert _handles.acquire(path) is first
    assert opened == [path]


def test_cache_notices_replacement(save, tmp_path: Path) -> None:
    old = sample_array((10, 10), "<i8", seed=10)
    path = save(old)
    ref = FileRef.open(path, "pread")
    before = _handles.acquire(path)
    np.testing.assert_array_equal(read_region(path), old)
    for new in (old + 1, sample_array((10, 10), "<i8", seed=11), sample_array((4, 5), ">f4", seed=12)):
        np.save(tmp_path / "incoming.npy", new)
        os.replace(tmp_path / "incoming.npy", path)
        got = read_region(path)
        assert_same_array(got, new, "after os.replace")
        with pytest.raises(FileChangedError) as info:
            ref.read(Box((0, 0), (1, 1)))
        assert path in str(info.value) and "changed" in str(info.value)
    after = _handles.acquire(path)
    assert after is not before and after.identity != before.identity
    assert FileRef.open(path, "pread").read(Box.whole((4, 5))).shape == (4, 5)


def test_cache_eviction(save) -> None:
    arrays = [sample_array((7, 3 + k), "<u4", seed=20 + k) for k in range(5)]
    paths = [save(a) for a in arrays]
    refs = [FileRef.open(p, "auto") for p in paths]
    with config.set(handle_cache_size=2):
        for _ in range(3):
            for p, r, a in zip(paths, refs, arrays):
                assert_same_array(read_region(p, (1, 1), (6, 3)), a[1:6, 1:3], p)
                assert_same_array(r.read(Box((0, 0), (7, 2))), a[:, :2], p)
                assert len(_handles._cache) <= 2
    with config.set(handle_cache_size=0):
        assert_same_array(read_region(paths[0]), arrays[0], "no cache at all")
        assert len(_handles._cache) == 0


def test_dropped_handles_close_quietly(save) -> None:
    paths = [save(np.arange(5 + k)) for k in range(4)]
    bad = save(np.arange(5))
    os.truncate(bad, 100)
    gc.collect()  # earlier tests' garbage is not ours to judge
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with config.set(handle_cache_size=1):
            for p in paths:
                read_region(p)
        _handles.clear_cache()
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], [str(w.message) for w in caught]


@pytest.mark.parametrize(("backend", "direct"), [("pread", False), ("pread", True), ("mmap", False), ("auto", False)])
def test_threads_share_handles(tmp_path: Path, backend: str, direct: bool) -> None:
    if direct and not (O_DIRECT and direct_io_supported(tmp_path)):
        pytest.skip("O_DIRECT refused here")
    specs = [
        ((9, 8, 7), "<f8", "C"),
        ((9, 8, 7), ">i4", "F"),
        ((40, 33), "<c8", "C"),
        ((5, 6, 7, 3), "u1", "F"),
        ((1000,), ">f2", "C"),
    ]
    files = []
    for k, (shape, dtype, order) in enumerate(specs):
        values = sample_array(shape, dtype, seed=30 + k)
        path = tmp_path / f"t{k}.npy"
        np.save(path, np.array(values, order=order))
        files.append((str(path), values, random_regions(shape, 50, seed=40 + k)))

    def worker(seed: int) -> int:
        rng = np.random.default_rng(seed)
        refs = [FileRef.open(p, backend) for p, _, _ in files]
        for i in range(200):
            k = int(rng.integers(len(files)))
            path, values, regions = files[k]
            start, stop = regions[int(rng.integers(len(regions)))]
            expected = expected_region(values, start, stop)
            got = read_region(path, start, stop, backend=backend) if i % 2 else refs[k].read(Box(start, stop))
            assert_same_array(got, expected, f"thread {seed} read {i} of {path} [{start}, {stop})")
        return 200

    with config.set(handle_cache_size=2, direct_io=direct), ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(worker, range(8))) == 1600


# --------------------------------------------------------------------------
# Deleted files


@pytest.mark.parametrize("backend", ["pread", "mmap", "auto"])
def test_deleted_after_open(save, backend: str) -> None:
    path = save(sample_array((6, 6), "<f4", seed=50))
    ref = FileRef.open(path, backend)
    read_region(path, backend=backend)  # cached and open
    os.unlink(path)
    with pytest.raises(FileNotFoundError) as info:
        ref.read(Box((0, 0), (2, 2)))
    assert path in str(info.value)
    with pytest.raises(FileNotFoundError) as info:
        read_region(path, backend=backend)
    assert path in str(info.value)


@pytest.mark.parametrize("backend", ["auto", "pread", "mmap"])
@pytest.mark.parametrize("dtype", [">M8", ">m8", "<M8"])
def test_an_empty_region_keeps_a_generic_datetimes_byte_order(tmp_path, backend, dtype) -> None:
    """numpy allocates generic-unit datetimes native-endian: an empty read must still say ``>M8`` as numpy.load does."""
    path = tmp_path / "t.npy"
    header = f"{{'descr': '{dtype}', 'fortran_order': False, 'shape': (0, 3), }}".encode()
    header += b" " * (118 - len(header)) + b"\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header)
    want = np.load(path)
    assert want.dtype.str == dtype
    got = npydask.read_region(str(path), (0, 0), (0, 3), backend=backend)
    assert (got.dtype.str, got.shape) == (dtype, (0, 3))


# --------------------------------------------------------------------------
# System calls per read


@pytest.mark.parametrize("kind", ["npy", "npz-member"])
@pytest.mark.parametrize("strategy", ["spans", "runs"])
def test_a_pread_read_costs_one_stat_one_fstat_and_its_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count_os_calls, kind: str, strategy: str
) -> None:
    """A cached file read through its source's runs: the handle cache's ``stat``, the reads, one ``fstat`` after."""
    values = np.arange(40 * 50, dtype="<f8").reshape(40, 50)
    if kind == "npy":
        path, key = str(tmp_path / "a.npy"), None
        np.save(path, values)
    else:
        path, key = str(tmp_path / "a.npz"), "x"
        np.savez(path, x=values, y=values[:2])
    ref = FileRef.open(path, key=key, backend="pread")
    box = Box((3, 10), (9, 20))  # six runs of 80 bytes, 400 bytes apart
    with config.set(roi_strategy=strategy, gap_bytes=4096):
        np.testing.assert_array_equal(ref.read(box), values[3:9, 10:20])  # (opened and cached)
        counts = count_os_calls(["stat", "fstat", "open", "pread", "preadv"])
        got = ref.read(box)
    monkeypatch.undo()
    np.testing.assert_array_equal(got, values[3:9, 10:20])
    # one preadv either way: of the coalesced span ("spans", cut out after) or scattering the six runs ("runs")
    assert counts == {"stat": 1, "fstat": 1, "open": 0, "pread": 0, "preadv": 1}, counts
