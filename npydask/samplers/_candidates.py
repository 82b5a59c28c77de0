"""The candidates of label files: scanned slab by slab, and kept in an index file (``.npz``, never pickle).

Index file format (``version`` 1): an uncompressed ``.npz`` archive (read
with ``allow_pickle=False``) whose member ``meta`` is the UTF-8 bytes of a
JSON document (as a ``uint8`` array)::

    {"format": "npydask-foreground-index", "version": 1,
     "params": {"patch_ndim": 3, "classes": null or [...], "candidates": 10000, "seed": 0},
     "files": [{"path": "<the label file's path or URL>", "identity": "<size|mtime_ns|inode, or size|ETag|modified>",
                "shape": [...], "classes": [...], "counts": [...]}, ...]}

and whose member ``f<i>_<j>`` is the ``int64`` flat positions of class
``j`` of ``files[i]``, ascending. Every member is checked when loaded
(stored uncompressed, a 1-d array of at most ``candidates`` elements, from
its header before it is read; types, lengths, positions within the shape);
an unusable or implausible file is rebuilt with a warning, never trusted.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from npydask.array import NpyFileArray
from npydask.errors import warn
from npydask.plan.foreground import CandidateBuilder, Candidates, slab_planes
from npydask.plan.region import Box
from npydask.samplers._paths import source_for
from npydask.storage.base import Source
from npydask.storage.urls import redact

__all__ = ["FORMAT", "VERSION", "IndexEntry", "Loaded", "identity_text", "load_entries", "scan_label", "write_entries"]

FORMAT = "npydask-foreground-index"
VERSION = 1

IndexEntry = tuple[str, Candidates]
"""(identity text, candidates) of one label file, keyed by its path in the mappings below."""


def identity_text(identity: Any) -> str:
    """A file identity as the index records it: ``size|mtime_ns|inode`` for a local file, else its ``facts()``."""
    facts = getattr(identity, "facts", None)
    if facts is not None:
        return str(facts())
    return "|".join(str(v) for v in tuple(identity))


def scan_label(view: NpyFileArray, patch_ndim: int, params: dict[str, Any]) -> Candidates:
    """The candidates of one label file, read slab by slab (:func:`~npydask.plan.foreground.slab_planes`)."""
    shape = view.shape
    builder = CandidateBuilder(
        shape, patch_ndim, classes=params["classes"], limit=params["candidates"], seed=params["seed"]
    )
    lead = len(shape) - patch_ndim
    planes = slab_planes(shape, patch_ndim)
    for first in range(0, shape[lead], planes):
        last = min(first + planes, shape[lead])
        start = (0,) * lead + (first,) + (0,) * (patch_ndim - 1)
        stop = tuple(shape[:lead]) + (last,) + tuple(shape[lead + 1 :])
        builder.add(view.read(Box(start, stop)), first)
    return builder.result()


@dataclass(frozen=True)
class Loaded:
    """What :func:`load_entries` found: the usable entries, and a digest of the bytes they came from."""

    entries: dict[str, IndexEntry]
    digest: bytes | None = None
    """The blake2b digest of the file's bytes (``None`` when there was no file)."""


def load_entries(path: str, params: dict[str, Any], data_source: Source) -> Loaded:
    """The entries of the index file at ``path`` made with ``params``; none when missing, unusable or made otherwise.

    An unreadable, malformed or implausible file is warned about (it is
    rebuilt); a file made with other parameters is silently replaced. Each
    member's size is checked from its header before it is read (see
    :func:`_member`), so a tampered file costs no more memory than its own bytes.
    """
    source, where = source_for(path, data_source)
    try:
        data = source.read_bytes(where, what="foreground index")
    except FileNotFoundError:
        return Loaded({})
    return Loaded(_parse(path, data, params), hashlib.blake2b(data).digest())


