"""One home for compiled kernels: ``jit`` is ``numba.njit`` (numba is a dependency), or, with the
environment variable ``NEONIC_NO_NUMBA`` set, the undecorated function, so that the same kernel
runs as plain Python with identical arithmetic (slowly; used to check that results do not
depend on the compiler)."""

from __future__ import annotations

import os

__all__ = ["HAVE_NUMBA", "jit"]

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
