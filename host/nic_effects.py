"""The SmartNIC system's effects on one iteration (``embeddings = "nic"``).

:func:`nic_effects` measures the NIC caches' hit rates on the run's lookups (``sim.nic`` on
the ``sim.lookups.LookupBatch`` of ``host.lookups``) and applies each mechanism that is on to the iteration's work: fewer
GPU lookups, NIC gather/pool and cache work, PCIe fills, changed AlltoAll matrices (its
docstring states every assumption). The result, :class:`NICEffects`, is the explicit input of
the NIC backends (the timing models, or ``sim.cosim.RTLNICBackend`` which replaces its figures).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
                     pool_on_nic=spec.pool_on_nic, reorder=spec.reorder)


@dataclass
class NICEffects:
    """What the SmartNICs change in one iteration (per rank unless said otherwise).

    ``matrices``: the AlltoAllv matrices after the NICs (same keys as the plan's);
    ``gpu_lookups[r][i]``: forward lookups left to the GPU for rank r's i-th shard kernel;
    ``fwd_units[r]``: NIC unit durations (ps) in the embedding forward; ``fwd_pcie_bytes`` /
    ``bwd_pcie_bytes``: PCIe bytes between GPU and NIC (cache fills, write-through, rows to
    the GPU); ``gpu_pool_bytes``: unpooled row bytes a GPU pools before the interaction;
    ``hit_rates`` and ``figures`` for the metrics.
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

    def packetizer_ps(self, matrix: np.ndarray, gpus_per_node: int) -> tuple[int, ...]:
        """Each rank's packetizer time for its inter-node messages of ``matrix`` (one RDMA
        WRITE per destination; intra-node bytes go over NVLink, not the NIC)."""
        from neonic.sim.engine import ps_from_s
        from neonic.sim.nic import packetizer_time_s

        world = matrix.shape[0]
        node = np.arange(world) // gpus_per_node
        out = []
        for r in range(world):
            msgs = matrix[r][node != node[r]]
            out.append(ps_from_s(packetizer_time_s(self.cfg, msgs[msgs > 0])))
        return tuple(out)


def nic_effects(sc, plan, work, psys) -> NICEffects:
    """The SmartNIC mechanisms applied to one iteration's work (see the module doc).

    Local cache (``local_cache_mib`` > 0), on each owner's NIC, warm: it serves only the lookups
    whose indices pass the NIC, those from requesters on other nodes (same-node requesters use
    NVLink; data-parallel replicas serve their own GPU). Hits are gathered by the NIC from its
    memory, misses by the GPU from HBM; a miss costs the cache one tag probe (no fill from NIC
    memory, no row: ``sim.nic.cache_lookup_time_s(misses_elsewhere=True)``). Inference: the
    tables are read-only, so the cache holds profiled hot rows and is never refilled
    (``trace_stats(policy="static")``; nothing crosses PCIe for it). Training: LRU, every miss
    fills the cache (its row crosses PCIe, GPU to NIC) and the optimizer writes updated cached
    rows through. With ``pool_on_nic`` the NIC pools its hits into partial pools, merged on the
    NIC with the GPU's partials, which pass the NIC on their way to the same requesters (no
    extra bytes); without it the hit rows themselves go to those requesters, whose GPUs pool
    them.

    Remote cache (``remote_cache_mib`` > 0), on each requester's NIC, for tables owned on other
    nodes: the requester fetches rows instead of pooled vectors: hits come from its cache, misses
    arrive as raw rows from the owners (and fill the cache), and the requester pools them on
    its NIC (``pool_on_nic``) or ships them over PCIe to its GPU. Inference: warm (profiled hot
    rows, never refilled), and only the misses' indices cross in the input AlltoAll. Training: the rows change every step, so the
    cache is invalidated per batch (cold: reuse within the batch only) and the input and
    gradient AlltoAlls are unchanged (owners need every index for the backward).

    Reorder (``reorder``): each batch's bags are reordered (``sim.nic.reorder_bags``) before the
    caches see them; without a cache it changes nothing. Pooling on the NIC without a cache has
    nothing to pool. Row-wise partial pools (``rs``/``ag``) are left as they are.
    """
    from neonic.sim.engine import ps_from_s
    from neonic.sim.nic import Segment, adjacent_reuse, cache_lookup_time_s, gather_time_s, trace_stats
    from neonic.host.planner.plan import ShardingType

    cfg = nic_config(sc.system.nic)
    wl = sc.workload
    world, gpn = work.world_size, work.gpus_per_node
    alpha = (sc.lookups.alpha if sc.lookups is not None and sc.lookups.alpha is not None
             else ZIPF_ALPHA[sc.mode])
    tables = {t.name: t for t in wl.tables}
    samples = sc.system.nic.trace_samples
    comm_b = psys.comm_bytes
    m = {k: v.copy() for k, v in work.matrices.items()}
    node = np.arange(world) // gpn
    inter = node[:, None] != node[None, :]
    # per rank: (table, shard, kernel) in kernel order
    owned: list[list[tuple[str, Any, Any]]] = [[] for _ in range(world)]
    for t in wl.tables:
        tp = plan.tables[t.name]
        for shard, k in zip(tp.shards, work.tables[t.name].kernels):
            owned[k.rank].append((t.name, shard, k))
    dp_table = {t.name: plan.tables[t.name].sharding == ShardingType.DATA_PARALLEL for t in wl.tables}
    gpu_lookups = [[float(k.lookups) for k in ks] for ks in work.kernels]
    fwd_pcie = np.zeros(world)
    bwd_pcie = np.zeros(world)
    gpu_pool = np.zeros(world)
    nic_rows = [[] for _ in range(world)]      # gather/pool unit work: (dim, elem_bytes, bags, rows per bag)
    cache_lookups = np.zeros(world)
    cache_hits = np.zeros(world)               # of cache_lookups: the hits (local and remote caches)
    cache_row_bytes = np.zeros(world)          # sum of the looked-up rows' bytes (mean row = / lookups)
    figures: dict[str, Any] = {"pool_on_nic": cfg.pool_on_nic, "reorder": cfg.reorder,
                               "local_cache_mib": sc.system.nic.local_cache_mib,
                               "remote_cache_mib": sc.system.nic.remote_cache_mib, "zipf_alpha": alpha,
                               "lookups_traced": 0}
    hit_rates: dict[str, float] = {}
    # forward lookups that reach each owner shard (remote-cache hits never do)
    reach = [[float(k.lookups) for k in ks] for ks in work.kernels]
    memo: dict = {}
    reuse_probe: tuple[np.ndarray, np.ndarray] | None = None

    batch = getattr(psys, "lookups", None)
    if batch is None:
        from neonic.host.lookups import LookupsSpec, build_lookups

        batch = build_lookups(wl, sc.lookups or LookupsSpec(), world=world, mode=sc.mode, seed=sc.seed,
                              min_bags=samples)

    def segment(key: str, name: str, bags: np.ndarray, row_start: int, row_end: int, row_bytes: int) -> Segment:
        """The run's lookups of table ``name`` from the bags selected by ``bags`` (a mask over
        the requesting ranks' bags) that fall in rows ``[row_start, row_end)``."""
        lengths, rows = batch[name].select(bags, row_start, row_end)
        return Segment(key, lengths, rows, row_end - row_start, row_bytes)

    h_of: dict[str, float] = {}             # remote-cache hit rate per table (requesters)
    # ---- remote caches (requesters)
    if cfg.remote_cache and world > gpn:
        warm = sc.mode == "inference"
        passes = 2 if warm else 1
        b = wl.batch_per_gpu
        remote_tables = [t for t in wl.tables if plan.tables[t.name].sharding != ShardingType.DATA_PARALLEL]
        stats: dict[str, Any] = {}
        for requester in sorted({0, world - 1}):
            mine = [t for t in remote_tables if t.name not in stats
                    and any(node[s.rank] != node[requester] for s in plan.tables[t.name].shards)]
            if not mine:
                continue
            segs = []
            for t in mine:
                # the bags of requesters on this requester's node (all bags if too few are drawn)
                mask = node[batch[t.name].requester] == node[requester]
                if np.count_nonzero(mask) < 4:
                    mask = np.ones_like(mask)
                segs.append(segment(t.name, t.name, mask, 0, t.rows, t.row_bytes))
            st = trace_stats(segs, cfg.remote_cache_bytes, cfg.cache_ways, warm=warm, reorder=cfg.reorder,
                             policy="static" if warm else "lru")
            stats.update(st.segments)
        h_of = {name: ss.hit_rate for name, ss in stats.items()}
        total = sum(ss.lookups for ss in stats.values())
        hit_rates["nic_remote"] = sum(ss.hit_rate * ss.lookups for ss in stats.values()) / total if total else 0.0
        inter_frac = (world - gpn) / world
        remote_rows = np.zeros(world)       # rows each requester pools for remote tables
        for r in range(world):
            pooled_total = raw_miss = 0.0
            for i, (name, shard, k) in enumerate(owned[r]):
                if name not in h_of:
                    continue
                h = h_of[name]
                remote_l = k.lookups * inter_frac
                reach[r][i] -= remote_l * h   # served from the requesters' remote caches
                raw_miss += remote_l * (1 - h) * k.row_bytes
                pooled_total += k.pooled_rows * inter_frac * shard.cols * comm_b
            if pooled_total > 0:
                # inter-node pooled vectors become the missed rows
                m["pooled"][r] = np.where(inter[r], m["pooled"][r] * (raw_miss / pooled_total), m["pooled"][r])
        # the requester pools every remote row (hits from its cache, misses as they arrive)
        for t in remote_tables:
            if t.name not in h_of:
                continue
            homes = {int(node[s.rank]) for s in plan.tables[t.name].shards}
            off_node = np.ones(world, bool) if len(homes) > 1 else node != next(iter(homes))
            rows_per_req = b * t.pooling
            for q in np.nonzero(off_node)[0]:
                remote_rows[q] += rows_per_req * t.row_bytes
                cache_lookups[q] += rows_per_req
                cache_hits[q] += rows_per_req * h_of[t.name]
                cache_row_bytes[q] += rows_per_req * t.row_bytes
                if cfg.pool_on_nic:
                    nic_rows[q].append((t.dim, t.elem_bytes, b, t.pooling))
        if not cfg.pool_on_nic:
            fwd_pcie += remote_rows
            gpu_pool += remote_rows
        if warm:
            h_all = hit_rates["nic_remote"]
            m["input"] = np.where(inter, m["input"] * (1 - h_all), m["input"])
    # ---- local caches (owners): only lookups that arrive from other nodes pass the NIC
    local_hits = local_lookups = 0.0
    if cfg.local_cache:
        inference = sc.mode == "inference"
        off_node = (world - gpn) / world            # share of a shard's requesters on other nodes
        for r in range(world):
            # per shard: lookups and bags that reach the owner's NIC from other nodes
            nic_l = [0.0 if dp_table[name] else k.lookups * off_node * (1 - h_of.get(name, 0.0))
                     for name, _, k in owned[r]]
            nic_b = [0.0 if dp_table[name] else k.pooled_rows * off_node for name, _, k in owned[r]]
            segs = []
            for i, (name, shard, k) in enumerate(owned[r]):
                if nic_b[i] <= 0:
                    continue
                # the bags of requesters on other nodes, their lookups in this shard's rows
                mask = node[batch[name].requester] != node[r]
                segs.append(segment(f"{name}#{i}", name, mask, shard.row_start, shard.row_end, k.row_bytes))
            if reuse_probe is None and segs:
                big = max(segs, key=lambda x: len(x.rows))
                reuse_probe = (big.lengths, big.rows)
            # inference: read-only tables, a profiled hot-row cache that stays warm (no fills);
            # training: LRU, every miss fills it and updated cached rows are written through
            st = trace_stats(segs, cfg.local_cache_bytes, cfg.cache_ways, warm=True, reorder=cfg.reorder,
                             policy="static" if inference else "lru")
            hits_r = 0.0
            raw_hit_bytes = 0.0
            for i, (name, shard, k) in enumerate(owned[r]):
                if nic_b[i] <= 0:
                    continue
                ss = st.segments.get(f"{name}#{i}")
                h = ss.hit_rate if ss else 0.0
                hits = nic_l[i] * h
                hits_r += hits
                cache_row_bytes[r] += nic_l[i] * k.row_bytes
                gpu_lookups[r][i] = reach[r][i] - hits
                if not inference:
                    fwd_pcie[r] += (nic_l[i] - hits) * k.row_bytes                          # fills
                    bwd_pcie[r] += k.unique_rows * off_node * h * k.row_bytes               # write-through
                bags_hit = nic_b[i] * (ss.bags_with_hit if ss else 0.0)
                if cfg.pool_on_nic:
                    # partial pools merge on the NIC with the GPU's partials, which pass the NIC
                    # on their way to the same requesters: no extra bytes anywhere
                    nic_rows[r].append((shard.cols, k.row_bytes // max(1, shard.cols), bags_hit, hits / bags_hit if bags_hit else 0.0))
                else:
                    raw_hit_bytes += hits * k.row_bytes
            local_hits += hits_r
            local_lookups += sum(nic_l)
            cache_lookups[r] += sum(nic_l)
            cache_hits[r] += hits_r
            row = work.matrices["pooled"][r] * inter[r]
            if raw_hit_bytes > 0 and row.sum() > 0:
                # without pooling on the NIC the hit rows themselves go to the requesters on
                # other nodes, whose GPUs pool them
                extra = row * (raw_hit_bytes / row.sum())
                m["pooled"][r] += extra
                gpu_pool += extra    # gradients still travel pooled (grad AlltoAll unchanged)
        hit_rates["nic_local"] = float(local_hits / local_lookups) if local_lookups else 0.0
    else:
        gpu_lookups = [list(x) for x in reach]
    # ---- the units' times
    units: list[tuple[tuple[str, int], ...]] = []
    for r in range(world):
        g = gather_time_s(cfg, nic_rows[r], seed=sc.seed, memo=memo) if nic_rows[r] else 0.0
        n = cache_lookups[r]
        c = (cache_lookup_time_s(cfg, n, hit_rate=min(1.0, cache_hits[r] / n), row_bytes=cache_row_bytes[r] / n,
                                 misses_elsewhere=True) if n > 0 else 0.0)
        units.append(tuple((u, ps_from_s(t)) for u, t in (("cache", c), ("gather", g)) if t > 0))
    if reuse_probe is not None:
        lengths, rows = reuse_probe
        base = adjacent_reuse(lengths, rows, cfg.reuse_window)
        after = adjacent_reuse(lengths, rows, cfg.reuse_window, reorder=True)
        figures["reuse_window"] = cfg.reuse_window
        figures["adjacent_reuse"] = base
        figures["adjacent_reuse_reordered"] = after
    figures["pcie_fwd_bytes_per_rank"] = float(fwd_pcie.mean())
    figures["pcie_bwd_bytes_per_rank"] = float(bwd_pcie.mean())
    figures["gpu_forward_lookups_per_rank"] = float(np.mean([sum(x) for x in gpu_lookups]))
    figures["pooled_a2a_bytes"] = float(m["pooled"].sum())
    figures["lookups_traced"] = int(batch.lookups)
    return NICEffects(cfg, m, gpu_lookups, units, fwd_pcie, bwd_pcie, gpu_pool, hit_rates, figures, lookups=batch)

