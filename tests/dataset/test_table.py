"""FileTable and FileViews agree with the per-file lists and objects they replace, row by row."""

from __future__ import annotations

import io
import os
import pickle
import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npydask.config import read_options
from npydask.dataset.table import FileTable, Strings, TableBuilder, common_root
from npydask.dataset.views import Context, FileViews
from npydask.format.header import NpyHeader
from npydask.plan.roi import RoiArgs, resolve_roi
from npydask.storage import FileIdentity, HeaderCheck, InodeIdentity
from npydask.storage.local import LOCAL
from npydask.storage.object import ObjectIdentity

H1 = NpyHeader((1, 0), (4, 5), np.dtype("<f4"), False, 128, 80)
H2 = NpyHeader((1, 0), (2, 3), np.dtype(">i2"), True, 128, 12)
H3 = NpyHeader((3, 0), (7,), np.dtype("<u1"), False, 64, 7)
C1 = HeaderCheck(b"\x93NUMPY\x01\x00one", "the header read when the dataset was opened", "open it again", True)
C2 = HeaderCheck(b"\x93NUMPY\x01\x00two", "the header index '/i.json'", "delete '/i.json'", False)
ENTRIES = [(H1, C1), (H1, C2), (H2, C1), (H3, None)]
ROI_A = resolve_roi(RoiArgs.from_user(roi_start=[1, 1], roi_shape=[2, 2]), (4, 5), "f4")
ROI_B = resolve_roi(RoiArgs.from_user(roi_start=[0, 0], roi_end=[6, 2], out_of_bounds_policy="pad"), (4, 5), "f4")
ROIS = [None, ROI_A, ROI_B]

# names: any text a file system or store can hold (no NUL), and non-UTF-8 bytes as os.fsdecode gives them
_text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0"), min_size=1, max_size=12)
_raw = st.binary(min_size=1, max_size=12).filter(lambda b: b"\0" not in b).map(os.fsdecode)
_name = st.one_of(_text, _raw, st.sampled_from(["a b.npy", "é.npy", "d0001/s0000001.npy"]))
_local = st.builds(FileIdentity, st.integers(0, 2**62), st.integers(-(2**62), 2**62), st.integers(0, 2**64 - 1))
_object = st.builds(
    ObjectIdentity, st.integers(-1, 2**62), st.none() | st.text(max_size=8), st.none() | st.text(max_size=8)
)


def rows_of(t: FileTable) -> list[tuple]:
    """Every fact of every row, through the one-row accessors."""
    return [(t.path(i), t.identity(i), t.header(i), t.check(i), t.roi(i), t.is_deflated(i)) for i in range(len(t))]


@st.composite
def tables(draw, max_rows: int = 20):
    """(table, the lists it was built from as rows)."""
    n = draw(st.integers(0, max_rows))
    prefix = draw(st.sampled_from(["/data/set/", "s3://bucket/pre fix/", "", "/"]))
    paths = [prefix + draw(_name) for _ in range(n)]
    identities = [draw(_object if prefix.startswith("s3") else _local) for _ in range(n)]
    entries = [draw(st.sampled_from(ENTRIES)) for _ in range(n)]
    roi_kind = draw(st.sampled_from(["none", "shared", "per-file"]))
    rois = (
        None
        if roi_kind == "none"
        else ROI_A
        if roi_kind == "shared"
        else [draw(st.sampled_from(ROIS)) for _ in range(n)]
    )
    deflated = draw(st.none() | st.just([draw(st.booleans()) for _ in range(n)]))
    t = FileTable.from_lists(
        paths, identities, [e[0] for e in entries], [e[1] for e in entries], rois, deflated=deflated
    )
    per_roi = rois if isinstance(rois, list) else [rois] * n
    expected = [
        (p, i, e[0], e[1], r, bool(deflated and deflated[k]))
        for k, (p, i, e, r) in enumerate(zip(paths, identities, entries, per_roi))
    ]
    return t, expected


