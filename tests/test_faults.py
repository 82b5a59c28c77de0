"""Fault drills: files that vanish, shrink, grow, change or turn out special while lazy arrays wait.

Only drills not already covered elsewhere are here (the report lists those):
``test_header.py`` and ``reader/test_reader_region.py`` cover missing, special and unreadable
paths for ``read_header``/``read_region``/``FileRef.open`` and the huge header
length for ``read_header``; ``test_backends.py`` covers deleted files for
``FileRef.read``, O_DIRECT fallbacks for ``read_region`` and 8 threads over
``read_region``/``FileRef.read``; ``test_array.py`` and ``test_dataset.py``
cover a rewritten file (``auto``) and a truncated one (``mmap``);
``test_discovery.py`` covers symlink loops in ``select_files``;
``test_distributed.py`` kills a worker mid-compute.

Drills that could kill the interpreter (``SIGBUS`` from a truncated mapping)
or need a low address-space limit run in a child process.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import re
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest

import npydask
from npydask import config
from npydask.errors import FileChangedError, NpyDaskWarning, NpyFormatError
from npydask.format.header import MAX_HEADER_BYTES, MAX_PREAMBLE
from npydask.storage import _handles
from npydask.testing.strategies import assert_same_array

pytestmark = pytest.mark.usefixtures("no_hedging")  # (counts requests: a hedge adds one)

ROOT = pathlib.Path(__file__).resolve().parent.parent
BACKENDS = ["pread", "mmap", "auto"]
IS_ROOT = os.geteuid() == 0
ROOT_REASON = "running as root: root reads files whatever their permission bits (test_header.py checks as nobody)"


def values(shape: tuple[int, ...] = (40, 30), dtype: str = "<f8", seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def child(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (``sys.argv[1:]`` = ``args``)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def lazy(kind: str, path: pathlib.Path, backend: str) -> Any:
    """A lazy array over ``path`` built the way ``kind`` says."""
    if kind == "from_npy":
        return npydask.from_npy(path, chunks=(10, 30), backend=backend)
    if kind == "dataset-roi":  # a ROI: its own task, not grouped
        return npydask.open_dataset(files=[str(path)], roi_start=[1, 2], roi_end=[39, 28], backend=backend)[0]
    raise ValueError(kind)


# --------------------------------------------------------------------------
# Deleted, truncated, grown, rewritten after the graph was built


@pytest.mark.timeout(30)
@pytest.mark.parametrize("warm", [False, True], ids=["cold", "after-a-first-compute"])
@pytest.mark.parametrize("kind", ["from_npy", "dataset-roi"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_deleted_before_compute(tmp_path, backend, kind, warm):
    path = tmp_path / "gone.npy"
    np.save(path, values())
    x = lazy(kind, path, backend)
    if warm:
        x.compute()  # the handle (and for mmap the mapping) is cached and open
    path.unlink()
    with pytest.raises(FileNotFoundError) as info:
        x.compute(scheduler="threads")
    assert str(path) in str(info.value)


def _change(path: pathlib.Path, how: str) -> None:
    st = os.stat(path)
    if how == "truncate":  # cut into the payload
        os.truncate(path, st.st_size - 100)
    elif how == "truncate-to-header":
        os.truncate(path, 128)
    elif how == "grow":  # appended to: same payload, new size
        with open(path, "ab") as f:
            f.write(bytes(64))
    elif how == "rewrite-same-size":  # in place, same inode, a later mtime
        with open(path, "r+b") as f:
            f.seek(200)
            f.write(b"\x7f" * 64)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    elif how == "replace":  # a new file renamed over it (another inode)
        tmp = path.with_name("incoming.npy")
        np.save(tmp, values(seed=9))
        os.replace(tmp, path)
    else:
        raise ValueError(how)


# test_array.py already has (auto, rewrite) and (mmap, truncate) without a prior compute.
@pytest.mark.timeout(30)
@pytest.mark.parametrize("how", ["truncate", "truncate-to-header", "grow", "rewrite-same-size", "replace"])
@pytest.mark.parametrize("kind", ["from_npy", "dataset-roi"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_changed_before_compute_is_detected(tmp_path, backend, kind, how):
    path = tmp_path / "changing.npy"
    np.save(path, values())
    x = lazy(kind, path, backend)
    first = x.compute()  # warm: cached handle, mapping for mmap/auto
    _change(path, how)
    with pytest.raises(FileChangedError) as info:
        x.compute(scheduler="threads")
    assert str(path) in str(info.value) and "changed" in str(info.value)
    assert isinstance(info.value, OSError)
    # opening again reads what is there now (or refuses a now-truncated file)
    if how.startswith("truncate"):
        with pytest.raises(NpyFormatError, match="truncated"):
            lazy(kind, path, backend)
    else:
        again = lazy(kind, path, backend).compute()
        assert again.shape == first.shape


_SIGBUS_CHILD = """
    import os, sys, numpy as np, npydask
    path, backend = sys.argv[1], sys.argv[2]
    x = npydask.from_npy(path, chunks=(64, 256), backend=backend)
    whole = x.sum().compute(scheduler="threads")   # maps the file (mmap, auto)
    part = x[100:130].compute()
    os.truncate(path, 4096)                        # the payload is gone under the mapping
    for what in (lambda: x.sum().compute(scheduler="threads"), lambda: x[100:130].compute(),
                 lambda: npydask.read_region(path, backend=backend)):
        try:
            what()
        except (npydask.FileChangedError, npydask.NpyFormatError) as e:
            print(type(e).__name__, path in str(e))
        else:
            print("read", flush=True)
    print("alive", flush=True)
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("backend", BACKENDS)
def test_truncated_under_a_mapping_fails_without_sigbus(tmp_path, backend):
    """Truncated between build (and a first compute) and compute: an error, not a SIGBUS killing the process."""
    path = tmp_path / "big.npy"
    np.save(path, values((1024, 256), "<f4"))  # 1 MiB: the tail is many pages past byte 4096
    done = child(_SIGBUS_CHILD, str(path), backend)
    assert done.returncode == 0, (
        f"child died with {done.returncode} (SIGBUS is {-signal.SIGBUS}): {done.stderr[-2000:]}"
    )
    lines = done.stdout.split("\n")
    assert lines[:4] == ["FileChangedError True", "FileChangedError True", "NpyFormatError True", "alive"], done.stdout


