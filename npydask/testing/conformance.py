"""The conformance suite every host backend passes (zarr's ``testing/store.py`` style).

Subclass :class:`BackendConformance` in a test module, name the backend and,
optionally, turn on ``O_DIRECT``::

    from npydask.testing.conformance import BackendConformance

    class TestPread(BackendConformance):
        backend_name = "pread"

    class TestPreadDirect(BackendConformance):
        backend_name = "pread"
        direct_io = True

Every test writes real files with :func:`numpy.save` and compares what
:func:`npydask.read_region` and :meth:`npydask.reader.FileRef.read` return
with slicing :func:`numpy.load`'s array, the oracle: same bytes (so NaN
payloads and padding count), same dtype (byte order included), same shape,
and C-contiguous. The suite covers whole arrays, every region of small arrays,
random regions of 3-D and 4-D ones, empty arrays and regions, 0-d arrays,
C and Fortran order, both byte orders, many dtypes, regions at the end of the
file, ``out=``, files truncated before and after opening, pickling of what
tasks carry (read back in a fresh process), and the ``gap_bytes`` setting.

This module imports pytest: import it from tests only.
"""

from __future__ import annotations

import itertools
import math
import os
import pickle
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import pytest

import npydask
from npydask import config
from npydask.errors import FileChangedError, NpyFormatError
from npydask.plan.region import Box, plan_read
from npydask.reader import FileRef, choose_backend, read_region
from npydask.storage import acquire, clear_cache

__all__ = [
    "DTYPES",
    "BackendConformance",
    "assert_same_array",
    "direct_io_supported",
    "every_region",
    "expected_region",
    "random_regions",
    "sample_array",
    "value_bytes",
]

Region = tuple[tuple[int, ...], tuple[int, ...]]

_DTYPE_SPECS: list[str | np.dtype] = [
    "?", "i1", "u1", "<i2", ">i2", "<u2", ">u4", "<i4", ">i8", "<u8",
    "<f2", ">f2", "<f4", ">f4", "<f8", ">f8", "<c8", ">c8", "<c16", ">c16",
    np.dtype(np.longdouble), np.dtype(np.longdouble).newbyteorder(),
    np.dtype(np.clongdouble), np.dtype(np.clongdouble).newbyteorder(),
    "<M8[ns]", ">M8[D]", "<m8[s]", ">m8[us]",
    "S1", "S5", "<U1", "<U3", ">U4", "V3", "V16",
    np.dtype([("a", "u1"), ("b", "<f8"), ("c", ">i2", (2,))], align=True),
    np.dtype([("p", [("x", "<f4"), ("y", ">u2")]), ("s", "S3"), ("m", "<i4", (2, 2))]),
    np.dtype({"names": ["a", "b"], "formats": ["<i4", ">f8"], "offsets": [0, 8], "itemsize": 24}),
]  # fmt: skip

DTYPES: tuple[np.dtype, ...] = tuple(np.dtype(d) for d in _DTYPE_SPECS)
"""Dtypes the suite round-trips: every kind numpy saves without pickling, in both byte orders."""


# --------------------------------------------------------------------------
# Helpers: data, regions, the oracle and the comparison.


def sample_array(shape: Sequence[int], dtype: Any, seed: int = 0) -> np.ndarray:
    """A C-ordered array of ``shape`` and ``dtype`` full of varied values.

    Numeric, void and structured dtypes get random bytes (NaN payloads,
    NaT, denormals and padding included); booleans get 0/1 and strings get
    printable text, so that every value is one numpy itself would write.
    """
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    n = math.prod(shape)
    if dtype.kind == "b":
        flat = rng.integers(0, 2, n).astype(dtype)
    elif dtype.kind == "U":
        letters = np.array(list("abcXYZ019 \u00e9\u4e2d\U0001f600"))
        width = dtype.itemsize // 4
        flat = np.array(["".join(rng.choice(letters, rng.integers(0, width + 1))) for _ in range(n)], dtype=dtype)
    else:
        flat = np.frombuffer(rng.bytes(n * dtype.itemsize), dtype=dtype, count=n).copy()
    return flat.reshape(tuple(shape))


def expected_region(full: np.ndarray, start: Sequence[int], stop: Sequence[int]) -> np.ndarray:
    """numpy's answer: ``full[start:stop]`` axis by axis."""
    return full[tuple(slice(a, b) for a, b in zip(start, stop))]


