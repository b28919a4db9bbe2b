"""Data-parallel gradient buckets: DDP's bucketing rules, their op graph, and the overlap with
the backward in a cluster run."""

from __future__ import annotations

import pytest

from neonic.host.gradients import BucketConfig, assign_buckets, gradient_buckets
from neonic.host.schedule import GRAD_STREAM, OPT_STREAM, GradientBuckets, ScheduleRunner, bucket_gradients, build_graph
from neonic.sim.engine import Engine

MIB = 2**20


def test_buckets_follow_ddp_rules():
    """First bucket closes at 1 MiB, later ones at the cap; a tensor is never split; tensors
    without elements are skipped."""
    n = MIB // 4  # elements of 1 MiB of FP32 gradients
    sizes = [10, n, 3 * n, 0, 30 * n, n, n]
    buckets = assign_buckets(sizes, 25 * MIB, 1 * MIB)
    assert buckets == [[0, 1], [2, 4], [5, 6]]
    assert assign_buckets([5, 5], 25 * MIB, 1 * MIB) == [[0, 1]]


def _durations():
    return {"h2d": 50, "input_a2a": 300, "emb_fwd": 400, "pooled_a2a": 500, "bot_fwd": 600, "inter_fwd": 100,
            "top_fwd": 700, "top_bwd": 1400, "inter_bwd": 200, "grad_a2a": 500, "bot_bwd": 1200, "allreduce": 900,
            "emb_bwd": 800, "dense_opt": 100}


def _run(spec: GradientBuckets | None, iterations=3, ranks=2):
    graph = build_graph(ranks, iterations, _durations(), mode="training", pipelined=True)
    if spec is not None:
        bucket_gradients(graph, spec)
    eng = Engine()

    def backend(op, done):
        start = eng.now
        eng.after(op.payload, lambda: done(start, eng.now))

    end = ScheduleRunner(eng, graph, backend).run()
    return graph, end


def _spec(optimizer="after_last", next_batch="when_ready"):
    # top backward in 2 pieces (bucket 0 closes after the first), bottom backward in 2 (bucket 1, 2)
    segments = (("top_bwd", 700, 0), ("top_bwd", 700, None), ("inter_bwd", 200, None), ("bot_bwd", 600, 1),
                ("bot_bwd", 600, 2))
    opt = (40, 40, 40) if optimizer == "per_bucket" else (100,)
    return GradientBuckets(segments, (300, 300, 300), (frozenset({"top"}), frozenset({"top", "bottom"}), frozenset({"bottom"})),
                           opt, optimizer, next_batch=next_batch)


@pytest.mark.parametrize("optimizer", ["after_last", "per_bucket"])
def test_buckets_launch_as_the_backward_produces_them_and_overlap_it(optimizer):
    graph, end = _run(_spec(optimizer, "when_ready"))
    _, end_single = _run(None)
    for op in graph.ops:
        for dep in op.deps:
            assert op.start >= dep.end, (op, dep)
    it, r = 1, 0
    buckets = sorted((op for op in graph.ops if op.phase == "allreduce" and op.iteration == it), key=lambda o: o.start)
    assert len(buckets) == 3 and all(b.stream == GRAD_STREAM and len(b.ranks) == 2 for b in buckets)
    bwd = [op for op in graph.of_rank(r) if op.iteration == it and op.phase in ("top_bwd", "inter_bwd", "bot_bwd")]
    assert len(bwd) == 5
    # the first bucket runs while the backward still computes
    assert buckets[0].start < max(op.end for op in bwd)
    assert buckets[0].end > buckets[0].start
    steps = [op for op in graph.of_rank(r) if op.iteration == it and op.phase == "dense_opt"]
    assert all(s.stream == OPT_STREAM for s in steps)
    assert len(steps) == (3 if optimizer == "per_bucket" else 1)
    # the next embedding forward waits for the embedding backward only, not for the AllReduce
    nxt = graph.get("emb_fwd", it + 1, r)
    assert not any(d.phase in ("allreduce", "dense_opt") for d in nxt.deps)
    assert end < end_single


