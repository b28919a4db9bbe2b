"""A run's metrics: what one executed op graph and the engine's resources measured.

:class:`RunResult` holds everything a report needs; :func:`collect_metrics` computes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from neonic.host.schedule import OpGraph, phase_breakdown
from neonic.sim.engine import Engine, s_from_ps
from neonic.sim.resources import GPUDevice

if TYPE_CHECKING:
    from neonic.host.iteration import DenseCosts
    from neonic.host.scenario import Scenario

__all__ = ["RunResult", "collect_metrics", "sample_ranks", "timeline_tracks"]


@dataclass
class RunResult:
    """Everything a report needs from one run."""

    scenario: "Scenario"
    graph: OpGraph
    metrics: dict[str, Any]
    breakdown: Any
    tracks: dict[str, list[tuple[int, int, str]]]
    utilization: dict[str, float]
    link_class_bytes: dict[str, float]
    wall_s: float
    counters: dict[str, list[tuple[int, dict[str, float]]]] = field(default_factory=dict)  # "gpu0/SM share"





def collect_metrics(sc: "Scenario", graph: OpGraph, engine: Engine, end_ps: int, res: dict, dense: "DenseCosts", plan: Any,
                    gpus_per_node: int, nic_stats: dict[str, float], nic_metrics: dict[str, Any], wall_s: float, *,
                    work: Any = None, psys: Any = None, tier_miss_bytes: Any = None, lookups: Any = None) -> RunResult:
    """The run's metrics from the executed graph and the resources' counters (iteration time
    between the warm-up's and the last measured iteration's ends, phase breakdowns of the
    sampled ranks, utilisations, the network's bytes per link class, the NICs' figures, the
    memory tiers and the GPU-host link: ``work``/``psys`` are the iteration's work and the
    planner's system, ``lookups`` the run's ``sim.lookups.LookupBatch``)."""
    world = graph.num_ranks
    its = list(range(sc.warmup, sc.warmup + sc.iterations))
    # iteration boundaries: the end of each iteration's last op on any rank
    it_end = [0] * graph.iterations
    it_start = [None] * graph.iterations
    for op in graph.ops:
        if op.iteration >= graph.iterations:  # the next batch's prefetch (host.schedule.build_graph)
            continue
        it_end[op.iteration] = max(it_end[op.iteration], op.end)
        s = it_start[op.iteration]
        it_start[op.iteration] = op.start if s is None else min(s, op.start)
    lo = it_end[sc.warmup - 1] if sc.warmup > 0 else 0
    hi = it_end[its[-1]]
    iter_s = s_from_ps(hi - lo) / len(its)
    global_batch = sc.workload.batch_per_gpu * world
    sample = sample_ranks(world)
    bd = phase_breakdown(graph, sample, its)
    metrics: dict[str, Any] = {
        "scenario": sc.name,
        "mode": sc.mode,
        "pipelined": sc.pipelined,
        "system": sc.system.name,
        "workload": sc.workload.name,
        "gpus": world,
        "nodes": (world + gpus_per_node - 1) // gpus_per_node,
        "global_batch": global_batch,
        "iteration_time_s": iter_s,
        "samples_per_s": global_batch / iter_s if iter_s > 0 else 0.0,
        "simulated_time_s": s_from_ps(end_ps),
        "measured_iterations": len(its),
        "warmup_iterations": sc.warmup,
        "events": engine.events_processed,
        "wall_s": wall_s,
        "phase_serialized_s": bd.serialized,
        "phase_exposed_s": bd.exposed,
        "idle_s": bd.idle,
        "dense_params": dense.params,
        "plan": getattr(plan, "sharding_counts", lambda: {})(),
        "plan_notes": list(getattr(plan, "notes", ())),
        "lookup_sources": lookups.sources() if lookups is not None else {},
    }
    if sc.mode == "inference":
        lat = []
        for it in its:
            for r in sample:
                first = graph.get("h2d", it, r) or graph.get("input_a2a", it, r)
                last = graph.get("top_fwd", it, r)
                lat.append(last.end - first.start)
        metrics["latency_s"] = {"mean": s_from_ps(int(np.mean(lat))), "max": s_from_ps(int(max(lat)))}
    gpus: list[GPUDevice] = res["gpus"]
    elapsed = end_ps
    util = {"gpu_sm": float(np.mean([g.utilization(elapsed)["sm"] for g in gpus])),
            "gpu_hbm": float(np.mean([g.utilization(elapsed)["hbm"] for g in gpus])),
            "pcie": res["host_link"].utilization(elapsed)}
    if sc.system.embeddings == "cpu":
        util["cpu_sockets"] = float(np.mean([s.utilization(elapsed) for s in res["sockets"]]))
    if res["nics"]:
        for unit in res["nics"][0].units:
            util[f"nic_{unit}"] = float(np.mean([n.units[unit].utilization(elapsed) for n in res["nics"]]))
    net = res["net"]
    link_class = {k: float(v) for k, v in net.link_class_bytes().items()}
    util.update(_network_utilization(net, elapsed))
    metrics["utilization"] = util
    metrics["link_class_bytes"] = link_class
    metrics["cache_hit_rates"] = dict(nic_stats)
    if nic_metrics:
        metrics["nic"] = dict(nic_metrics)
    if work is not None and psys is not None:
        metrics["memory_tiers"] = tier_metrics(sc, res["host_link"], work, psys, tier_miss_bytes, elapsed)
    tracks_ = timeline_tracks(graph, sample)
    for r, spans in res["host_link"].spans.items():
        tracks_[f"gpu{r}/pcie"] = sorted(spans)
    for nic in res["nics"]:
        if nic.record:
            for unit, spans in nic.intervals.items():
                tracks_[f"{nic.name}/{unit}"] = sorted(spans)
    counters: dict[str, list[tuple[int, dict[str, float]]]] = {}
    for g in gpus:
        if g.record:
            counters[f"{g.name}/SM share"] = [(t, {"compute": a, "comm": c}) for t, a, _, c, _ in g.counters]
            counters[f"{g.name}/HBM share"] = [(t, {"compute": b, "comm": d}) for t, _, b, _, d in g.counters]
    return RunResult(sc, graph, metrics, bd, tracks_, util, link_class, wall_s, counters)


def tier_metrics(sc: "Scenario", host_link: Any, work: Any, psys: Any, tier_miss_bytes: Any,
                 elapsed_ps: int) -> dict[str, Any]:
    """Memory tiers: bytes per tier, the HBM cache of host-tier shards (lookups, hits,
    misses per iteration, hit rate per table) and the GPU-host link's bytes and
    utilisation (the network's counters: ``link_class_bytes["pcie"]`` is the same sum)."""
    shards = {t: 0 for t in ("hbm", "dram", "ssd")}
    lookups = hits = 0.0
    rates: dict[str, float] = {}
    cached = psys.memory.cached   # shared HBM: host-tier rows are read in place, no cache
    for t in sc.workload.tables:
        for k in work.tables[t.name].kernels:
            shards[k.tier] += 1
            if k.tier != "hbm" and cached:
                h = psys.tier_hit_rate(t)
                rates[t.name] = h
                lookups += k.lookups
                hits += k.lookups * h
    link = host_link.link_bytes()
    return {
        "bytes": {"hbm": float(work.hbm_bytes.sum()), "dram": float(work.dram_bytes.sum()),
                  "ssd": float(work.ssd_bytes.sum())},
        "shards": shards,
        "link": psys.memory.link,
        "cache": {"load_factor": psys.memory.cache_load_factor if cached else None, "ways": psys.memory.cache_ways,
                  "policy": psys.memory.cache_policy,
                  "lookups_per_iteration": lookups, "hits_per_iteration": hits,
                  "misses_per_iteration": lookups - hits,
                  "hit_rate": hits / lookups if lookups else None, "hit_rate_by_table": rates,
                  "miss_bytes_per_iteration": float(np.sum(0.0 if tier_miss_bytes is None else tier_miss_bytes))},
        "pcie": {"bytes": float(link.sum()), "bytes_by_kind": dict(host_link.bytes_by_kind),
                 "utilization": host_link.utilization(elapsed_ps),
                 "link_gbytes_per_s": psys.host_link_bytes_per_s / 1e9},
    }


def _network_utilization(net, elapsed_ps: int) -> dict[str, float]:
    fn = getattr(net, "link_class_utilization", None)
    if fn is None or elapsed_ps <= 0:
        return {}
    return {f"net_{k}": float(v) for k, v in fn(elapsed_ps).items()}


def sample_ranks(world: int) -> list[int]:
    """The ranks whose timelines and breakdowns are kept (all of them up to 64)."""
    return sorted({0, world // 2, world - 1}) if world > 64 else list(range(world))


def timeline_tracks(graph: OpGraph, ranks: list[int]) -> dict[str, list[tuple[int, int, str]]]:
    """Timeline tracks for the trace: one per (rank, stream) of the sampled ranks, one per
    collective class (the network)."""
    tracks: dict[str, list[tuple[int, int, str]]] = {}
    keep = set(ranks)
    for op in graph.ops:
        label = f"{op.phase}[{op.iteration}]"
        if op.collective:
            tracks.setdefault(f"network/{op.phase}", []).append((op.start, op.end, label))
            for r in ranks:
                tracks.setdefault(f"gpu{r}/{op.stream}", []).append((op.start, op.end, label))
        elif op.rank in keep:
            tracks.setdefault(f"gpu{op.rank}/{op.stream}", []).append((op.start, op.end, label))
    return tracks
