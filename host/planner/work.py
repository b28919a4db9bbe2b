"""One iteration's per-rank work and communication, derived from a plan (the one home of it).

:func:`derive_iteration` turns a :class:`~host.planner.plan.Plan` into an
:class:`IterationWork`: per shard, the fused embedding kernels' work (lookups, bags pooled, row
and output sizes, rows updated by the backward, bytes fetched from DRAM/SSD through the cache),
and per collective an AlltoAllv size matrix (bytes, ``[src, dst]``):

``input``   forward input AlltoAll: indices (``index_bytes`` each) and bag lengths
            (``length_bytes`` per bag) from each sample's owner to the ranks holding the rows;
``pooled``  forward pooled-embedding AlltoAll: pooled vectors back to the samples' owners;
``grad``    backward gradient AlltoAll (the transpose of ``pooled``);
``rs``      forward reduce-scatter of table-row-wise partial pools inside the node, to the
            rank that forwards the owner's samples (it must end before the reduced pools can
            leave the node: a collective of its own, before ``pooled``);
``ag``      backward all-gather of those gradients inside the node (the transpose of ``rs``,
            after ``grad``);

Row-wise tables over all ranks send every shard's partial pools straight to the samples' owners
(who reduce them) inside ``pooled``, and their gradients back inside ``grad``.

plus ``dp_allreduce_bytes``: the dense gradients of data-parallel tables, AllReduced over all
ranks. The cost model (:mod:`host.planner.cost`) and the cluster runtime both consume exactly
this; the search uses the same per-table pieces (:func:`table_work`) incrementally.

Assumptions: every rank owns ``batch_per_gpu`` samples; lookups of a row-wise table fall on its
row shards in proportion to their rows (hashed ids); the backward updates
``rows (1 - exp(-lookups / rows))`` distinct rows (uniform access); TWRW forwards owner ``j``'s
samples through shard ``j mod m`` of the node; pooled vectors travel in ``comm_dtype``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from neonic.host.planner.plan import TIERS, Plan, ShardingType, TablePlan
from neonic.host.planner.system import PlannerSystem
from neonic.host.workloads.spec import TableSpec, WorkloadSpec
from neonic.sim.compiled import jit, pairwise_block, pairwise_sum
from neonic.sim.memory_tiers import miss_bytes as tier_miss_bytes

__all__ = [
    "COLLECTIVES",
    "ShardKernel",
    "Outer",
    "Pairs",
    "TableWork",
    "IterationWork",
    "table_work",
    "CompactWork",
    "compact_work",
    "derive_iteration",
    "matrix_aggregates",
]

COLLECTIVES = ("input", "pooled", "grad", "rs", "ag")

#: Up to this many shards a table's kernel shapes are found shard by shard, beyond it with array
#: operations (the same shapes, numbered alike: :func:`compact_work`).
_FEW_SHARDS = 32


@dataclass(frozen=True)
class ShardKernel:
    """The embedding kernels' work for one shard on ``rank`` in one iteration."""

    rank: int
    lookups: int              # rows gathered in the forward (and gradients scattered back)
    pooled_rows: int          # bags pooled (outputs written)
    row_bytes: int            # bytes per gathered row of this shard
    out_row_bytes: int        # bytes per pooled output row
    unique_rows: int          # rows updated by the fused backward + optimizer
    state_bytes_per_row: int  # optimizer state per row
    tier: str                 # where the rows live
    miss_bytes: float         # bytes moved to/from DRAM/SSD through the cache (fwd fetch + bwd write-back)
    hbm_bytes: float          # HBM the shard occupies (weights + state, or its cache)
    host_bytes: float         # DRAM/SSD the shard occupies
    rows: int                 # the shard's rows (its rank's fused backward sorts over all its shards' rows)


@dataclass(frozen=True)
class Outer:
    """Traffic ``bytes[i, j] = src[i] * dst[j]`` for ``i != j`` (a rank sends nothing to itself)."""

    src: np.ndarray
    dst: np.ndarray


@dataclass(frozen=True)
class Pairs:
    """Explicit transfers ``src[k] -> dst[k]`` of ``nbytes[k]`` (entries with src == dst ignored)."""

    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray


Term = Outer | Pairs


@dataclass(frozen=True)
class TableWork:
    """One table's share of an iteration: its shards' kernels and its traffic per collective."""

    table: str
    kernels: tuple[ShardKernel, ...]
    traffic: dict[str, tuple[Term, ...]]
    dp_allreduce_bytes: float = 0.0

    def matrices(self, world: int) -> dict[str, np.ndarray]:
        out = {name: np.zeros((world, world)) for name in COLLECTIVES}
        for name, terms in self.traffic.items():
            for term in terms:
                _add_term(out[name], term)
        return out

    def aggregates(self, node_of: np.ndarray, gpus_per_node: int, out: np.ndarray | None = None) -> np.ndarray:
        """(collective, [sent_intra, sent_inter, recv_intra, recv_inter], rank) bytes (added to
        ``out`` where given: a ``(5, 4, N)`` array, a view of a contribution's rows)."""
        return _aggregates(self.traffic, node_of, gpus_per_node, out)


def _add_term(m: np.ndarray, term: Term) -> None:
    if isinstance(term, Outer):
        block = np.outer(term.src, term.dst)
        np.fill_diagonal(block, 0.0)
        m += block
    else:
        keep = term.src != term.dst
        np.add.at(m, (term.src[keep], term.dst[keep]), term.nbytes[keep])


