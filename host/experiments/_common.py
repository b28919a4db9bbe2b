"""Shared pieces of the experiments: the result type, the results folder, config checks,
workloads scaled to a cluster, and one scenario run on the cluster runtime."""

from __future__ import annotations

import csv
import json
import math
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from neonic.host.schedule import COLLECTIVE_PHASES

__all__ = [
    "ExperimentResult",
    "ExperimentUnavailable",
    "write_experiment",
    "Checker",
    "scaled_workload",
    "scenario_data",
    "planner_fields",
    "planner_table",
    "PLANNER_FIELDS",
    "run_scenario",
    "scenario_figures",
    "COMM_PHASES",
]

#: Phases whose exposed time counts as exposed communication (collectives and host copies).
COMM_PHASES: tuple[str, ...] = ("input_a2a", "pooled_rs", "pooled_a2a", "grad_a2a", "grad_ag", "allreduce", "h2d", "pooled_h2d",
                                 "grad_d2h")


class ExperimentUnavailable(RuntimeError):
    """The experiment needs a part of neonic that does not exist yet (the reason says which)."""


@dataclass
class ExperimentResult:
    """What an experiment produced: its table, headline metrics, notes and plots.

    ``plots`` maps a PNG file name to a function drawing it on a matplotlib figure.
    ``notes`` say what is measured, what is a prediction, and every assumption.
    """

    name: str
    title: str
    config: dict[str, Any]
    rows: list[dict[str, Any]]
    metrics: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    plots: dict[str, Callable[[Any], None]] = field(default_factory=dict)
    files: dict[str, Callable[[Path], None]] = field(default_factory=dict)  # name -> writer(path)
    wall_s: float = 0.0
    size: str = "default"


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.9g}"
    return str(value)


def write_table_csv(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    """Rows (dicts) as a CSV whose columns are the union of keys in first-seen order."""
    columns: list[str] = []
    for row in rows:
        for key in row:
            if key not in columns:
                columns.append(key)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_cell(row.get(c)) for c in columns])


