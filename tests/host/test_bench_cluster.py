"""``neonic bench cluster``'s reporting: progress lines on long runs, each run's own peak memory."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest

from neonic.host.bench import BenchContext
from neonic.host.bench.cluster import _progress_lines, _reset_peak_rss, _run_peak_rss_gib


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _lines(ctx: BenchContext) -> list[str]:
    return [line for line in ctx.stream.getvalue().splitlines() if line]


def test_progress_passes_every_tenth_and_a_line_per_interval_between_tenths():
    ctx = BenchContext(stream=io.StringIO())
    clock = _Clock()
    progress = _progress_lines(ctx, "run", every_s=15.0, clock=clock)
    progress("topology", 0.02)                      # the first line always comes through
    for k in range(1, 10):                          # small steps, 1 s apart: filtered out
        clock.t += 1.0
        progress(f"step {k}", 0.02 + 0.005 * k)
    assert len(_lines(ctx)) == 1
    clock.t += 6.0                                  # 15 s since the last line
    progress("engine: about 80 s left", 0.07)
    assert _lines(ctx)[-1].endswith("run: engine: about 80 s left (7%)")
    progress("a tenth further", 0.17)               # a tenth of the run: through at once
    progress("done", 1.0)                           # the end: always through
    assert [line.split("] ", 1)[1] for line in _lines(ctx)] == [
        "run: topology (2%)", "run: engine: about 80 s left (7%)", "run: a tenth further (17%)", "run: done (100%)"]


def test_a_long_collective_heartbeat_is_not_swallowed_between_tenths():
    ctx = BenchContext(stream=io.StringIO())
    clock = _Clock()
    progress = _progress_lines(ctx, "model_a_4096gpu", every_s=15.0, clock=clock)
    progress("simulating 2 iterations on 4096 GPUs", 0.35)
    for minute in range(1, 5):                      # the fraction stands still for minutes
        clock.t += 15.0
        progress(f"network heartbeat {minute}", 0.36)
    assert sum("heartbeat" in line for line in _lines(ctx)) == 4


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the high-water mark reset is Linux's")
def test_peak_rss_is_the_runs_own_after_a_reset():
    big = np.ones(64 << 20, dtype=np.uint8)         # 64 MiB, touched
    before = _run_peak_rss_gib()
    del big
    _reset_peak_rss()
    after_reset = _run_peak_rss_gib()
    assert after_reset < before - 0.03              # the earlier 64 MiB peak is forgotten
    block = np.ones(96 << 20, dtype=np.uint8)
    grown = _run_peak_rss_gib()
    assert grown >= after_reset + 0.08              # this run's 96 MiB is seen
    del block
