"""The SmartNIC top: cache + gather/pool unit + packetizer on the send side, depacketizer on the
receive side, host-writable configuration and counters, as one Amaranth design.

Data path
=========

::

    bags ──► EmbeddingBagUnit ──mem──► OnChipCache ──back──► mem (NIC DRAM / host tier)
                   │ pooled (lanes FP32 per beat = one payload beat)
                   ▼
    send ──► Packetizer ──► tx_frame                   (RoCEv2 RC RDMA WRITE frames)

    rx_frame ──► Depacketizer ──► rx_mem               (the destination's buffer)
                      └────────► completion

* The gather/pool unit (:class:`rtl.embedding.EmbeddingBagUnit`) reads rows through the cache
  controller with its lines in on-chip block RAM (:class:`rtl.cache.OnChipCache`: a
  :class:`rtl.cache.CacheController` and a :class:`rtl.cache.LineRAM`; at NIC sizes the lines
  are in the card's DRAM behind the controller's ``lines`` port); the cache's back port is the
  top's ``mem`` port. The unit's memory port is the cache's front port unchanged (same address width, beat
  count width and beat size).
* Each pooled beat (``lanes`` FP32 values, ``lanes * 4 == data_bytes``) is one payload beat of
  the packetizer (:class:`rtl.packetizer.Packetizer`). The host posts one *send* (an RDMA WRITE
  work request, :class:`rtl.packetizer.SendDescriptor`) per destination message; a send of
  ``length`` bytes consumes the next ``ceil(length / data_bytes)`` pooled beats. A bag's vector
  is ``ceil(dim / lanes)`` beats, lanes past ``dim`` zero, so a message that carries ``n`` bags
  of dimension ``dim`` has ``length = n * ceil(dim / lanes) * data_bytes`` and the receiver
  sees each vector padded to whole beats. The host orders the bags by destination and posts the
  sends in the same order (that is the contract; a send shorter than its bags leaves the rest
  of the pooled stream waiting for the next send, nothing is dropped).
* The depacketizer (:class:`rtl.depacketizer.Depacketizer`) checks every received frame and
  writes accepted payloads to ``rx_mem`` at the RETH virtual address (a byte address, a multiple
  of ``data_bytes``); ``completion`` reports each finished message.

Host-writable configuration (each a stream the host writes; all may be written at any time,
with each unit's own rule for when a write takes effect):

``desc``
    Table descriptors of the gather/pool unit (:class:`rtl.embedding.DescriptorLayout`).
    For the cache to hold whole rows a table's ``base`` must be a multiple of ``line_beats`` and
    its row stride (``ceil(dim * elem_bytes / data_bytes)`` beats) must divide ``line_beats``;
    a request that crosses a line is answered with zeros and counted in ``cache_errors``.
``dest``
    The addressing table of the packetizer (:class:`rtl.packetizer.DestEntry`: MAC, IPv4, QP,
    UDP source port and next PSN of each destination). ``local_mac``/``local_ip`` are inputs.
``cache_cmd``
    Cache maintenance (:class:`rtl.cache.CacheOp`: FLUSH, INVALIDATE); ready on completion.
``qp_init``
    Next expected PSN of each local receive QP (:class:`rtl.depacketizer.QPInit`).
``send``
    RDMA WRITE work requests (see above).

Counters (``counters``, :class:`SmartNICCounters`, 32 bits each, reset with the design): every
counter of the three units (prefixed ``gather_``, ``cache_``, ``rx_``), the top's own
(``tx_frames``, ``tx_beats``, ``pooled_beats``, ``pooled_error_bags``, ``pooled_dropped_bags``,
``cycles``), and per unit an activity window: the cycle numbers (of the free-running
``cycles``) of the first and the last transfer that define the unit's work since reset:

==============  =====================================  ====================================
unit            first                                  last
==============  =====================================  ====================================
gather          bag item taken on ``bags``             pooled beat taken by the packetizer
cache           request taken on the cache front       response beat taken by the unit
packetizer      send taken                             frame beat taken on ``tx_frame``
depacketizer    frame beat taken on ``rx_frame``       write beat taken on ``rx_mem``
==============  =====================================  ====================================

A unit's cycle count is ``last - first + 1`` (0 when it saw nothing): what the timing models
predict and what the co-simulation compares (``sim/cosim.py``).

Timing
======

The units keep their own timing (see their docstrings): the top adds no register stage between
them, so the pooled-to-payload and cache hand-offs cost nothing. The packetizer runs at the
pace of the pooled stream when the gather unit is the bottleneck (the usual case: a row costs
at least ``add_latency + 1 = 5`` cycles in the reducer).

Default parameters
==================

Modest, so the whole top simulates at thousands of cycles per second in Amaranth's simulator and
builds in Verilator in well under a minute: a 128-bit datapath (``data_bytes=16``, 4 FP32
lanes), FP32 tables of up to ``max_dim=32`` elements (row strides 1, 2, 4, 8 beats), 8 table
descriptors, 8 outstanding rows; a 16-set, 4-way LRU cache of 8-beat lines (64 rows of up to
128 bytes, 8 KiB) with 4 MSHRs; a 256-byte path MTU, 16 destinations and 16 receive QPs (a
cluster of up to 16 ranks).
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .cache import CacheOp, CacheStats, OnChipCache
from .depacketizer import Completion, Counters as RxCounters, Depacketizer, QPInit
from .embedding import COUNTER_NAMES, EmbeddingBagUnit
from .packetizer import DestEntry, Packetizer, SendDescriptor
from .roce import FrameBeat, check_data_bytes, check_pmtu
from .streams import MemPortSignature, check_int

__all__ = ["UNITS", "counter_names", "SmartNICCounters", "SmartNIC"]

#: The units whose activity windows the top counts, in the order of the data path.
UNITS = ("gather", "cache", "packetizer", "depacketizer")

_TOP_COUNTERS = ("tx_frames", "tx_beats", "pooled_beats", "pooled_error_bags",
                 "pooled_dropped_bags", "cycles")


def counter_names() -> tuple[str, ...]:
    """Every field of :class:`SmartNICCounters`, in layout order."""
    names = [f"gather_{n}" for n in COUNTER_NAMES]
    names += [f"cache_{n}" for n in CacheStats.FIELDS]
    names += [f"rx_{n}" for n in RxCounters().members]
    names += list(_TOP_COUNTERS)
    for unit in UNITS:
        names += [f"{unit}_first", f"{unit}_last"]
    return tuple(names)


class SmartNICCounters(data.StructLayout):
    """All counters of the top, 32 bits each (see the module docstring)."""

    def __init__(self):
        super().__init__({name: unsigned(32) for name in counter_names()})


class SmartNIC(wiring.Component):
    """The SmartNIC top (see the module docstring).

    Parameters
    ----------
    data_bytes : bytes per beat of every datapath (memory, payload, frames): 8, 16, 32 or 64.
    lanes : FP32 lanes of the gather/pool unit; must be ``data_bytes // 4`` (one pooled beat is
        one payload beat).
    max_dim, tables, outstanding, max_bag_length, elem_types, index_width, tag_width :
        the gather/pool unit's (:class:`rtl.embedding.EmbeddingBagUnit`).
    addr_width, beats_width : the memory port between the gather unit, the cache and ``mem``.
    cache_sets, cache_ways, line_beats, cache_policy, cache_index, mshrs : the cache's.
    pmtu : path MTU of sent and received frames.
    num_dest : rows of the packetizer's addressing table.
    num_qps : receive QPs of the depacketizer.
    rx_addr_width : beat-address width of ``rx_mem``.
    """

    def __init__(self, *, data_bytes: int = 16, lanes: int | None = None, max_dim: int = 32,
                 tables: int = 8, outstanding: int = 8, max_bag_length: int = 63,
                 elem_types: tuple[str, ...] = ("fp32",), index_width: int = 16,
                 tag_width: int = 8, addr_width: int = 20, beats_width: int = 4,
                 cache_sets: int = 16, cache_ways: int = 4, line_beats: int = 8,
                 cache_policy: str = "lru", cache_index: str = "modulo", mshrs: int = 4,
                 pmtu: int = 256, num_dest: int = 16, num_qps: int = 16,
                 rx_addr_width: int = 20):
        self.data_bytes = check_data_bytes(data_bytes)
        if lanes is None:
            lanes = data_bytes // 4
        if lanes != data_bytes // 4:
            raise ValueError(f"lanes: one pooled beat must be one payload beat: expected "
                             f"data_bytes // 4 = {data_bytes // 4}, got {lanes!r}")
        self.lanes = lanes
        self.pmtu = check_pmtu(pmtu)
        self.line_beats = check_int("line_beats", line_beats, minimum=1, power_of_two=True)
        self.rx_addr_width = check_int("rx_addr_width", rx_addr_width, minimum=8, maximum=64)
        # Build the units now: their constructors validate every parameter by name.
        self.gather = EmbeddingBagUnit(
            data_bytes=data_bytes, lanes=lanes, max_dim=max_dim, tables=tables,
            outstanding=outstanding, max_bag_length=max_bag_length, elem_types=elem_types,
            addr_width=addr_width, beats_width=beats_width, index_width=index_width,
            tag_width=tag_width)
        max_stride = -(-max_dim * 4 // data_bytes)
        if max_stride > line_beats:
            raise ValueError(f"line_beats: a row of max_dim={max_dim} FP32 elements needs "
                             f"{max_stride} beats, expected line_beats >= {max_stride}, "
                             f"got {line_beats}")
        self.cache = OnChipCache(
            data_bytes=data_bytes, addr_width=addr_width, beats_width=beats_width,
            line_beats=line_beats, sets=cache_sets, ways=cache_ways, index=cache_index,
            policy=cache_policy, mshrs=mshrs)
        pk_dim = max(lanes, -(-max_dim // lanes) * lanes)
        self.packetizer = Packetizer(data_bytes=data_bytes, pmtu=pmtu, num_dest=num_dest,
                                     max_dim=min(pk_dim, pmtu - 8 - (pmtu - 8) % lanes))
        self.depacketizer = Depacketizer(data_bytes=data_bytes, pmtu=pmtu, num_qps=num_qps,
                                         addr_width=rx_addr_width)
        self.params = {
            "data_bytes": data_bytes, "lanes": lanes, "max_dim": max_dim, "tables": tables,
            "outstanding": outstanding, "max_bag_length": max_bag_length,
            "elem_types": tuple(elem_types), "index_width": index_width, "tag_width": tag_width,
            "addr_width": addr_width, "beats_width": beats_width, "cache_sets": cache_sets,
            "cache_ways": cache_ways, "line_beats": line_beats, "cache_policy": cache_policy,
            "cache_index": cache_index, "mshrs": mshrs, "pmtu": pmtu, "num_dest": num_dest,
            "num_qps": num_qps, "rx_addr_width": rx_addr_width,
        }
        self.num_dest = num_dest
        self.num_qps = num_qps
        self.tables = tables
        self.max_dim = max_dim
        self.rx_beats_width = self.depacketizer.beats_width
        self.beats_width = beats_width
        super().__init__({
            "desc": In(stream.Signature(self.gather.desc_layout)),
            "bags": In(stream.Signature(self.gather.item_layout)),
            "dest": In(stream.Signature(DestEntry(self.packetizer.dest_bits))),
            "local_mac": In(48),
            "local_ip": In(32),
            "cache_cmd": In(stream.Signature(CacheOp)),
            "qp_init": In(stream.Signature(QPInit(self.depacketizer.qp_bits))),
            "send": In(stream.Signature(SendDescriptor(self.packetizer.dest_bits))),
            "mem": Out(MemPortSignature(addr_width=addr_width, beats_width=beats_width,
                                        data_bytes=data_bytes)),
            "tx_frame": Out(stream.Signature(FrameBeat(data_bytes))),
            "rx_frame": In(stream.Signature(FrameBeat(data_bytes))),
            "rx_mem": Out(MemPortSignature(addr_width=rx_addr_width,
                                           beats_width=self.depacketizer.beats_width,
                                           data_bytes=data_bytes)),
            "completion": Out(stream.Signature(Completion(self.depacketizer.qp_bits))),
            "counters": Out(SmartNICCounters()),
            "cache_idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.gather = g = self.gather
        m.submodules.cache = c = self.cache
        m.submodules.packetizer = p = self.packetizer
        m.submodules.depacketizer = d = self.depacketizer

        # ---- configuration and data path -------------------------------------------------
        wiring.connect(m, wiring.flipped(self.desc), g.desc)
        wiring.connect(m, wiring.flipped(self.bags), g.bags)
        wiring.connect(m, g.mem, c.front)
        wiring.connect(m, c.back, wiring.flipped(self.mem))
        wiring.connect(m, wiring.flipped(self.cache_cmd), c.cmd)
        wiring.connect(m, wiring.flipped(self.dest), p.table)
        wiring.connect(m, wiring.flipped(self.send), p.desc)
        wiring.connect(m, p.frame, wiring.flipped(self.tx_frame))
        wiring.connect(m, wiring.flipped(self.rx_frame), d.frame)
        wiring.connect(m, wiring.flipped(self.qp_init), d.qp_init)
        wiring.connect(m, d.mem, wiring.flipped(self.rx_mem))
        wiring.connect(m, d.completion, wiring.flipped(self.completion))
        m.d.comb += [
            p.local_mac.eq(self.local_mac),
            p.local_ip.eq(self.local_ip),
            # pooled beats are payload beats (the lanes fill the beat exactly)
            p.payload.valid.eq(g.pooled.valid),
            p.payload.payload.eq(g.pooled.payload.data),
            g.pooled.ready.eq(p.payload.ready),
            self.cache_idle.eq(c.idle),
        ]

        # ---- counters ----------------------------------------------------------------------
        cnt = self.counters
        for name in COUNTER_NAMES:
            m.d.comb += getattr(cnt, f"gather_{name}").eq(getattr(g.counters, name))
        for name in CacheStats.FIELDS:
            m.d.comb += getattr(cnt, f"cache_{name}").eq(getattr(c.stats, name))
        for name in RxCounters().members:
            m.d.comb += getattr(cnt, f"rx_{name}").eq(getattr(d.counters, name))

        regs = {name: Signal(32, name=f"cnt_{name}") for name in _TOP_COUNTERS}
        for name, reg in regs.items():
            m.d.comb += getattr(cnt, name).eq(reg)
        cycle = regs["cycles"]
        m.d.sync += cycle.eq(cycle + 1)

        def fired(s):
            return s.valid & s.ready

        pooled_taken = fired(g.pooled)
        frame_taken = fired(p.frame)
        with m.If(frame_taken):
            m.d.sync += regs["tx_beats"].eq(regs["tx_beats"] + 1)
            with m.If(p.frame.payload.last):
                m.d.sync += regs["tx_frames"].eq(regs["tx_frames"] + 1)
        with m.If(pooled_taken):
            m.d.sync += regs["pooled_beats"].eq(regs["pooled_beats"] + 1)
            with m.If(g.pooled.payload.last & g.pooled.payload.error):
                m.d.sync += regs["pooled_error_bags"].eq(regs["pooled_error_bags"] + 1)
            with m.If(g.pooled.payload.last & g.pooled.payload.dropped):
                m.d.sync += regs["pooled_dropped_bags"].eq(regs["pooled_dropped_bags"] + 1)

        windows = {
            "gather": (fired(g.bags), pooled_taken),
            "cache": (fired(c.front.req), fired(c.front.resp)),
            "packetizer": (fired(p.desc), frame_taken),
            "depacketizer": (fired(d.frame), fired(d.mem.wdata)),
        }
        for unit, (start, event) in windows.items():
            first = Signal(32, name=f"{unit}_first")
            last = Signal(32, name=f"{unit}_last")
            seen = Signal(name=f"{unit}_seen")
            with m.If(start & ~seen):
                m.d.sync += [first.eq(cycle), seen.eq(1)]
            with m.If(event):
                m.d.sync += last.eq(cycle)
            m.d.comb += [getattr(cnt, f"{unit}_first").eq(first),
                         getattr(cnt, f"{unit}_last").eq(last)]
        return m
