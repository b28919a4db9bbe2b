"""The cache controller in Amaranth's simulator: data correctness against a shadow memory,
hit/miss sequence against the reference model, commands, timing, and parameter checks.

A test's device is either the controller alone, its ``lines`` port answered by a behavioural
memory with random latency and stalls (the line memory in the card's DRAM), or
:class:`OnChipCache` (lines in one block RAM, the RTL SmartNIC's configuration)."""

from __future__ import annotations

import numpy as np
import pytest

from neonic.sim.units.cache import measure_hits
from neonic.rtl.cache import CacheController, CacheOp, CacheStats, LineRAM, LookupKind, OnChipCache
from neonic.sim.harness import AmaranthMemory, run_amaranth, stream_recv, stream_send
from neonic.sim.harness.collisions import CollisionCheck
from neonic.sim.reference.cache import (CacheConfig, Request, expected_results, random_requests)
from neonic.sim.timing.cache import CacheTiming

KIND = {LookupKind.HIT: "hit", LookupKind.MERGED: "merged", LookupKind.MISS: "miss",
        LookupKind.ERROR: "error"}


def line_memory(dut, rng: np.random.Generator, *, latency=(1, 12), stall: float = 0.1):
    """The behavioural line memory behind a bare controller's ``lines`` port (random
    contents: the cache must never read a line it has not filled); empty for
    :class:`OnChipCache`."""
    if isinstance(dut, OnChipCache):
        return []
    lines = rng.integers(0, 256, dut.line_memory_beats * dut.data_bytes, dtype=np.uint8)
    return [AmaranthMemory(dut.lines, lines, data_bytes=dut.data_bytes, rng=rng,
                           latency=latency, resp_stall=stall, accept_stall=stall,
                           max_outstanding=dut.line_outstanding)]


def run_cache(dut, requests: list[Request], rng: np.random.Generator, *,
              rows: int, latency=(1, 20), idle: float = 0.2, backpressure: float = 0.2,
              resp_stall: float = 0.1, accept_stall: float = 0.1, flush: bool = True,
              max_cycles: int = 200_000, memory: np.ndarray | None = None,
              monitors: tuple = (), check: CollisionCheck | None = None):
    """Drive ``requests`` into ``dut`` with random idle/backpressure against a random-latency
    backing memory (and line memory, for a bare controller); returns (read beats, lookup
    kinds, backing memory, stats dict, cycles).

    Every run poisons the reads of the tag store and line memory that collide with a write
    (``check``, a :class:`CollisionCheck` of ``dut``, made here if not given): their
    ``COLLISION_X_ATTR`` claims that the cache never uses such a read, and if it did, the
    poisoned data would fail the test's comparison with the shadow memory and reference."""
    check = CollisionCheck(dut) if check is None else check
    nbytes = rows * dut.line_beats * dut.data_bytes
    if memory is None:
        memory = rng.integers(0, 256, nbytes, dtype=np.uint8)
    # One generator per process, spawned from ``rng``: within a cycle Amaranth's simulator
    # runs the processes in an order that varies from run to run, so one shared generator
    # would deal its draws out differently and the same episode would not repeat.
    mem_rng, lines_rng, req_rng, wdata_rng, resp_rng = rng.spawn(5)
    mem = AmaranthMemory(dut.back, memory.copy(), data_bytes=dut.data_bytes, rng=mem_rng,
                         latency=latency, resp_stall=resp_stall, accept_stall=accept_stall)
    lmem = line_memory(dut, lines_rng, stall=resp_stall)
    n_read = sum(r.beats for r in requests if not r.write)
    kinds: list[str] = []
    got: list[int] = []
    stats: dict = {}

    async def requester(ctx):
        await stream_send(ctx, dut.front.req,
                          [{"addr": r.addr, "beats": r.beats, "write": int(r.write)}
                           for r in requests], rng=req_rng, idle=idle)

    async def writer(ctx):
        beats = [{"data": d, "mask": m, "last": int(i == len(r.wdata) - 1)}
                 for r in requests if r.write for i, (d, m) in enumerate(r.wdata)]
        await stream_send(ctx, dut.front.wdata, beats, rng=wdata_rng, idle=idle)

    async def reader(ctx):
        beats = await stream_recv(ctx, dut.front.resp, n_read, rng=resp_rng,
                                  backpressure=backpressure)
        got.extend(int(b.data) for b in beats)
        # Every response's `last` closes exactly one read.
        lasts = [int(b.last) for b in beats]
        ends = np.cumsum([r.beats for r in requests if not r.write]) - 1
        assert [i for i, v in enumerate(lasts) if v] == list(ends), "resp.last misplaced"
        while len(kinds) < sum(r.beats > 0 for r in requests):
            await ctx.tick()
        if flush:
            await stream_send(ctx, dut.cmd, [CacheOp.FLUSH])
        while not ctx.get(dut.idle):
            await ctx.tick()
        for _ in range(5):
            await ctx.tick()
        stats.update({f: ctx.get(getattr(dut.stats, f)) for f in CacheStats.FIELDS})
        stats["error"] = ctx.get(dut.error)

    async def monitor(ctx):
        async for _, _, valid, kind in ctx.tick().sample(dut.lookup_valid, dut.lookup_kind):
            if valid:
                kinds.append(KIND[LookupKind(kind)])

    cycles = run_amaranth(check.design, [requester, writer, reader], [mem.process]
                          + [lm.process for lm in lmem],
                          background=[monitor, check.monitor, *monitors],
                          max_cycles=max_cycles)
    mem.check_idle()
    for lm in lmem:
        lm.check_idle()
    return got, kinds, mem.contents, stats, cycles, memory


