"""One request sent with obstore's async API, driven by done-callbacks on the request loop.

obstore's ``get_async``, ``bytes_async`` and ``head_async`` return asyncio
futures (pyo3-async-runtimes' ``future_into_py``); an :class:`Attempt`
chains them with done-callbacks, with no task or coroutine of its own, so a
request costs the loop little more than the futures themselves. Cancelling
one (:meth:`Attempt.cancel`) cancels the future it waits on, which drops
obstore's Rust future: the request, or the body being read, and its
connection.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["Attempt"]


class Attempt:
    """A GET (``options`` given) or HEAD (``options=None``) in flight; ``on_done(self)`` when it ends.

    Once done, :attr:`value` is ``(data, meta, range, seconds)`` for a GET and ``(meta, seconds)``
    for a HEAD, or :attr:`error` the exception. Must be made and cancelled on the request loop.
    """

    __slots__ = ("cancelled", "done", "error", "future", "on_done", "result", "start", "value")

    def __init__(self, store: Any, key: str, options: dict[str, Any] | None, on_done: Callable[[Attempt], None]):
        import obstore

        self.on_done = on_done
        self.done = self.cancelled = False
        self.value: Any = None
        self.error: BaseException | None = None
        self.result: Any = None
        self.start = time.monotonic()
        self.future: Any  # (typed as coroutines by obstore's stubs: they are asyncio futures, with callbacks)
        if options is None:
            self.future = obstore.head_async(store, key)
            self.future.add_done_callback(self._meta)
        else:
            self.future = obstore.get_async(store, key, options=options)  # type: ignore[arg-type]
            self.future.add_done_callback(self._headers)

    def _meta(self, future: Any) -> None:
        if self.cancelled:
            return
        try:
            meta = future.result()
        except BaseException as e:
            self._finish(None, e)
            return
        self._finish((meta, time.monotonic() - self.start), None)

    def _headers(self, future: Any) -> None:
        if self.cancelled:
            return
        try:
            self.result = future.result()
            self.future = self.result.bytes_async()
        except BaseException as e:
            self._finish(None, e)
            return
        self.future.add_done_callback(self._body)

    def _body(self, future: Any) -> None:
        if self.cancelled:
            return
        result, self.result = self.result, None
        try:
            data = future.result()
        except BaseException as e:
            self._finish(None, e)
            return
        self._finish((data, result.meta, result.range, time.monotonic() - self.start), None)

    def _finish(self, value: Any, error: BaseException | None) -> None:
        self.done = True
        self.value, self.error = value, error
        self.on_done(self)

    def cancel(self) -> None:
        """Stop it: its future cancelled (obstore's Rust future dropped, the connection closed); no ``on_done``."""
        if self.done:
            return
        self.cancelled = self.done = True
        self.future.cancel()
        self.result = None  # (a response whose body was not read yet: dropped with its stream)
