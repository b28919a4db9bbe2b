"""``neonic bench cache``: hit rates of the embedding-row cache on realistic traces, and the
controller's hit rate, latency and miss throughput measured on its RTL.

Figures:

* ``hit_rate[policy][size][trace]``: LRU and LFU, 32 ways, caches of 5% and 20% of the rows,
  on Zipf 1.05 and 1.15 traces of FBGEMM's benchmark shape (1e5 rows, batch 512, pooling 20;
  100 batches, 10 with ``--quick``) and on the trace fitted to
  ``shared/data/dlrm_datasets_2021_locality_stats.txt`` (``host.traces``), from the fast
  trace-level model (``sim.reference.cache.simulate_trace``). Merged misses count as hits.
* ``rtl_vs_reference_hit_rate_delta``: RTL hit rate minus the reference model's on a Zipf
  trace through the RTL (random latency, idle, backpressure); goal 0.
* ``hit_lookups_per_cycle`` (goal >= 0.95) and ``hit_latency_cycles`` on an all-hit stream
  of single-beat reads of rows in distinct sets, lines on chip (``rtl.cache.OnChipCache``:
  three lookup stages, the executor's register (taken from the last stage when nothing is
  queued), the line RAM's 3 cycles = 7);
  ``hit_lookups_per_cycle_one_set``: the same stream on one row (a request of the set right
  ahead of it waits a cycle: 0.5).
* ``miss_throughput``: misses completed per cycle with 16 MSHRs at a backing latency of 200
  cycles (bound: 16 / (200 + a row's beats)), with the timing model's prediction beside it.
* ``nic_organisation``: the same hit and miss figures for the organisation of the SmartNIC
  preset's cache (``sim.units.cache.nic_cache_params``: two compare stages, no lookahead,
  line requests through a register slice, a sliced tag store) at the small size above, lines on chip: ``hit_lookups_per_cycle`` on
  hits to 8 rows in turn (distinct sets), ``hit_lookups_per_cycle_one_set`` (a request of
  the set ahead waits for its update to be written and read again: 1 / ``same_set_gap``),
  ``hit_latency_cycles``, ``miss_throughput`` with the timing model's beside it.
* ``trace_fit_total_variation``: total variation distance between the fitted trace's reuse
  histograms and the statistics file's (``host.traces``); goal <= 0.05.
"""

from __future__ import annotations

import time

import numpy as np

from neonic.host.bench import BenchContext
from neonic.sim.units.cache import config_of, measure_hits, measure_misses, rtl_outcomes
from neonic.rtl.cache import OnChipCache
from neonic.sim.reference.cache import CacheConfig, Request, simulate_trace
from neonic.sim.timing.cache import NIC_COMPARE_STAGES, NIC_LINE_SLICE, NIC_LOOKAHEAD, CacheTiming

SUMMARY = ("embedding-row cache: LRU/LFU hit rates on Zipf and fitted traces, RTL vs reference, "
           "hit rate/latency and miss throughput of the RTL")

ROWS, BATCH, POOLING, WAYS = 100_000, 512, 20, 32


