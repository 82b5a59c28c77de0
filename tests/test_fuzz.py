"""Fuzzing the NPY reader with hypothesis, numpy as the oracle (fixed budgets, run in CI).

Every input is written to a real file and goes through ``parse_header``,
``read_header``, ``read_region`` (pread, mmap, auto) and, for a subset,
``from_npy(...).compute()``; the oracle in ``ci/fuzz_npy.py`` (shared with the
atheris harness) compares each verdict with ``numpy.load(path,
allow_pickle=False)``. Allowed: numpy's array exactly, ``NpyFormatError``,
``RoiError`` or an ``OSError`` subclass; never another exception, never a
different array, never accepting what numpy refuses. Files numpy loads and
npydask refuses must be one of the documented refusals.

Findings of the atheris runs are regression tests at the end of this file.
"""

from __future__ import annotations

import ast
import importlib.util
import math
import os
import pathlib
import struct
import subprocess
import sys
import time
import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import npydask
from npydask.testing.strategies import arrays, dtypes, npy_bytes

_HARNESS = pathlib.Path(__file__).resolve().parent.parent / "ci" / "fuzz_npy.py"
_spec = importlib.util.spec_from_file_location("npydask_ci_fuzz_npy", _HARNESS)
assert _spec is not None and _spec.loader is not None
fuzz = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = fuzz  # dataclasses look their module up by name
_spec.loader.exec_module(fuzz)

MAGIC = b"\x93NUMPY"
VERSIONS = [(1, 0), (2, 0), (3, 0)]


def run(data: bytes, folder: pathlib.Path, *, compute: bool = False) -> Any:
    """The oracle's verdict; fails the test on a violation or an undocumented stricter refusal."""
    out = fuzz.check(data, str(folder), compute=compute)
    assert out.stricter is None or not out.stricter.startswith("UNDOCUMENTED"), (out.stricter, data[:400])
    return out


def preamble(version: tuple[int, int], header: bytes) -> bytes:
    """Magic, version and a correct length field for ``header``."""
    fmt = "<H" if version == (1, 0) else "<I"
    return MAGIC + bytes(version) + struct.pack(fmt, len(header))


# --------------------------------------------------------------------------
# Arbitrary bytes


_preambles = st.one_of(
    st.just(b""),
    st.just(MAGIC),
    st.sampled_from([MAGIC + bytes(v) for v in VERSIONS + [(0, 0), (1, 1), (4, 0), (255, 255)]]),
    st.builds(lambda n: MAGIC + b"\x01\x00" + struct.pack("<H", n), st.integers(0, 300)),
    st.builds(lambda v, n: MAGIC + bytes(v) + struct.pack("<I", n), st.sampled_from([(2, 0), (3, 0)]),
              st.one_of(st.integers(0, 300), st.sampled_from([2**20, 2**20 + 1, 2**32 - 1]))),
)  # fmt: skip


@pytest.mark.timeout(120)
@settings(max_examples=300)
@given(head=_preambles, body=st.binary(max_size=300))
def test_arbitrary_bytes(tmp_path, head, body):
    run(head + body, tmp_path)


@pytest.mark.timeout(120)
@settings(max_examples=150)
@given(body=st.text(alphabet=st.sampled_from("{}()[]',: \n\t0123456789-TrueFalsdcripohtng<>|f48iSUV\u00e9#L"),
                    max_size=120), version=st.sampled_from(VERSIONS))  # fmt: skip
def test_arbitrary_header_text(tmp_path, body, version):
    """Random text from the header's own alphabet behind a correct preamble."""
    raw = body.encode("utf8" if version == (3, 0) else "latin1")
    run(preamble(version, raw) + raw + bytes(64), tmp_path)


# --------------------------------------------------------------------------
# Valid files, mutated


def _saved(a: np.ndarray, version: tuple[int, int] | None, order: str) -> bytes:
    return npy_bytes(a, version, order)


_small_arrays = arrays(max_nbytes=256, max_dims=4)


@pytest.mark.timeout(180)
@settings(max_examples=200)
@given(a=_small_arrays, version=st.sampled_from([None, *VERSIONS]), order=st.sampled_from("CF"), data=st.data())
def test_mutated_valid_files(tmp_path, a, version, order, data):
    raw = bytearray(_saved(a, version, order))
    end = npydask.parse_header(bytes(raw)).data_offset
    n = data.draw(st.integers(1, 4), label="mutations")
    for _ in range(n):
        kind = data.draw(st.sampled_from(["flip", "delete", "insert", "set"]), label="kind")
        # three in four mutations land in the header: the payload only changes values
        limit = end if data.draw(st.integers(0, 3)) else len(raw)
        pos = data.draw(st.integers(0, max(min(limit, len(raw)) - 1, 0)), label="pos")
        if kind == "flip" and raw:
            raw[pos] ^= 1 << data.draw(st.integers(0, 7), label="bit")
        elif kind == "delete" and raw:
            del raw[pos]
        elif kind == "insert":
            raw.insert(pos, data.draw(st.sampled_from(b" \n'(),:0123456789{}[]\x00\xff"), label="byte"))
        elif raw:
            raw[pos] = data.draw(st.integers(0, 255), label="byte")
        end = min(end, len(raw))
    run(bytes(raw), tmp_path, compute=data.draw(st.integers(0, 3)) == 0)


