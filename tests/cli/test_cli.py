"""The command line, run as a user would run it: stdout, stderr, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest


def run(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "npydask.cli", *args], capture_output=True, text=True, timeout=timeout)


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


def test_info_table_and_totals(folder):
    out = run("info", str(folder))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["path", "shape", "dtype", "order", "npy", "size"]
    row = next(line for line in lines if line.startswith("big.npy"))
    assert row.split()[:5] == ["big.npy", "3x3x4", "float64", "F", "1.0"]
    assert any(line.startswith("sub/deep.npy") for line in lines)  # DALI: first-level subfolders
    assert "7 files" in lines[-1] and "float32 (6)" in lines[-1]


def test_info_and_stats_sort_natural(tmp_path):
    for i in (1, 2, 10, 11):
        np.save(tmp_path / f"s{i}.npy", np.full((2,), i, "<f4"))
    natural = ["s1.npy", "s2.npy", "s10.npy", "s11.npy"]
    out = run("info", str(tmp_path), "--json", "--sort", "natural")
    assert out.returncode == 0, out.stderr
    assert [f["path"] for f in json.loads(out.stdout)["files"]] == natural
    out = run("info", str(tmp_path), "--json")
    assert [f["path"] for f in json.loads(out.stdout)["files"]] == ["s1.npy", "s10.npy", "s11.npy", "s2.npy"]
    out = run("stats", str(tmp_path), "--per-file", "--json", "--sort", "natural")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["files"]
    assert [r["path"] for r in rows] == natural and [r["mean"] for r in rows] == [1, 2, 10, 11]
    out = run("info", str(tmp_path), "--sort", "numeric")
    assert out.returncode == 2 and "invalid choice: 'numeric'" in out.stderr and "'natural'" in out.stderr


def test_info_json_goes_to_stdout_alone(folder):
    out = run("info", str(folder), "--json", "--filter", "s*.npy")
    assert out.returncode == 0
    data = json.loads(out.stdout)
    assert [f["path"] for f in data["files"]] == [f"s{i}.npy" for i in range(5)]
    first = data["files"][0]
    assert first == {
        "path": "s0.npy",
        "shape": [2, 3, 4],
        "dtype": "<f4",
        "fortran_order": False,
        "version": "1.0",
        "nbytes": 96,
    }
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


def test_info_npz_lists_every_member(tmp_path):
    arrays = {"x": np.zeros((4, 5), "<i2"), "y": np.ones(3, ">f8"), "z": np.asfortranarray(np.ones((2, 3), "u1"))}
    np.savez(tmp_path / "a.npz", **arrays)
    np.savez_compressed(tmp_path / "c.npz", **arrays)
    for name in ("a.npz", "c.npz"):
        out = run("info", str(tmp_path / name), "--json")
        assert out.returncode == 0, out.stderr
        files = json.loads(out.stdout)["files"]
        assert [f["key"] for f in files] == list(arrays)
        for f in files:
            a = arrays[f["key"]]
            assert (f["shape"], f["dtype"], f["fortran_order"], f["nbytes"]) == (
                list(a.shape),
                a.dtype.str,
                bool(np.isfortran(a)),
                a.nbytes,
            )
    out = run("info", str(tmp_path / "a.npz"))
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines()[2:-1]}
    assert rows[f"{tmp_path / 'a.npz'}:x"][1:3] == ["4x5", "int16"]
    assert rows[f"{tmp_path / 'a.npz'}:z"][1:4] == ["2x3", "uint8", "F"]
    # a folder of archives, read without --key: each archive's members
    out = run("info", str(tmp_path), "--filter", "*.npz", "--json")
    assert out.returncode == 0, out.stderr
    assert [(f["path"], f["key"]) for f in json.loads(out.stdout)["files"]] == [
        (n, k) for n in ("a.npz", "c.npz") for k in arrays
    ]


def test_unreadable_files_in_a_folder_are_listed_and_exit_1(folder):
    (folder / "broken.npy").write_bytes(b"\x93NUMPY garbage")
    (folder / "empty.npy").write_bytes(b"")
    out = run("info", str(folder), "--json")
    assert out.returncode == 1
    data = json.loads(out.stdout)
    assert data["totals"]["files"] == 7 and sorted(e["path"] for e in data["errors"]) == ["broken.npy", "empty.npy"]
    assert "2 of 9 files could not be read" in out.stderr and "broken.npy" in out.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["info", "/no/such/place"], "no such file"),
        (["stats", "/no/such/place"], "no such file"),
        (["stats", "{bad}"], "not a valid"),
        (["stats", "{folder}", "--roi-start", "0,0", "--roi-end", "9,9"], "roi"),
        (["stats", "{folder}", "--roi-start", "a,b"], "--roi-start"),
        (["stats", "{folder}", "--scheduler", "tcp://127.0.0.1:9", "--filter", "s*.npy"], "cannot reach the scheduler"),
        *[
            ([command, *paths, "--scheduler", address], "cannot reach the scheduler")
            for command, paths in (("stats", ["{folder}"]), ("convert", ["{folder}", "{out}"]), ("demo", []))
            for address in ("foo://bar", "tcp://[::1", "inproc://x")
        ],
    ],
)
def test_bad_input_is_one_line_and_exit_2(folder, tmp_path, args, words):
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"not an npy file at all")
    args = [a.format(folder=folder, bad=bad, out=tmp_path / "out") for a in args]
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
    out = run(
        "stats",
        str(folder),
        "--filter",
        "s*.npy",
        "--roi-start",
        "1,2",
        "--roi-end",
        "3,5",
        "--roi-axes",
        "1,2",
        "--oob",
        "pad",
        "--fill-value",
        "-7",
        "--json",
        "--workers",
        "1",
    )
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
    for command in ("demo", "info", "stats", "convert", "bench", "cache"):
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
    assert out.returncode == 2 and "--layout per-file" in one_line(out)  # shapes and dtypes differ
    out = run("convert", str(folder), str(tmp_path / "all.zarr"), "--workers", "1", "--layout", "per-file")
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


# -- progress, --quiet, threads for tiny jobs ---------------------------------------------------


def run_here(capsys, *args):
    """The command line in this process (so constants and cluster classes can be patched)."""
    from npydask.cli import main

    status = main(list(args))
    out = capsys.readouterr()
    return status, out.out, out.err


@pytest.fixture
def no_cluster(monkeypatch):
    """Fail the test if anything starts a distributed LocalCluster."""
    import distributed

    started = []

    class Refused(Exception):
        pass

    def spy(*args, **kwargs):
        started.append(kwargs)
        raise Refused("a LocalCluster was started")

    monkeypatch.setattr(distributed, "LocalCluster", spy)
    return started, Refused


def test_progress_goes_to_stderr_and_quiet_silences_it(folder):
    out = run("stats", str(folder), "--json")
    assert out.returncode == 0, out.stderr
    json.loads(out.stdout)  # stdout holds the JSON alone
    assert "100% Completed" in out.stderr and "Completed" not in out.stdout
    quiet = run("stats", str(folder), "--json", "--quiet")
    assert quiet.returncode == 0 and quiet.stderr == ""
    assert json.loads(quiet.stdout) == json.loads(out.stdout)


@pytest.mark.timeout(240)
def test_cluster_progress_goes_to_stderr(folder):
    import socket

    with socket.socket() as busy:  # the dashboard's default port taken: no "port in use" warning on stderr
        try:
            busy.bind(("", 8787))
            busy.listen()
        except OSError:
            pass  # taken already
        out = run("stats", str(folder), "--json", "--workers", "1")
    assert out.returncode == 0, out.stderr
    json.loads(out.stdout)
    assert out.stderr.splitlines()[0] == "starting an embedded local cluster (1 worker, 1 thread each)"
    assert "Completed" in out.stderr and "8787" not in out.stderr and "Warning" not in out.stderr
    quiet = run("stats", str(folder), "--json", "--workers", "1", "-q")
    assert quiet.returncode == 0 and quiet.stderr == "" and json.loads(quiet.stdout) == json.loads(out.stdout)


def test_tiny_jobs_run_on_threads_without_a_cluster(folder, tmp_path, capsys, no_cluster):
    started, refused = no_cluster
    status, out, err = run_here(capsys, "stats", str(folder), "--json")
    assert status == 0 and started == [] and "local cluster" not in err
    flat = np.concatenate([np.load(p).astype(np.float64).ravel() for p in sorted(folder.rglob("*.npy"))])
    data = json.loads(out)
    assert data["count"] == flat.size and data["max"] == flat.max() and np.isclose(data["std"], flat.std())
    status, _, _ = run_here(capsys, "convert", str(folder), str(tmp_path / "copy"))
    assert status == 0 and started == []
    np.testing.assert_array_equal(np.load(tmp_path / "copy" / "big.npy"), np.load(folder / "big.npy"))
    with pytest.raises(refused):  # --workers asks for a cluster, tiny as the job is
        run_here(capsys, "stats", str(folder), "--workers", "1")
    assert len(started) == 1


@pytest.mark.parametrize("limit", ["files", "bytes"])
def test_jobs_over_the_tiny_limits_start_a_cluster(folder, capsys, monkeypatch, no_cluster, limit):
    from npydask.cli import _common

    started, refused = no_cluster
    monkeypatch.setattr(_common, "TINY_FILES" if limit == "files" else "TINY_BYTES", 7 if limit == "files" else 96 * 7)
    with pytest.raises(refused):  # 7 files of 96 bytes or more: not under either limit
        run_here(capsys, "stats", str(folder))
    assert len(started) == 1
    status, _, _ = run_here(capsys, "stats", str(folder), "--filter", "s*.npy")  # 5 files of 96 bytes: tiny
    assert status == 0 and len(started) == 1


@pytest.mark.parametrize("n", [300, 700])
def test_scanning_many_files_shows_a_count(tmp_path, capsys, monkeypatch, n):
    from npydask.cli import _common, _progress

    monkeypatch.setattr(_common, "SCAN_COUNT_FROM", 100)
    monkeypatch.setattr(_progress, "LINE_EVERY", 0.0)  # a line per batch of files
    for i in range(n):
        np.save(tmp_path / f"f{i:04d}.npy", np.full(3, i, "<i4"))
    status, out, err = run_here(capsys, "info", str(tmp_path), "--summary", "--json")
    assert status == 0 and json.loads(out)["totals"]["files"] == n
    lines = err.splitlines()
    assert lines[0] == f"scanned 256 / {n} files" and lines[-1] == f"scanned {n} / {n} files"
    counts = [int(line.split()[1]) for line in lines]
    assert counts == sorted(counts) and len(lines) <= n // 256 + 2  # per batch, not per file
    status, out, err = run_here(capsys, "stats", str(tmp_path), "--quiet", "--json")
    assert status == 0 and err == "" and json.loads(out)["count"] == 3 * n


def test_a_count_while_scanning_thousands_of_files(tmp_path):
    from npydask.cli._common import SCAN_COUNT_FROM

    n = SCAN_COUNT_FROM + 100
    for i in range(n):
        np.save(tmp_path / f"f{i:05d}.npy", np.zeros(2, "<u2"))
    out = run("info", str(tmp_path), "--summary")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"{n:,} files, ")  # one number format: thousands separated
    assert f"scanned {n:,} / {n:,} files" in out.stderr.splitlines()
    assert run("info", str(tmp_path), "--summary", "-q").stderr == ""


def test_progress_line_in_place_on_a_terminal_and_lines_in_a_log():
    import io

    from npydask.cli._progress import ProgressLine

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    term = Terminal()
    line = ProgressLine(term, every=0.0)
    for text in ("scanned 1 / 3 files", "scanned 3 / 3 files"):
        line.update(text)
    line.finish()
    assert term.getvalue() == "\rscanned 1 / 3 files\x1b[K\rscanned 3 / 3 files\x1b[K\n"
    log = io.StringIO()
    line = ProgressLine(log, every=3600.0)  # a log gets the first text, then one per hour, and the last
    line.write("\r[#   ] | 10% Completed")
    line.write("\r[##  ] | 50% Completed")
    line.write("\r[####] | 100% Completed")
    line.write("\x1b[2K\r")  # distributed clears its bar when it is done
    assert log.getvalue() == "[#   ] | 10% Completed\n[####] | 100% Completed\n"


# -- info: several paths, globs, summaries, hints -----------------------------------------------


def test_info_takes_several_paths_and_patterns(folder, tmp_path):
    np.savez(tmp_path / "a.npz", x=np.zeros(3))
    out = run("info", str(folder / "big.npy"), str(folder / "s[0-2].npy"), str(tmp_path / "a.npz"), "--json")
    assert out.returncode == 0, out.stderr
    paths = [f["path"] for f in json.loads(out.stdout)["files"]]
    assert paths == [str(folder / n) for n in ("big.npy", "s0.npy", "s1.npy", "s2.npy")] + [str(tmp_path / "a.npz")]
    out = run("info", str(folder), str(folder / "sub"), "--summary", "--json")
    assert json.loads(out.stdout)["totals"]["files"] == 8  # the folder's 7 and sub/ again
    out = run("info", str(folder / "big.npy"), str(folder / "nothing*.npy"))
    assert out.returncode == 2 and "no file or folder matches" in one_line(out)
    (tmp_path / "junk.npy").write_bytes(b"junk")  # among several paths, a bad file is listed (exit 1)
    out = run("info", str(folder / "big.npy"), str(tmp_path / "junk.npy"), "--json")
    assert out.returncode == 1 and json.loads(out.stdout)["totals"] == {
        "files": 1,
        "unreadable": 1,
        "nbytes": 288,
        "dtypes": {">f8": 1},
        "shapes": 1,
    }
    assert "junk.npy" in out.stderr


def test_info_summary_counts_unreadable_files_instead_of_listing_them(folder):
    for i in range(300):
        (folder / f"bad{i:03d}.npy").write_bytes(b"\x93NUMPY broken")
    out = run("info", str(folder), "--summary")
    assert out.returncode == 1
    assert out.stdout.strip().splitlines() == [
        "7 files, 864 B of data; dtypes: float32 (6), float64 (1); 2 distinct shapes (most common: 2x3x4, 3x3x4); "
        "300 unreadable"
    ]
    assert out.stderr.strip().splitlines() == [
        "300 of 307 files could not be read (run without --summary to list them)"
    ]
    data = json.loads(run("info", str(folder), "--summary", "--json").stdout)
    assert "errors" not in data and data["totals"]["unreadable"] == 300
    full = run("info", str(folder), "--json")
    assert len(json.loads(full.stdout)["errors"]) == 300 and len(full.stderr.splitlines()) == 301


@pytest.mark.parametrize(
    ("args", "flag", "python"),
    [
        (["info", "{folder}", "--filter", "*.nothing"], "--recursive", "recursive="),
        (
            ["stats", "{folder}", "--roi-start", "0,0", "--roi-end", "9,9", "--roi-axes", "1,2"],
            "--oob",
            "out_of_bounds",
        ),
        (["stats", "{folder}", "--roi-start", "0", "--roi-axes", "7"], "--roi-axes", "roi_axes"),
    ],
)
def test_hints_name_command_line_flags(folder, args, flag, python):
    out = run(*[a.format(folder=folder) for a in args])
    assert out.returncode == 2
    line = one_line(out)
    assert flag in line and python not in line and "file_root" not in line and "file_filter" not in line


def test_bench_from_an_installed_package_says_where_the_scripts_are(tmp_path, monkeypatch, capsys):
    import npydask

    monkeypatch.setattr(npydask, "__file__", str(tmp_path / "site-packages" / "npydask" / "__init__.py"))
    status, out, err = run_here(capsys, "bench", "--only", "header")
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert str(tmp_path / "site-packages" / "benchmarks") in err  # where it looked
    for words in (
        "benchmarks/ folder of npydask's source repository",
        "pip install -e .",
        "npydask bench",
        "python benchmarks/bench_read.py --size small",
    ):
        assert words in err, err


def test_bench_sizes_are_the_scripts_sizes(monkeypatch):
    import importlib.util
    from pathlib import Path

    from npydask.cli import bench

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "_common.py"
    spec = importlib.util.spec_from_file_location("_bench_common", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "_bench_common", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    assert tuple(bench.SIZES) == tuple(module.SIZES)
    out = run("bench", "--size", "medium")
    assert out.returncode == 2 and "invalid choice" in out.stderr


# -- stats --json: strict JSON ------------------------------------------------------------------


def strict(text):
    def refuse(name):
        raise AssertionError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def expected_json(a):
    """What stats --json says of the values ``a``: numpy's numbers, non-finite ones as strings."""
    if a.size == 0:
        return {"count": 0, "min": None, "max": None, "mean": None, "std": None}
    with np.errstate(invalid="ignore", over="ignore"):
        values = {"min": a.min(), "max": a.max(), "mean": a.mean(), "std": a.std()}
    return {"count": a.size, **{k: float(v) if np.isfinite(v) else str(float(v)) for k, v in values.items()}}


