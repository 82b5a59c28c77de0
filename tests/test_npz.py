""".npz members: stored ones read in place by offset, deflated ones inflated in the task."""

from __future__ import annotations

import os
import zipfile

import numpy as np
import pytest

import npydask
from npydask.backends import _files

A = np.arange(20 * 30, dtype=">f4").reshape(20, 30)
B = np.asfortranarray(np.arange(2 * 3 * 4, dtype="<i8").reshape(2, 3, 4))
S = np.array([(1, b"ab"), (2, b"cd")], dtype=[("i", "<u2"), ("s", "S2")])


@pytest.fixture(params=["stored", "deflated"])
def archive(tmp_path, request):
    path = tmp_path / f"{request.param}.npz"
    save = np.savez if request.param == "stored" else np.savez_compressed
    save(path, a=A, b=B, s=S)
    return str(path), request.param


@pytest.mark.parametrize("key, expected", [("a", A), ("b", B), ("s", S), ("a.npy", A)])
def test_members_equal_numpy(archive, key, expected):
    path, kind = archive
    ref = np.load(path)[key.removesuffix(".npy")]
    h = npydask.read_header(path, key=key)
    assert h.shape == ref.shape and h.dtype == ref.dtype and h.fortran_order == np.isfortran(ref)
    whole = npydask.from_npy(path, key=key).compute()
    assert whole.dtype == ref.dtype and whole.tobytes() == np.ascontiguousarray(ref).tobytes()
    region = npydask.read_region(path, (1,), (2,), key=key)
    assert region.tobytes() == np.ascontiguousarray(ref[1:2]).tobytes()
    split = npydask.from_npy(path, key=key, chunks=1).compute()
    assert split.tobytes() == np.ascontiguousarray(ref).tobytes()


def test_stored_member_offset_is_absolute_in_the_zip(tmp_path):
    path = tmp_path / "s.npz"
    np.savez(path, a=A)
    h = npydask.read_header(path, key="a")
    with open(path, "rb") as f:
        f.seek(h.data_offset)
        assert f.read(A.nbytes) == A.tobytes()


def test_stored_member_reads_only_its_region(tmp_path, monkeypatch):
    path = str(tmp_path / "s.npz")
    big = np.arange(256 * 1024, dtype="<f4").reshape(256, 1024)
    np.savez(path, big=big)
    npydask.read_header(path, key="big")
    calls = []
    real = os.preadv
    monkeypatch.setattr(os, "preadv", lambda fd, bufs, off: calls.append(sum(len(b) for b in bufs)) or real(fd, bufs, off))
    got = npydask.read_region(path, (10,), (11,), key="big")
    np.testing.assert_array_equal(got, big[10:11])
    assert sum(calls) <= 2 * 4096


def test_deflated_member_is_one_chunk_by_default(tmp_path):
    path = tmp_path / "c.npz"
    np.savez_compressed(path, a=np.zeros((4000, 100), "f8"))
    with pytest.MonkeyPatch.context() as mp:
        import dask

        mp.setitem(dask.config.config["array"], "chunk-size", "64KiB")
        x = npydask.from_npy(path, key="a")
    assert x.numblocks == (1, 1)


def test_missing_key_lists_members(archive):
    path, _ = archive
    with pytest.raises(KeyError, match=r"\['a', 'b', 's'\]"):
        npydask.read_header(path, key="zzz")
    with pytest.raises(KeyError, match="zzz"):
        npydask.from_npy(path, key="zzz")


def test_npz_without_key_says_to_pass_one(archive):
    path, _ = archive
    with pytest.raises(npydask.NpyFormatError, match="key="):
        npydask.read_header(path)


def test_key_on_a_plain_npy_file_is_refused(tmp_path):
    path = tmp_path / "a.npy"
    np.save(path, A)
    with pytest.raises(npydask.NpyFormatError, match="zip"):
        npydask.read_header(path, key="a")


def test_other_compression_is_refused(tmp_path):
    path = tmp_path / "bz.npz"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_BZIP2) as zf:
        with zf.open("a.npy", "w") as f:
            np.lib.format.write_array(f, A)
    with pytest.raises(npydask.NpyFormatError, match="compression"):
        npydask.read_header(path, key="a")


