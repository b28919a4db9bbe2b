"""The register slice (``rtl.streams.SkidBuffer``): order kept, nothing lost or duplicated,
one transfer per cycle, and no combinational path from ``o.ready`` to ``i.ready``; and the
two-entry ``PingPongBuffer``, which must behave as the slice does on every cycle."""

import numpy as np
import pytest
from amaranth.sim import Simulator

from amaranth.hdl import Elaboratable, Module

from neonic.rtl.streams import (CreditFIFO, CreditLUTFIFO, DelayLine, HeadFIFO, PingPongBuffer,
                                 SkidBuffer)


def _run(p_valid: float, p_ready: float, n: int, seed: int):
    rng = np.random.default_rng(seed)
    dut = SkidBuffer(16)
    sent, got = [], []
    cycles = {"n": 0}

    async def bench(ctx):
        nxt = 0
        while len(got) < n:
            offer = nxt < n and rng.random() < p_valid
            ctx.set(dut.i.valid, offer)
            ctx.set(dut.i.payload, nxt if offer else 0)
            ready = rng.random() < p_ready
            in_ready_before = ctx.get(dut.i.ready)
            ctx.set(dut.o.ready, ready)
            # i.ready comes from a flip-flop: it cannot follow o.ready within the cycle.
            assert ctx.get(dut.i.ready) == in_ready_before
            if offer and ctx.get(dut.i.ready):
                sent.append(nxt)
                nxt += 1
            if ctx.get(dut.o.valid) and ready:
                got.append(ctx.get(dut.o.payload))
            await ctx.tick()
            cycles["n"] += 1
            assert cycles["n"] < 20 * n + 100, "skid buffer stopped passing data"

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return sent, got, cycles["n"]


def test_random_valid_and_ready_keep_every_item_in_order():
    for seed in range(3):
        sent, got, _ = _run(0.6, 0.5, 200, seed)
        assert got == list(range(200))
        assert sent == got


def test_one_transfer_per_cycle_when_both_sides_always_go():
    _, got, cycles = _run(1.0, 1.0, 100, 0)
    assert got == list(range(100))
    assert cycles <= 100 + 2          # one cycle of latency, then one item per cycle


def test_peek_shows_what_the_output_holds_after_it_advances():
    rng = np.random.default_rng(7)
    dut = SkidBuffer(16, peek=True)
    checked = {"n": 0}

    async def bench(ctx):
        nxt, expect = 0, None
        for _ in range(400):
            offer = rng.random() < 0.6
            ctx.set(dut.i.valid, offer)
            ctx.set(dut.i.payload, nxt)
            ready = rng.random() < 0.5
            ctx.set(dut.o.ready, ready)
            if offer and ctx.get(dut.i.ready):
                nxt += 1
            advances = not ctx.get(dut.o.valid) or ready
            expect = ((ctx.get(dut.peek_valid), ctx.get(dut.peek_payload))
                      if advances else None)
            await ctx.tick()
            if expect is not None:
                assert ctx.get(dut.o.valid) == expect[0]
                if expect[0]:
                    assert ctx.get(dut.o.payload) == expect[1]
                    checked["n"] += 1

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert checked["n"] > 50


class _Pair(Elaboratable):
    """A SkidBuffer and a PingPongBuffer (both with ``peek``) side by side, fed the same inputs."""

    def __init__(self, read_copies: int = 1, reset_less: bool = False):
        self.skid = SkidBuffer(16, peek=True)
        self.pp = PingPongBuffer(16, peek=True, read_copies=read_copies, reset_less=reset_less)

    def elaborate(self, platform):
        m = Module()
        m.submodules.skid = self.skid
        m.submodules.pp = self.pp
        return m


