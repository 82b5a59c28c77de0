"""The command line over object-store URLs: info, stats and convert read s3:// objects and prefixes.

Credentials come from the environment (as the workers of a cluster get them); the command line takes
only non-secret options (--storage-option endpoint=... region=...). numpy is the oracle.
"""

from __future__ import annotations

import inspect
import io
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import npydask
from npydask.cli import main

pytestmark = pytest.mark.usefixtures("no_hedging")  # (counts requests: a hedge adds one)

SHAPES = [(4, 5)] * 5


@pytest.fixture(scope="module")
def objects(s3):
    """``bucket/prefix`` with ``scans/`` (five .npy, one in a folder), ``pair.npz`` and a broken object."""
    space = s3.space()
    arrays = {}
    for i, shape in enumerate(SHAPES):
        key = f"scans/{i:02d}.npy" if i < 4 else "scans/sub/04.npy"
        a = (np.arange(np.prod(shape), dtype="<f4").reshape(shape) * (i + 1) - 7).astype("<f4")
        s3.put_npy(f"{space}/{key}", a)
        arrays[key] = a
    buf = io.BytesIO()
    np.savez(buf, x=np.arange(6, dtype="<i2").reshape(2, 3), y=np.linspace(0, 1, 4))
    s3.put(f"{space}/pair.npz", buf.getvalue())
    s3.put(f"{space}/broken/bad.npy", b"\x93NUMPY not really")
    return space, arrays


@pytest.fixture
def env(s3, monkeypatch):
    """The credentials in this process's environment; the CLI gets only endpoint and region."""
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    return ["--storage-option", f"endpoint={s3.endpoint}", "--storage-option", "region=us-east-1"]


def run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_info_lists_a_prefix_with_names_relative_to_it(objects, env, capsys):
    space, arrays = objects
    status, out, err = run(capsys, "info", f"s3://{space}/scans/", "--json", *env)
    assert status == 0, err
    files = json.loads(out)["files"]
    assert [f["path"] for f in files] == ["00.npy", "01.npy", "02.npy", "03.npy", "sub/04.npy"]  # DALI order
    for f in files:
        a = arrays[f"scans/{f['path']}"]
        assert (tuple(f["shape"]), f["dtype"], f["nbytes"]) == (a.shape, a.dtype.str, a.nbytes)
    status, out, _ = run(capsys, "info", f"s3://{space}/scans", *env)  # without the "/": the same prefix
    assert status == 0 and "sub/04.npy" in out and "5 files" in out


def test_info_reads_an_npz_object_and_a_single_object(objects, env, capsys):
    space, arrays = objects
    status, out, err = run(capsys, "info", f"s3://{space}/pair.npz", f"s3://{space}/scans/01.npy", "--json", *env)
    assert status == 0, err
    files = json.loads(out)["files"]
    assert [(f["key"], f["shape"], f["dtype"]) for f in files[:2]] == [("x", [2, 3], "<i2"), ("y", [4], "<f8")]
    assert files[2]["path"] == f"s3://{space}/scans/01.npy" and files[2]["shape"] == [4, 5]


@pytest.mark.parametrize(
    ("what", "expected"),
    [
        ("scans/missing.npy", "missing.npy: no such object"),
        ("nothing/", "nothing/: no file matching --filter"),
        ("broken/bad.npy", "bad.npy"),
    ],
)
def test_a_missing_or_broken_object_is_one_line_and_status_2(objects, env, capsys, what, expected):
    space, _ = objects
    status, out, err = run(capsys, "info", f"s3://{space}/{what}", *env)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and expected in err and err.startswith("npydask info: error: "), err


def test_a_prefix_with_a_broken_object_lists_it_and_exits_1(objects, env, capsys):
    space, _ = objects
    status, out, err = run(capsys, "info", f"s3://{space}/broken/", *env)
    assert status == 1 and "bad.npy" in err and "0 files" in out


def test_stats_of_a_prefix_equal_numpy(objects, env, capsys):
    space, arrays = objects
    status, out, err = run(capsys, "stats", f"s3://{space}/scans/", "--json", "--per-file", *env)
    assert status == 0, err
    got = json.loads(out)
    every = np.concatenate([a.ravel() for a in arrays.values()]).astype(np.float64)
    assert got["count"] == every.size
    np.testing.assert_allclose(
        [got[k] for k in ("min", "max", "mean", "std")],
        [every.min(), every.max(), every.mean(), every.std()],
        rtol=1e-12,
    )
    assert [f["path"] for f in got["files"]] == ["00.npy", "01.npy", "02.npy", "03.npy", "sub/04.npy"]
    np.testing.assert_allclose(got["files"][4]["mean"], arrays["scans/sub/04.npy"].astype(np.float64).mean())


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_stats_on_a_local_cluster_whose_workers_get_credentials_from_the_environment(objects, env, capsys):
    space, arrays = objects
    status, out, err = run(capsys, "stats", f"s3://{space}/scans/", "--json", "--workers", "1", "--quiet", *env)
    assert status == 0, err
    every = np.concatenate([a.ravel() for a in arrays.values()]).astype(np.float64)
    assert json.loads(out)["mean"] == pytest.approx(every.mean(), rel=1e-12)


