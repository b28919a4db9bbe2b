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


#: what may differ between two simulators' figures.json for one workload and seed
_PER_SIMULATOR = {"sim", "wall_s", "results_xml", "waveform", "sim_cycles_per_s"}


def _figures(path) -> dict:
    return json.loads((path / "figures.json").read_text())


def _same_run(a: dict, b: dict, *, cycle_slack: int = 0) -> None:
    """Two simulators' figures: the same fields, equal values (cycles within the slack)."""
    assert set(a) == set(b)
    for key in set(a) - _PER_SIMULATOR:
        if cycle_slack and key in ("cycles", "busy_cycles", "counters", "mem_beat_utilization",
                                   "timing_model_rel_error"):
            continue
        assert a[key] == b[key], key
    if cycle_slack:
        assert abs(a["cycles"] - b["cycles"]) <= cycle_slack


@pytest.mark.skipif(shutil.which("iverilog") is None, reason="needs Icarus Verilog")
def test_icarus_waveform_lands_in_the_results_folder(tmp_path, capsys):
    assert main(["rtl", "sim", "packetizer", "--sim", "icarus", "--out", str(tmp_path)]) == 0
    figures = _figures(tmp_path)
    assert figures["waveform"] == str(tmp_path / "packetizer.fst")
    assert (tmp_path / "packetizer.fst").stat().st_size > 0
    # the same messages as Amaranth's for the seed: the same frames, beats and cycles
    assert main(["rtl", "sim", "packetizer", "--no-vcd", "--out", str(tmp_path / "am")]) == 0
    _same_run(_figures(tmp_path / "am"), figures)


@pytest.mark.skipif(shutil.which("iverilog") is None, reason="needs Icarus Verilog")
@pytest.mark.parametrize("unit,args", [
    ("depacketizer", ["--param", "data_bytes=16"]),
    ("cache", ["--requests", "150"]),
])
def test_amaranth_and_icarus_run_one_workload_and_report_it_alike(unit, args, tmp_path, capsys):
    """One seed, one workload: the same requests or frames, the same figures (cycles too,
    since both runs use the same deterministic memory timing)."""
    for sim in ("amaranth", "icarus"):
        assert main(["rtl", "sim", unit, "--sim", sim, "--no-vcd", *args,
                     "--out", str(tmp_path / sim)]) == 0
    _same_run(_figures(tmp_path / "amaranth"), _figures(tmp_path / "icarus"))


MESSAGES = """
dim = 8

[[message]]
dest = 1
va = 0x4000
rkey = 9
imm = 77
payload = "000102030405060708090a0b0c0d0e0f101112"

[[message]]
dest = 0
va = 0x9000
rkey = 3
rows = 40          # 40 rows of 8 FP32 values: 1280 bytes, several frames at pmtu 512

[[message]]
dest = 1
va = 0x100
rkey = 9
values = [1.5, -2.0, 0.25]
"""


def test_your_own_messages_are_sent_and_captured(tmp_path, capsys):
    from scapy.contrib.roce import BTH
    from scapy.utils import rdpcap

    (tmp_path / "m.toml").write_text(MESSAGES)
    assert main(["rtl", "sim", "packetizer", "--no-vcd", "--param", "pmtu=512",
                 "--messages", str(tmp_path / "m.toml"), "--pcap", str(tmp_path / "m.pcap"),
                 "--out", str(tmp_path / "tx")]) == 0
    figures = _figures(tmp_path / "tx")
    assert figures["messages"] == 3 and figures["frames_match_reference"]
    packets = rdpcap(str(tmp_path / "m.pcap"))
    assert len(packets) == figures["frames"] == 1 + 3 + 1
    assert all(BTH in p for p in packets)
    # the first frame carries the hex payload (after its RETH and immediate)
    assert bytes.fromhex("000102030405060708090a0b0c0d0e0f101112") in bytes(packets[0])
    # the depacketizer takes the same file, dest as its QP
    assert main(["rtl", "sim", "depacketizer", "--no-vcd", "--param", "pmtu=512",
                 "--messages", str(tmp_path / "m.toml"), "--out", str(tmp_path / "rx")]) == 0
    rx = _figures(tmp_path / "rx")
    assert rx["completions"] == 3 and rx["memory_matches_reference"] and not rx["dropped"]
    assert rx["payload_bytes"] == 19 + 40 * 8 * 4 + 12


@pytest.mark.parametrize("text,where", [
    ("[[message]]\ndest = 0\nva = 1\n", "message[0].rkey: missing"),
    ("[[message]]\ndest = 9\nva = 1\nrkey = 1\nrows = 1\n", "message[0].dest"),
    ("[[message]]\ndest = 0\nva = 1\nrkey = 1\n", "expected exactly one of payload, values, rows"),
    ("[[message]]\ndest = 0\nva = 1\nrkey = 1\npayload = 'zz'\n", "message[0].payload: expected a hex"),
    ("[[message]]\ndest = 0\nva = 1\nrkey = 1\nrows = 2\nsize = 3\n", "size"),
    ("dim = 8\n", "expected one or more [[message]] tables"),
])
def test_a_bad_messages_file_names_the_message_and_field(text, where, tmp_path, capsys):
    (tmp_path / "m.toml").write_text(text)
    assert main(["rtl", "sim", "packetizer", "--no-vcd", "--messages", str(tmp_path / "m.toml"),
                 "--out", str(tmp_path / "o")]) == 2
    assert where in capsys.readouterr().err


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
