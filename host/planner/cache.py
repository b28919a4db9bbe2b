"""Plans kept by what they are made from, so that runs with the same planning inputs plan once.

A deterministic planner (Neo's search bounded by steps, a baseline, a forced type) returns the
same plan for the same inputs: the workload, the planner's view of the cluster
(``host.planner.PlannerSystem``: GPU, network figures, memory tiers, lookups, iteration), the
planner's name and its step bound, and the code that plans. Not the iterations a run warms up
and measures: the search prices plans on a fixed window (``host.planner.cost.PLAN_WINDOW``)
whatever the run simulates, so the key takes the system with that window
(:func:`planning_view`). Experiments and sweeps often run
many scenarios that differ only in what the planner does not read (iterations, a SmartNIC
mechanism, the dense part's precision, the backend), and Neo's search on Model-A costs tens of
CPU seconds: :class:`PlanCache` makes each distinct plan once.

The key is a SHA-256 over all of those inputs (:func:`fingerprint`: every dataclass field that
takes part in equality, every array's bytes, the topology's links) and over the source text of
neonic's ``host``, ``sim`` and ``rtl`` packages (:func:`code_version`), so a change of any input
or of the code makes a new key: a cached plan is the plan the planner would return. An input the
fingerprint cannot read (an object of unknown kind) is not cached: the planner runs. A wall-clock
budget (``time_budget_s``) makes the search depend on machine load, so such plans are never
cached.

Where: plans live in memory for the cache's life, and on disk under ``directory`` (JSON, the
plan file format of ``host.planner.plan_io``, re-checked against the workload when read) when a
directory is given, so that worker processes of one ``neonic validate`` and later runs share them
(:func:`default_plan_dir`: ``plans/`` under the build directory; delete it to drop them).

Which cache a run uses: :func:`use_plan_cache` sets one for a block of code (a context variable,
so nothing outlives the block); ``host.cluster.ClusterRun`` asks :func:`active_plan_cache`.
``neonic validate`` and ``neonic sweep`` plan through a cache under the build directory; a plain
``neonic run`` plans afresh.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import os
import types
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from neonic.host.planner.plan import Plan
from neonic.host.planner.plan_io import plan_from_dict, plan_to_dict

__all__ = ["PlanCache", "fingerprint", "planning_view", "code_version", "use_plan_cache", "active_plan_cache", "default_plan_dir",
           "Unfingerprintable"]

_PACKAGES = ("host", "sim", "rtl")


class Unfingerprintable(TypeError):
    """An input of a kind :func:`fingerprint` cannot identify by value."""


def _feed(h: "hashlib._Hash", obj: Any, depth: int = 0) -> None:
    if depth > 64:
        raise Unfingerprintable("inputs nested more than 64 levels deep")
    d = depth + 1
    tag = lambda s: h.update(b"\x00" + s.encode() + b"\x01")  # noqa: E731
    if obj is None or isinstance(obj, (bool, int, str)):
        tag(f"{type(obj).__name__}:{obj!r}")
    elif isinstance(obj, float):
        tag(f"float:{obj.hex()}")
    elif isinstance(obj, bytes):
        tag(f"bytes:{len(obj)}")
        h.update(obj)
    elif isinstance(obj, enum.Enum):
        tag(f"enum:{type(obj).__qualname__}")
        _feed(h, obj.value, d)
    elif isinstance(obj, Path):
        tag(f"path:{obj}")
    elif isinstance(obj, np.ndarray):
        if obj.dtype == object:
            tag(f"objarray:{obj.shape}")
            for item in obj.ravel():
                _feed(h, item, d)
        else:
            tag(f"array:{obj.dtype.str}:{obj.shape}")
            h.update(np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, np.generic):
        _feed(h, obj.item(), d)
    elif hasattr(type(obj), "__fingerprint__"):
        tag(f"fp:{type(obj).__qualname__}")
        _feed(h, obj.__fingerprint__(), d)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        tag(f"dc:{type(obj).__module__}.{type(obj).__qualname__}")
        for f in dataclasses.fields(obj):
            if f.compare:
                tag(f.name)
                _feed(h, getattr(obj, f.name), d)
    elif isinstance(obj, Mapping):
        items = sorted(((fingerprint(k), v) for k, v in obj.items()), key=lambda kv: kv[0])
        tag(f"map:{len(items)}")
        for k, v in items:
            tag(k)
            _feed(h, v, d)
    elif isinstance(obj, (list, tuple)):
        tag(f"{type(obj).__name__}:{len(obj)}")
        for item in obj:
            _feed(h, item, d)
    elif isinstance(obj, (set, frozenset)):
        tag(f"set:{len(obj)}")
        for k in sorted(fingerprint(x) for x in obj):
            tag(k)
    elif isinstance(obj, functools.partial):
        tag("partial")
        _feed(h, (obj.func, obj.args, obj.keywords), d)
    elif isinstance(obj, types.MethodType):
        tag("method")
        _feed(h, (obj.__func__, obj.__self__), d)
    elif isinstance(obj, types.ModuleType):
        tag(f"module:{obj.__name__}")  # its code is covered by code_version()
    elif isinstance(obj, types.FunctionType):
        # the code is covered by code_version(); what a closure captured is an input (a memo
        # it keeps too: filled or not, its entries follow from the other inputs, so at worst
        # two equal systems get different keys and plan twice, never one plan for two systems)
        tag(f"function:{obj.__module__}.{obj.__qualname__}")
        _feed(h, obj.__defaults__ or (), d)
        _feed(h, obj.__kwdefaults__ or {}, d)
        for cell in obj.__closure__ or ():
            _feed(h, cell.cell_contents, d)
    else:
        raise Unfingerprintable(f"cannot fingerprint a {type(obj).__module__}.{type(obj).__qualname__}")


def fingerprint(obj: Any) -> str:
    """SHA-256 (hex) of ``obj`` by value (see the module doc); :class:`Unfingerprintable` for an
    object of a kind it cannot read. Types define ``__fingerprint__()`` to say what identifies
    them (e.g. ``sim.network.topology.Topology``: its config and its links)."""
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()


@functools.lru_cache(maxsize=4)
def _code_version(root: str) -> str:
    h = hashlib.sha256()
    base = Path(root)
    for package in _PACKAGES:
        for path in sorted((base / package).rglob("*.py")):
            h.update(str(path.relative_to(base)).encode() + b"\x00")
            h.update(path.read_bytes())
    return h.hexdigest()


def code_version() -> str:
    """SHA-256 of the source of neonic's ``host``, ``sim`` and ``rtl`` packages."""
    return _code_version(str(Path(__file__).resolve().parents[2]))


