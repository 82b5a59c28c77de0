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
