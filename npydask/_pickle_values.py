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
"""

from __future__ import annotations

import pickletools
from collections.abc import Collection
from typing import Any, NamedTuple

__all__ = ["Global", "Opaque", "UnexpectedPickle", "plain_values"]


class UnexpectedPickle(ValueError):
    """A pickle holding something other than plain values and the allowed globals, or not a pickle at all."""


class Global(NamedTuple):
    """A global a pickle names (``module``, ``name``); never imported."""

    module: str
    name: str


class Opaque(NamedTuple):
    """What applying a global would build; never built."""

    made_by: Global


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


def plain_values(data: bytes, allowed: Collection[tuple[str, str]] = ()) -> Any:
    """The value a pickle describes, built of plain values, :class:`Global` and :class:`Opaque` only.

    Parameters
    ----------
    data : bytes
        The whole pickle (one ``STOP``; trailing bytes are refused).
    allowed : collection of (module, name)
        The globals the pickle may name (``("numpy", "dtype")``); any other is refused.

    Raises
    ------
    UnexpectedPickle
        Not a pickle, a pickle naming a global not in ``allowed``, or an
        opcode this reader does not replay.

    Examples
    --------
    >>> import pickle
    >>> plain_values(pickle.dumps({"axis": 1, "chunks": ((2, 2), (5,))}))
    {'axis': 1, 'chunks': ((2, 2), (5,))}
    >>> import os
    >>> class Evil:
    ...     def __reduce__(self):
    ...         return (os.system, ("echo pwned",))
    >>> plain_values(pickle.dumps({"axis": Evil()}))
    Traceback (most recent call last):
    ...
    npydask._pickle_values.UnexpectedPickle: the pickle names posix.system, which is not one of the globals expected here (none); it was neither imported nor called
    """
    machine = _Machine(frozenset(allowed))
    try:
        for opcode, arg, pos in pickletools.genops(data):
            if opcode.name == "STOP":
                if pos + 1 != len(data):
                    raise UnexpectedPickle(f"{len(data) - pos - 1} bytes follow the pickle's STOP")
                return machine.result()
            machine.step(opcode.name, arg)
    except UnexpectedPickle:
        raise
    except (ValueError, IndexError, KeyError, TypeError, OverflowError, MemoryError) as e:  # malformed opcodes
        raise UnexpectedPickle(f"not a readable pickle ({type(e).__name__}: {e})") from None
    raise UnexpectedPickle("the pickle has no STOP opcode")  # pragma: no cover (genops raises first)


class _Machine:
    """pickle's stack machine, for plain values only (see the module docs)."""

    def __init__(self, allowed: frozenset[tuple[str, str]]) -> None:
        self.allowed = allowed
        self.stack: list[Any] = []
        self.memo: dict[int, Any] = {}

    def result(self) -> Any:
        if len(self.stack) != 1 or self.stack[0] is _MARK:
            raise UnexpectedPickle(f"the pickle ends with {len(self.stack)} values on its stack instead of one")
        return self.stack[0]

    def step(self, name: str, arg: Any) -> None:  # noqa: C901 (one branch per opcode, as pickle's own table)
        stack = self.stack
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

    @staticmethod
    def set_items(target: dict[Any, Any], flat: list[Any]) -> dict[Any, Any]:
        if len(flat) % 2:
            raise UnexpectedPickle("a pickle dict has a key without a value")
        for k in range(0, len(flat), 2):
            if not isinstance(flat[k], _KEYS):
                raise UnexpectedPickle(f"a pickle dict has a key of type {type(flat[k]).__name__}")
            target[flat[k]] = flat[k + 1]
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
