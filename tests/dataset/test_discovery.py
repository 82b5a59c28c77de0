"""npydask.dataset.select and .order: DALI's file selection order, list files, symlinks, and shard tables."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from npydask.dataset.order import SORTS, SWAP_PAIRS, dali_order, folder_order, matcher, natural_key, natural_swap
from npydask.dataset.select import DEFAULT_FILE_FILTER, select_files, select_listed
from npydask.errors import NpyDaskWarning
from npydask.plan.sampling import shard_range
from npydask.storage.local import LocalLister

needs_symlinks = pytest.mark.skipif(not hasattr(os, "symlink") or os.name == "nt", reason="POSIX symlinks")


def touch(root: Path, *rels: str) -> None:
    """Create empty files (and their folders) under ``root``."""
    for rel in rels:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()


def rel(paths: list[str], root: Path) -> list[str]:
    """The selected paths relative to ``root`` (after checking they are joined onto it)."""
    prefix = str(root) + os.sep
    assert all(isinstance(p, str) and p.startswith(prefix) for p in paths), paths
    return [p[len(prefix) :] for p in paths]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """Root files, two immediate subdirectories, a deeper one, and non-matching files."""
    touch(
        tmp_path,
        "b.npy", "a.npy", "notes.txt", "c.npy.bak",
        "s1/z.npy", "s1/y.npy",
        "s0/x.npy", "s0/deep/w.npy", "s0/deep/deeper/v.npy",
        "empty_dir/readme.md",
    )  # fmt: skip
    return tmp_path


# -- discovery order ---------------------------------------------------------------------------


def test_flat_order_root_files_then_each_immediate_subdir(tree):
    got = select_files(tree)
    assert rel(got, tree) == ["a.npy", "b.npy", "s0/x.npy", "s1/y.npy", "s1/z.npy"]


def test_paths_are_exactly_os_path_join_of_root_and_entry(tree):
    got = select_files(str(tree) + os.sep)  # a trailing separator is kept, as os.path.join does
    assert got[0] == os.path.join(str(tree) + os.sep, "a.npy")
    assert got[2] == os.path.join(str(tree) + os.sep, "s0/x.npy")


def test_relative_root_is_joined_not_resolved(tree, monkeypatch):
    monkeypatch.chdir(tree)
    assert select_files(".")[:3] == ["./a.npy", "./b.npy", "./s0/x.npy"]
    monkeypatch.chdir(tree.parent)
    assert select_files(tree.name, recursive=True)[0] == os.path.join(tree.name, "a.npy")


def test_pathlike_root_gives_str_paths(tree):
    assert select_files(tree) == select_files(str(tree))
    assert all(type(p) is str for p in select_files(tree))


def test_recursive_walks_every_depth_and_sorts_whole_relative_paths(tree):
    got = select_files(tree, recursive=True)
    assert rel(got, tree) == [
        "a.npy", "b.npy", "s0/deep/deeper/v.npy", "s0/deep/w.npy", "s0/x.npy", "s1/y.npy", "s1/z.npy",
    ]  # fmt: skip


def test_recursive_sorts_paths_byte_wise_not_root_files_first(tmp_path):
    # '-' (0x2d) < '.' (0x2e) < '/' (0x2f) < '0' (0x30): whole relative paths are compared.
    touch(tmp_path, "a.npy", "a/b.npy", "a0.npy", "a-.npy")
    assert rel(select_files(tmp_path, recursive=True), tmp_path) == ["a-.npy", "a.npy", "a/b.npy", "a0.npy"]
    # Without recursive, root files come first whatever their names.
    assert rel(select_files(tmp_path), tmp_path) == ["a-.npy", "a.npy", "a0.npy", "a/b.npy"]


def test_byte_wise_sorting_not_locale_not_natural(tmp_path):
    names = ["z.npy", "a2.npy", "B.npy", "a10.npy", "é.npy", "_.npy", "a.npy", "Z.npy", "ä.npy"]
    touch(tmp_path, *names)
    got = rel(select_files(tmp_path), tmp_path)
    assert got == ["B.npy", "Z.npy", "_.npy", "a.npy", "a10.npy", "a2.npy", "z.npy", "ä.npy", "é.npy"]
    assert got == sorted(names, key=lambda s: s.encode())


def test_subdirectories_sorted_byte_wise(tmp_path):
    touch(tmp_path, "b/1.npy", "B/1.npy", "a10/1.npy", "a2/1.npy", "ü/1.npy")
    got = rel(select_files(tmp_path), tmp_path)
    assert got == ["B/1.npy", "a10/1.npy", "a2/1.npy", "b/1.npy", "ü/1.npy"]


@pytest.mark.skipif(sys.platform != "linux" or sys.getfilesystemencoding() != "utf-8", reason="raw byte names")
def test_undecodable_names_sort_by_their_bytes(tmp_path):
    # b"\x80" decodes to the surrogate "\udc80", which sorts after "é" as str but before it as bytes.
    try:
        for raw in (b"\x80.npy", "é.npy".encode(), b"a.npy"):
            open(os.path.join(os.fsencode(tmp_path), raw), "wb").close()
    except OSError:
        pytest.skip("file system refuses non-UTF-8 names")
    got = rel(select_files(tmp_path), tmp_path)
    assert [os.fsencode(g) for g in got] == [b"a.npy", b"\x80.npy", "é.npy".encode()]


# -- natural order -----------------------------------------------------------------------------


def _natural(names: list[str]) -> list[str]:
    return sorted(names, key=natural_key)


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        # digit runs by value, wherever they sit
        (["slice_10.npy", "slice_2.npy", "slice_1.npy"], ["slice_1.npy", "slice_2.npy", "slice_10.npy"]),
        (["10.npy", "9.npy", "100.npy", "0.npy"], ["0.npy", "9.npy", "10.npy", "100.npy"]),
        (
            ["v1_t10.npy", "v1_t9.npy", "v10_t1.npy", "v2_t1.npy"],
            ["v1_t9.npy", "v1_t10.npy", "v2_t1.npy", "v10_t1.npy"],
        ),
        # a run meets other bytes as a digit does: '.' < digits < '_' < letters
        (["a_1.npy", "a0.npy", "a.npy", "ab.npy"], ["a.npy", "a0.npy", "a_1.npy", "ab.npy"]),
        (["a", "a5", "a5b", "a50"], ["a", "a5", "a5b", "a50"]),
        # text compares byte-wise, never by locale: upper case first, non-ASCII last
        (["b2", "B10", "a10", "é1", "A2"], ["A2", "B10", "a10", "b2", "é1"]),
        # leading zeros: equal values fall back to byte-wise order, so the order is total
        (["a1", "a01", "a001", "a0", "a00"], ["a0", "a00", "a001", "a01", "a1"]),
        # runs longer than any int conversion allows, compared without converting
        (
            ["x" + "9" * 5000, "x1" + "0" * 5000, "x" + "9" * 4999],
            ["x" + "9" * 4999, "x" + "9" * 5000, "x1" + "0" * 5000],
        ),
        # non-ASCII digits are text, not numbers
        (["a\u0661\u0660", "a\u0662", "a3"], ["a3", "a\u0661\u0660", "a\u0662"]),
        # folders and names of a relative path
        (["s10/a.npy", "s2/b10.npy", "s2/b9.npy", "s2.npy"], ["s2.npy", "s2/b9.npy", "s2/b10.npy", "s10/a.npy"]),
        (["a.npy", "a/b.npy", "a0.npy"], ["a.npy", "a/b.npy", "a0.npy"]),  # as byte-wise order has them
    ],
)
def test_natural_key_table(names, expected):
    assert _natural(names) == expected
    assert _natural(names[::-1]) == expected  # (not a stable sort's leftover)


def _reference_key(name: str) -> tuple[tuple[tuple[int, int], ...], bytes]:
    """An independent natural order: one token per byte, (0x30, value) per digit run, then the bytes."""
    raw = os.fsencode(name)
    tokens = [(ord("0"), int(run)) if run[:1].isdigit() else (run[0], -1)
              for run in re.findall(rb"[0-9]+|[^0-9]", raw)]  # fmt: skip
    return tuple(tokens), raw


@given(st.lists(st.text(alphabet="aZ_.-/0129\u00e9", max_size=12), min_size=2, max_size=30))
def test_natural_key_agrees_with_a_token_by_token_reference(names):
    assert sorted(names, key=natural_key) == sorted(names, key=_reference_key)


def test_natural_key_undecodable_names_sort_by_their_bytes():
    odd = os.fsdecode(b"x\xff2")  # (a surrogate-escaped byte, as os.listdir gives it)
    assert _natural([odd, "x\u00e92", "x10", "x2"]) == ["x2", "x10", "x\u00e92", odd]


def test_natural_key_agrees_with_byte_order_without_digits():
    names = ["b.npy", "B.npy", "a-b.npy", "a.npy", "a/b.npy", ".x.npy", "\u00e9.npy", "a b.npy"]
    assert _natural(names) == sorted(names, key=os.fsencode)


def test_natural_order_every_discovery_mode(tmp_path):
    touch(
        tmp_path,
        "slice_10.npy", "slice_2.npy", "slice_1.npy",
        "s10/b.npy", "s2/x10.npy", "s2/x9.npy", "s2/deep3/z.npy", "s2/deep10/z.npy",
    )  # fmt: skip
    assert rel(select_files(tmp_path, sort="natural"), tmp_path) == [
        "slice_1.npy", "slice_2.npy", "slice_10.npy", "s2/x9.npy", "s2/x10.npy", "s10/b.npy",
    ]  # fmt: skip
    assert rel(select_files(tmp_path), tmp_path) == [
        "slice_1.npy", "slice_10.npy", "slice_2.npy", "s10/b.npy", "s2/x10.npy", "s2/x9.npy",
    ]  # fmt: skip
    assert rel(select_files(tmp_path, recursive=True, sort="natural"), tmp_path) == [
        "s2/deep3/z.npy", "s2/deep10/z.npy", "s2/x9.npy", "s2/x10.npy", "s10/b.npy",
        "slice_1.npy", "slice_2.npy", "slice_10.npy",
    ]  # fmt: skip
    assert rel(select_files(tmp_path, recursive=True, sort="bytes"), tmp_path) == [
        "s10/b.npy", "s2/deep10/z.npy", "s2/deep3/z.npy", "s2/x10.npy", "s2/x9.npy",
        "slice_1.npy", "slice_10.npy", "slice_2.npy",
    ]  # fmt: skip


def test_dali_order_natural_is_pure_and_independent_of_listing_order():
    listed = ["s10/1.npy", "s2/10.npy", "s2/9.npy", "10.npy", "9.npy", "s2.npy"]
    expected = ["9.npy", "10.npy", "s2.npy", "s2/9.npy", "s2/10.npy", "s10/1.npy"]
    assert dali_order(list(listed), sep="/", sort="natural") == expected
    assert dali_order(listed[::-1], sep="/", sort="natural") == expected
    assert dali_order(["a\\2.npy", "a\\10.npy"], sep="\\", sort="natural") == ["a\\2.npy", "a\\10.npy"]


_NAME = st.text(st.sampled_from("aAb0129._-\u00e9\u4e2d"), min_size=1, max_size=6)


@given(st.dictionaries(st.one_of(st.just(""), _NAME), st.sets(_NAME, max_size=6), max_size=6), st.randoms())
def test_folder_order_is_dali_order(folders, rnd):
    """Indices into a listing made folder by folder (folders and names in any order) give dali_order's paths."""
    items = list(folders.items())
    rnd.shuffle(items)
    paths, spans = [], []
    for folder, names in items:
        names = list(names)
        rnd.shuffle(names)
        paths += [f"{folder}/{n}" if folder else n for n in names]
        spans.append((folder, len(names)))
    got = [paths[i] for i in folder_order(paths, spans)]
    assert got == dali_order(list(paths), sep="/")
    assert folder_order(paths, spans, sort="natural") is None