@pytest.mark.parametrize("optimizer", ["after_last", "per_bucket"])
def test_pytorch_program_order_makes_the_next_batch_wait_for_the_optimizer_step(optimizer):
    """DDP's backward ends after every bucket's AllReduce, optimizer.step() follows, and the
    next batch's kernels are issued after it on the same compute stream: its embedding forward
    starts only after the last optimizer step (and so after the last bucket); the buckets still
    overlap the backward."""
    graph, end = _run(_spec(optimizer, "after_step"))
    _, end_ready = _run(_spec(optimizer, "when_ready"))
    _, end_single = _run(None)
    it, r = 1, 0
    nxt = graph.get("emb_fwd", it + 1, r)
    last_step = max((op for op in graph.of_rank(r) if op.iteration == it and op.phase == "dense_opt"), key=lambda o: o.end)
    last_bucket = max((op for op in graph.ops if op.phase == "allreduce" and op.iteration == it), key=lambda o: o.end)
    assert last_step in nxt.deps
    assert nxt.start >= last_step.end >= last_bucket.end
    bwd_end = max(op.end for op in graph.of_rank(r) if op.iteration == it and op.phase.endswith("_bwd"))
    first_bucket = min((op for op in graph.ops if op.phase == "allreduce" and op.iteration == it), key=lambda o: o.start)
    assert first_bucket.start < bwd_end
    assert end_ready <= end < end_single
    with pytest.raises(ValueError, match="next_batch"):
        BucketConfig(next_batch="eventually")


def test_bucketing_is_refused_where_it_does_not_apply():
    graph = build_graph(2, 1, _durations(), mode="training", pipelined=False)
    with pytest.raises(ValueError, match="pipelined training"):
        bucket_gradients(graph, _spec())
    with pytest.raises(ValueError, match="closed exactly once"):
        GradientBuckets((("top_bwd", 1, 0),), (1, 1), (frozenset(), frozenset()), (1,), "after_last")
    with pytest.raises(ValueError, match="dense.optimizer"):
        BucketConfig(optimizer="sometimes")
    with pytest.raises(ValueError, match="dense.bucket_mib"):
        BucketConfig(bucket_mib=-1)


def test_gradient_buckets_from_layer_costs_cover_every_parameter():
    from neonic.host.workloads import preset
    from neonic.host.workloads.dense import layer_costs
    from neonic.sim.gpu import gpu_preset

    wl = preset("model-f")
    layers = layer_costs(gpu_preset("a100-40gb"), wl)
    spec = gradient_buckets(layers, BucketConfig(bucket_mib=1.0, first_bucket_mib=0.25), lambda n: n, lambda n: n,
                            tables_bytes=4000.0)
    assert sum(spec.buckets) == pytest.approx(sum(lc.params for lc in layers) + 1000)
    assert spec.tables_bucket == len(spec.buckets) - 1
    total = sum(lc.backward.time_s for lc in layers)
    assert sum(seg[1].time_s for seg in spec.segments) == pytest.approx(total)


def test_default_run_overlaps_the_buckets_with_the_mlp_backward():
    """The default scenario's timeline: gradient buckets on their own track, running while the
    MLP backward computes; turning bucketing off gives one AllReduce after the backward."""
    from neonic.host.cluster import ClusterRun, scenario_preset

    result = ClusterRun(scenario_preset("default")).run()
    graph = result.graph
    it = result.scenario.warmup
    buckets = [op for op in graph.ops if op.phase == "allreduce" and op.iteration == it]
    bwd = [op for op in graph.of_rank(0) if op.iteration == it and op.phase in ("top_bwd", "bot_bwd")]
    assert len(buckets) > 2
    overlapping = [b for b in buckets if any(b.start < op.end and op.start < b.end for op in bwd)]
    assert overlapping, "no gradient bucket overlaps the MLP backward"
    assert "gpu0/grad" in result.tracks
    single = ClusterRun(scenario_preset("default", dense={"bucket_mib": 0})).run()
    assert len([op for op in single.graph.ops if op.phase == "allreduce" and op.iteration == it]) == 1
    assert result.metrics["samples_per_s"] > single.metrics["samples_per_s"]


# ------------------------------------------------------------------ Neo's switches
def _small(**over):
    from neonic.host.cluster import scenario_preset

    return scenario_preset("default", **over)


