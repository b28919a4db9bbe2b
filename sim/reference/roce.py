"""Golden model of the AlltoAll wire format: RoCEv2 RC RDMA WRITE framing, segmentation at the
path MTU, the receiver's validation, and the quantized payload formats.

Written from the RoCEv2 facts (see ``REFERENCES.md``: header sizes, opcodes, the ICRC's masked
fields), not from the RTL. Tests check this model against scapy's RoCE layer and the RTL
against both.

Constant header fields (what neonic's packetizer sends): IPv4 DSCP/ECN 0, id 0, flags DF,
TTL 64; UDP checksum 0; BTH SE 0, M 0, version 0, P_Key 0xFFFF, AckReq set on the last packet
of a message.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

from rtl.roce import (BTH_PKEY, DROP_REASONS, ETHERTYPE_IPV4, IP_FLAGS_DF, IP_TTL, OP_WRITE_FIRST,
                      OP_WRITE_LAST, OP_WRITE_LAST_IMM, OP_WRITE_MIDDLE, OP_WRITE_ONLY,
                      OP_WRITE_ONLY_IMM, ROCE_UDP_PORT, check_pmtu, header_len)

__all__ = [
    "Destination", "Message", "Frame", "Completion", "segment", "build_frames", "icrc",
    "ip_checksum", "Receiver", "quantize", "dequantize", "QUANT_FORMATS", "wire_length",
    "PSN_MODULUS",
]

PSN_MODULUS = 1 << 24
QUANT_FORMATS = ("none", "fp16", "bf16")


@dataclass(frozen=True)
class Destination:
    """Per-destination addressing (one row of the host-written table)."""

    mac: int
    ip: int
    qpn: int
    udp_sport: int = 0xC000

    def __post_init__(self):
        for name, value, bits in (("mac", self.mac, 48), ("ip", self.ip, 32),
                                  ("qpn", self.qpn, 24), ("udp_sport", self.udp_sport, 16)):
            if not isinstance(value, int) or not 0 <= value < (1 << bits):
                raise ValueError(f"{name}: expected an integer in [0, 2**{bits}), got {value!r}")


@dataclass(frozen=True)
class Message:
    """One RDMA WRITE: ``payload`` (wire bytes) to ``va``/``rkey``; ``imm`` or None."""

    dest: int
    va: int
    rkey: int
    payload: bytes
    imm: int | None = None

    def __post_init__(self):
        if not 0 <= self.va < (1 << 64):
            raise ValueError(f"va: expected an integer in [0, 2**64), got {self.va}")
        if not 0 <= self.rkey < (1 << 32):
            raise ValueError(f"rkey: expected an integer in [0, 2**32), got {self.rkey}")
        if self.imm is not None and not 0 <= self.imm < (1 << 32):
            raise ValueError(f"imm: expected None or an integer in [0, 2**32), got {self.imm}")
        if len(self.payload) >= (1 << 31):
            raise ValueError(f"payload: expected fewer than 2**31 bytes, got {len(self.payload)}")


@dataclass(frozen=True)
class Frame:
    """A built frame and what it carries (for scoreboards)."""

    data: bytes
    opcode: int
    psn: int
    payload_len: int


@dataclass(frozen=True)
class Completion:
    """Reported by the receiver when a message's last packet is accepted."""

    qp: int
    length: int
    imm: int | None


def segment(length: int, pmtu: int, with_imm: bool) -> list[tuple[int, int]]:
    """The packets of a message: ``[(opcode, payload_len), ...]`` (a zero-length message is
    one ONLY packet)."""
    check_pmtu(pmtu)
    if length < 0:
        raise ValueError(f"length: expected >= 0, got {length}")
    if length <= pmtu:
        return [(OP_WRITE_ONLY_IMM if with_imm else OP_WRITE_ONLY, length)]
    packets = [(OP_WRITE_FIRST, pmtu)]
    rest = length - pmtu
    while rest > pmtu:
        packets.append((OP_WRITE_MIDDLE, pmtu))
        rest -= pmtu
    packets.append((OP_WRITE_LAST_IMM if with_imm else OP_WRITE_LAST, rest))
    return packets


def ip_checksum(header: bytes) -> int:
    """Ones'-complement sum of 16-bit words, complemented (RFC 791)."""
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return (~total) & 0xFFFF


