"""``neonic validate``: our figures beside the published ones.

Runs every experiment of :mod:`host.experiments` at its ``validate`` size (``--quick``: its
``tiny`` size, a smoke run whose figures are not comparable with the papers') and sets each
headline figure beside the published one where shared/REFERENCES.md publishes it, with the
relative difference ``ours / published - 1``. Figures REFERENCES.md does not publish are listed
as "not published". Every row says what kind of figure it is:

``calibration target``  fitted to the published figure (agreement is by construction; the
                        residual and the pre-fit figure are shown)
``model arithmetic``    a published arithmetic fact recomputed by our models
``prediction``          everything else

Scale: the ``validate`` sizes are the published scale where it runs in under ten minutes on 2
cores (Model-A calibration on 16 nodes x 8 GPUs with the full 1000 tables and 793B
parameters; weak scaling 1..16 nodes with every table of each model's share) and smaller
where it does not (each experiment's ``sizes.validate`` table says which; the report lists the
scale and the wall time of each experiment).

Writes ``validation.md``, ``validation.csv``, ``validation.json`` and one folder per experiment
(its table, plots and metrics) under the output folder.

Stable keys: every row carries a ``key``. The headline figures are registered in :data:`KEYS`
(one :func:`register_key` line each: the key, the experiment it comes from, how to read it from
the experiment's result, its unit and kind, and the published figure it is compared with);
``neonic validate --json`` prints ``{key: figure}`` as its last line. Registered keys::

    qps.model-a (the calibration point), qps.model-f, qps.model-i      samples/s on 16 x 8 GPUs,
                                                                       Neo's post-optimization settings
    weak_scaling_efficiency.model-a, .model-i                          per-GPU throughput, 16 vs 1 node
    zionex_over_zion                                                   Model-A throughput ratio, 16 nodes
    fused_embedding_speedup                                            fused vs unfused kernels
    dense_mflops_per_sample.model-a, -f, -i                            forward MFLOP per sample
    ablation.<step>                                                    samples/s after each ladder step

Other rows get keys ``<experiment>.<what>`` derived from their figure.
"""

from __future__ import annotations

import csv
import json
import time
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from neonic.host.experiments import VALIDATED, ExperimentResult, ExperimentUnavailable, run_experiment

__all__ = ["Published", "PUBLISHED", "ValidationRow", "validate", "published_rows", "KeyEntry", "KEYS", "register_key",
           "summary_json"]


@dataclass(frozen=True)
class Published:
    """A figure shared/REFERENCES.md publishes."""

    key: str
    figure: str
    value: float
    unit: str
    source: str


#: Every published figure we compare with (all in shared/REFERENCES.md; nothing else is).
PUBLISHED: dict[str, Published] = {p.key: p for p in (
    Published("model_a_128gpu_samples_per_s", "Model-A training throughput, 16 ZionEX nodes x 8 A100", 1.2e6, "samples/s",
              "Neo, Mudigere et al., ISCA 2022 (REFERENCES.md)"),
    Published("roce_goodput_4096", "RoCEv2 goodput of a full 4096 B packet (4096 + 82 B on the wire)", 4096 / (4096 + 82), "fraction",
              "RoCEv2 framing, REFERENCES.md ('about 98% goodput')"),
    Published("model_f_fp16_table_bytes", "Model-F embedding tables in FP16", 24e12, "bytes",
              "Neo, Mudigere et al., ISCA 2022 (REFERENCES.md: 96 TB -> 24 TB with FP16)"),
    Published("model_a_mflops", "Model-A forward MFLOP per sample", 638, "MFLOP", "Neo Table 3 (REFERENCES.md)"),
    Published("model_f_mflops", "Model-F forward MFLOP per sample", 5, "MFLOP", "Neo Table 3 (REFERENCES.md)"),
    Published("model_i_mflops", "Model-I forward MFLOP per sample", 60, "MFLOP", "Neo Table 3 (REFERENCES.md)"),
    Published("fused_embedding_speedup", "Fused embedding kernels over unfused (published: 'up to')", 7.0, "x",
              "Neo, Mudigere et al., ISCA 2022 (REFERENCES.md: up to 7x over unfused)"),
)}


# ------------------------------------------------------------------------------ stable keys
@dataclass(frozen=True)
class KeyEntry:
    """A headline figure of ``neonic validate``: ``value(result)`` reads it from experiment
    ``experiment``'s result (``None``: computed without an experiment, from ``value(None)``); a
    dict return value makes one key per entry, ``<key>.<entry>``."""

    key: str
    experiment: str | None
    figure: str
    unit: str
    value: Callable[[Any], Any]
    kind: str = "prediction"
    published: str | None = None
    note: str = ""


