"""The GPU interference model (sim.interference): each C3 mechanism pinned on its own."""

from __future__ import annotations

import math

import numpy as np
import pytest

from neonic.sim.engine import Engine, Timer, ps_from_s
from neonic.sim.gpu import KernelCost, gemm_cost, gpu_preset
from neonic.sim.interference import (REDUCE_FRACTION, CommEngineSpec, GPUDevice, collective_links, comm_begin_all,
                                     comm_end_all, couple, gemm_ctas)
from neonic.sim.network import collectives as coll
from neonic.sim.network.network import Network
from neonic.sim.network.topology import Topology

SPEC = gpu_preset("a100-40gb")
BIG = gemm_cost(SPEC, 8192, 8192, 12288)  # ~4 ms alone: longer than the 2 GiB AllGather's first part
BIG_CTAS = gemm_ctas(SPEC, 8192, 8192)


def _memory_kernel(seconds: float) -> KernelCost:
    """A streaming kernel that keeps HBM busy for ``seconds`` alone."""
    nbytes = seconds * SPEC.hbm_bytes_per_s * SPEC.efficiency.hbm_stream
    return KernelCost(hbm_bytes=nbytes, memory_s=seconds, compute_s=seconds * 0.05)


def _end(log, tag):
    return lambda start, end: log.__setitem__(tag, end)


def test_kernel_alone_takes_its_isolated_time():
    for ctas in (None, BIG_CTAS, 16):
        eng = Engine()
        gpu = GPUDevice(eng, SPEC)
        log = {}
        gpu.launch(BIG, _end(log, "gemm"), ctas=ctas)
        eng.run()
        assert log["gemm"] == pytest.approx(ps_from_s(BIG.time_s), abs=2)


def test_an_empty_kernel_ends_at_once_even_behind_a_gemm():
    eng = Engine()
    gpu = GPUDevice(eng, SPEC)
    log = {}
    gpu.launch(BIG, _end(log, "gemm"), ctas=BIG_CTAS)
    gpu.launch(KernelCost(), _end(log, "empty"))
    eng.run()
    assert log["empty"] == 0 < log["gemm"]


def test_equal_priority_kernels_run_on_what_earlier_ones_leave():
    small = gemm_cost(SPEC, 256, 512, 4096)  # 32 CTAs of 64x64: fewer than the SMs
    ctas = gemm_ctas(SPEC, 256, 512)
    assert ctas < SPEC.num_sms / 2
    eng = Engine()
    gpu = GPUDevice(eng, SPEC)
    log = {}
    gpu.launch(small, _end(log, "a"), ctas=ctas)
    gpu.launch(small, _end(log, "b"), ctas=ctas)
    eng.run()
    assert log["a"] == log["b"] == pytest.approx(ps_from_s(small.time_s), abs=2)  # side by side
    eng = Engine()
    gpu = GPUDevice(eng, SPEC)
    log = {}
    gpu.launch(BIG, _end(log, "big"), ctas=BIG_CTAS)
    gpu.launch(small, _end(log, "small"), ctas=ctas)
    eng.run()
    waves = math.ceil(BIG_CTAS / SPEC.num_sms)
    # the small grid starts only as the big one's last wave retires
    assert log["small"] > ps_from_s(BIG.time_s) * (1 - 1 / waves)


def test_a_collective_slows_a_gemm_more_when_it_moves_more_bytes_per_second():
    def gemm_end(link_gbps: float, traffic: float, cost=BIG) -> int:
        eng = Engine()
        gpu = GPUDevice(eng, SPEC)
        log = {}
        h = gpu.comm_begin(link_gbps, 0.0)
        gpu.set_traffic(traffic, traffic)
        gpu.launch(cost, _end(log, "k"), ctas=BIG_CTAS)
        eng.run()
        gpu.comm_end(h)
        return log["k"]

    # SMs: the channels follow the link rate the collective drives (2 for a NIC, 24 for NVLink)
    nic, nvlink = gemm_end(25, 25e9), gemm_end(300, 300e9)
    assert ps_from_s(BIG.time_s) < nic < nvlink
    # HBM: same channels, more bytes per second -> a memory-bound kernel loses more bandwidth
    mem = _memory_kernel(2e-3)
    slow = [gemm_end(300, rate, mem) for rate in (50e9, 200e9, 400e9)]
    assert slow[0] < slow[1] < slow[2]


def test_comm_hbm_counts_copies_and_reductions():
    eng = Engine()
    gpu = GPUDevice(eng, SPEC, record=True)
    gpu.comm_begin(300, 0.0)
    gpu.set_traffic(100e9, 100e9)
    copy = gpu.counters[-1][4]
    eng2 = Engine()
    gpu2 = GPUDevice(eng2, SPEC, record=True)
    gpu2.comm_begin(300, 1.0)
    gpu2.set_traffic(100e9, 100e9)
    reduce = gpu2.counters[-1][4]
    hbm = SPEC.hbm_bytes_per_s * SPEC.efficiency.hbm_stream
    assert copy == pytest.approx((100e9 + 100e9) / hbm)  # read what is sent, write what arrives
    assert reduce == pytest.approx((100e9 + 4 * 100e9) / hbm)  # + read two operands, write one


