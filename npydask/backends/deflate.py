"""The ``deflate`` backend: members of ``numpy.savez_compressed`` archives.

A deflated member cannot be read at an offset: the task inflates it from its
start, piece by piece, dropping what lies before the region and copying the
rest straight into place. A read of the whole member inflates directly into
the result (about 1x the member's size in memory, plus 1 MiB pieces) and
goes on to the member's end to check its CRC-32. A region of part of the
member is inflated into a buffer of the span it covers, then cut out with one
strided copy. Chunks of deflated members are therefore best whole (the
default); every chunk of a split member inflates the member's prefix again.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from npydask._buffers import as_bytes, empty
from npydask.backends.base import Backend, copy_runs, destination, finish
from npydask.config import ReadOptions
from npydask.format.npz import inflate_into
from npydask.plan.region import ReadPlan
from npydask.storage.base import OpenedFile, Source
from npydask.storage.local import LOCAL

__all__ = ["DeflateBackend"]


class DeflateBackend(Backend):
    """Inflate the member up to the region's end (to its end for a whole read), into place."""

    name: ClassVar[str] = "deflate"

    def read(
        self,
        f: OpenedFile,
        plan: ReadPlan,
        options: ReadOptions,
        out: np.ndarray | None = None,
        *,
        source: Source = LOCAL,
    ) -> np.ndarray:
        member = f.member
        if member is None or member.stored:
            raise ValueError(f"{f.path}: the deflate backend reads deflated .npz members only")
        if plan.nbytes == f.header.nbytes:  # the whole member: inflate into place, check its CRC-32
            result, buffer = destination(plan, f.header.dtype, out)
            dest = as_bytes(buffer).data if buffer.nbytes else memoryview(b"")  # (no bytes view of V0)
            pieces = f.piece_reader()
            inflate_into(pieces, member, f.path, dest, plan.offset, verify=True)
            pieces.keep()  # (an object's compressed pieces reach the node cache only once its CRC-32 matched)
            return finish(result, buffer)
        if plan.n_runs == 0:
            return np.empty(plan.shape, f.header.dtype) if out is None else out
        span = empty((plan.end - plan.offset,), np.uint8)
        inflate_into(f.read_at, member, f.path, span.data, plan.offset)
        return copy_runs(span, plan, f.header.dtype, out)
