"""Neo's sharding search: greedy placement by cost, then refinement around the slowest rank.

1. Tables that cannot live on one GPU are split first (table-row-wise over a node, or row-wise
   over the least-loaded ranks), picking the option with the lowest objective.
2. Every other table, heaviest first (its table-wise cost), goes table-wise to whichever of the
   least-loaded ranks with room gives the lowest objective (greedy by cost, not by a proxy).
3. Refinement: repeatedly take the slowest rank and try, for the tables on it, moves to the
   least-loaded ranks, swaps with lighter tables there, and changes of sharding type
   (column-wise / table-column-wise over 2..8 ranks, row-wise, data-parallel), applying the
   best change that lowers the objective, until none does (convergence) or after
   ``max_steps`` steps (:data:`DEFAULT_MAX_STEPS`). A step prices at most ``screen`` of its
   candidates on the full model (network and HBM sharing): those that the same schedule without
   contention, one pass and much cheaper, ranks lowest. A move must beat the current plan by
   more than noise (:func:`improves`). Before each refinement, a balancing search
   (:meth:`NeoPlanner.balance`) moves, swaps and re-splits whole tables between the slowest and
   the lightest nodes, aligned groups of a node's ranks and ranks on the barrier-sum proxy
   (hundreds of candidates a step for about what one full evaluation costs), its states then
   priced in full. Between refinements, class moves retype or move a whole class of tables at
   once (:meth:`NeoPlanner.class_move`); at the local optimum, once per descent, the
   table-row-wise class is re-split over half (then a quarter) of a node's ranks and balanced
   (:meth:`NeoPlanner.regroup`). The search descends so from
   each of the ``descents`` best starts (:data:`DEFAULT_DESCENTS`; the starts: the greedy
   placement and every baseline's and forced type's plan, ranked by the objective), the steps
   shared, and keeps the lowest local optimum (the first on a tie). Where a batch of states
   is priced in full to keep the best (the starts, a step's class moves, a balancing search's
   states), those whose schedule without contention is above twice the best full figure
   are not priced (:data:`_PRUNE_FACTOR`): contention only lengthens an iteration.
   Optionally (``kicks``), from that local optimum: a perturbation (the best move of a step
   applied although it does not lower the objective, its tables kept from moving back) and a
   new descent whose steps look at the ``slow_ranks`` slowest ranks (the slowest overall and
   the slowest of each phase), kept if it ends lower; all within ``max_steps``. The search is deterministic: the same
   workload and system give the same plan on any machine and under any load. Its independent
   pieces (the start plans, a step's class moves, each step's candidates priced in full, and
   half of each balancing step's candidates, the regrouping's included) are computed by two processes
   where two CPUs are free to it (``workers``; :mod:`host.planner.parallel`), merged in a fixed
   order: the plan is the same with one. A wall-clock
   budget (``time_budget_s``) is an opt-in safety, off by default; a run it ends is not
   reproducible.
4. Where the problem is small (few tables and ranks), an exhaustive search over table-wise
   placements is run as well and the better plan kept.

The objective is the slowest rank's embedding time (:class:`~host.planner.cost.CostModel`),
ties broken by the sum of squared per-rank times (so that the number of ranks at the maximum
also falls). Every candidate is costed exactly through the additive table contributions.
"""

from __future__ import annotations

import gc
import hashlib
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from neonic.host.planner.cost import Contribution, CostModel, PackedContribution, State
from neonic.host.planner.parallel import ForkedServer, Lockstep, available_workers, map_forked
from neonic.host.planner.placer import _EVERY, Placer, _Placed, _Relabeled, check_fits
from neonic.host.planner.plan import Plan, Shard, ShardingType, TablePlan
from neonic.host.planner.system import PlannerSystem
from neonic.host.workloads.spec import TableSpec, WorkloadSpec

__all__ = ["Placer", "NeoPlanner", "plan_neo", "check_fits", "DEFAULT_MAX_STEPS"]

ST = ShardingType

#: The best starts each descended (refinement and class moves) to a local optimum, the lowest
#: kept. The best start alone misses plans its own objective prefers: on 16 small skewed cases
#: (2 x 4 GPUs, 20-40 tables) the second-best start's descent ended lower in 10, by up to 8%.
#: One by default, for planning time: with the converged objective a second descent on the
#: bench's model-a at 16 x 8 ends at the same plan for about 6 more CPU-s. On the weak-scaling
#: experiment's tiny model-i at 16 nodes it finds a plan that simulates 12% faster (18.02 vs
#: 20.54 ms: one table row-wise over all 128 ranks), whose row-wise shards write partial pools
#: for the whole global batch, so the mean fused-kernel time per GPU rises 14% (0.488 ->
#: 0.552 ms) with the same lookups: past that test's 10% bound on per-GPU kernel time, which
#: holds only while the plan keeps its sharding types from 1 to 16 nodes.
DEFAULT_DESCENTS = 1

#: Steps of the balancing search (:meth:`NeoPlanner.balance`) at most, per call: each moves,
#: swaps or re-splits whole tables between the slowest and the lightest units (a node, an
#: aligned group of its ranks, a rank) on the barrier-sum proxy, so a step costs about a
#: hundredth of a refinement step. (Model-a at 16 x 8: about 45 steps from forced
#: table-row-wise, about 100 after re-splitting it over half nodes; 64 stopped that one early,
#: 48.22 against 47.97 ms predicted.)
DEFAULT_BALANCE_STEPS = 160

#: A balancing step's neighbourhood (:meth:`NeoPlanner._balance_trials`): the lightest units a
#: table may go to, the tables per unit size moved off the slowest rank, the swaps per
#: destination. Measured on model-a at 16 x 8 (re-split over half nodes, then balanced; CPU
#: seconds on the loaded 2-core machine): (2, 3, 2) 47.97 ms predicted in 4.9 s, (3, 3, 2)
#: 47.53 ms in 5.8 s, (3, 4, 4) 47.43 ms in 10.1 s.
_BALANCE_NEIGHBOURHOOD = (3, 3, 2)

#: The phases whose slowest node (or rank) a balancing step moves tables off, each with the
#: rows of a table's contribution that count toward it (:data:`host.planner.cost` layout: the
#: forward and backward kernels, then the input, pooled and reduce-scatter AlltoAlls' bytes;
#: the gradient AlltoAll and the all-gather mirror the pooled one and the reduce-scatter).
_BALANCE_PHASES = (("fwd_compute", slice(0, 1)), ("bwd_compute", slice(1, 2)), ("input_a2a", slice(4, 8)),
                   ("pooled_a2a", slice(8, 12)), ("pooled_rs", slice(16, 20)))

#: Refinement steps at most (the search usually converges well before: Model-A on 128 GPUs
#: converges at once after the greedy start, on 1024 GPUs in about a dozen steps).
DEFAULT_MAX_STEPS = 200

#: A move is applied only if it lowers the predicted iteration time by at least this fraction,
#: or, leaving it unchanged (within :data:`_SAME_REL`), lowers the balance tie-breaker (the sum
#: of squared per-rank times) by at least this fraction. Without a threshold the search applied
#: "improvements" of floating-point noise: with Neo's settings on model-a it re-applied one
#: table's unchanged plan for all 200 steps.
_IMPROVE_REL = 1e-6
#: Two iteration times within this fraction are the same (a batch figure differs from a state's
#: own by the fixed-point passes the batch shares, ~1e-12).
_SAME_REL = 1e-9

#: A start plan with at most this many shards per table on average is kept once made (else
#: made again if it wins): table-wise, column-wise and node-bound plans, not row-wise or
#: data-parallel ones over every rank.
_KEEP_SHARDS = 16

#: States whose batch-evaluated objective is within this fraction of the batch's lowest are
#: scored alone to pick the best (:meth:`NeoPlanner._first_best`): far above the ~1e-12 by
#: which a batch figure can differ from the state's own.
_CONFIRM_REL = 1e-6

#: A batch of states to price in full (:meth:`NeoPlanner._first_best`) is first ranked by the
#: schedule without contention (one pass, about a hundredth of the full price): a state whose
#: figure there is above this multiple of the lowest figure priced in full is not priced: it
#: cannot be the best. (The states within this multiple of the lowest figure without
#: contention are priced first: the lowest full figure is at least that, so they would be
#: priced anyway; the others after them, only those that the best of the first allows.) The
#: contention (network and HBM sharing, the collectives' SMs) only stretches ops, so the full
#: figure is at least the contention-free one: on every state these batches held on model-a,
#: -i and -f at 128 and 1024 GPUs it was 1.0027 to 1.88 times it. (Not a proof: the figure is
#: a window of iterations, ``host.iteration.ScheduleTemplate._measured``, whose first end
#: contention also moves; hence the factor 2: contention would have to halve a window for a
#: state left out to be the best.) What it saves on model-a at 1024 GPUs: 6 of the 10 start
#: plans and 5 of the 11 class moves (the row-wise and data-parallel ones, 2.3 to 127 times
#: the best figure without contention) are not priced, about 0.17 and 0.11 CPU-s less per
#: process in the starts' and the class moves' pricing.
_PRUNE_FACTOR = 2.0


