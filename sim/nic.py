"""The SmartNIC of the SmartNIC system (Guo et al., ICS 2023) as a system-level model.

A SmartNIC sits on the AlltoAll path of one GPU. It is composed from the units' own models:

``cache``       the set-associative row cache (``rtl/cache.py``): its time comes from
                ``sim.timing.cache.cache_cycles``, the closed form of the request-level timing
                model ``sim.timing.cache.CacheTiming`` (lookup pipeline, in-order delivery queue,
                MSHRs, backing tier), held within 5% of it by the tests; hit rates come from the
                trace-level model ``sim.reference.cache.simulate_trace`` (LRU) run on the
                workload's lookup traces;
``gather``      the embedding gather/pool unit (``sim.timing.embedding.predict``) reading the
                cached rows from NIC-attached memory (bandwidth ``memory_bytes_per_s``);
``packetizer``  the RoCEv2 packetizer (``sim.timing.packetizer.estimate_tx``) framing what the
                NIC sends between nodes.

Each unit is one FIFO server on the engine (:class:`NIC`), so every unit is a resource with
its own busy time and its own track in the timeline.

What this module computes (host-independent; ``host/cluster.py`` feeds it traces and applies
the results to a plan's per-rank work and AlltoAll matrices):

* :func:`cache_for` the cache geometry a capacity gives (one line per row; the line is the
  largest row the cache holds, like the RTL);
* :func:`trace_stats` hit rates of one cache on a table-major trace of bags, per segment
  (table shard), with the bag-level figures the AlltoAll needs (bags with at least one hit,
  bags all of whose rows hit); ``warm=True`` warms the cache on one batch and measures the
  next (steady state), ``warm=False`` measures a cold cache (a cache invalidated every batch);
* :func:`reorder_bags` the batch reordering: bags are grouped by the hottest row they look up
  (a star partition of the bag-row bipartite graph: each bag joins the star of its
  highest-degree row), so lookups of the same rows run back to back; :func:`adjacent_reuse`
  measures what that buys (the share of lookups whose row is among the last few looked up);
* :func:`gather_time_s`, :func:`packetizer_time_s`, :func:`cache_lookup_time_s` unit times
  (``sim.timing.cache.cache_cycles`` the cache's closed form).

Assumptions (each visible to users; see also ``host/cluster.py``):

* hits are measured on traces of ``trace_samples`` bags per shard, not the whole batch;
* the gather unit's per-row cycles come from the timing model on a sample of each shard's bags
  and scale with the rows; memory latency ``memory_latency_cycles`` is a mean;
* the packetizer frames each destination's bytes as one RDMA WRITE message at ``pmtu``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from neonic.sim.engine import Engine, cycles_to_ps
from neonic.sim.reference.cache import CacheConfig, simulate_trace
from neonic.sim.resources import ServerPool
from neonic.sim.timing.cache import (NIC_COMPARE_STAGES, NIC_LINE_SLICE, NIC_LOOKAHEAD, cache_cycles,
                                     miss_bubbles)
from neonic.sim.timing.embedding import BagShape, predict
from neonic.sim.timing.packetizer import estimate_tx, payload_gbps

__all__ = [
    "NIC_UNITS",
    "NICConfig",
    "Segment",
    "SegmentStats",
    "TraceStats",
    "cache_for",
    "trace_stats",
    "reorder_bags",
    "adjacent_reuse",
    "gather_time_s",
    "packetizer_time_s",
    "cache_lookup_time_s",
    "cache_cycles",
    "cores_time_s",
    "update_time_s",
    "KERNEL_MODELS",
    "NIC",
]

NIC_UNITS: tuple[str, ...] = ("cache", "gather", "packetizer")
#: How a NIC runs its embedding kernels: ``rtl`` (an FPGA SmartNIC: neonic's RTL units and
#: their timing models) or ``cores`` (an SoC SmartNIC: software on general-purpose cores, priced
#: by :func:`cores_time_s`'s memory-bound roofline; its packets are framed by the hardware NIC
#: at line rate, like a plain RDMA NIC).
KERNEL_MODELS: tuple[str, ...] = ("rtl", "cores")
_ELEM = {4: "fp32", 2: "fp16"}


@dataclass(frozen=True)
class NICConfig:
    """A SmartNIC's datapath, memories and switches (every mechanism can be off).

    ``local_cache_bytes`` / ``remote_cache_bytes`` of 0 switch the caches off; ``pool_on_nic``
    and ``reorder`` switch pooling on the NIC and batch reordering.
    """

    clock_hz: float = 250e6
    datapath_bytes: int = 64
    packetizers: int = 1              # packetizer instances side by side (messages spread over them)
    local_cache_bytes: float = 64 * 2**20
    remote_cache_bytes: float = 64 * 2**20
    cache_ways: int = 32
    memory_bytes_per_s: float = 38.4e9
    pool_on_nic: bool = True
    reorder: bool = True
    memory_latency_cycles: int = 40   # ASSUMPTION: ~160 ns DDR4 read at 250 MHz
    lanes: int = 16                   # FP32 adds per cycle in the gather/pool unit
    outstanding: int = 32             # row reads in flight in the gather/pool unit
    pmtu: int = 4096
    reuse_window: int = 8             # lookups back counted as "adjacent" reuse
    cache_mshrs: int = 16             # the cache's miss registers (rtl/cache.py's default)
    cache_queue_depth: int = 32       # its in-order delivery queue (2 x mshrs, the default)
    kernels: str = "rtl"              # how the NIC runs its embedding kernels: "rtl" (neonic's units) | "cores"
    cores: int = 0                    # "cores": general-purpose cores running the kernels (an SoC SmartNIC)
    core_rows_per_s: float = 0.0      # "cores": rows one core gathers (or probes, or updates) per second

    def __post_init__(self) -> None:
        checks = {
            "clock_hz": self.clock_hz > 0, "datapath_bytes": self.datapath_bytes >= 4,
            "packetizers": self.packetizers >= 1,
            "local_cache_bytes": self.local_cache_bytes >= 0, "remote_cache_bytes": self.remote_cache_bytes >= 0,
            "cache_ways": self.cache_ways >= 1, "memory_bytes_per_s": self.memory_bytes_per_s > 0,
            "memory_latency_cycles": self.memory_latency_cycles >= 1, "lanes": self.lanes >= 1,
            "outstanding": self.outstanding >= 1, "reuse_window": self.reuse_window >= 1,
            "cache_mshrs": self.cache_mshrs >= 1, "cache_queue_depth": self.cache_queue_depth >= 1,
            "kernels": self.kernels in KERNEL_MODELS,
            "cores": self.kernels != "cores" or self.cores >= 1,
            "core_rows_per_s": self.kernels != "cores" or self.core_rows_per_s > 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"nic.{name}: out of range, got {getattr(self, name)!r}")

    @property
    def local_cache(self) -> bool:
        return self.local_cache_bytes > 0

    @property
    def remote_cache(self) -> bool:
        return self.remote_cache_bytes > 0


# ------------------------------------------------------------------------------------ caches
def cache_for(capacity_bytes: float, line_bytes: int, ways: int) -> CacheConfig | None:
    """The cache a capacity buys: one line per row of ``line_bytes`` (the largest row held),
    ``ways`` ways (fewer when the cache has fewer lines); None when not one line fits."""
    if line_bytes < 1:
        raise ValueError(f"line_bytes: expected >= 1, got {line_bytes}")
    lines = int(capacity_bytes // line_bytes)
    if lines < 1:
        return None
    ways = max(1, min(ways, lines))
    return CacheConfig(sets=max(1, lines // ways), ways=ways, policy="lru", index="modulo")


@dataclass(frozen=True)
class Segment:
    """The traced bags of one table shard: ``lengths`` (lookups per bag) and ``rows`` (the
    row ids, bag after bag, each ``< num_rows``)."""

    key: str
    lengths: np.ndarray
    rows: np.ndarray
    num_rows: int
    row_bytes: int

    def __post_init__(self) -> None:
        if int(np.sum(self.lengths)) != len(self.rows):
            raise ValueError(f"segment {self.key}: lengths sum to {int(np.sum(self.lengths))}, "
                             f"but there are {len(self.rows)} rows")
        if len(self.rows) and (self.rows.min() < 0 or self.rows.max() >= self.num_rows):
            raise ValueError(f"segment {self.key}: rows must lie in [0, {self.num_rows})")


@dataclass(frozen=True)
class SegmentStats:
    """One segment's cache figures: lookup hit rate, bags with a hit, bags all hit."""

    lookups: int
    bags: int
    hit_rate: float
    bags_with_hit: float
    bags_all_hit: float


