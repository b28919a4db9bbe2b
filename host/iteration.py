"""One iteration of a scenario, derived from its plan: the dense part's kernel costs, the
payload types of the op graph, and each phase's payload per rank.

:func:`dense_costs` prices the MLPs, the interaction and the dense optimizer step;
:func:`iteration_payloads` turns the plan's derived work (``host.planner.work.derive_iteration``:
per-rank embedding kernels and AlltoAllv matrices; the runtime never re-derives communication
sizes) into the payloads that ``host.schedule.build_graph`` attaches to the op graph.

Modelling choices (each an ASSUMPTION a user can see in code and docs):
    * the dense AllReduce carries the MLPs' parameters (computed from the workload's widths) plus
      the data-parallel tables' bytes from the plan, in ``[comm_precision] allreduce``; in Neo's
      pipelined training it runs as PyTorch DDP's gradient buckets (``host.gradients``,
      :func:`iteration_buckets`), which :func:`build_iteration_graph` puts into the op graph
      that both the simulator and :class:`ScheduleTemplate` evaluate;
    * ``[comm_precision]`` sets the wire precision of each float collective (``forward``: the
      pooled AlltoAll and the row-wise reduce-scatter; ``backward``: the gradient AlltoAll and
      the all-gather; ``allreduce``: the dense gradients); the plan's matrices are sized in the
      forward precision (``PlannerSystem.comm_dtype``) and the backward's are scaled by
      :meth:`IterationSpec.backward_scale` (casts fused into the packing, no extra kernel);
    * the dense part is costed layer by layer from ``host.workloads.dense`` (the interaction
      as the workload defines it: dot with projections, concatenation or cross layers);
    * each rank's embedding shards run as one fused kernel (one launch overhead).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from neonic.host.systems import SystemSpec
from neonic.host.workloads import WorkloadSpec
from neonic.sim.gpu import (GPUSpec, KernelCost, embedding_forward_cost, embedding_sort_cost, embedding_update_cost,
                            stream_cost)
from neonic.sim.resources import CPU_PRESETS, cpu_embedding_backward_s, cpu_embedding_forward_s
from neonic.sim.memory_tiers import host_transfer_s
from neonic.sim.compiled import HAVE_NUMBA, jit

if TYPE_CHECKING:
    from neonic.host.nic_effects import NICEffects
    from neonic.host.schedule import GradientBuckets, OpGraph
    from neonic.host.scenario import Scenario

__all__ = ["DenseCosts", "dense_costs", "Collective", "CPUJob", "Copy", "NICJob", "iteration_payloads",
           "iteration_buckets", "build_iteration_graph", "WIRE_BYTES"]

#: Bytes per element on the wire of each communication precision.
WIRE_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2}


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
    layers: tuple = ()  # host.workloads.dense.LayerCost, forward order

    def opt_step(self, params: float) -> KernelCost:
        """The dense optimizer's step over ``params`` parameters (a bucket's share of the
        whole step; launch overhead unchanged)."""
        return self.dense_opt.scaled(params / max(1, self.params))


def dense_costs(system: "SystemSpec | GPUSpec", workload: WorkloadSpec, dtype: str = "fp16",
                elementwise: bool = True) -> DenseCosts:
    """MLP, interaction and optimizer-step costs on one GPU for one local batch (``system``: a
    system, or its GPU model), summed from the per-layer costs of ``host.workloads.dense``
    (kept in ``layers``: the gradient buckets split the backward at layer boundaries);
    ``elementwise=False``: the GEMMs alone (``host.workloads.dense.layer_costs``)."""
    from neonic.host.workloads.dense import interaction_width, layer_costs

    gpu = getattr(system, "gpu_spec", system)
    layers = layer_costs(gpu, workload, dtype, elementwise)

    def total(part: str, attr: str) -> KernelCost:
        cost = KernelCost()
        for lc in layers:
            if lc.layer.part == part:
                cost = cost + getattr(lc, attr)
        return cost

    params = sum(lc.params for lc in layers)
    # the dense optimizer (ASSUMPTION: Adam, FP32 state; Neo does not name it) in one fused pass:
    # Adam's update reads the gradient, the weights and both moments and writes back the weights
    # and both moments (Kingma & Ba 2015; torch.optim.Adam), 4 reads + 3 writes of FP32 per
    # parameter. PyTorch's unfused (foreach) step makes several passes and costs more.
    step_bytes = params * 4 * (4 + 3)
    step = stream_cost(gpu, step_bytes)
    return DenseCosts(
        bot_fwd=total("bottom", "forward"),
        inter_fwd=total("interaction", "forward"),
        top_fwd=total("top", "forward"),
        top_bwd=total("top", "backward"),
        inter_bwd=total("interaction", "backward"),
        bot_bwd=total("bottom", "backward"),
        dense_opt=step,
        params=params,
        interaction_width=interaction_width(workload),
        layers=tuple(layers),
    )


# ---------------------------------------------------------------------------------- payloads
@dataclass(frozen=True)
class Collective:
    """A collective op's payload: kind, size matrix (AlltoAllv) or bytes (AllReduce)."""

    kind: str  # "alltoallv" | "allreduce"
    matrix: np.ndarray | None = None
    nbytes: float = 0.0
    #: an AllReduce's alpha-beta estimate from the planner's model (an AlltoAllv's is left at 0:
    #: it needs a pass over the (N, N) matrix, 0.37 CPU-s for a run's five at 4096 GPUs, and no
    #: one reads it; the engine's network gives the collectives their times)
    estimate_s: float = 0.0
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


def _whole_bytes(matrix: np.ndarray, rows: int = 256) -> bool:
    """Whether every entry of ``matrix`` is a whole number (``np.ceil`` would not change it),
    checked block by block (no matrix-sized temporary)."""
    if np.issubdtype(matrix.dtype, np.integer):
        return True
    for i in range(0, matrix.shape[0], rows):
        block = matrix[i:i + rows]
        if not np.array_equal(np.ceil(block), block):
            return False
    return True


