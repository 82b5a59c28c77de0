"""npydask's obstore store as a zarr v3 store, for :func:`npydask.to_zarr` to object-store URLs.

:class:`SpecObjectStore` is zarr's own ``zarr.storage.ObjectStore`` around
the store npydask builds for a :class:`~npydask.storage._stores.StoreSpec`
(:func:`~npydask.storage._stores.store_for`; the spec's base may hold a
path, ``s3://bucket/data/vol.zarr``, where the store is rooted, as an fsspec
URL roots zarr's), so ``to_zarr`` takes the same
``storage_options`` dialect, remote settings (timeouts, retries) and fork
guard as every read. It pickles as its spec, not as an obstore store, and
finds the store again in whichever process unpickles it: once per process.
obstore's errors from reads, writes and deletes become builtin ones naming
the object's URL (:func:`~npydask.storage._remote_errors.translate`): its
own messages embed request dumps.

Imports zarr: import it only when zarr is wanted.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

from zarr.storage import ObjectStore

from npydask.storage._remote_errors import translate
from npydask.storage._stores import StoreSpec, store_for

T = TypeVar("T")

__all__ = ["SpecObjectStore"]


class SpecObjectStore(ObjectStore):  # type: ignore[type-arg]
    """``zarr.storage.ObjectStore`` over npydask's store for ``spec`` (see the module docs).

    Examples
    --------
    >>> import pickle
    >>> s = SpecObjectStore(StoreSpec.of("s3://bucket", {"endpoint": "http://127.0.0.1:9000"}))
    >>> pickle.loads(pickle.dumps(s)) == s, str(s)
    (True, 'npydask+s3://bucket|endpoint=http://127.0.0.1:9000')
    """

    def __init__(self, spec: StoreSpec, *, read_only: bool = False) -> None:
        super().__init__(store_for(spec), read_only=read_only)
        self.spec = spec

    def with_read_only(self, read_only: bool = False) -> SpecObjectStore:
        """The same store with another ``read_only``."""
        return type(self)(self.spec, read_only=read_only)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SpecObjectStore) and (other.spec, other.read_only) == (self.spec, self.read_only)

    def __hash__(self) -> int:
        return hash((self.spec, self.read_only))

    def __str__(self) -> str:
        return f"npydask+{self.spec.public()}"

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec, "read_only": self.read_only}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["spec"], read_only=state["read_only"])  # type: ignore[misc]

    # -- obstore's errors as builtin ones ---------------------------------------------------------

    async def _guard(self, key: str, what: str, call: Awaitable[T]) -> T:
        try:
            return await call
        except BaseException as e:  # (obstore's panics are BaseExceptions)
            error = translate(e, f"{self.spec.base}/{key}", what)
            if error is e:
                raise
        raise error  # (outside the except block: it holds no reference to obstore's error)

    async def get(self, key: str, *args: Any, **kwargs: Any) -> Any:
        """zarr's ``get``; obstore's errors translated."""
        return await self._guard(key, "reading", super().get(key, *args, **kwargs))

    async def get_partial_values(self, prototype: Any, key_ranges: Iterable[tuple[str, Any]]) -> Any:
        """zarr's ``get_partial_values``; obstore's errors translated."""
        key_ranges = list(key_ranges)
        key = key_ranges[0][0] if key_ranges else ""
        return await self._guard(key, "reading", super().get_partial_values(prototype, key_ranges))

    async def exists(self, key: str) -> bool:
        """zarr's ``exists``; obstore's errors translated."""
        return await self._guard(key, "asking whether it exists", super().exists(key))

    async def set(self, key: str, value: Any) -> None:
        """zarr's ``set``; obstore's errors translated."""
        await self._guard(key, "writing the object (PUT)", super().set(key, value))

    async def set_if_not_exists(self, key: str, value: Any) -> None:
        """zarr's ``set_if_not_exists``; obstore's errors translated."""
        await self._guard(key, "writing the object (PUT)", super().set_if_not_exists(key, value))

    async def delete(self, key: str) -> None:
        """zarr's ``delete``; obstore's errors translated."""
        await self._guard(key, "deleting the object", super().delete(key))

    async def getsize(self, key: str) -> int:
        """zarr's ``getsize``; obstore's errors translated."""
        return await self._guard(key, "asking for its size", super().getsize(key))
