"""The node cache's benchmark scripts stay runnable (at their tiny size)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"


def _run(script: str, tmp_path: Path) -> tuple[str, dict]:
    out = tmp_path / "out.json"
    done = subprocess.run(
        [sys.executable, str(BENCH / script), "--size", "tiny", "--folder", str(tmp_path), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=200,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout, json.loads(out.read_text())


@pytest.mark.timeout(240)
def test_bench_cache_layout_runs_at_tiny_size(tmp_path):
    stdout, got = _run("bench_cache_layout.py", tmp_path)
    assert "verdict: layout" in stdout and got["verdict"] in ("A", "B")
    kills = [r for r in got["results"] if r["case"] == "SIGKILL"]
    assert len(kills) == 2 and all(r["torn"] == 0 for r in kills)


@pytest.mark.timeout(240)
def test_bench_cache_policy_runs_at_tiny_size(tmp_path):
    stdout, got = _run("bench_cache_policy.py", tmp_path)
    assert "goal: pin" in stdout and got["shard_fetches"] == 0
    assert got["pin"][1]["share"] > 0
