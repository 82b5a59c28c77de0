"""``npydask plan``: the traffic plan of a stack or a Loader as a table or JSON, equal to the Python API's,
and one-line errors (exit status 2)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import npydask
from npydask.cli import main
from npydask.samplers import Foreground, Uniform


def run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def folder(tmp_path):
    for sub in ("img", "seg"):
        (tmp_path / sub).mkdir()
    for i in range(5):
        np.save(tmp_path / "img" / f"c{i}.npy", np.zeros((10, 16, 16), "f4"))
        seg = np.zeros((10, 16, 16), "u1")
        seg[3:6, 4:8, 4:8] = 1
        np.save(tmp_path / "seg" / f"c{i}.npy", seg)
    return tmp_path


def test_the_stack_plan_as_json_and_a_table_with_prices(folder, capsys):
    status, out, err = run(capsys, "plan", str(folder / "img"), "--roi-start", "1,2,3", "--roi-shape", "4,5,6",
                           "--epochs", "2", "--json", "--price-get", "0.4", "--price-gb", "0")  # fmt: skip
    assert (status, err) == (0, "")
    got = json.loads(out)
    ds = npydask.open_dataset(str(folder / "img"), roi_start=[1, 2, 3], roi_shape=[4, 5, 6])
    assert got == ds.traffic_plan(2, prices={"get": 0.4, "gb": 0.0}).to_dict()
    assert got["total"]["range_gets"] == 2 * 5 and got["total"]["cost"] == pytest.approx(
        (5 + 10) * 0.4 / 1000
    )  # (no LIST price)
    status, out, _ = run(capsys, "plan", str(folder / "img"))
    assert status == 0 and out.splitlines()[0] == "traffic plan: 5 objects, 1 epochs, no node cache"
    assert out.splitlines()[-1].split()[:4] == ["total", "0", "0", "B"]  # (small objects: whole-object GETs)


def test_a_loader_plan_with_a_sampler_shards_and_a_cache(folder, capsys):
    argv = ["plan", str(folder / "img"), "--sampler", "uniform", "--patch-shape", "4,8,8", "--per-file", "2",
            "--batch-size", "4", "--epochs", "3", "--seed", "2", "--shuffle", "--num-shards", "2", "--shard-id", "1",
            "--prefetch", "4", "--cache-bytes", "40KiB", "--json"]  # fmt: skip
    status, out, err = run(capsys, *argv)
    assert (status, err) == (0, "")
    loader = npydask.Loader(npydask.open_dataset(str(folder / "img")), 4, sampler=Uniform((4, 8, 8), per_file=2),
                            seed=2, shuffle=True, num_shards=2, shard_id=1, prefetch=4)  # fmt: skip
    assert json.loads(out) == loader.traffic_plan(3, cache_bytes=40 * 1024).to_dict()
    assert json.loads(out)["total"]["cache_hits"] > 0


def test_a_foreground_plan_reads_the_label_index(folder, capsys):
    index = str(folder / "fg.npz")
    argv = ["plan", str(folder / "img"), "--sampler", "foreground", "--patch-shape", "4,4,4", "--batch-size", "2",
            "--labels", str(folder / "seg"), "--label-index", index]  # fmt: skip
    status, _, err = run(capsys, *argv)
    assert status == 2 and "fg.npz: no foreground index there" in err and len(err.splitlines()) == 1
    pair = npydask.zip_datasets({"image": npydask.open_dataset(str(folder / "img")),
                                 "label": npydask.open_dataset(str(folder / "seg"))})  # fmt: skip
    Foreground((4, 4, 4), index=index).bind(pair).patch(0, 0)
    status, out, err = run(capsys, *argv)
    assert (status, err) == (0, "") and out.startswith("traffic plan: 10 objects")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--sampler", "grid"], "--sampler grid needs --patch-shape INTS"),
        (["--sampler", "foreground", "--patch-shape", "2,2,2"], "--sampler foreground needs --labels PATH"),
        (["--cache-bytes", "lots"], "cache_bytes must be a size such as 10GiB"),
        (["--epochs", "-1"], "epochs must be"),
        (["--price-get", "-1"], "the get price must be a finite number >= 0"),
        (["--patch-shape", "a", "--sampler", "uniform"], "--patch-shape 'a': expected comma-separated int"),
    ],
)
def test_bad_flags_are_one_line_errors(folder, capsys, extra, message):
    status, out, err = run(capsys, "plan", str(folder / "img"), *extra)
    assert (status, out) == (2, "")
    assert message in err and len(err.splitlines()) == 1, err
