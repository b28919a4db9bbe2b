"""Where a run's embedding lookups come from: trace files, fitted locality statistics, or Zipf.

A scenario may say, per workload or per table, what drives the lookups (``[lookups]``)::

    [lookups]
    alpha = 1.15                       # Zipf exponent of the default (by mode: 1.15 training,
                                       # 1.09 inference; REFERENCES.md, FBGEMM's TBE benchmark)
    trace = "batch.npz"                # every table from this .npz trace (host.traces format)
    locality_stats = "stats.txt"       # or: fit every table to a block of locality statistics
    locality_block = "0"
    max_lookups = 262144               # lookups drawn per iteration at most (a sample beyond)
    [lookups.tables.t0]                # one table's source (same fields: trace, or
    trace = "t0.npz"                   # locality_stats + locality_block, or zipf = true)

A table's source is, first to last: its ``[lookups.tables.NAME]`` entry, the workload table's
own ``trace``/``locality_stats`` fields (``host.workloads``), the ``[lookups]`` default, Zipf.

Matching a trace file to the workload: the tables that name the same file take the file's
tables in workload order (the file holds exactly that many tables, each with the table's
``rows``); the file's batch is a whole number of ranks' batches (``batch_per_gpu``). A file
of the whole global batch gives rank ``q`` bags ``q * batch_per_gpu ...`` in order; any other
size is a sample of the iteration spread evenly over the ranks (``sim.lookups.requesters_of``;
ASSUMPTION: every rank's samples look like the file's), ``scale`` counting the real bags per
traced bag. A missing, unreadable or mismatched file is a ``ValueError`` naming the table
and the field (``neonic run`` exits 2 with it). A locality fit draws a batch of the table's
mean pooling times the sampled bags, over the table's rows (``host.traces.fit_generator``).

:func:`build_lookups` returns the :class:`~sim.lookups.LookupBatch` every consumer of the run
uses (``sim.lookups``): planner and runtime (shares of lookups per row shard), the SmartNIC
caches, the HBM software cache of host-memory tiers, and the RTL backend. Its Zipf tables are
drawn when first read (``sim.lookups``): a run whose consumers price them from ``alpha`` and
rows alone (a plan on GPUs, its HBM caches) never draws them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from neonic.sim.lookups import ZIPF_ALPHA, LookupBatch, TableLookups, draw_lookups, requesters_of

__all__ = ["TableSource", "LookupsSpec", "lookups_from_dict", "build_lookups", "DEFAULT_MAX_LOOKUPS"]

#: Lookups drawn per iteration at most (over all tables); beyond it each table is sampled.
DEFAULT_MAX_LOOKUPS = 1 << 18


@dataclass(frozen=True)
class TableSource:
    """One source: ``kind`` zipf | trace | locality, with its file (and block)."""

    kind: str = "zipf"
    path: Path | None = None
    block: str | None = None
    field: str = "lookups"          # the dotted field that named it (for errors)

    def label(self, alpha: float) -> str:
        if self.kind == "trace":
            return f"trace:{self.path}"
        if self.kind == "locality":
            return f"locality:{self.path}#{self.block}"
        return f"zipf(alpha={alpha:g})"


@dataclass(frozen=True)
class LookupsSpec:
    """The scenario's ``[lookups]`` section (see the module doc)."""

    alpha: float | None = None
    default: TableSource = field(default_factory=TableSource)
    tables: dict[str, TableSource] = field(default_factory=dict)
    max_lookups: int = DEFAULT_MAX_LOOKUPS

    def to_dict(self) -> dict[str, Any]:
        def src(s: TableSource) -> dict[str, Any]:
            if s.kind == "trace":
                return {"trace": str(s.path)}
            if s.kind == "locality":
                return {"locality_stats": str(s.path), "locality_block": s.block}
            return {"zipf": True}
        out: dict[str, Any] = {"max_lookups": self.max_lookups, **src(self.default)}
        if self.alpha is not None:
            out["alpha"] = self.alpha
        if self.tables:
            out["tables"] = {k: src(v) for k, v in self.tables.items()}
        return out


