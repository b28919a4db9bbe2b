"""Design-space sweeps of cluster scenarios on Dask distributed, resumable point by point.

A sweep takes a base scenario (a packaged scenario preset, a scenario TOML, or an inline table)
and varies any of its fields, named by dotted paths (``cluster.nodes``,
``system.streams.comm_priority``, ``workload.synthesize.count``): a grid (the cartesian
product of ``[grid]``'s value lists) crossed with an optional list of explicit points
(``[[points]]``). Every point is a complete scenario table, keyed by a hash of that table.

SWEEP.toml (every field checked; errors name the field)::

    [sweep]
    name = "nodes-x-priority"        # results folder name (no spaces or slashes)
    scenario = "default"             # a scenario preset (host.cluster.SCENARIO_PRESETS) or a
                                     # scenario .toml path relative to this file; or give [base]
    seeds = "point"                  # "point": scenario.seed derived from the point's config
                                     # (never from the order points run in); "scenario": kept
    metrics = ["samples_per_s"]      # figures to plot against each swept field (optional)
    [base]                           # optional inline scenario (instead of sweep.scenario)
    [set]                            # fixed overrides for every point: "planner.max_steps" = 50
    [grid]                           # field -> list of values; the grid is their product
    "cluster.nodes" = [1, 2, 4]
    "system.streams.comm_priority" = ["high", "normal"]
    [[points]]                       # optional explicit points, each crossed with the grid
    "system.preset" = "zion"

A field under ``system`` turns a system preset name into ``{preset = NAME, ...overrides}``;
a field under ``workload`` expands a workload preset into its full table first, so any field
of it can be swept.

Running (:func:`run_sweep`): points are evaluated on a Dask cluster (an in-process
``LocalCluster`` by default, ``scheduler=ADDRESS`` for a running one); the client writes each
finished point at once as ``points/<key>.json`` (temp file + rename, so a file is complete or
absent); a rerun loads finished points and evaluates only the others (failed points are
retried); a failing point is recorded with its error while the rest finish. Points are
submitted largest first (GPUs x iterations as the Dask priority), so a long point does not run
alone at the end. At the end: ``results.csv`` (one row per point in grid order, the swept
fields and every scalar figure; wall-clock times are kept out so the table does not depend on
the worker count), ``sweep.json`` (the spec and a summary) and ``plot_<field>.png`` per swept
field, rendered on the workers in parallel when they are processes. An interrupt (Ctrl-C)
writes the same files for the points finished so far.

Determinism: a point's figures depend only on its config. Neo's planner search ends at
convergence or after ``planner.max_steps`` refinement steps, never by the clock, so the same
point gives the same plan on any worker. ``planner.time_budget_s`` is an opt-in wall-clock
safety (off by default); a point that sets it and whose search the budget ends can get a plan
that depends on the worker's load, so such points are not reproducible. Bound a large search
with ``planner.max_steps`` instead.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from neonic.sim import schema

__all__ = [
    "SweepSpec",
    "SweepPoint",
    "SweepResult",
    "SECTIONS",
    "load_sweep",
    "sweep_from_dict",
    "expand_points",
    "set_path",
    "evaluate_point",
    "run_sweep",
    "config_key",
]

#: Scenario sections a dotted path may start with (host.cluster's schema).
SECTIONS = ("scenario", "cluster", "workload", "system", "planner", "dense")
_TOP = ("sweep", "base", "set", "grid", "points")
_SWEEP = ("name", "scenario", "seeds", "metrics")
MAX_POINTS = 100_000
#: Figures of a point (:func:`_scalars`), by name, and the families named by prefix.
METRICS = ("samples_per_s", "iteration_time_s", "global_batch", "gpus", "nodes", "idle_s",
           "dense_params", "latency_mean_s", "latency_max_s")
METRIC_PREFIXES = ("exposed_", "serialized_", "util_", "hit_rate_")
SCHEDULER_TIMEOUT_S = 10
#: Bumped when the meaning of a point's figures changes, so old results are not reused.
RESULT_VERSION = 1


# ------------------------------------------------------------------------------------ spec
@dataclass(frozen=True)
class SweepSpec:
    """A validated sweep (see the module doc)."""

    name: str
    base: dict[str, Any]
    base_label: str
    base_dir: str | None
    fixed: dict[str, Any]
    axes: dict[str, list[Any]]
    points: list[dict[str, Any]]
    seeds: str = "point"
    metrics: tuple[str, ...] = ("samples_per_s",)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "scenario": self.base_label, "seeds": self.seeds, "metrics": list(self.metrics),
                "set": self.fixed, "grid": self.axes, "points": self.points}


@dataclass(frozen=True)
class SweepPoint:
    """One point: its index in grid order, the swept values, its scenario table and key."""

    index: int
    values: dict[str, Any]
    config: dict[str, Any]
    key: str


def _flatten(where: str, value: Any, prefix: str = "", leaf_lists: bool = False) -> dict[str, Any]:
    """Nested tables (or quoted dotted keys) to ``{dotted.path: value}``."""
    out: dict[str, Any] = {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: expected a table, got {value!r}")
    for key, item in value.items():
        if not isinstance(key, str) or not key or any(not part for part in key.split(".")):
            raise ValueError(f"{where}.{key}: expected a dotted field path such as cluster.nodes")
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(item, Mapping) and (leaf_lists or not _is_value_table(path)):
            out.update(_flatten(f"{where}.{key}", item, path, leaf_lists))
        else:
            out[path] = item
    return out


def _is_value_table(path: str) -> bool:
    """Paths whose value is itself a table and is set whole (an inline workload or system)."""
    return path in ("workload", "system", "base")


def _check_path(where: str, path: str) -> None:
    head = path.split(".")[0]
    if head not in SECTIONS:
        raise ValueError(f"{where}: unknown scenario section {head!r} in {path!r}; expected one of {', '.join(SECTIONS)}")


def sweep_from_dict(data: Mapping[str, Any], base_dir: str | Path | None = None) -> SweepSpec:
    """Validate a parsed SWEEP.toml field by field."""
    from neonic.host.cluster import SCENARIO_PRESETS, scenario_preset_text

    schema.table("sweep file", data)
    schema.known_fields("", data, _TOP)
    sw = data.get("sweep")
    if not isinstance(sw, Mapping):
        raise ValueError("sweep: required table missing (with at least sweep.name)")
    schema.known_fields("sweep", sw, _SWEEP)
    name = sw.get("name")
    if not isinstance(name, str) or not name or any(c in name for c in "/\\ "):
        raise ValueError(f"sweep.name: expected a non-empty name without spaces or slashes, got {name!r}")
    seeds = schema.choice("sweep.seeds", sw.get("seeds", "point"), ("point", "scenario"))
    metrics = sw.get("metrics", ["samples_per_s"])
    if not isinstance(metrics, list) or not metrics or not all(isinstance(m, str) and m for m in metrics):
        raise ValueError(f"sweep.metrics: expected a non-empty list of figure names, got {metrics!r}")
    for i, metric in enumerate(metrics):
        if metric not in METRICS and not (metric.startswith(METRIC_PREFIXES)
                                          and len(metric) > len(metric.split("_")[0]) + 1):
            import difflib
            hint = difflib.get_close_matches(metric, METRICS, n=1, cutoff=0.6)
            raise ValueError(f"sweep.metrics[{i}]: unknown figure {metric!r}"
                             f"{f' (did you mean {hint[0]!r}?)' if hint else ''}; expected one of "
                             f"{', '.join(METRICS)} or a name starting with "
                             f"{', '.join(METRIC_PREFIXES)}")
    base_dir_s = str(base_dir) if base_dir is not None else None
    if "base" in data and "scenario" in sw:
        raise ValueError("sweep.scenario and [base]: give one or the other")
    if "base" in data:
        if not isinstance(data["base"], Mapping):
            raise ValueError(f"base: expected a scenario table, got {data['base']!r}")
        base = json.loads(json.dumps(data["base"]))
        label = "inline"
    else:
        scen = sw.get("scenario", "default")
        if not isinstance(scen, str) or not scen:
            raise ValueError(f"sweep.scenario: expected a scenario preset name or a .toml path, got {scen!r}")
        if scen in SCENARIO_PRESETS:
            base = tomllib.loads(scenario_preset_text(scen))
        elif scen.endswith(".toml"):
            path = Path(scen) if base_dir is None or Path(scen).is_absolute() else Path(base_dir) / scen
            from neonic.sim.schema import load_toml
            base = load_toml(path, "sweep.scenario: scenario file")
            base_dir_s = str(path.parent.resolve())
        else:
            raise ValueError(f"sweep.scenario: expected one of {', '.join(SCENARIO_PRESETS)} or a .toml path, got {scen!r}")
        label = scen
    fixed = _flatten("set", data.get("set", {}))
    for path in fixed:
        _check_path(f"set.{path}", path)
    axes_raw = _flatten("grid", data.get("grid", {}), leaf_lists=True)
    axes: dict[str, list[Any]] = {}
    for path, values in axes_raw.items():
        _check_path(f"grid.{path}", path)
        if not isinstance(values, list) or not values:
            raise ValueError(f"grid.{path}: expected a non-empty list of values, got {values!r}")
        axes[path] = values
    raw_points = data.get("points", [])
    if not isinstance(raw_points, list):
        raise ValueError(f"points: expected an array of tables ([[points]]), got {raw_points!r}")
    points = []
    for i, p in enumerate(raw_points):
        flat = _flatten(f"points[{i}]", p)
        if not flat:
            raise ValueError(f"points[{i}]: expected at least one field")
        for path in flat:
            _check_path(f"points[{i}].{path}", path)
            if path in axes:
                raise ValueError(f"points[{i}].{path}: also swept in [grid]; set it in one place")
        points.append(flat)
    total = math.prod(len(v) for v in axes.values()) * max(1, len(points))
    if total > MAX_POINTS:
        raise ValueError(f"grid: {total} points, more than {MAX_POINTS}; split the sweep")
    spec = SweepSpec(name=name, base=base, base_label=label, base_dir=base_dir_s, fixed=fixed, axes=axes,
                     points=points, seeds=seeds, metrics=tuple(metrics))
    _check_field_names(spec)
    return spec


def _check_field_names(spec: SweepSpec) -> None:
    """Catch a misspelt field (``cluster.nodez``) at load, not in every point: each field that
    ``[set]``, ``[grid]`` or ``[[points]]`` names is set alone (with its first value) on the
    base scenario, which is then validated; an unknown-field error there is the sweep file's."""
    from neonic.host.cluster import scenario_from_dict

    named: dict[str, tuple[str, Any]] = {}
    for path, value in spec.fixed.items():
        named.setdefault(path, (f"set.{path}", value))
    for path, values in spec.axes.items():
        named.setdefault(path, (f"grid.{path}", values[0]))
    for i, p in enumerate(spec.points):
        for path, value in p.items():
            named.setdefault(path, (f"points[{i}].{path}", value))
    for path, (where, value) in named.items():
        config = json.loads(json.dumps(spec.base))
        try:
            set_path(config, path, value)
            scenario_from_dict(config, base=Path(spec.base_dir) if spec.base_dir else None)
        except ValueError as error:
            text = str(error)
            if "unknown field" in text or "unknown scenario section" in text:
                raise ValueError(f"{where}: {text}") from None
            # other errors may depend on the combination with other fields: the point reports them


