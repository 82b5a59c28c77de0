"""npydask.graph.build: the one-layer graph built directly equals dask's from_array, under either array engine.

CI runs this file under both engines (legacy, and ``DASK_ARRAY__QUERY_PLANNING=True``).
"""

from __future__ import annotations

import pickle
import subprocess
import sys

import dask
import dask.array as da
import numpy as np
import pytest
from dask.array.utils import assert_eq
from hypothesis import given
from hypothesis import strategies as st

from npydask.graph import build as graph
from npydask.graph.tasks import chunk_tasks
from npydask.plan.chunks import auto_chunks, regular_grid


class Source:
    """A small array-like such as npydask's: a token, no ``copy``, reads by slices."""

    def __init__(self, values: np.ndarray, token: str = "source") -> None:
        self.values = values
        self.token = token

    shape = property(lambda self: self.values.shape)
    dtype = property(lambda self: self.values.dtype)
    ndim = property(lambda self: self.values.ndim)

    def __getitem__(self, index):
        return self.values[index]

    def __dask_tokenize__(self):
        return ("test-source", self.token)

    def __repr__(self) -> str:
        return f"Source({self.token})"


GRIDS = [
    ((4, 4, 2), (3, 2)),  # several chunks a side
    ((10,), (5,)),  # one chunk
    ((0,), (5,)),  # an empty axis
    (),  # 0-d
]


def values_for(chunks):
    shape = tuple(sum(c) for c in chunks)
    return np.arange(int(np.prod(shape)), dtype="f4").reshape(shape)


def build(chunks, inline=True, name="npy-test"):
    source = Source(values_for(chunks))
    meta = np.empty((0,) * len(chunks), source.dtype)
    return source, graph.chunk_array(source, chunks, name + str(inline), meta, inline=inline)


def from_array(source, chunks, inline, name):
    meta = np.empty((0,) * len(chunks), source.dtype)
    return da.from_array(source, chunks=chunks, name=name, fancy=False, inline_array=inline, meta=meta, asarray=False)


def test_this_dask_takes_the_direct_build():
    """The one-time check against from_array passes on the dask the project pins, so the fast path is what runs."""
    build(((2, 1),))
    assert graph._builder is not None
    assert graph._builder is not graph._through_from_array
    assert graph._builder.__module__ == ("npydask.graph._expr" if graph.query_planning() else "npydask.graph._legacy")


