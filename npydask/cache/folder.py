"""The cache folder: checked once, then used through an open directory descriptor.

Rules:

- The path must be absolute. A missing folder is created (its parents with the default mode)
  with mode 0700, whatever the umask.
- An existing path is used only when it is a directory, not a symlink (checked with ``lstat``
  and opened with ``O_DIRECTORY | O_NOFOLLOW``, so a swap between check and open is refused),
  owned by the calling user, with no group or other permission bits.
- A folder on a network or user-space file system (NFS, Lustre, GPFS, CIFS/SMB, Ceph, FUSE and
  the others in :data:`NETWORK_FILESYSTEMS`) is refused unless ``NPYDASK_CACHE_ALLOW_NETWORK_FS=1``:
  their locking and rename guarantees are not those of a local disk. The file system type is that
  of the longest mount point in ``/proc/self/mountinfo`` containing the folder; where that file
  cannot be read the check is skipped.
- Every refusal is a :class:`~npydask.errors.CacheFolderError` (an ``OSError``) naming the
  folder, why and what to do.

>>> parse_mountinfo("36 35 98:0 / /mnt/data rw,noatime master:1 - nfs4 srv:/x rw")
(('/mnt/data', 'nfs4'),)
"""

from __future__ import annotations

import os
import re
import stat

from ..errors import CacheFolderError

__all__ = ["NETWORK_FILESYSTEMS", "filesystem_type", "is_network_filesystem", "open_cache_folder", "parse_mountinfo"]

NETWORK_FILESYSTEMS: frozenset[str] = frozenset(
    {
        "nfs", "nfs4", "lustre", "gpfs", "cifs", "smb", "smb2", "smb3", "smbfs", "ceph", "glusterfs",
        "afs", "9p", "beegfs", "orangefs", "pvfs2", "ncpfs", "coda", "davfs", "fuse", "fuseblk",
    }
)  # fmt: skip

ALLOW_NETWORK_ENV = "NPYDASK_CACHE_ALLOW_NETWORK_FS"

_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> tuple[tuple[str, str], ...]:
    """The ``(mount point, file system type)`` of each line of ``/proc/self/mountinfo`` text, in order.

    Octal escapes in mount points (``\\040`` for a space) are decoded; malformed lines are skipped.

    Examples
    --------
    >>> parse_mountinfo("22 1 8:1 / / rw - ext4 /dev/sda1 rw\\n"
    ...                 "40 22 0:50 / /my\\\\040data rw shared:5 - fuse.sshfs h:/ rw\\n")
    (('/', 'ext4'), ('/my data', 'fuse.sshfs'))
    """
    out = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        sep = fields.index("-", 6)
        if len(fields) < 5 or sep + 1 >= len(fields):
            continue
        out.append((_unescape(fields[4]), fields[sep + 1]))
    return tuple(out)


def filesystem_type(path: str, mountinfo: str | None = None) -> str | None:
    """The file system type of the mount holding the absolute ``path``: its longest mount point.

    Parameters
    ----------
    path : str
        An absolute path, symlinks resolved.
    mountinfo : str, optional
        ``/proc/self/mountinfo`` text; default read from the system (``None`` when unreadable).

    Examples
    --------
    >>> text = "1 0 8:1 / / rw - ext4 a rw\\n2 1 0:5 / /data rw - nfs b rw\\n3 1 0:6 / /dat rw - xfs c rw"
    >>> filesystem_type("/data/cache", text), filesystem_type("/database", text), filesystem_type("/dat", text)
    ('nfs', 'ext4', 'xfs')
    """
    if mountinfo is None:
        try:
            with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
                mountinfo = f.read()
        except OSError:
            return None
    best: tuple[int, str] | None = None
    for point, fstype in parse_mountinfo(mountinfo):
        inside = path == point or point == "/" or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= best[0]):  # a later mount on one point hides earlier ones
            best = (len(point), fstype)
    return None if best is None else best[1]


def is_network_filesystem(fstype: str | None) -> bool:
    """Whether a file system type is a network or user-space one the cache refuses.

    Examples
    --------
    >>> is_network_filesystem("nfs4"), is_network_filesystem("fuse.s3fs"), is_network_filesystem("ext4")
    (True, True, False)
    """
    if fstype is None:
        return False
    return fstype in NETWORK_FILESYSTEMS or fstype.startswith(("fuse.", "nfs"))


def _refuse(path: str, why: str, todo: str) -> CacheFolderError:
    return CacheFolderError(f"cache folder {path!r} {why}: {todo}")


def open_cache_folder(path: str | os.PathLike[str], *, mountinfo: str | None = None) -> int:
    """Check the cache folder at ``path`` (creating it with mode 0700 if missing) and open it.

    Parameters
    ----------
    path : str or path-like
        An absolute path.
    mountinfo : str, optional
        ``/proc/self/mountinfo`` text to find the file system type in; default the system's.

    Returns
    -------
    int
        A directory descriptor (close-on-exec); the caller closes it.

    Raises
    ------
    CacheFolderError
        For a relative path, a symlink, a path that is not a directory, a folder of another
        user or with group or other permissions, or one on a network file system.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     fd = open_cache_folder(os.path.join(d, "cache"))
    ...     mode = stat.S_IMODE(os.fstat(fd).st_mode); os.close(fd)
    >>> oct(mode)
    '0o700'
    >>> try:
    ...     open_cache_folder("cache")
    ... except OSError as e:
    ...     print(type(e).__name__, str(e).split(": ")[0])
    CacheFolderError cache folder 'cache' is not an absolute path
    """
    path = os.fspath(path)
    if not os.path.isabs(path):
        raise _refuse(path, "is not an absolute path", "give an absolute folder, such as /tmp/npydask-cache")
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    created = False
    try:
        os.lstat(path)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path.rstrip("/")) or "/", exist_ok=True)
        try:
            os.mkdir(path, 0o700)
            created = True
        except FileExistsError:
            pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(path, "is a symlink", "name the real folder, or remove the link")
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, "is not a directory", "name a folder, or remove the file")
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise _refuse(path, f"could not be opened as a directory ({e.strerror})", "name a plain folder") from e
    try:
        st = os.fstat(fd)
        if created:
            os.fchmod(fd, 0o700)
            st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise _refuse(
                path,
                f"is owned by user {st.st_uid}, not by the calling user {os.geteuid()}",
                "give each user a folder of their own",
            )
        if st.st_mode & 0o077:
            raise _refuse(
                path,
                f"has mode {oct(stat.S_IMODE(st.st_mode))}, open to the group or others",
                f"run chmod 700 {path!r}, or give another folder",
            )
        fstype = filesystem_type(os.path.realpath(path), mountinfo)
        if is_network_filesystem(fstype) and os.environ.get(ALLOW_NETWORK_ENV, "") != "1":
            raise _refuse(
                path,
                f"is on a {fstype} file system, which the cache does not trust for locks and renames",
                f"give a folder on a local disk, or set {ALLOW_NETWORK_ENV}=1",
            )
    except BaseException:
        os.close(fd)
        raise
    return fd
