"""cocotb bench of the cache controller on its generated Verilog.

Started through ``sim.harness.run_cocotb`` (``tests/rtl/test_cache_cocotb.py``, the soak, and
``neonic rtl sim cache --sim icarus|verilator``). ``tb_params()`` carries the controller's
constructor parameters (``unit``), the device (``device``: ``"chip"``, the default, for
:class:`rtl.cache.OnChipCache`, lines in block RAM; ``"port"`` for the bare
:class:`rtl.cache.CacheController`, its ``lines`` port answered by a second harness memory with
the same random latency and stalls) and a workload (``workload``: ``episodes``, ``count``
requests each, ``rows``, ``write_fraction``, ``error_fraction``, ``zipf``, ``latency``,
``idle``, ``backpressure``, ``resp_stall``, ``accept_stall``; ``stimulus``: a JSON file with
the backing memory's bytes and the requests of one episode, as ``neonic rtl sim cache`` writes
it, so that every simulator runs the same requests).

Each episode drives random requests and their write data with random idle cycles, takes the
responses under random backpressure, answers the back port from the harness memory with
random latency and stalls, then issues FLUSH. Scoreboards: every read beat equals the shadow
memory's (the last value written; nothing lost, duplicated or reordered), the backing memory
equals the shadow after the flush (no write lost), the lookup outcomes equal the reference
model's (a merged miss counts as a hit), and the statistics counters agree. Figures
(cycles, wall time, counters) go to ``tb_record``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import cocotb
import numpy as np
from cocotb.triggers import FallingEdge, ReadOnly, RisingEdge, with_timeout

from neonic.rtl.cache import CacheController, CacheOp, CacheStats, LookupKind, OnChipCache
from neonic.rtl.streams import MemRequest, MemWriteBeat
from neonic.sim.harness.cocotb_streams import (CocotbMemory, StreamDriver, StreamMonitor,
                                        start_clock_and_reset, tb_params, tb_record, tb_rng,
                                        unpack)
from neonic.sim.reference.cache import CacheConfig, Request, expected_results, random_requests

KIND = {LookupKind.HIT.value: "hit", LookupKind.MERGED.value: "merged",
        LookupKind.MISS.value: "miss", LookupKind.ERROR.value: "error"}


@cocotb.test()
async def cache_scoreboard(dut):
    """Random traffic: shadow memory, reference outcomes and counters all agree."""
    p = tb_params()
    unit_kw = p.get("unit", {})
    device = p.get("device", "chip")
    if device not in ("chip", "port"):
        raise ValueError(f"device: expected 'chip' or 'port', got {device!r}")
    unit = (OnChipCache if device == "chip" else CacheController)(**unit_kw)
    wl = {"episodes": 1, "count": 300, "rows": 64, "write_fraction": 0.25,
          "error_fraction": 0.02, "zipf": 0.9, "latency": [1, 30], "idle": 0.2,
          "backpressure": 0.2, "resp_stall": 0.1, "accept_stall": 0.1, **p.get("workload", {})}
    rng = tb_rng()
    rows = wl["rows"]
    stim = json.loads(Path(wl["stimulus"]).read_text()) if wl.get("stimulus") else None
    if stim is not None:
        memory = np.frombuffer(bytes.fromhex(stim["memory"]), np.uint8).copy()
        wl["episodes"] = 1
    else:
        memory = rng.integers(0, 256, rows * unit.line_beats * unit.data_bytes, dtype="uint8")
    mem = CocotbMemory(dut, "back", memory.copy(), data_bytes=unit.data_bytes, rng=tb_rng(1),
                       latency=tuple(wl["latency"]), resp_stall=wl["resp_stall"],
                       accept_stall=wl["accept_stall"], beats_width=unit.beats_width)
    mems = [mem]
    if device == "port":   # the line memory: random contents (a line is filled before use)
        lines = rng.integers(0, 256, unit.line_memory_beats * unit.data_bytes, dtype="uint8")
        mems.append(CocotbMemory(dut, "lines", lines, data_bytes=unit.data_bytes,
                                 rng=tb_rng(6), latency=tuple(wl["latency"]),
                                 resp_stall=wl["resp_stall"], accept_stall=wl["accept_stall"],
                                 beats_width=unit.beats_width,
                                 max_outstanding=unit.line_outstanding))
    req = StreamDriver(dut, "front__req", MemRequest(unit.addr_width, unit.beats_width),
                       dut.clk, rng=tb_rng(2), idle=wl["idle"])
    wdata = StreamDriver(dut, "front__wdata", MemWriteBeat(unit.data_bytes), dut.clk,
                         rng=tb_rng(3), idle=wl["idle"])
    resp = StreamMonitor(dut, "front__resp", unit.front.resp.payload.shape(), dut.clk,
                         rng=tb_rng(4), backpressure=wl["backpressure"])
    cmd = StreamDriver(dut, "cmd", CacheOp, dut.clk, rng=tb_rng(5))
    cfg = CacheConfig(unit.sets, unit.ways, unit.policy, unit.index, unit.lfu_bits)
    kinds: list[str] = []
    cycle = {"n": 0}

    async def watch():
        while True:
            await RisingEdge(dut.clk)
            await ReadOnly()
            cycle["n"] += 1
            if int(dut.lookup_valid.value):
                kinds.append(KIND[int(dut.lookup_kind.value)])

    async def stats():
        await ReadOnly()
        raw = unpack(CacheStats(unit.counter_width), int(dut.stats.value))
        await FallingEdge(dut.clk)
        return {f: int(raw[f]) for f in CacheStats.FIELDS}

    await start_clock_and_reset(dut)
    cocotb.start_soon(watch())
    shadow = memory
    episodes = []
    wall0 = time.perf_counter()
    received = 0
    looked_up = 0
    prev = dict.fromkeys(CacheStats.FIELDS, 0)
    model_counters = None
    for ep in range(wl["episodes"]):
        if stim is not None:
            reqs = [Request(a, n, bool(w), tuple(tuple(b) for b in wd))
                    for a, n, w, wd in stim["requests"]]
        else:
            reqs = random_requests(rng, wl["count"], rows=rows, line_beats=unit.line_beats,
                                   row_beats=unit.row_beats, data_bytes=unit.data_bytes,
                                   write_fraction=wl["write_fraction"],
                                   error_fraction=wl["error_fraction"], zipf=wl["zipf"])
        exp = expected_results(reqs, shadow, cfg, line_beats=unit.line_beats,
                               row_beats=unit.row_beats, data_bytes=unit.data_bytes,
                               model=model_counters)
        model_counters = exp.model
        t0, w0 = cycle["n"], time.perf_counter()
        cocotb.start_soon(req.send_all([{"addr": r.addr, "beats": r.beats,
                                         "write": int(r.write)} for r in reqs]))
        cocotb.start_soon(wdata.send_all([{"data": d, "mask": m,
                                           "last": int(i == len(r.wdata) - 1)}
                                          for r in reqs if r.write
                                          for i, (d, m) in enumerate(r.wdata)]))
        n_read = len(exp.read_beats)
        limit_ns = 10 * (1000 + 12 * sum(r.beats for r in reqs)
                         + len(reqs) * (wl["latency"][1] + 4 * unit.row_beats))
        got = await with_timeout(resp.wait_for(received + n_read), limit_ns, "ns")
        beats = got[received:received + n_read]
        received += n_read
        data = [int(b["data"]) for b in beats]
        bad = [i for i, (a, b) in enumerate(zip(data, exp.read_beats)) if a != b]
        assert not bad, f"episode {ep}: {len(bad)} read beats differ, first at {bad[0]}"
        lasts = [i for i, b in enumerate(beats) if int(b["last"])]
        ends, acc = [], -1
        for r in reqs:
            if not r.write:
                acc += r.beats
                ends.append(acc)
        assert lasts == ends, f"episode {ep}: resp.last misplaced"
        want = [k for k, r in zip(exp.kinds, reqs) if r.beats > 0]
        while len(kinds) < looked_up + len(want):
            await RisingEdge(dut.clk)
        got_kinds = [("hit" if k == "merged" else k) for k in kinds[looked_up:]]
        assert got_kinds == want, f"episode {ep}: lookup outcomes differ from the reference"
        merged = kinds[looked_up:].count("merged")
        looked_up += len(want)
        await with_timeout(cmd.send(CacheOp.FLUSH.value), limit_ns, "ns")
        t1 = cycle["n"]
        assert (mem.contents == exp.memory).all(), f"episode {ep}: memory != shadow after FLUSH"
        shadow = exp.memory
        cnt = await stats()
        delta = {f: cnt[f] - prev[f] for f in CacheStats.FIELDS}
        prev = cnt
        ref = exp.counters
        assert delta["hits"] + delta["merged"] == ref["hits"], (delta, ref)
        assert delta["merged"] == merged
        for f in ("misses", "evictions", "writebacks", "errors"):
            assert delta[f] == ref[f], (f, delta, ref)
        episodes.append({"cycles": t1 - t0, "wall_s": time.perf_counter() - w0,
                         "requests": len(reqs), "counters": delta})
    for m_ in mems:
        m_.check_idle()
    tb_record(episodes=episodes, total_cycles=cycle["n"],
              total_wall_s=time.perf_counter() - wall0,
              requests=sum(e["requests"] for e in episodes))
