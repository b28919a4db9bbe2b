"""Timing model of the embedding gather/pool unit (``rtl.embedding.EmbeddingBagUnit``).

Predicts the cycles a batch of bags takes, from the cycle its first input item is offered to
the cycle its last pooled beat is taken, without simulating the datapath. It steps the unit's
control once per cycle (parse and arbiter) and places each row's reducer and drain cycles by
event (a few microseconds per cycle of the batch), following the unit's structure:

* Parse: one input item per cycle, ``input_latency`` cycles after it is offered (the input
  skid buffer and the pre-decode register); an index waits for room in its bag's slot
  queue, a bag's last item for room in the bag queue.
* Arbiter: one entry per cycle, round robin over the slots whose head is readable
  (``parse_to_issue`` cycles after its parse), bags' first rows in bag order; a row waits
  while ``outstanding`` rows are in flight or the row queue is full, and a row of the slot
  served last while ``pace_rows`` rows were in flight on the cycle before.
* Memory: a row's read reaches the memory one cycle after its issue and its first beat comes
  back ``latency`` cycles later (plus the response skid buffer), and not before the previous
  row has been consumed (responses are in order), then one beat per cycle.
* Reducer: one word (``lanes`` elements) per cycle in issue order; a row of a bag starts at
  least ``hazard_distance`` cycles after the previous row of the same bag (the read-add-write
  hazard), a bag's first row once its accumulator bank (``banks``, claimed in bag order) was
  freed by the drain of the bag that held it (``bank_free_latency`` cycles after its last
  drain read); an end-only entry costs one cycle.
* Drain: in bag order, ``ceil(dim / lanes)`` beats per bag, one per cycle, ``done_latency``
  cycles after the bag's last word was taken; the output is assumed always ready.

Memory latency is one number (a mean, for a random latency) or one number per row (a sequence,
in issue order: e.g. a cache in front of the unit answers hits quickly and misses late, and
misses that cluster wait for each other; ``sim.cosim`` feeds it the cache's per-request
delays). Other stalls on the streams (idle input, backpressure) are not modelled.
"""

from __future__ import annotations

from collections.abc import Sequence
from bisect import bisect_left, bisect_right
from collections import deque
from dataclasses import dataclass

from neonic.rtl.embedding import UnitTiming

__all__ = ["BagShape", "Prediction", "predict", "shapes_from_bags", "steady_state_row_cycles"]

_ELEM_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


@dataclass(frozen=True)
class BagShape:
    """What timing needs of a bag: its table's ``dim`` and element type, and which of its
    indices contribute a row (not padding, in range)."""

    dim: int
    elem_type: str
    contributes: tuple[bool, ...]


@dataclass(frozen=True)
class Prediction:
    """The model's figures for one batch."""

    cycles: int
    beats: int
    rows: int
    bags: int
    #: per row, in issue order: the cycle its memory read was issued (relative to the first
    #: item offered), for a memory model that answers each request by its issue time
    issue: tuple[int, ...] = ()
    #: the cycle the last row's last memory beat was taken (-1: no row read)
    last_take: int = -1

    @property
    def mem_beat_utilization(self) -> float:
        return self.beats / self.cycles if self.cycles else 0.0


def shapes_from_bags(tables, bags) -> list[BagShape]:
    """:class:`BagShape` list from ``sim.reference.embedding`` tables and bags."""
    from neonic.sim.reference.embedding import contributing
    return [BagShape(tables[b.table].dim, tables[b.table].elem_type,
                     tuple(bool(x) for x in contributing(tables[b.table], b))) for b in bags]