def test_convert_a_prefix_to_local_files_zarr_and_one_stacked_npy(objects, env, capsys, tmp_path):
    space, arrays = objects
    ordered = [arrays[k] for k in ["scans/00.npy", "scans/01.npy", "scans/02.npy", "scans/03.npy", "scans/sub/04.npy"]]
    status, _, err = run(capsys, "convert", f"s3://{space}/scans/", str(tmp_path / "out"), "--quiet", *env)
    assert status == 0, err
    for key, a in arrays.items():
        np.testing.assert_array_equal(np.load(tmp_path / "out" / key.removeprefix("scans/")), a)
    status, _, err = run(capsys, "convert", f"s3://{space}/scans", str(tmp_path / "all.npy"), "--quiet", *env)
    assert status == 0, err
    np.testing.assert_array_equal(np.load(tmp_path / "all.npy"), np.stack(ordered))
    zarr = pytest.importorskip("zarr")
    status, _, err = run(capsys, "convert", f"s3://{space}/scans/", str(tmp_path / "all.zarr"), "--quiet", *env)
    assert status == 0, err
    z = zarr.open_array(str(tmp_path / "all.zarr"), mode="r")
    np.testing.assert_array_equal(z[...], np.stack(ordered))
    assert z.attrs["files"] == ["00.npy", "01.npy", "02.npy", "03.npy", "sub/04.npy"]


def test_convert_an_npz_object_and_a_single_object(objects, env, capsys, tmp_path):
    space, arrays = objects
    status, _, err = run(capsys, "convert", f"s3://{space}/pair.npz", str(tmp_path / "members"), "--quiet", *env)
    assert status == 0, err
    np.testing.assert_array_equal(np.load(tmp_path / "members" / "x.npy"), np.arange(6, dtype="<i2").reshape(2, 3))
    np.testing.assert_array_equal(np.load(tmp_path / "members" / "y.npy"), np.linspace(0, 1, 4))
    status, _, err = run(capsys, "convert", f"s3://{space}/scans/02.npy", str(tmp_path / "one.npy"), "--quiet", *env)
    assert status == 0, err
    np.testing.assert_array_equal(np.load(tmp_path / "one.npy"), arrays["scans/02.npy"])
    status, _, err = run(
        capsys, "convert", f"s3://{space}/pair.npz", str(tmp_path / "y.npy"), "--key", "y", "--quiet", *env
    )
    assert status == 0, err
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), np.linspace(0, 1, 4))


_WRITES_URLS = "storage_options" in inspect.signature(npydask.to_npy_files).parameters


@pytest.mark.skipif(not _WRITES_URLS, reason="to_npy_files to URLs lands with branch i-rwrite (the writers' side)")
def test_convert_local_files_to_a_url_prefix(objects, env, capsys, tmp_path, s3):
    space, _ = objects
    src = tmp_path / "src"
    src.mkdir()
    arrays = [np.full((3, 2), i, "<i4") for i in range(3)]
    for i, a in enumerate(arrays):
        np.save(src / f"{i}.npy", a)
    status, _, err = run(capsys, "convert", str(src), f"s3://{space}/converted/", "--quiet", *env)
    assert status == 0, err
    for i, a in enumerate(arrays):
        np.testing.assert_array_equal(np.load(io.BytesIO(s3.get(f"{space}/converted/{i}.npy"))), a)


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        ("region", "expected KEY=VALUE"),
        ("=x", "expected KEY=VALUE"),
        ("secret_access_key=TOPSECRET", "credentials do not belong on the command line"),
        ("aws_session_token=TOPSECRET", "credentials do not belong on the command line"),
    ],
)
def test_bad_or_secret_storage_options_are_refused_without_echoing_them(objects, env, capsys, option, expected):
    space, _ = objects
    status, out, err = run(capsys, "info", f"s3://{space}/scans/", "--storage-option", option)
    assert status == 2 and expected in err and "TOPSECRET" not in err + out


