"""Flow-level network: closed forms of single flows, incast, oversubscribed spine, accounting.

alpha-beta of one message of n payload bytes: T = alpha + wire(n) / B, with alpha the route
latency (links + switches) and B the bottleneck link bandwidth; wire(n) = n on NVLink/PCIe and
the RoCEv2 framed size on NIC/spine links.
"""

from __future__ import annotations

import numpy as np
import pytest

from neonic.sim.engine import Engine
from neonic.sim.network import Network
from neonic.sim.network.transport import rdma_wire_bytes, tcp_wire_bytes

from .conftest import small_topology

NIC_BPS = 200e9 / 8  # bytes/s
NVL_BPS = 2400e9 / 8
ALPHA_INTER_S = (1000 + 500 + 1000) * 1e-9  # nic tx + switch + nic rx
ALPHA_INTRA_S = (200 + 100 + 200) * 1e-9


def run(topo, flows, *, coalesce_rel=0.0):
    eng = Engine()
    net = Network(eng, topo, coalesce_rel=coalesce_rel)
    g = net.start_flows(*zip(*flows)) if flows else None
    eng.run()
    return net, g


def test_single_inter_node_flow_matches_alpha_beta():
    topo = small_topology()
    n = 1_000_000
    _, g = run(topo, [(0, 4, n)])
    expected = ALPHA_INTER_S + rdma_wire_bytes(n, 4096) / NIC_BPS
    assert g.end_ps * 1e-12 == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_single_intra_node_flow_uses_nvlink():
    topo = small_topology()
    net, g = run(topo, [(0, 1, 3_000_000)])
    assert g.end_ps * 1e-12 == pytest.approx(ALPHA_INTRA_S + 3e6 / NVL_BPS, rel=1e-9)
    assert net.link_class_bytes() == {"nvlink": 6e6, "pcie": 0.0, "nic": 0.0}


def test_incast_shares_the_receiver_equally_then_progressively():
    """k senders into one NIC share it max-min: equal payload rates r with sum(f_i) * r = B
    (f_i = wire/payload of message i); when the short messages end the others speed up.

    Sizes 1, 1, 2, 4 MiB into rx(0): phase 1 all four at B / sum(f); the 1 MiB ones end at
    t1 = 1 MiB / r1; phase 2 the other two at B / (f3 + f4) until the 2 MiB one ends; phase 3
    the 4 MiB one alone at B / f4. Each arrival is alpha later.
    """
    topo = small_topology()
    mb = 1 << 20
    sizes = np.array([mb, mb, 2 * mb, 4 * mb], dtype=float)
    _, g = run(topo, [(s, 0, int(n)) for s, n in zip([4, 8, 12, 5], sizes)])
    f = rdma_wire_bytes(sizes, 4096) / sizes
    r1 = NIC_BPS / f.sum()
    t1 = mb / r1
    r2 = NIC_BPS / (f[2] + f[3])
    t2 = t1 + (2 * mb - mb) / r2
    r3 = NIC_BPS / f[3]
    t3 = t2 + (4 * mb - mb - (t2 - t1) * r2) / r3
    np.testing.assert_allclose(g.finish_ps * 1e-12, ALPHA_INTER_S + np.array([t1, t1, t2, t3]), rtol=1e-9)


def test_oversubscribed_spine_limits_cross_leaf_flows_to_the_bundle_share():
    """Leaf bundle = nodes_per_leaf * G * B / oversubscription; k cross-leaf flows each get 1/k.

    2 nodes per leaf, 2 GPUs per node, 4:1 -> bundle = 4 * 200 / 4 = 200 Gbps. Four flows from
    leaf 0 to four distinct GPUs of leaf 1 share it: 50 Gbps each; an intra-leaf flow is not
    affected and runs at 200 Gbps.
    """
    topo = small_topology(
        nodes=4, gpus=2, **{"inter_node.topology": "leaf_spine", "inter_node.nodes_per_leaf": 2,
                            "inter_node.oversubscription": 4.0}
    )
    n = 1 << 22
    flows = [(0, 4, n), (1, 5, n), (2, 6, n), (3, 7, n), (0 + 0, 2, n)]
    # GPU 0 sends two flows (to 4 and to 2) over its NIC: max-min gives the cross-leaf one 50,
    # so the intra-leaf one gets the remaining 150 Gbps of nic.tx[0].
    _, g = run(topo, flows)
    w = rdma_wire_bytes(n, 4096)
    alpha_cross = (1000 + 3 * 500 + 1000) * 1e-9
    alpha_leaf = (1000 + 500 + 1000) * 1e-9
    np.testing.assert_allclose(g.finish_ps[:4] * 1e-12, alpha_cross + w / (50e9 / 8), rtol=1e-9)
    assert g.finish_ps[4] * 1e-12 == pytest.approx(alpha_leaf + w / (150e9 / 8), rel=1e-9)


def test_flows_started_later_compete_with_running_ones():
    topo = small_topology()
    eng = Engine()
    net = Network(eng, topo, coalesce_rel=0.0)
    n = 1 << 22
    first = net.start_flow(4, 0, n)
    second = []
    t_half_ps = 100_000_000  # 100 us
    eng.schedule(t_half_ps, lambda: second.append(net.start_flow(8, 0, n)))
    eng.run()
    w = rdma_wire_bytes(n, 4096)
    # first runs alone 100 us, then shares rx(0) with the second until it is done
    alone = t_half_ps * 1e-12 * NIC_BPS
    t_first = 100e-6 + 2 * (w - alone) / NIC_BPS
    assert first.end_ps * 1e-12 == pytest.approx(t_first + ALPHA_INTER_S, rel=1e-9)
    t_second = t_first + (w - (w - alone)) / NIC_BPS
    assert second[0].end_ps * 1e-12 == pytest.approx(t_second + ALPHA_INTER_S, rel=1e-9)


def test_per_link_bytes_and_wire_bytes():
    topo = small_topology()
    n = 10_000
    net, _ = run(topo, [(0, 4, n), (0, 1, n)])
    names = topo.link_names
    by_name = dict(zip(names, net.link_bytes))
    assert by_name["nic.tx[0]"] == n and by_name["nic.rx[4]"] == n
    assert by_name["nvlink.tx[0]"] == n and by_name["nvlink.rx[1]"] == n
    assert net.link_bytes.sum() == 4 * n
    wire = dict(zip(names, net.link_wire_bytes))
    assert wire["nic.tx[0]"] == rdma_wire_bytes(n, 4096) and wire["nvlink.tx[0]"] == n


