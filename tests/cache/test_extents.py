"""The extent map against a bytearray of flags: held runs, missing runs, coverage."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npydask.cache.extents import Extent, ExtentMap

N = 64
ranges = st.tuples(st.integers(0, N), st.integers(0, N)).map(sorted)


def _runs(flags, start, stop, value):
    out, k = [], start
    while k < stop:
        if flags[k] == value:
            j = k
            while j < stop and flags[j] == value:
                j += 1
            out.append(Extent(k, j))
            k = j
        else:
            k += 1
    return tuple(out)


@settings(max_examples=200, deadline=None)
@given(st.lists(ranges, max_size=12), st.lists(ranges, min_size=1, max_size=6))
def test_extent_map_matches_a_flag_oracle(adds, queries):
    m = ExtentMap()
    flags = bytearray(N)
    for a, b in adds:
        m.add(a, b)
        flags[a:b] = b"\x01" * (b - a)
    assert m.runs == _runs(flags, 0, N, 1)  # merged: disjoint, not touching, in order
    assert m.held == sum(flags)
    for a, b in queries:
        assert m.missing(a, b) == _runs(flags, a, b, 0)
        assert m.covers(a, b) == all(flags[a:b])


def test_adjacent_runs_merge_and_the_map_rebuilds_from_its_runs():
    m = ExtentMap()
    m.add(4, 8)
    m.add(0, 4)
    m.add(8, 9)
    assert m.runs == (Extent(0, 9),)
    assert ExtentMap(m.runs).runs == m.runs
    assert "Extent(start=0, stop=9)" in repr(m)


def test_bad_ranges_are_refused():
    with pytest.raises(ValueError, match="0 <= start <= stop"):
        ExtentMap().add(5, 3)
    with pytest.raises(ValueError, match="0 <= start <= stop"):
        ExtentMap().missing(-1, 3)
    with pytest.raises(ValueError, match="0 <= start < stop"):
        Extent(3, 3)