def assert_same_array(got: Any, expected: np.ndarray, what: str = "") -> None:
    """Same bytes, dtype (byte order and fields included) and shape, and ``got`` is C-contiguous."""
    assert isinstance(got, np.ndarray), f"{what}: expected a numpy.ndarray, found {type(got).__name__}"
    assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype!r} != {expected.dtype!r}"
    assert got.dtype.str == expected.dtype.str, f"{what}: dtype.str {got.dtype.str} != {expected.dtype.str}"
    if expected.dtype.fields is not None:
        assert got.dtype.descr == expected.dtype.descr, f"{what}: descr {got.dtype.descr} != {expected.dtype.descr}"
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    assert got.flags.c_contiguous, f"{what}: result is not C-contiguous"
    assert value_bytes(got) == value_bytes(expected), f"{what}: values differ"


def value_bytes(a: np.ndarray) -> bytes:
    """The bytes of every value in C order; for structured dtypes field by field, padding left out.

    numpy does not keep the padding bytes of a structured item when it copies
    (slicing a loaded array then ``tobytes()`` zeroes them), so padding is no
    part of the comparison.
    """
    if a.dtype.names is None:
        return a.tobytes()
    return b"".join(value_bytes(a[name]) for name in a.dtype.names)


def every_region(shape: Sequence[int]) -> Iterator[Region]:
    """Every box ``0 <= start <= stop <= shape`` (empty ones included)."""
    per_axis = [[(a, b) for a in range(n + 1) for b in range(a, n + 1)] for n in shape]
    for combo in itertools.product(*per_axis):
        yield tuple(a for a, _ in combo), tuple(b for _, b in combo)


def random_regions(shape: Sequence[int], count: int, seed: int = 0) -> list[Region]:
    """``count`` random boxes of ``shape``: mostly non-empty, some empty, some whole axes."""
    rng = np.random.default_rng(seed)
    regions = []
    for _ in range(count):
        start, stop = [], []
        for n in shape:
            kind = rng.random()
            if kind < 0.2:
                a, b = 0, n  # whole axis
            elif kind < 0.25:
                a = int(rng.integers(0, n + 1))
                b = a  # empty
            else:
                a, b = sorted(int(v) for v in rng.integers(0, n + 1, 2))
                if a == b and n:
                    a, b = (a - 1, a) if a else (0, 1)
            start.append(a)
            stop.append(b)
        regions.append((tuple(start), tuple(stop)))
    return regions


def direct_io_supported(folder: str | os.PathLike[str]) -> bool:
    """Whether files in ``folder`` can be opened and read with ``O_DIRECT``."""
    import mmap

    probe = os.path.join(folder, ".npydask-o-direct-probe")
    with open(probe, "wb") as f:
        f.write(b"\0" * 8192)
    try:
        fd = os.open(probe, os.O_RDONLY | getattr(os, "O_DIRECT", 0) | os.O_CLOEXEC)
    except OSError:
        return False
    finally:
        os.unlink(probe)
    try:
        buf = mmap.mmap(-1, 4096)  # page-aligned
        with buf:
            return os.preadv(fd, [buf], 0) == 4096
    except OSError:
        return False
    finally:
        os.close(fd)


_CHILD = textwrap.dedent(
    """
    import pickle, sys
    import numpy as np
    from npydask.plan.region import Box

    with open(sys.argv[1], "rb") as f:
        jobs = pickle.load(f)
    for k, (ref, start, stop) in enumerate(jobs):
        assert ref.options.direct_io is (sys.argv[3] == "1"), ref.options
        np.save(f"{sys.argv[2]}/{k}.npy", ref.read(Box(start, stop)), allow_pickle=False)
    """
)