@dataclass(frozen=True)
class TraceStats:
    """A cache on a trace: overall hit rate and per-segment figures."""

    hit_rate: float
    lookups: int
    segments: dict[str, SegmentStats] = field(default_factory=dict)


def _bag_reduce(flags: np.ndarray, lengths: np.ndarray) -> tuple[float, float]:
    nonempty = lengths > 0
    if not nonempty.any():
        return 0.0, 0.0
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))[nonempty]
    anyhit = np.logical_or.reduceat(flags, starts)
    allhit = np.logical_and.reduceat(flags, starts)
    n = len(lengths)
    return float(anyhit.sum()) / n, float(allhit.sum()) / n


def _split(s: Segment) -> tuple[Segment, Segment]:
    half = len(s.lengths) // 2
    cut = int(np.sum(s.lengths[:half]))
    return (Segment(s.key, s.lengths[:half], s.rows[:cut], s.num_rows, s.row_bytes),
            Segment(s.key, s.lengths[half:], s.rows[cut:], s.num_rows, s.row_bytes))


def trace_stats(segments: Sequence[Segment], capacity_bytes: float, ways: int, *, warm: bool = True,
                reorder: bool = False, policy: str = "lru") -> TraceStats:
    """Hit rates of one cache of ``capacity_bytes`` serving ``segments`` in table-major order.

    Rows of different segments are distinct lines. ``warm``: each segment's bags are two
    batches (first half, second half); the first batches of every segment warm the cache and
    the second ones are measured (a steady-state cache); otherwise the whole trace is measured
    from an empty cache (a cache invalidated every batch). ``reorder``: each batch's bags are
    reordered first (:func:`reorder_bags`).

    ``policy``: ``"lru"`` (the RTL's set-associative LRU cache; every miss is inserted) or
    ``"static"``: the cache is loaded once with the rows looked up most often in the first
    batches (a profiled hot-row cache of read-only tables, as in inference) and never refilled,
    so misses insert nothing; it needs ``warm`` (the profile) and its hits do not depend on
    the order of the lookups. One line per row, placed without set conflicts.
    """
    if policy not in ("lru", "static"):
        raise ValueError(f"policy: expected 'lru' or 'static', got {policy!r}")
    if policy == "static" and not warm:
        raise ValueError("policy: 'static' needs warm=True (the first batches are the profile)")
    segments = [s for s in segments if len(s.lengths)]
    if warm:
        pairs = [_split(s) for s in segments]
        first, measured = [p[0] for p in pairs], [p[1] for p in pairs]
    else:
        first, measured = [], list(segments)
    if reorder:
        first = [_reordered(s) for s in first]
        measured = [_reordered(s) for s in measured]
    empty = {s.key: SegmentStats(len(s.rows), len(s.lengths), 0.0, 0.0, 0.0) for s in measured}
    n = sum(len(s.rows) for s in measured)
    if not n or capacity_bytes <= 0:
        return TraceStats(0.0, n, empty)
    line = max(s.row_bytes for s in measured)
    cfg = cache_for(capacity_bytes, line, ways)
    if cfg is None:
        return TraceStats(0.0, n, empty)
    offsets = dict(zip([s.key for s in measured], np.cumsum([0] + [s.num_rows for s in measured[:-1]])))
    warm_keys = [s.rows + offsets[s.key] for s in first]
    keys = [s.rows + offsets[s.key] for s in measured]
    if policy == "static":
        profile = np.concatenate(warm_keys) if warm_keys else np.zeros(0, np.int64)
        uniq, counts = np.unique(profile, return_counts=True)
        lines = cfg.sets * cfg.ways
        # the hottest rows (ties to the lowest key: deterministic)
        hot = uniq[np.lexsort((uniq, -counts))[:lines]]
        hits = np.isin(np.concatenate(keys), hot)
    else:
        n_warm = sum(len(k) for k in warm_keys)
        hits = simulate_trace(np.concatenate(warm_keys + keys), cfg).hits[n_warm:]
    out: dict[str, SegmentStats] = {}
    pos = 0
    for s in measured:
        flags = hits[pos:pos + len(s.rows)]
        pos += len(s.rows)
        anyhit, allhit = _bag_reduce(flags, s.lengths)
        out[s.key] = SegmentStats(len(s.rows), len(s.lengths), float(flags.mean()) if len(flags) else 0.0, anyhit, allhit)
    return TraceStats(float(hits.mean()), n, out)


