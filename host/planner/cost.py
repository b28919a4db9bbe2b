"""The planner's cost model: one iteration's time under a plan, evaluated fast.

A plan is priced on the op graph the simulator runs (``host.schedule`` through
:class:`host.iteration.ScheduleTemplate`: same phases, streams, dependencies, Neo's pipeline,
barriers at every collective, same warm-up and measured iterations), with each op's duration
from the same functions the simulator's payloads use:

* per rank: the fused embedding forward / backward (``host.iteration.shard_kernel_s``: the GPU
  model's kernels, one launch per direction; the cache misses of host-tier shards priced by
  ``sim.memory_tiers.host_transfer_s``, half fetched during the forward and half written back
  during the backward, overlapping the kernel); the backward opens with the rank's one sort
  (``host.iteration.rank_sort_cost``), whose passes step with the bits of the rank's rows
  summed: a state holds each rank's sort keys and rows (additive) and the sort is priced from
  them (:func:`_sort_parts_np`), never per table. The objective
  (:meth:`CostModel.iteration_s_batch`), the per-rank totals the search balances with, a
  plan's evaluation and its reported columns price it; the barrier-sum proxy
  (:meth:`CostModel.barrier_sum_batch` and its kin, which the placer takes node by node)
  leaves it out;
  the dense MLP, interaction and optimizer kernels (``host.iteration.dense_costs``), the input
  copy over PCIe;
* per collective (one time for all ranks): the AlltoAllvs (input indices, pooled embeddings,
  gradients, the node-local reduce-scatter of table-row-wise partials before the pooled one and
  its all-gather after the gradient one) from :class:`~host.planner.system.AlphaBetaComm`'s
  per-rank direct-AlltoAll time, the slowest rank's, the backward's in its own wire precision
  (``IterationSpec.backward_scale``); the AllReduce of the dense and data-parallel gradients
  from the network model's closed form for the scenario's algorithm, in ``[comm_precision]
  allreduce``.

In Neo's pipelined training the dense gradients are all-reduced in PyTorch DDP's buckets: the
template holds the same bucket ops as the simulator's graph (``host.iteration.iteration_buckets``
and ``build_iteration_graph``): the backward split at bucket boundaries (per-layer costs), each
bucket's AllReduce on its own stream as soon as its last gradient exists (its time from the same
closed form, per bucket), the optimizer steps and the next batch's dependencies on them. The
data-parallel tables' gradients are a last bucket, closed by the embedding backward; since a
plan with such tables has one bucket more, the cost model holds two templates (with and
without) and prices each candidate on the one its plan runs.

The objective (:meth:`CostModel.iteration_s`) is the list schedule's time per iteration: every
collective waits for its slowest rank, so an iteration costs the sum along its critical path
of each phase's slowest rank, less what Neo's pipeline overlaps (the input AlltoAll of the
next batch behind this one's MLPs, the AllReduce behind the embedding backward, ...), measured
over the iterations of :data:`PLAN_WINDOW` whatever the run simulates (:meth:`CostModel.evaluate`
prices a plan over the run's own).

What the fast evaluation leaves out (the simulator has it; ``neonic bench planner`` measures the
difference for every plan): contention between concurrent flows on shared links and NICs (the
next batch's input AlltoAll shares the NICs with this batch's pooled AlltoAll and AllReduce),
the SMs a collective holds while kernels run and the interference between concurrent kernels
(HBM shared by a kernel and a collective is priced: ``ScheduleTemplate.iteration_s``), the flow-level network's queueing and max-min fair rates (the direct
AlltoAll is priced by each rank's busiest link class, alpha-beta), the CPU sockets' sharing on
Zion (embedding jobs are priced as GPU kernels) and the SmartNIC's units and caches.

The search needs thousands of evaluations, so :class:`CostModel` also exposes additive
*contributions* (:class:`Contribution`) of single tables and an accumulated :class:`State`;
``evaluate(plan)`` and the state give identical figures (a test holds them together), and a
batch of candidate states is evaluated at once (:meth:`CostModel.iteration_s_batch`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache, partial

import numpy as np

from neonic.host.iteration import (WIRE_BYTES, ScheduleTemplate, allreduce_bytes, dense_costs, dense_phase_s, h2d_bytes,
                                   iteration_buckets, keyed_buckets, shard_kernel_s)
from neonic.host.planner.plan import Plan, TablePlan
from neonic.host.planner.system import PlannerSystem
from neonic.host.planner.work import (COLLECTIVES, CompactWork, IterationWork, Outer, ShardKernel, TableWork,
                                      compact_rows, compact_work, derive_iteration, matrix_aggregates, node_sums)
from neonic.host.workloads.spec import TableSpec, WorkloadSpec
from neonic.sim.network.collectives import NCCL_CONNECTIONS
from neonic.sim.compiled import jit, pairwise_sum
from neonic.sim.gpu import RADIX_SORT_BITS
from neonic.sim.interference import REDUCE_FRACTION, comm_hbm_bytes

#: The iteration's AlltoAll(v) ops (the plan's matrices).
COLLECTIVE_KEYS = ("input_a2a", "pooled_a2a", "grad_a2a", "pooled_rs", "grad_ag")


def _kernel_sm(cost) -> float:
    """A kernel's SM demand in the interference model: compute time over time."""
    t = cost.time_s
    return float(cost.compute_s / t) if t > 0 else 0.0


def _kernel_hbm(cost) -> float:
    """A kernel's HBM demand in the interference model: memory time over time."""
    t = cost.time_s
    return float(cost.memory_s / t) if t > 0 else 0.0


__all__ = ["CostModel", "Contribution", "PackedContribution", "State", "PlanCost", "COST_COLUMNS", "PLAN_WINDOW"]

#: The (warm-up, measured) iterations of the search's objective, whatever a run measures: a plan
#: is made for training's steady state, so it must not depend on how many iterations a scenario
#: simulates (with the run's window, two scenarios differing only in ``iterations`` gave
#: different plans). ASSUMPTION: the pipeline's schedule repeats after two iterations (a batch's
#: prefetch runs one iteration ahead at most), so three measured after two are its steady
#: state; ``neonic bench planner`` simulates the same window. :meth:`CostModel.evaluate` prices
#: a plan on the run's own window, to compare with its simulation.
PLAN_WINDOW = (2, 3)

#: Per-rank cost columns, in report order.
COST_COLUMNS = ("fwd_compute", "bwd_compute", "host_transfer", "input_a2a", "pooled_a2a", "grad_a2a",
                "pooled_rs", "grad_ag", "dp_allreduce")


# Layout of the flat per-rank vectors of a contribution / state (rows of a (27, N) array).
_COMP, _KERN, _AGG, _HBM, _HOST = slice(0, 3), 3, slice(4, 24), 24, slice(25, 27)
# The pooled AlltoAll's messages per rank (:func:`pooled_pattern`): the bytes it sends to every
# other rank, the bytes it sends to each owner its table-row-wise shards finish (its rail), and
# its table-row-wise shards' sum of ``g / m - 1`` (0: every one over a whole node).
_DENSE, _RAIL, _SUB = 27, 28, 29
# The rank's fused backward sort (``host.iteration.rank_sort_cost``): its keys (the backward's
# lookups) and its shards' rows, summed here; the sort's passes are a step function of the rows'
# sum, so its seconds are priced from these sums (:func:`_sort_parts_np`), never added per shard.
_KEYS, _TROWS = 30, 31
_ROWS = 32


