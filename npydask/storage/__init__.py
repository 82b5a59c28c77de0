"""Where bytes come from: one small interface (:mod:`npydask.storage.base`) and its sources.

Readers, the dataset scan and the writer reach files through this package
only, and tell local paths from URLs in one place (:mod:`~npydask.storage.where`):

* local files: :mod:`~npydask.storage.local` (with the private handle cache
  :mod:`~npydask.storage._handles` and the tight small-file loops
  :mod:`~npydask.storage._batch`);
* objects in S3, GCS, Azure and HTTP servers: :mod:`~npydask.storage.object`
  through obstore (prefixes listed in :mod:`~npydask.storage.object_list`; its stores, request pool and fork guard in
  :mod:`~npydask.storage._stores`, its errors translated in
  :mod:`~npydask.storage._remote_errors`; writes in
  :mod:`~npydask.storage._object_write` and :mod:`~npydask.storage._s3_upload`);
* pure pieces both share: URL parsing (:mod:`~npydask.storage.urls`) and
  header reading through a ``read(offset, n)`` (:mod:`~npydask.storage._headers`).
"""

from __future__ import annotations

from npydask.storage._local_read import (
    DIRECT_ALIGNMENT,
    FdReader,
    ScratchSpans,
    aligned_empty,
    read_fd,
    read_grid,
    read_local,
    read_scratch_spans,
    scratch_spans,
)
from npydask.storage._local_write import (
    NAME_MAX,
    TMP_SUFFIX,
    check_inside,
    exists_error,
    fsync_folder,
    new_run,
    publish,
    pwrite_all,
    remove_quietly,
    temporary_name,
)
from npydask.storage._runs import RangeReader, pread_strategy, read_plan

__all__ = [
    "DIRECT_ALIGNMENT",
    "FdReader",
    "NAME_MAX",
    "RangeReader",
    "ScratchSpans",
    "TMP_SUFFIX",
    "aligned_empty",
    "check_inside",
    "exists_error",
    "fsync_folder",
    "new_run",
    "pread_strategy",
    "publish",
    "pwrite_all",
    "read_fd",
    "read_grid",
    "read_local",
    "read_plan",
    "read_scratch_spans",
    "remove_quietly",
    "scratch_spans",
    "temporary_name",
]
