"""``neonic bench timing``: the IO shell, the cache key and the cached path (the flow itself
runs in the benchmark, minutes per unit, not here)."""

from __future__ import annotations

import json
import sys

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


def test_cache_key_names_the_seeds_and_the_router():
    spec = next(s for s in timing.UNITS if s.name == "fp_add")
    base = timing._cache_key(spec)
    assert base == timing._cache_key(spec, seeds=timing.PNR_SEEDS, router=timing.PNR_ROUTER)
    assert timing._cache_key(spec, seeds=(7,)) != base
    other = next(r for r in timing.ROUTERS if r != timing.PNR_ROUTER)
    assert timing._cache_key(spec, router=other) != base


def _fake_flow(monkeypatch, outcomes):
    """Synthesis and place and route replaced: ``outcomes`` maps a seed (router1) or a
    ``(router, seed)`` to its Fmax (or to None: that run did not finish)."""
    class Shell:
        in_bits, out_bits = 3, 2

    def synth(spec, work, timeout, progress):
        return Shell(), {"LUT4": 10, "CCU2C": 1, "TRELLIS_FF": 5, "DP16KD": 2}, True

    def pnr(work, seed, router, timeout, cpu_limit):
        fmax = outcomes.get((router, seed), outcomes.get(seed) if router == "router1" else None)
        if fmax is None:
            return {"seed": seed, "router": router, "error": "did not finish", "pnr_s": 9.0,
                    "pnr_cpu_s": 8.0}
        return {"seed": seed, "router": router, "fmax_mhz": fmax, "pnr_s": 1.0,
                "pnr_cpu_s": 1.0, "slices_used": seed, "critical_path": {"seed": seed}}

    monkeypatch.setattr(timing, "_synthesize", synth)
    monkeypatch.setattr(timing, "_place_and_route", pnr)


def test_the_best_seed_gives_the_figures_and_every_seed_is_recorded(tmp_path, monkeypatch):
    _fake_flow(monkeypatch, {1: 101.5, 2: None, 3: 118.2})
    spec = next(s for s in timing.UNITS if s.name == "fp_add")
    r = timing.measure_unit(spec, build_root=tmp_path, seeds=(1, 2, 3), router="router1")
    assert (r["fmax_mhz"], r["seed"], r["router"]) == (118.2, 3, "router1")
    assert r["critical_path"] == {"seed": 3} and r["slices_used"] == 3
    assert [a["seed"] for a in r["pnr_attempts"]] == [1, 2, 3]
    assert r["pnr_attempts"][1]["error"] == "did not finish"
    assert (r["luts"], r["ffs"], r["brams"], r["shell_ffs"]) == (12, 5, 2, 5)
    again = timing.measure_unit(spec, build_root=tmp_path, seeds=(1, 2, 3), router="router1")
    assert again["cached"] and again["fmax_mhz"] == 118.2


def test_a_unit_no_run_routes_is_an_error(tmp_path, monkeypatch):
    _fake_flow(monkeypatch, {1: None, 2: None})
    spec = next(s for s in timing.UNITS if s.name == "fp_add")
    with pytest.raises(RuntimeError,
                       match=r"fp_add finished for none of the seeds \[1, 2\] nor router2"):
        timing.measure_unit(spec, build_root=tmp_path, seeds=(1, 2))
    assert not list((tmp_path / "timing").glob("*.json"))


def test_the_fallback_router_runs_only_when_no_seed_finishes_and_is_named(tmp_path, monkeypatch):
    _fake_flow(monkeypatch, {1: None, 2: None, ("router2", 1): 99.4})
    spec = next(s for s in timing.UNITS if s.name == "fp_add")
    r = timing.measure_unit(spec, build_root=tmp_path, seeds=(1, 2))
    assert (r["fmax_mhz"], r["seed"], r["router"]) == (99.4, 1, "router2")
    assert [(a["router"], a["seed"]) for a in r["pnr_attempts"]] == [
        ("router1", 1), ("router1", 2), ("router2", 1)]
    _fake_flow(monkeypatch, {1: None, 2: 118.0, ("router2", 1): 140.0})
    r = timing.measure_unit(spec, build_root=tmp_path / "b", seeds=(1, 2))
    assert (r["fmax_mhz"], r["router"], len(r["pnr_attempts"])) == (118.0, "router1", 2)
    with pytest.raises(ValueError, match="fallback: expected None or a router other than"):
        timing.measure_unit(spec, build_root=tmp_path, fallback="router1")


