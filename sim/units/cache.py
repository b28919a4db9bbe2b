"""The cache controller as the command line sees it (``neonic rtl export|sim cache``).

``simulate`` runs a default random workload (reads, writes, malformed requests, random
latency, idle and backpressure) on the chosen simulator, checks it against the shadow memory
and the reference model, and writes ``figures.json`` (and a VCD when asked) into the results
folder. The measurement helpers here (:func:`measure_hits`, :func:`measure_misses`,
:func:`rtl_outcomes`) are shared with ``neonic bench cache``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from amaranth.utils import ceil_log2

from neonic.sim.units import SimRequest
from neonic.rtl.cache import CacheOp, CacheStats, LookupKind, OnChipCache
from neonic.sim.harness import AmaranthMemory, run_amaranth, stream_recv, stream_send
from neonic.sim.reference.cache import CacheConfig, Request, expected_results, random_requests
from neonic.sim.timing.cache import NIC_COMPARE_STAGES, NIC_LINE_SLICE, NIC_LOOKAHEAD

__all__ = ["build", "simulate", "default_workload", "measure_hits", "measure_misses",
           "rtl_outcomes", "nic_cache_params"]

_INT_PARAMS = ("data_bytes", "addr_width", "beats_width", "line_beats", "row_beats", "sets",
               "ways", "mshrs", "queue_depth", "line_outstanding", "lfu_bits", "counter_width")
_STR_PARAMS = ("index", "policy")
DEFAULTS = dict(data_bytes=8, addr_width=20, line_beats=4, sets=16, ways=8, mshrs=16)
_KIND = {LookupKind.HIT: "hit", LookupKind.MERGED: "merged", LookupKind.MISS: "miss",
         LookupKind.ERROR: "error"}


def _params(params: dict[str, str]) -> dict:
    kw: dict = dict(DEFAULTS)
    for key, value in params.items():
        if key in _INT_PARAMS:
            try:
                kw[key] = int(value, 0)
            except ValueError:
                raise ValueError(f"{key}: expected an integer, got {value!r}") from None
        elif key in _STR_PARAMS:
            kw[key] = value
        else:
            raise ValueError(f"--param {key}: unknown cache parameter; expected one of "
                             f"{', '.join(_INT_PARAMS + _STR_PARAMS)}")
    return kw


def nic_cache_params(nic, *, row_bytes: int, backing_bytes: float) -> dict:
    """The :class:`rtl.cache.CacheController` parameters of a SmartNIC's local cache
    (``nic``: a ``sim.nic.NICConfig``, from a preset): its datapath width, ways, MSHRs and
    queue; one line per row of ``row_bytes`` (the largest row cached, padded to a power of
    two of beats, like the tables' row stride); as many sets (a power of two) as
    ``local_cache_bytes`` holds; a beat address wide enough for ``backing_bytes`` of backing
    tier; the lines in NIC memory, with ``line_outstanding`` covering its latency
    (``memory_latency_cycles``) so that hits stream at one per cycle; two compare stages, no
    lookahead and a register slice on the line requests (the organisation for a tag store of thousands of sets, see ``rtl.cache``)."""
    for name, value in (("row_bytes", row_bytes), ("backing_bytes", backing_bytes)):
        if not value > 0:
            raise ValueError(f"{name}: expected > 0, got {value!r}")
    beats = -(-int(row_bytes) // nic.datapath_bytes)
    line_beats = 1 << ceil_log2(beats)
    sets = int(nic.local_cache_bytes // (line_beats * nic.datapath_bytes * nic.cache_ways))
    if sets < 1:
        raise ValueError(f"nic.local_cache_bytes: {nic.local_cache_bytes:g} B holds no set of "
                         f"{nic.cache_ways} ways of {line_beats * nic.datapath_bytes} B lines")
    return dict(data_bytes=nic.datapath_bytes,
                addr_width=max(ceil_log2(int(backing_bytes) // nic.datapath_bytes), 1),
                beats_width=max(ceil_log2(line_beats + 1), 1), line_beats=line_beats,
                row_beats=beats, sets=1 << (sets.bit_length() - 1), ways=nic.cache_ways,
                mshrs=nic.cache_mshrs, queue_depth=nic.cache_queue_depth,
                line_outstanding=min(256, 1 << ceil_log2(nic.memory_latency_cycles + 8)),
                compare_stages=NIC_COMPARE_STAGES, lookahead=NIC_LOOKAHEAD,
                line_slice=NIC_LINE_SLICE)


def build(params: dict[str, str]) -> OnChipCache:
    """The cache with its lines on chip (the RTL SmartNIC's configuration): its ports are
    the controller's but ``lines``."""
    return OnChipCache(**_params(params))


def config_of(dut: OnChipCache) -> CacheConfig:
    return CacheConfig(dut.sets, dut.ways, dut.policy, dut.index, dut.lfu_bits)


def rtl_outcomes(dut: OnChipCache, requests: list[Request], rng: np.random.Generator, *,
                 rows: int, latency=(1, 30), idle=0.2, backpressure=0.2, stall=0.1,
                 vcd: Path | None = None, memory: np.ndarray | None = None) -> dict:
    """Run ``requests`` through the RTL in Amaranth's simulator (random idle, backpressure,
    latency), then FLUSH; check read data and memory against the shadow memory and outcomes
    against the reference model (AssertionError otherwise). Returns kinds, stats, cycles.
    ``memory``: the backing memory's initial bytes (else random from ``rng``)."""
    if memory is None:
        memory = rng.integers(0, 256, rows * dut.line_beats * dut.data_bytes, dtype=np.uint8)
    # One generator per process, spawned from ``rng``: the simulator's order of a cycle's
    # processes varies from run to run, and a shared generator would make the run vary too.
    mem_rng, req_rng, wdata_rng, resp_rng = rng.spawn(4)
    mem = AmaranthMemory(dut.back, memory.copy(), data_bytes=dut.data_bytes, rng=mem_rng,
                         latency=latency, resp_stall=stall, accept_stall=stall)
    n_read = sum(r.beats for r in requests if not r.write)
    kinds: list[str] = []
    got: list[int] = []
    stats: dict = {}

    async def requester(ctx):
        await stream_send(ctx, dut.front.req, [{"addr": r.addr, "beats": r.beats,
                                                "write": int(r.write)} for r in requests],
                          rng=req_rng, idle=idle)

    async def writer(ctx):
        await stream_send(ctx, dut.front.wdata,
                          [{"data": d, "mask": m, "last": int(i == len(r.wdata) - 1)}
                           for r in requests if r.write for i, (d, m) in enumerate(r.wdata)],
                          rng=wdata_rng, idle=idle)

    async def reader(ctx):
        beats = await stream_recv(ctx, dut.front.resp, n_read, rng=resp_rng,
                                  backpressure=backpressure)
        got.extend(int(b.data) for b in beats)
        while len(kinds) < sum(r.beats > 0 for r in requests):
            await ctx.tick()
        await stream_send(ctx, dut.cmd, [CacheOp.FLUSH])
        while not ctx.get(dut.idle):
            await ctx.tick()
        stats.update({f: ctx.get(getattr(dut.stats, f)) for f in CacheStats.FIELDS})

    async def monitor(ctx):
        async for _, _, valid, kind in ctx.tick().sample(dut.lookup_valid, dut.lookup_kind):
            if valid:
                kinds.append(_KIND[LookupKind(kind)])

    cycles = run_amaranth(dut, [requester, writer, reader], [mem.process], background=[monitor],
                          vcd=vcd, max_cycles=200 * len(requests) + 10_000)
    mem.check_idle()
    exp = expected_results(requests, memory, config_of(dut), line_beats=dut.line_beats,
                           row_beats=dut.row_beats, data_bytes=dut.data_bytes)
    if got != exp.read_beats:
        raise AssertionError("cache: read data differ from the shadow memory")
    if not np.array_equal(mem.contents, exp.memory):
        raise AssertionError("cache: backing memory differs from the shadow after FLUSH")
    if [k.replace("merged", "hit") for k in kinds] != \
            [k for k, r in zip(exp.kinds, requests) if r.beats > 0]:
        raise AssertionError("cache: lookup outcomes differ from the reference model")
    return {"kinds": kinds, "stats": stats, "cycles": cycles, "reference": exp.counters,
            "reference_kinds": exp.kinds}


def measure_hits(dut: OnChipCache, n: int = 400, rows: int = 4) -> dict:
    """All-hit stream: warm ``rows`` rows (consecutive rows: distinct sets), then ``n``
    single-beat reads of them in turn, a request offered every cycle and responses taken at
    once. Lookups per cycle and request-to-first-beat latency (cycles between the accepting
    edge and the edge that takes the first beat)."""
    memory = np.zeros(8 * dut.line_beats * dut.data_bytes, np.uint8)
    mem = AmaranthMemory(dut.back, memory, data_bytes=dut.data_bytes,
                         rng=np.random.default_rng(0), latency=(1, 1))
    accepts: list[int] = []
    firsts: list[int] = []

    async def tb(ctx):
        for r in range(rows):
            await stream_send(ctx, dut.front.req, [{"addr": r * dut.line_beats, "beats": 1}])
            await stream_recv(ctx, dut.front.resp, 1)
        ctx.set(dut.front.resp.ready, 1)
        cycle = sent = recv = 0
        while recv < n:
            if sent < n:
                ctx.set(dut.front.req.payload, {"addr": (sent % rows) * dut.line_beats,
                                                "beats": 1})
            ctx.set(dut.front.req.valid, int(sent < n))
            _, _, rdy, vld, pv = await ctx.tick().sample(dut.front.req.ready,
                                                         dut.front.req.valid,
                                                         dut.front.resp.valid)
            if rdy and vld:
                accepts.append(cycle)
                sent += 1
            if pv:
                firsts.append(cycle)
                recv += 1
            cycle += 1

    run_amaranth(dut, [tb], [mem.process], max_cycles=20 * n + 2000)
    lat = [f - a for a, f in zip(accepts, firsts)]
    return {"hit_lookups_per_cycle": n / (accepts[-1] - accepts[0] + 1),
            "hit_latency_cycles": max(lat), "hit_latency_min_cycles": min(lat)}


def measure_misses(dut: OnChipCache, n: int = 300, latency: int = 200) -> dict:
    """All-miss stream: ``n`` whole-row reads of distinct rows, backing latency ``latency``
    cycles; misses completed per cycle (first request offered to last beat taken)."""
    rows = n + 1
    memory = np.zeros(rows * dut.line_beats * dut.data_bytes, np.uint8)
    mem = AmaranthMemory(dut.back, memory, data_bytes=dut.data_bytes,
                         rng=np.random.default_rng(0), latency=(latency, latency),
                         max_outstanding=max(64, dut.mshrs))
    reqs = [{"addr": r * dut.line_beats, "beats": dut.row_beats} for r in range(n)]

    async def requester(ctx):
        await stream_send(ctx, dut.front.req, reqs)

    async def reader(ctx):
        await stream_recv(ctx, dut.front.resp, n * dut.row_beats)

    cycles = run_amaranth(dut, [requester, reader], [mem.process],
                          max_cycles=n * (latency + 4 * dut.row_beats) + 10_000)
    return {"miss_throughput": n / cycles, "miss_cycles": cycles, "misses": n}


#: The ``neonic rtl sim cache`` run's memory timing, the same in every simulator so that their
#: figures compare cycle for cycle: a fixed read latency, no idle, stalls or backpressure (the
#: tests and the cocotb soak drive random ones).
CLI_LATENCY = 20


def default_workload(rng: np.random.Generator, dut: OnChipCache, count: int
                     ) -> tuple[np.ndarray, list[Request], int]:
    """The backing memory's initial bytes, ``count`` random requests (Zipf 1.0 over four
    times the cache's lines; a quarter writes, 2% malformed) and the row count."""
    rows = 4 * dut.sets * dut.ways
    memory = rng.integers(0, 256, rows * dut.line_beats * dut.data_bytes, dtype=np.uint8)
    reqs = random_requests(rng, count, rows=rows, line_beats=dut.line_beats,
                           row_beats=dut.row_beats, data_bytes=dut.data_bytes,
                           write_fraction=0.25, error_fraction=0.02, zipf=1.0)
    return memory, reqs, rows


def simulate(req: SimRequest) -> dict:
    """The default workload (:func:`default_workload` from the seed) on ``req.sim``, checked
    against the shadow memory and the reference model; figures.json (the same fields from
    every simulator) and a waveform when asked into ``req.out``."""
    kw = _params(req.params)
    dut = OnChipCache(**kw)
    text = str(req.extra.get("requests", 600))
    try:
        count = int(text, 10)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"--requests: expected an integer >= 1, got {text!r}")
    rng = np.random.default_rng(req.seed)
    memory, reqs, rows = default_workload(rng, dut, count)
    t0 = time.perf_counter()
    results_xml = None
    if req.sim == "amaranth":
        run = rtl_outcomes(dut, reqs, rng, rows=rows, vcd=req.vcd, memory=memory,
                           latency=(CLI_LATENCY, CLI_LATENCY), idle=0.0, backpressure=0.0,
                           stall=0.0)
        cycles, stats = run["cycles"], run["stats"]
    elif req.sim in ("icarus", "verilator"):
        from neonic.sim.harness import read_tb_figures, run_cocotb
        req.out.mkdir(parents=True, exist_ok=True)
        stimulus = req.out / "stimulus.json"
        stimulus.write_text(json.dumps({
            "memory": memory.tobytes().hex(),
            "requests": [[r.addr, r.beats, int(r.write), [list(b) for b in r.wdata]]
                         for r in reqs]}))
        results = run_cocotb(dut, "cache", "tb_cache", sim=req.sim, seed=req.seed,
                             waves=req.vcd is not None,
                             params={"unit": kw, "workload": {
                                 "rows": rows, "stimulus": str(stimulus.resolve()),
                                 "latency": [CLI_LATENCY, CLI_LATENCY], "idle": 0.0,
                                 "backpressure": 0.0, "resp_stall": 0.0, "accept_stall": 0.0}})
        tb = read_tb_figures(results)
        (episode,) = tb["episodes"]
        cycles, stats = episode["cycles"], episode["counters"]
        results_xml = str(results)
    else:
        raise ValueError(f"sim: expected amaranth, icarus or verilator, got {req.sim!r}")
    looked_up = stats["hits"] + stats["merged"] + stats["misses"]
    figures = {"unit": "cache", "sim": req.sim, "seed": req.seed, "params": kw,
               "requests": count, "cycles": cycles, "stats": stats,
               "hit_rate": (stats["hits"] + stats["merged"]) / max(1, looked_up),
               "wall_s": time.perf_counter() - t0, "results_xml": results_xml}
    req.out.mkdir(parents=True, exist_ok=True)
    (req.out / "figures.json").write_text(json.dumps(figures, indent=1, default=str))
    return figures