def test_folder_order_leaves_undecodable_names_to_dali_order(tmp_path):
    if sys.getfilesystemencoding() != "utf-8":
        pytest.skip("the file system encoding is not UTF-8")
    paths = [os.fsdecode(b"\xff.npy"), "a.npy"]
    assert folder_order(paths, [("", 2)]) is None


@pytest.mark.parametrize("glob", ["*.npy", "*", "*.np?", "*[0-9].npy", "a*", "*.NPY", "*.n.py", "*\\.npy", "x*.npy"])
def test_matcher_is_fnmatchcase(glob):
    import fnmatch

    names = ["a.npy", "a.NPY", "a1.npy", ".npy", "a.npyx", "b.n.py", "x.npy", "\\.npy", "a\\.npy", "npy", ""]
    assert [bool(matcher(glob)(n)) for n in names] == [fnmatch.fnmatchcase(n, glob) for n in names]


def test_a_local_listing_in_dali_order_keeps_each_files_inode(tmp_path):
    touch(tmp_path, "b.npy", "a.npy", "s1/z.npy", "s1/c.npy", "s0/y.npy", "s0/sub/deep.npy", "s1/no.txt")
    got = select_listed(tmp_path, lister=LocalLister(str(tmp_path), inodes=True))
    assert rel(got.paths, tmp_path) == ["a.npy", "b.npy", "s0/y.npy", "s1/c.npy", "s1/z.npy"]
    assert [ident.ino for ident in got.identities] == [os.stat(p).st_ino for p in got.paths]


