"""``neonic rtl export|sim depacketizer``: the unit entry as the command line sees it."""

from __future__ import annotations

import json
import shutil

import pytest

import neonic.sim.units.depacketizer as unit
from neonic.host.cli import main
from neonic.host.units import SimRequest, get_unit

SMALL = {"data_bytes": "16", "pmtu": "512", "num_qps": "2"}


def test_export_writes_verilog_of_the_given_parameters(tmp_path):
    out = tmp_path / "dp.v"
    assert main(["rtl", "export", "depacketizer", "-o", str(out), "--param", "data_bytes=8",
                 "--param", "pmtu=256"]) == 0
    text = out.read_text()
    assert "module depacketizer" in text
    assert "frame__payload" in text


def test_export_goes_through_the_export_cache(tmp_path, monkeypatch):
    """A second ``rtl export`` with the same parameters and sources converts nothing: it is
    served from the cached export (a conversion would raise here); other parameters convert."""
    import neonic.sim.harness.verilog as verilog_cache

    monkeypatch.setenv(verilog_cache.BUILD_DIR_ENV, str(tmp_path / "build"))
    args = ["--param", "data_bytes=8", "--param", "pmtu=256"]
    first, second = tmp_path / "a.v", tmp_path / "b.v"
    assert main(["rtl", "export", "depacketizer", "-o", str(first), *args]) == 0

    def refuse(*a, **k):
        raise AssertionError("converted again")

    monkeypatch.setattr(verilog_cache, "export_verilog", refuse)
    assert main(["rtl", "export", "depacketizer", "-o", str(second), *args]) == 0
    assert second.read_text() == first.read_text()
    with pytest.raises(AssertionError, match="converted again"):
        main(["rtl", "export", "depacketizer", "-o", str(second), "--param", "data_bytes=16"])


def test_simulate_matches_the_reference_receiver(tmp_path, seed):
    pcap = tmp_path / "frames.pcap"
    req = SimRequest(sim="amaranth", out=tmp_path / "out", seed=seed, params=SMALL,
                     extra={"pcap": pcap}, vcd=tmp_path / "dp.vcd")
    figures = get_unit("depacketizer").simulate(req)
    assert figures["memory_matches_reference"] is True
    assert figures["completions_match_reference"] and figures["counters_match_reference"]
    # Two messages (one multi-packet, with a corrupted copy of its second packet) and one broken
    # frame per reason: every broken frame dropped for the reason it was built for.
    assert figures["dropped"] == {"icrc": 2, "udp_port": 1, "psn": 1, "qp": 1}
    assert figures["completions"] == 2
    assert figures["accepted"] == figures["frames"] - 5
    assert 0 < figures["bus_occupancy"] <= 1
    assert json.loads((tmp_path / "out" / "figures.json").read_text()) == figures
    from scapy.utils import rdpcap
    assert len(rdpcap(str(pcap))) == figures["frames"]
    assert (tmp_path / "dp.vcd").stat().st_size > 0


def test_simulate_raises_when_memory_differs(tmp_path, monkeypatch):
    real = unit.run_rx

    def lossy(*args, **kwargs):
        run = real(*args, **kwargs)
        run.memory.pop(min(run.memory))
        return run

    monkeypatch.setattr(unit, "run_rx", lossy)
    req = SimRequest(sim="amaranth", out=tmp_path, params=SMALL)
    with pytest.raises(AssertionError, match="memory_matches_reference"):
        unit.simulate(req)
    assert json.loads((tmp_path / "figures.json").read_text())["memory_matches_reference"] is False


def test_simulate_at_the_default_path_mtu(tmp_path):
    req = SimRequest(sim="amaranth", out=tmp_path, seed=1, params={"data_bytes": "64"})
    assert unit.simulate(req)["counters_match_reference"]


@pytest.mark.parametrize("key,value", [("pmtu", "300"), ("num_qps", "0"), ("data_bytes", "x"),
                                       ("lanes", "4")])
def test_bad_param_names_the_parameter(key, value):
    with pytest.raises(ValueError, match=key):
        unit.build({key: value})


@pytest.mark.skipif(shutil.which("iverilog") is None, reason="needs Icarus Verilog")
def test_icarus_takes_what_amaranth_takes(tmp_path):
    """Few QPs and a capture of the frames: the Verilog run gets the driver's own frames, so
    nothing is refused that the Amaranth run does."""
    req = SimRequest(sim="icarus", out=tmp_path, params={**SMALL},
                     extra={"pcap": tmp_path / "x.pcap"})
    figures = unit.simulate(req)
    assert figures["counters_match_reference"] and figures["memory_matches_reference"]
    assert (tmp_path / "x.pcap").stat().st_size > 0
