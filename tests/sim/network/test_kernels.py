"""The network's compiled bookkeeping kernels (``sim.network._kernels``) against the numpy forms
they replace: the same permutations and the same bits."""

from __future__ import annotations

import numpy as np
import pytest

from neonic.sim.network import _kernels as K
from neonic.sim.network.maxmin import HAVE_NUMBA


def _values(rng: np.random.Generator, kind: int, n: int) -> np.ndarray:
    if kind == 0:  # bytes left: distinct positive values
        return rng.random(n) * 1e6
    if kind == 1:  # many ties, zeros among them
        return np.round(rng.random(n) * 10)
    if kind == 2:  # a wide range, zeros and infinities
        v = rng.lognormal(10.0, 3.0, n)
        v[rng.random(n) < 0.2] = 0.0
        v[rng.random(n) < 0.05] = np.inf
        return v
    if kind == 3:  # negatives: the mergesort's own path
        return rng.standard_normal(n)
    v = rng.random(n)  # -0.0 (equal to 0.0, other bits) and NaN: the mergesort's own path
    v[rng.random(n) < 0.1] = -0.0
    v[rng.random(n) < 0.1] = 0.0
    v[rng.random(n) < 0.05] = np.nan
    return v


@pytest.mark.parametrize("kind", range(5))
def test_stable_argsort_is_the_mergesort(kind):
    """``stable_argsort`` gives ``np.argsort(kind="mergesort")``'s permutation (stable: equal
    values in index order) on every kind of input, including empty and one-element arrays."""
    rng = np.random.default_rng(kind)
    for n in [0, 1, 2, 3, 255, 256, 257] + [int(x) for x in rng.integers(0, 2000, 40)]:
        v = _values(rng, kind, n)
        np.testing.assert_array_equal(K.stable_argsort(v), np.argsort(v, kind="mergesort"))


def test_stable_argsort_ties_keep_index_order():
    v = np.array([3.0, 1.0, 3.0, 0.0, 1.0, 0.0, 2.5e9, 3.0])
    assert K.stable_argsort(v).tolist() == [3, 5, 1, 4, 0, 2, 7, 6]


def _account_loop(done_cls, members, starts, links_fh, acct_fh, factor_f, wire, nbytes_f, link_bytes, link_wire):
    """The accounting's definition: class by class, flow by flow, its links then its accounted
    links, each one addition (padding: link id L)."""
    L = link_bytes.size
    for c in done_cls:
        for f in members[starts[c]:starts[c + 1]]:
            for k in list(links_fh[f]) + list(acct_fh[f]):
                if k < L:
                    link_bytes[k] += nbytes_f[f]
                    link_wire[k] += nbytes_f[f] * factor_f[f] if wire[k] else nbytes_f[f]


def test_account_adds_each_flows_bytes_in_flow_and_hop_order():
    """``account`` (finished classes' member flows onto their links and accounted links) gives
    the bits of one addition per flow and hop in class, flow and hop order, for classes of
    several flows, padded hops, framed and unframed links, and sizes over many magnitudes (so
    that another order would give other bits)."""
    rng = np.random.default_rng(3)
    F, L, C = 3000, 40, 1200
    cls = rng.integers(0, C, F)
    members = np.argsort(cls, kind="stable").astype(np.int64)
    starts = np.zeros(C + 1, dtype=np.int64)
    np.cumsum(np.bincount(cls, minlength=C), out=starts[1:])
    links = rng.integers(0, L + 1, (F, 3)).astype(np.int32)  # id L: padding
    acct = rng.integers(0, L + 1, (F, 2)).astype(np.int32)
    factor = 1.0 + rng.random(F) / 7
    wire = np.append(rng.random(L) < 0.5, False)  # (and the padding link's flag)
    nbytes = np.floor(10.0 ** rng.uniform(0, 9, F))
    done = np.sort(rng.choice(C, 700, replace=False)).astype(np.int64)
    got = np.full(L, 0.1), np.full(L, 0.3)
    want = np.full(L, 0.1), np.full(L, 0.3)
    K.account(done, members, starts, links, acct, factor, wire, nbytes, *got)
    _account_loop(done, members, starts, links, acct, factor, wire, nbytes, *want)
    for g, w in zip(got, want):
        if HAVE_NUMBA:  # (the numpy twin sums hop by hop: the same values within rounding)
            assert g.tobytes() == w.tobytes()
        np.testing.assert_allclose(g, w, rtol=1e-12)
    K.account(done[:0], members, starts, links, acct, factor, wire, nbytes, *got)  # nothing finished
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)


