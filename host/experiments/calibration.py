"""Calibration of the GPU efficiency parameters on Model-A's published throughput, and the
predictions that follow from it.

One common factor ``s`` scales the chosen ``sim.gpu.GPUEfficiency`` parameters (each capped at
1); the fit searches ``s`` so that the simulated Model-A throughput meets the target, assuming
throughput ~ s^alpha locally (alpha from the last two evaluations, 1 at first). The result
lists every evaluation (kind ``fit``), the fitted parameters (``fitted parameter``) and the
predictions made with them (``prediction``); only the target is a published figure.

GPU preset: where a GPU is available, its measured embedding-bag, GEMM and copy/compute-overlap
figures would be recorded as a preset with their source; no GPU was available to this project
run, so nothing is measured and the metrics say so (no figure is invented).
"""

from __future__ import annotations

import math
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

TITLE = "Calibration on Model-A's published 1.2M samples/s; everything else a prediction"
PARAMETERS = ("gemm", "embedding_random", "embedding_backward", "hbm_stream")
_KNOWN = ("model", "nodes", "table_fraction", "target_samples_per_s", "system", "parameters", "tolerance", "max_evaluations",
          "iterations", "warmup", "predictions", "reference_nodes", *PLANNER_FIELDS)
GPU_NOTE = ("No GPU was available to this run: no embedding-bag, GEMM or copy/compute-overlap figure was measured, "
            "and the GPU preset keeps its data-sheet figures and the efficiencies fitted here.")


def check_config(data: dict[str, Any]) -> dict[str, Any]:
    c = Checker(data, "calibration", _KNOWN)
    preds = []
    for i, p in enumerate(c.list("predictions", lambda where, v: v, [], nonempty=False)):
        pc = Checker(p, f"calibration.predictions[{i}]", ("model", "nodes", "table_fraction", "params_fraction"))
        preds.append({"model": pc.choice("model", ("model-a", "model-f", "model-i")), "nodes": pc.int("nodes", None, 1),
                      "table_fraction": pc.num("table_fraction", 1.0, 0, 1.0),
                      "params_fraction": pc.num("params_fraction", 1.0, 0, 1.0)})
    return {
        "model": c.choice("model", ("model-a", "model-f", "model-i"), "model-a"),
        "nodes": c.int("nodes", 16, 1),
        "reference_nodes": c.int("reference_nodes", 16, 1),
        "table_fraction": c.num("table_fraction", 1.0, 0, 1.0),
        "target_samples_per_s": c.num("target_samples_per_s", 1.2e6, 0),
        "system": c.choice("system", ("zionex",), "zionex"),
        "parameters": c.list("parameters", item_choice(PARAMETERS)),
        "tolerance": c.num("tolerance", 0.02, 0, 1.0),
        "max_evaluations": c.int("max_evaluations", 4, 1),
        "iterations": c.int("iterations", 1, 1),
        "warmup": c.int("warmup", 1, 0),
        **planner_fields(c, data),
        "predictions": preds,
    }


def _efficiencies(system: str, parameters: list[str], factor: float) -> dict[str, float]:
    from neonic.host.systems import resolve_system

    eff = resolve_system(system).gpu_spec.efficiency
    return {p: min(1.0, getattr(eff, p) * factor) for p in parameters}


def _run(config, model: str, nodes: int, table_fraction: float, params_fraction: float, eff: dict[str, float]):
    workload = scaled_workload(model, nodes / config["reference_nodes"], table_fraction, params_fraction)
    system = {"preset": config["system"], "gpu_efficiency": eff}
    return run_scenario(scenario_data(f"calibration-{model}", workload, system, nodes, iterations=config["iterations"],
                                      warmup=config["warmup"], planner=planner_table(config)))


