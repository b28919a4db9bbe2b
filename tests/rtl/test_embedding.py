"""The embedding gather/pool unit in Amaranth's simulator: bit-exact against the numpy
reference on random configurations and workloads (random memory latency, idle input,
backpressure, response gaps), every edge case of the semantics, protocol slips, and the
parameter checks."""

from __future__ import annotations

import numpy as np
import pytest

from neonic.sim.units.embedding import Beat, Workload, random_workload, run_amaranth_episodes
from neonic.rtl.embedding import ELEM_TYPE_CODES, POOLING_CODES, EmbeddingBagUnit
from neonic.sim.reference import embedding as ref


# -- parameters ---------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
@pytest.mark.parametrize("kwargs, name", [
    (dict(lanes=0), "lanes"),
    (dict(lanes=3), "lanes"),
    (dict(data_bytes=16, lanes=8), "lanes"),
    (dict(max_dim=0), "max_dim"),
    (dict(max_dim=100_000), "max_dim"),
    (dict(data_bytes=16, lanes=4, max_dim=1024, beats_width=6), "max_dim"),
    (dict(elem_types=("fp32", "fp8")), "elem_types"),
    (dict(elem_types=()), "elem_types"),
    (dict(elem_types="fp32"), "elem_types"),
    (dict(outstanding=0), "outstanding"),
    (dict(tables=0), "tables"),
    (dict(data_bytes=48), "data_bytes"),
    (dict(add_latency=0), "add_latency"),
    (dict(add_latency=10), "add_latency"),
    (dict(mul_latency=12), "mul_latency"),
    (dict(mul_latency=2), "mul_latency"),     # the accumulator is read 3 stages ahead
    (dict(interleave=3), "interleave"),
    (dict(interleave=16), "interleave"),
    (dict(slot_depth=2), "slot_depth"),
])
def test_bad_parameters_are_refused_naming_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name}:"):
        EmbeddingBagUnit(**kwargs)


def test_codes_match_the_reference_model():
    assert tuple(ELEM_TYPE_CODES) == ref.ELEM_TYPES
    assert tuple(POOLING_CODES) == ref.POOLING
    for et, code in ELEM_TYPE_CODES.items():
        assert ref.ELEM_TYPES.index(et) == code


# -- random configurations and workloads --------------------------------------------------------

CONFIGS = {
    # one word per beat, every element type
    "lanes4_all_types": dict(data_bytes=16, lanes=4, max_dim=24, tables=4, outstanding=6,
                             max_bag_length=15),
    # two FP32 words per beat (four 16-bit words): dims rarely a multiple of the lanes
    "lanes2_fp32_fp16": dict(data_bytes=16, lanes=2, max_dim=9, tables=3, outstanding=3,
                             max_bag_length=15, elem_types=("fp32", "fp16")),
    # the FP units at their full pipeline depths (the timing-closure configuration)
    "lanes2_full_fp_pipelines": dict(data_bytes=8, lanes=2, max_dim=12, tables=2,
                                     outstanding=4, max_bag_length=7, add_latency=9,
                                     mul_latency=11),
    # no interleaving: one bag accumulates at a time (the read-add-write hazard shows)
    "lanes2_no_interleave": dict(data_bytes=8, lanes=2, max_dim=8, tables=2, outstanding=4,
                                 max_bag_length=7, interleave=1, slot_depth=4),
    # eight lanes: the control flags, weights and reciprocals reach the lanes through two
    # fan-out register levels (``fanout_stages``), weighted and MEAN bags among the random ones
    "lanes8_fanout_tree": dict(data_bytes=32, lanes=8, max_dim=20, tables=3, outstanding=4,
                               max_bag_length=7, add_latency=3, mul_latency=3),
    "lanes1_fp32_bf16": pytest.param(
        dict(data_bytes=8, lanes=1, max_dim=5, tables=2, outstanding=2, max_bag_length=7,
             elem_types=("fp32", "bf16")), marks=pytest.mark.slow),
}