def load_sweep(path: str | Path) -> SweepSpec:
    """Load and validate SWEEP.toml."""
    from neonic.sim.schema import load_toml

    path = Path(path)
    return sweep_from_dict(load_toml(path, "sweep file"), base_dir=path.parent.resolve())


# ----------------------------------------------------------------------------------- points
def _expand_section(config: dict[str, Any], head: str, path: str) -> None:
    """Make ``config[head]`` a table that a dotted override below it can go into."""
    value = config.get(head)
    if head == "system":
        if value is None:
            config[head] = {"preset": "zionex"}
        elif isinstance(value, str):
            config[head] = {"preset": value}
    elif head == "workload":
        if isinstance(value, Mapping) and "preset" in value and path != "workload.preset":
            from neonic.host.workloads import PRESET_NAMES, preset_text

            if value["preset"] in PRESET_NAMES:
                table = tomllib.loads(preset_text(value["preset"]))
                rest = {k: v for k, v in value.items() if k != "preset"}
                config[head] = {**table, **rest}
        elif isinstance(value, str):
            from neonic.host.workloads import PRESET_NAMES, preset_text

            if value in PRESET_NAMES:
                config[head] = tomllib.loads(preset_text(value))


def set_path(config: dict[str, Any], path: str, value: Any) -> None:
    """Set ``config[a][b][c] = value`` for ``path = "a.b.c"`` (see the module doc for how
    system and workload presets are expanded first)."""
    parts = path.split(".")
    if len(parts) > 1:
        _expand_section(config, parts[0], path)
    node = config
    for i, part in enumerate(parts[:-1]):
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            raise ValueError(f"{path}: {'.'.join(parts[: i + 1])} is {nxt!r}, not a table, so it has no field {parts[i + 1]!r}")
        node = nxt
    node[parts[-1]] = value


