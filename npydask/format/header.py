"""The NPY format header: a strict, pure parser.

An ``.npy`` file is (``numpy/lib/_format_impl.py`` is the reference)::

    magic      6 bytes   b"\\x93NUMPY"
    version    2 bytes   major, minor: (1, 0), (2, 0) or (3, 0)
    hlen       2 bytes   little-endian uint16 (version 1.0)
               4 bytes   little-endian uint32 (versions 2.0 and 3.0)
    header     hlen      a Python dict literal, latin-1 (1.0, 2.0) or utf-8 (3.0):
                         {'descr': <dtype descr>, 'fortran_order': <bool>,
                          'shape': <tuple of ints>, }
                         padded with spaces and ended by one newline
    payload    nbytes    the array's bytes, C or Fortran order

This module never touches a file and never evaluates code: the header text is
matched against numpy's canonical spelling first, and anything else goes
through :mod:`npydask.format._literal`, a bounded parser that accepts only string,
integer and boolean literals, tuples, lists and the one dict (``ast.parse``
would spend ~500 bytes of memory per byte of a 1 MiB header). Error messages
quote at most 200 characters of what they found. Validation runs
in a fixed order (magic, version, length, encoding, syntax, keys, values,
dtype, size) and every failure raises :class:`~npydask.errors.NpyFormatError`
naming the source, what was expected and what was found.

npydask is at least as strict as ``numpy.load(path, allow_pickle=False)``;
the one place it is more lenient is the header size, accepted up to
:data:`MAX_HEADER_BYTES` (numpy stops at 10,000 characters). It is stricter
on purpose where numpy is lenient or loads something else than the header
says (fuzzing against numpy found exactly these; see ``tests/test_fuzz.py``
and the table of header spellings in ``tests/format/test_header.py``; the README's
Security section lists the same):

* object dtypes (they need pickle), and ``S0``/``U0`` strings;
* arrays of zero-size items (``|V0``, ``[]``) of more than
  :data:`MAX_ZERO_ITEMSIZE_ELEMENTS` elements (copying them never ends);
* a dtype with a top-level subarray shape (``('<f4', (2,))``: numpy folds
  it into the array's shape, so the header's shape is not the array's);
* text after the dict other than the space padding and one newline, anything
  before it (a space, a comment), duplicate keys, bools in shapes, and Python
  2 long integers (``(2L, 3L)``, which numpy still strips in version 1.0 and
  2.0 headers);
* descr parts of the wrong length or type (lists for tuples), anything but
  literals (``(+3,)``), and invalid escape sequences in strings.
"""

from __future__ import annotations

import functools
import math
import re
import struct
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from npydask.errors import NpyFormatError

__all__ = [
    "MAGIC",
    "HEADER_MEMO",
    "MAX_HEADER_BYTES",
    "MAX_ZERO_ITEMSIZE_ELEMENTS",
    "VERSIONS",
    "NpyHeader",
    "Preamble",
    "format_header",
    "header_end",
    "is_canonical",
    "parse_header",
    "parse_preamble",
]

MAGIC = b"\x93NUMPY"
MAX_HEADER_BYTES = 1 << 20
"""Largest header text accepted (1 MiB); numpy itself stops at 10,000 characters."""
MAX_ZERO_ITEMSIZE_ELEMENTS = 1 << 24
"""Most elements an array of zero-size items (``|V0``, ``[]``) may have.

Such an array holds no bytes, so its shape is bounded by nothing else, yet
numpy (and so dask) loops over its elements in every copy: a 128-byte file
of shape ``(10**18,)`` would keep a compute spinning forever. At this bound
a copy takes a fraction of a second (figures on the performance page).
"""
MAX_NDIM = 64
"""numpy's ``NPY_MAXDIMS`` (64 since numpy 2.0)."""
_MAX_INTP = int(np.iinfo(np.intp).max)
_EXPECTED_KEYS = ("descr", "fortran_order", "shape")


class VersionInfo(NamedTuple):
    """How one NPY version stores its header length and text."""

    length_format: str
    encoding: str

    @property
    def preamble_size(self) -> int:
        """Bytes before the header text: magic, version and length field."""
        return len(MAGIC) + 2 + struct.calcsize(self.length_format)


class Preamble(NamedTuple):
    """What a file's first bytes say: its version and where its header text lies."""

    version: tuple[int, int]
    header_start: int
    header_length: int


VERSIONS: dict[tuple[int, int], VersionInfo] = {
    (1, 0): VersionInfo("<H", "latin1"),
    (2, 0): VersionInfo("<I", "latin1"),
    (3, 0): VersionInfo("<I", "utf8"),
}
"""The version table: (major, minor) -> length field format and text encoding."""

