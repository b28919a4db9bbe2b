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

Timing: each packet's plan (its cut of the message, opcode and lengths; then the IP header
checksum) is computed in two register stages ahead of the frame generator while the previous
frame streams, so the header the generator loads at a frame's last beat is already registered.
A message's first frame leaves two cycles later than a combinational plan would; back-to-back
packets keep one frame beat a cycle (65 cycles per 4096 B packet at 64 B).

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
going out) is overlaid on the payload beats, shifted by the header length; the ICRC is
computed (:class:`rtl.roce.ICRCEngine`, the CRC of ``amaranth.lib.crc``'s
Algorithm) on a copy of each beat rotated so that the covered bytes end
on a beat boundary (leading zeros are free because the CRC register starts at zero after the
first four 0xFF bytes of the pseudo-header). One register stage before ``frame`` holds a beat
until its ICRC is known. Frames leave back to back, one beat per cycle, while ``payload``
keeps up and ``frame`` is ready: a packet of ``F`` frame bytes takes ``ceil(F / data_bytes)``
cycles (65 for a 4096-byte MIDDLE or LAST at 64 bytes per beat). A new message's first packet
follows the previous one without a gap when its descriptor arrived in time; latency from a
descriptor to the first beat is 2 cycles.
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from .roce import (BASE_HEADER_LEN, BTH_PKEY, ETHERTYPE_IPV4, FrameBeat, IP_FLAGS_DF, IP_TTL,
                   MAX_HEADER_LEN, OP_WRITE_FIRST, OP_WRITE_LAST, OP_WRITE_LAST_IMM,
                   OP_WRITE_MIDDLE, OP_WRITE_ONLY, OP_WRITE_ONLY_IMM, ROCE_UDP_PORT,
                   check_data_bytes, check_pmtu, ICRCEngine)
from .streams import check_int

__all__ = ["SendDescriptor", "DestEntry", "Packetizer", "QUANT_FORMATS"]