def _sum_terms(world: int, terms: list[Term], chunk: int = 512) -> np.ndarray:
    """The (N, N) sum of many terms: the outer products as one matrix product per ``chunk``
    terms (``src`` rows stacked against ``dst`` rows), the pairs scattered at once; the
    diagonal (a rank to itself) is zero. Where the matrix product's entries do not depend on
    its order of summation (:func:`_add_disjoint_outers`, :func:`_add_whole_outers`) they are
    added without it, and the pairs in ``np.add.at``'s order by a compiled loop
    (:func:`_add_pairs`): the same figures, bit for bit."""
    m = np.zeros((world, world))
    if not terms:
        return m  # (its diagonal already zero: left untouched, its pages not mapped)
    outers = [t for t in terms if isinstance(t, Outer)]
    if outers:
        src = np.stack([t.src for t in outers]).astype(float, copy=False)
        dst = np.stack([t.dst for t in outers]).astype(float, copy=False)
        if not (_disjoint(m, src, dst) or _add_whole_outers(m, src, dst)):
            for i in range(0, len(outers), chunk):
                m += src[i:i + chunk].T @ dst[i:i + chunk]
    pairs = [t for t in terms if not isinstance(t, Outer)]
    if pairs:
        src = np.concatenate([t.src for t in pairs])
        dst = np.concatenate([t.dst for t in pairs])
        nb = np.concatenate([np.broadcast_to(t.nbytes, t.src.shape) for t in pairs])
        _add_pairs(m, _i64(src), _i64(dst), _f64(nb))
    np.fill_diagonal(m, 0.0)
    return m


@jit(cache=True, nogil=True)
def _add_pairs(m, src, dst, nbytes):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """``np.add.at(m, (src, dst), nbytes)`` of the transfers with ``src != dst``: each added
    in order, as ``add.at`` adds them (a rank out of range refused, not wrapped)."""
    n0, n1 = m.shape
    for k in range(src.shape[0]):
        s, d = src[k], dst[k]
        if s == d:
            continue
        if s < 0 or s >= n0 or d < 0 or d >= n1:
            raise IndexError("rank out of range")
        m[s, d] += nbytes[k]


#: :func:`_add_whole_outers` sums exactly while no sum of the products can exceed this (every
#: whole number up to 2**53 is a double; half of it leaves room for the bound's own rounding)
_EXACT_LIMIT = 2.0 ** 52


def _add_whole_outers(m: np.ndarray, src: np.ndarray, dst: np.ndarray) -> bool:
    """Add the outer products ``src[k] x dst[k]`` to the zero matrix ``m`` term by term, over
    each term's nonzero figures only, where every figure is a whole number and no entry's sum
    of products, taken in absolute value, can exceed :data:`_EXACT_LIMIT` (table-row-wise
    plans' reduce-scatter and all-gather: 1.0 per shard against whole bytes per owner). Then
    every product and every partial sum is a whole number a double holds exactly, so the sum
    is exact in any order, with or without fused multiply-adds: the matrix product's entries,
    bit for bit (an exact zero is +0.0 in both: ``m`` starts at +0.0 and round-to-nearest
    gives +0.0 to a sum that cancels). Skipping zero figures also skips terms that add only
    zeros. False (``m`` untouched) where a figure is not whole, or not finite, or the bound is
    exceeded, or the terms are dense enough that the matrix product is the cheaper."""
    if not (np.isfinite(src).all() and np.isfinite(dst).all()):
        return False
    if not (np.array_equal(np.floor(src), src) and np.array_equal(np.floor(dst), dst)):
        return False
    if float((np.abs(src).max(axis=1) * np.abs(dst).max(axis=1)).sum()) > _EXACT_LIMIT:
        return False
    src_nz, dst_nz = np.count_nonzero(src, axis=1), np.count_nonzero(dst, axis=1)
    if int(src_nz @ dst_nz) * 16 > src.shape[0] * src.shape[1] * dst.shape[1]:
        return False  # (more than a sixteenth of the dense product's multiply-adds)
    _add_sparse_outers(m, src, dst)
    return True


@jit(cache=True, nogil=True)
def _add_sparse_outers(m, src, dst):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """``m[i, j] += src[k, i] * dst[k, j]`` for each term ``k`` and each ``i``, ``j`` where
    both figures are nonzero, term by term."""
    n_src, n_dst = src.shape[1], dst.shape[1]
    rows = np.empty(n_src, dtype=np.intp)
    cols = np.empty(n_dst, dtype=np.intp)
    for k in range(src.shape[0]):
        nr = 0
        for i in range(n_src):
            if src[k, i] != 0.0:
                rows[nr] = i
                nr += 1
        nc = 0
        for j in range(n_dst):
            if dst[k, j] != 0.0:
                cols[nc] = j
                nc += 1
        for a in range(nr):
            i = rows[a]
            s = src[k, i]
            for b in range(nc):
                j = cols[b]
                m[i, j] += s * dst[k, j]