MIN_PREAMBLE = len(MAGIC) + 2 + 2
MAX_PREAMBLE = len(MAGIC) + 2 + 4


@dataclass(frozen=True)
class NpyHeader:
    """Everything needed to find an array's bytes in a file.

    Attributes
    ----------
    version : tuple of int
        NPY format version, ``(1, 0)``, ``(2, 0)`` or ``(3, 0)``.
    shape : tuple of int
        Logical (C-order) shape of the array.
    dtype : numpy.dtype
        Element type exactly as stored, byte order included.
    fortran_order : bool
        Whether the payload is laid out in Fortran (column-major) order.
    data_offset : int
        Absolute byte offset of the payload in the file.
    nbytes : int
        Size of the payload in bytes.

    Examples
    --------
    >>> import io, numpy as np, npydask
    >>> buf = io.BytesIO(); np.save(buf, np.zeros((2, 3), "<f4"))
    >>> h = npydask.parse_header(buf.getvalue())
    >>> h.shape, h.dtype.str, h.data_offset, h.nbytes
    ((2, 3), '<f4', 128, 24)
    """

    version: tuple[int, int]
    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool
    data_offset: int
    nbytes: int

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return self.dtype.itemsize

    def with_offset(self, base: int) -> NpyHeader:
        """The same header with ``data_offset`` moved by ``base`` bytes (an .npz member)."""
        return NpyHeader(self.version, self.shape, self.dtype, self.fortran_order, self.data_offset + base, self.nbytes)


_MAX_QUOTED = 200
"""Characters of a found value an error message quotes (a header may be 1 MiB)."""


def _fail(source: str, expected: str, found: str, hint: str = "") -> NpyFormatError:
    if len(found) > _MAX_QUOTED:
        found = f"{found[:_MAX_QUOTED]}... ({len(found)} characters)"
    msg = f"{source}: not a valid .npy file: expected {expected}, found {found}"
    if hint:
        msg += f"; {hint}"
    return NpyFormatError(msg)


def parse_preamble(buf: bytes, source: str = "<bytes>") -> Preamble:
    """Check the magic, version and header length.

    Parameters
    ----------
    buf : bytes
        At least the first :data:`MAX_PREAMBLE` bytes of the file (fewer if the
        file is shorter).
    source : str
        Name used in error messages (the path).

    Returns
    -------
    Preamble
        The version, the offset of the header text and its length in bytes.
    """
    buf = bytes(buf[:MAX_PREAMBLE])
    if len(buf) < len(MAGIC) or buf[: len(MAGIC)] != MAGIC:
        hint = "it is a zip archive: for an .npz member pass key='name'" if buf.startswith(b"PK\x03\x04") else ""
        raise _fail(source, f"the magic string {MAGIC!r} in the first 6 bytes", repr(buf[: len(MAGIC)]), hint)
    if len(buf) < len(MAGIC) + 2:
        raise _fail(source, "2 version bytes after the magic string", f"only {len(buf)} bytes in all")
    version = (buf[6], buf[7])
    info = VERSIONS.get(version)
    if info is None:
        known = ", ".join(f"{a}.{b}" for a, b in VERSIONS)
        raise _fail(source, f"format version {known}", f"version {version[0]}.{version[1]}")
    end = info.preamble_size
    if len(buf) < end:
        raise _fail(source, f"a {end - 8}-byte header length field", f"a file of {len(buf)} bytes")
    (hlen,) = struct.unpack(info.length_format, buf[8:end])
    if hlen > MAX_HEADER_BYTES:
        raise _fail(
            source,
            f"a header of at most {MAX_HEADER_BYTES} bytes",
            f"a header length of {hlen} bytes",
            "the file is corrupt or not meant for reading without pickle",
        )
    return Preamble(version, end, hlen)