_VIEW_CHILD = """
    import os, sys, numpy as np, npydask
    path, backend, which = sys.argv[1], sys.argv[2], sys.argv[3]
    kind = lambda a: "view" if not a.flags.owndata and not a.flags.writeable else "copy"
    if which == "read_region":
        result = npydask.read_region(path, backend=backend)   # mmap, auto: a view of the shared mapping
    else:
        result = npydask.from_npy(path, backend=backend).compute()   # one chunk
    print(kind(result), flush=True)
    os.truncate(path, 4096)
    print(float(result[-1].sum()), flush=True)               # touches pages past the new end of file
    print("alive", flush=True)
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("which", ["read_region", "compute"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_copy_result_outlives_truncation_documented_window(tmp_path, backend, which):
    """Documents the window npydask/backends/mmap.py names: a zero-copy view still alive when its file shrinks.

    A ``read_region(backend="mmap" or "auto")`` result is a read-only view of a shared mapping: touching
    it after another process truncated the file raises SIGBUS. ``compute()`` of a one-chunk array is a
    copy under dask's legacy engine and that same view under array query planning (see
    test_computed_results_are_writeable_like_numpy_load). ``pread`` results are always copies and survive.
    (README: use ``backend="pread"`` for files other processes may truncate while results are alive.)
    """
    path = tmp_path / "big.npy"
    np.save(path, values((1024, 256), "<f4"))
    done = child(_VIEW_CHILD, str(path), backend, which)
    lines = done.stdout.split("\n")
    view = backend != "pread" and (which == "read_region" or da.array_expr_enabled())
    assert lines[0] == ("view" if view else "copy"), done.stdout + done.stderr[-2000:]
    if view:
        assert done.returncode == -signal.SIGBUS, (done.returncode, done.stdout, done.stderr[-2000:])
    else:
        assert done.returncode == 0 and lines[2] == "alive", (done.stdout, done.stderr[-2000:])


@pytest.mark.timeout(30)
@pytest.mark.parametrize("backend", ["auto", "mmap"])
def test_computed_results_are_writeable_or_documented_read_only_views(tmp_path, backend):
    """As the README says: the legacy engine hands back a fresh copy; under dask's query planning a
    one-chunk array computes to the chunk itself, a read-only view of the file's shared mapping."""
    path = tmp_path / "one.npy"
    np.save(path, values((64, 32), "<f4"))
    for x in (npydask.from_npy(path, backend=backend), npydask.open_dataset(files=[str(path)], backend=backend)[0]):
        got = x.compute()
        np.testing.assert_array_equal(got, np.load(path))
        if da.array_expr_enabled():
            assert not got.flags.writeable and not got.flags.owndata  # a view: np.array(got) to own it
        else:
            assert got.flags.writeable
            got[0, 0] = 1.0  # as with numpy.load's result
        assert np.array(got).flags.writeable


@pytest.mark.timeout(30)
@pytest.mark.parametrize("backend", BACKENDS)
def test_same_size_rewrite_within_one_timestamp_tick_is_not_detected(tmp_path, backend):
    """Documents the limit of identity checks (size, mtime, inode), as on NFS with coarse timestamps.

    A file rewritten in place with the same size, keeping its inode, whose mtime ends up identical
    (same tick of a coarse clock; here forced back with ``os.utime``) is *not* detected: the task reads
    the new bytes. One nanosecond of mtime difference is enough to be detected.
    """
    path = tmp_path / "nfs.npy"
    old = values()
    np.save(path, old)
    x = npydask.from_npy(path, chunks=(10, 30), backend=backend)
    assert_same_array(x.compute(), old)
    st = os.stat(path)
    new = old + 1
    with open(path, "r+b") as f:
        f.seek(st.st_size - new.nbytes)
        f.write(new.tobytes())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_ino == st.st_ino
    assert_same_array(x.compute(), new)  # silently the new data: the documented limit
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    with pytest.raises(FileChangedError):
        x.compute()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("what", ["fifo", "directory", "socket"])
