"""Plans in and out: TorchRec's vocabulary, checked against the workload, identical when re-run."""

from __future__ import annotations

import copy
import json

import pytest

from neonic.host.cluster import ClusterRun, scenario_from_dict
from neonic.host.planner.plan_io import load_plan, plan_from_dict, plan_to_dict, save_plan

SCENARIO = {
    "scenario": {"name": "io", "iterations": 1, "warmup": 1},
    "cluster": {"nodes": 2, "gpus_per_node": 4},
    "workload": {"preset": "dlrm-kaggle", "batch_per_gpu": 256},
    "system": {"preset": "zionex"},
    "planner": {"max_steps": 5},
}


@pytest.fixture(scope="module")
def planned():
    runner = ClusterRun(scenario_from_dict(SCENARIO))
    result = runner.run()
    return runner, result


def _data(runner):
    return plan_to_dict(runner.plan, runner.scenario.workload)


def _check(runner, data):
    return plan_from_dict(data, runner.scenario.workload, runner.planner_system)


def test_an_exported_plan_reimported_gives_the_identical_simulated_result(planned, tmp_path):
    runner, result = planned
    save_plan(runner.plan, tmp_path / "plan.json", runner.scenario.workload)
    # [planner] plan = "plan.json", relative to the scenario file's folder
    again = ClusterRun(scenario_from_dict(dict(SCENARIO, planner={"plan": "plan.json"}), base=tmp_path))
    rerun = again.run()
    assert again.plan == runner.plan
    assert rerun.metrics["iteration_time_s"] == result.metrics["iteration_time_s"]
    assert rerun.metrics["phase_serialized_s"] == result.metrics["phase_serialized_s"]


def test_the_format_speaks_torchrec(planned):
    runner, _ = planned
    data = json.loads(json.dumps(_data(runner)))
    for name, entry in data["tables"].items():
        assert entry["sharding_type"] in ("data_parallel", "table_wise", "row_wise", "column_wise",
                                          "table_row_wise", "table_column_wise")
        assert entry["ranks"] == [s["rank"] for s in entry["shards"]]
        for shard in entry["shards"]:
            assert len(shard["shard_offsets"]) == len(shard["shard_sizes"]) == 2
    assert _check(runner, data) == runner.plan
    # table-wise and data-parallel tables may leave their shards out, as TorchRec does (a
    # table-wise plan of the same workload: Neo's plan need not hold a table-wise table)
    from neonic.host.planner.api import make_plan

    plan = make_plan(runner.scenario.workload, runner.planner_system, "force:table-wise")
    data = json.loads(json.dumps(plan_to_dict(plan, runner.scenario.workload)))
    tw = next(n for n, e in data["tables"].items() if e["sharding_type"] == "table_wise")
    del data["tables"][tw]["shards"]
    assert _check(runner, data) == plan


@pytest.mark.parametrize("edit,needle", [
    (lambda d, t: d["tables"].pop(t), "tables.{t}: missing"),
    (lambda d, t: d["tables"].__setitem__("no-such-table", d["tables"][t]), "tables.no-such-table: unknown table"),
    (lambda d, t: d["tables"][t].__setitem__("sharding_type", "diagonal"), "tables.{t}.sharding_type"),
    (lambda d, t: d["tables"][t]["shards"][0].__setitem__("rank", 99), "tables.{t}.shards[0].rank"),
    (lambda d, t: d["tables"][t]["shards"][0].__setitem__("shard_sizes", [1, 1]), "tables.{t}.shards"),
    (lambda d, t: d["tables"][t].__setitem__("ranks", [0, 1]), "tables.{t}.ranks"),
    (lambda d, t: d["tables"][t]["shards"][0].__setitem__("tier", "tape"), "tables.{t}.shards[0].tier"),
    (lambda d, t: d.__setitem__("world_size", 16), "world_size"),
    (lambda d, t: d["tables"][t]["shards"][0].__setitem__("colour", 1), "tables.{t}.shards[0].colour"),
])
def test_malformed_and_mismatched_plans_are_refused_naming_the_table_and_field(planned, edit, needle):
    runner, _ = planned
    data = copy.deepcopy(_data(runner))
    table = runner.scenario.workload.tables[0].name
    edit(data, table)
    with pytest.raises(ValueError, match=needle.format(t=table).replace("[", r"\[").replace("]", r"\]")):
        _check(runner, data)


def test_shards_must_tile_the_table_and_stay_in_one_node(planned):
    runner, _ = planned
    w = runner.scenario.workload
    t = max(w.tables, key=lambda t: t.rows)
    data = copy.deepcopy(_data(runner))
    half = t.rows // 2
    data["tables"][t.name] = {"sharding_type": "table_row_wise", "ranks": [0, 1], "shards": [
        {"rank": 0, "shard_offsets": [0, 0], "shard_sizes": [half, t.dim]},
        {"rank": 1, "shard_offsets": [half + 1, 0], "shard_sizes": [t.rows - half - 1, t.dim]}]}
    with pytest.raises(ValueError, match=rf"tables\.{t.name}\.shards: .*gap at {half}"):
        _check(runner, data)
    data["tables"][t.name]["shards"][1]["shard_offsets"] = [half, 0]
    data["tables"][t.name]["shards"][1]["shard_sizes"] = [t.rows - half, t.dim]
    data["tables"][t.name]["shards"][1]["rank"] = 4
    data["tables"][t.name]["ranks"] = [0, 4]
    with pytest.raises(ValueError, match=rf"tables\.{t.name}\.ranks: table_row_wise keeps a table inside one node"):
        _check(runner, data)


def test_a_plan_that_overflows_hbm_is_refused_naming_a_table(planned):
    runner, _ = planned
    data = copy.deepcopy(_data(runner))
    for name in data["tables"]:  # everything table-wise on rank 0
        data["tables"][name] = {"sharding_type": "table_wise", "ranks": [0]}
    import dataclasses

    s = runner.planner_system
    need = sum(runner.scenario.workload.table_memory_bytes(t) for t in runner.scenario.workload.tables)
    # a GPU whose HBM holds less than all the tables together
    small = dataclasses.replace(s, gpu=dataclasses.replace(s.gpu, hbm_gib=need / 2**30 * 0.9, hbm_reserved_fraction=0.0))
    with pytest.raises(ValueError, match=r"tables\.\S+\.ranks: rank 0 would hold .* GiB in HBM, more than its"):
        plan_from_dict(data, runner.scenario.workload, small)
    assert plan_from_dict(data, runner.scenario.workload, s).world_size == s.world_size  # it fits the real one


def test_missing_or_broken_plan_files_are_named(tmp_path, planned):
    runner, _ = planned
    with pytest.raises(ValueError, match="planner.plan: file .* does not exist"):
        load_plan(tmp_path / "none.json", runner.scenario.workload, runner.planner_system)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_plan(bad, runner.scenario.workload, runner.planner_system)


def test_neonic_plan_exports_and_neonic_run_runs_the_plan(tmp_path, capsys):
    from neonic.host.cli import main

    plan = tmp_path / "p.json"
    assert main(["plan", "--preset", "default", "--no-baselines", "--export", str(plan)]) == 0
    assert json.loads(plan.read_text())["format"] == "neonic.plan/1"
    assert main(["run", "--preset", "default", "--plan", str(plan), "--quiet", "--out", str(tmp_path / "r")]) == 0
    resolved = (tmp_path / "r").rglob("*")
    assert any(p.is_file() for p in resolved)