#: Registered keys, in report order (see the module doc).
KEYS: dict[str, KeyEntry] = {}


def register_key(key: str, experiment: str | None, figure: str, unit: str, value: Callable[[Any], Any],
                 kind: str = "prediction", published: str | None = None, note: str = "") -> KeyEntry:
    """Register a headline figure (one line per key; other issues add theirs the same way)."""
    if not re.fullmatch(r"[a-z0-9_]+([.-][a-z0-9_]+)*", key):
        raise ValueError(f"key: expected lower-case words joined by '.', '-' or '_', got {key!r}")
    if key in KEYS:
        raise ValueError(f"key: {key!r} is registered already")
    entry = KeyEntry(key, experiment, figure, unit, value, kind, published, note)
    KEYS[key] = entry
    return entry


def _dense_mflops(model: str) -> float:
    from neonic.host.workloads import preset
    from neonic.host.workloads.dense import dense_flops_per_sample

    return dense_flops_per_sample(preset(model))["total"] / 1e6


def _by_model(model: str) -> Callable[[Any], Any]:
    return lambda r: r.metrics["samples_per_s_by_model"].get(model)


def _weak(model: str) -> Callable[[Any], Any]:
    def read(r: Any) -> Any:
        m = r.metrics.get(model)
        return None if m is None else m["scaling_efficiency_at_max_nodes"]
    return read


register_key("qps.model-a", "calibration", "Model-A samples/s on 16 x 8 GPUs (the calibration point, fitted)", "samples/s",
             _by_model("model-a"), kind="calibration target", published="model_a_128gpu_samples_per_s",
             note="Neo's post-optimization settings")
register_key("qps.model-f", "calibration", "Model-F samples/s on 16 x 8 GPUs (12T parameters, FP16 tables in host DRAM behind the HBM cache)",
             "samples/s", _by_model("model-f"), note="Neo's post-optimization settings")
register_key("qps.model-i", "calibration", "Model-I samples/s on 16 x 8 GPUs", "samples/s", _by_model("model-i"),
             note="Neo's post-optimization settings")
register_key("weak_scaling_efficiency.model-a", "weak_scaling", "Model-A per-GPU throughput, 16 nodes vs 1 node", "fraction",
             _weak("model-a"), note="the weak-scaling experiment's settings (workload and system presets)")
register_key("weak_scaling_efficiency.model-i", "weak_scaling", "Model-I per-GPU throughput, 16 nodes vs 1 node", "fraction",
             _weak("model-i"), note="the weak-scaling experiment's settings (workload and system presets)")
register_key("zionex_over_zion", "zion_vs_zionex", "Model-A throughput, ZionEX over Zion, 16 nodes", "x",
             lambda r: r.metrics.get("zionex_speedup_over_zion"),
             note="the experiment's settings (workload and system presets)")
register_key("fused_embedding_speedup", "fused_embedding", "Fused over unfused embedding kernels, Model-A's tables (slowest GPU)",
             "x", lambda r: r.metrics["speedup"], published="fused_embedding_speedup",
             note="published as 'up to 7x'")
register_key("fused_embedding.unfused_launch_share", "fused_embedding",
             "Share of the slowest GPU's unfused embedding time spent in kernel launches (Model-A's tables)", "fraction",
             lambda r: r.metrics.get("unfused_launch_share_slowest_gpu"),
             note="small: Model-A's shards each see the global batch, so fusion gains by traffic, not launches")
register_key("dense_mflops_per_sample.model-a", None, "Model-A dense forward MFLOP per sample (MLPs + interaction)", "MFLOP",
             lambda r: _dense_mflops("model-a"), kind="model arithmetic", published="model_a_mflops")
register_key("dense_mflops_per_sample.model-f", None, "Model-F dense forward MFLOP per sample (MLPs + interaction)", "MFLOP",
             lambda r: _dense_mflops("model-f"), kind="model arithmetic", published="model_f_mflops")
register_key("dense_mflops_per_sample.model-i", None, "Model-I dense forward MFLOP per sample (MLPs + interaction)", "MFLOP",
             lambda r: _dense_mflops("model-i"), kind="model arithmetic", published="model_i_mflops")
register_key("ablation", "ablation", "Model-A samples/s on 16 x 8 GPUs after ladder step", "samples/s",
             lambda r: {step: m["samples_per_s"] for step, m in r.metrics.items()})


