"""``neonic validate [--quick] [--out DIR] [--only NAME ...] [--jobs N] [--json]``: reproduce the published results
and set our figures beside them (see :mod:`host.validate`)."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

HELP = "run the experiments and print ours-vs-published tables (Markdown + CSV + plots)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from neonic.host.commands import _args
    from neonic.host.experiments import EXPERIMENTS

    parser.add_argument("--quick", action="store_true", help="smoke run: every experiment at its tiny size (not comparable)")
    parser.add_argument("--out", metavar="DIR", type=_args.output_folder, help="output folder (default results/validate-<timestamp>/)")
    parser.add_argument("--only", metavar="NAME", nargs="+", choices=EXPERIMENTS, help="run only these experiments")
    parser.add_argument("--jobs", metavar="N", type=int, default=min(2, os.cpu_count() or 1),
                        help="experiments run side by side (default: 2, or 1 on a one-core machine); the figures "
                             "do not depend on it")
    parser.add_argument("--json", action="store_true",
                        help="print {key: figure} for every row as one JSON object on the last line")


def main(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from neonic.host.experiments import VALIDATED
    from neonic.host.validate import validate

    out = args.out or Path("results") / f"validate-{time.strftime('%Y%m%d-%H%M%S')}"
    err = Console(stderr=True)
    t0 = time.perf_counter()

    def progress(message: str) -> None:
        err.print(f"[{time.perf_counter() - t0:7.1f}s] {message}")

    jobs = getattr(args, "jobs", 1)
    if jobs < 1:
        err.print(f"neonic validate: --jobs: expected an integer >= 1, got {jobs}")
        return 2
    summary = validate(out, quick=args.quick, experiments=tuple(args.only or VALIDATED), progress=progress, jobs=jobs)
    table = Table(title="neonic validate: ours vs published" + (" (--quick: not comparable)" if args.quick else ""))
    for col in ("key", "figure", "ours", "published", "rel. diff", "kind"):
        table.add_column(col, justify="right" if col in ("ours", "published", "rel. diff") else "left")
    for r in summary["rows"]:
        rel = r["relative_difference"]
        ours = r["ours"]
        table.add_row(r["key"], r["figure"] + (f" [dim]({r['note']})[/dim]" if r["note"] else ""),
                      "n/a" if ours is None else (f"{ours:,.0f}" if abs(ours) >= 1000 else f"{ours:.4g}"),
                      "not published" if r["published"] is None else (f"{r['published']:,.0f}" if r["published"] >= 1000 else f"{r['published']:.4g}"),
                      "" if rel is None else f"{rel * 100:+.1f}%", r["kind"])
    import sys
    # a pipe or file gets the full table, not one wrapped to 80 columns
    console = Console() if sys.stdout.isatty() else Console(width=200)
    console.print(table)
    for run in summary["runs"]:
        state = f"{run['wall_s']:.1f} s" if run["status"] == "ok" else f"not run: {run['reason']}"
        console.print(f"{run['experiment']}: {state}")
    console.print(f"report: {out / 'validation.md'} (CSV: {out / 'validation.csv'})")
    if getattr(args, "json", False):
        import json
        import sys

        sys.stdout.flush()
        print(json.dumps(summary["figures"], sort_keys=True), flush=True)
    return 0
