"""npydask.from_npy_stack: dask's to_npy_stack folders, equal to dask's own reader, info never unpickled.

The oracle is ``dask.array.from_npy_stack`` (which unpickles ``info``) on
folders that ``dask.array.to_npy_stack`` wrote, and numpy on the same data.
dask's reader calls ``numpy.load`` in its tasks, whose header parser is
``ast.literal_eval``: on threads, Python 3.11's ``ast`` can fail ("AST constructor
recursion depth mismatch"), so the oracle is computed on the synchronous scheduler.
Tampered ``info`` files carry a real payload (``os.system`` writing a marker
file through ``__reduce__``); each test shows dask's reader runs it and
npydask's does not.
"""

from __future__ import annotations

import os
import pickle
import re
import shlex
import shutil
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import pytest

import npydask
from npydask.dataset.npy_stack import StackInfo, parse_info, stack_files
from npydask.errors import NpyDaskWarning, NpyFormatError

STRUCTURED = np.dtype([("axis", "<i4"), ("v", ">f8", (2,))])  # (a field named like info's key)


def _values(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    dtype = np.dtype(dtype)
    n = int(np.prod(shape))
    if dtype == STRUCTURED:
        out = np.zeros(n, dtype)
        out["axis"] = np.arange(n)
        out["v"] = np.arange(2 * n).reshape(n, 2) / 4
        return out.reshape(shape)
    if dtype.kind == "M":
        return (np.arange(n) * 86_400).astype("M8[s]").astype(dtype).reshape(shape)
    if dtype.kind == "b":
        return (np.arange(n) % 3 == 0).reshape(shape)
    if dtype.kind == "c":
        return (np.arange(n) + 1j * np.arange(n)[::-1]).astype(dtype).reshape(shape)
    return (np.arange(n) % 251).astype(dtype).reshape(shape)


def _write(folder: Path, array: np.ndarray, chunks: Any, axis: int) -> da.Array:
    x = da.from_array(array, chunks=chunks)
    da.to_npy_stack(str(folder), x, axis=axis)
    return x


def _check_equal(got: da.Array, folder: Path, array: np.ndarray) -> None:
    want = da.from_npy_stack(str(folder))
    assert got.shape == want.shape == array.shape
    assert got.chunks == want.chunks
    computed, theirs = got.compute(), want.compute(scheduler="synchronous")
    assert got.dtype == computed.dtype
    # npydask joins files in native byte order (NpyDataset.concatenate), dask keeps the files' order
    assert computed.dtype == theirs.dtype or computed.dtype == theirs.dtype.newbyteorder("=")
    assert computed.dtype.isnative and all(computed.dtype[f].isnative for f in computed.dtype.names or ())
    np.testing.assert_array_equal(computed, theirs)
    np.testing.assert_array_equal(computed, array)


def _evil(marker: Path) -> bytes:
    """An info pickle that runs ``touch marker`` when unpickled (as dask's from_npy_stack would)."""

    class Payload:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, (f"touch {shlex.quote(str(marker))}",))

    return pickle.dumps({"chunks": ((2, 2, 1), (3,)), "dtype": np.dtype("f8"), "axis": Payload()})


# -- equal to dask's own reader ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "chunks", "axis"),
    [
        ((23, 5), (2, 5), 0),  # 12 files: 10.npy must come after 9.npy
        ((4, 30), (4, 3), 1),  # 10 files along axis 1
        ((6, 7, 25), (6, 7, (1, 3, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1)), 2),  # 13 uneven files, last axis
        ((9, 4, 3), (4, 2, 3), 0),  # chunked on other axes too: to_npy_stack joins them
        ((5,), (5,), 0),  # one file
        ((130,), (10,), 0),  # 13 equal files and an exact last one
    ],
)
@pytest.mark.parametrize("dtype", ["<f4", ">i2", "u1", "<c16", "?", "<M8[ns]", STRUCTURED])
def test_equal_to_dask_from_npy_stack(tmp_path, shape, chunks, axis, dtype):
    array = _values(shape, dtype)
    folder = tmp_path / "stack"
    _write(folder, array, chunks, axis)
    got = npydask.from_npy_stack(folder)
    _check_equal(got, folder, array)
    assert got.numblocks[axis] == len(os.listdir(folder)) - 1  # one chunk per file along the axis, as dask's
    assert npydask.from_npy_stack(str(folder)).name == got.name  # deterministic