def test_finish_cls_gives_each_member_its_class_end_plus_its_latency():
    """``finish_cls``: every member flow of a finished class arrives at the class's predicted
    end rounded up to a picosecond plus the flow's own route latency (at its original index);
    the other flows keep their times."""
    rng = np.random.default_rng(4)
    F, C = 2000, 700
    cls = rng.integers(0, C, F)
    members = np.argsort(cls, kind="stable").astype(np.int64)
    starts = np.zeros(C + 1, dtype=np.int64)
    np.cumsum(np.bincount(cls, minlength=C), out=starts[1:])
    pred = rng.uniform(1e6, 1e9, C)
    lat = rng.integers(0, 10**6, F)
    orig = rng.permutation(F)
    done = np.sort(rng.choice(C, 300, replace=False)).astype(np.int64)
    got = np.full(F, -7, dtype=np.int64)
    K.finish_cls(done, pred, members, starts, lat, orig, got)
    want = np.full(F, -7, dtype=np.int64)
    for c in done:
        for f in members[starts[c]:starts[c + 1]]:
            want[orig[f]] = int(np.ceil(pred[c])) + lat[f]
    np.testing.assert_array_equal(got, want)


def _traffic_reference(firsts, bounds, seq, alive, rate, acc):
    """Each endpoint's class rates added one by one in flow order, dead classes skipped and
    non-finite rates as 0 (``_kernels._traffic_np``'s sums)."""
    for i, e in enumerate(firsts):
        for c in seq[bounds[i]:bounds[i + 1]]:
            if alive[c]:
                acc[e] += rate[c] if np.isfinite(rate[c]) else 0.0


@pytest.mark.parametrize("case", ["terms", "more_classes", "negative_zero"])
def test_traffic_firsts_branch_free_sums_are_the_skipping_sums(case):
    """``traffic_firsts`` (compiled: eight endpoints at a time, every class's term read from a
    table where a dead class adds 0.0) gives each endpoint the bits of adding its live classes'
    rates one by one, skipping the dead: endpoint counts not a multiple of eight, sequences of
    unequal and zero lengths, rates from 1e-12 to 1e2, infinities and NaN, more classes than
    terms (the plain loop), and a start of -0.0 (where adding 0.0 would give +0.0)."""
    rng = np.random.default_rng(["terms", "more_classes", "negative_zero"].index(case))
    E = 70
    C = 5000 if case == "more_classes" else 60
    for trial in range(20):
        alive = rng.random(C) < 0.7
        rate = rng.random(C) * 10.0 ** rng.integers(-12, 3, C)
        rate[rng.integers(0, C, 3)] = np.inf
        rate[rng.integers(0, C, 2)] = np.nan
        firsts = rng.permutation(E)[: int(rng.integers(1, E))]
        counts = rng.integers(0, 80, firsts.size)
        counts[rng.random(firsts.size) < 0.1] = 0
        bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        seq = rng.integers(0, C, bounds[-1]).astype(np.int32)
        start = rng.random(E) * (rng.random(E) < 0.7)
        if case == "negative_zero":  # an endpoint whose classes are all dead: its sum stays -0.0
            j = int(rng.integers(0, firsts.size))
            start[firsts[j]] = -0.0
            alive[seq[bounds[j]:bounds[j + 1]]] = False
        got = start.copy()
        K.traffic_firsts(firsts, bounds, seq, alive, rate, got)
        want = start.copy()
        _traffic_reference(firsts, bounds, seq, alive, rate, want)
        assert np.array_equal(got.view(np.int64), want.view(np.int64)), trial