#: Start plans made after another, in the same process (:meth:`NeoPlanner._best_start`): the
#: forced row-wise and data-parallel plans price every table over every rank, as TorchRec's
#: greedy does among its options, so made after it they cost little (model-a at 16 x 8, CPU
#: seconds on the loaded machine: 0.04 and 0.03 after it, 0.41 and 0.03 beside the greedy
#: start). The plans are the same wherever they are made.
_STARTS_TOGETHER = {"force:row_wise": "torchrec-greedy", "force:data_parallel": "torchrec-greedy"}

#: Start plans made in this process, after the greedy placement (:meth:`NeoPlanner._best_start`),
#: not by whichever process is free: the search adopts the winning start from the
#: contributions this process holds, and a forked worker's are lost with it. Forced
#: table-row-wise wins model-a at 1024 and 4096 GPUs, and its 1000 contributions relabeled
#: from node 0 cost 0.35-0.4 CPU-s to make again at 4096 GPUs (0.46 against 0.10 to adopt)
#: where a worker made it. The plans are the same wherever they are made.
_STARTS_HERE = frozenset({"force:table_row_wise"})


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused for the block (as it was after). The search
    makes about a million small objects (shards and table plans, most kept in its bounded
    caches) and none of them form reference cycles, so reference counting frees all it drops;
    the collector's full passes over the objects it keeps cost about a tenth of the search
    (1.2-1.5 of 14-17 CPU-s on model-a at 16 x 8, measured with ``gc.callbacks``) and find
    nothing to free. The plan does not depend on it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def improves(new: tuple[float, float], current: tuple[float, float]) -> bool:
    """Whether score ``new`` beats ``current`` by more than noise (:data:`_IMPROVE_REL`)."""
    if new[0] < current[0] * (1 - _IMPROVE_REL):
        return True
    return new[0] <= current[0] * (1 + _SAME_REL) and new[1] < current[1] * (1 - _IMPROVE_REL)