def test_storage_options_with_a_local_path_are_refused(capsys, tmp_path):
    np.save(tmp_path / "a.npy", np.zeros(2))
    for argv in (
        ["info", str(tmp_path / "a.npy")],
        ["stats", str(tmp_path)],
        ["convert", str(tmp_path / "a.npy"), str(tmp_path / "b.npy")],
    ):
        status, _, err = run(capsys, *argv, "--storage-option", "region=us-east-1")
        assert status == 2 and "--storage-option applies to object-store URLs" in err, err


def test_storage_option_values_are_parsed(objects, env, capsys):
    space, _ = objects
    # skip_signature=true: anonymous requests, which this bucket refuses (a parsed bool, not the string "true")
    status, _, err = run(capsys, "info", f"s3://{space}/scans/00.npy", *env, "--storage-option", "skip_signature=true")
    assert status == 2 and "access denied" in err
    status, _, err = run(capsys, "info", f"s3://{space}/scans/00.npy", *env, "--storage-option", "skip_signature=false")
    assert status == 0, err


def test_the_command_takes_credentials_from_its_environment_and_never_prints_them(objects, s3, tmp_path):
    space, _ = objects
    base = [sys.executable, "-m", "npydask.cli"]
    env = dict(os.environ, **s3.env(), PYTHONPATH=os.getcwd())
    options = ["--storage-option", f"endpoint={s3.endpoint}"]
    ok = subprocess.run(
        [*base, "info", f"s3://{space}/scans/", *options], capture_output=True, text=True, env=env, timeout=120
    )
    assert ok.returncode == 0 and "5 files" in ok.stdout, ok.stderr
    wrong = dict(env, AWS_SECRET_ACCESS_KEY="not-the-secret-4f2a")
    denied = subprocess.run(
        [*base, "info", f"s3://{space}/scans/", *options], capture_output=True, text=True, env=wrong, timeout=120
    )
    assert denied.returncode == 2 and "access denied" in denied.stderr
    signed = f"{s3.endpoint}/{space}/scans/00.npy?X-Amz-Signature=hush-5b1e&X-Amz-Credential=devadmin"
    shown = subprocess.run([*base, "info", signed], capture_output=True, text=True, env=env, timeout=120)
    assert shown.returncode == 2 and f"{s3.endpoint}/{space}/scans/00.npy" in shown.stderr, shown.stderr
    for result in (ok, denied, shown):
        text = result.stdout + result.stderr
        assert "devsecret" not in text and "not-the-secret-4f2a" not in text and "hush-5b1e" not in text, text


def test_a_damaged_npz_object_gives_a_clear_error(objects, env, capsys, s3):
    space, _ = objects
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("notes.txt", "no arrays here")
    s3.put(f"{space}/odd/notes.npz", buf.getvalue())
    s3.put(f"{space}/odd/plain.npz", b"not a zip at all")
    status, out, err = run(capsys, "info", f"s3://{space}/odd/notes.npz", *env)  # as for a local archive
    assert status == 1 and "member 'notes.txt'" in err and "not a valid .npy file" in err, err
    status, out, err = run(capsys, "info", f"s3://{space}/odd/plain.npz", *env)
    assert status == 2 and "plain.npz: not a readable .npz archive" in err and err.count("\n") == 1, err


# -- each object's header is read once (the scan), not again when the dataset is built -----------------


@pytest.fixture(scope="module")
def many(s3):
    """``bucket/prefix/`` of 24 small objects of one shape (header and payload fit one GET each)."""
    space = s3.space()
    arrays = [np.full((3, 4), i, "<i4") + np.arange(12, dtype="<i4").reshape(3, 4) for i in range(24)]
    for i, a in enumerate(arrays):
        s3.put_npy(f"{space}/m/{i:02d}.npy", a)
    return space, arrays


@pytest.fixture
def proxied(s3, monkeypatch):
    """The environment's credentials and the CLI's options pointing at a request-counting proxy of the server."""
    from npydask.testing.counting_proxy import CountingProxy

    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    with CountingProxy(s3.endpoint) as proxy:
        yield proxy, ["--storage-option", f"endpoint={proxy.endpoint}", "--storage-option", "region=us-east-1"]


