"""``neonic bench network``: speed of the flow-level network model and its closed-form agreement.

Figures (all measured when the command runs):
- ``alltoallv_128_wall_s`` / ``alltoallv_1024_wall_s``: wall seconds to simulate one direct
  AlltoAllv with skewed per-pair sizes among 128 GPUs (the ``zionex`` preset) and among 1024
  GPUs (zionex scaled to 128 nodes on a leaf/spine fabric, 16 nodes per leaf, non-blocking).
  Sizes: 64 KiB x a per-source lognormal(0, 0.5) load factor x a per-pair uniform(0.25, 1.75).
- ``allreduce_1024_wall_s``: wall seconds to simulate one ring AllReduce of 64 MiB on 1024 GPUs.
- ``alltoall_1024_wall_s`` / ``alltoall_4096_wall_s``: one uniform AlltoAll (64 KiB per pair) on
  1024 / 4096 GPUs (the same zionex family, 512 nodes at 4096), solved by flow class
  (``sim.network.classes``); ``*_classes`` is the number of classes the solver saw per solve.
  ``alltoall_1024_per_flow_wall_s``: the same 1024-GPU run with one class per flow.
- ``alltoall_1024_throttled_wall_s``: that AlltoAll under a GPU throttle (every GPU's
  collectives at 0.4-0.85 of their link-allowed rate, changing at every solve, and a re-solve
  requested every 2 us: ``Network.set_throttle``), whose throttled solves run over the classes;
  ``alltoall_1024_throttled_by_class`` counts them (a synthetic throttle: a speed case only).
- ``alltoallv_1024_beside_wall_s``: model-a's case at 1024 GPUs: an AlltoAllv whose sizes are
  one lognormal(0, 0.5) x 64 KiB figure per destination (a rank-1 matrix, as the planner's
  Outer terms give; here by the destination's place in its node, so nodes are alike) beside an
  intra-node AlltoAll of 1 MiB per pair, started together, under a throttle that caps one
  node's 8 GPUs at 0.4-0.85 (changing with the simulated time, re-solved every 2 us): solved
  over the two groups' joint classes (``sim.network.network``); ``*_joint_solves`` counts the
  solves over them, and ``alltoallv_1024_beside_per_flow_cpu_s`` is the same run per flow
  (``aggregate=False``), for comparison (a synthetic throttle: a speed case only).
- ``alltoallv_4096_wall_s``: model-a's input AlltoAllv on 4096 GPUs (512 nodes): every source
  sends a destination the same size, and the GPUs of a node receive alike (the planner's
  matrices for ``model-a-1024`` at 512 nodes have this form: 565 distinct sizes, 508 distinct
  nodes), here 64 KiB x a lognormal(0, 0.5) per destination node: 16.8M flows of uneven sizes
  in about 262k flow classes (one per pair of nodes), so it is solved over its classes
  (``sim.network.classes``); ``*_classes`` is the classes per solve. Measured by default
  (about 11-12 s CPU and 2.6 GiB on the 2-core machine of session 13, under the ~30 s a default
  run may take per figure).
- ``alltoallv_4096_skewed_wall_s``: the skewed AlltoAllv (sizes as at 128 and 1024 GPUs) on 4096
  GPUs, 16.8M flows of distinct sizes, so solved per flow (by link-disjoint part, the NIC part
  densely: ``sim.network.network``): measured only with ``--large`` (minutes and several GiB),
  else null, with the reason in ``alltoallv_4096_skewed_skipped``. Runs this long print a
  progress line every 30 s with a rough estimate of the time left.
- ``*_peak_rss_gib``: the process's peak resident memory after that run (it only grows).
- ``*_cpu_s``: the same runs' CPU seconds (the wall time they would take on an idle core; the
  shared 2-core machine inflates wall times when busy).
- ``closed_form_max_rel_error``: the largest |simulated / alpha-beta - 1| over contention-free
  collectives on 128 GPUs (uniform AlltoAll direct and hierarchical, ring AllReduce,
  ReduceScatter, AllGather, hierarchical AllReduce, double binary tree).
With ``--quick`` the 1024-GPU figures are skipped (reported as null).

What a ``*_wall_s`` measures: the whole simulated collective (building its flows and routes,
every solve, the engine's events) in a fresh engine and network, after a warm-up
(:func:`warm_up`, ``warmup_s``) that has run every kind of case once, so that no figure
includes numba's compiling or cache loading.
"""

from __future__ import annotations

import gc
import resource
import sys
import time

import numpy as np

