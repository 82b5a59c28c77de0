"""Header parsing rate: npydask's parser against ``ast.literal_eval`` and numpy.

Single-threaded (pure Python; ``--cpu K`` pins the process to core K).
Rows, each timed as one loop over N headers (median of ``--repeat`` loops,
garbage collector off while timing, as :mod:`timeit` does):

* ``ast.literal_eval`` of numpy's canonical header text: the reference
  (what ``numpy.load`` spends on the text itself);
* ``npydask.parse_header`` on N separate byte strings holding one header
  text: the memo path (goal >= 100,000 headers/s);
* the same on N distinct canonical headers (shapes differ and the memo
  ``npydask.format.header.MEMO`` is cleared before each loop, so every one misses):
  the canonical-text regex path;
* the same on N distinct non-canonical spellings (other key order and
  spacing): the AST-walk path;
* ``npydask.read_header`` on real small files (open, fstat, pread, close),
  next to numpy's ``read_magic`` + ``read_array_header_1_0`` on the same
  files, both opening each file, and both on already-open files.

Usage::

    python benchmarks/bench_header.py [--size tiny|small|full] [--repeat N] [--json out.json]
"""

from __future__ import annotations

import ast
import io
import os
import struct
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

import npydask  # noqa: E402
import npydask.format.header as nh  # noqa: E402

# number of in-memory headers per loop, number of real files
SIZES = {
    "tiny": (2_000, 200),
    "small": (20_000, 2_000),
    "full": (100_000, 10_000),
}
MAX_OPEN = 1000  # files held open at once for the "on an open file" rows
GOAL_MEMO = 100_000
REFERENCE_RATE = 39_000  # ast.literal_eval headers/s where GOAL_MEMO was set (a ratio of about 2.6x)


