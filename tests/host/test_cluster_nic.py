"""The SmartNIC system end to end (tiny): each mechanism switched on and off alone."""

from __future__ import annotations

import json

import numpy as np
import pytest

from neonic.host.cluster import ClusterRun, scenario_from_dict
from neonic.host.report import summary_table, write_results

OFF = {"local_cache_mib": 0.0, "remote_cache_mib": 0.0, "pool_on_nic": False, "reorder": False}


def tiny(nic: dict | None = None, mode: str = "training") -> dict:
    return {
        "scenario": {"name": "tiny-nic", "iterations": 1, "warmup": 1, "mode": mode},
        "cluster": {"nodes": 2},
        "workload": {
            "name": "tiny",
            "batch_per_gpu": 64,
            "synthesize": {"count": 16, "total_params": 2e7, "dim_min": 16, "dim_max": 64, "dim_avg": 32,
                           "dim_multiple": 4, "pooling_mean": 8, "seed": 3},
            "dense": {"bottom_mlp": [64, 256, 32], "interaction": "dot", "top_mlp": [256, 128, 1]},
        },
        "system": {"preset": "smartnic", "nic": {"trace_samples": 128, "local_cache_mib": 1.0,
                                                 "remote_cache_mib": 1.0, **(nic or {})}},
        "planner": {"max_steps": 20},
    }


def run(nic: dict | None = None, mode: str = "training") -> ClusterRun:
    cr = ClusterRun(scenario_from_dict(tiny(nic, mode)))
    cr.result = cr.run()
    return cr


@pytest.fixture(scope="module")
def everything():
    return run()


@pytest.fixture(scope="module")
def nothing():
    return run(OFF)


def beyond_hbm(nic: dict | None = None, mode: str = "training", system: str = "smartnic-fpga",
               alpha: float = 0.7) -> ClusterRun:
    """Tables of ~1.2x the HBM of 4 GPUs (host DRAM behind the HBM cache), skew 0.7: misses of
    the HBM cache cross PCIe, the regime the SmartNIC system was built for."""
    data = {
        "scenario": {"name": "beyond-hbm", "iterations": 1, "warmup": 1, "mode": mode},
        "cluster": {"nodes": 2, "gpus_per_node": 2},
        "workload": {"name": "big", "batch_per_gpu": 256,
                     "tables": [{"name": f"t{i}", "rows": 80_000_000, "dim": 64, "pooling": 20.0} for i in range(8)],
                     "dense": {"bottom_mlp": [64, 128, 64], "interaction": "dot", "top_mlp": [128, 1]}},
        "system": {"preset": system, **({"nic": nic} if nic is not None else {})},
        "planner": {"max_steps": 10},
        "lookups": {"alpha": alpha},
    }
    if system == "zionex":
        data["system"] = {"preset": "zionex"}
    cr = ClusterRun(scenario_from_dict(data))
    cr.result = cr.run()
    return cr


@pytest.fixture(scope="module")
def regime_plain():
    return beyond_hbm(system="zionex")


@pytest.fixture(scope="module")
def regime_local():
    return beyond_hbm({**OFF, "local_cache_mib": 4096.0, "pool_on_nic": True})


def test_smartnic_run_writes_results_with_nic_tracks_and_hit_rates(regime_local, tmp_path):
    res = regime_local.result
    out = write_results(res, tmp_path / "r")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["system"] == "smartnic-fpga"
    assert 0 < metrics["cache_hit_rates"]["nic_local"] <= 1
    assert metrics["utilization"]["nic_gather"] > 0
    trace = json.loads((out / "trace.json").read_text())
    procs = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    nic_threads = {e["args"]["name"] for e in trace["traceEvents"]
                   if e["ph"] == "M" and e["name"] == "thread_name" and procs[e["pid"]].startswith("nic")}
    assert nic_threads == {"cache", "gather", "packetizer"}  # one track per NIC unit
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X" and procs[e["pid"]] == "nic0"]
    assert {e["cat"] for e in spans} == {"cache", "gather", "packetizer"}
    from rich.console import Console

    console = Console(record=True, width=120)
    console.print(summary_table(res))
    assert "cache hit rate: nic_local" in console.export_text()


def test_with_every_mechanism_off_the_nic_changes_no_work(nothing):
    nic = nothing.nic_effects
    assert nothing.result.metrics["cache_hit_rates"] == {}
    for name, matrix in nothing.work.matrices.items():
        assert np.array_equal(nic.matrices[name], matrix), name
    assert [sum(x) for x in nic.gpu_lookups] == [sum(k.lookups for k in ks) for ks in nothing.work.kernels]
    assert not nic.fwd_pcie_bytes.any() and not nic.bwd_pcie_bytes.any()
    assert all(dict(u).keys() <= {"cache"} for u in nic.fwd_units)  # nothing to gather