def _parse(path: str, data: bytes, params: dict[str, Any]) -> dict[str, IndexEntry]:
    """The entries of an index file's bytes (see :func:`load_entries`)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            meta = json.loads(bytes(_member(archive, "meta", np.uint8, len(data))).decode("utf-8"))
            if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
                raise ValueError(f"expected format {FORMAT!r} version {VERSION}")
            if meta.get("params") != params:
                return {}
            return _entries(archive, meta["files"], params)
    except (ValueError, KeyError, TypeError, OSError, EOFError, zipfile.BadZipFile, UnicodeDecodeError) as e:
        warn(f"{redact(path)}: not a usable foreground index ({type(e).__name__}: {e}); rebuilding it")
        return {}


def _member(archive: zipfile.ZipFile, name: str, dtype: Any, limit: int) -> np.ndarray:
    """Member ``name``: a 1-d array of ``dtype`` of at most ``limit`` elements, checked before it is read.

    The index is written uncompressed, so a member must be stored (a
    deflated one could inflate far beyond the file's size), its ``.npy``
    header must give a 1-d ``dtype`` array of at most ``limit`` elements, and
    the member must hold exactly those bytes; only then is it read.
    """
    dtype = np.dtype(dtype)
    info = archive.getinfo(f"{name}.npy")
    if info.compress_type != zipfile.ZIP_STORED:
        raise ValueError(f"member {name!r} is compressed; the index is written uncompressed")
    with archive.open(info) as f:
        version = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, found = read_header(f)
        if len(shape) != 1 or found != dtype or fortran:
            raise ValueError(f"member {name!r} must be a 1-d {dtype} array, found {found} of shape {shape}")
        (n,) = shape
        if n > limit or info.file_size != f.tell() + n * dtype.itemsize:
            raise ValueError(
                f"member {name!r} claims {n} elements of {dtype}: more than a valid index holds ({limit}) or "
                f"other than its {info.file_size} bytes"
            )
        data = f.read(n * dtype.itemsize)
        if len(data) != n * dtype.itemsize:
            raise ValueError(f"member {name!r} is truncated: {len(data)} of {n * dtype.itemsize} bytes")
        return np.frombuffer(data, dtype)


def _entries(archive: zipfile.ZipFile, files: Any, params: dict[str, Any]) -> dict[str, IndexEntry]:
    if not isinstance(files, list):
        raise TypeError("'files' must be a list")
    out: dict[str, IndexEntry] = {}
    for i, f in enumerate(files):
        path, ident, shape = f["path"], f["identity"], tuple(f["shape"])
        classes, counts = tuple(f["classes"]), tuple(f["counts"])
        if not (isinstance(path, str) and isinstance(ident, str) and len(classes) == len(counts)):
            raise ValueError(f"entry {i} is malformed")
        if not all(type(n) is int and n >= 1 for n in shape) or len(shape) != params["patch_ndim"]:
            raise ValueError(f"entry {i} has a bad shape {shape!r}")
        if not all(type(c) in (bool, int, float) for c in classes) or not all(type(n) is int for n in counts):
            raise ValueError(f"entry {i} has bad classes or counts")
        size = math.prod(shape)
        limit = min(params["candidates"], size)  # (a class keeps at most `candidates` distinct voxels)
        positions = []
        for j in range(len(classes)):
            pos = _member(archive, f"f{i}_{j}", np.int64, limit)
            if len(pos) and not (0 <= pos[0] and pos[-1] < size and bool(np.all(pos[1:] > pos[:-1]))):
                raise ValueError(f"entry {i} class {j}: positions outside the label's {shape} or not ascending")
            positions.append(pos)
        out[path] = (ident, Candidates(shape, classes, tuple(positions), counts))
    return out


def write_entries(
    path: str, params: dict[str, Any], entries: dict[str, IndexEntry], data_source: Source, loaded: Loaded | None = None
) -> None:
    """Write ``entries`` merged over the file's current ones (others' work kept), replacing it whole.

    Entries found in the file for paths not in ``entries`` (another rank's,
    another shard's) stay; ``entries`` win where both hold a path. The file
    is read again just before (another rank may have written it since),
    but parsed again only when its bytes differ from ``loaded``'s. It is
    replaced at once (a temporary file renamed over it, or one PUT), so
    concurrent builders never leave a partial file: at worst one's new
    entries are lost and built again later.
    """
    source, where = source_for(path, data_source)
    try:
        data: bytes | None = source.read_bytes(where, what="foreground index")
    except FileNotFoundError:
        data = None
    if data is None:
        merged: dict[str, IndexEntry] = {}
    elif loaded is not None and loaded.digest == hashlib.blake2b(data).digest():
        merged = dict(loaded.entries)
    else:
        merged = _parse(path, data, params)
    del data
    merged.update(entries)
    files: list[dict[str, Any]] = []
    arrays: dict[str, np.ndarray] = {}
    for i, (name, (ident, c)) in enumerate(sorted(merged.items())):
        files.append(
            {
                "path": name,
                "identity": ident,
                "shape": list(c.extent),
                "classes": list(c.classes),
                "counts": list(c.counts),
            }
        )
        for j, pos in enumerate(c.positions):
            arrays[f"f{i}_{j}"] = np.ascontiguousarray(pos, np.int64)
    meta = {"format": FORMAT, "version": VERSION, "params": params, "files": files}
    arrays["meta"] = np.frombuffer(json.dumps(meta, separators=(",", ":")).encode("utf-8"), np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, allow_pickle=False, **arrays)  # type: ignore[arg-type]
    source.write_bytes(where, buffer.getvalue(), what="foreground index")


def params_of(patch_ndim: int, classes: Sequence[Any] | None, candidates: int, seed: int) -> dict[str, Any]:
    """The parameters that shape the candidates, as the index records them (JSON values)."""
    return {
        "patch_ndim": patch_ndim,
        "classes": None if classes is None else list(classes),
        "candidates": candidates,
        "seed": seed,
    }
