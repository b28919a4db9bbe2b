"""The SmartNIC top as the command line sees it (``neonic rtl export|sim smartnic``: the driver
is ``sim.units.smartnic``), and the pieces ``neonic run --backend rtl`` uses: the small scenario
it runs by default and the RTL NIC backend with a progress printer.
"""

from __future__ import annotations

from pathlib import Path

from neonic.host.units import UnitEntry
from neonic.sim.units import smartnic as driver

__all__ = ["UNIT", "rtl_scenario", "rtl_backend"]


def rtl_scenario(seed: int = 1):
    """The small scenario ``neonic run --backend rtl`` runs without a CONFIG or --preset: the
    packaged ``rtl-small`` (2 nodes x 2 GPUs on the SmartNIC system, 16 small FP32 tables)."""
    from neonic.host.cluster import scenario_preset

    return scenario_preset("rtl-small", scenario={"seed": seed})


def rtl_backend(scenario, *, sim: str = "auto", calibration: Path | str | None = None,
                console=None, pcap_dir: Path | str | None = None):
    """``sim.cosim.RTLNICBackend`` for ``scenario`` (a SmartNIC system), with the calibration
    file given, else the one ``sim.calibration.find_calibration`` finds, else the defaults."""
    from neonic.sim.calibration import find_calibration, load
    from neonic.sim.cosim import RTLNICBackend

    if scenario.system.embeddings != "nic":
        raise ValueError(f"--backend rtl: system {scenario.system.name!r} has no SmartNICs "
                         f"(system.embeddings = {scenario.system.embeddings!r}; expected \"nic\")")
    cal = load(calibration) if calibration else find_calibration()

    def say(message: str) -> None:
        if console is not None:
            console.log(message)
    return RTLNICBackend(sim=sim, calibration=cal, progress=say, pcap_dir=pcap_dir)


UNIT = UnitEntry(
    name="smartnic",
    summary="SmartNIC top: cache + gather/pool + RoCEv2 packetizer/depacketizer, co-simulated",
    build=driver.build,
    simulate=driver.simulate,
    waveform=False,
)
