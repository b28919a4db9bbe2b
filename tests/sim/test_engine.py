"""The discrete-event engine: ordering, cancellation, time conversions, errors."""

from __future__ import annotations

import time

import pytest

from neonic.sim.engine import (
    Engine,
    cycles_to_ps,
    ps_from_ns,
    ps_from_s,
    s_from_ps,
    transfer_ps,
)


def test_events_run_in_time_order_then_insertion_order():
    eng = Engine()
    log: list[tuple[int, str]] = []
    eng.schedule(30, lambda: log.append((eng.now, "c")))
    eng.schedule(10, lambda: log.append((eng.now, "a1")))
    eng.schedule(10, lambda: log.append((eng.now, "a2")))
    eng.schedule(20, lambda: log.append((eng.now, "b")))
    end = eng.run()
    assert log == [(10, "a1"), (10, "a2"), (20, "b"), (30, "c")]
    assert end == 30 and eng.events_processed == 4 and eng.pending == 0


def test_event_scheduled_now_from_a_callback_runs_after_queued_events_at_that_time():
    eng = Engine()
    log: list[str] = []

    def first():
        log.append("first")
        eng.after(0, lambda: log.append("spawned"))

    eng.schedule(5, first)
    eng.schedule(5, lambda: log.append("second"))
    eng.run()
    assert log == ["first", "second", "spawned"]


def test_args_are_passed_and_after_is_relative():
    eng = Engine(start_ps=100)
    seen = []
    eng.after(50, lambda a, b: seen.append((eng.now, a, b)), 1, "x")
    eng.run()
    assert seen == [(150, 1, "x")]


def test_cancel_drops_the_event_and_is_idempotent():
    eng = Engine()
    log = []
    h = eng.schedule(10, log.append, "dropped")
    eng.schedule(20, log.append, "kept")
    assert eng.pending == 2
    assert h.cancel() is True
    assert h.cancel() is False
    assert h.cancelled and not h.done
    assert eng.pending == 1
    assert eng.peek() == 20
    eng.run()
    assert log == ["kept"]
    assert eng.events_processed == 1


def test_cancel_after_run_returns_false():
    eng = Engine()
    h = eng.schedule(1, lambda: None)
    eng.run()
    assert h.done and h.cancel() is False


def test_run_until_stops_and_advances_now_and_resumes():
    eng = Engine()
    log = []
    for t in (10, 20, 30):
        eng.schedule(t, log.append, t)
    assert eng.run(until_ps=20) == 20
    assert log == [10, 20]
    assert eng.run(until_ps=25) == 25 and eng.now == 25
    assert eng.run() == 30 and log == [10, 20, 30]


def test_step_runs_one_event():
    eng = Engine()
    log = []
    eng.schedule(3, log.append, 1)
    eng.schedule(4, log.append, 2)
    assert eng.step() and log == [1] and eng.now == 3
    assert eng.step() and eng.step() is False


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda e: e.schedule(-1, print), "time_ps"),
        (lambda e: e.schedule(1.5, print), "time_ps"),
        (lambda e: e.after(-3, print), "delay_ps"),
        (lambda e: e.after(2.0, print), "delay_ps"),
        (lambda e: e.after(2, "not callable"), "callback"),
        (lambda e: e.schedule(5, "not callable"), "callback"),
        (lambda e: e.run(until_ps=-1), "until_ps"),
    ],
)
def test_bad_arguments_name_the_parameter(call, field):
    eng = Engine()
    with pytest.raises(ValueError, match=field):
        call(eng)


def test_scheduling_in_the_past_is_refused():
    eng = Engine()
    eng.schedule(100, lambda: None)
    eng.run()
    with pytest.raises(ValueError, match="time_ps"):
        eng.schedule(99, print)


def test_run_is_not_reentrant():
    eng = Engine()
    eng.schedule(1, lambda: eng.run())
    with pytest.raises(RuntimeError):
        eng.run()


def test_conversions_and_their_rounding():
    assert ps_from_s(1.0) == 10**12
    assert ps_from_s(1.4e-12) == 1 and ps_from_s(1.5e-12) == 2
    assert ps_from_ns(2.5) == 2500
    assert s_from_ps(10**12) == 1.0
    # 4096 B at 200 Gbps: 32768 bits / 200e9 = 163.84 ns
    assert transfer_ps(4096, 200) == 163_840
    # 1 B at 3 Gbps = 2666.67 ps, rounded up
    assert transfer_ps(1, 3) == 2667
    assert cycles_to_ps(1, 250e6) == 4000
    assert cycles_to_ps(1, 322.265625e6) == 3104  # 3103.03 ps, rounded up
    with pytest.raises(ValueError, match="gbps"):
        transfer_ps(1, 0)
    with pytest.raises(ValueError, match="seconds"):
        ps_from_s(float("nan"))


