"""The embedding gather/pool unit as the command line sees it (``neonic rtl export|sim embedding``).

Besides the ``UNIT`` entry this module holds what every driver of the unit shares: building
an instance from ``--param`` strings, a random workload generator, the expected output
beats (from the numpy reference), the scoreboard, and a run in Amaranth's simulator. The
cocotb bench (``tests/cocotb/tb_embedding.py``) and the benchmark use the same pieces.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from host.units import SimRequest, UnitEntry
from rtl.embedding import COUNTER_NAMES, EmbeddingBagUnit
from sim.reference import embedding as ref
from sim.timing import embedding as timing

__all__ = [
    "UNIT", "DEFAULT_PARAMS", "build", "Workload", "random_workload", "benchmark_workload",
    "expected_beats", "Scoreboard", "RunResult", "run_amaranth_episodes", "run_amaranth_workload", "run_cocotb_workload",
    "simulate",
]

DEFAULT_PARAMS: dict[str, Any] = {
    "data_bytes": 64, "lanes": 16, "max_dim": 256, "tables": 8, "outstanding": 32,
    "max_bag_length": 1023, "elem_types": ("fp32", "fp16", "bf16"), "addr_width": 32,
    "beats_width": 8, "index_width": 32, "tag_width": 16, "bag_queue_depth": 8,
}
_INT_PARAMS = {k for k, v in DEFAULT_PARAMS.items() if isinstance(v, int)}


def parse_params(params: dict[str, str]) -> dict[str, Any]:
    """``--param`` strings to constructor arguments (``elem_types=fp32+fp16``)."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key in _INT_PARAMS:
            try:
                out[key] = int(value, 0)
            except ValueError:
                raise ValueError(f"{key}: expected an integer, got {value!r}") from None
        elif key == "elem_types":
            out[key] = tuple(v for v in value.replace(",", "+").split("+") if v)
        else:
            raise ValueError(f"--param {key}: unknown parameter; expected one of "
                             f"{', '.join(sorted(DEFAULT_PARAMS))}")
    return out


def build(params: dict[str, str]) -> EmbeddingBagUnit:
    """An :class:`EmbeddingBagUnit` from ``--param`` strings (defaults for the rest)."""
    return EmbeddingBagUnit(**parse_params(params))


# -- workloads ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Beat:
    """One pooled beat as the scoreboard sees it."""

    tag: int
    first: int
    last: int
    error: int
    dropped: int
    data: tuple[int, ...]          # lanes of FP32 bit patterns


@dataclass
class Workload:
    """Tables, bags and the memory behaviour a run uses."""

    tables: list[ref.Table]
    bags: list[ref.Bag]
    latency: tuple[int, int] = (8, 8)
    mem_outstanding: int = 64
    resp_stall: float = 0.0
    idle: float = 0.0
    backpressure: float = 0.0
    # Raw stimulus for protocol tests: replaces the generated descriptor writes / input items /
    # expected beats when given.
    descs: Callable[[ref.Placement], list[dict]] | list[dict] | None = None
    items: list[dict] | None = None
    expected: list[Beat] | None = None

    def placement(self, data_bytes: int) -> ref.Placement:
        return ref.place_tables(self.tables, data_bytes, base=1)


