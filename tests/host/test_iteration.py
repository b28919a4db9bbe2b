"""The one model of the iteration: the planner's fast evaluation is the simulator's op graph."""

from __future__ import annotations

import numpy as np
import pytest

from neonic.host.iteration import IterationSpec, ScheduleTemplate
from neonic.host.schedule import COLLECTIVE_PHASES, ScheduleRunner, build_graph
from neonic.sim.engine import Engine


def _durations(rng, spec: IterationSpec, ranks: int):
    """Random per-rank durations (ps) for rank-local phases, one per collective."""
    rank, coll = {}, {}
    for phase in spec.phases():
        if phase in COLLECTIVE_PHASES:
            coll[phase] = int(rng.integers(0, 2000))
        else:
            rank[phase] = rng.integers(0, 2000, ranks)
    return rank, coll


@pytest.mark.parametrize("mode,pipelined", [("training", True), ("training", False), ("inference", True)])
def test_fast_evaluation_is_the_simulated_schedule_without_contention(mode, pipelined):
    """With every op taking a fixed time (no shared resources), the event-driven runner and the
    vectorised list schedule give the same iteration time, rank by rank imbalance included."""
    rng = np.random.default_rng(7)
    spec = IterationSpec(mode=mode, pipelined=pipelined, warmup=1, iterations=2)
    ranks = 5
    for _ in range(5):
        rank, coll = _durations(rng, spec, ranks)

        def payload(phase, it, r):
            return coll[phase] if r < 0 else int(rank[phase][r])

        graph = build_graph(ranks, 3, payload, mode=mode, pipelined=pipelined, phases=spec.phases())
        eng = Engine()

        def backend(op, done):
            start = eng.now
            eng.after(op.payload, lambda: done(start, eng.now))

        ScheduleRunner(eng, graph, backend).run()
        it_end = [max(op.end for op in graph.ops if op.iteration == i) for i in range(3)]
        simulated = (it_end[2] - it_end[0]) / 2
        fast = ScheduleTemplate(spec).iteration_s({p: v.astype(float) for p, v in rank.items()},
                                                  {p: float(v) for p, v in coll.items()}, share_network=False)
        assert fast[0] == pytest.approx(simulated)


def test_collectives_are_barriers_so_phase_maxima_add_up():
    """Two ranks, each slow in a different phase: the iteration pays both slow ranks (sum of
    per-phase maxima), not the slowest rank's sum."""
    spec = IterationSpec(pipelined=False, warmup=0, iterations=1)
    t = ScheduleTemplate(spec)
    zero = {p: np.zeros(2) for p in spec.phases() if p not in COLLECTIVE_PHASES}
    fwd = dict(zero, emb_fwd=np.array([3.0, 0.0]), emb_bwd=np.array([0.0, 3.0]))
    assert t.iteration_s(fwd, {})[0] == pytest.approx(6.0)


def test_table_row_wise_reduction_precedes_the_pooled_alltoall():
    graph = build_graph(2, 1, {p: 1 for p in IterationSpec().phases()})
    rs = graph.get("pooled_rs", 0, 0)
    assert rs in graph.get("pooled_a2a", 0, 0).deps
    assert graph.get("grad_a2a", 0, 0) in graph.get("grad_ag", 0, 0).deps
    assert graph.get("grad_ag", 0, 0) in graph.get("emb_bwd", 0, 0).deps


def _shared_link_run(spec: IterationSpec, rank: dict, coll: dict, ranks: int) -> float:
    """The op graph on the event engine with every collective a transfer on one fairly shared
    link (rank-local ops take their fixed durations): the sharing the fast model stands for."""
    from neonic.sim.engine import ps_from_s
    from neonic.sim.resources import BandwidthLink

    its = spec.warmup + spec.iterations

    def payload(phase, it, r):
        return coll.get(phase, 0.0) if r < 0 else float(rank[phase][r])

    graph = build_graph(ranks, its, payload, mode=spec.mode, pipelined=spec.pipelined, phases=spec.phases())
    eng = Engine()
    link = BandwidthLink(eng, 1.0)

    def backend(op, done):
        start = eng.now
        if op.collective:
            link.transfer(op.payload * 1e9, lambda *_: done(start, eng.now))
        else:
            eng.after(ps_from_s(op.payload), lambda: done(start, eng.now))

    ScheduleRunner(eng, graph, backend).run()
    it_end = [max(op.end for op in graph.ops if op.iteration == i) for i in range(its)]
    return (it_end[-1] - it_end[spec.warmup - 1]) / spec.iterations * 1e-12


@pytest.mark.parametrize("input_ms", [2.0, 10.0, 20.0, 40.0])
def test_overlapping_collectives_share_the_network_as_a_shared_link_does(input_ms):
    """Neo's pipeline runs the next batch's input AlltoAll beside this batch's pooled AlltoAll,
    gradient AlltoAll and AllReduce: the fast model's sharing tracks an event simulation of one
    fairly shared link within 5%, and exceeds the time without sharing once they overlap."""
    spec = IterationSpec(warmup=2, iterations=3)
    t = ScheduleTemplate(spec)
    rng = np.random.default_rng(3)
    rank = {p: rng.uniform(0.5e-3, 2e-3, 4) for p in spec.phases() if p not in COLLECTIVE_PHASES}
    coll = {"input_a2a": input_ms * 1e-3, "pooled_a2a": 15e-3, "grad_a2a": 15e-3, "allreduce": 5e-3}
    alone = t.iteration_s(rank, coll, share_network=False)[0]
    shared = t.iteration_s(rank, coll)[0]
    simulated = _shared_link_run(spec, rank, coll, 4)
    assert shared == pytest.approx(simulated, rel=0.05)
    assert shared >= alone


def _buckets(rng, optimizer: str, tables: bool):
    """A backward split by three dense buckets (one closed inside the top MLP's backward),
    plus a data-parallel tables' bucket closed by the embedding backward when ``tables``."""
    from neonic.host.schedule import GradientBuckets

    d = lambda: int(rng.integers(1, 2000))  # noqa: E731
    segments = (("top_bwd", d(), 0), ("top_bwd", d(), None), ("inter_bwd", d(), 1), ("bot_bwd", d(), 2))
    parts = [frozenset({"top"}), frozenset({"top", "interaction"}), frozenset({"bottom"})]
    colls = [d(), d(), d()]
    if tables:
        parts.append(frozenset({"tables"}))
        colls.append(d())
    n_opt = len(colls) if optimizer == "per_bucket" else 1
    return GradientBuckets(segments, tuple(colls), tuple(parts), tuple(d() for _ in range(n_opt)), optimizer,
                           3 if tables else None)


