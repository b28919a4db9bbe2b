"""The ``neonic plan`` config: which workload, on which cluster, with which memory and planner.

Schema (TOML; every field validated, errors name the dotted field)::

    workload = "model-a"          # a workload preset, a workload .toml path (relative to this
                                  # file), or an inline [workload] table (host.workloads schema;
                                  # or {preset = "...", batch_per_gpu = N} to resize a preset)
    network = "zionex"            # a sim.network preset, a network .toml path, or an inline
                                  # [network] table (sim.network's config schema)
    nodes = 16                    # optional: node count (default: the network's)
    world_size = 128              # optional: must equal nodes x GPUs per node of the topology
    gpu = "a100-40gb"             # a sim.gpu preset
    hbm_reserved_fraction = 0.15  # optional: HBM kept from embeddings (default: the GPU preset's)

    [memory]                      # optional
    dram_gib_per_node = 1400      # host DRAM given to embeddings per node (0: no DRAM tier)
    ssd_gib_per_node = 0          # SSD given to embeddings per node (0: no SSD tier)
    cache_load_factor = 0.2       # HBM cache rows per backing row for DRAM/SSD shards
    cache_hit_rate = 0.9          # share of lookups of DRAM/SSD shards served by that cache
    ssd_gbytes_per_s = 3.0

    [comm]                        # optional: AlltoAll wire formats
    index_bytes = 8               # 4 or 8
    length_bytes = 4              # 4 or 8
    dtype = "fp32"                # pooled embeddings / gradients: "fp32" or "fp16"

    [planner]                     # optional
    max_steps = 200               # the Neo search's refinement steps at most (it stops earlier
                                  # when it converges): plans are deterministic
    time_budget_s = 6.0           # optional wall-clock safety (default: none; a plan it cuts
                                  # short is not reproducible)
    baselines = true              # also plan and cost the baselines
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from neonic.host.planner.search import DEFAULT_MAX_STEPS
from neonic.host.planner.system import AlphaBetaComm, MemoryTiers, PlannerSystem
from neonic.host.workloads import WorkloadSpec, resolve_workload

__all__ = ["PlanConfig", "load_plan_config", "plan_config_from_dict", "build_system"]

_TOP = ("workload", "network", "nodes", "world_size", "gpu", "hbm_reserved_fraction", "memory", "comm", "planner")


# the shared config vocabulary (one wording of every error: neonic.sim.schema)
from neonic.sim.schema import integer as _int, number as _num  # noqa: E402


def _section(path: str, data: Mapping[str, Any], known: tuple[str, ...]) -> Mapping[str, Any]:
    value = data.get(path, {})
    if not isinstance(value, Mapping):
        raise ValueError(f"{path}: expected a table")
    for key in value:
        if key not in known:
            raise ValueError(f"{path}.{key}: unknown field; expected one of {', '.join(known)}")
    return value


@dataclass(frozen=True)
class PlanConfig:
    """A validated plan config: the workload, the planner's system, and planner options."""

    workload: WorkloadSpec
    system: PlannerSystem
    network_name: str
    time_budget_s: float | None = None
    baselines: bool = True
    max_steps: int | None = 200


def build_system(network: Any = "zionex", gpu: str = "a100-40gb", nodes: int | None = None,
                 world_size: int | None = None, memory: MemoryTiers | None = None,
                 hbm_reserved_fraction: float | None = None, base: Path | None = None,
                 **wire: Any) -> tuple[PlannerSystem, str]:
    """A :class:`PlannerSystem` from a network preset/path/table and a GPU preset."""
    from neonic.sim.gpu import gpu_preset
    from neonic.sim.network.topology import Topology

    if isinstance(network, str) and network.endswith(".toml") and base is not None and not Path(network).is_absolute():
        network = str(base / network)
    try:
        topo = Topology.from_config(network)
    except ValueError as error:
        raise ValueError(f"network: {error}") from None
    if nodes is not None:
        topo = Topology(topo.config.with_nodes(nodes))
    g = topo.gpus_per_node
    if world_size is not None and world_size != topo.num_gpus:
        raise ValueError(f"world_size: the topology holds {topo.nodes} nodes x {g} GPUs = {topo.num_gpus} ranks; "
                         f"{world_size} is refused (set nodes = {world_size // g if world_size % g == 0 else 'N'} "
                         f"for a multiple of {g})")
    spec = gpu_preset(gpu)
    if hbm_reserved_fraction is not None:
        spec = replace(spec, hbm_reserved_fraction=hbm_reserved_fraction)
    comm = AlphaBetaComm.from_topology(topo)
    system = PlannerSystem(gpu=spec, comm=comm, memory=memory or MemoryTiers(), **wire)
    return system, getattr(topo.config, "name", "network")


