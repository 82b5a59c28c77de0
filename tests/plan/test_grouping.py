"""Group planning (npydask.plan.grouping): which consecutive files form each task, checked without files."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from npydask.plan.grouping import GroupPlan, _plan_each, _target_group_bytes, one_grid, plan_groups


@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("copies", [False, True])
def test_vectorised_plan_is_the_per_file_plan(strided, copies):
    rng = random.Random(7)
    for trial in range(300):
        n = rng.randint(1, 400)
        limit = rng.choice([64, 1000, 4096, 1 << 20])
        most = max(1, limit // 8 - 1) if not copies else limit
        sizes = [rng.choice([0, rng.randint(0, most)]) for _ in range(n)]
        shapes = [(s,) for s in sizes]
        threads = rng.randint(1, 9)
        got = plan_groups(
            sizes,
            shapes,
            np.dtype("u1"),
            [False] * n,
            limit=limit,
            axis=0,
            stacked=True,
            threads=threads,
            strided=strided,
            copies=copies,
        )
        # the per-file loop, as plan_groups ran it for every input before
        target = _target_group_bytes(sum(sizes), limit, threads)
        if any(s > target for s in sizes):
            continue  # (large files: plan_groups itself takes the loop)
        max_files = -(-n // (2 * threads)) if strided else n
        want = _plan_each(sizes, shapes, np.dtype("u1"), [False] * n, target, limit // 8, max_files, 0, True, copies)
        assert got == want, (trial, sizes, limit, threads)
        assert [b - a for a, b in got.bounds] == [c[0][0] for c in got.inner_chunks]
        assert got.bounds[0][0] == 0 and got.bounds[-1][1] == n
        assert all(p[1] == q[0] for p, q in zip(got.bounds, got.bounds[1:]))


def test_plan_of_an_array_of_sizes_with_large_files_splits_them():
    sizes = np.array([10, 10, 5000, 10, 10], np.int64)
    shapes = [(10,), (10,), (5000,), (10,), (10,)]
    plan = plan_groups(sizes, shapes, np.dtype("u1"), np.zeros(5, bool), limit=4096, axis=0, stacked=True, threads=1)
    assert plan.bounds == ((0, 2), (2, 3), (3, 5))
    assert sum(plan.inner_chunks[1][1]) == 5000


def test_plan_groups_two_tasks_per_thread():
    f4 = np.dtype("f4")
    limit = 128 << 20
    for threads in (1, 2, 4, 8, 16):
        # small files: 16 MiB of 4 KiB files
        n = 4096
        plan = plan_groups(
            [4096] * n, [(1024,)] * n, f4, [False] * n, limit=limit, axis=0, stacked=True, threads=threads
        )
        assert len(plan.bounds) >= min(2 * threads, 16), (threads, len(plan.bounds))
        assert [b for b in plan.bounds] == sorted(plan.bounds) and plan.bounds[0][0] == 0 and plan.bounds[-1][1] == n
        # medium files (2 MiB each, below limit / 8): split so each thread still gets two tasks
        plan = plan_groups(
            [2 << 20] * 8, [(512, 1024)] * 8, f4, [False] * 8, limit=limit, axis=0, stacked=True, threads=threads
        )
        tasks = sum(math.prod(len(c) for c in inner) for inner in plan.inner_chunks)
        assert tasks >= min(2 * threads, 16), (threads, tasks)
    # little data: one task
    plan = plan_groups([1000] * 100, [(250,)] * 100, f4, [False] * 100, limit=limit, axis=0, stacked=True, threads=64)
    assert plan.bounds == ((0, 100),)


def test_plan_groups_groups_files_of_any_size_when_every_chunk_is_a_copy():
    f4 = np.dtype("f4")
    limit = 128 << 20
    sizes, shapes = [16 << 20] * 64, [(64, 256, 256)] * 64  # 1 GiB of 16 MiB files
    alone = plan_groups(sizes, shapes, f4, [False] * 64, limit=limit, axis=0, stacked=True, threads=2)
    assert len(alone.bounds) == 64  # locally each is its own (zero-copy) chunk
    grouped = plan_groups(sizes, shapes, f4, [False] * 64, limit=limit, axis=0, stacked=True, threads=2, copies=True)
    assert grouped.bounds == tuple((8 * k, 8 * k + 8) for k in range(8))  # 128 MiB tasks, 2 per thread
    big = plan_groups(
        [200 << 20] * 3,
        [(200, 1 << 18)] * 3,
        f4,
        [False] * 3,
        limit=limit,
        axis=0,
        stacked=True,
        threads=2,
        copies=True,
    )
    assert big.bounds == ((0, 1), (1, 2), (2, 3))  # over the target: still split alone


def test_one_grid_joins_groups_chunked_alike_and_refuses_the_rest():
    plan = GroupPlan(((0, 2), (2, 5)), (((2,), (4,), (8,)), ((3,), (4,), (8,))))
    assert one_grid(plan, 0) == ((2, 3), (4,), (8,))
    concatenated = GroupPlan(((0, 1), (1, 3)), (((4,), (5,)), ((4,), (2, 3))))
    assert one_grid(concatenated, 1) == ((4,), (5, 2, 3))
    assert one_grid(GroupPlan(((0, 1), (1, 2)), (((1,), (4,)), ((1,), (2, 2)))), 0) is None
