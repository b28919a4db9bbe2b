"""The search's work split between processes: the same results, in task order, whatever the split."""

from __future__ import annotations

import os

import numpy as np
import pytest

from planner_cases import heavy_workload, skewed_workload, small_system

from neonic.host.planner import NeoPlanner
from neonic.host.planner.parallel import ForkedServer, available_workers, map_forked

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")


def test_results_come_in_task_order_whichever_process_computed_them(monkeypatch):
    import neonic.host.planner.parallel as parallel

    squares = map_forked(lambda i: (i * i, os.getpid()), 7, workers=2, weights=[5, 1, 1, 1, 1, 1, 1])
    assert [v for v, _ in squares] == [i * i for i in range(7)]
    if available_workers(2) == 2:
        monkeypatch.setattr(parallel, "_MAIN_TAKES", False)  # the worker computes every task
        far = map_forked(lambda i: (i * i, os.getpid()), 7, workers=2)
        assert [v for v, _ in far] == [i * i for i in range(7)] and {pid for _, pid in far} != {os.getpid()}
    with pytest.raises(ValueError, match="workers"):
        map_forked(lambda i: i, 3, workers=0)


@needs_fork
def test_a_failing_worker_costs_time_not_the_result():
    parent = os.getpid()

    def fn(i):
        if os.getpid() != parent:
            raise MemoryError("worker")
        return i + 1

    assert map_forked(fn, 6, workers=2) == [1, 2, 3, 4, 5, 6]


def test_alongside_runs_here_while_the_workers_compute():
    seen = []
    out = map_forked(lambda i: i, 3, workers=2, alongside=lambda: seen.append(os.getpid()))
    assert out == [0, 1, 2] and seen == [os.getpid()]


_system, _workload = small_system, skewed_workload


@needs_fork
def test_the_plan_is_the_same_with_one_process_or_two(monkeypatch):
    import neonic.host.planner.parallel as parallel

    s, w = _system(), heavy_workload()
    one = NeoPlanner(w, s, workers=1)
    plan = one.run()
    assert len(one.moves) == 2  # class moves were applied
    two = NeoPlanner(w, s, workers=2)
    assert two.run() == plan and two.moves == one.moves
    # every task computed by the worker: the winning starts and moves are made again here
    monkeypatch.setattr(parallel, "_MAIN_TAKES", False)
    far = NeoPlanner(w, s, workers=2)
    assert far.run() == plan and far.moves == one.moves
    # and no start plan comes back with its state: the winning one is made again
    import neonic.host.planner.search as search

    monkeypatch.setattr(search, "_KEEP_SHARDS", -1)
    assert NeoPlanner(w, s, workers=2).run() == plan
    with pytest.raises(ValueError, match="workers"):
        NeoPlanner(w, s, workers=0)


@needs_fork
def test_a_forked_server_answers_from_its_copy_and_stops_when_closed():
    """ForkedServer: each request answered by the copy (its own process), in turn; a request
    whose call fails is answered None (the caller computes it); closed, the copy is gone."""
    def fn(x, y):
        if x < 0:
            raise ValueError("negative")
        return x * y, os.getpid()

    with ForkedServer(fn) as server:
        pid = server._pid
        assert pid is not None and pid != os.getpid()
        for x in (2, 3):
            assert server.ask(x, np.arange(3))
            value, where = server.answer()
            assert np.array_equal(value, x * np.arange(3)) and where == pid
        assert server.ask(-1, 0) and server.answer() is None
        assert server.ask(1, 5) and server.answer()[0] == 5   # still serving after a failure
    with pytest.raises(OSError):
        os.kill(pid, 0)   # stopped and reaped
    assert not server.ask(1, 1) and server.answer() is None


@needs_fork
def test_the_plan_is_the_same_when_the_batch_copy_fails(monkeypatch):
    """A refinement step's batch is split with a forked copy (NeoPlanner._batch); where the
    copy's call fails, the step computes the half itself: the same plan."""
    s, w = _system(), heavy_workload()
    plan = NeoPlanner(w, s, workers=1).run()
    init = ForkedServer.__init__
    monkeypatch.setattr(ForkedServer, "__init__", lambda self, fn: init(self, lambda *a: 1 / 0))
    assert NeoPlanner(w, s, workers=2).run() == plan


def test_a_threaded_process_plans_in_one_process():
    import threading

    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert available_workers(2) == 1
        assert map_forked(lambda i: os.getpid(), 3, workers=2) == [os.getpid()] * 3
    finally:
        stop.set()
        t.join()


@needs_fork
def test_the_row_wise_contributions_a_start_worker_made_come_back(monkeypatch):
    """The contributions of row-wise plans over every rank that a forked worker made for the
    start plans (TorchRec's greedy prices every table so) are kept by this process: the same
    figures as made here, and the same plan."""
    import neonic.host.planner.parallel as parallel
    from neonic.host.planner.placer import Placer
    from neonic.host.planner.plan import ShardingType

    monkeypatch.setattr(Placer, "CACHE_BYTES", 100_000)   # contributions kept packed, as at 1024 GPUs
    monkeypatch.setattr(parallel, "_MAIN_TAKES", False)   # every start plan made by the worker
    s, w = _system(), _workload()
    ref = NeoPlanner(w, s, workers=1)
    assert ref._pack
    plan = ref.run()
    p = NeoPlanner(w, s, workers=2)
    p._best_start(before=p.greedy)
    kept = [(key, value) for key, value, _ in p._cache.entries()
            if key[0][1] is ShardingType.ROW_WISE and key[0][2] == "every rank"]
    assert len(kept) >= len(w.tables) // 2
    fresh = NeoPlanner(w, s, workers=1)
    for key, value in kept:
        tp = fresh.make(fresh.tables[key[0][0]], ShardingType.ROW_WISE, list(range(s.world_size)))
        assert tp.__dict__["_made"] == key
        made = fresh.cost.packed_plan(fresh.tables[key[0][0]], tp, w, s)
        assert np.array_equal(made.cols, value.cols) and np.array_equal(made.index, value.index)
        assert made.dp_bytes == value.dp_bytes
    assert NeoPlanner(w, s, workers=2).run() == plan
