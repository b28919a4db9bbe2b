"""The results folder's trace opens in Perfetto the way a researcher needs: processes in
numeric order, op args on every slice, flow arrows from dependencies to collectives, counters
as time series; the plots carry titles and every sampled GPU."""

from __future__ import annotations

import json

import pytest

from neonic.host.cluster import ClusterRun, scenario_preset
from neonic.host.report import RESULT_FILES, chrome_trace, write_results


@pytest.fixture(scope="module")
def runner():
    run = ClusterRun(scenario_preset("smartnic-small"))
    run.result = run.run()
    return run


@pytest.fixture(scope="module")
def smartnic_run(runner):
    return runner.result


@pytest.fixture(scope="module")
def trace(runner):
    return chrome_trace(runner.result, runner.plan)


def _names(trace) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
            if e["ph"] == "M" and e["name"] == "process_name"}


def test_processes_sort_numerically_with_each_nic_after_its_gpu(trace):
    names = _names(trace)
    index = {names[e["pid"]]: e["args"]["sort_index"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_sort_index"}
    assert set(index) == set(names.values())
    order = sorted(index, key=index.get)
    assert order[:4] == ["gpu0", "nic0", "gpu1", "nic1"]
    assert order.index("gpu2") < order.index("gpu10") and order[-1] == "network"
    threads = [e for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_sort_index"]
    assert threads and all("sort_index" in e["args"] for e in threads)


def test_every_slice_carries_its_ops_args(trace, smartnic_run):
    names = _names(trace)
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    gpu = [e for e in slices if names[e["pid"]].startswith("gpu")]
    assert gpu and all({"op_id", "phase", "iteration", "deps"} <= set(e["args"]) for e in gpu)
    by_phase = {e["args"]["phase"]: e["args"] for e in gpu}
    assert by_phase["h2d"]["bytes"] > 0
    assert by_phase["pooled_a2a"]["bytes_sent"] > 0 and by_phase["pooled_a2a"]["kind"] == "alltoallv"
    assert by_phase["top_fwd"]["flops"] > 0 and by_phase["top_fwd"]["hbm_bytes"] > 0
    assert by_phase["emb_fwd"]["nic_cache_ps"] > 0 and "pcie_bytes" in by_phase["emb_fwd"]
    op = smartnic_run.graph.ops[by_phase["allreduce"]["op_id"]]
    assert op.phase == "allreduce" and by_phase["allreduce"]["bytes"] == float(op.payload.nbytes)
    emb = [e["args"] for e in gpu if e["args"]["phase"] == "emb_fwd"]
    assert emb and all(a["tables"] >= 1 and a["shards"] >= a["tables"] for a in emb)
    table, rest = emb[0]["shard_list"][0].split(":", 1)
    assert table and "rows" in rest and "cols" in rest
    nic = [e for e in slices if names[e["pid"]].startswith("nic")]
    assert nic and all(e["args"]["unit"] in ("cache", "gather", "packetizer") for e in nic)


def test_collectives_have_flow_arrows_from_their_dependencies(trace, smartnic_run):
    names = _names(trace)
    starts = {e["id"]: e for e in trace["traceEvents"] if e["ph"] == "s"}
    ends = {e["id"]: e for e in trace["traceEvents"] if e["ph"] == "f"}
    assert starts and set(starts) == set(ends)
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    for fid in list(starts)[:200]:
        s, f = starts[fid], ends[fid]
        assert names[f["pid"]] == "network" and f["bp"] == "e"
        assert names[s["pid"]].startswith("gpu") and s["ts"] <= f["ts"]
        # each end lies inside a slice of its thread (Perfetto binds the arrow to it)
        for e, bound in ((s, "inside"), (f, "start")):
            assert any(x["pid"] == e["pid"] and x["tid"] == e["tid"]
                       and x["ts"] <= e["ts"] <= x["ts"] + x["dur"] for x in slices), bound
    deps = sum(1 for op in smartnic_run.graph.ops if op.collective
               for d in op.deps if not d.collective)
    assert len(starts) == deps


def test_counters_are_time_series(trace):
    counters: dict[str, list[float]] = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "C":
            counters.setdefault(e["name"], []).append(e["ts"])
    for name in ("collectives in flight", "network payload rate (GB/s)", "busy streams", "busy units"):
        assert len(set(counters[name])) > 10, name
    rates = [e["args"]["GB/s"] for e in trace["traceEvents"]
             if e["ph"] == "C" and e["name"] == "network payload rate (GB/s)"]
    assert max(rates) > 0 and rates[-1] == pytest.approx(0.0, abs=1e-6)


def test_the_warmup_is_marked(trace, smartnic_run):
    marks = [e for e in trace["traceEvents"] if e["ph"] == "i" and e["name"] == "end of warm-up"]
    assert len(marks) == 1 and marks[0]["ts"] == trace["otherData"]["warmup_end_us"] > 0
    assert trace["otherData"]["link_class_bytes"] == pytest.approx(smartnic_run.link_class_bytes)


def test_results_folder_is_written_and_the_trace_is_json(tmp_path, smartnic_run):
    write_results(smartnic_run, tmp_path)
    for name in RESULT_FILES:
        assert (tmp_path / name).stat().st_size > 0, name
    loaded = json.loads((tmp_path / "trace.json").read_text())
    assert loaded["displayTimeUnit"] == "ms"


def test_weak_scaling_throughput_is_log_log_with_integer_gpu_ticks():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from neonic.host.experiments.weak_scaling import _plot_lines

    rows = [{"model": "model-a", "gpus": g, "samples_per_s": 1.5e4 * g, "scaling_efficiency": 0.9}
            for g in (8, 16, 32, 64, 128)]
    fig = plt.figure()
    _plot_lines(fig, rows, "samples_per_s", "samples/s")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert [int(t) for t in ax.get_xticks()] == [8, 16, 32, 64, 128]
    fig = plt.figure()
    _plot_lines(fig, rows, "scaling_efficiency", "scaling efficiency")
    assert fig.axes[0].get_yscale() == "linear"
