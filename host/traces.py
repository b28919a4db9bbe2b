"""Synthetic embedding-lookup traces: Zipf, and fitted to published locality statistics.

A :class:`Trace` is one batch of embedding lookups in the combined *lengths* format that Neo
and TorchRec's ``KeyedJaggedTensor`` use: for every table, a lengths vector of ``batch_size``
bags and a values vector of row indices, the tables concatenated. Caches, the gather/pool unit
and the cluster model consume them; they save to and load from ``.npz`` (no pickle).

Two generators (both :class:`TraceGenerator`, both seeded only through the
``numpy.random.Generator`` passed to :meth:`~TraceGenerator.generate`):

* :class:`ZipfTraceGenerator`: FBGEMM's benchmark shape (``T`` tables of ``E`` rows, batch
  ``B``, pooling ``L``) with Zipf(``alpha``) row popularity. The hot rows are scattered over
  each table's row space by a keyed pseudo-random permutation (not rows ``0..k``), so a set
  index of the row id sees them the way it would see real hot rows.
* :class:`LocalityTraceGenerator` (from :func:`fit_generator`): reproduces the two histograms
  of a block of Meta's ``dlrm_datasets_2021_locality_stats.txt``: how many unique rows are
  touched ``(0,1], (1,2], (2,4], ...`` times in a batch, and which share of the lookups falls
  on rows of each of those reuse bins. :func:`trace_locality` measures the same statistics on
  any trace, and :func:`total_variation` compares them.

Scaling a locality fit down
===========================

The published batch (65536 samples over 856 tables) makes ~8.9e8 lookups on ~1.3e8 unique
rows. A simulation wants 1e5..1e6 lookups with the *same shape* of both histograms. Thinning
the lookups (keeping each with probability p) would not do: a row touched ``c`` times would
be touched ``Binomial(c, p)`` times, moving rows to lower bins and dropping most of them. The
fit instead scales the way taking a subset of the tables does: every row keeps its reuse count,
and the number of unique rows shrinks with the number of lookups (``unique = lookups /
mean reuse``). Per bin ``b`` with bounds ``(lo, hi]`` the generator makes ``n_b ~ rows_b *
unique`` rows whose counts (drawn within the bin, then corrected so they add up) sum to
``lookups_b ~ share_b * lookups``. Both histograms are then reproduced up to integer rounding,
except where a bin's lookups cannot fill even one row: the reuse > 32768 bin holds ~2% of the
lookups, so below ~1.6e6 lookups its single row necessarily over- or under-fills it. At 2**20
lookups this costs ~0.01 of total variation (see :meth:`LocalityTraceGenerator.plan`, which
predicts both distances before generating); at 1e5 lookups the three top bins (~7% of the
lookups) no longer fit and the lookup-share distance exceeds 0.05.

What the statistics do not say, the generator chooses and documents: lookups are in random
order (no temporal locality beyond the batch's reuse), unique rows are spread uniformly over
the tables, and bags are filled uniformly at random (so bag sizes are multinomial).
"""

from __future__ import annotations

import math
import re
import zipfile
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from neonic.sim.lookups import permute_rows, zipf_ranks  # the one Zipf generator (sim/)

__all__ = [
    "TRACE_FORMAT_VERSION",
    "PUBLISHED_LOCALITY_STATS",
    "POOLING_DISTRIBUTIONS",
    "REUSE_BIN_LOWER",
    "TableTrace",
    "Trace",
    "LocalityStats",
    "TraceGenerator",
    "ZipfTraceGenerator",
    "LocalityTraceGenerator",
    "LocalityPlan",
    "zipf_ranks",
    "permute_rows",
    "load_locality_stats",
    "parse_locality_stats",
    "fit_generator",
    "trace_locality",
    "total_variation",
    "save_trace",
    "load_trace",
]

#: Meta's published locality statistics of its synthetic production-like lookups (856 tables,
#: batch 65536; facebookresearch/dlrm_datasets, MIT licence beside it), shipped with neonic.
PUBLISHED_LOCALITY_STATS = Path(__file__).resolve().parent / "data" / "dlrm_datasets_2021_locality_stats.txt"
#: Version written into every saved trace; :func:`load_trace` refuses other versions.
TRACE_FORMAT_VERSION = 1
#: Bag-size distributions: constant (every bag ``round(pooling)``), Poisson(pooling), or
#: log-normal with mean ``pooling`` (``pooling_sigma`` is the sigma of the underlying normal).
POOLING_DISTRIBUTIONS = ("constant", "poisson", "lognormal")
#: Lower bounds of the reuse bins of the locality-statistics file: bin ``i`` holds counts in
#: ``(REUSE_BIN_LOWER[i], REUSE_BIN_LOWER[i + 1]]``, the last bin ``(32768, inf)``.
REUSE_BIN_LOWER = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
                   32768)


