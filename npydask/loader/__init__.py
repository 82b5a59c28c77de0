"""The training loader: DALI-style batches from an :class:`~npydask.dataset.npy_dataset.NpyDataset`.

Which batches an epoch holds is planned purely in :mod:`npydask.plan.sampling`
(shuffle, shards, padding); this package fetches them. A batch is read by
one call that reads its files back to back (the tight per-file loop of a
stacked task): in up to ``prefetch`` threads of this process, or as tasks
on a ``dask.distributed`` client's workers, where the files are read and
the batch is gathered once. Batches come out in plan order.

With ``sampler=`` (:mod:`npydask.samplers`) each sample is a box of a file:
the epoch's positions are dealt to shards in global batches
(:class:`~npydask.samplers.schedule.Schedule`), each batch's boxes are read
by :func:`~npydask.samplers.read_patches` (each file once), and
:meth:`Loader.stats` sums what the reads cost.

Resuming: the loader counts the batches it has *yielded* in the current
epoch; :meth:`Loader.state_dict` records that count with the epoch, and a
loader given it with :meth:`Loader.load_state_dict` yields exactly the
remaining batches of that epoch, then goes on with the next. The state also
records a fingerprint of the dataset (:func:`dataset_fingerprint`), so a
state is refused by a loader over other files, even of the same number, or
over the same files read otherwise (another ROI, ``.npz`` key or fill value).
"""

from npydask.loader.core import Loader
from npydask.loader.fetch import check_process, read_batch
from npydask.loader.fingerprint import dataset_fingerprint, warn_if_resharded

__all__ = ["Loader", "check_process", "dataset_fingerprint", "read_batch", "warn_if_resharded"]
