"""Presigned URLs: no repr or listing that shows a path shows its query string (or ``user:password@``).

Files are served by the project's HTTP range server (``npydask.testing.http_range``),
which ignores query strings as S3 ignores none: the URLs carry
``X-Amz-Signature=SECRET`` as a presigned URL does, and every repr, listing and
message that names a file is searched for the secret.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import npydask

pytest.importorskip("obstore", reason="object storage needs the remote extra")

SECRET = "SECRET0123456789"
QUERY = f"?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=KEY%2F20261126&X-Amz-Signature={SECRET}"


@pytest.fixture
def presigned(tmp_path, http_server):
    """Three ``.npy`` files and an ``.npz`` pair, served over HTTP, and their URLs with a secret query string."""
    arrays = [np.arange(12, dtype="<f4").reshape(3, 4) + i for i in range(3)]
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"f{i}.npy", a)
    np.savez(tmp_path / "p0.npz", x=arrays[0], y=arrays[1])
    np.savez(tmp_path / "p1.npz", x=arrays[1], y=arrays[2])
    server = http_server(tmp_path)
    urls = [server.url(f"f{i}.npy") + QUERY for i in range(3)]
    pairs = [server.url(f"p{i}.npz") + QUERY for i in range(2)]
    return arrays, urls, pairs


def _clean(*texts: object) -> None:
    for text in texts:
        assert SECRET not in str(text), text
        assert "X-Amz" not in str(text), text


def test_dataset_reprs_and_listings_hold_no_query_string(presigned):
    arrays, urls, _ = presigned
    ds = npydask.open_dataset(files=urls)
    np.testing.assert_array_equal(ds.stack().compute(), np.stack(arrays))  # (the secret URLs do read)
    _clean(repr(ds), ds.files, repr(ds.table), repr(ds.views), repr(ds[1:]), repr(ds[[2, 0]]))
    for i in range(len(ds)):
        _clean(repr(ds.views[i]), ds[i].name, repr(ds[i]), ds._shown(i))
    _clean(list(map(repr, ds.views)), ds.stack().name, ds.concatenate().name)
    loader = npydask.Loader(ds, batch_size=2)
    _clean(repr(loader))


def test_multikey_dataset_repr_holds_no_query_string(presigned):
    _, _, pairs = presigned
    ds = npydask.open_dataset(files=pairs, key=["x", "y"])
    _clean(repr(ds), ds.files)
    for sub in ds.members.values():
        _clean(repr(sub), repr(sub.table), sub.files, [repr(v) for v in sub.views])


def test_ray_read_tasks_list_input_files_without_query_string(presigned):
    """``Dataset.input_files()`` is the union of the read tasks' ``input_files`` (planned without starting Ray)."""
    pytest.importorskip("ray.data", reason="Ray Data is not installed (pip install 'npydask[ray]')")
    from npydask.ray.datasource import _Plan

    arrays, urls, pairs = presigned
    ds = npydask.open_dataset(files=urls)
    for concatenate in (False, True):
        plan = _Plan(
            ds,
            column="data",
            index_column="index",
            path_column="path",
            concatenate=concatenate,
            axis=0,
            block_size="128MiB",
            override_num_blocks=2,
        )
        reads = [plan.task(rows) for rows in plan.ranges]
        listed = [f for read in reads for f in read.input_files]
        assert sorted(set(listed)) == sorted(u.partition("?")[0] for u in urls)
        _clean(listed, [read.paths for read in reads], plan.files)
    from npydask.ray.datasource import _MembersPlan

    members = _MembersPlan(
        npydask.open_dataset(files=pairs, key=["x", "y"]),
        column="data",
        index_column="index",
        path_column="path",
        concatenate=False,
        axis=0,
        block_size="128MiB",
        override_num_blocks=None,
    )
    listed = [f for rows in members.plans[0].ranges for f in members.task(rows).input_files]
    assert listed == [u.partition("?")[0] for u in pairs]


def test_command_line_output_holds_no_query_string(presigned, capsys):
    from npydask.cli import main

    _, urls, pairs = presigned
    for argv in (
        ["info", urls[0]],
        ["info", urls[0], "--json"],
        ["info", pairs[0]],
        ["stats", urls[1], "--per-file"],
        ["stats", urls[1], "--json", "--per-file"],
        ["info", urls[0], pairs[1]],
    ):
        status = main(argv)
        out, err = capsys.readouterr()
        assert status == 0, (argv, err)
        assert os.path.basename(urls[0].partition("?")[0]) in out + err or "p0.npz" in out or "f1" in out
        _clean(out, err)
    status = main(["info", urls[0].replace("f0.npy", "missing.npy")])
    out, err = capsys.readouterr()
    assert status == 2 and "missing.npy" in err
    _clean(out, err)


def test_a_header_index_keeps_no_query_string(presigned, tmp_path):
    """The index is a listing written to disk (or an object store): names without the presigned part."""
    arrays, urls, _ = presigned
    index = tmp_path / "index.json"
    for _ in range(2):  # built, then reused
        ds = npydask.open_dataset(files=urls, index=str(index))
        np.testing.assert_array_equal(ds.stack().compute(), np.stack(arrays))
        _clean(index.read_text())