def write_experiment(result: ExperimentResult, out: str | Path) -> Path:
    """The results folder: table.csv, metrics.json, config.toml and the plots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import tomli_w

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_table_csv(result.rows, out / "table.csv")
    payload = {"experiment": result.name, "title": result.title, "size": result.size, "wall_s": result.wall_s,
               "metrics": result.metrics, "notes": result.notes, "config": result.config}
    (out / "metrics.json").write_text(json.dumps(_plain(payload), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    (out / "config.toml").write_text(tomli_w.dumps(_plain(result.config)), encoding="utf-8")
    for filename, write in result.files.items():
        write(out / filename)
    for filename, draw in result.plots.items():
        fig = plt.figure(figsize=(7, 4.2))
        try:
            draw(fig)
            fig.tight_layout()
            fig.savefig(out / filename, dpi=100)
        finally:
            plt.close(fig)
    return out


# ------------------------------------------------------------------------------ config checks
from neonic.sim import schema  # noqa: E402  the shared config vocabulary


class Checker:
    """Field-by-field checks of an experiment config; errors name ``PREFIX.field``."""

    def __init__(self, data: Mapping[str, Any], prefix: str, known: Sequence[str]) -> None:
        if not isinstance(data, Mapping):
            raise ValueError(f"{prefix}: expected a table, got {type(data).__name__}")
        for key in data:
            if key not in known:
                raise ValueError(f"{prefix}.{key}: unknown field; expected one of {', '.join(known)}")
        self.data = data
        self.prefix = prefix

    def _where(self, key: str) -> str:
        return f"{self.prefix}.{key}"

    def _get(self, key: str, default: Any) -> Any:
        if key not in self.data:
            if default is _REQUIRED:
                raise ValueError(f"{self._where(key)}: required field missing")
            return default
        return self.data[key]

    def int(self, key: str, default: Any = None, lo: int = 0) -> int:
        return schema.integer(self._where(key), self._get(key, default), lo)

    def num(self, key: str, default: Any = None, lo: float = 0.0, hi: float = math.inf, lo_open: bool = True) -> float:
        return schema.number(self._where(key), self._get(key, default), lo,
                             None if hi == math.inf else hi, lo_open=lo_open)

    def bool(self, key: str, default: Any = None) -> bool:
        return schema.boolean(self._where(key), self._get(key, default))

    def choice(self, key: str, choices: Sequence[str], default: Any = None) -> str:
        return schema.choice(self._where(key), self._get(key, default), choices)

    def str(self, key: str, default: Any = None) -> str:
        return schema.string(self._where(key), self._get(key, default))

    def list(self, key: str, item: Callable[[str, Any], Any], default: Any = None, nonempty: bool = True) -> list[Any]:
        value = self._get(key, default)
        if not isinstance(value, list) or (nonempty and not value):
            raise ValueError(f"{self._where(key)}: expected a {'non-empty ' if nonempty else ''}list, got {value!r}")
        return [item(f"{self._where(key)}[{i}]", v) for i, v in enumerate(value)]

    def table(self, key: str, default: Any = None) -> dict[str, Any]:
        value = self._get(key, default)
        if not isinstance(value, Mapping):
            raise ValueError(f"{self._where(key)}: expected a table, got {value!r}")
        return dict(value)


_REQUIRED = object()
REQUIRED = _REQUIRED


def item_int(lo: int = 1) -> Callable[[str, Any], int]:
    def check(where: str, value: Any) -> int:
        return schema.integer(where, value, lo)

    return check


def item_num(lo: float = 0.0) -> Callable[[str, Any], float]:
    def check(where: str, value: Any) -> float:
        return schema.number(where, value, lo, lo_open=True)

    return check


def item_choice(choices: Sequence[str]) -> Callable[[str, Any], str]:
    def check(where: str, value: Any) -> str:
        if value not in choices:
            raise ValueError(f"{where}: expected one of {', '.join(choices)}, got {value!r}")
        return value

    return check


# ------------------------------------------------------------------------------- workloads
def scaled_workload(preset: str, fraction: float, table_fraction: float = 1.0, params_fraction: float = 1.0,
                    batch_per_gpu: int | None = None) -> dict[str, Any]:
    """A workload table: preset ``preset`` holding ``fraction`` of its tables and parameters
    (weak scaling: a cluster of n nodes holds n/16 of a model published on 16 nodes, so every
    GPU keeps the same share), times ``table_fraction`` of the tables and ``params_fraction``
    of the parameters (smaller experiment sizes; a model too large for HBM). Table sizes, dims,
    pooling and the dense part are the preset's."""
    from neonic.host.workloads import preset_text

    data = tomllib.loads(preset_text(preset))
    synth = data.get("synthesize")
    if synth is None:
        raise ValueError(f"workload {preset!r}: not synthesized from a summary; cannot be scaled")
    count = max(1, int(round(synth["count"] * fraction * table_fraction)))
    synth["count"] = count
    synth["total_params"] = float(synth["total_params"]) * fraction * params_fraction
    # a table smaller than rows_min would break the parameter total: keep rows_min feasible
    dim_avg = synth.get("dim_avg", synth.get("dim", 64))
    synth["rows_min"] = int(min(synth.get("rows_min", 1000), max(1, synth["total_params"] / (4 * count * dim_avg))))
    scale = fraction * table_fraction
    data["name"] = f"{preset}" if scale == 1.0 and params_fraction == 1.0 else f"{preset}-x{fraction * params_fraction:.4g}"
    data["description"] = f"{data.get('description', preset)}; scaled: {count} tables, {synth['total_params']:.3g} parameters"
    if batch_per_gpu is not None:
        data["batch_per_gpu"] = batch_per_gpu
    return data