def plan_config_from_dict(data: Mapping[str, Any], base: Path | None = None) -> PlanConfig:
    """Validate a parsed plan config (see the module doc)."""
    if not isinstance(data, Mapping):
        raise ValueError("config: expected a TOML table")
    for key in data:
        if key not in _TOP:
            raise ValueError(f"{key}: unknown field; expected one of {', '.join(_TOP)}")
    if "workload" not in data:
        raise ValueError("workload: required field missing (a preset name, a .toml path or a [workload] table)")
    workload = resolve_workload(data["workload"], "workload", base)
    nodes = _int("nodes", data["nodes"], 1) if "nodes" in data else None
    world = _int("world_size", data["world_size"], 1) if "world_size" in data else None
    gpu = data.get("gpu", "a100-40gb")
    if not isinstance(gpu, str):
        raise ValueError(f"gpu: expected a GPU preset name, got {gpu!r}")
    reserve = _num("hbm_reserved_fraction", data["hbm_reserved_fraction"], 0.0, 0.99) if "hbm_reserved_fraction" in data else None
    m = _section("memory", data, ("dram_gib_per_node", "ssd_gib_per_node", "cache_load_factor", "cache_hit_rate", "ssd_gbytes_per_s"))
    memory = MemoryTiers(
        dram_gib_per_node=_num("memory.dram_gib_per_node", m.get("dram_gib_per_node", 0.0), 0.0),
        ssd_gib_per_node=_num("memory.ssd_gib_per_node", m.get("ssd_gib_per_node", 0.0), 0.0),
        cache_load_factor=_num("memory.cache_load_factor", m.get("cache_load_factor", 0.2), 0.0, 1.0, lo_open=True),
        cache_hit_rate=_num("memory.cache_hit_rate", m.get("cache_hit_rate", 0.9), 0.0, 1.0),
        ssd_gbytes_per_s=_num("memory.ssd_gbytes_per_s", m.get("ssd_gbytes_per_s", 3.0), 0.0, lo_open=True),
    )
    c = _section("comm", data, ("index_bytes", "length_bytes", "dtype"))
    wire = {}
    for key in ("index_bytes", "length_bytes"):
        if key in c:
            if c[key] not in (4, 8) or isinstance(c[key], bool):
                raise ValueError(f"comm.{key}: expected 4 or 8, got {c[key]!r}")
            wire[key] = c[key]
    if "dtype" in c:
        if c["dtype"] not in ("fp32", "fp16"):
            raise ValueError(f"comm.dtype: expected fp32 or fp16, got {c['dtype']!r}")
        wire["comm_dtype"] = c["dtype"]
    p = _section("planner", data, ("time_budget_s", "baselines", "max_steps"))
    budget = None
    if "time_budget_s" in p:
        budget = _num("planner.time_budget_s", p["time_budget_s"], 0.0, 600.0, lo_open=True)
    max_steps = _int("planner.max_steps", p.get("max_steps", DEFAULT_MAX_STEPS), 0)
    baselines = p.get("baselines", True)
    if not isinstance(baselines, bool):
        raise ValueError(f"planner.baselines: expected true or false, got {baselines!r}")
    try:
        system, name = build_system(data.get("network", "zionex"), gpu, nodes, world, memory, reserve, base, **wire)
    except ValueError as error:
        msg = str(error)
        if msg.startswith("gpu:") or msg.startswith("network") or msg.startswith("world_size"):
            raise
        raise ValueError(f"network: {msg}") from None
    return PlanConfig(workload, system, name, budget, baselines, max_steps)


def load_plan_config(path: str | Path) -> PlanConfig:
    """Load a plan config TOML file (relative paths resolve against its folder)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"CONFIG: no such file: {path}")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"CONFIG: {path}: not valid TOML: {error}") from None
    return plan_config_from_dict(data, base=path.parent)
