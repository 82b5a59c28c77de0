"""Patch samplers: which box of which file each training or inference sample reads.

A sampler plans ``(file, box)`` per global position of an epoch from the
files' headers alone, deterministically in ``(seed, epoch, position)``:

* :class:`Uniform`: random boxes, ``per_file`` per file each epoch;
* :class:`Foreground`: boxes centred on labelled voxels a fraction ``p`` of the time;
* :class:`Grid`: sliding-window tiles of every file (MONAI's layout), for inference,
  and :class:`Stitcher`, which blends the model's outputs for them back into volumes.

Each is an immutable value (:class:`Sampler`); :meth:`Sampler.bind` checks it
against a dataset (an ``NpyDataset``, a ``MultiKeyDataset`` or
:func:`npydask.zip_datasets`' pairs) and returns a :class:`BoundSampler`
whose ``patch(epoch, position, seed=..., shuffle=...)`` gives a
:class:`~npydask.plan.patches.Patch`; :func:`read_patches` reads a batch of
them (each file once), with what the reads cost (:class:`ReadStats`).
"""

from __future__ import annotations

from npydask.samplers.base import BoundSampler, Sampler
from npydask.samplers.foreground import Foreground
from npydask.samplers.grid import Grid
from npydask.samplers.read import PatchBatch, ReadStats, read_patches
from npydask.samplers.stitcher import Stitcher
from npydask.samplers.uniform import Uniform

__all__ = [
    "BoundSampler",
    "Foreground",
    "Grid",
    "PatchBatch",
    "ReadStats",
    "Sampler",
    "Stitcher",
    "Uniform",
    "read_patches",
]
