"""The node cache: bytes of remote objects kept on a node's local disk, as plain values.

A wing below the object source: it knows entry keys (:mod:`.keys`), the byte runs held
(:mod:`.extents`), per-block checksums (:mod:`.checksum`), the file of one extent
(:mod:`.entry`) and the folder that holds them (:mod:`.folder`), and imports nothing of
the storage layer. ``import npydask`` does not import it.
"""
