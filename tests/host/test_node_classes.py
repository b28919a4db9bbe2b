"""Discrete and APU nodes: the host-memory tier follows the node's CPU-GPU link (PCIe on
ZionEX, NVLink-C2C on GH200, one shared pool of HBM on MI300A), in the planner and in the
simulated run alike, and each new system runs from its preset."""

from __future__ import annotations

import json

import pytest

from neonic.host.cli import main
from neonic.host.cluster import ClusterRun, scenario_from_dict
from neonic.host.systems import preset, resolve_system
from neonic.sim.memory_tiers import host_transfer_s


def spill(system: dict, tables: int = 8, gpus_per_node: int = 2) -> dict:
    """``tables`` tables of 200M rows x 64 FP16 (~26 GB each with state) on 2 nodes: more than
    the GPUs' HBM, so the planner puts shards in host memory; a batch large enough (4096 x 40
    lookups per table) that the cache's misses, not the kernel, decide the embedding forward."""
    return {
        "scenario": {"name": "spill", "iterations": 1, "warmup": 1},
        "cluster": {"nodes": 2, "gpus_per_node": gpus_per_node},
        "workload": {"name": "spill", "batch_per_gpu": 4096,
                     "tables": [{"name": f"t{i}", "rows": 200_000_000, "dim": 64, "dtype": "fp16",
                                 "pooling": 40.0} for i in range(tables)],
                     "dense": {"bottom_mlp": [64, 128, 64], "interaction": "dot", "top_mlp": [128, 1]}},
        "system": system,
        "planner": {"max_steps": 10},
    }


def run(data: dict) -> ClusterRun:
    cr = ClusterRun(scenario_from_dict(data))
    cr.result = cr.run()
    return cr


def emb_fwd_s(cr: ClusterRun) -> float:
    """The slowest rank's embedding forward (s), mean over the measured iterations."""
    sc, g = cr.scenario, cr.result.graph
    its = range(sc.warmup, sc.warmup + sc.iterations)
    return max(sum(g.get("emb_fwd", it, r).end - g.get("emb_fwd", it, r).start for it in its)
               / len(its) for r in range(g.num_ranks)) * 1e-12


@pytest.mark.parametrize("name,link", [("zionex", "pcie"), ("gh200", "c2c"), ("mi300a", "shared_hbm")])
def test_each_preset_says_how_its_nodes_reach_host_memory(name, link):
    assert preset(name).host.link == link


def test_a_row_in_host_memory_costs_less_over_nvlink_c2c_than_over_pcie():
    zionex, gh200 = preset("zionex"), preset("gh200")
    assert gh200.host_link_gbytes_per_s == 450.0 and zionex.host_link_gbytes_per_s == 25.0
    gib = 2.0**30
    assert host_transfer_s(gib, "dram", gh200.host_link_gbytes_per_s * 1e9, 1e9) < \
        host_transfer_s(gib, "dram", zionex.host_link_gbytes_per_s * 1e9, 1e9) / 10


@pytest.fixture(scope="module")
def pcie_and_c2c():
    """The same model and GPUs, the host link swapped: PCIe (ZionEX) or NVLink-C2C."""
    pcie = run(spill({"preset": "zionex"}))
    c2c = run(spill({"preset": "zionex", "host": {"link": "c2c", "link_gbytes_per_s": 450.0}}))
    return pcie, c2c


def test_the_simulated_embedding_forward_follows_the_link(pcie_and_c2c):
    pcie, c2c = pcie_and_c2c
    for cr in pcie_and_c2c:
        assert cr.result.metrics["memory_tiers"]["shards"]["dram"] > 0
    # the same plan moves the same miss bytes; over the faster link they take less time
    assert c2c.tier_miss_bytes.sum() == pytest.approx(pcie.tier_miss_bytes.sum())
    assert c2c.result.metrics["memory_tiers"]["link"] == "c2c"
    assert emb_fwd_s(c2c) < emb_fwd_s(pcie)


def test_the_planner_prices_the_tier_at_the_links_bandwidth(pcie_and_c2c):
    from neonic.host.planner.cost import CostModel

    for cr in pcie_and_c2c:
        psys = cr.planner_system
        assert psys.host_link_bytes_per_s == pytest.approx(cr.scenario.system.host_link_gbytes_per_s * 1e9)
        cost = CostModel(cr.scenario.workload, psys).evaluate(cr.plan)
        for r, ks in enumerate(cr.work.kernels):
            miss = sum(k.miss_bytes for k in ks if k.tier == "dram")
            assert cost.columns["host_transfer"][r] == pytest.approx(
                host_transfer_s(miss, "dram", psys.host_link_bytes_per_s, 1.0))


