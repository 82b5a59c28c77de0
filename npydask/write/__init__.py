"""Writing dask arrays to ``.npy`` files (local or object storage) and to zarr."""