class NeoPlanner(Placer):
    """Greedy-by-cost placement followed by refinement (see the module doc)."""

    def __init__(self, workload: WorkloadSpec, system: PlannerSystem, cost: CostModel | None = None,
                 time_budget_s: float | None = None, candidates: int = 4, exact_limit: int = 4096,
                 max_steps: int | None = DEFAULT_MAX_STEPS, screen: int = 24, slow_ranks: int = 4,
                 kicks: int = 0, workers: int | None = None, descents: int = DEFAULT_DESCENTS,
                 balance_steps: int = DEFAULT_BALANCE_STEPS, progress: Callable[[str], None] | None = None,
                 prune: bool = True) -> None:
        super().__init__(workload, system, cost)
        if not isinstance(prune, bool):
            raise ValueError(f"prune: expected True or False, got {prune!r}")
        #: whether a batch of states priced in full skips those that cannot be the best by the
        #: schedule without contention (:meth:`_first_best`, :data:`_PRUNE_FACTOR`): a speed
        #: setting (tests compare the plans both ways)
        self.prune = prune
        if progress is not None and not callable(progress):
            raise ValueError(f"progress: expected a callable taking a message, or None, got {progress!r}")
        #: told where the search is (:meth:`_say`): a line at each phase and step, this
        #: process's only (a forked copy's would come from a process the caller does not know)
        self.progress = progress
        self._progress_pid = os.getpid()
        self._t_start = time.perf_counter()
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise ValueError(f"workers: expected an integer >= 1 or None (the CPUs available, up to 2), got {workers!r}")
        #: processes that compute the start plans and each step's class moves (this one and
        #: forked copies, :func:`host.planner.parallel.map_forked`): the plan is the same
        #: whatever their number, which only changes how long it takes
        self.workers = available_workers(2) if workers is None else workers
        if isinstance(screen, bool) or not isinstance(screen, int) or screen < 1:
            raise ValueError(f"screen: expected an integer >= 1, got {screen!r}")
        #: a refinement step prices at most this many of its candidates in full: those the
        #: schedule without contention ranks lowest (:meth:`CostModel.iteration_s_batch`)
        self.screen = screen
        for name, value in (("slow_ranks", slow_ranks), ("kicks", kicks), ("descents", descents),
                            ("balance_steps", balance_steps)):
            low = 0 if name in ("kicks", "balance_steps") else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}: expected an integer >= {low}, got {value!r}")
        #: the best starts (by the objective, distinct states) each descended to its local
        #: optimum, the lowest kept (:meth:`_run`)
        self.descents = descents
        #: steps of the balancing search at most (:meth:`balance`; 0: none)
        self.balance_steps = balance_steps
        #: the ranks a refinement step moves tables off (:meth:`_slow_ranks`)
        self.slow_ranks = slow_ranks
        #: perturbations tried once the refinement converges (:meth:`kick`). Off by default: on
        #: model-i at 16 x 8 three of them took the predicted iteration from 49.69 to 46.47 ms in
        #: 6.4 CPU-s; on model-a two took Neo's plan from 50.47 to 50.34 ms simulated (50.16 to
        #: 49.98 predicted) for about 16 CPU-s more, past the planning budget
        self.kicks = kicks
        self._tabu: set[str] = set()
        self._width = 1  # the slow ranks a step looks at: the slowest only in the first descent
        self._regrouped = False  # whether this descent has tried :meth:`regroup`
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
        self._order = {t.name: i for i, t in enumerate(workload.tables)}
        self.moves: list[str] = []
        self._scores: dict[tuple[bytes, float], tuple[float, float]] = {}  # by a digest of the state
        self._server: ForkedServer | None = None   # the copy that evaluates half of each batch (:meth:`_batch`)

    # ------------------------------------------------------------------ helpers
    def _say(self, message: str) -> None:
        """Pass ``message`` and the wall time since the search began to :attr:`progress`
        (nothing in a forked copy, nor without a callback). A planning of thousands of ranks
        takes minutes under load, and a caller that reports at intervals (the bench, the
        cluster run) needs lines to pass on; the plan does not depend on them."""
        if self.progress is not None and os.getpid() == self._progress_pid:
            self.progress(f"{message} ({time.perf_counter() - self._t_start:.0f} s)")

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
        """The table's cost table-wise on rank 0 alone (:meth:`CostModel.totals` of rank 0: a
        rank's total depends on its own column of the state only, so the column is costed
        alone)."""
        c = self.tw_base(table.name, "hbm")
        return float(self.cost.totals(State(c.columns(slice(0, 1)).copy(), 0.0))[0])

    # ------------------------------------------------------------------ phases
    def greedy(self) -> None:
        """Place every table in turn (heaviest first), each where the barrier-sum proxy
        (:meth:`CostModel.barrier_sum_batch`) is lowest: a start for the search."""
        cap = self.caps[0]
        costs = {t.name: self._tw_cost(t) for t in self.workload.tables}
        big = [t for t in self.workload.tables if self.shard_bytes(t, t.rows, t.dim) > cap]
        rest = [t for t in self.workload.tables if self.shard_bytes(t, t.rows, t.dim) <= cap]
        big.sort(key=lambda t: -self.shard_bytes(t, t.rows, t.dim))
        rest.sort(key=lambda t: -costs[t.name])
        for table in big:
            options = self.split_options(table)
            best = self._best([[(table.name, tp)] for tp in options], proxy=True)
            if best is None:
                raise self.fits_nowhere(table)
            self._apply(best)
        share = sum(costs.values()) / self.world  # a rank's fair share of table-wise work
        for k, table in enumerate(rest):
            if k % 200 == 0:
                self._say(f"greedy start: {len(big) + k} of {len(big) + len(rest)} tables placed")
            # the ranks by total time (a stable sort, once per table: the state is the same for
            # every candidate) and each one's free HBM
            order = np.argsort(self.totals(), kind="stable")
            free = (self.caps[0] - self.state.hbm)[order]
            # the lightest ranks whose HBM holds the table (the lightest ones, if none does):
            # :meth:`_light_for` and :meth:`_lightest`, from the one sort
            size = self.shard_bytes(table, table.rows, table.dim)
            cands = order[free >= size][: self.candidates].tolist() or order[: self.candidates].tolist()
            trials = [[(table.name, self.make(table, ST.TABLE_WISE, [r]))] for r in cands]
            if costs[table.name] > 0.6 * share:  # heavy: splitting it is a candidate from the start
                for m in (2, 4, 8):
                    light = order[free >= size / m][:m].tolist()
                    if len(light) == m and m <= table.dim // 4:
                        trials.append([(table.name, self.make(table, ST.COLUMN_WISE, sorted(light)))])
                    if len(light) == m:
                        trials.append([(table.name, self.make(table, ST.ROW_WISE, sorted(light)))])
            best = self._best(trials, proxy=True, state=False)
            if best is None:  # the lightest ranks are full: any rank with room, then splitting
                trials = [[(table.name, self.make(table, ST.TABLE_WISE, [r]))] for r in order.tolist()]
                best = (self._best(trials, proxy=True, state=False)
                        or self._best([[(table.name, tp)] for tp in self.split_options(table)], proxy=True, state=False))
            if best is None:
                raise self.fits_nowhere(table)
            self._apply(best)

    def _best(self, trials: list[list[tuple[str, TablePlan | None]]], proxy: bool = False, state: bool = True):
        """The trial with the lowest score that fits (the first on a tie), as :meth:`_try`
        returns it, or None. The trials are scored together: one stack of candidate states,
        costed with array operations (element by element the arithmetic of :meth:`_try`).
        Single table-wise moves, most of the trials, are built straight from the table's
        rank-0 contribution relabeled (no per-trial contribution object). The greedy's proxy is
        taken by node where the contributions are packed (:meth:`Placer.best_by_nodes`: the
        same result without the stack; ``state`` False: there without the candidate's state,
        None in its place, for a caller that applies the move and reads the state it makes)."""
        if proxy:
            by_nodes = self.best_by_nodes(trials, state)
            if by_nodes is not NotImplemented:
                return by_nodes
        entries: list[tuple] = []
        for changes in trials:
            if any(tp is None for _, tp in changes):
                continue
            if all(n in self.placed and self.placed[n].tp == tp for n, tp in changes):
                continue  # the plan as it is: no move
            if len(changes) == 1 and changes[0][1].sharding == ST.TABLE_WISE:
                name, tp = changes[0]
                shard = tp.shards[0]
                key = (tp.table, shard.tier)
                entries.append(("tw", name, tp, key, shard.rank, self.tw_base(*key)))
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
                dps.append(base.dp_bytes - (placed.contrib.dp_bytes if placed else 0.0) + e[5].dp_bytes)
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
            vecs[idx] = start[None] + entries[idx[0]][5].columns(self._inv[ranks]).transpose(1, 0, 2)
        eps = 1e-6
        ok = ((vecs[:, 24] <= self.caps[0] + eps).all(axis=1) & (vecs[:, 25] <= self.caps[1] + eps).all(axis=1)
              & (vecs[:, 26] <= self.caps[2] + eps).all(axis=1))
        if not ok.any():
            return None
        idx = np.nonzero(ok)[0]
        if not proxy and idx.size > self.screen:
            # priced in full: the candidates the schedule without contention ranks lowest
            quick = self._quick(vecs[idx], [dps[i] for i in idx])
            idx = np.sort(idx[np.argsort(quick, kind="stable")[: self.screen]])
        score_of = self.cost.barrier_sum_batch if proxy else self._batch
        its = score_of(vecs[idx], [dps[i] for i in idx])
        # the lowest (objective, balance) score, the first on a tie: the balance tie-breaker
        # (per-rank totals) only of the candidates at the lowest objective
        low = min(float(x) for x in its)
        tied = [j for j in range(len(idx)) if float(its[j]) == low]
        totals = _totals_batch(self.cost, vecs[idx[tied]], [dps[idx[j]] for j in tied])
        best = None
        for t, j in zip(totals, tied):
            score = (float(its[j]), float(np.dot(t, t)))
            if best is None or score < best[0]:
                best = (score, int(idx[j]), j)
        i = best[1]
        e = entries[i]
        new = [(e[2], self.contribution(e[2]))] if e[0] == "tw" else e[1]
        if not proxy:  # the state applying it makes (bit for bit where one table moves)
            self._remember(vecs[i], dps[i], its[best[2]])
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
            m = tp.shard_count
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

    def refine(self, deadline: float | None = None, max_steps: int | None = -1) -> int:
        """Refinement steps until convergence, ``max_steps`` (default: the planner's), or the
        ``perf_counter`` ``deadline`` (None: no wall-clock bound); returns the steps applied."""
        steps = 0
        limit = self.max_steps if max_steps == -1 else max_steps
        self._index()
        while ((deadline is None or time.perf_counter() < deadline)
               and (limit is None or steps < limit)):
            totals = self.totals()
            current = self.score(self.state)
            trials = self._trials(totals)
            self._say(f"refinement: step {steps + 1}, {len(trials)} candidates")
            best = self._best(trials)
            if best is None or not improves(best[0], current):
                break
            self._apply(best)
            self._index()
            steps += 1
            self._say(f"refinement step {steps}: {best[0][0] * 1e3:.3f} ms predicted")
        return steps

    def _slow_ranks(self, totals: np.ndarray) -> list[int]:
        """The ranks a step moves tables off: the slowest by total, then the slowest of each
        phase (an iteration pays each phase's slowest rank, which need not be the slowest
        overall), then the next slowest by total, ``slow_ranks`` of them at most."""
        out = [int(totals.argmax())]
        if self._width == 1:
            return out
        cols = self.cost.columns(self.state)
        for key in ("fwd_compute", "bwd_compute", "pooled_a2a", "grad_a2a", "input_a2a", "pooled_rs"):
            out.append(int(cols[key].argmax()))
        out += [int(r) for r in np.argsort(-totals, kind="stable")[:self.slow_ranks]]
        return list(dict.fromkeys(r for r in out if self._by_rank.get(r)))[:self._width]

    def _trials(self, totals: np.ndarray) -> list[list[tuple[str, TablePlan | None]]]:
        """A step's candidate moves: for the heaviest tables of each slow rank
        (:meth:`_slow_ranks`; 5 on the slowest, 3 on the others), a new placement or type
        (:meth:`_options_for`) and swaps with lighter tables of the least-loaded ranks."""
        trials: list[list[tuple[str, TablePlan | None]]] = []
        for i, slow in enumerate(self._slow_ranks(totals)):
            light = self._lightest(self.candidates, exclude={slow})
            names = sorted(self._by_rank.get(slow, ()), key=lambda n: -self._rank_cost(n, slow))[:5 if i == 0 else 3]
            for n in names:
                if n in self._tabu:
                    continue
                trials += self._options_for(n, slow, totals)
                trials += self._swaps(n, slow, light[:3])
        return trials

    def kick(self) -> bool:
        """A perturbation out of a local optimum: apply the best candidate move of a step
        (:meth:`_trials`) although it does not lower the objective, and keep its tables from
        moving back in the refinement that follows. True if one was applied."""
        self._index()
        best = self._best(self._trials(self.totals()))
        if best is None:
            return False
        self._apply(best)
        self._tabu |= {tp.table for tp, _ in best[2]}
        self._index()
        return True

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

    def _adopt(self, plan: Plan, keep: bool = False) -> State | None:
        """The state of ``plan`` in this placer's contributions (None if it does not fit);
        ``keep``: also its placements, as ``self._adopted`` (else the contributions are summed
        and dropped: one table's is 29 x world floats, a plan's 1000 of them 0.24 GB at 1024
        ranks, and the search compares a dozen starts)."""
        st = State.empty(self.world)
        placed: dict[str, _Placed] = {}
        for tp in plan:
            c = self.contribution(tp)
            st.add(c)
            if keep:
                placed[tp.table] = _Placed(tp, c)
        if not self.fits(st):
            return None
        self._adopted = placed
        return st

    def start_plans(self) -> Iterator[Plan]:
        """The other starts of the search, one at a time: every baseline's plan and every forced
        sharding type's (those that fit), so that the result is never worse than any of them.
        (Made one at a time and dropped once costed: a plan of 1000 tables row-wise over 4096
        ranks is 4M shards, 1.6 GB.)"""
        for _, make, _ in self._start_makers():
            plan = make()
            if plan is not None:
                yield plan

    def _start_makers(self) -> list[tuple[str, Callable[[], Plan | None], float]]:
        """Each start plan's name, a function that makes it (None where it cannot be made:
        deterministic, so the winning start is made again rather than kept) and its relative
        cost (to split the starts between processes: TorchRec's greedy prices seven ways of
        sharding every table; forced row-wise and data-parallel plans price every table over
        every rank)."""
        from neonic.host.planner.baselines import BASELINES, plan_baseline
        from neonic.host.planner.forced import plan_forced

        # the makers hold what they read, not ``self``: kept in :attr:`_ranked_starts`, a maker
        # holding the planner would make it a reference cycle, its caches (some 280k objects
        # on model-a at 1024 GPUs) left to the cyclic collector once the search is dropped
        workload, system, cost, tw_cache = self.workload, self.system, self.cost, self._tw_cache

        def maker(f, *args):
            def make() -> Plan | None:
                try:
                    return f(*args, workload, system, cost, tw_cache=tw_cache)
                except ValueError:
                    return None
            return make

        # measured on model-a at 1024 and 4096 GPUs (CPU-s, forced column-wise = 1): TorchRec's
        # greedy 5.5-6.5, forced table-row-wise 0.9-1.0, table-column-wise 0.8, row-wise after
        # TorchRec's greedy 0.4-0.7, data-parallel after it 0.05-0.15, table-wise 0.35, the
        # three weight-greedy baselines 0.2-0.4 each (forced table-row-wise is made here after the
        # greedy placement: :data:`_STARTS_HERE`)
        weight = {"torchrec-greedy": 6.0, ST.ROW_WISE: 0.5, ST.COLUMN_WISE: 1.0, ST.TABLE_ROW_WISE: 1.0,
                  ST.TABLE_COLUMN_WISE: 0.8, ST.DATA_PARALLEL: 0.1, ST.TABLE_WISE: 0.35}
        return ([(name, maker(plan_baseline, name), weight.get(name, 0.25)) for name in BASELINES]
                + [(f"force:{kind.value}", maker(plan_forced, kind), weight.get(kind, 0.25)) for kind in ShardingType])

    def _best_start(self, before: Callable[[], None] | None = None) -> str:
        """Start from the best (under the objective) of the greedy placement and every start
        plan (the first of them on a tie); returns its name. ``before``: what makes the greedy
        placement (run while other processes make start plans, :attr:`workers`); the greedy
        state is kept as ``_greedy_state``."""
        makers = self._start_makers()
        # the starts made in one process, in turn: those that price what another prices
        # (:data:`_STARTS_TOGETHER`) made after it, from the same caches
        groups: list[list[int]] = []
        first: dict[str, int] = {}
        here = [i for i, (name, _, _) in enumerate(makers) if name in _STARTS_HERE]
        for i, (name, _, _) in enumerate(makers):
            if i in here:
                continue
            lead = _STARTS_TOGETHER.get(name)
            if lead in first:
                groups[first[lead]].append(i)
            else:
                first[name] = len(groups)
                groups.append([i])

        def start(i: int) -> tuple[str, np.ndarray, float, Plan | None] | None:
            other = makers[i][1]()
            st = None if other is None else self._adopt(other)
            self._say(f"start plan {makers[i][0]} {'made' if st is not None else 'does not fit'}")
            if st is None:
                return None
            # a small plan comes along (else the winner is made again: a row-wise plan over 1024
            # ranks is a million shards)
            small = sum(tp.shard_count for tp in other) <= _KEEP_SHARDS * len(other.tables)
            return other.planner, st.vec, st.dp_bytes, other if small else None

        # the per-rank totals' compiled loop loaded here before the workers fork (0.15-0.2 CPU-s
        # from numba's cache, which each process would pay for itself; the greedy start needs it)
        self.totals()
        if self.workers >= 2:
            self._shared_starts()
        self._say(f"start plans: the greedy placement and {len(makers)} baselines' and forced types' plans")
        made_here: dict[int, tuple | None] = {}

        def alongside() -> None:  # this process's own: the greedy placement, then :data:`_STARTS_HERE`
            if before is not None:
                before()
            for i in here:
                made_here[i] = start(i)

        def group(k: int) -> tuple[list, list]:
            """The starts of group ``k``, and (made by a forked worker) the contributions of
            row-wise plans over every rank it made (:meth:`_everywhere_rows`)."""
            here = os.getpid() == self._progress_pid or not self._pack
            before = None if here else {key for key, _, _ in self._cache.entries()}
            got = [start(i) for i in groups[k]]
            return got, ([] if before is None else self._everywhere_rows(before))

        made = map_forked(group, len(groups), self.workers, [sum(makers[i][2] for i in g) for g in groups],
                          alongside=alongside)
        self._say("start plans made; pricing them in full")
        found: list = [None] * len(makers)
        for i, f in made_here.items():
            found[i] = f
        for g, (got, rows) in zip(groups, made):
            for i, f in zip(g, got):
                found[i] = f
            for key, value, nbytes in rows:
                if key not in self._cache:
                    self._cache.put(key, value, nbytes)
        self._greedy_state = self.state
        self._greedy_placed = dict(self.placed)
        cands: list[tuple[str, State, Callable[[], Plan | None] | None, Plan | None]] = [
            ("greedy", self.state, None, None)]
        for (_, make, _), f in zip(makers, found):
            if f is not None:
                cands.append((f[0], State(f[1], f[2]), make, f[3]))
        # (one descent: only the best start is read, the others need not be priced; the
        # greedy state is, for the search's statistics)
        i, won = self._first_best([c[1] for c in cands], prune=self.descents == 1, first=(0,))
        if self.descents == 1:
            self._ranked_starts = [cands[i]]
        else:
            # the starts in the order of their scores (the first on a tie; each scored in the
            # batch above, remembered), distinct states only: the ones the search descends from
            order = sorted(range(len(cands)), key=lambda j: (self.score(cands[j][1]), j))
            if order[0] != i:
                order.remove(i)
                order.insert(0, i)
            seen: set[tuple[bytes, float]] = set()
            self._ranked_starts = []
            for j in order:
                key = self._score_key(cands[j][1].vec, cands[j][1].dp_bytes)
                if key not in seen:
                    seen.add(key)
                    self._ranked_starts.append(cands[j])
        self._adopt_start(cands[i])
        self._say(f"start {cands[i][0]}: {won[0] * 1e3:.3f} ms predicted")
        return cands[i][0]

    def _everywhere_rows(self, before: set) -> list[tuple]:
        """The entries of the plans' contribution cache that are not in ``before`` and hold a
        row-wise plan over every rank in order (:meth:`Placer.make`'s key): what TorchRec's
        greedy start prices for every table (its row-wise option) and the class move of the
        table-row-wise tables to row-wise makes again. A forked worker's are lost with it, so
        the worker that makes them sends them back where they are kept packed (4 MB for
        model-a's 1000 tables at 1024 GPUs, 0.03 CPU-s to collect; unpacked, at 128 GPUs, 31
        MB, and cheaper to make: not sent), and this process keeps them: on model-a at 1024
        GPUs the class move made those 1000 again, about 0.3 CPU-s. A contribution is the same
        figures whichever process made it (the cache's key is what the plan is made from, its
        tiers included), so the plan does not change."""
        out = []
        for key, value, nbytes in self._cache.entries():
            # (a made plan's key: ((table, type, ranks), tiers))
            made = key[0] if isinstance(key, tuple) and len(key) == 2 else None
            if (isinstance(made, tuple) and len(made) == 3 and made[1] is ST.ROW_WISE and made[2] == _EVERY
                    and key not in before):
                out.append((key, value, nbytes))
        return out

    def _shared_starts(self) -> None:
        """Make, before the start plans' workers fork, the contributions that this process and
        TorchRec's greedy (made by a worker) both price: every table table-wise on rank 0 in
        HBM (the greedy placement's costs, TorchRec's table-wise option, the table-wise
        baselines) and table-row-wise over node 0 as the empty state places it (TorchRec's
        option, and forced table-row-wise here: :data:`_STARTS_HERE`). This process makes
        them anyway; made before the fork, the worker finds them made, and the compiled
        kernels that build them loaded (each process built and loaded its own before). On
        model-a at 1024 GPUs the start phase's critical path (this before the fork, then the
        slower process) fell from 2.97-3.27 to 2.75-2.82 CPU-s, both processes' work from 5.65
        to 4.93; at 4096 their work fell (12.9-13.7 to 11.2-13.1) but the path did not clearly
        (6.59-7.01 against 6.05-7.17: what is made here before the fork is 0.8 CPU-s there).
        The caches only save recomputing: the plans are the same."""
        node0 = list(range(self.g))
        for t in self.workload.tables:
            self.tw_base(t.name, "hbm")
            tp = self.make(t, ST.TABLE_ROW_WISE, node0)
            if tp is not None:
                self._contribution_base(tp)

    def _adopt_start(self, cand) -> None:
        """Make ``cand`` (an entry of ``_ranked_starts``) the search's state and placements."""
        name, st, make, plan = cand
        if make is None:
            self.state, self.placed = st.copy(), dict(self._greedy_placed)
            return
        self.state = self._adopt(plan if plan is not None else make(), keep=True)
        if self.state.vec.tobytes() != st.vec.tobytes() or self.state.dp_bytes != st.dp_bytes:
            raise RuntimeError(f"start {name!r}: adopted again, its state differs")
        self.placed = self._adopted

    @staticmethod
    def _score_key(vec: np.ndarray, dp_bytes: float) -> tuple[bytes, float]:
        return hashlib.blake2b(vec.tobytes(), digest_size=16).digest(), float(dp_bytes)

    def score(self, state: State) -> tuple[float, float]:
        """:meth:`Placer.score`, remembered by the state's figures (the search scores some
        states more than once: the greedy start, the state refinement stops at, and the states
        a batch has evaluated, :meth:`_remember`)."""
        key = self._score_key(state.vec, state.dp_bytes)
        hit = self._scores.get(key)
        if hit is None:
            hit = self._scores[key] = super().score(state)
        return hit

    def _remember(self, vec: np.ndarray, dp_bytes: float, iteration_s: float) -> None:
        """Remember the :meth:`score` of the state ``(vec, dp_bytes)`` whose objective a batch
        (:meth:`CostModel.iteration_s_batch`) gave as ``iteration_s``: the state's own figure,
        bit for bit (``host.iteration.ScheduleTemplate.iteration_s`` gives every candidate of a
        batch the passes it takes alone), so scoring it alone again would only repeat it."""
        key = self._score_key(vec, dp_bytes)
        if key not in self._scores:
            t = self.cost.totals(State(vec, dp_bytes))
            self._scores[key] = (float(iteration_s), float(np.dot(t, t)))

    def _batch(self, vecs: np.ndarray, dps: list[float]) -> np.ndarray:
        """:meth:`CostModel.iteration_s_batch` of a stack of states, its second half computed
        by a forked copy of this process where :attr:`workers` allows (one for the whole search,
        :class:`host.planner.parallel.ForkedServer`): a batch gives every state its own figure,
        bit for bit, whatever else is in it, so the split changes no figure (and a half the copy
        cannot give is computed here); the full evaluations are most of a refinement step's
        time."""
        n = len(vecs)
        if self.workers < 2 or n < 2:
            return self.cost.iteration_s_batch(vecs, dps)
        if self._server is None:
            self._server = ForkedServer(self.cost.iteration_s_batch)
        cut = (n + 1) // 2
        if not self._server.ask(vecs[cut:], list(dps[cut:])):
            return self.cost.iteration_s_batch(vecs, dps)
        first = self.cost.iteration_s_batch(vecs[:cut], list(dps[:cut]))
        second = self._server.answer()
        if second is None:
            second = self.cost.iteration_s_batch(vecs[cut:], list(dps[cut:]))
        return np.concatenate([first, second])

    def _quick(self, vecs: np.ndarray, dps: list[float]) -> np.ndarray:
        """The schedule without contention of a stack of states (the screen), ``screen``
        states at a time: the op graph's per-rank arrays of a batch grow with candidates x
        ranks (300 ops x 150 candidates x 4096 ranks would be 1.5 GB at once)."""
        n = self.screen
        return np.concatenate([self.cost.iteration_s_batch(vecs[i:i + n], dps[i:i + n], contention=False)
                               for i in range(0, len(vecs), n)])

    def _first_best(self, states: list[State], also: list[State] = (), prune: bool = True,
                    first: tuple[int, ...] = ()) -> tuple[int, tuple[float, float]] | None:
        """The index and :meth:`score` of the state with the lowest score, the first on a tie:
        the one that scoring each state alone, in turn, keeps. All are evaluated in one
        batch (:meth:`CostModel.iteration_s_batch`, much cheaper than one call per state),
        which gives each state its own figure (``ScheduleTemplate.iteration_s``: a candidate
        keeps the figure of the pass at which it converges alone), remembered as its score
        (:meth:`_remember`); the states within :data:`_CONFIRM_REL` of the batch's lowest are
        then compared by their whole score (the balance tie-breaker too). ``also``: states
        the caller scores next (not candidates), priced in the same batch where their score
        is not yet known (the same figures as alone, for a share of the batch's passes
        instead of a call of their own). ``prune`` (and :attr:`prune`): the states that
        cannot be the best by the schedule without contention are not priced, nor remembered
        (:data:`_PRUNE_FACTOR`; the states of ``first``, by index, always are): the same
        best, for a caller that needs no other state's score. (At most two batches: the
        second holds the states the first's best leaves in, rarely any.)"""
        if not states:
            return None
        vecs, dps = np.stack([s.vec for s in states]), [s.dp_bytes for s in states]
        keep = np.arange(len(states))
        quick = None
        if len(states) > self.screen:  # as in a refinement step: the lowest without contention
            quick = self._quick(vecs, dps)
            keep = np.sort(np.argsort(quick, kind="stable")[: self.screen])
        extra = [s for s in also if self._score_key(s.vec, s.dp_bytes) not in self._scores]
        its = np.full(len(states), np.inf)
        # where ``prune``, the states that the schedule without contention does not rule out
        # whatever the best (and ``first``) priced first, then those of the others that the
        # best of them does not rule out (:data:`_PRUNE_FACTOR`); else all at once
        later = keep[:0]
        if prune and self.prune and keep.size > 2:
            if quick is None:
                quick = np.full(len(states), np.inf)
                quick[keep] = self._quick(vecs[keep], [dps[i] for i in keep])
            lo = float(quick[keep].min())
            sure = quick[keep] <= lo * _PRUNE_FACTOR
            sure[[k for k, i in enumerate(keep.tolist()) if i in first]] = True
            keep, later = keep[sure], keep[~sure]
        if extra:
            got = self._batch(np.concatenate([vecs[keep], np.stack([s.vec for s in extra])]),
                              [dps[i] for i in keep] + [s.dp_bytes for s in extra])
            its[keep] = got[:keep.size]
            for s, x in zip(extra, got[keep.size:]):
                self._remember(s.vec, s.dp_bytes, x)
        else:
            its[keep] = self._batch(vecs[keep], [dps[i] for i in keep])
        if later.size:
            later = later[quick[later] <= float(its[keep].min()) * _PRUNE_FACTOR]
            if later.size:
                its[later] = self._batch(vecs[later], [dps[i] for i in later])
                keep = np.sort(np.concatenate([keep, later]))
        near = float(its.min()) * (1 + _CONFIRM_REL)
        for i in keep:
            self._remember(states[i].vec, states[i].dp_bytes, its[i])
        best: tuple[int, tuple[float, float]] | None = None
        for i, st in enumerate(states):
            if its[i] <= near:
                sc = self.score(st)
                if best is None or sc < best[1]:
                    best = (i, sc)
        return best

    # ------------------------------------------------------------------ balancing
    def _unit_of(self, name: str) -> tuple[int, int] | None:
        """Where table ``name`` sits as one movable unit, ``(m, k)``: on ranks ``k m .. k m + m -
        1`` of one node (a table-wise table: ``m`` 1; a table-row-wise or table-column-wise one
        on a node, or on an aligned half, quarter... of a node: ``m`` its shards), None for the
        others (split over nodes, data-parallel)."""
        tp = self.placed[name].tp
        if tp.sharding == ST.TABLE_WISE:
            return (1, tp.ranks[0])
        if tp.sharding in (ST.TABLE_ROW_WISE, ST.TABLE_COLUMN_WISE):
            ranks = tp.ranks
            m, first = len(ranks), ranks[0]
            if (first % self.g == 0 or (self.g % m == 0 and first % m == 0)) and \
                    list(ranks) == list(range(first, first + m)):
                return (m, first // m) if first % m == 0 else None
        return None

    def _moved(self, name: str, unit: tuple[int, int], base: State) -> TablePlan | None:
        """Table ``name``'s plan on ``unit`` (:meth:`_unit_of`; its type kept, its shards as
        many as the unit's ranks), tiers chosen to fit ``base``."""
        m, k = unit
        tp = self.placed[name].tp
        kind = ST.TABLE_WISE if m == 1 else tp.sharding
        return self.make(self.tables[name], kind, list(range(k * m, k * m + m)), base)

    def _group_sizes(self, m: int, sharding: ShardingType) -> list[int]:
        """The unit sizes a table on ``m`` ranks may be re-split to: half and twice as many
        ranks of a node (a table-row-wise or table-column-wise table, 2 ranks at least)."""
        if sharding not in (ST.TABLE_ROW_WISE, ST.TABLE_COLUMN_WISE) or m < 2:
            return []
        return [x for x in (m // 2, 2 * m) if 2 <= x <= self.g and self.g % x == 0 and x != m]

    def _balance_trials(self, units: dict[tuple[int, int], list[str]], light_k: int = 3, top: int = 4,
                        swaps: int = 4, weights: dict | None = None,
                        versions: dict | None = None) -> list[tuple]:
        """A balancing step's candidates: for each phase of :data:`_BALANCE_PHASES`, on its
        slowest rank, the ``top`` tables of each unit size (:meth:`_unit_of`) that weigh most
        there in that phase, each moved to one of the ``light_k`` units of its size lightest in
        that phase (their slowest rank's), or swapped there with one of the ``swaps`` heaviest
        tables that weigh less, or re-split over half or twice as many ranks of a node
        (:meth:`_group_sizes`) on one of the ``light_k`` lightest units of that size.
        ``weights``: each table's weight in a phase on its unit, kept between the steps of one
        balancing search (a table's weight changes only with its placement: checked by its
        contribution, the same object while it stays), and each unit's tables ranked by them
        while ``versions`` (by unit: moved on by the caller whenever a table leaves or joins
        it) stays. Each candidate is a spec, ``(table, unit)`` or a swap ``(table, unit, other,
        its unit)``, its plans made only where it is priced (:meth:`_balance_trial`): with two
        processes each makes the plans of its half only."""
        cols = self.cost.columns(self.state)
        out: list[tuple] = []
        seen: set[tuple] = set()
        sizes = sorted({u[0] for u in units})
        weights = {} if weights is None else weights
        versions = {} if versions is None else versions
        placed = self.placed

        def weight(n: str, ph: int, rows: slice, first: int, m: int) -> float:
            """Table ``n``'s figures of phase ``rows`` summed over its unit's ranks ``first ..
            first + m - 1``."""
            c = placed[n].contrib
            key = (ph, n, first, m)
            hit = weights.get(key)
            if hit is not None and hit[0] is c:
                return hit[1]
            w = float(c.columns(slice(first, first + m))[rows].sum())
            weights[key] = (c, w)
            return w

        for ph, (phase, rows) in enumerate(_BALANCE_PHASES):
            per_rank = cols[phase]
            slow_rank = int(per_rank.argmax())
            if not per_rank[slow_rank] > 0:
                continue
            per_size = {m: per_rank.reshape(-1, m).max(axis=1) for m in
                        sorted(set(sizes) | {x for m in sizes for x in (m // 2, 2 * m) if 1 <= x <= self.g})
                        if self.g % m == 0}

            def lightest(m: int, skip: int) -> list[int]:
                return [int(x) for x in np.argsort(per_size[m], kind="stable")[:light_k + 1] if int(x) != skip][:light_k]

            def ranked(m: int, k: int, ph: int = ph, rows: slice = rows) -> list[tuple[float, str]]:
                """Unit ``(m, k)``'s tables by weight, heaviest first (the first in table order
                on a tie); kept while the unit's tables stay (``versions``, which the balancing
                search moves on whenever a table leaves or joins the unit)."""
                key = ("ranked", ph, m, k)
                v = versions.get((m, k), 0)
                hit = weights.get(key)
                if hit is not None and hit[0] == v:
                    return hit[1]
                out_k = sorted(((weight(o, ph, rows, k * m, m), o) for o in units.get((m, k), ())),
                               key=lambda x: (-x[0], self._order[x[1]]))
                weights[key] = (v, out_k)
                return out_k

            for m in sizes:
                slow = slow_rank // m
                mine = ranked(m, slow)[:top]
                light = lightest(m, slow)
                for wn, name in mine:
                    for dest in light:
                        if (name, m, dest) not in seen:
                            seen.add((name, m, dest))
                            out.append((name, (m, dest)))
                        lighter = [x for x in ranked(m, dest) if x[0] < wn][:swaps]
                        for _, other in lighter:
                            key = tuple(sorted((name, other)))
                            if key in seen:
                                continue
                            seen.add(key)
                            out.append((name, (m, dest), other, (m, slow)))
                    for x in self._group_sizes(m, placed[name].tp.sharding):
                        for dest in lightest(x, -1):
                            if (name, x, dest) not in seen:
                                seen.add((name, x, dest))
                                out.append((name, (x, dest)))
        return out

    def _balance_trial(self, spec: tuple, bases: dict) -> list[tuple[str, TablePlan | None]]:
        """The changes of the balancing candidate ``spec`` (:meth:`_balance_trials`), its table
        plans made now, tiers chosen to fit the state less the tables it moves (``bases``: those
        states by the tables, made once a step)."""
        name, unit = spec[0], spec[1]
        base = bases.get(name)
        if base is None:
            base = bases[name] = self._without(name)
        if len(spec) == 2:
            return [(name, self._moved(name, unit, base))]
        other, unit2 = spec[2], spec[3]
        both = bases.get((name, other))
        if both is None:
            # (the same bits as the state less both: the removals in the same order)
            both = bases[name, other] = base.plus([], [self.placed[other].contrib])
        return [(name, self._moved(name, unit, both)), (other, self._moved(other, unit2, both))]

    def balance(self, lockstep: bool = False) -> bool:
        """Balance the phases over the nodes and ranks by moving whole tables: a local search on
        the barrier-sum proxy (:meth:`CostModel.barrier_sum_batch`: each phase's slowest rank,
        summed, as if nothing overlapped; about a thousandth of a full evaluation), each step
        applying the candidate of :meth:`_balance_trials` that lowers it most, at most
        :attr:`balance_steps` steps; then the states it passed through are priced in full
        (:meth:`_first_best`: the last, and about every eighth of the way) and the best kept if
        it lowers the objective. Moves of one table at a time around the slowest rank
        (:meth:`refine`) need a full evaluation per step and cannot move a node-bound table to
        another node. (The schedule without contention, tried as this search's score, stopped
        earlier and ended higher under the full objective on model-a: it sees no gain in
        balancing the input AlltoAll, which the full model does, as the next batch's input
        AlltoAll shares the NICs with the pooled one.) ``lockstep`` (the descent's own balancing,
        where no other process is busy): with two processes free to it (:attr:`workers`), a
        forked copy (:class:`host.planner.parallel.Lockstep`) follows the search from its second
        step and prices half of each step's candidates; the moves are the serial ones. True if
        the plan changed."""
        if self.balance_steps == 0:
            return False
        saved_state, saved_placed = self.state.copy(), dict(self.placed)
        trail: list[tuple[State, dict]] = []
        proxy = float(self.cost.barrier_sum_batch(self.state.vec[None], [self.state.dp_bytes])[0])
        units: dict[tuple[int, int], list[str]] = {}
        for n in self.placed:   # (in table order, kept so as tables move)
            u = self._unit_of(n)
            if u is not None:
                units.setdefault(u, []).append(n)
        # the contribution of each table plan a step tries, by the plan (kept, so its id stays
        # its own): the steps try mostly the same moves, and a plan's contribution is the same
        # figures whenever it is made (:meth:`Placer.contribution`)
        contribs: dict[int, tuple[TablePlan, object]] = {}

        def contribution(tp: TablePlan):
            hit = contribs.get(id(tp))
            if hit is None:
                hit = contribs[id(tp)] = (tp, self.contribution(tp))
            return hit[1]

        # each contribution's figures, by the contribution (kept, so its id stays its own), up to
        # about 64 MiB of them: a remembered contribution builds its figures when read
        # (:meth:`Placer.contribution`), and a step reads mostly the figures the last one read
        figures: dict[int, tuple[object, np.ndarray]] = {}
        room = max(64, (64 << 20) // max(1, self.state.vec.nbytes))

        def vec_of(c) -> np.ndarray:
            hit = figures.get(id(c))
            if hit is not None:
                return hit[1]
            v = c.vec
            if len(figures) < room:
                figures[id(c)] = (c, v)
            return v

        weights: dict = {}   # the tables' weights by phase, kept between steps (:meth:`_balance_trials`)
        versions: dict[tuple[int, int], int] = {}   # by unit: moved on when a table leaves or joins it
        caps = self.caps + 1e-6   # (each cap with the tolerance of the fit test)

        def best_of(trial: Callable[[int], list], part: range, news: list) -> tuple[float, int] | None:
            """The lowest proxy of the candidates ``part`` (``trial(i)``: candidate ``i``'s
            changes) that fit and its index (the first on a tie), None if none fits; their
            contributions in ``news``. A
            candidate that moves one table to a plan kept packed is priced from the state less
            the table and the plan's columns (:meth:`CostModel.barrier_sum_plus`), a swap of two
            tables whose figures are all kept packed from the state less the first table and
            the three packed contributions (:meth:`CostModel.barrier_sum_swap`: no stack of
            whole states, most of a step's stack before), the others on a stack of their
            states (:meth:`CostModel.barrier_sum_batch`): each candidate's figure is its own
            either way."""
            q_all = np.full(len(part), np.nan)
            ok_all = np.zeros(len(part), dtype=bool)
            stacked: list[tuple[int, list, list, np.ndarray, float]] = []
            # the state less each moved table, once per table (the same bits as the state copied
            # and the table subtracted: every candidate subtracts its first table first)
            less: dict[str, np.ndarray] = {}
            for k, i in enumerate(part):
                changes = trial(i)
                if any(tp is None for _, tp in changes):
                    continue   # (a table that fits nowhere it goes)
                new = news[i] = [(tp, contribution(tp)) for _, tp in changes]
                first = changes[0][0]
                minus = less.get(first)
                if minus is None:
                    minus = less[first] = self.state.vec - vec_of(self.placed[first].contrib)
                dp = self.state.dp_bytes - self.placed[first].contrib.dp_bytes
                if len(changes) == 1:
                    cols = _packed_columns(new[0][1])
                    if cols is not None:
                        q = self.cost.barrier_sum_plus(minus, cols[0], cols[1], dp + new[0][1].dp_bytes, caps)
                        if q is not None:
                            ok_all[k], q_all[k] = True, q
                        continue
                elif len(changes) == 2:
                    # a swap: the state less the second table too, both placed anew (the stack's
                    # additions in its order, :meth:`CostModel.barrier_sum_swap`)
                    other = self.placed[changes[1][0]].contrib
                    packed = (_packed_columns(other), _packed_columns(new[0][1]), _packed_columns(new[1][1]))
                    if None not in packed:
                        q = self.cost.barrier_sum_swap(minus, *packed, ((dp - other.dp_bytes) + new[0][1].dp_bytes)
                                                       + new[1][1].dp_bytes, caps)
                        if q is not None:
                            ok_all[k], q_all[k] = True, q
                        continue
                stacked.append((k, changes, new, minus, dp))
            if stacked:
                vecs = np.empty((len(stacked),) + self.state.vec.shape)
                dps: list[float] = []
                for v, (k, changes, new, minus, dp) in zip(vecs, stacked):
                    if len(changes) == 1:
                        np.add(minus, vec_of(new[0][1]), out=v)
                        dp += new[0][1].dp_bytes
                    else:
                        v[...] = minus
                        for n, _ in changes[1:]:
                            c = self.placed[n].contrib
                            v -= vec_of(c)
                            dp -= c.dp_bytes
                        for _, c in new:
                            v += vec_of(c)
                            dp += c.dp_bytes
                    dps.append(dp)
                eps = 1e-6
                ok = ((vecs[:, 24] <= self.caps[0] + eps).all(axis=1) & (vecs[:, 25] <= self.caps[1] + eps).all(axis=1)
                      & (vecs[:, 26] <= self.caps[2] + eps).all(axis=1))
                idx = np.nonzero(ok)[0]
                if idx.size:
                    # (the stack itself where every candidate fits: the same figures, no copy of it;
                    # each candidate's figure is its own, whatever else is in the stack)
                    q = self.cost.barrier_sum_batch(vecs if idx.size == len(vecs) else vecs[idx], [dps[k] for k in idx])
                    at = np.array([stacked[k][0] for k in idx.tolist()], dtype=np.intp)
                    ok_all[at], q_all[at] = True, q
            idx = np.nonzero(ok_all)[0]
            if not idx.size:
                return None
            q = q_all[idx]
            j = int(np.argmin(q))   # the first on a tie
            return float(q[j]), part[int(idx[j])]

        # with two processes free to it (``lockstep``), a forked copy follows the search step by
        # step from its second step on (the same trials, the same moves applied) and prices the
        # second half of each step's candidates: the lowest of the two halves (the first on a
        # tie) is the lowest of all, so the moves are the serial ones (and where the copy fails,
        # its half is priced here)
        copy: Lockstep | None = None       # (here) this process's end of the copy's pipes
        follower: Lockstep | None = None   # (in the copy) its end
        try:
            for step in range(self.balance_steps):
                if not units:
                    break
                self._say(f"balancing: step {step + 1}, proxy {proxy * 1e3:.3f} ms")
                specs = self._balance_trials(units, *_BALANCE_NEIGHBOURHOOD, weights=weights, versions=versions)
                if not specs:
                    break
                # each candidate's plans made where it is priced, the first time it is read (the
                # halves split the specs: either way the lowest of the two halves, the first on a
                # tie, is the lowest of all)
                made: list = [None] * len(specs)
                bases: dict = {}

                def trial(i: int, specs: list = specs, made: list = made, bases: dict = bases) -> list:
                    if made[i] is None:
                        made[i] = self._balance_trial(specs[i], bases)
                    return made[i]
                if step == 1 and lockstep and trail and self.workers >= 2 and copy is None:
                    copy, follower = Lockstep.fork()
                    if follower is not None:   # the copy: no processes of its own
                        self._server, self.workers = None, 1
                news: list = [None] * len(specs)
                cut = (len(specs) + 1) // 2 if (copy is not None or follower is not None) else len(specs)
                if follower is not None:
                    follower.tell(best_of(trial, range(cut, len(specs)), news))
                    j = follower.hear()
                    if j is None:
                        break
                else:
                    best = best_of(trial, range(cut), news)
                    if cut < len(specs):
                        other = copy.hear() if copy is not None else Lockstep.LOST
                        if other is Lockstep.LOST:   # the copy is gone: its half priced here
                            copy = None
                            other = best_of(trial, range(cut, len(specs)), news)
                        if other is not None and (best is None or other[0] < best[0]):
                            best = other
                    j = None if best is None or not best[0] < proxy * (1 - _IMPROVE_REL) else best[1]
                    if copy is not None and not copy.tell(j):
                        copy = None
                    if j is None:
                        break
                    proxy = best[0]
                new = news[j] if news[j] is not None else [(tp, contribution(tp)) for _, tp in trial(j)]
                for tp, c in new:
                    left = self._unit_of(tp.table)
                    units[left].remove(tp.table)
                    versions[left] = versions.get(left, 0) + 1
                    self.place(tp, c)
                    joined = self._unit_of(tp.table)
                    versions[joined] = versions.get(joined, 0) + 1
                    mine = units.setdefault(joined, [])
                    mine.insert(int(np.searchsorted([self._order[n] for n in mine], self._order[tp.table])), tp.table)
                if follower is None:
                    trail.append((self.state.copy(), dict(self.placed)))
        except BaseException:
            if follower is not None:
                os._exit(1)
            raise
        finally:
            if copy is not None:
                copy.close()
        if follower is not None:
            os._exit(0)
        self.state, self.placed = saved_state, saved_placed
        if not trail:
            return False
        # the states passed through, priced in full: the last, and about every eighth of the way
        picks = sorted({len(trail) - 1, *(len(trail) * k // 8 for k in range(1, 8))})
        self._say(f"balancing: {len(trail)} steps taken, {len(picks)} of their states priced in full")
        # (the state it started from scored in the same batch, where not yet known: a
        # regrouping's balancing starts from a state never scored)
        best = self._first_best([trail[i][0] for i in picks], also=[saved_state])
        if best is None or not improves(best[1], self.score(saved_state)):
            return False
        state, placed = trail[picks[best[0]]]
        self.state, self.placed = state.copy(), dict(placed)
        self.moves.append(f"balance ({picks[best[0]] + 1} steps)")
        return True

    def regroup(self) -> bool:
        """Re-split every table-row-wise table held by one node or an aligned group of its ranks
        over half, then (if half lowered the objective) a quarter, of a node's ranks
        (:func:`host.planner.forced.place_forced` with ``group``, at least 2 ranks), each
        followed by :meth:`balance`, and keep the best if it lowers the objective. Fewer shards per table write fewer partial pools and
        reduce-scatter fewer bytes inside the node, at the price of coarser pieces to balance:
        a change of the whole class at once, which no move of one table lowers (a table over
        half the ranks doubles their share of it). The attempts are made in turn, the quarter
        only where the half lowered the objective, each one's balancing shared with a forked
        copy where two processes are free to it (:meth:`balance` in ``lockstep``): on model-a at
        1024 and 4096 ranks the half does not pay, and the quarter, once made beside it by a
        second process, was thrown away (while this process balanced the half alone).
        True if the plan changed."""
        from neonic.host.planner.forced import place_forced

        names, sizes = self._regroup_class()
        if not names or not sizes:
            return False
        current = self.score(self.state)
        saved = (self.state.copy(), dict(self.placed), list(self.moves))

        def attempt(i: int) -> tuple | None:
            """The class over ``sizes[i]`` ranks, balanced, from the saved state: its score,
            state, placements and moves, None if it does not fit; the search's state as it
            was after."""
            self.state, self.placed, self.moves = saved[0].copy(), dict(saved[1]), []
            try:
                for n in names:
                    self.unplace(n)
                ok = place_forced(self, [self.tables[n] for n in names], ST.TABLE_ROW_WISE, group=sizes[i])
                if ok is None or ok > 0 or not self.fits(self.state):
                    return None
                self.balance(lockstep=True)
                return self.score(self.state), self.state.copy(), dict(self.placed), list(self.moves)
            finally:
                self.state, self.placed, self.moves = saved[0].copy(), dict(saved[1]), list(saved[2])

        self._say(f"regrouping {len(names)} table-row-wise tables over {' and '.join(map(str, sizes))} ranks of a node")
        best = None
        for i in range(len(sizes)):
            found = attempt(i)
            if found is None:
                continue
            if not improves(found[0], current if best is None else best[0][0]):
                break   # fewer ranks per table stopped paying: a quarter of a node is not used
            best = (found, i)
        self.state, self.placed, self.moves = saved[0], saved[1], saved[2]
        if best is None or not improves(best[0][0], current):
            return False
        (_, state, placed, moves), i = best
        self.state, self.placed = state, placed
        self.moves.append(f"table_row_wise over {sizes[i]} ranks of a node" + "".join(f", {m}" for m in moves))
        return True

    def _regroup_class(self) -> tuple[list[str], list[int]]:
        """The tables :meth:`regroup` re-splits (table-row-wise, each on one node or an aligned
        group of its ranks) and the group sizes it tries, in turn (half, then a quarter, of a
        node's ranks; at least 2)."""
        if self.g < 4:
            return [], []
        names = [n for n in self.placed if self.placed[n].tp.sharding == ST.TABLE_ROW_WISE and self._unit_of(n)]
        return names, [x for x in (self.g // 2, self.g // 4) if x >= 2 and self.g % x == 0]

    # ------------------------------------------------------------------ class moves
    def _classes(self) -> list[tuple[str, list[str]]]:
        """Classes of tables a move changes at once: the tables of each sharding type, the
        heavier half of each (by the table's own cost), and the table-row/column-wise tables of
        the busiest node."""
        by_kind: dict[ShardingType, list[str]] = {}
        for n, p in self.placed.items():
            by_kind.setdefault(p.tp.sharding, []).append(n)
        out: list[tuple[str, list[str]]] = []
        for kind in ShardingType:
            names = sorted(by_kind.get(kind, ()), key=self._order.__getitem__)
            if not names:
                continue
            out.append((f"all {kind.value}", names))
            if len(names) >= 4:
                heavy = sorted(names, key=lambda n: -self._own_cost(n))[: len(names) // 2]
                out.append((f"heavier half of {kind.value}", heavy))
        return out

    def _own_cost(self, name: str) -> float:
        """Table ``name``'s own cost: its compute seconds and its collectives' bytes over the
        inter-node bandwidth, summed over the ranks (its figures built once: a packed
        contribution builds them whenever read)."""
        c = Contribution(self.placed[name].contrib.vec)
        return float(c.comp.sum() + c.agg.sum() / self.system.comm.bw_inter_bytes_per_s)

    def class_move(self) -> bool:
        """Try retyping each class (:meth:`_classes`) to every other sharding type, and moving
        each node's table-row/column-wise tables to the least-loaded node; apply the best move
        if it lowers the objective. True if one was applied."""
        from neonic.host.planner.forced import place_forced

        current = self.score(self.state)
        saved_state, saved_placed = self.state.copy(), dict(self.placed)
        tasks: list[tuple[int, str, list[str], ShardingType]] = []   # (class, label, its tables, target)
        classes = self._classes()
        for ci, (label, names) in enumerate(classes):
            kinds = {self.placed[n].tp.sharding for n in names}
            for target in ShardingType:
                if kinds == {target} and target not in (ST.TABLE_ROW_WISE, ST.TABLE_COLUMN_WISE):
                    continue  # nothing to change (node-bound types are re-balanced over the nodes)
                tasks.append((ci, label, names, target))
        removed: dict[int, tuple[State, dict]] = {}   # the state without each class, made once (per process)
        made: dict[int, dict[str, TablePlan]] = {}     # the table plans of the moves made here

        def move(i: int) -> tuple[np.ndarray, float] | None:
            """The state of move ``i`` (its figures; its table plans in ``made``), None if it
            does not fit; the search's state as it was after."""
            ci, _, names, target = tasks[i]
            if ci not in removed:
                self.state, self.placed = saved_state.copy(), dict(saved_placed)
                for n in names:
                    self.unplace(n)
                removed[ci] = (self.state.copy(), dict(self.placed))
            else:
                self.state, self.placed = removed[ci][0].copy(), dict(removed[ci][1])
            try:
                ok = place_forced(self, [self.tables[n] for n in names], target)
                if ok is None or not self.fits(self.state):
                    return None
                made[i] = {n: self.placed[n].tp for n in names}
                return self.state.vec.copy(), self.state.dp_bytes
            finally:
                self.state, self.placed = saved_state.copy(), dict(saved_placed)
                self._say(f"class move {tasks[i][1]} -> {tasks[i][3].value} tried")

        # a move's cost grows with its tables; new column-wise placements are priced afresh, and
        # the tables that do not fit data-parallel fall back to row-wise over every rank (the
        # costliest plans to make: model-a's heavier half at 4096 ranks, 2.1 CPU-s of the 7.5 of
        # all the moves), so those are taken first and the processes end together (weighed as
        # one table-wise move, it was taken last: 4.6 s for the slower process, 3.8 now)
        cost = {ST.COLUMN_WISE: 3.0, ST.TABLE_COLUMN_WISE: 1.5, ST.DATA_PARALLEL: 3.0}
        self._say(f"class moves: {len(tasks)} retypings of {len(classes)} classes of tables")
        def alongside() -> None:
            # the regrouping's first attempt's contributions (its tables over half a node, in
            # HBM), made while the workers make the moves: the regrouping comes next, once
            # per descent, where no move pays (model-a at 1024 and 4096 GPUs), and made then
            # they took this process alone (1000 tables; the caches keep them otherwise)
            names, sizes = self._regroup_class()
            for n in names:
                self.node_base(self.tables[n], ST.TABLE_ROW_WISE, sizes[0])

        found = map_forked(move, len(tasks), self.workers, [len(t[2]) * cost.get(t[3], 1.0) for t in tasks],
                           alongside=alongside if self.workers >= 2 and not self._regrouped else None)
        # each move's state (not its contributions: a class of 900 tables' took 0.2 GB per move
        # at 1024 ranks), in the order of the moves
        moves = [(State(f[0], f[1]), i) for i, f in enumerate(found) if f is not None]
        # the lowest-scoring move (the first on a tie), if it beats the current state
        best = self._first_best([m[0] for m in moves])
        if best is None or not improves(best[1], current):
            return False
        i = moves[best[0]][1]
        if i not in made:  # made by another process: made again here (deterministic: the same state)
            again = move(i)
            if again is None or again[0].tobytes() != moves[best[0]][0].vec.tobytes():
                raise RuntimeError(f"class move {tasks[i][1]!r} -> {tasks[i][3].value}: made again, it differs")
        for n, tp in made[i].items():
            self.place(tp)
        self.moves.append(f"{tasks[i][1]} -> {tasks[i][3].value}")
        return True

    def _descend(self, deadline: float | None, steps: int) -> int:
        """Refinement and class moves until neither lowers the objective or the steps run out;
        returns the steps taken so far (``steps`` on entry)."""
        while self.max_steps is None or steps < self.max_steps:
            if deadline is not None and time.perf_counter() >= deadline:
                break
            if self.balance(lockstep=True):
                steps += 1
                if self.max_steps is not None and steps >= self.max_steps:
                    break
            left = None if self.max_steps is None else self.max_steps - steps
            steps += self.refine(deadline, left)
            if self.max_steps is not None and steps >= self.max_steps:
                break
            if not self.class_move():
                # at the local optimum, once per descent: the class re-split over fewer ranks
                if self._regrouped or not self.regroup():
                    break
                self._regrouped = True
            steps += 1
        return steps

    def run(self) -> Plan:
        try:
            with collector_paused():
                return self._run()
        finally:
            if self._server is not None:
                self._server.close()
                self._server = None

    def _run(self) -> Plan:
        t0 = self._t_start = time.perf_counter()
        deadline = None if self.time_budget_s is None else t0 + self.time_budget_s
        start = self._best_start(before=self.greedy)
        greedy_cost = self.score(self._greedy_state)[0]  # (scored among the starts: remembered)
        # a descent from each of the best starts (the steps shared), the lowest kept: the
        # first on a tie
        steps = 0
        best = None
        for k, cand in enumerate(self._ranked_starts[: self.descents]):
            if k > 0:
                if self.max_steps is not None and steps >= self.max_steps:
                    break
                self._adopt_start(cand)
            self.moves = []
            self._regrouped = False
            steps = self._descend(deadline, steps)
            found = (self.score(self.state), self.state.copy(), dict(self.placed), list(self.moves), cand[0])
            if best is None or improves(found[0], best[0]):
                best = found
        start = best[4]
        self.state, self.placed, self.moves = best[1].copy(), dict(best[2]), list(best[3])
        # perturbations: from the local optimum, a kick and a new descent; kept if better
        kicks = 0
        best = best[:4]
        self._width = self.slow_ranks  # after a kick, steps look at every slow rank
        for _ in range(self.kicks):
            if ((self.max_steps is not None and steps >= self.max_steps)
                    or (deadline is not None and time.perf_counter() >= deadline) or not self.kick()):
                break
            steps = self._descend(deadline, steps + 1)
            self._tabu.clear()
            steps = self._descend(deadline, steps)
            if improves(self.score(self.state), best[0]):
                kicks += 1
                best = (self.score(self.state), self.state.copy(), dict(self.placed), list(self.moves))
            else:
                break
        _, state, placed, self.moves = best
        self.state, self.placed = state.copy(), dict(placed)
        exact = self.exact()
        self._index()
        self.stats = {"greedy_cost_s": greedy_cost, "refine_steps": steps, "exact": float(exact), "kicks": kicks,
                      "planning_s": time.perf_counter() - t0, "start": start, "class_moves": len(self.moves)}
        notes = (f"start {start} (greedy {greedy_cost * 1e3:.3f} ms), {steps} steps"
                 + (f", {kicks} kicks kept" if kicks else "")
                 + (f", class moves: {'; '.join(self.moves)}" if self.moves else "") + (", exact search" if exact else ""),)
        return self.plan("neo", notes)


def _packed_columns(c) -> tuple[np.ndarray, np.ndarray] | None:
    """A contribution kept packed as its columns and each rank's column (``vec`` is
    ``cols[:, idx]``), None for one held as its figures."""
    if isinstance(c, _Relabeled):
        base = c.base
        return base.cols, (base.index if c.inv is None else base.index[c.inv])
    if isinstance(c, PackedContribution):
        return c.cols, c.index
    return None


def _totals_batch(cost: CostModel, vecs: np.ndarray, dps: list[float]) -> np.ndarray:
    """:meth:`CostModel.totals` of a stack of states ``vecs[T, 27, N]`` (element by element
    the same arithmetic, so scores match the one-state path exactly)."""
    comm = cost.system.comm.rank_times_s(vecs[:, 4:24].reshape(len(vecs), 5, 4, -1)).sum(axis=1)
    busy = vecs[:, 3] > 0.5
    ar = np.array([cost._allreduce_s(d) for d in dps])[:, None]
    return (vecs[:, 0] + vecs[:, 1] + vecs[:, 2] + busy * (cost._fwd_overhead + cost._bwd_overhead)
            + cost._sort_s_np(vecs) + comm + ar)


def plan_neo(workload: WorkloadSpec, system: PlannerSystem, time_budget_s: float | None = None,
             max_steps: int | None = DEFAULT_MAX_STEPS, cost: CostModel | None = None,
             progress: Callable[[str], None] | None = None) -> Plan:
    """Neo's plan for ``workload`` on ``system`` (see :class:`NeoPlanner`). The refinement
    stops at convergence or after ``max_steps`` steps: the plan is reproducible. The
    wall-clock ``time_budget_s`` is an opt-in safety (None: off). ``progress``: told where the
    search is, a line at each phase and step (:meth:`NeoPlanner._say`).

    The cyclic collector stays paused until the planner is dropped (here, before the ``with``
    ends), not only through :meth:`NeoPlanner.run`: re-enabled while the planner is alive, its
    first pass traversed every object the search made (all of them young: it was paused while
    they were made) and freed none, 0.24-0.29 CPU-s at the end of model-a's planning at 1024
    GPUs (``gc.callbacks``); after the drop, reference counting has freed them (the planner
    leaves no cycles of its own) and the pass finds the few that are left. The plan does not
    depend on it."""
    with collector_paused():
        return NeoPlanner(workload, system, cost, time_budget_s=time_budget_s, max_steps=max_steps,
                          progress=progress).run()
