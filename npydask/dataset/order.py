"""The order of a dataset's files: DALI's byte-wise order, natural order, and the checks between them.

Pure functions of names (no file system): :func:`dali_order` is DALI's
non-recursive order of a listing (the root's files, then each immediate
subfolder by name), :func:`folder_order` the same for a listing made
folder by folder, :func:`fs_sorted` byte-wise (or natural) sorting of
file-system names, :func:`natural_key` the key of ``sort="natural"``, and
:func:`natural_swap` the cheap check behind the warning that natural order
would differ. :mod:`npydask.dataset.select` chooses the files and uses
these to order them.

* Byte-wise order is the order of ``os.fsencode(name)``, never the locale
  (``"B" < "a"``, ``"a10" < "a2"``, non-ASCII after ASCII), as DALI's
  ``std::sort`` of ``std::string``. ``sort="natural"`` (an npydask
  extension) compares runs of ASCII digits by their value instead
  (``"a2" < "a10"``, :func:`natural_key`).
"""

from __future__ import annotations

import fnmatch
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence

from npydask.errors import warn
from npydask.storage.local import fs_bytes as _fs_bytes
from npydask.storage.urls import redact

__all__ = [
    "SORTS",
    "SWAP_PAIRS",
    "InOrder",
    "check_sort",
    "dali_order",
    "folder_order",
    "fs_sorted",
    "matcher",
    "natural_key",
    "natural_swap",
    "warn_if_natural_differs",
]

SORTS = ("bytes", "natural")
"""Orders of discovered files: DALI's byte-wise order, or digit runs by value (:func:`natural_key`)."""

SWAP_PAIRS = 4096
"""Adjacent pairs :func:`natural_swap` compares at most, when the names' digits do not all sit alike."""

_FS_ENCODING = sys.getfilesystemencoding()


def matcher(file_filter: str) -> Callable[[str], object]:
    """A base-name test for the glob ``file_filter`` (case-sensitive, as DALI's ``fnmatch``).

    ``"*"`` and a literal suffix (the default ``"*.npy"``) is ``str.endswith``,
    a third of a regular expression's cost a name; any other glob is
    :func:`fnmatch.translate`'s expression.

    Examples
    --------
    >>> [bool(matcher(g)("a.npy")) for g in ("*.npy", "*.np?", "*.npz", "*")]
    [True, True, False, True]
    """
    suffix = file_filter[1:]
    if file_filter.startswith("*") and not any(c in suffix for c in "*?["):
        return lambda name: name.endswith(suffix)
    return re.compile(fnmatch.translate(file_filter)).match


def folder_order(paths: list[str], folders: list[tuple[str, int]], sort: str = "bytes") -> list[int] | None:
    """:func:`dali_order` of a listing made folder by folder, as indices into ``paths``; pure.

    ``folders`` is the listing's (:attr:`Listing.folders
    <npydask.storage.base.Listing.folders>`): each folder's name (``""`` for
    the root's files) and how many consecutive paths are its. The root's
    files come first, then each folder in order of its name, each folder's
    paths sorted apart: no path is split or looked up. ``None`` where
    :func:`dali_order` must do it (``sort="natural"``, or names holding
    undecodable bytes, which sort by their bytes).

    Examples
    --------
    >>> paths = ["s1/c.npy", "s1/a.npy", "b.npy", "a.npy", "s0/d.npy"]
    >>> [paths[i] for i in folder_order(paths, [("s1", 2), ("", 2), ("s0", 1)])]
    ['a.npy', 'b.npy', 's0/d.npy', 's1/a.npy', 's1/c.npy']
    >>> folder_order(paths, [("s1", 2), ("", 2), ("s0", 1)], sort="natural") is None
    True
    """
    if sort != "bytes" or _FS_ENCODING != "utf-8":
        return None
    try:
        "".join(paths).encode("utf-8")  # (surrogates stand for undecodable bytes: those sort by bytes)
    except UnicodeEncodeError:
        return None
    spans: list[tuple[str, int, int]] = []
    at = 0
    for name, n in folders:
        spans.append((name, at, at + n))
        at += n
    spans.sort()  # by name (each once): the root's files (named "") first, then the folders
    key = paths.__getitem__
    order: list[int] = []
    for _, a, b in spans:
        order += sorted(range(a, b), key=key)
    return order


def fs_sorted(names: list[str], sort: str = "bytes") -> list[str]:
    """Byte-wise order of file-system names (undecodable bytes included), as DALI sorts; or natural order.

    UTF-8 keeps code point order, so names that are all valid UTF-8 sort as
    strings (in C); only names holding undecodable bytes need their bytes as keys.
    """
    if sort == "natural":
        names.sort(key=natural_key)
        return names
    if _FS_ENCODING == "utf-8":
        try:
            "".join(names).encode("utf-8")  # fails on the surrogates that stand for undecodable bytes
        except UnicodeEncodeError:
            pass
        else:
            names.sort()
            return names
    names.sort(key=_fs_bytes)
    return names


_DIGIT_RUNS = re.compile(rb"[0-9]+")


