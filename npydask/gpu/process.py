"""What this process may do with CUDA, found without initialising CUDA.

CUDA does not survive ``fork``: once a process has initialised it (``cuInit``,
which ``cupy.cuda.is_available()`` and every allocation call), a child forked
from it fails its first CUDA call with "initialization error". DataLoader
workers are forked by default on Linux, so the call-time check of
``device="gpu"`` must not initialise CUDA; this module answers its two
questions without doing so:

- :func:`visible_devices`: how many CUDA devices this process would see,
  counted by NVML (``nvidia-ml-py``, if installed: NVML creates no CUDA
  context) or else by the driver's device files (``/dev/nvidiactl`` and
  ``/dev/nvidia<N>``), less what ``CUDA_VISIBLE_DEVICES`` hides
  (:func:`cuda_visible_count`);
- :func:`note_cuda_use` records the process that first used CUDA through
  npydask, and :func:`check_cuda_fork` raises in a child forked after that
  (or after PyTorch initialised CUDA), naming what works instead.

This module imports neither CuPy nor torch.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import re
import sys

from npydask.errors import GpuUnavailableError

__all__ = ["DeviceCount", "check_cuda_fork", "cuda_visible_count", "forked_after_cuda", "note_cuda_use",
           "visible_devices"]  # fmt: skip

DEV = "/dev"
"""Where the driver's device files are (a test points it elsewhere)."""

_CUDA_PID: int | None = None
"""The process that first used CUDA through npydask (inherited by forked children)."""

_DEVICE_FILE = re.compile(r"nvidia\d+")


@dataclasses.dataclass(frozen=True)
class DeviceCount:
    """Devices this process would see: ``count`` (``None``: some, number unknown) and how it was found."""

    count: int | None
    how: str

    def __bool__(self) -> bool:
        return self.count is None or self.count > 0


def cuda_visible_count(spec: str | None, physical: int | None) -> int | None:
    """Devices CUDA shows a process given ``CUDA_VISIBLE_DEVICES=spec`` and ``physical`` devices.

    CUDA reads the list left to right and stops at the first entry that names
    no device: an index out of range, negative or repeated, or text that is
    neither a ``GPU-`` nor a ``MIG-`` UUID (Slurm's ``NoDevFiles``). Unset
    (``None``) shows every device; ``physical=None`` means unknown (UUIDs and
    indices are then taken as valid, and the result is ``None`` when unset).

    Examples
    --------
    >>> [cuda_visible_count(s, 2) for s in (None, "", "-1", "NoDevFiles", "1,0", "0,5,1", "2", "GPU-8f3a,MIG-1")]
    [2, 0, 0, 0, 2, 1, 0, 2]
    >>> cuda_visible_count("0,1", None), cuda_visible_count(None, None)
    (2, None)
    """
    if spec is None:
        return physical
    count, seen = 0, set()
    for token in spec.split(","):
        token = token.strip()
        if re.fullmatch(r"[+-]?\d+", token):
            index = int(token)
            if index < 0 or index in seen or (physical is not None and index >= physical):
                break
            seen.add(index)
        elif not token.upper().startswith(("GPU-", "MIG-")):
            break
        count += 1
    return count if physical is None else min(count, physical)


def _nvml_count() -> tuple[int | None, str]:
    """Physical devices by NVML (``None`` when NVML is missing or fails), and what happened."""
    try:
        found = importlib.util.find_spec("pynvml") is not None
    except ValueError:  # a module in sys.modules without a spec (a stand-in)
        found = True
    if not found:
        return None, "nvidia-ml-py (pynvml) is not installed"
    try:
        nvml = importlib.import_module("pynvml")
        nvml.nvmlInit()
    except Exception as e:  # no driver, no libnvidia-ml, a broken install
        return None, f"NVML failed: {type(e).__name__}: {e}"
    try:
        return int(nvml.nvmlDeviceGetCount()), "NVML"
    except Exception as e:
        return None, f"NVML failed: {type(e).__name__}: {e}"
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # (counting worked or failed already; nothing to add)
            pass


def _device_files() -> tuple[int | None, str]:
    """Physical devices by the driver's device files (``None``: some, number unknown)."""
    try:
        names = os.listdir(DEV)
    except OSError as e:
        return 0, f"cannot list {DEV}: {e}"
    files = [n for n in names if _DEVICE_FILE.fullmatch(n)]
    if files and "nvidiactl" in names:
        return len(files), f"the driver's device files ({DEV}/nvidia0...)"
    if "dxg" in names:  # WSL 2: CUDA goes through /dev/dxg; only NVML could count
        return None, f"WSL's {DEV}/dxg"
    return 0, f"no {DEV}/nvidiactl and {DEV}/nvidia<N> device files"


def visible_devices() -> DeviceCount:
    """The CUDA devices this process would see, counted without initialising CUDA.

    NVML first, then the driver's device files; ``CUDA_VISIBLE_DEVICES`` is
    applied to the physical count with :func:`cuda_visible_count`. ``how``
    says what was found, for a message.
    """
    physical, how = _nvml_count()
    if physical is None:
        nvml_said = how
        physical, how = _device_files()
        how = f"{how}; {nvml_said}"
    else:
        how = f"NVML counts {physical} device{'s' * (physical != 1)}"
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = cuda_visible_count(spec, physical)
    if count == 0 and physical != 0:
        how = f"CUDA_VISIBLE_DEVICES={spec!r} names none of them ({how})"
    return DeviceCount(count, how)


def note_cuda_use() -> None:
    """Record this process as the one that uses CUDA through npydask (the first call wins)."""
    global _CUDA_PID
    if _CUDA_PID is None:
        _CUDA_PID = os.getpid()


def forked_after_cuda() -> str | None:
    """Why CUDA is unusable here (a fork after CUDA was initialised in an ancestor), or ``None``."""
    pid = os.getpid()
    if _CUDA_PID is not None and _CUDA_PID != pid:
        return f"npydask initialised CUDA in process {_CUDA_PID}, and this process ({pid}) was forked from it"
    torch = sys.modules.get("torch")
    in_bad_fork = getattr(getattr(torch, "cuda", None), "_is_in_bad_fork", None)
    if callable(in_bad_fork) and in_bad_fork():
        return f"PyTorch initialised CUDA in the parent process, and this process ({pid}) was forked from it"
    return None


def check_cuda_fork() -> None:
    """Raise :class:`~npydask.errors.GpuUnavailableError` in a child forked after CUDA was initialised.

    Its first CUDA call would fail with CUDA's "initialization error"; the
    message names what works: DataLoader ``num_workers=0`` (device reads are
    asynchronous already) or ``multiprocessing_context="spawn"``.
    """
    why = forked_after_cuda()
    if why is None:
        return
    raise GpuUnavailableError(
        f'device="gpu": {why}, and CUDA does not survive a fork. In a PyTorch DataLoader use num_workers=0 '
        '(device reads run on kvikio\'s threads already) or multiprocessing_context="spawn"; elsewhere start '
        'processes with the "spawn" method. A fork is safe only while the parent has not used the GPU'
    )
