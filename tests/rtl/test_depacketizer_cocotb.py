"""The depacketizer's Verilog under cocotb (Icarus; Verilator opt-in, see below)."""

from __future__ import annotations

import pytest

from neonic.rtl.depacketizer import Depacketizer
from neonic.sim.harness.cocotb_runner import available_simulators, run_cocotb, read_tb_figures

# Verilator builds of these designs take about a minute, and the 64-byte design ~50 s under
# Icarus: opt-in (-m slow).
SIMS = [pytest.param(s, marks=pytest.mark.slow) if s == "verilator" else s
        for s in available_simulators()]


@pytest.mark.parametrize("sim", SIMS)
@pytest.mark.parametrize("width", [8, pytest.param(64, marks=pytest.mark.slow)])
def test_depacketizer_verilog(sim, width, seed):
    dut = Depacketizer(data_bytes=width, pmtu=256, num_qps=4)
    results = run_cocotb(dut, f"depacketizer_w{width}", "tb_depacketizer", sim=sim, seed=seed,
                         params={"data_bytes": width, "pmtu": 256, "num_qps": 4,
                                 "beats_width": dut.beats_width,
                                 "sizes": [1, 7, 64, 127, 300, 777, 40, 5],
                                 "idle": 0.25, "backpressure": 0.25, "accept_stall": 0.25})
    figures = read_tb_figures(results)
    assert figures["accepted"] > 8 and figures["frames"] > figures["accepted"]
