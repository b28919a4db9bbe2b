"""Verilog export: content-addressed, cached, atomic."""

from __future__ import annotations

import pytest
from amaranth.hdl import unsigned

from neonic.sim.harness import export_verilog
from tests.sim.harness.designs import MemInitiator, StreamPassthrough


def test_same_design_same_file_and_no_rewrite(tmp_path):
    first = export_verilog(StreamPassthrough(unsigned(8), depth=4), "pt", build_root=tmp_path)
    stamp = first.stat().st_mtime_ns
    again = export_verilog(StreamPassthrough(unsigned(8), depth=4), "pt", build_root=tmp_path)
    assert again == first and again.stat().st_mtime_ns == stamp
    assert first.parent.parent == tmp_path / "verilog"
    assert first.name == "pt.v" and first.parent.name.startswith("pt-")
    text = first.read_text()
    assert "module pt(" in text
    for port in ("i__valid", "i__ready", "i__payload", "o__payload", "clk", "rst"):
        assert port in text
    assert [p.name for p in first.parent.iterdir()] == ["pt.v"]  # no temporary files left


def test_different_parameters_get_different_directories(tmp_path):
    a = export_verilog(StreamPassthrough(unsigned(8), depth=4), "pt", build_root=tmp_path)
    b = export_verilog(StreamPassthrough(unsigned(8), depth=8), "pt", build_root=tmp_path)
    c = export_verilog(MemInitiator(data_bytes=16), "pt", build_root=tmp_path)
    assert len({a.parent, b.parent, c.parent}) == 3
    assert all(p.exists() for p in (a, b, c))


def test_a_corrupted_file_is_rewritten(tmp_path):
    path = export_verilog(StreamPassthrough(unsigned(8)), "pt", build_root=tmp_path)
    good = path.read_text()
    path.write_text("garbage")
    assert export_verilog(StreamPassthrough(unsigned(8)), "pt", build_root=tmp_path) == path
    assert path.read_text() == good


def test_build_dir_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("NEONIC_BUILD_DIR", str(tmp_path / "env-build"))
    path = export_verilog(StreamPassthrough(unsigned(8)), "pt")
    assert path.is_relative_to(tmp_path / "env-build" / "verilog")


@pytest.mark.parametrize("name", ["", "9lives", "has-dash", "sp ace", None])
def test_bad_module_names_are_refused(tmp_path, name):
    with pytest.raises(ValueError, match="name: expected a Verilog identifier"):
        export_verilog(object(), name, build_root=tmp_path)  # refused before conversion
