"""Which file of one dataset goes with which of another: the names :func:`~npydask.zip_datasets` pairs on.

Pure functions of names (no file system). A member's files are named by
:func:`relative_names` (each path relative to the folder all of them share,
without its ``.npy`` or ``.npz`` extension), and :func:`pairing_names`
removes what every one of those names shares at its start and at its end,
so that ``ct_1.npy`` of the images and ``ct_1_seg.npy`` of the labels both
become ``1``, as do nnU-Net's ``case_001_0000.npy`` and ``case_001.npy``
(``001``):

* The common affixes are cut only where a digit does not meet a digit:
  images ``ct_10`` .. ``ct_19`` share the prefix ``ct_1``, but removing it
  would split their case numbers, so ``ct_`` is removed (names ``10`` ..
  ``19``). The same holds at the end (``case_001_0000`` and
  ``case_011_0000`` share ``1_0000``; ``_0000`` is removed).
* A member of one file shares everything with itself: its name becomes
  ``""``, and it pairs with whatever single file the other members hold.
* The prefix is removed first; the suffix is taken from what is left, so
  the two never overlap.

:func:`first_mismatch` finds the first position whose members' names
differ; :func:`join_order` the order that lines each member up with the
first member's names (``pair_by="name"``).

Examples
--------
>>> pairing_names(["ct_1", "ct_10", "ct_2"]), pairing_names(["ct_1_seg", "ct_10_seg", "ct_2_seg"])
(['1', '10', '2'], ['1', '10', '2'])
>>> pairing_names(["ct_10", "ct_11", "ct_19"])
['10', '11', '19']
>>> pairing_names(["case_001_0000", "case_011_0000"]), pairing_names(["case_001", "case_011"])
(['001', '011'], ['001', '011'])
>>> pairing_names(["only_one"])
['']
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "PAIRINGS",
    "Mismatch",
    "affixes",
    "first_mismatch",
    "join_order",
    "pairing_names",
    "relative_names",
]

PAIRINGS = ("checked", "name", "position")
"""The values of ``pair_by``: by position with the names checked, joined on the names, or by position unchecked."""

_SEPARATORS = "/" + os.sep + (os.altsep or "")
_EXTENSIONS = (".npy", ".npz")  # (both 4 characters long)


def relative_names(paths: Sequence[str]) -> list[str]:
    """Each path relative to the folder every one of them is in, without a final ``.npy`` or ``.npz``.

    Examples
    --------
    >>> relative_names(["/data/labels/a/ct_1_seg.npy", "/data/labels/b/ct_2_seg.npy"])
    ['a/ct_1_seg', 'b/ct_2_seg']
    >>> relative_names(["s3://bucket/imagesTr/case_001_0000.npy"])
    ['case_001_0000']
    """
    if not paths:
        return []
    common = os.path.commonprefix(list(paths)) if len(paths) > 1 else paths[0]
    cut = max(common.rfind(s) for s in _SEPARATORS) + 1
    return [p[cut:-4] if p.endswith(_EXTENSIONS) else p[cut:] for p in paths]


def _between_digits(text: str, at: int) -> bool:
    """Whether position ``at`` of ``text`` falls between two digits (a cut there would split a number)."""
    return 0 < at < len(text) and text[at - 1].isdigit() and text[at].isdigit()


def affixes(names: Sequence[str]) -> tuple[str, str]:
    """The prefix and suffix every one of ``names`` shares, each cut where a digit does not meet a digit.

    Examples
    --------
    >>> affixes(["ct_1_seg", "ct_12_seg"]), affixes(["ct_10", "ct_19"]), affixes(["a"])
    (('ct_', '_seg'), ('ct_', ''), ('a', ''))
    """
    if not names:
        return "", ""
    if len(names) == 1:
        return names[0], ""
    lo, hi = min(names), max(names)  # (the common prefix of a list is the common prefix of its extremes)
    n = len(os.path.commonprefix([lo, hi]))
    while n and lo[n - 1].isdigit() and any(_between_digits(name, n) for name in names):
        n -= 1  # (only where the prefix ends in a digit can a name go on with one)
    shortest = min(len(name) for name in names) - n
    rest = [name[n:][::-1] for name in names]
    m = min(len(os.path.commonprefix([min(rest), max(rest)])), shortest)
    while m and rest[0][m - 1].isdigit() and any(_between_digits(name, len(name) - m) for name in names):
        m -= 1
    return names[0][:n], (names[0][len(names[0]) - m :] if m else "")


def pairing_names(names: Sequence[str]) -> list[str]:
    """``names`` without the affixes they all share (:func:`affixes`): what files are paired on.

    Examples
    --------
    >>> pairing_names(["img/3", "img/12"]), pairing_names(["case_001_0000", "case_002_0000"])
    (['3', '12'], ['001', '002'])
    """
    prefix, suffix = affixes(names)
    a, m = len(prefix), len(suffix)
    return [name[a : len(name) - m] for name in names]


@dataclass(frozen=True)
class Mismatch:
    """The first position whose members' pairing names differ, and how many positions differ in all."""

    position: int
    names: dict[str, str]
    differ: int


