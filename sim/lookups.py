"""One iteration's embedding lookups, and the one Zipf generator every consumer draws them with.

Every consumer of lookups (the cluster runtime's timing-model backend, the SmartNIC effects,
the memory tiers' software cache, the RTL co-simulation's traffic, the benches) takes them as
a :class:`LookupBatch`: per table, the bags of the iteration in the combined *lengths* format
(Neo; TorchRec's ``KeyedJaggedTensor``), each bag tagged with the rank that owns its sample.
The two backends of a run therefore run the same iteration for a seed: switching from the
timing models to the RTL changes fidelity, never the workload.

Sources of a table's lookups (the host layer, ``host.lookups``, resolves which one a table
uses and builds non-Zipf tables from trace files or fitted locality statistics):

* :func:`zipf_table_lookups`: the default. Bag lengths Poisson(pooling), rows with
  ``P(k-th most popular) ~ k ** -alpha`` (:func:`zipf_ranks`), the hot rows scattered over the
  table by a keyed permutation (:func:`permute_rows`) whose key comes from the table's own
  generator, seeded by ``(seed, table index)`` only: a table's lookups do not depend on
  which other tables exist or in which order a consumer asks for them.
* anything else, given as :class:`TableLookups` (``source`` says what it is).

A batch may be *sampled*: at cluster scale an iteration makes ~1e9 lookups, so a table draws
at most ``max_bags`` bags, spread evenly over the requesting ranks; ``scale`` is the number of
real bags each drawn bag stands for. Figures measured on the sample (shares of lookups per
row shard, cache hit rates) are ratios and carry over; counts are multiplied by ``scale``.

A Zipf table is drawn when a consumer first reads its arrays (``lengths`` alone costs only
its Poisson draw): the planner prices Zipf tables from their rows and ``alpha``, so a
4096-GPU plan does not hold the ~1.2e8 lookups of a batch nobody reads. Whenever it is
drawn, a table gives the same arrays. The draw's inner loops (the head's inverse-CDF search,
the Feistel permutation) are compiled (``sim.compiled``) and give numpy's values bit for bit;
the tail's floating-point arithmetic stays numpy's.

:func:`zipf_ranks` and :func:`permute_rows` are the only Zipf generator in neonic
(``host.traces`` re-exports them; ``zipf_rows`` composes them).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from neonic.sim.compiled import HAVE_NUMBA, jit

__all__ = [
    "ZIPF_ALPHA",
    "TableLookups",
    "LookupBatch",
    "zipf_ranks",
    "permute_rows",
    "zipf_rows",
    "zipf_table_lookups",
    "draw_lookups",
    "requesters_of",
]

#: Default Zipf exponents by mode (REFERENCES.md: FBGEMM's TBE benchmark defaults, 1.15 for
#: training and 1.09 for inference).
ZIPF_ALPHA: Mapping[str, float] = {"training": 1.15, "inference": 1.09}


# ------------------------------------------------------------------------------- checks
def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_float(name: str, value: object, minimum: float) -> float:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not ok or not math.isfinite(float(value)) or float(value) < minimum:
        raise ValueError(f"{name}: expected a finite number >= {minimum}, got {value!r}")
    return float(value)


def _check_rng(rng: object) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng: expected a numpy.random.Generator (seeds are passed explicitly), "
                         f"got {type(rng).__name__}")
    return rng


# ------------------------------------------------------------------------------ Zipf
def zipf_ranks(rng: np.random.Generator, n: int, num_rows: int, alpha: float) -> np.ndarray:
    """``n`` ranks in ``[0, num_rows)`` with ``P(rank = k) ~ (k + 1) ** -alpha``.

    The first 65536 ranks are drawn from the exact discrete law (inverse CDF); beyond them, the
    law is the continuous density ``x ** -alpha`` on ``[65536.5, num_rows + 0.5)`` rounded to
    the nearest rank, which differs from the discrete weights by O(1/k**2) there. Memory and
    time are O(n) whatever ``num_rows`` is (a table of 2e9 rows costs nothing extra).
    """
    rng = _check_rng(rng)
    n = _check_int("n", n, 0)
    num_rows = _check_int("num_rows", num_rows, 1)
    alpha = _check_float("alpha", alpha, 0.0)
    return _zipf_ranks(rng, n, num_rows, alpha, _head_cdf(min(num_rows, _HEAD), alpha))


_HEAD = 1 << 16     # ranks drawn from the exact discrete law
_GUIDE = 1 << 14    # buckets of the head search's guide table
#: draws of fewer lookups stay in numpy (the same values): loading the compiled kernels costs
#: about 0.2 CPU-s per process (1 s to compile on a fresh cache), more than numpy spends on the
#: whole batch of a small scenario (measured 2026-11-26: 16,384 lookups, ranks and permutation,
#: 1.8-2.0 ms in numpy, 0.6 ms compiled)
_COMPILED_MIN = 1 << 14


def _use_compiled(compiled: bool | None, n: int) -> bool:
    return (HAVE_NUMBA and n >= _COMPILED_MIN) if compiled is None else compiled


@dataclass(frozen=True, eq=False)
class _HeadCDF:
    """The discrete law's cumulative weights over the first ``head`` ranks, and a guide table
    for :func:`_head_search`: ``guide[j]`` ranks have cumulative weight ``<= thresholds[j]``
    (``np.searchsorted(cdf, thresholds, "right")``; the last threshold is infinite)."""

    cdf: np.ndarray
    thresholds: np.ndarray
    guide: np.ndarray


def _head_cdf(head: int, alpha: float, memo: dict | None = None) -> _HeadCDF:
    """The head law of ``alpha`` over ``head`` ranks (tables of one draw share it: ``memo``)."""
    key = (head, alpha)
    if memo is not None and key in memo:
        return memo[key]
    cdf = np.cumsum(np.arange(1, head + 1, dtype=np.float64) ** -alpha)
    thresholds = np.append(np.arange(_GUIDE, dtype=np.float64) * (cdf[-1] / _GUIDE), np.inf)
    guide = np.searchsorted(cdf, thresholds, side="right").astype(np.int64)
    for a in (cdf, thresholds, guide):
        a.setflags(write=False)
    law = _HeadCDF(cdf, thresholds, guide)
    if memo is not None:
        memo[key] = law
    return law


@jit(cache=True, nogil=True)
def _head_search(cdf, thresholds, guide, u, head_mass, out):  # pragma: no cover (compiled)
    """``out[i] = np.searchsorted(cdf, u[i], "right")`` for every ``u[i] < head_mass``; returns
    the positions of the others (the tail's, in order). The guide bucket ``j`` with
    ``thresholds[j] <= u[i] < thresholds[j + 1]`` (guessed from ``u[i]``, then corrected by
    comparisons, so rounding cannot mislead it) bounds the answer to ``[guide[j], guide[j + 1]]``:
    a binary search there gives numpy's index."""
    g = guide.size - 1
    step = thresholds[1] - thresholds[0] if g > 1 else head_mass
    tails = 0
    for i in range(u.size):
        x = u[i]
        if not x < head_mass:
            tails += 1
            continue
        j = int(x / step) if step > 0 else 0
        if j > g - 1:
            j = g - 1
        while j > 0 and thresholds[j] > x:
            j -= 1
        while j < g - 1 and thresholds[j + 1] <= x:
            j += 1
        lo = guide[j]
        hi = guide[j + 1]
        while lo < hi:
            mid = (lo + hi) >> 1
            if cdf[mid] > x:
                hi = mid
            else:
                lo = mid + 1
        out[i] = lo
    pos = np.empty(tails, dtype=np.int64)
    k = 0
    for i in range(u.size):
        if not u[i] < head_mass:
            pos[k] = i
            k += 1
    return pos


@jit(cache=True, nogil=True)
def _place_and_clip(ranks, pos, values, top):  # pragma: no cover (compiled)
    """``ranks[pos] = values``, then ``np.clip(ranks, 0, top)`` in place."""
    for k in range(pos.size):
        ranks[pos[k]] = values[k]
    for i in range(ranks.size):
        r = ranks[i]
        if r < 0:
            ranks[i] = 0
        elif r > top:
            ranks[i] = top


def _zipf_ranks(rng: np.random.Generator, n: int, num_rows: int, alpha: float, law: _HeadCDF,
                compiled: bool | None = None) -> np.ndarray:
    """:func:`zipf_ranks` with its head law given (checked arguments). ``compiled``: the head
    search and the clip in :func:`_head_search` and :func:`_place_and_clip` (default: where
    numba is enabled and ``n >= _COMPILED_MIN``), else numpy's searchsorted and masks; the
    tail's ranks are numpy's arithmetic either way (the same values, in the same order), so
    the ranks are the same."""
    cdf = law.cdf
    head = cdf.size
    head_mass = cdf[-1]

    def tail_integral(x):
        if abs(alpha - 1.0) < 1e-12:
            return np.log(x)
        return x ** (1.0 - alpha) / (1.0 - alpha)

    def tail_ranks(ut):
        v = ut - head_mass + tail_integral(lo)
        x = np.exp(v) if abs(alpha - 1.0) < 1e-12 else (v * (1.0 - alpha)) ** (1.0 / (1.0 - alpha))
        return np.rint(x).astype(np.int64) - 1

    lo, hi = head + 0.5, num_rows + 0.5
    tail_mass = float(tail_integral(hi) - tail_integral(lo)) if num_rows > head else 0.0
    u = rng.random(n) * (head_mass + tail_mass)
    ranks = np.empty(n, dtype=np.int64)
    if _use_compiled(compiled, n):
        pos = _head_search(cdf, law.thresholds, law.guide, u, head_mass, ranks)
        if tail_mass <= 0.0:
            pos = pos[:0]
        _place_and_clip(ranks, pos, tail_ranks(u[pos]), num_rows - 1)
        return ranks
    in_head = u < head_mass
    ranks[in_head] = np.searchsorted(cdf, u[in_head], side="right")
    if tail_mass > 0.0:
        in_tail = ~in_head
        ranks[in_tail] = tail_ranks(u[in_tail])
    return np.clip(ranks, 0, num_rows - 1, out=ranks)


_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9))
_ROUNDS = 4


