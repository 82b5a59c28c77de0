"""Per-volume means of a folder of ``.npy`` volumes, read straight into GPU memory on dask-cuda workers.

Builds a small synthetic folder (C- and Fortran-ordered, both byte orders),
starts one dask-cuda worker per GPU (``LocalCUDACluster``), opens the folder
with ``npydask.open_dataset(folder, device="gpu")`` and computes each
volume's mean on the workers: every chunk is a ``cupy.ndarray`` read with
kvikio (GPUDirect Storage where available, POSIX compatibility mode otherwise).

Run::

    python examples/gpu_workers.py              # 8 volumes of 64^3 float32
    python examples/gpu_workers.py --check      # tiny, checked against numpy

Needs ``pip install 'npydask[gpu]' dask-cuda`` and an NVIDIA GPU. With
``--check`` a machine without them prints a ``skipped: ...`` line and exits 0,
so the example can run in CPU-only test suites.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile

import numpy as np


def missing() -> str | None:
    """Why this machine cannot run the example, or ``None`` when it can."""
    from npydask.errors import GpuUnavailableError
    from npydask.gpu import require_gpu

    try:
        require_gpu()
    except ImportError:
        return "no GPU: CuPy is not installed (pip install 'npydask[gpu]')"
    except GpuUnavailableError:
        return "no GPU: CuPy sees no usable CUDA device"
    if importlib.util.find_spec("dask_cuda") is None:
        return "dask-cuda not installed (pip install dask-cuda)"
    return None


def make_folder(root: str, n: int, shape: tuple[int, ...]) -> list[np.ndarray]:
    """Write ``n`` volumes into ``root``, alternating C/Fortran order and byte order; return them."""
    rng = np.random.default_rng(0)
    volumes = []
    for i in range(n):
        v = rng.standard_normal(shape).astype(">f4" if i % 2 else "<f4") + i
        np.save(os.path.join(root, f"vol{i:03d}.npy"), np.asfortranarray(v) if i % 3 == 0 else v)
        volumes.append(v)
    return volumes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="tiny run checked against numpy; skip without a GPU")
    parser.add_argument("--volumes", type=int, default=8)
    parser.add_argument("--size", type=int, default=64, help="edge of each cubic volume")
    args = parser.parse_args(argv)
    why = missing()
    if why is not None:
        print(f"skipped: {why}")
        return 0 if args.check else 1
    if args.check:
        args.volumes, args.size = 4, 16

    import cupy
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    import npydask
    from npydask.backends.kvikio import describe

    with tempfile.TemporaryDirectory() as root:
        volumes = make_folder(root, args.volumes, (args.size,) * 3)
        with LocalCUDACluster(n_workers=1 if args.check else None) as cluster, Client(cluster) as client:
            print(f"workers: {len(client.scheduler_info()['workers'])}; reading with {describe()}")
            ds = npydask.open_dataset(root, device="gpu")
            x = ds.stack()
            means = cupy.asnumpy(x.mean(axis=(1, 2, 3)).compute())
        for path, mean in zip(ds.files, means):
            print(f"{os.path.basename(path)}: mean {mean:.4f}")
        expected = np.array([v.astype("<f4").mean() for v in volumes])
        if not np.allclose(means, expected, rtol=1e-4, atol=1e-4):
            print(f"mismatch: expected {expected}, found {means}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
