"""Picking the best of a batch of states (``NeoPlanner._first_best``): the states that cannot be
the best by the schedule without contention are left unpriced, and the pick is the same."""

from __future__ import annotations

import numpy as np
import pytest

from planner_cases import heavy_workload, skewed_workload, small_system

from neonic.host.planner import NeoPlanner
from neonic.host.planner.forced import plan_forced
from neonic.host.planner.plan import ShardingType


def _priced(planner: NeoPlanner) -> list[int]:
    """Record the number of states each full pricing of ``planner`` holds."""
    sizes: list[int] = []
    batch = planner._batch

    def counted(vecs, dps):
        sizes.append(len(vecs))
        return batch(vecs, dps)

    planner._batch = counted
    return sizes


def _forced_states(planner: NeoPlanner) -> list:
    """The state of every forced sharding type's plan that fits (far apart in cost)."""
    states = []
    for kind in ShardingType:
        try:
            plan = plan_forced(kind, planner.workload, planner.system, planner.cost)
        except ValueError:
            continue
        states.append(planner._adopt(plan))
    return states


@pytest.mark.parametrize("order", ["as made", "reversed"])
def test_the_best_of_a_batch_is_the_same_with_the_hopeless_states_unpriced(order):
    s, w = small_system(), heavy_workload()
    pruned, full = NeoPlanner(w, s, workers=1), NeoPlanner(w, s, workers=1, prune=False)
    states = _forced_states(full)
    if order == "reversed":
        states = states[::-1]
    assert len(states) >= 4
    # the reference: every state priced on its own
    alone = np.array([full.cost.iteration_s_batch(st.vec[None], [st.dp_bytes])[0] for st in states])
    sizes_pruned, sizes_full = _priced(pruned), _priced(full)
    got, want = pruned._first_best(states), full._first_best(states)
    assert got == want
    assert got[0] == int(np.argmin(alone)) and got[1][0] == alone.min()
    assert sum(sizes_full) == len(states)
    # the case prunes: some states are left unpriced, and none of them is remembered
    assert sum(sizes_pruned) < len(states)
    quick = pruned.cost.iteration_s_batch(np.stack([st.vec for st in states]), [st.dp_bytes for st in states],
                                          contention=False)
    assert (alone >= quick).all()   # (the bound the pruning stands on, on these states)
    for st, q in zip(states, quick):
        known = pruned._score_key(st.vec, st.dp_bytes) in pruned._scores
        assert known == (q <= 2.0 * alone.min())
    # a state asked for (``first``) is priced even where hopeless
    worst = int(np.argmax(quick))
    again = NeoPlanner(w, s, workers=1)
    assert again._first_best(states, first=(worst,)) == want
    assert again._score_key(states[worst].vec, states[worst].dp_bytes) in again._scores


def test_a_batch_of_close_states_is_priced_at_once():
    s, w = small_system(), skewed_workload()
    p = NeoPlanner(w, s, workers=1)
    p.greedy()
    base = p.state
    states = [base.copy() for _ in range(3)]
    for k, st in enumerate(states):
        st.vec[0] *= 1 + 0.01 * k  # a little more forward compute on every rank
    sizes = _priced(p)
    assert p._first_best(states)[0] == 0
    assert sizes == [3]


@pytest.mark.parametrize("reverse", [False, True])
def test_the_states_near_the_best_are_priced_after_the_plausible_ones(reverse):
    """States whose figure without contention is within twice the lowest are priced first;
    of the others, those within twice the best full figure of the first then; the rest not at
    all."""
    s, w = small_system(), skewed_workload()
    p = NeoPlanner(w, s, workers=1)
    p.greedy()
    states = []
    for k in (1.0, 2.5, 3.4, 6.0):   # the compute of every rank k times
        st = p.state.copy()
        st.vec[:2] *= k
        states.append(st)
    if reverse:
        states = states[::-1]
    vecs, dps = np.stack([st.vec for st in states]), [st.dp_bytes for st in states]
    quick = p.cost.iteration_s_batch(vecs, dps, contention=False)
    full = p.cost.iteration_s_batch(vecs, dps)
    sure = quick <= 2.0 * quick.min()
    second = ~sure & (quick <= 2.0 * full[sure].min())
    assert sure.sum() == 2 and second.sum() == 1 and (~sure & ~second).sum() == 1   # (the case's shape)
    sizes = _priced(p)
    best = p._first_best(states)
    assert best[0] == int(np.argmin(full)) and best[1][0] == full.min()
    assert sizes == [2, 1]
    known = [p._score_key(st.vec, st.dp_bytes) in p._scores for st in states]
    assert known == (sure | second).tolist()
    for st, f in zip(states, full):   # each priced state remembered with its own figure
        key = p._score_key(st.vec, st.dp_bytes)
        if key in p._scores:
            assert p._scores[key][0] == f


@pytest.mark.parametrize("workload", [heavy_workload, skewed_workload])
def test_the_plan_is_the_same_with_and_without_pruning(workload):
    s, w = small_system(), workload()
    ref = NeoPlanner(w, s, workers=1, prune=False)
    ref_sizes = _priced(ref)
    plan = ref.run()
    fast = NeoPlanner(w, s, workers=1)
    sizes = _priced(fast)
    assert fast.run() == plan
    assert fast.moves == ref.moves and fast.stats["start"] == ref.stats["start"]
    assert fast.stats["greedy_cost_s"] == ref.stats["greedy_cost_s"]
    assert fast.stats["refine_steps"] == ref.stats["refine_steps"]
    assert fast._ranked_starts[0][0] == ref._ranked_starts[0][0] and len(fast._ranked_starts) == 1
    if workload is heavy_workload:
        assert sum(sizes) < sum(ref_sizes)  # fewer states priced in full


def test_prune_is_a_flag():
    with pytest.raises(ValueError, match="prune"):
        NeoPlanner(skewed_workload(), small_system(), prune=1)
