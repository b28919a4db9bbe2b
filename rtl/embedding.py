"""The embedding gather/pool unit: table-batched EmbeddingBag forward as a streaming datapath.

:class:`EmbeddingBagUnit` reads embedding rows through a memory port (``rtl.streams``) and
pools them per bag (SUM, MEAN, MAX, optional per-sample weights), for several tables with
their own row counts, dimensions and element types, the way FBGEMM's table-batched embedding
(TBE) and ``torch.nn.EmbeddingBag`` do. It is the datapath a SmartNIC or an accelerator runs
next to its embedding memory; it sits on a cache controller's front port unchanged.

Interface
=========

``desc`` (in, stream of :class:`DescriptorLayout`) - the table-descriptor store's write port
    One write per table id: ``base`` (beat address of row 0), ``rows``, ``dim``,
    ``elem_type`` (0 fp32, 1 fp16, 2 bf16; see :data:`ELEM_TYPE_CODES`), ``pooling``
    (0 SUM, 1 MEAN, 2 MAX; :data:`POOLING_CODES`), ``pad_valid``/``pad_index`` (the padding
    index, if any). Always ready. A write takes effect for bags whose header is accepted on a
    later cycle (a bag latches its descriptor at its header). A descriptor with ``dim`` outside
    ``1..max_dim``, an element type this instance was not built for, or an unknown pooling code
    is stored as *invalid* (bags on that table become error bags), a table id
    ``>= tables`` is ignored; both count in ``counters.desc_rejected``.

``bags`` (in, stream of :class:`BagItemLayout`) - the combined lengths format
    Per bag, a header item (``header=1``: ``table``, ``length``, ``weighted``, ``tag``)
    followed by ``length`` index items (``header=0``: ``index`` and, for a weighted bag,
    its FP32 ``weight``). An index equal to the table's padding index is skipped; an index
    ``>= rows`` is dropped and counted (``counters.indices_dropped``), and the bag's output
    carries ``dropped=1``. Neither counts for MEAN. A bag on a table without a valid
    descriptor is consumed and answered with one zero beat flagged ``error``. Protocol slips
    never hang the unit: an index item where a header is expected is dropped; a header where
    an index is expected closes the current bag early (its beats carry the rows pooled so far
    and ``error``) and then starts its own bag; both count in ``counters.protocol_errors``.
    Lengths are limited to ``max_bag_length`` by the width of the ``length`` field.

``mem`` (out, :class:`rtl.streams.MemPortSignature`) - row reads
    One read request per contributing index: ``addr = base + index * stride``,
    ``beats = stride``, where ``stride = ceil(dim * elem_bytes / data_bytes)``: every row
    starts on a beat boundary and its last beat is padded (what the padding holds is ignored).
    At most ``outstanding`` rows are in flight (requested and not fully consumed), which hides
    a memory latency of about ``outstanding * stride`` cycles. Writes are never issued.

``pooled`` (out, stream of :class:`PooledBeatLayout`) - the results, in bag order
    Each bag produces ``ceil(dim / lanes)`` beats of ``lanes`` FP32 values (element
    ``k*lanes + i`` in lane ``i`` of beat ``k``; lanes past ``dim`` in the last beat are zero),
    tagged with the bag's ``tag``, ``first``/``last`` on its first and last beat, and the
    ``error``/``dropped`` flags (an error bag is one zero beat).

``counters`` (out, :class:`CountersLayout`) and ``busy`` (out)
    Free-running 32-bit event counters (reset with the unit): ``busy_cycles`` (cycles with any
    bag in the unit or waiting at its input), ``beats_read``, ``rows_requested``, ``bags_in``,
    ``bags_out``, stall cycles by cause - ``stall_memory`` (the reducer waits for row data),
    ``stall_hazard`` (a row's word waits for the same word's previous sum to leave the adder),
    ``stall_bank`` (a bag waits for an accumulator bank still being drained),
    ``stall_output`` (``pooled`` valid and not ready), ``stall_input`` (busy with no input
    offered) - and ``indices_dropped``, ``indices_padding``, ``desc_rejected``,
    ``protocol_errors``.

Numbers and reduction order
===========================

FP16 and BF16 rows are widened to FP32 (exact), then all arithmetic is IEEE-754 binary32 with
round to nearest even (``rtl.fp``), element by element in index order:

* SUM: ``acc = ((0 + v0) + v1) + ...``; ``v_i = r_i``, or ``v_i = w_i * r_i`` (one rounding)
  for a weighted bag. MEAN: that sum times ``RNE(1/count)`` (one more rounding), where
  ``count`` counts the contributing rows; the reciprocals come from a ROM. MAX: ``acc = r0``,
  then ``acc = r_i`` only where ``r_i > acc`` in IEEE order (ties, ``+0`` vs ``-0`` included,
  keep the earlier row); weights are not applied in MAX.
* NaN in MAX follows torch's CPU ``EmbeddingBag`` (its running maximum takes a row only where
  ``row > max``): a NaN in the first contributing row stays (nothing compares greater than
  NaN), a NaN in a later row is ignored. It is not ``torch.max`` over the rows, which would
  return NaN whenever any row holds one.
* Weighted sums round the product before adding it (two roundings per row). torch's CPU
  kernels and FBGEMM accumulate ``w_i * r_i`` with a fused multiply-add (one rounding), so a
  weighted bag may differ from them in the last bits; it is bit-exact to
  ``sim.reference.embedding.pool``, and both are within ``error_bound`` of the exact value.
  The unit does not claim bit-exactness with FBGEMM for weighted bags (a fused multiply-add
  per lane would cost a 48-bit-aligned adder in place of the rounded product).
* A bag without contributing rows gives zeros. Arithmetic NaN results are the canonical quiet
  NaN. ``sim.reference.embedding`` computes the same order in numpy (the bit-exact target).

Microarchitecture and timing
============================

Front (one input item per cycle): a header costs one cycle; each index costs one cycle and,
if it contributes, issues its read request (from an output register) and queues a row
entry for the reducer. A bag's last item also queues its bag entry for the drain. An empty
bag costs its header cycle and one reducer slot (an end-only entry); its zero beats come
from the drain without touching an accumulator, overlapped with the next bag's rows.

Reducer: consumes row data ``lanes`` elements ("a word") per cycle: a beat holds
``data_bytes / (4 * lanes)`` FP32 words or twice as many 16-bit words, so an FP32 beat takes
one cycle when ``lanes * 4 == data_bytes`` (the default) and a 16-bit beat two. Words pass a
widening register, the weight multipliers (``FPMul32``, ``mul_latency``, default 4) and then
the adders (``FPAdd32``, ``add_latency``, default 4) or the max selectors into one of two
accumulator banks (a bag's words live at addresses ``0 .. ceil(dim/lanes)-1`` of its bank;
one :class:`PoolLane` per lane). A word may enter the adder only after the previous row's
sum of the same word has been written back, so a row costs ``max(words, add_latency + 1)``
cycles: no stall for ``dim >= 5 * lanes`` with the default latencies. Bags alternate
between the two banks, so one bag accumulates while the previous one drains.

Drain: reads the finished bag's words, multiplies them by ``1/count`` for MEAN (another
``FPMul32``) and presents them on ``pooled``, one beat per cycle under backpressure.
:attr:`EmbeddingBagUnit.timing` gives the pipeline figures the timing model
(``sim.timing.embedding``) uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, exact_log2

from .fp import BF16ToFP32, FP16ToFP32, FPAdd32, FPMax32, FPMul32
from .streams import MemPortSignature, check_int

__all__ = [
    "ELEM_TYPE_CODES", "POOLING_CODES",
    "DescriptorLayout", "BagItemLayout", "PooledBeatLayout", "CountersLayout",
    "UnitTiming", "PoolLane", "EmbeddingBagUnit",
]

ELEM_TYPE_CODES = {"fp32": 0, "fp16": 1, "bf16": 2}
"""Element-type codes of a table descriptor."""
POOLING_CODES = {"sum": 0, "mean": 1, "max": 2}
"""Pooling-mode codes of a table descriptor."""

_FP32_ONE = 0x3F800000


class DescriptorLayout(data.StructLayout):
    """One table-descriptor write (see :class:`EmbeddingBagUnit`)."""

    def __init__(self, *, table_width: int, addr_width: int, index_width: int, dim_width: int):
        super().__init__({
            "table": unsigned(table_width),
            "base": unsigned(addr_width),
            "rows": unsigned(index_width),
            "dim": unsigned(dim_width),
            "elem_type": unsigned(2),
            "pooling": unsigned(2),
            "pad_valid": unsigned(1),
            "pad_index": unsigned(index_width),
        })


class BagItemLayout(data.StructLayout):
    """One item of the combined lengths format: a bag header or one index (with weight)."""

    def __init__(self, *, table_width: int, length_width: int, tag_width: int,
                 index_width: int):
        super().__init__({
            "header": unsigned(1),
            "body": data.UnionLayout({
                "bag": data.StructLayout({
                    "table": unsigned(table_width),
                    "length": unsigned(length_width),
                    "weighted": unsigned(1),
                    "tag": unsigned(tag_width),
                }),
                "item": data.StructLayout({
                    "index": unsigned(index_width),
                    "weight": unsigned(32),
                }),
            }),
        })


class PooledBeatLayout(data.StructLayout):
    """One beat of a pooled vector: ``lanes`` FP32 values (lane 0 at the least significant
    bits) and the bag's tag and flags."""

    def __init__(self, *, lanes: int, tag_width: int):
        super().__init__({
            "data": unsigned(32 * lanes),
            "tag": unsigned(tag_width),
            "first": unsigned(1),
            "last": unsigned(1),
            "error": unsigned(1),
            "dropped": unsigned(1),
        })


