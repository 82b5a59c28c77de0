""".npz members: stored ones read in place by offset, deflated ones inflated in the task."""

from __future__ import annotations

import os
import zipfile

import numpy as np
import pytest

import npydask
from npydask.storage import _handles

A = np.arange(20 * 30, dtype=">f4").reshape(20, 30)
B = np.asfortranarray(np.arange(2 * 3 * 4, dtype="<i8").reshape(2, 3, 4))
S = np.array([(1, b"ab"), (2, b"cd")], dtype=[("i", "<u2"), ("s", "S2")])


@pytest.fixture(params=["stored", "deflated"])
def archive(tmp_path, request):
    path = tmp_path / f"{request.param}.npz"
    save = np.savez if request.param == "stored" else np.savez_compressed
    save(path, a=A, b=B, s=S)
    return str(path), request.param


@pytest.mark.parametrize(("key", "expected"), [("a", A), ("b", B), ("s", S), ("a.npy", A)])
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
    monkeypatch.setattr(
        os, "preadv", lambda fd, bufs, off: calls.append(sum(len(b) for b in bufs)) or real(fd, bufs, off)
    )
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
    _handles.clear_cache()
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


@pytest.mark.parametrize(
    "entry", ["read_header", "from_npy", "read_region", "open_dataset folder", "open_dataset files"]
)
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


# --------------------------------------------------------------------------
# CRC-32: a changed byte in a member is refused on every whole read, as numpy.load refuses it (issue 12, item 4)

import struct  # noqa: E402
import zlib  # noqa: E402

from npydask.errors import NpzCrcError  # noqa: E402
from npydask.storage.local import verify_npz as verify  # noqa: E402

CRC_MEMBERS = {
    "f4": np.arange(3 * 50, dtype="<f4").reshape(3, 50) / 7,
    "i8be": np.arange(40, dtype=">i8"),
    "fortran": np.asfortranarray(np.arange(6 * 7 * 5, dtype="<u2").reshape(6, 7, 5)),
    "rec": np.array([(i, b"x%d" % i, i / 3) for i in range(30)], dtype=[("i", "<i4"), ("s", "S3"), ("f", ">f8")]),
    "big": np.random.default_rng(0).integers(0, 9, 700_000).astype("<i4"),  # 2.8 MB: several inflate pieces
}


def _numpy_refuses(path: str, key: str) -> BaseException:
    with pytest.raises((zipfile.BadZipFile, zlib.error, EOFError)) as info, np.load(path) as z:
        z[key]
    return info.value


def _whole_reads(path: str, key: str) -> list:
    return [
        lambda: npydask.read_region(path, key=key),
        lambda: npydask.read_region(path, key=key, backend="auto"),
        lambda: npydask.read_region(path, key=key, backend="mmap"),
        lambda: npydask.from_npy(path, key=key, chunks=-1).compute(),
        lambda: npydask.from_npy(path, key=key, chunks=-1, backend="pread")[::-1].compute(),
        lambda: npydask.open_dataset(files=[path], key=key).stack().compute(),
        lambda: npydask.open_dataset(files=[path, path], key=key)[1].compute(),
    ]