def _pair(comm_priority: int, order: str, partition: float = 0.0, dma: bool = False, nbytes: int = 2 << 30):
    """GEMM and an AllGather on one ZionEX node started together; returns (gemm end, comm end)."""
    topo = Topology.from_preset("zionex", nodes=1)
    eng = Engine()
    net = Network(eng, topo)
    gpus = [GPUDevice(eng, SPEC, name=f"g{r}", comm_priority=comm_priority, sm_partition_comm=partition,
                      collectives_on_dma=dma) for r in range(topo.num_gpus)]
    couple(net, gpus)
    links = collective_links(topo, range(topo.num_gpus))
    ends = {"gemm": 0, "comm": 0}

    def compute():
        for g in gpus:
            g.launch(BIG, lambda s, e: ends.__setitem__("gemm", max(ends["gemm"], e)), ctas=BIG_CTAS)

    def comm():
        hs = [g.comm_begin(float(links[r]), REDUCE_FRACTION["all_gather"]) for r, g in enumerate(gpus)]

        def done(_h):
            for g, h in zip(gpus, hs):
                g.comm_end(h)
            ends["comm"] = eng.now

        coll.all_gather(net, list(range(topo.num_gpus)), nbytes, on_done=done)

    for part in ((compute, comm) if order == "compute_first" else (comm, compute)):
        if part is not None:
            part()
    eng.run()
    return ends["gemm"], ends["comm"]


def test_priority_changes_which_side_finishes_first():
    gemm, comm = _pair(0, "compute_first")
    assert gemm < comm  # equal priority: the collective waits for the GEMM's last wave
    gemm_hi, comm_hi = _pair(1, "compute_first")
    assert comm_hi < gemm_hi  # high priority: its channels are handed over as GEMM CTAs retire
    assert gemm_hi > gemm and comm_hi < comm  # the effect on both sides


def test_high_priority_hand_over_is_not_preemptive():
    eng = Engine()
    gpu = GPUDevice(eng, SPEC, comm_priority=1)
    gpu.launch(BIG, None, ctas=BIG_CTAS)
    h = gpu.comm_begin(300, 0.0)
    assert gpu.held()["comm"] == 0  # every SM is busy with GEMM CTAs: nothing is taken at once
    waves = math.ceil(BIG_CTAS / SPEC.num_sms)
    tau = ps_from_s(BIG.time_s) / waves
    channels = 24
    span = channels * tau / SPEC.num_sms  # 24 of 108 staggered CTAs retire in this span
    eng.run(until_ps=int(0.5 * span))
    assert gpu.held()["comm"] == pytest.approx(channels / 2)  # half handed over, as they retire
    eng.run(until_ps=int(span) + 10)
    assert gpu.held()["comm"] == pytest.approx(channels)
    assert gpu.held()["compute"] == pytest.approx(SPEC.num_sms - channels)
    gpu.comm_end(h)
    eng.run()


def test_partitioning_has_no_effect_when_only_one_side_runs():
    for partition in (0.0, 0.3):
        eng = Engine()
        gpu = GPUDevice(eng, SPEC, sm_partition_comm=partition)
        log = {}
        gpu.launch(BIG, _end(log, "gemm"), ctas=BIG_CTAS)
        eng.run()
        assert log["gemm"] == pytest.approx(ps_from_s(BIG.time_s), abs=2)
    topo_only = []
    for p in (0.0, 0.3):
        topo = Topology.from_preset("zionex", nodes=1)
        eng = Engine()
        net = Network(eng, topo)
        gpus = [GPUDevice(eng, SPEC, sm_partition_comm=p) for _ in range(topo.num_gpus)]
        couple(net, gpus)
        hs = [g.comm_begin(300.0, 0.0) for g in gpus]
        h = coll.all_gather(net, list(range(8)), 2 << 30, on_done=lambda _h: [g.comm_end(x) for g, x in zip(gpus, hs)])
        eng.run()
        topo_only.append(h.end_ps)
    assert topo_only[0] == topo_only[1]  # a collective alone keeps all its channels


def test_partition_applies_only_while_both_sides_run():
    eng = Engine()
    gpu = GPUDevice(eng, SPEC, sm_partition_comm=0.25)
    gpu.launch(BIG, None, ctas=BIG_CTAS)
    h = gpu.comm_begin(25, 0.0)  # 2 channels, far below the partition
    eng.run(until_ps=ps_from_s(1e-3))
    assert gpu.held()["compute"] == pytest.approx(0.75 * SPEC.num_sms)  # the rest of the share idles
    gpu.comm_end(h)
    eng.run(until_ps=ps_from_s(1.5e-3))
    assert gpu.held()["compute"] == pytest.approx(SPEC.num_sms)  # the whole GPU again


