"""Closed-form (alpha-beta) collective times, without running the engine.

Each collective is the same DAG of phases that :mod:`.collectives` runs. A phase's closed-form
time is ``alpha + beta``: ``alpha`` = the largest latency among its messages (as the network
applies it: a message's route latency, a streamed ring hop's pipeline fill), ``beta`` = the
largest over links of (bytes the phase puts on the link, framing included) / (link capacity).
The collective's time is the longest path through the DAG.

This equals the flow-level simulation whenever, in every phase, the messages through the
busiest link are limited by that link alone (uniform or symmetric patterns without cross-phase
overlap: the contention-free cases the tests check); otherwise it is a lower bound of the
work-conserving kind that a planner's cost model wants. Costs are O(messages) numpy work.
"""

from __future__ import annotations

import numpy as np

from .collectives import Phase, build_phases, phase_route
from .topology import Topology

__all__ = [
    "phase_time_s",
    "estimate_phases_time_s",
    "estimate_alltoallv_time_s",
    "estimate_allreduce_time_s",
    "estimate_reduce_scatter_time_s",
    "estimate_all_gather_time_s",
]


def phase_time_s(topology: Topology, phase: Phase) -> float:
    """alpha + beta of one phase, in seconds."""
    if phase.src.size == 0:
        return 0.0
    route = phase_route(topology, phase)
    moving = phase.nbytes > 0
    alpha_ps = float(route.latency_ps[moving].max()) if moving.any() else float(route.latency_ps.max())
    loads = topology.link_loads(route, phase.nbytes)[: topology.num_links]
    beta_ps = float(np.max(loads / topology.capacity[: topology.num_links])) if loads.size else 0.0
    return (alpha_ps + beta_ps) * 1e-12


def estimate_phases_time_s(topology: Topology, phases: list[Phase]) -> float:
    """Longest path through a phase DAG, each phase costing :func:`phase_time_s`."""
    finish = np.zeros(len(phases))
    cache: dict[tuple, float] = {}
    for i, ph in enumerate(phases):  # phases are listed after their dependencies
        key = (ph.src.tobytes(), ph.dst.tobytes(), ph.nbytes.tobytes(), ph.ring, ph.fill,
               None if ph.wire_bytes is None else ph.wire_bytes.tobytes())
        t = cache.get(key)
        if t is None:
            t = cache[key] = phase_time_s(topology, ph)
        start = max((finish[d] for d in ph.deps), default=0.0)
        finish[i] = start + t
    return float(finish.max()) if len(phases) else 0.0


def estimate_alltoallv_time_s(topology: Topology, sizes, ranks=None, *, algorithm: str = "direct") -> float:
    """Closed-form AlltoAllv time: ``sizes[i, j]`` bytes from ``ranks[i]`` to ``ranks[j]``."""
    _, phases = build_phases(topology, "alltoallv", ranks, sizes=sizes, algorithm=algorithm)
    return estimate_phases_time_s(topology, phases)


def estimate_allreduce_time_s(topology: Topology, nbytes: int, ranks=None, *, algorithm: str = "ring",
                              chunks: int = 1) -> float:
    """Closed-form AllReduce time of an ``nbytes`` buffer (default: all GPUs); ``chunks``: the
    double binary tree's pipeline (the ring algorithms are streamed)."""
    _, phases = build_phases(topology, "allreduce", ranks, nbytes=nbytes, algorithm=algorithm, chunks=chunks)
    return estimate_phases_time_s(topology, phases)


def estimate_reduce_scatter_time_s(topology: Topology, nbytes: int, ranks=None, *, algorithm: str = "ring") -> float:
    """Closed-form ReduceScatter time of an ``nbytes`` buffer (a streamed ring)."""
    _, phases = build_phases(topology, "reduce_scatter", ranks, nbytes=nbytes, algorithm=algorithm)
    return estimate_phases_time_s(topology, phases)


def estimate_all_gather_time_s(topology: Topology, nbytes: int, ranks=None, *, algorithm: str = "ring") -> float:
    """Closed-form AllGather time into an ``nbytes`` buffer (a streamed ring)."""
    _, phases = build_phases(topology, "all_gather", ranks, nbytes=nbytes, algorithm=algorithm)
    return estimate_phases_time_s(topology, phases)
