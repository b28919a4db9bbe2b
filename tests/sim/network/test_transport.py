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


def test_framing_factor_of_a_large_batch_is_that_of_each_message(monkeypatch):
    """A large batch is framed once per distinct size and gathered: every message gets the
    factor it gets on its own, bit for bit (empty, sub-byte, negative zero, MTU edges, both
    protocols); a batch of mostly distinct sizes is framed message by message, the same."""
    from neonic.sim.network import transport

    rng = np.random.default_rng(19)
    few = np.array([0.0, -0.0, 0.25, 1.0, 3.0, 4095.0, 4096.0, 4097.0, 2565.0, 21817.0, 1e9, 7.5])
    batches = [few[rng.integers(0, few.size, 5000)], rng.integers(1, 1 << 30, 5000).astype(np.float64)]
    monkeypatch.setattr(transport, "HAVE_NUMBA", True)  # (the kernel runs as Python under NEONIC_NO_NUMBA)
    monkeypatch.setattr(transport, "DISTINCT_MIN", 64)
    for nb in batches:
        for protocol, mtu in (("rdma", 4096), ("rdma", 1024), ("tcp", 1500)):
            want = np.array([transport._framing(nb[i:i + 1], protocol, mtu)[0] for i in range(nb.size)])
            got = transport.framing_factor(nb, protocol, mtu)
            assert got.dtype == np.float64 and np.array_equal(got.view(np.int64), want.view(np.int64))