def _check_counters(unit: EmbeddingBagUnit, wl: Workload, counters: dict[str, int]) -> None:
    contributing = [ref.contributing(wl.tables[b.table], b) for b in wl.bags]
    rows = sum(int(c.sum()) for c in contributing)
    beats = sum(int(c.sum()) * ref.row_stride_beats(wl.tables[b.table].dim,
                                                    wl.tables[b.table].elem_type,
                                                    unit.data_bytes)
                for b, c in zip(wl.bags, contributing))
    dropped = sum(int(((b.indices < 0) | (b.indices >= wl.tables[b.table].num_rows)).sum())
                  for b in wl.bags)
    padding = sum(int((b.indices == wl.tables[b.table].padding_idx).sum()) for b in wl.bags
                  if wl.tables[b.table].padding_idx is not None)
    assert counters["bags_in"] == counters["bags_out"] == len(wl.bags)
    assert counters["indices_padding"] == padding
    assert counters["rows_requested"] == rows
    assert counters["beats_read"] == beats
    assert counters["indices_dropped"] == dropped
    assert counters["protocol_errors"] == counters["desc_rejected"] == 0
    assert counters["busy_cycles"] >= beats


@pytest.mark.parametrize("config", list(CONFIGS.values()), ids=list(CONFIGS))
def test_random_workloads_are_bit_exact_under_random_stalls(config, rng):
    unit = EmbeddingBagUnit(**config)
    workloads = [random_workload(rng, unit, num_bags=14, max_len=7) for _ in range(3)]
    results = run_amaranth_episodes(unit, workloads, rng=rng)   # scoreboards every episode
    for wl, res in zip(workloads, results):
        _check_counters(unit, wl, res.counters)


@pytest.mark.parametrize("config", ["lanes2_full_fp_pipelines", "lanes8_fanout_tree"])
def test_delay_memory_keeps_the_cycles_and_the_bits(config, seed=11):
    """``delay_memory`` (the values beside the multipliers in LUT RAM): bit-exact (the
    episodes' scoreboards) and cycle for cycle the unit with registers: the same cycles and
    counters on the same random workloads, stalls and latencies."""
    figures = []
    for delay_memory in (False, True):
        unit = EmbeddingBagUnit(**CONFIGS[config], delay_memory=delay_memory)
        rng = np.random.default_rng(seed)
        workloads = [random_workload(rng, unit, num_bags=12, max_len=7) for _ in range(2)]
        results = run_amaranth_episodes(unit, workloads, rng=np.random.default_rng(seed + 1))
        figures.append([(r.cycles, r.counters) for r in results])
    assert figures[0] == figures[1]


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_a_reset_keeps_the_data_registers_and_the_next_bags_stay_bit_exact(rng):
    """Only valid and control state has a reset (the FP pipelines, the slices' entries and
    the pipeline contexts' fields have none): after a reset of a unit whose data registers
    hold the last bags' values, the next bags are still bit-exact, and as fast as the same
    bags on a fresh unit."""
    from amaranth.hdl import ClockDomain, Elaboratable, Module

    from neonic.sim.harness import AmaranthMemory, run_amaranth, stream_recv, stream_send
    from neonic.sim.units.embedding import (Scoreboard, combined_placement, decode_beat,
                                            episode_stimulus)

    class WithReset(Elaboratable):
        def __init__(self, unit):
            self.unit, self.cd = unit, ClockDomain("sync")

        def elaborate(self, platform):
            m = Module()
            m.domains.sync = self.cd
            m.submodules.unit = self.unit
            return m

    wl_rng = np.random.default_rng(11)
    config = CONFIGS["lanes4_all_types"]
    before, after = (random_workload(wl_rng, EmbeddingBagUnit(**config), num_bags=10,
                                     max_len=6, stress=False) for _ in range(2))

    def run(workloads):
        # the workloads one after the other, the unit reset between them; the busy cycles
        # and the beats of each
        unit = EmbeddingBagUnit(**config)
        contents, placements = combined_placement(unit, workloads)
        mem = AmaranthMemory(unit.mem, contents, data_bytes=unit.data_bytes, rng=rng,
                             latency=(8, 8), max_outstanding=64)
        stimuli = [episode_stimulus(unit, wl, p) for wl, p in zip(workloads, placements)]
        top, cycles = WithReset(unit), []

        async def bench(ctx):
            for k, (descs, items, expected) in enumerate(stimuli):
                if k:
                    ctx.set(top.cd.rst, 1)
                    await ctx.tick()
                    await ctx.tick()
                    ctx.set(top.cd.rst, 0)
                await stream_send(ctx, unit.desc, descs)
                start = ctx.get(unit.counters.busy_cycles)
                await stream_send(ctx, unit.bags, items)
                got = await stream_recv(ctx, unit.pooled, len(expected))
                while ctx.get(unit.busy):
                    await ctx.tick()
                cycles.append(ctx.get(unit.counters.busy_cycles) - start)
                Scoreboard(expected, [decode_beat(unit, p) for p in got]).check()

        run_amaranth(top, [bench], processes=[mem.process], max_cycles=20_000)
        return cycles

    fresh = run([after])
    reset = run([before, after])
    assert len(reset) == 2 and reset[1] == fresh[0] > 0