def test_listed_files_keep_their_order_whatever_sort(tmp_path):
    (tmp_path / "l.txt").write_text("x10.npy\nx2.npy\nx1.npy\n")
    for sort in SORTS:
        assert rel(select_files(tmp_path, files=["x10.npy", "x2.npy"], sort=sort), tmp_path) == ["x10.npy", "x2.npy"]
        assert rel(select_files(tmp_path, file_list=tmp_path / "l.txt", sort=sort), tmp_path) == [
            "x10.npy", "x2.npy", "x1.npy",
        ]  # fmt: skip


@pytest.mark.parametrize("sort", ["Natural", "numeric", "", 1, ("natural",)])
def test_unknown_sort_lists_the_choices(tmp_path, sort):
    touch(tmp_path, "a.npy")
    for kwargs in ({}, {"files": ["a.npy"]}):
        with pytest.raises(
            ValueError, match=r"sort must be one of \('bytes', 'natural'\).*found " + re.escape(repr(sort))
        ):
            select_files(tmp_path, sort=sort, **kwargs)


# -- sort=None: byte-wise order, and a warning when natural order would differ ----------------


_SWAP_NAME = st.text(st.sampled_from("ab0129._"), min_size=1, max_size=5)


@given(
    st.lists(
        st.one_of(_SWAP_NAME, st.tuples(_SWAP_NAME, _SWAP_NAME).map("/".join)), min_size=0, max_size=40, unique=True
    )
)
def test_natural_swap_is_exact_for_dali_order(names):
    """Within SWAP_PAIRS pairs it reports a pair exactly when natural order differs, and that pair swaps."""
    ordered = dali_order(list(names), sep="/")
    swap = natural_swap(ordered, sep="/")
    natural = dali_order(list(names), sep="/", sort="natural")
    assert (swap is None) == (natural == ordered)
    if swap is not None:
        a, b = swap
        assert ordered.index(b) == ordered.index(a) + 1 and natural.index(b) < natural.index(a)


