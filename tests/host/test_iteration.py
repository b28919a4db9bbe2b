"""The one model of the iteration: the planner's fast evaluation is the simulator's op graph."""

from __future__ import annotations

import numpy as np
import pytest

from neonic.host.iteration import IterationSpec, ScheduleTemplate
from neonic.host.schedule import COLLECTIVE_PHASES, ScheduleRunner, build_graph
from neonic.sim.engine import Engine


def _durations(rng, spec: IterationSpec, ranks: int):
    """Random per-rank durations (ps) for rank-local phases, one per collective."""
    rank, coll = {}, {}
    for phase in spec.phases():
        if phase in COLLECTIVE_PHASES:
            coll[phase] = int(rng.integers(0, 2000))
        else:
            rank[phase] = rng.integers(0, 2000, ranks)
    return rank, coll


@pytest.mark.parametrize("mode,pipelined", [("training", True), ("training", False), ("inference", True)])
def test_fast_evaluation_is_the_simulated_schedule_without_contention(mode, pipelined):
    """With every op taking a fixed time (no shared resources), the event-driven runner and the
    vectorised list schedule give the same iteration time, rank by rank imbalance included."""
    rng = np.random.default_rng(7)
    spec = IterationSpec(mode=mode, pipelined=pipelined, warmup=1, iterations=2)
    ranks = 5
    for _ in range(5):
        rank, coll = _durations(rng, spec, ranks)

        def payload(phase, it, r):
            return coll[phase] if r < 0 else int(rank[phase][r])

        graph = build_graph(ranks, 3, payload, mode=mode, pipelined=pipelined, phases=spec.phases())
        eng = Engine()

        def backend(op, done):
            start = eng.now
            eng.after(op.payload, lambda: done(start, eng.now))

        ScheduleRunner(eng, graph, backend).run()
        it_end = [max(op.end for op in graph.ops if op.iteration == i) for i in range(3)]
        simulated = (it_end[2] - it_end[0]) / 2
        fast = ScheduleTemplate(spec).iteration_s({p: v.astype(float) for p, v in rank.items()},
                                                  {p: float(v) for p, v in coll.items()})
        assert fast[0] == pytest.approx(simulated)


def test_collectives_are_barriers_so_phase_maxima_add_up():
    """Two ranks, each slow in a different phase: the iteration pays both slow ranks (sum of
    per-phase maxima), not the slowest rank's sum."""
    spec = IterationSpec(pipelined=False, warmup=0, iterations=1)
    t = ScheduleTemplate(spec)
    zero = {p: np.zeros(2) for p in spec.phases() if p not in COLLECTIVE_PHASES}
    fwd = dict(zero, emb_fwd=np.array([3.0, 0.0]), emb_bwd=np.array([0.0, 3.0]))
    assert t.iteration_s(fwd, {})[0] == pytest.approx(6.0)


def test_table_row_wise_reduction_precedes_the_pooled_alltoall():
    graph = build_graph(2, 1, {p: 1 for p in IterationSpec().phases()})
    rs = graph.get("pooled_rs", 0, 0)
    assert rs in graph.get("pooled_a2a", 0, 0).deps
    assert graph.get("grad_a2a", 0, 0) in graph.get("grad_ag", 0, 0).deps
    assert graph.get("grad_ag", 0, 0) in graph.get("emb_bwd", 0, 0).deps
