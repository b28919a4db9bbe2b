"""Max-min fair rates: textbook cases, weights, and the compiled solver equals the numpy one."""

from __future__ import annotations

import numpy as np
import pytest

from neonic.sim.network.maxmin import HAVE_NUMBA, LinkEntries, link_levels, maxmin_rates, maxmin_rates_fast

SOLVERS = [maxmin_rates] + ([maxmin_rates_fast] if HAVE_NUMBA else [])


def _problem(paths, caps, factors=None, wire=None):
    L = len(caps)
    H = max(len(p) for p in paths)
    links = np.full((H, len(paths)), L, dtype=np.int32)
    for f, p in enumerate(paths):
        links[: len(p), f] = p
    cap = np.array(list(caps) + [np.inf], dtype=float)
    fac = np.ones(len(paths)) if factors is None else np.asarray(factors, dtype=float)
    w = np.zeros(L + 1, dtype=bool) if wire is None else np.array(list(wire) + [False])
    return links, fac, w, cap


@pytest.mark.parametrize("solve", SOLVERS)
def test_textbook_two_links(solve):
    # link 0 (cap 1): f0, f1; link 1 (cap 2): f1, f2.  f0 = f1 = 0.5; f2 takes the rest: 1.5
    r = solve(*_problem([[0], [0, 1], [1]], [1.0, 2.0]))
    np.testing.assert_allclose(r, [0.5, 0.5, 1.5])


@pytest.mark.parametrize("solve", SOLVERS)
def test_chain_of_bottlenecks(solve):
    # link caps 1, 3, 10; f0 on 0; f1 on 0,1; f2 on 1,2; f3 on 2; f4 on 1
    # level 1: link 0 -> f0 = f1 = 0.5; link 1 has 2.5 left for f2, f4 -> 1.25; f3 gets 10 - 1.25
    r = solve(*_problem([[0], [0, 1], [1, 2], [2], [1]], [1.0, 3.0, 10.0]))
    np.testing.assert_allclose(r, [0.5, 0.5, 1.25, 8.75, 1.25])


@pytest.mark.parametrize("solve", SOLVERS)
def test_framing_weights_on_wire_links(solve):
    # two flows on a wire link of capacity 2 with factor 1.25: each gets 2 / (2 * 1.25) = 0.8
    r = solve(*_problem([[0], [0]], [2.0], factors=[1.25, 1.25], wire=[True]))
    np.testing.assert_allclose(r, [0.8, 0.8])
    # the same factor is ignored on a non-wire link
    r = solve(*_problem([[0], [0]], [2.0], factors=[1.25, 1.25], wire=[False]))
    np.testing.assert_allclose(r, [1.0, 1.0])


@pytest.mark.parametrize("solve", SOLVERS)
def test_alive_mask_and_infinite_links(solve):
    links, fac, w, cap = _problem([[0], [0], [0], []], [3.0])
    alive = np.array([True, False, True, True])
    r = solve(links, fac, w, cap, alive=alive)
    assert r[0] == pytest.approx(1.5) and r[2] == pytest.approx(1.5) and r[1] == 0 and np.isinf(r[3])


def _check_maxmin(links, fac, w, cap, r):
    """Feasible, and every flow has a saturated link where it is among the fastest."""
    L = cap.size
    load = np.zeros(L)
    for h in range(links.shape[0]):
        load += np.bincount(links[h], np.where(w[links[h]], fac, 1.0) * r, minlength=L)
    fin = np.isfinite(cap)
    assert np.all(load[fin] <= cap[fin] * (1 + 1e-9))
    saturated = load >= cap * (1 - 1e-9)
    fastest = np.zeros(L)
    for h in range(links.shape[0]):
        np.maximum.at(fastest, links[h], r)
    for f in range(r.size):
        ok = [saturated[k] and r[f] >= fastest[k] * (1 - 1e-9) for k in links[:, f] if k < L - 1]
        assert any(ok), f"flow {f} has no bottleneck"


