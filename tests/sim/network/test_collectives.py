"""Collectives against their alpha-beta closed forms on contention-free cases, and accounting.

Cluster: N = 4 nodes x G = 4 GPUs (p = 16), NVSwitch B_nvl = 2400 Gbps per GPU each way with
alpha_intra = 200 + 100 + 200 ns; one 200 Gbps RoCE NIC per GPU (B_nic) behind one switch with
alpha_inter = 1000 + 500 + 1000 ns. W(m) is the RoCEv2 wire size of an m-byte message.
"""

from __future__ import annotations

import numpy as np
import pytest

from neonic.sim.engine import Engine
from neonic.sim.network import (
    Network,
    Topology,
    collectives as coll,
    estimate_all_gather_time_s,
    estimate_allreduce_time_s,
    estimate_alltoallv_time_s,
    estimate_reduce_scatter_time_s,
)
from neonic.sim.network.collectives import double_binary_trees
from neonic.sim.network.transport import rdma_wire_bytes

from .conftest import small_topology

N, G = 4, 4
P = N * G
B_NIC = 200e9 / 8
B_NVL = 2400e9 / 8
A_INTER = 2.5e-6
A_INTRA = 0.5e-6


def W(m: float) -> float:
    return float(rdma_wire_bytes(int(m), 4096))


@pytest.fixture(scope="module")
def topo() -> Topology:
    return small_topology(N, G)


def run(topo, fn, *args, **kw):
    eng = Engine()
    net = Network(eng, topo)
    h = fn(net, *args, **kw)
    eng.run()
    assert h.done
    return h, net


def test_direct_alltoall_closed_form(topo):
    """T = max(alpha_inter + (p - G) W(s) / B_nic, alpha_intra + (G - 1) s / B_nvl)."""
    s = 1 << 20
    h, _ = run(topo, coll.alltoall, None, s)
    expected = max(A_INTER + (P - G) * W(s) / B_NIC, A_INTRA + (G - 1) * s / B_NVL)
    assert h.time_s == pytest.approx(expected, rel=1e-6)
    assert estimate_alltoallv_time_s(topo, np.full((P, P), s)) == pytest.approx(expected, rel=1e-6)


def test_hierarchical_alltoall_closed_form(topo):
    """N = G = 4, uniform s. Node pair (n, m) is relayed by local rank (n + m) mod 4.

    Phase 1 (gather, with the intra-node blocks): the busiest NVLinks carry 3 messages of
    s + G s = 5 s (15 s); phase 2: one message of G^2 s = 16 s per relay NIC; phase 3 (scatter):
    each relay sends 3 messages of G s (12 s):
    T = (alpha_intra + 15 s / B_nvl) + (alpha_inter + W(16 s) / B_nic) + (alpha_intra + 12 s / B_nvl).
    """
    s = 1 << 16
    h, _ = run(topo, coll.alltoall, None, s, algorithm="hierarchical")
    expected = (A_INTRA + 15 * s / B_NVL) + (A_INTER + W(16 * s) / B_NIC) + (A_INTRA + 12 * s / B_NVL)
    assert h.time_s == pytest.approx(expected, rel=1e-6)
    est = estimate_alltoallv_time_s(topo, np.full((P, P), s), algorithm="hierarchical")
    assert est == pytest.approx(expected, rel=1e-6)


