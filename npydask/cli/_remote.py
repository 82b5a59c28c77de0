"""Object-store URLs on the command line: ``--storage-option``, and whether a URL names an object or a prefix.

Credentials come from the environment (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``GOOGLE_APPLICATION_CREDENTIALS``,
``AZURE_STORAGE_ACCOUNT_KEY``, ...), which obstore reads; the command line
takes only non-secret store options, ``--storage-option KEY=VALUE``
(repeatable: ``endpoint``, ``region``, ``skip_signature``, ...): a command
line is visible to every user of the machine in its process list, so keys
that hold secrets are refused there. URLs are shown without query strings
(presigned and SAS URLs carry credentials in them).

A URL names a prefix (a "folder") when it ends with ``/``, or when no object
has that key (one HEAD request tells); it names an object when its last part
matches the file filter or ends in ``.npy`` or ``.npz``. ``http(s)://`` URLs
always name one object (plain HTTP servers have no listing).
"""

from __future__ import annotations

import fnmatch
import re
import zipfile
from typing import Any

from npydask.cli._errors import UsageError
from npydask.storage.urls import is_url, redact, split_url

__all__ = ["add_storage_option", "is_prefix", "npz_members_at", "storage_options", "url_or_none"]

_SECRET = re.compile(r"secret|token|password|passwd|sas|account_key|access_key$|credential|signature_key", re.I)
"""Keys whose values are credentials: refused on the command line (``access_key_id`` and ``skip_signature`` pass)."""


def add_storage_option(parser: Any) -> None:
    """``--storage-option KEY=VALUE`` (repeatable)."""
    parser.add_argument(
        "--storage-option",
        dest="storage_option",
        action="append",
        metavar="KEY=VALUE",
        help="an object-store option for URLs (repeatable), e.g. endpoint=http://127.0.0.1:8333 region=us-east-1 "
        "skip_signature=true; true/false are booleans. Credentials are read from the environment "
        "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, ...), never from the command line",
    )


def storage_options(args: Any) -> dict[str, Any] | None:
    """The ``--storage-option`` pairs as a dict (``None`` when none was given); ``true``/``false`` become bools.

    Raises
    ------
    UsageError
        A pair without ``=``, an empty key, a key given twice, or a key that holds a secret.

    Examples
    --------
    >>> import argparse
    >>> storage_options(argparse.Namespace(storage_option=["region=eu-west-1", "skip_signature=TRUE"]))
    {'region': 'eu-west-1', 'skip_signature': True}
    """
    pairs = getattr(args, "storage_option", None)
    if not pairs:
        return None
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--storage-option {key or pair!r}: expected KEY=VALUE, e.g. region=us-east-1")
        if _SECRET.search(key):
            raise UsageError(
                f"--storage-option {key}=...: credentials do not belong on the command line (any user sees it in "
                "the process list); set them in the environment instead, e.g. AWS_SECRET_ACCESS_KEY, "
                "AWS_SESSION_TOKEN, AZURE_STORAGE_ACCOUNT_KEY or GOOGLE_APPLICATION_CREDENTIALS"
            )
        if key in out:
            raise UsageError(f"--storage-option {key} was given twice; give each key once")
        out[key] = {"true": True, "false": False}.get(value.lower(), value)
    return out


def url_or_none(path: str) -> str | None:
    """``path`` if it is an object URL, else ``None``; an unknown scheme is a :class:`UsageError`."""
    try:
        return path if is_url(path) else None
    except ValueError as e:
        raise UsageError(str(e)) from None


def is_prefix(url: str, file_filter: str, options: dict[str, Any] | None) -> bool:
    """Whether ``url`` names a prefix to list rather than one object (see the module docs).

    Raises
    ------
    UsageError
        ``storage_options`` the store refuses.
    OSError
        The store could not be asked (denied, unreachable), naming the URL.
    """
    parsed = split_url(url)
    if parsed.kind == "http":
        return False
    if url.endswith("/") or not parsed.key:
        return True
    name = parsed.key.rpartition("/")[2]
    if fnmatch.fnmatchcase(name, file_filter) or name.endswith((".npy", ".npz")):
        return False
    try:
        source_of(url, options).identity(url)  # one HEAD: an object with this key?
    except FileNotFoundError:
        return True
    return False


def source_of(url: str, options: dict[str, Any] | None) -> Any:
    """The source that reads ``url`` (``storage_options`` the store refuses: a :class:`UsageError`)."""
    from npydask.storage.where import resolve

    try:
        return resolve(url, options).source
    except (ValueError, TypeError) as e:
        raise UsageError(str(e)) from None


def npz_members_at(url: str, options: dict[str, Any] | None) -> list[str]:
    """The member names of the ``.npz`` object ``url`` (its zip directory read by range), in archive order.

    Raises
    ------
    UsageError
        Not a readable zip archive, or no member.
    """
    from npydask.format.npz import RangeFile

    source = source_of(url, options)
    read, size = source.range_read(url)
    try:
        with zipfile.ZipFile(RangeFile(read, size)) as zf:
            names = [n[: -len(".npy")] if n.endswith(".npy") else n for n in zf.namelist()]
    except (zipfile.BadZipFile, EOFError, ValueError) as e:
        raise UsageError(f"{redact(url)}: not a readable .npz archive ({e})") from None
    if not names:
        raise UsageError(f"{redact(url)}: the archive holds no arrays")
    return names