def test_dma_offload_frees_sms_but_not_hbm():
    def run(dma: bool):
        eng = Engine()
        gpu = GPUDevice(eng, SPEC, collectives_on_dma=dma, comm_priority=1, record=True)
        log = {}
        h = gpu.comm_begin(300, 0.0)
        gpu.set_traffic(300e9, 300e9)
        held = gpu.held()["comm"]
        gpu.launch(_memory_kernel(2e-3), _end(log, "mem"), ctas=4 * SPEC.num_sms)
        comm_hbm = gpu.counters[-1][4]
        eng.run()
        gpu.comm_end(h)
        return held, comm_hbm, log["mem"]

    sm_held, sm_hbm, sm_end = run(False)
    dma_held, dma_hbm, dma_end = run(True)
    assert sm_held == 24 and dma_held == 0  # no SMs on the copy engines
    assert dma_hbm == pytest.approx(sm_hbm)  # the same bytes through HBM
    assert dma_end > ps_from_s(2e-3) * 1.2  # the memory-bound kernel still loses HBM bandwidth


def test_dma_reductions_run_on_sms_and_copy_engines_cap_the_feed():
    eng = Engine()
    gpu = GPUDevice(eng, SPEC, collectives_on_dma=True)
    gpu.comm_begin(300, 0.5)
    assert gpu.held()["comm"] == math.ceil(0.5 * 300 / 12.5)  # copy engines cannot reduce
    eng2 = Engine()
    one_ce = GPUDevice(eng2, SPEC, collectives_on_dma=True, comm=CommEngineSpec(copy_engine_gbytes_per_s=100.0))
    one_ce.comm_begin(300, 0.0)
    rate = one_ce.set_traffic(300e9, 300e9)
    assert rate == pytest.approx(SPEC.copy_engines * 100 / 300)


def test_network_flows_wait_for_their_gpu_kernels():
    # at equal priority a collective launched behind a GEMM moves (almost) nothing until the
    # GEMM's last wave: the network is fed by the GPU
    _, comm_behind = _pair(0, "compute_first", nbytes=256 << 20)
    _, comm_first = _pair(0, "comm_first", nbytes=256 << 20)
    assert comm_behind > ps_from_s(BIG.time_s) * 0.9 > comm_first


def test_network_throttle_scales_a_gpus_flows():
    topo = Topology.from_preset("zionex", nodes=1)
    ends = []
    for scale in (1.0, 0.5):
        eng = Engine()
        net = Network(eng, topo)
        net.set_throttle(lambda tx, rx, s=scale: np.full(tx.size, s))
        g = net.start_flow(0, 1, 300_000_000)
        eng.run()
        ends.append(g.end_ps)
    assert ends[1] == pytest.approx(2 * ends[0], rel=0.01)
    with pytest.raises(ValueError, match="fn"):
        Network(Engine(), topo).set_throttle(3)


def test_gemm_grid_and_links():
    assert gemm_ctas(SPEC, 8192, 8192) == 32 * 64  # 256x128 tiles fill 108 SMs
    assert gemm_ctas(SPEC, 512, 256) == 8 * 4  # too small to fill: 64x64 tiles
    one = collective_links(Topology.from_preset("zionex", nodes=1), range(8))
    two = collective_links(Topology.from_preset("zionex", nodes=2), range(16))
    assert np.allclose(one, 300) and np.allclose(two, 325)  # NVLink, + the 200 Gb/s NIC


def test_bad_inputs_name_the_field():
    with pytest.raises(ValueError, match="sm_partition_comm"):
        GPUDevice(Engine(), SPEC, sm_partition_comm=1.0)
    with pytest.raises(ValueError, match="comm.channel_gbytes_per_s"):
        CommEngineSpec(channel_gbytes_per_s=0)
    with pytest.raises(ValueError, match="reduce_fraction"):
        GPUDevice(Engine(), SPEC).comm_begin(100, 2.0)
    with pytest.raises(ValueError, match="ctas"):
        GPUDevice(Engine(), SPEC).launch(BIG, ctas=0)


def test_runs_are_deterministic():
    assert _pair(1, "compute_first", nbytes=64 << 20) == _pair(1, "compute_first", nbytes=64 << 20)


