"""Cycle-approximate timing of the embedding-row cache (``rtl/cache.py``).

The model follows each request through the controller's resources, at request level rather
than per cycle, using the outcomes of the reference model (``sim/reference/cache.py``):

* lookup: one request per cycle; a request is looked up two cycles after it is accepted
  (its set's state word is read from block RAM, then registered), or
  later while the lookup stalls: operation queue full (``queue_depth`` operations between
  lookup and the end of their delivery), or, for a miss, no free MSHR;
* back port: misses leave in lookup order from one sequencer: a clean miss costs one cycle;
  a dirty one first writes the victim back (request, ``row_beats`` data beats, two cycles of
  turnaround) before its read request;
* backing tier: a read's first beat comes ``latency`` cycles after its request, and not
  before the previous read's beats (responses in order, one beat per cycle); a fill is usable
  (and its MSHR free) the cycle after its last beat;
* delivery: operations run in request order, one beat per cycle; an operation on a row
  brought in by a miss whose fill is not yet usable waits for it (a miss, or a merged miss).

* a miss whose victim line still has an operation waiting for delivery stalls the lookup
  until that operation is done.

Assumptions: the front offers a request every cycle (or at the cycles given: the
co-simulation's composed model, ``sim.cosim``, offers each row when the gather model issues
it), takes response beats at once and offers write data promptly; the backing tier accepts
requests at once.

This is the one cache timing model: :meth:`CacheTiming.schedule` (per request),
:meth:`CacheTiming.run` (totals) and :func:`cache_cycles`, its closed form for system-scale runs
that know hit rates but not request traces (``sim.nic``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from neonic.sim.reference.cache import ERROR, MISS, CacheConfig, CacheModel, Request, set_index

__all__ = ["CacheTiming", "TimingResult", "Schedule", "cache_cycles"]


@dataclass(frozen=True)
class TimingResult:
    """Predicted cycles: ``cycles`` from the first request offered to the cycle after the
    last response beat; lookups per cycle over the lookup phase; miss counts."""

    cycles: int
    lookup_cycles: int
    requests: int
    misses: int
    hits: int

    @property
    def lookups_per_cycle(self) -> float:
        return self.requests / self.lookup_cycles if self.lookup_cycles else 0.0

    @property
    def misses_per_cycle(self) -> float:
        return self.misses / self.cycles if self.cycles else 0.0


@dataclass(frozen=True)
class Schedule:
    """Per request, the cycle its delivery starts (``starts``, in request order); ``end`` the
    cycle after the last response beat; the lookup phase's length; miss and hit counts."""

    starts: list[float]
    end: float
    lookup_cycles: float
    misses: int
    hits: int