def test_random_instances_satisfy_the_max_min_definition_and_solvers_agree():
    rng = np.random.default_rng(7)
    for _ in range(20):
        L, F = 12, 60
        paths = [list(rng.choice(L, size=rng.integers(1, 4), replace=False)) for _ in range(F)]
        caps = rng.uniform(1, 10, L)
        prob = _problem(paths, caps, factors=rng.uniform(1, 1.1, F), wire=rng.random(L) < 0.5)
        r = maxmin_rates(*prob)
        _check_maxmin(*prob, r)
        if HAVE_NUMBA:
            np.testing.assert_allclose(maxmin_rates_fast(*prob), r, rtol=1e-9)


def test_link_entries_follow_finished_flows_and_a_second_flow_set():
    """The simulator's index (sim.network.maxmin.LinkEntries): dropping finished flows with
    kill() gives the rates of a solve over the live flows only, and solving two flow sets
    together (parts) gives the rates of one solve over their union."""
    from neonic.sim.network.maxmin import LinkEntries, link_levels, maxmin_rates_parts, rates_from_levels

    rng = np.random.default_rng(11)
    L, F = 15, 200
    paths = [list(rng.choice(L, size=rng.integers(1, 4), replace=False)) for _ in range(F)]
    links, fac, w, cap = _problem(paths, rng.uniform(1, 10, L), factors=rng.uniform(1, 1.1, F),
                                  wire=rng.random(L) < 0.5)
    links_fh = np.ascontiguousarray(links.T)
    index = LinkEntries(links_fh, fac, cap)
    alive = np.ones(F, dtype=bool)
    for _ in range(4):
        gone = rng.choice(np.flatnonzero(alive), 30, replace=False)
        alive[gone] = False
        index.kill(gone)
        level, order = link_levels(index, w, cap)
        r = rates_from_levels(links_fh, alive, level, order)
        ref = maxmin_rates(links, fac, w, cap, alive=alive)
        np.testing.assert_allclose(r[alive], ref[alive], rtol=1e-9)
        assert np.all(r[~alive] == 0)
    half = F // 2
    big_alive = np.ones(half, dtype=bool)
    big_alive[:10] = False
    ra, rb = maxmin_rates_parts(links_fh[:half], fac[:half], big_alive, None, links_fh[half:], fac[half:], w, cap)
    union = np.concatenate([big_alive, np.ones(F - half, dtype=bool)])
    ref = maxmin_rates(links, fac, w, cap, alive=union)
    np.testing.assert_allclose(np.concatenate([ra, rb])[union], ref[union], rtol=1e-9)


