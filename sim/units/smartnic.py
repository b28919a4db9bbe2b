"""Driver of the SmartNIC top (``neonic rtl sim smartnic``): parameters from ``--param``
strings, and the default run, a co-simulation of the tiniest cluster (2 nodes x 2 GPUs, one
table per rank, ``sim.cosim.synthetic_traffic``) on the top that writes ``figures.json``: the
bit-exact check, the per-unit cycle counts beside the timing models' and the simulation speed.
"""

from __future__ import annotations

import json
from typing import Any

from amaranth.hdl import Elaboratable

from neonic.rtl.smartnic import SmartNIC
from neonic.sim.units import SimRequest

__all__ = ["DEFAULT_PARAMS", "parse_params", "build", "simulate"]

def _default_params() -> dict[str, Any]:
    """The top's constructor defaults, read off an instance that is never elaborated (each
    part marked so, or Amaranth warns at exit that it was created but never used)."""
    nic = SmartNIC()
    for part in (nic, *vars(nic).values()):
        if isinstance(part, Elaboratable):
            part._MustUse__silence = True
    return dict(nic.params)


DEFAULT_PARAMS: dict[str, Any] = _default_params()
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
                         "bench (neonic.sim.cocotb.tb_smartnic) with waves for one")
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
