"""Set-associative, write-back, non-blocking cache of embedding rows.

The cache sits between a memory-port initiator (the embedding gather/pool unit) and a backing
tier (host DRAM, SSD, a remote node). Both of its sides speak :class:`rtl.streams.MemPortSignature`:
``front`` is the flipped port (the cache answers requests), ``back`` the ordinary port (the cache
issues them), so units stack unchanged.

Organisation
============

One *line* holds one embedding *row*. A row occupies ``line_beats`` beat addresses of the
address space (row ``r`` starts at beat address ``r * line_beats``), of which the first
``row_beats`` (``<= line_beats``) are data and are cached; the cache reads and writes back
exactly ``row_beats`` beats per line. The cache has ``sets`` sets of ``ways`` ways.

Set index of row ``r`` (``s = log2(sets)``):

* ``index="modulo"``: the low ``s`` bits of ``r``.
* ``index="hash"``: the XOR of all ``s``-bit chunks of ``r`` (bits ``0..s-1`` xor bits
  ``s..2s-1`` xor ...). One layer of XOR gates; it spreads strided row sets over all sets,
  which the modulo index maps onto one set. The tag is ``r >> s`` in both cases, from which
  the row is rebuilt for write-backs (``low bits = set xor fold(tag)``).

Replacement, chosen at elaboration (``policy``); a miss fills the lowest-numbered *invalid*
way first, and only a full set evicts:

* ``"lru"``: exact least-recently-used per set. Each way keeps a rank (0 = most recent); an
  access moves its way to rank 0 and ages the ways that were more recent. The victim is the
  way of rank ``ways - 1``.
* ``"lfu"``: a saturating use count of ``lfu_bits`` bits per way. A hit adds one; when the
  hit way's count is already at its maximum, every count of the set is first halved (aging).
  A fill sets the new way's count to 1. The victim is the way with the smallest count, the
  lowest-numbered one on a tie.

Departures from FBGEMM's software cache (see ``shared/REFERENCES.md``): recency is exact and
per access, not a per-batch timestamp (the port has no notion of a batch); no way is locked
for "the current batch" and no miss bypasses the cache; LFU counts only resident rows (FBGEMM
counts every row of the table, which hardware cannot hold) and so admits every missed row
instead of comparing its count with the victim's; counts saturate and age by halving; the
set hash is the XOR fold above, and ``sets`` must be a power of two.

Requests
========

A front request must lie inside one row: with ``off = addr % line_beats``, it needs
``beats >= 1`` and ``off + beats <= row_beats``. Any other request is an *error*: it changes
no state, counts in ``stats.errors``, and still completes by the port's rules (a read returns
``beats`` beats of zeros, a write's data beats are consumed and dropped; a zero-beat request
is dropped), so nothing hangs. ``error`` stays high from the first error on.

Writes are write-back and write-allocate: a write miss fetches the row, then merges the
written bytes (per the byte mask); a written line is dirty and is written back to ``back``
when evicted or flushed.

Organisation for NIC sizes
==========================

The tag store (valid, dirty, tag and replacement state of every way of a set: one word per
set) is a block RAM with one read and one write port. The lines are not in the controller:
it reads and writes them through its ``lines`` port (the same memory-port contract as
``front`` and ``back``, :class:`rtl.streams.MemPortSignature`), so a cache of tens of MiB
keeps its lines in the card's DRAM/HBM and only its tags on chip (a 64 MiB cache of 512 B
rows, 8 ways, is 16,384 sets of 8 state words). Line ``(set, way)`` occupies beat addresses
``((set << ceil(log2(ways))) | way) << log2(line_beats)`` onwards of that port. The small
configuration (the RTL SmartNIC top, fast tests) is :class:`OnChipCache`: the controller with
a :class:`LineRAM` (one block RAM) answering its ``lines`` port.

A tag store of thousands of sets spans many block RAMs, so two things change with its size
(both elaboration parameters; ``sim.units.cache.nic_cache_params`` sets them for the NIC
presets):

* the store is split into slices of ``tag_slice_sets`` sets (default 512, one ECP5 DP16KD
  deep at its 36-bit port), each read on every lookup into a register of its own (which the
  FPGA flow maps into the block RAM's output register), the slice chosen by the set's high
  bits behind those registers. A single memory that deep is cascaded in depth by synthesis,
  its block RAMs' unregistered outputs multiplexed before any register;
* ``compare_stages=2``: the per-way compare (:class:`WayMatch`: valid and tag equal, invalid,
  least recent, each from its own way's state) ends at registers, and the set-wide choice
  (:class:`WayChoose`: the hit's OR, the priority encoders of hit, invalid and victim ways)
  runs in a stage of its own. A request of the set one or two places ahead then waits in
  stage 1 until that one's update can be forwarded (see Timing).

* the state travels through the lookup in *way slices*: each way's part of its bank's
  memory and output register (a bank is ``bank_ways`` ways with a memory of their own per
  slice), its forwarding of stage 3's updates, its compare, its registered words of the
  later stages and its update are one slice, whose enables and selects the slice computes
  from its own copies of the lookup's control registers (stage valids, stage 3's resource
  flags and pins, stage 1's set-equality flags with the stages ahead). Each slice keeps its
  copies by the central registers' rules, its own moves and stall choosing, so every slice
  moves exactly as the central control does, and no select or enable of the wide words is
  one net to every way (the 864
  bits of a 32-way set word behind ~1,000-load enables did not route on an ECP5; one copy now
  drives one way's 27 bits). The FPGA flow keeps the copies (:data:`KEEP_COPY_ATTR`).

Sizes, for the record: the smartnic preset's 64 MiB of 512 B rows in 8 ways is 16,384 sets
of 8 way states of 23 bits (18-bit tag from the preset's 1,472 GiB of host DRAM per node,
valid, dirty, a 3-bit LRU rank): 3,014,656 bits, at least 164 DP16KD of 18 Kibit (192 as
banks of 4 ways, whose 92-bit words take three 512 x 36 blocks per slice), 79-92% of an
LFE5U-85F's 208. (At the 32 ways it had before: 4,096 sets of 27-bit states, 3,538,944 bits,
192 DP16KD whatever their shape.)

Timing
======

* The lookup pipeline accepts one request per cycle. Cycle 0: the request is accepted and
  the state word of its set is read from block RAM (no bypass). Cycle 1: the word is
  registered. Cycle 2: tags compared, the way chosen (hit way or victim), a row still in
  flight found (MSHR merge), all registered. Cycle 3: the new state word is written back,
  resources are checked and the operation queued. A request of the same set as the one
  right ahead of it waits one cycle in stage 1 (the word being computed in stage 3 is never
  forwarded into the compare in the same cycle); stage 3's update is forwarded to stage 1
  and into the word stage 2 takes, so outcomes are those of one request at a time.
  With ``compare_stages=2`` cycle 2 compares (per-way flags registered) and cycle 3 chooses
  the way and finds the MSHR; the update is in cycle 4 (``lookup_stages``: 4). A request
  waits in stage 1 while one of its set is in either compare stage or has not left the last
  (right behind one of its set: two cycles; one place behind: one).
* Data are delivered in request order: the executor takes the queued operations in order
  into its register (stage 3's own operation in the cycle it is looked up when nothing is
  queued and the register is free or leaving) and issues each as one request on ``lines`` (a read's beats go to
  ``front.resp``, a write's data come from a buffer of ``front.wdata``). The line port
  serves the executor first, then fills (a missed row's beats from ``back.resp``, written to
  its line), then write-backs (a victim read from its line, its beats sent to
  ``back.wdata``); a route FIFO per direction says where each transfer's beats go, so the
  line memory may have up to ``line_outstanding`` reads in flight. With the on-chip
  :class:`LineRAM` (latency 3) a hit's first beat is valid 8 cycles after it is accepted.
* Misses are non-blocking: each holds one of ``mshrs`` miss-status holding registers until
  its row has been written to its line. Later requests keep being looked up: hits under
  misses, and requests for a row already in flight are *merged* into it (no second fetch).
  Their operations wait in the in-order queue (``queue_depth`` operations) behind the miss.
* A miss writes a dirty victim back (write request + ``row_beats`` beats read from its line),
  then requests the new row; back-port requests leave in lookup order.
* The lookup stalls (``front.req.ready`` low) when the queue is full, when a miss finds no
  free MSHR, or when the chosen victim still has an operation to issue (it is in use by an
  earlier request). Stalls delay lookups but never change their outcome: hit, miss or merge
  and the replacement state depend only on the order of requests (see
  ``sim/reference/cache.py`` for the exact statement).

Commands
========

``cmd`` (a stream of :class:`CacheOp`) takes one command at a time; the cache stops taking
front requests while ``cmd.valid`` is high, finishes every accepted request, runs the
command, and accepts the command (``cmd.ready``) only when it has completed:

* ``FLUSH``: every dirty line is written back and marked clean (complete when the last
  write-back's request and data have been handed to ``back``; writes are posted).
* ``INVALIDATE``: every line is dropped (dirty data are discarded: flush first to keep
  them) and the replacement state returns to its initial value.

Reset clears the pipeline, not the tag store: issue ``INVALIDATE`` after a reset that
interrupted traffic.

Observation
===========

``lookup_valid``/``lookup_kind`` pulse once per looked-up request (in request order) with
its :class:`LookupKind`; ``stats`` holds counters (hits, misses, merged misses, evictions of
valid lines, write-backs, errors); ``idle`` is high when nothing is in flight.
"""

from __future__ import annotations

from math import gcd

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2, exact_log2

from .streams import (COLLISION_X_ATTR, KEEP_COPY_ATTR, CreditFIFO, HeadFIFO, MemPortSignature, SkidBuffer,
                      check_int)

__all__ = ["lowest_one", "at_least_two", "one_hot_index",
           "CacheOp", "LookupKind", "CacheStats", "WayMatch", "WayChoose", "WaySelect",
           "StateUpdate", "CacheController",
           "LineRAM", "OnChipCache"]



class CacheOp(enum.Enum, shape=1):
    """A maintenance command on the ``cmd`` stream."""

    FLUSH = 0
    INVALIDATE = 1


class LookupKind(enum.Enum, shape=2):
    """The outcome of one looked-up request."""

    HIT = 0
    MISS = 1
    MERGED = 2
    ERROR = 3


class CacheStats(data.StructLayout):
    """Statistics counters (each ``width`` bits, wrapping)."""

    FIELDS = ("hits", "misses", "merged", "evictions", "writebacks", "errors")

    def __init__(self, width: int = 32):
        super().__init__({name: unsigned(width) for name in self.FIELDS})


def _xor_fold(value, width: int, chunk: int):
    """XOR of the ``chunk``-bit pieces of a ``width``-bit value (zero-extended)."""
    if chunk == 0:
        return Const(0, 0)
    out = value[:chunk] if width >= chunk else value
    for lo in range(chunk, width, chunk):
        out = out ^ value[lo:min(lo + chunk, width)]
    return out[:chunk] if width >= chunk else out


def lowest_one(vec):
    """The lowest set bit of ``vec`` alone (one-hot, zero if none): bit ``i`` is set when
    ``vec[i]`` is and no bit below it, the ORs below each bit from a parallel prefix
    (``log2(len)`` levels of 2-input ORs), where a priority ``If`` chain (or the carry of
    ``vec & -vec``, which synthesis may lay out as a ripple of LUTs) would be as deep as the
    vector is long."""
    n = len(vec)
    ors = [vec[i] for i in range(n)]          # ors[i]: OR of vec[0..i], by doubling spans
    span = 1
    while span < n:
        ors = [ors[i] | ors[i - span] if i >= span else ors[i] for i in range(n)]
        span *= 2
    return Cat(vec[0], *[vec[i] & ~ors[i - 1] for i in range(1, n)])


def at_least_two(vec):
    """Whether two or more bits of ``vec`` are set: a balanced tree over (any, two or more)
    pairs, ``log2(len)`` levels, not a count."""
    pairs = [(vec[i], Const(0, 1)) for i in range(len(vec))]
    while len(pairs) > 1:
        nxt = [(a1 | b1, a2 | b2 | (a1 & b1))
               for (a1, a2), (b1, b2) in zip(pairs[::2], pairs[1::2])]
        if len(pairs) % 2:
            nxt.append(pairs[-1])
        pairs = nxt
    return pairs[0][1]


def one_hot_index(onehot, width: int):
    """The index of the set bit of a one-hot (or zero) vector: each index bit the OR of the
    positions that have it, a tree of ORs of half the vector."""
    bits = []
    for k in range(width):
        terms = [onehot[i] for i in range(len(onehot)) if (i >> k) & 1]
        bits.append(Cat(*terms).any() if terms else Const(0, 1))
    return Cat(*bits)


def _argmin_tree(items):
    """The (value, index) pair of the smallest value among ``items`` as a log-depth tree of
    compares (the earlier item wins a tie), for a replacement policy's victim by rank."""
    if len(items) == 1:
        return items[0]
    half = len(items) // 2
    (va, ia), (vb, ib) = _argmin_tree(items[:half]), _argmin_tree(items[half:])
    take_b = vb < va
    return Mux(take_b, vb, va), Mux(take_b, ib, ia)


def _replacement_policy(component, policy: str) -> str:
    """``policy``, checked: ``lru`` or ``lfu`` (a refused design is not an unused one)."""
    if policy not in ("lru", "lfu"):
        component._MustUse__silence = True
        raise ValueError(f"policy: expected 'lru' or 'lfu', got {policy!r}")
    return policy


class WayMatch(wiring.Component):
    """The per-way half of the lookup's decision (combinational, one slice per way).

    Ports: ``word`` (in, the set's :class:`data.ArrayLayout` of way states), ``tag`` (in);
    ``hit_vec`` (way ``w`` valid and holding ``tag``), ``inv_vec`` (way ``w`` invalid) and
    ``old_vec`` (LRU: way ``w`` has rank ``ways - 1``, the least recent; LFU: zero, its
    victim needs every count). Each bit depends on its own way's state only, so in a banked
    tag store it is computed beside that way's block RAM and only the flags travel on.
    """

    def __init__(self, *, way_layout: data.StructLayout, ways: int, policy: str):
        policy = _replacement_policy(self, policy)
        self.ways, self.policy, self.way_layout = ways, policy, way_layout
        super().__init__({
            "word": In(data.ArrayLayout(way_layout, ways)),
            "tag": In(way_layout.members["tag"]),
            "hit_vec": Out(ways),
            "inv_vec": Out(ways),
            "old_vec": Out(ways),
        })

    @staticmethod
    def way_flags(state, tag, *, ways: int, policy: str):
        """One way's flags from its own state alone: (hit, invalid, least recent); the rule
        every way of :class:`WayMatch` applies, and each way slice of the controller."""
        old = (state.repl == ways - 1) if policy == "lru" else Const(0, 1)
        return state.valid & (state.tag == tag), ~state.valid, old

    def elaborate(self, platform):
        m = Module()
        W, word = self.ways, self.word
        flags = [self.way_flags(word[w], self.tag, ways=W, policy=self.policy)
                 for w in range(W)]
        m.d.comb += [self.hit_vec.eq(Cat(f[0] for f in flags)),
                     self.inv_vec.eq(Cat(f[1] for f in flags)),
                     self.old_vec.eq(Cat(f[2] for f in flags))]
        return m


