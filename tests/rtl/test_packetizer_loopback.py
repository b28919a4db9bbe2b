"""Loopback: packetizer -> depacketizer restores the pooled embeddings in the receiver's
memory, in hardware: bit for bit in FP32, round-to-nearest-even in FP16/BF16, and INT8 within
half a quantization step (plus the documented rounding of the scale); and the timing model
predicts the packetizer's cycles within 5%."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module
from amaranth.lib import wiring

from neonic.rtl.depacketizer import QUANT_FORMATS, Depacketizer
from neonic.rtl.packetizer import Packetizer
from neonic.sim.harness import AmaranthMemory, run_amaranth, stream_recv, stream_send
from neonic.sim.reference.fp import int8_rowwise_error_bound
from neonic.sim.reference.roce import Destination, dequantize, quantize, wire_length
from neonic.sim.timing.packetizer import estimate_tx
from neonic.sim.reference.roce_frames import LOCAL_IP, LOCAL_MAC
from tests.rtl.test_packetizer import make_messages, run_packetizer

DESTS = [Destination(mac=0x0200_0000_2000 + i, ip=0x0A000200 + i, qpn=2 * i + 1) for i in range(4)]


class Loopback(Elaboratable):
    def __init__(self, W, pmtu, quant):
        self.tx = Packetizer(data_bytes=W, pmtu=pmtu, num_dest=4, quant=quant)
        self.rx = Depacketizer(data_bytes=W, pmtu=pmtu, num_qps=8, formats=(quant,))

    def elaborate(self, platform):
        m = Module()
        m.submodules.tx, m.submodules.rx = self.tx, self.rx
        wiring.connect(m, self.tx.frame, self.rx.frame)
        return m


def run_loopback(width, quant, values, dim, rng, pmtu=256):
    """Send each array of ``values`` (rows x dim FP32) as one message with an immediate;
    returns (the receiver's memory per message as FP32 arrays, completions)."""
    top = Loopback(width, pmtu, quant)
    tx, rx = top.tx, top.rx
    region = 1 << 13
    mem = AmaranthMemory(rx.mem, np.zeros(len(values) * region, np.uint8), data_bytes=width,
                         rng=rng, accept_stall=0.25)
    completions = []

    async def host(ctx):
        ctx.set(tx.local_mac, LOCAL_MAC)
        ctx.set(tx.local_ip, LOCAL_IP)
        await stream_send(ctx, tx.table, [{"index": i, "mac": d.mac, "ip": d.ip, "qpn": d.qpn,
                                           "udp_sport": d.udp_sport, "psn": 100 + i}
                                          for i, d in enumerate(DESTS)])
        await stream_send(ctx, rx.qp_init, [{"qp": d.qpn, "psn": 100 + i, "dim": dim,
                                             "format": QUANT_FORMATS.index(quant)}
                                            for i, d in enumerate(DESTS)])
        await stream_send(ctx, tx.desc, [{"dest": i % 4, "va": i * region, "rkey": 9,
                                          "length": v.nbytes, "imm": i, "has_imm": 1,
                                          "dim": dim}
                                         for i, v in enumerate(values)], rng=rng, idle=0.25)

    async def payload(ctx):
        beats = []
        for v in values:
            raw = v.tobytes() + bytes(-v.nbytes % width)
            beats += [int.from_bytes(raw[i:i + width], "little") for i in range(0, len(raw), width)]
        await stream_send(ctx, tx.payload, beats, rng=rng, idle=0.25)

    async def sink(ctx):
        for c in await stream_recv(ctx, rx.completion, len(values), rng=rng, backpressure=0.25):
            completions.append((int(c.qp), int(c.length), int(c.imm)))

    run_amaranth(top, [host, payload, sink], processes=[mem.process], max_cycles=40000)
    mem.check_idle()
    got = [mem.contents[i * region: i * region + v.nbytes].copy().view(np.float32).reshape(v.shape)
           for i, v in enumerate(values)]
    return got, completions


@pytest.mark.parametrize("width,quant,dim,rows", [
    (16, "none", 37, [6, 2, 9]), (64, "none", 37, [6, 2, 9]),
    (32, "fp16", 37, [6, 2, 9]), (8, "bf16", 37, [6, 1, 9]),   # lengths not a multiple of 2 beats
    (16, "int8", 24, [3, 10]),          # 8 rows a packet: ONLY, then FIRST + LAST with fill
])
def test_loopback_restores_embeddings(width, quant, dim, rows, rng):
    values = [(rng.standard_normal((n, dim)) * rng.uniform(0.01, 100)).astype(np.float32)
              for n in rows]
    got, completions = run_loopback(width, quant, values, dim, rng)
    assert completions == [(DESTS[i % 4].qpn, wire_length(v.nbytes, quant, dim=dim, pmtu=256), i)
                           for i, v in enumerate(values)]
    for v, g in zip(values, got):
        want = dequantize(quantize(v, quant, dim=dim, pmtu=256), quant, dim=dim,
                          pmtu=256).reshape(v.shape)
        assert g.tobytes() == want.tobytes(), "hardware and reference restore differently"
        if quant == "none":
            assert g.tobytes() == v.tobytes()
        elif quant in ("fp16", "bf16"):
            half_ulp = 2.0 ** (-11 if quant == "fp16" else -8)   # relative, normal range
            assert np.all(np.abs(g - v) <= half_ulp * np.abs(v))
        else:
            err = np.abs(g.astype(np.float64) - v).max(axis=1)
            step = (v.max(axis=1).astype(np.float64) - v.min(axis=1)) / 510
            assert np.all(err <= int8_rowwise_error_bound(v))
            assert np.all(err <= step * (1 + 2 ** -20) + np.spacing(np.abs(v).max(axis=1)))


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


@pytest.mark.parametrize("width,pmtu,dim,rows,div_bits", [
    (16, 256, 24, 20, 9),     # input-bound: 6 beats a row, the dividers finish a row in 5
    (8, 256, 6, 40, 9),       # scale and bias take their own cycle; the dividers bound a row
    (16, 256, 8, 40, 3),      # 11-cycle divisions bound a 2-beat row
])
def test_int8_streams_rows_and_timing_model_within_5_percent(width, pmtu, dim, rows, div_bits,
                                                              rng):
    """INT8 rows stream through the quantizer's pipeline: the frames carry the reference wire
    image and the cycles are the timing model's within 5%, for input-bound and divider-bound
    rows."""
    from neonic.sim.units import packetizer as unit
    from neonic.sim.reference.roce import Message, build_frames
    x = rng.standard_normal((rows, dim)).astype(np.float32)
    msg = Message(dest=0, va=0x2000, rkey=5, payload=x.tobytes())
    dut = Packetizer(data_bytes=width, pmtu=pmtu, num_dest=1, quant="int8", max_dim=max(8, dim),
                     div_bits_per_cycle=div_bits)
    tx = unit.run_tx(dut, [msg], dim=dim)
    wire = Message(0, 0x2000, 5, quantize(x, "int8", dim=dim, pmtu=pmtu))
    assert tx.frames == [f.data for f in build_frames(wire, unit.DESTINATIONS[0], psn=0, pmtu=pmtu,
                                                      local_mac=unit.LOCAL_MAC,
                                                      local_ip=unit.LOCAL_IP)]
    est = estimate_tx([x.nbytes], data_bytes=width, pmtu=pmtu, quant="int8", dim=dim,
                      div_bits_per_cycle=div_bits)
    assert abs(est.cycles - tx.cycles) <= 0.05 * tx.cycles, (est.cycles, tx.cycles)
