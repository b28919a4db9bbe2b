"""The shared discrete-event engine of neonic's system simulation.

Every system-level model (the network, GPUs, NICs, the pipeline schedule) advances one shared
:class:`Engine`, so that their events interleave in a single, reproducible order.

Time
    An integer number of picoseconds (``int``), never a float, so that runs are exact and
    deterministic. Use :func:`ps_from_s`, :func:`ps_from_ns`, :func:`transfer_ps` and
    :func:`cycles_to_ps` to convert, each with a stated rounding rule.

Ordering
    Events run in order of (time, insertion sequence): two events at the same picosecond run in
    the order they were scheduled. An event scheduled *during* a callback for the current time
    runs after every event already queued for that time.

API (stable; other models code against it)
    ``eng = Engine()``; ``eng.now`` (ps); ``eng.schedule(time_ps, fn, *args) -> EventHandle``;
    ``eng.after(delay_ps, fn, *args) -> EventHandle``; ``handle.cancel()``;
    ``timer = eng.timer(fn, *args)``; ``timer.set(time_ps)``; ``timer.clear()`` (a callback whose
    time is set again and again, e.g. a GPU's next kernel event: see :class:`Timer`);
    ``eng.after_bundled(delay_ps, fn, *args) -> EventHandle`` (exactly ``after``, cheaper for
    the many events that fall on the same picosecond: see :meth:`Engine.after_bundled`);
    ``eng.run(until_ps=None) -> int`` (the time at which it stopped);
    ``eng.step() -> bool``; ``eng.peek() -> int | None``; ``eng.pending``;
    ``eng.events_processed``.

Callbacks receive exactly the ``*args`` given to ``schedule``; they read ``engine.now`` for the
time. A callback raising an exception stops :meth:`Engine.run` and propagates unchanged; the
engine stays consistent (the event that raised counts as processed).
"""

from __future__ import annotations

import gc
import heapq
import math
from typing import Any, Callable

__all__ = [
    "PS_PER_S",
    "PS_PER_NS",
    "Engine",
    "EventHandle",
    "Timer",
    "ps_from_s",
    "ps_from_ns",
    "s_from_ps",
    "transfer_ps",
    "cycles_to_ps",
]

PS_PER_S = 10**12
PS_PER_NS = 10**3
#: The collector's youngest-generation threshold while :meth:`Engine.run` runs (see there).
_GC_YOUNG = 20_000


def ps_from_s(seconds: float) -> int:
    """Seconds to integer picoseconds, rounded to the nearest picosecond (half away from 0)."""
    if not math.isfinite(seconds):
        raise ValueError(f"seconds: expected a finite number, got {seconds!r}")
    scaled = seconds * PS_PER_S
    return int(math.floor(scaled + 0.5)) if scaled >= 0 else -int(math.floor(-scaled + 0.5))


def ps_from_ns(nanoseconds: float) -> int:
    """Nanoseconds to integer picoseconds, rounded to the nearest picosecond."""
    return ps_from_s(nanoseconds * 1e-9)


def s_from_ps(ps: int) -> float:
    """Picoseconds to seconds (a float, for reporting)."""
    return ps / PS_PER_S


def transfer_ps(nbytes: int | float, gbps: float) -> int:
    """Serialization time of ``nbytes`` at ``gbps`` (10^9 bit/s), rounded UP to a picosecond.

    Rounding up means a transfer never finishes before its last bit could have arrived.
    """
    if gbps <= 0 or not math.isfinite(gbps):
        raise ValueError(f"gbps: expected a finite number > 0, got {gbps!r}")
    if nbytes < 0:
        raise ValueError(f"nbytes: expected >= 0, got {nbytes!r}")
    # bits / (gbps * 1e9) seconds = bits * 1000 / gbps picoseconds
    return int(math.ceil(nbytes * 8 * 1000 / gbps - 1e-9))


def cycles_to_ps(cycles: int, freq_hz: float) -> int:
    """Duration of ``cycles`` clock cycles at ``freq_hz``, rounded UP to a picosecond."""
    if freq_hz <= 0 or not math.isfinite(freq_hz):
        raise ValueError(f"freq_hz: expected a finite number > 0, got {freq_hz!r}")
    if cycles < 0:
        raise ValueError(f"cycles: expected >= 0, got {cycles!r}")
    return int(math.ceil(cycles * PS_PER_S / freq_hz - 1e-9))