def test_bad_flow_settings_name_the_field(tmp_path):
    spec = next(s for s in timing.UNITS if s.name == "fp_add")
    with pytest.raises(ValueError, match="seeds: expected one or more"):
        timing.measure_unit(spec, build_root=tmp_path, seeds=())
    with pytest.raises(ValueError, match="router: expected one of"):
        timing.measure_unit(spec, build_root=tmp_path, router="router3")


def test_a_tool_past_its_cpu_limit_is_stopped_and_says_so(tmp_path):
    spin = [sys.executable, "-c", "while True: pass"]
    with pytest.raises(timing.CPULimitExceeded, match=r"did not finish in 1 CPU-s"):
        timing._run(spin, tmp_path, 60, tmp_path / "log", cpu_limit=1)


def _bram_netlist(*, ff_lsr="0", ce_b=7, extra_load=False, cemux="CE"):
    """A DP16KD whose two used read-data bits (nets 10, 11) each feed one flip-flop (Q: nets
    20, 21; enables net 7 and ``ce_b``), clock net 3."""
    def ff(d, q, ce):
        return {"type": "TRELLIS_FF",
                "parameters": {"CEMUX": cemux, "CLKMUX": "CLK", "LSRMUX": "LSR",
                               "REGSET": "RESET"},
                "port_directions": {"CE": "input", "CLK": "input", "DI": "input",
                                    "LSR": "input", "Q": "output"},
                "connections": {"CE": [ce], "CLK": [3], "DI": [d], "LSR": [ff_lsr], "Q": [q]}}
    cells = {
        "ram": {"type": "DP16KD",
                "parameters": {"REGMODE_A": "NOREG", "REGMODE_B": "NOREG"},
                "port_directions": {"CLKA": "input", "CLKB": "input", "OCEA": "input",
                                    "OCEB": "input", "RSTA": "input", "RSTB": "input",
                                    "DOA0": "output", "DOB0": "output", "DOB1": "output"},
                "connections": {"CLKA": [3], "CLKB": [3], "OCEA": ["0"], "OCEB": ["1"],
                                "RSTA": ["0"], "RSTB": ["0"], "DOA0": [10], "DOB0": [11],
                                "DOB1": [12]}},
        "ff0": ff(10, 20, 7), "ff1": ff(11, 21, ce_b),
    }
    if extra_load:
        cells["lut"] = {"type": "LUT4", "parameters": {},
                        "port_directions": {"A": "input", "Z": "output"},
                        "connections": {"A": [11], "Z": [30]}}
    return {"modules": {"top": {"ports": {}, "cells": cells}}}


def test_registers_behind_a_block_ram_move_into_its_output_register():
    net = _bram_netlist()
    assert timing.absorb_bram_output_registers(net) == 2
    cells = net["modules"]["top"]["cells"]
    ram = cells["ram"]
    assert set(cells) == {"ram"}
    assert (ram["parameters"]["REGMODE_A"], ram["parameters"]["REGMODE_B"]) == ("OUTREG",
                                                                                 "OUTREG")
    # the registers' outputs now come from the block RAM, enabled by their enable
    assert ram["connections"]["DOA0"] == [20] and ram["connections"]["DOB0"] == [21]
    assert ram["connections"]["OCEA"] == [7] and ram["connections"]["OCEB"] == [7]
    assert ram["connections"]["DOB1"] == [12]          # unused bit untouched


@pytest.mark.parametrize("change", [{"ff_lsr": 5}, {"ce_b": 8}, {"extra_load": True},
                                    {"cemux": "INV"}])
def test_a_block_ram_whose_registers_differ_from_its_output_register_is_left_alone(change):
    """A reset in use, two different enables, a read bit with another load, or an inverted
    enable: the output register could not stand for the flip-flops, so nothing changes."""
    net = _bram_netlist(**change)
    before = json.dumps(net, sort_keys=True)
    assert timing.absorb_bram_output_registers(net) == 0
    assert json.dumps(net, sort_keys=True) == before


def test_the_cache_marks_only_its_block_ram_memories_collision_undefined():
    from neonic.rtl.cache import OnChipCache
    from neonic.rtl.streams import COLLISION_X_ATTR

    spec = next(s for s in timing.UNITS if s.name == "cache")
    dut = spec.build(dict(spec.params))
    assert isinstance(dut, OnChipCache)
    text = rtlil.convert(dut)
    assert text.count(f"attribute \\{COLLISION_X_ATTR} ") == 2   # the tag store, the lines