def _hop_latencies(ranks) -> list[float]:
    """Latency of each hop ranks[i] -> ranks[i + 1] of a ring on the test cluster (seconds)."""
    r = list(ranks)
    return [A_INTRA if r[i] // G == r[(i + 1) % len(r)] // G else A_INTER for i in range(len(r))]


def _fill(ranks, hops: int) -> float:
    """The pipeline fill: the largest latency sum of ``hops`` consecutive hops around the ring."""
    lat = _hop_latencies(ranks)
    return max(sum(lat[(end - k) % len(lat)] for k in range(hops)) for end in range(len(lat)))


@pytest.mark.parametrize("kind, steps", [("allreduce", 2 * (P - 1)), ("reduce_scatter", P - 1), ("all_gather", P - 1)])
def test_streamed_ring_closed_forms(topo, kind, steps):
    """Ring over ranks 0..p-1, streamed: each hop carries all its steps' bytes (steps messages of
    n/p bytes, framed as such) at once; the 4 node-boundary hops are limited by their NICs; the
    collective ends one pipeline fill (the latencies of ``steps`` consecutive hops: 12 NVLink
    hops of alpha_intra and 4 NIC hops of alpha_inter around the ring) after their last byte:

    T = steps W(n/p) / B_nic + fill; fill = 15.5 us (reduce-scatter, all-gather: every hop but
    one NVLink hop), 31 us (all-reduce: the ring once, then all but two NVLink hops).
    """
    n = P * (1 << 16)
    h, _ = run(topo, getattr(coll, kind), None, n)
    fill = _fill(range(P), steps)
    assert fill == pytest.approx({P - 1: 15.5e-6, 2 * (P - 1): 31e-6}[steps])
    expected = steps * W(n / P) / B_NIC + fill
    assert h.time_s == pytest.approx(expected, rel=1e-6)
    assert len(h.phases) == 1  # one phase of concurrent hops, no step barriers
    est = {"allreduce": estimate_allreduce_time_s, "reduce_scatter": estimate_reduce_scatter_time_s,
           "all_gather": estimate_all_gather_time_s}[kind](topo, n)
    assert est == pytest.approx(expected, rel=1e-6)


def _step_form(ranks, n: int, kind: str) -> list[tuple[int, int, int]]:
    """The ring run step by step: (src, dst, bytes) of every message. Segment k of the buffer
    has n // p bytes, plus one for k < n % p; at reduce-scatter / all-gather step s rank i sends
    segment (i - s) mod p; in an all-reduce's all-gather half (step p - 1 + t) it forwards
    segment (i + 1 - t) mod p, the one it completed last."""
    p = len(ranks)
    seg = [n // p + (1 if k < n % p else 0) for k in range(p)]
    msgs = []
    for s in range(2 * (p - 1) if kind == "allreduce" else p - 1):
        for i in range(p):
            k = (i - s) % p if s < p - 1 else (i + 1 - (s - (p - 1))) % p
            if seg[k]:
                msgs.append((ranks[i], ranks[(i + 1) % p], seg[k]))
    return msgs


@pytest.mark.parametrize("kind", ["allreduce", "reduce_scatter", "all_gather"])
@pytest.mark.parametrize("n", [P * 1000 + 7, 3 * P + 5, 5])
def test_streamed_rings_move_the_step_forms_bytes_over_every_link(topo, kind, n):
    """Per link, the payload bytes of the streamed ring are exactly those of the ring run step
    by step (uneven segments included), and its wire bytes those of the step form's messages."""
    ranks = [3, 0, 9, 14, 5, 6, 12, 1]
    h, _ = run(topo, getattr(coll, kind), ranks, n)
    msgs = _step_form(ranks, n, kind)
    src, dst, nb = (np.array(x) for x in zip(*msgs))
    route = topo.route(src, dst, nb)
    L = topo.num_links
    np.testing.assert_array_equal(h.link_bytes, topo.payload_loads(route, nb)[:L])
    np.testing.assert_allclose(h.link_wire_bytes, topo.link_loads(route, nb)[:L], rtol=1e-12)


def test_streamed_ring_equals_the_step_form_on_an_even_uncontended_ring(topo):
    """Equal segments and equal hop latencies (one GPU per node): the streamed ring takes what
    its steps would, steps (alpha_inter + W(n/p) / B_nic)."""
    ranks = [0, 4, 8, 12]
    n = 4 * (1 << 18)
    h, _ = run(topo, coll.allreduce, ranks, n)
    assert h.time_s == pytest.approx(2 * 3 * (A_INTER + W(n / 4) / B_NIC), rel=1e-6)


def test_hierarchical_allreduce_closed_form(topo):
    """Three streamed phases (node rings' reduce-scatter, the inter-node rings' all-reduce of
    each 1/G slice, node rings' all-gather), every ring even and of equal hop latencies:
    T = 2 (G-1)(alpha_intra + (n/G) / B_nvl) + 2 (N-1)(alpha_inter + W(n/(G N)) / B_nic)."""
    n = P * (1 << 16)
    h, _ = run(topo, coll.allreduce, None, n, algorithm="hierarchical")
    expected = 2 * (G - 1) * (A_INTRA + n / G / B_NVL) + 2 * (N - 1) * (A_INTER + W(n / (G * N)) / B_NIC)
    assert h.time_s == pytest.approx(expected, rel=1e-6)
    assert estimate_allreduce_time_s(topo, n, algorithm="hierarchical") == pytest.approx(expected, rel=1e-6)
    assert len(h.phases) == 3


def test_double_binary_tree_matches_its_phase_closed_form(topo):
    """Per level: alpha + (largest bytes any link carries in that level) / B, summed along the
    longest dependency chain (both trees run concurrently; each reduces and broadcasts n/2)."""
    n = 1 << 22
    h, _ = run(topo, coll.allreduce, None, n, algorithm="double_binary_tree")
    est = estimate_allreduce_time_s(topo, n, algorithm="double_binary_tree")
    assert h.time_s == pytest.approx(est, rel=0.01)


@pytest.mark.parametrize("p", [2, 5, 8, 16, 33])
def test_double_binary_trees_are_complementary_spanning_trees(p):
    for parent in double_binary_trees(p):
        assert (parent < 0).sum() == 1
        for i in range(p):  # every rank reaches the root
            x, hops = i, 0
            while parent[x] >= 0:
                x, hops = parent[x], hops + 1
                assert hops <= p
        assert np.bincount(parent[parent >= 0], minlength=p).max() <= 2
    a, b = double_binary_trees(p)
    interior_a = np.bincount(a[a >= 0], minlength=p) > 0
    interior_b = np.bincount(b[b >= 0], minlength=p) > 0
    if p % 2 == 0:
        assert not np.any(interior_a & interior_b)


def test_per_link_bytes_add_up_to_what_the_collective_moves(topo):
    rng = np.random.default_rng(5)
    sizes = rng.integers(0, 1 << 16, (P, P))
    node = np.arange(P) // G
    same = node[:, None] == node[None, :]
    off = ~np.eye(P, dtype=bool)
    inter_total = sizes[~same].sum()
    intra_total = sizes[same & off].sum()
    h, net = run(topo, coll.alltoallv, None, sizes)
    cls = h.link_class_bytes()
    # each message crosses one transmit and one receive link of its class
    assert cls["nic"] == 2 * inter_total and cls["nvlink"] == 2 * intra_total
    np.testing.assert_array_equal(net.link_bytes, h.link_bytes)
    h2, _ = run(topo, coll.alltoallv, None, sizes, algorithm="hierarchical")
    assert h2.link_class_bytes()["nic"] == 2 * inter_total
    assert h2.link_class_bytes()["nvlink"] >= 2 * intra_total
    # ring allreduce: 2 (p - 1) steps of p messages of n / p bytes
    n = P * 1000
    h3, _ = run(topo, coll.allreduce, None, n)
    assert h3.link_bytes.sum() == 2 * (2 * (P - 1) * n)


def test_chunked_pipelines_move_the_same_bytes(topo):
    n = P * (1 << 14)
    base, _ = run(topo, coll.allreduce, None, n, algorithm="double_binary_tree")
    piped, _ = run(topo, coll.allreduce, None, n, algorithm="double_binary_tree", chunks=4)
    np.testing.assert_allclose(piped.link_bytes, base.link_bytes)
    assert piped.time_s < base.time_s  # pipelining the tree levels overlaps them


def test_collectives_compete_with_other_traffic(topo):
    """Two identical alltoalls at once take the bandwidth term twice (the NICs are shared)."""
    s = 1 << 18
    eng = Engine()
    net = Network(eng, topo)
    a = coll.alltoall(net, None, s)
    b = coll.alltoall(net, None, s)
    eng.run()
    alone = (P - G) * W(s) / B_NIC
    assert a.time_s == pytest.approx(A_INTER + 2 * alone, rel=1e-6)
    assert b.end_ps == a.end_ps


def test_collective_started_later_and_on_a_subset(topo):
    eng = Engine()
    net = Network(eng, topo)
    hs = []
    eng.schedule(5_000_000, lambda: hs.append(coll.allreduce(net, [0, 4, 8, 12], 4 << 16)))
    eng.run()
    h = hs[0]
    assert h.start_ps == 5_000_000
    assert h.time_s == pytest.approx(2 * 3 * (A_INTER + W(1 << 16) / B_NIC), rel=1e-6)


def test_same_inputs_same_picoseconds(topo):
    rng = np.random.default_rng(9)
    sizes = rng.integers(0, 1 << 18, (P, P))
    t = [run(topo, coll.alltoallv, None, sizes)[0].end_ps for _ in range(2)]
    t += [run(topo, coll.allreduce, None, 1 << 20, algorithm="double_binary_tree", chunks=3)[0].end_ps for _ in range(2)]
    assert t[0] == t[1] and t[2] == t[3]


def test_zion_tcp_through_host_nics_runs_and_uses_host_links():
    topo = Topology.from_preset("zion", nodes=2)
    h, _ = run(topo, coll.alltoall, None, 1 << 16)
    cls = h.link_class_bytes()
    assert cls["pcie"] > 0 and cls["host_mem"] > 0 and cls["nic"] > 0


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda net: coll.alltoallv(net, None, np.ones((3, 3), dtype=int)), "sizes"),
        (lambda net: coll.alltoall(net, None, 10, algorithm="ring"), "algorithm"),
        (lambda net: coll.allreduce(net, None, 10, algorithm="butterfly"), "algorithm"),
        (lambda net: coll.allreduce(net, None, 10, chunks=0), "chunks"),
        (lambda net: coll.allreduce(net, None, 10, chunks=2), "chunks"),
        (lambda net: coll.allreduce(net, None, 10, algorithm="hierarchical", chunks=2), "chunks"),
        (lambda net: coll.allreduce(net, None, -1), "nbytes"),
        (lambda net: coll.allreduce(net, [0, 0], 10), "ranks"),
        (lambda net: coll.allreduce(net, [0, 1, 4], 10, algorithm="hierarchical"), "ranks"),
        (lambda net: coll.reduce_scatter(net, None, 10, algorithm="tree"), "algorithm"),
    ],
)
def test_bad_arguments_name_the_parameter(topo, call, field):
    with pytest.raises(ValueError, match=field):
        call(Network(Engine(), topo))


