"""cocotb bench helpers: clock/reset, stream drivers and monitors, the memory model.

Import this module only inside cocotb benches (``sim/cocotb/tb_*.py``, ``tests/cocotb/tb_*.py``); it needs a running
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
    during ``ReadOnly``. Coroutines waiting on a helper (``send``, ``recv``, ``wait_for``) are
    woken right after that rising edge, where they may write signals. All helpers of one clock
    are stepped by a single task, so adding helpers costs Python calls, not simulator
    triggers. Create helpers inside each cocotb test (the task is per test).

Construct drivers, monitors and memories before (or right after) ``start_clock_and_reset``:
each drives its outputs to idle at construction, so no input of the design is ever left
undriven (Icarus would see Z).
"""

from __future__ import annotations

import enum as py_enum
import json
import os
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from neonic.sim.schema import probability

import cocotb
import numpy as np
from amaranth.hdl import Shape, ShapeCastable
from amaranth.lib import data
from cocotb.clock import Clock
from cocotb.triggers import Event, FallingEdge, ReadOnly, RisingEdge
from cocotb.types import LogicArray

from neonic.rtl.streams import MemRequest, MemResponseBeat, MemWriteBeat

from .cocotb_runner import TB_FIGURES_FILE, TB_PARAMS_ENV, TB_SEED_ENV
from .memory import MemoryCore, MemoryStats

