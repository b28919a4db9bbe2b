"""The SmartNIC top's generated Verilog (Icarus under cocotb, ``sim/cocotb/tb_smartnic.py``;
Verilator through the native harness, ``sim.cosim.native``): a 2 x 1 cluster's traffic with
random idle on every input stream and backpressure on every output stream, both phases; the
destination buffers equal the reference and the cache's misses the reference model's.
Verilator builds the top in about a minute on two cores: opt-in (slow)."""

from __future__ import annotations

import pytest

from neonic.sim.cosim import run_cosim, synthetic_traffic
from neonic.sim.harness import available_simulators

SIMS = [pytest.param(s, marks=pytest.mark.slow) if s == "verilator" else s
        for s in available_simulators()]

@pytest.mark.parametrize("sim", SIMS)
def test_cluster_traffic_through_the_verilog_top(sim, seed, tmp_path):
    traffic = synthetic_traffic(world=2, gpus_per_node=1, batch_per_gpu=2, pooling=3, rows=24,
                                seed=seed)
    report = run_cosim(traffic, sim=sim, seed=seed, idle=0.2, backpressure=0.2,
                       workdir=tmp_path)
    assert report.buffers_match, f"{report.mismatched_bytes} bytes differ"
    assert report.cache_misses_match
    assert report.drops == 0
    assert all(n.completions == 2 for n in report.nics)
    # the bench measured its own simulation phase: every cycle of both phases, in some time
    assert report.sim_cycles >= report.rtl_cycles > 0
    assert 0 < report.sim_wall_s < report.wall_s
