"""Timing model of the packetizer and depacketizer: cycles and bus occupancy from message
sizes, without simulating the RTL.

The packetizer sends one frame beat per cycle; a frame of ``F`` bytes (header, payload, pad,
ICRC) is ``ceil(F / data_bytes)`` beats, and frames follow each other without gaps while
payload and descriptors keep up. Starting from idle costs ``TX_STARTUP`` cycles (descriptor
accepted, packet planned, first beat registered). The depacketizer takes one beat per cycle
and pauses a cycle after a frame whose payload tail and the previous payload beat both complete
on its last beat; its drain writes each packet's payload beats plus one cycle per packet.
"""

from __future__ import annotations

from dataclasses import dataclass

from rtl.roce import BASE_HEADER_LEN, ICRC_LEN, check_data_bytes, check_pmtu, header_len
from sim.reference.roce import segment, wire_length

__all__ = ["TX_STARTUP", "frame_bytes", "TxEstimate", "estimate_tx", "estimate_rx"]

TX_STARTUP = 3


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


def _frames(lengths, pmtu, with_imm, quant):
    for n, imm in zip(lengths, with_imm):
        yield from segment(wire_length(n, quant), pmtu, imm)


def estimate_tx(lengths: list[int], *, data_bytes: int, pmtu: int, with_imm: list[bool] | None = None,
                quant: str = "none") -> TxEstimate:
    """Cycles to send messages of ``lengths`` input (FP32) bytes back to back, sink ready.

    With FP16/BF16 the payload input (``data_bytes`` of FP32 per cycle) limits a packet to
    ``max(frame beats, input beats)`` cycles.
    """
    W = check_data_bytes(data_bytes)
    check_pmtu(pmtu)
    with_imm = with_imm or [False] * len(lengths)
    beats = cycles = frames = payload = 0
    for opcode, plen in _frames(lengths, pmtu, with_imm, quant):
        fb = -(-frame_bytes(opcode, plen) // W)
        in_beats = -(-2 * plen // W) if quant != "none" else 0
        beats += fb
        cycles += max(fb, in_beats)
        frames += 1
        payload += plen
    return TxEstimate(cycles + TX_STARTUP if frames else 0, beats, frames, payload)


def estimate_rx(lengths: list[int], *, data_bytes: int, pmtu: int,
                with_imm: list[bool] | None = None, quant: str = "none") -> int:
    """Cycles for the depacketizer to take the frames of ``lengths`` back to back and finish
    writing them (input one beat per cycle, memory always ready)."""
    W = check_data_bytes(data_bytes)
    with_imm = with_imm or [False] * len(lengths)
    cycles = 0
    last_drain = 0
    for opcode, plen in _frames(lengths, pmtu, with_imm, quant):
        f = frame_bytes(opcode, plen)
        fb = -(-f // W)
        h = header_len(opcode)
        npay = -(-plen // W)
        q = h // W
        flush = fb - 1 - q < npay and fb - 2 - q >= 0
        cycles += fb + int(flush)
        last_drain = npay + 1
    return cycles + last_drain + 3 if cycles else 0
