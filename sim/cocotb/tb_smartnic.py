"""cocotb bench: the SmartNIC top's generated Verilog runs a whole co-simulated iteration for
every NIC of a cluster in one simulator process (``sim/cosim`` writes the job, reads the
results back): the send side of every NIC, the frames routed to their destinations
(``sim.cosim.network.route_frames``), then the receive side of every NIC.

The job (JSON, path in ``tb_params()["job"]``) holds the NIC parameters, the random
idle/backpressure probabilities and the stimulus; the memory image is a ``.npy`` file. Send side,
per NIC: invalidate the cache, write the descriptors and the addressing table, stream the bags
and post the sends, collect the frames. Receive side, per NIC: initialise the receive QPs, feed
the frames, wait for every completion. The design is reset before each NIC. Every payload is
packed before the timed loop; each NIC's phase has one deadline. Results: per NIC and phase the
counters, and the frames (send) or the completions (receive), written as JSON to
``tb_params()["out"]`` with ``sim_phase`` (the wall time and clock cycles of the NIC loops
alone, for simulation speed), and the receive memory as ``rx.npy`` beside the job.

This bench serves Icarus (and Verilator through cocotb); the co-simulation's Verilator backend
runs the same phases natively (``sim.cosim.native``).
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
from neonic.sim.cosim.network import route_frames
from neonic.sim.harness.cocotb_streams import (Codec, CocotbMemory, StreamDriver, StreamMonitor,
                                               start_clock_and_reset, tb_params, tb_rng, unpack)
from neonic.sim.reference.roce import frame_beats


@cocotb.test()
async def cluster_iteration(dut):
    p = tb_params()
    job = json.loads(Path(p["job"]).read_text())
    params = {k: (tuple(v) if isinstance(v, list) else v) for k, v in job["params"].items()}
    nic = SmartNIC(**params)
    W = nic.data_bytes
    idle, bp = job["idle"], job["backpressure"]
    clk = dut.clk
    dut.local_mac.value = 0
    dut.local_ip.value = 0
    layouts = {"cache_cmd": CacheOp, "desc": nic.gather.desc_layout,
               "dest": DestEntry(nic.packetizer.dest_bits),
               "send": SendDescriptor(nic.packetizer.dest_bits), "bags": nic.gather.item_layout,
               "qp_init": QPInit(nic.depacketizer.qp_bits), "rx_frame": FrameBeat(W)}
    drv = {name: StreamDriver(dut, name, layout, clk, rng=tb_rng(10 + i),
                              idle=idle if name in ("bags", "send", "rx_frame") else 0.0)
           for i, (name, layout) in enumerate(layouts.items())}
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
    counters_layout = SmartNICCounters()
    world = len(job["tx"])
    codecs = {name: Codec(layout) for name, layout in layouts.items()}

    def packed(name, items):
        return [codecs[name].pack(x) for x in items]

    # every payload of the send side packed before the timed loop
    tx_stim = [{"cache_cmd": packed("cache_cmd", [CacheOp.INVALIDATE.value]),
                "desc": packed("desc", t["descs"]), "dest": packed("dest", t["dests"]),
                "bags": packed("bags", t["items"]), "send": packed("send", t["sends"])}
               for t in job["tx"]]
    qp_init = packed("qp_init", [{"qp": q, "psn": 0} for q in range(world)])
    sim_phase = {"wall_s": 0.0, "cycles": 0}

    async def reset_for(t):
        await FallingEdge(clk)
        dut.rst.value = 1
        await FallingEdge(clk)
        dut.rst.value = 0
        dut.local_mac.value = 0x02_4E_49_43_00_00 | t["rank"]
        dut.local_ip.value = 0x0A_00_00_00 | t["rank"]

    def budget_ns(t, beats_in):
        return 10 * (20000 + 40 * (8 * (len(t["items"]) + beats_in) + 40 * t["frames"]))

    async def collect_frames(count):
        frames, cur = [], bytearray()
        while len(frames) < count:
            beat = await frames_mon.recv()
            cur += beat["data"].to_bytes(W, "little")[:beat["count"]]
            if beat["last"]:
                frames.append(bytes(cur))
                cur = bytearray()
        return frames

    def counters():
        return unpack(counters_layout, int(dut.counters.value))

    # -- send side of every NIC (the build, the export and cocotb's start-up excluded)
    wall0, ns0 = time.perf_counter(), get_sim_time("ns")
    tx_results = []
    for t, s in zip(job["tx"], tx_stim):
        await reset_for(t)
        await drv["cache_cmd"].send_all(s["cache_cmd"])
        await drv["desc"].send_all(s["desc"])
        await drv["dest"].send_all(s["dest"])
        cocotb.start_soon(drv["bags"].send_all(s["bags"]))
        cocotb.start_soon(drv["send"].send_all(s["send"]))
        frames = await with_timeout(collect_frames(t["frames"]), budget_ns(t, 0), "ns")
        for _ in range(4):
            await FallingEdge(clk)
        tx_results.append({"counters": counters(), "frames": frames})
    sim_phase["wall_s"] += time.perf_counter() - wall0
    sim_phase["cycles"] += int(round((get_sim_time("ns") - ns0) / 10))

    # -- the network: each destination's frames in arrival order, packed before the loop
    arrivals = route_frames([r["frames"] for r in tx_results], world)
    rx_stim = [packed("rx_frame", frame_beats(fs, W)) for fs in arrivals]

    # -- receive side of every NIC
    wall0, ns0 = time.perf_counter(), get_sim_time("ns")
    rx_results = []
    for t, beats in zip(job["tx"], rx_stim):
        await reset_for(t)
        await drv["qp_init"].send_all(qp_init)
        expect = sum(1 for o in job["tx"] for s in o["sends"] if s["dest"] == t["rank"])
        start = len(comp_mon.received)
        if beats:
            cocotb.start_soon(drv["rx_frame"].send_all(beats))
        await with_timeout(comp_mon.wait_for(start + expect), budget_ns(t, len(beats)), "ns")
        for _ in range(4):
            await FallingEdge(clk)
        rx_results.append({"counters": counters(),
                           "completions": len(comp_mon.received) - start})
    sim_phase["wall_s"] += time.perf_counter() - wall0
    sim_phase["cycles"] += int(round((get_sim_time("ns") - ns0) / 10))
    mem.check_idle()
    rx_mem.check_idle()
    Path(p["out"]).write_text(json.dumps({
        "tx": [{"counters": r["counters"], "frames": [f.hex() for f in r["frames"]]}
               for r in tx_results],
        "rx": rx_results, "sim_phase": sim_phase}))
    np.save(Path(p["job"]).parent / "rx.npy", rx_mem.contents)
