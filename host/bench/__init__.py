"""Benchmarks: ``neonic bench NAME [--json]``.

Each module ``host/bench/<name>.py`` defines ``SUMMARY`` and ``run(ctx: BenchContext) -> dict``.
Figures are measured when the command runs, never hard-coded; the command prints them as a
table and, with ``--json``, as one JSON object on the last line.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import TextIO

__all__ = ["BenchContext", "discover", "get_bench"]


@dataclass
class BenchContext:
    """Passed to a benchmark: a seed, a quick flag (smaller sizes), a large flag (also the runs
    that take tens of minutes), and a progress reporter."""

    seed: int = 1
    quick: bool = False
    large: bool = False
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    _t0: float = field(default_factory=time.perf_counter)

    def progress(self, message: str) -> None:
        """One progress line (to stderr, so stdout's last line stays the JSON object)."""
        elapsed = time.perf_counter() - self._t0
        print(f"[{elapsed:7.1f}s] {message}", file=self.stream, flush=True)


def discover() -> dict[str, ModuleType]:
    benches: dict[str, ModuleType] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        if callable(getattr(module, "run", None)):
            benches[info.name] = module
    return benches


def get_bench(name: str) -> ModuleType:
    names = sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))
    if name not in names:
        raise ValueError(f"NAME: unknown benchmark {name!r}; expected one of {', '.join(names) or '(none)'}")
    return importlib.import_module(f"{__name__}.{name}")