def _c3(key: str) -> Callable[[Any], Any]:
    def read(r: Any) -> Any:
        from neonic.host.experiments.c3 import validate_keys

        return validate_keys(r)[key]
    return read


register_key("c3.plain", "c3", "C3: realized / ideal overlap speedup, plain concurrency (mean over pairs)", "fraction",
             _c3("c3.plain"))
register_key("c3.priority_partitioning", "c3", "C3: realized / ideal overlap speedup, stream priority + SM partitioning",
             "fraction", _c3("c3.priority_partitioning"))
register_key("c3.dma", "c3", "C3: realized / ideal overlap speedup, collectives on the copy engines", "fraction",
             _c3("c3.dma"))
register_key("c3.dma_max_speedup", "c3", "C3: largest speedup of DMA-offloaded overlap over running in turn", "x",
             _c3("c3.dma_max_speedup"))


def _smartnic(r: Any) -> dict[str, float]:
    """SmartNIC over the plain RDMA NIC: unloaded inference latency (plain / SmartNIC) and
    training throughput (SmartNIC / plain), all mechanisms on and each alone."""
    from neonic.host.experiments.smartnic import validate_keys

    return validate_keys(r)


register_key("smartnic", "smartnic", "SmartNIC vs plain RDMA NIC (> 1: the SmartNIC is better):", "x", _smartnic)


def _key_rows(entry: KeyEntry, result: Any, comparable: bool) -> list["ValidationRow"]:
    try:
        value = entry.value(result)
    except (KeyError, TypeError, AttributeError) as error:
        return [ValidationRow(entry.experiment or "model", entry.figure, None, entry.unit, entry.kind,
                              note=f"not available: {error!r}", key=entry.key)]
    pub = PUBLISHED.get(entry.published) if entry.published else None
    use_pub = pub is not None and (comparable or entry.experiment is None)
    items = value.items() if isinstance(value, Mapping) else [(None, value)]
    rows = []
    for suffix, v in items:
        rows.append(ValidationRow(
            entry.experiment or "model", entry.figure + (f" {suffix}" if suffix else ""),
            None if v is None else float(v), entry.unit, entry.kind, pub.value if use_pub else None,
            pub.source if use_pub else "not published", entry.note,
            key=entry.key + (f".{suffix}" if suffix else "")))
    return rows


@dataclass
class ValidationRow:
    experiment: str
    figure: str
    ours: float | None
    unit: str
    kind: str
    published: float | None = None
    source: str = "not published"
    note: str = ""
    key: str = ""

    def __post_init__(self) -> None:
        if not self.key:
            slug = re.sub(r"[^a-z0-9]+", "_", self.figure.lower()).strip("_")[:80]
            self.key = f"{self.experiment}.{slug}"

    @property
    def relative_difference(self) -> float | None:
        if self.ours is None or self.published is None or self.published == 0:
            return None
        return self.ours / self.published - 1

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "experiment": self.experiment, "figure": self.figure, "ours": self.ours, "published": self.published,
                "relative_difference": self.relative_difference, "unit": self.unit, "kind": self.kind,
                "source": self.source, "note": self.note}


def published_rows() -> list[ValidationRow]:
    """Published arithmetic facts recomputed by our models (fast; no experiment needed)."""
    from neonic.sim.network.transport import rdma_wire_bytes

    from neonic.host.workloads import preset

    p = PUBLISHED["roce_goodput_4096"]
    nbytes = 4096 * 1000  # a long message: full 4096 B packets
    goodput = nbytes / float(rdma_wire_bytes(nbytes, 4096))
    rows = [ValidationRow("network", p.figure, goodput, p.unit, "model arithmetic", p.value, p.source,
                          "sim.network.transport.rdma_wire_bytes over a 4 MB message (one RETH)",
                          key="network.roce_goodput_4096")]
    f = PUBLISHED["model_f_fp16_table_bytes"]
    wl = preset("model-f")
    rows.append(ValidationRow("workloads", f.figure, float(sum(t.nbytes for t in wl.tables)), f.unit, "model arithmetic",
                              f.value, f.source, "host.workloads preset model-f (weights only, no optimizer state)",
                              key="workloads.model_f_fp16_table_bytes"))
    for entry in KEYS.values():
        if entry.experiment is None:
            rows.extend(_key_rows(entry, None, True))
    return rows


