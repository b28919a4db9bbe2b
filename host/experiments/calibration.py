"""Calibration on Model-A's published throughput that absorbs nothing, and the predictions that
follow from it.

The GPU efficiency parameters of ``sim.gpu.GPUEfficiency`` start from their documented values
(each with its source or ASSUMPTION in ``sim/gpu.py``), never from the target. The fit adjusts
one degree of freedom: a common factor ``s`` over the chosen ``parameters`` (by default the
achieved bandwidths of the fused embedding kernels, ``embedding_random`` and
``embedding_backward``, the least-known figures of the model), each capped at 1. Model-A runs
with Neo's post-optimization settings (``host.experiments.ablation.NEO_SETTINGS``), the
configuration Neo's throughput was measured in.

The report shows, honestly:

* the **pre-fit figure**: Model-A's throughput with the starting values (factor 1);
* every fit evaluation; the **fitted value of each parameter beside its start**, and a flag
  when it moved by more than ``flag_move`` (30% by default): a large move says the model misses
  something the fit is hiding;
* the **sensitivity** (elasticity, d ln figure / d ln s, by a finite step of ``sensitivity_step``)
  of the calibration target and of every prediction to the fitted factor: a figure that barely
  responds cannot be fixed by the fit, so a target it meets says little.

Plans: the fit runs one plan throughout, Neo's plan made from the starting values (the pre-fit
run's): the fitted factor describes the hardware under the plan Neo made, and the figure is a
smooth function of the factor (a plan re-made at every evaluation would jump between plans, and
the secant steps with it). Each prediction is planned with the fitted values, and its
sensitivity holds that plan (a partial derivative in the factor).

The fit searches ``s`` by secant steps in log space (throughput ~ s^alpha locally). Where the
target cannot be reached within the parameters' range (an efficiency cannot exceed 1), the fit
stops at the bound and says so (``converged`` false).

Starting values (``sim/gpu.py``): the GEMM fraction and the streaming bandwidth have public
sources (the large-GEMM fraction of the A100, times the tile/wave quantization of each GEMM's
grid; the A100's achieved read bandwidth); the fused embedding kernels' bandwidths have none
(no public achieved-bandwidth figure of FBGEMM's table-batched kernels on A100 was found) and
stay ASSUMPTIONs, which is why they are the fitted parameters.

Mechanisms a large fitted move has pointed at (each changed only with its source, never toward
the target): the next batch waiting for the dense optimizer step, as PyTorch DDP's program order
runs it (``dense.next_batch = "after_step"``, ``host.gradients``), which exposes Model-A's
pooled AlltoAll as Neo reports; the GEMMs' wave quantization at the local batch (``sim.gpu``).
What remains unexplained shows as the fitted move and its flag; candidates without a public
source to settle them are the dense part's datatype (``dense.dtype``: Neo does not say whether
its MLPs ran in FP16 or TF32), the achieved bandwidth of the fused embedding kernels and the
interference of NCCL kernels with computation (``system.streams``).

GPU preset: Model-A runs on the A100 preset, as Neo's ZionEX did, and no A100 was lent to this
project: its embedding fractions stay ASSUMPTIONs. The Hopper presets' fractions and the
backward's radix sort are measured on H100/H200 machines (``sim/data/``, ``neonic bench gpu``);
the A100 takes the sort's figures as an ASSUMPTION (``sim.gpu.GPUEfficiency.radix_sort``).
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
          "iterations", "warmup", "predictions", "reference_nodes", "flag_move", "sensitivity_step", "neo_settings",
          *PLANNER_FIELDS)
GPU_NOTE = ("No GPU was available to this run: no embedding-bag, GEMM or copy/compute-overlap figure was measured on "
            "hardware; the GPU preset keeps its data-sheet figures and documented starting efficiencies.")


def check_config(data: dict[str, Any]) -> dict[str, Any]:
    c = Checker(data, "calibration", _KNOWN)
    preds = []
    for i, p in enumerate(c.list("predictions", lambda where, v: v, [], nonempty=False)):
        pc = Checker(p, f"calibration.predictions[{i}]", ("model", "nodes", "table_fraction", "params_fraction"))
        preds.append({"model": pc.choice("model", ("model-a", "model-f", "model-i")), "nodes": pc.int("nodes", None, 1),
                      "table_fraction": pc.num("table_fraction", 1.0, 0, 1.0),
                      "params_fraction": pc.num("params_fraction", 1.0, 0, 1.0)})
    params = c.list("parameters", item_choice(PARAMETERS))
    if len(set(params)) != len(params):
        raise ValueError("calibration.parameters: expected each parameter once")
    return {
        "model": c.choice("model", ("model-a", "model-f", "model-i"), "model-a"),
        "nodes": c.int("nodes", 16, 1),
        "reference_nodes": c.int("reference_nodes", 16, 1),
        "table_fraction": c.num("table_fraction", 1.0, 0, 1.0),
        "target_samples_per_s": c.num("target_samples_per_s", 1.2e6, 0),
        "system": c.choice("system", ("zionex",), "zionex"),
        "parameters": params,
        "tolerance": c.num("tolerance", 0.02, 0, 1.0),
        "max_evaluations": c.int("max_evaluations", 4, 1),
        "iterations": c.int("iterations", 1, 1),
        "warmup": c.int("warmup", 1, 0),
        "flag_move": c.num("flag_move", 0.30, 0, 10.0),
        "sensitivity_step": c.num("sensitivity_step", 0.10, 0, 1.0),
        "neo_settings": c.bool("neo_settings", True),
        **planner_fields(c, data),
        "predictions": preds,
    }


def _start(config) -> dict[str, float]:
    from neonic.host.systems import resolve_system

    eff = resolve_system(config["system"]).gpu_spec.efficiency
    return {p: float(getattr(eff, p)) for p in config["parameters"]}


def _efficiencies(config, factor: float) -> dict[str, float]:
    return {p: min(1.0, v * factor) for p, v in _start(config).items()}


def _max_factor(config) -> float:
    return 1.0 / max(_start(config).values())


def _run(config, model: str, nodes: int, table_fraction: float, params_fraction: float, eff: dict[str, float],
         plan: Any = None) -> tuple[float, Any]:
    """``(samples/s, the plan run)``: the scenario planned by its planner, or run on ``plan``."""
    from neonic.host.cluster import ClusterRun
    from neonic.host.experiments.ablation import NEO_SETTINGS

    workload = scaled_workload(model, nodes / config["reference_nodes"], table_fraction, params_fraction)
    system = {"preset": config["system"], "gpu_efficiency": eff}
    planner = planner_table(config)
    if config["neo_settings"]:
        workload["table_dtype"] = NEO_SETTINGS["table_dtype"]
        planner = planner_table(config, NEO_SETTINGS["planner"])
    data = scenario_data(f"calibration-{model}", workload, system, nodes, iterations=config["iterations"],
                         warmup=config["warmup"], planner=planner)
    if config["neo_settings"]:
        data["comm_precision"] = {k: NEO_SETTINGS[k] for k in ("forward", "backward", "allreduce")}
    runs: list[Any] = []

    def make(scenario: Any) -> Any:
        runs.append(ClusterRun(scenario, plan=plan))
        return runs[-1]

    return scenario_figures(run_scenario(data, make))["samples_per_s"], runs[-1].plan


def _label(p: dict[str, Any]) -> str:
    return f"{p['model']} samples/s on {p['nodes']} nodes" + (
        f" ({p['params_fraction']:g} of its parameters)" if p["params_fraction"] < 1 else "") + (
        f" ({p['table_fraction']:g} of its tables)" if p["table_fraction"] < 1 else "")


def run(config: dict[str, Any], progress: Callable[[str], None]) -> ExperimentResult:
    timer = Timer()
    target = config["target_samples_per_s"]
    start = _start(config)
    cap = _max_factor(config)
    rows: list[dict[str, Any]] = []
    history: list[tuple[float, float]] = []  # (factor, samples/s)

    # the fit holds one plan: Neo's, made from the sourced starting values (the first
    # evaluation). A plan re-made at every factor would make the figure jump between plans and
    # the secant steps with it; the fitted factor is the hardware's, under the plan Neo made
    fit_plan: list[Any] = []

    def target_run(factor: float) -> float:
        sps, plan = _run(config, config["model"], config["nodes"], config["table_fraction"], 1.0,
                         _efficiencies(config, factor), fit_plan[0] if fit_plan else None)
        fit_plan[:] = [plan]
        return sps

    factor = 1.0
    flat = False
    max_step = 2.0
    for k in range(config["max_evaluations"]):
        progress(f"calibration: evaluation {k + 1}, factor {factor:.4f}")
        sps = target_run(factor)
        history.append((factor, sps))
        rows.append({"figure": f"{config['model']} samples/s on {config['nodes']} nodes (fit evaluation {k + 1})"
                     + (" = the pre-fit figure (sourced starting values)" if k == 0 else ""),
                     "kind": "fit", "value": sps, "factor": factor,
                     **{f"eff_{p}": v for p, v in _efficiencies(config, factor).items()}})
        progress(f"calibration: factor {factor:.4f}: {sps:,.0f} samples/s (target {target:,.0f})")
        if abs(sps / target - 1) <= config["tolerance"]:
            break
        alpha = 1.0
        if len(history) >= 2:
            (f0, s0), (f1, s1) = history[-2], history[-1]
            alpha = math.log(s1 / s0) / math.log(f1 / f0) if f0 != f1 and s0 > 0 and s1 > 0 else 0.0
            if alpha < 0.02:  # the figure does not respond to the factor: nothing to fit with it
                flat = True
                break
            alpha = min(2.0, alpha)
        # one step at most x/÷ max_step, within the parameters' range
        ratio = min(max((target / sps) ** (1 / alpha), 1 / max_step), max_step)
        new = min(cap, factor * ratio)
        if new == factor:  # at the bound: the target is out of reach of this parameter
            break
        factor = new
    best_factor, best_sps = min(history, key=lambda h: abs(h[1] / target - 1))
    fitted = _efficiencies(config, best_factor)
    rows.append({"figure": f"{config['model']} samples/s on {config['nodes']} nodes (published target)", "kind": "published",
                 "value": target})
    params_report: dict[str, Any] = {}
    for p, v in fitted.items():
        move = v / start[p] - 1
        flagged = abs(move) > config["flag_move"]
        params_report[p] = {"start": start[p], "fitted": v, "move": move, "flagged": flagged}
        rows.append({"figure": f"GPUEfficiency.{p}", "kind": "fitted parameter", "value": v, "start": start[p],
                     "move": move, "flagged": flagged, "factor": best_factor})
    # predictions with the fitted parameters, and every figure's sensitivity to the fitted factor
    step = 1.0 + config["sensitivity_step"]
    probe = best_factor * step if best_factor * step <= cap else best_factor / step
    elasticity = lambda a, b: math.log(b / a) / math.log(probe / best_factor) if a > 0 and b > 0 else float("nan")  # noqa: E731
    progress(f"calibration: sensitivity of the target to the factor (x{probe / best_factor:.3f})")
    target_probe = target_run(probe)
    sensitivity: dict[str, float] = {f"{config['model']} (calibration target)": elasticity(best_sps, target_probe)}
    predictions: dict[str, float] = {}
    by_model: dict[str, float] = {config["model"]: best_sps}
    for p in config["predictions"]:
        label = _label(p)
        progress(f"calibration: predicting {label}")
        # planned with the fitted values; the sensitivity holds that plan (a partial derivative)
        value, plan = _run(config, p["model"], p["nodes"], p["table_fraction"], p["params_fraction"], fitted)
        moved, _ = _run(config, p["model"], p["nodes"], p["table_fraction"], p["params_fraction"],
                        _efficiencies(config, probe), plan)
        predictions[label] = value
        sensitivity[label] = elasticity(value, moved)
        by_model.setdefault(p["model"], value)
        rows.append({"figure": label, "kind": "prediction", "value": value, "factor": best_factor,
                     "sensitivity": sensitivity[label]})
    for label, e in sensitivity.items():
        rows.append({"figure": f"sensitivity of {label} to the fitted factor (d ln figure / d ln factor)",
                     "kind": "sensitivity", "value": e, "parameters": "+".join(config["parameters"])})
    converged = abs(best_sps / target - 1) <= config["tolerance"]
    metrics = {
        "target_samples_per_s": target,
        "pre_fit_samples_per_s": history[0][1],
        "fitted_samples_per_s": best_sps,
        "relative_difference": best_sps / target - 1,
        "factor": best_factor,
        "fitted_parameters": fitted,
        "parameters": params_report,
        "any_flagged": any(v["flagged"] for v in params_report.values()),
        "evaluations": len(history),
        "converged": converged,
        "target_responds": not flat,
        "predictions": predictions,
        "samples_per_s_by_model": by_model,
        "sensitivity": sensitivity,
        "gpu_measurements": {"measured": False, "note": GPU_NOTE},
    }
    notes = [f"Fitted on one published figure only: {config['model']} at {target:,.0f} samples/s on {config['nodes']} "
             f"nodes, by one common factor over {', '.join(config['parameters'])} (starting values: sim/gpu.py, sourced).",
             f"Pre-fit figure (starting values): {history[0][1]:,.0f} samples/s; fitted: {best_sps:,.0f} at factor "
             f"{best_factor:.4f}" + ("" if converged else " (NOT converged: the target is out of this parameter's reach)") + ".",
             *[f"{p}: start {v['start']:.4g} -> fitted {v['fitted']:.4g} ({v['move'] * 100:+.1f}%)"
               + (f"  FLAGGED: moved more than {config['flag_move'] * 100:.0f}%" if v["flagged"] else "")
               for p, v in params_report.items()],
             "Sensitivity: d ln figure / d ln factor; near 0 means the fit can neither fix nor break that figure.",
             "Every row of kind 'prediction' (and every other experiment's figure) is a prediction."
             + (" Runs use Neo's post-optimization settings (host.experiments.ablation.NEO_SETTINGS)."
                if config["neo_settings"] else ""),
             GPU_NOTE]
    res = ExperimentResult("calibration", TITLE, config, rows, metrics, notes, wall_s=timer.elapsed)
    res.plots = {"fit.png": lambda f: _plot(f, history, target)}
    return res


def _plot(fig, history, target) -> None:
    ax = fig.add_subplot(111)
    ax.plot([h[0] for h in history], [h[1] for h in history], marker="o", label="simulated")
    ax.axhline(target, color="k", linestyle="--", label="published target")
    ax.axvline(1.0, color="grey", linestyle=":", label="sourced starting values")
    ax.set_xlabel("efficiency factor (x starting values)")
    ax.set_ylabel("samples/s")
    ax.set_title("calibration evaluations")
    ax.legend()
