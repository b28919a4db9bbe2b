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
    # the same default workload as Amaranth's for the seed: same messages, frames, beats
    assert main(["rtl", "sim", "packetizer", "--no-vcd", "--out", str(tmp_path / "am")]) == 0
    amaranth = json.loads((tmp_path / "am" / "figures.json").read_text())
    for key in ("messages", "frames", "beats", "params", "unit", "frames_match_reference"):
        assert figures[key] == amaranth[key], key


def test_pcaps_hold_each_nics_frames_sent_then_received(tmp_path):
    from scapy.utils import rdpcap

    from neonic.sim.cosim import write_pcaps
    from neonic.sim.reference.roce import Destination, Message, build_frames

    def frames(dest: int, n: int) -> list[bytes]:
        msg = Message(dest=0, va=0x1000, rkey=7, payload=bytes(range(256)) * n, imm=None)
        return [f.data for f in build_frames(msg, Destination(mac=0x0200_0000_0010 + dest,
                                                              ip=0x0A000100 + dest, qpn=3 + dest),
                                             local_mac=0x0200_0000_0001, local_ip=0x0A000001,
                                             psn=0, pmtu=256)]

    sent = [frames(1, 3), frames(0, 2)]
    received = [sent[1], sent[0]]
    paths = write_pcaps(tmp_path / "caps", sent, received)
    assert [p.name for p in paths] == ["nic0.pcap", "nic1.pcap"]
    for r, path in enumerate(paths):
        packets = rdpcap(str(path))
        assert [bytes(p) for p in packets] == sent[r] + received[r]
        assert [float(p.time) for p in packets] == sorted(float(p.time) for p in packets)


def test_pcap_needs_the_rtl_backend(tmp_path, capsys):
    assert main(["run", "--quiet", "--pcap", str(tmp_path / "caps")]) == 2
    assert "--pcap: only with --backend rtl" in capsys.readouterr().err


@pytest.mark.slow
def test_a_cluster_run_on_the_rtl_backend_captures_every_nic(tmp_path, capsys):
    from scapy.utils import rdpcap

    assert main(["run", "--backend", "rtl", "--sim", "amaranth", "--quiet", "--pcap",
                 str(tmp_path / "caps"), "--out", str(tmp_path / "out")]) == 0
    caps = sorted((tmp_path / "caps").glob("nic*.pcap"))
    assert len(caps) == 4 and all(len(rdpcap(str(c))) > 0 for c in caps)