def test_interleaved_bags_hide_the_adder_and_stay_bit_exact(rng):
    """Short rows (one word each) of consecutive bags: with one bag at a time each row waits
    ``add_latency + 1`` cycles for the previous row's sum; interleaving four bags' rows shares
    that distance between them. Both runs are scoreboarded (every beat, in bag order)."""
    from neonic.sim.units.embedding import benchmark_workload
    cycles = {}
    for k in (1, 4):
        unit = EmbeddingBagUnit(data_bytes=16, lanes=4, max_dim=8, tables=1, outstanding=8,
                                max_bag_length=15, elem_types=("fp32",), interleave=k)
        wl = benchmark_workload(np.random.default_rng(3), num_bags=8, tables=1, rows=50,
                                dim=4, length=10, latency=(4, 4))
        res = run_amaranth_episodes(unit, [wl], rng=rng)[0]
        _check_counters(unit, wl, res.counters)
        cycles[k] = res.cycles
    assert cycles[1] >= 8 * 9 * unit.timing.hazard_distance
    assert cycles[4] * 2 <= cycles[1]


# -- edge cases ----------------------------------------------------------------------------------

EDGE_UNIT = dict(data_bytes=16, lanes=4, max_dim=24, tables=6, outstanding=4, max_bag_length=15)


def _edge_tables(rng) -> list[ref.Table]:
    t_max = ref.random_table(rng, 6, 5, "fp32", "max")
    rows = t_max.rows.copy()
    rows[1] = rows[0]                      # exact ties across a whole row
    rows[2, 0], rows[3, 0] = -0.0, 0.0     # +0 / -0 compare equal: the first one wins
    rows[2, 1], rows[3, 1] = 5.0, 5.0
    rows[4, 2] = np.nan                    # NaN: kept when first, ignored when later
    fp16 = ref.random_table(rng, 5, 24, "fp16", "sum")
    f16 = fp16.rows.copy()
    f16[0, :4] = np.array([6e-8, -6e-8, 3e-5, 65504], dtype=np.float16)  # subnormals, max
    return [
        ref.random_table(rng, 8, 6, "fp32", "sum", padding_idx=2),
        ref.random_table(rng, 6, 4, "fp32", "mean", padding_idx=0),
        ref.Table(rows, "fp32", "max"),
        ref.Table(f16, "fp16", "sum"),
        ref.random_table(rng, 5, 9, "bf16", "mean"),
        ref.random_table(rng, 4, 1, "fp32", "max"),
    ]


def _edge_bags(rng) -> list[ref.Bag]:
    def bag(t, idx, w=None):
        return ref.Bag(t, np.array(idx, dtype=np.int64),
                       None if w is None else np.array(w, dtype=np.float32))
    bags = [
        bag(0, []), bag(1, []), bag(2, []),                # empty bags: zeros in every mode
        bag(0, [2, 2]),                                    # only padding: zeros
        bag(0, [1, 2, 3], [0.5, 3.0, -2.0]),               # weighted SUM, padding in between
        bag(0, [7, 8, 1]),                                 # 8 is out of range: dropped
        bag(0, [-1]),                                      # negative index: dropped
        bag(1, [0, 3, 0, 5]),                              # MEAN counts 2 rows, not 4
        bag(1, [3, 4], [2.0, -0.25]),                      # weighted MEAN
        bag(2, [2, 3]), bag(2, [3, 2]), bag(2, [0, 1]),    # MAX ties keep the first row
        bag(2, [1, 0], [4.0, -1.0]),                       # MAX ignores weights
        bag(3, [0, 1, 2, 3, 4]),                           # FP16 widening, subnormals
        bag(4, [1, 1, 2]),                                 # BF16 MEAN
        bag(5, [3, 2, 1, 0]),                              # dim 1
        bag(0, list(rng.integers(0, 8, size=15))),         # max_bag_length
        bag(2, [4, 5]), bag(2, [5, 4]),                    # MAX and NaN (torch CPU's rule)
    ]
    return [ref.Bag(b.table, b.indices, b.weights, tag=100 + i) for i, b in enumerate(bags)]


