"""``npydask demo`` as a user runs it, its measured figures, and the helpers that measure them."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
import threading

import numpy as np
import pytest

from npydask.cli import _figures
from npydask.cli._measure import Measured, anon_bytes, bytes_read, measure

MiB = 1 << 20
ON_PROC = bytes_read() is not None and anon_bytes() is not None


def run_demo(*args, env=None, timeout=220):
    return subprocess.run(
        [sys.executable, "-m", "npydask.cli", "demo", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def integer(cell):
    return int(cell.replace(",", ""))


def seconds(cell):
    value, unit = cell.split()
    return float(value.replace(",", "")) * (1e-3 if unit == "ms" else 1)


def figure(stdout, heading):
    """The heading line that starts with ``heading``, its table's rows (cells) and the lines after it."""
    lines = stdout.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith(heading))
    assert re.fullmatch(r"[- ]+", lines[i + 2]), lines[i : i + 3]  # header, rule, rows
    rows, k = [], i + 3
    while k < len(lines) and lines[k] and not lines[k].startswith(("(", "equal", "same", "all")):
        rows.append(re.split(r"\s{2,}", lines[k].strip()))
        k += 1
    tail = []
    while k < len(lines) and lines[k]:
        tail.append(lines[k])
        k += 1
    return lines[i], rows, tail


def check_versus(ours, theirs, words):
    """``"12.5x faster"`` agrees with the two printed times (each rounded to 0.1 ms, the ratio to 3 digits)."""
    ratio, direction = words.split()
    ratio = float(ratio.rstrip("x").replace(",", ""))
    lo_o, hi_o = max(ours - 5e-5, 1e-9), ours + 5e-5
    lo_t, hi_t = max(theirs - 5e-5, 1e-9), theirs + 5e-5
    if direction == "faster":
        lo, hi = lo_t / hi_o, hi_t / lo_o
    else:
        assert direction == "slower", words
        lo, hi = lo_o / hi_t, hi_o / lo_t
    assert lo * 0.995 <= ratio <= hi * 1.005, (ours, theirs, words)
    assert ratio >= 1


def check_figures(out):
    """Every figure is printed, parses, and is consistent with the others and with the files' sizes."""
    # 1. the bytes of one ROI
    head, rows, tail = figure(out, "-- bytes read for a 32x32x32 ROI")
    roi_bytes, file_bytes = (integer(n) for n in re.findall(r"\(([\d,]+) bytes", head))
    assert roi_bytes == 32 * 32 * 32 * 4 and file_bytes == 64 * 256 * 256 * 4 + 128
    (ours_how, ours_read, ours_share), (np_how, np_read, np_share) = rows
    assert ours_how.startswith("npydask.read_region(p,") and np_how.startswith("np.load(p)[")
    assert roi_bytes <= integer(ours_read) < file_bytes / 4  # whole spans at most, never the file
    assert integer(np_read) >= file_bytes
    assert float(ours_share.rstrip("%")) == pytest.approx(100 * integer(ours_read) / file_bytes, rel=5e-3)
    assert tail == ["equal: True"]

    # 2. opening the folder
    head, rows, tail = figure(out, "-- opening the folder of 8 volumes")
    folder_bytes = integer(re.search(r"([\d,]+) bytes\)", head).group(1))
    assert folder_bytes == 8 * file_bytes
    (how, t_ours, read_ours), (how_np, t_np, read_np, versus) = rows
    assert how == "npydask.open_dataset(folder)" and how_np == "[np.load(p) for p in files]"
    assert 0 < integer(read_ours) < folder_bytes / 100  # the headers
    assert integer(read_np) >= folder_bytes
    check_versus(seconds(t_ours), seconds(t_np), versus)
    assert tail == ["same files and shapes: True"]

    # 3. a ROI from every volume, side by side
    head, rows, tail = figure(out, "-- a 32x32x32 ROI from each of the 8 volumes, opening included")
    threads = int(re.search(r"npydask on (\d+) threads", head).group(1))
    (how, t_ours, read_ours), (_, t_np, read_np, vs_np), (how_mm, t_mm, read_mm, vs_mm) = rows
    assert how.startswith("npydask open_dataset(") and "mmap_mode='r'" in how_mm
    # (a strategy that maps strided ROIs would read fewer bytes than the ROIs hold: the row says so)
    assert read_ours == "mapped" or 8 * roi_bytes <= integer(read_ours) < folder_bytes / 4
    assert integer(read_np) >= folder_bytes
    assert read_mm == "mapped"
    check_versus(seconds(t_ours), seconds(t_np), vs_np)
    check_versus(seconds(t_ours), seconds(t_mm), vs_mm)
    assert tail[-1] == "all three equal: True"

    # 4. the memory of a sum over a file larger than the chunk budget
    head, rows, tail = figure(out, "-- memory of a float64 sum over one 128.0 MiB file")
    big = integer(re.search(r"\(([\d,]+) bytes\)", head).group(1))
    assert big == 512 * 256 * 256 * 4 + 128
    assert "in 8 chunks of 16.0 MiB on " in head and f"on {min(threads, 4)} threads" in head
    peaks = {}
    for how, took, peak, share in rows:
        assert seconds(took) > 0
        peaks[how] = float(peak.split()[0].replace(",", "")) * MiB
        # (the peak is printed to 0.1 MiB, the share from the exact bytes to 3 digits)
        assert float(share.rstrip("%")) == pytest.approx(100 * peaks[how] / big, rel=0.005, abs=100 * 0.05 * MiB / big)
    auto, pread, whole = peaks.values()
    assert whole >= 0.95 * big  # np.load holds the whole file
    assert auto < 16 * MiB  # mapped chunks: page cache, not the process's memory
    assert 0 < pread <= threads * 16 * MiB + 16 * MiB  # chunks in flight, not the file
    assert tail[-1] == "all three equal: True"


