"""``npydask convert`` at scale: layouts, .npz members, destinations; numpy is the oracle.

Most cases build the conversion in this process (``_plan`` and its lazy
writes) and compute it on dask's threads, so they check exactly what the
command's tasks write without starting a cluster; a few run the command
itself for its exit status, stderr and the embedded cluster.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import dask
import numpy as np
import pytest

from npydask.cli import build_parser
from npydask.cli import convert as convert_module
from npydask.cli._errors import UsageError
from npydask.cli.convert import destination_kind, plan_batches

zarr = pytest.importorskip("zarr")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def run(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "npydask.cli", *args], capture_output=True, text=True, timeout=timeout)


def one_line(out):
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr
    return lines[0]


def plan(*argv):
    return convert_module._plan(build_parser().parse_args(["convert", *map(str, argv)]))


def convert_here(*argv):
    """The conversion's lazy writes, computed on threads; returns them (for graph checks)."""
    writes = plan(*argv).build()
    dask.compute(*writes, scheduler="threads")
    return writes


def uniform(root, n, shape=(3, 4), dtype="<f4", *, sub=0, fortran_every=0):
    """``n`` files of one shape and dtype (``sub`` more in ``sub/``); their relative names in DALI order."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(n)
    names = [f"x{i:03d}.npy" for i in range(n)]
    if sub:
        (root / "sub").mkdir()
        names += [os.path.join("sub", f"s{i}.npy") for i in range(sub)]
    for i, name in enumerate(names):
        a = (rng.standard_normal(shape) * 100).astype(dtype)
        np.save(root / name, np.asfortranarray(a) if fortran_every and i % fortran_every == 0 else a)
    return names


def loaded(root, names, key=None):
    return [np.load(root / n)[key] if key else np.load(root / n) for n in names]


# ---------------------------------------------------------------------------------------------
# Pure parts


@pytest.mark.parametrize(
    ("dest", "kind"),
    [
        ("a.zarr", "zarr"),
        ("a.zarr/", "zarr"),
        ("d/b.npy", "npy"),
        ("out", "folder"),
        ("out/", "folder"),
        ("out.v2/", "folder"),
        ("b.npy/", "folder"),
    ],
)
def test_destination_kind(dest, kind):
    assert destination_kind(dest) == kind


@pytest.mark.parametrize("dest", ["out.h5", "x.npz", "a.tif", "data.v2"])
def test_unknown_destination_extension_is_refused(dest):
    with pytest.raises(UsageError, match="unknown destination extension"):
        destination_kind(dest)


def test_an_existing_folder_with_a_dot_is_a_folder(tmp_path):
    (tmp_path / "run.v2").mkdir()
    assert destination_kind(str(tmp_path / "run.v2")) == "folder"


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 300, 5000])
@pytest.mark.parametrize("max_files", [1, 3, 256])
def test_plan_batches_covers_every_file_once_in_order(n, max_files):
    rng = np.random.default_rng(n + max_files)
    sizes = [int(s) for s in rng.integers(0, 200, n)]
    groups, large = plan_batches(sizes, small=150, max_files=max_files, max_bytes=1000)
    flat = [i for g in groups for i in g]
    assert flat == [i for i, s in enumerate(sizes) if s < 150]
    assert large == [i for i, s in enumerate(sizes) if s >= 150]
    assert all(1 <= len(g) <= max_files for g in groups)
    assert all(len(g) == 1 or sum(sizes[i] for i in g) <= 1000 for g in groups)
    if len(flat) >= 16 and max_files >= 256:
        assert len(groups) >= 16  # enough tasks to share out, yet far fewer than files


# ---------------------------------------------------------------------------------------------
# A folder to one stacked array (the default for .zarr and .npy destinations)


@pytest.mark.parametrize("dtype", ["<f4", ">i2", "<u8", "|b1", "<c8"])
def test_folder_to_stacked_zarr_equals_numpy_stack(tmp_path, dtype):
    names = uniform(tmp_path / "src", 23, (2, 5), dtype, sub=3, fortran_every=4)
    convert_here(tmp_path / "src", tmp_path / "out.zarr")
    z = zarr.open_array(str(tmp_path / "out.zarr"), mode="r")
    expected = np.stack(loaded(tmp_path / "src", names))
    assert z.shape == expected.shape
    np.testing.assert_array_equal(z[...], expected)
    assert list(z.attrs["files"]) == names  # root files first, then sub/, each sorted


def test_folder_to_stacked_zarr_recursive_keeps_relative_names_in_order(tmp_path):
    root = tmp_path / "src"
    names = ["a.npy", "b/c/d.npy", "b/e.npy", "z.npy"]
    for i, n in enumerate(names):
        (root / n).parent.mkdir(parents=True, exist_ok=True)
        np.save(root / n, np.full((4,), i, "<i4"))
    convert_here(root, tmp_path / "out.zarr", "--recursive")
    z = zarr.open_array(str(tmp_path / "out.zarr"), mode="r")
    assert list(z.attrs["files"]) == names
    np.testing.assert_array_equal(z[...], np.stack(loaded(root, names)))


@pytest.mark.parametrize("recursive", [False, True])
def test_folder_of_slices_in_natural_order(tmp_path, recursive):
    root = tmp_path / "src"
    root.mkdir()
    for i in range(12):
        np.save(root / f"slice_{i}.npy", np.full((2, 3), i, "<i2"))
    extra = ["--recursive"] if recursive else []
    convert_here(root, tmp_path / "nat.npy", "--sort", "natural", *extra)
    np.testing.assert_array_equal(
        np.load(tmp_path / "nat.npy"), np.stack([np.full((2, 3), i, "<i2") for i in range(12)])
    )
    convert_here(root, tmp_path / "bytes.npy", *extra)  # the default stays DALI's byte-wise order
    dali = sorted(range(12), key=lambda i: f"slice_{i}.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "bytes.npy")[:, 0, 0], dali)


def test_folder_to_one_stacked_npy_file(tmp_path):
    names = uniform(tmp_path / "src", 40, (6,), "<f8", fortran_every=3)
    convert_here(tmp_path / "src", tmp_path / "all.npy")
    back = np.load(tmp_path / "all.npy")
    np.testing.assert_array_equal(back, np.stack(loaded(tmp_path / "src", names)))
    assert back.flags.c_contiguous


@pytest.mark.parametrize("dest", ["out.zarr", "out.npy"])
def test_a_non_uniform_folder_is_refused_with_the_per_file_hint(tmp_path, dest):
    uniform(tmp_path / "src", 3, (2, 3))
    np.save(tmp_path / "src" / "odd.npy", np.zeros((4, 3), "<f4"))
    with pytest.raises(UsageError, match=r"--layout per-file") as e:
        plan(tmp_path / "src", tmp_path / dest)
    assert "odd.npy" in str(e.value) and "(4, 3)" in str(e.value) and "(2, 3)" in str(e.value)
    assert not (tmp_path / dest).exists()


def test_a_folder_of_mixed_dtypes_is_refused_for_stacking(tmp_path):
    uniform(tmp_path / "src", 2, (3,), "<f4")
    np.save(tmp_path / "src" / "z.npy", np.zeros(3, "<f8"))
    with pytest.raises(UsageError, match=r"float64.*float32.*--layout per-file"):
        plan(tmp_path / "src", tmp_path / "out.zarr")


# ---------------------------------------------------------------------------------------------
# A folder to one zarr array or one .npy file per file


@pytest.fixture
def mixed(tmp_path):
    """Files of several shapes and dtypes, in the root and in sub/ (relative names, DALI order)."""
    root = tmp_path / "mixed"
    (root / "sub").mkdir(parents=True)
    arrays = {
        "a.npy": np.arange(12, dtype="<f4").reshape(3, 4),
        "b.npy": np.asfortranarray(np.arange(30, dtype=">f8").reshape(5, 6)),
        "c.npy": np.array(7, "<i2"),
        "e.npy": np.zeros((0, 3), "<u1"),
        os.path.join("sub", "deep.npy"): np.ones((2, 2, 2), "<c16"),
    }
    for name, a in arrays.items():
        np.save(root / name, a)
    return root, list(arrays)


def test_per_file_zarr_names_mirror_relative_paths(tmp_path, mixed):
    root, names = mixed
    convert_here(root, tmp_path / "out.zarr", "--layout", "per-file")
    group = zarr.open_group(str(tmp_path / "out.zarr"), mode="r")
    assert list(group.attrs["files"]) == names
    for name in names:
        z = group[name[: -len(".npy")].replace(os.sep, "/")]
        expected = np.load(root / name)
        assert z.shape == expected.shape
        np.testing.assert_array_equal(z[...], expected)


def test_per_file_zarr_with_large_files_in_between(tmp_path, mixed, monkeypatch):
    """Files over SMALL_BYTES get to_zarr's chunked writes; the small ones around them are grouped."""
    root, names = mixed
    monkeypatch.setattr(convert_module, "SMALL_BYTES", 100)  # b.npy (240 B) and sub/deep.npy (128 B) are "large"
    writes = convert_here(root, tmp_path / "out.zarr", "--layout", "per-file")
    assert len(writes) == 1 + 2  # one value for the grouped small files, one to_zarr per large file
    group = zarr.open_group(str(tmp_path / "out.zarr"), mode="r")
    for name in names:
        np.testing.assert_array_equal(group[name[:-4].replace(os.sep, "/")][...], np.load(root / name))


