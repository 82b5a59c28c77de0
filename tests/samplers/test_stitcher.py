"""Stitcher: numpy's weighted average of the tiles is the oracle; slabs are bounded; .npy targets equal the arrays."""

from __future__ import annotations

import io
import math
import os
import time

import numpy as np
import pytest

import npydask
from npydask.samplers import Grid, Stitcher
from npydask.samplers.stitcher import importance_map


def dataset(tmp_path, arrays):
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"{i:02d}.npy", a)
    return npydask.open_dataset(str(tmp_path))


def tile_of(array, tile):
    """The tile's input values, padded with zeros where it hangs over the array (leading axes whole)."""
    nd = len(tile.start)
    lead = array.ndim - nd
    out = np.zeros(array.shape[:lead] + tuple(b - a for a, b in zip(tile.start, tile.stop)), array.dtype)
    src = tuple(slice(max(a, 0), min(b, n)) for a, b, n in zip(tile.start, tile.stop, array.shape[lead:]))
    dst = tuple(slice(s.start - a, s.stop - a) for s, a in zip(src, tile.start))
    out[(..., *dst)] = array[(..., *src)]
    return out


def all_tiles(grid):
    return [t for f in range(grid.n_files) for t in grid.tiles(f)]


def index_of(tiles):
    return {
        "file": np.array([t.file for t in tiles], np.int64),
        "start": np.array([t.start for t in tiles], np.int64).reshape(len(tiles), -1),
        "stop": np.array([t.stop for t in tiles], np.int64).reshape(len(tiles), -1),
    }


def feed(stitcher, tiles, outputs, batch_size, check=None):
    for i in range(0, len(tiles), batch_size):
        part = tiles[i : i + batch_size]
        stitcher.add(np.stack([outputs[t] for t in part]), index_of(part))
        if check is not None:
            check(stitcher)


def oracle(extent, tiles, outputs, weights, channels=()):
    """The weighted average over a padded canvas, cropped: MONAI's fold, in float64."""
    nd = len(extent)
    origin = [min(0, *(t.start[i] for t in tiles)) for i in range(nd)]
    size = [max(extent[i], *(t.stop[i] for t in tiles)) - origin[i] for i in range(nd)]
    sums = np.zeros((*channels, *size))
    count = np.zeros(size)
    for t in tiles:
        where = tuple(slice(a - o, b - o) for a, b, o in zip(t.start, t.stop, origin))
        sums[(..., *where)] += outputs[t] * weights
        count[where] += weights
    crop = tuple(slice(-o, -o + e) for o, e in zip(origin, extent))
    return sums[(..., *crop)] / count[crop]


@pytest.mark.parametrize("weights", ["mean", "gaussian"])
@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_the_identity_model_gives_the_input_back(tmp_path, weights, batch_size):
    rng = np.random.default_rng(0)
    arrays = [rng.random((13, 17, 9)).astype("f4"), rng.random((20, 6, 11)).astype("f4")]
    ds = dataset(tmp_path, arrays)
    grid = Grid((8, 8, 8), overlap=0.25).bind(ds)
    tiles = all_tiles(grid)
    outputs = {t: tile_of(arrays[t.file], t) for t in tiles}
    s = Stitcher(grid, ds, weights=weights)
    feed(s, tiles, outputs, batch_size)
    for got, want in zip(s.result(), arrays):
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("weights", ["mean", "gaussian"])
def test_random_outputs_equal_numpy_weighted_averages(tmp_path, weights):
    rng = np.random.default_rng(1)
    arrays = [np.zeros((19, 23), "f4"), np.zeros((9, 30), "f4")]
    ds = dataset(tmp_path, arrays)
    grid = Grid((10, 12), overlap=0.4).bind(ds)
    tiles = all_tiles(grid)
    outputs = {t: rng.normal(size=(10, 12)).astype("f4") for t in tiles}
    s = Stitcher(Grid((10, 12), overlap=0.4), ds, weights=weights)
    feed(s, tiles, outputs, 5)
    w = importance_map((10, 12), weights).astype(np.float64)
    for f, got in enumerate(s.result()):
        want = oracle(arrays[f].shape, grid.tiles(f), outputs, w)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_files_smaller_than_the_patch_are_padded_and_cropped(tmp_path):
    rng = np.random.default_rng(2)
    arrays = [rng.random((5, 20)).astype("f4"), rng.random((3, 4)).astype("f4")]
    ds = dataset(tmp_path, arrays)
    grid = Grid((8, 8)).bind(ds)
    tiles = all_tiles(grid)
    assert any(min(t.start) < 0 for t in tiles)
    outputs = {t: tile_of(arrays[t.file], t) for t in tiles}
    for weights in ("mean", "gaussian"):
        s = Stitcher(grid, ds, weights=weights)
        feed(s, tiles, outputs, 4)
        for got, want in zip(s.result(), arrays):
            np.testing.assert_allclose(got, want, rtol=1e-6)