def icrc(frame_without_icrc: bytes) -> bytes:
    """The 4 ICRC bytes for a frame (Ethernet header on, ICRC excluded).

    CRC-32 over eight 0xFF bytes, then the frame from the IP header on with IP DSCP/ECN, TTL,
    header checksum, UDP checksum and the BTH FECN/BECN/reserved byte set to ones; sent least
    significant byte first.
    """
    masked = bytearray(frame_without_icrc[14:])
    masked[1] = 0xFF                      # DSCP/ECN
    masked[8] = 0xFF                      # TTL
    masked[10:12] = b"\xff\xff"           # IP header checksum
    masked[26:28] = b"\xff\xff"           # UDP checksum
    masked[32] = 0xFF                     # BTH FECN, BECN, resv6
    return struct.pack("<I", zlib.crc32(b"\xff" * 8 + bytes(masked)) & 0xFFFFFFFF)


def wire_length(length: int, quant: str) -> int:
    """Wire bytes of a message whose FP32 payload is ``length`` bytes."""
    if quant not in QUANT_FORMATS:
        raise ValueError(f"quant: expected one of {QUANT_FORMATS}, got {quant!r}")
    return length if quant == "none" else length // 2


def build_frames(msg: Message, dest: Destination, *, local_mac: int, local_ip: int, psn: int,
                 pmtu: int = 4096) -> list[Frame]:
    """The frames (Ethernet header to ICRC, no FCS) that carry ``msg``; PSNs from ``psn``."""
    if not 0 <= psn < PSN_MODULUS:
        raise ValueError(f"psn: expected an integer in [0, 2**24), got {psn}")
    frames = []
    offset = 0
    packets = segment(len(msg.payload), pmtu, msg.imm is not None)
    for index, (opcode, plen) in enumerate(packets):
        payload = msg.payload[offset:offset + plen]
        offset += plen
        pad = (-plen) % 4
        ext = b""
        if opcode in (OP_WRITE_FIRST, OP_WRITE_ONLY, OP_WRITE_ONLY_IMM):
            ext += struct.pack("!QII", msg.va, msg.rkey, len(msg.payload))
        if opcode in (OP_WRITE_LAST_IMM, OP_WRITE_ONLY_IMM):
            ext += struct.pack("!I", msg.imm)
        last = index == len(packets) - 1
        this_psn = (psn + index) % PSN_MODULUS
        bth = struct.pack("!BBHII", opcode, pad << 4, BTH_PKEY, dest.qpn,
                          (int(last) << 31) | this_psn)
        udp_len = 8 + len(bth) + len(ext) + plen + pad + 4
        udp = struct.pack("!HHHH", dest.udp_sport, ROCE_UDP_PORT, udp_len, 0)
        ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + udp_len, 0, IP_FLAGS_DF, IP_TTL,
                                   17, 0, local_ip.to_bytes(4, "big"), dest.ip.to_bytes(4, "big")))
        ip[10:12] = struct.pack("!H", ip_checksum(bytes(ip)))
        eth = dest.mac.to_bytes(6, "big") + local_mac.to_bytes(6, "big") + \
            struct.pack("!H", ETHERTYPE_IPV4)
        body = eth + bytes(ip) + udp + bth + ext + payload + b"\x00" * pad
        assert len(eth + ip + udp + bth + ext) == header_len(opcode)
        frames.append(Frame(body + icrc(body), opcode, this_psn, plen))
    return frames


@dataclass
class _QPState:
    psn: int = 0
    in_message: bool = False
    va: int = 0
    remaining: int = 0
    length: int = 0


