"""npydask.format.header and read_header: numpy is the oracle, malformed files are a table."""

from __future__ import annotations

import io
import itertools
import os
import pathlib
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import npydask
from npydask import NpyFormatError
from npydask.format import header as header_mod
from npydask.testing.strategies import (
    arrays,
    assert_same_array,
    dtypes,
    npy_bytes,
    region_slices,
    regions,
    save_npy,
    shapes,
)

try:  # numpy >= 2
    from numpy.lib._format_impl import _read_array_header
except ImportError:  # pragma: no cover - numpy 1.26
    from numpy.lib.format import _read_array_header

MAGIC = b"\x93NUMPY"
VERSIONS = [None, (1, 0), (2, 0), (3, 0)]
_names = itertools.count()


def fresh(tmp_path: pathlib.Path, suffix: str = ".npy") -> pathlib.Path:
    """A new file name per hypothesis example (the handle cache keys on path + identity)."""
    return tmp_path / f"f{next(_names)}{suffix}"


def numpy_header(path: os.PathLike[str] | str) -> tuple[tuple[int, int], tuple[int, ...], bool, np.dtype, int]:
    """numpy's own reading of a header: version, shape, fortran_order, dtype, payload offset."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        shape, fortran, dtype = _read_array_header(f, version, max_header_size=1 << 21)
        return version, shape, fortran, dtype, f.tell()


def numpy_load(path: os.PathLike[str] | str, **kwargs: object) -> np.ndarray | BaseException:
    """``numpy.load(path, allow_pickle=False)``, or the exception it raised (warnings ignored)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return np.load(path, allow_pickle=False, **kwargs)
        except Exception as e:  # noqa: BLE001 - any refusal counts
            return e


def assert_dtype_identical(a: np.dtype, b: np.dtype) -> None:
    assert a == b, (a, b)
    assert a.str == b.str and a.descr == b.descr and a.itemsize == b.itemsize, (a.descr, b.descr)
    assert a.names == b.names and a.fields == b.fields, (a.fields, b.fields)


def assert_matches_numpy(h: npydask.NpyHeader, path: os.PathLike[str] | str) -> None:
    version, shape, fortran, dtype, offset = numpy_header(path)
    assert h.version == version
    assert h.shape == shape and type(h.shape) is tuple
    assert all(type(d) is int for d in h.shape)
    assert h.fortran_order is fortran
    assert_dtype_identical(h.dtype, dtype)
    assert h.data_offset == offset
    assert h.nbytes == int(np.prod(shape, dtype=object)) * dtype.itemsize


# --------------------------------------------------------------------------
# Round trips against numpy's header reader.


@given(a=arrays(), version=st.sampled_from(VERSIONS), order=st.sampled_from("CF"))
def test_roundtrip_matches_numpy(tmp_path, a, version, order):
    path = save_npy(fresh(tmp_path), a, version, order)
    data = pathlib.Path(path).read_bytes()
    parsed = npydask.parse_header(data)
    read = npydask.read_header(path)
    assert parsed == read
    assert_matches_numpy(parsed, path)
    assert read.data_offset + read.nbytes == len(data)
    if version is not None:  # save_npy falls back only where the version cannot hold the header
        assert read.version == version or read.version > version
    loaded = np.load(path, allow_pickle=False, max_header_size=1 << 21)
    assert_dtype_identical(read.dtype, loaded.dtype)
    assert read.shape == loaded.shape and read.nbytes == loaded.nbytes


@given(a=arrays(max_dims=6), version=st.sampled_from(VERSIONS), order=st.sampled_from("CF"), data=st.data())
@settings(max_examples=40)
def test_payload_located_by_header_matches_numpy(tmp_path, a, version, order, data):
    """data_offset and nbytes point at numpy's payload: a region read through them equals numpy.load's."""
    path = save_npy(fresh(tmp_path), a, version, order)
    expected = np.load(path, allow_pickle=False, max_header_size=1 << 21)
    assert_same_array(npydask.read_region(path), expected)
    start, stop = data.draw(regions(a.shape))
    assert_same_array(npydask.read_region(path, start, stop), expected[region_slices(a.shape, start, stop) + (...,)])


@given(a=arrays(max_dims=3), order=st.sampled_from("CF"))
@settings(max_examples=30)
def test_parse_header_from_buffer_types(a, order):
    data = npy_bytes(a, order=order)
    expected = npydask.parse_header(data)
    assert npydask.parse_header(bytearray(data)) == expected
    assert npydask.parse_header(memoryview(data)) == expected
    assert npydask.parse_header(data[: expected.data_offset]) == expected  # payload not needed
    assert npydask.parse_header(np.frombuffer(data, np.uint8)) == expected


# numpy's own test arrays (numpy/lib/tests/test_format.py), object arrays left out.
_NUMPY_SCALARS = [np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.uint64, np.int64,
                  np.float32, np.float64, np.complex64, np.complex128]  # fmt: skip
_PDESCR = [("x", "i4", (2,)), ("y", "f8", (2, 2)), ("z", "u1")]
_NDESCR = [
    ("x", "i4", (2,)),
    ("Info", [("value", "c16"), ("y2", "f8"),
              ("Info2", [("name", "S2"), ("value", "c16", (2,)), ("y3", "f8", (2,)), ("z3", "u4", (2,))]),
              ("name", "S2"), ("z2", "b1")]),
    ("color", "S2"),
    ("info", [("Name", "U8"), ("Value", "c16")]),
    ("y", "f8", (2, 2)),
    ("z", "u1"),
]  # fmt: skip
_PADDED = [
    np.dtype({"names": ["a", "b"], "formats": ["i1", "<f8"], "offsets": [0, 8], "itemsize": 24}),
    np.dtype([("a", "i1"), ("b", "<f8")], align=True),
    np.dtype({"names": [], "formats": [], "itemsize": 8}),
    np.dtype({"names": ["a"], "formats": ["<i4"], "offsets": [4], "itemsize": 8, "titles": ["T"]}),
    np.dtype([("c", ("<f8", (5,)), (2,))]),
    np.dtype([("x", np.dtype((np.dtype({"names": ["a", "b"], "formats": ["i1", "i1"], "offsets": [0, 4],
                                        "itemsize": 8}), (3,))), (4,))]),
]  # fmt: skip
_NUMPY_DTYPES = (
    [np.dtype(s).newbyteorder(e) for s in _NUMPY_SCALARS for e in "<>"]
    + [np.dtype(_PDESCR).newbyteorder(e) for e in "<>"]
    + [np.dtype(_NDESCR).newbyteorder(e) for e in "<>"]
    + _PADDED
)


@pytest.mark.parametrize("dtype", _NUMPY_DTYPES, ids=[str(i) for i in range(len(_NUMPY_DTYPES))])
@pytest.mark.parametrize("shape", [(0,), (), (1500,), (30, 50)], ids=["empty", "0d", "1d", "2d"])
@pytest.mark.parametrize("order", ["C", "F"])
def test_numpy_test_arrays(tmp_path, dtype, shape, order):
    a = np.frombuffer(np.random.default_rng(0).bytes(int(np.prod(shape)) * dtype.itemsize), dtype).reshape(shape)
    path = tmp_path / "a.npy"
    np.save(path, np.asfortranarray(a) if order == "F" else a)
    h = npydask.read_header(path)
    assert_matches_numpy(h, path)
    assert h.fortran_order == (order == "F" and len(shape) == 2)
    assert_same_array(npydask.read_region(path), np.load(path))


def test_version_fallbacks_of_save_npy(tmp_path):
    a = np.zeros(2, [("\u540d", "<f4")])  # not latin-1: numpy refuses format 1.0 and 2.0
    for version in [(1, 0), (2, 0), (3, 0), None]:
        h = npydask.read_header(save_npy(fresh(tmp_path), a, version))
        assert h.version == (3, 0) and h.dtype.names == ("\u540d",)
    big = np.zeros(1, [(f"f{i:06d}" + "x" * 40, "<u1") for i in range(2000)])  # header > 64 KiB
    h = npydask.read_header(save_npy(fresh(tmp_path), big, (1, 0)))
    assert h.version == (2, 0) and h.data_offset > 65535 and h.data_offset % 64 == 0


