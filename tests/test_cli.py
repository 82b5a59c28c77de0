"""The command line, run as a user would run it."""

from __future__ import annotations

import subprocess
import sys

import pytest


def run(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "npydask.cli", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.timeout(180)
def test_demo_end_to_end(tmp_path):
    out = run("demo", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "equal to numpy.load slicing: True" in out.stdout
    assert "matches numpy: True" in out.stdout
    assert "starting an embedded local cluster" in out.stderr
    assert (tmp_path / "volume_c.npy").exists() and (tmp_path / "volume_f.npy").exists()


def test_unreachable_scheduler_is_one_line_and_exit_2(tmp_path):
    out = run("demo", "--out", str(tmp_path), "--scheduler", "tcp://127.0.0.1:9")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach the scheduler" in lines[0]
    assert "Traceback" not in out.stderr


def test_help_and_version():
    out = run("--help")
    assert out.returncode == 0 and "demo" in out.stdout and "examples:" in out.stdout
    out = run("--version")
    assert out.returncode == 0 and out.stdout.startswith("npydask ")