def _source(path: str, data: Mapping[str, Any], base: Path | None) -> TableSource:
    known = ("trace", "locality_stats", "locality_block", "zipf")
    for k in data:
        if k not in known and k not in ("alpha", "max_lookups", "tables"):
            raise ValueError(f"{path}.{k}: unknown field; expected one of {', '.join(known)}")
    has_trace = "trace" in data
    has_loc = "locality_stats" in data
    if has_trace and has_loc:
        raise ValueError(f"{path}.trace: give trace or locality_stats, not both")
    if ("locality_block" in data) != has_loc:
        raise ValueError(f"{path}.locality_block: locality_stats and locality_block go together")

    def file(key: str) -> Path:
        v = data[key]
        if not isinstance(v, str) or not v:
            raise ValueError(f"{path}.{key}: expected a file path, got {v!r}")
        p = Path(v)
        return p if p.is_absolute() or base is None else base / p

    if has_trace:
        return TableSource("trace", file("trace"), None, f"{path}.trace")
    if has_loc:
        block = data["locality_block"]
        if not isinstance(block, (str, int)) or isinstance(block, bool):
            raise ValueError(f"{path}.locality_block: expected a block name or number, got {block!r}")
        return TableSource("locality", file("locality_stats"), str(block), f"{path}.locality_stats")
    if "zipf" in data and data["zipf"] is not True:
        raise ValueError(f"{path}.zipf: expected true, got {data['zipf']!r}")
    return TableSource("zipf", None, None, path)


def lookups_from_dict(data: Any, base: Path | None = None, path: str = "lookups") -> LookupsSpec:
    """Validate a scenario's ``[lookups]`` table (errors name the dotted field)."""
    if data is None:
        return LookupsSpec()
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: expected a table, got {type(data).__name__}")
    alpha = data.get("alpha")
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 10):
        raise ValueError(f"{path}.alpha: expected a number in [0, 10], got {alpha!r}")
    ml = data.get("max_lookups", DEFAULT_MAX_LOOKUPS)
    if isinstance(ml, bool) or not isinstance(ml, int) or ml < 1024:
        raise ValueError(f"{path}.max_lookups: expected an integer >= 1024, got {ml!r}")
    tables = data.get("tables", {})
    if not isinstance(tables, Mapping):
        raise ValueError(f"{path}.tables: expected a table of tables, got {type(tables).__name__}")
    per: dict[str, TableSource] = {}
    for name, t in tables.items():
        if not isinstance(t, Mapping):
            raise ValueError(f"{path}.tables.{name}: expected a table, got {type(t).__name__}")
        for k in ("alpha", "max_lookups", "tables"):
            if k in t:
                raise ValueError(f"{path}.tables.{name}.{k}: unknown field (set it in [{path}])")
        per[str(name)] = _source(f"{path}.tables.{name}", t, base)
    return LookupsSpec(None if alpha is None else float(alpha), _source(path, data, base), per, ml)


def _table_source(spec: LookupsSpec, table: Any) -> TableSource:
    if table.name in spec.tables:
        return spec.tables[table.name]
    if getattr(table, "trace", None) is not None:
        return TableSource("trace", Path(table.trace), None, f"workload.tables.{table.name}.trace")
    if getattr(table, "locality_stats", None) is not None:
        return TableSource("locality", Path(table.locality_stats), str(table.locality_block),
                           f"workload.tables.{table.name}.locality_stats")
    return spec.default


def _load_trace(src: TableSource, who: str):
    from neonic.host.traces import load_trace

    if not src.path.exists():
        raise ValueError(f"{src.field} (table {who}): file {str(src.path)!r} does not exist")
    try:
        return load_trace(src.path)
    except ValueError as error:
        raise ValueError(f"{src.field} (table {who}): {error}") from None


