"""Sharding strategies: Neo's plan against the baseline planners and one-type-everywhere plans.

Every plan is simulated on the cluster runtime (throughput) and costed by the planner's own
cost model (the slowest rank's embedding time and the imbalance), so the table shows both
what the planner expects and what the simulated cluster does. A *forced* plan gives every
table the same sharding type (table-wise onto the least-loaded rank, row-wise over all ranks,
column-wise over up to 8 ranks, table-row-wise over the least-loaded node, data-parallel); a
table that cannot take the type within the memory caps falls back to row-wise over all ranks,
and the table says how many did. Every figure is a prediction.
"""

from __future__ import annotations

from typing import Any, Callable

from host.experiments._common import (
    Checker,
    ExperimentResult,
    Timer,
    item_choice,
    run_scenario,
    scaled_workload,
    scenario_data,
    scenario_figures,
)

TITLE = "Sharding strategies: Neo's planner vs baselines vs one sharding type"
FORCED = ("table_wise", "row_wise", "column_wise", "table_row_wise", "table_column_wise", "data_parallel")
_KNOWN = ("models", "nodes", "reference_nodes", "table_fraction", "baselines", "forced", "iterations", "warmup",
          "planner_time_budget_s")


def check_config(data: dict[str, Any]) -> dict[str, Any]:
    from host.planner import BASELINES

    c = Checker(data, "sharding", _KNOWN)
    return {
        "models": c.list("models", item_choice(("model-a", "model-f", "model-i"))),
        "nodes": c.int("nodes", 2, 1),
        "reference_nodes": c.int("reference_nodes", 16, 1),
        "table_fraction": c.num("table_fraction", 1.0, 0, 1.0),
        "baselines": c.list("baselines", item_choice(tuple(BASELINES)), [], nonempty=False),
        "forced": c.list("forced", item_choice(FORCED), [], nonempty=False),
        "iterations": c.int("iterations", 1, 1),
        "warmup": c.int("warmup", 1, 0),
        "planner_time_budget_s": c.num("planner_time_budget_s", 0.5, 0, 600),
    }


