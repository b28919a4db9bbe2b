"""Interfaces shared by every neonic unit: the memory port and stream helpers.

The memory port
===============

Every unit that reads or writes memory (the gather/pool unit reading embedding rows, the cache
controller on both of its sides, the depacketizer writing received payload) speaks the same
port, so that units stack: the gather/pool unit sits on the cache's front port unchanged, and
the cache's back port talks to whatever backing tier a test or a system provides.

The port is three ``amaranth.lib.stream`` streams, seen from the *initiator* (the unit that
issues requests):

``req`` (out)
    :class:`MemRequest`: ``addr`` (a *beat* address: byte address / ``data_bytes``),
    ``beats`` (how many consecutive beats, >= 1) and ``write``.
``wdata`` (out)
    :class:`MemWriteBeat`: for a write request, exactly ``beats`` beats of ``data`` with a byte
    ``mask``, ``last`` set on the final one. Write requests are posted: no response.
``resp`` (in)
    :class:`MemResponseBeat`: for a read request, exactly ``beats`` beats of ``data``, ``last``
    set on the final beat of each request.

Ordering and timing rules (the contract both sides keep):

* Read responses return **in request order**, and the beats of one request are contiguous.
  Latency is variable and unbounded; an initiator keeps as many requests outstanding as it
  needs to hide it (its own parameter).
* A write's data beats may be sent before, with, or after its request is accepted, but in the
  order of the write requests.
* A read issued after a write to the same beat returns the written data (a responder must not
  reorder a read ahead of an earlier write to the same address).
* All streams follow ``lib.stream`` rules: a transfer happens on a cycle where ``valid`` and
  ``ready`` are both high; ``valid`` never depends combinationally on ``ready``.

Register slices
===============

:class:`SkidBuffer` is the one register slice of the project: put between two units (or on a
memory port) it cuts every combinational path through the stream, ``valid``/``payload``
forward and ``ready`` backward, at full throughput and one cycle of latency.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

__all__ = [
    "MemRequest",
    "MemWriteBeat",
    "MemResponseBeat",
    "MemPortSignature",
    "SkidBuffer",
    "PingPongBuffer",
    "HeadFIFO",
    "CreditFIFO",
    "CreditLUTFIFO",
    "DelayLine",
    "check_int",
    "COLLISION_X_ATTR",
    "KEEP_COPY_ATTR",
]


#: Attribute of a :class:`amaranth.lib.memory.Memory` with one write and one read port whose
#: design never uses the data of a read of the address written in the same cycle (it discards
#: or forwards around them). Amaranth's RTLIL back end asks for the old data on such a
#: collision (``COLLISION_X_MASK`` 0), which a DP16KD's separate ports do not give, so yosys
#: adds a compare, a register and a LUT behind the block RAM's output to emulate it; the FPGA
#: flow (``host/bench/timing.py``) marks the read port of a memory with this attribute as
#: undefined on a collision instead, so the block RAM's data reach their register directly.
COLLISION_X_ATTR = "neonic_collision_x"

#: Attribute of a signal that is a deliberate copy of another register (the same next value,
#: loaded into a flip-flop of its own so that its loads are split among the copies). Synthesis
#: merges flip-flops with equal inputs; the FPGA flow (``host.bench.timing``) marks the
#: flip-flops driving such signals ``keep``, as a designer's replicated registers are.
KEEP_COPY_ATTR = "neonic_keep_copy"


def check_int(name: str, value: object, *, minimum: int | None = None,
              maximum: int | None = None, power_of_two: bool = False) -> int:
    """Validate an integer constructor parameter; raise ``ValueError`` naming it otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: expected an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name}: expected an integer <= {maximum}, got {value}")
    if power_of_two and (value <= 0 or value & (value - 1)):
        raise ValueError(f"{name}: expected a power of two, got {value}")
    return value


class MemRequest(data.StructLayout):
    """One memory request: ``beats`` consecutive beats from beat address ``addr``."""

    def __init__(self, addr_width: int = 32, beats_width: int = 8):
        check_int("addr_width", addr_width, minimum=1, maximum=64)
        check_int("beats_width", beats_width, minimum=1, maximum=16)
        self.addr_width = addr_width
        self.beats_width = beats_width
        super().__init__({
            "addr": unsigned(addr_width),
            "beats": unsigned(beats_width),
            "write": unsigned(1),
        })


