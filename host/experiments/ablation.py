"""Neo's throughput-optimization ladder: its optimizations applied one after another.

Neo (Mudigere et al., ISCA 2022; REFERENCES.md) reached its published Model-A throughput after
a sequence of optimizations, in this order: optimized sharding (load balance), reduced-precision
embeddings, quantized communications (smaller AlltoAll volume) and larger batch sizes. Each is a
scenario switch here:

``planner``        the sharding: a simple baseline (``size-greedy``: tables by size onto the
                   emptiest GPU, table-wise) or Neo's planner (``neo``);
``table_dtype``    the embedding tables in fp32 or fp16 (the row-wise AdaGrad state stays FP32);
``forward`` / ``backward`` / ``allreduce``
                   wire precision of the pooled AlltoAll, the gradient AlltoAll, the dense
                   AllReduce (fp32 | fp16 | bf16; ``[comm_precision]`` of the scenario);
``batch_per_gpu``  the local batch.

The experiment starts from ``baseline`` and applies each step's changes on top of the previous
ones (cumulative, as the paper's study), running the model on ``nodes`` ZionEX nodes after each
step. Every figure is a prediction; REFERENCES.md publishes the order of the steps and the final
throughput of Model-A, not the throughput after each step.

:data:`NEO_SETTINGS` is the post-optimization configuration the published comparisons use
(``neonic validate``'s ``qps.*`` keys, the ``model-a-128`` scenario), each setting with its source
or marked ASSUMPTION in :data:`NEO_SETTINGS_SOURCES`.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from neonic.host.experiments._common import (
    PLANNER_FIELDS,
    Checker,
    ExperimentResult,
    Timer,
    planner_fields,
    planner_table,
    run_scenario,
    scaled_workload,
    scenario_data,
    scenario_figures,
)

TITLE = "Neo's optimizations one after another (Model-A, 16 ZionEX nodes)"
PRECISIONS = ("fp32", "fp16", "bf16")
SWITCHES = ("planner", "table_dtype", "forward", "backward", "allreduce", "batch_per_gpu")
_KNOWN = ("model", "nodes", "reference_nodes", "table_fraction", "system", "iterations", "warmup", "baseline", "steps",
          *PLANNER_FIELDS)

#: Neo's post-optimization settings, used wherever our figures are compared with published ones.
NEO_SETTINGS: dict[str, Any] = {
    "planner": "neo",
    "table_dtype": "fp16",
    "forward": "fp16",
    "backward": "bf16",
    "allreduce": "fp32",
}
NEO_SETTINGS_SOURCES: dict[str, str] = {
    "planner": "Neo: optimized sharding (its planner) is the first optimization (REFERENCES.md)",
    "table_dtype": "Neo: reduced-precision (FP16) embeddings, FP16 tables with FP32 optimizer state (REFERENCES.md); "
                   "ASSUMPTION: applied to every model (the paper names FP16 tables explicitly only for Model-F)",
    "forward": "Neo: quantized (FP16/BF16) communication of the AlltoAlls (REFERENCES.md); ASSUMPTION: FP16 forward",
    "backward": "Neo: quantized (FP16/BF16) communication of the AlltoAlls (REFERENCES.md); ASSUMPTION: BF16 for "
                "gradients (its wider exponent range)",
    "allreduce": "ASSUMPTION: FP32: Neo's quantized-communication step names the AlltoAll volume, not the AllReduce",
    "batch_per_gpu": "Neo Table 3: the local batch of each model (512, 512, 2048), the preset's value",
}


def neo_scenario_parts(model: str, settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The scenario tables (``workload`` switches, ``comm_precision``, planner name) of
    ``settings`` (default :data:`NEO_SETTINGS`) for preset ``model``."""
    s = dict(NEO_SETTINGS if settings is None else settings)
    workload: dict[str, Any] = {"preset": model}
    if "table_dtype" in s:
        workload["table_dtype"] = s["table_dtype"]
    if "batch_per_gpu" in s:
        workload["batch_per_gpu"] = s["batch_per_gpu"]
    return {"workload": workload, "comm_precision": {k: s[k] for k in ("forward", "backward", "allreduce") if k in s},
            "planner": s.get("planner", "neo")}


def _switches(where: str, data: Any, required: bool) -> dict[str, Any]:
    c = Checker(data, where, SWITCHES)
    out: dict[str, Any] = {}
    from neonic.host.planner.api import check_planner_name

    for key in SWITCHES:
        if key not in data:
            if required:
                raise ValueError(f"{where}.{key}: required field missing")
            continue
        if key == "planner":
            out[key] = check_planner_name(data[key], f"{where}.planner")
        elif key == "batch_per_gpu":
            out[key] = c.int(key, None, 1)
        elif key == "table_dtype":
            out[key] = c.choice(key, ("fp32", "fp16"))
        else:
            out[key] = c.choice(key, PRECISIONS)
    return out


