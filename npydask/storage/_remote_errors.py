"""obstore's exceptions as builtin ones, with npydask's own text.

obstore's messages embed request dumps (and a presigned URL's query string,
or an endpoint's ``user:password``), so they are never chained or quoted
whole: the builtin error names the (redacted) URL, what npydask was doing,
the HTTP status and the store's error code where the response had them, and
what to do. A translated error holds no reference to obstore's exception
(neither ``__cause__`` nor ``__context__``: a worker pickles the error it
sends with them): :func:`call` builds it inside the ``except`` block and
raises it after the block ends. obstore's panics (``PanicException``, a
``BaseException``) are translated at the same boundary.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Callable
from typing import Any, TypeVar

from npydask.errors import FileChangedError
from npydask.storage.io_counts import record
from npydask.storage.urls import redact

__all__ = ["call", "error_for", "throttled", "translate", "unlistable_key"]

T = TypeVar("T")

_REFUSED = re.compile(r'Path "([^"]*)"')
_STATUS = re.compile(r"status code: (\d{3})")
_CODE = re.compile(r"<Code>([A-Za-z0-9.]{1,64})</Code>")
_REGION = re.compile(r"<Region>([A-Za-z0-9-]{1,64})</Region>")
_CONNECT = ("error sending request", "connection refused", "tcp connect", "dns error", "connection reset")
# (not "timeout": retry errors say "retry_timeout")
_TIMEOUT = ("timed out", "timedout", "kind: timeout", "deadline has elapsed")
_UNEXPECTED_RANGE = re.compile(r"Requested (\d+)\.\.(\d+), got (\d+)\.\.(\d+)")
_UNLISTABLE = re.compile(r'Error parsing Path "(.*)": Encountered illegal', re.DOTALL)
_SHORT_BODY = ("incompletebody", "unexpectedeof", "response body error", "body error")
_METADATA = (
    "169.254.169.254",
    "/latest/api/token",
    "/latest/meta-data",
    "metadata.google.internal",
    "/metadata/identity",
)
"""Credential endpoints obstore asks when it found no credentials in the options or the environment."""

RIGHTS = (
    "the process that opens an array or dataset lists the prefix and reads every header (List and Get "
    "rights: s3:ListBucket, s3:GetObject), the processes that compute it read (Get), and writers write "
    "(Put; s3:PutObject, s3:AbortMultipartUpload)"
)
"""Which process needs which rights: quoted by messages and the README."""


def _first(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line[:300]


def _facts(text: str) -> tuple[int | None, str | None]:
    """The HTTP status and the store's error code in an obstore message, where it has them."""
    status = _STATUS.search(text)
    code = _CODE.search(text)
    return (int(status.group(1)) if status else None), (code.group(1) if code else None)


def unlistable_key(e: BaseException) -> str | None:
    """The key in obstore's error for a listing it could not represent (a key with a control character), else ``None``.

    Examples
    --------
    >>> class InvalidPathError(Exception): pass
    >>> unlistable_key(InvalidPathError('Error parsing Path "p/a\\tb.txt": Encountered illegal character sequence'))
    'p/a\\tb.txt'
    """
    if type(e).__name__ != "InvalidPathError":
        return None
    found = _UNLISTABLE.search(str(e))
    return found.group(1) if found else None