def iteration_payloads(sc: "Scenario", work, dense: DenseCosts, psys, nic: "NICEffects | None" = None) -> dict[str, Any]:
    """Every op's payload for one iteration, by phase: a value shared by all ranks, or a list
    with one entry per rank (kernel costs, collectives with their matrices, copies, CPU and
    NIC jobs). ``work`` is the plan's derived iteration (``host.planner.work``); ``nic`` the
    SmartNIC effects (``host.nic_effects``) on the SmartNIC system."""
    sys_ = sc.system
    gpu = sys_.gpu_spec
    world = work.world_size
    gpn = work.gpus_per_node
    wl = sc.workload
    b = wl.batch_per_gpu
    comm = psys.comm
    m = work.matrices
    if nic is not None:
        m = nic.matrices
    spec = IterationSpec.from_scenario(sc)
    scale = spec.backward_scale(psys.comm_dtype)
    pooled = m["pooled"]
    # (scaled copies are this function's own, rounded up in place by coll_a2a; an all-zero
    # matrix, the all-gather without table-row-wise tables, makes no collective: not copied)
    scaled = scale != 1.0
    grad = m["grad"] * scale if scaled else m["grad"]
    ag = m["ag"] * scale if scaled and m["ag"].any() else m["ag"]

    def coll_a2a(matrix: np.ndarray, owned: bool = False) -> Collective:
        # whole bytes; a fraction of a byte still needs one (in place when the matrix is a copy
        # of our own; a matrix already in whole bytes is shared, not copied: at 4096 ranks each
        # is 128 MiB, and the payload's readers -- the network, the packetizer -- never write it)
        if owned:
            matrix = np.ceil(matrix, out=matrix)
        elif not _whole_bytes(matrix):
            matrix = np.ceil(matrix)
        nic_ps = nic.packetizer_ps(matrix, gpn) if nic is not None else None
        return Collective("alltoallv", matrix=matrix, nic_ps=nic_ps)

    ar_bytes = allreduce_bytes(dense, work.dp_allreduce_bytes, spec.allreduce_dtype(psys.comm_dtype))
    payloads: dict[str, Any] = {
        "input_a2a": coll_a2a(m["input"]),
        # table-row-wise partial pools are reduced inside the node before they can leave it
        "pooled_rs": coll_a2a(m["rs"]) if m["rs"].any() else None,
        "pooled_a2a": coll_a2a(pooled),
        "bot_fwd": dense.bot_fwd,
        "inter_fwd": dense.inter_fwd,
        "top_fwd": dense.top_fwd,
    }
    payloads["h2d"] = Copy(h2d_bytes(wl, psys.index_bytes, psys.length_bytes))
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
            "grad_a2a": coll_a2a(grad, owned=scaled),
            "grad_ag": coll_a2a(ag, owned=scaled) if ag.any() else None,
            "bot_bwd": dense.bot_bwd,
            "allreduce": Collective("allreduce", nbytes=ar_bytes, estimate_s=comm.allreduce_time_s(ar_bytes, world)),
            "dense_opt": dense.dense_opt,
        })
    # embedding work per rank
    fwd: list[Any] = []
    bwd: list[Any] = []
    tier_miss = np.zeros(world)
    pcie = sys_.host_link_gbytes_per_s * 1e9
    ssd = psys.memory.ssd_gbytes_per_s * 1e9
    cpu = CPU_PRESETS[sys_.host.cpu]
    # ranks with the same shards (their figures, not their rank) and the same lookups left to
    # the GPU share their payloads: a pure function of those, computed once
    same: dict[tuple, tuple[Any, Any, float]] = {}
    for r in range(world):
        ks = work.kernels[r]
        if sys_.embeddings == "cpu":
            f_s = sum(cpu_embedding_forward_s(cpu, k.lookups, k.row_bytes) for k in ks)
            b_s = sum(cpu_embedding_backward_s(cpu, k.lookups, k.unique_rows, k.row_bytes) for k in ks)
            fwd.append(CPUJob(r // gpn, f_s))
            bwd.append(CPUJob(r // gpn, b_s))
            continue
        gl = None if nic is None else [int(round(x)) for x in nic.gpu_lookups[r]]
        key = (tuple(_shard_key(k) for k in ks), None if gl is None else tuple(gl))
        jobs = same.get(key)
        if jobs is None:
            f, g = fused_embedding_costs(gpu, ks, pcie, ssd, gl, host_in_kernel=False)
            miss = float(sum(k.miss_bytes for k in ks))
            # host-tier shards: the HBM cache's misses fetch rows from host memory during the
            # forward and write updated rows back during the backward, as flows on the GPU-host
            # link alongside the fused kernel (ASSUMPTION: transfers overlap the kernel; the op
            # ends when both have; the planner's view is the same: host.planner.cost)
            jobs = same[key] = (NICJob((), f, miss / 2, to_gpu=True, kind="tier_miss") if miss > 0 else f,
                                NICJob((), g, miss / 2, to_gpu=False, kind="tier_miss") if miss > 0 else g, miss)
        fwd.append(jobs[0])
        bwd.append(jobs[1])
        tier_miss[r] = jobs[2]
    if nic is not None:
        def gpu_of(job):
            return job.gpu if isinstance(job, NICJob) else job
        # the host-tier misses the NICs left and the bytes between GPU and NIC share the GPU's
        # PCIe link: towards the GPU in the forward (fetches, rows or partial pools from the
        # NIC), away from it in the backward (write-backs, gradients and write-through to the NIC)
        t_fwd = tier_miss / 2 if nic.tier_fwd_bytes is None else nic.tier_fwd_bytes
        t_bwd = tier_miss / 2 if nic.tier_bwd_bytes is None else nic.tier_bwd_bytes
        bwd_units = nic.bwd_units or [()] * world
        fwd = [NICJob(nic.fwd_units[r], gpu_of(fwd[r]), float(nic.fwd_pcie_bytes[r] + t_fwd[r]), to_gpu=True)
               for r in range(world)]
        bwd = [NICJob(bwd_units[r], gpu_of(bwd[r]), float(nic.bwd_pcie_bytes[r] + t_bwd[r]))
               if nic.bwd_pcie_bytes[r] + t_bwd[r] > 0 or bwd_units[r] else bwd[r] for r in range(world)]
    payloads["tier_miss_bytes"] = tier_miss
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


def _shard_key(k) -> tuple:
    """A ``ShardKernel``'s figures but its rank: every figure its kernels and host transfers may
    depend on (all of them, so that a figure the costs read later cannot be left out)."""
    return tuple(v for name, v in vars(k).items() if name != "rank")


def allreduce_bytes(dense: DenseCosts, dp_table_bytes: float, comm_dtype: str) -> int:
    """Bytes of the iteration's single AllReduce (no gradient buckets): the MLPs' gradients in
    ``comm_dtype`` (the ``[comm_precision] allreduce`` wire precision) plus the data-parallel
    tables' gradients (the plan's ``dp_allreduce_bytes``)."""
    return int(math.ceil(dense.params * WIRE_BYTES[comm_dtype] + dp_table_bytes))


def iteration_buckets(spec: "IterationSpec", dense: DenseCosts, dp_table_bytes: float,
                      make_allreduce: Callable[[float], Any]) -> "GradientBuckets | None":
    """The dense gradients' DDP buckets of one iteration (``host.gradients``), or None where
    the op graph keeps one AllReduce (inference, the serialized baseline, ``bucket_mib = 0``).
    ``make_allreduce(params)``: the AllReduce payload of a bucket of ``params`` gradient
    elements (the caller knows the wire precision and the collective algorithm); the optimizer
    steps are :meth:`DenseCosts.opt_step` of each bucket's parameters (or of all of them after
    the last bucket). The data-parallel tables' gradients (``dp_table_bytes``, produced by the
    embedding backward) form a last bucket of their own."""
    if not spec.bucketed:
        return None
    from neonic.host.gradients import gradient_buckets

    return gradient_buckets(dense.layers, spec.bucket_config(), make_allreduce, dense.opt_step,
                            tables_bytes=dp_table_bytes)


def build_iteration_graph(spec: "IterationSpec", num_ranks: int, payloads: Any, emb_stream: str,
                          buckets: "GradientBuckets | None" = None, phases: Any = None) -> "OpGraph":
    """The op graph of a run (``host.schedule.build_graph``) with the dense gradients' buckets
    applied (``host.schedule.bucket_gradients``): the one place both the simulator
    (``host.cluster``) and the planner's :class:`ScheduleTemplate` get their graph from."""
    from neonic.host.schedule import bucket_gradients, build_graph

    graph = build_graph(num_ranks, spec.warmup + spec.iterations, payloads, mode=spec.mode, pipelined=spec.pipelined,
                        emb_stream=emb_stream, phases=phases)
    if buckets is not None:
        bucket_gradients(graph, buckets)
    return graph


def h2d_bytes(workload: WorkloadSpec, index_bytes: int, length_bytes: int) -> float:
    """Bytes of one batch's inputs to one GPU: dense features (fp32), sparse indices, lengths."""
    lookups_per_sample = sum(t.pooling for t in workload.tables)
    return float(workload.batch_per_gpu * (workload.dense.bottom_mlp[0] * 4 + lookups_per_sample * index_bytes
                                           + len(workload.tables) * length_bytes))


def shard_kernel_s(gpu: GPUSpec, k, pcie_bytes_per_s: float, ssd_bytes_per_s: float,
                   lookups: int | None = None) -> tuple[float, float, float]:
    """One shard's (forward, backward, host transfer) seconds, launch overheads excluded: the
    GPU model's embedding kernels (``sim.gpu``) and the cache misses of a DRAM/SSD shard over
    PCIe (or at the SSD's bandwidth). ``lookups``: forward lookups left to the GPU (SmartNIC
    caches serve the rest; default all of them). The backward is the shard's share of the
    fused update; the sort before it is its rank's, one over all its shards
    (:func:`rank_sort_cost`), not additive over shards. The one home of these figures: the
    planner's contributions and the simulator's payloads both come from here."""
    fwd, bwd = _shard_costs(gpu, k, lookups)
    host = host_transfer_s(k.miss_bytes, k.tier, pcie_bytes_per_s, ssd_bytes_per_s)
    return fwd.time_s - fwd.overhead_s, bwd.time_s - bwd.overhead_s, host


def _shard_costs(gpu: GPUSpec, k, lookups: int | None = None) -> tuple[KernelCost, KernelCost]:
    """One shard's forward kernel and its share of the backward's fused update (:func:`shard_kernel_s`'s)."""
    fl = k.lookups if lookups is None else lookups
    fwd = embedding_forward_cost(gpu, fl, k.row_bytes, k.pooled_rows, k.out_row_bytes)
    bwd = embedding_update_cost(gpu, k.lookups, min(k.unique_rows, k.lookups), k.row_bytes, k.out_row_bytes,
                                k.state_bytes_per_row)
    return fwd, bwd


def rank_sort_cost(gpu: GPUSpec, kernels) -> KernelCost:
    """The sort of a rank's fused backward: FBGEMM sorts the linearized indices of all the
    rank's tables at once (``sim.gpu.embedding_sort_cost``), every backward lookup of its
    shards over the bits of its shards' rows summed (the TBE's ``total_hash_size_bits``).
    ASSUMPTION: all of a rank's shards, data-parallel ones included, are one TBE (Neo's one
    fused kernel per rank)."""
    keys = rows = 0
    for k in kernels:
        keys += k.lookups
        rows += k.rows
    return embedding_sort_cost(gpu, keys, rows)


def fused_embedding_costs(gpu: GPUSpec, kernels, pcie_bytes_per_s: float, ssd_bytes_per_s: float,
                          gpu_lookups: list[int] | None = None, host_in_kernel: bool = True) -> tuple[KernelCost, KernelCost]:
    """A rank's shards run as one fused forward launch and one fused backward (+ optimizer):
    the shards' kernel times add (:func:`shard_kernel_s`), the forward's launch overhead
    counts once, the backward is the rank's one sort (:func:`rank_sort_cost`, its own fixed
    times) and one fused update launch, and the host transfers of cache misses split evenly
    between the two (fetch forward, write-back backward)."""
    flops = hbm = comp = mem = 0.0
    fwd_s = bwd_s = host_s = 0.0
    bflops = bhbm = bcomp = bmem = 0.0
    for i, k in enumerate(kernels):
        f, b = _shard_costs(gpu, k, None if gpu_lookups is None else gpu_lookups[i])
        fwd_s += f.time_s - f.overhead_s
        bwd_s += b.time_s - b.overhead_s
        host_s += host_transfer_s(k.miss_bytes, k.tier, pcie_bytes_per_s, ssd_bytes_per_s)
        flops += f.flops
        hbm += f.hbm_bytes
        comp += f.compute_s
        mem += f.memory_s
        bflops += b.flops
        bhbm += b.hbm_bytes
        bcomp += b.compute_s
        bmem += b.memory_s
    sort = rank_sort_cost(gpu, kernels)
    launch = gpu.efficiency.launch_overhead_s
    busy = 1.0 if len(kernels) else 0.0
    if not host_in_kernel:  # the caller moves the misses itself (flows on the GPU-host link)
        host_s = 0.0
    f_over = busy * launch + host_s / 2
    b_over = busy * launch + host_s / 2
    return (KernelCost(flops=flops, hbm_bytes=hbm, compute_s=comp, memory_s=mem, overhead_s=f_over, _time_s=fwd_s + f_over),
            KernelCost(flops=bflops, hbm_bytes=bhbm + sort.hbm_bytes, compute_s=bcomp, memory_s=bmem + sort.memory_s,
                       overhead_s=b_over + sort.overhead_s, _time_s=(bwd_s + b_over) + sort.time_s))


# ------------------------------------------------------------------ the schedule, evaluated fast
@dataclass(frozen=True)
class IterationSpec:
    """What one iteration's op graph depends on besides the plan: the mode and Neo's pipeline
    (``host.schedule``), where the embeddings run, the MLPs' GEMM datatype, the PCIe link of a
    GPU, the collectives' algorithms, the iterations a run simulates (``warmup`` first, not
    measured), the HBM capacity a GPU loses while kernels and collectives share it
    (``interference``: the system's ``streams.interference``, ``sim.interference``), and the
    share of a GPU's SMs a running collective's channels hold ahead of compute kernels
    (``comm_sm_share``: 0 where collectives run on the copy engines or at normal priority; the
    cluster sets it from its topology, :func:`comm_sm_share`). A scenario gives one (:meth:`from_scenario`); the defaults are the scenario
    schema's.

    What the topology says about the NVLink (the cluster sets these, :func:`allreduce_terms`;
    the defaults keep a hierarchical AllReduce one NIC-bound op and give the node-local
    collectives no share of any link): ``ar_intra_time`` and ``ar_intra_bytes``, the shares of
    a hierarchical AllReduce's time and bytes in its intra-node phases; ``ar_intra_flows``, the
    flows those rings keep open on a GPU's NVLink port; ``local_flows``, the flows a node-local
    AlltoAll (``pooled_rs``, ``grad_ag``) keeps open there (one per local peer)."""

    mode: str = "training"
    pipelined: bool = True
    embeddings: str = "gpu"
    dense_dtype: str = "fp16"
    pcie_gbytes_per_s: float | None = None
    allreduce: str = "hierarchical"
    alltoall: str = "direct"
    warmup: int = 1
    iterations: int = 1
    comm_backward: str | None = None
    comm_allreduce: str | None = None
    bucket_mib: float = 25.0
    first_bucket_mib: float = 1.0
    optimizer: str = "after_last"
    next_batch: str = "after_step"
    interference: float = 0.10
    comm_sm_share: float = 0.0
    ar_intra_time: float = 0.0
    ar_intra_bytes: float = 0.0
    ar_intra_flows: float = 1.0
    local_flows: float = 0.0

    def __post_init__(self) -> None:
        for name in ("comm_backward", "comm_allreduce"):
            v = getattr(self, name)
            if v is not None and v not in WIRE_BYTES:
                raise ValueError(f"{name}: expected one of {', '.join(WIRE_BYTES)}, got {v!r}")
        self.bucket_config()  # checks the bucket fields

    @classmethod
    def from_scenario(cls, sc: "Scenario") -> "IterationSpec":
        b = sc.bucket_config()
        return cls(mode=sc.mode, pipelined=sc.pipelined, embeddings=sc.system.embeddings, dense_dtype=sc.dense_dtype,
                   pcie_gbytes_per_s=sc.system.host_link_gbytes_per_s, allreduce=sc.allreduce, alltoall=sc.alltoall,
                   warmup=sc.warmup, iterations=sc.iterations, comm_backward=sc.precision("backward"),
                   comm_allreduce=sc.precision("allreduce"), bucket_mib=b.bucket_mib,
                   first_bucket_mib=b.first_bucket_mib, optimizer=b.optimizer, next_batch=b.next_batch,
                   interference=sc.system.streams.interference)

    def bucket_config(self) -> Any:
        """The dense gradients' bucketing (``host.gradients.BucketConfig``)."""
        from neonic.host.gradients import BucketConfig

        return BucketConfig(bucket_mib=self.bucket_mib, first_bucket_mib=self.first_bucket_mib,
                            optimizer=self.optimizer, next_batch=self.next_batch)

    @property
    def bucketed(self) -> bool:
        """Whether the op graph all-reduces the dense gradients in DDP's buckets (Neo's
        pipelined training with ``bucket_mib > 0``; the serialized baseline keeps one AllReduce
        in program order)."""
        return self.mode == "training" and self.pipelined and self.bucket_mib > 0

    def backward_scale(self, forward_dtype: str) -> float:
        """Wire bytes of the backward's float collectives (gradient AlltoAll, all-gather) over
        the forward's (``forward_dtype``: the plan's ``comm_dtype``, which sizes the matrices)."""
        back = self.comm_backward or forward_dtype
        return WIRE_BYTES[back] / WIRE_BYTES[forward_dtype]

    def allreduce_dtype(self, default: str) -> str:
        """Wire precision of the dense AllReduce (``default``: the plan's ``comm_dtype``)."""
        return self.comm_allreduce or default

    def phases(self) -> tuple[str, ...]:
        """The phases of the op graph (``host.schedule``), as the runtime builds it."""
        from neonic.host.schedule import INFERENCE_PHASES, TRAINING_PHASES

        order = TRAINING_PHASES if self.mode == "training" else INFERENCE_PHASES
        host_copies = {"pooled_h2d", "grad_d2h"}
        return tuple(p for p in order if self.embeddings == "cpu" or p not in host_copies)


def keyed_buckets(buckets: "GradientBuckets") -> tuple["GradientBuckets", dict[str, Any]]:
    """The same buckets with each payload replaced by a key naming its op in the template
    (``top_bwd#0``: the first backward piece, ``allreduce#k``: bucket k's AllReduce,
    ``dense_opt#k``: the k-th optimizer step), and each key's payload."""
    from dataclasses import replace

    table: dict[str, Any] = {}
    segments = []
    for i, (phase, payload, closes) in enumerate(buckets.segments):
        key = f"{phase}#{i}"
        table[key] = payload
        segments.append((phase, key, closes))
    colls = []
    for k, payload in enumerate(buckets.buckets):
        table[f"allreduce#{k}"] = payload
        colls.append(f"allreduce#{k}")
    steps = []
    for k, payload in enumerate(buckets.opt_payloads):
        table[f"dense_opt#{k}"] = payload
        steps.append(f"dense_opt#{k}")
    return replace(buckets, segments=tuple(segments), buckets=tuple(colls), opt_payloads=tuple(steps)), table


#: Order of the streams whose collectives can overlap (a batch's input AlltoAll one iteration
#: ahead, the gradient buckets' AllReduces, the comm stream's AlltoAlls).
_SHARED_STREAMS = ("input", "grad", "comm")
#: The links concurrent collectives share in the template: a GPU's NIC, or its NVLink port.
_NIC, _NVLINK = 0, 1
#: Collectives that stay inside a node (``host.schedule``: the table-row-wise reduce-scatter
#: and all-gather): they move their bytes over the NVLink only.
NODE_LOCAL_COLLECTIVES = frozenset({"pooled_rs", "grad_ag"})
#: Streams whose ops are GPU kernels that can run beside each other (``host.schedule``: the
#: compute stream and the dense optimizer's).
_KERNEL_STREAMS = frozenset({"compute", "opt"})


def _topological(ops: list) -> list:
    """``ops`` in an order where every op comes after its dependencies (the graph's own order
    where it already is: ops the gradient buckets add come last in the graph, though the next
    iteration's forward depends on them)."""
    import heapq

    pos = {op.id: i for i, op in enumerate(ops)}
    waiting = {op.id: len(op.deps) for op in ops}
    ready = [pos[op.id] for op in ops if not op.deps]
    heapq.heapify(ready)
    out = []
    while ready:
        op = ops[heapq.heappop(ready)]
        out.append(op)
        for child in op.dependents:
            waiting[child.id] -= 1
            if waiting[child.id] == 0:
                heapq.heappush(ready, pos[child.id])
    if len(out) != len(ops):
        raise ValueError("op graph: the dependencies form a cycle")
    return out


def _moved_per_candidate(T: int, per_collective: list[tuple[np.ndarray, np.ndarray]],
                         per_rank: list[tuple[Any, Any]]) -> np.ndarray:
    """How far a fixed-point pass moved each of ``T`` candidates: the largest ``|new - old|``
    of its own entries, over the collectives' stretches (``(C, T)``) and the per-rank ops'
    (``(T, N)``; a scalar or a ``(1, N)`` row is every candidate's)."""
    out = np.zeros(T)
    for new, old in per_collective:
        np.maximum(out, np.abs(new - old).max(axis=0, initial=0.0), out=out)
    for new, old in per_rank:
        d = np.abs(np.asarray(new, float) - np.asarray(old, float))
        np.maximum(out, d.max(axis=1, initial=0.0) if d.ndim == 2 and d.shape[0] == T else d.max(initial=0.0),
                   out=out)
    return out


def _as_rows(a: Any, T: int, N: int) -> np.ndarray | None:
    """``a`` (a figure, ``(N,)``, ``(T, N)``, ``(T, 1)``, ``(1, N)``...) broadcast as numpy
    adds it to a ``(T, 1)`` or ``(T, N)`` schedule: ``(T, 1)`` or ``(T, N)`` (a view), or None
    for a shape :func:`_schedule_pass` does not take (the numpy loop then runs)."""
    a = np.asarray(a, float)
    if a.ndim > 2 or (a.ndim >= 1 and a.shape[-1] not in (1, N)) or (a.ndim == 2 and a.shape[0] not in (1, T)):
        return None
    return np.broadcast_to(a, (T, a.shape[-1] if a.ndim else 1))


def _narrow(a: np.ndarray) -> np.ndarray:
    """``a`` (``(T, N)``: one figure per candidate and rank) as ``(T, 1)`` where every rank's
    figure is the same (the same numbers, broadcast: a kernel priced against it then runs on
    one column instead of N). Figures compared with ``==`` (``(a == a[:, :1]).all()``), float64
    ones in one compiled pass that stops at the first rank that differs (:func:`_same_columns`:
    the schedule asks it of every kernel's span in every pass, mostly of spans that differ
    from the second rank on)."""
    if a.ndim == 2 and a.shape[1] > 1:
        same = _same_columns(a) if a.dtype == np.float64 else bool((a == a[:, :1]).all())
        if same:
            return np.ascontiguousarray(a[:, :1])
    return a


@jit(cache=True, nogil=True)
def _same_columns(a):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA runs it as Python)
    """``(a == a[:, :1]).all()`` for a 2-D array, row by row, stopping at the first figure that
    is not ``==`` its row's first (a NaN is not, itself included)."""
    T, N = a.shape
    for t in range(T):
        f = a[t, 0]
        for w in range(N):
            if not a[t, w] == f:
                return False
    return True


@jit(cache=True, nogil=True, inline="always")
def _mx(a, b):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA runs it as Python)
    """``np.maximum(a, b)`` of two floats: ``a`` where ``a >= b`` or ``a`` is NaN, else ``b``."""
    return a if (a >= b or a != a) else b


@jit(cache=True, nogil=True, inline="always")
def _row_max(r):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA runs it as Python)
    """``r.max()`` of a row of floats (NaN where one is): the maximum in eight lanes, then of
    the lanes (a maximum is exact in any order)."""
    n = r.shape[0]
    if n < 16:
        m = r[0]
        for w in range(1, n):
            m = _mx(m, r[w])
        return m
    m0, m1, m2, m3, m4, m5, m6, m7 = r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]
    top = n - n % 8
    for w in range(8, top, 8):
        m0 = _mx(m0, r[w])
        m1 = _mx(m1, r[w + 1])
        m2 = _mx(m2, r[w + 2])
        m3 = _mx(m3, r[w + 3])
        m4 = _mx(m4, r[w + 4])
        m5 = _mx(m5, r[w + 5])
        m6 = _mx(m6, r[w + 6])
        m7 = _mx(m7, r[w + 7])
    m = _mx(_mx(_mx(m0, m1), _mx(m2, m3)), _mx(_mx(m4, m5), _mx(m6, m7)))
    for w in range(top, n):
        m = _mx(m, r[w])
    return m