def _zipf_rows(rng: np.random.Generator, alpha: float, n: int) -> np.ndarray:
    """Zipf(alpha) lookups of one table of ROWS rows (``host.traces``), ``n // (BATCH *
    POOLING)`` consecutive batches with the same hot rows (generated as one long batch, so
    the popularity permutation is shared)."""
    from neonic.host.traces import ZipfTraceGenerator
    batches = max(1, n // (BATCH * POOLING))
    gen = ZipfTraceGenerator(num_tables=1, num_rows=ROWS, batch_size=BATCH * batches,
                             pooling=POOLING, alpha=alpha)
    return gen.generate(rng).tables[0].indices.astype(np.int64)


def _fitted_rows(rng: np.random.Generator, n: int):
    """One batch of ``n`` lookups from the generator fitted to the first block of the locality
    statistics, as linear row indices over all its tables (FBGEMM's cache also indexes rows
    linearly across tables), the number of rows of all tables, and the total variation
    distance of the trace's two histograms to the file's (the larger of the two)."""
    from neonic.host.traces import (PUBLISHED_LOCALITY_STATS, fit_generator, load_locality_stats,
                             total_variation, trace_locality)
    stats = load_locality_stats(PUBLISHED_LOCALITY_STATS, block=0)
    trace = fit_generator(stats, lookups=n).generate(rng)
    num_rows, _, indices = trace.combined()
    base = np.concatenate([[0], np.cumsum(num_rows)[:-1]])
    per_table = [t.indices.size for t in trace.tables]
    linear = indices + np.repeat(base, per_table)
    got = trace_locality(trace)
    tv = max(total_variation(got.row_hist, stats.row_hist),
             total_variation(got.lookup_share, stats.lookup_share))
    return linear.astype(np.int64), int(num_rows.sum()), tv


def run(ctx: BenchContext) -> dict:
    rng = np.random.default_rng(ctx.seed)
    batches = 10 if ctx.quick else 100
    n = batches * BATCH * POOLING
    figures: dict = {"trace_lookups": n, "ways": WAYS}
    traces, universes = {}, {}
    for alpha in (1.05, 1.15):
        traces[f"zipf_{alpha}"] = _zipf_rows(rng, alpha, n)
        universes[f"zipf_{alpha}"] = ROWS
    traces["fitted"], universes["fitted"], tv = _fitted_rows(rng, n)
    figures["trace_fit_total_variation"] = tv
    ctx.progress(f"traces: {n} Zipf lookups each; fitted trace {len(traces['fitted'])} lookups "
                 f"over {universes['fitted']} rows, total variation {tv:.4f}")

    hit_rate: dict = {}
    for policy in ("lru", "lfu"):
        for frac in (0.05, 0.20):
            # Capacity: a fraction of all rows of the trace's tables.
            for name, rows in traces.items():
                sets = max(1, round(universes[name] * frac / WAYS))
                t0 = time.perf_counter()
                res = simulate_trace(rows, CacheConfig(sets=sets, ways=WAYS, policy=policy))
                hit_rate.setdefault(policy, {}).setdefault(f"{round(frac * 100)}%", {})[name] = \
                    round(res.hit_rate, 4)
                ctx.progress(f"{policy} {frac:.0%} {name}: hit rate {res.hit_rate:.4f} "
                             f"({len(rows)} lookups, {sets} sets, "
                             f"{time.perf_counter() - t0:.1f} s)")
    figures["hit_rate"] = hit_rate

    # RTL against the reference model on the same request order.
    dut = OnChipCache(data_bytes=4, addr_width=20, line_beats=1, sets=16, ways=8,
                      mshrs=16, policy="lru", index="hash")
    count = 600 if ctx.quick else 2000
    rows = _zipf_rows(rng, 1.05, count)[:count] % 1024
    reqs = [Request(int(r), 1) for r in rows]
    t0 = time.perf_counter()
    run_ = rtl_outcomes(dut, reqs, rng, rows=1024, latency=(1, 60))
    s = run_["stats"]
    rtl_rate = (s["hits"] + s["merged"]) / count
    ref_rate = run_["reference"]["hits"] / count
    figures["rtl_vs_reference_hit_rate_delta"] = rtl_rate - ref_rate
    figures["rtl_hit_rate"] = rtl_rate
    figures["rtl_merged_misses"] = s["merged"]
    ctx.progress(f"RTL vs reference: {rtl_rate:.4f} vs {ref_rate:.4f} over {count} requests "
                 f"({time.perf_counter() - t0:.1f} s)")

    dut = OnChipCache(data_bytes=8, addr_width=20, line_beats=4, sets=16, ways=8, mshrs=16)
    figures.update(measure_hits(dut, 200 if ctx.quick else 1000))
    figures["hit_lookups_per_cycle_one_set"] = measure_hits(
        OnChipCache(data_bytes=8, addr_width=20, line_beats=4, sets=16, ways=8, mshrs=16),
        200, rows=1)["hit_lookups_per_cycle"]
    ctx.progress(f"all-hit stream: {figures['hit_lookups_per_cycle']:.3f} lookups/cycle, "
                 f"latency {figures['hit_latency_cycles']} cycles")

    dut = OnChipCache(data_bytes=8, addr_width=20, line_beats=4, sets=16, ways=8, mshrs=16)
    n_miss = 100 if ctx.quick else 400
    miss = measure_misses(dut, n_miss, latency=200)
    model = CacheTiming(row_beats=dut.row_beats, mshrs=16, queue_depth=dut.queue_depth,
                        latency=200).run([Request(r * 4, 4) for r in range(n_miss)],
                                         config_of(dut), line_beats=4)
    figures.update(miss)
    figures["miss_throughput_model"] = n_miss / model.cycles
    figures["miss_throughput_bound"] = 16 / (200 + dut.row_beats)
    ctx.progress(f"all-miss stream, 16 MSHRs, latency 200: {miss['miss_throughput']:.4f} "
                 f"misses/cycle (model {figures['miss_throughput_model']:.4f})")

    nic = dict(data_bytes=8, addr_width=20, line_beats=4, sets=16, ways=8, mshrs=16,
               compare_stages=NIC_COMPARE_STAGES, lookahead=NIC_LOOKAHEAD,
               line_slice=NIC_LINE_SLICE, tag_slice_sets=8)
    org = measure_hits(OnChipCache(**nic), 200 if ctx.quick else 1000, rows=8)
    org["hit_lookups_per_cycle_one_set"] = measure_hits(OnChipCache(**nic), 200,
                                                        rows=1)["hit_lookups_per_cycle"]
    dut = OnChipCache(**nic)
    miss = measure_misses(dut, n_miss, latency=200)
    model = CacheTiming(row_beats=dut.row_beats, mshrs=16, queue_depth=dut.queue_depth,
                        latency=200, compare_stages=NIC_COMPARE_STAGES,
                        lookahead=NIC_LOOKAHEAD, line_slice=NIC_LINE_SLICE).run([Request(r * 4, 4) for r in range(n_miss)],
                                                     config_of(dut), line_beats=4)
    org.update(miss_throughput=miss["miss_throughput"], miss_cycles=miss["miss_cycles"],
               miss_throughput_model=n_miss / model.cycles,
               same_set_gap=dut.controller.same_set_gap)
    figures["nic_organisation"] = org
    ctx.progress(f"NIC organisation: {org['hit_lookups_per_cycle']:.3f} lookups/cycle "
                 f"({org['hit_lookups_per_cycle_one_set']:.3f} on one set), latency "
                 f"{org['hit_latency_cycles']} cycles; misses {org['miss_throughput']:.4f}/cycle "
                 f"(model {org['miss_throughput_model']:.4f})")
    return figures
