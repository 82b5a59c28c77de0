"""The install-hint registry: every extra it names exists, and each hint names its extra."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from npydask.errors import OPTIONAL_DEPENDENCIES, install_hint, missing

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def test_every_extra_the_registry_names_is_declared():
    with open(PYPROJECT, "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    for name, dep in OPTIONAL_DEPENDENCIES.items():
        if dep.extra:
            assert dep.extra in extras, name
            assert f"npydask[{dep.extra}]" in dep.hint, name
        assert dep.hint.startswith("pip install "), name


def test_messages_name_what_needs_the_dependency_and_the_hint():
    assert missing("xarray", "NpyDataset.to_xarray") == (
        "NpyDataset.to_xarray needs xarray, which is not installed: pip install 'npydask[xarray]'"
    )
    assert install_hint("obstore") == install_hint("boto3") == "pip install 'npydask[remote]'"
    with pytest.raises(KeyError):
        install_hint("numpy")