def test_the_one_time_check_imports_no_scheduler(tmp_path):
    """A process's first from_npy makes the check without ``compute``, which imports ``distributed`` (5 MB of code)."""
    path = tmp_path / "a.npy"
    np.save(path, np.arange(12.0).reshape(3, 4))
    code = (
        "import sys, npydask\n"
        f"x = npydask.from_npy({str(path)!r}, chunks=2)\n"
        "from npydask.graph import build as graph\n"
        "assert graph._builder is not graph._through_from_array\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'distributed'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_query_planning_is_the_engine_dask_array_exports():
    assert graph.query_planning() == da.array_expr_enabled()


@pytest.mark.parametrize("inline", [True, False])
@pytest.mark.parametrize("chunks", GRIDS, ids=str)
def test_same_graph_as_from_array(chunks, inline):
    source, x = build(chunks, inline)
    theirs = from_array(source, chunks, inline, x.name)
    assert graph._canonical(x) == graph._canonical(theirs)
    assert x.chunks == theirs.chunks and x.dtype == theirs.dtype and type(x._meta) is type(theirs._meta)
    assert_eq(x, source.values, check_chunks=True)
    assert_eq(x, theirs)


@pytest.mark.parametrize("inline", [True, False])
def test_one_layer_named_as_given(inline):
    source, x = build(((4, 4, 2), (3, 2)), inline)
    keys = set(dict(x.__dask_graph__()))
    blocks = {(x.name, i, j) for i in range(3) for j in range(2)}
    assert keys == (blocks if inline else blocks | {"original-" + x.name})
    if graph.query_planning():
        assert not x.expr.dependencies()  # a leaf expression
        assert type(x.expr).__name__ == "NpyChunks"
    else:
        layers = x.dask.layers
        assert list(layers) == ([x.name] if inline else ["original-" + x.name, x.name])
        assert x.dask.dependencies[x.name] == (set() if inline else {"original-" + x.name})


@pytest.mark.parametrize("inline", [True, False])
def test_pickles_and_computes_after(inline):
    source, x = build(((4, 4, 2), (3, 2)), inline)
    y = pickle.loads(pickle.dumps(x))
    assert y.name == x.name and y.chunks == x.chunks
    np.testing.assert_array_equal(y.compute(), source.values)
    tasks = pickle.loads(pickle.dumps(dict(x.__dask_graph__())))
    assert set(tasks) == set(dict(x.__dask_graph__()))


@pytest.mark.parametrize("inline", [True, False])
def test_culling_reads_only_the_chunks_asked_for(inline):
    reads = []

    class Counting(Source):
        def __getitem__(self, index):
            reads.append(index)
            return super().__getitem__(index)

    chunks = ((4, 4, 2), (3, 2))
    source = Counting(values_for(chunks))
    x = graph.chunk_array(source, chunks, f"npy-cull-{inline}", np.empty((0, 0), "f4"), inline=inline)
    np.testing.assert_array_equal(x[5:7, 4].compute(scheduler="sync"), source.values[5:7, 4])
    assert reads == [(slice(4, 8, None), slice(3, 5, None))]
    # dask's optimisation keeps what from_array's array keeps (under query planning: every chunk, culled later)
    theirs = from_array(source, chunks, inline, x.name)
    (mine_part,), (their_part,) = dask.optimize(x[:4]), dask.optimize(theirs[:4])
    assert len(dict(mine_part.__dask_graph__())) == len(dict(their_part.__dask_graph__()))


def test_legacy_layer_culls_as_blockwise_does():
    if graph.query_planning():
        pytest.skip("the legacy engine's layer")
    from dask.blockwise import Blockwise
    from dask.core import flatten

    for inline in (True, False):
        _, x = build(((4, 4, 2), (3, 2)), inline)
        layer = x.dask.layers[x.name]
        every = set(flatten(x.__dask_keys__()))
        for keys in ({(x.name, 1, 0), (x.name, 2, 1)}, every, every | {"elsewhere", ("other", 0)}, set()):
            mine, mine_deps = layer.cull(keys, set())
            theirs, their_deps = Blockwise.cull(layer, keys, set())
            assert mine_deps == their_deps
            assert (mine is layer) == (theirs is layer)
            if keys:
                assert {k: repr(t) for k, t in dict(mine).items()} == {k: repr(t) for k, t in dict(theirs).items()}


@pytest.mark.parametrize("inline", [True, False])
def test_optimizing_fuses_as_for_from_array(inline):
    """Reads fuse with the elementwise work after them exactly as from_array's reads do."""
    source, x = build(((4, 4, 2), (3, 2)), inline)
    theirs = from_array(source, x.chunks, inline, x.name)
    mine_sum, their_sum = (2 * x + 1).sum(axis=0), (2 * theirs + 1).sum(axis=0)
    (a,), (b,) = dask.optimize(mine_sum), dask.optimize(their_sum)
    ga, gb = dict(a.__dask_graph__()), dict(b.__dask_graph__())
    if not graph.query_planning():  # (from_array's expression names itself: key names differ there)
        assert set(ga) == set(gb)
    assert len(ga) == len(gb)
    np.testing.assert_array_equal(a.compute(), (2 * source.values + 1).sum(axis=0))


def test_falls_back_to_from_array_where_the_direct_build_differs(monkeypatch):
    monkeypatch.setattr(graph, "_builder", None)
    monkeypatch.setattr(graph, "_same_as_from_array", lambda build: False)
    source, x = build(((4, 4, 2), (3, 2)))
    assert graph._builder is graph._through_from_array
    np.testing.assert_array_equal(x.compute(), source.values)
    monkeypatch.setattr(graph, "_builder", None)

    def broken():
        raise ImportError("no such internals in this dask")

    monkeypatch.setattr(graph, "_direct_builder", broken)
    source, x = build(((4, 4, 2), (3, 2)), name="npy-other")
    assert graph._builder is graph._through_from_array
    np.testing.assert_array_equal(x.compute(), source.values)


def test_chunk_tasks_are_getter_calls_on_slices():
    from dask.array.core import getter_nofancy

    tasks = chunk_tasks("SOURCE", ((2, 1), (3,)), "x", inline=False)
    assert set(tasks) == {"original-x", ("x", 0, 0), ("x", 1, 0)}
    task = tasks[("x", 1, 0)]
    assert task.func is getter_nofancy and task.kwargs == {"asarray": False, "lock": False}
    assert task.args[0].key == "original-x"
    assert task.args[1].value == (slice(2, 3, None), slice(0, 3, None))
    assert tasks["original-x"].value == "SOURCE"


@given(
    shape=st.lists(st.integers(0, 40), min_size=0, max_size=4).map(tuple),
    itemsize=st.sampled_from([1, 2, 4, 8]),
    fortran=st.booleans(),
    limit=st.integers(1, 4096),
)
def test_regular_grid_is_normalize_chunks_of_auto_chunks(shape, itemsize, fortran, limit):
    from dask.array.core import normalize_chunks

    dtype = np.dtype(f"u{itemsize}")
    block = auto_chunks(shape, dtype, fortran, limit)
    assert regular_grid(shape, block) == normalize_chunks(block, shape, dtype=dtype)