def _experiment_rows(name: str, result: ExperimentResult, comparable: bool) -> list[ValidationRow]:
    m = result.metrics
    rows: list[ValidationRow] = []
    if name == "calibration":
        p = PUBLISHED["model_a_128gpu_samples_per_s"]
        at_scale = comparable and result.config["nodes"] == 16 and result.config["table_fraction"] == 1.0 \
            and result.config["target_samples_per_s"] == p.value
        pre = next((r["value"] for r in result.rows if r["kind"] == "fit"), None)
        note = "" if at_scale else (f"published {p.value:,.0f} {p.unit} on 128 GPUs; this run is not at that scale, "
                                    "so not comparable")
        src = p.source if at_scale else "not comparable"
        rows.append(ValidationRow(name, f"{p.figure}, sourced starting efficiencies (before the fit)", pre, p.unit,
                                  "prediction", p.value if at_scale else None, src,
                                  note or "independent of the target: the starting values are not fitted to it",
                                  key="calibration.pre_fit_samples_per_s"))
        rows.append(ValidationRow(name, f"{p.figure}, fitted (factor {m['factor']:.4f}, {m['evaluations']} evaluations"
                                  + ("" if m["converged"] else ", NOT converged") + ")",
                                  m["fitted_samples_per_s"], p.unit, "calibration target", p.value if at_scale else None,
                                  src, note or "agreement by construction: the fit's residual",
                                  key="calibration.fitted_samples_per_s"))
        rows.append(ValidationRow(name, "fitted factor over the starting values", m["factor"], "x", "calibration target",
                                  key="calibration.factor"))
        for param, v in m.get("parameters", {}).items():
            rows.append(ValidationRow(name, f"GPUEfficiency.{param}: fitted (start {v['start']:.4g}, {v['move'] * 100:+.1f}%)",
                                      v["fitted"], "fraction", "calibration target",
                                      note="FLAGGED: moved more than the allowed share" if v["flagged"] else "",
                                      key=f"calibration.parameter.{param}"))
        for i, (label, e) in enumerate(m.get("sensitivity", {}).items()):
            rows.append(ValidationRow(name, f"sensitivity of {label} to the fitted factor", e, "d ln / d ln", "prediction",
                                      key=f"calibration.sensitivity.{i}"))
        rows.append(ValidationRow(name, "GPU preset measured on a real GPU", None, "", "prediction",
                                  note=m["gpu_measurements"]["note"], key="calibration.gpu_measured"))
    elif name == "weak_scaling":
        for model, mm in m.items():
            rows.append(ValidationRow(name, f"{model}: samples/s on {mm['max_nodes']} nodes", mm["samples_per_s_at_max_nodes"],
                                      "samples/s", "prediction"))
            rows.append(ValidationRow(name, f"{model}: scaling efficiency at {mm['max_nodes']} nodes",
                                      mm["scaling_efficiency_at_max_nodes"], "fraction", "prediction"))
            rows.append(ValidationRow(name, f"{model}: exposed communication share at {mm['max_nodes']} nodes",
                                      mm["exposed_comm_share_at_max_nodes"], "fraction", "prediction"))
    elif name == "zion_vs_zionex":
        if "zionex_speedup_over_zion" in m:
            rows.append(ValidationRow(name, f"ZionEX speedup over Zion ({result.config['model']}, {result.config['nodes']} nodes)",
                                      m["zionex_speedup_over_zion"], "x", "prediction"))
    elif name == "c3":
        for lever, mm in m.items():
            rows.append(ValidationRow(name, f"mean fraction of ideal overlap, {lever}", mm["mean_fraction_of_ideal"], "fraction",
                                      "prediction"))
    elif name == "sharding":
        for model, mm in m.items():
            rows.append(ValidationRow(name, f"{model}: Neo's plan vs the best strategy (best: {mm['best_strategy']})",
                                      mm["neo_relative_to_best"], "fraction", "prediction"))
    elif name == "smartnic":
        for key, mm in m.items():
            if key.startswith("rdma"):
                continue
            if "throughput_vs_rdma" in mm:
                rows.append(ValidationRow(name, f"{key}: throughput vs plain RDMA NIC", mm["throughput_vs_rdma"], "x", "prediction"))
            if "latency_vs_rdma" in mm:
                rows.append(ValidationRow(name, f"{key}: latency per query batch vs plain RDMA NIC", mm["latency_vs_rdma"], "x",
                                          "prediction"))
    elif name == "smartnic_map":
        for key, mm in m.items():
            rows.append(ValidationRow(name, f"{key}: cells the SmartNIC wins (of {mm['cells']})", float(mm["wins"]),
                                      "cells", "prediction"))
            rows.append(ValidationRow(name, f"{key}: best speedup over the plain RDMA NIC", mm["best_speedup"], "x",
                                      "prediction"))
    elif name == "node_classes":
        for key, value in m.items():
            if not isinstance(value, float):
                continue
            model, what = key.split(".", 1)
            figure = (f"{model}: {what[:-len('_over_zionex')]} throughput over ZionEX at equal GPU count"
                      if what.endswith("_over_zionex") else f"{model}: {what.split('.')[0]} with SmartNIC on over off")
            rows.append(ValidationRow(name, figure, value, "x", "prediction", key=f"node_classes.{key}"))
    return rows