class WayChoose(wiring.Component):
    """The set-wide half of the lookup's decision (combinational), from :class:`WayMatch`'s
    flags: ``hit`` and ``hit_way`` (the lowest way of ``hit_vec``), ``victim`` (the lowest
    invalid way, else the policy's: LRU the lowest way of ``old_vec``, LFU the smallest count
    of ``word``, lowest way on a tie) and ``victim_state`` (that way's state in ``word``);
    ``hit_oh`` and ``victim_oh`` are the two ways one-hot."""

    def __init__(self, *, way_layout: data.StructLayout, ways: int, policy: str):
        policy = _replacement_policy(self, policy)
        self.ways, self.policy, self.way_layout = ways, policy, way_layout
        way_bits = max(1, ceil_log2(ways))
        super().__init__({
            "word": In(data.ArrayLayout(way_layout, ways)),
            "hit_vec": In(ways),
            "inv_vec": In(ways),
            "old_vec": In(ways),
            "hit": Out(1),
            "hit_way": Out(way_bits),
            "victim": Out(way_bits),
            "victim_state": Out(way_layout),
            "hit_oh": Out(ways),
            "victim_oh": Out(ways),
        })

    def elaborate(self, platform):
        m = Module()
        W, word = self.ways, self.word
        WB = len(self.hit_way)
        # (one-hot vectors first, their indices from OR trees: no priority chain of W muxes)
        hit_oh, inv_oh = Signal(W), Signal(W)
        m.d.comb += [self.hit.eq(self.hit_vec.any()), hit_oh.eq(lowest_one(self.hit_vec)),
                     inv_oh.eq(lowest_one(self.inv_vec)), self.hit_oh.eq(hit_oh),
                     self.hit_way.eq(one_hot_index(hit_oh, WB))]
        inv_way = Signal(WB)
        m.d.comb += inv_way.eq(one_hot_index(inv_oh, WB))
        policy_way = Signal(WB)
        if self.policy == "lru":
            old_oh = Signal(W)
            m.d.comb += [old_oh.eq(lowest_one(self.old_vec)),
                         policy_way.eq(one_hot_index(old_oh, WB)),
                         self.victim_oh.eq(Mux(self.inv_vec.any(), inv_oh, old_oh))]
        else:
            _, best = _argmin_tree([(word[w].repl, Const(w, WB)) for w in range(W)])
            m.d.comb += [policy_way.eq(best),
                         self.victim_oh.eq(Mux(self.inv_vec.any(), inv_oh,
                                               (Const(1, W) << best)[:W]))]
        m.d.comb += [
            self.victim.eq(Mux(self.inv_vec.any(), inv_way, policy_way)),
            self.victim_state.eq(Array(word[w].as_value() for w in range(W))[self.victim]),
        ]
        return m


class WaySelect(wiring.Component):
    """The lookup's decision over one set's state word (combinational): :class:`WayMatch`
    and :class:`WayChoose` in one.

    Ports: ``word`` (in, the set's :class:`data.ArrayLayout` of way states), ``tag`` (in);
    ``hit`` and ``hit_way`` (the lowest valid way holding ``tag``), ``victim`` (the lowest
    invalid way, else the replacement policy's choice: LRU the way of rank ``ways - 1``, LFU
    the smallest count, lowest way on a tie) and ``victim_state`` (that way's state).
    """

    def __init__(self, *, way_layout: data.StructLayout, ways: int, policy: str):
        policy = _replacement_policy(self, policy)
        self.ways, self.policy, self.way_layout = ways, policy, way_layout
        way_bits = max(1, ceil_log2(ways))
        super().__init__({
            "word": In(data.ArrayLayout(way_layout, ways)),
            "tag": In(way_layout.members["tag"]),
            "hit": Out(1),
            "hit_way": Out(way_bits),
            "victim": Out(way_bits),
            "victim_state": Out(way_layout),
        })

    def elaborate(self, platform):
        m = Module()
        kw = dict(way_layout=self.way_layout, ways=self.ways, policy=self.policy)
        m.submodules.match = match = WayMatch(**kw)
        m.submodules.choose = choose = WayChoose(**kw)
        m.d.comb += [match.word.eq(self.word), match.tag.eq(self.tag),
                     choose.word.eq(self.word), choose.hit_vec.eq(match.hit_vec),
                     choose.inv_vec.eq(match.inv_vec), choose.old_vec.eq(match.old_vec),
                     self.hit.eq(choose.hit), self.hit_way.eq(choose.hit_way),
                     self.victim.eq(choose.victim), self.victim_state.eq(choose.victim_state)]
        return m


class StateUpdate(wiring.Component):
    """The set's next state word after one lookup (combinational).

    Ports: ``word`` (in), ``hit`` (in), ``sel`` (in: the hit way, or the victim on a miss),
    ``write`` (in: the request writes), ``tag`` (in: the missed row's tag); ``new_word``
    (out). LRU: ``sel`` becomes rank 0 and the ways more recent than it age by one. LFU: a
    hit adds one to ``sel``'s count, after halving every count of the set if ``sel``'s was
    saturated; a fill sets ``sel``'s count to 1. A hit marks ``sel`` dirty on a write; a miss
    makes ``sel`` valid with ``tag``, dirty if the request writes.

    With ``given_sel=True`` the selected way also comes as ``sel_oh`` (one-hot) and its
    replacement state as ``sel_repl`` (both in; they must agree with ``sel`` and ``word``):
    a stage ahead can register them, so no way multiplexer and no compare with ``sel`` lie
    on the update's path.
    """

    def __init__(self, *, way_layout: data.StructLayout, ways: int, policy: str,
                 lfu_bits: int = 8, given_sel: bool = False):
        policy = _replacement_policy(self, policy)
        self.ways, self.policy, self.lfu_bits = ways, policy, lfu_bits
        self.given_sel = given_sel
        members = {
            "word": In(data.ArrayLayout(way_layout, ways)),
            "hit": In(1),
            "sel": In(max(1, ceil_log2(ways))),
            "write": In(1),
            "tag": In(way_layout.members["tag"]),
            "new_word": Out(data.ArrayLayout(way_layout, ways)),
        }
        if given_sel:
            members.update(sel_oh=In(ways), sel_repl=In(way_layout.members["repl"]))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        W, word, new_word, hit = self.ways, self.word, self.new_word, self.hit
        if self.given_sel:
            sel_repl, is_sel = self.sel_repl, self.sel_oh
        else:
            sel_repl = Signal.like(word[0].repl)
            is_sel = Signal(W)
            m.d.comb += [sel_repl.eq(Array(word[w].repl for w in range(W))[self.sel]),
                         is_sel.eq(Cat(self.sel == w for w in range(W)))]
        for w in range(W):
            self.way_next(m, word[w], new_word[w], is_sel=is_sel[w], sel_repl=sel_repl,
                          hit=hit, write=self.write, tag=self.tag, policy=self.policy,
                          lfu_bits=self.lfu_bits)
        return m

    @staticmethod
    def way_next(m, old, new, *, is_sel, sel_repl, hit, write, tag, policy: str,
                 lfu_bits: int):
        """Drives ``new`` (comb) with one way's next state from its own state ``old`` and
        what the set's update shares (the selected way's flag ``is_sel`` and replacement
        state ``sel_repl``, ``hit``, ``write``, ``tag``): the rule every way of
        :class:`StateUpdate` applies, and each way slice of the controller."""
        repl_max = (1 << lfu_bits) - 1
        m.d.comb += new.eq(old)
        if policy == "lru":
            with m.If(is_sel):
                m.d.comb += new.repl.eq(0)
            with m.Elif(old.repl < sel_repl):
                m.d.comb += new.repl.eq(old.repl + 1)
        else:
            with m.If(hit):
                aged = Mux(sel_repl == repl_max, old.repl >> 1, old.repl)
                m.d.comb += new.repl.eq(Mux(is_sel, aged + 1, aged))
            with m.Elif(is_sel):
                m.d.comb += new.repl.eq(1)
        with m.If(is_sel):
            with m.If(hit):
                m.d.comb += new.dirty.eq(old.dirty | write)
            with m.Else():
                m.d.comb += [new.valid.eq(1), new.dirty.eq(write), new.tag.eq(tag)]


class LineRAM(wiring.Component):
    """On-chip line memory: one block RAM answering a memory port (the small configuration).

    The cache keeps its lines behind its ``lines`` port; at NIC sizes that port goes to the
    card's DRAM/HBM controller, in small designs (the RTL SmartNIC top, fast tests) to this
    responder. It serves one request at a time, strictly in order, so reads and writes take
    effect in request order: a request is registered when accepted, then served one beat per
    cycle from the next cycle on, the next one from the cycle after the current one's last
    beat. A read beat leaves the block RAM into a register before ``resp`` (``b``, with
    nothing between the two: on an ECP5 the FPGA flow maps it into the DP16KD's own output
    register, ``REGMODE`` ``"OUTREG"``, whose clock-to-output is short, where the unregistered
    output's 5.8 ns at speed grade 6 would leave no room for logic or routing behind it), so
    a read's first beat is valid three cycles after the edge that accepted it (latency 3). One
    request waits behind the one being served (``req.ready`` is a register). The memory has one write port and one read port, so yosys maps it to block RAM.
    Write data ``last`` is not checked (the cache generates it from its own count).

    Port: ``port`` (In(MemPortSignature)), ``depth`` beats (addresses beyond wrap).
    """

    #: cycles from the edge accepting a read to its first beat (the port's latency).
    LATENCY = 3

    def __init__(self, *, data_bytes: int, addr_width: int, beats_width: int,
                 depth: int | None = None):
        sig = MemPortSignature(addr_width=addr_width, beats_width=beats_width,
                               data_bytes=data_bytes)
        self.data_bytes = data_bytes
        self.depth = 2 ** addr_width if depth is None else check_int("depth", depth, minimum=1)
        super().__init__({"port": In(sig)})

    def elaborate(self, platform):
        m = Module()
        p = self.port
        # (`COLLISION_X_ATTR`: a read of the address written in the same cycle happens only
        # while a write is served, and its data are never loaded into `b`)
        m.submodules.mem = mem = Memory(shape=unsigned(8 * self.data_bytes), depth=self.depth,
                                        init=[], attrs={COLLISION_X_ATTR: "1"})
        wr = mem.write_port(granularity=8)
        rd = mem.read_port()
        req_layout = p.req.payload.shape()
        # `cur`: the request being served; `pend`: one accepted behind it. `req.ready` is
        # `pend`'s emptiness (a register), so no response backpressure reaches it.
        cur_valid, pend_valid = Signal(), Signal()
        cur_write = Signal()
        cur_addr = Signal.like(p.req.payload.addr)
        cur_left = Signal.like(p.req.payload.beats)
        pend = Signal(req_layout)
        out_valid = Signal()   # the block RAM's output holds a beat
        out_last = Signal()
        # The response queue: `b`, the only register loaded from the block RAM's output (one
        # flip-flop per output bit), and `s`, an older beat moved out of `b` while `resp`
        # waits; `resp` is `s` when it holds one, else `b` (a mux behind the registers). A
        # beat leaves the block RAM's output when `b` or `s` is empty (registers only:
        # `resp.ready` moves beats between the two and reaches nothing else); one beat per
        # cycle while `resp` takes them.
        b_valid, b_last, s_valid, s_last = Signal(), Signal(), Signal(), Signal()
        # (no reset, no logic in front: `b_data` is the block RAM's output register on ECP5,
        # see the class docstring; a synchronous reset would keep it in the fabric)
        b_data = Signal(8 * self.data_bytes, reset_less=True)
        s_data = Signal(8 * self.data_bytes, reset_less=True)
        b_load, b_pop, s_load = Signal(), Signal(), Signal()
        can_read = Signal()
        step = Signal()
        cur_free = Signal()   # cur takes a new request at the end of this cycle
        m.d.comb += [
            b_load.eq(out_valid & ~(b_valid & s_valid)),
            b_pop.eq(p.resp.valid & p.resp.ready),
            s_load.eq(Mux(s_valid, b_pop, b_valid & ~b_pop)),
            can_read.eq(~out_valid | ~(b_valid & s_valid)),
            p.resp.valid.eq(b_valid | s_valid),
            p.resp.payload.data.eq(Mux(s_valid, s_data, b_data)),
            p.resp.payload.last.eq(Mux(s_valid, s_last, b_last)),
            rd.en.eq(can_read),
            rd.addr.eq(cur_addr),
            wr.addr.eq(cur_addr),
            wr.data.eq(p.wdata.payload.data),
            p.wdata.ready.eq(cur_valid & cur_write),
        ]
        with m.If(b_load):
            m.d.sync += [b_data.eq(rd.data), b_last.eq(out_last)]
        with m.If(s_load):
            m.d.sync += [s_data.eq(b_data), s_last.eq(b_last), s_valid.eq(b_valid)]
        with m.Elif(~s_valid):
            m.d.sync += s_valid.eq(0)
        # `b` keeps its beat only while `s` waits ahead of it
        m.d.sync += b_valid.eq(b_load | (b_valid & s_valid & ~b_pop))
        with m.If(can_read):
            m.d.sync += out_valid.eq(0)
        with m.If(cur_valid):
            with m.If(cur_write):
                with m.If(p.wdata.valid):
                    m.d.comb += [step.eq(1), wr.en.eq(p.wdata.payload.mask)]
            with m.Elif(can_read):
                m.d.comb += step.eq(1)
                m.d.sync += [out_valid.eq(1), out_last.eq(cur_left == 1)]
        m.d.comb += [cur_free.eq(~cur_valid | (step & (cur_left == 1))),
                     p.req.ready.eq(~pend_valid)]
        with m.If(step):
            m.d.sync += [cur_addr.eq(cur_addr + 1), cur_left.eq(cur_left - 1)]
        accept = p.req.valid & ~pend_valid & (p.req.payload.beats != 0)
        nxt = Signal(req_layout)
        m.d.comb += nxt.eq(Mux(pend_valid, pend, p.req.payload))
        with m.If(cur_free):
            m.d.sync += [cur_valid.eq(pend_valid | accept), cur_write.eq(nxt.write),
                         cur_addr.eq(nxt.addr), cur_left.eq(nxt.beats), pend_valid.eq(0)]
        with m.Elif(accept):
            m.d.sync += [pend_valid.eq(1), pend.eq(p.req.payload)]
        return m


