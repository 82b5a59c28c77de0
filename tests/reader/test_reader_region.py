"""read_region and read_header: numpy is the oracle, bad arguments and special files fail clearly."""

from __future__ import annotations

import itertools
import os
import pathlib
import re
import socket
import stat

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import npydask
from npydask.errors import NpyFormatError, RoiError
from npydask.plan.region import Box
from npydask.reader import FileRef, read_header, read_region
from npydask.testing.conformance import assert_same_array, expected_region, sample_array

BACKENDS = ("pread", "mmap", "auto")
DTYPES = ["?", "u1", "<i2", ">i4", "<u8", "<f2", ">f4", "<f8", ">c16", "<M8[ms]", ">m8[s]", "S3", "<U2", "V5",
          np.dtype([("a", "<i2"), ("b", ">f8")], align=True)]  # fmt: skip

# --------------------------------------------------------------------------
# Strategies (small, local: the shared ones live in npydask.testing.strategies)

shapes = st.lists(st.integers(0, 5), min_size=0, max_size=4).map(tuple)


@st.composite
def regions(draw: st.DrawFn, shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A box ``0 <= start <= stop <= shape``."""
    start, stop = [], []
    for n in shape:
        a = draw(st.integers(0, n))
        start.append(a)
        stop.append(draw(st.integers(a, n)))
    return tuple(start), tuple(stop)


@st.composite
def npy_cases(draw: st.DrawFn) -> tuple[np.ndarray, str, tuple[tuple[int, ...], tuple[int, ...]]]:
    shape = draw(shapes)
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    values = sample_array(shape, dtype, seed=draw(st.integers(0, 2**16)))
    return values, draw(st.sampled_from("CF")), draw(regions(shape))


@pytest.fixture
def unique_path(tmp_path: pathlib.Path):
    """A fresh file name per call (hypothesis reuses the test's tmp_path across examples)."""
    counter = itertools.count()
    return lambda: str(tmp_path / f"h{next(counter)}.npy")


# --------------------------------------------------------------------------
# Values


@given(case=npy_cases(), backend=st.sampled_from(BACKENDS))
def test_read_region_matches_numpy(unique_path, case, backend: str) -> None:
    values, order, (start, stop) = case
    path = unique_path()
    np.save(path, np.array(values, order=order))
    full = np.load(path)
    expected = expected_region(full, start, stop)
    assert_same_array(read_region(path, start, stop, backend=backend), expected, f"{backend} [{start}, {stop})")
    assert_same_array(FileRef.open(path, backend).read(Box(start, stop)), expected, "FileRef")
    out = np.empty(expected.shape, expected.dtype)
    assert read_region(path, start, stop, out=out, backend=backend) is out
    assert_same_array(out, expected, "out=")


@given(data=st.data())
def test_short_sequences_and_none(unique_path, data: st.DataObject) -> None:
    shape = data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple))
    values = sample_array(shape, "<i4", seed=len(shape))
    path = unique_path()
    np.save(path, np.array(values, order=data.draw(st.sampled_from("CF"))))
    start_full, stop_full = data.draw(regions(shape))
    k = data.draw(st.integers(0, len(shape)))
    m = data.draw(st.integers(0, len(shape)))
    start = data.draw(st.sampled_from([None, list(start_full[:k]), tuple(start_full[:k])]))
    stop = data.draw(st.sampled_from([None, list(stop_full[:m]), np.array(stop_full[:m], dtype=np.int64)]))
    lo = tuple(start_full[:k]) + (0,) * (len(shape) - k) if start is not None else (0,) * len(shape)
    hi = tuple(stop_full[:m]) + shape[m:] if stop is not None else shape
    if any(a > b for a, b in zip(lo, hi)):
        with pytest.raises(RoiError):
            read_region(path, start, stop)
        return
    assert_same_array(read_region(path, start, stop), expected_region(values, lo, hi), f"{start} {stop}")


