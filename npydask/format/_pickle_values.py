"""The plain values in a pickle, read as data: nothing is imported, called or built but plain values.

``pickle.load`` runs whatever callables a pickle names (``os.system`` through
``__reduce__`` is the classic), so npydask never calls it on a file it did not
write. Some files it reads are pickles all the same: ``dask.array.to_npy_stack``
writes its ``info`` as ``pickle.dump({"chunks": ..., "dtype": ..., "axis": ...})``.
:func:`plain_values` walks such a pickle with :func:`pickletools.genops` (a
disassembler that only decodes opcodes and their arguments) and replays the
opcodes that build plain values on a stack of its own:

* ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, tuples, lists
  and dicts (keys: ``str``, ``int``, ``bytes``, ``bool`` or ``None`` only, so
  no key is ever hashed deeply), the memo, marks, ``POP``/``DUP``;
* a global (``GLOBAL``/``STACK_GLOBAL``) becomes a :class:`Global` naming it
  (never imported), and applying it (``REDUCE``, ``NEWOBJ``, then ``BUILD``)
  an :class:`Opaque` naming the callable (never called). Only the globals
  ``allowed`` names may appear at all; any other is refused, so a pickle that
  tries to run code is reported, not run.

Everything else (persistent ids, extension codes, out-of-band buffers,
``INST``/``OBJ``, sets) and every malformed pickle raises
:class:`UnexpectedPickle` (a ``ValueError``) saying what was found.

The work is bounded (:class:`Limits`): a few kilobytes of memo references can
describe a value whose every walk is quadratic or exponential (a tuple of
12,000 references to one tuple of 12,000 ints is 144 million ints to whoever
checks them), so the opcodes replayed, the memo references followed, the size
of the result counted as a tree (a shared value counts every time it appears)
and the length of each dict key are capped, and a pickle beyond any cap is
refused, naming the cap, after work proportional to the cap, not to the value.
"""

from __future__ import annotations

import itertools
import pickletools
import sys
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = ["Global", "Limits", "Opaque", "UnexpectedPickle", "plain_values"]


class UnexpectedPickle(ValueError):
    """A pickle holding something other than plain values and the allowed globals, or not a pickle at all."""


class Global(NamedTuple):
    """A global a pickle names (``module``, ``name``); never imported."""

    module: str
    name: str


class Opaque(NamedTuple):
    """What applying a global would build; never built."""

    made_by: Global


@dataclass(frozen=True)
class Limits:
    """The most work :func:`plain_values` does before refusing a pickle.

    The defaults let through a pickle of plain values of up to 131,072
    opcodes (dask's ``to_npy_stack`` ``info`` for about as many files) and
    refuse anything larger after a fifth of a second or less.

    Attributes
    ----------
    opcodes : int
        Opcodes replayed (each builds at most one value).
    memo_gets : int
        Memo references followed (``GET``, ``BINGET``, ``LONG_BINGET``).
    size : int
        Values in the result counted as a tree: every value, dict key and dict
        value counts one each time it is reached, so a value shared through the
        memo counts once per reference (a container reached again inside
        itself counts once and is not entered again).
    key_length : int
        Characters of a ``str`` key, bytes of a ``bytes`` key, or 64-bit words
        of an ``int`` key (hashing and comparing keys costs their length).
    """

    opcodes: int = 1 << 17
    memo_gets: int = 1 << 16
    size: int = 1 << 17
    key_length: int = 1 << 10


_MARK = object()  # (marks share the stack, as in pickle's own machine)
_KEYS = (str, int, bytes, bool, type(None))

_CONSTANTS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False, "EMPTY_TUPLE": ()}
_ARGUMENT = frozenset({
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
    "STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8",
    "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8",
})  # fmt: skip
_IGNORED = frozenset({"PROTO", "FRAME"})
_MEMO_PUT = frozenset({"PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"})
_MEMO_GET = frozenset({"GET", "BINGET", "LONG_BINGET"})
_TUPLE_N = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}


