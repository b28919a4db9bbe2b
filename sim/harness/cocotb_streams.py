"""cocotb bench helpers: clock/reset, stream drivers and monitors, the memory model.

Import this module only inside cocotb benches (``tests/cocotb/tb_*.py``); it needs a running
simulator for everything but packing.

Ports
    A stream at signature path ``mem.req`` of the top component is the three ports
    ``mem__req__valid``, ``mem__req__ready`` and ``mem__req__payload`` (one packed vector,
    first struct field at the least significant bit). Helpers take the path joined with ``__``
    and the payload's Amaranth layout (the RTL's own ``data.Layout`` object, or a plain shape),
    and pack with ``layout.const(...).as_bits()`` / unpack with ``layout.from_bits(...)``, so
    the RTL stays the single source of truth for field positions. Struct fields are never
    reached by name in the simulator (simulators name sub-fields differently).

Timing (one scheme for every helper, safe in cocotb 2 on Icarus and Verilator)
    On each falling edge of the clock a helper writes its outputs for the coming rising edge;
    it then awaits ``ReadOnly()`` of that same time step and samples the design's outputs,
    which are then settled and stay so until the rising edge (the design is synchronous to the
    rising edge). A transfer is counted when ``valid`` and ``ready`` sampled that way are both
    high: exactly the transfers the design performs at the next rising edge. Nothing is written
    during ``ReadOnly``.

Construct drivers, monitors and memories before (or right after) ``start_clock_and_reset``:
each drives its outputs to idle at construction, so no input of the design is ever left
undriven (Icarus would see Z).
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import cocotb
import numpy as np
from amaranth.hdl import Shape, ShapeCastable
from amaranth.lib import data
from cocotb.clock import Clock
from cocotb.triggers import Event, FallingEdge, ReadOnly, RisingEdge
from cocotb.types import LogicArray

from rtl.streams import MemRequest, MemResponseBeat, MemWriteBeat

from .cocotb_runner import TB_FIGURES_FILE, TB_PARAMS_ENV, TB_SEED_ENV
from .memory import MemoryCore, MemoryStats

__all__ = [
    "tb_params", "tb_seed", "tb_rng", "tb_record", "start_clock_and_reset",
    "pack", "unpack", "StreamDriver", "StreamMonitor", "CocotbMemory",
]


# -- bench parameters ------------------------------------------------------------------------

def tb_params() -> dict:
    """The ``params`` dict given to :func:`run_cocotb` (empty when run without one)."""
    return json.loads(os.environ.get(TB_PARAMS_ENV) or "{}")


def tb_seed() -> int:
    """The ``seed`` given to :func:`run_cocotb`, else cocotb's own random seed."""
    seed = os.environ.get(TB_SEED_ENV)
    return int(seed) if seed else int(cocotb.RANDOM_SEED)


def tb_rng(offset: int = 0) -> np.random.Generator:
    """A numpy Generator from :func:`tb_seed` (``offset`` gives independent streams)."""
    return np.random.default_rng([tb_seed(), offset])


def tb_record(**figures) -> None:
    """Record figures (JSON values) of this run; the pytest side reads them back with
    ``read_tb_figures(results_xml)``. Later calls update earlier keys."""
    path = Path.cwd() / TB_FIGURES_FILE  # cocotb runs the bench in the run directory
    old = json.loads(path.read_text()) if path.is_file() else {}
    old.update(figures)
    path.write_text(json.dumps(old, indent=1, sort_keys=True))


async def start_clock_and_reset(dut, period_ns: float = 10, reset_cycles: int = 4, *,
                                clk: str = "clk", rst: str = "rst") -> None:
    """Start the clock and hold the synchronous reset high for ``reset_cycles`` rising edges.

    Returns at the falling edge where ``rst`` is released (the design runs from the next
    rising edge), which is also where the helpers write, so a bench can go on at once.
    """
    if reset_cycles < 1:
        raise ValueError(f"reset_cycles: expected an integer >= 1, got {reset_cycles!r}")
    clk_h, rst_h = getattr(dut, clk), getattr(dut, rst)
    rst_h.value = 1
    cocotb.start_soon(Clock(clk_h, period_ns, unit="ns").start())
    for _ in range(reset_cycles):
        await RisingEdge(clk_h)
    await FallingEdge(clk_h)
    rst_h.value = 0


