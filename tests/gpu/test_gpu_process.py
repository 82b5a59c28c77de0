"""Counting CUDA devices without initialising CUDA, and refusing a child forked after CUDA was used.

NVML is a stand-in module here and the driver's device files are empty files
in a temporary folder; a real forked process checks the fork record. Whether
a real fork after ``cuInit`` fails (it does, with "initialization error") only
a GPU shows: the device probe ``loader_torch_gpu`` in ``ci/gpu_probes.py``.
"""

from __future__ import annotations

import multiprocessing
import os
import sys

import pytest

from npydask.errors import GpuUnavailableError
from npydask.gpu import process as gpu_process
from npydask.gpu.process import DeviceCount, check_cuda_fork, cuda_visible_count, visible_devices


class FakeNvml:
    """pynvml with ``count`` devices, recording its calls (``error``: nvmlInit raises it)."""

    def __init__(self, count=1, error=None):
        self.count, self.error, self.calls = count, error, []

    def nvmlInit(self):
        self.calls.append("init")
        if self.error:
            raise self.error

    def nvmlDeviceGetCount(self):
        self.calls.append("count")
        return self.count

    def nvmlShutdown(self):
        self.calls.append("shutdown")


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """No NVML, no device files, no CUDA_VISIBLE_DEVICES; returns a function to add either."""
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(gpu_process, "DEV", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def with_(nvml=None, files=()):
        if nvml is not None:
            monkeypatch.setitem(sys.modules, "pynvml", nvml)
        for name in files:
            (tmp_path / name).touch()

    return with_


@pytest.mark.parametrize(
    ("spec", "physical", "count"),
    [
        (None, 3, 3),
        ("", 3, 0),
        ("-1", 3, 0),
        ("-1,0", 3, 0),
        ("NoDevFiles", 3, 0),
        ("2,0", 3, 2),
        ("0,0", 3, 1),
        ("0,7,1", 3, 1),
        ("3", 3, 0),
        (" 1 ", 3, 1),
        ("GPU-5f0c2e1a-aaaa", 1, 1),
        ("MIG-GPU-x/1/2,MIG-y", 1, 1),
        ("mig-1c8a", 2, 1),
        ("0,1", None, 2),
        (None, None, None),
        ("bogus,0", 2, 0),
    ],
)
def test_cuda_visible_devices_as_cuda_reads_it(spec, physical, count):
    assert cuda_visible_count(spec, physical) == count


def test_nvml_counts_and_shuts_down(machine):
    nvml = FakeNvml(2)
    machine(nvml)
    assert visible_devices() == DeviceCount(2, "NVML counts 2 devices")
    assert nvml.calls == ["init", "count", "shutdown"]


def test_nvml_counting_none_is_no_device_even_with_device_files(machine):
    machine(FakeNvml(0), files=["nvidiactl", "nvidia0"])
    found = visible_devices()
    assert not found and found.how == "NVML counts 0 devices"


def test_device_files_count_when_nvml_is_missing_or_fails(machine):
    machine(files=["nvidiactl", "nvidia0", "nvidia1", "nvidia-uvm", "nvidia-modeset"])
    found = visible_devices()
    assert found.count == 2 and "device files" in found.how and "pynvml" in found.how
    machine(FakeNvml(error=OSError("libnvidia-ml.so.1: cannot open shared object file")))
    found = visible_devices()
    assert found.count == 2 and "libnvidia-ml.so.1" in found.how


def test_no_driver_at_all_says_what_was_looked_for(machine):
    machine(files=["nvidia0"])  # (no nvidiactl: not a driver's device files)
    found = visible_devices()
    assert not found and "nvidiactl" in found.how and "pynvml" in found.how


def test_wsl_counts_as_some_device(machine):
    machine(files=["dxg"])
    assert visible_devices().count is None and bool(visible_devices())


@pytest.mark.parametrize("spec", ["", "-1", "NoDevFiles", "4"])
def test_cuda_visible_devices_hiding_every_device(machine, monkeypatch, spec):
    machine(FakeNvml(2))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", spec)
    found = visible_devices()
    assert not found and f"CUDA_VISIBLE_DEVICES={spec!r}" in found.how and "NVML counts 2 devices" in found.how


def _check_in_child() -> str:
    try:
        check_cuda_fork()
    except GpuUnavailableError as e:
        return f"refused: {e}"
    return "allowed"


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork:DeprecationWarning")  # (3.12+)
@pytest.mark.parametrize("parent_used_cuda", [True, False])
def test_a_child_forked_after_cuda_was_used_is_refused_clearly(monkeypatch, parent_used_cuda):
    monkeypatch.setattr(gpu_process, "_CUDA_PID", None)
    if parent_used_cuda:
        gpu_process.note_cuda_use()
        assert gpu_process._CUDA_PID == os.getpid()
    check_cuda_fork()  # the parent itself may go on
    with multiprocessing.get_context("fork").Pool(1) as pool:
        said = pool.apply(_check_in_child)
    if not parent_used_cuda:
        assert said == "allowed"
        return
    assert said.startswith("refused: ") and f"process {os.getpid()}" in said
    assert "num_workers=0" in said and 'multiprocessing_context="spawn"' in said


def test_the_first_process_to_use_cuda_is_the_one_recorded(monkeypatch):
    monkeypatch.setattr(gpu_process, "_CUDA_PID", 1)
    gpu_process.note_cuda_use()
    assert gpu_process._CUDA_PID == 1
    with pytest.raises(GpuUnavailableError, match="process 1,"):
        check_cuda_fork()
