"""``npydask bench``: the benchmark suite of ``benchmarks/``, with one JSON file of every result.

Each script prints its own table of medians and ratios against the peers it
finds installed (numpy, dask's recipes, PyTorch's DataLoader, DALI, Ray) and
its goal verdicts; this command runs them one after another in fresh
processes (so their memory and caches do not mix), passes their tables
through to stdout, and merges their JSON results. The scripts live in the
source tree (``benchmarks/`` next to the ``npydask`` package): run it from
a checkout (``pip install -e .``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import npydask
from npydask.cli._common import add_quiet_option, duration, say
from npydask.cli._errors import UsageError

__all__ = ["SCRIPTS", "add_parser", "run"]

SCRIPTS = (
    "bench_header.py",
    "bench_read.py",
    "bench_dataset.py",
    "bench_loader.py",
    "bench_write.py",
    "bench_cluster.py",
    "bench_memory.py",
    "bench_convert.py",
    "bench_remote.py",
    "bench_ray.py",
    "bench_scale.py",
    "bench_patches.py",
)
SIZES = ("tiny", "small", "full")  # the scripts' own --size choices (benchmarks/_common.py)
HELP = """\
examples:
  npydask bench                         every benchmark at the small size (a few minutes on 2 cores)
  npydask bench --size full --json results.json
  npydask bench --only dataset,loader   the scripts whose names contain these words
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "bench",
        help="run the benchmark suite and print ratio tables against the installed peers",
        epilog=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--size",
        choices=SIZES,
        default="small",
        help="passed to every script: small (default), full (the 1 GiB sets of the issues' goals) "
        "or tiny (a smoke test)",
    )
    p.add_argument("--repeat", type=int, help="timed runs per variant (default: each script's own)")
    p.add_argument("--only", help="comma-separated words: run only the scripts whose names contain one")
    p.add_argument(
        "--json",
        metavar="OUT",
        default=None,
        help="write every result to this JSON file (default npydask-bench-SIZE.json)",
    )
    p.add_argument("--data", metavar="DIR", help="keep and reuse the generated data sets in DIR")
    add_quiet_option(p)
    p.set_defaults(func=run)


def benchmarks_folder() -> Path:
    """The ``benchmarks/`` folder of the source tree this npydask was installed from."""
    folder = Path(npydask.__file__).resolve().parent.parent / "benchmarks"
    if not (folder / "_common.py").is_file():
        raise UsageError(
            f"npydask bench runs the scripts in the benchmarks/ folder of npydask's source repository, which an "
            f"installed package does not include (looked for {folder}): in a checkout of the repository, run "
            "`pip install -e .` then `npydask bench`, or one script alone, e.g. "
            "`python benchmarks/bench_read.py --size small` (the performance page of the docs lists them all)"
        )
    return folder


def run(args: argparse.Namespace) -> int:
    folder = benchmarks_folder()
    scripts = [s for s in SCRIPTS if (folder / s).is_file()]
    if args.only:
        words = [w.strip() for w in args.only.split(",") if w.strip()]
        scripts = [s for s in scripts if any(w in s for w in words)]
        if not scripts:
            raise UsageError(f"--only {args.only!r} matches none of {', '.join(SCRIPTS)}")
    if args.repeat is not None and args.repeat < 1:
        raise UsageError(f"--repeat must be at least 1, found {args.repeat}")
    out_json = args.json or f"npydask-bench-{args.size}.json"
    merged: dict[str, Any] = {"size": args.size, "npydask": npydask.__version__, "scripts": {}}
    status = 0
    with tempfile.TemporaryDirectory(prefix="npydask-bench-") as tmp:
        for script in scripts:
            command = [sys.executable, str(folder / script), "--size", args.size]
            if args.repeat is not None:
                command += ["--repeat", str(args.repeat)]
            if args.data and script in (
                "bench_dataset.py",
                "bench_loader.py",
                "bench_read.py",
                "bench_remote.py",
                "bench_ray.py",
                "bench_scale.py",
                "bench_patches.py",
            ):
                command += ["--data", args.data]
            part = os.path.join(tmp, script + ".json")
            command += ["--json", part]
            if not args.quiet:
                say(f"== {script} --size {args.size} ...")
            t0 = time.perf_counter()
            done = subprocess.run(command, stdout=subprocess.PIPE, text=True)
            took = time.perf_counter() - t0
            print(f"\n## {script} (size {args.size}, {duration(took)})\n")
            print(done.stdout.rstrip(), flush=True)
            entry: dict[str, Any] = {"exit_status": done.returncode, "seconds": took}
            if os.path.exists(part):
                with open(part, encoding="utf8") as f:
                    entry["results"] = json.load(f)
            merged["scripts"][script] = entry
            if done.returncode != 0:
                say(f"{script} exited with status {done.returncode}: its results disagree with numpy or it failed")
                status = 1
    with open(out_json, "w", encoding="utf8") as f:
        json.dump(merged, f, indent=2, default=str)
        f.write("\n")
    if not args.quiet:
        say(f"wrote {out_json}")
    return status
