"""Scenario and system configs: presets load, every bad field is named by its dotted path."""

from __future__ import annotations

import tomllib

import pytest

from neonic.host.cluster import SCENARIO_PRESETS, dense_costs, load_scenario, scenario_from_dict, scenario_preset, scenario_preset_text
from neonic.host.systems import PRESET_NAMES, preset, resolve_system


def base() -> dict:
    return tomllib.loads(scenario_preset_text("default"))


@pytest.mark.parametrize("name", SCENARIO_PRESETS)
def test_every_packaged_scenario_validates(name):
    sc = scenario_preset(name)
    assert sc.name == name
    assert sc.iterations >= 1


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_every_system_preset_validates(name):
    spec = preset(name)
    assert spec.name == name
    assert (spec.nic is not None) == (spec.embeddings == "nic") == name.startswith("smartnic")


def test_system_presets_describe_the_three_systems():
    assert preset("zionex").embeddings == "gpu" and preset("zionex").network == "zionex"
    assert preset("zion").embeddings == "cpu" and preset("zion").network == "zion"
    assert preset("smartnic").embeddings == "nic"


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("scenario", "mode", "serving", "scenario.mode: expected one of training, inference"),
        ("scenario", "iterations", 0, "scenario.iterations: expected an integer >= 1"),
        ("scenario", "pipelined", "yes", "scenario.pipelined: expected true or false"),
        ("scenario", "colour", 1, "scenario.colour: unknown field"),
        ("cluster", "nodes", -1, "cluster.nodes: expected an integer >= 1"),
        ("planner", "allreduce", "butterfly", "planner.allreduce: expected one of"),
        ("planner", "name", "magic", "planner.name: expected one of"),
        ("planner", "max_steps", -1, "planner.max_steps: expected an integer >= 0"),
        ("dense", "dtype", "int4", "dense.dtype: expected one of"),
    ],
)
def test_bad_scenario_fields_are_named(section, key, value, message):
    data = base()
    data.setdefault(section, {})[key] = value
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        scenario_from_dict(data)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"streams": {"interference": 1.5}}, r"system.streams.interference: expected a finite number >= 0 and < 1"),
        ({"streams": {"comm_priority": "urgent"}}, "system.streams.comm_priority: expected one of high, normal"),
        ({"streams": {"collectives_on_dma": 1}}, "system.streams.collectives_on_dma: expected true or false"),
        ({"gpu": "tpu"}, "system.gpu: expected one of"),
        ({"embeddings": "ssd"}, "system.embeddings: expected one of gpu, cpu, nic"),
        ({"gpu_efficiency": {"gemm": 1.5}}, "system.gpu_efficiency: efficiency.gemm"),
        ({"gpu_efficiency": {"speed": 1}}, "system.gpu_efficiency.speed: unknown field"),
        ({"host": {"pcie_gbytes_per_s": 0}}, "system.host.pcie_gbytes_per_s: expected a finite number > 0"),
        ({"nic": {"cache_ways": 0}}, "system.nic.cache_ways: expected an integer >= 1"),
        ({"nic": {"pool_on_nic": "on"}}, "system.nic.pool_on_nic: expected true or false"),
        ({"nic": {"local_cache_mib": -1}}, "system.nic.local_cache_mib: expected a finite number >= 0"),
        ({"preset": "dgx"}, "system.preset: unknown system preset"),
    ],
)
def test_bad_system_fields_are_named(override, message):
    data = base()
    data["system"] = {"preset": "zionex", **override}
    with pytest.raises(ValueError, match=message):
        scenario_from_dict(data)


def test_workload_errors_keep_their_dotted_path():
    data = base()
    data["workload"]["batch_per_gpu"] = 0
    with pytest.raises(ValueError, match="workload.batch_per_gpu"):
        scenario_from_dict(data)
    data = base()
    del data["workload"]
    with pytest.raises(ValueError, match="workload: required section missing"):
        scenario_from_dict(data)


def test_system_overrides_merge_into_the_preset():
    spec = resolve_system({"preset": "zionex", "streams": {"collectives_on_dma": True}, "gpu_efficiency": {"gemm": 0.5}})
    assert spec.streams.collectives_on_dma is True
    assert spec.streams.comm_sm_fraction == preset("zionex").streams.comm_sm_fraction
    assert spec.gpu_spec.efficiency.gemm == 0.5


def test_load_scenario_names_a_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_scenario(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[scenario\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_scenario(bad)


def test_resolved_config_round_trips(tmp_path):
    import tomli_w

    from neonic.host.report import _plain

    sc = scenario_preset("default")
    path = tmp_path / "config.toml"
    path.write_text(tomli_w.dumps(_plain(sc.resolved())))
    again = load_scenario(path)
    assert again.resolved() == sc.resolved()


def test_dense_costs_scale_with_the_model():
    small = scenario_preset("default")
    costs = dense_costs(small.system, small.workload)
    assert costs.top_bwd.time_s > costs.top_fwd.time_s > 0
    assert costs.params > 0
    fp32 = dense_costs(small.system, small.workload, "fp32")
    assert fp32.top_fwd.time_s > costs.top_fwd.time_s


def test_the_planner_defaults_to_a_deterministic_neo_search():
    from neonic.host.planner import DEFAULT_MAX_STEPS, PLANNER_NAMES

    data = base()
    data.pop("planner", None)
    sc = scenario_from_dict(data)
    assert sc.planner == "neo" and sc.planner_budget_s is None and sc.planner_max_steps == DEFAULT_MAX_STEPS
    assert "time_budget_s" not in sc.resolved()["planner"]
    for name in PLANNER_NAMES:
        data["planner"] = {"name": name}
        assert scenario_from_dict(data).planner == name


def test_an_soc_smartnic_needs_its_cores_and_their_row_rate():
    from neonic.host.systems import preset, system_from_dict

    soc = preset("smartnic-soc")
    assert soc.nic.kernels == "cores" and soc.nic.cores == 8 and soc.nic.memory_gbytes_per_s == 25.6
    base = {"name": "x", "embeddings": "nic", "network": "zionex", "gpu": "a100-40gb"}
    with pytest.raises(ValueError, match=r"system\.nic\.cores: required"):
        system_from_dict({**base, "nic": {"kernels": "cores", "core_rows_per_s": 1e7}})
    with pytest.raises(ValueError, match=r"system\.nic\.kernels"):
        system_from_dict({**base, "nic": {"kernels": "asic"}})
    with pytest.raises(ValueError, match=r"system\.nic\.cores"):
        system_from_dict({**base, "nic": {"kernels": "cores", "cores": 0, "core_rows_per_s": 1e7}})
