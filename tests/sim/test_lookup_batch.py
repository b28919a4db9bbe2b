"""sim.lookups: the one lookup-batch type and the one Zipf generator."""

from __future__ import annotations

import numpy as np
import pytest

from neonic.sim.lookups import (LookupBatch, TableLookups, draw_lookups, permute_rows, zipf_ranks, zipf_rows,
                                zipf_table_lookups)


class T:
    def __init__(self, name, rows, pooling):
        self.name, self.rows, self.pooling = name, rows, pooling


def test_a_table_draws_the_same_lookups_for_a_seed_whatever_other_tables_exist():
    a = draw_lookups([T("x", 1000, 4), T("y", 50, 2)], world=4, batch_per_gpu=8, seed=7, alpha=1.15)
    b = draw_lookups([T("y", 50, 2)], world=4, batch_per_gpu=8, seed=7, alpha=1.15)
    assert not np.array_equal(a["y"].indices, b["y"].indices) or a["y"].indices.size == 0
    # a table is keyed by its index in the workload: same index, same draw
    c = draw_lookups([T("x", 1000, 4), T("y", 50, 2)], world=4, batch_per_gpu=8, seed=7, alpha=1.15)
    for name in ("x", "y"):
        assert np.array_equal(a[name].indices, c[name].indices)
        assert np.array_equal(a[name].lengths, c[name].lengths)
    d = draw_lookups([T("x", 1000, 4)], world=4, batch_per_gpu=8, seed=8, alpha=1.15)
    assert not np.array_equal(a["x"].indices, d["x"].indices)


def test_whole_batch_bags_belong_to_ranks_in_order_and_a_sample_spreads_over_them():
    full = zipf_table_lookups("t", 100, 3.0, index=0, world=4, batch_per_gpu=5, seed=1, alpha=1.1)
    assert full.bags == 20 and full.scale == 1.0
    assert list(full.requester) == [q for q in range(4) for _ in range(5)]
    part = zipf_table_lookups("t", 100, 3.0, index=0, world=4, batch_per_gpu=500, seed=1, alpha=1.1, max_bags=100)
    assert part.bags == 100 and part.scale == pytest.approx(20.0)
    assert np.bincount(part.requester).tolist() == [25, 25, 25, 25]
    assert part.source == "zipf(alpha=1.1)"


def test_zipf_rows_is_a_permuted_zipf_and_the_hottest_row_carries_the_first_rank_mass():
    rng = np.random.default_rng(3)
    key = np.array([1, 2, 3, 4], dtype=np.uint64)
    rows = zipf_rows(rng, 200_000, 10_000, 1.15, key=key)
    counts = np.bincount(rows, minlength=10_000)
    hottest = int(counts.argmax())
    assert hottest == int(permute_rows(np.array([0]), 10_000, key)[0])
    w = np.arange(1, 10_001) ** -1.15
    assert counts[hottest] / rows.size == pytest.approx(w[0] / w.sum(), rel=0.05)
    # ranks without the permutation follow the law directly
    r = zipf_ranks(np.random.default_rng(4), 100_000, 1000, 1.0)
    w = np.arange(1, 1001) ** -1.0
    assert np.mean(r == 0) == pytest.approx(w[0] / w.sum(), rel=0.05)


def test_select_gives_a_row_shards_view_of_chosen_bags_and_row_share_counts_lookups():
    tl = TableLookups("t", 10, np.array([2, 1, 3]), np.array([0, 9, 5, 1, 6, 9]), np.array([0, 0, 1]))
    lengths, rows = tl.select(np.array([True, False, True]), 5, 10)
    assert lengths.tolist() == [1, 2] and rows.tolist() == [4, 1, 4]
    assert tl.row_share([(0, 5), (5, 10)]).tolist() == pytest.approx([2 / 6, 4 / 6])
    with pytest.raises(ValueError, match="t.indices"):
        TableLookups("t", 4, np.array([1]), np.array([4]), np.array([0]))
    batch = LookupBatch(1, 3, 0, {"t": tl})
    assert batch.sources() == {"t": "zipf"} and batch.lookups == 6
    with pytest.raises(KeyError, match="no table 'u'"):
        batch["u"]
