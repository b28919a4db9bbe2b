"""Golden models of the embedding-row cache: request by request, and trace-level (numpy).

Both models implement the policy described here, from its semantics; the RTL
(``rtl/cache.py``) must agree with them.

Policy
======

A cache of ``sets`` x ``ways`` lines, one embedding row per line.

* Set of row ``r``: ``index="modulo"``: ``r % sets``; ``index="hash"`` (``sets`` a power of
  two, ``s = log2(sets)``): the XOR of the ``s``-bit chunks of ``r`` (low chunk first).
* A request for a resident row is a *hit*; otherwise a *miss*, which places the row in the
  lowest-numbered invalid way of its set, or, if the set is full, evicts the victim of the
  policy. An evicted line that was written since it was filled is *written back*.
* ``"lru"``: the victim is the least recently used line of the set (uses = hits and fills).
* ``"lfu"``: each line has a use count of ``lfu_bits`` bits, 1 on fill; a hit adds 1, but if
  the hit line's count is at its maximum ``2**lfu_bits - 1``, all counts of the set are first
  halved (rounding down). The victim has the smallest count; the lowest way on a tie.
* A write marks its line dirty (write-allocate on a miss). ``flush`` writes back every dirty
  line (by set, then way) and keeps it resident and clean; ``invalidate`` empties the cache
  and resets the replacement state (dirty data are dropped).

What "the same outcome" means for a non-blocking cache
=======================================================

The hardware looks requests up one at a time in the order it accepts them (the order of the
request stream) while earlier misses are still being fetched. Its state changes at lookup,
not when data arrive: a miss allocates its way, sets its tag (and dirty bit for a write) and
updates the replacement state at once. So the outcome of request *i* depends only on
requests *0..i-1*, never on latencies or backpressure, and this model, which applies the
requests in order, predicts it exactly:

* a request the model calls a **miss** is a miss in the hardware (one back-port fetch), with
  the same victim (and write-back) at the same request;
* a request the model calls a **hit** is, in the hardware, either a hit or a **merged miss**:
  a hit on a row whose fetch (started by an earlier miss, ``filled_by``) has not completed
  yet. Which of the two depends on timing; both return the right data and neither fetches.
* a malformed request (crossing its row, larger than a row, zero beats) is an **error** and
  changes nothing.

Hit rates therefore agree exactly when merged misses count as hits ("no back-port fetch"),
which is how the benchmark compares them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "CacheConfig", "Outcome", "CacheModel", "TraceResult", "set_index", "simulate_trace",
    "check_request",
]

HIT, MISS, ERROR = "hit", "miss", "error"


def _check(name: str, value, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name}: expected an integer, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        hi = "" if maximum is None else f" and <= {maximum}"
        raise ValueError(f"{name}: expected an integer >= {minimum}{hi}, got {value}")
    return int(value)


@dataclass(frozen=True)
class CacheConfig:
    """The policy parameters shared by the models (see the module docstring)."""

    sets: int
    ways: int
    policy: str = "lru"
    index: str = "modulo"
    lfu_bits: int = 8

    def __post_init__(self):
        _check("sets", self.sets, 1)
        _check("ways", self.ways, 1)
        _check("lfu_bits", self.lfu_bits, 1, 62)
        if self.policy not in ("lru", "lfu"):
            raise ValueError(f"policy: expected 'lru' or 'lfu', got {self.policy!r}")
        if self.index not in ("modulo", "hash"):
            raise ValueError(f"index: expected 'modulo' or 'hash', got {self.index!r}")
        if self.index == "hash" and self.sets & (self.sets - 1):
            raise ValueError(f"sets: the hash index needs a power of two, got {self.sets}")

    @property
    def lines(self) -> int:
        return self.sets * self.ways


def set_index(rows, config: CacheConfig):
    """Set of each row (scalar or numpy array of non-negative integers)."""
    if config.index == "modulo":
        return rows % config.sets
    bits = config.sets.bit_length() - 1
    if bits == 0:
        return rows * 0
    mask = config.sets - 1
    if isinstance(rows, np.ndarray):
        rest = rows.astype(np.uint64)
        out = np.zeros_like(rest)
        while np.any(rest):
            out ^= rest & np.uint64(mask)
            rest = rest >> np.uint64(bits)
        return out.astype(np.int64)
    rest, out = int(rows), 0
    while rest:
        out ^= rest & mask
        rest >>= bits
    return out


def check_request(addr: int, beats: int, line_beats: int, row_beats: int) -> int | None:
    """Row addressed by a front request, or None when the request is malformed (an error):
    it must have ``beats >= 1`` and lie within the first ``row_beats`` beats of one row."""
    off = addr % line_beats
    if beats < 1 or off + beats > row_beats:
        return None
    return addr // line_beats


@dataclass(frozen=True)
class Outcome:
    """What one request did: ``kind`` (hit/miss/error), the way used, the row evicted (or
    None), whether the evicted row was written back, and for a hit the number of the request
    whose miss brought the row in (``filled_by``)."""

    kind: str
    way: int = -1
    evicted: int | None = None
    writeback: bool = False
    filled_by: int = -1


@dataclass
class _Line:
    row: int
    dirty: bool
    repl: int
    filled_by: int


@dataclass
class CacheModel:
    """The cache, request by request (the golden model of the RTL's outcomes).

    ``access(row, write)`` applies one well-formed request; ``request(addr, beats, write,
    line_beats, row_beats)`` applies a front-port request, errors included. Counters mirror
    the RTL's ``stats`` (merged misses are hits here).
    """

    config: CacheConfig
    counters: dict = field(default_factory=lambda: dict.fromkeys(
        ("hits", "misses", "evictions", "writebacks", "errors"), 0))

    def __post_init__(self):
        self.invalidate()
        self._n = 0          # requests seen (for filled_by)
        self._clock = 0      # LRU use order

    def invalidate(self) -> None:
        """Drop every line and reset the replacement state."""
        self._sets: list[list[_Line | None]] = [[None] * self.config.ways
                                                for _ in range(self.config.sets)]

    def flush(self) -> list[int]:
        """Write back every dirty line; returns the rows written back, by set then way."""
        rows = []
        for lines in self._sets:
            for line in lines:
                if line is not None and line.dirty:
                    line.dirty = False
                    rows.append(line.row)
        self.counters["writebacks"] += len(rows)
        return rows

    def resident(self) -> set[int]:
        return {line.row for lines in self._sets for line in lines if line is not None}

    def _victim(self, lines: list[_Line | None]) -> int:
        for w, line in enumerate(lines):
            if line is None:
                return w
        # LRU: smallest last-use stamp; LFU: smallest count, first on a tie.
        return min(range(len(lines)), key=lambda w: (lines[w].repl, w))

    def access(self, row: int, write: bool = False) -> Outcome:
        """Look up one row (a well-formed request)."""
        n, self._n = self._n, self._n + 1
        cfg = self.config
        lines = self._sets[int(set_index(int(row), cfg))]
        self._clock += 1
        for w, line in enumerate(lines):
            if line is not None and line.row == row:
                if cfg.policy == "lru":
                    line.repl = self._clock
                else:
                    if line.repl == (1 << cfg.lfu_bits) - 1:
                        for other in lines:
                            if other is not None:
                                other.repl >>= 1
                    line.repl += 1
                line.dirty |= bool(write)
                self.counters["hits"] += 1
                return Outcome(HIT, w, filled_by=line.filled_by)
        w = self._victim(lines)
        old = lines[w]
        repl = self._clock if cfg.policy == "lru" else 1
        lines[w] = _Line(int(row), bool(write), repl, n)
        self.counters["misses"] += 1
        if old is None:
            return Outcome(MISS, w)
        self.counters["evictions"] += 1
        self.counters["writebacks"] += int(old.dirty)
        return Outcome(MISS, w, evicted=old.row, writeback=old.dirty)

    def request(self, addr: int, beats: int, write: bool, line_beats: int,
                row_beats: int) -> Outcome:
        """Apply one front-port request (malformed ones are errors and change nothing)."""
        row = check_request(addr, beats, line_beats, row_beats)
        if row is None:
            self._n += 1
            self.counters["errors"] += 1
            return Outcome(ERROR)
        return self.access(row, write)


@dataclass
class TraceResult:
    """Per-lookup hits of a trace, with totals."""

    hits: np.ndarray          # bool per lookup, in trace order
    evictions: int
    writebacks: int

    @property
    def hit_rate(self) -> float:
        return float(self.hits.mean()) if len(self.hits) else 0.0


def simulate_trace(rows, config: CacheConfig, writes=None) -> TraceResult:
    """Hit/miss of every lookup of a trace, fast: identical outcomes to :class:`CacheModel`.

    Sets are independent, so the lookups are grouped by set and the sets are stepped in
    lock-step with numpy: step ``k`` performs the ``k``-th lookup of every set at once. Cost:
    (lookups / sets) numpy steps over arrays of ``sets x ways``; about a second per million
    lookups for a few hundred sets. Under LRU, a read that repeats its set's previous lookup
    is a hit that changes no state and is not stepped (hot rows repeat a lot).
    """
    rows = np.asarray(rows, dtype=np.int64)
    if rows.ndim != 1:
        raise ValueError(f"rows: expected a 1-D array of row indices, got shape {rows.shape}")
    if len(rows) and rows.min() < 0:
        raise ValueError("rows: expected non-negative row indices")
    writes = np.zeros(len(rows), bool) if writes is None else np.asarray(writes, bool)
    if writes.shape != rows.shape:
        raise ValueError(f"writes: expected shape {rows.shape}, got {writes.shape}")
    n = len(rows)
    if n == 0:
        return TraceResult(np.zeros(0, bool), 0, 0)
    sets = set_index(rows, config).astype(np.int64)
    order = np.argsort(sets, kind="stable")
    lru = config.policy == "lru"
    srows, swrites, ssets = rows[order], writes[order], sets[order]
    # LRU: a read of the row its set looked up last is a hit that changes nothing (the row
    # already is the set's most recent), so only the other lookups are stepped.
    stepped = None
    if lru:
        keep = np.ones(n, bool)
        keep[1:] = (ssets[1:] != ssets[:-1]) | (srows[1:] != srows[:-1]) | swrites[1:]
        if not keep.all():
            stepped = np.nonzero(keep)[0]
            srows, swrites, ssets = srows[stepped], swrites[stepped], ssets[stepped]
    counts = np.bincount(ssets, minlength=config.sets)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    # Slots: sets by decreasing lookup count, so the sets active at step k are a prefix.
    slots = np.argsort(-counts, kind="stable")
    slot_counts = counts[slots]
    slot_starts = starts[slots]
    nslots = int(np.count_nonzero(slot_counts))
    ways = config.ways
    tags = np.full(nslots * ways, -1, np.int64)       # flat [slot, way]; -1: invalid
    # Replacement state; invalid ways hold -(ways - w), below every valid value, so that
    # argmin picks the lowest invalid way first (halving keeps them negative and ordered).
    repl = np.tile(-(ways - np.arange(ways, dtype=np.int64)), nslots)
    dirty = np.zeros(nslots * ways, bool)
    any_writes = bool(writes.any())
    hit_sorted = np.zeros(len(srows), bool)
    lfu_max = (1 << config.lfu_bits) - 1
    evictions = writebacks = 0
    # Sets with more than k lookups (slot_counts is non-increasing).
    active_by_step = np.searchsorted(-slot_counts[:nslots], -np.arange(slot_counts[0]),
                                     side="left")
    base = np.arange(nslots, dtype=np.int64) * ways
    for k in range(int(slot_counts[0])):
        a = int(active_by_step[k])
        pos = slot_starts[:a] + k
        r = srows[pos]
        t2 = tags[:a * ways].reshape(a, ways)
        rp2 = repl[:a * ways].reshape(a, ways)
        match = t2 == r[:, None]
        hit = match.any(axis=1)
        sel = np.where(hit, match.argmax(axis=1), rp2.argmin(axis=1))
        flat = base[:a] + sel
        old = repl[flat]
        evict = ~hit & (old >= 0)
        evictions += int(np.count_nonzero(evict))
        tags[flat] = r
        if any_writes:
            wr = swrites[pos]
            writebacks += int(np.count_nonzero(evict & dirty[flat]))
            dirty[flat] = (dirty[flat] & hit) | wr
        if lru:
            repl[flat] = k
        else:
            sat = hit & (old == lfu_max)
            if sat.any():
                rp2[sat] >>= 1
                old = repl[flat]
            repl[flat] = np.where(hit, old + 1, 1)
        hit_sorted[pos] = hit
    if stepped is not None:
        all_sorted = np.ones(n, bool)
        all_sorted[stepped] = hit_sorted
        hit_sorted = all_sorted
    hits = np.empty(n, bool)
    hits[order] = hit_sorted
    return TraceResult(hits, evictions, writebacks)


# ---- front-port workloads and their expected results (shared by every bench) ----------------

@dataclass(frozen=True)
class Request:
    """One front-port request; ``wdata`` is ``[(data, mask), ...]`` per beat for a write."""

    addr: int
    beats: int
    write: bool = False
    wdata: tuple[tuple[int, int], ...] = ()


@dataclass
class Expected:
    """What the cache must do with a request list: per-request outcome kinds (reference
    model), the read beats in order, and the backing memory after a final flush."""

    kinds: list[str]
    read_beats: list[int]
    memory: np.ndarray
    counters: dict            # counted during this call (the flush included)
    model: CacheModel         # the cache state after the flush, to continue from


def random_requests(rng: np.random.Generator, count: int, *, rows: int, line_beats: int,
                    row_beats: int, data_bytes: int, write_fraction: float = 0.25,
                    error_fraction: float = 0.0, zipf: float | None = None,
                    partial_fraction: float = 0.3) -> list[Request]:
    """Random requests over ``rows`` rows: mostly whole rows, some partial, some writes (random
    data and byte masks), optionally some malformed ones; rows drawn uniformly or Zipf."""
    if zipf is None:
        picks = rng.integers(0, rows, count)
    else:
        weights = 1.0 / np.arange(1, rows + 1) ** zipf
        perm = rng.permutation(rows)
        picks = perm[rng.choice(rows, count, p=weights / weights.sum())]
    reqs = []
    full = (1 << data_bytes) - 1
    for row in picks:
        row = int(row)
        if rng.random() < error_fraction:
            off = int(rng.integers(0, line_beats))
            beats = int(rng.integers(max(1, row_beats - off + 1), row_beats + 3))
        elif rng.random() < partial_fraction:
            off = int(rng.integers(0, row_beats))
            beats = int(rng.integers(1, row_beats - off + 1))
        else:
            off, beats = 0, row_beats
        write = bool(rng.random() < write_fraction)
        wdata = ()
        if write:
            wdata = tuple((int.from_bytes(rng.bytes(data_bytes), "little"),
                           full if rng.random() < 0.5 else int(rng.integers(0, full + 1)))
                          for _ in range(beats))
        reqs.append(Request(row * line_beats + off, beats, write, wdata))
    return reqs


def expected_results(requests: list[Request], memory: np.ndarray, config: CacheConfig, *,
                     line_beats: int, row_beats: int, data_bytes: int,
                     model: CacheModel | None = None) -> Expected:
    """Apply ``requests`` in order to a shadow copy of ``memory`` (bytes) and the reference
    model (a fresh one, or ``model`` to continue from an earlier call), then flush: every
    read returns the last value written (zeros for a malformed read)."""
    shadow = memory.copy()
    model = CacheModel(config) if model is None else model
    before = dict(model.counters)
    kinds, beats_out = [], []
    for req in requests:
        out = model.request(req.addr, req.beats, req.write, line_beats, row_beats)
        kinds.append(out.kind)
        if out.kind == ERROR:
            if not req.write:
                beats_out.extend([0] * req.beats)
            continue
        for b in range(req.beats):
            lo = (req.addr + b) * data_bytes
            if req.write:
                data, mask = req.wdata[b]
                new = np.frombuffer(data.to_bytes(data_bytes, "little"), np.uint8)
                en = ((mask >> np.arange(data_bytes)) & 1).astype(bool)
                shadow[lo:lo + data_bytes][en] = new[en]
            else:
                beats_out.append(int.from_bytes(shadow[lo:lo + data_bytes].tobytes(), "little"))
    model.flush()
    counters = {k: v - before[k] for k, v in model.counters.items()}
    return Expected(kinds, beats_out, shadow, counters, model)
