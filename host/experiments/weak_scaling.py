"""Weak scaling of Neo's models from 1 to 16 nodes: throughput, scaling efficiency and where the
exposed communication time goes.

For each model and node count the cluster runtime trains the model share that the node count
holds (see ``weak_scaling.toml``) with the model's published per-GPU batch on ZionEX.
Scaling efficiency is the per-GPU throughput relative to the smallest cluster of the sweep:
``(samples/s / gpus) / (samples/s / gpus at the smallest node count)``. Every figure is a
prediction of the model (none of them is published in shared/REFERENCES.md).
"""

from __future__ import annotations

from typing import Any, Callable

from neonic.host.experiments._common import (
    PLANNER_FIELDS,
    COMM_PHASES,
    Checker,
    ExperimentResult,
    Timer,
    item_choice,
    item_int,
    planner_fields,
    planner_table,
    run_scenario,
    scaled_workload,
    scenario_data,
    scenario_figures,
)

TITLE = "Weak scaling, 1 to 16 ZionEX nodes (fixed per-GPU batch)"
MODELS = ("model-a", "model-f", "model-i")
_KNOWN = ("models", "nodes", "reference_nodes", "table_fraction", "params_fraction", "system", "iterations", "warmup",
          *PLANNER_FIELDS)


def check_config(data: dict[str, Any]) -> dict[str, Any]:
    c = Checker(data, "weak_scaling", _KNOWN)
    pf = c.table("params_fraction", {})
    for key, value in pf.items():
        if key not in MODELS:
            raise ValueError(f"weak_scaling.params_fraction.{key}: unknown model; expected one of {', '.join(MODELS)}")
        Checker(pf, "weak_scaling.params_fraction", MODELS).num(key, lo=0, hi=1.0)
    return {
        "models": c.list("models", item_choice(MODELS)),
        "nodes": sorted(set(c.list("nodes", item_int(1)))),
        "reference_nodes": c.int("reference_nodes", 16, 1),
        "table_fraction": c.num("table_fraction", 1.0, 0, 1.0),
        "params_fraction": {k: float(v) for k, v in pf.items()},
        "system": c.choice("system", ("zionex", "zion"), "zionex"),
        "iterations": c.int("iterations", 1, 1),
        "warmup": c.int("warmup", 1, 0),
        **planner_fields(c, data),
    }


def run(config: dict[str, Any], progress: Callable[[str], None]) -> ExperimentResult:
    timer = Timer()
    rows: list[dict[str, Any]] = []
    for model in config["models"]:
        base = None
        for nodes in config["nodes"]:
            fraction = nodes / config["reference_nodes"]
            workload = scaled_workload(model, fraction, config["table_fraction"], config["params_fraction"].get(model, 1.0))
            data = scenario_data(f"weak-{model}-{nodes}", workload, config["system"], nodes,
                                 iterations=config["iterations"], warmup=config["warmup"],
                                 planner=planner_table(config))
            progress(f"weak scaling: {model} on {nodes} node(s)")
            result = run_scenario(data)
            fig = scenario_figures(result)
            per_gpu = fig["samples_per_s"] / fig["gpus"]
            if base is None:
                base = per_gpu
            row = {"model": model, "nodes": nodes, "gpus": fig["gpus"], "tables": workload["synthesize"]["count"],
                   "params": workload["synthesize"]["total_params"], "batch_per_gpu": result.scenario.workload.batch_per_gpu,
                   "samples_per_s": fig["samples_per_s"], "samples_per_s_per_gpu": per_gpu,
                   "scaling_efficiency": per_gpu / base, "iteration_ms": fig["iteration_ms"],
                   "exposed_comm_ms": fig["exposed_comm_ms"], "exposed_compute_ms": fig["exposed_compute_ms"],
                   "idle_ms": fig["idle_ms"]}
            for phase in COMM_PHASES:
                if f"exposed_{phase}_ms" in fig:
                    row[f"exposed_{phase}_ms"] = fig[f"exposed_{phase}_ms"]
            rows.append(row)
            progress(f"weak scaling: {model} on {nodes} node(s): {fig['samples_per_s']:,.0f} samples/s, "
                     f"efficiency {row['scaling_efficiency']:.3f}")
    metrics: dict[str, Any] = {}
    for model in config["models"]:
        mine = [r for r in rows if r["model"] == model]
        last = mine[-1]
        metrics[model] = {"samples_per_s_at_max_nodes": last["samples_per_s"], "max_nodes": last["nodes"],
                          "scaling_efficiency_at_max_nodes": last["scaling_efficiency"],
                          "exposed_comm_share_at_max_nodes": last["exposed_comm_ms"] / last["iteration_ms"]}
    notes = [
        "Every figure is a prediction of the model; REFERENCES.md publishes no weak-scaling figure.",
        f"A cluster of n nodes trains n/{config['reference_nodes']} of each model's tables and parameters "
        f"(times table_fraction={config['table_fraction']} of the tables, which hold all of that share's parameters), "
        "with the model's published per-GPU batch.",
        "Scaling efficiency: per-GPU throughput relative to the smallest node count of the run.",
    ]
    if config["params_fraction"].get("model-f", 1.0) < 1.0 and "model-f" in config["models"]:
        notes.append(f"Model-F runs at {config['params_fraction']['model-f']} of its 12T parameters: the published "
                     "model needs the hosts' DRAM, and the cluster runtime keeps ZionEX embeddings in HBM.")
    res = ExperimentResult("weak_scaling", TITLE, config, rows, metrics, notes, wall_s=timer.elapsed)
    res.plots = {"throughput.png": lambda f: _plot_lines(f, rows, "samples_per_s", "samples/s"),
                 "efficiency.png": lambda f: _plot_lines(f, rows, "scaling_efficiency", "scaling efficiency"),
                 "exposed_comm.png": lambda f: _plot_exposed(f, rows)}
    return res


def _plot_lines(fig, rows, key: str, label: str) -> None:
    ax = fig.add_subplot(111)
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        ax.plot([r["gpus"] for r in mine], [r[key] for r in mine], marker="o", label=model)
    ax.set_xscale("log", base=2)
    gpus = sorted({r["gpus"] for r in rows})
    ax.set_xticks(gpus, [str(g) for g in gpus])  # the measured GPU counts, as integers
    ax.minorticks_off()
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float)) and r[key] > 0]
    if values and max(values) / min(values) >= 8:  # on log-log axes linear scaling is a straight line
        ax.set_yscale("log")
    ax.set_xlabel("GPUs")
    ax.set_ylabel(label)
    ax.set_title(f"weak scaling: {label}")
    ax.legend(fontsize=9)


def _plot_exposed(fig, rows) -> None:
    import numpy as np

    ax = fig.add_subplot(111)
    labels = [f"{r['model']}\n{r['nodes']}n" for r in rows]
    x = np.arange(len(rows))
    bottom = np.zeros(len(rows))
    for phase in COMM_PHASES:
        values = np.array([r.get(f"exposed_{phase}_ms", 0.0) for r in rows])
        if values.any():
            ax.bar(x, values, bottom=bottom, label=phase)
            bottom += values
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("exposed ms per iteration")
    ax.set_title("exposed communication per iteration")
    ax.legend(fontsize=7)
