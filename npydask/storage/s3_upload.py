"""S3 multipart uploads with boto3: the client a spec names, the four calls, and their errors.

obstore has no distributed multipart API (its multipart upload lives in one
process), so :func:`npydask.to_npy` to ``s3://`` drives S3's own protocol
from dask tasks with boto3: :func:`create_upload` in a first task,
:func:`upload_part` in each chunk task, :func:`complete_upload` in a last
task, :func:`abort_upload` on failure. S3 publishes the object only on
complete, so until then an existing object under the key is untouched.

The boto3 client is built from the same ``storage_options`` the obstore
store takes (:func:`client_kwargs`): ``endpoint`` (or ``aws_endpoint``,
``endpoint_url``), ``region`` (``aws_region``), ``access_key_id``,
``secret_access_key``, ``session_token`` (``token``, with or without the
``aws_`` prefix), ``skip_signature`` (unsigned requests),
``virtual_hosted_style_request`` and ``request_payer``; other keys are
obstore's alone and ignored here. Without credentials in
``storage_options`` boto3 looks in its own chain (the environment,
``~/.aws``, instance roles). One client per process and spec, with the
remote settings' timeouts, retries and ``remote_concurrency`` connections.

boto3's errors become builtin ``OSError`` subclasses naming the URL
(:func:`translate_boto`), with the S3 error code and HTTP status but never
the request, the credentials or boto3's own text.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from typing import Any

from npydask.errors import FileChangedError
from npydask.storage._remote_errors import error_for
from npydask.storage._stores import INSTALL, StoreSpec, check_not_forked
from npydask.storage.urls import redact, split_url

__all__ = [
    "abort_upload",
    "client_for",
    "client_kwargs",
    "complete_upload",
    "create_upload",
    "object_exists",
    "translate_boto",
    "upload_part",
]

_ALIASES = {
    "endpoint": ("endpoint", "aws_endpoint", "endpoint_url", "aws_endpoint_url"),
    "region": ("region", "aws_region", "aws_default_region"),
    "access_key_id": ("access_key_id", "aws_access_key_id"),
    "secret_access_key": ("secret_access_key", "aws_secret_access_key"),
    "session_token": ("session_token", "token", "aws_session_token", "aws_token"),
    "skip_signature": ("skip_signature", "aws_skip_signature"),
    "virtual_hosted_style_request": ("virtual_hosted_style_request", "aws_virtual_hosted_style_request"),
    "request_payer": ("request_payer", "aws_request_payer"),
}
"""The ``storage_options`` boto3 uses, each under the names obstore accepts for it."""

_lock = threading.Lock()
_clients: dict[tuple[int, StoreSpec], Any] = {}


def _truthy(value: Any) -> bool:
    return value is True or str(value).strip().lower() in ("1", "true", "yes", "on")


def _pick(spec: StoreSpec, name: str) -> Any:
    options = dict(spec.options)
    for alias in _ALIASES[name]:
        if options.get(alias) not in (None, ""):
            return options[alias]
    return None


def client_kwargs(spec: StoreSpec) -> dict[str, Any]:
    """The keyword arguments of ``boto3.client("s3", ...)`` for ``spec``, except ``config`` (pure).

    Examples
    --------
    >>> from npydask.storage._stores import StoreSpec
    >>> spec = StoreSpec.of("s3://b", {"endpoint": "http://127.0.0.1:9000", "region": "eu-west-1",
    ...                                "access_key_id": "AK", "secret_access_key": "SK"})
    >>> sorted(client_kwargs(spec).items())  # doctest: +NORMALIZE_WHITESPACE
    [('aws_access_key_id', 'AK'), ('aws_secret_access_key', 'SK'), ('endpoint_url', 'http://127.0.0.1:9000'),
     ('region_name', 'eu-west-1')]
    """
    out: dict[str, Any] = {}
    for name, arg in (
        ("endpoint", "endpoint_url"),
        ("region", "region_name"),
        ("access_key_id", "aws_access_key_id"),
        ("secret_access_key", "aws_secret_access_key"),
        ("session_token", "aws_session_token"),
    ):
        value = _pick(spec, name)
        if value is not None:
            out[arg] = str(value)
    return out


def _config(spec: StoreSpec) -> Any:
    from botocore import UNSIGNED
    from botocore.config import Config

    s = spec.settings
    if _truthy(_pick(spec, "virtual_hosted_style_request")):
        style = "virtual"
    else:  # (obstore's default is path style; AWS itself takes either)
        style = "path" if _pick(spec, "endpoint") is not None else "auto"
    extra: dict[str, Any] = {"signature_version": UNSIGNED} if _truthy(_pick(spec, "skip_signature")) else {}
    return Config(
        connect_timeout=s.connect_timeout,
        read_timeout=s.timeout,
        retries={"max_attempts": s.retries + 1, "mode": "standard"},
        max_pool_connections=s.concurrency,
        s3={"addressing_style": style},
        **extra,
    )


def client_for(spec: StoreSpec) -> Any:
    """The boto3 S3 client for ``spec`` in this process (built on first use; thread-safe, shared).

    Raises
    ------
    ImportError
        Without boto3, naming the ``remote`` extra.
    """
    check_not_forked(spec.base)
    key = (os.getpid(), spec)
    found = _clients.get(key)
    if found is not None:
        return found
    try:
        import boto3
    except ImportError as e:
        raise ImportError(f"to_npy to s3:// URLs uploads with boto3: {INSTALL}") from e
    with _lock:
        found = _clients.get(key)
        if found is None:
            session = boto3.session.Session()  # (a session of its own: the default one is not thread-safe)
            found = _clients[key] = session.client("s3", config=_config(spec), **client_kwargs(spec))
    return found


def _payer(spec: StoreSpec) -> dict[str, str]:
    return {"RequestPayer": "requester"} if _truthy(_pick(spec, "request_payer")) else {}


def translate_boto(e: BaseException, url: str, what: str) -> BaseException:
    """The builtin ``OSError`` for boto3's ``e`` (raised while ``what`` on ``url``); others come back unchanged.

    Examples
    --------
    >>> from botocore.exceptions import ClientError
    >>> e = ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"},
    ...                  "ResponseMetadata": {"HTTPStatusCode": 403}}, "UploadPart")
    >>> err = translate_boto(e, "s3://b/k.npy", "uploading part 1")
    >>> type(err).__name__, err.filename
    ('PermissionError', 's3://b/k.npy')
    """
    module = type(e).__module__ or ""
    if not module.startswith(("botocore", "boto3", "urllib3")):
        return e
    name = type(e).__name__
    response = getattr(e, "response", None)
    if isinstance(response, dict):
        error = response.get("Error") or {}
        code = str(error.get("Code") or "") or None
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        region = error.get("Region")
        if code == "NoSuchUpload":
            return OSError(
                errno.EIO,
                f"the multipart upload is gone while {what} (HTTP {status} NoSuchUpload): another part failed "
                "and aborted it, or a lifecycle rule removed it; compute the write again",
                redact(url),
            )
        if code in ("NoSuchKey", "NoSuchBucket"):
            status = 404
        return error_for(url, what, status=status, code=code, text=f"<Region>{region}</Region>" if region else "")
    if name in ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"):
        return PermissionError(
            errno.EACCES,
            f"no credentials were found while {what}: give the processes that write (the workers) "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in their environment (or a profile or role), or "
            "storage_options access_key_id/secret_access_key; writing needs Put rights (s3:PutObject, "
            "s3:AbortMultipartUpload)",
            redact(url),
        )
    if "Timeout" in name:
        return error_for(url, what, text="timed out")
    if "Connection" in name or "Endpoint" in name:
        return error_for(url, what, text="connection refused")
    return error_for(url, what, name=name)


def _call(spec: StoreSpec, url: str, what: str, method: str, **kwargs: Any) -> Any:
    bucket, key = spec.base.partition("://")[2], split_url(url).key
    try:
        return getattr(client_for(spec), method)(Bucket=bucket, Key=key, **_payer(spec), **kwargs)
    except Exception as e:
        error = translate_boto(e, url, what)
        if error is e:
            raise
    raise error  # (outside the except block: it holds no reference to boto3's error)


def object_exists(spec: StoreSpec, url: str) -> bool:
    """Whether the object ``url`` exists (one HEAD)."""
    try:
        _call(spec, url, "checking whether the target exists", "head_object")
    except FileNotFoundError:
        return False
    return True


def create_upload(spec: StoreSpec, url: str) -> str:
    """Start a multipart upload to ``url``; its upload id."""
    return str(_call(spec, url, "starting the multipart upload", "create_multipart_upload")["UploadId"])


def upload_part(spec: StoreSpec, url: str, upload_id: str, number: int, body: Any) -> str:
    """Upload part ``number`` (from 1) of the upload; its ETag."""
    found = _call(
        spec, url, f"uploading part {number}", "upload_part", UploadId=upload_id, PartNumber=number, Body=body
    )
    return str(found["ETag"])


def complete_upload(spec: StoreSpec, url: str, upload_id: str, etags: list[str], *, overwrite: bool) -> None:
    """Publish the object from its parts (``etags[i]`` is part ``i + 1``'s).

    With ``overwrite=False`` the request carries ``If-None-Match: *``, so a
    store that supports conditional writes (AWS S3 since 2024, SeaweedFS)
    refuses to replace an object that appeared meanwhile.

    Raises
    ------
    FileExistsError
        With ``overwrite=False`` when the object exists.
    """
    parts = {"Parts": [{"ETag": etag, "PartNumber": i + 1} for i, etag in enumerate(etags)]}
    extra = {} if overwrite else {"IfNoneMatch": "*"}
    try:
        _call(
            spec,
            url,
            "completing the multipart upload",
            "complete_multipart_upload",
            UploadId=upload_id,
            MultipartUpload=parts,
            **extra,
        )
    except FileChangedError as e:  # (HTTP 412: If-None-Match failed)
        raise FileExistsError(
            errno.EEXIST,
            "the target appeared while it was being written and overwrite=False: not replacing it; pass "
            "overwrite=True to replace it",
            e.filename,
        ) from None


def abort_upload(spec: StoreSpec, url: str, upload_id: str, attempts: int = 3) -> None:
    """Abort the upload (its parts are deleted); an upload already gone is fine.

    A part still in flight when the abort lands may be stored after it (AWS
    documents this), so the abort is repeated, up to ``attempts`` times, while
    ``ListParts`` still finds the upload.
    """
    for attempt in range(attempts):
        try:
            _call(spec, url, "aborting the multipart upload", "abort_multipart_upload", UploadId=upload_id)
            _call(spec, url, "checking the aborted upload", "list_parts", UploadId=upload_id)
        except OSError as e:
            if "NoSuchUpload" in str(e):
                return  # gone, parts and all
            raise
        time.sleep(0.2 * (attempt + 1))


def list_objects(spec: StoreSpec, url: str, prefix: str) -> list[dict[str, Any]]:
    """Every object under ``prefix`` through boto3, as obstore's ``ObjectMeta`` dicts (any key, unlike obstore).

    Raises
    ------
    ImportError
        Without boto3.
    OSError
        As :func:`translate_boto` translates the request's failure.
    """
    client = client_for(spec)
    bucket = spec.base.partition("://")[2]

    def pages() -> list[dict[str, Any]]:
        found = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, **_payer(spec)):
            for item in page.get("Contents", ()):
                found.append(
                    {
                        "path": item["Key"],
                        "size": int(item["Size"]),
                        "e_tag": item.get("ETag"),
                        "last_modified": item.get("LastModified"),
                    }
                )
        return found

    try:
        return pages()
    except Exception as e:
        error = translate_boto(e, url, "listing the prefix")
        if error is e:
            raise
    raise error
