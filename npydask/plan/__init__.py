"""Pure planning: boxes, ROIs, byte runs, chunks, read strategy, grouping and sampling; no I/O, no dask graph."""
