"""``neonic run [CONFIG.toml | --preset NAME] [--plan PLAN.json] [--out DIR]``: one scenario on the cluster runtime.

With no argument it runs the packaged default scenario (Model-A scaled down on 2 ZionEX nodes x
8 GPUs; seconds on 2 cores). Shows progress while it runs, prints a summary table and writes the
results folder (``results/<scenario>-<timestamp>/`` unless ``--out`` is given). The hardware
units' own demos are ``neonic rtl sim UNIT``.

``--backend rtl`` runs the SmartNICs of a SmartNIC system as RTL (``sim.cosim.RTLNICBackend``:
Verilator when installed, else Amaranth's simulator, or ``--sim``) on the iteration's real
embedding traffic, and prints the RTL's per-unit cycle counts beside the timing models'.
Without a scenario it runs the small one of ``host.units.smartnic.rtl_scenario``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

HELP = "simulate one training/inference scenario on a GPU/NIC cluster: summary table + results folder"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from neonic.host.cluster import SCENARIO_PRESETS
    from neonic.host.commands import _args

    parser.add_argument("config", metavar="CONFIG.toml", nargs="?", type=_args.input_file, help="scenario file (default: the packaged default scenario)")
    parser.add_argument("--preset", metavar="NAME", help=f"a packaged scenario: {', '.join(SCENARIO_PRESETS)}")
    parser.add_argument("--plan", metavar="PLAN.json", type=_args.input_file,
                        help="run this sharding plan (neonic plan --export) instead of planning")
    parser.add_argument("--out", metavar="DIR", type=_args.output_folder, help="results folder (default results/<scenario>-<timestamp>/)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--backend", choices=("model", "rtl"), default="model",
                        help="SmartNICs as timing models (default) or co-simulated RTL")
    parser.add_argument("--sim", choices=("auto", "amaranth", "verilator", "icarus"), default="auto",
                        help="simulator of --backend rtl (default: Verilator when installed)")
    parser.add_argument("--calibration", metavar="FILE", type=_args.input_file,
                        help="timing-model calibration for --backend rtl's comparison (neonic calibrate)")
    parser.add_argument("--pcap", metavar="DIR", type=_args.output_folder,
                        help="--backend rtl: write each NIC's frames to DIR/nic<r>.pcap (Wireshark)")


def main(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from neonic.host.cluster import ClusterRun, load_scenario, scenario_preset
    from neonic.host.report import summary_table, write_results

    if args.config and args.preset:
        raise ValueError("CONFIG.toml and --preset: give one or the other")
    if args.calibration is not None and args.backend != "rtl":
        raise ValueError("--calibration: only used with --backend rtl (it calibrates the timing "
                         "models that the RTL run is compared with)")
    if args.pcap is not None and args.backend != "rtl":
        raise ValueError("--pcap: only with --backend rtl (the timing models carry no frames)")
    if args.sim != "auto" and args.backend != "rtl":
        raise ValueError(f"--sim {args.sim}: only used with --backend rtl")
    console = Console(stderr=True)
    backend = None
    if args.config:
        scenario = load_scenario(args.config)
    elif args.preset or args.backend != "rtl":
        scenario = scenario_preset(args.preset or "default")
    else:
        from neonic.host.units.smartnic import rtl_scenario
        scenario = rtl_scenario()
    if args.plan is not None:
        import dataclasses

        scenario = dataclasses.replace(scenario, plan_path=str(args.plan))
    if args.backend == "rtl":
        from neonic.host.units.smartnic import rtl_backend
        backend = rtl_backend(scenario, sim=args.sim, calibration=args.calibration, console=console,
                              pcap_dir=args.pcap)
    from neonic.host.commands._args import prepare_output_folder
    out = prepare_output_folder(
        args.out or Path("results") / f"{scenario.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    if args.quiet:
        runner = ClusterRun(scenario, nic_backend=backend)
        result = runner.run()
    else:
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                      TimeElapsedColumn(), console=console, transient=True) as bar:
            task = bar.add_task(scenario.name, total=1.0)

            def progress(message: str, fraction: float) -> None:
                bar.update(task, completed=fraction, description=f"{scenario.name}: {message}")

            runner = ClusterRun(scenario, progress=progress, nic_backend=backend)
            result = runner.run()
    Console().print(summary_table(result))
    if backend is not None and backend.report is not None:
        from neonic.sim.cosim import format_report
        print(format_report(backend.report))
    folder = write_results(result, out, plan=getattr(runner, "plan", None))
    Console().print(f"results: {folder}")
    return 0