@pytest.mark.parametrize(
    "values",
    [
        [1.0, np.inf, 2.0],
        [-np.inf, 1.0, 3.0],
        [np.inf, -np.inf],
        [np.nan, 1.0],
        [1.0, 2.0, np.nan, np.inf],
        [],
    ],
    ids=["inf", "-inf", "both", "nan", "nan-inf", "empty"],
)
@pytest.mark.parametrize("dtype", ["<f8", ">f4", "<f2"])
def test_stats_json_is_strict_for_infinities_nan_and_empty_data(tmp_path, capsys, values, dtype):
    a = np.array(values, dtype)
    halves = [a[: len(a) // 2], a[len(a) // 2 :]]
    for i, half in enumerate(halves):  # the values spread over files: the per-file rows are combined
        np.save(tmp_path / f"p{i}.npy", half)
    status, out, _ = run_here(capsys, "stats", str(tmp_path), "--json", "--per-file", "-q")
    assert status == 0
    data = strict(out)
    assert {k: data[k] for k in ("count", "min", "max", "mean", "std")} == expected_json(a.astype(np.float64))
    assert [{k: v for k, v in f.items() if k != "path"} for f in data["files"]] == [
        expected_json(h.astype(np.float64)) for h in halves
    ]
    status, out, _ = run_here(capsys, "stats", str(tmp_path), "-q")  # the table, same rule for no values
    assert status == 0 and out.splitlines()[-1].split()[:4] == ["all", "2", "files", str(a.size)]


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


def test_info_verify_of_a_folder_without_archives_is_one_line(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros(3))
    out = run("info", str(tmp_path), "--verify")
    assert out.returncode == 2
    line = one_line(out)
    assert "no file found" in line and "*.npz" in line


# -- what a user new to the command line runs into ------------------------------------------------


@pytest.mark.parametrize("dtype", ["<f4", ">f4", "<f2", "<f8"])
def test_stats_table_prints_minima_and_maxima_that_read_back_as_the_files_values(tmp_path, capsys, dtype):
    """float32's largest value below 1 is 0.99999994, not 1: the table shows what the file holds."""
    below_one = np.nextafter(np.array(1, dtype), np.array(0, dtype))
    a = np.array([below_one, 0.1, 1 / 3, -np.nextafter(np.array(2, dtype), np.array(3, dtype))], dtype)
    np.save(tmp_path / "m.npy", a)
    np.save(tmp_path / "n.npy", a[::-1] * 2)
    status, out, err = run_here(capsys, "stats", str(tmp_path), "--per-file", "-q")
    assert status == 0, err
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:]}
    for name, values in (("m.npy", a), ("n.npy", a[::-1] * 2), ("all", np.concatenate([a, a * 2]))):
        lo, hi = rows[name][-4:-2]
        assert np.array(lo, dtype) == values.min() and np.array(hi, dtype) == values.max(), (name, lo, hi)
    assert rows["m.npy"][-3] != "1"


