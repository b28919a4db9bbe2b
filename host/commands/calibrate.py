"""``neonic calibrate``: fit the SmartNIC timing models to RTL runs and write the calibration file.

Runs the SmartNIC RTL (``rtl/smartnic.py``; Verilator when installed, else Amaranth's simulator,
or ``--sim``) over a set of workloads, one NIC each, all in one co-simulation
(``sim.cosim.varied_traffic``): tables from a few dozen rows (the cache holds them: hit rates
near 1) to thousands (hit rates near 0), row strides of 1 and 2 beats, bags of 2 to 8 lookups.
Every other workload is held back; the parameters (``sim.calibration``) are fitted on the
rest, and the fit's relative error per unit is reported on both sets. The file is written to
``--out`` (default ``build/calibration/smartnic.json``, where ``neonic run --backend rtl`` and
``neonic bench smartnic`` look for it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "fit the SmartNIC timing models to RTL runs; write the calibration file"

#: The workloads (one NIC each): table rows, dim (FP32), lookups per bag, Zipf alpha.
WORKLOADS = [   # even positions fit, odd ones are held back: both sets span dims and hit rates
    {"rows": 32, "dim": 16, "pooling": 4, "alpha": 1.1},
    {"rows": 96, "dim": 16, "pooling": 3, "alpha": 1.05},
    {"rows": 4096, "dim": 16, "pooling": 4, "alpha": 0.8},
    {"rows": 2048, "dim": 32, "pooling": 5, "alpha": 0.9},
    {"rows": 512, "dim": 16, "pooling": 8, "alpha": 1.2},
    {"rows": 1024, "dim": 16, "pooling": 6, "alpha": 1.0},
    {"rows": 256, "dim": 32, "pooling": 6, "alpha": 1.15},
    {"rows": 64, "dim": 32, "pooling": 2, "alpha": 1.3},
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from neonic.host.commands import _args

    parser.add_argument("--sim", choices=("auto", "amaranth", "verilator", "icarus"), default="auto",
                        help="RTL simulator (default: Verilator when installed, else amaranth)")
    parser.add_argument("--out", type=_args.output_file,
                        help="calibration file (default ~/.cache/neonic/build/calibration/smartnic.json)")
    parser.add_argument("--seed", type=_args.seed, default=1, help="random seed (default 1)")
    parser.add_argument("--batch", type=_args.positive_int, default=2, help="samples per rank per workload (default 2)")
    parser.add_argument("--quick", action="store_true", help="four workloads, one sample each")


def calibrate(*, sim: str = "auto", seed: int = 1, batch: int = 2, workloads=None,
              progress=None):
    """Run the workloads, fit on every other one, evaluate on the rest.

    Returns ``(calibration, fit_errors, held_back_errors, report)``.
    """
    from neonic.rtl.smartnic import SmartNIC
    from neonic.sim.calibration import evaluate, fit
    from neonic.sim.cosim import DEFAULT_MEMORY_LATENCY, collect_samples, run_cosim, varied_traffic

    workloads = list(workloads or WORKLOADS)
    if len(workloads) < 2:
        raise ValueError(f"workloads: expected at least 2 (one to fit, one held back), got {len(workloads)}")
    nic = SmartNIC()
    traffic = varied_traffic(workloads, batch_per_gpu=batch, lanes=nic.lanes, seed=seed,
                             label=f"calibration ({len(workloads)} workloads)")
    report = run_cosim(traffic, sim=sim, nic=nic, seed=seed, progress=progress)
    if not report.buffers_match:
        raise AssertionError(f"calibration run: {report.mismatched_bytes} bytes of the destination "
                             f"buffers differ from the reference")
    samples = collect_samples(report, traffic, nic)
    fit_set, held = samples[0::2], samples[1::2]
    context = {"source": "neonic calibrate", "sim": report.sim, "seed": seed,
               "memory_latency": DEFAULT_MEMORY_LATENCY, "nic_params": nic.params,
               "workloads": workloads, "fit_workloads": list(range(0, len(workloads), 2)),
               "held_back_workloads": list(range(1, len(workloads), 2))}
    cal = fit(fit_set, context=context)
    fit_err, held_err = evaluate(cal, fit_set), evaluate(cal, held)
    cal.context["fit_error"] = fit_err
    cal.context["held_back_error"] = held_err
    return cal, fit_err, held_err, report


def main(args: argparse.Namespace) -> int:
    from neonic.sim.calibration import default_path, save

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    workloads = WORKLOADS[:4] if args.quick else WORKLOADS
    batch = 1 if args.quick else args.batch
    cal, fit_err, held_err, report = calibrate(sim=args.sim, seed=args.seed, batch=batch,
                                               workloads=workloads, progress=say)
    path = save(cal, args.out or default_path())
    print(f"RTL runs: {len(workloads)} workloads on {report.sim}, {report.rtl_cycles} cycles "
          f"in {report.wall_s:.1f} s; outputs equal the reference: "
          f"{'yes' if report.buffers_match else 'NO'}")
    print(f"{'parameter':<22}{'value':>10}")
    for name, value in cal.parameters().items():
        print(f"{name:<22}{value:>10.2f}")
    print(f"{'unit':<14}{'fit error':>11}{'held-back error':>17}")
    for unit in ("gather", "cache", "packetizer", "depacketizer", "max"):
        print(f"{unit:<14}{100 * fit_err.get(unit, 0):>10.2f}%{100 * held_err.get(unit, 0):>16.2f}%")
    print(f"calibration: {path}")
    return 0