def test_dense_bipartite_filling_gives_the_sparse_levels_and_order():
    """``_fill_dense`` (flow (i, j) on link A[i] and link B[j], weight W[i, j], 0 for none)
    gives bit for bit the levels and processing order of the sparse filling of the same flows
    (each link's flows listed in increasing partner order), with finished flows, framing
    weights, exact ties (equal capacities and loads) and links that never saturate."""
    from neonic.sim.network.maxmin import _fill_dense

    rng = np.random.default_rng(7)
    nA, nB = 9, 7
    A = np.arange(nA) * 2  # interleaved link ids: ties are picked in link id order
    B = np.arange(nB) * 2 + 1
    L = 2 * max(nA, nB) + 1
    capacity = np.concatenate([np.where(np.arange(L - 1) % 5 == 0, 3.0, 1.0 + rng.random(L - 1)), [np.inf]])
    ia, jb = np.nonzero(rng.random((nA, nB)) < 0.8)  # flow order: by A link, then B link
    factor = np.where(rng.random(ia.size) < 0.5, 1.0, 1.0 + rng.random(ia.size) / 10)
    factor[: ia.size // 3] = 1.0  # many equal weights: exact ties
    alive = rng.random(ia.size) < 0.85
    links = np.stack([A[ia], B[jb]], axis=1).astype(np.int32)
    for w_a in (np.arange(L) < L - 1, np.zeros(L, dtype=bool)):  # framed links, or none
        idx = LinkEntries(links, factor, capacity)
        idx.set_alive(alive)
        level, order = link_levels(idx, w_a, capacity)
        W = np.zeros((nA, nB))
        W[ia[alive], jb[alive]] = np.where(w_a[A[ia]], factor, 1.0)[alive]
        lv, od = _fill_dense(W, np.ascontiguousarray(W.T), A, B, capacity)
        np.testing.assert_array_equal(lv, np.concatenate([level[A], level[B]]))
        np.testing.assert_array_equal(od, np.concatenate([order[A], order[B]]))
        assert np.isfinite(lv).sum() >= 2


@pytest.mark.parametrize("virtual", [False, True])
def test_dense_sets_inside_the_sparse_filling_give_its_levels_and_order(virtual):
    """Flows given as weight matrices beside entries (``link_levels(dense=...)``: flow (i, j)
    of a matrix on links a0 + i and b0 + j, the indexes without entries there) fill bit for
    bit as the same flows given as entries: two flow sets each with a matrix and sparse flows
    of their own, exact ties, framing weights, finished flows. ``virtual``: every flow also
    crosses a per-source and a per-destination link (a GPU's caps), which the sparse flows
    share with the matrices' flows and whose entries stay sparse (one index, both matrices
    its own, the dense links skipped)."""
    rng = np.random.default_rng(11)
    nA, nB, S = 6, 5, 7
    a0, b0, s0 = 0, nA, nA + nB
    v0 = s0 + S  # virtual links: one per row, then one per column
    L = v0 + nA + nB + 1
    pad = L  # the scratch link of padded hops (capacity inf)
    capacity = np.concatenate([np.where(np.arange(L) % 4 == 0, 2.0, 1.0 + rng.random(L)), [np.inf]])
    wire = np.arange(L + 1) < s0  # the matrices' links framed, the others not
    sets = []
    for k in range(2):
        ia, jb = np.nonzero(rng.random((nA, nB)) < 0.8)
        dense = np.stack([a0 + ia, b0 + jb], axis=1)
        sp = s0 + rng.integers(0, S, (9, 2))
        sp[:, 1] = np.where(sp[:, 1] == sp[:, 0], pad, sp[:, 1])
        if virtual:  # the sparse flows start at rows' / end at columns' GPUs too
            r, c = rng.integers(0, nA, 9), rng.integers(0, nB, 9)
            sp = np.concatenate([sp, (v0 + r)[:, None], (v0 + nA + c)[:, None]], axis=1)
            dense = np.concatenate([dense, (v0 + ia)[:, None], (v0 + nA + jb)[:, None]], axis=1)
        at = np.sort(rng.choice(ia.size + 9, 9, replace=False))  # sparse flows among the dense ones
        is_sp = np.zeros(ia.size + 9, dtype=bool)
        is_sp[at] = True
        links = np.empty((ia.size + 9, dense.shape[1]), dtype=np.int32)
        links[is_sp], links[~is_sp] = sp, dense
        factor = np.where(rng.random(links.shape[0]) < 0.5, 1.0, 1.0 + rng.random(links.shape[0]) / 10)
        alive = rng.random(links.shape[0]) < 0.85
        W = np.zeros((1, nA, nB))
        W[0, ia[alive[~is_sp]], jb[alive[~is_sp]]] = factor[~is_sp][alive[~is_sp]]
        sets.append((links, factor, alive, W, np.ascontiguousarray(W.transpose(0, 2, 1))))
    skip = np.zeros(L + 1, dtype=bool)
    skip[a0:a0 + nA] = skip[b0:b0 + nB] = True
    if virtual:
        links = np.concatenate([s[0] for s in sets])
        factor = np.concatenate([s[1] for s in sets])
        alive = np.concatenate([s[2] for s in sets])
        ref = LinkEntries(links, factor, capacity)
        ref.set_alive(alive)
        level, order = link_levels(ref, wire, capacity)
        idx = LinkEntries(links, factor, capacity, skip=skip)
        idx.set_alive(alive)
        va, vb = v0 + np.arange(nA), v0 + nA + np.arange(nB)
        lv, od = link_levels(idx, wire, capacity,
                             dense=(sets[0][3], sets[0][4], sets[1][3], sets[1][4], a0, b0, va, vb))
    else:
        refs, idxs = [], []
        cap_x = np.where(skip, np.inf, capacity)
        for links, factor, alive, _, _ in sets:
            refs.append(LinkEntries(links, factor, capacity))
            idxs.append(LinkEntries(links, factor, cap_x))
            for i in (refs[-1], idxs[-1]):
                i.set_alive(alive)
        level, order = link_levels(refs[0], wire, capacity, other=refs[1])
        lv, od = link_levels(idxs[0], wire, capacity, other=idxs[1],
                             dense=(sets[0][3], sets[0][4], sets[1][3], sets[1][4], a0, b0))
    np.testing.assert_array_equal(lv, level)
    np.testing.assert_array_equal(od, order)
    assert np.isfinite(level[a0:b0 + nB]).sum() >= 2 and np.isfinite(level[s0:]).sum() >= 1


def _sequential_sum(x: np.ndarray) -> float:
    """Left to right from 0.0 (a cumulative sum is sequential)."""
    return float(np.cumsum(np.concatenate([[0.0], x]))[-1])


@pytest.mark.parametrize("joint", [False, True])
def test_dense_loads_sum_each_links_flows_in_order(joint):
    """``_dense_loads``: each link's load is its flows' weights added left to right from 0.0, a
    row link's in column order (per matrix set, then added; ``joint``: one running sum over both
    sets), a column link's in row order; its count the positive weights. Weights spread over
    many magnitudes, so another order gives other bits."""
    from neonic.sim.network.maxmin import _dense_loads

    rng = np.random.default_rng(5)
    nA, nB, a0, b0 = 13, 11, 2, 20
    sets = []
    for k in (2, 1):
        W = rng.random((k, nA, nB)) * 10.0 ** rng.integers(-8, 9, (k, nA, nB))
        W[rng.random(W.shape) < 0.2] = 0.0
        sets.append((W, np.ascontiguousarray(W.transpose(0, 2, 1))))
    (Wa, WTa), (Wb, WTb) = sets
    load = np.zeros(40)
    count = np.zeros(40, dtype=np.int64)
    _dense_loads(Wa, WTa, Wb, WTb, load, count, a0, b0, nA, nB, joint)
    for side, (n, base) in enumerate(((nA, a0), (nB, b0))):
        for r in range(n):
            parts = [(M[:, r, :] if side == 0 else M[:, :, r]).ravel() for M in (Wa, Wb)]
            want = (_sequential_sum(np.concatenate(parts)) if joint
                    else 0.0 + _sequential_sum(parts[0]) + _sequential_sum(parts[1]))
            assert load[base + r] == want
            assert count[base + r] == sum(int((p > 0).sum()) for p in parts)
    assert not load[:a0].any() and not load[a0 + nA:b0].any() and not load[b0 + nB:].any()


@pytest.mark.parametrize("rows", [1, 8, 21])
def test_row_col_sums_add_each_row_and_column_in_order(rows):
    """``_row_col_sums`` (``_fill_dense``'s loads, one pass over W): row ``r``'s sum left to
    right from 0.0, column ``j``'s top to bottom, and their positive entries, for row counts
    below, at and past its blocks of eight; weights over many magnitudes."""
    from neonic.sim.network.maxmin import _row_col_sums

    rng = np.random.default_rng(rows)
    W = rng.random((rows, 13)) * 10.0 ** rng.integers(-8, 9, (rows, 13))
    W[rng.random(W.shape) < 0.2] = 0.0
    load = np.zeros(rows + 13 + 1)
    count = np.zeros(rows + 13 + 1, dtype=np.int64)
    _row_col_sums(W, load, count, rows)
    for r in range(rows):
        assert load[r] == _sequential_sum(W[r]) and count[r] == (W[r] > 0).sum()
    for j in range(13):
        assert load[rows + j] == _sequential_sum(W[:, j]) and count[rows + j] == (W[:, j] > 0).sum()
    assert load[-1] == 0.0 and count[-1] == 0
