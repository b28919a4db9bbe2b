"""The SmartNIC system's effects on one iteration (``embeddings = "nic"``).

The regime the SmartNIC system (Guo et al., ICS 2023) was built for: embedding tables beyond
the cluster's HBM, held in host DRAM behind an HBM software cache (``sim.memory_tiers``), so
that the lookups of rows the HBM cache misses cross PCIe (the topology's GPU-host links) and
lookups of rows owned by other nodes cross the network. The SmartNIC sits on both paths:

* **local cache** (``local_cache_mib``): the owner's NIC holds hot rows of its GPU's shards and
  serves the lookups whose indices pass it (those of requesters on other nodes). Of a host-tier
  shard it holds the rows ranked after the HBM cache's (a second level: a hit is a row that
  would otherwise have crossed PCIe); of an HBM-resident shard, its hottest rows (a hit only
  saves an HBM read). The cache is a profiled static hot-row set (no fills: LFU's limit) and
  its hit rate comes from ``sim.memory_tiers.cache_hit_rate`` (the HBM cache's own model: Zipf or
  empirical popularities) at the load factor the NIC's capacity gives (its bytes over the bytes
  of the shards it may hold, like FBGEMM's cache): ``H(lf_hbm + lf_nic) - H(lf_hbm)`` behind the
  HBM cache. In training the NIC owns the rows it holds: the GPU sends their gradients over
  PCIe instead of writing the rows back, and the NIC applies the update
  (``sim.nic.update_time_s``); rows it caches of HBM-resident shards are written through.
* **remote cache** (``remote_cache_mib``): the requester's NIC holds hot rows of tables owned on
  other nodes. Inference: warm (profiled hot rows of read-only tables); its hits never reach the
  owner (their indices are not sent, the owner does not gather them) and a bag all of whose rows
  hit needs no pooled vector from the owner. Training: rows change every step, so the cache is
  invalidated every batch (reuse within the batch only, measured on the run's traces with
  ``sim.nic.trace_stats``, where batch reordering counts) and owners send the missed rows
  themselves instead of pooled vectors.
* **pool_on_nic**: the rows a NIC serves are gathered and pooled on it (``sim.nic.gather_time_s``:
  the RTL unit's timing model, or an SoC's cores), so pooled vectors, not rows, cross PCIe and
  the network: the owner's partial pools merge with its GPU's on their way out; the requester's
  merge with the pooled vectors arriving from the owners. Without it the served rows themselves
  go to the GPU that pools them (over the network to remote requesters, over PCIe to the
  requester's own GPU). Alone it has nothing to pool.
* **reorder**: each batch's bags are grouped by their hottest row (``sim.nic.reorder_bags``)
  before an order-dependent cache (the training remote cache) sees them.

**Split by cost, not all to the NIC.** Every mechanism offers moves (one shard to the local
cache, one table to the remote caches); each move changes per-rank resource times priced by the
simulator's own cost functions: the GPU's fused embedding kernels (``host.iteration
.shard_kernel_s``), bytes over the GPU-host link at its bandwidth, the NIC units
(``sim.nic``), and inter-node bytes at the network's per-GPU bandwidth. A rank's embedding time
is ``max(GPU, PCIe, NIC)`` per direction (they run side by side in one op) plus its inter-node
AlltoAll bytes; a move is kept when it lowers the slowest rank's time, or leaves it and lowers
the ranks' sum (moves tried in order of their own gain). A SmartNIC slower than the memory it
would replace is therefore left out of the path, and ``smartnic:none`` is the plain NIC.

ASSUMPTIONS (visible in ``figures``): lookups of a shard come uniformly from all ranks; the
lookups of a bag are independent for the bag-level figures (a bag of ``P`` rows has a hit with
probability ``1 - exp(-P h)`` and is all hit with ``exp(-P (1 - h))``); hot sets are nested
(the NIC and HBM caches rank rows by the same popularity).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from neonic.sim.lookups import ZIPF_ALPHA

__all__ = ["ZIPF_ALPHA", "nic_config", "NICEffects", "nic_effects"]

#: ZIPF_ALPHA: Zipf exponents of the default lookups (``sim.lookups``; a scenario's
#: ``[lookups]`` section or a table's trace / locality statistics replace them: ``host.lookups``).


def nic_config(spec) -> "NICConfig":
    """``sim.nic.NICConfig`` from a system's ``[nic]`` table."""
    from neonic.sim.nic import NICConfig

    return NICConfig(clock_hz=spec.clock_mhz * 1e6, datapath_bytes=spec.datapath_bytes, packetizers=spec.packetizers,
                     local_cache_bytes=spec.local_cache_mib * 2**20, remote_cache_bytes=spec.remote_cache_mib * 2**20,
                     cache_ways=spec.cache_ways, memory_bytes_per_s=spec.memory_gbytes_per_s * 1e9,
                     pool_on_nic=spec.pool_on_nic, reorder=spec.reorder, kernels=spec.kernels, cores=spec.cores,
                     core_rows_per_s=spec.core_rows_per_s)