@jit(cache=True, nogil=True, inline="always")
def _row_min(r):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA runs it as Python)
    """``r.min()`` of a row of floats (NaN where one is), in order (a minimum is exact)."""
    m = r[0]
    for w in range(1, r.shape[0]):
        x = m
        y = r[w]
        m = x if (x <= y or x != x) else y
    return m


@jit(cache=True, nogil=True, inline="always")
def _all_same(a):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA runs it as Python)
    """``(a == a[:, :1]).all()`` of a 2-D array (a NaN is not ``==``, itself included): 32
    figures at a time, stopping at the first block with one that differs."""
    T, W = a.shape
    for t in range(T):
        r = a[t]
        f = r[0]
        for lo in range(0, W, 32):
            ok = True
            for w in range(lo, min(lo + 32, W)):
                ok &= r[w] == f
            if not ok:
                return False
    return True


@jit(cache=True, nogil=True)
def _schedule_pass(coll, slot, its, iterations, dep_ptr, dep_idx, op_d, dwi, Dn, Dw, op_x, xwi, Xn, Xw,
                   base, extra, xc, need, pool_of, op_span, sp_of, endn, pool, width, emax, tmp,
                   startn, spool, swidth, smin, S, E, it_end):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA runs it as Python)
    """One pass of ``ScheduleTemplate.iteration_s``'s list schedule over every op in order,
    with numpy's figures (the numpy loop there is the specification): each op's end is one
    figure per candidate (``width`` 1: ``endn[i]``) or one per candidate and rank (``width``
    N: ``pool[pool_of[i]]``). A start is the element-wise maximum of its dependencies' ends
    (in order; 0 without any), wide where one of them is; an op's end is ``start + d``
    (``+ x``), where ``d`` is row ``op_d[i]`` of ``Dn`` (``dwi`` < 0) or ``Dw`` (``-1``: none,
    the end is the start) and ``x`` row ``op_x[i]`` of ``Xn`` or ``Xw``; an end wide but the
    same on every rank (``==``) is kept as one figure (the same figures as numpy's broadcast
    row: what reads it sees the same numbers, and a span's shape is ``_narrow``'s, which
    narrows such a row too). A collective starts at its dependencies' latest end (their row
    maxima, ``emax``) and ends after ``base + extra + xc``. An op with a span (``op_span[i] >=
    0``) keeps its start (``startn``/``spool``, narrowed as ``_narrow`` does) and its row
    minima (``smin[i]``). ``emax[i]``:
    the row maxima of op ``i``'s end where ``need[i]``; ``it_end``: each iteration's latest
    end, from 0. Row by row, in loops the compiler vectorises."""
    n = coll.shape[0]
    T = endn.shape[1]
    N = tmp.shape[1]
    for i in range(n):
        a, b = dep_ptr[i], dep_ptr[i + 1]
        it = its[i]
        if coll[i]:
            c = slot[i]
            for t in range(T):
                v = 0.0
                if b > a:
                    v = emax[dep_idx[a], t]
                    for j in range(a + 1, b):
                        v = _mx(v, emax[dep_idx[j], t])
                t1 = v + base[c, t] + extra[c, t] + xc[c, t]
                S[c, t] = v
                E[c, t] = t1
                endn[i, t] = t1
                emax[i, t] = t1
                if it < iterations:
                    it_end[it, t] = _mx(it_end[it, t], t1)
            width[i] = 1
            continue
        # the start, ``sw`` columns wide, in ``tmp``
        sw = 1
        for j in range(a, b):
            if width[dep_idx[j]] > 1:
                sw = N
        for t in range(T):
            r = tmp[t, :sw]
            if b == a:
                r[0] = 0.0
                continue
            for j in range(a, b):
                dj = dep_idx[j]
                if width[dj] > 1:
                    src = pool[pool_of[dj], t]
                    if j == a:
                        for w in range(sw):
                            r[w] = src[w]
                    else:
                        for w in range(sw):
                            x = r[w]
                            y = src[w]
                            r[w] = x if (x >= y or x != x) else y
                else:
                    y = endn[dj, t]
                    if j == a:
                        for w in range(sw):
                            r[w] = y
                    else:
                        for w in range(sw):
                            x = r[w]
                            r[w] = x if (x >= y or x != x) else y
        k = op_span[i]
        if k >= 0:
            for t in range(T):
                smin[i, t] = _row_min(tmp[t, :sw])
            if sw > 1 and not _all_same(tmp):
                if sp_of[k] < 0:
                    raise ValueError("_schedule_pass: a wide start without a row of the pool")
                swidth[k] = N
                spool[sp_of[k]] = tmp
            else:
                swidth[k] = 1
                for t in range(T):
                    startn[k, t] = tmp[t, 0]
        # the end, ``ew`` columns wide: the start, + d, + x (in that order)
        p = op_d[i]
        q = op_x[i] if p >= 0 else -1
        ew = sw
        if p >= 0 and dwi[p] >= 0:
            ew = N
        if q >= 0 and xwi[q] >= 0:
            ew = N
        if ew > 1:
            if pool_of[i] < 0:
                raise ValueError("_schedule_pass: a wide end without a row of the pool")
            dst = pool[pool_of[i]]
        else:
            dst = tmp
        for t in range(T):
            r = dst[t, :ew]
            if ew > 1:
                if sw > 1:
                    src = tmp[t]
                    for w in range(ew):
                        r[w] = src[w]
                else:
                    y = tmp[t, 0]
                    for w in range(ew):
                        r[w] = y
            if p >= 0:
                if dwi[p] >= 0:
                    src = Dw[dwi[p], t]
                    for w in range(ew):
                        r[w] += src[w]
                else:
                    y = Dn[p, t]
                    for w in range(ew):
                        r[w] += y
                if q >= 0:
                    if xwi[q] >= 0:
                        src = Xw[xwi[q], t]
                        for w in range(ew):
                            r[w] += src[w]
                    else:
                        y = Xn[q, t]
                        for w in range(ew):
                            r[w] += y
        if ew > 1 and _all_same(dst):
            ew = 1
        width[i] = ew
        if ew == 1:
            for t in range(T):
                endn[i, t] = dst[t, 0]
        if need[i]:
            for t in range(T):
                m = endn[i, t] if ew == 1 else _row_max(dst[t])
                emax[i, t] = m
                if it < iterations:
                    it_end[it, t] = _mx(it_end[it, t], m)


@jit(cache=True, nogil=True, inline="always")
def _mn(a, b):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA runs it as Python)
    """``np.minimum(a, b)`` of two floats: ``a`` where ``a <= b`` or ``a`` is NaN, else ``b``."""
    return a if (a <= b or a != a) else b


@jit(cache=True, nogil=True, error_model="numpy")
def _shared_steps(S, base, weight, a, row_first, pb, same, widest, out_t, out_v,
                  out_k):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA runs it as Python)
    """``ScheduleTemplate._shared_extra``'s steps, lane after lane (a lane: row ``n``'s
    collective ``a[n]`` in candidate ``t``, its partners ``pb[row_first[n]:row_first[n + 1]]``
    in the order they start, ties in their own order, as ``np.lexsort`` orders them), each
    figure by numpy's operations (IEEE division: ``error_model`` numpy), the steps that can
    change anything only (the same partners as the numpy loop's ``useful``). Each step that
    moves anything gives two delays (flat index into ``(C, T)``, seconds, place in the
    summing order), written from the start of ``out_t``/``out_v``/``out_k``; returns how many."""
    T = S.shape[1]
    A = a.size
    got = 0
    inf = np.inf
    idx = np.empty(max(widest, 1), dtype=np.int64)
    for t in range(T):
        for n in range(A):
            lo, m = row_first[n], row_first[n + 1] - row_first[n]
            c = a[n]
            wa = weight[c, t]
            if not (base[c, t] > 0 and wa > 0):
                continue
            for j in range(m):                   # the partners in the order they start (stable)
                v = S[pb[lo + j], t]
                h = j
                while h > 0 and S[pb[idx[h - 1]], t] > v:
                    idx[h] = idx[h - 1]
                    h -= 1
                idx[h] = lo + j
            sa = S[c, t]
            ck = sa
            lf = base[c, t]
            for j in range(m):
                q = idx[j]
                bt = pb[q]
                wb = weight[bt, t]
                sb = S[bt, t]
                eb = sb + base[bt, t]
                if not (same[q] and wb > 0 and eb > sa):
                    continue
                alone = _mx(sb - ck, 0.0)
                lf = lf - _mn(lf, alone)
                ck = _mx(ck, sb)
                fa = wa / (wa + wb)                   # a's share while both run
                fb = 1.0 - fa
                left_b = _mx(eb - ck, 0.0)
                x = lf / fa if fa > 0 else inf
                y = left_b / fb if fb > 0 else inf
                span = _mn(x, y)
                span = _mx(span, 0.0) if (span - span) == 0.0 else 0.0
                if span > 0:
                    order = (j * 2) * A + n           # the step's place: the collective first
                    out_t[got] = c * T + t
                    out_v[got] = span * fb
                    out_k[got] = order
                    out_t[got + 1] = bt * T + t
                    out_v[got + 1] = span * fa
                    out_k[got + 1] = order + A
                    got += 2
                lf = lf - span * fa
                ck = ck + span
                if not lf > 0:
                    break
    return got