def test_ten_and_more_files_are_read_in_numeric_order(tmp_path):
    array = np.repeat(np.arange(25, dtype="<i8"), 3).reshape(25, 3)
    _write(tmp_path / "s", array, (1, 3), 0)
    got = npydask.from_npy_stack(tmp_path / "s")
    np.testing.assert_array_equal(got.compute()[:, 0], np.arange(25))  # 10.npy after 9.npy, not after 1.npy
    np.testing.assert_array_equal(got.blocks[10].compute(), array[10:11])


def test_negative_and_explicit_axis_agree_with_info(tmp_path):
    array = _values((4, 9, 5), "<f8")
    _write(tmp_path / "s", array, (4, 2, 5), 1)
    for axis in (1, -2, None, np.int64(1)):
        _check_equal(npydask.from_npy_stack(tmp_path / "s", axis=axis), tmp_path / "s", array)


# -- info: read as data, never run ---------------------------------------------------------------


def test_tampered_info_is_ignored_without_running_it(tmp_path):
    array = _values((5, 3), "<f8")
    folder = tmp_path / "stack"
    _write(folder, array, (2, 3), 0)
    marker = tmp_path / "pwned"
    (folder / "info").write_bytes(_evil(marker))
    with pytest.warns(
        NpyDaskWarning, match=r"info is not the info file .*posix\.system|info is not the info file .*nt\.system"
    ):
        got = npydask.from_npy_stack(folder)
    assert not marker.exists()
    np.testing.assert_array_equal(got.compute(), array)  # the axis came from the shapes (5 rows: 2, 2, 1)
    assert not marker.exists()
    # the payload is live: dask's own reader runs it (os.system returns 0, which becomes info's axis)
    np.testing.assert_array_equal(da.from_npy_stack(str(folder)).compute(scheduler="synchronous"), array)
    assert marker.exists()


@pytest.mark.parametrize(
    "payload",
    [
        lambda cmd: {"chunks": ((2, 2, 1), (3,)), "dtype": _Reduce(os.system, (cmd,)), "axis": 0},
        lambda cmd: {
            "chunks": ((2, 2, 1), (3,)),
            "axis": 0,
            "x": _Reduce(eval, (f"__import__('os').system({cmd!r})",)),
        },
        lambda cmd: _Reduce(os.system, (cmd,)),
        lambda cmd: [{"axis": 0}, _Reduce(os.system, (cmd,))],
    ],
)
@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_info_naming_any_other_callable_is_refused_unrun(tmp_path, payload, protocol):
    array = _values((7, 2), "<i4")
    _write(tmp_path / "s", array, (3, 2), 0)
    marker = tmp_path / "ran"
    (tmp_path / "s" / "info").write_bytes(pickle.dumps(payload(f"touch {shlex.quote(str(marker))}"), protocol=protocol))
    with pytest.warns(NpyDaskWarning, match="it was not unpickled and is ignored"):
        got = npydask.from_npy_stack(tmp_path / "s")
    np.testing.assert_array_equal(got.compute(), array)
    assert not marker.exists()


class _Reduce:
    def __init__(self, func: Any, args: tuple[Any, ...]) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.func, self.args)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not a pickle",
        b'{"axis": 0}',
        pickle.dumps({"chunks": ((2,), (3,)), "axis": 0})[:-1],  # truncated: no STOP
        pickle.dumps({"chunks": ((2,), (3,)), "axis": 0}) + b"junk",
        pickle.dumps({"chunks": ((2,), (3,)), "axis": "0"}),
        pickle.dumps({"chunks": ((2,), (3,)), "axis": True}),
        pickle.dumps({"chunks": ((2,), (3,)), "axis": 5}),
        pickle.dumps({"chunks": [[2], [3]], "axis": 0}),
        pickle.dumps({"chunks": ((2,), (-3,)), "axis": 0}),
        pickle.dumps({"axis": 0}),
        pickle.dumps((0, 1)),
        pickle.dumps({frozenset({1}): 0}),
    ],
)
def test_unusable_info_is_ignored_with_a_warning(tmp_path, data):
    array = _values((5, 3), "<f8")
    _write(tmp_path / "s", array, (2, 3), 0)
    (tmp_path / "s" / "info").write_bytes(data)
    with pytest.warns(NpyDaskWarning, match=r"/s/info is not the info file dask\.array\.to_npy_stack writes"):
        got = npydask.from_npy_stack(tmp_path / "s")
    np.testing.assert_array_equal(got.compute(), array)


def test_oversized_info_is_ignored_unread(tmp_path, monkeypatch):
    import npydask.dataset.npy_stack as npy_stack

    array = _values((5, 3), "<f8")
    _write(tmp_path / "s", array, (2, 3), 0)
    monkeypatch.setattr(npy_stack, "MAX_INFO_BYTES", 16)
    with pytest.warns(NpyDaskWarning, match="more than 16"):
        npydask.from_npy_stack(tmp_path / "s")


