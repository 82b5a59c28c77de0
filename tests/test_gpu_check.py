"""The device check's CPU side: ``ci/gpu_check.sh --dry-run``, its probes, and the kit's requirement checker.

The GPU machine runs ``ci/gpu_check.sh`` with wheels from ``ci/gpu_kit.sh``; neither can be
exercised for real without a GPU and the package index. What can rot is checked here: the
dry run (every stage's CPU part, numpy standing in for CuPy) exits 0 within OUTDIR's limits,
a failing stage or probe is reported as FAIL without stopping the others, and
``ci/wheel_requires.py`` refuses a wheel whose ``Requires-Dist`` the image and the kit do not
meet (hand-made wheels in a temporary folder; nothing is downloaded).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECK = os.path.join(ROOT, "ci", "gpu_check.sh")
OUTDIR_FILES = {"summary.txt", "env.txt", "pytest.log", "probes.log", "bench.json", "bench.log"}


def _load(name):
    spec = importlib.util.spec_from_file_location(f"ci_{name}", os.path.join(ROOT, "ci", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _run_check(outdir, *args, python=sys.executable):
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "PYTHONPATH")}
    env["PYTHON"] = python
    return subprocess.run(
        ["bash", CHECK, str(outdir), *args], env=env, capture_output=True, text=True, timeout=170, cwd=ROOT
    )


def test_dry_run_passes_every_stage_within_the_outdir_limits(tmp_path):
    out = tmp_path / "out"
    r = _run_check(out, "--dry-run")
    assert r.returncode == 0, r.stdout + r.stderr
    files = {p.name: p for p in out.iterdir()}
    assert set(files) <= OUTDIR_FILES and len(files) <= 6, sorted(files)
    assert all(p.is_file() and p.stat().st_size < 16 * 2**20 for p in files.values())
    for stage in ("env", "sanity", "pytest", "probes"):
        assert f"PASS {stage}: " in r.stdout, (stage, r.stdout)
    assert "PASS bench: " in r.stdout and "all exact (dry)" in r.stdout, r.stdout
    bench = json.loads((out / "bench.json").read_text())
    assert bench["all_exact"] is True and {row["group"] for row in bench["results"]} == {"big", "roi", "small", "swap"}
    summary = (out / "summary.txt").read_text()
    probes = _load("gpu_probes").PROBES
    for name in probes:  # every probe ran and passed, dry
        assert f"  probe PASS {name} (dry: numpy stands in for CuPy): " in summary, (name, summary)
    table = summary[summary.index("stage    result") :].splitlines()
    assert [line.split()[:2] for line in table[1:]] == [
        ["env", "PASS"],
        ["sanity", "PASS"],
        ["pytest", "PASS"],
        ["probes", "PASS"],
        ["bench", "PASS"],
    ]
    env = (out / "env.txt").read_text()
    assert "O_DIRECT on the work folder: " in env and "npydask describe(): " in env


def test_a_stage_that_fails_is_a_fail_line_and_exit_1_and_later_stages_still_run(tmp_path):
    r = _run_check(tmp_path / "out", "--dry-run", "--only", "env,sanity", python="false")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL env: exit 1: no result line (env.txt)" in r.stdout
    assert "FAIL sanity: " in r.stdout  # (a dry run never stops after sanity)


def test_unknown_stage_or_option_is_refused_with_the_known_ones(tmp_path):
    r = _run_check(tmp_path / "out", "--only", "nope")
    assert r.returncode == 2 and "unknown stage nope; stages: env sanity pytest probes bench" in r.stderr
    r = _run_check(tmp_path / "out", "--fast")
    assert r.returncode == 2 and "unknown option --fast" in r.stderr


def test_a_failing_probe_is_reported_and_the_others_still_run(tmp_path, capsys):
    probes = _load("gpu_probes")

    def broken(ctx):
        raise ValueError("wrong data")

    probes.PROBES["broken"] = broken
    ctx = probes.Context(str(tmp_path), dry=True, scale=1)
    try:
        failed, skipped = probes.run(["broken", "zero_d_and_empty"], ctx)
    finally:
        from npydask.gpu import device as gpu

        importlib.reload(gpu)  # the dry context patched npydask.gpu.device for numpy
    lines = capsys.readouterr().out.splitlines()
    assert (failed, skipped) == (1, 0)
    assert lines[0].startswith("FAIL broken (dry: numpy stands in for CuPy): ValueError: wrong data")
    assert lines[1].startswith("PASS zero_d_and_empty (dry: numpy stands in for CuPy): zero_d float64() equal")


# --------------------------------------------------------------------------
# ci/wheel_requires.py, on hand-made wheels.


def _wheel(folder, name, version, requires=(), requires_python=None):
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Python: {requires_python}"] if requires_python else []
    meta += [f"Requires-Dist: {r}" for r in requires]
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", "\n".join(meta) + "\n")
    return path


@pytest.fixture
def kit(tmp_path):
    image = tmp_path / "image.txt"
    image.write_text("numpy 2.5.2\ncupy-cuda13x[ctk] 14.2.0  # CuPy\ntoolz\n")
    wheels = tmp_path / "whl"
    wheels.mkdir()
    return image, wheels


def _requires(image, *paths, extra=()):
    return subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "ci", "wheel_requires.py"),
            "--image",
            str(image),
            *extra,
            *map(str, paths),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_wheel_requires_accepts_needs_met_by_the_image_and_the_kit(kit):
    image, wheels = kit
    _wheel(
        wheels,
        "kvikio-cu13",
        "26.10.0",
        [
            "cupy-cuda13x[ctk]!=14.1.0,>=14.0.1",
            "libkvikio-cu13==26.10.*",
            "numpy<3,>=2",
            "boto3; extra == 'test'",
            "zipp; python_version < '3.12'",
        ],
    )
    _wheel(wheels, "libkvikio-cu13", "26.10.0", ["toolz>=0.12"], requires_python=">=3.11")
    r = _requires(image, wheels)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "requirements: all met" in r.stdout and "total: 2 wheels" in r.stdout


@pytest.mark.parametrize(
    ("requires", "unmet"),
    [
        (["zict>=3"], "needs zict>=3: missing from the image and the kit"),
        (["numpy>=3"], "needs numpy>=3: image has 2.5.2"),
        (["libdemo==2.*"], "needs libdemo==2.*: libdemo-1.0-py3-none-any.whl has 1.0"),
        (
            ["cupy-cuda13x[ctk,extra2]"],
            "needs cupy-cuda13x[ctk,extra2]: the image's cupy-cuda13x is not listed with extra(s) extra2",
        ),
    ],
)
def test_wheel_requires_refuses_an_unmet_requires_dist_naming_it(kit, requires, unmet):
    image, wheels = kit
    _wheel(wheels, "libdemo", "1.0")
    _wheel(wheels, "demo", "1.0", requires)
    r = _requires(image, wheels)
    assert r.returncode == 1, r.stdout
    assert f"UNMET demo-1.0-py3-none-any.whl: {unmet}" in r.stdout, r.stdout
    assert "requirements: 1 unmet" in r.stdout


def test_wheel_requires_refuses_shadowing_the_image_duplicates_python_and_size(kit):
    image, wheels = kit
    _wheel(wheels, "numpy", "2.4.0")
    r = _requires(image, wheels)
    assert r.returncode == 1 and "the image already has numpy 2.5.2; a wheel of it would shadow it" in r.stdout
    other = kit[1].parent / "other"
    other.mkdir()
    a = _wheel(wheels, "demo", "1.0", requires_python=">=3.13")
    b = _wheel(other, "demo", "1.1")
    r = _requires(image, a, b)
    assert "Requires-Python >=3.13 excludes Python 3.12.3" in r.stdout
    assert "a second wheel of demo (also demo-1.0-py3-none-any.whl)" in r.stdout
    r = _requires(image, b, extra=["--max-mib", "0.0001"])
    assert r.returncode == 1 and "over the 0.0001 MiB limit" in r.stdout


def test_wheel_requires_waives_a_named_package_with_its_reason(kit):
    image, wheels = kit
    _wheel(wheels, "demo", "1.0", ["bokeh<3.10"])
    r = _requires(image, wheels, extra=["--waive", "bokeh=dashboard only"])
    assert r.returncode == 0, r.stdout
    assert (
        "WAIVED demo-1.0-py3-none-any.whl: needs bokeh<3.10: missing from the image and the kit"
        " (waived: dashboard only)"
    ) in r.stdout


TORCH_PROBES = "loader_torch_gpu,torch_fork_before_cuda,torch_patches_gpu"


def _without_torch(tmp_path):
    """An environment whose Pythons cannot see torch (as the GPU kit's: it installs none)."""
    site = tmp_path / "hide_torch"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None  # as if not installed\n")
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "PYTHONPATH")}
    return {**env, "PYTHONPATH": str(site), "PYTHON": sys.executable, "NPYD_PROBES": TORCH_PROBES}


def test_torch_probes_skip_where_torch_is_not_installed(tmp_path):
    """Without torch the torch probes print SKIP "skipped: torch is not installed" and the stage passes."""
    r = subprocess.run(
        ["bash", CHECK, str(tmp_path / "out"), "--dry-run", "--only", "probes"],
        env=_without_torch(tmp_path),
        capture_output=True,
        text=True,
        timeout=170,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS probes: 0 of 0 passed or XFAIL, 3 skipped (an optional package is not installed)" in r.stdout
    summary = (tmp_path / "out" / "summary.txt").read_text()
    for name in TORCH_PROBES.split(","):
        assert f"  probe SKIP {name} (dry: numpy stands in for CuPy): skipped: torch is not installed" in summary, (
            name,
            summary,
        )
    assert not [line for line in summary.splitlines() if line.split()[:2] in (["probe", "FAIL"], ["probes", "FAIL"])]