QUANT_FORMATS = ("none", "fp16", "bf16", "int8")

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
        HW = -(-MAX_HEADER_LEN // W)          # beats the longest header can touch

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
            return Array(Signal(width, name=f"{name}{i}") for i in range(self.num_dest))
        t_mac, t_ip, t_qpn = table("t_mac", 48), table("t_ip", 32), table("t_qpn", 24)
        t_sport, t_psn = table("t_sport", 16), table("t_psn", 24)

        # ---- message state --------------------------------------------------------------------
        m_active = Signal()
        m_dest = Signal(self.dest_bits)
        m_va, m_rkey, m_len = Signal(64), Signal(32), Signal(32)
        m_imm, m_has_imm = Signal(32), Signal()
        m_mac, m_ip, m_qpn, m_sport = Signal(48), Signal(32), Signal(24), Signal(16)
        m_rem = Signal(32)          # wire bytes not yet given to a packet
        m_first = Signal()
        m_psn = Signal(24)

        m.d.comb += [
            self.table.ready.eq(~m_active),
            self.desc.ready.eq(~m_active & ~self.table.valid
                               & (cmd_fifo.w_rdy if cmd_fifo is not None else 1)),
        ]
        with m.If(self.table.valid & self.table.ready):
            e = self.table.payload
            m.d.sync += [t_mac[e.index].eq(e.mac), t_ip[e.index].eq(e.ip),
                         t_qpn[e.index].eq(e.qpn), t_sport[e.index].eq(e.udp_sport),
                         t_psn[e.index].eq(e.psn)]
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
                m_active.eq(1), m_dest.eq(d.dest), m_va.eq(d.va), m_rkey.eq(d.rkey),
                m_len.eq(wire_len), m_rem.eq(wire_len), m_imm.eq(d.imm),
                m_has_imm.eq(d.has_imm), m_first.eq(1), m_psn.eq(t_psn[d.dest]),
                m_mac.eq(t_mac[d.dest]), m_ip.eq(t_ip[d.dest]), m_qpn.eq(t_qpn[d.dest]),
                m_sport.eq(t_sport[d.dest]),
            ]

        # ---- plan of the next packets: two register stages ahead of the generator --------------
        # Stage A cuts the message state into the next packet (length, opcode, lengths, PSN) and
        # copies the message's fields, so a new descriptor may be accepted while earlier packets
        # are still planned; stage B adds the IP checksum. Both run while the previous frame
        # streams (a 4096 B packet is 65 beats at 64 B), so the generator loads a finished
        # header the cycle it ends a frame: the header path is three short stages, not one.
        last_pkt = Signal()
        plen_c = Signal(13)
        immf_c = Signal()
        hlen_c = Signal(7)
        m.d.comb += [
            last_pkt.eq(m_rem <= pmtu),
            plen_c.eq(Mux(last_pkt, m_rem, pmtu)),
            immf_c.eq(m_has_imm & last_pkt),
            hlen_c.eq(BASE_HEADER_LEN + Mux(m_first, 16, 0) + Mux(immf_c, 4, 0)),
        ]
        opcode_c = Signal(8)
        with m.If(m_first & last_pkt):
            m.d.comb += opcode_c.eq(Mux(immf_c, OP_WRITE_ONLY_IMM, OP_WRITE_ONLY))
        with m.Elif(m_first):
            m.d.comb += opcode_c.eq(OP_WRITE_FIRST)
        with m.Elif(last_pkt):
            m.d.comb += opcode_c.eq(Mux(immf_c, OP_WRITE_LAST_IMM, OP_WRITE_LAST))
        with m.Else():
            m.d.comb += opcode_c.eq(OP_WRITE_MIDDLE)

        fields = {"last": 1, "plen": 13, "reth": 1, "immf": 1, "opcode": 8, "hlen": 7,
                  "psn": 24, "mac": 48, "ip": 32, "qpn": 24, "sport": 16, "va": 64, "rkey": 32,
                  "len": 32, "imm": 32, "csum_part": 19}
        a_r = {k: Signal(w, name=f"a_{k}") for k, w in fields.items()}
        b_r = {k: Signal(w, name=f"b_{k}") for k, w in fields.items()}
        a_valid, b_valid = Signal(), Signal()
        b_csum = Signal(16)
        p_active = Signal()
        load = Signal()
        a_to_b = a_valid & (~b_valid | load)
        a_go = m_active & (~a_valid | a_to_b)
        with m.If(a_to_b):
            m.d.sync += b_valid.eq(1)
        with m.Elif(load):
            m.d.sync += b_valid.eq(0)
        with m.If(a_go):
            m.d.sync += a_valid.eq(1)
        with m.Elif(a_to_b):
            m.d.sync += a_valid.eq(0)
        with m.If(a_go):
            m.d.sync += [
                a_r["last"].eq(last_pkt), a_r["plen"].eq(plen_c), a_r["reth"].eq(m_first),
                a_r["immf"].eq(immf_c), a_r["opcode"].eq(opcode_c), a_r["hlen"].eq(hlen_c),
                a_r["psn"].eq(m_psn), a_r["mac"].eq(m_mac), a_r["ip"].eq(m_ip),
                a_r["qpn"].eq(m_qpn), a_r["sport"].eq(m_sport), a_r["va"].eq(m_va),
                a_r["rkey"].eq(m_rkey), a_r["len"].eq(m_len), a_r["imm"].eq(m_imm),
                # IP header checksum terms that do not depend on the packet length
                a_r["csum_part"].eq(0x4500 + IP_FLAGS_DF + ((IP_TTL << 8) | 17)
                                    + self.local_ip[16:] + self.local_ip[:16]
                                    + m_ip[16:] + m_ip[:16]),
                m_rem.eq(m_rem - plen_c), m_first.eq(0), m_psn.eq(m_psn + 1),
            ]
            with m.If(last_pkt):
                m.d.sync += [m_active.eq(0), t_psn[m_dest].eq(m_psn + 1)]

        a_pad = Signal(2)
        a_elen = Signal(14)
        a_iplen = Signal(16)
        csum_sum = Signal(20)
        csum_fold = Signal(17)
        m.d.comb += [
            a_pad.eq(-a_r["plen"]),
            a_elen.eq(a_r["hlen"] + a_r["plen"] + a_pad),
            a_iplen.eq(a_elen + 4 - 14),
            csum_sum.eq(a_r["csum_part"] + a_iplen),
            csum_fold.eq(csum_sum[:16] + csum_sum[16:]),
        ]
        with m.If(a_to_b):
            m.d.sync += [b_r[k].eq(a_r[k]) for k in fields]
            m.d.sync += b_csum.eq(~(csum_fold[:16] + csum_fold[16]))

        # Stage B's packet, as the generator loads it.
        plen, reth, immf, hlen = b_r["plen"], b_r["reth"], b_r["immf"], b_r["hlen"]
        m_mac, m_ip, m_qpn, m_sport = b_r["mac"], b_r["ip"], b_r["qpn"], b_r["sport"]
        m_va, m_rkey, m_len, m_imm = b_r["va"], b_r["rkey"], b_r["len"], b_r["imm"]
        opcode, csum = b_r["opcode"], b_csum
        pad = Signal(2)
        e_len = Signal(14)            # bytes covered by the ICRC: header + payload + pad
        ip_len = Signal(16)
        m.d.comb += [pad.eq(-plen), e_len.eq(hlen + plen + pad), ip_len.eq(e_len + 4 - 14)]
        udp_len = ip_len - 20
        head = (_be(m_mac, 6) + _be(self.local_mac, 6) + _c(ETHERTYPE_IPV4, 2)
                + _c(0x45, 1) + _c(0, 1) + _be(ip_len, 2) + _c(0, 2) + _c(IP_FLAGS_DF, 2)
                + _c(IP_TTL, 1) + _c(17, 1) + _be(csum, 2) + _be(self.local_ip, 4) + _be(m_ip, 4)
                + _be(m_sport, 2) + _c(ROCE_UDP_PORT, 2) + _be(udp_len[:16], 2) + _c(0, 2)
                + [opcode, Cat(Const(0, 4), pad, Const(0, 2))] + _c(BTH_PKEY, 2) + _c(0, 1)
                + _be(m_qpn, 3) + [Cat(Const(0, 7), b_r["last"])] + _be(b_r["psn"], 3))
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

        # ---- packet registers (loaded when a packet starts) ----------------------------------
        p_hdr = Signal(8 * HW * W)
        p_crc_hdr = Signal(8 * HW * W)
        p_htype = Signal(2)            # {reth, immf}: selects the header length
        p_hlen = Signal(7)
        p_pay_end = Signal(14)         # header + payload bytes
        p_beats = Signal(10)           # frame beats
        p_feed = Signal(10)            # beats of CRC feed
        p_rot = Signal(range(W))       # d = (-E) mod W: CRC feed rotation
        p_in_first = Signal(10)        # frame beat that takes payload beat 0 (H // W)
        p_in_end = Signal(10)          # p_in_first + payload beats
        p_last_count = Signal(range(W + 1))
        b = Signal(10)                 # current frame beat

        f_len = e_len + 4
        nbeats = (f_len + W - 1) >> (W.bit_length() - 1)
        nfeed = (e_len + W - 1) >> (W.bit_length() - 1)
        npay = (plen + W - 1) >> (W.bit_length() - 1)
        in_first = hlen >> (W.bit_length() - 1)

        # ---- the generator ---------------------------------------------------------------------
        r_valid = Signal()
        r_data = Signal(8 * W)
        r_count = Signal(range(W + 1))
        r_last = Signal()
        r_mode = Signal(2)             # 0: no ICRC byte here, 1: ICRC from lane W-d, 2: spill
        r_rot = Signal(range(W))
        r_ready = ~r_valid | self.frame.ready

        prev = Signal(8 * W)           # previous payload beat
        prev_crc = Signal(8 * W)       # previous CRC-variant frame beat
        need_in = p_active & (b >= p_in_first) & (b < p_in_end)
        gen_valid = p_active & (~need_in | pl.valid)
        advance = gen_valid & r_ready
        m.d.comb += pl.ready.eq(p_active & need_in & r_ready)

        shifted = Signal(8 * W)
        both = Cat(prev, pl.payload)
        with m.Switch(p_htype):
            for htype in range(4):
                h = BASE_HEADER_LEN + 16 * (htype >> 1) + 4 * (htype & 1)
                s = h % W
                with m.Case(htype):
                    m.d.comb += shifted.eq(both.bit_select(8 * (W - s), 8 * W))

        pos0 = b * W
        lo = Signal(range(-1 << 14, 1 << 14))
        hi = Signal(range(-1 << 14, 1 << 14))
        m.d.comb += [lo.eq(p_hlen - pos0), hi.eq(p_pay_end - pos0)]
        hword = Signal(8 * W)
        crc_hword = Signal(8 * W)
        with m.Switch(b):
            for k in range(HW):
                with m.Case(k):
                    m.d.comb += [hword.eq(p_hdr.word_select(k, 8 * W)),
                                 crc_hword.eq(p_crc_hdr.word_select(k, 8 * W))]
        beat = Signal(8 * W)
        crc_beat = Signal(8 * W)
        for i in range(W):
            sl = slice(8 * i, 8 * i + 8)
            is_hdr = lo > i
            is_pay = hi > i
            m.d.comb += [
                beat[sl].eq(Mux(is_hdr, hword[sl], Mux(is_pay, shifted[sl], 0))),
                crc_beat[sl].eq(Mux(is_hdr, crc_hword[sl], Mux(is_pay, shifted[sl], 0))),
            ]

        # ICRC: feed beat j = frame bytes [jW - d, jW - d + W), ending exactly at E.
        m.submodules.icrc = icrc = ICRCEngine(W)
        feed = Signal(8 * W)
        prev_feed = Mux(b == 0, 0, prev_crc)
        both_crc = Cat(prev_feed, crc_beat)
        with m.Switch(p_rot):
            for rot in range(2, W, 4):
                with m.Case(rot):
                    m.d.comb += feed.eq(both_crc.bit_select(8 * (W - rot), 8 * W))
        m.d.comb += [
            icrc.data.eq(feed),
            icrc.valid.eq(advance & (b < p_feed)),
            icrc.start.eq(advance & (b == 0)),
        ]

        last_beat = b == p_beats - 1
        with m.If(self.frame.valid & self.frame.ready):
            m.d.sync += r_valid.eq(0)
        with m.If(advance):
            m.d.sync += [
                r_valid.eq(1), r_data.eq(beat), r_last.eq(last_beat),
                r_count.eq(Mux(last_beat, p_last_count, W)), r_rot.eq(p_rot),
                r_mode.eq(Mux(b == p_feed - 1, 1, Mux(b == p_feed, 2, 0))),
                prev_crc.eq(crc_beat), b.eq(b + 1),
            ]
            with m.If(need_in):
                m.d.sync += prev.eq(pl.payload)

        # Start the next packet when the generator is idle or finishing a frame.
        m.d.comb += load.eq(b_valid & (~p_active | (advance & last_beat)))
        with m.If(advance & last_beat):
            m.d.sync += p_active.eq(0)
        with m.If(load):
            m.d.sync += [
                p_active.eq(1), b.eq(0), p_hdr.eq(hdr_next), p_crc_hdr.eq(crc_hdr_next),
                p_htype.eq(Cat(immf, reth)), p_hlen.eq(hlen), p_pay_end.eq(hlen + plen),
                p_beats.eq(nbeats), p_feed.eq(nfeed), p_rot.eq(-e_len),
                p_in_first.eq(in_first), p_in_end.eq(in_first + npay),
                p_last_count.eq(f_len - ((nbeats - 1) * W)),
            ]

        # ---- output stage: overlay the ICRC ----------------------------------------------------
        out = Signal(8 * W)
        crc_val = icrc.crc
        with m.Switch(Cat(r_rot, r_mode)):
            for rot in range(2, W, 4):
                with m.Case(rot | (1 << len(r_rot))):
                    lane = W - rot
                    n = min(4, rot)
                    m.d.comb += out.eq(r_data | (crc_val[:8 * n] << (8 * lane)))
            with m.Case(2 | (2 << len(r_rot))):
                m.d.comb += out.eq(r_data | crc_val[16:32])
            with m.Default():
                m.d.comb += out.eq(r_data)
        m.d.comb += [
            self.frame.valid.eq(r_valid),
            self.frame.payload.data.eq(out),
            self.frame.payload.count.eq(r_count),
            self.frame.payload.last.eq(r_last),
        ]
        return m