_hyp = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_hyp
@given(tables())
def test_round_trip_against_lists(case):
    t, expected = case
    assert len(t) == len(expected)
    assert rows_of(t) == expected
    assert t.paths() == [r[0] for r in expected]
    assert t.identities() == [r[1] for r in expected]
    assert [type(x) for x in t.identities()] == [type(r[1]) for r in expected]
    assert list(t.rows()) == [(r[0], r[1], t.headers.index((r[2], r[3])), t.rois.index(r[4])) for r in expected]
    if expected:
        assert (t.path(-1), t.identity(-1), t.header(-1), t.check(-1), t.roi(-1), t.is_deflated(-1)) == expected[-1]


@_hyp
@given(tables(), st.data())
def test_slices_takes_and_pickles_equal_the_rows(case, data):
    t, expected = case
    n = len(t)
    a = data.draw(st.integers(-n - 2, n + 2))
    b = data.draw(st.integers(-n - 2, n + 2))
    step = data.draw(st.sampled_from([None, 1, 2, -1, -3]))
    part = t[a:b:step]
    assert rows_of(part) == expected[a:b:step]
    idx = data.draw(st.lists(st.integers(-n, n - 1), max_size=30)) if n else []
    taken = t.take(idx)
    assert rows_of(taken) == [expected[i] for i in idx]
    for sub, rows in ((part, expected[a:b:step]), (taken, [expected[i] for i in idx])):
        back = pickle.loads(pickle.dumps(sub, protocol=5))
        assert rows_of(back) == rows
        assert back.token() == sub.token()
        rebuilt = FileTable.from_lists(
            [r[0] for r in rows],
            [r[1] for r in rows],
            [r[2] for r in rows],
            [r[3] for r in rows],
            [r[4] for r in rows],
            deflated=[r[5] for r in rows],
            root=sub.root,
        )
        assert rebuilt.token() == sub.token()  # however it was made, equal rows hash alike


def test_rows_without_last_modified_hash_alike_however_taken():
    ids = [ObjectIdentity(0, "e", None), ObjectIdentity(0, "e", None), ObjectIdentity(0, None, "Tue")]
    t = FileTable.from_lists(["s3://b/p/0", "s3://b/p/1", "s3://b/p/2"], ids, [H1] * 3, [C1] * 3)
    for sub in (t[:2], t.take([1, 0]), t[:1]):  # (a Last-Modified column holding only missing values)
        rebuilt = FileTable.from_lists(sub.paths(), sub.identities(), [H1] * len(sub), [C1] * len(sub), root=sub.root)
        assert rebuilt.modified is None and rebuilt.token() == sub.token()
    assert (
        t.token()
        != FileTable.from_lists(t.paths(), ids[:2] + [ObjectIdentity(0, None, "Wed")], [H1] * 3, [C1] * 3).token()
    )


def _bench_table(n: int) -> FileTable:
    paths = [f"/data/scale/d{i // 1000:04d}/s{i:07d}.npy" for i in range(n)]
    ids = [FileIdentity(4224, 1_700_000_000_000_000_000 + i, 5_000_000 + i) for i in range(n)]
    entries = [ENTRIES[i % 7 == 0] for i in range(n)]
    return FileTable.from_lists(
        paths, ids, [e[0] for e in entries], [e[1] for e in entries], [ROIS[i % 3] for i in range(n)]
    )


def test_a_slice_shares_the_buffers_and_pickles_only_its_own_rows():
    t = _bench_table(3000)
    part = t[1000:1100]
    assert part.names is t.names
    assert np.shares_memory(part.ends, t.ends) and np.shares_memory(part.size, t.size)
    assert part.path(0) == "/data/scale/d0001/s0001000.npy"
    blob = pickle.dumps(part, protocol=5)
    back = pickle.loads(blob)
    assert len(back.names) == int(part.ends[-1]) - int(t.ends[999]) == 100 * len("d0001/s0001000.npy")
    assert back.ends[0] == len("d0001/s0001000.npy") and back.ends.flags.writeable is False
    assert len(blob) < 100 * 60 + 3000  # ~50 B/file plus the entries: nothing of the other 2,900 rows
    one = t[3:4]  # row 3: header entry 0 only, no ROI
    back = pickle.loads(pickle.dumps(one))
    assert back.headers == ((H1, C1),) and back.header_id is None and back.rois == (None,) and back.roi_id is None
    assert rows_of(back) == rows_of(one)


