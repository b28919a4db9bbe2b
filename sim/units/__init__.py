"""Drivers of the hardware units: what runs a unit on a workload in a simulator.

One module per unit (``cache``, ``embedding``, ``packetizer``, ``depacketizer``, ``smartnic``)
holds what every driver of that unit shares: parsing ``--param`` strings into constructor
arguments, stimulus and workload generators, memories and scoreboards, episode runners in
Amaranth's simulator, the cocotb runs on the generated Verilog (benches in
``neonic.sim.cocotb``), measurement helpers, and ``simulate(SimRequest)``, the default run
behind ``neonic rtl sim UNIT``. The command line (``host.units``) only registers them; the
benches, the tests and the co-simulation (``sim.cosim``) call the same functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["SimRequest"]


@dataclass(frozen=True)
class SimRequest:
    """What ``neonic rtl sim UNIT`` asks of a unit.

    ``sim`` is "amaranth", "icarus" or "verilator"; ``vcd`` a waveform path or None; ``out`` the
    results folder the run writes into (figures JSON, waveforms, captures); ``params`` the
    unit's constructor parameters from ``--param k=v`` (strings, validated by the unit);
    ``extra`` unit-specific options (e.g. ``pcap``).
    """

    sim: str
    out: Path
    seed: int = 1
    vcd: Path | None = None
    params: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
