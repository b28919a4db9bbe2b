"""Sweeps: SWEEP.toml validation, point expansion, and runs on a Dask local cluster that are
resumable, isolate failing points and do not depend on the number of workers."""

from __future__ import annotations

import csv
import json
import textwrap

import pytest

from neonic.host.sweep import expand_points, load_sweep, run_sweep, set_path, sweep_from_dict

# A small scenario: the default scenario with 8 tables (a fraction of a second per point).
# Planning is deterministic (bounded by steps, not by the clock), so the points do not depend
# on how busy the machine is.
SMALL = """
[sweep]
name = "small"
scenario = "default"
metrics = ["samples_per_s", "iteration_time_s"]
[set]
"scenario.iterations" = 1
"planner.max_steps" = 50
"workload.synthesize.count" = 8
"workload.synthesize.total_params" = 2e8
[grid]
"cluster.nodes" = [1, 2]
"system.streams.comm_priority" = ["high", "normal"]
"""


def _spec(tmp_path, text=SMALL, extra=""):
    path = tmp_path / "sweep.toml"
    path.write_text(textwrap.dedent(text) + textwrap.dedent(extra))
    return load_sweep(path)


def _rows(out):
    with (out / "results.csv").open(newline="") as f:
        return list(csv.DictReader(f))


# ------------------------------------------------------------------------------ validation
@pytest.mark.parametrize("data, field", [
    ({}, "sweep: required"),
    ({"sweep": {"name": "a b"}}, "sweep.name"),
    ({"sweep": {"name": "x", "colour": 1}}, "sweep.colour"),
    ({"sweep": {"name": "x", "seeds": "random"}}, "sweep.seeds"),
    ({"sweep": {"name": "x", "scenario": "nope"}}, "sweep.scenario"),
    ({"sweep": {"name": "x", "scenario": "missing.toml"}}, "sweep.scenario"),
    ({"sweep": {"name": "x", "metrics": []}}, "sweep.metrics"),
    ({"sweep": {"name": "x"}, "grid": {"cluster.nodes": 3}}, "grid.cluster.nodes"),
    ({"sweep": {"name": "x"}, "grid": {"cluster": {"nodes": []}}}, "grid.cluster.nodes"),
    ({"sweep": {"name": "x"}, "grid": {"clusterr.nodes": [1]}}, "grid.clusterr.nodes"),
    ({"sweep": {"name": "x"}, "set": {"bogus.x": 1}}, "set.bogus.x"),
    ({"sweep": {"name": "x"}, "points": [{}]}, r"points\[0\]"),
    ({"sweep": {"name": "x"}, "points": [{"cluster.nodes": 1}], "grid": {"cluster.nodes": [2]}}, r"points\[0\].cluster.nodes"),
    ({"sweep": {"name": "x"}, "extra": {}}, "extra: unknown field"),
])
def test_sweep_file_errors_name_the_field(data, field):
    with pytest.raises(ValueError, match=field):
        sweep_from_dict(data)


def test_nested_and_dotted_grid_keys_mean_the_same(tmp_path):
    a = sweep_from_dict({"sweep": {"name": "x"}, "grid": {"cluster.nodes": [1, 2]}})
    b = sweep_from_dict({"sweep": {"name": "x"}, "grid": {"cluster": {"nodes": [1, 2]}}})
    assert a.axes == b.axes == {"cluster.nodes": [1, 2]}


# --------------------------------------------------------------------------------- points
def test_points_in_grid_order_with_keys_and_seeds_from_the_config(tmp_path):
    spec = _spec(tmp_path, extra='[[points]]\n"dense.dtype" = "fp16"\n[[points]]\n"dense.dtype" = "bf16"\n')
    points = expand_points(spec)
    assert len(points) == 2 * 2 * 2
    assert [p.values["system.streams.comm_priority"] for p in points[:4]] == ["high", "normal", "high", "normal"]
    assert [p.values["cluster.nodes"] for p in points[:4]] == [1, 1, 2, 2]
    assert len({p.key for p in points}) == len(points)
    # the same config gives the same key and seed whatever its position in the sweep
    reordered = sweep_from_dict({"sweep": {"name": "r", "scenario": "default"}, "set": spec.fixed,
                                 "grid": {"system.streams.comm_priority": ["normal", "high"], "cluster.nodes": [2, 1]},
                                 "points": [{"dense.dtype": "bf16"}, {"dense.dtype": "fp16"}]})
    again = {json.dumps(p.values, sort_keys=True): p for p in expand_points(reordered)}
    for p in points:
        q = again[json.dumps(p.values, sort_keys=True)]
        assert q.key == p.key and q.config["scenario"]["seed"] == p.config["scenario"]["seed"]
    assert len({p.config["scenario"]["seed"] for p in points}) == len(points)