@pytest.mark.parametrize("read_copies, reset_less", [(1, False), (3, False), (1, True)])
def test_ping_pong_buffer_matches_the_skid_buffer_cycle_for_cycle(read_copies, reset_less):
    """Same cycles, different timing, so both classes stay: on a 512-bit beat (ECP5-85F
    speed grade 6, ``bench timing``'s flow, seeds 1/2/3), a consumer whose ``ready`` ends a
    32-bit compare reaches 137.2/115.0/124.9 MHz behind a SkidBuffer (the compare drives the
    enable of 512 output flip-flops) and 168.2/148.7/168.0 behind a PingPongBuffer; a
    producer whose ``valid`` ends that compare reaches 188.3/215.2/176.8 MHz into a
    SkidBuffer and 126.5/118.1/129.1 into a PingPongBuffer whose ``valid`` drove the
    entries' write enables (the PingPongBuffer measured then; its write enables are now
    flip-flops, not remeasured in this harness). LUTs and FFs within 5 of each other. Use
    the buffer whose wide enables come from the side that is early. With its read pointer in
    copies (each selecting a share of the payload's bits) it is the same, cycle for cycle, and
    so with its entries without reset (``reset_less``)."""
    rng = np.random.default_rng(11)
    pair = _Pair(read_copies, reset_less)
    checked = {"n": 0, "moved": 0, "peeked": 0}

    async def bench(ctx):
        nxt = 0
        for _ in range(3000):
            offer = bool(rng.random() < 0.6)
            ready = bool(rng.random() < 0.5)
            for dut in (pair.skid, pair.pp):
                ctx.set(dut.i.valid, offer)
                ctx.set(dut.i.payload, nxt)
                ctx.set(dut.o.ready, ready)
            a, b = pair.skid, pair.pp
            assert ctx.get(b.i.ready) == ctx.get(a.i.ready)
            assert ctx.get(b.o.valid) == ctx.get(a.o.valid)
            if ctx.get(a.o.valid):
                assert ctx.get(b.o.payload) == ctx.get(a.o.payload)
                checked["moved"] += ready
            # (``peek``: the entry behind the output, the same in both)
            assert ctx.get(b.peek_valid) == ctx.get(a.peek_valid)
            if ctx.get(a.peek_valid):
                assert ctx.get(b.peek_payload) == ctx.get(a.peek_payload)
                checked["peeked"] += 1
            if offer and ctx.get(a.i.ready):
                nxt = (nxt + 1) & 0xFFFF
            checked["n"] += 1
            await ctx.tick()

    sim = Simulator(pair)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert checked["n"] == 3000 and checked["moved"] > 1000 and checked["peeked"] > 1000


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_ping_pong_buffer_and_credit_fifo_refuse_no_read_pointer():
    with pytest.raises(ValueError, match="read_copies"):
        PingPongBuffer(16, read_copies=0)
    with pytest.raises(ValueError, match="read_copies"):
        CreditFIFO(width=8, depth=4, read_copies=0)


def _queues_side_by_side(ref, dut, rng, *, cycles: int, p_write: float, p_read: float,
                         keep_contract: bool) -> tuple[list, int]:
    """Drive two queues with the same random writes and reads for ``cycles`` cycles and
    compare what they show on every cycle (``r_rdy``, ``r_data`` when ready, ``w_rdy``,
    ``level``). ``keep_contract``: no write while ``dut.w_rdy`` is low. Returns the first
    differences (cycle, both views) and the number of cycles the queue was full."""
    m = Module()
    m.submodules.ref, m.submodules.dut = ref, dut
    draws = rng.random((cycles, 2))
    data_in = rng.integers(0, 256, cycles)
    seen = {"mismatch": [], "full": 0}

    async def bench(ctx):
        for cyc in range(cycles):
            w_en = int(draws[cyc, 0] < p_write)
            if keep_contract:
                w_en &= ctx.get(dut.w_rdy)
            r_en = int(draws[cyc, 1] < p_read)
            seen["full"] += ctx.get(dut.level) == dut.depth
            for f in (ref, dut):
                ctx.set(f.w_en, w_en)
                ctx.set(f.w_data, int(data_in[cyc]))
                ctx.set(f.r_en, r_en)
            got = [(ctx.get(f.r_rdy), ctx.get(f.r_data) if ctx.get(f.r_rdy) else None,
                    ctx.get(f.w_rdy), ctx.get(f.level)) for f in (ref, dut)]
            if got[0] != got[1]:
                seen["mismatch"].append((cyc, got))
            await ctx.tick()

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return seen["mismatch"], seen["full"]


