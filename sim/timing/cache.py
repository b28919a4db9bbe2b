"""Cycle-approximate timing of the embedding-row cache (``rtl/cache.py``).

The model follows each request through the controller's resources, at request level rather
than per cycle, using the outcomes of the reference model (``sim/reference/cache.py``):

* lookup: one request per cycle; a request reaches the last lookup stage
  ``2 + compare_stages`` cycles after it is accepted (its set's state word is read from block
  RAM, registered, compared in one or two stages; the last stage updates the word and
  queues the operation), and no earlier than ``same_set_gap`` cycles after the last
  request of its set (it waits in stage 1 while one of its set is in a compare stage or
  has not left the last: with one compare stage, a request right behind one of its set
  waits one cycle, with two, two cycles, and one cycle behind the one before; without the
  controller's ``lookahead`` two cycles more, the update written and read again, and a miss
  one cycle more in the last stage), or later while the lookup
  stalls: operation queue full (``queue_depth`` operations between lookup and their move to
  the executor's register), or, for a miss, no free MSHR, or its victim line still has an
  operation to issue;
* executor: operations move to its register in request order the cycle the one before
  leaves (or in their last lookup stage, nothing being queued ahead), and issue to the line memory from the next
  cycle, an operation on a row brought in by a miss once that fill is complete;
* line memory (``lines`` port): the executor's transfers come first, then fills, then
  write-back reads (the RTL's arbiter); on chip (``line_serial``, ``rtl.cache.LineRAM``) one
  transfer at a time, one beat per cycle, a read's first beat ``line_latency`` cycles after
  it is accepted; a DRAM/HBM controller is pipelined (see :class:`_LinePort`);
* back port: misses leave in lookup order from one sequencer: a clean miss costs one cycle;
  a dirty one first sends the write request and reads the victim from the line memory
  (its beats go to the back tier), then the read request;
* backing tier: a read's first beat comes ``latency`` cycles after its request, not before
  the previous read's beats nor before the data of a write-back ahead of it; the fill is
  written to the line memory from the cycle after its first beat, and is usable the cycle after its last beat; its
  MSHR counts as free for the lookup a cycle later still.

Assumptions: the front offers a request every cycle (or at the cycles given: the
co-simulation's composed model, ``sim.cosim``, offers each row when the gather model issues
it), takes response beats at once and offers write data promptly; the backing tier accepts
requests at once.

This is the one cache timing model: :meth:`CacheTiming.schedule` (per request),
:meth:`CacheTiming.run` (totals) and :func:`cache_cycles`, its closed form for system-scale runs
that know hit rates but not request traces (``sim.nic``).
"""

from __future__ import annotations

from bisect import insort
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from neonic.rtl.cache import LineRAM
from neonic.sim.reference.cache import ERROR, MISS, CacheConfig, CacheModel, Request, set_index

__all__ = ["CacheTiming", "TimingResult", "Schedule", "cache_cycles", "same_set_gap", "miss_bubbles",
           "LOOKUP_STAGES", "NIC_COMPARE_STAGES", "NIC_LOOKAHEAD", "NIC_LINE_SLICE"]

#: Cycles from the edge accepting a request to its last lookup stage (tag read, word
#: registered, compare; the update and the queueing happen in the stage itself), with one
#: compare stage (``rtl.cache.CacheController.lookup_stages``; two compare stages add one).
LOOKUP_STAGES = 3


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


