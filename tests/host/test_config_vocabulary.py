"""One config vocabulary: the shared checks word every error the same way; every scenario field
is documented (meaning, unit, default) and the documentation matches what the loaders do."""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path

import numpy as np
import pytest

from neonic.host.cli import main
from neonic.host.cluster import SCENARIO_PRESETS, scenario_from_dict, scenario_preset
from neonic.host.fields import field_index, markdown_table, resolved_scenario, undocumented
from neonic.sim import schema

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("call, message", [
    (lambda: schema.integer("a.b", 0, 1), "a.b: expected an integer >= 1, got 0"),
    (lambda: schema.integer("a.b", 2.0, 1), "a.b: expected an integer >= 1, got 2.0"),
    (lambda: schema.integer("a.b", True, 0), "a.b: expected an integer >= 0, got True"),
    (lambda: schema.integer("a.b", 9, 1, 8), "a.b: expected an integer >= 1 and <= 8, got 9"),
    (lambda: schema.number("x", -1, 0.0), "x: expected a finite number >= 0, got -1"),
    (lambda: schema.number("x", 0, 0.0, lo_open=True), "x: expected a finite number > 0, got 0"),
    (lambda: schema.number("x", math.nan, 0.0), "x: expected a finite number >= 0, got nan"),
    (lambda: schema.probability("p", 1.0, hi_open=True), "p: expected a finite number >= 0 and < 1, got 1.0"),
    (lambda: schema.choice("m", "x", ("a", "b")), "m: expected one of a, b, got 'x'"),
    (lambda: schema.boolean("f", 1), "f: expected true or false, got 1"),
    (lambda: schema.known_fields("cluster", {"nodez": 1}, ("nodes", "gpus_per_node")),
     "cluster.nodez: unknown field (did you mean 'nodes'?); expected one of nodes, gpus_per_node"),
])
def test_every_check_words_its_error_one_way(call, message):
    with pytest.raises(ValueError) as info:
        call()
    assert str(info.value) == message


def test_numpy_scalars_pass_the_shared_checks():
    assert schema.integer("n", np.int64(3), 1) == 3
    assert schema.number("x", np.float32(0.5), 0.0) == 0.5


def test_loaders_in_every_layer_use_the_shared_checks():
    """The copied checkers are gone: each loader's names are the schema's functions."""
    from neonic.host import scenario, systems, traces
    from neonic.host.planner import config as planner_config
    from neonic.host.planner import plan_io
    from neonic.sim.harness import amaranth_sim, memory

    assert scenario._int is schema.integer and scenario._choice is schema.choice
    # plan files: a rank is an integer below the world size, in the shared wording
    with pytest.raises(ValueError, match=r"^t\.ranks\[0\]: expected an integer >= 0 and <= 3, got 4$"):
        plan_io._int("t.ranks[0]", 4, 0, 4)
    assert systems._num is schema.number and systems._int is schema.integer
    assert planner_config._num is schema.number
    assert traces._check_int is schema.integer and traces._check_float is schema.number
    for module in (amaranth_sim, memory):
        with pytest.raises(ValueError, match="expected a finite number >= 0 and < 1"):
            module._check_probability("idle", 1.0)


def test_the_same_range_reads_the_same_in_scenarios_and_networks():
    from neonic.sim.network.config import NetworkConfig, load_preset

    data = tomllib.loads((ROOT / "sim" / "network" / "presets" / "zionex.toml").read_text())
    data["nic"]["bandwidth_gbps"] = -5
    with pytest.raises(ValueError, match=r"^nic\.bandwidth_gbps: expected a finite number > 0, got -5$"):
        NetworkConfig.from_dict(data)
    with pytest.raises(ValueError, match=r"^system\.host\.pcie_gbytes_per_s: expected a finite number > 0, got 0$"):
        scenario_preset("default", system={"preset": "zionex", "host": {"pcie_gbytes_per_s": 0}})
    assert load_preset("zionex")


@pytest.mark.parametrize("name", SCENARIO_PRESETS)
def test_every_field_of_every_packaged_scenario_is_documented(name):
    assert list(undocumented(resolved_scenario(scenario_preset(name)))) == []


def test_documented_defaults_are_the_loaders_defaults():
    resolved = resolved_scenario(scenario_from_dict({"workload": {"preset": "model-a"}}))
    checked = 0
    for f in field_index().values():
        if f.default is None or f.name.startswith(("workload.", "system.preset", "system.nic.")):
            continue  # (the NIC's defaults are NICSpec()'s by construction)
        node = resolved
        for part in f.name.split("."):
            node = node[part]
        assert node == f.default, f.name
        checked += 1
    assert checked >= 25


def test_the_readme_field_table_is_the_generated_one():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.search(r"<!-- fields:begin .*?-->\n(.*?)<!-- fields:end -->", readme, re.S)
    assert found, "README.md: the generated field table's markers are missing"
    assert found.group(1) == markdown_table(), (
        "README.md's field table is stale: regenerate it with `neonic config fields --markdown`")


def test_config_show_prints_the_resolved_scenario_with_every_field_explained(capsys):
    assert main(["config", "show", "smartnic-small"]) == 0
    out = capsys.readouterr().out
    assert tomllib.loads(out) == resolved_scenario(scenario_preset("smartnic-small"))
    line = next(li for li in out.splitlines() if li.startswith("local_cache_mib"))
    assert "NIC cache of the owner's hot rows" in line and "[MiB]" in line and "default 64" in line


def test_config_show_names_a_bad_scenario(tmp_path, capsys):
    assert main(["config", "show", "nope"]) == 2
    assert "SCENARIO: 'nope'" in capsys.readouterr().err
    bad = tmp_path / "s.toml"
    bad.write_text('[cluster]\nnodes = 0\n[workload]\npreset = "model-a"\n')
    assert main(["config", "show", str(bad)]) == 2
    assert "cluster.nodes: expected an integer >= 1, got 0" in capsys.readouterr().err


def test_the_readme_names_what_ships():
    """Every packaged scenario and GPU preset by its real name; no pointer to files a user of
    the package does not have."""
    from neonic.sim.gpu import GPU_PRESETS

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name in (*SCENARIO_PRESETS, *GPU_PRESETS):
        assert f"`{name}`" in readme, name
    assert "REFERENCES.md" not in readme
