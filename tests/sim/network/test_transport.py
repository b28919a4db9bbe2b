"""Framing overhead from the RoCEv2 and TCP header sizes."""

from __future__ import annotations

import numpy as np

from neonic.sim.network.transport import rdma_wire_bytes, tcp_wire_bytes


def test_roce_middle_packet_costs_82_bytes_beside_its_payload():
    # 2 full packets = FIRST (with RETH) + LAST: 2 * (4096 + 82) + 16
    assert rdma_wire_bytes(8192, 4096) == 2 * (4096 + 82) + 16
    # marginal cost of one more full packet (a MIDDLE) is 4096 + 82 B: ~98% goodput
    assert rdma_wire_bytes(3 * 4096, 4096) - rdma_wire_bytes(2 * 4096, 4096) == 4096 + 82
    assert 4096 / (4096 + 82) > 0.98


def test_roce_padding_and_empty_messages():
    assert rdma_wire_bytes(1, 4096) == 4 + 82 + 16  # padded to 4 B
    assert rdma_wire_bytes(0, 4096) == 0
    np.testing.assert_array_equal(rdma_wire_bytes(np.array([4096, 4097]), 4096), [4096 + 98, 4100 + 2 * 82 + 16])


def test_tcp_segments_of_mtu_minus_40():
    assert tcp_wire_bytes(1460, 1500) == 1460 + 78
    assert tcp_wire_bytes(1461, 1500) == 1461 + 2 * 78


def test_roce_padding_is_the_payload_rounded_up_to_4_bytes_for_every_size():
    """The pad to a 4-byte boundary (computed without np.mod, which is slow at a million
    messages) is np.mod(-n, 4) for whole sizes up to 2^52, fractional sizes, and sizes below a
    byte (where a quarter of the size can underflow)."""
    rng = np.random.default_rng(3)
    sizes = np.concatenate([np.arange(0, 5000), np.floor(rng.uniform(0, 2.0**52, 20000)), rng.uniform(0, 100, 20000),
                            [5e-324, 1e-300, 0.3, 2.0**53]])
    packets = np.ceil(sizes / 4096)
    expect = np.where(sizes > 0, sizes + np.mod(-sizes, 4) + packets * 82 + 16, 0.0)
    np.testing.assert_array_equal(rdma_wire_bytes(sizes, 4096), expect)
