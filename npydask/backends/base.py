"""The one interface every reader implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np

from npydask._buffers import as_bytes, empty, raw
from npydask.config import ReadOptions
from npydask.plan.region import ReadPlan, same_layout
from npydask.storage.base import OpenedFile, Source
from npydask.storage.local import LOCAL

__all__ = ["Backend", "copy_runs", "destination", "finish"]


class Backend(ABC):
    """Reads a planned region of an open file into an array.

    ``read`` returns an array of ``plan.shape`` and the file's dtype, in C
    order: ``out`` itself when given (C-contiguous, that shape and dtype).
    ``source`` is the source that opened ``f`` (the local file system by
    default): a backend that reads byte runs asks it to.
    """

    name: ClassVar[str]

    @abstractmethod
    def read(
        self,
        f: OpenedFile,
        plan: ReadPlan,
        options: ReadOptions,
        out: np.ndarray | None = None,
        *,
        source: Source = LOCAL,
    ) -> np.ndarray:
        """Read ``plan`` from ``f``."""


def destination(plan: ReadPlan, dtype: np.dtype, out: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The result array and the file-order buffer the bytes land in.

    For a C file (or a region whose file and C layouts coincide) both are the
    same array; for a Fortran region a separate buffer is returned, to be
    transposed into the result with :func:`finish`.
    """
    result = empty(plan.shape, dtype) if out is None else out
    if same_layout(plan):
        return result, result
    return result, empty(plan.file_shape, dtype)


def finish(result: np.ndarray, buffer: np.ndarray) -> np.ndarray:
    """Move a Fortran-ordered buffer into the C-ordered result."""
    if buffer is not result:
        np.copyto(raw(result), raw(buffer.T))
    return result


def copy_runs(base: np.ndarray, plan: ReadPlan, dtype: np.dtype, out: np.ndarray | None) -> np.ndarray:
    """Cut the region out of ``base``, the bytes from ``plan.offset`` to ``plan.end`` (one strided copy)."""
    result, buffer = destination(plan, dtype, out)
    # (np.ndarray over the buffer: numpy's as_strided costs more Python per call)
    grid = np.ndarray(plan.outer_shape + (plan.run_nbytes,), np.uint8, base, 0, plan.outer_strides + (1,))
    np.copyto(as_bytes(buffer).reshape(grid.shape), grid)
    return finish(result, buffer)