# ------------------------------------------------------------------------------- checks
# the shared config vocabulary (one wording of every error: neonic.sim.schema)
from neonic.sim.schema import integer as _check_int, number as _check_float  # noqa: E402


def _check_rng(rng: object) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng: expected a numpy.random.Generator (seeds are passed explicitly), "
                         f"got {type(rng).__name__}")
    return rng


def _int_array(name: str, value: object) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0):
        raise ValueError(f"{name}: expected a 1-D integer array, got dtype {arr.dtype} "
                         f"shape {arr.shape}")
    return arr.astype(np.int64, copy=False)


# ------------------------------------------------------------------------------- traces
@dataclass(frozen=True, eq=False)
class TableTrace:
    """One table's lookups: ``lengths[b]`` indices for bag ``b``, ``indices`` concatenated."""

    num_rows: int
    lengths: np.ndarray
    indices: np.ndarray

    def __post_init__(self) -> None:
        self.validate("table")

    def validate(self, where: str) -> None:
        _check_int(f"{where}.num_rows", self.num_rows, 1)
        lengths = _int_array(f"{where}.lengths", self.lengths)
        indices = _int_array(f"{where}.indices", self.indices)
        if lengths.size and lengths.min() < 0:
            raise ValueError(f"{where}.lengths: expected counts >= 0, got {lengths.min()}")
        total = int(lengths.sum())
        if total != indices.size:
            raise ValueError(f"{where}.indices: expected sum(lengths) = {total} indices, got "
                             f"{indices.size}")
        if indices.size and (indices.min() < 0 or indices.max() >= self.num_rows):
            bad = indices.min() if indices.min() < 0 else indices.max()
            raise ValueError(f"{where}.indices: expected row indices in [0, {self.num_rows}), "
                             f"got {bad}")
        object.__setattr__(self, "lengths", lengths)
        object.__setattr__(self, "indices", indices)

    @property
    def offsets(self) -> np.ndarray:
        """Bag offsets (``batch_size + 1`` of them, the first 0, the last the index count)."""
        return np.concatenate([[0], np.cumsum(self.lengths)])