@dataclass
class NICEffects:
    """What the SmartNICs change in one iteration (per rank unless said otherwise).

    ``matrices``: the AlltoAllv matrices after the NICs (same keys as the plan's; those the
    NICs leave unchanged are the plan's arrays themselves: read only);
    ``gpu_lookups[r][i]``: forward lookups left to the GPU for rank r's i-th shard kernel;
    ``fwd_units[r]`` / ``bwd_units[r]``: NIC unit durations (ps) in the embedding forward /
    backward; ``fwd_pcie_bytes`` / ``bwd_pcie_bytes``: PCIe bytes between a GPU and its NIC
    (rows or partial pools to the GPU; gradients and write-through to the NIC);
    ``tier_fwd_bytes`` / ``tier_bwd_bytes``: the host-tier miss bytes left (fetches into the
    HBM cache, write-backs; None: the plan's, unchanged); ``gpu_pool_bytes``: unpooled row
    bytes a GPU pools before the interaction; ``hit_rates`` and ``figures`` for the metrics.
    """

    cfg: Any
    matrices: dict[str, np.ndarray]
    gpu_lookups: list[list[float]]
    fwd_units: list[tuple[tuple[str, int], ...]]
    fwd_pcie_bytes: np.ndarray
    bwd_pcie_bytes: np.ndarray
    gpu_pool_bytes: np.ndarray
    hit_rates: dict[str, float]
    figures: dict[str, Any]
    lookups: Any = None  # the sim.lookups.LookupBatch the caches were measured on (the RTL backend's too)
    bwd_units: list[tuple[tuple[str, int], ...]] | None = None
    tier_fwd_bytes: np.ndarray | None = None
    tier_bwd_bytes: np.ndarray | None = None

    def packetizer_ps(self, matrix: np.ndarray, gpus_per_node: int) -> tuple[int, ...]:
        """Each rank's packetizer time for its inter-node messages of ``matrix`` (one RDMA
        WRITE per destination; intra-node bytes go over NVLink, not the NIC)."""
        from neonic.sim.engine import ps_from_s
        from neonic.sim.nic import packetizer_time_s

        world = matrix.shape[0]
        node = np.arange(world) // gpus_per_node
        memo: dict = {}    # the timing model's cycles per message size, shared by the ranks
        out = []
        for r in range(world):
            msgs = matrix[r][node != node[r]]
            out.append(ps_from_s(packetizer_time_s(self.cfg, msgs[msgs > 0], memo=memo)))
        return tuple(out)


_RES = ("gf", "pf", "nf", "gb", "pb", "nb", "sent", "recv")


@dataclass
class _State:
    """Per-rank resource times (s) and inter-node forward bytes, and the objective."""

    v: dict[str, np.ndarray]
    net_bw: float

    def rank_times(self, v: dict[str, np.ndarray] | None = None) -> np.ndarray:
        v = self.v if v is None else v
        fwd = np.maximum(np.maximum(v["gf"], v["pf"]), v["nf"])
        bwd = np.maximum(np.maximum(v["gb"], v["pb"]), v["nb"])
        return fwd + bwd + np.maximum(v["sent"], v["recv"]) / self.net_bw

    def objective(self, v: dict[str, np.ndarray] | None = None) -> tuple[float, float]:
        t = self.rank_times(v)
        return float(t.max(initial=0.0)), float(t.sum())

    def bottleneck(self, nic_limit: str = "NIC") -> str:
        """The resource that bounds the slowest rank: the largest of its terms (GPU HBM, PCIe,
        the NIC's limit, the network)."""
        v = self.v
        r = int(np.argmax(self.rank_times()))
        terms = {"GPU": v["gf"][r] + v["gb"][r], "PCIe": v["pf"][r] + v["pb"][r], nic_limit: v["nf"][r] + v["nb"][r],
                 "network": max(v["sent"][r], v["recv"][r]) / self.net_bw}
        return max(terms, key=terms.get)

    def try_move(self, delta: dict[str, np.ndarray]) -> bool:
        """Apply ``delta`` if it lowers the objective (see the module doc); True if kept."""
        new = {k: self.v[k] + delta[k] if k in delta else self.v[k] for k in _RES}
        old_max, old_sum = self.objective()
        new_max, new_sum = self.objective(new)
        tol = 1e-12 * max(old_max, 1e-30)
        if new_max < old_max - tol or (new_max <= old_max + tol and new_sum < old_sum - 1e-12 * max(old_sum, 1e-30)):
            self.v = new
            return True
        return False