@pytest.mark.parametrize("write_on_room", [False, True])
def test_head_fifo_matches_syncfifo_cycle_for_cycle(rng, write_on_room):
    """The registered-head FIFO (the cache's route and fill queues) behaves as amaranth's
    ``SyncFIFO`` of the same depth, every cycle (``r_rdy``, ``r_data`` when ready, ``w_rdy``,
    ``level``), under random writes and reads, writes while full included: the change moves
    the head into a register, not the cycles. So with its memory written on every cycle it
    has room (``write_on_room``)."""
    from amaranth.lib.fifo import SyncFIFO

    for depth in (2, 4, 5):
        mismatches, full = _queues_side_by_side(
            SyncFIFO(width=8, depth=depth),
            HeadFIFO(width=8, depth=depth, write_on_room=write_on_room), rng,
            cycles=600, p_write=0.65, p_read=0.45, keep_contract=False)
        assert not mismatches, f"depth {depth}: first differences {mismatches[:3]}"
        assert full > 20


@pytest.mark.parametrize("registered_w_rdy, read_copies, read_ahead",
                         [(False, 1, False), (True, 1, False), (True, 3, False), (False, 1, True)])
def test_credit_fifo_matches_syncfifobuffered_when_the_writer_keeps_its_contract(
        rng, registered_w_rdy, read_copies, read_ahead):
    """The payload queue without a full check in its write path (``CreditFIFO``) behaves as
    amaranth's ``SyncFIFOBuffered`` of the same depth on every cycle (``r_rdy``, ``r_data``
    when ready, ``w_rdy``, ``level``) under random writes and reads, as long as nothing is
    written while ``w_rdy`` is low; the queues run full often (writes 70%, reads 40%). With
    ``w_rdy`` from a flip-flop it is the same, and so with the memory in three shares of the
    entry read at three copies of the read pointer, and so with the memory read
    asynchronously into a register of its own (``read_ahead``)."""
    from amaranth.lib.fifo import SyncFIFOBuffered

    for depth in (2, 3, 5, 8):
        mismatches, full = _queues_side_by_side(
            SyncFIFOBuffered(width=8, depth=depth),
            CreditFIFO(width=8, depth=depth, registered_w_rdy=registered_w_rdy,
                       read_copies=read_copies, read_ahead=read_ahead), rng,
            cycles=800, p_write=0.7, p_read=0.4, keep_contract=True)
        assert not mismatches, f"depth {depth}: first differences {mismatches[:3]}"
        assert full > 20


@pytest.mark.parametrize("read_copies", [1, 3])
def test_credit_lut_fifo_matches_syncfifo_when_the_writer_keeps_its_contract(rng, read_copies):
    """The LUT-RAM queue without a full check in its write path (``CreditLUTFIFO``, the
    gather's output queue) behaves as amaranth's ``SyncFIFO`` of the same depth on every
    cycle (``r_rdy``, ``r_data`` when ready, ``w_rdy``, ``level``) under random writes and
    reads, as long as nothing is written while ``w_rdy`` is low; the queues run full often
    (writes 70%, reads 40%). So with the memory in three shares of the entry read at three
    copies of the read pointer. Broken contract: a write while full overwrites the oldest
    entry (``SyncFIFO`` drops it), so the two then differ."""
    from amaranth.lib.fifo import SyncFIFO

    for depth in (1, 2, 3, 5, 8):
        mismatches, full = _queues_side_by_side(
            SyncFIFO(width=8, depth=depth),
            CreditLUTFIFO(width=8, depth=depth, read_copies=read_copies), rng,
            cycles=800, p_write=0.7, p_read=0.4, keep_contract=True)
        assert not mismatches, f"depth {depth}: first differences {mismatches[:3]}"
        assert full > 20
    mismatches, _ = _queues_side_by_side(
        SyncFIFO(width=8, depth=3), CreditLUTFIFO(width=8, depth=3), rng,
        cycles=300, p_write=0.7, p_read=0.4, keep_contract=False)
    assert mismatches
    with pytest.raises(ValueError, match="read_copies"):
        CreditLUTFIFO(width=8, depth=4, read_copies=0)


