"""One entry point for every planner: Neo's search, each baseline, or one forced sharding type.

``make_plan(workload, system, planner="neo")`` is what the cluster runtime (``[planner] name``)
and the experiments call; :data:`PLANNER_NAMES` lists the names it takes:

``neo``                    Neo's search (:func:`host.planner.search.plan_neo`), deterministic
                           (bounded by ``max_steps``; ``time_budget_s`` an opt-in safety);
``size-greedy`` ...        a baseline of :data:`host.planner.baselines.BASELINES`;
``force:<type>``           every table given one sharding type (``force:row-wise``, ...;
                           :func:`plan_forced`).

A forced plan gives each table, largest first, the type: table-wise onto the least-loaded rank
with room, row-wise over all ranks, column-wise over up to 8 of the least-loaded ranks,
table-row-wise / table-column-wise over the least-loaded node, data-parallel on every rank; a
table that cannot take the type within the memory caps falls back to row-wise over all ranks,
and the plan's notes say how many did.
"""

from __future__ import annotations

import numpy as np

from neonic.host.planner.baselines import BASELINES, plan_baseline
from neonic.host.planner.cost import CostModel
from neonic.host.planner.plan import Plan, ShardingType
from neonic.host.planner.search import DEFAULT_MAX_STEPS, Placer, plan_neo
from neonic.host.planner.system import PlannerSystem
from neonic.host.workloads.spec import WorkloadSpec

__all__ = ["PLANNER_NAMES", "FORCED_NAMES", "make_plan", "plan_forced", "forced_fallbacks", "check_planner_name"]

ST = ShardingType

#: ``force:`` names, one per sharding type (``force:table-wise``, ``force:row-wise``, ...).
FORCED_NAMES: tuple[str, ...] = tuple(f"force:{t.value.replace('_', '-')}" for t in ShardingType)
PLANNER_NAMES: tuple[str, ...] = ("neo", *BASELINES, *FORCED_NAMES)
_FALLBACK_NOTE = "tables fallen back to row-wise: "


def check_planner_name(name: object, field: str = "planner") -> str:
    """``name`` if it is one of :data:`PLANNER_NAMES`, else a ``ValueError`` naming ``field``."""
    if not isinstance(name, str) or name not in PLANNER_NAMES:
        raise ValueError(f"{field}: expected one of {', '.join(PLANNER_NAMES)}, got {name!r}")
    return name


def make_plan(workload: WorkloadSpec, system: PlannerSystem, planner: str = "neo", *,
              max_steps: int | None = DEFAULT_MAX_STEPS, time_budget_s: float | None = None,
              cost: CostModel | None = None) -> Plan:
    """The plan of the named ``planner`` (one of :data:`PLANNER_NAMES`; see the module doc).
    ``max_steps`` and ``time_budget_s`` apply to ``neo`` only."""
    check_planner_name(planner)
    if planner == "neo":
        return plan_neo(workload, system, time_budget_s=time_budget_s, max_steps=max_steps, cost=cost)
    if planner in BASELINES:
        return plan_baseline(planner, workload, system, cost)
    return plan_forced(ShardingType(planner.removeprefix("force:").replace("-", "_")), workload, system, cost)


def forced_fallbacks(plan: Plan) -> int:
    """How many tables of a forced plan fell back to row-wise (0 for other plans)."""
    for note in plan.notes:
        if note.startswith(_FALLBACK_NOTE):
            return int(note[len(_FALLBACK_NOTE):])
    return 0


def plan_forced(kind: ShardingType | str, workload: WorkloadSpec, system: PlannerSystem,
                cost: CostModel | None = None) -> Plan:
    """Every table with sharding ``kind`` (see the module doc); the fallbacks are in the plan's
    notes (:func:`forced_fallbacks`)."""
    try:
        st = ShardingType(kind)
    except ValueError:
        raise ValueError(f"kind: expected one of {', '.join(t.value for t in ShardingType)}, got {kind!r}") from None
    p = Placer(workload, system, cost)
    world, g = p.world, p.g
    fallbacks = 0
    for table in sorted(workload.tables, key=lambda t: -float(workload.table_memory_bytes(t))):
        totals = p.totals()
        order = [int(r) for r in np.argsort(totals, kind="stable")]
        tp = None
        if st == ST.TABLE_WISE:
            tp = next((x for x in (p.make(table, st, [r]) for r in order) if x is not None), None)
        elif st == ST.ROW_WISE:
            tp = p.make(table, st, list(range(world)))
        elif st == ST.COLUMN_WISE:
            m = max(1, min(8, world, table.dim // 4))
            tp = p.make(table, st, sorted(order[:m]))
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
        if tp is None:
            raise p.fits_nowhere(table)
        p.place(tp)
    return p.plan(f"force:{st.value.replace('_', '-')}", (f"{_FALLBACK_NOTE}{fallbacks}",))
