"""Folders written by ``dask.array.to_npy_stack``, read without unpickling their ``info`` file.

``to_npy_stack(dirname, x, axis)`` writes block ``i`` along ``axis`` as
``dirname/<i>.npy`` and ``pickle.dump({"chunks": ..., "dtype": ...,
"axis": ...})`` as ``dirname/info``; dask's ``from_npy_stack`` unpickles that
file, so a folder from elsewhere can run code when it is opened (dask#12578).
:func:`from_npy_stack` reads the same folders as data:

* the files are ``0.npy .. N-1.npy`` in numeric order (``10.npy`` after
  ``9.npy``), each one chunk along the axis (as dask's own), read through
  :func:`npydask.open_dataset`'s checked headers and
  :meth:`~npydask.NpyDataset.concatenate`; dtype and chunks come from the
  headers, never from ``info``;
* the axis is ``axis=`` when given; else the ``axis`` of ``info``, whose
  pickle is replayed by :func:`npydask.format.plain_values` (plain
  values only; nothing imported or called) and whose ``chunks`` must then
  agree with the files (a leftover ``7.npy`` from an earlier, longer stack is
  reported, not read); else the one axis along which the files' shapes
  differ. An ``info`` that names anything but numpy's dtype, or describes more
  than :class:`~npydask.format.Limits` lets through (a few kilobytes
  of memo references can describe millions of chunk sizes), is ignored with a
  :class:`~npydask.errors.NpyDaskWarning`, never run.
"""

from __future__ import annotations

import operator
import os
import re
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import dask.array as da

from npydask._keywords import suggest_keywords
from npydask.dataset.open import open_dataset
from npydask.errors import NpyDaskWarning
from npydask.format import UnexpectedPickle, plain_values
from npydask.storage.base import Source
from npydask.storage.local import LOCAL
from npydask.storage.urls import join_url
from npydask.storage.where import lister_for, resolve

__all__ = ["StackInfo", "from_npy_stack", "parse_info", "stack_files"]

INFO = "info"
"""The name of the pickled metadata file ``to_npy_stack`` writes."""

MAX_INFO_BYTES = 16 << 20
"""Larger ``info`` files are ignored (dask's holds a few bytes per chunk)."""

_NUMBERED = re.compile(r"(0|[1-9][0-9]*)\.npy")
# What dask's info may name: numpy's dtype (and, in protocol 0-2 pickles of datetime
# dtypes, the bytes of their metadata through _codecs.encode).
_DTYPE_GLOBALS = frozenset({("numpy", "dtype"), ("_codecs", "encode")})


class StackInfo(NamedTuple):
    """The parts of a ``to_npy_stack`` ``info`` file npydask uses: the axis and the chunks it records."""

    axis: int
    chunks: tuple[tuple[int, ...], ...]


def parse_info(data: bytes) -> StackInfo:
    """The axis and chunks of an ``info`` file's bytes, read as data (pure).

    Raises
    ------
    ValueError
        (:class:`~npydask.format.UnexpectedPickle`) The bytes are not
        the pickle of a dict with an ``int`` ``axis`` and ``chunks`` of
        non-negative ``int`` sizes per axis, or they name anything but
        numpy's dtype.

    Examples
    --------
    >>> import pickle, numpy as np
    >>> parse_info(pickle.dumps({"chunks": ((2, 1), (4,)), "dtype": np.dtype("f4"), "axis": 0}))
    StackInfo(axis=0, chunks=((2, 1), (4,)))
    """
    found = plain_values(data, _DTYPE_GLOBALS)
    if not isinstance(found, dict):
        raise UnexpectedPickle(f"info holds a {type(found).__name__}, not the dict to_npy_stack writes")
    axis, chunks = found.get("axis"), found.get("chunks")
    if type(axis) is not int:
        shown = "missing" if axis is None else f"a {type(axis).__name__}"
        raise UnexpectedPickle(f"info's 'axis' is {shown}, not an int")
    if (
        not isinstance(chunks, tuple)
        or not all(isinstance(c, tuple) for c in chunks)
        or not all(type(n) is int and n >= 0 for c in chunks for n in c)
    ):
        raise UnexpectedPickle("info's 'chunks' is not a tuple of tuples of sizes")
    if not 0 <= axis < len(chunks):
        raise UnexpectedPickle(f"info's 'axis' {_int(axis)} is not one of the {len(chunks)} axes of its 'chunks'")
    return StackInfo(axis, chunks)