@pytest.mark.timeout(300)
def test_demo_figures_are_measured_and_consistent_and_it_cleans_up(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = run_demo(env={"TMPDIR": str(tmp)}, timeout=280)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all results match numpy: True" in out.stdout
    root = re.search(r"under (\S+) in ", out.stdout).group(1)
    assert root.startswith(str(tmp)) and not os.path.exists(root)
    assert list(tmp.iterdir()) == []  # nothing left behind: the sample set, the figures' files, the PNG
    assert "np.load loop:" not in out.stdout  # the old timing of tiny volumes is gone
    if ON_PROC:
        check_figures(out.stdout)
        head = next(line for line in out.stdout.splitlines() if line.startswith("-> (64, 128, 128) float32"))
        found = re.search(r"reading ([\d,]+) bytes \(headers\) of ([\d,]+)", head)
        read, payload = (integer(n) for n in found.groups())
        assert payload == 64 * 128 * 128 * 4 and 0 < read < payload / 4
    else:
        assert "n/a" in out.stdout


@pytest.mark.timeout(300)
def test_demo_end_to_end(tmp_path):
    out = run_demo("--out", str(tmp_path), timeout=280)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all results match numpy: True" in out.stdout
    assert "equal to numpy: True" in out.stdout
    assert out.stdout.count(" yes") == 6  # per-volume stats, each checked against numpy
    assert "starting an embedded local cluster" in out.stderr
    assert len(list((tmp_path / "slices").glob("*.npy"))) == 64
    assert len(list((tmp_path / "volumes").glob("*.npy"))) == 6
    # the figures' files stay with --out, and are what the figures say they are
    kept = sorted((tmp_path / "figures" / "volumes").glob("*.npy"))
    assert len(kept) == _figures.VOLUMES and all(np.load(p, mmap_mode="r").shape == (64, 256, 256) for p in kept)
    assert np.load(tmp_path / "figures" / "big.npy", mmap_mode="r").shape == _figures.BIG_SHAPE
    if importlib.util.find_spec("matplotlib") is not None:  # the PNG of a few slices
        assert (tmp_path / "slices.png").read_bytes().startswith(b"\x89PNG")
    else:
        assert "matplotlib is not installed" in out.stderr


# -- the measuring helpers ------------------------------------------------------------------------


@pytest.mark.skipif(not ON_PROC, reason="needs Linux's /proc/self/io and /proc/self/status")
@pytest.mark.parametrize("nbytes", [0, 1, 4096, 3 * MiB + 17])
def test_measure_counts_exactly_the_bytes_read(tmp_path, nbytes):
    p = tmp_path / "f.bin"
    p.write_bytes(os.urandom(nbytes))
    fd = os.open(p, os.O_RDONLY)
    try:
        m = measure(lambda: len(os.pread(fd, nbytes, 0)), runs=3)
    finally:
        os.close(fd)
    assert m.value == nbytes and m.bytes_read == nbytes and m.peak_anon is None and m.seconds >= 0


def _touched(nbytes: int):
    """Fresh anonymous memory, every page written: resident whatever malloc keeps (``close()`` frees it).

    (``np.ones`` may be served from heap memory malloc kept resident: in CI's second run, after other
    tests, a 48 MiB array raised ``RssAnon`` by 4 KiB.)
    """
    import mmap

    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    np.frombuffer(m, np.uint8)[::4096] = 1
    return m


@pytest.mark.skipif(not ON_PROC, reason="needs Linux's /proc/self/status")
@pytest.mark.parametrize("mib", [48, 96])
def test_measure_sees_the_peak_of_memory_freed_before_the_end(mib):
    # (fresh anonymous pages, every one written: _touched, never memory malloc kept from earlier tests)
    def step():
        a = _touched(mib * MiB)
        threading.Event().wait(0.1)  # long enough for many samples, even on a busy machine
        total = int(np.frombuffer(a, np.uint8)[::4096].sum())
        a.close()  # freed before the step returns: only a sampled peak sees it
        return total

    m = measure(step, runs=2, memory=True)
    assert m.value == mib * MiB // 4096
    assert mib * MiB * 0.95 <= m.peak_anon <= mib * MiB + 16 * MiB
    assert m.bytes_read is None  # the sampler's own reads of /proc would count


@pytest.mark.skipif(not ON_PROC, reason="needs Linux's /proc/self/status")
def test_measure_is_not_fooled_by_garbage_collected_during_the_step():
    # A collection during the step (here forced) freeing earlier garbage hid the step's own rise:
    # CI measured a peak of 4 KiB for a 48 MiB step. measure() collects before it starts sampling.
    import gc

    class Cycle:
        pass

    def step():
        gc.collect()  # (what an allocation may trigger at any time)
        a = _touched(48 * MiB)
        threading.Event().wait(0.1)
        a.close()
        return 0

    def garbage():
        c = Cycle()
        c.me, c.big = c, _touched(64 * MiB)  # resident, and only a collection frees it

    garbage()
    m = measure(step, runs=1, warm_up=False, memory=True, before=garbage)
    assert 48 * MiB * 0.95 <= m.peak_anon <= 48 * MiB + 16 * MiB


def test_measure_runs_warm_up_and_before_as_asked():
    calls = []
    m = measure(lambda: calls.append("step") or len(calls), runs=2, before=lambda: calls.append("before"))
    assert calls == ["before", "step"] * 3 and m.value == 6
    calls.clear()
    measure(lambda: calls.append("step"), runs=1, warm_up=False)
    assert calls == ["step"]
    with pytest.raises(ValueError, match="runs must be at least 1, found 0"):
        measure(lambda: None, runs=0)


def test_a_count_below_the_payload_says_mapped():
    def counted(n):
        return _figures._read_cell(Measured(0.1, n, None, None), delivered=1000)

    assert counted(999) == "mapped" and counted(1000) == "1,000" and counted(12345) == "12,345"
    assert counted(None) == "n/a"
    assert _figures._read_cell(Measured(0.1, 5, None, None)) == "5"  # nothing delivered: headers only


def test_versus_says_which_way_as_measured():
    assert _figures.versus(0.01, 0.5) == "50x faster"
    assert _figures.versus(0.5, 0.01) == "50x slower"
    assert _figures.versus(0.0123, 0.0123) == "1x faster"
    assert _figures.versus(0.0001, 0.4873) == "4,873x faster" and _figures.versus(12.0, 0.01) == "1,200x slower"
    assert math.isclose(float(_figures.versus(0.003, 0.007).split("x")[0]), 2.33)


def test_figures_without_proc_print_na_and_still_check_numpy(tmp_path, monkeypatch, capsys):
    # Where /proc lacks the counters (macOS, Windows) the figures print n/a, never a made-up number.
    from npydask.cli import _measure

    monkeypatch.setattr(_measure, "_proc_field", lambda path, name, scale: None)
    monkeypatch.setattr(_figures, "VOLUME_SHAPE", (8, 32, 48))  # small: this checks the output, not sizes
    monkeypatch.setattr(_figures, "BIG_SHAPE", (64, 32, 48))
    monkeypatch.setattr(_figures, "ROI_START", (2, 4, 8))
    monkeypatch.setattr(_figures, "ROI_SHAPE", (4, 8, 8))
    monkeypatch.setattr(_figures, "CHUNK_BUDGET", "48KiB")
    assert _figures.write_and_show(str(tmp_path)) is True
    out = capsys.readouterr().out
    for heading in (
        "-- bytes read for a 4x8x8 ROI",
        "-- opening the folder of 8 volumes",
        "-- a 4x8x8 ROI from each of the 8 volumes",
        "-- memory of a float64 sum",
    ):
        _, rows, _ = figure(out, heading)
        assert rows and all("n/a" in row for row in rows), (heading, rows)
    assert "in 8 chunks of 48.0 KiB" in out
    assert out.count("True") == 4 and "False" not in out
