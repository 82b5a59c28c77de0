"""Where bytes come from: one small interface (:mod:`npydask.storage.base`) and its sources.

Readers, the dataset scan and the writer reach files through this package
only; local files live in :mod:`npydask.storage.local` (with the private
handle cache :mod:`~npydask.storage._handles` and the tight small-file loops
:mod:`~npydask.storage._batch`).
"""
