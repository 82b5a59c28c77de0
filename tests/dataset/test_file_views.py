"""FileViews make the same views as today's per-file objects, and they read the same data."""

from __future__ import annotations

import pickle
from collections.abc import Sequence

import numpy as np
import pytest

import npydask
from npydask.dataset.table import FileTable
from npydask.dataset.views import Context, FileViews, view_layout
from npydask.plan.region import Box


def _context_of(view) -> Context:
    r = view.ref
    return Context(r.options, r.backend, r.key, r.source)


def _table_of(views) -> FileTable:
    refs = [v.ref for v in views]
    return FileTable.from_lists(
        [r.path for r in refs],
        [r.identity for r in refs],
        [r.header for r in refs],
        [r.check for r in refs],
        [v.roi for v in views],
        deflated=[r.compressed for r in refs],
    )


@pytest.mark.parametrize(
    "roi",
    [
        {},
        {"roi_start": [1, 0], "roi_shape": [2, 3]},
        {"roi_start": [[0, 0], [1, 1], [2, 2], [0, 1], [1, 0]], "roi_shape": [2, 2]},
        {"roi_start": [-1, 0], "roi_end": [4, 3], "out_of_bounds_policy": "pad"},
    ],
)
def test_file_views_read_as_todays_views(tmp_path, roi):
    rng = np.random.default_rng(5)
    arrays = []
    for k in range(5):
        a = rng.standard_normal((4 + k % 2, 4)).astype("<f8")
        arrays.append(a)
        np.save(tmp_path / f"f {k}é.npy", np.asfortranarray(a) if k == 3 else a)
    ds = npydask.open_dataset(tmp_path, **roi)
    old = list(ds.views)
    views = FileViews(_table_of(old), _context_of(old[0]))
    assert len(views) == 5 and isinstance(views, FileViews)
    for k, v in enumerate(views):
        assert v.ref == old[k].ref and v.roi == old[k].roi
        full = Box.whole(v.shape)
        np.testing.assert_array_equal(v.read(full), old[k].read(full))
        whole = np.load(ds.files[k])
        if not roi:
            np.testing.assert_array_equal(v[...], whole)
    assert views[-1].ref == old[-1].ref
    assert [v.ref for v in views[1:4]] == [v.ref for v in old[1:4]]
    assert isinstance(views[1:4], FileViews) and len(views[::2]) == 3
    assert [v.ref.path for v in views[::-1]] == [v.ref.path for v in old[::-1]]
    back = pickle.loads(pickle.dumps(views[2:]))
    assert [v.ref for v in back] == [v.ref for v in old[2:]]
    assert back.token() == views[2:].token() != views[1:].token()
    with pytest.raises(IndexError, match="row 5 is out of range"):
        views[5]
    with pytest.raises(TypeError, match="indexed by integers"):
        views["a"]
    assert isinstance(views, Sequence) and [v.ref for v in reversed(views)] == [v.ref for v in reversed(old)]
    assert views[0].ref.path in repr(views)
    with pytest.raises(AttributeError, match="read-only"):
        views.table = views.table[:1]
    shapes, sizes, fortran = view_layout(old)  # what stacking plans from today
    layout = views.table.layout()
    assert [layout.shapes[k] for k in layout.shape_id.tolist()] == shapes
    assert layout.nbytes.tolist() == sizes and layout.fortran.tolist() == fortran


def test_file_views_of_npz_members_keep_deflated(tmp_path):
    for k in range(3):
        save = np.savez_compressed if k != 1 else np.savez
        save(tmp_path / f"a{k}.npz", x=np.arange(6 + k, dtype="<i4"))
    ds = npydask.open_dataset(tmp_path, file_filter="*.npz", key="x")
    old = list(ds.views)
    views = FileViews(_table_of(old), _context_of(old[0]))
    assert [v.ref.compressed for v in views] == [True, False, True]
    for k, v in enumerate(views):
        assert v.ref == old[k].ref
        np.testing.assert_array_equal(v[...], np.load(tmp_path / f"a{k}.npz")["x"])


@pytest.mark.parametrize("send_etag", [True, False])
def test_file_views_of_objects_read_as_todays_views(tmp_path, http_server, send_etag):
    """Object identities (ETag, or Last-Modified without one) survive the table, and the views read the objects."""
    arrays = [np.arange(12, dtype="<i4").reshape(3, 4) * k for k in range(4)]
    for k, a in enumerate(arrays):
        np.save(tmp_path / f"o {k}é.npy", a)
    server = http_server(tmp_path, send_etag=send_etag)
    options = None if send_etag else {"identity": "last-modified"}  # (a server without ETags is refused otherwise)
    ds = npydask.open_dataset(files=[server.url(f"o {k}é.npy") for k in range(4)], storage_options=options)
    old = list(ds.views)
    table = _table_of(old)
    assert (table.etag is None) is False and (table.modified is not None) == (not send_etag)
    views = FileViews(table, _context_of(old[0]))
    back = pickle.loads(pickle.dumps(views))
    for k, v in enumerate(back):
        assert v.ref == old[k].ref and type(v.ref.identity).__name__ == "ObjectIdentity"
        np.testing.assert_array_equal(v[...], arrays[k])
    assert views.token() == back.token() and views.token() != views[1:].token()
