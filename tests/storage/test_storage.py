"""The storage seam on local files: the conformance suite every source passes, and the local one's own checks.

:class:`~npydask.testing.source_conformance.SourceConformance` is the suite
(``tests/test_remote.py`` runs it on objects). ``numpy.load`` of the same
bytes is the oracle throughout.
"""

from __future__ import annotations

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
from npydask.storage import HeaderCheck, InodeIdentity, _handles
from npydask.storage.base import Source, Target
from npydask.storage.local import LOCAL, LocalLister, LocalSource, LocalTarget
from npydask.testing.source_conformance import SourceConformance


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


class TestLocalSource(SourceConformance):
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
        assert LOCAL.mappable is True and LOCAL.concurrent is False

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
    assert sorted(flat.paths) == sorted(
        ["a.npy", "link.npy", j("sub", "c.npy"), j("other", "e.npy"), j("again", "e.npy")]
    )
    assert sorted(LocalLister(str(tmp_path)).list().paths) == sorted([*flat.paths, "b.txt"])
    deep = LocalLister(str(tmp_path)).list(recursive=True, match=npy).paths
    # every folder once: the real tree first, the link back to the root adds nothing, the link out adds its tree
    assert sorted(deep) == sorted(
        [
            "a.npy",
            "link.npy",
            j("sub", "c.npy"),
            j("sub", "deep", "d.npy"),
            j("other", "e.npy"),
            j("sub", "out", "o.npy"),
        ]
    )
    # headers="first": each file's inode from the directory (a symlink's: its target's), sizes still unknown
    # and when the listing began: after the call, on the coarse clock that stamps ctimes
    for recursive in (False, True):
        before = time.time_ns()
        listed = LocalLister(str(tmp_path), inodes=True).list(recursive, match=npy)
        after = time.time_ns()
        assert listed.sizes is None and sorted(listed.paths) == sorted(deep if recursive else flat.paths)
        assert [i.ino for i in listed.identities] == [os.stat(tmp_path / p).st_ino for p in listed.paths]
        assert all(type(i) is InodeIdentity for i in listed.identities)
        assert len({i.listed_ns for i in listed.identities}) == 1
        assert before < listed.identities[0].listed_ns <= after


def test_local_lister_refuses_a_file_and_a_missing_folder(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.zeros(2))
    for recursive in (False, True):
        with pytest.raises(NotADirectoryError, match="a.npy"):
            LocalLister(str(tmp_path / "a.npy")).list(recursive)
        with pytest.raises(FileNotFoundError, match="missing"):
            LocalLister(str(tmp_path / "missing")).list(recursive)


def test_dali_order_of_a_listing_is_pure_and_bytewise() -> None:
    from npydask.dataset.order import dali_order

    listed = ["s1/c.npy", "B.npy", "s0/d.npy", "a.npy", "a-b/x.npy", "a/x.npy", "\u00e9.npy", "a10.npy", "a2.npy"]
    assert dali_order(listed, sep="/") == [
        "B.npy",
        "a.npy",
        "a10.npy",
        "a2.npy",
        "\u00e9.npy",
        "a/x.npy",
        "a-b/x.npy",
        "s0/d.npy",
        "s1/c.npy",
    ]
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


def _write_then_fail(target: Target, block: bytes, why: str) -> None:
    """Write ``block`` at offset 0 inside ``with target`` and fail, as a task that dies mid-write does."""
    with target:
        target.write_block(0, block)
        raise RuntimeError(why)


def test_local_target_abort_leaves_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    target.write_bytes(b"old bytes")
    t = LocalTarget(str(target), 9)
    with pytest.raises(RuntimeError, match="boom"):
        _write_then_fail(t, b"new", "boom")
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

    def read_opened(self, *args: Any, **kwargs: Any) -> None:
        self._count("read_opened")
        super().read_opened(*args, **kwargs)

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
    from npydask.plan.region import Box
    from npydask.reader import FileRef

    values = np.arange(4096, dtype="<f8").reshape(64, 64)
    np.save(tmp_path / "a.npy", values)
    source = _CountingSource(mappable)
    ref = FileRef.open(tmp_path / "a.npy", source=source)
    assert ref.source is source and source.calls == {"open": 1}
    got = ref.read(Box((8, 0), (16, 64)))  # a contiguous region: "auto" maps it where it may
    np.testing.assert_array_equal(got, values[8:16])
    # a copy is the source's read of the file it opened; a mapping is the mmap backend's
    assert source.calls == ({"open": 2} if mappable else {"open": 2, "read_opened": 1})
    assert got.flags.writeable is not mappable  # a zero-copy mapping is read-only; pread's copy is not