@given(st.lists(st.one_of(_SWAP_NAME, st.tuples(_SWAP_NAME, _SWAP_NAME).map("/".join)), max_size=40, unique=True))
def test_natural_swap_is_exact_for_whole_paths(names):
    ordered = sorted(names, key=os.fsencode)
    swap = natural_swap(ordered)
    natural = sorted(names, key=natural_key)
    assert (swap is None) == (natural == ordered)
    if swap is not None:
        assert natural.index(swap[1]) < natural.index(swap[0])


def test_natural_swap_a_million_names_early_uniform_and_sampled():
    n = 1_000_000
    assert natural_swap(sorted(f"vol_{i}.npy" for i in range(n))) == ("vol_100009.npy", "vol_10001.npy")
    assert natural_swap(sorted(f"vol_{i:07d}.npy" for i in range(n))) is None  # (digits all sit alike)
    no_digits = sorted(f"vol_{i:o}".translate(str.maketrans("01234567", "abcdefgh")) for i in range(n))
    assert natural_swap(no_digits) is None
    # Past SWAP_PAIRS pairs of unlike digits, the rest is sampled: a swap where the sample looks is found.
    names = [f"{i:06d}_{'x' * (i % 2)}1.npy" for i in range(4 * SWAP_PAIRS)]
    assert natural_swap(names) is None
    spread = (len(names) - 1 - SWAP_PAIRS // 2) // (SWAP_PAIRS // 2)
    at = SWAP_PAIRS // 2 + 10 * spread
    names[at], names[at + 1] = names[at][:7] + "10.npy", names[at][:7] + "9.npy"  # (byte-wise order, swapped)
    assert natural_swap(names) == (names[at], names[at + 1])
    names[at - 1], names[at] = names[at - 1][:7] + "10.npy", names[at - 1][:7] + "9.npy"
    names[at + 1] = names[at + 1][:7] + "1.npy"
    assert natural_swap(names) is None  # (a pair the sample skips goes unseen, as documented)


def test_sort_none_warns_once_naming_two_files_that_swap(tmp_path):
    touch(tmp_path, *(f"day_{i}.npy" for i in range(1, 13)))
    with pytest.warns(NpyDaskWarning) as record:
        got = select_files(tmp_path, sort=None)
    assert rel(got, tmp_path) == sorted(f"day_{i}.npy" for i in range(1, 13))  # byte-wise, as DALI
    assert len(record) == 1 and record[0].filename == __file__
    message = str(record[0].message)
    assert re.search(r"puts 'day_1[0-2]\.npy' before 'day_2\.npy'", message), message
    for part in ("sort='natural'", "sort='bytes'", str(tmp_path)):
        assert part in message, (part, message)
    for sort in SORTS:  # (an explicit order never warns)
        select_files(tmp_path, sort=sort)
    select_files(tmp_path, files=["day_10.npy", "day_2.npy"], sort=None)  # (a list keeps its order)
    (tmp_path / "l.txt").write_text("day_10.npy\nday_2.npy\n")
    select_files(tmp_path, file_list=tmp_path / "l.txt", sort=None)


def test_sort_none_warns_in_every_discovery_mode_and_not_for_zero_padding(tmp_path):
    touch(tmp_path / "pad", *(f"day_{i:03d}.npy" for i in range(1, 366)))
    select_files(tmp_path / "pad", sort=None)  # (no warning: filterwarnings turns one into an error)
    select_files(tmp_path / "pad", sort=None, recursive=True)
    touch(tmp_path / "sub", "s2/a.npy", "s10/a.npy")
    with pytest.warns(NpyDaskWarning, match="'s10/a.npy' before 's2/a.npy'"):
        select_files(tmp_path / "sub", sort=None)
    with pytest.warns(NpyDaskWarning, match="'s10/a.npy' before 's2/a.npy'"):
        select_files(tmp_path / "sub", sort=None, recursive=True)
    touch(tmp_path / "top", "z9.npy", "a/x.npy")  # (root files first in both orders: nothing to say)
    select_files(tmp_path / "top", sort=None)


# -- the filter --------------------------------------------------------------------------------


def test_default_filter_is_dalis():
    assert DEFAULT_FILE_FILTER == "*.npy"


def test_filter_is_case_sensitive(tmp_path):
    touch(tmp_path, "lower.npy", "UPPER.NPY", "Mixed.Npy")
    assert rel(select_files(tmp_path), tmp_path) == ["lower.npy"]
    assert rel(select_files(tmp_path, file_filter="*.NPY"), tmp_path) == ["UPPER.NPY"]
    assert rel(select_files(tmp_path, file_filter="*.[nN][pP][yY]"), tmp_path) == [
        "Mixed.Npy", "UPPER.NPY", "lower.npy",
    ]  # fmt: skip


def test_filter_matches_base_names_only(tree):
    assert rel(select_files(tree, file_filter="x*"), tree) == ["s0/x.npy"]
    with pytest.raises(ValueError, match="matching file_filter 's0/\\*'"):
        select_files(tree, file_filter="s0/*")
    assert rel(select_files(tree, file_filter="*"), tree) == [
        "a.npy", "b.npy", "c.npy.bak", "notes.txt", "empty_dir/readme.md", "s0/x.npy", "s1/y.npy", "s1/z.npy",
    ]  # fmt: skip


def test_directory_matching_the_filter_is_not_a_file(tmp_path):
    touch(tmp_path, "a.npy", "dir.npy/inner.npy", "dir.npy/deeper.npy/x.npy")
    assert rel(select_files(tmp_path), tmp_path) == ["a.npy", "dir.npy/inner.npy"]
    assert rel(select_files(tmp_path, recursive=True), tmp_path) == [
        "a.npy", "dir.npy/deeper.npy/x.npy", "dir.npy/inner.npy",
    ]  # fmt: skip


def test_hidden_files_and_folders_are_included_as_dali_does(tmp_path):
    # DALI's fnmatch has no FNM_PERIOD and only "." and ".." are skipped.
    touch(tmp_path, ".hidden.npy", "a.npy", ".cache/c.npy", ".cache/.h.npy", "s/.x.npy")
    assert rel(select_files(tmp_path), tmp_path) == [
        ".hidden.npy", "a.npy", ".cache/.h.npy", ".cache/c.npy", "s/.x.npy",
    ]  # fmt: skip
    assert rel(select_files(tmp_path, recursive=True), tmp_path) == [
        ".cache/.h.npy", ".cache/c.npy", ".hidden.npy", "a.npy", "s/.x.npy",
    ]  # fmt: skip


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs mkfifo")
def test_special_files_are_skipped(tmp_path):
    touch(tmp_path, "a.npy")
    os.mkfifo(tmp_path / "pipe.npy")
    assert rel(select_files(tmp_path), tmp_path) == ["a.npy"]


# -- file_list ---------------------------------------------------------------------------------


def test_file_list_blank_lines_crlf_and_trailing_space(tmp_path):
    listing = tmp_path / "list.txt"
    listing.write_bytes(b"b.npy\r\n\r\n  \t\r\nsub/a.npy  \r\nc d.npy\n\n  lead.npy\nlast.npy")
    got = select_files(tmp_path, file_list=listing)
    assert got == [os.path.join(str(tmp_path), e) for e in ["b.npy", "sub/a.npy", "c d.npy", "  lead.npy", "last.npy"]]


def test_file_list_has_no_labels_a_trailing_number_is_part_of_the_path(tmp_path):
    (tmp_path / "list.txt").write_text("a.npy 3\n")
    assert select_files(tmp_path, file_list=tmp_path / "list.txt") == [os.path.join(str(tmp_path), "a.npy 3")]


def test_file_list_relative_to_file_root_or_to_the_lists_folder(tmp_path):
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "l.txt").write_text("x.npy\nsub/y.npy\n")
    data = tmp_path / "data"
    data.mkdir()
    assert select_files(data, file_list=lists / "l.txt") == [str(data / "x.npy"), str(data / "sub/y.npy")]
    assert select_files(file_list=lists / "l.txt") == [str(lists / "x.npy"), str(lists / "sub/y.npy")]