@pytest.mark.parametrize("traffic", [50e9, 150e9, 300e9])
def test_the_planners_kernel_and_collective_rate_is_the_gpu_models(traffic):
    """The planner's fast evaluation prices a kernel beside a collective with
    kernel_comm_hbm_rate; the event-driven GPU gives the kernel exactly that rate."""
    from neonic.sim.interference import comm_hbm_bytes, kernel_comm_hbm_rate

    eng = Engine()
    gpu = GPUDevice(eng, SPEC, interference=0.1)
    gpu.comm_begin(300, 0.0)
    gpu.set_traffic(traffic, traffic)
    ends = {}
    kernel = _memory_kernel(1e-3)
    gpu.launch(kernel, _end(ends, "k"))
    eng.run()
    hbm = SPEC.hbm_bytes_per_s * SPEC.efficiency.hbm_stream
    rate = kernel_comm_hbm_rate(kernel.memory_s / kernel.time_s, comm_hbm_bytes(traffic, traffic, 0.0) / hbm, 0.1)
    assert rate < 1.0 and ends["k"] == pytest.approx(ps_from_s(1e-3 / float(rate)), rel=1e-3)


def test_two_client_rate_vectorises_and_leaves_a_lone_client_alone():
    from neonic.sim.interference import kernel_comm_hbm_rate

    r = kernel_comm_hbm_rate(np.array([1.0, 0.5, 0.0, 1.0]), np.array([0.5, 0.2, 0.9, 0.0]), 0.1)
    assert r == pytest.approx([0.9 / 1.5, 1.0, 1.0, 1.0])


def test_a_persistent_gemm_keeps_its_sms_from_a_high_priority_kernel():
    """Hopper's GEMMs are persistent (one CTA per SM): a kernel behind one waits for its end
    whatever its priority; behind a tile grid a high-priority kernel gets SMs as CTAs retire."""
    h200 = gpu_preset("h200-141gb")
    gemm = gemm_cost(h200, 16384, 16384, 16384, "bf16")
    copy = KernelCost(memory_s=0.5e-3)
    ends = {}
    for grid in ("persistent", "tiles"):
        ctas = gemm_ctas(h200, 16384, 16384) if grid == "persistent" else 64 * 128
        eng = Engine()
        gpu = GPUDevice(eng, h200)
        log = {}
        gpu.launch(gemm, _end(log, "gemm"), ctas=ctas)
        eng.after(ps_from_s(50e-6), lambda: gpu.launch(copy, _end(log, "copy"), priority=1))
        eng.run()
        ends[grid] = log["copy"]
    assert ends["persistent"] >= ps_from_s(gemm.time_s)
    assert ends["tiles"] < ps_from_s(0.1 * gemm.time_s)


def test_the_kept_scheduling_order_and_targets_are_the_recomputed_ones_whatever_comes_and_goes():
    """GPUDevice keeps its kernels in scheduling order (higher priority first, then launch order)
    as they launch and end, instead of sorting at every change, and their SM targets until a
    kernel comes, goes or drains: at every step of a random mix of priorities, grids,
    collectives and traffic the order is exactly ``sorted(kernels, key=_order_key)`` and the
    targets are what ``_set_targets`` computes afresh."""
    from neonic.sim.interference import _order_key

    rng = np.random.default_rng(7)
    eng = Engine()
    gpu = GPUDevice(eng, SPEC, comm_priority=1, sm_partition_comm=0.2, interference=0.1)
    handles = []
    checked = [0]

    def check() -> None:
        assert gpu._order == sorted(gpu._ks, key=_order_key)
        assert {id(k) for k in gpu._order} == {id(k) for k in gpu._ks}
        kept = [k.target for k in gpu._order]
        gpu._set_targets(gpu._order)
        assert [k.target for k in gpu._order] == kept
        checked[0] += 1

    def step() -> None:
        action = rng.integers(4)
        if action == 0 or not handles:
            handles.append(gpu.comm_begin(float(rng.choice([25.0, 300.0])), float(rng.choice([0.0, 0.5]))))
        elif action == 1:
            gpu.comm_end(handles.pop(int(rng.integers(len(handles)))))
        elif action == 2:
            gpu.set_traffic(float(rng.uniform(0, 4e11)), float(rng.uniform(0, 4e11)))
        gpu.launch(gemm_cost(SPEC, 1024 * int(rng.integers(1, 5)), 2048, 4096), lambda s, e: check(),
                   priority=int(rng.integers(-1, 3)), ctas=int(rng.choice([16, 200, 1000])))
        check()

    for i in range(60):
        eng.schedule(ps_from_s(i * 20e-6), step)
    for i in range(1000):  # and between the steps, as waves end and grids drain
        eng.schedule(ps_from_s(i * 2e-6) + 1, check)
    eng.run()
    while handles:
        gpu.comm_end(handles.pop(0))
        check()
    assert checked[0] > 100 and not gpu._ks


