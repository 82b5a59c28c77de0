"""An emulated network link for one local server port: the kernel's HTB shaper on loopback.

On loopback a local object store answers at memory speed, so its CPU per
request, not the bytes, decides how long a read takes. A cloud VM reads its
object store over a link of about 1-25 Gbit/s. :func:`shaped_port` paces the
bytes a server sends *from one TCP port* (its responses) at a given rate with
Linux traffic control, leaving every other loopback flow (other tests, the
server's own internal traffic) untouched:

    tc qdisc add dev lo root handle 1: htb            (unclassified traffic: unshaped)
    tc class add dev lo parent 1: classid 1:20 htb rate R ceil R burst 256k cburst 256k
    tc filter add dev lo protocol ip parent 1: prio 1 u32 match ip sport PORT 0xffff flowid 1:20

It needs root and the ``htb`` qdisc and ``u32`` filter, refuses to replace a
root qdisc someone else installed on ``lo``, and removes its own on exit. No
latency is added (``netem`` is not available on every kernel). Where it
cannot shape, it says why and the caller falls back to a pacing proxy
(:class:`npydask.testing.counting_proxy.CountingProxy` with ``rate=``), whose
own per-request CPU makes it a pessimistic emulation.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator

__all__ = ["cannot_shape", "shaped_port"]


def _tc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["tc", *args], capture_output=True, text=True, timeout=30)


def cannot_shape() -> str | None:
    """Why :func:`shaped_port` cannot work here, or ``None`` when it can."""
    if shutil.which("tc") is None:
        return "no `tc` (iproute2) here"
    if os.geteuid() != 0:
        return "shaping loopback needs root"
    shown = _tc("qdisc", "show", "dev", "lo")
    if shown.returncode:
        return f"`tc qdisc show dev lo` failed: {shown.stderr.strip()}"
    root = shown.stdout.split("\n", 1)[0]
    if root and not root.startswith("qdisc noqueue"):
        return f"loopback already has a root qdisc ({root.strip()}); not replacing it"
    return None


@contextlib.contextmanager
def shaped_port(port: int, mbit: float) -> Iterator[str]:
    """Pace what ``127.0.0.1:port`` sends at ``mbit`` Mbit/s while inside; yields a description.

    Raises
    ------
    RuntimeError
        If shaping is impossible here (:func:`cannot_shape`) or a ``tc``
        command fails (whatever was installed is removed first).
    """
    why = cannot_shape()
    if why:
        raise RuntimeError(why)
    rate = f"{mbit:g}mbit"
    commands = [
        ("qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb"),
        (
            "class",
            "add",
            "dev",
            "lo",
            "parent",
            "1:",
            "classid",
            "1:20",
            "htb",
            "rate",
            rate,
            "ceil",
            rate,
            "burst",
            "256k",
            "cburst",
            "256k",
        ),
        (
            "filter",
            "add",
            "dev",
            "lo",
            "protocol",
            "ip",
            "parent",
            "1:",
            "prio",
            "1",
            "u32",
            "match",
            "ip",
            "sport",
            str(port),
            "0xffff",
            "flowid",
            "1:20",
        ),
    ]
    try:
        for command in commands:
            done = _tc(*command)
            if done.returncode:
                raise RuntimeError(f"`tc {' '.join(command)}` failed: {done.stderr.strip()}")
        yield f"{mbit:g} Mbit/s by tc htb on lo, port {port}'s responses only"
    finally:
        _tc("qdisc", "del", "dev", "lo", "root")