def test_an_info_of_shared_references_is_refused_by_the_size_bound(tmp_path):
    """48 KB describing 144 million chunk sizes: refused after a bounded walk, the files read as they are."""
    n = 12_000
    info = (
        b"\x80\x04K\x05q\x000"  # 5, memo 0, popped
        + b"(" + b"h\x00" * n + b"tq\x010"  # T = (5,) * n through n memo references, memo 1, popped
        + b"}(\x8c\x04axisK\x00\x8c\x06chunks(" + b"h\x01" * n + b"tu."  # {"axis": 0, "chunks": (T,) * n}
    )  # fmt: skip
    assert len(info) < 50_000
    array = _values((5, 3), "<f8")
    _write(tmp_path / "s", array, (2, 3), 0)
    (tmp_path / "s" / "info").write_bytes(info)
    with pytest.warns(NpyDaskWarning, match=r"/s/info is not the info file .*more than 131,072 values counted as a"):
        got = npydask.from_npy_stack(tmp_path / "s")
    np.testing.assert_array_equal(got.compute(), array)


@pytest.mark.parametrize(
    ("meta", "match"),
    [
        ({"chunks": ((2, 10**5000, 1), (3,)), "axis": 0}, r"block 1 with an integer of 16,610 bits along axis 0"),
        ({"chunks": ((2, 2, 1), (-(10**5000),)), "axis": 0}, r"not a tuple of tuples of sizes"),
        ({"chunks": ((2, 2, 1), (10**5000, 1)), "axis": 0}, r"extent of an integer of 16,610 bits along axis 1"),
        ({"chunks": ((2, 2, 1), (3,)), "axis": 10**5000}, r"'axis' an integer of 16,610 bits is not one of the 2"),
    ],
)
def test_an_info_integer_beyond_pythons_digit_limit_is_named_not_printed(tmp_path, meta, match):
    array = _values((5, 3), "<f8")
    _write(tmp_path / "s", array, (2, 3), 0)
    (tmp_path / "s" / "info").write_bytes(pickle.dumps(meta))
    if "axis 1" in match or "block" in match:  # info readable, disagreeing with the files: refused, naming the folder
        with pytest.raises(ValueError, match=re.escape(str(tmp_path / "s")) + ": info records .*" + match):
            npydask.from_npy_stack(tmp_path / "s")
    else:  # info unusable: ignored, naming it
        with pytest.warns(NpyDaskWarning, match=r"/s/info is not the info file .*" + match):
            got = npydask.from_npy_stack(tmp_path / "s")
        np.testing.assert_array_equal(got.compute(), array)
    with pytest.raises(ValueError, match=r"axis an integer of 16,610 bits is out of range"):
        npydask.from_npy_stack(tmp_path / "s", axis=10**5000)


def test_info_that_is_a_fifo_is_refused_at_once(tmp_path):
    if not hasattr(os, "mkfifo"):
        pytest.skip("POSIX FIFOs")
    _write(tmp_path / "s", _values((4,), "<f8"), 2, 0)
    os.remove(tmp_path / "s" / "info")
    os.mkfifo(tmp_path / "s" / "info")
    with pytest.raises(OSError, match="info"):
        npydask.from_npy_stack(tmp_path / "s")


def test_parse_info_reads_every_protocol_without_building_objects():
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        for dtype in ["<f8", ">i2", "<M8[ns]", STRUCTURED, "<U3"]:
            meta = {"chunks": ((4, 4, 1), (7,)), "dtype": np.dtype(dtype), "axis": 0}
            assert parse_info(pickle.dumps(meta, protocol=protocol)) == StackInfo(0, ((4, 4, 1), (7,)))


# -- the axis from the shapes -------------------------------------------------------------------


def test_no_info_axis_from_the_one_axis_whose_extent_differs(tmp_path):
    array = _values((3, 11, 2), "<u2")
    _write(tmp_path / "s", array, (3, 4, 2), 1)  # 4, 4, 3 along axis 1
    os.remove(tmp_path / "s" / "info")
    got = npydask.from_npy_stack(tmp_path / "s")
    assert got.chunks == ((3,), (4, 4, 3), (2,))
    np.testing.assert_array_equal(got.compute(), array)


