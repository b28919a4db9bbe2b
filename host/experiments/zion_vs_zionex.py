"""Zion vs ZionEX for the same model: throughput and where the time goes.

Both systems train the same workload on the same number of nodes; the table lists throughput,
iteration time and, per phase, the serialized and exposed time per iteration. Every figure is
a prediction (REFERENCES.md publishes no Zion/ZionEX throughput pair).
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
    run_scenario,
    scaled_workload,
    scenario_data,
    scenario_figures,
)

TITLE = "Zion vs ZionEX: throughput and where the time goes"
_KNOWN = ("model", "nodes", "reference_nodes", "table_fraction", "systems", "iterations", "warmup", *PLANNER_FIELDS)


def check_config(data: dict[str, Any]) -> dict[str, Any]:
    c = Checker(data, "zion_vs_zionex", _KNOWN)
    return {
        "model": c.choice("model", ("model-a", "model-f", "model-i"), "model-a"),
        "nodes": c.int("nodes", 2, 1),
        "reference_nodes": c.int("reference_nodes", 16, 1),
        "table_fraction": c.num("table_fraction", 1.0, 0, 1.0),
        "systems": c.list("systems", item_choice(("zionex", "zion")), ["zionex", "zion"]),
        "iterations": c.int("iterations", 1, 1),
        "warmup": c.int("warmup", 1, 0),
        **planner_fields(c, data),
    }


def run(config: dict[str, Any], progress: Callable[[str], None]) -> ExperimentResult:
    timer = Timer()
    workload = scaled_workload(config["model"], config["nodes"] / config["reference_nodes"], config["table_fraction"])
    rows = []
    for system in config["systems"]:
        progress(f"zion vs zionex: {config['model']} on {config['nodes']} {system} node(s)")
        result = run_scenario(scenario_data(f"{system}-{config['model']}", workload, system, config["nodes"],
                                            iterations=config["iterations"], warmup=config["warmup"],
                                            planner=planner_table(config)))
        fig = scenario_figures(result)
        rows.append({"system": system, "model": config["model"], "nodes": config["nodes"], **fig})
        progress(f"zion vs zionex: {system}: {fig['samples_per_s']:,.0f} samples/s")
    metrics: dict[str, Any] = {r["system"]: {"samples_per_s": r["samples_per_s"], "iteration_ms": r["iteration_ms"],
                                             "exposed_comm_ms": r["exposed_comm_ms"]} for r in rows}
    by = {r["system"]: r for r in rows}
    if "zionex" in by and "zion" in by:
        metrics["zionex_speedup_over_zion"] = by["zionex"]["samples_per_s"] / by["zion"]["samples_per_s"]
    notes = ["Every figure is a prediction; REFERENCES.md publishes no Zion vs ZionEX throughput pair.",
             f"Workload: {workload['description']}."]
    res = ExperimentResult("zion_vs_zionex", TITLE, config, rows, metrics, notes, wall_s=timer.elapsed)
    res.plots = {"throughput.png": lambda f: _bars(f, rows), "breakdown.png": lambda f: _breakdown(f, rows)}
    return res


def _bars(fig, rows) -> None:
    ax = fig.add_subplot(111)
    ax.bar([r["system"] for r in rows], [r["samples_per_s"] for r in rows])
    ax.set_ylabel("samples/s")
    ax.set_title(f"{rows[0]['model']} on {rows[0]['nodes']} node(s)")


def _breakdown(fig, rows) -> None:
    import numpy as np

    ax = fig.add_subplot(111)
    phases = sorted({k[len("exposed_"):-3] for r in rows for k in r if k.startswith("exposed_") and k.endswith("_ms")
                     and k not in ("exposed_comm_ms", "exposed_compute_ms")})
    x = np.arange(len(rows))
    bottom = np.zeros(len(rows))
    cmap = __import__("matplotlib.pyplot", fromlist=["get_cmap"]).get_cmap("tab20")
    for i, phase in enumerate(phases):
        values = np.array([r.get(f"exposed_{phase}_ms", 0.0) for r in rows])
        ax.bar(x, values, bottom=bottom, label=phase, color=cmap(i % 20))
        bottom += values
    ax.set_xticks(x, [r["system"] for r in rows])
    ax.set_ylabel("exposed ms per iteration")
    ax.set_title("where the time goes (exposed time per phase)")
    ax.legend(fontsize=7, ncol=2)
