"""obstore's exceptions as builtin ones (npydask.storage._remote_errors): pure, with stand-ins of obstore's classes.

The real ones are raised against the SeaweedFS server in tests/storage/test_remote.py;
here every branch is checked with exceptions of the same names and module,
carrying text shaped as obstore's (a request dump with a presigned query).
"""

from __future__ import annotations

import errno

import pytest

from npydask.errors import FileChangedError
from npydask.storage._remote_errors import translate

URL = "https://host/bucket/key.npy?X-Amz-Signature=s1gn4tur3zz"
DUMP = (
    "Error performing GET https://host/bucket/key.npy?X-Amz-Signature=s1gn4tur3zz in 1ms - Server returned "
    'non-2xx status code: {status}: <?xml version="1.0"?><Error><Code>{code}</Code>{extra}</Error>\n'
    'Debug source: Generic {{ store: "S3", source: RetryError {{ retry_timeout: 180s }} }}'
)


def _obstore_error(name: str, text: str) -> BaseException:
    cls = type(name, (Exception,), {})
    cls.__module__ = "obstore.exceptions"
    return cls(text)


@pytest.mark.parametrize(
    ("name", "status", "code", "extra", "kind", "words"),
    [
        (
            "NotFoundError",
            "404 Not Found",
            "NoSuchKey",
            "",
            FileNotFoundError,
            ["no such object", "HTTP 404 NoSuchKey"],
        ),
        (
            "PermissionDeniedError",
            "403 Forbidden",
            "AccessDenied",
            "",
            PermissionError,
            ["access denied", "s3:ListBucket"],
        ),
        ("UnauthenticatedError", "401 Unauthorized", "InvalidToken", "", PermissionError, ["credentials"]),
        (
            "GenericError",
            "403 Forbidden",
            "SignatureDoesNotMatch",
            "",
            PermissionError,
            ["HTTP 403 SignatureDoesNotMatch"],
        ),
        (
            "PreconditionError",
            "412 Precondition Failed",
            "PreconditionFailed",
            "",
            FileChangedError,
            ["replaced", "ETag"],
        ),
        (
            "GenericError",
            "301 Moved Permanently",
            "PermanentRedirect",
            "<Region>eu-west-1</Region>",
            OSError,
            ["region", "eu-west-1"],
        ),
        ("GenericError", "400 Bad Request", "AuthorizationHeaderMalformed", "", OSError, ["region"]),
        ("GenericError", "500 Internal Server Error", "InternalError", "", OSError, ["HTTP 500 InternalError"]),
        ("AlreadyExistsError", "412 Precondition Failed", "x", "", FileExistsError, ["overwrite=True"]),
    ],
)
def test_status_codes(name: str, status: str, code: str, extra: str, kind: type, words: list[str]) -> None:
    err = translate(_obstore_error(name, DUMP.format(status=status, code=code, extra=extra)), URL, "reading its header")
    assert type(err) is kind or (kind is OSError and isinstance(err, OSError))
    text = str(err)
    for w in words:
        assert w in text, text
    assert "s1gn4tur3zz" not in text and "Debug source" not in text and "RetryError" not in text
    assert err.filename == "https://host/bucket/key.npy"  # type: ignore[attr-defined]
    assert err.__cause__ is None


def test_connection_refused_and_timeouts() -> None:
    refused = translate(
        _obstore_error(
            "GenericError",
            "Error performing GET http://127.0.0.1:1/b/k after 3 retries, "
            "retry_timeout: 45s - HTTP error: error sending request",
        ),
        URL,
        "reading",
    )
    assert isinstance(refused, ConnectionError) and "endpoint" in str(refused)
    slow = translate(
        _obstore_error("GenericError", "... retry_timeout: 45s - HTTP error: operation timed out"), URL, "reading"
    )
    assert isinstance(slow, TimeoutError) and slow.errno == errno.ETIMEDOUT
    reqwest = translate(
        _obstore_error(
            "GenericError",
            "... retry_timeout: 3s - HTTP error: error sending request\n"
            "inner: Http(HttpError { kind: Timeout, source: reqwest::Error { source: TimedOut } })",
        ),
        URL,
        "reading",
    )
    assert isinstance(reqwest, TimeoutError)
    builder = translate(
        _obstore_error("GenericError", "... retry_timeout: 180s - HTTP error: builder error"), URL, "listing"
    )
    assert type(builder) is OSError and "allow_http" in str(builder)


def test_obstore_not_found_is_a_builtin_with_a_dump() -> None:
    """obstore raises the builtin FileNotFoundError itself, with the request dump in it: it is replaced."""
    err = translate(FileNotFoundError(DUMP.format(status="404 Not Found", code="NoSuchKey", extra="")), URL, "reading")
    assert isinstance(err, FileNotFoundError) and "s1gn4tur3zz" not in str(err) and "no such object" in str(err)


def test_refused_keys_are_named() -> None:
    err = translate(
        ValueError('Could not parse path: Path "p/a//b.npy" contained empty path segment'),
        "s3://b/p/a//b.npy",
        "reading its header",
    )
    assert type(err) is ValueError and "'p/a//b.npy'" in str(err) and "rename" in str(err)