def test_no_info_and_equal_shapes_is_ambiguous(tmp_path):
    array = _values((12, 3), "<f4")
    _write(tmp_path / "s", array, (4, 3), 0)
    os.remove(tmp_path / "s" / "info")
    with pytest.raises(ValueError, match=r"all 3 files have shape \(4, 3\).*pass axis= \(0 to 1\)"):
        npydask.from_npy_stack(tmp_path / "s")
    np.testing.assert_array_equal(npydask.from_npy_stack(tmp_path / "s", axis=0).compute(), array)
    side = npydask.from_npy_stack(tmp_path / "s", axis=1)  # the user's word: the same files side by side
    np.testing.assert_array_equal(side.compute(), np.concatenate(np.split(array, 3), axis=1))


def test_no_info_single_file(tmp_path):
    array = _values((4, 5), "<f8")
    _write(tmp_path / "s", array, (4, 5), 0)
    os.remove(tmp_path / "s" / "info")
    np.testing.assert_array_equal(npydask.from_npy_stack(tmp_path / "s").compute(), array)


def test_shapes_differing_along_two_axes_are_refused(tmp_path):
    (tmp_path / "s").mkdir()
    np.save(tmp_path / "s" / "0.npy", np.zeros((2, 3)))
    np.save(tmp_path / "s" / "1.npy", np.zeros((3, 4)))
    with pytest.raises(ValueError, match=r"differ along axes \[0, 1\]"):
        npydask.from_npy_stack(tmp_path / "s")
    with pytest.raises(ValueError, match="all extents but axis 0 must agree"):
        npydask.from_npy_stack(tmp_path / "s", axis=0)


@pytest.mark.parametrize(
    ("axis", "error", "match"),
    [
        ("0", TypeError, "axis must be an int"),
        (True, TypeError, "axis must be an int"),
        (2, ValueError, "axis 2 is out of range"),
        (-3, ValueError, "axis -3 is out of range"),
    ],
)
def test_bad_axis(tmp_path, axis, error, match):
    _write(tmp_path / "s", _values((4, 2), "<f8"), (2, 2), 0)
    with pytest.raises(error, match=match):
        npydask.from_npy_stack(tmp_path / "s", axis=axis)


# -- folders that are not (or no longer) one stack ----------------------------------------------


def test_files_left_from_an_earlier_longer_stack_are_reported(tmp_path):
    folder = tmp_path / "s"
    _write(folder, _values((24, 2), "<f4"), (2, 2), 0)  # 0.npy .. 11.npy
    array = _values((10, 2), "<f4")
    _write(folder, array, (2, 2), 0)  # 0.npy .. 4.npy and a new info; 5.npy .. 11.npy stay
    with pytest.raises(
        ValueError,
        match=r"info records 5 blocks along axis 0 but the folder holds 12 files "
        r"\(5\.npy \.\. 11\.npy may be left",
    ):
        npydask.from_npy_stack(folder)
    for stale in range(5, 12):
        os.remove(folder / f"{stale}.npy")
    _check_equal(npydask.from_npy_stack(folder), folder, array)


def test_info_that_disagrees_with_the_files(tmp_path):
    folder = tmp_path / "s"
    array = _values((6, 4), "<f8")
    _write(folder, array, (2, 4), 0)
    np.save(folder / "1.npy", np.zeros((3, 4)))
    with pytest.raises(ValueError, match=r"block 1 with 2 along axis 0, but 1\.npy has shape \(3, 4\)"):
        npydask.from_npy_stack(folder)
    (folder / "info").write_bytes(pickle.dumps({"chunks": ((2, 2, 2), (4,), (1,)), "dtype": np.dtype("f8"), "axis": 0}))
    with pytest.raises(ValueError, match="info records 3 dimensions but the files have 2"):
        npydask.from_npy_stack(folder)
    (folder / "info").write_bytes(pickle.dumps({"chunks": ((2, 3, 2), (5,)), "dtype": np.dtype("f8"), "axis": 0}))
    with pytest.raises(ValueError, match="extent of 5 along axis 1 but the files have 4"):
        npydask.from_npy_stack(folder)


def test_missing_numbers_are_named(tmp_path):
    folder = tmp_path / "s"
    _write(folder, _values((24, 2), "<f4"), (2, 2), 0)
    os.remove(folder / "3.npy")
    os.remove(folder / "10.npy")
    with pytest.raises(ValueError, match=r"3\.npy, 10\.npy are missing from the stack 0\.npy \.\. 11\.npy"):
        npydask.from_npy_stack(folder)
    os.remove(folder / "0.npy")
    with pytest.raises(ValueError, match=r"0\.npy, 3\.npy, 10\.npy are missing"):
        npydask.from_npy_stack(folder)


