"""Executing a :class:`~npydask.gpu.plan.GpuReadPlan` with an injected reader and array module.

``read_span(offset, size, dest)`` fills a slice of the staging buffer (a
kvikio ``pread`` future on a GPU, ``os.preadv`` into pinned memory without
kvikio, a plain read in the CPU tests) and ``xp`` is CuPy or numpy: the same
code runs the device steps (cut, transpose, byte swap, pad) in both.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from npydask.errors import FileChangedError
from npydask.gpu.plan import DEFAULT_ALIGNMENT, GpuReadPlan, SpanRead, c_contiguous

__all__ = ["Pending", "ReadSpan", "address", "aligned_empty", "as_bytes", "drain", "execute_plan", "fill_staging",
           "finish", "issue_direct", "issue_reads", "wait_reads"]  # fmt: skip


class _Waitable(Protocol):
    def get(self) -> int: ...


ReadSpan = Callable[[int, int, Any], "int | _Waitable"]
"""``read_span(file_offset, size, dest)`` fills ``dest`` (a 1-D ``uint8`` slice of the staging
buffer) and returns the bytes read, or a future whose ``get()`` does (a kvikio ``IOFuture``)."""


def address(a: Any) -> int:
    """The address of ``a``'s first byte (a CuPy or a numpy array)."""
    iface = getattr(a, "__cuda_array_interface__", None) or a.__array_interface__
    return int(iface["data"][0])


def aligned_empty(xp: Any, nbytes: int, alignment: int = DEFAULT_ALIGNMENT) -> Any:
    """A 1-D ``uint8`` array of ``nbytes`` from ``xp`` whose address is a multiple of ``alignment``.

    Examples
    --------
    >>> a = aligned_empty(np, 10_000)
    >>> a.shape, a.ctypes.data % 4096
    ((10000,), 0)
    """
    raw = xp.empty(nbytes + alignment, dtype=xp.uint8)
    shift = -address(raw) % alignment
    return raw[shift : shift + nbytes]


Pending = list[tuple[SpanRead, Any]]
"""Reads issued and not yet waited on, with what ``read_span`` returned for each."""


def issue_reads(plan: GpuReadPlan, read_span: ReadSpan, staging: Any) -> Pending:
    """Issue every read of ``plan`` into ``staging`` without waiting on any.

    If issuing fails, the reads already issued are waited on before the error
    propagates, so none still writes into a buffer being released.
    """
    pending: Pending = []
    try:
        for r in plan.reads:
            pending.append((r, read_span(r.file_offset, r.size, staging[r.staging_offset : r.staging_offset + r.size])))
    except BaseException:
        drain(pending)
        raise
    return pending


def as_bytes(out: Any) -> Any:
    """A C-contiguous ``out`` as a 1-D ``uint8`` view of its memory (what a ``pread`` fills)."""
    return out.reshape(-1).view(np.uint8)


def issue_direct(plan: GpuReadPlan, read_span: ReadSpan, out: Any) -> Pending:
    """Read a :attr:`~npydask.gpu.plan.GpuReadPlan.direct` region straight into ``out``: one read, no staging.

    ``out`` is C-contiguous, of the plan's shape and native dtype; the file's
    bytes are the answer as they are, so nothing is left to do on the device.
    """
    span = plan.direct
    if span is None:
        raise ValueError("issue_direct needs a plan whose region is one contiguous native stretch of the file")
    offset, nbytes = span
    return [(SpanRead(offset, nbytes, 0), read_span(offset, nbytes, as_bytes(out)))]


def wait_reads(pending: Pending, source: str = "<file>") -> None:
    """Wait for every issued read (all of them, even after one fails) and check its size.

    Raises
    ------
    FileChangedError
        A read returned fewer bytes than planned: the file shrank after it was opened.
        (kvikio's POSIX reads raise at end of file instead of returning short; the
        kvikio backend translates that into this same error.)
    """
    short = None
    for k, (r, result) in enumerate(pending):
        try:
            got = result if isinstance(result, int) else result.get()
        except BaseException:
            drain(pending[k + 1 :])
            raise
        if got != r.size and short is None:
            short = (r, got)
    if short is not None:
        r, got = short
        raise FileChangedError(
            errno.EIO,
            f"read {got} of {r.size} bytes at offset {r.file_offset}: the file is shorter than when it "
            "was opened (truncated meanwhile); open it again",
            source,
        )