def _fake_flow_with_netlist(monkeypatch, outcomes, netlist_text='{"modules": {}}'):
    """As _fake_flow, with synthesis writing a netlist and place and route counting its runs."""
    _fake_flow(monkeypatch, outcomes)
    synth, pnr = timing._synthesize, timing._place_and_route
    runs = []

    def synth_writing(spec, work, timeout, progress):
        (work / "top.json").write_text(netlist_text)
        return synth(spec, work, timeout, progress)

    def pnr_counting(work, seed, router, timeout, cpu_limit):
        runs.append((seed, router))
        return pnr(work, seed, router, timeout, cpu_limit)

    monkeypatch.setattr(timing, "_synthesize", synth_writing)
    monkeypatch.setattr(timing, "_place_and_route", pnr_counting)
    return runs


def test_a_flow_change_that_leaves_the_netlist_reuses_its_place_and_route(tmp_path, monkeypatch):
    spec = next(s for s in timing.UNITS if s.name == "fp_add")
    runs = _fake_flow_with_netlist(monkeypatch, {1: 101.5, 2: 99.0, 3: 118.2})
    first = timing.measure_unit(spec, build_root=tmp_path, key="flow3")
    assert len(runs) == 3 and first["pnr_reused"] == 0
    again = timing.measure_unit(spec, build_root=tmp_path, key="flow4")      # new key, same netlist
    assert len(runs) == 3 and again["pnr_reused"] == 3 and not again["cached"]
    assert (again["fmax_mhz"], again["seed"]) == (118.2, 3) and again["pnr_cpu_s"] == 0
    assert all(a["reused"] for a in again["pnr_attempts"])
    runs_b = _fake_flow_with_netlist(monkeypatch, {1: 90.0, 2: 91.0, 3: 92.0}, '{"modules": {"x": {}}}')
    other = timing.measure_unit(spec, build_root=tmp_path, key="flow5")      # another netlist
    assert len(runs_b) == 3 and other["fmax_mhz"] == 92.0


def test_a_run_stopped_by_its_cpu_limit_is_reused_only_under_a_limit_no_higher(tmp_path, monkeypatch):
    spec = next(s for s in timing.UNITS if s.name == "fp_add")
    runs = _fake_flow_with_netlist(monkeypatch, {1: 100.0})
    stopped = {"seed": 2, "router": "router1", "error": "place and route did not finish in 500 CPU-s",
               "pnr_s": 600.0, "pnr_cpu_s": 500.0}
    netlist_dir = tmp_path / "timing" / "probe"
    netlist_dir.mkdir(parents=True)
    (netlist_dir / "top.json").write_text('{"modules": {}}')
    timing._record_attempt(tmp_path / "timing", timing._netlist_key(netlist_dir), stopped, 500.0)
    timing.measure_unit(spec, build_root=tmp_path, key="a", seeds=(1, 2), pnr_cpu_limit=500.0)
    assert runs == [(1, "router1")]                       # seed 2 known to stop at 500 CPU-s
    timing.measure_unit(spec, build_root=tmp_path, key="b", seeds=(1, 2), pnr_cpu_limit=1500.0)
    assert runs == [(1, "router1"), (2, "router1")]       # a higher limit runs it again
    assert timing._earlier_attempt(tmp_path / "timing", timing._netlist_key(netlist_dir), 1,
                                   "router1", 0.5) is None   # routed in 1 CPU-s: not within 0.5


def test_results_measured_before_reuse_existed_are_indexed_by_their_netlist(tmp_path, monkeypatch):
    spec = next(s for s in timing.UNITS if s.name == "fp_add")
    root = tmp_path / "timing"
    (root / "fp_add-old").mkdir(parents=True)
    (root / "fp_add-old" / "top.json").write_text('{"modules": {}}')
    (root / "fp_add-old.json").write_text(json.dumps({
        "pnr_cpu_limit_s": 1500, "pnr_attempts": [
            {"seed": 1, "router": "router1", "fmax_mhz": 130.0, "pnr_s": 3.0, "pnr_cpu_s": 2.0},
            {"seed": 2, "router": "router1", "fmax_mhz": 131.0, "pnr_s": 3.0, "pnr_cpu_s": 2.0}]}))
    runs = _fake_flow_with_netlist(monkeypatch, {1: 1.0, 2: 1.0, 3: 140.0})
    r = timing.measure_unit(spec, build_root=tmp_path, key="new")
    assert runs == [(3, "router1")] and r["pnr_reused"] == 2 and r["fmax_mhz"] == 140.0


