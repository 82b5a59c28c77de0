"""The candidates of label files: scanned slab by slab, and kept in an index file (``.npz``, never pickle).

Index file format (``version`` 1): an uncompressed ``.npz`` archive (read
with ``allow_pickle=False``) whose member ``meta`` is the UTF-8 bytes of a
JSON document (as a ``uint8`` array)::

    {"format": "npydask-foreground-index", "version": 1,
     "params": {"patch_ndim": 3, "classes": null or [...], "candidates": 10000, "seed": 0},
     "files": [{"path": "<the label file's path or URL>", "identity": "<size|mtime_ns|inode, or size|ETag|modified>",
                "shape": [...], "classes": [...], "counts": [...]}, ...]}

and whose member ``f<i>_<j>`` is the ``int64`` flat positions of class
``j`` of ``files[i]``. Every member is checked when loaded (types, lengths,
positions within the shape); an unusable file is rebuilt with a warning.
"""

from __future__ import annotations

import io
import json
import math
import zipfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from npydask.array import NpyFileArray
from npydask.errors import warn
from npydask.plan.foreground import CandidateBuilder, Candidates, slab_planes
from npydask.plan.region import Box
from npydask.samplers._paths import source_for
from npydask.storage.base import Source
from npydask.storage.urls import redact

__all__ = ["FORMAT", "VERSION", "IndexEntry", "identity_text", "load_entries", "scan_label", "write_entries"]

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
    builder = CandidateBuilder(shape, patch_ndim, classes=params["classes"], limit=params["candidates"],
                               seed=params["seed"])
    lead = len(shape) - patch_ndim
    planes = slab_planes(shape, patch_ndim)
    for first in range(0, shape[lead], planes):
        last = min(first + planes, shape[lead])
        start = (0,) * lead + (first,) + (0,) * (patch_ndim - 1)
        stop = tuple(shape[:lead]) + (last,) + tuple(shape[lead + 1 :])
        builder.add(view.read(Box(start, stop)), first)
    return builder.result()


def load_entries(path: str, params: dict[str, Any], data_source: Source) -> dict[str, IndexEntry]:
    """The entries of the index file at ``path`` made with ``params``; empty when missing, unusable or made otherwise.

    An unreadable or malformed file is warned about (it is rebuilt); a file
    made with other parameters is silently replaced.
    """
    source, where = source_for(path, data_source)
    try:
        data = source.read_bytes(where, what="foreground index")
    except FileNotFoundError:
        return {}
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            meta = json.loads(bytes(_member(archive, "meta", np.uint8)).decode("utf-8"))
            if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
                raise ValueError(f"expected format {FORMAT!r} version {VERSION}")
            if meta.get("params") != params:
                return {}
            return _entries(archive, meta["files"], params)
    except (ValueError, KeyError, TypeError, OSError, zipfile.BadZipFile, UnicodeDecodeError) as e:
        warn(f"{redact(path)}: not a usable foreground index ({type(e).__name__}: {e}); rebuilding it")
        return {}


def _member(archive: Any, name: str, dtype: Any) -> np.ndarray:
    value = archive[name]
    if not isinstance(value, np.ndarray) or value.ndim != 1 or value.dtype != np.dtype(dtype):
        raise ValueError(f"member {name!r} must be a 1-d {np.dtype(dtype)} array")
    return value


def _entries(archive: Any, files: Any, params: dict[str, Any]) -> dict[str, IndexEntry]:
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
        positions = []
        for j in range(len(classes)):
            pos = _member(archive, f"f{i}_{j}", np.int64)
            if len(pos) > params["candidates"] or (len(pos) and not (0 <= pos.min() and pos.max() < size)):
                raise ValueError(f"entry {i} class {j}: positions outside the label's {shape}")
            positions.append(pos)
        out[path] = (ident, Candidates(shape, classes, tuple(positions), counts))
    return out


def write_entries(path: str, params: dict[str, Any], entries: dict[str, IndexEntry], data_source: Source) -> None:
    """Write ``entries`` merged over the file's current ones (others' work kept), replacing it whole.

    Entries found in the file for paths not in ``entries`` (another rank's,
    another shard's) stay; ``entries`` win where both hold a path. The file
    is replaced at once (a temporary file renamed over it, or one PUT), so
    concurrent builders never leave a partial file: at worst one's new
    entries are lost and built again later.
    """
    merged = load_entries(path, params, data_source)
    merged.update(entries)
    files: list[dict[str, Any]] = []
    arrays: dict[str, np.ndarray] = {}
    for i, (name, (ident, c)) in enumerate(sorted(merged.items())):
        files.append({"path": name, "identity": ident, "shape": list(c.extent), "classes": list(c.classes),
                      "counts": list(c.counts)})
        for j, pos in enumerate(c.positions):
            arrays[f"f{i}_{j}"] = np.ascontiguousarray(pos, np.int64)
    meta = {"format": FORMAT, "version": VERSION, "params": params, "files": files}
    arrays["meta"] = np.frombuffer(json.dumps(meta, separators=(",", ":")).encode("utf-8"), np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, allow_pickle=False, **arrays)  # type: ignore[arg-type]
    source, where = source_for(path, data_source)
    source.write_bytes(where, buffer.getvalue(), what="foreground index")


def params_of(patch_ndim: int, classes: Sequence[Any] | None, candidates: int, seed: int) -> dict[str, Any]:
    """The parameters that shape the candidates, as the index records them (JSON values)."""
    return {"patch_ndim": patch_ndim, "classes": None if classes is None else list(classes),
            "candidates": candidates, "seed": seed}
