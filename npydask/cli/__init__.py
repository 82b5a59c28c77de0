"""The ``npydask`` command line: thin argument parsing over the public API.

``info`` (headers only), ``stats`` (on a cluster), ``convert``, ``demo``,
``bench``, ``cache`` (a node cache's folder, and staging a dataset in
it) and ``plan`` (the requests and bytes reading a dataset would send).
Results go to stdout; progress and messages to stderr. Bad input prints
one line on stderr and exits with status 2, before any cluster starts;
a folder with unreadable files lists them and exits with status 1.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import npydask
from npydask.cli import bench, cache, convert, demo, info, plan, stats
from npydask.cli._common import check_scheduler, cli_words, say
from npydask.cli._errors import UsageError

__all__ = ["build_parser", "main"]

EXAMPLES = """\
examples:
  npydask demo                          a tour on synthetic MRI volumes (embedded cluster)
  npydask info scans/ more/*.npy        shape, dtype, order, version and size of every file
  npydask info archive.npz              the members of an .npz archive
  npydask stats scans/ --per-file       min, max, mean, std and count on threads or a cluster
  npydask convert data.npz data/        every .npz member to a .npy file (also to zarr, F to C order)
  npydask bench --size small            the benchmark suite, ratio tables and a JSON file
  npydask cache info                    what the node cache (NPYDASK_CACHE) holds; also clear, prune, fill
  npydask plan s3://bucket/scans/       the requests and bytes opening and reading it would send
  npydask <command> --quiet             no progress on stderr
  npydask <command> --help              the options of a command
"""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = argparse.ArgumentParser(
        prog="npydask",
        description="NumPy .npy files as lazy Dask arrays.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"npydask {npydask.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (info, stats, convert, demo, bench, cache, plan):
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if getattr(args, "scheduler", None):
            check_scheduler(args.scheduler)  # a malformed address fails here, before any work
        return int(args.func(args))
    except KeyboardInterrupt:
        say(f"npydask {args.command}: interrupted")
        return 130
    except (
        UsageError,
        npydask.NpyFormatError,
        npydask.RoiError,
        OSError,
        ImportError,
        npydask.GpuUnavailableError,
    ) as e:
        say(f"npydask {args.command}: error: {cli_words(str(e))}")
        return 2
    except KeyError as e:
        say(f"npydask {args.command}: error: {cli_words(str(e.args[0] if e.args else e))}")
        return 2
