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


def test_smartnic_run_writes_results_with_nic_tracks_and_hit_rates(everything, tmp_path):
    res = everything.result
    out = write_results(res, tmp_path / "r")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["system"] == "smartnic"
    assert 0 < metrics["cache_hit_rates"]["nic_local"] <= 1
    assert 0 <= metrics["cache_hit_rates"]["nic_remote"] <= 1
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


def test_local_cache_serves_hits_on_the_nic_and_cuts_gpu_memory_traffic(nothing):
    on = run({**OFF, "local_cache_mib": 1.0, "pool_on_nic": True})
    assert on.result.metrics["cache_hit_rates"]["nic_local"] > 0
    gpu_on = sum(map(sum, on.nic_effects.gpu_lookups))
    gpu_off = sum(map(sum, nothing.nic_effects.gpu_lookups))
    assert gpu_on < gpu_off
    hbm = lambda cr: sum(op.payload.gpu.hbm_bytes for op in cr.result.graph.ops if op.phase == "emb_fwd")  # noqa: E731
    assert hbm(on) < hbm(nothing)
    assert on.nic_effects.fwd_pcie_bytes.sum() > 0  # misses fill the cache over PCIe
    assert on.result.metrics["utilization"]["nic_gather"] > 0


def test_pooling_on_the_nic_sends_pooled_vectors_instead_of_rows(nothing):
    base = nothing.work.matrices["pooled"]
    pooled = run({**OFF, "local_cache_mib": 1.0, "pool_on_nic": True})
    rows = run({**OFF, "local_cache_mib": 1.0, "pool_on_nic": False})
    extra_pooled = pooled.nic_effects.matrices["pooled"].sum() - base.sum()
    extra_rows = rows.nic_effects.matrices["pooled"].sum() - base.sum()
    assert extra_rows > 0
    # inter-node partials merge on the NIC, so pooling adds only intra-node vectors
    node = np.arange(base.shape[0]) // 8
    inter = node[:, None] != node[None, :]
    assert np.allclose(pooled.nic_effects.matrices["pooled"][inter], base[inter])
    # rows cost about (rows per bag) x the vectors: the pooling factor (pooling_mean 8 here)
    per_bag = extra_rows / max(extra_pooled, 1.0)
    assert per_bag > 3
    assert rows.nic_effects.gpu_pool_bytes.sum() == pytest.approx(extra_rows)


def test_remote_cache_in_inference_cuts_input_bytes_between_nodes(nothing):
    base = run(OFF, mode="inference")
    on = run({**OFF, "remote_cache_mib": 4.0, "pool_on_nic": True}, mode="inference")
    h = on.result.metrics["cache_hit_rates"]["nic_remote"]
    assert 0 < h < 1
    node = np.arange(16) // 8
    inter = node[:, None] != node[None, :]
    got = on.nic_effects.matrices["input"][inter].sum()
    assert got == pytest.approx(base.nic_effects.matrices["input"][inter].sum() * (1 - h))
    # fewer lookups reach the owners' GPUs
    assert sum(map(sum, on.nic_effects.gpu_lookups)) < sum(map(sum, base.nic_effects.gpu_lookups))


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


def _off_node_lookups(cr: ClusterRun) -> float:
    """Forward lookups of sharded (not data-parallel) tables requested from other nodes: the
    only lookups whose indices pass an owner's NIC (2 nodes: half of every shard's)."""
    from neonic.host.planner.plan import ShardingType

    dp = {n for n, tp in cr.plan.tables.items() if tp.sharding == ShardingType.DATA_PARALLEL}
    total = 0.0
    for t in cr.scenario.workload.tables:
        if t.name not in dp:
            total += sum(k.lookups for k in cr.work.tables[t.name].kernels) * 0.5
    return total


def test_local_cache_serves_only_lookups_that_pass_the_nic(nothing):
    """Lookups from the owner's own node (NVLink) and of data-parallel replicas never pass the
    NIC, so the local cache takes from the GPU exactly its hits among off-node lookups."""
    on = run({**OFF, "local_cache_mib": 1.0, "pool_on_nic": True})
    h = on.result.metrics["cache_hit_rates"]["nic_local"]
    saved = sum(map(sum, nothing.nic_effects.gpu_lookups)) - sum(map(sum, on.nic_effects.gpu_lookups))
    assert saved == pytest.approx(h * _off_node_lookups(on), rel=1e-6)
    # pooled on the NIC, the hits' partials merge with the GPU's on the way out: no extra bytes
    assert np.array_equal(on.nic_effects.matrices["pooled"], nothing.nic_effects.matrices["pooled"])


def test_inference_local_cache_stays_warm_and_fills_nothing_over_pcie():
    """Inference tables are read-only: the cache holds profiled hot rows, is not refilled on
    misses, and nothing crosses PCIe for it; training's LRU cache fills every miss."""
    inf = run({**OFF, "local_cache_mib": 1.0, "pool_on_nic": True}, mode="inference")
    assert inf.result.metrics["cache_hit_rates"]["nic_local"] > 0
    assert not inf.nic_effects.fwd_pcie_bytes.any() and not inf.nic_effects.bwd_pcie_bytes.any()
    train = run({**OFF, "local_cache_mib": 1.0, "pool_on_nic": True})
    assert train.nic_effects.fwd_pcie_bytes.sum() > 0 and train.nic_effects.bwd_pcie_bytes.sum() > 0


def test_nic_cache_time_is_hits_streaming_rows_and_misses_probing_tags():
    """A local-cache miss is gathered by the GPU, so the cache spends one tag-probe cycle on
    it; a hit streams its row (datapath beats). Per off-node lookup: a smaller cache (fewer
    hits) takes less time, wider rows take more, and the total matches the closed form."""
    def per_lookup_cycles(local_cache_mib: float, dim: int) -> tuple[float, float]:
        data = tiny({**OFF, "local_cache_mib": local_cache_mib})
        data["workload"]["synthesize"].update(dim_min=dim, dim_max=dim, dim_avg=dim)
        # whole rows on the NIC (a column-wise plan would split them into narrower shards)
        data["planner"] = {"name": "force:table-wise"}
        cr = ClusterRun(scenario_from_dict(data))
        cr.result = cr.run()
        cache_ps = sum(dict(u).get("cache", 0) for u in cr.nic_effects.fwd_units)
        return cache_ps * 250e6 / 1e12 / _off_node_lookups(cr), cr.result.metrics["cache_hit_rates"]["nic_local"]

    base, base_hits = per_lookup_cycles(1.0, 16)            # 64-byte rows: one beat per hit
    fewer, fewer_hits = per_lookup_cycles(1 / 64, 16)
    wider, wider_hits = per_lookup_cycles(1.0, 64)          # 256-byte rows: four beats per hit
    assert fewer_hits < base_hits
    assert base == pytest.approx(1.0, rel=0.02)              # one cycle a lookup, hit or miss
    assert wider == pytest.approx(4 * wider_hits + (1 - wider_hits), rel=0.02)
    assert wider > base
    small, small_hits = per_lookup_cycles(1 / 16, 64)
    assert small_hits < wider_hits and small < wider


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
    return sum(op.end - op.start for op in cr.result.graph.ops if op.phase == "pooled_a2a")


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