def test_per_file_zarr_refuses_names_that_collide(tmp_path):
    root = tmp_path / "src"
    (root / "a").mkdir(parents=True)
    np.save(root / "a.npy", np.zeros(2))
    np.save(root / "a" / "b.npy", np.zeros(2))
    with pytest.raises(UsageError, match="needs as a group"):
        plan(root, tmp_path / "out.zarr", "--layout", "per-file")


@pytest.mark.parametrize("small", [None, 100])
def test_folder_to_a_folder_of_npy_files(tmp_path, mixed, monkeypatch, small):
    root, names = mixed
    if small is not None:
        monkeypatch.setattr(convert_module, "SMALL_BYTES", small)
    convert_here(root, tmp_path / "copy")
    for name in names:
        back = np.load(tmp_path / "copy" / name)
        expected = np.load(root / name)
        assert back.dtype == expected.dtype and back.flags.c_contiguous
        np.testing.assert_array_equal(back, expected)
    written = sorted(str(p.relative_to(tmp_path / "copy")) for p in (tmp_path / "copy").rglob("*") if p.is_file())
    assert written == sorted(names)  # no temporary file left behind


def test_stacked_layout_to_a_folder_and_per_file_to_a_npy_file_are_refused(tmp_path, mixed):
    root, _ = mixed
    with pytest.raises(UsageError, match="give a .zarr store or a .npy file"):
        plan(root, tmp_path / "copy", "--layout", "stacked")
    with pytest.raises(UsageError, match="give a .zarr store or a folder"):
        plan(root, tmp_path / "x.npy", "--layout", "per-file")