def test_host_endpoints_use_pcie_and_tcp_crosses_host_memory():
    topo = small_topology(**{"transport.protocol": "tcp", "transport.mtu_bytes": 1500,
                             "transport.host_copy_gbps": 100, "transport.message_overhead_ns": 5000})
    n = 1_000_000
    net, g = run(topo, [(topo.host_endpoint(0), 1, n), (0, 4, n)])
    classes = net.link_class_bytes()
    assert classes["pcie"] == 3 * n and classes["host_mem"] == 2 * n and classes["nic"] == 2 * n
    # TCP flow: bottleneck is the 100 Gbps host copy; alpha adds PCIe twice and 5 us per message
    alpha = (500 + 1000 + 500 + 1000 + 500) * 1e-9 + 5e-6
    assert g.finish_ps[1] * 1e-12 == pytest.approx(alpha + n / (100e9 / 8), rel=1e-9)
    assert tcp_wire_bytes(n, 1500) / (200e9 / 8) < n / (100e9 / 8)
    with pytest.raises(ValueError, match="host endpoints"):
        Network(Engine(), topo).start_flow(topo.host_endpoint(0), 4, 10)


def test_empty_and_self_messages_cost_only_latency():
    topo = small_topology()
    net, g = run(topo, [(0, 4, 0), (3, 3, 100)])
    assert g.finish_ps[0] == round(ALPHA_INTER_S * 1e12) and g.finish_ps[1] == 0
    assert net.link_bytes.sum() == 0


def _all_pairs(gpus: int, *, seed: int, low: int = 1, high: int = 1 << 20):
    """An AlltoAllv's flows: every ordered pair of distinct GPUs, sizes uniform in [low, high)."""
    src, dst = np.nonzero(~np.eye(gpus, dtype=bool))
    return src, dst, np.random.default_rng(seed).integers(low, high, src.size)


@pytest.mark.parametrize("seed", [3, 4, 5, 6])
def test_coalesced_recomputes_stay_within_1_percent_of_the_exact_fluid_model(seed):
    topo = small_topology(nodes=4, gpus=4)
    rng = np.random.default_rng(seed)
    p = topo.num_gpus
    src, dst = np.nonzero(~np.eye(p, dtype=bool))
    sizes = (65536 * rng.lognormal(0.0, 1.0, src.size)).astype(np.int64) + 1
    ends, solves = {}, {}
    for c in (0.0, 0.02):
        eng = Engine()
        net = Network(eng, topo, coalesce_rel=c)
        g = net.start_flows(src, dst, sizes)
        eng.run()
        ends[c], solves[c] = g.end_ps, net.solves
    assert abs(ends[0.02] / ends[0.0] - 1) < 0.01
    assert solves[0.02] < solves[0.0] / 1.5


def test_same_inputs_same_picoseconds():
    topo = small_topology()
    src, dst, sizes = _all_pairs(topo.num_gpus, seed=11, low=0, high=1 << 18)
    runs = []
    for _ in range(2):
        eng = Engine()
        net = Network(eng, topo)
        g = net.start_flows(src, dst, sizes)
        eng.run()
        runs.append((g.finish_ps.copy(), net.link_bytes.copy(), eng.events_processed))
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
    assert runs[0][2] == runs[1][2]


@pytest.mark.parametrize(
    "args, field",
    [(([0], [1, 2], [1]), "nbytes"), (([0], [1], [-1]), "nbytes"), (([0], [99], [1]), "dst"), (([-1], [1], [1]), "src")],
)
def test_bad_flows_name_the_parameter(args, field):
    net = Network(Engine(), small_topology())
    with pytest.raises(ValueError, match=field):
        net.start_flows(*args)


def test_bad_network_arguments():
    with pytest.raises(ValueError, match="coalesce_rel"):
        Network(Engine(), small_topology(), coalesce_rel=2)
    with pytest.raises(ValueError, match="engine"):
        Network(None, small_topology())


def test_non_blocking_spine_is_left_out_of_the_solve_without_changing_any_rate():
    """With oversubscription 1 a leaf bundle's capacity equals its leaf's NIC links, so its
    constraint is implied; dropping it from the solve must give identical times, and its bytes
    are still counted."""
    kw = {"inter_node.topology": "leaf_spine", "inter_node.nodes_per_leaf": 2, "inter_node.oversubscription": 1.0}
    fast = small_topology(nodes=4, gpus=2, **kw)
    full = small_topology(nodes=4, gpus=2, **kw)
    full.spine_redundant = False
    full.max_hops = full._max_hops()
    assert fast.spine_redundant and fast.max_hops < full.max_hops
    src, dst, sizes = _all_pairs(fast.num_gpus, seed=2)
    out = []
    for topo in (fast, full):
        net, g = run(topo, list(zip(src, dst, sizes)))
        out.append((g.finish_ps, net.link_class_bytes()))
    np.testing.assert_array_equal(out[0][0], out[1][0])
    assert out[0][1] == out[1][1] and out[0][1]["spine"] > 0


def test_compacting_finished_flows_changes_nothing():
    topo = small_topology(nodes=4, gpus=4)
    src, dst, sizes = _all_pairs(topo.num_gpus, seed=8)
    out = []
    for threshold in (10**9, 8):
        eng = Engine()
        net = Network(eng, topo)
        net.compact_min_flows = threshold
        g = net.start_flows(src, dst, sizes)
        eng.run()
        out.append((g.finish_ps, net.link_bytes))
    np.testing.assert_array_equal(out[0][0], out[1][0])
    np.testing.assert_array_equal(out[0][1], out[1][1])


class _FreshIndexes(Network):
    """A network that rebuilds the shared and throttled solves' problems for every solve."""

    def _solve(self, now, previous):
        self._tcache = None
        self._rcache = None
        super()._solve(now, previous)


def _changing_caps():
    """A throttle whose caps change from solve to solve (a third of the GPUs capped at 0.5-0.8
    of their rate, the rest left unlimited, the third moving each call), and its call count."""
    calls = [0]

    def throttle(tx, rx):
        calls[0] += 1
        return np.where(np.arange(tx.size) % 3 == calls[0] % 3, 0.5 + 0.1 * (calls[0] % 4), 1.0)
    return throttle, calls