#: Submission order of ``validate(jobs > 1)``: the experiments that took the most CPU time at
#: their validate size when measured (the others take a fraction of any of these).
_LONGEST_FIRST = ("ablation", "sharding", "calibration", "weak_scaling", "smartnic")


def _progress_line(t0: float, name: str, message: str) -> None:
    """A worker's progress line on stderr (``--jobs`` > 1: experiments run side by side)."""
    import sys

    print(f"[{time.time() - t0:7.1f}s] [{name}] {message}", file=sys.stderr, flush=True)


def _run_one(name: str, out: Path, size: str, t0: float, plan_dir: Path) -> tuple[str, Any, float]:
    """Run one experiment in a worker process: ``(status, result or reason, wall_s)``. The
    result's plots and files are already written to its folder; only their names travel back."""
    from functools import partial

    from neonic.host.planner.cache import PlanCache, use_plan_cache

    start = time.perf_counter()
    try:
        with use_plan_cache(PlanCache(plan_dir)):
            result = run_experiment(name, out / name, size=size, progress=partial(_progress_line, t0, name))
    except ExperimentUnavailable as error:
        return "not run", str(error), time.perf_counter() - start
    # what is drawn or written is in the folder already: only the names travel back
    result.plots = {plot: None for plot in result.plots}
    result.files = {name: None for name in result.files}
    return "ok", result, time.perf_counter() - start


