"""open_dataset explains DALI reader arguments that live elsewhere in npydask (issue 13, item 9)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import npydask
from npydask.dataset.dali_args import DALI_ONLY

# Every keyword of DALI's fn.readers.numpy (DALI 2.x docs), and what open_dataset does with it.
DALI_READER_ARGUMENTS = [
    "bytes_per_sample_hint", "cache_header_information", "device", "dont_use_mmap", "enable_checkpointing",
    "file_filter", "file_list", "file_root", "files", "fill_value", "initial_fill", "lazy_init", "name",
    "num_shards", "out_of_bounds_policy", "pad_last_batch", "prefetch_queue_depth", "preserve", "random_shuffle",
    "read_ahead", "register_buffers", "rel_roi_end", "rel_roi_shape", "rel_roi_start", "roi_axes", "roi_end",
    "roi_shape", "roi_start", "seed", "shard_id", "shuffle_after_epoch", "shuffle_after_epoch_seed",
    "skip_cached_images", "stick_to_shard", "tensor_init_bytes", "use_o_direct",
]  # fmt: skip


@pytest.fixture
def folder(tmp_path):
    for i in range(4):
        np.save(tmp_path / f"{i}.npy", np.full((2,), i, "<f4"))
    return tmp_path


def test_every_dali_argument_is_taken_or_explained():
    import inspect

    taken = set(inspect.signature(npydask.open_dataset).parameters) - {"dali_only"}
    for name in DALI_READER_ARGUMENTS:
        assert (name in taken) != (name in DALI_ONLY), name
    assert set(DALI_ONLY) <= set(DALI_READER_ARGUMENTS)


@pytest.mark.parametrize(
    ("name", "where"),
    [
        ("random_shuffle", "Loader(ds, batch_size, shuffle=True"),
        ("shuffle_after_epoch", "shuffle=True"),
        ("stick_to_shard", "stick_to_shard="),
        ("pad_last_batch", "Loader(ds, batch_size, pad_last_batch=True)"),
        ("dont_use_mmap", 'backend="pread"'),
        ("use_o_direct", "direct_io=True"),
        ("prefetch_queue_depth", "prefetch=n"),
        ("seed", "seed="),
        ("cache_header_information", "index="),
        ("read_ahead", "not needed"),
    ],
)
def test_a_dali_argument_says_where_it_lives(folder, name, where):
    with pytest.raises(TypeError, match=rf"DALI reader argument {name}: {name}=True -> .*{re.escape(where)}"):
        npydask.open_dataset(folder, **{name: True})


def test_every_dali_argument_given_at_once_is_explained_in_one_error(folder):
    with pytest.raises(TypeError) as info:
        npydask.open_dataset(folder, **{name: 1 for name in DALI_ONLY})
    for name in DALI_ONLY:
        assert f"{name}=1 -> " in str(info.value)


def test_an_unknown_argument_keeps_pythons_message(folder):
    with pytest.raises(TypeError, match=r"^open_dataset\(\) got an unexpected keyword argument 'shufle'$"):
        npydask.open_dataset(folder, shufle=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        npydask.open_dataset(folder, random_shuffle=True, bogus=1)


def test_the_docs_map_every_dali_argument():
    import pathlib

    readme = (pathlib.Path(__file__).parents[2] / "docs" / "guide" / "many-files.md").read_text()
    table = readme.split("| DALI `fn.readers.numpy` | npydask |", 1)[1].split("\n\n", 1)[0]
    rows = [line.split(" | ")[0] for line in table.splitlines() if line.startswith("| `")]
    mapped = {name for row in rows for name in re.findall(r"`(\w+)`", row)}
    assert mapped == set(DALI_ONLY)
