"""Memory tiers in cluster runs: DRAM behind the HBM cache only when HBM runs out, misses on
the one PCIe model, planner and simulator on the same costs."""

from __future__ import annotations

import numpy as np
import pytest

from neonic.host.cluster import ClusterRun, scenario_from_dict, scenario_preset
from neonic.sim.network.topology import LINK_CLASSES


def big(policy: str = "lru") -> dict:
    """8 tables of 200M rows x 64 FP16 (~211 GB with state) on 4 GPUs of 40 GB."""
    return {
        "scenario": {"name": "big", "iterations": 1, "warmup": 1},
        "cluster": {"nodes": 2, "gpus_per_node": 2},
        "workload": {"name": "big", "batch_per_gpu": 256,
                     "tables": [{"name": f"t{i}", "rows": 200_000_000, "dim": 64, "dtype": "fp16", "pooling": 10.0}
                                for i in range(8)],
                     "dense": {"bottom_mlp": [64, 128, 64], "interaction": "dot", "top_mlp": [128, 1]}},
        "system": {"preset": "zionex", "host": {"cache_policy": policy}},
        "planner": {"max_steps": 10},
    }


@pytest.fixture(scope="module")
def big_run():
    cr = ClusterRun(scenario_from_dict(big()))
    cr.result = cr.run()
    return cr


def test_a_model_beyond_hbm_lives_in_dram_behind_the_cache_and_misses_cross_pcie(big_run):
    m = big_run.result.metrics
    tiers = m["memory_tiers"]
    assert tiers["shards"]["dram"] > 0 and tiers["bytes"]["dram"] > 0
    cache = tiers["cache"]
    assert cache["ways"] == 32 and cache["policy"] == "lru"
    assert 0 < cache["hit_rate"] < 1 and cache["misses_per_iteration"] > 0
    assert tiers["pcie"]["bytes_by_kind"]["tier_miss"] == pytest.approx(2 * cache["miss_bytes_per_iteration"])
    assert any(k.endswith("/pcie") for k in big_run.result.tracks)


def test_pcie_bytes_and_utilisation_come_from_one_model_and_agree(big_run):
    m = big_run.result.metrics
    pcie = m["memory_tiers"]["pcie"]
    assert pcie["bytes"] == pytest.approx(m["link_class_bytes"]["pcie"])
    assert pcie["bytes"] == pytest.approx(sum(pcie["bytes_by_kind"].values()), rel=1e-9)
    topo = big_run.topology
    links = int(np.count_nonzero(topo.link_class[: topo.num_links] == LINK_CLASSES.index("pcie")))
    cap = topo.config.host_link.bandwidth_gbps / 8 * 1e9
    elapsed = m["simulated_time_s"]
    assert m["utilization"]["pcie"] == pytest.approx(pcie["bytes"] / (links * cap * elapsed), rel=1e-6)
    assert m["utilization"]["pcie"] > 0


def test_planner_and_simulator_cost_the_tier_the_same_way(big_run):
    from neonic.host.planner.cost import CostModel
    from neonic.sim.memory_tiers import host_transfer_s

    psys = big_run.planner_system
    cost = CostModel(big_run.scenario.workload, psys).evaluate(big_run.plan)
    for r, ks in enumerate(big_run.work.kernels):
        miss = sum(k.miss_bytes for k in ks if k.tier == "dram")
        assert cost.columns["host_transfer"][r] == pytest.approx(
            host_transfer_s(miss, "dram", psys.host_link_bytes_per_s, 1.0))
    assert big_run.tier_miss_bytes.sum() == pytest.approx(sum(k.miss_bytes for ks in big_run.work.kernels for k in ks))


def test_lfu_hits_more_than_lru_on_zipf_lookups():
    from neonic.host.cluster import _memory_tiers
    from neonic.host.planner.system import PlannerSystem

    sc = scenario_from_dict(big("lfu"))
    cr = ClusterRun(sc)
    topo = cr._topology()
    plan, psys = cr._plan(topo)
    t = sc.workload.tables[0]
    lfu = psys.tier_hit_rate(t)
    lru = PlannerSystem(gpu=psys.gpu, comm=psys.comm, memory=_memory_tiers(scenario_from_dict(big()).system, topo),
                        lookups=psys.lookups).tier_hit_rate(t)
    assert lfu > lru


def test_dram_only_when_hbm_runs_out():
    cr = ClusterRun(scenario_preset("default"))
    m = cr.run().metrics
    assert m["memory_tiers"]["shards"]["dram"] == 0 and m["memory_tiers"]["cache"]["hit_rate"] is None
    assert m["memory_tiers"]["pcie"]["bytes_by_kind"].get("tier_miss", 0.0) == 0.0
    assert m["memory_tiers"]["pcie"]["bytes"] > 0   # the input copies


def test_a_run_that_cannot_fit_says_how_many_bytes_are_missing_where():
    data = big()
    data["system"]["host"] = {"dram_gib_per_node": 10.0}
    with pytest.raises(ValueError, match=r"GiB of host memory missing \([\d,.]+ GiB per node\)"):
        ClusterRun(scenario_from_dict(data)).run()
    data["system"]["host"] = {"dram_gib_per_node": 0.0}
    with pytest.raises(ValueError, match=r"no host memory: [\d,.]+ GiB missing"):
        ClusterRun(scenario_from_dict(data)).run()


@pytest.mark.slow
def test_model_f_at_12t_parameters_runs_on_16x8_gpus_with_dram_traffic_on_pcie():
    sc = scenario_from_dict({"scenario": {"name": "model-f", "iterations": 1, "warmup": 1}, "cluster": {"nodes": 16},
                             "workload": {"preset": "model-f"}, "system": {"preset": "zionex", "comm_dtype": "fp16"}})
    assert sc.workload.total_params == pytest.approx(12e12, rel=0.01)
    m = ClusterRun(sc).run().metrics
    assert m["gpus"] == 128 and m["memory_tiers"]["shards"]["dram"] > 0
    assert m["memory_tiers"]["pcie"]["bytes_by_kind"]["tier_miss"] > 0
    assert m["wall_s"] < 120


def test_the_planner_prices_the_embedding_ops_with_host_tier_misses_as_the_simulator_runs_them(big_run):
    """The misses overlap the fused kernel in both views (fetch in the forward, write-back in
    the backward): the planner's slowest-rank embedding phases match the simulated ops'. (The
    next batch's embedding forward no longer shares the GPU with the previous dense optimizer
    step: it waits for it, as PyTorch's program order runs it, dense.next_batch.)"""
    from neonic.host.planner.cost import CostModel

    phase = CostModel(big_run.scenario.workload, big_run.planner_system).evaluate(big_run.plan).phase_s
    graph = big_run.result.graph
    its = range(big_run.scenario.warmup, big_run.scenario.warmup + big_run.scenario.iterations)
    for name in ("emb_fwd", "emb_bwd"):
        sim = max((op.end - op.start) * 1e-12 for op in graph.ops if op.phase == name and op.iteration in its)
        assert phase[name] == pytest.approx(sim, rel=0.1), name