def call(url: str, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, obstore's exceptions and panics raised as :func:`translate`'s, referring to none.

    Call it outside any ``except`` block, or the translated error's
    ``__context__`` is that block's exception.

    Examples
    --------
    >>> class NotFoundError(Exception): pass
    >>> NotFoundError.__module__ = "obstore.exceptions"
    >>> def get(): raise NotFoundError("GET https://h/k.npy?sig=s3cret: status code: 404")
    >>> try:
    ...     call("https://h/k.npy?sig=s3cret", "reading", get)
    ... except FileNotFoundError as e:
    ...     error = e
    >>> error.filename, error.__context__, error.__cause__
    ('https://h/k.npy', None, None)
    """
    try:
        return fn(*args, **kwargs)
    except BaseException as e:  # (obstore's panics are BaseExceptions)
        error = translate(e, url, what)
        if throttled(e, error):
            record(throttled=1)
        if error is e:
            raise
    raise error


def throttled(e: BaseException, error: BaseException) -> bool:
    """Whether obstore's ``e`` (translated to ``error``) is a request that finally failed with 503, ``SlowDown``
    or a timeout (after obstore's retries).

    Examples
    --------
    >>> class GenericError(Exception): pass
    >>> GenericError.__module__ = "obstore.exceptions"
    >>> e = GenericError("...status code: 503 Service Unavailable...<Code>SlowDown</Code>")
    >>> throttled(e, translate(e, "s3://b/k", "reading")), throttled(ValueError("x"), ValueError("x"))
    (True, False)
    """
    if isinstance(error, TimeoutError):
        return True
    if not (type(e).__module__ or "").startswith("obstore"):
        return False
    status, code = _facts(str(e))
    return status == 503 or code == "SlowDown"


def translate(e: BaseException, url: str, what: str) -> BaseException:
    """The builtin exception for obstore's ``e``, raised while ``what`` (``"reading bytes 0..4096"``) on ``url``.

    Exceptions that are not obstore's come back unchanged.

    Examples
    --------
    >>> class NotFoundError(Exception): pass
    >>> NotFoundError.__module__ = "obstore.exceptions"
    >>> err = translate(NotFoundError("...status code: 404 Not Found..."), "s3://b/k.npy?sig=x", "reading its header")
    >>> type(err).__name__, err.filename
    ('FileNotFoundError', 's3://b/k.npy?sig=x')
    """
    module = type(e).__module__ or ""
    if type(e).__name__ in ("PanicException", "RustPanic"):  # (a panic in a blocking call, in an async one)
        return OSError(
            errno.EIO,
            f"the object store client (obstore) failed internally (a panic) while {what}: check the URL and "
            "storage_options (an endpoint must be a URL without spaces, e.g. 'http://127.0.0.1:8333')",
            redact(url),
        )
    if type(e) is ValueError and "path" in str(e).lower():  # obstore refuses a key it cannot represent
        key = _REFUSED.search(str(e))
        shown_key = f"the key {key.group(1)[:300]!r}" if key else "a key"
        return ValueError(
            f"{redact(url)}: the object store client (obstore) refuses {shown_key} while {what}: "
            f"{_first(str(e))}; keys with empty segments ('a//b'), '.' or '..' segments cannot be read "
            "through it: rename the object"
        )
    if not module.startswith("obstore") and not isinstance(e, FileNotFoundError):
        return e  # (obstore raises the builtin FileNotFoundError for a missing object, with its request dump)
    name = "NotFoundError" if isinstance(e, FileNotFoundError) else type(e).__name__
    text = str(e)
    status, code = _facts(text)
    return error_for(url, what, name=name, status=status, code=code, text=text)


def error_for(
    url: str, what: str, *, name: str = "", status: int | None = None, code: str | None = None, text: str = ""
) -> OSError:
    """The builtin exception for a failed request: the client's error ``name``, HTTP ``status`` and store ``code``.

    ``text`` (the client's message, never shown) only helps tell timeouts,
    refused connections and region redirects apart. Shared by obstore's
    errors (:func:`translate`) and boto3's (:mod:`npydask.storage.s3_upload`).

    Examples
    --------
    >>> err = error_for("s3://b/k.npy", "uploading part 2", status=403, code="AccessDenied")
    >>> type(err).__name__, err.strerror.split(":")[0]
    ('PermissionError', 'access denied while uploading part 2 (HTTP 403 AccessDenied)')
    """
    shown = " ".join(x for x in (f"HTTP {status}" if status else None, code) if x)
    shown = f" ({shown})" if shown else ""
    where = redact(url)
    lower = text.lower()
    if name == "NotFoundError" or status == 404:
        return FileNotFoundError(errno.ENOENT, f"no such object while {what}{shown}", where)
    if any(s in lower for s in _METADATA):
        return PermissionError(
            errno.EACCES,
            f"no credentials were found while {what}: none in storage_options or this process's environment "
            "(e.g. AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY), and no cloud metadata service answered; give "
            f"credentials where each process can find them ({RIGHTS}), or for a public bucket pass "
            "storage_options={'skip_signature': True}",
            where,
        )
    if name in ("PermissionDeniedError", "UnauthenticatedError") or status in (401, 403):
        return PermissionError(
            errno.EACCES,
            f"access denied while {what}{shown}: check the credentials this process finds (storage_options, or "
            f"its environment, e.g. AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY): {RIGHTS}; for a public bucket pass "
            "storage_options={'skip_signature': True}; S3 also answers 403 for a missing key when the caller "
            "may not list the bucket (s3:ListBucket)",
            where,
        )
    if name == "AlreadyExistsError":
        return FileExistsError(errno.EEXIST, f"the object exists while {what}{shown}: pass overwrite=True", where)
    if name == "PreconditionError" or status == 412:
        return FileChangedError(
            errno.ESTALE,
            f"the object was replaced after it was opened (its ETag no longer matches) while {what}; "
            "open it again to read its new contents",
            where,
        )
    if status == 301 or code in (
        "PermanentRedirect",
        "AuthorizationHeaderMalformed",
        "IllegalLocationConstraintException",
    ):
        region = _REGION.search(text)
        hint = f" ('{region.group(1)}')" if region else ""
        return OSError(
            errno.EIO,
            f"the bucket is in another region{hint} while {what}{shown}: set storage_options={{'region': ...}} "
            "to the bucket's region",
            where,
        )
    if "builder error" in lower:
        return OSError(
            errno.EINVAL,
            f"the HTTP client refused the request while {what}: an http:// endpoint needs "
            "storage_options={'allow_http': True} (or AWS_ALLOW_HTTP=true in the environment)",
            where,
        )
    if name == "NotSupportedError" and "range request not supported" in lower:
        return OSError(
            errno.EOPNOTSUPP,
            f"the server ignored the Range header and sent the whole object (HTTP 200) while {what}: npydask "
            "reads byte ranges only; serve the file from a server that answers Range requests (HTTP 206)",
            where,
        )
    if name == "NotSupportedError":
        return OSError(errno.EOPNOTSUPP, f"the store does not support this while {what}", where)
    wrong = _UNEXPECTED_RANGE.search(text)
    if wrong is not None:
        lo, hi, got_lo, got_hi = (int(v) for v in wrong.groups())
        return OSError(
            errno.EIO,
            f"the server sent bytes {got_lo}-{got_hi - 1} for a request of bytes {lo}-{hi - 1} while {what} "
            "(a wrong Content-Range): the server or a proxy in between mishandles Range requests",
            where,
        )
    if status is None and any(s in lower for s in _TIMEOUT):
        return TimeoutError(
            errno.ETIMEDOUT,
            f"the store did not answer in time while {what}, after retries: is the endpoint reachable? "
            "(settings remote_timeout, remote_connect_timeout, remote_retries)",
            where,
        )
    if status is None and any(s in lower for s in _CONNECT):
        return ConnectionError(
            errno.ECONNREFUSED,
            f"could not reach the store while {what}, after retries: is the endpoint right and the server up? "
            "(storage_options 'endpoint'; settings remote_connect_timeout, remote_retries)",
            where,
        )
    if status is None and any(s in lower for s in _SHORT_BODY):
        return OSError(
            errno.EIO,
            f"the server sent fewer bytes than its response promised (the body ended early) while {what}, "
            "after retries: the connection was cut or the server mishandles Range requests",
            where,
        )
    return OSError(errno.EIO, f"the store failed while {what}{shown or f' ({name})'}", where)
