"""Cycle-approximate timing of the embedding-row cache (``rtl/cache.py``).

The model follows each request through the controller's resources, at request level rather
than per cycle, using the outcomes of the reference model (``sim/reference/cache.py``):

* lookup: one request per cycle; a request is looked up one cycle after it is accepted, or
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

Assumptions: the front offers a request every cycle, takes response beats at once and
offers write data promptly; the backing tier accepts requests at once.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from neonic.sim.reference.cache import ERROR, MISS, CacheConfig, CacheModel, Request, set_index

__all__ = ["CacheTiming", "TimingResult"]


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

    def run(self, requests: list[Request], config: CacheConfig, *, line_beats: int) -> TimingResult:
        """Predict the cycles the controller takes for ``requests`` (see the module doc)."""
        model = CacheModel(config)
        rb = self.row_beats
        fill_ready: dict[int, int] = {}     # request index of a miss -> fill usable cycle
        op_ends: deque[int] = deque()       # last-beat cycles of ops still queued
        mshr_free_at: deque[int] = deque()  # fill-usable cycles of misses in flight
        lookup = 0                          # cycle of the previous lookup
        seq_free = 0                        # back-port sequencer free from this cycle
        last_beat = -1                      # last beat of the previous backing read
        exec_free = 0                       # executor free from this cycle
        line_end: dict[tuple[int, int], int] = {}  # (set, way) -> last beat of its last op
        misses = hits = 0
        first_lookup = None
        end = 0
        for i, req in enumerate(requests):
            out = model.request(req.addr, req.beats, req.write, line_beats, rb)
            if req.beats == 0:
                continue
            t = lookup + 1
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
            start = max(t, exec_free)
            if out.kind == MISS:
                misses += 1
                job = max(t + 1, seq_free)
                issue = job + (rb + 3 if out.writeback else 0)
                seq_free = issue + 1
                first = max(issue + round(self.latency), last_beat + 1)
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
        return TimingResult(cycles=end, lookup_cycles=lookup - (first_lookup or 0) + 1,
                            requests=len(requests), misses=misses, hits=hits)