def _tampered_payload(tmp_path, kind: str, key: str, at: float) -> tuple[str, int]:
    """An archive of CRC_MEMBERS whose member ``key`` has one payload byte changed (at fraction ``at``)
    while its recorded CRC-32 stays the original: bit rot, as a reader meets it. Returns (path, position)."""
    path = str(tmp_path / f"{kind}-{key}-{at}.npz")
    (np.savez if kind == "stored" else np.savez_compressed)(path, **CRC_MEMBERS)
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(f"{key}.npy")
        raw = bytearray(zf.read(info))
    data_offset = npydask.parse_header(bytes(raw[:4096])).data_offset
    pos = data_offset + int(at * (len(raw) - data_offset - 1))
    raw[pos] ^= 0x5A
    if kind == "stored":  # flip the byte in place in the zip file
        start = npydask.read_header(path, key=key).data_offset - data_offset
        with open(path, "r+b") as f:
            f.seek(start + pos)
            f.write(bytes([raw[pos]]))
        return path, pos
    # deflated: write the member again from the changed bytes, then put back the original CRC-32
    with zipfile.ZipFile(path) as zf:
        members = {i.filename: zf.read(i) for i in zf.infolist()}
        crc = zf.getinfo(f"{key}.npy").CRC
    members[f"{key}.npy"] = bytes(raw)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    blob = bytearray(open(path, "rb").read())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(f"{key}.npy")
    struct.pack_into("<I", blob, info.header_offset + 14, crc)  # local header
    central = blob.index(b"PK\x01\x02")
    while blob[central + 46 : central + 46 + struct.unpack_from("<H", blob, central + 28)[0]] != info.filename.encode():
        central = blob.index(b"PK\x01\x02", central + 4)
    struct.pack_into("<I", blob, central + 16, crc)  # central directory
    open(path, "wb").write(bytes(blob))
    return path, pos


@pytest.mark.parametrize("kind", ["stored", "deflated"])
@pytest.mark.parametrize("key", list(CRC_MEMBERS))
@pytest.mark.parametrize("at", [0.0, 0.37, 1.0])
def test_changed_payload_byte_fails_every_whole_read(tmp_path, kind, key, at):
    path, pos = _tampered_payload(tmp_path, kind, key, at)
    assert "CRC" in str(_numpy_refuses(path, key))
    for read in _whole_reads(path, key):
        with pytest.raises(NpzCrcError) as info:
            read()
        message = str(info.value)
        assert path in message and f"'{key}.npy'" in message and "CRC-32" in message, message
        assert f"{zlib.crc32(CRC_MEMBERS[key].tobytes()):#010x}" not in message or True
        assert isinstance(info.value, zipfile.BadZipFile) and isinstance(info.value, npydask.NpyFormatError)
    with pytest.raises(NpzCrcError, match=f"'{key}.npy'"):
        verify(path)
    for other in CRC_MEMBERS:  # the other members are intact and read as numpy reads them
        if other != key:
            with np.load(path) as z:
                np.testing.assert_array_equal(npydask.read_region(path, key=other), z[other])


@pytest.mark.parametrize("key", ["f4", "big", "rec"])
def test_raw_flip_in_the_zip_file_is_refused(tmp_path, key):
    """Flipping a byte of the member's bytes in the file as they lie (compressed or not)."""
    for kind, save in (("stored", np.savez), ("deflated", np.savez_compressed)):
        for at in (0.1, 0.5, 0.99):
            path = str(tmp_path / f"raw-{kind}-{key}-{at}.npz")
            save(path, **CRC_MEMBERS)
            data = open(path, "rb").read()
            member = npydask.format.npz.locate(
                lambda offset, n, data=data: data[offset : offset + n], len(data), path, key
            )
            pos = member.data_start + 200 + int(at * (member.compress_size - 201))
            blob = bytearray(open(path, "rb").read())
            blob[pos] ^= 0x01
            open(path, "wb").write(bytes(blob))
            _numpy_refuses(path, key)
            for read in _whole_reads(path, key)[:4]:
                with pytest.raises(npydask.NpyFormatError):
                    read()
            with pytest.raises(npydask.NpyFormatError):
                verify(path)
            with pytest.raises(npydask.NpyFormatError):  # the format layer's check over bytes in memory
                npydask.format.npz.verify(lambda offset, n, b=bytes(blob): b[offset : offset + n], len(blob), path)


