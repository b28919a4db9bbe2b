"""``neonic rtl export|sim packetizer``: the registration; the driver is ``sim.units.packetizer``."""

from __future__ import annotations

from neonic.host.units import UnitEntry
from neonic.sim.units import packetizer as driver

UNIT = UnitEntry(
    name="packetizer",
    summary="AlltoAll RoCEv2 RDMA WRITE packetizer (segmentation, PSN, ICRC, FP16/BF16, "
            "INT8 row-wise)",
    build=driver.build,
    simulate=driver.simulate,
    options=(("pcap", "write the frames to this pcap file (Wireshark/scapy)"),
             ("messages", "a TOML file of your own messages to send instead of the default set "
                          "([[message]] tables: dest, va, rkey, imm, payload|values|rows)")),
)