def test_latin1_header_decoding_matches_numpy(tmp_path):
    # Formats 1.0 and 2.0 are latin-1: UTF-8 bytes in them are two latin-1 characters, as numpy reads them.
    text = "{'descr': [('\u00e9', '<f4')], 'fortran_order': False, 'shape': (3,), }"
    for version, raw in [((1, 0), text.encode("latin1")), ((2, 0), text.encode("utf8")), ((3, 0), text.encode("utf8"))]:
        path = fresh(tmp_path)
        path.write_bytes(npy(raw, version, payload=bytes(12)))
        h = npydask.read_header(path)
        assert_matches_numpy(h, path)
        expected = "\u00e9" if version == (3, 0) or raw == text.encode("latin1") else "\u00c3\u00a9"
        assert h.dtype.names == (expected,)


# --------------------------------------------------------------------------
# Malformed files: a table. Each is refused by npydask; numpy refuses it too
# unless `numpy_accepts` names a documented place where npydask is stricter.


def npy(text: str | bytes, version: tuple[int, int] = (1, 0), *, payload: bytes = bytes(64), pad: bool = True,
        hlen: int | None = None) -> bytes:  # fmt: skip
    """A file: preamble, header text (padded to 64 bytes with spaces and a newline), payload."""
    raw = text.encode("utf8" if version == (3, 0) else "latin1") if isinstance(text, str) else text
    fmt = "<H" if version == (1, 0) else "<I"
    pre = len(MAGIC) + 2 + struct.calcsize(fmt)
    if pad:
        raw += b" " * (-(pre + len(raw) + 1) % 64) + b"\n"
    return MAGIC + bytes(version) + struct.pack(fmt, len(raw) if hlen is None else hlen) + raw + payload


def dict_text(descr: str = "'<f4'", fortran: str = "False", shape: str = "(3,)") -> str:
    return f"{{'descr': {descr}, 'fortran_order': {fortran}, 'shape': {shape}, }}"


GOOD = npy(dict_text())
MARK = "@MARKER@"  # replaced by a path whose creation would prove code ran

STRICTER = "numpy accepts it; npydask is stricter (SPEC section 1)"

