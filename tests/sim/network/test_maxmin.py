"""Max-min fair rates: textbook cases, weights, and the compiled solver equals the numpy one."""

from __future__ import annotations

import numpy as np
import pytest

from neonic.sim.network.maxmin import HAVE_NUMBA, maxmin_rates, maxmin_rates_fast

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
