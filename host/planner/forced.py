"""One sharding type for a set of tables: the ``force:<type>`` planners, and the class moves of
Neo's search (:mod:`host.planner.search`) that retype a whole class of tables at once.

Each table, largest first, takes the type: table-wise onto the least-loaded rank with room,
row-wise over all ranks, column-wise over up to 8 of the least-loaded ranks with room,
table-row-wise / table-column-wise over the least-loaded node, data-parallel on every rank; a
table that cannot take the type within the memory caps falls back to row-wise over all ranks
(where some rank has no room: over the half, quarter... of the ranks with the most HBM free),
and the plan's notes say how many did.
"""

from __future__ import annotations

import numpy as np

from neonic.host.planner.cost import CostModel
from neonic.host.planner.placer import Placer
from neonic.host.planner.plan import Plan, ShardingType
from neonic.host.planner.system import PlannerSystem
from neonic.host.workloads.spec import TableSpec, WorkloadSpec

__all__ = ["FORCED_NAMES", "plan_forced", "place_forced", "forced_fallbacks"]

ST = ShardingType

#: ``force:`` names, one per sharding type (``force:table-wise``, ``force:row-wise``, ...).
FORCED_NAMES: tuple[str, ...] = tuple(f"force:{t.value.replace('_', '-')}" for t in ShardingType)
_FALLBACK_NOTE = "tables fallen back to row-wise: "


def forced_fallbacks(plan: Plan) -> int:
    """How many tables of a forced plan fell back to row-wise (0 for other plans)."""
    for note in plan.notes:
        if note.startswith(_FALLBACK_NOTE):
            return int(note[len(_FALLBACK_NOTE):])
    return 0


def place_forced(p: Placer, tables: list[TableSpec], st: ShardingType, group: int | None = None) -> int | None:
    """Place ``tables`` on ``p``'s current state with type ``st`` (see the module doc); the
    number of fallbacks to row-wise, or None if a table fits nowhere (``p`` then holds the
    tables placed so far). ``group``: table-row-wise / table-column-wise tables go over that
    many consecutive ranks of a node (a divisor of the node's ranks, from a multiple of it: an
    aligned half, quarter... of a node), the least-loaded such group with room; None: a whole
    node."""
    world, g = p.world, p.g
    if group is not None and (isinstance(group, bool) or not isinstance(group, int) or group < 1 or g % group):
        raise ValueError(f"group: expected a divisor of the {g} GPUs per node, got {group!r}")
    fallbacks = 0
    for table in sorted(tables, key=lambda t: -float(p.workload.table_memory_bytes(t))):
        tp = None
        if st not in (ST.ROW_WISE, ST.DATA_PARALLEL):  # the others go by the ranks' load
            totals = p.totals()
        if st == ST.TABLE_WISE:
            size = p.shard_bytes(table, table.rows, table.dim)
            room = (p.caps[0] - p.state.hbm) >= size
            # the first rank in load order (a stable sort of the totals) with room: the least
            # loaded with room, the lowest on a tie (no sort where the totals are finite)
            low = np.where(room, totals, np.inf)
            r = int(np.argmin(low))
            if room.any() and np.isfinite(low[r]):
                tp = p.make(table, st, [r])
            else:
                order = np.argsort(totals, kind="stable")
                room = room[order]
                if room.any():
                    tp = p.make(table, st, [int(order[int(room.argmax())])])
                else:
                    tp = next((x for x in (p.make(table, st, [r]) for r in order.tolist()) if x is not None), None)
        elif st == ST.ROW_WISE:
            tp = p.make(table, st, list(range(world)))
        elif st == ST.COLUMN_WISE:
            m = max(1, min(8, world, table.dim // 4))
            order = np.argsort(totals, kind="stable")
            # the least-loaded ranks with HBM for a column shard (the least-loaded ones if too few)
            room = (p.caps[0] - p.state.hbm) >= p.shard_bytes(table, table.rows, -(-table.dim // m))
            fit = order[room[order]]
            tp = p.make(table, st, sorted((fit[:m] if len(fit) >= m else order[:m]).tolist()))
        elif st in (ST.TABLE_ROW_WISE, ST.TABLE_COLUMN_WISE) and group is not None and group != g:
            m = group if st == ST.TABLE_ROW_WISE else max(1, min(group, table.dim // 4))
            for k in np.argsort(totals.reshape(-1, group).sum(axis=1), kind="stable"):
                tp = p.make(table, st, list(range(int(k) * group, int(k) * group + m)))
                if tp is not None:
                    break
        elif st in (ST.TABLE_ROW_WISE, ST.TABLE_COLUMN_WISE):
            node_load = totals.reshape(-1, g).sum(axis=1)
            for node in np.argsort(node_load, kind="stable"):
                ranks = list(range(int(node) * g, (int(node) + 1) * g))
                if st == ST.TABLE_COLUMN_WISE:
                    ranks = ranks[: max(1, min(g, table.dim // 4))]
                tp = p.make(table, st, ranks)
                if tp is not None:
                    break
        else:  # data-parallel
            tp = p.make(table, st, [])
        if tp is None:
            fallbacks += 1
            tp = p.make(table, ST.ROW_WISE, list(range(world)))
            # row-wise over all ranks needs room on each: else over the half, quarter... of the
            # ranks with the most HBM free
            free = np.argsort(-(p.caps[0] - p.state.hbm), kind="stable").tolist()
            m = world // 2
            while tp is None and m >= 2:
                tp = p.make(table, ST.ROW_WISE, sorted(free[:m]))
                m //= 2
        if tp is None:
            return None
        p.place(tp)
    return fallbacks


def plan_forced(kind: ShardingType | str, workload: WorkloadSpec, system: PlannerSystem,
                cost: CostModel | None = None, tw_cache: dict | None = None) -> Plan:
    """Every table with sharding ``kind`` (see the module doc); the fallbacks are in the plan's
    notes (:func:`forced_fallbacks`)."""
    try:
        st = ShardingType(kind)
    except ValueError:
        raise ValueError(f"kind: expected one of {', '.join(t.value for t in ShardingType)}, got {kind!r}") from None
    p = Placer(workload, system, cost, tw_cache=tw_cache)
    fallbacks = place_forced(p, list(workload.tables), st)
    if fallbacks is None:
        missing = next(t for t in sorted(workload.tables, key=lambda t: -float(workload.table_memory_bytes(t)))
                       if t.name not in p.placed)
        raise p.fits_nowhere(missing)
    return p.plan(f"force:{st.value.replace('_', '-')}", (f"{_FALLBACK_NOTE}{fallbacks}",))