def test_file_list_given_by_bare_name_is_relative_to_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "l.txt").write_text("x.npy\n")
    monkeypatch.chdir(tmp_path)
    assert select_files(file_list="l.txt") == ["x.npy"]


def test_file_list_absolute_entries_override_the_root(tmp_path):
    other = str(tmp_path / "elsewhere" / "z.npy")
    (tmp_path / "l.txt").write_text(f"a.npy\n{other}\n")
    assert select_files(tmp_path, file_list=tmp_path / "l.txt") == [str(tmp_path / "a.npy"), other]
    assert select_files(file_list=tmp_path / "l.txt") == [str(tmp_path / "a.npy"), other]


def test_file_list_ignores_the_filter_and_keeps_order_and_duplicates(tmp_path):
    (tmp_path / "l.txt").write_text("z.txt\na.npy\nz.txt\n")
    got = select_files(tmp_path, file_list=tmp_path / "l.txt", file_filter="*.npy", recursive=True)
    assert rel(got, tmp_path) == ["z.txt", "a.npy", "z.txt"]


def test_file_list_utf8_names_and_bom(tmp_path):
    (tmp_path / "l.txt").write_bytes(b"\xef\xbb\xbf\xc3\xa9.npy\nb.npy\n")
    assert rel(select_files(tmp_path, file_list=tmp_path / "l.txt"), tmp_path) == ["é.npy", "b.npy"]