def _add_disjoint_outers(m: np.ndarray, outers: list[Outer]) -> bool:
    """Add the outer products to the zero matrix ``m`` without a matrix product where no entry
    has two nonzero products: every rank's row (or every rank's column) nonzero in at most one
    term, as a table-wise plan's terms at 1024 and 4096 ranks are (a table per rank at most).
    An entry is then its one product (or zero), and so is the matrix product's, whatever order
    and fused multiply-adds the BLAS uses: a sum of one product and exact zeros is that
    product. False (``m`` untouched) where the terms overlap or a figure is not finite."""
    if not outers:
        return True
    src = np.stack([t.src for t in outers]).astype(float, copy=False)
    dst = np.stack([t.dst for t in outers]).astype(float, copy=False)
    return _disjoint(m, src, dst)


def _disjoint(m: np.ndarray, src: np.ndarray, dst: np.ndarray) -> bool:
    """:func:`_add_disjoint_outers` of the terms stacked (``src[k]``, ``dst[k]``: term ``k``)."""
    if not (np.isfinite(src).all() and np.isfinite(dst).all()):
        return False
    src_nz, dst_nz = src != 0, dst != 0
    row_terms, col_terms = src_nz.sum(axis=0), dst_nz.sum(axis=0)
    if row_terms.max() <= 1:
        # row i is src[k, i] * dst[k] of its one term k (zero where it has none)
        owner = np.where(row_terms == 1, src_nz.argmax(axis=0), -1)
        _add_row_owned(m, owner, src, dst)
        return True
    if col_terms.max() <= 1:
        # column j is src[k] * dst[k, j] of its one term k: row i is src[owner, i] * dst of
        # the owners (a column without a term: a product with zero, added to zero)
        owner = dst_nz.argmax(axis=0)
        dv = dst[owner, np.arange(dst.shape[1])]
        _add_col_owned(m, owner, np.ascontiguousarray(src.T), dv)
        return True
    return False


@jit(cache=True, nogil=True)
def _add_row_owned(m, owner, src, dst):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """``m[i] += src[owner[i], i] * dst[owner[i]]`` for each row with an owner (>= 0)."""
    for i in range(m.shape[0]):
        k = owner[i]
        if k >= 0:
            m[i] += src[k, i] * dst[k]


@jit(cache=True, nogil=True)
def _add_col_owned(m, owner, src_t, dv):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """``m[i] += src_t[i][owner] * dv`` for each row (``src_t``: the terms' sources, rank by term)."""
    for i in range(m.shape[0]):
        m[i] += src_t[i][owner] * dv


def _term_aggregates(out: np.ndarray, term: Term, node_of: np.ndarray, g: int) -> None:
    """Add ``term``'s bytes per rank to ``out`` (rows: sent intra-node, sent inter-node,
    received intra-node, received inter-node), in one compiled loop (:func:`_outer_rows`,
    :func:`_pairs_rows`: :func:`_term_aggregates_np`'s figures, bit for bit)."""
    if isinstance(term, Outer):
        _outer_rows(_f64(term.src), _f64(term.dst), _i64(node_of), g, out)
    else:
        nb = np.asarray(term.nbytes, dtype=np.float64)
        if nb.shape != np.shape(term.src):
            nb = np.broadcast_to(nb, np.shape(term.src))
        _pairs_rows(_i64(term.src), _i64(term.dst), np.ascontiguousarray(nb), _i64(node_of), out)


def _f64(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float64)


def _i64(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int64)


#: numpy's pairwise sum of at most 128 terms (:func:`sim.compiled.pairwise_sum` is ``0.0 +`` it
#: there), inlined into the kernels that sum each node's figures: a call per node took about
#: 90 ns, 50 us of the 100-200 us a contribution packed at 1024 ranks cost.
_block_sum = jit(cache=True, nogil=True, inline="always")(getattr(pairwise_block, "py_func", pairwise_block))


@jit(cache=True, nogil=True, inline="always")
def node_sums(a, g, out):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """``out[k] = pairwise_sum(a, k * g, g)`` for each node ``k`` (``out``: one per node)."""
    if g <= 128:
        for k in range(out.shape[0]):
            out[k] = 0.0 + _block_sum(a, k * g, g)
    else:
        for k in range(out.shape[0]):
            out[k] = pairwise_sum(a, k * g, g)


@jit(cache=True, nogil=True)
def _outer_rows(a, b, node_of, g, out):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """:func:`_term_aggregates_np` of an :class:`Outer` term, rank by rank: each node's sums and
    the whole sums summed as numpy sums them (:func:`sim.compiled.pairwise_sum`), then the
    same products and differences, each added to ``out`` as numpy adds the arrays."""
    n = a.shape[0]
    nodes = n // g
    na = np.empty(nodes)
    nb = np.empty(nodes)
    node_sums(a, g, na)
    node_sums(b, g, nb)
    sa = pairwise_sum(a, 0, n)
    sb = pairwise_sum(b, 0, n)
    for i in range(n):
        ai, bi = a[i], b[i]
        k = node_of[i]
        send_intra = ai * (nb[k] - bi)
        recv_intra = bi * (na[k] - ai)
        out[0, i] += send_intra
        out[1, i] += ai * (sb - bi) - send_intra
        out[2, i] += recv_intra
        out[3, i] += bi * (sa - ai) - recv_intra


@jit(cache=True, nogil=True)
def _pairs_rows(src, dst, nbytes, node_of, out):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """:func:`_term_aggregates_np` of a :class:`Pairs` term: each transfer added in order (as
    ``np.add.at`` and ``np.bincount`` add them)."""
    for k in range(src.shape[0]):
        s, d = src[k], dst[k]
        if s == d:
            continue
        w = nbytes[k]
        if node_of[s] == node_of[d]:
            out[0, s] += w
            out[2, d] += w
        else:
            out[1, s] += w
            out[3, d] += w


