"""``npydask cache``: a node cache's folder (``info``, ``clear``, ``prune``) and staging a dataset in it (``fill``).

``info``, ``clear`` and ``prune`` take the folder as an argument, or the
``cache`` setting (``NPYDASK_CACHE``) where none is given; a relative folder
is taken from the current directory. A folder that does not exist is an
error (a mistyped path is not made into an empty cache).

``fill URL`` opens the dataset as ``npydask.open_dataset`` does (the same
selection, ROI and shard flags as ``npydask stats``) and reads every file's
output once through the node cache (``ds.warm_cache()``), so that training on
this node later reads it from local disk. ``--cache FOLDER`` names the folder,
else the ``cache`` setting does; its size and policy, when the folder is new,
are the ``cache_max_bytes`` and ``cache_policy`` settings
(``NPYDASK_CACHE_MAX_BYTES``, ``NPYDASK_CACHE_POLICY``).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from npydask import config
from npydask.cli._common import (
    add_quiet_option,
    add_roi_options,
    add_selection_options,
    add_shard_options,
    emit_json,
    number,
    roi_kwargs,
    say,
    size,
    table,
)
from npydask.cli._errors import UsageError
from npydask.cli._open import add_open_options
from npydask.cli._remote import storage_options, url_or_none
from npydask.cli._select import root_of

__all__ = ["add_parser", "info_payload", "run_clear", "run_fill", "run_info", "run_prune"]

HELP = """\
examples:
  npydask cache info                                     the folder NPYDASK_CACHE names
  npydask cache info /local_nvme/npydask-cache --json
  npydask cache prune --older-than 7                     entries unread for a week
  npydask cache clear /local_nvme/npydask-cache
  npydask cache fill s3://bucket/scans/ --cache /local_nvme/npydask-cache
  npydask cache fill s3://bucket/scans/ --shard-id 3 --num-shards 8     this node's shard of 8