def _words(t: UnitTiming, dim: int) -> int:
    return -(-dim // t.lanes)


def _stride(t: UnitTiming, dim: int, elem_type: str) -> int:
    return -(-dim * _ELEM_BYTES[elem_type] // t.data_bytes)


def steady_state_row_cycles(t: UnitTiming, dim: int) -> float:
    """Reducer cycles per row once memory latency is hidden and ``interleave`` bags of this
    ``dim`` have rows queued: the arbiter alternates their rows, so ``interleave`` rows share
    one read-add-write distance of ``hazard_distance`` cycles."""
    return max(_words(t, dim), t.hazard_distance / t.interleave)


@dataclass
class _Bag:
    words_out: int
    has_rows: bool
    parse_last: float = -1.0         # cycle its last item was parsed
    entries_left: int = 0            # queue entries (rows and end marker) not yet issued
    last_take: float = -1.0          # take of its last word or end marker
    last_start: float | None = None  # take of its previous row's first word (the hazard)
    drain_end: float | None = None


def predict(t: UnitTiming, shapes: Sequence[BagShape], *,
            latency: float | Sequence[float]) -> Prediction:
    """Cycles for the batch ``shapes`` on a unit with figures ``t`` and memory ``latency``:
    one number for every row, or one per contributing row in issue order."""
    n_rows = sum(sum(s.contributes) for s in shapes)
    if isinstance(latency, (int, float)):
        if not latency >= 1:
            raise ValueError(f"latency: expected >= 1 cycle, got {latency}")
        lats = None
        lat = float(latency)
    else:
        lats = [float(x) for x in latency]
        if len(lats) != n_rows:
            raise ValueError(f"latency: expected one latency per contributing row ({n_rows}), "
                             f"got {len(lats)}")
        bad = next((x for x in lats if not x >= 1), None)
        if bad is not None:
            raise ValueError(f"latency: expected >= 1 cycle for every row, got {bad}")
        lat = 0.0
    if not shapes:
        return Prediction(0, 0, 0, 0)

    K, nb, depth = t.interleave, t.banks, t.slot_depth
    ql = t.queue_latency
    # The input items in order: (bag, kind) with kind -1 a header, else the index position.
    items = []
    for b, s in enumerate(shapes):
        items.append((b, -1))
        items.extend((b, i) for i in range(len(s.contributes)))
    bags = []
    for s in shapes:
        has_rows = any(s.contributes)
        bags.append(_Bag(words_out=_words(t, s.dim), has_rows=has_rows,
                         entries_left=sum(s.contributes) + (has_rows and not s.contributes[-1])))

    slots: list[deque] = [deque() for _ in range(K)]   # (readable cycle, bag, is_row, first)
    pushes: list[list[float]] = [[] for _ in range(K)]  # parse cycles of each slot's entries
    pops: list[list[float]] = [[] for _ in range(K)]    # issue cycles of each slot's entries
    bank_free = [0.0] * nb           # cycle a bank can be claimed again (inf: not known yet)
    bank_of: list[int] = [-1] * len(shapes)
    next_bank = 0
    inf = float("inf")

    issue: list[int] = []
    take_end_rows: list[float] = []  # per row: take of its last word
    entry_end: list[float] = []      # per queue entry issued: take of its last word
    prev_end = -1.0                  # reducer: last take
    prev_beat = -1.0                 # reducer: last take of a memory beat's row
    beats = rows = 0
    drain_next = 0
    drain_free = -1.0
    out_last = 0.0

    def settle_drains():
        nonlocal drain_next, drain_free, out_last
        while drain_next < len(bags):
            g = bags[drain_next]
            if g.parse_last < 0 or g.entries_left:
                return
            start = max(g.parse_last + ql, drain_free + 1)
            if g.has_rows:
                start = max(start, g.last_take + t.done_latency)
            g.drain_end = start + g.words_out - 1
            drain_free = g.drain_end
            out_last = g.drain_end + t.drain_latency
            if g.has_rows:
                bank_free[bank_of[drain_next]] = g.drain_end + t.bank_free_latency
            drain_next += 1

    j = 0                            # next item to parse
    last_parse = -1.0
    count = 0                        # contributing rows so far in the current bag
    rr = 0
    start_slot = 0                   # slot of the next bag whose first row may go
    cycle = 0
    total_entries = sum(g.entries_left for g in bags)
    issued = 0
    while j < len(items) or issued < total_entries:
        # -- arbiter: one entry per cycle, round robin over the slots with a readable head
        pick = -1
        # pacing: the slot served last gives no row while pace_rows rows or more were in
        # flight on the cycle before (a row whose last word is taken on the cycle before
        # still counts: the unit's grant is computed a cycle ahead, without that handshake)
        paced = -1
        if t.pace_rows and len(issue) - bisect_left(take_end_rows, cycle - 1) >= t.pace_rows:
            paced = (rr - 1) % K
        for off in range(K):
            s = (rr + off) % K
            if slots[s] and slots[s][0][0] <= cycle and (not slots[s][0][3] or s == start_slot) \
                    and not (s == paced and slots[s][0][2]):
                pick = s
                break
        if pick >= 0:
            _, b, is_row, first = slots[pick][0]
            g = bags[b]
            ok = len(entry_end) < t.info_depth or entry_end[-t.info_depth] + 1 <= cycle
            if is_row and len(take_end_rows) >= t.outstanding:
                ok = ok and take_end_rows[-t.outstanding] + 1 <= cycle
            if ok:
                slots[pick].popleft()
                pops[pick].append(cycle)
                rr = (pick + 1) % K
                if first and is_row:
                    start_slot = (start_slot + 1) % K
                issued += 1
                g.entries_left -= 1
                avail = cycle + t.info_latency
                if is_row:
                    shape = shapes[b]
                    row_lat = lats[rows] if lats is not None else lat
                    issue.append(cycle + 1)
                    arrival = max(cycle + 1 + row_lat + t.resp_latency, prev_beat + 1)
                    start = max(prev_end + 1, avail, arrival)
                    if first:                     # claims its bank
                        start = max(start, bank_free[bank_of[b]])
                        bank_free[bank_of[b]] = inf
                    elif g.last_start is not None:
                        start = max(start, g.last_start + t.hazard_distance)
                    g.last_start = start
                    end = start + _words(t, shape.dim) - 1
                    prev_beat = end
                    take_end_rows.append(end)
                    rows += 1
                    beats += _stride(t, shape.dim, shape.elem_type)
                else:
                    end = start = max(prev_end + 1, avail)
                prev_end = end
                entry_end.append(end)
                g.last_take = end
                if not g.entries_left:
                    settle_drains()
        # -- parse: one input item per cycle, ``input_latency`` cycles after it is offered
        if j < len(items) and cycle >= j + t.input_latency and cycle > last_parse:
            b, i = items[j]
            shape = shapes[b]
            g = bags[b]
            ok = True
            if i < 0:
                count = 0
                if not shape.contributes:                # empty bag: needs the bag queue
                    ok = b < t.bag_queue_depth or (
                        bags[b - t.bag_queue_depth].drain_end is not None
                        and bags[b - t.bag_queue_depth].drain_end + 1 <= cycle)
            else:
                contributes = shape.contributes[i]
                last = i == len(shape.contributes) - 1
                marker = last and not contributes and count > 0
                claim = contributes and count == 0
                # Every index waits for room in its bag's slot (the bank it has or will
                # claim), and, while its bag has no bank, for the next bank to be free.
                s = (next_bank if count == 0 else bank_of[b]) % K
                # room: the level one cycle earlier (entries written by cycle-2, i.e. parsed
                # by cycle-4, minus entries read by cycle-2) at most depth - 4
                level = bisect_right(pushes[s], cycle - 4) - bisect_right(pops[s], cycle - 2)
                ok = level <= depth - 4
                if last and b >= t.bag_queue_depth:
                    prev = bags[b - t.bag_queue_depth].drain_end
                    ok = ok and prev is not None and prev + 1 <= cycle
                if ok:
                    if claim:
                        bank_of[b] = next_bank
                        next_bank = (next_bank + 1) % nb
                    if contributes or marker:
                        s = bank_of[b] % K
                        slots[s].append((cycle + t.parse_to_issue, b, contributes, count == 0))
                        pushes[s].append(cycle)
                    if contributes:
                        count += 1
            if ok:
                if i < 0 and not shape.contributes:
                    g.parse_last = cycle
                elif i == len(shape.contributes) - 1:
                    g.parse_last = cycle
                last_parse = cycle
                j += 1
                if g.parse_last >= 0 and not g.entries_left:
                    settle_drains()
        cycle += 1
        if cycle > 10_000_000:
            raise RuntimeError("timing model did not converge (a bug in the model)")
    settle_drains()
    total = int(round(out_last)) + 1
    return Prediction(total, beats, rows, len(shapes), tuple(issue),
                      int(round(prev_beat)) if rows else -1)
