"""The memory model: contract of rtl/streams.py, randomised timing, stats, and misuse."""

from __future__ import annotations

import numpy as np
import pytest

from neonic.sim.harness import (AmaranthMemory, MemoryCore, MemoryModelError, run_amaranth,
                         stream_recv, stream_send)
from neonic.rtl.streams import MemPortSignature
from tests.sim.harness.designs import MemInitiator, random_mem_ops

DATA_BYTES = 8


@pytest.mark.parametrize("latency,max_outstanding,resp_stall,accept_stall,idle,backpressure", [
    ((1, 1), 1, 0.0, 0.0, 0.0, 0.0),
    ((1, 20), 8, 0.3, 0.2, 0.3, 0.3),
    ((5, 5), 2, 0.0, 0.0, 0.0, 0.5),
    ((2, 40), 32, 0.5, 0.0, 0.5, 0.0),
])
def test_reads_and_writes_through_a_unit_match_an_in_order_model(
        rng, latency, max_outstanding, resp_stall, accept_stall, idle, backpressure):
    dut = MemInitiator(data_bytes=DATA_BYTES)
    initial, cmds, wbeats, reads, final = random_mem_ops(rng, 120, beats_total=32,
                                                         data_bytes=DATA_BYTES)
    mem = AmaranthMemory(dut.mem, initial.copy(), data_bytes=DATA_BYTES, rng=rng,
                         latency=latency, max_outstanding=max_outstanding,
                         resp_stall=resp_stall, accept_stall=accept_stall)
    got = []

    async def commands(ctx):
        await stream_send(ctx, dut.cmd, cmds, rng=rng, idle=idle)

    async def write_data(ctx):
        await stream_send(ctx, dut.wr, wbeats, rng=rng, idle=idle)

    async def read_data(ctx):
        got.extend(await stream_recv(ctx, dut.rd, len(reads), rng=rng,
                                     backpressure=backpressure))
        for _ in range(8):  # let the last posted writes land
            await ctx.tick()

    run_amaranth(dut, [commands, write_data, read_data], processes=[mem.process],
                 max_cycles=50_000)
    assert got == reads
    np.testing.assert_array_equal(mem.contents, final)
    mem.check_idle()
    s = mem.stats
    assert s.requests == len(cmds) == s.read_requests + s.write_requests
    assert s.beats_read == len(reads) and s.beats_written == len(wbeats)
    assert 1 <= s.max_outstanding_seen <= max_outstanding
    assert s.busy_cycles <= s.cycles
    if resp_stall:
        assert s.resp_stall_cycles > 0


def make_core(rng, beats_total=16, **kwargs):
    contents = np.arange(beats_total * DATA_BYTES, dtype=np.uint8)
    return MemoryCore(contents, DATA_BYTES, rng, **kwargs)


def beat(core, addr):
    lo = addr * DATA_BYTES
    return int.from_bytes(core.contents[lo:lo + DATA_BYTES].tobytes(), "little")


def step(core, req=None, wdata=None, resp_ready=1):
    """One cycle: returns this cycle's outputs; a request/beat is offered with valid=1."""
    out = core.drive()
    core.edge(int(req is not None), req, int(wdata is not None), wdata, resp_ready)
    return out


def test_first_beat_comes_exactly_latency_cycles_after_acceptance(rng):
    core = make_core(rng, latency=(3, 3))
    assert step(core, req=(2, 2, 0))[0] == 1           # cycle 0: accepted
    assert [step(core)[2] for _ in range(2)] == [0, 0]  # cycles 1, 2: nothing yet
    assert step(core)[2:] == (1, beat(core, 2), 0)      # cycle 3: first beat
    assert step(core)[2:] == (1, beat(core, 3), 1)      # cycle 4: last beat
    assert step(core)[2] == 0
    core.check_idle()


def test_responses_stay_in_request_order_whatever_the_latencies(rng):
    core = make_core(rng, latency=(1, 30), max_outstanding=64)
    addrs = [int(a) for a in rng.integers(0, 16, size=40)]
    got = []
    for a in addrs:
        out = step(core, req=(a, 1, 0))
        if out[2]:
            got.append(out[3])
    for _ in range(200):
        ready = int(rng.random() < 0.5)
        out = step(core, resp_ready=ready)
        if out[2] and ready:
            got.append(out[3])
    assert got == [beat(core, a) for a in addrs]


def test_valid_is_never_withdrawn_before_the_beat_is_taken(rng):
    core = make_core(rng, latency=(1, 3), resp_stall=0.6, max_outstanding=64)
    for a in range(8):
        step(core, req=(a, 2, 0))
    prev_valid, prev_taken = 0, True
    for _ in range(200):
        ready = int(rng.random() < 0.3)
        valid = core.drive()[2]
        if prev_valid and not prev_taken:
            assert valid, "resp.valid dropped before its beat was taken"
        core.edge(0, None, 0, None, ready)
        prev_valid, prev_taken = valid, bool(valid and ready)
    assert core.stats.beats_read == 16 and core.stats.resp_stall_cycles > 0


def test_requests_are_refused_beyond_max_outstanding(rng):
    core = make_core(rng, latency=(50, 50), max_outstanding=3)
    readies = [step(core, req=(0, 1, 0))[0] for _ in range(6)]
    assert readies == [1, 1, 1, 0, 0, 0]
    assert core.stats.read_requests == 3 and core.outstanding == 3