# ---------------------------------------------------------------------------------------------
# .npz members


@pytest.fixture
def npz_folder(tmp_path):
    root = tmp_path / "pairs"
    (root / "more").mkdir(parents=True)
    names = [f"p{i}.npz" for i in range(6)] + [os.path.join("more", "q.npz")]
    rng = np.random.default_rng(3)
    for i, name in enumerate(names):
        save = np.savez_compressed if i % 2 else np.savez
        save(root / name, x=rng.standard_normal((4, 3)).astype("<f4"), y=np.int64(i))
    return root, names


def test_npz_folder_key_to_stacked_zarr(tmp_path, npz_folder):
    root, names = npz_folder
    convert_here(root, tmp_path / "x.zarr", "--key", "x")
    z = zarr.open_array(str(tmp_path / "x.zarr"), mode="r")
    np.testing.assert_array_equal(z[...], np.stack(loaded(root, names, "x")))
    assert list(z.attrs["files"]) == names
    convert_here(root, tmp_path / "y.zarr", "--key", "y")
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "y.zarr"))[...], np.arange(7))


@pytest.mark.parametrize("layout", [[], ["--layout", "per-file"]])
def test_npz_folder_key_per_file(tmp_path, npz_folder, layout):
    root, names = npz_folder
    dest = tmp_path / ("x.zarr" if layout else "x")
    convert_here(root, dest, "--key", "x", *layout)
    for name in names:
        stem = name[: -len(".npz")]
        if layout:
            back = zarr.open_group(str(dest), mode="r")[stem.replace(os.sep, "/")][...]
        else:
            back = np.load(dest / (stem + ".npy"))
        np.testing.assert_array_equal(back, np.load(root / name)["x"])


