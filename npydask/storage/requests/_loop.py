"""One asyncio event loop per process, in a daemon thread, for obstore's async requests.

A blocking ``obstore.get`` in a thread cannot be stopped once sent; a
coroutine awaiting ``obstore.get_async`` can: cancelling the asyncio future
drops obstore's Rust future, which closes its connection. The request
threads submit coroutines here (:func:`run`) and block on their results. A
forked child gets a loop of its own (the parent's thread does not exist in
it).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["loop", "run"]

T = TypeVar("T")

_lock = threading.Lock()
_loops: dict[int, asyncio.AbstractEventLoop] = {}


def loop() -> asyncio.AbstractEventLoop:
    """This process's request loop (started on first use)."""
    pid = os.getpid()
    found = _loops.get(pid)
    if found is not None:
        return found
    with _lock:
        found = _loops.get(pid)
        if found is None:
            found = asyncio.new_event_loop()
            ready = threading.Event()

            def serve(ev: asyncio.AbstractEventLoop = found) -> None:
                asyncio.set_event_loop(ev)
                ev.call_soon(ready.set)
                ev.run_forever()

            threading.Thread(target=serve, name="npydask-requests", daemon=True).start()
            ready.wait()
            _loops.clear()  # (a forked child's copy of its parent's loop has no thread: dropped)
            _loops[pid] = found
    return found


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the request loop and wait for its result (its exception raised here).

    Not to be called from the loop's own thread (it would wait on itself).
    """
    ev = loop()
    future = asyncio.run_coroutine_threadsafe(coro, ev)
    try:
        return future.result()
    except BaseException:
        future.cancel()  # (this thread was interrupted: the request is dropped)
        raise
