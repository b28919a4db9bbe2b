"""cocotb bench: the packetizer's generated Verilog sends the reference model's frames byte for
byte, under random idle on its inputs and backpressure on ``frame``.

Parameters (``tb_params()``): ``data_bytes``, ``pmtu``, ``num_dest``, ``idle``,
``backpressure``, and either ``sizes`` (message lengths; the bench draws destinations,
payloads, PSNs and immediates from its seed) or ``stimulus`` (a JSON file with the local MAC
and IP, the destination table with PSNs, and the messages, as ``neonic rtl sim packetizer``
writes it, so that every simulator runs the same messages). ``record_frames`` records the
frames, the cycle of every frame beat (counted from the first descriptor offered) and the
cycles from the first descriptor to the last beat.
"""

from __future__ import annotations

import json
from pathlib import Path

import cocotb
import numpy as np
from amaranth.hdl import unsigned
from cocotb.triggers import ClockCycles, RisingEdge, with_timeout

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
    local_mac, local_ip = LOCAL_MAC, LOCAL_IP
    if p.get("stimulus"):
        stim = json.loads(Path(p["stimulus"]).read_text())
        local_mac, local_ip = stim["local_mac"], stim["local_ip"]
        dests = [Destination(mac=d["mac"], ip=d["ip"], qpn=d["qpn"], udp_sport=d["udp_sport"])
                 for d in stim["destinations"]]
        psns = [d["psn"] for d in stim["destinations"]]
        msgs = [Message(dest=m["dest"], va=m["va"], rkey=m["rkey"],
                        payload=bytes.fromhex(m["payload"]), imm=m["imm"])
                for m in stim["messages"]]
    else:
        dests = [Destination(mac=0x0200_0000_1000 + i, ip=0x0A000100 + i, qpn=7 * i + 1)
                 for i in range(num_dest)]
        psns = [int(rng.integers(1 << 24)) if i else (1 << 24) - 2 for i in range(num_dest)]
        msgs = [Message(dest=int(rng.integers(num_dest)), va=int(rng.integers(1 << 60)),
                        rkey=int(rng.integers(1 << 32)),
                        payload=rng.integers(0, 256, int(n), np.uint8).tobytes(),
                        imm=int(rng.integers(1 << 32)) if k % 2 else None)
                for k, n in enumerate(p["sizes"])]
    dut.local_mac.value = local_mac
    dut.local_ip.value = local_ip
    golden, nxt = [], list(psns)
    for m in msgs:
        fr = build_frames(m, dests[m.dest], local_mac=local_mac, local_ip=local_ip,
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
    clock = {"n": 0}

    async def count():
        while True:
            await RisingEdge(dut.clk)
            clock["n"] += 1

    cocotb.start_soon(count())
    cocotb.start_soon(desc.send_all([{"dest": m.dest, "va": m.va, "rkey": m.rkey,
                                      "length": len(m.payload), "imm": m.imm or 0,
                                      "has_imm": int(m.imm is not None)} for m in msgs]))
    beats = []
    for m in msgs:
        raw = m.payload + bytes(-len(m.payload) % W)
        beats += [int.from_bytes(raw[i:i + W], "little") for i in range(0, len(raw), W)]
    cocotb.start_soon(payload.send_all(beats))

    frames, current, taken = [], b"", 0
    beat_cycles, last_cycles = [], []
    deadline = 200 + 8 * (sum(len(b) for b in golden) // W + 4 * len(golden))
    while len(frames) < len(golden):
        beat = await with_timeout(frame.recv(), deadline * 10, "ns")
        data = beat["data"].to_bytes(W, "little")
        beat_cycles.append(clock["n"])
        if beat["last"]:
            last_cycles.append(clock["n"])
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
        tb_record(frames=[f.hex() for f in frames], beats=taken, messages=len(msgs),
                  beat_cycles=beat_cycles, last_beat_cycles=last_cycles,
                  cycles=last_cycles[-1])
