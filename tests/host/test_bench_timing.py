"""``neonic bench timing``: the IO shell, the cache key and the cached path (the flow itself
runs in the benchmark, minutes per unit, not here)."""

from __future__ import annotations

import json

import pytest
from amaranth.back import rtlil

from neonic.host.bench import timing
from neonic.rtl.fp import FPAdd32


def test_shell_registers_every_port_behind_three_pins():
    dut = FPAdd32(latency=2)
    shell = timing.IOShell(dut)
    assert (shell.in_bits, shell.out_bits) == (32 + 32 + 1, 32)
    text = rtlil.convert(shell, name="top", ports=[shell.sin, shell.load, shell.sout])
    top = text[text.index("module \\top"):]
    top = top[:top.index("\nend")]
    wires = [line.split()[-1] for line in top.splitlines() if line.strip().startswith("wire ")
             and (" input " in line or " output " in line)]
    assert sorted(wires) == ["\\clk", "\\load", "\\rst", "\\sin", "\\sout"]


def test_cache_key_follows_the_rtl_a_unit_imports():
    fp_add = next(s for s in timing.UNITS if s.name == "fp_add")
    gather = next(s for s in timing.UNITS if s.name == "gather")
    assert [p.name for p in timing._rtl_sources("fp")] == ["fp.py"]
    names = {p.name for p in timing._rtl_sources("embedding")}
    assert {"embedding.py", "fp.py", "streams.py"} <= names
    assert timing._cache_key(fp_add) == timing._cache_key(fp_add)
    assert timing._cache_key(fp_add) != timing._cache_key(gather)


def test_every_unit_of_the_issue_is_measured():
    assert {s.name for s in timing.UNITS} == {"fp_add", "fp_mul", "gather", "cache", "cache_nic",
                                              "packetizer", "depacketizer"}
    for spec in timing.UNITS:
        spec.build(dict(spec.params))._MustUse__used = True      # parameters are valid


def test_cached_result_is_returned_without_running_the_flow(tmp_path, monkeypatch):
    spec = next(s for s in timing.UNITS if s.name == "fp_add")
    key = timing._cache_key(spec)
    (tmp_path / "timing").mkdir()
    (tmp_path / "timing" / f"fp_add-{key}.json").write_text(json.dumps({"fmax_mhz": 123.4}))

    def no_tools(*args, **kwargs):
        raise AssertionError("the flow ran although the result was cached")

    monkeypatch.setattr(timing, "_run", no_tools)
    result = timing.measure_unit(spec, build_root=tmp_path)
    assert result == {"fmax_mhz": 123.4, "cached": True}


def test_yosys_cell_counts_are_read_from_stat_json():
    stat = {"design": {"num_cells_by_type": {"LUT4": 10, "CCU2C": 3, "TRELLIS_FF": 7}}}
    assert timing._yosys_cells(stat) == {"LUT4": 10, "CCU2C": 3, "TRELLIS_FF": 7}
    legacy = {"modules": {"\\top": {"num_cells_by_type": {"LUT4": 4}},
                          "\\sub": {"num_cells_by_type": {"LUT4": 1, "DP16KD": 2}}}}
    assert timing._yosys_cells(legacy) == {"LUT4": 5, "DP16KD": 2}


def test_a_failing_tool_names_itself(tmp_path):
    with pytest.raises(RuntimeError, match=r"^false failed \(exit 1\)"):
        timing._run(["false"], tmp_path, 10, tmp_path / "log")