def test_two_output_channels(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.random((30, 25, 12)).astype("f4")
    ds = dataset(tmp_path, [x])
    grid = Grid((16, 16, 8), overlap=0.25).bind(ds)
    tiles = all_tiles(grid)
    outputs = {t: np.stack([2 * tile_of(x, t) + 1, tile_of(x, t) ** 2]) for t in tiles}
    s = Stitcher(grid, ds, weights="gaussian", channels=(2,), dtype="float64")
    feed(s, tiles, outputs, 3)
    (got,) = s.result()
    assert got.shape == (2, 30, 25, 12) and got.dtype == np.float64
    np.testing.assert_allclose(got[0], 2 * x + 1, rtol=1e-6)
    np.testing.assert_allclose(got[1], x.astype(np.float64) ** 2, rtol=1e-5)


def test_in_the_grids_order_one_slab_of_a_tile_depth_is_held(tmp_path):
    x = np.random.default_rng(4).random((40, 12, 10)).astype("f4")
    ds = dataset(tmp_path, [x, x[:20]])
    grid = Grid((8, 6, 10), overlap=0.5).bind(ds)
    tiles = all_tiles(grid)
    outputs = {t: np.stack([tile_of(x, t)] * 2) for t in tiles}
    seen = []

    def check(st):
        held = st.in_progress
        assert len(held) <= 1
        seen.extend(held.values())

    s = Stitcher(grid, ds, channels=(2,))
    feed(s, tiles, outputs, 2, check)
    assert set(seen) == {(2, 8, 12, 10)}  # a tile's depth over the whole plane, never the volume
    assert s.in_progress == {}
    np.testing.assert_allclose(s.result()[0][1], x, rtol=1e-6)


def test_writing_final_planes_allocates_no_second_slab(tmp_path):
    """Final planes are divided in place: besides the slab, adding tiles allocates about a tile's outputs at a time."""
    import tracemalloc

    x = np.random.default_rng(5).random((64, 48, 40)).astype("f4")
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    ds = dataset(tmp_path / "in", [x])
    grid = Grid((16, 16, 16), overlap=0.25).bind(ds)
    tiles = all_tiles(grid)
    parts = [tiles[i : i + 4] for i in range(0, len(tiles), 4)]
    batches = [np.stack([np.stack([2 * tile_of(x, t) + 1, tile_of(x, t) ** 2]) for t in p]) for p in parts]
    s = Stitcher(grid, ds, weights="gaussian", channels=(2,), out=tmp_path / "out")
    slab = 3 * 16 * 48 * 40 * 4  # the sums of 2 channels and the weights, a tile deep
    quotient = 2 * 12 * 48 * 40 * 4  # a step's final planes of both channels, divided into a new array
    tracemalloc.start()
    try:
        for part, batch in zip(parts, batches):
            s.add(batch, index_of(part))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # (besides the slab: a batch's weighted tiles and the ufuncs' buffers, under a quotient of the final planes)
    assert slab <= peak < slab + quotient, (peak, slab, quotient)
    np.testing.assert_allclose(np.load(s.result()[0]), np.stack([2 * x + 1, x**2]), rtol=1e-5, atol=1e-6)


def test_files_may_interleave_each_holding_its_own_slab(tmp_path):
    x = np.random.default_rng(5).random((20, 10)).astype("f4")
    ds = dataset(tmp_path, [x, x + 1])
    grid = Grid((6, 6)).bind(ds)
    a, b = grid.tiles(0), grid.tiles(1)
    mixed = [t for pair in zip(a, b) for t in pair]
    arrays = [x, x + 1]
    outputs = {t: tile_of(arrays[t.file], t) for t in mixed}
    s = Stitcher(grid, ds, weights="gaussian")
    feed(s, mixed, outputs, 3, lambda st: assert_at_most(st, 2))
    for got, want in zip(s.result(), arrays):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def assert_at_most(st, n):
    assert len(st.in_progress) <= n


def test_location_indexes_of_the_adapters_are_taken(tmp_path):
    x = np.arange(64, dtype="f4").reshape(8, 8)
    ds = dataset(tmp_path, [x])
    grid = Grid((4, 4), overlap=0.5).bind(ds)
    tiles = grid.tiles(0)
    s = Stitcher(grid, ds)
    location = np.array([t.start + t.stop for t in tiles])
    s.add(np.stack([tile_of(x, t) for t in tiles]), {"file": [0] * len(tiles), "location": location})
    np.testing.assert_array_equal(s.result()[0], x)


def stitch_two_files(tmp_path, out):
    """Two files whose model outputs are (x, -x), stitched with Gaussian weights into ``out``: inputs and result()."""
    rng = np.random.default_rng(6)
    arrays = [rng.random((13, 9, 7)).astype("f4"), rng.random((4, 9, 7)).astype("f4")]
    src = tmp_path / "src"
    src.mkdir()
    ds = dataset(src, arrays)
    grid = Grid((6, 6, 6)).bind(ds)
    tiles = all_tiles(grid)
    outputs = {t: np.stack([tile_of(arrays[t.file], t), -tile_of(arrays[t.file], t)]) for t in tiles}
    s = Stitcher(grid, ds, weights="gaussian", channels=(2,), out=out)
    feed(s, tiles, outputs, 5)
    return [np.stack([a, -a]) for a in arrays], s.result()


def test_out_folder_gets_one_npy_per_file_equal_to_the_arrays(tmp_path):
    wanted, paths = stitch_two_files(tmp_path, tmp_path / "out")
    assert [p.rsplit("/", 1)[-1] for p in paths] == ["00.npy", "01.npy"]
    for path, want in zip(paths, wanted):
        np.testing.assert_allclose(np.load(path), want, rtol=1e-6)


def test_out_of_order_duplicate_foreign_and_missing_tiles_raise(tmp_path):
    x = np.zeros((20, 8), "f4")
    ds = dataset(tmp_path, [x])
    grid = Grid((8, 8), overlap=0.5).bind(ds)
    tiles = grid.tiles(0)
    outputs = {t: np.zeros((8, 8), "f4") for t in tiles}
    s = Stitcher(grid, ds)
    with pytest.raises(ValueError, match=r"before its tiles at \[\(0, 0\)\]: tiles must arrive in the Grid's order"):
        feed(s, tiles[1:2], outputs, 1)
    feed(s, tiles[:2], outputs, 1)
    with pytest.raises(ValueError, match="given twice"):
        feed(s, tiles[1:2], outputs, 1)
    with pytest.raises(ValueError, match="not one of its grid's tiles"):
        s.add(np.zeros((1, 8, 8)), {"file": [0], "start": [[3, 0]], "stop": [[11, 8]]})
    with pytest.raises(ValueError, match="not one of the grid's 1 files"):
        s.add(np.zeros((1, 8, 8)), {"file": [1], "start": [[0, 0]], "stop": [[8, 8]]})
    with pytest.raises(ValueError, match=r"shape \(1, 8, 8\)"):
        s.add(np.zeros((1, 8, 7)), {"file": [0], "start": [[0, 0]], "stop": [[8, 8]]})
    with pytest.raises(ValueError, match="patch's shape"):
        s.add(np.zeros((1, 8, 8)), {"file": [0], "start": [[0, 0]], "stop": [[8, 9]]})
    with pytest.raises(ValueError, match="'start'/'stop'"):
        s.add(np.zeros((1, 8, 8)), {"file": [0]})
    with pytest.raises(ValueError, match="file 0: 2"):
        s.result()


def test_a_complete_file_refuses_more_tiles(tmp_path):
    ds = dataset(tmp_path, [np.zeros((8, 8), "f4")])
    grid = Grid((8, 8)).bind(ds)
    (tile,) = grid.tiles(0)
    s = Stitcher(grid, ds)
    s.add(np.ones((1, 8, 8)), index_of([tile]))
    with pytest.raises(ValueError, match="already complete"):
        s.add(np.ones((1, 8, 8)), index_of([tile]))
    np.testing.assert_array_equal(s.result()[0], np.ones((8, 8)))


def monai_importance_map(patch, sigma_scale=0.125):
    """MONAI's compute_importance_map("gaussian"), transcribed to numpy float32."""
    out = None
    for i, n in enumerate(patch):
        x = np.arange(-(n - 1) / 2.0, (n - 1) / 2.0 + 1, dtype=np.float32)
        x = np.exp(x**2 / (-2 * np.float32(n * sigma_scale) ** 2))
        out = x if i == 0 else out[..., None] * x
    return np.maximum(out, max(float(out.min()), 1e-3)).astype(np.float32)


@pytest.mark.parametrize("patch", [(7,), (8, 5), (16, 16, 9), (128, 128, 128)])
def test_the_gaussian_map_is_monais(patch):
    np.testing.assert_allclose(importance_map(patch, "gaussian"), monai_importance_map(patch), rtol=1e-6)
    assert importance_map(patch).sum() == math.prod(patch)


def test_bad_arguments(tmp_path):
    ds = dataset(tmp_path, [np.zeros((8, 8), "f4")])
    with pytest.raises(ValueError, match="weights must be one of"):
        Stitcher(Grid((4, 4)), ds, weights="max")
    with pytest.raises(ValueError, match="sigma_scale"):
        Stitcher(Grid((4, 4)), ds, weights="gaussian", sigma_scale=-1)
    with pytest.raises(TypeError, match="floating"):
        Stitcher(Grid((4, 4)), ds, dtype="int32")
    with pytest.raises(TypeError, match=r"e.g. \(2,\)"):
        Stitcher(Grid((4, 4)), ds, channels=2)
    with pytest.raises(TypeError, match="Grid"):
        Stitcher(object(), ds)


def stitch_in_bucket(s3, out):
    """One object of the dataset's bucket stitched (its own values) into ``out`` under the same prefix."""
    space = s3.space()
    x = np.random.default_rng(7).random((10, 9)).astype("f4")
    s3.put_npy(f"{space}/in/scan.npy", x)
    ds = npydask.open_dataset(f"s3://{space}/in", storage_options=s3.options)
    grid = Grid((4, 4)).bind(ds)
    tiles = grid.tiles(0)
    s = Stitcher(grid, ds, weights="gaussian", out=f"s3://{space}/{out}")
    feed(s, tiles, {t: tile_of(x, t) for t in tiles}, 4)
    return space, x, s.result()


def test_out_in_the_datasets_bucket_gets_one_object_per_file(s3):
    space, x, result = stitch_in_bucket(s3, "out")
    assert result == [f"s3://{space}/out/scan.npy"]
    np.testing.assert_allclose(np.load(io.BytesIO(s3.get(f"{space}/out/scan.npy"))), x, rtol=1e-6)


def test_out_zarr_gets_one_array_per_file(tmp_path):
    zarr = pytest.importorskip("zarr")
    wanted, results = stitch_two_files(tmp_path, str(tmp_path / "out.zarr"))
    group = zarr.open_group(npydask.zarr_store(str(tmp_path / "out.zarr")), mode="r")
    assert sorted(group.array_keys()) == ["00", "01"]
    for name, got, want in zip(["00", "01"], results, wanted):
        np.testing.assert_allclose(group[name][:], want, rtol=1e-6)
        np.testing.assert_allclose(got[:], want, rtol=1e-6)


def test_out_zarr_in_the_datasets_bucket(s3):
    zarr = pytest.importorskip("zarr")
    space, x, _ = stitch_in_bucket(s3, "out.zarr")
    store = npydask.zarr_store(f"s3://{space}/out.zarr", s3.options, read_only=True)
    np.testing.assert_allclose(zarr.open_array(store, path="scan", mode="r")[:], x, rtol=1e-6)


@pytest.mark.parametrize("bad", ["stop", "foreign", "twice_in_batch", "already_added", "skips_a_row", "dtype"])
def test_a_batch_is_checked_whole_before_any_tile_is_applied(tmp_path, bad):
    """A batch refused at its middle tile leaves nothing applied: the corrected batch is then accepted."""
    rng = np.random.default_rng(8)
    x = rng.random((14, 10)).astype("f4")
    ds = dataset(tmp_path, [x])
    grid = Grid((6, 6), overlap=0.5).bind(ds)
    tiles = grid.tiles(0)
    outputs = {t: rng.random((6, 6)).astype("f4") for t in tiles}
    s = Stitcher(grid, ds, weights="gaussian")
    feed(s, tiles[:2], outputs, 2)
    part = tiles[2:9]  # ends a row and starts the next: applying its first tiles would flush planes
    batch, index = np.stack([outputs[t] for t in part]), index_of(part)
    wrong = {k: v.copy() for k, v in index.items()}
    if bad == "stop":
        wrong["stop"][3] += 1
    elif bad == "foreign":
        wrong["start"][3] += 1
        wrong["stop"][3] += 1
    elif bad == "twice_in_batch":
        wrong["start"][5], wrong["stop"][5] = wrong["start"][1], wrong["stop"][1]
    elif bad == "already_added":
        wrong["start"][3], wrong["stop"][3] = tiles[0].start, tiles[0].stop
    elif bad == "skips_a_row":
        wrong["start"][3], wrong["stop"][3] = tiles[-1].start, tiles[-1].stop
    held = {f: s.sums.copy() for f, s in s._slabs.items()}
    with pytest.raises((ValueError, TypeError)):
        s.add(batch.astype(np.complex64) if bad == "dtype" else batch, wrong)
    assert {f: s.sums for f, s in s._slabs.items()}.keys() == held.keys()
    for f, sums in held.items():
        np.testing.assert_array_equal(s._slabs[f].sums, sums)  # nothing of the refused batch was applied
    feed(s, part, outputs, len(part))
    feed(s, tiles[9:], outputs, 4)
    np.testing.assert_allclose(
        s.result()[0], oracle(x.shape, tiles, outputs, importance_map((6, 6), "gaussian")), rtol=1e-5
    )


def test_the_state_is_one_slab_however_many_tiles_a_file_has(tmp_path):
    """Bookkeeping counts tiles by rows: the first add costs about a slab, not a record of each of the 4096 tiles."""
    import tracemalloc

    x = np.random.default_rng(9).random((48, 48, 48)).astype("f4")
    (tmp_path / "in").mkdir()
    ds = dataset(tmp_path / "in", [x])
    grid = Grid((4, 4, 4), overlap=0.25).bind(ds)
    tiles = grid.tiles(0)
    assert len(tiles) == 16**3
    rng = np.random.default_rng(10)
    outputs = {t: rng.random((4, 4, 4)).astype("f4") for t in tiles}
    s = Stitcher(grid, ds, out=tmp_path / "out")
    first = np.stack([outputs[t] for t in tiles[:16]])
    index = index_of(tiles[:16])
    slab = 2 * 4 * 48 * 48 * 4  # the sums and the weights of a tile's depth of planes
    tracemalloc.start()
    try:
        s.add(first, index)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * slab, (peak, slab)
    feed(s, tiles[16:], outputs, 64)
    np.testing.assert_allclose(np.load(s.result()[0]), oracle(x.shape, tiles, outputs, np.ones((4, 4, 4))), rtol=1e-5)


SERVER = """
import os, signal, sys, time
import numpy as np, npydask
from npydask.samplers import Grid, Stitcher
try:
    import zarr  # (imported once here, before the forks)
    import npydask.samplers._remote_zarr as remote
except ImportError:
    remote = None

def die_at_copy(n):
    copy, done = remote._copy, []

    def copy_or_die(*args):
        done.append(1)
        if len(done) == n:
            os.kill(os.getpid(), signal.SIGKILL)
        copy(*args)

    remote._copy = copy_or_die

def run(src, out, die=None):
    if die is not None and remote is not None:
        die_at_copy(int(die))  # (killed at that server-side copy: while publishing an array in object storage)
    ds = npydask.open_dataset(src)
    grid = Grid((4, 8, 8), overlap=0.5).bind(ds)
    s = Stitcher(grid, ds, out=out)
    for f in range(grid.n_files):
        x = np.load(ds.files[f])
        for t in grid.tiles(f):
            s.add(x[None, t.start[0] : t.stop[0]] + 1, {"file": [f], "start": [t.start], "stop": [t.stop]})
            print("go", flush=True)
            time.sleep(0.005)
    s.result()

for line in sys.stdin:
    if line == "reap\\n":
        os.waitpid(pid, 0)
        print("gone", flush=True)
        continue
    pid = os.fork()
    if pid == 0:
        try:
            run(*line.rstrip("\\n").split("\\t"))
        finally:
            os._exit(0)
    print(pid, flush=True)
"""
"""Imports once, then per line ``<dataset folder>\\t<out>`` forks a run writing the dataset's values + 1 into out.

A third field ``\\t<n>`` has the run kill itself at its ``n``-th server-side copy.

The run is reaped on the line ``reap``, so its pid is not reused before the test has killed it.
"""


def serve(env):
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, **env, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    yield server
    assert server.stdin is not None
    server.stdin.close()
    server.wait(10)


@pytest.fixture(scope="module")
def stitch_server():
    yield from serve({})


@pytest.fixture(scope="module")
def remote_stitch_server(s3_server):
    """The stitching server with the S3 server's credentials in its environment (for an ``s3://`` out)."""
    yield from serve(s3_server.env())


def kill_a_run(server, line, delay):
    """Start a run of the server (``line``), wait for its first tile, SIGKILL it after ``delay`` s and reap it.

    With ``delay=None`` the run is left to end (or kill itself) before it is reaped.
    """
    import signal

    assert server.stdin is not None and server.stdout is not None
    server.stdin.write(line + "\n")
    server.stdin.flush()
    pid, going = None, False
    while pid is None or not going:  # its pid, and "go": its first tile is added
        got = server.stdout.readline()
        assert got, "the stitching server ended"
        going = going or got == "go\n"
        pid = int(got) if got.strip().isdigit() else pid
    if delay is not None:
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)  # (a run that ended is not yet reaped: the signal finds no one)
    server.stdin.write("reap\n")
    server.stdin.flush()
    while server.stdout.readline() not in ("gone\n", ""):
        pass