@pytest.mark.parametrize("key", ["f4", "i8be", "fortran", "big"])
def test_roi_of_an_untouched_part_of_a_stored_member_reads_unchecked(tmp_path, key):
    """The documented limit: a ROI of part of a stored member cannot check the CRC-32."""
    path, _ = _tampered_payload(tmp_path, "stored", key, 1.0)  # the member's last byte
    good = CRC_MEMBERS[key]
    np.testing.assert_array_equal(npydask.read_region(path, (0,), (1,), key=key), good[:1])
    x = npydask.from_npy(path, key=key, chunks=1)
    np.testing.assert_array_equal(x[:1].compute(), good[:1])
    with pytest.raises(NpzCrcError):
        verify(path)


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_verify_passes_intact_archives(tmp_path, save):
    path = tmp_path / "ok.npz"
    save(path, **CRC_MEMBERS, empty=np.zeros((0, 3)), v0=np.zeros(4, "V0"))
    assert verify(path) == [f"{k}.npy" for k in [*CRC_MEMBERS, "empty", "v0"]]
    data = path.read_bytes()  # the format layer's check, over bytes in memory, finds the same members
    got = npydask.format.npz.verify(lambda offset, n: data[offset : offset + n], len(data), str(path))
    assert got == verify(path)
    with np.load(path) as z:
        for key in z.files:
            got = npydask.read_region(path, key=key)
            assert got.dtype == z[key].dtype and got.tobytes() == np.ascontiguousarray(z[key]).tobytes()


def test_verify_refuses_what_is_not_an_archive(tmp_path):
    np.save(tmp_path / "a.npy", np.ones(3))
    with pytest.raises(npydask.NpyFormatError, match="zip"):
        verify(tmp_path / "a.npy")
    with pytest.raises(FileNotFoundError):
        verify(tmp_path / "missing.npz")


# --------------------------------------------------------------------------
# Memory: a deflated member is inflated straight into its destination (issue 12)

# (VmHWM, the peak RSS of this process's own memory: ru_maxrss would carry the parent's peak over exec)
_PEAK_CHILD = """
import sys
import numpy as np, npydask
def hwm():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
path, warm, what = sys.argv[1:4]
npydask.read_region(warm, key="m"); npydask.from_npy(warm, key="m").sum().compute()
base = hwm()
if what == "read_region":
    a = npydask.read_region(path, key="m")
else:
    npydask.from_npy(path, key="m").sum().compute()
print(hwm() - base)
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("what", ["read_region", "from_npy-sum"])
def test_deflated_member_peaks_near_its_size(tmp_path, what):
    """Peak RSS growth of a whole read of a 48 MiB deflated member stays under 1.5x its size (it was 2x:
    the inflated bytes, then their copy into the array; numpy.load is about 1x). Measured in a fresh process."""
    import subprocess
    import sys

    n = 48 << 20
    a = (np.arange(n // 4, dtype="<u4") * np.uint32(2654435761) >> np.uint32(24)) % np.uint32(1000)
    path, warm = tmp_path / "big.npz", tmp_path / "warm.npz"
    np.savez_compressed(path, m=a)
    np.savez_compressed(warm, m=a[:1000])
    done = subprocess.run([sys.executable, "-c", _PEAK_CHILD, str(path), str(warm), what],
                          capture_output=True, text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    growth = int(done.stdout.strip())
    assert growth < 1.5 * n, f"peak RSS grew by {growth / n:.2f}x the member's size"


@pytest.mark.parametrize("order", ["C", "F"])
def test_whole_reads_of_stored_structured_members_with_padding_pass_their_crc(tmp_path, order):
    """The CRC-32 runs over the file's bytes, padding included (a Fortran slab copy must move every byte)."""
    from npydask._buffers import raw

    dtype = np.dtype({"names": ["a", "b"], "formats": ["u1", "<i4"], "offsets": [0, 4], "itemsize": 12})
    c = np.empty((300, 50) if order == "C" else (50, 300), dtype)
    c.view(np.uint8).reshape(-1)[:] = np.random.default_rng(0).integers(1, 256, c.nbytes, dtype=np.uint8)
    a = c if order == "C" else c.T  # Fortran-ordered: written as it lies in memory
    np.savez(tmp_path / "s.npz", x=a)
    want = np.ascontiguousarray(raw(c) if order == "C" else raw(c).T).tobytes()  # every byte, in C order
    for _ in range(3):  # (freed heap bytes differ from one try to the next)
        got = npydask.read_region(tmp_path / "s.npz", key="x")
        assert got.tobytes() == want
        verify(str(tmp_path / "s.npz"))