def _dsp_netlist(*, in_lsr="0", in_cemux="1", in_srmode="LSR_OVER_CE", out_extra_load=False,
                 b_driver="ff", a_fanout=False, out_cemux="1", const_a="0"):
    """A MULT18X18D with A0 from flip-flop ``fa`` (input net 40, output 10), B0 from ``fb``
    (41 -> 11), A1 tied to ``const_a``, P0 and P1 into flip-flops ``fp0``/``fp1`` (Q nets
    20, 21), P2 unused; clock net 3."""
    def ff(d, q, *, lsr="0", cemux="1", ce="1", srmode="LSR_OVER_CE"):
        return {"type": "TRELLIS_FF",
                "parameters": {"CEMUX": cemux, "CLKMUX": "CLK", "LSRMUX": "LSR",
                               "REGSET": "RESET", "SRMODE": srmode},
                "port_directions": {"CE": "input", "CLK": "input", "DI": "input",
                                    "LSR": "input", "Q": "output"},
                "connections": {"CE": [ce], "CLK": [3], "DI": [d], "LSR": [lsr], "Q": [q]}}
    cells = {
        "dsp": {"type": "MULT18X18D",
                "parameters": {"REG_INPUTA_CLK": "NONE", "REG_INPUTB_CLK": "NONE",
                               "REG_OUTPUT_CLK": "NONE"},
                "port_directions": {"A0": "input", "A1": "input", "B0": "input",
                                    "C0": "input", "SOURCEA": "input", "SOURCEB": "input",
                                    "P0": "output", "P1": "output", "P2": "output"},
                "connections": {"A0": [10], "A1": [const_a], "B0": [11], "C0": ["0"],
                                "SOURCEA": ["0"], "SOURCEB": ["0"],
                                "P0": [12], "P1": [13], "P2": [14]}},
        "fa": ff(40, 10, lsr=in_lsr, cemux=in_cemux, ce=8, srmode=in_srmode), "fp0": ff(12, 20, cemux=out_cemux, ce=7),
        "fp1": ff(13, 21, cemux=out_cemux, ce=7),
    }
    if b_driver == "ff":
        cells["fb"] = ff(41, 11)
    else:
        cells["fb"] = {"type": "LUT4", "parameters": {},
                       "port_directions": {"A": "input", "Z": "output"},
                       "connections": {"A": [41], "Z": [11]}}
    if a_fanout:
        cells["other"] = {"type": "LUT4", "parameters": {},
                          "port_directions": {"A": "input", "Z": "output"},
                          "connections": {"A": [10], "Z": [31]}}
    if out_extra_load:
        cells["lut"] = {"type": "LUT4", "parameters": {},
                        "port_directions": {"A": "input", "Z": "output"},
                        "connections": {"A": [13], "Z": [30]}}
    return {"modules": {"top": {"ports": {}, "cells": cells}}}


def test_registers_around_a_dsp_move_into_its_input_and_output_registers():
    net = _dsp_netlist(out_cemux="CE")
    assert timing.absorb_dsp_registers(net) == 4
    cells = net["modules"]["top"]["cells"]
    assert set(cells) == {"dsp"}
    par, con = cells["dsp"]["parameters"], cells["dsp"]["connections"]
    # the input registers take the flip-flops' inputs, the output register drives their
    # outputs, all on CLK0 with the reset unused; each enable has its own CE
    assert (con["A0"], con["A1"], con["B0"]) == ([40], ["0"], [41])
    assert (con["P0"], con["P1"], con["P2"]) == ([20], [21], [14])
    assert {par[f"REG_{g}_CLK"] for g in ("INPUTA", "INPUTB", "OUTPUT")} == {"CLK0"}
    assert con["CLK0"] == [3] and con["RST0"] == ["0"]
    assert con[par["REG_INPUTA_CE"]] == ["1"] and con[par["REG_OUTPUT_CE"]] == [7]
    assert par["REG_INPUTA_CE"] == par["REG_INPUTB_CE"] != par["REG_OUTPUT_CE"]