def test_one_npz_member_to_a_npy_file(tmp_path, npz_folder):
    root, _ = npz_folder
    convert_here(root / "p1.npz", tmp_path / "x.npy", "--key", "x")
    np.testing.assert_array_equal(np.load(tmp_path / "x.npy"), np.load(root / "p1.npz")["x"])
    with pytest.raises(UsageError, match="--key MEMBER"):
        plan(root / "p1.npz", tmp_path / "both.npy")


def test_a_single_file_into_a_folder(tmp_path, save):
    src = save(np.asfortranarray(np.arange(6.0).reshape(2, 3)), "f.npy")
    convert_here(src, tmp_path / "dest")
    np.testing.assert_array_equal(np.load(tmp_path / "dest" / "f.npy"), np.load(src))


# ---------------------------------------------------------------------------------------------
# Small graphs


@pytest.mark.parametrize("layout", ["stacked", "per-file", "npy-files"])
def test_the_graph_stays_small_for_many_files(tmp_path, layout):
    n = 1500
    root = tmp_path / "many"
    root.mkdir()
    a = np.zeros((16, 16), "<f4")
    for i in range(n):
        np.save(root / f"{i:05d}.npy", a + i)
    dest = tmp_path / ("out" if layout == "npy-files" else "out.zarr")
    extra = ["--layout", layout] if layout != "npy-files" else []
    writes = plan(root, dest, *extra).build()
    graph = {k: v for w in writes for k, v in dict(w.__dask_graph__()).items()}
    assert len(graph) <= 40, len(graph)  # tasks per group of files, never per file
    assert len(pickle.dumps(graph)) < 400 * n  # a few hundred bytes a file: paths and names, no data
    dask.compute(*writes, scheduler="threads")
    if layout == "stacked":
        np.testing.assert_array_equal(zarr.open_array(str(dest))[:, 0, 0], np.arange(n, dtype="<f4"))
    elif layout == "per-file":
        g = zarr.open_group(str(dest), mode="r")
        assert [float(g[f"{i:05d}"][0, 0]) for i in range(0, n, 97)] == list(range(0, n, 97))
    else:
        assert [float(np.load(dest / f"{i:05d}.npy")[0, 0]) for i in range(0, n, 97)] == list(range(0, n, 97))


# ---------------------------------------------------------------------------------------------
# The command itself


