"""Pure parsing of the NPY and NPZ formats: bytes in, facts out, no I/O."""