def test_same_program_gives_the_same_trace():
    def program():
        eng = Engine()
        trace = []

        def tick(i):
            trace.append((eng.now, i))
            if i < 200:
                eng.after((i * 7919) % 13, tick, i + 1)
                eng.after((i * 104729) % 11, lambda: trace.append((eng.now, -i)))

        eng.schedule(0, tick, 0)
        eng.run()
        return trace

    assert program() == program()


def test_throughput_is_at_least_1e5_events_per_second():
    eng = Engine()
    n = 100_000
    count = [0]

    def cb():
        count[0] += 1

    for i in range(n):
        eng.schedule(i % 997, cb)
    t0 = time.perf_counter()
    eng.run()
    elapsed = time.perf_counter() - t0
    assert count[0] == n
    # 1e5 events/s on an idle core; generous here because the suite shares 2 busy cores
    assert elapsed < 5.0, f"{n} events took {elapsed:.2f} s"


def test_run_freezes_older_objects_for_the_collector_and_restores_the_state():
    """During a run the objects made before it are frozen (the collector skips them) and the
    youngest generation is collected less often; after it (also after a callback raised) nothing
    is left frozen, the thresholds are the caller's again, and a caller's own freeze is kept."""
    import gc

    seen = []
    before = gc.get_threshold()
    eng = Engine()
    eng.schedule(5, lambda: seen.append((gc.get_freeze_count(), gc.get_threshold())))
    eng.run()
    assert seen[0][0] > 0 and gc.get_freeze_count() == 0
    # the youngest generation is collected less often during the run; the thresholds come back
    assert seen[0][1][0] >= 20_000 and seen[0][1][1:] == before[1:] and gc.get_threshold() == before

    def boom():
        raise KeyError("x")

    eng.schedule(6, boom)
    with pytest.raises(KeyError):
        eng.run()
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before

    gc.freeze()  # someone else's freeze: the run leaves it as it is
    try:
        frozen = gc.get_freeze_count()
        eng.schedule(7, lambda: None)
        eng.run()
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


def _timer_program(use_timer: bool, seed: int, drive: str = "run") -> tuple[list, int, int]:
    """A random program of plain events and a few callbacks whose time is set again and again
    (earlier, later, the same time, cleared), from outside and from inside callbacks: with
    timers, or with cancel-and-schedule. Returns the log of (time, what ran), the events
    processed and the pending count after a first stop."""
    import random

    rng = random.Random(seed)
    eng = Engine()
    log: list[tuple[int, str]] = []
    n_timers = 3
    handles: list = [None] * n_timers
    timers = [eng.timer(lambda i=i: fire(i)) for i in range(n_timers)]

    def fire(i: int) -> None:
        log.append((eng.now, f"t{i}"))
        if not use_timer:
            handles[i] = None
        if rng.random() < 0.5:
            move(rng.randrange(n_timers))

    def move(i: int) -> None:
        t = eng.now + rng.choice([0, 0, 1, 2, 5, 10, 20])
        if rng.random() < 0.15:
            if use_timer:
                timers[i].clear()
            elif handles[i] is not None:
                handles[i].cancel()
                handles[i] = None
            return
        if use_timer:
            timers[i].set(t)
        else:
            if handles[i] is not None:
                handles[i].cancel()
            handles[i] = eng.schedule(t, fire, i)

    def plain(k: int) -> None:
        log.append((eng.now, f"e{k}"))
        for _ in range(rng.randrange(3)):
            move(rng.randrange(n_timers))
        if rng.random() < 0.6:
            eng.after(rng.choice([0, 1, 3, 7]), plain, k + 1000)

    for k in range(40):
        eng.schedule(rng.randrange(60), plain, k)
    for i in range(n_timers):
        move(i)
    if drive == "step":
        while eng.step():
            pass
        pending = 0
    else:
        eng.run(until_ps=45)
        pending = eng.pending
        assert eng.peek() is None or eng.peek() >= 45
        log.append((eng.now, "stop"))
        eng.run()
    return log, eng.events_processed, pending


@pytest.mark.parametrize("seed", range(6))
def test_a_timer_runs_exactly_when_cancel_and_schedule_would(seed):
    """``timer.set(t)`` is ``cancel()`` of the previous event plus ``schedule(t, ...)``: the same
    events run in the same order at the same times, with the same counts, whether the timers
    move earlier, later or to the same time, are cleared, or the run stops and resumes."""
    for drive in ("run", "step"):
        with_timers = _timer_program(True, seed, drive)
        plain = _timer_program(False, seed, drive)
        assert with_timers == plain
        assert sum(1 for _, what in plain[0] if what.startswith("t")) > 5


