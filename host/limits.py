"""Size checks a scenario passes before anything large is built.

A typo such as ``cluster.nodes = 100000`` or ``iterations = 10000000`` must be refused at
load, with the estimate that makes it impossible, instead of failing after minutes with a numpy
memory error or running without end. The estimates here are deliberately lower bounds of what a
run needs, so a refusal is always right; a scenario that passes can still be slow.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from neonic.host.cluster import Scenario

__all__ = ["MAX_OPS", "OPS_PER_GPU_ITERATION", "check_scenario_size", "activation_bytes_per_sample",
           "available_memory_bytes", "format_bytes"]

# Ops of the op graph per GPU and iteration: measured with build_graph on the default scenario
# (training, Neo's pipeline) at 16 and 32 GPUs: 820 / (16 x 5) = 10.25, 1620 / (32 x 5) = 10.1.
OPS_PER_GPU_ITERATION = 10
# The largest op graph a run builds. The event engine takes tens of microseconds per op, so this
# is minutes of engine time; figures are per-iteration means and steady after a few iterations.
MAX_OPS = 2_000_000
# Dense (world x world) float64 matrices the run builds at once: AlltoAll sizes and their
# per-link split (sim.network.collectives, host.cluster). A lower bound.
_WORLD_MATRICES = 2


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} PiB"  # pragma: no cover


def available_memory_bytes() -> int:
    """This machine's physical memory (an upper bound for any array a run can hold)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover (non-POSIX)
        return 1 << 40


def activation_bytes_per_sample(scenario: "Scenario") -> int:
    """A lower bound of one sample's activation memory on a GPU: the outputs of every MLP layer
    (bottom and top) in the dense dtype plus the pooled embeddings the interaction reads
    (fp32), counted once (forward); training also keeps them for the backward pass, which this
    bound leaves out."""
    w = scenario.workload
    dense_bytes = {"fp16": 2, "bf16": 2, "tf32": 4, "fp32": 4}.get(scenario.dense_dtype, 2)
    mlp = sum(w.dense.bottom_mlp) + sum(w.dense.top_mlp)
    pooled = sum(t.dim for t in w.tables) * 4
    return int(mlp * dense_bytes + pooled)


def _preset_gpus_per_node(network: str) -> int:
    from neonic.sim.network.config import load_preset
    try:
        return load_preset(network).cluster.gpus_per_node
    except ValueError:
        return 1  # an unknown network is reported by the run itself, naming system.network


def check_scenario_size(scenario: "Scenario", memory_bytes: int | None = None) -> None:
    """Refuse a scenario whose run cannot fit: GPUs x GPUs matrices beyond this machine's
    memory (``cluster.nodes``), an op graph above :data:`MAX_OPS` (``scenario.iterations``),
    activations of one GPU's batch beyond its HBM (``workload.batch_per_gpu``)."""
    memory = available_memory_bytes() if memory_bytes is None else memory_bytes
    gpn = scenario.gpus_per_node or _preset_gpus_per_node(scenario.system.network)
    world = scenario.nodes * gpn
    need = _WORLD_MATRICES * world * world * 8
    if need > memory:
        max_world = int((memory / (_WORLD_MATRICES * 8)) ** 0.5)
        raise ValueError(
            f"cluster.nodes: {scenario.nodes} nodes x {gpn} GPUs = {world} GPUs needs at least "
            f"{format_bytes(need)} for its GPU x GPU traffic matrices, more than this machine's "
            f"{format_bytes(memory)}; expected at most {max(1, max_world // gpn)} nodes")
    total_its = scenario.iterations + scenario.warmup
    ops = total_its * world * OPS_PER_GPU_ITERATION
    if ops > MAX_OPS:
        max_its = max(1, MAX_OPS // (world * OPS_PER_GPU_ITERATION) - scenario.warmup)
        raise ValueError(
            f"scenario.iterations: {scenario.iterations} (+ {scenario.warmup} warm-up) "
            f"iterations on {world} GPUs is about {ops:,} ops in the op graph, above the "
            f"{MAX_OPS:,} a run holds; the figures are per-iteration means, steady after a few "
            f"iterations: expected at most {max_its} iterations here")
    hbm = int(scenario.system.gpu_spec.hbm_bytes)
    per_sample = activation_bytes_per_sample(scenario)
    act = per_sample * scenario.workload.batch_per_gpu
    if act > hbm:
        raise ValueError(
            f"workload.batch_per_gpu: {scenario.workload.batch_per_gpu} samples x at least "
            f"{format_bytes(per_sample)} of activations each = {format_bytes(act)}, more than "
            f"the {format_bytes(hbm)} of HBM of one {scenario.system.gpu} GPU; expected at most "
            f"{hbm // max(1, per_sample)} samples per GPU")
