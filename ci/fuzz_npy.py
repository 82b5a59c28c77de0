"""Coverage-guided fuzzing of npydask's NPY reader with atheris, numpy as the oracle.

Every input is the whole content of a file. It goes through
``npydask.parse_header(bytes)``, is written to a fresh file in a temporary
folder, and goes through ``read_header``, ``read_region`` (backends pread,
mmap and auto) and, for every 8th input that npydask accepts,
``from_npy(...).compute()``; the verdicts are compared with
``numpy.load(path, allow_pickle=False)``.

The oracle (:func:`check`, also imported by ``tests/test_fuzz.py``) raises
:class:`Violation` when:

- npydask raises anything but ``NpyFormatError``, ``RoiError`` or an
  ``OSError`` subclass (or ``parse_header`` anything but ``NpyFormatError``);
- npydask accepts a file numpy refuses (except headers of 10,000 characters up
  to 1 MiB, which npydask reads on purpose: numpy is then asked again with a
  larger ``max_header_size``);
- npydask returns an array that differs from numpy's in dtype (byte order,
  fields, offsets, titles), shape or values (bit for bit, field by field);
- the entry points disagree (``parse_header`` and ``read_header``, one backend
  and another, ``read_region`` and ``from_npy``).

A file numpy accepts and npydask refuses is not a violation: it is counted as
*stricter* with npydask's reason; the counts, by reason, are rewritten to
``<workdir>/stricter.txt`` every 2,000 inputs (and printed every 100,000),
with an example of each reason that is not among the documented refusals
(:data:`DOCUMENTED_STRICTER`). Library bugs found and not fixed yet are in
:data:`KNOWN_BUGS`: the oracle skips the step that triggers them.

At start the harness writes a seed corpus of valid files (many dtypes, C and
Fortran order, format versions 1.0, 2.0 and 3.0, empty and 0-d arrays) and a
libFuzzer dictionary of header tokens; libFuzzer mutates those. Usage::

    nice -n 10 python ci/fuzz_npy.py -max_total_time=600 [libFuzzer options] [CORPUS_DIR ...]

Options are libFuzzer's (``-max_total_time``, ``-runs``, ``-max_len``,
``-timeout``, ``-jobs``, ...). Defaults added unless given: ``-max_len=4096``,
``-timeout=20``, ``-rss_limit_mb=4096``, ``-dict=<generated>``,
``-artifact_prefix=<workdir>/`` and the generated seed corpus as the last
corpus folder. ``NPYDASK_FUZZ_DIR`` sets the work folder (default: a new
folder under ``/dev/shm`` when writable, else the system temp folder). A
crashing input is saved as ``crash-<sha1>`` there; replay it with
``python ci/fuzz_npy.py crash-<sha1>``.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import os
import re
import sys
import tempfile
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

try:  # numpy >= 2
    from numpy.lib._format_impl import _read_array_header
except ImportError:  # pragma: no cover - numpy 1.26
    from numpy.lib.format import _read_array_header

__all__ = [
    "DOCUMENTED_STRICTER",
    "Outcome",
    "Violation",
    "check",
    "seed_files",
    "stricter_reason",
]

# npydask is imported lazily (instrumented under atheris, plain under pytest).
npydask: Any = None
_NAMES = itertools.count()


class Violation(AssertionError):
    """npydask broke the oracle: a wrong exception type, a wrong array, or accepting what numpy refuses."""


DOCUMENTED_STRICTER: dict[str, str] = {
    "object dtype (never unpickled)": r"a dtype without Python objects",
    "S0/U0 string dtype": r"a string dtype with a non-zero length",
    "top-level subarray dtype": r"a dtype without a top-level subarray shape",
    "shape not a tuple of ints (bools)": r"'shape' to be a tuple of ints",
    "dict keys not exactly once each": r"the keys \['descr', 'fortran_order', 'shape'\] once each",
    "text after the dict other than spaces + one newline": r"only spaces and one newline after the header dict"
    r"|header text ending in a newline",
    "header text not starting with '{'": r"header text starting with '\{'",
    "non-literal syntax (only str/int/bool literals, tuples, lists)": r"only string, integer and boolean literals",
    "descr part of a wrong arity or type (numpy ignores extra items)": r"a subarray descr is \(descr, shape\)"
    r"|a field is \(name, descr\)|a titled field name is|a field shape is",
    "header over 1 MiB": r"a header of at most 1048576 bytes",
    "zero-size items, too many elements": r"elements in an array of zero-size items",
    "invalid escape sequence in a string (Python only warns)": r"strings without invalid escape sequences",
    # numpy retries a 1.0/2.0 header that fails to parse after dropping an ``L`` that follows a number
    # (headers written by Python 2); npydask does not. As numpy then accepts, a syntax refusal by
    # npydask can only be this.
    "Python 2 long suffix, e.g. (3L,) (numpy strips it in 1.0/2.0 headers)": r"a Python dict literal as header",
}
"""npydask's deliberate refusals of files numpy loads: label -> regex on the error message.

