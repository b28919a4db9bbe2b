"""The hardware units as the command line sees them (``neonic rtl export|sim UNIT``).

Each module ``host/units/<unit>.py`` defines ``UNIT = UnitEntry(...)``; :func:`discover` finds
them by module name, so adding a unit touches no central list. An entry is registration only:
building a unit from ``--param`` strings and running it on its default workload are simulation
code (``sim.units.<unit>``), which the benches, the tests and the co-simulation share.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable

from neonic.sim.units import SimRequest

__all__ = ["UnitEntry", "SimRequest", "discover", "get_unit", "parse_params"]


@dataclass(frozen=True)
class UnitEntry:
    """A unit's entry points: ``build(params) -> Component``, ``simulate(SimRequest) -> dict``."""

    name: str
    summary: str
    build: Callable[[dict[str, str]], Any]
    simulate: Callable[[SimRequest], dict]
    options: tuple[tuple[str, str], ...] = ()  # unit-specific CLI options: (name, help)
    waveform: bool = True  # whether a run can record one (``neonic rtl sim`` asks by default)


def discover() -> dict[str, UnitEntry]:
    """All units, by name."""
    units: dict[str, UnitEntry] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        entry = getattr(module, "UNIT", None)
        if isinstance(entry, UnitEntry):
            units[entry.name] = entry
    return units


def get_unit(name: str) -> UnitEntry:
    units = discover()
    if name not in units:
        raise ValueError(f"UNIT: unknown unit {name!r}; expected one of {', '.join(sorted(units)) or '(none)'}")
    return units[name]


def parse_params(pairs: list[str] | None) -> dict[str, str]:
    """``["lanes=16", "dtype=fp16"]`` -> ``{"lanes": "16", "dtype": "fp16"}``."""
    params: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--param: expected KEY=VALUE, got {pair!r}")
        params[key.strip()] = value.strip()
    return params