@dataclass
class _Move:
    """One candidate offload: per-rank resource deltas plus what to apply if it is kept.

    ``delta``: the deltas, or a function that builds them when asked (a move that touches one
    rank keeps a few scalars instead of eight per-rank arrays: thousands of shards on
    thousands of ranks would otherwise hold gigabytes)."""

    label: str
    delta: dict[str, np.ndarray] | Callable[[], dict[str, np.ndarray]]
    apply: Any
    gain: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    def deltas(self) -> dict[str, np.ndarray]:
        return self.delta() if callable(self.delta) else self.delta


def nic_limit(cfg: Any, shapes: list[tuple[int, int, float, float]]) -> str:
    """What bounds a NIC's gather of ``shapes``: its memory's bandwidth, or its datapath (an
    FPGA NIC's RTL units) / cores (an SoC's); the name the win/lose map reports."""
    from neonic.sim.nic import gather_time_s

    shapes = [s for s in shapes if s[2] > 0]
    logic = "NIC cores" if cfg.kernels == "cores" else "NIC datapath"
    if not shapes:
        return logic
    nbytes = sum(bags * per_bag * dim * eb for dim, eb, bags, per_bag in shapes)
    t = gather_time_s(cfg, shapes)
    return "NIC memory" if t > 0 and nbytes / cfg.memory_bytes_per_s >= 0.999 * t else logic


def _bag_any(p: float, h: float) -> float:
    return 1.0 - math.exp(-p * h)


def _bag_all(p: float, h: float) -> float:
    return math.exp(-p * (1.0 - h))