from neonic.host.bench import BenchContext
from neonic.sim.engine import Engine
from neonic.sim.network import (
    Network,
    Topology,
    collectives as coll,
    estimate_all_gather_time_s,
    estimate_allreduce_time_s,
    estimate_alltoallv_time_s,
    estimate_reduce_scatter_time_s,
    load_preset,
)
from neonic.sim.network import _kernels as K
from neonic.sim.network.classes import _dense, _unique_counts
from neonic.sim.network.maxmin import HAVE_NUMBA

SUMMARY = "flow-level network: AlltoAllv/AllReduce simulation wall time at 128 and 1024 GPUs, closed-form error"


def zionex_family(nodes: int) -> Topology:
    """The zionex preset at ``nodes`` nodes; beyond 16 nodes a leaf/spine fabric, 16 per leaf."""
    d = load_preset("zionex").to_dict()
    d["cluster"]["nodes"] = nodes
    d["name"] = f"zionex-{nodes}n"
    if nodes > 16:
        d["inter_node"] = {"topology": "leaf_spine", "switch_latency_ns": d["inter_node"]["switch_latency_ns"],
                           "nodes_per_leaf": 16, "oversubscription": 1.0}
    return Topology.from_config(d)


def skewed_sizes(p: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    load = rng.lognormal(0.0, 0.5, (p, 1))
    return (65536 * load * rng.uniform(0.25, 1.75, (p, p))).astype(np.int64)


def per_node_sizes(p: int, gpus_per_node: int, seed: int) -> np.ndarray:
    """AlltoAllv sizes of model-a's input AlltoAllv's form (module doc): ``sizes[i, j]`` is one
    figure per destination node, 64 KiB x lognormal(0, 0.5), whole bytes."""
    rng = np.random.default_rng(seed)
    per_node = np.ceil(65536 * rng.lognormal(0.0, 0.5, p // gpus_per_node)).astype(np.int64)
    return np.tile(np.repeat(per_node, gpus_per_node), (p, 1))


def _peak_rss_gib() -> float:
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return kib / (1 << 30) if sys.platform == "darwin" else kib / (1 << 20)


def _heartbeat(ctx: BenchContext | None, label: str, t0: float, every_s: float = 30.0):
    """An ``on_solve`` hook: every ``every_s`` seconds of wall time a progress line with the
    solves so far, the flows in flight and a time estimate (the wall time so far scaled by the
    ratio of flows in flight to flows finished: a rough guide, as later solves see fewer flows)."""
    last = [time.perf_counter()]

    def on_solve(net: Network) -> None:
        now = time.perf_counter()
        if ctx is None or now - last[0] < every_s:
            return
        last[0] = now
        left = net.active_flows
        done = net.flows_started - left
        spent = now - t0
        guess = f"roughly {spent * left / done:.0f} s left" if done > 0.01 * net.flows_started else "no estimate yet"
        ctx.progress(f"{label}: {net.solves:,} solves, {net.engine.now * 1e-9:.3f} ms simulated, {left:,} of "
                     f"{net.flows_started:,} flows in flight, {spent:.0f} s so far, {guess}")

    return on_solve


def _timed(topo: Topology, start, *, aggregate: bool = True, ctx: BenchContext | None = None,
           label: str = "", heartbeat_s: float = 30.0) -> tuple[float, float, Network]:
    gc.collect()  # earlier runs' flow groups (cycles through their handles) leave before this one starts
    t0 = time.perf_counter()
    c0 = time.process_time()
    eng = Engine()
    net = Network(eng, topo, aggregate=aggregate)
    net.on_solve = _heartbeat(ctx, label, t0, heartbeat_s)
    h = start(net)
    eng.run()
    net.cpu_s = time.process_time() - c0  # CPU seconds: what wall would be on an idle core
    return time.perf_counter() - t0, h.time_s, net


def _throttled_alltoall(net: Network):
    """A uniform AlltoAll (64 KiB per pair) under a synthetic GPU throttle: every GPU's
    collectives at 0.4, 0.55, 0.7 or 0.85 of their link-allowed rate, in turn at each solve,
    with a re-solve requested every 2 us (the scales then change between completions too)."""
    calls = [0]

    def throttle(tx: np.ndarray, rx: np.ndarray) -> np.ndarray:
        calls[0] += 1
        return np.full(tx.size, 0.4 + 0.15 * (calls[0] % 4))

    net.set_throttle(throttle)
    h = coll.alltoall(net, None, 65536)
    for k in range(1, 40):
        net.engine.schedule(k * 2_000_000, net.request_recompute)
    return h


def _beside_throttled(net: Network):
    """The ``alltoallv_1024_beside`` case (module doc): a per-destination AlltoAllv beside an
    intra-node AlltoAll, one node's GPUs capped by the simulated time."""
    p = net.topology.num_gpus
    gpn = net.topology.gpus_per_node
    rng = np.random.default_rng(1)
    node = np.arange(p) // gpn
    per_dst = np.ceil(65536 * rng.lognormal(0.0, 0.5, gpn))[np.arange(p) % gpn]
    capped = node == min(5, node[-1])
    net.set_throttle(lambda tx, rx: np.where(capped, 0.4 + 0.15 * ((net.engine.now // 2_000_000) % 4), 1.0))
    h = coll.alltoallv(net, None, np.tile(per_dst, (p, 1)))
    coll.alltoallv(net, None, np.where(node[:, None] == node[None, :], 1 << 20, 0))
    for k in range(1, 40):
        net.engine.schedule(k * 2_000_000, net.request_recompute)
    return h


#: the warm-up's topology: leaf/spine (as at 1024 and 4096 GPUs), and enough GPUs (32 x 8) that
#: an AlltoAllv's NIC flows (63,488) take the dense paths of the solver
WARMUP_NODES = 32


def warm_up(nodes: int = WARMUP_NODES) -> None:
    """Run every kind of measured case once on a small topology, so that the compiled solver
    (numba: compiled on first use, or loaded from its on-disk cache) is ready before anything
    is timed: a skewed AlltoAllv (per flow, link-disjoint parts, a dense NIC part), a ring
    AllReduce, a uniform AlltoAll by class and per flow, and throttled."""
    topo = zionex_family(nodes)
    sizes = skewed_sizes(topo.num_gpus, 0)
    _timed(topo, lambda net: coll.alltoallv(net, None, sizes))
    per_node = per_node_sizes(topo.num_gpus, topo.gpus_per_node, 0)
    _timed(topo, lambda net: coll.alltoallv(net, None, per_node))
    # the kernels of batches larger than the warm-up's: routing, and ranking many sizes
    n = topo.num_gpus
    topo.route(np.arange(1 << 17) % n, (np.arange(1 << 17) + 1) % n, np.full(1 << 17, 4096))
    _dense(np.repeat(per_node[0].astype(np.float64), (1 << 17) // n + 1))
    _unique_counts(np.arange(1 << 17, dtype=np.int64) % 7)
    # the throttled solve's traffic sums by endpoint sequence (groups of 65,536 flows and more)
    z = np.zeros(2, dtype=np.int64)
    K.sequence_reps(np.arange(2, dtype=np.int64), np.arange(3, dtype=np.int64), z)
    K.traffic_firsts(z[:1], z, z.astype(np.int32), np.ones(2, dtype=bool), np.ones(2), np.zeros(2))
    _timed(topo, lambda net: coll.allreduce(net, None, 1 << 20))
    for aggregate in (False, True):
        _timed(topo, lambda net: coll.alltoall(net, None, 65536), aggregate=aggregate)
    _timed(topo, _throttled_alltoall)
    for aggregate in (False, True):
        _timed(topo, _beside_throttled, aggregate=aggregate)


def run(ctx: BenchContext) -> dict:
    out: dict = {"numba": HAVE_NUMBA}
    t0 = time.perf_counter()
    warm_up()
    out["warmup_s"] = time.perf_counter() - t0
    ctx.progress(f"warm-up (solver load/compile) {out['warmup_s']:.2f} s, numba={HAVE_NUMBA}")

    topo = zionex_family(16)
    sizes = skewed_sizes(topo.num_gpus, ctx.seed)
    wall, sim, net = _timed(topo, lambda net: coll.alltoallv(net, None, sizes))
    out.update(alltoallv_128_wall_s=wall, alltoallv_128_cpu_s=net.cpu_s, alltoallv_128_sim_s=sim,
               alltoallv_128_solves=net.solves)
    ctx.progress(f"alltoallv 128 GPUs: simulated {sim * 1e3:.3f} ms in {wall:.2f} s wall ({net.solves} solves)")

    # contention-free collectives against the closed forms
    p = topo.num_gpus
    cases = {
        "alltoall_direct": (lambda net: coll.alltoall(net, None, 1 << 18),
                            lambda: estimate_alltoallv_time_s(topo, np.full((p, p), 1 << 18))),
        "alltoall_hierarchical": (lambda net: coll.alltoall(net, None, 1 << 18, algorithm="hierarchical"),
                                  lambda: estimate_alltoallv_time_s(topo, np.full((p, p), 1 << 18), algorithm="hierarchical")),
        "allreduce_ring": (lambda net: coll.allreduce(net, None, 1 << 26),
                           lambda: estimate_allreduce_time_s(topo, 1 << 26)),
        "allreduce_hierarchical": (lambda net: coll.allreduce(net, None, 1 << 26, algorithm="hierarchical"),
                                   lambda: estimate_allreduce_time_s(topo, 1 << 26, algorithm="hierarchical")),
        "allreduce_double_binary_tree": (lambda net: coll.allreduce(net, None, 1 << 26, algorithm="double_binary_tree"),
                                         lambda: estimate_allreduce_time_s(topo, 1 << 26, algorithm="double_binary_tree")),
        "reduce_scatter_ring": (lambda net: coll.reduce_scatter(net, None, 1 << 26),
                                lambda: estimate_reduce_scatter_time_s(topo, 1 << 26)),
        "all_gather_ring": (lambda net: coll.all_gather(net, None, 1 << 26),
                            lambda: estimate_all_gather_time_s(topo, 1 << 26)),
    }
    errors = {}
    for name, (start, closed) in cases.items():
        _, sim, _ = _timed(topo, start)
        errors[name] = abs(sim / closed() - 1.0)
        ctx.progress(f"closed form {name}: simulated {sim * 1e3:.4f} ms, rel. error {errors[name]:.2e}")
    out["closed_form_max_rel_error"] = max(errors.values())
    out["closed_form_rel_errors"] = errors

    if ctx.quick:
        out.update(alltoallv_1024_wall_s=None, allreduce_1024_wall_s=None, alltoall_1024_wall_s=None,
                   alltoallv_1024_beside_wall_s=None, alltoall_4096_wall_s=None, alltoallv_4096_wall_s=None,
                   alltoallv_4096_skewed_wall_s=None)
        return out
    big = zionex_family(128)
    sizes = skewed_sizes(big.num_gpus, ctx.seed)
    ctx.progress("alltoallv 1024 GPUs (1,047,552 flows) ...")
    wall, sim, net = _timed(big, lambda net: coll.alltoallv(net, None, sizes), ctx=ctx, label="alltoallv 1024")
    out.update(alltoallv_1024_wall_s=wall, alltoallv_1024_cpu_s=net.cpu_s, alltoallv_1024_sim_s=sim,
               alltoallv_1024_solves=net.solves)
    ctx.progress(f"alltoallv 1024 GPUs: simulated {sim * 1e3:.3f} ms in {wall:.2f} s wall, "
                 f"{net.cpu_s:.2f} s CPU ({net.solves} solves)")
    wall, sim, net = _timed(big, lambda net: coll.allreduce(net, None, 1 << 26))
    out.update(allreduce_1024_wall_s=wall, allreduce_1024_cpu_s=net.cpu_s, allreduce_1024_sim_s=sim)
    ctx.progress(f"allreduce ring 1024 GPUs, 64 MiB: simulated {sim * 1e3:.3f} ms in {wall:.2f} s wall, {net.cpu_s:.2f} s CPU")
    for aggregate, key in ((False, "alltoall_1024_per_flow"), (True, "alltoall_1024")):
        wall, sim, net = _timed(big, lambda net: coll.alltoall(net, None, 65536), aggregate=aggregate)
        out.update({f"{key}_wall_s": wall, f"{key}_cpu_s": net.cpu_s, f"{key}_sim_s": sim,
                    f"{key}_classes": net.solved_classes / max(net.solves, 1)})
        ctx.progress(f"uniform alltoall 1024 GPUs ({'by class' if aggregate else 'per flow'}): simulated {sim * 1e3:.3f} ms "
                     f"in {wall:.2f} s wall, {net.cpu_s:.2f} s CPU, {net.solved_classes / max(net.solves, 1):,.0f} "
                     f"variables per solve")
    wall, sim, net = _timed(big, _throttled_alltoall)
    out.update(alltoall_1024_throttled_wall_s=wall, alltoall_1024_throttled_cpu_s=net.cpu_s,
               alltoall_1024_throttled_sim_s=sim, alltoall_1024_throttled_by_class=net.throttled_by_class,
               alltoall_1024_throttled_solves=net.solves)
    ctx.progress(f"uniform alltoall 1024 GPUs, throttled: simulated {sim * 1e3:.3f} ms in {wall:.2f} s wall, "
                 f"{net.cpu_s:.2f} s CPU ({net.throttled_by_class} of {net.solves} throttled solves by class)")
    wall, sim, net = _timed(big, _beside_throttled)
    _, sim_f, per_flow = _timed(big, _beside_throttled, aggregate=False)
    out.update(alltoallv_1024_beside_wall_s=wall, alltoallv_1024_beside_cpu_s=net.cpu_s,
               alltoallv_1024_beside_sim_s=sim, alltoallv_1024_beside_joint_solves=net.joint_solves,
               alltoallv_1024_beside_solves=net.solves, alltoallv_1024_beside_per_flow_cpu_s=per_flow.cpu_s)
    ctx.progress(f"alltoallv 1024 GPUs beside an intra-node group, one node throttled: simulated {sim * 1e3:.3f} ms "
                 f"in {wall:.2f} s wall, {net.cpu_s:.2f} s CPU ({net.joint_solves} of {net.solves} solves over joint "
                 f"classes; per flow {per_flow.cpu_s:.2f} s CPU, simulated {sim_f * 1e3:.3f} ms)")
    out["alltoall_1024_peak_rss_gib"] = _peak_rss_gib()
    huge = zionex_family(512)
    net = per_flow = None  # (the 1024-GPU runs' networks leave before the 4096-GPU runs)
    ctx.progress("uniform alltoall 4096 GPUs (16,773,120 flows) ...")
    wall, sim, net = _timed(huge, lambda net: coll.alltoall(net, None, 65536), ctx=ctx, label="alltoall 4096")
    out.update(alltoall_4096_wall_s=wall, alltoall_4096_cpu_s=net.cpu_s, alltoall_4096_sim_s=sim,
               alltoall_4096_classes=net.solved_classes / max(net.solves, 1), alltoall_4096_peak_rss_gib=_peak_rss_gib())
    ctx.progress(f"uniform alltoall 4096 GPUs: simulated {sim * 1e3:.3f} ms in {wall:.2f} s wall, {net.cpu_s:.2f} s CPU, "
                 f"peak RSS {out['alltoall_4096_peak_rss_gib']:.2f} GiB")
    net = None
    sizes = per_node_sizes(huge.num_gpus, huge.gpus_per_node, ctx.seed)
    ctx.progress("alltoallv 4096 GPUs, sizes per destination node (16,773,120 flows) ...")
    wall, sim, net = _timed(huge, lambda net: coll.alltoallv(net, None, sizes), ctx=ctx, label="alltoallv 4096")
    del sizes
    out.update(alltoallv_4096_wall_s=wall, alltoallv_4096_cpu_s=net.cpu_s, alltoallv_4096_sim_s=sim,
               alltoallv_4096_solves=net.solves, alltoallv_4096_classes=net.solved_classes / max(net.solves, 1),
               alltoallv_4096_peak_rss_gib=_peak_rss_gib())
    ctx.progress(f"alltoallv 4096 GPUs by node: simulated {sim * 1e3:.3f} ms in {wall:.2f} s wall, {net.cpu_s:.2f} s CPU "
                 f"({net.solves} solves, {out['alltoallv_4096_classes']:,.0f} classes per solve), peak RSS "
                 f"{out['alltoallv_4096_peak_rss_gib']:.2f} GiB")
    del net
    if not ctx.large:
        out["alltoallv_4096_skewed_wall_s"] = None
        out["alltoallv_4096_skewed_skipped"] = ("skewed sizes are all distinct, so the solve is per flow (16.8M flows, "
                                                "hundreds of solves, several GiB): run with --large")
        return out
    net = None
    sizes = skewed_sizes(huge.num_gpus, ctx.seed)
    ctx.progress("skewed alltoallv 4096 GPUs (16,773,120 flows, per flow) ...")
    wall, sim, net = _timed(huge, lambda net: coll.alltoallv(net, None, sizes), ctx=ctx, label="alltoallv 4096 skewed")
    out.update(alltoallv_4096_skewed_wall_s=wall, alltoallv_4096_skewed_cpu_s=net.cpu_s,
               alltoallv_4096_skewed_sim_s=sim, alltoallv_4096_skewed_solves=net.solves,
               alltoallv_4096_skewed_peak_rss_gib=_peak_rss_gib())
    ctx.progress(f"skewed alltoallv 4096 GPUs: simulated {sim * 1e3:.3f} ms in {wall:.2f} s wall, {net.cpu_s:.2f} s CPU "
                 f"({net.solves} solves), peak RSS {out['alltoallv_4096_skewed_peak_rss_gib']:.2f} GiB")
    return out
