"""xarray integration: the engine ``npy`` and :meth:`NpyDataset.to_xarray <npydask.NpyDataset.to_xarray>`.

Needs ``pip install 'npydask[xarray]'``; ``import npydask`` does not import
xarray (only this subpackage does).

>>> import numpy as np, xarray as xr, tempfile, os
>>> p = os.path.join(tempfile.mkdtemp(), "vol.npy"); np.save(p, np.arange(24.0).reshape(2, 3, 4))
>>> ds = xr.open_dataset(p, engine=NpyBackendEntrypoint, chunks={})
>>> ds["data"].dims, float(ds["data"].sum())
(('dim_0', 'dim_1', 'dim_2'), 276.0)

(Once npydask is installed, ``engine="npy"`` names the same entry point.)
"""

from __future__ import annotations

from npydask.xarray._array import NpyBackendArray
from npydask.xarray._open import dataset_to_xarray, open_npy
from npydask.xarray._plugin import NpyBackendEntrypoint

__all__ = ["NpyBackendArray", "NpyBackendEntrypoint", "dataset_to_xarray", "open_npy"]
