"""End-to-end cluster runs on tiny scenarios: results files, pipeline vs baseline, systems."""

from __future__ import annotations

import csv
import json

import pytest

from neonic.host.cluster import ClusterRun, scenario_from_dict
from neonic.host.report import RESULT_FILES, write_results


def tiny(**sections) -> dict:
    data = {
        "scenario": {"name": "tiny", "iterations": 2, "warmup": 1},
        "cluster": {"nodes": 2},
        "workload": {
            "name": "tiny",
            "batch_per_gpu": 128,
            "synthesize": {"count": 16, "total_params": 2e7, "dim_min": 16, "dim_max": 64, "dim_avg": 32,
                           "dim_multiple": 4, "pooling_mean": 8, "seed": 3},
            "dense": {"bottom_mlp": [64, 256, 32], "interaction": "dot", "top_mlp": [256, 128, 1]},
        },
        "system": {"preset": "zionex"},
        "planner": {"max_steps": 20},
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return data


@pytest.fixture(scope="module")
def pipelined():
    return ClusterRun(scenario_from_dict(tiny())).run()


@pytest.fixture(scope="module")
def serialized():
    return ClusterRun(scenario_from_dict(tiny(scenario={"name": "tiny", "iterations": 2, "warmup": 1, "pipelined": False}))).run()


def test_run_writes_every_results_file(pipelined, tmp_path):
    out = write_results(pipelined, tmp_path / "results")
    for name in RESULT_FILES:
        assert (out / name).stat().st_size > 0, name
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["samples_per_s"] > 0
    assert metrics["gpus"] == 16
    rows = list(csv.DictReader((out / "breakdown.csv").open()))
    assert {"input_a2a", "emb_fwd", "pooled_a2a", "allreduce", "emb_bwd"} <= {r["phase"] for r in rows}
    trace = json.loads((out / "trace.json").read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"compute", "comm", "input"} <= names  # one track per GPU stream
    assert any(e["ph"] == "C" for e in trace["traceEvents"])  # link-class counters


def test_every_op_ran_after_its_inputs(pipelined):
    for op in pipelined.graph.ops:
        for dep in op.deps:
            assert op.start >= dep.end


def test_pipeline_beats_the_serialized_baseline(pipelined, serialized):
    p, s = pipelined.metrics, serialized.metrics
    assert p["iteration_time_s"] < s["iteration_time_s"]
    comm = ("input_a2a", "pooled_a2a", "grad_a2a", "allreduce")
    exposed = sum(p["phase_exposed_s"].get(c, 0.0) for c in comm)
    serial = sum(p["phase_serialized_s"][c] for c in comm)
    assert exposed <= serial


def test_utilization_and_link_bytes_are_reported(pipelined):
    m = pipelined.metrics
    assert 0 < m["utilization"]["gpu_sm"] <= 1
    assert 0 < m["utilization"]["gpu_hbm"] <= 1
    assert sum(m["link_class_bytes"].values()) > 0


def test_runs_are_deterministic():
    a = ClusterRun(scenario_from_dict(tiny())).run().metrics
    b = ClusterRun(scenario_from_dict(tiny())).run().metrics
    assert a["iteration_time_s"] == b["iteration_time_s"]
    assert a["phase_exposed_s"] == b["phase_exposed_s"]


def test_inference_reports_latency():
    m = ClusterRun(scenario_from_dict(tiny(scenario={"name": "tiny", "mode": "inference", "iterations": 3, "warmup": 1}))).run().metrics
    assert m["latency_s"]["mean"] > 0
    assert "emb_bwd" not in m["phase_serialized_s"]


def test_zion_runs_embeddings_on_cpu_sockets():
    m = ClusterRun(scenario_from_dict(tiny(system={"preset": "zion"}))).run().metrics
    assert m["utilization"]["cpu_sockets"] > 0
    assert "pooled_h2d" in m["phase_serialized_s"]


def test_collectives_on_dma_engines_do_not_slow_the_run():
    base = ClusterRun(scenario_from_dict(tiny())).run().metrics
    dma = ClusterRun(scenario_from_dict(tiny(system={"preset": "zionex", "streams": {"collectives_on_dma": True}}))).run().metrics
    # the copy engines still read and write HBM: where a collective overlaps the memory-bound
    # dense optimizer step (on the critical path: the next batch waits for it, dense.next_batch)
    # it may cost that step a few nanoseconds, never a measurable share of the iteration
    assert dma["iteration_time_s"] <= base["iteration_time_s"] * (1 + 1e-4)


def test_timeline_shows_gpu_sm_and_hbm_shares(pipelined):
    from neonic.host.report import chrome_trace

    counters = [e for e in chrome_trace(pipelined)["traceEvents"] if e["ph"] == "C"]
    assert {"SM share", "HBM share"} <= {e["name"] for e in counters}
    shares = [v for e in counters if e["name"] == "SM share" for v in e["args"].values()]
    assert max(shares) > 0 and all(0 <= v <= 1 + 1e-9 for v in shares)


def test_comm_priority_is_read():
    # the GPU model schedules a high-priority collective's CTAs first (sim.interference)
    runs = {p: ClusterRun(scenario_from_dict(tiny(system={"preset": "zionex", "streams": {"comm_priority": p}}))).run()
            for p in ("high", "normal")}
    assert runs["high"].metrics["iteration_time_s"] != runs["normal"].metrics["iteration_time_s"]


def test_wall_time_is_split_into_planning_and_engine(pipelined):
    split = pipelined.metrics["wall_breakdown_s"]
    assert split["planning_s"] > 0 and split["engine_s"] > 0
    assert sum(v for k, v in split.items() if k != "collect_s") <= pipelined.metrics["wall_s"] + 1e-6
    assert pipelined.metrics["plan_notes"]  # how the planner's search ended
    # stage by stage, in the order they ran, wall and CPU seconds
    stages = pipelined.metrics["wall_stages_s"]
    assert list(stages) == ["topology", "planner_system", "planning", "planner_garbage", "work", "nic_effects",
                            "payloads", "graph", "resources", "engine", "metrics"]
    assert all(t["wall_s"] >= 0 and t["cpu_s"] >= 0 for t in stages.values())
    assert stages["planner_system"]["wall_s"] + stages["planning"]["wall_s"] <= split["planning_s"] + 1e-6
    # the engine stage holds the engine's split (timed inside it); a loaded machine may add a
    # preemption between the two clocks, never take one away
    assert split["engine_s"] <= stages["engine"]["wall_s"] < split["engine_s"] + 0.05
    assert sum(t["wall_s"] for t in stages.values()) <= pipelined.metrics["wall_s"] + split["collect_s"] + 1e-6


def test_stage_clock_adds_up_a_stage_timed_twice_and_keeps_the_order():
    from neonic.host.cluster import StageClock

    now = {"wall": 0.0, "cpu": 0.0}
    stages = StageClock(clock=lambda: now["wall"], cpu=lambda: now["cpu"])
    for name, wall, cpu in (("b", 2.0, 1.0), ("a", 0.5, 0.5), ("b", 1.0, 0.25)):
        with stages(name):
            now["wall"] += wall
            now["cpu"] += cpu
    with pytest.raises(RuntimeError), stages("c"):   # a stage that fails still counts
        now["wall"] += 4.0
        raise RuntimeError
    assert stages.as_dict() == {"b": {"wall_s": 3.0, "cpu_s": 1.25}, "a": {"wall_s": 0.5, "cpu_s": 0.5},
                                "c": {"wall_s": 4.0, "cpu_s": 0.0}}
    assert stages.describe() == "b 3.0/1.2, a 0.5/0.5, c 4.0/0.0 s wall/CPU"


@pytest.mark.parametrize("name", ["size-greedy", "force:row-wise"])
def test_the_planner_section_selects_the_planner(name):
    run = ClusterRun(scenario_from_dict(tiny(planner={"name": name})))
    result = run.run()
    assert run.plan.planner == name
    assert result.scenario.resolved()["planner"]["name"] == name
    if name == "force:row-wise":
        assert set(run.plan.sharding_counts()) == {"row_wise"}


def test_plans_without_a_time_budget_are_identical():
    data = tiny()
    assert "time_budget_s" not in data["planner"]
    a, b = ClusterRun(scenario_from_dict(data)), ClusterRun(scenario_from_dict(data))
    a.run(), b.run()
    assert a.plan == b.plan


def test_engine_progress_estimates_the_time_left_from_ended_iterations():
    from neonic.host.cluster import EngineProgress
    from neonic.host.schedule import build_graph

    graph = build_graph(2, 2, {"h2d": 1, "bot_fwd": 1, "top_fwd": 1}, mode="inference")
    now = [0.0]
    clock = EngineProgress(graph, clock=lambda: now[0])
    assert clock.left_s() == (None, "") and "no estimate" in clock.describe()
    clock.start()
    ops = graph.ops  # creation order: iteration 0's, then iteration 1's, then the prefetch
    first = [op for op in ops if op.iteration == 0]
    now[0] = 1.0
    clock.op_done(first[0])
    # before an iteration has ended: per op, and said to be rough
    assert clock.left_s() == (pytest.approx(1.0 * (len(ops) - 1)), "ops")
    assert "rough" in clock.describe()
    for op in first[1:]:
        now[0] += 1.0
        clock.op_done(op)
    # iteration 0 ended after len(first) s: the other iteration takes as long again, unless
    # the ops left at the rate so far take less
    assert clock.iterations_done == 1
    by_ops = len(first) * (len(ops) - len(first)) / len(first)
    assert clock.left_s() == (pytest.approx(min(len(first), by_ops)), "iterations")
    now[0] += 2.0
    by_ops = (len(first) + 2.0) * (len(ops) - len(first)) / len(first)
    assert clock.left_s()[0] == pytest.approx(min(len(first) - 2.0, by_ops))
    assert "1/2 iterations ended" in clock.describe()


def test_a_run_reports_its_progress_with_a_time_estimate():
    messages = []
    ClusterRun(scenario_from_dict(tiny()), progress=lambda message, fraction: messages.append((message, fraction))).run()
    fractions = [f for _, f in messages]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    engine = [m for m, _ in messages if m.startswith("simulated ")]
    assert engine and all(" s left" in m or "no estimate" in m for m in engine)
    assert any("iterations ended" in m and "rough" not in m for m in engine[len(engine) // 2:])
    # the planner's search says where it is, phase by phase (``make_plan``'s ``progress``)
    assert any(m.startswith("planning the sharding (neo): start plans: ") for m, _ in messages)
    # the stages say how long the ones before took: planning, building, the engine, the run
    import re

    for pattern in (r"planned in \d+\.\d s", r"built in \d+\.\d s", r"the engine ran \d+\.\d s", r"^done in \d+\.\d s \(topology .* s wall/CPU\)$"):
        assert sum(bool(re.search(pattern, m)) for m, _ in messages) == 1, pattern


def test_the_gpus_batched_traffic_update_runs_the_same_ops_as_the_per_gpu_one(monkeypatch):
    """The run couples its GPUs to the network with the batched traffic update
    (``sim.interference.couple``); with ``set_traffic`` on each GPU instead, every op starts
    and ends at the same picosecond and the measured figures are the same, bit for bit."""
    import functools

    import neonic.host.cluster as cluster
    from neonic.sim.interference import couple

    def ops_and_metrics() -> tuple:
        run = ClusterRun(scenario_from_dict(tiny(system={"preset": "zionex", "streams": {"comm_priority": "high"}})))
        m = run.run().metrics
        return [(op.id, op.start, op.end) for op in run.graph.ops], m["iteration_time_s"], m["utilization"]

    batched = ops_and_metrics()
    monkeypatch.setattr(cluster, "couple", functools.partial(couple, batched=False))
    assert ops_and_metrics() == batched


def test_finished_collectives_are_let_go_and_the_heap_trimmed_without_changing_the_run(monkeypatch):
    """A finished collective's flow groups are dropped when the run has its end (they and
    their handle form a reference cycle: without this only the cyclic collector frees their
    arrays), and the C heap is trimmed before the next collective starts after a large one
    (here every one counts as large), after planning and before the engine. The run is the
    same, op for op, as one that does neither."""
    import gc
    import weakref

    import neonic.host.cluster as cluster
    from neonic.sim.network import collectives as coll

    def run() -> tuple:
        handles: list = []
        real = coll.alltoallv

        def alltoallv(*args, **kwargs):
            h = real(*args, **kwargs)
            handles.append(weakref.ref(h))
            return h

        with monkeypatch.context() as m:
            m.setattr(coll, "alltoallv", alltoallv)
            r = ClusterRun(scenario_from_dict(tiny()))
            result = r.run()
        return [(op.id, op.start, op.end) for op in r.graph.ops], result.metrics["iteration_time_s"], handles

    trims = []
    real_release = cluster.release_heap
    monkeypatch.setattr(cluster, "release_heap", lambda: trims.append(1) or real_release())
    monkeypatch.setattr(cluster, "_RELEASE_MIN_FLOWS", 1)
    was = gc.isenabled()
    gc.disable()  # the handles must go by reference counting alone
    try:
        ops, iteration, handles = run()
        # all gone but the last, whose groups the network's caches name until its next solve
        assert len(handles) > 2 and sum(h() is not None for h in handles) <= 1
        assert 2 < len(trims) <= 2 + len(handles)  # after planning, before the engine, between collectives
        monkeypatch.setattr(cluster, "release_heap", lambda: False)
        monkeypatch.setattr(cluster, "_let_go", lambda handle: False)
        kept_ops, kept_iteration, kept = run()
        assert all(h() is not None for h in kept)  # without it, the cycles keep every one
    finally:
        if was:
            gc.enable()
    assert (kept_ops, kept_iteration) == (ops, iteration)


def test_release_heap_asks_glibc_only(monkeypatch):
    """``release_heap`` calls glibc's ``malloc_trim`` where there is one and says so; on other
    systems it does nothing and returns False."""
    import ctypes.util
    import sys

    import neonic.host.cluster as cluster

    glibc = sys.platform.startswith("linux") and (ctypes.util.find_library("c") or "").startswith("libc.so")
    assert cluster.release_heap() is bool(glibc)
    monkeypatch.setattr(sys, "platform", "darwin")
    assert cluster._malloc_trim.__wrapped__() is None


def test_the_build_runs_without_the_cyclic_collector_and_gives_it_back(monkeypatch):
    """The work, the payloads, the op graph and the resources are built with the cyclic
    collector paused (they make no garbage cycles; its passes over them are wasted), after the
    planner's garbage cycles have been collected; the SmartNIC effects and the engine run with
    it, and it is back on after the build, also when the build fails."""
    import gc
    import weakref

    import neonic.host.cluster as cluster

    seen: dict[str, bool] = {}

    class Cycle:
        def __init__(self) -> None:
            self.me = self

    planner_garbage: list = []
    real_planned = cluster.ClusterRun._planned

    def planned(self, psys):
        plan = real_planned(self, psys)
        planner_garbage.append(weakref.ref(Cycle()))  # a cycle the planner left behind
        return plan

    monkeypatch.setattr(cluster.ClusterRun, "_planned", planned)
    thresholds = gc.get_threshold()

    def spy(name, real):
        def wrapped(*args, **kwargs):
            seen[name] = gc.isenabled()
            return real(*args, **kwargs)
        monkeypatch.setattr(cluster, name, wrapped)

    spy("iteration_payloads", cluster.iteration_payloads)
    spy("build_iteration_graph", cluster.build_iteration_graph)
    spy("dense_costs", cluster.dense_costs)
    spy("ScheduleRunner", cluster.ScheduleRunner)
    import neonic.host.planner.work as work_module
    monkeypatch.setattr(work_module, "derive_iteration", lambda *a, real=work_module.derive_iteration: (
        seen.__setitem__("derive_iteration", gc.isenabled()),
        seen.__setitem__("planner_garbage_left", planner_garbage[-1]() is not None), real(*a))[2])
    assert gc.isenabled()
    gc.set_threshold(0)  # enabled, but only a collection the run asks for finds the cycle
    try:
        ClusterRun(scenario_from_dict(tiny())).run()
    finally:
        gc.set_threshold(*thresholds)
    assert seen == {"derive_iteration": False, "planner_garbage_left": False, "dense_costs": True,
                    "iteration_payloads": False, "build_iteration_graph": False, "ScheduleRunner": True}
    assert gc.isenabled()

    def fails(*args, **kwargs):
        raise RuntimeError("no graph")

    monkeypatch.setattr(cluster, "build_iteration_graph", fails)
    with pytest.raises(RuntimeError, match="no graph"):
        ClusterRun(scenario_from_dict(tiny())).run()
    assert gc.isenabled()


def test_ranks_with_the_same_shards_share_one_embedding_payload_their_own_costs_give():
    """A rank's fused embedding kernels depend on its shards' figures, not on its rank: ranks
    whose shards are the same get one payload object, equal to what their own shards give
    (host-tier shards included: the misses' transfers beside the kernel)."""
    from dataclasses import replace

    from neonic.host.iteration import NICJob, dense_costs, fused_embedding_costs, iteration_payloads
    from neonic.host.planner.work import derive_iteration

    sc = scenario_from_dict(tiny())
    run = ClusterRun(sc)
    plan, psys = run._plan(run._topology())
    work = derive_iteration(plan, sc.workload, psys)
    dense = dense_costs(sc.system, sc.workload, sc.dense_dtype)
    pcie, ssd = sc.system.host_link_gbytes_per_s * 1e9, psys.memory.ssd_gbytes_per_s * 1e9
    busy = [r for r in range(work.world_size) if work.kernels[r]]
    # every rank takes rank busy[0]'s shards; the odd ranks' first shard lives in host memory
    host = replace(work.kernels[busy[0]][0], tier="dram", miss_bytes=1e6)
    same = replace(work, kernels=[[replace(k, rank=r) for k in ([host] if r % 2 else []) + work.kernels[busy[0]]]
                                  for r in range(work.world_size)])
    for w in (work, same):
        p = iteration_payloads(sc, w, dense, psys)
        for r in range(w.world_size):
            f, b = fused_embedding_costs(sc.system.gpu_spec, w.kernels[r], pcie, ssd, host_in_kernel=False)
            fwd, bwd = p["emb_fwd"][r], p["emb_bwd"][r]
            miss = sum(k.miss_bytes for k in w.kernels[r])
            if miss:
                assert fwd == NICJob((), f, miss / 2, to_gpu=True, kind="tier_miss")
                assert bwd == NICJob((), b, miss / 2, to_gpu=False, kind="tier_miss")
            else:
                assert (fwd, bwd) == (f, b)
            assert p["tier_miss_bytes"][r] == miss
    p = iteration_payloads(sc, same, dense, psys)
    for r in range(2, same.world_size):
        assert p["emb_fwd"][r] is p["emb_fwd"][r % 2] and p["emb_bwd"][r] is p["emb_bwd"][r % 2]
    assert p["emb_fwd"][0] is not p["emb_fwd"][1]
