"""One home for compiled kernels: ``jit`` is ``numba.njit`` (numba is a dependency), or, with the
environment variable ``NEONIC_NO_NUMBA`` set, the undecorated function, so that the same kernel
runs as plain Python with identical arithmetic (slowly; used to check that results do not
depend on the compiler). Also the pieces compiled kernels share to stay bit for bit equal to the
numpy formulas they replace: :func:`pairwise_sum`, numpy's summation order."""

from __future__ import annotations

import os

import numpy as np

__all__ = ["HAVE_NUMBA", "jit", "pairwise_block", "pairwise_sum"]

try:
    if os.environ.get("NEONIC_NO_NUMBA"):
        raise ImportError("disabled by NEONIC_NO_NUMBA")
    from numba import njit as _njit
except ImportError:  # pragma: no cover - exercised only without numba
    _njit = None

HAVE_NUMBA = _njit is not None


def jit(*args, **kwargs):
    """``numba.njit(*args, **kwargs)`` when numba is enabled, else the function itself."""
    if _njit is not None:
        return _njit(*args, **kwargs)
    if args and callable(args[0]):
        return args[0]
    return lambda fn: fn


@jit(cache=True, nogil=True)
def pairwise_block(a, lo, n):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """numpy's pairwise summation of ``a[lo:lo + n]`` for ``n <= 128`` (``pairwise_sum`` in
    numpy's ``loops_utils.h``): under 8 terms one by one, else eight interleaved partial sums
    combined as a tree, then the terms left over one by one."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    m = n - n % 8
    while i < m:
        r0 += a[lo + i]
        r1 += a[lo + i + 1]
        r2 += a[lo + i + 2]
        r3 += a[lo + i + 3]
        r4 += a[lo + i + 4]
        r5 += a[lo + i + 5]
        r6 += a[lo + i + 6]
        r7 += a[lo + i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


@jit(cache=True, nogil=True)
def _pairwise(a, lo, n):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """numpy's pairwise summation of ``a[lo:lo + n]``: over 128 terms, the two halves (the
    first a multiple of 8 terms) summed apart and added, recursively; evaluated with an
    explicit stack (numba's cache does not keep recursive functions)."""
    if n <= 128:
        return pairwise_block(a, lo, n)
    los = np.empty(64, dtype=np.int64)
    ns = np.empty(64, dtype=np.int64)
    stage = np.empty(64, dtype=np.int64)
    vals = np.empty(64)
    sp = 0
    vp = 0
    los[0], ns[0], stage[0] = lo, n, 0
    sp = 1
    while sp > 0:
        t = sp - 1
        m = ns[t]
        if m <= 128:
            vals[vp] = pairwise_block(a, los[t], m)
            vp += 1
            sp -= 1
            continue
        half = m // 2
        half -= half % 8
        if stage[t] == 0:          # the first half
            stage[t] = 1
            los[sp], ns[sp], stage[sp] = los[t], half, 0
            sp += 1
        elif stage[t] == 1:        # then the second
            stage[t] = 2
            los[sp], ns[sp], stage[sp] = los[t] + half, m - half, 0
            sp += 1
        else:                      # both done: their sum
            vp -= 1
            vals[vp - 1] = vals[vp - 1] + vals[vp]
            sp -= 1
    return vals[0]


@jit(cache=True, nogil=True)
def pairwise_sum(a, lo, n):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """``float(a[lo:lo + n].sum())`` of a contiguous float64 array, bit for bit: numpy adds the
    pairwise sum to its identity (so a sum of ``-0.0`` is ``0.0``)."""
    return 0.0 + _pairwise(a, lo, n)