@dataclass(frozen=True, eq=False)
class Trace:
    """One batch of lookups over several tables in the combined lengths format.

    ``tables[t].lengths`` has ``batch_size`` entries; :meth:`combined` gives the concatenated
    form ``(num_rows[T], lengths[T * B], indices[sum(lengths)])`` (table-major, like FBGEMM's
    ``offsets[t * B + b]``), and :meth:`from_combined` builds a trace from it.
    """

    tables: tuple[TableTrace, ...]
    batch_size: int

    def __post_init__(self) -> None:
        _check_int("batch_size", self.batch_size, 1)
        tables = tuple(self.tables)
        if not tables:
            raise ValueError("tables: expected at least one table, got none")
        for t, table in enumerate(tables):
            if not isinstance(table, TableTrace):
                raise ValueError(f"tables[{t}]: expected a TableTrace, got "
                                 f"{type(table).__name__}")
            if table.lengths.size != self.batch_size:
                raise ValueError(f"tables[{t}].lengths: expected batch_size = {self.batch_size} "
                                 f"bags, got {table.lengths.size}")
        object.__setattr__(self, "tables", tables)

    @property
    def num_tables(self) -> int:
        return len(self.tables)

    @property
    def num_rows(self) -> np.ndarray:
        return np.array([t.num_rows for t in self.tables], dtype=np.int64)

    @property
    def lookups(self) -> int:
        return sum(t.indices.size for t in self.tables)

    def combined(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(num_rows[T], lengths[T * B], indices)``: the tables concatenated."""
        return (self.num_rows, np.concatenate([t.lengths for t in self.tables]),
                np.concatenate([t.indices for t in self.tables]))

    @classmethod
    def from_combined(cls, num_rows, batch_size: int, lengths, indices) -> Trace:
        """Split the combined form back into tables (validating it)."""
        num_rows = _int_array("num_rows", num_rows)
        batch_size = _check_int("batch_size", batch_size, 1)
        lengths = _int_array("lengths", lengths)
        indices = _int_array("indices", indices)
        if num_rows.size == 0:
            raise ValueError("num_rows: expected at least one table, got none")
        if lengths.size != num_rows.size * batch_size:
            raise ValueError(f"lengths: expected num_tables * batch_size = "
                             f"{num_rows.size * batch_size} entries, got {lengths.size}")
        if lengths.size and lengths.min() < 0:
            raise ValueError(f"lengths: expected counts >= 0, got {lengths.min()}")
        if int(lengths.sum()) != indices.size:
            raise ValueError(f"indices: expected sum(lengths) = {int(lengths.sum())} indices, "
                             f"got {indices.size}")
        if num_rows.min() < 1:
            t = int(np.argmin(num_rows))
            raise ValueError(f"num_rows: expected >= 1 rows per table, got {num_rows[t]} for "
                             f"table {t}")
        per_table = lengths.reshape(num_rows.size, batch_size).sum(axis=1)
        table_of = np.repeat(np.arange(num_rows.size), per_table)
        bad = np.flatnonzero((indices < 0) | (indices >= num_rows[table_of]))
        if bad.size:
            i, t = int(bad[0]), int(table_of[bad[0]])
            raise ValueError(f"indices: expected row indices in [0, num_rows[{t}] = "
                             f"{num_rows[t]}) for table {t}, got {indices[i]} at position {i}")
        bounds = np.concatenate([[0], np.cumsum(per_table)])
        tables = tuple(TableTrace(int(num_rows[t]), lengths[t * batch_size:(t + 1) * batch_size],
                                  indices[bounds[t]:bounds[t + 1]])
                       for t in range(num_rows.size))
        return cls(tables, batch_size)


# ---------------------------------------------------------------------- row permutation
def _permute_per_table(x: np.ndarray, table: np.ndarray, num_rows: int, keys: np.ndarray
                       ) -> np.ndarray:
    """:func:`permute_rows` with table ``t``'s key ``keys[t]`` for the elements of table ``t``."""
    order = np.argsort(table, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(table, minlength=len(keys)))])
    out = np.empty(x.size, dtype=np.int64)
    for t in range(len(keys)):
        part = order[bounds[t]:bounds[t + 1]]
        if part.size:
            out[part] = permute_rows(x[part], num_rows, keys[t])
    return out


# ---------------------------------------------------------------------------- bag sizes
def _bag_sizes(rng: np.random.Generator, bags: int, pooling: float, distribution: str,
               sigma: float) -> np.ndarray:
    if distribution == "constant":
        return np.full(bags, int(round(pooling)), dtype=np.int64)
    if distribution == "poisson":
        return rng.poisson(pooling, bags).astype(np.int64)
    mu = math.log(pooling) - sigma * sigma / 2.0      # mean of the log-normal = pooling
    return np.rint(rng.lognormal(mu, sigma, bags)).astype(np.int64)


# ------------------------------------------------------------------------------ Zipf
class TraceGenerator(ABC):
    """Something that makes a :class:`Trace` from a numpy Generator (and nothing else)."""

    @abstractmethod
    def generate(self, rng: np.random.Generator) -> Trace:
        """One batch of lookups; the same ``rng`` state gives the same trace."""