def check_against_reference(dut, requests, got, kinds, contents, stats, memory, *,
                            flushed=True):
    cfg = CacheConfig(dut.sets, dut.ways, dut.policy, dut.index, dut.lfu_bits)
    exp = expected_results(requests, memory, cfg, line_beats=dut.line_beats,
                           row_beats=dut.row_beats, data_bytes=dut.data_bytes)
    # Hit/miss sequence: a merged miss is a hit of the reference model (no fetch of its own).
    assert [("hit" if k == "merged" else k) for k in kinds] == \
        [k for k, r in zip(exp.kinds, requests) if r.beats > 0]
    assert len(got) == len(exp.read_beats)
    bad = [i for i, (a, b) in enumerate(zip(got, exp.read_beats)) if a != b]
    assert not bad, f"{len(bad)} read beats differ from the shadow memory, first at beat {bad[0]}"
    if flushed:
        assert np.array_equal(contents, exp.memory), "backing memory != shadow after FLUSH"
    assert stats["hits"] + stats["merged"] == exp.counters["hits"]
    assert stats["misses"] == exp.counters["misses"]
    assert stats["merged"] == kinds.count("merged")
    assert stats["evictions"] == exp.counters["evictions"]
    if flushed:
        assert stats["writebacks"] == exp.counters["writebacks"]
    assert stats["errors"] == exp.counters["errors"]
    assert stats["error"] == int(exp.counters["errors"] > 0)


#: Cycles from the edge accepting a hit to its first data beat, lines on chip: stages 1-3 of
#: the lookup, the executor's register (taken from stage 3 when nothing is queued), then
#: ``LineRAM.LATENCY``.
HIT_LATENCY = 4 + LineRAM.LATENCY

SMALL = dict(data_bytes=4, addr_width=16, line_beats=4, row_beats=3, sets=4, ways=4,
             mshrs=4, queue_depth=8)


def _random_traffic_checked(dut, rng, *, rows: int) -> "CollisionCheck":
    """400 random reads and writes (30% writes, 3% errored, Zipf 0.9) over ``rows`` rows,
    checked against the shadow memory and the reference; both hits and misses exercised.
    Returns the run's collision check."""
    reqs = random_requests(rng, 400, rows=rows, line_beats=4, row_beats=3, data_bytes=4,
                           write_fraction=0.3, error_fraction=0.03, zipf=0.9)
    check = CollisionCheck(dut)
    got, kinds, contents, stats, cycles, memory = run_cache(dut, reqs, rng, rows=rows, check=check)
    check_against_reference(dut, reqs, got, kinds, contents, stats, memory)
    assert stats["misses"] > 20 and stats["hits"] + stats["merged"] > 100  # exercised both
    return check


