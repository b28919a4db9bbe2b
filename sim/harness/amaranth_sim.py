"""Running components in Amaranth's simulator, with stream stimulus and checks.

A unit test describes *what* goes in and what must come out; this module supplies the rest:
the clock, a cycle deadline so that a stuck design fails instead of hanging, an optional
waveform, and stream helpers that insert random idle cycles and backpressure so that every
handshake path of the design gets exercised.

Timing model of the helpers (Amaranth 0.5 testbench semantics): a helper sets its outputs
right after a clock edge (testbench writes settle at once), then waits for the next edge and
looks at the values *sampled at that edge* (``ctx.tick().sample(...)``), which are the values
the flip-flops of the design saw. A transfer is therefore counted on exactly the cycles the
design counts it, whatever the design does combinationally with ``valid`` and ``ready``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from neonic.sim.schema import probability

import numpy as np
from amaranth.sim import Simulator

__all__ = [
    "SimulationTimeout",
    "run_amaranth",
    "stream_send",
    "stream_recv",
]

Testbench = Callable[[Any], Any]


class SimulationTimeout(AssertionError):
    """The testbenches did not finish within the cycle deadline given to :func:`run_amaranth`."""


def _check_probability(name: str, value: float) -> float:
    """A probability of idle/backpressure/latency cycles: >= 0 and < 1 (1 would never end)."""
    return probability(name, value, hi_open=True)


def _need_rng(name: str, rng: np.random.Generator | None, probability: float) -> None:
    if probability > 0.0 and rng is None:
        raise ValueError(f"rng: a numpy Generator is required when {name} > 0 "
                         f"(seeds are passed explicitly), got None")


def run_amaranth(dut, testbenches: Sequence[Testbench] = (), processes: Sequence[Testbench] = (),
                 *, clock_period_s: float = 1e-8, vcd: str | Path | None = None,
                 gtkw: str | Path | None = None, traces: Sequence = (),
                 background: Sequence[Testbench] = (), max_cycles: int) -> int:
    """Simulate ``dut`` in the ``sync`` domain until every testbench has returned.

    Parameters
    ----------
    dut : the elaboratable (usually a ``wiring.Component``) to simulate.
    testbenches : ``async def tb(ctx)`` functions; the run ends when all of them have returned.
        They run in the order given at each point in time (Amaranth testbench semantics).
    processes : ``async def proc(ctx)`` functions added with ``add_process``: models that stand
        in for hardware (e.g. :attr:`AmaranthMemory.process`); they run forever and never keep
        the simulation alive.
    background : testbenches added with ``background=True`` (monitors that loop forever).
    clock_period_s : period of the ``sync`` clock in seconds.
    vcd, gtkw : write a waveform (and optionally a GTKWave save file) to these paths. The
        files are written even when the run fails, which is when they are most useful.
    traces : extra signals to include in the waveform (passed to ``Simulator.write_vcd``).
    max_cycles : the deadline in clock cycles (required: nothing may hang).

    A testbench abandoned by a timeout is closed by Python later; one that was inside
    ``ctx.tick().repeat()``/``.until()`` or an ``async for`` over a trigger then prints an
    "Exception ignored ... aclose()" message. It is harmless; loops of one-shot
    ``await ctx.tick()`` (as the helpers here use) avoid it.

    Returns
    -------
    The number of rising clock edges that had occurred when the last testbench returned.

    Raises
    ------
    SimulationTimeout
        If the testbenches are still running after ``max_cycles`` cycles.
    ValueError
        On a bad ``max_cycles``, ``clock_period_s`` or an empty ``testbenches``.
    """
    sim = Simulator(dut)  # first: elaborates `dut`, so a refused run warns of no unused design
    if isinstance(max_cycles, bool) or not isinstance(max_cycles, int) or max_cycles < 1:
        raise ValueError(f"max_cycles: expected an integer >= 1, got {max_cycles!r}")
    if not isinstance(clock_period_s, (int, float)) or not clock_period_s > 0:
        raise ValueError(f"clock_period_s: expected a positive number of seconds, "
                         f"got {clock_period_s!r}")
    testbenches = list(testbenches)
    if not testbenches:
        raise ValueError("testbenches: expected at least one testbench (the run ends when all "
                         "of them return), got none")

    sim.add_clock(clock_period_s)

    state = {"cycles": 0, "running": len(testbenches), "finished_at": 0}

    async def cycle_counter(ctx):
        # A process (always background): counts edges and enforces the deadline. Processes
        # run before testbenches wake up at the same edge, so a testbench returning right
        # after its n-th tick sees the count n.
        async for _ in ctx.tick():
            state["cycles"] += 1
            if state["cycles"] > max_cycles and state["running"]:
                raise SimulationTimeout(
                    f"simulation did not finish within max_cycles={max_cycles} cycles "
                    f"({state['running']} of {len(testbenches)} testbench(es) still running)")

    def finishing(tb: Testbench) -> Testbench:
        async def wrapper(ctx):
            await tb(ctx)
            state["running"] -= 1
            state["finished_at"] = max(state["finished_at"], state["cycles"])
        wrapper.__name__ = getattr(tb, "__name__", "testbench")
        return wrapper

    sim.add_process(cycle_counter)
    for proc in processes:
        sim.add_process(proc)
    for tb in background:
        sim.add_testbench(tb, background=True)
    for tb in testbenches:
        sim.add_testbench(finishing(tb))

    if vcd is not None:
        Path(vcd).parent.mkdir(parents=True, exist_ok=True)
        if gtkw is not None:
            Path(gtkw).parent.mkdir(parents=True, exist_ok=True)
        waves = sim.write_vcd(str(vcd), None if gtkw is None else str(gtkw), traces=traces)
    else:
        waves = contextlib.nullcontext()
    with waves:
        sim.run()
    return state["finished_at"]


async def stream_send(ctx, stream_intf, payloads: Iterable, *,
                      rng: np.random.Generator | None = None, idle: float = 0.0) -> int:
    """Drive ``payloads`` into a ``lib.stream`` interface (from the design's sink side).

    Each payload is anything ``ctx.set(stream.payload, v)`` accepts (an int, a dict for a
    struct layout, a ``data.Const``). Before each transfer, with probability ``idle`` per
    cycle, ``valid`` stays low for a cycle. ``valid`` is held high with a stable payload until
    the design takes it. Returns the number of payloads sent, after the last was accepted;
    ``valid`` is low again on return.
    """
    idle = _check_probability("idle", idle)
    _need_rng("idle", rng, idle)
    sent = 0
    for payload in payloads:
        while idle and rng.random() < idle:
            await ctx.tick()
        ctx.set(stream_intf.payload, payload)
        ctx.set(stream_intf.valid, 1)
        while True:
            # One-shot waits: an abandoned multi-shot iterator (a run that timed out)
            # complains when garbage-collected.
            _, _, ready = await ctx.tick().sample(stream_intf.ready)
            if ready:
                break
        ctx.set(stream_intf.valid, 0)
        sent += 1
    return sent


async def stream_recv(ctx, stream_intf, count: int | None = None, *,
                      until: Callable[[Any], bool] | None = None,
                      rng: np.random.Generator | None = None,
                      backpressure: float = 0.0) -> list:
    """Receive payloads from a ``lib.stream`` interface (from the design's source side).

    Each cycle ``ready`` is held low with probability ``backpressure``. Stops after ``count``
    payloads, or after the first payload for which ``until(payload)`` is true (that payload is
    included), whichever comes first; at least one of the two must be given. Payloads are
    returned as ``ctx.get(stream.payload)`` would return them (``int`` or ``data.Const``);
    ``ready`` is low again on return.
    """
    backpressure = _check_probability("backpressure", backpressure)
    _need_rng("backpressure", rng, backpressure)
    if count is None and until is None:
        raise ValueError("count/until: expected a payload count or an `until` predicate, "
                         "got neither")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int)
                              or count < 0):
        raise ValueError(f"count: expected an integer >= 0, got {count!r}")
    received: list = []
    if count == 0:
        return received
    while True:
        ready = not (backpressure and rng.random() < backpressure)
        ctx.set(stream_intf.ready, int(ready))
        _, _, valid, payload = await ctx.tick().sample(stream_intf.valid, stream_intf.payload)
        if ready and valid:
            received.append(payload)
            if (count is not None and len(received) >= count) or (until is not None
                                                                   and until(payload)):
                ctx.set(stream_intf.ready, 0)
                return received