def temporaries(out):
    """Everything a Stitcher run leaves besides its results: temporary files, groups, arrays set aside."""
    import glob

    return sorted(
        glob.glob(os.path.join(glob.escape(os.path.dirname(out)), ".*npydask-tmp"))
        + glob.glob(os.path.join(glob.escape(out), ".*npydask-tmp"))
    )


def results_at(out, names):
    if out.endswith(".zarr"):
        import zarr

        group = zarr.open_group(npydask.zarr_store(out), mode="r")
        return [group[n.removesuffix(".npy")][:] for n in names]
    return [np.load(os.path.join(out, n)) for n in names]


@pytest.mark.parametrize("kind", ["npy", "zarr"])
def test_a_killed_run_keeps_the_old_result_and_the_next_run_removes_its_temporaries(tmp_path, kind, stitch_server):
    """SIGKILL at random points while a run writes: each file at out is the old result or the new one, whole."""
    if kind == "zarr":
        pytest.importorskip("zarr")
    rng = np.random.default_rng(11)
    arrays = [rng.random((24, 8, 8)).astype("f4") for _ in range(2)]
    (tmp_path / "in").mkdir()
    ds = dataset(tmp_path / "in", arrays)
    out = str(tmp_path / ("out.zarr" if kind == "zarr" else "out"))
    names = ["00.npy", "01.npy"]
    grid = Grid((4, 8, 8), overlap=0.5).bind(ds)
    tiles = all_tiles(grid)
    feed(Stitcher(grid, ds, out=out), tiles, {t: tile_of(arrays[t.file], t) for t in tiles}, 7)  # the old result
    left = []
    for delay in [0.0, *rng.uniform(0.0, 0.2, 3)]:
        kill_a_run(stitch_server, f"{tmp_path / 'in'}\t{out}", delay)
        left.append(temporaries(out))
        for got, old in zip(results_at(out, names), arrays):
            assert got.shape == old.shape
            assert np.array_equal(got, old) or np.allclose(got, old + 1, rtol=1e-6)  # never a mix
        Stitcher(grid, ds, out=out).close()  # the next run on out
        assert temporaries(out) == []
    assert left[0]  # killed while writing: a temporary was there to remove
    for got, old in zip(results_at(out, names), arrays):
        assert np.array_equal(got, old) or np.allclose(got, old + 1, rtol=1e-6)


