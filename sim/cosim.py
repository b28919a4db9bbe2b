"""Co-simulation: the SmartNIC RTL (``rtl/smartnic.py``) as the NICs of a small cluster.

One iteration's forward embedding traffic runs through real RTL instances, one per rank:

1. **Send side** (every NIC, one after the other, the design reset in between): the NIC's
   table shards are placed in its memory (the cache's back port), their descriptors and the
   addressing table are written, the cache is invalidated, then the bags (every sample of every
   rank that looks up a shard this NIC owns, ordered by the sample's owner) stream into the
   gather unit while one RDMA WRITE send per destination is posted. The frames leaving
   ``tx_frame`` are collected.
2. **Network**: the frames' payload bytes form an AlltoAllv matrix that the flow-level network
   model (``sim.network``) carries over the cluster's topology (its finish time is reported);
   each destination receives its frames interleaved round-robin across sources (one frame at
   a time, as concurrent flows arrive), a NIC's frames to itself included (loopback).
3. **Receive side** (every NIC): the receive QPs are initialised and the frames fed to
   ``rx_frame``; the depacketizer writes the payloads into the destination's buffer
   (``rx_mem``), one region per source.

Checks: every destination buffer equals the reference (``sim.reference.embedding.pool`` of the
same tables and bags, vectors padded to whole beats) byte for byte; the cache's misses equal the
reference cache model's; and the per-unit cycle counts the top measures (its activity windows)
are set side by side with the composed timing model (:func:`model_cycles`, with the parameters
of ``sim.calibration``).

Simulators: ``"amaranth"`` (one Amaranth simulation per phase for the whole cluster, the design
wrapped in a reset inserter), ``"verilator"`` or ``"icarus"`` (the exported Verilog, one cocotb
run per phase through ``tests/cocotb/tb_smartnic.py``, the same stimulus). ``"auto"`` picks
Verilator when installed, else Amaranth.

Traffic comes from :func:`synthetic_traffic` (a small table-wise cluster) or from a cluster
run's plan (:func:`traffic_from_plan`, duck-typed so that ``sim`` imports nothing from
``host``). Assumptions: FP32 tables with SUM pooling; a table shard's columns must be a
multiple of the NIC's lanes and its row stride must divide the cache line; data-parallel
tables are skipped (they need no NIC); row-wise shards send their partial pools to the
samples' owners (the reduce is the GPU's).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from neonic.rtl.cache import CacheOp
from neonic.rtl.roce import DROP_REASONS
from neonic.rtl.smartnic import UNITS, SmartNIC, counter_names
from neonic.sim.calibration import Calibration, Sample, default_calibration
from neonic.sim.reference import embedding as ref
from neonic.sim.reference.cache import HIT, MISS, CacheConfig, CacheModel
from neonic.sim.reference.roce import segment
from neonic.sim.timing.embedding import predict, shapes_from_bags
from neonic.sim.timing.packetizer import estimate_rx, estimate_tx

__all__ = [
    "SIMULATORS", "DEFAULT_MEMORY_LATENCY", "Send", "NICJob", "Traffic", "synthetic_traffic",
    "traffic_from_plan", "varied_traffic", "collect_samples", "RTLNICBackend", "Stimulus", "build_stimulus", "NICRun", "CosimReport", "run_cosim",
    "model_cycles", "calibration_sample", "resolve_sim", "format_report", "endpoint",
]

SIMULATORS = ("auto", "amaranth", "verilator", "icarus")
#: Backing-memory latency (cycles) of the cache's back port in co-simulation: NIC DRAM behind a
#: controller (ASSUMPTION: tens of cycles at 250 MHz).
DEFAULT_MEMORY_LATENCY = 20
RX_REGION_ALIGN = 64


def endpoint(rank: int) -> tuple[int, int]:
    """(MAC, IPv4) of rank ``rank``'s NIC: locally administered 02:4e:49:43:xx:xx, 10.0.x.x."""
    return 0x02_4E_49_43_00_00 | rank, 0x0A_00_00_00 | rank


# ---------------------------------------------------------------------------------- traffic
@dataclass(frozen=True)
class Send:
    """One RDMA WRITE a NIC posts: its next ``bags`` pooled vectors to ``dest``."""

    dest: int
    bags: int
    length: int          # payload bytes (bags x padded vector bytes)
    offset: int = 0      # byte offset of this source's region in the destination's buffer


@dataclass
class NICJob:
    """One NIC's work: its table shards, its bags (in send order) and its sends."""

    rank: int
    tables: list[ref.Table]
    bags: list[ref.Bag]
    sends: list[Send]

    @property
    def rows(self) -> int:
        return sum(int(ref.contributing(self.tables[b.table], b).sum()) for b in self.bags)


@dataclass
class Traffic:
    """A cluster's forward embedding traffic: one :class:`NICJob` per rank."""

    world: int
    gpus_per_node: int
    jobs: list[NICJob]
    label: str = "traffic"

    def buffer_bytes(self, rank: int) -> int:
        """Size of rank ``rank``'s receive buffer (every source's region)."""
        end = 0
        for job in self.jobs:
            for s in job.sends:
                if s.dest == rank:
                    end = max(end, s.offset + s.length)
        return end


