"""Timing model of the embedding gather/pool unit (``rtl.embedding.EmbeddingBagUnit``).

Predicts the cycles a batch of bags takes, from the cycle its first input item is offered to
the cycle its last pooled beat is taken, without simulating the datapath. It walks the
batch once, row by row (an event-level recurrence, a few microseconds per row), and follows
the unit's structure:

* Front: one input item per cycle (a header is one item); a contributing index waits while
  ``outstanding`` rows are in flight or the row queue is full; a bag's last item waits for
  room in the bag queue.
* Memory: a row read issued one cycle after its index is accepted returns its first beat
  ``latency`` cycles later, and not before the previous row has been consumed (responses are
  in order), then one beat per cycle.
* Reducer: one word (``lanes`` elements) per cycle; a row of ``W`` words costs
  ``max(W, add_latency + 1)`` cycles after the first row of its bag (the read-after-write
  hazard on the accumulator), an end-only entry (a bag whose last index did not contribute,
  or an empty bag) one cycle; the first row of a bag waits until the accumulator bank it
  reuses has been drained.
* Drain: ``ceil(dim / lanes)`` beats per bag, one per cycle, after the bag's last word left
  the adder; the output is assumed always ready.

Memory latency is one number (a mean, for a random latency) or one number per row (a sequence,
in issue order: e.g. a cache in front of the unit answers hits quickly and misses late, and
misses that cluster wait for each other; ``sim.cosim`` feeds it the cache's per-request
delays). Other stalls on the streams (idle input, backpressure) are not modelled.
"""

from __future__ import annotations

from collections.abc import Sequence
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


def steady_state_row_cycles(t: UnitTiming, dim: int) -> int:
    """Reducer cycles per row inside a bag once memory latency is hidden."""
    return max(_words(t, dim), t.add_latency + 1)


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
    issue: list[int] = []
    lr = t.reduce_latency           # take -> adder input
    la = t.add_latency
    n_out = t.outstanding
    q = t.bag_queue_depth

    cycle = 0.0                      # next cycle the front may accept an item
    take_last_row: list[float] = []  # per row: cycle its last word was taken
    entry_pop: list[float] = []      # per row-queue entry: cycle it left the queue
    fire_free = -1.0                 # adder input: last cycle used
    prev_row_take = -1.0             # reducer: last take cycle of the previous row
    last_fire_row = None             # fire cycle of the previous row's first word, same bag
    drain_end: list[float] = []      # per bag: cycle of its last drain read
    bag_with_rows: list[int] = []    # indices of bags that used an accumulator bank
    drain_free = -1.0
    out_last = 0.0
    beats = rows = 0

    def queue_room(k: int) -> float:
        # Row queue of info_depth entries: entry k waits for entry k - depth to leave.
        j = k - t.info_depth
        return entry_pop[j] + 1 if j >= 0 else 0.0

    for b, shape in enumerate(shapes):
        words = _words(t, shape.dim)
        stride = _stride(t, shape.dim, shape.elem_type)
        n = len(shape.contributes)
        bagq_room = drain_end[b - q] + 1 if b >= q else 0.0
        bank_ready = 0.0
        if sum(shape.contributes):
            if len(bag_with_rows) >= 2:
                bank_ready = drain_end[bag_with_rows[-2]] + 1
        # Header.
        header = cycle
        if n == 0:
            header = max(header, queue_room(len(entry_pop)), bagq_room)
        cycle = header + 1
        last_write = None
        first = True
        if n == 0:
            ready = header + 2
            fire = max(fire_free + 1, ready + lr)
            fire_free = fire
            entry_pop.append(fire - lr)
            last_write = fire
            last_item = header
        for i, contributes in enumerate(shape.contributes):
            is_last = i == n - 1
            accept = cycle
            if contributes or is_last:
                accept = max(accept, queue_room(len(entry_pop)))
            if contributes and len(take_last_row) >= n_out:
                accept = max(accept, take_last_row[-n_out] + 1)
            if is_last:
                accept = max(accept, bagq_room)
            cycle = accept + 1
            if contributes:
                row_lat = lats[rows] if lats is not None else lat
                issue.append(int(round(accept + 1)))
                arrival = max(accept + 1 + row_lat, prev_row_take + 1)
                fire = max(fire_free + 1, arrival + lr)
                if first:
                    fire = max(fire, bank_ready)
                elif last_fire_row is not None:
                    fire = max(fire, last_fire_row + la + 1)
                last_fire_row = fire
                fire_free = fire + words - 1
                prev_row_take = fire_free - lr
                take_last_row.append(prev_row_take)
                entry_pop.append(prev_row_take)
                last_write = fire_free
                rows += 1
                beats += stride
                first = False
            elif is_last:
                fire = max(fire_free + 1, accept + 2 + lr)
                fire_free = fire
                entry_pop.append(fire - lr)
                last_write = fire
            if is_last:
                last_item = accept
        last_fire_row = None
        done = last_write + la + 1
        out_words = words
        d_start = max(done, drain_free + 1, last_item + 2)
        d_end = d_start + out_words - 1
        drain_free = d_end
        drain_end.append(d_end)
        if sum(shape.contributes):
            bag_with_rows.append(b)
        out_last = d_end + t.drain_latency
    total = int(round(out_last)) + 1 if shapes else 0
    return Prediction(total, beats, rows, len(shapes), tuple(issue),
                      int(round(prev_row_take)) if rows else -1)
