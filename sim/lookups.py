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

:func:`zipf_ranks` and :func:`permute_rows` are the only Zipf generator in neonic
(``host.traces`` re-exports them; ``zipf_rows`` composes them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

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
    head = min(num_rows, 1 << 16)
    cdf = np.cumsum(np.arange(1, head + 1, dtype=np.float64) ** -alpha)
    head_mass = cdf[-1]

    def tail_integral(x):
        if abs(alpha - 1.0) < 1e-12:
            return np.log(x)
        return x ** (1.0 - alpha) / (1.0 - alpha)

    lo, hi = head + 0.5, num_rows + 0.5
    tail_mass = float(tail_integral(hi) - tail_integral(lo)) if num_rows > head else 0.0
    u = rng.random(n) * (head_mass + tail_mass)
    ranks = np.empty(n, dtype=np.int64)
    in_head = u < head_mass
    ranks[in_head] = np.searchsorted(cdf, u[in_head], side="right")
    if tail_mass > 0.0:
        v = u[~in_head] - head_mass + tail_integral(lo)
        x = np.exp(v) if abs(alpha - 1.0) < 1e-12 else (v * (1.0 - alpha)) ** (1.0 / (1.0 - alpha))
        ranks[~in_head] = np.rint(x).astype(np.int64) - 1
    return np.clip(ranks, 0, num_rows - 1)


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
    if num_rows == 1:
        return np.zeros_like(x)
    bits = max(2, (num_rows - 1).bit_length())
    out = _feistel(x.astype(np.uint64), keys, bits)
    todo = np.flatnonzero(out >= num_rows)
    while todo.size:
        out[todo] = _feistel(out[todo], keys, bits)
        todo = todo[out[todo] >= num_rows]
    return out.astype(np.int64)


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
        object.__setattr__(self, "_sorted", np.sort(indices))

    @property
    def bags(self) -> int:
        return int(self.lengths.size)

    @property
    def mean_pooling(self) -> float:
        return float(self.indices.size / self.lengths.size) if self.lengths.size else 0.0

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
        return sum(t.indices.size for t in self.tables.values())


def zipf_table_lookups(name: str, num_rows: int, pooling: float, *, index: int, world: int,
                       batch_per_gpu: int, seed: int, alpha: float, max_bags: int | None = None
                       ) -> TableLookups:
    """Table ``index``'s Zipf lookups for one iteration (see the module doc): the whole batch
    of ``world * batch_per_gpu`` bags, or ``max_bags`` of them spread over the ranks."""
    world = _check_int("world", world, 1)
    batch_per_gpu = _check_int("batch_per_gpu", batch_per_gpu, 1)
    total = world * batch_per_gpu
    bags = total if max_bags is None else max(1, min(total, _check_int("max_bags", max_bags, 1)))
    rng = np.random.default_rng([_check_int("seed", seed, 0), 0x100C, _check_int("index", index, 0)])
    key = rng.integers(0, 2**63, _ROUNDS, dtype=np.uint64)
    pooling = _check_float(f"{name}.pooling", pooling, 0.0)
    lengths = rng.poisson(pooling, bags).astype(np.int64) if pooling > 0 else np.zeros(bags, np.int64)
    indices = zipf_rows(rng, int(lengths.sum()), num_rows, alpha, key=key)
    return TableLookups(name, int(num_rows), lengths, indices, requesters_of(bags, world, batch_per_gpu),
                        scale=total / bags, source=f"zipf(alpha={alpha:g})", alpha=float(alpha))


def draw_lookups(tables: Sequence[object], *, world: int, batch_per_gpu: int, seed: int, alpha: float,
                 max_bags: int | None = None, given: Mapping[str, TableLookups] | None = None
                 ) -> LookupBatch:
    """One iteration's lookups of ``tables`` (objects with ``name``, ``rows``, ``pooling``):
    each table's ``given`` lookups (a trace, a locality fit) or its Zipf default."""
    given = dict(given or {})
    out: dict[str, TableLookups] = {}
    for i, t in enumerate(tables):
        name = getattr(t, "name")
        if name in given:
            out[name] = given[name]
        else:
            out[name] = zipf_table_lookups(name, int(getattr(t, "rows")), float(getattr(t, "pooling")), index=i,
                                           world=world, batch_per_gpu=batch_per_gpu, seed=seed, alpha=alpha,
                                           max_bags=max_bags)
    return LookupBatch(world, batch_per_gpu, seed, out)