They follow ``npydask.format.header``'s module docstring and SPEC section 1 (exact
keys, only spaces and one newline after the dict, a shape of ints that are
not bools, literal-only parsing, no object dtypes, no S0/U0, no top-level
subarray, headers up to 1 MiB, at most ``MAX_ZERO_ITEMSIZE_ELEMENTS`` items of
zero size).
"""

KNOWN_STRICTER: dict[str, str] = {}
"""Refusals of files numpy loads that are known but not (yet) documented by npydask (label ``KNOWN: ...``)."""

_DOCUMENTED = [(label, re.compile(rx)) for label, rx in {**DOCUMENTED_STRICTER, **KNOWN_STRICTER}.items()]


def stricter_reason(error: BaseException) -> str:
    """The label for npydask refusing a file numpy loads, or ``'UNDOCUMENTED: <message>'``."""
    text = str(error)
    for label, rx in _DOCUMENTED:
        if rx.search(text):
            return label
    return "UNDOCUMENTED: " + text[:300]


@dataclass(frozen=True)
class Outcome:
    """What happened to one input."""

    numpy: str
    """``"accept"`` or numpy's exception type name."""
    npydask: str
    """``"accept"`` or npydask's exception type name."""
    stricter: str | None = None
    """When numpy accepts and npydask refuses: the reason (see :func:`stricter_reason`)."""
    warnings: tuple[str, ...] = ()
    """Warnings npydask emitted (category: message), recorded rather than raised."""
    known_bug: str | None = None
    """A :data:`KNOWN_BUGS` entry whose trigger was skipped for this input."""


def _import() -> Any:
    global npydask
    if npydask is None:
        import npydask as module

        npydask = module
    return npydask


def _numpy_load(path: str, max_header_size: int | None = None) -> Any:
    """``numpy.load(path, allow_pickle=False)`` or the exception it raised; an ``NpzFile`` counts as a refusal."""
    kwargs = {} if max_header_size is None else {"max_header_size": max_header_size}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            result = np.load(path, allow_pickle=False, **kwargs)
        except Exception as e:  # noqa: BLE001 - any refusal counts
            return e
    if not isinstance(result, np.ndarray):
        close = getattr(result, "close", None)
        if close is not None:
            close()
        return TypeError(f"numpy.load returned {type(result).__name__}, not an array")
    return result


def numpy_verdict(path: str) -> Any:
    """numpy's array or exception; headers numpy refuses only for their size are retried up to 1 MiB."""
    result = _numpy_load(path)
    if isinstance(result, ValueError) and "max_header_size" in str(result):
        retry = _numpy_load(path, max_header_size=1 << 20)
        if isinstance(retry, np.ndarray):
            return retry
    return result


def numpy_header_facts(path: str) -> tuple[bool, int]:
    """numpy's ``fortran_order`` and payload offset for a file numpy loads."""
    with open(path, "rb") as f, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        version = np.lib.format.read_magic(f)
        _, fortran, _ = _read_array_header(f, version, max_header_size=1 << 21)
        return bool(fortran), f.tell()


def _leaves(a: np.ndarray) -> Any:
    if a.dtype.names is None:
        yield a
        return
    for name in a.dtype.names:
        yield from _leaves(a[name])


def assert_same(got: Any, want: np.ndarray, where: str) -> None:
    """Same dtype (byte order, fields, offsets, titles), shape and values bit for bit, padding ignored."""
    if not isinstance(got, np.ndarray):
        raise Violation(f"{where}: expected a numpy.ndarray, found {type(got).__name__}")
    facts = [
        ("dtype", got.dtype, want.dtype),
        ("dtype.str", got.dtype.str, want.dtype.str),
        ("dtype.descr", got.dtype.descr, want.dtype.descr),
        ("dtype.fields", got.dtype.fields, want.dtype.fields),
        ("shape", got.shape, want.shape),
    ]
    for name, a, b in facts:
        if a != b:
            raise Violation(f"{where}: {name} differs from numpy's: {a!r} != {b!r}")
    for g, w in zip(_leaves(got), _leaves(want), strict=True):
        if g.shape != w.shape or np.ascontiguousarray(g).tobytes() != np.ascontiguousarray(w).tobytes():
            raise Violation(f"{where}: values differ from numpy's (leaf dtype {g.dtype})")


