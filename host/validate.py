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

Writes ``validation.md``, ``validation.csv`` and one folder per experiment (its table, plots
and metrics) under the output folder.
"""

from __future__ import annotations

import csv
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from neonic.host.experiments import EXPERIMENTS, ExperimentResult, ExperimentUnavailable, run_experiment

__all__ = ["Published", "PUBLISHED", "ValidationRow", "validate", "published_rows"]


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
)}


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

    @property
    def relative_difference(self) -> float | None:
        if self.ours is None or self.published is None or self.published == 0:
            return None
        return self.ours / self.published - 1

    def as_dict(self) -> dict[str, Any]:
        return {"experiment": self.experiment, "figure": self.figure, "ours": self.ours, "published": self.published,
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
                          "sim.network.transport.rdma_wire_bytes over a 4 MB message (one RETH)")]
    f = PUBLISHED["model_f_fp16_table_bytes"]
    wl = preset("model-f")
    rows.append(ValidationRow("workloads", f.figure, float(sum(t.nbytes for t in wl.tables)), f.unit, "model arithmetic",
                              f.value, f.source, "host.workloads preset model-f (weights only, no optimizer state)"))
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
        rows.append(ValidationRow(name, f"{p.figure}, preset efficiencies (before the fit)", pre, p.unit, "calibration target",
                                  p.value if at_scale else None, src, note))
        rows.append(ValidationRow(name, f"{p.figure}, fitted (factor {m['factor']:.4f}, {m['evaluations']} evaluations)",
                                  m["fitted_samples_per_s"], p.unit, "calibration target", p.value if at_scale else None,
                                  src, note or "agreement by construction: the fit's residual"))
        for label, value in m["predictions"].items():
            rows.append(ValidationRow(name, label, value, "samples/s", "prediction"))
        rows.append(ValidationRow(name, "GPU preset measured on a real GPU", None, "", "prediction",
                                  note=m["gpu_measurements"]["note"]))
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
    return rows


def validate(out: str | Path, quick: bool = False, experiments: tuple[str, ...] = EXPERIMENTS,
             progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the experiments and write the comparison (see the module doc); returns a summary."""
    progress = progress or (lambda message: None)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    size = "tiny" if quick else "validate"
    rows = published_rows()
    runs: list[dict[str, Any]] = []
    for name in experiments:
        progress(f"experiment {name} ({size} size)")
        t0 = time.perf_counter()
        try:
            result = run_experiment(name, out / name, size=size, progress=progress)
        except ExperimentUnavailable as error:
            runs.append({"experiment": name, "status": "not run", "reason": str(error), "wall_s": time.perf_counter() - t0})
            rows.append(ValidationRow(name, "every figure", None, "", "prediction", note=f"not run: {error}"))
            progress(f"experiment {name}: not run: {error}")
            continue
        wall = time.perf_counter() - t0
        runs.append({"experiment": name, "status": "ok", "wall_s": wall, "title": result.title, "scale": _scale(result),
                     "plots": sorted(result.plots), "notes": result.notes})
        rows.extend(_experiment_rows(name, result, comparable=not quick))
        progress(f"experiment {name}: done in {wall:.1f} s")
    _write(out, rows, runs, quick)
    return {"rows": [r.as_dict() for r in rows], "runs": runs, "size": size}


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
