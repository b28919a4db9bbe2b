"""``neonic bench embedding``: the gather/pool unit's throughput, timing-model accuracy and
simulation speed, measured in simulation.

Workload: FBGEMM's TBE benchmark shape (D=128, L=20, FP32, Zipf 1.15), scaled to simulate in
about a minute: the unit is ``sim.units.embedding.SMALL_UNIT`` (16-byte beats, 4 lanes) and
D=32, so that a row is 8 memory beats exactly as D=128 is at the default 64-byte beats;
cycle for cycle the two behave the same. Memory latency is 40..60 cycles, covered by the 16
outstanding rows (128 beats in flight).

Figures:

* ``mem_beat_utilization``: beats read per busy cycle of the unit over the batch.
* ``empty_bag_cycles``: extra cycles per empty bag, from the same batch run with an empty bag
  after every bag.
* ``timing_model_max_rel_error``: worst ``|model - RTL| / RTL`` cycles over those batches and
  random workloads (mixed dims, element types, pooling, padding, latencies).
* ``sim_cycles_per_s``: simulated cycles per wall second of the scoreboarded runs, per
  available simulator (Amaranth including elaboration; cocotb without the build).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from neonic.host.bench import BenchContext
from neonic.sim.units.embedding import (SMALL_UNIT, SMALL_UNIT_NAME, benchmark_workload,
                                  random_workload, run_amaranth_episodes, run_cocotb_workload)
from neonic.rtl.embedding import EmbeddingBagUnit
from neonic.sim.harness import available_simulators
from neonic.sim.timing import embedding as timing

SUMMARY = ("embedding gather/pool unit: memory-beat utilisation at FBGEMM's shape, empty-bag "
           "cost, timing-model error, simulator speed")


def run(ctx: BenchContext) -> dict:
    unit = EmbeddingBagUnit(**SMALL_UNIT)            # elaborated by the Amaranth run
    dim = 8 * unit.data_bytes // 4                       # 8 beats per row, like D=128 @ 64 B
    bags = 6 if ctx.quick else 16
    shape = dict(num_bags=bags, tables=4, rows=2000, dim=dim, length=20, alpha=1.15,
                 latency=(40, 60))
    full = benchmark_workload(np.random.default_rng(ctx.seed), **shape)
    with_empty = benchmark_workload(np.random.default_rng(ctx.seed), **shape, empty_every=1)
    rng = np.random.default_rng(ctx.seed + 1)
    randoms = []
    for _ in range(2 if ctx.quick else 4):
        wl = random_workload(rng, unit, num_bags=10, max_len=12, stress=False)
        lat = int(rng.integers(1, 80))
        randoms.append(dataclasses.replace(wl, latency=(lat, lat)))
    episodes = [full, with_empty, *randoms]

    ctx.progress(f"Amaranth: {len(episodes)} batches on the {unit.lanes}-lane unit "
                 f"({bags} bags of D={dim}, L=20 and random mixes), scoreboarded")
    results = run_amaranth_episodes(unit, episodes, rng=np.random.default_rng(ctx.seed + 2))
    r_full, r_empty = results[0], results[1]
    c = r_full.counters
    utilization = c["beats_read"] / c["busy_cycles"]
    empties = len(with_empty.bags) - len(full.bags)
    empty_cost = (r_empty.cycles - r_full.cycles) / empties

    errors, model_s = [], 0.0
    for wl, res in zip(episodes, results):
        shapes = timing.shapes_from_bags(wl.tables, wl.bags)
        t0 = time.perf_counter()
        pred = timing.predict(unit.timing, shapes, latency=sum(wl.latency) / 2)
        model_s += time.perf_counter() - t0
        errors.append(abs(pred.cycles - res.cycles) / res.cycles)
    rtl_cycles = sum(r.cycles for r in results)
    sim_speed = {"amaranth": results[0].sim_cycles / results[0].wall_s}
    ctx.progress(f"utilisation {utilization:.3f}, empty bag {empty_cost:.2f} cycles, "
                 f"timing model within {max(errors):.2%}")

    spec = {"kind": "benchmark", "episodes": 1, **{k: v for k, v in shape.items()},
            "latency": list(shape["latency"])}
    for sim in available_simulators():
        if sim == "verilator" and ctx.quick:
            continue
        ctx.progress(f"{sim}: the same batch on the generated Verilog (cocotb)")
        figs, _ = run_cocotb_workload(SMALL_UNIT, spec, sim=sim, seed=ctx.seed,
                                      name=SMALL_UNIT_NAME)
        sim_speed[sim] = figs["total_cycles"] / figs["total_wall_s"]

    return {
        "mem_beat_utilization": round(utilization, 4),
        "empty_bag_cycles": round(empty_cost, 3),
        "timing_model_max_rel_error": round(max(errors), 4),
        "sim_cycles_per_s": {k: round(v, 1) for k, v in sim_speed.items()},
        "timing_model_speedup": round((r_full.wall_s * rtl_cycles / r_full.sim_cycles)
                                      / max(model_s, 1e-9), 0),
        "cycles": r_full.cycles,
        "beats_read": c["beats_read"],
        "busy_cycles": c["busy_cycles"],
        "stall_cycles": {k: c[k] for k in ("stall_memory", "stall_hazard", "stall_bank",
                                           "stall_output", "stall_input")},
        "workload": {"bags": bags, "dim": dim, "length": 20, "zipf_alpha": 1.15,
                     "elem_type": "fp32", "beats_per_row": 8, "latency": list(shape["latency"]),
                     "tables": shape["tables"], "rows_per_table": shape["rows"],
                     "equivalent_default_unit_dim": 128},
        "unit": {k: (list(v) if isinstance(v, tuple) else v)
                 for k, v in SMALL_UNIT.items()},
    }