class _LinePort:
    """The ``lines`` port as the model sees it: when each transfer is accepted and when a
    read's first beat comes back.

    ``serial`` (the on-chip :class:`rtl.cache.LineRAM`): one transfer at a time, in the order
    accepted; a transfer accepted at ``a`` moves its beats in cycles ``a+1 .. a+beats`` and the
    next one is accepted at ``a+beats`` at the earliest; a read's first beat is visible at
    ``a + latency``. Otherwise (a pipelined DRAM/HBM controller): one request per cycle, a
    read's first beat ``latency`` cycles after it and after the previous read's beats and
    the data of every write accepted before it. The pipelined port is held to the RTL on read
    traffic (``tests/sim/test_cache_timing.py``); with front writes it overestimates (up to
    1.5x on the traffic tried): the write data's order against the fills is not modelled. Transfers are placed at the
    earliest cycle the port is free from their ready time (the fills' and write-backs' times
    are known before the later requests' operations, which fit around them)."""

    def __init__(self, latency: int, serial: bool, delay: int = 0):
        # `delay`: cycles between the controller handing a request on and the port seeing it
        # (the controller's ``line_slice``: one); every transfer's beats move that much later
        self.latency, self.serial, self.delay = latency, serial, delay
        self.busy: list[tuple[float, float]] = []   # serial: processing intervals, sorted
        self.read_free = 0.0                        # pipelined: next read beat slot
        self.writes: list[tuple[float, float]] = []  # pipelined: (accept, last data beat)

    def accept(self, ready: float, beats: int, background: bool = False) -> float:
        """The cycle a transfer ready at ``ready`` is accepted. The executor's transfers
        (taken in request order) fit in the gaps the port leaves; a ``background`` one (a fill
        or a write-back, known before the later requests' transfers) waits only for the
        transfer it finds under way, as the RTL's arbiter serves whoever is ready first."""
        span = beats if self.serial else 1      # a pipelined port: one request per cycle
        a = ready
        for lo, hi in self.busy:
            if a + span < lo:
                break
            if a + 1 <= hi and (not background or lo <= a + 1):
                a = hi
        insort(self.busy, (a + 1, a + span))
        return a

    def read(self, ready: float, beats: int, background: bool = False) -> tuple[float, float]:
        """(accept cycle, first beat cycle) of a read ready at ``ready``."""
        a = self.accept(ready, beats, background)
        if self.serial:
            return a, a + self.latency + self.delay
        before = max((end for acc, end in self.writes if acc < a), default=-1.0)
        first = max(a + self.latency + self.delay, self.read_free, before + 1)
        self.read_free = first + beats
        return a, first

    def write(self, ready: float, beats: int, data_from: float | None = None,
              background: bool = False) -> float:
        """Cycle of the last data beat of a write ready at ``ready`` whose data can flow
        from ``data_from`` (default: the cycle after acceptance)."""
        a = self.accept(ready, beats, background)
        # (the on-chip line RAM takes a write's data once it serves the request; a pipelined
        # controller buffers write data as they come)
        start = max(a + 1 + (self.delay if self.serial else 0),
                    data_from if data_from is not None else 0)
        end = start + beats - 1
        if not self.serial:
            insort(self.writes, (a, end))
        return end

    def prune(self, before: float) -> None:
        while self.busy and self.busy[0][1] < before:
            self.busy.pop(0)
        while len(self.writes) > 1 and self.writes[1][0] < before - 1:
            self.writes.pop(0)


#: Compare stages of a SmartNIC's local cache (``sim.units.cache.nic_cache_params``, the
#: organisation for a tag store of thousands of sets, ``rtl.cache``): the system model's cache
#: (``sim.nic.cache_lookup_time_s``) and the RTL built for it use this one figure.
NIC_COMPARE_STAGES = 2

#: Lookahead of a SmartNIC's local cache (``rtl.cache.CacheController``'s ``lookahead``): off
#: in the organisation for 32 ways, where forwarding a set's 864-bit word and checking the
#: victim against every queued operation a cycle ahead did not route on an ECP5; the system
#: model and the RTL built for it use this one figure.
NIC_LOOKAHEAD = False

#: Whether a SmartNIC's local cache passes its line requests through a register slice
#: (``rtl.cache.CacheController``'s ``line_slice``): on, so that the line port's ready does not
#: reach the controller's bookkeeping; the system model and the RTL built for it use this.
NIC_LINE_SLICE = True


