"""The embedding gather/pool unit as the command line sees it (``neonic rtl export|sim embedding``).

Besides the ``UNIT`` entry this module holds what every driver of the unit shares: building
an instance from ``--param`` strings, a random workload generator, the expected output
beats (from the numpy reference), the scoreboard, and a run in Amaranth's simulator. The
cocotb bench (``sim/cocotb/tb_embedding.py``) and the benchmark use the same pieces.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from neonic.sim.units import SimRequest
from neonic.rtl.embedding import COUNTER_NAMES, EmbeddingBagUnit
from neonic.sim.reference import embedding as ref
from neonic.sim.timing import embedding as timing

__all__ = [
    "DEFAULT_PARAMS", "build", "Workload", "random_workload", "benchmark_workload",
    "expected_beats", "Scoreboard", "SMALL_UNIT_NAME", "RunResult", "run_amaranth_episodes", "run_amaranth_workload",
    "run_cocotb_workload", "workloads_from_spec", "SMALL_UNIT", "SIM_WORKLOAD",
    "simulate",
]

DEFAULT_PARAMS: dict[str, Any] = {
    "data_bytes": 64, "lanes": 16, "max_dim": 256, "tables": 8, "outstanding": 32,
    "max_bag_length": 1023, "elem_types": ("fp32", "fp16", "bf16"), "addr_width": 32,
    "beats_width": 8, "index_width": 32, "tag_width": 16, "bag_queue_depth": 32,
    "add_latency": 9, "mul_latency": 11, "interleave": 4, "slot_depth": 32,
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


def unit_for_layouts(**params: Any) -> EmbeddingBagUnit:
    """An instance used only for its layouts and figures (a bench on the exported Verilog, a
    timing prediction): not elaborated, so Amaranth's unused-elaboratable warning is off."""
    unit = EmbeddingBagUnit(**params)
    unit._MustUse__silence = True
    return unit


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


def workloads_from_spec(unit: EmbeddingBagUnit, spec: dict,
                        rng: np.random.Generator) -> list[Workload]:
    """Workloads from a JSON-able spec, so a cocotb bench (another process) rebuilds exactly
    what the caller asked for: ``{"kind": "random", "episodes", "num_bags", "max_len",
    "stress"}`` or ``{"kind": "benchmark", "episodes", **benchmark_workload arguments}``."""
    spec = dict(spec)
    kind = spec.pop("kind", "random")
    episodes = int(spec.pop("episodes", 1))
    if kind == "random":
        return [random_workload(rng, unit, num_bags=int(spec.get("num_bags", 12)),
                                max_len=int(spec.get("max_len", 6)),
                                stress=bool(spec.get("stress", True)))
                for _ in range(episodes)]
    if kind == "benchmark":
        if "latency" in spec:
            spec["latency"] = tuple(spec["latency"])
        return [benchmark_workload(rng, **spec) for _ in range(episodes)]
    raise ValueError(f"workload.kind: expected 'random' or 'benchmark', got {kind!r}")


def combined_placement(unit: EmbeddingBagUnit,
                       workloads: list[Workload]) -> tuple[np.ndarray, list[ref.Placement]]:
    """One memory image holding every workload's tables (beat 0 left unused)."""
    placements, parts, at = [], [np.zeros(unit.data_bytes, dtype=np.uint8)], 1
    for wl in workloads:
        p = ref.place_tables(wl.tables, unit.data_bytes, base=at)
        placements.append(p)
        parts.append(p.contents[at * unit.data_bytes:])
        at = len(p.contents) // unit.data_bytes
    return np.concatenate(parts), placements


def episode_stimulus(unit: EmbeddingBagUnit, wl: Workload,
                     placement: ref.Placement) -> tuple[list[dict], list[dict], list[Beat]]:
    """(descriptor writes, input items, expected beats) of one workload."""
    if callable(wl.descs):
        descs = wl.descs(placement)
    elif wl.descs is not None:
        descs = wl.descs
    else:
        descs = ref.descriptor_payloads(wl.tables, placement)
    items = wl.items if wl.items is not None else ref.bag_items(wl.bags, unit.index_width)
    expected = wl.expected if wl.expected is not None \
        else expected_beats(unit, wl.tables, wl.bags)
    return descs, items, expected


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
    if isinstance(payload, dict):          # unpacked by the cocotb stream monitor
        from types import SimpleNamespace
        payload = SimpleNamespace(**payload)
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
    from neonic.sim.harness import AmaranthMemory, run_amaranth, stream_recv, stream_send

    contents, placements = combined_placement(unit, workloads)
    first = workloads[0]
    mem = AmaranthMemory(unit.mem, contents, data_bytes=unit.data_bytes, rng=rng,
                         latency=first.latency, max_outstanding=first.mem_outstanding,
                         resp_stall=first.resp_stall)
    stimuli = [episode_stimulus(unit, wl, p) for wl, p in zip(workloads, placements)]
    expected = [st[2] for st in stimuli]
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
            descs, items, _ = stimuli[k]
            await stream_send(ctx, unit.desc, descs)
            state["t0"].append(state["cycle"])
            state["started"] = k
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


