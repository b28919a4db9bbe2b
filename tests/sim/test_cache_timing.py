"""The cache timing model against the RTL (Amaranth simulator): within 5% of its cycles, with
the lines on chip (``OnChipCache``) and, on read traffic, behind a pipelined line memory."""

from __future__ import annotations

import numpy as np
import pytest

from neonic.rtl.cache import CacheController, OnChipCache
from neonic.sim.harness import AmaranthMemory, run_amaranth, stream_recv, stream_send
from neonic.sim.reference.cache import CacheConfig, random_requests
from neonic.sim.timing.cache import CacheTiming, miss_bubbles


def rtl_cycles(dut, requests, rng, rows, latency, extra=()):
    memory = rng.integers(0, 256, rows * dut.line_beats * dut.data_bytes, dtype=np.uint8)
    mem = AmaranthMemory(dut.back, memory, data_bytes=dut.data_bytes, rng=rng,
                         latency=(latency, latency), max_outstanding=64)
    n_read = sum(r.beats for r in requests if not r.write)

    async def requester(ctx):
        await stream_send(ctx, dut.front.req, [{"addr": r.addr, "beats": r.beats,
                                                "write": int(r.write)} for r in requests])

    async def writer(ctx):
        await stream_send(ctx, dut.front.wdata,
                          [{"data": d, "mask": m, "last": int(i == len(r.wdata) - 1)}
                           for r in requests if r.write for i, (d, m) in enumerate(r.wdata)])

    async def reader(ctx):
        await stream_recv(ctx, dut.front.resp, n_read)

    return run_amaranth(dut, [requester, writer, reader], [mem.process, *extra],
                        max_cycles=400_000)


@pytest.mark.parametrize("latency,zipf,write_fraction,mshrs,slice_", [
    (4, 1.2, 0.0, 16, False), (40, 1.1, 0.2, 16, False), (200, 1.3, 0.1, 16, False),
    (30, 0.8, 0.3, 4, False), (40, 1.1, 0.2, 16, True),
])
def test_timing_model_within_5_percent_of_rtl(rng, latency, zipf, write_fraction, mshrs,
                                              slice_):
    """Lines on chip; the last case with the register slice on the line requests."""
    kw = dict(data_bytes=4, addr_width=16, line_beats=4, row_beats=4, sets=8, ways=4,
              mshrs=mshrs, line_slice=slice_)
    dut = OnChipCache(**kw)
    reqs = random_requests(rng, 400, rows=200, line_beats=4, row_beats=4, data_bytes=4,
                           write_fraction=write_fraction, zipf=zipf, partial_fraction=0.5)
    measured = rtl_cycles(dut, reqs, rng, 200, latency)
    model = CacheTiming(row_beats=4, mshrs=mshrs, queue_depth=dut.queue_depth,
                        latency=latency, line_slice=slice_
                        ).run(reqs, CacheConfig(8, 4), line_beats=4)
    assert abs(model.cycles - measured) <= 0.05 * measured, (model, measured)


def test_one_model_per_request_and_in_total(rng):
    """``schedule`` (per request, with offer times) and ``run`` (totals, one request per
    cycle) are the same model: offering every request at cycle 0 gives run's cycles, and a
    request offered late is looked up no earlier than the cycle after its offer."""
    reqs = random_requests(rng, 300, rows=120, line_beats=4, row_beats=4, data_bytes=4,
                           write_fraction=0.2, zipf=1.1)
    timing = CacheTiming(row_beats=4, mshrs=4, queue_depth=8, latency=30)
    cfg = CacheConfig(8, 4)
    total = timing.run(reqs, cfg, line_beats=4)
    sched = timing.schedule(reqs, cfg, line_beats=4)
    assert sched.end == total.cycles and sched.misses == total.misses
    assert timing.schedule(reqs, cfg, line_beats=4, offers=[0] * len(reqs)).starts == sched.starts
    # responses leave in request order; a write's data are taken from its transfer's start,
    # which may come before the response of a read ahead of it (the line memory's latency)
    reads = [start for start, req in zip(sched.starts, reqs) if not req.write]
    assert all(b >= a for a, b in zip(reads, reads[1:]))
    late = timing.schedule(reqs[:3], cfg, line_beats=4, offers=[0, 0, 500])
    assert late.starts[2] >= 501
    with pytest.raises(ValueError, match="offers"):
        timing.schedule(reqs, cfg, line_beats=4, offers=[0])