class EventHandle:
    """A scheduled event; :meth:`cancel` it before it runs to drop it (idempotent)."""

    __slots__ = ("time", "_entry", "_engine")

    def __init__(self, time: int, entry: list, engine: "Engine") -> None:
        self.time = time
        self._entry = entry
        self._engine = engine

    @property
    def cancelled(self) -> bool:
        return self._entry[2] is None and not self._entry[4]

    @property
    def done(self) -> bool:
        """True once the event has run."""
        return bool(self._entry[4])

    def cancel(self) -> bool:
        """Drop the event. Returns True if it was pending, False if it already ran/was dropped."""
        entry = self._entry
        if entry[2] is None:
            return False
        entry[2] = None
        entry[3] = ()
        self._engine._live -= 1
        return True


class Timer:
    """One callback whose time is set again and again (a GPU's next kernel event changes with
    every change on the GPU). ``set(t)`` means exactly ``cancel()`` of the previous event and
    ``schedule(t, ...)``: the callback runs once, at ``t``, in the order of a fresh insertion
    sequence taken at this ``set``. ``clear()`` drops it. Cheaper than cancel-and-schedule: a
    heap entry is pushed only when the time moves earlier; while it moves later, the entry
    already queued stands for it (its key, time then sequence, is never after the timer's), and
    when that entry reaches the top of the queue early the engine queues it again under the
    timer's own time and sequence, so every other event runs before or after it just as with
    cancel-and-schedule."""

    __slots__ = ("engine", "callback", "args", "time", "seq", "_entry")

    def __init__(self, engine: "Engine", callback: Callable[..., Any], args: tuple) -> None:
        self.engine = engine
        self.callback = callback
        self.args = args
        self.time: int | None = None  # when the callback runs (None: not set)
        self.seq = -1  # its insertion sequence
        self._entry: list | None = None  # the live heap entry that stands for it

    def set(self, time_ps: int) -> None:
        """Run the callback at ``time_ps`` (an int >= ``now``), in place of any earlier setting."""
        eng = self.engine
        if type(time_ps) is not int:
            if not isinstance(time_ps, int):
                raise ValueError(f"time_ps: expected an integer number of picoseconds, got {time_ps!r}")
            time_ps = int(time_ps)
        if time_ps < eng.now:
            raise ValueError(f"time_ps: expected >= now ({eng.now}), got {time_ps}")
        self._set(time_ps)

    def _set(self, time_ps: int) -> None:
        """:meth:`set` for a caller that knows ``time_ps`` is an int >= ``now`` (a GPU's own
        re-plans: the checks are about a third of its cost)."""
        eng = self.engine
        seq = eng._seq
        eng._seq = seq + 1
        self.time = time_ps
        self.seq = seq
        entry = self._entry
        if entry is not None and entry[2] is not None:
            if entry[0] <= time_ps:
                return  # queued no later than the timer: it is queued again when it comes up
            entry[2] = None  # queued after the new time: drop it
            entry[3] = ()
            eng._live -= 1
        entry = [time_ps, seq, _TIMER, (self,), False]
        eng._live += 1
        eng._join(entry)  # (many GPUs set their timers for the same picosecond: a bundle's member)
        self._entry = entry

    def clear(self) -> None:
        """Drop the callback's pending run (if any)."""
        self.time = None
        entry = self._entry
        if entry is not None and entry[2] is not None:
            entry[2] = None
            entry[3] = ()
            self.engine._live -= 1
        self._entry = None


def _run_timer(timer: Timer) -> None:
    """A timer's entry ran at the timer's own time and sequence (the engine's loops queue an
    early one again instead): the timer is no longer set; its callback runs."""
    timer._entry = None
    timer.time = None
    timer.callback(*timer.args)


_TIMER = _run_timer


