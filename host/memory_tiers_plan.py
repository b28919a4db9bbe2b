"""The planner's side of the memory tiers: how much HBM to keep for host-tier caches.

Placing tables greedily in HBM until it runs out leaves no HBM for the software caches that
the remaining (host-tier) shards need, and a model that fits (Model-F: 24 TB over 128 x 40 GB
HBM and 16 x 1.5 TB DRAM) is refused. When the workload's bytes ``W`` exceed the cluster's
HBM ``H``, at least ``D = (W - H) / (1 - rho)`` bytes must live in host memory, where ``rho``
is a cache's bytes per host-tier byte (``cache_load_factor`` lines of ``dim x elem`` bytes
per row of ``dim x elem + state`` bytes). A shard goes to a rank's HBM only if it leaves HBM
for the caches of all the host memory the rank may still take (``rho x`` its free DRAM):
whatever host-tier shards land there later, their caches fit. DRAM is used only when HBM runs
out: with ``W <= H`` nothing is reserved (ASSUMPTION: once it runs out, HBM-tier shards yield
up to ``rho x`` DRAM capacity of HBM per rank, more host-tier rows than the least needed).
"""

from __future__ import annotations

import math
from typing import Any, Callable

__all__ = ["cache_reserve", "check_capacity"]

GIB = 2**30


def cache_reserve(workload: Any, system: Any, shard_bytes: Callable[[Any, int, int], float]) -> tuple[float, float]:
    """``(rho, host bytes per rank whose caches HBM keeps room for)`` (see the module doc)."""
    world = system.world_size
    hbm = system.hbm_capacity * world
    total = sum(shard_bytes(t, t.rows, t.dim) for t in workload.tables)
    if total <= hbm or (system.dram_capacity <= 0 and system.ssd_capacity <= 0):
        return 0.0, 0.0
    if not system.memory.cached:
        return 0.0, float(system.dram_capacity + system.ssd_capacity)   # shared HBM: no caches
    lf = system.memory.cache_load_factor
    weights = sum(t.rows * t.dim * t.elem_bytes for t in workload.tables)
    rho = min(0.999, lf * weights / total)
    return rho, float(system.dram_capacity + system.ssd_capacity)


def check_capacity(workload: Any, system: Any, shard_bytes: Callable[[Any, int, int], float]) -> None:
    """Refuse a workload whose tables cannot fit the cluster's tiers, saying how many bytes are
    missing where: what HBM cannot hold must live in host memory (DRAM, then SSD) and its
    caches take ``rho`` of it back from HBM."""
    world, nodes = system.world_size, system.nodes
    hbm = system.hbm_capacity * world
    host = (system.dram_capacity + system.ssd_capacity) * world
    total = sum(shard_bytes(t, t.rows, t.dim) for t in workload.tables)
    if total <= hbm:
        return
    rho, _ = cache_reserve(workload, system, shard_bytes)
    if host <= 0:
        missing = total - hbm
        raise ValueError(
            f"workload: tables need {total / GIB:,.1f} GiB with optimizer state, all {world} GPUs' HBM holds "
            f"{hbm / GIB:,.1f} GiB and the system gives embeddings no host memory: {missing / GIB:,.1f} GiB missing "
            f"({missing / GIB / nodes:,.1f} GiB per node; system.host.dram_gib_per_node adds a DRAM tier)")
    need_host = (total - hbm) / (1.0 - rho)
    if need_host > host:
        missing = need_host - host
        raise ValueError(
            f"workload: tables need {total / GIB:,.1f} GiB with optimizer state; HBM holds {hbm / GIB:,.1f} GiB "
            f"(caches of host-tier rows included, load factor {system.memory.cache_load_factor:g}), so "
            f"{need_host / GIB:,.1f} GiB must live in host memory, which has {host / GIB:,.1f} GiB "
            f"(DRAM + SSD of {nodes} nodes): {missing / GIB:,.1f} GiB of host memory missing "
            f"({missing / GIB / nodes:,.1f} GiB per node)")
