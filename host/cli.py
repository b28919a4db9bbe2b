"""The ``neonic`` command line.

Subcommands are modules of :mod:`host.commands` (``HELP``, ``add_arguments(parser)``,
``main(args) -> int``), discovered by name, so each capability plugs in without a central list.
Errors in user input (configs, arguments, traces) are reported as one clear line and exit
status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import neonic.host.commands as commands
from neonic import __version__

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="neonic",
        description="Cycle-approximate model of Neo-style DLRM training on GPU clusters with SmartNICs.",
    )
    parser.add_argument("--version", action="version", version=f"neonic {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        name = getattr(module, "NAME", info.name)
        sub_parser = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(sub_parser)
        sub_parser.set_defaults(_main=module.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._main(args) or 0)
    except (ValueError, FileNotFoundError) as error:
        print(f"neonic {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"neonic {args.command}: interrupted", file=sys.stderr)
        return 130
    finally:
        _quiet_unused_designs()


def _quiet_unused_designs() -> None:
    """Amaranth warns at exit about designs that were built and never simulated (the command
    line builds some only to read their parameters); to a user that is noise after the
    command's own output, so the command line silences that one warning category."""
    if "amaranth" in sys.modules:
        import warnings

        from amaranth.hdl import UnusedElaboratable
        warnings.filterwarnings("ignore", category=UnusedElaboratable)


if __name__ == "__main__":
    sys.exit(main())
