"""The network's compiled bookkeeping kernels (``sim.network._kernels``) against the numpy forms
they replace: the same permutations and the same bits."""

from __future__ import annotations

import numpy as np
import pytest

from neonic.sim.network import _kernels as K


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
