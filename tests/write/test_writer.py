"""The write path: ``format_header``, ``to_npy`` and ``to_npy_files``; numpy is the oracle.

Every written file is read back with ``numpy.load`` and compared with what
``numpy.save`` writes for the same (C-ordered) array: byte for byte where the
dtype has no padding, value for value otherwise. The distributed tests share
one module-scoped ``LocalCluster`` of two worker processes.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import io
import json
import os
import subprocess
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import pytest
from dask.callbacks import Callback
from dask.core import flatten
from dask.delayed import Delayed
from dask.local import get_sync
from hypothesis import given, settings
from hypothesis import strategies as st

import npydask
from npydask.errors import FileChangedError
from npydask.format.header import format_header, parse_header
from npydask.testing.strategies import arrays, assert_same_array, dtypes, shapes
from npydask.write.npy import check_names, to_npy, to_npy_files

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_write.py"


# --------------------------------------------------------------------------
# helpers


def _has_padding(dtype: np.dtype) -> bool:
    if dtype.names is None:
        return dtype.subdtype is not None and _has_padding(dtype.subdtype[0])
    used = sum(dtype.fields[n][0].itemsize for n in dtype.names)
    return used != dtype.itemsize or any(_has_padding(dtype.fields[n][0]) for n in dtype.names)


def assert_like_numpy(path: str | os.PathLike[str], expected: np.ndarray) -> None:
    """``path`` loads as ``expected``; without padding bytes it is exactly ``numpy.save``'s file."""
    got = np.load(path, allow_pickle=False)
    expected = np.asarray(expected, order="C")  # np.ascontiguousarray would make a 0-d array 1-d
    assert_same_array(got, expected)
    if not _has_padding(expected.dtype):
        buf = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "Stored array in format 3.0"
            np.save(buf, expected)
        assert Path(path).read_bytes() == buf.getvalue()


def npy_files(folder: str | os.PathLike[str]) -> list[str]:
    return sorted(glob.glob(os.path.join(glob.escape(os.fspath(folder)), "**", "*.npy"), recursive=True))


class CountTasks(Callback):
    """Counts the tasks the local schedulers run."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def _pretask(self, key, dsk, state) -> None:
        self.n += 1


def numpy_header(dtype: np.dtype, shape: tuple[int, ...], fortran: bool) -> bytes:
    """The header numpy writes, version picked by numpy (its private ``_write_array_header``)."""
    try:
        from numpy.lib._format_impl import _write_array_header
    except ImportError:  # numpy < 2
        from numpy.lib.format import _write_array_header
    buf = io.BytesIO()
    fields = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": fortran, "shape": tuple(shape)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Stored array in format 2.0/3.0"
        _write_array_header(buf, fields)
    return buf.getvalue()


def _tasks_in(collection) -> int:
    """Entries in a collection's graph: its tasks (these graphs hold no data nodes or aliases)."""
    return len(dict(collection.__dask_graph__()))


# --------------------------------------------------------------------------
# format_header: numpy's bytes, parse_header round trips

HEADER_CASES = [
    (np.dtype("<f4"), (3, 4), False),
    (np.dtype(">i8"), (), False),
    (np.dtype("|b1"), (0,), False),
    (np.dtype("<c16"), (2, 3, 4), True),
    (np.dtype("<M8[ns]"), (12_345_678_901,), False),
    (np.dtype("S7"), (5, 0, 2), True),
    (np.dtype("<U3"), (1,), False),
    (np.dtype("V5"), (4, 4), False),
    (np.dtype([("a", "<f4"), ("b", ">i2", (2, 3)), ("c", [("d", "u1")])]), (6,), False),
    (np.dtype({"names": ["x", "y"], "formats": ["u1", "<f8"], "offsets": [0, 8], "itemsize": 24}), (2,), False),
    (np.dtype([("caf\u00e9", "<f4")]), (3,), False),  # latin-1: still format 1.0
    (np.dtype([("\u540d\u524d", "<f4"), ("x", "<i4")]), (3,), False),  # needs utf-8: format 3.0
    (np.dtype([(f"field{i}", "<f4") for i in range(4000)]), (2,), False),  # over 64 KiB: format 2.0
]


@pytest.mark.parametrize(("dtype", "shape", "fortran"), HEADER_CASES)
def test_format_header_is_numpys(dtype, shape, fortran):
    got = format_header(dtype, shape, fortran)
    assert got == numpy_header(dtype, shape, fortran)
    h = parse_header(got)
    assert (h.dtype, h.shape, h.fortran_order, h.data_offset) == (dtype, shape, fortran, len(got))
    assert len(got) % 64 == 0 and got.endswith(b"\n")


def test_format_header_versions():
    assert format_header(np.dtype("<f4"), (3,), False)[6:8] == b"\x01\x00"
    assert format_header(HEADER_CASES[-2][0], (3,), False)[6:8] == b"\x03\x00"
    assert format_header(HEADER_CASES[-1][0], (3,), False)[6:8] == b"\x02\x00"
    numpy_ints = (np.int64(3), np.int32(4))  # repr would spell them np.int64(3)
    assert format_header(np.dtype("<f4"), numpy_ints, False) == format_header(np.dtype("<f4"), (3, 4), False)


@pytest.mark.parametrize("align", [64, 128, 4096, 1 << 16])
def test_format_header_align(align):
    dtype = np.dtype([(f"f{i}", "<f8") for i in range(20)])
    got = format_header(dtype, (7, 9), False, align=align)
    assert len(got) % align == 0 and got.endswith(b" \n")
    h = parse_header(got)
    assert (h.dtype, h.shape, h.data_offset) == (dtype, (7, 9), len(got))


@pytest.mark.parametrize("align", [0, -64, 32, 100, 64.0, True, "64"])
def test_format_header_refuses_bad_align(align):
    with pytest.raises(ValueError, match="multiple of 64"):
        format_header(np.dtype("<f4"), (3,), False, align=align)


@settings(max_examples=30)
@given(dtype=dtypes(), shape=shapes(max_dims=5), fortran=st.booleans())
def test_format_header_matches_numpy_for_any_dtype(dtype, shape, fortran):
    got = format_header(dtype, shape, fortran)
    assert got == numpy_header(dtype, shape, fortran)
    h = parse_header(got)
    assert (h.dtype, h.shape, h.fortran_order) == (dtype, tuple(shape), fortran)


# --------------------------------------------------------------------------
# to_npy: round trips

RNG = np.random.default_rng(7)


