"""The conformance suite every storage source passes (zarr's ``testing/store.py`` style).

:class:`SourceConformance` is written against the
:class:`~npydask.storage.base.Source` interface only. A subclass says how to
put, replace and remove a file in its storage and how to make reads come back
short, and inherits every check::

    from npydask.testing.source_conformance import SourceConformance

    class TestMySource(SourceConformance):
        @pytest.fixture
        def source(self):
            return MySource(...)

        @pytest.fixture
        def short_reads(self, monkeypatch):
            ...  # make each read return fewer bytes than asked for

        def put(self, where, name, array): ...
        def put_bytes(self, where, name, data): ...
        def remove(self, path): ...
        def get_bytes(self, path): ...

The checks cover identities (stable, changed by a rewrite, a missing file
named), ``scan`` (headers, raw header bytes, failures reported in place),
``read_runs``, ``read_opened`` (of a file ``open`` returned, ``.npz``
members included) and ``read_many`` against :func:`numpy.load` over several
dtypes, orders and regions, files changed or removed after scanning, header
bytes that differ from the expected ones, and short reads.
:class:`~npydask.testing.conformance.BackendConformance` is the same for the
host backends.

This module imports pytest: import it from tests only.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npydask.config import read_options
from npydask.errors import FileChangedError, NpyFormatError
from npydask.plan.patch_runs import Spans
from npydask.plan.region import normalize_box, plan_read
from npydask.storage import HeaderCheck
from npydask.storage.base import Source

__all__ = ["SOURCE_ARRAYS", "SOURCE_BOXES", "SourceConformance"]

SOURCE_ARRAYS: dict[str, Callable[[], np.ndarray]] = {
    "c3d-f4": lambda: np.arange(6 * 7 * 9, dtype="<f4").reshape(6, 7, 9),
    "f3d-i2": lambda: np.asfortranarray(np.arange(5 * 8 * 3, dtype="<i2").reshape(5, 8, 3)),
    "c2d-be-f8": lambda: np.arange(11 * 13, dtype=">f8").reshape(11, 13),
    "c1d-u1": lambda: np.arange(200, dtype=np.uint8),
    "struct": lambda: np.array([(i, i * 0.5) for i in range(17)], dtype=[("a", "<i4"), ("b", "<f8")]),
}
"""Arrays every source reads back (C and Fortran order, both byte orders, a structured dtype)."""

SOURCE_BOXES: list[tuple[float, float] | None] = [None, (0.0, 1.0), (0.3, 0.7), (0.5, 0.51), (0.9, 1.0)]
"""Regions as fractions of each axis (``None``: the whole array)."""


def _box(shape: tuple[int, ...], frac: tuple[float, float] | None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if frac is None:
        return (0,) * len(shape), shape
    start = tuple(int(n * frac[0]) for n in shape)
    stop = tuple(max(a + 1, int(n * frac[1])) if n else 0 for a, n in zip(start, shape))
    return start, tuple(min(b, n) for b, n in zip(stop, shape))


def _scanned(source: Source, paths: list[str]) -> list[tuple[Any, ...]]:
    """``source.scan(paths)``, a failure in place raised (for checks that expect none)."""
    found = source.scan(paths)
    for f in found:
        if isinstance(f, BaseException):
            raise f
    return found  # type: ignore[return-value]


class SourceConformance:
    """Checks every :class:`~npydask.storage.base.Source` passes; subclass and provide the hooks.

    A subclass gives the ``source`` and ``short_reads`` fixtures and the
    storage hooks :meth:`put`, :meth:`put_bytes`, :meth:`remove` and
    :meth:`get_bytes`; it inherits every check. The oracle is
    :func:`numpy.load` of the stored bytes (:meth:`load`).
    """

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
        """Store ``data`` as they are under ``name``; return what the source reads it by."""
        raise NotImplementedError

    def remove(self, path: str) -> None:
        """Delete the stored file ``path``."""
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

    @pytest.mark.parametrize("kind", sorted(SOURCE_ARRAYS))
    def test_scan_gives_headers_raw_bytes_and_identities(self, source: Source, tmp_path: Path, kind: str) -> None:
        values = SOURCE_ARRAYS[kind]()
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

    @pytest.mark.parametrize("frac", SOURCE_BOXES)
    @pytest.mark.parametrize("kind", sorted(SOURCE_ARRAYS))
    @pytest.mark.parametrize("gap", [0, 64, 4096])
    def test_read_runs_equals_numpy(self, source: Source, tmp_path: Path, kind: str, frac: Any, gap: int) -> None:
        values = SOURCE_ARRAYS[kind]()
        p = self.put(tmp_path, "a.npy", values)
        identity, header, raw, _ = _scanned(source, [p])[0]
        start, stop = _box(values.shape, frac)
        plan = plan_read(header, normalize_box(header.shape, start, stop))
        dest = np.full(plan.nbytes, 0xAB, np.uint8)
        options = read_options(gap_bytes=gap)
        source.read_runs(p, identity, plan, dest, options, HeaderCheck(raw, "the test", "none"))
        region = self.load(p)[tuple(slice(a, b) for a, b in zip(start, stop))]
        assert dest.tobytes() == region.tobytes(order="F" if header.fortran_order else "C")

    def test_read_runs_refuses_a_changed_file(self, source: Source, tmp_path: Path) -> None:
        p = self.put(tmp_path, "a.npy", np.arange(100, dtype="<i8"))
        identity, header, _, _ = _scanned(source, [p])[0]
        self.remove(p)
        self.put(tmp_path, "a.npy", np.arange(100, 201, dtype="<i8"))  # (another size: an inode may be reused)
        plan = plan_read(header, normalize_box(header.shape, (10,), (20,)))
        dest = np.zeros(plan.nbytes, np.uint8)
        with pytest.raises(FileChangedError, match="a.npy"):
            source.read_runs(p, identity, plan, dest, read_options())

    def test_read_runs_refuses_other_header_bytes(self, source: Source, tmp_path: Path) -> None:
        p = self.put(tmp_path, "a.npy", np.arange(100, dtype="<i8"))
        identity, header, _, _ = _scanned(source, [p])[0]
        other = _scanned(source, [self.put(tmp_path, "b.npy", np.arange(100, dtype="<u8"))])[0][2]
        plan = plan_read(header, normalize_box(header.shape, None, None))
        with pytest.raises(NpyFormatError, match="a.npy.*from the index"):
            source.read_runs(
                p,
                identity,
                plan,
                np.zeros(plan.nbytes, np.uint8),
                read_options(),
                HeaderCheck(other, "the index", "rebuild it"),
            )

    def test_read_runs_missing_file_names_it(self, source: Source, tmp_path: Path) -> None:
        p = self.put(tmp_path, "a.npy", np.arange(10))
        identity, header, _, _ = _scanned(source, [p])[0]
        self.remove(p)
        plan = plan_read(header, normalize_box(header.shape, None, None))
        with pytest.raises(FileNotFoundError, match="a.npy"):
            source.read_runs(p, identity, plan, np.zeros(plan.nbytes, np.uint8), read_options())

    # -- read_opened -----------------------------------------------------------------------

    @pytest.mark.parametrize("frac", SOURCE_BOXES)
    @pytest.mark.parametrize("kind", sorted(SOURCE_ARRAYS))
    def test_read_opened_equals_numpy(self, source: Source, tmp_path: Path, kind: str, frac: Any) -> None:
        values = SOURCE_ARRAYS[kind]()
        p = self.put(tmp_path, "a.npy", values)
        identity, header, raw, _ = _scanned(source, [p])[0]
        f = source.open(p, identity, check=HeaderCheck(raw, "the test", "none"))
        assert (f.identity, f.header, f.raw, f.member, f.deflated) == (identity, header, raw, None, False)
        start, stop = _box(values.shape, frac)
        plan = plan_read(f.header, normalize_box(header.shape, start, stop))
        dest = np.full(plan.nbytes, 0xAB, np.uint8)
        source.read_opened(f, plan, dest, read_options(gap_bytes=64))
        f.check_unchanged()
        region = self.load(p)[tuple(slice(a, b) for a, b in zip(start, stop))]
        assert dest.tobytes() == region.tobytes(order="F" if header.fortran_order else "C")

    @pytest.mark.parametrize("frac", [None, (0.3, 0.7)])
    def test_read_opened_reads_a_stored_npz_member(self, source: Source, tmp_path: Path, frac: Any) -> None:
        values = {"x": SOURCE_ARRAYS["c3d-f4"](), "y": SOURCE_ARRAYS["f3d-i2"]()}
        archive = io.BytesIO()
        np.savez(archive, x=values["x"], y=values["y"])
        p = self.put_bytes(tmp_path, "m.npz", archive.getvalue())
        for key, expected in values.items():
            f = source.open(p, key=key)
            assert f.member is not None and f.member.stored and not f.deflated
            start, stop = _box(expected.shape, frac)
            plan = plan_read(f.header, normalize_box(f.header.shape, start, stop))
            dest = np.zeros(plan.nbytes, np.uint8)
            source.read_opened(f, plan, dest, read_options())
            f.check_unchanged()
            region = expected[tuple(slice(a, b) for a, b in zip(start, stop))]
            assert dest.tobytes() == region.tobytes(order="F" if f.header.fortran_order else "C")

    @pytest.mark.parametrize("how", ["read_opened", "read_spans"])
    def test_reading_a_replaced_opened_file_never_gives_the_new_bytes(
        self, source: Source, tmp_path: Path, how: str
    ) -> None:
        """The opened file's bytes, or ``FileChangedError`` naming it: never the replacement's."""
        p = self.put(tmp_path, "a.npy", np.arange(100, dtype="<i8"))
        f = source.open(p, source.identity(p))
        self.remove(p)
        self.put(tmp_path, "a.npy", np.arange(100, 200, dtype="<i8"))
        plan = plan_read(f.header, normalize_box(f.header.shape, (10,), (20,)))
        dest = np.zeros(plan.nbytes, np.uint8)
        error: FileChangedError | None = None
        try:
            if how == "read_opened":
                source.read_opened(f, plan, dest, read_options())
            else:
                one = np.zeros(1, np.int64)
                source.read_spans(f, Spans(one + plan.offset, one + plan.nbytes, one), dest, read_options())
            f.check_unchanged()
        except FileChangedError as e:  # (an object: its reads are conditional on the opened ETag)
            error = e
        if error is None:  # (a local file: the open descriptor still reads the file it opened)
            assert dest.tobytes() == np.arange(10, 20, dtype="<i8").tobytes()
        else:
            assert "a.npy" in str(error)

    # -- read_spans ------------------------------------------------------------------------

    def test_read_spans_lands_each_span_at_its_position(self, source: Source, tmp_path: Path) -> None:
        values = np.arange(5000, dtype="<i4")
        p = self.put(tmp_path, "a.npy", values)
        f = source.open(p, source.identity(p))
        raw = values.tobytes()
        off = f.header.data_offset
        starts, lengths = [0, 1000, 7000, 19_000], [16, 3000, 4, 1000]  # (payload byte offsets, disjoint)
        positions = np.cumsum([0, *lengths[:-1]])
        spans = Spans(np.array(starts, np.int64) + off, np.array(lengths, np.int64), positions.astype(np.int64))
        dest = np.full(spans.nbytes, 0xAB, np.uint8)
        requests = source.read_spans(f, spans, dest, read_options())
        f.check_unchanged()
        assert requests >= len(starts)
        assert dest.tobytes() == b"".join(raw[a : a + n] for a, n in zip(starts, lengths))
        empty = Spans(*(np.zeros(0, np.int64) for _ in range(3)))
        assert source.read_spans(f, empty, np.zeros(0, np.uint8), read_options()) == 0

    # -- read_many -------------------------------------------------------------------------

    @pytest.mark.parametrize("checked", [False, True])
    @pytest.mark.parametrize("skip", [0, 8])
    def test_read_many_equals_numpy(self, source: Source, tmp_path: Path, checked: bool, skip: int) -> None:
        rng = np.random.default_rng(7)
        arrays = [rng.standard_normal((4, 5)).astype("<f8") for _ in range(9)]
        paths = [self.put(tmp_path, f"s{i}.npy", a) for i, a in enumerate(arrays)]
        scanned = _scanned(source, paths)
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
        scanned = _scanned(source, paths)
        self.remove(paths[1])
        items = [(p, s[0], s[1].data_offset, None) for p, s in zip(paths, scanned)]
        with pytest.raises(FileNotFoundError, match="s1.npy"):
            source.read_many(items, memoryview(bytearray(64 * 3)), 64)

    def test_read_many_refuses_a_changed_file(self, source: Source, tmp_path: Path) -> None:
        paths = [self.put(tmp_path, f"s{i}.npy", np.arange(8)) for i in range(3)]
        scanned = _scanned(source, paths)
        self.remove(paths[2])
        self.put(tmp_path, "s2.npy", np.arange(9))
        items = [(p, s[0], s[1].data_offset, None) for p, s in zip(paths, scanned)]
        with pytest.raises(FileChangedError, match="s2.npy"):
            source.read_many(items, memoryview(bytearray(64 * 3)), 64)

    def test_read_many_refuses_other_header_bytes(self, source: Source, tmp_path: Path) -> None:
        p = self.put(tmp_path, "s.npy", np.arange(8, dtype="<i8"))
        q = self.put(tmp_path, "t.npy", np.arange(8, dtype="<u8"))
        (ident, header, _, _), (_, _, other, _) = _scanned(source, [p, q])
        with pytest.raises(NpyFormatError, match="s.npy"):
            source.read_many(
                [(p, ident, header.data_offset, HeaderCheck(other, "x", "y"))], memoryview(bytearray(64)), 64
            )

    # -- small whole files -----------------------------------------------------------------

    def test_write_bytes_replaces_whole_and_read_bytes_reads_it_back(self, source: Source, tmp_path: Path) -> None:
        p = self.put_bytes(tmp_path, "small.bin", b"old bytes, longer than the new ones")
        source.write_bytes(p, b"new", what="test file")
        assert self.get_bytes(p) == b"new"  # (read around the source: no old tail left)
        assert source.read_bytes(p) == b"new"
        data = bytes(range(256)) * 5
        source.write_bytes(p, data)
        assert source.read_bytes(p) == self.get_bytes(p) == data
        source.write_bytes(p, b"")
        assert source.read_bytes(p) == b""

    def test_read_bytes_with_a_limit_reads_only_the_first_bytes(self, source: Source, tmp_path: Path) -> None:
        data = bytes(range(200))
        p = self.put_bytes(tmp_path, "long.bin", data)
        assert source.read_bytes(p, 11) == data[:11]
        assert source.read_bytes(p, 200) == source.read_bytes(p, 10_000) == data

    def test_read_bytes_of_a_missing_file_names_it(self, source: Source, tmp_path: Path) -> None:
        p = self.put_bytes(tmp_path, "gone.bin", b"x")
        self.remove(p)
        with pytest.raises(FileNotFoundError) as e:
            source.read_bytes(p, what="test file")
        assert source.display(p) in str(e.value)

    # -- short reads -----------------------------------------------------------------------

    @pytest.mark.usefixtures("short_reads")
    def test_short_reads_still_give_every_byte(self, source: Source, tmp_path: Path) -> None:
        values = np.arange(3 * 40 * 50, dtype="<f4").reshape(3, 40, 50)
        paths = [self.put(tmp_path, f"v{i}.npy", values + i) for i in range(3)]
        scanned = _scanned(source, paths)
        assert all(not isinstance(s, BaseException) for s in scanned), scanned
        identity, header, raw, _ = scanned[0]
        plan = plan_read(header, normalize_box(header.shape, (1, 5, 7), (3, 30, 41)))
        dest = np.zeros(plan.nbytes, np.uint8)
        source.read_runs(paths[0], identity, plan, dest, read_options(), HeaderCheck(raw, "t", "t"))
        assert dest.tobytes() == values[1:3, 5:30, 7:41].tobytes()
        dest[:] = 0
        source.read_opened(source.open(paths[0], identity), plan, dest, read_options())
        assert dest.tobytes() == values[1:3, 5:30, 7:41].tobytes()
        items = [(p, s[0], s[1].data_offset, HeaderCheck(s[2], "t", "t")) for p, s in zip(paths, scanned)]
        dest2 = bytearray(values.nbytes * 3)
        source.read_many(items, memoryview(dest2), values.nbytes)
        assert bytes(dest2) == b"".join((values + i).tobytes() for i in range(3))