def test_on_shared_hbm_host_tier_rows_are_read_in_place_from_the_gpus_own_hbm():
    """MI300A: a model beyond the GPUs' share of the HBM puts shards in the CPU side's share of
    the same HBM (here 2 x 96 GiB given to embeddings). Nothing is copied: no HBM cache, no miss
    bytes, nothing on the host link for them; those shards' rows are HBM traffic of the embedding
    kernel itself, so they cost what an HBM shard with the same lookups costs."""
    mi = run(spill({"preset": "mi300a", "host": {"dram_gib_per_node": 192}}, tables=18))
    tiers = mi.result.metrics["memory_tiers"]
    assert tiers["link"] == "shared_hbm" and tiers["shards"]["dram"] > 0
    assert tiers["cache"]["hit_rate"] is None and tiers["cache"]["load_factor"] is None
    assert mi.tier_miss_bytes.sum() == 0
    assert tiers["pcie"]["bytes_by_kind"].get("tier_miss", 0.0) == 0.0
    from dataclasses import replace

    from neonic.host.iteration import shard_kernel_s

    gpu = mi.scenario.system.gpu_spec
    link = mi.planner_system.host_link_bytes_per_s
    for ks in mi.work.kernels:
        for k in ks:
            if k.tier == "dram":
                as_hbm = shard_kernel_s(gpu, replace(k, tier="hbm"), link, 1e9)
                fwd, bwd, host = shard_kernel_s(gpu, k, link, 1e9)
                assert host == 0.0 and (fwd, bwd) == as_hbm[:2]
                assert k.hbm_bytes == 0.0   # no cache lines: the rows are counted as host bytes
    # on ZionEX the same kind of shard pays for its misses over PCIe
    zx = run(spill({"preset": "zionex"}))
    assert zx.tier_miss_bytes.sum() > 0


def test_a_c2c_link_needs_its_bandwidth_and_a_pcie_link_takes_none():
    with pytest.raises(ValueError, match=r"system\.host\.link_gbytes_per_s: a c2c link needs"):
        resolve_system({"preset": "zionex", "host": {"link": "c2c"}})
    with pytest.raises(ValueError, match=r"system\.host\.link_gbytes_per_s: a pcie link"):
        resolve_system({"preset": "zionex", "host": {"link_gbytes_per_s": 100.0}})
    with pytest.raises(ValueError, match=r"system\.host\.link: expected one of pcie, c2c, shared_hbm"):
        resolve_system({"preset": "zionex", "host": {"link": "cxl"}})


@pytest.mark.parametrize("name", ["gh200-small", "mi300a-small"])
def test_neonic_run_runs_each_new_system(name, tmp_path, capsys):
    assert main(["run", "--preset", name, "--quiet", "--out", str(tmp_path)]) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["samples_per_s"] > 0
    system = name.split("-")[0]
    assert (tmp_path / "config.toml").read_text().count(f'network = "{system}"') == 1


def test_the_node_classes_experiment_tabulates_and_plots_each_system(tmp_path):
    """Tiny size: model-a grown past HBM on 16 GPUs of each class, SmartNIC off and on. ZionEX
    and GH200 put part of it in host memory behind the HBM cache; MI300A has no memory beyond
    its HBM and says how much is missing; placement.csv says where every table lives."""
    import csv

    from neonic.host.experiments import run_experiment

    out = tmp_path / "nc"
    result = run_experiment("node_classes", out, size="tiny")
    rows = {(r["system"], r["smartnic"]): r for r in result.rows}
    assert set(rows) == {(s, n) for s in ("zionex", "gh200", "mi300a") for n in (False, True)}
    for system, link in (("zionex", "pcie"), ("gh200", "c2c")):
        r = rows[system, False]
        assert r["fits"] and r["link"] == link and r["host_tables"] > 0 and 0 < r["hbm_cache_hit_rate"] < 1
        assert rows[system, True]["nic_local_hit_rate"] is not None
    assert not rows["mi300a", False]["fits"] and "GiB missing" in rows["mi300a", False]["note"]
    with (out / "placement.csv").open(newline="") as fh:
        placed = list(csv.DictReader(fh))
    assert {p["system"] for p in placed} == {"zionex", "gh200"}
    assert any("dram" in p["tiers"] for p in placed) and all(p["tiers"] for p in placed)
    for name in ("throughput.png", "exposed_comm.png", "hit_rate.png", "tiers.png"):
        assert (out / name).stat().st_size > 1000
    assert "past-hbm.gh200_over_zionex" in result.metrics
