"""One asyncio event loop per process, in a daemon thread, for obstore's async requests.

A blocking ``obstore.get`` in a thread cannot be stopped once sent; a
request sent with ``obstore.get_async`` can: cancelling its asyncio future
drops obstore's Rust future, which closes its connection. The scheduler
(:mod:`npydask.storage.requests.scheduler`) sends requests on this loop and
the request threads block on their answers. A forked child gets a loop of
its own (the parent's thread does not exist in it).
"""

from __future__ import annotations

import asyncio
import os
import threading

__all__ = ["loop"]

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