@dataclass
class Receiver:
    """The receive side's semantics: validate each frame, write accepted payload to memory at
    its remote address, complete messages, count drops by reason (``DROP_REASONS`` order).

    ``memory`` maps a byte address to its byte; QP ``q`` is served for ``q < num_qps``.
    """

    num_qps: int = 16
    pmtu: int = 4096
    memory: dict[int, int] = field(default_factory=dict)
    drops: dict[str, int] = field(default_factory=lambda: {r: 0 for r in DROP_REASONS})
    accepted: int = 0
    completions: list[Completion] = field(default_factory=list)
    qps: list[_QPState] = field(default_factory=list)

    def __post_init__(self):
        check_pmtu(self.pmtu)
        self.qps = [_QPState() for _ in range(self.num_qps)]

    def set_psn(self, qp: int, psn: int) -> None:
        """Host write: expect ``psn`` next on ``qp`` and forget any message in progress."""
        self.qps[qp] = _QPState(psn=psn)

    def classify(self, frame: bytes) -> str | None:
        """The drop reason for ``frame``, or None when it is accepted (state is not changed)."""
        n = len(frame)
        if n < 34:
            return "truncated"
        if int.from_bytes(frame[12:14], "big") != ETHERTYPE_IPV4:
            return "ethertype"
        if frame[14] != 0x45:
            return "ip_version"
        ip_len = int.from_bytes(frame[16:18], "big")
        if 14 + ip_len > n:
            return "truncated"
        if 14 + ip_len < n or ip_len < 20 + 8 + 12 + 4:
            return "ip_length"
        if ip_checksum(frame[14:34]) != 0:
            return "ip_checksum"
        if frame[23] != 17 or int.from_bytes(frame[36:38], "big") != ROCE_UDP_PORT:
            return "udp_port"
        if icrc(frame[:-4]) != frame[-4:]:
            return "icrc"
        opcode = frame[42]
        qp = int.from_bytes(frame[47:50], "big")
        if qp >= self.num_qps:
            return "qp"
        state = self.qps[qp]
        allowed = ((OP_WRITE_MIDDLE, OP_WRITE_LAST, OP_WRITE_LAST_IMM) if state.in_message
                   else (OP_WRITE_FIRST, OP_WRITE_ONLY, OP_WRITE_ONLY_IMM))
        if opcode not in allowed:
            return "opcode"
        if int.from_bytes(frame[51:54], "big") != state.psn:
            return "psn"
        pad = (frame[43] >> 4) & 3
        plen = n - header_len(opcode) - pad - 4
        if plen < 0:
            return "length"
        if opcode in (OP_WRITE_ONLY, OP_WRITE_ONLY_IMM):
            if plen != int.from_bytes(frame[66:70], "big"):
                return "length"
        elif opcode == OP_WRITE_FIRST:
            if plen != self.pmtu or int.from_bytes(frame[66:70], "big") <= self.pmtu:
                return "length"
        elif opcode == OP_WRITE_MIDDLE:
            if plen != self.pmtu or state.remaining <= self.pmtu:
                return "length"
        elif plen != state.remaining or plen == 0:
            return "length"
        return None

    def receive(self, frame: bytes) -> str | None:
        """Process one frame; returns its drop reason or None when accepted."""
        reason = self.classify(frame)
        if reason is not None:
            self.drops[reason] += 1
            return reason
        self.accepted += 1
        opcode = frame[42]
        qp = int.from_bytes(frame[47:50], "big")
        state = self.qps[qp]
        hlen = header_len(opcode)
        pad = (frame[43] >> 4) & 3
        payload = frame[hlen:len(frame) - 4 - pad]
        if opcode in (OP_WRITE_FIRST, OP_WRITE_ONLY, OP_WRITE_ONLY_IMM):
            state.va = int.from_bytes(frame[54:62], "big")
            state.length = int.from_bytes(frame[66:70], "big")
            state.remaining = state.length
        for i, byte in enumerate(payload):
            self.memory[state.va + i] = byte
        state.va += len(payload)
        state.remaining -= len(payload)
        state.psn = (state.psn + 1) % PSN_MODULUS
        state.in_message = opcode in (OP_WRITE_FIRST, OP_WRITE_MIDDLE)
        if not state.in_message:
            imm = None
            if opcode == OP_WRITE_ONLY_IMM:
                imm = int.from_bytes(frame[70:74], "big")
            elif opcode == OP_WRITE_LAST_IMM:
                imm = int.from_bytes(frame[54:58], "big")
            self.completions.append(Completion(qp, state.length, imm))
        return None


def quantize(values: np.ndarray, quant: str) -> bytes:
    """FP32 embeddings -> wire bytes: ``none`` (FP32), ``fp16`` or ``bf16`` (round to nearest
    even), little-endian element order as in memory."""
    values = np.ascontiguousarray(values, dtype=np.float32).ravel()
    if quant == "none":
        return values.tobytes()
    if quant == "fp16":
        return values.astype(np.float16).tobytes()
    if quant == "bf16":
        bits = values.view(np.uint32).astype(np.uint64)
        nan = np.isnan(values)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        out = np.where(nan, 0x7FC0, rounded).astype(np.uint16)
        return out.tobytes()
    raise ValueError(f"quant: expected one of {QUANT_FORMATS}, got {quant!r}")


def dequantize(wire: bytes, quant: str) -> np.ndarray:
    """Wire bytes -> FP32 values (exact widening)."""
    if quant == "none":
        return np.frombuffer(wire, dtype=np.float32).copy()
    if quant == "fp16":
        return np.frombuffer(wire, dtype=np.float16).astype(np.float32)
    if quant == "bf16":
        half = np.frombuffer(wire, dtype=np.uint16).astype(np.uint32)
        return (half << 16).view(np.float32)
    raise ValueError(f"quant: expected one of {QUANT_FORMATS}, got {quant!r}")
