"""Where bytes come from: one small interface (:mod:`npydask.storage.base`) and its sources.

Readers, the dataset scan and the writer reach files through this package
only, and tell local paths from URLs in one place (:mod:`~npydask.storage.where`):

* local files: :mod:`~npydask.storage.local` (with the private handle cache
  :mod:`~npydask.storage._handles`, file identities in
  :mod:`~npydask.storage.identity` and the tight small-file loops
  :mod:`~npydask.storage._batch`);
* objects in S3, GCS, Azure and HTTP servers: :mod:`~npydask.storage.object`
  through obstore (prefixes listed in :mod:`~npydask.storage.object_list`; its stores, request pool and fork guard in
  :mod:`~npydask.storage._stores`, its errors translated in
  :mod:`~npydask.storage._remote_errors`; writes in
  :mod:`~npydask.storage.object_write` and :mod:`~npydask.storage.s3_upload`);
* many spans of one file read into one buffer (the boxes of :mod:`npydask.plan.patch_runs`):
  :mod:`~npydask.storage.spans`;
* pure pieces both share: URL parsing (:mod:`~npydask.storage.urls`) and
  header reading through a ``read(offset, n)`` (:mod:`~npydask.storage._headers`).
"""

from __future__ import annotations

from npydask.storage._batch import Scanned, read_files
from npydask.storage._handles import (
    OpenFile,
    acquire,
    cache_limit,
    clear_cache,
    nofile_soft,
    open_regular,
    pread_exact,
    reader,
    scan_file,
)
from npydask.storage._lease import truncation_blocked
from npydask.storage._local_read import (
    DIRECT_ALIGNMENT,
    FdReader,
    ScratchSpans,
    aligned_empty,
    pages_cached,
    read_fd,
    read_grid,
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
from npydask.storage._mounts import fs_type, is_local
from npydask.storage._remote_errors import translate
from npydask.storage._runs import RangeReader, pread_strategy, read_plan
from npydask.storage._stores import StoreSpec, import_obstore, run_each, run_on
from npydask.storage.identity import (
    CTIME_MARGIN_NS,
    FileIdentity,
    HeaderCheck,
    InodeIdentity,
    ObjectIdentity,
    check_unchanged,
    differs,
    file_changed,
    header_mismatch,
    listing_began_ns,
)

__all__ = [
    "CTIME_MARGIN_NS",
    "DIRECT_ALIGNMENT",
    "FdReader",
    "FileIdentity",
    "HeaderCheck",
    "InodeIdentity",
    "NAME_MAX",
    "ObjectIdentity",
    "OpenFile",
    "RangeReader",
    "Scanned",
    "ScratchSpans",
    "StoreSpec",
    "TMP_SUFFIX",
    "acquire",
    "aligned_empty",
    "cache_limit",
    "check_inside",
    "check_unchanged",
    "clear_cache",
    "differs",
    "exists_error",
    "file_changed",
    "fs_type",
    "fsync_folder",
    "header_mismatch",
    "listing_began_ns",
    "import_obstore",
    "is_local",
    "new_run",
    "nofile_soft",
    "open_regular",
    "pages_cached",
    "pread_exact",
    "pread_strategy",
    "publish",
    "pwrite_all",
    "read_fd",
    "read_files",
    "read_grid",
    "read_plan",
    "read_scratch_spans",
    "reader",
    "remove_quietly",
    "run_each",
    "run_on",
    "scan_file",
    "scratch_spans",
    "temporary_name",
    "translate",
    "truncation_blocked",
]
