"""Line rate that matches the port: the FPGA SmartNIC presets' packetizers frame at least the
NIC line rate of the system they sit in, and the cluster model and the experiments take that
rate from one figure (the packetizer's timing model)."""

from __future__ import annotations

import pytest

from neonic.host.nic_effects import nic_config
from neonic.host.systems import preset
from neonic.sim.network.config import load_preset
from neonic.sim.nic import framing_gbps, packetizer_time_s
from neonic.sim.timing.packetizer import estimate_tx, packet_cycles, payload_gbps


@pytest.mark.parametrize("name", ["smartnic", "smartnic-fpga"])
def test_fpga_smartnic_presets_frame_their_networks_line_rate(name):
    spec = preset(name)
    line = load_preset(spec.network).nic.bandwidth_gbps
    assert line == 200.0                              # ZionEX: one 200 Gb/s RoCE NIC per GPU
    cfg = nic_config(spec.nic)
    one = payload_gbps(cfg.datapath_bytes, cfg.pmtu, cfg.clock_hz)
    assert one < line <= framing_gbps(cfg) == cfg.packetizers * one


def test_payload_rate_is_the_timing_models_steady_state():
    """65 cycles per 4096 B packet at 64 B a beat (54 B header + 4 B ICRC), the RTL's figure
    (``tests/rtl/test_packetizer.py``), and the cycles the timing model adds per packet."""
    assert packet_cycles(64, 4096) == 65
    assert payload_gbps(64, 4096, 250e6) == pytest.approx(8 * 4096 * 250e6 / 65 / 1e9)
    longer = estimate_tx([5 * 4096], data_bytes=64, pmtu=4096).cycles
    shorter = estimate_tx([4 * 4096], data_bytes=64, pmtu=4096).cycles
    assert longer - shorter == packet_cycles(64, 4096)


def test_cluster_models_framing_time_follows_the_same_rate():
    """One packetizer framing a long message takes its bits over :func:`payload_gbps` (to the
    start-up and the first packet's RETH)."""
    cfg = nic_config(preset("smartnic").nic)
    n = 256 * 4096
    t = packetizer_time_s(cfg, [n])
    assert t == pytest.approx(8 * n / (payload_gbps(64, 4096, cfg.clock_hz) * 1e9), rel=0.01)


def test_bad_clock_is_refused():
    with pytest.raises(ValueError, match="clock_hz"):
        payload_gbps(64, 4096, 0.0)