def random_workload(rng: np.random.Generator, unit: EmbeddingBagUnit, *, num_bags: int = 12,
                    max_len: int = 6, stress: bool = True,
                    elem_types: tuple[str, ...] | None = None) -> Workload:
    """A random mix of tables (every element type and pooling mode the unit supports, dims
    that are and are not multiples of the lanes, padding indices) and bags (empty ones,
    padding and out-of-range indices, per-sample weights), with random memory latency and,
    when ``stress``, random idle cycles and backpressure on every stream."""
    types = elem_types or unit.elem_types
    n_tables = int(rng.integers(1, min(unit.tables, 4) + 1))
    tables = []
    for _ in range(n_tables):
        dim = int(rng.choice([1, unit.lanes, unit.lanes + 1, unit.max_dim,
                              int(rng.integers(1, unit.max_dim + 1))]))
        dim = min(dim, unit.max_dim)
        rows = int(rng.integers(2, 24))
        pad = int(rng.integers(0, rows)) if rng.random() < 0.4 else None
        tables.append(ref.random_table(rng, rows, dim, str(rng.choice(types)),
                                       str(rng.choice(ref.POOLING)), pad))
    bags = []
    for b in range(num_bags):
        t = int(rng.integers(0, n_tables))
        table = tables[t]
        n = 0 if rng.random() < 0.15 else int(rng.integers(1, max_len + 1))
        idx = rng.integers(0, table.num_rows, size=n)
        if n and rng.random() < 0.3 and table.padding_idx is not None:
            idx[rng.integers(0, n)] = table.padding_idx
        if n and rng.random() < 0.15:
            idx[rng.integers(0, n)] = table.num_rows + int(rng.integers(0, 5))
        weights = None
        if rng.random() < 0.35:
            weights = rng.standard_normal(n).astype(np.float32)
        bags.append(ref.Bag(t, idx, weights, tag=b % (1 << unit.tag_width)))
    if stress:
        lo = int(rng.integers(1, 20))
        return Workload(tables, bags, latency=(lo, lo + int(rng.integers(0, 30))),
                        mem_outstanding=int(rng.integers(2, 40)),
                        resp_stall=float(rng.choice([0.0, 0.2])), idle=0.2,
                        backpressure=0.3)
    return Workload(tables, bags)


def benchmark_workload(rng: np.random.Generator, *, num_bags: int, tables: int = 4,
                       rows: int = 1000, dim: int = 128, length: int = 20,
                       alpha: float = 1.15, elem_type: str = "fp32",
                       empty_every: int = 0, latency: tuple[int, int] = (40, 60),
                       pooling: str = "sum") -> Workload:
    """FBGEMM's TBE benchmark shape (D=128, L=20, Zipf 1.15), scaled down: fixed-length
    bags spread over ``tables`` tables, optionally an empty bag after every
    ``empty_every`` bags (never after the last one), no stalls on the streams."""
    tbls = [ref.random_table(rng, rows, dim, elem_type, pooling) for _ in range(tables)]
    bags, tag = [], 0
    for b in range(num_bags):
        t = b % tables
        bags.append(ref.Bag(t, ref.zipf_indices(rng, alpha, rows, length), tag=tag & 0xFFFF))
        tag += 1
        if empty_every and (b + 1) % empty_every == 0 and b + 1 < num_bags:
            bags.append(ref.Bag(t, np.zeros(0, dtype=np.int64), tag=tag & 0xFFFF))
            tag += 1
    return Workload(tbls, bags, latency=latency, mem_outstanding=256)


# -- expected output and the scoreboard -------------------------------------------------------


