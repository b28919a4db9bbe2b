"""The op graphs and Neo's pipeline, run with fixed-duration backends on the engine."""

from __future__ import annotations

import pytest

from neonic.host.schedule import (
    COLLECTIVE_PHASES,
    INFERENCE_PHASES,
    TRAINING_PHASES,
    ScheduleRunner,
    build_graph,
    phase_breakdown,
)
from neonic.sim.engine import Engine

# durations in ps per phase: communication comparable to computation, as in Neo
DURATIONS = {
    "h2d": 50, "input_a2a": 300, "emb_fwd": 400, "pooled_rs": 100, "pooled_a2a": 500, "bot_fwd": 600,
    "inter_fwd": 100, "top_fwd": 700, "top_bwd": 1400, "inter_bwd": 200, "grad_a2a": 500, "grad_ag": 100,
    "bot_bwd": 1200, "allreduce": 900, "emb_bwd": 800, "dense_opt": 100,
}


def fixed_backend(engine: Engine):
    """Every op takes its phase's duration; ops on a rank's streams run concurrently unharmed."""

    def backend(op, done):
        start = engine.now
        engine.after(op.payload, lambda: done(start, engine.now))

    return backend


def run(mode="training", pipelined=True, ranks=2, iterations=4, durations=DURATIONS, emb_stream="compute"):
    order = TRAINING_PHASES if mode == "training" else INFERENCE_PHASES
    payloads = {p: d for p, d in durations.items() if p in order}
    graph = build_graph(ranks, iterations, payloads, mode=mode, pipelined=pipelined, emb_stream=emb_stream)
    eng = Engine()
    end = ScheduleRunner(eng, graph, fixed_backend(eng)).run()
    return graph, end


def iteration_end(graph, it, rank=0):
    return max(op.end for op in graph.of_rank(rank) if op.iteration == it)


@pytest.mark.parametrize("mode", ["training", "inference"])
@pytest.mark.parametrize("pipelined", [True, False])
def test_no_op_starts_before_its_inputs_end(mode, pipelined):
    graph, _ = run(mode, pipelined)
    assert graph.ops
    for op in graph.ops:
        assert op.start is not None and op.end is not None and op.end >= op.start
        for dep in op.deps:
            assert op.start >= dep.end, (op, dep)


def test_training_data_dependencies():
    graph, _ = run()
    for it in range(graph.iterations):
        for r in range(graph.num_ranks):
            g = lambda p: graph.get(p, it, r)  # noqa: E731
            assert g("input_a2a") in g("emb_fwd").deps
            assert g("emb_fwd") in g("pooled_a2a").deps
            assert {g("bot_fwd"), g("pooled_a2a")} <= set(g("inter_fwd").deps)
            assert g("inter_bwd") in g("grad_a2a").deps
            assert g("grad_a2a") in g("emb_bwd").deps
            assert g("bot_bwd") in g("allreduce").deps
            assert g("allreduce") in g("dense_opt").deps
            if it:
                prev = lambda p: graph.get(p, it - 1, r)  # noqa: E731
                # synchronous training: the lookup sees the previous update, the MLP its step
                assert g("emb_fwd").start >= prev("emb_bwd").end
                assert g("bot_fwd").start >= prev("dense_opt").end


def test_collectives_span_every_rank_and_start_together():
    graph, _ = run(ranks=3)
    for op in graph.ops:
        if op.phase in COLLECTIVE_PHASES:
            assert op.ranks == (0, 1, 2)
        else:
            assert len(op.ranks) == 1


def test_baseline_serializes_every_op_of_a_rank():
    graph, end = run(pipelined=False, iterations=3)
    ops = sorted(graph.of_rank(0), key=lambda o: o.start)
    for a, b in zip(ops, ops[1:]):
        assert b.start >= a.end
    per_iteration = sum(DURATIONS.values())
    assert end == 3 * per_iteration


def test_pipeline_beats_the_baseline_and_hides_communication():
    pipe, _ = run(pipelined=True, iterations=6)
    base, _ = run(pipelined=False, iterations=6)
    t_pipe = iteration_end(pipe, 5) - iteration_end(pipe, 4)
    t_base = iteration_end(base, 5) - iteration_end(base, 4)
    assert t_pipe < t_base
    bd = phase_breakdown(pipe, [0, 1], range(2, 6))
    for phase in COLLECTIVE_PHASES:
        assert bd.exposed.get(phase, 0.0) <= bd.serialized[phase] + 1e-9
    comm_serial = sum(bd.serialized[p] for p in COLLECTIVE_PHASES)
    comm_exposed = sum(bd.exposed.get(p, 0.0) for p in COLLECTIVE_PHASES)
    assert comm_exposed < comm_serial
    # exposed time and idle time add up to the iteration time
    assert sum(bd.exposed.values()) + bd.idle == pytest.approx(bd.window_s)


def test_next_input_alltoall_overlaps_this_batch_mlps():
    graph, _ = run(iterations=3)
    nxt = graph.get("input_a2a", 1, 0)
    top = graph.get("top_fwd", 0, 0)
    bot = graph.get("bot_fwd", 0, 0)
    assert nxt.start >= graph.get("emb_fwd", 0, 0).end  # prefetch depth one
    assert nxt.start < top.end and nxt.end > bot.start  # runs under batch 0's MLPs
    assert nxt.stream != graph.get("top_fwd", 0, 0).stream


