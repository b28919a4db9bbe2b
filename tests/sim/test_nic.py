"""The SmartNIC model: cache figures on traces, batch reordering, unit times, engine units."""

from __future__ import annotations

import numpy as np
import pytest

from neonic.sim.engine import Engine
from neonic.sim.nic import (
    NIC,
    NIC_UNITS,
    NICConfig,
    Segment,
    adjacent_reuse,
    cache_cycles,
    cache_for,
    cache_lookup_time_s,
    gather_time_s,
    packetizer_time_s,
    reorder_bags,
    trace_stats,
)
from neonic.sim.reference.cache import CacheConfig, CacheModel, Request
from neonic.sim.timing.cache import NIC_COMPARE_STAGES, NIC_LINE_SLICE, CacheTiming
from neonic.sim.timing.packetizer import estimate_tx


def zipf(rng: np.random.Generator, n: int, rows: int, alpha: float = 1.15) -> np.ndarray:
    ranks = np.arange(1, rows + 1)
    p = ranks ** -alpha
    return rng.permutation(rows)[rng.choice(rows, n, p=p / p.sum())]


def bags(rng: np.random.Generator, count: int, rows: int, pool: float = 8, alpha: float = 1.15, key: str = "t") -> Segment:
    lengths = rng.poisson(pool, count)
    return Segment(key, lengths, zipf(rng, int(lengths.sum()), rows, alpha), rows, 256)


# ------------------------------------------------------------------------------------ caches
@pytest.mark.parametrize("seed", range(12))
def test_trace_hits_are_the_request_by_request_models(seed):
    rng = np.random.default_rng(seed)
    segs = [bags(rng, int(rng.integers(2, 60)), int(rng.integers(2, 120)), key=f"t{i}") for i in range(3)]
    capacity, ways = int(rng.integers(1, 40)) * 256, int(rng.integers(1, 6))
    st = trace_stats(segs, capacity, ways, warm=False)
    model = CacheModel(cache_for(capacity, 256, ways))
    offset = 0
    for s in segs:
        hits = [model.access(int(r) + offset).kind == "hit" for r in s.rows]
        offset += s.num_rows
        assert st.segments[s.key].hit_rate == pytest.approx(np.mean(hits) if hits else 0.0, abs=1e-12)


def test_cache_geometry_from_capacity():
    cfg = cache_for(64 * 2**20, 512, 32)
    assert cfg.ways == 32 and cfg.sets * cfg.ways == 64 * 2**20 // 512
    assert cache_for(100, 512, 32) is None
    assert cache_for(3 * 512, 512, 32).ways == 3


def test_hit_rate_grows_with_capacity_and_a_warm_cache_beats_a_cold_one():
    rng = np.random.default_rng(1)
    segs = [bags(rng, 800, 5000, key=f"t{i}") for i in range(3)]
    rates = [trace_stats(segs, cap, 8).hit_rate for cap in (0, 16 * 256, 256 * 256, 4096 * 256)]
    assert rates[0] == 0.0
    assert rates[0] < rates[1] < rates[2] < rates[3]
    # with room for every row, a cold cache still misses each row once
    warm = trace_stats(segs, 4096 * 256, 8, warm=True).hit_rate
    cold = trace_stats(segs, 4096 * 256, 8, warm=False).hit_rate
    assert warm > cold > 0


def test_bag_figures_are_consistent_per_segment():
    rng = np.random.default_rng(2)
    segs = [bags(rng, 400, 2000, key="a"), bags(rng, 400, 50, key="b")]
    st = trace_stats(segs, 512 * 256, 8)
    a, b = st.segments["a"], st.segments["b"]
    for s in (a, b):
        assert 0 <= s.bags_all_hit <= s.bags_with_hit <= 1
        assert 0 <= s.hit_rate <= 1
    assert b.hit_rate > a.hit_rate  # 50 rows fit the cache; 2000 do not
    assert st.lookups == a.lookups + b.lookups


def test_segment_rejects_inconsistent_traces():
    with pytest.raises(ValueError, match="lengths sum"):
        Segment("x", np.array([2, 2]), np.arange(3), 10, 4)
    with pytest.raises(ValueError, match="rows must lie"):
        Segment("x", np.array([1]), np.array([10]), 10, 4)


# ------------------------------------------------------------------------------- reordering
def test_reorder_groups_bags_by_their_hottest_row():
    lengths = np.array([2, 0, 1, 3, 2])
    rows = np.array([5, 1, 9, 5, 2, 3, 1, 9])
    perm = reorder_bags(lengths, rows)
    assert sorted(perm.tolist()) == list(range(5))
    # rows 1, 5, 9 have degree 2; bags 0 and 4 share row 1; the empty bag goes last
    assert perm.tolist() == [0, 4, 3, 2, 1]


