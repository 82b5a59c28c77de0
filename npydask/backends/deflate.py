"""The ``deflate`` backend: members of ``numpy.savez_compressed`` archives.

A deflated member cannot be read at an offset: the task inflates it from its
start up to the last byte the region needs, then cuts the region out with one
strided copy. Chunks of deflated members are therefore best whole (the
default); every chunk of a split member inflates the member's prefix again.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from npydask.backends._files import OpenFile
from npydask.backends.base import Backend, copy_runs
from npydask.config import ReadOptions
from npydask.npz import inflate
from npydask.region import ReadPlan

__all__ = ["DeflateBackend"]


class DeflateBackend(Backend):
    """Inflate the member's prefix, then copy the region out of it."""

    name: ClassVar[str] = "deflate"

    def read(self, f: OpenFile, plan: ReadPlan, options: ReadOptions, out: np.ndarray | None = None) -> np.ndarray:
        if f.member is None:
            raise ValueError(f"{f.path}: the deflate backend reads deflated .npz members only")
        if plan.n_runs == 0:
            return np.empty(plan.shape, f.header.dtype) if out is None else out
        data = inflate(f.fd, f.member, plan.end, f.path)
        base = np.frombuffer(data, np.uint8)[plan.offset : plan.end]
        return copy_runs(base, plan, f.header.dtype, out)