def _coupled_mix(batched: bool, seed: int, dma: bool = False) -> tuple:
    """Two ZionEX nodes: GEMMs, memory-bound kernels and AlltoAlls/AllGathers started at random
    times on random GPUs, coupled to the network (``couple(..., batched)``). Returns every
    kernel's and collective's end, each GPU's counters and utilization, and how often
    ``set_traffic`` ran."""
    rng = np.random.default_rng(seed)
    topo = Topology.from_preset("zionex", nodes=2)
    eng = Engine()
    net = Network(eng, topo)
    calls = [0]

    class Counted(GPUDevice):  # counts the per-GPU traffic calls (the batched path makes fewer)
        __slots__ = ()

        def set_traffic(self, tx_bytes_per_s: float, rx_bytes_per_s: float) -> float:
            calls[0] += 1
            return super().set_traffic(tx_bytes_per_s, rx_bytes_per_s)

    gpus = [Counted(eng, SPEC, name=f"g{r}", comm_priority=int(rng.integers(2)), interference=0.1,
                    collectives_on_dma=dma and r % 3 == 0, record=r % 2 == 0) for r in range(topo.num_gpus)]
    couple(net, gpus, batched=batched)
    links = collective_links(topo, range(topo.num_gpus))
    ends: list[tuple[str, int]] = []
    world = list(range(topo.num_gpus))

    def kernel(r: int, k: int) -> None:
        cost = _memory_kernel(float(rng.uniform(50e-6, 400e-6))) if k % 2 else \
            gemm_cost(SPEC, 1024 * int(rng.integers(1, 6)), 4096, 4096)
        gpus[r].launch(cost, lambda s, e, k=k: ends.append((f"k{k}", e)), ctas=int(rng.choice([64, 500, 2000])))

    def collective(c: int) -> None:
        rf = REDUCE_FRACTION["all_gather"] if c % 2 else 0.0
        # a quarter of the GPUs launch too few channels for their links (the channels bind)
        hs = [g.comm_begin(float(links[r]) * (0.25 if r % 4 == 1 else 1.0), rf) for r, g in enumerate(gpus)]

        def done(_h):
            for g, h in zip(gpus, hs):
                g.comm_end(h)
            ends.append((f"c{c}", eng.now))

        if c % 2:
            coll.all_gather(net, world, int(rng.integers(8, 64)) << 20, on_done=done)
        else:
            m = rng.integers(1, 8, size=(len(world), len(world))) << 20
            coll.alltoallv(net, world, m, on_done=done)

    for k in range(80):
        eng.schedule(ps_from_s(float(rng.uniform(0, 3e-3))), kernel, int(rng.integers(len(gpus))), k)
    for c in range(6):
        eng.schedule(ps_from_s(c * 0.5e-3), collective, c)
    eng.run()
    span = eng.now
    return (ends, [g.counters for g in gpus], [g.utilization(span) for g in gpus]), calls[0]


@pytest.mark.parametrize("seed,dma", [(1, False), (2, False), (3, True)])
def test_the_batched_traffic_update_is_the_per_gpu_one(seed, dma):
    """couple()'s batched decision of which GPUs' new traffic changes no rate gives exactly
    what set_traffic on every GPU gives: the same ends, counters and utilization, bit for bit,
    with fewer per-GPU calls (the GPUs it finds unaffected skip them)."""
    batched, calls_batched = _coupled_mix(True, seed, dma)
    each, calls_each = _coupled_mix(False, seed, dma)
    assert batched == each
    assert len(each[0]) == 80 + 6
    assert calls_batched < calls_each


@pytest.mark.parametrize("shared", [False, True])
def test_the_throttle_reads_each_gpus_collectives_and_fraction_as_the_gpu_has_them(monkeypatch, shared):
    """The board the network's throttle reads (per GPU: its running collectives and their
    fraction of the link-allowed rate, kept by the GPUs themselves at every change, each
    through its own view of the board's rows) holds what every GPU has at every throttle call,
    through kernels, hand-overs, shared re-plans and traffic updates (the batched and
    per-GPU paths in the tests above read the same board: this pins the board itself)."""
    import neonic.sim.interference as interference

    gpus_of: list = []
    checked = [0, 0]
    real_couple = couple

    def recorded(net, gpus, *a, **kw):
        gpus_of.append(list(gpus))
        return real_couple(net, gpus, *a, **kw)

    real = interference._comm_scale

    def comm_scale(board, size):
        gpus = gpus_of[-1]
        assert board.shape == (2, len(gpus))
        for i, g in enumerate(gpus):
            assert board[0, i] == g._ncomm
            assert board[1, i] == g._comm_rate
            checked[1] += g._ncomm > 0 and g._comm_rate < 1.0
        checked[0] += 1
        return real(board, size)

    monkeypatch.setitem(globals(), "couple", recorded)
    monkeypatch.setattr(interference, "_comm_scale", comm_scale)
    _lockstep_mix(shared, 1, slow=True)
    _coupled_mix(True, 2)
    assert checked[0] > 100 and checked[1] > 0  # (some throttled: fractions below 1 seen)


