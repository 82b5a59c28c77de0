"""npydask.testing.drop_page_cache: one file's pages out of the page cache, the file's bytes unchanged."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np
import pytest

import npydask
from npydask.testing import drop_page_cache
from npydask.testing.page_cache import cached_pages


def test_drop_page_cache_makes_the_file_cold_and_keeps_its_bytes(tmp_path: Path) -> None:
    data = np.random.default_rng(3).random((256, 1024))  # 2 MiB
    path = tmp_path / "a.npy"
    np.save(path, data)
    mapped = npydask.from_npy(str(path), backend="mmap").compute()  # the handle cache now maps the file
    np.testing.assert_array_equal(mapped, data)
    del mapped
    fd = os.open(path, os.O_RDONLY)
    try:
        pages = -(-os.path.getsize(path) // mmap.PAGESIZE)
        assert cached_pages(fd) == pages  # (just written and read)
        cold = drop_page_cache(path)  # a PathLike, as every path argument takes
        assert isinstance(cold, bool)
        if not cold:
            assert cached_pages(fd) > 0
            pytest.skip("this file system keeps a file's pages in memory (tmpfs): nothing to drop")
        assert cached_pages(fd) == 0  # every page, not only the ones a probe would look at
        np.testing.assert_array_equal(npydask.read_region(str(path), (0, 0), data.shape), data)
        assert cached_pages(fd) > 0  # (and the count sees pages come back)
    finally:
        os.close(fd)


def test_drop_page_cache_of_an_empty_file_and_of_a_missing_one(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert drop_page_cache(str(empty)) is True
    with pytest.raises(FileNotFoundError):
        drop_page_cache(str(tmp_path / "missing.npy"))