@pytest.mark.parametrize("name", ["01.npy", "a.npy", "1.npy.npy", "-1.npy", "1 .npy"])
def test_extra_npy_files_are_refused(tmp_path, name):
    folder = tmp_path / "s"
    _write(folder, _values((6, 2), "<f4"), (2, 2), 0)
    np.save(folder / name, np.zeros((2, 2), "<f4"))
    with pytest.raises(ValueError, match=re.escape(name) + r" is not part of a dask\.array\.to_npy_stack folder"):
        npydask.from_npy_stack(folder)


def test_other_files_and_subfolders_are_not_part_of_the_stack(tmp_path):
    folder = tmp_path / "s"
    array = _values((6, 2), "<f4")
    _write(folder, array, (2, 2), 0)
    (folder / "README.txt").write_text("notes")
    (folder / "sub").mkdir()
    np.save(folder / "sub" / "3.npy", np.zeros((2, 2), "<f4"))
    _check_equal(npydask.from_npy_stack(folder), folder, array)


def test_mismatched_dtypes_are_refused(tmp_path):
    folder = tmp_path / "s"
    _write(folder, _values((6, 2), "<f4"), (2, 2), 0)
    np.save(folder / "2.npy", np.zeros((2, 2), "<f8"))
    with pytest.raises(ValueError, match=r"share one dtype: .*0\.npy holds float32.*2\.npy holds float64"):
        npydask.from_npy_stack(folder)


def test_a_corrupt_file_is_named(tmp_path):
    folder = tmp_path / "s"
    _write(folder, _values((6, 2), "<f4"), (2, 2), 0)
    (folder / "1.npy").write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(NpyFormatError, match=r"1\.npy"):
        npydask.from_npy_stack(folder)


def test_not_a_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing"):
        npydask.from_npy_stack(tmp_path / "missing")
    np.save(tmp_path / "a.npy", np.zeros(3))
    with pytest.raises(NotADirectoryError, match=r"a\.npy is not a folder"):
        npydask.from_npy_stack(tmp_path / "a.npy")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no 0.npy, 1.npy, ... here"):
        npydask.from_npy_stack(tmp_path / "empty")


def test_stack_files_is_pure_and_numeric():
    names = [f"{i}.npy" for i in range(12)][::-1]
    assert stack_files(names, "d") == [f"{i}.npy" for i in range(12)]
    with pytest.raises(ValueError, match="d: 0.npy is missing"):
        stack_files(["1.npy"], "d")


# -- object storage -------------------------------------------------------------------------------


def test_a_stack_under_an_s3_prefix(tmp_path, s3_server):
    pytest.importorskip("obstore")
    array = _values((23, 3), "<f4")
    _write(tmp_path / "s", array, (2, 3), 0)
    client = s3_server.boto3_client()
    prefix = f"stack-{os.getpid()}-{id(array)}"
    for name in os.listdir(tmp_path / "s"):
        client.put_object(Bucket=s3_server.bucket, Key=f"{prefix}/{name}", Body=(tmp_path / "s" / name).read_bytes())
    url = f"s3://{s3_server.bucket}/{prefix}"
    for root in (url, url + "/"):
        got = npydask.from_npy_stack(root, storage_options=s3_server.storage_options())
        _check_equal(got, tmp_path / "s", array)
    marker = tmp_path / "pwned"
    client.put_object(Bucket=s3_server.bucket, Key=f"{prefix}/info", Body=_evil(marker))
    with pytest.warns(NpyDaskWarning, match=rf"{prefix}/info is not the info file"):
        got = npydask.from_npy_stack(url, storage_options=s3_server.storage_options())
    np.testing.assert_array_equal(got.compute(), array)
    assert not marker.exists()
    client.delete_object(Bucket=s3_server.bucket, Key=f"{prefix}/info")
    np.testing.assert_array_equal(
        npydask.from_npy_stack(url, storage_options=s3_server.storage_options()).compute(), array
    )
    client.delete_object(Bucket=s3_server.bucket, Key=f"{prefix}/4.npy")
    with pytest.raises(ValueError, match=r"4\.npy is missing"):
        npydask.from_npy_stack(url, storage_options=s3_server.storage_options())


def test_copy_keeps_working(tmp_path):
    """A stack moved elsewhere (info and all) reads the same: nothing records the folder's old path."""
    array = _values((9, 2), "<i8")
    _write(tmp_path / "a", array, (4, 2), 0)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    np.testing.assert_array_equal(npydask.from_npy_stack(tmp_path / "b").compute(), array)
