"""npydask.format._pickle_values: a pickle's plain values, replayed without importing, calling or building anything.

``pickle.loads`` is the oracle for pickles of plain values (every protocol);
pickles that name other globals or use other opcodes are refused, and the
payloads here are live: ``pickle.loads`` of them writes a marker file.
"""

from __future__ import annotations

import os
import pickle
import pickletools
import shlex
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npydask.format._pickle_values import Global, Limits, Opaque, UnexpectedPickle, plain_values

PROTOCOLS = range(pickle.HIGHEST_PROTOCOL + 1)
DTYPE = {("numpy", "dtype"), ("_codecs", "encode")}


class _Reduce:
    def __init__(self, func: Any, *args: Any) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.func, self.args)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(
    "value",
    [
        None, True, False, 0, -1, 255, 65_536, -(2**31), 2**31, 2**70, -(2**200), 1.5, float("-inf"),
        "", "axis", "é\u20ac\U0001f600", "x" * 300, b"", b"\x00\xff" * 200, bytearray(b"ab"),
        (), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), [], [1, [2, [3]]], {}, {"a": 1, 2: "b", None: (), b"k": [1]},
        {"chunks": ((2, 2, 1), (10,), (10,)), "axis": 0},
        tuple(range(2000)), list(range(2000)), {str(i): i for i in range(1500)},
    ],
)  # fmt: skip
def test_plain_values_equal_pickle_loads(value, protocol):
    data = pickle.dumps(value, protocol=protocol)
    if (_holds(value, bytes) and protocol < 3) or (_holds(value, bytearray) and protocol < 5):
        # (older protocols spell bytes as a call of _codecs.encode or bytes: a global, refused unless allowed)
        with pytest.raises(UnexpectedPickle, match=r"names (_codecs\.encode|__builtin__\.bytes|\w+\.bytearray)"):
            plain_values(data)
        return
    got = plain_values(data)
    want = pickle.loads(data)
    assert got == want and type(got) is type(want) or (isinstance(want, bytearray) and got == bytes(want))


def _holds(value: Any, kind: type) -> bool:
    if isinstance(value, kind):
        return True
    if isinstance(value, dict):
        return any(_holds(k, kind) or _holds(v, kind) for k, v in value.items())
    return isinstance(value, list | tuple) and any(_holds(v, kind) for v in value)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_shared_and_self_referencing_values_keep_their_identity(protocol):
    inner = [1, 2]
    loop: list[Any] = [0]
    loop.append(loop)
    got = plain_values(pickle.dumps({"a": inner, "b": inner, "loop": loop}, protocol=protocol))
    assert got["a"] is got["b"] and got["a"] == [1, 2]
    assert got["loop"][1] is got["loop"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_allowed_globals_stay_names(protocol):
    got = plain_values(pickle.dumps({"dtype": np.dtype(">M8[ns]"), "axis": 2}, protocol=protocol), DTYPE)
    assert got["axis"] == 2
    assert isinstance(got["dtype"], Opaque) and got["dtype"].made_by == Global("numpy", "dtype")


def _payloads(marker: Path) -> list[Any]:
    cmd = f"touch {shlex.quote(str(marker))}"
    return [
        _Reduce(os.system, cmd),
        {"axis": _Reduce(os.system, cmd)},
        {"dtype": np.dtype("f8"), "axis": 0, "then": _Reduce(eval, f"__import__('os').system({cmd!r})")},
        [_Reduce(exec, f"import os; os.system({cmd!r})")],
        {"k": _Reduce(getattr, _Reduce(__import__, "os"), "system")},
    ]


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("which", range(5))
def test_other_globals_are_refused_and_never_run(tmp_path, protocol, which):
    marker = tmp_path / "ran"
    data = pickle.dumps(_payloads(marker)[which], protocol=protocol)
    with pytest.raises(UnexpectedPickle, match="it was neither imported nor called"):
        plain_values(data, DTYPE)
    assert not marker.exists()
    if which in (0, 1):  # the payload is live: unpickling runs it
        pickle.loads(data)
        assert marker.exists()


def _ops(*parts: bytes) -> bytes:
    return b"\x80\x04" + b"".join(parts) + b"."


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "not a readable pickle"),
        (b"\x80\x04", "not a readable pickle"),
        (b"garbage", "not a readable pickle"),
        (b"\xff.", "not a readable pickle"),
        (_ops(b"K\x01K\x02"), "ends with 2 values"),
        (_ops(), "ends with 0 values"),
        (_ops(b"("), "ends with 1 values"),
        (pickle.dumps(1) + b"trailing", "8 bytes follow the pickle's STOP"),
        (_ops(b"t"), "needs a MARK"),
        (_ops(b"\x85"), "takes more values"),
        (_ops(b"(\x85"), "takes more values"),
        (_ops(b"0"), "takes more values"),
        (_ops(b"h\x07"), "memo entry 7, which was never stored"),
        (_ops(b"\x94"), "memoizes a value from an empty stack"),
        (_ops(b"}K\x01a"), "expects a list"),
        (_ops(b"]K\x01K\x02s"), "expects a dict"),
        (_ops(b"}(K\x01u"), "key without a value"),
        (_ops(b"}]K\x01s"), "key of type list"),
        (_ops(b"K\x01K\x02R"), "applies something that is not a global"),
        (_ops(b"}K\x01b"), "expects a Opaque"),
        (_ops(b"K\x01K\x02\x93"), "module and name are not strings"),
        (_ops(b"\x8f"), "opcode EMPTY_SET"),
        (_ops(b"P1\n"), "opcode PERSID"),
        (_ops(b"\x82\x01"), "opcode EXT1"),
        (b"\x80\x02(cos\nsystem\nS'true'\no.", "names os.system"),  # OBJ: refused at the global already
        (b"(S'true'\nios\nsystem\n.", "opcode INST"),
    ],
)
def test_malformed_or_unsupported_pickles_are_refused(data, match):
    with pytest.raises(UnexpectedPickle, match=match):
        plain_values(data, DTYPE)