def first_mismatch(names: Mapping[str, Sequence[str]]) -> Mismatch | None:
    """The first position at which the members' names (all of one length) differ, else ``None``.

    Examples
    --------
    >>> first_mismatch({"image": ["1", "10", "2"], "label": ["10", "1", "2"]})
    Mismatch(position=0, names={'image': '1', 'label': '10'}, differ=2)
    >>> first_mismatch({"image": ["1", "2"], "label": ["1", "2"]}) is None
    True
    """
    columns = [list(col) for col in names.values()]
    first = columns[0]
    if all(col == first for col in columns[1:]):  # (compared in C: the common case costs little)
        return None
    differ = [i for i in range(len(first)) if any(col[i] != first[i] for col in columns[1:])]
    if not differ:
        return None
    at = differ[0]
    return Mismatch(at, {k: col[at] for k, col in names.items()}, len(differ))


def join_order(names: Mapping[str, Sequence[str]], show: Callable[[str, int], str]) -> dict[str, list[int]]:
    """Per member, the positions of its files in the first member's order of names (``pair_by="name"``).

    ``show(key, i)`` names file ``i`` of member ``key`` in messages.

    Raises
    ------
    ValueError
        A member holds a name twice, or a name is missing from a member
        (the message lists up to five of each member's missing names).

    Examples
    --------
    >>> join_order({"image": ["1", "10", "2"], "label": ["10", "2", "1"]}, lambda k, i: f"{k}[{i}]")
    {'image': [0, 1, 2], 'label': [2, 0, 1]}
    """
    where: dict[str, dict[str, int]] = {}
    for key, column in names.items():
        seen: dict[str, int] = {}
        for i, name in enumerate(column):
            if name in seen:
                raise ValueError(
                    f"zip_datasets(pair_by='name'): {key!r} has two files named {name!r} once the affixes common "
                    f"to its files are removed ({show(key, seen[name])} and {show(key, i)}); pass key= to say "
                    "which name each file pairs on"
                )
            seen[name] = i
        where[key] = seen
    first_key = next(iter(names))
    order = list(names[first_key])
    missing = []
    for key, seen in where.items():
        gone = [n for n in order if n not in seen]
        extra = [n for n in seen if n not in where[first_key]]
        if gone:
            missing.append(f"{len(gone)} of {first_key!r}'s names missing from {key!r} ({_few(gone)})")
        if extra:
            missing.append(f"{len(extra)} of {key!r}'s names missing from {first_key!r} ({_few(extra)})")
    if missing:
        raise ValueError(
            "zip_datasets(pair_by='name') joins files on their names once the affixes common to each member are "
            f"removed, and every name must be in every member: found {'; '.join(missing)}. Add or remove the "
            "files, or pass key= to say which name each file pairs on"
        )
    return {key: [seen[n] for n in order] for key, seen in where.items()}


def _few(names: Sequence[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:5])
    return shown + (", ..." if len(names) > 5 else "")