def test_info_of_a_folder_of_archives_says_what_it_found_and_how_to_read_them(tmp_path):
    for i in range(3):
        np.savez(tmp_path / f"p{i}.npz", image=np.zeros(3), label=np.ones(2))
    (tmp_path / "notes.txt").write_text("x")
    out = run("info", str(tmp_path))
    assert out.returncode == 2
    line = one_line(out)
    assert "no file matching --filter '*.npy'" in line and "found 3 .npz, 1 .txt" in line, line
    assert "--filter '*.npz' --key NAME" in line and "image, label" in line, line
    empty = tmp_path / "empty"
    empty.mkdir()
    out = run("info", str(empty))
    assert out.returncode == 2 and "no other file is there" in one_line(out)


def test_info_of_one_archive_counts_one_file_of_several_members(tmp_path, capsys):
    np.savez(tmp_path / "a.npz", x=np.zeros(3), y=np.ones(4), z=np.ones(1))
    np.save(tmp_path / "b.npy", np.zeros(2))
    status, out, err = run_here(capsys, "info", str(tmp_path / "a.npz"))
    assert status == 0, err
    assert out.splitlines()[-1].startswith("1 archive (3 members), 64 B of data"), out
    status, out, err = run_here(capsys, "info", str(tmp_path / "a.npz"), str(tmp_path / "b.npy"), "--json")
    assert status == 0, err
    data = json.loads(out)
    assert len(data["files"]) == 4
    assert (data["totals"]["files"], data["totals"]["archives"], data["totals"]["members"]) == (2, 1, 3)