def test_a_route_resized_is_the_route_of_the_new_sizes():
    """Collectives route a phase's (src, dst) pairs once and resize them for later phases with
    the same pairs: only the framing factors depend on the sizes."""
    topo = small_topology(nodes=4, gpus=2)
    rng = np.random.default_rng(4)
    src = rng.integers(0, topo.num_gpus, 40)
    dst = (src + rng.integers(1, topo.num_gpus, 40)) % topo.num_gpus
    a, b = rng.integers(1, 1 << 20, 40), rng.integers(1, 1 << 16, 40)
    resized = topo.resized(topo.route(src, dst, a), b)
    fresh = topo.route(src, dst, b)
    for field in ("links", "latency_ps", "factor", "acct"):
        np.testing.assert_array_equal(getattr(resized, field), getattr(fresh, field))


def test_a_ring_beside_an_alltoall_gets_the_nic_in_proportion_to_its_queue_pairs():
    """A message that crosses nodes runs on NCCL's connections (module doc, "Connections"): a
    ring hop on the ring channels through its NIC, an AlltoAll message on the point-to-point
    channels per network peer; the NIC is shared per queue pair. Two GPUs on two nodes, an
    AllReduce of S bytes (a ring of 2: each hop carries S) and an AlltoAll (S per pair) started together: while both run
    the ring gets ring / (ring + p2p) of the NIC, then the AlltoAll has it alone."""
    topo2 = small_topology(2, 1)
    s = 1 << 27
    eng = Engine()
    net = Network(eng, topo2)
    ring = coll.allreduce(net, [0, 1], s)
    a2a = coll.alltoall(net, [0, 1], s)
    eng.run()
    q_ring, q_p2p = coll.NCCL_CONNECTIONS.ring, coll.NCCL_CONNECTIONS.p2p
    t = W(s) / B_NIC
    assert ring.time_s == pytest.approx(t * (q_ring + q_p2p) / q_ring, rel=2e-3)
    assert a2a.time_s == pytest.approx(2 * t, rel=2e-3)
    # alone, a collective moves its bytes as before (its connections split the NIC among them)
    alone, _ = run(topo2, coll.allreduce, [0, 1], s)
    assert alone.time_s == pytest.approx(t, rel=2e-3)