def test_hbm_resident_tables_keep_their_lookups_on_the_gpu(nothing):
    """Tables in HBM (1.5 TB/s): a NIC cache behind a 16 GB/s datapath would stretch the
    embedding forward, so the cost split sends no shard to it and the run is the plain NIC's;
    the figures name the resource that refused the offload."""
    on = run({**OFF, "local_cache_mib": 1.0, "pool_on_nic": True})
    figures = on.result.metrics["nic"]
    assert figures["local_cache_shards"] > 0 and figures["local_cache_shards_on_nic"] == 0
    assert figures["local_cache_refused_by"] in ("NIC datapath", "NIC memory")
    assert [sum(x) for x in on.nic_effects.gpu_lookups] == [sum(x) for x in nothing.nic_effects.gpu_lookups]
    assert on.result.metrics["iteration_time_s"] == pytest.approx(nothing.result.metrics["iteration_time_s"], rel=1e-9)


def test_beyond_hbm_the_local_cache_serves_hbm_misses_and_cuts_pcie_bytes(regime_plain, regime_local):
    """Behind the HBM cache, the NIC holds the next-hottest rows: the lookups it serves no
    longer fetch rows over PCIe, only partial pools come back, and the run is faster."""
    nic = regime_local.nic_effects
    figures = regime_local.result.metrics["nic"]
    assert figures["host_tier_shards"] > 0 and figures["local_cache_shards_on_nic"] > 0
    plain_miss = regime_plain.tier_miss_bytes.sum()
    assert nic.tier_fwd_bytes.sum() + nic.tier_bwd_bytes.sum() < plain_miss
    pcie = lambda cr: cr.result.metrics["memory_tiers"]["pcie"]["bytes"]  # noqa: E731
    assert pcie(regime_local) < pcie(regime_plain)
    assert figures["bottleneck_before"] == "PCIe"
    assert regime_local.result.metrics["samples_per_s"] > regime_plain.result.metrics["samples_per_s"]


def test_with_every_mechanism_off_beyond_hbm_the_smartnic_is_the_plain_nic(regime_plain):
    off = beyond_hbm(OFF)
    assert off.result.metrics["samples_per_s"] == pytest.approx(regime_plain.result.metrics["samples_per_s"], rel=0.01)


def test_the_split_is_by_cost_a_slow_nic_memory_gets_no_shard(regime_local):
    """The same cache behind 0.5 GB/s of NIC memory would take longer than the PCIe fetches it
    saves: the split keeps every lookup on the GPU and names the NIC's memory."""
    slow = beyond_hbm({**OFF, "local_cache_mib": 4096.0, "pool_on_nic": True, "memory_gbytes_per_s": 0.5})
    figures = slow.result.metrics["nic"]
    assert figures["local_cache_shards_on_nic"] == 0
    assert figures["local_cache_refused_by"] == "NIC memory"
    assert regime_local.result.metrics["nic"]["local_cache_shards_on_nic"] > 0


def test_without_pooling_on_the_nic_rows_cross_pcie_and_nothing_is_saved(regime_plain):
    """Unpooled, the NIC's hits go to the GPU as rows over the same PCIe link: no bytes saved,
    so the split leaves the lookups on the GPU."""
    rows = beyond_hbm({**OFF, "local_cache_mib": 4096.0, "pool_on_nic": False})
    assert rows.result.metrics["nic"]["local_cache_shards_on_nic"] == 0
    assert rows.result.metrics["samples_per_s"] == pytest.approx(regime_plain.result.metrics["samples_per_s"], rel=0.01)


def test_remote_cache_in_inference_serves_hot_remote_rows_on_the_requesters_nic():
    """Tables too large to replicate (8x the cluster's HBM), inference: the requesters' NICs
    hold hot rows of other nodes' tables and pool them; their indices never cross the network
    and the owners gather fewer rows. Unpooled, the hits would cross PCIe as rows: refused."""
    from neonic.host.experiments import experiment_config
    from neonic.host.experiments.smartnic_map import _scenario, workload

    cfg = experiment_config("smartnic_map", "tiny")
    wl = workload(cfg, 8.0)

    def remote(nic: dict) -> ClusterRun:
        cr = ClusterRun(scenario_from_dict(_scenario(cfg, wl, {"preset": "smartnic-fpga", "nic": nic}, 0.6, "inference")))
        cr.result = cr.run()
        return cr

    base, pooled = remote(OFF), remote({**OFF, "remote_cache_mib": 4096.0, "pool_on_nic": True})
    rows = remote({**OFF, "remote_cache_mib": 4096.0})
    node = np.arange(4) // 2
    inter = node[:, None] != node[None, :]
    assert pooled.result.metrics["nic"]["remote_cache_tables_on_nic"] > 0
    assert 0 < pooled.result.metrics["cache_hit_rates"]["nic_remote"] < 1
    assert pooled.nic_effects.matrices["input"][inter].sum() < base.nic_effects.matrices["input"][inter].sum()
    # the plan's own matrices are left as they were (the NICs' changes are on copies)
    from neonic.host.planner.work import derive_iteration

    again = derive_iteration(pooled.plan, pooled.scenario.workload, pooled.planner_system).matrices
    assert all(np.array_equal(again[k], pooled.work.matrices[k]) for k in again)
    assert not np.array_equal(pooled.nic_effects.matrices["input"], pooled.work.matrices["input"])
    assert sum(map(sum, pooled.nic_effects.gpu_lookups)) < sum(map(sum, base.nic_effects.gpu_lookups))
    assert rows.result.metrics["nic"]["remote_cache_tables_on_nic"] == 0


