"""The compiled kernels' shared pieces: numpy's pairwise summation, reproduced bit for bit."""

from __future__ import annotations

import numpy as np

from neonic.sim.compiled import pairwise_sum


def test_pairwise_sum_is_numpys_sum_bit_for_bit(rng):
    """``pairwise_sum(a, lo, n)`` is ``a[lo:lo + n].sum()`` exactly, for every length up to
    past two of numpy's 128-term blocks and for long arrays (several levels of halves), on
    figures of very different magnitudes (where the order of the additions shows), and a sum
    of negative zeros is ``0.0`` as numpy's."""
    for n in [*range(0, 300), 1000, 1024, 4096, 4099]:
        a = rng.uniform(0, 1, n + 3) * 10.0 ** rng.integers(-6, 9, n + 3)
        lo = int(rng.integers(0, 4))
        assert pairwise_sum(a, lo, n) == float(a[lo:lo + n].sum()), n
    neg = np.full(20, -0.0)
    assert np.signbit(np.sum(neg)) == np.signbit(pairwise_sum(neg, 0, 20))
