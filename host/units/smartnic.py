"""The SmartNIC top as the command line sees it (``neonic rtl export|sim smartnic``), and the
pieces ``neonic run --backend rtl`` uses: the small scenario it runs by default and the RTL NIC
backend with a progress printer.

``neonic rtl sim smartnic [--sim amaranth|icarus|verilator]`` co-simulates the tiniest cluster
(2 nodes x 2 GPUs, one table per rank, ``sim.cosim.synthetic_traffic``) on the top and writes
``figures.json``: the bit-exact check, the per-unit cycle counts beside the timing models' and
the simulation speed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from neonic.host.units import SimRequest, UnitEntry
from neonic.rtl.smartnic import SmartNIC

__all__ = ["UNIT", "DEFAULT_PARAMS", "parse_params", "build", "simulate", "rtl_scenario",
           "rtl_backend"]

DEFAULT_PARAMS: dict[str, Any] = dict(SmartNIC().params)
_STR_PARAMS = {"cache_policy", "cache_index"}


def parse_params(params: dict[str, str]) -> dict[str, Any]:
    """``--param`` strings to constructor arguments (``elem_types=fp32+fp16``)."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key not in DEFAULT_PARAMS:
            raise ValueError(f"--param {key}: unknown parameter; expected one of "
                             f"{', '.join(sorted(DEFAULT_PARAMS))}")
        if key == "elem_types":
            out[key] = tuple(v for v in value.replace(",", "+").split("+") if v)
        elif key in _STR_PARAMS:
            out[key] = value
        else:
            try:
                out[key] = int(value, 0)
            except ValueError:
                raise ValueError(f"{key}: expected an integer, got {value!r}") from None
    return out


def build(params: dict[str, str]) -> SmartNIC:
    """A :class:`SmartNIC` from ``--param`` strings (defaults for the rest)."""
    return SmartNIC(**parse_params(params))


def simulate(req: SimRequest) -> dict:
    """Co-simulate the tiniest cluster on the top; write ``figures.json``."""
    from neonic.sim.cosim import format_report, run_cosim, synthetic_traffic

    if req.vcd is not None:
        raise ValueError("--vcd: the SmartNIC co-simulation writes no waveform; use the cocotb "
                         "bench (tests/cocotb/tb_smartnic.py) with waves for one")
    nic = build(req.params)
    traffic = synthetic_traffic(world=4, gpus_per_node=2, batch_per_gpu=2, pooling=4,
                                lanes=nic.lanes, seed=req.seed)
    report = run_cosim(traffic, sim=req.sim, nic=nic, seed=req.seed,
                       workdir=req.out / "cosim" if req.sim != "amaranth" else None)
    figures = {"unit": "smartnic", **report.as_dict()}
    req.out.mkdir(parents=True, exist_ok=True)
    (req.out / "figures.json").write_text(json.dumps(figures, indent=2, default=str) + "\n")
    print(format_report(report))
    if not report.buffers_match:
        raise AssertionError(f"SmartNIC: {report.mismatched_bytes} bytes of the destination "
                             f"buffers differ from the reference")
    return figures


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
    build=build,
    simulate=simulate,
    waveform=False,
)
