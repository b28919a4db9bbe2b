"""The planner's cost model: per-rank embedding time of one iteration under a plan.

Per rank ``r`` the embedding part of an iteration costs

    fwd_compute + bwd_compute + host_transfer          (GPU model: sim.gpu, fused kernels)
    + input + pooled + grad + rs + ag                   (AlltoAllv busy time, network figures)
    + allreduce                                         (data-parallel tables' gradients)

where the kernel times come from :func:`sim.gpu.embedding_forward_cost` and
:func:`sim.gpu.embedding_backward_cost` (one fused launch per direction per rank, so the shards'
times add and the launch overhead counts once), host transfers are cache misses of DRAM/SSD
shards over PCIe (or the SSD's bandwidth), and the communication terms are
:class:`~host.planner.system.AlphaBetaComm` per-rank times of the matrices that
:func:`~host.planner.work.derive_iteration` derives. The objective is the slowest rank's total
(communication plus imbalance); ``imbalance`` is max / mean.

The search needs thousands of evaluations, so :class:`CostModel` also exposes additive
*contributions* (:class:`Contribution`) of single tables and an accumulated :class:`State`;
``evaluate(plan)`` and the state give identical figures (a test holds them together).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from neonic.host.planner.plan import Plan
from neonic.host.planner.system import PlannerSystem
from neonic.host.planner.work import COLLECTIVES, IterationWork, ShardKernel, TableWork, derive_iteration, matrix_aggregates
from neonic.host.workloads.spec import WorkloadSpec
from neonic.sim import gpu as gpu_model
from neonic.sim.memory_tiers import host_transfer_s

__all__ = ["CostModel", "Contribution", "State", "PlanCost", "COST_COLUMNS"]

#: Per-rank cost columns, in report order.
COST_COLUMNS = ("fwd_compute", "bwd_compute", "host_transfer", "input_a2a", "pooled_a2a", "grad_a2a",
                "rs", "ag", "dp_allreduce")


# Layout of the flat per-rank vectors of a contribution / state (rows of a (27, N) array).
_COMP, _KERN, _AGG, _HBM, _HOST = slice(0, 3), 3, slice(4, 24), 24, slice(25, 27)
_ROWS = 27


class Contribution:
    """A table's additive share, as one (27, N) array: compute [fwd, bwd, host] seconds (3),
    kernels per rank (1), comm aggregates (5 collectives x [sent/recv x intra/inter]) bytes (20),
    HBM bytes (1), host bytes [DRAM, SSD] (2); plus its DP AllReduce bytes."""

    __slots__ = ("vec", "dp_bytes")

    def __init__(self, vec: np.ndarray, dp_bytes: float = 0.0) -> None:
        self.vec = vec
        self.dp_bytes = dp_bytes

    @classmethod
    def zeros(cls, world: int) -> "Contribution":
        return cls(np.zeros((_ROWS, world)))

    comp = property(lambda self: self.vec[_COMP])
    kernels = property(lambda self: self.vec[_KERN])
    agg = property(lambda self: self.vec[_AGG].reshape(len(COLLECTIVES), 4, -1))
    hbm = property(lambda self: self.vec[_HBM])
    host = property(lambda self: self.vec[_HOST])

    def relabeled(self, inv: np.ndarray) -> "Contribution":
        """The same contribution with rank ``i`` taking the figures of rank ``inv[i]``."""
        return Contribution(self.vec[:, inv], self.dp_bytes)


class State(Contribution):
    """The sum of the contributions of every placed table."""

    __slots__ = ()

    @classmethod
    def empty(cls, world: int) -> "State":
        return cls(np.zeros((_ROWS, world)))

    def add(self, c: Contribution, sign: float = 1.0) -> None:
        if sign == 1.0:
            self.vec += c.vec
        else:
            self.vec -= c.vec
        self.dp_bytes += sign * c.dp_bytes

    def plus(self, adds: list[Contribution], subs: list[Contribution]) -> "State":
        """A new state with ``adds`` added and ``subs`` removed."""
        vec = self.vec.copy()
        dp = self.dp_bytes
        for c in subs:
            vec -= c.vec
            dp -= c.dp_bytes
        for c in adds:
            vec += c.vec
            dp += c.dp_bytes
        return State(vec, dp)

    def copy(self) -> "State":
        return State(self.vec.copy(), self.dp_bytes)


@dataclass
class PlanCost:
    """Per-rank seconds for each of :data:`COST_COLUMNS`, totals, memory and the summary."""

    columns: dict[str, np.ndarray]
    hbm_bytes: np.ndarray
    dram_bytes: np.ndarray
    ssd_bytes: np.ndarray
    hbm_capacity: float
    dram_capacity: float
    ssd_capacity: float
    total_s: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.total_s = sum(self.columns.values())

    @property
    def max_s(self) -> float:
        return float(self.total_s.max())

    @property
    def mean_s(self) -> float:
        return float(self.total_s.mean())

    @property
    def imbalance(self) -> float:
        """max / mean of the per-rank totals (1.0 = perfectly balanced)."""
        return self.max_s / self.mean_s if self.mean_s > 0 else 1.0

    @property
    def slowest_rank(self) -> int:
        return int(self.total_s.argmax())

    def summary(self) -> dict[str, float]:
        """Cost of the slowest rank and its parts (ms), mean, imbalance, peak memory use."""
        r = self.slowest_rank
        out = {"cost_ms": self.max_s * 1e3, "mean_ms": self.mean_s * 1e3, "imbalance_max_over_mean": self.imbalance}
        out.update({f"slowest_{k}_ms": float(v[r]) * 1e3 for k, v in self.columns.items()})
        out["hbm_peak_fraction"] = float(self.hbm_bytes.max() / self.hbm_capacity) if self.hbm_capacity else 0.0
        return out


class CostModel:
    """Costs plans (and table contributions) for one workload on one system."""

    def __init__(self, workload: WorkloadSpec, system: PlannerSystem) -> None:
        self.workload = workload
        self.system = system
        self.world = system.world_size
        self.node_of = system.node_of()
        eff = system.gpu.efficiency
        self._fwd_overhead = eff.launch_overhead_s
        self._bwd_overhead = 2 * eff.launch_overhead_s
        self._kernel_cache = lru_cache(maxsize=65536)(self._kernel_times_uncached)
        self._allreduce_cache: dict[float, float] = {}

    # ----------------------------------------------------------------- the GPU model (one call site)
    def _kernel_times_uncached(self, lookups: int, pooled_rows: int, row_bytes: int, out_row_bytes: int,
                               unique_rows: int, state_bytes: int, tier: str, miss_bytes: float) -> tuple[float, float, float]:
        spec = self.system.gpu
        fwd = gpu_model.embedding_forward_cost(spec, lookups, row_bytes, pooled_rows, out_row_bytes)
        bwd = gpu_model.embedding_backward_cost(spec, lookups, unique_rows, row_bytes, out_row_bytes, state_bytes)
        host = host_transfer_s(miss_bytes, tier, self.system.host_link_bytes_per_s,
                               self.system.memory.ssd_gbytes_per_s * 1e9)
        return fwd.time_s - fwd.overhead_s, bwd.time_s - bwd.overhead_s, host

    def kernel_times(self, k: ShardKernel) -> tuple[float, float, float]:
        """(forward, backward, host transfer) seconds of one shard, without launch overheads."""
        return self._kernel_cache(k.lookups, k.pooled_rows, k.row_bytes, k.out_row_bytes, k.unique_rows,
                                  k.state_bytes_per_row, k.tier, k.miss_bytes)

    # ----------------------------------------------------------------- contributions and states
    def contribution(self, tw: TableWork) -> Contribution:
        """A table's additive contribution (through its kernels and traffic terms)."""
        c = Contribution.zeros(self.world)
        v = c.vec
        for k in tw.kernels:
            v[0:3, k.rank] += self.kernel_times(k)
            v[_KERN, k.rank] += 1
            v[_HBM, k.rank] += k.hbm_bytes
            if k.tier != "hbm":
                v[25 if k.tier == "dram" else 26, k.rank] += k.host_bytes
        v[_AGG] = tw.aggregates(self.node_of, self.system.gpus_per_node).reshape(20, -1)
        c.dp_bytes = tw.dp_allreduce_bytes
        return c

    def _allreduce_s(self, nbytes: float) -> float:
        key = round(nbytes, 3)
        if key not in self._allreduce_cache:
            self._allreduce_cache[key] = self.system.comm.allreduce_time_s(nbytes, self.world) if nbytes > 0.5 else 0.0
        return self._allreduce_cache[key]

    def columns(self, state: State) -> dict[str, np.ndarray]:
        """Per-rank seconds per :data:`COST_COLUMNS` for an accumulated state."""
        busy = state.kernels > 0.5
        comm = self.system.comm.rank_times_s(state.agg)
        cols = {
            "fwd_compute": state.comp[0] + busy * self._fwd_overhead,
            "bwd_compute": state.comp[1] + busy * self._bwd_overhead,
            "host_transfer": state.comp[2].copy(),
        }
        for name, c in zip(("input_a2a", "pooled_a2a", "grad_a2a", "rs", "ag"), comm):
            cols[name] = c
        cols["dp_allreduce"] = np.full(self.world, self._allreduce_s(state.dp_bytes))
        return cols

    def totals(self, state: State) -> np.ndarray:
        """Per-rank total seconds (the fast path of :meth:`columns`)."""
        v = state.vec
        comm = self.system.comm.rank_times_s(v[_AGG].reshape(len(COLLECTIVES), 4, -1)).sum(axis=0)
        busy = v[_KERN] > 0.5
        return (v[0] + v[1] + v[2] + busy * (self._fwd_overhead + self._bwd_overhead) + comm
                + self._allreduce_s(state.dp_bytes))

    # ----------------------------------------------------------------- whole plans
    def state_of(self, work: IterationWork) -> State:
        """The accumulated state of a derived iteration (through its full matrices)."""
        st = State.empty(self.world)
        v = st.vec
        for r, ks in enumerate(work.kernels):
            for k in ks:
                v[0:3, r] += self.kernel_times(k)
                v[_KERN, r] += 1
        for c, name in enumerate(COLLECTIVES):
            v[4 + 4 * c: 8 + 4 * c] = matrix_aggregates(work.matrices[name], self.system.gpus_per_node)
        st.dp_bytes = work.dp_allreduce_bytes
        v[_HBM] = work.hbm_bytes
        v[25] = work.dram_bytes
        v[26] = work.ssd_bytes
        return st

    def evaluate(self, plan: Plan) -> PlanCost:
        """The full cost of a plan, through :func:`derive_iteration` (the runtime's view)."""
        work = derive_iteration(plan, self.workload, self.system)
        st = self.state_of(work)
        s = self.system
        return PlanCost(self.columns(st), st.hbm, st.host[0], st.host[1], s.hbm_capacity, s.dram_capacity, s.ssd_capacity)
