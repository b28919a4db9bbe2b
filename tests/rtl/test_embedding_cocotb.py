"""The embedding unit's cocotb bench (sim/cocotb/tb_embedding.py) on the generated Verilog,
under every available simulator: random workloads over every element type and pooling mode,
random memory latency, idle input and backpressure, scoreboarded bit-exact against the
reference. The Verilator case is marked slow: its first C++ build of this design takes
minutes on two cores (later runs reuse the build)."""

from __future__ import annotations

import pytest

from neonic.sim.units.embedding import SMALL_UNIT, SMALL_UNIT_NAME, run_cocotb_workload
from neonic.sim.harness import available_simulators


def _sims():
    sims = available_simulators()
    if not sims:
        return [pytest.param("icarus", marks=pytest.mark.skip(reason="no simulator installed"))]
    return [pytest.param(s, marks=pytest.mark.slow) if s == "verilator" else s for s in sims]


@pytest.mark.parametrize("sim", _sims())
def test_embedding_bench_scoreboards_random_workloads(sim, seed):
    spec = {"kind": "random", "episodes": 2, "num_bags": 10, "max_len": 6, "stress": True}
    figures, _ = run_cocotb_workload(SMALL_UNIT, spec, sim=sim, seed=seed,
                                     name=SMALL_UNIT_NAME)   # raises if a check failed
    assert len(figures["episodes"]) == 2
    for ep in figures["episodes"]:
        assert ep["counters"]["bags_in"] == ep["counters"]["bags_out"] == 10
        assert ep["cycles"] > 0
