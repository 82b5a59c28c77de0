"""Extent files kept open: bounded, never closed under a reader, dropped on damage or removal."""

from __future__ import annotations

import os
import threading

from npydask.cache.handles import ExtentTable, OpenExtents, default_capacity


def _folder(tmp_path, n):
    for k in range(n):
        (tmp_path / f"f{k}").write_bytes(bytes([k]) * 10)
    return os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)


def _read(fd):
    return os.pread(fd, 10, 0)


def test_at_most_capacity_stay_open_and_reads_see_the_files(tmp_path):
    dir_fd = _folder(tmp_path, 6)
    kept = OpenExtents(dir_fd, ExtentTable(3))
    before = len(os.listdir("/proc/self/fd"))
    for k in range(6):
        assert kept.use(f"f{k}", lambda fd, k=k: _read(fd) == bytes([k]) * 10)
    assert len(os.listdir("/proc/self/fd")) - before == 3
    assert not kept.use("missing", lambda fd: True)


def test_a_file_in_use_is_not_closed_by_eviction(tmp_path):
    dir_fd = _folder(tmp_path, 4)
    kept = OpenExtents(dir_fd, ExtentTable(1))
    inside = threading.Event()
    go = threading.Event()
    seen = []

    def slow(fd):
        inside.set()
        go.wait(5)
        seen.append(os.pread(fd, 10, 0))  # (EBADF here if the descriptor had been closed)
        return True

    t = threading.Thread(target=kept.use, args=("f0", slow))
    t.start()
    inside.wait(5)
    for k in (1, 2, 3):  # (f0 leaves the table while its reader holds it)
        kept.use(f"f{k}", lambda fd: True)
    go.set()
    t.join()
    assert seen == [bytes([0]) * 10]


def test_damage_and_removal_drop_the_descriptor(tmp_path):
    dir_fd = _folder(tmp_path, 1)
    kept = OpenExtents(dir_fd, ExtentTable(4))
    assert not kept.use("f0", lambda fd: False)  # (a read that found damage)
    os.replace(tmp_path / "f0", tmp_path / "old")
    (tmp_path / "f0").write_bytes(b"new" * 3 + b"!")
    assert kept.use("f0", lambda fd: _read(fd) == b"newnewnew!")  # (opened again: the new file)
    kept.forget("f0")
    (tmp_path / "f0").write_bytes(b"x" * 10)
    assert kept.use("f0", lambda fd: _read(fd) == b"x" * 10)


def test_the_default_capacity_leaves_most_descriptors_to_the_process():
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert 8 <= default_capacity() <= min(4096, max(8, soft // 4)) if soft != resource.RLIM_INFINITY else 4096


def test_every_folder_of_a_process_shares_one_budget(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    table = ExtentTable(4)
    folders = [OpenExtents(_folder(tmp_path / name, 4), table) for name in ("a", "b")]
    before = len(os.listdir("/proc/self/fd"))
    for kept in folders:
        for k in range(4):
            assert kept.use(f"f{k}", lambda fd: True)
    assert len(os.listdir("/proc/self/fd")) - before == 4  # (not 4 per folder)
    folders[1].forget_all()
    assert len(os.listdir("/proc/self/fd")) - before == 0  # (b's four were the ones kept)
