"""A local S3 sandbox for users: ``python -m npydask.testing.seaweed``.

Starts a :class:`~npydask.testing.seaweed.SeaweedServer` (SeaweedFS's
``weed server -s3`` on 127.0.0.1 only, telemetry off, every port and gRPC
port given explicitly, Iceberg and Lance off, data, logs and sockets in a
temporary folder), prints the environment variables that point obstore,
boto3 and npydask's workers at it and the ``storage_options`` dict for
npydask's calls, then waits. Ctrl-C (SIGINT), SIGTERM or SIGHUP stops the
server (SIGTERM, then SIGKILL to its process group) and deletes the folder
with everything written to it.

Example::

    $ python -m npydask.testing.seaweed
    SeaweedFS S3 sandbox at http://127.0.0.1:40123 (weed pid 4242, data in /tmp/npydask-weed-abc123)
    buckets: npydask, private, public (identity admin)
    export AWS_ENDPOINT_URL=http://127.0.0.1:40123
    ...
    storage_options = {'endpoint': 'http://127.0.0.1:40123', 'region': 'us-east-1', ...}
    Ctrl-C stops it and deletes its data.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from npydask.testing.seaweed import SeaweedServer

__all__ = ["main", "describe"]

_STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Stop(Exception):
    """A stopping signal arrived (raised by the handler, caught by :func:`main`)."""


def describe(server: SeaweedServer, identity: str = "admin") -> list[str]:
    """The lines :func:`main` prints for a started server: where it is, what to export, the options.

    The credentials are the sandbox's own fixed ones (they open nothing else).
    """
    env = server.env(identity)
    buckets = ", ".join((server.bucket, server.private_bucket, server.public_bucket))
    return [
        f"SeaweedFS S3 sandbox at {server.endpoint} (weed pid {server.pid}, data in {server.folder})",
        f"buckets: {buckets} (identity {identity})",
        "# for obstore, boto3, the npydask command line and workers started from this shell:",
        *(f"export {name}={shlex.quote(value)}" for name, value in env.items()),
        "# for npydask calls (read_header, open_dataset, to_npy, to_zarr, ...):",
        f"storage_options = {server.storage_options(identity)!r}",
        f"# e.g. npydask.to_npy(x, 's3://{server.bucket}/x.npy', storage_options=storage_options)",
        "Ctrl-C stops it and deletes its data.",
    ]


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the sandbox until a stopping signal; return the exit status (0 after a requested stop).

    Parameters
    ----------
    argv : sequence of str, optional
        The command-line arguments (``sys.argv[1:]`` when ``None``).
    out : text stream, optional
        Where the lines go (``sys.stdout``), flushed at once so a program
        reading them through a pipe gets them.
    """
    out = out or sys.stdout
    parser = argparse.ArgumentParser(
        prog="python -m npydask.testing.seaweed",
        description="A local S3 sandbox: SeaweedFS on 127.0.0.1, until Ctrl-C (its data is then deleted).",
    )
    parser.add_argument(
        "--identity",
        choices=sorted(SeaweedServer.identities),
        default="admin",
        help="whose credentials to print (default: admin, which may do everything)",
    )
    args = parser.parse_args(argv)
    previous = {sig: signal.signal(sig, _raise_stop) for sig in _STOPPING}
    server = SeaweedServer()
    try:
        server.start()
        print("\n".join(describe(server, args.identity)), file=out, flush=True)
        while server.running:
            time.sleep(0.2)
        print(f"weed exited by itself; its log ends:\n{server.log_tail()}", file=sys.stderr, flush=True)
        return 1
    except (_Stop, KeyboardInterrupt):
        return 0
    except (FileNotFoundError, OSError, RuntimeError) as e:  # no weed, or it failed to start (a message each)
        print(f"python -m npydask.testing.seaweed: {e}", file=sys.stderr, flush=True)
        return 2
    finally:
        for sig in _STOPPING:  # (a second Ctrl-C must not cut the clean-up short)
            signal.signal(sig, signal.SIG_IGN)
        folder = server.folder
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if folder is not None:
            print(f"stopped; removed {folder}", file=out, flush=True)


def _raise_stop(signum: int, frame: Any) -> None:
    raise _Stop(signal.Signals(signum).name)


if __name__ == "__main__":  # (what python -m npydask.testing.seaweed runs)
    sys.exit(main())
