"""A Stitcher run's zarr arrays in object storage: hidden temporary arrays, published by server-side copies.

Object storage has no rename and no lock, so :class:`RemoteStaging` writes
each file's array as the temporary array ``.<name>.stitch<10 hex>.npydask-tmp``
of ``out``'s own group (every chunk written, empty or not, so that its
chunks can be counted) and, when complete:

1. marks it complete (an attribute added to its ``zarr.json`` after its last chunk);
2. deletes the published array's ``zarr.json`` (from here until step 5 the
   array is missing: no reader sees old metadata over new chunks);
3. copies each chunk object to the array's prefix, server side;
4. deletes the old array's objects the new one lacks (a shape or chunk grid
   of its own: an old chunk must not show through the new metadata);
5. writes the array's ``zarr.json`` (the temporary's, less the mark) last;
6. deletes the temporary, its ``zarr.json`` first.

While it has temporaries a run holds a lease, the object
``.stitch<10 hex>.npydask-tmp`` of the group, written again every
:data:`BEAT_S` seconds by a background thread; it holds the process's id,
pid namespace and machine boot id. The next Stitcher on ``out``
(:meth:`RemoteStaging.sweep`) takes a run for dead when its lease is
missing, more than :data:`LEASE_S` seconds older than its own (both the
server's clock), or its process ran in the same pid namespace of the same
boot and no process has its id any more (:func:`_gone`: a crashed run
rerun on the same machine is cleaned at once). It finishes the
publication of a dead run's complete temporaries (rolls forward: steps 2
to 6 again, which give the same result however often they run) and
deletes the others, then the lease.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from npydask.storage import TMP_SUFFIX, temporary_name, translate
from npydask.storage.urls import redact

__all__ = ["BEAT_S", "LEASE_S", "MARK", "RemoteStaging"]

BEAT_S = 10.0
"""How often a live run writes its lease again (seconds)."""

LEASE_S = 120.0
"""How much older than a new run's own lease (server time) another run's must be for that run to count as dead."""

MARK = "npydask_stitch"
"""The attribute that marks a temporary array complete: ``{"name": <the array's name>}``."""

_COPIERS = 8

_TEMP = re.compile(r"\..+\.(stitch[0-9a-f]{10})" + re.escape(TMP_SUFFIX))
_LEASE = re.compile(r"\.(stitch[0-9a-f]{10})" + re.escape(TMP_SUFFIX))


def _copy(store: Any, from_: str, to: str) -> None:
    """A server-side copy of one object (a seam for tests that kill a run while it publishes)."""
    import obstore

    obstore.copy(store, from_, to, overwrite=True)


class RemoteStaging:
    """A Stitcher run's temporary arrays in the zarr group ``group`` (object storage; see the module docs)."""

    def __init__(self, group: Any, run: str, url: str) -> None:
        self.group, self.run, self.url = group, run, url.rstrip("/")
        self.store = group.store.store  # (the obstore store rooted at the group, under zarr's ObjectStore)
        self.lease = f".{run}{TMP_SUFFIX}"
        self._beat: threading.Thread | None = None
        self._stop = threading.Event()

    # -- requests, obstore's errors as builtin ones naming the object ------------------------------

    def _call(self, what: str, key: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self.store, *args, **kwargs)
        except BaseException as e:  # (obstore's panics are BaseExceptions)
            error = translate(e, f"{self.url}/{key}", what)
            if error is e:
                raise
        raise error

    def _list(self, prefix: str) -> list[dict[str, Any]]:
        import obstore

        return [o for page in self._call("listing", prefix, obstore.list, prefix=prefix) for o in page]

    def _get(self, key: str) -> bytes:
        import obstore

        return bytes(self._call("reading", key, obstore.get, key).bytes())

    def _put(self, key: str, data: bytes) -> None:
        import obstore

        self._call("writing the object (PUT)", key, obstore.put, key, data)

    def _delete(self, keys: list[str]) -> None:
        import obstore

        if keys:
            self._call("deleting objects", keys[0], obstore.delete, keys)

    # -- the lease ----------------------------------------------------------------------------------

    def temporary(self, name: str) -> str:
        """The temporary array's name for the array ``name``; the run's lease is taken on first use."""
        if self._beat is None:
            self._put(self.lease, _identity())
            self._stop.clear()
            self._beat = threading.Thread(
                target=_renew,
                args=(self.store, self.lease, _identity(), self._stop),
                name="npydask-stitch-lease",
                daemon=True,
            )
            self._beat.start()
        return temporary_name(name, self.run)

    def stop(self) -> None:
        """Give the lease up (once no temporary of this run is left)."""
        if self._beat is not None:
            self._stop.set()
            self._beat.join()
            self._beat = None
            with contextlib.suppress(Exception):
                self._delete([self.lease])

    # -- publishing ---------------------------------------------------------------------------------

    def complete(self, tmp: str, name: str) -> None:
        """Mark the temporary array ``tmp`` (all its chunks written) complete, as the array ``name``."""
        meta = self._meta(tmp)
        if meta is None:
            raise FileNotFoundError(
                f"{redact(self.url)}/{tmp}: this run's temporary array was removed by another Stitcher on the "
                f"same out, which took the run for dead (its lease is renewed every {BEAT_S:g} s and taken for "
                f"dead after {LEASE_S:g} s: was the process paused?); run it again"
            )
        meta.setdefault("attributes", {})[MARK] = {"name": name}
        self._put(f"{tmp}/zarr.json", json.dumps(meta, indent=2).encode())

    def publish(self, tmp: str, *, rolling: bool = False) -> bool:
        """Publish the complete temporary array ``tmp`` under its name (steps 2 to 6); whether it was.

        ``rolling``: a dead run's temporary, which another run may be
        publishing at the same time (a chunk gone meanwhile was copied by it).
        """
        meta = self._meta(tmp)
        keys = [o["path"] for o in self._list(tmp + "/")]
        mark = (meta or {}).get("attributes", {}).get(MARK)
        if meta is None or not isinstance(mark, dict) or not isinstance(mark.get("name"), str):
            if rolling:
                return False
            raise FileNotFoundError(f"{redact(self.url)}/{tmp}: the temporary array is not complete")
        name = mark["name"]
        chunks = sorted(k[len(tmp) + 1 :] for k in keys if k != f"{tmp}/zarr.json")
        if len(chunks) != _chunk_count(meta):
            if rolling:
                return False
            raise FileNotFoundError(
                f"{redact(self.url)}/{tmp}: the temporary array has {len(chunks)} of its {_chunk_count(meta)} "
                "chunks: another Stitcher on the same out removed it (was this process paused?); run it again"
            )
        del meta["attributes"][MARK]
        self._delete([f"{name}/zarr.json"])
        old = [o["path"] for o in self._list(name + "/")]

        def copy(chunk: str) -> None:
            try:
                _copy(self.store, f"{tmp}/{chunk}", f"{name}/{chunk}")
            except FileNotFoundError:
                if not rolling:
                    raise
            except BaseException as e:
                error = translate(e, f"{self.url}/{name}/{chunk}", "copying the object")
                if error is e:
                    raise
                raise error from None

        with ThreadPoolExecutor(_COPIERS) as pool:
            list(pool.map(copy, chunks))
        new = {f"{name}/{c}" for c in chunks}
        self._delete([k for k in old if k not in new and k != f"{name}/zarr.json"])
        self._put(f"{name}/zarr.json", json.dumps(meta, indent=2).encode())
        self.remove(tmp)
        return True

    def remove(self, tmp: str) -> None:
        """Delete the temporary array ``tmp``: its ``zarr.json`` first (what is left is never taken for complete)."""
        self._delete([f"{tmp}/zarr.json"])
        self._delete([o["path"] for o in self._list(tmp + "/")])

    def _gone(self, run: str) -> bool:
        """Whether the process of the run ``run`` is known to be gone (its lease read; see :func:`_gone`)."""
        try:
            return _gone(self._get(f".{run}{TMP_SUFFIX}"))
        except FileNotFoundError:
            return True

    def _meta(self, array: str) -> dict[str, Any] | None:
        try:
            meta = json.loads(self._get(f"{array}/zarr.json"))
        except FileNotFoundError:
            return None
        return meta if isinstance(meta, dict) else None

    # -- what dead runs left ------------------------------------------------------------------------

    def sweep(self) -> None:
        """Finish what dead runs published and delete the rest of what they left (see the module docs)."""
        import obstore

        self._put(self.lease, _identity())
        try:
            now = self._call("asking for its time", self.lease, obstore.head, self.lease)["last_modified"]
            found = self._call("listing", "", obstore.list_with_delimiter)
        finally:
            if self._beat is None:
                with contextlib.suppress(Exception):
                    self._delete([self.lease])
        leases: dict[str, datetime] = {}
        for o in found["objects"]:
            m = _LEASE.fullmatch(o["path"])
            if m and m.group(1) != self.run:
                leases[m.group(1)] = o["last_modified"]
        temps: dict[str, list[str]] = {}
        for p in found["common_prefixes"]:
            m = _TEMP.fullmatch(p.rstrip("/"))
            if m and m.group(1) != self.run:
                temps.setdefault(m.group(1), []).append(p.rstrip("/"))
        dead = [
            r
            for r in sorted(set(leases) | set(temps))
            if r not in leases or (now - leases[r]).total_seconds() > LEASE_S or self._gone(r)
        ]
        complete: dict[str, list[tuple[datetime, str]]] = {}
        for run in dead:
            for tmp in temps.get(run, []):
                meta = self._meta(tmp)
                mark = (meta or {}).get("attributes", {}).get(MARK)
                if isinstance(mark, dict) and isinstance(mark.get("name"), str):
                    when = self._call("asking for its time", tmp, obstore.head, f"{tmp}/zarr.json")
                    complete.setdefault(mark["name"], []).append((when["last_modified"], tmp))
        for name, runs in sorted(complete.items()):
            latest, tmp = max(runs)
            try:
                published = self._call("asking for its time", name, obstore.head, f"{name}/zarr.json")
            except FileNotFoundError:
                published = None
            if published is None or published["last_modified"] <= latest:  # (not replaced by a later run since)
                self.publish(tmp, rolling=True)
        for run in dead:
            for tmp in temps.get(run, []):
                self.remove(tmp)
            if run in leases:
                self._delete([f".{run}{TMP_SUFFIX}"])


def _renew(store: Any, lease: str, body: bytes, stop: threading.Event) -> None:
    """Write the lease again every :data:`BEAT_S` seconds until ``stop`` (a failed write is tried at the next beat)."""
    import obstore

    while not stop.wait(BEAT_S):
        with contextlib.suppress(Exception):
            obstore.put(store, lease, body)


def _identity() -> bytes:
    """A lease's body: this process's id, pid namespace and machine boot (empty where they cannot be read)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return b"{}"
    return json.dumps({"boot": boot, "pidns": namespace, "pid": os.getpid()}).encode()


def _gone(body: bytes) -> bool:
    """Whether a lease's process is known to be gone: same boot and pid namespace as this one, and no such pid.

    A pid that exists (even reused by another process) counts as alive: that
    run is then taken for dead only when its lease is stale.
    """
    try:
        them, me = json.loads(body), json.loads(_identity())
    except ValueError:
        return False
    pid = them.get("pid") if isinstance(them, dict) else None
    if not me or not isinstance(pid, int) or pid <= 0 or any(them.get(k) != me[k] for k in ("boot", "pidns")):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # (it exists, owned by another user)
    return False


def _chunk_count(meta: dict[str, Any]) -> int:
    """How many chunks an array of this ``zarr.json`` (a regular chunk grid) has."""
    try:
        chunks = meta["chunk_grid"]["configuration"]["chunk_shape"]
        return math.prod(math.ceil(s / c) for s, c in zip(meta["shape"], chunks))
    except (KeyError, TypeError, ZeroDivisionError):
        return -1
