"""``neonic rtl export|sim UNIT``: a hardware unit's Verilog, or a run of it on a workload."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from neonic.host.commands import _args
from neonic.host.units import SimRequest, discover, get_unit, parse_params

HELP = "export a unit's Verilog or simulate it on its default workload"

SIMULATORS = ("amaranth", "icarus", "verilator")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="rtl_command", metavar="{export,sim,list}", required=True)

    export = sub.add_parser("export", help="write the unit's Verilog")
    export.add_argument("unit", metavar="UNIT")
    export.add_argument("-o", "--output", type=_args.output_file, help="Verilog file (default: UNIT.v)")
    export.add_argument("--param", action="append", metavar="KEY=VALUE",
                        help="a constructor parameter (repeatable)")

    sim = sub.add_parser("sim", help="simulate the unit on its default workload")
    sim.add_argument("unit", metavar="UNIT")
    sim.add_argument("--sim", default="amaranth", choices=SIMULATORS,
                     help="simulator (default amaranth)")
    sim.add_argument("--vcd", type=_args.output_file, help="write a waveform to this file")
    sim.add_argument("--out", type=_args.output_folder,
                     help="results folder (default results/rtl-UNIT-TIME)")
    sim.add_argument("--seed", type=_args.seed, default=1, help="random seed (default 1)")
    sim.add_argument("--param", action="append", metavar="KEY=VALUE",
                     help="a constructor parameter (repeatable)")
    seen: set[str] = set()
    for entry in discover().values():
        for name, text in entry.options:
            if name not in seen:
                seen.add(name)
                sim.add_argument(f"--{name}", dest=f"opt_{name}", metavar="VALUE",
                                 help=f"{text} (unit {entry.name})")

    sub.add_parser("list", help="list the units")


def _export(args: argparse.Namespace) -> int:
    from amaranth.back import verilog

    entry = get_unit(args.unit)
    component = entry.build(parse_params(_args.unique_params(args.param)))
    text = verilog.convert(component, name=entry.name)
    output = args.output or Path(f"{entry.name}.v")
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)
    except OSError as e:
        raise ValueError(f"--output {output}: cannot write ({e.strerror or e})") from None
    print(f"wrote {output} ({len(text.splitlines())} lines)")
    return 0


def _sim(args: argparse.Namespace) -> int:
    entry = get_unit(args.unit)
    extra = {key[4:]: value for key, value in vars(args).items()
             if key.startswith("opt_") and value is not None}
    unknown = set(extra) - {name for name, _ in entry.options}
    if unknown:
        raise ValueError(f"--{sorted(unknown)[0]}: not an option of unit {entry.name!r}")
    params = parse_params(_args.unique_params(args.param))
    out = _args.prepare_output_folder(
        args.out or Path("results") / f"rtl-{entry.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    request = SimRequest(sim=args.sim, out=out, seed=args.seed, vcd=args.vcd,
                         params=params, extra=extra)
    figures = entry.simulate(request)
    print(json.dumps(figures, indent=2, sort_keys=True, default=str))
    print(f"results: {out}")
    return 0


def main(args: argparse.Namespace) -> int:
    if args.rtl_command == "list":
        for name, entry in discover().items():
            print(f"{name:14s} {entry.summary}")
        return 0
    if args.rtl_command == "export":
        return _export(args)
    return _sim(args)