def test_read_after_write_waits_for_late_write_data(rng):
    core = make_core(rng, latency=(1, 1))
    step(core, req=(4, 1, 1))           # write request, data not yet sent
    step(core, req=(4, 1, 0))           # read of the same beat
    for _ in range(5):
        assert step(core)[2] == 0       # the read must not overtake the write
    step(core, wdata=(0x1122334455667788, 0xFF, 1))
    outs = [step(core) for _ in range(2)]
    assert [o[3] for o in outs if o[2]] == [0x1122334455667788]


def test_read_before_write_returns_the_old_data(rng):
    core = make_core(rng, latency=(10, 10))
    old = beat(core, 5)
    step(core, req=(5, 1, 0))
    step(core, req=(5, 1, 1), wdata=(0, 0xFF, 1))  # later write lands before the read answers
    outs = [step(core) for _ in range(12)]
    assert [o[3] for o in outs if o[2]] == [old]
    assert beat(core, 5) == 0


def test_write_mask_enables_single_bytes(rng):
    core = make_core(rng)
    before = core.contents[8:16].copy()
    step(core, req=(1, 1, 1), wdata=(int.from_bytes(bytes(range(200, 208)), "little"),
                                     0b1000_0101, 1))
    expect = before.copy()
    expect[[0, 2, 7]] = [200, 202, 207]
    np.testing.assert_array_equal(core.contents[8:16], expect)


@pytest.mark.parametrize("data_bytes", [1, 2, 64, 256])
def test_write_mask_works_at_every_beat_width(rng, data_bytes):
    contents = np.zeros(4 * data_bytes, np.uint8)
    core = MemoryCore(contents, data_bytes, rng)
    data = int.from_bytes(rng.integers(1, 256, size=data_bytes, dtype=np.uint8).tobytes(),
                          "little")
    mask = int(rng.integers(0, 2**min(data_bytes, 62))) | (1 << (data_bytes - 1))  # top byte
    step(core, req=(2, 1, 1), wdata=(data, mask, 1))
    new = np.frombuffer(data.to_bytes(data_bytes, "little"), np.uint8)
    enable = np.array([(mask >> i) & 1 for i in range(data_bytes)], bool)
    np.testing.assert_array_equal(contents[2 * data_bytes:3 * data_bytes],
                                  np.where(enable, new, 0))
    assert contents[:2 * data_bytes].sum() == contents[3 * data_bytes:].sum() == 0


def test_write_data_may_arrive_before_its_request(rng):
    core = make_core(rng)
    step(core, wdata=(7, 0xFF, 0))
    step(core, wdata=(9, 0xFF, 1))
    with pytest.raises(MemoryModelError, match="write beat"):
        core.check_idle()
    step(core, req=(3, 2, 1))
    assert (beat(core, 3), beat(core, 4)) == (7, 9)
    core.check_idle()


@pytest.mark.parametrize("req,match", [
    ((15, 2, 0), r"read request out of range: beat address 0xf \+ 2 beat"),
    ((16, 1, 1), r"write request out of range"),
    ((0, 0, 0), r"beats=0"),
])
def test_contract_violations_raise_clear_errors(rng, req, match):
    core = make_core(rng)
    with pytest.raises(MemoryModelError, match=match):
        step(core, req=req)


def test_wrong_last_on_write_data_is_reported(rng):
    core = make_core(rng)
    step(core, req=(0, 2, 1))
    with pytest.raises(MemoryModelError, match=r"beat 0 of 2 .* last=1, expected last=0"):
        step(core, wdata=(0, 0xFF, 1))


def test_out_of_range_stops_an_amaranth_simulation(rng):
    dut = MemInitiator(data_bytes=DATA_BYTES)
    mem = AmaranthMemory(dut.mem, np.zeros(4 * DATA_BYTES, np.uint8), data_bytes=DATA_BYTES,
                         rng=rng)

    async def commands(ctx):
        await stream_send(ctx, dut.cmd, [{"addr": 4, "beats": 1, "write": 0}])
        for _ in range(20):
            await ctx.tick()

    with pytest.raises(MemoryModelError, match="out of range"):
        run_amaranth(dut, [commands], processes=[mem.process], max_cycles=100)


@pytest.mark.parametrize("kwargs,match", [
    ({"latency": (0, 3)}, "latency"), ({"latency": (5, 2)}, "latency"),
    ({"latency": 3}, "latency"), ({"max_outstanding": 0}, "max_outstanding"),
    ({"resp_stall": 1.0}, "resp_stall"), ({"accept_stall": -1}, "accept_stall"),
])
def test_bad_memory_parameters_are_refused(rng, kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_core(rng, **kwargs)


def test_bad_contents_and_data_bytes_are_refused(rng):
    with pytest.raises(ValueError, match="contents"):
        MemoryCore(np.zeros(10, np.uint8), DATA_BYTES, rng)
    with pytest.raises(ValueError, match="contents"):
        MemoryCore(np.zeros(16, np.int32), DATA_BYTES, rng)
    with pytest.raises(ValueError, match="data_bytes"):
        AmaranthMemory(MemPortSignature(data_bytes=8).create(), np.zeros(64, np.uint8),
                       data_bytes=16, rng=rng)