def run(config: dict[str, Any], progress: Callable[[str], None]) -> ExperimentResult:
    timer = Timer()
    target = config["target_samples_per_s"]
    rows: list[dict[str, Any]] = []
    history: list[tuple[float, float]] = []  # (factor, samples/s)
    factor = 1.0
    for k in range(config["max_evaluations"]):
        eff = _efficiencies(config["system"], config["parameters"], factor)
        progress(f"calibration: evaluation {k + 1}, factor {factor:.4f}")
        sps = scenario_figures(_run(config, config["model"], config["nodes"], config["table_fraction"], 1.0, eff))["samples_per_s"]
        history.append((factor, sps))
        rows.append({"figure": f"{config['model']} samples/s on {config['nodes']} nodes (fit evaluation {k + 1})",
                     "kind": "fit", "value": sps, "factor": factor, **{f"eff_{p}": v for p, v in eff.items()}})
        progress(f"calibration: factor {factor:.4f}: {sps:,.0f} samples/s (target {target:,.0f})")
        if abs(sps / target - 1) <= config["tolerance"]:
            break
        alpha = 1.0
        if len(history) >= 2:
            (f0, s0), (f1, s1) = history[-2], history[-1]
            if f0 != f1 and s0 > 0 and s1 > 0 and s0 != s1:
                alpha = min(2.0, max(0.2, math.log(s1 / s0) / math.log(f1 / f0)))
        factor = factor * (target / sps) ** (1 / alpha)
        cap = 1.0 / max(getattr(_base_eff(config), p) for p in config["parameters"])
        factor = min(factor, cap)
    best_factor, best_sps = min(history, key=lambda h: abs(h[1] / target - 1))
    fitted = _efficiencies(config["system"], config["parameters"], best_factor)
    rows.append({"figure": f"{config['model']} samples/s on {config['nodes']} nodes (published target)", "kind": "published",
                 "value": target})
    for p, v in fitted.items():
        rows.append({"figure": f"GPUEfficiency.{p}", "kind": "fitted parameter", "value": v, "factor": best_factor})
    predictions: dict[str, Any] = {}
    for p in config["predictions"]:
        progress(f"calibration: predicting {p['model']} on {p['nodes']} nodes")
        fig = scenario_figures(_run(config, p["model"], p["nodes"], p["table_fraction"], p["params_fraction"], fitted))
        label = f"{p['model']} samples/s on {p['nodes']} nodes" + (
            f" ({p['params_fraction']:g} of its parameters)" if p["params_fraction"] < 1 else "") + (
            f" ({p['table_fraction']:g} of its tables)" if p["table_fraction"] < 1 else "")
        rows.append({"figure": label, "kind": "prediction", "value": fig["samples_per_s"], "factor": best_factor})
        predictions[label] = fig["samples_per_s"]
    metrics = {
        "target_samples_per_s": target,
        "fitted_samples_per_s": best_sps,
        "relative_difference": best_sps / target - 1,
        "factor": best_factor,
        "fitted_parameters": fitted,
        "evaluations": len(history),
        "converged": abs(best_sps / target - 1) <= config["tolerance"],
        "predictions": predictions,
        "gpu_measurements": {"measured": False, "note": GPU_NOTE},
    }
    notes = [f"Fitted on one published figure only: {config['model']} at {target:,.0f} samples/s on {config['nodes']} nodes.",
             "Every row of kind 'prediction' (and every other experiment's figure) is a prediction made with these parameters.",
             GPU_NOTE]
    res = ExperimentResult("calibration", TITLE, config, rows, metrics, notes, wall_s=timer.elapsed)
    res.plots = {"fit.png": lambda f: _plot(f, history, target)}
    return res


def _base_eff(config):
    from neonic.host.systems import resolve_system

    return resolve_system(config["system"]).gpu_spec.efficiency


def _plot(fig, history, target) -> None:
    ax = fig.add_subplot(111)
    ax.plot([h[0] for h in history], [h[1] for h in history], marker="o", label="simulated")
    ax.axhline(target, color="k", linestyle="--", label="published target")
    ax.set_xlabel("efficiency factor")
    ax.set_ylabel("samples/s")
    ax.set_title("calibration evaluations")
    ax.legend()