@dataclass(frozen=True)
class ZipfTraceGenerator(TraceGenerator):
    """FBGEMM benchmark shape with Zipf row popularity.

    ``num_tables`` tables of ``num_rows`` rows each, ``batch_size`` bags per table, bag sizes
    from ``pooling`` / ``pooling_distribution`` / ``pooling_sigma`` (see
    :data:`POOLING_DISTRIBUTIONS`), rows drawn with ``P(k-th most popular) ~ k ** -alpha``
    (:func:`zipf_ranks`) and scattered by a per-table keyed permutation (:func:`permute_rows`)
    whose keys come from the ``rng`` passed to :meth:`generate`. FBGEMM's TBE benchmark
    defaults: 32 tables, 1e5 rows, batch 512, pooling 20, alpha 1.15 (training).
    """

    num_tables: int = 32
    num_rows: int = 100_000
    batch_size: int = 512
    pooling: float = 20.0
    alpha: float = 1.15
    pooling_distribution: str = "constant"
    pooling_sigma: float = 0.0

    def __post_init__(self) -> None:
        _check_int("num_tables", self.num_tables, 1)
        _check_int("num_rows", self.num_rows, 1)
        _check_int("batch_size", self.batch_size, 1)
        _check_float("alpha", self.alpha, 0.0)
        if self.pooling_distribution not in POOLING_DISTRIBUTIONS:
            raise ValueError(f"pooling_distribution: expected one of {POOLING_DISTRIBUTIONS}, "
                             f"got {self.pooling_distribution!r}")
        _check_float("pooling", self.pooling, 0.0, lo_open=self.pooling_distribution == "lognormal")
        _check_float("pooling_sigma", self.pooling_sigma, 0.0)

    def generate(self, rng: np.random.Generator) -> Trace:
        rng = _check_rng(rng)
        keys = rng.integers(0, 2 ** 63, (self.num_tables, 4), dtype=np.uint64)
        lengths = np.maximum(_bag_sizes(rng, self.num_tables * self.batch_size, self.pooling,
                                        self.pooling_distribution, self.pooling_sigma), 0)
        per_table = lengths.reshape(self.num_tables, self.batch_size).sum(axis=1)
        ranks = zipf_ranks(rng, int(lengths.sum()), self.num_rows, self.alpha)
        bounds = np.concatenate([[0], np.cumsum(per_table)])
        indices = np.concatenate([permute_rows(ranks[bounds[t]:bounds[t + 1]], self.num_rows,
                                               keys[t]) for t in range(self.num_tables)])
        return Trace.from_combined(np.full(self.num_tables, self.num_rows), self.batch_size,
                                   lengths, indices)


# ------------------------------------------------------------------------ locality stats
@dataclass(frozen=True, eq=False)
class LocalityStats:
    """Reuse statistics of one batch of lookups (one block of a locality-statistics file).

    ``lookups``: indices looked up per batch; ``unique``: distinct rows among them;
    ``row_hist[i]``: fraction of the unique rows touched a number of times in reuse bin ``i``
    (bins ``(lo, hi]`` from :data:`REUSE_BIN_LOWER`); ``lookup_share[i]``: fraction of the
    lookups that fall on rows of bin ``i``. File values are rounded to 3 decimals, so each
    histogram sums to 1 only within ~0.01.
    """

    name: str
    lookups: float
    unique: float
    row_hist: np.ndarray
    lookup_share: np.ndarray
    batches: int = 1
    batch_size: int = 0
    source: str = ""

    @property
    def mean_reuse(self) -> float:
        """Lookups per unique row."""
        return self.lookups / self.unique if self.unique else 0.0


_NUMBER = r"([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)"
_HEADER = re.compile(r"Locality stats after processing ([0-9]+) batches of size ([0-9]+)$")
_FIELDS = (("lookups", re.compile(r"Avg # of indices: " + _NUMBER + r"$")),
           ("unique", re.compile(r"Avg # of unique cols: " + _NUMBER + r"$")),
           ("mean_reuse", re.compile(r"Avg col size: " + _NUMBER + r"$")))
_BIN = re.compile(r"\(([0-9]+)(?:, ([0-9]+)\]|\+):\s*" + _NUMBER + r"$")
_HIST_TITLES = ("Histogram of col sizes:", "Ratio of index distribution at different column sizes:")


class _Lines:
    def __init__(self, path: str, text: str):
        self.path = path
        self.lines = text.splitlines()
        self.pos = 0

    def skip_blank(self) -> None:
        while self.pos < len(self.lines) and not self.lines[self.pos].strip():
            self.pos += 1

    def at_end(self) -> bool:
        return self.pos >= len(self.lines)

    def error(self, what: str, lineno: int | None = None) -> ValueError:
        n = self.pos + 1 if lineno is None else lineno
        got = self.lines[n - 1].strip() if n - 1 < len(self.lines) else "end of file"
        return ValueError(f"{self.path}:{n}: expected {what}, got {got!r}")

    def take(self, what: str) -> tuple[int, str]:
        if self.at_end():
            raise self.error(what)
        self.pos += 1
        return self.pos, self.lines[self.pos - 1].strip()

    def match(self, pattern: re.Pattern, what: str) -> re.Match:
        lineno, line = self.take(what)
        found = pattern.match(line)
        if not found:
            raise self.error(what, lineno)
        return found


