"""The embedding gather/pool unit: table-batched EmbeddingBag forward as a streaming datapath.

:class:`EmbeddingBagUnit` reads embedding rows through a memory port (``rtl.streams``) and
pools them per bag (SUM, MEAN, MAX, optional per-sample weights), for several tables with
their own row counts, dimensions and element types, the way FBGEMM's table-batched embedding
(TBE) and ``torch.nn.EmbeddingBag`` do. It is the datapath a SmartNIC or an accelerator runs
next to its embedding memory; it sits on a cache controller's front port unchanged.

Interface
=========

``desc`` (in, stream of :class:`DescriptorLayout`) - the table-descriptor store's write port
    One write per table id: ``base`` (beat address of row 0), ``rows``, ``dim``,
    ``elem_type`` (0 fp32, 1 fp16, 2 bf16; see :data:`ELEM_TYPE_CODES`), ``pooling``
    (0 SUM, 1 MEAN, 2 MAX; :data:`POOLING_CODES`), ``pad_valid``/``pad_index`` (the padding
    index, if any). Always ready. A write takes effect for bags whose header enters the
    pre-decode stage (the cycle after the unit accepts it, or later) on a later cycle (a bag
    latches its descriptor there). A descriptor with ``dim`` outside
    ``1..max_dim``, an element type this instance was not built for, or an unknown pooling code
    is stored as *invalid* (bags on that table become error bags), a table id
    ``>= tables`` is ignored; both count in ``counters.desc_rejected``.

``bags`` (in, stream of :class:`BagItemLayout`) - the combined lengths format
    Per bag, a header item (``header=1``: ``table``, ``length``, ``weighted``, ``tag``)
    followed by ``length`` index items (``header=0``: ``index`` and, for a weighted bag,
    its FP32 ``weight``). An index equal to the table's padding index is skipped; an index
    ``>= rows`` is dropped and counted (``counters.indices_dropped``), and the bag's output
    carries ``dropped=1``. Neither counts for MEAN. A bag on a table without a valid
    descriptor is consumed and answered with one zero beat flagged ``error``. Protocol slips
    never hang the unit: an index item where a header is expected is dropped; a header where
    an index is expected closes the current bag early (its beats carry the rows pooled so far
    and ``error``) and then starts its own bag; both count in ``counters.protocol_errors``.
    Lengths are limited to ``max_bag_length`` by the width of the ``length`` field.

``mem`` (out, :class:`rtl.streams.MemPortSignature`) - row reads
    One read request per contributing index: ``addr = base + index * stride``,
    ``beats = stride``, where ``stride = ceil(dim * elem_bytes / data_bytes)``: every row
    starts on a beat boundary and its last beat is padded (what the padding holds is ignored).
    At most ``outstanding`` rows are in flight (requested and not fully consumed), which hides
    a memory latency of about ``outstanding * stride`` cycles. Writes are never issued.

``pooled`` (out, stream of :class:`PooledBeatLayout`) - the results, in bag order
    Each bag produces ``ceil(dim / lanes)`` beats of ``lanes`` FP32 values (element
    ``k*lanes + i`` in lane ``i`` of beat ``k``; lanes past ``dim`` in the last beat are zero),
    tagged with the bag's ``tag``, ``first``/``last`` on its first and last beat, and the
    ``error``/``dropped`` flags (an error bag is one zero beat).

``counters`` (out, :class:`CountersLayout`) and ``busy`` (out)
    Free-running 32-bit event counters (reset with the unit): ``busy_cycles`` (cycles with any
    bag in the unit or waiting at its input), ``beats_read``, ``rows_requested``, ``bags_in``,
    ``bags_out``, stall cycles by cause - ``stall_memory`` (the reducer waits for row data),
    ``stall_hazard`` (a row's word waits for the same word's previous sum to leave the adder),
    ``stall_bank`` (a bag's first row waits for an accumulator bank still being drained),
    ``stall_output`` (``pooled`` valid and not ready), ``stall_input`` (busy with no input
    offered) - and ``indices_dropped``, ``indices_padding``, ``desc_rejected``,
    ``protocol_errors``. A counter adds an event one cycle after it happens (from a
    registered flag), and ``busy`` (a bag in the unit or at its input) stays high while an
    event waits to be counted, so counters read once ``busy`` is low are complete. ``busy``
    is registered (high on the cycle after one with a bag in the unit or an event waiting to
    be counted) or'ed with ``bags.valid``: it falls one cycle after the unit goes idle.

Numbers and reduction order
===========================

FP16 and BF16 rows are widened to FP32 (exact), then all arithmetic is IEEE-754 binary32 with
round to nearest even (``rtl.fp``), element by element in index order:

* SUM: ``acc = ((0 + v0) + v1) + ...``; ``v_i = r_i``, or ``v_i = w_i * r_i`` (one rounding)
  for a weighted bag. MEAN: that sum times ``RNE(1/count)`` (one more rounding), where
  ``count`` counts the contributing rows; the reciprocals come from a ROM. MAX: ``acc = r0``,
  then ``acc = r_i`` only where ``r_i > acc`` in IEEE order (ties, ``+0`` vs ``-0`` included,
  keep the earlier row); weights are not applied in MAX.
* NaN in MAX follows torch's CPU ``EmbeddingBag`` (its running maximum takes a row only where
  ``row > max``): a NaN in the first contributing row stays (nothing compares greater than
  NaN), a NaN in a later row is ignored. It is not ``torch.max`` over the rows, which would
  return NaN whenever any row holds one.
* Weighted sums round the product before adding it (two roundings per row). torch's CPU
  kernels and FBGEMM accumulate ``w_i * r_i`` with a fused multiply-add (one rounding), so a
  weighted bag may differ from them in the last bits; it is bit-exact to
  ``sim.reference.embedding.pool``, and both are within ``error_bound`` of the exact value.
  The unit does not claim bit-exactness with FBGEMM for weighted bags (a fused multiply-add
  per lane would cost a 48-bit-aligned adder in place of the rounded product).
* A bag without contributing rows gives zeros. Arithmetic NaN results are the canonical quiet
  NaN. ``sim.reference.embedding`` computes the same order in numpy (the bit-exact target).

Microarchitecture and timing
============================

Every stream that enters or leaves the unit passes a register slice (``bags`` a
:class:`rtl.streams.SkidBuffer`, ``mem.req`` and ``mem.resp`` a
:class:`rtl.streams.PingPongBuffer`, which behaves the same, cycle for cycle), and ``pooled`` comes from a queue (a LUT-RAM queue read
into a ``PingPongBuffer``, so ``pooled.ready`` enables no beat-wide register): no combinational path
crosses the unit's boundary, so a stall inside it (the accumulator hazard, a full queue) never
reaches the memory or cache in front of it. Inside, each stage stalls only itself: the
datapath after the reducer's issue stage and the drain's pipeline run free (no enable), and
the stages that may wait hold queues or credits sized for what is in flight.

Pre-decode (one register stage behind the input skid buffer, a ``PingPongBuffer`` of the item
and what was decoded from it, so that the parse's take steers its pointers, not the enable of
every bit of the item, beside a ``SkidBuffer`` of the flags the parse decides with, so that its
decisions do not wait for the buffer's read multiplexer): a header reads its table's
descriptor, an index is compared with the bag's padding index and row count, so that the
parse decides from flip-flops (the room of the item's slot and of the bag queue are flags
chosen a cycle ahead). Parse (one input item per cycle): a header costs one cycle;
each index costs one cycle and, if it contributes, queues a row entry (with its read request,
``base + index * stride``, computed in two register stages: the parse's index and its bag's
stride go into the first, the product of those flip-flops runs free into a register with no
reset or enable, the DSP block's output register on an FPGA, beside the second, and the
queue's write data add the base) in its bag's *slot*. A bag's first
contributing row claims the next accumulator bank (``2 * interleave`` banks, claimed in bag
order, waiting if that bank is still draining); the bag's slot is ``bank % interleave``. A
bag's last item queues its bag entry for the drain, and an end-only entry in its slot when
that item did not contribute. An empty bag (or one without contributing rows) costs its
header cycle and its zero beats at the drain; it takes no bank and no reducer slot.

Arbiter: one entry per cycle, round robin over the slots with an entry (a one-hot grant
held in flip-flops, computed a cycle ahead from the slot heads' look-ahead: one candidate per
slot that may go on this cycle, with that slot a constant, and one for no slot going, all from
flip-flops (each slot's head as it will be on the next cycle, for either outcome, is itself a
set of flip-flops kept a cycle ahead); the current grant and the slots' room only select among
them at the end, and the
pacing counts the rows in flight as of the cycle before, so the reducer's row completion does
not reach the grant; on its cycle only the
downstream room decides whether the granted head goes; each slot's head is a
``PingPongBuffer``, so the grant steers its pointers, not its entries' enables, and the
candidates read the head's control fields from a slice and a small queue of their own beside
the slot's, so that they share no flip-flop with the wide entries; two more copies of the
grant select the granted entry for the request and the row queue), into the
read requests and the reducer's row queue (at most ``outstanding`` rows requested and not
fully consumed). Rows of up to ``interleave`` bags alternate, so consecutive rows of one bag
are separated by the other bags' rows: this hides the adder's read-add-write distance without
changing any bag's summation order. A slot holds ``slot_depth`` entries; the parse runs ahead
of the reducer by that much per slot, so bags longer than about ``slot_depth`` rows are
interleaved only in part (the parse is in order and waits for room in the long bag's slot).

Reducer: consumes row data ``lanes`` elements ("a word") per cycle: a beat holds
``data_bytes / (4 * lanes)`` FP32 words or twice as many 16-bit words, so an FP32 beat takes
one cycle when ``lanes * 4 == data_bytes`` (the default) and a 16-bit beat two. The issue
stage takes a word only if no word of the same accumulator address was issued in the last
``add_latency`` cycles (a scoreboard of the recent issues). Its stall flags (this hazard,
a bank still draining) are flip-flops, computed a cycle ahead for each thing the head can be
next (the same word, the row's next word, or the next queue entry's first word, seen through
the read slice's look-ahead), with ``take`` the last select, so that no long path runs from
the accumulator state through the handshake (their compares read the stall logic's own copy
of the head's bank, not the flip-flops the rest of the issue stage reads); the compares of the
window's addresses with the head's word and its next word are flip-flops as well, kept a cycle
ahead as the window shifts, and so are the window's word-0 flags per bank; a bank freed by the
drain is seen one cycle later. The row queue's head is read through two slices holding the
same entry: its control fields through a ``SkidBuffer`` (few enables), the whole entry
through a ``PingPongBuffer``.
After the issue stage the words pass a widening register, ``fanout_stages`` fan-out
registers, the weight multipliers (``FPMul32``, ``mul_latency``) and the adders
(``FPAdd32``, ``add_latency``) or the max selectors (one :class:`PoolLane` per lane) into
their bank, at a fixed latency. Each lane is
a self-contained slice: its multiplier, adder and max selector, its own accumulator memories
(one block RAM per copy on ECP5) with their own registered addresses and write enable, and its
own copy of every flag it reads; what all lanes need from the issue stage (the row's weight)
reaches them through a register tree of fan-out 4 (``fanout_stages`` levels, one per factor
of 4 in ``lanes``), so no net from one register spans every lane in one cycle. Synthesis
merges registers with equal inputs, so the copies are made logically distinct: each is gated
by whether the first lane it serves holds an element of the row, and a lane outside the row
gets a value that changes nothing that is output. A bag's words live at addresses
``0 .. ceil(dim/lanes)-1`` of its bank; the accumulator has registered (block-RAM) read ports,
each followed by a register with no logic before it, and the adder's input takes the word read
three stages ahead or, when the word was written back since (in the last two cycles or on this
one), the newest write-back (kept in registers, selected by flags compared two cycles ahead
and copied per lane), so two words of one address are issued at least ``add_latency + 1``
cycles apart. Rows of ``W`` words of ``interleave`` bags cost
``max(W, (add_latency + 1) / interleave)`` cycles each in steady state.

Drain: in bag order, once a bag's last word has been written back, reads its words, multiplies
them by ``1/count`` for MEAN (another ``FPMul32`` per lane, the reciprocal copied to the lanes
through a register tree like the weight's, of at least two levels, so that the read data pass
a register with no logic before it between the block RAMs' output registers and the
multipliers) and writes them into the output queue, one
beat per cycle while the queue has room for everything in flight (a credit counter).
:attr:`EmbeddingBagUnit.timing` gives the pipeline figures the timing model
(``sim.timing.embedding``) uses.

Reset: only valid and control state has a reset (the stages' valid flags, the queues' pointers
and levels, the arbiter, the banks, the counters). The data registers have none: the FP
pipelines (``reset_less``), the max selectors' registers and the adders' and max selectors'
operand registers (``acc_old``, ``acc_max``), the entries of every ``PingPongBuffer`` slice, the
delay lines' memories (``delay_memory``), and every field of the pipeline contexts but
``valid``. Each is read only where a flag with a reset says it holds data (or its value changes
nothing that is output), and in use each holds stale data whenever it is not valid, so a reset
that leaves them as they were changes nothing (a test resets the unit between batches of bags
and compares with a fresh unit, cycle for cycle). ``pooled.payload`` and ``mem.req.payload`` may
then differ after a reset while their ``valid`` is low, where they are not defined.

Clock, measured (``host.bench.timing``'s synthesis and nextpnr settings, ECP5 LFE5U-85F speed
grade 6, ``router2``). At the ``bench timing`` table set with 2 lanes and 8 B beats, placement
seeds 1 / 2: 121.0 / 122.1 MHz, 9,820 LUTs, 11,115 FFs, 4 DP16KD, 17 MULT18X18D (session 15;
113.4 / 118.1 MHz in session 14, 111.7 / 112.5 in session 13, 103.1 / 100.9 before). Session
14 took, path by path from a static listing of nextpnr's SDF, the window's compares, the
slot heads' read pointers and the grant (in copies of one per 16 bits of the entry), the
bank-wait flag, the max selector's compare (16-bit halves), the row queue's ``w_rdy``, the
multipliers' leading-zero gate, the row address's base (per slot queue), the bag queue's
write data and the issue flags' skid flag off the critical paths. Session 15's changes, for
the paths over 8 ns of session 14's two runs (7 endpoints on seed 1, 24 on seed 2): ``busy``
and its two event flags from four registered ORs of the unit's parts (``stall_input``'s flag
from the request slice's valid, 8.8 ns: 6 cells, 6.9 of routing); the adders' normalising
limit formed in their third step (their fifth step from the exponent, 8.2); the
reciprocal's ROM address a flip-flop computed a cycle ahead (the drain's read from the head's
multiplexer, 8.1); the effective exponent's zero test on its bit 0 only (the adders' first
step, the exponent difference, 8.5); each operand's class registered a step before the
special result, in the adders and the multipliers (8.2); ``word == 0`` a flip-flop (the bank
claim, 8.1); the hazard and bank-wait flags copied for the window's flags (``take``'s loads);
the control queues' write enable a copy of the slot queues' (7.8). Without the adders'
class flags and the enable's copy: seed 1 110.7 MHz (its worst a slot queue's read pointer into its head's input register,
9.0 ns of which 8.0 routing, then the grant, 8.6). Placement moves these figures by several
percent between netlists. 125 MHz is not reached. Over 8 ns now: 9 endpoints on seed 1 (the
weight multiplier's leading-zero count of a subnormal's fraction, 8.3 ns, ending at the
count registers' synchronous set/reset, behind the fraction's zero test; the grant from a
slot's control slice, 8.1; the drain multipliers' leading-zero counts, 8.1; the window's
``hit_step`` from the response slice's valid, 8.0), 7 on seed 2 (the grant from a slot's
control slice, 8.2: 10 cells, 5.8 of routing; the adder's seventh step, the normalising
shift, 8.1; the pre-decode's skid flag from the input item, 8.1). Session 16 cut four of
these, cycle for cycle the same (not yet placed and routed at 2 lanes): the multipliers'
leading-zero count in two halves (each byte's count and zero test in step 1, their
combination in step 2, the counts' sum in step 3: ``rtl.fp.leading_zero_chunks``); the
adders' normalising shift in two (its first 16 bits in step 6 beside the count, 0..15 bits in
step 7); ``take_w``'s own copy of the response slice's valid (``hit_step``); the slot queues'
memories in shares of about 16 bits of the entry, each read at its own copy of the read
pointer (``rtl.streams.CreditFIFO``'s ``read_copies``). The grant is left as it was.
Placed and routed after them (``router2``, 10,060 LUTs, 11,248 FFs, 4 DP16KD, 17 MULT18X18D):
123.2 MHz on seed 1 (its worst the ``outstanding`` counter's flags from the info queue's valid
through the hazard and ``has_row``, 8.1 ns, 6.3 of routing; then the pre-decode queue's read
pointer ``pre.rp`` into ``pe1``, 8.0, 7.2 of routing; the adder's sixth step, 7.9), 116.8 on seed 2 (the grant
from a slot's head through ``room`` and the skids' flags, 8.6 ns, 9 cells; the ``outstanding``
counter's enable from the grant, 8.4): within the run-to-run spread of 121.0 / 122.1 before,
and 125 MHz is still not reached. Session 17 cut the two seed-1 leaders, cycle for cycle the
same (g15's 15 episodes, cycles and all 14 counters identical): the row counters' ``row_done``
from three flip-flops of its own (``rd_row``, ``rd_clear``, ``rd_rs``) and the pre-decode
buffer's read pointer in copies of one per 16 bits. Placed and routed (``router2``, 10,018
LUTs, 11,257 FFs): 104.5 MHz on seed 1, 119.2 on seed 2; neither cut path is among those over
7.8 ns on either seed, and the grant leads both (from a slot head's ``first`` or ``has_row``
through the round robin into the grant's copies: 9.6 ns, 10 cells, on seed 1; 8.4, 8 cells,
on seed 2), so the grant's next state is what stands between this unit and 125 MHz. Session
18 kept each slot head's next state, for either outcome of the cycle, in flip-flops a cycle
ahead (``rtl.streams.CreditFIFO``'s ``read_ahead``), so the grant's candidates no longer start
behind the control slice's look-ahead multiplexer, cycle for cycle the same (the flags equal
the expressions they replace on every simulated cycle; g15's 15 episodes identical), beside
the data registers' reset (see Reset above). With the gather's flow as it is since session
17 (set/reset nets of fewer than 64 flip-flops as LUTs: 1,158 at 2 lanes), ``router2``:
124.4 MHz on seed 1, 114.8 on seed 2 (11,146 LUTs of which 1,158 set/resets, 11,113 FFs, 4
DP16KD, 17 MULT18X18D). No grant path is over 7.8 ns on either seed (7.7 ns on seed 2, from
``outstanding_ge4``). What leads: on seed 1 the adder's sixth step (``p5_total`` through the
normalising shift into ``p6_low``, 8.0 ns, through a set/reset-as-LUT where yosys used the
freed reset input for a "force to zero" term), the output queue's level into its LUT-RAM
write (8.0), a slot head's read pointer into the request slice (7.8); on seed 2 the output
queue's read pointer into the output slice's entries (8.7 ns, 4 cells, 7.7 of routing). A
first try, the slots' eligibility in flip-flops and the round robin after them, was no
faster (102.1 MHz on seed 1: the loop from the eligibility through the round robin, the go
and back into the eligibility's copies, 9.8 ns). At
``data_bytes=64, lanes=16`` synthesis of session 15's RTL (before session 16's changes) gave
52,974 LUTs (42,990 LUT4 and 4,992 carry cells; 63% of the LFE5U-85F's 83,640 LUT4), 62,086
FFs (74%; 4,116 more moved into the block RAMs' and DSP blocks' output registers), 32
DP16KD and 129 MULT18X18D (82% of 156), in 705 s of wall time (session 12's RTL: 53,422
LUTs, 60,656 FFs). Its place and route (``router2``, seed 1) was started in session 16 and
had not finished within the session (nextpnr's analytical placer had not finished its first
iteration after 1,500 CPU-s; session 15's run was stopped at 1,105 CPU-s in the same phase).
Session 17 found why (one set/reset net per ECP5 logic tile, 898 small set/reset nets that
nextpnr's legaliser moved between tiles without end; ``host/bench/timing.py``'s
``unmap_small_lsr_sets``): with those set/resets as LUTs the placement finishes (under 790
CPU-s), nextpnr's estimate before routing is 66.0 MHz, and ``router2`` was stopped unfinished
at 1,749 CPU-s; no routed 16-lane figure yet (README). Session 18 took the reset off the
data registers (see Reset above): at 16 lanes the reset reaches 3,722 flip-flops (35,889 on
session 15's netlist), two set/reset nets are left after the flow's LUT step (17), and the
LUTs stay where they were (61,368 with the set/resets as LUTs, 61,051 before: yosys gives the
freed set/reset inputs to the data's "force to a constant" terms, which the flow turns back
into LUTs); 61,430 FFs, 32 DP16KD, 129 MULT18X18D; not placed. There the
weight and the reciprocal reach the lanes through two levels of fan-out 4 and the per-lane
flags, addresses and write enables are one register from the shared context; on the RTL of
session 11 the only nets of over 140 loads besides the clock and reset were the load and
pointer flags of the two ``PingPongBuffer`` slices of the response input and the output
(512-526 loads), and the reset reached 34,485 inputs, mostly the FP pipelines' registers. The
RTL before the lane slices reached 69.8 MHz there (seed 1).
Session 19 (2 lanes, ``router2``, the gather's flow, seeds 1 / 2 / 3): the three paths that led
were cut, cycle for cycle the same (g15's 15 episodes identical) and bit-exact: the output queue
is a :class:`rtl.streams.CreditLUTFIFO` (``SyncFIFO``'s cycles; its write enable the drain's
valid alone, the credit keeping it from being written full; read in 16-bit shares at copies of
the read pointer); the adders without reset make their normalising shift's 16-bit part as a
rotation (no "force to zero" for synthesis to put on the free set/reset input, which the flow
gives back as a LUT) with the cap's part among the top 16 bits a flip-flop; and
``acc_old``/``acc_max`` lost their reset. With the multipliers' ``three_dsps`` and
``narrow_shift`` (:class:`rtl.fp.FPMul32`; same latency and results): 123.2 / 127.5 / 121.1 MHz
(10,915 LUTs, 11,027 FFs, 4 DP16KD, 13 MULT18X18D); none of the three old paths is over 7.4 ns.
What led then: the reciprocal ROM's address into its data (8.1 ns, 6.7 of routing; now read in
four 8-bit shares at copies of the address), a drain multiplier's DSP product (7.8, its input
registers not taken into the DSP), the grant from the request slice's ``full`` (8.3, 10 cells).
With the ROM's shares and the output queue's write pointer in copies too (this RTL): 115.1 /
124.2 / 125.6 MHz (10,979 LUTs, 11,054 FFs; seed 3's worst a slot queue's write enable into its
LUT RAM, 7.96 ns; seed 1's the weight multiplier's 6x6 LUT product from the significand's
register by the DSP blocks, 8.7, 6.8 of routing; seed 2's an adder's third step, 8.05). With the
values beside the multipliers in LUT RAM as well (``delay_memory``; 9,946 FFs, 283
TRELLIS_DPR16X4): 120.3 / 111.8 MHz on seeds 1 / 2 (the grant and a slot head's load enable
lead, 7-7.8 ns of routing); 114.4 / 118.4 before the write pointer's copies. Placement moves
these figures by 5-10% between netlists that differ in a few paths; the grant's next state (7-10
cells from ``start``, ``room`` or a slice's ``full``) is in the worst few on most runs. At
``data_bytes=64, lanes=16`` synthesis with ``delay_memory``, before the write pointer's copies
(260 CPU-s): 59,985 LUTs (7,778 set/resets as LUTs), 51,942 FFs, 747 TRELLIS_DPR16X4, 32 DP16KD,
97 MULT18X18D (g18's: 61,368 LUTs, 61,430 FFs, 473 TRELLIS_DPR16X4, 129 MULT18X18D; the
``three_dsps`` 6x6 product costs about 84 LUTs a multiplier, ``narrow_shift`` saves about 145
LUTs and 44 FFs a multiplier, the delay lines about 8,800 FFs at 16 lanes); not placed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, exact_log2

from .fp import BF16ToFP32, FP16ToFP32, FPAdd32, FPMax32, FPMul32, fp32_greater_halves
from .streams import (COLLISION_X_ATTR, KEEP_COPY_ATTR, CreditFIFO, CreditLUTFIFO, DelayLine,
                      MemPortSignature, MemRequest, MemResponseBeat, PingPongBuffer, SkidBuffer,
                      check_int)

__all__ = [
    "ELEM_TYPE_CODES", "POOLING_CODES",
    "DescriptorLayout", "BagItemLayout", "PooledBeatLayout", "CountersLayout",
    "UnitTiming", "PoolLane", "EmbeddingBagUnit",
]

ELEM_TYPE_CODES = {"fp32": 0, "fp16": 1, "bf16": 2}
"""Element-type codes of a table descriptor."""
POOLING_CODES = {"sum": 0, "mean": 1, "max": 2}
"""Pooling-mode codes of a table descriptor."""

_FP32_ONE = 0x3F800000


def _context_register(layout: data.StructLayout, name: str) -> data.View:
    """A pipeline stage's context register of ``layout``: its ``valid`` field (at bit 0) a
    flip-flop with reset, every other field one register without reset. The other fields
    are read only where ``valid`` is set (or their value changes nothing that is output),
    and in use they hold whatever the stage held last whenever it is not valid, so a reset
    that leaves them as they were changes nothing; without it they do not carry the reset
    net (at 16 lanes several thousand flip-flops of the pipeline's contexts)."""
    assert layout["valid"].offset == 0 and layout["valid"].width == 1
    valid = Signal(name=f"{name}_valid")
    rest = Signal(layout.size - 1, name=f"{name}_data", reset_less=True)
    return data.View(layout, Cat(valid, rest))


class DescriptorLayout(data.StructLayout):
    """One table-descriptor write (see :class:`EmbeddingBagUnit`)."""

    def __init__(self, *, table_width: int, addr_width: int, index_width: int, dim_width: int):
        super().__init__({
            "table": unsigned(table_width),
            "base": unsigned(addr_width),
            "rows": unsigned(index_width),
            "dim": unsigned(dim_width),
            "elem_type": unsigned(2),
            "pooling": unsigned(2),
            "pad_valid": unsigned(1),
            "pad_index": unsigned(index_width),
        })


class BagItemLayout(data.StructLayout):
    """One item of the combined lengths format: a bag header or one index (with weight)."""

    def __init__(self, *, table_width: int, length_width: int, tag_width: int,
                 index_width: int):
        super().__init__({
            "header": unsigned(1),
            "body": data.UnionLayout({
                "bag": data.StructLayout({
                    "table": unsigned(table_width),
                    "length": unsigned(length_width),
                    "weighted": unsigned(1),
                    "tag": unsigned(tag_width),
                }),
                "item": data.StructLayout({
                    "index": unsigned(index_width),
                    "weight": unsigned(32),
                }),
            }),
        })


class PooledBeatLayout(data.StructLayout):
    """One beat of a pooled vector: ``lanes`` FP32 values (lane 0 at the least significant
    bits) and the bag's tag and flags."""

    def __init__(self, *, lanes: int, tag_width: int):
        super().__init__({
            "data": unsigned(32 * lanes),
            "tag": unsigned(tag_width),
            "first": unsigned(1),
            "last": unsigned(1),
            "error": unsigned(1),
            "dropped": unsigned(1),
        })


COUNTER_NAMES = (
    "busy_cycles", "beats_read", "rows_requested", "bags_in", "bags_out",
    "stall_memory", "stall_hazard", "stall_bank", "stall_output", "stall_input",
    "indices_dropped", "indices_padding", "desc_rejected", "protocol_errors",
)


class CountersLayout(data.StructLayout):
    """The unit's event counters, 32 bits each, in :data:`COUNTER_NAMES` order."""

    def __init__(self):
        super().__init__({name: unsigned(32) for name in COUNTER_NAMES})


@dataclass(frozen=True)
class UnitTiming:
    """Pipeline figures of one unit instance, for the timing model (``sim.timing.embedding``).

    ``words_per_beat``: FP32 words per memory beat (16-bit types: twice as many);
    ``add_latency``: cycles a word spends in the adder; ``hazard_distance``: two words of the
    same accumulator address are issued at least this many cycles apart;
    ``interleave``: bags whose rows the arbiter interleaves (one slot queue each, of
    ``slot_depth`` entries); ``banks``: accumulator banks (claimed in bag order);
    ``parse_to_issue``: cycles from an item's parse to the earliest request of its row;
    ``resp_latency``: cycles from a response beat on ``mem`` to the reducer taking it;
    ``reduce_latency``: cycles from a word's issue (take) to the adder input;
    ``done_latency``: cycles from the take of a bag's last word to its drain;
    ``drain_latency``: cycles from a drain read to the beat on ``pooled``;
    ``queue_latency``: cycles from a queue write to the entry being readable;
    ``info_latency``: cycles from a row's issue to its entry being readable by the reducer;
    ``input_latency``: cycles from an item offered on ``bags`` to its parse (the input skid
    buffer and the pre-decode stage); ``bank_free_latency``: cycles from the drain's read of
    a bag's last word to the first take that may claim the freed bank; ``pace_rows``: rows
    in flight (on the cycle before) from which the arbiter does not serve a row of the slot
    it served last (0: never).
    """

    data_bytes: int
    lanes: int
    outstanding: int
    words_per_beat: int
    add_latency: int
    reduce_latency: int
    drain_latency: int
    bag_queue_depth: int
    info_depth: int
    interleave: int = 1
    hazard_distance: int = 6
    slot_depth: int = 32
    banks: int = 2
    parse_to_issue: int = 4
    resp_latency: int = 1
    done_latency: int = 0
    queue_latency: int = 2
    info_latency: int = 2
    input_latency: int = 2
    bank_free_latency: int = 2
    pace_rows: int = 0


class PoolLane(wiring.Component):
    """One lane of the reducer's pooling arithmetic: ``latency`` cycles from operands to result.

    Ports: ``old`` (in, 32: the accumulator's word), ``v`` (in, 32: the row's value),
    ``first`` (in: the bag's first row, which starts from zero for SUM and from ``v`` for MAX),
    ``is_max`` (in: MAX pooling, given with the result: it selects which of the two results
    leaves, ``latency`` cycles after the operands); ``result`` (out, 32).

    SUM/MEAN: ``(0 if first else old) + v`` (:class:`rtl.fp.FPAdd32` with ``latency``
    registers). MAX: ``v if first else (v if v > old else old)``
    (:class:`rtl.fp.FPMax32` with ``nan="compare"``), delayed by the same ``latency`` so both
    results line up; at ``latency >= 2`` the compare (into a one-bit choice) and the
    selection are in separate stages, and at ``latency >= 3`` the compare itself takes two:
    its ordered-key carry chains (two halves, :func:`rtl.fp.fp32_greater_halves`) and its
    NaN/zero terms are registered apart and combined with ``first`` into the choice on the
    next cycle.
    Free running: one operation per cycle, no enable.

    ``direct_add=True`` (what the gather unit uses) takes the adder's operands straight from
    the ports, so that no logic stands between the caller's registers and the adder: the
    caller gives ``old = 0`` on a first row and the addend on a separate port ``v_add``
    (``v`` then feeds only the max), and the max's accumulator word on its own port
    ``old_max`` (``old`` then feeds only the adder): two registers in the caller, so that
    the adder's operand and the comparator's are not one net pulled two ways.
    """

    def __init__(self, *, latency: int, direct_add: bool = False):
        try:
            self.latency = check_int("latency", latency, minimum=1, maximum=FPAdd32.STEPS)
        except ValueError:
            self._MustUse__silence = True  # a refused design is not an unused one
            raise
        self.direct_add = bool(direct_add)
        ports = {"old": In(32), "v": In(32), "first": In(1), "is_max": In(1),
                 "result": Out(32)}
        if self.direct_add:
            ports["v_add"] = In(32)
            ports["old_max"] = In(32)
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        # (no register here has a reset: each holds data that is used only ``latency``
        # cycles after its operands, when the caller's own valid flags say so)
        m.submodules.add = add = FPAdd32(latency=self.latency, reset_less=True)
        m.submodules.max = mx = FPMax32(latency=0, nan="compare")
        if self.direct_add:
            m.d.comb += [add.a.eq(self.old), add.b.eq(self.v_add)]
            old = self.old_max
        else:
            m.d.comb += [add.a.eq(Mux(self.first, 0, self.old)), add.b.eq(self.v)]
            old = self.old
        m.d.comb += [mx.a.eq(old), mx.b.eq(self.v)]
        if self.latency >= 3:
            # Three stages: the compare's terms (both operands registered beside them), the
            # choice, then the selection; the rest of the latency is a delay line.
            # (the ordered keys compared in 16-bit halves, combined in the choice: the 32-bit
            # carry chain from the operands' registers was 8.3 ns on the ECP5 flow)
            gt_hi, ge_hi, gt_lo, comparable = fp32_greater_halves(self.v, old)
            t_gt_hi = Signal(name="max_gt_hi", reset_less=True)
            t_ge_hi = Signal(name="max_ge_hi", reset_less=True)
            t_gt_lo = Signal(name="max_gt_lo", reset_less=True)
            t_cmp = Signal(name="max_comparable", reset_less=True)
            t_first = Signal(name="max_first", reset_less=True)
            v_1 = Signal(32, name="max_v1", reset_less=True)
            old_1 = Signal(32, name="max_old1", reset_less=True)
            m.d.sync += [t_gt_hi.eq(gt_hi), t_ge_hi.eq(ge_hi), t_gt_lo.eq(gt_lo),
                         t_cmp.eq(comparable), t_first.eq(self.first),
                         v_1.eq(self.v), old_1.eq(old)]
            t_ord = t_gt_hi | (t_ge_hi & t_gt_lo)
            take_v = Signal(name="max_take_v", reset_less=True)
            v_r = Signal(32, name="max_v", reset_less=True)
            old_r = Signal(32, name="max_old", reset_less=True)
            m.d.sync += [take_v.eq(t_first | (t_cmp & t_ord)), v_r.eq(v_1), old_r.eq(old_1)]
            sel = Mux(take_v, v_r, old_r)
            stages = self.latency - 2
        elif self.latency == 2:
            # Two stages: the compare into a flag (with both operands registered beside it),
            # then the selection; the rest of the latency is a delay line.
            take_v = Signal(name="max_take_v", reset_less=True)
            v_r = Signal(32, name="max_v", reset_less=True)
            old_r = Signal(32, name="max_old", reset_less=True)
            m.d.sync += [take_v.eq(self.first | mx.sel_b), v_r.eq(self.v), old_r.eq(old)]
            sel = Mux(take_v, v_r, old_r)
            stages = self.latency - 1
        else:
            sel = Mux(self.first, self.v, mx.o)
            stages = self.latency
        for k in range(stages):
            r = Signal(32, name=f"max_d{k}", reset_less=True)
            m.d.sync += r.eq(sel)
            sel = r
        m.d.comb += self.result.eq(Mux(self.is_max, sel, add.o))
        return m


class EmbeddingBagUnit(wiring.Component):
    """Table-batched EmbeddingBag forward unit (see the module docstring for the full story).

    Parameters
    ----------
    data_bytes : bytes per memory beat (power of two, default 64).
    lanes : FP32 elements reduced per cycle (power of two, ``lanes * 4 <= data_bytes``).
    max_dim : largest table dimension supported (elements).
    tables : number of table descriptors.
    outstanding : row reads in flight at most (hides ``~outstanding * stride`` cycles).
    max_bag_length : largest bag length (sets the ``length`` field and the MEAN ROM).
    elem_types : element types to support, a subset of ``("fp32", "fp16", "bf16")``.
    addr_width, beats_width : memory port's beat-address and beat-count widths.
    index_width, tag_width : widths of an index and of a bag tag.
    bag_queue_depth : bags parsed and not yet drained, at most (default 32): with bags of a
        few short rows it must cover the memory latency plus the pipeline's (about 50 cycles
        at the full FP depths) in bags, or the parse waits and the interleave runs dry.
    add_latency, mul_latency : pipeline registers of the FP32 adders (1..``FPAdd32.STEPS``)
        and multipliers (3..``FPMul32.STEPS``: the accumulator is read during the last three
        multiplier stages); default their full depths (9 and 11), the depths at which they
        close timing (``neonic bench timing``).
    interleave : bags whose rows are interleaved (a power of two, 1..8; default 4): rows of
        ``W`` words cost ``max(W, (add_latency + 1) / interleave)`` cycles.
    slot_depth : row entries each interleave slot holds (how far the parse runs ahead).
    delay_memory : the values that wait beside the weight and drain multipliers (``32 x
        lanes`` bits for ``mul_latency`` cycles each) in LUT RAM (:class:`rtl.streams.
        DelayLine`, one share per lane) instead of registers; the same cycles and results.
        Off by default: at 2 lanes it saves about 1,100 flip-flops and placed and routed
        slower (111.8-120.3 MHz on four runs, against 115.1-127.5 without); at 16 lanes it
        saves about 8,800 (synthesis; not placed).
    """

    def __init__(self, *, data_bytes: int = 64, lanes: int = 16, max_dim: int = 256,
                 tables: int = 8, outstanding: int = 32, max_bag_length: int = 1023,
                 elem_types: tuple[str, ...] = ("fp32", "fp16", "bf16"),
                 addr_width: int = 32, beats_width: int = 8, index_width: int = 32,
                 tag_width: int = 16, bag_queue_depth: int = 32,
                 add_latency: int = FPAdd32.STEPS, mul_latency: int = FPMul32.STEPS,
                 interleave: int = 4, slot_depth: int = 32, delay_memory: bool = False):
        self.delay_memory = bool(delay_memory)
        self.data_bytes = check_int("data_bytes", data_bytes, minimum=4, maximum=256,
                                    power_of_two=True)
        self.lanes = check_int("lanes", lanes, minimum=1, maximum=data_bytes // 4,
                               power_of_two=True)
        self.max_dim = check_int("max_dim", max_dim, minimum=1, maximum=4096)
        self.tables = check_int("tables", tables, minimum=1, maximum=1024)
        self.outstanding = check_int("outstanding", outstanding, minimum=1, maximum=1024)
        self.max_bag_length = check_int("max_bag_length", max_bag_length, minimum=1,
                                        maximum=4095)
        self.addr_width = check_int("addr_width", addr_width, minimum=8, maximum=64)
        self.beats_width = check_int("beats_width", beats_width, minimum=1, maximum=16)
        self.index_width = check_int("index_width", index_width, minimum=1, maximum=48)
        self.tag_width = check_int("tag_width", tag_width, minimum=1, maximum=32)
        self.bag_queue_depth = check_int("bag_queue_depth", bag_queue_depth, minimum=2,
                                         maximum=256)
        if isinstance(elem_types, str) or not isinstance(elem_types, (tuple, list)) \
                or not elem_types:
            raise ValueError(f"elem_types: expected a non-empty tuple of element types from "
                             f"{tuple(ELEM_TYPE_CODES)}, got {elem_types!r}")
        for et in elem_types:
            if et not in ELEM_TYPE_CODES:
                raise ValueError(f"elem_types: unknown element type {et!r}; expected one of "
                                 f"{tuple(ELEM_TYPE_CODES)}")
        self.elem_types = tuple(sorted(set(elem_types), key=ELEM_TYPE_CODES.get))
        max_stride = -(-self.max_dim * 4 // self.data_bytes)
        if max_stride > 2 ** self.beats_width - 1:
            raise ValueError(f"max_dim: a row of {self.max_dim} FP32 elements needs {max_stride} "
                             f"beats, more than beats_width={self.beats_width} can request")

        self.words_per_beat = self.data_bytes // (4 * self.lanes)
        self.max_words = -(-self.max_dim // self.lanes)
        self.table_width = max(1, bits_for(self.tables - 1))
        self.dim_width = bits_for(self.max_dim)
        self.length_width = bits_for(self.max_bag_length)
        self.word_width = max(1, bits_for(self.max_words - 1))

        self.add_latency = check_int("add_latency", add_latency, minimum=1,
                                     maximum=FPAdd32.STEPS)
        # (at least 3: the accumulator is read three stages before the adder's input)
        self.mul_latency = check_int("mul_latency", mul_latency, minimum=3,
                                     maximum=FPMul32.STEPS)
        self.drain_mul_latency = self.mul_latency
        #: register levels between the issue stage's registers and the multipliers' inputs:
        #: a fan-out tree of degree 4 from one register to ``lanes`` copies (at least one)
        self.fanout_stages = max(1, (exact_log2(self.lanes) + 1) // 2)
        #: register levels between the drain's read-data register (the block RAMs' output
        #: register) and its multipliers: the reciprocal's fan-out tree like the weight's, and
        #: at least two, so that a register with no logic before it stands between the block
        #: RAM's output register and the multiplier's first stage at every lane count
        self.drain_fanout_stages = max(2, self.fanout_stages)
        self.info_depth = self.outstanding + 2
        self.interleave = check_int("interleave", interleave, minimum=1, maximum=8,
                                    power_of_two=True)
        self.slot_depth = check_int("slot_depth", slot_depth, minimum=4, maximum=1024)
        #: rows in flight from which the arbiter no longer serves one slot twice in a row
        #: (half the read budget: the other half still covers the memory's latency)
        self.pace_rows = max(1, self.outstanding // 2)
        #: accumulator banks: ``interleave`` bags accumulating, as many draining or waiting
        self.banks = 2 * self.interleave
        self.bank_width = max(1, exact_log2(self.banks))
        #: output queue: room for every beat the free-running drain pipeline holds
        self.out_depth = self.drain_mul_latency + self.drain_fanout_stages + 5

        self.desc_layout = DescriptorLayout(table_width=self.table_width,
                                            addr_width=self.addr_width,
                                            index_width=self.index_width,
                                            dim_width=self.dim_width)
        self.item_layout = BagItemLayout(table_width=self.table_width,
                                         length_width=self.length_width,
                                         tag_width=self.tag_width,
                                         index_width=self.index_width)
        self.pooled_layout = PooledBeatLayout(lanes=self.lanes, tag_width=self.tag_width)
        super().__init__({
            "desc": In(stream.Signature(self.desc_layout)),
            "bags": In(stream.Signature(self.item_layout)),
            "mem": Out(MemPortSignature(addr_width=self.addr_width,
                                        beats_width=self.beats_width,
                                        data_bytes=self.data_bytes)),
            "pooled": Out(stream.Signature(self.pooled_layout)),
            "counters": Out(CountersLayout()),
            "busy": Out(1),
        })

    @property
    def timing(self) -> UnitTiming:
        """The pipeline figures of this instance (see :class:`UnitTiming`)."""
        return UnitTiming(
            data_bytes=self.data_bytes, lanes=self.lanes, outstanding=self.outstanding,
            words_per_beat=self.words_per_beat, add_latency=self.add_latency,
            # take -> stage 1 -> fan-out stages -> mul_latency registers -> the adder's input
            reduce_latency=1 + self.fanout_stages + self.mul_latency,
            # drain read -> read register -> data register -> the reciprocal's further
            # fan-out levels (``drain_fanout_stages - 1``) -> multiplier -> output queue
            # (2 cycles)
            drain_latency=self.drain_mul_latency + self.drain_fanout_stages + 3,
            # issues of one accumulator word: the adder's latency, then the write-back
            hazard_distance=self.add_latency + 1,
            bag_queue_depth=self.bag_queue_depth, info_depth=self.info_depth,
            interleave=self.interleave, slot_depth=self.slot_depth, banks=self.banks,
            # parse -> pe1 -> pe2 (queue write) -> readable 2 cycles later -> read slice
            parse_to_issue=5,
            # response beat -> skid buffer -> take
            resp_latency=1,
            # last take -> adder input -> add_latency -> write-back -> done flag visible
            done_latency=1 + self.fanout_stages + self.mul_latency + self.add_latency + 1,
            # a queue write -> readable 2 cycles later -> its read slice
            queue_latency=3,
            # arbiter -> write slice -> row queue -> read slice
            info_latency=4,
            # input skid buffer -> pre-decode register -> parse
            input_latency=2,
            # drain read -> bank_busy cleared -> the reducer's registered bank-wait flag
            bank_free_latency=2,
            pace_rows=self.pace_rows if self.interleave > 1 else 0)

    # -- internal layouts ------------------------------------------------------------------

    def _stored_desc_layout(self):
        return data.StructLayout({
            "valid": unsigned(1),
            "base": unsigned(self.addr_width),
            "rows": unsigned(self.index_width),
            "elem_type": unsigned(2),
            "pooling": unsigned(2),
            "pad_valid": unsigned(1),
            "pad_index": unsigned(self.index_width),
            "stride": unsigned(self.beats_width),
            "last_word": unsigned(self.word_width),      # words - 1
            "tail": unsigned(max(1, exact_log2(self.lanes))),
        })

    def _row_info_layout(self):
        # One entry per contributing row, or an end-only entry (has_row=0) closing a bag
        # whose last item did not contribute; ``bank`` is the bag's accumulator bank.
        return data.StructLayout({
            "has_row": unsigned(1),
            "end": unsigned(1),
            "first": unsigned(1),
            "weighted": unsigned(1),
            "weight": unsigned(32),
            "elem_type": unsigned(2),
            "is_max": unsigned(1),
            "last_word": unsigned(self.word_width),      # words - 1
            # lanes used in the last word (0: all), for the lanes' weight copies
            "tail": unsigned(max(1, exact_log2(self.lanes))),
            "bank": unsigned(self.bank_width),
        })

    def _slot_entry_layout(self):
        # A row entry waiting in its bag's slot queue, with its read request.
        return data.StructLayout({
            "info": self._row_info_layout(),
            "addr": unsigned(self.addr_width),
            "beats": unsigned(self.beats_width),
        })

    def _bag_info_layout(self):
        return data.StructLayout({
            "tag": unsigned(self.tag_width),
            "last_word": unsigned(self.word_width),      # words - 1
            "tail": unsigned(max(1, exact_log2(self.lanes))),
            "mean": unsigned(1),
            "count": unsigned(self.length_width),
            "has_rows": unsigned(1),                     # count != 0, kept as a bit
            "error": unsigned(1),
            "dropped": unsigned(1),
            "bank": unsigned(self.bank_width),
        })

    # -- elaboration ---------------------------------------------------------------------

    def _delayed(self, m: Module, name: str, value: Value, latency: int) -> Value:
        """``value`` ``latency`` cycles later, through a :class:`rtl.streams.DelayLine` with
        one share per lane (``delay_memory``)."""
        m.submodules[name] = line = DelayLine(width=len(value), latency=latency,
                                              copies=self.lanes)
        m.d.comb += line.i.eq(value)
        return line.o

    def elaborate(self, platform):
        m = Module()
        lanes = self.lanes
        db = self.data_bytes
        log_lanes = exact_log2(lanes)
        log_db = exact_log2(db)
        # Counters: each event sets its ``inc`` flag (a counter counts at most one event a
        # cycle); the flag is registered and the counter adds it one cycle later, so that the
        # event's logic (often a wide OR, such as ``busy``) ends at one flip-flop instead of
        # the enables of 32. ``busy`` stays high while an event waits to be counted, so a
        # counter read once the unit is idle has every event counted.
        cnt = {name: Signal(32, name=f"cnt_{name}") for name in COUNTER_NAMES}
        inc = {name: Signal(name=f"inc_{name}") for name in COUNTER_NAMES}
        inc_q = {name: Signal(name=f"inc_{name}_q") for name in COUNTER_NAMES}
        for name, sig in cnt.items():
            if name not in ("busy_cycles", "stall_input"):
                # (those two: from ``busy``'s parts, registered apart; see the end)
                m.d.sync += inc_q[name].eq(inc[name])
            with m.If(inc_q[name]):
                m.d.sync += sig.eq(sig + 1)
            m.d.comb += getattr(self.counters, name).eq(sig)

        # ---- descriptor store ----------------------------------------------------------
        sdesc = self._stored_desc_layout()
        m.submodules.desc_mem = desc_mem = memory.Memory(shape=sdesc, depth=self.tables,
                                                         init=[])
        desc_wr = desc_mem.write_port()
        desc_rd = desc_mem.read_port(domain="comb")
        d = self.desc.payload
        supported = Const(0, 1)
        for et in self.elem_types:
            supported = supported | (d.elem_type == ELEM_TYPE_CODES[et])
        desc_ok = (d.dim >= 1) & (d.dim <= self.max_dim) & supported & (d.pooling <= 2)
        in_range = d.table < self.tables
        dim_bytes_shift = Mux(d.elem_type == ELEM_TYPE_CODES["fp32"], 2, 1)
        m.d.comb += [
            self.desc.ready.eq(1),
            desc_wr.addr.eq(d.table),
            desc_wr.en.eq(self.desc.valid & in_range),
            desc_wr.data.valid.eq(desc_ok),
            desc_wr.data.base.eq(d.base),
            desc_wr.data.rows.eq(d.rows),
            desc_wr.data.elem_type.eq(d.elem_type),
            desc_wr.data.pooling.eq(d.pooling),
            desc_wr.data.pad_valid.eq(d.pad_valid),
            desc_wr.data.pad_index.eq(d.pad_index),
            desc_wr.data.stride.eq(((d.dim << dim_bytes_shift) + (db - 1)) >> log_db),
            desc_wr.data.last_word.eq(((d.dim + (lanes - 1)) >> log_lanes) - 1),
            desc_wr.data.tail.eq(d.dim[:max(1, log_lanes)] if log_lanes else 0),
        ]
        with m.If(self.desc.valid & ~(in_range & desc_ok)):
            m.d.comb += inc["desc_rejected"].eq(1)

        # ---- register slices on every stream that enters or leaves the unit -------------
        # No combinational path crosses the unit's boundary: the parse stall does not reach
        # the producer of ``bags``, the reducer's hazard stall does not reach the memory's
        # response logic (a cache behind ``mem``), and the cache's ``req.ready`` does not
        # reach the arbiter.
        m.submodules.bags_in = bags_in = SkidBuffer(self.item_layout)
        # (the responses' slice is a two-entry queue read through a multiplexer: the
        # reducer's take, at the end of its stall logic, then enables three flip-flops
        # instead of every bit of the beat)
        m.submodules.resp_in = resp_in = PingPongBuffer(MemResponseBeat(self.data_bytes),
                                                               reset_less=True)
        # (the requests' slice too: the arbiter's selected entry then reaches the slice's
        # entries without the skid buffer's input-or-skid multiplexer in front of its output
        # register; ``mem.req.payload`` is a 2:1 multiplexer of the slice's flip-flops)
        m.submodules.req_out = req_out = PingPongBuffer(MemRequest(self.addr_width,
                                                                   self.beats_width),
                                                        reset_less=True)
        wiring.connect(m, wiring.flipped(self.bags), bags_in.i)
        wiring.connect(m, wiring.flipped(self.mem.resp), resp_in.i)
        wiring.connect(m, req_out.o, wiring.flipped(self.mem.req))
        m.d.comb += self.mem.wdata.valid.eq(0)
        with m.If(self.mem.req.valid & self.mem.req.ready):
            m.d.comb += inc["rows_requested"].eq(1)
        with m.If(self.mem.resp.valid & self.mem.resp.ready):
            m.d.comb += inc["beats_read"].eq(1)

        # ---- queues ---------------------------------------------------------------------
        K = self.interleave
        nb = self.banks
        rinfo = self._row_info_layout()
        sentry = self._slot_entry_layout()
        binfo = self._bag_info_layout()
        slots = []
        # The slot and bag queues are ``CreditFIFO``s (``SyncFIFOBuffered``'s cycles, with a
        # write enable that is the writer's alone): the parse writes a slot only with room
        # (``room_ok``) and the bag queue only with ``bag_room``, so the queues' own full
        # compares need not sit in front of their write pointers and levels.
        # (each slot queue's memory in shares of at most about 16 bits of the entry, each read at
        # its own copy of the read pointer: one pointer's net reached every cell of the
        # queue's LUT RAM, a slot queue's read pointer into its head's input register was
        # 9.0 ns, 8.0 of it routing, on one placement of session 15)
        for k in range(K):
            q = CreditFIFO(width=sentry.size, depth=self.slot_depth,
                           read_copies=max(1, sentry.size // 16))
            m.submodules[f"slot_q{k}"] = q
            slots.append(q)
        # (the row queue written through ``info_in`` while ``w_rdy``, a flip-flop: the
        # level's compare in front of the write enable was an 8.2 ns loop)
        m.submodules.info_q = info_q = CreditFIFO(width=rinfo.size, depth=self.info_depth,
                                                  registered_w_rdy=True)
        # (the bag queue's memory written on every cycle it has room, ``registered_w_rdy``:
        # its write enable from the parse's stall logic reached every LUT-RAM cell, 8.5 ns)
        m.submodules.bag_q = bag_q = CreditFIFO(width=binfo.size, depth=self.bag_queue_depth,
                                                registered_w_rdy=True)
        info_w = data.View(rinfo, info_q.w_data)
        bag_w = data.View(binfo, bag_q.w_data)

        # Each queue is read through a register slice: what decides to take an entry (the
        # arbiter, the hazard check, the drain) does not reach into the queue's pointers.
        def read_slice(q, name, peek=False, pingpong=False):
            # (a PingPongBuffer's read pointer in copies of one per 16 bits of the entry: one
            # slot head's pointer reached every bit of the granted entry's two slices,
            # 7.7 ns of routing over two LUTs, the second critical path)
            sk = (PingPongBuffer(unsigned(q.width), peek=peek,
                                 read_copies=max(1, q.width // 16), reset_less=True) if pingpong
                  else SkidBuffer(unsigned(q.width), peek=peek))
            m.submodules[name] = sk
            m.d.comb += [sk.i.valid.eq(q.r_rdy), sk.i.payload.eq(q.r_data),
                         q.r_en.eq(sk.i.ready)]
            return sk
        # (the slots' heads are two-entry queues read through a multiplexer: the arbiter's
        # grant, at the end of its logic, then steers three flip-flops per slot instead of
        # the enable of every bit of the head's entry)
        head_sks = [read_slice(q, f"slot_h{k}", pingpong=True) for k, q in enumerate(slots)]
        heads = [sk.o for sk in head_sks]
        # Beside each slot's head, its control fields (what the arbiter's next grant reads)
        # through a ``SkidBuffer`` with peek that sees the same handshakes and holds the same
        # entry on every cycle (as the row queue's head below): the grant's candidates then
        # start from these flip-flops, not from the head's read multiplexer, whose pointer
        # also selects every bit of the entry (a net of about 70 loads).
        # The control fields come from their own queue beside the slot's (``ctl_qs``: the
        # same writes, read with the same handshakes, so it holds the same entries on every
        # cycle), so that the control slice's input valid is a flip-flop of its own: the
        # slot queue's ``r_rdy`` also steers the head's wide entries, and its net's first
        # hop to the control slice was 3.4 ns of routing on the grant's critical path.
        slot_ctl = data.StructLayout({"has_row": unsigned(1), "first": unsigned(1)})
        ctl_sks = []
        ctl_qs = []
        for k, (q, sk) in enumerate(zip(slots, head_sks)):
            cq = CreditFIFO(width=slot_ctl.size, depth=self.slot_depth, read_ahead=True)
            m.submodules[f"slot_cq{k}"] = cq
            ctl_qs.append(cq)
            c = SkidBuffer(slot_ctl, peek=True)
            m.submodules[f"slot_c{k}"] = c
            m.d.comb += [c.i.valid.eq(cq.r_rdy), c.i.payload.eq(cq.r_data),
                         cq.r_en.eq(c.i.ready), c.o.ready.eq(sk.o.ready)]
            ctl_sks.append(c)
        # The row queue's head, in two slices that see the same handshakes and hold the same
        # entry on every cycle: its control fields (what ``take`` and the issue's stall flags
        # read) through a SkidBuffer with peek, whose register enables are few; the whole
        # entry (the weight and the rest the lanes' stage-1 register copies) through a
        # PingPongBuffer, on which ``take`` steers three flip-flops instead of the enable of
        # every bit of the entry.
        ctl_layout = data.StructLayout({
            "has_row": unsigned(1), "first": unsigned(1), "bank": unsigned(self.bank_width),
            "last_word": unsigned(self.word_width), "elem_type": unsigned(2)})
        m.submodules.info_h = info_sk = SkidBuffer(ctl_layout, peek=True)
        m.submodules.info_hd = info_pp = PingPongBuffer(unsigned(info_q.width),
                                                             reset_less=True)
        q_head = data.View(rinfo, info_q.r_data)
        m.d.comb += [info_sk.i.valid.eq(info_q.r_rdy), info_pp.i.valid.eq(info_q.r_rdy),
                     info_pp.i.payload.eq(info_q.r_data), info_q.r_en.eq(info_sk.i.ready),
                     info_pp.o.ready.eq(info_sk.o.ready)]
        for f in ("has_row", "first", "bank", "last_word", "elem_type"):
            m.d.comb += getattr(info_sk.i.payload, f).eq(getattr(q_head, f))
        info_h = info_sk.o
        bag_sk = read_slice(bag_q, "bag_h", peek=True, pingpong=True)
        # ``bag_room``: the bag queue's ``w_rdy`` on this cycle, as a flip-flop computed a
        # cycle ahead, so that the parse's stall does not wait for the queue's level compare.
        # ``SyncFIFOBuffered`` is a FIFO of ``depth - 1`` entries (``level - r_rdy``) ahead of
        # an output register; it is ready while that FIFO is not full, and it moves an entry
        # into the output register when it holds one and the register is empty or read.
        bag_room = Signal(init=1)
        bq_inner = Signal(range(self.bag_queue_depth + 1))
        bq_write = Signal()
        m.d.comb += bq_inner.eq(bag_q.level - bag_q.r_rdy)
        bq_read = (bq_inner != 0) & (~bag_q.r_rdy | bag_q.r_en)
        bq_full = self.bag_queue_depth - 1
        m.d.sync += bag_room.eq(Mux(bq_write & ~bq_read, bq_inner != bq_full - 1,
                                    Mux(bq_read & ~bq_write, 1, bq_inner != bq_full)))
        bag_h = bag_sk.o

        # Accumulator banks: given out in bag order by the parse (a bag's first contributing
        # row takes ``next_bank``), claimed by the bag's first word at the reducer, marked done
        # when its last word is written back, freed by the drain.
        bank_busy = Signal(nb)
        bank_done = Signal(nb)
        next_bank = Signal(self.bank_width)

        # ---- pre-decode: one register stage between the input skid buffer and the parse ----
        # A header reads its table's descriptor here; an index is compared here with the
        # padding index and the row count of the bag's descriptor (that of the last header to
        # pass this stage), so that the parse's decisions start from flip-flops. The stage is
        # a ``PingPongBuffer`` of the item and what was decoded from it: the parse's take
        # (``parse_take``, the end of its stall logic) reaches only the buffer's pointer and
        # flags, not the enable of every bit of the item, and the input skid buffer's
        # ``ready`` is the buffer's registered ``ready``. Same latency (one cycle) and
        # throughput as a register with ``ready = ~valid | take``; it holds one item more.
        pd_layout = data.StructLayout({
            "item": self.item_layout,
            "desc": sdesc,           # a header's descriptor
            "desc_ok": unsigned(1),  # ... valid, on a table that exists
            "pad": unsigned(1),      # an index equal to the bag's padding index
            "oob": unsigned(1),      # an index >= the bag's row count
            "len0": unsigned(1),     # a header of an empty bag
            "len1": unsigned(1),     # a header of a one-item bag
        })
        # (its read pointer in copies of one per 16 bits of the entry, as the slot heads':
        # one pointer into every bit of the item into ``pe1`` was 8.0 ns, 7.2 of routing)
        m.submodules.pre = pre = PingPongBuffer(pd_layout,
                                                read_copies=max(1, pd_layout.size // 16),
                                                reset_less=True)
        parse_take = Signal()        # the parse consumes the pre-decoded item
        cur_p = Signal(sdesc)        # the descriptor of the last header through this stage
        in_item = bags_in.o.payload
        in_hdr = in_item.body.bag
        in_idx = in_item.body.item
        pd = pre.i.payload
        m.d.comb += [
            desc_rd.addr.eq(in_hdr.table),
            pre.i.valid.eq(bags_in.o.valid), bags_in.o.ready.eq(pre.i.ready),
            pd.item.eq(in_item), pd.desc.eq(desc_rd.data),
            pd.desc_ok.eq(desc_rd.data.valid & (in_hdr.table < self.tables)),
            pd.pad.eq(cur_p.pad_valid & (in_idx.index == cur_p.pad_index)),
            pd.oob.eq(in_idx.index >= cur_p.rows),
            pd.len0.eq(in_hdr.length == 0), pd.len1.eq(in_hdr.length == 1),
            pre.o.ready.eq(parse_take),
        ]
        with m.If(bags_in.o.valid & pre.i.ready & in_item.header):
            m.d.sync += cur_p.eq(desc_rd.data)
        # Beside it, the flags the parse decides with, through a ``SkidBuffer`` that sees the
        # same handshakes and holds the same item on every cycle (as the slot heads' control
        # slices): the parse's stall and the bag queue's write enable then start from these
        # flip-flops, not from the buffer's read multiplexer, whose pointer also selects every
        # bit of the item (a net of about 90 loads, the first hop of the critical path).
        pc_layout = data.StructLayout({
            "header": unsigned(1), "desc_ok": unsigned(1), "pad": unsigned(1),
            "oob": unsigned(1), "len0": unsigned(1), "len1": unsigned(1)})
        m.submodules.pre_c = pre_c = SkidBuffer(pc_layout)
        for f in ("desc_ok", "pad", "oob", "len0", "len1"):
            m.d.comb += getattr(pre_c.i.payload, f).eq(getattr(pd, f))
        m.d.comb += [pre_c.i.payload.header.eq(in_item.header),
                     pre_c.i.valid.eq(bags_in.o.valid), pre_c.o.ready.eq(parse_take)]
        pcf = pre_c.o.payload
        p_valid = pre.o.valid
        p_item = pre.o.payload.item
        p_desc = pre.o.payload.desc
        p_desc_ok = pcf.desc_ok
        p_pad = pcf.pad
        p_oob = pcf.oob
        p_len0 = pcf.len0
        p_len1 = pcf.len1
        p_header = pcf.header

        # ---- parse: one input item per cycle, row entries into the bag's slot queue -------
        item = p_item
        hdr = item.body.bag
        idx = item.body.item
        hdr_valid_desc = p_desc_ok

        cur = Signal(sdesc)          # the current bag's descriptor
        c_tag = Signal(self.tag_width)
        c_weighted = Signal()
        c_error = Signal()
        c_dropped = Signal()
        c_bank = Signal(self.bank_width)
        remaining = Signal(self.length_width)
        count = Signal(self.length_width)
        count_inc = Signal(self.length_width + 1, init=1)   # count + 1, as a flip-flop

        # Two register stages between the parse and the slot queues, where the row address
        # ``base + index * stride`` is computed. ``pe1`` holds the parsed item's entry, its
        # index (``pe1_index``, loaded on every cycle: the pre-decode buffer's read
        # multiplexer reaches only this register) and its bag's stride. The product runs
        # free from ``pe1``: ``p_off`` is, on every cycle, the product of what ``pe1`` held
        # on the cycle before, so it is ``pe2``'s offset. It is a register without reset or
        # enable straight after the multiplier (on an FPGA, the DSP block's output register:
        # ``host.bench.timing.absorb_dsp_registers``), whose inputs are flip-flops, so
        # neither the buffer's multiplexer nor fabric routing after the multiplier lies in
        # its path; the slot queues' write data add the base (a carry chain from the base's
        # flip-flops, one copy per queue, and the product's into the queues' memories). An
        # index wider than a DSP block's 18-bit operand is multiplied in 18-bit pieces, each
        # into its own register, and the write data add the pieces with the base.
        pe_layout = data.StructLayout({
            "valid": unsigned(1), "slot": unsigned(max(1, exact_log2(K))),
            "info": rinfo, "stride": unsigned(self.beats_width),
            "base": unsigned(self.addr_width),
        })
        pe1 = Signal(pe_layout)
        pe2 = Signal(pe_layout)
        pe1_index = Signal(self.index_width, reset_less=True)
        pe2_wen = Signal(K)          # pe2's slot write enables, decoded a stage ahead
        m.d.sync += pe1_index.eq(p_item.body.item.index)
        off = 0
        for lo in range(0, self.index_width, 18):
            piece = pe1_index[lo:lo + 18]
            p_off = Signal(len(piece) + self.beats_width, name=f"p_off{lo}", reset_less=True)
            m.d.sync += p_off.eq(piece * pe1.stride)
            off = off + (p_off << lo)
        # Each slot queue adds the base on its own (its own copy of ``pe2``'s base, kept by
        # the FPGA flow, so that the adders are not merged): one sum reaching the write data
        # of every slot queue's memory was 8.1 ns (the multiplier's output register, the
        # carry chain, then the queues' memories spread over the fabric).
        pe2_addrs = []
        for k in range(K):
            base_k = Signal(self.addr_width, name=f"pe2_base{k}", attrs={KEEP_COPY_ATTR: "1"})
            m.d.sync += base_k.eq(pe1.base)
            addr_k = Signal(self.addr_width, name=f"pe2_addr{k}")
            m.d.comb += addr_k.eq((base_k + off)[:self.addr_width])
            pe2_addrs.append(addr_k)
        # (and a copy for the control queues, kept by the FPGA flow: one enable reaching both
        # queues' memories was 7.8 ns, 6.7 of it routing)
        pe2_cwen = Signal(K, name="pe2_cwen", attrs={KEEP_COPY_ATTR: "1"})
        wen_next = Cat(*[pe1.valid & (pe1.slot == k) for k in range(K)])
        m.d.sync += [pe1.valid.eq(0), pe2.eq(pe1), pe2_wen.eq(wen_next), pe2_cwen.eq(wen_next)]
        for k, (q, cq) in enumerate(zip(slots, ctl_qs)):
            wr = data.View(sentry, q.w_data)
            cw = data.View(slot_ctl, cq.w_data)
            m.d.comb += [
                cq.w_en.eq(pe2_cwen[k]),
                cw.has_row.eq(pe2.info.has_row), cw.first.eq(pe2.info.first),
                q.w_en.eq(pe2_wen[k]),
                wr.info.eq(pe2.info),
                wr.addr.eq(pe2_addrs[k]),
                wr.beats.eq(pe2.info.has_row * pe2.stride),
            ]
        # A slot has room when the entries in pe1 and pe2 and one more still fit, from the
        # level one cycle earlier (which is at most one entry lower). ``room_ok`` is that flag
        # for the slot of the item parsed on this cycle, chosen a cycle ahead (see below), so
        # that the parse's stall is a function of flip-flops a LUT or two deep.
        room_ok = Signal()
        # ``lvl_ok[k]``: slot ``k``'s level is at most ``slot_depth - 4``, a flip-flop kept
        # like ``room`` (the compares of the level with its three neighbouring thresholds,
        # chosen by whether the slot gains or loses an entry), so that ``room_ok``'s next
        # value is a multiplexer of flip-flops
        lvl_ok = Signal(K, init=(1 << K) - 1)
        for k, q in enumerate(slots):
            w, r = q.w_en, q.r_rdy & q.r_en
            lim = self.slot_depth - 4
            m.d.sync += lvl_ok[k].eq(Mux(w & ~r, q.level <= lim - 1,
                                         Mux(r & ~w, q.level <= lim + 1, q.level <= lim)))
        # Flags kept as flip-flops so that the parse's stall decision is a few LUTs deep.
        no_rows = Signal()           # the current bag has no contributing row yet
        last_next = Signal()         # the next item is the bag's last (remaining == 1)

        with m.FSM(name="front") as front_fsm:
            with m.State("HEADER"):
                # (the bag entry's fields as an empty bag's, whether or not it is written:
                # the write enable is ``bq_write`` alone, so the write data do not wait for
                # the parse's decision; an 8.5 ns path from the pre-decode buffer's valid)
                m.d.comb += [
                    bag_w.tag.eq(hdr.tag), bag_w.count.eq(0),
                    bag_w.last_word.eq(Mux(hdr_valid_desc, p_desc.last_word, 0)),
                    bag_w.tail.eq(p_desc.tail),
                    bag_w.error.eq(~hdr_valid_desc),
                ]
                with m.If(p_valid & ~p_header):
                    # An index item outside a bag: drop it.
                    m.d.comb += parse_take.eq(1)
                    m.d.comb += inc["protocol_errors"].eq(1)
                with m.Elif(p_len0):
                    # Empty bag: one cycle and its (zero) bag entry; no reducer slot, no bank.
                    m.d.comb += parse_take.eq(bag_room)
                    with m.If(p_valid & bag_room):
                        m.d.comb += inc["bags_in"].eq(1)
                with m.Else():
                    m.d.comb += parse_take.eq(1)
                    with m.If(p_valid):
                        m.d.sync += [
                            cur.eq(p_desc), c_tag.eq(hdr.tag),
                            c_weighted.eq(hdr.weighted), c_error.eq(~hdr_valid_desc),
                            c_dropped.eq(0), remaining.eq(hdr.length), count.eq(0),
                            count_inc.eq(1),
                            no_rows.eq(1), last_next.eq(p_len1),
                        ]
                        m.d.comb += inc["bags_in"].eq(1)
                        m.next = "ITEMS"
            with m.State("ITEMS"):
                early = p_header     # a header inside a bag closes it (protocol error)
                is_pad = p_pad
                oob = p_oob
                contributes = ~early & ~c_error & ~is_pad & ~oob
                last = early | last_next
                claim = contributes & no_rows
                bank = Mux(no_rows, next_bank, c_bank)
                slot = bank[:max(1, exact_log2(K))] if K > 1 else Const(0, 1)
                marker = last & ~contributes & ~no_rows
                need_entry = contributes | marker
                # Whether the item may be parsed does not wait for what it is (padding, out of
                # range): every index needs room in its bag's slot. The stall is then a
                # function of flip-flops only, and costs nothing but in a full slot.
                can = room_ok & (~last | bag_room)
                m.d.comb += parse_take.eq(can & ~early)
                with m.If(p_valid & can):
                    with m.If(claim):
                        m.d.sync += [c_bank.eq(next_bank), next_bank.eq(next_bank + 1)]
                    with m.If(contributes):
                        m.d.sync += [count.eq(count_inc), count_inc.eq(count_inc + 1),
                                     no_rows.eq(0)]
                    with m.If(~early & ~c_error & oob & ~is_pad):
                        m.d.sync += c_dropped.eq(1)
                        m.d.comb += inc["indices_dropped"].eq(1)
                    with m.If(~early & ~c_error & is_pad):
                        m.d.comb += inc["indices_padding"].eq(1)
                    with m.If(early):
                        m.d.comb += inc["protocol_errors"].eq(1)
                    m.d.sync += pe1.valid.eq(need_entry)
                    with m.If(last):
                        m.next = "HEADER"
                    with m.Else():
                        m.d.sync += [remaining.eq(remaining - 1), last_next.eq(remaining == 2)]
                # the bag entry's fields as the bag's last item would write them (written only
                # on ``bq_write``, see HEADER)
                final_count = Mux(contributes, count_inc, count)
                m.d.comb += [
                    bag_w.tag.eq(c_tag),
                    bag_w.last_word.eq(Mux(c_error, 0, cur.last_word)),
                    bag_w.tail.eq(cur.tail),
                    bag_w.mean.eq(cur.pooling == POOLING_CODES["mean"]),
                    bag_w.count.eq(Mux(c_error, 0, final_count)),
                    bag_w.has_rows.eq(~no_rows | contributes),
                    bag_w.error.eq(c_error | early),
                    bag_w.dropped.eq(c_dropped | (~early & ~c_error & oob & ~is_pad)),
                    bag_w.bank.eq(bank),
                ]
                # ``pe1``'s fields load on every cycle (what this item's entry would be): only
                # its ``valid`` waits for the parse's decision, so that decision enables one
                # flip-flop instead of every bit of the entry
                m.d.sync += [
                    pe1.slot.eq(slot),
                    pe1.info.has_row.eq(contributes), pe1.info.end.eq(last),
                    pe1.info.first.eq(no_rows), pe1.info.weighted.eq(c_weighted),
                    pe1.info.weight.eq(idx.weight), pe1.info.elem_type.eq(cur.elem_type),
                    pe1.info.is_max.eq(cur.pooling == POOLING_CODES["max"]),
                    pe1.info.last_word.eq(cur.last_word), pe1.info.tail.eq(cur.tail),
                    pe1.info.bank.eq(bank),
                    pe1.stride.eq(cur.stride), pe1.base.eq(cur.base),
                ]

        # The bag entry is written by an empty bag's header (HEADER) or a bag's last item
        # (ITEMS: the last index, or a header closing the bag early), as the FSM says; the
        # write enable stated on its own, from flip-flops (``bag_room`` for the queue).
        m.d.comb += bag_q.w_en.eq(bq_write)
        m.d.comb += bq_write.eq(p_valid & bag_room & Mux(
            front_fsm.ongoing("ITEMS"), room_ok & (p_header | last_next),
            p_header & p_len0))

        # The slot of the next cycle's index item: ``next_bank``'s while the bag has no bank
        # (a header now, or no contributing row yet: an item claiming the bank now makes
        # ``c_bank`` this ``next_bank``), else ``c_bank``'s (unchanged: only a bag without a
        # bank claims one).
        kb = max(1, exact_log2(K))
        m.d.sync += room_ok.eq(Mux(no_rows | front_fsm.ongoing("HEADER"),
                                   lvl_ok.bit_select(next_bank[:kb] if K > 1 else 0, 1),
                                   lvl_ok.bit_select(c_bank[:kb] if K > 1 else 0, 1)))

        # ---- arbiter: interleave the slots' rows into the request stream ------------------
        # Round robin over the slots with an entry: consecutive rows of one bag are separated
        # by rows of the other bags in flight, which hides the accumulator's read-add-write
        # distance. The reducer sees the rows in request order (responses are in order).
        #
        # The grant is a flip-flop (one-hot), computed a cycle ahead from what every slot's
        # head will be on the next cycle (the same entry, or the one after it seen through
        # the read slice's look-ahead when the head goes or is empty) and the arbiter's next
        # state; on its cycle only the downstream room (flip-flops) decides whether the
        # granted head goes. So no path runs from the heads through a priority network into
        # the heads' own ``ready``, and the payload is an AND-OR of the heads under a
        # registered select. It is the same grant, cycle for cycle, as one computed from the
        # heads of its own cycle.
        rr = Signal(max(1, exact_log2(K)))      # the slot the round robin looks at first
        # A bag's first row may go only in bag order (``start``: the slot of the next bag to
        # start, one-hot): banks are then claimed in bag order, as the drain frees them, and
        # every bag holding the bank a starting bag needs has all its rows ahead of it (no
        # deadlock; needs ``banks > interleave``).
        start = Signal(K, init=1)
        hviews = [c.o.payload for c in ctl_sks]
        # Pacing: a row of the slot served last (``rr_prev``) waits while ``pace_rows`` rows
        # or more are in flight, so that another bag's row, when one comes, goes between two
        # rows of one bag: back to back, two rows of a bag cost the adder's read-add-write
        # distance instead of their words (the first bag of a batch, whose rows the parse
        # produces before any other bag's, would otherwise run alone). With fewer rows in
        # flight the memory is kept busy first.
        rr_prev = Signal(K, init=1 << (K - 1))   # one-hot: the slot served last
        grant = Signal(K)                        # one-hot (or zero): this cycle's grant
        # Copies of the grant select the granted head's entry, for the request's fields and
        # for the row's: a grant flip-flop's net reached every bit of both slices' entries
        # and the arbiter's own logic (8.0-8.5 ns of routing over two LUTs). Marked as
        # deliberate copies (``rtl.streams.KEEP_COPY_ATTR``): synthesis keeps them.
        # Each copy selects at most 16 bits of the entry (one copy still reached 24-46 bits
        # of the entry and was 8.4 ns of which 7.5 routing).
        grant_copies = []

        def granted(lo, hi, name):
            # bits ``lo .. hi - 1`` of the granted head's entry, each share of at most 16
            # bits selected by a copy of the grant of its own
            n = max(1, -(-(hi - lo) // 16))
            bounds = [lo + (hi - lo) * j // n for j in range(n + 1)]
            parts = []
            for j, (a, b) in enumerate(zip(bounds, bounds[1:])):
                g = Signal(K, name=f"{name}{j}", attrs={KEEP_COPY_ATTR: "1"})
                grant_copies.append(g)
                part = Const(0, b - a)
                for k in range(K):
                    part = part | Mux(g[k], Value.cast(heads[k].payload)[a:b], 0)
                parts.append(part)
            return Cat(*parts)
        f_info, f_addr, f_beats = sentry["info"], sentry["addr"], sentry["beats"]
        assert f_info.offset == 0 and f_addr.offset == f_info.width \
            and f_beats.offset == f_addr.offset + f_addr.width == sentry.size - f_beats.width
        sel = data.View(sentry, Cat(Const(0, f_info.width),
                                    granted(f_addr.offset, sentry.size, "grant_req")))
        seli = data.View(sentry, Cat(granted(0, f_info.width, "grant_info"),
                                     Const(0, sentry.size - f_info.width)))
        outstanding = Signal(range(self.outstanding + 1))
        row_done = Signal()          # the reducer finished consuming a row
        row_issued = Signal()
        # ``room``: fewer than ``outstanding`` rows in flight, as a flip-flop (next state);
        # the compares are made on the count alone, the handshakes only select among them
        room = Signal(init=1)

        def pick(v_up, v_down, v_same):
            # the next value for one more row in flight, one fewer, or as many: the issue
            # picks first, the reducer's ``row_done`` (later in the cycle) last
            return Mux(row_done, Mux(row_issued, v_same, v_down),
                       Mux(row_issued, v_up, v_same))
        # the counter's next value: both neighbours computed from the flip-flops, the
        # handshakes only pick one
        out_up = Signal.like(outstanding)
        out_down = Signal.like(outstanding)
        m.d.comb += [out_up.eq(outstanding + 1), out_down.eq(outstanding - 1)]
        m.d.sync += [
            outstanding.eq(pick(out_up, out_down, outstanding)),
            room.eq(pick(outstanding < self.outstanding - 1, 1,
                         outstanding < self.outstanding)),
        ]
        # ``outstanding >= t`` for the pacing thresholds the next grant compares with, kept
        # as flip-flops the same way (so the grant's next state does not wait for a compare).
        # Pacing counts the rows in flight as of the cycle before (a row the reducer finishes
        # on this cycle still counts for the next cycle's grant): so the grant does not wait
        # for ``row_done``, which comes at the end of the reducer's stall logic.
        pr = self.pace_rows
        at_least = {}
        for t in (pr - 1, pr):
            at_least[t] = Signal(name=f"outstanding_ge{t}", init=int(t <= 0))
            m.d.sync += at_least[t].eq(pick(outstanding >= t - 1, outstanding >= t + 1,
                                            outstanding >= t))
        # The arbiter writes the row queue through a register slice too (its ``ready`` is a
        # flip-flop), as it writes the requests (a ``PingPongBuffer``, for the same reason).
        m.submodules.info_in = info_in = PingPongBuffer(rinfo)
        m.d.comb += [info_q.w_en.eq(info_in.o.valid & info_q.w_rdy),
                     info_q.w_data.eq(info_in.o.payload),
                     info_in.o.ready.eq(info_q.w_rdy)]
        # Per slot: whether its head could go if granted (flip-flops only), then the grant.
        has_row_bits = Cat(*[hv.has_row for hv in hviews])
        first_bits = Cat(*[hv.first for hv in hviews])
        can_go = Cat(*[info_in.i.ready & (~hv.has_row | (req_out.i.ready & room))
                       for hv in hviews])
        go_k = Signal(K)
        m.d.comb += go_k.eq(grant & can_go)
        go = Signal()
        m.d.comb += go.eq(go_k.any())
        m.d.comb += [
            req_out.i.valid.eq((go_k & has_row_bits).any()),
            req_out.i.payload.addr.eq(sel.addr),
            req_out.i.payload.beats.eq(sel.beats),
            req_out.i.payload.write.eq(0),
            row_issued.eq(req_out.i.valid),
            info_in.i.valid.eq(go),
            info_in.i.payload.eq(seli.info),
        ]
        for k, h in enumerate(heads):
            m.d.comb += h.ready.eq(go_k[k])
        # Each slot's head as it will be on the next cycle, kept as flip-flops a cycle ahead
        # (``look[k]``), for both outcomes of this cycle: ``stay_*`` if the slot's head does not
        # go (the same entry, or the one behind it when the head is empty) and ``adv_*`` if
        # it goes (the entry behind it). Their next values follow the control slice's and its
        # queue's next state (``CreditFIFO``'s ``read_ahead``) for either value of the head's
        # load (``~o.valid | go``), which selects at the end. Until session 17 the next grant
        # read them through the slice's look-ahead multiplexer (``peek``) and the head's
        # valid, one more LUT level on the grant's critical path.
        look = []
        for k, (c, cq, hv) in enumerate(zip(ctl_sks, ctl_qs, hviews)):
            names = ("stay_v", "stay_first", "stay_row", "adv_v", "adv_first", "adv_row")
            regs = [Signal(name=f"look{k}_{n}") for n in names]
            pv, pp = c.peek_valid, c.peek_payload
            qv, qp = cq.r_rdy_next, data.View(slot_ctl, cq.r_data_next)

            def after(hv_, hf, hr, nv_, nf, nr):
                # (head, the entry behind it) on the next cycle -> the six flags
                return [hv_ | nv_, Mux(hv_, hf, nf), Mux(hv_, hr, nr), nv_, nf, nr]
            # the head loads: it takes the peeked entry, the skid register empties, and the
            # entry behind it is the queue's next head
            loaded = after(pv, pp.first, pp.has_row, qv, qp.first, qp.has_row)
            # it holds: the skid register takes the peeked entry if there is one
            held = after(c.o.valid, hv.first, hv.has_row, pv | qv,
                         Mux(pv, pp.first, qp.first), Mux(pv, pp.has_row, qp.has_row))
            load = ~c.o.valid | go_k[k]
            m.d.sync += [r.eq(Mux(load, a, b)) for r, a, b in zip(regs, loaded, held)]
            look.append(dict(zip(names, regs)))
        # The arbiter's next state.
        rr_prev_next = Signal(K)
        start_next = Signal(K)
        rr_next = Signal.like(rr)
        m.d.comb += [
            rr_prev_next.eq(Mux(go, grant, rr_prev)),
            start_next.eq(Mux((go_k & first_bits).any(), start.rotate_left(1), start)),
        ]
        rr_after = Const(0, len(rr))
        for k in range(K):
            rr_after = rr_after | Mux(grant[k], (k + 1) % K, 0)
        m.d.comb += rr_next.eq(Mux(go, rr_after, rr))
        # The next grant, computed for both outcomes of this cycle's grant (it goes, or it
        # does not) from flip-flops; the handshake picks one at the end. Per outcome, a slot's head may be granted on the next cycle when it
        # will hold an entry (the same one, or the next, seen through the read slice's
        # look-ahead when the head goes or is empty), a bag's first row only in bag order,
        # a row of the slot served last not while paced; then the round robin: slot ``k``
        # when it is ready and no slot before it in the order ``rr``, ``rr + 1``, ... is.
        def round_robin(first_slot, ready):
            g = []
            for k in range(K):
                ahead = Const(0, 1)
                for r in range(K):
                    if isinstance(first_slot, int) and r != first_slot:
                        continue
                    before = [(r + off) % K for off in range((k - r) % K)]
                    if before:
                        hit = Cat(*[ready[j] for j in before]).any()
                        ahead = ahead | (hit if isinstance(first_slot, int)
                                         else (first_slot == r) & hit)
                g.append(ready[k] & ~ahead)
            return Cat(*g)

        # The next grant is computed for each slot ``j`` whose head could go on this cycle
        # (``went=j``) and for no head going (``went=None``): with the slot that goes a
        # constant, what the next grant depends on (the heads as they will be, the round
        # robin's first slot, the slot served last, the rows in flight) is a function of
        # flip-flops alone, and this cycle's one-hot grant and the slots' room (``can_go``)
        # select among the candidates at the end (an AND-OR two LUTs deep). So the grant's
        # own flip-flops start no long path, and the reducer's handshake reaches none.
        def grant_after(went):
            issued = has_row_bits[went] if went is not None else Const(0, 1)
            pace_n = Mux(issued, at_least[pr - 1], at_least[pr])
            served = Const(1 << went, K) if went is not None else rr_prev
            st = (Mux(first_bits[went], start.rotate_left(1), start) if went is not None
                  else start)
            ready = []
            for k, lk in enumerate(look):
                # the head on the next cycle: the entry behind it if it goes, else as it stays
                w = "adv" if went == k else "stay"
                nv, nfirst, nrow = lk[f"{w}_v"], lk[f"{w}_first"], lk[f"{w}_row"]
                r = nv
                if K > 1:
                    r = r & (~nfirst | st[k]) & ~(pace_n & served[k] & nrow)
                ready.append(r)
            return round_robin((went + 1) % K if went is not None else rr, ready)

        stay = Signal(K)             # the next grant when no head goes
        m.d.comb += stay.eq(grant_after(None))
        grant_next = Signal(K)
        nxt = Mux(grant.any(), 0, stay)
        for j in range(K):
            # slot ``j``'s candidate: chosen among flip-flop-only terms by ``can_go[j]``
            # (also flip-flops), then gated by ``grant[j]``
            cand = Mux(can_go[j], grant_after(j), stay)
            nxt = nxt | Mux(grant[j], cand, 0)
        m.d.comb += grant_next.eq(nxt)
        m.d.sync += [grant.eq(grant_next), *[g.eq(grant_next) for g in grant_copies],
                     rr.eq(rr_next), rr_prev.eq(rr_prev_next), start.eq(start_next)]

        # ---- reducer issue: one word per cycle into a pipeline that never stalls ----------
        head = data.View(rinfo, info_pp.o.payload)
        hc = info_h.payload          # the head's control fields (flip-flops)
        rs = resp_in.o
        wpb = self.words_per_beat
        al = self.add_latency
        ml = self.mul_latency
        chunk = Signal(range(2 * wpb))
        word = Signal(self.word_width + 1)
        word_inc = Signal(self.word_width + 1, init=1)     # word + 1, kept as a flip-flop
        is16 = hc.elem_type != ELEM_TYPE_CODES["fp32"]
        addr_w = self.word_width + self.bank_width
        # The words issued in the last ``add_latency`` cycles are still in the adder when this
        # one reads its sum: a word of the same accumulator address must wait (the
        # read-add-write distance, ``add_latency + 1``). Only the issue stage looks;
        # everything after it runs free.
        recent = [Signal(data.StructLayout({"valid": unsigned(1), "addr": unsigned(addr_w)}),
                         name=f"recent{k}") for k in range(al)]
        # The stall flags of the head word (hazard, bank wait) and whether it is its row's last
        # word are flip-flops, computed one cycle ahead for each thing the head can be on the
        # next cycle: the same word (no take), the row's next word (a take inside the row), or
        # word 0 of the entry that follows (``peek``: the head advances). Against the window
        # as it will be then: ``recent[0 .. al-2]`` moved one place, plus this cycle's word
        # if it is taken. ``take`` only selects among the three at the end, so no long path
        # runs from the accumulator state through the handshake into the skid buffers.
        # A bank freed by the drain is seen one cycle later than the drain frees it.
        hazard = Signal()
        bank_wait = Signal()
        last_word = Signal()
        peek = info_sk.peek_payload
        # The stall flags' own copy of the head's bank and of ``has_row & ~first``, loaded as
        # the head's slice loads its output register (``rtl.streams.SkidBuffer``: from
        # ``peek`` whenever the output is empty or taken), so that the window's address
        # compares and the bank flags do not share the head's bank flip-flops with the rest
        # of the issue stage (their net spanned the stage: 4.7 ns of routing to the hazard's
        # first LUT, its critical path). The copy's bank is zero in an entry without a row,
        # which every use of it ignores (each is gated by ``has_row``), so it is not the same
        # function as the head's and synthesis keeps both.
        hz_bank = Signal(self.bank_width, name="hz_bank")
        hz_later = Signal(name="hz_later")       # has_row & ~first: a row after the bag's first
        with m.If(~info_h.valid | info_h.ready):
            m.d.sync += [hz_bank.eq(Mux(peek.has_row, peek.bank, 0)),
                         hz_later.eq(peek.has_row & ~peek.first)]
        head_addr = Cat(word[:self.word_width], hz_bank)

        take = Signal()
        # ``take_w``: the same handshake from copies of the stall flags (kept by the FPGA
        # flow), for the window's own flags below, so that ``take``'s net (the row counters'
        # ``row_done``, the skid buffers, the stage-1 register) does not also carry their
        # loads
        take_w = Signal()
        # ``word == 0`` as a flip-flop (``word`` is reset to 0 and goes to 0 exactly after a
        # take of a row's last word): the bank claim's compare was in front of the busy flags
        # (8.1 ns)
        word_is0 = Signal(init=1, name="word_is0")
        claim_bank = hc.has_row & hc.first & word_is0
        # The window's compares are flip-flops too, kept a cycle ahead (the hazard flag
        # from the window's addresses was the critical path: 8.95 ns, 7 LUTs): ``hit_stay[k]``
        # is ``recent[k]`` (valid) holding the head's word (``head_addr``), ``hit_step[k]``
        # holding the row's next word (``next_addr``), for the window ``recent[:al-1]``. As
        # the window shifts, each flag takes its neighbour's (the head stays: ``hit_stay``;
        # the head steps to its next word: ``hit_step``, whose next value compares the
        # window with the word after that, ``word_inc2``); when the head loads a new entry,
        # its words 0 and 1 (a new head's ``word`` and ``word_inc``: a row is taken to its
        # last word before the head advances) are compared with the window and the entry's
        # bank, for the skid register's entry and the queue's head apart (``skid_full``
        # chooses at the end, as for ``peek_hazard``). For a head without a row, or a bag's
        # first row, the flags are not used (``hz_later``), so their bank is not gated.
        hit_stay = Signal(max(1, al - 1), name="hit_stay")
        hit_step = Signal(max(1, al - 1), name="hit_step")
        stay_hazard = hz_later & hit_stay[:al - 1].any() if al > 1 else Const(0, 1)
        stay_wait = claim_bank & bank_busy.bit_select(hz_bank, 1)
        # the row's next word, after a take inside the row
        next_addr = Cat(word_inc[:self.word_width], hz_bank)
        word_inc2 = Signal(self.word_width + 1, init=2)    # word + 2, kept as a flip-flop
        step_hazard = hz_later & hit_step[:al - 1].any() if al > 1 else Const(0, 1)
        step_last = word_inc == hc.last_word
        # word 0 of the next entry: the read slice's skid register's entry if it holds one,
        # else the queue's head. The hazard is computed for both and chosen at the end, so
        # that the slice's ``skid_valid`` (which also enables the slice's registers) selects
        # one flag instead of the compared address. ``in_skid`` copies the fields compared
        # from the queue's head on every cycle the skid register is empty, as the skid
        # register does (``rtl.streams.SkidBuffer``), so it holds the same entry.
        skid_full = ~info_sk.i.ready                 # the slice's skid register holds one
        # (two copies of that flag, kept by the FPGA flow, updated as the slice updates its
        # own (``rtl.streams.SkidBuffer``): one for the window flags' loads below, one for
        # the stall flags, so that the slice's flip-flop does not carry their 40 loads)
        skid_copies = []
        for name in ("hz_skid_hits", "hz_skid_flags"):
            c = Signal(name=name, attrs={KEEP_COPY_ATTR: "1"})
            m.d.sync += c.eq(info_h.valid & ~info_h.ready & (c | info_q.r_rdy))
            skid_copies.append(c)
        skid_hits, skid_flags = skid_copies
        queue_head = data.View(rinfo, info_q.r_data)
        in_skid = Signal(data.StructLayout({"has_row": unsigned(1), "first": unsigned(1),
                                            "bank": unsigned(self.bank_width)}))
        with m.If(~skid_full):
            m.d.sync += [in_skid.has_row.eq(queue_head.has_row),
                         in_skid.first.eq(queue_head.first), in_skid.bank.eq(queue_head.bank)]

        # ``w0_busy[b]``: word 0 of bank ``b`` is in the window (``recent[:al-1]``), a
        # flip-flop per bank kept a cycle ahead (the window's next contents are this cycle's
        # take and ``recent[:al-2]``), so that the hazard of the next entry's first word is
        # one bit chosen by its bank instead of ``al - 1`` address compares
        w0_busy = Signal(nb)
        head_w0 = Signal()
        m.d.comb += head_w0.eq(word_is0)       # (``word`` never exceeds the row's last word)
        # (the window's entries that are word 0 of a bank are kept as one-hot flags beside
        # ``recent``, shifting with it, so that ``w0_busy``'s next value is an OR of
        # flip-flops: its address compares were 8.7 ns)
        if al > 1:
            w0_oh = [Signal(nb, name=f"recent_w0_{k}") for k in range(al - 2)]
            head_w0_oh = Signal(nb)
            m.d.comb += head_w0_oh.eq(Mux(take_w & hc.has_row & head_w0,
                                          Const(1, nb) << hz_bank, 0))
            for k in range(al - 2):
                m.d.sync += w0_oh[k].eq(head_w0_oh if k == 0 else w0_oh[k - 1])
            nxt = head_w0_oh
            for oh in w0_oh:
                nxt = nxt | oh
            m.d.sync += w0_busy.eq(nxt)

        fin = ~hc.has_row | last_word        # a take now ends the head's entry
        if al > 1:
            ww = self.word_width

            def holds(r, word_value, bank):
                return r.valid & (r.addr[:ww] == word_value) & (r.addr[ww:] == bank)

            def new_head(word_value, k, entry):
                # window entry ``k`` (next cycle's numbering) holds word ``word_value`` of
                # ``entry``'s bank: ``recent[k-1]``, or for ``k == 0`` this cycle's take
                if k == 0:
                    return (hc.has_row & (word[:ww] == word_value)
                            & (hz_bank == entry.bank))
                return holds(recent[k - 1], word_value, entry.bank)

            stay_n, step_n = [], []
            for k in range(al - 1):
                load0 = Mux(skid_hits, new_head(0, k, in_skid), new_head(0, k, queue_head))
                load1 = Mux(skid_hits, new_head(1, k, in_skid), new_head(1, k, queue_head))
                if k == 0:
                    # the word taken now enters the window: it is the head's word (the
                    # next one differs from it) unless the head loads a new entry
                    inrow_stay = word[:ww] == word_inc[:ww]
                    inrow_step = word[:ww] == word_inc2[:ww]
                    stay_n.append(Mux(take_w, Mux(fin, load0, inrow_stay), 0))
                    step_n.append(Mux(take_w, Mux(fin, load1, inrow_step), 0))
                else:
                    two_ahead = holds(recent[k - 1], word_inc2[:ww], hz_bank)
                    stay_n.append(Mux(take_w, Mux(fin, load0, hit_step[k - 1]),
                                      Mux(info_h.valid, hit_stay[k - 1], load0)))
                    step_n.append(Mux(take_w, Mux(fin, load1, two_ahead),
                                      Mux(info_h.valid, hit_step[k - 1], load1)))
            m.d.sync += [hit_stay.eq(Cat(*stay_n)), hit_step.eq(Cat(*step_n))]

        def hazard_of(entry, taken: bool):
            hit = w0_busy.bit_select(entry.bank, 1)
            if taken:
                hit = hit | (hc.has_row & head_w0 & (hz_bank == entry.bank))
            return entry.has_row & ~entry.first & hit

        def peek_hazard(taken: bool):
            return Mux(skid_flags, hazard_of(in_skid, taken), hazard_of(queue_head, taken))
        # (for the skid register's entry and the queue's head apart, chosen at the end: the
        # slice's ``peek`` multiplexer in front of the bank's select was the bank-wait
        # flag's critical path, 8.4 ns)
        def wait_of(entry):
            return entry.has_row & entry.first & bank_busy.bit_select(entry.bank, 1)
        peek_wait = Mux(skid_flags, wait_of(in_skid), wait_of(queue_head))
        peek_last = peek.last_word == 0
        # ``take`` is the last select: the head advances (loads the next entry) with a take
        # when its entry ends (``fin``), without one when it is empty
        hazard_w = Signal(name="hazard_w", attrs={KEEP_COPY_ATTR: "1"})
        bank_wait_w = Signal(name="bank_wait_w", attrs={KEEP_COPY_ATTR: "1"})
        hazard_next = Mux(take, Mux(fin, peek_hazard(True), step_hazard),
                          Mux(info_h.valid, stay_hazard, peek_hazard(False)))
        bank_wait_next = Mux(take, Mux(fin, peek_wait, 0),
                             Mux(info_h.valid, stay_wait, peek_wait))
        last_word_next = Mux(take, Mux(fin, peek_last, step_last),
                             Mux(info_h.valid, last_word, peek_last))
        m.d.sync += [
            hazard.eq(hazard_next), hazard_w.eq(hazard_next),
            bank_wait.eq(bank_wait_next), bank_wait_w.eq(bank_wait_next),
            last_word.eq(last_word_next),
        ]
        beat_done = last_word | (chunk == Mux(is16, 2 * wpb - 1, wpb - 1))
        # A bag's first word claims its bank (banks go round in bag order): it waits while
        # the bag that held the bank before is still being drained.
        with m.If(take & claim_bank):
            for b in range(nb):
                with m.If(hc.bank == b):
                    m.d.sync += bank_busy[b].eq(1)
        with m.If(info_h.valid & bank_wait):
            m.d.comb += inc["stall_bank"].eq(1)
        # ``take_w`` reads its own copy of the response slice's valid (kept by the FPGA flow),
        # which follows the slice's occupancy as ``rtl.streams.PingPongBuffer`` does (filled
        # by an accepted beat, emptied by a taken one when it held one beat, ``~i.ready`` then
        # says whether it held two): the slice's flip-flop also reaches ``take`` and its
        # loads, and the window flag ``hit_step`` from it was 8.0 ns (6.2 of routing)
        rs_valid_w = Signal(name="rs_valid_w", attrs={KEEP_COPY_ATTR: "1"})
        rs_push = resp_in.i.valid & resp_in.i.ready
        rs_pop = rs.valid & rs.ready
        m.d.sync += rs_valid_w.eq(Mux(rs_push & ~rs_pop, 1,
                                      Mux(rs_pop & ~rs_push, ~resp_in.i.ready, rs_valid_w)))
        # ``row_done`` (``take & has_row & last_word``, which with a row is ``info_h.valid &
        # rs.valid & has_row & last_word & ~hazard & ~bank_wait``) from three flip-flops of
        # its own, kept by the FPGA flow: ``rd_row`` (the head holds a row at its last word
        # on the next cycle: the skid slice's valid and ``has_row`` as the slice loads them,
        # and ``last_word``'s next value), ``rd_clear`` (no hazard or bank wait: their next
        # values) and ``rd_rs`` (the response slice's valid, as ``rs_valid_w``), so that the
        # row counters' next state (``outstanding``, ``room``, the pacing flags) starts at
        # them and not at the head's valid, whose net spans the issue stage (the counters'
        # flags from it through the hazard and ``has_row`` were 8.1 ns, 6.3 of routing)
        rd_row = Signal(name="rd_row", attrs={KEEP_COPY_ATTR: "1"})
        rd_clear = Signal(name="rd_clear", attrs={KEEP_COPY_ATTR: "1"})
        rd_rs = Signal(name="rd_rs", attrs={KEEP_COPY_ATTR: "1"})
        h_load = ~info_h.valid | info_h.ready
        m.d.sync += [
            rd_row.eq(Mux(h_load, info_sk.peek_valid & peek.has_row, info_h.valid & hc.has_row)
                      & last_word_next),
            rd_clear.eq(~hazard_next & ~bank_wait_next),
            rd_rs.eq(Mux(rs_push & ~rs_pop, 1,
                         Mux(rs_pop & ~rs_push, ~resp_in.i.ready, rd_rs))),
        ]
        m.d.comb += [
            take.eq(info_h.valid & (~hc.has_row | rs.valid) & ~hazard & ~bank_wait),
            take_w.eq(info_h.valid & (~hc.has_row | rs_valid_w) & ~hazard_w & ~bank_wait_w),
            rs.ready.eq(take & hc.has_row & beat_done),
            info_h.ready.eq(take & (~hc.has_row | last_word)),
            row_done.eq(rd_row & rd_clear & rd_rs),
        ]
        m.d.sync += [recent[0].valid.eq(take & hc.has_row), recent[0].addr.eq(head_addr)]
        for k in range(1, al):
            m.d.sync += recent[k].eq(recent[k - 1])
        with m.If(take & hc.has_row):
            m.d.sync += [word.eq(Mux(last_word, 0, word_inc)), word_is0.eq(last_word),
                         word_inc.eq(Mux(last_word, 1, word_inc2)),
                         word_inc2.eq(Mux(last_word, 2, word_inc2 + 1)),
                         chunk.eq(Mux(beat_done, 0, chunk + 1))]
        with m.If(info_h.valid & hazard):
            m.d.comb += inc["stall_hazard"].eq(1)
        with m.Elif(info_h.valid & hc.has_row & ~rs.valid):
            m.d.comb += inc["stall_memory"].eq(1)

        beat = rs.payload.data
        widened = Signal(32 * lanes)
        w32 = beat.word_select(chunk[:max(1, exact_log2(wpb))] if wpb > 1 else 0, 32 * lanes)
        w16 = beat.word_select(chunk if 2 * wpb > 1 else 0, 16 * lanes)
        conv_lanes = []
        for i in range(lanes):
            h = w16[16 * i:16 * (i + 1)]
            choice = w32[32 * i:32 * (i + 1)]
            if "fp16" in self.elem_types:
                cv = FP16ToFP32(latency=0)
                m.submodules[f"fp16_{i}"] = cv
                m.d.comb += cv.a.eq(h)
                choice = Mux(hc.elem_type == ELEM_TYPE_CODES["fp16"], cv.o, choice)
            if "bf16" in self.elem_types:
                cv = BF16ToFP32(latency=0)
                m.submodules[f"bf16_{i}"] = cv
                m.d.comb += cv.a.eq(h)
                choice = Mux(hc.elem_type == ELEM_TYPE_CODES["bf16"], cv.o, choice)
            conv_lanes.append(choice)
        m.d.comb += widened.eq(Cat(*conv_lanes))

        # Stage 1 register (widened words + their row context), then the fan-out stages and
        # the multipliers.
        # The lanes are self-contained slices: each has its own multiplier, adder/max
        # selector, accumulator memories (one block RAM per copy) and its own copy of every
        # control flag it reads. What every lane needs from the issue stage reaches it
        # through ``fanout_stages`` register levels (a tree of fan-out 4: the stage 1
        # register feeds 4 copies, each of those 4 more, ...), so that no net from one
        # register spans all lanes in one cycle. Synthesis merges registers with the same
        # input, so every copy is made logically distinct: the copy of a group of lanes is
        # gated by whether the group's first lane holds an element of the row (``used``),
        # and a lane outside the row gets a value that changes nothing that is output (the
        # drain zeroes such lanes, ``lane_mask``; a later bag that uses the lane starts it
        # from its first row, which ignores the accumulator's word).
        ctx_layout = data.StructLayout({
            "valid": unsigned(1), "has_row": unsigned(1), "end": unsigned(1),
            "first": unsigned(1),
            "addr": unsigned(addr_w),
            # per lane: whether it holds an element of the row (all but in a row's last word)
            "used": unsigned(lanes),
            # per lane: multiply by the row's weight (weighted, not MAX, used), else by 1.0
            "wgate": unsigned(lanes),
            # per lane: the max selector's "first row" (or a lane outside the row)
            "firstl": unsigned(lanes),
            # per lane: the result is the max selector's (MAX pooling, lane used)
            "maxl": unsigned(lanes),
        })
        s1_ctx = _context_register(ctx_layout, "s1_ctx")
        s1_x = Signal(32 * lanes, reset_less=True)
        s1_w = Signal(32, reset_less=True, name="s1_w")
        m.d.sync += [
            s1_ctx.valid.eq(take), s1_ctx.has_row.eq(hc.has_row),
            s1_ctx.end.eq(head.end & (~hc.has_row | last_word)),
            s1_ctx.first.eq(hc.first),
            s1_ctx.addr.eq(Cat(Mux(hc.has_row, word[:self.word_width], 0), hc.bank)),
            s1_x.eq(widened), s1_w.eq(head.weight),
        ]
        for i in range(lanes):
            # an unweighted row is multiplied by 1.0 (exact, NaNs aside, which the adder makes
            # the canonical NaN anyway): the adder's addend is always the multiplier's output
            lane_used = (~last_word | (head.tail == 0) | (head.tail > i)) if i else Const(1, 1)
            m.d.sync += [s1_ctx.used[i].eq(lane_used),
                         s1_ctx.wgate[i].eq(head.weighted & ~head.is_max & lane_used),
                         s1_ctx.firstl[i].eq(hc.first | ~lane_used),
                         s1_ctx.maxl[i].eq(head.is_max & lane_used)]

        # Fan-out stages: the context (central) and the words (per lane, distinct bits)
        # delayed ``fanout_stages`` cycles; the weight copied down the tree.
        P = self.fanout_stages
        ctx_pipe = [s1_ctx]
        x_pipe = [s1_x]
        weights = [s1_w]             # the copies of the current level
        span = lanes                 # lanes served by each copy of the current level
        for j in range(1, P + 1):
            c = _context_register(ctx_layout, f"fan_ctx{j}")
            x = Signal(32 * lanes, name=f"fan_x{j}", reset_less=True)
            m.d.sync += [c.eq(ctx_pipe[-1]), x.eq(x_pipe[-1])]
            nspan = 1 if j == P else max(1, lanes >> (2 * j))
            copies = []
            for g in range(lanes // nspan):
                lane0 = g * nspan
                w = Signal(32, name=f"fan_w{j}_{g}", reset_less=True)
                m.d.sync += w.eq(Mux(ctx_pipe[-1].wgate[lane0], weights[lane0 // span],
                                     _FP32_ONE))
                copies.append(w)
            ctx_pipe.append(c)
            x_pipe.append(x)
            weights, span = copies, nspan
        mul_x = x_pipe[-1]
        # Multiplier stage: context and unweighted values delayed alongside.
        for k in range(ml):
            c = _context_register(ctx_layout, f"mul_ctx{k}")
            m.d.sync += c.eq(ctx_pipe[-1])
            ctx_pipe.append(c)
            if not self.delay_memory:
                x = Signal(32 * lanes, name=f"mul_x{k}", reset_less=True)
                m.d.sync += x.eq(x_pipe[-1])
                x_pipe.append(x)
        ai = ctx_pipe[-1]            # the add-in stage
        ai_x = self._delayed(m, "mul_xd", mul_x, ml) if self.delay_memory else x_pipe[-1]
        ai_v = []
        for i in range(lanes):
            mul = FPMul32(latency=ml, reset_less=True, three_dsps=True,
                         narrow_shift=True)
            m.submodules[f"wmul_{i}"] = mul
            m.d.comb += [mul.a.eq(mul_x[32 * i:32 * (i + 1)]), mul.b.eq(weights[i])]
            ai_v.append(mul.o)

        # ---- accumulators: ``banks`` banks of max_words words, per lane -----------------
        # Registered reads (block RAM, not transparent), a register straight after the
        # memory's output (its clock-to-output is most of a cycle on ECP5), and the operand
        # register: the add-in stage's word is read three cycles ahead, and the operand
        # register takes, instead of the memory's word, the newest of the same word's
        # write-backs since the read (this cycle's, or one or two cycles old, kept in
        # registers), so the read-add-write distance stays ``add_latency + 1``. Which one it
        # takes is a flip-flop per lane and write-back age, compared two cycles ahead (the
        # compare in one register, the lane's copy in the next).
        # Each lane has its own memories (32 bits wide, one block RAM each on ECP5), with
        # its own registered read address, write address and write enable (a lane outside
        # the row neither writes nor uses what it reads).
        # Two copies of the accumulator with the same writes, one read port each (the
        # reducer's ``acc``, the drain's ``acc_d``): a block RAM has one write and one read
        # port in the mode yosys uses, so a memory with two read ports is duplicated anyway,
        # and with one read port each the copies can be marked ``COLLISION_X_ATTR``:
        # - ``acc``: a read of the address written on the same cycle is never used. The read
        #   of cycle t (the address of the word three stages before the add-in stage)
        #   reaches ``acc_raw`` at t + 2, when the same word is the operand stage's (the
        #   pipeline after the issue stage runs free); ``hit2_pre`` at t + 1 records that
        #   cycle t's write-back was to that address, so ``hit2`` (or a younger
        #   write-back's ``hit1``/``hit0``, which take precedence) selects a write-back
        #   register instead of ``acc_raw`` at t + 2.
        # - ``acc_d``: the drain's read data are used only when it issues, and it issues only
        #   for a bag whose last word was written back on an earlier cycle (``head_ok`` is a
        #   flip-flop set the cycle after that write-back); the bag's bank is written again
        #   only after the drain frees it and a later bag claims it, whose first word then
        #   passes the issue, fan-out, multiplier and adder stages before its write-back. The
        #   reads of the cycles it does not issue (the address is read every cycle) are
        #   dropped with ``dctx.valid`` low.
        # ``ram_style``: block RAM at every size (yosys puts a shallow accumulator into
        # distributed RAM otherwise).
        acc_attrs = {"ram_style": "block", COLLISION_X_ATTR: "1"}
        depth = nb << self.word_width
        inflight = []                # words in the adder, youngest first
        for k in range(al):
            inflight.append(_context_register(data.StructLayout({
                "valid": unsigned(1), "has_row": unsigned(1), "end": unsigned(1),
                "addr": unsigned(addr_w), "used": unsigned(lanes), "maxl": unsigned(lanes)}),
                f"add_ctx{k}"))
        m.d.sync += [
            inflight[0].valid.eq(ai.valid), inflight[0].has_row.eq(ai.has_row),
            inflight[0].end.eq(ai.end), inflight[0].addr.eq(ai.addr),
            inflight[0].used.eq(ai.used), inflight[0].maxl.eq(ai.maxl),
        ]
        for k in range(1, al):
            m.d.sync += inflight[k].eq(inflight[k - 1])
        # every stage of a word's context after the issue, oldest last (stage k + 1 holds on
        # this cycle what stage k held on the last)
        chain = [*ctx_pipe, *inflight]
        wb = chain[-1]
        # the write-back of the next cycle: the adder's second-to-last stage (or, with a
        # one-stage adder, the add-in stage)
        pre_wb = chain[-2]

        def before_ai(n):
            """The context ``n`` stages before the add-in stage."""
            return ctx_pipe[-1 - n]

        def writes(stage, addr):
            return stage.valid & stage.has_row & (stage.addr == addr)
        # Two cycles ahead, in one register each: for the word entering the operand stage in
        # two cycles (``before_ai(3)`` now), its write-back then (``chain[-3]`` now) and the
        # write-back of the cycle after (``chain[-2]``); for the word read then
        # (``before_ai(4)`` now), the write-back of the read's own cycle (the read does not
        # see it).
        e_pre, e_now, e_read = Signal(), Signal(), Signal()
        m.d.sync += [e_pre.eq(writes(chain[-3], before_ai(3).addr)),
                     e_now.eq(writes(chain[-2], before_ai(3).addr)),
                     e_read.eq(writes(chain[-2], before_ai(4).addr))]
        u_next, u_read = before_ai(2).used, before_ai(3).used
        rd_src = before_ai(4)        # the read address of the next cycle

        result_lanes = []
        acc_drs = []                 # the drain's read ports, one per lane
        for i in range(lanes):
            lane_bits = slice(32 * i, 32 * (i + 1))
            acc = memory.Memory(shape=32, depth=depth, init=[], attrs=acc_attrs)
            acc_d = memory.Memory(shape=32, depth=depth, init=[], attrs=acc_attrs)
            m.submodules[f"acc_{i}"] = acc
            m.submodules[f"acc_d_{i}"] = acc_d
            acc_wr, acc_dwr = acc.write_port(), acc_d.write_port()
            acc_rd = acc.read_port()
            acc_dr = acc_d.read_port()
            acc_drs.append(acc_dr)
            lane = m.submodules[f"pool_{i}"] = PoolLane(latency=al, direct_add=True)
            # the lane's copies of the write enable (``pre_wb.valid & pre_wb.has_row``, and
            # the lane used) and addresses, one cycle ahead, as flip-flops
            w_en = Signal(name=f"acc_wen{i}")
            w_addr = Signal(addr_w, name=f"acc_waddr{i}")
            r_addr = Signal(addr_w, name=f"acc_raddr{i}")
            m.d.sync += [
                w_en.eq(pre_wb.valid & pre_wb.has_row & pre_wb.used[i]),
                w_addr.eq(Mux(pre_wb.used[i], pre_wb.addr, 0)),
                r_addr.eq(Mux(rd_src.used[i], rd_src.addr, 0)),
            ]
            result = lane.result
            m.d.comb += [
                acc_wr.addr.eq(w_addr), acc_wr.data.eq(result), acc_wr.en.eq(w_en),
                acc_dwr.addr.eq(w_addr), acc_dwr.data.eq(result), acc_dwr.en.eq(w_en),
                acc_rd.addr.eq(r_addr),
            ]
            # the memory's word, registered (no reset: the flow moves it into the block RAM's
            # output register, ``host.bench.timing.absorb_bram_output_registers``)
            acc_raw = Signal(32, name=f"acc_raw{i}", reset_less=True)
            wb_d1 = Signal(32, name=f"wb_d1_{i}", reset_less=True)   # the write-back 1 cycle ago
            wb_d2 = Signal(32, name=f"wb_d2_{i}", reset_less=True)   # ... and two cycles ago
            # (no reset on the two operand registers: a lane's adder and max selector use
            # them only on a cycle whose word the issue stage sent, which loaded them the
            # cycle before; after a reset, their values are those of the unit's pipelines)
            acc_old = Signal(32, name=f"acc_old{i}", reset_less=True)   # the adder's operand
            acc_max = Signal(32, name=f"acc_max{i}", reset_less=True)   # the max selector's
            # this cycle's write-back, the one of one and two cycles ago, is the operand's word
            hit0, hit1, hit2 = (Signal(name=f"hit0_{i}"), Signal(name=f"hit1_{i}"),
                                Signal(name=f"hit2_{i}"))
            hit2_pre = Signal(name=f"hit2_pre{i}")
            zero = Signal(name=f"zero{i}")   # the adder's operand is zero (a first row)
            m.d.sync += [
                acc_raw.eq(acc_rd.data), wb_d1.eq(result), wb_d2.eq(wb_d1),
                hit0.eq(e_pre & u_next[i]), hit1.eq(e_now & u_next[i]),
                hit2_pre.eq(e_read & u_read[i]), hit2.eq(hit2_pre),
                zero.eq(before_ai(2).firstl[i]),
            ]
            # a bag's first row adds to zero: the register holds it, so the adder's operands
            # come straight from flip-flops (the max selector reads the same word without the
            # zero: a first row takes ``v`` whatever the word; the two registers are apart so
            # that each sits by its consumer)
            word_i = Mux(hit0, result, Mux(hit1, wb_d1, Mux(hit2, wb_d2, acc_raw)))
            m.d.sync += [acc_old.eq(Mux(zero, 0, word_i)), acc_max.eq(word_i)]
            m.d.comb += [lane.old.eq(acc_old), lane.old_max.eq(acc_max),
                         lane.v.eq(ai_x[lane_bits]), lane.v_add.eq(ai_v[i]),
                         lane.first.eq(ai.firstl[i]), lane.is_max.eq(wb.maxl[i])]
            result_lanes.append(result)
        wb_bank = wb.addr[self.word_width:]

        # ---- drain: finished bags to `pooled`, in bag order -------------------------------
        # The drain pipeline runs free too: a beat is read only when the output queue has
        # room for it (a credit counter), so ``pooled.ready`` stops nothing but the queue.
        bhead = data.View(binfo, bag_h.payload)
        pooled = self.pooled
        dword = Signal(self.word_width + 1)
        dword_inc = Signal(self.word_width + 1, init=1)   # dword + 1, as a flip-flop
        has_rows = bhead.has_rows
        # whether ``dword`` is the head bag's last word: a flip-flop, computed a cycle ahead
        # (the next word of the same bag, or word 0 of the entry that follows, ``peek``)
        d_last = Signal()
        bpeek = data.View(binfo, bag_sk.peek_payload)
        dl = self.drain_mul_latency
        odepth = self.out_depth
        credit = Signal(range(odepth + 1))     # beats read and not yet taken from `pooled`
        credit_ok = Signal(init=1)             # credit != odepth, as a flip-flop
        credit_nz = Signal()                   # credit != 0, as a flip-flop (for ``busy``)
        # whether the head bag's words are all written back (or it has none): a flip-flop,
        # computed a cycle ahead like ``d_last`` (with this cycle's write-back; the bank the
        # drain frees is never the next bag's, whose bank is the next one claimed)
        head_ok = Signal()
        wb_end = Signal()
        m.d.comb += wb_end.eq(wb.valid & wb.end)
        bag_ready = bag_h.valid & head_ok
        issue = Signal()
        m.d.comb += [issue.eq(bag_ready & credit_ok),
                     *[r.addr.eq(Cat(dword[:self.word_width], bhead.bank)) for r in acc_drs],
                     bag_h.ready.eq(issue & d_last)]
        with m.If(issue):
            m.d.sync += [dword.eq(Mux(d_last, 0, dword_inc)),
                         dword_inc.eq(Mux(d_last, 1, dword_inc + 1))]
        d_advance = ~bag_h.valid | (issue & d_last)
        m.d.sync += d_last.eq(Mux(d_advance, bpeek.last_word == 0,
                                  Mux(issue, dword_inc == bhead.last_word, d_last)))

        def done_after(bag):
            return ~bag.has_rows | bank_done.bit_select(bag.bank, 1) | (
                wb_end & (wb.addr[self.word_width:] == bag.bank))
        m.d.sync += head_ok.eq(Mux(d_advance, done_after(bpeek), done_after(bhead)))
        freed = issue & d_last & has_rows
        for b in range(nb):
            with m.If(freed & (bhead.bank == b)):
                m.d.sync += [bank_busy[b].eq(0), bank_done[b].eq(0)]
            with m.Elif(wb.valid & wb.end & (wb_bank == b)):
                m.d.sync += bank_done[b].eq(1)

        # MEAN reciprocals: RNE(1/n) for n = 1 .. 2**length_width - 1.
        n = np.arange(1, 2 ** self.length_width, dtype=np.float32)
        recips = [0] + [int(v) for v in (np.float32(1) / n).view(np.uint32)]
        # its address: the head bag's count as a flip-flop, computed a cycle ahead like
        # ``d_last`` (the read from the head's read multiplexer was 8.1 ns, 6.4 of routing).
        # The ROM in four 8-bit shares, each read at its own copy of the address (kept apart
        # by the FPGA flow, ``KEEP_COPY_ATTR``): one address reaching every LUT of the
        # 32-bit ROM was the 2-lane gather's worst path, 8.1 ns, 6.7 of it routing.
        recip_data = []
        for j in range(4):
            rom = memory.Memory(shape=8, depth=len(recips),
                                init=[(r >> (8 * j)) & 0xFF for r in recips])
            m.submodules[f"recip{j}"] = rom
            rd = rom.read_port()
            a = Signal.like(bhead.count, name="recip_addr" if j == 0 else f"recip_addr_copy{j}",
                            attrs={KEEP_COPY_ATTR: "1"} if j else {})
            m.d.sync += a.eq(Mux(d_advance, bpeek.count, bhead.count))
            m.d.comb += rd.addr.eq(a)
            recip_data.append(rd.data)

        dctx_layout = data.StructLayout({
            "valid": unsigned(1), "first": unsigned(1), "last": unsigned(1),
            "tag": unsigned(self.tag_width), "error": unsigned(1),
            "dropped": unsigned(1), "mask": unsigned(lanes),
            # per lane: scaled by the reciprocal (MEAN, lane in the output), as each lane's
            # own flag
            "scalel": unsigned(lanes),
        })
        dctx0 = _context_register(dctx_layout, "dctx0")  # registered with the read
        dctx = _context_register(dctx_layout, "dctx")    # and with the read data's register
        lane_mask = Cat(*[(~d_last | (bhead.tail == 0) | (i < bhead.tail)) for i in range(lanes)])
        m.d.sync += [
            dctx0.valid.eq(issue), dctx0.first.eq(dword == 0), dctx0.last.eq(d_last),
            dctx0.tag.eq(bhead.tag),
            dctx0.error.eq(bhead.error), dctx0.dropped.eq(bhead.dropped),
            dctx0.mask.eq(Mux(has_rows, lane_mask, 0)),
            dctx0.scalel.eq(Mux(bhead.mean & has_rows, lane_mask, 0)),
            dctx.eq(dctx0),
        ]
        d_data = Signal(32 * lanes, reset_less=True)   # (into the block RAM, like acc_raw)
        # The reciprocal reaches each lane's multiplier through a fan-out tree like the
        # weight's (``fanout_stages`` levels of degree 4, each copy gated by whether the first
        # lane it serves is in the output, ``mask``, else 1.0, so that synthesis keeps the
        # copies apart; a lane the drain zeroes multiplies by 1.0). The read data and the
        # context wait beside it.
        m.d.sync += d_data.eq(Cat(*[r.data for r in acc_drs]))
        dctx_pipe, dx_pipe = [dctx], [d_data]
        masks = [dctx0, dctx]        # the context each tree level gates with
        recips, span = [Cat(*recip_data)], lanes
        PD = self.drain_fanout_stages
        for j in range(1, PD + 1):
            nspan = 1 if j == PD else max(1, lanes >> (2 * j))
            copies = []
            for g in range(lanes // nspan):
                r = Signal(32, name=f"d_recip{j}_{g}", reset_less=True)
                m.d.sync += r.eq(Mux(masks[j - 1].mask[g * nspan], recips[g * nspan // span],
                                     _FP32_ONE))
                copies.append(r)
            recips, span = copies, nspan
            if j < PD:
                c = _context_register(dctx_layout, f"drain_fan_ctx{j}")
                x = Signal(32 * lanes, name=f"drain_fan_x{j}", reset_less=True)
                m.d.sync += [c.eq(dctx_pipe[-1]), x.eq(dx_pipe[-1])]
                dctx_pipe.append(c)
                dx_pipe.append(x)
                masks.append(c)
        dmul_x = dx_pipe[-1]
        for k in range(dl):
            c = _context_register(dctx_layout, f"drain_ctx{k}")
            m.d.sync += c.eq(dctx_pipe[-1])
            dctx_pipe.append(c)
            if not self.delay_memory:
                x = Signal(32 * lanes, name=f"drain_x{k}", reset_less=True)
                m.d.sync += x.eq(dx_pipe[-1])
                dx_pipe.append(x)
        dend = dctx_pipe[-1]
        dxend = self._delayed(m, "drain_xd", dmul_x, dl) if self.delay_memory else dx_pipe[-1]
        out_lanes = []
        for i in range(lanes):
            mul = FPMul32(latency=dl, reset_less=True, three_dsps=True,
                         narrow_shift=True)
            m.submodules[f"dmul_{i}"] = mul
            m.d.comb += [mul.a.eq(dmul_x[32 * i:32 * (i + 1)]), mul.b.eq(recips[i])]
            v = Mux(dend.scalel[i], mul.o, dxend[32 * i:32 * (i + 1)])
            out_lanes.append(Mux(dend.mask[i], v, 0))
        pl = self.pooled_layout
        # The output queue: a LUT-RAM queue of ``odepth - 1`` entries read into a
        # :class:`rtl.streams.PingPongBuffer`, so that ``pooled.ready`` reaches only the
        # buffer's pointer and flags, and the beat-wide registers load on enables that are
        # flip-flops (a ``SyncFIFOBuffered``'s output register loads on the consumer's
        # ``ready`` and its level). Same cycles as a ``SyncFIFOBuffered``: a beat written on
        # one cycle is on ``pooled`` two cycles later; the credit bounds what it holds.
        # The queue is a :class:`rtl.streams.CreditLUTFIFO` (``SyncFIFO``'s cycles): the credit
        # keeps the drain from writing it full, so its write enable is the drain's valid
        # alone, and it is read in shares of 16 bits, each at its own copy of the read pointer.
        m.submodules.out_q = out_q = CreditLUTFIFO(width=pl.size, depth=odepth - 1,
                                                   read_copies=max(1, pl.size // 16))
        m.submodules.out_b = out_b = PingPongBuffer(unsigned(pl.size), reset_less=True)
        out_w = data.View(pl, out_q.w_data)
        m.d.comb += [
            out_q.w_en.eq(dend.valid),
            out_w.data.eq(Cat(*out_lanes)), out_w.tag.eq(dend.tag),
            out_w.first.eq(dend.first), out_w.last.eq(dend.last),
            out_w.error.eq(dend.error), out_w.dropped.eq(dend.dropped),
            out_b.i.valid.eq(out_q.r_rdy), out_b.i.payload.eq(out_q.r_data),
            out_q.r_en.eq(out_b.i.ready),
            pooled.valid.eq(out_b.o.valid), pooled.payload.eq(out_b.o.payload),
            out_b.o.ready.eq(pooled.ready),
        ]
        taken = pooled.valid & pooled.ready
        m.d.sync += [
            credit.eq(credit + issue - taken),
            credit_ok.eq(Mux(issue & ~taken, credit != odepth - 1,
                             Mux(taken & ~issue, 1, credit != odepth))),
            credit_nz.eq(Mux(issue & ~taken, 1, Mux(taken & ~issue, credit != 1, credit != 0))),
        ]
        with m.If(taken & pooled.payload.last):
            m.d.comb += inc["bags_out"].eq(1)
        with m.If(pooled.valid & ~pooled.ready):
            m.d.comb += inc["stall_output"].eq(1)

        # ---- busy and input starvation --------------------------------------------------
        # (the reducer's pipeline after the issue is a shift register: whether any of its
        # stages but the first holds a word is whether any but the last held one on the
        # cycle before, kept as a flip-flop; with the credit's ``!= 0`` as a flip-flop, the
        # OR over the unit has about half the terms, from flip-flops spread over the unit)
        red_chain = [*ctx_pipe, *inflight]
        chain_rest = Signal(name="chain_rest_any")   # any of red_chain[1:] holds a word
        m.d.sync += chain_rest.eq(Cat(*[c.valid for c in red_chain[:-1]]).any())
        # The terms in groups of the parts of the unit they come from (the front, the slots
        # and the requests, the reducer, the drain), each group's OR registered on its own:
        # ``busy`` one cycle late, and the two event flags that count it, are ORs of those
        # few flip-flops, not one wide OR over the unit (``stall_input``'s flag from the
        # request slice's valid was the critical path: 8.8 ns, 6.9 of it routing).
        groups = [
            [front_fsm.ongoing("ITEMS"), bags_in.o.valid, p_valid, pe1.valid, pe2.valid],
            [req_out.o.valid, *[q.r_rdy for q in slots], *[h.valid for h in heads]],
            [resp_in.o.valid, info_in.o.valid, info_q.r_rdy, info_h.valid,
             red_chain[0].valid, chain_rest],
            [bag_q.r_rdy, bag_h.valid, credit_nz],
        ]
        # (``busy``, a bag in the unit or at its input, is ``bags.valid`` or any group's OR)
        # per group: its OR one cycle late; and whether the input offered a bag
        group_q = [Signal(name=f"busy_part{k}_q") for k in range(len(groups))]
        in_q = Signal(name="busy_in_q")
        for g, q in zip(groups, group_q):
            m.d.sync += q.eq(Cat(*g).any())
        m.d.sync += in_q.eq(self.bags.valid)
        busy_late = Cat(in_q, *group_q).any()              # ``busy`` one cycle late
        # The counters of ``busy_cycles`` and ``stall_input`` add these (``inc_q`` is the
        # same flag one cycle late for every other counter); ``stall_input`` is ``busy``
        # without a bag offered, so its flag is the groups' OR where none was.
        busy_inc = Signal(name="inc_busy_cycles_q2")
        starve_inc = Signal(name="inc_stall_input_q2")
        m.d.comb += [busy_inc.eq(busy_late), starve_inc.eq(~in_q & Cat(*group_q).any()),
                     inc_q["busy_cycles"].eq(busy_inc), inc_q["stall_input"].eq(starve_inc)]
        # The output: ``busy`` (or an event waiting to be counted) one cycle late, or a bag
        # offered at the input. Low on a cycle, it says that the unit was idle with every
        # event counted on the cycle before, and nothing arrived since: the counters are
        # complete. (the other events' flags, one cycle late, in one register)
        others_q = Signal(name="busy_events_q")
        others = [n for n in COUNTER_NAMES if n not in ("busy_cycles", "stall_input")]
        m.d.sync += others_q.eq(Cat(*[inc_q[n] for n in others]).any())
        busy_late_q = Signal(name="busy_late_q")           # ... two cycles late
        m.d.sync += busy_late_q.eq(busy_late)
        m.d.comb += self.busy.eq(busy_late | busy_late_q | others_q | self.bags.valid)
        return m