def test_a_random_episode_repeats_cycle_for_cycle(seed):
    """The harness's random idle, backpressure and memory timing follow from the test's seed
    alone: the same episode, run four times, takes the same cycles with every lookup on the
    same cycle. (With one generator shared by the processes it did not: the order in which
    the simulator runs them within a cycle varies, and this episode took 642 or 645 cycles.)"""
    runs = []
    for _ in range(4):
        rng = np.random.default_rng(seed)
        dut = CacheController(**SMALL)
        reqs = random_requests(rng, 150, rows=40, line_beats=4, row_beats=3, data_bytes=4,
                               write_fraction=0.3, error_fraction=0.03, zipf=0.9)
        lookups: list[tuple[int, int]] = []

        async def trace(ctx):
            cycle = 0
            async for _, _, valid, kind in ctx.tick().sample(dut.lookup_valid,
                                                             dut.lookup_kind):
                cycle += 1
                if valid:
                    lookups.append((cycle, LookupKind(kind)))

        got, kinds, contents, stats, cycles, memory = run_cache(dut, reqs, rng, rows=40,
                                                                monitors=(trace,))
        check_against_reference(dut, reqs, got, kinds, contents, stats, memory)
        runs.append((cycles, lookups))
    assert len(runs[0][1]) == sum(r.beats > 0 for r in reqs)
    assert all(run == runs[0] for run in runs[1:]), [c for c, _ in runs]


@pytest.mark.parametrize("policy,index,device", [("lru", "modulo", CacheController),
                                                 ("lfu", "hash", OnChipCache)])
def test_random_traffic_matches_shadow_and_reference(rng, policy, index, device):
    dut = device(**SMALL, policy=policy, index=index)
    check = _random_traffic_checked(dut, rng, rows=40)
    # The tag store's and line memory's reads that collided with a write (poisoned, and
    # still every result right): the traffic did exercise the `COLLISION_X_ATTR` claims.
    assert all(n > 10 for n in check.collisions.values()), check.summary()


@pytest.mark.parametrize("policy,index,lookahead", [("lru", "hash", False),
                                                    ("lfu", "modulo", True)])
def test_the_nic_organisation_matches_shadow_and_reference(rng, policy, index, lookahead):
    """Two compare stages and a tag store in slices (here 4 slices of 2 sets, as the preset's
    4,096 sets are 8 slices of 512), with and without lookahead (forwarding): the same
    results as one request at a time, with the reads that collide with a write poisoned in
    every slice."""
    dut = CacheController(**{**SMALL, "sets": 8}, policy=policy, index=index,
                          compare_stages=2, tag_slice_sets=2, lookahead=lookahead,
                          line_slice=not lookahead)
    assert (dut.tag_slices, dut.lookup_stages) == (4, 4)
    check = _random_traffic_checked(dut, rng, rows=60)
    assert {f"tags{d}" for d in range(4)} <= set(check.collisions), check.summary()


@pytest.mark.parametrize("policy,index,lookahead", [("lru", "modulo", False),
                                                    ("lfu", "hash", True)])
def test_the_nic_organisation_in_banks_of_ways_matches_shadow_and_reference(rng, policy, index,
                                                                            lookahead):
    """The tag store in banks of ways (here 4 banks of 2 ways, each in 2 slices of 4 sets, as
    the preset's 32 ways are 8 banks of 4): every way slice takes the lookup's decisions from
    its own copies of the control registers, and the results are those of one request at a
    time, with the reads that collide with a write poisoned in every bank and slice."""
    dut = CacheController(**{**SMALL, "sets": 8, "ways": 8}, policy=policy, index=index,
                          compare_stages=2, tag_slice_sets=4, bank_ways=2,
                          lookahead=lookahead, line_slice=not lookahead)
    assert (dut.tag_slices, dut.bank_ways) == (2, 2)
    check = _random_traffic_checked(dut, rng, rows=90)
    assert {f"tags{d}_b{g}" for d in range(2) for g in range(4)} <= set(check.collisions), \
        check.summary()


@pytest.mark.parametrize("policy,lookahead", [("lru", False), ("lfu", False), ("lru", True)])
def test_two_compare_stages_see_each_others_updates_in_one_set(rng, policy, lookahead):
    """Requests of one set back to back through two compare stages: each must wait until the
    update ahead of it is forwarded (or, without lookahead, written and read again), and the
    outcomes are those of one request at a time."""
    dut = CacheController(data_bytes=4, addr_width=16, line_beats=4, sets=4, ways=2, mshrs=4,
                          queue_depth=8, policy=policy, compare_stages=2, tag_slice_sets=2,
                          lookahead=lookahead, line_slice=not lookahead)
    rows = [0, 4, 8, 0, 4, 0, 8, 12, 8, 8, 4, 0, 12, 12, 0, 1, 0, 5, 4, 1]
    reqs = [Request(r * 4, 4, write=True, wdata=tuple((0x1000 * i + b, 0xF) for b in range(4)))
            if i % 3 == 1 else Request(r * 4, 4) for i, r in enumerate(rows)]
    got, kinds, contents, stats, cycles, memory = run_cache(
        dut, reqs, rng, rows=16, idle=0.0, backpressure=0.0, resp_stall=0.0,
        accept_stall=0.0)
    check_against_reference(dut, reqs, got, kinds, contents, stats, memory)


