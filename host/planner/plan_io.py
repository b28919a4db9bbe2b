"""Plans in and out: a JSON file in TorchRec's vocabulary, checked against the workload.

Format (``neonic plan SCENARIO --export plan.json`` writes it; ``[planner] plan = "plan.json"``
in a scenario, or ``neonic run --plan plan.json``, runs it instead of planning)::

    {
      "format": "neonic.plan/1",
      "world_size": 128, "gpus_per_node": 8,          # must match the scenario's cluster
      "planner": "neo", "workload": "model-a",         # informative
      "tables": {
        "a000": {
          "sharding_type": "table_row_wise",           # data_parallel | table_wise | row_wise |
                                                       # column_wise | table_row_wise | table_column_wise
          "ranks": [8, 9, 10, 11, 12, 13, 14, 15],     # the shards' ranks, in shard order
          "shards": [                                  # TorchRec's ShardMetadata: offsets and sizes
            {"rank": 8, "shard_offsets": [0, 0], "shard_sizes": [125000, 128], "tier": "hbm"},
            ...
          ]
        }, ...
      }
    }

``shard_offsets`` / ``shard_sizes`` are ``[row, column]``; ``tier`` (``hbm`` | ``dram`` | ``ssd``,
default ``hbm``) is neonic's addition. ``shards`` may be left out for ``table_wise`` (one whole
shard on ``ranks[0]``) and ``data_parallel`` (a whole replica on each rank; ``ranks`` must then
be every rank). A TorchRec ``ParameterSharding`` converts field by field: ``sharding_type``,
``ranks``, and per ``ShardMetadata`` its offsets, sizes and ``placement.rank()``;
``compute_kernel`` is accepted and ignored. The order of the row shards of a table-row-wise
table matters (owner ``j``'s pools are finished by shard ``j mod m``); it is kept.

A plan that does not fit the workload is refused with an error naming the table and the field:
an unknown or missing table, an unknown sharding type, shards that do not tile the table as
their type requires, a rank out of range, a table-row/column-wise table over more than one
node, or more bytes on a rank than its HBM (or host tier) holds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from neonic.host.planner.plan import TIERS, Plan, Shard, ShardingType, TablePlan
from neonic.host.planner.system import GIB, PlannerSystem
from neonic.host.workloads.spec import WorkloadSpec

__all__ = ["PLAN_FORMAT", "plan_to_dict", "plan_from_dict", "save_plan", "load_plan"]

PLAN_FORMAT = "neonic.plan/1"
_TOP = ("format", "world_size", "gpus_per_node", "planner", "workload", "notes", "tables")
_TABLE = ("sharding_type", "ranks", "shards", "compute_kernel")
_SHARD = ("rank", "shard_offsets", "shard_sizes", "tier")
ST = ShardingType


def plan_to_dict(plan: Plan, workload: WorkloadSpec | None = None) -> dict[str, Any]:
    """The plan as the JSON object of the module doc (every shard written out)."""
    tables = {}
    for tp in plan:
        tables[tp.table] = {
            "sharding_type": tp.sharding.value,
            "ranks": [s.rank for s in tp.shards],
            "shards": [{"rank": s.rank, "shard_offsets": [s.row_start, s.col_start], "shard_sizes": [s.rows, s.cols],
                        "tier": s.tier} for s in tp.shards],
        }
    out: dict[str, Any] = {"format": PLAN_FORMAT, "world_size": plan.world_size, "gpus_per_node": plan.gpus_per_node,
                           "planner": plan.planner}
    if workload is not None:
        out["workload"] = workload.name
    if plan.notes:
        out["notes"] = list(plan.notes)
    out["tables"] = tables
    return out


def save_plan(plan: Plan, path: str | Path, workload: WorkloadSpec | None = None) -> Path:
    """Write ``plan`` to ``path`` (JSON, see the module doc)."""
    path = Path(path)
    data = plan_to_dict(plan, workload)
    tables = data.pop("tables")
    head = json.dumps(data, indent=1)[:-2]  # without the closing brace
    rows = ",\n".join(f"  {json.dumps(name)}: {json.dumps(entry, separators=(',', ':'))}" for name, entry in tables.items())
    path.write_text(f"{head},\n \"tables\": {{\n{rows}\n }}\n}}\n", encoding="utf-8")
    return path


def load_plan(path: str | Path, workload: WorkloadSpec, system: PlannerSystem) -> Plan:
    """Read and check a plan file against ``workload`` on ``system`` (see the module doc)."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"planner.plan: file {str(path)!r} does not exist")
    if path.is_dir():
        raise ValueError(f"planner.plan: {str(path)!r} is a folder; expected a plan file (JSON)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"planner.plan: {str(path)!r} is not a UTF-8 text file; expected a plan "
                         f"file (JSON)") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON: {error}") from None
    return plan_from_dict(data, workload, system, source=str(path))


