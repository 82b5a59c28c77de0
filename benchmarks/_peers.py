"""Optional peers for the benchmark tables: NVIDIA DALI's numpy reader and Ray Data, where installed.

Each helper returns ``None`` when its package is missing or cannot run here,
so a script prints only the peers this machine has. DALI runs its CPU reader
(``device_id=None``: no GPU needed); Ray is started once, with 2 CPUs and no
dashboard, and stopped by :func:`stop`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

_ray_started = False


def has(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def dali_reader(paths: Sequence[str], batch: int, **roi: Any) -> Callable[[], list[np.ndarray]] | None:
    """A function reading every path (with DALI's ROI arguments) through ``fn.readers.numpy`` on the CPU.

    The pipeline is built once, here; each call runs one epoch of it.
    """
    if not has("nvidia.dali"):
        return None
    from nvidia.dali import fn, pipeline_def

    batch = max(1, min(batch, len(paths)))
    n_batches = -(-len(paths) // batch)

    @pipeline_def(batch_size=batch, num_threads=2, device_id=None, prefetch_queue_depth=1)
    def pipe():
        return fn.readers.numpy(files=list(paths), pad_last_batch=True, name="reader", **roi)

    p = pipe()
    p.build()

    def run() -> list[np.ndarray]:
        out: list[np.ndarray] = []
        for _ in range(n_batches):
            (tl,) = p.run()
            out += [np.array(tl[i]) for i in range(len(tl))]
        return out[: len(paths)]

    return run


def ray_sum(paths: Sequence[str]) -> Callable[[], float] | None:
    """A function summing every file with ``ray.data.read_numpy`` (Ray started once, untimed)."""
    global _ray_started
    if not has("ray"):
        return None
    try:
        import ray
        import ray.data

        if not _ray_started:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
            ray.data.DataContext.get_current().enable_progress_bars = False
            _ray_started = True
    except Exception:  # Ray present but unusable here: no peer
        return None

    def run() -> float:
        total = np.float32(0)
        for b in ray.data.read_numpy(list(paths)).iter_batches(batch_format="numpy", batch_size=None):
            total += np.float32(b["data"].sum(dtype=np.float32))
        return float(total)

    return run


def stop() -> None:
    """Stop Ray if :func:`ray_sum` started it."""
    global _ray_started
    if _ray_started:
        import ray

        ray.shutdown()
        _ray_started = False
