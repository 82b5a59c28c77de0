"""Where the :class:`~npydask.samplers.Stitcher` puts each file's result, plane range by plane range.

* :class:`ArrayOutput`: a NumPy array, kept.
* :class:`NpyOutput`: ``<folder>/<name>.npy`` through a storage target (a
  local temporary file renamed into place when complete, or one PUT).
* :class:`ZarrOutput`: the array ``<name>`` of a zarr v3 group, through the
  store :func:`npydask.zarr_store` opens (written chunk by chunk as planes
  become final; chunks span a tile step of planes, so few are written twice).
  A local group's array is written into a temporary group beside it
  (:class:`ZarrStaging`) and its folder renamed into the group when complete;
  a group in object storage gets a hidden temporary array, copied server side
  over the array when complete (:class:`~npydask.samplers._remote_zarr.RemoteStaging`).

Local temporaries are named ``.<name>.stitch<10 hex>.npydask-tmp`` and held
under an ``flock`` while their Stitcher runs: the lock goes with the process,
so the next Stitcher on the same ``out`` (:func:`remove_stale`) removes only
those of runs that are gone, and never another writer's (``to_npy``'s runs
are 16 hex digits).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import secrets
import shutil
from typing import Any

import numpy as np

from npydask.samplers._paths import source_for
from npydask.samplers._remote_zarr import RemoteStaging
from npydask.storage import TMP_SUFFIX, fsync_folder, temporary_name
from npydask.storage.base import Source, Target
from npydask.storage.local import LocalTarget
from npydask.storage.urls import is_url, redact
from npydask.write.npy import check_names, plan_header
from npydask.write.zarr import check_zarr_dtype
from npydask.write.zarr_store import require_zarr, zarr_store

try:
    import fcntl
except ImportError:  # (Windows: no flock; a crashed run's temporaries are then left for the user to remove)
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "ArrayOutput",
    "NpyOutput",
    "Output",
    "ZarrOutput",
    "ZarrStaging",
    "hold",
    "is_zarr",
    "check_not_inputs",
    "new_stitch_run",
    "output_names",
    "release",
    "remove_stale",
    "zarr_group",
]

_RUN = re.compile(r"stitch[0-9a-f]{10}" + re.escape(TMP_SUFFIX))
"""The end of a Stitcher's temporary name after its target's (cut) name and a dot."""

_RUN_CHARS = len("stitch") + 10 + len(TMP_SUFFIX)


def new_stitch_run() -> str:
    """A fresh id for one Stitcher's temporaries: ``stitch`` and 10 hex digits (as long as ``to_npy``'s ids)."""
    return "stitch" + secrets.token_hex(5)


def hold(path: str) -> int | None:
    """An exclusive ``flock`` on ``path`` (a file or folder), or ``None`` when another holds it (or none is possible).

    The lock lives as long as the descriptor returned, so it goes with a
    process that is killed.
    """
    if fcntl is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def release(fd: int | None) -> None:
    """Close a descriptor :func:`hold` returned (its lock goes with it)."""
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def _stale(folder: str, targets: list[str]) -> list[str]:
    """The Stitcher temporaries in ``folder`` of the targets ``targets`` (names in ``folder``) whose run is gone."""
    prefixes = {os.path.basename(temporary_name(os.path.join(folder, t), "x" * 16))[:-_RUN_CHARS] for t in targets}
    try:
        entries = os.listdir(folder)
    except OSError:
        return []
    return [
        os.path.join(folder, e)
        for e in sorted(entries)
        if e[:-_RUN_CHARS] in prefixes and _RUN.fullmatch(e[-_RUN_CHARS:])
    ]


def remove_stale(out: str, names: list[str], zarr: bool) -> None:
    """Remove what killed Stitcher runs left at the local ``out``; put back an array a run was swapping out.

    For a folder of ``.npy`` files: the temporary files of ``names``. For a
    zarr group: the temporary groups beside it, after moving back any array
    of ``out`` such a run had set aside and not yet replaced. Temporaries
    whose run still holds their lock are left alone.
    """
    out = os.path.abspath(out)
    found = _stale(os.path.dirname(out), [os.path.basename(out)]) if zarr else _stale(out, names)
    for path in found:
        fd = hold(path)
        if fd is None:
            continue  # a live run's
        try:
            if zarr:
                _put_back(path, out)
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
        except OSError:
            pass  # (removed meanwhile by another run's clean-up)
        finally:
            release(fd)


def is_zarr(out: str) -> bool:
    """Whether ``out`` names a zarr group (it ends in ``.zarr``) rather than a folder of ``.npy`` files."""
    return out.rstrip("/").endswith(".zarr")


def output_names(files: list[str], zarr: bool) -> list[str]:
    """Each file's output name: its base name (``.npy`` kept for a folder, dropped for a zarr array).

    Raises
    ------
    ValueError
        Two files share a base name.
    """
    names = check_names([f.rsplit("/", 1)[-1].split("?", 1)[0] for f in files])
    return [n.removesuffix(".npy") for n in names] if zarr else names


class Output:
    """One file's result being written: planes ``[first, first + n)`` of the first patch axis at a time."""

    def __init__(self, shape: tuple[int, ...], nc: int) -> None:
        self.shape, self.nc = shape, nc

    def write(self, first: int, value: np.ndarray) -> None:
        """Store ``value``: planes ``first, ...`` of the first patch axis, every channel."""
        raise NotImplementedError

    def finish(self) -> Any:
        """The result: the array, or where it was written."""
        raise NotImplementedError

    def abort(self) -> None:
        """Drop what was written (a temporary); an earlier result at the target stays as it was."""


