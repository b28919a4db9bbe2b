"""Memory tiers of embedding shards: HBM, or host memory (DRAM, SSD) behind an HBM software cache.

Neo (ISCA 2022) keeps tables that do not fit HBM in the nodes' DRAM (or SSD) and serves them
through a software cache in HBM: 32-way set-associative, LRU or LFU, one line per row
(REFERENCES.md; FBGEMM's cache: size = rows x load factor). This module is the one home of
what a tier costs, called by the planner's cost model and by the event-driven simulation:

* :func:`cache_hit_rate`: the steady-state hit rate of a shard's HBM cache fed by the run's
  lookups (``sim.lookups``). A Model-F shard has ~1e7..1e8 rows and its cache millions of
  lines, while one iteration draws ~1e5 lookups per shard: a trace-driven simulation would
  measure a cold cache. The steady state under the independent-reference model is computed
  instead: LRU by Che's approximation (characteristic time ``T`` with
  ``sum_i 1 - exp(-p_i T) = C``, hit rate ``sum_i p_i (1 - exp(-p_i T))``), LFU as the ``C``
  most popular rows (LFU's limit under fixed popularities). Popularities are the Zipf law of
  the table's source (exact head, integral tail, any number of rows) or, for traced and
  locality-fitted tables, the lookups' empirical frequencies. Row-wise shards hold a hashed
  subset of rows and a cache proportional to it, so a shard's hit rate is its table's at
  the same load factor. A test holds both forms to neonic's set-associative cache model
  (``sim.reference.cache.simulate_trace``) on tables small enough to simulate warm.
* :func:`miss_bytes`: bytes a host-tier shard moves per iteration: every missed lookup
  fetches its row (forward) and the updated row goes back (the backward's write-back of rows
  the cache cannot keep; ASSUMPTION: as many as the forward missed).
* :func:`host_transfer_s`: those bytes over the node's host-memory link (DRAM) or the SSD.
* :data:`LINKS`: what joins a node's CPU memory and GPU, which decides how a host-tier row is
  reached. ``pcie`` (ZionEX: PCIe 4 x16) and ``c2c`` (GH200: NVLink-C2C, coherent, 450 GB/s
  each way) are links: misses are copied over them into the HBM cache as above, at the link's
  bandwidth. ``shared_hbm`` (MI300A: CPU and GPU chiplets on one pool of HBM3) has no link to
  cross: "host" memory is the same HBM, so a host-tier row is read in place by the embedding
  kernel (no software cache, no copy: :func:`uses_cache` is False), and its bytes are HBM
  traffic of that kernel, contending with everything else on the GPU's HBM (the roofline and
  the C3 HBM model of ``sim.interference`` see them).
* :class:`HostLink`: the simulation's side: transfers between a GPU and its node's host
  memory are flows on the topology's GPU-host links (``sim.network``: ``pcie.up/down``), the
  one PCIe model of a run, so input copies, cache misses and (SmartNIC) fills contend there.
  The link's kind and bandwidth are the node's (``[host_link]`` of the network preset: PCIe
  4 x16 on ZionEX; a coherent CPU-GPU link on other nodes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

__all__ = ["TIERS", "POLICIES", "LINKS", "uses_cache", "cache_hit_rate", "zipf_hit_rate", "empirical_hit_rate", "miss_bytes",
           "host_transfer_s", "HostLink"]

TIERS = ("hbm", "dram", "ssd")
POLICIES = ("lru", "lfu")
#: What joins CPU memory and the GPU on a node (see the module doc).
LINKS: tuple[str, ...] = ("pcie", "c2c", "shared_hbm")


def uses_cache(link: str) -> bool:
    """Whether host-tier rows go through an HBM software cache on a node with ``link``: over a
    link (PCIe, NVLink-C2C) they are copied in; on shared HBM they are read where they are."""
    if link not in LINKS:
        raise ValueError(f"host.link: expected one of {', '.join(LINKS)}, got {link!r}")
    return link != "shared_hbm"

_HEAD = 1 << 16


def _che(p_head: np.ndarray, tail: Callable[[float], tuple[float, float, float]] | None, lines: float) -> float:
    """LRU hit rate by Che's approximation over head popularities ``p_head`` plus an optional
    tail ``tail(T) -> (occupancy, hit mass, occupancy slope)``.

    The characteristic time is the end point of a bisection of the occupancy on ``T`` (from
    ``[0, 1]``, doubling the upper end, to double precision). Each evaluation costs a pass over
    the popularities, and the bisection takes some 60, so the root is first found by a
    safeguarded Newton iteration (a dozen passes); the bisection is then replayed, each step
    decided by which side of the root its point lies, except the points so close to the root
    that rounding could decide the comparison, which are evaluated as the bisection evaluates
    them. The result is the bisection's, bit for bit, at a fraction of its passes."""
    def occ(T: float) -> tuple[float, float]:
        e = -np.expm1(-p_head * T)
        o, h = float(e.sum()), float((p_head * e).sum())
        if tail is not None:
            to, th, _ = tail(T)
            o, h = o + to, h + th
        return o, h

    def occ_slope(T: float) -> tuple[float, float]:
        """Occupancy (as :func:`occ` computes it) and its derivative in ``T``."""
        e = -np.expm1(-p_head * T)
        o, d = float(e.sum()), float((p_head * (1.0 - e)).sum())
        if tail is not None:
            to, _, td = tail(T)
            o, d = o + to, d + td
        return o, d

    # the root, bracketed by points of computed occupancy below (a) and at or above (b) it
    a, b, T, slope = 0.0, math.inf, float(lines), 1.0
    for _ in range(200):
        if not (1e-300 < T < 1e30):
            a = b = math.nan
            break
        o, d = occ_slope(T)
        if o < lines:
            a = T
        else:
            b = T
        slope = d * T / o if o > 0 and d > 0 else 0.0  # d log occupancy / d log T
        if b < math.inf and b - a <= 1e-14 * b:
            break
        if slope > 0:  # Newton on log occupancy against log T (a power law is a line there)
            nxt = T * math.exp(min(50.0, max(-50.0, (math.log(lines) - math.log(o)) / slope)))
        else:
            nxt = math.nan
        if abs(nxt - T) <= 1e-15 * T:  # converged to rounding: probe the side still open
            nxt = T * (1 + 5e-15) if o < lines else T * (1 - 5e-15)
        if not (a < nxt < b):
            nxt = 2.0 * T if math.isinf(b) else (math.sqrt(a * b) if a > 0 else 0.5 * b)
        T = nxt
    # comparisons farther than ``band`` (relative) from the bracket cannot be turned by rounding
    # (occupancy sums to ~1e-15 relative; its relative change is ``slope`` times T's)
    band = 1e-12 / max(slope, 1e-4)
    exact = not math.isfinite(a) or not math.isfinite(b)
    lo_t, hi_t = a * (1 - band), b * (1 + band)

    def below(T: float) -> bool:
        if exact or lo_t < T < hi_t:
            return occ(T)[0] < lines
        return T <= lo_t

    lo, hi = 0.0, 1.0
    while below(hi):
        hi *= 2.0
        if hi > 1e30:
            return occ(hi)[1]
    while hi - lo > 1e-12 * hi:  # occupancy is monotone in T: bisect to double precision
        mid = 0.5 * (lo + hi)
        if below(mid):
            lo = mid
        else:
            hi = mid
    return occ(hi)[1]