@pytest.mark.parametrize("command", ["stats", "convert-zarr", "convert-npy", "convert-folder"])
def test_a_prefix_is_scanned_once_one_get_per_object_for_its_header(many, proxied, capsys, tmp_path, command):
    """The header scan costs one GET per object; reading the payload of a small object costs one more, no third.

    (The command used to read every header twice: once to list the readable files, again to open the dataset.)
    """
    space, arrays = many
    proxy, options = proxied
    url = f"s3://{space}/m/"
    argv = {
        "stats": ["stats", url, "--json"],
        "convert-zarr": ["convert", url, str(tmp_path / "out.zarr")],
        "convert-npy": ["convert", url, str(tmp_path / "out.npy")],
        "convert-folder": ["convert", url, str(tmp_path / "out")],
    }[command]
    if command == "convert-zarr":
        pytest.importorskip("zarr")
    proxy.reset()
    status, out, err = run(capsys, *argv, *options)
    assert status == 0, err
    counts = proxy.counts
    assert counts.unframed == 0
    n = len(arrays)
    assert counts.count("GET") == 2 * n, counts.requests  # n for the scan, n for the payloads
    assert counts.count("HEAD") == 0 and counts.count("LIST") <= 2, counts.requests
    stacked = np.stack(arrays)
    if command == "stats":
        s = json.loads(out)
        assert (s["count"], s["min"], s["max"]) == (stacked.size, stacked.min(), stacked.max())
    elif command == "convert-npy":
        np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), stacked)
    elif command == "convert-folder":
        for i, a in enumerate(arrays):
            np.testing.assert_array_equal(np.load(tmp_path / "out" / f"{i:02d}.npy"), a)
    else:
        import zarr

        np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "out.zarr"))[...], stacked)


@pytest.mark.parametrize("command", ["info", "stats", "convert"])
def test_headers_first_reads_one_header_of_a_prefix(many, proxied, capsys, tmp_path, command):
    """``--headers first``: the LIST and the first object's header at open; each payload read checks its own."""
    space, arrays = many
    proxy, options = proxied
    url = f"s3://{space}/m/"
    argv = {
        "info": ["info", url, "--json"],
        "stats": ["stats", url, "--json"],
        "convert": ["convert", url, str(tmp_path / "out.npy")],
    }[command]
    proxy.reset()
    status, out, err = run(capsys, *argv, "--headers", "first", *options)
    assert status == 0, err
    n = len(arrays)
    reads = {"info": 0, "stats": n, "convert": n}[command]
    assert proxy.counts.count("GET") == 1 + reads and proxy.counts.count("HEAD") == 0, proxy.counts.requests
    stacked = np.stack(arrays)
    if command == "info":
        files = json.loads(out)["files"]
        assert [f["path"] for f in files] == [f"{i:02d}.npy" for i in range(n)]
        assert {(tuple(f["shape"]), f["dtype"]) for f in files} == {((3, 4), "<i4")}
    elif command == "stats":
        s = json.loads(out)
        assert (s["count"], s["min"], s["max"], s["mean"]) == (
            stacked.size,
            stacked.min(),
            stacked.max(),
            stacked.astype("f8").mean(),
        )
    else:
        np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), stacked)


def test_an_index_is_built_once_and_then_costs_no_header_get(many, proxied, capsys, tmp_path):
    space, arrays = many
    proxy, options = proxied
    url, index = f"s3://{space}/m/", str(tmp_path / "m.index.json")
    n = len(arrays)
    stacked = np.stack(arrays)
    for built in (True, False):
        proxy.reset()
        status, out, err = run(capsys, "stats", url, "--json", "--index", index, *options)
        assert status == 0, err
        assert proxy.counts.count("GET") == (2 * n if built else n), (built, proxy.counts.requests)
        assert json.loads(out)["max"] == stacked.max() and os.path.exists(index)
    proxy.reset()
    status, out, err = run(capsys, "info", url, "--json", "--index", index, *options)
    assert status == 0 and proxy.counts.count("GET") == 0, (err, proxy.counts.requests)
    assert [tuple(f["shape"]) for f in json.loads(out)["files"]] == [a.shape for a in arrays]


def test_info_of_a_prefix_of_archives_says_what_it_found_and_how_to_read_them(s3, env, capsys):
    space = s3.space()
    for i in range(2):
        buf = io.BytesIO()
        np.savez(buf, x=np.zeros(3), y=np.ones(2))
        s3.put(f"{space}/z/{i}.npz", buf.getvalue())
    status, out, err = run(capsys, "info", f"s3://{space}/z/", *env)
    assert status == 2 and out == ""
    assert "found 2 .npz" in err and "--filter '*.npz' --key NAME" in err and "(e.g. x, y)" in err, err
    status, out, err = run(capsys, "info", f"s3://{space}/z/", "--filter", "*.npz", "--key", "y", "--json", *env)
    assert status == 0, err
    assert [(f["path"], f["shape"]) for f in json.loads(out)["files"]] == [("0.npz", [2]), ("1.npz", [2])]
