"""The simple planners people use, costed in the same model as Neo's search.

``size-greedy``         tables by size (bytes), largest first, table-wise onto the rank holding
                        the fewest bytes;
``lookup-greedy``       by lookups per sample (pooling), onto the rank with the fewest lookups;
``size-lookup-greedy``  by dim x pooling x log10(rows), onto the rank with the least of it;
``torchrec-greedy``     like TorchRec's planner: each table takes the sharding type with the
                        lowest estimate *of its own* (the slowest rank of that table alone),
                        then shards are bin-packed, largest estimate first, onto the rank with
                        the least accumulated estimate, under the memory caps.

A table too large for one GPU is placed first and split row-wise over as many of the lightest ranks (by the
planner's own measure) as it needs, in all four; tiers are chosen to fit (HBM, then DRAM/SSD
behind the cache), so every plan respects every capacity.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from neonic.host.planner.cost import CostModel
from neonic.host.planner.plan import Plan, ShardingType
from neonic.host.planner.placer import Placer
from neonic.host.planner.system import PlannerSystem
from neonic.host.workloads.spec import TableSpec, WorkloadSpec

__all__ = ["BASELINES", "plan_baseline"]

ST = ShardingType


def _weight_greedy(name: str, weight: Callable[[TableSpec, WorkloadSpec], float]):
    def run(workload: WorkloadSpec, system: PlannerSystem, cost: CostModel | None = None,
            tw_cache: dict | None = None) -> Plan:
        p = Placer(workload, system, cost, tw_cache=tw_cache)
        load = np.zeros(p.world)
        too_big = lambda t: p.shard_bytes(t, t.rows, t.dim) > p.caps[0]  # noqa: E731  split these first
        for table in sorted(workload.tables, key=lambda t: (not too_big(t), -weight(t, workload))):
            w = weight(table, workload)
            size = p.shard_bytes(table, table.rows, table.dim)
            tp = None
            if size <= p.caps[0]:
                # the first rank in load order (a stable sort of the loads) whose free HBM holds
                # the whole table (where make() would choose the "hbm" tier): the least loaded
                # with room, the lowest on a tie (the loads are finite), found without the sort
                room = (p.caps[0] - p.state.hbm) >= size
                if room.any():
                    tp = p.make(table, ST.TABLE_WISE, [int(np.argmin(np.where(room, load, np.inf)))])
            order = None if tp is not None else np.argsort(load, kind="stable").tolist()
            m = max(2, math.ceil(size / p.caps[0]))
            while tp is None and m < p.world:
                tp = p.make(table, ST.ROW_WISE, sorted(order[:m]))
                m *= 2
            if tp is None:
                tp = p.make(table, ST.ROW_WISE, list(range(p.world)))
            if tp is None:  # no HBM anywhere: any rank through the cache
                tp = next((x for x in (p.make(table, ST.TABLE_WISE, [r]) for r in order) if x is not None), None)
            if tp is None:
                raise p.fits_nowhere(table)
            p.place(tp)
            # (each shard's share of the weight, added rank by rank as one shard at a time
            # would: without a shard object per rank of a row-wise plan)
            ranks, pieces, _ = tp.shard_arrays()
            np.add.at(load, ranks, w * ((pieces[1] - pieces[0]) * (pieces[3] - pieces[2])) / (table.rows * table.dim))
        return p.plan(name)

    return run


def _torchrec(workload: WorkloadSpec, system: PlannerSystem, cost: CostModel | None = None,
              tw_cache: dict | None = None) -> Plan:
    p = Placer(workload, system, cost, tw_cache=tw_cache)
    g, world = p.g, p.world
    load = np.zeros(world)
    choices = []
    for table in workload.tables:
        best = None
        size = p.shard_bytes(table, table.rows, table.dim)
        options = [(ST.TABLE_WISE, [0]), (ST.ROW_WISE, list(range(world))), (ST.TABLE_ROW_WISE, list(range(g)))]
        for m in (2, 4, 8):
            if m <= min(world, table.dim // 4):
                options.append((ST.COLUMN_WISE, list(range(m))))
        if size < 0.05 * p.caps[0]:
            options.append((ST.DATA_PARALLEL, []))
        for kind, ranks in options:
            tp = p.make(table, kind, ranks)
            if tp is None:
                continue
            est = float(p.cost.totals(_alone(p, tp)).max())
            if best is None or est < best[0]:
                best = (est, kind, tp.shard_count)
        if best is None:
            raise p.fits_nowhere(table)
        choices.append((best[0], table, best[1], best[2]))
    for est, table, kind, m in sorted(choices, key=lambda c: -c[0]):
        # the ranks in load order (a stable sort), made where a choice reads them: the
        # table-row-wise and data-parallel choices, most of them, do not
        order: list[int] | None = None
        tp = None
        if kind in (ST.ROW_WISE, ST.DATA_PARALLEL):
            tp = p.make(table, kind, list(range(world)))
        elif kind == ST.TABLE_ROW_WISE:
            node_load = load.reshape(-1, g).sum(axis=1)
            for node in np.argsort(node_load, kind="stable"):
                tp = p.make(table, kind, list(range(int(node) * g, (int(node) + 1) * g)))
                if tp is not None:
                    break
        elif kind == ST.COLUMN_WISE:
            order = np.argsort(load, kind="stable").tolist()
            tp = p.make(table, kind, sorted(order[:m]))
        else:
            # the first rank in load order on which it fits: the least loaded (the lowest on a
            # tie, as the sort has it first), else the others in order
            tp = p.make(table, kind, [int(np.argmin(load))])
            if tp is None:
                order = np.argsort(load, kind="stable").tolist()
                tp = next((x for x in (p.make(table, kind, [r]) for r in order[1:]) if x is not None), None)
        if tp is None:
            order = order or np.argsort(load, kind="stable").tolist()
            tp = p.make(table, ST.ROW_WISE, list(range(world)))
        if tp is None:  # row-wise needs room on every rank: the whole table on one with room
            tp = next((x for x in (p.make(table, ST.TABLE_WISE, [r]) for r in order) if x is not None), None)
        if tp is None:
            raise p.fits_nowhere(table)
        p.place(tp)
        per_shard = est / tp.shard_count if kind != ST.DATA_PARALLEL else est
        np.add.at(load, tp.shard_arrays()[0], per_shard)
    return p.plan("torchrec-greedy")


def _alone(p: Placer, tp):
    """The state of ``tp`` alone, by its distinct columns (:meth:`Placer.distinct_columns`):
    its per-rank totals' maximum is the whole state's, bit for bit, without a 29 x world
    array per option (TorchRec's estimate prices 7 options of every table)."""
    from neonic.host.planner.cost import State

    c = p.distinct_columns(tp)
    st = State.empty(c.vec.shape[1])
    st.add(c)
    return st


BASELINES: dict[str, Callable[..., Plan]] = {
    "size-greedy": _weight_greedy("size-greedy", lambda t, w: float(w.table_memory_bytes(t))),
    "lookup-greedy": _weight_greedy("lookup-greedy", lambda t, w: t.pooling),
    "size-lookup-greedy": _weight_greedy("size-lookup-greedy", lambda t, w: t.dim * t.pooling * math.log10(max(t.rows, 2))),
    "torchrec-greedy": _torchrec,
}


def plan_baseline(name: str, workload: WorkloadSpec, system: PlannerSystem, cost: CostModel | None = None,
                  tw_cache: dict | None = None) -> Plan:
    """The plan of baseline ``name`` (one of :data:`BASELINES`). ``tw_cache``: a table-wise
    contribution cache shared with another placer of the same workload, system and cost model
    (``Placer(tw_cache=...)``), so that tables are costed once."""
    if name not in BASELINES:
        raise ValueError(f"baseline: unknown {name!r}; expected one of {', '.join(BASELINES)}")
    return BASELINES[name](workload, system, cost, tw_cache=tw_cache)