COUNTER_NAMES = (
    "busy_cycles", "beats_read", "rows_requested", "bags_in", "bags_out",
    "stall_memory", "stall_hazard", "stall_bank", "stall_output", "stall_input",
    "indices_dropped", "indices_padding", "desc_rejected", "protocol_errors",
)


class CountersLayout(data.StructLayout):
    """The unit's event counters, 32 bits each, in :data:`COUNTER_NAMES` order."""

    def __init__(self):
        super().__init__({name: unsigned(32) for name in COUNTER_NAMES})


@dataclass(frozen=True)
class UnitTiming:
    """Pipeline figures of one unit instance, for the timing model.

    ``words_per_beat``: FP32 words per memory beat (16-bit types: twice as many);
    ``add_latency``: cycles from a word entering the adder to its write-back, so a row costs
    at least ``add_latency + 1`` cycles; ``reduce_latency``: cycles from a beat's acceptance to
    its word entering the adder; ``drain_latency``: cycles from a drain read to the beat on
    ``pooled``; ``front_latency``: cycles from an index's acceptance to its request on ``mem``.
    """

    data_bytes: int
    lanes: int
    outstanding: int
    words_per_beat: int
    add_latency: int
    reduce_latency: int
    drain_latency: int
    front_latency: int
    bag_queue_depth: int
    info_depth: int


