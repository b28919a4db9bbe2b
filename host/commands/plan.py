"""``neonic plan CONFIG``: the sharding plan, its per-rank cost and memory, and the baselines'."""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import numpy as np

HELP = "plan embedding sharding for a workload on a cluster and compare with baseline planners"

GIB = 2**30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from neonic.host.commands import _args

    parser.add_argument("config", metavar="CONFIG", help="plan config TOML (schema: host/planner/config.py)")
    parser.add_argument("--full", action="store_true", help="list every table (default: summarise above 40)")
    parser.add_argument("--csv", metavar="FILE", type=_args.output_file, help="write the full plan (one row per shard) to FILE")
    parser.add_argument("--ranks", type=int, default=16, metavar="N",
                        help="per-rank rows shown (slowest and fastest; default 16, 0 for all)")
    parser.add_argument("--no-baselines", action="store_true", help="skip the baseline planners")
    parser.add_argument("--budget", type=float, metavar="S",
                        help="wall-clock safety for Neo's search in seconds (overrides planner.time_budget_s; "
                             "default: none, the search is deterministic; a plan a budget cuts depends on the load)")
    parser.add_argument("--max-steps", type=int, metavar="N",
                        help="Neo's refinement steps at most (overrides planner.max_steps)")


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

    from neonic.host.planner import BASELINES, CostModel, NeoPlanner, load_plan_config, plan_baseline

    if args.budget is not None and not 0 < args.budget <= 600:
        raise ValueError(f"--budget: expected a number of seconds in (0, 600], got {args.budget}")
    if args.max_steps is not None and args.max_steps < 0:
        raise ValueError(f"--max-steps: expected an integer >= 0, got {args.max_steps}")
    cfg = load_plan_config(args.config)
    budget = args.budget if args.budget is not None else cfg.time_budget_s
    max_steps = args.max_steps if args.max_steps is not None else cfg.max_steps
    console = Console(width=max(Console().width, 150))
    w, s = cfg.workload, cfg.system
    cost = CostModel(w, s)
    console.print(f"[bold]{w.name}[/]: {len(w.tables)} tables, {w.total_params / 1e9:.1f}B params, "
                  f"batch {w.batch_per_gpu}/GPU on {cfg.network_name}: {s.nodes} nodes x {s.gpus_per_node} "
                  f"{s.gpu.name} ({s.world_size} ranks); network figures from {s.comm.source}")
    t0 = time.perf_counter()
    planner = NeoPlanner(w, s, cost, time_budget_s=budget, max_steps=max_steps)
    plan = planner.run()
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

    # ---- summary and baselines
    summary = Table(title="plans compared (same cost model)")
    for col in ("planner", "cost ms (slowest rank)", "mean ms", "imbalance max/mean", "vs neo", "plan s"):
        summary.add_column(col, justify="right" if col != "planner" else "left")
    summary.add_row("neo", f"{result.max_s * 1e3:.3f}", f"{result.mean_s * 1e3:.3f}", f"{result.imbalance:.3f}",
                    "1.00", f"{planning_s:.2f}")
    if cfg.baselines and not args.no_baselines:
        for name in BASELINES:
            t1 = time.perf_counter()
            bc = cost.evaluate(plan_baseline(name, w, s, cost))
            summary.add_row(name, f"{bc.max_s * 1e3:.3f}", f"{bc.mean_s * 1e3:.3f}", f"{bc.imbalance:.3f}",
                            f"{bc.max_s / result.max_s:.2f}", f"{time.perf_counter() - t1:.2f}")
    console.print(summary)
    for note in plan.notes:
        console.print(f"neo: {note}")
    if budget is not None:
        console.print(f"neo: wall-clock budget {budget:g} s (a search it ends depends on the machine's load)")
    return 0