def _term_aggregates_np(out: np.ndarray, term: Term, node_of: np.ndarray, g: int) -> None:
    """:func:`_term_aggregates` with numpy's array operations (the specification of the loops)."""
    if isinstance(term, Outer):
        a, b = term.src, term.dst
        node_b = b.reshape(-1, g).sum(axis=1)[node_of]
        node_a = a.reshape(-1, g).sum(axis=1)[node_of]
        send_intra = a * (node_b - b)
        recv_intra = b * (node_a - a)
        out[0] += send_intra
        out[1] += a * (b.sum() - b) - send_intra
        out[2] += recv_intra
        out[3] += b * (a.sum() - a) - recv_intra
    else:
        keep = term.src != term.dst
        src, dst, nb = term.src[keep], term.dst[keep], np.broadcast_to(term.nbytes, term.src.shape)[keep]
        intra = node_of[src] == node_of[dst]
        _scatter_add(out[0], src[intra], nb[intra])
        _scatter_add(out[1], src[~intra], nb[~intra])
        _scatter_add(out[2], dst[intra], nb[intra])
        _scatter_add(out[3], dst[~intra], nb[~intra])


def _scatter_add(row: np.ndarray, idx: np.ndarray, vals: np.ndarray) -> None:
    """``np.add.at(row, idx, vals)``; into a zero row as one ``np.bincount`` (the same sums,
    added in the same order, at a fraction of ``add.at``'s cost)."""
    if idx.size and not row.any() and int(idx.min()) >= 0 and int(idx.max()) < row.shape[0]:
        row[:] = np.bincount(idx, weights=vals, minlength=row.shape[0])
    else:
        np.add.at(row, idx, vals)


