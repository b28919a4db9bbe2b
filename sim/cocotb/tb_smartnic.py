"""cocotb bench: the SmartNIC top's generated Verilog runs one co-simulation phase for every NIC
of a cluster (``sim/cosim.py`` writes the job, reads the results back).

The job (JSON, path in ``tb_params()["job"]``) holds the NIC parameters, the phase (``tx``: per
NIC, invalidate the cache, write the descriptors and the addressing table, stream the bags and
post the sends, collect the frames; ``rx``: per NIC, initialise the receive QPs and feed the
frames, wait for every completion), the random idle/backpressure probabilities, and the stimulus;
the memory image is a ``.npy`` file. The design is reset between NICs. Results: per NIC the
counters and the frames (``tx``) or the completions (``rx``), written as JSON to
``tb_params()["out"]`` with ``sim_phase`` (the wall time and clock cycles of the NIC loop
alone, for simulation speed), and for ``rx`` the receive memory as ``rx.npy`` beside the job.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import cocotb
import numpy as np
from cocotb.simtime import get_sim_time
from cocotb.triggers import FallingEdge, with_timeout

from neonic.rtl.cache import CacheOp
from neonic.rtl.depacketizer import Completion, QPInit
from neonic.rtl.packetizer import DestEntry, SendDescriptor
from neonic.rtl.roce import FrameBeat
from neonic.rtl.smartnic import SmartNIC, SmartNICCounters
from neonic.sim.reference.roce import frame_beats
from neonic.sim.harness.cocotb_streams import (CocotbMemory, StreamDriver, StreamMonitor, start_clock_and_reset,
                                        tb_params, tb_rng, unpack)


@cocotb.test()
async def cluster_phase(dut):
    p = tb_params()
    job = json.loads(Path(p["job"]).read_text())
    params = {k: (tuple(v) if isinstance(v, list) else v) for k, v in job["params"].items()}
    nic = SmartNIC(**params)
    W = nic.data_bytes
    phase = job["phase"]
    idle, bp = job["idle"], job["backpressure"]
    clk = dut.clk
    dut.local_mac.value = 0
    dut.local_ip.value = 0
    drv = {name: StreamDriver(dut, name, layout, clk, rng=tb_rng(10 + i),
                              idle=idle if name in ("bags", "send", "rx_frame") else 0.0)
           for i, (name, layout) in enumerate([
               ("cache_cmd", CacheOp), ("desc", nic.gather.desc_layout),
               ("dest", DestEntry(nic.packetizer.dest_bits)),
               ("send", SendDescriptor(nic.packetizer.dest_bits)),
               ("bags", nic.gather.item_layout), ("qp_init", QPInit(nic.depacketizer.qp_bits)),
               ("rx_frame", FrameBeat(W))])}
    # The design's outputs are X until the first reset (Icarus): the memories and monitors,
    # which sample their ports every cycle, start right after it (their inputs are don't-care in reset).
    await start_clock_and_reset(dut)
    lat = job["memory_latency"]
    mem = CocotbMemory(dut, "mem", np.load(p["mem"]), data_bytes=W, rng=tb_rng(1),
                       latency=(lat, lat), max_outstanding=64, beats_width=nic.beats_width)
    rx_mem = CocotbMemory(dut, "rx_mem", np.zeros(job["rx_size"], np.uint8), data_bytes=W,
                          rng=tb_rng(2), latency=(1, 1), max_outstanding=64,
                          beats_width=nic.rx_beats_width)
    frames_mon = StreamMonitor(dut, "tx_frame", FrameBeat(W), clk, rng=tb_rng(30),
                               backpressure=bp)
    comp_mon = StreamMonitor(dut, "completion", Completion(nic.depacketizer.qp_bits), clk,
                             rng=tb_rng(31), backpressure=bp)
    layout = SmartNICCounters()
    results = []
    world = len(job["tx"])
    # the simulation phase proper (the build, the export and cocotb's start-up excluded)
    wall0, ns0 = time.perf_counter(), get_sim_time("ns")
    for k, t in enumerate(job["tx"]):
        await FallingEdge(clk)
        dut.rst.value = 1
        await FallingEdge(clk)
        dut.rst.value = 0
        mac = 0x02_4E_49_43_00_00 | t["rank"]
        dut.local_mac.value = mac
        dut.local_ip.value = 0x0A_00_00_00 | t["rank"]
        budget_ns = 10 * (20000 + 40 * (len(t["items"]) + 40 * t["frames"]))
        if phase == "tx":
            await drv["cache_cmd"].send_all([CacheOp.INVALIDATE.value])
            await drv["desc"].send_all(t["descs"])
            await drv["dest"].send_all(t["dests"])
            cocotb.start_soon(drv["bags"].send_all(t["items"]))
            cocotb.start_soon(drv["send"].send_all(t["sends"]))
            frames, cur = [], bytearray()
            while len(frames) < t["frames"]:
                beat = await with_timeout(frames_mon.recv(), budget_ns, "ns")
                cur += beat["data"].to_bytes(W, "little")[:beat["count"]]
                if beat["last"]:
                    frames.append(bytes(cur))
                    cur = bytearray()
            for _ in range(4):
                await FallingEdge(clk)
            counters = unpack(layout, int(dut.counters.value))
            results.append({"counters": counters, "frames": [f.hex() for f in frames]})
        else:
            await drv["qp_init"].send_all([{"qp": q, "psn": 0} for q in range(world)])
            expect = sum(1 for o in job["tx"] for s in o["sends"] if s["dest"] == t["rank"])
            beats = frame_beats([bytes.fromhex(f) for f in job["rx_frames"][k]], W)
            start = len(comp_mon.received)
            if beats:
                cocotb.start_soon(drv["rx_frame"].send_all(beats))
            for _ in range(expect):
                await with_timeout(comp_mon.recv(), budget_ns, "ns")
            for _ in range(4):
                await FallingEdge(clk)
            counters = unpack(layout, int(dut.counters.value))
            results.append({"counters": counters,
                            "completions": len(comp_mon.received) - start})
    sim_phase = {"wall_s": time.perf_counter() - wall0,
                 "cycles": int(round((get_sim_time("ns") - ns0) / 10))}
    mem.check_idle()
    Path(p["out"]).write_text(json.dumps({"nics": results, "sim_phase": sim_phase}))
    if phase == "rx":
        np.save(Path(p["job"]).parent / "rx.npy", rx_mem.contents)