@pytest.mark.parametrize("optimizer", ["after_last", "per_bucket"])
@pytest.mark.parametrize("tables", [False, True])
def test_fast_evaluation_prices_the_gradient_buckets_the_simulator_runs(optimizer, tables):
    """The template holds the same bucket ops as the simulator's graph (backward pieces, one
    AllReduce per bucket on its own stream, the optimizer steps, the next batch's dependencies
    on them): with fixed durations both give the same iteration time."""
    from neonic.host.iteration import build_iteration_graph, keyed_buckets

    rng = np.random.default_rng(11)
    spec = IterationSpec(warmup=1, iterations=2)
    ranks = 4
    for _ in range(4):
        rank, coll = _durations(rng, spec, ranks)
        buckets = _buckets(rng, optimizer, tables)

        def payload(phase, it, r):
            return coll[phase] if r < 0 else int(rank[phase][r])

        graph = build_iteration_graph(spec, ranks, payload, "compute", buckets, phases=spec.phases())
        per_it = [op for op in graph.ops if op.iteration == 1]
        assert sum(op.phase == "allreduce" for op in per_it) == len(buckets.buckets)
        eng = Engine()

        def backend(op, done):
            start = eng.now
            eng.after(op.payload, lambda: done(start, eng.now))

        ScheduleRunner(eng, graph, backend).run()
        it_end = [max(op.end for op in graph.ops if op.iteration == i) for i in range(3)]
        simulated = (it_end[2] - it_end[0]) / 2
        template = ScheduleTemplate(spec, buckets)
        _, table = keyed_buckets(buckets)
        assert set(table) <= set(template.keys)
        r = {p: v.astype(float) for p, v in rank.items()}
        c = {p: float(v) for p, v in coll.items() if p != "allreduce"}
        for key, v in table.items():
            (c if key.startswith("allreduce#") else r)[key] = np.full(ranks, float(v)) if not key.startswith(
                "allreduce#") else float(v)
        fast = template.iteration_s(r, c, share_network=False)
        assert fast[0] == pytest.approx(simulated)


def test_planner_template_holds_the_buckets_of_the_simulated_run():
    """The planner's cost model and the cluster run build their graph from one function: the
    run's AllReduce ops per iteration are the cost model's bucket AllReduces, and each is
    priced from the same collective algorithm (the payload's estimate is the template's time)."""
    from neonic.host.cluster import ClusterRun
    from neonic.host.planner.cost import CostModel
    from neonic.host.scenario import default_scenario

    run = ClusterRun(default_scenario())
    run.run()
    graph = run.graph
    ars = [op for op in graph.ops if op.phase == "allreduce" and op.iteration == 0]
    assert len(ars) > 1 and all(op.stream == "grad" for op in ars)
    cm = CostModel(run.scenario.workload, run.planner_system)
    times = cm.bucket_times(run.work.dp_allreduce_bytes)
    keys = [k for k in times if k.startswith("allreduce#")]
    assert len(keys) == len(ars)
    assert [times[k] for k in keys] == pytest.approx([op.payload.estimate_s for op in ars])


def test_dense_optimizer_step_reads_and_writes_adams_state():
    """One fused Adam step per iteration: gradient, weights and both moments read, weights and
    both moments written back, FP32 each (7 x 4 bytes per dense parameter)."""
    from neonic.host.iteration import dense_costs
    from neonic.host.workloads import preset
    from neonic.sim.gpu import gpu_preset

    gpu = gpu_preset("a100-40gb")
    d = dense_costs(gpu, preset("model-i"))
    assert d.dense_opt.hbm_bytes == d.params * 28
    assert d.dense_opt.memory_s == pytest.approx(d.params * 28 / (gpu.hbm_bytes_per_s * gpu.efficiency.hbm_stream))


def test_network_sharing_with_equal_flows_is_the_pairwise_half_rate_model():
    """ScheduleTemplate._shared_extra with equal weights computes, for every candidate, the
    pairwise fluid model (partners in the order they start, both at half rate while they
    overlap; only partners on the same link, NIC or NVLink), written here in plain Python."""
    spec = IterationSpec(warmup=2, iterations=3)
    t = ScheduleTemplate(spec)
    rng = np.random.default_rng(9)
    C, T = len(t._coll_slot), 7
    S = rng.uniform(0, 1e-2, (C, T))
    base = rng.uniform(0, 5e-3, (C, T))
    ref = np.zeros_like(base)
    for a, partners in t._sharing:
        for j in range(T):  # partners in the order they start
            clock, left = S[a, j], base[a, j]
            for b in sorted(partners, key=lambda b: S[b, j]):
                if t._coll_res[b] != t._coll_res[a]:
                    continue
                left -= min(left, max(S[b, j] - clock, 0.0))
                clock = max(clock, S[b, j])
                both = max(min(left, S[b, j] + base[b, j] - clock), 0.0) if S[b, j] + base[b, j] > clock else 0.0
                ref[a, j] += both
                ref[b, j] += both
                left -= both
                clock += 2 * both
    assert t._sharing
    np.testing.assert_allclose(t._shared_extra(S, base, np.ones(C)), ref, rtol=1e-12, atol=1e-18)