# -- packing -----------------------------------------------------------------------------------

def _width(layout) -> int:
    return Shape.cast(layout).width


def pack(layout, value) -> int:
    """The bits of ``value`` for a port of ``layout``: a dict/list/``data.Const`` for a
    ``data.Layout`` (packed by the layout itself), or an int (raw bits for a layout; a value
    in range for a plain shape, two's complement when signed)."""
    width = _width(layout)
    if isinstance(value, data.Const):
        return value.as_bits()
    if isinstance(layout, data.Layout) and not isinstance(value, int):
        return layout.const(value).as_bits()
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"payload: expected an int, dict or data.Const for {layout!r}, "
                         f"got {value!r}")
    value = int(value)
    shape = Shape.cast(layout)
    lo = -(1 << (width - 1)) if shape.signed and not isinstance(layout, data.Layout) else 0
    hi = (1 << width) - 1 if lo == 0 else (1 << (width - 1)) - 1
    if not lo <= value <= hi:
        raise ValueError(f"payload: {value} does not fit {layout!r} ({width} bits)")
    return value & ((1 << width) - 1)


def _to_python(value) -> Any:
    if isinstance(value, data.Const):
        layout = value.shape()
        if isinstance(layout, data.ArrayLayout):
            return [_to_python(value[i]) for i in range(layout.length)]
        return {name: _to_python(value[name]) for name, _ in layout}
    return int(value)


def unpack(layout, bits: int) -> Any:
    """Bits from a port of ``layout`` as Python values: dict (struct/union) and list (array)
    of ints, recursively, through ``layout.from_bits``; an int for a plain shape (negative for
    a signed one)."""
    if isinstance(layout, ShapeCastable):
        return _to_python(layout.from_bits(bits))
    shape = Shape.cast(layout)
    if shape.signed and bits >> (shape.width - 1):
        return bits - (1 << shape.width)
    return bits


def _read_int(handle, what: str) -> int:
    value = handle.value
    try:
        return value.to_unsigned() if isinstance(value, LogicArray) else int(value)
    except ValueError:
        raise AssertionError(f"{what}: sampled non-binary value {value!s} "
                             f"(undriven or X in the design)") from None


def _port(dut, path: str, member: str):
    name = f"{path}__{member}"
    try:
        return getattr(dut, name)
    except AttributeError:
        raise ValueError(f"path: the design has no port {name!r} (expected the signature path "
                         f"joined with '__', e.g. 'mem__req')") from None


def _check_probability(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name}: expected a probability in [0, 1), got {value!r}")
    return float(value)


def _check_rng(rng) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng: expected a numpy.random.Generator, got {rng!r}")
    return rng


# -- streams -----------------------------------------------------------------------------------