class _Route(enum.Enum, shape=2):
    """Where the beats of one ``lines``-port transfer go (reads) or come from (writes)."""

    FRONT = 0   # read: a front read's data; write: a front write's data (from the buffer)
    BACK = 1    # read: a victim's data, to ``back.wdata``; write: a fill, from ``back.resp``
    NONE = 2    # read: zeros for a malformed read; write: a malformed write's data, dropped


class CacheController(wiring.Component):
    """Set-associative write-back cache of embedding rows (see the module docstring).

    Parameters
    ----------
    data_bytes, addr_width, beats_width : the memory ports (front, back and lines).
    line_beats : beat addresses per row (power of two; row ``r`` starts at ``r*line_beats``).
    row_beats : beats of data per row, cached and transferred (``1..line_beats``; default
        ``line_beats``).
    sets : number of sets (power of two, >= 1).
    ways : ways per set (1..64).
    index : ``"modulo"`` or ``"hash"`` set index.
    policy : ``"lru"`` or ``"lfu"``.
    mshrs : miss-status holding registers (rows in flight), 1..64.
    queue_depth : operations that may wait for their turn at the line memory (default
        ``2 * mshrs``).
    line_outstanding : reads in flight on the ``lines`` port (2..256, default 32): the hit
        rate stays one lookup per cycle while this covers the line memory's latency.
    lfu_bits : width of an LFU use count (2..16).
    counter_width : width of the statistics counters.
    compare_stages : 1 or 2 (default 1): with 2, the per-way compare (:class:`WayMatch`) and
        the set-wide choice (:class:`WayChoose`) are stages of their own (one lookup more in
        flight, one cycle more of hit latency; see "Organisation for NIC sizes").
    bank_ways : ways per tag-store bank (a divisor of ``ways``; default the largest of 4, 2, 1
        that divides ``ways``): each bank of ways has its own memory per slice and output
        registers (4 ways of the NIC preset's 27-bit states are 108 bits, three 36-bit DP16KD
        ports exactly).
    tag_slice_sets : sets per tag-store slice (a power of two, default 512, the depth of an
        ECP5 DP16KD block RAM at its widest port): a larger tag store is split into slices by
        its set's high bits, each read on every lookup into a register of its own (the block
        RAM's output register), the slice chosen behind them.
    lookahead : True (default): stage 3's update is forwarded into the word a request of its
        set takes into stage 2, and a miss's victim is checked for a pending operation a
        cycle ahead (from one-hot vectors of every queued operation's way); a request right
        behind one of its set then waits ``compare_stages`` cycles. False (the NIC
        organisation, where both are wide: a set word of 32 ways is 864 bits, and the check
        33 holders x 32 ways): no forwarding, a request of a set ahead's set waits until that
        one's update is written and reads the tag store again (``compare_stages + 2``
        cycles right behind it), and a miss waits one cycle in stage 3 while its victim's
        pending operations are compared (:attr:`same_set_gap`, :attr:`miss_bubbles`).
    line_slice : False (default): the ``lines`` port's requests leave the arbiter directly.
        True (the NIC organisation): through a :class:`rtl.streams.SkidBuffer`, so that
        ``lines.req.ready`` reaches no logic of the controller (the executor's hand-off, the
        queue's and the lookup's bookkeeping start at registers); every line transfer starts
        one cycle later (a hit's first beat too).

    Ports
    -----
    front : In(MemPortSignature) -- requests from the user of the cache.
    back : Out(MemPortSignature) -- requests to the backing tier.
    lines : Out(MemPortSignature) -- the line memory (``lines_addr_width`` bits of beat
        address: line of (set, way), beat ``b`` at ``((set << way_bits | way) << log2(line_beats))
        + b``; the card's DRAM/HBM, or :class:`LineRAM`).
    cmd : In(stream.Signature(CacheOp)) -- maintenance commands; ready on completion.
    lookup_valid, lookup_kind : Out -- one pulse per looked-up request.
    stats : Out(CacheStats) -- counters.
    error : Out(1) -- sticky: a malformed front request or write-data ``last`` was seen.
    idle : Out(1) -- no request, miss or write-back in flight.
    """

    def __init__(self, *, data_bytes: int = 64, addr_width: int = 32, beats_width: int = 8,
                 line_beats: int = 4, row_beats: int | None = None, sets: int = 64,
                 ways: int = 8, index: str = "modulo", policy: str = "lru", mshrs: int = 16,
                 queue_depth: int | None = None, line_outstanding: int = 32,
                 lfu_bits: int = 8, counter_width: int = 32, compare_stages: int = 1,
                 tag_slice_sets: int = 512, bank_ways: int | None = None,
                 lookahead: bool = True, line_slice: bool = False):
        try:
            for name, flag in (("lookahead", lookahead), ("line_slice", line_slice)):
                if not isinstance(flag, bool):
                    raise ValueError(f"{name}: expected True or False, got {flag!r}")
            self.lookahead, self.line_slice = lookahead, line_slice
            self._configure(data_bytes, addr_width, beats_width, line_beats, row_beats, sets,
                            ways, index, policy, mshrs, queue_depth, line_outstanding, lfu_bits,
                            counter_width)
            self.compare_stages = check_int("compare_stages", compare_stages, minimum=1,
                                            maximum=2)
            self.tag_slice_sets = check_int("tag_slice_sets", tag_slice_sets, minimum=1,
                                            power_of_two=True)
            if bank_ways is None:
                bank_ways = gcd(self.ways, 4)
            self.bank_ways = check_int("bank_ways", bank_ways, minimum=1, maximum=self.ways)
            if self.ways % self.bank_ways:
                raise ValueError(f"bank_ways: expected a divisor of ways={self.ways}, "
                                 f"got {bank_ways}")
        except ValueError:
            self._MustUse__silence = True  # a refused design is not an unused one
            raise

    def _configure(self, data_bytes, addr_width, beats_width, line_beats, row_beats, sets,
                   ways, index, policy, mshrs, queue_depth, line_outstanding, lfu_bits,
                   counter_width):
        port = MemPortSignature(addr_width=addr_width, beats_width=beats_width,
                                data_bytes=data_bytes)
        self.data_bytes = data_bytes
        self.addr_width = addr_width
        self.beats_width = beats_width
        self.line_beats = check_int("line_beats", line_beats, minimum=1, power_of_two=True)
        if row_beats is None:
            row_beats = line_beats
        self.row_beats = check_int("row_beats", row_beats, minimum=1)
        if row_beats > line_beats:
            raise ValueError(f"row_beats: a row must fit in its line: expected <= line_beats="
                             f"{line_beats}, got {row_beats}")
        if row_beats >= 2 ** beats_width:
            raise ValueError(f"row_beats: expected < 2**beats_width={2 ** beats_width}, "
                             f"got {row_beats}")
        self.sets = check_int("sets", sets, minimum=1, power_of_two=True)
        self.ways = check_int("ways", ways, minimum=1, maximum=64)
        if index not in ("modulo", "hash"):
            raise ValueError(f"index: expected 'modulo' or 'hash', got {index!r}")
        self.index = index
        if policy not in ("lru", "lfu"):
            raise ValueError(f"policy: expected 'lru' or 'lfu', got {policy!r}")
        self.policy = policy
        self.mshrs = check_int("mshrs", mshrs, minimum=1, maximum=64)
        if queue_depth is None:
            queue_depth = max(2 * mshrs, 4)
        self.queue_depth = check_int("queue_depth", queue_depth, minimum=2, maximum=256)
        self.line_outstanding = check_int("line_outstanding", line_outstanding, minimum=2,
                                          maximum=256)
        self.lfu_bits = check_int("lfu_bits", lfu_bits, minimum=2, maximum=16)
        self.counter_width = check_int("counter_width", counter_width, minimum=1, maximum=64)
        self.set_bits = exact_log2(sets)
        self.row_bits = addr_width - exact_log2(line_beats)
        self.tag_bits = self.row_bits - self.set_bits
        if self.tag_bits < 1:
            raise ValueError(f"addr_width: expected more than log2(line_beats) + log2(sets) = "
                             f"{exact_log2(line_beats) + self.set_bits} bits, got {addr_width}")
        self.way_bits = max(1, ceil_log2(ways))
        self.lines_addr_width = max(1, exact_log2(line_beats) + ceil_log2(ways) + self.set_bits)
        if self.lines_addr_width > 64:
            raise ValueError(f"sets: the line memory needs {self.lines_addr_width} address "
                             f"bits, expected <= 64")
        repl_bits = self.way_bits if policy == "lru" else lfu_bits
        self.way_layout = data.StructLayout({
            "valid": 1, "dirty": 1, "tag": unsigned(self.tag_bits), "repl": unsigned(repl_bits),
        })
        self.set_layout = data.ArrayLayout(self.way_layout, ways)
        super().__init__({
            "front": In(port),
            "back": Out(port),
            "lines": Out(MemPortSignature(addr_width=self.lines_addr_width,
                                          beats_width=beats_width, data_bytes=data_bytes)),
            "cmd": In(stream.Signature(CacheOp)),
            "lookup_valid": Out(1),
            "lookup_kind": Out(LookupKind),
            "stats": Out(CacheStats(counter_width)),
            "error": Out(1),
            "idle": Out(1),
        })

    @property
    def lookup_stages(self) -> int:
        """Cycles from the edge accepting a request to its last lookup stage (the one that
        updates the state word and queues the operation): the tag read, its register, then
        ``compare_stages`` stages."""
        return 2 + self.compare_stages

    @property
    def same_set_gap(self) -> int:
        """Cycles from the last lookup stage of a request to that of a request of the same
        set right behind it: ``compare_stages + 1`` with ``lookahead`` (the update forwarded
        in the cycle it is made), ``compare_stages + 3`` without (the update written, the
        tag store read again after it, the word registered)."""
        return self.compare_stages + (1 if self.lookahead else 3)

    @property
    def miss_bubbles(self) -> int:
        """Cycles a miss waits in its last lookup stage beyond a hit (its victim's pending
        operations compared there): 0 with ``lookahead``, else 1."""
        return 0 if self.lookahead else 1

    @property
    def tag_slices(self) -> int:
        """Slices of the tag store (:attr:`sets` split by ``tag_slice_sets``)."""
        return max(1, self.sets // self.tag_slice_sets)

    @property
    def line_memory_beats(self) -> int:
        """Beats the line memory must hold (the ``lines`` port's address space)."""
        return 2 ** self.lines_addr_width

    # Initial (and post-INVALIDATE) state of one set: all invalid, LRU ranks = way numbers.
    def _init_set(self) -> list[dict]:
        return [{"valid": 0, "dirty": 0, "tag": 0, "repl": w if self.policy == "lru" else 0}
                for w in range(self.ways)]

    def elaborate(self, platform):
        m = Module()
        W, S, RB, TB = self.ways, self.set_bits, self.row_bits, self.tag_bits
        WB, Q, M, RBEATS = self.way_bits, self.queue_depth, self.mshrs, self.row_beats
        LB = exact_log2(self.line_beats)
        WA = ceil_log2(W)             # way bits of a line address (0 for one way)
        seq_bits = ceil_log2(Q + 2 * M) + 1
        set_w = max(1, S)
        off_bits = max(1, LB)
        front, back, lines = self.front, self.back, self.lines
        # the line port's requests as the arbiter hands them on (`lreq`): the port itself, or
        # the input of a skid buffer in front of it (`line_slice`)
        if self.line_slice:
            m.submodules.line_slice = lslice = SkidBuffer(lines.req.payload.shape())
            lreq = lslice.i
            m.d.comb += [lines.req.valid.eq(lslice.o.valid),
                         lines.req.payload.eq(lslice.o.payload),
                         lslice.o.ready.eq(lines.req.ready)]
        else:
            lreq = lines.req

        def set_of(row):
            if S == 0:
                return Const(0, 1)
            if self.index == "modulo":
                return row[:S]
            return _xor_fold(row, RB, S)

        def row_of(tag, set_idx):
            if S == 0:
                return tag
            low = set_idx[:S]
            if self.index == "hash":
                low = low ^ _xor_fold(tag, TB, S)
            return Cat(low, tag)

        def line_addr(set_idx, way, beat):
            parts = []
            if LB:
                parts.append(beat[:LB])
            if WA:
                parts.append(way[:WA])
            if S:
                parts.append(set_idx[:S])
            return Cat(*parts) if parts else Const(0, 1)

        # ---- the tag store: one state word per set, in block RAM --------------------------
        init_word = self.set_layout.const(self._init_set())
        # `ram_style`: block RAM at every size (yosys would build a shallow store, such as
        # the 16 sets of the fast tests, from LUT RAM); the timing measured is then that of
        # the NIC-size organisation, whose tags only fit in block RAM.
        # The store is split into `tag_slices` slices by the set's high bits (`slice_of`),
        # each `slice_sets` deep: every slice is read on every lookup and its word lands in a
        # register of its own (`s2_raw[d]`, the block RAM's output register on ECP5), and the
        # slice is chosen behind those registers. (One memory as deep as the store would be
        # cascaded in depth by yosys, its block RAMs' outputs multiplexed before any register,
        # so the unregistered clock-to-output would start the compare's path.)
        NS = self.tag_slices
        LOB = exact_log2(self.sets // NS)       # set bits that address within a slice

        def slice_of(set_idx):
            return set_idx[LOB:S] if NS > 1 else Const(0, 1)

        def in_slice(set_idx):
            return set_idx[:LOB] if LOB else Const(0, 0)

        # Banked by ways: the ways of bank `g` (`bank_ways` of them, `g * G` onwards) have
        # their own memory per slice, its own output register, and each way its own copies
        # of the lookup's control (see "Way slices" below).
        G = self.bank_ways
        NG = W // G
        bank_layout = data.ArrayLayout(self.way_layout, G)
        tag_ports = []      # [bank][slice] -> (read port, write port)
        for g in range(NG):
            row = []
            for d in range(NS):
                init = self._init_set()[g * G:(g + 1) * G]
                mem = Memory(shape=bank_layout, depth=self.sets // NS,
                             init=[init] * (self.sets // NS),
                             attrs={"ram_style": "block", COLLISION_X_ATTR: "1"})
                name = ("tags" if NS == 1 else f"tags{d}") if NG == 1 else f"tags{d}_b{g}"
                m.submodules[name] = mem
                # Not transparent: the lookup forwards its own updates (each way slice, below),
                # so the read needs no bypass mux behind the block RAM's output, and a read of
                # the set written in the same cycle is never used (`COLLISION_X_ATTR`): at
                # accept, the forwarded word takes stage 3's; while stage 1 holds, the read is
                # not enabled and later updates of its set are forwarded; the FLUSH walker
                # reads a set other than the one it writes.
                row.append((mem.read_port(), mem.write_port()))
            tag_ports.append(row)

        # ---- statistics ----------------------------------------------------------------
        # (the increments are registered, so the counters' carry chains start at a register:
        # a counter shows an event one cycle after the pulse of `lookup_valid`)
        inc = {name: Signal(range(W + 2), name=f"inc_{name}") for name in CacheStats.FIELDS}
        for name in CacheStats.FIELDS:
            field = getattr(self.stats, name)
            inc_r = Signal.like(inc[name], name=f"inc_{name}_r")
            m.d.sync += [inc_r.eq(inc[name]), field.eq(field + inc_r)]
        error_now = Signal()
        with m.If(error_now):
            m.d.sync += self.error.eq(1)

        # ---- MSHRs -------------------------------------------------------------------------
        mshr_valid = Signal(M)
        # (data registers that are read only beside a valid flag have no reset: the reset net
        # would otherwise reach every bit of the wide state words and queues)
        mshr_row = Array(Signal(RB, name=f"mshr{i}_row", reset_less=True) for i in range(M))
        mshr_seq = Array(Signal(seq_bits, name=f"mshr{i}_seq", reset_less=True)
                         for i in range(M))
        miss_seq = Signal(seq_bits)   # sequence number of the next primary miss
        fills_done = Signal(seq_bits)  # fills completed (fills complete in miss order)

        # ---- the operation queue (in-order delivery) ----------------------------------------
        # The operations wait in a LUT RAM (`opmem`, written at `q_tail`), and the one at the
        # head is also held in a register (`head`, loaded from the RAM's entry behind it, read
        # at a registered address, or from the operation entering an empty queue), so the
        # executor's register takes its next operation from flip-flops (a `Q`-to-1
        # multiplexer of register entries selected by the head pointer was the routed
        # critical path: 65.2 MHz at 8 ways x 1,024 sets). The fields the pin checks search
        # (set, way, whether it is an error) are kept besides in one register per entry, with
        # a valid bit each; the entries are enabled and freed by one-hot copies of the tail
        # and head pointers (no decoder behind the queue's handshakes).
        op_layout = data.StructLayout({
            "write": 1, "err": 1, "dep": 1, "seq": unsigned(seq_bits), "set": unsigned(set_w),
            "way": unsigned(WB), "off": unsigned(off_bits), "beats": unsigned(self.beats_width),
        })
        key_layout = data.StructLayout({"err": 1, "set": unsigned(set_w), "way": unsigned(WB)})
        q_raw = [Signal(key_layout.size, name=f"q{i}", reset_less=True) for i in range(Q)]
        q_ops = [key_layout(s) for s in q_raw]
        m.submodules.opmem = opmem = Memory(shape=op_layout.size, depth=Q, init=[])
        op_wr, op_rd = opmem.write_port(), opmem.read_port(domain="comb")
        q_valid = Signal(Q)
        q_tail = Signal(range(Q))           # the RAM's write address
        q_behind = Signal(range(Q), init=1 % Q)   # the entry behind the head (RAM read address)
        q_tail_oh = Signal(Q, init=1)
        q_head_oh = Signal(Q, init=1)
        q_count = Signal(range(Q + 1))
        q_two = Signal()                    # `q_count >= 2`, a register
        push = Signal()
        push_op = Signal(op_layout)
        pop = Signal()
        # the executor's register: the operation being handed to the line memory
        x_valid = Signal()
        x = Signal(op_layout, reset_less=True)

        # ---- back-port jobs (one per miss or flushed line) and fills in flight -----------------
        job_layout = data.StructLayout({
            "wb": 1, "rd": 1, "wb_row": unsigned(RB), "rd_row": unsigned(RB),
            "set": unsigned(set_w), "way": unsigned(WB), "mshr": unsigned(M),
        })
        m.submodules.jobs = jobs = SyncFIFO(width=job_layout.size, depth=M)
        wj_valid = Signal()     # the FLUSH walker's write-back job waits for the job FIFO
        # The job's fields never wait for the decision to push it (only `w_en` does): the
        # lookup's job, or the walker's while a command runs (a register chooses).
        job_in = Signal(job_layout)
        walk_job = Signal(job_layout, reset_less=True)
        m.d.comb += jobs.w_data.eq(job_in)
        job = job_layout(jobs.r_data)
        # (`mshr` one-hot in jobs and fills: a completing fill frees its MSHR with no decoder)
        fill_layout = data.StructLayout({
            "set": unsigned(set_w), "way": unsigned(WB), "mshr": unsigned(M)})
        # (its memory written on every cycle it has room, `write_on_room`: the sequencer's
        # decision steps its pointer, and does not reach the write enable of every cell)
        m.submodules.fills = fills = (HeadFIFO(width=fill_layout.size, depth=M,
                                               write_on_room=True) if M > 1
                                      else SyncFIFO(width=fill_layout.size, depth=M))
        fill_head = fill_layout(fills.r_data)
        seq_idle = Signal()

        # ---- the line port: routes of the reads and writes in flight, in request order ------
        # (`last`: the transfer's beat count less one, so that its last beat is found by an
        # equality compare, with no subtraction on the data path)
        route_layout = data.StructLayout({"route": _Route, "last": unsigned(self.beats_width)})
        # (the read routes' head is a register: the route of the next response beat steers
        # `lines.resp.ready`, with no LUT RAM read on that path)
        # (with `line_slice`, a `CreditFIFO`: the same cycles, and its writes are never
        # gated by its own level compare, the room being checked a cycle ahead, below)
        rroute_cls = CreditFIFO if self.line_slice else SyncFIFOBuffered
        m.submodules.rroute = rroute = rroute_cls(width=route_layout.size,
                                                  depth=self.line_outstanding)
        # (so is the write routes' head: a fill's last beat is found from registers)
        m.submodules.wroute = wroute = HeadFIFO(width=route_layout.size,
                                                depth=5 if self.line_slice else 4)
        rr_in, wr_in = Signal(route_layout), Signal(route_layout)
        m.d.comb += [rroute.w_data.eq(rr_in), wroute.w_data.eq(wr_in)]
        rr, wrt = route_layout(rroute.r_data), route_layout(wroute.r_data)
        # Room in each route FIFO for this cycle's write (at most one per FIFO per cycle). With
        # `line_slice`, registered and one entry short: a FIFO holding at most `depth - 2`
        # entries at the last edge has room now, so the line port's arbitration starts at
        # flip-flops (the write routes get a fifth entry to make up for it).
        if self.line_slice:
            rroom, wroom = Signal(), Signal()
            m.d.sync += [rroom.eq(rroute.level <= rroute.depth - 2),
                         wroom.eq(wroute.level <= wroute.depth - 2)]
        else:
            rroom, wroom = rroute.w_rdy, wroute.w_rdy

        # ---- command state ---------------------------------------------------------------
        cmd_active = Signal()   # the walker owns the tag store
        walk_set = Signal(range(self.sets + 1))
        walk_way = Signal(WB)
        walk_dirty = Signal(W)  # the walked set's ways still to look at that need a write-back
        walk_read = Signal()    # the walker reads a set (its stage-2 set register takes it)
        walk_load = Signal()    # the walker's set word lands in the output registers
        walk_wb = Signal()      # a write-back job pushed by the walker this cycle

        # ==== lookup: stage 0 (accept, read the tag store), 1 ("r": the word arrives), ======
        # ==== 2 ("s2": compare and choose), 3 ("s3": update the word, queue the operation) ==
        def stage(prefix):
            return {
                "valid": Signal(name=f"{prefix}_valid"),
                "row": Signal(RB, name=f"{prefix}_row", reset_less=True),
                "set": Signal(set_w, name=f"{prefix}_set", reset_less=True),
                "tag": Signal(TB, name=f"{prefix}_tag", reset_less=True),
                "off": Signal(off_bits, name=f"{prefix}_off", reset_less=True),
                "beats": Signal(self.beats_width, name=f"{prefix}_beats", reset_less=True),
                "write": Signal(name=f"{prefix}_write", reset_less=True),
                "err": Signal(name=f"{prefix}_err", reset_less=True),
            }
        r, s2, s3 = stage("r"), stage("s2"), stage("s3")
        CS = self.compare_stages
        # with two compare stages, "c" holds the per-way flags between them
        c = stage("c") if CS == 2 else None
        pre = c if CS == 2 else s2             # the stage stage 3 takes its request from
        s2_leave = Signal()    # stage 2's request moves on (to stage 3, or to "c")
        # The state words themselves live in the way slices (below): per way, its stage-2
        # word (`way_s2`), the word stage 3 takes (`way_pre`), stage 3's (`way_s3`) and the
        # word its output registers hold (`way_raw`, the walker's view).
        way_s2 = [Signal(self.way_layout, name=f"w{w}_s2_word") for w in range(W)]
        way_pre = [Signal(self.way_layout, name=f"w{w}_pre_word", reset_less=True)
                   for w in range(W)]
        way_s3 = [Signal(self.way_layout, name=f"w{w}_s3_word", reset_less=True)
                  for w in range(W)]
        way_raw = [Signal(self.way_layout, name=f"w{w}_raw_word") for w in range(W)]
        pre_word = self.set_layout(Cat(*way_pre))
        s3_word = self.set_layout(Cat(*way_s3))
        s3_hit, s3_merged = Signal(), Signal()
        s3_miss = Signal()     # a miss (neither a hit nor an error), registered with s3_hit
        s3_sel, s3_victim = Signal(WB), Signal(WB)
        s3_victim_state = Signal(self.way_layout)
        s3_merge_seq = Signal(seq_bits, reset_less=True)
        s3_fire = Signal()
        s3_nobeats = Signal()  # stage 3's request has zero beats (registered with it)
        s3_take = Signal()     # stage 3 takes stage 2's request
        s2_take = Signal()     # stage 2 takes stage 1's request

        req = front.req.payload
        req_row = req.addr[LB:]
        req_off = req.addr[:LB] if LB else Const(0, 1)
        accept = Signal()
        # Stage 3 writes the state word of its set in the cycle it fires (`upd_now`). Stage 2
        # never holds a request of the set stage 3 holds (stage 1 waits a cycle instead), so
        # the compare never waits for an update in the same cycle; a request in stage 1 gets
        # the new word forwarded, so every lookup sees exactly the state a
        # one-request-at-a-time cache would.
        upd_now = Signal()
        req_set = Signal(set_w)
        hold = Signal()
        LA = self.lookahead
        # Without lookahead, a request of the set stage 3 holds waits in stage 1 until the
        # update is written, and one cycle more (`just`: the last cycle's update was of stage
        # 1's set), so that the word it takes is read after the write.
        just = Signal()
        # Stage 1's set compared with the sets of stages 2, "c" and 3, as registers (`e2r`,
        # `ecr`, `e3r`: next values for each way the stages may move, chosen last; exact
        # while the stage ahead holds a request, which is when they are used), as each way
        # slice keeps its own copies: the stall is not behind three set compares.
        e2r, ecr, e3r = (Signal(name=n, reset_less=True, init=1) for n in ("e2r", "ecr", "e3r"))
        m.d.comb += [
            upd_now.eq(s3_fire & ~s3["err"]),
            req_set.eq(set_of(req_row)),
            s3_take.eq(pre["valid"] & (~s3["valid"] | s3_fire)),
            hold.eq((s2["valid"] & e2r)
                    | ((c["valid"] & ecr) if CS == 2 else 0)
                    | ((s3["valid"] & ~s3_fire & e3r) if LA
                       else ((s3["valid"] & e3r) | just))),
            s2_take.eq(r["valid"] & (~s2["valid"] | s2_leave) & ~hold),
            front.req.ready.eq((~r["valid"] | s2_take) & ~self.cmd.valid & ~cmd_active),
            accept.eq(front.req.valid & front.req.ready),
        ]
        # Stage 1's fields load whenever it is empty or passes its request on, a request or
        # not (`valid` says whether they hold one): their enable is not behind `accept`.
        with m.If(~r["valid"] | s2_take):
            m.d.sync += [
                r["row"].eq(req_row), r["set"].eq(req_set),
                r["tag"].eq(req_row[S:]), r["off"].eq(req_off), r["beats"].eq(req.beats),
                r["write"].eq(req.write),
                r["err"].eq((req.beats == 0) | (req_off + req.beats > RBEATS)),
            ]
        with m.If(accept):
            m.d.sync += r["valid"].eq(1)
        with m.Elif(s2_take):
            m.d.sync += r["valid"].eq(0)
        with m.If(s2_take):
            m.d.sync += [s2[k].eq(r[k]) for k in r]
        with m.Elif(s2_leave):
            m.d.sync += s2["valid"].eq(0)

        # stage 2: compare the tags (then, with two compare stages, stage "c": choose the
        # way); the stage before 3 (`pre`) finds a row still in flight
        # The choice (:class:`WaySelect`'s rule) from the per-way flags of the way slices'
        # compares, registered there with two compare stages (so the set-wide choice starts
        # at registers), else combinational: `c_hit` (hit), `c_invf` (the lowest invalid
        # way alone, found in stage 2 from its invalid flags, `c_anyinv` whether there is
        # one) and `c_old` (LRU: rank `ways - 1`). The rule's "lowest" is needed only there:
        # a row is in at most one way of its set (a miss allocates only a row its set does
        # not hold), so `c_hit` has at most one bit; LRU ranks are a permutation of the ways
        # (the initial ranks are, and an update keeps them so), so `c_old` has exactly one.
        c_hit, c_invf, c_old = Signal(W), Signal(W), Signal(W)
        c_anyinv = Signal()
        s2_inv = Signal(W)          # stage 2's invalid flags (from the way slices)
        s2_invf = Signal(W)
        m.d.comb += s2_invf.eq(lowest_one(s2_inv))
        # With two compare stages, the lowest invalid way is found in two halves: each bank
        # of ways' own lowest invalid way (`s2_loc`, from that bank's invalid flags only) and
        # whether the bank has one (`c_bany`) are registered, and stage "c" combines them
        # (`c_invf`: a bank's lowest one unless a bank below has one; `c_anyinv`: any bank
        # has one): the same flags, with no path from one bank's tag memories into the
        # flags of another bank's ways (the tag store's output through the lowest-one
        # prefix into `c_invf` was the routed critical path: 8.76 ns on router1, seed 2).
        s2_loc = Signal(W)
        m.d.comb += s2_loc.eq(Cat(*[lowest_one(s2_inv[g * G:(g + 1) * G]) for g in range(NG)]))
        c_loc = Signal(W)           # `s2_loc` registered (in the way slices)
        c_bany = Signal(NG)
        if CS == 1:
            m.d.comb += [s2_leave.eq(s3_take), c_anyinv.eq(s2_inv.any())]
        else:
            m.d.comb += s2_leave.eq(s2["valid"] & (~c["valid"] | s3_take))
            with m.If(s2_leave):
                m.d.sync += [c[k].eq(s2[k]) for k in s2]
                m.d.sync += c_bany.eq(Cat(*[s2_inv[g * G:(g + 1) * G].any()
                                            for g in range(NG)]))
            with m.Elif(s3_take):
                m.d.sync += c["valid"].eq(0)
            m.d.comb += [
                c_anyinv.eq(c_bany.any()),
                c_invf.eq(Cat(*[c_loc[g * G:(g + 1) * G] if g == 0
                                else c_loc[g * G:(g + 1) * G]
                                & ~Mux(c_bany[:g].any(), (1 << G) - 1, 0)
                                for g in range(NG)])),
            ]
        ch_hit = Signal()
        ch_hit_way, ch_victim = Signal(WB), Signal(WB)
        ch_victim_oh = Signal(W)
        policy_oh = Signal(W)
        if self.policy == "lru":
            m.d.comb += policy_oh.eq(c_old)
        else:
            _, best = _argmin_tree([(pre_word[w].repl, Const(w, WB)) for w in range(W)])
            m.d.comb += policy_oh.eq((Const(1, W) << best)[:W])
        m.d.comb += [ch_hit.eq(c_hit.any()),
                     ch_victim_oh.eq(Mux(c_anyinv, c_invf, policy_oh)),
                     ch_hit_way.eq(one_hot_index(c_hit, WB))]
        s2_old = Signal(W)          # stage 2's LRU flags (from the way slices)
        if CS == 2 and self.policy == "lru":
            # the victim's index registered with stage "c"'s flags, from the same stage-2
            # flags (equal to the index of `ch_victim_oh`), so that it starts at a register
            # (the victim pin's terms compare it with every queued operation's way)
            c_victim = Signal(WB)
            with m.If(s2_leave):
                m.d.sync += c_victim.eq(one_hot_index(Mux(s2_inv.any(), s2_invf, s2_old), WB))
            m.d.comb += ch_victim.eq(c_victim)
        else:
            m.d.comb += ch_victim.eq(one_hot_index(ch_victim_oh, WB))
        # An MSHR matches when it fetches stage 2's row: compared with the registered row, not
        # through the state word. The two agree: while an MSHR is valid its way is pinned (the
        # miss's operation waits in the queue or the executor until the fill completes), so
        # the way holds that row's tag, valid, and stage 2's request hits it. At most one MSHR
        # fetches a row, so the sequence number is an OR of the matching one.
        mshr_match = Signal(M)
        if CS == 2 and not LA:
            # (without lookahead, with two compare stages: the rows compared in stage 2 and
            # registered, `c_mmatch`, kept only while their MSHR stays valid; exact, as the
            # MSHRs allocated meanwhile are of the sets ahead, which stage "c" never holds,
            # and a freed MSHR's bit is cleared before it can be allocated again)
            # The compare is registered every cycle (`s2_mmatch`, no enable), and the choice
            # between it and the kept matches (`c_kept`) is made behind the registers, by
            # whether stage 2's request moved on at the last edge: the row compare and the
            # stall that moves stage 2 are not on one path.
            s2_mmatch, c_kept = Signal(M), Signal(M)
            c_took = Signal()
            m.d.sync += [s2_mmatch.eq(Cat(mshr_valid[i] & (mshr_row[i] == s2["row"])
                                          for i in range(M))),
                         c_took.eq(s2_leave),
                         c_kept.eq(mshr_match)]
            m.d.comb += mshr_match.eq(Mux(c_took, s2_mmatch, c_kept) & mshr_valid)
        else:
            m.d.comb += mshr_match.eq(Cat(mshr_valid[i] & (mshr_row[i] == pre["row"])
                                          for i in range(M)))
        merge_seq = Signal(seq_bits)
        merge_terms = Const(0, seq_bits)
        for i in range(M):
            merge_terms = merge_terms | Mux(mshr_match[i], mshr_seq[i], 0)
        m.d.comb += merge_seq.eq(merge_terms)
        with m.If(s3_take):
            m.d.sync += [s3[k].eq(pre[k]) for k in pre]
            m.d.sync += [
                s3_hit.eq(ch_hit), s3_merged.eq(mshr_match.any()),
                s3_sel.eq(Mux(ch_hit, ch_hit_way, ch_victim)),
                s3_victim.eq(ch_victim),
                s3_merge_seq.eq(merge_seq), s3_nobeats.eq(pre["beats"] == 0),
                s3_miss.eq(~pre["err"] & ~ch_hit),
            ]
        with m.Elif(s3_fire):
            m.d.sync += s3["valid"].eq(0)

        # stage 3: resources, the new state word, the operation. `pinned`: the victim way of
        # stage 3's set has an operation queued or in the executor's register, computed a cycle
        # ahead from registers (for the set entering or staying in stage 3): stage 2 never holds
        # stage 3's set, so no operation of that set is queued in between, and one that leaves
        # in between keeps its way pinned a cycle longer.
        holders = [(q_valid[i] & ~q_ops[i].err, q_ops[i]) for i in range(Q)]
        holders.append((x_valid & ~x.err, x))
        # (`pre`: the stage before 3; `into_pre`, the stage before it, and `pre_take`: `pre`
        # takes its request; `into_src`: the set `into_pre` takes when it takes one)
        into_pre, pre_take = (r, s2_take) if CS == 1 else (s2, s2_leave)
        into_src, into_take = ((req_set, ~r["valid"] | s2_take) if CS == 1
                               else (r["set"], s2_take))
        # Each queue entry's set compared with the sets of `into_pre`, `pre` and stage 3, as
        # registers (`q_eq[i][stage]`): the next value for each way the entry and the stages
        # may change (the entry written with stage 3's operation or not, the stage taking a
        # request or not), chosen last. Exact for an entry that holds an operation.
        stage_sets = {"into": (into_pre["set"], into_take, into_src),
                      "pre": (pre["set"], pre_take, into_pre["set"]),
                      "s3": (s3["set"], s3_take, pre["set"])}
        if not LA:          # (only stage 3's victim is checked, in stage 3)
            stage_sets = {"s3": stage_sets["s3"]}
        # entry i takes stage 3's operation's set, way and flags (`q_wr`): when it is the tail
        # and an operation is pushed, whether it enters the queue or bypasses it (an entry
        # that is not valid may hold anything: a bypass finds the queue empty), so these
        # registers do not wait for the executor's handshake; `q_valid` does
        q_wr = [Signal(name=f"q{i}_wr") for i in range(Q)]
        q_eq = [{} for _ in range(Q)]
        for key, (cur, take, src) in stage_sets.items():
            for i in range(Q):
                flag = Signal(name=f"q{i}_eq_{key}", reset_less=True)
                q_eq[i][key] = flag
                entry = q_ops[i].set
                if LA:
                    m.d.sync += flag.eq(Mux(q_wr[i], Mux(take, s3["set"] == src,
                                                         s3["set"] == cur),
                                            Mux(take, entry == src, entry == cur)))
                else:
                    # (an entry written with stage 3's operation is of a set stage 3 no longer
                    # holds: it takes a request of another set, or empties)
                    m.d.sync += flag.eq(~q_wr[i] & Mux(take, entry == src, entry == cur))

        def way_oh(op):
            return Const(1, W) << op.way[:max(1, ceil_log2(W))] if W > 1 else Const(1, 1)

        def pinned_ways(key, set_idx):
            """The ways of the set of stage ``key`` (``set_idx``) with an operation queued
            (from the entries' compare registers) or in the executor (compared here)."""
            out = Const(0, W)
            for i, (held, op) in enumerate(holders):
                hit_set = held & (q_eq[i][key] if i < Q else (op.set == set_idx))
                vec = Signal(W, name=f"pin_{key}_{i}")
                m.d.comb += vec.eq(Mux(hit_set, way_oh(op), 0))
                out = out | vec
            return out
        # both candidates from registers, each at its victim (stage 2's choice for the request
        # entering stage 3, stage 3's for the one staying), the choice last (it waits for
        # stage 3's decision): `pinned` is a register
        # Stage 2's candidate is itself a register (`pin_s2`: the pinned ways of stage 2's set,
        # from the holders a cycle earlier, plus the operation stage 3 handed on in that cycle,
        # which may be of the set entering stage 2); an operation that leaves in between keeps
        # its way pinned one cycle longer still.
        # The four candidates (stage 2 takes a request or not; stage 3 pushes its operation or
        # not) come from registers, and the decisions pick one last.
        def pushed_way(set_idx):
            """The way stage 3's operation pins in set ``set_idx`` if it is pushed."""
            hit_set = s3["set"] == set_idx
            if W == 1:
                return hit_set
            return Mux(hit_set, Const(1, W) << s3_sel[:max(1, ceil_log2(W))], 0)
        if LA:
            pin_r = pinned_ways("into", into_pre["set"])
            pin_2 = pinned_ways("pre", pre["set"])
            pin_s2 = Signal(W)
            m.d.sync += pin_s2.eq(Mux(pre_take,
                                      Mux(push, pin_r | pushed_way(into_pre["set"]), pin_r),
                                      Mux(push, pin_2 | pushed_way(pre["set"]), pin_2)))
        # stage 3's victim is pinned when a holder's operation is of its set and way
        x_go = Signal()         # the executor's operation leaves (driven below)
        if LA:
            # one compare of both per holder, ORed (no one-hot of ways selected by the
            # victim after)
            pin_s3 = Const(0, 1)
            for i, (held, op) in enumerate(holders):
                same = held & (q_eq[i]["s3"] if i < Q else (op.set == s3["set"]))
                if W > 1:
                    same = same & (op.way[:max(1, ceil_log2(W))] == s3_victim)
                pin_s3 = pin_s3 | same
        else:
            # Without lookahead, each holder's term is a register of its own (`pin_c<i>`),
            # computed a cycle ahead, so the OR over the holders into the way slices'
            # `pin_stay` starts at flip-flops (that OR behind the holders' set and way
            # compares was the routed critical path: 116.8 MHz at 8 ways x 1,024 sets).
            # A term is of the holder's operation now, against stage 3's set and victim after
            # the edge: those of the stage before it when it takes a request (the entry's set
            # compared with that stage's, as for `q_eq[i]["s3"]`'s next value, and the
            # registered `ch_victim`), else its own (`q_eq[i]["s3"]`, `s3_victim`), chosen
            # last by `s3_take`. Exact for the holders after the edge: an operation leaving
            # the queue enters the executor's register (still held, and its entry's term says
            # so), the one leaving the executor drops its term (`x_go`), and the operation
            # stage 3 pushes at the edge is of a set stage 3 no longer holds after it (it
            # takes a request of another set, stage 2 never holding stage 3's, or empties),
            # which no term has to count.
            def same_way(op, victim):
                return op.way[:max(1, ceil_log2(W))] == victim if W > 1 else Const(1, 1)
            pin_s3 = Const(0, 1)
            for i, (held, op) in enumerate(holders):
                if i < Q:
                    eq_pre, eq_s3, stays = q_ops[i].set == pre["set"], q_eq[i]["s3"], held
                else:
                    eq_pre, eq_s3 = op.set == pre["set"], op.set == s3["set"]
                    stays = held & ~x_go
                eq_n = Mux(s3_take, eq_pre & same_way(op, ch_victim),
                           eq_s3 & same_way(op, s3_victim))
                term = Signal(name=f"pin_c{i}")
                m.d.sync += term.eq(stays & eq_n)
                pin_s3 = pin_s3 | term
        # both candidates are registered and chosen after the registers (`took`: stage 3 took
        # a request at the last edge), so stage 3's decision is not on their paths
        # Without lookahead there is no entering candidate: a miss that entered stage 3 at
        # the last edge counts as pinned for that cycle, while its own `pin_stay` is computed.
        pin_enter, pin_stay, took = Signal(), Signal(), Signal()
        pin_enter_n, pin_stay_n = Signal(), Signal()     # their next values (way slices copy)
        m.d.comb += pin_stay_n.eq(pin_s3)
        if LA:
            m.d.comb += pin_enter_n.eq((pin_s2 & ch_victim_oh).any() if W > 1 else pin_s2[0])
        m.d.sync += [pin_enter.eq(pin_enter_n), pin_stay.eq(pin_stay_n), took.eq(s3_take)]
        pinned = Signal()
        m.d.comb += pinned.eq(Mux(took, pin_enter, pin_stay) if LA else (took | pin_stay))
        # The MSHR a miss takes (`free_oh`, one-hot) from registers: the lowest free one at
        # the last edge (`mshr_cand`), or, when a miss took one in the last cycle, the lowest
        # free one besides that (`mshr_cand2`). An MSHR freed in the last cycle is not a
        # candidate yet, as it does not count for `s3_res` either (which is registered from
        # the same `mshr_valid`), so a miss that has its resources always finds one here.
        free_oh = Signal(M)
        mshr_cand = Signal(M, init=1)
        mshr_cand2 = Signal(M, init=(2 if M > 1 else 0))
        mshr_took = Signal()
        m.d.comb += free_oh.eq(Mux(mshr_took, mshr_cand2, mshr_cand))
        m.d.sync += [mshr_cand.eq(lowest_one(~mshr_valid)),
                     mshr_cand2.eq(lowest_one(~mshr_valid & ~free_oh)),
                     mshr_took.eq(s3_fire & s3_miss)]
        is_miss = s3_miss       # (== ~s3.err & ~s3_hit, registered with them)
        # Stage 3 fires when its request's resources are there: an error needs a queue entry
        # (none if it has no beats), a hit a queue entry, a miss a queue entry, a free MSHR,
        # room for its job and a victim with no operation to issue. `s3_ok` (the queue entry) and
        # `s3_res` (a miss's MSHR and job room) are decided a cycle ahead for the request stage
        # 3 holds next, from the next values of the queue's count, the MSHRs and the job FIFO's
        # level (see below); the victim's pin is a register too (`pinned`), so
        # that the stall which runs back through the lookup to `front.req.ready` starts at a
        # register.
        s3_ok = Signal()
        s3_res = Signal()   # a miss's MSHR and job room
        # (`s3_ok` includes stage 3's `valid`: both are decided a cycle ahead)
        m.d.comb += s3_fire.eq(s3_ok & ~(is_miss & (pinned | ~s3_res)))
        m.d.comb += [
            push_op.write.eq(s3["write"]),
            push_op.err.eq(s3["err"]),
            push_op.dep.eq(~s3["err"] & (s3_merged | ~s3_hit)),
            push_op.seq.eq(Mux(s3_hit, s3_merge_seq, miss_seq)),
            push_op.set.eq(s3["set"]),
            push_op.way.eq(s3_sel),
            push_op.off.eq(s3["off"]),
            push_op.beats.eq(s3["beats"]),
            push.eq(s3_fire & ~s3_nobeats),
        ]
        # the hit way and the victim one-hot and their replacement states, registered in
        # each way slice with stage 3's request, which chooses between them by its own copy
        # of the hit flag (AND-ORs over the one-hot vectors, no way multiplexer, and not
        # behind the hit's OR)
        repl_w = len(pre_word[0].repl)
        hit_repl_c, vic_repl_c = Signal(repl_w), Signal(repl_w)
        hit_terms, vic_terms = Const(0, repl_w), Const(0, repl_w)
        for w in range(W):
            hit_terms = hit_terms | Mux(c_hit[w], pre_word[w].repl, 0)
            vic_terms = vic_terms | Mux(ch_victim_oh[w], pre_word[w].repl, 0)
        m.d.comb += [hit_repl_c.eq(hit_terms), vic_repl_c.eq(vic_terms)]
        # The walker's writes come from registers (`cw_en`, `cw_clear`, `cw_addr`, set the
        # cycle after the walker decides them); the lookup never updates while a command runs.
        cw_en, cw_en_n = Signal(), Signal()
        cw_clear, cw_clear_n = Signal(), Signal()
        cw_addr = Signal(set_w)
        m.d.sync += [cw_en.eq(cw_en_n), cw_clear.eq(cw_clear_n)]
        wr_set = Signal(set_w)
        m.d.comb += wr_set.eq(Mux(cw_en, cw_addr, s3["set"]))

        # the victim's state is read from stage 3's word (not selected in stage 2 behind the
        # victim's choice): it only feeds the job's data and the counters
        m.d.comb += s3_victim_state.eq(
            Array(s3_word[w].as_value() for w in range(W))[s3_victim])
        dirty_victim = Signal()
        m.d.comb += dirty_victim.eq(s3_victim_state.valid & s3_victim_state.dirty)
        m.d.comb += [
            job_in.wb.eq(Mux(cmd_active, walk_job.wb, dirty_victim)),
            job_in.rd.eq(Mux(cmd_active, walk_job.rd, 1)),
            job_in.wb_row.eq(Mux(cmd_active, walk_job.wb_row,
                                 row_of(s3_victim_state.tag, s3["set"]))),
            job_in.rd_row.eq(Mux(cmd_active, walk_job.rd_row, s3["row"])),
            job_in.set.eq(Mux(cmd_active, walk_job.set, s3["set"])),
            job_in.way.eq(Mux(cmd_active, walk_job.way, s3_victim)),
            job_in.mshr.eq(Mux(cmd_active, walk_job.mshr, free_oh)),
        ]
        with m.If(s3_fire & is_miss):
            # (each MSHR's enable is its bit of the one-hot `free_oh`, no decoder)
            for i in range(M):
                with m.If(free_oh[i]):
                    m.d.sync += [mshr_row[i].eq(s3["row"]), mshr_seq[i].eq(miss_seq)]
            m.d.sync += miss_seq.eq(miss_seq + 1)
            m.d.comb += jobs.w_en.eq(1)

        kind = Signal(LookupKind)
        with m.If(s3["err"]):
            m.d.comb += kind.eq(LookupKind.ERROR)
        with m.Elif(s3_merged & s3_hit):
            m.d.comb += kind.eq(LookupKind.MERGED)
        with m.Elif(s3_hit):
            m.d.comb += kind.eq(LookupKind.HIT)
        with m.Else():
            m.d.comb += kind.eq(LookupKind.MISS)
        m.d.comb += [self.lookup_valid.eq(s3_fire), self.lookup_kind.eq(kind)]
        with m.If(s3_fire):
            m.d.comb += [
                inc["hits"].eq(~s3["err"] & s3_hit & ~s3_merged),
                inc["misses"].eq(is_miss),
                inc["merged"].eq(~s3["err"] & s3_hit & s3_merged),
                inc["evictions"].eq(is_miss & s3_victim_state.valid),
                inc["writebacks"].eq((is_miss & dirty_victim) | walk_wb),
            ]
        with m.Else():
            m.d.comb += inc["writebacks"].eq(walk_wb)

        # ==== operation queue bookkeeping =================================================
        # Stage 3's operation goes straight to the executor's register when the queue is empty
        # and the register free or leaving (`bypass`), otherwise to the queue (`enq`).
        head = Signal(op_layout, reset_less=True)
        q_any = Signal()
        x_free = Signal()       # the executor's register takes an operation this cycle
        bypass, enq = Signal(), Signal()
        m.d.comb += [q_wr[i].eq(push & q_tail_oh[i]) for i in range(Q)]
        # (`q_any` is `q_count != 0` kept as a flip-flop)
        m.d.comb += [bypass.eq(push & ~q_any & x_free), enq.eq(push & ~bypass),
                     op_wr.addr.eq(q_tail), op_wr.data.eq(push_op), op_wr.en.eq(enq),
                     op_rd.addr.eq(q_behind)]

        def step(ptr):
            return Mux(ptr == Q - 1, 0, ptr + 1) if Q & (Q - 1) else (ptr + 1)[:len(ptr)]

        def rotate(oh):
            return Cat(oh[-1], oh[:-1])
        # the head register: the entry behind it when the head leaves (it is in the RAM when
        # two or more are queued, else it is the one entering now), the entering one when the
        # queue is empty
        with m.If(pop | ~q_any):
            m.d.sync += head.eq(Mux(q_two, op_rd.data, push_op))
        for i in range(Q):
            with m.If(q_wr[i]):
                m.d.sync += q_raw[i].eq(Cat(push_op.err, push_op.set, push_op.way))
            with m.If(enq & q_tail_oh[i]):
                m.d.sync += q_valid[i].eq(1)
            with m.Elif(pop & q_head_oh[i]):
                m.d.sync += q_valid[i].eq(0)
        with m.If(enq):
            m.d.sync += [q_tail.eq(step(q_tail)), q_tail_oh.eq(rotate(q_tail_oh))]
        with m.If(pop):
            m.d.sync += [q_behind.eq(step(q_behind)), q_head_oh.eq(rotate(q_head_oh))]
        # (the count's next values from the registered count, chosen last by the handshakes:
        # no carry chain behind stage 3's decision)
        q_inc, q_dec = Signal.like(q_count), Signal.like(q_count)
        m.d.comb += [q_inc.eq(q_count + 1), q_dec.eq(q_count - 1)]
        with m.If(enq & ~pop):
            m.d.sync += q_count.eq(q_inc)
        with m.Elif(pop & ~enq):
            m.d.sync += q_count.eq(q_dec)
        # the count's flags after this cycle, from compares of the registered count
        with m.If(enq & ~pop):
            m.d.sync += [q_any.eq(1), q_two.eq(q_count >= 1)]
        with m.Elif(pop & ~enq):
            m.d.sync += [q_any.eq(q_count >= 2), q_two.eq(q_count >= 3)]

        # ==== the line port: one request per cycle, the executor's first (the in-order ======
        # ==== stream), then fills, then write-backs; each request's route is queued ========
        fill_req = Signal()     # a fill's first beat is waiting on back.resp
        fill_open = Signal()    # the fill at the head of `fills` has its write request out
        wb_req = Signal()       # the back sequencer wants a victim's line read
        x_req = Signal()        # the executor's operation needs the line port
        # `x_wait`: the executor's operation waits for its fill (a register: the fill
        # completing in the cycle the operation is loaded, or later, clears it)
        x_wait = Signal()
        dep_ok = Signal()
        fill_done_now = Signal()
        head_wait = Signal()
        # (the head's wait from the head register's fields)
        m.d.comb += [
            dep_ok.eq(~x_wait),
            head_wait.eq(head.dep & ((head.seq - fills_done)[:seq_bits] < M)
                         & ~(fill_done_now & (head.seq == fills_done))),
            fill_req.eq(fills.r_rdy & ~fill_open & back.resp.valid & wroom),
        ]
        x_ready = Signal()
        wb_grant = Signal()
        m.d.comb += x_ready.eq(x_valid & dep_ok)
        with m.If(x_ready):
            # a malformed operation needs no line request, only its route
            route_room = Mux(x.write, wroom, rroom)
            with m.If(x.err):
                m.d.comb += x_go.eq(route_room)
            with m.Else():
                m.d.comb += [x_req.eq(1), lreq.valid.eq(route_room),
                             lreq.payload.write.eq(x.write),
                             lreq.payload.addr.eq(line_addr(x.set, x.way, x.off)),
                             lreq.payload.beats.eq(x.beats),
                             x_go.eq(route_room & lreq.ready)]
            with m.If(x.write):
                m.d.comb += [wr_in.route.eq(Mux(x.err, _Route.NONE, _Route.FRONT)),
                             wr_in.last.eq(x.beats - 1), wroute.w_en.eq(x_go)]
            with m.Else():
                m.d.comb += [rr_in.route.eq(Mux(x.err, _Route.NONE, _Route.FRONT)),
                             rr_in.last.eq(x.beats - 1), rroute.w_en.eq(x_go)]
        with m.Elif(fill_req):
            m.d.comb += [lreq.valid.eq(1), lreq.payload.write.eq(1),
                         lreq.payload.addr.eq(line_addr(fill_head.set, fill_head.way,
                                                             Const(0, off_bits))),
                         lreq.payload.beats.eq(RBEATS),
                         wr_in.route.eq(_Route.BACK), wr_in.last.eq(RBEATS - 1)]
            with m.If(lreq.ready):
                m.d.comb += wroute.w_en.eq(1)
                m.d.sync += fill_open.eq(1)
        with m.Elif(wb_req):
            m.d.comb += [lreq.valid.eq(rroom),
                         lreq.payload.addr.eq(line_addr(job.set, job.way,
                                                             Const(0, off_bits))),
                         lreq.payload.beats.eq(RBEATS),
                         rr_in.route.eq(_Route.BACK), rr_in.last.eq(RBEATS - 1),
                         wb_grant.eq(lreq.ready & rroom),
                         rroute.w_en.eq(wb_grant)]
        # the executor's register takes the queue's head (or stage 3's operation, the queue
        # being empty) when it is empty or leaving
        load_x = Signal()
        push_gap = Signal(seq_bits)
        push_wait = Signal()
        m.d.comb += [
            x_free.eq(~x_valid | x_go),
            load_x.eq((q_any | push) & x_free), pop.eq(q_any & x_free),
            push_gap.eq(push_op.seq - fills_done),
            push_wait.eq(push_op.dep & (push_gap < M)
                         & ~(fill_done_now & (fills_done == push_op.seq))),
        ]
        with m.If(load_x):
            m.d.sync += [x_valid.eq(1), x.eq(Mux(q_any, head, push_op)),
                         x_wait.eq(Mux(q_any, head_wait, push_wait))]
        with m.Else():
            with m.If(x_go):
                m.d.sync += x_valid.eq(0)
            with m.If(fill_done_now & (fills_done == x.seq)):
                m.d.sync += x_wait.eq(0)

        # ==== read data: front reads to front.resp, victims to back.wdata ====================
        zero_beat = Signal(self.beats_width)
        m.d.comb += [back.wdata.payload.data.eq(lines.resp.payload.data),
                     back.wdata.payload.mask.eq(-1),
                     back.wdata.payload.last.eq(lines.resp.payload.last),
                     front.resp.payload.data.eq(lines.resp.payload.data),
                     front.resp.payload.last.eq(lines.resp.payload.last)]
        with m.If(rroute.r_rdy):
            with m.Switch(rr.route):
                with m.Case(_Route.FRONT):
                    m.d.comb += [front.resp.valid.eq(lines.resp.valid),
                                 lines.resp.ready.eq(front.resp.ready),
                                 rroute.r_en.eq(lines.resp.valid & front.resp.ready
                                                & lines.resp.payload.last)]
                with m.Case(_Route.BACK):
                    m.d.comb += [back.wdata.valid.eq(lines.resp.valid),
                                 lines.resp.ready.eq(back.wdata.ready),
                                 rroute.r_en.eq(lines.resp.valid & back.wdata.ready
                                                & lines.resp.payload.last)]
                with m.Case(_Route.NONE):
                    zlast = zero_beat == rr.last
                    m.d.comb += [front.resp.valid.eq(1), front.resp.payload.data.eq(0),
                                 front.resp.payload.last.eq(zlast)]
                    with m.If(front.resp.ready):
                        m.d.sync += zero_beat.eq(Mux(zlast, 0, zero_beat + 1))
                        m.d.comb += rroute.r_en.eq(zlast)

        # ==== write data: front writes from the buffer, fills from back.resp =================
        m.submodules.wbuf = wbuf = SyncFIFO(width=front.wdata.payload.shape().size,
                                            depth=RBEATS)
        m.d.comb += [wbuf.w_data.eq(front.wdata.payload), wbuf.w_en.eq(front.wdata.valid),
                     front.wdata.ready.eq(wbuf.w_rdy)]
        wbeat = front.wdata.payload.shape()(wbuf.r_data)
        w_beat = Signal(self.beats_width)
        w_last = Signal()
        w_step = Signal()
        wlast_err = Signal()
        m.d.comb += w_last.eq(w_beat == wrt.last)
        with m.If(wroute.r_rdy):
            with m.Switch(wrt.route):
                with m.Case(_Route.FRONT):
                    m.d.comb += [lines.wdata.valid.eq(wbuf.r_rdy),
                                 lines.wdata.payload.data.eq(wbeat.data),
                                 lines.wdata.payload.mask.eq(wbeat.mask),
                                 lines.wdata.payload.last.eq(w_last),
                                 w_step.eq(wbuf.r_rdy & lines.wdata.ready),
                                 wbuf.r_en.eq(lines.wdata.ready)]
                with m.Case(_Route.NONE):
                    m.d.comb += [w_step.eq(wbuf.r_rdy), wbuf.r_en.eq(1)]
                with m.Case(_Route.BACK):
                    m.d.comb += [lines.wdata.valid.eq(back.resp.valid),
                                 lines.wdata.payload.data.eq(back.resp.payload.data),
                                 lines.wdata.payload.mask.eq(-1),
                                 lines.wdata.payload.last.eq(w_last),
                                 back.resp.ready.eq(lines.wdata.ready),
                                 w_step.eq(back.resp.valid & lines.wdata.ready)]
            with m.If(w_step & (wrt.route != _Route.BACK) & (wbeat.last != w_last)):
                m.d.comb += wlast_err.eq(1)
        with m.If(w_step):
            m.d.sync += w_beat.eq(Mux(w_last, 0, w_beat + 1))
            with m.If(w_last):
                m.d.comb += wroute.r_en.eq(1)
        # a fill is complete (its row usable, its MSHR free) once its last beat is handed on
        m.d.comb += fill_done_now.eq(w_step & w_last & (wrt.route == _Route.BACK))
        with m.If(fill_done_now):
            m.d.comb += fills.r_en.eq(1)
            m.d.sync += [fill_open.eq(0), fills_done.eq(fills_done + 1)]
        # an MSHR is taken by a miss firing (its bit of `free_oh`) and freed by its fill's
        # completion (its bit of the fill's one-hot `mshr`); never both in one cycle
        for i in range(M):
            with m.If(s3_fire & is_miss & free_oh[i]):
                m.d.sync += mshr_valid[i].eq(1)
            with m.Elif(fill_done_now & fill_head.mshr[i]):
                m.d.sync += mshr_valid[i].eq(0)
        m.d.comb += [
            inc["errors"].eq((s3_fire & s3["err"]) + wlast_err),
            error_now.eq((s3_fire & s3["err"]) | wlast_err),
        ]

        # ==== back-port sequencer: write-back of the victim, then the fill request ============
        m.d.comb += fills.w_data.eq(Cat(job.set, job.way, job.mshr))
        # `jobs_any`: the job FIFO's `r_rdy` (`level != 0`) kept as a flip-flop, set from
        # compares of the registered level and this cycle's write and read, so that the
        # sequencer's decision (the fill queue's write, the job FIFO's read) starts at it
        jobs_any = Signal()
        jobs_wr = Signal()
        m.d.comb += jobs_wr.eq(jobs.w_en & jobs.w_rdy)
        with m.If(jobs_wr & ~jobs.r_en):
            m.d.sync += jobs_any.eq(1)
        with m.Elif(jobs.r_en & ~jobs_wr):
            m.d.sync += jobs_any.eq(jobs.level >= 2)
        with m.FSM(name="back"):
            with m.State("IDLE"):
                m.d.comb += seq_idle.eq(~jobs_any)
                with m.If(jobs_any):
                    with m.If(job.wb):
                        m.next = "WB_REQ"
                    with m.Else():
                        m.d.comb += [back.req.valid.eq(fills.w_rdy),
                                     back.req.payload.addr.eq(job.rd_row << LB),
                                     back.req.payload.beats.eq(RBEATS)]
                        with m.If(back.req.ready & fills.w_rdy):
                            m.d.comb += [jobs.r_en.eq(1), fills.w_en.eq(1)]
            with m.State("WB_REQ"):
                # The write request first: the back tier then takes the victim's data
                # whatever else it is waiting for, so the line reads ahead of it drain.
                m.d.comb += [back.req.valid.eq(1), back.req.payload.write.eq(1),
                             back.req.payload.addr.eq(job.wb_row << LB),
                             # (set here, not once outside the FSM: a constant-only
                             # `always @*` never runs in Icarus)
                             back.req.payload.beats.eq(RBEATS)]
                with m.If(back.req.ready):
                    m.next = "WB_LINE"
            with m.State("WB_LINE"):
                m.d.comb += wb_req.eq(1)
                with m.If(wb_grant):
                    with m.If(job.rd):
                        m.next = "FILL_REQ"
                    with m.Else():
                        m.d.comb += jobs.r_en.eq(1)
                        m.next = "IDLE"
            with m.State("FILL_REQ"):
                m.d.comb += [back.req.valid.eq(fills.w_rdy),
                             back.req.payload.addr.eq(job.rd_row << LB),
                             back.req.payload.beats.eq(RBEATS)]
                with m.If(back.req.ready & fills.w_rdy):
                    m.d.comb += [jobs.r_en.eq(1), fills.w_en.eq(1)]
                    m.next = "IDLE"

        # ==== `s3_ok` and `s3_res` for the next cycle ========================================
        # Both are computed for either outcome of stage 3's decision (it fires or not) from
        # registers and the other ports' handshakes, and the decision picks one last: it is
        # the end of the stall's path, so it passes one LUT here instead of the queue's count
        # and the MSHR and job-FIFO arithmetic.
        # Stage 3 holds stage 2's request next if it takes it (stage 2 holds one and stage 3
        # fires or is empty), else its own.
        s2_nobeats = pre["beats"] == 0
        err_f = Mux(pre["valid"], pre["err"], s3["err"])
        nobeats_f = Mux(pre["valid"], s2_nobeats, s3_nobeats)
        take_h = pre["valid"] & ~s3["valid"]
        err_h = Mux(take_h, pre["err"], s3["err"])
        nobeats_h = Mux(take_h, s2_nobeats, s3_nobeats)
        # the queue's count after this cycle: firing pushes unless the request has no beats,
        # and the push enters the queue unless it bypasses it into an empty, free executor
        # (`room_f`: `q_count + enters - pop < Q`, `room_h`: `q_count - pop < Q`, written as
        # compares of the registered count with constants, then one LUT with the handshakes:
        # no adder between the executor's handshake and these registers)
        q_enters = Signal()
        m.d.comb += q_enters.eq(~s3_nobeats & ~(~q_any & x_free))
        room_f, room_h = Signal(), Signal()
        m.d.comb += [room_f.eq((q_count < Q - 1) | ((q_count == Q - 1) & (~q_enters | pop))
                               | ((q_count == Q) & pop & ~q_enters)),
                     room_h.eq((q_count < Q) | pop)]
        ok_f = Mux(err_f, room_f | nobeats_f, room_f)
        ok_h = Mux(err_h, room_h | nobeats_h, room_h)
        # (an MSHR freed by a fill completing in this cycle counts from the cycle after next:
        # the fill's last beat is a line-port path that would otherwise end here). A miss that
        # fires takes the free MSHR `free_mshr` and writes a job; the walker's job (only while
        # a command runs, when no request fires) is written otherwise.
        # The job FIFO needs no check of its own: during lookups it holds at most one job per
        # valid MSHR (a miss writes its job as it takes its MSHR, the job leaves when the
        # back request is issued, before the fill that frees the MSHR; the walker's jobs are
        # all gone before a command completes), and it is `mshrs` deep, so a free MSHR
        # means room. Next cycle's miss needs a free MSHR besides the one a miss firing now
        # takes: two free now. Both flags are registers (`free_ge2`, `free_ge1`: the count of
        # free MSHRs, kept beside `mshr_valid`, is at least 2 or 1), set from compares of
        # the registered count and this cycle's taking and freeing (no tree over the MSHRs'
        # valid bits in front of the stall's registers and their copies).
        # (`free_all`, every MSHR free, is `~mshr_valid.any()` kept as a flip-flop the same
        # way, for the command walker's drain check)
        mshr_free = Signal(range(M + 1), init=M)
        free_ge1, free_ge2 = Signal(init=1), Signal(init=int(M >= 2))
        free_all = Signal(init=1)
        taken, freed = s3_fire & is_miss, fill_done_now
        m.d.sync += mshr_free.eq(mshr_free + freed - taken)
        with m.If(freed & ~taken):
            m.d.sync += [free_ge1.eq(1), free_ge2.eq(mshr_free >= 1),
                         free_all.eq(mshr_free == M - 1)]
        with m.Elif(taken & ~freed):
            m.d.sync += [free_ge1.eq(mshr_free >= 2), free_ge2.eq(mshr_free >= 3),
                         free_all.eq(0)]
        res_miss, res_other = free_ge2, free_ge1
        # (the queue entry, by error or not, and a miss's MSHR and job room, apart: stage 2's
        # hit, the end of its compare, is not on these registers' paths)
        s3_valid_next = s3_take | (s3["valid"] & ~s3_fire)
        s3_ok_n, s3_res_n = Signal(), Signal()
        ok_f_c, ok_h_c, res_miss_c, res_other_c = Signal(), Signal(), Signal(), Signal()
        m.d.comb += [ok_f_c.eq(ok_f), ok_h_c.eq(ok_h), res_miss_c.eq(res_miss),
                     res_other_c.eq(res_other),
                     s3_ok_n.eq(Mux(s3_fire, ok_f_c, ok_h_c) & s3_valid_next),
                     s3_res_n.eq(Mux(s3_fire & is_miss, res_miss_c, res_other_c))]
        m.d.sync += [s3_ok.eq(s3_ok_n), s3_res.eq(s3_res_n)]

        # ==== commands: drain, then walk the sets ==============================================
        lines_quiet = (rroute.level == 0) & ~wroute.r_rdy
        drained = (~r["valid"] & ~s2["valid"] & ~pre["valid"] & ~s3["valid"] & ~q_any
                   & ~x_valid & free_all & seq_idle & ~fills.r_rdy & lines_quiet)
        m.d.comb += self.idle.eq(drained & ~cmd_active)
        # `cmd.ready` comes from a register: a combinational output of an FSM state that only
        # changes once would never be evaluated by Icarus before its first change.
        cmd_ready = Signal()
        m.d.comb += self.cmd.ready.eq(cmd_ready)
        # The walker's write-back jobs pass a register (`walk_job`, valid `wj_valid`) on their
        # way to the job FIFO: the FIFO's data come from registers while a command runs.
        with m.If(wj_valid & jobs.w_rdy):
            m.d.comb += [jobs.w_en.eq(1), walk_wb.eq(1)]
            m.d.sync += wj_valid.eq(0)
        with m.FSM(name="command"):
            with m.State("IDLE"):
                # (`walk_set` is already 0: reset as the last command ended, so the drain
                # check, an AND of every unit's idle flag, enables one flip-flop and the
                # state, not the walked set's register)
                with m.If(self.cmd.valid & drained):
                    m.d.sync += cmd_active.eq(1)
                    with m.If(self.cmd.payload == CacheOp.FLUSH):
                        m.next = "READ_SET"
                    with m.Else():
                        m.next = "CLEAR"
            with m.State("CLEAR"):
                m.d.comb += [cw_en_n.eq(1), cw_clear_n.eq(1)]
                m.d.sync += [cw_addr.eq(walk_set), walk_set.eq(walk_set + 1)]
                with m.If(walk_set == self.sets - 1):
                    m.d.sync += cmd_ready.eq(1)
                    m.next = "DONE"
            with m.State("READ_SET"):
                # (the tag store's read address is the walked set while a command runs, and
                # stage 1 is empty, so its read is enabled; the way slices' copies of stage
                # 2's slice bits take the walked set's, choosing its slice behind the output
                # registers)
                m.d.comb += walk_read.eq(1)
                m.next = "LOAD"
            with m.State("LOAD"):
                # the block RAM's word lands in the banks' output registers (stage 2 is
                # empty while a command runs), so each block-RAM output bit drives one
                # flip-flop
                m.d.comb += walk_load.eq(1)
                m.next = "PREP"
            with m.State("PREP"):
                m.d.sync += [walk_way.eq(0),
                             walk_dirty.eq(Cat(v.valid & v.dirty for v in way_raw))]
                m.next = "SCAN"
            with m.State("SCAN"):
                # one way per cycle: the way looked at is chosen from the output registers
                # (which hold the set until the next one is read); whether it needs a
                # write-back is the low bit of `walk_dirty`, shifted as the walk steps
                head = self.way_layout(Array(v.as_value() for v in way_raw)[walk_way])
                need_wb = Signal()
                m.d.comb += need_wb.eq(walk_dirty[0])
                with m.If(~need_wb | ~wj_valid | jobs.w_rdy):
                    m.d.sync += walk_dirty.eq(walk_dirty >> 1)
                    with m.If(need_wb):
                        m.d.sync += [
                            wj_valid.eq(1),
                            walk_job.wb.eq(1), walk_job.rd.eq(0),
                            walk_job.wb_row.eq(row_of(head.tag, walk_set[:set_w])),
                            walk_job.set.eq(walk_set), walk_job.way.eq(walk_way),
                            walk_job.mshr.eq(0), walk_job.rd_row.eq(0),
                        ]
                    m.d.sync += walk_way.eq(walk_way + 1)
                    with m.If(walk_way == W - 1):
                        # every line of the set is clean once its write-back is queued
                        m.d.comb += cw_en_n.eq(1)
                        m.d.sync += [cw_addr.eq(walk_set), walk_set.eq(walk_set + 1)]
                        with m.If(walk_set == self.sets - 1):
                            m.next = "WAIT_WB"
                        with m.Else():
                            m.next = "READ_SET"
            with m.State("WAIT_WB"):
                with m.If(seq_idle & lines_quiet & ~wj_valid):
                    m.d.sync += cmd_ready.eq(1)
                    m.next = "DONE"
            with m.State("DONE"):
                m.d.sync += [cmd_active.eq(0), cmd_ready.eq(0), walk_set.eq(0)]
                m.next = "IDLE"

        # ==== way slices ========================================================================
        # Each way's state word passes through the lookup in a slice of its own: its part of
        # its bank's output registers, the forwarding of stage 3's updates, the compare, the
        # registered words of the later stages and the update, all under enables and selects
        # that the slice computes itself from its own copies of the lookup's control
        # registers (the stage valids, stage 3's resource flags and pins, the set-equality
        # flags of the stages). No select or enable of the wide words is then one net to
        # every way: each copy drives one way's ~27 bits. Each slice keeps its copies by the
        # central registers' rules, with its own moves and stall (computed from its copies)
        # as the selects, so every slice takes the same decisions in the same cycle as the
        # central control; what the slices share reaches them from registers and ports
        # through shallow logic, not from behind the stall. (The copies are flagged
        # `KEEP_COPY_ATTR`: the FPGA flow keeps them as they are.)
        # Stage 1's set compared with the sets ahead of it (the slices keep these as flags,
        # for every way the stages may move, the moves choosing last; exact while the stage
        # ahead holds a request, which is when they are used).
        eq_req, eq_r = {}, {}
        for key, st in (("r", r), ("s2", s2), ("pre", pre), ("s3", s3)):
            eq_req[key] = Signal(name=f"eq_{key}_req")
            m.d.comb += eq_req[key].eq(st["set"] == req_set)
            if key != "r":
                eq_r[key] = Signal(name=f"eq_{key}_r")
                m.d.comb += eq_r[key].eq(st["set"] == r["set"])
        eq3_req = eq_req["s3"]
        ready1_c = ~r["valid"] | s2_take
        m.d.sync += [
            e2r.eq(Mux(s2_take, eq_req["r"], Mux(ready1_c, eq_req["s2"], eq_r["s2"]))),
            e3r.eq(Mux(s3_take, Mux(ready1_c, eq_req["pre"], eq_r["pre"]),
                       Mux(ready1_c, eq_req["s3"], eq_r["s3"]))),
        ]
        if CS == 2:
            m.d.sync += ecr.eq(Mux(s2_leave, Mux(ready1_c, eq_req["s2"], eq_r["s2"]),
                                   Mux(ready1_c, eq_req["pre"], eq_r["pre"])))
        if not LA:
            m.d.sync += just.eq(upd_now & Mux(~r["valid"] | s2_take, eq3_req, eq_r["s3"]))

        def copy(name, w, *, reset_less=False, init=0):
            return Signal(name=f"w{w}_{name}", reset_less=reset_less, init=init,
                          attrs={KEEP_COPY_ATTR: "1"})

        raw = [[Signal(bank_layout, name=f"raw{d}_b{g}", reset_less=True) for d in range(NS)]
               for g in range(NG)]
        for w in range(W):
            g, j = divmod(w, G)
            k = {n: copy(n, w) for n in ("r_v", "s2_v", "s3_v", "s3_ok", "s3_res", "took",
                                         "pin_stay", "s3_miss", "s3_hit", "cw_en", "cw_clear",
                                         "pin_enter" if LA else "just")}
            k.update({n: copy(n, w, reset_less=True) for n in ("s3_err", "s3_write")})
            k.update({n: copy(n, w, reset_less=True, init=1) for n in ("e2r", "e3r")})
            if CS == 2:
                k["c_v"] = copy("c_v", w)
                k["ecr"] = copy("ecr", w, reset_less=True, init=1)
            # the slice's own stall and moves (the central ones' equals)
            fire, upd, take3, leave2, hold_w, take2 = (
                Signal(name=f"w{w}_{n}") for n in ("fire", "upd", "take3", "leave2", "hold",
                                                   "take2"))
            pre_v = k["c_v"] if CS == 2 else k["s2_v"]
            m.d.comb += [
                fire.eq(k["s3_ok"] & ~(k["s3_miss"] & ((Mux(k["took"], k["pin_enter"],
                                                            k["pin_stay"]) if LA
                                                        else k["took"] | k["pin_stay"])
                                                       | ~k["s3_res"]))),
                upd.eq(fire & ~k["s3_err"]),
                take3.eq(pre_v & (~k["s3_v"] | fire)),
                leave2.eq((k["s2_v"] & (~k["c_v"] | take3)) if CS == 2 else take3),
                hold_w.eq((k["s2_v"] & k["e2r"])
                          | ((k["c_v"] & k["ecr"]) if CS == 2 else 0)
                          | ((k["s3_v"] & ~fire & k["e3r"]) if LA
                             else (k["s3_v"] & k["e3r"]) | k["just"])),
                take2.eq(k["r_v"] & (~k["s2_v"] | leave2) & ~hold_w),
            ]
            ready1 = ~k["r_v"] | take2          # stage 1 takes a request (or is empty)
            accept_w = front.req.valid & ready1 & ~self.cmd.valid & ~cmd_active
            # The stages' sets, copied into the slice by the central registers' rules, and
            # compared here with the request's set (`leq`): the compare of the port's set,
            # the deepest input of the set-equality flags, then reaches only the slice's
            # own flags (one shared compare, its result routed to every slice, was the
            # routed critical path: 116.0 MHz at 8 ways x 1,024 sets).
            lset = {n: Signal(set_w, name=f"w{w}_{n}_set", reset_less=True,
                              attrs={KEEP_COPY_ATTR: "1"})
                    for n in (("r", "s2", "c", "s3") if CS == 2 else ("r", "s2", "s3"))}
            lpre = lset["c"] if CS == 2 else lset["s2"]
            with m.If(ready1):
                m.d.sync += lset["r"].eq(req_set)
            with m.If(take2):
                m.d.sync += lset["s2"].eq(lset["r"])
            if CS == 2:
                with m.If(leave2):
                    m.d.sync += lset["c"].eq(lset["s2"])
            with m.If(take3):
                m.d.sync += lset["s3"].eq(lpre)
            leq = {}
            for n, v in (("r", lset["r"]), ("s2", lset["s2"]), ("pre", lpre), ("s3", lset["s3"])):
                leq[n] = Signal(name=f"w{w}_eq_{n}_req")
                m.d.comb += leq[n].eq(v == req_set)
            # The copies' next values: the central registers' rules, with the slice's own
            # moves and stall as the selects (what is shared reaches the slices from
            # registers and ports through shallow logic, not behind the stall).
            m.d.sync += [
                k["r_v"].eq(accept_w | (k["r_v"] & ~take2)),
                k["s2_v"].eq(take2 | (k["s2_v"] & ~leave2)),
                k["s3_v"].eq(take3 | (k["s3_v"] & ~fire)),
                k["took"].eq(take3),
                k["s3_ok"].eq(Mux(fire, ok_f_c, ok_h_c) & (take3 | (k["s3_v"] & ~fire))),
                k["s3_res"].eq(Mux(fire & k["s3_miss"], res_miss_c, res_other_c)),
                k["pin_stay"].eq(pin_stay_n),
                k["s3_miss"].eq(Mux(take3, ~pre["err"] & ~ch_hit, k["s3_miss"])),
                k["s3_hit"].eq(Mux(take3, ch_hit, k["s3_hit"])),
                k["s3_err"].eq(Mux(take3, pre["err"], k["s3_err"])),
                k["s3_write"].eq(Mux(take3, pre["write"], k["s3_write"])),
                k["cw_en"].eq(cw_en_n), k["cw_clear"].eq(cw_clear_n),
                k["e2r"].eq(Mux(take2, leq["r"], Mux(ready1, leq["s2"], eq_r["s2"]))),
                k["e3r"].eq(Mux(take3, Mux(ready1, leq["pre"], eq_r["pre"]),
                                Mux(ready1, leq["s3"], eq_r["s3"]))),
            ]
            if LA:
                m.d.sync += k["pin_enter"].eq(pin_enter_n)
            else:
                m.d.sync += k["just"].eq(upd & Mux(ready1, leq["s3"], k["e3r"]))
            if CS == 2:
                m.d.sync += [
                    k["c_v"].eq(leave2 | (k["c_v"] & ~take3)),
                    k["ecr"].eq(Mux(leave2, Mux(ready1, leq["s2"], eq_r["s2"]),
                                    Mux(ready1, leq["pre"], eq_r["pre"]))),
                ]
            # the bank's memories: read on every lookup accepted (and while stage 1 is
            # empty, when the data are not used; without lookahead, every cycle, stage 1's
            # set while it waits), their words into the output registers. Each memory's
            # address, enables and output registers' enable come from its own way slice's
            # copies (slice ``d`` of the bank for memory ``d``; the memories of a bank are
            # its tag slices): one slice steering every memory of its bank put that net,
            # the end of the slice's stall, across the block RAMs (8.57 ns on router1,
            # seed 2, into the address of the bank's other memory).
            for d, (rd, wr) in enumerate(tag_ports[g]):
                if d % G != j:
                    continue
                if LA:
                    m.d.comb += [rd.addr.eq(Mux(cmd_active, in_slice(walk_set),
                                                in_slice(req_set))),
                                 rd.en.eq(ready1)]
                else:
                    m.d.comb += rd.addr.eq(Mux(cmd_active, in_slice(walk_set),
                                               Mux(ready1, in_slice(req_set),
                                                   in_slice(r["set"]))))
                with m.If(take2 | walk_load):
                    m.d.sync += raw[g][d].eq(rd.data)
                m.d.comb += [wr.addr.eq(in_slice(wr_set)),
                             wr.en.eq((k["cw_en"] | upd) & (slice_of(wr_set) == d))]
            # the slice of the output registers holding this way's word: the slice bits of
            # stage 2's set (or of the walked set), copied
            if NS > 1:
                sl = Signal(S - LOB, name=f"w{w}_slice", reset_less=True)
                with m.If(take2 | walk_read):
                    m.d.sync += sl.eq(Mux(walk_read, walk_set[LOB:S], r["set"][LOB:S]))
                m.d.comb += way_raw[w].eq(Array(raw[g][d][j] for d in range(NS))[sl])
            else:
                m.d.comb += way_raw[w].eq(raw[g][0][j])
            new = Signal(self.way_layout, name=f"w{w}_new")
            if LA:
                # forwarding: the last cycle's new state of this way (`fw_last`), whether
                # that update was of stage 1's set (`fw_hit`), the state stage 1 saw before
                # (`fw_hold`)
                fw_last = Signal(self.way_layout, name=f"w{w}_fw_last", reset_less=True)
                fw_hold = Signal(self.way_layout, name=f"w{w}_fw_hold", reset_less=True)
                fw_word = Signal(self.way_layout, name=f"w{w}_fw_word")
                fw_hit, r_fwd, s2_fwd = (Signal(name=f"w{w}_{n}")
                                         for n in ("fw_hit", "r_fwd", "s2_fwd"))
                s2_fwd_word = Signal(self.way_layout, name=f"w{w}_s2_fwd_word",
                                     reset_less=True)
                fwd_now = upd & k["e3r"]
                m.d.comb += fw_word.eq(Mux(fw_hit, fw_last, fw_hold))
                m.d.sync += [fw_last.eq(new), fw_hold.eq(fw_word)]
                with m.If(accept_w):
                    m.d.sync += [r_fwd.eq(upd & eq3_req), fw_hit.eq(upd & eq3_req)]
                with m.Else():
                    with m.If(fwd_now):
                        m.d.sync += r_fwd.eq(1)
                    m.d.sync += fw_hit.eq(fwd_now)
                with m.If(take2):
                    m.d.sync += [s2_fwd.eq(r_fwd | fwd_now),
                                 s2_fwd_word.eq(Mux(fwd_now, new, fw_word))]
                m.d.comb += way_s2[w].eq(Mux(s2_fwd, s2_fwd_word, way_raw[w]))
            else:
                # no forwarding: stage 1 took its word from a read after the last update
                m.d.comb += way_s2[w].eq(way_raw[w])
            # stage 2: this way's flags (registered with two compare stages)
            hit_f, inv_f, old_f = WayMatch.way_flags(way_s2[w], s2["tag"], ways=W,
                                                      policy=self.policy)
            m.d.comb += [s2_inv[w].eq(inv_f), s2_old[w].eq(old_f)]
            if CS == 2:
                with m.If(leave2):
                    m.d.sync += [way_pre[w].eq(way_s2[w]), c_hit[w].eq(hit_f),
                                 c_loc[w].eq(s2_loc[w]), c_old[w].eq(old_f)]
            else:
                m.d.comb += [way_pre[w].eq(way_s2[w]), c_hit[w].eq(hit_f),
                             c_invf[w].eq(s2_invf[w]), c_old[w].eq(old_f)]
            # stage 3: this way's word, whether it is the hit way or the victim, their
            # replacement states; the selected way by the slice's copy of the hit flag; the
            # new state
            hit_oh, vic_oh = (Signal(name=f"w{w}_{n}", reset_less=True)
                              for n in ("hit_oh", "vic_oh"))
            hit_repl, vic_repl = (Signal(repl_w, name=f"w{w}_{n}", reset_less=True)
                                  for n in ("hit_repl", "vic_repl"))
            with m.If(take3):
                m.d.sync += [way_s3[w].eq(way_pre[w]), hit_oh.eq(c_hit[w]),
                             vic_oh.eq(ch_victim_oh[w]), hit_repl.eq(hit_repl_c),
                             vic_repl.eq(vic_repl_c)]
            sel_oh = Mux(k["s3_hit"], hit_oh, vic_oh)
            sel_repl = Mux(k["s3_hit"], hit_repl, vic_repl)
            StateUpdate.way_next(m, way_s3[w], new, is_sel=sel_oh, sel_repl=sel_repl,
                                 hit=k["s3_hit"], write=k["s3_write"], tag=s3["tag"],
                                 policy=self.policy, lfu_bits=self.lfu_bits)
            # the word written: the update, or the walker's (initial state, or this way's
            # word as read, made clean)
            raw_w = way_raw[w]
            clean = Cat(raw_w.valid, Const(0, 1), raw_w.tag, raw_w.repl)
            wdata = Mux(k["cw_en"], Mux(k["cw_clear"], init_word[w].as_value(), clean), new)
            for d, (rd, wr) in enumerate(tag_ports[g]):
                m.d.comb += wr.data[j].eq(wdata)
        return m


class OnChipCache(wiring.Component):
    """A :class:`CacheController` with its lines in a :class:`LineRAM`: the small
    configuration (the RTL SmartNIC top's cache, the fast tests), the same ports as the
    controller but ``lines``. Keyword arguments are the controller's; ``line_outstanding``
    defaults to 6, which covers the line RAM (a request waiting, one served, a beat at the
    block RAM's output and one in the response register, and one more because the route FIFO
    takes no entry in the cycle it frees one)."""

    def __init__(self, **kwargs):
        kwargs.setdefault("line_outstanding", 6)
        self.controller = CacheController(**kwargs)
        for name in ("data_bytes", "addr_width", "beats_width", "line_beats", "row_beats",
                     "sets", "ways", "index", "policy", "mshrs", "queue_depth",
                     "line_outstanding", "lfu_bits", "counter_width"):
            setattr(self, name, getattr(self.controller, name))
        c = self.controller
        self.line_ram = LineRAM(data_bytes=c.data_bytes, addr_width=c.lines_addr_width,
                                beats_width=c.beats_width)
        members = dict(c.signature.members)
        del members["lines"]
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.controller = c = self.controller
        m.submodules.line_ram = ram = self.line_ram
        wiring.connect(m, c.lines, ram.port)
        for name in self.signature.members:
            ours, theirs = getattr(self, name), getattr(c, name)
            if name in ("front", "cmd"):
                wiring.connect(m, wiring.flipped(ours), theirs)
            elif name == "back":
                wiring.connect(m, theirs, wiring.flipped(ours))
            else:
                m.d.comb += ours.eq(theirs)
        return m
