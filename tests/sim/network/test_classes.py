"""Flow classes: the aggregated (per-class) solve gives the per-flow solve's results.

Specification: on every topology preset at 16..256 GPUs, every collective's time and its link
bytes (per link, payload and wire) agree between ``Network(aggregate=True)`` and
``Network(aggregate=False)`` within 1e-6 relative -- for uniform AlltoAll (where the classes
are few), uneven AlltoAllv (where they are not), with a slowed link (symmetry broken in one
place), and with collectives overlapping (another group breaks a group's symmetry, so classes
are split). The uniform cases must actually aggregate (far fewer classes than flows solved).
"""

from __future__ import annotations

import numpy as np
import pytest

from neonic.sim.engine import Engine
from neonic.sim.network import Network, Topology, collectives as coll, load_preset, preset_names
from neonic.sim.network.classes import equitable_classes


def _topology(preset: str, gpus: int) -> Topology:
    d = load_preset(preset).to_dict()
    g = d["cluster"]["gpus_per_node"]
    d["cluster"]["nodes"] = nodes = max(1, gpus // g)
    if d["inter_node"].get("topology") == "leaf_spine":
        d["inter_node"]["nodes_per_leaf"] = min(d["inter_node"]["nodes_per_leaf"], nodes)
    if d["cluster"]["nodes"] > 8 and d["inter_node"].get("topology") != "leaf_spine":
        d["inter_node"] = {"topology": "leaf_spine", "switch_latency_ns": d["inter_node"]["switch_latency_ns"],
                           "nodes_per_leaf": 4, "oversubscription": 2.0}
    return Topology.from_config(d)


def _run(topo: Topology, start, *, aggregate: bool, slow: int | None = None):
    if slow is not None:
        topo.capacity = topo.capacity.copy()
        topo.capacity[slow] *= 0.37
    eng = Engine()
    net = Network(eng, topo, aggregate=aggregate)
    handles = start(net)
    eng.run()
    return net, handles


def _same(topo_fn, start, *, slow=None):
    net_a, ha = _run(topo_fn(), start, aggregate=True, slow=slow)
    net_f, hf = _run(topo_fn(), start, aggregate=False, slow=slow)
    for a, f in zip(ha, hf):
        assert a.time_ps == pytest.approx(f.time_ps, rel=1e-6)
    np.testing.assert_allclose(net_a.link_bytes, net_f.link_bytes, rtol=1e-6)
    np.testing.assert_allclose(net_a.link_wire_bytes, net_f.link_wire_bytes, rtol=1e-6)
    return net_a, net_f


CASES = [(p, g) for p in ("zionex", "zion", "dgx-h100", "gh200", "mi300a") for g in (16, 64, 256)]


def test_presets_are_all_covered():
    assert {p for p, _ in CASES} == set(preset_names())


@pytest.mark.parametrize("preset,gpus", CASES)
def test_uniform_alltoall_aggregates_without_changing_results(preset, gpus):
    for algorithm in ("direct", "hierarchical"):
        net_a, net_f = _same(lambda: _topology(preset, gpus),
                             lambda net: [coll.alltoall(net, None, 300_000, algorithm=algorithm)])
        assert net_a.solved_flows == net_f.solved_flows
        if gpus >= 64 and algorithm == "direct":  # (hierarchical steps are small groups: per flow)
            assert net_a.solved_classes * 8 < net_a.solved_flows  # the solver saw classes, not flows


@pytest.mark.parametrize("preset,gpus", CASES)
def test_uneven_alltoallv_falls_back_and_agrees(preset, gpus):
    rng = np.random.default_rng(gpus)
    p = _topology(preset, gpus).num_gpus
    # a column-structured part (aggregates) plus a random part on some rows (does not)
    sizes = np.tile(rng.integers(1, 8, p) * 50_000, (p, 1))
    rows = rng.choice(p, max(1, p // 8), replace=False)
    sizes[rows] = rng.integers(1_000, 400_000, (rows.size, p))
    _same(lambda: _topology(preset, gpus), lambda net: [coll.alltoallv(net, None, sizes)])


@pytest.mark.parametrize("preset,gpus", [("zionex", 64), ("dgx-h100", 128), ("zion", 256)])
def test_a_slowed_link_breaks_symmetry_locally_and_results_agree(preset, gpus):
    topo = _topology(preset, gpus)
    slow = topo.num_links // 2  # one link in the middle of the link table
    net_a, _ = _same(lambda: _topology(preset, gpus), lambda net: [coll.alltoall(net, None, 200_000)], slow=slow)
    assert net_a.solved_classes < net_a.solved_flows  # still aggregated away from the slow link


@pytest.mark.parametrize("preset,gpus", [("zionex", 64), ("dgx-h100", 256)])
def test_overlapping_collectives_split_classes_and_agree(preset, gpus):
    def start(net):
        h1 = coll.alltoall(net, None, 400_000)
        h2 = coll.allreduce(net, None, 1 << 22, algorithm="ring")
        return [h1, h2]

    net_a, _ = _same(lambda: _topology(preset, gpus), start)
    assert net_a.splits >= 1  # the ring broke the AlltoAll's classes, which were refined


def test_equitable_partition_properties():
    """Each flow of a class crosses the same number of links of each link class, and the
    quotient's weights are whole numbers of flows per link; sizes split classes."""
    topo = _topology("zionex", 64)
    p = topo.num_gpus
    src, dst = np.nonzero(~np.eye(p, dtype=bool))
    nb = np.where(dst % 2 == 0, 1000.0, 2000.0)
    route = topo.route(src, dst, nb)
    links = np.ascontiguousarray(route.links.T)
    cl = equitable_classes(links, nb, topo.capacity, topo.wire)
    assert not cl.identity and cl.n_classes < src.size // 8
    for c in range(cl.n_classes):
        m = cl.members[cl.starts[c]:cl.starts[c + 1]]
        assert np.unique(nb[m]).size == 1
    w = cl.q_weight[cl.q_weight > 0]
    np.testing.assert_allclose(w, np.round(w))
    uneven = np.arange(src.size, dtype=float)
    assert equitable_classes(links, uneven, topo.capacity, topo.wire).identity