def test_reorder_exposes_reuse_and_raises_a_small_caches_hit_rate():
    rng = np.random.default_rng(3)
    # 64 groups of bags, each group sharing a hot row, interleaved in the batch
    count = 2048
    group = rng.integers(0, 64, count)
    lengths = np.full(count, 4)
    rows = np.stack([group, *(64 + rng.integers(0, 100000, (3, count)))], axis=1).ravel()
    base = adjacent_reuse(lengths, rows, window=8)
    after = adjacent_reuse(lengths, rows, window=8, reorder=True)
    assert after > base + 0.1
    seg = Segment("t", lengths, rows, 100064, 256)
    small = 8 * 256
    off = trace_stats([seg], small, 2, warm=False).hit_rate
    on = trace_stats([seg], small, 2, warm=False, reorder=True).hit_rate
    assert on > off + 0.1


def test_static_hot_row_cache_is_profiled_order_free_and_beats_lru_on_zipf():
    """A static cache holds the rows most looked up in the profile (first) batches: its hits
    do not depend on the order of lookups, and on Zipf lookups it hits at least as often as
    LRU of the same size (which evicts hot rows for cold misses)."""
    rng = np.random.default_rng(5)
    lengths = rng.poisson(8, 4096)
    rows = np.minimum(rng.zipf(1.1, int(lengths.sum())) - 1, 99_999)
    seg = Segment("t", lengths, rows, 100_000, 256)
    cap = 512 * 256
    static = trace_stats([seg], cap, 8, policy="static")
    assert static.hit_rate == trace_stats([seg], cap, 8, policy="static", reorder=True).hit_rate
    assert static.hit_rate >= trace_stats([seg], cap, 8).hit_rate
    assert 0 < static.hit_rate < 1
    with pytest.raises(ValueError, match="policy"):
        trace_stats([seg], cap, 8, policy="lfu")
    with pytest.raises(ValueError, match="warm"):
        trace_stats([seg], cap, 8, warm=False, policy="static")


def test_cache_misses_served_elsewhere_cost_one_tag_probe():
    """A SmartNIC cache miss is served by the GPU (local) or the network (remote): the cycles
    it holds the lookup pipeline's last stage (one, and one more without lookahead: the RTL's
    ``miss_bubbles``), no fill, no row; hits stream their rows as usual."""
    from neonic.sim.timing.cache import NIC_LOOKAHEAD, miss_bubbles

    cfg = NICConfig()
    rows = 4 * cfg.datapath_bytes
    probe = 1 + miss_bubbles(NIC_LOOKAHEAD)
    assert cache_lookup_time_s(cfg, 1000, hit_rate=0.0, row_bytes=rows, misses_elsewhere=True) == pytest.approx(probe * 1000 / cfg.clock_hz)
    all_hit = cache_lookup_time_s(cfg, 1000, hit_rate=1.0, row_bytes=rows)
    assert cache_lookup_time_s(cfg, 1000, hit_rate=1.0, row_bytes=rows, misses_elsewhere=True) == pytest.approx(all_hit)
    half = cache_lookup_time_s(cfg, 1000, hit_rate=0.5, row_bytes=rows, misses_elsewhere=True)
    hit_latency = CacheTiming(row_beats=4, compare_stages=NIC_COMPARE_STAGES,
                              line_slice=NIC_LINE_SLICE).hit_latency
    assert half == pytest.approx((500 * 4 + hit_latency + probe * 500) / cfg.clock_hz)
    # the RTL cache filling its own misses from NIC memory takes longer
    assert cache_lookup_time_s(cfg, 1000, hit_rate=0.5, row_bytes=rows) > half


# -------------------------------------------------------------------------------- unit times
def test_gather_time_scales_with_bags_and_is_memory_bound_on_slow_memory():
    cfg = NICConfig()
    one = gather_time_s(cfg, [(128, 4, 1000, 10)])
    two = gather_time_s(cfg, [(128, 4, 2000, 10)])
    assert two == pytest.approx(2 * one, rel=0.02)
    slow = NICConfig(memory_bytes_per_s=1e9)
    assert gather_time_s(slow, [(128, 4, 1000, 10)]) == pytest.approx(1000 * 10 * 512 / 1e9)
    assert gather_time_s(cfg, []) == 0.0
    # a row of 128 FP32 takes at least 128 / lanes cycles in the reducer
    assert one >= 1000 * 10 * (128 / cfg.lanes) / cfg.clock_hz


