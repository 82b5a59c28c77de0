"""Reading one file: its header, a region, or many boxes together.

:mod:`npydask.reader.region` holds :class:`FileRef`, what a lazy task
carries to reopen and read its file anywhere, with :func:`read_header` and
:func:`read_region`; :mod:`npydask.reader.boxes` reads many boxes of one
file together (:func:`read_boxes`: a sampler's patches) and the files of a
batch (:func:`read_boxes_many`).
"""

from npydask.reader.boxes import BoxesRead, FileBoxes, maps_boxes, read_boxes, read_boxes_many
from npydask.reader.region import (
    BACKENDS,
    FileRef,
    check_key,
    choose_backend,
    read_header,
    read_region,
    shared_facts,
)

__all__ = [
    "BACKENDS",
    "BoxesRead",
    "FileBoxes",
    "FileRef",
    "check_key",
    "choose_backend",
    "maps_boxes",
    "read_boxes",
    "read_boxes_many",
    "read_header",
    "read_region",
    "shared_facts",
]