@dataclass(frozen=True)
class CacheTiming:
    """Timing parameters of one controller instance and its backing tier."""

    row_beats: int
    mshrs: int = 16
    queue_depth: int = 32
    latency: float = 20.0

    def __post_init__(self):
        for name in ("row_beats", "mshrs", "queue_depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
        if not self.latency >= 1:
            raise ValueError(f"latency: expected >= 1 cycle, got {self.latency!r}")

    def schedule(self, requests: Sequence[Request], config: CacheConfig, *, line_beats: int,
                 offers: Sequence[float] | None = None) -> Schedule:
        """Follow ``requests`` through the controller (see the module doc) and return, per
        request, the cycle its delivery starts. ``offers``: the cycle each request is offered
        (a request is looked up no earlier than two cycles after its offer); default: one
        request every cycle from cycle 0, as far as the lookup takes them."""
        if offers is not None and len(offers) != len(requests):
            raise ValueError(f"offers: expected one per request ({len(requests)}), "
                             f"got {len(offers)}")
        model = CacheModel(config)
        rb = self.row_beats
        lat = round(self.latency)
        fill_ready: dict[int, float] = {}   # request index of a miss -> fill usable cycle
        op_ends: deque[float] = deque()     # last-beat cycles of ops still queued
        mshr_free_at: deque[float] = deque()  # fill-usable cycles of misses in flight
        lookup = 1.0                        # cycle of the previous lookup (the first is 2)
        seq_free = 0.0                      # back-port sequencer free from this cycle
        last_beat = -1.0                    # last beat of the previous backing read
        exec_free = 0.0                     # executor free from this cycle
        line_end: dict[tuple[int, int], float] = {}  # (set, way) -> last beat of its last op
        misses = hits = 0
        first_lookup: float | None = None
        end = 0.0
        starts: list[float] = []
        for i, req in enumerate(requests):
            out = model.request(req.addr, req.beats, req.write, line_beats, rb)
            if req.beats == 0:
                starts.append(exec_free)
                continue
            t = lookup + 1 if offers is None else max(float(offers[i]) + 2, lookup + 1)
            line = (-1, -1)
            if out.kind != ERROR:
                line = (int(set_index(req.addr // line_beats, config)), out.way)
            while True:
                while op_ends and op_ends[0] < t:
                    op_ends.popleft()
                while mshr_free_at and mshr_free_at[0] <= t:
                    mshr_free_at.popleft()
                if len(op_ends) >= self.queue_depth:
                    t = op_ends[0] + 1
                    continue
                if out.kind == MISS and len(mshr_free_at) >= self.mshrs:
                    t = mshr_free_at[0]
                    continue
                if out.kind == MISS and line_end.get(line, -1) >= t:
                    t = line_end[line] + 1     # the victim is still in use
                    continue
                break
            lookup = t
            if first_lookup is None:
                first_lookup = t
            start = max(t + 1, exec_free)   # the executor takes it from the queue
            if out.kind == MISS:
                misses += 1
                job = max(t + 1, seq_free)
                issue = job + (rb + 3 if out.writeback else 0)
                seq_free = issue + 1
                first = max(issue + lat, last_beat + 1)
                last_beat = first + rb - 1
                fill_ready[i] = last_beat + 1
                mshr_free_at.append(last_beat + 1)
                start = max(start, last_beat + 1)
            elif out.kind != ERROR:
                hits += 1
                start = max(start, fill_ready.get(out.filled_by, 0))
            exec_free = start + req.beats
            line_end[line] = exec_free - 1
            op_ends.append(exec_free - 1)
            end = exec_free + 1
            starts.append(start)
        return Schedule(starts=starts, end=end,
                        lookup_cycles=lookup - (first_lookup or 0) + 1,
                        misses=misses, hits=hits)

    def run(self, requests: list[Request], config: CacheConfig, *, line_beats: int) -> TimingResult:
        """Predict the cycles the controller takes for ``requests`` (see the module doc), the
        front offering one request every cycle."""
        s = self.schedule(requests, config, line_beats=line_beats)
        return TimingResult(cycles=int(s.end), lookup_cycles=int(s.lookup_cycles),
                            requests=len(requests), misses=s.misses, hits=s.hits)


def cache_cycles(requests: float, miss_rate: float, row_beats: int, *, latency: float,
                 mshrs: int = 16, queue_depth: int = 32) -> float:
    """Cycles the cache controller takes for ``requests`` whole-row reads of ``row_beats``
    beats with misses spread evenly at ``miss_rate``: a closed form of
    :meth:`CacheTiming.run` for system-scale runs that have hit rates but no request traces
    (held within 5% of it for ``mshrs`` 16 and ``queue_depth`` 32, the RTL's defaults, by
    ``tests/sim/test_nic.py``).

    Per request, the larger of two rates:

    * delivery: one beat per cycle in request order (``row_beats``), plus the stalls of
      misses whose fill (``latency + row_beats + 2`` cycles after lookup) outlasts the work
      queued ahead of them (``queue_depth - 1`` operations): a stall opens at a miss at least
      ``queue_depth`` requests after the previous stall's, one per ``queue_depth + 1/miss``
      requests (later misses in its window arrive in its shadow);
    * MSHRs: each miss holds one for ``latency + row_beats + 1`` cycles.

    Plus the first response's latency (4 cycles for a hit, a fill for a miss).
    """
    if requests <= 0:
        return 0.0
    if not 0.0 <= miss_rate <= 1.0:
        raise ValueError(f"miss_rate: expected a value in [0, 1], got {miss_rate!r}")
    if row_beats < 1:
        raise ValueError(f"row_beats: expected >= 1, got {row_beats!r}")
    fill = latency + row_beats + 2          # from lookup (the third cycle after acceptance)
    shortfall = max(0.0, fill - (queue_depth - 1) * row_beats)
    stall = shortfall * miss_rate / (1 + queue_depth * miss_rate)
    per_request = max(row_beats + stall, miss_rate * (latency + row_beats + 1) / mshrs, 1.0)
    return requests * per_request + (fill + 1 if miss_rate > 0 else 4)