def test_connections_split_a_message_into_equal_flows_that_sum_to_it(topo):
    _, phases = coll.build_phases(topo, "allreduce", nbytes=(1 << 20) + 3, algorithm="hierarchical")
    inter = [ph for ph in phases if ph.conns is not None]
    assert len(inter) == 1 and np.all(inter[0].conns == coll.NCCL_CONNECTIONS.ring)
    ph = inter[0]
    src, dst, nb, route = coll.split_connections(ph, coll.phase_route(topo, ph))
    k = coll.NCCL_CONNECTIONS.ring
    assert src.size == k * ph.src.size and route.links.shape[1] == src.size
    assert nb.reshape(-1, k).sum(axis=1).tolist() == ph.nbytes.tolist()
    assert nb.max() - nb.min() <= max(1, int(ph.nbytes.max() - ph.nbytes.min()))
    # node-local messages keep one flow each
    assert all(p.conns is None for p in phases if p is not ph)


def test_nic_flows_per_gpu_counts_queue_pairs(topo):
    c = coll.NCCL_CONNECTIONS
    assert coll.nic_flows_per_gpu(topo, "alltoallv", "direct") == (P - G) * c.p2p
    assert coll.nic_flows_per_gpu(topo, "allreduce", "hierarchical") == c.ring
    assert coll.nic_flows_per_gpu(topo, "allreduce", "ring") == c.ring