class StreamDriver:
    """Drives a stream into the design (the design's ``In(stream.Signature(layout))``).

    Payloads queue up and go out back to back; before each one, with probability ``idle``
    per cycle, ``valid`` stays low for a cycle. ``valid`` and the payload stay stable until
    the design takes the beat. :meth:`send` returns right after the rising edge that takes
    its payload (outside ``ReadOnly``: the caller may write signals at once).
    """

    def __init__(self, dut, path: str, layout, clk, *, rng: np.random.Generator,
                 idle: float = 0.0):
        self.layout = layout
        self.clk = clk
        self.rng = _check_rng(rng)
        self.idle = _check_probability("idle", idle)
        self.valid = _port(dut, path, "valid")
        self.ready = _port(dut, path, "ready")
        self.payload = _port(dut, path, "payload")
        self.path = path
        self.sent = 0
        self._queue: deque[tuple[int, Event]] = deque()
        self._wake = Event()
        self.valid.value = 0
        self._task = cocotb.start_soon(self._run())

    async def send(self, payload) -> None:
        """Queue one payload (dict/list/``data.Const``/int) and wait until it is taken."""
        done = Event()
        self._queue.append((pack(self.layout, payload), done))
        self._wake.set()
        await done.wait()

    async def send_all(self, payloads: Iterable) -> None:
        """Queue all ``payloads`` and wait until the last one is taken."""
        done = None
        for payload in payloads:
            done = Event()
            self._queue.append((pack(self.layout, payload), done))
        self._wake.set()
        if done is not None:
            await done.wait()

    async def _run(self) -> None:
        valid = 0
        while True:
            await FallingEdge(self.clk)
            if not self._queue:
                if valid:
                    self.valid.value = valid = 0
                self._wake.clear()
                await self._wake.wait()
                continue
            if self.idle and self.rng.random() < self.idle:
                if valid:
                    self.valid.value = valid = 0
                continue
            bits, done = self._queue[0]
            self.payload.value = bits
            if not valid:
                self.valid.value = valid = 1
            while True:
                await ReadOnly()
                if _read_int(self.ready, f"{self.path}__ready"):
                    break
                await FallingEdge(self.clk)
            self._queue.popleft()
            self.sent += 1
            # Wake the sender after the edge that takes the beat, outside ReadOnly, so that
            # it may write signals at once.
            await RisingEdge(self.clk)
            done.set()


class StreamMonitor:
    """Receives a stream from the design (the design's ``Out(stream.Signature(layout))``).

    ``ready`` is held low with probability ``backpressure`` each cycle. Every beat taken is
    unpacked (dict of field -> int for struct layouts, recursively; int otherwise) and
    appended to :attr:`received`; :meth:`recv` returns them one by one in order (waiters wake
    right after the rising edge that takes the beat).
    """

    def __init__(self, dut, path: str, layout, clk, *, rng: np.random.Generator,
                 backpressure: float = 0.0):
        self.layout = layout
        self.clk = clk
        self.rng = _check_rng(rng)
        self.backpressure = _check_probability("backpressure", backpressure)
        self.valid = _port(dut, path, "valid")
        self.ready = _port(dut, path, "ready")
        self.payload = _port(dut, path, "payload")
        self.path = path
        self.received: list = []
        self._next = 0
        self._arrived = Event()
        self.ready.value = 0
        self._task = cocotb.start_soon(self._run())

    async def recv(self) -> Any:
        """The next payload not yet returned by :meth:`recv` (waits for it)."""
        while self._next >= len(self.received):
            self._arrived.clear()
            await self._arrived.wait()
        self._next += 1
        return self.received[self._next - 1]

    async def wait_for(self, count: int) -> list:
        """Wait until ``count`` payloads have been received in total; return them all."""
        while len(self.received) < count:
            self._arrived.clear()
            await self._arrived.wait()
        return self.received

    async def _run(self) -> None:
        ready = 0
        bp = self.backpressure
        while True:
            await FallingEdge(self.clk)
            want = 0 if (bp and self.rng.random() < bp) else 1
            if want != ready:
                self.ready.value = ready = want
            await ReadOnly()
            if ready and _read_int(self.valid, f"{self.path}__valid"):
                bits = _read_int(self.payload, f"{self.path}__payload")
                self.received.append(unpack(self.layout, bits))
                # Wake waiters after the edge that takes the beat, outside ReadOnly.
                await RisingEdge(self.clk)
                self._arrived.set()


# -- memory ------------------------------------------------------------------------------------