def parse_header(buf: bytes, *, source: str = "<bytes>") -> NpyHeader:
    """Parse the header at the start of an ``.npy`` file.

    Parameters
    ----------
    buf : bytes
        The file's first bytes: the preamble and the whole header text (the
        payload may follow and is ignored).
    source : str, optional
        How to name the data in error messages (npydask passes the path).

    Returns
    -------
    NpyHeader

    Raises
    ------
    NpyFormatError
        If anything about the header is invalid (see the module docstring).

    Examples
    --------
    >>> import io, numpy as np, npydask
    >>> buf = io.BytesIO(); np.save(buf, np.arange(6, dtype=">i2").reshape(3, 2))
    >>> npydask.parse_header(buf.getvalue()).dtype
    dtype('>i2')
    """
    if not isinstance(buf, bytes):
        buf = bytes(memoryview(buf).cast("B")[: MAX_PREAMBLE + MAX_HEADER_BYTES])
    hit = HEADER_MEMO.get(buf[: header_end(buf)])
    if hit is not None:
        return hit
    version, start, hlen = parse_preamble(buf[:MAX_PREAMBLE], source)
    raw = buf[start : start + hlen]
    if len(raw) < hlen:
        raise _fail(
            source, f"a header of {hlen} bytes after the preamble", f"only {len(raw)} bytes", "the file is truncated"
        )
    dtype, fortran, shape = _parse_text(raw, VERSIONS[version].encoding, source)
    header = NpyHeader(
        version=version,
        shape=shape,
        dtype=dtype,
        fortran_order=fortran,
        data_offset=start + hlen,
        nbytes=math.prod(shape) * dtype.itemsize,
    )
    if hlen <= _MEMO_MAX_KEY:
        if len(HEADER_MEMO) >= _MEMO_LIMIT:
            HEADER_MEMO.clear()
        HEADER_MEMO[buf[: start + hlen]] = header
    return header


# --------------------------------------------------------------------------
# Header text -> (dtype, fortran_order, shape), memoised on the raw bytes.

HEADER_MEMO: dict[bytes, NpyHeader] = {}
"""Validated headers keyed on their exact preamble and header bytes (version and length included).

A batch scan looks headers up here directly; only :func:`parse_header` adds to it.
"""
_MEMO_LIMIT = 4096
_MEMO_MAX_KEY = 4096
"""Longer header texts are not memoised: the memo holds at most 16 MiB of keys."""


def header_end(buf: bytes) -> int:
    """Where the header of ``buf`` ends by its length field: 0 if the preamble is short or unknown.

    Unchecked (no limit, no magic): callers use it to size a read, or as a memo key.
    """
    if len(buf) < MAX_PREAMBLE or buf[7] != 0:
        return 0
    if buf[6] == 1:
        return 10 + (buf[8] | buf[9] << 8)
    if buf[6] in (2, 3):
        return 12 + int.from_bytes(buf[8:12], "little")
    return 0


# (A possessive repeat: a backtracking group keeps state per repetition, far more than the text.)
# At most 19 digits: longer numbers (too large for intp anyway, and possibly past
# Python's int-from-string digit limit) take the slow path, which refuses them.
_INT = r"(?:0|[1-9][0-9]{0,18})"
_CANONICAL = re.compile(
    r"\{'descr': '(?P<descr>[^'\\\n]+)', 'fortran_order': (?P<fortran>True|False), "
    rf"'shape': \((?P<shape>|{_INT},|{_INT}(?:, {_INT})++)\), \}} *\n\Z",
    re.ASCII,
)


def is_canonical(text: str) -> bool:
    """Whether a header's dict ``text`` is spelled exactly as numpy writes it (the parser's one-regex fast path).

    Any other spelling (other spacing, key order, quotes) is still read, by
    the strict literal parser, only more slowly.

    Examples
    --------
    >>> is_canonical("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }" + " " * 4 + "\\n")
    True
    >>> is_canonical('{"descr": "<f4", "fortran_order": False, "shape": (3, 4)}\\n')
    False
    """
    return _CANONICAL.match(text) is not None


def _parse_text(raw: bytes, encoding: str, source: str) -> tuple[np.dtype, bool, tuple[int, ...]]:
    try:
        text = raw.decode(encoding)
    except UnicodeDecodeError as e:
        raise _fail(source, f"header text in {encoding}", f"undecodable bytes ({e.reason} at byte {e.start})") from e
    match = _CANONICAL.match(text)
    if match is not None:
        descr: Any = match["descr"]
        fortran: Any = match["fortran"] == "True"
        shape: Any = tuple(int(s) for s in match["shape"].split(",") if s)
    else:
        descr, fortran, shape = _parse_literal(text, source)
    return _validate(descr, fortran, shape, source)


_TAIL = re.compile(" *\n\\Z")


