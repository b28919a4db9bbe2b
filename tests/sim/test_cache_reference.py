"""The cache's golden models: the request-by-request model's policy on hand-made cases, and
the fast trace-level model against it."""

from __future__ import annotations

import numpy as np
import pytest

from neonic.sim.reference.cache import CacheConfig, CacheModel, set_index, simulate_trace


def kinds(model: CacheModel, rows, writes=None):
    writes = writes or [False] * len(rows)
    return [model.access(r, w).kind[0] for r, w in zip(rows, writes)]


def test_lru_evicts_least_recently_used():
    m = CacheModel(CacheConfig(sets=1, ways=2, policy="lru"))
    # 1, 2 fill; touching 1 makes 2 the LRU line, so 3 evicts 2.
    assert kinds(m, [1, 2, 1, 3, 1, 2]) == list("mmhmhm")
    assert m.counters["evictions"] == 2


def test_lfu_evicts_least_frequently_used_and_ages():
    m = CacheModel(CacheConfig(sets=1, ways=2, policy="lfu", lfu_bits=2))
    # Row 1 used 3x (count 3 = max), row 2 once: 3 evicts 2 (ties go to the lowest way).
    assert kinds(m, [1, 1, 1, 2, 3, 2]) == list("mhhmmm")
    out = m.access(1)  # saturated: counts halve (3 -> 1, 1 -> 0), then the hit adds 1
    assert out.kind == "hit"
    lines = m._sets[0]
    assert [line.repl for line in lines] == [2, 0]


def test_dirty_lines_write_back_on_eviction_and_flush():
    m = CacheModel(CacheConfig(sets=1, ways=1))
    m.access(5, write=True)
    out = m.access(6)
    assert out.evicted == 5 and out.writeback
    m.access(6, write=True)
    assert m.flush() == [6] and m.flush() == []
    assert m.counters["writebacks"] == 2


def test_hash_index_is_the_xor_fold():
    cfg = CacheConfig(sets=16, ways=1, index="hash")
    assert set_index(0x1234, cfg) == 0x1 ^ 0x2 ^ 0x3 ^ 0x4
    rows = np.arange(0, 4096, 16)          # a stride the modulo index maps to one set
    assert len(set(set_index(rows, cfg).tolist())) == 16
    assert set(set_index(rows, CacheConfig(sets=16, ways=1)).tolist()) == {0}
    with pytest.raises(ValueError, match="^sets:"):
        CacheConfig(sets=12, ways=1, index="hash")


@pytest.mark.parametrize("policy,index,sets", [("lru", "modulo", 7), ("lfu", "hash", 8),
                                               ("lfu", "modulo", 5)])
def test_fast_model_equals_reference_per_lookup(rng, policy, index, sets):
    cfg = CacheConfig(sets=sets, ways=4, policy=policy, index=index, lfu_bits=3)
    rows = rng.zipf(1.2, 20000) % 500
    writes = rng.random(len(rows)) < 0.3
    fast = simulate_trace(rows, cfg, writes)
    ref = CacheModel(cfg)
    hits = np.array([ref.access(int(r), bool(w)).kind == "hit" for r, w in zip(rows, writes)])
    assert np.array_equal(fast.hits, hits)
    assert fast.evictions == ref.counters["evictions"]
    assert fast.writebacks == ref.counters["writebacks"]


def test_fast_model_handles_a_million_lookups_quickly(rng):
    import time
    rows = rng.zipf(1.05, 1_000_000) % 100_000
    t0 = time.perf_counter()
    res = simulate_trace(rows, CacheConfig(sets=156, ways=32))
    assert time.perf_counter() - t0 < 20
    assert 0.3 < res.hit_rate < 0.95


def _reference_hits(cfg: CacheConfig, rows, writes):
    ref = CacheModel(cfg)
    hits = np.array([ref.access(int(r), bool(w)).kind == "hit" for r, w in zip(rows, writes)], bool)
    return hits, ref.counters


@pytest.mark.parametrize("policy", ["lru", "lfu"])
@pytest.mark.parametrize("case", range(40))
def test_fast_model_equals_reference_on_small_random_cases(seed, policy, case):
    """Small traces, few sets, many seeds: sets end at every step (equal and unequal lookup
    counts), so the lock-step loop must step exactly the sets that still have lookups."""
    rng = np.random.default_rng([seed, case])
    sets = int(rng.integers(1, 9))
    cfg = CacheConfig(sets=sets, ways=int(rng.integers(1, 5)), policy=policy,
                      lfu_bits=int(rng.integers(1, 4)))
    n = int(rng.integers(1, 300))
    if case % 2:   # every set gets the same number of lookups (equal counts)
        per = max(1, n // sets)
        rows = (rng.integers(0, 20, (per, sets)) * sets + np.arange(sets)).ravel()
        rng.shuffle(rows)
    else:
        rows = rng.integers(0, int(rng.integers(1, 40)), n)
    writes = rng.random(len(rows)) < 0.3
    fast = simulate_trace(rows, cfg, writes)
    hits, counters = _reference_hits(cfg, rows, writes)
    assert np.array_equal(fast.hits, hits)
    assert (fast.evictions, fast.writebacks) == (counters["evictions"], counters["writebacks"])


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_fast_model_on_300_lookups_over_4_sets_with_uneven_counts(policy):
    # 4 sets of 100, 100, 60 and 40 lookups: two sets end before the others.
    rows = np.concatenate([np.repeat([0, 4, 8], 34)[:100], np.repeat([1, 5], 50),
                           np.tile([2, 6, 10], 20), np.tile([3, 7], 20)])
    rows = np.random.default_rng(3).permutation(rows)
    cfg = CacheConfig(sets=4, ways=2, policy=policy, lfu_bits=2)
    hits, _ = _reference_hits(cfg, rows, np.zeros(len(rows), bool))
    assert np.array_equal(simulate_trace(rows, cfg).hits, hits)
