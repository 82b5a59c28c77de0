"""The ROI cost model (pure) and its three strategies (spans, runs, mapped), each forced, against numpy."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import npydask
from npydask import config
from npydask.backends import get as get_backend
from npydask.dataset.stacking import FileGroup
from npydask.errors import FileChangedError, NpyFormatError
from npydask.format.header import NpyHeader
from npydask.plan.read_strategy import MEASURED, STRATEGIES, Costs, choose, estimate, measure_shape, touched_blocks
from npydask.plan.region import Box, plan_read
from npydask.reader import FileRef, choose_backend, read_region
from npydask.storage import HeaderCheck, _handles, pread_strategy
from npydask.storage._iovec import iov_layout, read_iovecs
from npydask.testing.strategies import arrays, assert_same_array, dtypes, region_slices, regions, save_npy, shapes

P3 = NpyHeader((1, 0), (64, 256, 256), np.dtype("<f4"), False, 128, 64 * 256 * 256 * 4)
P3_BOX = Box((16, 100, 100), (48, 132, 132))
GAP, SPAN = 4096, 64 << 20


def costs(**changes: float) -> Costs:
    """The measured costs with some coefficients changed."""
    values = {f: getattr(MEASURED, f) for f in MEASURED.__dataclass_fields__}
    values.update(changes)
    return Costs(**values)


# --------------------------------------------------------------------------
# The model: pure planning, no files


def brute_blocks(header: NpyHeader, box: Box, block: int) -> int:
    plan = plan_read(header, box)
    touched = set()
    for run in plan.runs():
        touched.update(range(run.offset // block, (run.offset + run.length - 1) // block + 1))
    return len(touched)


def test_p3_counts() -> None:
    plan = plan_read(P3, P3_BOX)
    shape = measure_shape(plan, GAP, SPAN)
    assert (shape.n_spans, shape.runs_per_span, shape.n_runs) == (32, 32, 1024)
    assert shape.read_bytes == 32 * (31 * 1024 + 128)  # whole plane spans: 8x the 4 KiB each plane delivers
    assert shape.nbytes == 32**3 * 4
    assert shape.n_iovecs == 32 * 63 and shape.n_preadv == 32
    assert shape.pages == brute_blocks(P3, P3_BOX, 4096)
    assert shape.windows == brute_blocks(P3, P3_BOX, 65536)


def test_p3_choice_follows_the_coefficients() -> None:
    plan = plan_read(P3, P3_BOX)
    # Costly page faults (this machine): the plane spans.
    assert choose(plan, GAP, SPAN, costs=costs(fault=5000, page=250, map=6000)).strategy == "spans"
    # Free faults and mappings: copying only the ROI's bytes wins.
    assert choose(plan, GAP, SPAN, costs=costs(fault=0, page=0, map=0)).strategy == "mapped"
    # Free iovecs, costly user copies: scattering straight into the result wins.
    assert choose(plan, GAP, SPAN, costs=costs(iovec=0, copy_byte=1.0, fault=1e6)).strategy == "runs"
    # The choice is the cheapest estimate among those allowed.
    c = choose(plan, GAP, SPAN)
    assert c.estimates_ns[c.strategy] == min(c.estimates_ns.values())
    assert choose(plan, GAP, SPAN, ("spans", "runs")).strategy in ("spans", "runs")


@pytest.mark.parametrize(
    ("shape", "box", "want"),
    [
        # long rows, small gaps: the spans' second copy costs more than two iovecs per row
        ((8, 64, 4096), Box((0, 0, 16), (8, 64, 4096)), "runs"),
        # one run per span (gaps over gap_bytes): read in place either way, spans wins the tie
        ((64, 4096), Box((0, 0), (64, 2048)), "spans"),
        # a 32^3 ROI of 256x256 planes: spans on this machine (faults cost ~5 us)
        ((64, 256, 256), Box((16, 100, 100), (48, 132, 132)), "spans"),
    ],
)
def test_choice_for_a_few_shapes(shape: tuple[int, ...], box: Box, want: str) -> None:
    h = NpyHeader((1, 0), shape, np.dtype("<f4"), False, 128, math.prod(shape) * 4)
    assert choose(plan_read(h, box), GAP, SPAN).strategy == want


def test_estimate_formula() -> None:
    c = Costs(
        syscall=1, kernel_byte=2, iovec=3, copy_call=4, copy_row=5, copy_byte=6, mapped_byte=7, map=8, fault=9, page=10
    )
    shape = measure_shape(plan_read(P3, P3_BOX), GAP, SPAN)
    e = estimate(shape, c)
    cut = 4 + 1024 * 5
    assert e["spans"] == 32 * 1 + shape.read_bytes * 2 + cut + shape.nbytes * 6
    assert e["runs"] == 32 * 1 + shape.read_bytes * 2 + 32 * 63 * 3
    assert e["mapped"] == 8 + 1 + shape.windows * 9 + shape.pages * 10 + cut + shape.nbytes * 7


def test_forced_strategy_and_refusals() -> None:
    plan = plan_read(P3, P3_BOX)
    for s in STRATEGIES:
        got = choose(plan, GAP, SPAN, forced=s)
        assert got.strategy == s and got.forced
    with pytest.raises(ValueError, match=r"roi_strategy='mapped'.*\['spans', 'runs'\]"):
        choose(plan, GAP, SPAN, ("spans", "runs"), forced="mapped")


@given(shape=shapes(min_dims=1, max_dims=4, max_elements=3000, max_side=40), data=st.data())
def test_touched_blocks_exact(shape: tuple[int, ...], data: st.DataObject) -> None:
    itemsize = data.draw(st.sampled_from([1, 2, 4, 8, 12]))
    h = NpyHeader((1, 0), shape, np.dtype(f"V{itemsize}"), data.draw(st.booleans()), 64, math.prod(shape) * itemsize)
    start, stop = data.draw(regions(shape))
    box = Box(*[tuple(s.indices(n)[i] for s, n in zip(region_slices(shape, start, stop), shape)) for i in (0, 1)])
    block = data.draw(st.sampled_from([16, 64, 4096]))
    assert touched_blocks(plan_read(h, box), block) == brute_blocks(h, box, block)


def test_touched_blocks_estimate_for_huge_grids() -> None:
    h = NpyHeader((1, 0), (512, 512, 512), np.dtype("u1"), False, 0, 512**3)
    plan = plan_read(h, Box((0, 0, 0), (512, 512, 1)))  # 262,144 runs of one byte: estimated
    assert touched_blocks(plan, 4096) == 512 * 64  # a plane is 64 pages, and its column touches each
    assert touched_blocks(plan, 1 << 30) == 1  # capped at the blocks the region spans


def test_iov_layout_splits_long_spans() -> None:
    h = NpyHeader((1, 0), (1200, 3), np.dtype("u1"), False, 64, 3600)
    lay = iov_layout(plan_read(h, Box((0, 0), (1200, 1))), GAP, SPAN)
    assert lay.counts == (500, 500, 200)  # (Linux takes at most 1024 iovecs per call)
    assert lay.offsets == (64, 64 + 1500, 64 + 3000)
    assert lay.first_runs == (0, 500, 1000)
    assert [len(g) for g in lay.gaps] == [499, 499, 199]


# --------------------------------------------------------------------------
# Every strategy, forced, gives numpy's data


def _slices(shape: tuple[int, ...], start: object, stop: object) -> tuple[Box, tuple[slice, ...]]:
    index = region_slices(shape, start, stop)
    box = Box(tuple(s.start for s in index), tuple(s.stop for s in index))
    return box, index


_names = iter(range(1 << 30))


@pytest.mark.parametrize("strategy", STRATEGIES)
@settings(max_examples=40)
@given(
    a=arrays(dtypes(), shapes(max_dims=4, max_elements=600, max_side=12), max_nbytes=1 << 14),
    order=st.sampled_from(["C", "F"]),
    gap=st.sampled_from([0, 16, 4096]),
    data=st.data(),
)
def test_each_strategy_matches_numpy(tmp_path, strategy, a, order, gap, data) -> None:
    path = save_npy(tmp_path / f"a{next(_names)}.npy", a, order=order)
    start, stop = data.draw(regions(a.shape))
    want = np.load(path)[region_slices(a.shape, start, stop) + (...,)]
    backend = {"mapped": "mmap", "spans": "pread", "runs": "pread"}[strategy]
    with config.set(roi_strategy=strategy, gap_bytes=gap):
        for name in ("auto", backend):
            got = read_region(path, start, stop, backend=name)
            assert_same_array(got, np.array(want, order="C"))
            assert got.flags.c_contiguous
    _handles.clear_cache()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_strategy_is_the_one_used(save, strategy, monkeypatch) -> None:
    """The forced strategy is the code that runs (its executor is called), and its bytes are numpy's."""
    a = np.arange(40 * 50 * 3, dtype=">i4").reshape(40, 50, 3)
    path = save(a)
    calls = []
    import npydask.backends.mmap as mmap_mod
    import npydask.storage._local_read as pread_mod

    real = {"runs": pread_mod.read_iovecs, "spans": pread_mod.read_plan, "mapped": mmap_mod.copy_runs}
    for name, module in (("runs", pread_mod), ("spans", pread_mod), ("mapped", mmap_mod)):
        attr = {"runs": "read_iovecs", "spans": "read_plan", "mapped": "copy_runs"}[name]
        monkeypatch.setattr(module, attr, lambda *args, _n=name, **kw: (calls.append(_n), real[_n](*args, **kw))[1])
    with config.set(roi_strategy=strategy):
        got = read_region(path, (3, 5, 1), (30, 40, 2), backend="auto")
    np.testing.assert_array_equal(got, a[3:30, 5:40, 1:2])
    assert calls == [strategy]


