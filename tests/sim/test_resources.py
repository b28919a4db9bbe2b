"""Shared resources on the engine: processor sharing, priority, partitions, links, servers."""

from __future__ import annotations

import pytest

from neonic.sim.engine import Engine, ps_from_s
from neonic.sim.gpu import gemm_cost, gpu_preset
from neonic.sim.resources import (
    BandwidthLink,
    CPUSocketSpec,
    GPUDevice,
    ServerPool,
    SharedPool,
    cpu_embedding_backward_s,
    cpu_embedding_forward_s,
)


def _collect(log, tag):
    return lambda start, end: log.append((tag, start, end))


def test_single_task_takes_its_isolated_time():
    eng = Engine()
    pool = SharedPool(eng, {"a": 1.0})
    log = []
    pool.submit(1000, {"a": 1.0}, _collect(log, "x"))
    eng.run()
    assert log == [("x", 0, 1000)]


def test_two_saturating_tasks_share_equally():
    eng = Engine()
    pool = SharedPool(eng, {"a": 1.0})
    log = []
    pool.submit(1000, {"a": 1.0}, _collect(log, "x"))
    pool.submit(1000, {"a": 1.0}, _collect(log, "y"))
    eng.run()
    assert [(t, e) for t, _, e in log] == [("x", 2000), ("y", 2000)]  # ties in submission order


def test_tasks_on_different_capacities_do_not_interfere():
    eng = Engine()
    pool = SharedPool(eng, {"sm": 1.0, "hbm": 1.0})
    log = []
    pool.submit(1000, {"sm": 1.0}, _collect(log, "compute"))
    pool.submit(1000, {"hbm": 1.0}, _collect(log, "memory"))
    eng.run()
    assert all(end == 1000 for _, _, end in log)


def test_partial_demands_overlap_until_a_capacity_saturates():
    eng = Engine()
    pool = SharedPool(eng, {"a": 1.0})
    log = []
    pool.submit(1000, {"a": 0.5}, _collect(log, "x"))
    pool.submit(1000, {"a": 0.5}, _collect(log, "y"))
    eng.run()
    assert [e for _, _, e in log] == [1000, 1000]
    eng2 = Engine()
    pool2 = SharedPool(eng2, {"a": 1.0})
    log2 = []
    pool2.submit(1000, {"a": 0.8}, _collect(log2, "x"))
    pool2.submit(1000, {"a": 0.8}, _collect(log2, "y"))
    eng2.run()
    # together they need 1.6 of 1.0: each runs at 1/1.6 speed
    assert [e for _, _, e in log2] == [1600, 1600]


def test_late_arrival_slows_the_running_task():
    eng = Engine()
    pool = SharedPool(eng, {"a": 1.0})
    log = []
    pool.submit(1000, {"a": 1.0}, _collect(log, "x"))
    eng.schedule(500, pool.submit, 1000, {"a": 1.0}, _collect(log, "y"))
    eng.run()
    # x: 500 alone, then 500 of work at half speed -> 1500; y: 500 done by 1500, rest alone -> 2000
    assert log == [("x", 0, 1500), ("y", 500, 2000)]


def test_priority_class_is_served_first():
    eng = Engine()
    pool = SharedPool(eng, {"a": 1.0})
    log = []
    pool.submit(1000, {"a": 1.0}, _collect(log, "low"), priority=0)
    pool.submit(1000, {"a": 1.0}, _collect(log, "high"), priority=1)
    eng.run()
    assert log == [("high", 0, 1000), ("low", 0, 2000)]


def test_interference_costs_capacity_only_while_sharing():
    eng = Engine()
    pool = SharedPool(eng, {"a": 1.0}, interference=0.2)
    log = []
    pool.submit(800, {"a": 1.0}, _collect(log, "x"))
    pool.submit(800, {"a": 1.0}, _collect(log, "y"))
    eng.run()
    assert [e for _, _, e in log] == [2000, 2000]  # 1600 of work at 0.8 capacity
    assert pool.busy_ps("a") == pytest.approx(1600)


def test_reservation_reduces_what_tasks_get():
    eng = Engine()
    pool = SharedPool(eng, {"a": 1.0})
    log = []
    res = pool.reserve({"a": 0.5})
    pool.submit(1000, {"a": 1.0}, _collect(log, "x"))
    eng.schedule(1000, pool.release, res)
    eng.run()
    # 1000 ps at half speed (500 of work), then the rest alone
    assert log == [("x", 0, 1500)]


def test_bad_demand_names_the_capacity():
    pool = SharedPool(Engine(), {"sm": 1.0})
    with pytest.raises(ValueError, match="demand.hbm"):
        pool.submit(10, {"hbm": 1.0})
    with pytest.raises(ValueError, match="capacities.sm"):
        SharedPool(Engine(), {"sm": 0})


def test_gpu_device_is_the_interference_model():
    from neonic.sim import interference

    assert GPUDevice is interference.GPUDevice  # one GPU model (tests/sim/test_interference.py)
    eng = Engine()
    gpu = GPUDevice(eng, gpu_preset("a100-40gb"))
    cost = gemm_cost(gpu.spec, 4096, 4096, 4096)
    log = []
    gpu.launch(cost, _collect(log, "gemm"))
    eng.run()
    assert log[0][2] == ps_from_s(cost.time_s)
    # every SM busy but in the last of its 8 waves, when CTAs retire one by one (about half a wave)
    assert gpu.utilization(log[0][2])["sm"] == pytest.approx(1 - 1 / 16, abs=1e-6)


def test_bandwidth_link_shares_between_transfers():
    eng = Engine()
    link = BandwidthLink(eng, 10.0)  # 10 GB/s: 1e6 bytes take 100 us
    log = []
    link.transfer(1e6, _collect(log, "a"))
    link.transfer(1e6, _collect(log, "b"))
    eng.run()
    assert [e for _, _, e in log] == [ps_from_s(200e-6)] * 2
    assert link.bytes == 2e6


def test_server_pool_is_fifo_with_k_servers():
    eng = Engine()
    srv = ServerPool(eng, servers=2)
    log = []
    for i in range(4):
        srv.submit(100, _collect(log, i))
    eng.run()
    assert log == [(0, 0, 100), (1, 0, 100), (2, 100, 200), (3, 100, 200)]
    assert srv.utilization(200) == 1.0
    with pytest.raises(ValueError, match="servers"):
        ServerPool(eng, servers=0)


def test_runs_are_deterministic():
    def once():
        eng = Engine()
        pool = SharedPool(eng, {"a": 1.0, "b": 1.0}, interference=0.05)
        log = []
        for i in range(20):
            eng.schedule(i * 37, pool.submit, 100 + 13 * i, {"a": (i % 3) / 3, "b": 0.5}, _collect(log, i), i % 2)
        eng.run()
        return log

    assert once() == once()
    assert len(once()) == 20


def test_cpu_socket_costs():
    spec = CPUSocketSpec()
    assert cpu_embedding_forward_s(spec, 0, 256) == 0
    assert cpu_embedding_forward_s(spec, 2_000_000, 256) > cpu_embedding_forward_s(spec, 1_000_000, 256)
    assert cpu_embedding_backward_s(spec, 1000, 10, 256) < cpu_embedding_backward_s(spec, 1000, 1000, 256)
    with pytest.raises(ValueError, match="cpu.random_efficiency"):
        CPUSocketSpec(random_efficiency=0)
