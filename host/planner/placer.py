"""Shared machinery of every planner: building table plans within the memory caps, costing
them through cached per-table contributions, tracking the accumulated state.

Contributions of a table placed on a rank (table-wise) or on a node (table-row-wise,
table-column-wise over the node's first ranks) are computed once, on rank / node 0, and
relabeled: every rank has the same GPU and links, so the figures move with the placement. A
data-parallel table with every replica in one tier is its replica on rank 0, on every rank
(replicas exchange no AlltoAll traffic).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from neonic.host.planner.cost import (_AGG, _KERN, Contribution, CostModel, PackedContribution, State, _classes_s,
                                      add_columns)
from neonic.host.planner.plan import TIERS, Plan, Shard, ShardingType, TablePlan
from neonic.host.planner.system import GIB, PlannerSystem
from neonic.host.planner.work import compact_work
from neonic.sim.compiled import jit
from neonic.host.workloads.spec import TableSpec, WorkloadSpec

__all__ = ["Placer", "check_fits"]

ST = ShardingType


@dataclass
class _Placed:
    tp: TablePlan
    contrib: Contribution


class BytesLRU:
    """Values remembered up to a budget of bytes, the least recently used given up first (at
    least ``min_entries`` are always kept, so that what one search step touches stays). The
    caches only save recomputing: what they hold never changes a plan."""

    __slots__ = ("limit", "min_entries", "nbytes", "_d")

    def __init__(self, limit: float, min_entries: int = 64) -> None:
        self.limit = float(limit)
        self.min_entries = min_entries
        self.nbytes = 0.0
        self._d: OrderedDict = OrderedDict()

    def get(self, key: Any) -> Any:
        hit = self._d.get(key)
        if hit is None:
            return None
        self._d.move_to_end(key)
        return hit[0]

    def put(self, key: Any, value: Any, nbytes: float) -> Any:
        old = self._d.pop(key, None)
        if old is not None:
            self.nbytes -= old[1]
        self._d[key] = (value, nbytes)
        self.nbytes += nbytes
        while self.nbytes > self.limit and len(self._d) > self.min_entries:
            _, (_, size) = self._d.popitem(last=False)
            self.nbytes -= size
        return value

    def __contains__(self, key: Any) -> bool:
        return key in self._d

    def entries(self) -> list[tuple[Any, Any, float]]:
        """Every ``(key, value, nbytes)`` held, least recently used first (what :meth:`put`
        takes: to hand them to another process's cache)."""
        return [(k, v, n) for k, (v, n) in self._d.items()]

    def __len__(self) -> int:
        return len(self._d)


#: What :meth:`Placer.make` keys a plan over every rank in order by, in place of the ranks.
_EVERY = "every rank"

#: Bytes one shard of a remembered table plan takes in memory (a frozen dataclass instance with
#: slots and its integers: 184 bytes measured with ``tracemalloc`` on CPython 3.11).
_SHARD_BYTES = 200


def _split(total: int, parts: int, unit: int = 1) -> np.ndarray:
    """The bounds of ``parts`` contiguous ranges covering ``[0, total)``, as even as multiples
    of ``unit`` allow (``parts + 1`` of them, int64)."""
    units = total // unit if total % unit == 0 and total // unit >= parts else total
    step = unit if units != total else 1
    # numpy's linspace(0, units, parts + 1) rounded half to even, element for element (its
    # i-th point is i * (units / parts), its last ``units``): each product as Python's
    # ``i * width``, rounded as its ``round`` (half to even)
    bounds = np.empty(parts + 1, dtype=np.int64)
    bounds[:-1] = np.rint(np.arange(parts) * (units / parts)).astype(np.int64) * step
    bounds[-1] = units * step
    return bounds


def _shard(rank: int, row_start: int, row_end: int, col_start: int, col_end: int, tier: str) -> Shard:
    """A :class:`Shard` of a piece :meth:`Placer.make` has already checked (a rank >= 0,
    non-empty ranges from :func:`_split`, a known tier), built without the constructor's
    checks: a plan over 128 ranks makes 128 shards per placement tried. The fields are set
    through their slots' own setters (a frozen dataclass refuses ``setattr``): 0.74 against
    1.16 us a shard through ``object.__setattr__``."""
    out = _new(Shard)
    _rank(out, rank)
    _row_start(out, row_start)
    _row_end(out, row_end)
    _col_start(out, col_start)
    _col_end(out, col_end)
    _tier(out, tier)
    return out


_new = object.__new__
_rank, _row_start, _row_end, _col_start, _col_end, _tier = (
    getattr(Shard, f).__set__ for f in ("rank", "row_start", "row_end", "col_start", "col_end", "tier"))


class _Relabeled(Contribution):
    """A contribution kept as a remembered packed one and the relabeling that gives it
    (``inv``: rank ``i`` takes the figures of rank ``inv[i]``; None: as it is), its figures
    (``vec``) built when read, each read the same array as ``base.relabeled(inv)`` gives: the
    search holds a contribution per placed table (and per table of its starts), 29 x world
    floats each, 0.95 GiB for 1000 tables at 4096 ranks, where this holds KiB."""

    __slots__ = ("base", "inv")

    def __init__(self, base: PackedContribution, inv: np.ndarray | None) -> None:
        self.base, self.inv = base, inv
        self.dp_bytes = base.dp_bytes

    @property
    def vec(self) -> np.ndarray:  # type: ignore[override]
        base = self.base
        return base.vec if self.inv is None else base.cols[:, base.index[self.inv]]

    def add_into(self, out: np.ndarray, sign: float = 1.0) -> None:
        """``out += vec`` (``sign`` 1.0), else ``out -= vec``, without building ``vec``."""
        base = self.base
        add_columns(out, base.cols, base.index if self.inv is None else base.index[self.inv], sign)


class _MadePlan(TablePlan):
    """A :class:`TablePlan` made by :meth:`Placer.make`, equal to the plan with its shards
    spelled out, whose shards are built only when first read (``shards``): the search makes
    thousands of plans over every rank (row-wise, data-parallel: a shard per rank, 4096 at 512
    nodes) and prices most of them through their figures alone (``ranks``, ``shard_count``,
    ``shard_arrays`` and the caches' keys need no shard objects)."""

    @classmethod
    def new(cls, table: str, kind: ST, recipe: tuple, made: tuple) -> "_MadePlan":
        """The plan of ``table`` split ``kind``: ``recipe`` = (ranks (a list, or an int64
        array: :meth:`shard_arrays` then gives it as it is), the pieces
        ``(row_start, row_end, col_start, col_end)`` in shard order as a ``(4, m)`` int64
        array, each shard's tier index in ``TIERS`` as an int8 array); ``made``: what
        :meth:`Placer.make` keys it by (the table, type and ranks, and the tiers)."""
        out = object.__new__(cls)
        d = out.__dict__
        d["table"], d["sharding"], d["_recipe"], d["_made"] = table, kind, recipe, made
        return out

    def __getattr__(self, name: str) -> Any:
        # only reached while ``shards`` is not built (and for attributes nobody has)
        recipe = self.__dict__.get("_recipe") if name == "shards" else None
        if recipe is None:
            raise AttributeError(name)
        ranks, arr, code = recipe
        shards = tuple([_shard(int(rank), r0, r1, c0, c1, TIERS[c])
                        for rank, (r0, r1, c0, c1), c in zip(ranks, arr.T.tolist(), code.tolist())])
        self.__dict__["shards"] = shards
        return shards

    @property
    def ranks(self) -> tuple[int, ...]:
        ranks = self.__dict__["_recipe"][0]
        return tuple(ranks.tolist() if isinstance(ranks, np.ndarray) else (int(r) for r in ranks))

    @property
    def shard_count(self) -> int:
        return len(self.__dict__["_recipe"][0])

    def shard_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ranks, arr, code = self.__dict__["_recipe"]
        return np.asarray(ranks, dtype=np.int64), arr, code

    def __eq__(self, other: object) -> bool:
        """Equal to a plan of the same table, type and shards. Two plans :meth:`Placer.make`
        made are compared by what made them (the shards follow from it, one to one)."""
        if other is self:
            return True
        if not isinstance(other, TablePlan):
            return NotImplemented
        if self.table != other.table or self.sharding != other.sharding:
            return False
        a, b = self.__dict__.get("_made"), other.__dict__.get("_made")
        if a is not None and b is not None:
            return a == b
        return self.shards == other.shards

    __hash__ = TablePlan.__hash__


@jit(cache=True, nogil=True)
def _hbm_keep(v, r, ratio, reserve):  # pragma: no cover  (compiled)
    """The HBM rank ``r`` keeps for caches of host memory it may still take (``ratio`` times
    what is left of ``reserve``; ``np.maximum(0.0, x)`` is ``0.0 if 0.0 >= x else x``)."""
    if ratio:
        x = reserve - v[25, r]
        return ratio * (0.0 if 0.0 >= x else x)
    return 0.0


@jit(cache=True, nogil=True)
def _tier_codes(v, at, need, cache, cap_hbm, cap_dram, cap_ssd, ratio, reserve, code):  # pragma: no cover  (compiled)
    """Each shard's tier for :meth:`Placer.make` into ``code`` (0 HBM, 1 DRAM, 2 SSD), shard by
    shard with :meth:`Placer._tier_codes_np`'s arithmetic: in HBM if its bytes ``need`` fit
    the rank's free HBM (``v``: a state's figures, row 24 HBM, 25 DRAM, 26 SSD bytes) less
    the HBM the rank keeps for the caches of host memory it may still take (``ratio`` times
    what is left of ``reserve``: ``np.maximum(0.0, x)`` is ``0.0 if 0.0 >= x else x``), else,
    if its HBM cache fits, in DRAM, else on SSD. Returns -1 if a shard fits nowhere, 1 if
    every shard is in HBM, else 0; -2 if a rank is out of range (no figure read)."""
    n = v.shape[1]
    for k in range(at.shape[0]):
        if at[k] < 0 or at[k] >= n:
            return -2
    every = 1
    for k in range(at.shape[0]):
        r = at[k]
        hbm_free = cap_hbm - v[24, r]
        keep = _hbm_keep(v, r, ratio, reserve)
        if need[k] <= hbm_free - keep:
            code[k] = 0
            continue
        every = 0
        if not cache[k] <= hbm_free:
            return -1
        if need[k] <= cap_dram - v[25, r]:
            code[k] = 1
        elif need[k] <= cap_ssd - v[26, r]:
            code[k] = 2
        else:
            return -1
    return every


@jit(cache=True, nogil=True)
def _all_in_hbm(v, at, need, cap_hbm, ratio, reserve):  # pragma: no cover  (compiled)
    """Whether every shard still fits HBM (:func:`_tier_codes`' first test on each)."""
    for k in range(at.shape[0]):
        r = at[k]
        hbm_free = cap_hbm - v[24, r]
        keep = _hbm_keep(v, r, ratio, reserve)
        if not need[k] <= hbm_free - keep:
            return False
    return True


@jit(cache=True, nogil=True)
def _node_maxima(B, g, fo, bo, node_max, fwd_node, bwd_node):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """Per node of the state ``B``: each row's largest figure (``B.reshape(rows, nodes,
    g).max(axis=2)``), and its ranks' slowest forward and backward embedding kernels
    (``np.maximum(B[0] + busy * fo, B[2] / 2)``, the backward's alike, maxed over the node),
    with numpy's arithmetic (``np.maximum(a, b)``: ``a if a >= b else b``)."""
    rows = B.shape[0]
    for k in range(node_max.shape[1]):
        lo = k * g
        for i in range(rows):
            m = B[i, lo]
            for r in range(lo + 1, lo + g):
                x = B[i, r]
                m = m if m >= x else x
            node_max[i, k] = m
        f = -np.inf
        b = -np.inf
        for r in range(lo, lo + g):
            busy = B[3, r] > 0.5
            h = B[2, r] / 2
            a = B[0, r] + (fo if busy else 0.0)
            a = a if a >= h else h
            f = a if (r == lo or a > f) else f
            a = B[1, r] + (bo if busy else 0.0)
            a = a if a >= h else h
            b = a if (r == lo or a > b) else b
        fwd_node[k] = f
        bwd_node[k] = b


@jit(cache=True, nogil=True)
def _by_nodes(B, node_max, fwd_node, bwd_node, cols, col, g, caps, scale, alpha, bw, fo, bo, acc, seen, out):  # pragma: no cover
    """:meth:`Placer.barrier_by_nodes` of one candidate (a packed contribution's columns
    ``cols``, each rank's column ``col``, added to the state ``B``), in one compiled pass with
    its arithmetic (each figure one addition; maxima taken as ``np.maximum`` takes them,
    ``a if a >= b else b``; a class's AlltoAll times as :func:`host.planner.cost._classes_s`
    gives ``rank_times_s``): a node whose ranks all take one column that adds a kernel (or
    nothing to the kernels) joins that column's class (its largest figures per row, ``acc``,
    with ``seen``), any other node is priced rank by rank. ``caps``: the memory caps, the
    tolerance added. ``out``: fits (1.0 or 0.0), the forward's and backward's slowest, each
    AlltoAll's slowest (5)."""
    nodes = col.shape[0] // g
    rows = B.shape[0]
    K = cols.shape[1]
    for q in range(K):
        seen[q] = False
    fits = True
    fwd = -np.inf
    bwd = -np.inf
    comm = np.full(5, -np.inf)
    for k in range(nodes):
        q = col[k * g]
        whole = True
        for j in range(1, g):
            if col[k * g + j] != q:
                whole = False
                break
        if whole:
            c3 = cols[3, q]
            kern = c3 > 0.5
            if kern or not (cols[0, q] != 0.0 or cols[1, q] != 0.0 or cols[2, q] != 0.0 or c3 != 0.0):
                if not seen[q]:
                    seen[q] = True
                    for i in range(rows):
                        acc[i, q] = node_max[i, k]
                else:
                    for i in range(rows):
                        a, b = acc[i, q], node_max[i, k]
                        acc[i, q] = a if a >= b else b
                if not kern:   # nothing added to the kernels: the state's own figures
                    a = fwd_node[k]
                    fwd = a if a > fwd else fwd
                    a = bwd_node[k]
                    bwd = a if a > bwd else bwd
                continue
        for r in range(k * g, k * g + g):   # rank by rank
            j = col[r]
            if not (B[24, r] + cols[24, j] <= caps[0] and B[25, r] + cols[25, j] <= caps[1]
                    and B[26, r] + cols[26, j] <= caps[2]):
                fits = False
            x3 = B[3, r] + cols[3, j]
            x2 = (B[2, r] + cols[2, j]) / 2
            a = (B[0, r] + cols[0, j]) + (fo if x3 > 0.5 else 0.0)
            a = a if a >= x2 else x2
            fwd = a if a > fwd else fwd
            a = (B[1, r] + cols[1, j]) + (bo if x3 > 0.5 else 0.0)
            a = a if a >= x2 else x2
            bwd = a if a > bwd else bwd
            for c in range(5):
                q4, s = 4 + 4 * c, scale[c]
                t = _classes_s((B[q4, r] + cols[q4, j]) * s, (B[q4 + 2, r] + cols[q4 + 2, j]) * s,
                               (B[q4 + 1, r] + cols[q4 + 1, j]) * s, (B[q4 + 3, r] + cols[q4 + 3, j]) * s, alpha, bw)
                comm[c] = comm[c] if comm[c] >= t else t
    for q in range(K):
        if not seen[q]:
            continue
        x = np.empty(rows)
        for i in range(rows):
            x[i] = acc[i, q] + cols[i, q]
        if not (x[24] <= caps[0] and x[25] <= caps[1] and x[26] <= caps[2]):
            fits = False
        if cols[3, q] > 0.5:   # a kernel on every rank of the class: the overheads apply
            h = x[2] / 2
            a = x[0] + fo
            a = a if a >= h else h
            fwd = a if a > fwd else fwd
            a = x[1] + bo
            a = a if a >= h else h
            bwd = a if a > bwd else bwd
        for c in range(5):
            q4, s = 4 + 4 * c, scale[c]
            t = _classes_s(x[q4] * s, x[q4 + 2] * s, x[q4 + 1] * s, x[q4 + 3] * s, alpha, bw)
            comm[c] = comm[c] if comm[c] >= t else t
    out[0] = 1.0 if fits else 0.0
    out[1] = fwd
    out[2] = bwd
    for c in range(5):
        out[3 + c] = comm[c]


class Placer:
    """Shared machinery of the planners: building table plans, costing them, tracking memory."""

    #: Memory each of the placer's caches may take (bytes): contributions of tables placed
    #: table-wise (and data-parallel), on a node, by plan, and the table plans made. A
    #: contribution is 29 x world floats (1 MB at 4096 ranks; model-a at 1024 ranks fills 0.4 to
    #: 0.54 GB of each of the five caches given 512 MiB, at 128 ranks under 0.1 GB); the caches
    #: only save recomputing, so the plans do not depend on their size.
    CACHE_BYTES = 256 << 20

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
        # rank-0 contributions of table-wise tables, by (table, tier), and the other caches:
        # shareable between placers of the same workload, system and cost model (the baselines
        # the search starts from), each bounded by CACHE_BYTES
        self._tw_cache: dict = {} if tw_cache is None else tw_cache
        # (world^2: 64 MiB at 4096 ranks, made once for the placers sharing the caches)
        self._inv = self._tw_cache.get("__inv__")
        if self._inv is None or self._inv.shape != (self.world, self.world):
            self._inv = self._tw_cache["__inv__"] = _relabelings(self.world, self.g)
        lru = lambda name: self._tw_cache.setdefault(name, BytesLRU(self.CACHE_BYTES))  # noqa: E731
        self._everywhere = np.zeros(self.world, dtype=np.int64)  # every rank takes rank 0's figures
        # every rank in order, as :meth:`make` is given them and as its plans hold them (one
        # array shared by those plans, as a remembered plan is shared: never written to)
        self._every_list = list(range(self.world))
        self._every_at = np.arange(self.world, dtype=np.int64)
        self._tw: BytesLRU = lru("__tw__")
        self._cache: BytesLRU = lru("__plans__")
        self._node_cache: BytesLRU = lru("__nodes__")
        self._relabel: BytesLRU = lru("__relabel__")  # how a plan's contribution follows from another
        self._hbm_plans: BytesLRU = lru("__hbm_plans__")
        self._tiered_plans: BytesLRU = lru("__tiered_plans__")
        self._geoms: dict[tuple, tuple] = self._tw_cache.setdefault("__geometry__", {})
        #: whether the caches keep contributions packed (:class:`PackedContribution`): where one
        #: contribution per table would take more than half a cache's budget (model-a: 1000
        #: tables, at 1024 ranks and up), so that every table's stays (packing sorts a
        #: contribution's columns, which costs more than it saves where everything fits)
        self._pack = len(workload.tables) * _nbytes(self.world) > self.CACHE_BYTES // 2

    # ------------------------------------------------------------------ building table plans
    def shard_bytes(self, table: TableSpec, rows: int, cols: int) -> float:
        state = self.workload.optimizer.state_bytes_per_row(cols)
        return float(rows * (cols * table.elem_bytes + state))

    def _geometry(self, table: TableSpec, kind: ST, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The pieces of ``table`` split ``kind`` over ``m`` ranks as a ``(4, m)`` int64 array
        (rows ``row_start, row_end, col_start, col_end``; non-empty: ``m`` is at most the rows
        or columns split), the bytes each needs in its tier and the bytes of its HBM cache
        (remembered: they depend on the table, the type and ``m`` only; a data-parallel
        table's m whole pieces are one, broadcast: 4096 of them per table otherwise)."""
        key = (table.name, kind, m)
        hit = self._geoms.get(key)
        if hit is not None:
            return hit
        whole = np.array([0, table.rows, 0, table.dim], dtype=np.int64)
        if kind not in (ST.COLUMN_WISE, ST.TABLE_COLUMN_WISE, ST.ROW_WISE, ST.TABLE_ROW_WISE):
            # every piece the whole table (a replica per rank): one piece, read as m
            lf = self.system.memory.cache_load_factor
            need = np.broadcast_to(np.float64(self.shard_bytes(table, table.rows, table.dim)), (m,))
            cache = np.broadcast_to(np.float64(float(math.ceil(table.rows * lf) * table.dim * table.elem_bytes)), (m,))
            hit = self._geoms[key] = (np.broadcast_to(whole[:, None], (4, m)), need, cache)
            return hit
        arr = np.empty((4, m), dtype=np.int64)
        arr[:] = whole[:, None]
        if kind in (ST.COLUMN_WISE, ST.TABLE_COLUMN_WISE):
            b = _split(table.dim, m, 4)
            arr[2], arr[3] = b[:-1], b[1:]
        elif kind in (ST.ROW_WISE, ST.TABLE_ROW_WISE):
            b = _split(table.rows, m)
            arr[0], arr[1] = b[:-1], b[1:]
        lf = self.system.memory.cache_load_factor
        # each distinct piece shape's bytes (a split has two sizes at most), then per piece
        if m <= 32:   # (few pieces: one by one, cheaper than array operations)
            dims = list(zip((arr[1] - arr[0]).tolist(), (arr[3] - arr[2]).tolist()))
            shapes = {(r, c): (self.shard_bytes(table, r, c), float(math.ceil(r * lf) * c * table.elem_bytes))
                      for r, c in set(dims)}
            need = np.array([shapes[d][0] for d in dims])
            cache = np.array([shapes[d][1] for d in dims])
        else:
            rows, ri = _two_values(arr[1] - arr[0])
            cols, ci = _two_values(arr[3] - arr[2])
            need = np.array([[self.shard_bytes(table, r, c) for c in cols.tolist()] for r in rows.tolist()])[ri, ci]
            cache = np.array([[float(math.ceil(r * lf) * c * table.elem_bytes) for c in cols.tolist()]
                              for r in rows.tolist()])[ri, ci]
        arr.flags.writeable = False   # shared by every plan made of it
        hit = self._geoms[key] = (arr, need, cache)
        return hit

    def make(self, table: TableSpec, kind: ST, ranks: list[int], state: State | None = None) -> TablePlan | None:
        """A table plan of ``kind`` over ``ranks`` with tiers chosen to fit, or None if it cannot:
        each shard in HBM if it fits there (beside the HBM the host tiers' caches keep), else
        in DRAM, else on SSD behind its HBM cache."""
        state = state or self.state
        if kind == ST.DATA_PARALLEL:
            ranks = range(self.world)
        # every rank in order (row-wise or data-parallel over the cluster: 4096 ranks at 512
        # nodes) keyed by one mark, however they are given (the key stands for the shards:
        # :meth:`_MadePlan.__eq__`), not a tuple of every rank built and hashed per call
        if type(ranks) is range:
            every = ranks == range(self.world)
        else:
            if type(ranks) is not list:
                ranks = list(ranks)
            every = ranks == self._every_list
        key = (table.name, kind, _EVERY if every else tuple(ranks))
        vec = state.vec
        hit = self._hbm_plans.get(key)
        if hit is not None:
            # made before, every shard in HBM: the same plan if it still fits there
            tp, need, at = hit
            if _all_in_hbm(vec, at, need, self.caps[0], self._cache_ratio, self._cache_reserve):
                return tp
        ranks = self._every_list if every else list(ranks)
        if not every and len(set(ranks)) != len(ranks):
            return None
        if kind in (ST.COLUMN_WISE, ST.TABLE_COLUMN_WISE):
            if len(ranks) > table.dim:
                return None
        elif kind in (ST.ROW_WISE, ST.TABLE_ROW_WISE):
            if len(ranks) > table.rows:
                return None
        at = self._every_at if every else np.asarray(ranks, dtype=np.int64)
        arr, need, cache = self._geometry(table, kind, len(ranks))
        # each shard's tier (0 HBM, 1 DRAM, 2 SSD): the key of the plan made
        code = np.empty(at.size, dtype=np.int8)
        fits = _tier_codes(vec, at, need, cache, self.caps[0], self.caps[1], self.caps[2], self._cache_ratio,
                           self._cache_reserve, code)
        if fits == -2:
            bad = next(r for r in ranks if not 0 <= r < vec.shape[1])
            raise ValueError(f"shard: invalid rank {bad} for table {table.name!r} (expected 0..{vec.shape[1] - 1})")
        if fits < 0:
            return None
        tiers = code.tobytes()
        tp = self._tiered_plans.get((key, tiers))
        if tp is None:
            # its shards are built when first read (a plan over every rank is a shard per rank):
            # what determines it (its pieces follow from the table, the type and the count)
            # keys the caches by plan, far smaller than its shards
            tp = _MadePlan.new(table.name, kind, (at, arr, code), (key, tiers))
            self._tiered_plans.put((key, tiers), tp, _SHARD_BYTES * len(ranks))
        if fits == 1:
            self._hbm_plans.put(key, (tp, need, at), _SHARD_BYTES * len(ranks) + need.nbytes + at.nbytes)
        return tp

    def _tier_codes_np(self, state: State, at: np.ndarray, need: np.ndarray, cache: np.ndarray) -> np.ndarray | None:
        """:func:`_tier_codes` with numpy's array operations (the specification of the loop):
        each shard's tier code, or None where a shard fits no tier."""
        hbm_free = self.caps[0] - state.hbm[at]
        # HBM a rank keeps for the caches of the host memory it may still take (0 while the model fits HBM)
        reserve = (self._cache_ratio * np.maximum(0.0, self._cache_reserve - state.host[0][at])
                   if self._cache_ratio else 0.0)
        in_hbm = need <= hbm_free - reserve
        cached = ~in_hbm & (cache <= hbm_free)
        in_dram = cached & (need <= self.caps[1] - state.host[0][at])
        in_ssd = cached & ~in_dram & (need <= self.caps[2] - state.host[1][at])
        if not (in_hbm | in_dram | in_ssd).all():
            return None
        return np.where(in_hbm, 0, np.where(in_dram, 1, 2)).astype(np.int8)

    def _keep(self, cache: "BytesLRU", key: Any, tp: TablePlan, extra: float = 0.0) -> "Contribution | PackedContribution":
        """Remember the contribution of ``tp`` in ``cache`` (packed where :attr:`_pack`, built
        so: :meth:`CostModel.packed_plan`, the same as ``packed_contribution`` of
        :func:`compact_work`); returns what is kept."""
        if self._pack:
            p = self.cost.packed_plan(self.tables[tp.table], tp, self.workload, self.system)
            return cache.put(key, p, p.nbytes + extra)
        return cache.put(key, self._contribution(tp), _nbytes(self.world) + extra)

    def tw_base(self, table: str, tier: str) -> "Contribution | PackedContribution":
        """The contribution of ``table`` placed table-wise on rank 0 in ``tier`` (remembered;
        packed where :attr:`_pack`: read it through ``relabeled`` / ``columns``)."""
        key = (table, tier)
        base = self._tw.get(key)
        if base is None:
            t = self.tables[table]
            at0 = _plan_of(table, ST.TABLE_WISE, [(0, 0, t.rows, 0, t.dim, tier)])
            base = self._keep(self._tw, key, at0)
        return base

    @staticmethod
    def _plan_key(tp: TablePlan) -> tuple[Any, int]:
        """A cache key of ``tp`` and the bytes it takes: what :meth:`make` built it from, else
        the plan itself."""
        made = tp.__dict__.get("_made")
        if made is not None:
            return made, 16 * tp.shard_count
        return tp, _SHARD_BYTES * len(tp.shards)

    def contribution(self, tp: TablePlan) -> Contribution:
        """The additive contribution of ``tp`` (remembered where it follows from another by
        relabeling ranks: :meth:`_contribution_base`)."""
        base, inv = self._contribution_base(tp)
        if isinstance(base, PackedContribution):
            return _Relabeled(base, inv)  # (its figures when read: no 29 x world array held)
        return base.unpacked() if inv is None else base.relabeled(inv)

    def distinct_columns(self, tp: TablePlan) -> Contribution:
        """The distinct columns of :meth:`contribution` (each once, at least two: a state of
        them has the per-rank figures of the whole contribution, so any per-column function
        of it, maxed over the columns, gives the maximum over the ranks, exactly), without
        the 29 x world array: a table's figures take a few distinct values over the ranks."""
        base, inv = self._contribution_base(tp)
        if not isinstance(base, PackedContribution):
            return base.unpacked() if inv is None else base.relabeled(inv)
        if inv is None or inv.base is self._inv:
            # every column is some rank's, and a relabeling that keeps the node structure
            # permutes the ranks: all of them (np.unique's figures, without its sort)
            idx = np.arange(base.cols.shape[1])
        else:
            # the columns some rank takes, ascending (np.unique's, without its sort)
            seen = np.zeros(base.cols.shape[1], dtype=bool)
            seen[base.index[inv]] = True
            idx = np.flatnonzero(seen)
        if idx.size == 1:
            # two columns, as any world has: numpy then reduces the rows of a column as it
            # does for the whole state (one column would take another summation path)
            idx = np.repeat(idx, 2)
        return Contribution(base.cols[:, idx], base.dp_bytes)

    def _contribution_base(self, tp: TablePlan) -> "tuple[Contribution | PackedContribution, np.ndarray | None]":
        """A remembered contribution and the relabeling (``inv``: rank ``i`` takes the figures
        of rank ``inv[i]``; None: as it is) that give ``tp``'s."""
        if tp.sharding == ST.TABLE_WISE:
            ranks, _, code = tp.shard_arrays()
            return self.tw_base(tp.table, TIERS[int(code[0])]), self._inv[int(ranks[0])]
        if tp.sharding in (ST.DATA_PARALLEL, ST.TABLE_ROW_WISE, ST.TABLE_COLUMN_WISE, ST.COLUMN_WISE):
            pkey, size = self._plan_key(tp)
            how = self._relabel.get(pkey)
            if how is None:
                how = self._relabeling(tp)
                self._relabel.put(pkey, how, size + sum(getattr(x, "nbytes", 0) for x in how))
            if how[0] == "dp":
                # one replica per rank, all in one tier: the replica on rank 0, copied to every rank
                key = how[1]
                base = self._tw.get(key)
                if base is None:
                    _, table, tier, piece = key
                    one = _plan_of(table, ST.DATA_PARALLEL, [(0, *piece, tier)])
                    base = self._keep(self._tw, key, one)
                return base, self._everywhere
            if how[0] == "node":
                # on a node's first ranks: node 0's contribution, relabeled
                _, key, at0, first = how
                base = self._node_cache.get(key)
                if base is None:
                    base = self._keep(self._node_cache, key, at0, _SHARD_BYTES * tp.shard_count)
                return base, self._inv[first]
            if how[0] == "cw":
                # a column-wise plan's class plan, relabeled
                _, key, inv = how
                base = self._tw.get(key)
                if base is None:
                    _, table, nodes = key
                    at0 = _plan_of(table, ST.COLUMN_WISE, [(i * self.g + j, 0, rows, 0, cols, tier)
                                                            for i, shapes in enumerate(nodes)
                                                            for j, (rows, cols, tier) in enumerate(shapes)])
                    base = self._keep(self._tw, key, at0)
                return base, inv
        pkey, size = self._plan_key(tp)
        c = self._cache.get(pkey)
        if c is None:
            c = self._keep(self._cache, pkey, tp, size)
        return c, None

    def node_base(self, table: TableSpec, kind: ST, m: int) -> None:
        """Make (where not kept) the contribution that a plan of ``table`` split ``kind``
        (table-row-wise or table-column-wise) over an aligned group of ``m`` ranks of a node,
        every shard in HBM, is relabeled from (:meth:`_relabeling`'s ``"node"``: the plan on
        ranks ``0 .. m - 1``), so that a search can make it while another process is busy;
        nothing where a shard could not be in HBM."""
        arr, need, _ = self._geometry(table, kind, m)
        if not (need <= self.caps[0]).all():
            return
        code = np.zeros(m, dtype=np.int8)
        key = _node_key(table.name, kind, arr, code)
        if self._node_cache.get(key) is None:
            at0 = _MadePlan.new(table.name, kind, (list(range(m)), np.array(arr, dtype=np.int64), code), None)
            self._keep(self._node_cache, key, at0, _SHARD_BYTES * m)

    def _column_class(self, tp: TablePlan) -> tuple[tuple, np.ndarray]:
        """The class of a column-wise (or table-column-wise) plan under relabelings that keep
        the node structure, and the relabeling: its contribution is that of the class's plan
        (each node's shard shapes, sorted, on the first nodes' first ranks, nodes sorted by
        them) with rank ``i`` taking the figures of rank ``inv[i]``. Exact: such a table's
        figures on a rank follow from the rank's own shard (rows, columns, tier), its node's
        sums and the cluster's sums of the outer-product terms (``host.planner.work``), and
        those sums are of whole numbers of bytes, of ones, or of one repeated figure (the
        indices every rank sends), the same whatever order they are added in."""
        g = self.g
        ranks, arr, code = tp.shard_arrays()
        by_node: dict[int, list[tuple[tuple, int]]] = {}
        for rank, rows, cols, c in zip(ranks.tolist(), (arr[1] - arr[0]).tolist(), (arr[3] - arr[2]).tolist(),
                                       code.tolist()):
            by_node.setdefault(rank // g, []).append(((rows, cols, TIERS[c]), rank))
        groups = [(members, n) for _, members, n in
                  sorted((tuple(shape for shape, _ in sorted(v)), tuple(sorted(v)), n) for n, v in by_node.items())]
        nodes = self.system.nodes
        node_map = np.empty(nodes, dtype=np.int64)  # real node -> its class's node
        fill = np.zeros(nodes, dtype=np.int64)      # a class rank holding no shard, per node
        for i, (members, n) in enumerate(groups):
            node_map[n] = i
            fill[n] = len(members) % g
        rest = np.ones(nodes, dtype=bool)            # the nodes holding no shard, in order
        rest[list(by_node)] = False
        node_map[rest] = np.arange(len(groups), nodes)
        if nodes * g == self.world:   # (each node's figure for each of its ranks)
            inv = np.repeat(node_map * g + fill, g)
        else:
            r = np.arange(self.world)
            inv = node_map[r // g] * g + fill[r // g]
        for i, (members, _) in enumerate(groups):
            for j, (_, rank) in enumerate(members):
                inv[rank] = i * g + j
        key = ("__cw__", tp.table, tuple(tuple(shape for shape, _ in members) for members, _ in groups))
        return key, inv

    def _relabeling(self, tp: TablePlan) -> tuple:
        """How ``tp``'s contribution follows from a remembered one: ``("dp", key)`` for one
        replica per rank in one tier (rank 0's replica, on every rank), ``("node", key, plan,
        first)`` for a node-bound plan on a node's first ranks or on an aligned group of a
        node's ranks (the same plan from rank 0, relabeled; ``key`` names it in the cache),
        ``("cw", key, inv)`` for a column-wise plan over distinct ranks (its class plan,
        relabeled: :meth:`_column_class`), else ``("own",)``. Read from the plan's arrays
        (no shard objects)."""
        ranks, arr, code = tp.shard_arrays()
        if tp.sharding == ST.DATA_PARALLEL:
            # (the same test as shard by shard, on the arrays: a plan over every rank)
            if (ranks.size == self.world and (arr == arr[:, :1]).all() and (code == code[0]).all()
                    and _distinct(ranks)):
                return ("dp", ("__dp__", tp.table, TIERS[int(code[0])], tuple(int(x) for x in arr[:, 0])))
            return ("own",)
        if tp.sharding in (ST.TABLE_ROW_WISE, ST.TABLE_COLUMN_WISE):
            listed = ranks.tolist()
            first, m = listed[0], len(listed)
            # on consecutive ranks from a multiple of their number that divides the node's ranks
            # (a node's first ranks, or an aligned half, quarter... of a node): the relabeling
            # shifts nodes and local indices cyclically, and a table-row-wise shard's owners
            # (local index modulo the shards) shift with it
            if (first % self.g == 0 or (self.g % m == 0 and first % m == 0)) and listed == list(range(first, first + m)):
                arr = np.array(arr, dtype=np.int64)
                code = np.array(code, dtype=np.int8)
                at0 = _MadePlan.new(tp.table, tp.sharding, (list(range(m)), arr, code), None)
                key = _node_key(tp.table, tp.sharding, arr, code)
                return ("node", key, at0, first)
        if tp.sharding in (ST.COLUMN_WISE, ST.TABLE_COLUMN_WISE) and _distinct(ranks):
            # (two column pieces on one rank add up on it: such a plan is costed as it is)
            key, inv = self._column_class(tp)
            return ("cw", key, inv)
        return ("own",)

    def _contribution(self, tp: TablePlan) -> Contribution:
        return self.cost.contribution(compact_work(self.tables[tp.table], tp, self.workload, self.system))

    # ------------------------------------------------------------------ the greedy's proxy, by node
    def best_by_nodes(self, trials: list[list[tuple[str, TablePlan | None]]], state: bool = True) -> Any:
        """The greedy's choice among ``trials`` by the barrier-sum proxy: exactly what the search's
        array evaluation (``NeoPlanner._best(trials, proxy=True)``: a stack of candidate states,
        ``CostModel.barrier_sum_batch``) returns, without a ``29 x world`` array per candidate:
        NotImplemented where it does not apply (contributions kept unpacked, a trial that moves
        a placed table or several tables).

        Why it is exact: a candidate is the state plus a table's contribution, whose ranks fall
        in few column classes (:class:`PackedContribution`: a whole node usually takes one
        column; the ranks of a node holding a shard take a few). Over a class of whole nodes
        the column added is one constant per row, and each phase's slowest rank is a maximum of
        functions each nondecreasing in one row of the state (``x + c``, ``x * s``, ``x / bw``,
        ``alpha + x``, ``x > 0``, ``max``: floating-point rounding keeps their order), so it is
        the function of the class's largest figure per row, the same bits; the per-node largest
        figures of the state are taken once per call. The forward and backward kernels' term
        (launch overheads where a rank has kernels) is nondecreasing in each row where the
        column adds a kernel, and the state's own where it adds nothing there; any other class
        (the nodes whose ranks differ) is priced rank by rank. The figures are then combined as
        ``barrier_sum_batch`` combines them, and ties are broken as the search breaks them.
        ``state`` False: None in place of the chosen candidate's state (a ``29 x world`` array
        the greedy, which places the table and reads the state that makes, does not need)."""
        if not self._pack:
            return NotImplemented
        specs = []
        for changes in trials:
            if any(tp is None for _, tp in changes):
                continue
            if all(n in self.placed and self.placed[n].tp == tp for n, tp in changes):
                continue  # the plan as it is: no move
            if len(changes) != 1 or changes[0][0] in self.placed:
                return NotImplemented
            tp = changes[0][1]
            base, inv = self._contribution_base(tp)
            if not isinstance(base, PackedContribution):
                return NotImplemented
            specs.append((tp, base, base.index if inv is None else base.index[inv]))
        if not specs:
            return None
        ok, its, dps = self.barrier_by_nodes([(base, col) for _, base, col in specs])
        idx = np.nonzero(ok)[0]
        if not idx.size:
            return None
        its = its[idx]
        cost, B = self.cost, self.state.vec
        # the lowest (objective, balance) score, the first on a tie, as NeoPlanner._best picks it
        # (the tied candidates' totals as ``search._totals_batch`` gives them, each from the
        # state and its columns: no state built per candidate)
        vec = lambda i: B + specs[i][1].cols[:, specs[i][2]]  # noqa: E731  (a candidate's state)
        low = min(float(x) for x in its)
        tied = [j for j in range(len(idx)) if float(its[j]) == low]
        # A rank's total depends on its own figures and column only, and the candidates of one
        # contribution (a table-wise table on each of the lightest ranks, its rank-0 figures
        # relabeled) give most ranks the same column: a candidate's totals are the first such
        # candidate's, taken again only on the ranks whose column differs (those of two nodes):
        # the same figures, rank by rank.
        totals = np.empty((len(tied), B.shape[1]))
        first: dict[tuple[int, float], tuple[int, np.ndarray]] = {}
        for row, j in enumerate(tied):
            i = int(idx[j])
            base, col = specs[i][1], specs[i][2]
            ref = first.get((id(base), dps[i]))
            if ref is not None:
                diff = np.flatnonzero(col != ref[1])
                if 2 * diff.size <= col.size:
                    totals[row] = totals[ref[0]]
                    if diff.size:
                        sub = np.empty(diff.size)
                        cost.balance_totals_plus(np.ascontiguousarray(B[:, diff]), base.cols,
                                                 np.ascontiguousarray(col[diff]), dps[i], sub)
                        totals[row, diff] = sub
                    continue
            cost.balance_totals_plus(B, base.cols, col, dps[i], totals[row])
            first.setdefault((id(base), dps[i]), (row, col))
        best = None
        for t, j in zip(totals, tied):
            score = (float(its[j]), float(np.dot(t, t)))
            if best is None or score < best[0]:
                best = (score, int(idx[j]))
        i = best[1]
        tp = specs[i][0]
        return best[0], State(vec(i), dps[i]) if state else None, [(tp, self.contribution(tp))]

    def barrier_by_nodes(self, cands: "list[tuple[PackedContribution, np.ndarray]]") -> tuple[np.ndarray, np.ndarray, list[float]]:
        """For each candidate (a packed contribution and each rank's column of it, added to the
        state): whether the state then fits the memory caps, its barrier-sum proxy
        (``CostModel.barrier_sum_batch`` of the whole state, bit for bit; NaN where it does not
        fit) and its data-parallel bytes, taken by node (see :meth:`best_by_nodes`)."""
        cost, state = self.cost, self.state
        B, g = state.vec, self.g
        nodes = self.world // g
        fo, bo = cost._fwd_overhead, cost._bwd_overhead
        # per node, each row's largest figure and its ranks' slowest forward and backward
        node_max, fwd_node, bwd_node = np.empty((B.shape[0], nodes)), np.empty(nodes), np.empty(nodes)
        _node_maxima(B, g, fo, bo, node_max, fwd_node, bwd_node)
        eps = 1e-6
        cap = (self.caps[0] + eps, self.caps[1] + eps, self.caps[2] + eps)
        caps = np.array(cap)
        alpha, bw = cost._alpha_bw()
        scale = cost._agg_scale
        ok = np.zeros(len(cands), dtype=bool)
        figures = []
        dps = []
        out = np.empty(8)
        width = max(base.cols.shape[1] for base, _ in cands)
        acc = np.empty((B.shape[0], width))
        seen = np.empty(width, dtype=np.bool_)
        for j, (base, col) in enumerate(cands):
            dps.append(state.dp_bytes + base.dp_bytes)
            _by_nodes(B, node_max, fwd_node, bwd_node, base.cols, col, g, caps, scale, alpha, bw, fo, bo, acc, seen, out)
            ok[j] = out[0] == 1.0
            figures.append((out[1], out[2], out[3:].copy()))
        idx = np.nonzero(ok)[0]
        its = np.full(len(cands), np.nan)
        if idx.size:
            # combined as CostModel.barrier_sum_batch combines each phase's slowest rank
            fwd = np.array([figures[i][0] for i in idx], dtype=float)
            bwd = np.array([figures[i][1] for i in idx], dtype=float)
            comm = np.array([figures[i][2] for i in idx], dtype=float).sum(axis=1)
            its[idx] = fwd + bwd + comm + np.array([cost._allreduce_total_s(float(dps[i])) for i in idx])
        return ok, its, dps

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
        """(predicted iteration time, sum of squared per-rank embedding times): the objective,
        ties broken towards balance."""
        t = self.cost.totals(state)
        return self.cost.iteration_s(state), float(np.dot(t, t))

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
        free = self.caps[0] - self.state.hbm
        return ValueError(
            f"table {table.name!r} ({size / GIB:.1f} GiB with optimizer state) fits nowhere this planner "
            f"tried to put it: the largest free capacity left is {float(free.max()) / GIB:.1f} GiB of HBM "
            f"and {float((self.caps[1] - self.state.host[0]).max()) / GIB:.1f} GiB of DRAM on one rank, "
            f"the fullest rank (a split over every rank needs room on each) has {float(free.min()) / GIB:.2f} GiB "
            f"of HBM free, {float((self.caps[:, None] - np.vstack([self.state.hbm, self.state.host])).clip(0).sum()) / GIB:.1f} GiB "
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


def _node_key(table: str, kind: ST, arr: np.ndarray, code: np.ndarray) -> tuple:
    """The cache key of the contribution of ``table`` split ``kind`` over ranks ``0 .. m - 1``
    into the pieces ``arr`` (``(4, m)`` int64) in the tiers ``code`` (int8)."""
    return ("__node__", table, kind, np.ascontiguousarray(arr, dtype=np.int64).tobytes(),
            np.ascontiguousarray(code, dtype=np.int8).tobytes())


def _plan_of(table: str, kind: ST, shards: list[tuple[int, int, int, int, int, str]]) -> _MadePlan:
    """The plan of ``table`` split ``kind`` into ``shards`` (``(rank, row_start, row_end,
    col_start, col_end, tier)`` each, valid: a piece of a plan already made), built from its
    arrays, as :meth:`Placer._contribution_base` keys its caches' contributions by it (its
    shard arrays are those of the plan with these shards spelled out; no shard objects, checked
    and then read back into arrays, for the thousands it builds a search)."""
    ranks = [s[0] for s in shards]
    arr = np.array([s[1:5] for s in shards], dtype=np.int64).T
    code = np.array([TIERS.index(s[5]) for s in shards], dtype=np.int8)
    return _MadePlan.new(table, kind, (ranks, arr, code), None)


def _two_values(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(x, return_inverse=True)`` (the distinct values ascending, each element's
    index among them), without the sort where ``x`` takes at most two values (an even split's
    piece sizes: :func:`_split`)."""
    lo, hi = x.min(), x.max()
    high = x == hi
    if lo == hi:
        return x[:1].copy(), np.zeros(x.size, dtype=np.intp)
    if (high | (x == lo)).all():
        return np.array([lo, hi], dtype=x.dtype), high.astype(np.intp)
    return np.unique(x, return_inverse=True)


def _distinct(ranks: np.ndarray) -> bool:
    """Whether ``ranks`` holds no rank twice (``np.unique(ranks).size == ranks.size``, without
    its sort where the ranks are few, or ascending one by one as a plan over every rank has
    them)."""
    if ranks.size <= 64:
        return len(set(ranks.tolist())) == ranks.size
    if ranks.size and (np.diff(ranks) == 1).all():
        return True
    return bool(np.unique(ranks).size == ranks.size)


def _relabelings(world: int, g: int) -> np.ndarray:
    """Row ``k``: the relabeling that keeps the node structure and maps rank 0 to rank ``k``
    (rank ``i`` takes the figures of rank ``inv[k, i]``: node and local index shifted back by
    rank ``k``'s, modulo the nodes and the node's ranks), as int32, built row block by row block
    (no world^2 int64 temporary)."""
    nodes = world // g
    r = np.arange(world, dtype=np.int32)
    node, local = r // g, r % g
    out = np.empty((world, world), dtype=np.int32)
    step = max(1, (1 << 22) // max(world, 1))
    for k0 in range(0, world, step):
        k = r[k0:k0 + step, None]
        out[k0:k0 + step] = ((node[None, :] - k // g) % nodes) * g + (local[None, :] - k % g) % g
    return out


def _nbytes(world: int) -> int:
    """Bytes of one contribution's array (:class:`~host.planner.cost.Contribution`)."""
    return 8 * Contribution.zeros(1).vec.shape[0] * world


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
