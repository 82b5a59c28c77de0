"""Sliding-window outputs stitched back into whole volumes: :class:`Stitcher` (MONAI's ``sliding_window_inference``)."""

from __future__ import annotations

import contextlib
import itertools
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from npydask._keywords import suggest_keywords
from npydask.plan.sampling import check_int
from npydask.samplers._outputs import (
    ArrayOutput,
    NpyOutput,
    Output,
    ZarrOutput,
    ZarrStaging,
    check_not_inputs,
    is_zarr,
    new_stitch_run,
    output_names,
    remove_stale,
    zarr_group,
)
from npydask.samplers._remote_zarr import RemoteStaging
from npydask.samplers.base import dataset_members
from npydask.samplers.grid import Grid, GridBound
from npydask.storage.urls import is_url

__all__ = ["WEIGHTS", "Stitcher", "importance_map"]

WEIGHTS = ("mean", "gaussian")
"""The blending modes: every tile weighs alike, or by a Gaussian centred on the tile."""


def importance_map(
    patch: Sequence[int], weights: str = "mean", sigma_scale: float | Sequence[float] = 0.125
) -> np.ndarray:
    """The weight of each voxel of a tile, as MONAI's ``compute_importance_map`` (``float32``).

    ``"mean"``: ones. ``"gaussian"``: the product over axes of
    ``exp(-x**2 / (2 * sigma**2))``, ``x`` running from ``-(n - 1) / 2`` to
    ``(n - 1) / 2`` and ``sigma = sigma_scale * n``, then clamped from below at
    the larger of its minimum and ``1e-3`` (so no voxel weighs zero). Its
    maximum is 1 for odd sizes (just under 1 for even ones, as MONAI's).

    Examples
    --------
    >>> w = importance_map((5, 4), "gaussian")
    >>> w.shape, w.dtype, float(w.max()) <= 1.0, float(w.min()) >= 1e-3
    ((5, 4), dtype('float32'), True, True)
    """
    patch = tuple(patch)
    if weights == "mean":
        return np.ones(patch, np.float32)
    if weights != "gaussian":
        raise ValueError(f"weights must be one of {WEIGHTS}, found {weights!r}")
    scales = (
        [float(s) for s in np.broadcast_to(np.asarray(sigma_scale, np.float64), (len(patch),))]
        if np.ndim(sigma_scale) <= 1 and np.size(sigma_scale) in (1, len(patch))
        else []
    )
    if len(scales) != len(patch) or not all(s > 0 and math.isfinite(s) for s in scales):
        raise ValueError(f"sigma_scale must be positive, one value or one per patch axis, found {sigma_scale!r}")
    out = np.ones((), np.float32)
    for n, scale in zip(patch, scales):
        x = np.arange(-(n - 1) / 2.0, (n - 1) / 2.0 + 1, dtype=np.float32)[:n]
        sigma = np.float32(n * scale)
        g = np.exp(x**2 / (np.float32(-2) * sigma**2)).astype(np.float32)
        out = out[..., None] * g
    return np.maximum(out, max(float(out.min()), 1e-3)).astype(np.float32)


class _Slab:
    """One file in progress: the weighted sums of a tile's depth of planes (full other axes, padding included).

    Coordinates are the file's, shifted by ``origin`` (where padding before
    the file starts, 0 or negative per axis). ``row`` is the first plane the
    slab holds; planes before it are final and written. Tiles are counted
    row by row of the Grid's tiles along the first axis: ``rows`` is the
    current one (an index into ``starts[0]``) and ``got`` marks which of its
    tiles came, so the bookkeeping is one row's flags, not a record per tile.
    """

    def __init__(
        self,
        channels: tuple[int, ...],
        patch: tuple[int, ...],
        starts: tuple[tuple[int, ...], ...],
        extent: tuple[int, ...],
        dtype: np.dtype,
    ) -> None:
        self.starts = starts
        self.origin = tuple(min(0, a[0]) for a in starts)
        self.size = tuple(max(e, a[-1] + p) - o for e, a, p, o in zip(extent, starts, patch, self.origin))
        self.row = self.origin[0]
        self.rows = 0
        self.got = np.zeros([len(a) for a in starts[1:]], bool)
        self.left = self.got.size
        depth = min(patch[0], self.size[0])
        self.sums = np.zeros((*channels, depth, *self.size[1:]), dtype)
        self.weights = np.zeros((depth, *self.size[1:]), dtype)

    def remaining(self) -> int:
        """The tiles still to come."""
        return self.left + (len(self.starts[0]) - 1 - self.rows) * self.got.size


