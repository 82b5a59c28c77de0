"""Coordinates along a folder's file axis: values read from the file names, and balanced file chunks.

Pure: names in, arrays out. The engine (:mod:`npydask.xarray._open`) passes
each file's path relative to the folder (what the ``file`` coordinate holds).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["balanced", "coords_from_names"]

_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_ISO_TIME = re.compile(r"[0-9]{4}-[0-9]{2}(?:-[0-9]{2}(?:[T ][0-9]{2}(?::[0-9]{2}(?::[0-9]{2}(?:\.[0-9]+)?)?)?)?)?")


def coords_from_names(
    names: Sequence[str], file_coord: str | re.Pattern[str] | Callable[[str], Any], coord_name: str | None = None
) -> dict[str, np.ndarray]:
    """Coordinate values for each file, read from its relative path ``names[i]``.

    ``file_coord`` is a regular expression (searched in each name, as
    :func:`re.search`) or a callable. Each *named group* of the expression
    gives a coordinate of that name; an expression without named groups
    must have one group, named by ``coord_name``. A callable is called with
    each name and its results form the coordinate ``coord_name``. A group's
    texts become integers when all are integers, floats when all are
    decimal numbers, ``datetime64`` when all are ISO 8601 dates or times
    (``2024-01-05``, ``2024-01-05T12:00``), else strings; a callable's
    results are kept as returned (``numpy.asarray`` of them).

    Raises
    ------
    ValueError
        A name the expression does not match (naming it), an expression
        without a usable group, ``coord_name`` missing or given twice over.
    TypeError
        ``file_coord`` neither a str, a compiled pattern nor a callable.

    Examples
    --------
    >>> coords_from_names(["day_2.npy", "day_10.npy"], r"day_(?P<day>\\d+)")
    {'day': array([ 2, 10])}
    >>> coords_from_names(["t_2024-01-05.npy"], r"t_(?P<time>[\\d-]+)")["time"].dtype
    dtype('<M8[D]')
    >>> coords_from_names(["a_1.npy", "b_2.npy"], lambda name: name[0], coord_name="site")
    {'site': array(['a', 'b'], dtype='<U1')}
    """
    if callable(file_coord) and not isinstance(file_coord, re.Pattern):
        if not isinstance(coord_name, str) or not coord_name:
            raise ValueError(
                f"file_coord is a function ({file_coord!r}): name the coordinate it makes with coord_name='...'"
            )
        values = []
        for name in names:
            try:
                values.append(file_coord(name))
            except Exception as e:
                e.add_note(f"(raised by file_coord for the file {name!r})")
                raise
        return {coord_name: np.asarray(values)}
    if not isinstance(file_coord, (str, re.Pattern)):
        raise TypeError(
            "file_coord must be a regular expression with a named group (r'day_(?P<day>\\d+)') or a function "
            f"of the file's relative path, found {type(file_coord).__name__} {file_coord!r}"
        )
    pattern = re.compile(file_coord) if isinstance(file_coord, str) else file_coord
    groups: list[str | int] = list(pattern.groupindex)
    if groups and coord_name is not None:
        raise ValueError(
            f"file_coord {pattern.pattern!r} names its groups ({', '.join(map(str, groups))}), which name the "
            "coordinates: drop coord_name"
        )
    if not groups:
        if pattern.groups != 1 or not isinstance(coord_name, str) or not coord_name:
            raise ValueError(
                f"file_coord {pattern.pattern!r} has {pattern.groups} groups and none named: name the group "
                "(r'day_(?P<day>\\d+)') or give one group and coord_name='day'"
            )
        groups = [1]
    texts: list[list[str]] = [[] for _ in groups]
    for name in names:
        match = pattern.search(name)
        if match is None:
            raise ValueError(
                f"file_coord {pattern.pattern!r} does not match the file {name!r}: every file needs a value; "
                "leave such files out with file_filter, or loosen the expression"
            )
        for column, group in zip(texts, groups):
            text = match.group(group)
            column.append("" if text is None else text)
    return {str(coord_name if g == 1 and not pattern.groupindex else g): _typed(t) for g, t in zip(groups, texts)}


def _typed(texts: list[str]) -> np.ndarray:
    """Texts as integers, decimal numbers or ISO 8601 times when every one is such, else as strings."""
    if texts and all(_INT.fullmatch(t) for t in texts):
        try:
            return np.array([int(t) for t in texts], dtype=np.int64)
        except OverflowError:
            pass
    if texts and all(_FLOAT.fullmatch(t) for t in texts):
        return np.array([float(t) for t in texts])
    if texts and all(_ISO_TIME.fullmatch(t) for t in texts):
        try:
            return np.array([np.datetime64(t.replace(" ", "T")) for t in texts])
        except ValueError:
            pass
    return np.array(texts, dtype=str)


def balanced(n: int, parts: int) -> tuple[int, ...]:
    """``n`` split into ``parts`` sizes that differ by at most one, larger first (no trailing small chunk).

    Examples
    --------
    >>> balanced(10, 2), balanced(10, 4), balanced(3, 3)
    ((5, 5), (3, 3, 2, 2), (1, 1, 1))
    """
    parts = max(1, min(parts, n)) if n else 1
    size, extra = divmod(n, parts)
    return tuple(size + 1 if i < extra else size for i in range(parts))