def test_corrupt_deflate_stream_is_an_npyformaterror(tmp_path):
    path = tmp_path / "c.npz"
    np.savez_compressed(path, a=np.random.default_rng(0).standard_normal(10000))
    h_member = None
    with zipfile.ZipFile(path) as zf:
        h_member = zf.getinfo("a.npy")
    raw = bytearray(path.read_bytes())
    start = h_member.header_offset + 30 + len("a.npy") + len(h_member.extra) + 200
    raw[start : start + 64] = b"\xff" * 64
    path.write_bytes(bytes(raw))
    _files.clear_cache()
    with pytest.raises((npydask.NpyFormatError, npydask.FileChangedError)):
        npydask.from_npy(path, key="a").compute()


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed], ids=["stored", "deflated"])
def test_npz_dataset_with_roi(tmp_path, save):
    arrays = [np.random.default_rng(i).standard_normal((12, 10)).astype("f4") for i in range(5)]
    for i, a in enumerate(arrays):
        save(tmp_path / f"{i}.npz", x=a, label=np.array(i))
    ds = npydask.open_dataset(tmp_path, file_filter="*.npz", key="x", roi_start=[2, 1], roi_shape=[5, 8])
    np.testing.assert_array_equal(ds.stack().compute(), np.stack([a[2:7, 1:9] for a in arrays]))
    labels = npydask.open_dataset(tmp_path, file_filter="*.npz", key="label")
    assert labels.stack().compute().tolist() == list(range(5))


def test_changed_archive_fails_the_task(tmp_path):
    path = tmp_path / "s.npz"
    np.savez(path, a=A)
    x = npydask.from_npy(path, key="a")
    np.savez(path, a=A + 1)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(npydask.FileChangedError, match="s.npz"):
        x.compute()


@pytest.mark.parametrize("entry", ["read_header", "from_npy", "read_region", "open_dataset folder", "open_dataset files"])
def test_npz_without_key_lists_the_members(archive, entry):
    path, _ = archive
    folder = os.path.dirname(path)
    call = {
        "read_header": lambda: npydask.read_header(path),
        "from_npy": lambda: npydask.from_npy(path),
        "read_region": lambda: npydask.read_region(path),
        "open_dataset folder": lambda: npydask.open_dataset(folder, file_filter="*.npz"),
        "open_dataset files": lambda: npydask.open_dataset(files=[path]),
    }[entry]
    with pytest.raises(npydask.NpyFormatError) as info:
        call()
    message = str(info.value)
    assert path in message and ".npz" in message
    assert "['a', 'b', 's']" in message and "key='a'" in message


def test_npz_folder_without_key_names_the_first_archive_and_its_members(tmp_path):
    for i in range(3):
        np.savez(tmp_path / f"{i}.npz", image=np.zeros((2, 2)), label=np.int64(i))
    with pytest.raises(npydask.NpyFormatError, match=r"0\.npz.*\['image', 'label'\].*key='image'"):
        npydask.open_dataset(tmp_path, file_filter="*.npz")
    ds = npydask.open_dataset(tmp_path, file_filter="*.npz", key="label")  # the advice works
    assert ds.stack().compute().tolist() == [0, 1, 2]


def test_npz_without_key_long_member_lists_are_cut(tmp_path):
    path = tmp_path / "many.npz"
    np.savez(path, **{f"m{i:03d}": np.zeros(1) for i in range(40)})
    with pytest.raises(npydask.NpyFormatError) as info:
        npydask.read_header(path)
    message = str(info.value)
    assert "'m000'" in message and "'m039'" not in message and "40 members" in message
    assert "key='m000'" in message


def test_zip_without_npy_members_and_broken_zip_without_key(tmp_path):
    plain = tmp_path / "notes.npz"
    with zipfile.ZipFile(plain, "w") as zf:
        zf.writestr("readme.txt", "hello")
    with pytest.raises(npydask.NpyFormatError, match=r"\['readme.txt'\]"):
        npydask.read_header(plain)
    broken = tmp_path / "broken.npz"
    broken.write_bytes(b"PK\x03\x04" + b"\0" * 60)  # a zip's first bytes, no directory
    with pytest.raises(npydask.NpyFormatError, match="zip") as info:
        npydask.read_header(broken)
    assert str(broken) in str(info.value)
