"""The suite's hang guard, and doctests: where they write, and which are collected.

**Hang guard.** pytest-timeout limits each test, but not collection (a module that blocks on
import) nor what follows the last test: the plugins' session finish and the interpreter's exit,
which waits for every non-daemon thread (one left running, or a distributed cluster never closed). A
hang there would eat CI's whole time and print nothing. So ``faulthandler.dump_traceback_later``
is armed while collection runs (``COLLECTION_SECONDS``) and again from the session's finish
to the process's exit (``EXIT_SECONDS``): past it, every thread's traceback goes to the
terminal's stderr and the process exits with status 1. ``NPYDASK_HANG_GUARD_S`` sets both
(``tests/test_hang_guard.py`` sets 1 s); ``0`` turns the guard off.

Doctests of modules whose optional dependency is missing are not collected:
``npydask.torch`` imports torch at the top (it is only ever imported
explicitly); where torch is not installed its doctests cannot run, and the
tests of the adapter skip in ``tests/test_torch.py``.

The examples call ``tempfile.mkdtemp()`` as a user would; under pytest those
folders land in the test's ``tmp_path``, which pytest prunes, instead of
piling up in the system's temporary folder run after run.
"""

from __future__ import annotations

import faulthandler
import importlib.util
import os
import tempfile

import pytest
from _pytest.doctest import DoctestItem

collect_ignore = [] if importlib.util.find_spec("torch") is not None else ["npydask/torch"]

COLLECTION_SECONDS = 300.0
"""Collection of the whole suite takes well under a minute; an import that blocks fails after this."""
EXIT_SECONDS = 120.0
"""From the session's finish to the process's exit."""

_guard_fd: int | None = None


def _arm_hang_guard(default: float) -> None:
    seconds = float(os.environ.get("NPYDASK_HANG_GUARD_S", default))
    if seconds > 0 and _guard_fd is not None:
        faulthandler.dump_traceback_later(seconds, exit=True, file=_guard_fd)


def pytest_configure(config: pytest.Config) -> None:
    """Keep a descriptor of the real stderr: during collection pytest points descriptor 2 at a capture file."""
    global _guard_fd
    if _guard_fd is None:
        _guard_fd = os.dup(2)


@pytest.hookimpl(tryfirst=True)
def pytest_collection(session: pytest.Session) -> None:
    _arm_hang_guard(COLLECTION_SECONDS)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    faulthandler.cancel_dump_traceback_later()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Armed until the process ends: never cancelled, so the interpreter's exit is covered too."""
    _arm_hang_guard(EXIT_SECONDS)


@pytest.fixture(autouse=True)
def _doctest_temporary_folder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A doctest's ``tempfile.mkdtemp()`` makes its folder under the test's own ``tmp_path``."""
    if isinstance(request.node, DoctestItem):
        monkeypatch.setattr(tempfile, "tempdir", str(request.getfixturevalue("tmp_path")))
