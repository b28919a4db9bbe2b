"""Golden RoCEv2 frames built with scapy's RoCE layer, independently of ``sim.reference.roce``
(shared by the packetizer and depacketizer tests and the depacketizer's cocotb bench): good
messages and deliberately broken frames, one per drop reason."""

from __future__ import annotations

import struct

import numpy as np
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from neonic.rtl.roce import OP_WRITE_FIRST, OP_WRITE_LAST_IMM, OP_WRITE_MIDDLE, OP_WRITE_ONLY, \
    OP_WRITE_ONLY_IMM
from neonic.sim.reference.roce import Destination, Message, segment

LOCAL_MAC, LOCAL_IP = 0x02_00_00_00_00_01, 0x0A_00_00_01


def _ip(value: int) -> str:
    return ".".join(str(b) for b in value.to_bytes(4, "big"))


def scapy_frame(dest: Destination, opcode: int, psn: int, payload: bytes, *, va=None, rkey=None,
                dma_len=None, imm=None, ackreq=0, local_mac=LOCAL_MAC, local_ip=LOCAL_IP,
                ether=None, ip=None, udp=None, bth=None) -> bytes:
    """One frame built by scapy (RETH and ImmDt as raw bytes: scapy has no layer for them).
    ``ether``/``ip``/``udp``/``bth`` override fields of those layers (to break them)."""
    pad = (-len(payload)) % 4
    ext = b""
    if va is not None:
        ext += struct.pack("!QII", va, rkey, dma_len)
    if imm is not None:
        ext += struct.pack("!I", imm)
    pkt = (Ether(**{"dst": dest.mac.to_bytes(6, "big"), "src": local_mac.to_bytes(6, "big"),
                    **(ether or {})})
           / IP(**{"src": _ip(local_ip), "dst": _ip(dest.ip), "id": 0, "flags": "DF", "ttl": 64,
                   **(ip or {})})
           / UDP(**{"sport": dest.udp_sport, "dport": 4791, "chksum": 0, **(udp or {})})
           / BTH(**{"opcode": opcode, "padcount": pad, "dqpn": dest.qpn, "psn": psn,
                    "ackreq": ackreq, **(bth or {})})
           / Raw(ext + payload + b"\x00" * pad))
    return bytes(pkt)


def scapy_message(msg: Message, dest: Destination, psn: int, pmtu: int, *,
                  local_mac=LOCAL_MAC, local_ip=LOCAL_IP) -> list[bytes]:
    """The frames of ``msg`` as scapy builds them."""
    out = []
    off = 0
    packets = segment(len(msg.payload), pmtu, msg.imm is not None)
    for i, (op, plen) in enumerate(packets):
        reth = op in (OP_WRITE_FIRST, OP_WRITE_ONLY, OP_WRITE_ONLY_IMM)
        immd = op in (OP_WRITE_LAST_IMM, OP_WRITE_ONLY_IMM)
        out.append(scapy_frame(dest, op, (psn + i) % (1 << 24), msg.payload[off:off + plen],
                               va=msg.va if reth else None, rkey=msg.rkey if reth else None,
                               dma_len=len(msg.payload) if reth else None,
                               imm=msg.imm if immd else None, ackreq=int(i == len(packets) - 1),
                               local_mac=local_mac, local_ip=local_ip))
        off += plen
    return out


def broken_frames(rng: np.random.Generator, dest: Destination, local_mac=LOCAL_MAC,
                  local_ip=LOCAL_IP, va: int = 0x4000, psn: int = 0) -> list[tuple[str, bytes]]:
    """``(reason, frame)`` pairs: each frame is a WRITE ONLY for ``dest`` (QP expecting ``psn``,
    no message in progress) broken in exactly one way."""
    payload = rng.integers(0, 256, 40, dtype=np.uint8).tobytes()

    def only(**kw):
        args = dict(va=va, rkey=1, dma_len=len(payload), ackreq=1, local_mac=local_mac,
                    local_ip=local_ip)
        args.update(kw)
        return scapy_frame(dest, OP_WRITE_ONLY, psn, payload, **args)

    good = only()
    bad_icrc = bytearray(good)
    bad_icrc[-1] ^= 0x40
    return [
        ("truncated", good[:-9]),
        ("ethertype", only(ether={"type": 0x86DD})),
        ("ip_version", only(ip={"version": 6})),
        ("ip_length", only(ip={"len": len(good) - 14 - 4})),
        ("ip_checksum", only(ip={"chksum": 0x1234})),
        ("udp_port", only(udp={"dport": 4792})),
        ("icrc", bytes(bad_icrc)),
        ("qp", only(bth={"dqpn": 0x800000})),
        ("opcode", scapy_frame(dest, OP_WRITE_MIDDLE, psn, payload + bytes(216),
                               local_mac=local_mac, local_ip=local_ip)),
        ("psn", only(bth={"psn": (psn + 3) % (1 << 24)})),
        ("length", only(dma_len=len(payload) + 1)),
    ]
