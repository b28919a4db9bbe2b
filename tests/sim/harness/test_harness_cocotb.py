"""run_cocotb and the cocotb-side helpers, on the tiny designs, under every simulator here.

All benches run on one design (``HarnessTop``), so each simulator builds once.
"""

from __future__ import annotations

import pytest

from neonic.sim.harness import available_simulators, read_tb_figures, run_cocotb
from tests.sim.harness.designs import HarnessTop

SIMS = available_simulators()
needs_icarus = pytest.mark.skipif("icarus" not in SIMS, reason="Icarus Verilog not installed")

MEM = dict(addr_width=16, beats_width=4, data_bytes=8)
TOP = "harness_top"


def top():
    return HarnessTop(**MEM)


def mem_params(**overrides):
    params = dict(MEM, n=150, beats_total=32, latency=[1, 20], max_outstanding=8,
                  resp_stall=0.3, accept_stall=0.2, idle=0.3, backpressure=0.3)
    params.update(overrides)
    return params


@pytest.mark.parametrize("sim", SIMS)
def test_stream_driver_and_monitor_keep_every_payload_in_order(sim, seed):
    results = run_cocotb(top(), TOP, "tb_harness_streams", sim=sim,
                         testcase="test_passthrough,test_recv_one_by_one",
                         params={"n": 400, "idle": 0.3, "backpressure": 0.4}, seed=seed)
    figures = read_tb_figures(results)
    assert figures["passthrough_items"] == 400
    assert set(figures["tests"]) == {"test_passthrough", "test_recv_one_by_one"}


@needs_icarus
def test_helpers_sustain_one_beat_per_cycle_without_idle_or_backpressure(seed):
    results = run_cocotb(top(), TOP, "tb_harness_streams", testcase="test_passthrough",
                         params={"n": 300, "idle": 0.0, "backpressure": 0.0}, seed=seed)
    assert read_tb_figures(results)["passthrough_cycles"] <= 300 + 8


@pytest.mark.skipif(not SIMS, reason="no HDL simulator installed")
def test_cocotb_memory_matches_the_model_identically_on_every_simulator(seed):
    """Scoreboard and stats in the bench; across simulators, the same seed must give the
    same cycle count (the memory core and helpers see identical transfers)."""
    cycles = {}
    for sim in SIMS:
        results = run_cocotb(top(), TOP, "tb_harness_streams", sim=sim, testcase="test_memory",
                             params=mem_params(), seed=seed)
        figures = read_tb_figures(results)
        assert figures["memory_stats"]["requests"] == 150
        assert figures["memory_stats"]["resp_stall_cycles"] > 0
        cycles[sim] = figures["memory_cycles"]
    assert len(set(cycles.values())) == 1, cycles


@needs_icarus
def test_failing_cocotb_tests_raise_assertion_error_naming_them():
    with pytest.raises(AssertionError) as info:
        run_cocotb(top(), TOP, "tb_harness_fail", testcase="test_passes,test_fails_on_purpose",
                   params={"answer": 42})
    message = str(info.value)
    assert "1 of 2 cocotb test(s) failed" in message  # test_passes saw the params
    assert "tb_harness_fail.test_fails_on_purpose" in message
    assert "deliberate failure" in message
    assert "test_passes:" not in message
    assert "sim.log tail" in message


@needs_icarus
def test_contract_violation_in_cocotb_memory_fails_the_run():
    with pytest.raises(AssertionError, match=r"read request out of range: beat address 0x4"):
        run_cocotb(top(), TOP, "tb_harness_streams",
                   testcase="test_memory_out_of_range_fails_the_test", params=mem_params())


@needs_icarus
def test_wall_clock_limit_kills_a_hanging_simulation():
    with pytest.raises(AssertionError, match="wall-clock limit"):
        run_cocotb(top(), TOP, "tb_harness_fail", testcase="test_hangs", timeout_s=4)


@needs_icarus
def test_no_matching_test_is_an_error():
    with pytest.raises(AssertionError, match="no cocotb test ran"):
        run_cocotb(top(), TOP, "tb_harness_fail", testcase="test_does_not_exist")


@needs_icarus
def test_waves_are_written_next_to_the_results(seed):
    results = run_cocotb(top(), TOP, "tb_harness_streams", testcase="test_recv_one_by_one",
                         waves=True, seed=seed)
    fst = results.parent / f"{TOP}.fst"
    assert fst.is_file() and fst.stat().st_size > 0


def test_unknown_simulator_is_refused_naming_the_parameter():
    with pytest.raises(ValueError, match=r"sim: expected one of icarus, verilator .*'modelsim'"):
        run_cocotb(object(), "x", "tb_harness_fail", sim="modelsim")


@pytest.mark.parametrize("kwargs,match", [
    ({"test_module": "tests.cocotb.tb_x"}, "test_module"),
    ({"test_module": "tb_harness_fail", "params": {"f": object()}}, "params"),
    ({"test_module": "tb_harness_fail", "timeout_s": 0}, "timeout_s"),
])
def test_bad_arguments_are_refused(kwargs, match):
    if not SIMS:
        pytest.skip("no simulator installed")
    with pytest.raises(ValueError, match=match):
        run_cocotb(object(), "x", sim=SIMS[0], **kwargs)
