"""The benchmark scripts run at tiny size, so they never rot (their timings are not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("script", ["bench_header.py", "bench_read.py", "bench_dataset.py", "bench_loader.py"])
def test_benchmark_runs_at_tiny_size(tmp_path, script):
    out_json = tmp_path / "out.json"
    done = subprocess.run(
        [sys.executable, str(BENCH / script), "--size", "tiny", "--repeat", "2", "--json", str(out_json)],
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "goal" in done.stdout
    data = json.loads(out_json.read_text())
    assert data
