"""The Amaranth-simulator part of the harness: run_amaranth and the stream helpers."""

from __future__ import annotations

import pytest
from amaranth.hdl import unsigned

from neonic.sim.harness import SimulationTimeout, run_amaranth, stream_recv, stream_send
from tests.sim.harness.designs import PAYLOAD, StreamPassthrough, random_payloads


@pytest.mark.parametrize("idle,backpressure", [(0.0, 0.0), (0.5, 0.0), (0.0, 0.5), (0.3, 0.6)])
def test_passthrough_scoreboard_under_idle_and_backpressure(rng, idle, backpressure):
    dut = StreamPassthrough(PAYLOAD, depth=4)
    sent = random_payloads(rng, 300)
    got = []

    async def source(ctx):
        await stream_send(ctx, dut.i, sent, rng=rng, idle=idle)

    async def sink(ctx):
        got.extend(await stream_recv(ctx, dut.o, len(sent), rng=rng, backpressure=backpressure))

    cycles = run_amaranth(dut, [source, sink], max_cycles=20_000)
    # Nothing lost, duplicated or reordered (data.Const compares equal to the dict it encodes).
    assert got == [PAYLOAD.const(p) for p in sent]
    assert got[-1].last == 1
    if idle == backpressure == 0.0:
        # Back-to-back transfers: the helpers themselves cost no throughput.
        assert cycles <= len(sent) + 4
    else:
        assert cycles > len(sent) * 1.3


def test_cycle_count_is_edges_until_the_last_testbench_returns():
    dut = StreamPassthrough(unsigned(8))

    async def short(ctx):
        await ctx.tick().repeat(7)

    async def longer(ctx):
        await ctx.tick().repeat(23)

    assert run_amaranth(dut, [short], max_cycles=100) == 7
    assert run_amaranth(dut, [short, longer], max_cycles=100) == 23


def test_recv_until_predicate_stops_after_the_matching_payload(rng):
    dut = StreamPassthrough(PAYLOAD)
    sent = random_payloads(rng, 10) + random_payloads(rng, 5)  # `last` on items 9 and 14
    got = []

    async def source(ctx):
        await stream_send(ctx, dut.i, sent[:10], rng=rng, idle=0.2)

    async def sink(ctx):
        got.extend(await stream_recv(ctx, dut.o, until=lambda p: p.last, rng=rng,
                                     backpressure=0.2))

    run_amaranth(dut, [source, sink], max_cycles=1000)
    assert got == [PAYLOAD.const(p) for p in sent[:10]]


def test_timeout_raises_simulation_timeout_naming_the_cycles():
    dut = StreamPassthrough(unsigned(8), depth=2)

    async def source(ctx):  # nobody drains the FIFO: blocks forever
        await stream_send(ctx, dut.i, range(10))

    with pytest.raises(SimulationTimeout, match=r"max_cycles=50") as info:
        run_amaranth(dut, [source], max_cycles=50)
    assert isinstance(info.value, AssertionError)


def test_testbench_exception_propagates():
    dut = StreamPassthrough(unsigned(8))

    async def failing(ctx):
        await ctx.tick()
        assert False, "scoreboard mismatch"

    with pytest.raises(AssertionError, match="scoreboard mismatch"):
        run_amaranth(dut, [failing], max_cycles=10)


def test_vcd_is_written_with_the_design_signals(tmp_path, rng):
    dut = StreamPassthrough(unsigned(8))
    vcd, gtkw = tmp_path / "w" / "run.vcd", tmp_path / "w" / "run.gtkw"

    async def source(ctx):
        await stream_send(ctx, dut.i, range(5))

    async def sink(ctx):
        await stream_recv(ctx, dut.o, 5)

    run_amaranth(dut, [source, sink], vcd=vcd, gtkw=gtkw, max_cycles=100)
    text = vcd.read_text()
    assert "$enddefinitions" in text and "i__valid" in text and "o__payload" in text
    assert gtkw.exists()


def test_vcd_is_written_even_when_the_run_times_out(tmp_path):
    dut = StreamPassthrough(unsigned(8))
    vcd = tmp_path / "timeout.vcd"

    async def stuck(ctx):
        for _ in range(1000):  # one-shot waits: see the run_amaranth docstring
            await ctx.tick()

    with pytest.raises(SimulationTimeout):
        run_amaranth(dut, [stuck], vcd=vcd, max_cycles=20)
    assert "$enddefinitions" in vcd.read_text()


@pytest.mark.parametrize("kwargs,match", [
    ({"max_cycles": 0}, "max_cycles"),
    ({"max_cycles": 10, "clock_period_s": 0}, "clock_period_s"),
])
def test_bad_run_arguments_are_refused(kwargs, match):
    async def tb(ctx):
        pass

    with pytest.raises(ValueError, match=match):
        run_amaranth(StreamPassthrough(unsigned(8)), [tb], **kwargs)


def test_no_testbench_is_refused():
    with pytest.raises(ValueError, match="testbenches"):
        run_amaranth(StreamPassthrough(unsigned(8)), [], max_cycles=10)


@pytest.mark.parametrize("kwargs,match", [
    ({"idle": 1.0}, "idle"), ({"idle": -0.1}, "idle"), ({"idle": 0.5, "rng": None}, "rng"),
])
def test_bad_stream_helper_arguments_are_refused(kwargs, match):
    dut = StreamPassthrough(unsigned(8))

    async def tb(ctx):
        await stream_send(ctx, dut.i, [1], **kwargs)

    with pytest.raises(ValueError, match=match):
        run_amaranth(dut, [tb], max_cycles=10)
