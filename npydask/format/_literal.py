"""A bounded parser for the header dict's literal spelling: no ``ast``, no ``eval``.

Headers that do not match numpy's canonical spelling (other writers, other
key orders, structured dtypes) are Python dict literals. ``ast.parse`` would
build a Python object for every node, hundreds of bytes per byte of text, so
a header near the 1 MiB limit cost far more memory and time than its size
(figures on the performance page). This parser scans
the text once with one regular expression and builds only the values (memory
in proportion to what the header holds: a tuple of ints, a list of fields).

It accepts exactly what the ``ast`` walk it replaces accepted: one dict of
string, integer and boolean literals, tuples and lists (parenthesised values,
``-`` before an integer, adjacent strings joined, comments, line
continuations and any spelling of ints Python has), spelled as Python spells
them. Anything else raises :class:`LiteralError` saying what was expected
and found; the caller adds the file's name.

Examples
--------
>>> parse_dict("{'descr': '<' 'f4', 'shape': (0x3, -(2)), 'fortran_order': False} \\n")
((('descr', '<f4'), ('shape', (3, -2)), ('fortran_order', False)), 65)
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

__all__ = ["BAD_ESCAPE", "MAX_DEPTH", "NOT_LITERAL", "SYNTAX", "LiteralError", "parse_dict"]

SYNTAX = "a Python dict literal as header"
"""What a syntax error (by Python's rules) was expected to be."""
NOT_LITERAL = "only string, integer and boolean literals, tuples and lists in the header"
"""What a valid but disallowed expression (a float, a call, a name, ``+3``) was expected to be."""
BAD_ESCAPE = "strings without invalid escape sequences"
"""What a string like ``'\\q'`` was expected to be (Python only warns about it; npydask refuses it)."""
MAX_DEPTH = 200
"""Deepest nesting of brackets; Python's own parser stops at 200 too."""


class LiteralError(ValueError):
    """The text is not an allowed dict literal: ``expected`` and ``found`` say how."""

    def __init__(self, expected: str, found: str) -> None:
        super().__init__(f"expected {expected}, found {found}")
        self.expected = expected
        self.found = found


# Every repeated group is possessive (``*+``) or unrolled around a character class: a repeated
# group that may backtrack keeps state per repetition in ``re``, so 1 MiB of blanks, digits or
# string would cost many times its size (figures on the performance page).
_DIGITS = r"[0-9](?:_?[0-9])*+"
_NUMBER = (
    r"0[xX](?:_?[0-9a-fA-F])++|0[bB](?:_?[01])++|0[oO](?:_?[0-7])++"
    rf"|(?:{_DIGITS}(?:\.(?:{_DIGITS})?)?|\.{_DIGITS})(?:[eE][-+]?{_DIGITS})?[jJ]?"
)
_Q1, _Q2 = "'", '"'
_STRING = "|".join(
    [rf"{q * 3}[^{q}\\]*+(?:(?:\\.|{q}(?!{q * 2}))[^{q}\\]*+)*+{q * 3}" for q in (_Q1, _Q2)]
    + [rf"{q}[^\n\r{q}\\]*+(?:\\.[^\n\r{q}\\]*+)*+{q}" for q in (_Q1, _Q2)]
)
_TOKEN = re.compile(
    r"[ \t\f\r\n]*+(?:(?:\\\r?\n|#[^\r\n]*+)[ \t\f\r\n]*+)*+"  # blanks, line continuations, comments
    r"(?:(?P<op>\*\*|[-+~*(){}\[\]:,])"
    rf"|(?P<str>[rRuUbBfF]{{0,2}}(?:{_STRING}))|(?P<num>{_NUMBER})|(?P<name>\w+)|(?P<end>\Z)|(?P<other>.))",
    re.S,
)
_INT_RUN = re.compile(r"(?: *+(?:0|[1-9][0-9]{0,18}+) *+,){1,1024}+")
"""Plain decimal ints, each followed by a comma (spaces around): the bulk of a long shape."""
_STRING_PREFIXES = {"", "r", "u", "b", "br", "rb", "f", "fr", "rf"}


class _Parser:
    """Recursive descent over :data:`_TOKEN` matches; ``tok``/``value`` are the current token."""

    __slots__ = ("depth", "pos", "text", "tok", "value")

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.depth = 0
        self.tok = ""
        self.value = ""
        self._next()

    def _next(self) -> None:
        """Move to the next token: ``tok`` is its kind, or the operator itself (``"("``, ``","``)."""
        m = _TOKEN.match(self.text, self.pos)
        assert m is not None and m.lastgroup is not None  # ('other' matches any character, 'end' the end)
        self.pos = m.end()
        kind = m.lastgroup
        self.value = value = m.group(kind)
        self.tok = value if kind == "op" else kind

    def _syntax(self, what: str) -> LiteralError:
        return LiteralError(SYNTAX, f"{what} at character {self.pos}")

    def top(self) -> tuple[tuple[Any, Any], ...]:
        """The dict the text starts with; ``self.pos`` is then just past its ``}``."""
        if not self.tok == "{":
            raise LiteralError("a dict as header", f"{self.value!r} first")
        items: list[tuple[Any, Any]] = []
        self._next()
        while not self.tok == "}":
            key, _ = self.item()
            if not self.tok == ":":
                if not items and (self.tok == "," or self.tok == "}"):
                    raise LiteralError("a dict as header", "a set")
                raise self._syntax(f"{self.value!r} where ':' belongs")
            self._next()
            value, _ = self.item()
            items.append((key, value))
            if self.tok == ",":
                self._next()
            elif not self.tok == "}":
                raise self._syntax(f"{self.value!r} after a value")
        return tuple(items)

    def item(self) -> tuple[Any, bool]:
        """One value, and whether it is a bare (perhaps parenthesised) integer literal."""
        tok, value = self.tok, self.value
        if tok == "str":
            return self._strings(), False
        if tok == "num":
            self._next()
            if value[:2].lower() not in ("0x", "0o", "0b") and any(c in value for c in ".eEjJ"):
                kind = "complex" if value[-1] in "jJ" else "float"
                raise LiteralError(NOT_LITERAL, f"a {kind} constant {value[:40]!r}")
            try:
                return int(value, 0), True
            except ValueError as e:  # 007, or more digits than int() converts
                raise self._syntax(f"the number {value[:40]!r}") from e
        if tok == "name":
            self._next()
            if value == "True" or value == "False":
                return value == "True", False
            raise LiteralError(NOT_LITERAL, f"the name {value[:40]!r}")
        if tok == "-":
            self._next()
            operand, is_int = self.item()
            if not is_int:
                raise LiteralError(NOT_LITERAL, "'-' before something other than an integer")
            return -operand, False
        if tok == "(" or tok == "[":
            return self._sequence(tok)
        if tok == "+" or tok == "~":
            raise LiteralError(NOT_LITERAL, f"the unary operator {value!r}")
        if tok == "{":
            raise LiteralError(NOT_LITERAL, "a dict or set inside the header dict")
        raise self._syntax(repr(value) if tok != "end" else "the end of the text")

    def _strings(self) -> str:
        """Adjacent string literals, joined as Python joins them."""
        first = _string(self.value)
        self._next()
        if self.tok != "str" and type(first) is str:  # (one literal: the common case)
            return first
        parts: list[str | bytes] = [first]
        while self.tok == "str":
            parts.append(_string(self.value))
            self._next()
        if len({type(p) for p in parts}) > 1:
            raise self._syntax("str and bytes literals side by side")
        if isinstance(parts[0], bytes):
            raise LiteralError(NOT_LITERAL, "a bytes constant")
        return "".join(parts)  # type: ignore[arg-type]

    def _sequence(self, opener: str) -> tuple[Any, bool]:
        """A tuple or list; a parenthesised single value is that value (an integer stays one)."""
        closer = ")" if opener == "(" else "]"
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self._syntax(f"brackets nested more than {MAX_DEPTH} deep")
        values: list[Any] = []
        comma = False
        is_int = False
        run = _INT_RUN.match(self.text, self.pos)
        while run is not None:  # "1, 2, 3," a block at a time: a long shape costs few regex matches
            values.extend(map(int, run[0].split(",")[:-1]))
            comma = True
            self.pos = run.end()
            run = _INT_RUN.match(self.text, self.pos)
        self._next()
        while not self.tok == closer:
            value, is_int = self.item()
            values.append(value)
            if self.tok == ",":
                comma = True
                self._next()
            elif not self.tok == closer:
                raise self._syntax(f"{self.value!r} inside {opener}{closer}")
        self._next()
        self.depth -= 1
        if opener == "[":
            return values, False
        if not comma and len(values) == 1:  # (x) is x
            return values[0], is_int
        return tuple(values), False


_ESCAPE = re.compile(
    r"\\(?:([0-7]{1,3})|x([0-9a-fA-F]{0,2})|N(\{[^}\n]*\}?)?|u([0-9a-fA-F]{0,4})|U([0-9a-fA-F]{0,8})|(.))", re.S
)
"""One escape: octal, ``\\x``, ``\\N{name}``, ``\\u``, ``\\U`` (each as far as it goes), or any other character."""
_SIMPLE = {
    "\n": "",
    "\\": "\\",
    "'": "'",
    '"': '"',
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
}


def _unescape(body: str, is_bytes: bool) -> str:
    """The escape sequences of a (non-raw) string body decoded as Python decodes them, without ``ast``.

    Python's ``\\N``, ``\\u`` and ``\\U`` are escapes in ``str`` only; elsewhere a backslash before a
    character with no escape meaning, or an octal escape above ``\\377``, is what Python only warns
    about: refused (``BAD_ESCAPE``). A truncated ``\\x``, ``\\u``, ``\\U`` or an unknown ``\\N{name}``
    is a syntax error in Python too.
    """

    def one(m: re.Match[str]) -> str:
        octal, hx, name, u4, u8, other = m.groups()
        if octal is not None:
            if int(octal, 8) > 0o377:
                raise LiteralError(BAD_ESCAPE, f"the octal escape {m[0]!r} above \\377")
            return chr(int(octal, 8))
        if hx is not None:
            if len(hx) != 2:
                raise LiteralError(SYNTAX, f"the truncated escape {m[0]!r}")
            return chr(int(hx, 16))
        if other is not None:
            if other in _SIMPLE:
                return _SIMPLE[other]
            raise LiteralError(BAD_ESCAPE, f"the invalid escape sequence {m[0]!r}")
        if is_bytes:  # \N, \u and \U mean nothing in bytes
            raise LiteralError(BAD_ESCAPE, f"the invalid escape sequence {m[0][:2]!r} in bytes")
        if u4 is not None or u8 is not None:
            digits = u4 if u4 is not None else u8
            if len(digits) != (4 if u4 is not None else 8):
                raise LiteralError(SYNTAX, f"the truncated escape {m[0]!r}")
            if int(digits, 16) > 0x10FFFF:
                raise LiteralError(SYNTAX, f"the escape {m[0]!r} beyond Unicode")
            return chr(int(digits, 16))
        if name is None or not name.endswith("}") or len(name) < 3:
            raise LiteralError(SYNTAX, f"the malformed escape {m[0]!r}")
        try:
            char = unicodedata.lookup(name[1:-1])
        except KeyError:
            char = ""
        if len(char) != 1:  # (lookup also knows named sequences, which \N does not take)
            raise LiteralError(SYNTAX, f"the unknown character name in {m[0]!r}")
        return char

    return _ESCAPE.sub(one, body)


def _string(token: str) -> str | bytes:
    """The value of one string literal token (prefix included), decoded here: no ``ast``, no ``eval``.

    The token is a whole string literal by construction (the tokenizer matched
    it); what is left is the prefix, the escapes, and newlines (a line break in
    the text is ``\\n`` in the value, as Python reads source).
    """
    first = token[0]
    if (first == "'" or first == '"') and "\\" not in token:  # the common case: nothing to decode
        cut = 3 if token.startswith(first * 3) else 1
        return token[cut:-cut]
    quote = min(i for i in (token.find("'"), token.find('"')) if i >= 0)
    prefix = token[:quote].lower()
    if prefix not in _STRING_PREFIXES:
        raise LiteralError(SYNTAX, f"the string prefix {token[:quote]!r}")
    if "f" in prefix:
        raise LiteralError(NOT_LITERAL, "an f-string")
    cut = 3 if token.startswith(token[quote] * 3, quote) else 1
    body = token[quote + cut : len(token) - cut].replace("\r\n", "\n").replace("\r", "\n")
    is_bytes = "b" in prefix
    if is_bytes and not body.isascii():
        raise LiteralError(SYNTAX, f"bytes {token[:60]!r} with a character that is not ASCII")
    value = body if "r" in prefix else _unescape(body, is_bytes)
    return value.encode("latin-1") if is_bytes else value


def parse_dict(text: str) -> tuple[tuple[tuple[Any, Any], ...], int]:
    """The (key, value) pairs of the dict literal ``text`` starts with, and where the dict ends.

    Pairs come in order, duplicates kept; the offset is just past the
    closing brace (what may follow is the caller's to check).

    Raises
    ------
    LiteralError
        Not a dict of allowed literals, or not valid Python.
    """
    p = _Parser(text)
    items = p.top()
    return items, p.pos
