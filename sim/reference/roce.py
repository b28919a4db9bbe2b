"""Golden model of the AlltoAll wire format: RoCEv2 RC RDMA WRITE framing, segmentation at the
path MTU, the receiver's validation, and the quantized payload formats.

Written from the RoCEv2 facts (see ``REFERENCES.md``: header sizes, opcodes, the ICRC's masked
fields), not from the RTL. Tests check this model against scapy's RoCE layer and the RTL
against both.

Constant header fields (what neonic's packetizer sends): IPv4 DSCP/ECN 0, id 0, flags DF,
TTL 64; UDP checksum 0; BTH SE 0, M 0, version 0, P_Key 0xFFFF, AckReq set on the last packet
of a message.

Quantized payloads (the message's FP32 embeddings as they travel)
=================================================================

``none``
    The FP32 bytes as they are in memory.
``fp16`` / ``bf16``
    Each element rounded to nearest even, 2 bytes little-endian: half the bytes.
``int8`` (row-wise, rows of ``dim`` elements)
    Per row, ``scale = (max - min) / 255`` and ``bias = min`` (FP32, computed exactly as
    :func:`rtl.fp.int8_rowwise_formula` says) followed by the row's ``dim`` one-byte codes:
    ``scale`` (4 bytes LE), ``bias`` (4 bytes LE), codes; ``dim + 8`` bytes a row. Rows never
    straddle a packet: the wire image is cut into blocks of ``pmtu`` bytes, each holding
    ``rows_per_packet = pmtu // (dim + 8)`` whole rows followed by zero fill up to ``pmtu``;
    the last block holds the remaining rows and no fill. Segmented at the path MTU, every
    packet (FIRST/MIDDLE/LAST/ONLY) therefore starts with a whole row and can be dequantized
    on its own. The RETH DMA length is the wire length (fill included); the RETH virtual
    address is where the restored FP32 rows go.

The receiver learns a QP's format from the host (:meth:`Receiver.set_psn`, the hardware's
per-QP table): the wire carries no format field.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from neonic.sim.reference.fp import int8_rowwise_dequantize, int8_rowwise_quantize

from neonic.rtl.roce import (BTH_PKEY, DROP_REASONS, ETHERTYPE_IPV4, IP_FLAGS_DF, IP_TTL, OP_WRITE_FIRST,
                      OP_WRITE_LAST, OP_WRITE_LAST_IMM, OP_WRITE_MIDDLE, OP_WRITE_ONLY,
                      OP_WRITE_ONLY_IMM, ROCE_UDP_PORT, check_pmtu, header_len)

__all__ = [
    "Destination", "Message", "Frame", "Completion", "segment", "build_frames", "icrc",
    "ip_checksum", "Receiver", "quantize", "dequantize", "QUANT_FORMATS", "wire_length",
    "PSN_MODULUS", "INT8_ROW_EXTRA", "int8_rows_per_packet", "check_quant", "frame_beats",
]

PSN_MODULUS = 1 << 24
QUANT_FORMATS = ("none", "fp16", "bf16", "int8")
INT8_ROW_EXTRA = 8          # scale and bias, FP32 each, before a row's codes


def check_quant(quant: object) -> str:
    if quant not in QUANT_FORMATS:
        raise ValueError(f"quant: expected one of {', '.join(QUANT_FORMATS)}, got {quant!r}")
    return quant  # type: ignore[return-value]


def int8_rows_per_packet(dim: int, pmtu: int) -> int:
    """Whole INT8 rows of ``dim`` codes (plus scale and bias) that fit one ``pmtu`` packet."""
    check_pmtu(pmtu)
    if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= pmtu - INT8_ROW_EXTRA:
        raise ValueError(f"dim: expected an integer in 1..{pmtu - INT8_ROW_EXTRA} (a row and its "
                         f"scale and bias must fit the path MTU {pmtu}), got {dim!r}")
    return pmtu // (dim + INT8_ROW_EXTRA)


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


def frame_beats(frames: Sequence[bytes], data_bytes: int) -> list[dict[str, int]]:
    """The frame-stream beats (``rtl.roce.FrameBeat`` fields as a dict: ``data`` little-endian,
    ``count`` valid bytes, ``last``) that carry ``frames`` one after another on a
    ``data_bytes``-wide stream: the one conversion every driver of a frame input uses."""
    if data_bytes < 1:
        raise ValueError(f"data_bytes: expected >= 1, got {data_bytes!r}")
    W = data_bytes
    return [{"data": int.from_bytes(f[o:o + W], "little"), "count": len(f[o:o + W]),
             "last": int(o + W >= len(f))} for f in frames for o in range(0, len(f), W)]


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


def wire_length(length: int, quant: str, *, dim: int | None = None,
                pmtu: int | None = None) -> int:
    """Wire bytes of a message whose FP32 payload is ``length`` bytes (``int8``: rows of
    ``dim`` elements in packets of ``pmtu`` bytes, fill included)."""
    check_quant(quant)
    if length < 0:
        raise ValueError(f"length: expected >= 0 bytes, got {length}")
    if quant == "none":
        return length
    if length % 4:
        raise ValueError(f"length: expected a multiple of 4 bytes (FP32 elements), got {length}")
    if quant in ("fp16", "bf16"):
        return length // 2
    if dim is None or pmtu is None:
        raise ValueError("dim: int8 needs the row dimension and the path MTU (dim=, pmtu=)")
    per = int8_rows_per_packet(dim, pmtu)
    if length % (4 * dim):
        raise ValueError(f"length: expected whole rows of dim={dim} FP32 elements "
                         f"({4 * dim} bytes), got {length}")
    rows = length // (4 * dim)
    if rows == 0:
        return 0
    return (rows - 1) // per * pmtu + ((rows - 1) % per + 1) * (dim + INT8_ROW_EXTRA)


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
    va: int = 0             # where the next payload byte goes (FP32 bytes when quantized)
    remaining: int = 0
    length: int = 0
    quant: str = "none"
    dim: int = 0


@dataclass
class Receiver:
    """The receive side's semantics: validate each frame, write accepted payload to memory at
    its remote address, complete messages, count drops by reason (``DROP_REASONS`` order).

    ``memory`` maps a byte address to its byte; QP ``q`` is served for ``q < num_qps``. A QP
    set to a quantized format writes the restored FP32 values instead of the wire bytes
    (``dequantize`` of each packet's payload, consecutive from the RETH address).
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

    def set_psn(self, qp: int, psn: int, quant: str = "none", dim: int = 0) -> None:
        """Host write: expect ``psn`` next on ``qp``, receive its payload in format ``quant``
        (``dim``: INT8 row elements) and forget any message in progress."""
        check_quant(quant)
        if quant == "int8":
            int8_rows_per_packet(dim, self.pmtu)
        self.qps[qp] = _QPState(psn=psn, quant=quant, dim=dim)

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
            # a packet never carries more than the path MTU (the receiver holds two)
            if plen != int.from_bytes(frame[66:70], "big") or plen > self.pmtu:
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
        plen = len(payload)
        if opcode in (OP_WRITE_FIRST, OP_WRITE_ONLY, OP_WRITE_ONLY_IMM):
            state.va = int.from_bytes(frame[54:62], "big")
            state.length = int.from_bytes(frame[66:70], "big")
            state.remaining = state.length
        if state.quant != "none":
            if state.quant == "int8":
                rows = len(payload) // (state.dim + INT8_ROW_EXTRA)
                payload = payload[:rows * (state.dim + INT8_ROW_EXTRA)]
            payload = dequantize(payload, state.quant, dim=state.dim,
                                 pmtu=self.pmtu).tobytes()
        for i, byte in enumerate(payload):
            self.memory[state.va + i] = byte
        state.va += len(payload)
        state.remaining -= plen
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


def quantize(values: np.ndarray, quant: str, *, dim: int | None = None,
             pmtu: int | None = None) -> bytes:
    """FP32 embeddings -> wire bytes: ``none`` (FP32), ``fp16`` or ``bf16`` (round to nearest
    even), little-endian element order as in memory; ``int8``: rows of ``dim`` elements in
    ``pmtu`` blocks (see the module docstring)."""
    check_quant(quant)
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
    wire_length(values.nbytes, quant, dim=dim, pmtu=pmtu)      # validates dim/pmtu/length
    per = int8_rows_per_packet(dim, pmtu)
    codes, scale, bias = int8_rowwise_quantize(values.reshape(-1, dim))
    out = bytearray()
    for r in range(codes.shape[0]):
        if r and r % per == 0:
            out += bytes(-len(out) % pmtu)
        out += scale[r:r + 1].tobytes() + bias[r:r + 1].tobytes() + codes[r].tobytes()
    return bytes(out)


def dequantize(wire: bytes, quant: str, *, dim: int | None = None,
               pmtu: int | None = None) -> np.ndarray:
    """Wire bytes -> FP32 values (exact widening; ``int8``: ``fl(fl(q * scale) + bias)``)."""
    check_quant(quant)
    if quant == "none":
        return np.frombuffer(wire, dtype=np.float32).copy()
    if quant == "fp16":
        return np.frombuffer(wire, dtype=np.float16).astype(np.float32)
    if quant == "bf16":
        half = np.frombuffer(wire, dtype=np.uint16).astype(np.uint32)
        return (half << 16).view(np.float32)
    per = int8_rows_per_packet(dim, pmtu)
    row = dim + INT8_ROW_EXTRA
    rows = []
    for start in range(0, len(wire), pmtu):
        block = wire[start:start + pmtu]
        last = start + pmtu >= len(wire)
        n = len(block) // row if last else per
        if last and (len(block) != n * row or n > per):
            raise ValueError(f"wire: {len(wire)} bytes are not whole int8 rows of dim={dim} "
                             f"in {pmtu}-byte blocks")
        rows += [block[i * row:(i + 1) * row] for i in range(n)]
    if not rows:
        return np.zeros(0, np.float32)
    raw = np.frombuffer(b"".join(rows), np.uint8).reshape(-1, row)
    scale = raw[:, 0:4].copy().view(np.float32)[:, 0]
    bias = raw[:, 4:8].copy().view(np.float32)[:, 0]
    return int8_rowwise_dequantize(raw[:, 8:], scale, bias).ravel()
