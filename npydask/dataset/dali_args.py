"""DALI ``fn.readers.numpy`` arguments that ``open_dataset`` does not take, and where each lives.

A port of a DALI pipeline passes the reader's arguments to
:func:`npydask.open_dataset`. File selection, ROI, padding policy, sharding
and ``device`` are the same there; the others belong to the loader, to a
setting, or to nothing (npydask has no pipeline to size or name).
:func:`refuse_dali_arguments` turns them into one ``TypeError`` that says,
for each, what to use instead; any other unknown keyword gets Python's
usual message.

The table is :data:`DALI_ONLY` (the user guide on folders of many files prints the same mapping).

Examples
--------
>>> refuse_dali_arguments({})
>>> refuse_dali_arguments({"dont_use_mmap": True})  # doctest: +ELLIPSIS
Traceback (most recent call last):
TypeError: open_dataset() takes no DALI reader argument dont_use_mmap: ... backend="pread") (plain reads, no mapping)
"""

from __future__ import annotations

from typing import Any

__all__ = ["DALI_ONLY", "refuse_dali_arguments"]

_SHUFFLE = "Loader(ds, batch_size, shuffle=True, seed=...) (or NpyIterableDataset(ds, shuffle=True))"

DALI_ONLY: dict[str, str] = {
    "random_shuffle": f"{_SHUFFLE}: each epoch permutes the whole list, seeded by (seed, epoch)",
    "shuffle_after_epoch": f"{_SHUFFLE}: each epoch permutes the whole list, seeded by (seed, epoch)",
    "initial_fill": f"not needed: {_SHUFFLE} permutes the whole list, not a buffer of initial_fill samples",
    "seed": "Loader(..., seed=...) or NpyIterableDataset(..., seed=...) (None: a fixed default every rank shares)",
    "shuffle_after_epoch_seed": "Loader(..., seed=...) or NpyIterableDataset(..., seed=...)",
    "stick_to_shard": "Loader(ds, batch_size, shard_id=..., num_shards=..., stick_to_shard=...) "
    "(npydask's default is True; False rotates the shard every epoch, DALI's default)",
    "pad_last_batch": "Loader(ds, batch_size, pad_last_batch=True)",
    "prefetch_queue_depth": "Loader(..., prefetch=n) (batches read ahead by threads or cluster tasks)",
    "dont_use_mmap": 'open_dataset(..., backend="pread") (plain reads, no mapping)',
    "use_o_direct": 'open_dataset(..., backend="pread") with npydask.config.set(direct_io=True) '
    "(or NPYDASK_DIRECT_IO=1)",
    "read_ahead": "not needed: Loader(..., prefetch=n) reads whole batches ahead, and the OS reads ahead "
    "within each file",
    "lazy_init": "not needed: open_dataset reads only headers (give index= to reuse them across runs, or "
    "headers='first' to read the first file's only); data is read when computed or batched",
    "cache_header_information": "open_dataset(..., index=path): a persistent header index, re-validated on use",
    "skip_cached_images": "not needed: npydask keeps no decoded-sample cache",
    "bytes_per_sample_hint": "not needed: every batch is allocated at its exact size",
    "tensor_init_bytes": "not needed: every batch is allocated at its exact size",
    "register_buffers": "not needed: GPU reads go through kvikio (device='gpu')",
    "preserve": "not needed: npydask has no pipeline graph to prune",
    "name": "not needed: len(ds) is the epoch size (DALI's epoch_size(name)) and len(loader) the batches",
    "enable_checkpointing": "Loader.state_dict() / Loader.load_state_dict()",
}
"""DALI reader argument -> where npydask has it (or why it needs none)."""


def refuse_dali_arguments(extra: dict[str, Any], function: str = "open_dataset") -> None:
    """Raise one ``TypeError`` for the keywords in ``extra``: DALI's explained, others as Python words it.

    Raises
    ------
    TypeError
        When ``extra`` is not empty.
    """
    if not extra:
        return
    unknown = [k for k in extra if k not in DALI_ONLY]
    if unknown:
        raise TypeError(f"{function}() got an unexpected keyword argument {unknown[0]!r}")
    what = "; ".join(f"{k}={v!r} -> {DALI_ONLY[k]}" for k, v in extra.items())
    names = ", ".join(extra)
    raise TypeError(f"{function}() takes no DALI reader argument {names}: {what}")
