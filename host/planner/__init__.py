"""Neo's embedding sharding planner, its cost model and the baselines it is compared with.

Public API (the cluster runtime and ``neonic plan`` code against it)

Plans (:mod:`host.planner.plan`)
    ``ShardingType`` (TABLE_WISE, ROW_WISE, COLUMN_WISE, DATA_PARALLEL, TABLE_ROW_WISE,
    TABLE_COLUMN_WISE); ``Shard(rank, row_start, row_end, col_start, col_end, tier)`` with tier
    ``hbm`` | ``dram`` | ``ssd``; ``TablePlan(table, sharding, shards)``;
    ``Plan(world_size, gpus_per_node, tables: {name: TablePlan}, planner)``.

The machine (:mod:`host.planner.system`)
    ``PlannerSystem(gpu: sim.gpu.GPUSpec, comm: AlphaBetaComm, memory: MemoryTiers,
    index_bytes=8, length_bytes=4, comm_dtype="fp32")``;
    ``AlphaBetaComm.from_topology(sim.network topology)`` (per-rank AlltoAllv times and AllReduce
    times from the network model's figures); ``MemoryTiers(dram_gib_per_node, ssd_gib_per_node,
    cache_load_factor, cache_hit_rate)``. ``build_system(network, gpu, nodes, ...)`` builds one.

One iteration's work (:mod:`host.planner.work`; the one home of it)
    ``derive_iteration(plan, workload, system) -> IterationWork``: per rank the fused embedding
    kernels' work (``kernels[r]``: ShardKernel lookups, pooled rows, row bytes, unique rows,
    cache-miss bytes), the AlltoAllv byte matrices ``matrices["input" | "pooled" | "grad" |
    "rs" | "ag"]`` ([src, dst]; input indices, pooled embeddings forward, their gradients
    backward, row-wise reduce-scatter of partial pools and its backward all-gather),
    ``dp_allreduce_bytes`` and per-rank memory per tier.

Cost (:mod:`host.planner.cost`)
    ``CostModel(workload, system).evaluate(plan) -> PlanCost``: per-rank seconds per column
    (``COST_COLUMNS``: fwd/bwd compute and host transfers from ``sim.gpu``, each collective from
    the network figures, DP AllReduce), ``total_s``, ``max_s`` (the objective: slowest rank),
    ``imbalance`` (max / mean), memory per tier.

Planners
    ``make_plan(workload, system, planner="neo")``: one function for every planner, by name
    (``PLANNER_NAMES``: ``neo``, each baseline, ``force:<type>`` such as ``force:row-wise``;
    :mod:`host.planner.api`); ``check_planner_name`` validates a name.
    ``plan_neo(workload, system, max_steps=DEFAULT_MAX_STEPS)`` / ``NeoPlanner`` (greedy by
    cost, then refinement until convergence or ``max_steps``: deterministic; a wall-clock
    ``time_budget_s`` is an opt-in safety, off by default; exhaustive when small;
    :mod:`host.planner.search`);
    ``plan_baseline(name, workload, system)`` with ``BASELINES``: size-greedy, lookup-greedy,
    size-lookup-greedy, torchrec-greedy (:mod:`host.planner.baselines`);
    ``plan_forced(kind, workload, system)``: one sharding type everywhere.

Config of ``neonic plan``: :mod:`host.planner.config` (``load_plan_config``).
Bad input raises ``ValueError`` naming the field; a table that fits nowhere names the table,
its size and the largest capacity; a world size the topology cannot hold is refused.
"""

from neonic.host.planner.api import FORCED_NAMES, PLANNER_NAMES, check_planner_name, forced_fallbacks, make_plan, plan_forced
from neonic.host.planner.baselines import BASELINES, plan_baseline
from neonic.host.planner.config import PlanConfig, build_system, load_plan_config, plan_config_from_dict
from neonic.host.planner.cost import COST_COLUMNS, CostModel, PlanCost
from neonic.host.planner.plan import TIERS, Plan, Shard, ShardingType, TablePlan
from neonic.host.planner.search import DEFAULT_MAX_STEPS, NeoPlanner, check_fits, plan_neo
from neonic.host.planner.system import AlphaBetaComm, MemoryTiers, PlannerSystem
from neonic.host.planner.work import COLLECTIVES, IterationWork, ShardKernel, derive_iteration

__all__ = [
    "DEFAULT_MAX_STEPS", "FORCED_NAMES", "PLANNER_NAMES", "check_planner_name", "forced_fallbacks", "make_plan",
    "plan_forced", "AlphaBetaComm", "BASELINES", "COLLECTIVES", "COST_COLUMNS", "CostModel", "IterationWork",
    "MemoryTiers", "NeoPlanner", "Plan", "PlanConfig", "PlanCost", "PlannerSystem", "Shard",
    "ShardKernel", "ShardingType", "TIERS", "TablePlan", "build_system", "check_fits",
    "derive_iteration", "load_plan_config", "plan_baseline", "plan_config_from_dict", "plan_neo",
]