@pytest.mark.timeout(300)
def test_cli_folder_to_stacked_and_per_file_zarr(tmp_path):
    names = uniform(tmp_path / "src", 30, (4, 4), "<f4", sub=2)
    out = run("convert", str(tmp_path / "src"), str(tmp_path / "s.zarr"), "--workers", "1")
    assert out.returncode == 0, out.stderr
    z = zarr.open_array(str(tmp_path / "s.zarr"), mode="r")
    np.testing.assert_array_equal(z[...], np.stack(loaded(tmp_path / "src", names)))
    assert list(z.attrs["files"]) == names
    out = run(
        "convert",
        str(tmp_path / "src"),
        str(tmp_path / "s.zarr"),
        "--workers",
        "1",
        "--layout",
        "per-file",
        "--overwrite",
    )
    assert out.returncode == 0, out.stderr
    group = zarr.open_group(str(tmp_path / "s.zarr"), mode="r")
    assert set(group.array_keys()) == {n[:-4] for n in names if os.sep not in n}
    assert list(group.attrs["files"]) == names
    np.testing.assert_array_equal(group["sub/s1"][...], np.load(tmp_path / "src" / "sub" / "s1.npy"))


@pytest.mark.parametrize(
    ("src_kind", "dest", "words"),
    [
        ("file", "out.h5", "unknown destination extension '.h5'"),
        ("folder", "out.h5", "unknown destination extension '.h5'"),
        ("ragged", "out.zarr", "--layout per-file"),
        ("folder", "out", "--layout stacked"),
        ("folder", "missing/all.npy", "its folder does not exist"),
    ],
)
def test_cli_bad_destinations_exit_2_with_one_line(tmp_path, src_kind, dest, words):
    src = tmp_path / "src"
    uniform(src, 3, (2, 2))
    if src_kind == "ragged":
        np.save(src / "z.npy", np.zeros(5, "<f4"))
    args = [str(src / "x000.npy") if src_kind == "file" else str(src), str(tmp_path / dest)]
    if dest == "out":
        args += ["--layout", "stacked"]
    out = run("convert", *args)
    assert out.returncode == 2 and words in one_line(out)
    assert not (tmp_path / dest).exists()


@pytest.mark.timeout(300)
def test_benchmark_runs_at_tiny_size(tmp_path):
    out_json = tmp_path / "out.json"
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH / "bench_convert.py"),
            "--size",
            "tiny",
            "--repeat",
            "1",
            "--json",
            str(out_json),
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "goal" in done.stdout and "every output equals its source (numpy.load): yes" in done.stdout
    data = json.loads(out_json.read_text())
    assert data["outputs_agree"] and len(data["results"]) == 5


def test_relative_paths_work_from_the_current_folder(tmp_path, monkeypatch):
    names = uniform(tmp_path / "src", 5, (2,), "<i8", sub=2)
    monkeypatch.chdir(tmp_path)
    convert_here("src", "s.zarr")
    convert_here("src/", "p.zarr", "--layout", "per-file")
    convert_here("src", "copy/")
    assert list(zarr.open_array("s.zarr", mode="r").attrs["files"]) == names
    for name in names:
        expected = np.load(tmp_path / "src" / name)
        np.testing.assert_array_equal(zarr.open_group("p.zarr", mode="r")[name[:-4]][...], expected)
        np.testing.assert_array_equal(np.load(tmp_path / "copy" / name), expected)


def test_layout_is_refused_for_a_single_file(tmp_path, save):
    src = save(np.zeros(3), "one.npy")
    with pytest.raises(UsageError, match="--layout applies to a folder"):
        plan(src, tmp_path / "o.zarr", "--layout", "per-file")


def test_convert_folder_names_that_clash_are_refused_before_any_write(tmp_path):
    """``a.npy`` and a file ``a`` both become ``out/a.npy``: refused up front, nothing overwritten."""
    src = tmp_path / "src"
    src.mkdir()
    np.save(src / "a.npy", np.zeros(3))
    with open(src / "a", "wb") as f:  # a valid .npy file without the extension
        np.save(f, np.ones(3))
    out = run("convert", str(src), str(tmp_path / "out"), "--filter", "*")
    assert out.returncode == 2 and "both write" in one_line(out)
    assert not (tmp_path / "out").exists()
