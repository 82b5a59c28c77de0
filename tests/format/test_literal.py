"""The header literal parser decodes string escapes itself: as Python does, and without ``ast``.

Python 3.11's ``ast`` can fail under threads ("SystemError: AST constructor recursion depth
mismatch", a CPython bug), and headers are parsed on dask's threads, so the parser must not
call it. The oracle is ``ast.literal_eval`` on one token, in this (main) thread, warnings as errors.
"""

from __future__ import annotations

import ast
import threading
import warnings

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npydask.format import _literal
from npydask.format._literal import BAD_ESCAPE, LiteralError, parse_dict

TOKENS = [
    r"'\x64escr'",
    r"'\144escr'",
    r"'\0'",
    r"'\u0064'",
    r"'\U0001F600'",
    r"'\N{LATIN SMALL LETTER D}'",
    r"'\N{latin small letter d}'",
    r"'a\\b'",
    r"'\''",
    r'"\""',
    r"'\a\b\f\n\r\t\v'",
    "'a\\\nb'",
    "'''a\\\r\nb'''",
    "'''a\\\nb\nc'''",
    "'''x\r\ny\\n'''",
    r"b'\x00\xff\377'",
    r"B'\n'",
    r"r'\x64'",
    r"R'\N{DASH}'",
    r"br'\u'",
    r"Rb'\q'",
    r"u'\x41'",
    r"U'\101'",
    r"'\ud800'",
    # refused by both: invalid escapes (Python only warns), truncated or unknown ones
    r"'\q'",
    r"'\8'",
    r"'\777'",
    r"b'\777'",
    r"b'\u0041'",
    r"b'\N{DASH}'",
    r"'\x4'",
    r"'\u12'",
    r"'\U0011FFFF'",
    r"'\U00110000'",
    r"'\N{NO SUCH NAME AT ALL}'",
    r"'\N'",
    r"'\N{'",
    r"'\N{}'",
    "b'\u00e9\\n'",
]


def _python(token: str) -> str | bytes | None:
    """What Python makes of the token (``None``: refused, or only warned about)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            return ast.literal_eval(token)
        except (SyntaxError, ValueError, DeprecationWarning, SyntaxWarning):
            return None


def _ours(token: str) -> str | bytes | None:
    try:
        return _literal._string(token)
    except LiteralError:
        return None


def _is_one_string_token(token: str) -> bool:
    m = _literal._TOKEN.match(token)
    return m is not None and m.lastgroup == "str" and m.end() == len(token)


@pytest.mark.parametrize("token", TOKENS)
def test_string_tokens_decode_as_python_decodes_them(token):
    assert _is_one_string_token(token)
    assert _ours(token) == _python(token) and type(_ours(token)) is type(_python(token))


@given(
    st.sampled_from(["", "b", "r", "u", "br", "rb", "B", "R"]),
    st.sampled_from(["'", '"', "'''"]),
    st.lists(
        st.sampled_from(
            [
                "\\",
                "x",
                "N",
                "{",
                "}",
                "u",
                "U",
                "0",
                "7",
                "8",
                "4",
                "f",
                "a",
                "n",
                "\n",
                "\r",
                "é",
                " ",
                "LATIN SMALL LETTER A",
                "DASH",
            ]
        ),
        max_size=12,
    ),
)
def test_any_string_token_decodes_as_python_decodes_it(prefix, quote, parts):
    token = prefix + quote + "".join(parts) + quote
    if not _is_one_string_token(token):
        return  # not one string literal: the tokenizer never hands it over
    assert _ours(token) == _python(token) and type(_ours(token)) is type(_python(token)), token


def test_escapes_are_decoded_without_ast(monkeypatch):
    calls = []
    with monkeypatch.context() as m:  # (undone before any assert: pytest's failure report uses ast)
        for name in ("literal_eval", "parse"):
            real = getattr(ast, name)
            m.setattr(ast, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
        items, _ = parse_dict(r"{'descr': [('\x61', '<f4'), (u'\N{LATIN SMALL LETTER B}', '<i2')], 'shape': (2,)}")
        with pytest.raises(LiteralError) as info:
            parse_dict(r"{'descr': '\q'}")
    assert calls == []
    assert items == (("descr", [("a", "<f4"), ("b", "<i2")]), ("shape", (2,)))
    assert info.value.expected == BAD_ESCAPE


def test_escaped_headers_parse_alike_on_many_threads_at_once():
    text = r"{'descr': [('\x61\u00e9', '<f4'), ('b\n', '|S3')], 'fortran_order': False, 'shape': (3, 4), }"
    want = parse_dict(text)
    got: list[object] = []

    def work() -> None:
        for _ in range(300):
            got.append(parse_dict(text))

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 2400 and all(g == want for g in got)