SMALL_UNIT: dict[str, Any] = dict(data_bytes=16, lanes=4, max_dim=64, tables=4, outstanding=16,
                                  max_bag_length=31)
"""The instance ``neonic rtl sim`` and the benchmark simulate: the default microarchitecture
at a quarter of the width (16-byte beats, 4 lanes). Cycle for cycle it behaves like the
64-byte, 16-lane default on a workload with 4x the dimension (the same beats per row), and
it simulates about 4x faster (the 16-lane unit runs at only tens of cycles per second in
Amaranth's simulator)."""
SMALL_UNIT_NAME = "embedding_small"


def run_cocotb_workload(params: dict[str, Any], spec: dict, *, sim: str, seed: int,
                        name: str = "embedding", waves: bool = False,
                        timeout_s: float | None = None) -> tuple[dict, Path]:
    """Run ``sim/cocotb/tb_embedding.py`` on the Verilog of ``EmbeddingBagUnit(**params)``
    with the workload ``spec`` (see :func:`workloads_from_spec`); return the bench's figures
    and its results XML (a waveform lies next to it when ``waves``)."""
    from neonic.sim.harness import read_tb_figures, run_cocotb

    unit = EmbeddingBagUnit(**params)         # elaborated by the Verilog export
    results = run_cocotb(unit, name, "tb_embedding", sim=sim, seed=seed, waves=waves,
                         params={"unit": _jsonable(params), "workload": spec},
                         timeout_s=timeout_s)
    return read_tb_figures(results), results