@pytest.mark.parametrize("strategy", ["auto", *STRATEGIES])
@pytest.mark.parametrize("dtype", ["<f4", ">i2", "u1", [("a", "<u2"), ("b", ">f8", (2,))]])
@pytest.mark.parametrize("order", ["C", "F"])
def test_dataset_rois_each_strategy(tmp_path, strategy, dtype, order) -> None:
    """Stacks of ROIs (inside, padded, empty, touching the end of the file) equal numpy under every strategy."""
    rng = np.random.default_rng(5)
    shape = (9, 11, 13)
    files = []
    for i in range(7):
        raw = rng.integers(0, 256, math.prod(shape) * np.dtype(dtype).itemsize, dtype=np.uint8)
        full = raw.view(dtype).reshape(shape)
        path = tmp_path / f"v{i}.npy"
        np.save(path, np.array(full, order=order))
        files.append(np.load(path))
    cases = [
        dict(roi_start=[2, 3, 4], roi_shape=[5, 6, 7]),  # inside
        dict(roi_start=[4, 5, 6], roi_end=[9, 11, 13]),  # touching the end of the file
        dict(roi_start=[3, 3, 3], roi_shape=[0, 4, 4], out_of_bounds_policy="trim_to_shape"),  # empty
    ]
    if np.dtype(dtype).names is None:
        cases.append(dict(roi_start=[-2, 8, 1], roi_shape=[6, 6, 5], out_of_bounds_policy="pad", fill_value=7))
    with config.set(roi_strategy=strategy):
        for kw in cases:
            ds = npydask.open_dataset(str(tmp_path), **kw)
            x = ds.stack()
            got = x.compute()
            single = ds[3].compute()
            want = np.stack([_cut(f, kw) for f in files])
            assert got.shape == want.shape and got.dtype == x.dtype == want.dtype  # (fields' byte order included)
            assert_same_array(got, want)
            assert_same_array(single, np.array(want[3], dtype=np.dtype(dtype)))
            for axis in (0, 1):  # the joined files: along axis 0 straight into place, along 1 by a copy
                joined = ds.concatenate(axis)
                assert_same_array(joined.compute(), np.concatenate(list(want), axis=axis))
                assert_same_array(joined[2:9].compute(), np.concatenate(list(want), axis=axis)[2:9])
            _handles.clear_cache()


