"""One asyncio event loop per process, in a daemon thread, for obstore's async requests.

A blocking ``obstore.get`` in a thread cannot be stopped once sent; a
request sent with ``obstore.get_async`` can: cancelling its asyncio future
drops obstore's Rust future, which closes its connection. The scheduler
(:mod:`npydask.storage.requests.scheduler`) sends requests on this loop and
the request threads block on their answers. A forked child gets a loop of
its own (the parent's thread does not exist in it).

At exit the loop is stopped and the threads given the GIL for a moment
(:func:`_settle`): obstore's runtime threads re-take the GIL just after they
hand an answer to the loop, and one still waiting for it when the
interpreter finalizes is ended by ``pthread_exit`` inside Rust frames,
which aborts the process (``SIGABRT``) on the Python versions npydask
supports.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import threading
import time

__all__ = ["loop"]

_lock = threading.Lock()
_loops: dict[int, asyncio.AbstractEventLoop] = {}
_threads: dict[int, threading.Thread] = {}
_registered: list[bool] = []

_SETTLE_S = 0.05
"""At exit, how long the interpreter lets other threads take the GIL before it finalizes."""


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

            thread = threading.Thread(target=serve, name="npydask-requests", daemon=True)
            thread.start()
            ready.wait()
            _loops.clear()  # (a forked child's copy of its parent's loop has no thread: dropped)
            _threads.clear()
            _loops[pid], _threads[pid] = found, thread
            if not _registered:
                _registered.append(True)  # (once: a forked child inherits its parent's registration)
                atexit.register(_settle)
    return found


def _settle() -> None:
    """Stop this process's loop and release the GIL briefly, so no runtime thread is mid-way at finalization."""
    pid = os.getpid()
    with _lock:  # (forgotten: a request made after this starts a loop of its own instead of waiting on this one)
        ev, thread = _loops.pop(pid, None), _threads.pop(pid, None)
    if ev is None or thread is None:
        return
    try:
        ev.call_soon_threadsafe(ev.stop)
    except RuntimeError:  # (closed already)
        pass
    thread.join(timeout=1.0)
    time.sleep(_SETTLE_S)