def _parse_histogram(lines: _Lines, title: str) -> np.ndarray:
    lineno, line = lines.take(repr(title))
    if line != title:
        raise lines.error(repr(title), lineno)
    values = []
    for i, lower in enumerate(REUSE_BIN_LOWER):
        upper = REUSE_BIN_LOWER[i + 1] if i + 1 < len(REUSE_BIN_LOWER) else None
        label = f"({lower}, {upper}]" if upper is not None else f"({lower}+"
        found = lines.match(_BIN, f"the bin line '{label}: <fraction>'")
        if int(found.group(1)) != lower or (found.group(2) is None) != (upper is None) or (
                upper is not None and int(found.group(2)) != upper):
            raise lines.error(f"the bin line '{label}: <fraction>'", lines.pos)
        value = float(found.group(3))
        if not 0.0 <= value <= 1.0:
            raise lines.error("a fraction in [0, 1]", lines.pos)
        values.append(value)
    hist = np.array(values)
    if abs(hist.sum() - 1.0) > 0.012:
        raise lines.error(f"bins that add up to 1 (within rounding), not {hist.sum():.3f}; "
                          f"the last bin", lines.pos)
    lineno, line = lines.take("the list of bin edges")
    try:
        edges = [int(v) for v in line.strip("[]").split(",")]
    except ValueError:
        raise lines.error(f"the list of bin edges {list(REUSE_BIN_LOWER)}", lineno) from None
    if tuple(edges) != REUSE_BIN_LOWER:
        raise lines.error(f"the list of bin edges {list(REUSE_BIN_LOWER)}", lineno)
    lineno, line = lines.take("the list of cumulative fractions")
    try:
        cumulative = [float(v.strip().strip("'\"")) for v in line.strip("[]").split(",")]
    except ValueError:
        raise lines.error("the list of cumulative fractions", lineno) from None
    if len(cumulative) != len(values) + 1:
        raise lines.error(f"{len(values) + 1} cumulative fractions", lineno)
    running = np.concatenate([[0.0], np.cumsum(hist)])
    if np.abs(running - np.array(cumulative)).max() > 0.012:
        raise lines.error("cumulative fractions that agree with the bins (within rounding)",
                          lineno)
    return hist


def parse_locality_stats(text: str, source: str = "<text>") -> list[LocalityStats]:
    """Parse the text of a locality-statistics file (see :func:`load_locality_stats`)."""
    lines = _Lines(source, text)
    blocks: list[LocalityStats] = []
    lines.skip_blank()
    while not lines.at_end():
        start, name = lines.take("a block name")
        if _HEADER.match(name) or name.startswith(("Avg", "(", "[")):
            raise lines.error("a block name (e.g. the trace file name)", start)
        header = lines.match(_HEADER, "'Locality stats after processing N batches of size B'")
        values = {key: float(lines.match(pattern, repr(pattern.pattern.split(':')[0] + ': <n>'))
                             .group(1)) for key, pattern in _FIELDS}
        field_line = lines.pos
        if values["unique"] < 1 or values["lookups"] < values["unique"]:
            raise ValueError(f"{source}:{field_line - 2}: expected 1 <= unique cols <= indices, "
                             f"got {values['unique']:g} unique of {values['lookups']:g}")
        if abs(values["lookups"] / values["unique"] - values["mean_reuse"]) > 0.051:
            raise ValueError(f"{source}:{field_line}: expected 'Avg col size' = indices / unique "
                             f"cols = {values['lookups'] / values['unique']:.2f}, got "
                             f"{values['mean_reuse']:g}")
        row_hist = _parse_histogram(lines, _HIST_TITLES[0])
        lookup_share = _parse_histogram(lines, _HIST_TITLES[1])
        blocks.append(LocalityStats(name=name, lookups=values["lookups"],
                                    unique=values["unique"], row_hist=row_hist,
                                    lookup_share=lookup_share, batches=int(header.group(1)),
                                    batch_size=int(header.group(2)),
                                    source=f"{source}:{start}"))
        lines.skip_blank()
    if not blocks:
        raise ValueError(f"{source}: expected at least one block of locality statistics, "
                         f"found none")
    names = [b.name for b in blocks]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"{source}: block name {dup!r} appears more than once")
    return blocks