def test_packetizer_time_agrees_with_the_timing_model():
    cfg = NICConfig()
    for n in (64, 4096, 40000, 1 << 20):
        direct = estimate_tx([n], data_bytes=cfg.datapath_bytes, pmtu=cfg.pmtu).cycles / cfg.clock_hz
        assert packetizer_time_s(cfg, [n]) == pytest.approx(direct, rel=1e-9)
    # a long message runs near the datapath's rate (64 B x 250 MHz) less the headers
    t = packetizer_time_s(cfg, [1 << 24])
    assert 0.95 < (1 << 24) / t / (64 * 250e6) < 1.0
    assert packetizer_time_s(cfg, [0]) == 0.0


def test_packetizer_time_with_a_shared_memo_is_the_same_figure():
    """Ranks of an AlltoAllv share one memo of the timing model's cycles per message size: the
    figures are those without it, bit for bit, in any order of the calls."""
    cfg = NICConfig(packetizers=2)
    rng = np.random.default_rng(7)
    ranks = [rng.integers(0, 200_000, 40).astype(float) for _ in range(6)]
    memo: dict = {}
    shared = [packetizer_time_s(cfg, msgs, memo=memo) for msgs in ranks]
    assert shared == [packetizer_time_s(cfg, msgs) for msgs in ranks]
    assert 2 <= len(memo) <= 2 + sum(m.size for m in ranks)
    assert [packetizer_time_s(cfg, msgs, memo=memo) for msgs in reversed(ranks)] == shared[::-1]


def test_cache_lookup_pipeline_takes_one_lookup_per_cycle():
    cfg = NICConfig(clock_hz=100e6)
    hit_latency = CacheTiming(row_beats=1, compare_stages=NIC_COMPARE_STAGES,
                              line_slice=NIC_LINE_SLICE).hit_latency   # the first response's
    assert cache_lookup_time_s(cfg, 1000) == pytest.approx((1000 + hit_latency) / 100e6)
    assert cache_lookup_time_s(cfg, 0) == 0.0
    # whole rows are delivered one beat per cycle; misses cost time
    row = cache_lookup_time_s(cfg, 1000, row_bytes=6 * cfg.datapath_bytes)
    assert row == pytest.approx(1002 * 6 / 100e6, rel=0.01)
    assert cache_lookup_time_s(cfg, 1000, hit_rate=0.0) > cache_lookup_time_s(cfg, 1000, hit_rate=0.9)


def _reads(rng: np.random.Generator, n: int, miss: float, row_beats: int) -> list[Request]:
    """Whole-row reads, a new row (a miss) with probability ``miss``, else the last row."""
    new = rng.random(n) < miss
    new[0] = True
    return [Request(int(r) * row_beats, row_beats) for r in np.cumsum(new)]


@pytest.mark.parametrize("row_beats", [1, 2, 6, 24])
@pytest.mark.parametrize("latency", [20, 40, 80])
def test_cache_closed_form_within_5_percent_of_the_timing_model(rng, row_beats, latency):
    timing = CacheTiming(row_beats=row_beats, mshrs=16, queue_depth=32, latency=latency)
    for miss in (0.0, 0.02, 0.1, 0.3, 1.0):
        reqs = _reads(rng, 5000, miss, row_beats)
        ref = timing.run(reqs, CacheConfig(sets=1024, ways=4), line_beats=row_beats)
        # consecutive rows are in different sets; a repeated row is in the same set
        got = cache_cycles(len(reqs), ref.misses / len(reqs), row_beats, latency=latency,
                           mshrs=16, queue_depth=32, same_set=1 - ref.misses / len(reqs))
        assert got == pytest.approx(ref.cycles, rel=0.05), (miss, got, ref.cycles)


def test_cache_closed_form_rejects_bad_values():
    with pytest.raises(ValueError, match="miss_rate"):
        cache_cycles(10, 1.5, 1, latency=40)
    with pytest.raises(ValueError, match="row_beats"):
        cache_cycles(10, 0.5, 0, latency=40)
    with pytest.raises(ValueError, match="same_set"):
        cache_cycles(10, 0.5, 1, latency=40, same_set=2.0)
    with pytest.raises(ValueError, match="nic.cache_mshrs"):
        NICConfig(cache_mshrs=0)


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="nic.clock_hz"):
        NICConfig(clock_hz=0)
    with pytest.raises(ValueError, match="nic.local_cache_bytes"):
        NICConfig(local_cache_bytes=-1)


