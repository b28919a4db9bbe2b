"""The embedding unit's models: the numpy reference (semantics, documented order, error bound)
and the timing model (held within 5% of the RTL's cycle counts on random workloads, and the
throughput goals: memory-beat utilisation and the cost of an empty bag)."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from neonic.sim.units.embedding import benchmark_workload, random_workload, run_amaranth_episodes
from neonic.rtl.embedding import EmbeddingBagUnit
from neonic.sim.reference import embedding as ref
from neonic.sim.timing import embedding as timing


# -- reference model ------------------------------------------------------------------------------


def _bag(t, idx, w=None, tag=0):
    return ref.Bag(t, np.array(idx, dtype=np.int64),
                   None if w is None else np.array(w, dtype=np.float32), tag)


def test_sum_follows_the_documented_order_and_stays_within_the_bound():
    rows = np.array([[1e8], [1.0], [-1e8]], dtype=np.float32)
    tables = [ref.Table(rows)]
    bags = [_bag(0, [0, 1, 2]), _bag(0, [1, 0, 2])]
    got = ref.pool(tables, bags)
    exact = ref.pool_f64(tables, bags)
    bound = ref.error_bound(tables, bags)
    assert got[0][0] == 0.0                     # (1e8 + 1) rounds back to 1e8
    assert got[1][0] == 0.0
    assert exact[0][0] == 1.0
    assert abs(got[0][0] - exact[0][0]) <= bound[0][0]


def test_empty_padding_out_of_range_and_mean_count():
    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    tables = [ref.Table(rows, "fp32", mode, padding_idx=1) for mode in ref.POOLING]
    for t in range(3):
        empty, pad_only = ref.pool(tables, [_bag(t, []), _bag(t, [1, 1])])
        assert not empty.any() and not pad_only.any()
    mean = ref.pool(tables, [_bag(1, [0, 1, 3, 9, -2])])[0]
    np.testing.assert_array_equal(mean, (rows[0] + rows[3]) * np.float32(0.5))
    weighted = ref.pool(tables, [_bag(0, [0, 3], [2.0, -1.0])])[0]
    np.testing.assert_array_equal(weighted, 2 * rows[0] - rows[3])


def test_max_keeps_the_first_of_equal_values_and_ignores_weights():
    rows = np.array([[-0.0, 1.0], [0.0, 1.0]], dtype=np.float32)
    tables = [ref.Table(rows, "fp32", "max")]
    a, b, w = ref.pool(tables, [_bag(0, [0, 1]), _bag(0, [1, 0]), _bag(0, [0, 1], [5, 5])])
    assert a.view(np.uint32)[0] == 0x80000000 and b.view(np.uint32)[0] == 0
    np.testing.assert_array_equal(w, a)


def test_max_treats_nan_like_torch_cpu_embedding_bag():
    """A row is taken where ``row > max``: a NaN first row stays, a later NaN is ignored
    (not ``torch.max`` over the rows, which would give NaN in both cases)."""
    rows = np.array([[np.nan, 1.0], [2.0, np.nan], [3.0, 0.5]], dtype=np.float32)
    tables = [ref.Table(rows, "fp32", "max")]
    first, later = ref.pool(tables, [_bag(0, [0, 1, 2]), _bag(0, [2, 1, 0])])
    assert np.isnan(first[0]) and first[1] == 1.0
    np.testing.assert_array_equal(later, [3.0, 1.0])
    np.testing.assert_array_equal(ref.pool_f64(tables, [_bag(0, [2, 1, 0])])[0], later)


def test_weighted_sum_rounds_the_product_not_a_fused_multiply_add():
    """(-1) + (1+2**-12)**2: the rounded product loses 2**-24, a fused multiply-add (torch CPU,
    FBGEMM) keeps it. The documented semantics are the rounded product."""
    x = np.float32(1 + 2.0 ** -12)
    tables = [ref.Table(np.array([[-1.0], [x]], dtype=np.float32))]
    got = ref.pool(tables, [_bag(0, [0, 1], [1.0, x])])[0][0]
    fma = np.float32(-1.0 + float(x) * float(x))        # exact in float64, one rounding
    assert got == np.float32(2.0 ** -11)
    assert fma == np.float32(2.0 ** -11 + 2.0 ** -24) and fma != got


def test_error_bound_holds_when_products_fall_among_the_subnormals(rng):
    """Weighted products of tiny rows round to subnormals: the absolute term of the bound
    covers them (the relative term alone is exceeded by orders of magnitude)."""
    rows = (rng.standard_normal((20, 16)) * 1e-39).astype(np.float32)     # subnormal rows
    table = ref.Table(rows, "fp32", "sum")
    bags = [_bag(0, rng.integers(0, 20, size=n), rng.standard_normal(n) * 1e-3)
            for n in (1, 5, 30)]
    worst_relative = 0.0
    for got, exact, bound, bag in zip(ref.pool([table], bags), ref.pool_f64([table], bags),
                                      ref.error_bound([table], bags), bags):
        err = np.abs(got.astype(np.float64) - exact)
        assert np.all(err <= bound)
        n = len(bag.indices)
        k = n + 1
        s = np.abs(bag.weights.astype(np.float64)[:, None] * rows[bag.indices]).sum(axis=0)
        relative = k * 2.0 ** -24 / (1 - k * 2.0 ** -24) * s
        worst_relative = max(worst_relative, float((err / relative).max()))
    assert worst_relative > 10


def test_half_precision_tables_widen_exactly():
    vals = np.array([[6e-8, -65504, 0.1, 3e-5]], dtype=np.float16)
    np.testing.assert_array_equal(ref.widen_rows(ref.Table(vals, "fp16")),
                                  vals.astype(np.float32))
    bf = np.array([[0x3F80, 0xC000, 0x0001]], dtype=np.uint16)   # 1, -2, a subnormal
    wide = ref.widen_rows(ref.Table(bf, "bf16"))
    np.testing.assert_array_equal(wide.view(np.uint32), bf.astype(np.uint32) << 16)


@pytest.mark.parametrize("elem_type", ref.ELEM_TYPES)
@pytest.mark.parametrize("pooling", ref.POOLING)
def test_fp32_result_stays_within_the_documented_bound_of_float64(elem_type, pooling, rng):
    table = ref.random_table(rng, 50, 33, elem_type, pooling, scale=100.0)
    bags = [_bag(0, rng.integers(0, 50, size=n),
                 rng.standard_normal(n) if rng.random() < 0.5 else None)
            for n in rng.integers(0, 300, size=20)]
    for got, exact, bound in zip(ref.pool([table], bags), ref.pool_f64([table], bags),
                                 ref.error_bound([table], bags)):
        assert np.all(np.abs(got.astype(np.float64) - exact) <= bound)
        if pooling == "max":
            np.testing.assert_array_equal(got, exact)


def test_tables_are_placed_on_beat_boundaries_with_padded_rows():
    t0 = ref.Table(np.ones((3, 5), dtype=np.float32))        # 20 B -> 2 beats of 16
    t1 = ref.Table(np.ones((2, 8), dtype=np.float16), "fp16")  # 16 B -> 1 beat
    p = ref.place_tables([t0, t1], 16, base=1)
    assert p.bases == (1, 7)
    row1 = p.contents[3 * 16:5 * 16].view(np.float32)
    np.testing.assert_array_equal(row1[:5], 1.0)
    assert not row1[5:].any()
    assert ref.row_stride_beats(5, "fp32", 16) == 2 and ref.row_stride_beats(8, "fp16", 16) == 1


def test_bad_tables_and_bags_are_refused():
    with pytest.raises(ValueError, match="^elem_type:"):
        ref.Table(np.zeros((2, 2), dtype=np.float32), "fp8")
    with pytest.raises(ValueError, match="^rows:"):
        ref.Table(np.zeros((2, 2), dtype=np.float64))
    with pytest.raises(ValueError, match="^weights:"):
        ref.Bag(0, np.array([1, 2]), np.array([1.0]))
    with pytest.raises(ValueError, match="^bag.table:"):
        ref.pool([], [_bag(0, [1])])


# -- timing model against the RTL --------------------------------------------------------------

UNIT = dict(data_bytes=16, lanes=4, max_dim=40, tables=4, outstanding=6, max_bag_length=31,
            elem_types=("fp32", "fp16"))


def _episodes(rng):
    unit = EmbeddingBagUnit(**UNIT)
    eps = {}
    for k in range(3):
        wl = random_workload(rng, unit, num_bags=12, max_len=8, stress=False)
        lat = int(rng.integers(1, 40))
        eps[f"random{k}"] = dataclasses.replace(wl, latency=(lat, lat))
    # FBGEMM's shape scaled to the lanes: 8 words per row, L=20, Zipf 1.15.
    fb = benchmark_workload(rng, num_bags=8, tables=2, rows=200, dim=32, length=20,
                            latency=(10, 20))
    eps["fbgemm"] = fb
    empties = benchmark_workload(np.random.default_rng(1), num_bags=8, tables=2, rows=200,
                                 dim=32, length=20, latency=(10, 20), empty_every=1)
    eps["fbgemm_plus_empty"] = empties
    # One word per row: the adder's read-after-write hazard sets the row rate.
    eps["hazard"] = benchmark_workload(rng, num_bags=6, tables=1, rows=50, dim=4, length=12,
                                       latency=(4, 4))
    # Latency not covered by the outstanding reads.
    eps["latency_bound"] = benchmark_workload(rng, num_bags=4, tables=1, rows=50, dim=8,
                                              length=12, latency=(60, 60))
    return unit, eps


@pytest.fixture(scope="module")
def rtl_runs():
    rng = np.random.default_rng(2024)
    unit, eps = _episodes(rng)
    # The FBGEMM pair must hold the same non-empty bags.
    base = benchmark_workload(np.random.default_rng(1), num_bags=8, tables=2, rows=200,
                              dim=32, length=20, latency=(10, 20))
    eps["fbgemm_same_bags"] = base
    names = list(eps)
    results = run_amaranth_episodes(unit, [eps[n] for n in names], rng=rng)
    return unit, eps, dict(zip(names, results))


def _predict(unit, wl):
    lat = (wl.latency[0] + wl.latency[1]) / 2
    return timing.predict(unit.timing, timing.shapes_from_bags(wl.tables, wl.bags), latency=lat)


def test_timing_model_is_within_5_percent_of_the_rtl(rtl_runs):
    unit, eps, res = rtl_runs
    errors = {}
    for name, wl in eps.items():
        pred = _predict(unit, wl)
        assert pred.beats == res[name].counters["beats_read"], name
        errors[name] = abs(pred.cycles - res[name].cycles) / res[name].cycles
    assert max(errors.values()) <= 0.05, errors


def test_memory_beats_flow_every_cycle_when_latency_is_covered(rtl_runs):
    """Between the first beat that can arrive and the last one the drain waits for, the
    memory port is busy at least 95% of the cycles: interleaving the bags' rows hides the
    adder's read-add-write distance (``add_latency + 1`` = 10 cycles at the full FP depths
    against 8 words per row). The batch's fixed fill and drain latency (about 100 cycles of
    the unit's deep pipelines) is left out: the bench's longer batch reports it in."""
    unit, eps, res = rtl_runs
    t = unit.timing
    c = res["fbgemm"].counters
    wl = eps["fbgemm"]
    fill = t.parse_to_issue + 1 + sum(wl.latency) / 2 + t.resp_latency
    tail = t.done_latency + 8 + t.drain_latency
    assert c["beats_read"] / (c["busy_cycles"] - fill - tail) >= 0.95
    # rows of one bag back to back would stall 2 of every 10 cycles; the few left are the
    # batch's last bag, alone once the others have finished
    assert c["stall_hazard"] <= 0.05 * c["beats_read"]


def test_an_empty_bag_takes_no_reducer_slot_and_costs_a_few_cycles(rtl_runs):
    """An empty bag costs its header cycle at the input and its zero beats at the drain,
    which overlap the next bags' rows. Measured: about 2.6 cycles per empty bag on this batch,
    because the extra header cycles move the phase of the round-robin interleave at the end
    of the batch (the timing model predicts the same)."""
    _, eps, res = rtl_runs
    extra = len(eps["fbgemm_plus_empty"].bags) - len(eps["fbgemm_same_bags"].bags)
    assert extra == 7
    cost = (res["fbgemm_plus_empty"].cycles - res["fbgemm_same_bags"].cycles) / extra
    assert cost <= 3.0
    assert res["fbgemm_plus_empty"].counters["stall_bank"] == 0


def test_short_rows_wait_for_the_adder(rtl_runs):
    unit, eps, res = rtl_runs
    c = res["hazard"].counters
    assert c["stall_hazard"] > 0
    # one word per row: the interleaved bags share one read-add-write distance per round
    per_row = timing.steady_state_row_cycles(unit.timing, 4)
    assert per_row == (unit.add_latency + 1) / unit.interleave
    assert res["hazard"].cycles >= 6 * 11 * per_row


def test_timing_model_is_much_faster_than_the_rtl(rtl_runs):
    unit, eps, res = rtl_runs
    wl = eps["fbgemm"]
    shapes = timing.shapes_from_bags(wl.tables, wl.bags)
    t0 = time.perf_counter()
    for _ in range(20):
        timing.predict(unit.timing, shapes, latency=15)
    model_s = (time.perf_counter() - t0) / 20
    run = res["fbgemm"]
    rtl_s = run.wall_s * run.cycles / run.sim_cycles
    assert rtl_s / model_s > 100


@pytest.mark.slow
def test_the_benchmarks_quarter_width_unit_times_like_the_default_one():
    """The bench scales FBGEMM's shape by simulating SMALL_UNIT at D=32: that must cost the
    same cycles as the default 64-byte, 16-lane unit at D=128 (both 8 beats per row)."""
    from neonic.sim.units.embedding import SMALL_UNIT, run_amaranth_workload
    cycles = []
    for params, dim in ((SMALL_UNIT, 32), (dict(max_dim=128), 128)):
        wl = benchmark_workload(np.random.default_rng(5), num_bags=3, tables=2, rows=100,
                                dim=dim, length=6, latency=(30, 30), empty_every=1)
        res = run_amaranth_workload(EmbeddingBagUnit(**params), wl,
                                    rng=np.random.default_rng(1))
        cycles.append((res.cycles, res.counters["beats_read"]))
    assert cycles[0] == cycles[1]


def test_per_row_latency_sequence_matches_one_latency_and_charges_slow_rows():
    t = EmbeddingBagUnit(data_bytes=16, lanes=4, max_dim=32, outstanding=8).timing
    shapes = [timing.BagShape(16, "fp32", (True,) * 4) for _ in range(6)]
    rows = 24
    flat = timing.predict(t, shapes, latency=10)
    same = timing.predict(t, shapes, latency=[10] * rows)
    assert same.cycles == flat.cycles and len(same.issue) == rows
    assert list(same.issue) == sorted(same.issue)          # rows issue in order
    slow = timing.predict(t, shapes, latency=[10] * 12 + [60] + [10] * 11)
    # one row 50 cycles late holds the in-order responses behind it; the rows ahead of it
    # (up to outstanding = 8 rows of 4 words) and the reducer's idle cycles of the flat run
    # hide part of it, never more than all of it
    assert flat.cycles + 50 - 8 * 4 - 4 <= slow.cycles <= flat.cycles + 50
    with pytest.raises(ValueError, match="latency: expected one latency per contributing row"):
        timing.predict(t, shapes, latency=[10] * 5)
    with pytest.raises(ValueError, match="latency"):
        timing.predict(t, shapes, latency=[10] * 23 + [0])


def test_pacing_puts_other_bags_rows_between_the_first_bags():
    """The parse makes the first bag's rows before any other bag's: issued back to back they
    would cost the adder's read-add-write distance each (10 cycles for 8-word rows). Pacing
    (no row of the slot served last while half the read budget is in flight) lets the next
    bag's rows in between once it is parsed."""
    t = EmbeddingBagUnit(data_bytes=16, lanes=4, max_dim=64, outstanding=16).timing
    assert t.pace_rows == 8 and t.hazard_distance > 8
    shapes = [timing.BagShape(32, "fp32", (True,) * 20) for _ in range(16)]
    paced = timing.predict(t, shapes, latency=50)
    unpaced = timing.predict(dataclasses.replace(t, pace_rows=0), shapes, latency=50)
    assert paced.beats == unpaced.beats == 16 * 20 * 8
    # the first bag's 20 rows lose (10 - 8) cycles each when alone, far fewer when paced
    assert paced.cycles <= unpaced.cycles - 10
    assert paced.mem_beat_utilization > unpaced.mem_beat_utilization
