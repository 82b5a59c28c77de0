"""A client without a GPU (a laptop, a login node) driving GPU workers: build and reduce the graph on a worker.

``device="gpu"`` needs CuPy where the graph is built (dask's meta is a
``cupy.ndarray``), and a client without CuPy or a GPU is refused. So the
client does not build the graph: it ``client.submit``s a function that opens
the data with ``device="gpu"`` *on a worker*, computes there (through
``worker_client``, so every GPU worker reads its share of the tasks) and
returns a small host result (numpy: the client could not unpickle CuPy
arrays). The client process never imports CuPy. The files must be where the
workers can read them (a shared file system, or object storage).

Run::

    # a CPU-only client of running dask-cuda workers, on a folder the workers see
    python examples/gpu_client_submit.py --scheduler tcp://gpu-node:8786 --folder /data/scans
    # a demo on this machine: a LocalCUDACluster, sample volumes written to a temporary folder
    python examples/gpu_client_submit.py
    # tiny, checked against numpy; without a GPU the same function runs with device="cpu"
    python examples/gpu_client_submit.py --check

The workers need ``pip install 'npydask[gpu-cu12]' dask-cuda`` (or ``gpu-cu13``);
the client only ``pip install npydask``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile

import numpy as np


def volume_means(folder: str, device: str) -> np.ndarray:
    """Runs on a worker: open ``folder`` there, reduce it on the cluster, return host data.

    The graph is built here, on a worker that has CuPy and a GPU; its tasks run
    on every worker (``worker_client``), each on its own GPU.
    """
    from distributed import worker_client

    import npydask

    x = npydask.open_dataset(folder, device=device).stack()
    means = x.mean(axis=tuple(range(1, x.ndim)))
    with worker_client() as client:  # (leaves this task's thread while the graph runs)
        result = client.compute(means).result()
    return result.get() if hasattr(result, "get") else np.asarray(result)  # CuPy -> numpy for the client


def gpu_here() -> str | None:
    """Why this machine cannot start GPU workers for the demo, or ``None`` (CuPy and CUDA untouched here)."""
    for module in ("cupy", "dask_cuda"):
        if importlib.util.find_spec(module) is None:
            return f"no GPU workers here ({module} is not installed)"
    try:
        import pynvml  # (nvidia-ml-py, which dask-cuda needs: counts devices without initialising CUDA)

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except Exception as e:
        return f"no GPU workers here (NVML: {type(e).__name__}: {e})"
    return None if count else "no GPU workers here (NVML counts no device)"


def make_folder(root: str, n: int, edge: int) -> list[np.ndarray]:
    """``n`` big-endian float32 volumes of ``edge``^3 in ``root``, C and Fortran order."""
    rng = np.random.default_rng(1)
    volumes = []
    for i in range(n):
        v = (rng.standard_normal((edge,) * 3) + i).astype(">f4")
        np.save(os.path.join(root, f"vol{i:03d}.npy"), np.asfortranarray(v) if i % 3 == 0 else v)
        volumes.append(v)
    return volumes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheduler", help="address of a running cluster of GPU workers (tcp://host:8786)")
    parser.add_argument("--folder", help="a folder of .npy volumes the workers can read (with --scheduler)")
    parser.add_argument("--check", action="store_true", help="tiny, checked against numpy; device='cpu' without a GPU")
    args = parser.parse_args(argv)
    if bool(args.scheduler) != bool(args.folder):
        parser.error("--scheduler and --folder go together (without both: a demo on this machine)")

    from distributed import Client, LocalCluster

    if args.scheduler:  # the real use: this client needs neither CuPy nor a GPU
        with Client(args.scheduler) as client:
            means = client.submit(volume_means, args.folder, "gpu", pure=False).result()
        for i, mean in enumerate(means):
            print(f"volume {i}: mean {mean:.4f}")
        return 0

    why = gpu_here()
    if why is not None and not args.check:
        print(f"{why}: give --scheduler and --folder of GPU workers, or run with --check", file=sys.stderr)
        return 1
    device = "cpu" if why else "gpu"
    with tempfile.TemporaryDirectory() as root:
        volumes = make_folder(root, 4 if args.check else 8, 16 if args.check else 64)
        if device == "gpu":
            from dask_cuda import LocalCUDACluster

            cluster = LocalCUDACluster(n_workers=1 if args.check else None, dashboard_address=None)
        else:  # the same function on CPU workers, so the example never rots
            print(f"{why}: the same submit with device='cpu' on a LocalCluster")
            cluster = LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None)
        with cluster, Client(cluster) as client:
            means = client.submit(volume_means, root, device, pure=False).result()
        expected = np.array([v.astype("<f4").mean() for v in volumes])
        for i, mean in enumerate(means):
            print(f"volume {i}: mean {mean:.4f}")
        print(f"device={device!r}: the means equal numpy's: {bool(np.allclose(means, expected, rtol=1e-4, atol=1e-4))}")
        print(f"this client imported CuPy: {'cupy' in sys.modules}")
        if not np.allclose(means, expected, rtol=1e-4, atol=1e-4) or type(means) is not np.ndarray:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