@pytest.mark.timeout(120)
@settings(max_examples=100)
@given(a=_small_arrays, version=st.sampled_from([None, *VERSIONS]), order=st.sampled_from("CF"))
def test_valid_files_are_read_as_numpy_reads_them(tmp_path, a, version, order):
    out = run(_saved(a, version, order), tmp_path, compute=True)
    assert (out.numpy, out.npydask) == ("accept", "accept"), out


# --------------------------------------------------------------------------
# Truncation at every byte (files test_header.py's table does not have)


def _truncation_files() -> dict[str, bytes]:
    files = {
        "v2-f8-2x3": npy_bytes(np.arange(6, dtype=">f8").reshape(2, 3), (2, 0)),
        "v3-utf8-struct": npy_bytes(np.zeros(2, [("\u540d", "<i2"), ("b", "|b1", (2,))]), (3, 0)),
        "0d-i8": npy_bytes(np.array(-5, "<i8"), (1, 0)),
        "empty-0x4": npy_bytes(np.zeros((0, 4), "<f4"), (1, 0)),
        "bool-F-3x2": npy_bytes(np.array([[True, False], [False, True], [True, True]]), (1, 0), "F"),
        "U2-M8": npy_bytes(np.array(["ab", "\u00e9"], ">U2"), (1, 0)),
    }
    return files


TRUNCATION = _truncation_files()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(TRUNCATION))
def test_truncation_at_every_byte(tmp_path, name):
    data = TRUNCATION[name]
    for n in range(len(data)):
        out = run(data[:n], tmp_path)
        assert out.npydask == "NpyFormatError" and out.numpy != "accept", (n, out)
    out = run(data, tmp_path, compute=True)
    assert (out.numpy, out.npydask) == ("accept", "accept")


# --------------------------------------------------------------------------
# Random header dicts behind a correct preamble


_BAD_DESCRS = [
    "'|O'", "'O'", "'S0'", "'|S0'", "'<U0'", "'U'", "'S'", "'|V0'", "'V'", "'<f3'", "'x'", "''", "'i4,i4'",
    "'T'", "'float32'", "'<M8[D]'", "'<M8[7q]'", "'<m8'", "'(2,)i4'", "'2i4'", "('<f4', (2,))", "[]",
    "[('a', '<f4', 2)]", "[('a', '<f4', (2, -1))]", "[('', '|V4'), ('b', '<i2')]", "[(('t', 'n'), '<f4')]",
    "[['a', '<f4']]", "None", "3", "b'<f4'", "u'<f4'", "'<' 'f4'", "[('a', [])]", "[('a', '|O')]",
    "[('a', '<f4'), ('a', '<i4')]", "[('\u00e9', '<f4')]", "[('\u540d', '>i2')]", "'<U100000000000'",
    "[('a', '<f4', 1.5)]", "{'a': 1}", "[('a', ('<f4', (2,), 'x'))]", "'<f4\\x00'", "'\u00e9'",
]  # fmt: skip
_FORTRANS = ["True", "False", "0", "1", "'True'", "None", "true", "(True,)", "not True", "False or True"]
_SHAPE_ODDITIES = ["(1.0,)", "(True, 2)", "[2, 3]", "((2,), 3)", "(+2,)", "(2L,)", "('2',)", "2", "()", "(0x3,)",
                   "(1_0,)", "(None,)", "(2, -0)", "(-1,)", "(-2, 0)", "(2**3,)", "(3,)*2", "{2}", "(3,,)",
                   "(" * 40 + ")" * 40]  # fmt: skip
_HUGE = [2**31, 2**62, 2**63 - 1, 2**63, 2**64, 10**18, 10**30]


@st.composite
def _descrs(draw: Any) -> str:
    kind = draw(st.integers(0, 3))
    if kind == 0:
        dt = draw(dtypes())
        return repr(np.lib.format.dtype_to_descr(dt))
    if kind == 1:
        return draw(st.sampled_from(_BAD_DESCRS))
    if kind == 2:
        return repr(draw(st.text(min_size=0, max_size=8)))
    code = draw(st.sampled_from(["b1", "i1", "u2", "i4", "f2", "f4", "f8", "c8", "g", "M8[s]", "S3", "U2", "V2"]))
    return repr(draw(st.sampled_from("<>|=")) + code)