def stack_files(names: Sequence[str], where: str) -> list[str]:
    """The names ``0.npy .. N-1.npy`` in numeric order, from a folder's ``.npy`` file names (pure).

    Raises
    ------
    ValueError
        No ``0.npy``, a number missing from the sequence, or a ``.npy`` file
        that is not one of it (``01.npy``, ``a.npy``), naming them and ``where``.

    Examples
    --------
    >>> stack_files(["10.npy", "2.npy", "0.npy", "1.npy"] + [f"{i}.npy" for i in range(3, 10)], "d")[:3]
    ['0.npy', '1.npy', '2.npy']
    >>> stack_files(["0.npy", "2.npy"], "d")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: d: 1.npy is missing from the stack 0.npy .. 2.npy (a folder written by ...); restore it, or ...
    """
    numbered: dict[int, str] = {}
    extra: list[str] = []
    for name in names:
        m = _NUMBERED.fullmatch(name)
        if m is None:
            extra.append(name)
        else:
            numbered[int(m[1])] = name
    if extra:
        shown = ", ".join(sorted(extra)[:3]) + (f" and {len(extra) - 3} more" if len(extra) > 3 else "")
        raise ValueError(
            f"{where}: {shown} {'is' if len(extra) == 1 else 'are'} not part of a dask.array.to_npy_stack folder "
            "(its files are named 0.npy, 1.npy, ... exactly); move extra files elsewhere, or read the files with "
            "npydask.open_dataset(files=[...]).concatenate(axis)"
        )
    if not numbered:
        raise ValueError(
            f"{where}: no 0.npy, 1.npy, ... here: not a folder written by dask.array.to_npy_stack "
            "(for other folders of .npy files use npydask.open_dataset)"
        )
    last = max(numbered)
    missing = [i for i in range(last + 1) if i not in numbered]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        shown = ", ".join(f"{i}.npy" for i in missing[:5]) + more
        verb = "is" if len(missing) == 1 else "are"
        raise ValueError(
            f"{where}: {shown} {verb} missing from the stack 0.npy .. {last}.npy (a folder written by "
            "dask.array.to_npy_stack holds every number); restore it, or read the files there with "
            "npydask.open_dataset(files=[...]).concatenate(axis)"
        )
    return [numbered[i] for i in range(last + 1)]


@suggest_keywords
def from_npy_stack(
    dirname: str | os.PathLike[str], *, axis: int | None = None, storage_options: dict[str, Any] | None = None
) -> da.Array:
    """A folder written by ``dask.array.to_npy_stack`` as one lazy array, its ``info`` never unpickled.

    Parameters
    ----------
    dirname : str, os.PathLike or URL
        The folder (or object-store prefix) holding ``0.npy .. N-1.npy``
        and, usually, ``info``.
    axis : int, optional
        The axis the files were split along. Without it: ``info``'s, read as
        data; else the one axis along which the files' shapes differ (any
        axis for a single file).
    storage_options : dict, optional
        For an object-store prefix (``s3://bucket/stack/``): as in
        :func:`npydask.open_dataset`.

    Returns
    -------
    dask.array.Array
        Equal to dask's ``from_npy_stack(dirname)``: one chunk per file along
        ``axis``, whole along the others; dtype from the files' headers, in
        native byte order (``NpyDataset.concatenate``'s: files of ``>i2``
        give ``int16``, where dask's reader keeps ``>i2``; the values are equal).

    Raises
    ------
    ValueError
        The folder is not a stack (no ``0.npy``, a missing number, a stray
        ``.npy`` file, files of different dtypes or ndims, shapes that
        disagree off the axis), ``info`` disagrees with the files, or the axis
        cannot be told without ``axis=``.
    NpyFormatError
        A file that is not a valid ``.npy`` file.
    TypeError
        ``axis`` is not an integer.
    OSError
        The folder does not exist or cannot be listed (the builtin subclass, naming it).

    Warns
    -----
    NpyDaskWarning
        ``info`` is not what ``to_npy_stack`` writes (it names another
        callable, is malformed, or is too large in bytes or in the work its
        pickle describes): it is ignored, never run.

    Examples
    --------
    >>> import numpy as np, npydask, os, tempfile
    >>> folder, a = tempfile.mkdtemp(), np.arange(24).reshape(4, 6)
    >>> for i, part in enumerate(np.split(a, [1, 3])): np.save(os.path.join(folder, f"{i}.npy"), part)
    >>> y = npydask.from_npy_stack(folder)  # (no info file here: the one axis whose length differs)
    >>> y.chunks, bool((y.compute() == a).all())
    (((1, 2, 1), (6,)), True)
    """
    if axis is not None:
        if isinstance(axis, bool) or not hasattr(axis, "__index__"):
            raise TypeError(f"axis must be an int or None, found {axis!r}")
        axis = operator.index(axis)
    where = resolve(dirname, storage_options)
    root, source, shown = where.path, where.source, where.shown
    ordered = stack_files(_list_npy(root, source, shown), shown)
    info = None if axis is not None else _info(root, source, shown)
    join = os.path.join if where.local else join_url
    ds = open_dataset(files=[join(root, name) for name in ordered], storage_options=storage_options)
    shapes = ds.shapes
    ndim = ds.ndim
    if ndim == 0:
        raise ValueError(f"{shown}: the files hold 0-d arrays, which have no axis to stack along")
    if axis is None:
        axis = info.axis if info is not None else _axis_from_shapes(shapes, shown)
    if not -ndim <= axis < ndim:
        raise ValueError(f"{shown}: axis {_int(axis)} is out of range for the files' {ndim} dimensions")
    axis %= ndim
    lengths = tuple(s[axis] for s in shapes)
    if info is not None:
        _agree(info, shapes, lengths, shown)
    others = [(s,) for s in shapes[0]]
    chunks = tuple(lengths if d == axis else others[d] for d in range(ndim))
    return ds.concatenate(axis, chunks=chunks)