def test_many_ways_lfu_aging_and_small_queue(rng):
    """32 ways, 2-bit LFU counts (aging by halving happens often), few MSHRs and a short
    queue (frequent stalls), full-row reads and writes."""
    dut = CacheController(data_bytes=4, addr_width=16, line_beats=2, sets=2, ways=32,
                          policy="lfu", lfu_bits=2, mshrs=2, queue_depth=3)
    reqs = random_requests(rng, 300, rows=300, line_beats=2, row_beats=2, data_bytes=4,
                           write_fraction=0.3, zipf=0.8)
    got, kinds, contents, stats, _, memory = run_cache(dut, reqs, rng, rows=300,
                                                       latency=(1, 40))
    check_against_reference(dut, reqs, got, kinds, contents, stats, memory)
    assert stats["evictions"] > 10


def test_direct_mapped_single_set_lru(rng):
    """The corner shapes: one way (every conflict evicts), and one set."""
    for sets, ways in ((8, 1), (1, 4)):
        dut = CacheController(data_bytes=4, addr_width=12, line_beats=1, sets=sets, ways=ways,
                              mshrs=4)
        reqs = random_requests(rng, 150, rows=24, line_beats=1, row_beats=1, data_bytes=4,
                               write_fraction=0.4)
        got, kinds, contents, stats, _, memory = run_cache(dut, reqs, rng, rows=24)
        check_against_reference(dut, reqs, got, kinds, contents, stats, memory)


def test_invalidate_drops_lines_and_dirty_data(rng):
    """After INVALIDATE every row misses again, and unflushed writes never reach memory."""
    dut = OnChipCache(**SMALL)
    rows = 8
    memory = rng.integers(0, 256, rows * 4 * 4, dtype=np.uint8)
    full = (1 << 4) - 1
    writes = [Request(r * 4, 3, True, tuple((0xA5A5A5A5, full) for _ in range(3)))
              for r in range(4)]
    reads = [Request(r * 4, 3) for r in range(4)]
    mem = AmaranthMemory(dut.back, memory.copy(), data_bytes=4, rng=rng, latency=(2, 9))
    kinds, got = [], []

    async def tb(ctx):
        async def burst(reqs):
            for r in reqs:
                await stream_send(ctx, dut.front.req, [{"addr": r.addr, "beats": r.beats,
                                                        "write": int(r.write)}])
                if r.write:
                    await stream_send(ctx, dut.front.wdata,
                                      [{"data": d, "mask": m, "last": int(i == 2)}
                                       for i, (d, m) in enumerate(r.wdata)])
        await burst(writes + reads)
        got.extend(b.data for b in await stream_recv(ctx, dut.front.resp, 12))
        await stream_send(ctx, dut.cmd, [CacheOp.INVALIDATE])
        await burst(reads)
        got.extend(b.data for b in await stream_recv(ctx, dut.front.resp, 12))
        for _ in range(4):
            await ctx.tick()

    async def monitor(ctx):
        async for _, _, valid, kind in ctx.tick().sample(dut.lookup_valid, dut.lookup_kind):
            if valid:
                kinds.append(KIND[LookupKind(kind)])

    check = CollisionCheck(dut)        # colliding reads poisoned (see `run_cache`)
    run_amaranth(check.design, [tb], [mem.process], background=[monitor, check.monitor],
                 max_cycles=5000)
    # The reads right behind the write misses may merge into those misses (timing).
    assert [k.replace("merged", "hit") for k in kinds] == ["miss"] * 4 + ["hit"] * 4 + ["miss"] * 4
    assert all(v == 0xA5A5A5A5 for v in got[:12])          # written data, from the cache
    words = memory.view("<u4")
    assert got[12:] == [int(words[r * 4 + b]) for r in range(4) for b in range(3)]
    assert np.array_equal(mem.contents, memory)              # dirty lines were dropped