def _jsonable(params: dict[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in params.items()}


# -- neonic rtl sim embedding -------------------------------------------------------------------

SIM_WORKLOAD: dict[str, Any] = dict(kind="benchmark", episodes=1, num_bags=6, tables=2,
                                    rows=500, dim=32, length=20, alpha=1.15,
                                    latency=[40, 60], empty_every=3)
"""The default workload of ``neonic rtl sim embedding``: FBGEMM's benchmark shape scaled to
:data:`SMALL_UNIT` (D=32 at 16-byte beats = 8 beats per row, as D=128 at 64-byte beats;
L=20, FP32, Zipf 1.15) for 6 bags over 2 tables, with an empty bag after every third."""


def _reference_accuracy(wl: Workload) -> dict[str, float]:
    """:func:`_accuracy` of vectors equal to the FP32 reference."""
    return _error_figures(ref.pool(wl.tables, wl.bags), wl)


def _accuracy(unit: EmbeddingBagUnit, wl: Workload, beats: list[Beat]) -> dict[str, float]:
    """How the received vectors compare with the FP32 reference (must be 0) and with float64
    (as a fraction of the documented bound, must be <= 1)."""
    got_vals, i = [], 0
    for bag in wl.bags:
        dim = wl.tables[bag.table].dim
        words = -(-dim // unit.lanes)
        lanes = [x for b in beats[i:i + words] for x in b.data]
        got_vals.append(np.array(lanes, dtype=np.uint32).view(np.float32)[:dim])
        i += words
    return _error_figures(got_vals, wl)


def _error_figures(got_vals: list[np.ndarray], wl: Workload) -> dict[str, float]:
    want = ref.pool(wl.tables, wl.bags)
    exact = ref.pool_f64(wl.tables, wl.bags)
    bound = ref.error_bound(wl.tables, wl.bags)
    max_ref = max((float(np.max(np.abs(g.astype(np.float64) - w))) for g, w in
                   zip(got_vals, want) if len(g)), default=0.0)
    ratio = 0.0
    for g, e, b in zip(got_vals, exact, bound):
        err = np.abs(g.astype(np.float64) - e)
        over = err[b > 0] / b[b > 0]
        if np.any((b == 0) & (err > 0)):
            ratio = float("inf")
        if over.size:
            ratio = max(ratio, float(over.max()))
    return {"max_abs_error_vs_reference": max_ref,
            "max_error_vs_float64_over_bound": ratio}


def simulate(req: SimRequest) -> dict:
    """Run the default workload (:data:`SIM_WORKLOAD`) on ``req.sim``; write
    ``figures.json`` and a waveform into ``req.out`` (or to ``req.vcd``); return the figures.

    Parameters come from ``req.params`` over :data:`SMALL_UNIT`. ``req.extra["progress"]``, if given, is called
    with one-line progress messages; ``req.extra["workload"]`` may replace the workload spec.
    """
    import shutil

    progress: Callable[[str], None] = req.extra.get("progress") or (lambda msg: None)
    if req.sim not in ("amaranth", "icarus", "verilator"):
        raise ValueError(f"sim: expected amaranth, icarus or verilator, got {req.sim!r}")
    params = {**SMALL_UNIT, **parse_params(req.params)}
    unit = EmbeddingBagUnit(**params) if req.sim == "amaranth" else unit_for_layouts(**params)
    spec = dict(req.extra.get("workload") or SIM_WORKLOAD)
    if "workload" not in req.extra:
        # Keep 8 beats per row (FBGEMM's D=128 at 64-byte beats) whatever the beat width.
        spec["dim"] = min(unit.max_dim, 8 * unit.data_bytes // 4)
    out = Path(req.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(req.seed)
    wl = workloads_from_spec(unit, spec, np.random.default_rng(req.seed))[0]
    t0 = time.perf_counter()
    if req.sim == "amaranth":
        vcd = Path(req.vcd) if req.vcd else None
        progress(f"simulating {len(wl.bags)} bags on the {unit.lanes}-lane unit in Amaranth")
        res = run_amaranth_workload(unit, wl, rng=rng, vcd=vcd)
        cycles, counters, beats = res.cycles, res.counters, res.beats
        total_cycles, run_wall = res.sim_cycles, res.wall_s
        wave = vcd
    else:
        progress(f"simulating {len(wl.bags)} bags on {req.sim} (cocotb, generated Verilog)")
        name = SMALL_UNIT_NAME if params == SMALL_UNIT else "embedding_custom"
        figs, results = run_cocotb_workload(params, spec, sim=req.sim, seed=req.seed,
                                            name=name, waves=req.vcd is not None)
        ep = figs["episodes"][0]
        cycles, counters = ep["cycles"], ep["counters"]
        total_cycles, run_wall = figs["total_cycles"], figs["total_wall_s"]
        beats = []   # scoreboarded inside the bench
        wave = None
        for cand in (name + ".fst", "dump.vcd", "dump.fst") if req.vcd is not None else ():
            if (results.parent / cand).is_file():
                # Icarus writes FST: keep the suffix honest when a .vcd path was asked for.
                wave = (Path(req.vcd).with_suffix(Path(cand).suffix) if req.vcd
                        else out / ("embedding" + Path(cand).suffix))
                shutil.copyfile(results.parent / cand, wave)
                break
    wall = time.perf_counter() - t0
    pred = timing.predict(unit.timing, timing.shapes_from_bags(wl.tables, wl.bags),
                          latency=sum(wl.latency) / 2)
    figures: dict[str, Any] = {
        "unit": "embedding",
        "sim": req.sim,
        "seed": req.seed,
        "params": _jsonable(params),
        "workload": spec,
        "bags": len(wl.bags),
        "rows": int(sum(ref.contributing(wl.tables[b.table], b).sum() for b in wl.bags)),
        "cycles": cycles,
        "beats_read": counters["beats_read"],
        "busy_cycles": counters["busy_cycles"],
        "mem_beat_utilization": counters["beats_read"] / max(1, counters["busy_cycles"]),
        "timing_model_cycles": pred.cycles,
        "timing_model_rel_error": (pred.cycles - cycles) / cycles,
        "counters": counters,
        "bit_exact": True,          # the scoreboard raised otherwise
        "sim_cycles_per_s": total_cycles / run_wall if run_wall else None,
        "wall_s": wall,
        "waveform": str(wave) if wave else None,
    }
    # (the cocotb bench's scoreboard holds every vector bit-exact to the FP32 reference, so its
    # accuracy against float64 is the reference's)
    figures.update(_accuracy(unit, wl, beats) if beats else _reference_accuracy(wl))
    (out / "figures.json").write_text(json.dumps(figures, indent=1, sort_keys=True))
    progress(f"{cycles} cycles, utilisation {figures['mem_beat_utilization']:.3f}")
    return figures