def test_the_closed_form_lives_beside_the_model():
    from neonic.sim import nic
    from neonic.sim.timing import cache

    assert nic.cache_cycles is cache.cache_cycles


@pytest.mark.parametrize("latency,line_latency,zipf,mshrs", [(40, 10, 1.1, 16), (20, 40, 1.0, 8)])
def test_timing_model_with_lines_in_dram_within_5_percent_of_rtl(rng, latency, line_latency,
                                                                  zipf, mshrs):
    """The bare controller, its lines behind a pipelined memory (one request per cycle, a
    fixed latency, as a DRAM controller answers), on read traffic."""
    dut = CacheController(data_bytes=4, addr_width=16, line_beats=4, row_beats=4, sets=8,
                          ways=4, mshrs=mshrs)
    reqs = random_requests(rng, 300, rows=200, line_beats=4, row_beats=4, data_bytes=4,
                           write_fraction=0.0, zipf=zipf, partial_fraction=0.5)
    lines = AmaranthMemory(dut.lines, np.zeros(dut.line_memory_beats * 4, np.uint8),
                           data_bytes=4, rng=rng, latency=(line_latency, line_latency),
                           max_outstanding=64)
    measured = rtl_cycles(dut, reqs, rng, 200, latency, extra=[lines.process])
    model = CacheTiming(row_beats=4, mshrs=mshrs, queue_depth=dut.queue_depth, latency=latency,
                        line_latency=line_latency, line_serial=False
                        ).run(reqs, CacheConfig(8, 4), line_beats=4)
    assert abs(model.cycles - measured) <= 0.05 * measured, (model, measured)


@pytest.mark.parametrize("zipf,same,lookahead", [(1.1, False, False), (1.0, True, False),
                                                  (1.0, True, True)])
def test_timing_model_of_two_compare_stages_within_5_percent_of_rtl(rng, zipf, same,
                                                                    lookahead):
    """The NIC organisation (two compare stages, a sliced tag store, no lookahead and a
    register slice on the line requests; and with lookahead, without the slice), its lines behind a pipelined memory: hits and misses spread over sets, and
    (``same``) runs of one set, where each request waits for the update ahead of it
    (forwarded, or written and read again)."""
    dut = CacheController(data_bytes=4, addr_width=16, line_beats=4, row_beats=4, sets=8,
                          ways=4, mshrs=16, compare_stages=2, tag_slice_sets=2,
                          lookahead=lookahead, line_slice=not lookahead)
    reqs = random_requests(rng, 300, rows=200, line_beats=4, row_beats=4, data_bytes=4,
                           write_fraction=0.0, zipf=zipf, partial_fraction=0.5)
    if same:                        # one-beat hits on four rows of set 0, back to back
        reqs = [type(reqs[0])(addr=32 * (i % 4), beats=1) for i in range(300)]
    lines = AmaranthMemory(dut.lines, np.zeros(dut.line_memory_beats * 4, np.uint8),
                           data_bytes=4, rng=rng, latency=(10, 10), max_outstanding=64)
    measured = rtl_cycles(dut, reqs, rng, 200, 30, extra=[lines.process])
    model = CacheTiming(row_beats=4, mshrs=16, queue_depth=dut.queue_depth, latency=30,
                        line_latency=10, line_serial=False, compare_stages=2,
                        lookahead=lookahead, line_slice=not lookahead
                        ).run(reqs, CacheConfig(8, 4), line_beats=4)
    assert CacheTiming(row_beats=4, compare_stages=2, lookahead=lookahead).same_set_gap \
        == dut.same_set_gap
    assert miss_bubbles(lookahead) == dut.miss_bubbles
    assert abs(model.cycles - measured) <= 0.05 * measured, (model, measured)
    one = CacheTiming(row_beats=4, mshrs=16, queue_depth=dut.queue_depth, latency=30,
                      line_latency=10, line_serial=False).run(reqs, CacheConfig(8, 4),
                                                              line_beats=4)
    assert model.lookup_cycles >= one.lookup_cycles
    with pytest.raises(ValueError, match="^compare_stages:"):
        CacheTiming(row_beats=4, compare_stages=3)
    with pytest.raises(ValueError, match="^lookahead:"):
        CacheTiming(row_beats=4, lookahead=None)
