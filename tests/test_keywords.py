"""npydask._keywords: a misspelled keyword of a public entry point gets "Did you mean ...?" (a TypeError still)."""

from __future__ import annotations

import inspect
import pickle

import dask.array as da
import numpy as np
import pytest

import npydask
from npydask._keywords import suggest_keywords, unexpected_keyword


@pytest.fixture
def folder(tmp_path):
    for i in range(2):
        np.save(tmp_path / f"{i}.npy", np.arange(6).reshape(2, 3) + i)
    return tmp_path


ENTRY_POINTS = {
    "open_dataset roi_strat": (lambda d: npydask.open_dataset(d, roi_strat=[1]), "open_dataset", "roi_strat",
                               "roi_start"),
    "open_dataset file_fliter": (lambda d: npydask.open_dataset(d, file_fliter="*.npy"), "open_dataset", "file_fliter",
                                 "file_filter"),
    "open_dataset storage_option": (lambda d: npydask.open_dataset(d, storage_option={}), "open_dataset",
                                    "storage_option", "storage_options"),
    "from_npy chunk": (lambda d: npydask.from_npy(d / "0.npy", chunk=2), "from_npy", "chunk", "chunks"),
    "read_region strat": (lambda d: npydask.read_region(d / "0.npy", strat=[1]), "read_region", "strat", "start"),
    "read_header storage_option": (lambda d: npydask.read_header(d / "0.npy", storage_option={}), "read_header",
                                   "storage_option", "storage_options"),
    "to_npy overwrit": (lambda d: npydask.to_npy(da.ones(3), d / "o.npy", overwrit=False), "to_npy", "overwrit",
                        "overwrite"),
    "to_npy_files name": (lambda d: npydask.to_npy_files([da.ones(3)], d / "out", name=["x"]), "to_npy_files", "name",
                          "names"),
    "to_zarr chunk": (lambda d: npydask.to_zarr(da.ones(3), d / "z.zarr", chunk=2), "to_zarr", "chunk", "chunks"),
    "to_zarr storage_option": (lambda d: npydask.to_zarr(da.ones(3), d / "z.zarr", storage_option={}), "to_zarr",
                               "storage_option", "storage_options"),
    "Loader shufle": (lambda d: npydask.Loader(npydask.open_dataset(d), 1, shufle=True), "Loader", "shufle", "shuffle"),
    "from_npy_stack axsi": (lambda d: npydask.from_npy_stack(d, axsi=0), "from_npy_stack", "axsi", "axis"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(ENTRY_POINTS))
def test_a_misspelled_keyword_of_an_entry_point_names_the_right_one(folder, case):
    if case.startswith("to_zarr"):
        pytest.importorskip("zarr")
    call, function, wrong, right = ENTRY_POINTS[case]
    with pytest.raises(TypeError) as caught:
        call(folder)
    assert str(caught.value) == f"{function}() got an unexpected keyword argument {wrong!r}. Did you mean {right!r}?"
    assert caught.value.__context__ is None and caught.value.__cause__ is None
    assert not (folder / "o.npy").exists() and not (folder / "out").exists() and not (folder / "z.zarr").exists()


@pytest.mark.parametrize(("kwargs", "right"), [({"roi_strat": [1]}, "roi_start"), ({"colum": "x"}, "column")])
def test_ray_read_npy_suggests_its_own_and_open_datasets_keywords(folder, kwargs, right, monkeypatch):
    pytest.importorskip("ray.data")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    import npydask.ray

    (wrong,) = kwargs
    with pytest.raises(
        TypeError,
        match=rf"^read_npy\(\) got an unexpected keyword argument '{wrong}'\. "
        rf"Did you mean '{right}'\?$",
    ):
        npydask.ray.read_npy(folder, **kwargs)


def test_a_keyword_close_to_none_keeps_pythons_message(folder):
    with pytest.raises(TypeError, match=r"^open_dataset\(\) got an unexpected keyword argument 'colour'$"):
        npydask.open_dataset(folder, colour=1)
    with pytest.raises(TypeError, match=r"^read_region\(\) got an unexpected keyword argument 'colour'$"):
        npydask.read_region(folder / "0.npy", colour=1)


def test_dali_arguments_are_still_explained(folder):
    with pytest.raises(TypeError, match=r"takes no DALI reader argument dont_use_mmap: .*backend=\"pread\""):
        npydask.open_dataset(folder, dont_use_mmap=True)


def test_other_type_errors_pass_unchanged():
    @suggest_keywords
    def outer(*, shape=None):
        return dict(shape=shape)["shape"](chunk=1)  # (a keyword the caller did not pass)

    def inner(*, chunks=None):
        return chunks

    with pytest.raises(TypeError, match=r"^.*inner\(\) got an unexpected keyword argument 'chunk'$"):
        outer(shape=inner)
    with pytest.raises(TypeError, match="takes 0 positional arguments"):
        outer(1)
    assert outer(shape=lambda chunk: chunk) == 1


def test_wrapped_entry_points_keep_their_signature_name_and_pickle_by_reference():
    assert "roi_start" in inspect.signature(npydask.open_dataset).parameters
    assert list(inspect.signature(npydask.Loader).parameters)[:2] == ["dataset", "batch_size"]
    for fn in (npydask.open_dataset, npydask.read_region, npydask.from_npy, npydask.to_npy, npydask.from_npy_stack):
        assert pickle.loads(pickle.dumps(fn)) is fn
        assert fn.__name__ in fn.__qualname__ and fn.__doc__


def test_unexpected_keyword_is_pythons_message_with_the_closest_name():
    assert str(unexpected_keyword("f", "overwrit", ["compute", "overwrite"])) == (
        "f() got an unexpected keyword argument 'overwrit'. Did you mean 'overwrite'?"
    )
    assert str(unexpected_keyword("f", "zzz", ["compute"])) == "f() got an unexpected keyword argument 'zzz'"