def build_lookups(workload: Any, spec: LookupsSpec, *, world: int, mode: str, seed: int,
                  min_bags: int = 0) -> LookupBatch:
    """The run's lookups (see the module doc). Errors name the table and the field.
    ``min_bags``: a sampled table draws at least this many bags (e.g. the SmartNIC caches'
    ``trace_samples``)."""
    alpha = spec.alpha if spec.alpha is not None else ZIPF_ALPHA[mode]
    b = workload.batch_per_gpu
    tables = list(workload.tables)
    sources = {t.name: _table_source(spec, t) for t in tables}
    for name in spec.tables:
        if name not in sources:
            raise ValueError(f"lookups.tables.{name}: no table of that name in workload {workload.name!r}")
    total = sum(max(t.pooling, 1e-9) for t in tables) * world * b
    max_bags = None
    if total > spec.max_lookups:
        # the same number of bags per table: every table's sample covers the same samples
        max_bags = max(2 * world, min_bags, int(spec.max_lookups / max(1e-9, sum(t.pooling for t in tables))))
    given: dict[str, TableLookups] = {}
    # trace files: the tables that name a file take its tables in workload order
    by_file: dict[Path, list[Any]] = {}
    for t in tables:
        src = sources[t.name]
        if src.kind == "trace":
            by_file.setdefault(src.path.resolve(), []).append(t)
    for _, users in by_file.items():
        first = sources[users[0].name]
        trace = _load_trace(first, users[0].name)
        if trace.num_tables != len(users):
            raise ValueError(f"{first.field} (table {users[0].name}): tables: the file holds {trace.num_tables} "
                             f"table(s), {len(users)} table(s) of the workload name it "
                             f"({', '.join(u.name for u in users)})")
        if trace.batch_size % b:
            raise ValueError(f"{first.field} (table {users[0].name}): batch_size: the file's batch of "
                             f"{trace.batch_size} bags is not a whole number of ranks' batches "
                             f"(batch_per_gpu = {b})")
        for t, tt in zip(users, trace.tables):
            src = sources[t.name]
            if tt.num_rows != t.rows:
                raise ValueError(f"{src.field} (table {t.name}): rows: the file's table has {tt.num_rows} rows, "
                                 f"the workload's {t.rows}")
            bags = tt.lengths.size
            requester = requesters_of(bags, world, b)
            given[t.name] = TableLookups(t.name, t.rows, tt.lengths, tt.indices, requester,
                                         scale=world * b / bags, source=src.label(alpha))
    for i, t in enumerate(tables):
        src = sources[t.name]
        if src.kind != "locality":
            continue
        given[t.name] = _locality_lookups(t, src, i, world=world, batch_per_gpu=b, seed=seed,
                                          max_bags=max_bags, alpha=alpha)
    return draw_lookups(tables, world=world, batch_per_gpu=b, seed=seed, alpha=alpha, max_bags=max_bags,
                        given=given)


def _locality_lookups(t: Any, src: TableSource, index: int, *, world: int, batch_per_gpu: int, seed: int,
                      max_bags: int | None, alpha: float) -> TableLookups:
    from neonic.host.traces import fit_generator, load_locality_stats

    if not src.path.exists():
        raise ValueError(f"{src.field} (table {t.name}): file {str(src.path)!r} does not exist")
    try:
        stats = load_locality_stats(src.path, int(src.block) if src.block.lstrip("-").isdigit() else src.block)
    except ValueError as error:
        raise ValueError(f"{src.field} (table {t.name}): {error}") from None
    if isinstance(stats, list):
        stats = stats[0]
    total = world * batch_per_gpu
    bags = total if max_bags is None else min(total, max_bags)
    lookups = max(1, int(round(bags * t.pooling)))
    try:
        gen = fit_generator(stats, lookups=lookups, num_tables=1, batch_size=bags, rows_per_table=t.rows)
        trace = gen.generate(np.random.default_rng([seed, 0x10CA, index]))
    except ValueError as error:
        raise ValueError(f"{src.field} (table {t.name}): cannot fit {lookups} lookups over {t.rows} rows: "
                         f"{error}") from None
    tt = trace.tables[0]
    return TableLookups(t.name, t.rows, tt.lengths, tt.indices, requesters_of(bags, world, batch_per_gpu),
                        scale=total / bags, source=src.label(alpha))
