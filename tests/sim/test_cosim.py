"""Co-simulation of the tiniest cluster (2 nodes x 2 GPUs) on the SmartNIC RTL in Amaranth's
simulator: every destination's buffer equals the reference, the cache's misses equal the
reference model's, nothing is dropped, and every unit's cycle count is set beside the model's."""

from __future__ import annotations

import numpy as np
import pytest

from neonic.sim.calibration import default_calibration
from neonic.rtl.smartnic import SmartNIC
from neonic.sim.timing.cache import CacheTiming
from neonic.sim.cosim import (CosimReport, cache_request_starts, format_report, route_frames, run_cosim,
                       synthetic_traffic, traffic_from_plan)


@pytest.fixture(scope="module")
def report() -> CosimReport:
    traffic = synthetic_traffic(world=4, gpus_per_node=2, batch_per_gpu=1, pooling=3, rows=32,
                                seed=7)
    return run_cosim(traffic, sim="amaranth", seed=7)


def test_every_destination_receives_the_reference_pooled_embeddings(report):
    assert report.buffers_match, f"{report.mismatched_bytes} bytes differ"
    assert report.drops == 0
    for n in report.nics:
        assert n.completions == report.world          # one message from every source
        assert n.frames_sent == n.counters_tx["tx_frames"] > 0


def test_cache_outcomes_equal_the_reference_model(report):
    assert report.cache_misses_match
    for n in report.nics:
        c = n.counters_tx
        assert c["cache_hits"] + c["cache_merged"] == n.cache_ref["hits"]
        assert c["cache_errors"] == 0


def test_unit_cycles_are_measured_and_modelled_side_by_side(report):
    text = format_report(report)
    for n in report.nics:
        assert set(n.rtl) == {"gather", "cache", "packetizer", "depacketizer"}
        assert all(v > 0 for v in n.rtl.values())
        assert set(n.model) == set(n.rtl)
        # the packetizer is paced by the pooled stream: it cannot end before the gather unit
        assert n.rtl["packetizer"] >= n.rtl["gather"] - 2
        assert f"{n.rtl['gather']:>11}" in text
    assert report.network_time_s and report.network_time_s > 0
    assert "equal the reference: yes" in text


def test_route_frames_interleaves_sources_and_keeps_each_sources_order():
    def frame(src, dst, k):
        f = bytearray(64)
        f[30:34] = (0x0A000000 | dst).to_bytes(4, "big")
        f[40] = src
        f[41] = k
        return bytes(f)
    frames = [[frame(0, 1, 0), frame(0, 1, 1), frame(0, 0, 0)], [frame(1, 1, 0)]]
    routed = route_frames(frames, 2)
    assert [(f[40], f[41]) for f in routed[1]] == [(0, 0), (1, 0), (0, 1)]
    assert [(f[40], f[41]) for f in routed[0]] == [(0, 0)]


def test_traffic_from_plan_sends_each_shards_pools_to_the_samples_owners():
    from types import SimpleNamespace as NS
    shards = (NS(rank=0, row_start=0, row_end=10, col_start=0, col_end=8),
              NS(rank=1, row_start=10, row_end=20, col_start=0, col_end=8))
    plan = NS(tables={"a": NS(sharding=NS(value="row_wise"), shards=shards),
                      "b": NS(sharding=NS(value="data_parallel"), shards=())})
    tables = [NS(name="a", rows=20, dim=8, pooling=3), NS(name="b", rows=5, dim=8, pooling=1)]
    tr = traffic_from_plan(plan, tables, batch_per_gpu=2, world=2, gpus_per_node=1, lanes=4)
    for job in tr.jobs:
        assert len(job.tables) == 1 and job.tables[0].num_rows == 10
        assert [s.dest for s in job.sends] == [0, 1]
        assert all(s.bags == 2 for s in job.sends)
        assert all(len(b.indices) == 0 or b.indices.max() < 10 for b in job.bags)
    odd = NS(tables={"a": NS(sharding=NS(value="table_wise"),
                             shards=(NS(rank=0, row_start=0, row_end=20, col_start=0, col_end=6),))})
    with pytest.raises(ValueError, match="lanes"):
        traffic_from_plan(odd, [NS(name="a", rows=20, dim=6, pooling=3)], batch_per_gpu=1,
                          world=2, gpus_per_node=1, lanes=4)