def _run_weight(run: re.Match[bytes]) -> bytes:
    """A digit run as ``"0"``, its length without leading zeros (4 bytes, big-endian), then those digits."""
    digits = run.group().lstrip(b"0") or b"0"
    return b"0" + len(digits).to_bytes(4, "big") + digits


def natural_key(name: str) -> tuple[bytes, bytes]:
    """A sort key ordering runs of ASCII digits by value, all else byte-wise: ``"a2" < "a10"``.

    Names compare byte by byte (of ``os.fsencode(name)``, as byte-wise order
    does) until both reach a run of the digits ``0``-``9``; two runs compare
    by their value (without converting them: any length works), and a run
    meets any other byte as a digit would (``"a.npy" < "a0.npy" < "a_1.npy"``,
    since ``.`` < ``0`` < ``_``). Names equal but for leading zeros
    (``"a01"``, ``"a1"``) fall back to byte-wise order, so the order is total
    and the same on every machine. Pure: no locale, no file system.

    The key is the name with each run replaced by ``"0"``, the run's length
    (leading zeros stripped, 4 bytes big-endian) and its digits: a ``"0"``
    only ever starts a run there, so two keys reach runs at the same offset,
    and a longer number is a larger one. The name's bytes break ties.

    Examples
    --------
    >>> sorted(["slice_10.npy", "slice_2.npy", "slice_1.npy", "a.npy"], key=natural_key)
    ['a.npy', 'slice_1.npy', 'slice_2.npy', 'slice_10.npy']
    >>> sorted(["s10/x.npy", "s9/x.npy", "s9/x10.npy", "s9/x9.npy"], key=natural_key)
    ['s9/x.npy', 's9/x9.npy', 's9/x10.npy', 's10/x.npy']
    >>> sorted(["a1", "a01", "a001", "a0"], key=natural_key)
    ['a0', 'a001', 'a01', 'a1']
    """
    raw = _fs_bytes(name)
    return _DIGIT_RUNS.sub(_run_weight, raw), raw


_DIGITS_ALIKE = str.maketrans("123456789", "000000000")
_DIGIT_CHARS = frozenset("0123456789")


def natural_swap(names: Sequence[str], sep: str | None = None) -> tuple[str, str] | None:
    """Two adjacent names of a byte-wise ordered listing that natural order would swap, else ``None``.

    ``names`` is in :func:`dali_order` (``sep``: the folder separator, so
    the root's files come before the folders and folders compare by name)
    or sorted as whole strings (``sep=None``, the ``recursive`` order).
    A list is in natural order exactly when each adjacent pair is, so only
    adjacent pairs are compared. The check is built to cost a few percent
    of opening the folder, even ``headers="first"`` at a million files,
    where computing :func:`natural_key` for every name would cost more
    than the whole open:

    * the first ``SWAP_PAIRS // 2`` pairs are compared first (where a list
      that differs mostly shows it, as ``vol_1, vol_10, vol_100, ...``);
    * names holding no digit, and names whose digits all sit alike (each
      name the same once every digit is read as ``0``: zero-padded
      numbers, ``slice_0007.npy``) are in natural order, since numbers of
      equal length compare as their digits do (one ``str.translate`` of
      the joined names, one scan and one comparison);
    * otherwise the remaining adjacent pairs whose digits sit differently
      and whose first differing character is a digit (where else both
      orders decide alike) are compared by :func:`natural_key`, all of them when there are at
      most :data:`SWAP_PAIRS` pairs, else ``SWAP_PAIRS // 2`` more evenly
      spread over the list: a sample, so a lone swapped pair far into a
      long list of names whose digits sit unalike can go unseen.

    On a million names it costs a small share of opening as many files
    with ``headers="first"`` (``benchmarks/bench_order.py`` measures it on
    ``vol_{i}.npy``, ``vol_{i:07d}.npy``, names without digits and names
    whose digit runs differ in length but agree; figures on the
    performance page).

    Pure: no file system.

    Examples
    --------
    >>> natural_swap(sorted(["day_1.npy", "day_2.npy", "day_10.npy"]))
    ('day_10.npy', 'day_2.npy')
    >>> natural_swap(sorted(f"day_{i:03d}.npy" for i in range(1, 366))) is None
    True
    >>> natural_swap(["z.npy", "s10/a.npy", "s9/a.npy"], sep="/")
    ('s10/a.npy', 's9/a.npy')
    >>> natural_swap(["z9.npy", "s1/a.npy"], sep="/") is None  # (the root's files come first either way)
    True
    """
    return _natural_swap(names, names, sep)


