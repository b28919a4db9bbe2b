"""Configs: presets, TOML loading, field-by-field validation with dotted field names."""

from __future__ import annotations

import pytest
import tomli_w

from neonic.sim.network import Topology, load_config, load_preset, preset_names


def test_presets_ship_as_package_data_and_load():
    assert {"zionex", "zion", "dgx-h100"} <= set(preset_names())
    z = load_preset("zionex")
    assert (z.cluster.nodes, z.cluster.gpus_per_node) == (16, 8)
    assert z.intra_node.bandwidth_gbps == 2400 and z.nic.bandwidth_gbps == 200
    assert z.nic.attach == "gpu" and z.transport.protocol == "rdma"
    zion = load_preset("zion")
    assert zion.nic.attach == "host" and zion.transport.protocol == "tcp" and zion.nic.bandwidth_gbps == 100
    h = load_preset("dgx-h100")
    assert h.nic.bandwidth_gbps == 400 and h.intra_node.bandwidth_gbps == 3600
    for name in preset_names():
        assert Topology.from_preset(name).num_gpus == load_preset(name).num_gpus


def test_toml_file_round_trip(tmp_path, zionex_dict):
    path = tmp_path / "net.toml"
    path.write_bytes(tomli_w.dumps(zionex_dict).encode())
    assert load_config(path) == load_preset("zionex")
    assert load_config("zionex") == load_preset("zionex")


def test_gpus_total_instead_of_nodes(zionex_dict):
    del zionex_dict["cluster"]["nodes"]
    zionex_dict["cluster"]["gpus"] = 64
    assert load_config(zionex_dict).cluster.nodes == 8


@pytest.mark.parametrize(
    "section, field, value, message",
    [
        ("nic", "bandwidth_gbps", -5, r"nic\.bandwidth_gbps: expected a finite number > 0, got -5"),
        ("intra_node", "bandwidth_gbps", 0, r"intra_node\.bandwidth_gbps"),
        ("inter_node", "topology", "torus", r"inter_node\.topology: expected one of"),
        ("intra_node", "fabric", "ring", r"intra_node\.fabric"),
        ("cluster", "gpus_per_node", 0, r"cluster\.gpus_per_node: expected an integer >= 1"),
        ("cluster", "nodes", 2.5, r"cluster\.nodes"),
        ("nic", "per_node", 4, r"nic\.per_node: with nic\.attach = 'gpu' expected one NIC per GPU"),
        ("transport", "mtu_bytes", 1500, r"transport\.mtu_bytes: RoCE path MTU"),
        ("transport", "protocol", "udp", r"transport\.protocol"),
        ("host_link", "latency_ns", -1, r"host_link\.latency_ns"),
        ("nic", "colour", "red", r"nic\.colour: unknown field"),
    ],
)
def test_bad_fields_are_named(zionex_dict, section, field, value, message):
    zionex_dict[section][field] = value
    with pytest.raises(ValueError, match=message):
        load_config(zionex_dict)


def test_gpu_count_that_does_not_divide(zionex_dict):
    del zionex_dict["cluster"]["nodes"]
    zionex_dict["cluster"]["gpus"] = 100
    with pytest.raises(ValueError, match=r"cluster\.gpus: expected a multiple of cluster\.gpus_per_node \(8\), got 100"):
        load_config(zionex_dict)


def test_host_nics_must_divide_the_gpus():
    d = load_preset("zion").to_dict()
    d["nic"]["per_node"] = 3
    with pytest.raises(ValueError, match=r"nic\.per_node: expected a divisor of cluster\.gpus_per_node"):
        load_config(d)


def test_leaf_spine_fields(zionex_dict):
    zionex_dict["inter_node"].update(topology="leaf_spine", nodes_per_leaf=5)
    with pytest.raises(ValueError, match=r"inter_node\.nodes_per_leaf: expected a divisor of cluster\.nodes"):
        load_config(zionex_dict)
    zionex_dict["inter_node"].update(nodes_per_leaf=4, oversubscription=0.5)
    with pytest.raises(ValueError, match=r"inter_node\.oversubscription"):
        load_config(zionex_dict)
    zionex_dict["inter_node"].update(oversubscription=2.0)
    assert load_config(zionex_dict).inter_node.oversubscription == 2.0


def test_missing_section_and_tcp_only_fields(zionex_dict):
    zionex_dict["transport"]["host_copy_gbps"] = 100
    with pytest.raises(ValueError, match=r"transport\.host_copy_gbps: only valid with"):
        load_config(zionex_dict)
    del zionex_dict["transport"]
    with pytest.raises(ValueError, match=r"^transport: required field is missing"):
        load_config(zionex_dict)


def test_unknown_preset_or_file():
    with pytest.raises(ValueError, match="config"):
        load_config("no-such-preset-or-file.toml")
