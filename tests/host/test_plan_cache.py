"""Plans kept by their inputs: the same inputs plan once and give the same run; any change of an
input, or a wall-clock budget, plans afresh; a damaged file is re-planned, never trusted."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from neonic.host.cluster import ClusterRun, scenario_from_dict
from neonic.host.planner.cache import PlanCache, Unfingerprintable, fingerprint, use_plan_cache
from neonic.host.planner.plan_io import plan_to_dict

SCENARIO = {
    "scenario": {"name": "cache", "iterations": 1, "warmup": 1},
    "cluster": {"nodes": 2, "gpus_per_node": 4},
    "workload": {"preset": "dlrm-kaggle", "batch_per_gpu": 256},
    "system": {"preset": "zionex"},
    "planner": {"max_steps": 5},
}


@dataclass(frozen=True)
class _Spec:
    name: str
    sizes: np.ndarray
    memo: dict = field(default_factory=dict, compare=False)


def test_fingerprints_are_by_value_and_see_every_compared_field():
    a = _Spec("t", np.arange(4))
    assert fingerprint(a) == fingerprint(_Spec("t", np.arange(4)))
    assert fingerprint(a) != fingerprint(_Spec("t", np.arange(1, 5)))
    assert fingerprint(a) != fingerprint(_Spec("u", np.arange(4)))
    assert fingerprint(a) != fingerprint(_Spec("t", np.arange(4, dtype=np.int32)))  # the dtype counts
    # a field outside equality (a memo) is not an input
    assert fingerprint(a) == fingerprint(_Spec("t", np.arange(4), memo={"x": 1}))
    assert fingerprint({"a": 1, "b": 2.0}) == fingerprint({"b": 2.0, "a": 1})
    assert fingerprint(0.1) != fingerprint(float(np.nextafter(0.1, 1.0)))  # floats to the last bit
    assert fingerprint((1,)) != fingerprint([1])


def test_a_closure_is_identified_by_what_it_captured():
    def make(k):
        return lambda x: x * k

    assert fingerprint(make(2)) == fingerprint(make(2))
    assert fingerprint(make(2)) != fingerprint(make(3))


def test_an_object_of_unknown_kind_cannot_be_fingerprinted():
    class Opaque:
        pass

    with pytest.raises(Unfingerprintable, match="Opaque"):
        fingerprint(Opaque())


def _plan(data):
    """The plan a run of ``data`` would execute (planning only, no simulation)."""
    runner = ClusterRun(scenario_from_dict(data))
    return runner._plan(runner._topology())[0]


@pytest.fixture(scope="module")
def fresh():
    runner = ClusterRun(scenario_from_dict(SCENARIO))
    return runner, runner.run()


def test_runs_that_share_their_planning_inputs_plan_once_and_run_identically(fresh, tmp_path):
    runner, result = fresh
    cache = PlanCache(tmp_path)
    with use_plan_cache(cache):
        first = ClusterRun(scenario_from_dict(SCENARIO))
        r1 = first.run()
        # another name, which the planner does not read: the same plan
        second = ClusterRun(scenario_from_dict(dict(SCENARIO, scenario=dict(SCENARIO["scenario"], name="again"))))
        r2 = second.run()
    assert (cache.misses, cache.hits) == (1, 1)
    assert first.plan == second.plan == runner.plan
    assert r1.metrics["iteration_time_s"] == r2.metrics["iteration_time_s"] == result.metrics["iteration_time_s"]
    # another process (a new cache on the same folder) reads the plan from disk
    other = PlanCache(tmp_path)
    with use_plan_cache(other):
        third = ClusterRun(scenario_from_dict(SCENARIO))
        r3 = third.run()
    assert (other.misses, other.hits) == (0, 1)
    assert plan_to_dict(third.plan) == plan_to_dict(runner.plan)
    assert r3.metrics["phase_serialized_s"] == result.metrics["phase_serialized_s"]


def test_a_changed_input_plans_afresh(tmp_path):
    cache = PlanCache(tmp_path)
    with use_plan_cache(cache):
        _plan(SCENARIO)
        _plan(dict(SCENARIO, planner={"max_steps": 6}))
        _plan(dict(SCENARIO, cluster={"nodes": 2, "gpus_per_node": 2}))
        _plan(dict(SCENARIO, system={"preset": "zion"}))
    assert (cache.misses, cache.hits) == (4, 0)


def test_the_iterations_a_run_measures_are_not_a_planning_input(tmp_path):
    # plans are priced on a fixed window (PLAN_WINDOW) whatever a run warms up and measures, so a
    # longer run takes the cached plan, and it is the plan that planning afresh gives it
    longer = dict(SCENARIO, scenario=dict(SCENARIO["scenario"], warmup=2, iterations=3))
    cache = PlanCache(tmp_path)
    with use_plan_cache(cache):
        _plan(SCENARIO)
        cached = _plan(longer)
    assert (cache.misses, cache.hits) == (1, 1)
    assert plan_to_dict(cached) == plan_to_dict(_plan(longer))


def test_a_slowed_link_is_an_input(fresh):
    runner, _ = fresh
    topo = runner.topology
    key = fingerprint(topo)
    topo.capacity[0] *= 0.5
    try:
        assert fingerprint(topo) != key
    finally:
        topo.capacity[0] *= 2.0


def test_a_plan_under_a_wall_clock_budget_is_never_cached(tmp_path):
    cache = PlanCache(tmp_path)
    calls = []

    def make():
        calls.append(1)
        return "plan"

    for _ in range(2):
        assert cache.plan("workload", "system", "neo", 5, 1.0, make) == "plan"
    assert len(calls) == 2 and not list(tmp_path.iterdir())


def test_a_damaged_plan_file_is_replanned(fresh, tmp_path):
    runner, _ = fresh
    with use_plan_cache(PlanCache(tmp_path)):
        _plan(SCENARIO)
    (path,) = tmp_path.glob("*.json")
    path.write_text('{"format": "broken"', encoding="utf-8")
    cache = PlanCache(tmp_path)
    with use_plan_cache(cache):
        again = _plan(SCENARIO)
    assert (cache.misses, cache.hits) == (1, 0)
    assert again == runner.plan
