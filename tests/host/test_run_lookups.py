"""host.lookups: traces, locality statistics or Zipf drive a run's lookups; both backends
draw the same lookups for a seed; bad trace files are errors naming the table and field."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from neonic.host.cluster import ClusterRun, scenario_from_dict, scenario_preset
from neonic.host.traces import Trace, TableTrace, save_trace

ROWS = 4096


def scenario(lookups: dict | None = None, tables: list | None = None, system: str = "smartnic") -> dict:
    tables = tables or [{"name": "t0", "rows": ROWS, "dim": 128, "pooling": 8.0},
                        {"name": "t1", "rows": ROWS, "dim": 128, "pooling": 8.0}]
    data = {
        "scenario": {"name": "traced", "iterations": 1, "warmup": 1},
        "cluster": {"nodes": 2, "gpus_per_node": 2},
        "workload": {"name": "two", "batch_per_gpu": 256, "tables": tables,
                     "dense": {"bottom_mlp": [32, 64, 32], "interaction": "dot", "top_mlp": [64, 1]}},
        "system": {"preset": system, **({"nic": {"local_cache_mib": 0.02, "remote_cache_mib": 0.0,
                                                 "trace_samples": 64}} if system == "smartnic" else {})},
        "planner": {"name": "force:row-wise", "max_steps": 5},
    }
    if lookups is not None:
        data["lookups"] = lookups
    return data


def hot_trace(path: Path, batch: int = 256, hot_rows: int = 8) -> Path:
    """Every lookup of both tables on ``hot_rows`` rows at the start of the table (the first
    row shard's rows)."""
    rng = np.random.default_rng(0)
    tables = []
    for _ in range(2):
        lengths = np.full(batch, 8)
        tables.append(TableTrace(ROWS, lengths, rng.integers(0, hot_rows, int(lengths.sum()))))
    return save_trace(Trace(tuple(tables), batch), path)


def emb_fwd_s(cr: ClusterRun) -> np.ndarray:
    it = cr.scenario.warmup
    ops = [cr.result.graph.get("emb_fwd", it, r) for r in range(cr.work.world_size)]
    return np.array([(op.end - op.start) * 1e-12 for op in ops])


def run(data: dict, base: Path | None = None) -> ClusterRun:
    cr = ClusterRun(scenario_from_dict(data, base=base))
    cr.result = cr.run()
    return cr


def test_a_trace_file_drives_hit_rates_and_per_rank_embedding_work(tmp_path):
    hot_trace(tmp_path / "hot.npz")
    zipf = run(scenario())
    traced = run(scenario({"trace": "hot.npz"}), base=tmp_path)
    assert zipf.result.metrics["lookup_sources"] == {"t0": "zipf(alpha=1.15)", "t1": "zipf(alpha=1.15)"}
    assert traced.result.metrics["lookup_sources"]["t0"] == f"trace:{tmp_path / 'hot.npz'}"
    # 8 hot rows fit any cache: every lookup past the warm-up hits; Zipf's tail does not
    assert traced.result.metrics["cache_hit_rates"]["nic_local"] > 0.99
    assert zipf.result.metrics["cache_hit_rates"]["nic_local"] < 0.9
    # row-wise tables: the trace's lookups all fall on the first row shard's rank
    lookups = traced.work.lookups
    assert lookups[0] == lookups.sum()
    t_traced, t_zipf = emb_fwd_s(traced), emb_fwd_s(zipf)
    # the other ranks gather nothing: their op is the launch overhead alone (HBM-resident
    # tables: the split keeps the lookups on the GPU)
    assert t_traced[0] > 2 * t_traced[1:].max() and np.ptp(t_traced[1:]) == 0
    assert t_zipf.max() < 2 * t_zipf.min()


def test_a_table_may_name_its_own_source_and_the_others_stay_zipf(tmp_path):
    rng = np.random.default_rng(1)
    save_trace(Trace((TableTrace(ROWS, np.full(512, 4), rng.integers(0, ROWS, 2048)),), 512), tmp_path / "t1.npz")
    cr = run(scenario({"tables": {"t1": {"trace": "t1.npz"}}}), base=tmp_path)
    src = cr.result.metrics["lookup_sources"]
    assert src["t0"].startswith("zipf") and src["t1"].startswith("trace:")
    # the traced table's pooling (4) decides its lookups, not the spec's 8
    per_table = {name: sum(k.lookups for k in tw.kernels) for name, tw in cr.work.tables.items()}
    assert per_table["t1"] == pytest.approx(4 * 256 * 4, rel=0.01)   # global bags x 4
    assert per_table["t0"] == pytest.approx(4 * 256 * 8, rel=0.01)


@pytest.mark.parametrize("make, field", [
    (lambda p: None, "does not exist"),
    (lambda p: p.write_bytes(b"PK\x03\x04 truncated"), "not a readable .npz"),
    (lambda p: p.write_bytes(__import__("pickle").dumps({"a": 1})), "not a readable .npz"),
    (lambda p: hot_trace(p, batch=300), "batch_size"),
    (lambda p: save_trace(Trace((TableTrace(ROWS, np.full(256, 1), np.zeros(256, np.int64)),), 256), p), "tables"),
    (lambda p: save_trace(Trace(tuple(TableTrace(100, np.full(256, 1), np.zeros(256, np.int64)) for _ in range(2)),
                                256), p), "rows"),
])
def test_bad_trace_files_exit_2_naming_the_table_and_field(tmp_path, make, field, capsys):
    import tomli_w

    from neonic.host.cli import main

    path = tmp_path / "bad.npz"
    make(path)
    data = scenario({"trace": "bad.npz"}, system="zionex")
    (tmp_path / "s.toml").write_text(tomli_w.dumps(data))
    rc = main(["run", str(tmp_path / "s.toml"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "lookups.trace (table t0)" in err and field in err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("metrics.json"))


def test_unknown_lookup_fields_and_tables_are_named():
    with pytest.raises(ValueError, match=r"lookups.tables.nope: no table"):
        ClusterRun(scenario_from_dict(scenario({"tables": {"nope": {"zipf": True}}}))).run()
    with pytest.raises(ValueError, match=r"lookups.traec: unknown field"):
        scenario_from_dict(scenario({"traec": "x.npz"}))
    with pytest.raises(ValueError, match=r"lookups.alpha"):
        scenario_from_dict(scenario({"alpha": "high"}))


def test_the_model_and_rtl_backends_draw_identical_lookups_for_a_seed():
    from neonic.sim.cosim import traffic_from_plan

    sc = scenario_preset("rtl-small")
    cr = ClusterRun(sc)
    cr.run()
    batch = cr.nic_effects.lookups
    assert batch is cr.lookups and batch is cr.planner_system.lookups
    world, b = cr.work.world_size, sc.workload.batch_per_gpu
    # the RTL backend's traffic, drawn by itself for the seed and from the run's batch
    kw = dict(batch_per_gpu=b, world=world, gpus_per_node=cr.work.gpus_per_node, lanes=4, seed=sc.seed)
    own = traffic_from_plan(cr.plan, sc.workload.tables, **kw)
    shared = traffic_from_plan(cr.plan, sc.workload.tables, lookups=batch, **kw)
    for a, c in zip(own.jobs, shared.jobs):
        assert [x.indices.tolist() for x in a.bags] == [x.indices.tolist() for x in c.bags]
    # and each rank's bags are exactly the batch's lookups that fall in its shards
    for job in shared.jobs:
        got = sorted(int(i) for bag in job.bags for i in bag.indices)
        want = []
        for t in sc.workload.tables:
            for s in cr.plan.tables[t.name].shards:
                if s.rank == job.rank:
                    _, rows = batch[t.name].select(None, s.row_start, s.row_end)
                    want += rows.tolist()
        assert got == sorted(want)


def test_locality_statistics_are_fitted_per_table_and_recorded():
    from neonic.host.traces import PUBLISHED_LOCALITY_STATS, trace_locality, Trace, TableTrace, total_variation, load_locality_stats

    data = scenario({"locality_stats": str(PUBLISHED_LOCALITY_STATS), "locality_block": "0"},
                    tables=[{"name": "t0", "rows": 1_000_000, "dim": 128, "pooling": 8.0}], system="zionex")
    cr = ClusterRun(scenario_from_dict(data))
    topo = cr._topology()
    cr._plan(topo)
    tl = cr.lookups["t0"]
    assert tl.source == f"locality:{PUBLISHED_LOCALITY_STATS}#0" and tl.alpha is None
    # a fit reproduces reuse, not volume: the table's lookups stay the spec's pooling x bags
    assert cr.planner_system.pooling_of(cr.scenario.workload.tables[0]) == 8.0
    # the fitted lookups reuse rows the way the published block does (the rows' reuse histogram;
    # ~8e3 lookups are too few for the top reuse bins' share of lookups: host.traces' doc)
    got = trace_locality(Trace((TableTrace(tl.num_rows, tl.lengths, tl.indices),), tl.bags))
    want = load_locality_stats(PUBLISHED_LOCALITY_STATS, 0)
    assert total_variation(got.row_hist, want.row_hist) < 0.05
    with pytest.raises(ValueError, match=r"lookups.locality_block \(table t0\)|lookups.locality_stats \(table t0\)"):
        bad = scenario({"locality_stats": str(PUBLISHED_LOCALITY_STATS), "locality_block": "nope"},
                       tables=[{"name": "t0", "rows": 1_000_000, "dim": 128, "pooling": 8.0}], system="zionex")
        ClusterRun(scenario_from_dict(bad)).run()


def test_a_gpu_run_prices_zipf_tables_without_drawing_them_and_a_nic_run_reads_the_same_draw():
    # the planner and the GPU path price Zipf tables from rows and alpha: the batch stays
    # undrawn (at 4096 GPUs that is ~1.2e8 lookups and ~2 GiB nobody reads); the SmartNIC's
    # caches read the arrays, and get the draw a fresh batch gives
    from neonic.host.lookups import LookupsSpec, build_lookups

    gpu = ClusterRun(scenario_from_dict(scenario(system="zionex")))
    gpu.run()
    assert gpu.lookups.tables and not any("indices" in t.__dict__ or "lengths" in t.__dict__
                                          for t in gpu.lookups.tables.values())
    nic = ClusterRun(scenario_from_dict(scenario()))
    nic.run()
    sc = nic.scenario
    fresh = build_lookups(sc.workload, LookupsSpec(), world=4, mode=sc.mode, seed=sc.seed,
                          min_bags=sc.system.nic.trace_samples)
    for name, t in nic.lookups.tables.items():
        assert "indices" in t.__dict__      # read by the NIC's caches
        assert np.array_equal(t.indices, fresh[name].indices) and np.array_equal(t.lengths, fresh[name].lengths)
