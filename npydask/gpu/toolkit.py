"""The CUDA toolkit check: the first device read of a process compiles and runs one tiny kernel.

CuPy compiles its kernels at run time with NVRTC (``libnvrtc``, part of the
CUDA toolkit, not of the driver). An install without it (a CuPy 13 wheel on a
machine without a local toolkit, or CuPy 14 without its ``[ctk]`` extra) still
allocates and reads: kvikio writes bytes and no kernel runs, so a plain
C-order chunk arrives. The first fill, copy, byte swap, transpose or
reduction then fails deep inside a task ("CuPy failed to load libnvrtc").
:func:`check_toolkit` compiles and runs one elementwise kernel instead, checks
its values, and turns any failure into a
:class:`~npydask.errors.GpuUnavailableError` that names NVRTC, what failed
and how to install a working toolkit (:func:`toolkit_error`).

The check runs once per process: its outcome (pass, or the failure, raised
again at every later read) is kept with the process id, so a forked child
checks again. Threads wait for the one check under a lock, which a forked
child replaces.

This module imports neither CuPy nor CUDA: the caller passes the CuPy module
(:func:`npydask.gpu.array_module` does, at every device read).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

from npydask.errors import GpuUnavailableError

__all__ = ["KERNEL_NAME", "check_toolkit", "toolkit_error"]

KERNEL_NAME = "npydask_toolkit_check"
"""The check kernel's name (a device probe counts its compilations by it)."""

_INPUT = np.arange(8, dtype=np.int32)
_EXPECTED = _INPUT * 2 + 1

FIX = (
    "install CuPy with its CUDA toolkit, matching the CUDA version nvidia-smi shows: "
    "pip install 'npydask[gpu-cu12]' or 'npydask[gpu-cu13]' (CuPy's [ctk] extra brings NVRTC), "
    "or add NVRTC alone to CuPy 14: pip install nvidia-cuda-nvrtc-cu12 (CUDA 13: nvidia-cuda-nvrtc); "
    'python -c "import cupy; cupy.show_config()" shows the NVRTC CuPy found'
)
"""What to do when the check fails."""

_NOT_FOUND = ("load", "cannot open", "not found", "notfound", "finding", "no such file")
"""Words of a missing ``libnvrtc`` (CuPy 13's loader, CuPy 14's ``cuda.pathfinder``)."""

_lock = threading.Lock()
_outcome: tuple[int, BaseException | None] | None = None
"""``(pid, failure or None)`` of this process's check; ``None`` before it."""


def _new_lock() -> None:
    global _lock
    _lock = threading.Lock()  # (a fork while another thread held the lock would leave it held forever)


os.register_at_fork(after_in_child=_new_lock)


def check_toolkit(cupy: Any) -> None:
    """Compile and run one tiny kernel with ``cupy``, once per process; raise clearly if it fails.

    The kernel (``y = x * 2 + 1`` on eight ``int32``) is compiled with NVRTC,
    launched on the current device and its result brought back and compared.
    Later calls in the same process return at once, or raise the first
    call's failure again; a child process checks anew.

    Parameters
    ----------
    cupy
        The CuPy module (a stand-in in tests).

    Raises
    ------
    GpuUnavailableError
        Compiling, launching or checking the kernel failed (:func:`toolkit_error`),
        with the original error as its cause.
    """
    global _outcome
    pid = os.getpid()
    outcome = _outcome
    if outcome is None or outcome[0] != pid:
        with _lock:
            outcome = _outcome
            if outcome is None or outcome[0] != pid:
                outcome = _outcome = (pid, _try_kernel(cupy))
    failure = outcome[1]
    if failure is not None:
        raise toolkit_error(failure) from failure


def _try_kernel(cupy: Any) -> BaseException | None:
    """``None`` when the kernel compiles, runs and computes the expected values; else what failed."""
    try:
        kernel = cupy.ElementwiseKernel("int32 x", "int32 y", "y = x * 2 + 1", KERNEL_NAME)
        got = np.asarray(kernel(cupy.asarray(_INPUT)).get())  # (.get() waits for the kernel)
    except Exception as e:  # CompileException, NVRTCError, "failed to load libnvrtc", a CUDA error
        return e
    if got.shape != _EXPECTED.shape or not np.array_equal(got, _EXPECTED):
        return RuntimeError(f"the kernel ran but computed {got.tolist()} instead of {_EXPECTED.tolist()}")
    return None


def toolkit_error(error: BaseException) -> GpuUnavailableError:
    """The failure of the kernel check as a :class:`GpuUnavailableError` naming NVRTC, the cause and the fix.

    Examples
    --------
    >>> print(toolkit_error(RuntimeError("CuPy failed to load libnvrtc.so.12")))  # doctest: +ELLIPSIS
    device="gpu": the CUDA toolkit check failed: NVRTC (libnvrtc), which CuPy compiles every kernel with, \
could not be loaded (RuntimeError: CuPy failed to load libnvrtc.so.12). ... pip install 'npydask[gpu-cu12]' ...
    """
    text = " ".join(str(error).split())
    if len(text) > 600:
        text = text[:600] + " ..."
    name = type(error).__name__
    lowered = f"{name} {text}".lower()
    if "nvrtc" in lowered and any(w in lowered for w in _NOT_FOUND):
        what = "NVRTC (libnvrtc), which CuPy compiles every kernel with, could not be loaded"
    elif "nvrtc" in lowered or "compile" in lowered:
        what = "NVRTC (libnvrtc) failed to compile a one-line CuPy kernel"
    else:
        what = (
            "compiling (with NVRTC) and running a one-line CuPy kernel failed; if NVRTC is installed, the CUDA "
            "driver may be older than the toolkit CuPy was built for (nvidia-smi shows the driver's CUDA version)"
        )
    return GpuUnavailableError(
        f'device="gpu": the CUDA toolkit check failed: {what} ({name}: {text}). Without NVRTC reads may '
        f"arrive but every copy, byte swap and reduction fails; {FIX}"
    )