def test_a_timer_set_in_the_past_is_refused_and_a_cleared_one_never_runs():
    eng = Engine()
    log = []
    t = eng.timer(lambda: log.append(eng.now))
    eng.schedule(10, lambda: None)
    eng.run()
    with pytest.raises(ValueError, match="time_ps"):
        t.set(5)
    t.set(20)
    t.set(30)
    t.clear()
    assert eng.pending == 0
    eng.run()
    assert log == []
    t.set(40)
    t.set(35)
    eng.run()
    assert log == [35] and eng.pending == 0


def _bundle_program(bundled: bool, seed: int, drive: str) -> tuple[list, int, int, list]:
    """A random program where many events fall on the same picoseconds: a few tens of sources
    that each schedule steps at a handful of delays (with ``after_bundled`` or with ``after``),
    mixed with plain events and timers at the same times, some steps cancelled (also the
    first of a bundle and whole bundles), events scheduled for now from inside callbacks, and
    a stop at ``until_ps`` and resume (``drive="run"``) or one ``step`` at a time. Returns the
    log of (time, what ran), the events processed, the pending count at the stop and what
    ``peek`` said along the way."""
    import random

    rng = random.Random(seed)
    eng = Engine()
    log: list[tuple[int, str]] = []
    peeks: list = []
    handles: list = []
    later = eng.after_bundled if bundled else eng.after
    timers = [eng.timer(lambda i=i: log.append((eng.now, f"t{i}"))) for i in range(3)]

    def step(src: int, j: int) -> None:
        log.append((eng.now, f"s{src}.{j}"))
        r = rng.random()
        if r < 0.25:
            handles.append(later(rng.choice([0, 0, 2, 5]), step, src, j + 10))
        elif r < 0.35:
            eng.after(0, plain, 1000 + src)
        elif r < 0.45:
            timers[src % 3].set(eng.now + rng.choice([0, 2, 5]))
        if handles and rng.random() < 0.3:
            handles[rng.randrange(len(handles))].cancel()

    def plain(k: int) -> None:
        log.append((eng.now, f"e{k}"))
        if rng.random() < 0.5:
            for src in range(rng.randrange(1, 8)):
                handles.append(later(rng.choice([1, 3, 5, 5]), step, src, 0))

    def source(src: int) -> None:
        for j in range(4):
            handles.append(later((j + 1) * 2, step, src, j))

    for src in range(30):
        eng.schedule(rng.randrange(5), source, src)
    for k in range(20):
        eng.schedule(rng.randrange(20), plain, k)
    for h in handles[::7]:
        h.cancel()
    if drive == "step":
        while eng.step():
            if rng.random() < 0.1:
                peeks.append(eng.peek())
        pending = 0
    else:
        eng.run(until_ps=9)
        pending = eng.pending
        peeks.append(eng.peek())
        log.append((eng.now, "stop"))
        eng.run()
    return log, eng.events_processed, pending, peeks


@pytest.mark.parametrize("seed", range(8))
def test_bundled_events_run_exactly_where_their_own_entries_would(seed):
    """``after_bundled`` is ``after``: the same events run in the same order at the same times
    with the same counts, against plain events, timers, cancellations (also of every member
    of a bundle), events scheduled from inside a bundle's members, a stop and resume, and
    ``step``; here dozens of events share a picosecond."""
    for drive in ("run", "step"):
        bundled = _bundle_program(True, seed, drive)
        plain = _bundle_program(False, seed, drive)
        assert bundled == plain
        times = [t for t, what in plain[0] if what.startswith("s")]
        assert len(times) > 100 and max(times.count(t) for t in set(times)) > 10


def test_a_bundled_event_that_raises_leaves_the_rest_of_its_bundle_queued():
    """A member of a bundle raising stops the run like any callback; the members after it
    still run, in order, when the run resumes."""
    eng = Engine()
    log = []

    def member(k: int) -> None:
        log.append(k)
        if k == 1:
            raise KeyError(k)

    handles = [eng.after_bundled(5, member, k) for k in range(4)]
    handles[2].cancel()
    with pytest.raises(KeyError):
        eng.run()
    assert log == [0, 1] and eng.pending == 1 and eng.peek() == 5
    eng.run()
    assert log == [0, 1, 3] and eng.events_processed == 3
    assert handles[3].done and handles[2].cancelled and not handles[2].done
    with pytest.raises(ValueError, match="delay_ps"):
        eng.after_bundled(-1, member, 0)
