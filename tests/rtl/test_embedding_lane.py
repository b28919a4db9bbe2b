"""The gather unit's pooling lane on its own: SUM and MAX results after ``latency`` cycles,
bit-exact against numpy, one operation per cycle, with the MAX NaN rule of torch's CPU
EmbeddingBag."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator

from neonic.rtl.embedding import PoolLane


def _f32_bits(x):
    return np.asarray(x, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("latency", [1, 2, 3, 4, 9])
def test_lane_sums_and_maxes_with_its_latency(latency, rng):
    n = 60
    old = rng.standard_normal(n).astype(np.float32)
    v = rng.standard_normal(n).astype(np.float32)
    old[3], v[4] = np.nan, np.nan                      # NaN acc stays; NaN row is ignored
    first = rng.random(n) < 0.2
    is_max = rng.random(n) < 0.5
    old[5], v[5], old[6], v[6] = 0.0, -0.0, -0.0, 0.0  # +0 and -0 are equal: the old stays
    first[3:7] = False
    is_max[3:7] = True                     # MAX: NaN accumulator stays, NaN row is ignored
    expect = np.where(is_max,
                      np.where(first, v, np.where(v > old, v, old)),
                      np.where(first, np.float32(0), old) + v).astype(np.float32)
    dut = PoolLane(latency=latency)
    got = []

    async def bench(ctx):
        for k in range(n + latency):
            if k < n:
                ctx.set(dut.old, int(_f32_bits(old[k])))
                ctx.set(dut.v, int(_f32_bits(v[k])))
                ctx.set(dut.first, int(first[k]))
            if k >= latency:
                ctx.set(dut.is_max, int(is_max[k - latency]))
                got.append(ctx.get(dut.result))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    got_bits = np.array(got, dtype=np.uint32)
    exp_bits = _f32_bits(expect)
    nan = np.isnan(expect)
    assert np.array_equal(got_bits[~nan], exp_bits[~nan])
    assert np.isnan(got_bits.view(np.float32)[nan]).all()
    assert np.isnan(got_bits[3:4].view(np.float32)[0]) and got_bits[4] == exp_bits[4]


def test_bad_latency_is_refused():
    with pytest.raises(ValueError, match=r"^latency:"):
        PoolLane(latency=0)
