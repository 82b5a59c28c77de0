"""Local or network file system: the mount holding a file, from ``/proc/self/mountinfo`` keyed by ``st_dev``."""

from __future__ import annotations

import os

__all__ = ["fs_type", "is_local"]

_REMOTE = {
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "9p",
    "afs", "glusterfs", "fuse", "fuseblk", "orangefs", "pvfs2", "ocfs2", "gfs2", "davfs",
}  # fmt: skip

_fs_types: dict[int, str] = {}


def _load_mountinfo() -> None:
    try:
        with open("/proc/self/mountinfo", encoding="utf8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return
    for line in lines:
        parts = line.split(" - ", 1)
        fields = parts[0].split()
        if len(parts) != 2 or len(fields) < 3:
            continue
        try:
            major, minor = (int(x) for x in fields[2].split(":"))
        except ValueError:
            continue
        fstype = parts[1].split()[0] if parts[1].split() else ""
        _fs_types[os.makedev(major, minor)] = fstype


def fs_type(st: os.stat_result) -> str:
    """File system type name of the mount holding a file ('' if unknown)."""
    if st.st_dev not in _fs_types:
        _load_mountinfo()
        _fs_types.setdefault(st.st_dev, "")
    return _fs_types[st.st_dev]


def is_local(st: os.stat_result) -> bool:
    """Whether a file lives on a local file system (mapping it is safe and cheap)."""
    kind = fs_type(st)
    return kind.split(".", 1)[0] not in _REMOTE
