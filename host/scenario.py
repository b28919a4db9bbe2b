"""Scenario files: one scenario (workload x system x cluster size x schedule), loaded and
validated field by field (errors name the dotted field).

``neonic run`` and ``neonic plan`` take the same scenario files and presets.

Scenario schema (TOML)::

    [scenario]
    name = "default"                 # results folder prefix
    mode = "training"                # training | inference
    pipelined = true                 # Neo's pipeline, or the serialized baseline
    iterations = 2                   # measured iterations (batches)
    warmup = 1                       # iterations simulated first and not measured
    seed = 1
    [cluster]
    nodes = 2                        # nodes of the system's topology
    gpus_per_node = 8                # optional; the topology preset's value by default
    [workload]                       # host.workloads: preset = "model-a" | a file | inline tables
    [system]                         # host.systems: preset = "zionex" plus overrides, or inline
    [planner]
    name = "neo"                     # the planner (host.planner.make_plan): neo, a baseline
                                     # (size-greedy, ...) or force:<type> (force:row-wise, ...)
    max_steps = 200                  # Neo's refinement steps at most (it stops earlier when it
                                     # converges): plans are deterministic
    time_budget_s = 2.0              # optional wall-clock safety for Neo's search (default:
                                     # none; a plan it cuts short is not reproducible)
    plan = "plan.json"               # optional: run this plan (host.planner.plan_io's format,
                                     # relative to the scenario file) instead of planning
    allreduce = "hierarchical"       # ring | double_binary_tree | hierarchical
    alltoall = "direct"              # direct | hierarchical
    [dense]
    dtype = "fp16"                   # GEMM datatype (mixed precision) of the MLPs
    [lookups]                        # optional (host.lookups): trace = "x.npz" | locality_stats +
                                     # locality_block | Zipf (alpha) for every table, or per table
                                     # in [lookups.tables.NAME]; max_lookups drawn per iteration

Lookups: one ``sim.lookups.LookupBatch`` per run (``host.lookups.build_lookups``, drawn once
in planning): a traced table's pooling and row-shard shares (planner and runtime), the HBM
cache's hit rates of host-tier shards (``sim.memory_tiers``), the SmartNIC caches and the RTL
backend all use it; ``metrics["lookup_sources"]`` says where each table's came from.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from neonic.host.systems import SystemSpec, check_known_fields, check_table, merge_tables, resolve_system
from neonic.host.workloads import WorkloadSpec, resolve_workload

__all__ = [
    "Scenario",
    "SCENARIO_PRESETS",
    "scenario_preset",
    "scenario_preset_text",
    "scenario_from_dict",
    "load_scenario",
    "default_scenario",
]

SCENARIO_PRESETS: tuple[str, ...] = ("default", "model-a-128", "model-a-1024", "zion-small", "smartnic-small", "inference-small", "rtl-small")

_SECTIONS = ("scenario", "cluster", "workload", "system", "planner", "dense", "lookups")


@dataclass(frozen=True)
class Scenario:
    """A validated scenario (see the module doc for the schema)."""

    name: str
    mode: str
    pipelined: bool
    iterations: int
    warmup: int
    seed: int
    nodes: int
    gpus_per_node: int | None
    workload: WorkloadSpec
    system: SystemSpec
    planner: str = "neo"
    planner_budget_s: float | None = None
    planner_max_steps: int | None = 200
    allreduce: str = "hierarchical"
    alltoall: str = "direct"
    dense_dtype: str = "fp16"
    plan_path: str | None = None
    lookups: Any = None  # host.lookups.LookupsSpec (None: Zipf for every table)
    source: dict[str, Any] = field(default_factory=dict)

    def resolved(self) -> dict[str, Any]:
        """The scenario with every default filled in (written to the results folder)."""
        return {
            "scenario": {"name": self.name, "mode": self.mode, "pipelined": self.pipelined,
                         "iterations": self.iterations, "warmup": self.warmup, "seed": self.seed},
            "cluster": {"nodes": self.nodes, **({"gpus_per_node": self.gpus_per_node} if self.gpus_per_node else {})},
            "workload": self.source.get("workload", {"preset": self.workload.name}),
            "system": self.system.to_dict(),
            "planner": {"name": self.planner, "allreduce": self.allreduce, "alltoall": self.alltoall,
                        **({} if self.planner_budget_s is None else {"time_budget_s": self.planner_budget_s}),
                        **({} if self.planner_max_steps is None else {"max_steps": self.planner_max_steps}),
                        **({} if self.plan_path is None else {"plan": self.plan_path})},
            "dense": {"dtype": self.dense_dtype},
            **({"lookups": self.lookups.to_dict()} if self.lookups is not None else {}),
        }


def _int(path: str, value: Any, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"{path}: expected an integer >= {lo}, got {value!r}")
    return value


def _bool(path: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{path}: expected true or false, got {value!r}")
    return value


def _choice(path: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{path}: expected one of {', '.join(choices)}, got {value!r}")
    return value


def scenario_from_dict(data: Mapping[str, Any], base: Path | None = None) -> Scenario:
    """Validate a parsed scenario TOML (errors name the dotted field)."""
    data = check_table("scenario file", data)
    check_known_fields("", data, _SECTIONS)
    sc = check_table("scenario", data.get("scenario", {}))
    check_known_fields("scenario", sc, ("name", "mode", "pipelined", "iterations", "warmup", "seed"))
    name = sc.get("name", "scenario")
    if not isinstance(name, str) or not name or any(c in name for c in "/\\ "):
        raise ValueError(f"scenario.name: expected a non-empty name without spaces or slashes, got {name!r}")
    mode = _choice("scenario.mode", sc.get("mode", "training"), ("training", "inference"))
    cl = check_table("cluster", data.get("cluster", {}))
    check_known_fields("cluster", cl, ("nodes", "gpus_per_node"))
    if "workload" not in data:
        raise ValueError("workload: required section missing (e.g. workload = \"model-a\" or [workload] preset = ...)")
    workload = resolve_workload(data["workload"], "workload", base)
    system = resolve_system(data.get("system", "zionex"), "system")
    pl = check_table("planner", data.get("planner", {}))
    check_known_fields("planner", pl, ("name", "allreduce", "alltoall", "time_budget_s", "max_steps", "plan"))
    plan_path = pl.get("plan")
    if plan_path is not None:
        if not isinstance(plan_path, str) or not plan_path:
            raise ValueError(f"planner.plan: expected the path of a plan file (JSON), got {plan_path!r}")
        if base is not None and not Path(plan_path).is_absolute():
            plan_path = str(base / plan_path)
    from neonic.host.planner.api import check_planner_name
    from neonic.host.planner.search import DEFAULT_MAX_STEPS

    planner = check_planner_name(pl.get("name", "neo"), "planner.name")
    budget = pl.get("time_budget_s")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 < budget <= 600):
        raise ValueError(f"planner.time_budget_s: expected a number in (0, 600], got {budget!r}")
    dense = check_table("dense", data.get("dense", {}))
    check_known_fields("dense", dense, ("dtype",))
    gpn = cl.get("gpus_per_node")
    return Scenario(
        name=name,
        mode=mode,
        pipelined=_bool("scenario.pipelined", sc.get("pipelined", True)),
        iterations=_int("scenario.iterations", sc.get("iterations", 2), 1),
        warmup=_int("scenario.warmup", sc.get("warmup", 1), 0),
        seed=_int("scenario.seed", sc.get("seed", 1), 0),
        nodes=_int("cluster.nodes", cl.get("nodes", 2), 1),
        gpus_per_node=None if gpn is None else _int("cluster.gpus_per_node", gpn, 1),
        workload=workload,
        system=system,
        planner=planner,
        planner_budget_s=None if budget is None else float(budget),
        planner_max_steps=_int("planner.max_steps", pl.get("max_steps", DEFAULT_MAX_STEPS), 0),
        allreduce=_choice("planner.allreduce", pl.get("allreduce", "hierarchical"), ("ring", "double_binary_tree", "hierarchical")),
        alltoall=_choice("planner.alltoall", pl.get("alltoall", "direct"), ("direct", "hierarchical")),
        dense_dtype=_choice("dense.dtype", dense.get("dtype", "fp16"), ("fp16", "bf16", "tf32", "fp32")),
        plan_path=plan_path,
        source={k: v for k, v in data.items()},
        lookups=_lookups_spec(data.get("lookups"), base),
    )


def _lookups_spec(data: Any, base: Path | None):
    from neonic.host.lookups import lookups_from_dict

    return lookups_from_dict(data, base)


def load_scenario(path: str | Path) -> Scenario:
    """Load and validate a scenario TOML file."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"CONFIG: file {str(path)!r} does not exist")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{path}: not valid TOML: {error}") from None
    return scenario_from_dict(data, base=path.parent)


def scenario_preset_text(name: str) -> str:
    if name not in SCENARIO_PRESETS:
        raise ValueError(f"--preset: unknown scenario {name!r}; expected one of {', '.join(SCENARIO_PRESETS)}")
    return resources.files("neonic.host.systems").joinpath("scenarios", f"{name}.toml").read_text(encoding="utf-8")


def scenario_preset(name: str, **overrides: Any) -> Scenario:
    """A packaged scenario (``host/systems/scenarios/NAME.toml``), optionally with overrides
    merged section by section (e.g. ``cluster={"nodes": 4}``)."""
    data = tomllib.loads(scenario_preset_text(name))
    if overrides:
        data = merge_tables(data, overrides)
    return scenario_from_dict(data)


def default_scenario() -> Scenario:
    """The scenario ``neonic run`` runs with no argument (small: seconds on 2 cores)."""
    return scenario_preset("default")

