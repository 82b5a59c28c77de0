"""npydask's obstore store as a zarr v3 store, for :func:`npydask.to_zarr` to object-store URLs.

:class:`SpecObjectStore` is zarr's own ``zarr.storage.ObjectStore`` around
the store npydask builds for a :class:`~npydask.storage._stores.StoreSpec`
(:func:`~npydask.storage._stores.store_for`), so ``to_zarr`` takes the same
``storage_options`` dialect, remote settings (timeouts, retries) and fork
guard as every read. It pickles as its spec, not as an obstore store, and
finds the store again in whichever process unpickles it: once per process.

Imports zarr: import it only when zarr is wanted.
"""

from __future__ import annotations

from typing import Any

from zarr.storage import ObjectStore

from npydask.storage._stores import StoreSpec, store_for

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
