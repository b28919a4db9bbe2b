"""A cluster run: one scenario (workload x system x cluster size x schedule) on the engine.

:func:`load_scenario` / :func:`scenario_from_dict` validate a scenario TOML field by field;
:class:`ClusterRun` plans the embedding sharding (``host.planner``), derives one iteration's
per-rank work and AlltoAllv matrices from the plan (``host.planner.work.derive_iteration``; the
runtime never re-derives communication sizes), turns them into an op graph
(``host.schedule``) and executes it on one :class:`~sim.engine.Engine` whose resources are the
GPUs (``sim.resources.GPUDevice``: SMs + HBM, with the C3 levers), the PCIe host links, the CPU
sockets (Zion), the SmartNICs' units (``sim.nic``) and the network's links (``sim.network``).

Scenario schema (TOML; errors name the dotted field)::

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

Memory tiers: shards that HBM cannot hold live in host DRAM (``system.host.dram_gib_per_node``)
behind an HBM software cache (``cache_load_factor``, ``cache_ways``, ``cache_policy``); the
cache's misses fetch rows during the forward and write them back during the backward as flows
on the topology's GPU-host links, which also carry the input copies and SmartNIC fills (the
one PCIe model: ``sim.memory_tiers.HostLink``). ``metrics["memory_tiers"]`` has bytes per
tier, the cache's lookups, hits and misses per iteration, and the links' bytes and
utilisation; the timeline has a ``gpuN/pcie`` track.

Modelling choices (each an ASSUMPTION a user can see in code and docs):
    * the row-wise reduce-scatter (``rs``) and its backward all-gather (``ag``) matrices travel
      with the pooled and gradient AlltoAlls (same bytes, one collective each);
    * the dense AllReduce carries the MLPs' parameters (computed from the workload's widths) plus
      the data-parallel tables' bytes from the plan, in the system's ``comm_dtype``;
    * the dot interaction over F features gives F(F-1)/2 + d outputs, capped at
      :data:`MAX_INTERACTION_WIDTH` (production models with 1000s of features compress them);
    * a collective holds its GPU-side share (SMs unless on the copy engines, HBM) on every rank
      for its whole network duration; compute kernels share what is left. Collectives are not
      slowed by the GPU (so ``streams.comm_priority`` only orders kernels between streams).

The SmartNIC system (``embeddings = "nic"``): :func:`nic_effects` measures the NIC caches' hit
rates on the run's lookups (``sim.nic`` on the ``sim.lookups.LookupBatch`` of ``host.lookups``) and applies each
mechanism that is on to the iteration's work: fewer GPU lookups, NIC gather/pool and cache
work, PCIe fills, changed AlltoAll matrices (its docstring states every assumption). Each
GPU's NIC is a :class:`sim.nic.NIC` on the engine (units ``cache``, ``gather``,
``packetizer``: one timeline track each); the embedding forward runs the GPU kernel, the NIC
units and the PCIe transfers side by side, and every AlltoAll waits for the NICs' packetizers
as well as the network. Hit rates go to ``metrics["cache_hit_rates"]`` (``nic_local``,
``nic_remote``), the rest to ``metrics["nic"]``.

Planning: ``[planner] name`` picks the planner (``host.planner.make_plan``); Neo's search ends
at convergence or after ``max_steps`` steps, so a run is deterministic for its seed;
``time_budget_s`` (off by default) adds a wall-clock bound (the plan's notes in the metrics
say how many steps ran). ``metrics["wall_breakdown_s"]`` says where the
simulation's own wall time went (planning, building, engine).
"""

from __future__ import annotations

import math
import time
import tomllib
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from neonic.host.schedule import COLLECTIVE_PHASES, Op, OpGraph, ScheduleRunner, build_graph, phase_breakdown
from neonic.host.systems import (SystemSpec, check_known_fields, check_table, merge_tables,
                          resolve_system)
from neonic.host.workloads import WorkloadSpec, resolve_workload
from neonic.sim.engine import Engine, ps_from_s, s_from_ps
from neonic.sim.gpu import KernelCost, embedding_backward_cost, embedding_forward_cost, interaction_cost, mlp_cost
from neonic.sim.resources import CPU_PRESETS, GPUDevice, ServerPool, cpu_embedding_backward_s, cpu_embedding_forward_s

__all__ = [
    "MAX_INTERACTION_WIDTH",
    "Scenario",
    "ClusterRun",
    "RunResult",
    "SCENARIO_PRESETS",
    "scenario_preset",
    "scenario_from_dict",
    "load_scenario",
    "default_scenario",
    "dense_costs",
]

MAX_INTERACTION_WIDTH = 8192
SCENARIO_PRESETS: tuple[str, ...] = ("default", "model-a-128", "model-a-1024", "zion-small", "smartnic-small", "inference-small", "rtl-small")

_SECTIONS = ("scenario", "cluster", "workload", "system", "planner", "dense", "lookups")


# ------------------------------------------------------------------------------ the scenario
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
    source: dict[str, Any] = field(default_factory=dict)
    lookups: Any = None  # host.lookups.LookupsSpec (None: Zipf for every table)

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
                        **({} if self.planner_max_steps is None else {"max_steps": self.planner_max_steps})},
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
    check_known_fields("planner", pl, ("name", "allreduce", "alltoall", "time_budget_s", "max_steps"))
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


# ------------------------------------------------------------------------------- dense costs
@dataclass(frozen=True)
class DenseCosts:
    """Per-rank costs of the dense (data-parallel) part of one iteration."""

    bot_fwd: KernelCost
    inter_fwd: KernelCost
    top_fwd: KernelCost
    top_bwd: KernelCost
    inter_bwd: KernelCost
    bot_bwd: KernelCost
    dense_opt: KernelCost
    params: int
    interaction_width: int