def nic_effects(sc, plan, work, psys) -> NICEffects:
    """The SmartNIC mechanisms applied to one iteration's work, split between NIC and GPU by
    cost (see the module doc)."""
    from neonic.host.iteration import rank_sort_cost, shard_kernel_s
    from neonic.host.planner.plan import ShardingType
    from neonic.sim.engine import ps_from_s
    from neonic.sim.memory_tiers import cache_hit_rate
    from neonic.sim.nic import (Segment, adjacent_reuse, cache_lookup_time_s, gather_time_s, trace_stats,
                                update_time_s)

    cfg = nic_config(sc.system.nic)
    wl = sc.workload
    gpu = sc.system.gpu_spec
    world, gpn = work.world_size, work.gpus_per_node
    inference = sc.mode == "inference"
    alpha = (sc.lookups.alpha if sc.lookups is not None and sc.lookups.alpha is not None
             else ZIPF_ALPHA[sc.mode])
    tables = {t.name: t for t in wl.tables}
    comm_b = psys.comm_bytes
    link = psys.host_link_bytes_per_s
    ssd = psys.memory.ssd_gbytes_per_s * 1e9
    net_bw = psys.comm.bw_inter_bytes_per_s
    mem = psys.memory
    node = np.arange(world) // gpn
    inter = node[:, None] != node[None, :]
    off_frac = (world - gpn) / world       # share of a shard's requesters on other nodes
    # the NICs change the pooled and index AlltoAllvs (copied when they do); the other matrices
    # are the plan's own arrays (read only: five world x world copies are 670 MB at 4096 GPUs)
    m = dict(work.matrices)
    owned: list[list[tuple[str, Any, Any]]] = [[] for _ in range(world)]
    for t in wl.tables:
        for shard, k in zip(plan.tables[t.name].shards, work.tables[t.name].kernels):
            owned[k.rank].append((t.name, shard, k))
    dp_table = {t.name: plan.tables[t.name].sharding == ShardingType.DATA_PARALLEL for t in wl.tables}
    batch = getattr(psys, "lookups", None)
    if batch is None:
        from neonic.host.lookups import LookupsSpec, build_lookups

        batch = build_lookups(wl, sc.lookups or LookupsSpec(), world=world, mode=sc.mode, seed=sc.seed,
                              min_bags=sc.system.nic.trace_samples)
    memo: dict = {}
    hmemo: dict = {}

    def hit(name: str, lf: float, policy: str) -> float:
        """A cache of ``lf`` lines per row of table ``name`` (``sim.memory_tiers``); ``lf`` is
        rounded down to a grid of 2^(1/8) steps (a cache at most 9% smaller: the steady-state
        solve is the cost, and ranks' NIC caches differ by less than that)."""
        if lf <= 0:
            return 0.0
        lf = min(1.0, 2.0 ** (math.floor(8 * math.log2(lf)) / 8))
        key = (name, lf, policy)
        if key not in hmemo:
            hmemo[key] = cache_hit_rate(batch[name], tables[name].rows, min(1.0, lf), policy)
        return hmemo[key]

    def host_cached(k) -> bool:
        return k.tier != "hbm" and mem.cached

    # ---- the baseline: per-rank resource times of the plan without offload
    gl = [[float(k.lookups) for _, _, k in ks] for ks in owned]
    reach_off = [[0.0 if dp_table[n] else k.lookups * off_frac for n, _, k in ks] for ks in owned]
    v = {k: np.zeros(world) for k in _RES}
    for r in range(world):
        for name, shard, k in owned[r]:
            f_s, b_s, _ = shard_kernel_s(gpu, k, link, ssd)
            v["gf"][r] += f_s
            v["gb"][r] += b_s
            v["pf"][r] += k.miss_bytes / 2 / link
            if not inference:
                v["pb"][r] += k.miss_bytes / 2 / link
        if not inference and owned[r]:
            # the rank's one sort before its fused update (over all its shards)
            v["gb"][r] += rank_sort_cost(gpu, [k for _, _, k in owned[r]]).time_s
    v["sent"] = (m["pooled"] * inter).sum(axis=1) + (m["input"] * inter).sum(axis=1)
    v["recv"] = (m["pooled"] * inter).sum(axis=0) + (m["input"] * inter).sum(axis=0)
    if inference:
        for key in ("gb", "pb", "nb"):
            v[key][:] = 0.0
    state = _State(v, net_bw)
    base_obj = state.objective()
    figures_bottleneck_before = state.bottleneck()

    def gpu_delta(r: int, i: int, fewer: float) -> float:
        """Forward kernel seconds saved on rank r's shard i when ``fewer`` lookups leave it."""
        k = owned[r][i][2]
        now = int(round(gl[r][i]))
        after = max(0, int(round(gl[r][i] - fewer)))
        return shard_kernel_s(gpu, k, link, ssd, after)[0] - shard_kernel_s(gpu, k, link, ssd, now)[0]

    def spread(owner: int, nbytes: float) -> np.ndarray:
        """``nbytes`` an owner sends to (or receives from) the ranks on other nodes, spread evenly."""
        out = np.zeros(world)
        others = node != node[owner]
        if others.any():
            out[others] = nbytes / others.sum()
        return out

    def nic_s(shapes: list[tuple[int, int, float, float]]) -> float:
        return gather_time_s(cfg, shapes, seed=sc.seed, memo=memo)

    # what the kept moves add up to
    pooled_delta = np.zeros(world)             # inter-node pooled bytes each owner sends more (+) or less (-)
    input_saved = np.zeros(world)              # inter-node index bytes each owner no longer receives
    tier_fwd = np.array([sum(k.miss_bytes / 2 for _, _, k in ks) for ks in owned])
    tier_bwd = tier_fwd.copy() if not inference else np.zeros(world)
    fwd_pcie = np.zeros(world)
    bwd_pcie = np.zeros(world)
    gpu_pool = np.zeros(world)
    # the shapes each NIC gathers: its node's remote-cache hits (the same for every rank of a
    # node), then its own local-cache hits (rank_rows joins them)
    nodes = int(node[-1]) + 1
    remote_rows: list[list[tuple[int, int, float, float]]] = [[] for _ in range(nodes)]
    nic_rows: list[list[tuple[int, int, float, float]]] = [[] for _ in range(world)]

    def rank_rows(r: int) -> list[tuple[int, int, float, float]]:
        return remote_rows[node[r]] + nic_rows[r]

    others: dict[int, np.ndarray] = {}

    def others_of(r: int) -> np.ndarray:
        """The ranks on other nodes than rank r's."""
        n = int(node[r])
        if n not in others:
            others[n] = np.flatnonzero(node != n)
        return others[n]

    probes = np.zeros(world)                   # cache lookups (tag probes) per rank's NIC
    probe_hits = np.zeros(world)
    probe_bytes = np.zeros(world)
    update_s = np.zeros(world)
    hit_rates: dict[str, float] = {}
    figures: dict[str, Any] = {"pool_on_nic": cfg.pool_on_nic, "reorder": cfg.reorder, "kernels": cfg.kernels,
                               "local_cache_mib": sc.system.nic.local_cache_mib,
                               "remote_cache_mib": sc.system.nic.remote_cache_mib, "zipf_alpha": alpha,
                               "lookups_traced": int(batch.lookups)}
    index_b = psys.index_bytes

    # ---- remote caches (requesters): one move per table
    if cfg.remote_cache and world > gpn:
        remote = [t for t in wl.tables if not dp_table[t.name]]
        h_of: dict[str, float] = {}
        if inference:
            # warm, profiled hot rows; the capacity spread over the tables by their bytes (one load factor)
            total = sum(t.rows * t.row_bytes for t in remote)
            lf = cfg.remote_cache_bytes / total if total else 0.0
            h_of = {t.name: hit(t.name, lf, "lfu") for t in remote}
        elif remote:
            # invalidated every batch: reuse within the batch, on the traces of one node's requesters
            segs = []
            for t in remote:
                mask = node[batch[t.name].requester] == node[0]
                if np.count_nonzero(mask) < 4:
                    mask = np.ones_like(mask)
                lengths, rows = batch[t.name].select(mask, 0, t.rows)
                segs.append(Segment(t.name, lengths, rows, t.rows, t.row_bytes))
            st = trace_stats(segs, cfg.remote_cache_bytes, cfg.cache_ways, warm=False, reorder=cfg.reorder)
            h_of = {n: s.hit_rate for n, s in st.segments.items()}
        # each table's shards (rank, index in its list), in rank order
        by_table: dict[str, list[tuple[int, int]]] = {}
        for r in range(world):
            for i, (name, _, _) in enumerate(owned[r]):
                by_table.setdefault(name, []).append((r, i))
        moves: list[_Move] = []
        for t in remote:
            h = h_of.get(t.name, 0.0)
            if h <= 0:
                continue
            d = {key: np.zeros(world) for key in _RES}
            plan_: list[tuple] = []
            for r, i in by_table.get(t.name, ()):
                if reach_off[r][i] <= 0:
                    continue
                name, shard, k = owned[r][i]
                oth = others_of(r)                      # the requesters on other nodes
                l_off = reach_off[r][i]
                per_bag = k.lookups / max(1, k.pooled_rows)
                pooled_off = k.pooled_rows * off_frac * shard.cols * comm_b
                saved = l_off * h                       # lookups that never reach the owner
                d["gf"][r] += gpu_delta(r, i, saved)
                miss_saved = 0.0
                if inference and host_cached(k):
                    miss_saved = l_off * max(0.0, h - psys.tier_hit_rate(tables[name])) * k.row_bytes
                    d["pf"][r] -= miss_saved / link
                if inference:
                    net = -pooled_off * _bag_all(per_bag, h)
                    idx = saved * index_b
                    d["recv"][r] -= idx
                    d["sent"][oth] -= idx / oth.size   # spread evenly over them
                else:
                    net = l_off * (1 - h) * k.row_bytes - pooled_off
                d["sent"][r] += net
                d["recv"][oth] += net / oth.size
                # each requester on another node: its share of the shard's lookups (the same
                # figures for all of them)
                per_req = k.lookups / world
                rows_nic = per_req * (h if inference else 1.0)
                bags_req = k.pooled_rows / world
                if cfg.pool_on_nic:
                    shape = (shard.cols, k.row_bytes // max(1, shard.cols), bags_req * (_bag_any(per_bag, h) if inference else 1.0),
                             rows_nic / max(1e-12, bags_req * (_bag_any(per_bag, h) if inference else 1.0)))
                    d["nf"][oth] += nic_s([shape]) + cache_lookup_time_s(cfg, per_req, hit_rate=h, row_bytes=k.row_bytes,
                                                                         misses_elsewhere=True)
                else:
                    shape = None
                    d["pf"][oth] += rows_nic * k.row_bytes / link
                    d["nf"][oth] += cache_lookup_time_s(cfg, per_req, hit_rate=h, row_bytes=k.row_bytes,
                                                        misses_elsewhere=True)
                plan_.append((r, i, saved, miss_saved, net, idx if inference else 0.0,
                              (oth, shape, per_req, h, k.row_bytes, rows_nic)))

            def apply(plan_=plan_):
                for r, i, saved, miss_saved, net, idx, (oth, shape, per_req, h, rb, rows_nic) in plan_:
                    gl[r][i] -= saved
                    reach_off[r][i] -= saved
                    tier_fwd[r] -= miss_saved
                    pooled_delta[r] += net
                    input_saved[r] += idx
                    probes[oth] += per_req
                    probe_hits[oth] += per_req * h
                    probe_bytes[oth] += per_req * rb
                    if shape is not None:
                        for n in range(nodes):
                            if n != node[r]:
                                remote_rows[n].append(shape)
                    else:
                        fwd_pcie[oth] += rows_nic * rb
                        gpu_pool[oth] += rows_nic * rb

            # the shapes its requesters' NICs gather, one per requester (what bounds them)
            shapes = [s for p_ in plan_ if p_[6][1] is not None for s in [p_[6][1]] * p_[6][0].size]
            moves.append(_Move(t.name, d, apply, details={"hit_rate": h, "nic_limit": nic_limit(cfg, shapes)}))
        kept, refused = _keep(state, moves)
        figures["remote_cache_refused_by"] = refused
        hit_rates["nic_remote"] = (float(np.average([mv.details["hit_rate"] for mv in moves])) if moves else 0.0)
        figures["remote_cache_tables"] = len(remote)
        figures["remote_cache_tables_on_nic"] = len(kept)

    # ---- local caches (owners): one move per shard
    if cfg.local_cache:
        policy = "lfu"   # a profiled static hot-row set, owned by the NIC (no fills)
        moves = []
        considered = 0
        for r in range(world):
            # a host-tier shard's lookups all pass the NIC's level (behind the HBM cache, on the
            # PCIe path); an HBM-resident shard's only those from other nodes (on the network path)
            cand = [i for i, (_, _, k) in enumerate(owned[r]) if reach_off[r][i] > 0 or (host_cached(k) and gl[r][i] > 0)]
            host = [i for i in cand if host_cached(owned[r][i][2])]
            pool = host or cand     # the NIC holds rows that would cross PCIe where there are any
            held = sum(owned[r][i][1].rows * owned[r][i][2].row_bytes for i in pool)
            lf2 = cfg.local_cache_bytes / held if held else 0.0
            for i in pool:
                name, shard, k = owned[r][i]
                considered += 1
                if host_cached(k):
                    # behind the HBM cache: the hot rows it misses (nested hot sets, see the module doc)
                    h = max(0.0, hit(name, mem.cache_load_factor + lf2, policy) - psys.tier_hit_rate(tables[name]))
                else:
                    h = hit(name, lf2, policy)
                if h <= 0:
                    continue
                per_bag = k.lookups / max(1, k.pooled_rows)
                if host_cached(k):
                    # on the PCIe path, behind the HBM cache: the GPU's misses of every requester's
                    # lookups reach the NIC; the NIC returns partial pools (one vector per bag
                    # with a hit) or, without pooling on the NIC, the rows, to the GPU over PCIe
                    looked = gl[r][i] * (1.0 - psys.tier_hit_rate(tables[name]))
                    n = gl[r][i] * h
                    bags = k.pooled_rows * gl[r][i] / k.lookups if k.lookups else 0.0
                    n_off = 0.0
                    miss = n * k.row_bytes                  # fetches over PCIe the NIC saves
                    to_gpu = bags * _bag_any(per_bag, h) * shard.cols * 4 if cfg.pool_on_nic else miss
                else:
                    # on the network path: the lookups of requesters on other nodes; partial pools
                    # merge on the NIC with the GPU's on their way out
                    looked = reach_off[r][i]
                    n = n_off = looked * h
                    bags = k.pooled_rows * looked / k.lookups if k.lookups else 0.0
                    miss = to_gpu = 0.0
                bags_hit = bags * _bag_any(per_bag, h)
                gf = gpu_delta(r, i, n)
                probe = cache_lookup_time_s(cfg, looked, hit_rate=min(1.0, n / looked) if looked else 0.0,
                                            row_bytes=k.row_bytes, misses_elsewhere=True)
                shape = (shard.cols, k.row_bytes // max(1, shard.cols), bags_hit, n / bags_hit if bags_hit else 0.0)
                nf = probe + nic_s([shape])
                pf = (to_gpu - miss) / link
                limit = nic_limit(cfg, [shape])
                upd = grads = pb = 0.0
                if not inference:
                    if host_cached(k):
                        # the NIC owns these rows: their gradients cross PCIe instead of the
                        # write-backs of the rows, and the NIC applies the update
                        grads = n * shard.cols * 4
                        upd = update_time_s(cfg, n, k.row_bytes, k.state_bytes_per_row)
                        pb = (grads - miss) / link
                    else:
                        grads = n * k.row_bytes   # write-through of the GPU's updated rows
                        pb = grads / link
                raw = 0.0
                if not cfg.pool_on_nic:
                    raw = n_off * k.row_bytes   # the hit rows themselves go to the remote requesters

                def delta(r=r, gf=gf, nf=nf, pf=pf, pb=pb, upd=upd, raw=raw) -> dict[str, np.ndarray]:
                    """The move's deltas: rank r's, and the requesters' receipt of raw rows."""
                    d = {key: np.zeros(world) for key in _RES}
                    d["gf"][r] += gf
                    d["nf"][r] += nf
                    d["pf"][r] += pf
                    if not inference:
                        d["pb"][r] += pb
                        d["nb"][r] += upd
                    if not cfg.pool_on_nic:
                        d["sent"][r] += raw
                        d["recv"] += spread(r, raw)
                    return d

                def apply(r=r, i=i, n=n, looked=looked, rb=k.row_bytes, shape=shape, miss=miss, grads=grads,
                          upd=upd, raw=raw, to_gpu=to_gpu, rows_to_gpu=0.0 if cfg.pool_on_nic else miss):
                    gl[r][i] -= n
                    probes[r] += looked
                    probe_hits[r] += n
                    probe_bytes[r] += looked * rb
                    fwd_pcie[r] += to_gpu
                    gpu_pool[r] += rows_to_gpu
                    nic_rows[r].append(shape)
                    tier_fwd[r] -= miss
                    if not inference:
                        tier_bwd[r] -= miss
                        bwd_pcie[r] += grads
                    update_s[r] += upd
                    if raw:
                        pooled_delta[r] += raw
                        gpu_pool[:] += spread(r, raw)

                moves.append(_Move(f"r{r}:{name}#{i}", delta, apply, details={"hit_rate": n / looked if looked else 0.0, "lookups": looked,
                                                                "nic_limit": limit}))
        kept, refused = _keep(state, moves)
        figures["local_cache_refused_by"] = refused
        looked = sum(mv.details["lookups"] for mv in moves)
        hit_rates["nic_local"] = (float(sum(mv.details["hit_rate"] * mv.details["lookups"] for mv in moves) / looked)
                                  if looked else 0.0)
        figures["local_cache_shards"] = considered
        figures["local_cache_shards_on_nic"] = len(kept)
    # ---- the kept moves applied to the iteration
    if pooled_delta.any():
        m["pooled"] = m["pooled"].copy()
        row = (work.matrices["pooled"] * inter)
        for r in np.nonzero(pooled_delta)[0]:
            tot = row[r].sum()
            if tot > 0:
                m["pooled"][r] = np.maximum(0.0, m["pooled"][r] + row[r] / tot * pooled_delta[r])
    if input_saved.any():
        m["input"] = m["input"].copy()
        col = (work.matrices["input"] * inter)
        for r in np.nonzero(input_saved)[0]:
            tot = col[:, r].sum()
            if tot > 0:
                m["input"][:, r] = np.where(inter[:, r], m["input"][:, r] * max(0.0, 1 - input_saved[r] / tot),
                                            m["input"][:, r])
    units: list[tuple[tuple[str, int], ...]] = []
    bwd_units: list[tuple[tuple[str, int], ...]] = []
    node_g: dict[int, float] = {}      # a node's ranks without local-cache hits gather the same rows
    for r in range(world):
        if nic_rows[r]:
            g = nic_s(rank_rows(r))
        else:
            n_ = int(node[r])
            if n_ not in node_g:
                node_g[n_] = nic_s(remote_rows[n_]) if remote_rows[n_] else 0.0
            g = node_g[n_]
        n = probes[r]
        c = (cache_lookup_time_s(cfg, n, hit_rate=min(1.0, probe_hits[r] / n), row_bytes=probe_bytes[r] / n,
                                 misses_elsewhere=True) if n > 0 else 0.0)
        units.append(tuple((u, ps_from_s(t)) for u, t in (("cache", c), ("gather", g)) if t > 0))
        bwd_units.append(((("gather", ps_from_s(update_s[r])),) if update_s[r] > 0 else ()))
    # reorder: the reuse it exposes on the largest sharded table's traced bags
    big = max((t for t in wl.tables if not dp_table[t.name]), key=lambda t: batch[t.name].indices.size, default=None)
    if big is not None and (cfg.local_cache or cfg.remote_cache):
        tl = batch[big.name]
        figures["reuse_window"] = cfg.reuse_window
        figures["adjacent_reuse"] = adjacent_reuse(tl.lengths, tl.indices, cfg.reuse_window)
        figures["adjacent_reuse_reordered"] = adjacent_reuse(tl.lengths, tl.indices, cfg.reuse_window, reorder=True)
    figures["split_objective_ms"] = {"before": base_obj[0] * 1e3, "after": state.objective()[0] * 1e3}
    figures["bottleneck_before"] = figures_bottleneck_before
    figures["bottleneck_after"] = state.bottleneck(nic_limit(cfg, [s for r in range(world) for s in rank_rows(r)]))
    figures["host_tier_shards"] = int(sum(1 for ks in owned for _, _, k in ks if k.tier != "hbm"))
    figures["pcie_fwd_bytes_per_rank"] = float(fwd_pcie.mean())
    figures["pcie_bwd_bytes_per_rank"] = float(bwd_pcie.mean())
    figures["tier_miss_bytes_per_rank"] = float((tier_fwd + tier_bwd).mean())
    figures["gpu_forward_lookups_per_rank"] = float(np.mean([sum(x) for x in gl]))
    figures["pooled_a2a_bytes"] = float(m["pooled"].sum())
    return NICEffects(cfg, m, gl, units, fwd_pcie, bwd_pcie, gpu_pool, hit_rates, figures, lookups=batch,
                      bwd_units=bwd_units, tier_fwd_bytes=np.maximum(tier_fwd, 0.0), tier_bwd_bytes=np.maximum(tier_bwd, 0.0))


def _keep(state: _State, moves: list[_Move]) -> tuple[list[_Move], str | None]:
    """The moves kept, tried in order of their own gain (the ranks' summed time they save
    alone), each against the state the earlier ones left; and, when some were refused, the
    resource that refused the best of them (the one its move lengthened most)."""
    base = state.objective()[1]
    for mv in moves:
        delta = mv.deltas()
        new = {k: state.v[k] + delta[k] if k in delta else state.v[k] for k in _RES}
        mv.gain = base - state.objective(new)[1]
    kept = []
    refused: _Move | None = None
    for mv in sorted(moves, key=lambda x: -x.gain):
        if mv.gain > 0 and state.try_move(mv.deltas()):
            mv.apply()
            kept.append(mv)
        elif refused is None:
            refused = mv
    if refused is None:
        return kept, None
    d = refused.deltas()
    grew = {"GPU": float((d["gf"] + d["gb"]).max()), "PCIe": float((d["pf"] + d["pb"]).max()),
            refused.details.get("nic_limit", "NIC"): float((d["nf"] + d["nb"]).max()),
            "network": float(np.maximum(d["sent"], d["recv"]).max()) / state.net_bw}
    return kept, max(grew, key=grew.get)
