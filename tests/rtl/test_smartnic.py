"""The SmartNIC top in Amaranth's simulator: bags in, frames out, frames looped back into the
depacketizer, the destination buffer equal to the reference computation; frames equal to the
reference packetizer's; parameter checks."""

from __future__ import annotations

import numpy as np
import pytest

from neonic.rtl.smartnic import UNITS, SmartNIC, counter_names
from neonic.sim.cosim import (NICJob, Send, Traffic, amaranth_phase, build_stimulus, endpoint,
                       expected_buffers, route_frames)
from neonic.sim.reference import embedding as ref
from neonic.sim.reference.roce import Destination, Message, build_frames


@pytest.fixture(scope="module")
def nic():
    return SmartNIC()


def _loopback_traffic(rng: np.random.Generator) -> Traffic:
    """One NIC sending to itself: two tables (strides 1 and 4 beats, one padded to a whole
    beat), an empty bag, padding-free bags of repeated hot rows, split into two messages the
    second of which spans several packets."""
    tables = [ref.random_table(rng, 24, 16), ref.random_table(rng, 12, 30)]
    bags = []
    for b in range(14):
        t = b % 2
        n = 0 if b == 5 else int(rng.integers(1, 5))
        bags.append(ref.Bag(t, ref.zipf_indices(rng, 1.1, tables[t].num_rows, n), tag=b))
    vec = lambda t: -(-tables[t].dim // 4) * 16  # noqa: E731
    first, second = bags[:3], bags[3:]
    sends = [Send(0, len(first), sum(vec(b.table) for b in first), 0),
             Send(0, len(second), sum(vec(b.table) for b in second), 1024)]
    return Traffic(1, 1, [NICJob(0, tables, bags, sends)], label="loopback")


@pytest.mark.parametrize("stress", [pytest.param(False, marks=pytest.mark.slow), True],
                         ids=["full-rate", "idle+backpressure"])
def test_bags_to_frames_to_buffer_equals_reference(nic, stress, seed):
    rng = np.random.default_rng(seed)
    traffic = _loopback_traffic(rng)
    stim = build_stimulus(nic, traffic, memory_latency=7)
    opts = dict(seed=seed, idle=0.3 if stress else 0.0, backpressure=0.3 if stress else 0.0)
    tx, _, _ = amaranth_phase(nic, stim, "tx", None, None, **opts)
    frames = tx[0]["frames"]

    # the frames are the reference packetizer's, byte for byte
    job = traffic.jobs[0]
    pooled = ref.pool(job.tables, job.bags)
    mac, ip = endpoint(0)
    golden, psn, at = [], 0, 0
    for k, (s, d) in enumerate(zip(job.sends, stim.tx[0]["sends"])):
        vecs = []
        for v in pooled[at:at + s.bags]:
            pad = np.zeros(-(-len(v) // 4) * 4, np.float32)
            pad[:len(v)] = v
            vecs.append(pad)
        at += s.bags
        msg = Message(0, d["va"], d["rkey"], np.concatenate(vecs).tobytes(), d["imm"])
        fr = build_frames(msg, Destination(mac, ip, qpn=0, udp_sport=0xC000), local_mac=mac,
                          local_ip=ip, psn=psn, pmtu=nic.pmtu)
        psn += len(fr)
        golden += [f.data for f in fr]
    assert len(golden) >= 3, "the second message must span several packets"
    assert frames == golden

    rx, mem, _ = amaranth_phase(nic, stim, "rx", route_frames([frames], 1), None, **opts)
    assert rx[0]["completions"] == 2
    assert np.array_equal(mem, expected_buffers(nic, traffic, stim))
    c = tx[0]["counters"]
    assert c["gather_bags_in"] == c["gather_bags_out"] == len(job.bags)
    assert c["tx_frames"] == len(golden)
    assert c["pooled_error_bags"] == c["pooled_dropped_bags"] == 0
    assert c["cache_errors"] == 0
    assert c["cache_hits"] + c["cache_merged"] + c["cache_misses"] == job.rows
    assert rx[0]["counters"]["rx_accepted"] == len(golden)
    for unit in ("gather", "cache", "packetizer"):
        assert c[f"{unit}_last"] > c[f"{unit}_first"] > 0
    assert rx[0]["counters"]["depacketizer_last"] > rx[0]["counters"]["depacketizer_first"]


def test_counters_cover_every_unit(nic):
    names = counter_names()
    assert len(names) == len(set(names))
    for unit in UNITS:
        assert f"{unit}_first" in names and f"{unit}_last" in names
    assert {"gather_busy_cycles", "cache_misses", "rx_icrc", "tx_frames"} <= set(names)


@pytest.mark.parametrize("kwargs, field", [
    ({"lanes": 2}, "lanes"),
    ({"max_dim": 64, "beats_width": 5, "line_beats": 8}, "line_beats"),
    ({"data_bytes": 4}, "data_bytes"),
    ({"pmtu": 100}, "pmtu"),
    ({"cache_ways": 0}, "ways"),
    ({"num_qps": 0}, "num_qps"),
])
def test_bad_parameters_are_refused_by_name(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SmartNIC(**kwargs)


def test_job_that_does_not_fit_the_cache_lines_is_refused(nic):
    rng = np.random.default_rng(0)
    table = ref.random_table(rng, 8, 12)           # 3 beats per row: does not divide 8
    job = NICJob(0, [table], [ref.Bag(0, np.array([1]))], [Send(0, 1, 64)])
    with pytest.raises(ValueError, match="stride"):
        build_stimulus(nic, Traffic(1, 1, [job]))
