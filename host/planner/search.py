"""Neo's sharding search: greedy placement by cost, then refinement around the slowest rank.

1. Tables that cannot live on one GPU are split first (table-row-wise over a node, or row-wise
   over the least-loaded ranks), picking the option with the lowest objective.
2. Every other table, heaviest first (its table-wise cost), goes table-wise to whichever of the
   least-loaded ranks with room gives the lowest objective (greedy by cost, not by a proxy).
3. Refinement: repeatedly take the slowest rank and try, for the tables on it, moves to the
   least-loaded ranks, swaps with lighter tables there, and changes of sharding type
   (column-wise / table-column-wise over 2..8 ranks, row-wise, data-parallel), applying the
   best change that lowers the objective, until none does (convergence) or after
   ``max_steps`` steps (:data:`DEFAULT_MAX_STEPS`). The search is deterministic: the same
   workload and system give the same plan on any machine and under any load. A wall-clock
   budget (``time_budget_s``) is an opt-in safety, off by default; a run it ends is not
   reproducible.
4. Where the problem is small (few tables and ranks), an exhaustive search over table-wise
   placements is run as well and the better plan kept.

The objective is the slowest rank's embedding time (:class:`~host.planner.cost.CostModel`),
ties broken by the sum of squared per-rank times (so that the number of ranks at the maximum
also falls). Every candidate is costed exactly through the additive table contributions.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from neonic.host.planner.cost import Contribution, CostModel, State
from neonic.host.planner.plan import Plan, Shard, ShardingType, TablePlan
from neonic.host.planner.system import GIB, PlannerSystem
from neonic.host.planner.work import table_work
from neonic.host.workloads.spec import TableSpec, WorkloadSpec

__all__ = ["Placer", "NeoPlanner", "plan_neo", "check_fits", "DEFAULT_MAX_STEPS"]

ST = ShardingType

#: Refinement steps at most (the search usually converges well before: Model-A on 128 GPUs
#: converges at once after the greedy start, on 1024 GPUs in about a dozen steps).
DEFAULT_MAX_STEPS = 200


@dataclass
class _Placed:
    tp: TablePlan
    contrib: Contribution


def _split(total: int, parts: int, unit: int = 1) -> list[tuple[int, int]]:
    """``parts`` contiguous ranges covering ``[0, total)``, as even as multiples of ``unit`` allow."""
    units = total // unit if total % unit == 0 and total // unit >= parts else total
    step = unit if units != total else 1
    bounds = np.linspace(0, units, parts + 1).round().astype(int) * step
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


class Placer:
    """Shared machinery of the planners: building table plans, costing them, tracking memory."""

    def __init__(self, workload: WorkloadSpec, system: PlannerSystem, cost: CostModel | None = None,
                 tw_cache: dict | None = None) -> None:
        self.workload = workload
        self.system = system
        self.cost = cost or CostModel(workload, system)
        self.world = system.world_size
        self.g = system.gpus_per_node
        self.caps = np.array([system.hbm_capacity, system.dram_capacity, system.ssd_capacity])
        self.state = State.empty(self.world)
        self.placed: dict[str, _Placed] = {}
        self.tables = {t.name: t for t in workload.tables}
        check_fits(workload, system)
        # HBM kept for the software caches of host-tier shards when the model outgrows HBM
        # (host.memory_tiers_plan: HBM holds shards only up to what the caches leave)
        from neonic.host.memory_tiers_plan import cache_reserve

        self._cache_ratio, self._cache_reserve = cache_reserve(workload, system, self.shard_bytes)
        # Relabelings that keep the node structure and map rank 0 to rank k: a table-wise
        # table's contribution on rank k is its contribution on rank 0, relabeled (exact, as
        # every rank has the same GPU and links).
        r = np.arange(self.world)
        node, local, nodes = r // self.g, r % self.g, system.nodes
        self._inv = np.array([((node - node[k]) % nodes) * self.g + (local - local[k]) % self.g
                              for k in range(self.world)])
        # rank-0 contributions of table-wise tables, by (table, tier): shareable between placers
        # of the same workload, system and cost model (the baselines the search starts from)
        self._tw_cache: dict[tuple[str, str], Contribution] = {} if tw_cache is None else tw_cache
        self._cache: dict[TablePlan, Contribution] = {}

    # ------------------------------------------------------------------ building table plans
    def shard_bytes(self, table: TableSpec, rows: int, cols: int) -> float:
        state = self.workload.optimizer.state_bytes_per_row(cols)
        return float(rows * (cols * table.elem_bytes + state))

    def make(self, table: TableSpec, kind: ST, ranks: list[int], state: State | None = None) -> TablePlan | None:
        """A table plan of ``kind`` over ``ranks`` with tiers chosen to fit, or None if it cannot."""
        state = state or self.state
        if kind == ST.DATA_PARALLEL:
            ranks = list(range(self.world))
        if len(set(ranks)) != len(ranks):
            return None
        if kind in (ST.COLUMN_WISE, ST.TABLE_COLUMN_WISE):
            if len(ranks) > table.dim:
                return None
            pieces = [(0, table.rows, a, b) for a, b in _split(table.dim, len(ranks), 4)]
        elif kind in (ST.ROW_WISE, ST.TABLE_ROW_WISE):
            if len(ranks) > table.rows:
                return None
            pieces = [(a, b, 0, table.dim) for a, b in _split(table.rows, len(ranks))]
        else:
            pieces = [(0, table.rows, 0, table.dim)] * len(ranks)
        hbm_free = self.caps[0] - state.hbm
        dram_free = self.caps[1] - state.host[0]
        ssd_free = self.caps[2] - state.host[1]
        lf = self.system.memory.cache_load_factor
        shards = []
        for rank, (r0, r1, c0, c1) in zip(ranks, pieces):
            need = self.shard_bytes(table, r1 - r0, c1 - c0)
            cache = math.ceil((r1 - r0) * lf) * (c1 - c0) * table.elem_bytes
            reserve = self._cache_ratio * max(0.0, self._cache_reserve - state.host[0][rank])
            if need <= hbm_free[rank] - reserve:
                tier = "hbm"
            elif cache <= hbm_free[rank] and need <= dram_free[rank]:
                tier = "dram"
            elif cache <= hbm_free[rank] and need <= ssd_free[rank]:
                tier = "ssd"
            else:
                return None
            shards.append(Shard(rank, r0, r1, c0, c1, tier))
        return TablePlan(table.name, kind, tuple(shards))

    def contribution(self, tp: TablePlan) -> Contribution:
        if tp.sharding == ST.TABLE_WISE:
            s = tp.shards[0]
            key = (tp.table, s.tier)
            base = self._tw_cache.get(key)
            if base is None:
                at0 = TablePlan(tp.table, ST.TABLE_WISE, (Shard(0, s.row_start, s.row_end, s.col_start, s.col_end, s.tier),))
                base = self._tw_cache[key] = self._contribution(at0)
            return base.relabeled(self._inv[s.rank])
        c = self._cache.get(tp)
        if c is None:
            if len(self._cache) > 4000:
                self._cache.clear()
            c = self._cache[tp] = self._contribution(tp)
        return c

    def _contribution(self, tp: TablePlan) -> Contribution:
        return self.cost.contribution(table_work(self.tables[tp.table], tp, self.workload, self.system))

    # ------------------------------------------------------------------ state
    def place(self, tp: TablePlan, contrib: Contribution | None = None) -> None:
        contrib = contrib or self.contribution(tp)
        if tp.table in self.placed:
            self.unplace(tp.table)
        self.state.add(contrib)
        self.placed[tp.table] = _Placed(tp, contrib)

    def unplace(self, name: str) -> None:
        p = self.placed.pop(name)
        self.state.add(p.contrib, -1.0)

    def totals(self, state: State | None = None) -> np.ndarray:
        return self.cost.totals(state or self.state)

    def score(self, state: State) -> tuple[float, float]:
        t = self.cost.totals(state)
        return float(t.max()), float(np.dot(t, t))

    def fits(self, state: State) -> bool:
        eps = 1e-6
        return bool((state.hbm <= self.caps[0] + eps).all() and (state.host[0] <= self.caps[1] + eps).all()
                    and (state.host[1] <= self.caps[2] + eps).all())

    def plan(self, name: str, notes: tuple[str, ...] = ()) -> Plan:
        missing = [t.name for t in self.workload.tables if t.name not in self.placed]
        if missing:
            raise ValueError(f"plan: table {missing[0]!r} was not placed")
        tables = {t.name: self.placed[t.name].tp for t in self.workload.tables}
        return Plan(self.world, self.g, tables, planner=name, notes=notes)

    def fits_nowhere(self, table: TableSpec) -> ValueError:
        size = self.shard_bytes(table, table.rows, table.dim)
        return ValueError(
            f"table {table.name!r} ({size / GIB:.1f} GiB with optimizer state) fits nowhere: the largest "
            f"free capacity left is {float((self.caps[0] - self.state.hbm).max()) / GIB:.1f} GiB of HBM and "
            f"{float((self.caps[1] - self.state.host[0]).max()) / GIB:.1f} GiB of DRAM on one rank, "
            f"{float((self.caps[:, None] - np.vstack([self.state.hbm, self.state.host])).clip(0).sum()) / GIB:.1f} GiB "
            f"in the whole cluster")

    def split_options(self, table: TableSpec) -> list[TablePlan]:
        """Ways to split a table over several ranks: TWRW per node, RW over all / the lightest."""
        out: list[TablePlan] = []
        for node in range(self.system.nodes):
            tp = self.make(table, ST.TABLE_ROW_WISE, list(range(node * self.g, (node + 1) * self.g)))
            if tp is not None:
                out.append(tp)
        order = list(np.argsort(self.totals(), kind="stable"))
        need = self.shard_bytes(table, table.rows, table.dim)
        m0 = max(2, math.ceil(need / max(self.caps[0], 1.0)))
        for m in sorted({m0, 2 * m0, 4 * m0, self.world}):
            if m <= self.world:
                tp = self.make(table, ST.ROW_WISE, sorted(int(r) for r in order[:m]))
                if tp is not None:
                    out.append(tp)
        return out


def check_fits(workload: WorkloadSpec, system: PlannerSystem) -> None:
    """Refuse a workload with a table larger than every capacity it could be split over."""
    per_rank = system.hbm_capacity + system.dram_capacity + system.ssd_capacity
    total = per_rank * system.world_size
    need_all = 0.0
    for t in workload.tables:
        size = float(workload.table_memory_bytes(t))
        need_all += size
        if size > total:
            raise ValueError(
                f"table {t.name!r} ({size / GIB:.1f} GiB with optimizer state) fits nowhere: the largest capacity "
                f"is {total / GIB:.1f} GiB (all {system.world_size} ranks' HBM + DRAM + SSD; "
                f"{per_rank / GIB:.1f} GiB per rank)")
    from neonic.host.memory_tiers_plan import check_capacity

    check_capacity(workload, system, lambda t, rows, cols: float(workload.table_memory_bytes(t)))
    if need_all > total:
        raise ValueError(f"workload: tables need {need_all / GIB:.1f} GiB with optimizer state, more than the "
                         f"{total / GIB:.1f} GiB of all {system.world_size} ranks' HBM + DRAM + SSD")


class NeoPlanner(Placer):
    """Greedy-by-cost placement followed by refinement (see the module doc)."""

    def __init__(self, workload: WorkloadSpec, system: PlannerSystem, cost: CostModel | None = None,
                 time_budget_s: float | None = None, candidates: int = 4, exact_limit: int = 4096,
                 max_steps: int | None = DEFAULT_MAX_STEPS) -> None:
        super().__init__(workload, system, cost)
        if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 0):
            raise ValueError(f"max_steps: expected an integer >= 0 or None, got {max_steps!r}")
        if time_budget_s is not None and (isinstance(time_budget_s, bool) or not isinstance(time_budget_s, (int, float))
                                          or not time_budget_s > 0):
            raise ValueError(f"time_budget_s: expected a number > 0 or None (no wall-clock bound), got {time_budget_s!r}")
        self.time_budget_s = time_budget_s
        self.max_steps = max_steps
        self.candidates = candidates
        self.exact_limit = exact_limit
        self.stats: dict[str, float] = {}

    # ------------------------------------------------------------------ helpers
    def _try(self, changes: list[tuple[str, TablePlan | None]]) -> tuple[tuple[float, float], State, list] | None:
        """Score the state after replacing each named table's plan; None if it does not fit."""
        if any(tp is None for _, tp in changes):
            return None
        new = [(tp, self.contribution(tp)) for _, tp in changes]
        st = self.state.plus([c for _, c in new], [self.placed[n].contrib for n, _ in changes if n in self.placed])
        if not self.fits(st):
            return None
        return self.score(st), st, new

    def _lightest(self, k: int, exclude: set[int] = frozenset()) -> list[int]:
        order = np.argsort(self.totals(), kind="stable")
        return [int(r) for r in order if int(r) not in exclude][:k]

    def _tw_cost(self, table: TableSpec) -> float:
        tp = TablePlan(table.name, ST.TABLE_WISE, (Shard(0, 0, table.rows, 0, table.dim),))
        c = self.contribution(tp)
        return float(self.cost.totals(_only(c, self.world))[0])

    # ------------------------------------------------------------------ phases
    def greedy(self) -> None:
        cap = self.caps[0]
        costs = {t.name: self._tw_cost(t) for t in self.workload.tables}
        big = [t for t in self.workload.tables if self.shard_bytes(t, t.rows, t.dim) > cap]
        rest = [t for t in self.workload.tables if self.shard_bytes(t, t.rows, t.dim) <= cap]
        big.sort(key=lambda t: -self.shard_bytes(t, t.rows, t.dim))
        rest.sort(key=lambda t: -costs[t.name])
        for table in big:
            options = self.split_options(table)
            best = self._best([[(table.name, tp)] for tp in options])
            if best is None:
                raise self.fits_nowhere(table)
            self._apply(best)
        share = sum(costs.values()) / self.world  # a rank's fair share of table-wise work
        for table in rest:
            # the lightest ranks whose HBM holds the table (the lightest ones, if none does)
            size = self.shard_bytes(table, table.rows, table.dim)
            cands = self._light_for(size, self.candidates, set(), self.totals()) or self._lightest(self.candidates)
            trials = [[(table.name, self.make(table, ST.TABLE_WISE, [r]))] for r in cands]
            if costs[table.name] > 0.6 * share:  # heavy: splitting it is a candidate from the start
                totals = self.totals()
                size = self.shard_bytes(table, table.rows, table.dim)
                for m in (2, 4, 8):
                    light = self._light_for(size / m, m, set(), totals)
                    if len(light) == m and m <= table.dim // 4:
                        trials.append([(table.name, self.make(table, ST.COLUMN_WISE, sorted(light)))])
                    if len(light) == m:
                        trials.append([(table.name, self.make(table, ST.ROW_WISE, sorted(light)))])
            best = self._best(trials)
            if best is None:  # the lightest ranks are full: any rank with room, then splitting
                trials = [[(table.name, self.make(table, ST.TABLE_WISE, [r]))] for r in self._lightest(self.world)]
                best = self._best(trials) or self._best([[(table.name, tp)] for tp in self.split_options(table)])
            if best is None:
                raise self.fits_nowhere(table)
            self._apply(best)

    def _best(self, trials: list[list[tuple[str, TablePlan | None]]]):
        """The trial with the lowest score that fits (the first on a tie), as :meth:`_try`
        returns it, or None. The trials are scored together: one stack of candidate states,
        costed with array operations (element by element the arithmetic of :meth:`_try`).
        Single table-wise moves, most of the trials, are built straight from the table's
        rank-0 contribution relabeled (no per-trial contribution object)."""
        entries: list[tuple] = []
        for changes in trials:
            if any(tp is None for _, tp in changes):
                continue
            if len(changes) == 1 and changes[0][1].sharding == ST.TABLE_WISE:
                name, tp = changes[0]
                shard = tp.shards[0]
                key = (tp.table, shard.tier)
                if key not in self._tw_cache:
                    self.contribution(tp)
                entries.append(("tw", name, tp, key, shard.rank))
            else:
                new = [(tp, self.contribution(tp)) for _, tp in changes]
                subs = [self.placed[n].contrib for n, _ in changes if n in self.placed]
                entries.append(("any", new, subs))
        if not entries:
            return None
        base = self.state
        vecs = np.empty((len(entries),) + base.vec.shape)
        dps: list[float] = []
        groups: dict[tuple, list[int]] = {}
        for i, e in enumerate(entries):
            if e[0] == "tw":
                groups.setdefault((e[1], e[3]), []).append(i)
                placed = self.placed.get(e[1])
                dps.append(base.dp_bytes - (placed.contrib.dp_bytes if placed else 0.0) + self._tw_cache[e[3]].dp_bytes)
                continue
            _, new, subs = e
            v = base.vec.copy()
            dp = base.dp_bytes
            for c in subs:  # same order as State.plus: removals first
                v -= c.vec
                dp -= c.dp_bytes
            for _, c in new:
                v += c.vec
                dp += c.dp_bytes
            vecs[i] = v
            dps.append(dp)
        for (name, key), idx in groups.items():
            placed = self.placed.get(name)
            start = base.vec - placed.contrib.vec if placed else base.vec
            ranks = [entries[i][4] for i in idx]
            vecs[idx] = start[None] + self._tw_cache[key].vec[:, self._inv[ranks]].transpose(1, 0, 2)
        eps = 1e-6
        ok = ((vecs[:, 24] <= self.caps[0] + eps).all(axis=1) & (vecs[:, 25] <= self.caps[1] + eps).all(axis=1)
              & (vecs[:, 26] <= self.caps[2] + eps).all(axis=1))
        if not ok.any():
            return None
        idx = np.nonzero(ok)[0]
        totals = _totals_batch(self.cost, vecs[idx], [dps[i] for i in idx])
        best = None
        for j, i in enumerate(idx):
            t = totals[j]
            score = (float(t.max()), float(np.dot(t, t)))
            if best is None or score < best[0]:
                best = (score, int(i))
        i = best[1]
        e = entries[i]
        new = [(e[2], self.contribution(e[2]))] if e[0] == "tw" else e[1]
        return best[0], State(vecs[i], dps[i]), new

    def _apply(self, result) -> None:
        _, _, new = result
        for tp, c in new:
            self.place(tp, c)

    def _light_for(self, need: float, k: int, exclude: set[int], totals: np.ndarray) -> list[int]:
        """The ``k`` lightest ranks (by total time) with ``need`` bytes of HBM free."""
        room = (self.caps[0] - self.state.hbm) >= need
        out = []
        for r in np.argsort(totals, kind="stable"):
            r = int(r)
            if room[r] and r not in exclude:
                out.append(r)
                if len(out) == k:
                    break
        return out

    def _options_for(self, name: str, slow: int, totals: np.ndarray) -> list[list[tuple[str, TablePlan | None]]]:
        table = self.tables[name]
        tp = self.placed[name].tp
        size = self.shard_bytes(table, table.rows, table.dim)
        base = self._without(name)
        out: list[list[tuple[str, TablePlan | None]]] = []
        opt = lambda kind, ranks: out.append([(name, self.make(table, kind, sorted(ranks), base))])  # noqa: E731
        if tp.sharding == ST.TABLE_WISE:
            for r in self._light_for(size, self.candidates, {slow}, totals):
                opt(ST.TABLE_WISE, [r])
        for m in (2, 4, 8):  # column-wise / row-wise over the slow rank and light ranks with room
            light = self._light_for(size / m, m, {slow}, totals)
            if len(light) < m:
                continue
            if m <= table.dim // 4:
                opt(ST.COLUMN_WISE, light[: m - 1] + [slow])
                opt(ST.COLUMN_WISE, light)
            if m <= table.rows:
                opt(ST.ROW_WISE, light[: m - 1] + [slow])
                opt(ST.ROW_WISE, light)
        node = slow // self.g
        node_ranks = list(range(node * self.g, (node + 1) * self.g))
        if self.g > 1:
            opt(ST.TABLE_ROW_WISE, node_ranks)
            if table.dim >= 8:
                opt(ST.TABLE_COLUMN_WISE, node_ranks[: min(self.g, table.dim // 4)])
        if tp.sharding in (ST.ROW_WISE, ST.TABLE_ROW_WISE, ST.COLUMN_WISE, ST.TABLE_COLUMN_WISE):
            kind = {ST.TABLE_ROW_WISE: ST.ROW_WISE, ST.TABLE_COLUMN_WISE: ST.COLUMN_WISE}.get(tp.sharding, tp.sharding)
            m = len(tp.shards)
            keep = [r for r in tp.ranks if r != slow]
            spare = self._light_for(size / m, 2, set(tp.ranks), totals)
            if spare:  # move the slow rank's shard to a light rank, or add a shard there
                opt(kind, keep + spare[:1])
                opt(kind, list(tp.ranks) + spare[:1])
                if len(spare) > 1:
                    opt(kind, keep + spare)
        if size < 0.05 * self.caps[0]:
            opt(ST.DATA_PARALLEL, [])
        return out

    def _without(self, name: str) -> State:
        return self.state.plus([], [self.placed[name].contrib])

    def _swaps(self, name: str, slow: int, light: list[int], limit: int = 4) -> list[list[tuple[str, TablePlan | None]]]:
        tp = self.placed[name].tp
        if tp.sharding != ST.TABLE_WISE:
            return []
        table = self.tables[name]
        mine = self._rank_cost(name, slow)
        out = []
        for r in light:
            if r == slow:
                continue
            on_r = [(self._rank_cost(n, r), n) for n in self._by_rank.get(r, ())
                    if self.placed[n].tp.sharding == ST.TABLE_WISE]
            on_r = sorted(c for c in on_r if c[0] < mine)[-limit:]
            for _, other in on_r:
                st = self.state.plus([], [self.placed[name].contrib, self.placed[other].contrib])
                a = self.make(table, ST.TABLE_WISE, [r], st)
                b = self.make(self.tables[other], ST.TABLE_WISE, [slow], st)
                out.append([(name, a), (other, b)])
        return out

    def _rank_cost(self, name: str, rank: int) -> float:
        c = self.placed[name].contrib
        bw = self.system.comm.bw_inter_bytes_per_s
        return float(c.comp[:, rank].sum() + c.agg[:, :, rank].max(axis=0).sum() / bw)

    def _index(self) -> None:
        self._by_rank: dict[int, list[str]] = {}
        for n, p in self.placed.items():
            for r in set(p.tp.ranks) if p.tp.sharding != ST.DATA_PARALLEL else ():
                self._by_rank.setdefault(r, []).append(n)

    def refine(self, deadline: float | None = None) -> int:
        """Refinement steps until convergence, ``max_steps``, or the ``perf_counter``
        ``deadline`` (None: no wall-clock bound); returns the steps applied."""
        steps = 0
        self._index()
        while ((deadline is None or time.perf_counter() < deadline)
               and (self.max_steps is None or steps < self.max_steps)):
            totals = self.totals()
            slow = int(totals.argmax())
            current = self.score(self.state)
            light = self._lightest(self.candidates, exclude={slow})
            names = sorted(self._by_rank.get(slow, ()), key=lambda n: -self._rank_cost(n, slow))[:5]
            trials = []
            for n in names:
                trials += self._options_for(n, slow, totals)
                trials += self._swaps(n, slow, light[:3])
            best = self._best(trials)
            if best is None or not best[0] < current or not best[0][0] <= current[0] * (1 + 1e-12):
                break
            self._apply(best)
            self._index()
            steps += 1
        return steps

    def exact(self) -> bool:
        """Exhaustive table-wise search when it is small; keeps it if better. True if run."""
        tables = self.workload.tables
        if self.world ** len(tables) > self.exact_limit:
            return False
        best_score, best_assign = self.score(self.state), None
        base = State.empty(self.world)
        contribs = {}
        for t in tables:
            for r in range(self.world):
                tp = TablePlan(t.name, ST.TABLE_WISE, (Shard(r, 0, t.rows, 0, t.dim),))
                contribs[t.name, r] = (tp, self.contribution(tp))

        def rec(i: int, st: State, assign: list[int]) -> None:
            nonlocal best_score, best_assign
            if i == len(tables):
                s = self.score(st)
                if s < best_score and self.fits(st):
                    best_score, best_assign = s, list(assign)
                return
            for r in range(self.world):
                st.add(contribs[tables[i].name, r][1])
                if self.fits(st):
                    rec(i + 1, st, assign + [r])
                st.add(contribs[tables[i].name, r][1], -1.0)

        rec(0, base, [])
        if best_assign is not None:
            for t, r in zip(tables, best_assign):
                self.place(*contribs[t.name, r])
        return True

    def _best_start(self) -> None:
        """Start the refinement from the best of our greedy and the cheap proxy greedies."""
        from neonic.host.planner.baselines import plan_baseline

        best = self.score(self.state)
        for name in ("lookup-greedy", "size-lookup-greedy"):
            try:
                other = plan_baseline(name, self.workload, self.system, self.cost, tw_cache=self._tw_cache)
            except ValueError:
                continue
            st = State.empty(self.world)
            contribs = {tp.table: self.contribution(tp) for tp in other}
            for c in contribs.values():
                st.add(c)
            if self.score(st) < best and self.fits(st):
                best = self.score(st)
                self.state = st
                self.placed = {n: _Placed(other.tables[n], c) for n, c in contribs.items()}

    def run(self) -> Plan:
        t0 = time.perf_counter()
        self.greedy()
        greedy_cost = float(self.totals().max())
        self._best_start()
        steps = self.refine(None if self.time_budget_s is None else t0 + self.time_budget_s)
        exact = self.exact()
        self.stats = {"greedy_cost_s": greedy_cost, "refine_steps": steps, "exact": float(exact),
                      "planning_s": time.perf_counter() - t0}
        notes = (f"greedy {greedy_cost * 1e3:.3f} ms, {steps} refinement steps" + (", exact search" if exact else ""),)
        return self.plan("neo", notes)


def _totals_batch(cost: CostModel, vecs: np.ndarray, dps: list[float]) -> np.ndarray:
    """:meth:`CostModel.totals` of a stack of states ``vecs[T, 27, N]`` (element by element
    the same arithmetic, so scores match the one-state path exactly)."""
    comm = cost.system.comm.rank_times_s(vecs[:, 4:24].reshape(len(vecs), 5, 4, -1)).sum(axis=1)
    busy = vecs[:, 3] > 0.5
    ar = np.array([cost._allreduce_s(d) for d in dps])[:, None]
    return (vecs[:, 0] + vecs[:, 1] + vecs[:, 2] + busy * (cost._fwd_overhead + cost._bwd_overhead) + comm + ar)


def _only(c: Contribution, world: int) -> State:
    st = State.empty(world)
    st.add(c)
    return st


def plan_neo(workload: WorkloadSpec, system: PlannerSystem, time_budget_s: float | None = None,
             max_steps: int | None = DEFAULT_MAX_STEPS, cost: CostModel | None = None) -> Plan:
    """Neo's plan for ``workload`` on ``system`` (see :class:`NeoPlanner`). The refinement
    stops at convergence or after ``max_steps`` steps: the plan is reproducible. The
    wall-clock ``time_budget_s`` is an opt-in safety (None: off)."""
    return NeoPlanner(workload, system, cost, time_budget_s=time_budget_s, max_steps=max_steps).run()