@pytest.mark.parametrize("kind", ["npy", "zarr"])
def test_close_and_a_failing_with_block_drop_the_run_and_keep_the_old_result(tmp_path, kind):
    if kind == "zarr":
        pytest.importorskip("zarr")
    x = np.random.default_rng(12).random((12, 8)).astype("f4")
    (tmp_path / "in").mkdir()
    ds = dataset(tmp_path / "in", [x, x + 1])
    out = str(tmp_path / ("out.zarr" if kind == "zarr" else "out"))
    grid = Grid((4, 8)).bind(ds)
    tiles = all_tiles(grid)
    old = {t: tile_of([x, x + 1][t.file], t) for t in tiles}
    with Stitcher(grid, ds, out=out) as s:
        feed(s, tiles, old, 3)
        s.result()
    assert temporaries(out) == []
    new = {t: 2 * v for t, v in old.items()}
    s = Stitcher(grid, ds, out=out)
    feed(s, tiles[:2], new, 2)
    assert temporaries(out)
    s.close()
    s.close()
    assert temporaries(out) == []
    with pytest.raises(ValueError, match="closed"):
        feed(s, tiles[2:3], new, 1)

    def fails_midway():
        with Stitcher(grid, ds, out=out) as s:
            feed(s, tiles[: len(tiles) // 2 + 1], new, 1)  # file 0 complete and published, file 1 begun
            raise RuntimeError("model failed")

    with pytest.raises(RuntimeError, match="model failed"):
        fails_midway()
    assert temporaries(out) == []
    got = results_at(out, ["00.npy", "01.npy"])
    np.testing.assert_allclose(got[0], 2 * x, rtol=1e-6)
    np.testing.assert_array_equal(got[1], x + 1)


def test_out_over_the_datasets_own_files_is_refused_unless_overwrite(tmp_path):
    x = np.arange(64, dtype="f4").reshape(8, 8)
    ds = dataset(tmp_path, [x])
    grid = Grid((4, 4), overlap=0).bind(ds)
    for out in [tmp_path, str(tmp_path) + "/", tmp_path / "00.npy" / ".."]:
        with pytest.raises(ValueError, match=r"dataset's own folder.*another out=, or overwrite=True"):
            Stitcher(grid, ds, out=out)
    for sub in "ab":
        (tmp_path / sub).mkdir()
        np.save(tmp_path / sub / f"{sub}.npy", x)
    two = npydask.open_dataset(files=[str(tmp_path / "a" / "a.npy"), str(tmp_path / "b" / "b.npy")])
    with pytest.raises(ValueError, match=r"overwrite the dataset's file .*a/a.npy"):
        Stitcher(Grid((4, 4)), two, out=tmp_path / "a")
    with pytest.raises(ValueError, match=r"overwrite the dataset's file .*a/a.npy"):
        Stitcher(Grid((4, 4)), two, out=tmp_path / "out.zarr" / ".." / "a")
    tiles = grid.tiles(0)
    s = Stitcher(grid, ds, out=tmp_path, overwrite=True)
    feed(s, tiles, {t: 2 * tile_of(x, t) for t in tiles}, 4)
    np.testing.assert_array_equal(np.load(s.result()[0]), 2 * x)
    np.testing.assert_array_equal(np.load(tmp_path / "a" / "a.npy"), x)
    Stitcher(grid, ds, out=tmp_path / "pred")  # a folder beside or under the inputs is fine


@pytest.mark.parametrize("kind", ["npy", "zarr"])
def test_a_live_runs_temporaries_are_not_removed_by_another(tmp_path, kind):
    if kind == "zarr":
        pytest.importorskip("zarr")
    x = np.random.default_rng(13).random((12, 8)).astype("f4")
    (tmp_path / "in").mkdir()
    ds = dataset(tmp_path / "in", [x])
    out = str(tmp_path / ("out.zarr" if kind == "zarr" else "out"))
    grid = Grid((4, 8)).bind(ds)
    tiles = grid.tiles(0)
    outputs = {t: tile_of(x, t) for t in tiles}
    live = Stitcher(grid, ds, out=out)
    feed(live, tiles[:1], outputs, 1)
    held = temporaries(out)
    assert held
    Stitcher(grid, ds, out=out).close()
    assert temporaries(out) == held
    feed(live, tiles[1:], outputs, 2)
    np.testing.assert_allclose(results_at(out, ["00.npy"])[0], x, rtol=1e-6)
    assert temporaries(out) == []


def test_a_zarr_array_whose_replacement_fails_stays(tmp_path, monkeypatch):
    """Renaming the new array into the group fails after the old one was set aside: the old one is put back."""
    pytest.importorskip("zarr")
    from npydask.samplers import _outputs

    x = np.random.default_rng(14).random((12, 8)).astype("f4")
    (tmp_path / "in").mkdir()
    ds = dataset(tmp_path / "in", [x])
    out = str(tmp_path / "out.zarr")
    grid = Grid((4, 8)).bind(ds)
    tiles = grid.tiles(0)
    feed(Stitcher(grid, ds, out=out), tiles, {t: tile_of(x, t) for t in tiles}, 8)
    rename = os.rename

    def failing(src, dst):
        if not os.path.basename(os.path.dirname(src)).endswith(".npydask-tmp"):
            return rename(src, dst)  # (setting the old array aside, or putting it back)
        raise OSError(5, "Input/output error", src)

    monkeypatch.setattr(_outputs.os, "rename", failing)
    with Stitcher(grid, ds, out=out) as s, pytest.raises(OSError, match="Input/output"):
        feed(s, tiles, {t: 2 * tile_of(x, t) for t in tiles}, 8)
    monkeypatch.undo()
    np.testing.assert_allclose(results_at(out, ["00.npy"])[0], x, rtol=1e-6)
    assert temporaries(out) == []


def objects_under(s3, prefix):
    """The keys under ``bucket/prefix/`` (listed on the server)."""
    bucket, _, key = prefix.partition("/")
    pages = s3.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key + "/")
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def remote_arrays(s3, out, names):
    """Each array of the group ``out`` (an s3:// URL) read whole, or None where the group has none of that name."""
    import zarr

    group = zarr.open_group(npydask.zarr_store(out, s3.options, read_only=True), mode="r")
    return [group[n][:] if n in group else None for n in names]


def test_a_killed_run_leaves_a_zarr_array_in_object_storage_old_or_new_and_the_next_run_finishes(
    tmp_path, s3, remote_stitch_server, monkeypatch
):
    """SIGKILL while writing, and while publishing (between server-side copies): never a mix, never zeros.

    An array killed while being published is missing until the next run on
    out, which publishes it (its temporary was complete); then no temporary
    object is left under the group. (The killed run's lease is fresh: the
    next run, on the same machine, finds its process gone.)
    """
    pytest.importorskip("zarr")
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    rng = np.random.default_rng(15)
    arrays = [rng.random((24, 8, 8)).astype("f4") for _ in range(2)]
    (tmp_path / "in").mkdir()
    ds = dataset(tmp_path / "in", arrays)
    space = s3.space()
    out = f"s3://{space}/out.zarr"
    grid = Grid((4, 8, 8), overlap=0.5).bind(ds)
    tiles = all_tiles(grid)
    feed(Stitcher(grid, ds, out=out), tiles, {t: tile_of(arrays[t.file], t) for t in tiles}, 7)  # the old result
    seen = set()
    for delay, die in [(0.0, ""), (None, "\t1"), (None, "\t7"), *((d, "") for d in rng.uniform(0.05, 0.4, 2))]:
        kill_a_run(remote_stitch_server, f"{tmp_path / 'in'}\t{out}{die}", delay)
        left = [k for k in objects_under(s3, f"{space}/out.zarr") if "npydask-tmp" in k]
        for name, got, old in zip(["00", "01"], remote_arrays(s3, out, ["00", "01"]), arrays):
            if got is None:  # killed while publishing: its temporary is there, complete
                meta = [k for k in left if k.split("/")[-2].startswith(f".{name}.") and k.endswith("/zarr.json")]
                assert meta and b'"npydask_stitch"' in s3.get(f"{s3.bucket}/{meta[0]}")
                seen.add("missing")
                continue
            assert got.shape == old.shape
            assert np.array_equal(got, old) or np.allclose(got, old + 1, rtol=1e-6)  # never a mix, never zeros
            seen.add("old" if np.array_equal(got, old) else "new")
        Stitcher(grid, ds, out=out).close()  # the next run on out
        assert [k for k in objects_under(s3, f"{space}/out.zarr") if "npydask-tmp" in k] == []
        for got, old in zip(remote_arrays(s3, out, ["00", "01"]), arrays):
            assert got is not None and (np.array_equal(got, old) or np.allclose(got, old + 1, rtol=1e-6))
        if die:
            np.testing.assert_allclose(remote_arrays(s3, out, ["00"])[0], arrays[0] + 1, rtol=1e-6)  # rolled forward
    assert "missing" in seen and "old" in seen


def test_close_drops_a_remote_runs_temporaries_and_a_live_runs_are_kept(s3):
    """close() removes the run's temporary arrays and lease; another Stitcher leaves a live run's alone."""
    zarr = pytest.importorskip("zarr")
    space = s3.space()
    x = np.random.default_rng(16).random((12, 8)).astype("f4")
    s3.put_npy(f"{space}/in/scan.npy", x)
    ds = npydask.open_dataset(f"s3://{space}/in", storage_options=s3.options)
    out = f"s3://{space}/out.zarr"
    grid = Grid((4, 8)).bind(ds)
    tiles = grid.tiles(0)
    old = {t: tile_of(x, t) for t in tiles}
    feed(Stitcher(grid, ds, out=out), tiles, old, 8)
    before = objects_under(s3, f"{space}/out.zarr")

    def temporaries():
        return [k for k in objects_under(s3, f"{space}/out.zarr") if "npydask-tmp" in k]

    def fails_midway():
        with Stitcher(grid, ds, out=out) as s:
            feed(s, tiles[:2], {t: 2 * v for t, v in old.items()}, 1)
            assert temporaries()  # the temporary array and the lease
            raise RuntimeError("model failed")

    with pytest.raises(RuntimeError, match="model failed"):
        fails_midway()
    assert temporaries() == []
    assert objects_under(s3, f"{space}/out.zarr") == before
    live = Stitcher(grid, ds, out=out)
    feed(live, tiles[:2], {t: 2 * v for t, v in old.items()}, 1)
    held = temporaries()
    Stitcher(grid, ds, out=out).close()  # (its lease is fresh: the live run's temporaries stay)
    assert temporaries() == held
    feed(live, tiles[2:], {t: 2 * v for t, v in old.items()}, 2)
    assert temporaries() == []
    group = zarr.open_group(npydask.zarr_store(out, s3.options, read_only=True), mode="r")
    np.testing.assert_allclose(group["scan"][:], 2 * x, rtol=1e-6)
    assert {k.split("/")[2] for k in objects_under(s3, f"{space}/out.zarr")} == {"zarr.json", "scan"}


def test_a_remote_zarr_array_of_another_shape_is_replaced_whole_and_failed_runs_are_finished_or_dropped(
    s3, monkeypatch
):
    """Old chunks beyond the new shape go; a run whose temporaries went raises; a failed publication is finished.

    A run taken for dead by another (paused past its lease) finds its
    temporary array removed: it raises and the old array stays. A run whose
    copies fail leaves the array missing and its complete temporary, which
    the next run on out publishes.
    """
    zarr = pytest.importorskip("zarr")
    from npydask.samplers import _remote_zarr

    space = s3.space()
    x = np.random.default_rng(17).random((12, 8)).astype("f4")
    s3.put_npy(f"{space}/in/scan.npy", x)
    ds = npydask.open_dataset(f"s3://{space}/in", storage_options=s3.options)
    out = f"s3://{space}/out.zarr"
    store = npydask.zarr_store(out, s3.options)
    zarr.open_group(store, mode="a").create_array("scan", shape=(40, 20), chunks=(4, 8), dtype="f8")[:] = 7.0
    grid = Grid((4, 8)).bind(ds)
    tiles = grid.tiles(0)
    old = {t: tile_of(x, t) for t in tiles}
    feed(Stitcher(grid, ds, out=out), tiles, old, 8)
    group = zarr.open_group(npydask.zarr_store(out, s3.options, read_only=True), mode="r")
    np.testing.assert_allclose(group["scan"][:], x, rtol=1e-6)
    chunks = [k.split("/scan/", 1)[1] for k in objects_under(s3, f"{space}/out.zarr") if "/scan/" in k]
    depth = group["scan"].chunks[0]  # (a tile step)
    assert depth < 4 and sorted(chunks) == sorted(["zarr.json", *(f"c/{i}/0" for i in range(math.ceil(12 / depth)))])

    live = Stitcher(grid, ds, out=out)
    feed(live, tiles[:2], {t: 2 * v for t, v in old.items()}, 1)
    with monkeypatch.context() as m:
        m.setattr(_remote_zarr, "LEASE_S", -1.0)  # (as if the live run had been paused past its lease)
        Stitcher(grid, ds, out=out).close()
    with pytest.raises(FileNotFoundError, match="removed by another Stitcher"):
        feed(live, tiles[2:], {t: 2 * v for t, v in old.items()}, 2)
    live.close()
    np.testing.assert_allclose(group["scan"][:], x, rtol=1e-6)
    assert [k for k in objects_under(s3, f"{space}/out.zarr") if "npydask-tmp" in k] == []

    copy, copies = _remote_zarr._copy, []

    def fails_at_the_second(*args):
        copies.append(1)
        if len(copies) == 2:
            raise OSError(5, "Input/output error")
        copy(*args)

    monkeypatch.setattr(_remote_zarr, "_copy", fails_at_the_second)
    with Stitcher(grid, ds, out=out) as s, pytest.raises(OSError, match="Input/output"):
        feed(s, tiles, {t: 3 * v for t, v in old.items()}, 8)
    monkeypatch.undo()
    assert "scan" not in group  # (its old zarr.json was deleted: never old metadata over new chunks)
    Stitcher(grid, ds, out=out).close()  # the next run publishes the complete temporary
    np.testing.assert_allclose(group["scan"][:], 3 * x, rtol=1e-6)
    assert [k for k in objects_under(s3, f"{space}/out.zarr") if "npydask-tmp" in k] == []


def test_a_lease_is_taken_for_gone_only_for_a_missing_process_of_this_machine_and_pid_namespace():
    import json
    import subprocess

    from npydask.samplers._remote_zarr import _gone, _identity

    me = json.loads(_identity())
    if not me:  # (no /proc: only a stale lease counts)
        assert not _gone(b'{"pid": 999999999}')
        return
    ended = subprocess.Popen(["true"])
    ended.wait()
    assert _gone(json.dumps({**me, "pid": ended.pid}).encode())
    assert not _gone(_identity())  # this process
    for other in [{"boot": "another machine"}, {"pidns": "pid:[1]"}, {"pid": "1"}]:
        assert not _gone(json.dumps({**me, "pid": ended.pid, **other}).encode()), other
    assert not _gone(b"not json") and not _gone(b"[]")