def zipf_hit_rate(alpha: float, rows: int, lines: float, policy: str = "lru") -> float:
    """Steady-state hit rate of a cache of ``lines`` rows over a table of ``rows`` rows with
    Zipf(``alpha``) popularity (see the module doc)."""
    if lines >= rows:
        return 1.0
    if lines <= 0:
        return 0.0
    head = min(rows, _HEAD)
    w = np.arange(1, head + 1, dtype=np.float64) ** -alpha
    a1 = 1.0 - alpha

    def integral(x: float) -> float:
        return math.log(x) if abs(a1) < 1e-12 else x ** a1 / a1

    lo, hi = head + 0.5, rows + 0.5
    tail_mass = integral(hi) - integral(lo) if rows > head else 0.0
    total = float(w.sum()) + tail_mass
    p = w / total
    if policy == "lfu":
        if lines <= head:
            k = int(lines)
            return float(p[:k].sum() + (lines - k) * (p[k] if k < head else 0.0))
        return float(p.sum() + (integral(lines + 0.5) - integral(lo)) / total)
    if rows <= head:
        return _che(p, None, lines)
    # tail: ranks beyond the head, integrated on a log grid of the continuous density
    xs = np.geomspace(lo, hi, 2048)
    mids = np.sqrt(xs[:-1] * xs[1:])
    widths = np.diff(xs)
    pt = mids ** -alpha / total

    def tail(T: float) -> tuple[float, float, float]:
        e = -np.expm1(-pt * T)
        return float((widths * e).sum()), float((widths * pt * e).sum()), float((widths * pt * (1.0 - e)).sum())

    return _che(p, tail, lines)


