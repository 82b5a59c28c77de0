"""``npydask plan URL``: what opening a dataset and reading it for some epochs would send to the store, before reading.

The dataset is opened as ``npydask stats`` opens it (the same selection,
opening and ROI flags: its headers are read); then a
:class:`~npydask.TrafficPlan` is made and printed (a table, or ``--json``).
With ``--sampler`` or ``--batch-size`` the reads are a
:class:`~npydask.Loader`'s (``loader.traffic_plan()``, for one rank of
``--num-shards``); without, computing the stack once per epoch
(``ds.traffic_plan()``). Nothing else is read, but a ``Foreground``
sampler's label index (``--label-index``), which must exist.
"""

from __future__ import annotations

import argparse
from typing import Any

from npydask.cli._common import (
    add_roi_options,
    add_selection_options,
    emit_json,
    parse_list,
    roi_kwargs,
)
from npydask.cli._errors import UsageError
from npydask.cli._open import add_open_options
from npydask.cli._remote import storage_options
from npydask.cli._select import root_of

__all__ = ["add_parser", "run"]

HELP = """\
examples:
  npydask plan s3://bucket/scans/                                  open, then compute the stack once
  npydask plan s3://bucket/scans/ --roi-start 0,32,32 --roi-shape 64,128,128 --epochs 3 --json
  npydask plan s3://bucket/scans/ --sampler uniform --patch-shape 64,64,64 --per-file 4 --batch-size 8 \\
      --epochs 10 --shuffle --num-shards 8 --cache-bytes 200GiB --price-get 0.0004 --price-gb 0.09
  npydask plan s3://bucket/img/ --labels s3://bucket/seg/ --label-index fg.npz --sampler foreground \\
      --patch-shape 96,96,96 --batch-size 2
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="requests and bytes that opening a dataset and each epoch would send (and what they cost)",
        epilog=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_selection_options(p)
    add_open_options(p)
    p.add_argument("--json", action="store_true", help="print JSON on stdout instead of a table")
    add_roi_options(p)
    g = p.add_argument_group("the reads (a Loader's with --sampler or --batch-size; else the stack, once an epoch)")
    g.add_argument("--sampler", choices=("uniform", "grid", "foreground"), help="read patches (npydask.samplers)")
    g.add_argument("--patch-shape", metavar="INTS", help="the patch's trailing axes, e.g. 64,64,64")
    g.add_argument("--per-file", type=int, default=1, metavar="N", help="patches per file an epoch (default 1)")
    g.add_argument("--batch-size", type=int, metavar="N", help="samples per batch (default 1)")
    g.add_argument("--epochs", type=int, default=1, metavar="N", help="epochs to plan (default 1)")
    g.add_argument("--seed", type=int, metavar="N", help="the loader's seed (default: npydask's fixed default)")
    g.add_argument("--shuffle", action="store_true", help="shuffle every epoch (seeded)")
    g.add_argument("--num-shards", type=int, default=1, metavar="N", help="ranks of the job: plans one rank's")
    g.add_argument("--shard-id", type=int, default=0, metavar="K", help="the rank planned (default 0)")
    g.add_argument("--prefetch", type=int, default=2, metavar="K", help="the loader's prefetch (default 2)")
    g.add_argument("--labels", metavar="PATH", help="--sampler foreground: the label files, paired by position")
    g.add_argument("--label-index", metavar="PATH", help="--sampler foreground: the label index (Foreground index=)")
    g.add_argument("--cache-bytes", metavar="BYTES", help="model a node cache of this size (pin), e.g. 200GiB")
    prices = p.add_argument_group("prices (none built in; in any one currency)")
    prices.add_argument("--price-get", type=float, metavar="P", help="per 1,000 GET requests")
    prices.add_argument("--price-list", type=float, metavar="P", help="per 1,000 LIST requests")
    prices.add_argument("--price-gb", type=float, metavar="P", help="per 10^9 bytes transferred")
    p.set_defaults(func=run)


def _open(path: str, args: argparse.Namespace, options: dict[str, Any] | None) -> Any:
    import npydask

    root = root_of(path, args.filter, options)
    kwargs = dict(key=args.key, headers=args.headers, index=args.index, storage_options=options, sort=args.sort)
    kwargs.update(roi_kwargs(args))
    if root is None:
        return npydask.open_dataset(files=[path], **kwargs)
    return npydask.open_dataset(root, file_filter=args.filter, recursive=args.recursive, **kwargs)


def _sampler(args: argparse.Namespace) -> Any:
    from npydask import samplers

    shape = parse_list(args.patch_shape, int, "--patch-shape")
    if not shape:
        raise UsageError(f"--sampler {args.sampler} needs --patch-shape INTS (the patch's trailing axes, e.g. 64,64)")
    if args.sampler == "uniform":
        return samplers.Uniform(shape, per_file=args.per_file)
    if args.sampler == "grid":
        return samplers.Grid(shape)
    if args.labels is None:
        raise UsageError("--sampler foreground needs --labels PATH (the label files) and --label-index PATH")
    return samplers.Foreground(shape, per_file=args.per_file, index=args.label_index)


def run(args: argparse.Namespace) -> int:
    import npydask

    options = storage_options(args)
    prices = {
        k: v for k, v in (("get", args.price_get), ("list", args.price_list), ("gb", args.price_gb)) if v is not None
    }
    try:
        ds = _open(args.path, args, options)
        if args.sampler is None and args.batch_size is None:
            plan = ds.traffic_plan(args.epochs, cache_bytes=args.cache_bytes, prices=prices or None)
        else:
            sampler = None if args.sampler is None else _sampler(args)
            data = ds
            if args.sampler == "foreground":
                data = npydask.zip_datasets({"image": ds, "label": _open(args.labels, args, options)})
            loader = npydask.Loader(
                data,
                args.batch_size or 1,
                sampler=sampler,
                shuffle=args.shuffle,
                seed=args.seed,
                shard_id=args.shard_id,
                num_shards=args.num_shards,
                prefetch=args.prefetch,
            )
            plan = loader.traffic_plan(args.epochs, cache_bytes=args.cache_bytes, prices=prices or None)
    except (ValueError, TypeError) as e:  # (NpyFormatError and RoiError are ValueErrors)
        raise UsageError(str(e)) from None
    if args.json:
        emit_json(plan.to_dict())
    else:
        print(plan)
    return 0
