"""The documentation site builds cleanly, and every ```python block of README.md and docs/ runs.

:func:`test_docs_site_builds_without_warnings` builds ``docs/`` with Sphinx, warnings as errors,
from scratch, fetching nothing. Each python block is one test (its id is the page and the line of
its fence). It runs as written, in a fresh namespace, with one temporary working directory shared
by every block, which holds the files the examples name (:func:`workdir`: ``scans/`` of 16 volumes
``patient_XX/ct.npy`` of 64x112x112 uint8, ``images/`` and ``labels/`` (``case_0.npy`` to
``case_2.npy``: 40x48x48 float32 images and uint8 labels with a box of ones, as the README writes
them), ``slices/``, ``slabs/``, ``days/``, ``runs/``, ``vol/``, ``stack/``, ``vol.npy``,
``volume.npy``, ``pair.npz``). A block may use, without defining them, the
names a reader brings from the prose around it (a block indented in a list item is dedented first)
(:data:`GIVEN`): ``np`` and ``npydask`` (imported),
``x`` (a lazy array over ``volume.npy``), ``ds`` (``open_dataset("scans/")``), ``images``
(``open_dataset("images/")``) and ``pairs`` (``zip_datasets`` of ``images`` and ``labels/``), ``a`` and ``b``
(small arrays), ``train_step`` (takes anything), ``labels`` (one per file of ``scans/``), ``rank`` 0
and ``world`` 1. A block with an ``if __name__ == "__main__":`` guard runs as the script it shows
(``__name__`` is ``"__main__"``); every other block's ``__name__`` is ``"readme"``.

A block that names ``s3://`` runs with one SeaweedFS server for the module (tests/conftest.py's
``s3_server``, on 127.0.0.1): its credentials and endpoint in the environment, a bucket named
``bucket`` holding ``scans/`` and ``stack/``, and ``http://127.0.0.1:8333`` in the block replaced by
the server's endpoint. A block that names ``npydask.ray`` or ``to_ray`` runs with one local Ray
instance for the module (2 CPUs, no dashboard; usage statistics off, tests/conftest.py).

Markers: an HTML comment on the line right before the fence.

- ``<!-- test: skip-gpu -->``: the block needs a CUDA device (CuPy with a GPU); it runs where CuPy
  sees one, and is skipped, saying so, elsewhere.
- ``<!-- test: skip-cluster -->``: the block names a cluster or host that does not exist here
  (``tcp://scheduler:8786``, ``http://minio:9000``); always skipped.

No block is skipped for any other reason: a missing server or extra fails the test.
:func:`test_skips_are_exactly_the_marked_blocks` counts the markers and checks each stands right
before a python block and names a known marker.
"""

from __future__ import annotations

import os
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
"""The README and every page of the documentation site."""
MARKERS = {"skip-gpu", "skip-cluster"}
ENDPOINT = "http://127.0.0.1:8333"
"""The endpoint README examples show; replaced by the test server's in the blocks that run."""
_MARKER = re.compile(r"^<!--\s*test:\s*(\S+)\s*-->$")
_SCRIPT = 'if __name__ == "__main__":'
"""A block written as a script (a cluster's workers spawn and import the main module) runs as ``__main__``."""


@dataclass(frozen=True)
class Block:
    """A ```python block of a page: its fence's line (1-based), code and marker (or ``None``)."""

    line: int
    code: str
    marker: str | None
    page: str = "README.md"

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def readme_blocks(text: str, page: str = "README.md") -> list[Block]:
    """Every ```python block of ``text``, with the marker on the line before its fence."""
    lines = text.splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            before = lines[i - 1].strip() if i else ""
            match = _MARKER.match(before)
            blocks.append(
                Block(
                    i + 1, textwrap.dedent("\n".join(lines[i + 1 : j]) + "\n"), match.group(1) if match else None, page
                )
            )
            i = j
        i += 1
    return blocks


BLOCKS = [b for p in PAGES for b in readme_blocks(p.read_text(encoding="utf-8"), p.relative_to(ROOT).as_posix())]


def _save(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, array)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """The files the README's examples name, small."""
    import dask.array as da

    root = tmp_path_factory.mktemp("readme")
    rng = np.random.default_rng(0)
    for i in range(16):
        _save(root / "scans" / f"patient_{i:02d}" / "ct.npy", rng.integers(0, 255, (64, 112, 112), dtype="u1"))
    for i in range(1, 13):
        _save(root / "slices" / f"slice_{i}.npy", np.full((4, 4), i, "f4"))
        _save(root / "slabs" / f"slab_{i}.npy", np.full((i % 3 + 1, 4), i, "f4"))
    for i in range(1, 13):  # (a time series named without zero padding, and runs in subfolders)
        _save(root / "days" / f"day_{i}.npy", np.full((4, 4), i, "f4"))
    cases = np.random.default_rng(1)
    for case in ("case_0", "case_1", "case_2"):  # (image and label pairs, as the README's patch example writes)
        label = np.zeros((40, 48, 48), "u1")
        label[10:18, 20:30, 5:15] = 1
        _save(root / "images" / f"{case}.npy", cases.normal(size=label.shape).astype("f4") + label)
        _save(root / "labels" / f"{case}.npy", label)
    for run in ("run_a", "run_b"):
        _save(root / "runs" / run / "0.npy", np.zeros((4, 4), "f4"))
    _save(root / "vol" / "0.npy", rng.random((20, 8), dtype="f4"))
    _save(root / "vol" / "1.npy", rng.random((12, 8), dtype="f4"))
    _save(root / "vol.npy", rng.random((16, 32, 32), dtype="f4"))
    _save(root / "volume.npy", rng.random((16, 64, 64), dtype="f4"))
    np.savez(root / "pair.npz", x=np.arange(6.0).reshape(2, 3), y=np.arange(4))
    da.to_npy_stack(str(root / "stack"), da.arange(24, chunks=8).reshape(6, 4).rechunk((2, 4)))
    return root