def _parse_literal(text: str, source: str) -> tuple[Any, Any, Any]:
    """The slow path: any literal spelling of the dict, still strictly checked (:mod:`npydask.format._literal`)."""
    if not text.endswith("\n"):
        raise _fail(source, "header text ending in a newline", repr(text[-40:]))
    if not text.startswith("{"):
        raise _fail(source, "header text starting with '{'", repr(text[:40]))
    from npydask.format._literal import LiteralError, parse_dict  # (only here: canonical headers skip its regex)

    try:
        items, end = parse_dict(text)
    except LiteralError as e:
        raise _fail(source, e.expected, e.found) from None
    except RecursionError as e:  # pragma: no cover - MAX_DEPTH stops nesting well before
        raise _fail(source, "a Python dict literal as header", "brackets nested too deep") from e
    # Only spaces may follow the dict, then the one final newline.
    if not _TAIL.match(text, end):
        raise _fail(source, "only spaces and one newline after the header dict", repr(text[end : end + 40]))
    values: dict[str, Any] = {}
    for name, value in items:
        if not isinstance(name, str) or name in values:
            raise _fail(source, f"the keys {list(_EXPECTED_KEYS)} once each", repr(name))
        values[name] = value
    if sorted(values) != list(_EXPECTED_KEYS):
        raise _fail(source, f"exactly the keys {list(_EXPECTED_KEYS)}", f"{sorted(values)}")
    return values["descr"], values["fortran_order"], values["shape"]


def _validate(descr: Any, fortran: Any, shape: Any, source: str) -> tuple[np.dtype, bool, tuple[int, ...]]:
    if type(fortran) is not bool:
        raise _fail(source, "'fortran_order' to be True or False", repr(fortran))
    if type(shape) is not tuple or not all(type(d) is int for d in shape):
        raise _fail(source, "'shape' to be a tuple of ints", repr(shape))
    if any(d < 0 for d in shape):
        raise _fail(source, "'shape' of non-negative ints", repr(shape))
    if len(shape) > MAX_NDIM:
        raise _fail(source, f"at most {MAX_NDIM} dimensions", f"{len(shape)}")
    dtype = _dtype_from_descr(descr, source)
    # numpy's own rule (PyArray_NewFromDescr): the item size times every
    # non-zero dimension must fit in intp, so an empty array cannot hide a
    # dimension that overflows.
    if math.prod(d for d in shape if d) * max(dtype.itemsize, 1) > _MAX_INTP:
        raise _fail(
            source,
            f"an array of at most {_MAX_INTP} bytes",
            f"shape {shape} of {dtype.itemsize}-byte items",
            "the header is corrupt",
        )
    if dtype.itemsize == 0 and math.prod(shape) > MAX_ZERO_ITEMSIZE_ELEMENTS:
        raise _fail(
            source,
            f"at most {MAX_ZERO_ITEMSIZE_ELEMENTS} elements in an array of zero-size items ({dtype.str})",
            f"shape {shape}",
            "numpy loads it, but every copy of it loops over each element (10**18 of them never finish); "
            "npydask refuses it",
        )
    return dtype, fortran, shape


@functools.lru_cache(maxsize=1024)
def _cached_dtype(descr: str) -> np.dtype:
    return np.dtype(descr)


def _dtype_from_str(descr: str) -> np.dtype:
    # Only short strings are cached: a valid comma-separated descr can be ~1 MiB long.
    return _cached_dtype(descr) if len(descr) <= 256 else np.dtype(descr)


def _dtype_from_descr(descr: Any, source: str) -> np.dtype:
    try:
        if isinstance(descr, str):
            dtype = _dtype_from_str(descr)
        else:
            dtype = _descr_to_dtype(descr)
    except NpyFormatError:
        raise
    except Exception as e:  # numpy's dtype constructor over untrusted input
        raise _fail(source, "a dtype description numpy understands", f"{descr!r} ({e})") from e
    if dtype.hasobject:
        raise _fail(
            source,
            "a dtype without Python objects",
            f"{descr!r}",
            "object arrays need pickle, which npydask never uses; "
            "re-save the data with a numeric, string or structured dtype",
        )
    if dtype.shape != ():
        raise _fail(
            source,
            "a dtype without a top-level subarray shape",
            repr(descr),
            "numpy folds such a shape into the array's, so the header's shape is not the array's",
        )
    if dtype.itemsize == 0 and dtype.kind in "SU":
        # numpy writes '|V0' and '[]' (and reads them back) but never 'S0'/'U0',
        # which it would silently widen to one character.
        raise _fail(source, "a string dtype with a non-zero length", repr(descr))
    return dtype