def fill_staging(plan: GpuReadPlan, read_span: ReadSpan, staging: Any, source: str = "<file>") -> None:
    """Issue every read of ``plan`` into ``staging``, then wait for all and check their sizes.

    All reads are issued before any is waited on, so a reader returning
    futures (kvikio) runs them in parallel. See :func:`issue_reads` and
    :func:`wait_reads`.
    """
    wait_reads(issue_reads(plan, read_span, staging), source)


def drain(pending: Pending) -> None:
    """Wait for issued reads, ignoring their errors (when another error is already on its way)."""
    for _, result in pending:
        if not isinstance(result, int):
            try:
                result.get()
            except BaseException:  # noqa: S110 - the first error is the one raised
                pass


def _strided(xp: Any, buf: Any, offset: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any) -> Any:
    """A view of ``buf`` (1-D ``uint8``) as ``dtype`` at byte ``offset`` with ``strides``."""
    if isinstance(buf, np.ndarray):
        return np.ndarray(shape, dtype, buffer=buf, offset=offset, strides=strides)
    return xp.ndarray(shape, dtype, memptr=buf.data + offset, strides=strides)


def finish(plan: GpuReadPlan, staging: Any, xp: Any, out: Any = None) -> Any:
    """Cut, transpose, byte-swap and pad the staged bytes into a C-contiguous native-order array.

    Returns ``out`` (C-contiguous, of ``plan.shape`` and ``plan.out_dtype``)
    when given; otherwise a new array, or a zero-copy view of ``staging``
    when the region needs no step at all.
    """
    dtype = plan.out_dtype
    cut = plan.cut
    if cut is None:
        result = xp.empty(plan.shape, dtype=dtype) if out is None else out
        if plan.pad is not None and result.size:
            result.fill(plan.pad.fill)
        return result
    bytewise = bool(plan.swap_bytes) or not plan.aligned
    axes = plan.transpose
    if not bytewise:
        src = _strided(xp, staging, cut.offset, cut.shape, cut.strides, dtype)
        if axes is not None:
            src = src.transpose(axes)
        if out is None and plan.pad is None and c_contiguous(src.shape, src.strides, dtype.itemsize):
            return src  # already the answer: no copy
    result = xp.empty(plan.shape, dtype=dtype) if out is None else out
    if plan.pad is not None:
        result.fill(plan.pad.fill)
    if bytewise:
        comp = plan.swap_bytes or dtype.itemsize
        grid = (dtype.itemsize // comp, comp)
        first, step = (comp - 1, -1) if plan.swap_bytes else (0, 1)
        src = _strided(xp, staging, cut.offset + first, cut.shape + grid, cut.strides + (comp, step), xp.uint8)
        if axes is not None:
            src = src.transpose(axes + (len(axes), len(axes) + 1))
        dest = result.reshape(-1).view(xp.uint8).reshape(result.shape + grid)
        dest[plan.interior] = src
    else:
        result[plan.interior] = src
    return result


def execute_plan(
    plan: GpuReadPlan,
    read_span: ReadSpan,
    xp: Any,
    *,
    out: Any = None,
    source: str = "<file>",
) -> Any:
    """Run ``plan``: stage its reads through ``read_span``, then :func:`finish` on ``xp``.

    Parameters
    ----------
    plan : GpuReadPlan
        What to read and how to post-process it.
    read_span : callable
        ``read_span(file_offset, size, dest)``: fill ``dest`` (a slice of the
        staging buffer); return the byte count or a future with ``get()``.
    xp : module
        ``numpy`` or ``cupy``: where the staging buffer and result live.
    out : array, optional
        A C-contiguous result of ``plan.shape`` and ``plan.out_dtype`` to fill.
    source : str
        The file, for error messages.

    Examples
    --------
    >>> import io, os
    >>> from npydask.format.header import parse_header
    >>> from npydask.gpu.plan import plan_gpu_read
    >>> from npydask.plan.region import Box
    >>> buf = io.BytesIO(); np.save(buf, np.asfortranarray(np.arange(12, dtype=">i4").reshape(3, 4)))
    >>> raw = buf.getvalue(); h = parse_header(raw)
    >>> def read_span(offset, size, dest):
    ...     got = raw[offset : offset + size]; dest[: len(got)] = np.frombuffer(got, np.uint8); return len(got)
    >>> p = plan_gpu_read(h, Box((1, 1), (3, 3)), file_size=len(raw))
    >>> execute_plan(p, read_span, np)
    array([[ 5,  6],
           [ 9, 10]], dtype=int32)
    """
    if plan.cut is None:
        return finish(plan, None, xp, out)
    staging = aligned_empty(xp, plan.staging_nbytes, plan.alignment)
    fill_staging(plan, read_span, staging, source)
    return finish(plan, staging, xp, out)