@jit(cache=True, nogil=True)
def _hbm_meetings(ks0, ke0, kp, mr, mt, cm, S, E, own, has_own, kk, rk, cl, rc, kk1, rk1, cl1, rc1, brow,
                  mine, mine2, mrow, side, extra, full, xc):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA runs it as Python)
    """The HBM losses of ``ScheduleTemplate._hbm_extra`` for every meeting (pair, candidate)
    ``m``: its kernel's row ``kp[m]`` of ``ks0``/``ke0``, its pair ``mr[m]``, candidate
    ``mt[m]``, collective ``cm[m]``; its rates row ``brow[m]`` of ``kk``, ``rk``, ``cl``,
    ``rc`` (where negative, row ``-1 - brow[m]`` of ``kk1``, ``rk1``, ``cl1``, ``rc1``: rates
    the same on every rank); what it added last pass row ``mrow[m]`` of ``mine`` (none where
    -1; where below -1, row ``-2 - mrow[m]`` of ``mine2``). Rank by rank with numpy's arithmetic, element by element (``np.maximum(a, b)`` is
    ``a if a >= b else b``): the same figures. The kernel's loss is added to ``extra`` in the
    order of ``m`` (a kernel's pairs in order: its sum in that order) and put in ``full``; the
    collective's slowest rank's loss is taken into ``xc``.

    Each meeting's rows are picked once (views over its ranks) and its ranks run in loops
    that no longer choose a row per element (the rates one figure or one per rank, the
    collective's side in a loop of its own): the same operations on each element, in the same
    order, as one loop over the ranks that picks the rows element by element
    (``tests/host/test_iteration.py`` keeps that loop as the specification). The loops stay
    mostly scalar in the compiled code; at thousands of ranks the pass is bound by reading and
    writing its rows (about 56 bytes per meeting and rank)."""
    M = kp.shape[0]
    W = ks0.shape[2]
    none = np.zeros(W)
    for m in range(M):
        k, t, c, r, b, q = kp[m], mt[m], cm[m], mr[m], brow[m], mrow[m]
        one = b < 0
        if one:
            b = -1 - b
        sc, ec = S[c, t], E[c, t]
        ecm = ec - own[c, t] if has_own else ec - 0.0
        s0 = ks0[k, t]
        e0 = ke0[k, t]
        if q >= 0:
            got = mine[q, t]
        elif q < -1:
            got = mine2[-2 - q, t]
        else:
            got = none
        add = extra[k, t]
        put = full[r, t]
        if one:
            rk0, kk0 = rk1[b, t, 0], kk1[b, t, 0]
            for w in range(W):
                at = s0[w] if s0[w] >= sc else sc
                work = e0[w] - got[w] - at
                work = work if work >= 0.0 else 0.0
                left = ec - at
                left = left if left >= 0.0 else 0.0
                pa = work * rk0
                pb = left * kk0
                ov = pa if pa <= pb else pb
                add[w] += ov
                put[w] = ov
        else:
            rkw, kkw = rk[b, t], kk[b, t]
            for w in range(W):
                at = s0[w] if s0[w] >= sc else sc
                work = e0[w] - got[w] - at
                work = work if work >= 0.0 else 0.0
                left = ec - at
                left = left if left >= 0.0 else 0.0
                pa = work * rkw[w]
                pb = left * kkw[w]
                ov = pa if pa <= pb else pb
                add[w] += ov
                put[w] = ov
        if side[m]:
            if one:
                rcw, clw = rc1[b, t], cl1[b, t]
                step = 0
            else:
                rcw, clw = rc[b, t], cl[b, t]
                step = 1
            lmax = -np.inf
            for w in range(W):
                at = s0[w] if s0[w] >= sc else sc
                x = ecm - at
                x = x if x >= 0.0 else 0.0
                y = e0[w] - at
                y = y if y >= 0.0 else 0.0
                pa = x * rcw[w * step]
                pb = y * clw[w * step]
                lost = pa if pa <= pb else pb
                if lost > lmax or w == 0:
                    lmax = lost
            cur = xc[c, t]
            xc[c, t] = cur if cur >= lmax else lmax


@jit(cache=True, nogil=True)
def _clear_rows(full, meet, dirty):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA runs it as Python)
    """``full[~meet] = 0.0`` for ``full`` ``(R, T, W)`` and ``meet`` ``(R, T)``, writing only
    the rows ``dirty`` marks (those that may hold figures other than 0; the others are 0
    already); then marks the rows that meet (which the caller writes) and no others."""
    R, T, W = full.shape
    for r in range(R):
        for t in range(T):
            if dirty[r, t] and not meet[r, t]:
                row = full[r, t]
                for w in range(W):
                    row[w] = 0.0
            dirty[r, t] = meet[r, t]


#: Whether :meth:`ScheduleTemplate.iteration_s` runs its passes compiled (:func:`_schedule_pass`;
#: without numba, its numpy loop: the same figures).
_COMPILED_PASS = HAVE_NUMBA


class _CompiledSchedule:
    """What :func:`_schedule_pass` takes for one evaluation of :meth:`ScheduleTemplate.iteration_s`
    (the ops, each op's seconds, which ops can end with one figure per rank, the buffers), and
    its passes (:meth:`run`). ``flat``: each key's seconds; ``xops``: the ops the sharing
    models may stretch (``xr``'s keys), also those whose spans they read; ``need``: per op,
    whether its row maxima are read."""

    def __init__(self, tpl: "ScheduleTemplate", flat: dict[str, np.ndarray], T: int, N: int,
                 xops: set[int], need: list[bool]) -> None:
        self.ok = False
        coll, slot, its, ptr, idx = tpl._pass_arrays()
        n = len(tpl.ops)
        op_d = np.full(n, -1, dtype=np.int64)
        index: dict[str, int] = {}
        narrow: list[np.ndarray] = []
        wide: list[np.ndarray] = []
        dwi: list[int] = []
        maybe = np.zeros(n, dtype=np.bool_)      # whether an op's end can be one figure per rank
        span_wide: dict[int, bool] = {}
        for i, (phase, _, collective, deps) in enumerate(tpl.ops):
            if collective:
                continue
            m = any(maybe[d] for d in deps)
            if i in xops:
                span_wide[i] = m
            v = flat.get(phase)
            if v is None:
                maybe[i] = m
                continue
            k = index.get(phase)
            if k is None:
                r = _as_rows(v, T, N)
                if r is None:
                    return
                k = index[phase] = len(dwi)
                if r.shape[1] > 1:
                    dwi.append(len(wide))
                    wide.append(r)
                    narrow.append(np.zeros(T))
                else:
                    dwi.append(-1)
                    narrow.append(r[:, 0])
            op_d[i] = k
            maybe[i] = m or dwi[k] >= 0 or i in xops
        self.ops = (coll, slot, its, tpl.iterations, ptr, idx)
        self.op_d = op_d
        self.dwi = np.array(dwi, dtype=np.int64)
        self.Dn = np.array(narrow, dtype=float).reshape(len(dwi), T)
        self.Dw = np.stack(wide) if wide else np.zeros((0, T, N))
        self.need = np.array(need, dtype=np.bool_)
        self.pool_of = np.where(maybe, np.cumsum(maybe) - 1, -1).astype(np.int64)
        spans = sorted(span_wide)
        self.span_ops = spans
        self.op_span = np.full(n, -1, dtype=np.int64)
        self.op_span[spans] = np.arange(len(spans))
        sw = np.array([span_wide[i] for i in spans], dtype=np.bool_)
        self.sp_of = np.where(sw, np.cumsum(sw) - 1, -1).astype(np.int64)
        self.xops = xops
        self.T, self.N = T, N
        self.endn = np.zeros((n, T))
        self.pool = np.empty((int(maybe.sum()), T, N))
        self.width = np.ones(n, dtype=np.int64)
        self.emax = np.zeros((n, T))
        self.tmp = np.empty((T, N))
        self.startn = np.zeros((len(spans), T))
        self.spool = np.empty((int(sw.sum()), T, N))
        self.swidth = np.ones(len(spans), dtype=np.int64)
        self.smin = np.zeros((n, T))
        # each pass's stretches, one row per op in ``xops`` at most
        self.op_x = np.full(n, -1, dtype=np.int64)
        self.xwi = np.full(len(xops), -1, dtype=np.int64)
        self.Xn = np.zeros((len(xops), T))
        self.Xw = np.empty((len(xops), T, N))
        self.ok = True

    def run(self, xr: dict[int, Any], base: np.ndarray, extra: np.ndarray, xc: np.ndarray, S: np.ndarray,
            E: np.ndarray) -> tuple[dict[int, tuple[np.ndarray, np.ndarray]], np.ndarray, np.ndarray] | None:
        """One pass (``xr``: each op's stretch), writing ``S`` and ``E``: the ops' spans
        (``_narrow``'s shapes), each op's row maxima (``(n, T)``, rows where read) and each
        iteration's end; None where an ``xr`` is not one the pass takes (the numpy loop then
        runs). The spans are views of buffers the next pass writes."""
        T, N = self.T, self.N
        op_x = self.op_x
        op_x.fill(-1)
        xwi, Xn, Xw = self.xwi, self.Xn, self.Xw
        q = k = 0
        for i, v in xr.items():
            if i not in self.xops:
                return None
            if type(v) is float:                  # (what a kernel that meets nothing is stretched by)
                Xn[q] = v
                xwi[q] = -1
            else:
                r = v if (type(v) is np.ndarray and v.ndim == 2 and v.shape[0] == T) else _as_rows(v, T, N)
                if r is None or r.shape[1] not in (1, N):
                    return None
                if r.shape[1] > 1:
                    Xw[k] = r
                    xwi[q] = k
                    k += 1
                else:
                    Xn[q] = r[:, 0]
                    xwi[q] = -1
            op_x[i] = q
            q += 1
        Xn, Xw, xwi = Xn[:q], Xw[:k], xwi[:q]
        coll, slot, its, iterations, ptr, idx = self.ops
        it_end = np.zeros((iterations, T))
        _schedule_pass(coll, slot, its, iterations, ptr, idx, self.op_d, self.dwi, self.Dn, self.Dw, op_x,
                       xwi, Xn, Xw, base, extra, xc, self.need, self.pool_of,
                       self.op_span, self.sp_of, self.endn, self.pool, self.width, self.emax, self.tmp,
                       self.startn, self.spool, self.swidth, self.smin, S, E, it_end)
        spans: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for k, i in enumerate(self.span_ops):
            start = self.spool[self.sp_of[k]] if self.swidth[k] > 1 else self.startn[k].reshape(T, 1)
            end = self.pool[self.pool_of[i]] if self.width[i] > 1 else self.endn[i].reshape(T, 1)
            spans[i] = (start, end)
        return spans, self.emax, it_end