def test_a_group_reaches_its_source_once_per_task(tmp_path: Path) -> None:
    from npydask.array import NpyFileArray
    from npydask.dataset.scan import scan_headers
    from npydask.dataset.stacking import FileGroup
    from npydask.reader import FileRef

    arrays = [np.full((8, 8), i, "<i4") for i in range(40)]
    paths = []
    for i, a in enumerate(arrays):
        paths.append(str(tmp_path / f"{i:02d}.npy"))
        np.save(paths[-1], a)
    source = _CountingSource()
    scanned = scan_headers(paths, source=source)
    assert source.calls == {"scan": 1}
    refs = [
        FileRef(p, s[0], s[1], read_options(), "auto", None, False, HeaderCheck(s[2], "t", "t"), source)
        for p, s in zip(paths, scanned)
    ]
    group = FileGroup([NpyFileArray(r) for r in refs], 0, True)
    np.testing.assert_array_equal(group[5:37], np.stack(arrays[5:37]))
    assert source.calls == {"scan": 1, "read_many": 1}  # 32 files, one call: the loop is the source's
    ref1 = refs[0]._replace(source=LOCAL)  # a file of another source goes through its own read
    group = FileGroup([NpyFileArray(ref1), *(NpyFileArray(r) for r in refs[1:4])], 0, True)
    np.testing.assert_array_equal(group[0:4], np.stack(arrays[0:4]))
    # the group's source is its first file's (LOCAL): the others each open through their own
    assert source.calls == {"scan": 1, "read_many": 1, "open": 3, "read_opened": 3}


@pytest.mark.skipif(not hasattr(__import__("fcntl"), "F_SETLEASE"), reason="read leases are Linux's")
def test_a_read_lease_holds_off_truncation_until_the_copies_end(tmp_path: Path) -> None:
    import fcntl
    import subprocess
    import sys

    from npydask.storage import truncation_blocked

    path = tmp_path / "a.npy"
    np.save(path, np.zeros(4096))
    f = _handles.acquire(str(path))
    with truncation_blocked(f) as held, truncation_blocked(f) as again:  # (two copies share one lease)
        assert held and again
        cut = subprocess.Popen([sys.executable, "-c", f"import os; os.truncate({str(path)!r}, 100)"])
        deadline = time.monotonic() + 30
        while fcntl.fcntl(f.fd, fcntl.F_GETLEASE) == fcntl.F_RDLCK and time.monotonic() < deadline:
            time.sleep(0.01)  # (until the truncation asks for the lease back)
        time.sleep(0.05)
        assert cut.poll() is None and os.fstat(f.fd).st_size > 100  # the truncation waits for the lease
        with truncation_blocked(f) as late:
            assert not late  # (a writer waits: no new copy joins the lease)
    assert cut.wait(timeout=30) == 0 and os.fstat(f.fd).st_size == 100  # ...and goes ahead once it is given back
    with open(path, "r+b"):  # open for writing: no lease (the copy is made another way)
        with truncation_blocked(f) as held:
            assert not held
    with truncation_blocked(f) as held:
        assert held


@pytest.mark.skipif(not hasattr(__import__("fcntl"), "F_SETLEASE"), reason="read leases are Linux's")
def test_a_forked_child_leases_apart_from_its_parent(tmp_path: Path) -> None:
    # (they share the cached descriptor's open file description, which a lease belongs to)
    import fcntl

    from npydask.storage import truncation_blocked

    path = tmp_path / "a.npy"
    np.save(path, np.zeros(4096))
    f = _handles.acquire(str(path))
    with truncation_blocked(f) as held:
        assert held
        pid = os.fork()
        if pid == 0:  # the child takes and gives back a lease of its own while the parent's is held
            try:
                with truncation_blocked(f) as child_held:
                    ok = child_held
                os._exit(0 if ok else 3)
            except BaseException:
                os._exit(4)
        assert os.waitpid(pid, 0)[1] == 0
        assert fcntl.fcntl(f.fd, fcntl.F_GETLEASE) == fcntl.F_RDLCK  # the parent's lease is still there


@pytest.mark.skipif(not hasattr(__import__("fcntl"), "F_SETLEASE"), reason="read leases are Linux's")
def test_members_of_one_archive_share_its_lease(tmp_path: Path) -> None:
    # (a member is read through its archive's descriptor: one member's copy ending must not give back
    # the lease another member's copy is made under, which sent that copy to the slower pread route)
    import fcntl

    from npydask.storage import truncation_blocked

    path = tmp_path / "a.npz"
    np.savez(path, x=np.zeros(4096), m=np.ones(4096))
    x, m = _handles.acquire(str(path), key="x"), _handles.acquire(str(path), key="m")
    assert x.fd == m.fd  # (one open file description)
    with truncation_blocked(x) as held:
        assert held
        with truncation_blocked(m) as also:
            assert also
        assert fcntl.fcntl(x.fd, fcntl.F_GETLEASE) == fcntl.F_RDLCK  # x's copy is still under the lease
        with truncation_blocked(x) as again:
            assert again
    assert fcntl.fcntl(x.fd, fcntl.F_GETLEASE) == fcntl.F_UNLCK  # the last copy gave it back