def _lockstep_mix(shared: bool, seed: int, dma: bool = False, slow: bool = False, begin_all: bool = False) -> tuple:
    """Two ZionEX nodes whose GPUs mostly run the same work at the same times (two groups of
    eight with their own kernels, AlltoAlls of equal and of uneven sizes, AllGathers), with a
    few kernels on single GPUs that set them apart for a while; coupled to the network with
    ``couple(..., shared=shared)``. ``slow``: one NIC's receive link of the second node at
    0.37 of its capacity (GPUs of a group get different traffic once an AlltoAll's flows reach
    it). Returns every kernel's and collective's end in the order they ended, each GPU's
    counters and utilization, the engine's event count, and how many re-plans the GPUs shared.
    ``begin_all``: the collectives begin and end with comm_begin_all / comm_end_all."""
    rng = np.random.default_rng(seed)
    topo = Topology.from_preset("zionex", nodes=2)
    if slow:
        topo.capacity = topo.capacity.copy()
        topo.capacity[topo._base["nic_rx"] + 11] *= 0.37
    eng = Engine()
    net = Network(eng, topo)
    n = topo.num_gpus
    gpus = [GPUDevice(eng, SPEC, name=f"g{r}", comm_priority=1, interference=0.1, sm_partition_comm=0.1 * (r >= 12),
                      collectives_on_dma=dma and r % 3 == 0, record=r == 5) for r in range(n)]
    couple(net, gpus, shared=shared)
    links = collective_links(topo, range(n))
    ends: list[tuple[str, int, int]] = []
    world = list(range(n))

    def kernel(ranks: list[int], k: int, cost, ctas: int) -> None:
        for r in ranks:
            gpus[r].launch(cost, lambda s, e, k=k, r=r: ends.append((f"k{k}", r, e)), ctas=ctas)

    def collective(c: int) -> None:
        rf = REDUCE_FRACTION["all_gather"] if c % 3 == 2 else 0.0
        if begin_all:
            hs = comm_begin_all(gpus, [float(x) for x in links], rf)
        else:
            hs = [g.comm_begin(float(links[r]), rf) for r, g in enumerate(gpus)]

        def done(_h):
            if begin_all:
                comm_end_all(gpus, hs)
                return ends.append((f"c{c}", -1, eng.now))
            for g, h in zip(gpus, hs):
                g.comm_end(h)
            ends.append((f"c{c}", -1, eng.now))

        if c % 3 == 2:
            coll.all_gather(net, world, 16 << 20, on_done=done)
        else:  # equal sizes, then uneven ones
            m = np.full((n, n), 4 << 20) if c != 3 else rng.integers(1, 8, size=(n, n)) << 20
            coll.alltoallv(net, world, m, on_done=done)

    t = 0.0
    for k in range(40):
        t += float(rng.uniform(50e-6, 200e-6))
        cost = _memory_kernel(float(rng.uniform(50e-6, 300e-6))) if k % 3 == 1 else \
            gemm_cost(SPEC, 1024 * int(rng.integers(1, 4)), 4096, 4096)
        group = [list(range(8)), list(range(8, n)), world][k % 3]
        if k % 7 == 3:  # one GPU alone
            group = [int(rng.integers(n))]
        eng.schedule(ps_from_s(t), kernel, group, k, cost, int(rng.choice([108, 500, 2000])))
    for c in range(6):
        eng.schedule(ps_from_s(c * 0.7e-3), collective, c)
    eng.run()
    span = eng.now
    memo = next((g._memo for g in gpus if g._memo is not None), None)
    return (ends, [g.counters for g in gpus], [g.utilization(span) for g in gpus], eng.events_processed,
            memo.hits if memo is not None else 0)


@pytest.mark.parametrize("seed,dma", [(1, False), (2, True)])
def test_gpus_in_the_same_state_share_their_replans_with_the_same_results(seed, dma):
    """GPUs whose state is the same compute each SM and rate re-plan once per picosecond and
    share it (couple(shared=True)): every kernel and collective ends at the same picosecond and
    in the same order, counters, utilization and the engine's event count are the same, bit
    for bit, as when every GPU computes its own; here a re-plan was shared for one event in
    ten or more."""
    *same, hits = _lockstep_mix(True, seed, dma)
    *alone, no_hits = _lockstep_mix(False, seed, dma)
    assert same == alone
    assert no_hits == 0 and hits > same[3] // 10  # (same[3]: the engine's event count)
    assert len(same[0]) == sum(len([list(range(8)), list(range(8, 16)), list(range(16))][k % 3]) if k % 7 != 3 else 1
                               for k in range(40)) + 6