def _feistel(x: np.ndarray, keys: np.ndarray, bits: int) -> np.ndarray:
    """A bijection of ``bits``-bit values: unbalanced Feistel rounds whose halves alternate."""
    hi_bits, lo_bits = bits - bits // 2, bits // 2
    for r in range(_ROUNDS):
        # x = (left: hi_bits, right: lo_bits) -> (right, left ^ F(right)), sizes swapped.
        right = x & np.uint64((1 << lo_bits) - 1)
        left = x >> np.uint64(lo_bits)
        f = (right + keys[r]) * _MIX[0]
        f ^= f >> np.uint64(31)
        f *= _MIX[1]
        f ^= f >> np.uint64(29)
        x = (right << np.uint64(hi_bits)) | (left ^ (f & np.uint64((1 << hi_bits) - 1)))
        hi_bits, lo_bits = lo_bits, hi_bits
    return x


def permute_rows(x, num_rows: int, key) -> np.ndarray:
    """A keyed pseudo-random bijection of ``[0, num_rows)`` applied to ``x``.

    ``key``: 4 ``uint64`` round keys (e.g. ``rng.integers(0, 2**63, 4, dtype=np.uint64)``),
    one permutation per key. A 4-round Feistel network on the bits that cover ``num_rows``,
    cycle-walking back into the range: O(1) memory for any table size (a table of 4e7 rows
    needs no 4e7-entry permutation array) and fewer than two rounds of walking on average.
    """
    num_rows = _check_int("num_rows", num_rows, 1)
    x = np.asarray(x, dtype=np.int64)
    if x.size and (x.min() < 0 or x.max() >= num_rows):
        raise ValueError(f"x: expected values in [0, {num_rows}), got {x.min()}..{x.max()}")
    keys = np.asarray(key, dtype=np.uint64)
    if keys.shape != (_ROUNDS,):
        raise ValueError(f"key: expected {_ROUNDS} uint64 round keys, got shape {keys.shape}")
    return _permute(x, num_rows, keys)