def forced_plan(kind: str, workload, system):
    """Every table of ``workload`` with sharding ``kind`` (see the module doc); returns the
    plan and how many tables fell back to row-wise."""
    import numpy as np

    from host.planner import ShardingType
    from host.planner.search import Placer

    ST = ShardingType
    st = ST(kind)
    p = Placer(workload, system)
    world, g = p.world, p.g
    fallbacks = 0
    for table in sorted(workload.tables, key=lambda t: -float(workload.table_memory_bytes(t))):
        totals = p.totals()
        order = [int(r) for r in np.argsort(totals, kind="stable")]
        tp = None
        if st == ST.TABLE_WISE:
            tp = next((x for x in (p.make(table, st, [r]) for r in order) if x is not None), None)
        elif st == ST.ROW_WISE:
            tp = p.make(table, st, list(range(world)))
        elif st == ST.COLUMN_WISE:
            m = max(1, min(8, world, table.dim // 4))
            tp = p.make(table, st, sorted(order[:m]))
        elif st in (ST.TABLE_ROW_WISE, ST.TABLE_COLUMN_WISE):
            node_load = totals.reshape(-1, g).sum(axis=1)
            for node in np.argsort(node_load, kind="stable"):
                ranks = list(range(int(node) * g, (int(node) + 1) * g))
                if st == ST.TABLE_COLUMN_WISE:
                    ranks = ranks[: max(1, min(g, table.dim // 4))]
                tp = p.make(table, st, ranks)
                if tp is not None:
                    break
        elif st == ST.DATA_PARALLEL:
            tp = p.make(table, st, [])
        if tp is None:
            fallbacks += 1
            tp = p.make(table, ST.ROW_WISE, list(range(world)))
        if tp is None:
            raise p.fits_nowhere(table)
        p.place(tp)
    return p.plan(f"forced-{kind}"), fallbacks


def _run_with(make_plan):
    """A ClusterRun whose sharding comes from ``make_plan(workload, planner_system)``.

    WORKAROUND: host.cluster plans with Neo's planner only (``planner.name = "neo"``); this
    subclass replaces the plan step and builds the planner's system the way the cluster does
    for GPU-resident embeddings (ZionEX)."""
    from host.cluster import ClusterRun, _planner_comm
    from host.planner import MemoryTiers, PlannerSystem

    class PlannedRun(ClusterRun):
        def _plan(self, topo):
            sc = self.scenario
            if sc.system.embeddings != "gpu":
                raise ValueError("sharding: forced and baseline plans are supported on GPU-embedding systems (zionex)")
            psys = PlannerSystem(gpu=sc.system.gpu_spec, comm=_planner_comm(topo), memory=MemoryTiers(),
                                 comm_dtype=sc.system.comm_dtype)
            self.made_plan = make_plan(sc.workload, psys)
            self.psys_used = psys
            return self.made_plan, psys

    return PlannedRun


def run(config: dict[str, Any], progress: Callable[[str], None]) -> ExperimentResult:
    from host.planner import CostModel, plan_baseline

    timer = Timer()
    rows: list[dict[str, Any]] = []
    strategies: list[tuple[str, str, Any]] = [("neo", "planner", None)]
    strategies += [(b, "baseline", b) for b in config["baselines"]]
    strategies += [(f"forced:{k}", "forced", k) for k in config["forced"]]
    for model in config["models"]:
        workload = scaled_workload(model, config["nodes"] / config["reference_nodes"], config["table_fraction"])
        data = scenario_data(f"sharding-{model}", workload, "zionex", config["nodes"], iterations=config["iterations"],
                             warmup=config["warmup"], planner_budget_s=config["planner_time_budget_s"])
        neo_sps = None
        for label, kind, arg in strategies:
            progress(f"sharding: {model}, {label}")
            extra: dict[str, Any] = {"fallback_tables": 0}
            if kind == "planner":
                from host.planner import plan_neo

                def make(wl, psys, budget=config["planner_time_budget_s"]):
                    return plan_neo(wl, psys, time_budget_s=budget)
            elif kind == "baseline":
                def make(wl, psys, name=arg):
                    return plan_baseline(name, wl, psys)
            else:
                def make(wl, psys, k=arg):
                    plan, fallbacks = forced_plan(k, wl, psys)
                    extra["fallback_tables"] = fallbacks
                    return plan
            cls = _run_with(make)
            try:
                runner_result = _run_planned(cls, data)
            except ValueError as error:
                rows.append({"model": model, "strategy": label, "kind": kind, "error": str(error)})
                progress(f"sharding: {model}, {label}: cannot plan: {error}")
                continue
            result, plan, psys = runner_result
            cost = CostModel(result.scenario.workload, psys).evaluate(plan)
            fig = scenario_figures(result)
            if label == "neo":
                neo_sps = fig["samples_per_s"]
            counts = plan.sharding_counts()
            rows.append({"model": model, "strategy": label, "kind": kind, "samples_per_s": fig["samples_per_s"],
                         "relative_to_neo": fig["samples_per_s"] / neo_sps if neo_sps else None,
                         "iteration_ms": fig["iteration_ms"], "exposed_comm_ms": fig["exposed_comm_ms"],
                         "planner_max_rank_ms": float(cost.max_s) * 1e3, "planner_imbalance": float(cost.imbalance),
                         "fallback_tables": extra["fallback_tables"],
                         "sharding": " ".join(f"{k}:{v}" for k, v in sorted(counts.items()))})
            progress(f"sharding: {model}, {label}: {fig['samples_per_s']:,.0f} samples/s")
    metrics: dict[str, Any] = {}
    for model in config["models"]:
        mine = [r for r in rows if r["model"] == model and "samples_per_s" in r]
        if mine:
            best = max(mine, key=lambda r: r["samples_per_s"])
            metrics[model] = {"best_strategy": best["strategy"],
                              "neo_relative_to_best": next((r["samples_per_s"] for r in mine if r["strategy"] == "neo"), 0.0)
                              / best["samples_per_s"]}
    notes = ["Every figure is a prediction; REFERENCES.md publishes no per-strategy throughput.",
             "planner_max_rank_ms / planner_imbalance: the planner's cost model (embedding part only); samples_per_s: "
             "the simulated cluster (whole iteration, pipelined)."]
    res = ExperimentResult("sharding", TITLE, config, rows, metrics, notes, wall_s=timer.elapsed)
    res.plots = {"throughput.png": lambda f: _plot(f, rows)}
    return res


def _run_planned(cls, data):
    from host.cluster import scenario_from_dict

    runner = cls(scenario_from_dict(data))
    result = runner.run()
    return result, runner.made_plan, runner.psys_used


def _plot(fig, rows) -> None:
    import numpy as np

    ok = [r for r in rows if "samples_per_s" in r]
    models = list(dict.fromkeys(r["model"] for r in ok))
    strategies = list(dict.fromkeys(r["strategy"] for r in ok))
    ax = fig.add_subplot(111)
    width = 0.8 / max(1, len(models))
    x = np.arange(len(strategies))
    for i, model in enumerate(models):
        values = [next((r["samples_per_s"] for r in ok if r["model"] == model and r["strategy"] == s), 0.0) for s in strategies]
        ax.bar(x + i * width, values, width, label=model)
    ax.set_xticks(x + width * (len(models) - 1) / 2, strategies, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("samples/s")
    ax.set_title("sharding strategies")
    ax.legend()