def test_bad_simulator_is_refused():
    with pytest.raises(ValueError, match="sim"):
        run_cosim(synthetic_traffic(world=2, gpus_per_node=1), sim="modelsim")


def test_composed_model_follows_the_rtl_per_unit_without_a_bias(report):
    """The timing-model backend (uncalibrated: the units' documented latencies) against every
    NIC's RTL cycle counts on the tiniest cluster: misses cluster at the start of each NIC's
    run (cold cache), which a per-miss penalty model got 8-10% wrong. Averaged over the NICs,
    each unit is within 3% (no systematic error); a single NIC's ~180-cycle window may be off
    by one isolated miss at its end (about 10 cycles, under 6%), which ``neonic calibrate``
    absorbs (``test_calibration``)."""
    for unit in ("gather", "cache", "packetizer", "depacketizer"):
        errors = [n.rel_error()[unit] for n in report.nics]
        assert float(np.mean(errors)) < 0.03, (unit, format_report(report))
    assert report.max_rel_error < 0.06, format_report(report)


def test_composed_model_counts_the_caches_hit_path_once():
    """At the documented hit latency every row sees exactly the cache model's delay from its
    offer to its first beat (the cache model's start already holds the lookup stages and the
    line memory): the composed gather cycles are the gather model's at those delays."""
    from neonic.sim.cosim.models import _requests, memory_model
    from neonic.sim.cosim.stimulus import build_stimulus
    from neonic.sim.timing.embedding import predict, shapes_from_bags

    nic = SmartNIC()
    traffic = synthetic_traffic(world=2, gpus_per_node=1, batch_per_gpu=1, pooling=1, rows=4,
                                seed=3)
    stim = build_stimulus(nic, traffic, memory_latency=20)
    job, bases = traffic.jobs[0], [d["base"] for d in stim.tx[0]["descs"]]
    path = CacheTiming(row_beats=nic.cache.row_beats).hit_latency
    gather, _ = memory_model(nic, job, bases, memory_latency=20)(path, 0.0)
    shapes = shapes_from_bags(job.tables, job.bags)
    pr = predict(nic.gather.timing, shapes, latency=path)
    for _ in range(10):    # the same fixed point, from the cache model's own delays
        starts = cache_request_starts(nic, _requests(nic, job, bases), pr.issue, memory_latency=20)
        pr = predict(nic.gather.timing, shapes,
                     latency=[max(1.0, s + 1 - o) for s, o in zip(starts, pr.issue)])
    assert gather == pr.cycles

def test_cache_request_model_serialises_misses_and_answers_hits_at_once():
    nic = SmartNIC()
    lb = nic.line_beats
    # six misses to distinct rows offered back to back, then a hit on the first row
    reqs = [(r * lb, 4) for r in range(6)] + [(0, 4)]
    starts = cache_request_starts(nic, reqs, list(range(7)), memory_latency=20)
    assert starts[0] >= 20
    gaps = np.diff(starts[:4])
    # each fill is written through the one on-chip line memory (a cycle for its request,
    # row_beats beats), then its 4-beat read follows
    assert np.all(gaps == nic.cache.row_beats + 1 + 4)
    assert starts[4] > starts[0] + 20                        # the fifth waits for an MSHR
    assert starts[6] >= starts[5] + 4                        # in-order delivery behind misses
    hit_only = cache_request_starts(nic, [(0, 4)] * 3, [0, 50, 100], memory_latency=20)
    hit = CacheTiming(row_beats=nic.cache.row_beats).hit_latency   # offer to first beat
    assert hit_only[1:] == [50.0 + hit - 1, 100.0 + hit - 1]
    with pytest.raises(ValueError, match="offers"):
        cache_request_starts(nic, reqs, [0], memory_latency=20)


def test_default_calibration_uses_the_documented_hit_latency():
    cal = default_calibration(20, 4)
    # the cache's documented hit path (rtl/cache.py's lookup stages and line memory)
    assert cal.gather_hit_latency == CacheTiming(row_beats=1).hit_latency and cal.context["memory_latency"] == 20