def test_an_input_flip_flop_with_other_loads_is_copied_into_the_dsp_and_kept():
    net = _dsp_netlist(a_fanout=True)
    assert timing.absorb_dsp_registers(net) == 3          # fb, fp0, fp1
    cells = net["modules"]["top"]["cells"]
    assert "fa" in cells and cells["dsp"]["connections"]["A0"] == [40]
    assert cells["other"]["connections"]["A"] == [10]      # still the flip-flop's output


def test_a_synchronous_clear_of_an_input_flip_flop_becomes_a_lut_before_the_dsp():
    net = _dsp_netlist(in_lsr=5)
    assert timing.absorb_dsp_registers(net) == 4
    cells = net["modules"]["top"]["cells"]
    lut = next(c for c in cells.values() if c["type"] == "LUT4")
    # Z = A & ~B: the flip-flop's input, cleared when its clear is high
    assert lut["connections"]["A"] == [40] and lut["connections"]["B"] == [5]
    assert [int(lut["parameters"]["INIT"][15 - i]) for i in range(4)] == [0, 1, 0, 0]
    assert cells["dsp"]["connections"]["A0"] == lut["connections"]["Z"]
    assert cells["dsp"]["connections"]["B0"] == [41]


@pytest.mark.parametrize("change", [{"in_lsr": 5, "in_cemux": "CE"},
                                    {"in_lsr": 5, "in_srmode": "ASYNC"},
                                    {"b_driver": "lut"}, {"const_a": "1"}])
def test_dsp_inputs_are_absorbed_only_both_and_only_from_plain_flip_flops(change):
    """A clear beside an enable (the clear wins over the enable in the flip-flop) or an
    asynchronous one, an input from logic, or an input tied high (the input register would
    read 0 until the first edge): the inputs stay; the output registers still move."""
    net = _dsp_netlist(**change)
    assert timing.absorb_dsp_registers(net) == 2
    cells = net["modules"]["top"]["cells"]
    par = cells["dsp"]["parameters"]
    assert par["REG_INPUTA_CLK"] == par["REG_INPUTB_CLK"] == "NONE"
    assert par["REG_OUTPUT_CLK"] == "CLK0" and "fa" in cells and "fb" in cells


def test_a_dsp_output_with_another_load_keeps_its_flip_flops():
    net = _dsp_netlist(out_extra_load=True)
    assert timing.absorb_dsp_registers(net) == 2          # fa, fb
    cells = net["modules"]["top"]["cells"]
    assert cells["dsp"]["parameters"]["REG_OUTPUT_CLK"] == "NONE"
    assert "fp0" in cells and "fp1" in cells


def test_a_dsp_with_nothing_to_absorb_is_left_alone():
    net = _dsp_netlist(out_extra_load=True, b_driver="lut")
    before = json.dumps(net, sort_keys=True)
    assert timing.absorb_dsp_registers(net) == 0
    assert json.dumps(net, sort_keys=True) == before


def test_the_gather_marks_its_two_accumulator_copies_collision_undefined():
    """Each lane's reducer's and drain's copy of the accumulator (every lane holds its own,
    ``rtl.embedding``), one read port each (the flow asserts one write and one read port per
    marked memory)."""
    from neonic.rtl.streams import COLLISION_X_ATTR

    spec = next(s for s in timing.UNITS if s.name == "gather")
    for params, lanes in ((spec.params, 4), (spec.preset_params, 16)):   # the slice, the preset
        text = rtlil.convert(spec.build(dict(params)))
        assert text.count(f"attribute \\{COLLISION_X_ATTR} ") == 2 * params["lanes"] == 2 * lanes


def test_the_dsp_pass_can_take_the_output_registers_only():
    net = _dsp_netlist()
    assert timing.absorb_dsp_registers(net, inputs=False) == 2
    cells = net["modules"]["top"]["cells"]
    par = cells["dsp"]["parameters"]
    assert par["REG_INPUTA_CLK"] == par["REG_INPUTB_CLK"] == "NONE"
    assert par["REG_OUTPUT_CLK"] == "CLK0" and {"fa", "fb"} <= set(cells)