def _cut(full: np.ndarray, kw: dict) -> np.ndarray:
    """numpy's ROI (with DALI's padding)."""
    start = kw["roi_start"]
    end = kw.get("roi_end") or [a + n for a, n in zip(start, kw["roi_shape"])]
    out = np.full([b - a for a, b in zip(start, end)], kw.get("fill_value", 0), full.dtype)
    inner = tuple(slice(max(a, 0), min(b, n)) for a, b, n in zip(start, end, full.shape))
    where = tuple(slice(s.start - a, s.stop - a) for s, a in zip(inner, start))
    out[where] = full[inner]
    return out


def test_runs_across_several_preadv(save) -> None:
    a = np.arange(1500 * 3, dtype="u1").reshape(1500, 3)
    path = save(a)
    with config.set(roi_strategy="runs"):
        np.testing.assert_array_equal(read_region(path, (0, 1), (1500, 2)), a[:, 1:2])


# --------------------------------------------------------------------------
# Settings and refusals


def test_forced_strategy_the_backend_cannot_use(save) -> None:
    path = save(np.arange(600, dtype="<f4").reshape(20, 30))
    with config.set(roi_strategy="mapped"):
        with pytest.raises(ValueError, match="roi_strategy='mapped'.*backend='pread' never maps"):
            read_region(path, (0, 0), (20, 3), backend="pread")
        np.testing.assert_array_equal(read_region(path, (0, 0), (1, 30), backend="pread"), np.load(path)[:1])  # one run
    for strategy in ("spans", "runs"):
        with config.set(roi_strategy=strategy), pytest.raises(ValueError, match=f"roi_strategy='{strategy}'"):
            read_region(path, (0, 0), (20, 3), backend="mmap")
    with config.set(roi_strategy="runs", direct_io=True), pytest.raises(ValueError, match="direct_io reads spans only"):
        read_region(path, (0, 0), (20, 3), backend="pread")