def test_numpy_integer_scalars_accepted(save) -> None:
    path = save(np.arange(12).reshape(3, 4))
    got = read_region(path, (np.int8(1), np.uint64(0)), [np.int32(3), 2])
    np.testing.assert_array_equal(got, np.arange(12).reshape(3, 4)[1:3, 0:2])


# --------------------------------------------------------------------------
# Bad regions

BAD_REGIONS = [
    ((0, 0), (3, 5), "outside"),  # stop past the end
    ((0, 0), (4, 4), "outside"),
    ((-1, 0), (2, 2), "outside"),  # negative start
    ((0, 0), (-1, 2), None),  # negative stop
    ((2, 0), (1, 4), None),  # start after stop
    ((0, 3), (3, 2), None),
    ((0, 0, 0), None, "3 values"),  # too many values
    (None, (1, 1, 1), "3 values"),
    ((0.0, 0), None, "integers"),  # not integers
    (("1", 0), None, "integers"),
    ((True, 0), None, "integers"),
    ((0, 0), (1, 2.5), "integers"),
]


@pytest.mark.parametrize(("start", "stop", "words"), BAD_REGIONS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_regions_raise_roi_error(save, start, stop, words, backend: str) -> None:
    path = save(np.zeros((3, 4), "<f4"))
    with pytest.raises(RoiError) as info:
        read_region(path, start, stop, backend=backend)
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert path in message and "(3, 4)" in message, message
    if words:
        assert words in message, message


def test_fileref_checks_its_box(save) -> None:
    path = save(np.zeros((3, 4), "<f4"))
    ref = FileRef.open(path)
    for box in (Box((0, 0), (4, 4)), Box((2, 0), (1, 4)), Box((0, 0, 0), (1, 1, 1))):
        with pytest.raises(RoiError) as info:
            ref.read(box)
        assert path in str(info.value)
    # A shorter box covers the leading axes, as for read_region.
    assert ref.read(Box((1,), (2,))).shape == (1, 4)


def test_unknown_backend_and_key(save) -> None:
    path = save(np.zeros(3))
    with pytest.raises(ValueError, match="backend"):
        read_region(path, backend="mmap2")


# --------------------------------------------------------------------------
# Headers and special paths


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize(
    ("shape", "dtype"), [((), "<f8"), ((0,), ">i2"), ((3, 4), ">c8"), ((2, 3, 4), "<U3"), ((5, 1), DTYPES[-1])]
)
def test_read_header_matches_numpy(save, shape, dtype, order: str) -> None:
    path = save(sample_array(shape, dtype), order=order)
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        np_shape, np_fortran, np_dtype = read(f)
        offset = f.tell()
    header = read_header(path)
    assert header.version == version
    assert header.shape == np_shape == tuple(shape)
    assert header.fortran_order == np_fortran
    assert header.dtype == np_dtype and header.dtype.str == np_dtype.str
    assert header.data_offset == offset
    assert header.nbytes == np_dtype.itemsize * int(np.prod(shape)) == os.path.getsize(path) - offset


def test_missing_path(tmp_path: pathlib.Path) -> None:
    path = str(tmp_path / "nope.npy")
    for call in (read_header, read_region, FileRef.open):
        with pytest.raises(FileNotFoundError) as info:
            call(path)
        assert path in str(info.value)


def test_directory(tmp_path: pathlib.Path) -> None:
    path = str(tmp_path / "folder.npy")
    os.mkdir(path)
    for call in (read_header, read_region, FileRef.open):
        with pytest.raises(IsADirectoryError) as info:
            call(path)
        assert path in str(info.value)


@pytest.mark.timeout(10)
def test_fifo_refused_without_blocking(tmp_path: pathlib.Path) -> None:
    path = str(tmp_path / "pipe.npy")
    os.mkfifo(path)
    assert stat.S_ISFIFO(os.stat(path).st_mode)
    for call in (read_header, read_region, FileRef.open):
        with pytest.raises(OSError, match="FIFO") as info:
            call(path)
        assert path in str(info.value)
        assert not isinstance(info.value, NpyFormatError)


@pytest.mark.timeout(10)
def test_socket_and_device_refused(tmp_path: pathlib.Path) -> None:
    paths = []
    if os.path.exists("/dev/null"):
        paths.append("/dev/null")
    sock_path = str(tmp_path / "s.npy")
    if len(sock_path) < 100:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(sock_path)
        paths.append(sock_path)
    else:
        server = None
    try:
        for path in paths:
            with pytest.raises(OSError, match=re.escape(path)):
                read_header(path)
            with pytest.raises(OSError, match=re.escape(path)):
                read_region(path)
    finally:
        if server is not None:
            server.close()


def test_unreadable_file(save) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads files without read permission")
    path = save(np.zeros(3))
    os.chmod(path, 0)
    try:
        with pytest.raises(PermissionError) as info:
            read_region(path)
        assert path in str(info.value)
    finally:
        os.chmod(path, 0o644)


def test_not_an_npy_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "text.npy"
    path.write_text("hello, world\n" * 10)
    for call in (read_header, read_region, FileRef.open):
        with pytest.raises(NpyFormatError) as info:
            call(str(path))
        assert str(path) in str(info.value)


def test_bytes_paths_refused(save) -> None:
    path = save(np.zeros(3)).encode()
    for call in (read_header, read_region, FileRef.open):
        with pytest.raises(TypeError, match="bytes"):
            call(path)


class _MyPath:
    def __init__(self, path: str) -> None:
        self._path = path

    def __fspath__(self) -> str:
        return self._path


def test_pathlike_paths_accepted(save) -> None:
    values = sample_array((4, 5), ">f8", seed=3)
    path = save(values)
    for p in (pathlib.Path(path), _MyPath(path)):
        assert read_header(p).shape == (4, 5)
        assert_same_array(read_region(p, (1,), (3,)), values[1:3], type(p).__name__)
        ref = FileRef.open(p)
        assert type(ref.path) is str and ref.path == path
        assert_same_array(ref.read(Box((0, 0), (4, 2))), values[:, :2], "FileRef")


def test_symlink_followed(save, tmp_path: pathlib.Path) -> None:
    values = np.arange(10.0)
    path = save(values)
    link = tmp_path / "link.npy"
    link.symlink_to(path)
    np.testing.assert_array_equal(read_region(link, (2,), (5,)), values[2:5])


def test_public_names() -> None:
    assert npydask.read_region is read_region and npydask.read_header is read_header
    assert issubclass(npydask.RoiError, ValueError)
    assert issubclass(npydask.FileChangedError, OSError)


@pytest.mark.parametrize("dtype", [">m8", ">M8", "<m8", ">m8[s]"])
def test_generic_unit_datetimes_keep_their_byte_order(tmp_path, dtype):
    """numpy allocates generic-unit datetimes native-endian: a big-endian file's bytes must not be relabelled."""
    values = np.frombuffer(np.arange(6, dtype=">i8" if dtype[0] == ">" else "<i8").tobytes(), dtype)
    p = str(tmp_path / "t.npy")
    np.save(p, values)
    expected = np.load(p)
    for got, want in ((npydask.read_region(p), expected), (npydask.read_region(p, (1,), (5,)), expected[1:5])):
        assert got.dtype.str == want.dtype.str
        assert got.tobytes() == want.tobytes()
    # (several chunks are joined by numpy's concatenate, which gives native order, converting the values)
    ints = expected.astype(np.int64)  # (numpy compares generic units of two byte orders as unequal)
    np.testing.assert_array_equal(npydask.from_npy(p, chunks=2).compute().astype(np.int64), ints)
    block = npydask.from_npy(p, chunks=2)[2:4].compute()  # (one whole chunk: its task's own array)
    assert block.dtype.str == expected.dtype.str and block.tobytes() == expected[2:4].tobytes()
