"""cocotb bench: the depacketizer's generated Verilog takes scapy-built frames, good and broken,
under random idle on ``frame``, random stalls of the memory port and backpressure on
``completion``; a scoreboard holds memory contents, completions and per-reason drop counters
to the reference receiver (``sim.reference.roce.Receiver``)."""

from __future__ import annotations

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles, with_timeout

from neonic.rtl.depacketizer import Counters, Completion, QPInit
from neonic.rtl.roce import DROP_REASONS, FrameBeat
from neonic.sim.harness.cocotb_streams import (CocotbMemory, Codec, StreamDriver, StreamMonitor,
                                        start_clock_and_reset, tb_params, tb_record, tb_rng)
from neonic.sim.reference.roce import Destination, Message, Receiver, frame_beats
from neonic.sim.reference.roce_frames import broken_frames, scapy_message

MEM_BYTES = 1 << 16


def workload(rng, W, pmtu, sizes):
    """Frames of good messages on QPs 0..3 (PSNs from random starts, some wrapping), each
    followed at random by a broken frame; the initial PSN per QP."""
    dests = [Destination(mac=0x0200_0000_0002, ip=0x0A000002, qpn=q) for q in range(4)]
    psns = {q: int(rng.integers(1 << 24)) if q else (1 << 24) - 2 for q in range(4)}
    nxt = dict(psns)
    frames, va = [], 0
    for i, n in enumerate(sizes):
        q = i % 4
        msg = Message(dest=q, va=va, rkey=7, payload=rng.integers(0, 256, n, np.uint8).tobytes(),
                      imm=(i * 17 if i % 2 else None))
        va += -(-n // W) * W + W
        sent = scapy_message(msg, dests[q], nxt[q], pmtu)
        frames += sent
        nxt[q] = (nxt[q] + len(sent)) % (1 << 24)
        if rng.random() < 0.5:
            bad = broken_frames(rng, dests[q], va=va, psn=nxt[q])
            frames.append(bad[int(rng.integers(len(bad)))][1])
    return frames, psns


@cocotb.test()
async def frames_to_memory(dut):
    p = tb_params()
    W, pmtu, num_qps = p["data_bytes"], p["pmtu"], p["num_qps"]
    qp_bits = max(1, (num_qps - 1).bit_length())
    rng = tb_rng()
    frames, psns = workload(rng, W, pmtu, p["sizes"])
    rx = Receiver(num_qps=num_qps, pmtu=pmtu)
    for q, psn in psns.items():
        rx.set_psn(q, psn)
    for f in frames:
        rx.receive(f)

    await start_clock_and_reset(dut)      # (the design's outputs are X until reset)
    qp_init = StreamDriver(dut, "qp_init", QPInit(qp_bits), dut.clk, rng=tb_rng(1))
    frame = StreamDriver(dut, "frame", FrameBeat(W), dut.clk, rng=tb_rng(2), idle=p["idle"])
    completion = StreamMonitor(dut, "completion", Completion(qp_bits), dut.clk, rng=tb_rng(3),
                               backpressure=p["backpressure"])
    mem = CocotbMemory(dut, "mem", np.zeros(MEM_BYTES, np.uint8), data_bytes=W, rng=tb_rng(4),
                       accept_stall=p["accept_stall"], beats_width=p["beats_width"])
    await qp_init.send_all([{"qp": q, "psn": psn, "format": 0, "dim": 0}
                            for q, psn in psns.items()])
    beats = frame_beats(frames, W)
    deadline = 500 + 4 * len(beats) + 2 * sum(len(f) for f in frames) // W
    await with_timeout(frame.send_all(beats), deadline * 10, "ns")
    if rx.completions:
        await with_timeout(completion.wait_for(len(rx.completions)), deadline * 10, "ns")
    await ClockCycles(dut.clk, 3 * pmtu // W + 40)      # let the last writes drain

    got = [(c["qp"], c["length"], c["imm"] if c["has_imm"] else None)
           for c in completion.received]
    assert got == [(c.qp, c.length, c.imm) for c in rx.completions], "completions differ"
    counters = Codec(Counters()).unpack(dut.counters.value.to_unsigned())
    assert counters == {"accepted": rx.accepted, **rx.drops}, (counters, rx.drops)
    want = np.zeros(MEM_BYTES, np.uint8)
    for addr, value in rx.memory.items():
        want[addr] = value
    diff = np.flatnonzero(mem.contents != want)
    assert diff.size == 0, f"memory differs at {diff[:8]}"
    mem.check_idle()
    tb_record(frames=len(frames), accepted=rx.accepted,
              dropped={r: n for r, n in rx.drops.items() if n})


@cocotb.test()
async def stimulus_run(dut):
    """The frames and initial PSNs of a ``stimulus`` JSON file (as ``neonic rtl sim
    depacketizer`` writes it) fed back to back, memory always ready and completions always
    taken, as the Amaranth run does; records what the design did (memory requests and write
    beats, completions, counters, cycles) for the driver's scoreboard. Without a stimulus
    file this test has nothing to run."""
    import json
    from pathlib import Path

    from cocotb.triggers import ReadOnly, RisingEdge

    from neonic.rtl.streams import MemRequest, MemWriteBeat

    p = tb_params()
    if not p.get("stimulus"):
        return
    stim = json.loads(Path(p["stimulus"]).read_text())
    W, num_qps = p["data_bytes"], p["num_qps"]
    qp_bits = max(1, (num_qps - 1).bit_length())
    frames = [bytes.fromhex(f) for f in stim["frames"]]
    psns = {int(q): v for q, v in stim["psns"].items()}
    dut.frame__valid.value = 0            # no frame while the QPs are set up (not left X)
    await start_clock_and_reset(dut)
    qp_init = StreamDriver(dut, "qp_init", QPInit(qp_bits), dut.clk, rng=tb_rng(1))
    completion = StreamMonitor(dut, "completion", Completion(qp_bits), dut.clk, rng=tb_rng(3))
    reqs = StreamMonitor(dut, "mem__req", MemRequest(len(dut.mem__req__payload) - 1 - p["beats_width"],
                                                     p["beats_width"]), dut.clk, rng=tb_rng(5))
    wdata = StreamMonitor(dut, "mem__wdata", MemWriteBeat(W), dut.clk, rng=tb_rng(6))
    await qp_init.send_all([{"qp": q, "psn": psn, "format": 0, "dim": 0}
                            for q, psn in psns.items()])
    clock = {"n": 0, "last_write": 0}

    async def count():
        seen = 0
        while True:
            await RisingEdge(dut.clk)
            clock["n"] += 1
            if len(wdata.received) != seen:
                seen = len(wdata.received)
                clock["last_write"] = clock["n"]

    cocotb.start_soon(count())
    beats = frame_beats(frames, W)
    codec = Codec(FrameBeat(W))
    beat_cycles = []
    for beat in beats:
        dut.frame__payload.value = codec.pack(beat)
        dut.frame__valid.value = 1
        while True:
            await ReadOnly()
            ready = int(dut.frame__ready.value)
            await RisingEdge(dut.clk)
            if ready:
                beat_cycles.append(clock["n"])
                break
    dut.frame__valid.value = 0
    quiet = 2 * p["pmtu"] // W + 40
    while clock["n"] - max(clock["last_write"], beat_cycles[-1] if beat_cycles else 0) < quiet:
        await RisingEdge(dut.clk)
    counters = Codec(Counters()).unpack(dut.counters.value.to_unsigned())
    tb_record(requests=[[r["addr"], r["beats"]] for r in reqs.received],
              writes=[[w["data"], w["mask"]] for w in wdata.received],
              completions=[[c["qp"], c["length"], c["imm"] if c["has_imm"] else None]
                           for c in completion.received],
              counters=counters, beat_cycles=beat_cycles, done_cycle=clock["last_write"])