def _disjoint_numpy(lt, wt, capacity, alive, tol):
    """``Network._disjoint_rates``'s numpy form: (tie, least shares of the live flows, 0 else)."""
    share = capacity[lt] / wt
    m = share.min(axis=0)
    s = np.sort(m[alive])
    lo, hi = s[:-1], s[1:]
    return bool(((hi > lo) & (hi <= lo * (1.0 + tol))).any()), np.where(alive, m, 0.0)


@pytest.mark.parametrize("case", range(8))
def test_disjoint_shares_are_the_numpy_least_shares_and_tie_check(case):
    """Each flow's least share over its hops (unlimited links, zero capacities, framed weights,
    dead flows, NaN capacities) and the tie check between distinct sorted shares: the same bits
    and the same answer as the numpy form, with and without near ties, whether the shares take
    a few values (the distinct ones sorted alone), just over the kernel's table of them, or a
    thousand."""
    rng = np.random.default_rng(case)
    H, F, L = 1 + case % 3, 1024, 5000
    values = (5, 5, 33, 0)[case % 4]
    if values:  # a few distinct capacities (a ring step's shares take four or five values)
        capacity = rng.choice(np.append(rng.random(values - 2) * 1e11, [np.inf, 0.0]), L)
        wt = np.ones((H, F)) if values == 33 else np.where(rng.random((H, F)) < 0.5, 1.05, 1.0)  # (33: one over)
    else:
        capacity = rng.random(L) * 1e11
        capacity[rng.random(L) < 0.3] = np.inf
        capacity[rng.random(L) < 0.01] = 0.0
        wt = np.where(rng.random((H, F)) < 0.5, 1.0 + rng.random((H, F)) * 0.1, 1.0)
    if case in (5, 6):
        capacity[rng.random(L) < 0.01] = np.nan
    lt = rng.integers(0, L, (H, F))
    alive = rng.random(F) < 0.8
    tie_case = case in (1, 4)
    if tie_case:  # one share just above another: a tie the check must see
        capacity[lt[:, 0]] = 1e10
        lt[:, 1] = lt[:, 0]
        wt[:, 1] = wt[:, 0] * (1.0 - 1e-13)
        alive[:2] = True
    tie, rates = K.disjoint_shares(lt, wt, capacity, alive, 1e-12)
    want_tie, want = _disjoint_numpy(lt, wt, capacity, alive, 1e-12)
    assert tie == want_tie == tie_case
    np.testing.assert_array_equal(rates.view(np.int64), want.view(np.int64))


def _branchy_step(alive, rem, rate_old, dt, span, now, rate, pred, coalesce, youngest):
    """The compiled ``step``'s one-class-at-a-time loop without link levels, in plain Python
    (IEEE doubles either way): drain, credit, predict each live class; the earliest end (NaN
    ignored), the latest (NaN if any), and the candidates within the final bound."""
    def bound_of(t):
        if not np.isfinite(t):
            return np.inf
        return max(np.ceil(t + coalesce * max(t - youngest, 0.0)), now + 1.0)

    t_min, t_max, cand = np.inf, -np.inf, []
    with np.errstate(divide="ignore", invalid="ignore"):
        for c in range(alive.size):
            if not alive[c]:
                pred[c] = np.inf
                continue
            r, old, new = rem[c], rate_old[c], rate[c]
            if dt != 0:
                r = max(r - old * dt, 0.0) if r - old * dt > 0.0 else 0.0
            if span > 0.0 and new - old > 0.0:
                r = r - (new - old) * span
                r = r if r > 0.0 else 0.0
            rem[c] = r
            p = now + r / new
            pred[c] = p
            if p < t_min:
                t_min = p
            if p > t_max or p != p:
                t_max = p
            cand.append(c)
    b = bound_of(t_min)
    return t_min, t_max, np.array([c for c in cand if pred[c] <= b], dtype=np.int64)