_ALLOWED = {
    ("npydask.config", "ReadOptions"),
    ("npydask.format.header", "NpyHeader"),
    ("npydask.plan.region", "Box"),
    ("npydask.plan.roi", "FileRoi"),
    ("npydask.storage.identity", "HeaderCheck"),
    ("npydask.storage.local", "LOCAL"),
    ("npydask.dataset.views", "Context"),
    ("npydask.dataset.views", "FileViews"),
    ("npydask.dataset._strings", "Strings"),
    ("npydask.dataset.table", "_rebuild"),
}
_NUMPY = {"dtype", "scalar", "_frombuffer", "_reconstruct", "ndarray"}  # (numpy's own array and dtype reducers)


def test_pickles_carry_only_npydask_types_numpy_arrays_and_builtins():
    t = FileTable.from_lists(
        ["s3://b/x.npy", "s3://b/y.npy"],
        [ObjectIdentity(5, "e1"), ObjectIdentity(6, None, "t")],
        [H1, H2],
        [C1, None],
        [ROI_A, ROI_B],
        deflated=[True, False],
    )
    views = FileViews(t, Context(read_options(), "pread", "m", LOCAL))
    seen: set[tuple[str, str]] = set()

    class Recording(pickle.Unpickler):
        def find_class(self, module, name):
            seen.add((module, name))
            return super().find_class(module, name)

    for obj in (t, views, _bench_table(50)[5:20]):
        back = Recording(io.BytesIO(pickle.dumps(obj, protocol=5))).load()
        assert type(back) is type(obj)
    assert ("npydask.dataset.table", "_rebuild") in seen
    assert {g for g in seen if g[0].split(".")[0] != "numpy"} <= _ALLOWED
    assert {n for m, n in seen if m.split(".")[0] == "numpy"} <= _NUMPY


def test_token_is_stable_across_processes():
    code = (
        "from tests.dataset.test_table import _bench_table; t = _bench_table(2000); "
        "print(t.token(), t[100:900].token(), t.take([5, 1, 5]).token())"
    )
    env = dict(os.environ, PYTHONHASHSEED="123")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env, cwd=root
    ).stdout.split()
    t = _bench_table(2000)
    assert out == [t.token(), t[100:900].token(), t.take([5, 1, 5]).token()]


