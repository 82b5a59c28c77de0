"""The cache folder: created 0700, refused when unsafe or on a network file system."""

from __future__ import annotations

import os
import stat

import pytest

from npydask.cache.folder import filesystem_type, is_network_filesystem, open_cache_folder, parse_mountinfo
from npydask.errors import CacheFolderError

LOCAL = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"


def _mode(fd):
    return stat.S_IMODE(os.fstat(fd).st_mode)


@pytest.mark.parametrize("umask", [0o022, 0o000, 0o077])
def test_a_missing_folder_is_created_0700_whatever_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        fd = open_cache_folder(tmp_path / "a" / "cache", mountinfo=LOCAL)
    finally:
        os.umask(old)
    try:
        assert _mode(fd) == 0o700 and stat.S_IMODE(os.stat(tmp_path / "a" / "cache").st_mode) == 0o700
        assert os.get_inheritable(fd) is False
    finally:
        os.close(fd)
    fd = open_cache_folder(str(tmp_path / "a" / "cache"), mountinfo=LOCAL)  # an existing good one is used
    os.close(fd)


def _refused(path, match, mountinfo=LOCAL):
    with pytest.raises(CacheFolderError, match=match) as info:
        open_cache_folder(path, mountinfo=mountinfo)
    assert isinstance(info.value, OSError) and repr(str(path)) in str(info.value)


def test_a_relative_path_is_refused(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    _refused("cache", "not an absolute path.*give an absolute folder")
    assert not (tmp_path / "cache").exists()


def test_a_symlink_is_refused_even_to_a_good_folder(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    os.chmod(real, 0o700)
    (tmp_path / "link").symlink_to(real)
    _refused(str(tmp_path / "link"), "is a symlink.*remove the link")


def test_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    _refused(str(tmp_path / "f"), "is not a directory")


@pytest.mark.parametrize("mode", [0o770, 0o755, 0o701, 0o720])
def test_group_or_other_permissions_are_refused(tmp_path, mode):
    d = tmp_path / "c"
    d.mkdir()
    os.chmod(d, mode)
    _refused(str(d), f"has mode {oct(mode)}.*chmod 700")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown to another user needs root")
def test_another_owner_is_refused(tmp_path):
    d = tmp_path / "c"
    d.mkdir(mode=0o700)
    os.chmod(d, 0o700)
    os.chown(d, 65534, 65534)  # nobody
    _refused(str(d), "owned by user 65534, not by the calling user 0")


@pytest.mark.parametrize("fstype", ["nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "fuse", "fuse.sshfs", "ceph"])
def test_network_file_systems_are_refused_unless_allowed(tmp_path, monkeypatch, fstype):
    d = tmp_path / "c"
    mountinfo = LOCAL + f"40 22 0:50 / {os.path.realpath(tmp_path)} rw - {fstype} srv:/share rw\n"
    monkeypatch.delenv("NPYDASK_CACHE_ALLOW_NETWORK_FS", raising=False)
    _refused(str(d), f"is on a {fstype} file system.*NPYDASK_CACHE_ALLOW_NETWORK_FS=1", mountinfo)
    monkeypatch.setenv("NPYDASK_CACHE_ALLOW_NETWORK_FS", "1")
    os.close(open_cache_folder(d, mountinfo=mountinfo))


def test_the_systems_own_mountinfo_is_read(tmp_path):
    fstype = filesystem_type(os.path.realpath(tmp_path))
    assert fstype is None or isinstance(fstype, str)
    if not is_network_filesystem(fstype):
        os.close(open_cache_folder(tmp_path / "c"))


SAMPLE = r"""22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro
25 22 0:23 / /proc rw,nosuid shared:12 - proc proc rw
60 22 0:52 / /mnt/shared rw,relatime shared:30 - nfs4 server:/export rw,vers=4.2
61 60 0:53 / /mnt/shared/local rw,relatime shared:31 - xfs /dev/sdb1 rw
62 22 0:54 / /home/u/my\040files rw,nosuid,nodev shared:32 master:3 - fuse.sshfs u@h:/ rw,user_id=0
63 22 0:55 / /scratch rw - lustre 10.0.0.1@o2ib:/fs rw
64 22 0:56 / /scratch rw - tmpfs tmpfs rw
bad line
"""


def test_the_mountinfo_parser_and_the_longest_mount_point():
    assert parse_mountinfo(SAMPLE) == (
        ("/", "ext4"),
        ("/proc", "proc"),
        ("/mnt/shared", "nfs4"),
        ("/mnt/shared/local", "xfs"),
        ("/home/u/my files", "fuse.sshfs"),
        ("/scratch", "lustre"),
        ("/scratch", "tmpfs"),
    )
    assert filesystem_type("/mnt/shared/cache", SAMPLE) == "nfs4"
    assert filesystem_type("/mnt/shared/local/cache", SAMPLE) == "xfs"
    assert filesystem_type("/mnt/sharedx/cache", SAMPLE) == "ext4"
    assert filesystem_type("/home/u/my files/c", SAMPLE) == "fuse.sshfs"
    assert filesystem_type("/scratch/c", SAMPLE) == "tmpfs"  # the later mount on one point hides the earlier
    assert filesystem_type("/x", "") is None
    assert [is_network_filesystem(t) for t in ("nfs4", "xfs", "fuse.sshfs", "lustre", "tmpfs", None)] == [
        True,
        False,
        True,
        True,
        False,
        False,
    ]
