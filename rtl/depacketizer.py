"""The AlltoAll depacketizer: RoCEv2 RDMA WRITE frames in, payload written to memory.

Interface
=========

``frame`` (in stream, :class:`rtl.roce.FrameBeat`)
    Frames as the packetizer sends them (Ethernet header to ICRC, no FCS), ``count`` valid
    bytes on the last beat.
``qp_init`` (in stream, :class:`QPInit`)
    The host sets the next expected PSN of a local QP and its wire format (``none``,
    ``fp16``, ``bf16`` or ``int8`` with the row ``dim``), and clears any message in progress.
    The format is configured per QP because the wire carries no format field: a sender and
    its receiver agree on it when the QP is set up.
``mem`` (out, :class:`rtl.streams.MemPortSignature`, ``data_bytes`` per beat)
    Posted writes of each accepted packet's payload at its remote address: one request of
    ``ceil(bytes / data_bytes)`` beats per packet, a byte mask on the last beat. For a
    quantized QP the bytes are the restored FP32 values (FP16/BF16 widened exactly; INT8
    ``fl(fl(q * scale) + bias)`` with :mod:`rtl.fp` components) and the RETH address is where
    they go; consecutive packets continue where the previous one's FP32 values ended. The
    RETH virtual address must be a multiple of ``data_bytes`` (its low bits are ignored; an
    unaligned address would need a byte-rotating write path: not built).
``completion`` (out stream, :class:`Completion`)
    One per message, after its last packet's payload has been handed to ``mem``: the QP, the
    DMA length, and the immediate data when the message carried one.
``counters`` (out, :class:`Counters`)
    Frames accepted and frames dropped, per reason (:data:`rtl.roce.DROP_REASONS`, each frame
    counted once, under the first reason in that order).

Behaviour
=========

Every field is checked: Ethertype, IP version and IHL, IP total length against the frame,
IP header checksum, UDP protocol and port, the ICRC, the destination QP, the opcode sequence
per QP (FIRST/ONLY outside a message, MIDDLE/LAST inside), the PSN (the next one expected,
modulo 2**24), and the payload length (ONLY: the RETH DMA length; FIRST/MIDDLE: the path MTU;
LAST: the rest of the DMA length). A dropped frame changes no QP state and writes nothing.

Timing
======

Store and forward per packet: the payload is realigned to beat boundaries as it arrives and
held in a FIFO (two path MTUs) until the frame's verdict, one cycle after its last beat (the
ICRC is checked through the CRC residue, so no field must be known in advance; the ICRC result
is kept from that cycle, so a verdict that waits for room in the verdict FIFO stays the frame's
own while the next frame's first beats enter). ``frame`` takes
one beat per cycle; it pauses one cycle after a frame whose payload ends in its last beat with
another payload beat to write, and a last beat waits while the previous verdict is pending
(back-to-back one-beat frames: the verdict updates the QP state the next frame is checked
against; only frames of at most ``data_bytes`` bytes, i.e. payloads of up to 6 bytes at 64
bytes per beat, are affected). The drain writes one beat per cycle with one cycle between
packets; FP16/BF16 write two FP32 beats per payload beat, INT8 one FP32 beat per
``data_bytes / 4`` codes plus a cycle per row for its scale and bias. The drain leaves reset
through a one-cycle ``Start`` state (so that Icarus evaluates the combinational blocks
derived from its state).
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from .roce import (BASE_HEADER_LEN, DROP_REASONS, ETHERTYPE_IPV4, ICRC_ALGORITHM, FrameBeat,
                   ICRCEngine, MAX_HEADER_LEN, OP_WRITE_FIRST, OP_WRITE_LAST, OP_WRITE_LAST_IMM,
                   OP_WRITE_MIDDLE, OP_WRITE_ONLY, OP_WRITE_ONLY_IMM, ROCE_UDP_PORT,
                   check_data_bytes, check_pmtu)
from .streams import MemPortSignature, check_int

__all__ = ["QPInit", "Completion", "Counters", "Depacketizer", "icrc_residues"]


#: Wire formats a QP can be set to (``QPInit.format`` codes 0..3, in this order).
QUANT_FORMATS = ("none", "fp16", "bf16", "int8")


class QPInit(data.StructLayout):
    """A host write of QP ``qp``: next PSN, wire ``format`` (an index into
    :data:`QUANT_FORMATS`) and, for INT8, the row ``dim`` (elements)."""

    def __init__(self, qp_bits: int):
        super().__init__({"qp": unsigned(qp_bits), "psn": unsigned(24), "format": unsigned(2),
                          "dim": unsigned(16)})


class Completion(data.StructLayout):
    def __init__(self, qp_bits: int):
        super().__init__({"qp": unsigned(qp_bits), "length": unsigned(32), "imm": unsigned(32),
                          "has_imm": unsigned(1)})


class Counters(data.StructLayout):
    """32-bit counters: ``accepted`` and one per drop reason."""

    def __init__(self):
        super().__init__({name: unsigned(32) for name in ("accepted",) + DROP_REASONS})


def _or_all(values):
    out = values[0]
    for v in values[1:]:
        out = out | v
    return out


def icrc_residues(data_bytes: int) -> list[int]:
    """The CRC engine's output after a valid codeword followed by ``z`` zero bytes, for
    ``z = 0 .. data_bytes - 1`` (the unused lanes of a frame's last beat)."""
    params = ICRC_ALGORITHM(8)
    body = list(b"\xff\xff\xff\xff" + bytes(range(20)))
    code = params.compute(body)
    stream_ = body + list(code.to_bytes(4, "little"))
    return [params.compute(stream_ + [0] * z) for z in range(data_bytes)]


class Depacketizer(wiring.Component):
    """RoCEv2 RDMA WRITE frames to memory writes and completions (see the module docstring).

    Parameters
    ----------
    data_bytes : bytes per beat of ``frame`` and of the memory port: 8, 16, 32 or 64.
    pmtu : the path MTU the sender segments at: 256..4096, a power of two.
    num_qps : local QPs served (destination QPs ``0 .. num_qps - 1``), 1..256.
    addr_width : beat-address width of the memory port.
    formats : the wire formats this receiver can restore to FP32 (a subset of
        :data:`QUANT_FORMATS`; ``"none"`` is always there). A QP set to a format that is not
        built is received as ``"none"`` (its wire bytes are written).
    """

    def __init__(self, *, data_bytes: int = 64, pmtu: int = 4096, num_qps: int = 16,
                 addr_width: int = 32, formats: tuple[str, ...] = ("none",)):
        self.data_bytes = check_data_bytes(data_bytes)
        self.pmtu = check_pmtu(pmtu)
        self.num_qps = check_int("num_qps", num_qps, minimum=1, maximum=256)
        self.addr_width = check_int("addr_width", addr_width, minimum=8, maximum=64)
        if isinstance(formats, str) or not all(f in QUANT_FORMATS for f in formats):
            raise ValueError(f"formats: expected a tuple of {', '.join(QUANT_FORMATS)}, "
                             f"got {formats!r}")
        self.formats = tuple(f for f in QUANT_FORMATS if f in formats or f == "none")
        self.qp_bits = max(1, (num_qps - 1).bit_length())
        self.wire_beats_width = (pmtu // data_bytes).bit_length()
        # FP32 bytes written per wire byte: at most 4 (INT8), 2 (FP16/BF16), 1.
        grow = 4 if "int8" in self.formats else 2 if len(self.formats) > 1 else 1
        self.beats_width = (grow * pmtu // data_bytes).bit_length()
        super().__init__({
            "frame": In(stream.Signature(FrameBeat(data_bytes))),
            "qp_init": In(stream.Signature(QPInit(self.qp_bits))),
            "mem": Out(MemPortSignature(addr_width=addr_width, beats_width=self.beats_width,
                                        data_bytes=data_bytes)),
            "completion": Out(stream.Signature(Completion(self.qp_bits))),
            "counters": Out(Counters()),
        })

    def elaborate(self, platform):
        m = Module()
        W = self.data_bytes
        LW = W.bit_length() - 1
        pmtu = self.pmtu
        HW = -(-MAX_HEADER_LEN // W)
        max_beats = pmtu // W
        fr = self.frame

        # ---- FIFOs between parse and drain ----------------------------------------------------
        m.submodules.pfifo = pfifo = SyncFIFOBuffered(width=8 * W, depth=2 * max_beats + 4)
        verdict = data.StructLayout({
            "accept": 1, "wbeats": self.beats_width + 1, "addr": self.addr_width,
            "tail": range(W + 1), "complete": 1, "qp": self.qp_bits, "length": 32,
            "imm": 32, "has_imm": 1, "obeats": self.beats_width + 1, "fmt": 2, "dim": 16,
            "rows": range(pmtu + 1),
        })
        m.submodules.vfifo = vfifo = SyncFIFOBuffered(width=verdict.size, depth=4)

        # ---- per-QP state --------------------------------------------------------------------
        def qtable(name, width):
            return Array(Signal(width, name=f"{name}{i}") for i in range(self.num_qps))
        q_psn, q_in, q_va = qtable("q_psn", 24), qtable("q_in", 1), qtable("q_va", 64)
        q_rem, q_len = qtable("q_rem", 32), qtable("q_len", 32)
        q_fmt, q_dim = qtable("q_fmt", 2), qtable("q_dim", 16)

        # ---- parse stage ---------------------------------------------------------------------
        b = Signal(10)
        hdr = Signal(8 * HW * W)
        view = Signal(8 * HW * W)
        for k in range(HW):
            m.d.comb += view.word_select(k, 8 * W).eq(
                Mux(b == k, fr.payload.data, hdr.word_select(k, 8 * W)))

        def byte(i):
            return view[8 * i: 8 * i + 8]

        def field(offset, n):
            return Cat(*[byte(offset + n - 1 - k) for k in range(n)])

        opcode = byte(42)
        reth = (opcode == OP_WRITE_FIRST) | (opcode == OP_WRITE_ONLY) | (opcode == OP_WRITE_ONLY_IMM)
        immf = (opcode == OP_WRITE_LAST_IMM) | (opcode == OP_WRITE_ONLY_IMM)
        htype = Cat(immf, reth)
        ip_len = field(16, 2)
        pad = byte(43)[4:6]
        hlen = Signal(7)
        m.d.comb += hlen.eq(BASE_HEADER_LEN + Mux(reth, 16, 0) + Mux(immf, 4, 0))
        plen = Signal(range(-1 << 17, 1 << 17))
        m.d.comb += plen.eq(ip_len + 14 - hlen - 4 - pad)
        plen_ok = (plen >= 0) & (plen <= pmtu)
        npay = Signal(range(max_beats + 2))
        m.d.comb += npay.eq(Mux(plen_ok, (plen[:14] + W - 1) >> LW, 0))
        q = hlen >> LW

        prev = Signal(8 * W)
        realigned = Signal(8 * W)
        flushed = Signal(8 * W)
        both = Cat(prev, fr.payload.data)
        with m.Switch(htype):
            for ht in range(4):
                s = (BASE_HEADER_LEN + 16 * (ht >> 1) + 4 * (ht & 1)) % W
                with m.Case(ht):
                    m.d.comb += [realigned.eq(both.bit_select(8 * s, 8 * W)),
                                 flushed.eq(fr.payload.data >> (8 * s))]

        flush = Signal()               # one extra cycle to write the frame's last payload beat
        flush_data = Signal(8 * W)
        pend = Signal()                # a verdict waits for its ICRC result
        wcount = Signal(self.beats_width + 1)

        fire = fr.valid & fr.ready
        idx = b - q - 1                # payload beat completed by this frame beat
        emit = (b > q) & (idx < npay)
        emit2 = fr.payload.last & (b >= q) & ((b - q) < npay)
        m.d.comb += fr.ready.eq(pfifo.w_rdy & ~flush & ~(pend & fr.payload.last))

        with m.If(flush):
            m.d.comb += [pfifo.w_en.eq(1), pfifo.w_data.eq(flush_data)]
            with m.If(pfifo.w_rdy):
                m.d.sync += flush.eq(0)
        with m.Elif(fire & emit):
            m.d.comb += [pfifo.w_en.eq(1), pfifo.w_data.eq(realigned)]
        with m.Elif(fire & emit2):
            m.d.comb += [pfifo.w_en.eq(1), pfifo.w_data.eq(flushed)]
        with m.If(fire & emit & emit2):
            m.d.sync += [flush.eq(1), flush_data.eq(flushed)]

        with m.If(fire):
            m.d.sync += prev.eq(fr.payload.data)
            for k in range(HW):
                with m.If(b == k):
                    m.d.sync += hdr.word_select(k, 8 * W).eq(fr.payload.data)
            with m.If(fr.payload.last):
                m.d.sync += [b.eq(0), wcount.eq(0)]
            with m.Else():
                m.d.sync += [b.eq(Mux(b == (1 << len(b)) - 1, b, b + 1)),
                             wcount.eq(wcount + (emit | emit2))]

        # ICRC: the frame as it is, variant fields masked, bytes past the end zeroed.
        m.submodules.icrc = icrc = ICRCEngine(W)
        feed = Signal(8 * W)
        masked = [fr.payload.data[8 * i: 8 * i + 8] for i in range(W)]
        special = {p: 0 for p in range(10)}
        special.update({p: 0xFF for p in (10, 11, 12, 13, 15, 22, 24, 25, 40, 41, 46)})
        for p, value in special.items():
            masked[p % W] = Mux(b == p // W, value, masked[p % W])
        for i in range(W):
            keep = ~fr.payload.last | (fr.payload.count > i)
            m.d.comb += feed[8 * i: 8 * i + 8].eq(Mux(keep, masked[i], 0))
        m.d.comb += [icrc.data.eq(feed), icrc.valid.eq(fire), icrc.start.eq(fire & (b == 0))]

        # ---- checks at the last beat -----------------------------------------------------------
        flen = Signal(15)
        m.d.comb += flen.eq((b << LW) + fr.payload.count)
        csum = Signal(21)
        m.d.comb += csum.eq(sum(field(14 + 2 * k, 2) for k in range(10)))
        csum_fold = (csum[:16] + csum[16:])
        csum_ok = (csum_fold[:16] + csum_fold[16]) == 0xFFFF
        dqpn = field(47, 3)
        qp = dqpn[:self.qp_bits]
        psn = field(51, 3)
        dmalen = field(66, 4)
        in_msg = q_in[qp]
        rem = q_rem[qp]
        n_pre = 6
        pre = Signal(range(n_pre + 1))     # index into DROP_REASONS[:6], n_pre when all pass
        with m.If(flen < 34):
            m.d.comb += pre.eq(0)
        with m.Elif(field(12, 2) != ETHERTYPE_IPV4):
            m.d.comb += pre.eq(1)
        with m.Elif(byte(14) != 0x45):
            m.d.comb += pre.eq(2)
        with m.Elif(ip_len + 14 > flen):
            m.d.comb += pre.eq(0)
        with m.Elif((ip_len + 14 < flen) | (ip_len < 44)):
            m.d.comb += pre.eq(3)
        with m.Elif(~csum_ok):
            m.d.comb += pre.eq(4)
        with m.Elif((byte(23) != 17) | (field(36, 2) != ROCE_UDP_PORT)):
            m.d.comb += pre.eq(5)
        with m.Else():
            m.d.comb += pre.eq(n_pre)
        is_only = (opcode == OP_WRITE_ONLY) | (opcode == OP_WRITE_ONLY_IMM)
        is_last = (opcode == OP_WRITE_LAST) | (opcode == OP_WRITE_LAST_IMM)
        is_first = opcode == OP_WRITE_FIRST
        is_middle = opcode == OP_WRITE_MIDDLE
        post = Signal(range(5))            # 0 qp, 1 opcode, 2 psn, 3 length, 4 pass
        len_ok = Signal()
        with m.If(plen < 0):
            m.d.comb += len_ok.eq(0)
        with m.Elif(is_only):
            m.d.comb += len_ok.eq(plen == dmalen)
        with m.Elif(is_first):
            m.d.comb += len_ok.eq((plen == pmtu) & (dmalen > pmtu))
        with m.Elif(is_middle):
            m.d.comb += len_ok.eq((plen == pmtu) & (rem > pmtu))
        with m.Else():
            m.d.comb += len_ok.eq((plen == rem) & (plen != 0))
        with m.If(dqpn >= self.num_qps):
            m.d.comb += post.eq(0)
        with m.Elif(Mux(in_msg, ~(is_middle | is_last), ~(is_first | is_only))):
            m.d.comb += post.eq(1)
        with m.Elif(psn != q_psn[qp]):
            m.d.comb += post.eq(2)
        with m.Elif(~len_ok):
            m.d.comb += post.eq(3)
        with m.Else():
            m.d.comb += post.eq(4)

        p_pre, p_post = Signal.like(pre), Signal.like(post)
        p_z = Signal(range(W))
        p_qp = Signal(self.qp_bits)
        p_start = Signal()                 # FIRST/ONLY: take address and length from the RETH
        p_va, p_dmalen = Signal(64), Signal(32)
        p_plen = Signal(13)
        p_cont = Signal()                  # FIRST/MIDDLE: a message continues
        p_wbeats = Signal(self.beats_width + 1)
        p_imm, p_has_imm = Signal(32), Signal()
        p_fresh = Signal()                 # the cycle after the last beat (``icrc.crc`` valid)
        with m.If(fire & fr.payload.last):
            m.d.sync += [
                pend.eq(1), p_fresh.eq(1), p_pre.eq(pre), p_post.eq(post),
                p_z.eq(W - fr.payload.count),
                p_qp.eq(qp), p_start.eq(is_first | is_only), p_va.eq(field(54, 8)),
                p_dmalen.eq(dmalen), p_plen.eq(plen[:13]), p_cont.eq(is_first | is_middle),
                p_wbeats.eq(wcount + emit + emit2),
                p_imm.eq(Mux(opcode == OP_WRITE_ONLY_IMM, field(70, 4), field(54, 4))),
                p_has_imm.eq(immf),
            ]

        # ---- verdict (the cycle after the last beat) -------------------------------------------
        # The engine holds the frame's CRC only in the cycle after its last beat: the next
        # frame's first beat may enter (and restart the engine) while the verdict waits for
        # room in ``vfifo``, so the comparison is kept from that cycle on.
        residues = icrc_residues(W)
        icrc_match = Signal()
        with m.Switch(p_z):
            for z in range(W):
                with m.Case(z):
                    m.d.comb += icrc_match.eq(icrc.crc == residues[z])
        p_icrc_ok = Signal()
        icrc_ok = Signal()
        m.d.comb += icrc_ok.eq(Mux(p_fresh, icrc_match, p_icrc_ok))
        with m.If(p_fresh):
            m.d.sync += [p_fresh.eq(0), p_icrc_ok.eq(icrc_match)]
        counters = {name: Signal(32, name=f"n_{name}") for name in ("accepted",) + DROP_REASONS}
        for name, sig in counters.items():
            m.d.comb += getattr(self.counters, name).eq(sig)
        accept = (p_pre == n_pre) & icrc_ok & (p_post == 4)
        v = Signal(verdict)
        wr_va = Mux(p_start, p_va, q_va[p_qp])
        length = Mux(p_start, p_dmalen, q_len[p_qp])
        # What the QP's format makes of the payload: FP32 bytes written (``out_bytes``).
        # (Plain expressions, no Switch: Icarus never runs an ``always @*`` block whose inputs
        # keep their initial values, and these would stay X.)
        codes = {f: i for i, f in enumerate(QUANT_FORMATS)}
        sel = [p_qp == i for i in range(self.num_qps)]
        fmt_raw = Signal(2)
        dim = Signal(16)
        m.d.comb += [
            fmt_raw.eq(_or_all([sel[i].replicate(2) & q_fmt[i]
                                for i in range(self.num_qps)])),
            dim.eq(_or_all([sel[i].replicate(16) & q_dim[i]
                            for i in range(self.num_qps)])),
        ]
        built = Const(sum(1 << codes[f] for f in self.formats), 4)
        fmt = Signal(2)
        m.d.comb += fmt.eq(Mux(built.bit_select(fmt_raw, 1), fmt_raw, 0))
        rows = Signal(range(pmtu + 1))
        out_bytes = Signal(16)
        if "int8" in self.formats:
            m.d.comb += rows.eq(p_plen // (dim + 8))
        m.d.comb += out_bytes.eq(Mux(fmt == codes["int8"], rows * (dim << 2),
                                     Mux(fmt == codes["none"], p_plen, p_plen << 1)))
        m.d.comb += [
            v.accept.eq(accept), v.wbeats.eq(p_wbeats), v.addr.eq(wr_va[LW:]),
            v.tail.eq(Mux(out_bytes[:LW] == 0, W, out_bytes[:LW])),
            v.complete.eq(accept & ~p_cont),
            v.qp.eq(p_qp), v.length.eq(length), v.imm.eq(p_imm), v.has_imm.eq(p_has_imm),
            v.obeats.eq((out_bytes + W - 1) >> LW), v.fmt.eq(fmt), v.dim.eq(dim),
            v.rows.eq(rows),
            vfifo.w_data.eq(v),
        ]
        with m.If(pend & vfifo.w_rdy):
            m.d.comb += vfifo.w_en.eq(1)
            m.d.sync += pend.eq(0)
            with m.If(p_pre != n_pre):
                with m.Switch(p_pre):
                    for i in range(n_pre):
                        with m.Case(i):
                            m.d.sync += counters[DROP_REASONS[i]].eq(counters[DROP_REASONS[i]] + 1)
            with m.Elif(~icrc_ok):
                m.d.sync += counters["icrc"].eq(counters["icrc"] + 1)
            with m.Elif(p_post != 4):
                with m.Switch(p_post):
                    for i, name in enumerate(("qp", "opcode", "psn", "length")):
                        with m.Case(i):
                            m.d.sync += counters[name].eq(counters[name] + 1)
            with m.Else():
                m.d.sync += [
                    counters["accepted"].eq(counters["accepted"] + 1),
                    q_psn[p_qp].eq(q_psn[p_qp] + 1), q_in[p_qp].eq(p_cont),
                    q_va[p_qp].eq(wr_va + out_bytes), q_len[p_qp].eq(length),
                    q_rem[p_qp].eq(Mux(p_start, p_dmalen, q_rem[p_qp]) - p_plen),
                ]
        # Host writes take effect when no verdict is being applied.
        m.d.comb += self.qp_init.ready.eq(~pend)
        with m.If(self.qp_init.valid & self.qp_init.ready):
            init = self.qp_init.payload
            m.d.sync += [q_psn[init.qp].eq(init.psn), q_in[init.qp].eq(0),
                         q_fmt[init.qp].eq(init.format), q_dim[init.qp].eq(init.dim)]

        # ---- drain: memory writes and completions ----------------------------------------------
        d = Signal(verdict)
        d_left = Signal(self.beats_width + 1)     # memory beats still to write
        in_left = Signal(self.beats_width + 1)    # payload FIFO beats still to take
        req_pending = Signal()
        mem = self.mem
        m.d.comb += [
            mem.resp.ready.eq(1),
            mem.req.valid.eq(req_pending),
            mem.req.payload.addr.eq(d.addr), mem.req.payload.beats.eq(d.obeats),
            mem.req.payload.write.eq(1),
            self.completion.payload.qp.eq(d.qp), self.completion.payload.length.eq(d.length),
            self.completion.payload.imm.eq(Mux(d.has_imm, d.imm, 0)),
            self.completion.payload.has_imm.eq(d.has_imm),
        ]
        with m.If(mem.req.valid & mem.req.ready):
            m.d.sync += req_pending.eq(0)
        tail_mask = Signal(W)
        with m.Switch(d.tail):
            for t in range(1, W + 1):
                with m.Case(t):
                    m.d.comb += tail_mask.eq((1 << t) - 1)
        last = d_left == 1
        wmask = Mux(last, tail_mask, (1 << W) - 1)
        written = mem.wdata.valid & mem.wdata.ready

        def after_write():
            with m.If(req_pending & ~mem.req.ready):
                m.next = "Request"
            with m.Elif(d.complete):
                m.next = "Complete"
            with m.Else():
                m.next = "Idle"

        codes = {f: i for i, f in enumerate(QUANT_FORMATS)}
        write_state = {"none": "Write", "fp16": "Widen", "bf16": "Widen", "int8": "Dequant"}
        with m.FSM(name="drain"):
            with m.State("Start"):
                # One cycle out of reset: the state change wakes Icarus's `always @*` blocks
                # that Amaranth's Verilog derives from this FSM (they would otherwise stay X
                # until the first packet, as Icarus does not run them at time zero).
                m.next = "Idle"
            with m.State("Idle"):
                m.d.comb += vfifo.r_en.eq(1)
                with m.If(vfifo.r_rdy):
                    nv = verdict(vfifo.r_data)
                    m.d.sync += [d.eq(vfifo.r_data), d_left.eq(nv.obeats),
                                 in_left.eq(nv.wbeats)]
                    with m.If(nv.accept & (nv.obeats != 0)):
                        m.d.sync += req_pending.eq(1)
                        with m.Switch(nv.fmt):
                            for f in self.formats:
                                with m.Case(codes[f]):
                                    m.next = write_state[f]
                    with m.Elif(nv.wbeats != 0):
                        m.next = "Discard"
                    with m.Elif(nv.complete):
                        m.next = "Complete"
            with m.State("Write"):
                m.d.comb += [
                    mem.wdata.valid.eq(pfifo.r_rdy), mem.wdata.payload.data.eq(pfifo.r_data),
                    mem.wdata.payload.mask.eq(wmask),
                    mem.wdata.payload.last.eq(last), pfifo.r_en.eq(mem.wdata.ready),
                ]
                with m.If(written):
                    m.d.sync += d_left.eq(d_left - 1)
                    with m.If(last):
                        after_write()
            if "fp16" in self.formats or "bf16" in self.formats:
                self._widen(m, d, pfifo, last, wmask, written, d_left, after_write, codes)
            if "int8" in self.formats:
                self._dequant(m, d, pfifo, last, written, d_left, in_left, req_pending)
            with m.State("Finish"):       # take what is left of the payload, then the request
                m.d.comb += pfifo.r_en.eq(in_left != 0)
                with m.If(pfifo.r_rdy & (in_left != 0)):
                    m.d.sync += in_left.eq(in_left - 1)
                with m.If(((in_left == 0) | ((in_left == 1) & pfifo.r_rdy))
                          & (~req_pending | mem.req.ready)):
                    m.next = "Request"
            with m.State("Request"):      # the request may still be waiting
                with m.If(~req_pending | mem.req.ready):
                    with m.If(d.complete):
                        m.next = "Complete"
                    with m.Else():
                        m.next = "Idle"
            with m.State("Discard"):
                m.d.comb += pfifo.r_en.eq(1)
                with m.If(pfifo.r_rdy):
                    m.d.sync += in_left.eq(in_left - 1)
                    with m.If(in_left == 1):
                        with m.If(d.complete):
                            m.next = "Complete"
                        with m.Else():
                            m.next = "Idle"
            with m.State("Complete"):
                m.d.comb += self.completion.valid.eq(1)
                with m.If(self.completion.ready):
                    m.next = "Idle"
        return m

    def _widen(self, m, d, pfifo, last, wmask, written, d_left, after_write, codes):
        """FP16/BF16 payload beats to FP32: two memory beats per payload beat."""
        from .fp import BF16ToFP32, FP16ToFP32
        W = self.data_bytes
        half = Signal()
        src = Mux(half, pfifo.r_data[4 * W:], pfifo.r_data[:4 * W])
        wide = {}
        for name, cls in (("fp16", FP16ToFP32), ("bf16", BF16ToFP32)):
            if name not in self.formats:
                continue
            wide[name] = Signal(8 * W, name=f"wide_{name}")
            for k in range(W // 4):
                u = m.submodules[f"{name}_to_fp32_{k}"] = cls(latency=0)
                m.d.comb += [u.a.eq(src[16 * k: 16 * k + 16]),
                             wide[name][32 * k: 32 * k + 32].eq(u.o)]
        if len(wide) == 2:
            out = Mux(d.fmt == codes["bf16"], wide["bf16"], wide["fp16"])
        else:
            (out,) = wide.values()
        with m.State("Widen"):
            m.d.comb += [
                self.mem.wdata.valid.eq(pfifo.r_rdy), self.mem.wdata.payload.data.eq(out),
                self.mem.wdata.payload.mask.eq(wmask), self.mem.wdata.payload.last.eq(last),
                pfifo.r_en.eq(self.mem.wdata.ready & (half | last)),
            ]
            with m.If(written):
                m.d.sync += [d_left.eq(d_left - 1), half.eq(~half & ~last)]
                with m.If(last):
                    after_write()

    def _dequant(self, m, d, pfifo, last, written, d_left, in_left, req_pending):
        """INT8 rows (scale, bias, codes) to FP32: one memory beat per ``data_bytes / 4``
        codes, through a byte buffer that the payload FIFO refills a beat at a time."""
        from math import gcd
        from .fp import FPAdd32, FPMul32, IntToFP32
        W = self.data_bytes
        L = W // 4
        gran = gcd(L, 8)
        buf = Signal(16 * W)                  # bytes 0..fill-1 valid
        fill = Signal(range(2 * W + 1))
        header = Signal(init=1)               # next: scale and bias (else codes)
        code_left = Signal(16)
        scale, bias = Signal(32), Signal(32)
        out = Signal(8 * W)
        for k in range(L):
            cv = m.submodules[f"i8_to_fp32_{k}"] = IntToFP32(width=8, signed=False, latency=0)
            mul = m.submodules[f"i8_mul_{k}"] = FPMul32(latency=0)
            add = m.submodules[f"i8_add_{k}"] = FPAdd32(latency=0)
            m.d.comb += [cv.a.eq(buf[8 * k: 8 * k + 8]), mul.a.eq(cv.o), mul.b.eq(scale),
                         add.a.eq(mul.o), add.b.eq(bias), out[32 * k: 32 * k + 32].eq(add.o)]
        need = Mux(header, 8, L)
        have = fill >= need
        pop = Signal()
        popped = Mux(pop, need, 0)
        rest = Signal(16 * W)
        rest_fill = Signal(range(2 * W + 1))
        m.d.comb += [rest.eq(Mux(pop, Mux(header, buf >> 64, buf >> (8 * L)), buf)),
                     rest_fill.eq(fill - popped)]
        refill = Signal()
        joined = Signal(16 * W)
        shifted = Array(Cat(Const(0, 8 * k), pfifo.r_data) for k in range(0, W + 1, gran))
        m.d.comb += joined.eq(rest | shifted[rest_fill // gran])
        with m.State("Dequant"):
            m.d.comb += [
                refill.eq((rest_fill <= W) & (in_left != 0) & pfifo.r_rdy),
                pfifo.r_en.eq(refill),
                self.mem.wdata.valid.eq(~header & have), self.mem.wdata.payload.data.eq(out),
                self.mem.wdata.payload.mask.eq((1 << W) - 1),
                self.mem.wdata.payload.last.eq(last),
                pop.eq(have & (header | self.mem.wdata.ready)),
            ]
            m.d.sync += [buf.eq(Mux(refill, joined, rest)),
                         fill.eq(rest_fill + Mux(refill, W, 0))]
            with m.If(refill):
                m.d.sync += in_left.eq(in_left - 1)
            with m.If(pop & header):
                m.d.sync += [scale.eq(buf[:32]), bias.eq(buf[32:64]), header.eq(0),
                             code_left.eq(d.dim >> (L.bit_length() - 1))]
            with m.If(written):
                m.d.sync += [d_left.eq(d_left - 1), code_left.eq(code_left - 1)]
                with m.If(code_left == 1):
                    m.d.sync += header.eq(1)
                with m.If(last):
                    m.d.sync += [buf.eq(0), fill.eq(0), header.eq(1)]
                    m.next = "Finish"
