"""The cost model's compiled kernels against numpy's array operations, bit for bit (compiled,
and as Python under NEONIC_NO_NUMBA=1)."""

import numpy as np
import pytest

from neonic.host.planner.cost import add_columns


def _packed_columns(rng: np.random.Generator, k: int) -> np.ndarray:
    """A packed contribution's columns, ``(30, k)`` and laid out as packing lays them out (the
    transpose of a C-ordered ``(k, 30)``), with rows of one figure in every column (+0.0, -0.0,
    a figure, NaN) beside rows that differ, a mixed +0.0 / -0.0 row among them."""
    cols = rng.random((k, 30)) * 1e-3
    cols[:, 0] = 0.0
    cols[:, 1] = -0.0
    cols[:, 2] = 0.0
    cols[1::2, 2] = -0.0        # zeros of both signs: not one figure
    cols[:, 3] = 0.125
    cols[:, 4] = np.nan
    cols[:, 5] = 7.0
    cols[-1, 5] = 7.0 + 2.0 ** -40   # equal but for the last column
    return cols.T


@pytest.mark.parametrize("k", [1, 2, 5])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_add_columns_is_numpys_gathered_sum_bit_for_bit(k: int, sign: float) -> None:
    rng = np.random.default_rng(k)
    n = 257
    cols = _packed_columns(rng, k)
    idx = rng.integers(0, k, n)
    idx[:k] = np.arange(k)
    v = rng.random((30, n))
    v[:, ::3] = -0.0            # where adding +0.0 gives +0.0 and adding -0.0 keeps -0.0
    v[:, 1::7] = 0.0
    v[6, 5] = np.inf
    want = v + cols[:, idx] if sign == 1.0 else v - cols[:, idx]
    got = v.copy()
    add_columns(got, cols, idx, sign)
    assert got.tobytes() == want.tobytes()
    # a C-ordered copy of the columns takes the same path, with the same figures
    got = v.copy()
    add_columns(got, np.ascontiguousarray(cols), idx, sign)
    assert got.tobytes() == want.tobytes()
