"""Shared helpers for the network tests."""

from __future__ import annotations

import copy

import pytest

from neonic.sim.network import Topology, load_preset


@pytest.fixture
def zionex_dict() -> dict:
    return copy.deepcopy(load_preset("zionex").to_dict())


def small_topology(nodes: int = 4, gpus: int = 4, **overrides) -> Topology:
    """A zionex-like cluster with round figures; ``overrides`` are {"section.field": value}."""
    d = {
        "name": "test",
        "cluster": {"nodes": nodes, "gpus_per_node": gpus},
        "intra_node": {"fabric": "switch", "bandwidth_gbps": 2400, "link_latency_ns": 200, "switch_latency_ns": 100},
        "host_link": {"bandwidth_gbps": 256, "latency_ns": 500},
        "nic": {"attach": "gpu", "per_node": gpus, "bandwidth_gbps": 200, "latency_ns": 1000},
        "inter_node": {"topology": "switch", "switch_latency_ns": 500},
        "transport": {"protocol": "rdma", "mtu_bytes": 4096},
    }
    for key, value in overrides.items():
        sec, field = key.split(".")
        if value is None:
            d[sec].pop(field, None)
        else:
            d[sec][field] = value
    return Topology.from_config(d)