def test_replaced_by_a_special_file_before_compute(tmp_path, what):
    path = tmp_path / "x.npy"
    np.save(path, values())
    x = npydask.from_npy(path, chunks=(10, 30))
    path.unlink()
    if what == "fifo":
        os.mkfifo(path)
    elif what == "directory":
        path.mkdir()
    else:
        if len(str(path)) > 100:
            pytest.skip("socket path too long")
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
    t0 = time.perf_counter()
    with pytest.raises(OSError, match=re.escape(str(path))):
        x.compute()
    assert time.perf_counter() - t0 < 5
    _handles.clear_cache()  # as on a fresh worker
    with pytest.raises(OSError, match=re.escape(str(path))) as info:
        npydask.from_npy(path)
    assert not isinstance(info.value, NpyFormatError)


# --------------------------------------------------------------------------
# Paths that cannot be read: through from_npy and open_dataset


@pytest.mark.timeout(30)
def test_permission_removed_before_compute_on_a_fresh_worker(tmp_path):
    if IS_ROOT:
        pytest.skip(ROOT_REASON)
    path = tmp_path / "secret.npy"
    np.save(path, values())
    x = npydask.from_npy(path, chunks=(10, 30))
    path.chmod(0)
    try:
        _handles.clear_cache()  # a worker that never opened it
        with pytest.raises(PermissionError) as info:
            x.compute()
        assert str(path) in str(info.value)
        with pytest.raises(PermissionError) as info:
            npydask.open_dataset(files=[str(path)])
        assert str(path) in str(info.value)
    finally:
        path.chmod(0o644)


def _special(kind: str, tmp_path: pathlib.Path) -> tuple[str, Any]:
    if kind == "directory":
        path = tmp_path / "dir.npy"
        path.mkdir()
        return str(path), None
    if kind == "fifo":
        path = tmp_path / "fifo.npy"
        os.mkfifo(path)
        return str(path), None
    if kind == "fifo-with-writer":  # a writer holds it open and never writes
        path = tmp_path / "fifo2.npy"
        os.mkfifo(path)
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        return str(path), fd
    if kind == "socket":
        path = tmp_path / "s.npy"
        if len(str(path)) > 100:
            pytest.skip("socket path too long")
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        return str(path), server
    if not os.path.exists(kind):
        pytest.skip(f"no {kind}")
    return kind, None


def _open_lazily(call: str, path: str, tmp_path: pathlib.Path) -> None:
    """Open ``path`` through the lazy entry point ``call`` names (a file list is written under ``tmp_path``)."""
    if call == "from_npy":
        npydask.from_npy(path)
    elif call == "open_dataset-files":
        npydask.open_dataset(files=[path])
    else:
        listing = tmp_path / "list.txt"
        listing.write_text(path + "\n")
        npydask.open_dataset(file_list=str(listing))


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", ["directory", "fifo", "fifo-with-writer", "socket", "/dev/zero", "/dev/urandom"])
@pytest.mark.parametrize("call", ["from_npy", "open_dataset-files", "open_dataset-file_list"])
def test_special_files_refused_quickly_by_the_lazy_entry_points(tmp_path, kind, call):
    path, holder = _special(kind, tmp_path)
    try:
        t0 = time.perf_counter()
        with pytest.raises(OSError, match=re.escape(path)) as info:
            _open_lazily(call, path, tmp_path)
        assert time.perf_counter() - t0 < 1.0
        assert not isinstance(info.value, NpyFormatError)
    finally:
        if isinstance(holder, int):
            os.close(holder)
        elif holder is not None:
            holder.close()


@pytest.mark.timeout(30)
def test_symlink_loops_in_a_recursive_dataset(tmp_path):
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    arrays = {"top.npy": values((3, 4), seed=1), "a/x.npy": values((3, 4), seed=2), "a/b/y.npy": values((3, 4), seed=3)}
    for name, a in arrays.items():
        np.save(root / name, a)
    os.symlink(".", root / "self")  # root/self -> root
    os.symlink("..", root / "a" / "b" / "up")  # a/b/up -> a
    os.symlink("../a", root / "a" / "b" / "again")  # a/b/again -> a
    os.symlink("loop.npy", root / "loop.npy")  # a file symlink pointing at itself: ELOOP
    os.symlink("ping.npy", root / "a" / "pong.npy")
    os.symlink("pong.npy", root / "a" / "ping.npy")
    t0 = time.perf_counter()
    ds = npydask.open_dataset(root, recursive=True)
    assert time.perf_counter() - t0 < 5
    assert [os.path.relpath(f, root) for f in ds.files] == ["a/b/y.npy", "a/x.npy", "top.npy"]
    for got, name in zip(ds.arrays(), ["a/b/y.npy", "a/x.npy", "top.npy"]):
        assert_same_array(got.compute(), arrays[name])
    # a looping link named explicitly is an OSError naming it (ELOOP), not a hang
    with pytest.raises(OSError, match="loop.npy") as info:
        npydask.open_dataset(root, files=["loop.npy"])
    assert info.value.errno == errno.ELOOP
    os.symlink("rootloop", tmp_path / "rootloop")
    with pytest.raises(OSError, match="rootloop"):
        npydask.open_dataset(tmp_path / "rootloop", recursive=True)


# --------------------------------------------------------------------------
# Resource bombs: a header over 1 MiB, a shape of 10**18 elements