def _error_episode(rng) -> tuple[Workload, ref.Table]:
    """Bad descriptors and protocol slips: nothing hangs, nothing is silently lost."""
    t0 = ref.random_table(rng, 4, 4, "fp32", "sum")

    def descs(placement):
        good = ref.descriptor_payloads([t0], placement)[0]
        return [good,
                {**good, "table": 1, "dim": 0},                 # no dimension
                {**good, "table": 2, "elem_type": 3},           # unknown element type
                {**good, "table": 3, "pooling": 3},             # unknown pooling
                {**good, "table": 7}]                           # no such table (tables=6)

    def header(table, length, tag):
        return {"header": 1, "body": {"bag": {"table": table, "length": length,
                                              "weighted": 0, "tag": tag}}}

    def index(i):
        return {"header": 0, "body": {"item": {"index": i, "weight": 0}}}

    items = [header(1, 2, 1), index(0), index(1),           # invalid table: error beat
             header(2, 0, 2),                               # invalid table, empty
             index(3),                                      # stray index: dropped
             header(0, 3, 3), index(1),                     # closed early by the next header
             header(0, 1, 4), index(2),
             header(5, 1, 5), index(0),                     # never written
             header(7, 0, 6)]                               # out of range table id
    zero = (0, 0, 0, 0)

    def bits(v):
        return tuple(int(x) for x in np.asarray(v, dtype=np.float32).view(np.uint32))

    partial = ref.pool([t0], [ref.Bag(0, np.array([1]))])[0]
    row2 = ref.pool([t0], [ref.Bag(0, np.array([2]))])[0]
    expected = [Beat(1, 1, 1, 1, 0, zero), Beat(2, 1, 1, 1, 0, zero),
                Beat(3, 1, 1, 1, 0, bits(partial)), Beat(4, 1, 1, 0, 0, bits(row2)),
                Beat(5, 1, 1, 1, 0, zero), Beat(6, 1, 1, 1, 0, zero)]
    return Workload([t0], [], descs=descs, items=items, expected=expected,
                    latency=(1, 12), idle=0.3, backpressure=0.3), t0


def test_edge_cases_and_protocol_errors(rng):
    unit = EmbeddingBagUnit(**EDGE_UNIT)
    tables = _edge_tables(rng)
    bags = _edge_bags(rng)
    errors, _ = _error_episode(rng)
    plain = Workload(tables, bags, latency=(1, 3))
    stressed = Workload(tables, bags, latency=(1, 40), mem_outstanding=3, resp_stall=0.3,
                        idle=0.4, backpressure=0.5)
    res_err, res_plain, res_stress = run_amaranth_episodes(unit, [errors, plain, stressed],
                                                           rng=rng)
    assert res_err.counters["desc_rejected"] == 4
    assert res_err.counters["protocol_errors"] == 2
    assert res_err.counters["bags_out"] == 6
    for res in (res_plain, res_stress):
        _check_counters(unit, plain, res.counters)

    # A few outcomes stated by hand (independently of the reference model).
    by_tag = {}
    for beat in res_plain.beats:
        by_tag.setdefault(beat.tag, []).append(beat)
    vec = {tag: np.array(sum((b.data for b in beats), ()), dtype=np.uint32).view(np.float32)
           for tag, beats in by_tag.items()}
    for tag in (100, 101, 102, 103):                      # empty and all-padding bags
        assert not vec[tag].view(np.uint32).any()
    assert [b.dropped for b in by_tag[105]] == [1, 1] and by_tag[104][0].dropped == 0
    t1 = tables[1].rows
    np.testing.assert_array_equal(vec[107][:4], (t1[3] + t1[5]) * np.float32(0.5))
    assert vec[109].view(np.uint32)[0] == 0x80000000        # max(-0, +0) keeps -0
    assert vec[110].view(np.uint32)[0] == 0x00000000        # max(+0, -0) keeps +0
    np.testing.assert_array_equal(vec[112][:5], np.maximum(tables[2].rows[1],
                                                           tables[2].rows[0]))
    f16 = tables[3].rows.astype(np.float32)
    np.testing.assert_allclose(vec[113][:24], f16.sum(axis=0), rtol=1e-6, atol=1e-12)
    assert np.isnan(vec[117][2])                            # a NaN first row stays
    assert vec[118][2] == tables[2].rows[5, 2]              # a later NaN row is ignored