def _permute(x: np.ndarray, num_rows: int, keys: np.ndarray, compiled: bool | None = None) -> np.ndarray:
    """:func:`permute_rows` of checked arguments (``x`` int64 in range, 4 uint64 keys):
    compiled (:func:`_permute_kernel`, default where numba is enabled and there are at least
    ``_COMPILED_MIN`` values) or in numpy rounds over
    the whole array; the same values either way."""
    if num_rows == 1:
        return np.zeros_like(x)
    bits = max(2, (num_rows - 1).bit_length())
    if _use_compiled(compiled, x.size):
        out = np.empty_like(x)
        _permute_kernel(x, keys, bits, num_rows, out)
        return out
    out = _feistel(x.astype(np.uint64), keys, bits)
    todo = np.flatnonzero(out >= num_rows)
    while todo.size:
        out[todo] = _feistel(out[todo], keys, bits)
        todo = todo[out[todo] >= num_rows]
    return out.astype(np.int64)


@jit(cache=True, nogil=True)
def _permute_kernel(x, keys, bits, num_rows, out):  # pragma: no cover (compiled)
    """:func:`_feistel`'s rounds on one value at a time, walked until it lands in
    ``[0, num_rows)`` (the same cycle walk as the array version: each value its own count)."""
    m0 = np.uint64(0x9E3779B97F4A7C15)
    m1 = np.uint64(0xBF58476D1CE4E5B9)
    s31 = np.uint64(31)
    s29 = np.uint64(29)
    one = np.uint64(1)
    lo0 = bits // 2
    hi0 = bits - lo0
    # the two halves' widths alternate: even rounds (hi0, lo0), odd rounds (lo0, hi0)
    sh_lo = (np.uint64(lo0), np.uint64(hi0))
    sh_hi = (np.uint64(hi0), np.uint64(lo0))
    mask_lo = ((one << np.uint64(lo0)) - one, (one << np.uint64(hi0)) - one)
    mask_hi = ((one << np.uint64(hi0)) - one, (one << np.uint64(lo0)) - one)
    limit = np.uint64(num_rows)
    for i in range(x.size):
        v = np.uint64(x[i])
        while True:
            for r in range(4):
                p = r & 1
                right = v & mask_lo[p]
                left = v >> sh_lo[p]
                f = (right + keys[r]) * m0
                f ^= f >> s31
                f *= m1
                f ^= f >> s29
                v = (right << sh_hi[p]) | (left ^ (f & mask_hi[p]))
            if v < limit:
                break
        out[i] = np.int64(v)


