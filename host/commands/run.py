"""``neonic run [CONFIG.toml | --preset NAME] [--out DIR]``: one scenario on the cluster runtime.

With no argument it runs the packaged default scenario (Model-A scaled down on 2 ZionEX nodes x
8 GPUs; seconds on 2 cores). Shows progress while it runs, prints a summary table and writes the
results folder (``results/<scenario>-<timestamp>/`` unless ``--out`` is given). The hardware
units' own demos are ``neonic rtl sim UNIT``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

HELP = "simulate one training/inference scenario on a GPU/NIC cluster: summary table + results folder"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from host.cluster import SCENARIO_PRESETS

    parser.add_argument("config", metavar="CONFIG.toml", nargs="?", help="scenario file (default: the packaged default scenario)")
    parser.add_argument("--preset", metavar="NAME", help=f"a packaged scenario: {', '.join(SCENARIO_PRESETS)}")
    parser.add_argument("--out", metavar="DIR", type=Path, help="results folder (default results/<scenario>-<timestamp>/)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from host.cluster import ClusterRun, load_scenario, scenario_preset
    from host.report import summary_table, write_results

    if args.config and args.preset:
        raise ValueError("CONFIG.toml and --preset: give one or the other")
    if args.config:
        scenario = load_scenario(args.config)
    else:
        scenario = scenario_preset(args.preset or "default")
    out = args.out or Path("results") / f"{scenario.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    console = Console(stderr=True)
    if args.quiet:
        result = ClusterRun(scenario).run()
    else:
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                      TimeElapsedColumn(), console=console, transient=True) as bar:
            task = bar.add_task(scenario.name, total=1.0)

            def progress(message: str, fraction: float) -> None:
                bar.update(task, completed=fraction, description=f"{scenario.name}: {message}")

            result = ClusterRun(scenario, progress=progress).run()
    Console().print(summary_table(result))
    folder = write_results(result, out)
    Console().print(f"results: {folder}")
    return 0
