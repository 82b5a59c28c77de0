"""Checks for the GPU path, imported only when ``device="gpu"`` is asked for.

CuPy imports on machines without a CUDA driver and only fails when it first
allocates, so availability is checked with ``cupy.cuda.is_available()``.
"""

from __future__ import annotations

import importlib.util

from npydask.errors import GpuUnavailableError

__all__ = ["INSTALL_HINT", "require_gpu"]

INSTALL_HINT = "install the GPU extra with: pip install 'npydask[gpu]' (CuPy and kvikio for CUDA 12)"


def require_gpu() -> None:
    """Raise unless CuPy imports and sees a usable CUDA device.

    Raises
    ------
    ImportError
        CuPy is not installed.
    GpuUnavailableError
        CuPy is installed but no CUDA device or driver is usable (a ``RuntimeError``).
    """
    if importlib.util.find_spec("cupy") is None:
        raise ImportError(f'device="gpu" needs CuPy, which is not installed; {INSTALL_HINT}')
    import cupy

    try:
        usable = bool(cupy.cuda.is_available())
    except Exception as e:  # a broken driver install raises from CuPy's C layer
        raise GpuUnavailableError(f'device="gpu": CuPy cannot reach a CUDA device ({e}); {INSTALL_HINT}') from e
    if not usable:
        raise GpuUnavailableError(
            'device="gpu": CuPy is installed but sees no usable CUDA device or driver; '
            f"run on a machine with an NVIDIA GPU, or use device='cpu'. ({INSTALL_HINT})"
        )
    raise NotImplementedError(
        'device="gpu": reading into CuPy chunks is not implemented in this version yet; use device="cpu"'
    )
