"""sim.memory_tiers: the host tier's HBM cache (steady state held to the set-associative cache
model), miss bytes and transfer time (one cost function for planner and simulator)."""

from __future__ import annotations

import numpy as np
import pytest

from neonic.sim.lookups import zipf_rows
from neonic.sim.memory_tiers import empirical_hit_rate, host_transfer_s, miss_bytes, zipf_hit_rate
from neonic.sim.reference.cache import CacheConfig, simulate_trace


def warm_hit_rate(rows: np.ndarray, sets: int, ways: int, policy: str) -> float:
    hits = simulate_trace(rows, CacheConfig(sets=sets, ways=ways, policy=policy, index="hash")).hits
    return float(hits[len(hits) // 2:].mean())


@pytest.mark.parametrize("alpha", [0.9, 1.15])
def test_zipf_steady_state_lru_matches_the_32_way_cache_model(alpha):
    rows, sets, ways = 60_000, 64, 32
    trace = zipf_rows(np.random.default_rng(5), 300_000, rows, alpha)
    sim = warm_hit_rate(trace, sets, ways, "lru")
    assert zipf_hit_rate(alpha, rows, sets * ways, "lru") == pytest.approx(sim, abs=0.03)


def test_zipf_lfu_is_the_hottest_rows_mass_and_beats_lru():
    rows, lines, alpha = 60_000, 2048, 1.15
    w = np.arange(1, rows + 1) ** -alpha
    assert zipf_hit_rate(alpha, rows, lines, "lfu") == pytest.approx(w[:lines].sum() / w.sum(), rel=1e-3)
    assert zipf_hit_rate(alpha, rows, lines, "lfu") > zipf_hit_rate(alpha, rows, lines, "lru")
    sim = warm_hit_rate(zipf_rows(np.random.default_rng(6), 300_000, rows, alpha), 64, 32, "lfu")
    assert zipf_hit_rate(alpha, rows, lines, "lfu") == pytest.approx(sim, abs=0.05)


def test_huge_tables_cost_no_more_than_small_ones_and_more_cache_hits_more():
    # Model-F scale: 2e9 rows, a cache of 10% of them
    rates = [zipf_hit_rate(1.15, 2_000_000_000, lf * 2e9) for lf in (0.01, 0.1, 0.5)]
    assert 0 < rates[0] < rates[1] < rates[2] < 1
    assert zipf_hit_rate(1.15, 1000, 1000) == 1.0 and zipf_hit_rate(1.15, 1000, 0) == 0.0


def test_a_replayed_trace_hits_as_the_cache_model_says():
    rng = np.random.default_rng(2)
    batch = zipf_rows(rng, 50_000, 20_000, 1.0)
    sim = warm_hit_rate(np.concatenate([batch] * 4), 32, 32, "lru")
    # the cache model sees the batch replayed; the steady state uses its frequencies
    assert empirical_hit_rate(batch, 20_000, 1024, "lru") == pytest.approx(sim, abs=0.05)
    assert empirical_hit_rate(np.arange(10), 100, 10) == 1.0


def test_miss_bytes_and_transfer_time_are_one_formula():
    assert miss_bytes(1000, 512, 0.9) == pytest.approx(2 * 100 * 512)
    assert host_transfer_s(32e9, "dram", 32e9, 3e9) == pytest.approx(1.0)
    assert host_transfer_s(3e9, "ssd", 32e9, 3e9) == pytest.approx(1.0)
    assert host_transfer_s(1e9, "hbm", 32e9, 3e9) == 0.0


def _plain_bisection_lru(p: np.ndarray, lines: float) -> float:
    """Che's LRU hit rate by the plain bisection (every step evaluated), the reference."""
    def occ(T: float) -> tuple[float, float]:
        e = -np.expm1(-p * T)
        return float(e.sum()), float((p * e).sum())

    lo, hi = 0.0, 1.0
    while occ(hi)[0] < lines:
        hi *= 2.0
    while hi - lo > 1e-12 * hi:
        mid = 0.5 * (lo + hi)
        if occ(mid)[0] < lines:
            lo = mid
        else:
            hi = mid
    return occ(hi)[1]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lru_hit_rate_is_the_plain_bisections_bit_for_bit(seed):
    # the Newton-guided replay of the bisection (fewer passes) changes no bit of the result
    rng = np.random.default_rng(seed)
    for _ in range(8):
        idx = rng.zipf(float(rng.uniform(1.05, 2.0)), int(rng.integers(100, 20_000))) % int(rng.integers(50, 5000))
        _, counts = np.unique(idx, return_counts=True)
        p = np.sort(counts.astype(np.float64))[::-1] / counts.sum()
        lines = float(rng.uniform(1, max(2, counts.size - 1)))
        if lines >= counts.size:
            continue
        assert empirical_hit_rate(idx, 0, lines) == _plain_bisection_lru(p, lines)