def _natural_swap(names: Sequence[str], unordered: Sequence[str], sep: str | None) -> tuple[str, str] | None:
    """:func:`natural_swap`, with ``unordered`` the same names in any order (a list joins in one C call)."""
    n = len(names)
    half = SWAP_PAIRS // 2
    swap = _first_swap(names, range(min(half, n - 1)), sep)  # (a list that differs mostly does so early on)
    if swap is not None or n - 1 <= half:
        return swap
    masked = "\0".join(unordered).translate(_DIGITS_ALIKE)  # (whether digits sit alike: any order tells)
    if "0" not in masked:
        return None
    pattern = names[0].translate(_DIGITS_ALIKE)
    if len(masked) == n * (len(pattern) + 1) - 1 and masked == (pattern + "\0") * (n - 1) + pattern:
        return None
    if n - 1 <= SWAP_PAIRS:
        return _first_swap(names, range(half, n - 1), sep)
    return _first_swap(names, range(half, n - 1, max(1, (n - 1 - half) // half)), sep)


def _first_swap(names: Sequence[str], pairs: Iterable[int], sep: str | None) -> tuple[str, str] | None:
    """The first of the adjacent pairs ``(names[i], names[i + 1])``, ``i`` in ``pairs``, out of natural order."""
    for i in pairs:
        a, b = names[i], names[i + 1]
        if a.translate(_DIGITS_ALIKE) == b.translate(_DIGITS_ALIKE):
            continue  # (numbers of one length at the same places compare as their digits do)
        at = len(os.path.commonprefix((a, b)))
        if a[at : at + 1] not in _DIGIT_CHARS and b[at : at + 1] not in _DIGIT_CHARS:
            continue  # (both orders decide at the first differing character, byte-wise, unless a digit is there)
        if sep is not None:
            nested = sep in a
            if nested != (sep in b):
                continue  # (the root's files, then the folders: in either order)
            if nested:
                folder_a, folder_b = a.partition(sep)[0], b.partition(sep)[0]
                if folder_a != folder_b:
                    a, b = folder_a, folder_b
        if natural_key(a) > natural_key(b):
            return names[i], names[i + 1]
    return None


class InOrder(Sequence[str]):
    """``paths`` in the order ``order`` gives, without a list of them (only a few are ever looked at)."""

    __slots__ = ("_order", "_paths")

    def __init__(self, paths: list[str], order: list[int]) -> None:
        self._paths, self._order = paths, order

    def __len__(self) -> int:
        return len(self._order)

    def __getitem__(self, i: int) -> str:  # type: ignore[override]
        return self._paths[self._order[i]]


def warn_if_natural_differs(
    root: str, names: Sequence[str], sep: str | None, unordered: Sequence[str] | None = None
) -> None:
    """``sort=None``: warn, naming two files, when natural order would differ from the byte-wise one.

    ``unordered``: the same names as a list in any order (the listing's), joined faster than ``names``.
    """
    swap = _natural_swap(names, names if unordered is None else unordered, sep)
    if swap is None:
        return
    warn(
        f"file_root {redact(root)!r}: its {len(names)} files are read in DALI's byte-wise order, which puts "
        f"{swap[0]!r} before {swap[1]!r}; natural order (numbers by value) would swap them. Pass "
        "sort='natural' to read them by number, or sort='bytes' to keep the byte-wise order; either silences "
        "this warning. In byte-wise order, folders paired file by file (images and labels, zip_datasets) can pair "
        "the wrong files where their names differ around the numbers ('ct_1.npy' before 'ct_10.npy' but "
        "'ct_10_seg.npy' before 'ct_1_seg.npy'); sort='natural' keeps them aligned"
    )


def check_sort(sort: object) -> None:
    """Refuse a ``sort`` that is not one of :data:`SORTS`, naming them."""
    if not isinstance(sort, str) or sort not in SORTS:
        raise ValueError(
            f"sort must be one of {SORTS}: 'bytes' (DALI's byte-wise order, 'a10' before 'a2') or 'natural' "
            f"(runs of digits by value, 'a2' before 'a10'); found {sort!r}"
        )


def dali_order(paths: list[str], sep: str = os.sep, sort: str = "bytes") -> list[str]:
    """DALI's non-recursive order of a listing (relative paths at most one folder deep), pure.

    The files directly in the root first, byte-wise; then each immediate
    subfolder in byte-wise order, with its own files byte-wise (``traverse_directories``).
    ``sort="natural"`` orders names and subfolders by :func:`natural_key` instead.

    Examples
    --------
    >>> dali_order(["s1/c.npy", "b.npy", "s0/d.npy", "a.npy", "a-b/x.npy", "a/x.npy"], sep="/")
    ['a.npy', 'b.npy', 'a/x.npy', 'a-b/x.npy', 's0/d.npy', 's1/c.npy']
    >>> dali_order(["s10/1.npy", "s2/10.npy", "s2/9.npy", "10.npy", "9.npy"], sep="/", sort="natural")
    ['9.npy', '10.npy', 's2/9.npy', 's2/10.npy', 's10/1.npy']
    """
    top = [p for p in paths if sep not in p]
    if len(top) == len(paths):
        return fs_sorted(top, sort)
    subs: dict[str, list[str]] = {}
    for p in [p for p in paths if sep in p]:
        folder = p.partition(sep)[0]
        names = subs.get(folder)
        if names is None:
            names = subs[folder] = []
        names.append(p)
    ordered = fs_sorted(top, sort)
    for sub in fs_sorted(list(subs), sort):
        ordered += fs_sorted(subs[sub], sort)  # (paths sharing the prefix "sub/" sort as their names do)
    return ordered
