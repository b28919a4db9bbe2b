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
    sim.add_argument("--vcd", type=_args.output_file,
                     help="write the waveform to this file (default: OUT/UNIT.vcd, or .fst from Icarus)")
    sim.add_argument("--no-vcd", action="store_true", help="record no waveform (faster)")
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
    """Write the unit's Verilog through the export cache (``sim.harness.export_verilog_cached``):
    a rerun with the same parameters, RTL sources and unit driver converts nothing."""
    import hashlib
    import inspect

    from neonic.sim.harness.verilog import export_verilog_cached

    entry = get_unit(args.unit)
    params = parse_params(_args.unique_params(args.param))
    # The driver module holds the parameter defaults and their parsing, which the RTL source
    # hash does not cover: its text is part of the key.
    driver = inspect.getsourcefile(entry.build)
    key = {"unit": entry.name, "params": params,
           "driver": hashlib.sha256(Path(driver).read_bytes()).hexdigest() if driver else ""}
    cached = export_verilog_cached(lambda: entry.build(params), entry.name, key, emit_src=True)
    text = cached.read_text()
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
    if args.vcd is not None and args.no_vcd:
        raise ValueError("--vcd and --no-vcd: give one or the other")
    vcd = args.vcd
    if vcd is None and not args.no_vcd and entry.waveform:
        vcd = out / f"{entry.name}.vcd"
    request = SimRequest(sim=args.sim, out=out, seed=args.seed, vcd=vcd,
                         params=params, extra=extra)
    figures = entry.simulate(request)
    # every run's figures.json has the same frame: unit, simulator, seed and waveform (None
    # when none was recorded), whichever simulator ran
    wave = _collect_waveform(figures, vcd, out, entry.name) if vcd is not None else None
    figures["waveform"] = str(wave) if wave else None
    figures.setdefault("unit", entry.name)
    figures.setdefault("sim", args.sim)
    figures.setdefault("seed", args.seed)
    (out / "figures.json").write_text(json.dumps(figures, indent=2, sort_keys=True, default=str) + "\n")
    print(json.dumps(figures, indent=2, sort_keys=True, default=str))
    print(f"results: {out}")
    return 0


def _collect_waveform(figures: dict, vcd: Path, out: Path, unit: str) -> Path | None:
    """The run's waveform inside the results folder: ``vcd`` itself (Amaranth writes it there),
    else the file a cocotb run left in its run folder (Icarus writes FST, Verilator VCD), copied
    to ``OUT/UNIT.fst|vcd`` so the results folder holds everything a user opens."""
    import shutil

    if vcd.is_file():
        return vcd
    found = [Path(figures[k]) for k in ("waves", "vcd", "results_xml", "results")
             if isinstance(figures.get(k), str)]
    for place in found:
        folder = place if place.is_dir() else place.parent
        for pattern in ("*.fst", "*.vcd"):
            for wave in sorted(folder.glob(pattern)):
                target = out / f"{unit}{wave.suffix}"
                if wave.resolve() != target.resolve():
                    shutil.copyfile(wave, target)
                return target
    return None


def main(args: argparse.Namespace) -> int:
    if args.rtl_command == "list":
        for name, entry in discover().items():
            print(f"{name:14s} {entry.summary}")
        return 0
    if args.rtl_command == "export":
        return _export(args)
    return _sim(args)