@dataclass(frozen=True)
class CacheTiming:
    """Timing parameters of one controller instance, its line memory and its backing tier.

    ``latency``: the backing tier's read latency; ``line_latency`` and ``line_serial``: the
    line memory's (default: the on-chip :class:`rtl.cache.LineRAM`, 3 cycles, one transfer
    at a time; a DRAM/HBM controller behind the ``lines`` port is pipelined);
    ``compare_stages``: the controller's (one, or two at NIC sizes)."""

    row_beats: int
    mshrs: int = 16
    queue_depth: int = 32
    latency: float = 20.0
    line_latency: float = LineRAM.LATENCY
    line_serial: bool = True
    #: the controller's ``compare_stages`` (1 or 2)
    compare_stages: int = 1
    #: the controller's ``lookahead``: without it a request of the set ahead waits for that
    #: one's update to be written and read again, and a miss waits a cycle in stage 3
    lookahead: bool = True
    #: the controller's ``line_slice``: its line requests pass a register slice (one cycle)
    line_slice: bool = False

    def __post_init__(self):
        if self.compare_stages not in (1, 2):
            raise ValueError(f"compare_stages: expected 1 or 2, got {self.compare_stages!r}")
        for name in ("lookahead", "line_slice"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected True or False, "
                                 f"got {getattr(self, name)!r}")
        for name in ("row_beats", "mshrs", "queue_depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
        if not self.latency >= 1:
            raise ValueError(f"latency: expected >= 1 cycle, got {self.latency!r}")
        if not self.line_latency >= 1:
            raise ValueError(f"line_latency: expected >= 1 cycle, got {self.line_latency!r}")

    @property
    def hit_latency(self) -> int:
        """Cycles from the edge accepting a hit (nothing ahead of it) to its first beat."""
        return self.lookup_stages + 1 + round(self.line_latency) + int(self.line_slice)

    @property
    def lookup_stages(self) -> int:
        """Cycles from the edge accepting a request to its last lookup stage."""
        return LOOKUP_STAGES - 1 + self.compare_stages

    @property
    def same_set_gap(self) -> int:
        """Cycles between the last lookup stages of two requests of one set
        (``rtl.cache.CacheController.same_set_gap``)."""
        return same_set_gap(self.compare_stages, self.lookahead)

    def schedule(self, requests: Sequence[Request], config: CacheConfig, *, line_beats: int,
                 offers: Sequence[float] | None = None) -> Schedule:
        """Follow ``requests`` through the controller (see the module doc) and return, per
        request, the cycle before its first data beat. ``offers``: the cycle each request is
        offered (it reaches the last lookup stage no earlier than :attr:`lookup_stages`
        cycles later);
        default: one request every cycle from cycle 0, as far as the lookup takes them."""
        if offers is not None and len(offers) != len(requests):
            raise ValueError(f"offers: expected one per request ({len(requests)}), "
                             f"got {len(offers)}")
        model = CacheModel(config)
        rb = self.row_beats
        lat = round(self.latency)
        port = _LinePort(round(self.line_latency), self.line_serial, int(self.line_slice))
        fill_ready: dict[int, float] = {}   # request index of a miss -> fill usable cycle
        queued: deque[float] = deque()      # cycles the queued ops move to the executor
        mshr_free_at: deque[float] = deque()  # fill-usable cycles of misses in flight
        lookup = 0.0                        # last lookup stage of the previous request
        last_of_set: dict[int, float] = {}  # set -> last lookup stage of its latest request
        gap = self.same_set_gap             # cycles between two lookups of one set
        seq_free = 0.0                      # back-port sequencer free from this cycle
        back_last = -1.0                    # last beat of the previous backing read
        x_free = 0.0                        # the executor's register can issue from here
        front_free = 0.0                    # next front response beat slot
        line_issue: dict[tuple[int, int], float] = {}  # (set, way) -> its last op's issue
        misses = hits = 0
        first_lookup: float | None = None
        end = 0.0
        starts: list[float] = []
        for i, req in enumerate(requests):
            out = model.request(req.addr, req.beats, req.write, line_beats, rb)
            s = int(set_index(req.addr // line_beats, config))
            t = max(lookup + 1, last_of_set.get(s, -gap) + gap,
                    (0.0 if offers is None else float(offers[i])) + self.lookup_stages)
            line = (s, out.way) if out.kind != ERROR else (-1, -1)
            if out.kind == MISS:
                t += miss_bubbles(self.lookahead)   # its victim's pending ops compared
            while True:
                while queued and queued[0] < t:
                    queued.popleft()
                while mshr_free_at and mshr_free_at[0] <= t:
                    mshr_free_at.popleft()
                if req.beats and len(queued) >= self.queue_depth:
                    t = queued[0] + 1
                    continue
                if out.kind == MISS and len(mshr_free_at) >= self.mshrs:
                    t = mshr_free_at[0]
                    continue
                if out.kind == MISS and line_issue.get(line, -2) >= t - 1:
                    t = line_issue[line] + 2     # the victim had an op to issue last cycle
                    continue
                break
            lookup = t
            last_of_set[s] = t
            port.prune(t)
            if first_lookup is None:
                first_lookup = t
            if req.beats == 0:
                starts.append(max(t, front_free - 1))
                continue
            dep = 0.0
            if out.kind == MISS:
                misses += 1
                job = max(t + 1, seq_free)
                if out.writeback:
                    wb, wb_first = port.read(job + 2, rb, background=True)
                    front_free = max(front_free, wb_first + rb)
                    issue = wb + 1
                    seq_free = issue + 1
                    wb_done = wb_first + rb - 1
                else:
                    issue, wb_done = job, -1.0
                    seq_free = issue + 1
                first = max(issue + lat, back_last + 1, wb_done + 1)
                done = port.write(first, rb, data_from=first + 1, background=True)
                back_last = done
                fill_ready[i] = done + 1
                mshr_free_at.append(done + 2)   # the lookup sees it free a cycle later
                dep = done + 1
            elif out.kind != ERROR:
                hits += 1
                dep = fill_ready.get(out.filled_by, 0.0)
            load = max(t, x_free)   # the executor's register takes it (from stage 3 itself
            #                         when nothing is queued ahead of it)
            queued.append(load)
            ready = max(load + 1, dep)
            if out.kind == ERROR:
                go, first_beat = ready, max(ready + 1, front_free)
            elif req.write:
                go = ready
                port.write(go, req.beats)
                first_beat = go + 1
            else:
                go, first_beat = port.read(ready, req.beats)
                first_beat = max(first_beat, front_free)
            x_free = go
            line_issue[line] = go
            if not req.write:
                front_free = first_beat + req.beats
                end = max(end, front_free)
            else:
                end = max(end, first_beat + req.beats)
            starts.append(first_beat - 1)
        return Schedule(starts=starts, end=end,
                        lookup_cycles=lookup - (first_lookup or 0) + 1,
                        misses=misses, hits=hits)

    def run(self, requests: list[Request], config: CacheConfig, *, line_beats: int) -> TimingResult:
        """Predict the cycles the controller takes for ``requests`` (see the module doc), the
        front offering one request every cycle."""
        s = self.schedule(requests, config, line_beats=line_beats)
        return TimingResult(cycles=int(s.end), lookup_cycles=int(s.lookup_cycles),
                            requests=len(requests), misses=s.misses, hits=s.hits)


def same_set_gap(compare_stages: int, lookahead: bool) -> int:
    """Cycles between the last lookup stages of a request and one of its set right behind it:
    the update forwarded (``compare_stages + 1``), or written and read again
    (``compare_stages + 3``); the controller's rule (``rtl.cache``)."""
    return compare_stages + (1 if lookahead else 3)


def miss_bubbles(lookahead: bool) -> int:
    """Cycles a miss waits in the last lookup stage beyond a hit: none with lookahead, one
    without (its victim's pending operations compared there); the controller's rule."""
    return 0 if lookahead else 1


def cache_cycles(requests: float, miss_rate: float, row_beats: int, *, latency: float,
                 mshrs: int = 16, queue_depth: int = 32, same_set: float = 0.0,
                 compare_stages: int = 1, lookahead: bool = True,
                 line_slice: bool = False) -> float:
    """Cycles the cache controller (lines on chip) takes for ``requests`` whole-row reads of
    ``row_beats`` beats with misses spread evenly at ``miss_rate``: a closed form of
    :meth:`CacheTiming.run` for system-scale runs that have hit rates but no request traces
    (held within 5% of it for ``mshrs`` 16 and ``queue_depth`` 32, the RTL's defaults, by
    ``tests/sim/test_nic.py``).

    Per request, the larger of the MSHRs' rate and the slower of the lookup's and the line
    memory's plus the stalls of misses:

    * lookup: one per cycle, plus ``same_set_gap - 1`` bubbles for a request of the same set
      as the one before it (``same_set``: the fraction of such requests; a repeated row is
      one), and without ``lookahead`` one per miss;
    * line memory: one transfer at a time, one beat per cycle: the read (``row_beats``) and,
      for a miss, the fill (``row_beats``, and a cycle for its write request);
    * stalls: misses whose fill
      (``latency + row_beats + 2`` cycles after lookup) outlasts the work queued ahead of them
      (``queue_depth - 1`` operations at the slower rate): a stall opens at a miss at least ``queue_depth``
      requests after the previous stall's, one per ``queue_depth + 1/miss`` requests (later
      misses in its window arrive in its shadow);
    * MSHRs: each miss holds one for ``latency + row_beats + 2`` cycles.

    Plus the first response's latency (:attr:`CacheTiming.hit_latency` for a hit, a fill
    for a miss).
    """
    if requests <= 0:
        return 0.0
    if not 0.0 <= miss_rate <= 1.0:
        raise ValueError(f"miss_rate: expected a value in [0, 1], got {miss_rate!r}")
    if not 0.0 <= same_set <= 1.0:
        raise ValueError(f"same_set: expected a value in [0, 1], got {same_set!r}")
    if row_beats < 1:
        raise ValueError(f"row_beats: expected >= 1, got {row_beats!r}")
    hit_latency = CacheTiming(row_beats=row_beats, compare_stages=compare_stages,
                              line_slice=line_slice).hit_latency
    fill = latency + row_beats + 2          # from lookup (the last lookup stage)
    work = row_beats + miss_rate * (row_beats + 1)
    lookup = (1.0 + same_set * (same_set_gap(compare_stages, lookahead) - 1)
              + miss_rate * miss_bubbles(lookahead))
    rate = max(work, lookup)
    shortfall = max(0.0, fill - (queue_depth - 1) * rate)
    stall = shortfall * miss_rate / (1 + queue_depth * miss_rate)
    per_request = max(rate + stall, miss_rate * fill / mshrs)
    return requests * per_request + (fill + hit_latency if miss_rate > 0 else hit_latency)