def zipf_rows(rng: np.random.Generator, n: int, num_rows: int, alpha: float, key=None) -> np.ndarray:
    """``n`` row ids of a table of ``num_rows`` rows with Zipf(``alpha``) popularity, the hot
    rows scattered by the keyed permutation ``key`` (drawn from ``rng`` first when None)."""
    rng = _check_rng(rng)
    if key is None:
        key = rng.integers(0, 2**63, _ROUNDS, dtype=np.uint64)
    return permute_rows(zipf_ranks(rng, n, num_rows, alpha), num_rows, key)


# ------------------------------------------------------------------------- the batch type
def requesters_of(bags: int, world: int, batch_per_gpu: int) -> np.ndarray:
    """The rank owning each of ``bags`` drawn bags: the whole batch (``bags == world *
    batch_per_gpu``) in rank order, or a sample spread evenly over the ranks."""
    return (np.arange(bags, dtype=np.int64) * world) // max(1, bags)


@dataclass(frozen=True, eq=False)
class TableLookups:
    """One table's lookups in one iteration (or a sample of them).

    ``lengths[b]`` row ids for bag ``b``, ``indices`` concatenated; ``requester[b]``: the rank
    that owns bag ``b``'s sample; ``scale``: real bags per drawn bag (1.0: the whole batch);
    ``source``: where the lookups come from (``zipf(alpha=...)``, ``trace:PATH``,
    ``locality:PATH#BLOCK``), recorded in the run's results.

    A Zipf table (:func:`zipf_table_lookups`) is drawn when its arrays are first read: its
    law, source and scale are known before, and most consumers need no more (the planner
    prices a Zipf table from its rows and its ``alpha``), so a 4096-GPU run need not hold
    ~1e8 lookups it never reads. The arrays, once read, are those the draw always gives.
    """

    name: str
    num_rows: int
    lengths: np.ndarray
    indices: np.ndarray
    requester: np.ndarray
    scale: float = 1.0
    source: str = "zipf"
    alpha: float | None = None  # the Zipf law the lookups were drawn from (None: a trace or fit)

    def __post_init__(self) -> None:
        _check_int(f"{self.name}.num_rows", self.num_rows, 1)
        lengths = np.asarray(self.lengths, dtype=np.int64)
        indices = np.asarray(self.indices, dtype=np.int64)
        requester = np.asarray(self.requester, dtype=np.int64)
        if lengths.ndim != 1 or requester.shape != lengths.shape:
            raise ValueError(f"{self.name}.requester: expected one rank per bag ({lengths.size}), "
                             f"got shape {requester.shape}")
        if lengths.size and lengths.min() < 0:
            raise ValueError(f"{self.name}.lengths: expected counts >= 0, got {lengths.min()}")
        if int(lengths.sum()) != indices.size:
            raise ValueError(f"{self.name}.indices: expected sum(lengths) = {int(lengths.sum())}, "
                             f"got {indices.size}")
        if indices.size and (indices.min() < 0 or indices.max() >= self.num_rows):
            raise ValueError(f"{self.name}.indices: expected row ids in [0, {self.num_rows})")
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"{self.name}.scale: expected > 0, got {self.scale!r}")
        object.__setattr__(self, "lengths", lengths)
        object.__setattr__(self, "indices", indices)
        object.__setattr__(self, "requester", requester)

    @classmethod
    def _deferred(cls, draw: "_ZipfDraw") -> "TableLookups":
        """A Zipf table whose arrays ``draw`` makes on first read (see the class doc)."""
        self = object.__new__(cls)
        scale = draw.world * draw.batch_per_gpu / draw.bags
        for k, v in (("name", draw.name), ("num_rows", draw.num_rows), ("scale", scale),
                     ("source", f"zipf(alpha={draw.alpha:g})"), ("alpha", float(draw.alpha)), ("_draw", draw)):
            object.__setattr__(self, k, v)
        return self

    def __getattr__(self, attr: str):
        # only reached for attributes not set: a deferred Zipf table's arrays before first read
        draw = self.__dict__.get("_draw")
        if draw is None or attr not in ("lengths", "indices", "requester"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {attr!r}")
        if attr == "requester":
            value = draw.requester if draw.requester is not None else requesters_of(draw.bags, draw.world,
                                                                                   draw.batch_per_gpu)
        elif attr == "lengths":
            value = draw.lengths()
        else:
            lengths, value = draw.lookups()
            self.__dict__.setdefault("lengths", lengths)
        object.__setattr__(self, attr, value)
        return value

    def __fingerprint__(self):
        """What identifies the lookups (``host.planner.cache``): a deferred Zipf table's draw
        (its arrays follow from it: read or not, the same key), else the arrays themselves."""
        draw = self.__dict__.get("_draw")
        if draw is not None:
            return ("zipf", draw)
        return (self.name, self.num_rows, self.lengths, self.indices, self.requester, self.scale, self.source,
                self.alpha)

    @functools.cached_property
    def _sorted(self) -> np.ndarray:
        """The indices sorted (for :meth:`row_share`; made on first use)."""
        return np.sort(self.indices)

    @property
    def bags(self) -> int:
        return int(self.lengths.size)

    @property
    def mean_pooling(self) -> float:
        n = self.lengths.size
        return float(int(self.lengths.sum()) / n) if n else 0.0

    def bag_of(self) -> np.ndarray:
        """The bag of every index."""
        return np.repeat(np.arange(self.lengths.size), self.lengths)

    def select(self, bags: np.ndarray | None = None, row_start: int = 0, row_end: int | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """``(lengths, rows)`` of the bags selected by the boolean mask ``bags`` (all if None),
        keeping only rows in ``[row_start, row_end)``, made relative to ``row_start`` (a row
        shard's view: what the shard's owner gathers for those bags)."""
        row_end = self.num_rows if row_end is None else row_end
        idx = self.indices
        bag = self.bag_of()
        keep = (idx >= row_start) & (idx < row_end)
        if bags is not None:
            keep &= np.asarray(bags, bool)[bag]
        else:
            bags = np.ones(self.lengths.size, bool)
        counts = np.bincount(bag[keep], minlength=self.lengths.size)
        return counts[np.asarray(bags, bool)], idx[keep] - row_start

    def row_share(self, bounds: Sequence[tuple[int, int]]) -> np.ndarray:
        """Share of the lookups that fall in each row range ``[start, end)``."""
        n = max(1, self.indices.size)
        ab = np.asarray(bounds, dtype=np.int64).reshape(-1, 2)
        pos = np.searchsorted(self._sorted, ab)
        return (pos[:, 1] - pos[:, 0]) / n


@dataclass(frozen=True, eq=False)
class LookupBatch:
    """One iteration's lookups of every table (``tables`` by name, in workload order)."""

    world: int
    batch_per_gpu: int
    seed: int
    tables: dict[str, TableLookups] = field(default_factory=dict)

    def __getitem__(self, name: str) -> TableLookups:
        try:
            return self.tables[name]
        except KeyError:
            raise KeyError(f"lookups: no table {name!r}") from None

    def sources(self) -> dict[str, str]:
        """Each table's source (for the results)."""
        return {name: t.source for name, t in self.tables.items()}

    @property
    def lookups(self) -> int:
        """Lookups drawn over all tables (``sum(lengths)``: a deferred table's rows stay undrawn)."""
        return sum(int(t.lengths.sum()) for t in self.tables.values())


@dataclass(frozen=True)
class _ZipfDraw:
    """How table ``index`` draws its Zipf lookups (see the module doc): ``bags`` bags of
    Poisson(``pooling``) lengths, then their rows, from the generator of ``(seed, index)``."""

    name: str
    num_rows: int
    pooling: float
    index: int
    world: int
    batch_per_gpu: int
    seed: int
    alpha: float
    bags: int
    law: _HeadCDF | None = field(default=None, compare=False, repr=False)  # shared by a batch's tables
    requester: np.ndarray | None = field(default=None, compare=False, repr=False)  # shared, read-only

    def _rng(self) -> np.random.Generator:
        return np.random.default_rng([self.seed, 0x100C, self.index])

    def _lengths(self, rng: np.random.Generator) -> np.ndarray:
        if self.pooling > 0:
            return rng.poisson(self.pooling, self.bags).astype(np.int64)
        return np.zeros(self.bags, np.int64)

    def lengths(self) -> np.ndarray:
        """The bags' lengths alone (the generator's draws before the rows)."""
        rng = self._rng()
        rng.integers(0, 2**63, _ROUNDS, dtype=np.uint64)
        return self._lengths(rng)

    def lookups(self) -> tuple[np.ndarray, np.ndarray]:
        """``(lengths, indices)``: the permutation key, the lengths, then the rows."""
        rng = self._rng()
        key = rng.integers(0, 2**63, _ROUNDS, dtype=np.uint64)
        lengths = self._lengths(rng)
        law = self.law if self.law is not None else _head_cdf(min(self.num_rows, _HEAD), self.alpha)
        ranks = _zipf_ranks(rng, int(lengths.sum()), self.num_rows, self.alpha, law)
        return lengths, _permute(ranks, self.num_rows, key)

    def __fingerprint__(self):
        return (self.name, self.num_rows, self.pooling, self.index, self.world, self.batch_per_gpu, self.seed,
                self.alpha, self.bags)


def zipf_table_lookups(name: str, num_rows: int, pooling: float, *, index: int, world: int,
                       batch_per_gpu: int, seed: int, alpha: float, max_bags: int | None = None,
                       _laws: dict | None = None) -> TableLookups:
    """Table ``index``'s Zipf lookups for one iteration (see the module doc): the whole batch
    of ``world * batch_per_gpu`` bags, or ``max_bags`` of them spread over the ranks; drawn
    on first read (:class:`TableLookups`). ``_laws``: what a batch's tables share (head laws,
    requester arrays)."""
    world = _check_int("world", world, 1)
    batch_per_gpu = _check_int("batch_per_gpu", batch_per_gpu, 1)
    total = world * batch_per_gpu
    bags = total if max_bags is None else max(1, min(total, _check_int("max_bags", max_bags, 1)))
    seed = _check_int("seed", seed, 0)
    index = _check_int("index", index, 0)
    pooling = _check_float(f"{name}.pooling", pooling, 0.0)
    num_rows = _check_int(f"{name}.num_rows", num_rows, 1)
    alpha = _check_float("alpha", alpha, 0.0)
    law = requester = None
    if _laws is not None:
        # the batch's tables share one head law per (head, alpha) and one requester array per
        # bag count (read-only: a sampled batch gives every table the same bags)
        law = _head_cdf(min(num_rows, _HEAD), alpha, _laws)
        requester = _laws.get(("requester", bags, world))
        if requester is None:
            requester = _laws[("requester", bags, world)] = requesters_of(bags, world, batch_per_gpu)
            requester.setflags(write=False)
    return TableLookups._deferred(_ZipfDraw(name, num_rows, pooling, index, world, batch_per_gpu, seed, alpha,
                                            bags, law, requester))


def draw_lookups(tables: Sequence[object], *, world: int, batch_per_gpu: int, seed: int, alpha: float,
                 max_bags: int | None = None, given: Mapping[str, TableLookups] | None = None
                 ) -> LookupBatch:
    """One iteration's lookups of ``tables`` (objects with ``name``, ``rows``, ``pooling``):
    each table's ``given`` lookups (a trace, a locality fit) or its Zipf default."""
    given = dict(given or {})
    laws: dict = {}
    out: dict[str, TableLookups] = {}
    for i, t in enumerate(tables):
        name = getattr(t, "name")
        if name in given:
            out[name] = given[name]
        else:
            out[name] = zipf_table_lookups(name, int(getattr(t, "rows")), float(getattr(t, "pooling")), index=i,
                                           world=world, batch_per_gpu=batch_per_gpu, seed=seed, alpha=alpha,
                                           max_bags=max_bags, _laws=laws)
    return LookupBatch(world, batch_per_gpu, seed, out)
