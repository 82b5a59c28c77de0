"""The command line, run as a user would run it: stdout, stderr, exit codes."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest


def run(*args, timeout=180):
    return subprocess.run(
        [sys.executable, "-m", "npydask.cli", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "scans"
    root.mkdir()
    for i in range(5):
        np.save(root / f"s{i}.npy", np.arange(24, dtype="<f4").reshape(2, 3, 4) * (i + 1))
    np.save(root / "big.npy", np.asfortranarray(np.ones((3, 3, 4), ">f8")))
    (root / "sub").mkdir()
    np.save(root / "sub" / "deep.npy", np.zeros((2, 3, 4), "<f4"))
    return root


def one_line(out):
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr
    return lines[0]


@pytest.mark.timeout(240)
def test_demo_end_to_end(tmp_path):
    out = run("demo", "--out", str(tmp_path), timeout=220)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all results match numpy: True" in out.stdout
    assert "equal to numpy: True" in out.stdout
    assert out.stdout.count(" yes") == 6  # per-volume stats, each checked against numpy
    assert "starting an embedded local cluster" in out.stderr
    assert len(list((tmp_path / "slices").glob("*.npy"))) == 64
    assert len(list((tmp_path / "volumes").glob("*.npy"))) == 6
    if importlib.util.find_spec("matplotlib") is not None:  # the PNG of a few slices
        assert (tmp_path / "slices.png").read_bytes().startswith(b"\x89PNG")
    else:
        assert "matplotlib is not installed" in out.stderr


def test_info_table_and_totals(folder):
    out = run("info", str(folder))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["path", "shape", "dtype", "order", "npy", "size"]
    row = next(line for line in lines if line.startswith("big.npy"))
    assert row.split()[:5] == ["big.npy", "3x3x4", "float64", "F", "1.0"]
    assert any(line.startswith("sub/deep.npy") for line in lines)  # DALI: first-level subfolders
    assert "7 files" in lines[-1] and "float32 (6)" in lines[-1]


def test_info_json_goes_to_stdout_alone(folder):
    out = run("info", str(folder), "--json", "--filter", "s*.npy")
    assert out.returncode == 0
    data = json.loads(out.stdout)
    assert [f["path"] for f in data["files"]] == [f"s{i}.npy" for i in range(5)]
    first = data["files"][0]
    assert first == {"path": "s0.npy", "shape": [2, 3, 4], "dtype": "<f4", "fortran_order": False,
                     "version": "1.0", "nbytes": 96}
    assert data["totals"]["files"] == 5 and data["totals"]["nbytes"] == 480


def test_info_summary(folder):
    out = run("info", str(folder), "--summary", "--json")
    data = json.loads(out.stdout)
    assert "files" not in data and data["totals"]["files"] == 7
    out = run("info", str(folder), "--summary")
    assert len(out.stdout.strip().splitlines()) == 1


def test_info_npz_member(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.zeros((4, 5), "<i2"), y=np.ones(3))
    out = run("info", str(tmp_path / "a.npz"), "--key", "x", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["files"][0]["shape"] == [4, 5]
    out = run("info", str(tmp_path / "a.npz"), "--key", "nope")
    assert out.returncode == 2 and "members" in one_line(out)
    out = run("info", str(tmp_path / "a.npz"))
    assert out.returncode == 2 and "--key" in one_line(out)


def test_unreadable_files_in_a_folder_are_listed_and_exit_1(folder):
    (folder / "broken.npy").write_bytes(b"\x93NUMPY garbage")
    (folder / "empty.npy").write_bytes(b"")
    out = run("info", str(folder), "--json")
    assert out.returncode == 1
    data = json.loads(out.stdout)
    assert data["totals"]["files"] == 7 and sorted(e["path"] for e in data["errors"]) == ["broken.npy", "empty.npy"]
    assert "2 of 9 files could not be read" in out.stderr and "broken.npy" in out.stderr


@pytest.mark.parametrize(
    "args, words",
    [
        (["info", "/no/such/place"], "no such file"),
        (["stats", "/no/such/place"], "no such file"),
        (["stats", "{bad}"], "not a valid"),
        (["stats", "{folder}", "--roi-start", "0,0", "--roi-end", "9,9"], "roi"),
        (["stats", "{folder}", "--roi-start", "a,b"], "--roi-start"),
        (["stats", "{folder}", "--scheduler", "tcp://127.0.0.1:9", "--filter", "s*.npy"], "cannot reach the scheduler"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(folder, tmp_path, args, words):
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"not an npy file at all")
    args = [a.format(folder=folder, bad=bad) for a in args]
    out = run(*args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert words.lower() in one_line(out).lower()
    assert "starting an embedded local cluster" not in out.stderr or "scheduler" in words


@pytest.mark.timeout(240)
def test_stats_equal_numpy_per_file_and_in_total(folder):
    out = run("stats", str(folder), "--json", "--per-file", "--workers", "1")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    arrays = [np.load(folder / f"{name}") for name in ("big.npy", *(f"s{i}.npy" for i in range(5)), "sub/deep.npy")]
    flat = np.concatenate([a.astype(np.float64).ravel() for a in arrays])
    assert data["count"] == flat.size
    assert data["min"] == flat.min() and data["max"] == flat.max()
    assert np.isclose(data["mean"], flat.mean(), rtol=1e-12) and np.isclose(data["std"], flat.std(), rtol=1e-12)
    files = {f["path"]: f for f in data["files"]}
    assert np.isclose(files["s2.npy"]["std"], arrays[3].astype(np.float64).std(), rtol=1e-12)


@pytest.mark.timeout(240)
def test_stats_with_a_padded_roi(folder):
    out = run("stats", str(folder), "--filter", "s*.npy", "--roi-start", "1,2", "--roi-end", "3,5",
              "--roi-axes", "1,2", "--oob", "pad", "--fill-value", "-7", "--json", "--workers", "1")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    crops = []
    for i in range(5):
        a = np.load(folder / f"s{i}.npy")
        crop = np.full((2, 2, 3), -7, np.float64)
        crop[:, :, :2] = a[:, 1:3, 2:4]
        crops.append(crop)
    flat = np.concatenate([c.ravel() for c in crops])
    assert data["count"] == flat.size and data["min"] == flat.min()
    assert np.isclose(data["mean"], flat.mean(), rtol=1e-12)


def test_stats_table_on_stdout(folder):
    out = run("stats", str(folder), "--filter", "s0.npy", "--workers", "1")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].split() == ["file", "count", "min", "max", "mean", "std"]
    assert lines[-1].split()[:4] == ["all", "1", "files", "24"]


def test_help_and_version():
    out = run("--help")
    assert out.returncode == 0 and "examples:" in out.stdout
    for command in ("demo", "info", "stats", "convert", "bench"):
        assert command in out.stdout
        sub = run(command, "--help")
        assert sub.returncode == 0 and "examples:" in sub.stdout
    out = run("--version")
    assert out.returncode == 0 and out.stdout.startswith("npydask ")


@pytest.mark.timeout(300)
def test_bench_runs_the_scripts_and_merges_their_json(tmp_path):
    out_json = tmp_path / "bench.json"
    out = run("bench", "--size", "tiny", "--only", "header", "--repeat", "1", "--json", str(out_json), timeout=280)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "## bench_header.py" in out.stdout and "goal" in out.stdout  # the script's tables on stdout
    assert "== bench_header.py" in out.stderr and f"wrote {out_json}" in out.stderr  # progress on stderr
    data = json.loads(out_json.read_text())
    assert data["size"] == "tiny" and data["scripts"]["bench_header.py"]["exit_status"] == 0
    assert data["scripts"]["bench_header.py"]["results"]


def test_bench_refuses_bad_options():
    out = run("bench", "--only", "nothing-matches")
    assert out.returncode == 2 and "matches none" in one_line(out)


@pytest.mark.timeout(240)
def test_convert_npz_to_a_folder_of_npy(tmp_path):
    arrays = {"x": np.arange(12.0).reshape(3, 4), "y": np.ones((2, 2), ">i4")}
    np.savez_compressed(tmp_path / "a.npz", **arrays)
    out = run("convert", str(tmp_path / "a.npz"), str(tmp_path / "out"), "--workers", "1")
    assert out.returncode == 0, out.stderr
    for name, a in arrays.items():
        back = np.load(tmp_path / "out" / f"{name}.npy")
        np.testing.assert_array_equal(back, a)
    again = run("convert", str(tmp_path / "a.npz"), str(tmp_path / "out"))
    assert again.returncode == 2 and "--overwrite" in one_line(again)


@pytest.mark.timeout(240)
def test_convert_fortran_to_c_and_a_folder(tmp_path, folder):
    src = tmp_path / "f.npy"
    a = np.asfortranarray(np.arange(24, dtype="<f8").reshape(4, 6))
    np.save(src, a)
    out = run("convert", str(src), str(tmp_path / "c.npy"), "--workers", "1")
    assert out.returncode == 0, out.stderr
    back = np.load(tmp_path / "c.npy")
    np.testing.assert_array_equal(back, a)
    assert back.flags.c_contiguous and not np.load(src).flags.c_contiguous
    out = run("convert", str(folder), str(tmp_path / "copy"), "--workers", "1")
    assert out.returncode == 0, out.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "copy" / "sub" / "deep.npy"), np.load(folder / "sub" / "deep.npy"))
    big = np.load(tmp_path / "copy" / "big.npy")
    assert big.flags.c_contiguous and np.array_equal(big, np.load(folder / "big.npy"))


@pytest.mark.timeout(240)
def test_convert_to_zarr(tmp_path, folder):
    zarr = pytest.importorskip("zarr")
    out = run("convert", str(folder / "big.npy"), str(tmp_path / "big.zarr"), "--workers", "1")
    assert out.returncode == 0, out.stderr
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "big.zarr"))[...], np.load(folder / "big.npy"))
    out = run("convert", str(folder), str(tmp_path / "all.zarr"), "--workers", "1")
    assert out.returncode == 0, out.stderr
    group = zarr.open_group(str(tmp_path / "all.zarr"))
    np.testing.assert_array_equal(group["s3"][...], np.load(folder / "s3.npy"))
    np.testing.assert_array_equal(group["sub/deep"][...], np.load(folder / "sub" / "deep.npy"))


def test_convert_bad_input(tmp_path):
    out = run("convert", str(tmp_path / "missing.npz"), str(tmp_path / "out"))
    assert out.returncode == 2 and "no such file" in one_line(out)
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    out = run("convert", str(tmp_path / "bad.npz"), str(tmp_path / "out"))
    assert out.returncode == 2 and ".npz" in one_line(out)


def test_info_verify_checks_every_npz_member(tmp_path):
    """``info --verify``: exit 0 on intact archives, 1 with the bad member named (issue 12, item 4)."""
    a, b = np.arange(4000, dtype="<f8"), np.ones((30, 7), "<i2")
    np.savez(tmp_path / "stored.npz", a=a, b=b)
    np.savez_compressed(tmp_path / "deflated.npz", a=a, b=b)
    for name in ("stored.npz", "deflated.npz"):
        out = run("info", str(tmp_path / name), "--verify")
        assert out.returncode == 0, out.stderr
        assert "2 members, CRC-32 ok" in out.stdout
    blob = bytearray((tmp_path / "stored.npz").read_bytes())
    blob[blob.index(a[1000:1001].tobytes())] ^= 0x10  # one payload byte of member a
    (tmp_path / "stored.npz").write_bytes(bytes(blob))
    out = run("info", str(tmp_path / "stored.npz"), "--verify")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "'a.npy'" in out.stderr and "CRC-32" in out.stderr and "stored.npz" in out.stderr
    out = run("info", str(tmp_path), "--verify")  # a folder: each archive in it
    assert out.returncode == 1 and "deflated.npz: 2 members, CRC-32 ok" in out.stdout
    assert "1 of 2 archives failed" in out.stderr
    out = run("info", str(tmp_path / "missing.npz"), "--verify")
    assert out.returncode == 2 and "no such file" in one_line(out)
