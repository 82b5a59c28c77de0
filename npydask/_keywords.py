""" "Did you mean" for a misspelled keyword argument of a public function.

Python 3.11 answers ``open_dataset(root, roi_strat=[2])`` with
``got an unexpected keyword argument 'roi_strat'`` and stops there (3.12
adds a suggestion for the binding error alone, and none where a function
passes its ``**kwargs`` on). :func:`suggest_keywords` wraps a function so
that such a ``TypeError`` names the closest keyword the function takes
(:func:`difflib.get_close_matches` over its signature, plus the names of
the function its ``**kwargs`` go to). It does no work unless the call
raises ``TypeError`` (one ``try`` around the call), and it rewrites only the
message Python (or a function refusing a keyword the same way) gives for a
keyword the function does not name, and only when a name is close; every
other error passes unchanged. The message names the function called, also
for a keyword refused by the function its ``**kwargs`` went to.

This module imports nothing of npydask's.

Examples
--------
>>> @suggest_keywords
... def crop(path, *, roi_start=None, roi_end=None):
...     return roi_start
>>> crop("a.npy", roi_strat=[1])
Traceback (most recent call last):
...
TypeError: crop() got an unexpected keyword argument 'roi_strat'. Did you mean 'roi_start'?
>>> crop("a.npy", colour=1)
Traceback (most recent call last):
...
TypeError: crop() got an unexpected keyword argument 'colour'
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["suggest_keywords", "unexpected_keyword"]

F = TypeVar("F", bound=Callable[..., Any])

_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def suggest_keywords(fn: F | None = None, *, also: Callable[[], Callable[..., Any]] | None = None) -> Any:
    """Wrap ``fn`` so that a misspelled keyword gets "Did you mean ...?" (see the module docs).

    Parameters
    ----------
    fn : callable
        The public function (or a class's ``__init__``, named after its class).
    also : callable, optional
        Returns the function ``fn`` passes its ``**kwargs`` to, whose keywords
        are suggested too; called on the failure path only (so it may import).
    """

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except TypeError as e:
                better = _suggested(e, kwargs, fn, also)
                if better is None:
                    raise
            raise better  # (outside the except block: no "during handling" chain)

        return call  # type: ignore[return-value]

    return wrap if fn is None else wrap(fn)


def unexpected_keyword(function: str, keyword: str, valid: list[str]) -> TypeError:
    """Python's ``TypeError`` for ``keyword``, with the closest of ``valid`` when one is close.

    Examples
    --------
    >>> unexpected_keyword("to_npy", "overwrit", ["compute", "overwrite", "storage_options"])
    TypeError("to_npy() got an unexpected keyword argument 'overwrit'. Did you mean 'overwrite'?")
    """
    close = difflib.get_close_matches(keyword, valid, n=1)
    hint = f". Did you mean {close[0]!r}?" if close else ""
    return TypeError(f"{function}() got an unexpected keyword argument {keyword!r}{hint}")


def _suggested(
    error: TypeError, kwargs: dict[str, Any], fn: Callable[..., Any], also: Callable[[], Callable[..., Any]] | None
) -> TypeError | None:
    """The ``TypeError`` with a suggestion, or ``None`` to keep ``error`` as it is."""
    text = str(error)
    if "unexpected keyword argument" not in text:
        return None
    own = _names(fn)
    for keyword in kwargs:
        if keyword not in own and f"unexpected keyword argument {keyword!r}" in text:
            valid = own + ([n for n in _names(also()) if n not in own] if also is not None else [])
            better = unexpected_keyword(fn.__qualname__.removesuffix(".__init__"), keyword, valid)
            return better if "Did you mean" in str(better) else None
    return None


def _names(fn: Callable[..., Any]) -> list[str]:
    """The keywords ``fn`` names in its signature (not its ``**kwargs``; not ``self``)."""
    params = inspect.signature(fn).parameters.values()
    return [p.name for p in params if p.kind in _NAMED and p.name != "self"]
