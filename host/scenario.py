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
    bucket_mib = 25.0                # DDP gradient bucket cap (MiB; 0 = one AllReduce after
                                     # the backward), host.gradients
    first_bucket_mib = 1.0           # DDP's first-bucket cap (MiB)
    optimizer = "after_last"         # after_last | per_bucket: the dense optimizer's steps
    next_batch = "after_step"        # after_step (PyTorch DDP's program order) | when_ready
    [comm_precision]                 # wire precision of each float collective, fp32|fp16|bf16
    forward = "fp16"                 # pooled AlltoAll and row-wise reduce-scatter
    backward = "fp16"                # gradient AlltoAll and all-gather
    allreduce = "fp16"               # the dense gradients' AllReduce
                                     # (default of each: the system's comm_dtype; the wire
                                     # bytes follow, 2 for fp16/bf16; casts fused into the
                                     # packing, no extra kernel: ASSUMPTION)
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
    "COMM_PRECISIONS",
    "SCENARIO_PRESETS",
    "scenario_preset",
    "scenario_preset_text",
    "scenario_from_dict",
    "load_scenario",
    "default_scenario",
]

SCENARIO_PRESETS: tuple[str, ...] = ("default", "model-a-128", "model-a-1024", "zion-small", "smartnic-small", "inference-small", "rtl-small", "gh200-small", "mi300a-small")

_SECTIONS = ("scenario", "cluster", "workload", "system", "planner", "dense", "comm_precision", "lookups")
#: Wire precisions of the float collectives and their bytes per element.
COMM_PRECISIONS: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2}


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
    buckets: Any = None  # host.gradients.BucketConfig (DDP's defaults when None)
    comm_precision: dict[str, str] = field(default_factory=dict)  # forward/backward/allreduce

    def precision(self, collective: str) -> str:
        """Wire precision of ``forward``, ``backward`` or ``allreduce`` (see the module doc)."""
        return self.comm_precision.get(collective, self.system.comm_dtype)

    def wire_bytes(self, collective: str) -> int:
        return COMM_PRECISIONS[self.precision(collective)]

    def bucket_config(self) -> Any:
        """The dense gradients' bucketing (``host.gradients.BucketConfig``)."""
        from neonic.host.gradients import BucketConfig

        return self.buckets or BucketConfig()

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
            "dense": {"dtype": self.dense_dtype, **self._bucket_fields()},
            "comm_precision": {k: self.precision(k) for k in ("forward", "backward", "allreduce")},
            **({"lookups": self.lookups.to_dict()} if self.lookups is not None else {}),
        }

    def _bucket_fields(self) -> dict[str, Any]:
        b = self.bucket_config()
        return {"bucket_mib": b.bucket_mib, "first_bucket_mib": b.first_bucket_mib, "optimizer": b.optimizer,
                "next_batch": b.next_batch}


# the shared config vocabulary (one wording of every error: neonic.sim.schema)
from neonic.sim.schema import boolean as _bool, choice as _choice, integer as _int  # noqa: E402


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
    if budget is not None:
        from neonic.sim.schema import number
        number("planner.time_budget_s", budget, 0.0, 600.0, lo_open=True)
    dense = check_table("dense", data.get("dense", {}))
    check_known_fields("dense", dense, ("dtype", "bucket_mib", "first_bucket_mib", "optimizer", "next_batch"))
    from neonic.host.gradients import DDP_BUCKET_CAP_MIB, DDP_FIRST_BUCKET_MIB, BucketConfig

    buckets = BucketConfig(bucket_mib=dense.get("bucket_mib", DDP_BUCKET_CAP_MIB),
                           first_bucket_mib=dense.get("first_bucket_mib", DDP_FIRST_BUCKET_MIB),
                           optimizer=dense.get("optimizer", "after_last"),
                           next_batch=dense.get("next_batch", "after_step"))
    cp = check_table("comm_precision", data.get("comm_precision", {}))
    check_known_fields("comm_precision", cp, ("forward", "backward", "allreduce"))
    comm_precision = {k: _choice(f"comm_precision.{k}", v, tuple(COMM_PRECISIONS)) for k, v in cp.items()}
    gpn = cl.get("gpus_per_node")
    scenario = Scenario(
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
        buckets=buckets,
        comm_precision=comm_precision,
        lookups=_lookups_spec(data.get("lookups"), base),
    )
    from neonic.host.limits import check_scenario_size
    check_scenario_size(scenario)  # sizes that cannot fit are refused before anything is built
    return scenario


def _lookups_spec(data: Any, base: Path | None):
    from neonic.host.lookups import lookups_from_dict

    return lookups_from_dict(data, base)


def load_scenario(path: str | Path) -> Scenario:
    """Load and validate a scenario TOML file."""
    from neonic.sim.schema import load_toml
    path = Path(path)
    return scenario_from_dict(load_toml(path, "scenario file"), base=path.parent)


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