def _int(where: str, value: Any, lo: int, hi: int | None = None) -> int:
    """An integer in ``[lo, hi)`` (``hi`` exclusive, e.g. the world size for a rank), checked
    and worded by the shared config vocabulary (:func:`neonic.sim.schema.integer`)."""
    from neonic.sim.schema import integer

    return integer(where, value, lo, None if hi is None else hi - 1)


def _pair(where: str, value: Any, lo: int) -> tuple[int, int]:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ValueError(f"{where}: expected [rows, columns], got {value!r}")
    return _int(f"{where}[0]", value[0], lo), _int(f"{where}[1]", value[1], lo)


def _known(where: str, data: Mapping[str, Any], known: tuple[str, ...]) -> None:
    for key in data:
        if key not in known:
            raise ValueError(f"{where}.{key}: unknown field; expected one of {', '.join(known)}")


def plan_from_dict(data: Any, workload: WorkloadSpec, system: PlannerSystem, source: str = "plan") -> Plan:
    """A :class:`Plan` from the JSON object of the module doc, checked against ``workload`` on
    ``system``; a ``ValueError`` names the table and the field of anything that does not fit."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{source}: expected a JSON object, got {type(data).__name__}")
    _known(source, data, _TOP)
    fmt = data.get("format", PLAN_FORMAT)
    if fmt != PLAN_FORMAT:
        raise ValueError(f"{source}: format: expected {PLAN_FORMAT!r}, got {fmt!r}")
    world, g = system.world_size, system.gpus_per_node
    for key, want in (("world_size", world), ("gpus_per_node", g)):
        if key not in data:
            raise ValueError(f"{source}: {key}: required (the scenario has {want})")
        got = _int(f"{source}: {key}", data[key], 1)
        if got != want:
            raise ValueError(f"{source}: {key}: the plan is for {got}, the scenario's cluster has {want}")
    tables = data.get("tables")
    if not isinstance(tables, Mapping):
        raise ValueError(f"{source}: tables: expected an object of table name -> placement, got {tables!r}")
    specs = {t.name: t for t in workload.tables}
    for name in tables:
        if name not in specs:
            raise ValueError(f"{source}: tables.{name}: unknown table (the workload {workload.name!r} has no such table)")
    for t in workload.tables:
        if t.name not in tables:
            raise ValueError(f"{source}: tables.{t.name}: missing (every table of workload {workload.name!r} needs a placement)")
    placed: dict[str, TablePlan] = {}
    for t in workload.tables:
        where = f"{source}: tables.{t.name}"
        entry = tables[t.name]
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where}: expected an object with sharding_type, ranks, shards, got {entry!r}")
        _known(where, entry, _TABLE)
        kind_name = entry.get("sharding_type")
        try:
            kind = ShardingType(kind_name)
        except ValueError:
            raise ValueError(f"{where}.sharding_type: expected one of {', '.join(k.value for k in ShardingType)}, "
                             f"got {kind_name!r}") from None
        ranks = entry.get("ranks")
        if not isinstance(ranks, list) or not ranks:
            raise ValueError(f"{where}.ranks: expected a non-empty list of ranks, got {ranks!r}")
        ranks = [_int(f"{where}.ranks[{i}]", r, 0, world) for i, r in enumerate(ranks)]
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"{where}.ranks: a rank appears twice: {ranks}")
        raw = entry.get("shards")
        if raw is None:
            if kind == ST.TABLE_WISE:
                raw = [{"rank": ranks[0], "shard_offsets": [0, 0], "shard_sizes": [t.rows, t.dim]}]
            elif kind == ST.DATA_PARALLEL:
                raw = [{"rank": r, "shard_offsets": [0, 0], "shard_sizes": [t.rows, t.dim]} for r in ranks]
            else:
                raise ValueError(f"{where}.shards: required for sharding_type {kind.value}")
        if not isinstance(raw, list) or not raw:
            raise ValueError(f"{where}.shards: expected a non-empty list of shards, got {raw!r}")
        shards = []
        for i, sh in enumerate(raw):
            w = f"{where}.shards[{i}]"
            if not isinstance(sh, Mapping):
                raise ValueError(f"{w}: expected an object with rank, shard_offsets, shard_sizes, got {sh!r}")
            _known(w, sh, _SHARD)
            for key in ("rank", "shard_offsets", "shard_sizes"):
                if key not in sh:
                    raise ValueError(f"{w}.{key}: required")
            rank = _int(f"{w}.rank", sh["rank"], 0, world)
            r0, c0 = _pair(f"{w}.shard_offsets", sh["shard_offsets"], 0)
            nr, nc = _pair(f"{w}.shard_sizes", sh["shard_sizes"], 1)
            if r0 + nr > t.rows or c0 + nc > t.dim:
                raise ValueError(f"{w}: rows [{r0}, {r0 + nr}) x columns [{c0}, {c0 + nc}) outside the table's "
                                 f"{t.rows} x {t.dim}")
            tier = sh.get("tier", "hbm")
            if tier not in TIERS:
                raise ValueError(f"{w}.tier: expected one of {', '.join(TIERS)}, got {tier!r}")
            shards.append(Shard(rank, r0, r0 + nr, c0, c0 + nc, tier))
        if [s.rank for s in shards] != ranks:
            raise ValueError(f"{where}.ranks: expected the shards' ranks in shard order, "
                             f"{[s.rank for s in shards]}, got {ranks}")
        _check_tiling(where, t, kind, shards, world, g)
        placed[t.name] = TablePlan(t.name, kind, tuple(shards))
    notes = data.get("notes", [])
    plan = Plan(world, g, placed, planner=str(data.get("planner", "file")),
                notes=tuple(str(n) for n in notes) if isinstance(notes, list) else ())
    _check_memory(source, plan, workload, system)
    return plan


def _check_tiling(where: str, t, kind: ShardingType, shards: list[Shard], world: int, g: int) -> None:
    """The shards cover the table as ``kind`` requires, each element exactly once."""
    full_rows = all(s.row_start == 0 and s.row_end == t.rows for s in shards)
    full_cols = all(s.col_start == 0 and s.col_end == t.dim for s in shards)
    if kind == ST.TABLE_WISE:
        if len(shards) != 1 or not (full_rows and full_cols):
            raise ValueError(f"{where}.shards: table_wise takes one shard of the whole table "
                             f"({t.rows} x {t.dim}), got {len(shards)}")
        return
    if kind == ST.DATA_PARALLEL:
        if not (full_rows and full_cols) or sorted(s.rank for s in shards) != list(range(world)):
            raise ValueError(f"{where}.shards: data_parallel takes a whole replica on every one of the {world} ranks")
        return
    if kind in (ST.ROW_WISE, ST.TABLE_ROW_WISE):
        if not full_cols:
            raise ValueError(f"{where}.shards: {kind.value} shards take every column (shard_offsets [r, 0], "
                             f"shard_sizes [n, {t.dim}])")
        spans, total, what = sorted((s.row_start, s.row_end) for s in shards), t.rows, "rows"
    else:
        if not full_rows:
            raise ValueError(f"{where}.shards: {kind.value} shards take every row (shard_offsets [0, c], "
                             f"shard_sizes [{t.rows}, n])")
        spans, total, what = sorted((s.col_start, s.col_end) for s in shards), t.dim, "columns"
    at = 0
    for a, b in spans:
        if a != at:
            gap = "overlap" if a < at else "gap"
            raise ValueError(f"{where}.shards: the shards' {what} do not tile [0, {total}): {gap} at {min(a, at)}")
        at = b
    if at != total:
        raise ValueError(f"{where}.shards: the shards' {what} do not tile [0, {total}): they end at {at}")
    if kind in (ST.TABLE_ROW_WISE, ST.TABLE_COLUMN_WISE) and len({s.rank // g for s in shards}) > 1:
        raise ValueError(f"{where}.ranks: {kind.value} keeps a table inside one node; ranks "
                         f"{sorted(s.rank for s in shards)} span nodes {sorted({s.rank // g for s in shards})}")


def _check_memory(source: str, plan: Plan, workload: WorkloadSpec, system: PlannerSystem) -> None:
    """No rank holds more than its HBM (or its share of the node's DRAM / SSD)."""
    from neonic.host.planner.work import table_work

    world = system.world_size
    use = np.zeros((3, world))
    biggest: dict[tuple[int, int], tuple[float, str]] = {}
    specs = {t.name: t for t in workload.tables}
    for tp in plan:
        tw = table_work(specs[tp.table], tp, workload, system)
        for k in tw.kernels:
            tiers = [(0, k.hbm_bytes)]
            if k.tier != "hbm":
                tiers.append((1 if k.tier == "dram" else 2, k.host_bytes))
            for tier, nbytes in tiers:
                use[tier, k.rank] += nbytes
                if nbytes > biggest.get((tier, k.rank), (0.0, ""))[0]:
                    biggest[(tier, k.rank)] = (nbytes, tp.table)
    caps = (system.hbm_capacity, system.dram_capacity, system.ssd_capacity)
    names = ("HBM", "DRAM", "SSD")
    for tier in range(3):
        over = np.nonzero(use[tier] > caps[tier] * (1 + 1e-9) + 1e-6)[0]
        if over.size:
            r = int(over[0])
            nbytes, table = biggest.get((tier, r), (0.0, "?"))
            raise ValueError(
                f"{source}: tables.{table}.ranks: rank {r} would hold {use[tier, r] / GIB:.2f} GiB in {names[tier]}, "
                f"more than its {caps[tier] / GIB:.2f} GiB (its largest shard: table {table!r}, {nbytes / GIB:.2f} GiB)")
