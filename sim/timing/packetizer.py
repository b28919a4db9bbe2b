"""Timing model of the packetizer and depacketizer: cycles and bus occupancy from message
sizes, without simulating the RTL.

The packetizer sends one frame beat per cycle; a frame of ``F`` bytes (header, payload, pad,
ICRC) is ``ceil(F / data_bytes)`` beats, and frames follow each other without gaps while
payload and descriptors keep up. Starting from idle costs ``TX_STARTUP`` cycles (descriptor
accepted, packet planned, first beat registered). The depacketizer takes one beat per cycle
and pauses a cycle after a frame whose payload tail and the previous payload beat both complete
on its last beat; its drain writes each packet's payload beats plus one cycle per packet
(FP16/BF16: two FP32 beats per payload beat), after the packet's last beat and after the
previous packet's drain (the payload FIFO holds two packets, so a slower drain decides the
end).

INT8 (rows of ``dim`` elements, ``L = data_bytes / 4`` elements a beat): the quantizer takes a
row in ``dim / L`` cycles while the previous row is sent; sending a row costs its two
divisions (``INT8_DIVIDE`` cycles: the iterative divider plus the hand-offs), one cycle for
scale and bias, ``dim / L`` cycles of codes and the zero fill that closes a packet (at least
one cycle), so a row takes ``max(dim / L, INT8_DIVIDE + 1 + dim / L + fill)`` cycles. The
receiver restores a row in ``1 + dim / L`` cycles (scale and bias, then one FP32 beat per
``L`` codes) plus ``INT8_RX_PACKET`` cycles a packet.
"""

from __future__ import annotations

from dataclasses import dataclass

from rtl.roce import BASE_HEADER_LEN, ICRC_LEN, check_data_bytes, check_pmtu, header_len
from sim.reference.roce import INT8_ROW_EXTRA, segment, wire_length

__all__ = ["TX_STARTUP", "INT8_DIVIDE", "INT8_RX_PACKET", "frame_bytes", "TxEstimate",
           "estimate_tx", "estimate_rx"]

TX_STARTUP = 3
#: Cycles a row waits for its scale and 1/scale: FPDiv32's latency (29) and 3 hand-offs.
INT8_DIVIDE = 32
#: Receiver cycles per INT8 packet beyond its rows (request, finish).
INT8_RX_PACKET = 3


def frame_bytes(opcode: int, payload: int) -> int:
    """Bytes of one frame (no FCS): header + payload + pad + ICRC."""
    return header_len(opcode) + payload + (-payload) % 4 + ICRC_LEN


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


def _int8_rows(plen: int, dim: int) -> int:
    return plen // (dim + INT8_ROW_EXTRA)


def estimate_tx(lengths: list[int], *, data_bytes: int, pmtu: int, with_imm: list[bool] | None = None,
                quant: str = "none", dim: int | None = None) -> TxEstimate:
    """Cycles to send messages of ``lengths`` input (FP32) bytes back to back, sink ready.

    With FP16/BF16 the payload input (``data_bytes`` of FP32 per cycle) limits a packet to
    ``max(frame beats, input beats)`` cycles; INT8 packets are limited by the row quantizer
    (see the module docstring).
    """
    W = check_data_bytes(data_bytes)
    check_pmtu(pmtu)
    with_imm = with_imm or [False] * len(lengths)
    beats = cycles = frames = payload = 0
    for opcode, plen in _frames(lengths, pmtu, with_imm, quant, dim):
        fb = -(-frame_bytes(opcode, plen) // W)
        if quant == "int8":
            rows = _int8_rows(plen, dim)
            lanes = W // 4
            fill = plen - rows * (dim + INT8_ROW_EXTRA)
            fill_cycles = max(1, -(-fill // W))
            row = INT8_DIVIDE + 1 + dim // lanes
            in_cycles = rows * max(dim // lanes, row + 1) + fill_cycles - 1
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
        h = header_len(opcode)
        npay = -(-plen // W)
        q = h // W
        flush = fb - 1 - q < npay and fb - 2 - q >= 0
        cycles += fb + int(flush)
        if quant == "int8":
            work = _int8_rows(plen, dim) * (1 + dim // (W // 4)) + INT8_RX_PACKET
        elif quant != "none":
            work = -(-2 * plen // W) + 1          # two FP32 beats per payload beat
        else:
            work = npay + 1
        # store and forward: a packet drains after its last beat and after the one before
        drain_free = max(drain_free, cycles) + work
    return drain_free + 3 if cycles else 0
