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


# ------------------------------------------------------------- the fast draw is the same draw
def _digest(batch, fields=("lengths", "indices", "requester")) -> str:
    import hashlib

    h = hashlib.sha256()
    for t in batch.tables.values():
        for f in fields:
            h.update(np.ascontiguousarray(getattr(t, f)).tobytes())
    return h.hexdigest()[:16]


def test_the_draw_is_the_one_recorded_before_the_compiled_kernels_and_deferred_tables():
    # digests of the draw as it was made before this code (plain numpy, every table drawn at
    # once; neonic a441d0e): tables across the exact head (65536 ranks) and the continuous tail,
    # a one-row table, an empty one, a 2e9-row one; a sample and a whole batch; alpha 1
    tables = [T("a", 10_000_000, 20), T("b", 70_000, 3.5), T("c", 1, 2), T("d", 300, 0), T("e", 2_000_000_000, 8)]
    b = draw_lookups(tables, world=16, batch_per_gpu=64, seed=11, alpha=1.15, max_bags=512)
    assert (_digest(b), b.lookups) == ("77b0bf0a6c5b9836", 17146)
    b = draw_lookups([T("a", 10_000_000, 20), T("b", 5000, 3.5)], world=2, batch_per_gpu=300, seed=0, alpha=1.0)
    assert (_digest(b, ("lengths", "indices")), b.lookups) == ("f2c8dd9edaea3b18", 14059)
    # tables big enough for the compiled kernels (numba enabled)
    b = draw_lookups([T("a", 10_000_000, 40), T("b", 65_536, 30)], world=64, batch_per_gpu=32, seed=5, alpha=1.05)
    assert (_digest(b, ("lengths", "indices")), b.lookups) == ("c541154a097a9615", 143448)


@pytest.mark.parametrize("num_rows", [1, 2, 3, 100, 65_535, 65_536, 65_537, 10_000_019, 2_000_000_000])
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0, 1.15, 4.0])
def test_compiled_head_search_and_permutation_give_numpys_values(num_rows, alpha):
    from neonic.sim.lookups import _HEAD, _head_cdf, _permute, _zipf_ranks

    law = _head_cdf(min(num_rows, _HEAD), alpha)
    fast = _zipf_ranks(np.random.default_rng(5), 4_000, num_rows, alpha, law, compiled=True)
    ref = _zipf_ranks(np.random.default_rng(5), 4_000, num_rows, alpha, law, compiled=False)
    assert np.array_equal(fast, ref)
    key = np.random.default_rng(num_rows).integers(0, 2**63, 4, dtype=np.uint64)
    assert np.array_equal(_permute(ref, num_rows, key, compiled=True), _permute(ref, num_rows, key, compiled=False))


def test_head_search_lands_on_searchsorted_at_the_cdf_steps_and_guide_thresholds():
    # the values where an index changes: each cumulative weight, its neighbours, the guide's
    # bucket edges (a guess from u / step that rounds the wrong way must still be corrected)
    from neonic.sim.lookups import _head_cdf, _head_search

    law = _head_cdf(1 << 16, 1.15)
    edges = np.concatenate([law.cdf[:4096], law.cdf[-4096:], law.thresholds[:-1]])
    u = np.concatenate([edges, np.nextafter(edges, 0), np.nextafter(edges, np.inf), [0.0, law.cdf[-1], 7.0]])
    out = np.full(u.size, -1, dtype=np.int64)
    tail = _head_search(law.cdf, law.thresholds, law.guide, u, law.cdf[-1], out)
    head = u < law.cdf[-1]
    assert np.array_equal(tail, np.flatnonzero(~head)) and tail.size >= 3   # the tail's positions
    assert np.array_equal(out[head], np.searchsorted(law.cdf, u[head], side="right"))
    assert (out[~head] == -1).all()


def test_a_zipf_table_draws_on_first_read_and_reads_the_same_arrays_in_any_order():
    import pickle

    from neonic.host.planner.cache import fingerprint

    def make():
        return zipf_table_lookups("t", 1_000_000, 12.0, index=3, world=8, batch_per_gpu=64, seed=2, alpha=1.15,
                                  max_bags=200)
    a, b, c = make(), make(), make()
    # known without drawing: law, source, scale; the key of the planner's cache
    assert "indices" not in a.__dict__ and a.source == "zipf(alpha=1.15)" and a.scale == pytest.approx(512 / 200)
    key = fingerprint(a)
    assert "indices" not in a.__dict__ and "lengths" not in a.__dict__
    lengths_first = b.lengths.copy()        # lengths alone, then the rows
    assert "indices" not in b.__dict__
    indices = a.indices                     # rows (and lengths) at once
    assert np.array_equal(a.lengths, lengths_first) and np.array_equal(b.indices, indices)
    assert a.lengths.sum() == indices.size and a.bags == 200 and a.mean_pooling == indices.size / 200
    assert np.array_equal(c.requester, np.arange(200) * 8 // 200) and "indices" not in c.__dict__
    assert fingerprint(a) == key == fingerprint(c)  # read or not, the same key
    d = pickle.loads(pickle.dumps(c))
    assert np.array_equal(d.indices, indices)
    e = zipf_table_lookups("t", 1_000_000, 12.0, index=4, world=8, batch_per_gpu=64, seed=2, alpha=1.15, max_bags=200)
    assert fingerprint(e) != key
    with pytest.raises(AttributeError, match="nope"):
        a.nope
    # a row shard's share of a drawn table's lookups, from its sorted rows
    share = a.row_share([(0, 500_000), (500_000, 1_000_000)])
    assert share.tolist() == [np.mean(indices < 500_000), np.mean(indices >= 500_000)]


def test_the_tables_of_one_draw_share_a_head_law_per_alpha_and_head_size():
    b = draw_lookups([T("x", 1 << 20, 2), T("y", 1 << 21, 2), T("z", 100, 2)], world=2, batch_per_gpu=4, seed=0,
                     alpha=1.1)
    law = {n: b[n].__dict__["_draw"].law for n in "xyz"}
    assert law["x"] is law["y"] and law["z"] is not law["x"] and law["z"].cdf.size == 100
    # one read-only requester array for every table of the same bags
    assert b["x"].requester is b["z"].requester and not b["x"].requester.flags.writeable
    assert b["x"].requester.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