def load_locality_stats(path: str | Path, block: str | int | None = None
                        ) -> list[LocalityStats] | LocalityStats:
    """Read a locality-statistics file (the format of Meta's
    ``dlrm_datasets_2021_locality_stats.txt``): every block, validated.

    With ``block`` (a block name such as ``"fbgemm_t856_bs65536_0.pt"``, or an index), return
    that one block. Malformed input raises ``ValueError`` naming the file and line.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read locality statistics ({exc})") from None
    blocks = parse_locality_stats(text, str(path))
    if block is None:
        return blocks
    if isinstance(block, int) and not isinstance(block, bool):
        if not -len(blocks) <= block < len(blocks):
            raise ValueError(f"block: expected an index in [0, {len(blocks)}), got {block}")
        return blocks[block]
    for b in blocks:
        if b.name == block:
            return b
    raise ValueError(f"block: expected one of {[b.name for b in blocks]}, got {block!r}")


def _reuse_bins(counts: np.ndarray) -> np.ndarray:
    upper = np.array(REUSE_BIN_LOWER[1:], dtype=np.int64)
    return np.searchsorted(upper, counts, side="left")


def trace_locality(trace: Trace, name: str = "trace") -> LocalityStats:
    """The statistics of the locality file, measured on ``trace``: a row is a (table, row id)
    pair; its reuse count is how often the batch looks it up."""
    if not isinstance(trace, Trace):
        raise ValueError(f"trace: expected a Trace, got {type(trace).__name__}")
    base = np.concatenate([[0], np.cumsum(trace.num_rows)[:-1]])
    keys = np.concatenate([t.indices + b for t, b in zip(trace.tables, base)])
    if keys.size == 0:
        zeros = np.zeros(len(REUSE_BIN_LOWER))
        return LocalityStats(name, 0.0, 0.0, zeros, zeros.copy(), 1, trace.batch_size)
    keys.sort()
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
    counts = np.diff(np.concatenate([starts, [keys.size]]))
    bins = _reuse_bins(counts)
    n_bins = len(REUSE_BIN_LOWER)
    rows = np.bincount(bins, minlength=n_bins).astype(np.float64)
    hits = np.bincount(bins, weights=counts, minlength=n_bins)
    return LocalityStats(name, float(keys.size), float(counts.size), rows / rows.sum(),
                         hits / hits.sum(), 1, trace.batch_size)


def total_variation(p, q) -> float:
    """Total variation distance ``0.5 * sum |p - q|`` of two histograms, each normalised to
    sum 1 first (the file's rounded fractions do not sum to exactly 1)."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    if p.shape != q.shape or p.ndim != 1:
        raise ValueError(f"p/q: expected two 1-D histograms of one length, got {p.shape} and "
                         f"{q.shape}")
    if p.min() < 0 or q.min() < 0 or p.sum() <= 0 or q.sum() <= 0:
        raise ValueError("p/q: expected non-negative histograms with positive mass")
    return 0.5 * float(np.abs(p / p.sum() - q / q.sum()).sum())


# ------------------------------------------------------------------- the fitted generator
@dataclass(frozen=True, eq=False)
class LocalityPlan:
    """How many rows (``rows[i]``) and lookups (``lookups[i]``) a fitted trace puts in each
    reuse bin, and the distances this gives to the target histograms (before any sampling:
    the generator realises exactly these numbers)."""

    rows: np.ndarray
    lookups: np.ndarray
    row_hist_tv: float
    lookup_share_tv: float


@dataclass(frozen=True, eq=False)
class LocalityTraceGenerator(TraceGenerator):
    """Traces whose reuse histograms follow ``stats`` at a smaller scale (see the module
    docstring, "Scaling a locality fit down").

    ``lookups``: the size of a generated batch (default 2**20); ``num_tables`` and
    ``batch_size`` shape it (unique rows spread uniformly over the tables, lookups over the
    bags); every table has ``rows_per_table`` rows (default: ``row_space_factor`` times the
    largest number of unique rows a table gets, so most of a table is cold).
    """

    stats: LocalityStats
    lookups: int = 1 << 20
    num_tables: int = 32
    batch_size: int = 1024
    rows_per_table: int | None = None
    row_space_factor: float = 4.0
    plan: LocalityPlan = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.stats, LocalityStats):
            raise ValueError(f"stats: expected LocalityStats, got {type(self.stats).__name__}")
        _check_int("lookups", self.lookups, 1)
        _check_int("num_tables", self.num_tables, 1)
        _check_int("batch_size", self.batch_size, 1)
        _check_float("row_space_factor", self.row_space_factor, 1.0)
        if self.rows_per_table is not None:
            _check_int("rows_per_table", self.rows_per_table, 1)
        object.__setattr__(self, "plan", _plan(self.stats, self.lookups))
        if self.rows_per_table is not None:
            need = math.ceil(self.plan.rows.sum() / self.num_tables)
            if self.rows_per_table < 2 * need:
                raise ValueError(f"rows_per_table: expected at least {2 * need} (twice the "
                                 f"unique rows per table), got {self.rows_per_table}")

    def generate(self, rng: np.random.Generator) -> Trace:
        rng = _check_rng(rng)
        counts = _draw_counts(rng, self.plan)
        unique = counts.size
        # Small integer keys: numpy's stable sort is a radix sort for them.
        table = rng.integers(0, self.num_tables, unique).astype(
            np.uint16 if self.num_tables <= 1 << 16 else np.int64)
        per_table_unique = np.bincount(table, minlength=self.num_tables)
        rows = self.rows_per_table or max(
            1, math.ceil(self.row_space_factor * max(1, per_table_unique.max())))
        # A distinct slot per unique row inside its table, then scattered over the table.
        order = np.argsort(table, kind="stable")
        slot = np.empty(unique, dtype=np.int64)
        first = np.concatenate([[0], np.cumsum(per_table_unique)[:-1]])
        slot[order] = np.arange(unique) - np.repeat(first, per_table_unique)
        keys = rng.integers(0, 2 ** 63, (self.num_tables, 4), dtype=np.uint64)
        row_id = _permute_per_table(slot, table, rows, keys)
        # One entry per lookup, in random order, grouped by table.
        which = np.repeat(np.arange(unique), counts)
        which = which[rng.permutation(which.size)]
        lookup_table = table[which]
        grouped = np.argsort(lookup_table, kind="stable")
        indices = row_id[which[grouped]]
        per_table = np.bincount(lookup_table, minlength=self.num_tables)
        lengths = np.concatenate([
            rng.multinomial(n, np.full(self.batch_size, 1.0 / self.batch_size))
            for n in per_table]).astype(np.int64)
        return Trace.from_combined(np.full(self.num_tables, rows), self.batch_size, lengths,
                                   indices)


