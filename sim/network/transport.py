"""Bytes on the wire for a message under RDMA (RoCEv2) or TCP framing.

RoCEv2 (RC RDMA WRITE), per packet: Ethernet 14 + IPv4 20 + UDP 8 + BTH 12 + ICRC 4 + FCS 4 +
preamble 8 + inter-frame gap 12 = 82 B beside the payload; the first packet of a message also
carries RETH (16 B); the payload is padded to a multiple of 4 B (BTH pad count). A full 4096 B
packet therefore costs 4096 + 82 B (about 98% goodput), as REFERENCES.md states.

TCP/IPv4 over Ethernet, per segment: Ethernet 14 + IPv4 20 + TCP 20 + FCS 4 + preamble 8 +
inter-frame gap 12 = 78 B beside the payload; MSS = MTU - 40 (IP and TCP headers, no options).
ACKs on the reverse path are not modelled.
"""

from __future__ import annotations

import numpy as np

from neonic.sim.compiled import HAVE_NUMBA

from .classes import _distinct_kernel

__all__ = [
    "ROCE_PACKET_OVERHEAD",
    "ROCE_RETH",
    "TCP_SEGMENT_OVERHEAD",
    "ROCE_MTUS",
    "rdma_wire_bytes",
    "tcp_wire_bytes",
    "wire_bytes",
]

ROCE_PACKET_OVERHEAD = 14 + 20 + 8 + 12 + 4 + 4 + 8 + 12  # = 82
ROCE_RETH = 16
TCP_SEGMENT_OVERHEAD = 14 + 20 + 20 + 4 + 8 + 12  # = 78
TCP_IP_HEADERS = 40
ROCE_MTUS = (256, 512, 1024, 2048, 4096)


def rdma_wire_bytes(nbytes: np.ndarray | int, mtu: int) -> np.ndarray:
    """Wire bytes of RDMA WRITE messages of ``nbytes`` payload each (0 for an empty message)."""
    n = np.asarray(nbytes, dtype=np.float64)
    packets = np.ceil(n / mtu)
    # np.mod(-n, 4) exactly (division and product by 4 are exact; so is the difference, below 4
    # and on n's grid), at a sixth of np.mod's cost (a million messages per AlltoAllv at 1024
    # GPUs); sizes below a byte, where n / 4 can underflow, take np.mod itself
    pad = -n - 4.0 * np.floor(-n / 4.0)
    tiny = np.abs(n) < 1.0
    if np.any(tiny):
        pad = np.where(tiny, np.mod(-n, 4), pad)
    out = n + pad + packets * ROCE_PACKET_OVERHEAD + ROCE_RETH
    return np.where(n > 0, out, 0.0)


def tcp_wire_bytes(nbytes: np.ndarray | int, mtu: int) -> np.ndarray:
    """Wire bytes of TCP messages of ``nbytes`` payload each (0 for an empty message)."""
    n = np.asarray(nbytes, dtype=np.float64)
    mss = mtu - TCP_IP_HEADERS
    segments = np.ceil(n / mss)
    return n + segments * TCP_SEGMENT_OVERHEAD


def wire_bytes(nbytes: np.ndarray | int, protocol: str, mtu: int) -> np.ndarray:
    if protocol == "rdma":
        return rdma_wire_bytes(nbytes, mtu)
    if protocol == "tcp":
        return tcp_wire_bytes(nbytes, mtu)
    raise ValueError(f"protocol: expected 'rdma' or 'tcp', got {protocol!r}")


#: arrays of at least this many sizes are framed once per distinct size, then gathered (an
#: AlltoAllv's 16.8M messages at 4096 GPUs have 566 sizes; the per-message arithmetic cost
#: 1.3 s CPU): elementwise, the same values; more than an eighth distinct: message by message
DISTINCT_MIN = 1 << 16


def framing_factor(nbytes: np.ndarray, protocol: str, mtu: int) -> np.ndarray:
    """Wire bytes per payload byte (>= 1); 1 for empty messages."""
    n = np.asarray(nbytes, dtype=np.float64)
    if HAVE_NUMBA and n.ndim == 1 and n.size >= DISTINCT_MIN:
        ok, uniq, slot = _distinct_kernel(np.ascontiguousarray(n).view(np.int64), n.size // 8)
        if ok:  # (distinct bit patterns: each value is computed from itself)
            return _framing(uniq.view(np.float64), protocol, mtu)[slot]
    return _framing(n, protocol, mtu)


def _framing(n: np.ndarray, protocol: str, mtu: int) -> np.ndarray:
    wb = wire_bytes(n, protocol, mtu)
    with np.errstate(divide="ignore", invalid="ignore"):
        f = wb / n
    return np.where(n > 0, f, 1.0)