def test_a_netlist_from_another_checkout_has_the_same_place_and_route_key(tmp_path):
    """Source locations (yosys's src, cell_src, module_src) say where a cell came from, not what
    is placed: the same design synthesised from another path or line reuses its runs."""
    def netlist(path, line, init="0"):
        return {"modules": {"top": {
            "attributes": {"top": "1", "src": f"{path}/timing.py:{line}"},
            "cells": {"ff": {"type": "TRELLIS_FF", "parameters": {"REGSET": "RESET"},
                             "attributes": {"src": f"{path}/rtl/cache.py:12"}},
                      "scope": {"type": "$scopeinfo", "attributes": {
                          "cell_src": f"{path}/timing.py:{line}", "module_src": f"{path}/rtl/cache.py:9",
                          "module": "top.dut"}}},
            "netnames": {"q": {"bits": [2], "attributes": {"src": f"{path}/rtl/cache.py:13", "init": init}}}}}}
    keys = []
    for i, (path, line, init) in enumerate([("/a", 247, "0"), ("/b/c", 253, "0"), ("/a", 247, "1")]):
        work = tmp_path / str(i)
        work.mkdir()
        (work / "top.json").write_text(json.dumps(netlist(path, line, init)))
        keys.append(timing._netlist_key(work))
    assert keys[0] == keys[1] != keys[2]        # an attribute that is not a source location counts
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "top.json").write_text("{not json")
    assert timing._netlist_key(tmp_path / "bad") is None


def test_the_gather_is_placed_as_a_slice_of_the_presets_lanes_and_synthesised_at_them():
    from neonic.host.nic_effects import nic_config
    from neonic.host.systems import preset_dict, system_from_dict

    nic = nic_config(system_from_dict(preset_dict("smartnic")).nic)
    gather = next(s for s in timing.UNITS if s.name == "gather")
    # placed and routed: 16 B of the preset's datapath, 4 FP32 lanes (the preset's 16 did not
    # route on the part, session 20)
    assert timing.NIC_GATHER_PLACED_BYTES == 16
    assert (gather.params["data_bytes"], gather.params["lanes"]) == (16, 4)
    assert gather.params == timing.nic_gather_params(data_bytes=timing.NIC_GATHER_PLACED_BYTES)
    # synthesised beside it: the preset's datapath and lanes
    assert gather.preset_params == timing.nic_gather_params()
    assert (gather.preset_params["data_bytes"], gather.preset_params["lanes"]) == (
        nic.datapath_bytes, nic.lanes) == (64, 16)
    # the slice differs from the preset in its datapath and lanes only
    assert {k for k in gather.params if gather.params[k] != gather.preset_params[k]} == {
        "data_bytes", "lanes"}
    assert timing.nic_gather_params(data_bytes=8)["lanes"] == 2
    for bad in (0, 6, 128, 16.0, True):
        with pytest.raises(ValueError, match=r"^data_bytes: expected a multiple of 4"):
            timing.nic_gather_params(data_bytes=bad)


def test_the_gather_slice_runs_three_seeds_with_router2_within_the_flows_limit():
    gather = next(s for s in timing.UNITS if s.name == "gather")
    assert (gather.seeds, gather.router, gather.fallback) == ((1, 2, 3), "router2", None)
    assert gather.pnr_cpu_limit_s == timing.PNR_CPU_LIMIT_S == 1500
    assert "not the preset's" in gather.note and "81%" in gather.note


def test_bench_timing_reports_the_gathers_preset_synthesis_beside_its_slice(tmp_path,
                                                                         monkeypatch):
    from neonic.host.bench import BenchContext

    gather = next(s for s in timing.UNITS if s.name == "gather")
    monkeypatch.setattr(timing, "UNITS", (gather,))
    monkeypatch.setenv("NEONIC_BUILD_DIR", str(tmp_path))
    _fake_flow(monkeypatch, {("router2", 1): 110.0, ("router2", 2): 121.5,
                             ("router2", 3): None})
    seen = []

    class Shell:
        in_bits, out_bits = 3, 2

    def synth(spec, work, timeout, progress):
        seen.append((spec.params["data_bytes"], spec.params["lanes"]))
        lanes = spec.params["lanes"]
        return Shell(), {"LUT4": 1000 * lanes, "TRELLIS_FF": 900 * lanes, "DP16KD": 32,
                         "MULT18X18D": 6 * lanes}, True

    monkeypatch.setattr(timing, "_synthesize", synth)
    out = timing.run(BenchContext(stream=sys.stderr))
    assert seen == [(16, 4), (64, 16)]                 # the slice placed, the preset's synthesised
    assert out["params"]["gather"]["lanes"] == 4 and out["fmax_mhz"]["gather"] == 121.5
    assert (out["seed"]["gather"], out["router_of"]["gather"]) == (2, "router2")
    assert out["flow_of"]["gather"]["seeds"] == [1, 2, 3]
    preset = out["preset_synth"]["gather"]
    assert (preset["params"]["data_bytes"], preset["params"]["lanes"]) == (64, 16)
    assert (preset["luts"], preset["ffs"], preset["dsps"]) == (16000, 14400, 96)
    assert json.loads(json.dumps(out))["preset_synth"]["gather"] == preset