def test_set_path_expands_presets_so_any_field_can_be_swept():
    config = {"system": "zion", "workload": "model-i"}
    set_path(config, "system.streams.interference", 0.2)
    assert config["system"] == {"preset": "zion", "streams": {"interference": 0.2}}
    set_path(config, "workload.synthesize.count", 10)
    assert config["workload"]["name"] == "model-i" and config["workload"]["synthesize"]["count"] == 10
    with pytest.raises(ValueError, match="cluster.nodes"):
        set_path({"cluster": {"nodes": 2}}, "cluster.nodes.x", 1)


# ------------------------------------------------------------------------------------ runs
def test_two_workers_give_the_same_csv_as_one(tmp_path):
    spec = _spec(tmp_path, extra='[[points]]\n"dense.dtype" = "fp16"\n[[points]]\n"dense.dtype" = "fp32"\n')
    one = run_sweep(spec, tmp_path / "one", workers=1, processes=False)
    two = run_sweep(spec, tmp_path / "two", workers=2, processes=False)
    assert one.finished == two.finished == 8
    assert (tmp_path / "one" / "results.csv").read_text() == (tmp_path / "two" / "results.csv").read_text()
    rows = _rows(tmp_path / "one")
    assert [int(r["point"]) for r in rows] == list(range(8))
    assert all(r["status"] == "ok" and float(r["samples_per_s"]) > 0 for r in rows)
    assert sorted(p.name for p in (tmp_path / "one").glob("plot_*.png")) == [
        "plot_cluster.nodes.png", "plot_dense.dtype.png", "plot_system.streams.comm_priority.png"]


def test_interrupted_sweep_resumes_and_recomputes_only_missing_points(tmp_path):
    spec = _spec(tmp_path)
    out = tmp_path / "run"
    seen = []

    def stop_after_two(record):
        seen.append(record["key"])
        return len(seen) < 2  # False after the second finished point: stop

    first = run_sweep(spec, out, workers=1, processes=False, on_point=stop_after_two)
    assert first.interrupted and len(first.computed) == 2
    on_disk = sorted(p.stem for p in (out / "points").glob("*.json"))
    assert on_disk == sorted(seen)
    assert not list((out / "points").glob(".*tmp"))  # atomic writes leave no temp files
    rows = _rows(out)
    assert sum(r["status"] == "missing" for r in rows) == 2
    # a partially written file (as a crash outside the atomic rename could leave) is recomputed
    broken = expand_points(spec)[-1].key
    if broken not in seen:
        (out / "points" / f"{broken}.json").write_text('{"status": "ok", "key": "')
    second = run_sweep(spec, out, workers=1, processes=False)
    assert sorted(second.skipped) == sorted(seen)
    assert sorted(second.computed) == sorted(p.key for p in expand_points(spec) if p.key not in seen)
    assert second.finished == 4 and not second.interrupted
    third = run_sweep(spec, out, workers=1, processes=False)  # nothing left to do
    assert third.computed == [] and len(third.skipped) == 4


def test_a_failing_point_fails_alone_with_a_clear_error(tmp_path):
    spec = sweep_from_dict({"sweep": {"name": "bad", "scenario": "default"},
                            "set": {"scenario.iterations": 1, "planner.max_steps": 50, "workload.synthesize.count": 8,
                                    "workload.synthesize.total_params": 2e8},
                            "grid": {"cluster.nodes": [1, 0], "system.streams.interference": [0.1, 1.5]}})
    out = tmp_path / "bad"
    result = run_sweep(spec, out, workers=2, processes=False)
    rows = _rows(out)
    status = {(r["cluster.nodes"], r["system.streams.interference"]): r for r in rows}
    assert status[("1", "0.1")]["status"] == "ok"
    assert "cluster.nodes: expected an integer >= 1, got 0" in status[("0", "0.1")]["error"]
    assert "system.streams.interference" in status[("1", "1.5")]["error"]
    assert len(result.failed) == 3 and result.finished == 1
    summary = json.loads((out / "sweep.json").read_text())
    assert len(summary["failed"]) == 3 and all(f["error"] for f in summary["failed"])