__all__ = [
    "tb_params", "tb_seed", "tb_rng", "tb_record", "start_clock_and_reset",
    "pack", "unpack", "Codec", "StreamDriver", "StreamMonitor", "CocotbMemory",
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
    if isinstance(value, py_enum.Enum):
        return _to_python(value.value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    return value  # a custom ShapeCastable's own representation


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


class Codec:
    """Fast packing for a layout, compiled from the layout's own field offsets and widths.

    A bench moves one payload per cycle per stream, and ``layout.const()``/``from_bits()``
    cost a fraction of a millisecond each; this does the same arithmetic on plain ints
    (tests check it agrees with the layout's methods). Struct and array layouts nest freely
    over plain signed/unsigned fields; any other layout (unions, enum fields, custom shapes)
    and dicts that leave fields out go through the layout's own methods.
    """

    def __init__(self, layout):
        self.layout = layout
        self.width = _width(layout)
        self._plan = self._compile(layout)

    @classmethod
    def _compile(cls, shape):
        if isinstance(shape, data.StructLayout):
            subs = []
            for name, field in shape:
                sub = cls._compile(field.shape)
                if sub is None:
                    return None
                subs.append((name, field.offset, sub))
            return ("struct", subs, {name for name, _, _ in subs})
        if isinstance(shape, data.ArrayLayout):
            sub = cls._compile(shape.elem_shape)
            if sub is None:
                return None
            return ("array", sub, _width(shape.elem_shape), shape.length)
        if isinstance(shape, ShapeCastable):
            return None
        shape = Shape.cast(shape)
        return ("leaf", shape.width, shape.signed)

    def pack(self, value) -> int:
        if isinstance(value, data.Const):
            return value.as_bits()
        if self._plan is None or isinstance(value, int) or isinstance(value, np.integer):
            return pack(self.layout, value)
        try:
            return self._pack(self._plan, value)
        except _Fallback:
            return pack(self.layout, value)

    def unpack(self, bits: int):
        if self._plan is None:
            return unpack(self.layout, bits)
        return self._unpack(self._plan, bits)

    @classmethod
    def _pack(cls, plan, value) -> int:
        kind = plan[0]
        if kind == "leaf":
            _, width, signed = plan
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"payload: expected an int for a {width}-bit field, "
                                 f"got {value!r}")
            value = int(value)
            lo, hi = ((-(1 << (width - 1)), (1 << (width - 1)) - 1) if signed
                      else (0, (1 << width) - 1))
            if not lo <= value <= hi:
                raise ValueError(f"payload: field value {value} does not fit "
                                 f"{'signed' if signed else 'unsigned'}({width})")
            return value & ((1 << width) - 1)
        if kind == "struct":
            _, subs, names = plan
            if not isinstance(value, dict) or value.keys() != names:
                raise _Fallback
            bits = 0
            for name, offset, sub in subs:
                bits |= cls._pack(sub, value[name]) << offset
            return bits
        _, sub, stride, length = plan
        if not isinstance(value, (list, tuple)) or len(value) != length:
            raise _Fallback
        bits = 0
        for i, item in enumerate(value):
            bits |= cls._pack(sub, item) << (i * stride)
        return bits

    @classmethod
    def _unpack(cls, plan, bits: int):
        kind = plan[0]
        if kind == "leaf":
            _, width, signed = plan
            bits &= (1 << width) - 1
            if signed and bits >> (width - 1):
                bits -= 1 << width
            return bits
        if kind == "struct":
            return {name: cls._unpack(sub, bits >> offset) for name, offset, sub in plan[1]}
        _, sub, stride, length = plan
        return [cls._unpack(sub, bits >> (i * stride)) for i in range(length)]


class _Fallback(Exception):
    pass


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
    """A probability of idle/backpressure/latency cycles: >= 0 and < 1 (1 would never end)."""
    return probability(name, value, hi_open=True)


def _check_rng(rng) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng: expected a numpy.random.Generator, got {rng!r}")
    return rng


# -- the per-clock ticker -----------------------------------------------------------------------

class _Ticker:
    """Steps every helper of one clock from a single task: three simulator triggers per cycle
    in all (instead of two or three per helper), which is most of a bench's cost.

    Per cycle: at the falling edge every helper writes its outputs (:meth:`_drive`); in the
    ``ReadOnly`` phase of that time step every helper samples (:meth:`_sample`); if any
    helper has waiters to wake (a beat sent or received), the ticker waits for the rising
    edge and wakes them there, outside ``ReadOnly``, before the next falling edge: a woken
    bench may write signals and queue more payloads that still go out back to back.
    """

    def __init__(self, clk):
        self.clk = clk
        self.helpers: list = []
        self.task = cocotb.start_soon(self._run())

    async def _run(self) -> None:
        falling, rising, read_only = FallingEdge(self.clk), RisingEdge(self.clk), ReadOnly()
        helpers = self.helpers
        while True:
            await falling
            for h in helpers:
                h._drive()
            await read_only
            wake = False
            for h in helpers:
                wake |= h._sample()
            if wake:
                await rising
                for h in helpers:
                    h._wake()


_TICKERS: dict[int, _Ticker] = {}


def _attach(helper, clk) -> None:
    """Register ``helper`` with the ticker of ``clk`` (a new one for each cocotb test: the
    previous test's task is gone)."""
    ticker = _TICKERS.get(id(clk))
    if ticker is None or ticker.clk is not clk or ticker.task.done():
        ticker = _TICKERS[id(clk)] = _Ticker(clk)
    ticker.helpers.append(helper)


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
        self.codec = Codec(layout)
        self.sent = 0
        self._queue: deque[tuple[int, Event | None]] = deque()
        self._offering = False    # valid is high with the head of the queue
        self._valid = 0
        self._done: list[Event] = []
        self.valid.value = 0
        _attach(self, clk)

    async def send(self, payload) -> None:
        """Queue one payload (dict/list/``data.Const``/int) and wait until it is taken."""
        done = Event()
        self._queue.append((self.codec.pack(payload), done))
        await done.wait()

    async def send_all(self, payloads: Iterable) -> None:
        """Queue all ``payloads`` and wait until the last one is taken."""
        items = [self.codec.pack(p) for p in payloads]
        if not items:
            return
        done = Event()
        self._queue.extend((bits, None) for bits in items[:-1])
        self._queue.append((items[-1], done))
        await done.wait()

    @property
    def pending(self) -> int:
        """Payloads queued and not yet taken."""
        return len(self._queue)

    def _drive(self) -> None:
        if self._offering:
            return
        if not self._queue or (self.idle and self.rng.random() < self.idle):
            if self._valid:
                self.valid.value = self._valid = 0
            return
        self.payload.value = self._queue[0][0]
        if not self._valid:
            self.valid.value = self._valid = 1
        self._offering = True

    def _sample(self) -> bool:
        if self._offering and _read_int(self.ready, f"{self.path}__ready"):
            _, done = self._queue.popleft()
            self._offering = False
            self.sent += 1
            if done is not None:
                self._done.append(done)
                return True
        return False

    def _wake(self) -> None:
        for done in self._done:
            done.set()
        self._done.clear()


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
        self.codec = Codec(layout)
        self.received: list = []
        self._next = 0
        self._ready = 0
        self._arrived = Event()
        self._new = False
        self.ready.value = 0
        _attach(self, clk)

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

    def _drive(self) -> None:
        bp = self.backpressure
        want = 0 if (bp and self.rng.random() < bp) else 1
        if want != self._ready:
            self.ready.value = self._ready = want

    def _sample(self) -> bool:
        if self._ready and _read_int(self.valid, f"{self.path}__valid"):
            bits = _read_int(self.payload, f"{self.path}__payload")
            self.received.append(self.codec.unpack(bits))
            self._new = True
        return self._new

    def _wake(self) -> None:
        if self._new:
            self._new = False
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
        ports = {}
        for stream_name in ("req", "wdata", "resp"):
            for member in ("valid", "ready", "payload"):
                ports[stream_name, member] = _port(dut, f"{path}__{stream_name}", member)
        self._ports = ports
        req_width = len(ports["req", "payload"])
        addr_width = req_width - beats_width - 1
        if addr_width < 1:
            raise ValueError(f"beats_width: {beats_width} leaves no address bits in the "
                             f"{req_width}-bit request payload")
        self.req_layout = MemRequest(addr_width, beats_width)
        self.wdata_layout = MemWriteBeat(data_bytes)
        self.resp_layout = MemResponseBeat(data_bytes)
        self._req_codec = Codec(self.req_layout)
        self._wdata_codec = Codec(self.wdata_layout)
        for name, layout in (("wdata", self.wdata_layout), ("resp", self.resp_layout)):
            width = len(ports[name, "payload"])
            if width != layout.size:
                raise ValueError(f"data_bytes: {data_bytes} gives a {layout.size}-bit {name} "
                                 f"payload, the design's port has {width} bits")
        self.path = path
        self._data_at = self.resp_layout["data"].offset
        self._last_at = self.resp_layout["last"].offset
        self._out = (0, 0, 0, 0, 0)
        for key in (("req", "ready"), ("wdata", "ready"), ("resp", "valid"),
                    ("resp", "payload")):
            ports[key].value = 0
        _attach(self, self.clk)

    @property
    def contents(self) -> np.ndarray:
        return self.core.contents

    @property
    def stats(self) -> MemoryStats:
        return self.core.stats

    def check_idle(self) -> None:
        self.core.check_idle()

    def _drive(self) -> None:
        out = self.core.drive()
        last = self._out
        if out != last:
            ports = self._ports
            rr, wr, rv, rd, rlast = out
            if rr != last[0]:
                ports["req", "ready"].value = rr
            if wr != last[1]:
                ports["wdata", "ready"].value = wr
            if rv != last[2]:
                ports["resp", "valid"].value = rv
            if rv and (rd, rlast) != (last[3], last[4]):
                ports["resp", "payload"].value = (rd << self._data_at) | (rlast << self._last_at)
            self._out = out

    def _sample(self) -> bool:
        ports, p, out = self._ports, self.path, self._out
        rqv = _read_int(ports["req", "valid"], f"{p}__req__valid")
        r = w = None
        if rqv and out[0]:
            c = self._req_codec.unpack(_read_int(ports["req", "payload"], f"{p}__req__payload"))
            r = (c["addr"], c["beats"], c["write"])
        wv = _read_int(ports["wdata", "valid"], f"{p}__wdata__valid")
        if wv and out[1]:
            c = self._wdata_codec.unpack(_read_int(ports["wdata", "payload"],
                                                   f"{p}__wdata__payload"))
            w = (c["data"], c["mask"], c["last"])
        rsr = _read_int(ports["resp", "ready"], f"{p}__resp__ready") if out[2] else 0
        self.core.edge(rqv, r, wv, w, rsr)
        return False

    def _wake(self) -> None:
        pass