def test_a_units_own_flow_settings_make_its_key_and_its_runs(tmp_path, monkeypatch):
    spec = next(s for s in timing.UNITS if s.name == "fp_add")
    mine = timing.UnitSpec(spec.name, spec.params, spec.build, spec.module, seeds=(4,),
                           router="router2", pnr_cpu_limit_s=99, fallback=None)
    assert timing._cache_key(mine) == timing._cache_key(spec, seeds=(4,), router="router2",
                                                        cpu_limit=99)
    assert timing._cache_key(mine) != timing._cache_key(spec)
    _fake_flow(monkeypatch, {("router2", 4): 120.0, ("router2", 1): 130.0})
    r = timing.measure_unit(mine, build_root=tmp_path)
    assert (r["fmax_mhz"], r["seed"], r["router"], r["pnr_cpu_limit_s"]) == (120.0, 4,
                                                                             "router2", 99)
    _fake_flow(monkeypatch, {})
    with pytest.raises(RuntimeError, match=r"none of the seeds \[4\]: did not finish$"):
        timing.measure_unit(mine, build_root=tmp_path / "b")        # no fallback


def test_a_unit_measured_below_its_presets_size_reports_the_presets_synthesis(tmp_path,
                                                                              monkeypatch):
    spec = next(s for s in timing.UNITS if s.name == "fp_add")
    small = timing.UnitSpec(spec.name, {"latency": 2}, spec.build, spec.module,
                            preset_params={"latency": 9})
    assert timing._cache_key(small) != timing._cache_key(
        timing.UnitSpec(spec.name, {"latency": 2}, spec.build, spec.module))
    _fake_flow(monkeypatch, {1: 120.0})
    seen = []

    class Shell:
        in_bits, out_bits = 3, 2

    def synth(spec, work, timeout, progress):
        seen.append(spec.params)
        return Shell(), {"LUT4": 10, "TRELLIS_FF": 5, "DP16KD": 200 if spec.params["latency"] == 9
                      else 2}, True

    monkeypatch.setattr(timing, "_synthesize", synth)
    r = timing.measure_unit(small, build_root=tmp_path, seeds=(1,), fallback=None,
                            synth_timeout=10)
    assert seen == [{"latency": 2}, {"latency": 9}]           # the measured size, then the preset's
    assert r["brams"] == 2
    assert r["preset_synth"]["brams"] == 200 and r["preset_synth"]["params"] == {"latency": 9}
    assert r["preset_synth"]["brams_of_part"] == timing.PART_DP16KD == 208
    _fake_flow(monkeypatch, {})                     # nothing routes: the preset's size still says
    monkeypatch.setattr(timing, "_synthesize", synth)
    with pytest.raises(RuntimeError, match=r"synthesis only: 10 LUTs, 200 of 208 DP16KD\)$"):
        timing.measure_unit(small, build_root=tmp_path / "b", seeds=(1,), fallback=None)


def test_cache_nic_is_the_presets_organisation_placed_at_fewer_sets_and_synthesised_at_its():
    spec = next(s for s in timing.UNITS if s.name == "cache_nic")
    preset = timing.nic_cache_params()
    assert spec.preset_params == preset and preset["sets"] == 16384 and preset["ways"] == 8
    assert spec.params == {**preset, "sets": timing.NIC_CACHE_PLACED_SETS}
    assert preset["compare_stages"] == 2


