"""The storage seam: a conformance class every :class:`~npydask.storage.base.Source` passes, and the local one.

:class:`SourceTests` is written against the interface only (in the manner of
zarr's ``testing/store.py``): a subclass says how to put, replace and remove
a file in its storage and how to make reads come back short, and inherits
every check. ``numpy.load`` of the same bytes is the oracle throughout.
"""

from __future__ import annotations

import io
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import npydask

from npydask.config import read_options
from npydask.errors import FileChangedError, NpyFormatError
from npydask.plan.region import normalize_box, plan_read
from npydask.storage import _handles
from npydask.storage._handles import CTIME_MARGIN_NS, HeaderCheck, InodeIdentity
from npydask.storage.base import Source
from npydask.storage.local import LOCAL, LocalLister, LocalSource, LocalTarget

ARRAYS: dict[str, Callable[[], np.ndarray]] = {
    "c3d-f4": lambda: np.arange(6 * 7 * 9, dtype="<f4").reshape(6, 7, 9),
    "f3d-i2": lambda: np.asfortranarray(np.arange(5 * 8 * 3, dtype="<i2").reshape(5, 8, 3)),
    "c2d-be-f8": lambda: np.arange(11 * 13, dtype=">f8").reshape(11, 13),
    "c1d-u1": lambda: np.arange(200, dtype=np.uint8),
    "struct": lambda: np.array([(i, i * 0.5) for i in range(17)], dtype=[("a", "<i4"), ("b", "<f8")]),
}
BOXES = [None, (0.0, 1.0), (0.3, 0.7), (0.5, 0.51), (0.9, 1.0)]