@pytest.mark.parametrize("shared,dma", [(True, False), (True, True), (False, False)])
def test_a_collective_begun_and_ended_on_all_its_gpus_at_once_is_each_gpu_in_turn(shared, dma):
    """comm_begin_all / comm_end_all are comm_begin / comm_end on each GPU in order: every end,
    counter, utilization, the event count and the shared re-plans are the same, bit for bit
    (GPUs on copy engines among them: their channels differ from the others')."""
    assert _lockstep_mix(shared, 3, dma, begin_all=True) == _lockstep_mix(shared, 3, dma)


def test_hand_over_steps_bundled_in_the_engine_run_as_their_own_events_would(monkeypatch):
    """The GPUs queue their SM hand-over steps with Engine.after_bundled (the steps many GPUs
    make alike share a heap entry): every end, counter, utilization, the event count and the
    shared re-plans are those of each step queued as a plain event, bit for bit."""
    bundled = _lockstep_mix(True, 5)
    monkeypatch.setattr(Engine, "_bundled", _plain_steps)
    assert _lockstep_mix(True, 5) == bundled


def _plain_steps(eng: Engine, time_ps: int, fn, args: tuple):
    """In place of ``Engine._bundled`` (behind ``after_bundled`` and a GPU's copied steps):
    each step queued as a plain event of its own."""
    return Engine.schedule(eng, time_ps, fn, *args)