def test_token_changes_with_every_field():
    paths = ["/d/a.npy", "/d/b.npy", "/d/c.npy"]
    ids = [FileIdentity(100, 1, 10), FileIdentity(100, 2, 11), FileIdentity(100, 3, 12)]
    heads, checks, rois = [H1, H1, H2], [C1, C1, C1], [None, ROI_A, None]

    def token(**change):
        args = dict(paths=paths, ids=ids, heads=heads, checks=checks, rois=rois, deflated=None)
        args.update(change)
        return FileTable.from_lists(
            args["paths"], args["ids"], args["heads"], args["checks"], args["rois"], deflated=args["deflated"]
        ).token()

    base = token()
    variants = [
        token(paths=["/d/a.npy", "/d/b.npy", "/d/d.npy"]),
        token(paths=["/e/a.npy", "/e/b.npy", "/e/c.npy"]),
        token(ids=[ids[0], FileIdentity(101, 2, 11), ids[2]]),
        token(ids=[ids[0], FileIdentity(100, 9, 11), ids[2]]),
        token(ids=[ids[0], FileIdentity(100, 2, 99), ids[2]]),
        token(heads=[H1, H2, H2]),
        token(heads=[H1, H1, NpyHeader((1, 0), (2, 3), np.dtype("<i2"), True, 128, 12)]),  # byte order only
        token(checks=[C1, C2, C1]),
        token(checks=[C1, C1, None]),
        token(rois=[None, ROI_B, None]),
        token(rois=[None, None, None]),
        token(deflated=[False, True, False]),
        token(paths=paths[::-1]),
    ]
    assert len({base, *variants}) == len(variants) + 1
    assert token() == base
    objects = [
        ObjectIdentity(5, "a"),
        ObjectIdentity(5, None),
        ObjectIdentity(5, ""),
        ObjectIdentity(5, None, "m"),
        ObjectIdentity(6, "a"),
    ]
    tokens = {FileTable.from_lists(["s3://b/k"], [o], [H1]).token() for o in objects}
    assert len(tokens) == len(objects)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: FileTable.from_lists(["/a", "/b"], [FileIdentity(1, 1, 1)], [H1, H1]), "identities has 1 entries"),
        (lambda: FileTable.from_lists(["/a"], [FileIdentity(1, 1, 1)], [H1, H1]), "headers has 2 entries"),
        (lambda: FileTable.from_lists(["/a"], [FileIdentity(1, 1, 1)], [H1], [C1, C1]), "checks has 2"),
        (lambda: FileTable.from_lists(["/a"], [FileIdentity(1, 1, 1)], [H1], rois=[None, None]), "rois has 2"),
        (
            lambda: FileTable.from_lists(["/a", "/b"], [FileIdentity(1, 1, 1), ObjectIdentity(1, "e")], [H1, H1]),
            "must all be FileIdentity, all InodeIdentity or all ObjectIdentity",
        ),
        (lambda: FileTable.from_lists(["/a/x"], [FileIdentity(1, 1, 1)], [H1], root="/b/"), "does not prefix"),
        (lambda: FileTable.from_lists(["/a/\ud800"], [FileIdentity(1, 1, 1)], [H1]), "cannot be stored"),
        (lambda: FileTable.from_lists(["/a"], [FileIdentity(1, 1, -1)], [H1]), "ino column must hold uint64"),
        (lambda: FileTable.from_lists(["/a"], [FileIdentity(-2, 1, 1)], [H1]), "-1 when unknown; found -2"),
        (
            lambda: FileTable.from_columns(
                "/", b"ab", [1, 2, 3], size=[1, 1, 1], mtime_ns=[1] * 3, ino=[1] * 3, headers=[(H1, None)]
            ),
            "rise from 0 to len(names) = 2",
        ),
        (
            lambda: FileTable.from_columns(
                "/", b"abc", [2, 1, 3], size=[1] * 3, mtime_ns=[1] * 3, ino=[1] * 3, headers=[(H1, None)]
            ),
            "rise from 0",
        ),
        (lambda: FileTable.from_columns("/", b"ab", [], size=[], mtime_ns=[], ino=[]), "no names, found 2 bytes"),
        (
            lambda: FileTable.from_columns(
                "/", b"ab", [1, 2], size=[1], mtime_ns=[1, 1], ino=[1, 1], headers=[(H1, None)]
            ),
            "size column has 1 rows but the table has 2",
        ),
        (
            lambda: FileTable.from_columns(
                "/", b"ab", [1, 2], size=[1, 1], mtime_ns=[1, 1], ino=[1, 1], headers=[(H1, None)], header_id=[0, 1]
            ),
            "header_id 1 is out of range",
        ),
        (
            lambda: FileTable.from_columns(
                "/", b"ab", [1, 2], size=[1, 1], mtime_ns=[1, 1], ino=[1, 1], headers=[(H1, None)], roi_id=[-1, 0]
            ),
            "roi_id -1 is out of range",
        ),
        (
            lambda: FileTable.from_columns("/", b"ab", [1, 2], size=[1, 1], mtime_ns=[1, 1], ino=[1, 1]),
            "needs at least one header entry",
        ),
        (
            lambda: FileTable.from_columns("/", b"a", [1], size=[1], mtime_ns=[1], ino=[1], headers=[H1]),
            "(NpyHeader, HeaderCheck or None) pairs",
        ),
        (
            lambda: FileTable.from_columns(
                "/", b"a", [1], size=[1], mtime_ns=[1], ino=[1], headers=[(H1, None)], rois=["roi"]
            ),
            "FileRoi or None",
        ),
        (
            lambda: FileTable.from_columns("/", b"a", [1], size=[1], mtime_ns=[1], headers=[(H1, None)]),
            "both mtime_ns and ino",
        ),
        (
            lambda: FileTable.from_columns(
                "/", b"a", [1], size=[1], mtime_ns=[1], ino=[1], headers=[(H1, None)], etag=Strings.of(["e"], "e")
            ),
            "either local identity columns",
        ),
        (
            lambda: FileTable.from_columns(
                "/", b"a", [1], size=[1], headers=[(H1, None)], etag=Strings.of(["e", "f"], "e")
            ),
            "etag column has 2 rows",
        ),
        (
            lambda: FileTable.from_columns(b"/", b"a", [1], size=[1], mtime_ns=[1], ino=[1], headers=[(H1, None)]),
            "root must be a str",
        ),
        (
            lambda: FileTable.from_columns("/", b"a", [[1]], size=[1], mtime_ns=[1], ino=[1], headers=[(H1, None)]),
            "one-dimensional",
        ),
    ],
)
def test_validation_names_what_is_wrong(build, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build()


def test_indexing_errors():
    t = _bench_table(5)
    with pytest.raises(IndexError, match="row 5 is out of range for a table of 5 files"):
        t.path(5)
    with pytest.raises(IndexError, match="row -7 is out of range"):
        t.take([0, -7])
    with pytest.raises(TypeError, match="indexed by integers"):
        t.header(True)
    with pytest.raises(TypeError, match=r"use t.path\(i\)"):
        t[0]
    with pytest.raises(AttributeError, match="immutable"):
        t.root = "/x/"
    with pytest.raises(ValueError, match="read-only"):
        t.size[0] = 1
    assert len(t[4:2]) == 0 and t[4:2].paths() == [] and len(pickle.loads(pickle.dumps(t[4:2]))) == 0


def test_empty_and_one_row_tables():
    empty = FileTable.from_lists([], [], [])
    assert len(empty) == 0 and empty.paths() == [] and list(empty.rows()) == [] and empty.identities() == []
    assert len(pickle.loads(pickle.dumps(empty))) == 0 and empty.token() == FileTable.from_lists([], [], []).token()
    assert repr(empty) == "FileTable(0 files, 0 header(s), 1 ROI(s))"
    one = FileTable.from_lists(["/x/only.npy"], [InodeIdentity(7)], [H3])  # headers="first": inode only
    assert rows_of(one) == [("/x/only.npy", InodeIdentity(7), H3, None, None, False)]
    assert type(one.identity(0)) is InodeIdentity and one.identities() == [InodeIdentity(7)]
    assert FileTable.from_lists(["/x/o.npy"], [FileIdentity(-1, -1, 7)], [H3]).identity(0) == InodeIdentity(7)
    assert one.layout().nbytes.tolist() == [7] and one.layout().shapes == ((7,),)


def test_common_root_and_builder():
    assert common_root(["/a/bc.npy", "/a/bd.npy"]) == "/a/"
    assert common_root(["rel.npy"]) == ""
    b = TableBuilder("/data/", [(H1, C1), (H2, None)])
    names = ["x.npy", os.fsdecode(b"\xff\xfe.npy"), "sub dir/é.npy"]
    for k, name in enumerate(names):
        b.add(name if k != 1 else os.fsencode(name), 10 + k, -1, 100 + k, k % 2)
    t = b.build()
    assert t.paths() == ["/data/" + n for n in names]
    assert os.fsencode(t.path(1)) == b"/data/\xff\xfe.npy"
    assert t.identities() == [FileIdentity(10, -1, 100), FileIdentity(11, -1, 101), FileIdentity(12, -1, 102)]
    assert [t.header(i) for i in range(3)] == [H1, H2, H1] and t.check(1) is None
    b.add("more.npy", 1, 1, 1)  # the builder goes on; the built table does not change
    assert len(t) == 3 and len(b.build()) == 4


def test_layout_and_items():
    t = _bench_table(40)
    layout = t.layout()
    shapes = [t.header(i).shape if t.roi(i) is None else t.roi(i).shape for i in range(len(t))]
    assert [layout.shapes[k] for k in layout.shape_id.tolist()] == shapes
    assert layout.shapes == tuple(sorted(set(shapes)))
    assert layout.nbytes.tolist() == [int(np.prod(s)) * t.header(i).dtype.itemsize for i, s in enumerate(shapes)]
    assert layout.fortran.tolist() == [t.header(i).fortran_order for i in range(len(t))]
    one = FileTable.from_lists(["/a/x", "/a/y"], [FileIdentity(1, 1, 1)] * 2, [H2, H2], rois=ROI_A)
    assert one.layout().shapes == (ROI_A.shape,) and one.layout().shape_id.tolist() == [0, 0]
    assert one.layout().fortran.tolist() == [True, True] and one.layout().nbytes.tolist() == [8, 8]
    empty = FileTable.from_lists([], [], []).layout()
    assert empty.shapes == () and len(empty.shape_id) == len(empty.nbytes) == len(empty.fortran) == 0
    offsets = [h.data_offset for h, _ in t.headers]
    assert t.items(offsets, 3, 9) == [
        (t.path(i), t.identity(i), t.header(i).data_offset, t.check(i)) for i in range(3, 9)
    ]
    big = _bench_table(9000)  # over one tolist() batch
    assert [r[0] for r in big.rows(10, 8500)] == big.paths()[10:8500]


def test_with_entries_shares_the_files_and_replaces_headers():
    t = _bench_table(30)[10:20]  # a slice: its base offset is kept
    member = t.with_entries([(H2, None), (H3, C2)], [0, 1] * 5, [None, ROI_A], [1] * 10, [True] * 10)
    assert member.names is t.names and np.shares_memory(member.ends, t.ends) and member.size is t.size
    assert member.paths() == t.paths() and member.identities() == t.identities()
    assert [member.header(i) for i in range(10)] == [H2, H3] * 5 and member.check(1) == C2
    assert {member.roi(i) for i in range(10)} == {ROI_A} and member.is_deflated(9)
    back = pickle.loads(pickle.dumps(member))
    assert rows_of(back) == rows_of(member) and back.token() == member.token() != t.token()
    with pytest.raises(ValueError, match="header_id column has 3 rows but the table has 10"):
        t.with_entries([(H2, None)], [0, 0, 0])
    with pytest.raises(ValueError, match="roi_id 2 is out of range"):
        t.with_entries([(H2, None)], rois=[None, ROI_A], roi_id=[2] * 10)


def test_a_tampered_pickle_is_refused_not_read():
    t = _bench_table(20)
    fn, args = t.__reduce__()
    bad_ends = np.array(args[2])
    bad_ends[3] = bad_ends[1]  # ends that go back
    with pytest.raises(ValueError, match="ends must rise"):
        fn(args[0], args[1], bad_ends, *args[3:])
    with pytest.raises(ValueError, match="header_id 5 is out of range"):
        fn(*args[:9], np.full(20, 5, np.int32), *args[10:])
    with pytest.raises(AttributeError, match="cannot delete 'root'"):
        del t.root


def _best_of(fn, repeat: int = 15) -> float:
    import time

    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def test_a_small_slice_decodes_only_its_own_names():
    """paths()/rows() of a slice cost its rows, not the shared buffer (which rows() re-slices per batch)."""
    t = _bench_table(300_000)  # a 5.4 MB names buffer
    part, alone = t[150_000:150_020], t[150_000:150_020].compact()
    assert part.paths() == alone.paths()
    ratio = _best_of(part.paths) / _best_of(alone.paths)
    assert ratio < 10, f"paths() of a 20-row slice took {ratio:.0f}x as long as of the same rows compacted"
