"""cocotb bench proving the harness's drivers, monitors and memory on the tiny test designs.

Started from tests/sim/harness/test_harness_cocotb.py through ``run_cocotb`` on
``HarnessTop`` (a stream passthrough ``i`` -> ``o`` and a memory initiator ``cmd``/``wr`` ->
``mem`` -> ``rd`` side by side); each test drives the half it checks and idles the other.
"""

from __future__ import annotations

import time

import cocotb
import numpy as np
from cocotb.simtime import get_sim_time
from cocotb.triggers import ClockCycles, with_timeout

from neonic.sim.harness.cocotb_streams import (CocotbMemory, StreamDriver, StreamMonitor,
                                        start_clock_and_reset, tb_params, tb_record, tb_rng)
from neonic.rtl.streams import MemRequest, MemResponseBeat, MemWriteBeat
from tests.sim.harness.designs import PAYLOAD, random_mem_ops, random_payloads


def idle_inputs(dut, *ports: str) -> None:
    """Drive the inputs of a half a test does not use (Icarus would see them as Z)."""
    for port in ports:
        getattr(dut, port).value = 0


PASSTHROUGH_INPUTS = ("i__valid", "i__payload", "o__ready")
INITIATOR_INPUTS = ("cmd__valid", "cmd__payload", "wr__valid", "wr__payload", "rd__ready",
                    "mem__req__ready", "mem__wdata__ready", "mem__resp__valid",
                    "mem__resp__payload")


@cocotb.test()
async def test_passthrough(dut):
    """Passthrough: every payload comes out once, unchanged, in order."""
    idle_inputs(dut, *INITIATOR_INPUTS)
    p = tb_params()
    rng = tb_rng()
    sent = random_payloads(rng, p["n"])
    drv = StreamDriver(dut, "i", PAYLOAD, dut.clk, rng=rng, idle=p["idle"])
    mon = StreamMonitor(dut, "o", PAYLOAD, dut.clk, rng=tb_rng(1),
                        backpressure=p["backpressure"])
    await start_clock_and_reset(dut)
    start, t0 = time.perf_counter(), get_sim_time("ns")
    cocotb.start_soon(drv.send_all(sent))
    got = await with_timeout(mon.wait_for(len(sent)), 40 * len(sent) + 1000, "ns")
    wall, cycles = time.perf_counter() - start, round((get_sim_time("ns") - t0) / 10)
    await ClockCycles(dut.clk, 10)
    assert got == sent, "scoreboard: payloads lost, duplicated, reordered or corrupted"
    assert drv.sent == len(sent)
    if p["idle"] == p["backpressure"] == 0:
        assert cycles <= len(sent) + 8, f"helpers throttle the stream: {cycles} cycles"
    tb_record(passthrough_items=len(sent), passthrough_cycles=cycles, passthrough_wall_s=wall)


@cocotb.test()
async def test_recv_one_by_one(dut):
    """Passthrough: recv() hands out beats in order and a sender can write at once after
    send() returns."""
    idle_inputs(dut, *INITIATOR_INPUTS)
    rng = tb_rng(2)
    sent = random_payloads(rng, 6)
    drv = StreamDriver(dut, "i", PAYLOAD, dut.clk, rng=rng, idle=0.3)
    mon = StreamMonitor(dut, "o", PAYLOAD, dut.clk, rng=rng, backpressure=0.3)
    await start_clock_and_reset(dut)
    for payload in sent[:3]:
        await drv.send(payload)
        dut.rst.value = 0  # legal: send() returns outside ReadOnly
    await drv.send_all(sent[3:])
    assert [await with_timeout(mon.recv(), 2000, "ns") for _ in sent] == sent


@cocotb.test()
async def test_memory(dut):
    """Initiator: reads and masked writes through CocotbMemory match an in-order model."""
    idle_inputs(dut, *PASSTHROUGH_INPUTS)
    p = tb_params()
    rng = tb_rng()
    data_bytes = p["data_bytes"]
    initial, cmds, wbeats, reads, final = random_mem_ops(rng, p["n"], p["beats_total"],
                                                         data_bytes)
    mem = CocotbMemory(dut, "mem", initial.copy(), data_bytes=data_bytes, rng=tb_rng(1),
                       latency=tuple(p["latency"]), max_outstanding=p["max_outstanding"],
                       resp_stall=p["resp_stall"], accept_stall=p["accept_stall"],
                       beats_width=p["beats_width"])
    cmd = StreamDriver(dut, "cmd", MemRequest(p["addr_width"], p["beats_width"]), dut.clk,
                       rng=tb_rng(2), idle=p["idle"])
    wr = StreamDriver(dut, "wr", MemWriteBeat(data_bytes), dut.clk, rng=tb_rng(3),
                      idle=p["idle"])
    rd = StreamMonitor(dut, "rd", MemResponseBeat(data_bytes), dut.clk, rng=tb_rng(4),
                       backpressure=p["backpressure"])
    await start_clock_and_reset(dut)
    start = time.perf_counter()
    cocotb.start_soon(cmd.send_all(cmds))
    cocotb.start_soon(wr.send_all(wbeats))
    limit_ns = 10 * (p["latency"][1] + 20) * (len(cmds) + len(reads) + len(wbeats))
    got = await with_timeout(rd.wait_for(len(reads)), limit_ns, "ns")
    await ClockCycles(dut.clk, 20)  # posted writes land
    wall = time.perf_counter() - start
    assert got == reads, "read data differs from the in-order model"
    np.testing.assert_array_equal(mem.contents, final)
    mem.check_idle()
    s = mem.stats
    assert (s.requests, s.beats_read, s.beats_written) == (len(cmds), len(reads), len(wbeats))
    assert s.max_outstanding_seen <= p["max_outstanding"]
    if p["resp_stall"]:
        assert s.resp_stall_cycles > 0
    tb_record(memory_cycles=s.cycles, memory_wall_s=wall, memory_stats=s.as_dict())


@cocotb.test()
async def test_memory_out_of_range_fails_the_test(dut):
    """Initiator: a request beyond the memory stops the test with MemoryModelError (run only
    on purpose: the pytest side expects this test to fail)."""
    idle_inputs(dut, *PASSTHROUGH_INPUTS)
    p = tb_params()
    CocotbMemory(dut, "mem", np.zeros(4 * p["data_bytes"], np.uint8),
                 data_bytes=p["data_bytes"], rng=tb_rng(), beats_width=p["beats_width"])
    cmd = StreamDriver(dut, "cmd", MemRequest(p["addr_width"], p["beats_width"]), dut.clk,
                       rng=tb_rng())
    StreamMonitor(dut, "rd", MemResponseBeat(p["data_bytes"]), dut.clk, rng=tb_rng())
    StreamDriver(dut, "wr", MemWriteBeat(p["data_bytes"]), dut.clk, rng=tb_rng())
    await start_clock_and_reset(dut)
    await cmd.send({"addr": 4, "beats": 1, "write": 0})
    await ClockCycles(dut.clk, 20)