def planner_fields(c: "Checker", data: Mapping[str, Any]) -> dict[str, Any]:
    """The planner fields every cluster experiment takes: ``planner_max_steps`` (Neo's
    refinement steps at most; default :data:`host.planner.DEFAULT_MAX_STEPS`) and
    ``planner_time_budget_s``, an opt-in wall-clock safety (None unless set: a budget that
    ends a search makes the figures depend on the machine's load)."""
    from neonic.host.planner import DEFAULT_MAX_STEPS

    return {
        "planner_max_steps": c.int("planner_max_steps", DEFAULT_MAX_STEPS, 0),
        "planner_time_budget_s": c.num("planner_time_budget_s", None, 0, 600) if "planner_time_budget_s" in data else None,
    }


PLANNER_FIELDS: tuple[str, ...] = ("planner_max_steps", "planner_time_budget_s")


def planner_table(config: Mapping[str, Any], name: str = "neo") -> dict[str, Any]:
    """The scenario's ``[planner]`` table from an experiment config's :func:`planner_fields`."""
    table: dict[str, Any] = {"name": name, "max_steps": config["planner_max_steps"]}
    if config.get("planner_time_budget_s") is not None:
        table["time_budget_s"] = config["planner_time_budget_s"]
    return table


def scenario_data(name: str, workload: Any, system: Any, nodes: int, *, mode: str = "training", pipelined: bool = True,
                  iterations: int = 1, warmup: int = 1, planner: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A scenario table for :func:`host.cluster.scenario_from_dict`; ``planner`` is its
    ``[planner]`` table (:func:`planner_table`; default: Neo with its default ``max_steps``,
    no wall-clock budget, so the run is deterministic)."""
    return {
        "scenario": {"name": name, "mode": mode, "pipelined": pipelined, "iterations": iterations, "warmup": warmup, "seed": 1},
        "cluster": {"nodes": nodes},
        "workload": workload,
        "system": system,
        "planner": dict(planner) if planner is not None else {"name": "neo"},
    }


def _refuses_smartnic(error: RuntimeError) -> bool:
    return "sim/nic.py" in str(error) or "NIC jobs" in str(error)


def run_scenario(data: Mapping[str, Any], run_cls: Any = None):
    """Validate and run one scenario; returns the ``RunResult``. A system the cluster runtime
    cannot simulate yet (the SmartNIC system before ``sim/nic.py``) raises
    :class:`ExperimentUnavailable` with the runtime's reason."""
    from neonic.host.cluster import ClusterRun, scenario_from_dict

    scenario = scenario_from_dict(data)
    cls = run_cls or ClusterRun
    try:
        return cls(scenario).run()
    except RuntimeError as error:
        if _refuses_smartnic(error):
            raise ExperimentUnavailable(f"the cluster runtime refuses the SmartNIC system: {error}") from error
        raise


def scenario_figures(result: Any) -> dict[str, Any]:
    """The figures of one run that the experiments tabulate (seconds -> ms where named so)."""
    m = result.metrics
    exposed = m["phase_exposed_s"]
    serialized = m["phase_serialized_s"]
    row: dict[str, Any] = {
        "gpus": m["gpus"],
        "samples_per_s": m["samples_per_s"],
        "iteration_ms": m["iteration_time_s"] * 1e3,
        "exposed_comm_ms": sum(exposed.get(p, 0.0) for p in COMM_PHASES) * 1e3,
        "exposed_compute_ms": sum(v for p, v in exposed.items() if p not in COMM_PHASES) * 1e3,
        "idle_ms": m["idle_s"] * 1e3,
    }
    for phase in sorted(set(serialized) | set(exposed)):
        row[f"exposed_{phase}_ms"] = exposed.get(phase, 0.0) * 1e3
    for phase in sorted(serialized):
        row[f"serialized_{phase}_ms"] = serialized[phase] * 1e3
    if "latency_s" in m:
        row["latency_mean_ms"] = m["latency_s"]["mean"] * 1e3
        row["latency_max_ms"] = m["latency_s"]["max"] * 1e3
    return row


class Timer:
    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0


assert COLLECTIVE_PHASES <= set(COMM_PHASES)
