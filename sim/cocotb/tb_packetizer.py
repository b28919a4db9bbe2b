"""cocotb bench: the packetizer's generated Verilog sends the reference model's frames byte for
byte, under random idle on its inputs and backpressure on ``frame``."""

from __future__ import annotations

import cocotb
import numpy as np
from amaranth.hdl import unsigned
from cocotb.triggers import ClockCycles, with_timeout

from neonic.rtl.packetizer import DestEntry, SendDescriptor
from neonic.rtl.roce import FrameBeat
from neonic.sim.harness.cocotb_streams import (StreamDriver, StreamMonitor, start_clock_and_reset,
                                        tb_params, tb_rng)
from neonic.sim.reference.roce import Destination, Message, build_frames

LOCAL_MAC, LOCAL_IP = 0x02_00_00_00_00_01, 0x0A_00_00_01


@cocotb.test()
async def frames_match_reference(dut):
    p = tb_params()
    W, pmtu, num_dest = p["data_bytes"], p["pmtu"], p["num_dest"]
    dest_bits = max(1, (num_dest - 1).bit_length())
    rng = tb_rng()
    await start_clock_and_reset(dut)
    dut.local_mac.value = LOCAL_MAC
    dut.local_ip.value = LOCAL_IP
    dests = [Destination(mac=0x0200_0000_1000 + i, ip=0x0A000100 + i, qpn=7 * i + 1)
             for i in range(num_dest)]
    psns = [int(rng.integers(1 << 24)) if i else (1 << 24) - 2 for i in range(num_dest)]
    msgs = [Message(dest=int(rng.integers(num_dest)), va=int(rng.integers(1 << 60)),
                    rkey=int(rng.integers(1 << 32)),
                    payload=rng.integers(0, 256, int(n), np.uint8).tobytes(),
                    imm=int(rng.integers(1 << 32)) if k % 2 else None)
            for k, n in enumerate(p["sizes"])]
    golden, nxt = [], list(psns)
    for m in msgs:
        fr = build_frames(m, dests[m.dest], local_mac=LOCAL_MAC, local_ip=LOCAL_IP,
                          psn=nxt[m.dest], pmtu=pmtu)
        nxt[m.dest] = (nxt[m.dest] + len(fr)) % (1 << 24)
        golden += [f.data for f in fr]

    table = StreamDriver(dut, "table", DestEntry(dest_bits), dut.clk, rng=rng)
    desc = StreamDriver(dut, "desc", SendDescriptor(dest_bits), dut.clk, rng=tb_rng(1),
                        idle=p["idle"])
    payload = StreamDriver(dut, "payload", unsigned(8 * W), dut.clk, rng=tb_rng(2), idle=p["idle"])
    frame = StreamMonitor(dut, "frame", FrameBeat(W), dut.clk, rng=tb_rng(3),
                          backpressure=p["backpressure"])
    await table.send_all([{"index": i, "mac": d.mac, "ip": d.ip, "qpn": d.qpn,
                           "udp_sport": d.udp_sport, "psn": psns[i]} for i, d in enumerate(dests)])
    cocotb.start_soon(desc.send_all([{"dest": m.dest, "va": m.va, "rkey": m.rkey,
                                      "length": len(m.payload), "imm": m.imm or 0,
                                      "has_imm": int(m.imm is not None)} for m in msgs]))
    beats = []
    for m in msgs:
        raw = m.payload + bytes(-len(m.payload) % W)
        beats += [int.from_bytes(raw[i:i + W], "little") for i in range(0, len(raw), W)]
    cocotb.start_soon(payload.send_all(beats))

    frames, current, taken = [], b"", 0
    deadline = 200 + 8 * (sum(len(b) for b in golden) // W + 4 * len(golden))
    while len(frames) < len(golden):
        beat = await with_timeout(frame.recv(), deadline * 10, "ns")
        data = beat["data"].to_bytes(W, "little")
        if beat["last"]:
            frames.append(current + data[:beat["count"]])
            current = b""
        else:
            assert beat["count"] == W
            current += data
        taken += 1
    for i, (got, want) in enumerate(zip(frames, golden)):
        assert got == want, f"frame {i}: got {got.hex()} want {want.hex()}"
    await ClockCycles(dut.clk, 5)
    assert len(frame.received) == taken, "extra frame beats after the last frame"
    if p.get("record_frames"):
        from neonic.sim.harness.cocotb_streams import tb_record
        tb_record(frames=[f.hex() for f in frames], beats=taken, messages=len(msgs))