def _canonical(config: Mapping[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)


def config_key(config: Mapping[str, Any]) -> str:
    """The point's key: a hash of its resolved scenario table (and the result format)."""
    digest = hashlib.sha256(f"neonic-sweep-v{RESULT_VERSION}:{_canonical(config)}".encode()).hexdigest()
    return digest[:20]


def expand_points(spec: SweepSpec) -> list[SweepPoint]:
    """Every point in grid order (the last field varies fastest), explicit points outermost."""
    import itertools

    names = list(spec.axes)
    out: list[SweepPoint] = []
    for extra in spec.points or [{}]:
        for combo in itertools.product(*(spec.axes[n] for n in names)):
            values = {**extra, **dict(zip(names, combo))}
            config = json.loads(json.dumps(spec.base))
            error = None
            try:
                for path, value in {**spec.fixed, **values}.items():
                    set_path(config, path, value)
            except ValueError as exc:  # reported when the point runs, with the rest finishing
                error = str(exc)
            if spec.seeds == "point" and error is None:
                scen = config.setdefault("scenario", {})
                if isinstance(scen, dict):
                    seedless = json.loads(json.dumps(config))
                    seedless.get("scenario", {}).pop("seed", None)
                    scen["seed"] = int(config_key(seedless)[:8], 16)
            if error is not None:
                config = {"__invalid__": error, "values": values}
            out.append(SweepPoint(len(out), values, config, config_key(config)))
    return out


# ------------------------------------------------------------------------------ evaluation
def _scalars(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The figures of a run as flat scalar columns (wall-clock figures left out)."""
    out: dict[str, Any] = {}
    for key in ("samples_per_s", "iteration_time_s", "global_batch", "gpus", "nodes", "idle_s", "dense_params"):
        if key in metrics:
            out[key] = metrics[key]
    lat = metrics.get("latency_s")
    if lat:
        out["latency_mean_s"] = lat["mean"]
        out["latency_max_s"] = lat["max"]
    for phase, value in sorted(metrics.get("phase_exposed_s", {}).items()):
        out[f"exposed_{phase}_s"] = value
    for phase, value in sorted(metrics.get("phase_serialized_s", {}).items()):
        out[f"serialized_{phase}_s"] = value
    for key, value in sorted(metrics.get("utilization", {}).items()):
        out[f"util_{key}"] = value
    for key, value in sorted(metrics.get("cache_hit_rates", {}).items()):
        out[f"hit_rate_{key}"] = value
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in out.items()}


def evaluate_point(config: dict[str, Any], base_dir: str | None = None, plan_dir: str | None = None) -> dict[str, Any]:
    """Run one point's scenario; never raises: ``{"status": "ok", "metrics": ...}`` or
    ``{"status": "error", "error": "..."}`` (runs on a Dask worker). ``plan_dir``: plan through
    a ``host.planner.cache.PlanCache`` there (points that differ only in what the planner does
    not read share one plan); None: plan afresh."""
    t0 = time.perf_counter()
    try:
        if "__invalid__" in config:
            raise ValueError(config["__invalid__"])
        from neonic.host.cluster import ClusterRun, scenario_from_dict
        from neonic.host.planner.cache import PlanCache, use_plan_cache

        scenario = scenario_from_dict(config, base=Path(base_dir) if base_dir else None)
        with use_plan_cache(PlanCache(plan_dir) if plan_dir else None):
            result = ClusterRun(scenario).run()
        return {"status": "ok", "metrics": _scalars(result.metrics), "wall_s": time.perf_counter() - t0}
    except Exception as error:  # noqa: BLE001  a failing point is reported, the rest go on
        return {"status": "error", "error": f"{type(error).__name__}: {error}", "wall_s": time.perf_counter() - t0}


# ---------------------------------------------------------------------------------- running
@dataclass
class SweepResult:
    """What a sweep run did: every point's record (by index), what it computed this time."""

    spec: SweepSpec
    out: Path
    points: list[SweepPoint]
    records: dict[str, dict[str, Any]]
    computed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    interrupted: bool = False
    wall_s: float = 0.0

    @property
    def failed(self) -> list[SweepPoint]:
        return [p for p in self.points if self.records.get(p.key, {}).get("status") == "error"]

    @property
    def finished(self) -> int:
        return sum(1 for p in self.points if self.records.get(p.key, {}).get("status") == "ok")


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _load_done(folder: Path) -> dict[str, dict[str, Any]]:
    done: dict[str, dict[str, Any]] = {}
    if not folder.exists():
        return done
    for path in folder.glob("*.json"):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue  # unreadable: recomputed
        if record.get("status") == "ok" and record.get("key") == path.stem:
            done[path.stem] = record
    return done


Progress = Callable[[int, int, dict[str, Any]], Any]


def run_sweep(
    spec: SweepSpec,
    out: str | Path,
    *,
    scheduler: str | None = None,
    workers: int | None = None,
    processes: bool = True,
    progress: Progress | None = None,
    on_point: Callable[[dict[str, Any]], Any] | None = None,
    client: Any = None,
    announce: Callable[[str], Any] | None = None,
) -> SweepResult:
    """Run ``spec``'s unfinished points on Dask and write the results folder ``out``.

    ``scheduler``: address of a running Dask scheduler (else an in-process LocalCluster with
    ``workers`` single-threaded workers, as processes unless ``processes=False``; ``client``
    reuses an existing ``dask.distributed.Client``). ``progress(done, total, record)`` is called
    after every finished point; ``on_point(record)`` too, and returning ``False`` from it stops
    the sweep (finished points stay on disk; a rerun resumes). ``announce(line)`` receives
    notes for the user, such as the Dask dashboard's address when there is one.

    An interrupt (``KeyboardInterrupt``) still writes ``results.csv``, ``sweep.json`` and the
    plots of the points finished so far (the others are ``missing``), then propagates.
    """
    t0 = time.perf_counter()
    from neonic.host.planner.cache import default_plan_dir

    plan_dir = str(default_plan_dir())
    out = Path(out)
    folder = out / "points"
    folder.mkdir(parents=True, exist_ok=True)
    points = expand_points(spec)
    by_key: dict[str, list[SweepPoint]] = {}
    for p in points:
        by_key.setdefault(p.key, []).append(p)
    records = {k: v for k, v in _load_done(folder).items() if k in by_key}
    result = SweepResult(spec, out, points, records, skipped=sorted(records))
    todo = [ps[0] for k, ps in by_key.items() if k not in records]
    done_count = len(records)
    total = len(by_key)
    if progress:
        progress(done_count, total, {})
    if todo:
        try:
            _run_on_dask(spec, todo, by_key, folder, result, scheduler, workers, processes, progress, on_point,
                         client, total, announce, finish=lambda c: write_outputs(result, c), plan_dir=plan_dir)
        except KeyboardInterrupt:
            result.interrupted = True
            result.wall_s = time.perf_counter() - t0
            write_outputs(result)
            raise
    else:
        write_outputs(result)
    result.wall_s = time.perf_counter() - t0
    return result


def connect(scheduler: str, timeout_s: float | None = None) -> Any:
    """A client of the Dask scheduler at ``scheduler``, or a ``ValueError`` naming
    ``--scheduler`` within ``timeout_s`` (default :data:`SCHEDULER_TIMEOUT_S`) when nothing
    answers there."""
    from dask.distributed import Client

    if timeout_s is None:
        timeout_s = SCHEDULER_TIMEOUT_S

    if not isinstance(scheduler, str) or not scheduler.strip():
        raise ValueError(f"--scheduler: expected an address such as tcp://10.0.0.1:8786, got {scheduler!r}")
    try:
        return Client(scheduler, timeout=f"{timeout_s}s")
    except (OSError, TimeoutError, ValueError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(f"--scheduler {scheduler}: no Dask scheduler answered within {timeout_s:g} s "
                         f"({reason[:200]}); start one with `dask scheduler` or leave --scheduler out "
                         f"for a local cluster") from None


def dashboard_address(client: Any) -> str | None:
    """The Dask dashboard's address, when the scheduler serves one (it needs bokeh)."""
    try:
        if "dashboard" not in client.scheduler_info().get("services", {}):
            return None
        return client.dashboard_link
    except Exception:  # noqa: BLE001  no dashboard is not an error
        return None


def _cost(config: Mapping[str, Any]) -> int:
    """A point's relative cost for scheduling (largest first, so no long point is left for the
    end while the other workers idle): GPUs x simulated iterations."""
    def get(section: str, key: str, default: int) -> int:
        table = config.get(section)
        value = table.get(key, default) if isinstance(table, Mapping) else default
        return value if isinstance(value, int) and not isinstance(value, bool) else default

    return (get("cluster", "nodes", 2) * get("cluster", "gpus_per_node", 8)
            * (get("scenario", "iterations", 2) + get("scenario", "warmup", 1)))


def _run_on_dask(spec, todo, by_key, folder, result, scheduler, workers, processes, progress, on_point, client, total,
                 announce=None, finish=None, plan_dir=None) -> None:
    from dask.distributed import Client, LocalCluster, as_completed

    own_cluster = own_client = None
    try:
        if client is None:
            if scheduler:
                client = own_client = connect(scheduler)
            else:
                import importlib.util

                n = workers or max(1, min(len(todo), os.cpu_count() or 1))
                dash = ":0" if importlib.util.find_spec("bokeh") else None
                own_cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=processes,
                                           dashboard_address=dash)
                client = own_client = Client(own_cluster)
            link = dashboard_address(client)
            if announce is not None:
                announce(f"Dask dashboard: {link}" if link else
                         "Dask dashboard: none (the scheduler serves one when bokeh is installed)")
        futures = {}
        for p in todo:
            fut = client.submit(evaluate_point, p.config, spec.base_dir, plan_dir, key=f"neonic-point-{p.key}", pure=False,
                                priority=_cost(p.config))
            futures[fut.key] = (fut, p)
        done = len(result.records)
        stop = False
        for fut in as_completed([f for f, _ in futures.values()]):
            _, p = futures[fut.key]
            try:
                outcome = fut.result()
            except Exception as error:  # noqa: BLE001  e.g. the worker died: this point fails alone
                outcome = {"status": "error", "error": f"{type(error).__name__}: {error}"}
            record = {"key": p.key, "index": p.index, "values": p.values, "config": p.config, **outcome}
            _write_atomic(folder / f"{p.key}.json", json.dumps(record, indent=1, sort_keys=True, default=str) + "\n")
            result.records[p.key] = record
            result.computed.append(p.key)
            done += 1
            if progress:
                progress(done, total, record)
            if on_point is not None and on_point(record) is False:
                stop = True
                break
        if stop:
            result.interrupted = True
            for fut, _ in futures.values():
                fut.cancel()
        if finish is not None:
            finish(client)
    finally:
        if own_client is not None:
            own_client.close()
        if own_cluster is not None:
            own_cluster.close()


# ----------------------------------------------------------------------------------- outputs
def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def table_rows(result: SweepResult) -> tuple[list[str], list[list[str]]]:
    """The tidy table: one row per point in grid order."""
    axes: list[str] = []
    for p in result.points:
        for k in p.values:
            if k not in axes:
                axes.append(k)
    metric_names: set[str] = set()
    for p in result.points:
        metric_names.update(result.records.get(p.key, {}).get("metrics", {}))
    first = [m for m in ("samples_per_s", "iteration_time_s", "latency_mean_s", "latency_max_s") if m in metric_names]
    metrics = first + sorted(metric_names - set(first))
    header = ["point", "key", "status", *axes, *metrics, "error"]
    rows = []
    for p in result.points:
        rec = result.records.get(p.key, {})
        status = rec.get("status", "missing")
        m = rec.get("metrics", {})
        rows.append([str(p.index), p.key, status, *(_cell(p.values.get(a)) for a in axes), *(_cell(m.get(k)) for k in metrics),
                     rec.get("error", "")])
    return header, rows


def write_outputs(result: SweepResult, client: Any = None) -> None:
    """results.csv, sweep.json and one plot per swept field."""
    out = result.out
    header, rows = table_rows(result)
    import io

    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    _write_atomic(out / "results.csv", buf.getvalue())
    summary = {"spec": result.spec.to_dict(), "points": len(result.points), "finished": result.finished,
               "failed": [{"point": p.index, "key": p.key, "values": p.values, "error": result.records[p.key].get("error")}
                          for p in result.failed],
               "missing": [p.index for p in result.points if p.key not in result.records],
               "computed_this_run": len(result.computed), "skipped_this_run": len(result.skipped)}
    _write_atomic(out / "sweep.json", json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n")
    _plots(result, client)


def _swept_fields(result: SweepResult) -> list[str]:
    axes: list[str] = []
    for p in result.points:
        for k in p.values:
            if k not in axes:
                axes.append(k)
    return axes


def _plots(result: SweepResult, client: Any = None) -> None:
    """One figure per swept field (:func:`plot_field`); on the Dask workers, one task per
    field, when a client is given (the figures are the sweep's serial tail otherwise)."""
    axes = _swept_fields(result)
    if not any(r.get("status") == "ok" for r in result.records.values()):
        return
    if client is not None and len(axes) > 1 and _separate_processes(client):
        futures = [client.submit(plot_field, result, axis, pure=False) for axis in axes]
        client.gather(futures)
        return
    for axis in axes:
        plot_field(result, axis)


def _separate_processes(client: Any) -> bool:
    """Whether every worker is its own process (pyplot is not thread-safe)."""
    try:
        workers = client.scheduler_info().get("workers", {})
    except Exception:  # noqa: BLE001
        return False
    return bool(workers) and not any(str(a).startswith("inproc://") for a in workers)


def plot_field(result: SweepResult, axis: str) -> None:
    """``plot_<field>.png``: each metric against ``axis``, one line per combination of the
    other fields. Integer fields get integer ticks at the swept values, a field spanning a factor
    of 8 or more a log-2 axis; a metric spanning a factor of 30 or more a log axis. Colour-blind
    safe palette (host.report.PALETTE), legend outside the axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    from neonic.host.report import PALETTE

    axes = _swept_fields(result)
    ok = [(p, result.records[p.key]["metrics"]) for p in result.points
          if result.records.get(p.key, {}).get("status") == "ok"]
    if not ok:
        return
    markers = "os^Dv<>pPX*h"
    values = list(dict.fromkeys(_label(p.values.get(axis)) for p, _ in ok))
    raw = [p.values.get(axis) for p, _ in ok]
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in raw)
    integer = numeric and all(isinstance(v, int) for v in raw)
    metrics = [m for m in result.spec.metrics if any(m in mm for _, mm in ok)]
    if not metrics:
        return
    fig, axs = plt.subplots(1, len(metrics), figsize=(6.5 * len(metrics), 4.5), squeeze=False)
    series_count = 0
    for ax, metric in zip(axs[0], metrics):
        series: dict[str, list[tuple[Any, float]]] = {}
        for p, mm in ok:
            if metric not in mm or mm[metric] is None:
                continue
            others = ", ".join(f"{k.split('.')[-1]}={_label(v)}" for k, v in p.values.items() if k != axis)
            x = p.values.get(axis) if numeric else values.index(_label(p.values.get(axis)))
            series.setdefault(others or metric, []).append((x, mm[metric]))
        for i, (label, pts) in enumerate(sorted(series.items())[:len(PALETTE)]):
            pts.sort()
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker=markers[i % len(markers)],
                    color=PALETTE[i % len(PALETTE)], label=label, linewidth=1.5)
        series_count = max(series_count, len(series))
        xs = sorted({x for pts in series.values() for x, _ in pts})
        if numeric and xs and min(xs) > 0 and max(xs) / min(xs) >= 8:
            ax.set_xscale("log", base=2)
        if integer or (numeric and len(xs) <= 12):
            ax.xaxis.set_major_locator(FixedLocator(xs))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.xaxis.set_major_formatter(ScalarFormatter())
        if not numeric:
            ax.set_xticks(range(len(values)), values, rotation=20, ha="right")
        ys = [y for pts in series.values() for _, y in pts if isinstance(y, (int, float))]
        if ys and min(ys) > 0 and max(ys) / min(ys) >= 30:
            ax.set_yscale("log")
        ax.set_xlabel(axis)
        ax.set_ylabel(metric)
        ax.grid(True, alpha=0.3)
    handles, labels = axs[0][0].get_legend_handles_labels()
    right = 1.0
    if len(handles) > 1:
        # room on the right for the legend, sized by its longest label (no second layout pass)
        legend_in = 0.35 + 0.075 * max(len(label) for label in labels)
        width = fig.get_figwidth() + legend_in
        fig.set_figwidth(width)
        right = 1.0 - legend_in / width
        fig.legend(handles, labels, fontsize=9, loc="center left", bbox_to_anchor=(right, 0.5),
                   frameon=False, title=", ".join(a.split(".")[-1] for a in axes if a != axis),
                   title_fontsize=9)
    fig.suptitle(f"sweep {result.spec.name}: {', '.join(metrics)} vs {axis}", fontsize=11)
    fig.tight_layout(rect=(0, 0, right, 1))
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in axis)
    fig.savefig(result.out / f"plot_{safe}.png", dpi=150)
    plt.close(fig)


def _label(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)
