"""The suite's hang guard (root ``conftest.py``): a hang at collection or at exit ends with tracebacks and status 1.

pytest-timeout covers each test; these are the hangs outside any test. Each case runs pytest in a
subprocess on a tiny test file, with the guard loaded as the suite loads it (the root
``conftest.py``) and its limit cut to 3 s by ``NPYDASK_HANG_GUARD_S``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CASES = {
    # a non-daemon thread left running: the interpreter's exit waits for it forever
    "exit": (
        "import threading, time\n"
        "def test_leaves_a_thread_running():\n"
        "    threading.Thread(target=time.sleep, args=(100_000,), daemon=False).start()\n",
        "in _shutdown",
    ),
    # a module that blocks while it is imported: collection never ends
    "collection": (
        "import time\ntime.sleep(100_000)  # blocks the import\ndef test_never_collected():\n    pass\n",
        'test_hangs.py", line 2 in <module>',
    ),
}


@pytest.mark.parametrize("where", list(CASES))
def test_a_hang_outside_any_test_ends_with_tracebacks_and_status_1(tmp_path, where):
    source, frame = CASES[where]
    (tmp_path / "test_hangs.py").write_text(source)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # (not the project's settings: no doctests, no timeout)
    # (no plugins but the guard: a slow plugin at the terminal summary must not be what the guard catches)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NPYDASK_HANG_GUARD_S": "3", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    t0 = time.monotonic()
    # -p conftest: the project's root conftest.py, loaded as a plugin (the file under test is outside the project)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "conftest", "-q", "-p", "no:cacheprovider", "test_hangs.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - t0
    assert run.returncode == 1, (run.returncode, run.stdout, run.stderr)
    assert "Timeout (0:00:03)!" in run.stderr and frame in run.stderr, run.stderr
    assert elapsed < 60, elapsed