class _Progress:
    """A file's row and flags as a batch would leave them: :meth:`Stitcher.add` checks the whole batch on these."""

    def __init__(self, starts: tuple[tuple[int, ...], ...], slab: _Slab | None) -> None:
        self.starts = starts
        self.where = [{a: i for i, a in enumerate(axis)} for axis in starts]
        self.row_size = math.prod(len(a) for a in starts[1:])
        self.rows = 0 if slab is None else slab.rows
        self.left = self.row_size if slab is None else slab.left
        self.got = None if slab is None else slab.got  # (the slab's flags while in its row; None: a new row)
        self.seen: set[tuple[int, ...]] = set()
        self.complete = False

    def take(self, file: int, start: tuple[int, ...]) -> tuple[int, ...]:
        """Count the tile at ``start``; its index along each axis. Raises ``ValueError`` as :meth:`Stitcher.add`."""
        try:
            at = tuple(w[a] for w, a in zip(self.where, start))
        except KeyError:
            raise ValueError(f"the tile at {start} of file {file} is not one of its grid's tiles") from None
        if self.complete:
            raise ValueError(f"a tile of file {file} at {start}: the file is already complete (a tile given twice)")
        row, rest = at[0], at[1:]
        if row > self.rows and (self.left or row > self.rows + 1):
            skipped = [s for s in self._missing() if s[0] < start[0]]
            raise ValueError(
                f"the tile at {start} of file {file} came before its tiles at {skipped[:3]}"
                f"{' ...' if len(skipped) > 3 else ''}: tiles must arrive in the Grid's order along the first "
                "patch axis (rows of tiles by increasing start, any order within a row)"
            )
        if row > self.rows:
            self.rows, self.left, self.got, self.seen = row, self.row_size, None, set()
        if row < self.rows or rest in self.seen or (self.got is not None and self.got[rest]):
            raise ValueError(f"the tile at {start} of file {file} was given twice")
        self.seen.add(rest)
        self.left -= 1
        self.complete = not self.left and self.rows == len(self.starts[0]) - 1
        return at

    def _missing(self) -> list[tuple[int, ...]]:
        """The first few tiles missing from the current row and the rows after it (for messages)."""
        out: list[tuple[int, ...]] = []
        for row in range(self.rows, len(self.starts[0])):
            for rest in itertools.product(*(range(len(a)) for a in self.starts[1:])):
                if row > self.rows or not (rest in self.seen or (self.got is not None and self.got[rest])):
                    out.append((self.starts[0][row], *(a[i] for a, i in zip(self.starts[1:], rest))))
                    if len(out) > 3:
                        return out
        return out