def test_pooled_alltoall_overlaps_bottom_mlp_and_allreduce_overlaps_embedding_backward():
    graph, _ = run(iterations=2)
    pooled, bot = graph.get("pooled_a2a", 0, 0), graph.get("bot_fwd", 0, 0)
    assert pooled.start < bot.end and bot.start < pooled.end
    ar, eb = graph.get("allreduce", 0, 0), graph.get("emb_bwd", 0, 0)
    assert ar.start < eb.end and eb.start < ar.end


def test_baseline_exposes_all_communication():
    graph, _ = run(pipelined=False, iterations=3)
    bd = phase_breakdown(graph, [0], [1, 2])
    for phase in COLLECTIVE_PHASES:
        assert bd.exposed[phase] == pytest.approx(bd.serialized[phase])
    assert bd.idle == pytest.approx(0.0)


def test_inference_is_forward_only():
    graph, _ = run("inference", iterations=2)
    phases = {op.phase for op in graph.ops}
    assert phases == {p for p in INFERENCE_PHASES if p in DURATIONS}
    assert not phases & {"top_bwd", "grad_a2a", "allreduce", "emb_bwd"}


def test_pipelined_inference_overlaps_batches():
    pipe, end_pipe = run("inference", iterations=8)
    base, end_base = run("inference", pipelined=False, iterations=8)
    assert end_pipe < end_base


def test_embedding_on_cpu_gets_its_own_stream():
    durations = dict(DURATIONS, pooled_h2d=100, grad_d2h=100)
    graph, _ = run(emb_stream="cpu", durations=durations)
    assert graph.get("emb_fwd", 0, 0).stream == "cpu"
    assert graph.get("pooled_a2a", 0, 0) in graph.get("pooled_h2d", 0, 0).deps
    assert graph.get("pooled_h2d", 0, 0) in graph.get("inter_fwd", 0, 0).deps


def test_runs_are_deterministic():
    a, _ = run(iterations=3, ranks=3)
    b, _ = run(iterations=3, ranks=3)
    assert [(o.phase, o.start, o.end) for o in a.ops] == [(o.phase, o.start, o.end) for o in b.ops]


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="num_ranks"):
        build_graph(0, 1, {})
    with pytest.raises(ValueError, match="mode"):
        build_graph(1, 1, {}, mode="serving")
    with pytest.raises(ValueError, match="payloads.top_bwd"):
        build_graph(1, 1, {"top_bwd": 1}, mode="inference")
    with pytest.raises(ValueError, match="payloads.emb_fwd"):
        build_graph(2, 1, {"emb_fwd": [1, 2, 3]})


def test_a_backend_that_never_finishes_is_reported():
    graph = build_graph(1, 1, {"emb_fwd": 1, "bot_fwd": 1})
    eng = Engine()
    with pytest.raises(RuntimeError, match="stalled"):
        ScheduleRunner(eng, graph, lambda op, done: None).run()


def test_an_ops_links_keep_list_order_and_take_each_op_once():
    from neonic.host.schedule import Op

    a, b, c, d = (Op(i, "bot_fwd", 0, (i,), "compute") for i in range(4))
    for dep in (b, c, b, d):  # a repeated dependency is recorded once
        a.depends_on(dep)
    assert list(a.deps) == [b, c, d] and len(a.deps) == 3 and c in a.deps and a not in a.deps
    assert list(b.dependents) == [a]
    a.deps.remove(c)  # removing and re-adding puts it last, as a list's remove/append would
    a.deps.append(c)
    assert list(a.deps) == [b, d, c] and repr(a.deps) == repr([b, d, c])
    with pytest.raises(ValueError, match="itself"):
        a.depends_on(a)


def test_graph_building_is_linear_in_ranks():
    """A collective collects one dependency per rank: building 4096 ranks costs about 8x 512
    (the dependency lists used to make it quadratic: 64x)."""
    import gc
    import time

    def build(ranks):
        # the fastest of three CPU-time samples with the collector paused: the figure is the
        # work, not what else this machine or the collector did meanwhile
        best, graph = float("inf"), None
        for _ in range(3):
            gc.collect()
            gc.disable()
            try:
                t0 = time.process_time()
                graph = build_graph(ranks, 1, {p: 1 for p in TRAINING_PHASES})
                best = min(best, time.process_time() - t0)
            finally:
                gc.enable()
        return best, graph

    small, _ = build(512)
    large, graph = build(4096)
    assert len(graph.get("pooled_a2a", 0, 0).deps) == 4096 + 1  # every rank's emb_fwd and the node's pooled_rs
    assert large < 24 * max(small, 1e-3)


def test_a_collectives_deps_and_dependents_come_rank_by_rank():
    # the engine launches an ended op's dependents in this order: the builder wires a batch's
    # ranks one after the other, so a batch's per-rank ops on each side of a collective are in
    # rank order (each rank's Zion copy beside the interaction that reads the same pools)
    payloads = {p: d for p, d in DURATIONS.items()}
    payloads.update(pooled_h2d=10, grad_d2h=10)
    graph = build_graph(4, 2, payloads, emb_stream="cpu")
    for op in graph.ops:
        if op.phase not in COLLECTIVE_PHASES:
            continue
        for links in (op.deps, op.dependents):
            for it in range(3):
                ranks = [o.rank for o in links if o.phase not in COLLECTIVE_PHASES and o.iteration == it]
                assert ranks == sorted(ranks), (op, links)
    pooled = graph.get("pooled_a2a", 0, 0)
    assert [(o.phase, o.rank) for o in pooled.dependents if o.phase not in COLLECTIVE_PHASES] == [
        (p, r) for r in range(4) for p in ("pooled_h2d", "inter_fwd")]
