"""One entry point for every planner: Neo's search, each baseline, or one forced sharding type.

``make_plan(workload, system, planner="neo")`` is what the cluster runtime (``[planner] name``)
and the experiments call; :data:`PLANNER_NAMES` lists the names it takes:

``neo``                    Neo's search (:func:`host.planner.search.plan_neo`), deterministic
                           (bounded by ``max_steps``; ``time_budget_s`` an opt-in safety);
``size-greedy`` ...        a baseline of :data:`host.planner.baselines.BASELINES`;
``force:<type>``           every table given one sharding type (``force:row-wise``, ...;
                           :func:`plan_forced`).

A forced plan gives each table, largest first, the type: table-wise onto the least-loaded rank
with room, row-wise over all ranks, column-wise over up to 8 of the least-loaded ranks with
room, table-row-wise / table-column-wise over the least-loaded node, data-parallel on every rank;
a table that cannot take the type within the memory caps falls back to row-wise over all ranks
(where some rank has no room: over the half, quarter... of the ranks with the most HBM free),
and the plan's notes say how many did.
"""

from __future__ import annotations

from typing import Callable

from neonic.host.planner.baselines import BASELINES, plan_baseline
from neonic.host.planner.cost import CostModel
from neonic.host.planner.forced import FORCED_NAMES, forced_fallbacks, plan_forced
from neonic.host.planner.plan import Plan, ShardingType
from neonic.host.planner.search import DEFAULT_MAX_STEPS, plan_neo
from neonic.host.planner.system import PlannerSystem
from neonic.host.workloads.spec import WorkloadSpec

__all__ = ["PLANNER_NAMES", "FORCED_NAMES", "make_plan", "plan_forced", "forced_fallbacks", "check_planner_name"]

ST = ShardingType

PLANNER_NAMES: tuple[str, ...] = ("neo", *BASELINES, *FORCED_NAMES)


def check_planner_name(name: object, field: str = "planner") -> str:
    """``name`` if it is one of :data:`PLANNER_NAMES`, else a ``ValueError`` naming ``field``."""
    if not isinstance(name, str) or name not in PLANNER_NAMES:
        raise ValueError(f"{field}: expected one of {', '.join(PLANNER_NAMES)}, got {name!r}")
    return name


def make_plan(workload: WorkloadSpec, system: PlannerSystem, planner: str = "neo", *,
              max_steps: int | None = DEFAULT_MAX_STEPS, time_budget_s: float | None = None,
              cost: CostModel | None = None, progress: Callable[[str], None] | None = None) -> Plan:
    """The plan of the named ``planner`` (one of :data:`PLANNER_NAMES`; see the module doc).
    ``max_steps``, ``time_budget_s`` and ``progress`` (told where the search is, a line at
    each phase and step) apply to ``neo`` only."""
    check_planner_name(planner)
    if planner == "neo":
        return plan_neo(workload, system, time_budget_s=time_budget_s, max_steps=max_steps, cost=cost,
                        progress=progress)
    if planner in BASELINES:
        return plan_baseline(planner, workload, system, cost)
    return plan_forced(ShardingType(planner.removeprefix("force:").replace("-", "_")), workload, system, cost)
