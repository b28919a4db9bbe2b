"""cocotb bench with one passing and one deliberately failing test: run_cocotb must raise
an AssertionError naming only the failing one (see tests/sim/harness/test_harness_cocotb.py).
"""

import cocotb
from cocotb.triggers import ClockCycles

from neonic.sim.harness.cocotb_streams import start_clock_and_reset, tb_params


async def start(dut):
    for port in ("i__valid", "o__ready", "cmd__valid", "wr__valid", "rd__ready",
                 "mem__req__ready", "mem__wdata__ready", "mem__resp__valid"):
        getattr(dut, port).value = 0
    await start_clock_and_reset(dut)


@cocotb.test()
async def test_passes(dut):
    await start(dut)
    await ClockCycles(dut.clk, 3)
    assert tb_params()["answer"] == 42


@cocotb.test()
async def test_fails_on_purpose(dut):
    await start(dut)
    await ClockCycles(dut.clk, 3)
    assert 1 + 1 == 3, "deliberate failure"


@cocotb.test()
async def test_hangs(dut):
    """Runs (in simulated time) forever: only for the wall-clock timeout check."""
    await start(dut)
    while True:
        await ClockCycles(dut.clk, 1000)
