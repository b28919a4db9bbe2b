"""Timing model of the packetizer and depacketizer: cycles and bus occupancy from message
sizes, without simulating the RTL.

The packetizer sends one frame beat per cycle; a frame of ``F`` bytes (header, payload, pad,
ICRC) is ``ceil(F / data_bytes)`` beats, and frames follow each other without gaps while
payload and descriptors keep up. Starting from idle costs ``TX_STARTUP`` cycles (descriptor
accepted, packet planned, first beat registered). The depacketizer takes one beat per cycle (at
least ``RX_MIN_FRAME_CYCLES`` cycles a frame); its drain writes each packet's payload beats
plus one cycle per packet (FP16/BF16: two FP32 beats per payload beat), ``RX_VERDICT_LATENCY`` cycles after the packet's last beat and after
the previous packet's drain (the payload FIFO holds two packets, so a slower drain decides the
end).

INT8 (rows of ``dim`` elements, ``L = data_bytes / 4`` elements a beat, ``R = dim / L``
beats a row): the quantizer pipelines rows through four slots (ingest, range, divide, emit).
Ingest takes ``R`` cycles a row; the two divisions run side by side and a new pair starts as
the previous results land, so the dividers finish a row every ``FPDiv32`` latency
(``ceil(27 / div_bits_per_cycle) + 2``, 5 at the default 9 bits a cycle); emitting a row
takes ``R`` cycles of codes (plus one for scale and bias when they cannot share the first
codes' chunk, ``8 + L > data_bytes``), and a packet adds its zero fill (``ceil(fill /
data_bytes)`` cycles) and the cycles its header beats hold the gearbox (``header //
data_bytes``). A packet of ``n`` rows takes the slowest of the three stages, ``max(n * R,
n * latency, n * (R + header cycle) + fill + header beats)`` cycles (the ring of slots
absorbs the jitter), and the first row waits ``INT8_LATENCY + R + latency`` cycles for the
pipeline to fill. The
receiver restores a row in ``1 + dim / L`` cycles (scale and bias, then one FP32 beat per
``L`` codes) plus ``INT8_RX_PACKET`` cycles a packet.
"""

from __future__ import annotations

from dataclasses import dataclass

from neonic.rtl.roce import (BASE_HEADER_LEN, ICRC_LEN, OP_WRITE_MIDDLE, check_data_bytes,
                             check_pmtu, header_len)
from neonic.sim.reference.roce import INT8_ROW_EXTRA, segment, wire_length

__all__ = ["packet_cycles", "payload_gbps", "TX_STARTUP", "RX_VERDICT_LATENCY", "RX_TAIL", "RX_MIN_FRAME_CYCLES", "INT8_LATENCY", "INT8_DIV_BITS", "INT8_RX_PACKET", "int8_divider_latency", "frame_bytes", "TxEstimate",
           "estimate_tx", "estimate_rx"]

#: From idle to the first frame beat: descriptor accepted, the destination row's read, three
#: plan stages, the generator's load, three output registers (measured on the RTL,
#: `tests/rtl/test_packetizer_loopback.py`).
TX_STARTUP = 8
#: Depacketizer cycles from the end of a frame's beats to its drain starting (the checks'
#: and verdict's stages, the verdict FIFO), and from the last drained packet to its last memory
#: write leaving (both measured on the RTL, `neonic bench packetizer`'s timing-model error).
RX_VERDICT_LATENCY = 4
RX_TAIL = 3
#: Depacketizer input cycles a frame takes at least: its last beat waits until three cycles
#: after the previous frame's (the QP state a frame is checked against is written back one
#: cycle after the previous frame's verdict; `rtl.depacketizer`). Only frames of one or two
#: beats notice.
RX_MIN_FRAME_CYCLES = 3
#: Pipeline fill of the INT8 quantizer beyond a row's ingest and the divider latency (range
#: register, launch, hand-off to the output stage, gearbox).
INT8_LATENCY = 3
#: ``div_bits_per_cycle`` of :class:`rtl.packetizer.Packetizer` by default.
INT8_DIV_BITS = 9
#: Receiver cycles per INT8 packet beyond its rows (request, finish).
INT8_RX_PACKET = 3


def frame_bytes(opcode: int, payload: int) -> int:
    """Bytes of one frame (no FCS): header + payload + pad + ICRC."""
    return header_len(opcode) + payload + (-payload) % 4 + ICRC_LEN