# ---------------------------------------------------------------------------- engine units
def test_nic_units_are_resources_that_run_side_by_side_and_queue():
    engine = Engine()
    nic = NIC(engine, NICConfig(), name="nic0")
    ends = []
    nic.run({"cache": 100, "gather": 300}, lambda s, e: ends.append((s, e)), label="a")
    nic.run({"gather": 50}, lambda s, e: ends.append((s, e)), label="b")
    engine.run()
    assert ends == [(0, 300), (0, 350)]  # the gather unit is one server: b waits for a
    assert set(nic.intervals) == set(NIC_UNITS)
    assert nic.intervals["gather"] == [(0, 300, "a"), (300, 350, "b")]
    assert nic.utilization(350)["gather"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="durations_ps.dma"):
        nic.run({"dma": 1}, lambda s, e: None)


def test_a_job_with_nothing_to_do_completes_at_once():
    engine = Engine()
    nic = NIC(engine, NICConfig())
    ends = []
    engine.after(10, lambda: nic.run({}, lambda s, e: ends.append((s, e))))
    engine.run()
    assert ends == [(10, 10)]


def test_an_soc_nic_prices_its_kernels_by_a_memory_bound_roofline():
    """kernels = "cores": the larger of the memory's bandwidth for the bytes and the cores'
    row rate; cache probes are rows on the cores; framing is the hardware NIC's (no time)."""
    soc = NICConfig(kernels="cores", cores=8, core_rows_per_s=20e6, memory_bytes_per_s=25.6e9)
    # 1e6 rows of 64 FP32 (256 MB): the DDR4 (10 ms) bounds, not the cores (6.25 ms)
    assert gather_time_s(soc, [(64, 4, 1e5, 10.0)]) == pytest.approx(1e6 * 256 / 25.6e9)
    # 4-byte rows: the cores' 160 M rows/s bound
    assert gather_time_s(soc, [(1, 4, 1e5, 10.0)]) == pytest.approx(1e6 / 160e6)
    assert cache_lookup_time_s(soc, 1.6e6, hit_rate=0.5, misses_elsewhere=True) == pytest.approx(0.01)
    assert packetizer_time_s(soc, [1e6, 2e6]) == 0.0
    with pytest.raises(ValueError, match="nic.cores"):
        NICConfig(kernels="cores", core_rows_per_s=1e6)
    with pytest.raises(ValueError, match="nic.kernels"):
        NICConfig(kernels="gpu")


def test_a_nic_update_reads_and_writes_rows_and_state_at_its_memory_bandwidth():
    from neonic.sim.nic import update_time_s

    fpga = NICConfig(memory_bytes_per_s=460e9)
    assert update_time_s(fpga, 1e6, 256, 4) == pytest.approx(2 * 1e6 * 260 / 460e9)
    assert update_time_s(fpga, 0, 256, 4) == 0.0
    soc = NICConfig(kernels="cores", cores=2, core_rows_per_s=1e6, memory_bytes_per_s=1e12)
    assert update_time_s(soc, 1e6, 256, 4) == pytest.approx(0.5)   # the cores bound


def test_the_nic_cache_model_has_the_compare_stages_of_the_rtl_built_for_it():
    """The system model's cache and the RTL organisation for the preset's cache
    (``nic_cache_params``) use one figure; a hit costs its extra compare stage in the model."""
    from neonic.sim.nic import NICConfig, cache_lookup_time_s
    from neonic.sim.timing.cache import cache_cycles
    from neonic.sim.units.cache import nic_cache_params

    from neonic.sim.timing.cache import NIC_LOOKAHEAD

    cfg = NICConfig()
    params = nic_cache_params(cfg, row_bytes=256, backing_bytes=2**30)
    assert params["compare_stages"] == NIC_COMPARE_STAGES == 2
    assert params["lookahead"] is NIC_LOOKAHEAD is False
    assert params["line_slice"] is NIC_LINE_SLICE is True
    one = cache_cycles(10, 0.0, 1, latency=cfg.memory_latency_cycles, mshrs=cfg.cache_mshrs,
                       queue_depth=cfg.cache_queue_depth, compare_stages=1,
                       line_slice=NIC_LINE_SLICE)
    assert cache_lookup_time_s(cfg, 10) * cfg.clock_hz == pytest.approx(one + 1)
    # without lookahead a miss holds the lookup a cycle longer, and a request of the set
    # ahead waits two cycles more than with it
    kw = dict(latency=cfg.memory_latency_cycles, mshrs=cfg.cache_mshrs,
              queue_depth=cfg.cache_queue_depth, compare_stages=2)
    assert (cache_cycles(100, 0.0, 1, same_set=0.5, **kw, lookahead=False)
            == pytest.approx(cache_cycles(100, 0.0, 1, same_set=0.5, **kw) + 100))
    assert (cache_lookup_time_s(cfg, 10, hit_rate=0.5, misses_elsewhere=True)
            == pytest.approx(cache_lookup_time_s(cfg, 5) + 10 / cfg.clock_hz))
