"""One object written by one PUT: the object-store :class:`~npydask.storage.base.Target`.

Blocks are buffered in memory at their offsets and sent as one body by
:meth:`ObjectTarget.finish` (``obstore.put``): an object store publishes a
PUT whole or not at all, so readers never see a partial object, and
:meth:`~ObjectTarget.abort` only drops the buffer. ``overwrite=False`` is
a create-only PUT (``mode="create"``: ``If-None-Match: *`` on S3, a
generation precondition on GCS, ``If-None-Match`` on Azure), so an object
that appears meanwhile is never replaced; a store without conditional
writes refuses it with an error saying so.
"""

from __future__ import annotations

import errno
from typing import Any

import numpy as np

from npydask.storage._remote_errors import translate
from npydask.storage.base import Target
from npydask.storage.object import ObjectSource
from npydask.storage.urls import redact

__all__ = ["SINGLE_PUT_BYTES", "ObjectTarget", "exists"]

SINGLE_PUT_BYTES = 4 << 30
"""Bodies up to this size go in one PUT (S3 takes up to 5 GiB); larger ones let obstore upload parts."""


class ObjectTarget(Target):
    """The object ``url`` of ``source``'s store, ``size`` bytes, written by blocks and sent in one PUT.

    Examples
    --------
    >>> from npydask.storage._stores import StoreSpec
    >>> from npydask.storage.object import source_for
    >>> t = ObjectTarget(source_for(StoreSpec.of("s3://bucket", {})), "s3://bucket/a.npy", 6)
    >>> t.write_block(3, b"def"); t.write_block(0, b"abc"); bytes(t._buffer)
    b'abcdef'
    >>> t.abort()  # nothing was sent
    """

    def __init__(self, source: ObjectSource, url: str, size: int, *, overwrite: bool = True) -> None:
        self.source = source
        self.url = url
        self.size = size
        self.overwrite = overwrite
        self._buffer: np.ndarray | None = np.empty(size, np.uint8)
        self._written = 0

    def write_block(self, offset: int, data: Any) -> None:
        """Copy the bytes of ``data`` into the buffer at ``offset``."""
        if self._buffer is None:
            raise ValueError(f"{redact(self.url)}: the target was already finished or aborted")
        view = memoryview(data).cast("B")
        if offset < 0 or offset + len(view) > self.size:
            raise ValueError(
                f"{redact(self.url)}: a block of {len(view)} bytes at offset {offset} does not fit in the "
                f"object's {self.size} bytes"
            )
        self._buffer[offset : offset + len(view)] = np.frombuffer(view, np.uint8)
        self._written += len(view)

    def finish(self) -> None:
        """Send the object in one PUT (create-only with ``overwrite=False``); the buffer is dropped either way.

        Raises
        ------
        OSError
            ``EIO`` if the blocks written do not add up to the size (nothing
            is sent); the PUT's errors as builtin ones naming the URL:
            ``FileExistsError`` for an existing object with
            ``overwrite=False``, ``EOPNOTSUPP`` where the store has no
            create-only PUT, ``PermissionError``, ``FileNotFoundError`` (no
            such bucket), ...
        """
        buffer, written = self._buffer, self._written
        self.abort()
        if buffer is None:
            raise ValueError(f"{redact(self.url)}: the target was already finished or aborted")
        if written != self.size:
            raise OSError(
                errno.EIO,
                f"expected {self.size} bytes written before the PUT, found {written}: blocks are missing; "
                "not sending a partial object",
                redact(self.url),
            )
        from npydask.storage._stores import import_obstore

        obstore = import_obstore()
        mode = "overwrite" if self.overwrite else "create"
        store, key = self.source.store(self.url), self.source.key(self.url)
        try:
            obstore.put(store, key, buffer, mode=mode, use_multipart=self.size > SINGLE_PUT_BYTES)
            return
        except BaseException as e:  # (obstore's panics are BaseExceptions)
            error: BaseException
            if type(e).__name__ == "NotSupportedError" and not self.overwrite:
                error = OSError(
                    errno.EOPNOTSUPP,
                    "this store has no create-only PUT (conditional writes), which overwrite=False needs to "
                    "never replace an object that appears meanwhile: pass overwrite=True (for S3-compatible "
                    "stores that support If-None-Match, storage_options={'conditional_put': 'etag'})",
                    redact(self.url),
                )
            else:
                error = translate(e, self.url, "writing the object (PUT)")
                if error is e:
                    raise
        raise error  # (outside the except block: it holds no reference to obstore's error)

    def abort(self) -> None:
        """Drop the buffer; nothing was sent, so the object is as it was."""
        self._buffer = None
        self._written = 0


def exists(source: ObjectSource, url: str) -> bool:
    """Whether the object ``url`` exists now (one HEAD)."""
    try:
        source.identity(url)
    except FileNotFoundError:
        return False
    return True