# -- the unit as the command line sees it -----------------------------------------------------


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_unit_entry_refuses_bad_params():
    from neonic.sim.units.embedding import build
    with pytest.raises(ValueError, match="^lanes:"):
        build({"lanes": "0"})
    with pytest.raises(ValueError, match="^lanes: expected an integer"):
        build({"lanes": "four"})
    with pytest.raises(ValueError, match="colour"):
        build({"colour": "red"})
    with pytest.raises(ValueError, match="^elem_types:"):
        build({"elem_types": "fp32+int4"})
    unit = build({"lanes": "4", "data_bytes": "16", "elem_types": "fp32+bf16"})
    unit._MustUse__silence = True       # built for its parameters only
    assert (unit.lanes, unit.data_bytes, unit.elem_types) == (4, 16, ("fp32", "bf16"))


def test_simulate_writes_figures_and_a_waveform(tmp_path):
    import json

    from neonic.host.units import SimRequest
    from neonic.sim.units.embedding import simulate
    workload = {"kind": "benchmark", "num_bags": 3, "tables": 1, "rows": 40, "dim": 16,
                "length": 5, "latency": [5, 9], "empty_every": 1}
    req = SimRequest(sim="amaranth", out=tmp_path, seed=3, vcd=tmp_path / "embedding.vcd",
                     params={"data_bytes": "8", "lanes": "2", "max_dim": "16",
                             "elem_types": "fp32"},
                     extra={"workload": workload})
    figures = simulate(req)
    assert json.loads((tmp_path / "figures.json").read_text()) == figures
    assert (tmp_path / "embedding.vcd").stat().st_size > 0
    assert figures["bags"] == 5 and figures["rows"] == 15
    assert figures["beats_read"] == 15 * 8
    assert figures["max_abs_error_vs_reference"] == 0.0
    assert figures["max_error_vs_float64_over_bound"] <= 1.0
    assert abs(figures["timing_model_rel_error"]) <= 0.05


def test_no_combinational_path_crosses_the_units_ports():
    """Every ``ready`` the unit drives and every ``valid`` it offers comes from a flip-flop:
    toggling what the other side drives (its ``valid``s and ``ready``s) within a cycle changes
    none of them. So the unit's stalls (the accumulator hazard, a full queue) never reach the
    memory or cache on its port, nor the producer of its bags."""
    from amaranth.sim import Simulator

    unit = EmbeddingBagUnit(data_bytes=16, lanes=4, max_dim=16, tables=2, outstanding=4,
                            max_bag_length=7, elem_types=("fp32",))
    rng = np.random.default_rng(7)
    driven_in = [unit.bags.valid, unit.mem.req.ready, unit.mem.resp.valid, unit.pooled.ready]
    outputs = [unit.bags.ready, unit.mem.req.valid, unit.mem.resp.ready, unit.pooled.valid]

    async def bench(ctx):
        ctx.set(unit.desc.valid, 1)
        ctx.set(unit.desc.payload, {"table": 0, "base": 0, "rows": 100, "dim": 16})
        await ctx.tick()
        ctx.set(unit.desc.valid, 0)
        for cycle in range(300):
            header = cycle % 5 == 0
            ctx.set(unit.bags.payload.header, header)
            ctx.set(unit.bags.payload.body.bag.length, 4) if header else \
                ctx.set(unit.bags.payload.body.item.index, int(rng.integers(0, 100)))
            values = [int(rng.integers(0, 2)) for _ in driven_in]
            for sig, v in zip(driven_in, values):
                ctx.set(sig, v)
            before = [ctx.get(o) for o in outputs]
            for sig, v in zip(driven_in, values):
                ctx.set(sig, 1 - v)
            assert [ctx.get(o) for o in outputs] == before, f"cycle {cycle}"
            for sig, v in zip(driven_in, values):
                ctx.set(sig, v)
            await ctx.tick()

    sim = Simulator(unit)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