def _filled(shape, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    return np.frombuffer(RNG.integers(0, 256, n, dtype=np.uint8).tobytes(), dtype).reshape(shape).copy()


DTYPES = [
    "?",
    "i1",
    "<u2",
    ">i4",
    "<i8",
    ">u8",
    "<f2",
    "<f4",
    ">f8",
    "g",
    "<c8",
    ">c16",
    "G",
    "<M8[ns]",
    ">m8[D]",
    "S5",
    "<U3",
    ">U2",
    "V3",
    [("a", "<f4"), ("b", ">i2", (2,)), ("c", [("d", "u1"), ("e", "S2")])],
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dtypes_round_trip(tmp_path, dtype):
    a = _filled((9, 7), dtype)
    p = tmp_path / "a.npy"
    to_npy(da.from_array(a, chunks=(4, 3)), p)
    assert_like_numpy(p, a)


@pytest.mark.parametrize(
    ("shape", "chunks"),
    [
        ((), ()),
        ((0,), (5,)),
        ((0, 3), (2, 2)),
        ((6, 0), (2, 1)),
        ((17,), (5,)),
        ((13, 11), (4, 3)),  # chunks never span whole rows
        ((13, 11), (13, 2)),  # column slabs: one run per row
        ((13, 11), (5, 11)),  # whole rows: one run per chunk
        ((6, 5, 4), (2, 5, 3)),
        ((4, 3, 5, 2), (3, 1, 2, 2)),
        ((3, 1, 1, 7), (1, 1, 1, 3)),
    ],
)
def test_shapes_and_chunkings(tmp_path, shape, chunks):
    a = _filled(shape, ">f8")
    x = da.from_array(a, chunks=chunks)
    to_npy(x, tmp_path / "a.npy")
    assert_like_numpy(tmp_path / "a.npy", a)


def test_fortran_ordered_input(tmp_path):
    a = np.asfortranarray(_filled((12, 10, 3), "<i4"))
    to_npy(da.from_array(a, chunks=(5, 4, 2)), tmp_path / "f.npy")
    assert_like_numpy(tmp_path / "f.npy", a)
    assert not npydask.read_header(tmp_path / "f.npy").fortran_order
    to_npy(a, tmp_path / "g.npy")  # a numpy array: one task
    assert_like_numpy(tmp_path / "g.npy", a)


def test_from_npy_fortran_big_endian_file(tmp_path, save):
    a = _filled((20, 9), ">c8")
    src = save(a, order="F")
    x = npydask.from_npy(src, chunks=(6, 4))
    to_npy(x, tmp_path / "out.npy")
    assert_like_numpy(tmp_path / "out.npy", a)


def test_numpy_scalars_and_lists(tmp_path):
    to_npy(np.float64(2.5), tmp_path / "s.npy")
    assert_like_numpy(tmp_path / "s.npy", np.array(2.5))
    to_npy([[1, 2], [3, 4]], tmp_path / "l.npy")
    assert_like_numpy(tmp_path / "l.npy", np.array([[1, 2], [3, 4]]))


def test_computed_chunks_in_another_dtype_are_cast(tmp_path):
    a = np.arange(20, dtype="<f4").reshape(4, 5)
    x = da.from_array(a, chunks=2).map_blocks(lambda b: b.astype("<f8"), dtype="<f4")
    to_npy(x, tmp_path / "c.npy")
    assert_like_numpy(tmp_path / "c.npy", a)


def test_wrong_chunk_shape_fails_naming_the_file(tmp_path):
    x = da.from_array(np.arange(10.0), chunks=5).map_blocks(lambda b: b[:2], dtype="f8")
    with pytest.raises(ValueError, match="bad.npy.*has shape"):
        to_npy(x, tmp_path / "bad.npy")
    assert npy_files(tmp_path) == []


@settings(max_examples=25)
@given(a=arrays(max_nbytes=2048, max_dims=4), seed=st.integers(0, 2**32 - 1), order=st.sampled_from("CF"))
def test_round_trip_hypothesis(tmp_path_factory, a, seed, order):
    # (chunks come from a seeded generator, not from draws that depend on the drawn shape: such
    # dependent draws once made hypothesis report a flaky strategy inside the whole suite)
    rng = np.random.default_rng(seed)
    chunks = tuple(int(rng.integers(1, max(n, 1) + 1)) for n in a.shape)
    a = np.asarray(a, order=order)
    p = tmp_path_factory.mktemp("h") / "a.npy"
    to_npy(da.from_array(a, chunks=chunks), p)
    assert_like_numpy(p, a)


# --------------------------------------------------------------------------
# align


def test_align_4096(tmp_path):
    a = _filled((33, 17), "<f4")
    p = tmp_path / "al.npy"
    to_npy(da.from_array(a, chunks=(8, 5)), p, align=4096)
    h = npydask.read_header(p)
    assert h.data_offset == 4096
    assert os.path.getsize(p) == 4096 + a.nbytes
    np.testing.assert_array_equal(np.load(p), a)
    np.testing.assert_array_equal(np.load(p, mmap_mode="r"), a)
    np.testing.assert_array_equal(npydask.from_npy(p, chunks=(10, 17)).compute(), a)


@pytest.mark.parametrize("align", [0, 32, 100, -4096, True])
def test_bad_align_is_refused_before_work(tmp_path, align):
    with pytest.raises(ValueError, match="multiple of 64"):
        to_npy(da.ones(3), tmp_path / "a.npy", align=align)
    with pytest.raises(ValueError, match="multiple of 64"):
        to_npy_files([np.ones(3)], tmp_path / "out", align=align)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------
# failures leave no complete file


class Boom(RuntimeError):
    pass


def _fail_on_block(bad: tuple[int, ...]):
    def f(block, block_info=None):
        if block_info[0]["chunk-location"] == bad:
            raise Boom("task failed on purpose")
        return block

    return f


def _check_leftovers(folder: Path, expected_npy: list[str]) -> None:
    assert [os.path.basename(p) for p in npy_files(folder)] == expected_npy
    for name in os.listdir(folder):
        if name not in expected_npy:
            assert name.startswith(".") and name.endswith(".npydask-tmp"), name
            path = folder / name
            with pytest.raises(ValueError, match="pickled"):
                np.load(path, allow_pickle=False)
            head = path.read_bytes()[:128]
            assert head == b"\0" * len(head)


@pytest.fixture(scope="module")
def client():
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(
            n_workers=2, processes=True, threads_per_worker=1, dashboard_address=":0", silence_logs=50
        ) as cluster,
        distributed.Client(cluster, set_as_default=False) as c,
    ):
        yield c


@contextlib.contextmanager
def _threads():
    # A failed compute returns while other chunk tasks still run (and may create the temporary
    # file): a pool of its own is waited for on exit, so the checks see the settled folder.
    pool = ThreadPoolExecutor(2)
    try:
        with dask.config.set(scheduler="threads", pool=pool):
            yield
    finally:
        pool.shutdown(wait=True)


@contextlib.contextmanager
def _on_cluster(client):
    try:
        with client.as_current():
            yield
    finally:  # as above: wait until the workers have no task left
        deadline = time.monotonic() + 30
        while any(client.processing().values()) and time.monotonic() < deadline:
            time.sleep(0.05)


@pytest.fixture(params=["threads", "distributed"])
def scheduler(request):
    """Run the test body on dask's threaded scheduler, or on the module's LocalCluster; wait for stragglers."""
    if request.param == "threads":
        return _threads
    client = request.getfixturevalue("client")
    return lambda: _on_cluster(client)


def test_failed_task_leaves_existing_target_untouched(tmp_path, scheduler):
    a = _filled((20, 12), "<i2")
    old = tmp_path / "a.npy"
    np.save(old, np.arange(5))
    before = old.read_bytes()
    x = da.from_array(a, chunks=(5, 5)).map_blocks(_fail_on_block((2, 1)), dtype=a.dtype)
    with scheduler(), pytest.raises(Boom):
        to_npy(x, old)
    assert old.read_bytes() == before
    _check_leftovers(tmp_path, ["a.npy"])


def test_failed_task_leaves_no_file_at_a_fresh_target(tmp_path, scheduler):
    a = _filled((20, 12), "<i2")
    x = da.from_array(a, chunks=(5, 5)).map_blocks(_fail_on_block((3, 2)), dtype=a.dtype)
    with scheduler(), pytest.raises(Boom):
        to_npy(x, tmp_path / "fresh.npy")
    assert not (tmp_path / "fresh.npy").exists()
    _check_leftovers(tmp_path, [])
    left = sorted(os.listdir(tmp_path))
    # a second call writes a temporary file of its own and publishes the whole array; the failed
    # call's temporary file stays (hidden, not loadable) until removed
    with scheduler():
        to_npy(da.from_array(a, chunks=(5, 5)), tmp_path / "fresh.npy")
    assert_like_numpy(tmp_path / "fresh.npy", a)
    assert sorted(os.listdir(tmp_path)) == sorted(left + ["fresh.npy"])
    _check_leftovers(tmp_path, ["fresh.npy"])


@pytest.mark.parametrize("chunks", [3, 2], ids=["one-task", "chunk-tasks"])
def test_failure_in_the_last_step_removes_the_temporary(tmp_path, chunks):
    value = to_npy_files([da.from_array(np.arange(3), chunks=chunks)], tmp_path, compute=False)
    os.mkdir(tmp_path / "00000.npy")  # a folder appears where the file goes: the rename fails
    with pytest.raises(IsADirectoryError):
        value.compute()
    assert os.listdir(tmp_path) == ["00000.npy"] and (tmp_path / "00000.npy").is_dir()


def test_other_files_of_a_failed_set_are_whole_or_absent(tmp_path):
    x = da.from_array(np.arange(6.0), chunks=6).map_blocks(_fail_on_block((0,)), dtype="f8", meta=np.empty(0))
    with dask.config.set(scheduler="sync"), pytest.raises(Boom):
        to_npy_files([np.arange(3), x, np.arange(4)], tmp_path)
    written = sorted(os.listdir(tmp_path))
    assert set(written) <= {"00000.npy", "00002.npy"}
    for name in written:
        np.testing.assert_array_equal(np.load(tmp_path / name), np.arange(3 if name == "00000.npy" else 4))


def test_temporary_file_is_hidden_and_target_absent_while_writing(tmp_path):
    seen: list[list[str]] = []
    target = tmp_path / "t.npy"

    def look(block):
        seen.append(sorted(os.listdir(tmp_path)))
        assert not target.exists()
        return block

    x = da.from_array(np.arange(40.0).reshape(8, 5), chunks=(2, 5)).map_blocks(look, dtype="f8")
    with dask.config.set(scheduler="sync"):
        to_npy(x, target)
    names = {n for listing in seen for n in listing}
    assert len(names) == 1, names
    (tmp,) = names
    assert tmp.startswith(".t.npy.") and tmp.endswith(".npydask-tmp") and not tmp.endswith(".npy")
    assert sorted(os.listdir(tmp_path)) == ["t.npy"]


def test_overwrite_false_refuses_at_call_time(tmp_path):
    calls: list[int] = []

    def spy(block):
        calls.append(1)
        return block

    p = tmp_path / "a.npy"
    np.save(p, np.zeros(2))
    before = p.read_bytes()
    x = da.ones(4, chunks=2).map_blocks(spy, dtype="f8", meta=np.empty(0))
    with pytest.raises(FileExistsError, match="a.npy"):
        to_npy(x, p, overwrite=False)
    with pytest.raises(FileExistsError, match="a.npy"):
        to_npy(x, p, overwrite=False, compute=False)
    with pytest.raises(FileExistsError, match="a.npy"):
        to_npy_files([x, x], tmp_path, names=["b", "a"], overwrite=False)
    assert calls == [] and p.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["a.npy"]
    to_npy(x, tmp_path / "new.npy", overwrite=False)
    np.testing.assert_array_equal(np.load(tmp_path / "new.npy"), np.ones(4))


def test_overwrite_false_does_not_replace_a_file_that_appears_meanwhile(tmp_path):
    p = tmp_path / "race.npy"
    value = to_npy(da.ones((4, 4), chunks=2), p, overwrite=False, compute=False)
    np.save(p, np.arange(3))
    before = p.read_bytes()
    with pytest.raises(FileExistsError, match="race.npy"):
        value.compute()
    assert p.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["race.npy"]


def test_overwrite_keeps_permissions(tmp_path):
    p = tmp_path / "perm.npy"
    np.save(p, np.zeros(3))
    os.chmod(p, 0o640)
    to_npy(da.ones(3, chunks=2), p)
    assert os.stat(p).st_mode & 0o777 == 0o640
    np.testing.assert_array_equal(np.load(p), np.ones(3))


# --------------------------------------------------------------------------
# errors at call time


def test_missing_folder_names_it(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match="nope"):
        to_npy(da.ones(3), missing / "a.npy")
    with pytest.raises(IsADirectoryError, match=str(tmp_path.name)):
        to_npy(da.ones(3), tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="file"):
        to_npy(da.ones(3), tmp_path / "file" / "a.npy")
    with pytest.raises(NotADirectoryError, match="file"):
        to_npy_files([np.ones(3)], tmp_path / "file")


@pytest.mark.parametrize("value", [np.array([1, "a", None], dtype=object), np.zeros(2, [("a", "f4"), ("o", "O")])])
def test_object_dtypes_are_refused(tmp_path, value):
    with pytest.raises(ValueError, match="pickl"):
        to_npy(value, tmp_path / "o.npy")
    with pytest.raises(ValueError, match="pickl"):
        to_npy(da.from_array(value, chunks=1), tmp_path / "o.npy")
    with pytest.raises(ValueError, match="pickl"):
        to_npy_files([np.ones(2), value], tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_unknown_chunk_sizes_are_refused(tmp_path):
    x = da.from_array(np.arange(10), chunks=5)
    x = x.map_blocks(lambda b: b[b > 4], chunks=((np.nan, np.nan),), dtype=int, meta=np.empty(0, int))
    with pytest.raises(ValueError, match="compute_chunk_sizes"):
        to_npy(x, tmp_path / "u.npy")


def test_path_types(tmp_path):
    with pytest.raises(TypeError, match="bytes"):
        to_npy(da.ones(2), os.fsencode(tmp_path / "b.npy"))
    to_npy(da.ones(2), str(tmp_path / "s.npy"))
    to_npy(da.ones(2), tmp_path / "noext")  # written as given, like a file object
    np.testing.assert_array_equal(np.load(tmp_path / "noext"), np.ones(2))


def test_cluster_writes_file_backed_and_persisted_arrays(tmp_path, save, client):
    a = _filled((30, 14), ">f4")
    x = npydask.from_npy(save(a, order="F"), chunks=(7, 5))  # read and written on the workers
    with client.as_current():
        to_npy(x, tmp_path / "from_file.npy")
        y = da.from_array(a, chunks=(8, 14)).persist()  # chunks already held by the workers
        to_npy(y, tmp_path / "persisted.npy", align=4096)
        to_npy_files([y, x[:3]], tmp_path / "set", ["p", "q/r"])
    assert_like_numpy(tmp_path / "from_file.npy", a)
    np.testing.assert_array_equal(np.load(tmp_path / "persisted.npy"), a)
    assert npydask.read_header(tmp_path / "persisted.npy").data_offset == 4096
    assert_like_numpy(tmp_path / "set" / "p.npy", a)
    assert_like_numpy(tmp_path / "set" / "q" / "r.npy", a[:3])


# --------------------------------------------------------------------------
# compute=False


def test_compute_false_is_lazy_and_composable(tmp_path, scheduler):
    a, b = _filled((10, 6), "<u4"), _filled((7,), ">f2")
    va = to_npy(da.from_array(a, chunks=(3, 4)), tmp_path / "a.npy", compute=False)
    vb = to_npy(b, tmp_path / "b.npy", compute=False)
    vc = to_npy_files([a, da.from_array(b, chunks=3)], tmp_path / "set", compute=False)
    assert all(isinstance(v, Delayed) for v in (va, vb, vc))
    assert os.listdir(tmp_path) == []
    with scheduler():
        assert dask.compute(va, vb, vc) == (None, None, None)
    assert_like_numpy(tmp_path / "a.npy", a)
    assert_like_numpy(tmp_path / "b.npy", b)
    assert_like_numpy(tmp_path / "set" / "00000.npy", a)
    assert_like_numpy(tmp_path / "set" / "00001.npy", b)
    assert to_npy(b, tmp_path / "b.npy") is None


def test_same_write_twice_in_one_compute_is_one_write(tmp_path):
    x = da.from_array(np.arange(12.0), chunks=5)
    v1 = to_npy(x, tmp_path / "a.npy", compute=False)
    v2 = to_npy(x, tmp_path / "a.npy", compute=False)
    assert v1.key == v2.key
    dask.compute(v1, v2)
    assert os.listdir(tmp_path) == ["a.npy"]


# --------------------------------------------------------------------------
# to_npy_files


def test_to_npy_files_names_and_subfolders(tmp_path, scheduler):
    arrays_ = [_filled((5, 3), "<i8"), _filled((40, 30), "<f4"), _filled((), "?"), _filled((2, 2), ">c8")]
    dask_arrays = [arrays_[0], da.from_array(arrays_[1], chunks=(7, 11)), arrays_[2], da.from_array(arrays_[3])]
    names = ["a", "sub/b.npy", "sub/deeper/c", Path("d.bin")]
    with scheduler():
        to_npy_files(dask_arrays, tmp_path / "out", names)
    expected = ["a.npy", "sub/b.npy", "sub/deeper/c.npy", "d.bin.npy"]
    for name, a in zip(expected, arrays_):
        assert_like_numpy(tmp_path / "out" / name, a)
    assert sorted(os.path.relpath(p, tmp_path / "out") for p in npy_files(tmp_path / "out")) == sorted(expected)
    assert not [n for _, _, files in os.walk(tmp_path) for n in files if n.endswith(".npydask-tmp")]


def test_to_npy_files_default_names(tmp_path):
    to_npy_files([np.full(2, i) for i in range(12)], tmp_path)
    assert sorted(os.listdir(tmp_path)) == [f"{i:05d}.npy" for i in range(12)]
    np.testing.assert_array_equal(np.load(tmp_path / "00011.npy"), [11, 11])
    assert to_npy_files([], tmp_path / "empty") is None
    assert not (tmp_path / "empty").exists()


@pytest.mark.parametrize(
    ("names", "match"),
    [
        (["../x"], "escapes"),
        (["a/../../x"], "escapes"),
        (["/abs/x"], "relative"),
        ([""], "names no file"),
        (["."], "names no file"),
        (["sub/"], "names no file"),
        (["sub/."], "names no file"),
        (["a/b/./."], "names no file"),
        (["./."], "names no file"),
        (["a", "a.npy"], "both write"),
        (["a/b", "./a/b.npy"], "both write"),
        (["a.npy", "a.npy/b"], "both a file and the folder"),
    ],
)
def test_to_npy_files_refuses_bad_names(tmp_path, names, match):
    with pytest.raises(ValueError, match=match):
        to_npy_files([np.zeros(2)] * len(names), tmp_path / "out", names)
    with pytest.raises(ValueError, match="2 arrays"):
        to_npy_files([np.zeros(2)] * 2, tmp_path / "out", ["a"])
    assert not (tmp_path / "out").exists()


def test_check_names_normalises():
    assert check_names(["x", "./y/z", "w.npy", "a//b"]) == [
        "x.npy",
        os.path.join("y", "z.npy"),
        "w.npy",
        os.path.join("a", "b.npy"),
    ]


def test_to_npy_files_refuses_a_single_array(tmp_path):
    with pytest.raises(TypeError, match="to_npy"):
        to_npy_files(np.zeros((3, 2)), tmp_path)
    with pytest.raises(TypeError, match="to_npy"):
        to_npy_files(da.zeros((3, 2)), tmp_path)


def test_to_npy_files_from_a_dataset_mirrors_its_files(tmp_path, scheduler):
    root = tmp_path / "in"
    (root / "s1").mkdir(parents=True)
    (root / "s2").mkdir()
    data = {"top.npy": _filled((4, 3), ">i4"), "s1/a.npy": _filled((6, 3), ">i4"), "s2/b.npy": _filled((2, 3), ">i4")}
    for name, a in data.items():
        np.save(root / name, a)
    ds = npydask.open_dataset(root)
    assert len(ds) == 3
    out = tmp_path / "out"
    with scheduler():
        to_npy_files(ds, out)
    for name, a in data.items():
        assert_like_numpy(out / name, a)
    assert sorted(os.path.relpath(p, out) for p in npy_files(out)) == sorted(data)
    # and back over the very files it reads: every file is read before it is replaced
    with scheduler():
        to_npy_files(ds, root)
    for name, a in data.items():
        assert_like_numpy(root / name, a)


def test_many_small_arrays_make_one_task_each(tmp_path):
    n = 2000
    value = to_npy_files([np.full((4, 4), i, "<f4") for i in range(n)], tmp_path / "g", compute=False)
    assert _tasks_in(value) == n + 1  # one per file, one to join them
    small = [np.full((3,), i, "<i2") for i in range(200)]
    counter = CountTasks()
    with counter:
        to_npy_files(small, tmp_path / "run")
    assert counter.n <= len(small) + 5
    for i in (0, 199):
        np.testing.assert_array_equal(np.load(tmp_path / "run" / f"{i:05d}.npy"), small[i])


def test_single_chunk_dask_arrays_add_one_task_each(tmp_path, save):
    paths = [save(np.full((2, 3), i, "<f8")) for i in range(30)]
    xs = [npydask.from_npy(p) for p in paths]
    reads = sum(_tasks_in(x) for x in xs)
    assert reads == len(xs)
    value = to_npy_files(xs, tmp_path / "o", compute=False)
    assert _tasks_in(value) == reads + len(xs) + 1
    value.compute()
    np.testing.assert_array_equal(np.load(tmp_path / "o" / "00029.npy"), np.full((2, 3), 29.0))


# --------------------------------------------------------------------------
# the benchmark script stays runnable


@pytest.mark.timeout(240)
def test_bench_write_runs_at_tiny_size(tmp_path):
    done = subprocess.run(
        [sys.executable, str(BENCH), "--size", "tiny", "--repeat", "1", "--json", str(tmp_path / "out.json")],
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "np.save" in done.stdout and (tmp_path / "out.json").exists()


def _die_on_block_one(block, block_info=None):
    """Kill the worker process that runs block 1 (as an OOM killer or a lost node would)."""
    if block_info is not None and block_info[0]["chunk-location"][0] == 1:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    return block


@pytest.mark.timeout(180)
def test_a_write_whose_worker_dies_leaves_the_target_untouched(tmp_path):
    """to_npy on a cluster where the worker writing one chunk is killed, every time it is retried."""
    distributed = pytest.importorskip("distributed")
    target = tmp_path / "out.npy"
    np.save(target, np.arange(5))
    before = target.read_bytes()
    x = da.from_array(np.arange(4000, dtype="<f8").reshape(40, 100), chunks=(10, 100))
    x = x.map_blocks(_die_on_block_one, dtype=x.dtype, meta=np.empty((0, 0), x.dtype))
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}):
        with (
            distributed.LocalCluster(
                n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
            ) as cluster,
            distributed.Client(cluster) as c,
        ):
            with pytest.raises(distributed.KilledWorker):
                c.compute(npydask.to_npy(x, target, compute=False), sync=True)
    assert target.read_bytes() == before  # the old file, byte for byte
    np.testing.assert_array_equal(np.load(target), np.arange(5))
    assert sorted(p.name for p in tmp_path.glob("*.npy")) == ["out.npy"]  # no stray file *.npy would pick up
    for leftover in tmp_path.glob(".*npydask-tmp"):
        with pytest.raises(ValueError, match="pickled"):  # a leftover temporary file is not an array either
            np.load(leftover)


# --------------------------------------------------------------------------
# concurrent writers of one target: each publishes a whole, correct file or fails

_CHILD_WRITER = """
import json, sys
import dask, dask.array as da, numpy as np
from npydask.write.npy import to_npy
for line in sys.stdin:
    job = json.loads(line)
    a = np.load(job["src"])
    x = a if job["chunks"] is None else da.from_array(a, chunks=tuple(job["chunks"]))
    try:
        with dask.config.set(scheduler="threads"):
            to_npy(x, job["target"])
    except Exception as e:
        print("error", type(e).__name__, str(e).replace(chr(10), " "), flush=True)
    else:
        print("ok", flush=True)
"""


@contextlib.contextmanager
def _child_writers(n: int):
    """``n`` long-lived processes that each run ``to_npy`` jobs read as JSON lines on stdin."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(Path(npydask.__file__).parent.parent), os.environ.get("PYTHONPATH", "")]),
    )
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD_WRITER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        for _ in range(n)
    ]
    try:
        yield children
    finally:
        for c in children:
            c.stdin.close()
        for c in children:
            c.wait(timeout=60)


def _saved(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def _watch(path: Path, allowed: set[bytes], stop, seen: list[str]) -> None:
    """Load ``path`` until ``stop`` is set; record anything that is not one of ``allowed`` whole files."""
    while not stop.is_set():
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        if data not in allowed:
            seen.append(f"{len(data)} bytes, head {data[:16]!r}, zero bytes {data.count(0)}")


def _race(writers, path: Path, allowed: set[bytes]) -> tuple[list[BaseException | None], list[str]]:
    """Run the ``writers`` (callables) at once in threads while a watcher reads ``path``."""
    import threading

    stop, seen = threading.Event(), []
    watcher = threading.Thread(target=_watch, args=(path, allowed, stop, seen))
    barrier = threading.Barrier(len(writers))

    def run(w):
        barrier.wait()
        try:
            w()
        except Exception as e:  # each writer may fail with an error, never publish a wrong file
            return e
        return None

    watcher.start()
    try:
        with ThreadPoolExecutor(len(writers)) as pool:
            errors = list(pool.map(run, writers))
    finally:
        stop.set()
        watcher.join()
    return errors, seen


RACE_ITERATIONS = 30


@pytest.mark.timeout(600)
def test_concurrent_writers_of_one_target_publish_one_whole_source(tmp_path):
    """Threads and processes write one target at once, from numpy and dask arrays in several chunkings.

    Most of them write the very same array (so before each call had its own temporary file they
    shared one, and one could publish a file of zeros); one writes other values. After each round
    the target is one of the sources exactly, every writer succeeded, and a reader never saw
    anything else. On the old code the first round caught the bug in 10 runs of 10.
    """
    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 2048))
    b = rng.standard_normal((64, 2048)).astype("<f4")
    src = tmp_path / "src"
    src.mkdir()
    np.save(src / "a.npy", a)
    p = tmp_path / "t.npy"
    old = np.arange(7)
    allowed = {_saved(a), _saved(b), _saved(old)}
    x = da.from_array(a, chunks=(4, 2048))

    def in_child(child, chunks):
        def w():
            child.stdin.write(json.dumps({"src": str(src / "a.npy"), "chunks": chunks, "target": str(p)}) + "\n")
            child.stdin.flush()
            answer = child.stdout.readline()
            if not answer.startswith("ok"):
                raise RuntimeError(f"child: {answer}")

        return w

    def here(value, **kw):
        return lambda: to_npy(value, p, **kw)

    with _child_writers(2) as children:
        for i in range(2 * RACE_ITERATIONS):
            np.save(p, old)
            writers = [
                here(x),
                here(x),
                here(a),
                here(a),  # the same array twice, as dask and as numpy
                here(da.from_array(a, chunks=(16, 512))),
                here(da.from_array(b, chunks=(8, -1))),
                in_child(children[0], [4, 2048]),  # the same chunks (and dask name) as x
                in_child(children[1], None),  # numpy, as here(a)
            ]
            errors, seen = _race(writers, p, allowed)
            assert seen == [], f"round {i}: a reader saw {seen[:3]}"
            assert errors == [None] * len(writers), f"round {i}: {errors}"
            assert p.read_bytes() in (_saved(a), _saved(b)), f"round {i}"
            assert sorted(os.listdir(tmp_path)) == ["src", "t.npy"], f"round {i}"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("chunks", [(4, 2048), (64, 2048), (3, 500)], ids=["slabs", "one-task", "ragged"])
def test_one_lazy_write_computed_twice_at_once(tmp_path, chunks):
    """One ``compute=False`` value computed by three threads at once: each publishes ``a`` or fails cleanly.

    Its computations share one temporary file (retried tasks must find it); the last step publishes
    only a file that every chunk task of its computation wrote, of the full size. On the old code
    a round within the first 7 (of 30) published a file of zeros or failed with a bare
    FileNotFoundError, in 10 runs of each chunking.
    """
    rng = np.random.default_rng(2)
    a = rng.standard_normal((64, 2048))
    p = tmp_path / "t.npy"
    old = np.arange(5)
    for i in range(RACE_ITERATIONS):
        np.save(p, old)
        value = to_npy(da.from_array(a, chunks=chunks), p, compute=False)
        errors, seen = _race([lambda value=value: value.compute(scheduler="threads")] * 3, p, {_saved(a), _saved(old)})
        assert seen == [], f"round {i}: a reader saw {seen[:3]}"
        assert None in errors, f"round {i}: every computation failed: {errors}"
        for e in errors:  # a failure is an error that names the target and says why
            assert e is None or (isinstance(e, FileChangedError) and e.filename == str(p)), repr(e)
        assert p.read_bytes() == _saved(a), f"round {i}"
        _check_leftovers(tmp_path, ["t.npy"])
        for name in os.listdir(tmp_path):
            if name != "t.npy":
                os.unlink(tmp_path / name)


class _Tamper(Callback):
    """Runs ``act`` once, just before the task whose key (a string, not a chunk's tuple) starts with ``prefix``."""

    def __init__(self, prefix: str, act) -> None:
        super().__init__()
        self.prefix, self.act, self.done = prefix, act, False

    def _pretask(self, key, dsk, state) -> None:
        if not self.done and isinstance(key, str) and key.startswith(self.prefix):
            self.done = True
            self.act()


def _replace_with_zeros(tmp: Path) -> None:
    size = tmp.stat().st_size
    tmp.unlink()
    tmp.write_bytes(b"\0" * size)  # another file of the same size, under the same name


def _truncate(tmp: Path) -> None:
    os.truncate(tmp, tmp.stat().st_size // 2)


def _extend(tmp: Path) -> None:
    os.truncate(tmp, tmp.stat().st_size + 64)


def _remove(tmp: Path) -> None:
    tmp.unlink()


@pytest.mark.parametrize("act", [_replace_with_zeros, _truncate, _extend, _remove])
@pytest.mark.parametrize("shape", [(40, 30), (1000,), (6, 5, 4)])
def test_last_step_publishes_only_the_file_its_chunks_wrote(tmp_path, act, shape):
    a = _filled(shape, "<f8")
    p = tmp_path / "t.npy"
    np.save(p, np.arange(3))
    before = p.read_bytes()
    value = to_npy(da.from_array(a, chunks=tuple(max(1, n // 3) for n in shape)), p, compute=False)

    def tamper():
        (tmp,) = [tmp_path / n for n in os.listdir(tmp_path) if n.endswith(".npydask-tmp")]
        act(tmp)

    with _Tamper("npy-write-", tamper) as t, dask.config.set(scheduler="sync"):
        assert not t.done
        with pytest.raises(FileChangedError, match="not publishing") as info:
            value.compute()
        assert info.value.filename == str(p)
    assert t.done
    assert p.read_bytes() == before
    _check_leftovers(tmp_path, ["t.npy"])


def test_each_call_writes_its_own_temporary_file(tmp_path):
    x = da.from_array(np.arange(40.0).reshape(8, 5), chunks=(2, 5))
    seen: set[str] = set()

    def look(block):
        seen.update(n for n in os.listdir(tmp_path) if n.endswith(".npydask-tmp"))
        return block

    y = x.map_blocks(look, dtype=x.dtype)
    values = [to_npy(y, tmp_path / "t.npy", compute=False) for _ in range(2)]
    with dask.config.set(scheduler="sync"):
        for v in values:
            v.compute()
        to_npy(y, tmp_path / "t.npy")
    assert len(seen) == 3, seen
    assert sorted(os.listdir(tmp_path)) == ["t.npy"]


# --------------------------------------------------------------------------
# long file names: temporary names are cut by bytes, a too-long target is named


def _name_of_bytes(char: str, nbytes: int) -> str:
    """A file name of exactly ``nbytes`` UTF-8 bytes ending in ``.npy``: ``char`` repeated, then ASCII."""
    k = (nbytes - 4) // len(char.encode())
    name = char * k
    return name + "a" * (nbytes - 4 - len(name.encode())) + ".npy"


NAME_CHARS = ["a", "\u00e9", "\u65e5\u672c", "\U0001f600", "\u00e9\u65e5\U0001f600"]


@pytest.mark.parametrize("char", NAME_CHARS, ids=["ascii", "e-acute", "kanji", "emoji", "mixed"])
@pytest.mark.parametrize("nbytes", [120, 200, 217, 231, 244, 251, 255])
def test_long_non_ascii_names_are_written(tmp_path, char, nbytes):
    name = _name_of_bytes(char, nbytes)
    assert len(name.encode()) == nbytes
    a = _filled((30, 7), "<i4")
    np.save(tmp_path / name, a)  # numpy writes it: so must npydask
    (tmp_path / name).unlink()
    to_npy(da.from_array(a, chunks=(7, 3)), tmp_path / name)
    assert_like_numpy(tmp_path / name, a)
    to_npy(a, tmp_path / name)  # one task
    assert_like_numpy(tmp_path / name, a)
    to_npy_files([a, da.from_array(a, chunks=(10, 7))], tmp_path / "set", names=[name[:-4], "sub/" + name])
    assert_like_numpy(tmp_path / "set" / name, a)
    assert_like_numpy(tmp_path / "set" / "sub" / name, a)
    assert sorted(os.listdir(tmp_path)) == sorted([name, "set"])
    assert sorted(os.listdir(tmp_path / "set")) == sorted([name, "sub"])


@pytest.mark.parametrize("char", NAME_CHARS, ids=["ascii", "e-acute", "kanji", "emoji", "mixed"])
@pytest.mark.parametrize("nbytes", [1, 150, 216, 217, 218, 219, 220, 244, 255])
def test_temporary_names_are_cut_by_bytes_on_a_character_boundary(char, nbytes):
    from npydask.write.npy import plan_target

    name = "b" if nbytes == 1 else _name_of_bytes(char, nbytes)
    t = plan_target(os.path.join(os.sep, "data", name), np.dtype("<f4"), (3,), "0123456789abcdef")
    tmp = os.fsencode(os.path.basename(t.tmp))
    assert len(tmp) + len(".12345678") <= 255  # room for the last step's own name
    stem = tmp.decode("utf-8")[1:].rsplit(".0123456789abcdef.npydask-tmp", 1)[0]  # strict: no split character
    assert name.startswith(stem) and len(stem.encode()) >= min(nbytes, 216 - 3)  # cut at most 3 bytes early


@pytest.mark.parametrize("char", NAME_CHARS, ids=["ascii", "e-acute", "kanji", "emoji", "mixed"])
@pytest.mark.parametrize("nbytes", [256, 257, 300, 1000])
def test_too_long_target_names_name_the_target(tmp_path, char, nbytes):
    name = _name_of_bytes(char, nbytes)
    with pytest.raises(OSError, match="File name too long"):  # numpy cannot write it either
        np.save(tmp_path / name, np.zeros(2))
    for value in (np.zeros(3), da.zeros(10, chunks=3)):
        with pytest.raises(OSError, match="File name too long") as info:
            to_npy(value, tmp_path / name)
        assert info.value.errno == errno.ENAMETOOLONG and info.value.filename == str(tmp_path / name)
        assert "npydask-tmp" not in str(info.value)
        with pytest.raises(OSError, match="File name too long") as info:
            to_npy_files([value], tmp_path / "set", names=["sub/" + name])
        assert info.value.errno == errno.ENAMETOOLONG and info.value.filename == str(tmp_path / "set" / "sub" / name)
    assert os.listdir(tmp_path) == []


# --------------------------------------------------------------------------
# align stays within what numpy.load reads by default (max_header_size)


def _fields_dtype(n: int) -> np.dtype:
    return np.dtype([(f"field_with_a_long_name_{i:04d}", "<f4") for i in range(n)])


@pytest.mark.timeout(600)
@pytest.mark.parametrize("nfields", [0, 40, 150, 200, 230], ids=lambda n: f"{n}-fields")
def test_every_accepted_align_gives_a_file_numpy_loads_by_default(tmp_path, nfields):
    a = _filled((3, 2), _fields_dtype(nfields) if nfields else "<f4")
    assert len(format_header(a.dtype, a.shape, False)) <= 10_000  # numpy.load reads np.save's file
    accepted = []
    for align in range(64, 20_480 + 64, 64):
        p = tmp_path / "a.npy"
        x = a if align % 128 else da.from_array(a, chunks=1)  # one task and chunk tasks
        try:
            to_npy(x, p, align=align)
        except ValueError as e:
            refusal: str | None = str(e)
        else:
            refusal = None
        if refusal is not None:
            assert "max_header_size" in refusal and "align" in refusal, refusal
            assert not p.exists()
            with pytest.raises(ValueError, match="max_header_size"):
                to_npy_files([a], tmp_path / "set", align=align)
            continue
        accepted.append(align)
        assert_same_array(np.load(p), a)  # numpy.load with its defaults
        h = npydask.read_header(p)
        assert h.data_offset % align == 0
        os.unlink(p)
    assert 64 in accepted and max(accepted) <= 9984
    if nfields == 0:  # every multiple of 64 up to the cap
        assert accepted == list(range(64, 9984 + 64, 64))
    assert not (tmp_path / "set").exists() and os.listdir(tmp_path) == []


# --------------------------------------------------------------------------
# to_npy_files never writes outside its output folder


@pytest.mark.parametrize("chunks", [None, 2], ids=["one-task", "chunk-tasks"])
@pytest.mark.parametrize("name", ["link/a", "link/deeper/b", "sub/link/c"])
def test_a_symlink_inside_the_output_folder_cannot_lead_out(tmp_path, name, chunks):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    (out / "sub").mkdir(parents=True)
    elsewhere.mkdir()
    os.symlink(elsewhere, out / "link")
    os.symlink(elsewhere, out / "sub" / "link")
    a = np.arange(5.0)
    x = a if chunks is None else da.from_array(a, chunks=chunks)
    with pytest.raises(OSError, match="outside the output folder") as info:
        to_npy_files([np.zeros(2), x], out, names=["fine", name])
    assert "elsewhere" in str(info.value) and "link" in info.value.filename
    assert list(elsewhere.rglob("*")) == []
    assert npy_files(out) == []
    # a link made after the graph was built is refused where the task opens the file
    value = to_npy_files([x], out, names=["later/d"], compute=False)
    os.symlink(elsewhere, out / "later")
    with pytest.raises(OSError, match="outside the output folder"):
        value.compute()
    assert list(elsewhere.rglob("*")) == []


def test_symlinks_that_stay_inside_the_output_folder_are_followed(tmp_path):
    out = tmp_path / "out"
    (out / "real").mkdir(parents=True)
    os.symlink(out / "real", out / "alias")
    os.symlink(tmp_path / "out", tmp_path / "root-link")  # the output folder itself may be a link
    to_npy_files([np.arange(3), da.arange(6, chunks=2)], tmp_path / "root-link", names=["alias/a", "alias/b"])
    np.testing.assert_array_equal(np.load(out / "real" / "a.npy"), np.arange(3))
    np.testing.assert_array_equal(np.load(out / "real" / "b.npy"), np.arange(6))


# --------------------------------------------------------------------------
# structured padding: written and read byte for byte as the source holds it (never heap bytes)

PADDED_DTYPES = [
    np.dtype({"names": ["a", "b"], "formats": ["u1", "<i4"], "offsets": [0, 4], "itemsize": 12}),
    np.dtype([("a", "u1"), ("b", "<f8"), ("c", ">i2")], align=True),
    np.dtype([("x", np.dtype([("p", "u1"), ("q", "<f4")], align=True), (2,)), ("y", "u1"), ("z", "<i8")], align=True),
    np.dtype({"names": ["x", "y"], "formats": ["u1", "<f8"], "offsets": [0, 8], "itemsize": 24}),
]


def _raw_filled(shape, dtype, order="C") -> np.ndarray:
    """An array whose every byte (padding included) is random: numpy's copies would lose the padding."""
    dtype = np.dtype(dtype)
    c_shape = shape if order == "C" else shape[::-1]
    n = int(np.prod(c_shape)) * dtype.itemsize
    a = np.frombuffer(bytearray(RNG.integers(1, 256, n, dtype=np.uint8).tobytes()), dtype).reshape(c_shape)
    return a if order == "C" else a.T


def _raw_c(a: np.ndarray) -> np.ndarray:
    """``a`` in C order with every byte, through a same-size void view."""
    return np.asarray(a.view(np.dtype((np.void, a.dtype.itemsize))), order="C").view(a.dtype)


def _np_saved_file(a: np.ndarray, path: Path) -> bytes:
    np.save(path, a)  # to a real file: numpy writes the raw bytes (tofile)
    data = path.read_bytes()
    path.unlink()
    return data


def _views_of(src: np.ndarray, chunks) -> da.Array:
    """A dask array whose chunks are views of ``src`` (``from_array`` would copy it, losing the padding)."""

    def block(block_info=None):
        (lo, hi), (lo2, hi2) = block_info[None]["array-location"]
        return src[lo:hi, lo2:hi2]

    return da.map_blocks(
        block, chunks=da.core.normalize_chunks(chunks, src.shape), dtype=src.dtype, meta=np.empty((0, 0), src.dtype)
    )


PADDED_IDS = lambda d: f"itemsize{d.itemsize}-{len(d.names)}f"  # noqa: E731


@pytest.mark.parametrize("dtype", PADDED_DTYPES, ids=PADDED_IDS)
@pytest.mark.parametrize("order", ["C", "F", "strided"])
@pytest.mark.parametrize("source", ["numpy", "numpy-chunked", "views", "from_npy"])
@pytest.mark.parametrize("chunks", [(20, 7), (7, 3), (1, 13)], ids=["slabs", "blocks", "rows"])
def test_structured_padding_is_written_as_numpy_saves_it(tmp_path, dtype, order, source, chunks):
    if order == "strided":
        src = _raw_filled((40, 26), dtype)[::2, ::2]
    else:
        src = _raw_filled((20, 13), dtype, order)
    expected = _np_saved_file(_raw_c(src), tmp_path / "expected.npy")
    limit = "1MiB"
    if source == "numpy":
        x = src
    elif source == "numpy-chunked":  # larger than array.chunk-size: chunk tasks over views of it
        x, limit = src, f"{chunks[0] * chunks[1] * dtype.itemsize}B"
    elif source == "views":
        x = _views_of(src, chunks)
    else:
        np.save(tmp_path / "src.npy", src)
        x = npydask.from_npy(tmp_path / "src.npy", chunks=chunks, backend="pread" if order == "F" else "auto")
    with dask.config.set({"array.chunk-size": limit}):
        to_npy(x, tmp_path / "a.npy")
        to_npy_files([x], tmp_path / "set")
    assert (tmp_path / "a.npy").read_bytes() == expected
    assert (tmp_path / "set" / "00000.npy").read_bytes() == expected
    zeros = np.zeros(src.shape, dtype)  # zero padding stays zero
    with dask.config.set({"array.chunk-size": limit}):
        to_npy(zeros if source != "views" else _views_of(zeros, chunks), tmp_path / "z.npy")
    assert (tmp_path / "z.npy").read_bytes() == _np_saved_file(zeros, tmp_path / "expected.npy")


def test_a_structured_cast_in_a_chunk_leaves_zero_padding(tmp_path):
    wide = np.dtype([("a", "u1"), ("b", "<f8")], align=True)
    narrow = np.dtype([("a", "u1"), ("b", "<f4")])
    src = np.zeros((12, 5), narrow)
    src["a"], src["b"] = 7, 2.5
    x = da.from_array(src, chunks=(5, 2)).map_blocks(lambda b: b, dtype=wide)  # chunks come in another dtype
    to_npy(x, tmp_path / "c.npy")
    expected = np.zeros(src.shape, wide)
    expected["a"], expected["b"] = 7, 2.5
    assert (tmp_path / "c.npy").read_bytes() == _np_saved_file(expected, tmp_path / "e.npy")


def _void(a: np.ndarray) -> bytes:
    return _raw_c(a).tobytes()


@pytest.mark.parametrize("dtype", PADDED_DTYPES, ids=PADDED_IDS)
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("backend", ["pread", "mmap", "auto"])
def test_structured_padding_is_read_as_the_file_holds_it(tmp_path, dtype, order, backend):
    """Every chunk npydask returns (and every read_region) holds the file's bytes, padding included.

    (``compute()`` then assembles the chunks with numpy copies, which move structured values field
    by field: the padding of that assembled array is numpy's, see the README.)
    """
    src = _raw_filled((23, 17), dtype, order)
    p = tmp_path / "s.npy"
    np.save(p, src)
    loaded = np.load(p)
    for chunks in [(23, 17), (5, 17), (23, 4), (6, 5)]:
        x = npydask.from_npy(p, chunks=chunks, backend=backend)
        # each chunk as its task returns it (the graph run as it is, under either array engine)
        blocks = get_sync(dict(x.__dask_graph__()), list(flatten(x.__dask_keys__())))
        for (i, j), block in zip(np.ndindex(*x.numblocks), blocks):
            r0, c0 = sum(x.chunks[0][:i]), sum(x.chunks[1][:j])
            want = loaded[r0 : r0 + x.chunks[0][i], c0 : c0 + x.chunks[1][j]]
            assert _void(block) == _void(want), (chunks, i, j)
    for start, stop in [((0, 0), (23, 17)), ((3, 2), (20, 11)), ((5, 0), (6, 17)), ((0, 4), (23, 5))]:
        got = npydask.read_region(p, start, stop, backend=backend)
        assert _void(got) == _void(loaded[start[0] : stop[0], start[1] : stop[1]]), (start, stop)


def test_a_chunk_task_never_writes_into_an_unstamped_temporary_file(tmp_path, monkeypatch):
    from npydask.plan.region import Box
    from npydask.write import _tasks as _write
    from npydask.write.npy import plan_target

    a = _filled((6, 4), "<f8")
    t = plan_target(str(tmp_path / "t.npy"), a.dtype, a.shape, "0123456789abcdef")
    box = Box((0, 0), (3, 4))
    # empty: its creator died before stamping it (a live creator stamps it at once)
    Path(t.tmp).touch()
    monkeypatch.setattr(_write, "STAMP_WAIT", 0.2)
    with pytest.raises(FileChangedError, match="still empty") as info:
        _write.write_chunk(a[:3], t.chunk, box)
    assert info.value.filename == t.path
    # full size without a stamp: a last step took it and cut the stamp off
    os.truncate(t.tmp, t.size)
    with pytest.raises(FileChangedError, match="taken by the last step"):
        _write.write_chunk(a[:3], t.chunk, box)
    assert Path(t.tmp).read_bytes() == bytes(t.size)  # nothing written into it
    os.unlink(t.tmp)
    written = _write.write_chunk(a[:3], t.chunk, box)  # a fresh file: created, stamped, written
    assert written.nbytes == a[:3].nbytes and written.stamp != bytes(16)
    assert os.path.getsize(t.tmp) == t.size + 16