def _huge_header_file(path: pathlib.Path) -> None:
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x02\x00" + struct.pack("<I", 0xFFFFFFFF) + b"{'descr': '<f4'")
        f.truncate(0x1_0000_0100)  # sparse 4 GiB


def _open_huge_header(call: str, path: pathlib.Path) -> None:
    """Open ``path`` (alone in its folder) through the entry point ``call`` names."""
    if call == "read_region":
        npydask.read_region(path)
    elif call == "from_npy":
        npydask.from_npy(path)
    elif call == "open_dataset":
        npydask.open_dataset(path.parent)
    else:
        npydask.open_dataset(path.parent, recursive=True)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("call", ["read_region", "from_npy", "open_dataset", "open_dataset-recursive"])
def test_header_over_1_MiB_refused_quickly_by_every_entry_point(tmp_path, monkeypatch, call):
    path = tmp_path / "huge.npy"
    _huge_header_file(path)
    read: list[int] = []
    real_pread, real_preadv = os.pread, os.preadv

    def pread(fd: int, n: int, offset: int) -> bytes:
        data = real_pread(fd, n, offset)
        read.append(len(data))
        return data

    def preadv(fd: int, buffers: Any, offset: int) -> int:
        n = real_preadv(fd, buffers, offset)
        read.append(n)
        return n

    monkeypatch.setattr(os, "pread", pread)
    monkeypatch.setattr(os, "preadv", preadv)
    t0 = time.perf_counter()
    with pytest.raises(NpyFormatError, match="4294967295") as info:
        _open_huge_header(call, path)
    assert time.perf_counter() - t0 < 1.0
    assert str(path) in str(info.value)
    # at most the cap (plus the first 4 KiB read twice by open_dataset), not 4 GiB
    assert sum(read) <= MAX_PREAMBLE + MAX_HEADER_BYTES + 8192, sum(read)


# Children run under an address-space limit set from their own VmSize, read by status().
_STATUS = """
    def status(field):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
"""

_BOMB_CHILD = (
    """
    import json, os, resource, sys
    import numpy as np, dask.array, npydask
"""
    + _STATUS
    + """
    folder = sys.argv[1]
    budget = 512 << 20
    resource.setrlimit(resource.RLIMIT_AS, (status("VmSize") + budget, resource.RLIM_INFINITY))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    results = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        got = []
        calls = [
            ("parse_header", lambda: npydask.parse_header(open(path, "rb").read(4096))),
            ("read_header", lambda: npydask.read_header(path)),
            ("read_region", lambda: npydask.read_region(path)),
            ("from_npy", lambda: npydask.from_npy(path)),
            ("open_dataset", lambda: npydask.open_dataset(files=[path])),
        ]
        for what, call in calls:
            try:
                call()
                got.append(what + ":accepted")
            except npydask.NpyFormatError as e:
                got.append(what + ":NpyFormatError" + (":named" if path in str(e) or what == "parse_header" else ""))
            except BaseException as e:
                got.append(what + ":" + type(e).__name__)
        results[name] = got
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) * 1024
    print(json.dumps({"results": results, "maxrss_growth": grown}))
"""
)


_NOMEM_CHILD = (
    """
    import json, os, resource, sys
    import numpy as np, dask, npydask
"""
    + _STATUS
    + """
    path, how = sys.argv[1], sys.argv[2]
    resource.setrlimit(resource.RLIMIT_AS, (status("VmSize") + (192 << 20), resource.RLIM_INFINITY))
    try:
        if how == "read_region":
            npydask.read_region(path)
        elif how == "from_npy":
            npydask.from_npy(path, chunks=-1, backend="pread").compute(scheduler="sync")
        elif how == "stack":
            npydask.open_dataset(files=[path, path]).stack(chunks=(2, -1)).compute(scheduler="sync")
        elif how == "roi":
            npydask.open_dataset(files=[path], roi_start=[1], roi_end=[(1 << 28) - 1])[0].compute(scheduler="sync")
        print(json.dumps(["no error"]))
    except BaseException as e:
        print(json.dumps([type(e).__name__, str(e)]))
"""
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["read_region", "from_npy", "stack", "roi"])
def test_no_memory_for_a_chunk_buffer_raises_memory_error_naming_the_read(tmp_path, how):
    """Under an address-space limit of current + 192 MiB, a 256 MiB buffer fails as ``MemoryError`` naming the file."""
    path = tmp_path / "big.npy"
    with open(path, "wb") as f:  # 256 MiB of zeros, sparse
        np.lib.format.write_array_header_1_0(f, {"descr": "<u1", "fortran_order": False, "shape": (1 << 28,)})
        f.truncate(f.tell() + (1 << 28))
    done = child(_NOMEM_CHILD, str(path), how, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    kind, *message = json.loads(done.stdout.strip().splitlines()[-1])
    assert kind == "MemoryError", (kind, message)
    assert str(path) in message[0] and "MiB" in message[0], message


def _bomb(shape: str, descr: str = "<f8", payload: int = 64) -> bytes:
    text = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"
    text += " " * (63 - (10 + len(text)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode() + bytes(payload)


@pytest.mark.timeout(120)
def test_shapes_of_10_to_the_18_elements_are_refused_without_allocating(tmp_path):
    """Under an address-space limit of (current + 512 MiB), every entry point refuses, and max RSS barely grows."""
    folder = tmp_path / "bombs"
    folder.mkdir()
    bombs = {
        "1e18-f8.npy": _bomb("(1000000000000000000,)"),  # 8e18 bytes: fits intp, payload missing
        "1e18x10-f8.npy": _bomb("(1000000000000000000, 10)"),  # overflows intp
        "2e9x2e9-u1.npy": _bomb("(2000000000, 2000000000)", "|u1"),  # 4e18 bytes
        "1e18-c16-F.npy": _bomb("(1000, 1000000000000000)", "<c16").replace(b"False", b"True "),
        "64-dims.npy": _bomb("(" + "2, " * 63 + "2)", "|u1"),  # 2**64 bytes: overflows
        "1e18-struct.npy": _bomb("(1000000000000000000,)", "V16"),
    }
    for name, data in bombs.items():
        (folder / name).write_bytes(data)
    done = child(_BOMB_CHILD, str(folder), timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    for name, got in report["results"].items():
        for outcome in got:
            what = outcome.split(":")[0]
            if what == "parse_header" and name in ("1e18-f8.npy", "2e9x2e9-u1.npy"):
                assert outcome == "parse_header:accepted", (name, outcome)  # valid alone: the payload is checked later
            else:
                assert outcome == f"{what}:NpyFormatError:named", (name, outcome)
    assert report["maxrss_growth"] < 64 << 20, report["maxrss_growth"]


_SPARSE_CHILD = (
    """
    import json, os, resource, sys
    import numpy as np, npydask
"""
    + _STATUS
    + """
    path, backend = sys.argv[1], sys.argv[2]
    resource.setrlimit(resource.RLIMIT_AS, (status("VmSize") + (768 << 20), resource.RLIM_INFINITY))
    try:
        x = npydask.from_npy(path, backend=backend)     # 2**40 bytes: ~8192 chunks of 128 MiB
        tail = x[-3:].compute(scheduler="sync")
        region = npydask.read_region(path, (2**40 - 5,), None, backend=backend)
        print(json.dumps([len(x.__dask_keys__()), tail.tolist(), region.tolist()]))
    except OSError as e:
        print(json.dumps(["OSError", str(e)]))
"""
)


def _sparse_tib(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "tib.npy"
    header = _bomb(f"({2**40},)", "|u1", payload=0)
    try:
        with open(path, "wb") as f:
            f.write(header)
            f.seek(len(header) + 2**40 - 5)
            f.write(bytes([1, 2, 3, 4, 5]))  # the last five bytes; the rest is a hole
    except OSError as e:
        pytest.skip(f"no sparse 1 TiB file here: {e}")
    return path


@pytest.mark.timeout(60)
def test_a_sparse_one_TiB_file_is_read_by_region_within_a_low_address_space_limit(tmp_path):
    path = _sparse_tib(tmp_path)
    done = child(_SPARSE_CHILD, str(path), "pread", timeout=50)
    assert done.returncode == 0, done.stderr[-3000:]
    parts, tail, region = json.loads(done.stdout.strip().splitlines()[-1])
    assert parts >= 2**40 // (256 << 20)
    assert tail == [3, 4, 5] and region == [1, 2, 3, 4, 5]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["mmap", "auto"])
def test_mapping_failure_names_the_file(tmp_path, backend):
    """Under an address-space limit (``ulimit -v``) a 1 TiB mapping fails: ``mmap`` names the file, ``auto`` preads."""
    path = _sparse_tib(tmp_path)
    done = child(_SPARSE_CHILD, str(path), backend, timeout=50)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if backend == "mmap":
        assert out[0] == "OSError" and str(path) in out[1] and "pread" in out[1], out
    else:
        assert out[1:] == [[3, 4, 5], [1, 2, 3, 4, 5]], out


# --------------------------------------------------------------------------
# Many threads through one handle cache


@pytest.fixture
def shared_files(tmp_path) -> list[tuple[str, np.ndarray]]:
    specs = [((64, 50), "<f8", "C"), ((64, 50), ">i4", "F"), ((33, 17, 5), "<c8", "C"), ((2000,), ">f2", "C"),
             ((20, 30), "u1", "F"), ((16, 16), [("a", "<i2"), ("b", ">f4", (2,))], "C")]  # fmt: skip
    out = []
    for k, (shape, dtype, order) in enumerate(specs):
        dt = np.dtype(dtype)
        raw = np.random.default_rng(k).bytes(int(np.prod(shape)) * dt.itemsize)
        a = np.frombuffer(raw, dt).reshape(shape)
        path = tmp_path / f"s{k}.npy"
        np.save(path, np.array(a, order=order))
        out.append((str(path), np.load(path)))
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cache_size", [128, 2, 0])
def test_sixteen_threads_share_the_handle_cache(shared_files, cache_size):
    """read_region and from_npy(...).compute(scheduler="threads") from 16 threads at once equal numpy."""
    barrier = threading.Barrier(16)

    def worker(seed: int) -> int:
        rng = np.random.default_rng(100 + seed)
        barrier.wait(timeout=30)
        n = 0
        for i in range(12):
            path, expected = shared_files[int(rng.integers(len(shared_files)))]
            backend = BACKENDS[int(rng.integers(3))]
            start = [int(rng.integers(0, s + 1)) for s in expected.shape]
            stop = [int(rng.integers(a, s + 1)) for a, s in zip(start, expected.shape)]
            want = expected[tuple(slice(a, b) for a, b in zip(start, stop))]
            if i % 2:
                got = npydask.read_region(path, start, stop, backend=backend)
            else:
                chunks = tuple(max(1, s // 3) for s in expected.shape)
                x = npydask.from_npy(path, chunks=chunks, backend=backend)
                got = x[tuple(slice(a, b) for a, b in zip(start, stop))].compute(scheduler="threads", num_workers=4)
            assert_same_array(np.ascontiguousarray(got), want)
            n += 1
        return n

    with config.set(handle_cache_size=cache_size), ThreadPoolExecutor(16) as pool:
        assert sum(pool.map(worker, range(16))) == 16 * 12


# --------------------------------------------------------------------------
# O_DIRECT refused by the file system, through lazy arrays on many threads


@pytest.mark.timeout(60)
def test_o_direct_refused_falls_back_once_per_file_in_threaded_compute(tmp_path, monkeypatch):
    files = []
    for k in range(3):
        a = values((64, 40), "<f4", seed=k)
        path = tmp_path / f"d{k}.npy"
        np.save(path, a)
        files.append((str(path), a))
    real_open = os.open

    def refusing_open(p: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "Invalid argument (simulated: no O_DIRECT here)", p)
        return real_open(p, flags, *args, **kwargs)

    monkeypatch.setattr(_handles.os, "open", refusing_open)
    with config.set(direct_io=True):
        arrays = [npydask.from_npy(p, chunks=(8, 40), backend="pread") for p, _ in files]
        ds = npydask.open_dataset(files=[p for p, _ in files], roi_start=[1, 1], roi_end=[60, 39], backend="pread")
    with pytest.warns(NpyDaskWarning, match="O_DIRECT") as record:
        got = dask.compute(*arrays, ds.stack(), scheduler="threads", num_workers=8)
    for (_, a), x in zip(files, got):
        assert_same_array(x, a)
    assert_same_array(got[-1], np.stack([a[1:60, 1:39] for _, a in files]))
    warned = sorted(str(w.message).split(":")[0] for w in record if issubclass(w.category, NpyDaskWarning))
    assert warned == sorted(p for p, _ in files), warned  # once per file, not once per chunk or thread


# --------------------------------------------------------------------------
# P6: the bounded-memory benchmark stays runnable


@pytest.mark.timeout(240)
def test_memory_benchmark_runs_at_tiny_size(tmp_path):
    out_json = tmp_path / "p6.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_memory.py"), "--size", "tiny", "--repeat", "1",
         "--json", str(out_json), "--data", str(tmp_path / "data")],
        capture_output=True, text=True, timeout=220, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    goal = [line for line in done.stdout.splitlines() if line.startswith("P6 ")]
    assert len(goal) == 1 and goal[0].rstrip().endswith("PASS"), done.stdout[-3000:]
    data = json.loads(out_json.read_text())
    assert {r["variant"] for r in data["results"]} >= {
        "npydask auto",
        "npydask pread",
        "np.load",
        "dask from_array(mmap)",
    }
    assert (tmp_path / "data").is_dir()  # --data keeps the file


# --------------------------------------------------------------------------
# A rewrite in place while a read is under way: the identity is checked again after the bytes are in


_PLANNED_MTIME_NS = 1_000_000_000 * 10**9  # 2001: a rewrite's natural mtime always differs from it


class _InPlaceWriter:
    """Rewrites files in place (same size, same inode, new constant payload) in 64 KiB pieces, on demand."""

    def __init__(self, paths: list[pathlib.Path], offset: int) -> None:
        self.paths, self.offset = paths, offset
        self.go = threading.Event()
        self.value = 0.0
        self.thread: threading.Thread | None = None

    def start(self, value: float, delay: float) -> None:
        self.value = value
        self.go.clear()
        self.thread = threading.Thread(target=self._run, args=(delay,))
        self.thread.start()

    def _run(self, delay: float) -> None:
        self.go.wait(10)
        time.sleep(delay)
        for path in self.paths[::-1]:  # against the readers' order: they cross
            size = os.path.getsize(path) - self.offset
            piece = np.full(min(size, 64 << 10) // 8, self.value, "<f8").tobytes()
            fd = os.open(path, os.O_WRONLY)  # no O_TRUNC: the same inode, the same size
            try:
                for at in range(self.offset, self.offset + size, len(piece)):
                    os.pwrite(fd, piece[: self.offset + size - at], at)
            finally:
                os.close(fd)

    def join(self) -> None:
        assert self.thread is not None
        self.thread.join(30)


def _write_version(paths: list[pathlib.Path], shape: tuple[int, ...], value: float) -> None:
    """Version ``value`` of every file, in place, then a planned mtime no rewrite can give it."""
    for path in paths:
        if path.exists():
            with open(path, "r+b") as f:  # in place: the inode stays
                np.lib.format.write_array(f, np.full(shape, value, "<f8"))
        else:
            np.save(path, np.full(shape, value, "<f8"))
        os.utime(path, ns=(_PLANNED_MTIME_NS, _PLANNED_MTIME_NS + int(value)))


_REWRITE_READS: dict[str, tuple[int, tuple[int, ...], Any]] = {
    # name: (files, shape, plan: paths -> a function that reads); plans are made before the writer starts
    "from_npy-pread": (1, (512, 1024), lambda ps: npydask.from_npy(ps[0], chunks=(256, 1024), backend="pread").compute),
    # strided chunks: copied inside the read (a zero-copy chunk shows later writes: the documented window)
    "from_npy-auto-strided": (1, (512, 1024),
                              lambda ps: npydask.from_npy(ps[0], chunks=(512, 500), backend="auto").compute),
    "from_npy-mmap-copy": (1, (512, 1024),
                           lambda ps: npydask.from_npy(ps[0], chunks=(256, 700), backend="mmap").compute),
    "read_region": (1, (512, 1024), lambda ps: lambda: npydask.read_region(ps[0], (0, 0), (512, 1000))),
    "read_region-mmap": (1, (512, 1024),
                         lambda ps: lambda: npydask.read_region(ps[0], (0, 1), (512, 1024), backend="mmap")),
    "stack-small-files": (8, (256, 1024), lambda ps: npydask.open_dataset(files=[str(p) for p in ps]).stack().compute),
    "roi-group": (16, (128, 256), lambda ps: npydask.open_dataset(
        files=[str(p) for p in ps], roi_start=[2, 3], roi_shape=[120, 250]).stack().compute),
}  # fmt: skip


_HELD_OFF = {"from_npy-auto-strided", "from_npy-mmap-copy", "read_region-mmap"}
"""Reads that may copy from a mapping, under a read lease: the writer's open for writing waits until the copy ends,
so such a read may never overlap a write (each then returns the planned version; where the writer opened the file
first, no lease is granted and the read goes by pread, which meets the change)."""


@pytest.mark.timeout(600)
@pytest.mark.parametrize("how", list(_REWRITE_READS))
def test_a_rewrite_in_place_during_a_read_never_returns_torn_data(tmp_path, monkeypatch, how):
    """Each read equals the files as planned (value ``v``) or raises ``FileChangedError``, never a mix.

    A thread rewrites the files in place (the last first) with ``v + 1`` (same size and inode, natural mtime) starting
    a random 0-0.8 ms after the read opened its file (``read_region``, which has no plan, holds what it
    found then), or after the compute started (a group of small files or ROIs). The planned mtime is far in
    the past, so every rewrite shows in the mtime: the documented same-tick window is not in play.
    """
    from npydask.storage import _local_read as pread
    from npydask.storage import local

    n_files, shape, plan = _REWRITE_READS[how]
    paths = [tmp_path / f"f{k:02d}.npy" for k in range(n_files)]
    _write_version(paths, shape, 0.0)
    writer = _InPlaceWriter(paths, npydask.read_header(paths[0]).data_offset)

    def opened_then_go(*args: Any, **kwargs: Any) -> Any:
        f = real(*args, **kwargs)
        writer.go.set()
        return f

    real = local.acquire  # (what LocalSource.open calls: FileRef.read and read_region open through it)
    monkeypatch.setattr(local, "acquire", opened_then_go)
    monkeypatch.setattr(pread, "acquire", opened_then_go)
    rng = np.random.default_rng(7)
    outcomes = {"planned": 0, "changed": 0}
    changed: list[str] = []  # the messages of the reads refused, each naming the file
    enough = 301 if n_files > 1 else 101
    for it in range(1, 10 * enough):  # on until the writer has overlapped a read (under load it may take longer)
        if it >= enough and outcomes["changed"]:
            break
        value = 2.0 * it
        _write_version(paths, shape, value)
        read = plan(paths)
        writer.start(value + 1, float(rng.uniform(0, 0.0008)))
        if how.startswith(("stack", "roi")):
            writer.go.set()  # (the grouped loops open files themselves)
        try:
            got = read()
        except FileChangedError as e:
            changed.append(str(e))
            outcomes["changed"] += 1
        else:
            wrong = np.count_nonzero(got != value)
            assert wrong == 0, f"iteration {it}: {wrong} of {got.size} values are not the planned version"
            outcomes["planned"] += 1
        finally:
            writer.go.set()
            writer.join()
    if how not in _HELD_OFF:
        assert outcomes["changed"] > 0, outcomes  # the writer did overlap reads
    assert all(str(tmp_path) in message for message in changed), changed


# --------------------------------------------------------------------------
# A low RLIMIT_NOFILE: the handle cache stays under it and the process keeps working

_NOFILE_CHILD = """
    import json, os, resource, sys
    folder, soft, how, cache = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    if cache != "default":
        os.environ["NPYDASK_HANDLE_CACHE_SIZE"] = cache
    import numpy as np, dask, npydask
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    held = []
    if how.endswith("-crowded"):  # the rest of the process holds all but a few descriptors
        how = how[: -len("-crowded")]
        while len(os.listdir("/proc/self/fd")) < soft - 6:
            held.append(os.open(os.devnull, os.O_RDONLY))
    paths = sorted(os.path.join(folder, n) for n in os.listdir(folder))
    total = 0.0
    with dask.config.set(scheduler="threads", num_workers=4):
        if how == "from_npy":
            for p in paths:
                total += float(npydask.from_npy(p, chunks=(5, 7)).sum().compute())  # mapped: two descriptors a file
        elif how == "from_npy-pread":
            for p in paths:
                total += float(npydask.from_npy(p, backend="pread").sum().compute())
        elif how == "read_region":
            for p in paths:
                total += float(npydask.read_region(p, (1, 0), (9, 7), backend="auto").sum())
        elif how == "dataset-items":
            ds = npydask.open_dataset(folder)
            total = float(sum(float(ds[i].sum().compute()) for i in range(len(ds))))
        elif how == "stack":
            total = float(npydask.open_dataset(folder).stack().sum().compute())
        elif how == "roi-stack":
            total = float(npydask.open_dataset(folder, roi_start=[1, 0], roi_end=[9, 7]).stack().sum().compute())
    for fd in held:
        os.close(fd)
    fds = len(os.listdir("/proc/self/fd"))
    with open(paths[0], "rb") as f:
        f.read(1)
    npydask.open_dataset(folder)
    import distributed  # opens many files of its own
    print(json.dumps({"total": total, "fds": fds}))
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cache", ["default", "10000"])
@pytest.mark.parametrize(
    "how",
    [
        "from_npy",
        "from_npy-pread",
        "read_region",
        "dataset-items",
        "stack",
        "roi-stack",
        "from_npy-crowded",
        "read_region-crowded",
        "roi-stack-crowded",
    ],
)
def test_reading_300_files_under_a_low_open_file_limit(tmp_path, how, cache):
    """Under ``RLIMIT_NOFILE`` 64 the handle cache stays below the limit and the process stays usable.

    ``-crowded``: the process holds all but six descriptors, fewer than the cache may take, so an
    open fails with ``EMFILE``, empties the cache and succeeds on its retry.
    """
    folder = tmp_path / "many"
    folder.mkdir()
    want = 0.0
    for k in range(300):
        a = np.arange(70, dtype="<f8").reshape(10, 7) + k
        np.save(folder / f"{k:03d}.npy", a)
        want += float(a[1:9].sum() if how.startswith(("read_region", "roi-stack")) else a.sum())
    done = child(_NOFILE_CHILD, str(folder), "64", how, cache, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["total"] == pytest.approx(want) and out["fds"] < 64, out


_EXHAUSTED_CHILD = """
    import errno, json, os, resource, sys, time
    path = sys.argv[1]
    import numpy as np, npydask
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    held = []
    while True:  # every descriptor taken, none of them npydask's
        try:
            held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            break
    start = time.monotonic()
    try:
        npydask.read_region(path, (0, 0), (2, 2))
    except OSError as e:
        took = time.monotonic() - start
        for fd in held:
            os.close(fd)
        print(json.dumps({"errno": e.errno, "message": str(e), "took": took}))
"""


def test_a_process_out_of_descriptors_gets_a_clear_error_soon(tmp_path):
    """With every descriptor held elsewhere the open's retries give up within a second and name the limit."""
    path = tmp_path / "a.npy"
    np.save(path, np.zeros((4, 4)))
    done = child(_EXHAUSTED_CHILD, str(path))
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["errno"] == errno.EMFILE, out
    assert "RLIMIT_NOFILE" in out["message"] and "soft 64" in out["message"] and str(path) in out["message"], out
    assert 0.4 <= out["took"] < 5, out


_TRUNCATING_READER = """
    import sys, time, numpy as np, npydask
    from npydask.samplers import Uniform
    path, seconds, most = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    want = np.load(path)
    ds = npydask.open_dataset(files=[path])
    loader = npydask.Loader(ds, 4, sampler=Uniform((8, 32, 32), per_file=16), shuffle=True, with_index=True)
    read = failed = mapped = 0
    print("ready", flush=True)
    began = time.monotonic()
    epoch = 0
    # (at least `seconds`, and on a loaded machine on until both outcomes and a mapped epoch were seen)
    while time.monotonic() - began < seconds or (not (failed and mapped) and time.monotonic() - began < most):
        loader.set_epoch(epoch); epoch += 1
        try:
            for batch, index in loader:
                for got, start, stop in zip(batch, index["start"], index["stop"]):  # checked after the read
                    np.testing.assert_array_equal(got, want[tuple(slice(a, b) for a, b in zip(start, stop))])
                    read += 1
        except npydask.FileChangedError:
            failed += 1
        else:
            stats = loader.stats()
            mapped += stats.requests == 0 and stats.bytes_read > 0  # (an epoch copied from the mapping)
    print(read, failed, mapped, flush=True)
"""

_TRUNCATER = """
    import os, sys, time
    path, stop = sys.argv[1], sys.argv[2]
    st = os.stat(path)
    with open(path, "rb") as f:
        tail = f.read()[4096:]
    deadline = time.monotonic() + 20
    while not os.path.exists(stop) and time.monotonic() < deadline:
        os.truncate(path, 4096)                 # the payload gone under the reader's mapping...
        fd = os.open(path, os.O_WRONLY)
        os.pwrite(fd, tail, 4096)               # ...and back, with its mtime: the same identity again
        os.close(fd)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        time.sleep(0.001)                       # (not open for writing meanwhile: the reader may map)
"""


@pytest.mark.timeout(60)
def test_patches_copied_from_a_mapping_survive_truncation_by_another_process(tmp_path):
    path = tmp_path / "vol.npy"
    np.save(path, values((32, 128, 128), "<f4"))  # 2 MiB, in the page cache: the default route maps it
    reader = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_TRUNCATING_READER), str(path), "1.0", "15"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert reader.stdout.readline().strip() == "ready", reader.stderr.read()
    stop = tmp_path / "stop"
    truncater = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_TRUNCATER), str(path), str(stop)], cwd=ROOT)
    try:
        out, err = reader.communicate(timeout=30)
    finally:
        stop.touch()
        truncater.wait(timeout=30)
    assert reader.returncode != -signal.SIGBUS, f"killed by SIGBUS: {err[-2000:]}"
    assert reader.returncode == 0, err[-3000:]
    read, failed, mapped = map(int, out.split())
    assert read > 0 and failed > 0 and mapped > 0, out  # (both outcomes seen, and reads from the mapping)
