"""Pure parsing of the NPY and NPZ formats: bytes in, facts out, no I/O.

The plain values of an object array's pickle (:func:`plain_values`, with its
:class:`Limits`, :class:`Global`, :class:`Opaque` and
:class:`UnexpectedPickle`) are read by :mod:`npydask.format._pickle_values`
and named here.
"""

from __future__ import annotations

from npydask.format._pickle_values import Global, Limits, Opaque, UnexpectedPickle, plain_values

__all__ = ["Global", "Limits", "Opaque", "UnexpectedPickle", "plain_values"]
