"""Boxes centred on labelled voxels a fraction ``p`` of the time: :class:`Foreground` (foreground oversampling)."""

from __future__ import annotations

import hashlib
import math
import numbers
import os
import threading
from collections.abc import Sequence
from typing import Any

from npydask._keywords import suggest_keywords
from npydask.dataset.npy_dataset import NpyDataset
from npydask.dataset.zipped import ZippedDataset
from npydask.plan.foreground import Candidates, ForegroundDraw, draw, normalized_ratios
from npydask.plan.patches import Patch
from npydask.plan.sampling import check_int
from npydask.samplers._candidates import identity_text, load_entries, params_of, scan_label, write_entries
from npydask.samplers.base import Sampler, UnitBound, check_patch_shape
from npydask.storage.urls import redact

__all__ = ["Foreground", "ForegroundBound"]

SUBSAMPLE_SEED = 0
"""The seed of the bounded sample of each class's voxels: fixed, so that one index serves every training seed."""


class Foreground(Sampler):
    """Boxes centred on a labelled voxel with probability ``p``, else drawn uniformly inside the file.

    MONAI's ``RandCropByPosNegLabeld`` / ``RandCropByLabelClassesd`` and
    TorchIO's ``LabelSampler``, from a label member of a zipped dataset
    (:func:`npydask.zip_datasets`); the image is read only where the box is.

    Parameters
    ----------
    patch_shape : tuple of int
        The box's size over each file's trailing axes.
    label_key : str, default "label"
        The member of the zipped dataset holding the labels.
    p : float, default 0.33
        The probability that a draw is centred on a labelled voxel (nnU-Net's
        ``oversample_foreground_percent``, MONAI's ``pos / (pos + neg)``).
    classes : sequence of numbers, optional
        The label values that count as foreground; every non-zero value by
        default. A voxel of a label with leading axes (channels) belongs to
        every class one of its values equals.
    ratios : sequence of float, optional
        How often each of ``classes`` is chosen (needs ``classes``; aligned
        with it). Without it the class is chosen uniformly among those the
        file holds. Classes a file lacks drop out and the others' ratios are
        renormalised; a file with no foreground at all (or only classes of
        ratio 0) gets uniform draws, as MONAI falls back when a label has no
        foreground.
    per_file : int, default 1
        Patches per file per epoch, kept adjacent (as :class:`~npydask.samplers.Uniform`).
    candidates : int, default 10_000
        The most voxel positions kept per class per file. A class with more
        voxels keeps a uniform sample of them, fixed by the label alone (the
        same in every process and every epoch).
    index : str or os.PathLike, optional
        A file (local path, or URL in the labels' object store) where the
        candidates are kept, so that other processes and ranks reuse them
        instead of reading the labels again. See Notes.

    Notes
    -----
    **The candidates** of a label file are found once, by reading it slab by
    slab (a few planes of the first patch axis at a time, about 2 Mi voxels
    each: a 512^3 label is never held whole), at the first draw from that
    file, and kept in memory by the bound sampler (a pickled bound sampler
    carries none: each process scans again unless ``index`` is given).

    **With** ``index``, the first draw of a process loads the file and checks
    every entry against its label file's identity (a local file's size,
    mtime and inode; an object's size and ETag, as recorded when the dataset
    was opened) and the parameters that shaped it (``classes``,
    ``candidates``, the number of patch axes); the files it cannot answer
    for (new, changed, or the whole file when it was made with other
    parameters) are scanned then, all at once, and the index is rewritten
    once: merged with what the file holds at that moment (other ranks'
    entries are kept), written to a temporary file and renamed over it (one
    PUT for an object), so concurrent builders never leave a partial file.
    A changed label file is scanned again, as ``open_dataset(index=...)``
    rescans a changed header. The format is an ``.npz`` of ``int64`` arrays
    and a JSON member, read without pickle; an unreadable index is rebuilt
    with a warning.

    **A draw** for global position ``i`` of an epoch uses the generator
    :func:`~npydask.plan.patches.draw_rng` ``(seed, epoch, i)``: with
    probability ``p`` a class is chosen, then one of its candidates, and the
    box containing it is shifted inside the volume (MONAI's
    ``correct_crop_centers``: the voxel is inside the patch, not always at
    its centre); otherwise the box is uniform inside. Files smaller than the
    patch are refused when binding (:class:`~npydask.errors.RoiError`).

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os
    >>> from npydask.samplers import Foreground
    >>> root = tempfile.mkdtemp()
    >>> for name in ("img", "lab"): os.mkdir(os.path.join(root, name))
    >>> label = np.zeros((32, 32), np.uint8); label[20:24, 3:6] = 1
    >>> np.save(os.path.join(root, "img", "a.npy"), np.ones((32, 32), "f4"))
    >>> np.save(os.path.join(root, "lab", "a.npy"), label)
    >>> ds = npydask.zip_datasets({"image": npydask.open_dataset(os.path.join(root, "img")),
    ...                            "label": npydask.open_dataset(os.path.join(root, "lab"))})
    >>> bound = Foreground((8, 8), p=1.0).bind(ds)
    >>> patch = bound.patch(epoch=0, position=0, seed=3)
    >>> bool(label[patch.start[0]:patch.stop[0], patch.start[1]:patch.stop[1]].any())
    True
    """

    @suggest_keywords
    def __init__(
        self,
        patch_shape: Sequence[int],
        *,
        label_key: str = "label",
        p: float = 0.33,
        classes: Sequence[Any] | None = None,
        ratios: Sequence[float] | None = None,
        per_file: int = 1,
        candidates: int = 10_000,
        index: str | os.PathLike[str] | None = None,
    ) -> None:
        if not isinstance(label_key, str):
            raise TypeError(f"label_key must be a str (a key of the zipped dataset), found {label_key!r}")
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 <= float(p) <= 1:
            raise ValueError(f"p must be a probability in [0, 1], found {p!r}")
        checked = _classes(classes)
        if ratios is not None:
            if checked is None:
                raise ValueError(f"ratios={list(ratios)!r} needs classes=: ratios are aligned with the classes given")
            ratios = tuple(float(r) for r in ratios)
            normalized_ratios(ratios, len(checked))
        if index is not None and not isinstance(index, (str, os.PathLike)):
            raise TypeError(f"index must be a path or URL (str or os.PathLike), found {index!r}")
        self._set(
            patch_shape=check_patch_shape(patch_shape),
            label_key=label_key,
            p=float(p),
            classes=checked,
            ratios=ratios,
            per_file=check_int("per_file", per_file, 1),
            candidates=check_int("candidates", candidates, 1),
            index=None if index is None else os.fspath(index),
            policy="inside",
            fill_value=0,
        )

    label_key: str
    p: float
    classes: tuple[Any, ...] | None
    ratios: tuple[float, ...] | None
    candidates: int
    index: str | None

    def params(self) -> dict[str, Any]:
        """The constructor's arguments, in signature order."""
        return {
            "patch_shape": self.patch_shape,
            "label_key": self.label_key,
            "p": self.p,
            "classes": self.classes,
            "ratios": self.ratios,
            "per_file": self.per_file,
            "candidates": self.candidates,
            "index": self.index,
        }

    def fingerprint(self) -> str:
        """A digest of the parameters that decide the boxes (``index`` only says where candidates are kept).

        Examples
        --------
        >>> Foreground((8, 8), index="a.npz").fingerprint() == Foreground((8, 8)).fingerprint()
        True
        >>> Foreground((8, 8), p=0.5).fingerprint() == Foreground((8, 8)).fingerprint()
        False
        """
        shown = {k: v for k, v in self.params().items() if k != "index"}
        return hashlib.blake2b(f"Foreground({shown!r})".encode(), digest_size=16).hexdigest()

    def bind(self, dataset: Any) -> ForegroundBound:
        """This sampler over a zipped dataset with member ``label_key``, checked from the headers.

        Raises
        ------
        TypeError
            ``dataset`` is not a zipped dataset, or its labels are not numbers.
        KeyError
            The zipped dataset has no member ``label_key``.
        RoiError
            A file the patch does not fit (see :meth:`Sampler.bind <npydask.samplers.Sampler.bind>`).
        """
        if not isinstance(dataset, ZippedDataset):
            raise TypeError(
                f"Foreground reads its labels from a zipped dataset: bind it to "
                f"npydask.zip_datasets({{'image': images, {self.label_key!r}: labels}}), found {type(dataset).__name__}"
            )
        if self.label_key not in dataset.keys:
            raise KeyError(
                f"Foreground(label_key={self.label_key!r}): the zipped dataset has no such member; its keys are "
                f"{list(dataset.keys)!r} (pass label_key=)"
            )
        labels = dataset.members[self.label_key]
        if len(labels) and labels.dtype.kind not in "biuf":
            raise TypeError(f"labels must be booleans, integers or floats, found dtype {labels.dtype} in {labels!r}")
        bound = super().bind(dataset)
        assert isinstance(bound, ForegroundBound)
        return bound

    def _bind(self, extents: tuple[tuple[int, ...], ...], dataset: Any) -> ForegroundBound:
        return ForegroundBound(self, extents, dataset.members[self.label_key])


