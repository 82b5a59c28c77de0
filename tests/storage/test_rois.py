"""The grouped ROI loop reads what numpy slices, and refuses files that are not the planned ones."""

from __future__ import annotations

import os

import numpy as np
import pytest

import npydask
from npydask.config import read_options
from npydask.errors import FileChangedError, NpyFormatError
from npydask.plan.region import Box, plan_read
from npydask.storage import FileIdentity, HeaderCheck, InodeIdentity
from npydask.storage._rois import read_rois

_BOX = Box((1, 2, 3), (5, 9, 40))
_CUT = tuple(slice(a, b) for a, b in zip(_BOX.start, _BOX.stop))


def _files(tmp_path, n=4, shape=(6, 10, 48), dtype="<f4"):
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(shape).astype(dtype) for _ in range(n)]
    paths = []
    for i, a in enumerate(arrays):
        p = str(tmp_path / f"v{i}.npy")
        np.save(p, a)
        paths.append(p)
    return paths, arrays


def _jobs(paths, identities, check=None, strategy=None):
    header = npydask.read_header(paths[0])
    plan = plan_read(header, _BOX)
    options = read_options(roi_strategy=strategy)
    dests = [np.empty(plan.nbytes, np.uint8) for _ in paths]
    jobs = [(p, ident, plan, d, options, check) for p, ident, d in zip(paths, identities, dests)]
    return jobs, [d.view(header.dtype).reshape(plan.shape) for d in dests]


@pytest.mark.parametrize("strategy", [None, "spans", "runs"])
def test_reads_each_files_roi(tmp_path, strategy):
    paths, arrays = _files(tmp_path)
    jobs, got = _jobs(paths, [FileIdentity.of(os.stat(p)) for p in paths], strategy=strategy)
    read_rois(jobs)
    for g, a in zip(got, arrays):
        np.testing.assert_array_equal(g, a[_CUT])


def test_inode_identities_with_a_header_check(tmp_path):
    paths, arrays = _files(tmp_path)
    header = npydask.read_header(paths[0])
    with open(paths[0], "rb") as f:
        check = HeaderCheck(f.read(header.data_offset), "the first file's header", "open it with headers='all'")
    inodes = [InodeIdentity(os.stat(p).st_ino) for p in paths]
    jobs, got = _jobs(paths, inodes, check)
    read_rois(jobs)
    for g, a in zip(got, arrays):
        np.testing.assert_array_equal(g, a[_CUT])
    # cut short past the ROI: the ROI itself reads, the missing payload is still reported
    os.truncate(paths[2], os.path.getsize(paths[2]) - 4)
    with pytest.raises(NpyFormatError, match=r"v2\.npy: truncated"):
        read_rois(_jobs(paths, inodes, check)[0])
    np.save(paths[2], arrays[2].astype("<f8")[:, :, :24])  # same bytes per row, another header, same inode
    with pytest.raises(NpyFormatError, match=r"v2\.npy.*first file's header"):
        read_rois(_jobs(paths, inodes, check)[0])


def test_a_file_changed_since_planning_is_refused(tmp_path):
    paths, arrays = _files(tmp_path)
    identities = [FileIdentity.of(os.stat(p)) for p in paths]
    np.save(paths[1], arrays[1] + 1)  # same size and inode, a later mtime
    os.utime(paths[1], ns=(1, 1))
    with pytest.raises(FileChangedError, match=r"mtime_ns .*v1\.npy"):
        read_rois(_jobs(paths, identities)[0])
    os.remove(paths[3])
    with pytest.raises(FileNotFoundError, match=r"v3\.npy"):
        read_rois(_jobs(paths, identities)[0][3:])


def test_a_folder_in_place_of_a_file_is_refused(tmp_path):
    paths, _ = _files(tmp_path, n=2)
    identities = [FileIdentity.of(os.stat(p)) for p in paths]
    os.remove(paths[1])
    os.mkdir(paths[1])
    with pytest.raises(FileChangedError, match=r"v1\.npy"):
        read_rois(_jobs(paths, identities)[0])


def test_the_prepared_spans_read_is_the_spans_strategy(tmp_path):
    """``scratch_spans`` prepares only what read_fd would read as spans through one scratch; both agree."""
    from npydask.storage import read_fd, read_scratch_spans, scratch_spans

    paths, arrays = _files(tmp_path, n=1)
    plan = plan_read(npydask.read_header(paths[0]), _BOX)
    assert scratch_spans(plan, read_options(roi_strategy="runs")) is None
    assert scratch_spans(plan, read_options(direct_io=True)) is None
    whole = plan_read(npydask.read_header(paths[0]), Box((1, 0, 0), (3, 10, 48)))  # one run: read in place
    assert scratch_spans(whole, read_options()) is None
    spans = scratch_spans(plan, read_options(roi_strategy="spans"))
    assert spans is not None and spans.grid.shape[-1] == plan.run_nbytes  # (rows cut out of the spans)
    fd = os.open(paths[0], os.O_RDONLY)
    try:
        got, ref = np.empty(plan.nbytes, np.uint8), np.empty(plan.nbytes, np.uint8)
        read_scratch_spans(fd, paths[0], spans, got)
        read_fd(fd, paths[0], plan, read_options(roi_strategy="spans"), ref)
    finally:
        os.close(fd)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(got.view("<f4").reshape(plan.shape), arrays[0][_CUT])


def test_a_header_check_from_elsewhere_is_compared_with_each_file(tmp_path):
    """Whole identities with a check (an index's header): a file holding other header bytes is refused."""
    paths, arrays = _files(tmp_path, n=3)
    np.save(paths[1], arrays[1].astype(">f4"))  # same size and layout, another byte order
    header = npydask.read_header(paths[0])
    with open(paths[0], "rb") as f:
        check = HeaderCheck(f.read(header.data_offset), "the header index 'i.json'", "delete 'i.json'")
    identities = [FileIdentity.of(os.stat(p)) for p in paths]
    jobs, got = _jobs(paths, identities, check)
    with pytest.raises(NpyFormatError, match=r"v1\.npy.*the header index 'i\.json'"):
        read_rois(jobs)
    np.testing.assert_array_equal(got[0], arrays[0][_CUT])