def _requeue(heap: list, entry: list) -> bool:
    """``entry`` (at the top of ``heap``) is a timer's entry that came up before the timer's
    own time and sequence: queue it again under them (True). False for any other entry."""
    if entry[2] is not _TIMER:
        return False
    timer = entry[3][0]
    if entry[1] == timer.seq:
        return False
    heapq.heappop(heap)
    entry[0] = timer.time  # (popped: its key may change)
    entry[1] = timer.seq
    heapq.heappush(heap, entry)
    return True


class _Bundle:
    """Events of one picosecond scheduled by :meth:`Engine.after_bundled`, queued as one heap
    entry. Each member keeps the insertion sequence it was given (members: entries of the
    plain form, in sequence order); the bundle's entry is keyed by its next member's time and
    sequence, so the heap orders it exactly as that member's own entry (keys are unique)."""

    __slots__ = ("members", "pos")

    def __init__(self, first: list) -> None:
        self.members = [first]
        self.pos = 0  # the next member to run


def _run_bundle(bundle: _Bundle) -> None:  # pragma: no cover  (a marker: the loops run bundles)
    raise AssertionError("a bundle's entry runs through Engine._bundle")


_BUNDLE = _run_bundle


def _restand(heap: list, member: list) -> None:
    """A timer's entry, a member of a bundle, came up before the timer's own time and sequence
    (the timer was set later since): it leaves the bundle and is queued under them."""
    timer = member[3][0]
    member[0] = timer.time
    member[1] = timer.seq
    heapq.heappush(heap, member)


