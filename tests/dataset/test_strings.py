"""Packed string columns round-trip any name a file system or store gives, sliced or gathered."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npydask.dataset._strings import Strings, encode, gather, pack, starts_of, unpack

_names = st.lists(
    st.one_of(
        st.text(st.characters(exclude_categories=("Cs",)), max_size=10),
        st.binary(max_size=10).map(os.fsdecode),  # non-UTF-8 bytes, as os.listdir gives them
    ),
    max_size=30,
)


@settings(max_examples=80, deadline=None)
@given(_names, st.data())
def test_pack_unpack_gather_round_trip(names, data):
    buf, ends = pack(names, "the name")
    assert [os.fsdecode(b) for b in [buf[a:b] for a, b in zip(starts_of(ends, 0).tolist(), ends.tolist())]] == names
    assert unpack(buf, starts_of(ends, 0), ends) == names
    idx = np.array(data.draw(st.lists(st.integers(0, max(0, len(names) - 1)), max_size=20)) if names else [], np.int64)
    packed, new_ends = gather(buf, starts_of(ends, 0)[idx], ends[idx])
    assert unpack(packed, starts_of(new_ends, 0), new_ends) == [names[i] for i in idx]
    values = [None if k % 3 == 0 else n for k, n in enumerate(names)]
    column = Strings.of(values, "the ETag")
    assert column.values(0, len(values)) == values
    a = data.draw(st.integers(0, len(values)))
    assert column[a:].values(0, len(values) - a) == values[a:]
    assert column[a:].take(np.arange(len(values) - a)).values(0, len(values) - a) == values[a:]


def test_encode_refuses_what_no_name_can_hold():
    assert encode(os.fsdecode(b"\xff.npy"), "the name") == b"\xff.npy"
    with pytest.raises(ValueError, match=r"the name '\\ud800x' cannot be stored: it holds '\\ud800'"):
        encode("\ud800x", "the name")