"""

FOLDER_HELP = "the cache folder (default: the cache setting, NPYDASK_CACHE)"


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "cache",
        help="the node cache: info, clear, prune, and fill (stage a dataset or a shard on this node)",
        description="The node cache: a folder on this node's local disk holding bytes read from objects.",
        epilog=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    info = actions.add_parser("info", help="entries, bytes held against max_bytes, policy, hits, bytes per prefix")
    info.add_argument("folder", nargs="?", metavar="FOLDER", help=FOLDER_HELP)
    info.add_argument("--json", action="store_true", help="print JSON on stdout instead of a table")
    info.set_defaults(func=run_info)

    clear = actions.add_parser("clear", help="remove every entry (and the folder's recorded max_bytes and policy)")
    clear.add_argument("folder", nargs="?", metavar="FOLDER", help=FOLDER_HELP)
    add_quiet_option(clear)
    clear.set_defaults(func=run_clear)

    prune = actions.add_parser("prune", help="remove the entries unread for some days")
    prune.add_argument("--older-than", type=float, required=True, metavar="DAYS", help="days unread (e.g. 7 or 0.5)")
    prune.add_argument("folder", nargs="?", metavar="FOLDER", help=FOLDER_HELP)
    add_quiet_option(prune)
    prune.set_defaults(func=run_prune)

    fill = actions.add_parser(
        "fill",
        help="read a dataset (or a shard of it) once through the node cache, to stage it before training",
        epilog="The folder's size and policy, when it is new, are the cache_max_bytes and cache_policy settings "
        "(NPYDASK_CACHE_MAX_BYTES, NPYDASK_CACHE_POLICY).",
    )
    add_selection_options(fill)
    add_open_options(fill)
    add_roi_options(fill)
    add_shard_options(fill)
    fill.add_argument("--cache", metavar="FOLDER", help=FOLDER_HELP)
    fill.set_defaults(func=run_fill)


def folder_of(given: str | None, *, flag: str = "FOLDER", exists: bool = True) -> str:
    """The cache folder a command names: ``given`` made absolute, else the ``cache`` setting.

    Raises
    ------
    UsageError
        No folder given while the setting is empty, a bad ``NPYDASK_CACHE``, or
        (with ``exists``) no folder there.
    """
    if given is None:
        try:
            found: str = config.get("cache")
        except ValueError as e:
            raise UsageError(str(e)) from None
        if not found:
            raise UsageError(
                f"no cache folder: give {flag} or set NPYDASK_CACHE to the cache's absolute folder on this node's "
                "local disk (e.g. /local_nvme/npydask-cache)"
            )
        given = found
    folder = os.path.abspath(os.path.expanduser(given))
    if exists and not os.path.lexists(folder):
        raise UsageError(f"{folder}: no such folder (no cache has been made there)")
    return folder


def _cache(folder: str) -> Any:
    import npydask

    try:
        return npydask.Cache(folder)
    except (ValueError, TypeError) as e:
        raise UsageError(str(e)) from None


# -- info ---------------------------------------------------------------------------------------


def info_payload(info: Any) -> dict[str, Any]:
    """A :class:`~npydask.cache.admin.CacheInfo` as ``npydask cache info --json`` prints it."""
    prefixes = sorted(info.by_prefix.items(), key=lambda kv: (-kv[1][1], kv[0]))
    return {
        "folder": info.folder,
        "policy": info.policy,
        "entries": info.entries,
        "extents": info.extents,
        "bytes": info.bytes,
        "max_bytes": info.max_bytes,
        "hits": info.hits,
        "misses": info.misses,
        "hit_bytes": info.hit_bytes,
        "by_prefix": [{"prefix": p, "entries": n, "bytes": b} for p, (n, b) in prefixes],
    }


def run_info(args: argparse.Namespace) -> int:
    folder = folder_of(args.folder)
    try:
        payload = info_payload(_cache(folder).info())
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.json:
        emit_json(payload)
        return 0
    held, limit = payload["bytes"], payload["max_bytes"]
    bound = f" of {size(limit)} ({100 * held / limit:.1f}%)" if limit else " (no max_bytes recorded yet)"
    reads = payload["hits"] + payload["misses"]
    hit_share = f", {100 * payload['hits'] / reads:.1f}% of reads" if reads else ""
    rows = [
        ("folder", payload["folder"]),
        ("policy", payload["policy"] or "(none recorded yet)"),
        ("entries", number(payload["entries"])),
        ("extents", number(payload["extents"])),
        ("held", f"{size(held)}{bound}"),
        ("hits", f"{number(payload['hits'])} ({size(payload['hit_bytes'])}{hit_share})"),
        ("misses", number(payload["misses"])),
    ]
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k.ljust(width)}  {v}" for k, v in rows))
    if payload["by_prefix"]:
        print()
        cells = [(p["prefix"], number(p["entries"]), size(p["bytes"])) for p in payload["by_prefix"]]
        print(table(cells, ["prefix", "entries", "bytes"], right=(1, 2)))
    return 0


# -- clear and prune ----------------------------------------------------------------------------


def run_clear(args: argparse.Namespace) -> int:
    folder = folder_of(args.folder)
    try:
        removed = _cache(folder).clear()
    except ValueError as e:
        raise UsageError(str(e)) from None
    print(f"removed {size(removed)} from {folder}")
    return 0


def run_prune(args: argparse.Namespace) -> int:
    days = args.older_than
    if not days >= 0 or days == float("inf"):  # (NaN too)
        raise UsageError(f"--older-than takes a number of days of 0 or more, found {days!r}")
    folder = folder_of(args.folder)
    try:
        entries, removed = _cache(folder).prune(days)
    except ValueError as e:
        raise UsageError(str(e)) from None
    print(f"removed {number(entries)} entries ({size(removed)}) unread for {number(days)} days from {folder}")
    return 0


# -- fill ---------------------------------------------------------------------------------------


def run_fill(args: argparse.Namespace) -> int:
    import npydask

    path = args.path
    if url_or_none(path) is None:
        raise UsageError(
            f"{path}: a local path; the node cache holds bytes of objects only (local files have the page cache): "
            "give an object URL (s3://bucket/prefix/)"
        )
    folder = folder_of(args.cache, flag="--cache FOLDER", exists=False)
    _cache(folder)  # (a folder refused by its name fails here, before any request)
    options = storage_options(args)
    root = root_of(path, args.filter, options)
    kwargs = dict(
        key=args.key,
        headers=args.headers,
        index=args.index,
        storage_options=options,
        sort=args.sort,
        shard_id=args.shard_id,
        num_shards=args.num_shards,
        **roi_kwargs(args),
    )
    try:
        setting = config.set(cache=folder)  # (the reads below run in this process: the setting reaches them)
    except ValueError as e:
        raise UsageError(str(e)) from None
    with setting:
        try:
            if root is None:
                ds = npydask.open_dataset(files=[path], **kwargs)
            else:
                ds = npydask.open_dataset(root, file_filter=args.filter, recursive=args.recursive, **kwargs)
            summary = ds.warm_cache(progress=not args.quiet)
        except (ValueError, TypeError) as e:  # (NpyFormatError and RoiError are ValueErrors)
            raise UsageError(str(e)) from None
        held = npydask.Cache(summary.folder).info()
    print(summary)
    print(f"the cache holds {size(held.bytes)} of {size(held.max_bytes or 0)} (policy {held.policy})")
    if held.max_bytes is not None and summary.bytes > held.max_bytes:
        say(
            f"npydask cache fill: the dataset's {size(summary.bytes)} exceed the cache's max_bytes, "
            f"{size(held.max_bytes)}: not all of it is kept; stage a shard per node (--shard-id K --num-shards N) "
            "or give the cache more room (npydask cache clear, then NPYDASK_CACHE_MAX_BYTES)"
        )
    return 0