def expected_beats(unit: EmbeddingBagUnit, tables: list[ref.Table],
                   bags: list[ref.Bag]) -> list[Beat]:
    """What ``pooled`` must carry for these bags, from the numpy reference."""
    pooled = ref.pool(tables, bags)
    beats = []
    lanes = unit.lanes
    for bag, vec in zip(bags, pooled):
        table = tables[bag.table]
        keep_all = (bag.indices >= 0) & (bag.indices < table.num_rows)
        dropped = int(not keep_all.all()) if len(bag.indices) else 0
        words = -(-table.dim // lanes)
        padded = np.zeros(words * lanes, dtype=np.float32)
        padded[:table.dim] = vec
        bits = padded.view(np.uint32).reshape(words, lanes)
        for w in range(words):
            beats.append(Beat(bag.tag, int(w == 0), int(w == words - 1), 0, dropped,
                              tuple(int(x) for x in bits[w])))
    return beats


def decode_beat(unit: EmbeddingBagUnit, payload) -> Beat:
    """A ``pooled`` payload (``data.Const`` or int) as a :class:`Beat`."""
    if isinstance(payload, int):
        payload = unit.pooled_layout.from_bits(payload)
    raw = int(payload.data)
    lanes = tuple((raw >> (32 * i)) & 0xFFFFFFFF for i in range(unit.lanes))
    return Beat(int(payload.tag), int(payload.first), int(payload.last), int(payload.error),
                int(payload.dropped), lanes)


def _same_bits(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    def nan(x):
        return (x & 0x7F800000) == 0x7F800000 and (x & 0x7FFFFF) != 0
    return all(x == y or (nan(x) and nan(y)) for x, y in zip(a, b)) and len(a) == len(b)


@dataclass
class Scoreboard:
    """Checks received beats against the expected ones, in order: a lost, duplicated or
    reordered bag, a wrong flag or a single differing bit is reported with its position."""

    expected: list[Beat]
    received: list[Beat] = field(default_factory=list)

    def add(self, beat: Beat) -> None:
        self.received.append(beat)

    def mismatches(self) -> list[str]:
        errors = []
        if len(self.received) != len(self.expected):
            errors.append(f"expected {len(self.expected)} beats, received {len(self.received)}")
        for i, (got, want) in enumerate(zip(self.received, self.expected)):
            if (got.tag, got.first, got.last, got.error, got.dropped) != \
                    (want.tag, want.first, want.last, want.error, want.dropped):
                errors.append(f"beat {i}: got tag={got.tag} first={got.first} last={got.last} "
                              f"error={got.error} dropped={got.dropped}, expected "
                              f"tag={want.tag} first={want.first} last={want.last} "
                              f"error={want.error} dropped={want.dropped}")
            elif not _same_bits(got.data, want.data):
                diff = [k for k, (x, y) in enumerate(zip(got.data, want.data)) if x != y]
                errors.append(f"beat {i} (tag {want.tag}): lanes {diff} differ: got "
                              f"{[hex(got.data[k]) for k in diff]}, expected "
                              f"{[hex(want.data[k]) for k in diff]}")
            if len(errors) > 8:
                break
        return errors

    def check(self) -> None:
        errors = self.mismatches()
        if errors:
            raise AssertionError("pooled output mismatch:\n  " + "\n  ".join(errors))


# -- a run in Amaranth's simulator ---------------------------------------------------------------


@dataclass
class RunResult:
    """What one episode (one workload) of a run measured.

    ``cycles`` runs from the cycle the first bag item is offered to the cycle the last pooled
    beat is taken, both included (what :func:`sim.timing.embedding.predict` predicts);
    ``counters`` are the unit's counter increments during the episode.
    """

    cycles: int
    beats: list[Beat]
    counters: dict[str, int]
    mem_stats: dict[str, int]
    wall_s: float
    sim_cycles: int = 0              # simulated cycles of the whole run


def _deadline(unit: EmbeddingBagUnit, wl: Workload) -> int:
    rows = sum(len(b.indices) for b in wl.bags)
    beats = sum(ref.row_stride_beats(wl.tables[b.table].dim, wl.tables[b.table].elem_type,
                                     unit.data_bytes) * len(b.indices) for b in wl.bags)
    words = sum(-(-wl.tables[b.table].dim // unit.lanes) for b in wl.bags)
    cycles = 500 + 2 * len(wl.bags) + 8 * rows + 4 * beats + 2 * words \
        + wl.latency[1] * (rows // unit.outstanding + 2)
    stall = 1.0 / (1.0 - max(wl.idle, wl.backpressure, wl.resp_stall))
    return int(cycles * stall * 3)


def run_amaranth_episodes(unit: EmbeddingBagUnit, workloads: list[Workload], *,
                          rng: np.random.Generator, vcd: str | Path | None = None,
                          check: bool = True) -> list[RunResult]:
    """Run the workloads one after the other on one simulated unit (one elaboration): each
    writes its descriptors, sends its bags and collects its pooled beats; the next starts once
    the unit is idle. With ``check``, every episode is scoreboarded against the reference and
    the memory must end idle."""
    from sim.harness import AmaranthMemory, run_amaranth, stream_recv, stream_send

    # One memory image holding every episode's tables.
    placements, parts, at = [], [np.zeros(unit.data_bytes, dtype=np.uint8)], 1
    for wl in workloads:
        p = ref.place_tables(wl.tables, unit.data_bytes, base=at)
        placements.append(p)
        parts.append(p.contents[at * unit.data_bytes:])
        at = len(p.contents) // unit.data_bytes
    contents = np.concatenate(parts)
    first = workloads[0]
    mem = AmaranthMemory(unit.mem, contents, data_bytes=unit.data_bytes, rng=rng,
                         latency=first.latency, max_outstanding=first.mem_outstanding,
                         resp_stall=first.resp_stall)
    expected = [wl.expected if wl.expected is not None
                else expected_beats(unit, wl.tables, wl.bags) for wl in workloads]
    state = {"cycle": 0, "started": -1, "done": 0, "t0": [], "t1": [], "counters": [],
             "got": [[] for _ in workloads]}

    async def clock(ctx):
        async for _ in ctx.tick():
            state["cycle"] += 1

    async def send(ctx):
        for k, wl in enumerate(workloads):
            while state["done"] < k:
                await ctx.tick()
            mem.core.latency = wl.latency
            mem.core.max_outstanding = wl.mem_outstanding
            mem.core.resp_stall = wl.resp_stall
            if callable(wl.descs):
                descs = wl.descs(placements[k])
            elif wl.descs is not None:
                descs = wl.descs
            else:
                descs = ref.descriptor_payloads(wl.tables, placements[k])
            await stream_send(ctx, unit.desc, descs)
            state["t0"].append(state["cycle"])
            state["started"] = k
            items = wl.items if wl.items is not None \
                else ref.bag_items(wl.bags, unit.index_width)
            await stream_send(ctx, unit.bags, items, rng=rng, idle=wl.idle)

    async def recv(ctx):
        for k, wl in enumerate(workloads):
            while state["started"] < k:
                await ctx.tick()
            state["got"][k] = await stream_recv(ctx, unit.pooled, len(expected[k]), rng=rng,
                                                backpressure=wl.backpressure)
            state["t1"].append(state["cycle"])
            while ctx.get(unit.busy):
                await ctx.tick()
            c = ctx.get(unit.counters)
            state["counters"].append({name: int(getattr(c, name)) for name in COUNTER_NAMES})
            state["done"] = k + 1

    t0 = time.perf_counter()
    total = run_amaranth(unit, [send, recv], processes=[mem.process, clock], vcd=vcd,
                         max_cycles=sum(_deadline(unit, wl) for wl in workloads))
    wall = time.perf_counter() - t0
    results, prev = [], {name: 0 for name in COUNTER_NAMES}
    for k, wl in enumerate(workloads):
        beats = [decode_beat(unit, p) for p in state["got"][k]]
        if check:
            Scoreboard(expected[k], beats).check()
        cnt = state["counters"][k]
        results.append(RunResult(state["t1"][k] - state["t0"][k], beats,
                                 {n: cnt[n] - prev[n] for n in COUNTER_NAMES},
                                 mem.stats.as_dict(), wall, total))
        prev = cnt
    if check:
        mem.check_idle()
    return results


def run_amaranth_workload(unit: EmbeddingBagUnit, wl: Workload, *, rng: np.random.Generator,
                          vcd: str | Path | None = None, check: bool = True) -> RunResult:
    """One workload on a fresh simulated unit (see :func:`run_amaranth_episodes`)."""
    return run_amaranth_episodes(unit, [wl], rng=rng, vcd=vcd, check=check)[0]


def run_cocotb_workload(*args, **kwargs):  # pragma: no cover - defined below once cocotb lands
    raise NotImplementedError


# -- neonic rtl sim embedding -------------------------------------------------------------------


def simulate(req: SimRequest) -> dict:
    """Run the default workload on ``req.sim``; write ``figures.json`` (and a VCD) into
    ``req.out``; return the figures."""
    raise NotImplementedError


UNIT = UnitEntry(
    name="embedding",
    summary="table-batched EmbeddingBag gather/pool unit (SUM/MEAN/MAX, fp32/fp16/bf16)",
    build=build,
    simulate=simulate,
)