def _allowed() -> tuple[type[BaseException], ...]:
    return (npydask.NpyFormatError, npydask.RoiError, OSError)


def _call(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run an npydask call: its result, or an allowed exception returned; anything else is a Violation."""
    try:
        return fn(*args, **kwargs)
    except _allowed() as e:
        return e
    except Exception as e:
        raise Violation(f"{what} raised {type(e).__name__}: {e}") from e


def check(data: bytes, folder: str, *, compute: bool = True, chunks: Any = "auto") -> Outcome:
    """Run one input through npydask and numpy and compare; raises :class:`Violation` on a mismatch.

    Parameters
    ----------
    data : bytes
        The whole file.
    folder : str
        Where to write it (a fresh name each call; the file is removed after).
    compute : bool
        Also compare ``from_npy(path, chunks).compute(scheduler="sync")`` when npydask accepts.
    chunks : optional
        Chunks for ``from_npy``.
    """
    nd = _import()
    with warnings.catch_warnings(record=True) as caught:
        # Recorded, not raised: under ``-W error`` numpy's own DeprecationWarnings (a
        # descr like 'a5') would otherwise turn into refusals the user never sees.
        warnings.simplefilter("always")
        out = _check(nd, data, folder, compute, chunks)
    if caught:
        seen = tuple(dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught))
        out = dataclasses.replace(out, warnings=seen)
    return out


def _check(nd: Any, data: bytes, folder: str, compute: bool, chunks: Any) -> Outcome:
    parsed = _call("parse_header", nd.parse_header, data)
    if isinstance(parsed, BaseException) and not isinstance(parsed, nd.NpyFormatError):
        raise Violation(f"parse_header raised {type(parsed).__name__} (only NpyFormatError allowed): {parsed}")
    path = os.path.join(folder, f"f{os.getpid()}_{next(_NAMES)}.npy")
    with open(path, "wb") as f:
        f.write(data)
    try:
        return _check_file(data, path, parsed, compute, chunks)
    finally:
        os.unlink(path)


KNOWN_BUGS: dict[str, str] = {}
"""Library bugs found by fuzzing and not fixed yet: the oracle skips the step that triggers them.

Add an entry with an xfail regression test in ``tests/test_fuzz.py``; remove it once that test passes.
(Fixed: zero-itemsize dtypes with huge shapes are one chunk, ``test_zero_itemsize_huge_shape_from_npy``.)
"""


def known_bug(header: Any) -> str | None:
    """The :data:`KNOWN_BUGS` entry ``from_npy(...).compute()`` would hit for this header, if any."""
    if "zero-itemsize" in KNOWN_BUGS and header.dtype.itemsize == 0 and header.size > 10**6:
        return KNOWN_BUGS["zero-itemsize"]
    return None


def _check_file(data: bytes, path: str, parsed: Any, compute: bool, chunks: Any) -> Outcome:
    nd = npydask
    expected = numpy_verdict(path)
    numpy_word = "accept" if isinstance(expected, np.ndarray) else type(expected).__name__
    header = _call("read_header", nd.read_header, path)
    if isinstance(header, BaseException):
        if not isinstance(parsed, BaseException) and not (
            isinstance(header, nd.NpyFormatError) and "truncated" in str(header)
        ):
            raise Violation(f"parse_header accepts the bytes but read_header refuses the file: {header}")
        if isinstance(parsed, BaseException) and not isinstance(header, nd.NpyFormatError):
            raise Violation(f"the header is invalid but read_header raised {type(header).__name__}: {header}")
        if path not in str(header):
            raise Violation(f"read_header's error does not name the file: {header}")
        region = _call("read_region", nd.read_region, path)
        if not isinstance(region, BaseException):
            raise Violation(f"read_header refuses ({header}) but read_region accepts")
        stricter = stricter_reason(header) if numpy_word == "accept" else None
        return Outcome(numpy_word, type(header).__name__, stricter)

    # npydask accepts the header: numpy must load the same array.
    if not isinstance(expected, np.ndarray):
        raise Violation(f"npydask accepts a file numpy refuses ({type(expected).__name__}: {expected}): {header}")
    if isinstance(parsed, BaseException) or parsed != header:
        raise Violation(f"parse_header ({parsed!r}) and read_header ({header!r}) disagree")
    fortran, offset = numpy_header_facts(path)
    if (header.shape, header.dtype, header.fortran_order, header.data_offset) != (
        expected.shape,
        expected.dtype,
        fortran,
        offset,
    ):
        raise Violation(f"header {header!r} differs from numpy's: shape {expected.shape}, dtype "
                        f"{expected.dtype.str}, fortran_order {fortran}, data offset {offset}")  # fmt: skip
    if header.nbytes != expected.nbytes:
        raise Violation(f"header nbytes {header.nbytes} != numpy's {expected.nbytes}")
    for backend in ("pread", "mmap", "auto"):
        got = _call(f"read_region(backend={backend!r})", nd.read_region, path, backend=backend)
        if isinstance(got, BaseException):
            raise Violation(f"read_header accepts but read_region(backend={backend!r}) refuses: {got!r}")
        assert_same(got, expected, f"read_region(backend={backend!r})")
    if compute and known_bug(header) is not None:
        return Outcome("accept", "accept", known_bug=known_bug(header))
    if compute:
        x = _call("from_npy", nd.from_npy, path, chunks=chunks)
        if isinstance(x, BaseException):
            raise Violation(f"read_header accepts but from_npy refuses: {x!r}")
        if x.shape != expected.shape or x.dtype != expected.dtype:
            raise Violation(f"from_npy gives shape {x.shape} dtype {x.dtype}, numpy {expected.shape} {expected.dtype}")
        got = _call("from_npy(...).compute()", x.compute, scheduler="sync")
        if isinstance(got, BaseException):
            raise Violation(f"from_npy(...).compute() raised {got!r}")
        assert_same(np.asarray(got), expected, "from_npy(...).compute()")
    return Outcome("accept", "accept")


# --------------------------------------------------------------------------
# Seed corpus and dictionary


def seed_files() -> dict[str, bytes]:
    """Valid ``.npy`` files: many dtypes and shapes, C and Fortran order, versions 1.0, 2.0 and 3.0."""
    rng = np.random.default_rng(0)
    specs: list[tuple[str, Any, tuple[int, ...]]] = [
        ("f4", "<f4", (3, 4)),
        ("f8be", ">f8", (2, 3)),
        ("i1", "|i1", (5,)),
        ("u2be", ">u2", (2, 2, 2)),
        ("bool", "|b1", (7,)),
        ("c8", "<c8", (2, 2)),
        ("f2", "<f2", (4,)),
        ("g", "<g", (2,)),
        ("M8", "<M8[ms]", (3,)),
        ("m8", ">m8[25s]", (2,)),
        ("S3", "|S3", (2, 2)),
        ("U2", ">U2", (3,)),
        ("V3", "|V3", (2,)),
        ("0d", "<i4", ()),
        ("empty", "<f4", (0, 3)),
        ("struct", [("a", "<i2"), ("b", [("c", "S3"), ("d", ">f8", (2,))])], (3,)),
        ("titled", [(("title", "x"), "<u4"), ("y", "|u1")], (2,)),
        ("latin1", [("\u00e9", "<i2")], (2,)),
        ("utf8", [("\u540d", "<i2")], (2,)),
        ("v0", "|V0", (3,)),
    ]
    out: dict[str, bytes] = {}
    for name, descr, shape in specs:
        dtype = np.dtype(descr)
        raw = rng.bytes(int(np.prod(shape)) * dtype.itemsize)
        a = np.frombuffer(raw, dtype).reshape(shape) if dtype.itemsize else np.zeros(shape, dtype)
        for order in ("C", "F"):
            if order == "F" and a.ndim < 2:
                continue
            arr = np.asfortranarray(a) if order == "F" else np.ascontiguousarray(a)
            for version in ((1, 0), (2, 0), (3, 0)):
                buf = io.BytesIO()
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        np.lib.format.write_array(buf, arr, version=version, allow_pickle=False)
                except ValueError:  # a utf-8 field name in 1.0/2.0
                    continue
                out[f"{name}-{order}-v{version[0]}"] = buf.getvalue()
    return out


DICTIONARY = [
    b"\x93NUMPY", b"\x01\x00", b"\x02\x00", b"\x03\x00", b"{", b"}", b"(", b")", b"[", b"]", b", ", b": ",
    b"'descr'", b"'fortran_order'", b"'shape'", b"True", b"False", b"'<f4'", b"'>f8'", b"'|O'", b"'|S0'",
    b"'<U0'", b"'|V0'", b"'<M8[D]'", b"'i4,i4'", b"('<f4', (2,))", b"[('a', '<i4')]", b"-1",
    b"9223372036854775807", b"18446744073709551616", b"1000000000000000000", b"\n", b"    ", b"\\x00",
    b"\xc3\xa9", b"\xe5\x90\x8d", b"L", b"0x10", b"+", b"1.0", b"None", b"b'", b"u'", b"#",
]  # fmt: skip


def write_dictionary(path: str) -> None:
    """A libFuzzer ``-dict`` file of header tokens."""
    with open(path, "w", encoding="ascii") as f:
        for i, token in enumerate(DICTIONARY):
            escaped = "".join(chr(b) if 32 <= b < 127 and chr(b) not in '"\\' else f"\\x{b:02x}" for b in token)
            f.write(f'kw{i}="{escaped}"\n')


# --------------------------------------------------------------------------
# The atheris entry point


def _workdir() -> str:
    given = os.environ.get("NPYDASK_FUZZ_DIR")
    if given:
        os.makedirs(given, exist_ok=True)
        return given
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return tempfile.mkdtemp(prefix="npydask-fuzz-", dir=base)


def main(argv: list[str]) -> None:
    try:
        import atheris
    except ImportError:
        sys.exit("atheris is not installed: pip install atheris (or run tests/test_fuzz.py with more examples)")
    import dask.array  # noqa: F401 - imported uninstrumented: only npydask is instrumented

    with atheris.instrument_imports(include=["npydask"]):
        _import()

    work = _workdir()
    files = os.path.join(work, "files")
    corpus = os.path.join(work, "seeds")
    os.makedirs(files, exist_ok=True)
    os.makedirs(corpus, exist_ok=True)
    for name, data in seed_files().items():
        with open(os.path.join(corpus, name), "wb") as f:
            f.write(data)
    dict_path = os.path.join(work, "npy.dict")
    write_dictionary(dict_path)

    args = list(argv)
    options = {a.split("=", 1)[0] for a in args[1:] if a.startswith("-")}
    replay = [a for a in args[1:] if not a.startswith("-") and os.path.isfile(a)]
    defaults = {
        "-max_len": "4096",
        "-timeout": "20",
        "-rss_limit_mb": "4096",
        "-dict": dict_path,
        "-artifact_prefix": work + os.sep,
        "-print_final_stats": "1",
    }
    args[1:1] = [f"{k}={v}" for k, v in defaults.items() if k not in options]
    if not replay:
        args.append(corpus)

    stats: Counter[str] = Counter()
    stricter: Counter[str] = Counter()
    undocumented: dict[str, bytes] = {}

    inputs = itertools.count()

    def one_input(data: bytes) -> None:
        # from_npy(...).compute() costs ~4 ms of dask overhead: compare it on every 8th input.
        out = check(data, files, compute=next(inputs) % 8 == 0)
        stats[f"numpy {out.numpy} / npydask {out.npydask}"] += 1
        if out.known_bug is not None:
            stats[out.known_bug[:60] + "... (skipped)"] += 1
        if out.stricter is not None:
            stricter[out.stricter] += 1
            if out.stricter.startswith("UNDOCUMENTED") and len(undocumented) < 50:
                undocumented.setdefault(out.stricter, data)

    def report(final: bool = False) -> None:
        lines = [f"# {sum(stats.values())} inputs; outcomes (numpy verdict / npydask verdict):"]
        lines += [f"#   {n:9d}  {k}" for k, n in stats.most_common()]
        lines.append("# numpy accepts, npydask refuses (stricter), by reason:")
        lines += [f"#   {n:9d}  {k}" for k, n in stricter.most_common()]
        for reason, data in undocumented.items():
            lines.append(f"# example for {reason[:120]!r}: {data[:300]!r}")
        text = "\n".join(lines)
        with open(os.path.join(work, "stricter.txt"), "w", encoding="utf8") as f:
            f.write(text + "\n")
        if final:
            print(text, file=sys.stderr, flush=True)

    # libFuzzer ends the process with C exit(): Python's atexit never runs, so the
    # summary is rewritten every 2,000 inputs and printed every 100,000.
    def one_input_reporting(data: bytes) -> None:
        one_input(data)
        n = sum(stats.values())
        if n % 2000 == 0:
            report(final=n % 100_000 == 0)

    print(f"# npydask fuzz: work folder {work} (summary in stricter.txt there)", file=sys.stderr, flush=True)
    atheris.Setup(args, one_input_reporting)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
