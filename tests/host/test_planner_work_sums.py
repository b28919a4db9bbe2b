"""The iteration's AlltoAllv matrices and their per-rank aggregates without the dense formulas:
the sum of outer products where each entry has one term (:func:`_sum_terms`), and
:func:`matrix_aggregates` in one compiled pass, bit for bit the matrix product's and numpy's."""

import numpy as np
import pytest

from neonic.host.planner import work as W


def _matmul_sum(world, terms):
    """The dense specification: the outer products as matrix products, the pairs scattered."""
    m = np.zeros((world, world))
    outers = [t for t in terms if isinstance(t, W.Outer)]
    if outers:
        src = np.stack([t.src for t in outers]).astype(float)
        dst = np.stack([t.dst for t in outers]).astype(float)
        m += src.T @ dst
    for t in terms:
        if isinstance(t, W.Pairs):
            keep = t.src != t.dst
            np.add.at(m, (t.src[keep], t.dst[keep]), np.broadcast_to(t.nbytes, t.src.shape)[keep])
    np.fill_diagonal(m, 0.0)
    return m


def _onehot(world, rank, value):
    v = np.zeros(world)
    v[rank] = value
    return v


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint64)


@pytest.mark.parametrize("orient", ["cols", "rows"])
def test_one_term_per_rank_matches_the_matrix_product(orient):
    # a table per rank at most (what table-wise plans give at scale), uneven fractional sizes
    rng = np.random.default_rng(7)
    world = 96
    ranks = rng.permutation(world)[:70]
    terms = []
    for r in ranks:
        c = float(rng.uniform(1, 1e6)) / 3.0
        v = float(rng.uniform(1, 1e4)) / 7.0
        dense, sparse = np.ones(world) * c, _onehot(world, r, v)
        terms.append(W.Outer(dense, sparse) if orient == "cols" else W.Outer(sparse, dense))
    terms.append(W.Pairs(np.arange(world), (np.arange(world) + 3) % world, np.full(world, 1.5)))
    got = W._sum_terms(world, terms)
    assert np.array_equal(_bits(got), _bits(_matmul_sum(world, terms)))
    assert np.count_nonzero(got) > world  # the terms were not all dropped


def test_overlapping_terms_fall_back_to_the_matrix_product():
    rng = np.random.default_rng(3)
    world = 32
    terms = [W.Outer(rng.uniform(0, 5, world), rng.uniform(0, 5, world)) for _ in range(5)]
    m = np.zeros((world, world))
    assert not W._add_disjoint_outers(m, terms)
    assert not m.any()
    assert np.allclose(W._sum_terms(world, terms), _matmul_sum(world, terms))


def test_a_figure_not_finite_falls_back():
    world = 8
    t = W.Outer(np.full(world, np.inf), _onehot(world, 2, 1.0))
    assert not W._add_disjoint_outers(np.zeros((world, world)), [t])


def _aggregates_np(sizes, g):  # (kept apart from work._matrix_aggregates_np on purpose)
    """The dense specification of :func:`matrix_aggregates` (numpy's masked sums)."""
    sizes = np.asarray(sizes, dtype=float).copy()
    np.fill_diagonal(sizes, 0.0)
    node_of = np.arange(sizes.shape[0]) // g
    same = node_of[:, None] == node_of[None, :]
    return np.stack([(sizes * same).sum(axis=1), (sizes * ~same).sum(axis=1),
                     (sizes * same).sum(axis=0), (sizes * ~same).sum(axis=0)])


@pytest.mark.parametrize("world,g", [(4, 2), (16, 8), (40, 8), (136, 8), (300, 4), (520, 8)])
def test_matrix_aggregates_bit_for_bit(world, g):
    rng = np.random.default_rng(world)
    sizes = rng.uniform(0, 1e7, (world, world)) / 3.0
    sizes[rng.uniform(size=sizes.shape) < 0.3] = 0.0
    got = W.matrix_aggregates(sizes, g)
    assert got.shape == (4, world)
    assert np.array_equal(_bits(got), _bits(_aggregates_np(sizes, g)))
    # integer input is taken as floats, the input left as it was
    ints = rng.integers(0, 1000, (world, world))
    before = ints.copy()
    assert np.array_equal(_bits(W.matrix_aggregates(ints, g)), _bits(_aggregates_np(ints, g)))
    assert np.array_equal(ints, before)