@pytest.mark.parametrize("content", [b"", b"\n", b"\r\n  \n\t\n"])
def test_file_list_without_entries_raises(tmp_path, content):
    listing = tmp_path / "l.txt"
    listing.write_bytes(content)
    with pytest.raises(ValueError, match="names no files") as info:
        select_files(file_list=listing)
    assert str(listing) in str(info.value)


def test_missing_file_list_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        select_files(file_list=tmp_path / "nope.txt")
    assert "nope.txt" in str(info.value)


# -- files -------------------------------------------------------------------------------------


def test_files_order_and_duplicates_kept(tmp_path):
    got = select_files(tmp_path, files=["z.npy", "a.npy", Path("sub/m.npy"), "z.npy"])
    assert rel(got, tmp_path) == ["z.npy", "a.npy", "sub/m.npy", "z.npy"]


def test_files_absolute_entries_override_root_and_filter_is_ignored(tmp_path):
    got = select_files(tmp_path, files=["a.txt", "/abs/b.npy"], file_filter="*.npy")
    assert got == [str(tmp_path / "a.txt"), "/abs/b.npy"]


def test_files_without_root_are_kept_as_given(tmp_path):
    assert select_files(files=["rel/a.npy", Path("b.npy"), "/abs/c.npy"]) == ["rel/a.npy", "b.npy", "/abs/c.npy"]


def test_files_accepts_any_iterable(tmp_path):
    assert select_files(files=(f"{i}.npy" for i in range(3))) == ["0.npy", "1.npy", "2.npy"]


def test_listed_entries_are_not_checked_for_existence(tmp_path):
    assert select_files(tmp_path, files=["missing.npy"]) == [str(tmp_path / "missing.npy")]


# -- argument errors ---------------------------------------------------------------------------


def test_nothing_given_raises():
    with pytest.raises(ValueError, match="pass file_root"):
        select_files()


def test_files_and_file_list_together_raise(tmp_path):
    (tmp_path / "l.txt").write_text("a.npy\n")
    with pytest.raises(ValueError, match="files and file_list were both given"):
        select_files(tmp_path, files=["a.npy"], file_list=tmp_path / "l.txt")


def test_empty_files_raises(tmp_path):
    with pytest.raises(ValueError, match="files is an empty list"):
        select_files(tmp_path, files=[])