def test_hits_one_per_cycle_with_the_documented_latency():
    """Hits in distinct sets, one offered every cycle: one lookup per cycle, and the first
    beat after the lookup pipeline (accept, tag read, compare, update), the executor's
    register and the on-chip line memory's latency (``HIT_LATENCY`` cycles)."""
    dut = OnChipCache(data_bytes=4, addr_width=16, line_beats=4, sets=4, ways=4)
    figures = measure_hits(dut, 200)       # the measurement `neonic bench cache` reports
    assert figures["hit_lookups_per_cycle"] == 1.0          # one lookup per cycle, no bubble
    assert figures["hit_latency_cycles"] == HIT_LATENCY
    assert figures["hit_latency_min_cycles"] == HIT_LATENCY


def test_two_compare_stages_keep_one_hit_per_cycle_one_cycle_later():
    """The NIC organisation (two compare stages, tags in slices): still one lookup per cycle
    on hits in distinct sets, each one cycle later than with one compare stage."""
    dut = OnChipCache(data_bytes=4, addr_width=16, line_beats=4, sets=4, ways=4,
                      compare_stages=2, tag_slice_sets=2)
    figures = measure_hits(dut, 200)
    assert figures["hit_lookups_per_cycle"] == 1.0
    assert figures["hit_latency_cycles"] == figures["hit_latency_min_cycles"] == HIT_LATENCY + 1
    assert CacheTiming(row_beats=4, compare_stages=2).hit_latency == HIT_LATENCY + 1


def test_no_more_misses_wait_for_fills_than_there_are_mshrs(rng):
    """Every miss holds an MSHR from its lookup to its fill's last beat: with slow backing
    memory and misses to distinct lines, at most ``mshrs`` misses are waiting for their fills
    at once (a miss that fired without a free MSHR would be one more), and the results match
    the reference."""
    dut = CacheController(**{**SMALL, "mshrs": 2})
    rows = 64
    requests = [Request(addr=r * SMALL["row_beats"], beats=SMALL["row_beats"])
                for r in rng.permutation(rows)[:24]]
    in_flight = [0, 0]                                  # now, most

    async def fills(ctx):
        async for _, _, lv, kind, pv, pr, last in ctx.tick().sample(
                dut.lookup_valid, dut.lookup_kind,
                dut.back.resp.valid, dut.back.resp.ready, dut.back.resp.payload.last):
            in_flight[0] += (int(lv and LookupKind(kind) == LookupKind.MISS)
                             - int(pv and pr and last))
            in_flight[1] = max(in_flight[1], in_flight[0])

    got, kinds, contents, stats, _, memory = run_cache(
        dut, requests, rng, rows=rows, latency=(30, 40), idle=0.0, backpressure=0.0,
        resp_stall=0.0, accept_stall=0.0, monitors=(fills,))
    check_against_reference(dut, requests, got, kinds, contents, stats, memory)
    assert in_flight[1] == dut.mshrs


def test_back_to_back_hits_to_one_set_cost_one_bubble():
    """A request right behind one of its own set waits one cycle in stage 1 (the state word
    is never forwarded into the compare in the cycle it is computed): hits to one row offered
    every cycle are looked up every other cycle."""
    dut = OnChipCache(data_bytes=4, addr_width=16, line_beats=4, sets=4, ways=4)
    figures = measure_hits(dut, 100, rows=1)
    assert figures["hit_lookups_per_cycle"] == pytest.approx(0.5, abs=0.01)
    assert dut.controller.same_set_gap == 2


