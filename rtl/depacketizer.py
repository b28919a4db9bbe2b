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
LAST: the rest of the DMA length; none more than the path MTU). A dropped frame changes no QP state and writes nothing.

Timing
======

Store and forward per packet, pipelined for the clock (``Depacketizer._front``,
``_checks``, ``_verdict``, ``_drain``):

* the input beat is registered before anything is decided about it; the header type and the
  payload's end are decoded from the registered header beat, and the payload is realigned to
  beat boundaries and written to a FIFO (two path MTUs) from registers. ``frame`` takes one
  beat per cycle while the FIFOs have room (a registered test of their levels, with a reserve
  for what the stages still hold); the FIFOs are :class:`rtl.streams.CreditFIFO`, whose write
  enables are the writers' own, without a full check of their own; last beats are
  taken at least three cycles apart (a frame of one or two beats, at most ``2 * data_bytes``
  bytes, waits: the verdict of one updates the QP state the next is checked against, one
  cycle after the decision);
* the ICRC is computed in three stages (the engine registers its feed, then the feed's
  contribution) and checked through the CRC residue, so no field must be known in advance:
  the register is compared with every residue at once, then the frame's one is picked;
* the checks that need only the frame run in four stages after its last beat (the IP checksum
  as pairwise sums, a carry-save step and one adder), the QP's state is read and compared in a
  fifth, the verdict updates the counters and the verdict FIFO in a sixth, and the QP's state
  is written back (and forwarded to the next frame's read) in a seventh;
* the drain writes one beat per cycle with one cycle between packets; FP16/BF16 write two FP32
  beats per payload beat, INT8 one FP32 beat per ``data_bytes / 4`` codes plus a cycle per row
  for its scale and bias. The drain leaves reset through a one-cycle ``Start`` state.

The wide data registers (the beat, header and check stages' fields, the verdict's values,
each QP's address, bytes left and DMA length) have no reset: what they hold matters only
under a valid flag, a write enable or a QP's ``in`` flag, all of which reset; the reset net
no longer reaches every flip-flop of the datapath.

A packet's first memory write follows its last beat by about ten cycles
(``sim.timing.packetizer.RX_VERDICT_LATENCY`` is the timing model's figure).
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, Value, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .roce import (DROP_REASONS, ETHERTYPE_IPV4, HLEN_BY_HTYPE, ICRC_ALGORITHM, FrameBeat,
                   ICRCEngine, MAX_HEADER_LEN, OP_WRITE_FIRST, OP_WRITE_LAST, OP_WRITE_LAST_IMM,
                   OP_WRITE_MIDDLE, OP_WRITE_ONLY, OP_WRITE_ONLY_IMM, ROCE_UDP_PORT,
                   check_data_bytes, check_pmtu, header_type)
from .streams import CreditFIFO, MemPortSignature, PingPongBuffer, check_int

__all__ = ["QPInit", "Completion", "Counters", "Depacketizer", "icrc_residues"]


_HLEN = HLEN_BY_HTYPE
_htype = header_type
#: Payload FIFO entries kept free for the words the front's stages may still write after the
#: input saw room (four beat stages, the pending word, the registered room test).
_PFIFO_RESERVE = 8
#: Verdict FIFO depth, and entries kept free for the frames between the input and the verdict
#: (eight cycles, last beats at least three cycles apart, the registered room test).
_VFIFO_DEPTH = 16
_VFIFO_RESERVE = 6

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


def icrc_residues(data_bytes: int) -> list[int]:
    """The CRC engine's output after a valid codeword followed by ``z`` zero bytes, for
    ``z = 0 .. data_bytes - 1`` (the unused lanes of a frame's last beat)."""
    params = ICRC_ALGORITHM(8)
    body = list(b"\xff\xff\xff\xff" + bytes(range(20)))
    code = params.compute(body)
    stream_ = body + list(code.to_bytes(4, "little"))
    return [params.compute(stream_ + [0] * z) for z in range(data_bytes)]


class _Countdown:
    """A down-counter with its ``== 0`` and ``== 1`` tests registered beside it (updated by
    :meth:`load` and :meth:`step`, the only writes), so what reads them sees a flip-flop."""

    def __init__(self, name: str, width: int):
        self.value = Signal(width, name=name)
        self.zero = Signal(name=f"{name}_zero", init=1)
        self.one = Signal(name=f"{name}_one")

    def load(self, n):
        return [self.value.eq(n), self.zero.eq(n == 0), self.one.eq(n == 1)]

    def step(self):
        """Count one down (the caller makes sure it is not zero)."""
        return [self.value.eq(self.value - 1), self.zero.eq(self.one),
                self.one.eq(self.value == 2)]


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
        max_beats = self.pmtu // W
        # Payload FIFO: two path MTUs of realigned payload beats, plus what the front's stages
        # may still write after the input saw room. Both queues are ``CreditFIFO``s: the input's
        # registered room test keeps them from overflowing, so their write enables are the
        # writers' own (no level compare in front of the memory's write enable).
        m.submodules.pfifo = pfifo = CreditFIFO(width=8 * W,
                                                depth=2 * max_beats + 4 + _PFIFO_RESERVE)
        verdict = self._verdict_layout()
        m.submodules.vfifo = vfifo = CreditFIFO(width=verdict.size, depth=_VFIFO_DEPTH)
        # the two queues of the latest elaboration, for simulations that check their writers'
        # contract (no write while ``w_rdy`` is low)
        self.queues = {"payload": pfifo, "verdict": vfifo}
        # The drain reads the payload through a two-entry PingPongBuffer: the drain's read
        # enable (the end of its state logic) then reaches the buffer's pointer and two flags,
        # not the enable of the queue's wide read register, which the buffer's registered
        # ready drives instead. Read straight from the queue, the drain's state -> its read
        # enable -> the queue's read logic was the critical path (119.1 MHz, 7 ns of routing).
        m.submodules.pout = pout = PingPongBuffer(unsigned(8 * W))
        m.d.comb += [pout.i.valid.eq(pfifo.r_rdy), pout.i.payload.eq(pfifo.r_data),
                     pfifo.r_en.eq(pout.i.ready)]
        payload_out = SimpleNamespace(r_data=pout.o.payload, r_rdy=pout.o.valid,
                                      r_en=pout.o.ready)
        m.submodules.icrc = icrc = ICRCEngine(W, stages=3)
        tables = self._qp_tables()
        # the state the verdict's write-back is writing to a QP this cycle (forwarded to the read)
        fwd = {"valid": Signal(name="fwd_valid"), "qp": Signal(self.qp_bits, name="fwd_qp"),
               **{k: Signal(len(tables[k][0]), name=f"fwd_{k}")
                  for k in ("psn", "in", "va", "rem", "len")}}
        frame = self._front(m, pfifo, vfifo, icrc)
        checked = self._checks(m, frame, icrc, tables, fwd)
        self._verdict(m, checked, vfifo, verdict, tables, fwd)
        self._drain(m, payload_out, vfifo, verdict)
        return m

    def _verdict_layout(self) -> data.StructLayout:
        """What the verdict stage hands the drain for each frame."""
        return data.StructLayout({
            "accept": 1, "wbeats": self.beats_width + 1, "addr": self.addr_width,
            "tail": range(self.data_bytes + 1), "complete": 1, "qp": self.qp_bits,
            "length": 32, "imm": 32, "has_imm": 1, "obeats": self.beats_width + 1, "fmt": 2,
            "dim": 16, "rows": range(self.pmtu + 1),
        })

    def _qp_tables(self) -> dict:
        """Per-QP state: next PSN, in a message, next address, bytes left, DMA length (set by
        verdicts); wire format and row length (set by the host through ``qp_init``)."""
        def qtable(name, width, reset_less=False):
            return Array(Signal(width, name=f"{name}{i}", reset_less=reset_less)
                         for i in range(self.num_qps))
        # the address, bytes left and DMA length are read only inside a message (``in``), and
        # set by its FIRST or ONLY packet: no reset
        return {"psn": qtable("q_psn", 24), "in": qtable("q_in", 1),
                "va": qtable("q_va", 64, True), "rem": qtable("q_rem", 32, True),
                "len": qtable("q_len", 32, True),
                "fmt": qtable("q_fmt", 2), "dim": qtable("q_dim", 16)}

    def _front(self, m, pfifo, vfifo, icrc) -> dict:
        """Input, header capture, ICRC feed and the payload's path into ``pfifo``.

        Four beat stages that advance every cycle (``s0`` the registered input beat, ``s1`` and
        ``s2`` with the frame's payload bounds decoded from its header beat, ``s3`` the
        realigned words to write), so no decision about a beat is made on the input wires: the
        input is ready when the FIFOs have room for everything the stages may still write
        (a registered comparison of their levels). A frame writes at most one word per beat,
        and two at its last beat (the word completed there and the tail it leaves): the second
        waits one cycle in ``pend``, which the next frame's first beat, or any idle cycle,
        empties (a first beat writes nothing unless it is also the frame's last, and then only
        one word).

        Returns the signals the checks take at a frame's last beat (in ``s1``): its header
        snapshot, beat index and byte count, and, in ``s3``, the number of words written.
        """
        W = self.data_bytes
        LW = W.bit_length() - 1
        HW = -(-MAX_HEADER_LEN // W)
        KF = 43 // W               # the beat holding the IP total length, opcode and pad count
        fr = self.frame
        fire = fr.valid & fr.ready

        # ---- input --------------------------------------------------------------------------
        room = Signal()
        last_recent = Signal(2)    # a last beat was taken one / two cycles ago
        m.d.comb += fr.ready.eq(room & ~(fr.payload.last & last_recent.any()))
        m.d.sync += [
            room.eq((pfifo.level <= pfifo.depth - _PFIFO_RESERVE)
                    & (vfifo.level <= vfifo.depth - _VFIFO_RESERVE)),
            last_recent.eq(Cat(fire & fr.payload.last, last_recent[0])),
        ]
        b = Signal(10)             # index of the next beat in its frame (saturating)
        hdr = Signal(8 * HW * W, reset_less=True)   # the header beats of the frame coming in
        with m.If(fire):
            for k in range(HW):
                with m.If(b == k):
                    m.d.sync += hdr.word_select(k, 8 * W).eq(fr.payload.data)
            m.d.sync += b.eq(Mux(fr.payload.last, 0, Mux(b == (1 << len(b)) - 1, b, b + 1)))

        def beat_stage(name, v_in, fields):
            # only the write enables keep a reset; the rest matters only under ``v``
            regs = {k: Signal(Value.cast(v).shape(), name=f"{name}_{k}",
                              reset_less=k not in ("ea", "eb")) for k, v in fields.items()}
            v = Signal(name=f"{name}_valid")
            m.d.sync += [v.eq(v_in)] + [regs[k].eq(fields[k]) for k in fields]
            return v, regs

        # the ICRC's masks of this beat are decided on the input and registered with it: which
        # bytes are inside the frame, and which beat of the header this is
        special = {p: 0 for p in range(10)}
        special.update({p: 0xFF for p in (10, 11, 12, 13, 15, 22, 24, 25, 40, 41, 46)})
        mask_beats = sorted({p // W for p in special})
        v0, s0 = beat_stage("s0", fire, {
            "data": fr.payload.data, "last": fr.payload.last, "count": fr.payload.count, "b": b,
            "keep": Cat(*[~fr.payload.last | (fr.payload.count > i) for i in range(W)]),
            "first": b == 0, **{f"at{k}": b == k for k in mask_beats}})
        v1, s1 = beat_stage("s1", v0, {k: s0[k] for k in ("data", "last", "count", "b")})
        v2, s2 = beat_stage("s2", v1, {k: s1[k] for k in ("data", "last", "b")})

        # ---- ICRC: the frame as it is, variant fields masked, bytes past the end zeroed ------
        masked = [s0["data"][8 * i: 8 * i + 8] for i in range(W)]
        for p, value in special.items():
            masked[p % W] = Mux(s0[f"at{p // W}"], value, masked[p % W])
        feed = Signal(8 * W)
        for i in range(W):
            m.d.comb += feed[8 * i: 8 * i + 8].eq(Mux(s0["keep"][i], masked[i], 0))
        m.d.comb += [icrc.data.eq(feed), icrc.valid.eq(v0), icrc.start.eq(v0 & s0["first"])]

        # ---- the header snapshot the checks read (words past a short frame's end are stale,
        # as they would be in the live header) ------------------------------------------------
        snap = Signal(8 * HW * W, reset_less=True)
        with m.If(v0 & (s0["last"] | (s0["b"] == HW - 1))):
            m.d.sync += snap.eq(hdr)

        # ---- payload bounds: s1 decodes the header type and the payload's end ----------------
        def hbyte(i):
            return hdr[8 * i: 8 * i + 8]
        opcode = hbyte(42)
        fp1_htype = Signal(2)
        fp1_payend = Signal(17)    # header + payload bytes: IP total length + 14 - 4 - pad
        with m.If(v0 & (s0["b"] == KF)):
            m.d.sync += [fp1_htype.eq(_htype(opcode)),
                         fp1_payend.eq(Cat(hbyte(17), hbyte(16)) + 10 - hbyte(43)[4:6])]
        # s2: the last beat that completes a payload word (E1 = ceil((payend - s) / W), with
        # s = hlen mod W); none when the payload would exceed the path MTU
        q_of = [_HLEN[ht] >> LW for ht in range(4)]
        s_of = [_HLEN[ht] % W for ht in range(4)]
        fp2_htype = Signal(2)
        fp2_e1 = Signal(13)
        e1 = Signal(13)
        too_long = Signal()
        m.d.comb += [
            e1.eq((fp1_payend + Array(Const(W - 1 - s, 8) for s in s_of)[fp1_htype]) >> LW),
            too_long.eq(fp1_payend > Array(Const(self.pmtu + _HLEN[ht], 14)
                                           for ht in range(4))[fp1_htype]),
        ]
        with m.If(v1 & (s1["b"] == KF)):
            m.d.sync += [fp2_htype.eq(fp1_htype),
                         fp2_e1.eq(Mux(too_long, Array(Const(q, 4) for q in q_of)[fp1_htype],
                                       e1))]

        # ---- s3: the words to write ------------------------------------------------------------
        # payload word j (frame bytes hlen + jW ..) completes at beat q + 1 + j; the last beat
        # also flushes the word it started
        b2 = s2["b"]
        after_q = Array(b2 > q for q in q_of)[fp2_htype]
        from_q = Array(b2 >= q for q in q_of)[fp2_htype]
        emit = v2 & after_q & (b2 <= fp2_e1)
        emit2 = v2 & s2["last"] & from_q & (b2 < fp2_e1)
        prev = Signal(8 * W, reset_less=True)
        realigned = Signal(8 * W)
        flushed = Signal(8 * W)
        both = Cat(prev, s2["data"])
        with m.Switch(fp2_htype):
            for ht in range(4):
                with m.Case(ht):
                    m.d.comb += [realigned.eq(both.bit_select(8 * s_of[ht], 8 * W)),
                                 flushed.eq(s2["data"] >> (8 * s_of[ht]))]
        with m.If(v2):
            m.d.sync += prev.eq(s2["data"])
        v3, s3 = beat_stage("s3", v2, {"ea": emit, "wa": realigned, "eb": emit2,
                                       "wb": flushed, "last": s2["last"]})
        pend, pend_data = Signal(), Signal(8 * W, reset_less=True)
        m.d.comb += [pfifo.w_en.eq(pend | s3["ea"] | s3["eb"]),
                     pfifo.w_data.eq(Mux(pend, pend_data, Mux(s3["ea"], s3["wa"], s3["wb"])))]
        m.d.sync += [pend.eq((pend & (s3["ea"] | s3["eb"])) | (s3["ea"] & s3["eb"])),
                     pend_data.eq(Mux(pend, Mux(s3["ea"], s3["wa"], s3["wb"]), s3["wb"]))]
        wcount = Signal(self.beats_width + 1)
        wbeats = Signal(self.beats_width + 1)
        m.d.comb += wbeats.eq(wcount + s3["ea"] + s3["eb"])
        with m.If(v3):
            m.d.sync += wcount.eq(Mux(s3["last"], 0, wbeats))
        return {"last": v1 & s1["last"], "snap": snap, "b": s1["b"], "count": s1["count"],
                "wbeats_valid": v3 & s3["last"], "wbeats": wbeats}

    def _checks(self, m, frame, icrc, tables, fwd) -> dict:
        """Every check that does not read a QP's state, in four frame stages after the last
        beat (``k1`` .. ``k4``), each at most one adder or comparator deep: the header fields
        and the pairwise checksum sums, then the lengths and the checksum's partial sums, then
        its full sum (carry-save) and the ICRC register against every residue, then the
        checksum's test and the frame's residue. ``k4`` also registers the
        frame's QP state, read from the tables, or forwarded from ``fwd`` when the verdict's
        write-back stage writes that QP in the same cycle (the previous frame's update)."""
        W = self.data_bytes
        LW = W.bit_length() - 1
        pmtu = self.pmtu
        snap = frame["snap"]

        def byte(i):
            return snap[8 * i: 8 * i + 8]

        def field(offset, n):
            return Cat(*[byte(offset + n - 1 - k) for k in range(n)])

        def stage(name, v_in, fields):
            regs = {k: Signal(Value.cast(v).shape(), name=f"{name}_{k}", reset_less=True)
                    for k, v in fields.items()}
            v = Signal(name=f"{name}_valid")
            m.d.sync += [v.eq(v_in)] + [regs[k].eq(fields[k]) for k in fields]
            return v, regs

        opcode = byte(42)
        htype = Signal(2)
        m.d.comb += htype.eq(_htype(opcode))
        dqpn = field(47, 3)
        qp = dqpn[:self.qp_bits]
        iplen = field(16, 2)
        hlen_m10 = Array(Const(h - 10, 7) for h in _HLEN)[htype]
        k1v, k1 = stage("k1", frame["last"], {
            "flen_m1": Cat((frame["count"] - 1)[:LW], frame["b"]),
            "iplen": iplen, "iplen13": iplen + 13,
            "eth_ok": field(12, 2) == ETHERTYPE_IPV4, "ver_ok": byte(14) == 0x45,
            "udp_ok": (byte(23) == 17) & (field(36, 2) == ROCE_UDP_PORT),
            "is_only": (opcode == OP_WRITE_ONLY) | (opcode == OP_WRITE_ONLY_IMM),
            "is_last": (opcode == OP_WRITE_LAST) | (opcode == OP_WRITE_LAST_IMM),
            "is_first": opcode == OP_WRITE_FIRST, "is_middle": opcode == OP_WRITE_MIDDLE,
            "immf": htype[0], "qp": qp, "qp_ok": dqpn < self.num_qps,
            "psn": field(51, 3), "dmalen": field(66, 4), "va": field(54, 8),
            "imm": Mux(opcode == OP_WRITE_ONLY_IMM, field(70, 4), field(54, 4)),
            "pad": byte(43)[4:6], "z": (W - frame["count"])[:max(1, LW)],
            # IP total length + 14 - hlen - 4 (the payload length before the pad)
            "x": (iplen - hlen_m10).as_signed(),
            "fmt": tables["fmt"][qp], "dim": tables["dim"][qp],
            **{f"c{k}": field(14 + 4 * k, 2) + field(16 + 4 * k, 2) for k in range(5)},
        })
        keep = ("is_only", "is_last", "is_first", "is_middle", "immf", "qp", "qp_ok", "psn",
                "dmalen", "va", "imm", "eth_ok", "ver_ok", "udp_ok", "fmt", "dim")
        # the ICRC register holds the frame's CRC in k2's cycle (three engine stages after the
        # last beat's feed in s0; the next frame's feed reaches it one cycle later at the
        # earliest): k3 registers its comparison with each residue, k4 the frame's one
        residues = icrc_residues(W)
        k2v, k2 = stage("k2", k1v, {
            **{k: k1[k] for k in keep}, "z": k1["z"],
            "short": k1["flen_m1"] < 33, "ip_long": k1["iplen13"] > k1["flen_m1"],
            "ip_bad": (k1["iplen13"] < k1["flen_m1"]) | (k1["iplen"] < 44),
            "plen": k1["x"] - k1["pad"],
            "r0": k1["c0"] + k1["c1"], "r1": k1["c2"] + k1["c3"], "r2": k1["c4"],
        })
        # checksum: the three partial sums by carry-save, then one adder
        r0, r1, r2 = (k2[k].as_unsigned() for k in ("r0", "r1", "r2"))
        csa_x = Signal(20)
        csa_y = Signal(20)
        m.d.comb += [csa_x.eq(r0 ^ r1 ^ r2), csa_y.eq(((r0 & r1) | (r0 & r2) | (r1 & r2)) << 1)]
        plen = k2["plen"]
        rows = Signal(range(pmtu + 1))
        if "int8" in self.formats:
            m.d.comb += rows.eq(plen[:13] // (k2["dim"] + 8))
        k3v, k3 = stage("k3", k2v, {
            **{k: k2[k] for k in keep + ("z", "short", "ip_long", "ip_bad")},
            "icrc_eq": Cat(*[icrc.crc == r for r in residues]),
            "sum": csa_x + csa_y, "plen": plen, "plen13": plen[:13], "plen_neg": plen < 0,
            "plen_pmtu": plen == pmtu, "plen_zero": plen == 0,
            "only_ok": (plen >= 0) & (plen <= pmtu) & (plen.as_unsigned() == k2["dmalen"]),
            "first_ok": (plen == pmtu) & (k2["dmalen"] > pmtu), "rows": rows,
            "wbeats": frame["wbeats"],
        })
        # What the QP's format makes of the payload: FP32 bytes written.
        codes = {f: i for i, f in enumerate(QUANT_FORMATS)}
        built = Const(sum(1 << codes[f] for f in self.formats), 4)
        fmt = Mux(built.bit_select(k3["fmt"], 1), k3["fmt"], 0)
        out_bytes = Mux(fmt == codes["int8"], k3["rows"] * (k3["dim"] << 2),
                        Mux(fmt == codes["none"], k3["plen13"], k3["plen13"] << 1))[:16]
        s = k3["sum"]
        qp3 = k3["qp"]
        hit = fwd["valid"] & (fwd["qp"] == qp3)
        state = {f"r_{k}": Mux(hit, fwd[k], tables[k][qp3]) for k in ("psn", "in", "va", "rem",
                                                                          "len")}
        k4v, k4 = stage("k4", k3v, {
            **state,
            "icrc_ok": k3["icrc_eq"].bit_select(k3["z"], 1),
            **{k: k3[k] for k in keep + ("short", "ip_long", "ip_bad", "plen", "plen13",
                                         "plen_neg", "plen_pmtu", "plen_zero", "only_ok",
                                         "first_ok", "rows", "wbeats")},
            # ones' complement sum == 0xFFFF, for a sum of ten words (s[16:] <= 9)
            "csum_ok": s[:16] == Cat(~s[16:20], Const(0xFFF, 12)),
            "out_bytes": out_bytes, "fmt": fmt,
        })
        # a frame is in the checks, or enters them next cycle
        return {"valid": k4v, **k4, "busy": frame["last"] | k1v | k2v | k3v | k4v}

    def _verdict(self, m, k4, vfifo, verdict, tables, fwd):
        """The checks that read a QP's state, the verdict, the counters and the QP updates.

        Three stages after ``k4`` (which holds the QP's state as read): ``v1`` compares it
        (PSN, opcode sequence, remaining length), each comparison registered on its own beside
        two flags for the checks passed so far and the QP's one-hot select, and computes the
        state the QP would take; ``v2`` decides, counts, writes the verdict and
        registers the QP's update (``w``: the new state and a one-hot select of the QP, so the
        decision drives 16 flip-flops, not every QP's table); ``w`` writes the table and
        forwards the update to ``k4``'s read of the next frame. Last beats are at least three
        cycles apart (see :meth:`_front`), so the next frame reads in ``w``'s cycle at the
        earliest.
        """
        W = self.data_bytes
        LW = W.bit_length() - 1
        pmtu = self.pmtu
        n_pre = 6
        pre = Signal(range(n_pre + 1))     # index into DROP_REASONS[:6], n_pre when all pass
        with m.If(k4["short"]):
            m.d.comb += pre.eq(0)
        with m.Elif(~k4["eth_ok"]):
            m.d.comb += pre.eq(1)
        with m.Elif(~k4["ver_ok"]):
            m.d.comb += pre.eq(2)
        with m.Elif(k4["ip_long"]):
            m.d.comb += pre.eq(0)
        with m.Elif(k4["ip_bad"]):
            m.d.comb += pre.eq(3)
        with m.Elif(~k4["csum_ok"]):
            m.d.comb += pre.eq(4)
        with m.Elif(~k4["udp_ok"]):
            m.d.comb += pre.eq(5)
        with m.Else():
            m.d.comb += pre.eq(n_pre)
        start = k4["is_first"] | k4["is_only"]
        in_msg, rem = k4["r_in"], k4["r_rem"]
        # v1 registers each comparison with the QP's state on its own; v2 combines them.
        v1_flags = {
            "qp_ok": k4["qp_ok"],
            "seq_bad": Mux(in_msg, ~(k4["is_middle"] | k4["is_last"]), ~start),
            "psn_ok": k4["psn"] == k4["r_psn"],
            # the length check by opcode (FIRST/ONLY: from the frame alone; MIDDLE: a full
            # packet with more than a packet left; LAST: exactly what is left)
            "len_frame": ~k4["plen_neg"] & ((k4["is_only"] & k4["only_ok"])
                                            | (k4["is_first"] & k4["first_ok"])),
            "len_middle": ~k4["plen_neg"] & k4["is_middle"] & k4["plen_pmtu"] & (rem > pmtu),
            "len_last": ~k4["plen_neg"] & ~(k4["is_only"] | k4["is_first"] | k4["is_middle"])
                        & (k4["plen"] == rem) & ~k4["plen_zero"],
        }
        f1 = {k: Signal(name=f"v1_{k}") for k in v1_flags}
        m.d.sync += [f1[k].eq(v) for k, v in v1_flags.items()]
        len_ok = f1["len_frame"] | f1["len_middle"] | f1["len_last"]
        # The checks a verdict's frame has already passed, combined in v1 from k4's flags (two
        # LUT levels, beside the PSN and length compares), so that v2's decision is these
        # flags and the two compares: ``v1_front`` (a frame, every check up to and including
        # the ICRC passed), ``v1_upto_psn`` (and its QP is valid, its opcode in sequence).
        # Why: v2 combined every flag and then the QP's one-hot select (the last critical path:
        # v1_icrc_ok -> five LUTs -> w_sel, 115.3 MHz).
        front_ok = k4["valid"] & (pre == n_pre) & k4["icrc_ok"]
        v1_front, v1_upto_psn = Signal(), Signal()
        v1_sel = Signal(self.num_qps)      # the frame's QP, one-hot
        m.d.sync += [v1_front.eq(front_ok),
                     v1_upto_psn.eq(front_ok & v1_flags["qp_ok"] & ~v1_flags["seq_bad"]),
                     v1_sel.eq(1 << k4["qp"])]
        accept = Signal()                  # a frame, and it passes every check
        m.d.comb += accept.eq(v1_upto_psn & f1["psn_ok"] & len_ok)
        wr_va = Mux(start, k4["va"], k4["r_va"])
        v1 = {k: Signal.like(k4[k], name=f"v1_{k}") for k in
              ("qp", "icrc_ok", "wbeats", "imm", "immf", "out_bytes", "fmt", "dim", "rows",
               "plen13")}
        v1_valid, v1_pre, v1_pre_ok = Signal(), Signal.like(pre), Signal()
        v1_cont, v1_start = Signal(), Signal()
        v1_va, v1_va_next, v1_len, v1_rem = (Signal(n, reset_less=True) for n in (64, 64, 32, 32))
        v1_psn = Signal(24, reset_less=True)
        m.d.sync += [v1_valid.eq(k4["valid"]), v1_pre.eq(pre), v1_pre_ok.eq(pre == n_pre),
                     v1_cont.eq(k4["is_first"] | k4["is_middle"]), v1_start.eq(start),
                     v1_va.eq(wr_va), v1_va_next.eq(wr_va + k4["out_bytes"]),
                     v1_len.eq(Mux(start, k4["dmalen"], k4["r_len"])),
                     v1_rem.eq(Mux(start, k4["dmalen"], rem) - k4["plen13"]),
                     v1_psn.eq(k4["r_psn"] + 1)]
        m.d.sync += [v1[k].eq(k4[k]) for k in v1]

        # ---- v2: decide, count, hand the verdict to the drain, update the QP ----------------
        counters = {name: Signal(32, name=f"n_{name}") for name in ("accepted",) + DROP_REASONS}
        for name, sig in counters.items():
            m.d.comb += getattr(self.counters, name).eq(sig)
        out_bytes = v1["out_bytes"]
        v = Signal(verdict)
        m.d.comb += [
            v.accept.eq(accept), v.wbeats.eq(v1["wbeats"]), v.addr.eq(v1_va[LW:]),
            v.tail.eq(Mux(out_bytes[:LW] == 0, W, out_bytes[:LW])),
            v.complete.eq(accept & ~v1_cont),
            v.qp.eq(v1["qp"]), v.length.eq(v1_len), v.imm.eq(v1["imm"]),
            v.has_imm.eq(v1["immf"]), v.obeats.eq((out_bytes + W - 1) >> LW),
            v.fmt.eq(v1["fmt"]), v.dim.eq(v1["dim"]), v.rows.eq(v1["rows"]),
            vfifo.w_data.eq(v), vfifo.w_en.eq(v1_valid),
        ]
        q = v1["qp"]
        # each frame counted once, under the first reason it fails (DROP_REASONS' order)
        counted = {
            **{DROP_REASONS[i]: v1_valid & ~v1_pre_ok & (v1_pre == i) for i in range(n_pre)},
            "icrc": v1_valid & v1_pre_ok & ~v1["icrc_ok"],
            "qp": v1_front & ~f1["qp_ok"],
            "opcode": v1_front & f1["qp_ok"] & f1["seq_bad"],
            "psn": v1_upto_psn & ~f1["psn_ok"],
            "length": v1_upto_psn & f1["psn_ok"] & ~len_ok,
            "accepted": accept,
        }
        for name, en in counted.items():
            with m.If(en):
                m.d.sync += counters[name].eq(counters[name] + 1)
        # w: the accepted frame's update of its QP, registered, written the next cycle
        w_sel = Signal(self.num_qps)
        w = {"psn": Signal(24, name="w_psn", reset_less=True),
             "in": Signal(name="w_in", reset_less=True),
             "va": Signal(64, name="w_va", reset_less=True),
             "rem": Signal(32, name="w_rem", reset_less=True),
             "len": Signal(32, name="w_len", reset_less=True)}
        w_valid, w_qp = Signal(), Signal(self.qp_bits)
        m.d.sync += [w_sel.eq(Mux(accept, v1_sel, 0)), w_valid.eq(accept),
                     w_qp.eq(q), w["psn"].eq(v1_psn), w["in"].eq(v1_cont),
                     w["va"].eq(v1_va_next), w["rem"].eq(v1_rem), w["len"].eq(v1_len)]
        for i in range(self.num_qps):
            with m.If(w_sel[i]):
                m.d.sync += [tables[k][i].eq(w[k]) for k in w]
        m.d.comb += [fwd["valid"].eq(w_valid), fwd["qp"].eq(w_qp),
                     *[fwd[k].eq(w[k]) for k in w]]
        # Host writes take effect when no frame is being checked or written back: ready is
        # registered, from the stages one cycle earlier (each moves on every cycle).
        init_ready = Signal()
        m.d.sync += init_ready.eq(~(k4["busy"] | v1_valid))
        m.d.comb += self.qp_init.ready.eq(init_ready)
        with m.If(self.qp_init.valid & self.qp_init.ready):
            init = self.qp_init.payload
            m.d.sync += [tables["psn"][init.qp].eq(init.psn), tables["in"][init.qp].eq(0),
                         tables["fmt"][init.qp].eq(init.format),
                         tables["dim"][init.qp].eq(init.dim)]

    def _drain(self, m, pfifo, vfifo, verdict):
        """Memory writes and completions: one verdict at a time, its payload from ``pfifo``
        (written, widened, dequantized or discarded).

        The counters' tests (last memory beat, payload left) and the last beat's byte mask are
        registered flags, updated with the counters, so the memory port's outputs and the
        FIFO's read enable are a state decode and a mux from registers."""
        W = self.data_bytes
        LW = W.bit_length() - 1
        d = Signal(verdict)
        d_left = _Countdown("d_left", self.beats_width + 1)   # memory beats still to write
        in_left = _Countdown("in_left", self.beats_width + 1)  # payload FIFO beats to take
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
        tail_mask = Signal(W)                     # the last memory beat's bytes
        last = d_left.one
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
                    m.d.sync += [d.eq(vfifo.r_data), *d_left.load(nv.obeats),
                                 *in_left.load(nv.wbeats)]
                    with m.Switch(nv.tail):
                        for t in range(1, W + 1):
                            with m.Case(t):
                                m.d.sync += tail_mask.eq((1 << t) - 1)
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
                    m.d.sync += d_left.step()
                    with m.If(last):
                        after_write()
            if "fp16" in self.formats or "bf16" in self.formats:
                self._widen(m, d, pfifo, last, wmask, written, d_left, after_write, codes)
            if "int8" in self.formats:
                self._dequant(m, d, pfifo, last, written, d_left, in_left, req_pending)
            with m.State("Finish"):       # take what is left of the payload, then the request
                m.d.comb += pfifo.r_en.eq(~in_left.zero)
                with m.If(pfifo.r_rdy & ~in_left.zero):
                    m.d.sync += in_left.step()
                with m.If((in_left.zero | (in_left.one & pfifo.r_rdy))
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
                    m.d.sync += in_left.step()
                    with m.If(in_left.one):
                        with m.If(d.complete):
                            m.next = "Complete"
                        with m.Else():
                            m.next = "Idle"
            with m.State("Complete"):
                m.d.comb += self.completion.valid.eq(1)
                with m.If(self.completion.ready):
                    m.next = "Idle"

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
                m.d.sync += [*d_left.step(), half.eq(~half & ~last)]
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
                refill.eq((rest_fill <= W) & ~in_left.zero & pfifo.r_rdy),
                pfifo.r_en.eq(refill),
                self.mem.wdata.valid.eq(~header & have), self.mem.wdata.payload.data.eq(out),
                self.mem.wdata.payload.mask.eq((1 << W) - 1),
                self.mem.wdata.payload.last.eq(last),
                pop.eq(have & (header | self.mem.wdata.ready)),
            ]
            m.d.sync += [buf.eq(Mux(refill, joined, rest)),
                         fill.eq(rest_fill + Mux(refill, W, 0))]
            with m.If(refill):
                m.d.sync += in_left.step()
            with m.If(pop & header):
                m.d.sync += [scale.eq(buf[:32]), bias.eq(buf[32:64]), header.eq(0),
                             code_left.eq(d.dim >> (L.bit_length() - 1))]
            with m.If(written):
                m.d.sync += [*d_left.step(), code_left.eq(code_left - 1)]
                with m.If(code_left == 1):
                    m.d.sync += header.eq(1)
                with m.If(last):
                    m.d.sync += [buf.eq(0), fill.eq(0), header.eq(1)]
                    m.next = "Finish"
