"""host.traces: trace format, generators (Zipf and fitted to locality statistics), .npz files."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

from neonic.host import traces as tr

STATS_FILE = tr.PUBLISHED_LOCALITY_STATS
SHARED_STATS_FILE = Path(__file__).resolve().parents[2].parent / "shared/data/dlrm_datasets_2021_locality_stats.txt"
needs_stats = pytest.mark.skipif(not STATS_FILE.exists(), reason=f"{STATS_FILE} not present")


def test_the_shipped_statistics_are_the_published_ones():
    if not SHARED_STATS_FILE.exists():
        pytest.skip(f"{SHARED_STATS_FILE} not beside the checkout")
    assert STATS_FILE.read_bytes() == SHARED_STATS_FILE.read_bytes()


def small_trace() -> tr.Trace:
    return tr.Trace.from_combined(num_rows=[10, 5], batch_size=3,
                                  lengths=[2, 0, 1, 1, 1, 2],
                                  indices=[3, 3, 9, 0, 4, 4, 1])


# ------------------------------------------------------------------------------ the format
def test_trace_combined_form_round_trips():
    t = small_trace()
    assert t.num_tables == 2 and t.lookups == 7
    assert list(t.tables[0].indices) == [3, 3, 9] and list(t.tables[1].lengths) == [1, 1, 2]
    assert list(t.tables[1].offsets) == [0, 1, 2, 4]
    num_rows, lengths, indices = t.combined()
    again = tr.Trace.from_combined(num_rows, 3, lengths, indices)
    assert all(np.array_equal(a.indices, b.indices) for a, b in zip(t.tables, again.tables))


@pytest.mark.parametrize("kwargs,field", [
    (dict(num_rows=[10], batch_size=2, lengths=[1, 1, 1], indices=[0, 0, 0]), "lengths"),
    (dict(num_rows=[10], batch_size=2, lengths=[1, 2], indices=[0, 0]), "indices"),
    (dict(num_rows=[10], batch_size=2, lengths=[1, 1], indices=[0, 10]), "indices"),
    (dict(num_rows=[10], batch_size=2, lengths=[1, 1], indices=[-1, 0]), "indices"),
    (dict(num_rows=[10], batch_size=2, lengths=[-1, 3], indices=[0, 0]), "lengths"),
    (dict(num_rows=[0], batch_size=1, lengths=[0], indices=[]), "num_rows"),
    (dict(num_rows=[10], batch_size=0, lengths=[], indices=[]), "batch_size"),
    (dict(num_rows=[10], batch_size=1, lengths=[1.0], indices=[0]), "lengths"),
])
def test_trace_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field}:"):
        tr.Trace.from_combined(**kwargs)


def test_trace_locality_counts_rows_per_table():
    # Table 0: row 3 twice, row 9 once; table 1: row 0 once, row 4 twice, row 1 once.
    # (Row 3 of table 0 and row 4 of table 1 are different rows.)
    s = tr.trace_locality(small_trace())
    assert (s.lookups, s.unique) == (7, 5)
    assert np.allclose(s.row_hist[:3], [3 / 5, 2 / 5, 0])
    assert np.allclose(s.lookup_share[:3], [3 / 7, 4 / 7, 0])


# ---------------------------------------------------------------------------------- Zipf
@pytest.mark.parametrize("alpha", [1.05, 1.15])
def test_zipf_rank_frequency_slope_is_alpha(alpha):
    gen = tr.ZipfTraceGenerator(num_tables=1, num_rows=100_000, batch_size=50_000, pooling=20,
                                alpha=alpha)
    trace = gen.generate(np.random.default_rng(7))
    counts = np.bincount(trace.tables[0].indices, minlength=gen.num_rows)
    freq = np.sort(counts)[::-1][:300].astype(float)
    slope = np.polyfit(np.log(np.arange(1, 301)), np.log(freq), 1)[0]
    assert abs(slope + alpha) < 0.05, slope
    # The hottest rows are scattered over the table, not packed at ids 0..k.
    hottest = np.argsort(counts)[::-1][:100]
    assert hottest.max() > 0.5 * gen.num_rows and np.ptp(np.sort(hottest)[:50]) > 1000


def test_zipf_ranks_follow_the_discrete_law_across_head_and_tail():
    rows, alpha = 1_000_000, 1.05                      # beyond the exact 65536-rank head
    ranks = tr.zipf_ranks(np.random.default_rng(3), 1_000_000, rows, alpha)
    assert ranks.min() >= 0 and ranks.max() < rows
    weights = np.arange(1, rows + 1, dtype=float) ** -alpha
    edges = np.unique(np.geomspace(1, rows, 40).astype(int)) - 1
    edges[-1] = rows
    want = np.add.reduceat(weights, edges[:-1]) / weights.sum()
    got = np.histogram(ranks, bins=edges)[0] / ranks.size
    assert tr.total_variation(got, want) < 0.01


def test_zipf_pooling_distributions():
    rng = np.random.default_rng(5)
    const = tr.ZipfTraceGenerator(num_tables=3, num_rows=1000, batch_size=64, pooling=7)
    t = const.generate(rng)
    assert all((x.lengths == 7).all() for x in t.tables) and t.lookups == 3 * 64 * 7
    logn = tr.ZipfTraceGenerator(num_tables=2, num_rows=1000, batch_size=4000, pooling=20,
                                 pooling_distribution="lognormal", pooling_sigma=0.5)
    lengths = logn.generate(rng).combined()[1]
    assert abs(lengths.mean() - 20) < 1.0 and lengths.std() > 5


@pytest.mark.parametrize("kwargs,field", [
    (dict(num_tables=0), "num_tables"), (dict(num_rows=0), "num_rows"),
    (dict(alpha=-1.0), "alpha"), (dict(pooling_distribution="zipf"), "pooling_distribution"),
    (dict(batch_size=1.5), "batch_size"),
])
def test_zipf_generator_refuses_bad_parameters(kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field}:"):
        tr.ZipfTraceGenerator(**kwargs)


def test_generators_are_deterministic_for_a_seed():
    gen = tr.ZipfTraceGenerator(num_tables=4, num_rows=5000, batch_size=128, pooling=10,
                                pooling_distribution="poisson")
    a, b = gen.generate(np.random.default_rng(11)), gen.generate(np.random.default_rng(11))
    c = gen.generate(np.random.default_rng(12))
    assert np.array_equal(a.combined()[2], b.combined()[2])
    assert np.array_equal(a.combined()[1], b.combined()[1])
    assert not np.array_equal(a.combined()[2][:1000], c.combined()[2][:1000])
    with pytest.raises(ValueError, match="^rng:"):
        gen.generate(11)


def test_permute_rows_is_a_bijection():
    key = np.random.default_rng(0).integers(0, 2 ** 63, 4, dtype=np.uint64)
    for n in (1, 2, 3, 7, 1000, 65537):
        assert np.array_equal(np.sort(tr.permute_rows(np.arange(n), n, key)), np.arange(n))


# ------------------------------------------------------------------- locality statistics
@needs_stats
def test_stats_file_parses_every_block():
    blocks = tr.load_locality_stats(STATS_FILE)
    assert len(blocks) == 17
    first = blocks[0]
    assert first.name == "fbgemm_t856_bs65536.pt" and first.batch_size == 65536
    assert (first.lookups, first.unique) == (887017990, 128435723)
    assert first.row_hist[0] == 0.473 and first.lookup_share[-1] == 0.019
    assert abs(first.mean_reuse - 6.9) < 0.05
    for b in blocks:
        assert abs(b.row_hist.sum() - 1) < 0.012 and abs(b.lookup_share.sum() - 1) < 0.012
    assert tr.load_locality_stats(STATS_FILE, "fbgemm_t856_bs65536_3.pt").name.endswith("_3.pt")
    assert tr.load_locality_stats(STATS_FILE, -1).name == blocks[-1].name
    with pytest.raises(ValueError, match="^block:"):
        tr.load_locality_stats(STATS_FILE, "nope.pt")


@needs_stats
@pytest.mark.parametrize("edit,line,what", [
    (lambda ls: ls.__setitem__(2, "Avg # of indices: lots"), 3, "Avg # of indices"),
    (lambda ls: ls.__setitem__(8, "(1, 2]: 1.5"), 9, "fraction"),
    (lambda ls: ls.__setitem__(9, "(2, 5]: 0.139"), 10, r"\(4, 8\]"),
    (lambda ls: ls.__setitem__(6, "(0, 1]: 0.973"), 23, "add up to 1"),
    (lambda ls: ls.__setitem__(24, "['0.000', '0.473', '0.7']"), 25, "cumulative"),
    (lambda ls: ls.__setitem__(4, "Avg col size: 9.9"), 5, "Avg col size"),
    (lambda ls: ls.__setitem__(3, "Avg # of unique cols: 987017990"), 3, "unique"),
    (lambda ls: ls.__delitem__(slice(30, None)), 31, "end of file"),
    (lambda ls: ls.__setitem__(1, "Locality stats, all batches"), 2, "Locality stats"),
])
def test_malformed_stats_name_the_line(tmp_path, edit, line, what):
    lines = STATS_FILE.read_text().splitlines()
    edit(lines)
    bad = tmp_path / "stats.txt"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=rf"stats\.txt:{line}: .*{what}"):
        tr.load_locality_stats(bad)


def test_stats_file_errors(tmp_path):
    with pytest.raises(ValueError, match="cannot read"):
        tr.load_locality_stats(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(ValueError, match="no"):
        tr.load_locality_stats(tmp_path / "empty.txt")


# ------------------------------------------------------------------------- the fitted fit
@needs_stats
@pytest.mark.parametrize("block", [0, 1, 8, 16])
def test_fitted_trace_reproduces_both_histograms(block):
    stats = tr.load_locality_stats(STATS_FILE, block)
    gen = tr.fit_generator(stats)                   # 2**20 lookups
    trace = gen.generate(np.random.default_rng(block))
    got = tr.trace_locality(trace)
    row_tv = tr.total_variation(got.row_hist, stats.row_hist)
    share_tv = tr.total_variation(got.lookup_share, stats.lookup_share)
    assert row_tv <= 0.05 and share_tv <= 0.05, (row_tv, share_tv)
    # The plan predicts the measured distances exactly (counts are realised as planned).
    assert np.isclose(row_tv, gen.plan.row_hist_tv) and np.isclose(share_tv,
                                                                  gen.plan.lookup_share_tv)
    assert abs(got.lookups / 2 ** 20 - 1) < 0.02
    assert abs(got.mean_reuse / stats.mean_reuse - 1) < 0.02
    assert trace.num_tables == gen.num_tables and trace.batch_size == gen.batch_size


@needs_stats
def test_fit_scaling_limits_are_reported():
    stats = tr.load_locality_stats(STATS_FILE, 0)
    small = tr.fit_generator(stats, lookups=100_000, num_tables=4, batch_size=64)
    # At 1e5 lookups the three top reuse bins (~7% of lookups) cannot hold a single row.
    assert small.plan.lookup_share_tv > 0.05
    trace = small.generate(np.random.default_rng(0))
    got = tr.trace_locality(trace)
    assert np.isclose(tr.total_variation(got.lookup_share, stats.lookup_share),
                      small.plan.lookup_share_tv)
    assert tr.fit_generator(stats, lookups=400_000).plan.lookup_share_tv <= 0.05


def test_fit_generator_refuses_bad_parameters():
    stats = tr.parse_locality_stats(_minimal_stats_text())[0]
    with pytest.raises(ValueError, match="^lookups:"):
        tr.fit_generator(stats, lookups=0)
    with pytest.raises(ValueError, match="^rows_per_table:"):
        tr.fit_generator(stats, lookups=10_000, rows_per_table=3)
    with pytest.raises(ValueError, match="^stats:"):
        tr.LocalityTraceGenerator("stats")


def _minimal_stats_text() -> str:
    bins = [f"({lo}, {hi}]" for lo, hi in zip(tr.REUSE_BIN_LOWER, tr.REUSE_BIN_LOWER[1:])]
    bins.append("(32768+")
    def hist(values):
        cum = np.concatenate([[0], np.cumsum(values)])
        return ([f"{b}: {v:.3f}" for b, v in zip(bins, values)]
                + [str(list(tr.REUSE_BIN_LOWER)), str([f"{c:.3f}" for c in cum])])
    rows = [0.5, 0.0, 0.5] + [0.0] * 14           # half the rows touched once, half 3 times
    share = [0.25, 0.0, 0.75] + [0.0] * 14
    return "\n".join(["tiny.pt", "Locality stats after processing 1 batches of size 4",
                      "Avg # of indices: 4000", "Avg # of unique cols: 2000", "Avg col size: 2.0",
                      "Histogram of col sizes:", *hist(rows),
                      "Ratio of index distribution at different column sizes:", *hist(share)])


def test_fitted_generator_is_deterministic_for_a_seed():
    stats = tr.parse_locality_stats(_minimal_stats_text())[0]
    gen = tr.fit_generator(stats, lookups=4000, num_tables=3, batch_size=16)
    a, b, c = (gen.generate(np.random.default_rng(s)) for s in (5, 5, 6))
    assert all(np.array_equal(x, y) for x, y in zip(a.combined(), b.combined()))
    assert not np.array_equal(a.combined()[2], c.combined()[2])


def test_fit_of_a_tiny_distribution_is_exact():
    stats = tr.parse_locality_stats(_minimal_stats_text())[0]
    gen = tr.fit_generator(stats, lookups=4000, num_tables=2, batch_size=10)
    trace = gen.generate(np.random.default_rng(1))
    got = tr.trace_locality(trace)
    assert (got.lookups, got.unique) == (4000, 2000)
    assert got.row_hist[0] == 0.5 and got.row_hist[2] == 0.5 and got.lookup_share[2] == 0.75
    counts = np.unique(np.concatenate([t.indices + 10 ** 6 * i
                                       for i, t in enumerate(trace.tables)]),
                       return_counts=True)[1]
    assert sorted(set(counts)) == [1, 3]           # the (2, 4] bin's mean is exactly 3


# ---------------------------------------------------------------------------- .npz files
def test_save_load_round_trip(tmp_path):
    trace = tr.ZipfTraceGenerator(num_tables=3, num_rows=777, batch_size=16, pooling=5,
                                  pooling_distribution="poisson").generate(
        np.random.default_rng(2))
    path = tr.save_trace(trace, tmp_path / "t.npz")
    back = tr.load_trace(path)
    assert back.batch_size == trace.batch_size
    for a, b in zip(trace.combined(), back.combined()):
        assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="^path:"):
        tr.save_trace(trace, tmp_path / "t.pkl")


def _write_npz(path: Path, **arrays) -> Path:
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return path


def _good_fields() -> dict:
    return dict(version=np.int64(tr.TRACE_FORMAT_VERSION), batch_size=np.int64(2),
                num_rows=np.array([8]), lengths=np.array([1, 2]), indices=np.array([0, 7, 3]))


@pytest.mark.parametrize("change,field", [
    (dict(indices=None), "'indices' is missing"),
    (dict(version=None), "'version' is missing"),
    (dict(version=np.int64(99)), "'version': expected 1"),
    (dict(batch_size=np.array([2, 2])), "'batch_size': expected an integer scalar"),
    (dict(lengths=np.array([1, 1])), "indices: expected sum\\(lengths\\) = 2"),
    (dict(lengths=np.array([1, 1, 1])), "lengths: expected num_tables \\* batch_size"),
    (dict(indices=np.array([0, 8, 3])), "indices: expected row indices in \\[0, num_rows\\[0\\] = 8\\)"),
    (dict(lengths=np.array(["a", "b"])), "lengths: expected a 1-D integer array"),
    (dict(lengths=np.array([1, None], dtype=object)), "'lengths' cannot be read"),
])
def test_malformed_trace_files_name_file_and_field(tmp_path, change, field):
    fields = _good_fields()
    for k, v in change.items():
        if v is None:
            del fields[k]
        else:
            fields[k] = v
    path = _write_npz(tmp_path / "bad.npz", **fields)
    with pytest.raises(ValueError, match=rf"bad\.npz: .*{field}"):
        tr.load_trace(path)


def test_truncated_and_foreign_files(tmp_path):
    good = tr.save_trace(tr.Trace.from_combined([8], 2, [1, 2], [0, 7, 3]), tmp_path / "ok.npz")
    assert tr.load_trace(good).lookups == 3
    data = good.read_bytes()
    for cut in (10, len(data) // 2, len(data) - 30):
        part = tmp_path / f"cut{cut}.npz"
        part.write_bytes(data[:cut])
        with pytest.raises(ValueError, match=rf"cut{cut}\.npz: "):
            tr.load_trace(part)
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip at all" * 10)
    with pytest.raises(ValueError, match=r"junk\.npz: not a readable \.npz trace"):
        tr.load_trace(junk)
    with pytest.raises(ValueError, match=r"missing\.npz: not a readable"):
        tr.load_trace(tmp_path / "missing.npz")
    # A damaged member inside an intact archive directory.
    zipped = tmp_path / "flip.npz"
    raw = bytearray(data)
    with zipfile.ZipFile(good) as z:
        info = z.getinfo("indices.npy")
    raw[info.header_offset + 30 + len(info.filename) + 20] ^= 0xFF
    zipped.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"flip\.npz: "):
        tr.load_trace(zipped)


def test_generation_is_fast_enough():
    import time
    gen = tr.ZipfTraceGenerator(num_tables=32, num_rows=1_000_000, batch_size=2048, pooling=16)
    start = time.perf_counter()
    trace = gen.generate(np.random.default_rng(0))
    assert trace.lookups == 2 ** 20
    assert time.perf_counter() - start < 5.0      # ~0.5 s here; generous for a loaded machine