def test_single_path_as_files_raises(tmp_path):
    for single in ("a.npy", Path("a.npy"), b"a.npy"):
        with pytest.raises(TypeError, match="wrap it in a list"):
            select_files(tmp_path, files=single)


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"file_root": b"/tmp"}, TypeError, "file_root must be a str path, got bytes"),
        ({"file_root": 3}, TypeError, "file_root must be a str or os.PathLike path, got 3"),
        ({"file_root": ""}, ValueError, "file_root is an empty path"),
        ({"files": ["a.npy", b"b.npy"]}, TypeError, r"files\[1\] must be a str path, got bytes"),
        ({"files": ["a.npy", None]}, TypeError, r"files\[1\] must be a str or os.PathLike path, got None"),
        ({"files": [""]}, ValueError, r"files\[0\] is an empty path"),
        ({"file_list": b"l.txt"}, TypeError, "file_list must be a str path, got bytes"),
        ({"file_root": ".", "file_filter": b"*.npy"}, TypeError, "file_filter must be a str glob"),
    ],
)
def test_bad_argument_types(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        select_files(**kwargs)


def test_missing_root_raises_file_not_found_naming_it(tmp_path):
    missing = tmp_path / "nope"
    for kwargs in ({}, {"files": ["a.npy"]}):
        with pytest.raises(FileNotFoundError) as info:
            select_files(missing, **kwargs)
        assert info.value.filename == str(missing)
        assert str(missing) in str(info.value) and "file_root does not exist" in str(info.value)


def test_root_that_is_a_file_raises_not_a_directory(tmp_path):
    (tmp_path / "f.npy").touch()
    with pytest.raises(NotADirectoryError) as info:
        select_files(tmp_path / "f.npy")
    assert str(tmp_path / "f.npy") in str(info.value) and "files=[...]" in str(info.value)


def test_no_file_found_names_root_and_filter(tree):
    with pytest.raises(ValueError, match="recursive=True") as info:
        select_files(tree, file_filter="*.zarr")
    message = str(info.value)
    assert repr(str(tree)) in message and "'*.zarr'" in message and "recursive=True" in message
    with pytest.raises(ValueError, match="at any depth under"):
        select_files(tree, file_filter="*.zarr", recursive=True)


def test_files_only_deeper_than_one_level_are_not_found_without_recursive(tmp_path):
    touch(tmp_path, "a/b/c.npy")
    with pytest.raises(ValueError, match="one folder below"):
        select_files(tmp_path)
    assert rel(select_files(tmp_path, recursive=True), tmp_path) == ["a/b/c.npy"]


def test_empty_root_raises(tmp_path):
    with pytest.raises(ValueError, match="no file found"):
        select_files(tmp_path)


@pytest.mark.skipif(os.name == "nt" or os.geteuid() == 0, reason="root reads every folder")
def test_unreadable_subdirectory_raises_permission_error(tmp_path):
    touch(tmp_path, "a.npy", "locked/b.npy")
    (tmp_path / "locked").chmod(0)
    try:
        with pytest.raises(PermissionError) as info:
            select_files(tmp_path)
        assert "locked" in str(info.value)
    finally:
        (tmp_path / "locked").chmod(0o755)


# -- symlinks ----------------------------------------------------------------------------------


@needs_symlinks
def test_flat_follows_symlinked_subdirectories_even_back_to_the_root_as_dali(tmp_path):
    touch(tmp_path, "a.npy", "sub/b.npy")
    os.symlink(".", tmp_path / "loop")  # loop -> root
    os.symlink("sub", tmp_path / "alias")  # alias -> sub
    # DALI lists an immediate subdirectory by its name whatever it points to.
    assert rel(select_files(tmp_path), tmp_path) == ["a.npy", "alias/b.npy", "loop/a.npy", "sub/b.npy"]


@needs_symlinks
def test_recursive_symlink_to_parent_terminates_and_adds_nothing(tmp_path):
    touch(tmp_path, "a.npy", "sub/b.npy", "sub/deep/c.npy")
    os.symlink("..", tmp_path / "sub" / "up")  # sub/up -> root
    os.symlink("..", tmp_path / "sub" / "deep" / "up")  # sub/deep/up -> sub
    os.symlink(".", tmp_path / "self")  # self -> root
    assert rel(select_files(tmp_path, recursive=True), tmp_path) == ["a.npy", "sub/b.npy", "sub/deep/c.npy"]
    # The flat walk lists each immediate subdirectory once: sub/up is two levels down.
    assert rel(select_files(tmp_path), tmp_path) == ["a.npy", "self/a.npy", "sub/b.npy"]


@needs_symlinks
def test_recursive_mutual_loops_list_each_folder_once_under_its_real_path(tmp_path):
    touch(tmp_path, "x/1.npy", "y/2.npy")
    os.symlink("../y", tmp_path / "x" / "to_y")
    os.symlink("../x", tmp_path / "y" / "to_x")
    os.symlink("y", tmp_path / "a_alias")  # sorts before the real folder; the real path still wins
    assert rel(select_files(tmp_path, recursive=True), tmp_path) == ["x/1.npy", "y/2.npy"]


@needs_symlinks
def test_recursive_link_out_of_the_tree_is_walked_once(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    touch(root, "a.npy")
    touch(outside, "o.npy", "deeper/p.npy")
    os.symlink(root, outside / "back")  # leads back into the tree: adds nothing
    os.symlink(outside, root / "l2")
    os.symlink(outside, root / "l1")  # two links to one folder: the byte-wise first is walked
    assert rel(select_files(root, recursive=True), root) == ["a.npy", "l1/deeper/p.npy", "l1/o.npy"]


@needs_symlinks
def test_recursive_nested_links_fewest_hops_first(tmp_path):
    root, ext1, ext2 = tmp_path / "root", tmp_path / "ext1", tmp_path / "ext2"
    touch(root, "r.npy")
    touch(ext1, "e1.npy")
    touch(ext2, "e2.npy")
    os.symlink(ext2, ext1 / "to_ext2")  # reachable through two links ...
    os.symlink(ext1, root / "a")
    os.symlink(ext2, root / "z")  # ... and through one, which wins although "z" sorts last
    assert rel(select_files(root, recursive=True), root) == ["a/e1.npy", "r.npy", "z/e2.npy"]


@needs_symlinks
def test_dangling_and_looping_symlinks_are_skipped(tmp_path):
    touch(tmp_path, "a.npy", "sub/b.npy")
    os.symlink(tmp_path / "nowhere.npy", tmp_path / "dead.npy")
    os.symlink(tmp_path / "nowhere", tmp_path / "deaddir")
    os.symlink("nowhere.npy", tmp_path / "sub" / "dead.npy")
    os.symlink("selfloop.npy", tmp_path / "selfloop.npy")  # ELOOP when followed
    for recursive in (False, True):
        assert rel(select_files(tmp_path, recursive=recursive), tmp_path) == ["a.npy", "sub/b.npy"]


@needs_symlinks
def test_symlinks_to_files_count_as_files_and_links_to_folders_do_not(tmp_path):
    touch(tmp_path, "sub/b.npy")
    os.symlink("sub/b.npy", tmp_path / "link.npy")
    os.symlink("sub", tmp_path / "dirlink.npy")  # a folder under a matching name: walked, not read
    assert rel(select_files(tmp_path), tmp_path) == ["link.npy", "dirlink.npy/b.npy", "sub/b.npy"]
    assert rel(select_files(tmp_path, recursive=True), tmp_path) == ["link.npy", "sub/b.npy"]


@needs_symlinks
def test_symlinked_root_is_followed(tmp_path):
    touch(tmp_path, "real/a.npy")
    os.symlink(tmp_path / "real", tmp_path / "root")
    assert select_files(tmp_path / "root") == [str(tmp_path / "root" / "a.npy")]


@needs_symlinks
def test_dangling_root_raises_file_not_found(tmp_path):
    os.symlink(tmp_path / "nowhere", tmp_path / "root")
    with pytest.raises(FileNotFoundError, match="dangling"):
        select_files(tmp_path / "root")


# -- many files --------------------------------------------------------------------------------


TWENTY_THOUSAND = [f"f{i:05d}.npy" for i in range(20_000)]


@pytest.fixture(scope="module")
def many_files(tmp_path_factory) -> Path:
    """20,000 empty files: half in the root, half in one subdirectory."""
    root = tmp_path_factory.mktemp("many")
    (root / "sub").mkdir()
    half = len(TWENTY_THOUSAND) // 2
    for i, name in enumerate(TWENTY_THOUSAND):
        open(root / name if i < half else root / "sub" / name, "wb").close()
    return root


@pytest.mark.parametrize("recursive", [False, True])
def test_twenty_thousand_files_are_discovered_quickly(many_files, recursive):
    t0 = time.perf_counter()
    got = select_files(many_files, recursive=recursive)
    elapsed = time.perf_counter() - t0  # about 0.1 s on a laptop-class disk
    half = len(TWENTY_THOUSAND) // 2
    assert rel(got, many_files) == TWENTY_THOUSAND[:half] + [f"sub/{n}" for n in TWENTY_THOUSAND[half:]]
    assert elapsed < 10, f"discovering 20,000 files took {elapsed:.2f} s"


# -- shards ------------------------------------------------------------------------------------


def test_shard_table_ten_files_three_shards():
    assert [shard_range(10, k, 3) for k in range(3)] == [range(0, 3), range(3, 6), range(6, 10)]


def test_single_shard_is_everything_and_one_file_per_shard():
    assert shard_range(7, 0, 1) == range(7)
    assert [shard_range(4, k, 4) for k in range(4)] == [range(k, k + 1) for k in range(4)]


@pytest.mark.parametrize("n", range(1, 31))
def test_shards_partition_contiguously_with_sizes_within_one(n):
    for s in range(1, n + 1):
        shards = [shard_range(n, k, s) for k in range(s)]
        assert [i for r in shards for i in r] == list(range(n))  # contiguous, in order, no gap
        assert all(r.step == 1 and r.start == n * k // s and r.stop == n * (k + 1) // s for k, r in enumerate(shards))
        sizes = [len(r) for r in shards]
        assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1


def test_shard_arguments_accept_numpy_integers():
    assert shard_range(np.int64(10), np.int32(2), np.uint8(3)) == range(6, 10)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((10, 3, 3), "shard_id=3 with num_shards=3"),
        ((10, 5, 3), "shard_id=5 with num_shards=3"),
        ((10, -1, 3), "shard_id must be a non-negative integer, got -1"),
        ((10, 0, 0), "num_shards must be at least 1, got 0"),
        ((10, 0, -2), "num_shards must be a non-negative integer, got -2"),
        ((3, 0, 4), "num_shards=4 is more than the 3 files"),
        ((0, 0, 1), "num_shards=1 is more than the 0 files"),
        ((-1, 0, 1), r"n \(the number of files\) must be a non-negative integer, got -1"),
        ((10, 1.0, 3), "shard_id must be a non-negative integer, got 1.0"),
        ((10, 0, "3"), "num_shards must be a non-negative integer, got '3'"),
        ((10.0, 0, 3), "got 10.0"),
        ((10, True, 3), "shard_id must be a non-negative integer, got True"),
        ((10, 0, None), "num_shards must be a non-negative integer, got None"),
    ],
)
def test_shard_errors_name_the_numbers(args, match):
    with pytest.raises(ValueError, match=match):
        shard_range(*args)
