"""``neonic bench NAME [--json]``: measured performance figures of one part of neonic."""

from __future__ import annotations

import argparse
import json
import math
import sys

from neonic.host.bench import BenchContext, discover, get_bench
from neonic.host.commands import _args

HELP = "measure performance figures (benchmarks: see `neonic bench --list`)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", nargs="?", help="benchmark name")
    parser.add_argument("--json", action="store_true",
                        help="print the figures as one JSON object on the last line")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--seed", type=_args.seed, default=1, help="random seed (default 1)")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("--large", action="store_true",
                        help="also the runs that take tens of minutes (e.g. 4096-GPU per-flow cases)")


def _flatten(prefix: str, value, rows: list[tuple[str, str]]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(f"{prefix}.{key}" if prefix else str(key), item, rows)
    elif isinstance(value, float):
        rows.append((prefix, f"{value:.6g}"))
    else:
        rows.append((prefix, json.dumps(value) if isinstance(value, (list, bool)) else str(value)))


def _json_safe(value):
    """NaN and infinities are not JSON: report them as null."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return _json_safe(value.item())
    return value


def main(args: argparse.Namespace) -> int:
    if args.list or not args.name:
        for name, module in discover().items():
            print(f"{name:12s} {getattr(module, 'SUMMARY', '')}")
        return 0
    module = get_bench(args.name)
    ctx = BenchContext(seed=args.seed, quick=args.quick, large=args.large)
    ctx.progress(f"bench {args.name}: {getattr(module, 'SUMMARY', '')}")
    figures = _json_safe(module.run(ctx))
    rows: list[tuple[str, str]] = []
    _flatten("", figures, rows)
    width = max((len(key) for key, _ in rows), default=0)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    if args.json:
        _settle_warnings()
        sys.stdout.flush()
        print(json.dumps(figures, sort_keys=True), flush=True)
    return 0


def _settle_warnings() -> None:
    """Emit now (to stderr) the warnings that would otherwise be printed at interpreter exit,
    after the JSON line: Amaranth's ``UnusedElaboratable`` for designs a bench built but did not
    simulate is raised when the object is collected. Collect now, then silence that category, so
    the JSON object stays the last line even when stdout and stderr share a terminal or file."""
    import gc
    import warnings

    gc.collect()
    sys.stderr.flush()
    try:
        from amaranth.hdl import UnusedElaboratable
    except ImportError:  # pragma: no cover
        return
    warnings.filterwarnings("ignore", category=UnusedElaboratable)