def test_every_opcode_is_either_replayed_or_refused():
    """No opcode falls through silently: each one is named by the reader's tables or refused by name."""
    import npydask.format._pickle_values as module

    source = Path(module.__file__).read_text()
    for opcode in pickletools.opcodes:
        if f'"{opcode.name}"' in source:
            continue
        with pytest.raises(UnexpectedPickle, match=f"opcode {opcode.name}|not a readable pickle"):
            plain_values(_ops(opcode.code.encode("latin-1") + b"\x00" * 8), DTYPE)


# -- bounded work: a few kilobytes of memo references must not describe days of work ------------


def _shared(n: int, axis: bytes = b"K\x00") -> bytes:
    """``{"axis": 0, "chunks": (T,) * n}`` with ``T = (5,) * n``, written with memo references only.

    About 4 bytes per ``n``, and ``n * n + n + 5`` values to whoever walks it.
    """
    return (
        b"\x80\x04K\x05q\x000"  # 5, memo 0, popped
        + b"(" + b"h\x00" * n + b"tq\x010"  # T: n references to memo 0, memo 1, popped
        + b"}(\x8c\x04axis" + axis + b"\x8c\x06chunks(" + b"h\x01" * n + b"tu."  # n references to T
    )  # fmt: skip


def test_a_pickle_of_shared_references_is_refused_by_the_size_bound():
    data = _shared(12_000)  # 48 KB: 144 million ints when walked (10 s in parse_info before the bound)
    assert len(data) < 50_000
    with pytest.raises(UnexpectedPickle, match=r"more than 131,072 values counted as a tree"):
        plain_values(data)


def test_the_size_bound_counts_every_reference_exactly():
    n = 50
    data = _shared(n)
    size = n * n + n + 5  # the dict, its 2 keys and 2 values, n tuples, n * n ints
    got = plain_values(data, limits=Limits(size=size))
    assert got == pickle.loads(data) == {"axis": 0, "chunks": ((5,) * n,) * n}
    with pytest.raises(UnexpectedPickle, match=rf"more than {size - 1:,} values counted as a tree"):
        plain_values(data, limits=Limits(size=size - 1))


def test_a_self_containing_value_counts_once_per_turn():
    data = _ops(b"]q\x00h\x00a" + b"h\x00a" * 3)  # L = [L, L, L, L]
    got = plain_values(data, limits=Limits(size=5))
    assert len(got) == 4 and all(v is got for v in got)
    with pytest.raises(UnexpectedPickle, match="more than 4 values"):
        plain_values(data, limits=Limits(size=4))


def test_memo_references_are_bounded():
    n = 70_000  # each reference is one small tuple: few values, many references
    data = _ops(b"K\x05q\x000(" + b"h\x00" * n + b"t")
    with pytest.raises(UnexpectedPickle, match=r"more than 65,536 memo references"):
        plain_values(data, limits=Limits(opcodes=10**6, size=10**6))
    assert plain_values(data, limits=Limits(opcodes=10**6, size=10**6, memo_gets=n)) == (5,) * n


def test_opcodes_are_bounded():
    data = _ops(b"N0" * 70_000 + b"N")  # 140,003 opcodes building nothing that stays
    with pytest.raises(UnexpectedPickle, match=r"more than 131,072 opcodes"):
        plain_values(data)
    assert plain_values(data, limits=Limits(opcodes=140_003)) is None


def test_long_dict_keys_are_refused():
    key = "k" * 1025
    with pytest.raises(UnexpectedPickle, match="a key of 1,025 characters, more than 1,024"):
        plain_values(pickle.dumps({key: 1}))
    with pytest.raises(UnexpectedPickle, match="a key of 17 64-bit words, more than 16"):
        plain_values(pickle.dumps({2**1025: 1}), limits=Limits(key_length=16))
    longest = {key[1:]: 1, 2**1025: 2, b"b" * 1024: 3}
    assert plain_values(pickle.dumps(longest)) == longest


def test_deep_nesting_is_walked_without_recursion():
    depth = 50_000
    got = plain_values(_ops(b"]" * depth + b"a" * (depth - 1)))
    for _ in range(depth - 1):
        (got,) = got
    assert got == []


@pytest.mark.parametrize("opcode", [b"I", b"L"])
def test_a_decimal_integer_beyond_pythons_digit_limit_is_named(opcode):
    data = opcode + b"9" * 5000 + (b"L" if opcode == b"L" else b"") + b"\n."
    with pytest.raises(UnexpectedPickle, match=r"an integer in decimal with more than 4,300 digits"):
        plain_values(data)