def _two_groups_under_changing_caps(cls: type) -> tuple:
    """A network of class ``cls`` on 16 GPUs whose GPU caps change at every solve, running an
    all-pairs group and, started mid-way, a second overlapping group to the end: the network,
    both groups, and how many solves the throttle saw."""
    topo = small_topology(nodes=4, gpus=4)
    src, dst, sizes = _all_pairs(topo.num_gpus, seed=5)
    eng = Engine()
    net = cls(eng, topo)
    throttle, calls = _changing_caps()
    net.set_throttle(throttle)
    a = net.start_flows(src, dst, sizes)
    eng.run(until_ps=20_000_000)
    b = net.start_flows(dst[::3], src[::3], sizes[::3] // 2)  # a second group mid-way
    eng.run()
    return net, a, b, calls[0]


def test_reusing_the_shared_and_throttled_solves_indexes_changes_nothing():
    """The solve of several groups and the throttled (GPU-capped) solve keep their link indexes
    while the groups stay the same; with flows finishing, groups overlapping and the caps
    changing every solve, the times and bytes equal those of problems built afresh per solve."""
    out = []
    for cls in (Network, _FreshIndexes):
        net, a, b, solves = _two_groups_under_changing_caps(cls)
        out.append((a.finish_ps, b.finish_ps, net.link_bytes.copy(), solves))
    assert out[0][3] > 10
    for x, y in zip(out[0][:3], out[1][:3]):
        np.testing.assert_array_equal(x, y)


class _NoDisjoint(Network):
    """A network whose throttled per-flow solve always runs the general filling."""

    def _disjoint_rates(self, flows, capacity, alive):
        return None


def _ring_under_caps(cls: type, throttle, *, sizes_seed: int = 3) -> tuple:
    """One message per GPU to the next (a ring step: every GPU sends and receives one, each on
    links of its own), sizes uneven, under ``throttle``; then an all-pairs group beside a second
    ring. Returns the network and the three groups."""
    topo = small_topology(nodes=4, gpus=4)
    R = topo.num_gpus
    src = np.arange(R)
    dst = (src + 1) % R
    sizes = np.random.default_rng(sizes_seed).integers(1 << 16, 1 << 20, R)
    eng = Engine()
    net = cls(eng, topo)
    net.set_throttle(throttle)
    ring = net.start_flows(src, dst, sizes)
    eng.run()
    a_src, a_dst, a_sizes = _all_pairs(R, seed=5)
    pairs = net.start_flows(a_src, a_dst, a_sizes)
    ring2 = net.start_flows(dst, src, sizes[::-1])
    eng.run()
    return net, ring, pairs, ring2


def test_throttled_solve_of_link_disjoint_flows_gives_the_fillings_bits():
    """The throttled per-flow solve of link-disjoint flows (each GPU's one message on links of
    its own) takes each flow's least share instead of running the filling: every arrival and
    link byte is the filling's, to the bit, under caps that change at every solve; flows that
    share links (an all-pairs group) still run the filling."""
    out = []
    for cls in (Network, _NoDisjoint):
        throttle, calls = _changing_caps()
        net, ring, pairs, ring2 = _ring_under_caps(cls, throttle)
        out.append((ring.finish_ps, pairs.finish_ps, ring2.finish_ps, net.link_bytes.copy(), calls[0],
                    net.throttled_disjoint))
    assert out[0][4] == out[1][4] > 10
    assert out[0][5] > 5 and out[1][5] == 0  # the ring alone: the least shares
    for x, y in zip(out[0][:4], out[1][:4]):
        np.testing.assert_array_equal(x, y)
    assert np.all(out[0][0] > 0) and np.all(out[0][2] > 0)


def test_link_disjoint_flows_whose_shares_nearly_tie_run_the_filling():
    """Two distinct shares within the filling's tie threshold (1e-12 relative) freeze in one
    round at the lesser: the least-share shortcut declines and the filling gives the rates."""

    calls = [0]

    def nearly_tied(tx, rx):  # GPUs 0 and 1 capped at scales 1e-13 apart (their sends are equal)
        calls[0] += 1
        return np.where(np.arange(tx.size) == 0, 0.5, np.where(np.arange(tx.size) == 1, 0.5 * (1 + 1e-13), 1.0))

    out = []
    for cls in (Network, _NoDisjoint):
        calls[0] = 0
        topo = small_topology(nodes=4, gpus=4)
        src = np.arange(topo.num_gpus)
        eng = Engine()
        net = cls(eng, topo)
        net.set_throttle(nearly_tied)
        g = net.start_flows(src, (src + 1) % src.size, np.full(src.size, 1 << 20))
        eng.run()
        out.append((g.finish_ps, net.link_bytes.copy(), net.throttled_disjoint, calls[0]))
    # while both flows run, their shares tie: the solves decline the shortcut
    assert 0 <= out[0][2] < out[0][3] == out[1][3]
    for x, y in zip(out[0][:2], out[1][:2]):
        np.testing.assert_array_equal(x, y)


def test_single_messages_reuse_their_pairs_routes_and_change_nothing():
    """Single messages keep their route per (source, destination) pair (the framing factor,
    which depends on the size, taken afresh): copies between GPUs and host memory repeated over
    steps, of changing sizes, arrive at the same picoseconds and put the same bytes on every
    link as when each is routed anew."""
    out = []
    for keep in (True, False):
        topo = small_topology(nodes=2, gpus=4)
        eng = Engine()
        net = Network(eng, topo)
        if not keep:
            net.route_cache_max = 0
        rng = np.random.default_rng(11)
        groups = []
        for step in range(3):
            for rank in range(topo.num_gpus):
                host = topo.host_endpoint(rank // topo.gpus_per_node)
                src, dst = (host, rank) if (rank + step) % 2 else (rank, host)
                groups.append(net.start_flow(src, dst, float(rng.integers(1, 1 << 22))))
            groups.append(net.start_flow(0, 5, 4096.0 * (step + 1)))  # inter-node, framed
            eng.run()
        out.append(([g.end_ps for g in groups], net.link_bytes.copy(), net.link_wire_bytes.copy(), len(net._routes)))
    assert out[0][3] == 2 * 8 + 1 and out[1][3] == 0
    assert out[0][0] == out[1][0]
    np.testing.assert_array_equal(out[0][1], out[1][1])
    np.testing.assert_array_equal(out[0][2], out[1][2])


class _KeepsCaches(Network):
    """A network that keeps its solve caches after the groups they name have left the solver."""

    def _forget(self, gone):
        pass


def _names(net: Network, groups) -> bool:
    """Whether a solve cache of ``net`` still names one of ``groups`` (or their classes)."""
    named = [h for c in (net._tcache, net._rcache) if c is not None for h, _ in c["key"]]
    classes = [k for j in (net._joint_index, net._joint_fail) if j is not None for k in j[0]]
    return any(h is g for h in named for g in groups) or any(k is g._cls for k in classes for g in groups)


def test_caches_let_go_of_groups_that_left_the_solver_without_changing_anything():
    """A group whose flows have all finished is no longer named by the shared and throttled
    solves' caches (they could never match again, and would keep its arrays and, through its
    callback, its collective's until the next solve of their kind); the times and bytes are
    those of a network that keeps them."""
    out = []
    for cls in (Network, _KeepsCaches):
        net, a, b, solves = _two_groups_under_changing_caps(cls)
        assert a.done and b.done
        out.append((a.finish_ps, b.finish_ps, net.link_bytes.copy(), solves, _names(net, [a, b])))
    assert out[0][3] > 10 and out[0][3] == out[1][3]
    assert not out[0][4] and out[1][4]
    for x, y in zip(out[0][:3], out[1][:3]):
        np.testing.assert_array_equal(x, y)


def test_numpy_fallback_gives_the_same_picoseconds():
    """Without numba (NEONIC_NO_NUMBA=1) the numpy implementation yields identical results (also
    every flow's arrival where a dense part's rows are stepped lazily: the kernels run as Python)."""
    import os
    import subprocess
    import sys

    code = (
        "import numpy as np\n"
        "from tests.sim.network.conftest import small_topology\n"
        "from neonic.sim.engine import Engine\n"
        "from neonic.sim.network import Network, collectives as coll\n"
        "from neonic.sim.network.maxmin import HAVE_NUMBA\n"
        "topo = small_topology(4, 4)\n"
        "sizes = np.random.default_rng(1).integers(0, 1 << 20, (16, 16))\n"
        "eng = Engine(); net = Network(eng, topo)\n"
        "h = coll.alltoallv(net, None, sizes); eng.run()\n"
        "print(HAVE_NUMBA, h.end_ps, int(net.link_bytes.sum()))\n"
        "eng = Engine(); net = Network(eng, topo); net.dense_min_flows = 16\n"  # a dense NIC part, lazy rows
        "h = coll.alltoallv(net, None, sizes); eng.run()\n"
        "arrivals = np.concatenate([g.finish_ps for g in h.groups]).tobytes()\n"
        "print(h.end_ps, net.lazy_row_steps > 0, __import__('hashlib').sha1(arrivals).hexdigest())\n"
    )
    outs = []
    for disable in ("1", ""):
        env = dict(os.environ, NEONIC_NO_NUMBA=disable)
        res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        outs.append(res.stdout.split())
    assert outs[0][0] == "False" and outs[0][4] == "True"
    assert outs[0][1:] == outs[1][1:]


def test_on_solve_reports_every_solve():
    """Long runs report progress from the network: ``on_solve`` sees every solve."""
    topo = small_topology(nodes=2, gpus=2)
    eng = Engine()
    net = Network(eng, topo)
    seen = []
    net.on_solve = lambda n: seen.append((n.solves, n.active_flows))
    net.start_flows([0, 1, 2], [2, 3, 0], [1 << 20, 1 << 19, 1 << 18])
    eng.run()
    assert [s for s, _ in seen] == list(range(1, net.solves + 1)) and seen[0][1] == 3


@pytest.mark.parametrize("case", ["uneven", "slowed_nic", "second_group", "dst_major", "shuffled"])
def test_link_disjoint_parts_of_a_lone_group_are_solved_apart_without_changing_results(case):
    """A lone per-flow group whose flows fall into link-disjoint parts (an AlltoAllv: each node's
    NVLink flows, and the NIC flows) re-solves only the parts where flows finished; the others
    keep their rates and predictions and catch up on their bytes window by window. Against
    solving every part at every recompute (``components=False``): the same collective end and
    link bytes, every flow's arrival within 1 ps (a prediction that is mathematically an
    integer picosecond may round either way), and fewer flows seen by the solver."""
    topo = small_topology(nodes=4, gpus=4)
    if case == "slowed_nic":
        topo.capacity = topo.capacity.copy()
        topo.capacity[topo._base["nic_tx"] + 5] *= 0.37
    src, dst, sizes = _all_pairs(topo.num_gpus, seed=11)
    if case == "dst_major":  # still dense: every link's flows go to increasing partners
        o = np.lexsort((src, dst))
        src, dst, sizes = src[o], dst[o], sizes[o]
    if case == "shuffled":  # not: a link's load would be summed in another order
        o = np.random.default_rng(2).permutation(src.size)
        src, dst, sizes = src[o], dst[o], sizes[o]
    out = []
    for parts, dense in ((False, False), (True, False), (True, True)):
        eng = Engine()
        net = Network(eng, topo, components=parts)
        net.dense_min_flows = 16 if dense else 10**9  # the NIC part (192 flows) is bipartite
        a = net.start_flows(src, dst, sizes)
        groups = [a]
        if parts and case in ("dst_major", "shuffled"):
            eng.run(until_ps=1)
            assert any(d is not None for d in a._comp.dense) == (dense and case == "dst_major")
        if case == "second_group":  # joins mid-way: from then on the group is solved whole
            eng.run(until_ps=30_000_000)
            assert bool(a._comp) == parts and not a.done
            assert not parts or any(d is not None for d in a._comp.dense) == dense
            groups.append(net.start_flows(dst[::2], src[::2], sizes[::2] // 3))
        eng.run()
        out.append((groups, net))
    gb, nb = out[0]
    for ga, na in out[1:]:
        assert [g.end_ps for g in ga] == [g.end_ps for g in gb]
        for x, y in zip(ga, gb):
            assert np.abs(x.finish_ps - y.finish_ps).max() <= 1
        np.testing.assert_allclose(na.link_bytes, nb.link_bytes, rtol=1e-12)
        np.testing.assert_allclose(na.link_wire_bytes, nb.link_wire_bytes, rtol=1e-12)
        assert na.solved_flows == nb.solved_flows and na.solved_classes < nb.solved_classes


def _four_by_four(case: str):
    """4 nodes of 4 GPUs; ``case`` ``"slowed_nic"``: one NIC's receive link at 0.37 of its
    capacity (breaks the symmetry)."""
    topo = small_topology(nodes=4, gpus=4)
    if case == "slowed_nic":
        topo.capacity = topo.capacity.copy()
        topo.capacity[topo._base["nic_rx"] + 3] *= 0.37
    return topo


@pytest.mark.parametrize("case", ["uneven", "slowed_nic"])
def test_a_dense_part_cut_to_its_live_rows_and_columns_changes_no_bit(case):
    """As an AlltoAllv's sources finish, its dense NIC part keeps only the rows and columns that
    still hold a live flow (``dense_shrink_at``): the same arrival of every flow and the same
    link bytes, to the bit, as the whole matrix to the end; and the matrix does shrink."""
    topo = _four_by_four(case)
    src, dst, sizes = _all_pairs(topo.num_gpus, seed=5)
    out = []
    for shrink in (0.0, 0.5):
        eng = Engine()
        net = Network(eng, topo)
        net.dense_min_flows = 16  # the NIC part (192 flows) is dense
        net.dense_shrink_at = shrink
        g = net.start_flows(src, dst, sizes)
        cells = []
        while eng.step():
            if g._comp:
                d = [x for x in g._comp.dense if x is not None]
                cells.append(d[0][0].size if d else 0)
        out.append((g.finish_ps.copy(), net.link_bytes.copy(), net.link_wire_bytes.copy(), cells))
    (fa, la, wa, ca), (fb, lb, wb, cb) = out
    np.testing.assert_array_equal(fa, fb)
    np.testing.assert_array_equal(la, lb)
    np.testing.assert_array_equal(wa, wb)
    assert set(ca) == {ca[0]} and min(cb) <= ca[0] // 2


def test_a_large_part_stepped_in_two_threads_changes_no_bit():
    """A part of ``step_split_flows`` flows or more is stepped as two halves, one in a thread of
    its own: every flow's arrival, the link bytes and the solves are those of one call."""
    topo = small_topology(nodes=4, gpus=4)
    src, dst, sizes = _all_pairs(topo.num_gpus, seed=9)
    out = []
    for split in (10**9, 16):
        eng = Engine()
        net = Network(eng, topo)
        net.dense_min_flows = 16
        net.step_split_flows = split
        g = net.start_flows(src, dst, sizes)
        eng.run()
        out.append((g.finish_ps, net.link_bytes, net.link_wire_bytes, net.solves))
    for x, y in zip(*out):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("case", ["uneven", "slowed_nic", "compacted", "second_group", "two_threads"])
def test_a_dense_parts_rows_drained_lazily_agree_with_every_flow_stepped(case):
    """A dense part's rows whose live flows are all limited by the row's own link are stepped
    per row (``Network.lazy_rows``: one sum of drained bytes per row, its flows sorted by bytes
    left), the others flow by flow. Against stepping every flow (``lazy_rows=False``): the same
    collective end and link bytes, every flow's arrival within 1 ps (the row's sum rounds
    differently from draining each flow window by window), the same number of solves; and rows
    were stepped lazily. Also with compactions and the matrix cut to its live rows (the lazy
    rows written back and rebuilt), a second group joining mid-way (written back, then solved
    whole), and the per-flow rows stepped in two threads."""
    topo = small_topology(nodes=8, gpus=4)
    if case == "slowed_nic":
        topo.capacity = topo.capacity.copy()
        topo.capacity[topo._base["nic_rx"] + 5] *= 0.37
    rng = np.random.default_rng(12)
    src, dst = np.nonzero(~np.eye(topo.num_gpus, dtype=bool))
    load = rng.lognormal(0.0, 0.5, topo.num_gpus)  # per source: rows limited by their own NIC
    sizes = (65536 * load[src] * rng.uniform(0.25, 1.75, src.size)).astype(np.int64) + 1
    out = []
    for lazy in (False, True):
        eng = Engine()
        net = Network(eng, topo)
        net.lazy_rows = lazy
        net.dense_min_flows = 16  # the NIC part (896 flows) is dense
        if case == "compacted":
            net.compact_min_flows = 16
        if case == "two_threads":
            net.step_split_flows = 16
        groups = [net.start_flows(src, dst, sizes)]
        if case == "second_group":
            eng.run(until_ps=60_000_000)
            assert groups[0]._comp and not groups[0].done and (net.lazy_row_steps > 0) == lazy
            groups.append(net.start_flows(dst[::2], src[::2], sizes[::2] // 3))
        eng.run()
        out.append((groups, net))
    (ga, na), (gb, nb) = out
    assert nb.lazy_row_steps > 0 and na.lazy_row_steps == 0
    assert [g.end_ps for g in ga] == [g.end_ps for g in gb] and na.solves == nb.solves
    for x, y in zip(ga, gb):
        assert np.abs(x.finish_ps - y.finish_ps).max() <= 1
    np.testing.assert_allclose(nb.link_bytes, na.link_bytes, rtol=1e-12)
    np.testing.assert_allclose(nb.link_wire_bytes, na.link_wire_bytes, rtol=1e-12)


def test_lazy_rows_kernels_follow_each_flows_arithmetic():
    """``_kernels.lazy_begin`` / ``lazy_end`` on one row of three flows limited by the row's link:
    the row goes lazy after a step flow by flow, then a lazy step drains every flow by the row's
    windows and credit and predicts from its first live flow; its candidates are the prefix
    within the bound, their bytes left, rate and prediction written as each flow's own
    arithmetic gives them (to rounding); and a row no longer limited by its link is written back."""
    from neonic.sim.network import _kernels as K

    alive = np.ones(3, dtype=bool)
    rem = np.array([300.0, 100.0, 200.0])
    rate = np.full(3, 2.0)
    pred = np.full(3, np.inf)
    level = np.array([2.0, 5.0, 5.0, 5.0])  # link 0: the row; 1..3 the columns
    order = np.array([0, 1, 2, 3], dtype=np.int64)  # the row saturates first
    A = np.array([0], dtype=np.int64)
    W = np.ones((1, 3))
    colsort = np.arange(3, dtype=np.int64)
    rlo, rhi = np.array([0], dtype=np.int64), np.array([3], dtype=np.int64)
    on, D, L, head = np.zeros(1, dtype=bool), np.zeros(1), np.zeros(1), np.zeros(1, dtype=np.int64)
    perm, key = np.arange(3, dtype=np.int64), np.zeros(3)
    mode = np.empty(1, dtype=np.int8)
    lazy = (rlo, rhi, on, D, L, head, perm, key, 0)
    K.lazy_begin(alive, rem, rate, np.zeros(1), 0.0, 0.0, level, order, A, W, colsort, order[1:], *lazy, mode)
    assert mode[0] == 3 and not on[0]  # limited by its link, stepped flow by flow first
    K.lazy_end(alive, rem, rate, pred, 0.0, 0.0, mode, level, A, *lazy, True)
    assert on[0] and L[0] == 2.0 and perm.tolist() == [1, 2, 0] and key.tolist() == [300.0, 100.0, 200.0]
    level[0] = 4.0  # a rate rise: windows of 10 and 5 ps at 2, then the credit of 2 x 3 ps
    tmin, tmax = K.lazy_begin(alive, rem, rate, np.array([10.0, 5.0]), 3.0, 100.0, level, order, A, W, colsort,
                              order[1:], *lazy, mode)
    assert mode[0] == 1 and D[0] == 36.0 and L[0] == 4.0
    assert tmin == 100.0 + (100.0 - 36.0) / 4.0 and tmax == 100.0 + (300.0 - 36.0) / 4.0
    cand = K.lazy_end(alive, rem, rate, pred, 100.0, 150.0, mode, level, A, *lazy, True)
    assert cand.tolist() == [1, 2] and rem[1] == 64.0 and rem[2] == 164.0 and rate[1] == rate[2] == 4.0
    assert pred[1] == 116.0 and pred[2] == 141.0 and rem[0] == 300.0  # flow 0: not a candidate, still lazy
    order[:] = [2, 0, 1, 3]  # column 0 saturates first now: written back, then flow by flow
    K.lazy_begin(alive, rem, rate, np.zeros(1), 0.0, 100.0, level, order, A, W, colsort, order[1:][[0, 1, 2]],
                 *lazy, mode)
    assert mode[0] == 2 and not on[0] and rem.tolist() == [264.0, 64.0, 164.0] and rate.tolist() == [4.0] * 3


def test_small_parts_stepped_in_one_call_change_no_bit(monkeypatch):
    """A lone group's parts under ``step_split_flows`` flows are stepped together in one compiled
    call (``_kernels.step_parts``), each with the windows it sat out: every flow's arrival, the
    link bytes and the solves are those of a call per part; and the kernel gives each part
    ``step_range``'s rates, bytes, predictions and candidates for the same windows."""
    from neonic.sim.network import _kernels as K

    if K.step_parts is None:
        pytest.skip("numba not installed: a call per part")
    topo = small_topology(nodes=4, gpus=4)
    src, dst, sizes = _all_pairs(topo.num_gpus, seed=9)
    out = []
    for batched in (True, False):
        monkeypatch.setattr(K, "step_parts", K._step_parts_nb if batched else None)
        eng = Engine()
        net = Network(eng, topo)
        net.dense_min_flows = 16
        g = net.start_flows(src, dst, sizes)
        eng.run()
        out.append((g.finish_ps, net.link_bytes, net.link_wire_bytes, net.solves))
    for x, y in zip(*out):
        np.testing.assert_array_equal(x, y)
    rng = np.random.default_rng(3)
    F, L = 600, 30
    links = rng.integers(0, L, size=(F, 2)).astype(np.int32)
    level, order = rng.uniform(0.1, 2.0, L), rng.permutation(L).astype(np.int64)
    recomputes = np.array([0, 100, 250, 400, 1000, 1300], dtype=np.int64)
    los, his = np.array([0, 100, 350]), np.array([100, 350, 600])
    t_ref = np.array([0, 250, 1000])
    state = [rng.random(F) < 0.9, rng.uniform(0, 1e5, F), rng.uniform(0.1, 2.0, F), np.zeros(F)]
    for running in (True, False):
        a = [x.copy() for x in state]
        b = [x.copy() for x in state]
        tmin, tmax, cand, counts = K._step_parts_nb(a[0], a[1], a[2], recomputes, t_ref, 1000, running, 7.0, 1300, a[3],
                                                    0.02, 900.0, links, level, order, los, his)
        parts = np.split(cand, np.cumsum(counts)[:-1])
        for i in range(3):
            if running:
                w = recomputes[(recomputes >= t_ref[i]) & (recomputes <= 1000)].astype(float)
                dts = np.append(np.diff(w), float(1300 - max(1000, t_ref[i])))
            else:
                dts = np.zeros(1)
            r = K.step_range(b[0], b[1], b[2], dts, 7.0 if running else 0.0, 1300.0, b[3], 0.02, 900.0, links, level,
                             order, los[i], his[i])
            assert (r[0], r[1]) == (tmin[i], tmax[i])
            np.testing.assert_array_equal(r[2], parts[i])
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_node_of_names_each_endpoints_node_for_gpus_and_hosts_alike():
    """GPU ``e`` is on node ``e // gpus_per_node``, host ``num_gpus + n`` on node ``n``: for a
    large array of GPU ids (a shift), a mixed one, int32 ids and one id."""
    topo = small_topology(nodes=4, gpus=4)
    rng = np.random.default_rng(0)
    gpus = rng.integers(0, topo.num_gpus, 10_000)
    mixed = rng.integers(0, topo.num_endpoints, 10_000)
    for e in (gpus, gpus.astype(np.int32), mixed, np.int64(13), np.int64(topo.num_gpus + 2)):
        e = np.asarray(e)
        expect = np.where(e < topo.num_gpus, e // 4, e - topo.num_gpus)
        np.testing.assert_array_equal(topo.node_of(e), expect)
        assert topo.node_of(e).dtype == expect.dtype


def test_components_kernel_finds_the_link_disjoint_parts():
    """Flows sharing a finite link (transitively) are one part; infinite links join nothing; a
    flow on infinite links only is a part of its own. The numpy twin agrees."""
    from neonic.sim.network import _kernels as K

    finite = np.array([True] * 6 + [False, False])  # links 6, 7 infinite
    links = np.array([[0, 1], [1, 2], [3, 6], [4, 6], [3, 4], [6, 7], [5, 7], [2, 7]], dtype=np.int32)
    expect = [0, 0, 1, 1, 1, 2, 3, 0]  # flows 2 and 3 share no link, but both share one with flow 4
    assert K.components(links, finite).tolist() == expect
    assert K._components_np(links, finite).tolist() == expect


def test_the_dense_part_kernels_give_the_gathered_rows_results():
    """``_shared_dense``'s one-pass kernels equal the forms they replace: ``part_two_finite``
    is ``two_finite`` of the part's gathered rows (with their factors, live flags and indices,
    and the same refusal where a flow crosses other than two finite links), ``rest_in_span``
    whether another flow touches the span, ``cells_of`` the scattered cells, ``transposed`` the
    transposed copy (odd sizes, more than one tile)."""
    from neonic.sim.network import _kernels as K

    rng = np.random.default_rng(3)
    L = 50
    finite = np.ones(L, dtype=bool)
    finite[[7, 20, 33, 49]] = False
    for _ in range(50):
        F = int(rng.integers(1, 400))
        links = rng.integers(0, L, size=(F, 3)).astype(np.int32)
        links[:, 1] = rng.choice([7, 20, 33, 49], F)  # the middle hop infinite
        if rng.random() < 0.3:
            links[rng.integers(0, F), 1] = 5  # a flow of three finite links
        cflow = rng.integers(0, 3, F)
        part = int(rng.integers(0, 3))
        factor = rng.uniform(1.0, 1.1, F)
        alive = rng.random(F) < 0.7
        idx = np.flatnonzero(cflow == part)
        ok, a, b, in_a, in_b, fac, live, got_idx = K.part_two_finite(links, cflow, part, idx.size, finite, L, factor,
                                                                     alive)
        ok2, a2, b2, in_a2, in_b2 = K.two_finite(links[idx], finite, L)
        assert bool(ok) == bool(ok2)
        if ok:
            for x, y in ((a, a2), (b, b2), (in_a, in_a2), (in_b, in_b2), (fac, factor[idx]), (live, alive[idx]),
                         (got_idx, idx)):
                np.testing.assert_array_equal(x, y)
        span = np.zeros(L, dtype=bool)
        span[rng.integers(0, L, 3)] = True
        assert bool(K.rest_in_span(links, cflow, part, span)) == bool(span[links[cflow != part]].any())
        ia = rng.integers(0, 9, idx.size).astype(np.int32)
        jb = rng.integers(0, 9, idx.size).astype(np.int32)
        cell = np.full((F, 2), -1, dtype=np.int32)
        cell[idx, 0] = ia
        cell[idx, 1] = jb
        got = K.cells_of(F, idx, ia, jb)
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, cell)
    for n, m in ((1, 1), (3, 130), (129, 65), (64, 64)):
        W = rng.random((1, n, m))
        WT = K.transposed(W)
        assert WT.flags.c_contiguous
        np.testing.assert_array_equal(WT, W.transpose(0, 2, 1))


def test_the_compiled_part_step_equals_its_numpy_twin_bit_for_bit():
    """``_kernels.step_range`` (a lone group's part: drain the windows it sat out and the last
    one at the old rates, credit, new rates from the link levels, predictions, candidates) is
    compiled block by block with selects; on random states (finished flows, flows whose bytes
    run out in a window, rises and falls of rate, two and three links per flow, links that never
    saturate) it gives the numpy twin's rates, bytes, predictions and candidates to the bit."""
    from neonic.sim.network import _kernels as K

    if K.step_range is K._step_range_np:
        pytest.skip("numba not installed: the twin is the kernel")
    rng = np.random.default_rng(7)
    big = np.iinfo(np.int64).max
    for _ in range(200):
        F, H, L = int(rng.integers(1, 3000)), int(rng.integers(2, 4)), 40
        links = rng.integers(0, L, size=(F, H)).astype(np.int32)
        level = rng.uniform(0.1, 2.0, L)
        order = rng.permutation(L).astype(np.int64)
        never = rng.random(L) < 0.2
        level[never], order[never] = np.inf, big
        alive = rng.random(F) < 0.8
        rem = np.where(rng.random(F) < 0.05, 0.0, rng.uniform(0, 1e6, F))
        rate = rng.uniform(0.01, 2.0, F)
        pred = rng.uniform(0, 1e6, F)
        dts = rng.choice([0.0, 10.0, 3e5], size=int(rng.integers(1, 4)))
        span = float(rng.choice([0.0, 50.0]))
        lo = int(rng.integers(0, F))
        hi = int(rng.integers(lo, F + 1))
        args = (dts, span, 1e6, None, 0.02, float(rng.uniform(0, 1e6)), links, level, order, lo, hi)
        a = [alive.copy(), rem.copy(), rate.copy(), pred.copy()]
        b = [alive.copy(), rem.copy(), rate.copy(), pred.copy()]
        out = []
        for fn, (al, rm, rt, pr) in ((K.step_range, a), (K._step_range_np, b)):
            d, sp, now, _, co, yo, lk, lv, od, l0, h0 = args
            out.append(fn(al, rm, rt, d, sp, now, pr, co, yo, lk, lv, od, l0, h0))
        assert out[0][0] == out[1][0] and out[0][1] == out[1][1]
        np.testing.assert_array_equal(out[0][2], out[1][2])
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("case", ["plain", "slowed_nic"])
@pytest.mark.parametrize("throttled", [False, True])
def test_dense_nic_parts_in_shared_and_throttled_solves_change_nothing(case, throttled):
    """Overlapping AlltoAllvs (solved together, and with GPU caps: each flow also on its GPUs'
    virtual links) fill their NIC flows as weight matrices; the rounds, ties, load sums and
    unload order are those of the sparse filling, so every flow's arrival and the link bytes
    are bit-identical to solving them as entries (``components=False``). Three groups: the
    third leaves some NICs idle (its matrix spans the whole block of NIC links)."""
    topo = _four_by_four(case)
    src, dst, sizes = _all_pairs(topo.num_gpus, seed=11)
    out = []
    for parts in (False, True):
        eng = Engine()
        net = Network(eng, topo, components=parts)
        net.dense_min_flows = 16
        throttle, calls = _changing_caps()

        # unthrottled: a throttle that never limits (the lone first group is then solved whole,
        # not by its link-disjoint parts, whose arrivals may move by 1 ps)
        net.set_throttle(throttle if throttled else lambda tx, rx: None)
        a = net.start_flows(src, dst, sizes)
        eng.run(until_ps=3_000_000)
        b = net.start_flows(dst, src, sizes[::-1] // 2)
        eng.run(until_ps=9_000_000)
        c = net.start_flows(src[::3], dst[::3], sizes[::3] // 3)
        eng.run()
        out.append(([a, b, c], net))
        if parts:
            assert all(bool(g._dense) for g in (a, b, c))
    (g0, n0), (g1, n1) = out
    for x, y in zip(g0, g1):
        assert x.end_ps == y.end_ps
        np.testing.assert_array_equal(x.finish_ps, y.finish_ps)
    np.testing.assert_array_equal(n0.link_bytes, n1.link_bytes)
    np.testing.assert_array_equal(n0.link_wire_bytes, n1.link_wire_bytes)


class _NoReuse(Network):
    """Solves the links at every recompute (the reference for the reuse below)."""

    def _solve(self, now, previous):
        self._flow_set += 1
        super()._solve(now, previous)


def test_recomputes_for_new_scales_alone_reuse_the_unthrottled_rates():
    """A recompute requested because the GPUs' scales changed, with no flow finished or
    started since the last solve, has the same unthrottled problem: its rates are reused, and
    every arrival and link byte equals solving it again."""
    topo = small_topology(nodes=4, gpus=4)
    src, dst, sizes = _all_pairs(topo.num_gpus, seed=5)
    out = []
    for cls in (_NoReuse, Network):
        eng = Engine()
        net = cls(eng, topo)
        throttle, calls = _changing_caps()

        net.set_throttle(throttle)
        a = net.start_flows(src, dst, sizes)
        b = net.start_flows(dst[::2], src[::2], sizes[::2] // 3, tag="second")
        for t in range(1, 40):  # the scales change between flow completions too
            eng.schedule(t * 700_000, net.request_recompute)
        eng.run()
        out.append((a.finish_ps, b.finish_ps, net.link_bytes.copy(), net.solves, net.base_reused))
    assert out[0][4] == 0 and out[1][4] > 10 and out[0][3] == out[1][3]
    for x, y in zip(out[0][:3], out[1][:3]):
        np.testing.assert_array_equal(x, y)


def test_link_block_names_the_links_built_together():
    """``Topology.link_block``: the consecutive ids of one kind of link (every NIC's transmit
    link, ...), which a dense NIC part spans; an id out of range is refused by name."""
    topo = small_topology(nodes=4, gpus=4)
    b = topo._base
    assert topo.link_block(b["nic_tx"] + 5) == (b["nic_tx"], b["nic_rx"] - b["nic_tx"])
    assert topo.link_block(b["nic_rx"]) == (b["nic_rx"], 16)
    assert topo.link_block(0) == (0, 16)
    with pytest.raises(ValueError, match="link"):
        topo.link_block(topo.num_links)


class _CheckedSums(Network):
    """A network whose throttled solves also sum the traffic group by group, one compiled call
    each, and check that the batched sums are the same to the bit."""

    batched = 0

    def _traffic_sums(self, groups, flows, tx, rx):
        from neonic.sim.network import _kernels as K

        tx0, rx0 = tx.copy(), rx.copy()
        for g, (s, d) in zip(groups, flows["parts"]):
            K.traffic(s, d, g._cls.cls, g._cls.identity, g._alive, g._rate, tx0, rx0)
        super()._traffic_sums(groups, flows, tx, rx)
        np.testing.assert_array_equal(tx, tx0)
        np.testing.assert_array_equal(rx, rx0)
        small = [g._cls.identity and g._links.shape[0] <= self.small_group_flows for g in groups]
        self.batched += any(a and b for a, b in zip(small, small[1:]))


def test_runs_of_small_groups_sum_their_traffic_as_group_by_group():
    """Lone messages (a rank's copy each) started one after another beside a large group: the
    throttled solve sums the small groups' traffic in one call, the same sums as one per group."""
    topo = small_topology(nodes=4, gpus=4)
    src, dst, sizes = _all_pairs(topo.num_gpus, seed=3)
    eng = Engine()
    net = _CheckedSums(eng, topo)
    net.set_throttle(lambda tx, rx: np.where(np.arange(tx.size) % 2 == 0, 0.7, 1.0))
    rng = np.random.default_rng(4)
    for i in range(12):  # staggered lone messages, some before and some after the large group
        eng.schedule(i * 2_000_000, net.start_flow, int(rng.integers(0, 16)), int(rng.integers(0, 16)),
                     int(rng.integers(1 << 16, 1 << 20)))
    eng.schedule(9_000_000, net.start_flows, src, dst, sizes)
    eng.run()
    assert net.batched > 0


def test_the_one_class_step_equals_the_compiled_step_to_the_bit():
    """A lone message's step in plain Python (``_kernels.step_one``) gives the compiled step's
    remaining bytes, prediction, earliest/latest ends and candidates, bit for bit: drains,
    credits, rate rises and falls, finished classes, new groups (no window)."""
    from neonic.sim.network import _kernels as K

    rng = np.random.default_rng(7)
    no = np.zeros(1, dtype=np.int64)
    for case in range(400):
        alive = np.array([case % 9 != 0])
        rem = rng.uniform(0, 1e7, 1) * (case % 13 != 1)
        old = rng.uniform(1e-3, 0.1, 1)
        new = old * rng.choice([0.5, 1.0, 1.7])
        dt = float(rng.choice([0.0, rng.uniform(0, 1e8)]))
        span = float(rng.choice([0.0, rng.uniform(0, 1e6)]))
        now = float(rng.integers(0, 10 ** int(rng.choice([3, 12]))))  # small: every bit of r / rate shows
        youngest = now - float(rng.integers(0, 10**9))
        coalesce = float(rng.choice([0.0, 0.02]))
        a = [alive.copy(), rem.copy(), new.copy(), np.full(1, -5.0)]
        b = [alive.copy(), rem.copy(), new.copy(), np.full(1, -5.0)]
        got = K.step_one(a[0], a[1], old, dt, span, now, a[2], a[3], coalesce, youngest)
        want = K.step(b[0], b[1], old, dt, span, now, b[2], b[3], coalesce, youngest, False, no[None, :], b[3], no)
        assert repr(got[:2]) == repr(tuple(float(x) for x in want[:2]))
        np.testing.assert_array_equal(got[2], want[2])
        for x, y in zip(a, b):
            assert x.tobytes() == y.tobytes()


def test_the_source_run_traffic_sum_equals_the_per_flow_kernel_to_the_bit():
    """``network._traffic_runs`` (a run of flows from one source added in a register) gives
    ``_kernels.traffic``'s sums bit for bit: one class per flow and classes, dead classes and
    non-finite rates (which add 0), sources in runs and scattered, starting sums not zero."""
    from neonic.sim.network import _kernels as K
    from neonic.sim.network.network import _traffic_runs

    rng = np.random.default_rng(21)
    for identity in (True, False):
        for F, sort in ((0, True), (1, True), (7, False), (3000, True), (3000, False)):
            src = rng.integers(0, 25, F).astype(np.int32)
            if sort:
                src.sort()
            dst = rng.integers(0, 25, F).astype(np.int32)
            C = F if identity else 40
            cls = np.arange(F) if identity else rng.integers(0, C, F)
            alive = rng.random(max(C, 1)) < 0.7
            rate = rng.random(max(C, 1)) * 10.0 ** rng.integers(-12, 3, max(C, 1))
            rate[rng.random(max(C, 1)) < 0.1] = np.inf
            tx, rx = rng.random(25), rng.random(25)
            want = tx.copy(), rx.copy()
            K.traffic(src, dst, cls, identity, alive, rate, *want)
            got = tx.copy(), rx.copy()
            _traffic_runs(src, dst, cls, identity, alive, rate, *got)
            assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])



def test_the_compiled_throttle_caps_are_the_numpy_caps_to_the_bit():
    """``network._throttle_caps_nb`` (the throttled solve's GPU caps in one pass; plain Python
    under NEONIC_NO_NUMBA) gives ``_throttle_caps_np``'s caps, finite masks and "any below 1"
    bit for bit: scales clipped to [1e-9, 1] (0, -0.0, negatives, 1e-9 itself, exactly 1,
    above 1, NaN kept), send and receive sums that are 0, negative, tiny, huge, infinite or
    NaN, more endpoints than GPUs, every scale at or above 1 (nothing capped), and every one
    at or above 1 but a NaN (capped: NaN is not >= 1)."""
    from neonic.sim.network.network import _throttle_caps_nb, _throttle_caps_np

    rng = np.random.default_rng(19)
    for trial in range(60):
        R = int(rng.integers(1, 300))
        endpoints = R + int(rng.integers(0, 40))
        scale = rng.choice([0.0, -0.0, -0.5, 1e-9, 1e-12, 1.0, 1.0 + 1e-16, 3.0, np.nan, 0.3, 0.999999],
                           R) * (1.0 if trial % 2 else rng.random(R))
        if trial % 7 == 0:
            scale = 1.0 + rng.random(R)  # nothing below 1
        if trial % 7 == 3:  # nothing below 1 but a NaN: capped (the numpy form's all() is False)
            scale = 1.0 + rng.random(R)
            scale[int(rng.integers(0, R))] = np.nan
        sums = [rng.choice([0.0, -0.0, -1.0, 1e-300, 1e12, np.inf, np.nan, 7.5], R) * rng.random(R) for _ in range(2)]
        got = _throttle_caps_nb(scale, sums[0], sums[1], endpoints)
        want = _throttle_caps_np(scale, sums[0], sums[1], endpoints)
        for g, w in zip(got[:4], want[:4]):
            assert g.dtype == w.dtype and g.shape == w.shape == (endpoints,)
            assert g.tobytes() == w.tobytes(), trial
        assert bool(got[4]) is bool(want[4])
        assert bool(want[4]) is (trial % 7 != 0)


def test_one_class_per_flow_groups_share_their_counting_arrays_and_change_nothing():
    """Groups of one class per flow take their ids, flow indices and multiplicities as views of
    the network's shared ``0, 1, ...`` and ones (never written), and their sizes and factors
    as the per-flow arrays themselves: a run with the network's shared arrays poisoned after
    it gives the same arrivals as one with fresh copies everywhere."""
    from neonic.sim.network.classes import identity_classes

    cl = identity_classes(np.zeros((5, 2), dtype=np.int32), np.ones(3), np.zeros(3, dtype=bool),
                          iota=np.arange(9, dtype=np.int64))
    assert np.array_equal(cl.cls, np.arange(5)) and np.array_equal(cl.starts, np.arange(6))
    assert cl.members is cl.cls and cl.starts.base is not None
    cl = identity_classes(np.zeros((5, 2), dtype=np.int32), np.ones(3), np.zeros(3, dtype=bool),
                          iota=np.arange(3, dtype=np.int64))  # too short: a fresh one
    assert np.array_equal(cl.starts, np.arange(6))
    topo = small_topology(nodes=4, gpus=4)
    src, dst, sizes = _all_pairs(topo.num_gpus, seed=9)
    out = []
    for aggregate in (False, True):
        eng = Engine()
        net = Network(eng, topo, aggregate=aggregate)
        net.compact_min_flows = 8
        g = net.start_flows(src, dst, sizes)
        h = net.start_flows(dst[::2], src[::2], sizes[::2] // 3)
        eng.run()
        iota, ones = net._iota_buf.copy(), net._ones_buf.copy()
        assert np.array_equal(iota, np.arange(iota.size)) and np.all(ones == 1.0)
        out.append((g.finish_ps.copy(), h.finish_ps.copy(), net.link_bytes.copy()))
    for a, b in zip(*out):
        np.testing.assert_array_equal(a, b)