def _classes(classes: Sequence[Any] | None) -> tuple[Any, ...] | None:
    if classes is None:
        return None
    if isinstance(classes, (str, bytes)) or not hasattr(classes, "__iter__") or not len(classes):
        raise TypeError(f"classes must be a non-empty sequence of label values, found {classes!r}")
    out = []
    for c in list(classes):
        item = c.item() if hasattr(c, "item") else c
        if not isinstance(item, (bool, int, float)) or isinstance(item, float) and not math.isfinite(item):
            raise TypeError(f"classes must hold finite real numbers, found {c!r} in {list(classes)!r}")
        out.append(item)
    if len(set(out)) != len(out):
        raise ValueError(f"classes must be distinct, found {out!r}")
    return tuple(out)


class ForegroundBound(UnitBound):
    """:class:`Foreground` bound to a zipped dataset (made by :meth:`Foreground.bind`)."""

    sampler: Foreground  # type: ignore[assignment]

    def __init__(self, sampler: Foreground, extents: tuple[tuple[int, ...], ...], labels: NpyDataset) -> None:
        super().__init__(sampler, extents)
        self.labels = labels
        self._cache: dict[int, Candidates] = {}
        self._lock = threading.Lock()  # (threads planning batches scan each label once between them)
        self._ratios = None if sampler.ratios is None else normalized_ratios(sampler.ratios, len(sampler.ratios))
        self._params = params_of(len(sampler.patch_shape), sampler.classes, sampler.candidates, SUBSAMPLE_SEED)

    def __getstate__(self) -> dict[str, Any]:
        return {"sampler": self.sampler, "extents": self.extents, "labels": self.labels}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["sampler"], state["extents"], state["labels"])  # type: ignore[misc]

    def candidates(self, file: int) -> Candidates:
        """File ``file``'s candidates: from memory, the index, or by reading its label (once per process)."""
        found = self._cache.get(file)
        if found is not None:
            return found
        with self._lock:
            found = self._cache.get(file)
            if found is None:
                if self.sampler.index is None:
                    found = self._cache[file] = self._scan(file)
                else:
                    self._load_all(self.sampler.index)
                    found = self._cache[file]
        return found

    def load_index(self) -> None:
        """Take every file's candidates from the ``index`` file, reading no label (a traffic plan's draws).

        Raises
        ------
        ValueError
            Without ``index=``, or when the index file is missing or lacks a
            label file (or holds another version of it): the message names the
            file and how to build the index.
        """
        index = self.sampler.index
        how = (
            "build it once by drawing from the sampler with index= set (iterating one batch of a Loader, or "
            "Foreground(..., index=PATH).bind(dataset).patch(0, 0)): that scans every label file and writes it"
        )
        if index is None:
            raise ValueError(
                f"a traffic plan of a Foreground sampler reads its label index, and this sampler has none: pass "
                f"index=PATH to Foreground and {how}"
            )
        views = self.labels.views
        source = views.context.source
        table = self.labels.table
        loaded = load_entries(index, self._params, source)
        if not loaded.entries:
            raise ValueError(f"{redact(index)}: no foreground index there (made with these parameters); {how}")
        for file, (path, ident) in enumerate(zip(table.paths(), table.identities())):
            entry = loaded.entries.get(source.display(path))
            if entry is None or entry[0] != identity_text(ident) or entry[1].extent != self.extents[file]:
                raise ValueError(
                    f"{redact(index)}: the foreground index holds no entry for the label file "
                    f"{source.display(path)} as it is now; {how}"
                )
            self._cache.setdefault(file, entry[1])

    def _scan(self, file: int) -> Candidates:
        return scan_label(self.labels.views[file], len(self.patch_shape), self._params)

    def _load_all(self, index: str) -> None:
        """Every file's candidates from the index; those it lacks (or that changed) scanned, and the index rewritten."""
        views = self.labels.views
        source = views.context.source
        table = self.labels.table
        names = [source.display(p) for p in table.paths()]
        idents = [identity_text(i) for i in table.identities()]
        loaded = load_entries(index, self._params, source)
        entries = loaded.entries
        new = {}
        for file, (name, ident) in enumerate(zip(names, idents)):
            entry = entries.get(name)
            if entry is not None and entry[0] == ident and entry[1].extent == self.extents[file]:
                self._cache[file] = entry[1]
            else:
                found = self._cache[file] = self._scan(file)
                new[name] = (ident, found)
        if new:
            write_entries(index, self._params, new, source, loaded)

    def draw(
        self, epoch: int, position: int, *, seed: int | None = None, shuffle: bool = False
    ) -> tuple[int, ForegroundDraw]:
        """Position ``position``'s file, and its :class:`~npydask.plan.foreground.ForegroundDraw` (box, class)."""
        at = self.locate(epoch, position, seed=seed, shuffle=shuffle)
        s = self.sampler
        return at.file, draw(at.rng, self.candidates(at.file), s.patch_shape, p=s.p, ratios=self._ratios)

    def patch(self, epoch: int, position: int, *, seed: int | None = None, shuffle: bool = False) -> Patch:
        file, d = self.draw(epoch, position, seed=seed, shuffle=shuffle)
        return Patch(file, d.start, tuple(a + n for a, n in zip(d.start, self.patch_shape)))
