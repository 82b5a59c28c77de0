"""Every example runs at its smallest size, as a user would run it, so none of them rots."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(script: str, *args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.timeout(300)
def test_train_loop(tmp_path):
    done = run("train_loop.py", "--size", "tiny", "--epochs", "3", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "same batches" in done.stdout
    losses = [float(line.split("mean loss ")[1].split()[0]) for line in done.stdout.splitlines() if "mean loss" in line]
    assert len(losses) == 3 and losses[-1] < losses[0]  # it learns
    accuracy = float(done.stdout.split("training accuracy: ")[1].split()[0])
    assert accuracy >= 0.9
    assert len(list(tmp_path.glob("*.npy"))) == 24


@pytest.mark.timeout(300)
def test_mri_roi():
    done = run("mri_roi.py")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "all results match numpy: True" in done.stdout
    assert done.stdout.count("equal to numpy") == 7 and "RoiError" in done.stdout


@pytest.mark.timeout(300)
def test_preprocessing(tmp_path):
    done = run("preprocessing.py", "--size", "tiny", "--out", str(tmp_path), "--num-shards", "3")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "all outputs match numpy: True; stray temporary files: 0" in done.stdout
    assert len(list((tmp_path / "normalised").rglob("*.npy"))) == 6
    assert {p.parent.name for p in (tmp_path / "normalised").rglob("*.npy")} == {"site_0", "site_1"}


@pytest.mark.timeout(300)
def test_gpu_client_submit():
    """A client without CuPy drives the workers by submitting the function that builds and reduces the graph."""
    done = run("gpu_client_submit.py", "--check")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "the means equal numpy's: True" in done.stdout
    if "device='cpu'" in done.stdout:  # (no GPU workers here: the same function on CPU workers)
        assert "this client imported CuPy: False" in done.stdout
    assert done.stdout.count("volume ") == 4


@pytest.mark.timeout(300)
def test_patch_train(tmp_path):
    """Image and label patches train a model, a checkpoint resumes the epoch, and tiles stitch back into volumes."""
    pytest.importorskip("torch", reason="the patch training example trains a PyTorch model")
    done = run("patch_train.py", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "3 left, the same batches as an uninterrupted run: True" in done.stdout
    assert "every patch equal to numpy: True" in done.stdout
    assert "stitched 6 volumes of (32, 48, 48): True; blended input equals the files: True" in done.stdout
    first, last = (float(v) for v in done.stdout.split("loss ")[1].split(" (")[0].split(" -> "))
    assert last < first  # it learns
    assert len(list((tmp_path / "images").glob("*.npy"))) == len(list((tmp_path / "labels").glob("*.npy"))) == 6
