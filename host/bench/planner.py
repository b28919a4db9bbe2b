"""``neonic bench planner``: Neo's sharding search against the baselines on Model-A, 16 x 8 GPUs.

Figures (measured when run): ``planning_s`` (wall time of the Neo search; goal <= 10 s on 2
cores), ``cost_ms`` (the slowest rank's embedding time of one iteration under its plan),
``imbalance_max_over_mean`` (goal <= 1.05), ``baseline_cost_ms`` (per baseline, same cost model)
and ``improvement_over_best_baseline`` (1 - ours / best baseline; goal >= 0.15). The cluster is
the ``zionex`` network preset with A100 40 GB GPUs and 1400 GiB of host DRAM per node for the
cache-backed tier. ``--quick`` plans Model-A's 2/16 share (its tables and parameters, as the
weak-scaling experiment scales it; the whole model does not fit 2 nodes) on 2 nodes. The search is deterministic: it runs to
convergence or ``max_steps`` (:data:`host.planner.DEFAULT_MAX_STEPS`), with no wall-clock budget,
so the plan and its costs are the same on any machine; only ``planning_s`` depends on it
(``refine_steps`` and ``converged`` say where the search ended).
"""

from __future__ import annotations

import time

SUMMARY = "Neo sharding planner vs baselines on model-a, 16 nodes x 8 A100 (zionex)"


def run(ctx) -> dict:
    from neonic.host.experiments._common import scaled_workload
    from neonic.host.planner import BASELINES, DEFAULT_MAX_STEPS, CostModel, NeoPlanner, plan_baseline, plan_config_from_dict

    nodes = 2 if ctx.quick else 16
    workload = scaled_workload("model-a", nodes / 16) if ctx.quick else "model-a"
    cfg = plan_config_from_dict({"workload": workload, "network": "zionex", "nodes": nodes, "gpu": "a100-40gb",
                                 "memory": {"dram_gib_per_node": 1400}})
    w, s = cfg.workload, cfg.system
    cost = CostModel(w, s)
    ctx.progress(f"planning {w.name} ({len(w.tables)} tables) on {s.world_size} ranks, at most {DEFAULT_MAX_STEPS} steps")
    t0 = time.perf_counter()
    planner = NeoPlanner(w, s, cost, max_steps=DEFAULT_MAX_STEPS)
    plan = planner.run()
    planning_s = time.perf_counter() - t0
    ours = cost.evaluate(plan)
    ctx.progress(f"neo: {ours.max_s * 1e3:.3f} ms, imbalance {ours.imbalance:.4f}, {planning_s:.2f} s")
    baselines: dict[str, float] = {}
    baseline_s: dict[str, float] = {}
    for name in BASELINES:
        t1 = time.perf_counter()
        bc = cost.evaluate(plan_baseline(name, w, s, cost))
        baseline_s[name] = time.perf_counter() - t1
        baselines[name] = bc.max_s * 1e3
        ctx.progress(f"{name}: {baselines[name]:.3f} ms, imbalance {bc.imbalance:.4f}")
    best = min(baselines.values())
    return {
        "workload": w.name,
        "world_size": s.world_size,
        "planning_s": planning_s,
        "cost_ms": ours.max_s * 1e3,
        "mean_ms": ours.mean_s * 1e3,
        "imbalance_max_over_mean": ours.imbalance,
        "baseline_cost_ms": baselines,
        "baseline_planning_s": baseline_s,
        "improvement_over_best_baseline": 1.0 - ours.max_s * 1e3 / best,
        "refine_steps": planner.stats.get("refine_steps", 0),
        "max_steps": DEFAULT_MAX_STEPS,
        "converged": planner.stats.get("refine_steps", 0) < DEFAULT_MAX_STEPS,
        "greedy_cost_ms": planner.stats.get("greedy_cost_s", 0.0) * 1e3,
        "sharding_counts": plan.sharding_counts(),
        "network_source": s.comm.source,
    }
