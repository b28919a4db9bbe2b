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


def _counting_build(calls: list, depth: int):
    def build():
        calls.append(depth)
        return StreamPassthrough(unsigned(8), depth=depth)
    return build


def test_cached_export_elaborates_nothing_on_a_hit(tmp_path):
    from neonic.sim.harness import export_verilog_cached

    calls: list = []
    first = export_verilog_cached(_counting_build(calls, 4), "pt", {"depth": 4},
                                  build_root=tmp_path)
    again = export_verilog_cached(_counting_build(calls, 4), "pt", {"depth": 4},
                                  build_root=tmp_path)
    assert again == first and calls == [4]           # the second call converted nothing
    # the same design exported uncached lands in the same content-addressed file
    assert export_verilog(StreamPassthrough(unsigned(8), depth=4), "pt",
                          build_root=tmp_path) == first
    other = export_verilog_cached(_counting_build(calls, 8), "pt", {"depth": 8},
                                  build_root=tmp_path)
    assert other != first and calls == [4, 8]


def test_cached_export_misses_when_the_rtl_sources_change(tmp_path, monkeypatch):
    from neonic.sim.harness import verilog as v

    calls: list = []
    v.export_verilog_cached(_counting_build(calls, 4), "pt", {"depth": 4}, build_root=tmp_path)
    monkeypatch.setattr(v, "rtl_source_hash", lambda: "an edited rtl/")
    v.export_verilog_cached(_counting_build(calls, 4), "pt", {"depth": 4}, build_root=tmp_path)
    assert calls == [4, 4]
    # a lost export behind a cached key is rebuilt, not returned
    path = v.export_verilog_cached(_counting_build(calls, 4), "pt", {"depth": 4},
                                   build_root=tmp_path)
    path.unlink()
    assert v.export_verilog_cached(_counting_build(calls, 4), "pt", {"depth": 4},
                                   build_root=tmp_path).is_file()
    assert calls == [4, 4, 4]


def test_rtl_source_hash_covers_the_rtl_sources():
    from neonic.sim.harness.verilog import rtl_source_hash

    assert rtl_source_hash() == rtl_source_hash() and len(rtl_source_hash()) == 64


@pytest.mark.parametrize("kwargs, field", [({"name": "1bad"}, "name"),
                                           ({"params": {"x": object()}}, "params")])
def test_cached_export_refuses_bad_arguments(tmp_path, kwargs, field):
    from neonic.sim.harness import export_verilog_cached

    args = {"name": "pt", "params": {"depth": 4}, **kwargs}
    with pytest.raises(ValueError, match=field):
        export_verilog_cached(lambda: None, args["name"], args["params"], build_root=tmp_path)


@pytest.mark.parametrize("silenced", [False, True])
def test_parameters_only_silences_unused_elaboratable_warnings(monkeypatch, silenced):
    import gc
    import warnings

    from amaranth.hdl import UnusedElaboratable

    from neonic.rtl.smartnic import SmartNIC
    from neonic.sim.harness.verilog import parameters_only

    # Amaranth keeps the warning off until the first elaboration in a process; a command that
    # elaborated anything before (a bench) gets it for every component left unelaborated.
    monkeypatch.setattr(UnusedElaboratable, "_MustUse__silence", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        nic = SmartNIC()
        if silenced:
            parameters_only(nic)
        del nic
        gc.collect()
    unused = [w for w in caught if issubclass(w.category, UnusedElaboratable)]
    assert (unused == []) == silenced