class PoolLane(wiring.Component):
    """One lane of the reducer's pooling arithmetic: ``latency`` cycles from operands to result.

    Ports: ``old`` (in, 32: the accumulator's word), ``v`` (in, 32: the row's value),
    ``first`` (in: the bag's first row, which starts from zero for SUM and from ``v`` for MAX),
    ``is_max`` (in: MAX pooling, given with the result: it selects which of the two results
    leaves, ``latency`` cycles after the operands); ``result`` (out, 32).

    SUM/MEAN: ``(0 if first else old) + v`` (:class:`rtl.fp.FPAdd32` with ``latency``
    registers). MAX: ``v if first else (v if v > old else old)``
    (:class:`rtl.fp.FPMax32` with ``nan="compare"``), delayed by the same ``latency`` so both
    results line up. Free running: one operation per cycle, no enable.
    """

    def __init__(self, *, latency: int):
        try:
            self.latency = check_int("latency", latency, minimum=1, maximum=FPAdd32.STEPS)
        except ValueError:
            self._MustUse__silence = True  # a refused design is not an unused one
            raise
        super().__init__({"old": In(32), "v": In(32), "first": In(1), "is_max": In(1),
                          "result": Out(32)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.add = add = FPAdd32(latency=self.latency)
        m.submodules.max = mx = FPMax32(latency=0, nan="compare")
        m.d.comb += [add.a.eq(Mux(self.first, 0, self.old)), add.b.eq(self.v),
                     mx.a.eq(self.old), mx.b.eq(self.v)]
        sel = Mux(self.first, self.v, mx.o)
        for k in range(self.latency):
            r = Signal(32, name=f"max_d{k}")
            m.d.sync += r.eq(sel)
            sel = r
        m.d.comb += self.result.eq(Mux(self.is_max, sel, add.o))
        return m


class EmbeddingBagUnit(wiring.Component):
    """Table-batched EmbeddingBag forward unit (see the module docstring for the full story).

    Parameters
    ----------
    data_bytes : bytes per memory beat (power of two, default 64).
    lanes : FP32 elements reduced per cycle (power of two, ``lanes * 4 <= data_bytes``).
    max_dim : largest table dimension supported (elements).
    tables : number of table descriptors.
    outstanding : row reads in flight at most (hides ``~outstanding * stride`` cycles).
    max_bag_length : largest bag length (sets the ``length`` field and the MEAN ROM).
    elem_types : element types to support, a subset of ``("fp32", "fp16", "bf16")``.
    addr_width, beats_width : memory port's beat-address and beat-count widths.
    index_width, tag_width : widths of an index and of a bag tag.
    bag_queue_depth : finished-at-input bags waiting for their output, at most.
    add_latency, mul_latency : pipeline registers of the FP32 adders (1..``FPAdd32.STEPS``)
        and multipliers (1..``FPMul32.STEPS``). The default 4 keeps a row's read-add-write
        hazard short (a row costs ``max(words, add_latency + 1)`` cycles); the full depths
        (9 and 10) close timing at a higher clock (``neonic bench timing``) but stall rows of
        fewer than ``add_latency + 1`` words per lane group.
    """

    def __init__(self, *, data_bytes: int = 64, lanes: int = 16, max_dim: int = 256,
                 tables: int = 8, outstanding: int = 32, max_bag_length: int = 1023,
                 elem_types: tuple[str, ...] = ("fp32", "fp16", "bf16"),
                 addr_width: int = 32, beats_width: int = 8, index_width: int = 32,
                 tag_width: int = 16, bag_queue_depth: int = 8, add_latency: int = 4,
                 mul_latency: int = 4):
        self.data_bytes = check_int("data_bytes", data_bytes, minimum=4, maximum=256,
                                    power_of_two=True)
        self.lanes = check_int("lanes", lanes, minimum=1, maximum=data_bytes // 4,
                               power_of_two=True)
        self.max_dim = check_int("max_dim", max_dim, minimum=1, maximum=4096)
        self.tables = check_int("tables", tables, minimum=1, maximum=1024)
        self.outstanding = check_int("outstanding", outstanding, minimum=1, maximum=1024)
        self.max_bag_length = check_int("max_bag_length", max_bag_length, minimum=1,
                                        maximum=4095)
        self.addr_width = check_int("addr_width", addr_width, minimum=8, maximum=64)
        self.beats_width = check_int("beats_width", beats_width, minimum=1, maximum=16)
        self.index_width = check_int("index_width", index_width, minimum=1, maximum=48)
        self.tag_width = check_int("tag_width", tag_width, minimum=1, maximum=32)
        self.bag_queue_depth = check_int("bag_queue_depth", bag_queue_depth, minimum=2,
                                         maximum=256)
        if isinstance(elem_types, str) or not isinstance(elem_types, (tuple, list)) \
                or not elem_types:
            raise ValueError(f"elem_types: expected a non-empty tuple of element types from "
                             f"{tuple(ELEM_TYPE_CODES)}, got {elem_types!r}")
        for et in elem_types:
            if et not in ELEM_TYPE_CODES:
                raise ValueError(f"elem_types: unknown element type {et!r}; expected one of "
                                 f"{tuple(ELEM_TYPE_CODES)}")
        self.elem_types = tuple(sorted(set(elem_types), key=ELEM_TYPE_CODES.get))
        max_stride = -(-self.max_dim * 4 // self.data_bytes)
        if max_stride > 2 ** self.beats_width - 1:
            raise ValueError(f"max_dim: a row of {self.max_dim} FP32 elements needs {max_stride} "
                             f"beats, more than beats_width={self.beats_width} can request")

        self.words_per_beat = self.data_bytes // (4 * self.lanes)
        self.max_words = -(-self.max_dim // self.lanes)
        self.table_width = max(1, bits_for(self.tables - 1))
        self.dim_width = bits_for(self.max_dim)
        self.length_width = bits_for(self.max_bag_length)
        self.word_width = max(1, bits_for(self.max_words - 1))

        self.add_latency = check_int("add_latency", add_latency, minimum=1,
                                     maximum=FPAdd32.STEPS)
        self.mul_latency = check_int("mul_latency", mul_latency, minimum=1,
                                     maximum=FPMul32.STEPS)
        self.drain_mul_latency = self.mul_latency
        self.info_depth = self.outstanding + 2

        self.desc_layout = DescriptorLayout(table_width=self.table_width,
                                            addr_width=self.addr_width,
                                            index_width=self.index_width,
                                            dim_width=self.dim_width)
        self.item_layout = BagItemLayout(table_width=self.table_width,
                                         length_width=self.length_width,
                                         tag_width=self.tag_width,
                                         index_width=self.index_width)
        self.pooled_layout = PooledBeatLayout(lanes=self.lanes, tag_width=self.tag_width)
        super().__init__({
            "desc": In(stream.Signature(self.desc_layout)),
            "bags": In(stream.Signature(self.item_layout)),
            "mem": Out(MemPortSignature(addr_width=self.addr_width,
                                        beats_width=self.beats_width,
                                        data_bytes=self.data_bytes)),
            "pooled": Out(stream.Signature(self.pooled_layout)),
            "counters": Out(CountersLayout()),
            "busy": Out(1),
        })

    @property
    def timing(self) -> UnitTiming:
        """The pipeline figures of this instance (see :class:`UnitTiming`)."""
        return UnitTiming(
            data_bytes=self.data_bytes, lanes=self.lanes, outstanding=self.outstanding,
            words_per_beat=self.words_per_beat, add_latency=self.add_latency,
            reduce_latency=1 + self.mul_latency, drain_latency=self.drain_mul_latency + 1,
            front_latency=1, bag_queue_depth=self.bag_queue_depth, info_depth=self.info_depth)

    # -- internal layouts ------------------------------------------------------------------

    def _stored_desc_layout(self):
        return data.StructLayout({
            "valid": unsigned(1),
            "base": unsigned(self.addr_width),
            "rows": unsigned(self.index_width),
            "elem_type": unsigned(2),
            "pooling": unsigned(2),
            "pad_valid": unsigned(1),
            "pad_index": unsigned(self.index_width),
            "stride": unsigned(self.beats_width),
            "words": unsigned(self.word_width + 1),
            "tail": unsigned(max(1, exact_log2(self.lanes))),
        })

    def _row_info_layout(self):
        # One entry per contributing row, or an end-only entry (has_row=0) closing a bag
        # whose last item did not contribute.
        return data.StructLayout({
            "has_row": unsigned(1),
            "end": unsigned(1),
            "first": unsigned(1),
            "weighted": unsigned(1),
            "weight": unsigned(32),
            "elem_type": unsigned(2),
            "is_max": unsigned(1),
            "words": unsigned(self.word_width + 1),
        })

    def _bag_info_layout(self):
        return data.StructLayout({
            "tag": unsigned(self.tag_width),
            "words": unsigned(self.word_width + 1),
            "tail": unsigned(max(1, exact_log2(self.lanes))),
            "mean": unsigned(1),
            "count": unsigned(self.length_width),
            "error": unsigned(1),
            "dropped": unsigned(1),
        })

    # -- elaboration ---------------------------------------------------------------------

    def elaborate(self, platform):
        m = Module()
        lanes = self.lanes
        db = self.data_bytes
        log_lanes = exact_log2(lanes)
        log_db = exact_log2(db)
        cnt = {name: Signal(32, name=f"cnt_{name}") for name in COUNTER_NAMES}
        for name, sig in cnt.items():
            m.d.comb += getattr(self.counters, name).eq(sig)

        # ---- descriptor store ----------------------------------------------------------
        sdesc = self._stored_desc_layout()
        m.submodules.desc_mem = desc_mem = memory.Memory(shape=sdesc, depth=self.tables,
                                                         init=[])
        desc_wr = desc_mem.write_port()
        desc_rd = desc_mem.read_port(domain="comb")
        d = self.desc.payload
        supported = Const(0, 1)
        for et in self.elem_types:
            supported = supported | (d.elem_type == ELEM_TYPE_CODES[et])
        desc_ok = (d.dim >= 1) & (d.dim <= self.max_dim) & supported & (d.pooling <= 2)
        in_range = d.table < self.tables
        dim_bytes_shift = Mux(d.elem_type == ELEM_TYPE_CODES["fp32"], 2, 1)
        m.d.comb += [
            self.desc.ready.eq(1),
            desc_wr.addr.eq(d.table),
            desc_wr.en.eq(self.desc.valid & in_range),
            desc_wr.data.valid.eq(desc_ok),
            desc_wr.data.base.eq(d.base),
            desc_wr.data.rows.eq(d.rows),
            desc_wr.data.elem_type.eq(d.elem_type),
            desc_wr.data.pooling.eq(d.pooling),
            desc_wr.data.pad_valid.eq(d.pad_valid),
            desc_wr.data.pad_index.eq(d.pad_index),
            desc_wr.data.stride.eq(((d.dim << dim_bytes_shift) + (db - 1)) >> log_db),
            desc_wr.data.words.eq((d.dim + (lanes - 1)) >> log_lanes),
            desc_wr.data.tail.eq(d.dim[:max(1, log_lanes)] if log_lanes else 0),
        ]
        with m.If(self.desc.valid & ~(in_range & desc_ok)):
            m.d.sync += cnt["desc_rejected"].eq(cnt["desc_rejected"] + 1)

        # ---- queues between the front, the reducer and the drain -----------------------
        rinfo = self._row_info_layout()
        binfo = self._bag_info_layout()
        m.submodules.info_q = info_q = fifo.SyncFIFOBuffered(width=rinfo.size,
                                                             depth=self.info_depth)
        m.submodules.bag_q = bag_q = fifo.SyncFIFOBuffered(width=binfo.size,
                                                           depth=self.bag_queue_depth)
        info_w = data.View(rinfo, info_q.w_data)
        bag_w = data.View(binfo, bag_q.w_data)

        # ---- front: parse items, issue row reads ---------------------------------------
        req = self.mem.req
        m.d.comb += self.mem.wdata.valid.eq(0)
        item = self.bags.payload
        hdr = item.body.bag
        idx = item.body.item
        m.d.comb += desc_rd.addr.eq(hdr.table)

        outstanding = Signal(range(self.outstanding + 1))
        row_done = Signal()          # the reducer finished consuming a row
        row_issued = Signal()
        m.d.sync += outstanding.eq(outstanding + row_issued - row_done)

        cur = Signal(sdesc)          # the current bag's descriptor
        c_tag = Signal(self.tag_width)
        c_weighted = Signal()
        c_error = Signal()
        c_dropped = Signal()
        remaining = Signal(self.length_width)
        count = Signal(self.length_width)

        req_free = ~req.valid | req.ready
        with m.If(req.ready):
            m.d.sync += req.valid.eq(0)

        hdr_valid_desc = desc_rd.data.valid & (hdr.table < self.tables)

        with m.FSM(name="front") as front_fsm:
            with m.State("HEADER"):
                with m.If(self.bags.valid & ~item.header):
                    # An index item outside a bag: drop it.
                    m.d.comb += self.bags.ready.eq(1)
                    m.d.sync += cnt["protocol_errors"].eq(cnt["protocol_errors"] + 1)
                with m.Elif(hdr.length == 0):
                    # Empty bag: one cycle, an end-only entry and its (zero) bag entry.
                    ok = info_q.w_rdy & bag_q.w_rdy
                    m.d.comb += self.bags.ready.eq(ok)
                    with m.If(self.bags.valid & ok):
                        m.d.comb += [
                            info_q.w_en.eq(1), info_w.has_row.eq(0), info_w.end.eq(1),
                            bag_q.w_en.eq(1), bag_w.tag.eq(hdr.tag), bag_w.count.eq(0),
                            bag_w.words.eq(Mux(hdr_valid_desc, desc_rd.data.words, 1)),
                            bag_w.tail.eq(desc_rd.data.tail),
                            bag_w.error.eq(~hdr_valid_desc),
                        ]
                        m.d.sync += cnt["bags_in"].eq(cnt["bags_in"] + 1)
                with m.Else():
                    m.d.comb += self.bags.ready.eq(1)
                    with m.If(self.bags.valid):
                        m.d.sync += [
                            cur.eq(desc_rd.data), c_tag.eq(hdr.tag),
                            c_weighted.eq(hdr.weighted), c_error.eq(~hdr_valid_desc),
                            c_dropped.eq(0), remaining.eq(hdr.length), count.eq(0),
                            cnt["bags_in"].eq(cnt["bags_in"] + 1),
                        ]
                        m.next = "ITEMS"
            with m.State("ITEMS"):
                early = item.header     # a header inside a bag closes it (protocol error)
                is_pad = cur.pad_valid & (idx.index == cur.pad_index)
                oob = idx.index >= cur.rows
                contributes = ~early & ~c_error & ~is_pad & ~oob
                last = early | (remaining == 1)
                need_req = contributes
                can = ((~need_req | (req_free & (outstanding < self.outstanding)))
                       & info_q.w_rdy & (~last | bag_q.w_rdy))
                m.d.comb += self.bags.ready.eq(can & ~early)
                with m.If(self.bags.valid & can):
                    with m.If(contributes):
                        m.d.comb += row_issued.eq(1)
                        m.d.sync += [
                            req.valid.eq(1),
                            req.payload.addr.eq(cur.base + idx.index * cur.stride),
                            req.payload.beats.eq(cur.stride),
                            req.payload.write.eq(0),
                            count.eq(count + 1),
                        ]
                    with m.If(~early & ~c_error & oob & ~is_pad):
                        m.d.sync += [c_dropped.eq(1),
                                     cnt["indices_dropped"].eq(cnt["indices_dropped"] + 1)]
                    with m.If(~early & ~c_error & is_pad):
                        m.d.sync += cnt["indices_padding"].eq(cnt["indices_padding"] + 1)
                    with m.If(early):
                        m.d.sync += cnt["protocol_errors"].eq(cnt["protocol_errors"] + 1)
                    m.d.comb += [
                        info_q.w_en.eq(contributes | last),
                        info_w.has_row.eq(contributes),
                        info_w.end.eq(last),
                        info_w.first.eq(count == 0),
                        info_w.weighted.eq(c_weighted),
                        info_w.weight.eq(idx.weight),
                        info_w.elem_type.eq(cur.elem_type),
                        info_w.is_max.eq(cur.pooling == POOLING_CODES["max"]),
                        info_w.words.eq(cur.words),
                    ]
                    with m.If(last):
                        final_count = count + contributes
                        m.d.comb += [
                            bag_q.w_en.eq(1),
                            bag_w.tag.eq(c_tag),
                            bag_w.words.eq(Mux(c_error, 1, cur.words)),
                            bag_w.tail.eq(cur.tail),
                            bag_w.mean.eq(cur.pooling == POOLING_CODES["mean"]),
                            bag_w.count.eq(Mux(c_error, 0, final_count)),
                            bag_w.error.eq(c_error | early),
                            bag_w.dropped.eq(c_dropped | (~early & ~c_error & oob & ~is_pad)),
                        ]
                        m.next = "HEADER"
                    with m.Else():
                        m.d.sync += remaining.eq(remaining - 1)

        with m.If(req.valid & req.ready):
            m.d.sync += cnt["rows_requested"].eq(cnt["rows_requested"] + 1)

        # ---- reducer input: split beats into words, widen ------------------------------
        head = data.View(rinfo, info_q.r_data)
        resp = self.mem.resp
        wpb = self.words_per_beat
        chunk = Signal(range(2 * wpb))
        word = Signal(self.word_width + 1)
        is16 = head.elem_type != ELEM_TYPE_CODES["fp32"]
        last_word = word == head.words - 1
        beat_done = last_word | (chunk == Mux(is16, 2 * wpb - 1, wpb - 1))
        en_f = Signal()              # the reducer's front segment advances
        take = Signal()
        m.d.comb += [
            take.eq(en_f & info_q.r_rdy & (~head.has_row | resp.valid)),
            resp.ready.eq(en_f & info_q.r_rdy & head.has_row & beat_done),
            info_q.r_en.eq(take & (~head.has_row | last_word)),
            row_done.eq(take & head.has_row & last_word),
        ]
        with m.If(take & head.has_row):
            m.d.sync += [word.eq(Mux(last_word, 0, word + 1)),
                         chunk.eq(Mux(beat_done, 0, chunk + 1))]
        with m.If(en_f & info_q.r_rdy & head.has_row & ~resp.valid):
            m.d.sync += cnt["stall_memory"].eq(cnt["stall_memory"] + 1)
        with m.If(resp.valid & resp.ready):
            m.d.sync += cnt["beats_read"].eq(cnt["beats_read"] + 1)

        # Bank of the row: bags with rows alternate between the two accumulator banks.
        last_bank = Signal(init=1)
        bank_in = Signal()
        m.d.comb += bank_in.eq(Mux(head.first & (word == 0), ~last_bank, last_bank))
        with m.If(take & head.has_row & head.first & (word == 0)):
            m.d.sync += last_bank.eq(~last_bank)

        beat = resp.payload.data
        widened = Signal(32 * lanes)
        w32 = beat.word_select(chunk[:max(1, exact_log2(wpb))] if wpb > 1 else 0, 32 * lanes)
        w16 = beat.word_select(chunk if 2 * wpb > 1 else 0, 16 * lanes)
        conv_lanes = []
        for i in range(lanes):
            h = w16[16 * i:16 * (i + 1)]
            choice = w32[32 * i:32 * (i + 1)]
            if "fp16" in self.elem_types:
                cv = FP16ToFP32(latency=0)
                m.submodules[f"fp16_{i}"] = cv
                m.d.comb += cv.a.eq(h)
                choice = Mux(head.elem_type == ELEM_TYPE_CODES["fp16"], cv.o, choice)
            if "bf16" in self.elem_types:
                cv = BF16ToFP32(latency=0)
                m.submodules[f"bf16_{i}"] = cv
                m.d.comb += cv.a.eq(h)
                choice = Mux(head.elem_type == ELEM_TYPE_CODES["bf16"], cv.o, choice)
            conv_lanes.append(choice)
        m.d.comb += widened.eq(Cat(*conv_lanes))

        # Stage 1 register (widened words + their row context), then the multipliers.
        ctx_layout = data.StructLayout({
            "valid": unsigned(1), "has_row": unsigned(1), "end": unsigned(1),
            "first": unsigned(1), "weighted": unsigned(1), "is_max": unsigned(1),
            "word": unsigned(self.word_width), "bank": unsigned(1),
        })
        s1_ctx = Signal(ctx_layout)
        s1_x = Signal(32 * lanes)
        s1_weight = Signal(32)
        with m.If(en_f):
            m.d.sync += [
                s1_ctx.valid.eq(take), s1_ctx.has_row.eq(head.has_row),
                s1_ctx.end.eq(head.end & (~head.has_row | last_word)),
                s1_ctx.first.eq(head.first), s1_ctx.weighted.eq(head.weighted),
                s1_ctx.is_max.eq(head.is_max), s1_ctx.word.eq(word[:self.word_width]),
                s1_ctx.bank.eq(bank_in),
                s1_x.eq(widened), s1_weight.eq(head.weight),
            ]

        # Multiplier stage: context and unweighted values delayed alongside.
        ml = self.mul_latency
        ctx_pipe = [s1_ctx]
        x_pipe = [s1_x]
        for k in range(ml):
            c = Signal(ctx_layout, name=f"mul_ctx{k}")
            x = Signal(32 * lanes, name=f"mul_x{k}")
            with m.If(en_f):
                m.d.sync += [c.eq(ctx_pipe[-1]), x.eq(x_pipe[-1])]
            ctx_pipe.append(c)
            x_pipe.append(x)
        ai = ctx_pipe[-1]            # the add-in stage
        ai_x = x_pipe[-1]
        ai_v = []
        for i in range(lanes):
            mul = FPMul32(latency=ml)
            m.submodules[f"wmul_{i}"] = mul
            m.d.comb += [mul.a.eq(s1_x[32 * i:32 * (i + 1)]), mul.b.eq(s1_weight),
                         mul.en.eq(en_f)]
            ai_v.append(Mux(ai.weighted & ~ai.is_max, mul.o, ai_x[32 * i:32 * (i + 1)]))

        # ---- accumulators: two banks of max_words words ---------------------------------
        m.submodules.acc = acc = memory.Memory(shape=32 * lanes, depth=2 << self.word_width,
                                               init=[])
        acc_rd = acc.read_port(domain="comb")
        acc_dr = acc.read_port(domain="comb")
        acc_wr = acc.write_port()
        ai_addr = Cat(ai.word, ai.bank)
        m.d.comb += acc_rd.addr.eq(ai_addr)

        al = self.add_latency
        inflight = []                # words in the adder, youngest first
        for k in range(al):
            inflight.append(Signal(data.StructLayout({
                "valid": unsigned(1), "has_row": unsigned(1), "end": unsigned(1),
                "is_max": unsigned(1), "addr": unsigned(self.word_width + 1)}),
                name=f"add_ctx{k}"))
        hazard = Const(0, 1)
        for st in inflight:
            hazard = hazard | (st.valid & st.has_row & (st.addr == ai_addr))
        hazard = ai.has_row & ~ai.first & hazard
        bank_busy = Signal(2)
        bank_wait = ai.has_row & ai.first & (ai.word == 0) & bank_busy.bit_select(ai.bank, 1)
        stall = ai.valid & (hazard | bank_wait)
        fire = ai.valid & ~stall
        m.d.comb += en_f.eq(~stall)
        with m.If(ai.valid & hazard):
            m.d.sync += cnt["stall_hazard"].eq(cnt["stall_hazard"] + 1)
        with m.Elif(ai.valid & bank_wait):
            m.d.sync += cnt["stall_bank"].eq(cnt["stall_bank"] + 1)

        m.d.sync += [
            inflight[0].valid.eq(fire), inflight[0].has_row.eq(ai.has_row),
            inflight[0].end.eq(ai.end), inflight[0].is_max.eq(ai.is_max),
            inflight[0].addr.eq(ai_addr),
        ]
        for k in range(1, al):
            m.d.sync += inflight[k].eq(inflight[k - 1])

        result_lanes = []
        for i in range(lanes):
            lane = m.submodules[f"pool_{i}"] = PoolLane(latency=al)
            m.d.comb += [lane.old.eq(acc_rd.data[32 * i:32 * (i + 1)]), lane.v.eq(ai_v[i]),
                         lane.first.eq(ai.first), lane.is_max.eq(inflight[-1].is_max)]
            result_lanes.append(lane.result)
        wb = inflight[-1]
        m.d.comb += [
            acc_wr.addr.eq(wb.addr),
            acc_wr.data.eq(Cat(*result_lanes)),
            acc_wr.en.eq(wb.valid & wb.has_row),
        ]

        # ---- drain: finished bags to `pooled` ------------------------------------------
        done_bags = Signal(range(self.bag_queue_depth + 2))
        bag_done = wb.valid & wb.end
        bhead = data.View(binfo, bag_q.r_data)
        pooled = self.pooled
        en_d = ~pooled.valid | pooled.ready
        dword = Signal(self.word_width + 1)
        d_last_bank = Signal(init=1)
        has_rows = bhead.count != 0
        d_bank = Mux(has_rows & (dword == 0), ~d_last_bank, d_last_bank)
        d_last = dword == bhead.words - 1
        issue = en_d & bag_q.r_rdy & (done_bags != 0)
        m.d.comb += [acc_dr.addr.eq(Cat(dword[:self.word_width], d_bank)),
                     bag_q.r_en.eq(issue & d_last)]
        m.d.sync += done_bags.eq(done_bags + bag_done - (issue & d_last))
        with m.If(issue):
            m.d.sync += dword.eq(Mux(d_last, 0, dword + 1))
            with m.If(has_rows & (dword == 0)):
                m.d.sync += d_last_bank.eq(~d_last_bank)

        # Accumulator banks: claimed by a bag's first word, freed by its last drain read.
        claim = fire & ai.has_row & ai.first & (ai.word == 0)
        free = issue & d_last & has_rows
        for b in range(2):
            with m.If(claim & (ai.bank == b)):
                m.d.sync += bank_busy[b].eq(1)
            with m.Elif(free & (d_bank == b)):
                m.d.sync += bank_busy[b].eq(0)

        # MEAN reciprocals: RNE(1/n) for n = 1 .. 2**length_width - 1.
        n = np.arange(1, 2 ** self.length_width, dtype=np.float32)
        recips = [0] + [int(v) for v in (np.float32(1) / n).view(np.uint32)]
        m.submodules.recip = recip = memory.Memory(shape=32, depth=len(recips), init=recips)
        recip_rd = recip.read_port(domain="comb")
        m.d.comb += recip_rd.addr.eq(bhead.count)

        dctx_layout = data.StructLayout({
            "valid": unsigned(1), "first": unsigned(1), "last": unsigned(1),
            "scale": unsigned(1), "tag": unsigned(self.tag_width), "error": unsigned(1),
            "dropped": unsigned(1), "mask": unsigned(lanes),
        })
        dctx = Signal(dctx_layout)
        lane_mask = Cat(*[(~d_last | (bhead.tail == 0) | (i < bhead.tail)) for i in range(lanes)])
        m.d.comb += [
            dctx.valid.eq(issue), dctx.first.eq(dword == 0), dctx.last.eq(d_last),
            dctx.scale.eq(bhead.mean & has_rows), dctx.tag.eq(bhead.tag),
            dctx.error.eq(bhead.error), dctx.dropped.eq(bhead.dropped),
            dctx.mask.eq(Mux(has_rows, lane_mask, 0)),
        ]
        dl = self.drain_mul_latency
        dctx_pipe, dx_pipe = [dctx], [acc_dr.data]
        for k in range(dl):
            c = Signal(dctx_layout, name=f"drain_ctx{k}")
            x = Signal(32 * lanes, name=f"drain_x{k}")
            with m.If(en_d):
                m.d.sync += [c.eq(dctx_pipe[-1]), x.eq(dx_pipe[-1])]
            dctx_pipe.append(c)
            dx_pipe.append(x)
        dend, dxend = dctx_pipe[-1], dx_pipe[-1]
        out_lanes = []
        for i in range(lanes):
            mul = FPMul32(latency=dl)
            m.submodules[f"dmul_{i}"] = mul
            m.d.comb += [mul.a.eq(acc_dr.data[32 * i:32 * (i + 1)]), mul.b.eq(recip_rd.data),
                         mul.en.eq(en_d)]
            v = Mux(dend.scale, mul.o, dxend[32 * i:32 * (i + 1)])
            out_lanes.append(Mux(dend.mask[i], v, 0))
        with m.If(en_d):
            m.d.sync += [
                pooled.valid.eq(dend.valid),
                pooled.payload.data.eq(Cat(*out_lanes)),
                pooled.payload.tag.eq(dend.tag),
                pooled.payload.first.eq(dend.first),
                pooled.payload.last.eq(dend.last),
                pooled.payload.error.eq(dend.error),
                pooled.payload.dropped.eq(dend.dropped),
            ]
        with m.If(pooled.valid & pooled.ready & pooled.payload.last):
            m.d.sync += cnt["bags_out"].eq(cnt["bags_out"] + 1)
        with m.If(pooled.valid & ~pooled.ready):
            m.d.sync += cnt["stall_output"].eq(cnt["stall_output"] + 1)

        # ---- busy and input starvation --------------------------------------------------
        in_flight = req.valid | (info_q.w_level != 0) | (bag_q.w_level != 0) | pooled.valid
        for c in [*ctx_pipe, *inflight, *dctx_pipe[1:]]:
            in_flight = in_flight | c.valid
        busy = Signal()
        m.d.comb += busy.eq(self.bags.valid | front_fsm.ongoing("ITEMS") | in_flight)
        m.d.comb += self.busy.eq(busy)
        with m.If(busy):
            m.d.sync += cnt["busy_cycles"].eq(cnt["busy_cycles"] + 1)
            with m.If(~self.bags.valid):
                m.d.sync += cnt["stall_input"].eq(cnt["stall_input"] + 1)
        return m
