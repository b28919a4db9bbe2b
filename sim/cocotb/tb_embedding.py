"""cocotb bench of the embedding gather/pool unit on its generated Verilog.

Started through ``sim.harness.run_cocotb`` (tests/rtl/test_embedding_cocotb.py and
``neonic rtl sim embedding --sim icarus|verilator``). ``tb_params()`` carries the unit's
constructor parameters (``unit``) and a workload spec (``workload``, see
``sim.units.embedding.workloads_from_spec``). The bench writes the descriptors, drives the
bags with random idle cycles, answers the memory port with random latency and response gaps,
takes the pooled beats under random backpressure, and scoreboards every episode against the
numpy reference: no bag lost, duplicated or reordered, every value bit-exact. It records the
cycles, counters and wall time of each episode with ``tb_record``.
"""

from __future__ import annotations

import time

import cocotb
from cocotb.triggers import FallingEdge, ReadOnly, RisingEdge, with_timeout

from neonic.sim.units.embedding import (Scoreboard, combined_placement, decode_beat, episode_stimulus,
                                  unit_for_layouts, workloads_from_spec)
from neonic.rtl.embedding import COUNTER_NAMES, CountersLayout, EmbeddingBagUnit
from neonic.sim.harness.cocotb_streams import (CocotbMemory, StreamDriver, StreamMonitor,
                                        start_clock_and_reset, tb_params, tb_record, tb_rng,
                                        unpack)


async def _counters(dut) -> dict[str, int]:
    await ReadOnly()
    raw = unpack(CountersLayout(), int(dut.counters.value))
    await FallingEdge(dut.clk)
    return {name: int(raw[name]) for name in COUNTER_NAMES}


@cocotb.test()
async def embedding_scoreboard(dut):
    """Every episode's pooled beats match the reference bit for bit, in order."""
    p = tb_params()
    unit = unit_for_layouts(**p.get("unit", {}))
    rng = tb_rng()
    workloads = workloads_from_spec(unit, p.get("workload", {"kind": "random"}), rng)
    contents, placements = combined_placement(unit, workloads)
    first = workloads[0]
    mem = CocotbMemory(dut, "mem", contents, data_bytes=unit.data_bytes, rng=tb_rng(1),
                       latency=first.latency, max_outstanding=first.mem_outstanding,
                       resp_stall=first.resp_stall, beats_width=unit.beats_width)
    desc = StreamDriver(dut, "desc", unit.desc_layout, dut.clk, rng=tb_rng(2))
    bags = StreamDriver(dut, "bags", unit.item_layout, dut.clk, rng=tb_rng(3), idle=first.idle)
    pooled = StreamMonitor(dut, "pooled", unit.pooled_layout, dut.clk, rng=tb_rng(4),
                           backpressure=first.backpressure)
    cycle = {"n": 0}

    async def count_cycles():
        while True:
            await RisingEdge(dut.clk)
            cycle["n"] += 1

    await start_clock_and_reset(dut)
    cocotb.start_soon(count_cycles())
    episodes = []
    prev = {name: 0 for name in COUNTER_NAMES}
    wall0 = time.perf_counter()
    received = 0
    for k, (wl, placement) in enumerate(zip(workloads, placements)):
        descs, items, expected = episode_stimulus(unit, wl, placement)
        mem.core.latency, mem.core.max_outstanding = wl.latency, wl.mem_outstanding
        mem.core.resp_stall = wl.resp_stall
        bags.idle, pooled.backpressure = wl.idle, wl.backpressure
        await desc.send_all(descs)
        t0 = cycle["n"]
        w0 = time.perf_counter()
        cocotb.start_soon(bags.send_all(items))
        limit_ns = 10 * (200 + 40 * (len(items) + len(expected))
                         + 20 * int(counters_hint(unit, wl)))
        got = await with_timeout(pooled.wait_for(received + len(expected)), limit_ns, "ns")
        t1 = cycle["n"]
        wall = time.perf_counter() - w0
        beats = [decode_beat(unit, x) for x in got[received:received + len(expected)]]
        received += len(expected)
        Scoreboard(expected, beats).check()
        while True:                                   # let the unit go idle
            await ReadOnly()
            busy = int(dut.busy.value)
            await FallingEdge(dut.clk)
            if not busy:
                break
        cnt = await _counters(dut)
        delta = {n: cnt[n] - prev[n] for n in COUNTER_NAMES}
        prev = cnt
        assert delta["bags_out"] == sum(1 for b in expected if b.last), "bags lost or extra"
        episodes.append({"cycles": t1 - t0, "wall_s": wall, "counters": delta,
                         "beats_out": len(expected)})
    mem.check_idle()
    tb_record(episodes=episodes, total_cycles=cycle["n"],
              total_wall_s=time.perf_counter() - wall0)


def counters_hint(unit: EmbeddingBagUnit, wl) -> int:
    """A generous bound on the beats an episode reads (for its deadline)."""
    from neonic.sim.reference.embedding import row_stride_beats
    return sum(len(b.indices) * (row_stride_beats(wl.tables[b.table].dim,
                                                  wl.tables[b.table].elem_type,
                                                  unit.data_bytes) + wl.latency[1])
               for b in wl.bags)
