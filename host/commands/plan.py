"""``neonic plan [SCENARIO.toml | --preset NAME] [--export PLAN.json]``: the sharding plan of a
scenario, its predicted iteration time phase by phase, per-rank figures, and the other plans.

It takes the same scenario files and presets as ``neonic run`` (its cluster, workload, system,
schedule and ``[planner]`` section) and prices every plan with the planner's fast evaluation of
the iteration the simulator runs (``host.planner.cost``). ``--export`` writes the plan
(``host.planner.plan_io``'s format) for ``neonic run --plan`` or ``[planner] plan``; a scenario
whose ``[planner] plan`` names a file shows that plan instead of planning.
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import numpy as np

HELP = "plan embedding sharding for a scenario (same files as neonic run), compare with the other planners, export"

GIB = 2**30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from neonic.host.commands import _args

    parser.add_argument("config", metavar="SCENARIO.toml", nargs="?", type=_args.input_file,
                        help="scenario file, as for neonic run (default: the packaged default scenario)")
    parser.add_argument("--preset", metavar="NAME", help="a packaged scenario (as neonic run --preset)")
    parser.add_argument("--export", metavar="PLAN.json", type=_args.output_file,
                        help="write the plan (TorchRec vocabulary; neonic run --plan reads it)")
    parser.add_argument("--full", action="store_true", help="list every table (default: summarise above 40)")
    parser.add_argument("--csv", metavar="FILE", type=_args.output_file, help="write the full plan (one row per shard) to FILE")
    parser.add_argument("--ranks", type=int, default=16, metavar="N",
                        help="per-rank rows shown (slowest and fastest; default 16, 0 for all)")
    parser.add_argument("--no-baselines", action="store_true", help="skip the baseline and forced plans")
    parser.add_argument("--budget", type=float, metavar="S",
                        help="wall-clock safety for Neo's search in seconds (overrides planner.time_budget_s; "
                             "default: none, the search is deterministic; a plan a budget cuts depends on the load)")
    parser.add_argument("--max-steps", type=int, metavar="N",
                        help="Neo's search steps at most (overrides planner.max_steps)")


def _shape(tp) -> str:
    s = tp.shards[0]
    return f"{s.rows}x{s.cols}" if len(tp.shards) == 1 else f"{len(tp.shards)} x ~{s.rows}x{s.cols}"


def _ranks(tp) -> str:
    ranks = sorted(set(tp.ranks))
    if len(ranks) > 6:
        return f"{ranks[0]}..{ranks[-1]} ({len(ranks)})"
    return ",".join(map(str, ranks))


def main(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from neonic.host.cluster import ClusterRun, load_scenario, scenario_preset
    from neonic.host.planner import PLANNER_NAMES, CostModel, NeoPlanner, make_plan
    from neonic.host.planner.plan_io import load_plan, save_plan

    if args.config and args.preset:
        raise ValueError("SCENARIO.toml and --preset: give one or the other")
    if args.budget is not None and not 0 < args.budget <= 600:
        raise ValueError(f"--budget: expected a number of seconds in (0, 600], got {args.budget}")
    if args.max_steps is not None and args.max_steps < 0:
        raise ValueError(f"--max-steps: expected an integer >= 0, got {args.max_steps}")
    sc = load_scenario(args.config) if args.config else scenario_preset(args.preset or "default")
    budget = args.budget if args.budget is not None else sc.planner_budget_s
    max_steps = args.max_steps if args.max_steps is not None else sc.planner_max_steps
    runner = ClusterRun(sc)
    topo = runner._topology()
    s = runner.make_planner_system(topo)
    w = sc.workload
    console = Console(width=max(Console().width, 150))
    cost = CostModel(w, s)
    console.print(f"[bold]{sc.name}[/]: {w.name}, {len(w.tables)} tables, {w.total_params / 1e9:.1f}B params, "
                  f"batch {w.batch_per_gpu}/GPU on {sc.system.name}: {s.nodes} nodes x {s.gpus_per_node} "
                  f"{s.gpu.name} ({s.world_size} ranks); network figures from {s.comm.source}")
    t0 = time.perf_counter()
    if sc.plan_path is not None:
        plan = load_plan(sc.plan_path, w, s)
    elif sc.planner == "neo":
        plan = NeoPlanner(w, s, cost, time_budget_s=budget, max_steps=max_steps).run()
    else:
        plan = make_plan(w, s, sc.planner, cost=cost)
    planning_s = time.perf_counter() - t0
    result = cost.evaluate(plan)

    # ---- the plan
    tables = Table(title=f"plan ({plan.planner}; {', '.join(f'{k}: {v}' for k, v in plan.sharding_counts().items())})")
    for col in ("table", "rows", "dim", "pooling", "type", "ranks", "shard shape", "tier"):
        tables.add_column(col, justify="right" if col in ("rows", "dim", "pooling") else "left")
    spec = {t.name: t for t in w.tables}
    shown = list(plan)
    if not args.full and len(shown) > 40:
        per_rank = result.total_s
        shown = sorted(shown, key=lambda tp: (-len(tp.shards) > -2, -max(per_rank[r] for r in tp.ranks)))[:25]
        tables.caption = f"{len(plan.tables)} tables: showing 25 (split tables first); --full or --csv for all"
    for tp in shown:
        t = spec[tp.table]
        tiers = sorted({sh.tier for sh in tp.shards})
        tables.add_row(tp.table, f"{t.rows:,}", str(t.dim), f"{t.pooling:g}", tp.sharding.short, _ranks(tp),
                       _shape(tp), "/".join(tiers))
    console.print(tables)
    if args.csv:
        with args.csv.open("w", newline="") as f:
            out = csv.writer(f)
            out.writerow(["table", "sharding", "rank", "row_start", "row_end", "col_start", "col_end", "tier"])
            for tp in plan:
                for sh in tp.shards:
                    out.writerow([tp.table, tp.sharding.value, sh.rank, sh.row_start, sh.row_end, sh.col_start,
                                  sh.col_end, sh.tier])
        console.print(f"full plan written to {args.csv}")

    # ---- per-rank breakdown
    order = np.argsort(-result.total_s, kind="stable")
    if args.ranks and len(order) > args.ranks:
        half = args.ranks // 2
        order = np.concatenate([order[:half], order[-(args.ranks - half):]])
    ranks = Table(title="per-rank embedding time of one iteration (ms) and memory (slowest first)")
    cols = list(result.columns)
    short = {"fwd_compute": "fwd", "bwd_compute": "bwd", "host_transfer": "host", "input_a2a": "input",
             "pooled_a2a": "pooled", "grad_a2a": "grad", "dp_allreduce": "dp AR"}
    for col in ["rank", *(short.get(c, c) for c in cols), "total", "HBM GiB", "DRAM GiB"]:
        ranks.add_column(col, justify="right")
    for r in order:
        ranks.add_row(str(r), *(f"{result.columns[c][r] * 1e3:.3f}" for c in cols), f"{result.total_s[r] * 1e3:.3f}",
                      f"{result.hbm_bytes[r] / GIB:.1f}/{result.hbm_capacity / GIB:.1f}",
                      f"{result.dram_bytes[r] / GIB:.1f}")
    console.print(ranks)

    # ---- the iteration, phase by phase
    phases = Table(title=f"predicted iteration: {result.iteration_s * 1e3:.3f} ms "
                         "(each phase's slowest rank; the pipeline overlaps some of them)")
    phases.add_column("phase")
    phases.add_column("ms", justify="right")
    for phase, value in result.phase_s.items():
        phases.add_row(phase, f"{value * 1e3:.3f}")
    console.print(phases)

    # ---- the other plans
    summary = Table(title="plans compared (predicted iteration time, same model)")
    for col in ("planner", "iteration ms", "vs neo", "plan s"):
        summary.add_column(col, justify="right" if col != "planner" else "left")
    summary.add_row(plan.planner, f"{result.iteration_s * 1e3:.3f}", "1.00", f"{planning_s:.2f}")
    if not args.no_baselines:
        for name in PLANNER_NAMES:
            if name in ("neo", plan.planner):
                continue
            t1 = time.perf_counter()
            try:
                other = cost.evaluate(make_plan(w, s, name, cost=cost))
            except ValueError as error:
                summary.add_row(name, f"cannot plan: {error}"[:60], "", "")
                continue
            summary.add_row(name, f"{other.iteration_s * 1e3:.3f}", f"{other.iteration_s / result.iteration_s:.2f}",
                            f"{time.perf_counter() - t1:.2f}")
    console.print(summary)
    for note in plan.notes:
        console.print(f"{plan.planner}: {note}")
    if budget is not None and sc.plan_path is None:
        console.print(f"neo: wall-clock budget {budget:g} s (a search it ends depends on the machine's load)")
    if args.export:
        save_plan(plan, args.export, w)
        console.print(f"plan written to {args.export} (neonic run --plan {args.export})")
    return 0