# (id, file bytes, numpy_accepts)
MALFORMED: list[tuple[str, bytes, str | None]] = [
    # numpy's malformed_magic and bad_version_magic
    ("empty-file", b"", None),
    ("magic-x92", b"\x92NUMPY\x01\x00" + GOOD[8:], None),
    ("magic-x00", b"\x00NUMPY\x01\x00" + GOOD[8:], None),
    ("magic-lowercase", b"\x93numpy\x01\x00" + GOOD[8:], None),
    ("magic-MATLB", b"\x93MATLB\x01\x00" + GOOD[8:], None),
    ("magic-only-major", b"\x93NUMPY\x01", None),
    ("magic-only", b"\x93NUMPY", None),
    ("magic-prefix", b"\x93NUM", None),
    ("version-1.1", b"\x93NUMPY\x01\x01" + GOOD[8:], None),
    ("version-0.0", b"\x93NUMPY\x00\x00" + GOOD[8:], None),
    ("version-0.1", b"\x93NUMPY\x00\x01" + GOOD[8:], None),
    ("version-2.2", b"\x93NUMPY\x02\x02" + GOOD[8:], None),
    ("version-3.1", b"\x93NUMPY\x03\x01" + GOOD[8:], None),
    ("version-4.0", b"\x93NUMPY\x04\x00" + GOOD[8:], None),
    ("version-255.255", b"\x93NUMPY\xff\xff" + GOOD[8:], None),
    ("length-field-short-v1", b"\x93NUMPY\x01\x00\x10", None),
    ("length-field-short-v2", b"\x93NUMPY\x02\x00\x10\x00", None),
    # lengths
    ("header-longer-than-file", npy(dict_text(), hlen=1000, payload=b""), None),
    ("header-length-zero", npy(b"", pad=False), None),
    ("header-truncated", GOOD[:40], None),
    ("header-cut-before-newline", GOOD[: GOOD.index(b"\n")], None),
    ("header-length-too-short", npy(dict_text(), hlen=30), None),
    ("header-length-one-short", npy(dict_text(), hlen=len(GOOD) - 64 - 10 - 1), STRICTER),  # drops the newline
    ("header-over-1MiB", npy(dict_text() + " " * (1 << 20), (2, 0)), None),
    # syntax, keys and value types (numpy's test_bad_header and more)
    ("missing-fortran-order", npy("{'descr': 'x', 'shape': (1, 2), }"), None),
    ("missing-fortran-order-valid-descr", npy("{'descr': '<f4', 'shape': (3,), }"), None),
    ("missing-descr", npy("{'fortran_order': False, 'shape': (3,), }"), None),
    ("missing-shape", npy("{'descr': '<f4', 'fortran_order': False, }"), None),
    ("empty-dict", npy("{}"), None),
    ("extra-key", npy("{'descr': 'x', 'extrakey': -1, 'fortran_order': False, 'shape': (1, 2), }"), None),
    ("extra-key-valid", npy(dict_text()[:-1] + "'x': 1}"), None),
    ("key-misspelled", npy(dict_text().replace("'descr'", "'Descr'")), None),
    ("key-int", npy(dict_text().replace("'descr'", "1")), None),
    ("key-bytes", npy(dict_text().replace("'descr'", "b'descr'")), None),
    ("key-tuple", npy(dict_text().replace("'descr'", "('descr',)")), None),
    ("dict-unpacking", npy("{'descr': '<f4', **{'fortran_order': False, 'shape': (3,)}}"), None),
    ("not-a-dict-list", npy("['descr', '<f4', 'fortran_order', False, 'shape', (3,)]"), None),
    ("not-a-dict-tuple", npy("(('descr', '<f4'), ('fortran_order', False), ('shape', (3,)))"), None),
    ("not-a-dict-set", npy("{'descr', 'fortran_order', 'shape'}"), None),
    ("not-a-dict-str", npy("'descr'"), None),
    ("not-a-dict-int", npy("3"), None),
    ("not-a-dict-none", npy("None"), None),
    ("not-python", npy("descr: <f4\nfortran_order: false\nshape: [3]"), None),
    ("unclosed-dict", npy(dict_text()[:-1]), None),
    ("fortran-order-int", npy(dict_text(fortran="0")), None),
    ("fortran-order-one", npy(dict_text(fortran="1")), None),
    ("fortran-order-str", npy(dict_text(fortran="'False'")), None),
    ("fortran-order-none", npy(dict_text(fortran="None")), None),
    ("shape-list", npy(dict_text(shape="[3]")), None),
    ("shape-int", npy(dict_text(shape="3")), None),
    ("shape-str", npy(dict_text(shape="'3'")), None),
    ("shape-none", npy(dict_text(shape="None")), None),
    ("shape-float", npy(dict_text(shape="(3.0,)")), None),
    ("shape-float-second", npy(dict_text(shape="(3, 4.5)")), None),
    ("shape-complex", npy(dict_text(shape="(3j,)")), None),
    ("shape-str-dim", npy(dict_text(shape="('3',)")), None),
    ("shape-nested-tuple", npy(dict_text(shape="((3,),)")), None),
    ("shape-negative", npy(dict_text(shape="(-1,)")), None),
    ("shape-negative-second", npy(dict_text(shape="(3, -2)")), None),
    ("shape-bool", npy(dict_text(shape="(True,)")), None),
    ("shape-bool-second", npy(dict_text(shape="(3, True)")), None),
    ("shape-false", npy(dict_text(shape="(False,)")), None),
    ("shape-65-dims", npy(dict_text(shape=repr((1,) * 65))), None),
    # sizes that overflow
    ("overflow-2**62-squared", npy(dict_text(shape="(4611686018427387904, 4611686018427387904)")), None),
    ("overflow-2e18-doubles", npy(dict_text("'<f8'", shape="(2000000000000000000,)")), None),
    ("overflow-2**63", npy(dict_text(shape="(9223372036854775808,)")), None),
    ("overflow-2**64", npy(dict_text(shape="(18446744073709551616,)")), None),
    ("overflow-huge-dim", npy(dict_text(shape="(" + "9" * 40 + ",)")), None),
    ("overflow-5000-digits", npy(dict_text(shape="(" + "1" * 5000 + ",)"), (2, 0)), None),
    ("overflow-5000-digits-spaced", npy(dict_text(shape="( " + "1" * 5000 + ",)"), (2, 0)), None),
    ("overflow-empty-but-huge-dim", npy(dict_text(shape="(0, 9223372036854775808)")), None),
    ("overflow-empty-but-huge-bytes", npy(dict_text(shape="(0, 4611686018427387904, 4611686018427387904)")), None),
    ("overflow-empty-2**61-floats", npy(dict_text(shape="(2305843009213693952, 0)")), None),
    ("overflow-subarray-field", npy(dict_text("[('a', '<f8', (1099511627776, 1099511627776))]")), None),
    # code never runs
    ("code-import", npy(dict_text(f"__import__('pathlib').Path({MARK!r}).touch()")), None),
    ("code-import-shape", npy(dict_text(shape=f"(__import__('pathlib').Path({MARK!r}).touch(),)")), None),
    ("code-lambda", npy(dict_text(f"(lambda: __import__('pathlib').Path({MARK!r}).touch())()")), None),
    ("code-call", npy(dict_text("dtype('<f4')")), None),
    ("code-call-shape", npy(dict_text(shape="tuple([3])")), None),
    ("code-fstring", npy(dict_text(f"f'<f4{{__import__(\"pathlib\").Path({MARK!r}).touch()}}'")), None),
    ("code-fstring-plain", npy(dict_text("f'<f4'")), None),
    ("code-attribute", npy(dict_text("numpy.float32")), None),
    ("code-name", npy(dict_text("float32")), None),
    ("code-subscript", npy(dict_text("'<f4'[0:]")), None),
    ("code-binop", npy(dict_text(shape="(1 + 2,)")), None),
    ("code-ifexp", npy(dict_text(shape="(3,) if True else (4,)")), None),
    ("code-walrus", npy(dict_text("(x := '<f4')")), None),
    ("code-genexp", npy(dict_text(shape="tuple(i for i in (3,))")), None),
    ("code-comprehension", npy(dict_text("[('a', t) for t in ['<f4']]")), None),
    ("code-semicolon", npy(dict_text() + f"; __import__('pathlib').Path({MARK!r}).touch()"), None),
    ("code-newline-statement", npy(dict_text() + f"\n__import__('pathlib').Path({MARK!r}).touch()"), None),
    ("code-starred", npy(dict_text(shape="(*(3,),)")), None),
    ("code-set-descr", npy(dict_text("{'<f4'}")), None),
    ("code-dict-descr", npy(dict_text("{'names': ['a'], 'formats': ['<f4']}")), None),
    # what may follow the dict
    ("after-dict-word", npy(dict_text() + " x"), None),
    ("after-dict-brace", npy(dict_text() + "}"), None),
    ("after-dict-nul", npy(dict_text() + "\0"), None),
    ("after-dict-nbsp", npy(dict_text() + "\u00a0"), None),
    ("after-dict-second-dict", npy(dict_text() + " " + dict_text()), None),
    ("after-dict-comment", npy(dict_text() + " # a comment"), STRICTER),
    ("after-dict-tab", npy(dict_text() + "\t"), STRICTER),
    ("after-dict-cr", npy(dict_text() + "\r"), STRICTER),
    ("after-dict-two-newlines", npy(dict_text() + "\n"), STRICTER),
    ("after-dict-backslash-newline", npy(dict_text() + "\\\n"), STRICTER),
    ("no-final-newline", npy(dict_text().encode() + b" " * 9, pad=False), STRICTER),
    ("leading-space", npy(" " + dict_text()), STRICTER),
    ("leading-newline", npy("\n" + dict_text()), STRICTER),
    ("duplicated-key", npy("{'descr': '<f8', 'descr': '<f4', 'fortran_order': False, 'shape': (3,), }"), STRICTER),
    ("duplicated-key-same-value", npy(dict_text()[:-1] + "'shape': (3,), }"), STRICTER),
    ("python2-long-suffix", npy(dict_text(shape="(3L,)")), STRICTER),
    ("unary-plus-dim", npy(dict_text(shape="(+3,)")), STRICTER),
    ("field-as-list", npy(dict_text("[['a', '<f4']]")), STRICTER),
    # descr
    ("descr-object", npy(dict_text("'|O'")), None),
    ("descr-object-native", npy(dict_text("'O'")), None),
    ("descr-object-field", npy(dict_text("[('a', '<i4'), ('b', '|O')]")), None),
    ("descr-object-nested", npy(dict_text("[('a', [('b', '|O')])]")), None),
    ("descr-object-subarray", npy(dict_text("[('a', '|O', (2,))]")), None),
    ("descr-object-comma", npy(dict_text("'i4,O'")), None),
    ("descr-unknown", npy(dict_text("'x'")), None),
    ("descr-bad-size", npy(dict_text("'<f3'")), None),
    ("descr-empty-str", npy(dict_text("''")), None),
    ("descr-int", npy(dict_text("3")), None),
    ("descr-none", npy(dict_text("None")), None),
    ("descr-bool", npy(dict_text("True")), None),
    ("descr-bytes", npy(dict_text("b'<f4'")), None),
    ("descr-field-one-item", npy(dict_text("[('a',)]")), None),
    ("descr-field-four-items", npy(dict_text("[('a', '<f4', (2,), 1)]")), None),
    ("descr-field-name-int", npy(dict_text("[(1, '<f4')]")), None),
    ("descr-field-negative-shape", npy(dict_text("[('a', '<f4', (-1,))]")), None),
    ("descr-field-float-shape", npy(dict_text("[('a', '<f4', 2.0)]")), None),
    ("descr-duplicate-fields", npy(dict_text("[('a', '<f4'), ('a', '<i4')]")), None),
    ("descr-top-level-subarray", npy(dict_text("('<f4', (2,))")), None),
    ("descr-nested-too-deep", npy(dict_text("[" * 300 + "]" * 300)), None),
    ("descr-nul", npy(dict_text("'<f4\\x00'")), None),
    # encodings
    ("v3-invalid-utf8", npy(dict_text("[('\udcff', '<f4')]").encode("utf8", "surrogateescape"), (3, 0)), None),
    ("v3-truncated-utf8", npy(dict_text("[('X', '<f4')]").encode().replace(b"X", b"\xe5\x90"), (3, 0)), None),
    ("v3-nul-in-text", npy(dict_text() + "\0", (3, 0)), None),
    ("v3-line-separator-after", npy(dict_text() + "\u2028", (3, 0)), None),
]  # fmt: skip


