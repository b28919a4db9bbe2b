"""Behavioural memory that answers a unit's memory port (``rtl.streams.MemPortSignature``).

The memory is what a unit under test talks to instead of a cache, DRAM or a remote node. It
keeps the port's contract (see ``rtl/streams.py``) and makes it as hard as allowed for the
unit: random latency per request, responses strictly in request order, random idle cycles
in the middle of a response, a bounded number of outstanding requests, and (optionally)
random cycles where it refuses requests and write data. A contract violation by the unit (an
address out of range, a zero beat count, a wrong ``last`` on write data) stops the simulation
with a :class:`MemoryModelError` that says what happened.

One cycle-level core (:class:`MemoryCore`) holds all of that behaviour; thin adapters drive it
from Amaranth's simulator (:class:`AmaranthMemory`, here) and from cocotb
(``CocotbMemory`` in :mod:`sim.harness.cocotb_streams`), so both simulators see the same
memory.

Timing, per clock cycle: the core decides its outputs (``req.ready``, ``wdata.ready``,
``resp.valid`` and payload) at the start of the cycle; at the clock edge it is told what the
unit drove and takes the transfers that happened. A read accepted at the edge ending cycle
``c`` with latency ``L`` (>= 1) may present its first beat in cycle ``c + L``, and not before
the previous read's last beat has been taken; its beats then follow back to back except for
``resp_stall`` idle cycles. ``resp.valid`` is never withdrawn before its beat is taken.
Read data is captured once every earlier write has fully arrived and before any later write
is applied, so reads and writes take effect in request order.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field

from neonic.sim.schema import probability

import numpy as np

__all__ = [
    "MemoryModelError",
    "MemoryStats",
    "MemoryCore",
    "AmaranthMemory",
]


class MemoryModelError(AssertionError):
    """The unit under test broke the memory-port contract."""


@dataclass
class MemoryStats:
    """What the memory saw. ``busy_cycles`` counts cycles with a request outstanding or a
    transfer on any of the three streams."""

    cycles: int = 0
    busy_cycles: int = 0
    requests: int = 0
    read_requests: int = 0
    write_requests: int = 0
    beats_read: int = 0
    beats_written: int = 0
    resp_stall_cycles: int = 0
    max_outstanding_seen: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Read:
    addr: int
    beats: int
    ready_cycle: int
    writes_before: int
    data: list[int] | None = None
    sent: int = 0


@dataclass
class _Write:
    addr: int
    beats: int
    done: int = 0


@dataclass
class _ReqIn:
    addr: int
    beats: int
    write: bool


def _check_probability(name: str, value: float) -> float:
    """A probability of idle/backpressure/latency cycles: >= 0 and < 1 (1 would never end)."""
    return probability(name, value, hi_open=True)


@dataclass
class MemoryCore:
    """The simulator-independent memory behaviour, stepped once per clock cycle.

    Parameters
    ----------
    contents : a 1-D ``numpy.uint8`` array, the memory's bytes; it is updated in place by
        writes, so a test can inspect it afterwards. Its length must be a multiple of
        ``data_bytes``.
    data_bytes : bytes per beat (the port's ``data_bytes``).
    rng : the random generator for latencies and stalls.
    latency : ``(min, max)`` cycles from a read request's acceptance to its first beat,
        drawn uniformly per request; ``min >= 1``.
    max_outstanding : requests accepted but not finished (reads not fully answered, writes
        whose data has not fully arrived) before ``req.ready`` goes low.
    resp_stall : probability that a response beat that could be presented is held back a
        cycle (``resp.valid`` low in the middle of a response).
    accept_stall : probability per cycle that ``req.ready`` and, independently,
        ``wdata.ready`` are held low.
    """

    contents: np.ndarray
    data_bytes: int
    rng: np.random.Generator
    latency: tuple[int, int] = (1, 1)
    max_outstanding: int = 16
    resp_stall: float = 0.0
    accept_stall: float = 0.0
    stats: MemoryStats = field(default_factory=MemoryStats)

    def __post_init__(self):
        if isinstance(self.data_bytes, bool) or not isinstance(self.data_bytes, int) or \
                self.data_bytes < 1 or self.data_bytes & (self.data_bytes - 1):
            raise ValueError(f"data_bytes: expected a power of two >= 1, got {self.data_bytes!r}")
        if not isinstance(self.contents, np.ndarray) or self.contents.dtype != np.uint8 \
                or self.contents.ndim != 1:
            raise ValueError("contents: expected a 1-D numpy uint8 array, got "
                             f"{type(self.contents).__name__} "
                             f"{getattr(self.contents, 'dtype', '')}"
                             f"{getattr(self.contents, 'shape', '')}")
        if len(self.contents) % self.data_bytes:
            raise ValueError(f"contents: expected a length that is a multiple of data_bytes="
                             f"{self.data_bytes}, got {len(self.contents)} bytes")
        if not isinstance(self.rng, np.random.Generator):
            raise ValueError(f"rng: expected a numpy.random.Generator, got {self.rng!r}")
        try:
            lo, hi = self.latency
        except (TypeError, ValueError):
            raise ValueError(f"latency: expected a (min, max) pair of cycles, "
                             f"got {self.latency!r}") from None
        if not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool)
                   for x in (lo, hi)) or not 1 <= lo <= hi:
            raise ValueError(f"latency: expected integers 1 <= min <= max, got {self.latency!r}")
        self.latency = (int(lo), int(hi))
        if isinstance(self.max_outstanding, bool) or not isinstance(self.max_outstanding, int) \
                or self.max_outstanding < 1:
            raise ValueError(f"max_outstanding: expected an integer >= 1, "
                             f"got {self.max_outstanding!r}")
        self.resp_stall = _check_probability("resp_stall", self.resp_stall)
        self.accept_stall = _check_probability("accept_stall", self.accept_stall)
        self.beats_total = len(self.contents) // self.data_bytes
        self._reads: deque[_Read] = deque()
        self._writes: deque[_Write] = deque()
        self._wbuf: deque[tuple[int, int, int]] = deque()
        self._writes_accepted = 0
        self._writes_completed = 0
        self._cycle = 0
        self._out = (0, 0, 0, 0, 0)
        self._offered = False  # a response beat is offered and not yet taken
        self._mask_bytes = (self.data_bytes + 7) // 8

    # -- the per-cycle interface ---------------------------------------------------------

    @property
    def outstanding(self) -> int:
        return len(self._reads) + len(self._writes)

    def drive(self) -> tuple[int, int, int, int, int]:
        """Decide this cycle's outputs: ``(req_ready, wdata_ready, resp_valid, resp_data,
        resp_last)``. Call once per cycle, before :meth:`edge`."""
        stall = self.accept_stall
        req_ready = int(self.outstanding < self.max_outstanding
                        and not (stall and self.rng.random() < stall))
        wdata_ready = int(not (stall and self.rng.random() < stall))
        resp_valid, resp_data, resp_last = 0, 0, 0
        head = self._reads[0] if self._reads else None
        if head is not None and head.data is not None and self._cycle >= head.ready_cycle:
            # A beat already offered stays offered; a new one may be held back.
            if self._offered or not (self.resp_stall and self.rng.random() < self.resp_stall):
                resp_valid = 1
                resp_data = head.data[head.sent]
                resp_last = int(head.sent == head.beats - 1)
            else:
                self.stats.resp_stall_cycles += 1
        self._out = (req_ready, wdata_ready, resp_valid, resp_data, resp_last)
        self._offered = bool(resp_valid)
        return self._out

    def edge(self, req_valid: int, req: _ReqIn | None, wdata_valid: int,
             wdata: tuple[int, int, int] | None, resp_ready: int) -> None:
        """Take the transfers of this cycle: what the unit drove, sampled at the clock edge.

        ``req`` is ``(addr, beats, write)`` and ``wdata`` is ``(data, mask, last)``; they are
        only looked at when the matching ``valid`` (and this cycle's ``ready``) is high.
        """
        req_ready, wdata_ready, resp_valid, _, _ = self._out
        busy = self.outstanding > 0
        if resp_valid and resp_ready:
            busy = True
            head = self._reads[0]
            self._offered = False
            head.sent += 1
            self.stats.beats_read += 1
            if head.sent == head.beats:
                self._reads.popleft()
        if wdata_valid and wdata_ready:
            busy = True
            self._wbuf.append(tuple(int(x) for x in wdata))
        if req_valid and req_ready:
            busy = True
            self._accept(_ReqIn(int(req[0]), int(req[1]), bool(req[2])))
        self._apply_writes()
        self.stats.max_outstanding_seen = max(self.stats.max_outstanding_seen, self.outstanding)
        self.stats.cycles += 1
        self.stats.busy_cycles += int(busy)
        self._cycle += 1

    def check_idle(self) -> None:
        """Raise :class:`MemoryModelError` if requests or write data are still pending (call
        at the end of a test: nothing may be left half-done)."""
        if self._reads or self._writes or self._wbuf:
            raise MemoryModelError(
                f"memory not idle at the end: {len(self._reads)} read(s) unanswered, "
                f"{len(self._writes)} write(s) missing data, {len(self._wbuf)} write beat(s) "
                f"without a write request")

    # -- internals -------------------------------------------------------------------------

    def _accept(self, r: _ReqIn) -> None:
        kind = "write" if r.write else "read"
        if r.beats < 1:
            raise MemoryModelError(f"{kind} request at beat address {r.addr:#x} with beats=0 "
                                   f"(the port requires beats >= 1)")
        if r.addr + r.beats > self.beats_total:
            raise MemoryModelError(
                f"{kind} request out of range: beat address {r.addr:#x} + {r.beats} beat(s) "
                f"exceeds the memory's {self.beats_total} beats of {self.data_bytes} bytes "
                f"(byte address {r.addr * self.data_bytes:#x})")
        self.stats.requests += 1
        if r.write:
            self.stats.write_requests += 1
            self._writes.append(_Write(r.addr, r.beats))
            self._writes_accepted += 1
        else:
            self.stats.read_requests += 1
            lat = int(self.rng.integers(self.latency[0], self.latency[1] + 1))
            # Accepted at the edge ending cycle `_cycle`: first beat in cycle `_cycle + lat`
            # at the earliest.
            rd = _Read(r.addr, r.beats, self._cycle + lat, self._writes_accepted)
            self._reads.append(rd)
            if rd.writes_before <= self._writes_completed:
                self._capture(rd)

    def _capture(self, rd: _Read) -> None:
        lo = rd.addr * self.data_bytes
        raw = self.contents[lo:lo + rd.beats * self.data_bytes].tobytes()
        n = self.data_bytes
        rd.data = [int.from_bytes(raw[i * n:(i + 1) * n], "little") for i in range(rd.beats)]

    def _apply_writes(self) -> None:
        while self._writes and self._wbuf:
            wr = self._writes[0]
            data, mask, last = self._wbuf.popleft()
            expect_last = int(wr.done == wr.beats - 1)
            if last != expect_last:
                raise MemoryModelError(
                    f"write data beat {wr.done} of {wr.beats} for beat address {wr.addr:#x} "
                    f"has last={last}, expected last={expect_last}")
            lo = (wr.addr + wr.done) * self.data_bytes
            if mask:
                new = np.frombuffer(data.to_bytes(self.data_bytes, "little"), dtype=np.uint8)
                enable = np.unpackbits(
                    np.frombuffer(mask.to_bytes(self._mask_bytes, "little"), dtype=np.uint8),
                    bitorder="little")[:self.data_bytes].astype(bool)
                view = self.contents[lo:lo + self.data_bytes]
                view[enable] = new[enable]
            wr.done += 1
            self.stats.beats_written += 1
            if wr.done == wr.beats:
                self._writes.popleft()
                self._writes_completed += 1
                for rd in self._reads:
                    if rd.data is None and rd.writes_before <= self._writes_completed:
                        self._capture(rd)


class AmaranthMemory:
    """A :class:`MemoryCore` answering a memory port in Amaranth's simulator.

    ``port`` is the unit's initiator-side port (``dut.mem``: an object with ``req``, ``wdata``
    and ``resp`` streams). Add :attr:`process` to :func:`run_amaranth` through ``processes=``;
    it runs for as long as the simulation does. After the run, :attr:`stats` and
    :attr:`contents` tell what happened; :meth:`check_idle` asserts nothing is pending.
    Keyword arguments are those of :class:`MemoryCore` (``accept_stall`` included).
    """

    def __init__(self, port, contents: np.ndarray, *, data_bytes: int, rng: np.random.Generator,
                 latency: tuple[int, int] = (1, 1), max_outstanding: int = 16,
                 resp_stall: float = 0.0, accept_stall: float = 0.0):
        port_bytes = getattr(getattr(port, "signature", None), "data_bytes", data_bytes)
        if port_bytes != data_bytes:
            raise ValueError(f"data_bytes: expected the port's data_bytes={port_bytes}, "
                             f"got {data_bytes}")
        self.port = port
        self.core = MemoryCore(contents, data_bytes, rng, latency, max_outstanding,
                               resp_stall, accept_stall)

    @property
    def contents(self) -> np.ndarray:
        return self.core.contents

    @property
    def stats(self) -> MemoryStats:
        return self.core.stats

    def check_idle(self) -> None:
        self.core.check_idle()

    async def process(self, ctx) -> None:
        """The simulator process (``run_amaranth(..., processes=[mem.process])``)."""
        req, wdata, resp = self.port.req, self.port.wdata, self.port.resp
        core = self.core
        last_out = None
        resp_layout = resp.payload.shape()
        data_at = resp_layout["data"].offset
        last_at = resp_layout["last"].offset
        resp_bits = resp.payload.as_value()

        def drive():
            nonlocal last_out
            out = core.drive()
            if out != last_out:
                rr, wr, rv, rd, rl = out
                ctx.set(req.ready, rr)
                ctx.set(wdata.ready, wr)
                ctx.set(resp.valid, rv)
                if rv:
                    ctx.set(resp_bits, (rd << data_at) | (rl << last_at))
                last_out = out

        drive()
        trigger = ctx.tick().sample(req.valid, req.payload.as_value(), wdata.valid,
                                    wdata.payload.as_value(), resp.ready)
        req_layout = req.payload.shape()
        wdata_layout = wdata.payload.shape()
        async for _, _, rv, rp, wv, wp, rr in trigger:
            r = w = None
            if rv:
                c = req_layout.from_bits(rp)
                r = (c.addr, c.beats, c.write)
            if wv:
                c = wdata_layout.from_bits(wp)
                w = (c.data, c.mask, c.last)
            core.edge(rv, r, wv, w, rr)
            drive()
