"""The node cache: bytes of remote objects kept on a node's local disk, shared by its processes.

A wing below the object source: it knows entry keys (:mod:`.keys`), the byte runs held
(:mod:`.extents`), per-block checksums (:mod:`.checksum`), the file of one extent
(:mod:`.entry`), the folder that holds them (:mod:`.folder`), its shared state (:mod:`.ledger`),
kernel locks (:mod:`.locks`) and the cache at work (:mod:`.node`), and imports nothing of the
storage layer. ``import npydask`` imports only :mod:`.spec` (for :class:`npydask.Cache`).
"""