def _nic_flows_built(topology, algorithm, ranks):
    """The AlltoAll count from its built phases (the definition the closed form must match)."""
    r = np.arange(topology.num_gpus) if ranks is None else np.asarray(ranks)
    sizes = np.ones((r.size, r.size), dtype=np.int64)
    np.fill_diagonal(sizes, 0)
    _, phases = coll.build_phases(topology, "alltoallv", r, sizes=sizes, algorithm=algorithm)
    return coll.busiest_nic_flows(topology, phases)


@pytest.mark.parametrize("nodes,gpn", [(1, 4), (2, 4), (3, 4), (5, 2), (9, 4), (11, 8), (4, 1)])
def test_nic_flows_per_gpu_alltoall_matches_its_phases(nodes, gpn):
    """The AlltoAll count is a closed form (its build was 16.8M messages at 4096 GPUs): the same
    as counting the built phases' connections, for both algorithms, all ranks and subsets (a
    node's ranks left out, uneven rank counts per node for the direct algorithm)."""
    t = small_topology(nodes, gpn)
    p = t.num_gpus
    subsets = [None, np.arange(0, p, gpn), np.arange(p)[np.arange(p) % gpn != 0] if gpn > 1 else None,
               np.arange(min(gpn + 1, p))]
    for ranks in subsets:
        for algorithm in ("direct", "hierarchical"):
            try:
                want = _nic_flows_built(t, algorithm, ranks)
            except ValueError as error:  # uneven nodes: the same error from both
                with pytest.raises(ValueError, match=str(error)[:20]):
                    coll.nic_flows_per_gpu(t, "alltoallv", algorithm, ranks)
                continue
            assert coll.nic_flows_per_gpu(t, "alltoallv", algorithm, ranks) == want
            assert coll.nic_flows_per_gpu(t, "alltoall", algorithm, ranks) == want
    with pytest.raises(ValueError, match="algorithm"):
        coll.nic_flows_per_gpu(t, "alltoallv", "ring")


@pytest.mark.parametrize("field", ["ring_channels_per_nic", "p2p_channels_per_net_peer", "qps_per_connection"])
def test_bad_connection_counts_name_the_field(field):
    with pytest.raises(ValueError, match=field):
        coll.NicConnections(**{field: 0})