def test_other_exceptions_pass_unchanged() -> None:
    for e in (KeyError("x"), RuntimeError("forked"), FileChangedError(errno.ESTALE, "ours", "s3://b/k")):
        assert translate(e, URL, "reading") is e


# -- translated errors carry no reference to obstore's ------------------------------------------------

SECRET_URL = "https://ann:pa55w0rd@host/bucket/key.npy?X-Amz-Signature=s1gn4tur3zz"
SECRETS = (b"pa55w0rd", b"s1gn4tur3zz")
TEXTS = [
    (name, DUMP.format(status=status, code=code, extra=extra).replace("https://host", "https://ann:pa55w0rd@host"))
    for name, status, code, extra, _, _ in [
        ("NotFoundError", "404 Not Found", "NoSuchKey", "", None, None),
        ("PermissionDeniedError", "403 Forbidden", "AccessDenied", "", None, None),
        ("PreconditionError", "412 Precondition Failed", "PreconditionFailed", "", None, None),
        ("GenericError", "301 Moved Permanently", "PermanentRedirect", "<Region>eu-west-1</Region>", None, None),
        ("GenericError", "500 Internal Server Error", "InternalError", "", None, None),
        ("AlreadyExistsError", "412 Precondition Failed", "x", "", None, None),
    ]
] + [
    ("GenericError", "GET https://ann:pa55w0rd@host/k?X-Amz-Signature=s1gn4tur3zz - error sending request"),
    ("GenericError", "GET https://ann:pa55w0rd@host/k?X-Amz-Signature=s1gn4tur3zz - operation timed out"),
    ("GenericError", "PUT http://169.254.169.254/latest/api/token s1gn4tur3zz pa55w0rd - error sending request"),
    ("NotSupportedError", "Range request not supported by https://ann:pa55w0rd@host/k?X-Amz-Signature=s1gn4tur3zz"),
    ("GenericError", "Generic HTTP error: Requested 100..200, got 0..100 https://ann:pa55w0rd@host/?s1gn4tur3zz"),
    ("GenericError", "https://ann:pa55w0rd@host/?s1gn4tur3zz: request or response body error: IncompleteBody"),
    ("PanicException", "request valid: InvalidUri https://ann:pa55w0rd@host/?s1gn4tur3zz"),
]


@pytest.mark.parametrize(("name", "text"), TEXTS)
def test_translated_errors_pickle_without_the_secret(name: str, text: str) -> None:
    """What a worker sends (the error, with whatever it refers to) holds neither password nor signature."""
    import pickle

    from npydask.storage._remote_errors import call

    def request() -> None:
        raise _obstore_error(name, text)

    with pytest.raises(OSError, match="reading its header") as info:
        call(SECRET_URL, "reading its header", request)
    err = info.value
    assert err.__context__ is None and err.__cause__ is None
    sent = pickle.dumps([err, err.__context__, err.__cause__, err.args, err.__dict__])
    for secret in SECRETS:
        assert secret not in sent
    assert pickle.loads(pickle.dumps(err)).filename == "https://host/bucket/key.npy"


def test_panics_are_caught_at_the_boundary() -> None:
    from npydask.storage._remote_errors import call

    panic = type("PanicException", (BaseException,), {})

    def request() -> None:
        raise panic("request valid: InvalidUri(InvalidUriChar)")

    with pytest.raises(OSError, match="failed internally.*endpoint"):
        call(URL, "reading", request)
    with pytest.raises(KeyboardInterrupt):
        call(URL, "reading", lambda: (_ for _ in ()).throw(KeyboardInterrupt()))


def test_no_translation_is_raised_inside_its_except_block() -> None:
    """``raise translate(...) from None`` keeps obstore's error as ``__context__``: each site raises after the block."""
    import pathlib
    import re

    import npydask

    root = pathlib.Path(npydask.__file__).parent
    found = [
        f"{p.relative_to(root)}:{i + 1}"
        for p in root.rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines())
        if re.search(r"raise translate(_boto)?\(", line)
    ]
    assert found == []


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        (
            "NotSupportedError",
            "Operation not supported: Range request not supported by a.npy",
            "ignored the Range header and sent the whole object",
        ),
        (
            "GenericError",
            "Generic HTTP error: Requested 100..200, got 0..100",
            "sent bytes 0-99 for a request of bytes 100-199",
        ),
        (
            "GenericError",
            "Generic HTTP error: HTTP error: request or response body error ... IncompleteBody",
            "fewer bytes than its response promised",
        ),
        (
            "GenericError",
            "Error performing PUT http://169.254.169.254/latest/api/token - error sending request",
            "no credentials were found",
        ),
    ],
)
def test_what_the_server_did_is_said(name: str, text: str, words: str) -> None:
    err = translate(_obstore_error(name, text), URL, "reading a region")
    assert isinstance(err, OSError) and words in str(err), str(err)


def test_access_denied_says_which_process_needs_what() -> None:
    err = translate(
        _obstore_error("PermissionDeniedError", DUMP.format(status="403 Forbidden", code="AccessDenied", extra="")),
        URL,
        "reading its header",
    )
    text = str(err)
    for words in (
        "opens an array or dataset lists the prefix and reads every header",
        "compute it read",
        "writers write",
        "skip_signature",
        "this process",
    ):
        assert words in text, text