def test_setting_and_env_twin(monkeypatch) -> None:
    assert config.get("roi_strategy") == "auto"
    monkeypatch.setenv("NPYDASK_ROI_STRATEGY", "Runs")
    assert config.get("roi_strategy") == "runs" and config.read_options().roi_strategy == "runs"
    monkeypatch.setenv("NPYDASK_ROI_STRATEGY", "bogus")
    with pytest.raises(ValueError, match=r"NPYDASK_ROI_STRATEGY='bogus'.*'auto', 'spans', 'runs', 'mapped'"):
        config.get("roi_strategy")
    with pytest.raises(ValueError, match="roi_strategy"):
        config.set(roi_strategy="fast")
    with pytest.raises(TypeError, match="roi_strategy"):
        config.set(roi_strategy=1)


def test_choose_backend_follows_the_model(save, monkeypatch) -> None:
    f = _handles.acquire(save(np.zeros((64, 256, 256), "<f4")))
    plan = plan_read(f.header, P3_BOX)
    want = {"spans": "pread", "runs": "pread", "mapped": "mmap"}
    for strategy in STRATEGIES:
        with config.set(roi_strategy=strategy):
            assert choose_backend("auto", f, plan, None, options=config.read_options()).name == want[strategy]
    auto = choose(plan, GAP, SPAN).strategy
    assert choose_backend("auto", f, plan, None, options=config.read_options()).name == want[auto]
    monkeypatch.setattr(f, "local", False)  # never mapped off local file systems
    assert choose_backend("auto", f, plan, None, options=config.read_options(roi_strategy="mapped")).name == "pread"
    with config.set(roi_strategy="runs"):
        assert pread_strategy(plan, config.read_options()) == "runs"


# --------------------------------------------------------------------------
# Identity and header checks still fire on every path


def _dataset(tmp_path, n: int = 4) -> tuple[npydask.NpyDataset, list[str]]:
    for i in range(n):
        np.save(tmp_path / f"v{i}.npy", np.full((16, 32, 32), i, "<f4"))
    ds = npydask.open_dataset(str(tmp_path), roi_start=[2, 3, 4], roi_shape=[8, 9, 10])
    return ds, ds.files


def _rewrite(path: str) -> None:
    """Same size, other bytes, a later mtime."""
    st = os.stat(path)
    np.save(path, np.full((16, 32, 32), 99, "<f4"))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000))


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("how", ["stack", "single"])
def test_changed_file_fails_on_every_path(tmp_path, strategy, how) -> None:
    ds, files = _dataset(tmp_path)
    with config.set(roi_strategy=strategy):
        x = ds.stack() if how == "stack" else ds[2]
        x.compute()  # (files now cached: the check must not rely on a fresh open)
        _rewrite(files[2])
        with pytest.raises(FileChangedError, match="v2.npy"):
            x.compute()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_header_check_fires_on_every_path(tmp_path, strategy) -> None:
    ds, files = _dataset(tmp_path)
    views = [v for v in ds.views]
    bad = HeaderCheck(b"\x93NUMPY other header", "the first file's header", "open it with headers='all'")
    views[1] = type(views[1])(views[1].ref._replace(check=bad), views[1].roi)
    group = FileGroup(views, 0, True)
    with config.set(roi_strategy=strategy):
        with pytest.raises(NpyFormatError, match="v1.npy"):
            group[0:4]
        with pytest.raises(NpyFormatError, match="v1.npy"):
            views[1][0:8]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_truncated_file_fails_every_strategy(save, strategy) -> None:
    """Truncated after opening: FileChangedError naming the file, never SIGBUS or other data."""
    path = save(np.arange(40 * 50 * 4, dtype="<f8").reshape(40, 50, 4))
    f = _handles.acquire(path)
    plan = plan_read(f.header, Box((30, 10, 1), (40, 50, 3)))
    os.truncate(path, f.identity.size - 4096)
    options = config.read_options(roi_strategy=strategy)
    backend = get_backend("mmap" if strategy == "mapped" else "pread")
    with pytest.raises(FileChangedError, match="truncated") as info:
        backend.read(f, plan, options)
    assert path in str(info.value)
    if strategy == "runs":  # the executor itself, short reads included
        raw = np.empty(plan.nbytes, np.uint8)
        with pytest.raises(FileChangedError, match="truncated"):
            read_iovecs(f.fd, f.path, plan, 4096, SPAN, raw)


def test_file_ref_reads_each_strategy(save) -> None:
    a = np.arange(30 * 40, dtype="<i8").reshape(30, 40)
    ref = FileRef.open(save(a))
    for strategy in STRATEGIES:
        with config.set(roi_strategy=strategy):
            ref2 = ref._replace(options=config.read_options())
            np.testing.assert_array_equal(ref2.read(Box((1, 2), (29, 7))), a[1:29, 2:7])