def matrix_aggregates(sizes: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """(4, N) sent/received intra/inter-node bytes per rank of a full size matrix (its diagonal,
    a rank to itself, not counted): one compiled pass over the matrix (:func:`_matrix_rows`),
    without the masked copies of the (N, N) matrix that numpy's formula makes (at 4096 ranks,
    128 MiB each), with the figures of :func:`_matrix_aggregates_np`, bit for bit."""
    sizes = np.ascontiguousarray(sizes, dtype=np.float64)
    if sizes.ndim != 2 or sizes.shape[0] != sizes.shape[1]:
        raise ValueError(f"sizes: expected a square (N, N) matrix, got shape {sizes.shape}")
    out = np.zeros((4, sizes.shape[0]))
    _matrix_rows(sizes, int(gpus_per_node), out)
    return out


@jit(cache=True, nogil=True)
def _matrix_rows(sizes, g, out):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """:func:`_matrix_aggregates_np` row by row: each row split into its intra-node part
    (``v * 1.0`` on the rank's node, ``v * 0.0`` elsewhere, as the masked product makes it) and
    its inter-node part, each row's sum numpy's pairwise sum (:func:`pairwise_sum`), the
    columns' sums the rows added in order (numpy's sum over axis 0)."""
    n = sizes.shape[0]
    for i in range(n):
        row = sizes[i].copy()
        row[i] = 0.0
        lo = (i // g) * g
        hi = min(lo + g, n)
        intra = row * 0.0
        intra[lo:hi] = row[lo:hi] * 1.0
        inter = row * 1.0
        inter[lo:hi] = row[lo:hi] * 0.0
        out[0, i] = pairwise_sum(intra, 0, n)
        out[1, i] = pairwise_sum(inter, 0, n)
        out[2] += intra
        out[3] += inter


def _matrix_aggregates_np(sizes: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """:func:`matrix_aggregates` with numpy's masked sums (the specification of the loop)."""
    sizes = np.asarray(sizes, dtype=float).copy()
    np.fill_diagonal(sizes, 0.0)
    world = sizes.shape[0]
    node_of = np.arange(world) // gpus_per_node
    same = node_of[:, None] == node_of[None, :]
    return np.stack([
        (sizes * same).sum(axis=1), (sizes * ~same).sum(axis=1),
        (sizes * same).sum(axis=0), (sizes * ~same).sum(axis=0),
    ])


def _on_rank(k: ShardKernel, rank: int) -> ShardKernel:
    """``k`` on ``rank`` (every other field the same): a copy of its fields, without the
    per-field checks of a frozen dataclass's constructor (a row-wise table over 128 ranks
    makes 128 of them per placement tried)."""
    out = object.__new__(ShardKernel)
    d = out.__dict__
    d.update(k.__dict__)
    d["rank"] = rank
    return out


_new_kernel = object.__new__


def _unique_rows(rows: int, lookups: float) -> int:
    if lookups <= 0:
        return 0
    return int(min(lookups, max(1.0, rows * -math.expm1(-lookups / rows))))


def _onehot(world: int, ranks, values) -> np.ndarray:
    """A vector of ``world`` zeros with ``values`` (one per rank listed, or one for all) added
    at ``ranks``, in order (``np.add.at``'s sums)."""
    v = np.zeros(world)
    vals = np.asarray(values, dtype=np.float64)
    idx = _i64(ranks)
    if vals.ndim == 0:
        _add_scalar_at(v, idx, float(vals))
    else:
        _add_at(v, idx, np.ascontiguousarray(vals if vals.shape == idx.shape else np.broadcast_to(vals, idx.shape)))
    return v


@jit(cache=True, nogil=True)
def _add_at(row, idx, vals):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """``np.add.at(row, idx, vals)`` (each value added in order; an index out of range refused)."""
    n = row.shape[0]
    for k in range(idx.shape[0]):
        i = idx[k]
        if i < 0 or i >= n:
            raise IndexError("rank out of range")
        row[i] += vals[k]


@jit(cache=True, nogil=True)
def _add_scalar_at(row, idx, val):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """``np.add.at(row, idx, val)``."""
    n = row.shape[0]
    for k in range(idx.shape[0]):
        i = idx[k]
        if i < 0 or i >= n:
            raise IndexError("rank out of range")
        row[i] += val


#: Up to this many kernel shapes a table's shards are grouped in one compiled pass
#: (:func:`_shape_groups`), beyond it by sorting them.
_MANY_SHAPES = 64


@jit(cache=True, nogil=True)
def _shape_groups(rows, cols, tiers, lookups, limit):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """The kernel shapes of :func:`compact_work`'s shards (equal rows, columns, tier and
    lookups, compared with ``==`` as a dict's keys are), numbered in order of first appearance:
    how many, each one's first shard and each shard's shape; 0 shapes where there are more
    than ``limit`` (the caller then sorts them)."""
    n = rows.shape[0]
    first = np.empty(limit, dtype=np.intp)
    of = np.empty(n, dtype=np.intp)
    k = 0
    for i in range(n):
        j = 0
        while j < k:
            f = first[j]
            if rows[f] == rows[i] and cols[f] == cols[i] and tiers[f] == tiers[i] and lookups[f] == lookups[i]:
                break
            j += 1
        if j == k:
            if k == limit:
                return 0, first, of
            first[k] = i
            k += 1
        of[i] = j
    return k, first, of


@dataclass(frozen=True)
class CompactWork:
    """:class:`TableWork` without a kernel object per shard: the shards' ranks, and per shard
    the index of its kernel's shape in ``shapes`` (a shard's kernel is its shape's on its rank;
    shards of one table mostly share a shape, and a row-wise table over 128 ranks would make
    128 kernels per placement the search tries). The search's contributions are built from it
    (:meth:`host.planner.cost.CostModel.contribution`); :meth:`expand` gives the table work."""

    table: str
    ranks: np.ndarray             # int64, one per shard, in the plan's shard order
    shape_of: np.ndarray          # intp, one per shard: its kernel's index in ``shapes``
    shapes: tuple[ShardKernel, ...]  # each on the rank of the first shard of its shape
    traffic: dict[str, tuple[Term, ...]]
    dp_allreduce_bytes: float = 0.0

    def kernels(self) -> tuple[ShardKernel, ...]:
        """One kernel per shard, in shard order (a shape's own object on its first rank)."""
        out = []
        for r, i in zip(self.ranks.tolist(), self.shape_of.tolist()):
            k = self.shapes[i]
            out.append(k if k.rank == r else _on_rank(k, r))
        return tuple(out)

    def expand(self) -> TableWork:
        return TableWork(self.table, self.kernels(), self.traffic, dp_allreduce_bytes=self.dp_allreduce_bytes)

    def aggregates(self, node_of: np.ndarray, gpus_per_node: int, out: np.ndarray | None = None) -> np.ndarray:
        """(collective, [sent_intra, sent_inter, recv_intra, recv_inter], rank) bytes (added to
        ``out`` where given: a ``(5, 4, N)`` array, a view of a contribution's rows)."""
        return _aggregates(self.traffic, node_of, gpus_per_node, out)


def _aggregates(traffic: dict[str, tuple[Term, ...]], node_of: np.ndarray, gpus_per_node: int,
                out: np.ndarray | None = None) -> np.ndarray:
    """(collective, [sent_intra, sent_inter, recv_intra, recv_inter], rank) bytes of the
    terms, added to ``out`` (zeros when not given)."""
    agg = np.zeros((len(COLLECTIVES), 4, len(node_of))) if out is None else out
    for c, name in enumerate(COLLECTIVES):
        for term in traffic.get(name, ()):
            _term_aggregates(agg[c], term, node_of, gpus_per_node)
    return agg


def table_work(table: TableSpec, tp: TablePlan, workload: WorkloadSpec, system: PlannerSystem) -> TableWork:
    """The kernels and traffic of one placed table (see the module doc for the model)."""
    return compact_work(table, tp, workload, system).expand()


def compact_work(table: TableSpec, tp: TablePlan, workload: WorkloadSpec, system: PlannerSystem) -> CompactWork:
    """:func:`table_work` as a :class:`CompactWork` (the same kernels and traffic)."""
    world, g = system.world_size, system.gpus_per_node
    b = workload.batch_per_gpu
    pool = system.pooling_of(table)
    eb, ob = table.elem_bytes, system.comm_bytes
    ones = np.ones(world)
    idx_per_owner = b * pool * system.index_bytes  # indices one owner sends for the whole table
    len_per_owner = b * system.length_bytes

    ranks, pieces, tiers = tp.shard_arrays()
    n = ranks.size
    rows, cols = pieces[1] - pieces[0], pieces[3] - pieces[2]
    shapes: tuple[ShardKernel, ...] = ()

    def kernels(lookups: np.ndarray, bags: int) -> np.ndarray:
        nonlocal shapes
        shape_of, shapes = _shard_shapes(table, workload, system, ranks, rows, cols, tiers, lookups, bags)
        return shape_of

    kind = tp.sharding
    traffic: dict[str, tuple[Term, ...]] = {}
    global_bags = b * world

    def work(shape_of: np.ndarray, dp: float = 0.0) -> CompactWork:
        return CompactWork(table.name, ranks, shape_of, shapes, traffic, dp_allreduce_bytes=dp)

    if kind == ShardingType.DATA_PARALLEL:
        shape_of = kernels(np.full(n, b * pool), b)
        return work(shape_of, float(table.rows * table.dim * eb))

    if kind in (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE):
        shape_of = kernels(np.full(n, global_bags * pool), global_bags)
        # indices (and lengths) go to every column shard; each shard returns its columns
        traffic["input"] = (Outer(ones * (idx_per_owner + len_per_owner), _onehot(world, ranks, 1.0)),)
        pooled = Outer(_onehot(world, ranks, cols * b * ob), ones)
        traffic["pooled"] = (pooled,)
        traffic["grad"] = (Outer(pooled.dst, pooled.src),)
        return work(shape_of)

    # row-wise families: lookups spread over row shards in proportion to their rows
    frac = system.row_shares_of(table, pieces[0], pieces[1])
    shape_of = kernels(global_bags * pool * frac, global_bags)
    traffic["input"] = (Outer(ones, _onehot(world, ranks, idx_per_owner * frac + len_per_owner)),)
    partial = table.dim * b * ob  # one owner's partial pools from one shard
    if kind == ShardingType.ROW_WISE:
        # every shard's partial pools go straight to the samples' owners, who reduce them: the
        # reduce-scatter is the pooled AlltoAll itself (and the all-gather the gradient one)
        rs = Outer(_onehot(world, ranks, 1.0), ones * partial)
        traffic["pooled"] = (rs,)
        traffic["grad"] = (Outer(rs.dst, rs.src),)
        return work(shape_of)
    if kind != ShardingType.TABLE_ROW_WISE:
        raise ValueError(f"sharding: unknown type {kind!r}")
    owners = np.arange(world)
    forward_rank = ranks[owners % len(ranks)]  # the shard that finishes owner j's pools
    counts = _onehot(world, forward_rank, 1.0)
    rs = Outer(_onehot(world, ranks, 1.0), counts * partial)
    traffic["rs"] = (rs,)
    traffic["ag"] = (Outer(rs.dst, rs.src),)
    nbytes = np.full(world, float(partial))
    traffic["pooled"] = (Pairs(forward_rank, owners, nbytes),)
    traffic["grad"] = (Pairs(owners, forward_rank, nbytes),)
    return work(shape_of)


def _shard_shapes(table: TableSpec, workload: WorkloadSpec, system: PlannerSystem, ranks: np.ndarray,
                  rows: np.ndarray, cols: np.ndarray, tiers: np.ndarray, lookups: np.ndarray,
                  bags: int) -> tuple[np.ndarray, tuple[ShardKernel, ...]]:
    """Each shard's kernel shape (its rows, columns, tier and lookups; the bags are the
    table's): the index of the shape in the shapes returned, numbered in order of first
    appearance, each shape's kernel built once, on the rank of its first shard
    (:func:`compact_work`'s and :func:`compact_rows`'s)."""
    n = ranks.size
    eb = table.elem_bytes
    state = workload.optimizer.state_bytes_per_row(table.dim)
    elementwise = workload.optimizer.kind == "adagrad"
    mem = system.memory
    if n <= _FEW_SHARDS:
        # few shards: keyed one by one (array operations cost more than they save)
        index: dict[tuple, int] = {}
        firsts: list[int] = []
        of: list[int] = []
        for i, key in enumerate(zip(rows.tolist(), cols.tolist(), tiers.tolist(), lookups.tolist())):
            j = index.get(key)
            if j is None:
                j = index[key] = len(firsts)
                firsts.append(i)
            of.append(j)
        first, shape_of = np.array(firsts, dtype=np.intp), np.array(of, dtype=np.intp)
    elif ((rows == rows[0]).all() and (cols == cols[0]).all() and (tiers == tiers[0]).all()
          and (lookups == lookups[0]).all()):
        first, shape_of = np.zeros(1, dtype=np.intp), np.zeros(n, dtype=np.intp)
    elif (found := _shape_groups(_i64(rows), _i64(cols), _i64(tiers), np.ascontiguousarray(lookups, dtype=np.float64),
                                 _MANY_SHAPES))[0] > 0:
        # (the few shapes found shard by shard, in one compiled pass)
        first, shape_of = found[1][:found[0]].copy(), found[2]
    else:
        # shards sorted by their key (stable: a group's first is its first shard), a group
        # starting wherever a field changes (== on the figures, as a dict's keys compare)
        keys = (rows, cols, tiers, lookups)
        order = np.lexsort(keys[::-1])
        starts = np.zeros(n, dtype=bool)
        starts[0] = True
        for k in keys:
            ks = k[order]
            starts[1:] |= ks[1:] != ks[:-1]
        inverse = np.empty(n, dtype=np.intp)
        inverse[order] = np.cumsum(starts) - 1
        first = order[starts]
        appear = np.argsort(first, kind="stable")     # the shapes in order of first appearance
        number = np.empty(appear.size, dtype=np.intp)
        number[appear] = np.arange(appear.size)
        first, shape_of = first[appear], number[inverse]
    shapes = []
    for f in first.tolist():
        rank, shard_rows, shard_cols = int(ranks[f]), int(rows[f]), int(cols[f])
        tier, lookups_f = TIERS[int(tiers[f])], float(lookups[f])
        # row-wise state is per row of every shard; element-wise state follows the columns
        state_for = state if not elementwise else 4 * shard_cols
        weights = shard_rows * shard_cols * eb + shard_rows * state_for
        row_bytes = shard_cols * eb
        lookups_i = int(round(lookups_f))
        if tier == "hbm":
            hbm, host, miss = float(weights), 0.0, 0.0
        elif not mem.cached:
            # shared HBM: the "host" rows are in the same HBM, read in place (no cache, no copy)
            hbm, host, miss = 0.0, float(weights), 0.0
        else:
            hbm = float(math.ceil(shard_rows * mem.cache_load_factor) * row_bytes)
            host = float(weights)
            miss = tier_miss_bytes(lookups_f, row_bytes, system.tier_hit_rate(table))
        # (its fields set at once: a frozen dataclass's constructor sets them one by one)
        out = _new_kernel(ShardKernel)
        out.__dict__.update(
            rank=rank, lookups=lookups_i, pooled_rows=bags, row_bytes=row_bytes,
            out_row_bytes=shard_cols * 4, unique_rows=_unique_rows(shard_rows, lookups_i),
            state_bytes_per_row=state_for, tier=tier, miss_bytes=miss,
            hbm_bytes=hbm, host_bytes=host, rows=shard_rows,
        )
        shapes.append(out)
    return shape_of, tuple(shapes)


#: :func:`compact_rows`'s families of term layouts (the sharding types' traffic in :func:`compact_work`)
_ROWS_FAMILY = {ShardingType.DATA_PARALLEL: 0, ShardingType.TABLE_WISE: 1, ShardingType.COLUMN_WISE: 1,
                ShardingType.TABLE_COLUMN_WISE: 1, ShardingType.ROW_WISE: 2, ShardingType.TABLE_ROW_WISE: 3}


def compact_rows(table: TableSpec, tp: TablePlan, workload: WorkloadSpec, system: PlannerSystem,
                 A: np.ndarray, B: np.ndarray, psrc: np.ndarray, pdst: np.ndarray, pnb: np.ndarray,
                 kind: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple[ShardKernel, ...], float, float] | None:
    """:func:`compact_work`'s figures written as rows, without its term objects and per-term
    arrays (the search builds about 10,000 contributions at 1024 GPUs; the objects cost about
    as much as the figures): for each of :data:`COLLECTIVES` ``c``, ``kind[c]`` 0 (no term),
    1 (one :class:`Outer` term, its ``src`` in ``A[c]`` and ``dst`` in ``B[c]``) or 2 (one
    :class:`Pairs` term in ``psrc[c]``, ``pdst[c]``, ``pnb[c]``), every row ``world`` long,
    the same bits as the term's arrays; returns the shards' ranks, each shard's shape, the
    shapes (:class:`CompactWork`'s), the pooled term's largest ``dst`` (0.0 where it is not an
    outer product) and the data-parallel AllReduce bytes; None where a rank is out of range
    (:func:`compact_work` says why). Rows of collectives without a term are left as they are."""
    family = _ROWS_FAMILY.get(tp.sharding)
    if family is None:
        raise ValueError(f"sharding: unknown type {tp.sharding!r}")
    world = system.world_size
    b = workload.batch_per_gpu
    pool = system.pooling_of(table)
    ob = system.comm_bytes
    ranks, pieces, tiers = tp.shard_arrays()
    n = ranks.size
    rows, cols = pieces[1] - pieces[0], pieces[3] - pieces[2]
    global_bags = b * world
    if family == 0:
        shape_of, shapes = _shard_shapes(table, workload, system, ranks, rows, cols, tiers, np.full(n, b * pool), b)
        kind[:] = 0
        return ranks, shape_of, shapes, 0.0, float(table.rows * table.dim * table.elem_bytes)
    idx_per_owner = b * pool * system.index_bytes
    len_per_owner = b * system.length_bytes
    if family == 1:
        shape_of, shapes = _shard_shapes(table, workload, system, ranks, rows, cols, tiers,
                                         np.full(n, global_bags * pool), global_bags)
        vals = np.asarray(cols * b * ob, dtype=np.float64)
        # (``ones * x``: each element ``1.0 * x``, which is ``x`` as a double)
        scalar = float(np.float64(1.0) * (idx_per_owner + len_per_owner))
        partial = 1.0
    else:
        frac = system.row_shares_of(table, pieces[0], pieces[1])
        shape_of, shapes = _shard_shapes(table, workload, system, ranks, rows, cols, tiers,
                                         global_bags * pool * frac, global_bags)
        vals = np.asarray(idx_per_owner * frac + len_per_owner, dtype=np.float64)
        scalar = 1.0
        partial = float(np.float64(1.0) * (table.dim * b * ob))
    if vals.shape != ranks.shape:
        vals = np.broadcast_to(vals, ranks.shape)
    mx = _term_rows(family, _i64(ranks), np.ascontiguousarray(vals), scalar, partial, A, B, psrc, pdst, pnb, kind)
    if mx < 0:
        return None
    return ranks, shape_of, shapes, mx, 0.0


@jit(cache=True, nogil=True)
def _term_rows(family, ranks, vals, scalar, partial, A, B, psrc, pdst, pnb, kind):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """:func:`compact_rows`'s rows (``family``: 1 table-wise / column-wise / table-column-wise,
    2 row-wise, 3 table-row-wise): each :func:`_onehot` as it adds (zeros, then each shard's
    value added at its rank in order), each ``ones * x`` as ``x``, each ``counts * partial``
    element by element. Returns the pooled term's largest ``dst``, -1.0 where a rank is out of
    range (nothing else then holds)."""
    n = A.shape[1]
    m = ranks.shape[0]
    if m == 0:
        return -1.0
    for k in range(m):
        if ranks[k] < 0 or ranks[k] >= n:
            return -1.0
    for c in range(kind.shape[0]):
        kind[c] = 0
    kind[0] = 1
    kind[1] = 1
    kind[2] = 1
    if family == 1:
        # input: indices from every owner to each shard; pooled: each shard's columns back
        for i in range(n):
            A[0, i] = scalar
            B[0, i] = 0.0
            A[1, i] = 0.0
            B[1, i] = 1.0
        for k in range(m):
            B[0, ranks[k]] += 1.0
            A[1, ranks[k]] += vals[k]
        for i in range(n):
            A[2, i] = B[1, i]
            B[2, i] = A[1, i]
        return 1.0
    # row-wise families: input from every owner to each row shard
    for i in range(n):
        A[0, i] = 1.0
        B[0, i] = 0.0
    for k in range(m):
        B[0, ranks[k]] += vals[k]
    if family == 2:
        for i in range(n):
            A[1, i] = 0.0
            B[1, i] = partial
        for k in range(m):
            A[1, ranks[k]] += 1.0
        for i in range(n):
            A[2, i] = B[1, i]
            B[2, i] = A[1, i]
        return partial
    # table-row-wise: owner j's pools finished by shard j mod m (reduce-scatter, then pairs)
    kind[1] = 2
    kind[2] = 2
    kind[3] = 1
    kind[4] = 1
    for i in range(n):
        A[3, i] = 0.0
        B[3, i] = 0.0
    for k in range(m):
        A[3, ranks[k]] += 1.0
    for i in range(n):
        B[3, ranks[i % m]] += 1.0
    for i in range(n):
        B[3, i] = B[3, i] * partial
        f = ranks[i % m]
        psrc[1, i] = f
        pdst[1, i] = i
        pnb[1, i] = partial
        psrc[2, i] = i
        pdst[2, i] = f
        pnb[2, i] = partial
    for i in range(n):
        A[4, i] = B[3, i]
        B[4, i] = A[3, i]
    return 0.0


@dataclass
class IterationWork:
    """Per-rank work and communication of one training iteration under a plan.

    ``kernels[r]``: the :class:`ShardKernel` list of rank ``r`` (its fused forward/backward
    work); ``matrices[name]``: (N, N) AlltoAllv bytes for each of :data:`COLLECTIVES`;
    ``dp_allreduce_bytes``: bytes AllReduced over all ranks; ``hbm_bytes`` / ``dram_bytes`` /
    ``ssd_bytes``: memory each rank holds in each tier (host tiers: the rank's share of its node's).
    """

    world_size: int
    gpus_per_node: int
    kernels: list[list[ShardKernel]]
    matrices: dict[str, np.ndarray]
    dp_allreduce_bytes: float
    hbm_bytes: np.ndarray
    dram_bytes: np.ndarray
    ssd_bytes: np.ndarray
    tables: dict[str, TableWork] = field(default_factory=dict)

    @property
    def lookups(self) -> np.ndarray:
        return np.array([sum(k.lookups for k in ks) for ks in self.kernels], dtype=np.int64)

    @property
    def lookup_bytes(self) -> np.ndarray:
        return np.array([sum(k.lookups * k.row_bytes for k in ks) for ks in self.kernels], dtype=float)


def derive_iteration(plan: Plan, workload: WorkloadSpec, system: PlannerSystem) -> IterationWork:
    """The per-rank work and AlltoAllv matrices of one iteration (see the module doc)."""
    world = system.world_size
    if plan.world_size != world or plan.gpus_per_node != system.gpus_per_node:
        raise ValueError(f"plan: made for {plan.world_size} ranks x {plan.gpus_per_node}/node, "
                         f"system has {world} x {system.gpus_per_node}")
    missing = [t.name for t in workload.tables if t.name not in plan.tables]
    if missing:
        raise ValueError(f"plan: no placement for table {missing[0]!r}")
    kernels: list[list[ShardKernel]] = [[] for _ in range(world)]
    terms: dict[str, list[Term]] = {name: [] for name in COLLECTIVES}
    hbm = np.zeros(world)
    host = np.zeros((2, world))
    dp = 0.0
    works: dict[str, TableWork] = {}
    for table in workload.tables:
        tw = table_work(table, plan.tables[table.name], workload, system)
        works[table.name] = tw
        for k in tw.kernels:
            kernels[k.rank].append(k)
            hbm[k.rank] += k.hbm_bytes
            if k.tier != "hbm":
                host[0 if k.tier == "dram" else 1, k.rank] += k.host_bytes
        for name, table_terms in tw.traffic.items():
            terms[name].extend(table_terms)
        dp += tw.dp_allreduce_bytes
    matrices = {name: _sum_terms(world, terms[name]) for name in COLLECTIVES}
    return IterationWork(world, system.gpus_per_node, kernels, matrices, dp, hbm, host[0], host[1], works)