def _list_npy(root: str, source: Source, shown: str) -> list[str]:
    """The names of the ``.npy`` files directly in ``root`` (subfolders are not part of a stack)."""
    sep = os.sep if source is LOCAL else "/"
    try:
        listing = lister_for(root, source).list(False, lambda name: name.endswith(".npy"))
    except (FileNotFoundError, NotADirectoryError) as e:
        raise type(e)(e.errno, f"{shown} is not a folder (pass the folder dask.array.to_npy_stack wrote)", shown) from e
    return [p for p in listing.paths if sep not in p]


def _info(root: str, source: Source, shown: str) -> StackInfo | None:
    """``info`` read as data; ``None`` (warned about unless absent) when there is none to use."""
    where = f"{shown.rstrip('/')}/{INFO}" if source is not LOCAL else os.path.join(shown, INFO)
    try:
        path = os.path.join(root, INFO) if source is LOCAL else join_url(root, INFO)
        data = source.read_bytes(path, MAX_INFO_BYTES + 1, what="to_npy_stack info file")
    except FileNotFoundError:
        return None
    try:
        if len(data) > MAX_INFO_BYTES:
            raise UnexpectedPickle(f"it holds {len(data):,} bytes, more than {MAX_INFO_BYTES:,}")
        return parse_info(data)
    except UnexpectedPickle as e:
        warnings.warn(
            f"{where} is not the info file dask.array.to_npy_stack writes ({e}); it was not unpickled and is "
            "ignored: the axis comes from the files' shapes (pass axis= to say it)",
            NpyDaskWarning,
            stacklevel=3,
        )
        return None


def _axis_from_shapes(shapes: list[tuple[int, ...]], shown: str) -> int:
    """The one axis along which the files' shapes differ (0 for one file)."""
    if len(shapes) == 1:
        return 0  # (one file: every axis gives the same array)
    differ = [d for d in range(len(shapes[0])) if len({s[d] for s in shapes}) > 1]
    if len(differ) == 1:
        return differ[0]
    if not differ:
        raise ValueError(
            f"{shown}: no usable info file, and all {len(shapes)} files have shape {shapes[0]}, so the axis they "
            f"were split along cannot be told: pass axis= (0 to {len(shapes[0]) - 1})"
        )
    raise ValueError(
        f"{shown}: the files' shapes differ along axes {differ} (e.g. {shapes[0]} and "
        f"{next(s for s in shapes if s != shapes[0])}), so they are not the blocks of one array along one axis"
    )


def _agree(info: StackInfo, shapes: list[tuple[int, ...]], lengths: tuple[int, ...], shown: str) -> None:
    """Refuse files that are not the blocks ``info`` records (a stale ``7.npy``, a missing one, another ndim)."""
    fix = "pass axis= to read the files as they are, or write the stack again"
    if len(info.chunks) != len(shapes[0]):
        raise ValueError(
            f"{shown}: info records {len(info.chunks)} dimensions but the files have {len(shapes[0])}; {fix}"
        )
    recorded = info.chunks[info.axis]
    if len(recorded) != len(lengths):
        hint = (
            f" ({len(recorded)}.npy .. {len(lengths) - 1}.npy may be left from an earlier, longer stack)"
            if len(lengths) > len(recorded)
            else ""
        )
        raise ValueError(
            f"{shown}: info records {len(recorded)} blocks along axis {info.axis} but the folder holds "
            f"{len(lengths)} files{hint}; {fix}"
        )
    for d, (extents, n) in enumerate(zip(info.chunks, shapes[0])):
        if d != info.axis and sum(extents) != n:
            raise ValueError(
                f"{shown}: info records an extent of {_int(sum(extents))} along axis {d} but the files have {n}; {fix}"
            )
    for i, (want, got) in enumerate(zip(recorded, lengths)):
        if want != got:
            raise ValueError(
                f"{shown}: info records block {i} with {_int(want)} along axis {info.axis}, but {i}.npy has shape "
                f"{shapes[i]}; {fix}"
            )


def _int(n: int) -> str:
    """An int from ``info`` for a message: its digits, or its size in bits when it has too many to print.

    (Python refuses to print an int of more than 4,300 digits, and printing one
    takes time that grows with the square of its length.)

    Examples
    --------
    >>> _int(12), _int(-(2**80)), _int(10**5000)
    ('12', '-1208925819614629174706176', 'an integer of 16,610 bits')
    """
    return str(n) if n.bit_length() <= 128 else f"an integer of {n.bit_length():,} bits"