class BackendConformance:
    """Tests every host backend must pass; subclass and set :attr:`backend_name`.

    Attributes
    ----------
    backend_name : str
        ``"pread"``, ``"mmap"``, ``"auto"`` or another registered backend.
    direct_io : bool
        Run every test under ``npydask.config.set(direct_io=...)``.
    """

    backend_name: ClassVar[str] = ""
    direct_io: ClassVar[bool] = False

    # ---------------------------------------------------------------- fixtures

    @pytest.fixture(autouse=True)
    def _backend_settings(self, tmp_path: Path) -> Iterator[None]:
        if not self.backend_name:
            pytest.skip("BackendConformance is abstract: set backend_name in a subclass")
        if self.direct_io and not direct_io_supported(tmp_path):
            pytest.skip(f"the file system of {tmp_path} refuses O_DIRECT")
        clear_cache()
        with config.set(direct_io=self.direct_io):
            yield
        clear_cache()

    @pytest.fixture
    def npy(self, tmp_path: Path) -> Callable[..., str]:
        """Save an array with :func:`numpy.save` (C or Fortran order) and return its path."""
        counter = itertools.count()

        def _save(array: np.ndarray, *, order: Literal["C", "F"] = "C", name: str | None = None) -> str:
            path = tmp_path / (name or f"c{next(counter)}.npy")
            np.save(path, np.array(array, order=order, copy=True), allow_pickle=False)
            return str(path)

        return _save

    # ---------------------------------------------------------------- reading

    def read(self, path: str, start: Any = None, stop: Any = None, **kwargs: Any) -> np.ndarray:
        """``read_region`` with this backend."""
        return read_region(path, start, stop, backend=self.backend_name, **kwargs)

    def ref(self, path: str) -> FileRef:
        """``FileRef.open`` with this backend."""
        return FileRef.open(path, self.backend_name)

    def check_regions(self, path: str, regions: Iterable[Region]) -> int:
        """Compare both read paths with numpy for each region; returns how many were checked."""
        full = np.load(path, allow_pickle=False)
        ref = self.ref(path)
        count = 0
        for start, stop in regions:
            expected = expected_region(full, start, stop)
            what = f"{self.backend_name} {path} {full.shape} {full.dtype.str} [{start}, {stop})"
            assert_same_array(self.read(path, start, stop), expected, f"read_region {what}")
            assert_same_array(ref.read(Box(start, stop)), expected, f"FileRef.read {what}")
            count += 1
        return count

    # ---------------------------------------------------------------- whole arrays

    @pytest.mark.parametrize("order", ["C", "F"])
    @pytest.mark.parametrize("shape", [(1,), (17,), (3, 4), (4, 1, 3), (2, 3, 4, 5)])
    def test_whole_array(self, npy: Callable[..., str], shape: tuple[int, ...], order: str) -> None:
        path = npy(sample_array(shape, "<f8", seed=len(shape)), order=order)
        full = np.load(path)
        assert_same_array(self.read(path), full, "no start/stop")
        assert_same_array(self.read(path, [0] * len(shape), shape), full, "explicit whole box")
        assert_same_array(self.ref(path).read(Box.whole(shape)), full, "FileRef")

    # ---------------------------------------------------------------- every region

    def test_every_region_1d(self, npy: Callable[..., str]) -> None:
        path = npy(sample_array((7,), "<i4", seed=1))
        assert self.check_regions(path, every_region((7,))) == 36

    @pytest.mark.parametrize("order", ["C", "F"])
    def test_every_region_2d(self, npy: Callable[..., str], order: str) -> None:
        path = npy(sample_array((4, 5), ">f4", seed=2), order=order)
        assert self.check_regions(path, every_region((4, 5))) == 15 * 21

    @pytest.mark.parametrize("order", ["C", "F"])
    @pytest.mark.parametrize("shape", [(5, 6, 7), (3, 4, 5, 6)], ids=["3d", "4d"])
    def test_random_regions(self, npy: Callable[..., str], shape: tuple[int, ...], order: str) -> None:
        path = npy(sample_array(shape, "<u2", seed=3), order=order)
        self.check_regions(path, random_regions(shape, 60, seed=len(shape)))

    # ---------------------------------------------------------------- empty and 0-d

    @pytest.mark.parametrize("order", ["C", "F"])
    @pytest.mark.parametrize("shape", [(0,), (0, 3), (3, 0), (2, 0, 4), (0, 0)])
    def test_empty_array(self, npy: Callable[..., str], shape: tuple[int, ...], order: str) -> None:
        path = npy(np.zeros(shape, ">i2"), order=order)
        assert npydask.read_header(path).nbytes == 0
        self.check_regions(path, every_region(shape))
        assert_same_array(self.read(path), np.load(path), "whole empty array")

    @pytest.mark.parametrize("order", ["C", "F"])
    def test_empty_regions(self, npy: Callable[..., str], order: str) -> None:
        shape = (4, 5, 3)
        path = npy(sample_array(shape, "<c8", seed=4), order=order)
        regions = [
            ((2, 1, 0), (2, 4, 3)),
            ((0, 3, 0), (4, 3, 3)),
            ((0, 0, 3), (4, 5, 3)),
            ((4, 5, 3), (4, 5, 3)),
            ((0, 0, 0), (0, 0, 0)),
            ((1, 2, 1), (3, 2, 2)),
        ]
        self.check_regions(path, regions)

    @pytest.mark.parametrize("dtype", ["<f8", ">i4", "?", "<U3", "S2", DTYPES[-3]], ids=str)
    def test_zero_d(self, npy: Callable[..., str], dtype: Any) -> None:
        path = npy(sample_array((), dtype, seed=5))
        full = np.load(path)
        assert full.shape == ()
        assert_same_array(self.read(path), full, "0-d, no start/stop")
        assert_same_array(self.read(path, (), ()), full, "0-d, empty start/stop")
        assert_same_array(self.ref(path).read(Box((), ())), full, "0-d FileRef")
        out = np.empty((), full.dtype)
        assert self.read(path, out=out) is out
        assert out.tobytes() == full.tobytes()

    # ---------------------------------------------------------------- dtypes and orders

    @pytest.mark.parametrize("order", ["C", "F"])
    @pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.str if d.fields is None else "struct")
    def test_dtypes(self, npy: Callable[..., str], dtype: np.dtype, order: str) -> None:
        shape = (5, 6)
        path = npy(sample_array(shape, dtype, seed=6), order=order)
        header = npydask.read_header(path)
        assert header.dtype == dtype and header.dtype.str == dtype.str
        regions = [
            ((0, 0), (5, 6)),  # whole
            ((1, 2), (4, 5)),  # interior box
            ((2, 0), (3, 6)),  # one row
            ((0, 3), (5, 4)),  # one column
            ((4, 5), (5, 6)),  # the last element
            ((4, 0), (5, 6)),  # the last row
            ((0, 5), (5, 6)),  # the last column
            ((3, 1), (3, 4)),  # empty
        ]
        self.check_regions(path, regions)

    @pytest.mark.parametrize("order", ["C", "F"])
    def test_both_byte_orders_agree(self, npy: Callable[..., str], order: str) -> None:
        values = sample_array((6, 7), "<f8", seed=7)
        little = npy(values, order=order)
        big = npy(values.astype(">f8"), order=order)
        box = ((1, 2), (5, 6))
        a, b = self.read(little, *box), self.read(big, *box)
        assert a.dtype.str == "<f8" and b.dtype.str == ">f8"
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, expected_region(values, *box))

    # ---------------------------------------------------------------- end of the file

    @pytest.mark.parametrize("n", [1, 1023, 1024, 1025, 3001, 4096 + 7])
    def test_regions_at_end_of_file(self, npy: Callable[..., str], n: int) -> None:
        path = npy(sample_array((n,), "<f4", seed=n))
        tails = sorted({n - 1, n - 2, n - 1000, n - 1024, n - 1025, n // 2, 0} & set(range(n)))
        regions = [((a,), (n,)) for a in tails] + [((max(n - 5, 0),), (n - 1,)), ((n,), (n,))]
        self.check_regions(path, regions)

    @pytest.mark.parametrize("order", ["C", "F"])
    def test_regions_at_end_of_file_2d(self, npy: Callable[..., str], order: str) -> None:
        shape = (37, 29)  # payload not a multiple of any page size
        path = npy(sample_array(shape, "<f8", seed=8), order=order)
        regions = [
            ((36, 0), (37, 29)),
            ((0, 28), (37, 29)),
            ((30, 20), (37, 29)),
            ((36, 28), (37, 29)),
            ((1, 1), (37, 29)),
        ]
        self.check_regions(path, regions)

    # ---------------------------------------------------------------- out=

    @pytest.mark.parametrize("order", ["C", "F"])
    @pytest.mark.parametrize(
        "region",
        [((0, 0, 0), (4, 5, 6)), ((1, 0, 0), (3, 5, 6)), ((1, 2, 3), (3, 4, 6)), ((0, 1, 0), (4, 2, 6)),
         ((2, 2, 2), (2, 4, 4))],
        ids=["whole", "slab", "box", "plane", "empty"],
    )  # fmt: skip
    def test_out(self, npy: Callable[..., str], order: str, region: Region) -> None:
        path = npy(sample_array((4, 5, 6), ">i8", seed=9), order=order)
        expected = expected_region(np.load(path), *region)
        out = np.full(expected.shape, 7, expected.dtype)
        assert self.read(path, *region, out=out) is out
        assert_same_array(out, expected, "read_region out=")
        out2 = np.zeros(expected.shape, expected.dtype)
        assert self.ref(path).read(Box(*region), out=out2) is out2
        assert_same_array(out2, expected, "FileRef.read out=")

    def test_out_rejected(self, npy: Callable[..., str]) -> None:
        path = npy(sample_array((4, 6), "<f4", seed=10))
        region = ((0, 0), (4, 6))
        ref = self.ref(path)
        bad_value = [
            np.empty((4, 5), "<f4"),  # shape
            np.empty((24,), "<f4"),  # shape, same size
            np.empty((4, 12), "<f4")[:, ::2],  # not contiguous
            np.empty((4, 6), "<f4", order="F"),  # Fortran-contiguous
        ]
        readonly = np.empty((4, 6), "<f4")
        readonly.flags.writeable = False
        bad_value.append(readonly)
        bad_dtype = [np.empty((4, 6), "<f8"), np.empty((4, 6), ">f4"), np.empty((4, 6), "<i4")]
        for out in bad_value:
            with pytest.raises(ValueError, match=re.escape(path)):  # the message names the file
                self.read(path, *region, out=out)
            with pytest.raises(ValueError, match="out must be a writeable C-contiguous array"):
                ref.read(Box(*region), out=out)
        for out in bad_dtype:
            with pytest.raises((ValueError, TypeError)):
                self.read(path, *region, out=out)
            with pytest.raises((ValueError, TypeError)):
                ref.read(Box(*region), out=out)
        not_an_array: Any = [[0.0] * 6] * 4  # (a list on purpose: the TypeError is what is tested)
        with pytest.raises(TypeError):
            self.read(path, *region, out=not_an_array)
        with pytest.raises(TypeError):
            ref.read(Box(*region), out=not_an_array)

    # ---------------------------------------------------------------- truncated files

    @pytest.mark.parametrize("keep", ["all_but_one", "half_payload", "header_only", "nothing"])
    def test_truncated_after_open(self, npy: Callable[..., str], keep: str) -> None:
        path = npy(sample_array((40, 50), "<f8", seed=11))
        ref = self.ref(path)
        header = ref.header
        size = {
            "all_but_one": header.data_offset + header.nbytes - 1,
            "half_payload": header.data_offset + header.nbytes // 2,
            "header_only": header.data_offset,
            "nothing": 0,
        }[keep]
        os.truncate(path, size)
        for box in (Box.whole((40, 50)), Box((0, 0), (1, 50)), Box((39, 10), (40, 20))):
            with pytest.raises(FileChangedError, match="changed") as info:
                ref.read(box)
            assert path in str(info.value)
        # A fresh read sees a truncated file, never a short or stale array.
        with pytest.raises(NpyFormatError) as fresh:
            self.read(path)
        assert path in str(fresh.value)

    @pytest.mark.parametrize("order", ["C", "F"])
    @pytest.mark.parametrize("cut", [1, 8 * 50, 4096, 10_000])
    def test_truncated_while_reading(self, npy: Callable[..., str], order: str, cut: int) -> None:
        """The file shrinks between the identity check and the read: an error, never SIGBUS or wrong data."""
        shape = (40, 50)
        path = npy(sample_array(shape, "<f8", seed=12), order=order)
        f = acquire(path)
        boxes = [Box.whole(shape), Box((39, 0), (40, 50)), Box((30, 45), (40, 50)), Box((0, 49), (40, 50))]
        os.truncate(path, f.identity.size - cut)
        for box in boxes:
            plan = plan_read(f.header, box)
            backend = choose_backend(self.backend_name, f, plan, None)
            with pytest.raises(FileChangedError, match="truncated") as info:
                backend.read(f, plan, config.read_options())
            assert path in str(info.value)

    @pytest.mark.parametrize(
        "cut", ["last_byte", "4096", "half_payload", "whole_payload", "in_header", "in_preamble", "empty"]
    )
    def test_truncated_before_open(self, npy: Callable[..., str], cut: str) -> None:
        path = npy(sample_array((30, 40), ">f4", seed=13))
        header = npydask.read_header(path)
        end = header.data_offset + header.nbytes
        new_size = {
            "last_byte": end - 1,
            "4096": end - 4096,
            "half_payload": header.data_offset + header.nbytes // 2,
            "whole_payload": header.data_offset,
            "in_header": header.data_offset - 20,
            "in_preamble": 9,
            "empty": 0,
        }[cut]
        os.truncate(path, new_size)
        with pytest.raises(NpyFormatError) as info:
            self.read(path)
        assert path in str(info.value)
        with pytest.raises(NpyFormatError):
            self.read(path, (0, 0), (1, 1))
        with pytest.raises(NpyFormatError):
            self.ref(path)

    # ---------------------------------------------------------------- pickling

    def test_pickle_round_trip(self, npy: Callable[..., str]) -> None:
        path = npy(sample_array((6, 7), DTYPES[-3], seed=14), order="F")
        ref = self.ref(path)
        data = pickle.dumps(ref, protocol=pickle.HIGHEST_PROTOCOL)
        assert len(data) < 2048, f"a pickled FileRef takes {len(data)} bytes"
        back = pickle.loads(data)
        assert back == ref
        assert back.options.direct_io is self.direct_io
        assert back.backend == self.backend_name
        box = Box((1, 2), (5, 7))
        assert_same_array(back.read(box), expected_region(np.load(path), box.start, box.stop), "unpickled")
        for value in (box, ref.header, ref.options, ref.identity):
            assert pickle.loads(pickle.dumps(value)) == value

    def test_pickle_task_object(self, npy: Callable[..., str]) -> None:
        array_module = pytest.importorskip("npydask.array")
        wrapper = getattr(array_module, "NpyFileArray", None)
        if wrapper is None:
            pytest.skip("npydask.array has no NpyFileArray")
        path = npy(sample_array((8, 9), ">f8", seed=15))
        obj = wrapper(self.ref(path))
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        assert len(data) < 2048, f"a pickled {type(obj).__name__} takes {len(data)} bytes"
        back = pickle.loads(data)
        np.testing.assert_array_equal(back[2:5, 1:8], np.load(path)[2:5, 1:8])

    def test_read_after_unpickling_in_fresh_process(self, npy: Callable[..., str], tmp_path: Path) -> None:
        cases = [
            (sample_array((5, 6, 7), "<f4", seed=16), "C", ((1, 2, 3), (4, 6, 7))),
            (sample_array((5, 6, 7), ">i2", seed=17), "F", ((0, 1, 2), (5, 3, 7))),
            (sample_array((9, 4), DTYPES[-2], seed=18), "C", ((2, 0), (9, 4))),
            (sample_array((), "<c16", seed=19), "C", ((), ())),
        ]
        jobs, expected = [], []
        for values, order, (start, stop) in cases:
            path = npy(values, order=order)
            jobs.append((self.ref(path), start, stop))
            expected.append(expected_region(np.load(path), start, stop))
        jobs_file = tmp_path / "jobs.pkl"
        jobs_file.write_bytes(pickle.dumps(jobs, protocol=pickle.HIGHEST_PROTOCOL))
        results = tmp_path / "results"
        results.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("NPYDASK_")}
        proc = subprocess.run(
            [sys.executable, "-W", "error::UserWarning", "-c", _CHILD, str(jobs_file), str(results),
             "1" if self.direct_io else "0"],
            capture_output=True, text=True, env=env, timeout=120, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        for k, exp in enumerate(expected):
            assert_same_array(np.load(results / f"{k}.npy"), exp, f"case {k} in a fresh process")

    # ---------------------------------------------------------------- gap settings

    @pytest.mark.parametrize("order", ["C", "F"])
    def test_gap_settings_agree(self, npy: Callable[..., str], order: str) -> None:
        shape = (6, 7, 9, 5)
        path = npy(sample_array(shape, "<i8", seed=20), order=order)
        full = np.load(path)
        regions = random_regions(shape, 25, seed=21) + [((1, 1, 1, 1), (5, 6, 8, 4)), ((0, 0, 0, 2), (6, 7, 9, 3))]
        settings = [
            {"gap_bytes": 0},
            {"gap_bytes": 1 << 40},
            {"gap_bytes": 64},
            {"gap_bytes": 1 << 40, "max_span_bytes": 0},
            {"gap_bytes": 1 << 40, "max_span_bytes": 1000},
        ]
        for start, stop in regions:
            expected = expected_region(full, start, stop)
            for setting in settings:
                with config.set(**setting):
                    ref = self.ref(path)
                    assert ref.options.gap_bytes == setting["gap_bytes"]
                    got = self.read(path, start, stop)
                    by_ref = ref.read(Box(start, stop))
                what = f"{setting} [{start}, {stop})"
                assert_same_array(got, expected, what)
                assert_same_array(by_ref, expected, what)