def test_an_soc_nic_runs_the_kernels_on_its_cores():
    """smartnic-soc (BlueField-2 class): kernels on 8 Arm cores bounded by 25.6 GB/s of DDR4;
    its packets are framed by the hardware NIC, so no packetizer time on the AlltoAll path."""
    cr = beyond_hbm({"local_cache_mib": 4096.0, "remote_cache_mib": 0.0}, system="smartnic-soc")
    assert cr.nic_effects.cfg.kernels == "cores" and cr.nic_effects.cfg.cores == 8
    ops = [op for op in cr.result.graph.ops if op.phase == "pooled_a2a"]
    assert all(op.payload.nic_ps is None or max(op.payload.nic_ps) == 0 for op in ops)
    assert cr.result.metrics["nic"]["kernels"] == "cores"


def test_reorder_alone_changes_nothing_and_with_a_cache_reports_its_reuse(nothing):
    alone = run({**OFF, "reorder": True})
    assert alone.result.metrics["iteration_time_s"] == nothing.result.metrics["iteration_time_s"]
    with_cache = run({**OFF, "reorder": True, "local_cache_mib": 1.0})
    figures = with_cache.result.metrics["nic"]
    assert figures["reorder"] is True
    assert figures["adjacent_reuse_reordered"] >= figures["adjacent_reuse"]


def test_smartnic_packetizer_sits_on_the_alltoall_path(everything):
    ops = [op for op in everything.result.graph.ops if op.phase == "pooled_a2a"]
    assert all(op.payload.nic_ps is not None and max(op.payload.nic_ps) > 0 for op in ops)


def test_smartnic_runs_are_deterministic():
    a = run().result.metrics
    b = run().result.metrics
    assert a["iteration_time_s"] == b["iteration_time_s"]
    assert a["cache_hit_rates"] == b["cache_hit_rates"]


def _bandwidth_bound(nic: dict, mode: str = "training", system: str = "smartnic") -> ClusterRun:
    """The tiny scenario at 2048 samples per GPU: its AlltoAlls are long enough to be bound by
    bandwidth (the port's or the packetizers')."""
    data = tiny(nic, mode)
    data["workload"]["batch_per_gpu"] = 2048
    if system != "smartnic":
        data["system"] = {"preset": system}
    cr = ClusterRun(scenario_from_dict(data))
    cr.result = cr.run()
    return cr


def _a2a_ps(cr: ClusterRun) -> int:
    """Time spent in the iteration's AlltoAlls (the index, pooled and gradient ones), summed."""
    return sum(op.end - op.start for op in cr.result.graph.ops if op.phase in ("input_a2a", "pooled_a2a", "grad_a2a"))


@pytest.mark.parametrize("mode", ["training", "inference"])
def test_with_every_mechanism_off_the_smartnic_system_is_the_plain_nic(mode):
    """The fair baseline: the same cluster, line rate and memory placement; the SmartNIC with
    nothing on only frames the AlltoAll bytes, and its packetizers (two of 128 Gb/s) keep up
    with the 200 Gb/s port, so throughput is the plain RDMA NIC's within 1%."""
    off = _bandwidth_bound(OFF, mode)
    plain = _bandwidth_bound(OFF, mode, system="zionex")
    assert off.result.metrics["samples_per_s"] == pytest.approx(plain.result.metrics["samples_per_s"], rel=0.01)


def test_one_packetizer_short_of_the_line_rate_slows_the_alltoall():
    """One 128 Gb/s packetizer behind a 200 Gb/s port: the AlltoAlls wait for the framing."""
    one, two = _bandwidth_bound({**OFF, "packetizers": 1}), _bandwidth_bound(OFF)
    assert _a2a_ps(one) > 1.1 * _a2a_ps(two)
    assert one.result.metrics["samples_per_s"] < two.result.metrics["samples_per_s"]
