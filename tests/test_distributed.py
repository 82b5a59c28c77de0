"""Results on a distributed LocalCluster of processes equal numpy's."""

from __future__ import annotations

import numpy as np
import pytest

import npydask

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=50
    ) as cluster, Client(cluster) as c:
        yield c


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("backend", ["auto", "mmap", "pread"])
def test_cluster_results_equal_numpy(client, save, order, backend):
    a = np.random.default_rng(1).standard_normal((40, 30, 20)).astype(">f4")
    p = save(a, order=order)
    x = npydask.from_npy(p, chunks=(7, 30, 9), backend=backend)
    got = client.compute(x, sync=True)
    np.testing.assert_array_equal(got, a)
    assert got.dtype == np.load(p).dtype
    total = client.compute(x.astype("f8").sum(), sync=True)
    assert np.isclose(total, a.astype("f8").sum())
    roi = client.compute(x[5:25, 3, ::2], sync=True)
    np.testing.assert_array_equal(roi, a[5:25, 3, ::2])


def test_chunks_on_workers_are_copies_not_mappings(client, save):
    p = save(np.arange(1000, dtype="f8").reshape(10, 100))
    x = npydask.from_npy(p, chunks=(2, 100))  # contiguous chunks: "auto" would map them locally

    flags = client.compute(x.map_blocks(lambda b: np.array([[b.flags.writeable]]), chunks=(1, 1)), sync=True)
    assert flags.all(), "chunks on a distributed worker must be writeable copies"


def test_changed_file_fails_on_the_worker(client, save):
    import os

    p = save(np.arange(100.0))
    x = npydask.from_npy(p, chunks=10)
    np.save(p, np.arange(100.0) * 2)
    st = os.stat(p)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(npydask.FileChangedError, match=os.path.basename(p)):
        client.compute(x.sum(), sync=True)
