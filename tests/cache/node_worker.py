"""Forks reader processes of the node cache on request, for ``test_node_processes.py``.

Started once per test module as a plain subprocess (``python tests/cache/node_worker.py``), it
imports the cache once, then reads one job a line (JSON) on stdin, forks a process for it and
prints that process's id. Each forked process is a real process of its own (the tests SIGKILL
them): it opens the node cache named by the job afresh, reads the job's extents of a local file
(the "object") through ``NodeCache.read`` with a ``fetch`` that reads the file, and writes its
results to the job's ``out`` file (published by rename once complete).

A job (every key but the optional ones required)::

    folder, max_bytes, policy       the cache
    object, store, key, etag        the object: a local file read by fetch, and its entry key
    extents                         [[start, stop], ...] to read, in order
    out                             the result file (JSON: reads, errors, warnings)
    log                             fetch log: one line "start|end PID START STOP" per call
    threads=1, shuffle=False        readers in the process, each reading every extent
    sleep=0.0                       seconds each fetch sleeps before returning
    wait_s=30.0                     NodeCache.read's wait_s
    die_on_rename=False             SIGKILL this process at its first rename of a temporary (whose path
                                    it writes to ``out + ".temp"`` first)

The fetch appends to the log with ``O_APPEND`` (one ``write`` a line), so lines of processes and
threads never mix.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import sys
import threading
import time
import traceback
import warnings

from npydask.cache import node
from npydask.cache.keys import EntryKey
from npydask.cache.spec import Cache

_rename = os.rename


def _line(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (text + "\n").encode())
    finally:
        os.close(fd)


def _fetcher(job: dict):
    path, log, sleep = job["object"], job["log"], float(job.get("sleep", 0.0))

    def fetch(lo: int, hi: int) -> tuple[bytes, bool]:
        _line(log, f"start {os.getpid()} {lo} {hi}")
        if sleep:
            time.sleep(sleep)
        fd = os.open(path, os.O_RDONLY)
        try:
            data = os.pread(fd, hi - lo, lo)
        finally:
            os.close(fd)
        _line(log, f"end {os.getpid()} {lo} {hi}")
        return data, True

    return fetch


def _die_on_rename(note: str) -> None:
    """Replace the renames a publish may use by a SIGKILL of this process when a temporary is renamed.

    The temporary's path (resolved against ``src_dir_fd``) is written to ``note`` first.
    """

    def die(src, dst, *args, **kwargs):
        name = os.fsdecode(src)
        if os.path.basename(name).startswith(".") or "tmp" in os.path.basename(name):
            fd = kwargs.get("src_dir_fd")
            if fd is not None and not os.path.isabs(name):
                name = os.path.join(os.readlink(f"/proc/self/fd/{fd}"), name)
            with open(note, "w", encoding="utf-8") as f:
                f.write(name)
            os.kill(os.getpid(), signal.SIGKILL)
        return _rename(src, dst, *args, **kwargs)

    os.rename = die  # type: ignore[assignment]
    os.replace = die  # type: ignore[assignment]


def run(job: dict) -> dict:
    cache = node.node_cache(Cache(job["folder"], max_bytes=job["max_bytes"], policy=job["policy"]))
    assert cache is not None
    if job.get("die_on_rename"):  # (armed once the folder is open: a publish of what the reads fetch)
        _die_on_rename(job["out"] + ".temp")
    key = EntryKey.of(job["store"], job["key"], "", os.path.getsize(job["object"]), job["etag"])
    fetch = _fetcher(job)
    reads: list[list] = []
    errors: list[str] = []
    lock = threading.Lock()

    def reader(t: int) -> None:
        order = [tuple(e) for e in job["extents"]]
        if job.get("shuffle"):
            random.Random(t).shuffle(order)
        for lo, hi in order:
            out = bytearray(hi - lo)
            try:
                got = cache.read(
                    key, lo, hi, memoryview(out), fetch, label=job["key"], wait_s=float(job.get("wait_s", 30.0))
                )
            except BaseException:
                with lock:
                    errors.append(traceback.format_exc())
                return
            with lock:
                reads.append([lo, hi, hashlib.sha256(out).hexdigest(), got.hit_bytes, got.fetched_bytes, got.fetches])

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        threads = [threading.Thread(target=reader, args=(t,)) for t in range(int(job.get("threads", 1)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return {"reads": reads, "errors": errors, "warnings": [f"{w.category.__name__}: {w.message}" for w in caught]}


def main() -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    print(f"ready {node.__file__}", flush=True)
    for text in sys.stdin:
        job = json.loads(text)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                result = run(job)
            except BaseException:
                result = {"reads": [], "errors": [traceback.format_exc()], "warnings": []}
                code = 1
            try:
                part = job["out"] + ".part"
                with open(part, "w", encoding="utf-8") as f:
                    json.dump(result, f)
                _rename(part, job["out"])
            finally:
                os._exit(code)
        print(pid, flush=True)


if __name__ == "__main__":
    main()
