"""Doctests: where they write, and which are collected.

Doctests of modules whose optional dependency is missing are not collected:
``npydask.torch`` imports torch at the top (it is only ever imported
explicitly); where torch is not installed its doctests cannot run, and the
tests of the adapter skip in ``tests/test_torch.py``.

The examples call ``tempfile.mkdtemp()`` as a user would; under pytest those
folders land in the test's ``tmp_path``, which pytest prunes, instead of
piling up in the system's temporary folder run after run.
"""

from __future__ import annotations

import importlib.util
import tempfile

import pytest
from _pytest.doctest import DoctestItem

collect_ignore = [] if importlib.util.find_spec("torch") is not None else ["npydask/torch"]


@pytest.fixture(autouse=True)
def _doctest_temporary_folder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A doctest's ``tempfile.mkdtemp()`` makes its folder under the test's own ``tmp_path``."""
    if isinstance(request.node, DoctestItem):
        monkeypatch.setattr(tempfile, "tempdir", str(request.getfixturevalue("tmp_path")))