def check_config(data: dict[str, Any]) -> dict[str, Any]:
    c = Checker(data, "ablation", _KNOWN)
    steps = []
    for i, step in enumerate(c.list("steps", lambda where, v: v)):
        where = f"ablation.steps[{i}]"
        if not isinstance(step, Mapping):
            raise ValueError(f"{where}: expected a table, got {step!r}")
        sc = Checker(step, where, ("name", "source", *SWITCHES))
        changes = _switches(where, {k: v for k, v in step.items() if k not in ("name", "source")}, required=False)
        if not changes:
            raise ValueError(f"{where}: expected at least one switch to change ({', '.join(SWITCHES)})")
        steps.append({"name": sc.str("name"), "source": sc.str("source", "ASSUMPTION"), "changes": changes})
    names = [s["name"] for s in steps]
    if len(set(names)) != len(names) or "baseline" in names:
        raise ValueError("ablation.steps: expected unique step names other than 'baseline'")
    return {
        "model": c.choice("model", ("model-a", "model-f", "model-i"), "model-a"),
        "nodes": c.int("nodes", 16, 1),
        "reference_nodes": c.int("reference_nodes", 16, 1),
        "table_fraction": c.num("table_fraction", 1.0, 0, 1.0),
        "system": c.choice("system", ("zionex",), "zionex"),
        "iterations": c.int("iterations", 1, 1),
        "warmup": c.int("warmup", 1, 0),
        "baseline": _switches("ablation.baseline", c.table("baseline"), required=True),
        "steps": steps,
        **planner_fields(c, data),
    }


def run_settings(config: Mapping[str, Any], settings: Mapping[str, Any], name: str,
                 system: Any = None, run_cls: Any = None):
    """One run of ``config``'s model with the switch ``settings``; returns the ``RunResult``."""
    workload = scaled_workload(config["model"], config["nodes"] / config["reference_nodes"], config["table_fraction"],
                               batch_per_gpu=settings.get("batch_per_gpu"))
    workload["table_dtype"] = settings["table_dtype"]
    data = scenario_data(name, workload, system or config["system"], config["nodes"], iterations=config["iterations"],
                         warmup=config["warmup"], planner=planner_table(config, settings["planner"]))
    data["comm_precision"] = {k: settings[k] for k in ("forward", "backward", "allreduce")}
    return run_scenario(data, run_cls)


def run(config: dict[str, Any], progress: Callable[[str], None]) -> ExperimentResult:
    timer = Timer()
    rows: list[dict[str, Any]] = []
    settings = dict(config["baseline"])
    ladder = [{"name": "baseline", "source": "the starting point", "changes": {}}, *config["steps"]]
    for step in ladder:
        settings.update(step["changes"])
        progress(f"ablation: {step['name']} ({', '.join(f'{k}={v}' for k, v in settings.items())})")
        result = run_settings(config, settings, f"ablation-{step['name']}")
        fig = scenario_figures(result)
        row = {"step": step["name"], **settings, "samples_per_s": fig["samples_per_s"], "iteration_ms": fig["iteration_ms"],
               "exposed_comm_ms": fig["exposed_comm_ms"], "exposed_compute_ms": fig["exposed_compute_ms"],
               "source": step["source"]}
        if rows:
            row["speedup_over_previous"] = fig["samples_per_s"] / rows[-1]["samples_per_s"]
        row["speedup_over_baseline"] = fig["samples_per_s"] / (rows[0]["samples_per_s"] if rows else fig["samples_per_s"])
        rows.append(row)
        progress(f"ablation: {step['name']}: {fig['samples_per_s']:,.0f} samples/s")
    metrics = {r["step"]: {"samples_per_s": r["samples_per_s"], "speedup_over_baseline": r["speedup_over_baseline"]}
               for r in rows}
    notes = [
        "Every figure is a prediction: REFERENCES.md publishes the order of Neo's optimizations and Model-A's final "
        "throughput, not the throughput after each step.",
        f"Model: {config['model']} on {config['nodes']} nodes ({config['table_fraction']:g} of its tables); each step "
        "keeps the previous steps' settings.",
        *[f"step {s['name']}: {', '.join(f'{k}={v}' for k, v in s['changes'].items())} ({s['source']})" for s in config["steps"]],
        f"baseline: {', '.join(f'{k}={v}' for k, v in config['baseline'].items())}",
    ]
    res = ExperimentResult("ablation", TITLE, config, rows, metrics, notes, wall_s=timer.elapsed)
    res.plots = {"ladder.png": lambda f: _plot(f, rows, config)}
    return res


def _plot(fig, rows, config) -> None:
    ax = fig.add_subplot(111)
    names = [r["step"] for r in rows]
    values = [r["samples_per_s"] / 1e6 for r in rows]
    bars = ax.bar(range(len(rows)), values, color="#4c72b0")
    for bar, r in zip(bars, rows):
        ax.annotate(f"{r['speedup_over_baseline']:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(rows)), names, rotation=20, fontsize=8)
    ax.set_ylabel("samples/s (millions)")
    ax.set_title(f"{config['model']} on {config['nodes']} x 8 GPUs: Neo's optimizations, cumulative")