class Stitcher:
    """Model outputs for a :class:`~npydask.samplers.Grid`'s tiles, blended back into one array per file.

    The weighted average of MONAI's ``sliding_window_inference``: each
    voxel is ``sum(w * y) / sum(w)`` over the tiles covering it, ``w`` the
    tile's :func:`importance_map`. Tiles of a file smaller than the patch
    hang over its edges (padded); what lies outside the file is dropped.

    Parameters
    ----------
    grid : Grid or its bound form
        The sampler that made the tiles (bound to ``dataset`` here when not yet).
    dataset : NpyDataset, MultiKeyDataset or ZippedDataset
        The dataset the tiles were read from (its files' extents, and with
        ``out`` their names).
    weights : {"mean", "gaussian"}, default "mean"
        Every tile's voxels weigh alike, or by a Gaussian centred on the tile.
    sigma_scale : float or sequence of float, default 0.125
        The Gaussian's sigma as a fraction of the patch, per axis (MONAI's).
    channels : tuple of int, default ()
        The model output's leading axes before the patch axes (``(2,)`` for
        two output channels): a batch is ``(B, *channels, *patch)`` and each
        file's result ``(*channels, *extent)``.
    dtype : dtype, default "float32"
        The results' dtype (sums are kept in it, or in ``float32`` for a
        narrower one).
    out : str or os.PathLike, optional
        Where each file's result is written, plane range by plane range as
        its planes become final, instead of being kept in memory:

        * a folder (local path, or URL prefix in object storage): one
          ``<file's base name>.npy`` per file, a local one written into a
          hidden temporary file beside it and renamed into place when
          complete, an object sent in one PUT when complete (held whole
          until then);
        * a path or URL ending in ``.zarr``: a zarr v3 group (made if
          missing) holding one array per file, named after its base name
          without ``.npy``, chunks a tile step of planes deep (as
          :func:`npydask.to_zarr` writes, through the store
          :func:`npydask.zarr_store` opens). A local group's array is written
          into a hidden temporary group beside ``out`` and its folder renamed
          into ``out`` when complete (an array there is renamed aside first,
          then deleted). In object storage, which has no rename, it is
          written as the hidden array ``.<name>.stitch<id>.npydask-tmp`` of
          the group (every chunk stored, empty or not; listed among the
          group's members while the run writes it) and, when complete,
          copied server side over the array: its ``zarr.json`` is deleted
          first, the chunks copied, chunks of the old array the new one lacks
          deleted, and the new ``zarr.json`` written last. So a reader sees
          the old array, then briefly none, then the new one, never a mix.

        Otherwise each file's result replaces an earlier one at its place
        only when its last tile is added, so a run that is stopped, fails or
        is killed leaves the earlier results (see :meth:`close`). An object URL in the
        dataset's own bucket is reached with the dataset's
        ``storage_options``; another with the environment's credentials.
        Files must have distinct base names.
    overwrite : bool, default False
        Allow an ``out`` that is the dataset's own folder, or whose results
        would replace the dataset's files. Without it such an ``out`` raises
        ``ValueError``.

    Notes
    -----
    **Order and memory.** Tiles may arrive in any batch sizes, with files in
    any order and interleaved, but within a file along the first patch axis
    they must come in the Grid's order (rows of tiles by increasing start;
    any order within a row): a tile that starts a new row while tiles of an
    earlier row are still missing raises ``ValueError``. Each file in progress holds one slab: the sums
    and weights of a tile's depth of planes over the file's whole other axes.
    When the next row of tiles starts, the planes before it are final:
    they are divided in place, written into the result (or ``out``) and dropped. So
    with the Grid's own order (file by file, raster) at most one slab is
    held, besides the results kept in memory when ``out`` is not given.

    **Stopping and crashes.** :meth:`close` drops the files in progress and
    their temporaries; ``with Stitcher(...) as s:`` closes at the end of the
    block, as a file does, whether it ends normally or by an exception. What
    is published is each file completed by :meth:`add` (call :meth:`result`
    inside the block to check that all are). A killed process leaves its
    temporaries; the next Stitcher with the same local ``out`` removes those
    whose process is gone (each is held under a lock while its run lives)
    and puts back an array a run was replacing at the moment it died.
    Object storage has no locks: there a run with temporary arrays holds a
    lease, the object ``.stitch<id>.npydask-tmp`` of the group, which it
    writes again every 10 s. The next Stitcher on that ``out`` takes a run
    for dead when its lease is over two minutes older than its own (by the
    server's clock), or at once when the run's process was on the same
    machine and is gone: it finishes publishing that run's arrays that were
    complete (so an array killed, or whose copies failed, while being
    copied appears, whole) and deletes the rest of what it left. A run
    paused for over two minutes may find its temporaries removed so: it
    then raises ``FileNotFoundError`` instead of publishing.

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os
    >>> from npydask.samplers import Grid, Stitcher
    >>> root = tempfile.mkdtemp(); x = np.arange(90, dtype="f4").reshape(9, 10)
    >>> np.save(os.path.join(root, "a.npy"), x)
    >>> ds = npydask.open_dataset(root); grid = Grid((4, 4)).bind(ds)
    >>> s = Stitcher(grid, ds, weights="gaussian")
    >>> tiles = grid.tiles(0)
    >>> batch = np.stack([x[t.start[0]:t.stop[0], t.start[1]:t.stop[1]] for t in tiles])
    >>> s.add(batch, {"file": [0] * len(tiles), "start": [t.start for t in tiles], "stop": [t.stop for t in tiles]})
    >>> np.allclose(s.result()[0], x)
    True
    """

    @suggest_keywords
    def __init__(
        self,
        grid: Grid | GridBound,
        dataset: Any,
        *,
        weights: str = "mean",
        sigma_scale: float | Sequence[float] = 0.125,
        channels: Sequence[int] = (),
        dtype: Any = "float32",
        out: str | os.PathLike[str] | None = None,
        overwrite: bool = False,
    ) -> None:
        bound = grid.bind(dataset) if isinstance(grid, Grid) else grid
        if not isinstance(bound, GridBound):
            raise TypeError(f"grid must be a npydask.samplers.Grid (or a bound one), found {type(grid).__name__}")
        grid = bound
        if len(grid.extents) != len(dataset):
            raise ValueError(f"the grid is bound to {len(grid.extents)} files but the dataset has {len(dataset)}")
        self.grid = grid
        self.patch = grid.patch_shape
        self.map = importance_map(self.patch, weights, sigma_scale)
        if not isinstance(channels, (tuple, list)):
            raise TypeError(f"channels must be a tuple of the output's leading axes, e.g. (2,), found {channels!r}")
        self.channels = tuple(check_int("channels", c, 1) for c in channels)
        self.dtype = np.dtype(dtype)
        if self.dtype.kind not in "fc":
            raise TypeError(f"dtype must be a floating or complex dtype (averages), found {self.dtype}")
        self._sum_dtype = np.result_type(self.dtype, np.float32)
        self._slabs: dict[int, _Slab] = {}
        self._done: dict[int, Any] = {}
        self._outputs: dict[int, Output] = {}
        self._closed = False
        self.out = None if out is None else os.fspath(out)
        self._names: list[str] = []
        self._group: Any = None
        self._staging: ZarrStaging | RemoteStaging | None = None
        self._run = new_stitch_run()
        if self.out is not None:
            members = list(dataset_members(dataset).values())
            self._source = members[0].views.context.source
            zarr = is_zarr(self.out)
            self._names = output_names(members[0].files, zarr)
            if not overwrite:
                check_not_inputs(self.out, self._names, [f for m in members for f in m.files], zarr)
            if not is_url(self.out):
                remove_stale(self.out, self._names, zarr)
            if zarr:
                self._group = zarr_group(self.out, self._source)
                if not is_url(self.out):
                    self._staging = ZarrStaging(self.out, self._run, self._source)
                else:
                    self._staging = RemoteStaging(self._group, self._run, self.out)
                    self._staging.sweep()

    @property
    def in_progress(self) -> dict[int, tuple[int, ...]]:
        """The files with tiles still to come, and the shape of the slab each holds."""
        return {f: s.sums.shape for f, s in self._slabs.items()}

    def add(self, batch: Any, index: Mapping[str, Any]) -> None:
        """Take the outputs of a batch of tiles.

        Parameters
        ----------
        batch : array-like
            ``(B, *channels, *patch)`` model outputs (NumPy, or anything
            ``numpy.asarray`` takes, such as a CPU torch tensor).
        index : dict
            The tiles, as the Loader's ``with_index=True`` gives them:
            ``"file"`` (B,), ``"start"`` and ``"stop"`` (B x patch ndim); or
            the adapters' ``"location"`` (B x 2 ndim: start, then stop).

        The whole batch is checked before any tile of it is applied, so a
        refused batch changes nothing and may be given again corrected.

        Raises
        ------
        ValueError
            A batch of the wrong shape, a tile that is not one of the grid's,
            one given twice, one that starts a new row of tiles of its file
            while tiles of an earlier row are missing, or a closed Stitcher.
        TypeError
            A batch whose dtype does not cast to the result's (strings,
            objects, complex into a real ``dtype``).
        """
        if self._closed:
            raise ValueError("this Stitcher is closed: make a new one to stitch again")
        values = np.asarray(batch)
        nd = len(self.patch)
        files, starts, stops = _tiles(index, nd)
        want = (len(files), *self.channels, *self.patch)
        if values.shape != want:
            raise ValueError(f"expected a batch of shape {want} (B, *channels, *patch), found {values.shape}")
        if not np.can_cast(values.dtype, self._sum_dtype, "same_kind"):
            raise TypeError(f"expected a batch of numbers that average into {self.dtype}, found dtype {values.dtype}")
        plan = self._check(files, starts, stops)
        for b, (file, at) in enumerate(plan):
            self._add(file, at, values[b])

    def _check(
        self, files: list[int], starts: list[tuple[int, ...]], stops: list[tuple[int, ...]]
    ) -> list[tuple[int, tuple[int, ...]]]:
        """Every tile of a batch checked against the grid and against the tiles before it, before any is applied."""
        progress: dict[int, _Progress] = {}
        plan = []
        for file, start, stop in zip(files, starts, stops):
            if stop != tuple(a + p for a, p in zip(start, self.patch)):
                raise ValueError(f"tile {start}..{stop} of file {file} is not of the patch's shape {self.patch}")
            p = progress.get(file)
            if p is None:
                if file in self._done or not 0 <= file < self.grid.n_files:
                    n = self.grid.n_files
                    why = "already complete" if file in self._done else f"not one of the grid's {n} files"
                    raise ValueError(f"a tile of file {file} at {start}: the file is {why}")
                p = progress[file] = _Progress(self.grid.axis_starts(file), self._slabs.get(file))
            plan.append((file, p.take(file, start)))
        return plan

    def _add(self, file: int, at: tuple[int, ...], tile: np.ndarray) -> None:
        """Apply a checked tile (its index along each axis) to its file's slab."""
        slab = self._slabs.get(file)
        if slab is None:
            slab = self._slabs[file] = self._open(file)
        start = tuple(a[i] for a, i in zip(slab.starts, at))
        where = tuple(slice(a - o, a - o + p) for a, o, p in zip(start[1:], slab.origin[1:], self.patch[1:]))
        rows = slice(start[0] - slab.row, start[0] - slab.row + self.patch[0])
        lead: tuple[slice, ...] = (slice(None),) * len(self.channels)
        slab.sums[(*lead, rows, *where)] += tile * self.map
        slab.weights[(rows, *where)] += self.map
        slab.got[at[1:]] = True
        slab.left -= 1
        if slab.left:
            return
        if slab.rows + 1 < len(slab.starts[0]):  # a row is complete: the planes before the next one are final
            slab.rows += 1
            slab.got[...] = False
            slab.left = slab.got.size
            self._flush(file, slab, slab.starts[0][slab.rows])
            return
        self._flush(file, slab, slab.row + slab.weights.shape[0])
        del self._slabs[file]
        self._finish(file)

    def _open(self, file: int) -> _Slab:
        extent = self.grid.extents[file]
        shape, nc = (*self.channels, *extent), len(self.channels)
        self._outputs[file] = self._output(file, shape, nc)
        return _Slab(self.channels, self.patch, self.grid.axis_starts(file), extent, self._sum_dtype)

    def _output(self, file: int, shape: tuple[int, ...], nc: int) -> Output:
        if self.out is None:
            return ArrayOutput(shape, nc, self.dtype)
        if self._group is not None and self._staging is not None:
            step = self.grid.sampler.step[0]
            return ZarrOutput(shape, nc, self.dtype, self._group, self._names[file], step, self._staging)
        where = (
            self.out.rstrip("/") + "/" + self._names[file]
            if is_url(self.out)
            else os.path.join(os.path.abspath(self.out), self._names[file])
        )
        return NpyOutput(shape, nc, self.dtype, where, self._source, self._run)

    def _flush(self, file: int, slab: _Slab, row: int) -> None:
        """Divide and write the planes before ``row``; move the rest to the slab's front."""
        depth = slab.weights.shape[0]
        k = min(row - slab.row, depth)
        extent = self.grid.extents[file]
        lead: tuple[slice, ...] = (slice(None),) * len(self.channels)  # (the channel axes whole)
        lo, hi = max(slab.row, 0), min(slab.row + k, extent[0])  # the file's planes among the final ones
        if hi > lo:
            crop = tuple(slice(-o, -o + e) for o, e in zip(slab.origin[1:], extent[1:]))
            rows = slice(lo - slab.row, hi - slab.row)
            final = slab.sums[(*lead, rows, *crop)]
            # (divided in place: these planes are dropped below, and a quotient array would be a second slab)
            np.divide(final, slab.weights[(rows, *crop)], out=final)
            self._write(file, lo, final.astype(self.dtype, copy=False))
        for i in range(depth - k):  # plane by plane: no temporary the size of the slab
            to: tuple[slice | int, ...] = (*lead, i)
            come: tuple[slice | int, ...] = (*lead, i + k)
            slab.sums[to] = slab.sums[come]
            slab.weights[i] = slab.weights[i + k]
        slab.sums[(*lead, slice(depth - k, depth))] = 0
        slab.weights[depth - k :] = 0
        slab.row = row

    def _write(self, file: int, first: int, value: np.ndarray) -> None:
        self._outputs[file].write(first, value)

    def _finish(self, file: int) -> None:
        self._done[file] = self._outputs.pop(file).finish()
        if len(self._done) == self.grid.n_files and self._staging is not None:
            self._release()

    def close(self) -> None:
        """Stop: drop the files in progress and their temporaries; published results stay.

        A file's result replaces an earlier one at ``out`` when its last tile
        is added, so files completed before :meth:`close` are kept; those in
        progress are dropped (their temporary files or arrays removed) and an
        earlier result at their place stays as it was. Adding tiles after
        this raises ``ValueError``; calling it again does nothing.
        """
        if self._closed:
            return
        self._closed = True
        self._slabs.clear()
        try:
            for file in list(self._outputs):
                self._outputs.pop(file).abort()
        finally:
            if self._staging is not None:
                self._release()

    def _release(self) -> None:
        """Drop the run's temporary group (local) or lease (object storage)."""
        if isinstance(self._staging, ZarrStaging):
            self._staging.remove()
        elif self._staging is not None:
            self._staging.stop()

    def __del__(self) -> None:
        # (a Stitcher dropped unfinished: its temporaries go, its locks with them)
        with contextlib.suppress(Exception):
            if not getattr(self, "_closed", True):
                self.close()

    def __enter__(self) -> Stitcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def result(self) -> list[Any]:
        """Each file's stitched array, in dataset order.

        With ``out``: each file's ``.npy`` path or URL (written), or its zarr
        array (``zarr.Array``, written).

        Raises
        ------
        ValueError
            If a file's tiles are missing, naming the files and how many.
        """
        missing = {f: s.remaining() for f, s in self._slabs.items()}
        missing.update(
            {
                f: self.grid.tile_count(f)
                for f in range(self.grid.n_files)
                if f not in self._done and f not in self._slabs
            }
        )
        if missing:
            shown = ", ".join(f"file {f}: {n}" for f, n in sorted(missing.items())[:5])
            more = f" (and {len(missing) - 5} more files)" if len(missing) > 5 else ""
            raise ValueError(f"tiles are missing, so the result is incomplete ({shown}{more}); add them first")
        return [self._done[f] for f in range(self.grid.n_files)]

    def __repr__(self) -> str:
        return (
            f"Stitcher({self.grid!r}, {len(self._done)} of {self.grid.n_files} files done, "
            f"{len(self._slabs)} in progress)"
        )


def _tiles(index: Mapping[str, Any], nd: int) -> tuple[list[int], list[tuple[int, ...]], list[tuple[int, ...]]]:
    """``index``'s files, starts and stops as Python ints."""
    try:
        files = np.asarray(index["file"]).reshape(-1)
        if "start" in index:
            starts, stops = np.asarray(index["start"]), np.asarray(index["stop"])
        else:
            location = np.asarray(index["location"])
            starts, stops = location[:, :nd], location[:, nd:]
    except KeyError as e:
        raise ValueError(f"index must hold 'file' and 'start'/'stop' (or 'location'), missing {e}") from None
    starts, stops = starts.reshape(len(files), -1), stops.reshape(len(files), -1)
    if starts.shape[1] != nd or stops.shape[1] != nd:
        raise ValueError(f"index 'start' and 'stop' must have {nd} columns (the patch axes), found {starts.shape}")
    return (
        [int(f) for f in files.tolist()],
        [tuple(map(int, s)) for s in starts.tolist()],
        [tuple(map(int, s)) for s in stops.tolist()],
    )
