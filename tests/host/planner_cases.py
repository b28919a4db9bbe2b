"""Small planner cases shared by the planner tests: a few-node A100 system with round network
figures, and random workloads whose table sizes, widths and poolings are skewed the way DLRM
tables are (rows log-uniform-ish, pooling log-normal)."""

from __future__ import annotations

import numpy as np

from neonic.host.planner import AlphaBetaComm, MemoryTiers, PlannerSystem
from neonic.host.workloads import workload_from_dict
from neonic.sim.gpu import gpu_preset


def small_system(nodes: int = 2, g: int = 4, dram: float = 0.0, **kw) -> PlannerSystem:
    """``nodes`` x ``g`` A100-40GB GPUs, NVLink-like inside a node and NIC-like between nodes,
    ``dram`` GiB of host memory per node; ``kw`` goes to :class:`PlannerSystem`."""
    comm = AlphaBetaComm(nodes=nodes, gpus_per_node=g, alpha_intra_s=1e-6, bw_intra_bytes_per_s=300e9,
                         alpha_inter_s=5e-6, bw_inter_bytes_per_s=25e9)
    return PlannerSystem(gpu=gpu_preset("a100-40gb"), comm=comm, memory=MemoryTiers(dram_gib_per_node=dram), **kw)


def skewed_workload(n: int = 40, seed: int = 3, batch: int = 256):
    """``n`` tables ``t0..`` drawn from ``seed``: 10k-2M rows, widths 16-128, log-normal pooling."""
    rng = np.random.default_rng(seed)
    return workload_from_dict({
        "name": "w", "batch_per_gpu": batch, "dense": {"bottom_mlp": [4, 8], "top_mlp": [1]},
        "tables": [{"name": f"t{i}", "rows": int(r), "dim": int(d), "pooling": float(p)} for i, (r, d, p) in enumerate(zip(
            rng.integers(10_000, 2_000_000, n), rng.choice([16, 32, 64, 128], n),
            rng.lognormal(2.5, 1.0, n).round(1) + 1))],
    })


def heavy_workload(n: int = 30, seed: int = 3):
    """``n`` tables drawn from ``seed`` of which the first 3 are 20x larger, with widths 64-256 and
    heavier lookups: their row-wise and data-parallel plans are far slower than the table-wise
    ones, and Neo's search applies class moves to them."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(10_000, 2_000_000, n)
    rows[:3] *= 20
    return workload_from_dict({
        "name": "w", "batch_per_gpu": 1024, "dense": {"bottom_mlp": [4, 8], "top_mlp": [1]},
        "tables": [{"name": f"t{i}", "rows": int(r), "dim": int(d), "pooling": float(p)} for i, (r, d, p) in enumerate(zip(
            rows, rng.choice([64, 128, 256], n), rng.lognormal(3, 1.0, n).round(1) + 1))],
    })

def every_planners_plan(w, s, cost) -> list:
    """The plan of every planner that can place ``w`` on ``s`` (the others are skipped)."""
    from neonic.host.planner import PLANNER_NAMES, make_plan

    plans = []
    for name in PLANNER_NAMES:
        try:
            plans.append(make_plan(w, s, name, cost=cost))
        except ValueError:
            continue
    return plans
