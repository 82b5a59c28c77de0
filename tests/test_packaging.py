"""The packaging configuration ships every module: a wheel install has the CLI and every subpackage.

These checks are offline and fast: they expand ``pyproject.toml`` with
setuptools' own reader (what ``pip wheel .`` uses) and compare the packages it
yields with the folders under ``npydask/``. ``ci/wheel_smoke.sh`` (run by
``.ci/run``) builds a real wheel and runs the command line from a fresh
virtual environment.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"


def _configuration() -> dict:
    # setuptools is in the test extra (Python 3.12's venv no longer brings it): this must not skip.
    from setuptools.config.pyprojecttoml import read_configuration

    return read_configuration(str(PYPROJECT), expand=True)  # "find" runs in the file's folder


def _source_packages() -> set[str]:
    """Every folder under npydask/ that holds Python modules, as a dotted package name."""
    found = set()
    for folder, dirs, names in os.walk(ROOT / "npydask"):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        if any(n.endswith(".py") for n in names):
            found.add(".".join(Path(folder).relative_to(ROOT).parts))
    return found


def test_every_subpackage_is_packaged():
    packages = set(_configuration()["tool"]["setuptools"]["packages"])
    source = _source_packages()
    assert {"npydask", "npydask.backends", "npydask.cli", "npydask.testing"} <= source
    missing = sorted(source - packages)
    assert not missing, f"pyproject.toml packages {sorted(packages)} leave out {missing}: a wheel would lack them"
    stray = sorted(p for p in packages if not p.startswith("npydask"))
    assert not stray, f"the wheel would install top-level packages {stray} (tests, benchmarks, ...)"


def test_every_package_folder_has_an_init():
    # A folder of modules without __init__.py is a namespace package: find_packages skips it.
    for name in _source_packages():
        init = ROOT.joinpath(*name.split("."), "__init__.py")
        assert init.is_file(), f"{init} is missing: setuptools would leave package {name} out of the wheel"


def test_scripts_and_package_data_point_into_the_wheel():
    config = _configuration()
    packages = set(config["tool"]["setuptools"]["packages"])
    for script, target in config["project"]["scripts"].items():
        module = target.partition(":")[0]
        assert module in packages or module.rpartition(".")[0] in packages, f"{script} -> {target}: not packaged"
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["npydask"]
    assert (ROOT / "npydask" / "py.typed").is_file()


def test_python_dash_m_npydask_runs_the_cli(tmp_path):
    p = tmp_path / "a.npy"
    data = np.arange(12, dtype="<i4").reshape(3, 4)
    np.save(p, data)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "npydask", "--help"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "usage: npydask" in done.stdout and "info" in done.stdout
    done = subprocess.run(
        [sys.executable, "-m", "npydask", "info", "a.npy", "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    (record,) = json.loads(done.stdout)["files"]
    assert (record["path"], record["shape"], record["dtype"]) == ("a.npy", list(data.shape), data.dtype.str)


def test_the_ray_extra_brings_what_iter_torch_batches_needs():
    """``pip install 'npydask[ray]'`` must run the README's example: ``iter_torch_batches`` imports pydantic."""
    import tomllib

    with open(PYPROJECT, "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    names = {re.split(r"[<>=\[; ]", requirement, maxsplit=1)[0] for requirement in extras["ray"]}
    assert {"ray", "pydantic"} <= names, extras["ray"]


def test_ray_usage_statistics_are_off_in_tests_and_ci():
    """Ray posts usage statistics to an outside host unless ``RAY_USAGE_STATS_ENABLED=0``."""
    assert os.environ.get("RAY_USAGE_STATS_ENABLED") == "0"  # (tests/conftest.py sets it before any Ray import)
    with open(ROOT / ".ci" / "run") as f:
        assert "export RAY_USAGE_STATS_ENABLED=0" in f.read()


def test_gpu_extras_bring_cupy_with_its_toolkit_for_cuda_12_and_13():
    """``npydask[gpu-cu12]``/``[gpu-cu13]``: CuPy 14+ with ``[ctk]`` (NVRTC) and kvikio; ``gpu`` is ``gpu-cu12``.

    CuPy 13 has no ``[ctk]`` extra: without a local CUDA toolkit it reads but runs no kernel, so the
    extras must not admit it (a resolve that needs numpy < 2 then fails instead of settling on it).
    """
    import tomllib

    from packaging.requirements import Requirement

    with open(PYPROJECT, "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    assert extras["gpu"] == ["npydask[gpu-cu12]"]  # an alias: pip follows a self-referencing extra
    for cuda, kvikio_since in (("12", "24.10"), ("13", "25.10")):  # (kvikio-cu13's first release is 25.10)
        needs = {r.name: r for r in map(Requirement, extras[f"gpu-cu{cuda}"])}
        assert set(needs) == {f"cupy-cuda{cuda}x", f"kvikio-cu{cuda}"}, extras[f"gpu-cu{cuda}"]
        cupy, kvikio = needs[f"cupy-cuda{cuda}x"], needs[f"kvikio-cu{cuda}"]
        assert cupy.extras == {"ctk"} and "14.0.0" in cupy.specifier and "13.6.0" not in cupy.specifier
        assert kvikio_since in kvikio.specifier and "26.10.0" in kvikio.specifier
    # setuptools (what pip wheel . uses) keeps the alias and the extras as written
    declared = _configuration()["project"]["optional-dependencies"]
    assert declared["gpu"] == ["npydask[gpu-cu12]"] and declared["gpu-cu13"] == extras["gpu-cu13"]


def test_license_is_an_spdx_expression_with_its_file_in_the_wheel():
    """``license = "BSD-3-Clause"`` and ``license-files``: the TOML-table form is deprecated by setuptools.

    setuptools 77 reads the SPDX form (the build requirement says so); the table form warns on every
    build and stops building after setuptools' deadline. The wheel's metadata then carries
    ``License-Expression`` and ships ``LICENSE`` (``ci/wheel_smoke.sh`` checks a real wheel).
    """
    import tomllib
    import warnings

    from packaging.requirements import Requirement
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    with open(PYPROJECT, "rb") as f:
        pyproject = tomllib.load(f)
    build = {r.name: r for r in map(Requirement, pyproject["build-system"]["requires"])}
    assert "76.0.0" not in build["setuptools"].specifier and "77.0.0" in build["setuptools"].specifier
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a SetuptoolsDeprecationWarning fails here, as it would fail a build one day
        dist = apply_configuration(Distribution(), str(PYPROJECT))
    assert dist.metadata.license_expression == "BSD-3-Clause"
    assert [os.path.basename(p) for p in dist.metadata.license_files] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("BSD 3-Clause License") and "Copyright (c) the npydask developers" in text