def dense_costs(system: SystemSpec, workload: WorkloadSpec, dtype: str = "fp16") -> DenseCosts:
    """MLP, interaction and optimizer-step costs on one GPU for one local batch."""
    gpu = system.gpu_spec
    b = workload.batch_per_gpu
    d = workload.dense
    bottom = list(d.bottom_mlp)
    d_out = bottom[-1]
    features = len(workload.tables) + 1
    dims = sum(t.dim for t in workload.tables)
    params = sum(i * o + o for i, o in zip(bottom[:-1], bottom[1:]))
    if d.interaction == "dot":
        width = min(features * (features - 1) // 2 + d_out, MAX_INTERACTION_WIDTH)
        inter_f = interaction_cost(gpu, b, features, d_out, dtype)
        inter_b = interaction_cost(gpu, b, features, d_out, dtype, backward=True)
    else:
        width = min(dims + d_out, MAX_INTERACTION_WIDTH * 4)
        inter_f = KernelCost()
        inter_b = KernelCost()
        for _ in range(d.dcn_layers):
            inter_f = inter_f + mlp_cost(gpu, b, [width, d.dcn_low_rank, width], dtype)
            inter_b = inter_b + mlp_cost(gpu, b, [width, d.dcn_low_rank, width], dtype, backward=True)
            params += 2 * width * d.dcn_low_rank + width
    top = [width, *d.top_mlp]
    params += sum(i * o + o for i, o in zip(top[:-1], top[1:]))
    # the optimizer step streams weights, gradients and two moments (fp32) once
    step_bytes = params * 4 * 4
    step = KernelCost(hbm_bytes=step_bytes, memory_s=step_bytes / (gpu.hbm_bytes_per_s * gpu.efficiency.hbm_stream),
                      overhead_s=gpu.efficiency.launch_overhead_s)
    return DenseCosts(
        bot_fwd=mlp_cost(gpu, b, bottom, dtype),
        inter_fwd=inter_f,
        top_fwd=mlp_cost(gpu, b, top, dtype),
        top_bwd=mlp_cost(gpu, b, top, dtype, backward=True),
        inter_bwd=inter_b,
        bot_bwd=mlp_cost(gpu, b, bottom, dtype, backward=True),
        dense_opt=step,
        params=params,
        interaction_width=width,
    )


# ---------------------------------------------------------------------------------- payloads
@dataclass(frozen=True)
class Collective:
    """A collective op's payload: kind, size matrix (AlltoAllv) or bytes (AllReduce)."""

    kind: str  # "alltoallv" | "allreduce"
    matrix: np.ndarray | None = None
    nbytes: float = 0.0
    estimate_s: float = 0.0  # the planner's alpha-beta estimate (GPU-side hold time)
    nic_ps: tuple[int, ...] | None = None  # SmartNIC: each rank's packetizer time for its inter-node bytes


@dataclass(frozen=True)
class CPUJob:
    node: int
    seconds: float


@dataclass(frozen=True)
class Copy:
    """Bytes between a GPU and its node's host memory over the GPU-host link."""

    nbytes: float
    to_gpu: bool = True
    kind: str = "input"


@dataclass(frozen=True)
class NICJob:
    """An embedding op on the SmartNIC system: the NIC units' durations (ps), the GPU kernel
    that remains, and bytes over the GPU's PCIe link (cache fills, rows to the GPU)."""

    units: tuple[tuple[str, int], ...]
    gpu: KernelCost
    pcie_bytes: float = 0.0
    to_gpu: bool = False       # direction of the PCIe bytes (host memory -> GPU, or GPU -> NIC/host)
    kind: str = "nic"          # what the bytes are (metrics): nic | tier_miss


# ------------------------------------------------------------------------------ the SmartNIC
#: Zipf exponents of the default lookups (``sim.lookups``; a scenario's ``[lookups]`` section
#: or a table's trace / locality statistics replace them: ``host.lookups``).
from neonic.sim.lookups import ZIPF_ALPHA  # noqa: E402


def nic_config(spec) -> "NICConfig":
    """``sim.nic.NICConfig`` from a system's ``[nic]`` table."""
    from neonic.sim.nic import NICConfig

    return NICConfig(clock_hz=spec.clock_mhz * 1e6, datapath_bytes=spec.datapath_bytes,
                     local_cache_bytes=spec.local_cache_mib * 2**20, remote_cache_bytes=spec.remote_cache_mib * 2**20,
                     cache_ways=spec.cache_ways, memory_bytes_per_s=spec.memory_gbytes_per_s * 1e9,
                     pool_on_nic=spec.pool_on_nic, reorder=spec.reorder)


@dataclass
class NICEffects:
    """What the SmartNICs change in one iteration (per rank unless said otherwise).

    ``matrices``: the AlltoAllv matrices after the NICs (same keys as the plan's);
    ``gpu_lookups[r][i]``: forward lookups left to the GPU for rank r's i-th shard kernel;
    ``fwd_units[r]``: NIC unit durations (ps) in the embedding forward; ``fwd_pcie_bytes`` /
    ``bwd_pcie_bytes``: PCIe bytes between GPU and NIC (cache fills, write-through, rows to
    the GPU); ``gpu_pool_bytes``: unpooled row bytes a GPU pools before the interaction;
    ``hit_rates`` and ``figures`` for the metrics.
    """

    cfg: Any
    matrices: dict[str, np.ndarray]
    gpu_lookups: list[list[float]]
    fwd_units: list[tuple[tuple[str, int], ...]]
    fwd_pcie_bytes: np.ndarray
    bwd_pcie_bytes: np.ndarray
    gpu_pool_bytes: np.ndarray
    hit_rates: dict[str, float]
    figures: dict[str, Any]
    lookups: Any = None  # the sim.lookups.LookupBatch the caches were measured on (the RTL backend's too)

    def packetizer_ps(self, matrix: np.ndarray, gpus_per_node: int) -> tuple[int, ...]:
        """Each rank's packetizer time for its inter-node messages of ``matrix`` (one RDMA
        WRITE per destination; intra-node bytes go over NVLink, not the NIC)."""
        from neonic.sim.engine import ps_from_s
        from neonic.sim.nic import packetizer_time_s

        world = matrix.shape[0]
        node = np.arange(world) // gpus_per_node
        out = []
        for r in range(world):
            msgs = matrix[r][node != node[r]]
            out.append(ps_from_s(packetizer_time_s(self.cfg, msgs[msgs > 0])))
        return tuple(out)


def nic_effects(sc: "Scenario", plan, work, psys) -> NICEffects:
    """The SmartNIC mechanisms applied to one iteration's work (see the module doc).

    Local cache (``local_cache_mib`` > 0), on each owner's NIC, warm: it serves only the lookups
    whose indices pass the NIC, those from requesters on other nodes (same-node requesters use
    NVLink; data-parallel replicas serve their own GPU). Hits are gathered by the NIC from its
    memory, misses by the GPU from HBM; a miss costs the cache one tag probe (no fill from NIC
    memory, no row: ``sim.nic.cache_lookup_time_s(misses_elsewhere=True)``). Inference: the
    tables are read-only, so the cache holds profiled hot rows and is never refilled
    (``trace_stats(policy="static")``; nothing crosses PCIe for it). Training: LRU, every miss
    fills the cache (its row crosses PCIe, GPU to NIC) and the optimizer writes updated cached
    rows through. With ``pool_on_nic`` the NIC pools its hits into partial pools, merged on the
    NIC with the GPU's partials, which pass the NIC on their way to the same requesters (no
    extra bytes); without it the hit rows themselves go to those requesters, whose GPUs pool
    them.

    Remote cache (``remote_cache_mib`` > 0), on each requester's NIC, for tables owned on other
    nodes: the requester fetches rows instead of pooled vectors: hits come from its cache, misses
    arrive as raw rows from the owners (and fill the cache), and the requester pools them on
    its NIC (``pool_on_nic``) or ships them over PCIe to its GPU. Inference: warm (profiled hot
    rows, never refilled), and only the misses' indices cross in the input AlltoAll. Training: the rows change every step, so the
    cache is invalidated per batch (cold: reuse within the batch only) and the input and
    gradient AlltoAlls are unchanged (owners need every index for the backward).

    Reorder (``reorder``): each batch's bags are reordered (``sim.nic.reorder_bags``) before the
    caches see them; without a cache it changes nothing. Pooling on the NIC without a cache has
    nothing to pool. Row-wise partial pools (``rs``/``ag``) are left as they are.
    """
    from neonic.sim.engine import ps_from_s
    from neonic.sim.nic import Segment, adjacent_reuse, cache_lookup_time_s, gather_time_s, trace_stats
    from neonic.host.planner.plan import ShardingType

    cfg = nic_config(sc.system.nic)
    wl = sc.workload
    world, gpn = work.world_size, work.gpus_per_node
    alpha = (sc.lookups.alpha if sc.lookups is not None and sc.lookups.alpha is not None
             else ZIPF_ALPHA[sc.mode])
    tables = {t.name: t for t in wl.tables}
    samples = sc.system.nic.trace_samples
    comm_b = psys.comm_bytes
    m = {k: v.copy() for k, v in work.matrices.items()}
    node = np.arange(world) // gpn
    inter = node[:, None] != node[None, :]
    # per rank: (table, shard, kernel) in kernel order
    owned: list[list[tuple[str, Any, Any]]] = [[] for _ in range(world)]
    for t in wl.tables:
        tp = plan.tables[t.name]
        for shard, k in zip(tp.shards, work.tables[t.name].kernels):
            owned[k.rank].append((t.name, shard, k))
    dp_table = {t.name: plan.tables[t.name].sharding == ShardingType.DATA_PARALLEL for t in wl.tables}
    gpu_lookups = [[float(k.lookups) for k in ks] for ks in work.kernels]
    fwd_pcie = np.zeros(world)
    bwd_pcie = np.zeros(world)
    gpu_pool = np.zeros(world)
    nic_rows = [[] for _ in range(world)]      # gather/pool unit work: (dim, elem_bytes, bags, rows per bag)
    cache_lookups = np.zeros(world)
    cache_hits = np.zeros(world)               # of cache_lookups: the hits (local and remote caches)
    cache_row_bytes = np.zeros(world)          # sum of the looked-up rows' bytes (mean row = / lookups)
    figures: dict[str, Any] = {"pool_on_nic": cfg.pool_on_nic, "reorder": cfg.reorder,
                               "local_cache_mib": sc.system.nic.local_cache_mib,
                               "remote_cache_mib": sc.system.nic.remote_cache_mib, "zipf_alpha": alpha,
                               "lookups_traced": 0}
    hit_rates: dict[str, float] = {}
    # forward lookups that reach each owner shard (remote-cache hits never do)
    reach = [[float(k.lookups) for k in ks] for ks in work.kernels]
    memo: dict = {}
    reuse_probe: tuple[np.ndarray, np.ndarray] | None = None

    batch = getattr(psys, "lookups", None)
    if batch is None:
        from neonic.host.lookups import LookupsSpec, build_lookups

        batch = build_lookups(wl, sc.lookups or LookupsSpec(), world=world, mode=sc.mode, seed=sc.seed,
                              min_bags=samples)

    def segment(key: str, name: str, bags: np.ndarray, row_start: int, row_end: int, row_bytes: int) -> Segment:
        """The run's lookups of table ``name`` from the bags selected by ``bags`` (a mask over
        the requesting ranks' bags) that fall in rows ``[row_start, row_end)``."""
        lengths, rows = batch[name].select(bags, row_start, row_end)
        return Segment(key, lengths, rows, row_end - row_start, row_bytes)

    h_of: dict[str, float] = {}             # remote-cache hit rate per table (requesters)
    # ---- remote caches (requesters)
    if cfg.remote_cache and world > gpn:
        warm = sc.mode == "inference"
        passes = 2 if warm else 1
        b = wl.batch_per_gpu
        remote_tables = [t for t in wl.tables if plan.tables[t.name].sharding != ShardingType.DATA_PARALLEL]
        stats: dict[str, Any] = {}
        for requester in sorted({0, world - 1}):
            mine = [t for t in remote_tables if t.name not in stats
                    and any(node[s.rank] != node[requester] for s in plan.tables[t.name].shards)]
            if not mine:
                continue
            segs = []
            for t in mine:
                # the bags of requesters on this requester's node (all bags if too few are drawn)
                mask = node[batch[t.name].requester] == node[requester]
                if np.count_nonzero(mask) < 4:
                    mask = np.ones_like(mask)
                segs.append(segment(t.name, t.name, mask, 0, t.rows, t.row_bytes))
            st = trace_stats(segs, cfg.remote_cache_bytes, cfg.cache_ways, warm=warm, reorder=cfg.reorder,
                             policy="static" if warm else "lru")
            stats.update(st.segments)
        h_of = {name: ss.hit_rate for name, ss in stats.items()}
        total = sum(ss.lookups for ss in stats.values())
        hit_rates["nic_remote"] = sum(ss.hit_rate * ss.lookups for ss in stats.values()) / total if total else 0.0
        inter_frac = (world - gpn) / world
        remote_rows = np.zeros(world)       # rows each requester pools for remote tables
        for r in range(world):
            pooled_total = raw_miss = 0.0
            for i, (name, shard, k) in enumerate(owned[r]):
                if name not in h_of:
                    continue
                h = h_of[name]
                remote_l = k.lookups * inter_frac
                reach[r][i] -= remote_l * h   # served from the requesters' remote caches
                raw_miss += remote_l * (1 - h) * k.row_bytes
                pooled_total += k.pooled_rows * inter_frac * shard.cols * comm_b
            if pooled_total > 0:
                # inter-node pooled vectors become the missed rows
                m["pooled"][r] = np.where(inter[r], m["pooled"][r] * (raw_miss / pooled_total), m["pooled"][r])
        # the requester pools every remote row (hits from its cache, misses as they arrive)
        for t in remote_tables:
            if t.name not in h_of:
                continue
            homes = {int(node[s.rank]) for s in plan.tables[t.name].shards}
            off_node = np.ones(world, bool) if len(homes) > 1 else node != next(iter(homes))
            rows_per_req = b * t.pooling
            for q in np.nonzero(off_node)[0]:
                remote_rows[q] += rows_per_req * t.row_bytes
                cache_lookups[q] += rows_per_req
                cache_hits[q] += rows_per_req * h_of[t.name]
                cache_row_bytes[q] += rows_per_req * t.row_bytes
                if cfg.pool_on_nic:
                    nic_rows[q].append((t.dim, t.elem_bytes, b, t.pooling))
        if not cfg.pool_on_nic:
            fwd_pcie += remote_rows
            gpu_pool += remote_rows
        if warm:
            h_all = hit_rates["nic_remote"]
            m["input"] = np.where(inter, m["input"] * (1 - h_all), m["input"])
    # ---- local caches (owners): only lookups that arrive from other nodes pass the NIC
    local_hits = local_lookups = 0.0
    if cfg.local_cache:
        inference = sc.mode == "inference"
        off_node = (world - gpn) / world            # share of a shard's requesters on other nodes
        for r in range(world):
            # per shard: lookups and bags that reach the owner's NIC from other nodes
            nic_l = [0.0 if dp_table[name] else k.lookups * off_node * (1 - h_of.get(name, 0.0))
                     for name, _, k in owned[r]]
            nic_b = [0.0 if dp_table[name] else k.pooled_rows * off_node for name, _, k in owned[r]]
            segs = []
            for i, (name, shard, k) in enumerate(owned[r]):
                if nic_b[i] <= 0:
                    continue
                # the bags of requesters on other nodes, their lookups in this shard's rows
                mask = node[batch[name].requester] != node[r]
                segs.append(segment(f"{name}#{i}", name, mask, shard.row_start, shard.row_end, k.row_bytes))
            if reuse_probe is None and segs:
                big = max(segs, key=lambda x: len(x.rows))
                reuse_probe = (big.lengths, big.rows)
            # inference: read-only tables, a profiled hot-row cache that stays warm (no fills);
            # training: LRU, every miss fills it and updated cached rows are written through
            st = trace_stats(segs, cfg.local_cache_bytes, cfg.cache_ways, warm=True, reorder=cfg.reorder,
                             policy="static" if inference else "lru")
            hits_r = 0.0
            raw_hit_bytes = 0.0
            for i, (name, shard, k) in enumerate(owned[r]):
                if nic_b[i] <= 0:
                    continue
                ss = st.segments.get(f"{name}#{i}")
                h = ss.hit_rate if ss else 0.0
                hits = nic_l[i] * h
                hits_r += hits
                cache_row_bytes[r] += nic_l[i] * k.row_bytes
                gpu_lookups[r][i] = reach[r][i] - hits
                if not inference:
                    fwd_pcie[r] += (nic_l[i] - hits) * k.row_bytes                          # fills
                    bwd_pcie[r] += k.unique_rows * off_node * h * k.row_bytes               # write-through
                bags_hit = nic_b[i] * (ss.bags_with_hit if ss else 0.0)
                if cfg.pool_on_nic:
                    # partial pools merge on the NIC with the GPU's partials, which pass the NIC
                    # on their way to the same requesters: no extra bytes anywhere
                    nic_rows[r].append((shard.cols, k.row_bytes // max(1, shard.cols), bags_hit, hits / bags_hit if bags_hit else 0.0))
                else:
                    raw_hit_bytes += hits * k.row_bytes
            local_hits += hits_r
            local_lookups += sum(nic_l)
            cache_lookups[r] += sum(nic_l)
            cache_hits[r] += hits_r
            row = work.matrices["pooled"][r] * inter[r]
            if raw_hit_bytes > 0 and row.sum() > 0:
                # without pooling on the NIC the hit rows themselves go to the requesters on
                # other nodes, whose GPUs pool them
                extra = row * (raw_hit_bytes / row.sum())
                m["pooled"][r] += extra
                gpu_pool += extra    # gradients still travel pooled (grad AlltoAll unchanged)
        hit_rates["nic_local"] = float(local_hits / local_lookups) if local_lookups else 0.0
    else:
        gpu_lookups = [list(x) for x in reach]
    # ---- the units' times
    units: list[tuple[tuple[str, int], ...]] = []
    for r in range(world):
        g = gather_time_s(cfg, nic_rows[r], seed=sc.seed, memo=memo) if nic_rows[r] else 0.0
        n = cache_lookups[r]
        c = (cache_lookup_time_s(cfg, n, hit_rate=min(1.0, cache_hits[r] / n), row_bytes=cache_row_bytes[r] / n,
                                 misses_elsewhere=True) if n > 0 else 0.0)
        units.append(tuple((u, ps_from_s(t)) for u, t in (("cache", c), ("gather", g)) if t > 0))
    if reuse_probe is not None:
        lengths, rows = reuse_probe
        base = adjacent_reuse(lengths, rows, cfg.reuse_window)
        after = adjacent_reuse(lengths, rows, cfg.reuse_window, reorder=True)
        figures["reuse_window"] = cfg.reuse_window
        figures["adjacent_reuse"] = base
        figures["adjacent_reuse_reordered"] = after
    figures["pcie_fwd_bytes_per_rank"] = float(fwd_pcie.mean())
    figures["pcie_bwd_bytes_per_rank"] = float(bwd_pcie.mean())
    figures["gpu_forward_lookups_per_rank"] = float(np.mean([sum(x) for x in gpu_lookups]))
    figures["pooled_a2a_bytes"] = float(m["pooled"].sum())
    figures["lookups_traced"] = int(batch.lookups)
    return NICEffects(cfg, m, gpu_lookups, units, fwd_pcie, bwd_pcie, gpu_pool, hit_rates, figures, lookups=batch)


# --------------------------------------------------------------------------------- the run
@dataclass
class RunResult:
    """Everything a report needs from one run."""

    scenario: Scenario
    graph: OpGraph
    metrics: dict[str, Any]
    breakdown: Any
    tracks: dict[str, list[tuple[int, int, str]]]
    utilization: dict[str, float]
    link_class_bytes: dict[str, float]
    wall_s: float


Progress = Callable[[str, float], None]


class ClusterRun:
    """Plan, build and execute one scenario. ``progress(message, fraction)`` reports along.

    ``nic_backend`` (SmartNIC systems): a callable ``(run, nic_effects, work) -> nic_effects``
    that replaces the timing-model backend's NIC figures, e.g. ``sim.cosim.RTLNICBackend``
    (the NICs co-simulated in RTL; ``neonic run --backend rtl``); None: the timing models.
    """

    def __init__(self, scenario: Scenario, progress: Progress | None = None,
                 nic_backend: Callable[[Any, Any, Any], Any] | None = None) -> None:
        self.scenario = scenario
        self.progress = progress or (lambda message, fraction: None)
        self.nic_backend = nic_backend

    # -------------------------------------------------------------------------- preparation
    def _topology(self):
        from neonic.sim.network.topology import Topology

        sc = self.scenario
        from neonic.sim.network.config import load_preset

        try:
            cfg = load_preset(sc.system.network).with_nodes(sc.nodes)
        except ValueError as error:
            raise ValueError(f"system.network: {error}") from None
        if sc.gpus_per_node is not None:
            # a smaller (or larger) node of the same links: validated by the network config
            try:
                cfg = cfg.with_gpus_per_node(sc.gpus_per_node)
            except ValueError as error:
                raise ValueError(f"cluster.gpus_per_node: {error}") from None
        # the node's host-memory link (system.host.pcie_gbytes_per_s: PCIe on ZionEX) is the
        # bandwidth of the topology's GPU-host links: one figure for copies, host-tier misses,
        # the planner's tier cost and the metrics
        from dataclasses import replace as _replace

        cfg = _replace(cfg, host_link=_replace(cfg.host_link, bandwidth_gbps=sc.system.host.pcie_gbytes_per_s * 8))
        return Topology(cfg)

    def _plan(self, topo):
        from neonic.host.planner.system import AlphaBetaComm, MemoryTiers, PlannerSystem

        sc = self.scenario
        comm = _planner_comm(topo)
        memory = _memory_tiers(sc.system, topo)
        from neonic.host.lookups import LookupsSpec, build_lookups

        self.lookups = build_lookups(sc.workload, sc.lookups or LookupsSpec(), world=topo.nodes * topo.gpus_per_node,
                                     mode=sc.mode, seed=sc.seed,
                                     min_bags=sc.system.nic.trace_samples if sc.system.embeddings == "nic" else 0)
        psys = PlannerSystem(gpu=sc.system.gpu_spec, comm=comm, memory=memory, comm_dtype=sc.system.comm_dtype,
                             lookups=self.lookups)
        from neonic.host.planner.api import make_plan

        plan = make_plan(sc.workload, psys, sc.planner, max_steps=sc.planner_max_steps,
                         time_budget_s=sc.planner_budget_s)
        self.planner_system = psys
        return plan, psys

    def run(self) -> RunResult:
        from neonic.host.planner.work import derive_iteration

        t0 = time.perf_counter()
        sc = self.scenario
        self.progress("topology", 0.02)
        topo = self._topology()
        self.progress("planning the sharding", 0.05)
        t_plan = time.perf_counter()
        plan, psys = self._plan(topo)
        t_built = time.perf_counter()
        self.progress("deriving one iteration's work", 0.2)
        work = derive_iteration(plan, sc.workload, psys)
        world = work.world_size
        self.plan, self.work, self.topology = plan, work, topo
        dense = dense_costs(sc.system, sc.workload, sc.dense_dtype)
        payloads = self._payloads(work, dense, psys, topo)
        total_its = sc.warmup + sc.iterations
        emb_stream = {"gpu": "compute", "cpu": "cpu", "nic": "nic"}[sc.system.embeddings]
        if sc.system.embeddings == "nic":
            emb_stream = "compute"  # the NIC works inside the op; the remaining kernel is the GPU's
        self.progress("building the op graph", 0.3)
        graph = build_graph(world, total_its, payloads, mode=sc.mode, pipelined=sc.pipelined, emb_stream=emb_stream)
        self.progress(f"simulating {total_its} iterations on {world} GPUs", 0.35)
        engine, backend, resources_ = self._build_resources(topo, world)
        done_ops = [0]
        n_ops = len(graph.ops)

        def on_op_done(op: Op) -> None:
            done_ops[0] += 1
            if done_ops[0] % max(1, n_ops // 20) == 0:
                self.progress(f"simulated {done_ops[0]}/{n_ops} ops", 0.35 + 0.55 * done_ops[0] / n_ops)

        runner = ScheduleRunner(engine, graph, backend, on_op_done)
        t_engine = time.perf_counter()
        end_ps = runner.run()
        t_end = time.perf_counter()
        # where the wall time went: the planner, everything else before the engine (topology,
        # work, payloads, SmartNIC traces, graph), the engine (all iterations), metrics
        self.wall = {"setup_s": t_plan - t0, "planning_s": t_built - t_plan, "build_s": t_engine - t_built,
                     "engine_s": t_end - t_engine}
        self.progress("collecting metrics", 0.92)
        result = self._collect(graph, engine, end_ps, resources_, dense, work, time.perf_counter() - t0)
        result.metrics["wall_breakdown_s"] = {**self.wall, "collect_s": time.perf_counter() - t_end}
        self.progress("done", 1.0)
        return result

    def _payloads(self, work, dense: DenseCosts, psys, topo) -> dict[str, Any]:
        sc = self.scenario
        sys_ = sc.system
        gpu = sys_.gpu_spec
        world = work.world_size
        gpn = work.gpus_per_node
        wl = sc.workload
        b = wl.batch_per_gpu
        comm = psys.comm
        m = work.matrices
        nic: NICEffects | None = None
        self.nic_stats: dict[str, float] = {}
        self.nic_metrics: dict[str, Any] = {}
        if sys_.embeddings == "nic":
            self.progress("SmartNIC: cache hit rates on the lookup traces", 0.22)
            nic = nic_effects(sc, self.plan, work, psys)
            if self.nic_backend is not None:
                self.progress("SmartNIC: the NIC backend (e.g. RTL co-simulation)", 0.25)
                nic = self.nic_backend(self, nic, work)
            m = nic.matrices
            self.nic_stats = dict(nic.hit_rates)
            self.nic_metrics = dict(nic.figures)
        self.nic_effects = nic
        pooled = m["pooled"] + m["rs"]
        grad = m["grad"] + m["ag"]

        def coll_a2a(matrix: np.ndarray) -> Collective:
            matrix = np.ceil(matrix)  # whole bytes; a fraction of a byte still needs one
            nic_ps = nic.packetizer_ps(matrix, gpn) if nic is not None else None
            return Collective("alltoallv", matrix=matrix, estimate_s=comm.alltoallv_time_s(matrix), nic_ps=nic_ps)

        comm_bytes = 4 if sys_.comm_dtype == "fp32" else 2
        ar_bytes = int(math.ceil(dense.params * comm_bytes + work.dp_allreduce_bytes))
        payloads: dict[str, Any] = {
            "input_a2a": coll_a2a(m["input"]),
            "pooled_a2a": coll_a2a(pooled),
            "bot_fwd": dense.bot_fwd,
            "inter_fwd": dense.inter_fwd,
            "top_fwd": dense.top_fwd,
        }
        dense_in_bytes = wl.dense.bottom_mlp[0] * 4
        lookups_per_sample = sum(t.pooling for t in wl.tables)
        payloads["h2d"] = Copy(b * (dense_in_bytes + lookups_per_sample * psys.index_bytes + len(wl.tables) * psys.length_bytes))
        if nic is not None and nic.gpu_pool_bytes.any():
            # rows that reach a GPU unpooled (pooling on the NIC off) are pooled by a streaming
            # kernel before the interaction (ASSUMPTION: folded into the interaction's op)
            eff = gpu.efficiency
            payloads["inter_fwd"] = [
                dense.inter_fwd + KernelCost(hbm_bytes=float(nb), memory_s=float(nb) / (gpu.hbm_bytes_per_s * eff.hbm_stream))
                for nb in nic.gpu_pool_bytes]
        if sc.mode == "training":
            payloads.update({
                "top_bwd": dense.top_bwd,
                "inter_bwd": dense.inter_bwd,
                "grad_a2a": coll_a2a(grad),
                "bot_bwd": dense.bot_bwd,
                "allreduce": Collective("allreduce", nbytes=ar_bytes, estimate_s=comm.allreduce_time_s(ar_bytes, world)),
                "dense_opt": dense.dense_opt,
            })
        # embedding work per rank
        fwd: list[Any] = []
        bwd: list[Any] = []
        tier_miss = np.zeros(world)
        cpu = CPU_PRESETS[sys_.host.cpu]
        for r in range(world):
            ks = work.kernels[r]
            if sys_.embeddings == "cpu":
                f_s = sum(cpu_embedding_forward_s(cpu, k.lookups, k.row_bytes) for k in ks)
                b_s = sum(cpu_embedding_backward_s(cpu, k.lookups, k.unique_rows, k.row_bytes) for k in ks)
                fwd.append(CPUJob(r // gpn, f_s))
                bwd.append(CPUJob(r // gpn, b_s))
                continue
            f = KernelCost()
            g = KernelCost()
            miss = 0.0
            for i, k in enumerate(ks):
                gl = k.lookups if nic is None else int(round(nic.gpu_lookups[r][i]))
                f = f + embedding_forward_cost(gpu, gl, k.row_bytes, k.pooled_rows, k.out_row_bytes)
                g = g + embedding_backward_cost(gpu, k.lookups, min(k.unique_rows, k.lookups), k.row_bytes, k.row_bytes, k.state_bytes_per_row)
                miss += k.miss_bytes
            launch = gpu.efficiency.launch_overhead_s
            f = _fused(f, launch, 0.0)
            g = _fused(g, 2 * launch, 0.0)
            tier_miss[r] = miss
            # host-tier shards: the cache's misses fetch rows from host memory during the
            # forward and write updated rows back during the backward, over the GPU-host link
            # alongside the fused kernel (ASSUMPTION: transfers overlap the kernel; the op ends
            # when both have)
            fwd.append(NICJob((), f, miss / 2, to_gpu=True, kind="tier_miss") if miss > 0 else f)
            bwd.append(NICJob((), g, miss / 2, to_gpu=False, kind="tier_miss") if miss > 0 else g)
        if nic is not None:
            def gpu_of(job):
                return job.gpu if isinstance(job, NICJob) else job
            # DRAM-tier misses and NIC fills share the GPU's PCIe link (counted together)
            fwd = [NICJob(nic.fwd_units[r], gpu_of(fwd[r]), float(nic.fwd_pcie_bytes[r] + tier_miss[r] / 2))
                   for r in range(world)]
            bwd = [NICJob((), gpu_of(bwd[r]), float(nic.bwd_pcie_bytes[r] + tier_miss[r] / 2))
                   if nic.bwd_pcie_bytes[r] + tier_miss[r] > 0 else bwd[r] for r in range(world)]
        self.tier_miss_bytes = tier_miss
        if sys_.embeddings == "cpu":
            # pooled embeddings reach the GPU over PCIe, gradients leave it the same way
            recv = pooled.sum(axis=0)
            payloads["pooled_h2d"] = [Copy(float(recv[r]), kind="pooled") for r in range(world)]
            if sc.mode == "training":
                payloads["grad_d2h"] = [Copy(float(recv[r]), to_gpu=False, kind="gradients") for r in range(world)]
        payloads["emb_fwd"] = fwd
        if sc.mode == "training":
            payloads["emb_bwd"] = bwd
        return payloads

    def _build_resources(self, topo, world: int):
        from neonic.sim.network import collectives as coll
        from neonic.sim.network.network import Network

        sc = self.scenario
        sys_ = sc.system
        st = sys_.streams
        engine = Engine()
        net = Network(engine, topo)
        partitions = {"comm": st.sm_partition_comm} if st.sm_partition_comm > 0 else None
        gpus = [GPUDevice(engine, sys_.gpu_spec, name=f"gpu{r}", sm_partitions=partitions, interference=st.interference,
                          comm_sm_fraction=st.comm_sm_fraction) for r in range(world)]
        from neonic.sim.memory_tiers import HostLink

        # the one PCIe model: copies, host-tier misses and NIC fills are flows on the topology's
        # GPU-host links, sharing them (and their counters) with everything else there
        host_link = HostLink(net, topo, record=set(_sample_ranks(world)))
        nodes = (world + topo.gpus_per_node - 1) // topo.gpus_per_node
        sockets = [ServerPool(engine, sys_.host.sockets_per_node, name=f"cpu{n}") for n in range(nodes)]
        comm_partition = "comm" if partitions else None
        ranks = list(range(world))
        nics: list[Any] = []
        if sys_.embeddings == "nic":
            from neonic.sim.nic import NIC

            cfg = self.nic_effects.cfg if getattr(self, "nic_effects", None) is not None else nic_config(sys_.nic)
            keep = set(_sample_ranks(world))
            nics = [NIC(engine, cfg, name=f"nic{r}", record=r in keep) for r in range(world)]

        def all_of(parts: int, done: Callable[[int, int], None]) -> Callable[[int, int], None]:
            """A completion that fires ``done(start, end)`` once ``parts`` pieces have ended."""
            start = engine.now
            left = [parts]

            def piece(_s: int, _e: int) -> None:
                left[0] -= 1
                if left[0] == 0:
                    done(start, engine.now)
            return piece

        def backend(op: Op, done: Callable[[int, int], None]) -> None:
            payload = op.payload
            start = engine.now
            if isinstance(payload, KernelCost):
                gpus[op.rank].launch(payload, done)
            elif isinstance(payload, Copy):
                host_link.transfer(op.rank, payload.nbytes, payload.to_gpu, done, kind=payload.kind,
                                   label=f"{op.phase}[{op.iteration}]")
            elif isinstance(payload, CPUJob):
                sockets[payload.node].submit(ps_from_s(payload.seconds), done)
            elif isinstance(payload, Collective):
                # the GPU-side share (SMs unless on the copy engines, HBM) is held on every rank
                # from the start of the collective until the network delivers its last byte
                held = []
                demand_sm = 0.0 if st.collectives_on_dma else st.comm_sm_fraction
                for r in op.ranks:
                    g = gpus[r]
                    key = g._sm_key(comm_partition)
                    demand = {"hbm": st.comm_hbm_fraction}
                    if demand_sm > 0:
                        demand[key] = min(demand_sm, 0.5 * g.pool.capacities[key])
                    held.append((g, g.pool.reserve(demand)))

                finish = done
                if payload.nic_ps is not None and nics:
                    # the NICs on the path packetize their inter-node bytes while the network
                    # carries them; the collective ends when both are through
                    busy = [(r, d) for r, d in enumerate(payload.nic_ps) if d > 0]
                    finish = all_of(1 + len(busy), done)
                    for r, d in busy:
                        nics[r].run({"packetizer": d}, finish, label=f"{op.phase}[{op.iteration}]")

                def net_done(_handle: Any) -> None:
                    for g, reservation in held:
                        g.pool.release(reservation)
                    finish(start, engine.now)

                if payload.kind == "alltoallv":
                    coll.alltoallv(net, ranks, payload.matrix, algorithm=sc.alltoall, on_done=net_done)
                else:
                    coll.allreduce(net, ranks, payload.nbytes, algorithm=sc.allreduce, on_done=net_done)
            elif isinstance(payload, NICJob):
                # the GPU kernel, the NIC units and the PCIe transfers run side by side
                units = {u: d for u, d in payload.units if d > 0}
                parts = 1 + (1 if units else 0) + (1 if payload.pcie_bytes > 0 else 0)
                finish = all_of(parts, done)
                gpus[op.rank].launch(payload.gpu, finish)
                if units:
                    nics[op.rank].run(units, finish, label=f"{op.phase}[{op.iteration}]")
                if payload.pcie_bytes > 0:
                    host_link.transfer(op.rank, payload.pcie_bytes, payload.to_gpu, finish, kind=payload.kind,
                                       label=f"{op.phase}[{op.iteration}]")
            else:
                raise TypeError(f"op {op!r}: no backend for payload {type(payload).__name__}")

        self.net = net
        return engine, backend, {"gpus": gpus, "host_link": host_link, "sockets": sockets, "net": net, "nics": nics}

    # ------------------------------------------------------------------------------ metrics
    def _collect(self, graph: OpGraph, engine: Engine, end_ps: int, res: dict, dense: DenseCosts, work, wall_s: float) -> RunResult:
        sc = self.scenario
        world = graph.num_ranks
        its = list(range(sc.warmup, sc.warmup + sc.iterations))
        # iteration boundaries: the end of each iteration's last op on any rank
        it_end = [0] * graph.iterations
        it_start = [None] * graph.iterations
        for op in graph.ops:
            it_end[op.iteration] = max(it_end[op.iteration], op.end)
            s = it_start[op.iteration]
            it_start[op.iteration] = op.start if s is None else min(s, op.start)
        lo = it_end[sc.warmup - 1] if sc.warmup > 0 else 0
        hi = it_end[its[-1]]
        iter_s = s_from_ps(hi - lo) / len(its)
        global_batch = sc.workload.batch_per_gpu * world
        sample = _sample_ranks(world)
        bd = phase_breakdown(graph, sample, its)
        metrics: dict[str, Any] = {
            "scenario": sc.name,
            "mode": sc.mode,
            "pipelined": sc.pipelined,
            "system": sc.system.name,
            "workload": sc.workload.name,
            "gpus": world,
            "nodes": (world + self.topology.gpus_per_node - 1) // self.topology.gpus_per_node,
            "global_batch": global_batch,
            "iteration_time_s": iter_s,
            "samples_per_s": global_batch / iter_s if iter_s > 0 else 0.0,
            "simulated_time_s": s_from_ps(end_ps),
            "measured_iterations": len(its),
            "warmup_iterations": sc.warmup,
            "events": engine.events_processed,
            "wall_s": wall_s,
            "phase_serialized_s": bd.serialized,
            "phase_exposed_s": bd.exposed,
            "idle_s": bd.idle,
            "dense_params": dense.params,
            "plan": getattr(self.plan, "sharding_counts", lambda: {})(),
            "plan_notes": list(getattr(self.plan, "notes", ())),
            "lookup_sources": self.lookups.sources() if getattr(self, "lookups", None) is not None else {},
        }
        if sc.mode == "inference":
            lat = []
            for it in its:
                for r in sample:
                    first = graph.get("h2d", it, r) or graph.get("input_a2a", it, r)
                    last = graph.get("top_fwd", it, r)
                    lat.append(last.end - first.start)
            metrics["latency_s"] = {"mean": s_from_ps(int(np.mean(lat))), "max": s_from_ps(int(max(lat)))}
        gpus: list[GPUDevice] = res["gpus"]
        elapsed = end_ps
        util = {"gpu_sm": float(np.mean([g.utilization(elapsed)["sm"] for g in gpus])),
                "gpu_hbm": float(np.mean([g.utilization(elapsed)["hbm"] for g in gpus])),
                "pcie": res["host_link"].utilization(elapsed)}
        if sc.system.embeddings == "cpu":
            util["cpu_sockets"] = float(np.mean([s.utilization(elapsed) for s in res["sockets"]]))
        if res["nics"]:
            for unit in res["nics"][0].units:
                util[f"nic_{unit}"] = float(np.mean([n.units[unit].utilization(elapsed) for n in res["nics"]]))
        net = res["net"]
        link_class = {k: float(v) for k, v in net.link_class_bytes().items()}
        util.update(self._network_utilization(net, elapsed))
        metrics["utilization"] = util
        metrics["link_class_bytes"] = link_class
        metrics["cache_hit_rates"] = dict(getattr(self, "nic_stats", {}))
        if getattr(self, "nic_metrics", None):
            metrics["nic"] = dict(self.nic_metrics)
        metrics["memory_tiers"] = self._tier_metrics(res["host_link"], work, elapsed, len(its) + sc.warmup)
        tracks = _tracks(graph, sample)
        for r, spans in res["host_link"].spans.items():
            tracks[f"gpu{r}/pcie"] = sorted(spans)
        for nic in res["nics"]:
            if nic.record:
                for unit, spans in nic.intervals.items():
                    tracks[f"{nic.name}/{unit}"] = sorted(spans)
        return RunResult(sc, graph, metrics, bd, tracks, util, link_class, wall_s)

    def _tier_metrics(self, host_link, work, elapsed_ps: int, iterations: int) -> dict[str, Any]:
        """Memory tiers: bytes per tier, the HBM cache of host-tier shards (lookups, hits,
        misses per iteration, hit rate per table) and the GPU-host link's bytes and
        utilisation (the network's counters: ``link_class_bytes["pcie"]`` is the same sum)."""
        psys = self.planner_system
        shards = {t: 0 for t in ("hbm", "dram", "ssd")}
        lookups = hits = 0.0
        rates: dict[str, float] = {}
        for t in self.scenario.workload.tables:
            for k in work.tables[t.name].kernels:
                shards[k.tier] += 1
                if k.tier != "hbm":
                    h = psys.tier_hit_rate(t)
                    rates[t.name] = h
                    lookups += k.lookups
                    hits += k.lookups * h
        link = host_link.link_bytes()
        return {
            "bytes": {"hbm": float(work.hbm_bytes.sum()), "dram": float(work.dram_bytes.sum()),
                      "ssd": float(work.ssd_bytes.sum())},
            "shards": shards,
            "cache": {"load_factor": psys.memory.cache_load_factor, "ways": psys.memory.cache_ways,
                      "policy": psys.memory.cache_policy,
                      "lookups_per_iteration": lookups, "hits_per_iteration": hits,
                      "misses_per_iteration": lookups - hits,
                      "hit_rate": hits / lookups if lookups else None, "hit_rate_by_table": rates,
                      "miss_bytes_per_iteration": float(np.sum(getattr(self, "tier_miss_bytes", 0.0)))},
            "pcie": {"bytes": float(link.sum()), "bytes_by_kind": dict(host_link.bytes_by_kind),
                     "utilization": host_link.utilization(elapsed_ps),
                     "link_gbytes_per_s": psys.host_link_bytes_per_s / 1e9},
        }

    def _network_utilization(self, net, elapsed_ps: int) -> dict[str, float]:
        fn = getattr(net, "link_class_utilization", None)
        if fn is None or elapsed_ps <= 0:
            return {}
        return {f"net_{k}": float(v) for k, v in fn(elapsed_ps).items()}


def _memory_tiers(system, topo):
    """The planner's memory tiers from the system's ``[host]`` (the host-memory tier and its
    HBM cache) and the topology's GPU-host link (``sim.memory_tiers``). Zion keeps its
    embeddings in the CPU sockets' DRAM."""
    from neonic.host.planner.system import MemoryTiers

    h = system.host
    dram = h.dram_gib_per_node
    if system.embeddings == "cpu":
        dram = CPU_PRESETS[h.cpu].dram_gib * h.sockets_per_node
    return MemoryTiers(dram_gib_per_node=dram, ssd_gib_per_node=h.ssd_gib_per_node,
                       cache_load_factor=h.cache_load_factor, ssd_gbytes_per_s=h.ssd_gbytes_per_s,
                       cache_ways=h.cache_ways, cache_policy=h.cache_policy,
                       host_link_gbytes_per_s=topo.config.host_link.bandwidth_gbps / 8)


def _planner_comm(topo):
    """The planner's alpha-beta view of the topology (``host.planner``'s one home of it: the
    network model's closed-form estimates, or the topology's configured figures)."""
    from neonic.host.planner.system import AlphaBetaComm

    return AlphaBetaComm.from_topology(topo)


def _sample_ranks(world: int) -> list[int]:
    """The ranks whose timelines and breakdowns are kept (all of them up to 64)."""
    return sorted({0, world // 2, world - 1}) if world > 64 else list(range(world))


def _fused(cost: KernelCost, launch_s: float, extra_s: float) -> KernelCost:
    """Shards' kernels fused into one launch (one overhead), plus host-transfer time."""
    return KernelCost(flops=cost.flops, hbm_bytes=cost.hbm_bytes, compute_s=cost.compute_s, memory_s=cost.memory_s,
                      overhead_s=launch_s + extra_s)


def _tracks(graph: OpGraph, ranks: list[int]) -> dict[str, list[tuple[int, int, str]]]:
    """Timeline tracks for the trace: one per (rank, stream) of the sampled ranks, one per
    collective class (the network)."""
    tracks: dict[str, list[tuple[int, int, str]]] = {}
    keep = set(ranks)
    for op in graph.ops:
        label = f"{op.phase}[{op.iteration}]"
        if op.collective:
            tracks.setdefault(f"network/{op.phase}", []).append((op.start, op.end, label))
            for r in ranks:
                tracks.setdefault(f"gpu{r}/{op.stream}", []).append((op.start, op.end, label))
        elif op.rank in keep:
            tracks.setdefault(f"gpu{op.rank}/{op.stream}", []).append((op.start, op.end, label))
    return tracks
