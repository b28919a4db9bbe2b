"""The AlltoAll packetizer: RDMA WRITE messages out as RoCEv2 frames.

Interface
=========

``table`` (in stream, :class:`DestEntry`)
    The host writes one row of the per-destination table: MAC, IPv4 address, destination QP,
    UDP source port, and the next PSN of that QP. Accepted only between messages.
``local_mac``, ``local_ip`` (in)
    This NIC's addresses (Ethernet source, IPv4 source).
``desc`` (in stream, :class:`SendDescriptor`)
    One RDMA WRITE: destination row ``dest``, remote virtual address ``va``, remote key
    ``rkey``, ``length`` in bytes of the FP32 payload as it arrives on ``payload``, and an
    immediate ``imm`` sent when ``has_imm`` is set (batch and chunk ids, say).
``payload`` (in stream, ``8 * data_bytes`` bits)
    The message's payload bytes, byte ``i`` of a beat in bits ``8i..8i+7``; exactly
    ``ceil(length / data_bytes)`` beats per descriptor, in descriptor order (bytes past
    ``length`` in the last beat are ignored).
``frame`` (out stream, :class:`rtl.roce.FrameBeat`)
    Ethernet/IPv4/UDP/BTH(/RETH)(/ImmDt)/payload/ICRC frames (no FCS), ``count`` valid bytes
    on the last beat of each frame.

Behaviour
=========

A message is cut at the path MTU ``pmtu`` into WRITE ONLY, or FIRST, MIDDLE..., LAST (WITH
IMMEDIATE when ``has_imm``); the RETH (address, key, whole DMA length) rides on FIRST/ONLY,
the immediate on LAST/ONLY. PSNs count per destination, modulo 2**24, continuing from the
table's value; AckReq is set on the last packet of each message. The payload is padded to a
multiple of 4 bytes (BTH pad count). Constant fields are those of :mod:`rtl.roce`.

Timing: the descriptor's destination row is read the cycle after the descriptor is taken, from
a registered one-hot select into registers of its own. Each packet's plan is then computed in
three register stages ahead of the frame generator while the previous frame streams (A: the cut
of the message, opcode and every length, each one adder from the message registers; B: the IP
checksum's terms; C: its fold), so the header the generator loads at a frame's last beat is
already registered. A message's first frame beat shows nine cycles after its descriptor is
taken; back-to-back packets keep one frame beat a cycle (65 cycles per 4096 B packet at 64 B).

With ``quant="fp16"`` or ``"bf16"`` each FP32 element is rounded to nearest even by
:mod:`rtl.fp` converters on the fly; the wire carries ``length / 2`` bytes (``length`` a
multiple of 4; the last half beat of a message is flushed, so any length works).

With ``quant="int8"`` the payload is quantized row by row (rows of the descriptor's ``dim``
elements, :func:`rtl.fp.int8_rowwise_formula` with :mod:`rtl.fp` components): per row
``scale`` and ``bias`` (FP32) and ``dim`` codes, whole rows per packet with zero fill (the
wire image of :mod:`sim.reference.roce`). The host keeps ``dim`` a multiple of
``data_bytes / 4`` and at most ``max_dim``, and ``length`` a multiple of ``4 * dim``: the unit
does not check them. The RETH carries the wire length; the receiver must be told the format
(its per-QP table, :class:`rtl.depacketizer.QPInit`). The wire length is computed with
integer division when the descriptor is taken (combinational here; a synthesis build would
iterate it). Rows are pipelined through four slots of a row buffer (take in and min/max,
range, the two divisions of :class:`rtl.fp.FPDiv32` side by side, codes out), so at ``dim =
128`` and 64 bytes per beat a row costs its 8 input beats and a 4096-byte INT8 packet (30
rows) about 241 cycles, the input rate (see ``neonic bench packetizer``).
``div_bits_per_cycle`` (1..27, default 9) sets the dividers' quotient bits a cycle and so
their latency, ``ceil(27 / div_bits_per_cycle) + 2`` cycles (5 by default), which bounds a
row from below: rows of fewer beats than that latency go at the dividers' pace. The trade-off
is the clock: each quotient bit is a 25-bit compare-and-subtract in series, so 9 a cycle is a
long chain (27, latency 3, longer still) and a build that must close timing at 250 MHz may
choose 3 or 4 (latency 11 or 9) and accept ``max(4 * dim / data_bytes, latency)`` cycles a
row. The quantizer's other arithmetic is combinational within a cycle (``latency=0``
instances).

Remaining limits: the immediate goes only with the last packet; ``va`` is any 64-bit value
(the receiver requires beat alignment).

Timing
======

The frame is assembled as it is sent: the header (computed while the previous frame is still
going out) shifts out of a register a beat at a time, overlaid on the payload beats shifted by
the header length; which bytes are header, payload or zero and whether a beat takes a payload
beat are registered flags stepped at each beat (no beat counter is compared with lengths).
The ICRC is computed (:class:`rtl.roce.ICRCEngine` in three stages, the CRC of
``amaranth.lib.crc``'s Algorithm) on a copy of each beat rotated so that the covered bytes end
on a beat boundary (leading zeros are free because the CRC register starts at zero after the
first four 0xFF bytes of the pseudo-header). Three register stages follow the generator (``r``,
``r2``, then ``o``, where the ICRC is overlaid; the engine's stages move with them, so its
register holds the frame's CRC while the beat that carries it is in ``o``), and a skid register takes
``o``'s beat when ``frame`` is not ready, so that ``frame.ready`` reaches no stage's move in the
same cycle (the generator's advance starts from flip-flops only; the skid adds no latency).
The wide data registers (the destination table, the message, row and plan registers, the
header shift registers, the output beats) have no reset: what they hold matters only under a
valid flag or state that does, and the reset net no longer reaches thousands of flip-flops
(it reached 6,214 cell inputs, the design's largest net after the clock).
Frames leave back to back,
one beat per cycle, while ``payload`` keeps up and ``frame`` is ready: a packet of ``F`` frame
bytes takes ``ceil(F / data_bytes)`` cycles (65 for a 4096-byte MIDDLE or LAST at 64 bytes per
beat). The plan passes a packet on at most every two cycles, so one-beat frames (payloads of up
to 6 bytes at 64 bytes per beat) go every other cycle.
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from .roce import (BASE_HEADER_LEN, BTH_PKEY, ETH_LEN, ETHERTYPE_IPV4, FrameBeat,
                   HLEN_BY_HTYPE, ICRC_LEN, ICRCEngine, IP_FLAGS_DF, IP_LEN, IP_TTL,
                   MAX_HEADER_LEN, OP_WRITE_FIRST, OP_WRITE_LAST, OP_WRITE_LAST_IMM,
                   OP_WRITE_MIDDLE, OP_WRITE_ONLY, OP_WRITE_ONLY_IMM, ROCE_UDP_PORT,
                   check_data_bytes, check_pmtu)
from .streams import check_int

__all__ = ["SendDescriptor", "DestEntry", "Packetizer", "QUANT_FORMATS"]

QUANT_FORMATS = ("none", "fp16", "bf16", "int8")

_HLEN = HLEN_BY_HTYPE

class SendDescriptor(data.StructLayout):
    """One RDMA WRITE to send (see :class:`Packetizer`)."""

    def __init__(self, dest_bits: int):
        super().__init__({
            "dest": unsigned(dest_bits), "va": unsigned(64), "rkey": unsigned(32),
            "length": unsigned(32), "imm": unsigned(32), "has_imm": unsigned(1),
            "dim": unsigned(16),
        })


class DestEntry(data.StructLayout):
    """A write of row ``index`` of the destination table."""

    def __init__(self, dest_bits: int):
        super().__init__({
            "index": unsigned(dest_bits), "mac": unsigned(48), "ip": unsigned(32),
            "qpn": unsigned(24), "udp_sport": unsigned(16), "psn": unsigned(24),
        })


def _be(value, nbytes: int) -> list:
    """Bytes of ``value`` most significant first (network order)."""
    return [value[8 * (nbytes - 1 - k): 8 * (nbytes - k)] for k in range(nbytes)]


def _c(value: int, nbytes: int) -> list:
    return [Const((value >> (8 * (nbytes - 1 - k))) & 0xFF, 8) for k in range(nbytes)]


class _Chunk(data.StructLayout):
    """``n`` bytes (in the low bytes of ``data``, zero above) for :class:`_ByteGearbox`;
    ``flush`` ends a message: its last beat goes out even if partly filled."""

    def __init__(self, data_bytes: int):
        super().__init__({"data": unsigned(8 * data_bytes), "n": range(data_bytes + 1),
                          "flush": unsigned(1)})


class _ByteGearbox(wiring.Component):
    """Packs chunks of 0..``data_bytes`` bytes into full beats (the last beat of a message
    partly filled). Chunk sizes and so the fill level are multiples of ``gran`` bytes. One
    chunk per cycle; a flushed chunk that overflows a beat costs one more cycle."""

    def __init__(self, data_bytes: int, gran: int):
        self._w, self._g = data_bytes, gran
        super().__init__({"i": In(stream.Signature(_Chunk(data_bytes))),
                          "o": Out(stream.Signature(unsigned(8 * data_bytes)))})

    def elaborate(self, platform):
        m = Module()
        W, g = self._w, self._g
        acc = Signal(8 * W)                 # bytes 0..fill-1 valid, zero above
        fill = Signal(range(W + 1))
        flush_pend = Signal()
        o_valid, o_data = Signal(), Signal(8 * W)
        m.d.comb += [self.o.valid.eq(o_valid), self.o.payload.eq(o_data)]
        can_out = ~o_valid | self.o.ready
        m.d.comb += self.i.ready.eq(can_out & ~flush_pend)
        c = self.i.payload
        cat = Signal(16 * W)
        with m.Switch(fill):
            for k in range(0, W, g):
                with m.Case(k):
                    m.d.comb += cat.eq(acc | (c.data << (8 * k)))
        total = Signal(range(2 * W + 1))
        m.d.comb += total.eq(fill + c.n)
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += o_valid.eq(0)
        with m.If(flush_pend):
            with m.If(can_out):
                m.d.sync += [o_data.eq(acc), o_valid.eq(1), acc.eq(0), fill.eq(0),
                             flush_pend.eq(0)]
        with m.Elif(self.i.valid & self.i.ready):
            with m.If(total >= W):
                m.d.sync += [o_data.eq(cat[:8 * W]), o_valid.eq(1)]
                with m.If(c.flush & (total == W)):
                    m.d.sync += [acc.eq(0), fill.eq(0)]
                with m.Else():
                    m.d.sync += [acc.eq(cat[8 * W:]), fill.eq(total - W), flush_pend.eq(c.flush)]
            with m.Elif(c.flush & (total != 0)):
                m.d.sync += [o_data.eq(cat[:8 * W]), o_valid.eq(1), acc.eq(0), fill.eq(0)]
            with m.Else():
                m.d.sync += [acc.eq(cat[:8 * W]), fill.eq(total)]
        return m


class _QuantCommand(data.StructLayout):
    """What the payload transform needs of a message: FP32 input ``beats``; INT8 ``rows``
    of ``dim`` elements."""

    def __init__(self):
        super().__init__({"beats": unsigned(32), "rows": unsigned(32), "dim": unsigned(16)})


class _FP32Narrow(wiring.Component):
    """FP32 beats in, FP16/BF16 chunks (half a beat each) out, flushed at message ends."""

    def __init__(self, data_bytes: int, quant: str):
        self._w = data_bytes
        self._quant = quant
        super().__init__({
            "cmd": In(stream.Signature(_QuantCommand())),
            "i": In(stream.Signature(unsigned(8 * data_bytes))),
            "o": Out(stream.Signature(_Chunk(data_bytes))),
        })

    def elaborate(self, platform):
        from .fp import FP32ToBF16, FP32ToFP16
        m = Module()
        w = self._w
        conv = FP32ToFP16 if self._quant == "fp16" else FP32ToBF16
        half = Signal(8 * w // 2)
        for k in range(w // 4):
            m.submodules[f"conv{k}"] = c = conv(latency=0)
            m.d.comb += [c.a.eq(self.i.payload[32 * k: 32 * k + 32]),
                         half[16 * k: 16 * k + 16].eq(c.o)]
        busy = Signal()
        left = Signal(32)
        m.d.comb += self.cmd.ready.eq(~busy)
        with m.If(self.cmd.valid & self.cmd.ready):
            m.d.sync += [busy.eq(self.cmd.payload.beats != 0), left.eq(self.cmd.payload.beats)]
        m.d.comb += [
            self.o.valid.eq(busy & self.i.valid), self.i.ready.eq(busy & self.o.ready),
            self.o.payload.data.eq(half), self.o.payload.n.eq(w // 2),
            self.o.payload.flush.eq(left == 1),
        ]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += left.eq(left - 1)
            with m.If(left == 1):
                m.d.sync += busy.eq(0)
        return m


#: 255.0 in binary32.
_FP32_255 = 0x437F0000


class _Int8Quantizer(wiring.Component):
    """INT8 row-wise quantization of FP32 rows (:func:`rtl.fp.int8_rowwise_formula`).

    Rows move through four slots of a row buffer in order, each stage working on a different
    row at the same time:

    1. *ingest*: a row is taken in, ``data_bytes / 4`` elements a cycle, written to its slot,
       with ``min`` and ``max`` folded in as it arrives (``dim / L`` cycles, ``L =
       data_bytes / 4``);
    2. *range*: the cycle after, ``range = fl(max - min)`` is registered with the slot;
    3. *divide*: two :class:`rtl.fp.FPDiv32` side by side compute ``scale = fl(range / 255)``
       and ``inv = fl(255 / range)`` (0 when ``range`` is 0); a new pair is launched on the
       cycle the previous results are taken, so the dividers finish a row every
       ``FPDiv32.latency`` cycles (``ceil(27 / div_bits_per_cycle) + 2``);
    4. *emit*: ``scale`` and ``bias`` (8 bytes) and the codes, ``L`` a cycle, computed from
       the buffered row with ``inv`` (the header shares the first codes' chunk when ``8 + L <=
       data_bytes``, otherwise it takes a cycle of its own), then the zero fill that closes a
       packet-sized block of whole rows (see :mod:`sim.reference.roce`).

    A row therefore costs ``max(dim / L, divider latency, dim / L + header cycle)`` cycles in
    the steady state, plus ``ceil(fill / data_bytes)`` cycles once per packet: input-bound
    whenever the row is at least as many beats as the divider's latency.
    """

    SLOTS = 4

    def __init__(self, data_bytes: int, pmtu: int, max_dim: int, div_bits_per_cycle: int):
        self._w, self._pmtu, self._max_dim = data_bytes, pmtu, max_dim
        self._div_bits = div_bits_per_cycle
        super().__init__({
            "cmd": In(stream.Signature(_QuantCommand())),
            "i": In(stream.Signature(unsigned(8 * data_bytes))),
            "o": Out(stream.Signature(_Chunk(data_bytes))),
        })

    def elaborate(self, platform):
        from amaranth.lib.memory import Memory
        from .fp import FP32ToInt, FPDiv32, FPMax32, FPMin32, FPMul32, FPSub32
        m = Module()
        W, pmtu = self._w, self._pmtu
        L = W // 4
        LL = L.bit_length() - 1
        N = self.SLOTS
        SB = N.bit_length() - 1                 # slot index bits; pointers carry one more
        ib_bits = max(1, (self._max_dim // L - 1).bit_length())
        m.submodules.rowbuf = rowbuf = Memory(shape=8 * W, depth=N << ib_bits, init=[])
        wr = rowbuf.write_port()
        rd = rowbuf.read_port()

        def slots(name, shape):
            return Array(Signal(shape, name=f"{name}{i}") for i in range(N))
        s_lo, s_hi, s_rng = slots("s_lo", 32), slots("s_hi", 32), slots("s_rng", 32)
        s_scale, s_inv = slots("s_scale", 32), slots("s_inv", 32)
        s_last, s_rbeats = slots("s_last", 1), slots("s_rbeats", 16)
        s_fill = slots("s_fill", range(pmtu + 1))
        # Ring pointers (SB + 1 bits): rows [rs, ds) are divided, [ds, rg) ranged,
        # [rg, ws) ingested; slot ws is being filled.
        ws, rg, dl, ds, rs = (Signal(SB + 1, name=n) for n in ("ws", "rg", "dl", "ds", "rs"))

        # ---- ingest: rows into the slots, min and max on the way ---------------------------
        busy = Signal()
        rows_left = Signal(32)
        dim = Signal(16)
        rbeats = Signal(16)
        per = Signal(range(pmtu + 1))
        blk = Signal(range(pmtu + 1))
        ib = Signal(ib_bits)
        run_lo, run_hi = Signal(32), Signal(32)

        m.d.comb += self.cmd.ready.eq(~busy)
        with m.If(self.cmd.valid & self.cmd.ready):
            c = self.cmd.payload
            m.d.sync += [busy.eq(c.rows != 0), rows_left.eq(c.rows), dim.eq(c.dim),
                         rbeats.eq(c.dim >> LL), per.eq(pmtu // (c.dim + 8)), blk.eq(0),
                         ib.eq(0)]

        def tree(values, cls, name):
            level = 0
            while len(values) > 1:
                nxt = []
                for k in range(0, len(values), 2):
                    u = m.submodules[f"{name}{level}_{k}"] = cls(latency=0)
                    m.d.comb += [u.a.eq(values[k]), u.b.eq(values[k + 1])]
                    nxt.append(u.o)
                values, level = nxt, level + 1
            return values[0]

        lanes = [self.i.payload[32 * k: 32 * k + 32] for k in range(L)]
        beat_lo, beat_hi = tree(lanes, FPMin32, "min"), tree(lanes, FPMax32, "max")
        m.submodules.run_min = run_min = FPMin32(latency=0)
        m.submodules.run_max = run_max = FPMax32(latency=0)
        new_lo, new_hi = Signal(32), Signal(32)
        m.d.comb += [run_min.a.eq(run_lo), run_min.b.eq(beat_lo),
                     run_max.a.eq(run_hi), run_max.b.eq(beat_hi),
                     new_lo.eq(Mux(ib == 0, beat_lo, run_min.o)),
                     new_hi.eq(Mux(ib == 0, beat_hi, run_max.o))]
        ring_full = (ws[:SB] == rs[:SB]) & (ws[SB] != rs[SB])
        take = busy & ~ring_full
        wslot = ws[:SB]
        m.d.comb += [self.i.ready.eq(take), wr.addr.eq(Cat(ib, wslot)),
                     wr.data.eq(self.i.payload), wr.en.eq(self.i.valid & take)]
        row_end = ib == rbeats - 1
        with m.If(self.i.valid & take):
            m.d.sync += [run_lo.eq(new_lo), run_hi.eq(new_hi), ib.eq(ib + 1)]
            with m.If(row_end):
                last = rows_left == 1
                m.d.sync += [
                    s_lo[wslot].eq(new_lo), s_hi[wslot].eq(new_hi), s_last[wslot].eq(last),
                    s_rbeats[wslot].eq(rbeats),
                    s_fill[wslot].eq(Mux((blk == per - 1) & ~last, pmtu - per * (dim + 8), 0)),
                    ws.eq(ws + 1), ib.eq(0),
                    rows_left.eq(rows_left - 1), blk.eq(Mux(blk == per - 1, 0, blk + 1)),
                ]
                with m.If(last):
                    m.d.sync += busy.eq(0)

        # ---- range: one row a cycle, registered with its slot ------------------------------
        m.submodules.range_sub = range_sub = FPSub32(latency=0)
        m.d.comb += [range_sub.a.eq(s_hi[rg[:SB]]), range_sub.b.eq(s_lo[rg[:SB]])]
        with m.If(rg != ws):
            m.d.sync += [s_rng[rg[:SB]].eq(range_sub.o), rg.eq(rg + 1)]

        # ---- divide: scale and inv, one pair in flight, the next launched as it lands ------
        m.submodules.div_scale = div_s = FPDiv32(bits_per_cycle=self._div_bits)
        m.submodules.div_inv = div_i = FPDiv32(bits_per_cycle=self._div_bits)
        rng_l = s_rng[dl[:SB]]
        m.d.comb += [div_s.i.payload.a.eq(rng_l), div_s.i.payload.b.eq(_FP32_255),
                     div_i.i.payload.a.eq(_FP32_255), div_i.i.payload.b.eq(rng_l)]
        done = div_s.o.valid & div_i.o.valid
        m.d.comb += [div_s.o.ready.eq(done), div_i.o.ready.eq(done)]
        launch = (dl != rg) & ((dl == ds) | done)
        m.d.comb += [div_s.i.valid.eq(launch), div_i.i.valid.eq(launch)]
        with m.If(launch & div_s.i.ready & div_i.i.ready):
            m.d.sync += dl.eq(dl + 1)
        with m.If(done):
            dslot = ds[:SB]
            m.d.sync += [s_scale[dslot].eq(div_s.o.payload),
                         s_inv[dslot].eq(Mux(s_rng[dslot][:31] == 0, 0, div_i.o.payload)),
                         ds.eq(ds + 1)]

        # ---- emit: scale and bias, codes, fill ---------------------------------------------
        # The row on the output: its slot's registers copied a cycle ahead (``e_*``), so the
        # codes' arithmetic starts from flip-flops; a divided row is visible to this stage a
        # cycle after ``ds`` passes it (``ds_q``), once its ``scale`` and ``inv`` are in.
        ds_q = Signal(SB + 1)
        m.d.sync += ds_q.eq(ds)
        lo, scale, inv = Signal(32), Signal(32), Signal(32)
        e_last, e_rbeats = Signal(), Signal(16)
        e_fill = Signal(range(pmtu + 1))
        codes = Signal(8 * L)
        for k in range(L):
            sub = m.submodules[f"q_sub{k}"] = FPSub32(latency=0)
            mul = m.submodules[f"q_mul{k}"] = FPMul32(latency=0)
            cvt = m.submodules[f"q_int{k}"] = FP32ToInt(width=8, signed=False, latency=0)
            m.d.comb += [sub.a.eq(rd.data[32 * k: 32 * k + 32]), sub.b.eq(lo),
                         mul.a.eq(sub.o), mul.b.eq(inv), cvt.a.eq(mul.o),
                         codes[8 * k: 8 * k + 8].eq(cvt.o)]
        merged = 8 + L <= W            # the header rides with the first codes
        k_beat = Signal(ib_bits)       # codes beat of row rs on the output now
        hdr_sent = Signal()            # (not merged) the header of row rs has gone
        in_fill = Signal()
        fill_left = Signal(range(pmtu + 1))
        k_next, rs_next = Signal(ib_bits), Signal(SB + 1)
        m.d.comb += [k_next.eq(k_beat), rs_next.eq(rs)]
        out = self.o
        last_beat = k_beat == e_rbeats - 1
        with m.If(in_fill):
            n = Mux(fill_left > W, W, fill_left)
            m.d.comb += [out.valid.eq(1), out.payload.n.eq(n)]
            with m.If(out.ready):
                m.d.sync += fill_left.eq(fill_left - n)
                with m.If(fill_left <= W):
                    m.d.sync += in_fill.eq(0)
        with m.Elif(rs != ds_q):
            codes_now = Signal()
            if merged:
                first = k_beat == 0
                m.d.comb += [codes_now.eq(1),
                             out.payload.data.eq(Mux(first, Cat(scale, lo, codes), codes)),
                             out.payload.n.eq(Mux(first, 8 + L, L))]
            else:
                m.d.comb += [codes_now.eq(hdr_sent),
                             out.payload.data.eq(Mux(hdr_sent, codes, Cat(scale, lo))),
                             out.payload.n.eq(Mux(hdr_sent, L, 8))]
                with m.If(out.ready & ~hdr_sent):
                    m.d.sync += hdr_sent.eq(1)
            m.d.comb += [out.valid.eq(1),
                         out.payload.flush.eq(codes_now & last_beat & e_last)]
            with m.If(out.ready & codes_now):
                with m.If(last_beat):
                    m.d.comb += [k_next.eq(0), rs_next.eq(rs + 1)]
                    m.d.sync += hdr_sent.eq(0)
                    with m.If(e_fill != 0):
                        m.d.sync += [in_fill.eq(1), fill_left.eq(e_fill)]
                with m.Else():
                    m.d.comb += k_next.eq(k_beat + 1)
        nslot = rs_next[:SB]
        m.d.sync += [k_beat.eq(k_next), rs.eq(rs_next), lo.eq(s_lo[nslot]),
                     scale.eq(s_scale[nslot]), inv.eq(s_inv[nslot]), e_last.eq(s_last[nslot]),
                     e_rbeats.eq(s_rbeats[nslot]), e_fill.eq(s_fill[nslot])]
        # The row buffer reads what the output shows on the next cycle.
        m.d.comb += rd.addr.eq(Cat(k_next, rs_next[:SB]))
        return m


class Packetizer(wiring.Component):
    """RDMA WRITE messages to RoCEv2 frames (see the module docstring).

    Parameters
    ----------
    data_bytes : bytes per beat of ``payload`` and ``frame``: 8, 16, 32 or 64.
    pmtu : path MTU (payload bytes per packet): 256..4096, a power of two.
    num_dest : rows of the destination table (1..256).
    quant : ``"none"``, ``"fp16"``, ``"bf16"`` or ``"int8"``: the wire format of the FP32
        payload.
    max_dim : (INT8) the longest row, a multiple of ``data_bytes / 4``; sizes the row buffer.
    div_bits_per_cycle : (INT8) quotient bits a cycle of the two dividers, 1..27 (see the
        module docstring for the latency/clock trade-off).
    """

    def __init__(self, *, data_bytes: int = 64, pmtu: int = 4096, num_dest: int = 16,
                 quant: str = "none", max_dim: int | None = None,
                 div_bits_per_cycle: int = 9):
        self.data_bytes = check_data_bytes(data_bytes)
        self.pmtu = check_pmtu(pmtu)
        self.num_dest = check_int("num_dest", num_dest, minimum=1, maximum=256)
        if quant not in QUANT_FORMATS:
            raise ValueError(f"quant: expected one of {', '.join(QUANT_FORMATS)}, got {quant!r}")
        self.quant = quant
        lanes = data_bytes // 4
        if max_dim is None:
            max_dim = min(512, (pmtu - 8) // lanes * lanes)
        self.max_dim = check_int("max_dim", max_dim, minimum=lanes, maximum=pmtu - 8)
        if max_dim % lanes:
            raise ValueError(f"max_dim: expected a multiple of data_bytes / 4 = {lanes} "
                             f"(whole FP32 beats per row), got {max_dim}")
        self.div_bits_per_cycle = check_int("div_bits_per_cycle", div_bits_per_cycle, minimum=1,
                                            maximum=27)
        self.dest_bits = max(1, (num_dest - 1).bit_length())
        super().__init__({
            "table": In(stream.Signature(DestEntry(self.dest_bits))),
            "local_mac": In(48),
            "local_ip": In(32),
            "desc": In(stream.Signature(SendDescriptor(self.dest_bits))),
            "payload": In(stream.Signature(unsigned(8 * data_bytes))),
            "frame": Out(stream.Signature(FrameBeat(data_bytes))),
        })

    def elaborate(self, platform):
        m = Module()
        W = self.data_bytes
        pmtu = self.pmtu

        # ---- payload source (optionally quantized on the fly) --------------------------------
        cmd_fifo = None
        if self.quant == "none":
            pl = self.payload
        else:
            from math import gcd
            if self.quant == "int8":
                m.submodules.quant = q = _Int8Quantizer(W, pmtu, self.max_dim,
                                                        self.div_bits_per_cycle)
                gran = gcd(W // 4, 8)
            else:
                m.submodules.quant = q = _FP32Narrow(W, self.quant)
                gran = W // 2
            m.submodules.gearbox = gb = _ByteGearbox(W, gran)
            m.submodules.cmd_fifo = cmd_fifo = SyncFIFOBuffered(width=_QuantCommand().size,
                                                                depth=2)
            wiring.connect(m, wiring.flipped(self.payload), q.i)
            wiring.connect(m, q.o, gb.i)
            m.d.comb += [q.cmd.valid.eq(cmd_fifo.r_rdy), q.cmd.payload.eq(cmd_fifo.r_data),
                         cmd_fifo.r_en.eq(q.cmd.ready)]
            pl = gb.o

        # ---- destination table ---------------------------------------------------------------
        def table(name, width):
            return [Signal(width, name=f"{name}{i}", reset_less=True) for i in range(self.num_dest)]
        t_mac, t_ip, t_qpn = table("t_mac", 48), table("t_ip", 32), table("t_qpn", 24)
        t_sport, t_psn = table("t_sport", 16), table("t_psn", 24)
        t_ipsum = table("t_ipsum", 17)     # the two halves of the IP address, summed on write

        # ---- message state --------------------------------------------------------------------
        # The descriptor is taken into the message registers; its destination row is read a
        # cycle later, from a registered one-hot select (``m_sel``) into registers of its own
        # (``l_*``, loaded every cycle, no enable), and the plan starts once they hold it
        # (``l_ok``). Why: reading the 16-row table on the descriptor's input wires put the
        # input, the 16:1 selection and the take's enable of every message register in one
        # cycle (the last critical path, 122.1 MHz: the take's enable -> 2.7 ns of routing ->
        # four LUTs of the table's multiplexer -> ``m_psn``). Costs one cycle per message.
        m_active = Signal()
        m_sel = Signal(self.num_dest, reset_less=True)    # the destination row, one-hot
        m_va, m_rkey, m_len = (Signal(n, reset_less=True) for n in (64, 32, 32))
        m_imm, m_has_imm = Signal(32, reset_less=True), Signal(reset_less=True)
        m_rem = Signal(32, reset_less=True)     # wire bytes not yet given to a packet
        m_rem4 = Signal(32, reset_less=True)    # the same rounded up to a multiple of 4 (payload + pad)
        m_last = Signal()           # m_rem <= pmtu: the next packet is the message's last
        m_first = Signal()
        m_psn = Signal(24, reset_less=True)     # the next packet's PSN after the first
        l_ok = Signal()             # l_* hold the message's row (a cycle after the take)
        l_mac, l_ip, l_qpn = (Signal(n, reset_less=True) for n in (48, 32, 24))
        l_sport, l_psn, l_ipsum = (Signal(n, reset_less=True) for n in (16, 24, 17))

        def row(entries):
            """The entry ``m_sel`` selects: an AND-OR over the rows (one LUT level per four
            rows, no binary select fanning out to every multiplexer)."""
            out = 0
            for i, e in enumerate(entries):
                out = out | Mux(m_sel[i], e, 0)
            return out

        m.d.sync += [l_mac.eq(row(t_mac)), l_ip.eq(row(t_ip)), l_qpn.eq(row(t_qpn)),
                     l_sport.eq(row(t_sport)), l_psn.eq(row(t_psn)), l_ipsum.eq(row(t_ipsum))]

        m.d.comb += [
            self.table.ready.eq(~m_active),
            self.desc.ready.eq(~m_active & ~self.table.valid
                               & (cmd_fifo.w_rdy if cmd_fifo is not None else 1)),
        ]
        with m.If(self.desc.valid & self.desc.ready):
            d = self.desc.payload
            if self.quant == "none":
                wire_len = d.length
            elif self.quant == "int8":
                rows = Signal(32)
                per = Signal(range(pmtu + 1))
                m.d.comb += [rows.eq(d.length // (d.dim << 2)), per.eq(pmtu // (d.dim + 8))]
                wire_len = Mux(rows == 0, 0, (rows - 1) // per * pmtu
                               + ((rows - 1) % per + 1) * (d.dim + 8))[:32]
                m.d.comb += [cmd_fifo.w_en.eq(1),
                             cmd_fifo.w_data.eq(Cat(Const(0, 32), rows, d.dim))]
            else:
                wire_len = d.length >> 1
                m.d.comb += [cmd_fifo.w_en.eq(1),
                             cmd_fifo.w_data.eq((d.length + W - 1) >> (W.bit_length() - 1))]
            m.d.sync += [
                m_active.eq(1), m_sel.eq(1 << d.dest), m_va.eq(d.va), m_rkey.eq(d.rkey),
                m_len.eq(wire_len), m_rem.eq(wire_len), m_rem4.eq((wire_len + 3)[2:] << 2),
                m_last.eq(wire_len <= pmtu), m_imm.eq(d.imm),
                m_has_imm.eq(d.has_imm), m_first.eq(1),
            ]

        # ---- plan of the next packets: three register stages ahead of the generator -----------
        # A cuts the message into the next packet (opcode, lengths, PSN; every length one adder
        # from the message registers), B adds the IP checksum's terms, C folds the checksum.
        # They run while earlier frames stream (a 4096 B packet is 65 beats at 64 B), so the
        # generator loads finished header fields when it ends a frame. A stage takes a packet
        # when it is empty or passes its own on in the same cycle; C is emptied by the
        # generator's load, and B waits for C to be empty (the load does not reach back into the
        # plan: a packet at most every two cycles, which no frame of two beats or more notices).
        LW = W.bit_length() - 1
        lip_sum = Signal(18, reset_less=True)  # the constant IP header terms and the source address
        m.d.sync += lip_sum.eq(0x4500 + IP_FLAGS_DF + ((IP_TTL << 8) | 17)
                               + self.local_ip[16:] + self.local_ip[:16])
        immf_c = Signal()
        htype_c = Signal(2)            # {reth, immf}: one of the four header lengths
        m.d.comb += [immf_c.eq(m_has_imm & m_last), htype_c.eq(Cat(immf_c, m_first))]
        opcode_c = Signal(8)
        with m.If(m_first & m_last):
            m.d.comb += opcode_c.eq(Mux(immf_c, OP_WRITE_ONLY_IMM, OP_WRITE_ONLY))
        with m.Elif(m_first):
            m.d.comb += opcode_c.eq(OP_WRITE_FIRST)
        with m.Elif(m_last):
            m.d.comb += opcode_c.eq(Mux(immf_c, OP_WRITE_LAST_IMM, OP_WRITE_LAST))
        with m.Else():
            m.d.comb += opcode_c.eq(OP_WRITE_MIDDLE)

        def by_htype(f):
            """A constant per header type, selected by the packet's {reth, immf}."""
            return Array(Const(f(_HLEN[ht]), 16) for ht in range(4))[htype_c]

        plen_c = Mux(m_last, m_rem[:13], pmtu)
        plen4_c = Mux(m_last, m_rem4[:14], pmtu)
        fields = {"last": 1, "plen": 13, "htype": 2, "opcode": 8, "psn": 24, "mac": 48,
                  "ip": 32, "qpn": 24, "sport": 16, "va": 64, "rkey": 32, "len": 32, "imm": 32,
                  "pad": 2, "iplen": 16, "elen": 14, "flen_m1": 14, "payend": 14, "npay": 11,
                  "csum": 19}
        st = {n: {k: Signal(w, name=f"{n}_{k}", reset_less=True) for k, w in fields.items()}
              for n in "abc"}
        valid = {n: Signal(name=f"{n}_valid") for n in "abc"}
        load = Signal()
        b_to_c = valid["b"] & ~valid["c"]
        a_to_b = valid["a"] & (~valid["b"] | b_to_c)
        a_go = l_ok & (~valid["a"] | a_to_b)
        for n, take, give in (("a", a_go, a_to_b), ("b", a_to_b, b_to_c), ("c", b_to_c, load)):
            with m.If(take):
                m.d.sync += valid[n].eq(1)
            with m.Elif(give):
                m.d.sync += valid[n].eq(0)
        a, b_, c = st["a"], st["b"], st["c"]
        psn_c = Mux(m_first, l_psn, m_psn)
        m.d.sync += l_ok.eq(m_active & ~(a_go & m_last))
        with m.If(a_go):
            m.d.sync += [
                a["last"].eq(m_last), a["plen"].eq(plen_c), a["htype"].eq(htype_c),
                a["opcode"].eq(opcode_c), a["psn"].eq(psn_c), a["mac"].eq(l_mac),
                a["ip"].eq(l_ip), a["qpn"].eq(l_qpn), a["sport"].eq(l_sport), a["va"].eq(m_va),
                a["rkey"].eq(m_rkey), a["len"].eq(m_len), a["imm"].eq(m_imm),
                a["pad"].eq(Mux(m_last, -m_rem[:2], 0)),
                # lengths of the frame, each one adder from the message registers
                a["iplen"].eq(plen4_c + by_htype(lambda h: h + ICRC_LEN - ETH_LEN)),
                a["elen"].eq(plen4_c + by_htype(lambda h: h)),
                a["flen_m1"].eq(plen4_c + by_htype(lambda h: h + ICRC_LEN - 1)),
                a["payend"].eq(plen_c + by_htype(lambda h: h)),
                a["npay"].eq((plen4_c + (W - 1)) >> LW),
                a["csum"].eq(lip_sum + l_ipsum),
                m_rem.eq(m_rem - pmtu), m_rem4.eq(m_rem4 - pmtu), m_last.eq(m_rem <= 2 * pmtu),
                m_first.eq(0), m_psn.eq(psn_c + 1),
            ]
            with m.If(m_last):
                m.d.sync += m_active.eq(0)
        # The PSN after a message goes back to its row a cycle later, from registers (``wb_*``):
        # in time for the next message's read of the row (its take is a cycle after this one,
        # its read a cycle after that), and a host write to the row in that cycle wins, as it
        # came later. Written straight from ``psn_c + 1`` it was the critical path
        # (``m_first`` -> the PSN's multiplexer and incrementer -> ``t_psn``, 125.1 MHz).
        wb_en = Signal()
        wb_psn, wb_sel = Signal(24, reset_less=True), Signal(self.num_dest, reset_less=True)
        m.d.sync += [wb_en.eq(a_go & m_last), wb_psn.eq(psn_c + 1), wb_sel.eq(m_sel)]
        for i in range(self.num_dest):
            with m.If(wb_en & wb_sel[i]):
                m.d.sync += t_psn[i].eq(wb_psn)
        # host writes of the table (after the write-back: the later statement wins)
        with m.If(self.table.valid & self.table.ready):
            e = self.table.payload
            for i in range(self.num_dest):
                with m.If(e.index == i):
                    m.d.sync += [t_mac[i].eq(e.mac), t_ip[i].eq(e.ip), t_qpn[i].eq(e.qpn),
                                 t_sport[i].eq(e.udp_sport), t_psn[i].eq(e.psn),
                                 t_ipsum[i].eq(e.ip[16:] + e.ip[:16])]
        with m.If(a_to_b):
            m.d.sync += [b_[k].eq(a[k]) for k in fields if k != "csum"]
            m.d.sync += b_["csum"].eq(a["csum"] + a["iplen"])
        csum_fold = Signal(17)
        m.d.comb += csum_fold.eq(b_["csum"][:16] + b_["csum"][16:])
        with m.If(b_to_c):
            m.d.sync += [c[k].eq(b_[k]) for k in fields if k != "csum"]
            m.d.sync += c["csum"].eq(~(csum_fold[:16] + csum_fold[16])[:16])

        # ---- the generator ---------------------------------------------------------------------
        self._generator(m, c, valid["c"], load, pl)
        return m

    def _generator(self, m, c, c_valid, load, pl):
        """Frames out of planned packets: the header overlaid on the payload, the ICRC
        computed in three stages and overlaid in the output register.

        Every decision about the current beat is a registered flag, updated when a beat is
        sent (no beat counter compared against lengths): the header and its ICRC copy shift
        out of registers a beat at a time, ``hm`` marks the header bytes, the payload counters
        say whether this beat takes a payload beat and whether the payload ends here.
        """
        W = self.data_bytes
        LW = W.bit_length() - 1
        HW = -(-MAX_HEADER_LEN // W)          # beats the longest header can touch
        # Stage C's packet, as the generator loads it.
        reth, immf = c["htype"][1], c["htype"][0]
        m_va, m_rkey, m_len, m_imm = c["va"], c["rkey"], c["len"], c["imm"]
        ip_len, pad = c["iplen"], c["pad"]
        udp_len = Signal(16)
        m.d.comb += udp_len.eq(ip_len - IP_LEN)
        head = (_be(c["mac"], 6) + _be(self.local_mac, 6) + _c(ETHERTYPE_IPV4, 2)
                + _c(0x45, 1) + _c(0, 1) + _be(ip_len, 2) + _c(0, 2) + _c(IP_FLAGS_DF, 2)
                + _c(IP_TTL, 1) + _c(17, 1) + _be(c["csum"], 2) + _be(self.local_ip, 4)
                + _be(c["ip"], 4) + _be(c["sport"], 2) + _c(ROCE_UDP_PORT, 2)
                + _be(udp_len, 2) + _c(0, 2)
                + [c["opcode"], Cat(Const(0, 4), pad, Const(0, 2))] + _c(BTH_PKEY, 2) + _c(0, 1)
                + _be(c["qpn"], 3) + [Cat(Const(0, 7), c["last"])] + _be(c["psn"], 3))
        assert len(head) == BASE_HEADER_LEN
        ext_reth = Cat(*(_be(m_va, 8) + _be(m_rkey, 4) + _be(m_len, 4) + _be(m_imm, 4)))
        ext_imm = Cat(*(_be(m_imm, 4) + _c(0, 16)))
        hdr_next = Cat(*head, Mux(reth, ext_reth, ext_imm), Const(0, 8 * (HW * W - MAX_HEADER_LEN)))
        crc_head = list(head)
        for i in range(10):
            crc_head[i] = Const(0, 8)
        for i in (10, 11, 12, 13, 15, 22, 24, 25, 40, 41, 46):
            crc_head[i] = Const(0xFF, 8)
        crc_hdr_next = Cat(*crc_head, Mux(reth, ext_reth, ext_imm),
                           Const(0, 8 * (HW * W - MAX_HEADER_LEN)))
        hmask_next = Array(Const((1 << _HLEN[ht]) - 1, HW * W) for ht in range(4))[c["htype"]]
        beats_m1 = c["flen_m1"] >> LW
        pe_beat = (c["payend"] - 1)[:14] >> LW
        in_first = Array(Const(_HLEN[ht] >> LW, 4) for ht in range(4))[c["htype"]]
        rot_next = Signal(range(W))
        m.d.comb += rot_next.eq(-c["elen"])
        tail = c["payend"][:LW]

        # ---- packet registers: loaded when a packet starts, stepped at each beat -------------
        p_active = Signal()
        p_hdr = Signal(8 * HW * W, reset_less=True)      # header bytes not yet sent (shift register)
        p_crc_hdr = Signal(8 * HW * W, reset_less=True)  # the same with the ICRC's variant fields masked
        hm = Signal(HW * W, reset_less=True)             # which of them are header bytes
        p_htype = Signal(2)
        p_rot = Signal(range(W))       # d = (-E) mod W: CRC feed rotation, ICRC lane W - d
        p_spill = Signal()             # d == 2: the ICRC's last two bytes take one more beat
        p_last_count = Signal(range(W + 1))
        p_tail_mask = Signal(W)        # payload bytes of the beat where the payload ends
        left = Signal(10)              # beats after this one
        lb, pb = Signal(), Signal()    # this beat is the last / the one before the last
        fb = Signal()                  # this beat is the first
        pre_left = Signal(4)           # beats before the first payload beat is taken
        pay_left = Signal(11)          # payload beats still to take
        ni = Signal()                  # this beat takes a payload beat
        pe_left = Signal(10)           # beats before the one where the payload ends
        pe_now, pe_past = Signal(), Signal()

        # ---- output: three registers (r, r2, then o, which carries the ICRC), then a skid
        # register ``s`` that takes o's beat when ``frame`` is not ready. o moves whenever ``s``
        # is empty, r2 and r with it, so no stage's move depends on ``frame.ready`` in the same
        # cycle, and r's room is a flip-flop (``r_room``, computed from the next state): the
        # generator's advance and the load of the wide header registers start from flip-flops
        # only. The ICRC engine's three stages move in lockstep with r, r2 and o.
        r_valid, r2_valid, o_valid = Signal(), Signal(), Signal()
        r_data, r2_data, o_data = (Signal(8 * W, reset_less=True) for _ in range(3))
        r_count, r2_count, o_count = (Signal(range(W + 1)) for _ in range(3))
        r_last, r2_last, o_last = Signal(), Signal(), Signal()
        # 0: no ICRC byte, 1: ICRC at lane W-d, 2: spill
        r_mode, r2_mode, o_mode = Signal(2), Signal(2), Signal(2)
        r_rot, r2_rot, o_rot = (Signal(range(W)) for _ in range(3))
        s_valid = Signal()
        s_data = Signal(8 * W, reset_less=True)
        s_count = Signal(range(W + 1))
        s_last = Signal()
        o_ready = ~o_valid | ~s_valid
        r_room = Signal(init=1)        # == ~r_valid | ~o_valid | ~s_valid, a cycle ahead
        r_ready = r_room

        prev = Signal(8 * W, reset_less=True)        # previous payload beat
        prev_crc = Signal(8 * W, reset_less=True)    # previous CRC-variant frame beat
        advance = p_active & (~ni | pl.valid) & r_ready
        m.d.comb += pl.ready.eq(p_active & ni & r_ready)

        shifted = Signal(8 * W)
        both = Cat(prev, pl.payload)
        with m.Switch(p_htype):
            for ht in range(4):
                s = _HLEN[ht] % W
                with m.Case(ht):
                    m.d.comb += shifted.eq(both.bit_select(8 * (W - s), 8 * W))
        beat = Signal(8 * W)
        crc_beat = Signal(8 * W)
        for i in range(W):
            sl = slice(8 * i, 8 * i + 8)
            is_pay = ~pe_past & (~pe_now | p_tail_mask[i])
            m.d.comb += [
                beat[sl].eq(Mux(hm[i], p_hdr[sl], Mux(is_pay, shifted[sl], 0))),
                crc_beat[sl].eq(Mux(hm[i], p_crc_hdr[sl], Mux(is_pay, shifted[sl], 0))),
            ]

        # ICRC, three stages (the engine registers its feed, then its contribution, then
        # updates), each moving with the output register its beat is in (r, r2, o): feed beat
        # j = frame bytes [jW - d, jW - d + W), ending exactly at E (leading zeros are free).
        # With two stages the update folded the registered feed and the register in one parity
        # of about 90 bits, the critical path (123.8 MHz: five LUTs, 6.3 ns of routing).
        m.submodules.icrc = icrc = ICRCEngine(W, stages=3, group_bits=32)
        feed = Signal(8 * W)
        both_crc = Cat(Mux(fb, 0, prev_crc), crc_beat)
        with m.Switch(p_rot):
            for rot in range(2, W, 4):
                with m.Case(rot):
                    m.d.comb += feed.eq(both_crc.bit_select(8 * (W - rot), 8 * W))
        m.d.comb += [
            icrc.data.eq(feed),
            icrc.valid.eq(advance & ~(p_spill & lb)),
            icrc.start.eq(advance & fb),
            icrc.en.eq(Cat(advance | o_ready, o_ready, o_ready)),
        ]

        with m.If(advance):
            m.d.sync += [
                r_valid.eq(1), r_data.eq(beat), r_last.eq(lb),
                r_count.eq(Mux(lb, p_last_count, W)), r_rot.eq(p_rot),
                r_mode.eq(Mux(p_spill, Mux(pb, 1, Mux(lb, 2, 0)), Mux(lb, 1, 0))),
                prev_crc.eq(crc_beat), fb.eq(0),
                p_hdr.eq(p_hdr >> (8 * W)), p_crc_hdr.eq(p_crc_hdr >> (8 * W)),
                hm.eq(hm >> W),
                left.eq(left - 1), lb.eq(left == 1), pb.eq(left == 2),
                pe_left.eq(pe_left - 1), pe_now.eq(pe_left == 1), pe_past.eq(pe_past | pe_now),
            ]
            with m.If(ni):
                m.d.sync += [prev.eq(pl.payload), pay_left.eq(pay_left - 1),
                             ni.eq(pay_left != 1)]
            with m.Else():
                m.d.sync += [pre_left.eq(pre_left - 1),
                             ni.eq((pre_left == 1) & (pay_left != 0))]
        with m.Elif(o_ready):
            m.d.sync += r_valid.eq(0)
        with m.If(o_ready):
            m.d.sync += [r2_valid.eq(r_valid), r2_data.eq(r_data), r2_count.eq(r_count),
                         r2_last.eq(r_last), r2_mode.eq(r_mode), r2_rot.eq(r_rot),
                         o_valid.eq(r2_valid), o_data.eq(r2_data), o_count.eq(r2_count),
                         o_last.eq(r2_last), o_mode.eq(r2_mode), o_rot.eq(r2_rot)]
        # the next state of three valid flags, for ``r_room`` (r2 moves whenever o does, so r
        # has room next cycle when it will be empty or o will move)
        r_valid_n, o_valid_n, s_valid_n = Signal(), Signal(), Signal()
        m.d.comb += [
            r_valid_n.eq(advance | (r_valid & ~o_ready)),
            o_valid_n.eq(Mux(o_ready, r2_valid, o_valid)),
            s_valid_n.eq(Mux(s_valid, ~self.frame.ready, o_valid & ~self.frame.ready)),
        ]
        m.d.sync += r_room.eq(~r_valid_n | ~o_valid_n | ~s_valid_n)

        # Start the next packet when the generator is idle or finishing a frame.
        m.d.comb += load.eq(c_valid & (~p_active | (advance & lb)))
        with m.If(advance & lb):
            m.d.sync += p_active.eq(0)
        with m.If(load):
            m.d.sync += [
                p_active.eq(1), p_hdr.eq(hdr_next), p_crc_hdr.eq(crc_hdr_next),
                hm.eq(hmask_next), p_htype.eq(c["htype"]), p_rot.eq(rot_next),
                p_spill.eq(rot_next == 2), p_last_count.eq(c["flen_m1"][:LW] + 1),
                left.eq(beats_m1), lb.eq(beats_m1 == 0), pb.eq(beats_m1 == 1), fb.eq(1),
                pre_left.eq(in_first), pay_left.eq(c["npay"]),
                ni.eq((in_first == 0) & (c["npay"] != 0)),
                pe_left.eq(pe_beat), pe_now.eq(pe_beat == 0), pe_past.eq(0),
            ]
            with m.Switch(tail):
                for t in range(W):
                    with m.Case(t):
                        m.d.sync += p_tail_mask.eq((1 << (t or W)) - 1)

        # ---- output stage: overlay the ICRC ----------------------------------------------------
        # The engine's register moves with ``o``: while a beat is in ``o`` it holds the CRC of
        # the frame up to that beat's feed, so the frame's ICRC when the beat carries it (the
        # spill beat feeds nothing and finds the register as its predecessor left it).
        crc_val = Signal(32)
        m.d.comb += crc_val.eq(icrc.crc)
        out = Signal(8 * W)
        with m.Switch(Cat(o_rot, o_mode)):
            for rot in range(2, W, 4):
                with m.Case(rot | (1 << len(o_rot))):
                    lane = W - rot
                    n = min(4, rot)
                    m.d.comb += out.eq(o_data | (crc_val[:8 * n] << (8 * lane)))
            with m.Case(2 | (2 << len(o_rot))):
                m.d.comb += out.eq(o_data | crc_val[16:32])
            with m.Default():
                m.d.comb += out.eq(o_data)
        # ---- skid register: o's beat (ICRC overlaid) when ``frame`` does not take it ---------
        m.d.sync += s_valid.eq(s_valid_n)
        with m.If(~s_valid):
            m.d.sync += [s_data.eq(out), s_count.eq(o_count), s_last.eq(o_last)]
        m.d.comb += [
            self.frame.valid.eq(s_valid | o_valid),
            self.frame.payload.data.eq(Mux(s_valid, s_data, out)),
            self.frame.payload.count.eq(Mux(s_valid, s_count, o_count)),
            self.frame.payload.last.eq(Mux(s_valid, s_last, o_last)),
        ]
