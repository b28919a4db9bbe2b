"""``neonic config show|fields``: a scenario fully resolved with every field explained; the
documented fields (meaning, unit, default) of every scenario file."""

from __future__ import annotations

import argparse

HELP = "print a scenario fully resolved, every field with its meaning, unit and default"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from neonic.host.cluster import SCENARIO_PRESETS
    from neonic.host.commands import _args

    sub = parser.add_subparsers(dest="config_command", metavar="{show,fields}", required=True)
    show = sub.add_parser("show", help="the resolved scenario (presets expanded, defaults "
                                       "filled in) as annotated TOML")
    show.add_argument("scenario", metavar="SCENARIO", nargs="?",
                      help=f"a scenario .toml file or a packaged scenario "
                           f"({', '.join(SCENARIO_PRESETS)}); default: default")
    fields = sub.add_parser("fields", help="every documented scenario field")
    fields.add_argument("--section", metavar="NAME",
                        help="only the fields under NAME (scenario, cluster, workload, system, "
                             "planner, dense)")
    fields.add_argument("--markdown", action="store_true", help="as a Markdown table")
    del _args


def main(args: argparse.Namespace) -> int:
    from pathlib import Path

    from neonic.host.cluster import SCENARIO_PRESETS, load_scenario, scenario_preset
    from neonic.host.fields import annotated_toml, markdown_table, resolved_scenario, scenario_fields

    if args.config_command == "fields":
        sections = sorted({f.name.split(".")[0] for f in scenario_fields()})
        if args.section and args.section not in sections:
            raise ValueError(f"--section: expected one of {', '.join(sections)}, got {args.section!r}")
        if args.markdown:
            print(markdown_table(args.section), end="")
            return 0
        for f in scenario_fields():
            if args.section and not f.name.startswith(args.section + "."):
                continue
            extra = f"  [{f.unit}]" if f.unit else ""
            print(f"{f.name:<42} {f.meaning}{extra}")
        return 0
    name = args.scenario or "default"
    if name in SCENARIO_PRESETS and not Path(name).is_file():
        scenario = scenario_preset(name)
    else:
        path = Path(name)
        if path.is_dir():
            raise ValueError(f"SCENARIO {name}: is a folder; expected a .toml file or one of "
                             f"{', '.join(SCENARIO_PRESETS)}")
        if not path.exists():
            raise ValueError(f"SCENARIO: {name!r} is neither a file nor a packaged scenario "
                             f"({', '.join(SCENARIO_PRESETS)})")
        scenario = load_scenario(path)
    print(f"# neonic config show {name}: the scenario as `neonic run` runs it (presets expanded,\n"
          f"# defaults filled in); each field: meaning [unit]; default.")
    print(annotated_toml(resolved_scenario(scenario)), end="")
    return 0