def test_headers_first_reads_one_header_and_a_file_that_differs_fails_naming_it(tmp_path, capsys):
    for i in range(4):
        np.save(tmp_path / f"{i}.npy", np.full((3, 4), i, "<f4"))
    status, out, err = run_here(capsys, "stats", str(tmp_path), "--headers", "first", "--json", "-q")
    assert status == 0, err
    assert json.loads(out)["max"] == 3 and json.loads(out)["count"] == 48
    np.save(tmp_path / "4.npy", np.zeros((3, 5), "<f4"))
    for argv in (["stats", str(tmp_path)], ["convert", str(tmp_path), str(tmp_path / "out.npy")]):
        status, out, err = run_here(capsys, *argv, "--headers", "first", "-q")
        assert status == 2 and "4.npy" in err and "--headers all" in err, err
    status, out, err = run_here(capsys, "info", str(tmp_path), "--headers", "first", "--json")
    assert status == 0 and {tuple(f["shape"]) for f in json.loads(out)["files"]} == {(3, 4)}  # assumed, as said:
    assert "given the first file's header" in err
    status, out, err = run_here(capsys, "stats", str(tmp_path), "--headers", "first", "--key", "x")
    assert status == 2 and "--headers first" in err and "--key" in err, err


def test_an_index_is_written_then_reused_and_belongs_to_one_dataset(tmp_path, capsys):
    data = tmp_path / "d"
    data.mkdir()
    for i in range(4):
        np.save(data / f"{i}.npy", np.full((3, 4), i, "<i2"))
    index = tmp_path / "d.index.json"
    for _ in range(2):
        status, out, err = run_here(capsys, "stats", str(data), "--index", str(index), "--json", "-q")
        assert status == 0 and json.loads(out)["max"] == 3, err
        assert index.exists()
    status, out, err = run_here(capsys, "info", str(data), "--index", str(index), "--json")
    assert status == 0 and [f["shape"] for f in json.loads(out)["files"]] == [[3, 4]] * 4
    status, out, err = run_here(capsys, "info", str(data), str(data / "0.npy"), "--index", str(index))
    assert status == 2 and "--index keeps the headers of one dataset" in err