def plain_values(data: bytes, allowed: Collection[tuple[str, str]] = (), limits: Limits = Limits()) -> Any:
    """The value a pickle describes, built of plain values, :class:`Global` and :class:`Opaque` only.

    Parameters
    ----------
    data : bytes
        The whole pickle (one ``STOP``; trailing bytes are refused).
    allowed : collection of (module, name)
        The globals the pickle may name (``("numpy", "dtype")``); any other is refused.
    limits : Limits, optional
        The most work to do before refusing the pickle (see :class:`Limits`).

    Raises
    ------
    UnexpectedPickle
        Not a pickle, a pickle naming a global not in ``allowed``, an
        opcode this reader does not replay, or a pickle beyond one of ``limits``.

    Examples
    --------
    >>> import pickle
    >>> plain_values(pickle.dumps({"axis": 1, "chunks": ((2, 2), (5,))}))
    {'axis': 1, 'chunks': ((2, 2), (5,))}
    >>> import os
    >>> class Evil:
    ...     def __reduce__(self):
    ...         return (os.system, ("echo pwned",))
    >>> plain_values(pickle.dumps({"axis": Evil()}))  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    npydask.format._pickle_values.UnexpectedPickle: the pickle names posix.system, which is not one of the globals
    expected here (none); it was neither imported nor called
    >>> plain_values(pickle.dumps([[0] * 10] * 10), limits=Limits(size=100))  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    npydask.format._pickle_values.UnexpectedPickle: the pickle describes more than 100 values counted as a tree
    (a value shared through its memo counts each time it appears): too large to be what is expected here
    """
    machine = _Machine(frozenset(allowed), limits)
    try:
        for opcode, arg, pos in pickletools.genops(data):
            if opcode.name == "STOP":
                assert pos is not None  # (genops knows every position in bytes)
                if pos + 1 != len(data):
                    raise UnexpectedPickle(f"{len(data) - pos - 1} bytes follow the pickle's STOP")
                result = machine.result()
                _check_size(result, limits.size)
                return result
            machine.step(opcode.name, arg)
    except UnexpectedPickle:
        raise
    except (ValueError, IndexError, KeyError, TypeError, OverflowError, MemoryError) as e:  # malformed opcodes
        raise UnexpectedPickle(f"not a readable pickle ({_why(e)})") from None
    raise UnexpectedPickle("the pickle has no STOP opcode")  # pragma: no cover (genops raises first)


def _why(e: BaseException) -> str:
    """What was wrong with a pickle's opcodes, from the error decoding them raised."""
    if isinstance(e, ValueError) and "integer string conversion" in str(e):
        # (a decimal INT or LONG longer than Python converts: its own message suggests raising the limit)
        return f"it writes an integer in decimal with more than {sys.get_int_max_str_digits():,} digits"
    return f"{type(e).__name__}: {e}"


_CONTAINERS = (tuple, list, dict)
_END = object()  # (a container's children are exhausted)


def _children(value: tuple[Any, ...] | list[Any] | dict[Any, Any]) -> Iterator[Any]:
    return itertools.chain.from_iterable(value.items()) if isinstance(value, dict) else iter(value)


def _check_size(value: Any, limit: int) -> None:
    """Refuse a value of more than ``limit`` values counted as a tree, after at most ``limit`` steps."""
    if not isinstance(value, _CONTAINERS):
        return
    count = 1
    entered = {id(value)}  # (the containers on the current path: one reached again inside itself is not entered)
    path = [(value, _children(value))]
    while path:
        container, children = path[-1]
        child = next(children, _END)
        if child is _END:
            path.pop()
            entered.discard(id(container))
            continue
        count += 1
        if count > limit:
            raise UnexpectedPickle(
                f"the pickle describes more than {limit:,} values counted as a tree (a value shared through its "
                "memo counts each time it appears): too large to be what is expected here"
            )
        if isinstance(child, _CONTAINERS) and id(child) not in entered:
            entered.add(id(child))
            path.append((child, _children(child)))