def _box(shape: tuple[int, ...], frac: tuple[float, float] | None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if frac is None:
        return (0,) * len(shape), shape
    start = tuple(int(n * frac[0]) for n in shape)
    stop = tuple(max(a + 1, int(n * frac[1])) if n else 0 for a, n in zip(start, shape))
    return start, tuple(min(b, n) for b, n in zip(stop, shape))


def _run_with_timeout(fn: Callable[[], Any], seconds: float = 20) -> Any:
    """``fn()`` in a thread; fails the test (instead of hanging it) if it blocks."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed back to the test
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"blocked for over {seconds} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


class SourceTests:
    """Checks every source passes. Subclasses provide the fixtures and the four storage hooks."""

    @pytest.fixture
    def source(self) -> Source:
        raise NotImplementedError

    @pytest.fixture
    def short_reads(self) -> None:
        """Make the storage return fewer bytes than asked for each read (while the fixture is active)."""
        raise NotImplementedError

    def put(self, where: Path, name: str, array: np.ndarray) -> str:
        """Store ``array`` as ``.npy`` under ``name``; return what the source reads it by."""
        raise NotImplementedError

    def put_bytes(self, where: Path, name: str, data: bytes) -> str:
        raise NotImplementedError

    def remove(self, path: str) -> None:
        raise NotImplementedError

    def get_bytes(self, path: str) -> bytes:
        """The stored bytes of ``path`` (read around the source under test)."""
        raise NotImplementedError

    def load(self, path: str) -> np.ndarray:
        """``numpy.load`` of the stored bytes: the oracle."""
        return np.load(io.BytesIO(self.get_bytes(path)))

    # -- identity and headers --------------------------------------------------------------

    def test_identity_is_stable_and_follows_a_rewrite(self, source: Source, tmp_path: Path) -> None:
        p = self.put(tmp_path, "a.npy", np.arange(10))
        first = source.identity(p)
        assert source.identity(p) == first
        assert hash(first) == hash(source.identity(p))  # (usable as a key)
        self.remove(p)
        self.put(tmp_path, "a.npy", np.arange(11))
        assert source.identity(p) != first

    def test_identity_of_a_missing_file_names_it(self, source: Source, tmp_path: Path) -> None:
        p = self.put(tmp_path, "gone.npy", np.arange(3))
        self.remove(p)
        with pytest.raises(FileNotFoundError, match="gone.npy"):
            source.identity(p)

    @pytest.mark.parametrize("kind", sorted(ARRAYS))
    def test_scan_gives_headers_raw_bytes_and_identities(self, source: Source, tmp_path: Path, kind: str) -> None:
        values = ARRAYS[kind]()
        paths = [self.put(tmp_path, f"{kind}-{i}.npy", values) for i in range(3)]
        for p, found in zip(paths, source.scan(paths)):
            assert not isinstance(found, BaseException), found
            identity, header, raw, deflated = found
            assert identity == source.identity(p)
            assert (header.shape, header.dtype, header.fortran_order) == (
                values.shape,
                values.dtype,
                values.flags.f_contiguous and not values.flags.c_contiguous,
            )
            assert raw == self.get_bytes(p)[: header.data_offset]
            assert deflated is False
            assert source.header(p) == header

    def test_scan_reports_failures_in_place(self, source: Source, tmp_path: Path) -> None:
        good = self.put(tmp_path, "good.npy", np.arange(4))
        missing = self.put(tmp_path, "missing.npy", np.arange(4))
        self.remove(missing)
        bad = self.put_bytes(tmp_path, "bad.npy", b"\x93NUMPY\x01\x00garbage")
        results = source.scan([good, missing, bad])
        assert not isinstance(results[0], BaseException)
        assert isinstance(results[1], FileNotFoundError) and "missing.npy" in str(results[1])
        assert isinstance(results[2], NpyFormatError) and "bad.npy" in str(results[2])
        with pytest.raises(FileNotFoundError, match="missing.npy"):
            source.header(missing)

    # -- read_runs -------------------------------------------------------------------------

    @pytest.mark.parametrize("frac", BOXES)
    @pytest.mark.parametrize("kind", sorted(ARRAYS))
    @pytest.mark.parametrize("gap", [0, 64, 4096])
    def test_read_runs_equals_numpy(
        self, source: Source, tmp_path: Path, kind: str, frac: Any, gap: int
    ) -> None:
        values = ARRAYS[kind]()
        p = self.put(tmp_path, "a.npy", values)
        identity, header, raw, _ = source.scan([p])[0]
        start, stop = _box(values.shape, frac)
        plan = plan_read(header, normalize_box(header.shape, start, stop))
        dest = np.full(plan.nbytes, 0xAB, np.uint8)
        options = read_options(gap_bytes=gap)
        source.read_runs(p, identity, plan, dest, options, HeaderCheck(raw, "the test", "none"))
        region = self.load(p)[tuple(slice(a, b) for a, b in zip(start, stop))]
        assert dest.tobytes() == region.tobytes(order="F" if header.fortran_order else "C")

    def test_read_runs_refuses_a_changed_file(self, source: Source, tmp_path: Path) -> None:
        p = self.put(tmp_path, "a.npy", np.arange(100, dtype="<i8"))
        identity, header, raw, _ = source.scan([p])[0]
        self.remove(p)
        self.put(tmp_path, "a.npy", np.arange(100, 201, dtype="<i8"))  # (another size: an inode may be reused)
        plan = plan_read(header, normalize_box(header.shape, (10,), (20,)))
        dest = np.zeros(plan.nbytes, np.uint8)
        with pytest.raises(FileChangedError, match="a.npy"):
            source.read_runs(p, identity, plan, dest, read_options())

    def test_read_runs_refuses_other_header_bytes(self, source: Source, tmp_path: Path) -> None:
        p = self.put(tmp_path, "a.npy", np.arange(100, dtype="<i8"))
        identity, header, raw, _ = source.scan([p])[0]
        other = source.scan([self.put(tmp_path, "b.npy", np.arange(100, dtype="<u8"))])[0][2]
        plan = plan_read(header, normalize_box(header.shape, None, None))
        with pytest.raises(NpyFormatError, match="a.npy.*from the index"):
            source.read_runs(p, identity, plan, np.zeros(plan.nbytes, np.uint8), read_options(),
                             HeaderCheck(other, "the index", "rebuild it"))

    def test_read_runs_missing_file_names_it(self, source: Source, tmp_path: Path) -> None:
        p = self.put(tmp_path, "a.npy", np.arange(10))
        identity, header, _, _ = source.scan([p])[0]
        self.remove(p)
        plan = plan_read(header, normalize_box(header.shape, None, None))
        with pytest.raises(FileNotFoundError, match="a.npy"):
            source.read_runs(p, identity, plan, np.zeros(plan.nbytes, np.uint8), read_options())

    # -- read_many -------------------------------------------------------------------------

    @pytest.mark.parametrize("checked", [False, True])
    @pytest.mark.parametrize("skip", [0, 8])
    def test_read_many_equals_numpy(self, source: Source, tmp_path: Path, checked: bool, skip: int) -> None:
        rng = np.random.default_rng(7)
        arrays = [rng.standard_normal((4, 5)).astype("<f8") for _ in range(9)]
        paths = [self.put(tmp_path, f"s{i}.npy", a) for i, a in enumerate(arrays)]
        scanned = source.scan(paths)
        nbytes = arrays[0].nbytes - skip
        items = [
            (p, s[0], s[1].data_offset + skip, HeaderCheck(s[2], "the test", "none") if checked else None)
            for p, s in zip(paths, scanned)
        ]
        dest = bytearray(nbytes * len(items))
        source.read_many(items, memoryview(dest), nbytes)
        assert bytes(dest) == b"".join(self.load(p).tobytes()[skip:] for p in paths)

    def test_read_many_missing_file_names_it(self, source: Source, tmp_path: Path) -> None:
        paths = [self.put(tmp_path, f"s{i}.npy", np.arange(8)) for i in range(3)]
        scanned = source.scan(paths)
        self.remove(paths[1])
        items = [(p, s[0], s[1].data_offset, None) for p, s in zip(paths, scanned)]
        with pytest.raises(FileNotFoundError, match="s1.npy"):
            source.read_many(items, memoryview(bytearray(64 * 3)), 64)

    def test_read_many_refuses_a_changed_file(self, source: Source, tmp_path: Path) -> None:
        paths = [self.put(tmp_path, f"s{i}.npy", np.arange(8)) for i in range(3)]
        scanned = source.scan(paths)
        self.remove(paths[2])
        self.put(tmp_path, "s2.npy", np.arange(9))
        items = [(p, s[0], s[1].data_offset, None) for p, s in zip(paths, scanned)]
        with pytest.raises(FileChangedError, match="s2.npy"):
            source.read_many(items, memoryview(bytearray(64 * 3)), 64)

    def test_read_many_refuses_other_header_bytes(self, source: Source, tmp_path: Path) -> None:
        p = self.put(tmp_path, "s.npy", np.arange(8, dtype="<i8"))
        q = self.put(tmp_path, "t.npy", np.arange(8, dtype="<u8"))
        (ident, header, _, _), (_, _, other, _) = source.scan([p, q])
        with pytest.raises(NpyFormatError, match="s.npy"):
            source.read_many([(p, ident, header.data_offset, HeaderCheck(other, "x", "y"))],
                             memoryview(bytearray(64)), 64)

    # -- short reads -----------------------------------------------------------------------

    @pytest.mark.usefixtures("short_reads")
    def test_short_reads_still_give_every_byte(self, source: Source, tmp_path: Path) -> None:
        values = np.arange(3 * 40 * 50, dtype="<f4").reshape(3, 40, 50)
        paths = [self.put(tmp_path, f"v{i}.npy", values + i) for i in range(3)]
        scanned = source.scan(paths)
        assert all(not isinstance(s, BaseException) for s in scanned), scanned
        identity, header, raw, _ = scanned[0]
        plan = plan_read(header, normalize_box(header.shape, (1, 5, 7), (3, 30, 41)))
        dest = np.zeros(plan.nbytes, np.uint8)
        source.read_runs(paths[0], identity, plan, dest, read_options(), HeaderCheck(raw, "t", "t"))
        assert dest.tobytes() == values[1:3, 5:30, 7:41].tobytes()
        items = [(p, s[0], s[1].data_offset, HeaderCheck(s[2], "t", "t")) for p, s in zip(paths, scanned)]
        dest2 = bytearray(values.nbytes * 3)
        source.read_many(items, memoryview(dest2), values.nbytes)
        assert bytes(dest2) == b"".join((values + i).tobytes() for i in range(3))


class TestLocalSource(SourceTests):
    @pytest.fixture
    def source(self) -> Source:
        return LOCAL

    @pytest.fixture
    def short_reads(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
        real_pread, real_preadv = os.pread, os.preadv
        calls = {"short": 0}

        def pread(fd: int, n: int, offset: int) -> bytes:
            calls["short"] += n > 7
            return real_pread(fd, min(n, 7), offset)

        def preadv(fd: int, buffers: list, offset: int, *args: int) -> int:
            first = memoryview(buffers[0]).cast("B")
            calls["short"] += len(first) > 7 or len(buffers) > 1
            return real_preadv(fd, [first[:7]], offset)

        monkeypatch.setattr(os, "pread", pread)
        monkeypatch.setattr(os, "preadv", preadv)
        _handles.clear_cache()
        yield
        assert calls["short"] > 0  # (the reads really came back short)

    def put(self, where: Path, name: str, array: np.ndarray) -> str:
        path = str(where / name)
        np.save(path, array)
        return path

    def put_bytes(self, where: Path, name: str, data: bytes) -> str:
        path = where / name
        path.write_bytes(data)
        return str(path)

    def remove(self, path: str) -> None:
        os.unlink(path)

    def get_bytes(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def test_one_shared_source_pickles_by_reference(self) -> None:
        import pickle

        assert pickle.loads(pickle.dumps(LOCAL)) is LOCAL
        assert len(pickle.dumps(LOCAL)) < 60
        assert LOCAL.mappable is True

    def test_gap_default_is_the_setting(self) -> None:
        from npydask import config

        assert LOCAL.gap_bytes == config.get("gap_bytes") == 4096
        with config.set(gap_bytes=123):
            assert LOCAL.gap_bytes == 123

    def test_fifos_are_refused_without_blocking(self, tmp_path: Path) -> None:
        fifo = str(tmp_path / "pipe.npy")
        os.mkfifo(fifo)
        found = _run_with_timeout(lambda: LOCAL.scan([fifo]))[0]
        assert isinstance(found, OSError) and "FIFO" in str(found) and "pipe.npy" in str(found)
        with pytest.raises(OSError, match="FIFO.*pipe.npy"):
            _run_with_timeout(lambda: LOCAL.open(fifo))
        with pytest.raises(OSError, match="FIFO.*pipe.npy"):
            _run_with_timeout(lambda: LOCAL.header(fifo))
        ident = LOCAL.identity(fifo)  # a stat: it does not open
        with pytest.raises(OSError, match="pipe.npy"):
            _run_with_timeout(lambda: LOCAL.read_many([(fifo, ident, 128, None)], memoryview(bytearray(8)), 8))

    def test_open_is_the_shared_handle_cache(self, tmp_path: Path) -> None:
        p = self.put(tmp_path, "a.npy", np.arange(5))
        f = LOCAL.open(p)
        assert LOCAL.open(p, f.identity) is f
        assert f.header.shape == (5,) and f.identity == LOCAL.identity(p)


# -- Lister ------------------------------------------------------------------------------


def test_local_lister_lists_files_as_dali_traverses(tmp_path: Path) -> None:
    (tmp_path / "sub" / "deep").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    np.save(outside / "o.npy", np.zeros(1))
    for rel in ["a.npy", "b.txt", "sub/c.npy", "sub/deep/d.npy", "other/e.npy"]:
        np.save(tmp_path / rel, np.zeros(2)) if rel.endswith(".npy") else (tmp_path / rel).write_bytes(b"x")
    os.symlink(tmp_path, tmp_path / "sub" / "loop")  # back to the root: a loop
    os.symlink(tmp_path / "other", tmp_path / "again")  # a sibling, linked
    os.symlink(outside, tmp_path / "sub" / "out")  # out of the tree
    os.symlink(tmp_path / "a.npy", tmp_path / "link.npy")  # a symlink to a file: a file
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling.npy")  # skipped
    os.mkfifo(tmp_path / "pipe.npy")  # not a file: skipped
    npy = re.compile(r".*\.npy$").match
    j = os.path.join

    flat = LocalLister(str(tmp_path)).list(match=npy)
    assert flat.sizes is None and flat.identities is None  # (no stat per file: the scan gives them)
    # DALI's rule: immediate subfolders, symlinked ones too, each listed under its own name
    assert sorted(flat.paths) == sorted(["a.npy", "link.npy", j("sub", "c.npy"), j("other", "e.npy"), j("again", "e.npy")])
    assert sorted(LocalLister(str(tmp_path)).list().paths) == sorted([*flat.paths, "b.txt"])
    deep = LocalLister(str(tmp_path)).list(recursive=True, match=npy).paths
    # every folder once: the real tree first, the link back to the root adds nothing, the link out adds its tree
    assert sorted(deep) == sorted(["a.npy", "link.npy", j("sub", "c.npy"), j("sub", "deep", "d.npy"),
                                   j("other", "e.npy"), j("sub", "out", "o.npy")])
    # headers="first": each file's inode from the directory (a symlink's: its target's), sizes still unknown
    # and when the listing began, less the margin for the coarse clock that stamps ctimes
    for recursive in (False, True):
        before = time.time_ns()
        listed = LocalLister(str(tmp_path), inodes=True).list(recursive, match=npy)
        after = time.time_ns()
        assert listed.sizes is None and sorted(listed.paths) == sorted(deep if recursive else flat.paths)
        assert [i.ino for i in listed.identities] == [os.stat(tmp_path / p).st_ino for p in listed.paths]
        assert all(type(i) is InodeIdentity for i in listed.identities)
        assert len({i.listed_ns for i in listed.identities}) == 1
        assert before - CTIME_MARGIN_NS <= listed.identities[0].listed_ns <= after - CTIME_MARGIN_NS


def test_local_lister_refuses_a_file_and_a_missing_folder(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.zeros(2))
    for recursive in (False, True):
        with pytest.raises(NotADirectoryError, match="a.npy"):
            LocalLister(str(tmp_path / "a.npy")).list(recursive)
        with pytest.raises(FileNotFoundError, match="missing"):
            LocalLister(str(tmp_path / "missing")).list(recursive)


def test_dali_order_of_a_listing_is_pure_and_bytewise() -> None:
    from npydask.dataset.select import dali_order

    listed = ["s1/c.npy", "B.npy", "s0/d.npy", "a.npy", "a-b/x.npy", "a/x.npy", "\u00e9.npy", "a10.npy", "a2.npy"]
    assert dali_order(listed, sep="/") == ["B.npy", "a.npy", "a10.npy", "a2.npy", "\u00e9.npy",
                                           "a/x.npy", "a-b/x.npy", "s0/d.npy", "s1/c.npy"]
    assert dali_order(listed[::-1], sep="/") == dali_order(listed, sep="/")


# -- Target ------------------------------------------------------------------------------


def _leftovers(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.startswith("."))


@pytest.mark.parametrize("overwrite", [True, False])
def test_local_target_writes_blocks_in_any_order_then_publishes(tmp_path: Path, overwrite: bool) -> None:
    values = np.arange(1000, dtype=">i4").reshape(10, 100)
    np.save(tmp_path / "ref.npy", values)
    data = (tmp_path / "ref.npy").read_bytes()
    target = str(tmp_path / "out.npy")
    cuts = [0, 7, 128, 1000, 2500, len(data)]
    with LocalTarget(target, len(data), overwrite=overwrite) as t:
        for a, b in reversed(list(zip(cuts, cuts[1:]))):
            t.write_block(a, np.frombuffer(data[a:b], np.uint8))
            assert not os.path.exists(target)  # nothing under the name until finish
        t.finish()
    np.testing.assert_array_equal(np.load(target), values)
    assert np.load(target).dtype == values.dtype
    assert _leftovers(tmp_path) == []


def test_local_target_replaces_keeping_permissions(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    os.chmod(target, 0o640)
    with LocalTarget(str(target), 3) as t:
        t.write_block(0, b"new")
        t.finish()
    assert target.read_bytes() == b"new" and stat.S_IMODE(os.stat(target).st_mode) == 0o640


def test_local_target_abort_leaves_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    target.write_bytes(b"old bytes")
    with pytest.raises(RuntimeError, match="boom"), LocalTarget(str(target), 9) as t:
        t.write_block(0, b"new")
        raise RuntimeError("boom")
    assert target.read_bytes() == b"old bytes" and _leftovers(tmp_path) == []
    t.abort()  # (again: harmless)


def test_local_target_refuses_a_partial_file(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    t = LocalTarget(str(target), 10)
    t.write_block(0, b"abc")
    with pytest.raises(OSError, match=r"expected 10 bytes.*found 3.*out.bin"):
        t.finish()
    assert not target.exists() and _leftovers(tmp_path) == []


def test_local_target_without_overwrite_refuses_an_existing_file(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(FileExistsError, match="overwrite=False.*out.bin"):
        LocalTarget(str(target), 3, overwrite=False).write_block(0, b"new")
    t = LocalTarget(str(tmp_path / "late.bin"), 3, overwrite=False)
    t.write_block(0, b"new")
    (tmp_path / "late.bin").write_bytes(b"came first")  # appears while being written
    with pytest.raises(FileExistsError, match="appeared while it was being written"):
        t.finish()
    assert (tmp_path / "late.bin").read_bytes() == b"came first" and _leftovers(tmp_path) == []
    assert target.read_bytes() == b"old"


def test_local_target_names_the_file_when_its_folder_is_missing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nofolder"):
        LocalTarget(str(tmp_path / "nofolder" / "x.bin"), 1).write_block(0, b"x")


@pytest.mark.parametrize("name", ["é" * 122, "日本" * 40 + "x.bin", "a" * 255, "😀" * 63])
def test_local_target_writes_names_up_to_the_file_system_limit(tmp_path: Path, name: str) -> None:
    target = tmp_path / name  # (up to 255 bytes in UTF-8: its temporary name must fit too)
    with LocalTarget(str(target), 4) as t:
        t.write_block(0, b"data")
        t.finish()
    assert target.read_bytes() == b"data" and _leftovers(tmp_path) == []


def test_local_target_names_a_too_long_target(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="File name too long") as e:
        LocalTarget(str(tmp_path / ("é" * 128)), 1)
    assert e.value.filename == str(tmp_path / ("é" * 128))


# -- the readers reach bytes through the reference's source --------------------------------


class _CountingSource(LocalSource):
    """Local files, counting the calls each entry point makes (and optionally refusing to be mapped)."""

    def __init__(self, mappable: bool = True) -> None:
        self._mappable = mappable
        self.calls: dict[str, int] = {}

    @property
    def mappable(self) -> bool:
        return self._mappable

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def open(self, *args: Any, **kwargs: Any) -> Any:
        self._count("open")
        return super().open(*args, **kwargs)

    def read_runs(self, *args: Any, **kwargs: Any) -> None:
        self._count("read_runs")
        super().read_runs(*args, **kwargs)

    def read_many(self, items: Any, dest: memoryview, nbytes: int) -> None:
        self._count("read_many")
        super().read_many(items, dest, nbytes)

    def scan(self, paths: Any, key: str | None = None) -> Any:
        self._count("scan")
        return super().scan(paths, key)

    def __reduce__(self) -> Any:  # (a plain object again: LOCAL's reduce names the shared instance)
        return (_CountingSource, (self._mappable,))


def test_readers_take_the_sources_gap(tmp_path: Path) -> None:
    from npydask import config
    from npydask.reader import FileRef

    class WideGaps(_CountingSource):
        @property
        def gap_bytes(self) -> int:
            return 65536

    np.save(tmp_path / "a.npy", np.arange(10))
    assert FileRef.open(tmp_path / "a.npy", source=WideGaps()).options.gap_bytes == 65536
    with config.set(gap_bytes=512):
        assert FileRef.open(tmp_path / "a.npy").options.gap_bytes == 512  # LOCAL's: the setting
        assert npydask.open_dataset(str(tmp_path)).views[0].ref.options.gap_bytes == 512


@pytest.mark.parametrize("mappable", [True, False])
def test_auto_maps_only_where_the_source_is_mappable(tmp_path: Path, mappable: bool) -> None:
    from npydask.reader import FileRef
    from npydask.plan.region import Box

    values = np.arange(4096, dtype="<f8").reshape(64, 64)
    np.save(tmp_path / "a.npy", values)
    source = _CountingSource(mappable)
    ref = FileRef.open(tmp_path / "a.npy", source=source)
    assert ref.source is source and source.calls == {"open": 1}
    got = ref.read(Box((8, 0), (16, 64)))  # a contiguous region: "auto" maps it where it may
    np.testing.assert_array_equal(got, values[8:16])
    assert source.calls == {"open": 2}
    assert got.flags.writeable is not mappable  # a zero-copy mapping is read-only; pread's copy is not


def test_a_group_reaches_its_source_once_per_task(tmp_path: Path) -> None:
    from npydask.array import NpyFileArray
    from npydask.dataset.scan import scan_headers
    from npydask.reader import FileRef
    from npydask.dataset.stacking import FileGroup

    arrays = [np.full((8, 8), i, "<i4") for i in range(40)]
    paths = []
    for i, a in enumerate(arrays):
        paths.append(str(tmp_path / f"{i:02d}.npy"))
        np.save(paths[-1], a)
    source = _CountingSource()
    scanned = scan_headers(paths, source=source)
    assert source.calls == {"scan": 1}
    refs = [FileRef(p, s[0], s[1], read_options(), "auto", None, False, HeaderCheck(s[2], "t", "t"), source)
            for p, s in zip(paths, scanned)]
    group = FileGroup([NpyFileArray(r) for r in refs], 0, True)
    np.testing.assert_array_equal(group[5:37], np.stack(arrays[5:37]))
    assert source.calls == {"scan": 1, "read_many": 1}  # 32 files, one call: the loop is the source's
    ref1 = refs[0]._replace(source=LOCAL)  # a file of another source goes through its own read
    group = FileGroup([NpyFileArray(ref1), *(NpyFileArray(r) for r in refs[1:4])], 0, True)
    np.testing.assert_array_equal(group[0:4], np.stack(arrays[0:4]))
    # the group's source is its first file's (LOCAL): the others each open through their own
    assert source.calls == {"scan": 1, "read_many": 1, "open": 3}
