"""The Loader and the PyTorch adapters over object storage: fork refused clearly (never a hang), spawn reads right.

obstore is not fork-safe: a child forked from a process that used it hangs on its first request.
Each case runs in a subprocess under a timeout, so a hang fails the test instead of the suite.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

N = 12
SHAPE = (3, 4)
HANG = 150  # seconds: far beyond any of these reads, far below the suite's patience


@pytest.fixture(scope="module")
def objects(s3):
    space = s3.space()
    arrays = [np.arange(12, dtype="<f4").reshape(SHAPE) + 100 * i for i in range(N)]
    for i, a in enumerate(arrays):
        s3.put_npy(f"{space}/data/{i:02d}.npy", a)
    return f"s3://{space}/data", arrays


def run_script(tmp_path, body: str, options: dict, root: str) -> subprocess.CompletedProcess:
    """Run ``body`` in a fresh interpreter with ``ROOT`` and ``OPTIONS`` defined; fail on a hang."""
    script = tmp_path / "case.py"
    script.write_text(
        "import json, sys\nimport numpy as np\nimport npydask\n"
        f"ROOT = {root!r}\nOPTIONS = json.loads({json.dumps(options)!r})\n" + textwrap.dedent(body)
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.Popen(  # (its own process group: a hung case's forked children are killed with it)
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=HANG)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the case hung for {HANG} s (a forked child touched obstore?): {err[-2000:]!r}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # (children it left behind)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _fork_refused(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 3, result.stdout + result.stderr
    message = result.stdout
    assert "forked" in message and "spawn" in message and "forkserver" in message, message
    assert "s3://" in message and "secret" not in message.lower().replace("secret_access_key", ""), message


TORCH_FORK = """
import torch
from npydask.torch import NpyIterableDataset, NpyMapDataset
ds = npydask.open_dataset(ROOT, storage_options=OPTIONS)
adapter = {kind}(ds)
loader = torch.utils.data.DataLoader(adapter, batch_size=4, num_workers=2, multiprocessing_context="fork")
try:
    list(loader)
except RuntimeError as e:
    print(e)
    sys.exit(3)
print("no error")
"""


@pytest.mark.parametrize("kind", ["NpyIterableDataset", "NpyMapDataset"])
@pytest.mark.timeout(HANG + 30)
def test_a_forked_dataloader_worker_raises_naming_spawn_and_forkserver(objects, s3, tmp_path, kind):
    pytest.importorskip("torch")
    root, _ = objects
    _fork_refused(run_script(tmp_path, TORCH_FORK.format(kind=kind), s3.options, root))


LOADER_FORK = """
import multiprocessing as mp
ds = npydask.open_dataset(ROOT, storage_options=OPTIONS)
list(npydask.Loader(ds, 4, prefetch={prefetch}))  # the parent reads: obstore is in use here

def child(q):
    try:
        list(npydask.Loader(ds, 4, prefetch={prefetch}))
        q.put("no error")
    except RuntimeError as e:
        q.put(str(e))

q = mp.get_context("fork").Queue()
p = mp.get_context("fork").Process(target=child, args=(q,))
p.start()
message = q.get(timeout=60)
p.join(30)
print(message)
sys.exit(3 if message != "no error" else 0)
"""


@pytest.mark.parametrize("prefetch", [0, 2])
@pytest.mark.timeout(HANG + 30)
def test_a_loader_in_a_forked_child_raises_naming_spawn_and_forkserver(objects, s3, tmp_path, prefetch):
    root, _ = objects
    _fork_refused(run_script(tmp_path, LOADER_FORK.format(prefetch=prefetch), s3.options, root))


TORCH_SPAWN = """
import torch
from npydask.torch import NpyIterableDataset, NpyMapDataset
if __name__ == "__main__":
    ds = npydask.open_dataset(ROOT, storage_options=OPTIONS)
    out = {{}}
    for kind in (NpyIterableDataset, NpyMapDataset):
        loader = torch.utils.data.DataLoader(kind(ds, with_index=True), batch_size=4, num_workers=2,
                                             multiprocessing_context="{context}")
        got = {{}}
        for batch, index in loader:
            for b, i in zip(batch.numpy(), index.tolist()):
                got[i] = b.tolist()
        out[kind.__name__] = got
    print(json.dumps(out))
"""


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
@pytest.mark.timeout(HANG + 30)
def test_spawned_and_forkserver_workers_give_the_values_numpy_loads(objects, s3, tmp_path, context):
    pytest.importorskip("torch")
    root, arrays = objects
    result = run_script(tmp_path, TORCH_SPAWN.format(context=context), s3.options, root)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    for kind, got in out.items():
        assert sorted(map(int, got)) == list(range(N)), kind
        for i, values in got.items():
            np.testing.assert_array_equal(np.array(values, "<f4"), arrays[int(i)])


def test_the_loader_reads_objects_equal_to_numpy(objects, s3):
    import npydask

    root, arrays = objects
    ds = npydask.open_dataset(root, storage_options=s3.options)
    loader = npydask.Loader(ds, 5, shuffle=True, seed=1, with_index=True)
    for _ in range(2):
        seen = []
        for batch, index in loader:
            np.testing.assert_array_equal(batch, np.stack([arrays[i] for i in index]))
            seen += index.tolist()
        assert sorted(seen) == list(range(N))


def test_a_batch_of_objects_of_several_shapes_and_members_is_read_at_once(s3, monkeypatch):
    """A batch's files (and each ``.npz`` member's) are fetched together, not one after another; values as numpy's."""
    import io
    import threading

    import npydask
    from npydask.loader import fetch

    space = s3.space()
    arrays = []
    for i in range(4):
        x, y = np.arange(6 * (i + 1), dtype="<f4").reshape(i + 1, 6), np.full((i + 2,), i, np.uint8)
        buf = io.BytesIO()
        np.savez(buf, x=x, y=y)
        s3.put(f"{space}/npz/{i}.npz", buf.getvalue())
        arrays.append({"x": x, "y": y})
    ds = npydask.open_dataset(f"s3://{space}/npz", file_filter="*.npz", key=["x", "y"], storage_options=s3.options)
    together = threading.Barrier(8, timeout=20)  # (8 files' reads: each waits for all, so none finishes alone)
    whole = fetch._whole

    def met(view):
        together.wait()  # (breaks, failing the test, if the reads ran one after another)
        return whole(view)

    monkeypatch.setattr(fetch, "_whole", met)
    loader = npydask.Loader(ds, 4, prefetch=0, with_index=True)
    ((batch, index),) = list(loader)
    for k in ("x", "y"):
        assert len(batch[k]) == 4
        for got, i in zip(batch[k], index):
            np.testing.assert_array_equal(got, arrays[i][k])
