"""Loopback: packetizer -> depacketizer reproduces the pooled embeddings in the receiver's
memory, bit for bit in FP32 and within the format's rounding bound in FP16/BF16; and the
timing model predicts the packetizer's cycles within 5%."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module
from amaranth.lib import wiring

from rtl.depacketizer import Depacketizer
from rtl.packetizer import Packetizer
from sim.harness import run_amaranth, stream_recv, stream_send
from sim.reference.roce import Message, dequantize, wire_length
from sim.timing.packetizer import estimate_tx
from tests.rtl.roce_frames import LOCAL_IP, LOCAL_MAC
from tests.rtl.test_depacketizer import WriteSink
from tests.rtl.test_packetizer import make_messages, run_packetizer
from sim.reference.roce import Destination

DESTS = [Destination(mac=0x0200_0000_2000 + i, ip=0x0A000200 + i, qpn=2 * i + 1) for i in range(4)]


class Loopback(Elaboratable):
    def __init__(self, W, pmtu, quant):
        self.tx = Packetizer(data_bytes=W, pmtu=pmtu, num_dest=4, quant=quant)
        self.rx = Depacketizer(data_bytes=W, pmtu=pmtu, num_qps=8)

    def elaborate(self, platform):
        m = Module()
        m.submodules.tx, m.submodules.rx = self.tx, self.rx
        wiring.connect(m, self.tx.frame, self.rx.frame)
        return m


@pytest.mark.parametrize("width,quant", [(16, "none"), (64, "none"), (32, "fp16"), (8, "bf16")])
def test_loopback_embeddings(width, quant, rng):
    top = Loopback(width, 256, quant)
    tx, rx = top.tx, top.rx
    rows, dim = 6, 40                      # pooled embeddings per destination: rows x dim FP32
    n_msgs = 3
    values = [rng.standard_normal((rows, dim)).astype(np.float32) for _ in range(n_msgs)]
    region = 1 << 12
    mem = WriteSink(rx.mem, np.zeros(n_msgs * region, np.uint8), width, rng, 0.25)
    completions = []

    async def host(ctx):
        ctx.set(tx.local_mac, LOCAL_MAC)
        ctx.set(tx.local_ip, LOCAL_IP)
        await stream_send(ctx, tx.table, [{"index": i, "mac": d.mac, "ip": d.ip, "qpn": d.qpn,
                                           "udp_sport": d.udp_sport, "psn": 100 + i}
                                          for i, d in enumerate(DESTS)])
        await stream_send(ctx, rx.qp_init, [{"qp": d.qpn, "psn": 100 + i}
                                            for i, d in enumerate(DESTS)])
        await stream_send(ctx, tx.desc, [{"dest": i % 4, "va": i * region, "rkey": 9,
                                          "length": v.nbytes, "imm": i, "has_imm": 1}
                                         for i, v in enumerate(values)], rng=rng, idle=0.25)

    async def payload(ctx):
        beats = []
        for v in values:
            raw = v.tobytes()
            beats += [int.from_bytes(raw[i:i + width], "little") for i in range(0, len(raw), width)]
        await stream_send(ctx, tx.payload, beats, rng=rng, idle=0.25)

    async def sink(ctx):
        for c in await stream_recv(ctx, rx.completion, n_msgs, rng=rng, backpressure=0.25):
            completions.append((int(c.qp), int(c.length), int(c.imm)))

    run_amaranth(top, [host, payload, sink], processes=[mem.process], max_cycles=30000)
    assert completions == [(DESTS[i % 4].qpn, wire_length(v.nbytes, quant), i)
                           for i, v in enumerate(values)]
    for i, v in enumerate(values):
        n = wire_length(v.nbytes, quant)
        got = dequantize(mem.contents[i * region: i * region + n].tobytes(), quant).reshape(v.shape)
        if quant == "none":
            assert got.tobytes() == v.tobytes()
        else:
            ulp = 2.0 ** (-11 if quant == "fp16" else -8)   # half an ulp, relative
            assert np.all(np.abs(got - v) <= ulp * np.abs(v))
            assert np.array_equal(got, dequantize(_rne(v, quant), quant).reshape(v.shape))


def _rne(v, quant):
    from sim.reference.roce import quantize
    return quantize(v, quant)


@pytest.mark.parametrize("width,sizes", [(64, [4096 * 3, 200]), (8, [700, 33, 1024])])
def test_timing_model_within_5_percent(width, sizes, rng):
    dut = Packetizer(data_bytes=width, pmtu=1024 if width == 8 else 4096, num_dest=4)
    msgs = make_messages(rng, sizes, [True] * len(sizes))
    frames, cycles = run_packetizer(dut, msgs, {})
    est = estimate_tx(sizes, data_bytes=width, pmtu=dut.pmtu, with_imm=[True] * len(sizes))
    assert est.frames == len(frames)
    assert est.beats == sum(-(-len(f) // width) for f in frames)
    # the run's cycles include the table write (4 rows) before the first descriptor
    measured = cycles - 4
    assert abs(est.cycles - measured) <= 0.05 * measured, (est.cycles, measured)