# ------------------------------------------------------------------------------- reordering
def reorder_bags(lengths: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """A permutation of the bags that puts bags sharing hot rows next to each other.

    Graph view: bags and rows form a bipartite graph (a bag links to the rows it looks up).
    Each bag joins the star of its highest-degree row (the row most bags of the batch look
    up; ties to the lowest row id); stars are laid out hottest first and bags keep their
    order inside a star. Empty bags go last. Vectorised: O(lookups log lookups).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    rows = np.asarray(rows, dtype=np.int64)
    n = len(lengths)
    if n == 0:
        return np.zeros(0, np.int64)
    if len(rows) == 0:
        return np.arange(n)
    _, inverse, counts = np.unique(rows, return_inverse=True, return_counts=True)
    degree = counts[inverse]
    # per bag, the lookup of largest degree, then smallest row id: one key, max per bag
    span = int(rows.max()) + 1
    key = degree.astype(np.int64) * span + (span - 1 - rows)
    nonempty = lengths > 0
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))[nonempty]
    best = np.full(n, -1, np.int64)
    best[nonempty] = np.maximum.reduceat(key, starts)
    star_deg = np.where(best >= 0, best // span, 0)
    star_row = np.where(best >= 0, span - 1 - best % span, -1)
    return np.lexsort((np.arange(n), star_row, -star_deg, ~nonempty))


def _permute(lengths: np.ndarray, rows: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """The rows of the bags taken in the order ``perm``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    plen = lengths[perm]
    new_starts = np.concatenate(([0], np.cumsum(plen)[:-1]))
    idx = np.repeat(starts[perm] - new_starts, plen) + np.arange(int(plen.sum()))
    return rows[idx]


def _reordered(s: Segment) -> Segment:
    perm = reorder_bags(s.lengths, s.rows)
    return Segment(s.key, s.lengths[perm], _permute(s.lengths, s.rows, perm), s.num_rows, s.row_bytes)


def adjacent_reuse(lengths: np.ndarray, rows: np.ndarray, window: int = 8, reorder: bool = False) -> float:
    """Share of lookups whose row was looked up among the previous ``window`` lookups (the
    reuse a reordered batch exposes to the NIC's caches and row buffers)."""
    rows = np.asarray(rows, dtype=np.int64)
    if reorder:
        rows = _permute(np.asarray(lengths), rows, reorder_bags(lengths, rows))
    if len(rows) < 2:
        return 0.0
    reused = np.zeros(len(rows), bool)
    for k in range(1, window + 1):
        reused[k:] |= rows[k:] == rows[:-k]
    return float(reused.mean())


# -------------------------------------------------------------------------------- unit times
def _unit_timing(cfg: NICConfig, max_dim: int):
    from neonic.rtl.embedding import EmbeddingBagUnit

    lanes = min(cfg.lanes, cfg.datapath_bytes // 4)
    dim = max(1, min(4096, max_dim))
    unit = EmbeddingBagUnit(data_bytes=cfg.datapath_bytes, lanes=lanes, max_dim=dim, outstanding=cfg.outstanding,
                            beats_width=16)
    unit._MustUse__silence = True  # built for its pipeline figures only, never elaborated
    return unit.timing


def gather_time_s(cfg: NICConfig, shards: Sequence[tuple[int, int, float, float]], *, sample_bags: int = 32,
                  seed: int = 0, memo: dict | None = None) -> float:
    """Seconds for the gather/pool unit to gather and pool ``shards``: each ``(dim,
    elem_bytes, bags, rows_per_bag)`` with ``bags`` bags of (mean) ``rows_per_bag`` rows.

    The unit's cycles per bag come from :func:`sim.timing.embedding.predict` on ``sample_bags``
    bags of Poisson sizes around the mean (cycles of a batch grow linearly with its bags once
    the pipeline is full), scaled to the shard's bags; the time is the larger of those cycles
    and the NIC memory's bandwidth for the rows' bytes. ``memo`` (a dict the caller keeps)
    reuses the per-bag cycles of shapes already priced.
    """
    shards = [s for s in shards if s[2] > 0]
    if not shards:
        return 0.0
    if cfg.kernels == "cores":
        rows = sum(bags * per_bag for _, _, bags, per_bag in shards)
        return cores_time_s(cfg, rows, sum(bags * per_bag * dim * eb for dim, eb, bags, per_bag in shards))
    memo = {} if memo is None else memo
    timing = None
    cycles = 0.0
    nbytes = 0.0
    for dim, eb, bags, per_bag in shards:
        key = (cfg.datapath_bytes, cfg.lanes, cfg.outstanding, cfg.memory_latency_cycles, int(dim), int(eb),
               round(float(per_bag), 1), sample_bags)
        if key not in memo:
            if timing is None:
                tkey = ("timing", cfg.datapath_bytes, cfg.lanes, cfg.outstanding)
                if tkey not in memo:
                    memo[tkey] = _unit_timing(cfg, 4096)
                timing = memo[tkey]
            rng = np.random.default_rng([seed, int(dim), int(eb), int(round(per_bag * 10))])
            sizes = rng.poisson(per_bag, sample_bags) if per_bag > 0 else np.zeros(sample_bags, np.int64)
            shapes = [BagShape(int(dim), _ELEM.get(int(eb), "fp32"), (True,) * int(n)) for n in sizes]
            memo[key] = predict(timing, shapes, latency=cfg.memory_latency_cycles).cycles / sample_bags
        cycles += memo[key] * bags
        nbytes += bags * per_bag * dim * eb
    return max(cycles / cfg.clock_hz, nbytes / cfg.memory_bytes_per_s)


def cache_lookup_time_s(cfg: NICConfig, lookups: float, *, hit_rate: float = 1.0,
                        row_bytes: float | None = None, misses_elsewhere: bool = False) -> float:
    """Seconds for the cache to serve ``lookups`` whole-row reads of ``row_bytes`` (mean;
    default one datapath beat) at ``hit_rate`` (:func:`cache_cycles`; misses are filled
    with the NIC memory's latency ``memory_latency_cycles``).

    ``misses_elsewhere``: the misses are not served by the cache at all (the system's SmartNIC
    caches: a local-cache miss is gathered by the GPU from HBM, a remote-cache miss arrives
    from its owner over the network), so a miss costs the cache one tag probe (the cycles it
    holds the last stage of its lookup pipeline) and no fill from NIC memory, no row delivery; only the hits stream
    their rows out."""
    if lookups <= 0:
        return 0.0
    if cfg.kernels == "cores":
        # a software cache: every lookup probes its tag (one row's work on a core); the hits'
        # rows are read by the gather (priced there)
        return cores_time_s(cfg, lookups, 0.0)
    beats = 1 if row_bytes is None else max(1, math.ceil(row_bytes / cfg.datapath_bytes))
    if misses_elsewhere:
        hits = lookups * hit_rate
        cycles = (cache_cycles(hits, 0.0, beats, latency=cfg.memory_latency_cycles, mshrs=cfg.cache_mshrs,
                               queue_depth=cfg.cache_queue_depth, compare_stages=NIC_COMPARE_STAGES,
                               lookahead=NIC_LOOKAHEAD, line_slice=NIC_LINE_SLICE)
                  if hits > 0 else 0.0)
        probe = 1 + miss_bubbles(NIC_LOOKAHEAD)    # cycles a miss holds the last lookup stage
        return (cycles + probe * (lookups - hits)) / cfg.clock_hz
    cycles = cache_cycles(lookups, 1.0 - hit_rate, beats, latency=cfg.memory_latency_cycles,
                          mshrs=cfg.cache_mshrs, queue_depth=cfg.cache_queue_depth,
                          compare_stages=NIC_COMPARE_STAGES, lookahead=NIC_LOOKAHEAD,
                          line_slice=NIC_LINE_SLICE)
    return cycles / cfg.clock_hz


def cores_time_s(cfg: NICConfig, rows: float, nbytes: float) -> float:
    """Seconds for an SoC SmartNIC's cores to handle ``rows`` rows (gather, probe or update)
    moving ``nbytes`` of NIC memory: a memory-bound roofline, the larger of the memory's
    bandwidth for the bytes and the cores' row rate (``cores`` x ``core_rows_per_s``; a random
    row access per row, each core keeping a few in flight)."""
    if cfg.kernels != "cores":
        raise ValueError(f"nic.kernels: cores_time_s needs 'cores', got {cfg.kernels!r}")
    if rows <= 0 and nbytes <= 0:
        return 0.0
    return max(rows / (cfg.cores * cfg.core_rows_per_s), nbytes / cfg.memory_bytes_per_s)


def update_time_s(cfg: NICConfig, rows: float, row_bytes: float, state_bytes: float) -> float:
    """Seconds for the NIC to apply a training step's sparse update to ``rows`` rows it holds
    (read and write each row and its optimizer state in NIC memory): memory-bound at
    ``memory_bytes_per_s`` (ASSUMPTION for the FPGA NIC: neonic's RTL has no optimizer unit, so
    it is priced as a streaming kernel at the memory's bandwidth), or :func:`cores_time_s`."""
    if rows <= 0:
        return 0.0
    nbytes = 2.0 * rows * (row_bytes + state_bytes)
    if cfg.kernels == "cores":
        return cores_time_s(cfg, rows, nbytes)
    return nbytes / cfg.memory_bytes_per_s


def framing_gbps(cfg: NICConfig) -> float:
    """Payload Gb/s the NIC's packetizers frame side by side in the steady state
    (``cfg.packetizers`` x :func:`sim.timing.packetizer.payload_gbps` at the datapath's width
    and clock); 0 for an SoC NIC, whose hardware NIC frames at line rate."""
    if cfg.kernels == "cores":
        return 0.0
    return cfg.packetizers * payload_gbps(cfg.datapath_bytes, cfg.pmtu, cfg.clock_hz)


def packetizer_time_s(cfg: NICConfig, message_bytes: Sequence[float], memo: dict | None = None) -> float:
    """Seconds for the NIC's packetizers to frame one RDMA WRITE message per entry (bytes, FP32
    payload); each packetizer frames its messages back to back, and the messages go to the
    least loaded of ``cfg.packetizers`` instances, longest first. Long messages are sums of
    identical MIDDLE frames, so they are priced from the timing model on a short message plus
    the MIDDLE frames' cycles. An SoC NIC (``kernels = "cores"``) frames in its hardware NIC
    at line rate, like a plain RDMA NIC: 0 here (the network's time is the collective's).
    ``memo`` (a dict the caller keeps) reuses the timing model's cycles of message sizes
    already priced (an AlltoAllv's ranks send messages of few distinct sizes)."""
    if cfg.kernels == "cores":
        return 0.0
    pm = cfg.pmtu
    memo = {} if memo is None else memo

    def tx_cycles(n: int) -> int:
        key = (n, cfg.datapath_bytes, pm)
        if key not in memo:
            memo[key] = estimate_tx([n], data_bytes=cfg.datapath_bytes, pmtu=pm).cycles
        return memo[key]

    cycles: list[int] = []
    base3 = tx_cycles(3 * pm)
    base2 = tx_cycles(2 * pm)
    per_middle = base3 - base2
    for n in message_bytes:
        n = 4 * int(math.ceil(n / 4))  # whole FP32 elements
        if n <= 0:
            continue
        extra = max(0, (n - 1) // pm - 2)
        cycles.append(tx_cycles(n - extra * pm) + extra * per_middle)
    if cfg.packetizers == 1 or len(cycles) <= 1:
        return sum(cycles) / cfg.clock_hz
    load = [0] * cfg.packetizers
    for c in sorted(cycles, reverse=True):
        load[load.index(min(load))] += c
    return max(load) / cfg.clock_hz


# ------------------------------------------------------------------------- engine resources
Done = Callable[[int, int], None]


class NIC:
    """One SmartNIC on the engine: one FIFO server per unit (:data:`NIC_UNITS`).

    ``run(durations_ps, on_done)`` starts one job per unit named in ``durations_ps`` (a
    mapping unit -> ps) and calls ``on_done(start, end)`` once all have finished; every unit
    interval is recorded in ``intervals[unit]`` (start, end, label) for the timeline.
    """

    def __init__(self, engine: Engine, cfg: NICConfig, name: str = "nic", record: bool = True) -> None:
        self.engine = engine
        self.cfg = cfg
        self.name = name
        self.units = {u: ServerPool(engine, 1, name=f"{name}.{u}") for u in NIC_UNITS}
        self.record = record
        self.intervals: dict[str, list[tuple[int, int, str]]] = {u: [] for u in NIC_UNITS}

    def run(self, durations_ps: dict[str, int], on_done: Done, label: str = "") -> None:
        for unit in durations_ps:
            if unit not in self.units:
                raise ValueError(f"durations_ps.{unit}: no such NIC unit; expected one of {', '.join(NIC_UNITS)}")
        jobs = {u: d for u, d in durations_ps.items() if d > 0}
        start = self.engine.now
        if not jobs:
            self.engine.after(0, on_done, start, start)
            return
        left = [len(jobs)]

        def one(unit: str) -> Done:
            def done(s: int, e: int) -> None:
                if self.record:
                    self.intervals[unit].append((s, e, label))
                left[0] -= 1
                if left[0] == 0:
                    on_done(start, self.engine.now)
            return done

        for unit, d in jobs.items():
            self.units[unit].submit(int(d), one(unit))

    def cycles_ps(self, cycles: float) -> int:
        return cycles_to_ps(int(math.ceil(cycles)), self.cfg.clock_hz)

    def utilization(self, elapsed_ps: int) -> dict[str, float]:
        return {u: p.utilization(elapsed_ps) for u, p in self.units.items()}