@pytest.mark.parametrize("preset", ["zionex", "zion", "dgx-h100", "gh200", "mi300a"])
@pytest.mark.parametrize("leaf_spine", [None, 1.0, 2.0])
def test_compiled_routes_equal_the_array_routes(preset, leaf_spine, monkeypatch):
    """Large batches between GPUs are routed by one compiled pass (``Topology._route_gpus``),
    and their per-link loads summed by one (``Topology._loads``):
    the same links, accounted links, latencies, factors and loads as the array operations, on every
    preset (NVSwitch and point-to-point fabrics, NICs on GPUs or hosts, RDMA and TCP), with a
    leaf/spine fabric non-blocking (spine links accounted) and oversubscribed (spine hops)."""
    from neonic.sim.network import load_preset

    d = load_preset(preset).to_dict()
    d["cluster"]["nodes"] = 8
    if leaf_spine is not None:
        d["inter_node"] = {"topology": "leaf_spine", "switch_latency_ns": 700, "nodes_per_leaf": 2,
                           "oversubscription": leaf_spine}
    topo = Topology.from_config(d)
    p = topo.num_gpus
    rng = np.random.default_rng(p)
    src = np.repeat(np.arange(p), p)
    dst = np.tile(np.arange(p), p)  # every pair, self-messages included
    nb = rng.integers(0, 1 << 20, src.size)
    monkeypatch.setattr(Topology, "compiled_route_min", 1 << 40)
    want = topo.route(src, dst, nb)
    loads = topo.link_loads(want, nb), topo.payload_loads(want, nb)
    monkeypatch.setattr(Topology, "compiled_route_min", 1)
    got = topo.route(src, dst, nb)
    for field in ("links", "acct", "latency_ps", "factor"):
        a, b = getattr(got, field), getattr(want, field)
        assert a.dtype == b.dtype and np.array_equal(a, b), field
    # the per-link loads of a large batch: the same sums, hop by hop (bit for bit)
    assert np.array_equal(topo.link_loads(got, nb), loads[0]) and np.array_equal(topo.payload_loads(got, nb), loads[1])
    # both in one pass (the sizes read as integers, or as floats): the same two sums, bit for bit
    for sizes in (nb, nb.astype(np.float64)):
        pay, wire = topo.both_loads(got, sizes)
        assert np.array_equal(pay, loads[1]) and np.array_equal(wire, loads[0])
    host = topo.route(np.array([topo.host_endpoint(0), 1]), np.array([0, topo.host_endpoint(0)]))
    assert host.links[0].tolist() == [topo._base["pcie_down"] + 0, topo._base["pcie_up"] + 1]  # (array path)


def test_alltoallv_pairs_and_whole_number_check_match_numpy():
    """The direct AlltoAllv's pairs (``_off_diagonal``: np.nonzero off the diagonal, in its
    order, with the sizes there) and the whole-number check of float sizes (``_whole``: what
    ``np.mod(sizes, 1) == 0`` everywhere says, for inf, NaN, -0.0 and fractions too, and for
    views that are not contiguous)."""
    from neonic.sim.network.collectives import _off_diagonal, _whole

    rng = np.random.default_rng(7)
    for p in (1, 5, 33):
        s = rng.integers(0, 3, (p, p)) * rng.integers(1, 1 << 40, (p, p))
        nz = s != 0
        np.fill_diagonal(nz, False)
        i, j = np.nonzero(nz)
        got = _off_diagonal(np.ascontiguousarray(s, dtype=np.int64))
        assert [a.dtype for a in got] == [np.dtype(np.int64)] * 3
        assert np.array_equal(got[0], i) and np.array_equal(got[1], j) and np.array_equal(got[2], s[i, j])
    for bad in (np.inf, -np.inf, np.nan, 0.5, -2.25, 1e-300):
        m = np.array([[0.0, 3.0], [bad, -0.0]])
        with np.errstate(invalid="ignore"):
            assert _whole(m) is False and not np.all(np.mod(m, 1) == 0)
    for good in (np.array([[0.0, -0.0], [2.0**60, 7.0]]), np.zeros((0, 0)), np.array([[1.0]], dtype=np.float32)):
        assert _whole(good) is True and np.all(np.mod(good, 1) == 0)
    frac = np.arange(12.0).reshape(3, 4)
    frac[2, 1] = 0.5
    assert _whole(frac.T) is False and _whole(frac[:2].T) is True  # views: transposed, sliced