def canonical_bytes(shape: tuple[int, ...], descr: str = "<f4", fortran: bool = False) -> bytes:
    """Preamble and header exactly as ``numpy.save`` writes them."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": fortran, "shape": shape})
    return buf.getvalue()


def wrap_text(text: str) -> bytes:
    """A version 1.0 preamble around ``text``, padded with spaces to 64 bytes and ended by a newline."""
    pad = -(len(text) + 1 + 10) % 64
    body = (text + " " * pad + "\n").encode("latin1")
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(body)) + body


def noncanonical_bytes(shape: tuple[int, ...]) -> bytes:
    dims = " ,".join(str(d) for d in shape)
    return wrap_text("{ 'shape' : ( %s ) ,'fortran_order':False,\t'descr':\"<f4\" }" % dims)


def header_text(buf: bytes) -> str:
    (hlen,) = struct.unpack("<H", buf[8:10])
    return buf[10 : 10 + hlen].decode("latin1")


def distinct_shape(i: int) -> tuple[int, ...]:
    return (i + 1, 256, 256)


def clear_memos() -> None:
    """Empty every header memo in ``npydask.format.header`` (``MEMO`` and any other ``*MEMO*`` dict)."""
    for name, value in vars(nh).items():
        if "MEMO" in name.upper() and isinstance(value, dict):
            value.clear()


def make_files(folder: str, count: int) -> list[str]:
    paths = []
    a = np.zeros((4, 4), "<f4")
    for i in range(count):
        p = os.path.join(folder, f"f{i:06d}.npy")
        np.save(p, a)
        paths.append(p)
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = _common.parser(__doc__.split("\n", 1)[0], default_size="small", default_repeat=5)
    ap.add_argument("--cpu", type=int, default=None, help="pin the process to this core")
    ap.add_argument(
        "--reference-rate",
        type=float,
        default=REFERENCE_RATE,
        help=f"literal_eval headers/s on the machine the goal was set on (default {REFERENCE_RATE:,.0f}); "
        "the goal is also checked scaled by measured/reference",
    )
    ap.add_argument("--dir", default=None, help="where to write the small files (default: a temp folder)")
    args = ap.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    n, n_files = SIZES[args.size]
    repeat = args.repeat
    env = _common.environment()
    _common.print_environment(env)
    print(f"# size={args.size}: {n} headers per loop, {n_files} files; median of {repeat} loops", flush=True)

    results: list[dict] = []

    def record(name: str, count: int, times: list[float], note: str = "") -> dict:
        med = _common.median(times)
        row = {
            "variant": name,
            "count": count,
            "median_s": med,
            "rate_per_s": count / med if med else float("inf"),
            "times_s": times,
            "note": note,
        }
        results.append(row)
        return row

    # -- reference: ast.literal_eval of the canonical text -----------------------------------
    same = canonical_bytes((64, 256, 256))
    text = header_text(same)
    assert ast.literal_eval(text)["shape"] == (64, 256, 256)

    def ref_loop() -> None:
        le = ast.literal_eval
        for _ in range(n):
            le(text)

    times, _ = _common.measure(ref_loop, repeat, no_gc=True)
    record("ast.literal_eval (canonical text)", n, times, "reference")

    # -- parse_header, one shared header text: the memo path -----------------------------------
    same_bufs = [bytes(bytearray(same)) for _ in range(n)]  # separate objects, equal bytes
    clear_memos()
    npydask.parse_header(same_bufs[0])  # prime the memo (as the first file of a data set does)

    def memo_loop() -> None:
        ph = npydask.parse_header
        for b in same_bufs:
            ph(b)

    times, _ = _common.measure(memo_loop, repeat, no_gc=True)
    record("parse_header, one shared text (memo hit)", n, times, f"goal >= {GOAL_MEMO:,}/s")

    # -- parse_header, distinct canonical texts: regex path --------------------------------------
    distinct = [canonical_bytes(distinct_shape(i)) for i in range(n)]
    assert npydask.parse_header(distinct[-1]).shape == distinct_shape(n - 1)

    def distinct_loop() -> None:
        ph = npydask.parse_header
        for b in distinct:
            ph(b)

    times, _ = _common.measure(distinct_loop, repeat, setup=clear_memos, no_gc=True)
    record("parse_header, distinct canonical (memo miss)", n, times, "regex fast path")

    # -- parse_header, distinct non-canonical spellings: AST path --------------------------------
    odd = [noncanonical_bytes(distinct_shape(i)) for i in range(n)]
    h = npydask.parse_header(odd[-1])
    assert h.shape == distinct_shape(n - 1) and h.dtype == np.dtype("<f4") and not h.fortran_order
    assert not nh.is_canonical(header_text(odd[0])), "the non-canonical spelling must miss the regex"

    def odd_loop() -> None:
        ph = npydask.parse_header
        for b in odd:
            ph(b)

    times, _ = _common.measure(odd_loop, repeat, setup=clear_memos, no_gc=True)
    record("parse_header, distinct non-canonical (AST)", n, times, "slow path")

    # numpy's own reader on the canonical text (in memory, for scale)
    def numpy_mem_loop() -> None:
        rm = np.lib.format.read_magic
        rh = np.lib.format.read_array_header_1_0
        for b in distinct:
            f = io.BytesIO(b)
            rm(f)
            rh(f)

    times, _ = _common.measure(numpy_mem_loop, repeat, no_gc=True)
    record("numpy read_magic+read_array_header_1_0 (BytesIO)", n, times, "distinct texts")
    for held_list in (same_bufs, distinct, odd):
        held_list.clear()  # free the buffers (the loops above keep referring to the names)

    # -- real files ----------------------------------------------------------------------------
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="npydask-bench-header-") as folder:
        paths = make_files(folder, n_files)
        _common.warm_page_cache(paths)

        def read_header_loop() -> None:
            rh = npydask.read_header
            for p in paths:
                rh(p)

        times, _ = _common.measure(read_header_loop, repeat, no_gc=True)
        record("npydask.read_header (open+pread+close)", n_files, times, "same shape: memo hit")

        def numpy_file_loop() -> None:
            rm = np.lib.format.read_magic
            rh = np.lib.format.read_array_header_1_0
            for p in paths:
                with open(p, "rb") as f:
                    rm(f)
                    rh(f)

        times, _ = _common.measure(numpy_file_loop, repeat, no_gc=True)
        record("numpy read_magic+read_array_header_1_0 (open+read+close)", n_files, times, "")

        # on already-open files: only the read and the parse
        held = [open(p, "rb") for p in paths[:MAX_OPEN]]
        rounds = max(1, n_files // len(held))
        try:

            def npydask_open_loop() -> None:
                ph = npydask.parse_header
                pr = os.pread
                for _ in range(rounds):
                    for f in held:
                        ph(pr(f.fileno(), 4096, 0))

            times, _ = _common.measure(npydask_open_loop, repeat, no_gc=True)
            record("npydask parse_header(os.pread(fd, 4096, 0)), open file", rounds * len(held), times, "memo hit")

            def numpy_open_loop() -> None:
                rm = np.lib.format.read_magic
                rh = np.lib.format.read_array_header_1_0
                for _ in range(rounds):
                    for f in held:
                        f.seek(0)
                        rm(f)
                        rh(f)

            times, _ = _common.measure(numpy_open_loop, repeat, no_gc=True)
            record("numpy read_magic+read_array_header_1_0, open file", rounds * len(held), times, "")
        finally:
            for f in held:
                f.close()

    # -- table ---------------------------------------------------------------------------------
    ref_rate = results[0]["rate_per_s"]
    rows = []
    for r in results:
        r["ratio_to_literal_eval"] = r["rate_per_s"] / ref_rate
        verdict = ""
        if r["variant"].startswith("parse_header, one shared"):
            scaled = GOAL_MEMO * ref_rate / args.reference_rate
            r["goal"] = GOAL_MEMO
            r["pass"] = r["rate_per_s"] >= GOAL_MEMO
            r["goal_scaled"] = scaled
            r["pass_scaled"] = r["rate_per_s"] >= scaled
            verdict = (
                f"{'PASS' if r['pass'] else 'FAIL'} >= {GOAL_MEMO:,}/s; "
                f"{'PASS' if r['pass_scaled'] else 'FAIL'} >= {scaled:,.0f}/s scaled"
            )
        rows.append(
            [
                r["variant"],
                r["count"],
                f"{r['median_s'] / r['count'] * 1e6:.2f}",
                f"{r['rate_per_s']:,.0f}",
                f"{r['ratio_to_literal_eval']:.2f}x",
                verdict or r["note"],
            ]
        )
    print()
    _common.table(rows, ["variant", "N", "us/header", "headers/s", "vs literal_eval", "goal / note"])
    print(
        f"# scaled goal: {GOAL_MEMO:,}/s was set where literal_eval ran at {args.reference_rate:,.0f}/s "
        f"(= {GOAL_MEMO / args.reference_rate:.2f}x literal_eval); here literal_eval runs at {ref_rate:,.0f}/s"
    )
    _common.write_json(args.json, {"benchmark": "header", "size": args.size, "repeat": repeat, "results": results})
    return 0


if __name__ == "__main__":
    t0 = time.perf_counter()
    rc = main()
    print(f"# total {time.perf_counter() - t0:.1f} s")
    sys.exit(rc)