class Engine:
    """A discrete-event engine with integer-picosecond time and deterministic tie-breaking."""

    __slots__ = ("now", "events_processed", "_heap", "_seq", "_live", "_running", "_open")

    def __init__(self, start_ps: int = 0) -> None:
        if not isinstance(start_ps, int) or start_ps < 0:
            raise ValueError(f"start_ps: expected an integer >= 0, got {start_ps!r}")
        self.now: int = start_ps
        self.events_processed: int = 0
        # heap entries: [time, seq, callback | None, args, ran]
        self._heap: list[list] = []
        self._seq = 0
        self._live = 0
        self._running = False
        self._open: dict[int, list] = {}  # time -> the entry of the bundle events at that time join

    # ----------------------------------------------------------------------------- scheduling
    def schedule(self, time_ps: int, callback: Callable[..., Any], *args: Any) -> EventHandle:
        """Run ``callback(*args)`` at absolute time ``time_ps`` (an int >= ``now``)."""
        if type(time_ps) is not int:
            if isinstance(time_ps, int):  # bool, numpy ints: normalise
                time_ps = int(time_ps)
            else:
                raise ValueError(f"time_ps: expected an integer number of picoseconds, got {time_ps!r}")
        if time_ps < self.now:
            raise ValueError(f"time_ps: expected >= now ({self.now}), got {time_ps}")
        if not callable(callback):
            raise ValueError(f"callback: expected a callable, got {callback!r}")
        entry = [time_ps, self._seq, callback, args, False]
        self._seq += 1
        self._live += 1
        heapq.heappush(self._heap, entry)
        return EventHandle(time_ps, entry, self)

    def after(self, delay_ps: int, callback: Callable[..., Any], *args: Any) -> EventHandle:
        """Run ``callback(*args)`` ``delay_ps`` picoseconds from now (an int >= 0)."""
        if type(delay_ps) is not int:  # bool, numpy ints: normalise (a hot path: one check)
            if not isinstance(delay_ps, int):
                raise ValueError(f"delay_ps: expected an integer >= 0, got {delay_ps!r}")
            delay_ps = int(delay_ps)
        if delay_ps < 0:
            raise ValueError(f"delay_ps: expected an integer >= 0, got {delay_ps!r}")
        if not callable(callback):
            raise ValueError(f"callback: expected a callable, got {callback!r}")
        # schedule()'s work, inline (the engine's most frequent call)
        time_ps = self.now + delay_ps
        entry = [time_ps, self._seq, callback, args, False]
        self._seq += 1
        self._live += 1
        heapq.heappush(self._heap, entry)
        return EventHandle(time_ps, entry, self)

    def after_bundled(self, delay_ps: int, callback: Callable[..., Any], *args: Any) -> EventHandle:
        """Exactly :meth:`after` (the same insertion sequence, the same order against every other
        event, the same handle), for events many of which fall on the same picosecond (a GPU's
        SM hand-over steps, made alike by many GPUs at once): the event joins the bundle of its
        picosecond not yet run, one heap entry for all of them. A bundle runs its members in
        sequence order and gives way (queued again under its next member's key) whenever
        another entry's key comes first, so every event runs exactly where its own entry would
        have; what it saves is a heap push and pop per member."""
        if type(delay_ps) is not int:
            if not isinstance(delay_ps, int):
                raise ValueError(f"delay_ps: expected an integer >= 0, got {delay_ps!r}")
            delay_ps = int(delay_ps)
        if delay_ps < 0:
            raise ValueError(f"delay_ps: expected an integer >= 0, got {delay_ps!r}")
        if not callable(callback):
            raise ValueError(f"callback: expected a callable, got {callback!r}")
        return self._bundled(self.now + delay_ps, callback, args)

    def _bundled(self, time_ps: int, callback: Callable[..., Any], args: tuple) -> EventHandle:
        """:meth:`after_bundled` at ``time_ps`` for a caller that knows it is an int >= ``now``
        and ``callback`` callable (a GPU's copies of another GPU's hand-over steps)."""
        member = [time_ps, self._seq, callback, args, False]
        self._seq += 1
        self._live += 1
        self._join(member)
        return EventHandle(time_ps, member, self)

    def _join(self, member: list) -> None:
        """Queue ``member`` (an entry with the newest sequence) in the bundle of its picosecond
        not yet run, opening one if there is none."""
        time_ps = member[0]
        entry = self._open.get(time_ps)
        if entry is None:
            entry = [time_ps, member[1], _BUNDLE, (_Bundle(member),), False]
            self._open[time_ps] = entry
            heapq.heappush(self._heap, entry)
        else:
            entry[3][0].members.append(member)

    def _bundle(self, entry: list, one: bool) -> None:
        """Run the bundle ``entry`` (at the top of the heap): its members in order while no other
        entry's key comes before the next one's (``one``: a single member, as :meth:`step`);
        then queue it again under its next live member's key, or drop it."""
        heap = self._heap
        heapq.heappop(heap)
        time_ps = entry[0]
        if self._open.get(time_ps) is entry:
            del self._open[time_ps]  # (later events of this picosecond open a new bundle)
        bundle = entry[3][0]
        members = bundle.members
        i = bundle.pos
        n = len(members)
        ran = False
        while i < n:
            m = members[i]
            callback = m[2]
            if callback is None:  # cancelled
                i += 1
                continue
            if (one and ran) or (heap and (heap[0][0] < time_ps or (heap[0][0] == time_ps and heap[0][1] < m[1]))):
                break  # something else comes first: queue the rest again under this member's key
            i += 1
            if callback is _TIMER and m[1] != m[3][0].seq:
                _restand(heap, m)
                continue
            ran = True
            self.now = time_ps
            args = m[3]
            m[2] = None
            m[3] = ()
            m[4] = True
            self._live -= 1
            self.events_processed += 1
            try:
                callback(*args)
            except BaseException:
                self._requeue_bundle(entry, bundle, i)
                raise
        self._requeue_bundle(entry, bundle, i)

    def _ready(self, entry: list) -> bool:
        """Whether the bundle ``entry`` (at the top of the heap) runs a member at its time next
        (True), or else (False) moved on past its cancelled members and its timers' entries
        set later since (each queued under its timer's key) and was queued again or dropped."""
        bundle = entry[3][0]
        members = bundle.members
        i = bundle.pos
        n = len(members)
        m = members[i]
        if m[2] is not None and (m[2] is not _TIMER or m[1] == m[3][0].seq):
            return True
        heap = self._heap
        heapq.heappop(heap)
        while i < n:
            m = members[i]
            if m[2] is None:
                i += 1
            elif m[2] is _TIMER and m[1] != m[3][0].seq:
                i += 1
                _restand(heap, m)
            else:
                break
        self._requeue_bundle(entry, bundle, i)
        if entry[2] is None and self._open.get(entry[0]) is entry:
            del self._open[entry[0]]
        return False

    def _requeue_bundle(self, entry: list, bundle: _Bundle, i: int) -> None:
        """Queue ``bundle`` again from member ``i`` on (its first live one's key), or drop it."""
        members = bundle.members
        n = len(members)
        while i < n and members[i][2] is None:
            i += 1
        bundle.pos = i
        if i < n:
            entry[1] = members[i][1]
            heapq.heappush(self._heap, entry)
        else:
            entry[2] = None
            entry[3] = ()

    def timer(self, callback: Callable[..., Any], *args: Any) -> Timer:
        """A :class:`Timer` for ``callback(*args)``, not set."""
        if not callable(callback):
            raise ValueError(f"callback: expected a callable, got {callback!r}")
        return Timer(self, callback, args)

    # ------------------------------------------------------------------------------ running
    @property
    def pending(self) -> int:
        """Number of scheduled, not cancelled, events."""
        return self._live

    def peek(self) -> int | None:
        """Time of the next live event, or None when nothing is pending."""
        heap = self._heap
        while heap:
            entry = heap[0]
            callback = entry[2]
            if callback is None:
                heapq.heappop(heap)
            elif callback is _BUNDLE:
                if self._ready(entry):
                    break
            elif not _requeue(heap, entry):
                break
        return heap[0][0] if heap else None

    def step(self) -> bool:
        """Run the next live event. Returns False when nothing was pending."""
        heap = self._heap
        while heap:
            entry = heap[0]
            callback = entry[2]
            if callback is None:
                heapq.heappop(heap)
                continue
            if callback is _TIMER and _requeue(heap, entry):
                continue
            if callback is _BUNDLE:
                before = self.events_processed
                self._bundle(entry, True)
                if self.events_processed == before:
                    continue  # every member left was cancelled
                return True
            heapq.heappop(heap)
            self.now = entry[0]
            args = entry[3]
            entry[2] = None
            entry[3] = ()
            entry[4] = True
            self._live -= 1
            self.events_processed += 1
            callback(*args)
            return True
        return False

    def run(self, until_ps: int | None = None) -> int:
        """Run events in order until none is left or the next is later than ``until_ps``.

        With ``until_ps`` given, ``now`` ends at ``until_ps`` (events *at* ``until_ps`` run).
        Returns the final ``now``. Not reentrant: a callback must not call ``run``.
        """
        if until_ps is not None:
            if not isinstance(until_ps, int) or until_ps < self.now:
                raise ValueError(f"until_ps: expected an integer >= now ({self.now}), got {until_ps!r}")
            until_ps = int(until_ps)
        if self._running:
            raise RuntimeError("Engine.run: not reentrant (called from inside a callback)")
        self._running = True
        heap = self._heap
        pop = heapq.heappop
        # The objects that exist before the run (a cluster run's op graph, GPUs and network
        # state: millions at 1024 GPUs) sit out the cyclic collector's passes while it runs
        # (gc.freeze); objects made during the run are collected as usual, their youngest
        # generation once _GC_YOUNG more of them live than at its last pass (not every 700:
        # events, hand-overs and re-plans come and go by the hundred thousand, and passes over
        # the ones in flight were half a CPU-second of a 1024-GPU run). Only when nothing else
        # has frozen objects, so that unfreezing afterwards restores the state as it was.
        freeze = gc.isenabled() and gc.get_freeze_count() == 0
        if freeze:
            gc.freeze()
            thresholds = gc.get_threshold()
            if thresholds[0] < _GC_YOUNG:
                gc.set_threshold(_GC_YOUNG, *thresholds[1:])
        try:
            while heap:
                entry = heap[0]
                callback = entry[2]
                if callback is None:
                    pop(heap)
                    continue
                if until_ps is not None and entry[0] > until_ps:
                    break
                if callback is _TIMER and _requeue(heap, entry):
                    continue
                if callback is _BUNDLE:
                    self._bundle(entry, False)
                    continue
                pop(heap)
                self.now = entry[0]
                args = entry[3]
                entry[2] = None
                entry[3] = ()
                entry[4] = True
                self._live -= 1
                self.events_processed += 1
                callback(*args)
        finally:
            self._running = False
            if freeze:
                gc.set_threshold(*thresholds)
                gc.unfreeze()
        if until_ps is not None and until_ps > self.now:
            self.now = until_ps
        return self.now
