"""The outcome of a co-simulation: per NIC the RTL's and the model's cycles per unit, the
checks, the simulation speed; and its text form."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from neonic.rtl.smartnic import UNITS

__all__ = ["NICRun", "CosimReport", "format_report", "unit_window"]


@dataclass
class NICRun:
    """One NIC's figures: RTL cycles and model cycles per unit, counters, checks."""

    rank: int
    rtl: dict[str, int]
    model: dict[str, float]
    counters_tx: dict[str, int]
    counters_rx: dict[str, int]
    cache_ref: dict[str, float]
    frames_sent: int
    completions: int

    def rel_error(self) -> dict[str, float]:
        return {u: abs(self.model[u] - self.rtl[u]) / self.rtl[u]
                for u in self.model if self.rtl.get(u)}


@dataclass
class CosimReport:
    """The outcome of one co-simulated iteration."""

    sim: str
    label: str
    world: int
    gpus_per_node: int
    nics: list[NICRun]
    buffers_match: bool
    mismatched_bytes: int
    cache_misses_match: bool
    drops: int
    network_time_s: float | None
    rtl_cycles: int
    wall_s: float
    #: the simulation phases alone (no elaboration, Verilog export, build or simulator
    #: start-up): wall time and every simulated clock cycle of the top (resets included)
    sim_wall_s: float = 0.0
    sim_cycles: int = 0
    #: CPU time of the simulation loops where the runner measures it (Verilator's native loop):
    #: on a shared machine the wall time also counts other processes' turns
    sim_cpu_s: float | None = None
    calibration: dict[str, Any] = field(default_factory=dict)

    @property
    def max_rel_error(self) -> float:
        return max((e for n in self.nics for e in n.rel_error().values()), default=0.0)

    def unit_max_rel_error(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for n in self.nics:
            for u, e in n.rel_error().items():
                out[u] = max(out.get(u, 0.0), e)
        return out

    @property
    def rtl_cycles_per_s(self) -> float:
        """RTL cycles (every NIC's, both phases) per second of the whole run, per-run overhead
        (elaboration, export, build, start-up) included."""
        return self.rtl_cycles / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def sim_cycles_per_s(self) -> float:
        """Simulated clock cycles of the top per second of the simulation phases alone."""
        return self.sim_cycles / self.sim_wall_s if self.sim_wall_s > 0 else 0.0

    @property
    def sim_cycles_per_cpu_s(self) -> float | None:
        """Simulated clock cycles per CPU-second of the simulation loops (None where the
        runner does not measure CPU time)."""
        return self.sim_cycles / self.sim_cpu_s if self.sim_cpu_s else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "sim": self.sim, "label": self.label, "world": self.world,
            "gpus_per_node": self.gpus_per_node, "buffers_match": self.buffers_match,
            "mismatched_bytes": self.mismatched_bytes,
            "cache_misses_match": self.cache_misses_match, "frames_dropped": self.drops,
            "network_time_s": self.network_time_s, "rtl_cycles": self.rtl_cycles,
            "wall_s": self.wall_s, "rtl_cycles_per_s": self.rtl_cycles_per_s,
            "sim_wall_s": self.sim_wall_s, "sim_cycles": self.sim_cycles,
            "sim_cycles_per_s": self.sim_cycles_per_s,
            "sim_cpu_s": self.sim_cpu_s, "sim_cycles_per_cpu_s": self.sim_cycles_per_cpu_s,
            "max_rel_error": self.max_rel_error, "unit_max_rel_error": self.unit_max_rel_error(),
            "calibration": self.calibration,
            "nics": [{"rank": n.rank, "rtl": n.rtl, "model": n.model, "rel_error": n.rel_error(),
                      "cache_hits": n.counters_tx.get("cache_hits", 0)
                      + n.counters_tx.get("cache_merged", 0),
                      "cache_misses": n.counters_tx.get("cache_misses", 0),
                      "cache_ref": n.cache_ref, "frames_sent": n.frames_sent,
                      "completions": n.completions} for n in self.nics],
        }


def unit_window(counters: dict[str, int], unit: str) -> int:
    first, last = counters[f"{unit}_first"], counters[f"{unit}_last"]
    return last - first + 1 if last >= first and (last or first) else 0


def format_report(report: CosimReport) -> str:
    """The per-unit cycle counts, RTL and timing model side by side, and the checks."""
    lines = [f"co-simulation: {report.label} on {report.sim} ({report.world} NICs, "
             f"{report.rtl_cycles} RTL cycles in {report.wall_s:.1f} s)",
             f"{'nic':>4} {'unit':<13}{'rtl cycles':>11}{'model':>11}{'error':>9}"]
    for n in report.nics:
        err = n.rel_error()
        for u in UNITS:
            if u in n.model:
                lines.append(f"{n.rank:>4} {u:<13}{n.rtl[u]:>11}{n.model[u]:>11.0f}"
                             f"{100 * err[u]:>8.2f}%")
    lines.append(f"max relative error: {100 * report.max_rel_error:.2f}% "
                 f"(per unit: " + ", ".join(f"{u} {100 * e:.2f}%" for u, e in
                                            report.unit_max_rel_error().items()) + ")")
    lines.append(f"pooled embeddings at every destination equal the reference: "
                 f"{'yes' if report.buffers_match else 'NO'} "
                 f"({report.mismatched_bytes} bytes differ); cache misses equal the reference "
                 f"model: {'yes' if report.cache_misses_match else 'NO'}; frames dropped: "
                 f"{report.drops}")
    if report.sim_wall_s > 0:
        cpu = (f" ({report.sim_cycles_per_cpu_s:.0f} per CPU-second)"
               if report.sim_cycles_per_cpu_s else "")
        lines.append(f"simulation phases alone: {report.sim_cycles} cycles of the top in "
                     f"{report.sim_wall_s:.3f} s = {report.sim_cycles_per_s:.0f} cycles/s{cpu}")
    if report.network_time_s is not None:
        lines.append(f"network model: the AlltoAll of the frames' bytes takes "
                     f"{report.network_time_s * 1e6:.2f} us")
    return "\n".join(lines)