def planning_view(system: Any) -> Any:
    """``system`` as the planner reads it: its iteration's warm-up and measured iterations set
    to :data:`~host.planner.cost.PLAN_WINDOW`, the window every planner prices plans on (a run's
    own window only matters to :meth:`~host.planner.cost.CostModel.evaluate`, which is not
    planning). Two runs that differ only in ``warmup`` / ``iterations`` share a key."""
    from neonic.host.planner.cost import PLAN_WINDOW

    spec = getattr(system, "iteration", None)
    if (dataclasses.is_dataclass(system) and not isinstance(system, type) and dataclasses.is_dataclass(spec)
            and hasattr(spec, "warmup") and hasattr(spec, "iterations")):
        window = dataclasses.replace(spec, warmup=PLAN_WINDOW[0], iterations=PLAN_WINDOW[1])
        return dataclasses.replace(system, iteration=window)
    return system


class PlanCache:
    """Plans by the fingerprint of their inputs, in memory and (with ``directory``) on disk."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = Path(directory) if directory is not None else None
        self._plans: dict[str, Plan] = {}
        self.hits = 0
        self.misses = 0

    def key(self, workload: Any, system: Any, planner: str, max_steps: int | None) -> str | None:
        """The key of a plan, or None where an input cannot be fingerprinted."""
        try:
            return fingerprint((code_version(), workload, planning_view(system), planner, max_steps))
        except Unfingerprintable:
            return None

    def plan(self, workload: Any, system: Any, planner: str, max_steps: int | None, time_budget_s: float | None,
             make: Callable[[], Plan]) -> Plan:
        """The cached plan for these inputs, or ``make()``'s (kept for next time). A plan made
        under a wall-clock budget is neither read nor kept (it depends on the machine's load)."""
        key = None if time_budget_s is not None else self.key(workload, system, planner, max_steps)
        if key is None:
            return make()
        plan = self._plans.get(key)
        if plan is None and self.directory is not None:
            plan = self._read(key, workload, system)
        if plan is not None:
            self.hits += 1
            self._plans[key] = plan
            return plan
        self.misses += 1
        plan = make()
        self._plans[key] = plan
        if self.directory is not None:
            self._write(key, plan, workload)
        return plan

    def _path(self, key: str) -> Path:
        assert self.directory is not None
        return self.directory / f"{key}.json"

    def _read(self, key: str, workload: Any, system: Any) -> Plan | None:
        path = self._path(key)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return plan_from_dict(data, workload, system, source=str(path))
        except FileNotFoundError:
            return None
        except (ValueError, OSError, UnicodeDecodeError):
            # a damaged or foreign file: plan afresh and overwrite it
            return None

    def _write(self, key: str, plan: Plan, workload: Any) -> None:
        """Keep the plan on disk, best effort: a folder that cannot be written (a remote Dask
        worker without the submitter's file system) costs a re-plan later, never the run."""
        assert self.directory is not None
        path = self._path(key)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(plan_to_dict(plan, workload), separators=(",", ":")), encoding="utf-8")
            os.replace(tmp, path)  # atomic: a concurrent reader sees the whole file or none
        except OSError:
            tmp.unlink(missing_ok=True)


def default_plan_dir() -> Path:
    """Where ``neonic validate`` and ``neonic sweep`` keep plans: ``plans/`` under the build
    directory (``$NEONIC_BUILD_DIR``, else the per-user cache; ``sim.harness.verilog``)."""
    from neonic.sim.harness.verilog import resolve_build_root

    return resolve_build_root() / "plans"


_ACTIVE: ContextVar[PlanCache | None] = ContextVar("neonic_plan_cache", default=None)


def active_plan_cache() -> PlanCache | None:
    """The plan cache set by the innermost :func:`use_plan_cache` block, or None."""
    return _ACTIVE.get()


@contextmanager
def use_plan_cache(cache: PlanCache | None) -> Iterator[PlanCache | None]:
    """Plan through ``cache`` inside the block (None: plan afresh inside it)."""
    token = _ACTIVE.set(cache)
    try:
        yield cache
    finally:
        _ACTIVE.reset(token)