def _vector_bytes(dim: int, lanes: int) -> int:
    return -(-dim // lanes) * lanes * 4


def _assign_offsets(world: int, jobs: list[NICJob]) -> None:
    """Give every (source, destination) message its region of the destination's buffer."""
    at = [0] * world
    for job in sorted(jobs, key=lambda j: j.rank):
        new = []
        for s in job.sends:
            off = at[s.dest]
            at[s.dest] += -(-s.length // RX_REGION_ALIGN) * RX_REGION_ALIGN
            new.append(Send(s.dest, s.bags, s.length, off))
        job.sends = new


def _sends_for(bags_by_dest: dict[int, list[ref.Bag]], tables: list[ref.Table],
               lanes: int) -> tuple[list[ref.Bag], list[Send]]:
    bags, sends = [], []
    for dest in sorted(bags_by_dest):
        group = bags_by_dest[dest]
        if not group:
            continue
        length = sum(_vector_bytes(tables[b.table].dim, lanes) for b in group)
        bags += group
        sends.append(Send(dest, len(group), length))
    return bags, sends


def synthetic_traffic(*, world: int = 4, gpus_per_node: int = 2, tables_per_rank: int = 1,
                      rows: int = 64, dim: int = 16, batch_per_gpu: int = 2, pooling: int = 4,
                      alpha: float = 1.15, lanes: int = 4, seed: int = 1) -> Traffic:
    """A small table-wise cluster: rank ``r`` owns ``tables_per_rank`` tables of ``rows`` x
    ``dim`` FP32; every sample of every rank looks up every table with ``pooling`` Zipf(``alpha``)
    indices (bag lengths vary by +-1 around ``pooling``)."""
    if world < 1 or gpus_per_node < 1 or world % gpus_per_node:
        raise ValueError(f"world: expected a multiple of gpus_per_node={gpus_per_node}, "
                         f"got {world}")
    rng = np.random.default_rng(seed)
    jobs = []
    for r in range(world):
        tables = [ref.random_table(rng, rows, dim) for _ in range(tables_per_rank)]
        by_dest: dict[int, list[ref.Bag]] = {}
        tag = 0
        for q in range(world):
            for sample in range(batch_per_gpu):
                for t in range(tables_per_rank):
                    n = max(0, pooling + int(rng.integers(-1, 2)))
                    idx = ref.zipf_indices(rng, alpha, rows, n)
                    by_dest.setdefault(q, []).append(ref.Bag(t, idx, tag=tag & 0xFF))
                    tag += 1
        bags, sends = _sends_for(by_dest, tables, lanes)
        jobs.append(NICJob(r, tables, bags, sends))
    _assign_offsets(world, jobs)
    return Traffic(world, gpus_per_node, jobs,
                   label=f"synthetic {world // gpus_per_node}x{gpus_per_node}, "
                         f"{tables_per_rank} table(s)/rank, batch {batch_per_gpu}")


def varied_traffic(specs: Sequence[dict[str, Any]], *, batch_per_gpu: int = 2,
                   lanes: int = 4, seed: int = 1, label: str = "varied") -> Traffic:
    """One rank per spec, each owning one table of its own shape: ``rows``, ``dim``,
    ``pooling`` (lookups per bag) and ``alpha`` (Zipf); every sample of every rank looks it up.
    The NICs' workloads differ (cache hit rates from near 0 to near 1), which is what a
    calibration needs from one co-simulation (``neonic calibrate``)."""
    world = len(specs)
    if world < 1:
        raise ValueError("specs: expected at least one workload spec, got none")
    rng = np.random.default_rng(seed)
    jobs = []
    for r, spec in enumerate(specs):
        rows, dim = int(spec["rows"]), int(spec["dim"])
        pooling, alpha = int(spec.get("pooling", 4)), float(spec.get("alpha", 1.15))
        table = ref.random_table(rng, rows, dim)
        by_dest: dict[int, list[ref.Bag]] = {}
        tag = 0
        for q in range(world):
            for _ in range(batch_per_gpu):
                n = max(0, pooling + int(rng.integers(-1, 2)))
                by_dest.setdefault(q, []).append(
                    ref.Bag(0, ref.zipf_indices(rng, alpha, rows, n), tag=tag & 0xFF))
                tag += 1
        bags, sends = _sends_for(by_dest, [table], lanes)
        jobs.append(NICJob(r, [table], bags, sends))
    _assign_offsets(world, jobs)
    return Traffic(world, 1, jobs, label=label)


def traffic_from_plan(plan: Any, tables: Sequence[Any], *, batch_per_gpu: int, world: int,
                      gpus_per_node: int, lanes: int, seed: int = 1, alpha: float = 1.15,
                      max_rows: int = 1 << 14, lookups: Any = None) -> Traffic:
    """One iteration's forward traffic under a sharding plan.

    ``plan.tables[name]`` gives ``sharding`` (its ``.value``) and ``shards`` (``rank``,
    ``row_start``/``row_end``, ``col_start``/``col_end``); ``tables`` are the workload's tables
    (``name``, ``rows``, ``dim``, ``pooling``: mean lookups per bag). Every rank owns
    ``batch_per_gpu`` samples; each sample looks up every table (Poisson bag lengths, Zipf row
    popularity); each shard's owner pools the lookups that fall in its rows over its columns
    and sends them to the samples' owners. Data-parallel tables are skipped.

    ``lookups``: the iteration's :class:`~sim.lookups.LookupBatch` (the cluster run's own, so
    the RTL runs the lookups the timing models ran); None draws the default one for ``seed``
    and ``alpha`` (:func:`sim.lookups.draw_lookups`). It must hold the whole batch.
    """
    from neonic.sim.lookups import draw_lookups

    if lookups is None:
        lookups = draw_lookups(tables, world=world, batch_per_gpu=batch_per_gpu, seed=seed, alpha=alpha)
    rng = np.random.default_rng(seed)
    per_rank_tables: list[list[ref.Table]] = [[] for _ in range(world)]
    per_rank_bags: list[dict[int, list[ref.Bag]]] = [{} for _ in range(world)]
    tags = [0] * world
    for t in tables:
        tp = plan.tables[t.name]
        if getattr(tp.sharding, "value", tp.sharding) == "data_parallel":
            continue
        if t.rows > max_rows:
            raise ValueError(f"workload.tables.{t.name}.rows: the RTL backend holds whole tables "
                             f"in simulated memory: expected <= {max_rows}, got {t.rows}")
        full = (rng.standard_normal((t.rows, t.dim))).astype(np.float32)
        tl = lookups[t.name]
        if tl.scale != 1.0 or tl.bags != world * batch_per_gpu:
            raise ValueError(f"workload.tables.{t.name}: the RTL backend needs the whole batch of "
                             f"{world * batch_per_gpu} bags, the lookups hold {tl.bags}")
        ends = np.cumsum(tl.lengths)
        flat = np.split(tl.indices, ends[:-1])
        indices = [flat[q * batch_per_gpu:(q + 1) * batch_per_gpu] for q in range(world)]
        for shard in tp.shards:
            cols = shard.col_end - shard.col_start
            if cols % lanes:
                raise ValueError(f"workload.tables.{t.name}: a shard of {cols} columns is not a "
                                 f"multiple of the NIC's {lanes} lanes")
            r = shard.rank
            sub = ref.Table(np.ascontiguousarray(full[shard.row_start:shard.row_end,
                                                      shard.col_start:shard.col_end]))
            ti = len(per_rank_tables[r])
            per_rank_tables[r].append(sub)
            for q in range(world):
                for s in range(batch_per_gpu):
                    idx = indices[q][s]
                    keep = idx[(idx >= shard.row_start) & (idx < shard.row_end)] - shard.row_start
                    per_rank_bags[r].setdefault(q, []).append(
                        ref.Bag(ti, keep, tag=tags[r] & 0xFF))
                    tags[r] += 1
    jobs = []
    for r in range(world):
        bags, sends = _sends_for(per_rank_bags[r], per_rank_tables[r], lanes)
        jobs.append(NICJob(r, per_rank_tables[r], bags, sends))
    _assign_offsets(world, jobs)
    return Traffic(world, gpus_per_node, jobs, label="plan")


# --------------------------------------------------------------------------------- stimulus
@dataclass
class Stimulus:
    """What the simulators are fed (JSON-able apart from the two memory images).

    ``mem``: the tables of every NIC in one image (each NIC's tables in its own region, each
    table's base aligned to a cache line), served on the cache's back port; ``rx_size``: bytes
    of the receive memory holding every rank's buffer (rank ``r``'s at ``rx_base[r]``).
    ``tx[r]``: descriptor writes, addressing table, sends, bag items and the number of frames
    expected; ``bases[r]``: table bases (beats).
    """

    params: dict[str, Any]
    mem: np.ndarray
    rx_size: int
    rx_base: list[int]
    tx: list[dict[str, Any]]
    memory_latency: int


def _place_aligned(tables: list[ref.Table], data_bytes: int, line_beats: int,
                   at: int) -> tuple[list[bytes], list[int], int]:
    chunks, bases = [], []
    for table in tables:
        at = -(-at // line_beats) * line_beats
        p = ref.place_tables([table], data_bytes, base=0)
        raw = p.contents[:table.num_rows * ref.row_stride_beats(table.dim, table.elem_type,
                                                                data_bytes) * data_bytes]
        bases.append(at)
        chunks.append((at, raw))
        at += len(raw) // data_bytes
    return chunks, bases, at


def check_job(nic: SmartNIC, job: NICJob) -> None:
    """Raise ``ValueError`` when ``job`` does not fit the NIC's parameters."""
    if len(job.tables) > nic.tables:
        raise ValueError(f"nic {job.rank}: {len(job.tables)} table shards, the NIC holds "
                         f"tables={nic.tables} descriptors")
    for i, t in enumerate(job.tables):
        stride = ref.row_stride_beats(t.dim, t.elem_type, nic.data_bytes)
        if t.dim > nic.max_dim or nic.line_beats % stride:
            raise ValueError(f"nic {job.rank}: table {i}: dim {t.dim} (stride {stride} beats) "
                             f"must be <= max_dim={nic.max_dim} with a stride dividing "
                             f"line_beats={nic.line_beats}")
        if t.elem_type != "fp32" or t.pooling != "sum":
            raise ValueError(f"nic {job.rank}: table {i}: expected fp32 SUM tables, got "
                             f"{t.elem_type} {t.pooling}")
    for b in job.bags:
        if len(b.indices) > nic.params["max_bag_length"]:
            raise ValueError(f"nic {job.rank}: a bag of {len(b.indices)} indices exceeds "
                             f"max_bag_length={nic.params['max_bag_length']}")
    if max((s.dest for s in job.sends), default=0) >= nic.num_dest:
        raise ValueError(f"nic {job.rank}: destinations exceed num_dest={nic.num_dest}")


def build_stimulus(nic: SmartNIC, traffic: Traffic, *,
                   memory_latency: int = DEFAULT_MEMORY_LATENCY) -> Stimulus:
    """Lay the traffic out for the simulators (see :class:`Stimulus`)."""
    W = nic.data_bytes
    if traffic.world > min(nic.num_dest, nic.num_qps):
        raise ValueError(f"world: {traffic.world} ranks, the NIC serves num_dest={nic.num_dest} "
                         f"destinations and num_qps={nic.num_qps} receive QPs")
    at = nic.line_beats           # beat 0.. left unused
    chunks_all, tx = [], []
    for job in traffic.jobs:
        check_job(nic, job)
        chunks, bases, at = _place_aligned(job.tables, W, nic.line_beats, at)
        chunks_all += chunks
        descs = [{"table": i, "base": bases[i], "rows": t.num_rows, "dim": t.dim,
                  "elem_type": 0, "pooling": 0, "pad_valid": 0, "pad_index": 0}
                 for i, t in enumerate(job.tables)]
        dests = []
        for d in range(traffic.world):
            mac, ip = endpoint(d)
            dests.append({"index": d, "mac": mac, "ip": ip, "qpn": job.rank,
                          "udp_sport": 0xC000 | job.rank, "psn": 0})
        tx.append({"rank": job.rank, "descs": descs, "dests": dests, "sends": [],
                   "items": ref.bag_items(job.bags, nic.params["index_width"]),
                   "frames": sum(len(segment(s.length, nic.pmtu, True)) for s in job.sends)})
    mem = np.zeros((at + nic.line_beats) * W, dtype=np.uint8)
    for base, raw in chunks_all:
        mem[base * W:base * W + len(raw)] = raw
    rx_base, rx_at = [], W
    for r in range(traffic.world):
        rx_at = -(-rx_at // RX_REGION_ALIGN) * RX_REGION_ALIGN
        rx_base.append(rx_at)
        rx_at += traffic.buffer_bytes(r)
    rx_size = -(-(rx_at + W) // W) * W
    if rx_size // W > (1 << nic.rx_addr_width) or len(mem) // W > (1 << nic.params["addr_width"]):
        raise ValueError("traffic: the memory images exceed the NIC's address widths")
    for job, t in zip(traffic.jobs, tx):
        t["sends"] = [{"dest": s.dest, "va": rx_base[s.dest] + s.offset, "rkey": 0x100 | job.rank,
                       "length": s.length, "imm": (job.rank << 16) | k, "has_imm": 1, "dim": 0}
                      for k, s in enumerate(job.sends)]
    return Stimulus(dict(nic.params), mem, rx_size, rx_base, tx, memory_latency)


def expected_buffers(nic: SmartNIC, traffic: Traffic, stim: Stimulus) -> np.ndarray:
    """The receive memory the reference computation gives (every destination's buffer)."""
    out = np.zeros(stim.rx_size, dtype=np.uint8)
    for job in traffic.jobs:
        pooled = ref.pool(job.tables, job.bags)
        at = 0
        for s in job.sends:
            base = stim.rx_base[s.dest] + s.offset
            vecs = []
            for v in pooled[at:at + s.bags]:
                pad = np.zeros(_vector_bytes(len(v), nic.lanes) // 4, dtype=np.float32)
                pad[:len(v)] = v
                vecs.append(pad)
            at += s.bags
            raw = np.concatenate(vecs).view(np.uint8) if vecs else np.zeros(0, np.uint8)
            out[base:base + len(raw)] = raw
    return out


# ------------------------------------------------------------------------------ the network
def route_frames(frames: list[list[bytes]], world: int) -> list[list[bytes]]:
    """Each destination's frames in arrival order: round-robin across sources, one frame at a
    time, each source's frames in their own order (the PSN order of its QP)."""
    per: list[list[list[bytes]]] = [[[] for _ in range(world)] for _ in range(world)]
    for src, fs in enumerate(frames):
        for f in fs:
            dest = int.from_bytes(f[30:34], "big") & 0xFFFF  # IPv4 destination: 10.0.x.x
            per[dest][src].append(f)
    out = []
    for dest in range(world):
        queues = [list(q) for q in per[dest]]
        order = []
        while any(queues):
            for q in queues:
                if q:
                    order.append(q.pop(0))
        out.append(order)
    return out


def network_time_s(frames: list[list[bytes]], world: int, topology: Any) -> float | None:
    """Finish time (s) of the frames' payload as an AlltoAllv on the flow-level network model
    (``topology``: a ``sim.network`` topology of at least ``world`` GPUs; None: not timed)."""
    if topology is None:
        return None
    from neonic.sim.engine import Engine, s_from_ps
    from neonic.sim.network import collectives as coll
    from neonic.sim.network.network import Network

    sizes = np.zeros((world, world), dtype=np.int64)
    for src, fs in enumerate(frames):
        for f in fs:
            dest = int.from_bytes(f[30:34], "big") & 0xFFFF
            if dest != src:
                sizes[src, dest] += len(f)
    engine = Engine()
    net = Network(engine, topology)
    done: list[int] = []
    coll.alltoallv(net, list(range(world)), sizes, on_done=lambda h: done.append(h.end_ps))
    engine.run()
    return s_from_ps(done[0]) if done else 0.0


def cluster_topology(world: int, gpus_per_node: int, preset: str = "zionex") -> Any:
    """A ``sim.network`` topology of ``world / gpus_per_node`` nodes of ``gpus_per_node`` GPUs
    (the preset's links, one NIC per GPU)."""
    from neonic.sim.network.config import NetworkConfig, load_preset
    from neonic.sim.network.topology import Topology

    d = load_preset(preset).to_dict()
    d["cluster"]["nodes"] = world // gpus_per_node
    d["cluster"]["gpus_per_node"] = gpus_per_node
    if "nic" in d and "per_node" in d["nic"]:
        d["nic"]["per_node"] = gpus_per_node
    d["name"] = f"{preset}-{world // gpus_per_node}x{gpus_per_node}"
    return Topology(NetworkConfig.from_dict(d))


# ------------------------------------------------------------------------------- simulators
def resolve_sim(sim: str) -> str:
    """``"auto"`` -> Verilator when installed, else Amaranth; others are checked."""
    from neonic.sim.harness import available_simulators

    if sim not in SIMULATORS:
        raise ValueError(f"sim: expected one of {', '.join(SIMULATORS)}, got {sim!r}")
    if sim == "auto":
        return "verilator" if "verilator" in available_simulators() else "amaranth"
    if sim != "amaranth" and sim not in available_simulators():
        raise ValueError(f"sim: {sim!r} is not installed here; available: amaranth, "
                         f"{', '.join(available_simulators()) or '(no HDL simulator)'}")
    return sim


def _frame_beats(frame: bytes, W: int) -> list[dict]:
    return [{"data": int.from_bytes(frame[o:o + W], "little"), "count": len(frame[o:o + W]),
             "last": int(o + W >= len(frame))} for o in range(0, len(frame), W)]


def _counters_dict(view) -> dict[str, int]:
    return {name: int(getattr(view, name)) for name in counter_names()}


def _amaranth_phase(nic: SmartNIC, stim: Stimulus, phase: str,
                    rx_frames: list[list[bytes]] | None, rx_mem: np.ndarray | None, *,
                    seed: int, idle: float, backpressure: float
                    ) -> tuple[list[dict], np.ndarray | None, dict]:
    """One phase for every NIC in one Amaranth simulation; returns per NIC
    ``{"counters", "frames", "cycles", "completions"}``, the receive memory, and the
    simulation phase's ``{"wall_s", "cycles"}`` (from the testbench's start, after
    elaboration, to its end)."""
    from amaranth.hdl import ResetInserter, Signal

    from neonic.sim.harness import AmaranthMemory, run_amaranth

    W = nic.data_bytes
    rst = Signal()
    top = ResetInserter({"sync": rst})(nic)
    rng = np.random.default_rng([seed, 0 if phase == "tx" else 1])
    mem = AmaranthMemory(nic.mem, stim.mem.copy(), data_bytes=W, rng=rng,
                         latency=(stim.memory_latency, stim.memory_latency), max_outstanding=64)
    rxm = AmaranthMemory(nic.rx_mem, rx_mem if rx_mem is not None
                         else np.zeros(stim.rx_size, np.uint8), data_bytes=W, rng=rng,
                         latency=(1, 1), max_outstanding=64)
    results: list[dict] = []
    total_work = sum(len(t["items"]) * 8 + 40 * t["frames"] for t in stim.tx) + \
        sum(len(f) for fs in (rx_frames or []) for f in fs) // W * 2
    budget = 20000 + 40 * total_work

    async def drive(ctx, sources, sinks, done):
        """Drive several streams from one coroutine: ``sources`` [(stream, payloads)],
        ``sinks`` [(stream, list)]; until ``done()`` with every source sent."""
        pos = [0] * len(sources)
        offered = [False] * len(sources)
        for s, _ in sinks:
            ctx.set(s.ready, 1)
        while True:
            for i, (s, items) in enumerate(sources):
                if not offered[i] and pos[i] < len(items) and not (idle and rng.random() < idle):
                    ctx.set(s.payload, items[pos[i]])
                    ctx.set(s.valid, 1)
                    offered[i] = True
            for s, _ in sinks:
                ctx.set(s.ready, int(not (backpressure and rng.random() < backpressure)))
            sampled = [x for s, _ in sources for x in (s.ready,)] + \
                [x for s, _ in sinks for x in (s.valid, s.ready, s.payload)]
            values = (await ctx.tick().sample(*sampled))[2:]
            k = len(sources)
            for i, (s, _) in enumerate(sources):
                if offered[i] and values[i]:
                    pos[i] += 1
                    offered[i] = False
                    ctx.set(s.valid, 0)
            for j, (s, out) in enumerate(sinks):
                v, r, p = values[k + 3 * j:k + 3 * j + 3]
                if v and r:
                    out.append(p)
            if all(p == len(items) for p, (_, items) in zip(pos, sources)) and done():
                for s, _ in sinks:
                    ctx.set(s.ready, 0)
                return

    async def reset(ctx):
        ctx.set(rst, 1)
        await ctx.tick()
        ctx.set(rst, 0)

    sim_phase = {"wall_s": 0.0, "cycles": 0}

    async def tb(ctx):
        wall0 = time.perf_counter()
        await phase_body(ctx)
        sim_phase["wall_s"] = time.perf_counter() - wall0

    async def phase_body(ctx):
        for k, t in enumerate(stim.tx):
            await reset(ctx)
            mac, ip = endpoint(t["rank"])
            ctx.set(nic.local_mac, mac)
            ctx.set(nic.local_ip, ip)
            if phase == "tx":
                await drive(ctx, [(nic.cache_cmd, [CacheOp.INVALIDATE]), (nic.desc, t["descs"]),
                                  (nic.dest, t["dests"])], [], lambda: True)
                beats: list = []
                frames: list[bytes] = []
                cur = bytearray()

                def collected():
                    nonlocal cur
                    while beats:
                        b = beats.pop(0)
                        cur += int(b.data).to_bytes(W, "little")[:int(b.count)]
                        if b.last:
                            frames.append(bytes(cur))
                            cur = bytearray()
                    return len(frames) >= t["frames"]
                await drive(ctx, [(nic.bags, t["items"]), (nic.send, t["sends"])],
                            [(nic.tx_frame, beats)], collected)
                for _ in range(4):
                    await ctx.tick()
                results.append({"counters": _counters_dict(ctx.get(nic.counters)),
                                "frames": frames})
            else:
                await drive(ctx, [(nic.qp_init, [{"qp": q, "psn": 0}
                                                 for q in range(len(stim.tx))])], [], lambda: True)
                expect = sum(1 for o in stim.tx for s in o["sends"] if s["dest"] == t["rank"])
                comps: list = []
                beats_in = [b for f in rx_frames[k] for b in _frame_beats(f, W)]
                await drive(ctx, [(nic.rx_frame, beats_in)], [(nic.completion, comps)],
                            lambda: len(comps) >= expect)
                for _ in range(4):
                    await ctx.tick()
                results.append({"counters": _counters_dict(ctx.get(nic.counters)),
                                "completions": len(comps)})

    sim_phase["cycles"] = run_amaranth(top, [tb], processes=[mem.process, rxm.process],
                                       max_cycles=budget)
    return results, (rxm.contents if phase == "rx" else None), sim_phase


def _cocotb_phase(nic: SmartNIC, stim: Stimulus, phase: str, rx_frames, sim: str, *,
                  seed: int, idle: float, backpressure: float, workdir: Path
                  ) -> tuple[list[dict], np.ndarray | None, dict]:
    """One phase for every NIC in one cocotb run of the exported top (``tb_smartnic``); the
    third value is the bench's own measure of its simulation phase ``{"wall_s", "cycles"}``."""
    from neonic.sim.harness import read_tb_figures, run_cocotb

    workdir.mkdir(parents=True, exist_ok=True)
    job = {"phase": phase, "params": {k: (list(v) if isinstance(v, tuple) else v)
                                      for k, v in stim.params.items()},
           "tx": stim.tx, "rx_size": stim.rx_size, "memory_latency": stim.memory_latency,
           "idle": idle, "backpressure": backpressure,
           "rx_frames": [[f.hex() for f in fs] for fs in (rx_frames or [])]}
    job_path = workdir / f"job-{phase}.json"
    job_path.write_text(json.dumps(job))
    np.save(workdir / "mem.npy", stim.mem)
    out_path = workdir / f"out-{phase}.json"
    out_path.unlink(missing_ok=True)
    results_xml = run_cocotb(nic, "smartnic", "tb_smartnic", sim=sim, seed=seed,
                             params={"job": str(job_path), "out": str(out_path),
                                     "mem": str(workdir / "mem.npy")},
                             timeout_s=600)
    read_tb_figures(results_xml)
    out = json.loads(out_path.read_text())
    results = []
    for r in out["nics"]:
        item = {"counters": r["counters"]}
        if phase == "tx":
            item["frames"] = [bytes.fromhex(f) for f in r["frames"]]
        else:
            item["completions"] = r["completions"]
        results.append(item)
    rx = np.load(workdir / "rx.npy") if phase == "rx" else None
    return results, rx, dict(out.get("sim_phase") or {"wall_s": 0.0, "cycles": 0})


# ------------------------------------------------------------------------------ the models
def _requests(nic: SmartNIC, job: NICJob, bases: list[int]) -> list[tuple[int, int]]:
    W = nic.data_bytes
    out = []
    for b in job.bags:
        t = job.tables[b.table]
        stride = ref.row_stride_beats(t.dim, t.elem_type, W)
        keep = ref.contributing(t, b)
        for idx in b.indices[keep]:
            out.append((bases[b.table] + int(idx) * stride, stride))
    return out


def reference_cache(nic: SmartNIC, job: NICJob, bases: list[int]) -> dict[str, float]:
    """Hits (merged misses included) and misses of the reference cache model on the job's
    requests, from a cold cache."""
    model = CacheModel(_cache_config(nic))
    hits = misses = 0
    for addr, beats in _requests(nic, job, bases):
        out = model.request(addr, beats, False, nic.line_beats, nic.cache.row_beats)
        hits += out.kind == HIT
        misses += out.kind == MISS
    n = hits + misses
    return {"hits": hits, "misses": misses, "hit_rate": hits / n if n else 0.0}


def _cache_config(nic: SmartNIC) -> CacheConfig:
    p = nic.params
    return CacheConfig(sets=p["cache_sets"], ways=p["cache_ways"], policy=p["cache_policy"],
                       index=p["cache_index"])


def cache_request_starts(nic: SmartNIC, requests: Sequence[tuple[int, int]],
                         offers: Sequence[float], *, memory_latency: float) -> list[float]:
    """When the SmartNIC's cache can start delivering each read request (in order) offered at
    ``offers`` (cycles), from a cold cache: a request-level model of ``rtl/cache.py`` with the
    rules of ``sim.timing.cache.CacheTiming`` (one lookup per cycle, in order, stalled while the
    operation queue is full, a miss finds no free MSHR or its victim line still has queued
    work; misses' fills serialised on the back port, ``row_beats`` beats each, first beat
    ``memory_latency`` cycles after the request; delivery in order, one beat per cycle, an
    operation on a row in flight waits for its fill), but with each request's own offer time
    instead of one request every cycle. Outcomes come from the reference cache model."""
    from collections import deque

    from neonic.sim.reference.cache import ERROR, set_index

    if len(offers) != len(requests):
        raise ValueError(f"offers: expected one per request ({len(requests)}), got {len(offers)}")
    cache = nic.cache
    cfg = _cache_config(nic)
    model = CacheModel(cfg)
    rb, lb = cache.row_beats, nic.line_beats
    lat = max(1, int(round(memory_latency)))
    fill_ready: dict[int, float] = {}
    op_ends: deque = deque()
    mshr_free_at: deque = deque()
    line_end: dict[tuple[int, int], float] = {}
    lookup = -np.inf
    seq_free = last_beat = exec_free = -np.inf
    starts: list[float] = []
    for i, ((addr, beats), offer) in enumerate(zip(requests, offers)):
        out = model.request(addr, beats, False, lb, rb)
        t = max(float(offer) + 1, lookup + 1)
        line = (-1, -1) if out.kind == ERROR else (int(set_index(addr // lb, cfg)), out.way)
        while True:
            while op_ends and op_ends[0] < t:
                op_ends.popleft()
            while mshr_free_at and mshr_free_at[0] <= t:
                mshr_free_at.popleft()
            if len(op_ends) >= cache.queue_depth:
                t = op_ends[0] + 1
            elif out.kind == MISS and len(mshr_free_at) >= cache.mshrs:
                t = mshr_free_at[0]
            elif out.kind == MISS and line_end.get(line, -np.inf) >= t:
                t = line_end[line] + 1
            else:
                break
        lookup = t
        start = max(t, exec_free)
        if out.kind == MISS:
            job = max(t + 1, seq_free)
            seq_free = job + 1
            first = max(job + lat, last_beat + 1)
            last_beat = first + rb - 1
            fill_ready[i] = last_beat + 1
            mshr_free_at.append(last_beat + 1)
            start = max(start, last_beat + 1)
        elif out.kind != ERROR:
            start = max(start, fill_ready.get(out.filled_by, -np.inf))
        exec_free = start + beats
        line_end[line] = exec_free - 1
        op_ends.append(exec_free - 1)
        starts.append(float(start))
    return starts


#: Fixed-point iterations of :func:`memory_model` before it settles for the mean of the last two.
MAX_MEMORY_ITERATIONS = 40


def memory_model(nic: SmartNIC, job: NICJob, bases: list[int],
                 memory_latency: float) -> Callable[[float, float], tuple[float, float]]:
    """The composed gather + cache model of one NIC's job: ``(hit_latency, miss_cycles) ->
    (gather cycles, memory window cycles)`` (see ``sim.calibration``).

    Each row's latency is the cache's delay for its request (:func:`cache_request_starts` at
    ``memory_latency + miss_cycles``, from the cycle the gather model issues it) plus
    ``hit_latency``; the gather model (``sim.timing.embedding.predict``) and the cache model
    are iterated until the issue times stop changing. The memory window runs from the first
    request to the last beat the reducer takes."""
    timing = nic.gather.timing
    shapes = shapes_from_bags(job.tables, job.bags)
    reqs = _requests(nic, job, bases)
    memo: dict[tuple[float, float], tuple[float, float]] = {}

    def run(hit_latency: float, miss_cycles: float) -> tuple[float, float]:
        key = (round(hit_latency, 3), round(miss_cycles, 3))
        if key in memo:
            return memo[key]
        if not shapes:
            memo[key] = (0.0, 0.0)
            return memo[key]
        hit = max(1.0, hit_latency)
        lats: list[float] | float = hit
        history: list[tuple[float, float]] = []
        for _ in range(MAX_MEMORY_ITERATIONS):
            pr = predict(timing, shapes, latency=lats)
            window = float(pr.last_take - pr.issue[0] + 1) if pr.issue else 0.0
            history.append((float(pr.cycles), window))
            if not reqs:
                break
            starts = cache_request_starts(nic, reqs, pr.issue,
                                          memory_latency=memory_latency + miss_cycles)
            new = [max(1.0, hit + s - (o + 1)) for s, o in zip(starts, pr.issue)]
            if new == lats:
                break
            lats = new
        else:   # no fixed point (an oscillation): the mean of the last two
            history[-1] = tuple((a + b) / 2 for a, b in zip(history[-1], history[-2]))
        memo[key] = history[-1]
        return memo[key]
    return run


def _row_dims(job: NICJob) -> list[int]:
    out = []
    for b in job.bags:
        t = job.tables[b.table]
        out += [t.dim] * int(ref.contributing(t, b).sum())
    return out


def calibration_sample(nic: SmartNIC, job: NICJob, stim_tx: dict, rx_lengths: list[int],
                       rtl: dict[str, float], label: str = "",
                       memory_latency: float = DEFAULT_MEMORY_LATENCY) -> Sample:
    """The calibration/model view of one NIC's run (see ``sim.calibration.Sample``)."""
    bases = [d["base"] for d in stim_tx["descs"]]
    cref = reference_cache(nic, job, bases)
    lengths = [s.length for s in job.sends]
    tx = estimate_tx(lengths, data_bytes=nic.data_bytes, pmtu=nic.pmtu,
                     with_imm=[True] * len(lengths)).cycles if lengths else 0
    rx = estimate_rx(rx_lengths, data_bytes=nic.data_bytes, pmtu=nic.pmtu,
                     with_imm=[True] * len(rx_lengths)) if rx_lengths else 0
    return Sample(rtl=dict(rtl), hit_rate=cref["hit_rate"],
                  memory_model=memory_model(nic, job, bases, memory_latency),
                  tx_alone=float(tx), rx_model=float(rx), misses=int(cref["misses"]),
                  label=label)


def model_cycles(sample: Sample, cal: Calibration) -> dict[str, float]:
    """The timing-model backend's cycles per unit for one NIC's run (``sample.predict``)."""
    return sample.predict(cal)


# ------------------------------------------------------------------------------- the run
@dataclass
class NICRun:
    """One NIC's figures: RTL cycles and model cycles per unit, counters, checks."""

    rank: int
    rtl: dict[str, int]
    model: dict[str, float]
    counters_tx: dict[str, int]
    counters_rx: dict[str, int]
    cache_ref: dict[str, float]
    frames_sent: int
    completions: int

    def rel_error(self) -> dict[str, float]:
        return {u: abs(self.model[u] - self.rtl[u]) / self.rtl[u]
                for u in self.model if self.rtl.get(u)}


@dataclass
class CosimReport:
    """The outcome of one co-simulated iteration."""

    sim: str
    label: str
    world: int
    gpus_per_node: int
    nics: list[NICRun]
    buffers_match: bool
    mismatched_bytes: int
    cache_misses_match: bool
    drops: int
    network_time_s: float | None
    rtl_cycles: int
    wall_s: float
    #: the simulation phases alone (no elaboration, Verilog export, build or simulator
    #: start-up): wall time and every simulated clock cycle of the top (resets included)
    sim_wall_s: float = 0.0
    sim_cycles: int = 0
    calibration: dict[str, Any] = field(default_factory=dict)

    @property
    def max_rel_error(self) -> float:
        return max((e for n in self.nics for e in n.rel_error().values()), default=0.0)

    def unit_max_rel_error(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for n in self.nics:
            for u, e in n.rel_error().items():
                out[u] = max(out.get(u, 0.0), e)
        return out

    @property
    def rtl_cycles_per_s(self) -> float:
        """RTL cycles (every NIC's, both phases) per second of the whole run, per-run overhead
        (elaboration, export, build, start-up) included."""
        return self.rtl_cycles / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def sim_cycles_per_s(self) -> float:
        """Simulated clock cycles of the top per second of the simulation phases alone."""
        return self.sim_cycles / self.sim_wall_s if self.sim_wall_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "sim": self.sim, "label": self.label, "world": self.world,
            "gpus_per_node": self.gpus_per_node, "buffers_match": self.buffers_match,
            "mismatched_bytes": self.mismatched_bytes,
            "cache_misses_match": self.cache_misses_match, "frames_dropped": self.drops,
            "network_time_s": self.network_time_s, "rtl_cycles": self.rtl_cycles,
            "wall_s": self.wall_s, "rtl_cycles_per_s": self.rtl_cycles_per_s,
            "sim_wall_s": self.sim_wall_s, "sim_cycles": self.sim_cycles,
            "sim_cycles_per_s": self.sim_cycles_per_s,
            "max_rel_error": self.max_rel_error, "unit_max_rel_error": self.unit_max_rel_error(),
            "calibration": self.calibration,
            "nics": [{"rank": n.rank, "rtl": n.rtl, "model": n.model, "rel_error": n.rel_error(),
                      "cache_hits": n.counters_tx.get("cache_hits", 0)
                      + n.counters_tx.get("cache_merged", 0),
                      "cache_misses": n.counters_tx.get("cache_misses", 0),
                      "cache_ref": n.cache_ref, "frames_sent": n.frames_sent,
                      "completions": n.completions} for n in self.nics],
        }


def _window(counters: dict[str, int], unit: str) -> int:
    first, last = counters[f"{unit}_first"], counters[f"{unit}_last"]
    return last - first + 1 if last >= first and (last or first) else 0


def run_cosim(traffic: Traffic, *, sim: str = "auto", nic: SmartNIC | None = None,
              calibration: Calibration | None = None, topology: Any = None,
              memory_latency: int = DEFAULT_MEMORY_LATENCY, seed: int = 1, idle: float = 0.0,
              backpressure: float = 0.0, workdir: Path | None = None,
              progress: Callable[[str], None] | None = None) -> CosimReport:
    """Run ``traffic`` through one RTL SmartNIC per rank (see the module docstring).

    ``idle``/``backpressure`` add random idle cycles on the inputs and backpressure on the
    outputs (functional checks; cycle comparisons want both 0). ``topology``: a ``sim.network``
    topology that times the frames (default: the ZionEX links at the traffic's shape).
    """
    say = progress or (lambda message: None)
    sim = resolve_sim(sim)
    nic = nic or SmartNIC()
    if topology is None:
        topology = cluster_topology(traffic.world, traffic.gpus_per_node)
    stim = build_stimulus(nic, traffic, memory_latency=memory_latency)
    t0 = time.perf_counter()
    if sim != "amaranth":
        from neonic.sim.harness import resolve_build_root
        import hashlib
        key = hashlib.sha256(json.dumps(stim.tx, sort_keys=True).encode()).hexdigest()[:12]
        workdir = workdir or resolve_build_root() / "cosim" / key

    def phase(name, frames=None, rx=None):
        if sim == "amaranth":
            return _amaranth_phase(nic, stim, name, frames, rx, seed=seed, idle=idle,
                                   backpressure=backpressure)
        return _cocotb_phase(nic, stim, name, frames, sim, seed=seed, idle=idle,
                             backpressure=backpressure, workdir=workdir)

    say(f"cosim: send side of {traffic.world} NICs on {sim}")
    tx, _, tx_phase = phase("tx")
    frames = [r["frames"] for r in tx]
    say(f"cosim: {sum(len(f) for f in frames)} frames through the network model")
    net_s = network_time_s(frames, traffic.world, topology)
    arrivals = route_frames(frames, traffic.world)
    say(f"cosim: receive side of {traffic.world} NICs on {sim}")
    rx, rx_mem, rx_phase = phase("rx", arrivals)
    wall = time.perf_counter() - t0
    sim_phase = {"wall_s": tx_phase["wall_s"] + rx_phase["wall_s"],
                 "cycles": int(tx_phase["cycles"] + rx_phase["cycles"])}

    expected = expected_buffers(nic, traffic, stim)
    diff = int(np.count_nonzero(rx_mem != expected))
    cal = calibration or default_calibration(memory_latency, nic.params["mshrs"])
    runs = []
    misses_ok = True
    drops = 0
    cycles = 0
    for job, t, tr, rr in zip(traffic.jobs, stim.tx, tx, rx):
        rtl = {u: _window(tr["counters"], u) for u in ("gather", "cache", "packetizer")}
        rtl["depacketizer"] = _window(rr["counters"], "depacketizer")
        rx_lengths = [s.length for j in traffic.jobs for s in j.sends if s.dest == job.rank]
        sample = calibration_sample(nic, job, t, rx_lengths, rtl, label=f"nic{job.rank}",
                                    memory_latency=memory_latency)
        cref = reference_cache(nic, job, [d["base"] for d in t["descs"]])
        misses_ok &= tr["counters"]["cache_misses"] == cref["misses"]
        drops += sum(rr["counters"][f"rx_{r}"] for r in DROP_REASONS)
        cycles += tr["counters"]["cycles"] + rr["counters"]["cycles"]
        runs.append(NICRun(job.rank, rtl, model_cycles(sample, cal), tr["counters"],
                           rr["counters"], cref, len(tr["frames"]), rr["completions"]))
    return CosimReport(sim, traffic.label, traffic.world, traffic.gpus_per_node, runs,
                       diff == 0, diff, misses_ok, drops, net_s, cycles, wall,
                       sim_wall_s=sim_phase["wall_s"], sim_cycles=sim_phase["cycles"],
                       calibration={"parameters": cal.parameters(),
                                    "source": cal.context.get("source", "file")})


def collect_samples(report: CosimReport, traffic: Traffic, nic: SmartNIC,
                    memory_latency: int = DEFAULT_MEMORY_LATENCY) -> list[Sample]:
    """Calibration samples (one per NIC) from a finished co-simulation."""
    stim = build_stimulus(nic, traffic, memory_latency=memory_latency)
    out = []
    for job, t, run in zip(traffic.jobs, stim.tx, report.nics):
        rx_lengths = [s.length for j in traffic.jobs for s in j.sends if s.dest == job.rank]
        out.append(calibration_sample(nic, job, t, rx_lengths, run.rtl,
                                      label=f"{traffic.label}/nic{job.rank}",
                                      memory_latency=memory_latency))
    return out


def format_report(report: CosimReport) -> str:
    """The per-unit cycle counts, RTL and timing model side by side, and the checks."""
    lines = [f"co-simulation: {report.label} on {report.sim} ({report.world} NICs, "
             f"{report.rtl_cycles} RTL cycles in {report.wall_s:.1f} s)",
             f"{'nic':>4} {'unit':<13}{'rtl cycles':>11}{'model':>11}{'error':>9}"]
    for n in report.nics:
        err = n.rel_error()
        for u in UNITS:
            if u in n.model:
                lines.append(f"{n.rank:>4} {u:<13}{n.rtl[u]:>11}{n.model[u]:>11.0f}"
                             f"{100 * err[u]:>8.2f}%")
    lines.append(f"max relative error: {100 * report.max_rel_error:.2f}% "
                 f"(per unit: " + ", ".join(f"{u} {100 * e:.2f}%" for u, e in
                                            report.unit_max_rel_error().items()) + ")")
    lines.append(f"pooled embeddings at every destination equal the reference: "
                 f"{'yes' if report.buffers_match else 'NO'} "
                 f"({report.mismatched_bytes} bytes differ); cache misses equal the reference "
                 f"model: {'yes' if report.cache_misses_match else 'NO'}; frames dropped: "
                 f"{report.drops}")
    if report.sim_wall_s > 0:
        lines.append(f"simulation phases alone: {report.sim_cycles} cycles of the top in "
                     f"{report.sim_wall_s:.2f} s = {report.sim_cycles_per_s:.0f} cycles/s")
    if report.network_time_s is not None:
        lines.append(f"network model: the AlltoAll of the frames' bytes takes "
                     f"{report.network_time_s * 1e6:.2f} us")
    return "\n".join(lines)


# ------------------------------------------------------------------- the cluster runtime hook
class RTLNICBackend:
    """The RTL backend of the cluster runtime's SmartNICs (``neonic run --backend rtl``).

    ``host.cluster.ClusterRun(..., nic_backend=RTLNICBackend(...))`` calls it once per run with
    the run (its ``scenario``, ``plan`` and ``topology``), the timing-model backend's NIC effects
    and the iteration's work. It co-simulates the iteration's forward embedding traffic on one
    RTL SmartNIC per rank (:func:`run_cosim`, traffic from :func:`traffic_from_plan`) and
    returns the effects with the NICs' forward unit times (``cache``, ``gather``) taken from
    the RTL's cycle counts at the NIC clock; the co-simulation's report (RTL and model cycles
    side by side, the bit-exact check) goes to ``figures["rtl_cosim"]`` (the run's
    ``metrics["nic"]``) and to :attr:`report`. Everything else (caches' hit rates at the
    configured capacity, PCIe, AlltoAll matrices) stays the model's: the RTL instances are
    small (``rtl.smartnic.SmartNIC`` defaults) and hold whole tables in simulated memory.
    """

    def __init__(self, *, sim: str = "auto", calibration: Calibration | None = None,
                 nic: SmartNIC | None = None, memory_latency: int = DEFAULT_MEMORY_LATENCY,
                 progress: Callable[[str], None] | None = None):
        self.sim = resolve_sim(sim)
        self.calibration = calibration
        self.nic = nic
        self.memory_latency = memory_latency
        self.progress = progress
        self.report: CosimReport | None = None

    def __call__(self, run: Any, effects: Any, work: Any) -> Any:
        from dataclasses import replace

        sc = run.scenario
        if effects is None:
            raise ValueError("--backend rtl: the system has no SmartNICs (system.embeddings must "
                             "be \"nic\", e.g. system preset \"smartnic\")")
        world = work.world_size
        nic = self.nic or SmartNIC(num_dest=max(16, world), num_qps=max(16, world))
        traffic = traffic_from_plan(run.plan, sc.workload.tables,
                                    batch_per_gpu=sc.workload.batch_per_gpu, world=world,
                                    gpus_per_node=work.gpus_per_node, lanes=nic.lanes,
                                    seed=sc.seed, lookups=getattr(effects, "lookups", None))
        traffic.label = f"{sc.name} (iteration traffic of the plan)"
        if not any(job.bags for job in traffic.jobs):
            raise ValueError("--backend rtl: the plan leaves the NICs no embedding traffic "
                             "(every table data-parallel)")
        self.report = run_cosim(traffic, sim=self.sim, nic=nic, calibration=self.calibration,
                                topology=getattr(run, "topology", None),
                                memory_latency=self.memory_latency, seed=sc.seed,
                                progress=self.progress)
        hz = effects.cfg.clock_hz
        units = []
        for n in self.report.nics:
            units.append(tuple((u, int(round(n.rtl[u] * 1e12 / hz)))
                               for u in ("cache", "gather") if n.rtl.get(u)))
        figures = dict(effects.figures)
        figures["rtl_cosim"] = self.report.as_dict()
        return replace(effects, fwd_units=units, figures=figures)