@pytest.mark.parametrize("g", [1, 3, 8, 16, 128, 200])
def test_node_sums_are_numpys_sums_of_each_node(g):
    # each node's figures summed as numpy sums them (the inlined block below 129 terms, the
    # pairwise recursion above), signed zeros and magnitudes that round differently by order
    rng = np.random.default_rng(g)
    nodes = 5
    a = rng.standard_normal(nodes * g) * 10.0 ** rng.integers(-8, 9, nodes * g)
    a[::7] = -0.0
    out = np.full(nodes, np.nan)
    W.node_sums(a, g, out)
    want = np.array([a[k * g:(k + 1) * g].sum() for k in range(nodes)])
    assert _bits(out).tolist() == _bits(want).tolist()


def test_whole_number_terms_are_summed_exactly_as_the_matrix_product():
    # table-row-wise reduce-scatter's shape: 1.0 per shard of a node against whole bytes per
    # owner, terms overlapping in every entry of a node; negative figures and a cancelling pair
    # too (the sum is exact in any order, so it must equal the product bit for bit)
    rng = np.random.default_rng(11)
    world, g = 64, 8
    terms = []
    for k in range(300):
        node = int(rng.integers(0, world // g))
        src = np.zeros(world)
        src[node * g:(node + 1) * g] = 1.0
        dst = np.zeros(world)
        dst[node * g:(node + 1) * g] = rng.integers(-5, 5, g) * float(rng.integers(1, 1 << 30))
        terms.append(W.Outer(src, dst))
    terms.append(W.Outer(_onehot(world, 3, 2.0), _onehot(world, 45, 7.0)))
    terms.append(W.Outer(_onehot(world, 3, -2.0), _onehot(world, 45, 7.0)))  # cancels: +0.0
    src = np.stack([t.src for t in terms])
    dst = np.stack([t.dst for t in terms])
    m = np.zeros((world, world))
    assert W._add_whole_outers(m, src, dst)
    want = _matmul_sum(world, terms)
    got = W._sum_terms(world, terms)
    assert np.array_equal(_bits(got), _bits(want))
    assert _bits(got)[3, 45] == 0  # +0.0, not -0.0 (node blocks: 3 and 45 on different nodes)
    assert np.count_nonzero(got) > world


@pytest.mark.parametrize("case", ["fraction", "too large", "not finite", "dense"])
def test_terms_that_could_round_are_left_to_the_matrix_product(case):
    world = 16
    src = np.ones((3, world))
    dst = np.zeros((3, world))
    dst[:, 2] = 5.0
    if case == "fraction":
        dst[1, 2] = 0.5
    elif case == "too large":
        dst[1, 2] = 2.0 ** 53
    elif case == "not finite":
        dst[1, 2] = np.inf
    else:
        dst[:] = 3.0  # every product nonzero: the product is cheaper
    m = np.zeros((world, world))
    assert not W._add_whole_outers(m, src, dst)
    assert not m.any()


def test_pairs_are_added_in_add_ats_order():
    # repeated entries with figures whose sum depends on the order; transfers to oneself dropped
    rng = np.random.default_rng(5)
    world = 12
    terms = [W.Pairs(rng.integers(0, world, 400), rng.integers(0, world, 400),
                     rng.standard_normal(400) * 10.0 ** rng.integers(-6, 7, 400)) for _ in range(3)]
    terms.append(W.Pairs(np.arange(world), np.arange(world)[::-1].copy(), np.float64(1.0 / 3.0)))
    got = W._sum_terms(world, terms)
    assert np.array_equal(_bits(got), _bits(_matmul_sum(world, terms)))
    with pytest.raises(IndexError):
        W._sum_terms(world, [W.Pairs(np.array([0, -1]), np.array([1, 2]), np.ones(2))])