def validate(out: str | Path, quick: bool = False, experiments: tuple[str, ...] = VALIDATED,
             progress: Callable[[str], None] | None = None, jobs: int = 1,
             plan_dir: str | Path | None = None) -> dict[str, Any]:
    """Run the experiments and write the comparison (see the module doc); returns a summary.

    ``jobs`` > 1 runs that many experiments side by side in worker processes (each experiment
    is deterministic and independent of the others, so the figures are the same; only the wall
    time changes). The report lists the experiments in the order given either way. ``plan_dir``:
    where the runs keep their plans (``host.planner.cache``; default: ``plans/`` under the build
    directory)."""
    progress = progress or (lambda message: None)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs: expected an integer >= 1, got {jobs!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    size = "tiny" if quick else "validate"
    # experiments share plans: runs that differ only in what the planner does not read plan
    # once (host.planner.cache; the same plan the planner would return, keyed by its inputs)
    from neonic.host.planner.cache import PlanCache, default_plan_dir, use_plan_cache

    plan_dir = default_plan_dir() if plan_dir is None else Path(plan_dir)
    rows = published_rows()
    runs: list[dict[str, Any]] = []
    outcomes: dict[str, tuple[str, Any, float]] = {}
    if jobs > 1 and len(experiments) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        t0 = time.time()
        progress(f"experiments {', '.join(experiments)} ({size} size), {jobs} at a time")
        with ProcessPoolExecutor(min(jobs, len(experiments)), mp_context=multiprocessing.get_context("fork")) as pool:
            # the longest first, so that the workers finish close together
            ranked = sorted(experiments, key=lambda n: _LONGEST_FIRST.index(n) if n in _LONGEST_FIRST else len(_LONGEST_FIRST))
            futures = {name: pool.submit(_run_one, name, out, size, t0, plan_dir) for name in ranked}
            for name in experiments:
                future = futures[name]
                outcomes[name] = future.result()
                progress(f"experiment {name}: {outcomes[name][0]} in {outcomes[name][2]:.1f} s")
    for name in experiments:
        if name in outcomes:
            status, value, wall = outcomes[name]
        else:
            progress(f"experiment {name} ({size} size)")
            t0 = time.perf_counter()
            try:
                with use_plan_cache(PlanCache(plan_dir)):
                    status, value = "ok", run_experiment(name, out / name, size=size, progress=progress)
            except ExperimentUnavailable as error:
                status, value = "not run", str(error)
            wall = time.perf_counter() - t0
        if status != "ok":
            runs.append({"experiment": name, "status": "not run", "reason": value, "wall_s": wall})
            rows.append(ValidationRow(name, "every figure", None, "", "prediction", note=f"not run: {value}"))
            for entry in KEYS.values():
                if entry.experiment == name:
                    rows.append(ValidationRow(name, entry.figure, None, entry.unit, entry.kind, note=f"not run: {value}",
                                              key=entry.key))
            progress(f"experiment {name}: not run: {value}")
            continue
        result = value
        runs.append({"experiment": name, "status": "ok", "wall_s": wall, "title": result.title, "scale": _scale(result),
                     "plots": sorted(result.plots), "notes": result.notes})
        rows.extend(_experiment_rows(name, result, comparable=not quick))
        for entry in KEYS.values():
            if entry.experiment == name:
                rows.extend(_key_rows(entry, result, comparable=not quick))
        if name not in outcomes:
            progress(f"experiment {name}: done in {wall:.1f} s")
    _unique_keys(rows)
    _write(out, rows, runs, quick)
    return {"rows": [r.as_dict() for r in rows], "runs": runs, "size": size, "figures": summary_json(rows)}


def _unique_keys(rows: list[ValidationRow]) -> None:
    """Make every row's key unique (a repeated derived key gets ``.2``, ``.3``, ...)."""
    seen: dict[str, int] = {}
    for r in rows:
        n = seen.get(r.key, 0) + 1
        seen[r.key] = n
        if n > 1:
            r.key = f"{r.key}.{n}"


def summary_json(rows: list[ValidationRow]) -> dict[str, float | None]:
    """``{key: our figure}`` for every row (the ``--json`` line)."""
    return {r.key: r.ours for r in rows}


def _scale(result: ExperimentResult) -> str:
    c = result.config
    parts = []
    for key in ("models", "model", "nodes", "table_fraction", "sizes_mib"):
        if key in c:
            parts.append(f"{key}={c[key]}")
    text = ", ".join(parts)
    nodes = c.get("nodes")
    if isinstance(nodes, int) and nodes < 16:
        text += " (below Neo's 16-node evaluation scale, to stay within minutes on 2 cores)"
    return text


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "n/a"
    if unit == "bytes":
        return f"{value / 1e12:.3g} TB"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def _write(out: Path, rows: list[ValidationRow], runs: list[dict[str, Any]], quick: bool) -> None:
    with (out / "validation.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0].as_dict()))
        writer.writeheader()
        for r in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in r.as_dict().items()})
    lines = ["# neonic validate: ours vs published", ""]
    if quick:
        lines += ["**Quick run (`--quick`): every experiment at its tiny size. The experiments' figures are not comparable "
                  "with the published ones; only the model-arithmetic rows are.**", ""]
    lines += ["Published figures are those in shared/REFERENCES.md; every other figure is marked \"not published\". "
              "Kinds: *calibration target* (fitted to the published figure), *model arithmetic*, *prediction*.", "",
              "| experiment | figure | ours | published | relative difference | kind | source / note |",
              "| --- | --- | ---: | ---: | ---: | --- | --- |"]
    for r in rows:
        rel = r.relative_difference
        src = r.source + (f"; {r.note}" if r.note else "")
        lines.append(f"| {r.experiment} | {r.figure} | {_fmt(r.ours, r.unit)} | "
                     f"{_fmt(r.published, r.unit) if r.published is not None else 'not published'} | "
                     f"{'' if rel is None else f'{rel * 100:+.1f}%'} | {r.kind} | {src} |")
    lines += ["", "## Experiments", ""]
    for run in runs:
        if run["status"] != "ok":
            lines.append(f"- **{run['experiment']}**: not run: {run['reason']}")
            continue
        lines.append(f"- **{run['experiment']}** ({run['title']}): {run['scale']}; {run['wall_s']:.1f} s wall. "
                     f"Folder `{run['experiment']}/`.")
        for plot in run["plots"]:
            lines.append(f"  ![{run['experiment']} {plot}]({run['experiment']}/{plot})")
        for note in run["notes"]:
            lines.append(f"  - {note}")
    (out / "validation.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (out / "validation.json").write_text(json.dumps({"runs": runs, "rows": [r.as_dict() for r in rows]}, indent=2,
                                                    default=str) + "\n", encoding="utf-8")