class CocotbMemory:
    """The harness memory (:class:`sim.harness.memory.MemoryCore`) on a design's memory port.

    ``path`` is the port's signature path joined with ``__`` (``"mem"`` for ``dut.mem``).
    ``beats_width`` must match the port's ``MemPortSignature`` (default 8, as there); the
    address width is inferred from the request port. Other keyword arguments and the
    semantics are those of :class:`~sim.harness.memory.AmaranthMemory`; contract violations
    raise :class:`~sim.harness.memory.MemoryModelError`, which fails the running cocotb test.
    """

    def __init__(self, dut, path: str = "mem", contents: np.ndarray | None = None, *,
                 data_bytes: int, rng: np.random.Generator, latency: tuple[int, int] = (1, 1),
                 max_outstanding: int = 16, resp_stall: float = 0.0,
                 accept_stall: float = 0.0, beats_width: int = 8, clk=None):
        if contents is None:
            raise ValueError("contents: expected a 1-D numpy uint8 array, got None")
        self.core = MemoryCore(contents, data_bytes, rng, latency, max_outstanding,
                               resp_stall, accept_stall)
        self.clk = dut.clk if clk is None else clk
        self.req = {m: _port(dut, f"{path}__req", m) for m in ("valid", "ready", "payload")}
        self.wdata = {m: _port(dut, f"{path}__wdata", m) for m in ("valid", "ready", "payload")}
        self.resp = {m: _port(dut, f"{path}__resp", m) for m in ("valid", "ready", "payload")}
        addr_width = len(self.req["payload"]) - beats_width - 1
        if addr_width < 1:
            raise ValueError(f"beats_width: {beats_width} leaves no address bits in the "
                             f"{len(self.req['payload'])}-bit request payload")
        self.req_layout = MemRequest(addr_width, beats_width)
        self.wdata_layout = MemWriteBeat(data_bytes)
        self.resp_layout = MemResponseBeat(data_bytes)
        for port, layout in ((self.wdata, self.wdata_layout), (self.resp, self.resp_layout)):
            if len(port["payload"]) != layout.size:
                raise ValueError(f"data_bytes: {data_bytes} gives a {layout.size}-bit payload, "
                                 f"the design's port has {len(port['payload'])} bits")
        self.path = path
        self.req["ready"].value = 0
        self.wdata["ready"].value = 0
        self.resp["valid"].value = 0
        self.resp["payload"].value = 0
        self._task = cocotb.start_soon(self._run())

    @property
    def contents(self) -> np.ndarray:
        return self.core.contents

    @property
    def stats(self) -> MemoryStats:
        return self.core.stats

    def check_idle(self) -> None:
        self.core.check_idle()

    async def _run(self) -> None:
        core = self.core
        req, wdata, resp = self.req, self.wdata, self.resp
        rl, wl = self.req_layout, self.wdata_layout
        data_at = self.resp_layout["data"].offset
        last_at = self.resp_layout["last"].offset
        last_out = (0, 0, 0, 0, 0)
        p = self.path
        while True:
            await FallingEdge(self.clk)
            out = core.drive()
            if out != last_out:
                rr, wr, rv, rd, rlast = out
                if rr != last_out[0]:
                    req["ready"].value = rr
                if wr != last_out[1]:
                    wdata["ready"].value = wr
                if rv != last_out[2]:
                    resp["valid"].value = rv
                if rv:
                    resp["payload"].value = (rd << data_at) | (rlast << last_at)
                last_out = out
            await ReadOnly()
            rqv = _read_int(req["valid"], f"{p}__req__valid")
            r = w = None
            if rqv and out[0]:
                c = rl.from_bits(_read_int(req["payload"], f"{p}__req__payload"))
                r = (c.addr, c.beats, c.write)
            wv = _read_int(wdata["valid"], f"{p}__wdata__valid")
            if wv and out[1]:
                c = wl.from_bits(_read_int(wdata["payload"], f"{p}__wdata__payload"))
                w = (c.data, c.mask, c.last)
            rsr = _read_int(resp["ready"], f"{p}__resp__ready") if out[2] else 0
            core.edge(rqv, r, wv, w, rsr)