def _plan(stats: LocalityStats, lookups: int) -> LocalityPlan:
    row_target = stats.row_hist / stats.row_hist.sum()
    share_target = stats.lookup_share / stats.lookup_share.sum()
    unique = lookups / stats.mean_reuse
    lower = np.array(REUSE_BIN_LOWER, dtype=np.int64)
    upper = np.append(lower[1:], np.iinfo(np.int64).max // 4)
    rows = np.zeros(lower.size, dtype=np.int64)
    hits = np.zeros(lower.size, dtype=np.int64)
    for i in range(lower.size):
        want_hits = int(round(share_target[i] * lookups))
        if want_hits <= 0:
            continue
        lo, hi = int(lower[i] + 1), int(upper[i])
        # Row counts that can carry the bin's lookups exactly: n * lo <= hits <= n * hi.
        fewest, most = max(1, -(-want_hits // hi)), want_hits // lo
        if fewest <= most:
            n = int(min(max(round(row_target[i] * unique), fewest), most))
        else:
            # No row count carries them exactly (e.g. fewer lookups than one row of this
            # reuse): the row count whose nearest feasible total is closest.
            n = min((most, fewest), key=lambda k: abs(min(max(want_hits, k * lo), k * hi)
                                                      - want_hits))
        rows[i] = n
        hits[i] = min(max(want_hits, n * lo), n * hi) if n else 0
    if rows.sum() == 0:
        raise ValueError(f"lookups: {lookups} lookups are too few to fit {stats.name!r}")
    return LocalityPlan(rows, hits, total_variation(rows, row_target),
                        total_variation(hits, share_target))


def _draw_counts(rng: np.random.Generator, plan: LocalityPlan) -> np.ndarray:
    """Reuse counts per unique row: within each bin drawn from a decreasing density with the
    bin's planned mean, then corrected so the bin's total is exactly as planned."""
    out = []
    for i, (n, total) in enumerate(zip(plan.rows, plan.lookups)):
        if n == 0:
            continue
        lo = REUSE_BIN_LOWER[i] + 1
        hi = REUSE_BIN_LOWER[i + 1] if i + 1 < len(REUSE_BIN_LOWER) else None
        mean_offset = total / n - lo
        width = (hi - lo + 1) if hi is not None else max(1.0, 2.0 * mean_offset + 1.0)
        # E[floor(width * u**k)] ~ mean_offset when width / (k + 1) = mean_offset + 1/2.
        k = max(0.0, width / (mean_offset + 0.5) - 1.0)
        c = lo + np.floor(width * rng.random(n) ** k).astype(np.int64)
        c = np.clip(c, lo, hi if hi is not None else None)
        c = _fix_sum(rng, c, int(total), lo, hi)
        out.append(c)
    counts = np.concatenate(out)
    return counts[rng.permutation(counts.size)]


def _fix_sum(rng, c: np.ndarray, total: int, lo: int, hi: int | None) -> np.ndarray:
    c = c.copy()
    for _ in range(64):
        residual = total - int(c.sum())
        if residual == 0:
            return c
        room = (hi - c if hi is not None else np.full_like(c, total)) if residual > 0 else c - lo
        can = np.flatnonzero(room > 0)
        if can.size == 0:
            break
        step = np.zeros(c.size, dtype=np.int64)
        share = abs(residual) // can.size
        step[can] = share
        extra = abs(residual) - share * can.size
        if extra:
            step[rng.choice(can, extra, replace=False)] += 1
        step = np.minimum(step, room)
        c += np.sign(residual) * step
    if int(c.sum()) != total:
        raise AssertionError("reuse counts could not be made to add up (planning bug)")
    return c


def fit_generator(stats: LocalityStats, *, lookups: int = 1 << 20, num_tables: int = 32,
                  batch_size: int = 1024, rows_per_table: int | None = None
                  ) -> LocalityTraceGenerator:
    """A generator of traces of ``lookups`` lookups whose reuse histogram and lookup share per
    reuse bin follow ``stats``; ``generator.plan`` says how closely (total variation)."""
    return LocalityTraceGenerator(stats, lookups=lookups, num_tables=num_tables,
                                  batch_size=batch_size, rows_per_table=rows_per_table)


# ----------------------------------------------------------------------------- .npz files
_FIELDS_NPZ = ("version", "batch_size", "num_rows", "lengths", "indices")


def save_trace(trace: Trace, path: str | Path) -> Path:
    """Write ``trace`` as an uncompressed ``.npz`` (combined form plus a format version)."""
    if not isinstance(trace, Trace):
        raise ValueError(f"trace: expected a Trace, got {type(trace).__name__}")
    path = Path(path)
    if path.suffix != ".npz":
        raise ValueError(f"path: expected a file name ending in .npz, got {str(path)!r}")
    num_rows, lengths, indices = trace.combined()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        np.savez(f, version=np.int64(TRACE_FORMAT_VERSION), batch_size=np.int64(trace.batch_size),
                 num_rows=num_rows, lengths=lengths, indices=indices)
    return path


def load_trace(path: str | Path) -> Trace:
    """Read a trace written by :func:`save_trace`, never unpickling anything.

    A file that is not a readable ``.npz`` (truncated, corrupted), a missing or malformed
    field, another format version, lengths that disagree with the indices, or an index outside
    its table raise ``ValueError`` naming the file and the field.
    """
    path = Path(path)
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path}: not a readable .npz trace ({exc})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(f"{path}: not a readable .npz trace (a single .npy array)")
    values: dict[str, np.ndarray] = {}
    with archive:
        for name in _FIELDS_NPZ:
            if name not in archive.files:
                raise ValueError(f"{path}: field {name!r} is missing")
            try:
                values[name] = archive[name]
            except Exception as exc:  # zlib/zip/format errors of a damaged member
                raise ValueError(f"{path}: field {name!r} cannot be read ({exc})") from None
    for name in ("version", "batch_size"):
        v = values[name]
        if v.shape != () or not np.issubdtype(v.dtype, np.integer):
            raise ValueError(f"{path}: field {name!r}: expected an integer scalar, got dtype "
                             f"{v.dtype} shape {v.shape}")
    if int(values["version"]) != TRACE_FORMAT_VERSION:
        raise ValueError(f"{path}: field 'version': expected {TRACE_FORMAT_VERSION}, got "
                         f"{int(values['version'])}")
    try:
        return Trace.from_combined(values["num_rows"], int(values["batch_size"]),
                                   values["lengths"], values["indices"])
    except ValueError as exc:
        raise ValueError(f"{path}: field {exc}") from None
