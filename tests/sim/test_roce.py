"""The RoCEv2 reference model agrees with scapy's RoCE layer and validates frames by reason."""

from __future__ import annotations

import numpy as np
import pytest

from neonic.rtl.roce import (DROP_REASONS, OP_WRITE_FIRST, OP_WRITE_LAST, OP_WRITE_LAST_IMM,
                      OP_WRITE_MIDDLE, OP_WRITE_ONLY, OP_WRITE_ONLY_IMM)
from neonic.sim.reference.roce_frames import LOCAL_IP, LOCAL_MAC, broken_frames, scapy_message
from neonic.sim.reference.roce import (Destination, Message, Receiver, build_frames, dequantize,
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


def test_int8_wire_image_whole_rows_per_packet(rng):
    """Per row: scale = (max - min)/255 and bias = min (FP32) before the codes; a packet-sized
    block holds pmtu // (dim + 8) whole rows, then zero fill."""
    from neonic.sim.reference.roce import int8_rows_per_packet, wire_length
    dim, pmtu = 24, 256
    x = rng.standard_normal((19, dim)).astype(np.float32)
    wire = quantize(x, "int8", dim=dim, pmtu=pmtu)
    per = int8_rows_per_packet(dim, pmtu)
    assert per == 8
    assert len(wire) == wire_length(x.nbytes, "int8", dim=dim, pmtu=pmtu) == 2 * pmtu + 3 * 32
    assert wire[8 * 32:pmtu] == bytes(pmtu - 8 * 32)                  # fill closes a block
    row9 = wire[pmtu + 32:pmtu + 64]                                   # row 9: block 1, row 1
    scale, bias = np.frombuffer(row9[:8], np.float32)
    assert bias == x[9].min()
    assert scale == np.float32(np.float32(x[9].max() - x[9].min()) / np.float32(255))
    assert np.frombuffer(row9[8:], np.uint8)[np.argmax(x[9])] == 255
    y = dequantize(wire, "int8", dim=dim, pmtu=pmtu).reshape(x.shape)
    assert np.all(np.abs(y - x).max(axis=1) <= (x.max(1) - x.min(1)) / 510 * (1 + 1e-6) + 1e-6)


@pytest.mark.parametrize("quant", ["fp16", "int8"])
def test_receiver_restores_fp32_per_qp_format(quant, rng):
    dim = 16
    x = rng.standard_normal((40, dim)).astype(np.float32)
    wire = quantize(x, quant, dim=dim, pmtu=256)
    msg = Message(dest=0, va=0x8000, rkey=1, payload=wire, imm=3)
    frames = [f.data for f in build_frames(msg, DEST, local_mac=LOCAL_MAC, local_ip=LOCAL_IP,
                                           psn=0, pmtu=256)]
    rx = Receiver(num_qps=8, pmtu=256)
    rx.set_psn(DEST.qpn, 0, quant, dim)
    assert [rx.receive(f) for f in frames] == [None] * len(frames)
    got = np.frombuffer(bytes(rx.memory[0x8000 + i] for i in range(x.nbytes)), np.float32)
    assert got.tobytes() == dequantize(wire, quant, dim=dim, pmtu=256).tobytes()
    assert rx.completions[0].length == len(wire)


@pytest.mark.parametrize("kw,match", [({"quant": "int4"}, "quant"), ({"dim": 250}, "dim"),
                                      ({"length": 4 * 17}, "length")])
def test_int8_parameter_errors(kw, match):
    from neonic.sim.reference.roce import wire_length
    args = {"length": 4 * 32, "quant": "int8", "dim": 16, "pmtu": 256, **kw}
    with pytest.raises(ValueError, match=match):
        wire_length(args.pop("length"), args.pop("quant"), **args)