def _traced(monkeypatch, run, quantum: int = 1, plain: bool = False) -> tuple[list, object]:
    """``run()`` with every event the engine runs logged, in the order it runs: its time and
    what it is (the callback and, for a GPU's events, the GPU and its kernels' SMs, rates and
    work left after it ran). Each GPU hand-over step (``Engine._bundled``, behind
    ``after_bundled``) and kernel timer (``Timer._set``, behind ``set``) is paired with a probe,
    a plain event queued for the same picosecond just after it (the next insertion sequence)
    that only logs itself: a step or timer run out of its place among the events of its
    picosecond (a bundle that runs on past an entry that comes first, a timer or step given
    another sequence) shows as a probe logged before or after where it belongs, even where no
    end or counter moves. ``quantum``: steps and timers fall on multiples of it (their times
    rounded up): events of many GPUs, and a GPU's own steps and timer, then share
    picoseconds, so that every tie's order counts. ``plain``: every step queued as an event of
    its own (:func:`_plain_steps`)."""
    log: list = []
    schedule = Engine.schedule
    queue_step = (lambda eng, t, fn, args: schedule(eng, t, fn, *args)) if plain else Engine._bundled

    def wrap(eng: Engine, fn):
        owner = getattr(fn, "__self__", None)
        lab = (getattr(fn, "__qualname__", repr(fn)), getattr(owner, "name", None))

        def traced(*args):
            fn(*args)
            state = None
            if isinstance(owner, GPUDevice):
                state = (tuple((k.held, k.rate, k.remaining) for k in owner._ks), owner._comm_rate)
            log.append((eng.now, lab, state))
        return traced, lab

    def probe(eng: Engine, time_ps: int, lab: tuple) -> None:
        schedule(eng, time_ps, lambda: log.append((eng.now, ("probe",) + lab, None)))

    def up(time_ps: int) -> int:
        return -(-time_ps // quantum) * quantum

    for name in ("schedule", "after"):
        monkeypatch.setattr(Engine, name, (lambda f: lambda self, t, fn, *a: f(self, t, wrap(self, fn)[0], *a))(
            getattr(Engine, name)))

    def step(self, time_ps, fn, args):
        traced, lab = wrap(self, fn)
        time_ps = up(time_ps)
        handle = queue_step(self, time_ps, traced, args)
        probe(self, time_ps, lab)
        return handle
    monkeypatch.setattr(Engine, "_bundled", step)
    timer, timer_set = Engine.timer, Timer._set
    monkeypatch.setattr(Engine, "timer", lambda self, fn, *a: timer(self, wrap(self, fn)[0], *a))

    def set_probed(self, time_ps):
        time_ps = up(time_ps)
        timer_set(self, time_ps)
        probe(self.engine, time_ps, ("timer",))
    monkeypatch.setattr(Timer, "_set", set_probed)
    result = run()
    monkeypatch.undo()
    return log, result


@pytest.mark.parametrize("seed,dma,slow,quantum", [(1, False, False, 1), (2, True, False, 1), (4, False, True, 1),
                                                   (1, False, False, 20_000), (4, False, True, 50_000),
                                                   (2, True, False, 1_000_000), (3, False, False, 200_000)])
def test_gpu_events_run_in_the_same_order_shared_bundled_or_each_on_its_own(monkeypatch, seed, dma, slow, quantum):
    """The strict order check of the GPU-level shortcuts: with re-plans shared between GPUs
    in the same state and hand-over steps bundled, every event the engine runs (each GPU's
    hand-over steps and kernel events, the network's, the schedule's) runs in the same order
    and leaves its GPU in the same state as with every GPU computing its own re-plans and
    every step queued as a plain event; not only the ends and counters agree. Also
    with steps and timers on a coarse grid of picoseconds (``quantum``), where most of them
    tie with others. (Checked: a bundle that runs on past a plain entry of its picosecond with
    an earlier sequence, one that never steps aside, and a copied re-plan that sets its timer
    before it queues its steps each fail here, the last on the coarse grid only.)"""
    fast_log, fast = _traced(monkeypatch, lambda: _lockstep_mix(True, seed, dma, slow=slow), quantum)
    plain_log, plain = _traced(monkeypatch, lambda: _lockstep_mix(False, seed, dma, slow=slow), quantum, plain=True)
    assert fast[:4] == plain[:4]
    assert len(fast_log) == fast[3] and len(fast_log) > 1000
    assert sum(1 for _, lab, _ in fast_log if lab[0] == "GPUDevice._on_transfer") > 100
    gpus_at: dict = {}  # picosecond -> GPUs with a step or kernel event then
    for t, lab, state in fast_log:
        if state is not None:
            gpus_at.setdefault(t, set()).add(lab[1])
    shared_ps = sum(1 for names in gpus_at.values() if len(names) > 1)
    assert shared_ps > 100
    assert fast_log == plain_log


def test_comm_begin_all_checks_its_figures():
    eng = Engine()
    gpus = [GPUDevice(eng, SPEC, name=f"g{r}") for r in range(2)]
    with pytest.raises(ValueError, match="links"):
        comm_begin_all(gpus, [100.0], 0.0)
    with pytest.raises(ValueError, match="reduce_fraction"):
        comm_begin_all(gpus, [100.0, 100.0], 1.5)
    with pytest.raises(ValueError, match="handles"):
        comm_end_all(gpus, [])
    hs = comm_begin_all(gpus, [100.0, 300.0], 0.5)
    assert [h.want for h in hs] == [8.0, 24.0] and all(g.active == 1 for g in gpus)
    comm_end_all(gpus, hs)
    assert all(g.active == 0 for g in gpus)
    with pytest.raises(ValueError, match="links"):  # (as the loop: the GPUs before it began)
        comm_begin_all(gpus, [100.0, -1.0], 0.0)
    assert [g.active for g in gpus] == [1, 0]


def test_a_slowed_link_splits_the_gpus_that_shared_their_state_with_the_same_results():
    """One slowed NIC link: the GPUs whose flows cross it are fed differently from the rest of
    their group mid-collective, so GPUs that shared a state stop sharing it (and meet again
    once idle): every end, counter, utilization and the event count are still those of every
    GPU computing its own; the collectives end at other times than unslowed, and fewer re-plans are
    shared."""
    *same, hits = _lockstep_mix(True, 4, slow=True)
    *alone, _ = _lockstep_mix(False, 4, slow=True)
    assert same == alone
    assert hits > same[3] // 10
    *even, even_hits = _lockstep_mix(True, 4)
    assert [e for e in even[0] if e[0].startswith("c")] != [e for e in same[0] if e[0].startswith("c")]
    assert hits < even_hits  # the split GPUs re-plan on their own for a while


def test_a_gpu_asked_for_its_utilization_mid_run_shares_nothing_it_should_not():
    """utilization() moves a GPU's clock (its kernels' work left) to now: a GPU asked mid-run
    leaves the token of the GPUs in its state before (their work left is the same only up to
    rounding once the clocks moved apart), and every GPU ends as it would alone."""
    def run(shared: bool) -> tuple:
        topo = Topology.from_preset("zionex", nodes=1)
        eng = Engine()
        net = Network(eng, topo)
        gpus = [GPUDevice(eng, SPEC, name=f"g{r}", interference=0.1) for r in range(2)]
        couple(net, gpus, shared=shared)
        ends: list = []
        toks: list = []
        for r, g in enumerate(gpus):  # two memory-bound kernels: HBM binds, rates below 1
            g.launch(_memory_kernel(300e-6), lambda s, e, r=r: ends.append((r, e)))
            g.launch(_memory_kernel(170e-6), lambda s, e, r=r: ends.append((r, e)))

        def ask() -> None:
            toks.append(gpus[0]._tok == gpus[1]._tok)
            gpus[0].utilization(eng.now)
            toks.append(gpus[0]._tok == gpus[1]._tok)

        eng.schedule(ps_from_s(123.456789e-6), ask)
        eng.schedule(ps_from_s(200e-6), lambda: [g.launch(_memory_kernel(80e-6), lambda s, e, r=r: ends.append((r, e)))
                                                 for r, g in enumerate(gpus)])
        eng.run()
        return ends + [g.utilization(eng.now) for g in gpus], toks

    same, toks = run(True)
    alone, _ = run(False)
    assert same == alone
    assert toks == [True, False]