def packet_cycles(data_bytes: int, pmtu: int) -> int:
    """Cycles one packetizer takes per full path-MTU packet in a long message (a WRITE MIDDLE
    frame, one beat per cycle; 65 for 4096 B at 64 B per beat)."""
    return -(-frame_bytes(OP_WRITE_MIDDLE, check_pmtu(pmtu)) // check_data_bytes(data_bytes))


def payload_gbps(data_bytes: int, pmtu: int, clock_hz: float) -> float:
    """Payload Gb/s one packetizer frames in the steady state of a long message at
    ``clock_hz``: ``8 * pmtu`` bits per :func:`packet_cycles` (126 Gb/s at 64 B x 250 MHz,
    4096 B packets). The one figure the cluster model's framing rate and the experiments'
    packetizer counts come from."""
    if not clock_hz > 0:
        raise ValueError(f"clock_hz: expected a number > 0, got {clock_hz!r}")
    return 8 * pmtu * clock_hz / packet_cycles(data_bytes, pmtu) / 1e9


@dataclass(frozen=True)
class TxEstimate:
    cycles: int            # from the first descriptor to the last frame beat
    beats: int             # frame beats sent
    frames: int
    payload_bytes: int     # wire payload bytes

    @property
    def occupancy(self) -> float:
        return self.beats / self.cycles if self.cycles else 0.0

    def goodput_gbps(self, clock_hz: float) -> float:
        return 8 * self.payload_bytes * clock_hz / self.cycles / 1e9 if self.cycles else 0.0


def _frames(lengths, pmtu, with_imm, quant, dim=None):
    for n, imm in zip(lengths, with_imm):
        yield from segment(wire_length(n, quant, dim=dim, pmtu=pmtu), pmtu, imm)


def int8_divider_latency(div_bits_per_cycle: int = INT8_DIV_BITS) -> int:
    """Cycles of one :class:`rtl.fp.FPDiv32` division with ``div_bits_per_cycle``."""
    if not 1 <= div_bits_per_cycle <= 27:
        raise ValueError(f"div_bits_per_cycle: expected an integer in 1..27, got "
                         f"{div_bits_per_cycle!r}")
    return -(-27 // div_bits_per_cycle) + 2


def _int8_rows(plen: int, dim: int) -> int:
    return plen // (dim + INT8_ROW_EXTRA)


def estimate_tx(lengths: list[int], *, data_bytes: int, pmtu: int, with_imm: list[bool] | None = None,
                quant: str = "none", dim: int | None = None,
                div_bits_per_cycle: int = INT8_DIV_BITS) -> TxEstimate:
    """Cycles to send messages of ``lengths`` input (FP32) bytes back to back, sink ready.

    With FP16/BF16 the payload input (``data_bytes`` of FP32 per cycle) limits a packet to
    ``max(frame beats, input beats)`` cycles; INT8 packets are limited by the row quantizer
    (see the module docstring), whose dividers develop ``div_bits_per_cycle`` quotient bits a
    cycle.
    """
    W = check_data_bytes(data_bytes)
    check_pmtu(pmtu)
    with_imm = with_imm or [False] * len(lengths)
    div_latency = int8_divider_latency(div_bits_per_cycle)
    beats = cycles = frames = payload = 0
    for opcode, plen in _frames(lengths, pmtu, with_imm, quant, dim):
        fb = -(-frame_bytes(opcode, plen) // W)
        if quant == "int8":
            rows = _int8_rows(plen, dim)
            lanes = W // 4
            beats_row = dim // lanes
            header = int(8 + lanes > W)
            fill = plen - rows * (dim + INT8_ROW_EXTRA)
            # the emit stage also waits while the frame's header beats hold the gearbox
            emit = rows * (beats_row + header) + -(-fill // W) + header_len(opcode) // W
            in_cycles = max(rows * beats_row, rows * div_latency, emit)
            if frames == 0:
                in_cycles += INT8_LATENCY + beats_row + div_latency
        elif quant != "none":
            in_cycles = -(-2 * plen // W)
        else:
            in_cycles = 0
        beats += fb
        cycles += max(fb, in_cycles)
        frames += 1
        payload += plen
    return TxEstimate(cycles + TX_STARTUP if frames else 0, beats, frames, payload)


def estimate_rx(lengths: list[int], *, data_bytes: int, pmtu: int,
                with_imm: list[bool] | None = None, quant: str = "none",
                dim: int | None = None) -> int:
    """Cycles for the depacketizer to take the frames of ``lengths`` back to back and finish
    writing them (input one beat per cycle, memory always ready)."""
    W = check_data_bytes(data_bytes)
    with_imm = with_imm or [False] * len(lengths)
    cycles = 0
    drain_free = 0          # when the drain has written the packets so far
    for opcode, plen in _frames(lengths, pmtu, with_imm, quant, dim):
        f = frame_bytes(opcode, plen)
        fb = -(-f // W)
        npay = -(-plen // W)
        cycles += max(fb, RX_MIN_FRAME_CYCLES)
        if quant == "int8":
            work = _int8_rows(plen, dim) * (1 + dim // (W // 4)) + INT8_RX_PACKET
        elif quant != "none":
            work = -(-2 * plen // W) + 1          # two FP32 beats per payload beat
        else:
            work = npay + 1
        # store and forward: a packet drains after its verdict and after the one before
        drain_free = max(drain_free, cycles + RX_VERDICT_LATENCY) + work
    return drain_free + RX_TAIL if cycles else 0
