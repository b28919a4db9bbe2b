"""``neonic rtl sim UNIT`` leaves a results folder a user can inspect: figures.json and, by
default, the unit's waveform (VCD from Amaranth, FST from Icarus), for every unit."""

from __future__ import annotations

import json
import shutil

import pytest

from neonic.host.cli import main
from neonic.host.units import discover


@pytest.mark.parametrize("unit", [
    pytest.param(u, marks=() if u == "packetizer" else pytest.mark.slow)
    for u in sorted(u for u, e in discover().items() if e.waveform)])
def test_every_unit_writes_a_waveform_by_default(unit, tmp_path, capsys):
    assert main(["rtl", "sim", unit, "--out", str(tmp_path)]) == 0
    figures = json.loads((tmp_path / "figures.json").read_text())
    wave = tmp_path / f"{unit}.vcd"
    assert figures["waveform"] == str(wave) and wave.stat().st_size > 1000
    assert wave.read_text(errors="replace").startswith("$")  # a VCD header
    assert figures["unit"] == unit and figures["sim"] == "amaranth" and figures["seed"] == 1


def test_no_vcd_records_none(tmp_path, capsys):
    assert main(["rtl", "sim", "packetizer", "--no-vcd", "--out", str(tmp_path)]) == 0
    assert not list(tmp_path.glob("*.vcd"))
    assert main(["rtl", "sim", "packetizer", "--no-vcd", "--vcd", str(tmp_path / "w.vcd")]) == 2


@pytest.mark.skipif(shutil.which("iverilog") is None, reason="needs Icarus Verilog")
def test_icarus_waveform_lands_in_the_results_folder(tmp_path, capsys):
    assert main(["rtl", "sim", "packetizer", "--sim", "icarus", "--out", str(tmp_path)]) == 0
    figures = json.loads((tmp_path / "figures.json").read_text())
    assert figures["waveform"] == str(tmp_path / "packetizer.fst")
    assert (tmp_path / "packetizer.fst").stat().st_size > 0