@st.composite
def _shapes(draw: Any) -> str:
    if draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from(_SHAPE_ODDITIES))
    dims = draw(st.lists(st.one_of(st.integers(0, 5), st.integers(-3, -1), st.sampled_from(_HUGE)), max_size=4))
    if len(dims) == 1:
        return f"({dims[0]},)"
    sep = draw(st.sampled_from([", ", ",", " , "]))
    return "(" + sep.join(str(d) for d in dims) + ")"


@st.composite
def header_texts(draw: Any) -> str:
    """A header dict spelled many ways: keys, values, spacing, order, extra and missing keys, non-ASCII."""
    quote = draw(st.sampled_from(["'", '"']))
    entries = {
        "descr": draw(_descrs()),
        "fortran_order": (draw(st.sampled_from(_FORTRANS)) if draw(st.integers(0, 3)) == 0
                          else repr(draw(st.booleans()))),
        "shape": draw(_shapes()),
    }  # fmt: skip
    pairs = [(f"{quote}{k}{quote}", v) for k, v in entries.items()]
    change = draw(st.integers(0, 5))
    if change == 0 and pairs:
        del pairs[draw(st.integers(0, len(pairs) - 1))]
    elif change == 1:
        pairs.append((draw(st.sampled_from(["'extra'", "'descr'", "'Shape'", "1", "'\u00e9'", "None"])), "1"))
    elif change == 2:
        pairs = draw(st.permutations(pairs))
    colon = draw(st.sampled_from([": ", ":", " : ", ":\n"]))
    comma = draw(st.sampled_from([", ", ",", " ,", ",\n "]))
    text = "{" + comma.join(f"{k}{colon}{v}" for k, v in pairs) + draw(st.sampled_from([", ", "", ","])) + "}"
    tail = draw(st.sampled_from(["", "", " " * 5, "\n", "  # c", "\t", "\r", "\x00", "\u00e9", "\u2028", "\n\n"]))
    pad = draw(st.integers(0, 70))
    return text + tail + " " * pad + draw(st.sampled_from(["\n", "\n", "\n", "", " "]))


def _numpy_payload_size(text: str) -> int | None:
    """Bytes of payload numpy would read for this header (``None`` if it would refuse or it is large)."""
    try:
        d = ast.literal_eval(text)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dtype = np.lib.format.descr_to_dtype(d["descr"])
        shape = d["shape"]
        if type(shape) is not tuple or not all(type(x) is int for x in shape):
            return None
        n = math.prod(shape) * dtype.itemsize
    except Exception:  # noqa: BLE001 - any refusal: a random payload then
        return None
    return n if 0 <= n <= 1 << 16 else None


@pytest.mark.timeout(180)
@settings(max_examples=400)
@given(text=header_texts(), version=st.sampled_from(VERSIONS), payload=st.data())
def test_random_header_dicts(tmp_path, text, version, payload):
    encoding = "utf8" if version == (3, 0) else "latin1"
    try:
        raw = text.encode(encoding)
    except UnicodeEncodeError:
        version, raw = (3, 0), text.encode("utf8")
    size = _numpy_payload_size(text)
    if size is None:
        size = payload.draw(st.integers(0, 64), label="random payload size")
    else:
        size += payload.draw(st.sampled_from([0, 0, 0, 1, -1]), label="payload delta")
    body = np.random.default_rng(len(raw) + size).bytes(max(size, 0))
    run(preamble(version, raw) + raw + body, tmp_path, compute=payload.draw(st.integers(0, 3)) == 0)


# --------------------------------------------------------------------------
# The harness itself, and the oracle's own judgement


def test_oracle_flags_violations(tmp_path, monkeypatch):
    """The oracle is not vacuous: a wrong array, a wrong exception type and accepting garbage are caught."""
    good = npy_bytes(np.arange(6, dtype="<i4"), (1, 0))
    real = npydask.read_region
    monkeypatch.setattr(npydask, "read_region", lambda p, *a, **k: real(p, *a, **k)[::-1].copy())
    with pytest.raises(fuzz.Violation, match="values differ"):
        fuzz.check(good, str(tmp_path))

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise IndexError("boom")

    monkeypatch.setattr(npydask, "read_region", boom)
    with pytest.raises(fuzz.Violation, match="IndexError"):
        fuzz.check(good, str(tmp_path))
    monkeypatch.setattr(npydask, "read_region", real)
    monkeypatch.setattr(fuzz, "numpy_verdict", lambda path: ValueError("numpy refuses"))
    with pytest.raises(fuzz.Violation, match="accepts a file numpy refuses"):
        fuzz.check(good, str(tmp_path))