class MemWriteBeat(data.StructLayout):
    """One beat of write data with a byte mask (bit i enables byte i, byte 0 = bits 0..7)."""

    def __init__(self, data_bytes: int = 64):
        check_int("data_bytes", data_bytes, minimum=1, maximum=256, power_of_two=True)
        self.data_bytes = data_bytes
        super().__init__({
            "data": unsigned(8 * data_bytes),
            "mask": unsigned(data_bytes),
            "last": unsigned(1),
        })


class MemResponseBeat(data.StructLayout):
    """One beat of read data; ``last`` closes the response to one request."""

    def __init__(self, data_bytes: int = 64):
        check_int("data_bytes", data_bytes, minimum=1, maximum=256, power_of_two=True)
        self.data_bytes = data_bytes
        super().__init__({
            "data": unsigned(8 * data_bytes),
            "last": unsigned(1),
        })


class MemPortSignature(wiring.Signature):
    """The memory port as seen from the initiator (flip it for a responder).

    Parameters
    ----------
    addr_width : beat-address width in bits.
    beats_width : width of the beat count of one request.
    data_bytes : bytes per beat (a power of two; default 64 = 512 bits).
    """

    def __init__(self, *, addr_width: int = 32, beats_width: int = 8, data_bytes: int = 64):
        self.addr_width = check_int("addr_width", addr_width, minimum=1, maximum=64)
        self.beats_width = check_int("beats_width", beats_width, minimum=1, maximum=16)
        self.data_bytes = check_int("data_bytes", data_bytes, minimum=1, maximum=256,
                                    power_of_two=True)
        super().__init__({
            "req": Out(stream.Signature(MemRequest(addr_width, beats_width))),
            "wdata": Out(stream.Signature(MemWriteBeat(data_bytes))),
            "resp": In(stream.Signature(MemResponseBeat(data_bytes))),
        })

    def __eq__(self, other):
        return (type(other) is type(self) and other.addr_width == self.addr_width
                and other.beats_width == self.beats_width and other.data_bytes == self.data_bytes)

    def __hash__(self):
        return hash((type(self), self.addr_width, self.beats_width, self.data_bytes))

    def __repr__(self):
        return (f"MemPortSignature(addr_width={self.addr_width}, beats_width={self.beats_width}, "
                f"data_bytes={self.data_bytes})")


