"""One iteration of a scenario, derived from its plan: the dense part's kernel costs, the
payload types of the op graph, and each phase's payload per rank.

:func:`dense_costs` prices the MLPs, the interaction and the dense optimizer step;
:func:`iteration_payloads` turns the plan's derived work (``host.planner.work.derive_iteration``:
per-rank embedding kernels and AlltoAllv matrices; the runtime never re-derives communication
sizes) into the payloads that ``host.schedule.build_graph`` attaches to the op graph.

Modelling choices (each an ASSUMPTION a user can see in code and docs):
    * the dense AllReduce carries the MLPs' parameters (computed from the workload's widths) plus
      the data-parallel tables' bytes from the plan, in the system's ``comm_dtype``;
    * the dot interaction over F features gives F(F-1)/2 + d outputs, capped at
      :data:`MAX_INTERACTION_WIDTH` (production models with 1000s of features compress them);
    * each rank's embedding shards run as one fused kernel (one launch overhead).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from neonic.host.systems import SystemSpec
from neonic.host.workloads import WorkloadSpec
from neonic.sim.gpu import KernelCost, embedding_backward_cost, embedding_forward_cost, interaction_cost, mlp_cost
from neonic.sim.resources import CPU_PRESETS, cpu_embedding_backward_s, cpu_embedding_forward_s

if TYPE_CHECKING:
    from neonic.host.nic_effects import NICEffects
    from neonic.host.scenario import Scenario

__all__ = ["MAX_INTERACTION_WIDTH", "DenseCosts", "dense_costs", "Collective", "CPUJob", "Copy", "NICJob",
           "iteration_payloads"]

MAX_INTERACTION_WIDTH = 8192


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
    nbytes: float


@dataclass(frozen=True)
class NICJob:
    """An embedding op on the SmartNIC system: the NIC units' durations (ps), the GPU kernel
    that remains, and bytes over the GPU's PCIe link (cache fills, rows to the GPU)."""

    units: tuple[tuple[str, int], ...]
    gpu: KernelCost
    pcie_bytes: float = 0.0


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
    pcie = sys_.host.pcie_gbytes_per_s * 1e9
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
        miss_s = 0.0
        for i, k in enumerate(ks):
            gl = k.lookups if nic is None else int(round(nic.gpu_lookups[r][i]))
            f = f + embedding_forward_cost(gpu, gl, k.row_bytes, k.pooled_rows, k.out_row_bytes)
            g = g + embedding_backward_cost(gpu, k.lookups, min(k.unique_rows, k.lookups), k.row_bytes, k.row_bytes, k.state_bytes_per_row)
            miss_s += k.miss_bytes / pcie
        launch = gpu.efficiency.launch_overhead_s
        f = _fused(f, launch, miss_s / 2)
        g = _fused(g, 2 * launch, miss_s / 2)
        fwd.append(f)
        bwd.append(g)
    if nic is not None:
        fwd = [NICJob(nic.fwd_units[r], fwd[r], float(nic.fwd_pcie_bytes[r])) for r in range(world)]
        bwd = [NICJob((), bwd[r], float(nic.bwd_pcie_bytes[r])) if nic.bwd_pcie_bytes[r] > 0 else bwd[r]
               for r in range(world)]
    if sys_.embeddings == "cpu":
        # pooled embeddings reach the GPU over PCIe, gradients leave it the same way
        recv = pooled.sum(axis=0)
        payloads["pooled_h2d"] = [Copy(float(recv[r])) for r in range(world)]
        if sc.mode == "training":
            payloads["grad_d2h"] = [Copy(float(recv[r])) for r in range(world)]
    payloads["emb_fwd"] = fwd
    if sc.mode == "training":
        payloads["emb_bwd"] = bwd
    return payloads


def _fused(cost: KernelCost, launch_s: float, extra_s: float) -> KernelCost:
    """Shards' kernels fused into one launch (one overhead), plus host-transfer time."""
    return KernelCost(flops=cost.flops, hbm_bytes=cost.hbm_bytes, compute_s=cost.compute_s, memory_s=cost.memory_s,
                      overhead_s=launch_s + extra_s)