GIVEN = {
    "train_step": lambda *args, **kwargs: None,
    "labels": np.arange(16),
    "rank": 0,
    "world": 1,
}


def _namespace(code: str = "") -> dict:
    import npydask

    return {
        "__name__": "__main__" if _SCRIPT in code else "readme",
        "np": np,
        "npydask": npydask,
        "x": npydask.from_npy("volume.npy"),
        "ds": npydask.open_dataset("scans/"),
        "images": (images := npydask.open_dataset("images/")),
        "pairs": npydask.zip_datasets({"image": images, "label": npydask.open_dataset("labels/")}),
        "a": np.zeros((4, 4), "f4"),
        "b": np.ones((2, 3), "i2"),
        **GIVEN,
    }


@pytest.fixture(scope="module")
def s3_env(request, workdir):
    """The module's SeaweedFS server as the S3 blocks see it: ``bucket`` filled, environment to set."""
    server = request.getfixturevalue("s3_server")  # (only when a block needs it)
    client = server.boto3_client()
    server.make_bucket("bucket")
    for folder in ("scans", "stack"):
        for path in sorted((workdir / folder).rglob("*")):
            if path.is_file():
                client.put_object(Bucket="bucket", Key=path.relative_to(workdir).as_posix(), Body=path.read_bytes())
    return server.endpoint, server.env()


@pytest.fixture(scope="module")
def ray_instance():
    """One local Ray instance for the module (started only when a block needs it)."""
    import warnings

    import ray

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        import ray.data

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            ray.data.DataContext.get_current().enable_progress_bars = False
        yield ray
    finally:
        ray.shutdown()


def _has_gpu() -> bool:
    try:
        import cupy

        return bool(cupy.cuda.is_available())
    except Exception:  # (CuPy imports on machines without a driver, then fails in many ways)
        return False


@pytest.mark.parametrize("block", BLOCKS, ids=[b.where for b in BLOCKS])
def test_docs_block_runs(block, workdir, request, monkeypatch):
    if block.marker == "skip-cluster":
        pytest.skip(f"{block.where} names a cluster or host that does not exist here (marked)")
    if block.marker == "skip-gpu" and not _has_gpu():
        pytest.skip(f"{block.where} needs a CUDA device (marked)")
    code = block.code
    if "s3://" in code:
        endpoint, env = request.getfixturevalue("s3_env")
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        code = code.replace(ENDPOINT, endpoint)
    if "npydask.ray" in code or "to_ray(" in code:
        request.getfixturevalue("ray_instance")
    monkeypatch.chdir(workdir)
    exec(compile(code, block.where, "exec"), _namespace(code))  # noqa: S102 - the documentation's own code


def test_skips_are_exactly_the_marked_blocks():
    """Every marker names a known reason and stands right before a ```python fence; no other block skips."""
    n_markers = 0
    for path in PAGES:
        page = path.relative_to(ROOT).as_posix()
        lines = path.read_text(encoding="utf-8").splitlines()
        markers = [(i + 1, m.group(1)) for i, line in enumerate(lines) if (m := _MARKER.match(line.strip()))]
        n_markers += len(markers)
        for line, name in markers:
            assert name in MARKERS, f"{page}:{line}: unknown test marker {name!r}; known: {sorted(MARKERS)}"
            assert line < len(lines) and lines[line].strip() == "```python", (
                f"{page}:{line}: a test marker must stand on the line right before a ```python fence"
            )
    marked = [b for b in BLOCKS if b.marker is not None]
    assert len(marked) == n_markers
    assert len(BLOCKS) - len(marked) >= 10, "most examples run"


@pytest.mark.timeout(300)
def test_docs_site_builds_without_warnings(tmp_path):
    """``sphinx -E -W``: from scratch, any warning (a broken link, a malformed docstring table) fails.

    Optional parts the API reference documents (torch, xarray, Ray) must import, as CI installs them.
    """
    pytest.importorskip("sphinx", reason="the test extra installs Sphinx")
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-E",
            "-W",
            "--keep-going",
            "-q",
            "-b",
            "html",
            str(ROOT / "docs"),
            str(tmp_path / "html"),
        ],
        capture_output=True,
        text=True,
        timeout=280,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert (tmp_path / "html" / "api.html").is_file() and (tmp_path / "html" / "guide" / "many-files.html").is_file()