class SkidBuffer(wiring.Component):
    """A two-register slice (skid buffer) on a ``lib.stream`` of ``shape``.

    Ports: ``i`` (in stream), ``o`` (out stream). ``o.valid``, ``o.payload`` and ``i.ready``
    all come straight from flip-flops, so no combinational path crosses the slice in either
    direction; it still passes one transfer per cycle (when ``o`` stalls, the transfer already
    accepted on ``i`` waits in the skid register). Latency: one cycle. Order and contents are
    unchanged: it is a FIFO of depth two whose input side is ready only when it is empty or
    holds one item that leaves.

    Why: a unit's stall (a hazard compare, a full queue) would otherwise reach the ready input
    of the unit feeding it, and through that unit the next one: one global combinational
    stall across the design, the critical path of the whole chip.

    With ``peek=True`` it also shows the entry that follows the output's (``peek_valid``,
    ``peek_payload``: the skid register's entry if it holds one, else the input's): what
    ``o`` holds on the cycle after it advances. A consumer that must decide one cycle ahead
    (a stall flag kept in a flip-flop) computes it from there. Both are one multiplexer from
    flip-flops when the input comes from flip-flops.
    """

    def __init__(self, shape, *, peek: bool = False):
        self.shape = shape
        self.peek = bool(peek)
        ports = {"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))}
        if self.peek:
            ports.update(peek_valid=Out(1), peek_payload=Out(shape))
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        skid = Signal(self.shape)
        skid_valid = Signal()
        m.d.comb += self.i.ready.eq(~skid_valid)
        if self.peek:
            m.d.comb += [
                self.peek_valid.eq(skid_valid | self.i.valid),
                self.peek_payload.eq(Mux(skid_valid, Value.cast(skid),
                                         Value.cast(self.i.payload))),
            ]
        # The skid register copies the input on every cycle it is empty, whether or not the
        # output holds: its (wide) enable is then the flip-flop ``~skid_valid``, not the
        # consumer's ``ready``, which only reaches the output register and two flags. What it
        # holds matters only once ``skid_valid`` is set, and it is set on the cycle the copy
        # is taken.
        with m.If(~skid_valid):
            m.d.sync += skid.eq(self.i.payload)
        with m.If(~self.o.valid | self.o.ready):
            # The output register loads: from the skid register if it holds one, else the input.
            with m.If(skid_valid):
                m.d.sync += [self.o.payload.eq(skid), self.o.valid.eq(1), skid_valid.eq(0)]
            with m.Else():
                m.d.sync += [self.o.payload.eq(self.i.payload), self.o.valid.eq(self.i.valid)]
        with m.Elif(self.i.valid & ~skid_valid):
            # The output holds; what arrives waits in the skid register (copied above).
            m.d.sync += skid_valid.eq(1)
        return m


class PingPongBuffer(wiring.Component):
    """A two-entry register queue on a ``lib.stream`` of ``shape``, read through a multiplexer.

    Ports and cycle behaviour are those of :class:`SkidBuffer` (``peek`` included): ``i.ready``
    and ``o.valid`` come from flip-flops, one transfer per cycle, one cycle of latency, order
    kept; on every cycle it accepts, holds and presents exactly what a ``SkidBuffer`` given the
    same inputs would. The difference is where the consumer's ``o.ready`` goes: here only to
    the read pointer and the two occupancy flags (three flip-flops), while the payload
    registers load from the producer's side (``i.valid`` and the registered ``i.ready``, into
    the entry the write pointer names). ``o.payload`` is then one 2:1 multiplexer from
    flip-flops instead of a flip-flop. Why: in a ``SkidBuffer`` the consumer's ``ready``
    is the enable of every payload bit of the output register, a net whose fan-out grows
    with the payload (512 bits of a 64-byte memory beat) at the end of the consumer's stall
    logic; here the wide nets are the write enables and the read pointer, each a flip-flop.
    An entry loads the producer's payload on every cycle it is free (it holds no item still
    to be taken: the entry the write pointer names while the queue is not full, the other
    one while it is empty) and keeps it from the cycle the item is accepted, so its write
    enable does not wait for the producer's ``valid``: it is a flip-flop, computed a cycle
    ahead from the pointers' and flags' next values.

    ``read_copies``: the read pointer as that many flip-flops (kept apart by the FPGA flow,
    :data:`KEEP_COPY_ATTR`), each selecting an equal share of the payload's bits, so that no
    one pointer's net reaches every bit of a wide entry (the same values on every cycle).

    ``reset_less``: the two entries' registers without reset (the pointers and occupancy
    flags keep theirs). An entry is read only while the occupancy says it holds an item, and
    in use an entry holds an item already taken whenever it is free, so a reset that leaves
    one as it was changes nothing the consumer sees; without the reset net, a wide payload's
    flip-flops have their set/reset input free (the gather's slices at 64 B: over a thousand
    flip-flops each). The default keeps the reset, and the same netlist as before.
    """

    def __init__(self, shape, *, peek: bool = False, read_copies: int = 1,
                 reset_less: bool = False):
        self.shape = shape
        self.peek = bool(peek)
        self.read_copies = check_int("read_copies", read_copies, minimum=1)
        self.reset_less = bool(reset_less)
        ports = {"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))}
        if self.peek:
            ports.update(peek_valid=Out(1), peek_payload=Out(shape))
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        entries = [Signal(self.shape, name=f"entry{k}", reset_less=self.reset_less)
                   for k in range(2)]
        wp = Signal()                # the entry the next accepted item goes to
        rp = Signal()                # the entry ``o`` presents
        full = Signal()              # both entries hold an item
        nonempty = Signal()          # at least one does
        push = Signal()
        pop = Signal()
        # the read pointer's copies and the payload bits each selects
        width = Value.cast(entries[0]).shape().width
        n = min(self.read_copies, max(1, width))
        bounds = [width * j // n for j in range(n + 1)]
        rps = [rp] + [Signal(name=f"rp_copy{j}", attrs={KEEP_COPY_ATTR: "1"})
                      for j in range(1, n)]

        def pick(first, second):
            # ``second`` where the pointer (copy) is set, ``first`` elsewhere
            a, b = Value.cast(first), Value.cast(second)
            return Cat(*[Mux(r, b[lo:hi], a[lo:hi])
                         for r, lo, hi in zip(rps, bounds, bounds[1:])])
        m.d.comb += [
            self.i.ready.eq(~full),
            self.o.valid.eq(nonempty),
            self.o.payload.eq(pick(entries[0], entries[1])),
            push.eq(self.i.valid & ~full),
            pop.eq(nonempty & self.o.ready),
        ]
        for r in rps[1:]:
            m.d.sync += r.eq(r ^ pop)
        # next values: the pointers, and the occupancy (0, 1 or 2 items) as its two compares;
        # each computed for both values of the consumer's ``o.ready`` (usually the end of its
        # stall logic), which selects at the end
        wp_n, full_n, nonempty_n = Signal(), Signal(), Signal()

        def occupancy(ready: bool):
            pop_r = nonempty if ready else Const(0, 1)
            return (Mux(push & ~pop_r, nonempty, Mux(pop_r & ~push, 0, full)),
                    Mux(push & ~pop_r, 1, Mux(pop_r & ~push, full, nonempty)))
        (full_1, nonempty_1), (full_0, nonempty_0) = occupancy(True), occupancy(False)
        m.d.comb += [
            wp_n.eq(wp ^ push),
            full_n.eq(Mux(self.o.ready, full_1, full_0)),
            nonempty_n.eq(Mux(self.o.ready, nonempty_1, nonempty_0)),
        ]
        m.d.sync += [wp.eq(wp_n), rp.eq(rp ^ pop), full.eq(full_n), nonempty.eq(nonempty_n)]
        if self.peek:
            # the item behind the head (``SkidBuffer``'s ``peek``): the other entry while both
            # hold one (then ``wp == rp``), else the input
            m.d.comb += [
                self.peek_valid.eq(full | self.i.valid),
                self.peek_payload.eq(Mux(full, pick(entries[1], entries[0]),
                                         Value.cast(self.i.payload))),
            ]
        # ``load[k]``: entry ``k`` is free on this cycle (see the class docstring); with both
        # entries free, the one ``wp`` names takes the item and the other's copy is unused
        load = [Signal(name=f"load{k}", init=1) for k in range(2)]
        for k in range(2):
            m.d.sync += load[k].eq(Mux(self.o.ready,
                                       Mux(wp_n == k, ~full_1, ~nonempty_1),
                                       Mux(wp_n == k, ~full_0, ~nonempty_0)))
            with m.If(load[k]):
                m.d.sync += entries[k].eq(self.i.payload)
        return m


class _QueueComponent(wiring.Component):
    """The interface subset of :class:`amaranth.lib.fifo.SyncFIFO` that the queues below
    share: ``width``-bit entries, ``depth`` entries (at least ``min_depth``), write, read and
    level."""

    def __init__(self, *, width: int, depth: int, extra: dict | None = None, min_depth: int = 2):
        self.width = check_int("width", width, minimum=1)
        self.depth = check_int("depth", depth, minimum=min_depth)
        super().__init__({
            "w_data": In(width), "w_en": In(1), "w_rdy": Out(1),
            "r_data": Out(width), "r_en": In(1), "r_rdy": Out(1),
            "level": Out(range(depth + 1)),
            **(extra or {}),
        })


class HeadFIFO(_QueueComponent):
    """A first-word-fall-through queue like :class:`amaranth.lib.fifo.SyncFIFO` (same
    interface subset and same cycles: an entry written at one edge can be read from the next
    cycle on, ``w_rdy`` is ``level != depth``), whose head (``r_data``, ``r_rdy``) is a
    register: the entries behind the head sit in a ``depth - 1`` entry ``SyncFIFO`` (LUT RAM)
    whose read feeds only the head register, and a write into an empty queue goes straight
    to the head. The logic the head steers starts from flip-flops, not from a LUT RAM read.

    ``write_on_room``: the entries behind the head in a memory written on every cycle it has
    room (at the write pointer, a free entry that no read sees until ``w_en`` steps the
    pointer past it), so that the memory's write enable, which reaches every memory cell, is
    the compare of a registered level and not the writer's ``w_en`` (the end of its decision:
    ``cache_nic``'s fill queue, behind the back-port sequencer, 8.05 ns); ``w_en`` steps the
    pointer and the level only. The same cycles and contents as without it.
    """

    def __init__(self, *, width: int, depth: int, write_on_room: bool = False):
        self.write_on_room = bool(write_on_room)
        super().__init__(width=width, depth=depth)

    def elaborate(self, platform):
        m = Module()
        if self.write_on_room:
            m.submodules.inner = inner = _RoomWrittenFIFO(width=self.width,
                                                           depth=self.depth - 1)
        else:
            m.submodules.inner = inner = SyncFIFO(width=self.width, depth=self.depth - 1)
        head_valid = Signal()
        head = Signal(self.width)
        free = ~head_valid | self.r_en          # the head is empty or read this cycle
        bypass = free & ~inner.r_rdy & self.w_en
        m.d.comb += [
            self.r_data.eq(head), self.r_rdy.eq(head_valid),
            self.w_rdy.eq(inner.w_rdy),
            self.level.eq(inner.level + head_valid),
            inner.w_data.eq(self.w_data),
            inner.w_en.eq(self.w_en & ~bypass),
            inner.r_en.eq(free),
        ]
        with m.If(free):
            m.d.sync += [head_valid.eq(inner.r_rdy | self.w_en),
                         head.eq(Mux(inner.r_rdy, inner.r_data, self.w_data))]
        return m


class _RoomWrittenFIFO(_QueueComponent):
    """:class:`amaranth.lib.fifo.SyncFIFO`'s interface subset and cycles (``depth`` >= 1
    entries in LUT RAM, read combinationally at the read pointer), its memory written at the
    write pointer on every cycle the queue has room (:class:`HeadFIFO`'s ``write_on_room``);
    ``w_en`` (with room) steps the write pointer and the level."""

    def __init__(self, *, width: int, depth: int):
        super().__init__(width=width, depth=depth, min_depth=1)

    def elaborate(self, platform):
        m = Module()
        m.submodules.storage = storage = Memory(shape=self.width, depth=self.depth, init=[])
        w_port = storage.write_port()
        r_port = storage.read_port(domain="comb")
        produce = Signal(range(self.depth))
        consume = Signal(range(self.depth))
        do_write, do_read = Signal(), Signal()

        def step(ptr):
            return Mux(ptr == self.depth - 1, 0, ptr + 1)
        m.d.comb += [
            self.w_rdy.eq(self.level != self.depth), self.r_rdy.eq(self.level != 0),
            do_write.eq(self.w_en & self.w_rdy), do_read.eq(self.r_en & self.r_rdy),
            w_port.addr.eq(produce), w_port.data.eq(self.w_data), w_port.en.eq(self.w_rdy),
            r_port.addr.eq(consume), self.r_data.eq(r_port.data),
        ]
        with m.If(do_write):
            m.d.sync += produce.eq(step(produce))
        with m.If(do_read):
            m.d.sync += consume.eq(step(consume))
        m.d.sync += self.level.eq(self.level + do_write - do_read)
        return m


class CreditLUTFIFO(_QueueComponent):
    """A first-word-fall-through queue in LUT RAM for a writer that keeps count of its room
    (credits): the interface subset and cycles of :class:`amaranth.lib.fifo.SyncFIFO` of the
    same ``depth`` (``r_data`` read combinationally at the read pointer; an entry written at
    one edge can be read from the next cycle on; ``r_rdy``, ``w_rdy`` and ``level`` identical
    on every cycle) as long as the writer keeps the contract: no ``w_en`` on a cycle where
    ``w_rdy`` is low (a write then overwrites an unread entry).

    As in :class:`CreditFIFO`, the memory's write enable and the write pointer's step are
    ``w_en`` alone, not ``w_en`` gated by the level's compare, a net that reaches every
    memory cell (the gather's output queue: its level, the compare, then 6.4 ns of routing
    into the LUT RAM's write enable, 8.03 ns); ``r_rdy`` is a flip-flop (its next value from
    the level's compares, chosen by the write and the read) instead of a compare of the
    level. ``read_copies``: the memory in that many memories of an equal share of the
    entry's bits, each read and written at its own copies of the read and write pointers
    (kept apart by the FPGA flow, :data:`KEEP_COPY_ATTR`; the same values on every cycle), so
    that no one pointer's net reaches the address of every memory cell of a wide entry (the
    gather's output queue: its read pointer through the LUT RAM into the output slice,
    8.71 ns, 7.7 of it routing; then, with copies of the read pointer only, its write
    pointer into the LUT RAM, 8.47 ns, 7.3 of routing).
    """

    def __init__(self, *, width: int, depth: int, read_copies: int = 1):
        self.read_copies = check_int("read_copies", read_copies, minimum=1)
        super().__init__(width=width, depth=depth, min_depth=1)

    def elaborate(self, platform):
        m = Module()
        n = min(self.read_copies, self.width)
        bounds = [self.width * j // n for j in range(n + 1)]
        produce = Signal(range(self.depth))
        consume = Signal(range(self.depth))
        consumes = [consume] + [Signal(range(self.depth), name=f"consume_copy{j}",
                                       attrs={KEEP_COPY_ATTR: "1"}) for j in range(1, n)]
        produces = [produce] + [Signal(range(self.depth), name=f"produce_copy{j}",
                                       attrs={KEEP_COPY_ATTR: "1"}) for j in range(1, n)]
        do_read = Signal()

        def step(p):
            if self.depth == 1:
                return Const(0, len(p))
            if self.depth & (self.depth - 1):
                return Mux(p == self.depth - 1, 0, p + 1)
            return (p + 1)[:len(p)]
        for j, ((lo, hi), c, p) in enumerate(zip(zip(bounds, bounds[1:]), consumes, produces)):
            storage = Memory(shape=hi - lo, depth=self.depth, init=[])
            m.submodules["storage" if n == 1 else f"storage{j}"] = storage
            w_port = storage.write_port()
            r_port = storage.read_port(domain="comb")
            m.d.comb += [
                w_port.addr.eq(p), w_port.data.eq(self.w_data[lo:hi]),
                w_port.en.eq(self.w_en),
                r_port.addr.eq(c), self.r_data[lo:hi].eq(r_port.data),
            ]
        m.d.comb += [self.w_rdy.eq(self.level != self.depth),
                     do_read.eq(self.r_en & self.r_rdy)]
        with m.If(self.w_en):
            m.d.sync += [p.eq(step(p)) for p in produces]
        with m.If(do_read):
            m.d.sync += [c.eq(step(c)) for c in consumes]
        m.d.sync += [
            self.level.eq(self.level + self.w_en - do_read),
            self.r_rdy.eq(Mux(self.w_en, 1, Mux(do_read, self.level != 1, self.level != 0))),
        ]
        return m


class DelayLine(wiring.Component):
    """``o`` is ``i`` of ``latency`` cycles before (2..16), every cycle (no enable), kept in
    LUT RAM instead of ``latency`` registers of ``width`` bits: a 16-entry memory written on
    every cycle at a free-running pointer and read asynchronously ``latency - 1`` entries
    behind it into an output register. On ECP5 a 16 x 4-bit LUT RAM cell (with its output
    bits' registers) holds what 16 x 4 flip-flops would; the gather's values that wait beside
    its multipliers are ``32 x lanes`` bits for 11 cycles (over 5,000 flip-flops each at 16
    lanes). ``copies``: the memory in that many memories of an equal share of the bits, each
    with its own pointers (kept apart by the FPGA flow, :data:`KEEP_COPY_ATTR`), so that no
    one pointer's net reaches every memory cell. After a reset ``o`` shows stale values for
    ``latency`` cycles (a caller's valid, delayed in registers, says which to use)."""

    def __init__(self, *, width: int, latency: int, copies: int = 1):
        self.width = check_int("width", width, minimum=1)
        self.latency = check_int("latency", latency, minimum=2, maximum=16)
        self.copies = check_int("copies", copies, minimum=1)
        super().__init__({"i": In(width), "o": Out(width)})

    def elaborate(self, platform):
        m = Module()
        n = min(self.copies, self.width)
        bounds = [self.width * j // n for j in range(n + 1)]
        out = Signal(self.width, name="o_reg", reset_less=True)
        for j, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            attrs = {KEEP_COPY_ATTR: "1"} if j else {}
            wp = Signal(4, name=f"wp{j}", attrs=attrs)
            rp = Signal(4, name=f"rp{j}", init=(1 - self.latency) % 16, attrs=attrs)
            mem = Memory(shape=hi - lo, depth=16, init=[],
                         attrs={"ram_style": "distributed"})
            m.submodules[f"mem{j}"] = mem
            w_port = mem.write_port()
            r_port = mem.read_port(domain="comb")
            m.d.comb += [w_port.addr.eq(wp), w_port.data.eq(self.i[lo:hi]), w_port.en.eq(1),
                         r_port.addr.eq(rp)]
            m.d.sync += [wp.eq(wp + 1), rp.eq(rp + 1), out[lo:hi].eq(r_port.data)]
        m.d.comb += self.o.eq(out)
        return m


class CreditFIFO(_QueueComponent):
    """A first-word-fall-through queue for a writer that keeps count of its room (credits).

    Interface and cycles are those of :class:`amaranth.lib.fifo.SyncFIFOBuffered` of the same
    ``depth`` (``depth - 1`` entries in memory with a synchronous read port, block-RAM
    compatible, and the head in the read port's register; ``r_data``, ``r_rdy``, ``level``
    and ``w_rdy`` identical on every cycle) as long as the writer keeps the contract: no
    ``w_en`` on a cycle where ``w_rdy`` is low. The difference is the write: the memory's
    write enable and the write pointer's step are ``w_en`` alone, where ``SyncFIFOBuffered``
    gates them with ``w_rdy`` (a compare of the level). Why: a writer that must never lose an
    entry checks room ahead anyway (a registered test of ``level`` against a reserve for what
    is in flight), so the queue's own full check only puts the level compare in front of the
    write enable, a net that reaches every memory cell (on the depacketizer's payload queue:
    the level, the compare, then about 6 ns of routing to 124 LUT-RAM cells, its critical
    path at 124.9 MHz). A write on a cycle where ``w_rdy`` is low overwrites an unread entry.

    The memory is never read at the address written in the same cycle (a read needs an entry
    in memory, a write a free slot, and the two pointers are equal only when it is empty or
    full), but it is not marked :data:`COLLISION_X_ATTR`: marked, yosys moved the 16 B
    depacketizer's payload queue (43 x 128 bits) from LUT RAM into four DP16KD whose read data,
    unregistered, feed the drain's logic, and that netlist's first place and route had not
    finished routing after 520 CPU-s (stopped; not measured further). Unmarked, a shallow queue
    stays in LUT RAM with its read register beside the logic, as before.

    ``registered_w_rdy``: ``w_rdy`` from a flip-flop (its next value from the level's
    compares, chosen by the write and the read), the same on every cycle, so that a writer
    whose enable waits for ``w_rdy`` does not put the level's compare in the loop from the
    level through the write enable back into the level (the gather's row queue: 8.2 ns).
    With it, the memory is written on every cycle the queue has room (at the write pointer,
    an entry no read will see until ``w_en`` steps the pointer past it), so that its write
    enable, which reaches every memory cell, is that flip-flop and not the writer's ``w_en``
    (the end of the writer's stall logic); ``w_en`` then steps the pointer and the level
    only, and a write while ``w_rdy`` is low is lost instead of overwriting an entry.

    ``read_copies``: the memory in that many memories of an equal share of the entry's bits,
    each read at its own copy of the read pointer (kept apart by the FPGA flow,
    :data:`KEEP_COPY_ATTR`; the same values on every cycle), so that no one pointer's net
    reaches the read address of every memory cell of a wide entry.

    ``read_ahead``: two more outputs, ``r_rdy_next`` and ``r_data_next``, what ``r_rdy`` and
    ``r_data`` will be on the next cycle (given this cycle's ``r_en``; a write on this cycle
    never reaches them by then), so that a reader can keep a flag of its own a cycle ahead.
    The memory is then read asynchronously (LUT RAM) into a register of its own, with the
    same contents on every cycle as the synchronous read port's.
    """

    def __init__(self, *, width: int, depth: int, registered_w_rdy: bool = False,
                 read_copies: int = 1, read_ahead: bool = False):
        self.registered_w_rdy = bool(registered_w_rdy)
        self.read_copies = check_int("read_copies", read_copies, minimum=1)
        self.read_ahead = bool(read_ahead)
        if self.read_ahead and self.read_copies != 1:
            raise ValueError("read_ahead: expected read_copies=1 with it")
        super().__init__(width=width, depth=depth,
                         extra={"r_rdy_next": Out(1), "r_data_next": Out(width)}
                         if self.read_ahead else None)

    def elaborate(self, platform):
        m = Module()
        inner = self.depth - 1
        n = min(self.read_copies, self.width)
        bounds = [self.width * j // n for j in range(n + 1)]
        ports = []
        for j, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            storage = Memory(shape=hi - lo, depth=inner, init=[])
            m.submodules["storage" if n == 1 else f"storage{j}"] = storage
            w_port = storage.write_port()            # (the names the ports take)
            r_port = storage.read_port(domain="comb" if self.read_ahead else "sync")
            ports.append((lo, hi, w_port, r_port))
        produce = Signal(range(inner))
        consume = Signal(range(inner))
        # the read pointer's copies (``read_copies``), one per memory
        consumes = [consume] + [Signal(range(inner), name=f"consume_copy{j}",
                                       attrs={KEEP_COPY_ATTR: "1"}) for j in range(1, n)]
        inner_level = Signal(range(inner + 1))
        # ``inner_level != 0`` kept as a flip-flop (next value from the level's compares,
        # chosen by the write and the read), so that the read's enable, which reaches every
        # bit of the read register, is one LUT from flip-flops
        inner_r_rdy = Signal()
        do_inner_read = inner_r_rdy & (~self.r_rdy | self.r_en)

        def step(p):
            return Mux(p == inner - 1, 0, p + 1) if inner & (inner - 1) else (p + 1)[:len(p)]

        if self.registered_w_rdy:
            w_rdy = Signal(init=1, name="w_rdy_r")
            m.d.sync += w_rdy.eq(Mux(self.w_en & ~do_inner_read, inner_level != inner - 1,
                                     Mux(do_inner_read & ~self.w_en, 1, inner_level != inner)))
        else:
            w_rdy = inner_level != inner
        m.d.comb += self.w_rdy.eq(w_rdy)
        for (lo, hi, w_port, r_port), c in zip(ports, consumes):
            whole = n == 1
            m.d.comb += [
                w_port.addr.eq(produce),
                w_port.data.eq(self.w_data if whole else self.w_data[lo:hi]),
                w_port.en.eq(w_rdy if self.registered_w_rdy else self.w_en),
                r_port.addr.eq(c),
            ]
            if self.read_ahead:
                # the read register, loaded as the synchronous port's data register is
                r_reg = Signal(self.width, name="r_data_reg", reset_less=True)
                with m.If(do_inner_read):
                    m.d.sync += r_reg.eq(r_port.data)
                m.d.comb += [self.r_data.eq(r_reg),
                             self.r_data_next.eq(Mux(do_inner_read, r_port.data, r_reg))]
            else:
                m.d.comb += [r_port.en.eq(do_inner_read),
                             (self.r_data if whole else self.r_data[lo:hi]).eq(r_port.data)]
        m.d.comb += self.level.eq(inner_level + self.r_rdy)
        with m.If(self.w_en):
            m.d.sync += produce.eq(step(produce))
        with m.If(do_inner_read):
            m.d.sync += [c.eq(step(c)) for c in consumes]
        with m.If(self.w_en & ~do_inner_read):
            m.d.sync += inner_level.eq(inner_level + 1)
        with m.If(do_inner_read & ~self.w_en):
            m.d.sync += inner_level.eq(inner_level - 1)
        m.d.sync += inner_r_rdy.eq(Mux(self.w_en, 1, Mux(do_inner_read, inner_level != 1,
                                                         inner_level != 0)))
        with m.If(do_inner_read):
            m.d.sync += self.r_rdy.eq(1)
        with m.Elif(self.r_en):
            m.d.sync += self.r_rdy.eq(0)
        if self.read_ahead:
            m.d.comb += self.r_rdy_next.eq(Mux(do_inner_read, 1, Mux(self.r_en, 0, self.r_rdy)))
        return m