class ArrayOutput(Output):
    """A NumPy array, returned as it is."""

    def __init__(self, shape: tuple[int, ...], nc: int, dtype: np.dtype) -> None:
        super().__init__(shape, nc)
        self.array = np.empty(shape, dtype)

    def write(self, first: int, value: np.ndarray) -> None:
        self.array[(*(slice(None),) * self.nc, slice(first, first + value.shape[self.nc]))] = value

    def finish(self) -> np.ndarray:
        return self.array


class NpyOutput(Output):
    """``where`` (a local path or an object URL), its header written first, each channel's planes at their offsets."""

    def __init__(
        self, shape: tuple[int, ...], nc: int, dtype: np.dtype, where: str, data_source: Source, run: str
    ) -> None:
        super().__init__(shape, nc)
        self.where = where
        preamble, header = plan_header(where, dtype, shape)
        size = header.data_offset + header.nbytes
        self.target: Target
        self.lock: int | None = None
        if is_url(where):
            from npydask.storage.object_write import ObjectTarget

            self.target = ObjectTarget(source_for(where, data_source)[0], where, size)  # type: ignore[arg-type]
            self.target.write_block(0, preamble)
        else:
            os.makedirs(os.path.dirname(where), exist_ok=True)
            local = self.target = LocalTarget(where, size)
            local.tmp = temporary_name(where, run)  # (the Stitcher's run: the next run knows it for its own)
            local.write_block(0, preamble)
            self.lock = hold(local.tmp)
        self.offset = header.data_offset
        self.plane = math.prod(shape[nc + 1 :]) * dtype.itemsize

    def write(self, first: int, value: np.ndarray) -> None:
        channels, depth = self.shape[: self.nc], self.shape[self.nc]
        for c in np.ndindex(*channels):
            n = int(np.ravel_multi_index(c, channels)) if c else 0
            self.target.write_block(self.offset + (n * depth + first) * self.plane, np.ascontiguousarray(value[c]))

    def finish(self) -> str:
        try:
            self.target.finish()
        finally:
            release(self.lock)
            self.lock = None
        return redact(self.where) if is_url(self.where) else self.where

    def abort(self) -> None:
        try:
            self.target.abort()
        finally:
            release(self.lock)
            self.lock = None


class ZarrOutput(Output):
    """The array ``name`` of a zarr group, chunks a tile step of planes deep.

    A local group's array is made in its temporary group (``ZarrStaging``)
    and moved into ``group`` (replacing one there) when complete; a group in
    object storage, which has no rename, gets a hidden temporary array that
    is copied over the array when complete (:class:`RemoteStaging`).
    """

    def __init__(
        self,
        shape: tuple[int, ...],
        nc: int,
        dtype: np.dtype,
        group: Any,
        name: str,
        step: int,
        staging: ZarrStaging | RemoteStaging,
    ) -> None:
        super().__init__(shape, nc)
        plane = [min(n, 256) for n in shape[nc + 1 :]]
        chunks = (*(1,) * nc, min(step, shape[nc]), *plane)
        self.group, self.name, self.staging = group, name, staging
        if isinstance(staging, ZarrStaging):
            self.tmp, into, config = name, staging.group(), None
        else:  # (every chunk written, empty or not: a complete temporary array is one with all its chunks)
            self.tmp, into, config = staging.temporary(name), group, {"write_empty_chunks": True}
        self.array = into.create_array(
            self.tmp, shape=shape, dtype=check_zarr_dtype(dtype), chunks=chunks, overwrite=True, config=config
        )
        self.shown = name

    def write(self, first: int, value: np.ndarray) -> None:
        self.array[(*(slice(None),) * self.nc, slice(first, first + value.shape[self.nc]))] = value

    def finish(self) -> Any:
        if isinstance(self.staging, ZarrStaging):
            self.staging.publish(self.name)
        else:
            try:
                self.staging.complete(self.tmp, self.name)
            except BaseException:
                with contextlib.suppress(Exception):
                    self.staging.remove(self.tmp)
                raise
            self.staging.publish(self.tmp)  # (should it fail, the complete temporary is the next run's to publish)
        return self.group[self.name]

    def abort(self) -> None:
        if isinstance(self.staging, ZarrStaging):
            shutil.rmtree(os.path.join(self.staging.path, self.name), ignore_errors=True)
        else:
            self.staging.remove(self.tmp)