class ScheduleTemplate:
    """The op graph of a run (:func:`build_iteration_graph`: same phases, streams and
    dependencies, same iterations, the same gradient buckets) with the ranks folded into a
    vector: evaluated as a list schedule in which every op starts when its dependencies (stream
    order included) have ended, a collective when the last rank is ready (a barrier), and lasts
    its duration.

    Each op has a key: its phase, or for the ops the dense gradients' buckets add
    (``buckets``: ``host.schedule.GradientBuckets``, :func:`iteration_buckets`) the keys of
    :func:`keyed_buckets` (``top_bwd#0``, ``allreduce#1``, ``dense_opt#0``...): the backward
    pieces between bucket boundaries, each bucket's AllReduce on the ``grad`` stream and the
    optimizer steps, with the dependencies ``host.schedule.bucket_gradients`` gives them in the
    simulator's graph. :attr:`keys` lists them.

    :meth:`iteration_s` is the simulator's measure (the end of the last measured iteration
    minus the end of the warm-up, over the measured iterations) on that schedule, for a batch of
    ``T`` candidate plans at once: per-rank ops give ``(T, N)`` seconds, collectives ``(T,)``.

    A hierarchical AllReduce is folded into its three phases (intra-node reduce-scatter,
    inter-node rings, intra-node all-gather) as three collectives in sequence, so that each
    shares the link it uses (:meth:`_allreduce_phases`); the simulator runs the same phases
    inside one op.

    Left out (measured by ``neonic bench planner``, predicted vs simulated): flow-level
    contention inside a collective, and queueing; SMs and HBM shared between kernels and
    collectives, between two concurrent kernels, and concurrent collectives sharing the NIC
    and the NVLink, only as :meth:`iteration_s` describes.
    """

    def __init__(self, spec: IterationSpec, buckets: "GradientBuckets | None" = None) -> None:
        self.spec = spec
        emb_stream = "cpu" if spec.embeddings == "cpu" else "compute"
        keyed = None
        self.bucket_payloads: dict[str, Any] = {}
        if buckets is not None:
            keyed, self.bucket_payloads = keyed_buckets(buckets)
        graph = build_iteration_graph(spec, 1, lambda phase, it, rank: phase, emb_stream, keyed, phases=spec.phases())
        its = spec.warmup + spec.iterations
        # each op of the graph; a hierarchical AllReduce as its three phases in sequence (its
        # intra-node reduce-scatter on the NVLink, the inter-node rings on the NIC, the intra-node
        # all-gather on the NVLink: sim.network.collectives runs them one after the other), each
        # phase a collective of its own with its share of the AllReduce's time and HBM bytes
        phases_of = self._allreduce_phases(spec)
        self.ops: list[tuple[str, int, bool, tuple[int, ...]]] = []
        self.streams: list[str] = []
        last: dict[int, int] = {}        # graph op id -> index of its (last) op here
        parts: list[tuple[str, float, float, int]] = []   # per collective: (tag, time, bytes, resource)
        for op in _topological(graph.ops):
            deps = tuple(last[d.id] for d in op.deps)
            if not op.collective:
                self.ops.append((op.payload, op.iteration, False, deps))
                self.streams.append(op.stream)
                last[op.id] = len(self.ops) - 1
                continue
            split = phases_of if str(op.payload).startswith("allreduce") and phases_of else None
            if split is None:
                res = _NVLINK if op.phase in NODE_LOCAL_COLLECTIVES else _NIC
                split = ((str(op.payload), 1.0, 1.0, res),)
            for j, (tag, f_time, f_bytes, res) in enumerate(split):
                self.ops.append((op.payload, op.iteration, True, deps if j == 0 else (len(self.ops) - 1,)))
                self.streams.append(op.stream)
                parts.append((f"{op.payload}:{tag}" if len(split) > 1 else tag, f_time, f_bytes, res))
            last[op.id] = len(self.ops) - 1
        self.keys = tuple(dict.fromkeys(op[0] for op in self.ops))
        colls = [i for i, op in enumerate(self.ops) if op[2]]
        self._coll_slot = {i: n for n, i in enumerate(colls)}
        self._coll_it = [self.ops[i][1] for i in colls]
        #: per collective slot: a name (its key, ``:rs``/``:ar``/``:ag`` for an AllReduce's
        #: phases), its share of its op's time and HBM bytes, the link it shares (NIC or NVLink)
        self._coll_tag = [t for t, _, _, _ in parts]
        self._coll_time = np.array([f for _, f, _, _ in parts])
        self._coll_bytes = np.array([b for _, _, b, _ in parts])
        self._coll_res = np.array([r for _, _, _, r in parts], dtype=np.int64)
        its_of = [op[1] for op in self.ops]
        self._kernel_pairs = self._concurrent_kernels()
        # each collective and the collectives of later streams (input < grad < comm) of
        # neighbouring iterations it can run beside, in graph (= each stream's) order: a batch's
        # input AlltoAll runs one iteration ahead at most; the gradient buckets beside the
        # gradient AlltoAll and the all-gather
        self._sharing: list[tuple[int, list[int]]] = []
        order = {s: n for n, s in enumerate(_SHARED_STREAMS)}
        for a in colls:
            sa = order.get(self.streams[a])
            if sa is None:
                continue
            partners = [self._coll_slot[b] for b in colls
                        if order.get(self.streams[b], -1) > sa and abs(its_of[a] - its_of[b]) <= 1]
            if partners:
                self._sharing.append((self._coll_slot[a], partners))
        self.iterations = its
        # the same pairs as padded arrays (partners of every collective side by side)
        width = max((len(p) for _, p in self._sharing), default=0)
        part = np.zeros((len(self._sharing), width), dtype=int)
        valid = np.zeros((len(self._sharing), width), dtype=bool)
        for n, (_, p) in enumerate(self._sharing):
            part[n, :len(p)] = p
            valid[n, :len(p)] = True
        self._sharing_arrays = (np.array([a for a, _ in self._sharing], dtype=int), part, valid)
        # the same pairs as one flat list, row by row (:meth:`_shared_extra`): each pair's row,
        # partner slot and whether both use the same link; where each row's pairs begin
        self._pair_row = np.repeat(np.arange(len(self._sharing)), [len(p) for _, p in self._sharing]).astype(np.int64)
        self._pair_b = np.array([b for _, p in self._sharing for b in p], dtype=np.int64)
        self._pair_same = (self._coll_res[self._pair_b] == self._coll_res[self._sharing_arrays[0][self._pair_row]]
                           if self._pair_b.size else np.zeros(0, dtype=bool))
        self._row_first = np.concatenate([[0], np.cumsum([len(p) for _, p in self._sharing])]).astype(np.int64)

    #: Fixed-point passes of the sharing models at most (see :meth:`iteration_s`). Each pass
    #: takes the stretches the last one gave, undamped: with the kernels' HBM losses in closed
    #: form (:meth:`_hbm_extra`) every plan of ``neonic bench planner`` (model-a, -i, -f at
    #: 16 x 8) and every batch of model-a's search reaches :data:`SHARING_TOL` in 2-20 passes.
    #: (Averaging each pass with the last, as before, halved the steps of modes that had
    #: settled: 8 passes left force:table-row-wise 0.7 ms and Neo's plan 0.3 ms from the
    #: fixed point on model-a, enough to rank them the wrong way round.)
    SHARING_PASSES = 64
    #: A candidate's fixed point is reached when no stretch moves by more than this (seconds)
    #: in a pass; its figure is then within a few times this of the fixed point's (model-a:
    #: ~1e-10 s), far below the search's :data:`host.planner.search._IMPROVE_REL` of an
    #: iteration.
    SHARING_TOL = 1e-9

    def _before(self) -> list[int]:
        """Per op, a bit set of the ops it follows, directly or through other ops (made once)."""
        got = self.__dict__.get("_before_sets")
        if got is None:
            got = []
            for _, _, _, deps in self.ops:
                b = 0
                for d in deps:
                    b |= got[d] | (1 << d)
                got.append(b)
            self.__dict__["_before_sets"] = got
        return got

    def _pass_arrays(self) -> tuple[np.ndarray, ...]:
        """The ops as :func:`_schedule_pass` takes them (made once): whether each is a
        collective, its collective slot (-1: none), its iteration, its dependencies (each op's
        from ``ptr[i]`` to ``ptr[i + 1]`` of ``idx``)."""
        got = self.__dict__.get("_pass_ops")
        if got is None:
            n = len(self.ops)
            ptr = np.zeros(n + 1, dtype=np.int64)
            ptr[1:] = np.cumsum([len(op[3]) for op in self.ops])
            got = self.__dict__["_pass_ops"] = (
                np.array([op[2] for op in self.ops], dtype=np.bool_),
                np.array([self._coll_slot.get(i, -1) for i in range(n)], dtype=np.int64),
                np.array([op[1] for op in self.ops], dtype=np.int64), ptr,
                np.array([d for op in self.ops for d in op[3]], dtype=np.int64))
        return got

    def _needs_max(self) -> list[bool]:
        """Per op, whether :meth:`iteration_s` reads its latest end over the ranks: a
        collective that follows it starts there (a barrier), and an iteration ends at its ops'
        latest (made once)."""
        got = self.__dict__.get("_need_max")
        if got is None:
            got = [it < self.iterations for _, it, _, _ in self.ops]
            for _, _, collective, deps in self.ops:
                if collective:
                    for d in deps:
                        got[d] = True
            self.__dict__["_need_max"] = got
        return got

    def _concurrent_colls(self, i: int) -> frozenset[int]:
        """The collectives (slots) that op ``i`` can run beside: neither follows the other. (A
        collective that follows a kernel starts after the kernel ends on every rank, and one it
        follows ends before the kernel starts on any: such a pair never meets.)"""
        memo = self.__dict__.setdefault("_concurrent_memo", {})
        got = memo.get(i)
        if got is None:
            before = self._before()
            got = memo[i] = frozenset(c for j, c in self._coll_slot.items()
                                      if not (before[j] >> i) & 1 and not (before[i] >> j) & 1)
        return got

    def _concurrent_kernels(self) -> list[tuple[int, int]]:
        """The pairs of GPU kernels (ops on the ``compute`` and ``opt`` streams, neighbouring
        iterations) that can run at once on a rank: neither depends on the other, directly or
        through other ops (e.g. the dense optimizer's step beside the embedding backward)."""
        kernels = [i for i, (_, _, coll, _) in enumerate(self.ops) if not coll and self.streams[i] in _KERNEL_STREAMS]
        if len({self.streams[i] for i in kernels}) < 2:
            return []
        before = self._before()
        return [(i, j) for n, i in enumerate(kernels) for j in kernels[n + 1:]
                if self.streams[i] != self.streams[j] and abs(self.ops[i][1] - self.ops[j][1]) <= 1
                and not (before[j] >> i) & 1 and not (before[i] >> j) & 1]

    def _kernel_extra(self, spans: dict[int, tuple[np.ndarray, np.ndarray]], kern: dict[int, np.ndarray],
                      pairs: list[tuple[int, int]], own: dict[tuple[int, int], tuple[Any, Any]]
                      ) -> tuple[dict[int, Any], dict[tuple[int, int], tuple[Any, Any]]]:
        """How much later two kernels that overlap on a rank end (``spans``: each one's start
        and end, ``(T, N)``; ``kern``: its HBM demand; ``own``: what each pair added to its
        kernels' ends last pass, taken out here), by ``sim.interference``'s block scheduling:
        every kernel is launched as a grid over every SM in ``default_waves`` waves, so the one
        launched second gets SMs only once the first one's last wave (its last ``1 / waves``)
        has started (left-over policy, equal priority) and waits until then; from there both
        share HBM at the two-client common rate (``kernel_comm_hbm_rate``) until one of them
        is done, and each ends later by that time times what it loses. Returns each kernel's
        delay and each pair's share of it. APPROXIMATION: the hand-over of the SMs as the first
        kernel's CTAs retire is taken as instant, and each pair apart from the kernels' other
        partners (collectives: :meth:`_hbm_extra`)."""
        from neonic.sim.interference import CommEngineSpec, kernel_comm_hbm_rate

        waves = CommEngineSpec().default_waves
        out: dict[int, Any] = {}
        per_pair: dict[tuple[int, int], tuple[Any, Any]] = {}
        for i, j in pairs:
            xi, xj = own.get((i, j), (0.0, 0.0))
            si, ei = spans[i]
            sj, ej = spans[j]
            ei, ej = ei - xi, ej - xj                          # their ends without each other
            first = si <= sj
            sa, ea = np.where(first, si, sj), np.where(first, ei, ej)
            sb, eb = np.where(first, sj, si), np.where(first, ej, ei)
            meet = sb < ea
            if not np.any(meet):
                continue
            last = ea - (ea - sa) / waves                      # the first one's last wave starts
            go = np.maximum(sb, last)
            wait = np.where(meet, np.maximum(np.minimum(last, ea) - sb, 0.0), 0.0)
            di, dj = kern.get(i, 0.0), kern.get(j, 0.0)
            rate = kernel_comm_hbm_rate(np.where(first, di, dj), np.where(first, dj, di), self.spec.interference)
            work = np.minimum(np.maximum(ea - go, 0.0), np.maximum(eb - sb, 0.0))   # done side by side
            lost = np.where(meet, work / rate - work, 0.0)
            per_pair[i, j] = (np.where(first, lost, wait + lost), np.where(first, wait + lost, lost))
            out[i] = out.get(i, 0.0) + per_pair[i, j][0]
            out[j] = out.get(j, 0.0) + per_pair[i, j][1]
        return out, per_pair

    @staticmethod
    def _allreduce_phases(spec: IterationSpec) -> tuple[tuple[str, float, float, int], ...] | None:
        """A hierarchical AllReduce's phases as the template runs them, or None to keep it one
        NIC-bound op: (name, share of the AllReduce's time, share of its HBM bytes, link), from
        the spec's :func:`allreduce_terms` (the reduce-scatter and the all-gather each half of
        the intra-node share: the same ring over the same bytes)."""
        t, b = spec.ar_intra_time, spec.ar_intra_bytes
        if spec.allreduce != "hierarchical" or not 0 < t < 1:
            return None
        return (("rs", t / 2, b / 2, _NVLINK), ("ar", 1 - t, 1 - b, _NIC), ("ag", t / 2, b / 2, _NVLINK))

    def _shared_extra(self, S: np.ndarray, base: np.ndarray, weight: np.ndarray) -> np.ndarray:
        """How much later each collective ends when an input AlltoAll shares the network with
        the comm stream's collectives it overlaps (starts ``S``, isolated times ``base``, each
        ``(C, T)``; ``weight`` ``(C, T)`` or ``(C,)``: the flows each keeps open through a NIC): a fluid model,
        partner by partner in the order they start. Alone, a collective progresses at full rate; beside a
        partner each gets its share of the NIC in proportion to its flows (max-min fairness per
        flow; equal weights: half each) until one of them is done, and each ends later by the
        time it lost. APPROXIMATION: partners are taken one after the other, so when two
        partners of one collective overlap each other (a bucket's AllReduce beside the gradient
        AlltoAll, both beside an input AlltoAll) the three-way share is priced as two pairwise
        ones; a partner's work left is its isolated end minus the clock.

        Evaluation: each (collective, candidate) walks its partners in the order they start
        (ties: the partners' order), but only those that can change anything: on the same
        link, both with flows on it, the partner ending after the collective starts, while the
        collective has work left (every other step leaves its clock's effect, its work and all
        delays as they are). The delays are then summed per collective and candidate in the
        order of the steps (the partner's place in the start order, the collective's own share
        before its partners', rows in order): the same sums, in the same order, as stepping
        every partner of every row at once."""
        extra = np.zeros_like(base)
        if not self._sharing:
            return extra
        a = self._sharing_arrays[0]
        C, T = S.shape
        A = a.size
        pr, pb = self._pair_row, self._pair_b
        weight = np.broadcast_to(np.asarray(weight, float).reshape(len(weight), -1), S.shape)
        if _COMPILED_PASS:
            # the same steps, lane by lane (:func:`_shared_steps`), summed in the same order
            size = 2 * T * pr.size
            out_t, out_v, out_k = np.empty(size, dtype=np.int64), np.empty(size), np.empty(size, dtype=np.int64)
            widest = int(np.diff(self._row_first).max())
            got = _shared_steps(S, base, weight, a, self._row_first, pb, self._pair_same, widest, out_t, out_v, out_k)
            if got:
                order = np.argsort(out_k[:got], kind="stable")
                np.add.at(extra.reshape(-1), out_t[:got][order], out_v[:got][order])
            return extra
        # per candidate: the pairs row by row, each row's partners in the order they start
        perm = np.lexsort((S[pb].T, np.broadcast_to(pr, (T, pr.size))))           # (T, NP)
        rows = pr                                                                  # row at each place
        place = np.arange(pr.size) - self._row_first[rows]                         # place in the row's order
        b = pb[perm]                                                               # (T, NP) partner slots
        tt = np.broadcast_to(np.arange(T)[:, None], b.shape)
        ra = np.broadcast_to(a[rows], b.shape)
        wa, wb = weight[ra, tt], weight[b, tt]
        sa = S[ra, tt]
        useful = self._pair_same[perm] & (wa > 0) & (wb > 0) & (S[b, tt] + base[b, tt] > sa) & (base[ra, tt] > 0)
        t_of, q_of = np.nonzero(useful)                # by candidate, row, start order
        if t_of.size == 0:
            return extra
        n_of = rows[q_of]
        j_of = place[q_of]
        b_of = b[t_of, q_of]
        lane = t_of * A + n_of
        first = np.flatnonzero(np.r_[True, lane[1:] != lane[:-1]])               # each lane's first step
        length = np.diff(np.r_[first, lane.size])
        lt, ln = t_of[first], n_of[first]
        la = a[ln]
        clock = S[la, lt].copy()            # each (collective, candidate)'s clock
        left = base[la, lt].copy()          # its work left
        w_a = weight[la, lt]
        live = np.arange(first.size)
        out_t: list[np.ndarray] = []
        out_v: list[np.ndarray] = []
        out_k: list[np.ndarray] = []
        k = 0
        while live.size:
            e = first[live] + k
            bt, tc = b_of[e], lt[live]
            sb = S[bt, tc]
            eb = sb + base[bt, tc]
            lf, ck = left[live], clock[live]
            alone = np.maximum(sb - ck, 0.0)
            lf = lf - np.minimum(lf, alone)
            ck = np.maximum(ck, sb)
            wa_, wb_ = w_a[live], weight[bt, tc]
            with np.errstate(divide="ignore", invalid="ignore"):
                fa = wa_ / (wa_ + wb_)                          # a's share while both run
            fb = 1.0 - fa
            left_b = np.maximum(eb - ck, 0.0)
            with np.errstate(divide="ignore", invalid="ignore"):
                span = np.minimum(np.where(fa > 0, lf / fa, np.inf), np.where(fb > 0, left_b / fb, np.inf))
            span = np.where(np.isfinite(span), np.maximum(span, 0.0), 0.0)
            got = span > 0
            if got.any():
                g = np.flatnonzero(got)
                n = ln[live[g]]
                order = (j_of[e[g]] * 2) * A + n                 # the step's place: the collective first
                out_t += [la[live[g]] * T + tc[g], bt[g] * T + tc[g]]
                out_v += [span[g] * fb[g], span[g] * fa[g]]
                out_k += [order, order + A]
            left[live] = lf - span * fa
            clock[live] = ck + span
            k += 1
            live = live[(length[live] > k) & (left[live] > 0)]
        if out_t:
            key = np.concatenate(out_k)
            order = np.argsort(key, kind="stable")
            np.add.at(extra.reshape(-1), np.concatenate(out_t)[order], np.concatenate(out_v)[order])
        return extra

    def _hbm_pairs(self, kern: dict[int, np.ndarray], ksm: dict[int, np.ndarray],
                   cdem: dict[int, np.ndarray]) -> dict[int, tuple[np.ndarray, list, list, np.ndarray]]:
        """For each kernel op, the collectives of its own and the neighbouring iterations that
        can run beside it (:meth:`_concurrent_colls`) and slow it while they overlap, each with
        what the kernel and the collective lose of their rates: both the common rate of a shared HBM (``sim.interference.kernel_comm_hbm_rate``,
        demands ``kern`` and ``cdem``), the kernel also what the collective's channels leave it
        of the SMs (``kernel_sm_rate``, demand ``ksm``, ``spec.comm_sm_share``). The rates
        depend on the demands only, which depend on the op's key (phase or bucket op), so each
        pair of keys is priced once per evaluation.

        Per kernel op: the collectives' slots ``(H,)``, the kernel's and the collectives'
        losses (``H`` arrays), and which collectives lose anything ``(H,)``."""
        from neonic.sim.interference import kernel_comm_hbm_rate, kernel_sm_rate

        share = self.spec.comm_sm_share
        kernels = tuple(sorted(set(kern) | set(ksm)))
        colls = None if share > 0 else tuple(cdem)
        # which (kernel, collective) pairs can meet depends on which ops have demands only: the
        # same for every evaluation with the same ones (kept, a few of them)
        memo = self.__dict__.setdefault("_met_memo", {})
        made = memo.get((kernels, colls))
        if made is None:
            made = self._meetings(kernels, range(len(self._coll_slot)) if colls is None else colls)
            if len(memo) < 8:
                memo[(kernels, colls)] = made
        first, met = made
        # the losses, each kernel key's against all its collectives' demands of one shape at once
        # (elementwise: the same figures as pair by pair): the kernel's and the collective's,
        # and whether the collective loses anything; None where the kernel loses nothing
        lost: dict[tuple[str, str], tuple[np.ndarray, np.ndarray, bool] | None] = {}
        groups: dict[tuple[str, Any], list[tuple[str, str]]] = {}
        for pair, (i, c) in first.items():
            d = cdem.get(c)
            groups.setdefault((pair[0], None if d is None or kern.get(i) is None else d.shape), []).append(pair)
        for (_, shape), members in groups.items():
            i = first[members[0]][0]
            sm_loss = 1.0 - kernel_sm_rate(ksm[i], share) if share > 0 and i in ksm else None
            if shape is None:   # no HBM shared: the SMs only, the same for every member
                both = np.zeros(1)
                k_loss = both if sm_loss is None else np.maximum(both, sm_loss)
                got = (k_loss, both, False) if k_loss.max(initial=0.0) > 0 else None
                lost.update((pair, got) for pair in members)
                continue
            demands = np.stack([cdem[first[pair][1]] for pair in members])
            both = 1.0 - kernel_comm_hbm_rate(kern[i], demands, self.spec.interference)
            k_loss = both if sm_loss is None else np.maximum(both, sm_loss)
            k_any = k_loss.reshape(len(members), -1).max(axis=1, initial=0.0) > 0
            c_any = both.reshape(len(members), -1).max(axis=1, initial=0.0) > 0
            for j, pair in enumerate(members):
                lost[pair] = (_narrow(k_loss[j]), _narrow(both[j]), bool(c_any[j])) if k_any[j] else None
        out: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        for i, row in met:
            found = [(c, lost[pair]) for c, pair in row if lost[pair] is not None]
            if not found:
                continue
            out[i] = (np.array([c for c, _ in found], dtype=np.int64), [k[0] for _, k in found],
                      [k[1] for _, k in found], np.array([k[2] for _, k in found]))
        return out

    def _meetings(self, kernels: tuple[int, ...], colls: Any) -> tuple[dict, list]:
        """:meth:`_hbm_pairs`'s (kernel, collective) pairs: for each kernel op in ``kernels``,
        the collectives of ``colls`` of its own and the neighbouring iterations that can run
        beside it (:meth:`_concurrent_colls`), each with its pair of keys; and each pair of keys,
        with the first (kernel, collective) that meets it: its demands are every such pair's
        (the demands follow the keys)."""
        key = [op[0] for op in self.ops]
        cslot_key = self._coll_tag
        near: dict[int, list[int]] = {}   # an iteration -> the collectives of it and its neighbours
        first: dict[tuple[str, str], tuple[int, int]] = {}
        met: list[tuple[int, list[tuple[int, tuple[str, str]]]]] = []
        for i in kernels:
            it = self.ops[i][1]
            if it not in near:
                near[it] = [c for c in colls if abs(self._coll_it[c] - it) <= 1]
            conc = self._concurrent_colls(i)
            row = [(c, (key[i], cslot_key[c])) for c in near[it] if c in conc]
            for c, pair in row:
                if pair not in first:
                    first[pair] = (i, c)
            met.append((i, row))
        return first, met

    def _hbm_extra(self, spans: dict[int, tuple[np.ndarray, np.ndarray]], S: np.ndarray, E: np.ndarray,
                   pairs: dict[int, tuple[np.ndarray, list, list, np.ndarray]],
                   own: np.ndarray | None = None, kown: dict[tuple[int, int], np.ndarray] | None = None,
                   rates: dict | None = None, ends_max: Any = None, starts_min: np.ndarray | None = None
                   ) -> tuple[dict[int, np.ndarray], np.ndarray, dict[tuple[int, int], np.ndarray]]:
        """How much later each kernel and each collective end when they share a GPU's HBM: while
        a kernel (``spans[i]``: its start and end, ``(T, N)``) overlaps a collective (``S``/``E``,
        ``(C, T)``) on a rank, both run at the common rate their demands leave them
        (:meth:`_hbm_pairs`), each ending later by what it loses of its rate while they overlap.
        Each side's loss is in closed form from its own work left where they meet (its span less
        what this loss added to it last pass), at its rate beside the other, until the other
        ends: a kernel's per pair (``kown[i, c]``, ``(T, N)``; returned as the third value), a
        collective's (a barrier) at its slowest rank, its span less ``own`` (``(C, T)``). So
        the loss is the fixed point's in one pass, given the spans (an overlap times the loss
        of rate, taken on the span that the loss itself stretches, moves toward it by only that
        fraction a pass: 0.4 on model-a's embedding backward, the fixed point's slowest mode).
        APPROXIMATION: a kernel's collectives are taken one at
        a time (pairwise), and a collective's demand is its bytes over its isolated time (an
        average over its phases; a hierarchical AllReduce's phases each have their own,
        :meth:`_allreduce_phases`). Only the (collective, candidate) pairs whose spans meet on some
        rank are priced (the others add an overlap of 0): the same sums, in the same order.
        ``ends_max``: each op's latest end over the ranks, where :meth:`iteration_s` has it
        (``ends_max[i]``, ``(T,)``: the same figures as ``spans[i][1].max(axis=-1)``), and
        their earliest starts (``starts_min``, ``(ops, T)``: ``spans[i][0].min(axis=-1)``).
        Left out: a high-priority collective launched while a kernel holds every SM gets its
        channels only as the kernel's CTAs retire (``sim.interference``; measured on model-a,
        a gradient bucket launched during the embedding backward: 0.06 ms of its 1.39)."""
        xr: dict[int, Any] = {}
        xc = np.zeros_like(S)
        got: dict[tuple[int, int], np.ndarray] = {}
        rates = {} if rates is None else rates
        T = S.shape[1]
        if not pairs:
            return xr, xc, got
        # every (kernel, collective) pair once, flat (the same every pass of an evaluation):
        # the kernels in order, each one's collectives in order; which pairs' losses differ
        # between ranks
        prep = rates.get("__flat__")
        if prep is None or prep[0] is not pairs:
            order = list(pairs)
            sizes = [len(pairs[i][0]) for i in order]
            prep = (pairs, order, np.concatenate([np.asarray(pairs[i][0], dtype=np.int64) for i in order]),
                    np.repeat(np.arange(len(order)), sizes), np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
                    np.concatenate([np.asarray(pairs[i][3], dtype=bool).reshape(-1) for i in order]),
                    np.zeros(sum(sizes), dtype=np.int64))   # per pair: its rates' width (ranks; 0: not yet seen)
            rates["__flat__"] = prep
        _, order, flat_c, kidx, first, _, wide_rate = prep
        # the (collective, candidate) pairs whose spans meet on some rank: a few percent of
        # them; the others add nothing (an overlap of 0)
        lo = np.stack([spans[i][0].min(axis=-1) for i in order]) if starts_min is None else starts_min[order]
        hi = np.stack([spans[i][1].max(axis=-1) if ends_max is None else ends_max[i] for i in order])
        meet = (E[flat_c] > lo[kidx]) & (S[flat_c] < hi[kidx])           # (P, T)
        rows = np.flatnonzero(meet.any(axis=1))
        for i in order:
            xr[i] = 0.0
        if rows.size == 0:
            return xr, xc, got
        row_k = kidx[rows]
        # each kernel's width: every rank (N) where any of its arrays has one figure per rank,
        # else 1 (a kernel whose figures are the same on every rank is priced on one column)
        wide = np.array([max(spans[i][0].shape[-1], spans[i][1].shape[-1]) > 1 for i in order])
        for g in rows[wide_rate[rows] == 0].tolist():
            ki = int(kidx[g])
            _, k_loss, c_loss, c_any = pairs[order[ki]]
            h = g - int(first[ki])
            k, c = np.asarray(k_loss[h]), np.asarray(c_loss[h])
            wide_rate[g] = max(k.shape[-1] if k.ndim else 1, c.shape[-1] if c_any[h] and c.ndim else 1)
        wide[row_k[wide_rate[rows] > 1]] = True
        # (the ranks: the widest of the spans, the rates and what the pairs added last pass)
        N = max(max(max(spans[i][0].shape[-1], spans[i][1].shape[-1]) for i in order), int(wide_rate[rows].max()))
        if kown:
            last = rates.get("__got__")
            if last is not None and last[0] is kown:
                wide |= last[1]
                N = max(N, last[2])
            else:
                for (i, _), m in kown.items():
                    if np.shape(m)[-1] > 1 and i in pairs:
                        wide[order.index(i)] = True
                        N = max(N, np.shape(m)[-1])
        for flag in (False, True):
            sel = rows[wide[row_k] == flag]
            if sel.size == 0:
                continue
            W = N if flag else 1
            # the kernels' spans and losses, each kernel's once for all its pieces: ``(K, T, W)``
            kern = np.unique(kidx[sel])                           # the kernels, in order
            ks0 = np.empty((kern.size, T, W))
            ke0 = np.empty((kern.size, T, W))
            extra = np.zeros((kern.size, T, W))
            for n, ki in enumerate(kern.tolist()):
                ks0[n], ke0[n] = spans[order[ki]]
            # the pairs in pieces of at most HBM_CHUNK elements per array (thousands of ranks),
            # in order: each kernel's losses summed in the order of its pairs, piece after piece
            step = max(1, self.HBM_CHUNK // (T * W))
            # each pair's loss this pass (0 where it does not meet), ``(sel, T, W)``, in one of
            # two buffers per width taken in turn: the last pass's (what each pair added then,
            # also in ``kown``) stays readable while this one is written, and the pass before's
            # is no longer referenced (reusing them spares allocating and first touching one
            # each pass). With each buffer, which of its rows may hold a figure other than 0
            # (``(rows, T)``): only those are zeroed where a pair does not meet, so that a new
            # buffer's rows stay as allocated, zero, and untouched (writing zeros there first
            # touched its pages: 1 CPU-s of the planner's full evaluations at 4096 ranks)
            bufs = rates.get(("__full__", flag))
            if bufs is None:
                bufs = rates[("__full__", flag)] = [None, None, 0, None, None]
            turn = bufs[2]
            bufs[2] = 1 - turn
            buf = bufs[turn]
            if buf is None or buf.shape[0] < sel.size or buf.shape[1:] != (T, W):
                buf = bufs[turn] = np.zeros((sel.size, T, W))
                bufs[3 + turn] = np.zeros((sel.size, T), dtype=np.bool_)
            full = buf[:sel.size]   # (each piece zeroes what its pairs do not meet: the rest it writes)
            dirty = bufs[3 + turn]
            last = rates.get(("__mine__", flag))
            for n, at in enumerate(range(0, sel.size, step)):
                part = sel[at:at + step]
                self._hbm_rows((flag, n), W, part, meet[part], prep,
                               (kern, ks0, ke0, extra, full[at:at + step], last, dirty[at:at + step]),
                               S, E, own, kown, rates, xc, got)
            rates[("__mine__", flag)] = (sel, got, full)
            for n, ki in enumerate(kern.tolist()):
                xr[order[ki]] = extra[n]
        rates["__got__"] = (got, wide, N)
        return xr, xc, got

    #: Elements of one array of :meth:`_hbm_rows` at most (meeting pairs x ranks): the pairs
    #: are priced in pieces beyond it (thousands of ranks).
    HBM_CHUNK = 1 << 20

    def _hbm_rows(self, tag: tuple, W: int, rows: np.ndarray, meet: np.ndarray, prep: tuple,
                  kernels: tuple, S: np.ndarray, E: np.ndarray, own: np.ndarray | None,
                  kown: dict | None, rates: dict, xc: np.ndarray, got: dict) -> None:
        """:meth:`_hbm_extra` for the (kernel, collective) pairs ``rows`` (flat indices, in
        order; ``meet``: the candidates each meets, ``(rows, T)``) of kernels ``W`` ranks wide,
        all at once (:func:`_hbm_meetings`, rank by rank over every (pair, candidate) that
        meets): each kernel's losses are added to its row of ``kernels`` = (the kernels, their
        starts, ends and losses so far, ``(K, T, W)``; then the pairs' losses ``full``, what
        they added last pass, and which rows of ``full`` may hold figures other than 0,
        ``(rows, T)``, kept up to date here) in the order of its pairs, the
        collectives' taken into ``xc`` (a maximum), each pair's put in ``got`` (``(T, W)``, 0
        for the candidates it does not meet). ``tag``: which call of the pass (what is kept
        from the last pass is kept per tag)."""
        pairs, order, flat_c, kidx, first, flat_any, wide_rate = prep
        T = S.shape[1]
        R = rows.size
        row_k = kidx[rows]
        row_c = flat_c[rows]
        kern, ks0, ke0, extra, full, last, dirty = kernels
        kpos = np.searchsorted(kern, row_k)
        names = [order[k] for k in row_k.tolist()]
        # each pair's loss of rate k and k / (1 - k), the kernel's and the collective's (0 where
        # the collective loses nothing), ``(T, W)``: the same every pass, so each pair's is
        # made once an evaluation, in a bank of them (its row: ``bank[0][pair]``)
        # (rates that are the same on every rank in a bank one column wide: row -1 - b there)
        banks = rates.get("__bank__")
        if banks is None:
            banks = rates["__bank__"] = ({}, {1: [0] + [np.zeros((16, T, 1)) for _ in range(4)]}, {})
        at, held, same = banks
        if W not in held:
            held[W] = [0] + [np.zeros((16, T, W)) for _ in range(4)]
        # pairs whose losses are the same arrays (their kernels' and collectives' keys are the
        # same: ``_hbm_pairs`` prices each pair of keys once) share a row of the bank; each
        # bank grown once a call at most, by half at least (growing a bank of thousands of
        # ranks row by row copied it over and over)
        fresh: list[tuple[int, tuple, Any, Any, bool, int]] = []
        twins: list[tuple[int, tuple]] = []
        need: dict[int, int] = {}
        for g, ki, i in zip(rows.tolist(), row_k.tolist(), names):
            if g in at:
                continue
            h = g - int(first[ki])
            _, k_loss, c_loss, c_any = pairs[i]
            width = W if wide_rate[g] > 1 else 1
            side = bool(c_any[h])
            key = (id(k_loss[h]), id(c_loss[h]) if side else -1, width)
            if key in same:
                twins.append((g, key))
                continue
            # (the arrays kept with their row: their ids stay theirs while it is used)
            same[key] = (-1, k_loss[h], c_loss[h])
            fresh.append((g, key, k_loss[h], c_loss[h], side, width))
            need[width] = need.get(width, 0) + 1
        for width, count in need.items():
            bank = held[width]
            n = bank[0]
            if n + count > bank[1].shape[0]:
                size = max(n + count, n + n // 2, 16)
                for j in range(1, 5):
                    grown = np.zeros((size, T, width))
                    grown[:n] = bank[j][:n]
                    bank[j] = grown
        for g, key, k_arr, c_arr, side, width in fresh:
            bank = held[width]
            n = bank[0]
            bank[0] = n + 1
            at[g] = n if width > 1 else -1 - n
            same[key] = (at[g], k_arr, c_arr)
            with np.errstate(divide="ignore", invalid="ignore"):
                k = np.asarray(k_arr, float)
                bank[1][n], bank[2][n] = k, k / np.maximum(1.0 - k, 1e-12)
                if side:
                    c = np.asarray(c_arr, float)
                    bank[3][n], bank[4][n] = c, c / np.maximum(1.0 - c, 1e-12)
        for g, key in twins:
            at[g] = same[key][0]
        brow = np.array([at[g] for g in rows.tolist()], dtype=np.int64)
        one = held[1]
        wide_bank = held[W] if W > 1 else one
        # what each pair added to its kernel last pass (none: 0): the last pass's own where it
        # met there in a piece as wide (its row of that pass's losses, ``last``), else from
        # ``kown`` as given (copied into ``src2``: rows -2 - n)
        mrow = np.full(R, -1, dtype=np.int64)
        src = np.zeros((0, T, W))
        src2 = src
        if kown is not None and last is not None and last[1] is kown and last[2].shape[1:] == (T, W):
            src = last[2]
            where = np.searchsorted(last[0], rows)
            hit = where < last[0].size
            hit[hit] = last[0][where[hit]] == rows[hit]
            mrow[hit] = where[hit]
        if kown:
            # (a pair that met in a piece of the other width last pass, or kown as the caller gives it)
            more = [(r, m) for r in np.flatnonzero(mrow < 0).tolist()
                    if (m := kown.get((names[r], int(row_c[r])))) is not None]
            if more:
                src2 = np.zeros((len(more), T, W))
                for n, (r, m) in enumerate(more):
                    src2[n] = m
                    mrow[r] = -2 - n
        mr, mt = np.nonzero(meet)                                 # the (pair, candidate)s, pair by pair
        # (0 for the candidates a pair does not meet; the loop writes every rank of the others:
        # ``full[~meet] = 0.0``, rows already 0 left untouched)
        _clear_rows(full, meet, dirty)
        _hbm_meetings(ks0, ke0, kpos[mr], mr, mt, row_c[mr], S, E, np.zeros((1, 1)) if own is None else own,
                      own is not None, wide_bank[1], wide_bank[2], wide_bank[3], wide_bank[4],
                      one[1], one[2], one[3], one[4], brow[mr], src, src2, mrow[mr],
                      flat_any[rows][mr], extra, full, xc)
        for r, (i, c) in enumerate(zip(names, row_c.tolist())):
            got[i, c] = full[r]

    def iteration_s(self, rank_s: dict[str, np.ndarray], coll_s: dict[str, np.ndarray],
                    share_network: bool = True, hbm: dict[str, np.ndarray] | None = None,
                    flows: dict[str, Any] | None = None, sm: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """Seconds per measured iteration for each of ``T`` candidates (see the class doc).
        ``rank_s[key]``: ``(T, N)`` or ``(N,)``; ``coll_s[key]``: ``(T,)`` or a scalar (keys:
        :attr:`keys`, phases and bucket ops); a key missing from both lasts 0.

        ``share_network``: collectives on different streams that overlap in time (Neo's
        pipeline: the next batch's input AlltoAll beside this batch's pooled and gradient
        AlltoAlls and AllReduce; the gradient buckets' AllReduces beside the gradient AlltoAll
        and the table-row-wise all-gather) share the link they both use: while two overlap,
        each progresses at its share of the rate, in proportion to the flows it keeps open on
        that link, and each ends later by what it lost (pairwise, summed over a collective's
        partners, :meth:`_shared_extra`). The links: a GPU's NIC, which the AlltoAlls that
        cross nodes and a hierarchical AllReduce's inter-node rings use (their weights:
        ``flows[key]``, the flows through a NIC, a scalar or one per candidate ``(T,)``; equal
        shares where not given), and its NVLink port, which the node-local AlltoAlls
        (:data:`NODE_LOCAL_COLLECTIVES`, ``spec.local_flows``: one flow per local peer) and a
        hierarchical AllReduce's intra-node reduce-scatter and all-gather use
        (``spec.ar_intra_flows``); the AllReduce runs its three phases one after the other
        (:meth:`_allreduce_phases`), with the shares of its time and bytes that the network's
        phases give (:func:`allreduce_terms`; without them it is one NIC-bound op). A
        collective with no flows on the link shares nothing. The start times come from the
        schedule, which the stretches change, so the model is solved by fixed-point passes,
        each candidate until its stretches move by at most :data:`SHARING_TOL` in a pass (its
        figure is that pass's), at most :data:`SHARING_PASSES`. ASSUMPTION: concurrent collectives are limited by the
        links they share (max-min fair per flow, as ``sim.network`` shares them); an AlltoAll
        that crosses nodes is NIC-bound (its NVLink bytes, a few percent at most, are not
        shared).

        ``hbm``: HBM demands (``sim.interference``'s): per-rank ops' (``(T, N)``, ``(N,)`` or a
        scalar: memory time over time) and collectives' (per rank ``(T, N)`` or ``(T,)``: HBM
        bytes per second over the GPU's achievable bandwidth). Kernels and collectives that
        overlap then share HBM (:meth:`_hbm_extra`), solved in the same fixed-point passes; so
        do two kernels that overlap on a rank (the compute stream's and the dense optimizer's:
        the second waits for the first one's last wave, then both share HBM,
        :meth:`_kernel_extra`).
        ``sm``: per-rank ops' SM demands (compute time over time): while a collective runs, a
        kernel has the SMs its channels leave (``spec.comm_sm_share``)."""
        shape = None
        for v in rank_s.values():
            v = np.asarray(v)
            shape = (v.shape[0] if v.ndim == 2 else 1, v.shape[-1])
            break
        if shape is None:
            shape = (1, 1)
        T = max([shape[0]] + [np.asarray(v).reshape(-1).shape[0] for v in coll_s.values()])
        N = shape[1]
        C = len(self._coll_slot)
        base = np.zeros((C, T))
        for i, (phase, _, collective, _) in enumerate(self.ops):
            if collective:
                d = coll_s.get(phase)
                if d is not None:
                    c = self._coll_slot[i]
                    base[c] = np.asarray(d, float).reshape(-1) * self._coll_time[c]
        rank_d = {p: np.asarray(v, float) for p, v in rank_s.items()}
        # an op whose seconds are the same on every rank (a broadcast row: the dense ops and
        # the buckets' pieces) runs on one column: the same figures, without N copies of them
        flat = {p: (v[..., :1] if v.ndim >= 1 and v.shape[-1] > 1 and v.strides[-1] == 0 else v)
                for p, v in rank_d.items()}
        weight = np.ones((C, T))
        if flows and any(np.any(np.asarray(v) > 0) for v in flows.values()):
            for i, (phase, _, collective, _) in enumerate(self.ops):
                if collective:
                    weight[self._coll_slot[i]] = np.asarray(flows.get(phase, 1.0), float).reshape(-1)
        # on the NVLink: an AllReduce's intra-node rings and the node-local AlltoAlls' peers
        for i, (phase, _, collective, _) in enumerate(self.ops):
            if collective and self._coll_res[self._coll_slot[i]] == _NVLINK:
                local = str(phase) in NODE_LOCAL_COLLECTIVES
                weight[self._coll_slot[i]] = self.spec.local_flows if local else self.spec.ar_intra_flows
        hbm = hbm or {}
        kern: dict[int, np.ndarray] = {}   # rank op -> its HBM demand
        cdem: dict[int, np.ndarray] = {}   # collective slot -> its HBM demand per rank
        for i, (phase, _, collective, _) in enumerate(self.ops):
            d = hbm.get(phase)
            if d is None:
                continue
            d = np.asarray(d, float)
            if collective:
                if d.any():
                    c = self._coll_slot[i]
                    d = d if d.ndim == 2 else d.reshape(-1, 1)
                    # a phase's demand: its share of the bytes over its share of the time
                    cdem[c] = d * (self._coll_bytes[c] / self._coll_time[c]) if self._coll_time[c] != 1.0 else d
            elif phase in rank_d and d.any():
                kern[i] = d
        ksm: dict[int, np.ndarray] = {}    # rank op -> its SM demand (compute time over time)
        if self.spec.comm_sm_share > 0 and sm:
            for i, (phase, _, collective, _) in enumerate(self.ops):
                d = sm.get(phase)
                if not collective and d is not None and phase in rank_d and np.any(d):
                    ksm[i] = np.asarray(d, float)
        pairs = self._hbm_pairs(kern, ksm, cdem) if (kern and cdem) or ksm else {}
        kpairs = [(i, j) for i, j in self._kernel_pairs if self.ops[i][0] in rank_d and self.ops[j][0] in rank_d] \
            if hbm else []
        kops = {i for pair in kpairs for i in pair}
        kx: dict[tuple[int, int], tuple[Any, Any]] = {}   # each kernel pair's delays (last pass)
        kh: dict[tuple[int, int], Any] = {}   # each (kernel, collective)'s delay of the kernel (last pass)
        rates: dict = {}                      # the HBM pairs' rates, the same every pass (:meth:`_hbm_extra`)
        contend = bool(pairs) or bool(kpairs)
        extra = np.zeros((C, T))
        xc = np.zeros((C, T))
        xr: dict[int, Any] = {}
        sharing = share_network and bool(self._sharing)
        passes = self.SHARING_PASSES if sharing or contend else 1
        S = np.zeros((C, T))
        E = np.zeros((C, T))
        settled: tuple[np.ndarray, np.ndarray] | None = None   # (figure, whether kept) per candidate
        # each pass compiled (:func:`_schedule_pass`), or in numpy (:meth:`_numpy_pass`: the
        # same figures; without numba, and for shapes the compiled pass does not take)
        fast = None
        if _COMPILED_PASS:
            fast = _CompiledSchedule(self, flat, T, N, set(pairs) | kops,
                                     [m or i in pairs for i, m in enumerate(self._needs_max())])
            fast = fast if fast.ok else None
        for p in range(passes):
            got = fast.run(xr, base, extra, xc, S, E) if fast is not None else None
            smin = None
            if got is not None:
                spans, emax, it_end = got
                smin = fast.smin
            else:
                spans, emax, it_end = self._numpy_pass(flat, xr, base, extra, xc, S, E, pairs, kops)
            if passes == 1:
                break
            new = self._shared_extra(S, base, weight) if sharing else extra
            new_xr, new_xc, new_kh = self._hbm_extra(spans, S, E, pairs, xc, kh, rates, emax, smin) if pairs else ({}, xc, {})
            if kpairs:
                new_xr = dict(new_xr)
                kext, new_kx = self._kernel_extra(spans, kern, kpairs, kx)
                for i, v in kext.items():
                    new_xr[i] = new_xr.get(i, 0.0) + v
            moved = _moved_per_candidate(T, [(new, extra), (new_xc, xc)],
                                         [(v, xr.get(i, 0.0)) for i, v in new_xr.items()]
                                         + [(0.0, v) for i, v in xr.items() if i not in new_xr])
            done = moved <= self.SHARING_TOL
            if done.all():
                break
            # a candidate whose own stretches have converged keeps this pass's figure, as it
            # would evaluated alone (the batch's passes go on for the others): a batch gives
            # each candidate its own figure, bit for bit
            if done.any():
                if settled is None:
                    settled = (np.zeros(T), np.zeros(T, dtype=bool))
                fresh = done & ~settled[1]
                settled[0][fresh] = self._measured(it_end)[fresh]
                settled[1][fresh] = True
            # the next pass from the new stretches (undamped: see :data:`SHARING_PASSES`)
            extra, xc, xr, kh = new, new_xc, new_xr, new_kh
            if kpairs:
                kx = new_kx
        out = self._measured(it_end)
        return out if settled is None else np.where(settled[1], settled[0], out)

    def _numpy_pass(self, flat: dict[str, np.ndarray], xr: dict[int, Any], base: np.ndarray, extra: np.ndarray,
                    xc: np.ndarray, S: np.ndarray, E: np.ndarray, pairs: dict, kops: set[int]
                    ) -> tuple[dict[int, tuple[np.ndarray, np.ndarray]], list, np.ndarray]:
        """One pass of :meth:`iteration_s`'s list schedule in numpy (the specification of
        :func:`_schedule_pass`): every op in order, a per-rank op from when its dependencies
        have ended (``flat[key]``: its seconds; ``xr[i]``: what the sharing models stretch it
        by), a collective from its dependencies' latest end (a barrier) for ``base + extra +
        xc``, written into ``S`` and ``E``. Returns the spans of the ops in ``pairs`` and
        ``kops`` (``_narrow``'s shapes), each op's latest end over the ranks (``(T,)``, where
        read: a collective that follows it, the iteration's end, ``pairs``) and each iteration's
        end."""
        T = S.shape[1]
        zero = np.zeros((T, 1))
        none_yet = np.zeros(T)
        need_max = self._needs_max()
        ends: list[np.ndarray] = []
        emax = []
        spans = {}
        it_end = np.zeros((self.iterations, T))
        for i, (phase, it, collective, deps) in enumerate(self.ops):
            if collective:
                if deps:
                    t0 = emax[deps[0]]
                    for d in deps[1:]:
                        t0 = np.maximum(t0, emax[d])
                else:
                    t0 = none_yet
                c = self._coll_slot[i]
                t1 = t0 + base[c] + extra[c] + xc[c]
                S[c] = t0
                E[c] = t1
                ends.append(t1[:, None])
                emax.append(t1)
                if it < self.iterations:
                    it_end[it] = np.maximum(it_end[it], t1)
                continue
            if deps:
                start = ends[deps[0]]
                for d in deps[1:]:
                    start = np.maximum(start, ends[d])
            else:
                start = zero
            d = flat.get(phase)
            x = xr.get(i)
            # (an op the sharing models leave as it is: ``start + d``, which adding 0.0
            # leaves as it is too, no end being -0.0: every start is +0.0 or an end)
            end = start if d is None else (start + d if x is None else start + d + x)
            if i in pairs or i in kops:
                # the sharing models take every rank's span: ``(T, N)``, or ``(T, 1)``
                # where every rank's is the same (the dense ops' after a barrier: the
                # same numbers, priced on one column)
                start, end = _narrow(start), _narrow(end)
                spans[i] = (start, end)
            top = None
            if need_max[i] or i in pairs:
                top = end if end.ndim != 2 else end[:, 0] if end.shape[1] == 1 else end.max(axis=1)
                if it < self.iterations:
                    it_end[it] = np.maximum(it_end[it], top)
            ends.append(end)
            emax.append(top)
        return spans, emax, it_end

    def _measured(self, it_end: np.ndarray) -> np.ndarray:
        """Seconds per measured iteration from each iteration's end ``(iterations, T)``."""
        w = self.spec.warmup
        lo = it_end[w - 1] if w > 0 else 0.0
        return (it_end[-1] - lo) / self.spec.iterations


def comm_sm_share(system: Any, topo: Any) -> float:
    """Share of a GPU's SMs a running collective's channels hold ahead of compute kernels in a
    run of ``system`` (``host.systems.SystemSpec``) on ``topo``: the channels for the links it
    drives (``sim.interference.comm_channels`` of ``collective_links``, the busiest rank's), at
    high priority on the SMs; 0 with the collectives on the copy engines or at normal priority
    (they then wait for the kernels' CTAs to retire instead)."""
    st = system.streams
    if st.collectives_on_dma or st.comm_priority != "high" or topo.num_gpus < 2:
        return 0.0
    from neonic.sim.interference import collective_links, comm_channels

    links = collective_links(topo, list(range(topo.num_gpus)))
    return min(1.0, comm_channels(float(links.max())) / system.gpu_spec.num_sms)


def allreduce_terms(topo: Any, allreduce: str = "hierarchical", probe_bytes: int = 1 << 30) -> dict[str, float]:
    """The NVLink fields of :class:`IterationSpec` for a run on ``topo`` with the AllReduce
    algorithm ``allreduce``, from the network model's own phases and closed forms
    (``sim.network.collectives.build_phases``, ``sim.network.estimate.phase_time_s``): the
    shares of a hierarchical AllReduce of ``probe_bytes`` (large: the shares of the bandwidth
    term, which every bucket of tens of MB is close to) in time and bytes spent in its phases
    that stay inside the nodes, the flows those phases keep open from one GPU, and the flows a
    node-local AlltoAll keeps open from one GPU (every other GPU of its node). Empty where
    nothing is node-local (one node, one GPU per node) or the AllReduce is not hierarchical."""
    from neonic.sim.network.collectives import build_phases
    from neonic.sim.network.estimate import phase_time_s

    g, nodes = int(topo.gpus_per_node), int(topo.nodes)
    if g < 2:
        return {}
    out: dict[str, float] = {"local_flows": float(g - 1)}
    if allreduce != "hierarchical" or nodes < 2:
        return out
    _, phases = build_phases(topo, "allreduce", nbytes=probe_bytes, algorithm=allreduce)
    intra = [bool(np.all(topo.node_of(ph.src) == topo.node_of(ph.dst))) for ph in phases]
    times = np.array([phase_time_s(topo, ph) for ph in phases])
    moved = np.array([float(np.sum(ph.nbytes)) for ph in phases])
    inside = np.array(intra)
    if not inside.any() or inside.all() or times.sum() <= 0:
        return out
    # the flows a GPU keeps open on its NVLink port: its messages' connections (one each there,
    # ``sim.network.collectives.NicConnections``)
    flows = max(int(np.bincount(ph.src, weights=None if ph.conns is None else ph.conns).max())
                for ph, i in zip(phases, intra) if i)
    out.update(ar_intra_time=float(times[inside].sum() / times.sum()),
               ar_intra_bytes=float(moved[inside].sum() / moved.sum()), ar_intra_flows=float(flows))
    return out


def dense_phase_s(dense: DenseCosts, mode: str) -> dict[str, float]:
    """The dense part's per-rank phase seconds (the same for every rank and plan)."""
    out = {"bot_fwd": dense.bot_fwd.time_s, "inter_fwd": dense.inter_fwd.time_s, "top_fwd": dense.top_fwd.time_s}
    if mode == "training":
        out.update({"top_bwd": dense.top_bwd.time_s, "inter_bwd": dense.inter_bwd.time_s,
                    "bot_bwd": dense.bot_bwd.time_s, "dense_opt": dense.dense_opt.time_s})
    return out