@pytest.mark.parametrize("copies", [1, 3])
def test_delay_line_is_the_input_latency_cycles_before(rng, copies):
    """``DelayLine``: on every cycle from ``latency`` on, ``o`` is ``i`` of ``latency`` cycles
    before, for every latency it takes (2..16), with one memory or three shares; 1 and 17
    are refused."""
    for latency in (2, 3, 11, 16):
        dut = DelayLine(width=12, latency=latency, copies=copies)
        data_in = rng.integers(0, 1 << 12, 80)
        bad = []

        async def bench(ctx, dut=dut, data_in=data_in, bad=bad, latency=latency):
            for cyc, v in enumerate(data_in):
                ctx.set(dut.i, int(v))
                if cyc >= latency and ctx.get(dut.o) != data_in[cyc - latency]:
                    bad.append(cyc)
                await ctx.tick()

        sim = Simulator(dut)
        sim.add_clock(1e-6)
        sim.add_testbench(bench)
        sim.run()
        assert not bad, f"latency {latency}: wrong on cycles {bad[:5]}"
    for latency in (1, 17):
        with pytest.raises(ValueError, match="latency"):
            DelayLine(width=8, latency=latency)


def test_credit_fifo_read_ahead_shows_the_next_cycles_head(rng):
    """``read_ahead``: ``r_rdy_next`` is ``r_rdy`` of the next cycle, and ``r_data_next``
    its ``r_data`` where that is ready, under random writes and reads (with and without a
    write on the same cycle); ``read_copies`` cannot go with it."""
    for depth in (2, 3, 6):
        dut = CreditFIFO(width=8, depth=depth, read_ahead=True)
        draws = rng.random((700, 2))
        data_in = rng.integers(0, 256, 700)
        seen = {"checked": 0, "bad": []}

        async def bench(ctx, dut=dut, draws=draws, data_in=data_in, seen=seen):
            predicted = None
            for cyc in range(len(draws)):
                now = (ctx.get(dut.r_rdy), ctx.get(dut.r_data))
                if predicted is not None:
                    rdy, dat = predicted
                    if now[0] != rdy or (rdy and now[1] != dat):
                        seen["bad"].append((cyc, predicted, now))
                    seen["checked"] += rdy
                w_en = int(draws[cyc, 0] < 0.6) & ctx.get(dut.w_rdy)
                ctx.set(dut.w_en, w_en)
                ctx.set(dut.w_data, int(data_in[cyc]))
                ctx.set(dut.r_en, int(draws[cyc, 1] < 0.5))
                predicted = (ctx.get(dut.r_rdy_next), ctx.get(dut.r_data_next))
                await ctx.tick()

        sim = Simulator(dut)
        sim.add_clock(1e-6)
        sim.add_testbench(bench)
        sim.run()
        assert not seen["bad"], f"depth {depth}: first differences {seen['bad'][:3]}"
        assert seen["checked"] > 200
    with pytest.raises(ValueError, match="read_ahead"):
        CreditFIFO(width=8, depth=4, read_ahead=True, read_copies=2)


def test_credit_fifo_write_enable_does_not_depend_on_the_level():
    """The reason for ``CreditFIFO``: its memory's write enable is the writer's ``w_en``
    alone. With the queue full, a write still reaches the memory (and overwrites the oldest
    unread entry, the documented cost of breaking the contract)."""
    dut = CreditFIFO(width=8, depth=3)
    out = []

    async def bench(ctx):
        for v in (1, 2, 3):                       # fill: two in memory, one in the head
            ctx.set(dut.w_en, 1)
            ctx.set(dut.w_data, v)
            await ctx.tick()
        ctx.set(dut.w_en, 0)
        await ctx.tick()
        assert ctx.get(dut.level) == 3 and not ctx.get(dut.w_rdy)
        ctx.set(dut.w_en, 1)                      # the contract broken: written all the same
        ctx.set(dut.w_data, 9)
        await ctx.tick()
        ctx.set(dut.w_en, 0)
        ctx.set(dut.r_en, 1)
        for _ in range(3):
            await ctx.tick()
            out.append(ctx.get(dut.r_data))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert 9 in out