class ZarrStaging:
    """The temporary zarr group beside a local group ``out``, where a Stitcher run's arrays are written.

    ``.<out's name>.stitch<10 hex>.npydask-tmp`` in ``out``'s folder, made on
    first use and locked (:func:`hold`) until :meth:`remove`. :meth:`publish`
    moves a complete array's folder into ``out``: an array already there is
    first renamed into this group's ``ASIDE`` folder, then the new one renamed
    into place, then the old one deleted. The two renames are the only moment
    ``out`` lacks the array; a run killed between them leaves the old array
    set aside, and :func:`remove_stale` moves it back.
    """

    ASIDE = ".replaced"

    def __init__(self, out: str, run: str, data_source: Source) -> None:
        self.out = os.path.abspath(out)
        self.path = temporary_name(self.out, run)
        self.source = data_source
        self.lock: int | None = None
        self._group: Any = None

    def group(self) -> Any:
        """The temporary group (made and locked on first use)."""
        if self._group is None:
            self._group = zarr_group(self.path, self.source)
            self.lock = hold(self.path)
        return self._group

    def publish(self, name: str) -> None:
        """Move the complete array ``name`` from here into ``out``, replacing one there."""
        src, dst, aside = (
            os.path.join(self.path, name),
            os.path.join(self.out, name),
            os.path.join(self.path, self.ASIDE, name),
        )
        replaced = os.path.lexists(dst)
        if replaced:
            os.makedirs(os.path.dirname(aside), exist_ok=True)
            os.rename(dst, aside)
        try:
            os.rename(src, dst)
        except BaseException:
            if replaced:
                os.rename(aside, dst)
            raise
        fsync_folder(self.out)
        if replaced:
            shutil.rmtree(aside, ignore_errors=True)

    def remove(self) -> None:
        """Delete the temporary group and its lock (arrays not published are dropped, any set aside put back)."""
        if self._group is not None:
            with contextlib.suppress(OSError):
                _put_back(self.path, self.out)
            shutil.rmtree(self.path, ignore_errors=True)
            self._group = None
        release(self.lock)
        self.lock = None


def _put_back(staging: str, out: str) -> None:
    """Move the arrays the temporary group ``staging`` set aside back into ``out`` where none replaced them."""
    aside = os.path.join(staging, ZarrStaging.ASIDE)
    for name in sorted(os.listdir(aside)) if os.path.isdir(aside) else []:
        if not os.path.lexists(os.path.join(out, name)):
            os.rename(os.path.join(aside, name), os.path.join(out, name))


def check_not_inputs(out: str, names: list[str], files: list[str], zarr: bool) -> None:
    """Refuse an ``out`` that is the dataset's own folder, holds its files, or would write over one.

    ``files`` are the dataset's files (every member's), ``names`` the
    outputs' names in ``out``.

    Raises
    ------
    ValueError
        Naming ``out``, the input it would overwrite, and the fix.
    """
    url = is_url(out)

    def norm(p: str) -> str:
        return p.split("?", 1)[0].rstrip("/") if url else os.path.realpath(p)

    inputs = {norm(f) for f in files if is_url(f) == url}
    if not inputs:
        return
    where = norm(out)
    parts = [p.rsplit("/", 1)[0].split("/") if url else os.path.dirname(p).split(os.sep) for p in inputs]
    common = parts[0][: next((i for i, c in enumerate(zip(*parts)) if len(set(c)) > 1), min(map(len, parts)))]
    root = "/".join(common) if url else os.sep.join(common) or os.sep
    sep = "/" if url else os.sep
    targets = [where] if zarr else [where + sep + n for n in names]
    hit = (
        [root]
        if where == root
        else [t for t in targets if t in inputs] or [f for f in sorted(inputs) if zarr and f.startswith(where + sep)]
    )
    if hit:
        what = "is the dataset's own folder" if hit[0] == root else f"would overwrite the dataset's file {hit[0]!r}"
        raise ValueError(
            f"out={out!r} {what}: its results would replace the files it is stitched from; pass another out=, "
            "or overwrite=True to write there anyway"
        )


def zarr_group(out: str, data_source: Source) -> Any:
    """The zarr group at ``out`` (a local path or URL; an object URL in the dataset's bucket with its options)."""
    zarr = require_zarr("Stitcher(out='....zarr')")
    options = None
    if is_url(out):
        source, _ = source_for(out, data_source)
        spec = getattr(source, "spec", None)
        if source is data_source and spec is not None:
            options = dict(spec.options)
    store = zarr_store(out if is_url(out) else os.path.abspath(out), options)
    return zarr.open_group(store, mode="a", zarr_format=3)
