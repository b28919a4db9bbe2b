"""The packetizer's Verilog under cocotb (Icarus, and Verilator when installed)."""

from __future__ import annotations

import pytest

from neonic.rtl.packetizer import Packetizer
from neonic.sim.harness.cocotb_runner import available_simulators, run_cocotb


# Verilator's build of this design takes about a minute per width: opt-in (-m slow).
SIMS = [pytest.param(s, marks=pytest.mark.slow) if s == "verilator" else s
        for s in available_simulators()]


@pytest.mark.parametrize("sim", SIMS)
@pytest.mark.parametrize("width", [8, 64])
def test_packetizer_verilog(sim, width, seed):
    dut = Packetizer(data_bytes=width, pmtu=256, num_dest=4)
    run_cocotb(dut, f"packetizer_w{width}", "tb_packetizer", sim=sim, seed=seed,
               params={"data_bytes": width, "pmtu": 256, "num_dest": 4,
                       "sizes": [1, 7, 64, 127, 300, 777], "idle": 0.25, "backpressure": 0.25})