def _descr_to_dtype(descr: Any) -> np.dtype:
    """numpy's ``descr_to_dtype`` with type checks on every part."""
    if isinstance(descr, str):
        return _dtype_from_str(descr)
    if isinstance(descr, tuple):
        if len(descr) != 2 or not _is_shape(descr[1]):
            raise TypeError(f"a subarray descr is (descr, shape), found {descr!r}")
        return np.dtype((_descr_to_dtype(descr[0]), descr[1]))
    if not isinstance(descr, list):
        raise TypeError(f"a descr is a string, a list of fields or a (descr, shape) tuple, found {descr!r}")
    names: list[str] = []
    titles: list[str | None] = []
    formats: list[np.dtype] = []
    offsets: list[int] = []
    offset = 0
    for field in descr:
        if not isinstance(field, tuple) or len(field) not in (2, 3):
            raise TypeError(f"a field is (name, descr) or (name, descr, shape), found {field!r}")
        name = field[0]
        dt = _descr_to_dtype(field[1])
        if len(field) == 3:
            if not _is_shape(field[2]):
                raise TypeError(f"a field shape is an int or a tuple of ints, found {field[2]!r}")
            dt = np.dtype((dt, field[2]))
        title: str | None = None
        if isinstance(name, tuple):
            if len(name) != 2 or not all(isinstance(s, str) for s in name):
                raise TypeError(f"a titled field name is (title, name), found {name!r}")
            title, name = name
        if not isinstance(name, str):
            raise TypeError(f"a field name is a string, found {name!r}")
        is_pad = name == "" and title is None and dt.type is np.void and dt.names is None
        if not is_pad:
            names.append(name)
            titles.append(title)
            formats.append(dt)
            offsets.append(offset)
        offset += dt.itemsize
    return np.dtype({"names": names, "formats": formats, "titles": titles, "offsets": offsets, "itemsize": offset})


def _is_shape(value: Any) -> bool:
    if type(value) is int:
        return value >= 0
    return type(value) is tuple and all(type(d) is int and d >= 0 for d in value)


def format_header(dtype: np.dtype, shape: tuple[int, ...], fortran_order: bool, *, align: int = 64) -> bytes:
    """The preamble and header text ``numpy.save`` writes for an array, as bytes.

    The header dict is spelled as numpy spells it (sorted keys, ``repr`` of
    the values, spare spaces for the growth axis), and the version is the
    oldest that holds it, as numpy's ``_wrap_header_guess_version`` picks it:
    1.0, then 2.0 when the header is over 65535 bytes, then 3.0 when the dtype
    description needs utf-8. Spaces then pad it so that the payload starts at
    a multiple of ``align``, and a newline ends it. With ``align=64`` the
    bytes equal numpy's; numpy does not warn here about versions 2.0 and 3.0.

    Parameters
    ----------
    dtype : numpy.dtype
        The element type, byte order included; its description comes from
        ``numpy.lib.format.dtype_to_descr`` (which warns about dropped metadata).
    shape : tuple of int
        The array's logical shape.
    fortran_order : bool
        Whether the payload that follows is in Fortran order.
    align : int, optional
        The payload offset is a multiple of this; a positive multiple of 64
        (the NPY format requires 64-byte alignment).

    Returns
    -------
    bytes
        ``len(result)`` is the payload's offset in the file.

    Examples
    --------
    >>> import io, numpy as np
    >>> buf = io.BytesIO(); np.save(buf, np.zeros((2, 3), "<f4"))
    >>> format_header(np.dtype("<f4"), (2, 3), False) == buf.getvalue()[:128]
    True
    >>> len(format_header(np.dtype("<f4"), (2, 3), False, align=4096))
    4096
    """
    if isinstance(align, bool) or not isinstance(align, int) or align <= 0 or align % 64:
        raise ValueError(
            f"align must be a positive multiple of 64 (the NPY format puts the payload at a multiple "
            f"of 64 bytes), found {align!r}"
        )
    import operator

    from numpy.lib.format import dtype_to_descr

    shape = tuple(operator.index(d) for d in shape)  # numpy ints too; repr must print plain ints
    fortran_order = bool(fortran_order)
    fields = {"descr": dtype_to_descr(np.dtype(dtype)), "fortran_order": fortran_order, "shape": shape}
    text = "{" + "".join(f"{key!r}: {value!r}, " for key, value in sorted(fields.items())) + "}"
    if shape:  # numpy's spare room to grow the growth axis in place (GROWTH_AXIS_MAX_DIGITS = 21)
        text += " " * (21 - len(repr(shape[-1 if fortran_order else 0])))
    for version, info in VERSIONS.items():
        try:
            body = text.encode(info.encoding)
        except UnicodeEncodeError:
            continue
        hlen = len(body) + 1
        pad = align - (info.preamble_size + hlen) % align
        if hlen + pad < 1 << (8 * struct.calcsize(info.length_format)):
            length = struct.pack(info.length_format, hlen + pad)
            return MAGIC + bytes(version) + length + body + b" " * pad + b"\n"
    raise ValueError(f"a header of {len(text)} characters does not fit any NPY format version")  # pragma: no cover
