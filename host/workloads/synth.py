"""Deterministic synthesis of embedding tables from published summary statistics.

Papers often give only a model's parameter count, its number of tables, the range and average
of the embedding dimensions and the average pooling factor. :func:`synthesize_tables` turns such
a summary (a ``[synthesize]`` TOML section) into concrete tables, reproducibly from a seed:

* dimensions: multiples of ``dim_multiple`` in ``[dim_min, dim_max]`` drawn from a log-normal
  around ``dim_avg``, then nudged one step at a time (in a seeded order) until their mean is the
  closest reachable value to ``dim_avg``;
* rows: log-normal weights (``rows_sigma``) scaled so that sum(rows x dim) equals
  ``total_params`` (to rounding), with at least ``rows_min`` rows per table;
* mean pooling factors: log-normal (``pooling_sigma``) around ``pooling_mean``, clipped to
  ``[pooling_min, pooling_max]`` and rescaled so their average is ``pooling_mean``;
* per-bag sizes follow ``bag_distribution`` (``poisson`` by default) around each table's mean.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from neonic.host.workloads.spec import (
    DTYPE_BYTES,
    POOLING_DISTRIBUTIONS,
    TableSpec,
    _choice,
    _float,
    _int,
    _no_unknown,
    _str,
    _table,
    _where,
)

__all__ = ["synthesize_tables", "SYNTH_FIELDS"]

SYNTH_FIELDS = (
    "count", "total_params", "dim", "dim_min", "dim_max", "dim_avg", "dim_multiple", "dim_sigma",
    "rows_sigma", "rows_min", "pooling_mean", "pooling_sigma", "pooling_min", "pooling_max",
    "bag_distribution", "bag_sigma", "dtype", "seed", "name_prefix",
)


def _dims(rng: np.random.Generator, count: int, lo: int, hi: int, avg: float, step: int, sigma: float) -> np.ndarray:
    if lo == hi:
        return np.full(count, lo, dtype=np.int64)
    mu = math.log(avg) - sigma * sigma / 2.0
    raw = rng.lognormal(mu, sigma, count)
    dims = np.clip(np.rint(raw / step) * step, lo, hi).astype(np.int64)
    target = int(round(avg * count / step)) * step  # closest reachable sum
    order = rng.permutation(count)
    i = 0
    guard = 0
    while dims.sum() != target and guard < 100 * count:
        j = order[i % count]
        if dims.sum() < target and dims[j] + step <= hi:
            dims[j] += step
        elif dims.sum() > target and dims[j] - step >= lo:
            dims[j] -= step
        i += 1
        guard += 1
    return dims


def synthesize_tables(data: Mapping[str, Any], path: str = "synthesize") -> list[TableSpec]:
    """Tables from a ``[synthesize]`` section (fields in :data:`SYNTH_FIELDS`); see the module doc."""
    _table(path, data)
    _no_unknown(path, data, SYNTH_FIELDS)
    for key in ("count", "total_params", "pooling_mean", "seed"):
        if key not in data:
            raise ValueError(f"{_where(path, key)}: required field missing")
    w = lambda key: _where(path, key)  # noqa: E731
    count = _int(w("count"), data["count"], 1)
    total = _float(w("total_params"), data["total_params"], 0.0, strict=True)
    step = _int(w("dim_multiple"), data.get("dim_multiple", 4), 1)
    if "dim" in data:
        lo = hi = _int(w("dim"), data["dim"], 1)
        avg = float(lo)
    else:
        for key in ("dim_min", "dim_max", "dim_avg"):
            if key not in data:
                raise ValueError(f"{w(key)}: required field missing (or give a fixed 'dim')")
        lo = _int(w("dim_min"), data["dim_min"], 1)
        hi = _int(w("dim_max"), data["dim_max"], lo)
        avg = _float(w("dim_avg"), data["dim_avg"], lo)
        if avg > hi:
            raise ValueError(f"{w('dim_avg')}: expected within [dim_min, dim_max] = [{lo}, {hi}], got {avg}")
    dim_sigma = _float(w("dim_sigma"), data.get("dim_sigma", 0.7))
    rows_sigma = _float(w("rows_sigma"), data.get("rows_sigma", 1.0))
    rows_min = _int(w("rows_min"), data.get("rows_min", 100), 1)
    pool_mean = _float(w("pooling_mean"), data["pooling_mean"], 0.0, strict=True)
    pool_sigma = _float(w("pooling_sigma"), data.get("pooling_sigma", 0.0))
    pool_min = _float(w("pooling_min"), data.get("pooling_min", 1.0), 0.0, strict=True)
    pool_max = _float(w("pooling_max"), data.get("pooling_max", max(pool_mean * 20, pool_min)), pool_min)
    if not pool_min <= pool_mean <= pool_max:
        raise ValueError(f"{w('pooling_mean')}: expected within [pooling_min, pooling_max], got {pool_mean}")
    bag = _choice(w("bag_distribution"), data.get("bag_distribution", "poisson"), POOLING_DISTRIBUTIONS)
    bag_sigma = _float(w("bag_sigma"), data.get("bag_sigma", 0.5 if bag == "lognormal" else 0.0))
    if bag == "lognormal" and bag_sigma <= 0:
        raise ValueError(f"{w('bag_sigma')}: expected > 0 for a lognormal bag distribution")
    dtype = _choice(w("dtype"), data.get("dtype", "fp32"), tuple(DTYPE_BYTES))
    seed = _int(w("seed"), data["seed"], 0)
    prefix = _str(w("name_prefix"), data.get("name_prefix", "t"))

    rng = np.random.default_rng(seed)
    dims = _dims(rng, count, lo, hi, avg, step, dim_sigma)
    weights = rng.lognormal(0.0, rows_sigma, count) if rows_sigma > 0 else np.ones(count)
    rows = np.maximum(np.rint(weights * total / float(np.dot(weights, dims))), rows_min)
    # Re-spread what the rows_min floor added over the tables above the floor.
    free = rows > rows_min
    excess = float(np.dot(rows, dims)) - total
    if free.any() and excess > 0:
        scale = 1.0 - excess / float(np.dot(rows[free], dims[free]))
        rows[free] = np.maximum(np.rint(rows[free] * max(scale, 0.0)), rows_min)
    if pool_sigma > 0:
        pools = rng.lognormal(math.log(pool_mean) - pool_sigma**2 / 2, pool_sigma, count)
        for _ in range(20):  # clip and rescale until the mean settles
            pools = np.clip(pools, pool_min, pool_max)
            pools *= pool_mean / pools.mean()
        pools = np.clip(pools, pool_min, pool_max)
    else:
        pools = np.full(count, pool_mean)
    width = len(str(count - 1))
    return [
        TableSpec(
            name=f"{prefix}{i:0{width}d}",
            rows=int(rows[i]),
            dim=int(dims[i]),
            dtype=dtype,
            pooling=round(float(pools[i]), 3),
            pooling_distribution=bag,
            pooling_sigma=bag_sigma,
        )
        for i in range(count)
    ]
