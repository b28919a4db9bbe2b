"""The cache's cocotb bench (sim/cocotb/tb_cache.py) on the generated Verilog, under every
available simulator, and the opt-in million-request soak under Verilator."""

from __future__ import annotations

import pytest

from neonic.rtl.cache import CacheController, OnChipCache
from neonic.sim.harness import available_simulators, read_tb_figures, run_cocotb
from neonic.sim.harness.collisions import CollisionCheck

UNIT = dict(data_bytes=4, addr_width=16, line_beats=4, row_beats=3, sets=4, ways=4, mshrs=4,
            queue_depth=8, policy="lru", index="hash")
SIMS = available_simulators() or [pytest.param("icarus", marks=pytest.mark.skip("no simulator"))]


def run_bench(sim, seed, unit: dict, workload: dict, device: str = "chip", **kw):
    dut = (OnChipCache if device == "chip" else CacheController)(**unit)
    # the tag store's (and line memory's) reads that collide with a write are poisoned in the
    # Verilog too: the bench's scoreboard fails if the cache uses one (`COLLISION_X_ATTR`)
    results = run_cocotb(CollisionCheck(dut).component, f"cache_{device}_" + "_".join(
        f"{v}" for v in unit.values()).replace(" ", ""), "tb_cache", sim=sim, seed=seed,
        params={"unit": unit, "workload": workload, "device": device}, **kw)
    return read_tb_figures(results)


@pytest.mark.parametrize("sim", SIMS)
def test_cache_bench_scoreboards_random_traffic(sim, seed):
    """The bare controller: the front, back and lines streams all under random idle,
    backpressure, latency and stalls."""
    figures = run_bench(sim, seed, UNIT,
                        {"episodes": 2, "count": 120, "rows": 40, "write_fraction": 0.3,
                         "error_fraction": 0.03, "latency": [1, 40]}, device="port")
    assert [e["requests"] for e in figures["episodes"]] == [120, 120]
    for ep in figures["episodes"]:
        assert ep["counters"]["misses"] > 0 and ep["counters"]["hits"] > 0


@pytest.mark.parametrize("sim", SIMS)
def test_cache_bench_scoreboards_the_nic_organisation(sim, seed):
    """The SmartNIC cache's organisation (two compare stages, no lookahead, line requests
    through a register slice, tags in slices) on the bare controller, under random traffic:
    the generated Verilog answers as the reference model does."""
    unit = dict(UNIT, sets=8, compare_stages=2, tag_slice_sets=2, lookahead=False,
                line_slice=True)
    figures = run_bench(sim, seed, unit,
                        {"episodes": 1, "count": 150, "rows": 40, "write_fraction": 0.3,
                         "error_fraction": 0.03, "latency": [1, 40]}, device="port")
    assert [e["requests"] for e in figures["episodes"]] == [150]


@pytest.mark.soak
@pytest.mark.skipif("verilator" not in available_simulators(), reason="needs Verilator")
def test_cache_soak_a_million_requests_under_verilator(seed):
    unit = dict(UNIT, sets=8, ways=8, mshrs=16, queue_depth=32, policy="lfu")
    figures = run_bench("verilator", seed, unit,
                        {"episodes": 50, "count": 20_000, "rows": 256, "write_fraction": 0.25,
                         "error_fraction": 0.01, "latency": [1, 60], "zipf": 1.0},
                        timeout_s=6 * 3600)
    assert figures["requests"] >= 1_000_000