def _shared_extra_stepwise(t: ScheduleTemplate, S: np.ndarray, base: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """The network-sharing model stepped as its definition reads, in plain Python: every
    collective with partners walks all of them in the order they start (ties: the partners'
    order), each step on every (collective, candidate) at once, the collective's own delay
    added before its partners' (rows in order); a step with a partner on another link or
    without flows changes nothing."""
    C, T = S.shape
    w = np.broadcast_to(np.asarray(weight, float).reshape(C, -1), (C, T))
    extra = np.zeros((C, T))
    rows = list(t._sharing)
    order = {(a, c): sorted(p, key=lambda b: (S[b, c], p.index(b))) for a, p in rows for c in range(T)}
    clock = {(a, c): S[a, c] for a, _ in rows for c in range(T)}
    left = {(a, c): base[a, c] for a, _ in rows for c in range(T)}
    for j in range(max(len(p) for _, p in rows)):
        deltas = []
        for a, p in rows:
            for c in range(T):
                if j >= len(p):
                    continue
                b = order[a, c][j]
                if t._coll_res[b] != t._coll_res[a] or not (w[a, c] > 0 and w[b, c] > 0):
                    continue
                k = (a, c)
                left[k] -= min(left[k], max(S[b, c] - clock[k], 0.0))
                clock[k] = max(clock[k], S[b, c])
                fa = w[a, c] / (w[a, c] + w[b, c])
                fb = 1.0 - fa
                span = min(left[k] / fa if fa > 0 else np.inf,
                           max(S[b, c] + base[b, c] - clock[k], 0.0) / fb if fb > 0 else np.inf)
                span = max(span, 0.0) if np.isfinite(span) else 0.0
                extra[a, c] += span * fb
                deltas.append((b, c, span * fa))
                left[k] -= span * fa
                clock[k] += span
        for b, c, d in deltas:
            extra[b, c] += d
    return extra


@pytest.mark.parametrize("seed,T,grid,scale", [(0, 8, 3, 6), (1, 4, 6, 4), (2, 8, 10, 10)])
def test_network_sharing_sums_each_collectives_delays_in_the_steps_order(seed, T, grid, scale):
    """ScheduleTemplate._shared_extra, which walks each (collective, candidate) only through
    the partners that can change anything, gives bit for bit the model stepped through every
    partner of every collective (:func:`_shared_extra_stepwise`): the same delays, summed in
    the same order; with ties in the starts (on a grid), collectives without work, and flows
    that differ per collective and candidate, some zero. (Summed per collective in another
    order, e.g. by row before step, these cases differ in the last bits.)"""
    spec = IterationSpec(warmup=1, iterations=2, allreduce="hierarchical", ar_intra_time=0.3, ar_intra_bytes=0.4)
    t = ScheduleTemplate(spec)
    rng = np.random.default_rng(seed)
    C = len(t._coll_slot)
    S = rng.integers(0, grid, (C, T)) * 1e-3
    base = rng.uniform(0, scale * 1e-3, (C, T)) * (rng.uniform(size=(C, T)) > 0.2)
    weight = rng.integers(0, 4, (C, T)).astype(float)
    got = t._shared_extra(S, base, weight)
    ref = _shared_extra_stepwise(t, S, base, weight)
    assert ref.any()
    assert got.tobytes() == ref.tobytes()


def test_a_collective_with_more_flows_through_the_nic_loses_less_to_its_partners():
    """Concurrent collectives share a NIC in proportion to the flows each keeps open (max-min
    per flow): giving the comm stream's AlltoAlls 120 flows against 1 for every other
    collective takes most of their delay away and hands it to their partners."""
    spec = IterationSpec(warmup=2, iterations=3)
    t = ScheduleTemplate(spec)
    rng = np.random.default_rng(3)
    C, T = len(t._coll_slot), 5
    S = rng.uniform(0, 1e-2, (C, T))
    base = rng.uniform(1e-3, 5e-3, (C, T))
    comm = np.array([t.streams[i] == "comm" for i in sorted(t._coll_slot, key=t._coll_slot.get)])
    even = t._shared_extra(S, base, np.ones(C))
    heavy = t._shared_extra(S, base, np.where(comm, 120.0, 1.0))
    assert even[comm].sum() > 0
    assert heavy[comm].sum() < 0.05 * even[comm].sum()
    assert heavy[~comm].sum() > even[~comm].sum()


@pytest.mark.parametrize("span_ranks", [6, 1])
def test_hbm_sharing_sums_each_kernels_losses_to_its_collectives_in_closed_form(span_ranks):
    """ScheduleTemplate._hbm_extra: while a kernel and a collective overlap on a rank, each loses
    its fraction of its rate, so each ends later by its own work from where they meet, at its
    rate beside the other, until the other ends: a kernel by the sum over its collectives
    (its work: its span less what this pair added to it last pass, ``kown``), a collective by
    the largest loss over the kernels and ranks it meets (a barrier: its slowest rank; its work:
    its span less ``own``); written here in plain Python over every (kernel, collective,
    candidate, rank). The kernel's losses per pair come back for the next pass. Also where
    the kernels' spans are the same on every rank (one column) and their rates are not."""
    spec = IterationSpec(warmup=1, iterations=2)
    t = ScheduleTemplate(spec)
    rng = np.random.default_rng(4)
    C, T, N = len(t._coll_slot), 5, 6
    S = rng.uniform(0, 2e-2, (C, T))
    E = S + rng.uniform(1e-4, 4e-3, (C, T))
    kernels = [i for i, op in enumerate(t.ops) if not op[2]][:6]
    spans, pairs, kown = {}, {}, {}
    for i in kernels:
        s0 = rng.uniform(0, 2e-2, (T, span_ranks))
        spans[i] = (s0, s0 + rng.uniform(1e-4, 3e-3, (T, span_ranks)))
        slots = np.sort(rng.choice(C, 5, replace=False))
        k_loss = [rng.uniform(0, 0.5, shape) for shape in [(T, N), (T, 1), (1,), (N,), (T, N)]]
        c_loss = [rng.uniform(0, 0.5, (T, N)) * (j % 2) for j in range(5)]
        pairs[i] = (slots, k_loss, c_loss, np.array([c.max() > 0 for c in c_loss]))
        for c in slots[::2]:
            kown[i, int(c)] = rng.uniform(0, 0.3, (T, N)) * (spans[i][1] - s0)
    own = rng.uniform(0, 0.5, (C, T)) * (E - S)
    xr, xc, got = t._hbm_extra(spans, S, E, pairs, own, kown)
    ref_c = np.zeros((C, T))
    for i, (slots, k_loss, c_loss, _) in pairs.items():
        s0, e0 = (np.broadcast_to(a, (T, N)) for a in spans[i])
        ref = np.zeros((T, N))
        for h, c in enumerate(slots):
            k = np.broadcast_to(k_loss[h], (T, N))
            cl = np.broadcast_to(c_loss[h], (T, N))
            mine = kown.get((i, int(c)), np.zeros((T, N)))
            pair = np.zeros((T, N))
            for j in range(T):
                for r in range(N):
                    at = max(s0[j, r], S[c, j])
                    work = max(e0[j, r] - mine[j, r] - at, 0.0)    # the kernel's own, from there
                    pair[j, r] = min(work / (1 - k[j, r]), max(E[c, j] - at, 0.0)) * k[j, r]
                    work = max(E[c, j] - own[c, j] - at, 0.0)     # the collective's own, from there
                    lost = min(work / (1 - cl[j, r]), max(e0[j, r] - at, 0.0)) * cl[j, r]
                    ref_c[c, j] = max(ref_c[c, j], lost)
            ref += pair
            np.testing.assert_allclose(got.get((i, int(c)), np.zeros((T, N))), pair, rtol=1e-12, atol=1e-18)
        np.testing.assert_allclose(np.broadcast_to(xr[i], (T, N)), ref, rtol=1e-12, atol=1e-18)
    np.testing.assert_allclose(xc, ref_c, rtol=1e-12, atol=1e-18)
    assert ref_c.any() and any(np.any(v) for v in xr.values())


def test_a_kernel_beside_a_collective_ends_where_the_gpu_ends_it():
    """A memory-bound kernel that a collective's HBM traffic slows for part of its span (the
    embedding backward beside a gradient bucket's AllReduce): the template's fixed point ends
    the kernel where a fluid model of the shared rate does, and in a pass or two (its loss is
    in closed form), not by a fraction of the way a pass."""
    from neonic.sim.interference import kernel_comm_hbm_rate

    t = ScheduleTemplate(IterationSpec(warmup=1, iterations=1))
    k_dem, c_dem = 0.9, 0.6
    loss = 1.0 - float(kernel_comm_hbm_rate(np.float64(k_dem), np.float64(c_dem), 0.01))
    assert 0.2 < loss < 0.8
    kernel = next(i for i, op in enumerate(t.ops) if not op[2])
    c = 0
    for coll_ms in (2.0, 9.0):   # the kernel ends inside the collective, or after it
        s0, d0 = np.zeros((1, 1)), 4e-3
        S, E = np.full((1, 1), 1e-3), np.full((1, 1), 1e-3 + coll_ms * 1e-3)
        pairs = {kernel: (np.array([c]), [np.full((1, 1), loss)], [np.zeros((1, 1))], np.array([False]))}
        x, kown = 0.0, {}
        for p in range(2):
            xr, _, kown = t._hbm_extra({kernel: (s0, s0 + d0 + x)}, S, E, pairs, np.zeros((1, 1)), kown)
            x = xr[kernel]
        # fluid: full rate until 1 ms, then (1 - loss) until the collective ends or the work is done
        left = d0 - 1e-3
        inside = E[0, 0] - 1e-3
        end = 1e-3 + (left / (1 - loss) if left / (1 - loss) <= inside else inside + left - inside * (1 - loss))
        assert float(np.squeeze(d0 + x)) == pytest.approx(end, rel=1e-12)


def _local_alltoall(n: int, g: int, nbytes: int) -> np.ndarray:
    """Sizes of a node-local AlltoAll (the table-row-wise all-gather's pattern): every GPU sends
    ``nbytes`` to each other GPU of its node."""
    m = np.zeros((n, n), dtype=np.int64)
    for node in range(n // g):
        m[node * g:(node + 1) * g, node * g:(node + 1) * g] = nbytes
    np.fill_diagonal(m, 0)
    return m


def test_allreduce_terms_are_the_networks_own_phases():
    """A hierarchical AllReduce spends its intra-node share of the bytes in the node's rings
    (reduce-scatter and all-gather: 2 (k - 1) / k of the buffer per GPU, against 2 (M - 1) / M
    of a 1/k slice in the inter-node rings), and its intra-node share of the time as the
    network's closed forms price those phases; a node-local AlltoAll keeps one flow per local
    peer. A ring AllReduce, or a single node, has no intra-node phases of its own."""
    from neonic.host.iteration import allreduce_terms
    from neonic.sim.network import Topology, estimate_allreduce_time_s

    topo = Topology.from_preset("zionex", nodes=2)
    k, M = topo.gpus_per_node, topo.nodes
    terms = allreduce_terms(topo, "hierarchical")
    intra, inter = 2 * (k - 1) / k, 2 * (M - 1) / M / k
    assert terms["ar_intra_bytes"] == pytest.approx(intra / (intra + inter), rel=1e-6)
    assert terms["local_flows"] == k - 1 and terms["ar_intra_flows"] == 1
    # the inter-node rings alone: an AllReduce of a 1/k slice over one GPU per node
    total = estimate_allreduce_time_s(topo, 1 << 30, algorithm="hierarchical")
    rings = estimate_allreduce_time_s(topo, (1 << 30) // k, list(range(0, topo.num_gpus, k)), algorithm="ring")
    assert terms["ar_intra_time"] == pytest.approx(1 - rings / total, rel=1e-3)
    assert set(allreduce_terms(topo, "ring")) == {"local_flows"}
    assert set(allreduce_terms(Topology.from_preset("zionex", nodes=1), "hierarchical")) == {"local_flows"}


@pytest.mark.parametrize("ar_mib,local_mib", [(54, 40), (54, 10), (200, 20)])
def test_an_allreduce_beside_a_node_local_alltoall_shares_the_nvlink_as_the_network_does(ar_mib, local_mib):
    """A gradient bucket's hierarchical AllReduce that starts with the table-row-wise all-gather
    (a node-local AlltoAll) shares the GPUs' NVLink ports with it in its intra-node phases, one
    ring flow against seven peers' flows, and runs at full rate on the NIC in its inter-node
    phase: the template ends both when the flow-level network does (within 2%), where pricing
    the AllReduce as one NIC-bound op misses 20-40%."""
    from neonic.host.iteration import allreduce_terms
    from neonic.host.schedule import GradientBuckets
    from neonic.sim.network import Network, Topology, collectives, estimate_allreduce_time_s, estimate_alltoallv_time_s

    topo = Topology.from_preset("zionex", nodes=2)
    n, g = topo.num_gpus, topo.gpus_per_node
    sizes = _local_alltoall(n, g, local_mib << 20)
    eng = Engine()
    net = Network(eng, topo)
    ends = []
    collectives.allreduce(net, list(range(n)), ar_mib << 20, algorithm="hierarchical", on_done=lambda h: ends.append(eng.now))
    collectives.alltoallv(net, list(range(n)), sizes, algorithm="direct", on_done=lambda h: ends.append(eng.now))
    eng.run()
    simulated = max(ends) * 1e-12
    # one bucket, closed by the first backward piece: its AllReduce and the all-gather start
    # together when every other op lasts 0
    bucket = GradientBuckets((("top_bwd", 0, 0),), (0,), (frozenset({"top", "interaction", "bottom"}),), (0,),
                             "after_last", None)
    coll = {"grad_ag": estimate_alltoallv_time_s(topo, sizes),
            "allreduce#0": estimate_allreduce_time_s(topo, ar_mib << 20, algorithm="hierarchical")}
    rank = {p: np.zeros(n) for p in IterationSpec().phases() if p not in COLLECTIVE_PHASES}
    seen = ScheduleTemplate(IterationSpec(warmup=1, iterations=1, **allreduce_terms(topo)), bucket)
    blind = ScheduleTemplate(IterationSpec(warmup=1, iterations=1), bucket)
    assert seen.iteration_s(rank, coll)[0] == pytest.approx(simulated, rel=0.02)
    assert blind.iteration_s(rank, coll)[0] < 0.85 * simulated


@pytest.mark.parametrize("second_at_ms,second_ms", [(5.0, 4.0), (9.5, 4.0), (2.0, 1.0), (0.0, 6.0)])
def test_a_kernel_launched_beside_another_waits_for_its_last_wave_then_shares_hbm(second_at_ms, second_ms):
    """Two memory-bound kernels on one GPU (the dense optimizer's step launched while the
    embedding backward runs): the second gets SMs once the first one's last wave has started
    and then both share HBM; the template's pairwise delays end both where sim.interference's
    GPU ends them (within 3%), where ignoring the pair ends the second one more than 3% early."""
    from neonic.sim.engine import ps_from_s
    from neonic.sim.gpu import KernelCost, gpu_preset
    from neonic.sim.interference import GPUDevice

    first = KernelCost(compute_s=1e-3, memory_s=10e-3)
    second = KernelCost(compute_s=0.2e-3, memory_s=second_ms * 1e-3)
    eng = Engine()
    gpu = GPUDevice(eng, gpu_preset("a100-40gb"), interference=0.1)
    ends = {}
    gpu.launch(first, lambda s, e: ends.__setitem__(0, e * 1e-12))
    eng.after(ps_from_s(second_at_ms * 1e-3), lambda: gpu.launch(second, lambda s, e: ends.__setitem__(1, e * 1e-12)))
    eng.run()
    t = ScheduleTemplate(IterationSpec(interference=0.1))
    start = {0: np.zeros((1, 1)), 1: np.full((1, 1), second_at_ms * 1e-3)}
    dur = {0: first.time_s, 1: second.time_s}
    kern = {0: np.float64(first.memory_s / first.time_s), 1: np.float64(second.memory_s / second.time_s)}
    x, own = {0: 0.0, 1: 0.0}, {}
    for p in range(30):  # the template's fixed point: each pass from the last one's spans
        spans = {i: (start[i], start[i] + dur[i] + x[i]) for i in (0, 1)}
        new, new_own = t._kernel_extra(spans, kern, [(0, 1)], own)
        w = 1.0 if p == 0 else 0.5
        x = {i: (1 - w) * x[i] + w * new.get(i, 0.0) for i in (0, 1)}
        own = {k: tuple((1 - w) * a + w * b for a, b in zip(own.get(k, (0.0, 0.0)), v)) for k, v in new_own.items()}
    for i in (0, 1):
        assert float(np.squeeze(start[i] + dur[i] + x[i])) == pytest.approx(ends[i], rel=0.03)
    assert ends[1] - (second_at_ms * 1e-3 + second.time_s) > 0.03 * ends[1]   # alone: more than 3% early


def test_the_kernels_that_can_run_at_once_are_the_unordered_ones_on_two_streams():
    """The template pairs a compute-stream kernel with a dense optimizer step only where
    neither waits for the other through the graph: the step after the last bucket beside the
    same iteration's embedding backward, never beside the backward pieces whose gradients it
    steps, nor beside the next batch's forward (which waits for the step)."""
    rng = np.random.default_rng(2)
    t = ScheduleTemplate(IterationSpec(warmup=1, iterations=2), _buckets(rng, "after_last", False))
    names = {(t.ops[i][0].split("#")[0], t.ops[i][1], t.ops[j][0].split("#")[0], t.ops[j][1])
             for i, j in t._kernel_pairs}
    for it in range(3):
        assert ("emb_bwd", it, "dense_opt", it) in names
        assert not any(a == "bot_bwd" and b == "dense_opt" and i == k == it for a, i, b, k in names)
        assert not any(a in ("emb_fwd", "bot_fwd") and i == it + 1 and b == "dense_opt" and k == it
                       for a, i, b, k in names)


def test_a_kernel_is_priced_beside_only_the_collectives_it_can_run_beside(monkeypatch):
    """A kernel's HBM pairs leave out the collectives that follow it or that it follows (in the
    op graph, directly or through other ops): such a collective starts after the kernel ends on
    every rank, or ends before it starts on any, so they never meet. Pricing every pair of
    neighbouring iterations instead gives every plan the same figure, bit for bit."""
    from planner_cases import every_planners_plan, skewed_workload, small_system

    from neonic.host.planner import CostModel

    s = small_system(nodes=2, g=4, dram=50)
    w = skewed_workload(12)
    cost = CostModel(w, s)
    t = cost.template
    before = t._before()
    kernel = next(i for i, op in enumerate(t.ops) if op[0] == "emb_bwd")
    near = t._concurrent_colls(kernel)
    slots = {c: j for j, c in t._coll_slot.items()}
    assert near and len(near) < len(slots)
    for c, j in slots.items():
        ordered = (before[j] >> kernel) & 1 or (before[kernel] >> j) & 1
        assert bool(ordered) == (c not in near)
    plans = every_planners_plan(w, s, cost)
    pruned = [cost.evaluate(p).iteration_s for p in plans]
    monkeypatch.setattr(ScheduleTemplate, "_concurrent_colls", lambda self, i: frozenset(range(len(self._coll_slot))))
    every = [CostModel(w, s).evaluate(p).iteration_s for p in plans]
    assert len(plans) >= 8 and pruned == every


def _hbm_meetings_spec(ks0, ke0, kp, mr, mt, cm, S, E, own, has_own, kk, rk, cl, rc, kk1, rk1, cl1, rc1, brow,
                       mine, mine2, mrow, side, extra, full, xc):
    """What ``host.iteration._hbm_meetings`` computes, written as one loop over the ranks of
    each meeting that picks every row element by element (the kernel picks them once a
    meeting and splits the loop): the specification it is checked against."""
    for m in range(kp.shape[0]):
        k, t, c, r, b, q = kp[m], mt[m], cm[m], mr[m], brow[m], mrow[m]
        one = b < 0
        if one:
            b = -1 - b
        sc, ec = S[c, t], E[c, t]
        ecm = ec - own[c, t] if has_own else ec - 0.0
        lmax = -np.inf
        for w in range(ks0.shape[2]):
            s0, e0 = ks0[k, t, w], ke0[k, t, w]
            at = s0 if s0 >= sc else sc
            work = e0 - (mine[q, t, w] if q >= 0 else (mine2[-2 - q, t, w] if q < -1 else 0.0)) - at
            work = work if work >= 0.0 else 0.0
            left = ec - at
            left = left if left >= 0.0 else 0.0
            pa = work * (rk1[b, t, 0] if one else rk[b, t, w])
            pb = left * (kk1[b, t, 0] if one else kk[b, t, w])
            ov = pa if pa <= pb else pb
            extra[k, t, w] += ov
            full[r, t, w] = ov
            if side[m]:
                x = ecm - at
                x = x if x >= 0.0 else 0.0
                y = e0 - at
                y = y if y >= 0.0 else 0.0
                pa = x * (rc1[b, t, 0] if one else rc[b, t, w])
                pb = y * (cl1[b, t, 0] if one else cl[b, t, w])
                lost = pa if pa <= pb else pb
                if lost > lmax or w == 0:
                    lmax = lost
        if side[m]:
            xc[c, t] = xc[c, t] if xc[c, t] >= lmax else lmax


@pytest.mark.parametrize("has_own", [True, False])
def test_the_compiled_hbm_loop_gives_python_s_figures_bit_for_bit(has_own):
    """host.iteration._hbm_meetings compiled (numba) and run as plain Python (what
    NEONIC_NO_NUMBA runs) give the figures of its specification (one loop over the ranks,
    rows picked element by element: the losses, sums and maxima), bit for bit."""
    from neonic.host.iteration import _hbm_meetings
    from neonic.sim.compiled import HAVE_NUMBA

    rng = np.random.default_rng(7)
    K, T, W, C, R, B = 3, 4, 5, 6, 7, 5
    M = 20
    ks0 = rng.uniform(0, 1e-2, (K, T, W))
    ke0 = ks0 + rng.uniform(0, 3e-3, (K, T, W))
    S = rng.uniform(0, 1e-2, (C, T))
    E = S + rng.uniform(1e-4, 4e-3, (C, T))
    own = rng.uniform(0, 1e-4, (C, T))
    kk, rk, cl, rc = (rng.uniform(0, 0.6, (B, T, W)) for _ in range(4))
    kk1, rk1, cl1, rc1 = (rng.uniform(0, 0.6, (B, T, 1)) for _ in range(4))
    args = (ks0, ke0, rng.integers(0, K, M), rng.integers(0, R, M), rng.integers(0, T, M), rng.integers(0, C, M),
            S, E, own, has_own, kk, rk, cl, rc, kk1, rk1, cl1, rc1, rng.integers(-B, B, M),
            rng.uniform(0, 1e-4, (2, T, W)), rng.uniform(0, 1e-4, (2, T, W)), rng.integers(-3, 2, M),
            rng.uniform(size=M) < 0.6)
    outs = []
    kernels = (_hbm_meetings, _hbm_meetings.py_func) if HAVE_NUMBA else (_hbm_meetings,)
    for fn in (_hbm_meetings_spec, *kernels):
        extra, full, xc = np.zeros((K, T, W)), np.zeros((R, T, W)), rng.uniform(0, 1e-5, (C, T))
        xc[:] = 1e-6
        fn(*args, extra, full, xc)
        outs.append((extra, full, xc))
    for got in outs[1:]:
        for a, b in zip(outs[0], got):
            assert a.tobytes() == b.tobytes()
    assert outs[0][0].any() and (outs[0][2] > 1e-6).any()


def test_narrow_spans_are_those_whose_ranks_compare_equal():
    """host.iteration._narrow keeps one column exactly where numpy's ``(a == a[:, :1]).all()``
    holds (the compiled pass and its Python run alike): -0.0 equals 0.0, a NaN equals nothing,
    itself included, and a difference on the last rank of the last row counts."""
    from neonic.host.iteration import _narrow, _same_columns

    rng = np.random.default_rng(3)
    flat = np.repeat(rng.uniform(size=(4, 1)), 9, axis=1)
    cases = [flat, flat[:, :1], rng.uniform(size=(4, 9)), np.zeros((2, 5)), flat.T.copy()[:3]]
    last = flat.copy()
    last[-1, -1] = np.nextafter(last[-1, -1], 2.0)
    signed = flat.copy()
    signed[1] = 0.0
    signed[1, 4] = -0.0
    nan = flat.copy()
    nan[2] = np.nan
    cases += [last, signed, nan, flat[:, ::2], np.broadcast_to(flat[:, :1], (4, 7)), flat.astype(np.float32)]
    for a in cases:
        want = a.shape[1] > 1 and bool((a == a[:, :1]).all())
        got = _narrow(a)
        assert (got.shape == (a.shape[0], 1)) == (want or a.shape[1] == 1)
        assert np.array_equal(got, a[:, :1] if want else a, equal_nan=True)
        for fn in (_same_columns, getattr(_same_columns, "py_func", _same_columns)):
            if a.dtype == np.float64:
                assert fn(a) == bool((a == a[:, :1]).all())


def test_whole_byte_matrices_are_recognised_block_by_block():
    """An AlltoAllv payload's matrix already in whole bytes is shared, not copied by ``np.ceil``
    (``iteration_payloads``): ``_whole_bytes`` says whether ceil would change any entry, in any
    block of rows, and integer matrices are whole."""
    from neonic.host.iteration import _whole_bytes

    m = np.ceil(np.random.default_rng(3).lognormal(10.0, 1.0, (600, 40)))
    assert _whole_bytes(m) and _whole_bytes(m.astype(np.int64)) and _whole_bytes(np.zeros((0, 0)))
    m[517, 3] += 0.25  # in the third block of 256 rows
    assert not _whole_bytes(m)
    m[517, 3] = -0.0
    assert _whole_bytes(m)


def test_clearing_a_pass_s_loss_rows_zeroes_only_the_marked_rows_that_do_not_meet():
    """host.iteration._clear_rows (compiled and as Python): ``full[~meet] = 0.0`` on the rows
    marked as possibly non-zero, the others left as they are (a new buffer's zeros, untouched),
    and afterwards exactly the rows that meet are marked (the caller writes those)."""
    from neonic.host.iteration import _clear_rows

    rng = np.random.default_rng(11)
    R, T, W = 6, 3, 5
    full0 = rng.uniform(size=(R, T, W))
    meet = rng.uniform(size=(R, T)) < 0.5
    dirty0 = rng.uniform(size=(R, T)) < 0.5
    for fn in {_clear_rows, getattr(_clear_rows, "py_func", _clear_rows)}:
        full, dirty = full0.copy(), dirty0.copy()
        fn(full, meet, dirty)
        gone = dirty0 & ~meet
        assert (full[gone] == 0.0).all() and np.array_equal(full[~gone], full0[~gone])
        assert np.array_equal(dirty, meet)
    assert (dirty0 & ~meet).any() and (~dirty0 & ~meet).any()


def _both_passes(monkeypatch, fn):
    """``fn()`` with :meth:`ScheduleTemplate.iteration_s`'s passes compiled
    (``_schedule_pass``) and as the numpy loop, and how many passes ran compiled."""
    from neonic.host import iteration

    runs = []
    real = iteration._CompiledSchedule.run

    def counted(self, *args):
        got = real(self, *args)
        runs.append(got is not None)
        return got

    monkeypatch.setattr(iteration._CompiledSchedule, "run", counted)
    monkeypatch.setattr(iteration, "_COMPILED_PASS", True)
    fast = fn()
    monkeypatch.setattr(iteration, "_COMPILED_PASS", False)
    slow = fn()
    return fast, slow, runs


@pytest.mark.parametrize("share_network, contended", [(True, True), (False, True), (False, False)])
def test_the_compiled_schedule_pass_gives_the_numpy_loop_s_figures_bit_for_bit(monkeypatch, share_network, contended):
    """ScheduleTemplate.iteration_s's passes compiled (``_schedule_pass``: the ops' ends one
    figure per candidate, or one per rank where they differ) give the numpy loop's figures,
    bit for bit, over a batch of candidates with per-rank seconds of every shape the template
    takes ((T, N), (N,), a broadcast row, a figure), collectives, HBM and SM demands (the
    sharing models' stretches, wide and narrow, fed back pass after pass). The compiled pass
    runs as plain Python under NEONIC_NO_NUMBA."""
    spec = IterationSpec(warmup=1, iterations=2, comm_sm_share=0.25, ar_intra_time=0.3, ar_intra_bytes=0.4,
                         ar_intra_flows=3.0, local_flows=3.0)
    t = ScheduleTemplate(spec)
    rng = np.random.default_rng(11)
    T, N = 4, 6
    rank, coll, hbm, sm = {}, {}, {}, {}
    shapes = [(T, N), (N,), "row", ()]
    for n, key in enumerate(k for k in t.keys if k not in COLLECTIVE_PHASES):
        shape = shapes[n % len(shapes)]
        if shape == "row":
            rank[key] = np.broadcast_to(rng.uniform(1e-4, 2e-3, (T, 1)), (T, N))
        else:
            rank[key] = rng.uniform(1e-4, 2e-3, shape)
        hbm[key] = rng.uniform(0.2, 0.9, (T, N)) if key.startswith("emb") else 0.5
        sm[key] = 0.6
    for key in t.keys:
        if key in COLLECTIVE_PHASES:
            coll[key] = rng.uniform(5e-4, 3e-3, T)
            hbm[key] = rng.uniform(0.1, 0.4, (T, N))
    flows = {"input_a2a": rng.uniform(1, 8, T), "pooled_a2a": 4.0, "grad_a2a": 4.0}

    def run():
        return t.iteration_s(rank, coll, share_network=share_network, hbm=hbm if contended else None,
                             flows=flows, sm=sm if contended else None)

    fast, slow, runs = _both_passes(monkeypatch, run)
    assert fast.tobytes() == slow.tobytes()
    assert runs and all(runs) and (len(runs) > 2) == contended


def test_the_compiled_schedule_pass_prices_every_planners_plan_as_the_numpy_loop(monkeypatch):
    """Every planner's plan of a small cluster (gradient buckets, host-tier tables, the
    AllReduce's phases, SMs held by the collectives), priced by
    the planner's cost model with the schedule's passes compiled and as the numpy loop: the
    same seconds, bit for bit."""
    from planner_cases import every_planners_plan, skewed_workload, small_system

    from neonic.host.planner import CostModel

    spec = IterationSpec(comm_sm_share=0.25, ar_intra_time=0.3, ar_intra_bytes=0.4, ar_intra_flows=3.0,
                         local_flows=3.0)
    s = small_system(nodes=2, g=4, dram=50, iteration=spec)
    w = skewed_workload(12)
    plans = every_planners_plan(w, s, CostModel(w, s))

    def run():
        cost = CostModel(w, s)
        return np.array([cost.evaluate(p).iteration_s for p in plans])

    fast, slow, runs = _both_passes(monkeypatch, run)
    assert len(plans) >= 8 and fast.tobytes() == slow.tobytes()
    assert runs and all(runs)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_compiled_schedule_pass_is_the_numpy_pass(seed):
    """One pass of the schedule compiled (``_CompiledSchedule.run``, ``_schedule_pass``) and in
    numpy (``ScheduleTemplate._numpy_pass``, its specification), from the same seconds and
    stretches of every shape (per rank, one figure per candidate, a figure, ranks that are
    all the same): the same starts and ends of the collectives, the same iteration ends, the
    same spans (values and ``_narrow``'s shapes, and their starts' earliest) and latest ends
    where read, bit for bit."""
    from neonic.host.iteration import _CompiledSchedule

    spec = IterationSpec(warmup=1, iterations=2, ar_intra_time=0.3, ar_intra_bytes=0.4)
    t = ScheduleTemplate(spec)
    rng = np.random.default_rng(seed)
    T, N, C = 3, 5, len(t._coll_slot)
    kernels = [i for i, op in enumerate(t.ops) if not op[2]]
    flat = {}
    for n, key in enumerate(k for k in t.keys if k not in COLLECTIVE_PHASES):
        flat[key] = [rng.uniform(1e-4, 2e-3, (T, N)), rng.uniform(1e-4, 2e-3, (T, 1)),
                     rng.uniform(1e-4, 2e-3, (N,)), np.float64(1e-3)][(n + seed) % 4]
    flat.pop(t.keys[0 if t.keys[0] not in COLLECTIVE_PHASES else 1])        # a key without seconds
    stretched = [i for n, i in enumerate(kernels) if n % 3 != 2]
    pairs = {i: None for i in stretched[::2]}
    kops = set(stretched[1::2])
    xr = {}
    for n, i in enumerate(stretched):
        xr[i] = [0.0, rng.uniform(0, 1e-4, (T, N)), rng.uniform(0, 1e-4, (T, 1)),
                 np.full((T, N), 2e-5)][(n + seed) % 4]
    base = rng.uniform(1e-4, 3e-3, (C, T))
    extra = rng.uniform(0, 1e-4, (C, T))
    xc = rng.uniform(0, 1e-4, (C, T))
    need = [m or i in pairs for i, m in enumerate(t._needs_max())]
    fast = _CompiledSchedule(t, flat, T, N, set(pairs) | kops, need)
    assert fast.ok
    S1, E1, S2, E2 = (np.zeros((C, T)) for _ in range(4))
    spans1, emax1, it1 = fast.run(xr, base, extra, xc, S1, E1)
    spans2, emax2, it2 = t._numpy_pass(flat, xr, base, extra, xc, S2, E2, pairs, kops)
    assert S1.tobytes() == S2.tobytes() and E1.tobytes() == E2.tobytes() and it1.tobytes() == it2.tobytes()
    assert spans1.keys() == spans2.keys() == set(pairs) | kops
    shapes = set()
    for i, (s2, e2) in spans2.items():
        s1, e1 = spans1[i]
        assert s1.shape == s2.shape and e1.shape == e2.shape
        assert np.ascontiguousarray(s1).tobytes() == np.ascontiguousarray(s2).tobytes()
        assert np.ascontiguousarray(e1).tobytes() == np.ascontiguousarray(e2).tobytes()
        assert fast.smin[i].tobytes() == s2.min(axis=-1).tobytes()
        shapes.add(e2.shape)
    for i, read in enumerate(need):
        if read:
            assert np.asarray(emax1[i]).tobytes() == np.asarray(emax2[i]).tobytes()
    assert shapes == {(T, 1), (T, N)} and it2.any()


@pytest.mark.parametrize("compiled", [True, False])
def test_network_sharing_walks_its_lanes_compiled_or_in_numpy_to_the_same_bits(monkeypatch, compiled):
    """ScheduleTemplate._shared_extra's lanes walked one by one in a compiled loop
    (``_walk_lanes``; plain Python under NEONIC_NO_NUMBA) or all at once in numpy: the stepwise
    model's delays (:func:`_shared_extra_stepwise`), bit for bit, with ties in the starts,
    collectives without work and flows that differ, some zero."""
    from neonic.host import iteration

    monkeypatch.setattr(iteration, "_COMPILED_PASS", compiled)
    spec = IterationSpec(warmup=1, iterations=2, allreduce="hierarchical", ar_intra_time=0.3, ar_intra_bytes=0.4)
    t = ScheduleTemplate(spec)
    for seed, T, grid in ((0, 3, 4), (1, 5, 50), (2, 2, 2)):
        rng = np.random.default_rng(seed)
        C = len(t._coll_slot)
        S = rng.integers(0, grid, (C, T)) * 1e-3
        base = rng.uniform(0, 2e-3, (C, T)) * (rng.uniform(size=(C, T)) > 0.2)
        weight = rng.integers(0, 4, (C, T)).astype(float)
        ref = _shared_extra_stepwise(t, S, base, weight)
        assert ref.any()
        assert t._shared_extra(S, base, weight).tobytes() == ref.tobytes()


def test_a_ranks_fused_backward_sorts_once_over_all_its_shards_rows():
    """FBGEMM's backward sorts the linearized indices of all the rank's tables in one radix
    sort over the bits of their rows summed (``total_hash_size_bits``): two shards of 40,000
    rows each (16 bits apiece) make one sort of 17 bits, 3 passes, with one set of fixed
    times; not two sorts of 2 passes."""
    from neonic.host.iteration import fused_embedding_costs, rank_sort_cost
    from neonic.host.planner.work import ShardKernel
    from neonic.sim.gpu import embedding_sort_cost, embedding_update_cost, gpu_preset

    gpu = gpu_preset("a100-40gb")
    eff = gpu.efficiency

    def shard(rows, lookups):
        return ShardKernel(0, lookups, 4096, 512, 512, min(rows, lookups), 4, "hbm", 0.0, 0.0, 0.0, rows)

    ks = [shard(40_000, 300_000), shard(40_000, 200_000)]
    _, bwd = fused_embedding_costs(gpu, ks, 32e9, 2e9)
    sort = rank_sort_cost(gpu, ks)
    assert sort.time_s == embedding_sort_cost(gpu, 500_000, 80_000).time_s
    assert sort.overhead_s == pytest.approx(eff.radix_sort_fixed_s + 3 * eff.radix_sort_pass_s, rel=1e-15)
    updates = [embedding_update_cost(gpu, k.lookups, k.unique_rows, 512, 512, 4) for k in ks]
    expected = sum(u.time_s - u.overhead_s for u in updates) + eff.launch_overhead_s + sort.time_s
    assert bwd.time_s == pytest.approx(expected, rel=1e-12)
    assert bwd.overhead_s == pytest.approx(eff.launch_overhead_s + sort.overhead_s, rel=1e-12)
    per_shard = sum(embedding_sort_cost(gpu, k.lookups, k.rows).time_s for k in ks)
    assert abs(bwd.time_s - (expected - sort.time_s + per_shard)) > 1e-6   # a sort per shard would differ
    # the sort's bytes count in the backward's HBM traffic (its memory time, not its fixed times)
    assert bwd.hbm_bytes == pytest.approx(sum(u.hbm_bytes for u in updates) + sort.hbm_bytes, rel=1e-12)
    assert fused_embedding_costs(gpu, [], 32e9, 2e9)[1].time_s == 0.0


def test_the_planner_prices_each_ranks_backward_as_the_simulator_does():
    """The planner's state holds each rank's sort keys and rows and prices the sort after the
    sum (a step function of the rows: not additive over tables); its per-rank backward equals
    the simulator's payload (``fused_embedding_costs``) on every rank of every planner's plan,
    and the contributions the search adds give the same state as the derived iteration."""
    from planner_cases import every_planners_plan, skewed_workload, small_system

    from neonic.host.iteration import fused_embedding_costs
    from neonic.host.planner import CostModel, derive_iteration
    from neonic.host.planner.search import Placer

    system = small_system(nodes=2, g=4)
    workload = skewed_workload(12)
    cost = CostModel(workload, system)
    checked = 0
    for name, plan in enumerate(every_planners_plan(workload, system, cost)):
        work = derive_iteration(plan, workload, system)
        st = cost.state_of(work)
        placer = Placer(workload, system, cost)
        for tp in plan:
            placer.place(tp)
        assert np.array_equal(placer.state.vec[30:32], st.vec[30:32])
        assert np.allclose(placer.state.vec[1], st.vec[1], rtol=1e-12, atol=0)
        bwd = cost.columns(st)["bwd_compute"]
        phase = cost.phase_times(st.vec[None], [st.dp_bytes])[0]["emb_bwd"][0]
        for r, ks in enumerate(work.kernels):
            sim = fused_embedding_costs(system.gpu, ks, 32e9, 2e9, host_in_kernel=False)[1].time_s
            assert bwd[r] == pytest.approx(sim, rel=1e-12), (name, r)
            assert phase[r] == pytest.approx(sim, rel=1e-12), (name, r)
            assert st.vec[30, r] == sum(k.lookups for k in ks) and st.vec[31, r] == sum(k.rows for k in ks)
            checked += bool(ks)
    assert checked > 8