def test_comm_precision_sets_the_wire_bytes_of_each_collective():
    from neonic.host.cluster import ClusterRun

    def a2a_bytes(result, phase):
        op = next(op for op in result.graph.ops if op.phase == phase)
        return float(op.payload.matrix.sum())

    def ar_bytes(result):
        return sum(op.payload.nbytes for op in result.graph.ops if op.phase == "allreduce" and op.iteration == 0)

    def run(**prec):  # one plan for all (a plan that does not depend on the wire bytes)
        return ClusterRun(_small(comm_precision=prec, planner={"name": "size-greedy"})).run()

    fp32 = run(forward="fp32", backward="fp32", allreduce="fp32")
    mixed = run(forward="fp16", backward="bf16", allreduce="fp16")
    fwd_only = run(forward="fp16", backward="fp32", allreduce="fp32")
    for phase in ("pooled_a2a", "grad_a2a"):
        assert a2a_bytes(mixed, phase) == pytest.approx(a2a_bytes(fp32, phase) / 2, rel=1e-3)
    assert a2a_bytes(fwd_only, "pooled_a2a") == pytest.approx(a2a_bytes(fp32, "pooled_a2a") / 2, rel=1e-3)
    assert a2a_bytes(fwd_only, "grad_a2a") == pytest.approx(a2a_bytes(fp32, "grad_a2a"), rel=1e-3)
    assert ar_bytes(mixed) == pytest.approx(ar_bytes(fp32) / 2, rel=1e-3)
    assert a2a_bytes(mixed, "input_a2a") == a2a_bytes(fp32, "input_a2a")  # indices are not quantized
    assert mixed.scenario.resolved()["comm_precision"] == {"forward": "fp16", "backward": "bf16", "allreduce": "fp16"}


def test_table_precision_halves_the_tables_and_keeps_fp32_optimizer_state():
    from neonic.host.workloads import resolve_workload

    fp32 = resolve_workload({"preset": "model-f", "table_dtype": "fp32"})
    fp16 = resolve_workload({"preset": "model-f", "table_dtype": "fp16"})
    t32, t16 = fp32.tables[0], fp16.tables[0]
    assert t16.nbytes * 2 == t32.nbytes
    assert fp16.table_memory_bytes(t16) - t16.nbytes == fp32.table_memory_bytes(t32) - t32.nbytes == t32.rows * 4
    with pytest.raises(ValueError, match="workload.table_dtype"):
        resolve_workload({"preset": "model-f", "table_dtype": "int4"})


@pytest.mark.parametrize("over, field", [
    ({"comm_precision": {"forward": "int4"}}, "comm_precision.forward"),
    ({"comm_precision": {"sideways": "fp16"}}, "comm_precision.sideways"),
    ({"dense": {"optimizer": "never"}}, "dense.optimizer"),
])
def test_bad_switches_are_named(over, field):
    with pytest.raises(ValueError, match=field):
        _small(**over)


def test_published_comparisons_use_neo_post_optimization_settings():
    from neonic.host.cluster import scenario_preset
    from neonic.host.experiments.ablation import NEO_SETTINGS, NEO_SETTINGS_SOURCES

    assert set(NEO_SETTINGS) <= set(NEO_SETTINGS_SOURCES)
    for name in ("model-a-128", "model-a-1024"):
        sc = scenario_preset(name)
        assert sc.planner == NEO_SETTINGS["planner"]
        assert {t.dtype for t in sc.workload.tables} == {NEO_SETTINGS["table_dtype"]}
        for key in ("forward", "backward", "allreduce"):
            assert sc.precision(key) == NEO_SETTINGS[key]
        assert sc.workload.batch_per_gpu == 512


def test_ablation_ladder_applies_the_steps_cumulatively(tmp_path):
    from neonic.host.experiments import experiment_config, run_experiment

    result = run_experiment("ablation", tmp_path, size="tiny")
    cfg = result.config
    assert [r["step"] for r in result.rows] == ["baseline", *[s["name"] for s in cfg["steps"]]]
    last = result.rows[-1]
    assert last["planner"] == "neo" and last["table_dtype"] == "fp16" and last["backward"] == "bf16"
    assert last["batch_per_gpu"] == 512
    assert (tmp_path / "ladder.png").stat().st_size > 1000
    with pytest.raises(ValueError, match=r"ablation.steps\[0\].forward"):
        experiment_config("ablation", overrides={"steps": [{"name": "x", "forward": "fp8"}]})