def empirical_hit_rate(indices: np.ndarray, rows: int, lines: float, policy: str = "lru") -> float:
    """Steady-state hit rate with the lookups' empirical row frequencies as popularities (a
    trace replayed: rows it never touches are never looked up)."""
    if indices.size == 0 or lines <= 0:
        return 0.0
    _, counts = np.unique(indices, return_counts=True)
    if lines >= counts.size:
        return 1.0
    p = np.sort(counts.astype(np.float64))[::-1] / counts.sum()
    if policy == "lfu":
        k = int(lines)
        return float(p[:k].sum() + (lines - k) * p[k])
    return _che(p, None, lines)


def cache_hit_rate(lookups: Any, rows: int, load_factor: float, policy: str = "lru") -> float:
    """A host-tier table's HBM-cache hit rate at ``load_factor`` lines per row, from its
    lookups (a ``sim.lookups.TableLookups``: Zipf law when it has ``alpha``, else its
    empirical frequencies)."""
    if policy not in POLICIES:
        raise ValueError(f"cache_policy: expected one of {', '.join(POLICIES)}, got {policy!r}")
    lines = rows * load_factor
    alpha = getattr(lookups, "alpha", None)
    if alpha is not None:
        return zipf_hit_rate(alpha, rows, lines, policy)
    return empirical_hit_rate(np.asarray(lookups.indices), rows, lines, policy)


def miss_bytes(lookups: float, row_bytes: float, hit_rate: float) -> float:
    """Bytes a host-tier shard moves per iteration (forward fetch + backward write-back)."""
    return 2.0 * lookups * (1.0 - hit_rate) * row_bytes


def host_transfer_s(nbytes: float, tier: str, link_bytes_per_s: float, ssd_bytes_per_s: float) -> float:
    """Seconds to move ``nbytes`` of a shard in ``tier`` (alone on the link): over the GPU's
    host-memory link for DRAM, at the SSD's bandwidth for SSD, nothing for HBM."""
    if tier == "hbm" or nbytes <= 0:
        return 0.0
    if tier == "ssd":
        return nbytes / ssd_bytes_per_s
    return nbytes / link_bytes_per_s


@dataclass
class HostLink:
    """Transfers between GPUs and their node's host memory as flows on the topology's GPU-host
    links (``pcie.up`` GPU to host, ``pcie.down`` host to GPU), sharing them with every other
    flow there. ``spans[rank]`` keeps each transfer's (start, end, label) for the timeline."""

    net: Any
    topology: Any
    record: set[int] = field(default_factory=set)
    bytes_by_kind: dict[str, float] = field(default_factory=dict)
    spans: dict[int, list[tuple[int, int, str]]] = field(default_factory=dict)

    def transfer(self, rank: int, nbytes: float, to_gpu: bool, on_done: Callable[[int, int], None], *,
                 kind: str = "copy", label: str = "") -> None:
        """Move ``nbytes`` between GPU ``rank`` and its node's host memory; ``on_done(start,
        end)`` when the last byte arrives."""
        host = self.topology.host_endpoint(rank // self.topology.gpus_per_node)
        src, dst = (host, rank) if to_gpu else (rank, host)
        start = self.net.engine.now
        self.bytes_by_kind[kind] = self.bytes_by_kind.get(kind, 0.0) + float(nbytes)

        def done(_group: Any) -> None:
            end = self.net.engine.now
            if rank in self.record:
                self.spans.setdefault(rank, []).append((start, end, label or kind))
            on_done(start, end)

        self.net.start_flow(src, dst, float(nbytes), done)

    def link_bytes(self) -> np.ndarray:
        """Payload bytes over each GPU-host link (the network's own count)."""
        from neonic.sim.network.topology import LINK_CLASSES

        topo = self.topology
        mask = topo.link_class[: topo.num_links] == LINK_CLASSES.index("pcie")
        return np.asarray(self.net.link_bytes[: topo.num_links])[mask]

    def utilization(self, elapsed_ps: int) -> float:
        """Mean utilisation of the GPU-host links (both directions) over ``elapsed_ps``: bytes
        carried / (capacity x time), from the same counters as :meth:`link_bytes`."""
        if elapsed_ps <= 0:
            return 0.0
        from neonic.sim.network.topology import LINK_CLASSES

        topo = self.topology
        mask = topo.link_class[: topo.num_links] == LINK_CLASSES.index("pcie")
        cap = topo.capacity[: topo.num_links][mask]  # bytes per ps
        return float(np.mean(self.link_bytes() / (cap * elapsed_ps)))
