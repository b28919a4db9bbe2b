"""The RoCEv2 reference model agrees with scapy's RoCE layer and validates frames by reason."""

from __future__ import annotations

import numpy as np
import pytest

from rtl.roce import (DROP_REASONS, OP_WRITE_FIRST, OP_WRITE_LAST, OP_WRITE_LAST_IMM,
                      OP_WRITE_MIDDLE, OP_WRITE_ONLY, OP_WRITE_ONLY_IMM)
from tests.rtl.roce_frames import LOCAL_IP, LOCAL_MAC, broken_frames, scapy_message
from sim.reference.roce import (Destination, Message, Receiver, build_frames, dequantize,
                                quantize, segment)

DEST = Destination(mac=0x02_00_00_00_00_02, ip=0x0A_00_00_02, qpn=5, udp_sport=0xC123)


@pytest.mark.parametrize("length", [1, 2, 3, 4, 5, 63, 127, 256, 512, 1000, 1500, 4096, 9000])
@pytest.mark.parametrize("imm", [None, 0xDEADBEEF])
def test_frames_match_scapy(length, imm, rng):
    payload = rng.integers(0, 256, length, dtype=np.uint8).tobytes()
    msg = Message(dest=0, va=0x1000_2000_3000, rkey=0xABCD1234, payload=payload, imm=imm)
    psn = (1 << 24) - 2  # wraps within multi-packet messages
    ours = [f.data for f in build_frames(msg, DEST, local_mac=LOCAL_MAC, local_ip=LOCAL_IP,
                                         psn=psn, pmtu=1024)]
    assert ours == scapy_message(msg, DEST, psn, 1024)


def test_segmentation_opcodes():
    assert segment(4096, 4096, False) == [(OP_WRITE_ONLY, 4096)]
    assert segment(4097, 4096, True) == [(OP_WRITE_FIRST, 4096), (OP_WRITE_LAST_IMM, 1)]
    assert segment(3 * 256, 256, False) == [(OP_WRITE_FIRST, 256), (OP_WRITE_MIDDLE, 256),
                                            (OP_WRITE_LAST, 256)]
    with pytest.raises(ValueError, match="pmtu"):
        segment(10, 300, False)


def _good(rng, length=600, imm=7, psn=0):
    payload = rng.integers(0, 256, length, dtype=np.uint8).tobytes()
    msg = Message(dest=0, va=0x4000, rkey=1, payload=payload, imm=imm)
    return msg, [f.data for f in build_frames(msg, DEST, local_mac=LOCAL_MAC, local_ip=LOCAL_IP,
                                              psn=psn, pmtu=256)]


def test_receiver_accepts_and_writes(rng):
    msg, frames = _good(rng)
    rx = Receiver(num_qps=8, pmtu=256)
    for f in frames:
        assert rx.receive(f) is None
    assert bytes(rx.memory[0x4000 + i] for i in range(len(msg.payload))) == msg.payload
    assert rx.completions[0].imm == 7 and rx.completions[0].length == 600


def test_receiver_drop_reasons(rng):
    rx = Receiver(num_qps=8, pmtu=256)
    for reason, frame in broken_frames(rng, DEST, LOCAL_MAC, LOCAL_IP):
        got = rx.classify(frame)
        assert got == reason, (reason, got)
    assert set(r for r, _ in broken_frames(rng, DEST, LOCAL_MAC, LOCAL_IP)) == set(DROP_REASONS)


@pytest.mark.parametrize("quant,tol", [("none", 0), ("fp16", 2**-11), ("bf16", 2**-8)])
def test_quantize_roundtrip(quant, tol, rng):
    x = rng.standard_normal(1000).astype(np.float32)
    y = dequantize(quantize(x, quant), quant)
    assert np.all(np.abs(y - x) <= tol * np.abs(x))
