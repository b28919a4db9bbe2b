"""Sharding strategies: Neo's plan against the baseline planners and one-type-everywhere plans.

Every plan is simulated on the cluster runtime (throughput) and costed by the planner's own
cost model (the slowest rank's embedding time and the imbalance), so the table shows both
what the planner expects and what the simulated cluster does. Every plan comes from
``host.planner.make_plan`` through the scenario's ``[planner] name``: ``neo``, a baseline, or
``force:<type>``, which gives every table the same sharding type (see ``host.planner.api``; a
table that cannot take the type within the memory caps falls back to row-wise over all ranks,
and the table says how many did). Every figure is a prediction.
"""

from __future__ import annotations

from typing import Any, Callable

from neonic.host.experiments._common import (
    PLANNER_FIELDS,
    Checker,
    ExperimentResult,
    Timer,
    item_choice,
    planner_fields,
    planner_table,
    scaled_workload,
    scenario_data,
    scenario_figures,
)

TITLE = "Sharding strategies: Neo's planner vs baselines vs one sharding type"
FORCED = ("table_wise", "row_wise", "column_wise", "table_row_wise", "table_column_wise", "data_parallel")
_KNOWN = ("models", "nodes", "reference_nodes", "table_fraction", "baselines", "forced", "iterations", "warmup",
          *PLANNER_FIELDS)


def check_config(data: dict[str, Any]) -> dict[str, Any]:
    from neonic.host.planner import BASELINES

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
        **planner_fields(c, data),
    }


def run(config: dict[str, Any], progress: Callable[[str], None]) -> ExperimentResult:
    from neonic.host.planner import CostModel, forced_fallbacks

    timer = Timer()
    rows: list[dict[str, Any]] = []
    # (label in the table, kind, the planner's name for host.planner.make_plan)
    strategies: list[tuple[str, str, str]] = [("neo", "planner", "neo")]
    strategies += [(b, "baseline", b) for b in config["baselines"]]
    strategies += [(f"forced:{k}", "forced", f"force:{k.replace('_', '-')}") for k in config["forced"]]
    for model in config["models"]:
        workload = scaled_workload(model, config["nodes"] / config["reference_nodes"], config["table_fraction"])
        data = scenario_data(f"sharding-{model}", workload, "zionex", config["nodes"], iterations=config["iterations"],
                             warmup=config["warmup"])
        neo_sps = None
        for label, kind, name in strategies:
            progress(f"sharding: {model}, {label}")
            point = {**data, "planner": planner_table(config, name)}
            try:
                result, plan, psys = _run_planned(point)
            except ValueError as error:
                rows.append({"model": model, "strategy": label, "kind": kind, "error": str(error)})
                progress(f"sharding: {model}, {label}: cannot plan: {error}")
                continue
            cost = CostModel(result.scenario.workload, psys).evaluate(plan)
            fig = scenario_figures(result)
            if label == "neo":
                neo_sps = fig["samples_per_s"]
            counts = plan.sharding_counts()
            rows.append({"model": model, "strategy": label, "kind": kind, "samples_per_s": fig["samples_per_s"],
                         "relative_to_neo": fig["samples_per_s"] / neo_sps if neo_sps else None,
                         "iteration_ms": fig["iteration_ms"], "exposed_comm_ms": fig["exposed_comm_ms"],
                         "planner_iteration_ms": float(cost.iteration_s) * 1e3,
                         "planner_max_rank_ms": float(cost.max_s) * 1e3, "planner_imbalance": float(cost.imbalance),
                         "fallback_tables": forced_fallbacks(plan),
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
             "planner_iteration_ms: the planner's predicted iteration (its objective, on the simulator's op graph); "
             "planner_max_rank_ms / planner_imbalance: the planner's cost model (embedding part only); samples_per_s: "
             "the simulated cluster (whole iteration, pipelined)."]
    res = ExperimentResult("sharding", TITLE, config, rows, metrics, notes, wall_s=timer.elapsed)
    res.plots = {"throughput.png": lambda f: _plot(f, rows)}
    return res


def _run_planned(data):
    """Run one scenario; its plan and the planner's system come from the cluster's own
    planning step (``[planner] name``)."""
    from neonic.host.cluster import ClusterRun, scenario_from_dict

    runner = ClusterRun(scenario_from_dict(data))
    result = runner.run()
    return result, runner.plan, runner.planner_system


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