@pytest.mark.parametrize(("data", "numpy_accepts"), [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_malformed_file_is_refused(tmp_path, data, numpy_accepts):
    marker = tmp_path / "marker-code-ran"
    data = data.replace(MARK.encode(), str(marker).encode())
    path = tmp_path / "bad.npy"
    path.write_bytes(data)

    with pytest.raises(NpyFormatError) as info:
        npydask.read_header(path)
    assert str(path) in str(info.value)
    with pytest.raises(NpyFormatError):
        npydask.parse_header(data)
    with pytest.raises(NpyFormatError) as info:
        npydask.parse_header(data, source="SOURCE-NAME")
    assert "SOURCE-NAME" in str(info.value)
    assert "expected" in str(info.value) and "found" in str(info.value)

    result = numpy_load(path)
    if numpy_accepts:
        assert isinstance(result, np.ndarray), f"numpy now refuses it ({result!r}): drop {numpy_accepts!r}"
    else:
        assert isinstance(result, BaseException), "numpy accepts it: npydask must not be the only one refusing"
    assert not marker.exists(), "the header's code ran"


# Headers that are valid alone (parse_header accepts them) over payloads that are too short.
SHORT_PAYLOAD = [
    ("1e18-doubles", npy(dict_text("'<f8'", shape="(1000000000000000000,)"))),
    ("2**62-bytes", npy(dict_text("'|u1'", shape="(4611686018427387904,)"))),
    ("one-byte-short", npy(dict_text(), payload=bytes(11))),
    ("no-payload", npy(dict_text(), payload=b"")),
    ("0d-no-payload", npy(dict_text(shape="()"), payload=bytes(3))),
    ("struct-short", npy(dict_text("[('a', '<i4'), ('b', '>f8', (2,))]", shape="(2, 2)"), payload=bytes(79))),
]


@pytest.mark.parametrize("data", [c[1] for c in SHORT_PAYLOAD], ids=[c[0] for c in SHORT_PAYLOAD])
def test_short_payload_is_refused(tmp_path, data):
    h = npydask.parse_header(data)
    path = tmp_path / "short.npy"
    path.write_bytes(data)
    with pytest.raises(NpyFormatError, match="truncated") as info:
        npydask.read_header(path)
    assert str(path) in str(info.value) and str(h.nbytes) in str(info.value)
    assert isinstance(numpy_load(path), BaseException)


def test_malformed_ids_unique():
    ids = [c[0] for c in MALFORMED]
    assert len(ids) == len(set(ids))


def test_good_baseline_is_accepted(tmp_path):
    path = tmp_path / "good.npy"
    path.write_bytes(GOOD)
    h = npydask.read_header(path)
    assert (h.shape, h.dtype.str, h.fortran_order, h.data_offset, h.nbytes) == ((3,), "<f4", False, 128, 12)
    assert_matches_numpy(h, path)


class _Touch:
    """Unpickling this creates a file: proof that a payload was unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.path),))


@pytest.mark.parametrize("kind", ["object", "object-field", "object-subarray-field"])
def test_pickled_object_arrays_are_never_unpickled(tmp_path, kind):
    marker = tmp_path / "unpickled"
    evil = _Touch(str(marker))
    if kind == "object":
        a = np.array([evil, 1], dtype=object)
    elif kind == "object-field":
        a = np.array([(1, evil)], dtype=[("a", "<i4"), ("b", "O")])
    else:
        a = np.zeros(1, dtype=[("a", "<i4"), ("b", "O", (2,))])
        a["b"][0, 0] = evil
    path = tmp_path / "pickled.npy"
    np.save(path, a, allow_pickle=True)

    with pytest.raises(NpyFormatError, match="pickle") as info:
        npydask.read_header(path)
    assert str(path) in str(info.value)
    with pytest.raises(NpyFormatError):
        npydask.parse_header(path.read_bytes())
    with pytest.raises(NpyFormatError):
        npydask.read_region(path)
    assert isinstance(numpy_load(path), ValueError)
    assert not marker.exists()
    # The payload is live: numpy with allow_pickle=True does run it.
    np.load(path, allow_pickle=True)
    assert marker.exists()


def test_huge_header_length_is_refused_without_reading(tmp_path):
    path = tmp_path / "huge.npy"
    with open(path, "wb") as f:
        f.write(MAGIC + b"\x02\x00" + struct.pack("<I", 0xFFFFFFFF) + b"{'descr': '<f4'")
        f.truncate(0x1_0000_0100)  # sparse: reading it all would take seconds and 4 GiB
    t0 = time.perf_counter()
    with pytest.raises(NpyFormatError, match="4294967295") as info:
        npydask.read_header(path)
    assert time.perf_counter() - t0 < 1.0
    assert str(path) in str(info.value)
    with pytest.raises(NpyFormatError, match="4294967295"):
        npydask.parse_header(path.open("rb").read(64))
    just_over = MAGIC + b"\x02\x00" + struct.pack("<I", header_mod.MAX_HEADER_BYTES + 1)
    with pytest.raises(NpyFormatError, match="at most 1048576"):
        npydask.parse_header(just_over)


def test_header_of_half_a_MiB_is_accepted(tmp_path):
    # A structured dtype with 19,000 fields: a ~500 KB header, format 2.0.
    dt = np.dtype([(f"field_{i:06d}", "<u1" if i % 2 else ">i2") for i in range(19_000)])
    a = np.frombuffer(np.random.default_rng(1).bytes(3 * dt.itemsize), dt)
    path = tmp_path / "wide.npy"
    with pytest.warns(UserWarning, match="format 2.0"):
        np.save(path, a)
    h = npydask.read_header(path)
    assert h.version == (2, 0) and 400_000 < h.data_offset < header_mod.MAX_HEADER_BYTES
    assert_matches_numpy(h, path)
    refused = numpy_load(path)
    assert isinstance(refused, ValueError) and "max_header_size" in str(refused)
    got, expected = npydask.read_region(path), np.load(path, max_header_size=1 << 20)
    assert got.dtype == expected.dtype and got.tobytes() == expected.tobytes()  # packed: no padding bytes


def test_padded_header_just_under_the_limit(tmp_path):
    text = dict_text()
    pre = 12
    room = header_mod.MAX_HEADER_BYTES - len(text) - 1
    data = npy(text + " " * room, (2, 0), pad=False)[: pre + len(text) + room] + b"\n" + bytes(12)
    data = MAGIC + b"\x02\x00" + struct.pack("<I", header_mod.MAX_HEADER_BYTES) + data[pre:]
    path = tmp_path / "padded.npy"
    path.write_bytes(data)
    h = npydask.read_header(path)
    assert h.data_offset == pre + header_mod.MAX_HEADER_BYTES and h.shape == (3,)
    assert isinstance(numpy_load(path), ValueError)  # over numpy's 10,000 characters


# --------------------------------------------------------------------------
# Truncation at every byte, bit flips in the header.


def _small_files() -> dict[str, bytes]:
    out = {}
    for name, a in [
        ("f4-3x4", np.arange(12, dtype="<f4").reshape(3, 4)),
        ("f4-3x4-F", np.asfortranarray(np.arange(12, dtype=">f4").reshape(3, 4))),
        ("struct", np.zeros(3, [("a", "<i2"), ("b", [("c", "S3"), ("d", ">f8", (2,))])])),
    ]:
        buf = io.BytesIO()
        np.save(buf, a)
        out[name] = buf.getvalue()
    return out


SMALL = _small_files()


@pytest.mark.parametrize("name", list(SMALL))
def test_every_truncation_is_refused(tmp_path, name):
    data = SMALL[name]
    full = npydask.parse_header(data)
    for n in range(len(data)):
        path = tmp_path / f"cut{n}.npy"
        path.write_bytes(data[:n])
        with pytest.raises(NpyFormatError) as info:
            npydask.read_header(path)
        assert str(path) in str(info.value)
        if n >= full.data_offset:
            assert "truncated" in str(info.value)
            assert npydask.parse_header(data[:n]) == full  # the header alone is fine
        else:
            with pytest.raises(NpyFormatError):
                npydask.parse_header(data[:n])
        assert isinstance(numpy_load(path), BaseException)
    path = tmp_path / "whole.npy"
    path.write_bytes(data)
    assert npydask.read_header(path) == full


def _flips(data: bytes, bits: tuple[int, ...]):
    end = npydask.parse_header(data).data_offset
    for pos in range(end):
        for bit in bits:
            flipped = bytearray(data)
            flipped[pos] ^= 1 << bit
            yield pos, bit, bytes(flipped)


@pytest.mark.parametrize(("name", "bits"), [("f4-3x4", tuple(range(8))), ("f4-3x4-F", (0, 1, 5)),
                                             ("struct", (0, 2, 6))])  # fmt: skip
def test_bit_flips_in_header(tmp_path, name, bits):
    accepted = 0
    for pos, bit, data in _flips(SMALL[name], bits):
        path = tmp_path / f"flip{pos}_{bit}.npy"
        path.write_bytes(data)
        expected = numpy_load(path)
        try:
            h = npydask.read_header(path)
            got = npydask.read_region(path)
        except (NpyFormatError, OSError):
            continue  # refused: fine whatever numpy did (npydask may be stricter)
        where = f"byte {pos} bit {bit}: {data[: h.data_offset]!r}"
        assert isinstance(expected, np.ndarray), f"{where}: numpy refuses ({expected!r}), npydask accepts"
        assert_same_array(got, expected)
        _, _, fortran, _, offset = numpy_header(path)
        assert (h.fortran_order, h.data_offset) == (fortran, offset), where
        accepted += 1
    assert accepted > 0  # some flips (byte order, shape digits, padding) give another valid file


# --------------------------------------------------------------------------
# Paths that are not regular files.


def test_missing_file(tmp_path):
    path = tmp_path / "nope.npy"
    with pytest.raises(FileNotFoundError) as info:
        npydask.read_header(path)
    assert str(path) in str(info.value)
    with pytest.raises(FileNotFoundError):
        npydask.read_header(str(path))


def test_dangling_symlink(tmp_path):
    link = tmp_path / "link.npy"
    link.symlink_to(tmp_path / "missing.npy")
    with pytest.raises(FileNotFoundError) as info:
        npydask.read_header(link)
    assert str(link) in str(info.value)


def test_symlink_to_regular_file_is_followed(tmp_path):
    target = tmp_path / "t.npy"
    np.save(target, np.arange(5))
    link = tmp_path / "link.npy"
    link.symlink_to(target)
    assert npydask.read_header(link) == npydask.read_header(target)


@pytest.mark.parametrize("via_link", [False, True])
def test_directory(tmp_path, via_link):
    path = tmp_path / "dir.npy"
    path.mkdir()
    if via_link:
        (tmp_path / "l.npy").symlink_to(path)
        path = tmp_path / "l.npy"
    with pytest.raises(IsADirectoryError) as info:
        npydask.read_header(path)
    assert str(path) in str(info.value)


@pytest.mark.timeout(5)
def test_fifo_does_not_block(tmp_path):
    path = tmp_path / "fifo.npy"
    os.mkfifo(path)
    with pytest.raises(OSError, match=re.escape(str(path))) as info:
        npydask.read_header(path)
    assert not isinstance(info.value, NpyFormatError)


@pytest.mark.timeout(5)
def test_unix_socket_is_refused(tmp_path):
    path = tmp_path / "s.npy"
    if len(str(path)) > 100:
        pytest.skip("socket path too long")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        s.listen()
        with pytest.raises(OSError, match=re.escape(str(path))):
            npydask.read_header(path)


@pytest.mark.timeout(5)
@pytest.mark.parametrize("device", ["/dev/null", "/dev/zero", "/dev/urandom"])
def test_device_is_refused_without_blocking(device):
    if not os.path.exists(device):
        pytest.skip(f"no {device}")
    with pytest.raises(OSError, match=re.escape(device)) as info:
        npydask.read_header(device)
    assert not isinstance(info.value, NpyFormatError)


def test_permission_denied(tmp_path):  # as a normal user
    path = tmp_path / "secret.npy"
    np.save(path, np.arange(3))
    path.chmod(0)
    try:
        if os.geteuid() == 0:
            pytest.skip("root bypasses file permissions; see test_permission_denied_as_nobody")
        with pytest.raises(PermissionError) as info:
            npydask.read_header(path)
        assert str(path) in str(info.value)
    finally:
        path.chmod(0o644)


@pytest.mark.timeout(60)
def test_permission_denied_as_nobody():
    """As root, check the same in a child process that drops to an unprivileged user."""
    if os.geteuid() != 0:
        pytest.skip("only meaningful as root; test_permission_denied covers other users")
    folder = pathlib.Path(tempfile.mkdtemp(prefix="npydask-perm-"))  # pytest's tmp folders are 0700
    try:
        folder.chmod(0o755)
        path = folder / "secret.npy"
        np.save(path, np.arange(3))
        path.chmod(0)
        code = (
            "import sys, npydask\n"
            "try:\n    npydask.read_header(sys.argv[1])\n"
            "except PermissionError as e:\n    print('PermissionError', sys.argv[1] in str(e))\n"
        )
        try:
            out = subprocess.run(
                [sys.executable, "-c", code, str(path)], user=65534, capture_output=True, text=True, timeout=50
            )
        except OSError as e:
            pytest.skip(f"cannot run a child as nobody: {e}")
        if out.returncode != 0 and not out.stdout:
            pytest.skip(f"the unprivileged child cannot import npydask here: {out.stderr[-300:]}")
        assert out.stdout.strip() == "PermissionError True", out.stderr
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# --------------------------------------------------------------------------
# The memo and the two parser paths.


def test_same_bytes_twice_give_equal_headers():
    data = SMALL["struct"]
    header_mod.HEADER_MEMO.clear()
    first = npydask.parse_header(data)
    second = npydask.parse_header(data)
    assert first == second
    assert first.dtype is second.dtype  # the memo answered


def test_header_differing_only_in_payload_reuses_the_memo():
    a = io.BytesIO()
    b = io.BytesIO()
    np.save(a, np.zeros((3, 4), "<f4"))
    np.save(b, np.ones((3, 4), "<f4"))
    header_mod.HEADER_MEMO.clear()
    ha = npydask.parse_header(a.getvalue())
    hb = npydask.parse_header(b.getvalue())
    assert ha == hb and ha.dtype is hb.dtype
    assert len(header_mod.HEADER_MEMO) == 1


def test_memo_is_bounded():
    header_mod.HEADER_MEMO.clear()
    text = dict_text() + " " * (header_mod._MEMO_MAX_KEY + 10)
    npydask.parse_header(npy(text, (2, 0)))
    assert len(header_mod.HEADER_MEMO) == 0  # long headers are parsed, not kept
    for n in range(header_mod._MEMO_LIMIT + 5):
        npydask.parse_header(npy(dict_text(shape=f"({n},)")))
    assert len(header_mod.HEADER_MEMO) <= header_mod._MEMO_LIMIT


def test_memo_does_not_hide_errors_or_sources():
    bad = npy(dict_text(shape="(-1,)"))
    for source in ["first", "second"]:
        with pytest.raises(NpyFormatError, match=source):
            npydask.parse_header(bad, source=source)


def _spellings(descr: object, fortran: bool, shape: tuple[int, ...], draw) -> str:
    """The same dict in another literal spelling: key order, spacing, newlines, trailing comma."""
    items = [("descr", descr), ("fortran_order", fortran), ("shape", shape)]
    items = draw(st.permutations(items))
    quote = draw(st.sampled_from(["'", '"']))
    sep = draw(st.sampled_from([": ", ":", " : ", ":\n  "]))
    comma = draw(st.sampled_from([", ", ",", ",\n ", " ,  "]))
    body = comma.join(f"{quote}{k}{quote}{sep}{v!r}" for k, v in items)
    tail = draw(st.sampled_from(["", ",", ", ", ",\n"]))
    return "{" + draw(st.sampled_from(["", " ", "\n"])) + body + tail + "}"


@given(
    dtype=dtypes(max_itemsize=512),
    shape=shapes(max_dims=5),
    fortran=st.booleans(),
    data=st.data(),
)
def test_fast_and_slow_paths_agree(dtype, shape, fortran, data):
    descr = np.lib.format.dtype_to_descr(dtype)
    canonical = f"{{'descr': {descr!r}, 'fortran_order': {fortran!r}, 'shape': {shape!r}, }}"
    other = _spellings(descr, fortran, shape, data.draw)
    version = (3, 0)
    fast = npydask.parse_header(npy(canonical, version))
    slow = npydask.parse_header(npy(other, version))
    for h in (fast, slow):
        assert (h.shape, h.fortran_order) == (shape, fortran)
        assert_dtype_identical(h.dtype, np.lib.format.descr_to_dtype(descr))
    # numpy reads the other spelling the same way
    f = io.BytesIO(npy(other, version))
    np.lib.format.read_magic(f)
    n_shape, n_fortran, n_dtype = _read_array_header(f, version, max_header_size=1 << 21)
    assert (n_shape, n_fortran) == (shape, fortran)
    assert_dtype_identical(n_dtype, slow.dtype)


@pytest.mark.parametrize(
    "text",
    [
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3,)}",
        "{'shape': (3,), 'fortran_order': False, 'descr': '<f4'}",
        '{"descr": "<f4", "fortran_order": False, "shape": (3,), }',
        "{'descr':'<f4','fortran_order':False,'shape':(3,)}",
        "{\n 'descr': '<f4',\n 'fortran_order': False,\n 'shape': (3,),\n}",
        "{'descr': '<' 'f4', 'fortran_order': False, 'shape': (0x3,), }",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (0o3,), }",
        "{'descr': '<f4', # a comment inside\n 'fortran_order': False, 'shape': (3,), }",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3, ), }",
    ],
    ids=[
        "no-trailing-comma",
        "key-order",
        "double-quotes",
        "no-spaces",
        "multi-line",
        "concat-hex",
        "octal",
        "inner-comment",
        "space-in-shape",
    ],  # fmt: skip
)
def test_other_spellings_are_read_as_numpy_reads_them(tmp_path, text):
    path = tmp_path / "s.npy"
    path.write_bytes(npy(text, payload=bytes(12)))
    h = npydask.read_header(path)
    assert_matches_numpy(h, path)
    assert (h.shape, h.dtype.str) == ((3,), "<f4")
    assert isinstance(numpy_load(path), np.ndarray)


def test_with_offset():
    h = npydask.parse_header(SMALL["f4-3x4"])
    moved = h.with_offset(1000)
    assert moved.data_offset == h.data_offset + 1000
    assert (moved.shape, moved.dtype, moved.nbytes, moved.version) == (h.shape, h.dtype, h.nbytes, h.version)
    assert (h.ndim, h.size, h.itemsize) == (2, 12, 4)
    with pytest.raises(AttributeError):
        h.shape = (1,)  # type: ignore[misc]


def test_error_is_a_value_error():
    assert issubclass(NpyFormatError, ValueError)
    with pytest.raises(ValueError, match="the magic string"):
        npydask.parse_header(b"not an npy file")


@pytest.mark.parametrize("dtype", [np.dtype([]), np.dtype("V0")], ids=["empty-struct", "V0"])
def test_zero_itemsize_dtypes_numpy_writes_are_read(tmp_path, dtype):
    path = tmp_path / "zero.npy"
    np.save(path, np.zeros((3, 2), dtype=dtype))
    h = npydask.read_header(path)
    assert h.dtype == np.load(path).dtype and h.shape == (3, 2) and h.nbytes == 0
    got = npydask.read_region(path, (1,), (3,))
    assert got.dtype == dtype and got.shape == (2, 2)
    assert npydask.from_npy(path).compute().shape == (3, 2)


@pytest.mark.parametrize("descr", ["|S0", "<U0"])
def test_zero_length_strings_are_refused(tmp_path, descr):
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': (3,), }}".encode()
    header += b" " * (-(len(header) + 11) % 64) + b"\n"
    data = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header
    with pytest.raises(npydask.NpyFormatError, match="non-zero length"):
        npydask.parse_header(data)


def test_zero_itemsize_cannot_hide_an_overflowing_shape():
    header = b"{'descr': '|V0', 'fortran_order': False, 'shape': (4611686018427387904, 4), }"
    header += b" " * (-(len(header) + 11) % 64) + b"\n"
    data = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header
    with pytest.raises(npydask.NpyFormatError, match="at most"):
        npydask.parse_header(data)


# --------------------------------------------------------------------------
# Zero-itemsize arrays: bounded element count, never a spinning compute (issue 12, item 6)


ZERO_LIMIT = getattr(header_mod, "MAX_ZERO_ITEMSIZE_ELEMENTS", 1 << 20)
ZERO_ITEMSIZE_HUGE = [
    ("'|V0'", (10**18,)),
    ("[]", (10**18,)),
    ("'|V0'", (10**9, 10**9)),
    ("[('a', '<f4', (0,))]", (2**40,)),
    ("'|V0'", (ZERO_LIMIT + 1,)),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("descr", "shape"), ZERO_ITEMSIZE_HUGE, ids=[f"{d}-{s}" for d, s in ZERO_ITEMSIZE_HUGE])
def test_huge_zero_itemsize_arrays_are_refused_at_open(tmp_path, descr, shape):
    path = tmp_path / "z.npy"
    path.write_bytes(npy(dict_text(descr, shape=repr(shape)), payload=b""))
    assert isinstance(numpy_header(path)[1], tuple)  # numpy reads the header (and then spins on a copy)
    for call in (
        lambda: npydask.read_header(path),
        lambda: npydask.read_region(path),
        lambda: npydask.from_npy(path).compute(),
        lambda: npydask.open_dataset(files=[str(path)]).stack().compute(),
    ):
        with pytest.raises(NpyFormatError, match=r"at most \d+ elements in an array of zero-size items") as info:
            call()
        assert str(path) in str(info.value)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("descr", ["'|V0'", "[]", "[('a', '<f4', (0,))]"])
@pytest.mark.parametrize("shape", [(0,), (7,), (1000, 1000), (ZERO_LIMIT,), (0, 10**18)])
def test_zero_itemsize_arrays_up_to_the_limit_compute_at_once(tmp_path, descr, shape):
    path = tmp_path / "z.npy"
    path.write_bytes(npy(dict_text(descr, shape=repr(shape)), payload=b""))
    expected = np.load(path)
    start = time.perf_counter()
    for got in (
        npydask.read_region(path),
        npydask.from_npy(path).compute(),
        npydask.from_npy(path)[::-1].compute(),
        npydask.open_dataset(files=[str(path)] * 3).stack().compute()[1],
    ):
        assert got.shape == expected.shape and got.dtype == expected.dtype
    assert time.perf_counter() - start < 30


# --------------------------------------------------------------------------
# Refusing (or reading) a header of up to 1 MiB costs bounded memory and a bounded message (issue 12)

_BIG = (1 << 20) - 400


def _v2(text: str) -> bytes:
    return npy(text[:_BIG], (2, 0), payload=b"")


BIG_HEADERS = {
    "many-dims": _v2(dict_text(shape="(" + "1," * (_BIG // 2) + ")")),
    "bool-dims": _v2(dict_text(shape="(" + "True," * (_BIG // 5) + ")")),
    "unclosed-shape": _v2("{'descr': '<f4', 'fortran_order': False, 'shape': (" + "1, " * (_BIG // 3)),
    "bad-last-field": _v2(dict_text("[" + ",".join(f"('f{i}', '<f4')" for i in range(50_000)) + ", ('x', 'Q9')]")),
    "float-last-dim": _v2(dict_text(shape="(" + "2, " * (_BIG // 3 - 20) + "2.5)")),
    "nested-lists": _v2(dict_text("[" + "[" * 150 + "1" + "]" * 150 + "]" + " " * (_BIG - 400))),
    "long-key": _v2("{'" + "k" * _BIG + "': 1}"),
    "long-descr-string": _v2(dict_text("'" + "<f4," * (_BIG // 4 - 30) + "zz'")),
    "long-trailing-text": _v2(dict_text() + " x" * (_BIG // 2 - 60)),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(BIG_HEADERS))
def test_refusing_a_1_MiB_header_costs_little_memory_and_quotes_little(name):
    import tracemalloc

    data = BIG_HEADERS[name]
    assert len(data) > 800_000
    header_mod.HEADER_MEMO.clear()
    error: BaseException | None = None
    tracemalloc.start()
    try:
        npydask.parse_header(data, source="big.npy")
    except Exception as e:  # noqa: BLE001 - checked below, outside the measurement (pytest.raises allocates)
        error = e
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert isinstance(error, NpyFormatError), repr(error)[:300]
    message = str(error)
    assert message.startswith("big.npy: not a valid .npy file: expected ")
    assert len(message) < 700, (len(message), message[:300])
    assert "\n" not in message
    # (numpy's own parser of a 1 MiB comma-separated dtype string takes ~66 MB; npydask's part is small.
    # Before the bounded literal parser: 160-360 MB, and messages quoting the whole header.)
    limit = 100e6 if name == "long-descr-string" else 20e6
    assert peak < limit, f"{peak / 1e6:.0f} MB to refuse a {len(data) / 2**20:.1f} MiB header"


@pytest.mark.timeout(120)
def test_reading_a_1_MiB_structured_header_costs_little_memory(tmp_path):
    import tracemalloc

    dtype = np.dtype([(f"f{i}", "<f4" if i % 2 else ">i2") for i in range(40_000)])
    path = tmp_path / "wide.npy"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (numpy notes that it wrote format 2.0)
        np.save(path, np.zeros(2, dtype))
    data = path.read_bytes()
    assert npydask.parse_header(data).data_offset > 500_000
    header_mod.HEADER_MEMO.clear()
    tracemalloc.start()
    try:
        h = npydask.parse_header(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert_matches_numpy(h, path)
    assert peak < 60e6, f"{peak / 1e6:.0f} MB to read a {h.data_offset / 2**20:.1f} MiB header"


# --------------------------------------------------------------------------
# Every header numpy.load accepts and npydask refuses is a documented refusal (issue 12, item 6).
# A table of spellings, generated systematically (what surrounds the dict, blanks and comments
# inside it, key order and spellings, every kind of shape, fortran_order and descr), each checked
# in versions 1.0 and 3.0 against numpy.load on the header plus the payload it asks for.

_README = pathlib.Path(__file__).resolve().parents[2] / "docs" / "errors.md"
_FUZZ = pathlib.Path(__file__).resolve().parents[2] / "ci" / "fuzz_npy.py"


def _fuzz_module():
    """``ci/fuzz_npy.py``, loaded once: its DOCUMENTED_STRICTER labels classify npydask's refusals."""
    import importlib.util

    name = "npydask_ci_fuzz_npy"  # (the name tests/test_fuzz.py loads it under)
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, _FUZZ)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[name] = module  # dataclasses look their module up by name
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    return sys.modules[name]


_D, _F, _S = "'descr'", "'fortran_order'", "'shape'"


def _dct(descr="'<f4'", fortran="False", shape="(3,)", sep=", ", colon=": ", open_="{", close=", }", keys=(_D, _F, _S),
         order=(0, 1, 2)) -> str:  # fmt: skip
    vals = (descr, fortran, shape)
    return open_ + sep.join(f"{keys[i]}{colon}{vals[i]}" for i in order) + close


def _header_variants() -> dict[str, str]:
    out: dict[str, str] = {}
    base = _dct()
    for name, pre, post in [
        ("plain", "", "\n"), ("pad", "", "      \n"), ("lead-space", " ", "\n"), ("lead-tab", "\t", "\n"),
        ("lead-newline", "\n", "\n"), ("lead-paren", "(", ")\n"), ("lead-comment", "# c\n", "\n"),
        ("trail-tab", "", "\t\n"),
        ("trail-cr", "", "\r\n"), ("trail-comment", "", "  # c\n"), ("trail-2nl", "", "\n\n"), ("no-nl", "", "   "),
        ("trail-bs", "", "\\\n"), ("trail-semicolon", "", ";\n"), ("trail-ff", "", "\f\n"),
    ]:  # fmt: skip
        out[f"around-{name}"] = pre + base + post
    for name, kw in [
        ("no-space", dict(sep=",", colon=":")), ("spaced", dict(sep=" , ", colon=" : ")),
        ("tabs", dict(sep=",\t", colon=":\t")),
        ("newlines", dict(sep=",\n ", colon=":\n")), ("cr", dict(sep=",\r ")), ("crlf", dict(sep=",\r\n ")),
        ("ff", dict(sep=",\f")),
        ("comments", dict(sep=", # x\n ")), ("backslash", dict(sep=", \\\n ")), ("no-trailing-comma", dict(close="}")),
        ("two-trailing-commas", dict(close=",,}")), ("open-space", dict(open_="{ ")), ("close-space", dict(close=" }")),
        ("nbsp", dict(sep=",\u00a0")),
    ]:  # fmt: skip
        out[f"inside-{name}"] = _dct(**kw) + "\n"
    for order in itertools.permutations(range(3)):
        out[f"order-{''.join(map(str, order))}"] = _dct(order=order) + "\n"
    for name, k in [
        ("dq", '"descr"'), ("u", "u'descr'"), ("r", "r'descr'"), ("R", "R'descr'"), ("triple", "'''descr'''"),
        ("concat", "'des' 'cr'"), ("escape", r"'\x64escr'"), ("octal-esc", r"'\144escr'"),
        ("unicode-esc", r"'\u0064escr'"),
        ("named-esc", r"'\N{LATIN SMALL LETTER D}escr'"), ("bytes", "b'descr'"), ("paren", "('descr')"),
        ("fstring", "f'descr'"),
        ("bad-escape", r"'de\scr'"),
    ]:  # fmt: skip
        out[f"key-{name}"] = _dct(keys=(k, _F, _S)) + "\n"
    for name, sh in [
        ("empty", "()"), ("one", "(3,)"), ("two", "(3, 4)"), ("trailing", "(3, 4,)"), ("list", "[3]"), ("int", "3"),
        ("paren-int", "(3)"), ("plus", "(+3,)"), ("minus-zero", "(-0,)"), ("neg", "(-3,)"), ("float", "(3.0,)"),
        ("bool", "(True,)"),
        ("hex", "(0x3,)"), ("oct", "(0o3,)"), ("bin", "(0b11,)"), ("under", "(1_0,)"), ("leading-zero", "(03,)"),
        ("zeros", "(00,)"),
        ("paren-dim", "((3),)"), ("neg-paren", "(-(0),)"), ("nested", "((3,),)"), ("long-L", "(3L,)"),
        ("long-l", "(3l,)"),
        ("space-L", "(3 L,)"), ("complex", "(3j,)"), ("expr", "(1+2,)"), ("tilde", "(~-4,)"), ("str", "('3',)"),
        ("none", "None"),
        ("power", "(2**3,)"), ("double-neg", "(--0,)"), ("call", "(int(3),)"), ("set", "{3}"),
        ("big-int", "(" + "9" * 30 + ",)"),
        ("zero-huge", "(0, " + "9" * 30 + ")"), ("spaces", "( 3 , 4 )"), ("newline-dims", "(3,\n 4)"),
    ]:  # fmt: skip
        out[f"shape-{name}"] = _dct(shape=sh) + "\n"
    for name, fo in [("true", "True"), ("zero", "0"), ("one", "1"), ("str", "'False'"), ("paren", "(False)"),
                     ("none", "None"), ("not", "not True"), ("attr", "np.False_")]:  # fmt: skip
        out[f"fortran-{name}"] = _dct(fortran=fo) + "\n"
    for name, de in [
        ("u", "u'<f4'"), ("dq", '"<f4"'), ("concat", "'<' 'f4'"), ("no-order", "'f4'"), ("name", "'float32'"),
        ("native", "'=f4'"),
        ("big", "'>f4'"), ("pipe", "'|u1'"), ("comma", "'<f4,<i2'"), ("space", "' <f4'"), ("paren", "('<f4')"),
        ("struct", "[('a', '<f4')]"), ("struct-trailing", "[('a', '<f4'),]"),
        ("struct-subarray", "[('a', '<f4', (2,))]"),
        ("struct-subarray-int", "[('a', '<f4', 2)]"), ("struct-empty-shape", "[('a', '<f4', ())]"),
        ("struct-list-field", "[['a', '<f4']]"), ("struct-tuple", "(('a', '<f4'),)"),
        ("struct-pad", "[('', '|V4'), ('a', '<f4')]"),
        ("struct-title", "[(('t', 'a'), '<f4')]"), ("struct-title-list", "[(['t', 'a'], '<f4')]"),
        ("struct-nested", "[('a', [('b', '<i2')])]"), ("struct-dup", "[('a', '<f4'), ('a', '<f4')]"),
        ("struct-4", "[('a', '<f4', (2,), 1)]"), ("struct-shape-list", "[('a', '<f4', [2])]"),
        ("struct-field-3-list", "[('a', '<f4', (2,)), ['b', '<i2']]"), ("struct-bad-escape", r"[('a\q', '<f4')]"),
        ("struct-plus-shape", "[('a', '<f4', (+2,))]"), ("struct-name-bytes", "[(b'a', '<f4')]"),
        ("struct-shape-neg", "[('a', '<f4', (-1,))]"), ("struct-bool-shape", "[('a', '<f4', (True,))]"),
        ("struct-str-shape", "[('a', '<f4', ('2',))]"), ("subarray-top", "('<f4', (2,))"),
        ("subarray-top-list", "['<f4', (2,)]"),
        ("object", "'|O'"), ("V0", "'|V0'"), ("S0", "'|S0'"), ("U0", "'<U0'"), ("S5", "'|S5'"), ("M8", "'<M8[s]'"),
        ("m8", "'<m8[us]'"), ("empty-list", "[]"), ("dict", "{'names': ['a'], 'formats': ['<f4']}"),
        ("bytes", "b'<f4'"),
        ("float", "4.0"), ("int", "4"), ("none", "None"), ("longdouble", "'<f16'"), ("c8", "'<c8'"),
    ]:  # fmt: skip
        out[f"descr-{name}"] = _dct(descr=de) + "\n"
    out["keys-duplicate"] = "{'descr': '<f8', 'descr': '<f4', 'fortran_order': False, 'shape': (3,), }\n"
    out["keys-extra"] = _dct(close=", 'x': 1}") + "\n"
    out["keys-missing"] = "{'descr': '<f4', 'shape': (3,)}\n"
    out["keys-unpack"] = "{'descr': '<f4', **{'fortran_order': False, 'shape': (3,)}}\n"
    return out


HEADER_VARIANTS = _header_variants()

# The variants numpy.load reads and npydask refuses, with the documented refusal each falls under
# (labels of ci/fuzz_npy.py's DOCUMENTED_STRICTER). Anything else must be read alike or refused by both.
STRICTER_VARIANTS = {
    **{
        f"around-{n}": "header text not starting with '{'"
        for n in ("lead-space", "lead-tab", "lead-newline", "lead-paren", "lead-comment")
    },
    **{
        f"around-{n}": "text after the dict other than spaces + one newline"
        for n in ("trail-tab", "trail-cr", "trail-comment", "trail-2nl", "no-nl", "trail-bs", "trail-ff")
    },
    "shape-plus": "non-literal syntax (only str/int/bool literals, tuples, lists)",
    "descr-struct-plus-shape": "non-literal syntax (only str/int/bool literals, tuples, lists)",
    "shape-long-L": "Python 2 long suffix, e.g. (3L,) (numpy strips it in 1.0/2.0 headers)",
    "shape-space-L": "Python 2 long suffix, e.g. (3L,) (numpy strips it in 1.0/2.0 headers)",
    "descr-S0": "S0/U0 string dtype",
    "descr-U0": "S0/U0 string dtype",
    "descr-struct-list-field": "descr part of a wrong arity or type (numpy ignores extra items)",
    "descr-struct-shape-list": "descr part of a wrong arity or type (numpy ignores extra items)",
    "descr-struct-field-3-list": "descr part of a wrong arity or type (numpy ignores extra items)",
    "descr-struct-bad-escape": "invalid escape sequence in a string (Python only warns)",
    "keys-duplicate": "dict keys not exactly once each",
}

# Where the README's refusal list (Security and robustness) names each documented refusal.
README_REFUSALS = {
    "object dtype (never unpickled)": "Object dtypes are refused",
    "S0/U0 string dtype": "`S0`/`U0`",
    "top-level subarray dtype": "top-level subarray",
    "shape not a tuple of ints (bools)": "bools in shapes",
    "dict keys not exactly once each": "duplicate keys",
    "text after the dict other than spaces + one newline": "anything after the dict but spaces and one newline",
    "header text not starting with '{'": "anything before the dict",
    "non-literal syntax (only str/int/bool literals, tuples, lists)": "`(+3,)`",
    "descr part of a wrong arity or type (numpy ignores extra items)": "lists where numpy takes tuples",
    "header over 1 MiB": "Headers may be up to 1 MiB",
    "zero-size items, too many elements": "zero-size items",
    "invalid escape sequence in a string (Python only warns)": "invalid escape sequences",
    "Python 2 long suffix, e.g. (3L,) (numpy strips it in 1.0/2.0 headers)": "Python 2 `3L`",
}


def _variant_file(text: str, version: tuple[int, int]) -> bytes:
    raw = text.encode("utf8" if version == (3, 0) else "latin1")
    fmt = "<H" if version == (1, 0) else "<I"
    return MAGIC + bytes(version) + struct.pack(fmt, len(raw)) + raw


def _numpy_load_verdict(data: bytes) -> tuple[tuple[int, ...], np.dtype] | BaseException:
    """numpy.load on the header and the payload its own reader asks for (zeros, at most 1 MiB)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            f = io.BytesIO(data)
            shape, _, dtype = _read_array_header(f, np.lib.format.read_magic(f), max_header_size=1 << 21)
            payload = bytes(min(max(int(np.prod(shape, dtype=object)) * dtype.itemsize, 0), 1 << 20))
            a = np.load(io.BytesIO(data + payload), allow_pickle=False, max_header_size=1 << 21)
            return a.shape, a.dtype
        except Exception as e:  # noqa: BLE001 - any refusal counts
            return e


@pytest.mark.parametrize("version", [(1, 0), (3, 0)], ids=["v1", "v3"])
@pytest.mark.parametrize("name", list(HEADER_VARIANTS))
def test_header_variants_numpy_reads_are_read_alike_or_a_documented_refusal(name, version):
    data = _variant_file(HEADER_VARIANTS[name], version)
    expected = _numpy_load_verdict(data)
    try:
        got: npydask.NpyHeader | NpyFormatError = npydask.parse_header(data)
    except NpyFormatError as e:
        got = e
    if isinstance(expected, BaseException):
        assert isinstance(got, NpyFormatError), f"numpy refuses ({expected!r}) but npydask reads {got}"
        return
    label = STRICTER_VARIANTS.get(name)
    if name in ("shape-long-L", "shape-space-L") and version == (3, 0):
        label = None  # (numpy strips the L in 1.0/2.0 headers only)
    if label is None:
        assert not isinstance(got, NpyFormatError), f"numpy reads it, npydask refuses: {got}"
        assert got.shape == expected[0]
        assert_dtype_identical(got.dtype, expected[1])
        return
    assert isinstance(got, NpyFormatError), f"expected the documented refusal {label!r}, npydask reads it"
    assert _fuzz_module().stricter_reason(got) == label, str(got)


def test_every_documented_refusal_is_in_the_readme_list():
    documented = _fuzz_module().DOCUMENTED_STRICTER
    assert set(README_REFUSALS) == set(documented)
    assert set(STRICTER_VARIANTS.values()) <= set(documented)
    security = _README.read_text().split("## Security and robustness", 1)[1].split("\n## ", 1)[0]
    for label, phrase in README_REFUSALS.items():
        assert phrase in security, (
            f"the documentation's refusal list (docs/errors.md) does not name {label!r} ({phrase!r})"
        )