def pooled_pattern(tw: TableWork, world: int, gpus_per_node: int,
                   out: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per rank, the bytes of one of its pooled-AlltoAll messages under ``tw``: to every rank
    (an :class:`Outer` term's senders: table-wise, column-wise and row-wise shards send each
    owner the same bytes), and to each owner it finishes the pools of (a :class:`Pairs`
    term's senders: a table-row-wise shard over ``m`` ranks of a node sends ``partial`` bytes
    to the owners ``j`` with ``j % m`` its place, ``host.planner.work.table_work``: ``g / m``
    ranks per other node, among them the one on its own rail, which every table-row-wise shard
    of an aligned group sends to), and for those shards ``g / m - 1`` (how many more ranks
    per other node than its rail it sends to). Summed over tables they give the rank's largest
    off-node message (:meth:`CostModel.alltoall_peers`). ``out``: three zero rows to add them
    to (else new ones)."""
    dense, rail, sub = (np.zeros(world), np.zeros(world), np.zeros(world)) if out is None else out
    for term in tw.traffic.get("pooled", ()):
        if isinstance(term, Outer):
            src = np.asarray(term.src, dtype=float)
            dense += src * float(np.max(term.dst))
        else:
            src = np.ascontiguousarray(term.src, dtype=np.int64)
            nb = np.asarray(term.nbytes, dtype=float)
            nb = np.ascontiguousarray(nb if nb.shape == src.shape else np.broadcast_to(nb, src.shape))
            _pairs_pattern(src, np.ascontiguousarray(term.dst, dtype=np.int64), nb, gpus_per_node, rail, sub)
    return dense, rail, sub


@jit(cache=True, nogil=True)
def _pairs_pattern(src, dst, nbytes, g, rail, sub):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """:func:`pooled_pattern` of a :class:`~host.planner.work.Pairs` term: each sender's largest
    message to another rank into ``rail`` (``np.maximum.at`` in order: ``np.maximum(a, b)`` is
    ``a if a >= b else b`` for numbers), and ``g / senders - 1`` added to each distinct
    sender's ``sub``."""
    n = rail.shape[0]
    seen = np.zeros(n, dtype=np.bool_)
    senders = 0
    for k in range(src.shape[0]):
        s = src[k]
        if s < 0 or s >= n:
            raise IndexError("rank out of range")
        if not seen[s]:
            seen[s] = True
            senders += 1
        if s != dst[k]:
            r, w = rail[s], nbytes[k]
            rail[s] = r if r >= w else w
    extra = g / senders - 1.0
    for i in range(n):
        if seen[i]:
            sub[i] += extra


# ------------------------------------------------------------------ contributions built packed
@jit(cache=True, nogil=True)
def _dedupe_rows(bits):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """The distinct rows of ``bits`` (``(M, L)`` integers: figures' bit patterns), numbered in
    order of first appearance: each row's number, each number's first row, and how many, in
    one pass through a hash table (rows compared in full where their hashes meet)."""
    m, width = bits.shape
    size = 2
    while size < 2 * m:
        size *= 2
    table = np.full(size, -1, dtype=np.int64)
    of = np.empty(m, dtype=np.int64)
    first = np.empty(m, dtype=np.int64)
    k = 0
    for i in range(m):
        h = 3430008
        for j in range(width):
            h = ((h ^ int(bits[i, j])) * 1000003) & 0x7FFFFFFFFFFFFFFF
        at = h & (size - 1)
        while True:
            t = table[at]
            if t < 0:
                table[at] = k
                first[k] = i
                of[i] = k
                k += 1
                break
            r = first[t]
            same = True
            for j in range(width):
                if bits[r, j] != bits[i, j]:
                    same = False
                    break
            if same:
                of[i] = t
                break
            at = (at + 1) & (size - 1)
    return of, first[:k].copy(), k


@jit(cache=True, nogil=True)
def _packed_build(g, node_of, ranks, shape_of, figures, kind, A, B, psrc, pdst, pnb, pooled, mx, w):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """A table's contribution packed (:meth:`CostModel.packed_contribution`): ``(k, cols,
    index)`` with ``cols[:, index]`` the figures :meth:`CostModel.contribution` builds and
    ``cols``, ``index`` what :meth:`PackedContribution.pack` makes of them, bit for bit;
    ``k`` -1 where this does not apply (the caller then builds and packs the figures);
    ``cols`` transposed (``(k, _ROWS)``, C-ordered).

    Each rank's figures are a function of its key (its node's class: the node's sums of each
    outer term; its shard's kernel shape, -1 for none; its shard's place where transfers name
    it; each outer term's factors on it; for a rank without a shard, whether each transfer's
    partner is on its node): they are computed
    once per distinct key, for its first rank, with the arithmetic of the dense path
    (:func:`_add_shards` into zeros, :func:`host.planner.work._outer_rows` with its node's
    and the cluster's pairwise sums, :func:`host.planner.work._pairs_rows` transfer by
    transfer, :func:`pooled_pattern`); ranks of one key therefore have the same bits. The
    columns are then grouped and ordered as :func:`_pack_groups` groups them (by their
    fingerprint ``w``; one group per fingerprint, where its columns are the same bits, else
    -1), so the result is the packed dense figures.

    ``kind[c]``: AlltoAll ``c``'s one term, 0 none, 1 an outer product (``A[c]``, ``B[c]``),
    2 transfers (``psrc[c]``, ``pdst[c]``, ``pnb[c]``; one per rank, one side every rank in
    order, the other side ranks holding a shard, every transfer the same bytes).
    ``figures``: each kernel shape's forward, backward and host-transfer seconds, HBM bytes,
    host bytes and the row they go to (-1: none), its sort's keys and rows. ``pooled``: the pooled AlltoAll's index;
    ``mx``: its outer term's largest ``dst``."""
    n = node_of.shape[0]
    ncoll = kind.shape[0]
    if g <= 0 or n % g != 0:
        return -1, np.empty((0, _ROWS)), np.empty(0, dtype=np.intp)
    nodes = n // g
    slot = np.full(n, -1, dtype=np.int64)
    for k in range(ranks.shape[0]):
        r = ranks[k]
        if r < 0 or r >= n or slot[r] >= 0:
            return -1, np.empty((0, _ROWS)), np.empty(0, dtype=np.intp)
        slot[r] = k
    for i in range(n):
        if node_of[i] < 0 or node_of[i] >= nodes:
            return -1, np.empty((0, _ROWS)), np.empty(0, dtype=np.intp)
    has_pairs = False
    pside = np.zeros(ncoll, dtype=np.int64)   # (which side of each transfer term is every rank)
    for c in range(ncoll):
        if kind[c] == 2:
            has_pairs = True
            pside[c] = 0
            for k in range(n):
                if psrc[c, k] != k:
                    pside[c] = 1
                    break
            nb0 = pnb[c, 0]
            for k in range(n):
                own = psrc[c, k] if pside[c] == 0 else pdst[c, k]
                other = pdst[c, k] if pside[c] == 0 else psrc[c, k]
                if own != k or other < 0 or other >= n or slot[other] < 0 or pnb[c, k] != nb0:
                    return -1, np.empty((0, _ROWS)), np.empty(0, dtype=np.intp)
    # each node's sums and the cluster's, of each outer term (as _outer_rows takes them)
    na = np.zeros((ncoll, nodes))
    nb = np.zeros((ncoll, nodes))
    sa = np.zeros(ncoll)
    sb = np.zeros(ncoll)
    nouter = 0
    for c in range(ncoll):
        if kind[c] == 1:
            nouter += 1
            node_sums(A[c], g, na[c])
            node_sums(B[c], g, nb[c])
            sa[c] = pairwise_sum(A[c], 0, n)
            sb[c] = pairwise_sum(B[c], 0, n)
    nkey = np.zeros((nodes, 2 * ncoll))
    for k in range(nodes):
        for c in range(ncoll):
            nkey[k, 2 * c] = na[c, k]
            nkey[k, 2 * c + 1] = nb[c, k]
    node_class, _, _ = _dedupe_rows(nkey.view(np.int64))
    # each rank's class: a rank holding a shard by its key (its node's class, its shard's
    # kernel shape, its shard's place where there are transfers, each outer term's factors on
    # it), a rank holding none by its node's class and, per transfer term, whether its
    # partner is on its node (a code in base 3)
    m = ranks.shape[0]
    width = 3 + 2 * ncoll
    key = np.zeros((m, width))
    for s in range(m):
        i = ranks[s]
        key[s, 0] = node_class[node_of[i]]
        key[s, 1] = shape_of[s]
        key[s, 2] = s if has_pairs else -1.0
        for c in range(ncoll):
            if kind[c] == 1:
                key[s, 3 + 2 * c] = A[c, i]
                key[s, 4 + 2 * c] = B[c, i]
    shard_class, shard_reps, nshard = _dedupe_rows(key.view(np.int64))
    codes = 1
    for c in range(ncoll):
        if kind[c] == 2:
            codes *= 3
    nnode = 0
    for k in range(nodes):
        nnode = max(nnode, node_class[k] + 1)
    lookup = np.full(nnode * codes, -1, dtype=np.int64)
    cls = np.empty(n, dtype=np.int64)
    reps_all = np.empty(n, dtype=np.int64)
    for j in range(nshard):
        reps_all[j] = ranks[shard_reps[j]]
    nclass = nshard
    for i in range(n):
        s = slot[i]
        if s >= 0:
            cls[i] = shard_class[s]
            continue
        code = 0
        for c in range(ncoll):
            if kind[c] == 2:
                other = pdst[c, i] if pside[c] == 0 else psrc[c, i]
                code = code * 3 + (1 if node_of[other] == node_of[i] else 2)
        at = node_class[node_of[i]] * codes + code
        if lookup[at] < 0:
            lookup[at] = nclass
            reps_all[nclass] = i
            nclass += 1
        cls[i] = lookup[at]
    reps = reps_all[:nclass]
    # the pooled AlltoAll's senders (pooled_pattern of explicit transfers)
    senders = 0
    if kind[pooled] == 2:
        seen = np.zeros(n, dtype=np.bool_)
        for k in range(n):
            s = psrc[pooled, k]
            if not seen[s]:
                seen[s] = True
                senders += 1
    cols = np.zeros((_ROWS, nclass))
    for j in range(nclass):
        i = reps[j]
        s = slot[i]
        if s >= 0:
            h = shape_of[s]
            cols[0, j] = 0.0 + figures[h, 0]
            cols[1, j] = 0.0 + figures[h, 1]
            cols[2, j] = 0.0 + figures[h, 2]
            cols[3, j] = 0.0 + 1.0
            cols[24, j] = 0.0 + figures[h, 3]
            if figures[h, 5] >= 0:
                cols[int(figures[h, 5]), j] = 0.0 + figures[h, 4]
            cols[30, j] = 0.0 + figures[h, 6]
            cols[31, j] = 0.0 + figures[h, 7]
        for c in range(ncoll):
            q = 4 + 4 * c
            if kind[c] == 1:
                ai, bi = A[c, i], B[c, i]
                k = node_of[i]
                send_intra = ai * (nb[c, k] - bi)
                recv_intra = bi * (na[c, k] - ai)
                cols[q, j] = 0.0 + send_intra
                cols[q + 1, j] = 0.0 + (ai * (sb[c] - bi) - send_intra)
                cols[q + 2, j] = 0.0 + recv_intra
                cols[q + 3, j] = 0.0 + (bi * (sa[c] - ai) - recv_intra)
        if kind[pooled] == 1:
            cols[27, j] = 0.0 + A[pooled, i] * mx
    # the transfer terms, in one pass each: every transfer added to its sender's and its
    # receiver's column where they are a class's first rank, in order (the sums of
    # _pairs_rows), the pooled one's largest message per sender and its senders' groups
    # (_pairs_pattern)
    rep_of = np.full(n, -1, dtype=np.int64)
    for j in range(nclass):
        rep_of[reps[j]] = j
    for c in range(ncoll):
        if kind[c] != 2:
            continue
        q = 4 + 4 * c
        for k in range(n):
            a, b = psrc[c, k], pdst[c, k]
            if a == b:
                continue
            ja, jb = rep_of[a], rep_of[b]
            if ja < 0 and jb < 0:
                continue
            x = pnb[c, k]
            same = node_of[a] == node_of[b]
            if ja >= 0:
                if same:
                    cols[q, ja] += x
                else:
                    cols[q + 1, ja] += x
            if jb >= 0:
                if same:
                    cols[q + 2, jb] += x
                else:
                    cols[q + 3, jb] += x
    if kind[pooled] == 2:
        sent = np.zeros(nclass, dtype=np.bool_)
        for k in range(n):
            ja = rep_of[psrc[pooled, k]]
            if ja >= 0:
                sent[ja] = True
                if pdst[pooled, k] != psrc[pooled, k]:
                    r, x = cols[28, ja], pnb[pooled, k]
                    cols[28, ja] = r if r >= x else x
        for j in range(nclass):
            if sent[j]:
                cols[29, j] = 0.0 + (g / senders - 1.0)
    # grouped and ordered as PackedContribution.pack groups: by fingerprint, each group's
    # columns the same bits (the one grouping, _pack_groups)
    first = np.empty(nclass, dtype=np.intp)
    group = np.empty(nclass, dtype=np.intp)
    ng = _pack_groups(cols, cols.view(np.int64), w, first, group) if nclass > 0 else 0
    if ng == 0 and nclass > 0:
        return -1, np.empty((0, _ROWS)), np.empty(0, dtype=np.intp)
    out = np.empty((ng, _ROWS))    # (transposed by the caller: the layout numpy's ``vec[:, first]`` has)
    for t in range(ng):
        for r in range(_ROWS):
            out[t, r] = cols[r, first[t]]
    index = np.empty(n, dtype=np.intp)
    for i in range(n):
        index[i] = group[cls[i]]
    return ng, out, index


def pooled_pattern_np(tw: TableWork, world: int, gpus_per_node: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`pooled_pattern` with numpy's array operations (the specification of the loop)."""
    dense, rail, sub = np.zeros(world), np.zeros(world), np.zeros(world)
    for term in tw.traffic.get("pooled", ()):
        if isinstance(term, Outer):
            src = np.asarray(term.src, dtype=float)
            dense += src * float(np.max(term.dst))
        else:
            src, dst, nb = np.asarray(term.src), np.asarray(term.dst), np.asarray(term.nbytes, dtype=float)
            keep = src != dst
            np.maximum.at(rail, src[keep], np.broadcast_to(nb, src.shape)[keep])
            senders = np.unique(src)
            sub[senders] += gpus_per_node / senders.size - 1.0
    return dense, rail, sub


class Contribution:
    """A table's additive share, as one (30, N) array: compute [fwd, bwd, host] seconds (3),
    kernels per rank (1), comm aggregates (5 collectives x [sent/recv x intra/inter]) bytes (20),
    HBM bytes (1), host bytes [DRAM, SSD] (2), pooled messages [bytes to every rank, bytes on a
    rail, sub-node groups] (3,
    :func:`pooled_pattern`); plus its DP AllReduce bytes."""

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
        """The same contribution with rank ``i`` taking the figures of rank ``inv[i]``
        (``vec[:, inv]``, through ``take``: the same gather, cheaper)."""
        return Contribution(self.vec.take(inv, axis=1), self.dp_bytes)

    def columns(self, sel) -> np.ndarray:
        """``vec[:, sel]`` (``sel``: rank indices of any shape, or a slice)."""
        return self.vec[:, sel]

    def unpacked(self) -> "Contribution":
        return self

    def add_into(self, out: np.ndarray, sign: float = 1.0) -> None:
        """``out += vec`` (``sign`` 1.0), else ``out -= vec``: what :meth:`State.add` does with
        the figures."""
        if sign == 1.0:
            out += self.vec
        else:
            out -= self.vec


@jit(cache=True, nogil=True)
def _add_columns(v, cols, idx, sub):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """``v += cols[:, idx]`` (``sub``: ``v -= cols[:, idx]``) element by element, without the
    gathered array: the same sums (one addition per element). A row of ``cols`` whose columns
    all hold one figure (``==`` and, for zeros, the same sign: the same bits but for NaN, which
    takes the gather) adds that figure to every rank without the gather: the same additions.
    Model-a's packed contributions have 13 such rows of 30 (the collectives a table does not
    use, its host tiers, ...; 8 of a table-row-wise one's), mostly zeros."""
    rows, n = v.shape
    k = cols.shape[1]
    for i in range(rows):
        same = k > 0
        c = cols[i, 0] if k > 0 else 0.0
        for j in range(1, k):
            x = cols[i, j]
            if not (x == c and (x != 0.0 or math.copysign(1.0, x) == math.copysign(1.0, c))):
                same = False
                break
        if same:
            if sub:
                for r in range(n):
                    v[i, r] = v[i, r] - c
            else:
                for r in range(n):
                    v[i, r] = v[i, r] + c
            continue
        for r in range(n):
            if sub:
                v[i, r] = v[i, r] - cols[i, idx[r]]
            else:
                v[i, r] = v[i, r] + cols[i, idx[r]]


def add_columns(out: np.ndarray, cols: np.ndarray, idx: np.ndarray, sign: float = 1.0) -> None:
    """``out += cols[:, idx]`` (``sign`` 1.0), else ``out -= cols[:, idx]``: in one compiled
    pass where ``out`` is a C-ordered float array (:func:`_add_columns`), else numpy's."""
    if (out.dtype == np.float64 and out.flags.c_contiguous and out.flags.writeable and cols.dtype == np.float64
            and out.shape[0] == cols.shape[0]):
        _add_columns(out, cols, idx, sign != 1.0)
    elif sign == 1.0:
        out += cols[:, idx]
    else:
        out -= cols[:, idx]


@jit(cache=True, nogil=True)
def _pack_groups(vec, bits, w, first, index):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """The grouping of ``PackedContribution.pack_np``: each column's fingerprint (``(w[:, None]
    * vec).sum(axis=0)``: numpy adds the rows of a C-ordered array one after the other, from
    the first), its columns ordered by it (a stable sort, as ``np.unique``'s mergesort; equal
    fingerprints, -0.0 and 0.0 among them, one group), each group's first column into
    ``first`` and each column's group into ``index``; then every column checked bit for bit
    (``bits``: ``vec`` viewed as integers) against its group's first. Returns the groups, or 0
    where the check fails or a fingerprint is NaN (numpy's path then decides)."""
    rows, n = vec.shape
    fp = np.empty(n)
    for r in range(n):
        fp[r] = w[0] * vec[0, r]
    for i in range(1, rows):
        for r in range(n):
            fp[r] = fp[r] + w[i] * vec[i, r]
    for r in range(n):
        if fp[r] != fp[r]:
            return 0
    perm = np.argsort(fp, kind="mergesort")
    k = -1
    for j in range(n):
        p = perm[j]
        if j == 0 or fp[p] != fp[perm[j - 1]]:
            k += 1
            first[k] = p
        index[p] = k
    for i in range(rows):   # (row by row: the figures in memory order)
        for r in range(n):
            if bits[i, r] != bits[i, first[index[r]]]:
                return 0
    return k + 1


#: The integer type of a packed contribution's ``index`` (:class:`PackedContribution`) where its
#: columns are at most 65,536 (always, but in a cluster of more ranks with a column each): 2
#: bytes a rank instead of 8. The search keeps about 10,000 contributions at 1024 ranks, each
#: with its own index (8 KiB as ``intp``, 32 KiB at 4096 ranks), carved from heap pages that a
#: forked worker shares (:mod:`host.planner.parallel`): their first write copies each page.
#: Measured in the parent of model-a's planning at 1024 GPUs: 3.7 page faults per
#: :func:`_packed_build` with ``intp``, 2.3 with this. Every kernel reading an index takes it
#: as any integer (a column's figures are the same bits, gathered by either type).
_INDEX_DTYPE = np.uint16


def _narrow_index(index: np.ndarray, columns: int) -> np.ndarray:
    """``index`` (values below ``columns``) as :data:`_INDEX_DTYPE` where that holds them,
    else as it is."""
    if index.dtype == _INDEX_DTYPE or columns > np.iinfo(_INDEX_DTYPE).max + 1:
        return index
    return index.astype(_INDEX_DTYPE)


class PackedContribution:
    """A :class:`Contribution` kept by its distinct columns: ``cols[:, index]`` is its ``vec``,
    bit for bit. A table's figures take few distinct values over the ranks (a table-wise table:
    its rank, the other ranks of its node, every other node's; row-wise over all ranks: the
    shards of each size), so at 1024 ranks a contribution packs into a few KiB instead of
    0.24 MB and the planner's caches hold every table's (unpacked, model-a at 1024 ranks
    overflowed them and recomputed most contributions several times)."""

    __slots__ = ("cols", "index", "dp_bytes")

    def __init__(self, cols: np.ndarray, index: np.ndarray, dp_bytes: float) -> None:
        self.cols = cols
        self.index = _narrow_index(index, cols.shape[1])
        self.dp_bytes = dp_bytes

    #: weights of the columns' fingerprints (:meth:`pack`): any fixed figures do
    _WEIGHTS = np.random.default_rng(0).random(_ROWS) + 0.5

    @classmethod
    def pack(cls, c: Contribution) -> "PackedContribution":
        """``c`` packed, exactly: columns grouped by a fingerprint (a weighted sum of their
        figures, each column's computed alike), the result checked byte for byte against
        ``c`` (so -0.0 and 0.0 stay apart), and where two different columns share a
        fingerprint, grouped by their bytes instead (slower: a sort of whole columns). In one
        compiled pass (:func:`_pack_groups`) where the figures are a C-ordered float array:
        :meth:`pack_np`'s columns and index, bit for bit."""
        vec = c.vec
        if vec.dtype == np.float64 and vec.ndim == 2 and vec.flags.c_contiguous and vec.shape[0] == cls._WEIGHTS.size:
            first = np.empty(vec.shape[1], dtype=np.intp)
            index = np.empty(vec.shape[1], dtype=np.intp)
            k = _pack_groups(vec, vec.view(np.int64), cls._WEIGHTS, first, index)
            if k > 0:
                return cls(vec[:, first[:k]], index, c.dp_bytes)
        return cls.pack_np(c)

    @classmethod
    def pack_np(cls, c: Contribution) -> "PackedContribution":
        """:meth:`pack` with numpy's array operations (the specification of the compiled pass)."""
        vec = c.vec
        fp = (cls._WEIGHTS[:, None] * vec).sum(axis=0)
        _, first, index = np.unique(fp, return_index=True, return_inverse=True)
        index = index.reshape(-1).astype(np.intp, copy=False)
        cols = vec[:, first]
        if cols[:, index].tobytes() != vec.tobytes():
            v = np.ascontiguousarray(vec.T)
            keys = v.view(np.dtype((np.void, v.shape[1] * v.itemsize))).ravel()
            _, first, index = np.unique(keys, return_index=True, return_inverse=True)
            index = index.reshape(-1).astype(np.intp, copy=False)
            cols = vec[:, first]
        return cls(cols, index, c.dp_bytes)

    @property
    def vec(self) -> np.ndarray:
        return self.cols[:, self.index]

    @property
    def nbytes(self) -> int:
        return int(self.cols.nbytes + self.index.nbytes)

    def columns(self, sel) -> np.ndarray:
        """``vec[:, sel]`` without unpacking first."""
        return self.cols[:, self.index[sel]]

    def relabeled(self, inv: np.ndarray) -> Contribution:
        return Contribution(self.cols[:, self.index[inv]], self.dp_bytes)

    def unpacked(self) -> Contribution:
        return Contribution(self.vec, self.dp_bytes)

    def add_into(self, out: np.ndarray, sign: float = 1.0) -> None:
        """``out += vec`` (``sign`` 1.0), else ``out -= vec``, without building ``vec``."""
        add_columns(out, self.cols, self.index, sign)


class State(Contribution):
    """The sum of the contributions of every placed table."""

    __slots__ = ()

    @classmethod
    def empty(cls, world: int) -> "State":
        return cls(np.zeros((_ROWS, world)))

    def add(self, c: Contribution, sign: float = 1.0) -> None:
        c.add_into(self.vec, sign)
        self.dp_bytes += sign * c.dp_bytes

    def plus(self, adds: list[Contribution], subs: list[Contribution]) -> "State":
        """A new state with ``adds`` added and ``subs`` removed."""
        vec = self.vec.copy()
        dp = self.dp_bytes
        for c in subs:
            c.add_into(vec, -1.0)
            dp -= c.dp_bytes
        for c in adds:
            c.add_into(vec)
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
    iteration_s: float = 0.0
    phase_s: dict[str, float] = field(default_factory=dict)
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
        """The predicted iteration time (ms; the objective), each phase's slowest rank (ms), the
        slowest rank's embedding parts, mean, imbalance, peak memory use."""
        r = self.slowest_rank
        out = {"iteration_ms": self.iteration_s * 1e3, "embedding_max_rank_ms": self.max_s * 1e3,
               "mean_ms": self.mean_s * 1e3, "imbalance_max_over_mean": self.imbalance}
        out.update({f"phase_{k}_ms": v * 1e3 for k, v in self.phase_s.items()})
        out.update({f"slowest_{k}_ms": float(v[r]) * 1e3 for k, v in self.columns.items()})
        out["hbm_peak_fraction"] = float(self.hbm_bytes.max() / self.hbm_capacity) if self.hbm_capacity else 0.0
        return out


def _sort_params(gpu) -> np.ndarray:
    """The figures :func:`_sort_parts_np` prices a rank's sort with, from ``gpu``'s efficiencies (those
    of ``sim.gpu.embedding_sort_cost``): key and value bytes, the radix sort's achieved HBM
    bytes per second, its fixed seconds per sort and per pass, and its bits per pass."""
    eff = gpu.efficiency
    return np.array([8.0, 4.0, gpu.hbm_bytes_per_s * eff.radix_sort, eff.radix_sort_fixed_s, eff.radix_sort_pass_s,
                     float(RADIX_SORT_BITS)])


def _sort_parts_np(keys: np.ndarray, rows: np.ndarray, sp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(memory, fixed) seconds of each rank's fused-backward sort of ``keys`` keys over the bits
    of ``rows`` rows, element by element (``sim.gpu.embedding_sort_cost``'s arithmetic,
    operation for operation: the same bits; ``sp``: :func:`_sort_params`); (0, 0) without keys
    or rows. The bit length of a whole number of rows is ``frexp``'s exponent."""
    keys = np.asarray(keys, dtype=np.float64)
    rows = np.asarray(rows, dtype=np.float64)
    on = (keys > 0.0) & (rows >= 1.0)
    bits = np.frexp(np.where(on, rows, 1.0))[1].astype(np.int64)
    radix = int(sp[5])
    passes = (bits + radix - 1) // radix
    kb = sp[0]
    nbytes = keys * (kb + passes * 2.0 * (kb + sp[1]))
    return np.where(on, nbytes / sp[2], 0.0), np.where(on, sp[3] + passes * sp[4], 0.0)


@jit(cache=True, nogil=True)
def _sort_s(keys, rows, sp):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """:func:`_sort_parts_np` of one rank, its two parts added (``KernelCost.time_s``'s sum):
    the same operations, the same bits."""
    if not (keys > 0.0 and rows >= 1.0):
        return 0.0
    bits = math.frexp(rows)[1]
    radix = int(sp[5])
    passes = (bits + radix - 1) // radix
    kb = sp[0]
    nbytes = keys * (kb + passes * 2.0 * (kb + sp[1]))
    return nbytes / sp[2] + (sp[3] + passes * sp[4])


@jit(cache=True, nogil=True)
def _classes_s(sent0, recv0, sent1, recv1, alpha, bw):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """One rank's seconds in one AlltoAll (``rank_times_s``) from its bytes sent and received
    per link class (0 intra-, 1 inter-node): per class the busier direction, ``alpha + bytes /
    bw`` where it sends or receives anything; the slower class."""
    best = 0.0
    for k in range(2):
        sent = sent0 if k == 0 else sent1
        recv = recv0 if k == 0 else recv1
        busiest = sent if sent >= recv else recv
        t = alpha[k] + busiest / bw[k] if busiest > 0 else 0.0
        if k == 0 or t > best:
            best = t
    return best


@jit(cache=True, nogil=True)
def _collective_rank_s(v, c, r, scale, alpha, bw):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """Rank ``r``'s seconds in AlltoAll ``c`` of a state's figures ``v`` (:func:`_classes_s` of
    its bytes times the collective's wire factor ``scale[c]``)."""
    s = scale[c]
    return _classes_s(v[4 + 4 * c, r] * s, v[6 + 4 * c, r] * s, v[5 + 4 * c, r] * s, v[7 + 4 * c, r] * s,
                      alpha, bw)


@jit(cache=True, nogil=True)
def _rank_phases(fwd_s, bwd_s, host_s, kernels, fo, bo):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """One rank's forward and backward embedding seconds from its figures (kernel seconds each
    way, host-tier miss seconds, kernel count): the launch overheads ``fo``/``bo`` where it has
    kernels, at least half the host-tier seconds each way (they overlap the kernels). The
    barrier-sum proxies' figure: without the backward's sort (:func:`_sort_parts_np`), which the
    objective prices."""
    half = host_s / 2
    busy = 1.0 if kernels > 0.5 else 0.0
    a = fwd_s + busy * fo
    b = bwd_s + busy * bo
    return (a if a >= half else half), (b if b >= half else half)


@jit(cache=True, nogil=True)
def _rank_totals(v, scale, alpha, bw, fwd, bwd, dp_s, sp):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """:meth:`CostModel.totals_np` rank by rank with the same arithmetic (``np.maximum(a, b)``
    is ``a if a >= b else b``; each collective's time added in order, as numpy sums the rows
    of ``(5, N)`` over its first axis): the same figures, bit for bit. ``v``: a state's
    ``(29, N)`` figures; ``scale``: each collective's wire factor; ``alpha``, ``bw``: the
    intra- and inter-node terms of ``PlannerSystem.comm``; ``dp_s``: the data-parallel
    AllReduce's seconds; ``sp``: the backward sort's figures (:func:`_sort_params`). In passes over the ranks (the embedding kernels, then each AlltoAll
    added in turn, :func:`_classes_s` written out), each rank's operations the same and in the
    same order: branch-free loops over contiguous rows, which the compiler vectorizes (4x
    faster than rank by rank at 1024 and 4096 ranks; the search asks for some 10-20k of
    these a plan)."""
    n = v.shape[1]
    out = np.empty(n)
    srt = np.empty(n)
    for r in range(n):      # (the sorts in a pass of their own: the next loop stays branch-free)
        srt[r] = _sort_s(v[30, r], v[31, r], sp)
    for r in range(n):
        half = v[2, r] / 2
        busy = 1.0 if v[3, r] > 0.5 else 0.0
        a = v[0, r] + busy * fwd
        b = (v[1, r] + busy * bwd) + srt[r]
        out[r] = (a if a >= half else half) + (b if b >= half else half)
    comm = np.empty(n)
    a0, a1, b0, b1 = alpha[0], alpha[1], bw[0], bw[1]
    for c in range(5):
        s = scale[c]
        q = 4 + 4 * c
        for r in range(n):
            # (_classes_s of the rank's bytes: intra- then inter-node, the slower class)
            sent0, recv0, sent1, recv1 = v[q, r] * s, v[q + 2, r] * s, v[q + 1, r] * s, v[q + 3, r] * s
            m0 = sent0 if sent0 >= recv0 else recv0
            t0 = a0 + m0 / b0 if m0 > 0 else 0.0
            m1 = sent1 if sent1 >= recv1 else recv1
            t1 = a1 + m1 / b1 if m1 > 0 else 0.0
            best = t1 if t1 > t0 else t0
            comm[r] = best if c == 0 else comm[r] + best
    for r in range(n):
        out[r] = out[r] + comm[r] + dp_s
    return out


@jit(cache=True, nogil=True)
def _balance_totals(B, cols, idx, alpha, bw, fobo, ar, sp, out):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """The search's tie-breaking totals (``host.planner.search._totals_batch``) of the state
    ``B + cols[:, idx]`` into ``out``, rank by rank without the state: its kernel rows summed,
    plus ``fobo`` where the rank has kernels, plus its backward sort (``sp``:
    :func:`_sort_params`), plus each AlltoAll's time (``rank_times_s``
    unscaled, added in order from the first; :func:`_classes_s` written out), plus ``ar``, in
    numpy's order of operations: the same figures. In passes over the ranks (the kernels, then
    each AlltoAll added in turn), as :func:`_rank_totals`: each rank's operations the same and
    in the same order, over contiguous rows (about 3x faster than rank by rank at 4096 ranks;
    the greedy start breaks some 7,000 ties with it there)."""
    n = B.shape[1]
    for r in range(n):
        j = idx[r]
        x = (B[0, r] + cols[0, j]) + (B[1, r] + cols[1, j])
        x = x + (B[2, r] + cols[2, j])
        x = x + (fobo if B[3, r] + cols[3, j] > 0.5 else 0.0)
        out[r] = x + _sort_s(B[30, r] + cols[30, j], B[31, r] + cols[31, j], sp)
    comm = np.empty(n)
    a0, a1, b0, b1 = alpha[0], alpha[1], bw[0], bw[1]
    for c in range(5):
        q = 4 + 4 * c
        for r in range(n):
            j = idx[r]
            sent0, recv0 = B[q, r] + cols[q, j], B[q + 2, r] + cols[q + 2, j]
            sent1, recv1 = B[q + 1, r] + cols[q + 1, j], B[q + 3, r] + cols[q + 3, j]
            m0 = sent0 if sent0 >= recv0 else recv0
            t0 = a0 + m0 / b0 if m0 > 0 else 0.0
            m1 = sent1 if sent1 >= recv1 else recv1
            t1 = a1 + m1 / b1 if m1 > 0 else 0.0
            best = t1 if t1 > t0 else t0
            comm[r] = best if c == 0 else comm[r] + best
    for r in range(n):
        out[r] = (out[r] + comm[r]) + ar


#: The row of a contribution a shard's host bytes go to, by its tier (-1: none, in HBM).
_HOST_ROW = {"hbm": -1, "dram": 25, "ssd": 26}
_POOLED = COLLECTIVES.index("pooled")


@jit(cache=True, nogil=True)
def _add_shards(v, ranks, shape_of, times, hbm, host, host_row, sort):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """Add each shard's kernel figures (those of its shape: ``times[shape]`` = (forward,
    backward, host transfer) seconds, HBM bytes, host bytes into row ``host_row[shape]``, its
    sort's keys and rows ``sort[shape]``) and one kernel to its rank's column of ``v``, shard
    by shard in order (``np.add.at``'s sums)."""
    n = v.shape[1]
    for k in range(ranks.shape[0]):
        r, s = ranks[k], shape_of[k]
        if r < 0 or r >= n:
            raise IndexError("rank out of range")
        v[0, r] += times[s, 0]
        v[1, r] += times[s, 1]
        v[2, r] += times[s, 2]
        v[3, r] += 1.0
        v[24, r] += hbm[s]
        if host_row[s] >= 0:
            v[host_row[s], r] += host[s]
        v[30, r] += sort[s, 0]
        v[31, r] += sort[s, 1]


@jit(cache=True, nogil=True)
def _phase_maxima(vecs, scale, alpha, bw, fo, bo, fwd, bwd, comm):  # pragma: no cover  (compiled)
    """For each of ``T`` states ``vecs[t]`` (a state's figures): the slowest rank's forward and
    backward embedding kernels (launch overheads where a rank has kernels; host-tier misses
    overlapping them) into ``fwd[t]``, ``bwd[t]``, and the sum over the five AlltoAlls of each
    one's slowest rank (``rank_times_s``: the busier direction of each link class, ``alpha +
    bytes / bw``, the slower class) into ``comm[t]``, with :meth:`CostModel.barrier_sum_batch_np`'s
    arithmetic (``np.maximum(a, b)``: ``a if a >= b else b``; the five added in order from 0,
    as numpy sums a short row)."""
    T, n = vecs.shape[0], vecs.shape[2]
    for t in range(T):
        v = vecs[t]
        f = -np.inf
        b = -np.inf
        for r in range(n):
            a, a2 = _rank_phases(v[0, r], v[1, r], v[2, r], v[3, r], fo, bo)
            f = a if a > f else f
            b = a2 if a2 > b else b
        fwd[t] = f
        bwd[t] = b
        total = 0.0
        for c in range(5):
            worst = -np.inf
            for r in range(n):
                best = _collective_rank_s(v, c, r, scale, alpha, bw)
                worst = best if best > worst else worst
            total += worst
        comm[t] = total


@jit(cache=True, nogil=True)
def _proxy_plus(minus, cols, idx, caps, scale, alpha, bw, fo, bo, out):  # pragma: no cover  (compiled)
    """:func:`_phase_maxima` of the state ``minus + cols[:, idx]`` (a state's figures less a
    table's, plus a packed contribution's columns), without building it (each figure the one
    addition numpy's would make), and whether it fits the memory caps ``caps`` (HBM, DRAM,
    SSD, each with its tolerance added: ``x <= cap`` on every rank). ``out``: fits (1.0 or
    0.0), the forward's and backward's slowest rank, the AlltoAlls' slowest ranks summed."""
    n = minus.shape[1]
    fits = 1.0
    for row in range(24, 27):
        for r in range(n):
            if not minus[row, r] + cols[row, idx[r]] <= caps[row - 24]:
                fits = 0.0
    f = -np.inf
    b = -np.inf
    for r in range(n):
        j = idx[r]
        a, a2 = _rank_phases(minus[0, r] + cols[0, j], minus[1, r] + cols[1, j], minus[2, r] + cols[2, j],
                             minus[3, r] + cols[3, j], fo, bo)
        f = a if a > f else f
        b = a2 if a2 > b else b
    total = 0.0
    for c in range(5):
        worst = -np.inf
        q, s = 4 + 4 * c, scale[c]
        for r in range(n):
            j = idx[r]
            best = _classes_s((minus[q, r] + cols[q, j]) * s, (minus[q + 2, r] + cols[q + 2, j]) * s,
                              (minus[q + 1, r] + cols[q + 1, j]) * s, (minus[q + 3, r] + cols[q + 3, j]) * s,
                              alpha, bw)
            worst = best if best > worst else worst
        total += worst
    out[0] = fits
    out[1] = f
    out[2] = b
    out[3] = total


@jit(cache=True, nogil=True)
def _swap_at(minus, oc, oi, c1, i1, c2, i2, row, r):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """One figure of the state ``minus - oc[:, oi] + c1[:, i1] + c2[:, i2]``, in that order (what
    the search's stack of swap candidates holds, element by element)."""
    return ((minus[row, r] - oc[row, oi[r]]) + c1[row, i1[r]]) + c2[row, i2[r]]


@jit(cache=True, nogil=True)
def _proxy_swap(minus, oc, oi, c1, i1, c2, i2, caps, scale, alpha, bw, fo, bo, out):  # pragma: no cover  (compiled)
    """:func:`_proxy_plus` of the state ``minus`` less one table's packed columns ``oc[:, oi]``
    plus two others' ``c1[:, i1]`` and ``c2[:, i2]`` (a swap of two tables: the state less
    both, each placed on the other's unit), each figure the additions numpy's would make in
    that order (:func:`_swap_at`), without building the state: the same ``out``."""
    n = minus.shape[1]
    fits = 1.0
    for row in range(24, 27):
        for r in range(n):
            if not _swap_at(minus, oc, oi, c1, i1, c2, i2, row, r) <= caps[row - 24]:
                fits = 0.0
    f = -np.inf
    b = -np.inf
    for r in range(n):
        a, a2 = _rank_phases(_swap_at(minus, oc, oi, c1, i1, c2, i2, 0, r), _swap_at(minus, oc, oi, c1, i1, c2, i2, 1, r),
                             _swap_at(minus, oc, oi, c1, i1, c2, i2, 2, r), _swap_at(minus, oc, oi, c1, i1, c2, i2, 3, r),
                             fo, bo)
        f = a if a > f else f
        b = a2 if a2 > b else b
    total = 0.0
    for c in range(5):
        worst = -np.inf
        q, s = 4 + 4 * c, scale[c]
        for r in range(n):
            best = _classes_s(_swap_at(minus, oc, oi, c1, i1, c2, i2, q, r) * s,
                              _swap_at(minus, oc, oi, c1, i1, c2, i2, q + 2, r) * s,
                              _swap_at(minus, oc, oi, c1, i1, c2, i2, q + 1, r) * s,
                              _swap_at(minus, oc, oi, c1, i1, c2, i2, q + 3, r) * s, alpha, bw)
            worst = best if best > worst else worst
        total += worst
    out[0] = fits
    out[1] = f
    out[2] = b
    out[3] = total


def _shard_times(gpu, pcie: float, ssd: float, lookups: int, pooled_rows: int, row_bytes: int,
                 out_row_bytes: int, unique_rows: int, state_bytes: int, tier: str,
                 miss_bytes: float) -> tuple[float, float, float]:
    """(forward, backward, host transfer) seconds of one shard of these figures on ``gpu`` (host
    link ``pcie``, SSD ``ssd`` bytes/s), without launch overheads (:meth:`CostModel.kernel_times`)."""
    k = ShardKernel(0, lookups, pooled_rows, row_bytes, out_row_bytes, unique_rows, state_bytes, tier, miss_bytes, 0.0, 0.0, 0)
    return shard_kernel_s(gpu, k, pcie, ssd)


class CostModel:
    """Costs plans (and table contributions) for one workload on one system."""

    def __init__(self, workload: WorkloadSpec, system: PlannerSystem) -> None:
        self.workload = workload
        self.system = system
        self.world = system.world_size
        self.node_of = system.node_of()
        eff = system.gpu.efficiency
        self._fwd_overhead = eff.launch_overhead_s
        # the fused update's launch; the rank's sort before it is priced from its keys and rows
        self._bwd_overhead = eff.launch_overhead_s
        self._sort = _sort_params(system.gpu)
        self._allreduce_cache: dict[float, float] = {}
        #: :meth:`_allreduce_total_s` by its exact ``dp_bytes`` (the balancing search asks it for
        #: every candidate of every step, a few distinct figures among hundreds)
        self._allreduce_total_cache: dict[float, float] = {}
        spec = system.iteration
        self.spec = spec
        # the one GPU-host link figure of the run (the scenario's [host]; else the system's host link)
        self._pcie = spec.pcie_gbytes_per_s * 1e9 if spec.pcie_gbytes_per_s else system.host_link_bytes_per_s
        self._ssd = system.memory.ssd_gbytes_per_s * 1e9
        # one shard's kernel seconds by its figures (:meth:`kernel_times`), over the figures this
        # model fixes, not a bound method: a cache of ``self``'s own method would make the model
        # a reference cycle, left (with what it holds) to the cyclic collector once dropped
        self._kernel_cache = lru_cache(maxsize=65536)(partial(_shard_times, system.gpu, self._pcie, self._ssd))
        self.dense = dense_costs(system.gpu, workload, spec.dense_dtype)
        ar_dtype = spec.allreduce_dtype(system.comm_dtype)
        self._ar_wire = WIRE_BYTES[ar_dtype]
        self._dense_ar_bytes = allreduce_bytes(self.dense, 0.0, ar_dtype)
        # the backward's float AlltoAlls (grad, ag) in their own wire precision
        self._agg_scale = np.ones(len(COLLECTIVES))
        b = spec.backward_scale(system.comm_dtype)
        self._agg_scale[COLLECTIVES.index("grad")] = b
        self._agg_scale[COLLECTIVES.index("ag")] = b
        self._fixed = dense_phase_s(self.dense, spec.mode)
        # HBM demands of the fixed kernels (the interference model's, ``sim.interference``)
        self._hbm_bps = system.gpu.hbm_bytes_per_s * eff.hbm_stream
        self._fixed_hbm = {p: _kernel_hbm(getattr(self.dense, p)) for p in self._fixed}
        self._fixed_sm = {p: _kernel_sm(getattr(self.dense, p)) for p in self._fixed}
        self._fixed["h2d"] = h2d_bytes(workload, system.index_bytes, system.length_bytes) / self._pcie
        self.bucketed = spec.bucketed
        self._grad_bytes = spec.bucket_config().grad_bytes if self.bucketed else 0.0
        self._bucket_cache: dict[float, dict[str, float]] = {}
        if self.bucketed:
            for p in ("top_bwd", "inter_bwd", "bot_bwd", "dense_opt"):
                self._fixed.pop(p, None)  # replaced by the bucket ops' keys
        # the search's templates, on the planning window; the run's own built when first asked
        self._templates = self._make_templates(replace(spec, warmup=PLAN_WINDOW[0], iterations=PLAN_WINDOW[1]))
        self._run_templates = (self._templates if (spec.warmup, spec.iterations) == PLAN_WINDOW else None)
        self.template = self._templates[False]
        # how the iteration's collectives share a NIC (flows each keeps open through it)
        nf = system.comm.nic_flows
        self._flows = {k: float(nf.get("alltoallv", 1)) for k in COLLECTIVE_KEYS}
        # the node-local reduce-scatter and all-gather of row-wise partials cross no NIC
        self._flows.update({"pooled_rs": 0.0, "grad_ag": 0.0})
        for t in self._templates.values():
            self._flows.update({k: float(nf.get("allreduce", 1)) for k in t.keys if k.startswith("allreduce")})

    def _make_templates(self, spec) -> dict[bool, ScheduleTemplate]:
        """The op graph's templates of ``spec``: without / with a data-parallel tables' gradient
        bucket (the plan decides), one template if the gradients are not bucketed."""
        if self.bucketed:
            return {False: ScheduleTemplate(spec, self._buckets(0.0)), True: ScheduleTemplate(spec, self._buckets(1.0))}
        t = ScheduleTemplate(spec)
        return {False: t, True: t}

    def _buckets(self, dp_bytes: float):
        """The iteration's gradient buckets for ``dp_bytes`` of data-parallel tables, with each
        bucket's AllReduce as its wire bytes."""
        return iteration_buckets(self.spec, self.dense, dp_bytes, lambda n: float(n * self._ar_wire))

    def _bucket_table(self, dp_bytes: float) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
        """Seconds, HBM and SM demands of every bucket op of the template (keys of
        ``host.iteration.keyed_buckets``) for ``dp_bytes`` of data-parallel tables."""
        key = round(float(dp_bytes), 3)
        out = self._bucket_cache.get(key)
        if out is None:
            _, table = keyed_buckets(self._buckets(float(dp_bytes)))
            times: dict[str, float] = {}
            hbm: dict[str, float] = {}
            sm: dict[str, float] = {}
            for k, v in table.items():
                if isinstance(v, (int, float)):  # an AllReduce's wire bytes
                    times[k] = self._allreduce_s(float(v))
                    hbm[k] = self._allreduce_hbm(float(v), times[k])
                else:
                    times[k] = float(v.time_s)
                    hbm[k] = _kernel_hbm(v)
                    sm[k] = _kernel_sm(v)
            out = (times, hbm, sm)
            self._bucket_cache[key] = out
        return out

    def bucket_times(self, dp_bytes: float) -> dict[str, float]:
        """Seconds of every bucket op of the template (keys of ``host.iteration.keyed_buckets``)
        for ``dp_bytes`` of data-parallel tables."""
        return self._bucket_table(dp_bytes)[0]

    def _allreduce_hbm(self, nbytes: float, seconds: float) -> float:
        """HBM demand of an AllReduce of ``nbytes`` lasting ``seconds`` on each rank: every
        algorithm sends and receives ``2 (p - 1) / p`` of the buffer per rank, half of what it
        receives reduced (``sim.interference.REDUCE_FRACTION``), over its time."""
        if seconds <= 0 or nbytes <= 0:
            return 0.0
        p = self.world
        moved = 2.0 * (p - 1) / p * nbytes
        return float(comm_hbm_bytes(moved, moved, REDUCE_FRACTION["allreduce"])) / seconds / self._hbm_bps

    # ----------------------------------------------------------------- the GPU model (one call site)
    def kernel_times(self, k: ShardKernel) -> tuple[float, float, float]:
        """(forward, backward, host transfer) seconds of one shard, without launch overheads."""
        return self._kernel_cache(k.lookups, k.pooled_rows, k.row_bytes, k.out_row_bytes, k.unique_rows,
                                  k.state_bytes_per_row, k.tier, k.miss_bytes)

    def _sort_s_np(self, vecs: np.ndarray) -> np.ndarray:
        """Seconds of each rank's fused-backward sort (``host.iteration.rank_sort_cost``) from a
        state's (or a stack of states') summed keys and rows (:func:`_sort_parts_np`)."""
        m, f = _sort_parts_np(vecs[..., _KEYS, :], vecs[..., _TROWS, :], self._sort)
        return m + f

    # ----------------------------------------------------------------- contributions and states
    def contribution(self, tw: TableWork | CompactWork) -> Contribution:
        """A table's additive contribution (through its kernels and traffic terms); from a
        :class:`~host.planner.work.CompactWork`, each kernel shape is priced once (the same
        figures, added in the same order)."""
        c = Contribution.zeros(self.world)
        v = c.vec
        if isinstance(tw, CompactWork):
            ranks, shapes = tw.ranks, tw.shapes
            shape_times = np.array([self.kernel_times(k) for k in shapes], dtype=np.float64).reshape(-1, 3)
            hbm = np.array([k.hbm_bytes for k in shapes], dtype=np.float64)
            host = np.array([k.host_bytes for k in shapes], dtype=np.float64)
            host_row = np.array([_HOST_ROW[k.tier] for k in shapes], dtype=np.int64)
            sort = np.array([(k.lookups, k.rows) for k in shapes], dtype=np.float64).reshape(-1, 2)
            _add_shards(v, np.ascontiguousarray(ranks, dtype=np.int64), np.ascontiguousarray(tw.shape_of, dtype=np.int64),
                        shape_times, hbm, host, host_row, sort)
        else:
            ks = tw.kernels
            if len(ks) > 1:
                # a table split over many ranks (row-wise over 128 ranks: 128 kernels): scattered at
                # once, each rank's terms added in the kernels' order (the same sums as one by one)
                ranks = np.fromiter((k.rank for k in ks), dtype=np.int64, count=len(ks))
                times = np.array([self.kernel_times(k) for k in ks])
                for row in range(3):
                    np.add.at(v[row], ranks, times[:, row])
                np.add.at(v[_KERN], ranks, 1.0)
                np.add.at(v[_HBM], ranks, np.fromiter((k.hbm_bytes for k in ks), dtype=float, count=len(ks)))
                np.add.at(v[_KEYS], ranks, np.fromiter((k.lookups for k in ks), dtype=float, count=len(ks)))
                np.add.at(v[_TROWS], ranks, np.fromiter((k.rows for k in ks), dtype=float, count=len(ks)))
                for tier, row in (("dram", 25), ("ssd", 26)):
                    on = [i for i, k in enumerate(ks) if k.tier == tier]
                    if on:
                        np.add.at(v[row], ranks[on], np.array([ks[i].host_bytes for i in on], dtype=float))
            for k in ks[:1] if len(ks) == 1 else ():
                v[0:3, k.rank] += self.kernel_times(k)
                v[_KERN, k.rank] += 1
                v[_HBM, k.rank] += k.hbm_bytes
                v[_KEYS, k.rank] += k.lookups
                v[_TROWS, k.rank] += k.rows
                if k.tier != "hbm":
                    v[25 if k.tier == "dram" else 26, k.rank] += k.host_bytes
        # (added in place to the zero rows: the same sums as into new zero arrays)
        tw.aggregates(self.node_of, self.system.gpus_per_node, out=v[_AGG].reshape(len(COLLECTIVES), 4, -1))
        pooled_pattern(tw, self.world, self.system.gpus_per_node, out=(v[_DENSE], v[_RAIL], v[_SUB]))
        c.dp_bytes = tw.dp_allreduce_bytes
        return c

    def packed_contribution(self, tw: CompactWork) -> PackedContribution:
        """``PackedContribution.pack(self.contribution(tw))``, bit for bit, without the
        ``30 x world`` figures: each distinct rank column computed once (a table's figures take
        a few values over the ranks: :func:`_packed_build`), where the table's terms are those
        :func:`host.planner.work.compact_work` makes (one per AlltoAll, over distinct ranks);
        else built and packed."""
        got = self._packed_direct(tw) if isinstance(tw, CompactWork) else None
        return got if got is not None else PackedContribution.pack(self.contribution(tw))

    def _packed_scratch(self) -> tuple:
        """The terms' rows :func:`_packed_build` reads (reused: only the rows of the terms
        present are read), and the ranks' nodes."""
        scratch = self.__dict__.get("_scratch")
        if scratch is None:
            n, ncoll = self.world, len(COLLECTIVES)
            scratch = self._scratch = (np.zeros((ncoll, n)), np.zeros((ncoll, n)), np.zeros((ncoll, n), dtype=np.int64),
                                       np.zeros((ncoll, n), dtype=np.int64), np.zeros((ncoll, n)),
                                       np.ascontiguousarray(self.node_of, dtype=np.int64))
        return scratch

    def _packed_direct(self, tw: CompactWork) -> PackedContribution | None:
        """:meth:`packed_contribution` through :func:`_packed_build`, None where it does not apply."""
        n, ncoll = self.world, len(COLLECTIVES)
        A, B, psrc, pdst, pnb, node_of = self._packed_scratch()
        kind = np.zeros(ncoll, dtype=np.int64)
        mx = 0.0
        traffic = tw.traffic
        for c, name in enumerate(COLLECTIVES):
            terms = traffic.get(name)
            if not terms:
                continue
            if len(terms) > 1:
                return None
            term = terms[0]
            if len(term.src) != n or len(term.dst) != n:
                return None
            try:
                if type(term) is Outer:
                    A[c] = term.src
                    B[c] = term.dst
                    kind[c] = 1
                    if name == "pooled":
                        mx = float(np.max(term.dst))
                else:
                    psrc[c] = term.src
                    pdst[c] = term.dst
                    pnb[c] = term.nbytes
                    kind[c] = 2
            except ValueError:   # (bytes per transfer of another shape)
                return None
        return self._packed_from_rows(tw.ranks, tw.shape_of, tw.shapes, kind, mx, tw.dp_allreduce_bytes)

    def _packed_from_rows(self, ranks: np.ndarray, shape_of: np.ndarray, shapes, kind: np.ndarray, mx: float,
                          dp_bytes: float) -> PackedContribution | None:
        """:func:`_packed_build` of the terms in the scratch rows (``kind``: which, as
        :func:`host.planner.work.compact_rows` says), None where it does not apply."""
        A, B, psrc, pdst, pnb, node_of = self._packed_scratch()
        figures = np.array([(*self.kernel_times(k), k.hbm_bytes, k.host_bytes, _HOST_ROW[k.tier], k.lookups, k.rows)
                            for k in shapes], dtype=np.float64).reshape(-1, 8)
        k, cols, index = _packed_build(self.system.gpus_per_node, node_of, np.ascontiguousarray(ranks, dtype=np.int64),
                                       np.ascontiguousarray(shape_of, dtype=np.int64), figures, kind, A, B, psrc,
                                       pdst, pnb, _POOLED, mx, PackedContribution._WEIGHTS)
        if k < 0:
            return None
        return PackedContribution(cols.T, index, dp_bytes)

    def packed_plan(self, table: TableSpec, tp: TablePlan, workload: WorkloadSpec,
                    system: PlannerSystem) -> PackedContribution:
        """``packed_contribution(compact_work(table, tp, workload, system))``, bit for bit,
        without the :class:`~host.planner.work.CompactWork` and its term arrays: the terms
        written straight into the rows :func:`_packed_build` reads
        (:func:`host.planner.work.compact_rows`): about a fifth less per contribution the
        search builds (10,000 of them at 1024 GPUs); where the rows do not apply, the long way."""
        A, B, psrc, pdst, pnb, _ = self._packed_scratch()
        if system.world_size == self.world:
            kind = np.zeros(len(COLLECTIVES), dtype=np.int64)
            got = compact_rows(table, tp, workload, system, A, B, psrc, pdst, pnb, kind)
            if got is not None:
                ranks, shape_of, shapes, mx, dp = got
                packed = self._packed_from_rows(ranks, shape_of, shapes, kind, mx, dp)
                if packed is not None:
                    return packed
        return self.packed_contribution(compact_work(table, tp, workload, system))

    def _allreduce_s(self, nbytes: float) -> float:
        key = round(nbytes, 3)
        if key not in self._allreduce_cache:
            self._allreduce_cache[key] = self.system.comm.allreduce_time_s(nbytes, self.world) if nbytes > 0.5 else 0.0
        return self._allreduce_cache[key]

    def _dp_allreduce_s(self, dp_bytes: float) -> float:
        """The data-parallel tables' AllReduce alone, as the iteration runs it: their own bucket
        in the allreduce wire precision (gradient buckets, ``host.gradients``: table bytes /
        4 elements) or their share of the single AllReduce (bytes as the plan gives them)."""
        if self.bucketed:
            return self._allreduce_s(dp_bytes / self._grad_bytes * self._ar_wire)
        return self._allreduce_s(dp_bytes)

    def columns(self, state: State) -> dict[str, np.ndarray]:
        """Per-rank seconds per :data:`COST_COLUMNS` for an accumulated state."""
        busy = state.kernels > 0.5
        comm = self.system.comm.rank_times_s(state.agg * self._agg_scale[:, None, None])
        cols = {
            "fwd_compute": state.comp[0] + busy * self._fwd_overhead,
            "bwd_compute": (state.comp[1] + busy * self._bwd_overhead) + self._sort_s_np(state.vec),
            "host_transfer": state.comp[2].copy(),
        }
        for name, c in zip(("input_a2a", "pooled_a2a", "grad_a2a", "pooled_rs", "grad_ag"), comm):
            cols[name] = c
        cols["dp_allreduce"] = np.full(self.world, self._dp_allreduce_s(state.dp_bytes))
        return cols

    def totals(self, state: State) -> np.ndarray:
        """Per-rank total seconds (the fast path of :meth:`columns`): :meth:`totals_np`'s
        arithmetic in one compiled loop (:func:`_rank_totals`; the search asks for it some 30k
        times a plan)."""
        alpha, bw = self._alpha_bw()
        v = state.vec
        if v.dtype != np.float64 or not v.flags.c_contiguous:
            return self.totals_np(state)
        return _rank_totals(v, self._agg_scale, alpha, bw, self._fwd_overhead, self._bwd_overhead,
                            self._dp_allreduce_s(state.dp_bytes), self._sort)

    def balance_totals_plus(self, B: np.ndarray, cols: np.ndarray, idx: np.ndarray, dp_bytes: float,
                            out: np.ndarray) -> None:
        """The search's tie-breaking per-rank totals (``host.planner.search._totals_batch``) of
        the state ``B + cols[:, idx]`` (a state's figures plus a packed contribution's columns)
        into ``out``, without building the state: one compiled pass (:func:`_balance_totals`),
        the same figures."""
        alpha, bw = self._alpha_bw()
        ar = float(np.array([self._allreduce_s(dp_bytes)])[0])
        _balance_totals(B, cols, idx, alpha, bw, self._fwd_overhead + self._bwd_overhead, ar, self._sort, out)

    def totals_np(self, state: State) -> np.ndarray:
        """:meth:`totals` with numpy's array operations (the specification of the loop)."""
        v = state.vec
        comm = self.system.comm.rank_times_s(v[_AGG].reshape(len(COLLECTIVES), 4, -1)
                                             * self._agg_scale[:, None, None]).sum(axis=0)
        busy = v[_KERN] > 0.5
        # the embedding ops as phase_times prices them (host-tier misses overlap the kernels)
        emb = (np.maximum(v[0] + busy * self._fwd_overhead, v[2] / 2)
               + np.maximum((v[1] + busy * self._bwd_overhead) + self._sort_s_np(v), v[2] / 2))
        return emb + comm + self._dp_allreduce_s(state.dp_bytes)

    # ----------------------------------------------------------------- the iteration
    def phase_times(self, vecs: np.ndarray, dps) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Per-rank phase seconds ``(T, N)`` and collective seconds ``(T,)`` of ``T`` states
        (``vecs[T, 27, N]``, data-parallel bytes ``dps[T]``) on the iteration's op graph."""
        vecs = np.asarray(vecs)
        T = vecs.shape[0]
        busy = vecs[:, _KERN] > 0.5
        host = vecs[:, 2]
        rank = {p: np.broadcast_to(np.float64(v), (T, self.world)) for p, v in self._fixed.items()}
        # host-tier misses: fetched during the forward, written back during the backward, over
        # the GPU-host link alongside the fused kernel (the simulator's flows: host.iteration)
        rank["emb_fwd"] = np.maximum(vecs[:, 0] + busy * self._fwd_overhead, host / 2)
        rank["emb_bwd"] = np.maximum((vecs[:, 1] + busy * self._bwd_overhead) + self._sort_s_np(vecs), host / 2)
        agg = vecs[:, _AGG].reshape(T, len(COLLECTIVES), 4, -1) * self._agg_scale[None, :, None, None]
        comm = self.system.comm.rank_times_s(agg).max(axis=2)  # (T, 5): each collective's slowest rank
        coll = {"input_a2a": comm[:, 0], "pooled_a2a": comm[:, 1], "grad_a2a": comm[:, 2],
                "pooled_rs": comm[:, 3], "grad_ag": comm[:, 4]}
        dps = np.broadcast_to(np.asarray(dps, float), (T,))
        if self.bucketed:
            times = [self.bucket_times(d) for d in dps]
            for key in dict.fromkeys(k for t in times for k in t):
                v = np.array([t.get(key, 0.0) for t in times])
                if key.startswith("allreduce#"):
                    coll[key] = v
                else:
                    rank[key] = np.broadcast_to(v[:, None], (T, self.world))
        elif self.spec.mode == "training":
            coll["allreduce"] = np.array([self._allreduce_s(self._dense_ar_bytes + d) for d in dps])
        if self.spec.embeddings == "cpu":
            recv = (agg[:, 1, 2] + agg[:, 1, 3]) / self._pcie
            rank["pooled_h2d"] = recv
            rank["grad_d2h"] = recv
        return rank, coll

    def hbm_demands(self, vecs: np.ndarray, dps, coll: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """HBM demands of ``T`` states' ops (``sim.interference``'s terms, for the template's
        kernel/collective sharing): each kernel's memory time over its time (the fused embedding
        kernels are memory-bound: their time less the launch overheads), each collective's HBM
        bytes per second on each rank over the achievable bandwidth (AlltoAllvs: the bytes the
        rank sends and receives over the collective's time ``coll``)."""
        vecs = np.asarray(vecs)
        T = vecs.shape[0]
        out: dict[str, np.ndarray] = dict(self._fixed_hbm)
        with np.errstate(divide="ignore", invalid="ignore"):
            k = vecs[:, 0]
            out["emb_fwd"] = np.where(k > 0, k / (k + self._fwd_overhead), 0.0)
            # the backward: the update's kernel time and the sort's memory time over its whole time
            m, f = _sort_parts_np(vecs[:, _KEYS], vecs[:, _TROWS], self._sort)
            k = vecs[:, 1] + m
            out["emb_bwd"] = np.where(k > 0, k / (k + (self._bwd_overhead + f)), 0.0)
            agg = vecs[:, _AGG].reshape(T, len(COLLECTIVES), 4, -1) * self._agg_scale[None, :, None, None]
            for c, name in enumerate(("input_a2a", "pooled_a2a", "grad_a2a", "pooled_rs", "grad_ag")):
                sent = agg[:, c, 0] + agg[:, c, 1]
                recv = agg[:, c, 2] + agg[:, c, 3]
                t = np.asarray(coll[name], float)[:, None]
                out[name] = np.where(t > 0, comm_hbm_bytes(sent, recv, REDUCE_FRACTION["alltoallv"]) / (t * self._hbm_bps), 0.0)
        if self.bucketed:
            tables = [self._bucket_table(d)[1] for d in np.broadcast_to(np.asarray(dps, float), (T,))]
            for key in dict.fromkeys(k for t in tables for k in t):
                out[key] = np.array([t.get(key, 0.0) for t in tables])
                if not key.startswith("allreduce#"):
                    out[key] = out[key][:, None]
        elif "allreduce" in coll:
            nbytes = [self._dense_ar_bytes + d for d in np.broadcast_to(np.asarray(dps, float), (T,))]
            out["allreduce"] = np.array([self._allreduce_hbm(n, t) for n, t in zip(nbytes, coll["allreduce"])])
        return out

    def sm_demands(self, T: int, dps) -> dict[str, np.ndarray]:
        """SM demands (compute time over time) of the dense kernels of ``T`` states (the fused
        embedding kernels are memory-bound: none)."""
        out: dict[str, np.ndarray] = {k: np.float64(v) for k, v in self._fixed_sm.items()}
        if self.bucketed:
            tables = [self._bucket_table(d)[2] for d in np.broadcast_to(np.asarray(dps, float), (T,))]
            for key in dict.fromkeys(k for t in tables for k in t):
                out[key] = np.array([t.get(key, 0.0) for t in tables])[:, None]
        return out

    def alltoall_peers(self, vecs: np.ndarray) -> dict[str, np.ndarray]:
        """The flows each rank of ``T`` states keeps through its NIC in each NIC-crossing
        AlltoAll, on the direction of its NIC with more bytes (``(T, N)`` per collective),
        counted as max-min fair sharing sees them over the collective's time: its off-node
        bytes ``W`` over its largest off-node message ``s``, times the queue pairs a message to
        an off-node peer takes (``sim.network.collectives.NCCL_CONNECTIONS.p2p``).

        Why ``W / s``: the simulator runs each message as its own flow(s), and on the NIC every
        live flow gets an equal share; a flow holds it only while it has bytes left. Beside a
        partner of ``m`` flows that outlasts it, a collective whose flows carry ``s_1 <= ... <=
        s_n`` bytes ends when its largest does, at ``(W + m s_n) / R`` (between two finishes
        each live flow moves ``R / (live + m)``: the increments sum to ``W`` for the
        collective's flows and to ``m s_n`` for the partner's), which is the time a collective
        of ``w`` equal flows takes exactly when ``w = W / s_n`` -- the peer count when every
        message is the same size, fewer when small ones (a row-wise table's partial pools to
        every rank beside the table-row-wise ones on the rail) finish early. APPROXIMATION:
        the template gives a collective that weight for its whole time, also where it outlasts
        its partner.

        The messages, from the plan's terms (``host.planner.work``, the matrices the simulator
        runs): in the pooled AlltoAll a rank sends its :func:`pooled_pattern` dense bytes to
        every other rank, plus its table-row-wise bytes to the owners it finishes the pools of
        (``g / m`` per other node for a group of ``m`` ranks, its rail among them, which gets
        them all); an owner's largest received message is the largest of another node's rank
        on its rail (dense plus table-row-wise bytes), any other node's dense bytes, and, from
        a rank with table-row-wise shards over part of a node (which also finish the pools of
        ranks off its rail), its dense plus table-row-wise bytes (APPROXIMATION: as if it sent
        all of them to every owner; exact where its groups' owners include the owner's rank).
        The gradient AlltoAll is the pooled one reversed. In the input AlltoAll every rank sends an owner the same bytes
        (its received bytes over the ``N - 1`` senders)."""
        vecs = np.asarray(vecs)
        T, N, g = vecs.shape[0], self.world, self.system.gpus_per_node
        nodes = N // g
        agg = vecs[:, _AGG].reshape(T, len(COLLECTIVES), 4, N)
        node = np.arange(nodes)

        def others_max(a: np.ndarray) -> np.ndarray:
            """``(T, nodes, ...)`` -> for each node, the max over the other nodes (0 if none)."""
            if nodes < 2:
                return np.zeros_like(a)
            order = np.argsort(-a, axis=1, kind="stable")
            top = np.take_along_axis(a, order[:, :1], axis=1)
            second = np.take_along_axis(a, order[:, 1:2], axis=1)
            own_top = order[:, :1] == node.reshape((1, nodes) + (1,) * (a.ndim - 2))
            return np.where(own_top, second, top)

        dense, rail = vecs[:, _DENSE], vecs[:, _RAIL]
        pooled_tx_s = np.where(rail > 0, dense + rail, dense)
        by_rail = others_max((dense + rail).reshape(T, nodes, g))                       # (T, nodes, g)
        part = np.where(vecs[:, _SUB] > 1e-9, dense + rail, dense)        # sub-node senders: to owners off their rail
        by_any = others_max(part.reshape(T, nodes, g).max(axis=2))[:, :, None]          # (T, nodes, 1)
        pooled_rx_s = np.maximum(by_rail, by_any).reshape(T, N)
        per_owner = (agg[:, 0, 2] + agg[:, 0, 3]) / max(N - 1, 1)                     # input bytes per sender
        input_tx_s = np.repeat(others_max(per_owner.reshape(T, nodes, g).max(axis=2)[:, :, None])[:, :, 0], g, axis=1)

        def count(w: np.ndarray, s: np.ndarray) -> np.ndarray:
            with np.errstate(divide="ignore", invalid="ignore"):
                return np.where((w > 0) & (s > 0), w / s, 0.0)

        pooled = (count(agg[:, 1, 1], pooled_tx_s), count(agg[:, 1, 3], pooled_rx_s))
        grad = (count(agg[:, 2, 1], pooled_rx_s), count(agg[:, 2, 3], pooled_tx_s))
        inp = (count(agg[:, 0, 1], input_tx_s), count(agg[:, 0, 3], per_owner))
        qps = float(NCCL_CONNECTIONS.p2p)
        return {name: qps * np.where(agg[:, c, 1] >= agg[:, c, 3], *flows)
                for c, (name, flows) in enumerate((("input_a2a", inp), ("pooled_a2a", pooled), ("grad_a2a", grad)))}

    def alltoall_flows(self, vecs: np.ndarray) -> dict[str, np.ndarray]:
        """The flows each of ``T`` states' NIC-crossing AlltoAlls keeps open through a NIC
        (``(T,)`` per collective; :meth:`alltoall_peers`), the template's weights: under the
        simulator's max-min fair sharing per flow, concurrent collectives share a NIC in
        proportion to them. A collective is a barrier, so it is weighed at the rank that ends it
        last beside its partner: the pooled AlltoAll beside the next batch's input AlltoAll
        (and that one beside the pooled one), over the partner's isolated time ``D``, a rank
        with work ``w`` and share ``f`` of its NIC ending at ``w / f`` if that is within ``D``,
        else at ``w + D (1 - f)``. (A table-row-wise rank on its rail keeps few flows beside
        the input AlltoAll's and is starved while it runs, though a table-wise rank bounds the
        collective alone.) The gradient AlltoAll, whose partners are the buckets' one-flow
        AllReduces, at its busiest rank. APPROXIMATION: the template then stretches the
        collective's isolated time (its busiest rank's) at that rank's share."""
        vecs = np.asarray(vecs)
        T = vecs.shape[0]
        peers = self.alltoall_peers(vecs)
        agg = vecs[:, _AGG].reshape(T, len(COLLECTIVES), 4, -1) * self._agg_scale[None, :, None, None]
        times = self.system.comm.rank_times_s(agg)                 # (T, 5, N)
        rows = np.arange(T)
        out: dict[str, np.ndarray] = {}
        for c, name, partner in ((0, "input_a2a", 1), (1, "pooled_a2a", 0), (2, "grad_a2a", None)):
            f, w = peers[name], times[:, c]
            if partner is None:
                last = w.argmax(axis=1)
            else:
                fp = peers[("input_a2a", "pooled_a2a")[partner]]
                D = times[:, partner].max(axis=1, keepdims=True)
                with np.errstate(divide="ignore", invalid="ignore"):
                    share = np.where(f + fp > 0, f / (f + fp), 1.0)
                    end = np.where(share > 0, np.where(w <= share * D, w / share, w + D * (1.0 - share)), w)
                last = end.argmax(axis=1)
            out[name] = f[rows, last]
        return out

    def iteration_s_batch(self, vecs: np.ndarray, dps, contention: bool = True, run: bool = False) -> np.ndarray:
        """The objective of ``T`` states at once (see :meth:`iteration_s`). ``contention=False``:
        the same schedule with every op at its isolated duration (no network or HBM sharing,
        one pass instead of the fixed point's; a screen the search uses to pick which
        candidates to price in full). ``run``: on the run's measured window instead of
        :data:`PLAN_WINDOW`."""
        templates = self._templates
        if run:
            if self._run_templates is None:
                self._run_templates = self._make_templates(self.spec)
            templates = self._run_templates
        rank, coll = self.phase_times(vecs, dps)
        if contention:
            hbm = self.hbm_demands(vecs, dps, coll)
            sm = self.sm_demands(np.asarray(vecs).shape[0], dps) if self.spec.comm_sm_share > 0 else None
            flows: dict[str, float | np.ndarray] = {**self._flows, **self.alltoall_flows(vecs)}
        else:
            hbm, sm, flows = {}, None, {}
        if not self.bucketed:
            return templates[False].iteration_s(rank, coll, share_network=contention, hbm=hbm, flows=flows, sm=sm)
        T = next(iter(rank.values())).shape[0]
        has = np.broadcast_to(np.asarray(dps, float), (T,)) > 0
        out = np.empty(T)

        def pick(v, idx):
            v = np.asarray(v)
            return v[idx] if v.ndim >= 1 and v.shape[0] == T and T > 1 else v

        for flag in (False, True):
            idx = np.nonzero(has == flag)[0]
            if idx.size == 0:
                continue
            out[idx] = templates[flag].iteration_s({k: np.asarray(v)[idx] for k, v in rank.items()},
                                                         {k: np.asarray(v)[idx] for k, v in coll.items()},
                                                         share_network=contention,
                                                         hbm={k: pick(v, idx) for k, v in hbm.items()},
                                                         flows={k: pick(v, idx) for k, v in flows.items()},
                                                         sm=None if sm is None else {k: pick(v, idx) for k, v in sm.items()})
        return out

    def barrier_sum_batch(self, vecs: np.ndarray, dps) -> np.ndarray:
        """Sum over the plan-dependent phases of each phase's slowest rank, for ``T`` states:
        the iteration as if nothing overlapped (a cheap proxy the greedy start uses; the search
        itself minimises :meth:`iteration_s`; the proxy leaves out each rank's backward sort,
        whose step in the rows would break the placer's node-wise maxima). Each phase's slowest rank in one compiled loop
        (:func:`_phase_maxima`), combined as :meth:`barrier_sum_batch_np` combines them: the
        same figures, bit for bit."""
        vecs = np.asarray(vecs)
        if vecs.dtype != np.float64:
            return self.barrier_sum_batch_np(vecs, dps)
        T = vecs.shape[0]
        alpha, bw = self._alpha_bw()
        fwd, bwd, comm = np.empty(T), np.empty(T), np.empty(T)
        _phase_maxima(vecs, self._agg_scale, alpha, bw, self._fwd_overhead, self._bwd_overhead, fwd, bwd, comm)
        dps = np.broadcast_to(np.asarray(dps, float), (T,))
        return fwd + bwd + comm + np.array([self._allreduce_total_s(float(d)) for d in dps])

    def barrier_sum_plus(self, minus: np.ndarray, cols: np.ndarray, idx: np.ndarray, dp_bytes: float,
                         caps: np.ndarray) -> float | None:
        """:meth:`barrier_sum_batch` of the one state ``minus + cols[:, idx]`` (a state less a
        table's figures, plus a packed contribution's columns), without building it: the same
        figure (one compiled pass, :func:`_proxy_plus`); None where it does not fit ``caps``
        (HBM, DRAM, SSD bytes, tolerance included)."""
        alpha, bw = self._alpha_bw()
        out = np.empty(4)
        _proxy_plus(minus, cols, idx, caps, self._agg_scale, alpha, bw, self._fwd_overhead, self._bwd_overhead, out)
        if out[0] == 0.0:
            return None
        return float(out[1] + out[2] + out[3] + self._allreduce_total_s(float(dp_bytes)))

    def barrier_sum_swap(self, minus: np.ndarray, other: tuple[np.ndarray, np.ndarray],
                         first: tuple[np.ndarray, np.ndarray], second: tuple[np.ndarray, np.ndarray],
                         dp_bytes: float, caps: np.ndarray) -> float | None:
        """:meth:`barrier_sum_batch` of the one state ``minus`` less the packed columns
        ``other`` (``(cols, each rank's column)``) plus ``first`` and ``second``, added in that
        order (a swap: the state less both tables, each on the other's unit), without building
        it: the same figure (one compiled pass, :func:`_proxy_swap`); None where it does not fit
        ``caps`` (HBM, DRAM, SSD bytes, tolerance included)."""
        alpha, bw = self._alpha_bw()
        out = np.empty(4)
        _proxy_swap(minus, other[0], other[1], first[0], first[1], second[0], second[1], caps, self._agg_scale,
                    alpha, bw, self._fwd_overhead, self._bwd_overhead, out)
        if out[0] == 0.0:
            return None
        return float(out[1] + out[2] + out[3] + self._allreduce_total_s(float(dp_bytes)))

    def barrier_sum_batch_np(self, vecs: np.ndarray, dps) -> np.ndarray:
        """:meth:`barrier_sum_batch` with numpy's array operations (the specification)."""
        vecs = np.asarray(vecs)
        T = vecs.shape[0]
        busy = vecs[:, _KERN] > 0.5
        host = vecs[:, 2] / 2
        fwd = np.maximum(vecs[:, 0] + busy * self._fwd_overhead, host).max(axis=1)
        bwd = np.maximum(vecs[:, 1] + busy * self._bwd_overhead, host).max(axis=1)
        agg = vecs[:, _AGG].reshape(T, len(COLLECTIVES), 4, -1) * self._agg_scale[None, :, None, None]
        comm = self.system.comm.rank_times_s(agg).max(axis=2).sum(axis=1)
        dps = np.broadcast_to(np.asarray(dps, float), (T,))
        return fwd + bwd + comm + np.array([self._allreduce_total_s(float(d)) for d in dps])

    def _alpha_bw(self) -> tuple[np.ndarray, np.ndarray]:
        """The (intra, inter)-node latency and bandwidth ``PlannerSystem.comm.rank_times_s``
        prices a rank's busiest link class with."""
        ab = self.system.comm.__dict__.get("_alpha_bw")
        if ab is None:
            self.system.comm.rank_times_s(np.zeros((4, 1)))       # (makes the figures it keeps)
            ab = self.system.comm.__dict__["_alpha_bw"]
        return ab[0][:, 0], ab[1][:, 0]

    def _allreduce_total_s(self, dp_bytes: float) -> float:
        """The iteration's AllReduces summed (every bucket's, or the single one) for
        ``dp_bytes`` of data-parallel tables (:meth:`phase_times`' collectives other than the
        AlltoAlls); remembered by ``dp_bytes``, the same figure."""
        hit = self._allreduce_total_cache.get(dp_bytes)
        if hit is None:
            hit = self._allreduce_total_cache[dp_bytes] = self._allreduce_total_uncached_s(dp_bytes)
        return hit

    def _allreduce_total_uncached_s(self, dp_bytes: float) -> float:
        if self.bucketed:
            return float(sum(v for k, v in self.bucket_times(dp_bytes).items() if k.startswith("allreduce#")))
        if self.spec.mode == "training":
            return self._allreduce_s(self._dense_ar_bytes + dp_bytes)
        return 0.0

    def iteration_s(self, state: State, run: bool = False) -> float:
        """Predicted seconds per iteration of an accumulated state: the objective, on the
        iterations of :data:`PLAN_WINDOW`; ``run``: on the run's own measured window."""
        return float(self.iteration_s_batch(state.vec[None], [state.dp_bytes], run=run)[0])

    def phase_summary(self, state: State) -> dict[str, float]:
        """Each phase's slowest rank (seconds): per-rank phases' max, collectives' time."""
        rank, coll = self.phase_times(state.vec[None], [state.dp_bytes])
        out: dict[str, float] = {}
        for p, v in [*((p, v[0].max()) for p, v in rank.items()), *((p, v[0]) for p, v in coll.items())]:
            phase = p.split("#")[0]  # a bucket op counts toward its phase (summed)
            out[phase] = out.get(phase, 0.0) + float(v)
        phases = self.spec.phases()
        return {p: out[p] for p in phases if p in out}

    # ----------------------------------------------------------------- whole plans
    def state_of(self, work: IterationWork) -> State:
        """The accumulated state of a derived iteration (through its full matrices)."""
        st = State.empty(self.world)
        v = st.vec
        for r, ks in enumerate(work.kernels):
            for k in ks:
                v[0:3, r] += self.kernel_times(k)
                v[_KERN, r] += 1
                v[_KEYS, r] += k.lookups
                v[_TROWS, r] += k.rows
        for c, name in enumerate(COLLECTIVES):
            v[4 + 4 * c: 8 + 4 * c] = matrix_aggregates(work.matrices[name], self.system.gpus_per_node)
        st.dp_bytes = work.dp_allreduce_bytes
        for tw in work.tables.values():
            dense, rail, sub = pooled_pattern(tw, self.world, self.system.gpus_per_node)
            v[_DENSE] += dense
            v[_RAIL] += rail
            v[_SUB] += sub
        v[_HBM] = work.hbm_bytes
        v[25] = work.dram_bytes
        v[26] = work.ssd_bytes
        return st

    def evaluate(self, plan: Plan) -> PlanCost:
        """The full cost of a plan, through :func:`derive_iteration` (the runtime's view)."""
        work = derive_iteration(plan, self.workload, self.system)
        st = self.state_of(work)
        s = self.system
        return PlanCost(self.columns(st), st.hbm, st.host[0], st.host[1], s.hbm_capacity, s.dram_capacity, s.ssd_capacity,
                        iteration_s=self.iteration_s(st, run=True), phase_s=self.phase_summary(st))