@pytest.mark.parametrize("case", range(6))
def test_branch_free_step_with_given_rates_is_the_branchy_step(case):
    """``_step_given`` (``step`` without link levels from ``STEP_GIVEN_MIN`` classes on: block
    by block, dead classes computed and discarded by a select) gives the one-class-at-a-time
    loop's bytes left, predictions, earliest and latest ends and candidates bit for bit: runs
    of dead classes and scattered ones, drains with and without credit, rate rises and falls,
    classes drained to 0, a tight and a loose coalescing bound, class counts not a multiple of
    the block, NaN and infinite rates (case 4); a live class's rate of 0 or -0.0 raises the
    loop's ZeroDivisionError (case 5)."""
    rng = np.random.default_rng(100 + case)
    C = (1000, 1537, 5000, 2048, 4096, 4500)[case]
    for trial in range(6):
        if trial % 2:
            alive = np.repeat(rng.random(C // 10 + 1) < 0.5, 10)[:C]  # runs, as an AlltoAllv's
        else:
            alive = rng.random(C) < (0.2, 0.55, 0.95)[trial % 3]
        old = rng.uniform(1e-4, 0.1, C)
        rate = old * rng.choice([0.5, 1.0, 1.7], C)
        rem = rng.uniform(0, 1e7, C) * (rng.random(C) < 0.9)
        if case == 4:
            rate[rng.integers(0, C, 3)] = np.nan
            rate[rng.integers(0, C, 3)] = np.inf
        rate[~alive] = 0.0
        if case == 5:  # a live class's rate of 0 (or -0.0): the loop's division raises
            rate[int(np.flatnonzero(alive)[trial])] = (0.0, -0.0)[trial % 2]
        dt = float(rng.choice([0.0, rng.uniform(0, 1e8)]))
        span = float(rng.choice([0.0, rng.uniform(0, 1e6)]))
        now = float(rng.integers(0, 10 ** int(rng.choice([3, 12]))))
        youngest = now - float(rng.integers(0, 10**9))
        coalesce = float(rng.choice([0.0, 0.02, 5.0]))
        if trial >= 4:  # ends falling class by class: earlier blocks' candidates leave the final bound
            rem, rate, old, dt, span, coalesce = np.sort(rem)[::-1].copy(), np.where(alive, 0.01, 0.0), np.full(C, 0.01), 0.0, 0.0, 0.02
            if case == 5:
                rate[int(np.flatnonzero(alive)[trial])] = (0.0, -0.0)[trial % 2]
        a = [rem.copy(), np.full(C, -5.0)]
        b = [rem.copy(), np.full(C, -5.0)]
        no = np.zeros(1, dtype=np.int64)
        if case == 5:
            with pytest.raises(ZeroDivisionError):
                K._step_given(alive, a[0], old, dt, span, now, rate, a[1], coalesce, youngest)
            if HAVE_NUMBA:
                with pytest.raises(ZeroDivisionError):
                    K.step(alive, b[0], old, dt, span, now, rate, b[1], coalesce, youngest, False, no[None, :], b[1], no)
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            got = K._step_given(alive, a[0], old, dt, span, now, rate, a[1], coalesce, youngest)
        want = _branchy_step(alive, b[0], old, dt, span, now, rate, b[1], coalesce, youngest)
        assert repr(tuple(float(x) for x in got[:2])) == repr(tuple(float(x) for x in want[:2])), trial
        np.testing.assert_array_equal(got[2], want[2])
        for x, y in zip(a, b):
            assert x.tobytes() == y.tobytes(), trial
        if HAVE_NUMBA:  # the compiled step (from STEP_GIVEN_MIN classes on, _step_given)
            c = [rem.copy(), np.full(C, -5.0)]
            K.step(alive, c[0], old, dt, span, now, rate, c[1], coalesce, youngest, False, no[None, :], c[1], no)
            assert c[0].tobytes() == b[0].tobytes() and c[1].tobytes() == b[1].tobytes()