def _lsr_netlist():
    """Flip-flops (D net 100 + i, Q net 200 + i, clock net 3) on set/reset nets: ``lone`` alone
    on net 5; ``set_inv`` alone on net 6, set to one while net 6 is low; ``wide0..7`` on net
    7 (eight); ``with_ce`` alone on net 8 with an enable; ``async`` alone on net 9,
    asynchronous; ``plain`` without set/reset."""
    def ff(i, lsr, *, regset="RESET", lsrmux="LSR", cemux="1", ce="1", srmode="LSR_OVER_CE"):
        return {"type": "TRELLIS_FF",
                "parameters": {"CEMUX": cemux, "CLKMUX": "CLK", "LSRMUX": lsrmux,
                               "REGSET": regset, "SRMODE": srmode},
                "port_directions": {"CE": "input", "CLK": "input", "DI": "input",
                                    "LSR": "input", "Q": "output"},
                "connections": {"CE": [ce], "CLK": [3], "DI": [100 + i], "LSR": [lsr],
                                "Q": [200 + i]}}
    cells = {"lone": ff(0, 5), "set_inv": ff(1, 6, regset="SET", lsrmux="INV"),
             "with_ce": ff(2, 8, cemux="CE", ce=11), "async": ff(3, 9, srmode="ASYNC"),
             "plain": ff(4, "0")}
    cells.update({f"wide{i}": ff(10 + i, 7) for i in range(8)})
    return {"modules": {"top": {"ports": {}, "cells": cells}}}


def test_flip_flops_of_a_small_set_reset_net_get_it_as_a_lut_with_the_same_next_state():
    net = _lsr_netlist()
    before = json.loads(json.dumps(net))
    assert timing.unmap_small_lsr_sets(net, 8) == 3                  # lone, set_inv, with_ce
    cells, old_cells = net["modules"]["top"]["cells"], before["modules"]["top"]["cells"]
    for name in ("lone", "set_inv", "with_ce"):
        ff, lut, old = cells[name], cells[name + "$lsr_force"], old_cells[name]
        oc, op = old["connections"], old["parameters"]
        enabled = op["CEMUX"] == "CE"
        assert lut["connections"]["A"] == oc["DI"] and lut["connections"]["B"] == oc["LSR"]
        assert lut["connections"]["C"] == (oc["CE"] if enabled else ["0"])
        assert lut["connections"]["D"] == (oc["Q"] if enabled else ["0"])
        assert ff["connections"]["DI"] == lut["connections"]["Z"]
        assert ff["connections"]["LSR"] == ["0"] and ff["parameters"]["LSRMUX"] == "LSR"
        assert ff["parameters"]["CEMUX"].strip() == "1"
        assert ff["connections"].get("CE") == (None if enabled else oc["CE"])
        assert ff["parameters"]["REGSET"] == op["REGSET"]             # its initial value
        regset, inverted = int(op["REGSET"] == "SET"), op["LSRMUX"] == "INV"
        init = lut["parameters"]["INIT"]
        for i in range(16):
            d, lsr, ce, q = i & 1, (i >> 1) & 1, (i >> 2) & 1, (i >> 3) & 1
            if not enabled and (ce or q):
                continue                                               # C, D tied low
            # the flip-flop before: the set/reset value while LSR is active (over the
            # enable), else D where enabled, else Q
            expected = regset if (lsr ^ inverted) else (d if (ce or not enabled) else q)
            assert int(init[15 - i]) == expected, (name, d, lsr, ce, q)
    # a net of eight, an asynchronous set/reset, none: as they were
    for name in ["async", "plain"] + [f"wide{i}" for i in range(8)]:
        assert cells[name] == old_cells[name]
    new_nets = [cells[n + "$lsr_force"]["connections"]["Z"][0]
                for n in ("lone", "set_inv", "with_ce")]
    assert len(set(new_nets)) == 3 and min(new_nets) > 217             # fresh nets


def test_small_set_reset_nets_are_left_alone_unless_asked():
    net = _lsr_netlist()
    before = json.loads(json.dumps(net))
    assert timing.unmap_small_lsr_sets(net, 0) == 0
    assert timing.unmap_small_lsr_sets(net, 1) == 0
    assert net == before
    assert timing.unmap_small_lsr_sets(net, 9) == 11                  # the eight of net 7 too


def test_the_gather_gets_its_small_set_reset_nets_as_luts_and_its_key_says_so():
    from dataclasses import replace

    gather = next(s for s in timing.UNITS if s.name == "gather")
    assert gather.lsr_min_ffs == 64
    assert timing._cache_key(gather) != timing._cache_key(replace(gather, lsr_min_ffs=0))
    # the other units keep the keys they had (the setting enters a key only when used)
    assert all(s.lsr_min_ffs == 0 for s in timing.UNITS if s.name != "gather")
