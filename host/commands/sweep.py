"""``neonic sweep SWEEP.toml [--scheduler ADDRESS] [--workers N] [--out DIR]``: a design-space
sweep of cluster scenarios on Dask distributed (see :mod:`host.sweep` for the file format).

Without ``--scheduler`` the points run on an in-process Dask LocalCluster (one single-threaded
worker process per core unless ``--workers``); with it, on a running Dask cluster
(docs/sweeps.md). Finished points are written at once under ``DIR/points/``; rerunning the same
command after an interruption skips them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "design-space sweep of scenarios on Dask (grid over config fields; resumable; CSV + plots)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from neonic.host.commands import _args

    parser.add_argument("sweep", metavar="SWEEP.toml", type=_args.input_file, help="sweep file (see host/sweep.py or docs/sweeps.md)")
    parser.add_argument("--scheduler", metavar="ADDRESS", help="a running Dask scheduler, e.g. tcp://10.0.0.1:8786")
    parser.add_argument("--workers", metavar="N", type=_args.positive_int, help="local cluster: number of worker processes (default: cores)")
    parser.add_argument("--out", metavar="DIR", type=_args.output_folder, help="results folder (default results/sweep-<name>/)")
    parser.add_argument("--threads", action="store_true", help="local cluster: workers as threads in this process")
    parser.add_argument("--quiet", action="store_true", help="no progress bar; one line per finished point")


def _interruptible(run, *a, **kw):
    """``run(...)``, or ``None`` after Ctrl-C (run_sweep has written the partial results)."""
    try:
        return run(*a, **kw)
    except KeyboardInterrupt:
        return None


def main(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from neonic.host.sweep import load_sweep, run_sweep

    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers: expected an integer >= 1, got {args.workers}")
    if args.workers is not None and args.scheduler:
        raise ValueError("--workers and --scheduler: the workers of a running cluster are its own; give one")
    spec = load_sweep(args.sweep)
    from neonic.host.commands._args import prepare_output_folder
    out = prepare_output_folder(args.out or Path("results") / f"sweep-{spec.name}")
    err = Console(stderr=True)
    failures: list[str] = []

    def note(record: dict) -> None:
        if record.get("status") == "error":
            failures.append(f"point {record['index']} {record['values']}: {record['error']}")

    kwargs = dict(scheduler=args.scheduler, workers=args.workers, processes=not args.threads,
                  announce=lambda line: err.print(line))
    if args.quiet:
        def progress(done: int, total: int, record: dict) -> None:
            if record:
                note(record)
                err.print(f"[{done}/{total}] point {record['index']} {record['status']}"
                          + (f": {record['error']}" if record.get("error") else ""))

        result = _interruptible(run_sweep, spec, out, progress=progress, **kwargs)
    else:
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err) as bar:
            task = bar.add_task(f"sweep {spec.name}", total=None)

            def progress(done: int, total: int, record: dict) -> None:
                bar.update(task, completed=done, total=total)
                if record:
                    note(record)
                    if record.get("status") == "error":
                        bar.console.print(f"[red]point {record['index']} failed[/red]: {record['error']}")

            result = _interruptible(run_sweep, spec, out, progress=progress, **kwargs)
    if result is None:
        err.print(f"sweep {spec.name}: interrupted; the finished points are in "
                  f"{out / 'results.csv'} (rerun the same command to resume)")
        return 130
    console = Console()
    console.print(f"sweep {spec.name}: {result.finished}/{len(result.points)} points finished "
                  f"({len(result.computed)} computed now, {len(result.skipped)} reused) in {result.wall_s:.1f} s")
    for line in failures:
        console.print(f"failed: {line}")
    console.print(f"results: {out / 'results.csv'}")
    return 1 if result.failed else 0