class _Machine:
    """pickle's stack machine, for plain values only (see the module docs)."""

    def __init__(self, allowed: frozenset[tuple[str, str]], limits: Limits) -> None:
        self.allowed = allowed
        self.limits = limits
        self.stack: list[Any] = []
        self.memo: dict[int, Any] = {}
        self.opcodes = 0
        self.memo_gets = 0

    def result(self) -> Any:
        if len(self.stack) != 1 or self.stack[0] is _MARK:
            raise UnexpectedPickle(f"the pickle ends with {len(self.stack)} values on its stack instead of one")
        return self.stack[0]

    def step(self, name: str, arg: Any) -> None:  # noqa: C901 (one branch per opcode, as pickle's own table)
        stack = self.stack
        self.opcodes += 1
        if self.opcodes > self.limits.opcodes:
            raise UnexpectedPickle(
                f"the pickle has more than {self.limits.opcodes:,} opcodes: too large to be what is expected here"
            )
        if name in _ARGUMENT:
            stack.append(arg)
        elif name in _CONSTANTS:
            stack.append(_CONSTANTS[name])
        elif name in _IGNORED:
            pass
        elif name == "MARK":
            stack.append(_MARK)
        elif name == "POP":
            self.pop(1)
        elif name == "POP_MARK":
            self.pop_mark()
        elif name == "DUP":
            stack.append(self.pop(1)[0])
            stack.append(stack[-1])
        elif name in _MEMO_PUT:
            if not stack:
                raise UnexpectedPickle("a pickle memoizes a value from an empty stack")
            self.memo[len(self.memo) if name == "MEMOIZE" else arg] = stack[-1]
        elif name in _MEMO_GET:
            self.memo_gets += 1
            if self.memo_gets > self.limits.memo_gets:
                raise UnexpectedPickle(
                    f"the pickle follows more than {self.limits.memo_gets:,} memo references: more sharing than "
                    "what is expected here holds"
                )
            if arg not in self.memo:
                raise UnexpectedPickle(f"a pickle recalls memo entry {arg!r}, which was never stored")
            stack.append(self.memo[arg])
        elif name == "TUPLE":
            stack.append(tuple(self.pop_mark()))
        elif name in _TUPLE_N:
            stack.append(self.pop(_TUPLE_N[name]))
        elif name == "EMPTY_LIST":
            stack.append([])
        elif name == "LIST":
            stack.append(self.pop_mark())
        elif name == "APPEND":
            value = self.pop(1)[0]
            self.top(list).append(value)
        elif name == "APPENDS":
            values = self.pop_mark()
            self.top(list).extend(values)
        elif name == "EMPTY_DICT":
            stack.append({})
        elif name == "DICT":
            flat = self.pop_mark()
            stack.append(self.set_items({}, flat))
        elif name == "SETITEM":
            flat = list(self.pop(2))
            self.set_items(self.top(dict), flat)
        elif name == "SETITEMS":
            flat = self.pop_mark()
            self.set_items(self.top(dict), flat)
        elif name == "GLOBAL":
            module, _, attr = str(arg).partition(" ")
            stack.append(self.named(module, attr))
        elif name == "STACK_GLOBAL":
            stack.append(self.named(*self.pop(2)))
        elif name in ("REDUCE", "NEWOBJ"):
            func, _ = self.pop(2)
            if not isinstance(func, Global):
                raise UnexpectedPickle("a pickle applies something that is not a global")
            stack.append(Opaque(func))
        elif name == "BUILD":
            self.pop(1)
            self.top(Opaque)
        else:
            raise UnexpectedPickle(f"the pickle uses the opcode {name}, which builds more than plain values")

    def pop(self, n: int) -> tuple[Any, ...]:
        stack = self.stack
        if len(stack) < n or any(v is _MARK for v in stack[len(stack) - n :]):
            raise UnexpectedPickle("a pickle opcode takes more values than its stack holds")
        items = tuple(stack[len(stack) - n :])
        del stack[len(stack) - n :]
        return items

    def pop_mark(self) -> list[Any]:
        stack = self.stack
        for k in range(len(stack) - 1, -1, -1):
            if stack[k] is _MARK:
                items = stack[k + 1 :]
                del stack[k:]
                return items
        raise UnexpectedPickle("a pickle opcode needs a MARK that is not there")

    def top(self, kind: type) -> Any:
        if not self.stack or not isinstance(self.stack[-1], kind):
            raise UnexpectedPickle(f"a pickle opcode expects a {kind.__name__} on the stack")
        return self.stack[-1]

    def set_items(self, target: dict[Any, Any], flat: list[Any]) -> dict[Any, Any]:
        if len(flat) % 2:
            raise UnexpectedPickle("a pickle dict has a key without a value")
        for k in range(0, len(flat), 2):
            key = flat[k]
            if not isinstance(key, _KEYS):
                raise UnexpectedPickle(f"a pickle dict has a key of type {type(key).__name__}")
            length = (key.bit_length() + 63) // 64 if isinstance(key, int) else len(key) if key is not None else 0
            if length > self.limits.key_length:
                unit = "64-bit words" if isinstance(key, int) else "bytes" if isinstance(key, bytes) else "characters"
                raise UnexpectedPickle(
                    f"a pickle dict has a key of {length:,} {unit}, more than {self.limits.key_length:,}"
                )
            target[key] = flat[k + 1]
        return target

    def named(self, module: Any, attr: Any) -> Global:
        if not isinstance(module, str) or not isinstance(attr, str):
            raise UnexpectedPickle("a pickle global's module and name are not strings")
        found = Global(module, attr)
        if found not in self.allowed:
            expected = ", ".join(sorted(f"{m}.{n}" for m, n in self.allowed)) or "none"
            raise UnexpectedPickle(
                f"the pickle names {module}.{attr}, which is not one of the globals expected here ({expected}); "
                "it was neither imported nor called"
            )
        return found