@pytest.mark.parametrize("compare_stages,line_slice", [(1, False), (2, True)])
def test_without_lookahead_a_request_of_one_set_reads_the_update_again(compare_stages,
                                                                       line_slice):
    """Without lookahead a request right behind one of its set waits until the update is
    written and the tag store read again: hits to one row offered every cycle are looked up
    once per ``compare_stages + 3`` cycles (``same_set_gap``); hits to 8 sets in turn
    still one per cycle, with the same latency as with lookahead (one cycle more with the
    register slice on the line requests)."""
    kw = dict(data_bytes=4, addr_width=16, line_beats=4, sets=8, ways=4,
              compare_stages=compare_stages, tag_slice_sets=2)
    kw["line_slice"] = line_slice
    dut = OnChipCache(**kw, lookahead=False)
    gap = dut.controller.same_set_gap
    assert gap == compare_stages + 3
    assert measure_hits(dut, 60, rows=1)["hit_lookups_per_cycle"] == pytest.approx(1 / gap,
                                                                               abs=0.01)
    figures = measure_hits(OnChipCache(**kw, lookahead=False), 200, rows=8)
    assert figures["hit_lookups_per_cycle"] == 1.0
    assert figures["hit_latency_cycles"] == HIT_LATENCY + compare_stages - 1 + line_slice
    assert figures["hit_latency_cycles"] == CacheTiming(
        row_beats=4, compare_stages=compare_stages, line_slice=line_slice).hit_latency


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_back_to_back_requests_to_one_set_see_each_others_updates(rng, policy):
    """The state word is read two cycles before the lookup that updates it: requests one and
    two places behind an update of their set must get the new word forwarded. Rows of one set
    offered every cycle (no idle), so every request follows an update of its own set."""
    dut = CacheController(data_bytes=4, addr_width=16, line_beats=4, sets=4, ways=2, mshrs=4,
                          queue_depth=8, policy=policy)
    rows = [0, 4, 8, 0, 4, 0, 8, 12, 8, 8, 4, 0, 12, 12, 0]   # all in set 0
    reqs = [Request(r * 4, 4, write=True, wdata=tuple((0x1000 * i + b, 0xF) for b in range(4)))
            if i % 3 == 1 else Request(r * 4, 4) for i, r in enumerate(rows)]
    check = CollisionCheck(dut)
    got, kinds, contents, stats, cycles, memory = run_cache(
        dut, reqs, rng, rows=16, idle=0.0, backpressure=0.0, resp_stall=0.0,
        accept_stall=0.0, check=check)
    check_against_reference(dut, reqs, got, kinds, contents, stats, memory)
    # every update of the set collides with the next request's tag read (poisoned, unused)
    assert check.collisions["tags"] > 5, check.summary()


@pytest.mark.parametrize("kwargs,name", [
    (dict(sets=0), "sets"), (dict(sets=12), "sets"), (dict(ways=0), "ways"),
    (dict(ways=65), "ways"), (dict(line_beats=3), "line_beats"),
    (dict(line_beats=2, row_beats=4), "row_beats"), (dict(mshrs=0), "mshrs"),
    (dict(policy="fifo"), "policy"), (dict(index="crc"), "index"),
    (dict(addr_width=8, sets=64, line_beats=4), "addr_width"), (dict(lfu_bits=1), "lfu_bits"),
    (dict(line_outstanding=1), "line_outstanding"), (dict(queue_depth=1), "queue_depth"),
    (dict(compare_stages=3), "compare_stages"), (dict(tag_slice_sets=48), "tag_slice_sets"),
    (dict(bank_ways=3), "bank_ways"), (dict(bank_ways=0), "bank_ways"),
    (dict(lookahead=0), "lookahead"), (dict(line_slice=None), "line_slice"),
])
def test_bad_parameters_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name}:"):
        CacheController(**kwargs)


def test_the_smartnic_preset_sizes_a_controller_with_its_lines_in_nic_memory():
    """64 MiB of 512 B rows, 32 ways: 4,096 sets whose state words (tags) are the on-chip
    part; the lines (exactly the cache's capacity) are behind the ``lines`` port."""
    from neonic.sim.nic import NICConfig
    from neonic.sim.units.cache import nic_cache_params

    nic = NICConfig(local_cache_bytes=64 * 2**20, cache_ways=32, datapath_bytes=64)
    params = nic_cache_params(nic, row_bytes=512, backing_bytes=1472 * 2**30)
    dut = CacheController(**params)
    dut._MustUse__silence = True
    assert (dut.sets, dut.ways, dut.line_beats, dut.row_beats) == (4096, 32, 8, 8)
    # the organisation for this size: two compare stages, the tags in 8 slices of 512 sets
    assert (dut.compare_stages, dut.tag_slices) == (2, 8)
    assert dut.line_memory_beats * dut.data_bytes == 64 * 2**20
    assert dut.line_outstanding >= nic.memory_latency_cycles       # hits stream at 1/cycle
    with pytest.raises(ValueError, match="^row_bytes:"):
        nic_cache_params(nic, row_bytes=0, backing_bytes=2**30)
    with pytest.raises(ValueError, match="^nic.local_cache_bytes:"):
        nic_cache_params(NICConfig(local_cache_bytes=1024), row_bytes=512, backing_bytes=2**30)
