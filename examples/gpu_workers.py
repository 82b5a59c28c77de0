"""Per-volume means of a folder of ``.npy`` volumes, read straight into GPU memory on dask-cuda workers.

Builds a small synthetic folder (big-endian, C- and Fortran-ordered),
starts one dask-cuda worker per GPU (``LocalCUDACluster``) with an RMM pool
that CuPy allocates from (``rmm_allocator_external_lib_list="cupy"``: with
``rmm_pool_size`` alone CuPy keeps its own pool beside RMM's, which holds most
of the card), prints what each worker reads with (kvikio's mode, threads, GDS)
and which allocator its CuPy uses, opens the folder with
``npydask.open_dataset(folder, device="gpu")`` and computes each volume's
mean on the workers: every chunk is a ``cupy.ndarray`` read with kvikio
(GPUDirect Storage where available, POSIX compatibility mode otherwise).

This client builds the graph itself, so it needs CuPy too (dask's meta is a
``cupy.ndarray``); for a client without a GPU see ``gpu_client_submit.py``.

Run::

    python examples/gpu_workers.py                       # 8 volumes of 64^3 float32
    python examples/gpu_workers.py --rmm-pool-size 0     # no RMM pool: CuPy's own pool
    python examples/gpu_workers.py --check               # tiny, checked against numpy

Needs ``pip install 'npydask[gpu-cu12]' dask-cuda rmm-cu12`` (``-cu13`` for a
CUDA 13 driver) and an NVIDIA GPU; without RMM the workers use CuPy's own pool.
With ``--check`` a machine without them prints a ``skipped: ...`` line and
exits 0, so the example can run in CPU-only test suites.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
from typing import Any

import numpy as np


def missing() -> str | None:
    """Why this machine cannot run the example, or ``None`` when it can."""
    from npydask.errors import GpuUnavailableError
    from npydask.gpu import require_gpu

    try:
        require_gpu()
    except ImportError:
        return "no GPU: CuPy is not installed (pip install 'npydask[gpu-cu12]' or 'npydask[gpu-cu13]')"
    except GpuUnavailableError:
        return "no GPU: CuPy sees no usable CUDA device"
    if importlib.util.find_spec("dask_cuda") is None:
        return "dask-cuda not installed (pip install dask-cuda)"
    return None


def make_folder(root: str, n: int, shape: tuple[int, ...]) -> list[np.ndarray]:
    """Write ``n`` big-endian volumes into ``root``, C and Fortran order; return them.

    (The files of a dataset share one dtype, byte order included: the device swaps bytes.)
    """
    rng = np.random.default_rng(0)
    volumes = []
    for i in range(n):
        v = (rng.standard_normal(shape) + i).astype(">f4")
        np.save(os.path.join(root, f"vol{i:03d}.npy"), np.asfortranarray(v) if i % 3 == 0 else v)
        volumes.append(v)
    return volumes


def pool_size(text: str) -> float | str | None:
    """``--rmm-pool-size``: a fraction of the card (``0.5``), a size (``"24GB"``), or 0 for no RMM pool."""
    try:
        value = float(text)
    except ValueError:
        return text
    return None if value == 0 else value


def rmm_options(size: float | str | None) -> dict[str, Any]:
    """``LocalCUDACluster`` arguments for an RMM pool that CuPy allocates from (none without RMM or a size)."""
    if size is None or importlib.util.find_spec("rmm") is None:
        return {}
    return {"rmm_pool_size": size, "rmm_allocator_external_lib_list": "cupy"}


def cupy_allocator() -> str:
    """Which allocator CuPy uses in this process (run on each worker): RMM's or CuPy's own pool."""
    import cupy

    allocator = cupy.cuda.get_allocator()
    owner = getattr(allocator, "__self__", None)  # a bound MemoryPool.malloc: CuPy's own pool
    if type(owner).__name__.endswith("MemoryPool"):
        return f"CuPy's own {type(owner).__name__}"
    return f"{getattr(allocator, '__module__', '?')}.{getattr(allocator, '__qualname__', type(allocator).__name__)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="tiny run checked against numpy; skip without a GPU")
    parser.add_argument("--volumes", type=int, default=8)
    parser.add_argument("--size", type=int, default=64, help="edge of each cubic volume")
    parser.add_argument("--rmm-pool-size", type=pool_size, default="auto",
                        help="RMM pool per worker: a fraction of the card (0.5, the default), a size "
                             "('24GB'; '256MiB' with --check), or 0 for no RMM")  # fmt: skip
    args = parser.parse_args(argv)
    why = missing()
    if why is not None:
        print(f"skipped: {why}")
        return 0 if args.check else 1
    if args.check:
        args.volumes, args.size = 4, 16
    if args.rmm_pool_size == "auto":
        args.rmm_pool_size = "256MiB" if args.check else 0.5

    import cupy
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    import npydask
    from npydask.gpu import describe

    rmm = rmm_options(args.rmm_pool_size)
    if args.rmm_pool_size is not None and not rmm:
        print("RMM is not installed (pip install rmm-cu12 or rmm-cu13): the workers use CuPy's own pool")
    with tempfile.TemporaryDirectory() as root:
        volumes = make_folder(root, args.volumes, (args.size,) * 3)
        cluster = LocalCUDACluster(n_workers=1 if args.check else None, dashboard_address=None, **rmm)
        with cluster, Client(cluster) as client:
            print(f"workers: {len(client.scheduler_info()['workers'])}; RMM: {rmm or 'none'}")
            allocators = client.run(cupy_allocator)
            for address, text in client.run(describe).items():  # each worker's own reader, not the client's
                print(f"worker {address}: reading with {text}; CuPy allocates with {allocators[address]}")
            ds = npydask.open_dataset(root, device="gpu")
            x = ds.stack()
            means = cupy.asnumpy(x.mean(axis=(1, 2, 3)).compute())
        for path, mean in zip(ds.files, means):
            print(f"{os.path.basename(path)}: mean {mean:.4f}")
        expected = np.array([v.astype("<f4").mean() for v in volumes])
        if not np.allclose(means, expected, rtol=1e-4, atol=1e-4):
            print(f"mismatch: expected {expected}, found {means}", file=sys.stderr)
            return 1
        if rmm and not all("rmm" in a for a in allocators.values()):
            print(f"CuPy is not on RMM on every worker: {allocators}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