def test_documented_refusals_are_classified(tmp_path):
    def file(descr: str = "'<f4'", shape: str = "(2,)", tail: str = "\n") -> bytes:
        raw = f"{{'descr': {descr}, 'fortran_order': False, 'shape': {shape}, }}{tail}".encode("latin1")
        return preamble((1, 0), raw) + raw + bytes(16)

    cases = {
        "S0/U0 string dtype": file("'U'"),
        "text after the dict other than spaces + one newline": file(tail="  # comment\n"),
        "non-literal syntax (only str/int/bool literals, tuples, lists)": file(shape="(+2,)"),
        "descr part of a wrong arity or type (numpy ignores extra items)": file("[['a', '<f4']]"),
    }
    for label, data in cases.items():
        out = fuzz.check(data, str(tmp_path))
        assert (out.numpy, out.npydask, out.stricter) == ("accept", "NpyFormatError", label), out


@pytest.mark.timeout(120)
def test_atheris_harness_runs(tmp_path):
    """``ci/fuzz_npy.py`` starts, fuzzes a few hundred inputs and exits cleanly."""
    pytest.importorskip("atheris")
    env = {**os.environ, "NPYDASK_FUZZ_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, str(_HARNESS), "-runs=300", "-seed=1"], capture_output=True,
                          text=True, timeout=110, env=env, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Done 300 runs" in done.stderr, done.stderr[-3000:]


# --------------------------------------------------------------------------
# Regression tests for findings


def _v0_file(shape: str, descr: str = "'|V0'") -> bytes:
    raw = f"{{'descr': {descr}, 'fortran_order': False, 'shape': {shape}, }}\n".encode()
    return preamble((1, 0), raw) + raw


@pytest.mark.timeout(60)
@pytest.mark.parametrize("descr", ["'|V0'", "[]"])
@pytest.mark.parametrize("shape", ["(1000000000000000000,)", "(1000000000,)", "(16777217,)"])
def test_zero_itemsize_huge_shape_is_a_documented_refusal(tmp_path, descr, shape):
    """numpy loads a 0-byte array of 10**18 elements, but every copy of it (dask's compute() copies
    its one chunk) loops over each element and never ends: npydask refuses such arrays at open, and the
    oracle files it under its documented refusal (issue 12, item 6)."""
    out = fuzz.check(_v0_file(shape, descr), str(tmp_path))
    assert (out.numpy, out.npydask, out.stricter) == ("accept", "NpyFormatError", "zero-size items, too many elements")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("descr", ["'|V0'", "[]"])
def test_zero_itemsize_shape_at_the_limit_is_one_chunk_read_at_once(tmp_path, descr):
    """A zero-byte array of the most elements accepted is one chunk (it used to be split into
    size/128Mi chunks: MemoryError in normalize_chunks), read and computed at once."""
    path = tmp_path / "v0.npy"
    path.write_bytes(_v0_file(f"({npydask.format.header.MAX_ZERO_ITEMSIZE_ELEMENTS},)", descr))
    out = fuzz.check(path.read_bytes(), str(tmp_path))
    assert (out.numpy, out.npydask) == ("accept", "accept"), out
    x = npydask.from_npy(path)
    assert math.prod(x.numblocks) == 1, x.numblocks
    t0 = time.perf_counter()
    assert x.compute().shape == np.load(path).shape
    assert time.perf_counter() - t0 < 20.0


@pytest.mark.timeout(30)
def test_python2_long_suffix_is_refused_while_numpy_reads_it(tmp_path):
    """A documented stricter case: numpy strips Python 2's ``L`` from 1.0/2.0 headers; npydask refuses.

    Pinned so that a change either way is deliberate (README, Security: the refusal list).
    """
    raw = b"{'descr': '<i4', 'fortran_order': False, 'shape': (2L, 3L), }\n"
    data = preamble((1, 0), raw) + raw + np.arange(6, dtype="<i4").tobytes()
    out = fuzz.check(data, str(tmp_path))
    assert (out.numpy, out.npydask) == ("accept", "NpyFormatError")
    assert out.stricter is not None and out.stricter.startswith("Python 2 long suffix")


def test_deprecated_descr_alias_warns_but_reads(tmp_path):
    """A descr numpy reads with a DeprecationWarning ('a5') reads the same; the warning comes from numpy."""
    raw = b"{'descr': 'a5', 'fortran_order': False, 'shape': (2,), }\n"
    out = fuzz.check(preamble((1, 0), raw) + raw + b"hello world", str(tmp_path), compute=True)
    assert (out.numpy, out.npydask) == ("accept", "accept")
    assert any("DeprecationWarning" in w for w in out.warnings), out.warnings
