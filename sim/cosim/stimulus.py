"""What the simulators are fed: the traffic laid out in the NICs' memories (tables placed
at cache-line-aligned bases), descriptor, addressing-table, send and bag-item payloads per
NIC, and the receive buffers; and the reference result every run is held to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from neonic.rtl.smartnic import SmartNIC
from neonic.sim.cosim.traffic import RX_REGION_ALIGN, NICJob, Traffic, endpoint, vector_bytes
from neonic.sim.reference import embedding as ref
from neonic.sim.reference.roce import segment

__all__ = ["DEFAULT_MEMORY_LATENCY", "Stimulus", "check_job", "build_stimulus",
           "expected_buffers"]

#: Backing-memory latency (cycles) of the cache's back port in co-simulation: NIC DRAM behind a
#: controller (ASSUMPTION: tens of cycles at 250 MHz).
DEFAULT_MEMORY_LATENCY = 20


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
                pad = np.zeros(vector_bytes(len(v), nic.lanes) // 4, dtype=np.float32)
                pad[:len(v)] = v
                vecs.append(pad)
            at += s.bags
            raw = np.concatenate(vecs).view(np.uint8) if vecs else np.zeros(0, np.uint8)
            out[base:base + len(raw)] = raw
    return out
