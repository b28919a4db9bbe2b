"""``neonic rtl export|sim depacketizer``: the registration; the driver is ``sim.units.depacketizer``."""

from __future__ import annotations

from neonic.host.units import UnitEntry
from neonic.sim.units import depacketizer as driver

UNIT = UnitEntry(
    name="depacketizer",
    summary="AlltoAll RoCEv2 RDMA WRITE depacketizer (validation, drop counters, memory writes)",
    build=driver.build,
    simulate=driver.simulate,
    options=(("pcap", "write the frames to this pcap file (Wireshark/scapy)"),
             ("messages", "a TOML file of your own messages to receive instead of the default "
                          "set (the packetizer's format; dest is the QP)")),
)
