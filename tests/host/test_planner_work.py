"""The iteration's AlltoAllv matrices: the vectorised sum of every table's traffic equals the
straightforward one, term by term (an outer product or explicit pairs per term)."""

from __future__ import annotations

import numpy as np

from neonic.host.planner import AlphaBetaComm, MemoryTiers, PlannerSystem, derive_iteration, plan_baseline
from neonic.host.planner.plan import ShardingType
from neonic.host.planner.search import Placer
from neonic.host.planner.work import COLLECTIVES, Outer
from neonic.host.workloads import workload_from_dict
from neonic.sim.gpu import gpu_preset


def reference_matrices(work, world: int) -> dict[str, np.ndarray]:
    """Every table's terms added one at a time, as the module doc defines them."""
    out = {name: np.zeros((world, world)) for name in COLLECTIVES}
    for tw in work.tables.values():
        for name, terms in tw.traffic.items():
            for term in terms:
                if isinstance(term, Outer):
                    for i in range(world):
                        for j in range(world):
                            if i != j:
                                out[name][i, j] += term.src[i] * term.dst[j]
                else:
                    for s, d, nb in zip(term.src, term.dst, term.nbytes):
                        if s != d:
                            out[name][s, d] += nb
    return out


def test_derived_matrices_equal_the_term_by_term_sum(rng):
    nodes, g = 3, 4
    comm = AlphaBetaComm(nodes=nodes, gpus_per_node=g, alpha_intra_s=1e-6, bw_intra_bytes_per_s=300e9,
                         alpha_inter_s=5e-6, bw_inter_bytes_per_s=25e9)
    system = PlannerSystem(gpu=gpu_preset("a100-40gb"), comm=comm, memory=MemoryTiers())
    n = 30
    workload = workload_from_dict({
        "name": "w", "batch_per_gpu": 128, "dense": {"bottom_mlp": [4, 8], "top_mlp": [1]},
        "tables": [{"name": f"t{i}", "rows": int(r), "dim": int(d), "pooling": float(p)} for i, (r, d, p) in
                   enumerate(zip(rng.integers(1000, 500_000, n), rng.choice([8, 32, 96], n),
                                 rng.lognormal(2.0, 1.0, n).round(1) + 1))],
    })
    plans = [plan_baseline(name, workload, system) for name in ("size-greedy", "lookup-greedy", "torchrec-greedy")]
    # every sharding type, table after table, on random ranks
    mixed = Placer(workload, system)
    types = list(ShardingType)
    for i, table in enumerate(workload.tables):
        kind = types[i % len(types)]
        if kind in (ShardingType.TABLE_ROW_WISE, ShardingType.TABLE_COLUMN_WISE):
            node = int(rng.integers(0, nodes))
            ranks = list(range(node * g, node * g + g))
        elif kind == ShardingType.TABLE_WISE:
            ranks = [int(rng.integers(0, nodes * g))]
        else:
            ranks = sorted(rng.choice(nodes * g, int(rng.integers(2, nodes * g + 1)), replace=False).tolist())
        tp = mixed.make(table, kind, ranks)
        assert tp is not None
        mixed.place(tp)
    plans.append(mixed.plan("mixed"))
    kinds = set()
    for plan in plans:
        work = derive_iteration(plan, workload, system)
        kinds |= {tp.sharding for tp in plan.tables.values()}
        ref = reference_matrices(work, system.world_size)
        for name in COLLECTIVES:
            np.testing.assert_allclose(work.matrices[name], ref[name], rtol=1e-12, atol=0.0, err_msg=name)
            assert np.all(np.diag(work.matrices[name]) == 0.0)
    assert kinds == set(ShardingType)


def test_a_compact_table_work_prices_exactly_as_its_kernels(rng):
    """The search's contributions come from :class:`CompactWork` (one kernel per shard shape):
    element for element the figures of the table work with one kernel per shard, for every
    sharding type, uneven splits and host-tier shards."""
    from dataclasses import replace

    from neonic.host.planner import CostModel
    from neonic.host.planner.plan import TablePlan
    from neonic.host.planner.work import CompactWork, compact_work, table_work

    nodes, g = 2, 4
    comm = AlphaBetaComm(nodes=nodes, gpus_per_node=g, alpha_intra_s=1e-6, bw_intra_bytes_per_s=300e9,
                         alpha_inter_s=5e-6, bw_inter_bytes_per_s=25e9)
    system = PlannerSystem(gpu=gpu_preset("a100-40gb"), comm=comm,
                           memory=MemoryTiers(dram_gib_per_node=64, ssd_gib_per_node=256))
    n = 12
    workload = workload_from_dict({
        "name": "w", "batch_per_gpu": 64, "dense": {"bottom_mlp": [4, 8], "top_mlp": [1]},
        "tables": [{"name": f"t{i}", "rows": int(r), "dim": int(d), "pooling": float(p)} for i, (r, d, p) in
                   enumerate(zip(rng.integers(1001, 90_001, n), rng.choice([12, 36, 100], n),
                                 rng.lognormal(1.0, 0.5, n).round(2) + 1))],
    })
    cost = CostModel(workload, system)
    placer = Placer(workload, system, cost)
    world = nodes * g
    checked = set()
    for i, table in enumerate(workload.tables):
        for kind in ShardingType:
            if kind in (ShardingType.TABLE_ROW_WISE, ShardingType.TABLE_COLUMN_WISE):
                ranks = list(range(g, 2 * g))
            elif kind == ShardingType.TABLE_WISE:
                ranks = [i % world]
            else:
                ranks = sorted(rng.choice(world, int(rng.integers(2, world + 1)), replace=False).tolist())
            tp = placer.make(table, kind, ranks)
            assert tp is not None
            # some shards in DRAM and on SSD (behind their HBM cache)
            tiers = rng.choice(["hbm", "dram", "ssd"], len(tp.shards))
            mixed = TablePlan(tp.table, tp.sharding, tuple(replace(s, tier=str(t)) for s, t in zip(tp.shards, tiers)))
            for plan in (tp, mixed):
                compact = compact_work(table, plan, workload, system)
                ref = table_work(table, plan, workload, system)
                assert isinstance(compact, CompactWork) and compact.expand().kernels == ref.kernels
                full = cost.contribution(compact.expand())
                fast = cost.contribution(compact)
                assert np.array_equal(fast.vec, full.vec) and fast.dp_bytes == full.dp_bytes, (kind, plan)
                checked.add((kind, any(s.tier != "hbm" for s in plan.shards)))
    assert len(checked) == 2 * len(ShardingType)


def test_column_wise_contributions_are_their_class_plans_relabeled(rng):
    """A column-wise plan's contribution is its class plan's (shard shapes per node, nodes
    sorted) relabeled: element for element the contribution computed for the plan itself, for
    uneven column splits, several shards on a node, whole nodes and host-tier shards."""
    from dataclasses import replace

    from neonic.host.planner import CostModel
    from neonic.host.planner.plan import TablePlan

    nodes, g = 4, 4
    comm = AlphaBetaComm(nodes=nodes, gpus_per_node=g, alpha_intra_s=1e-6, bw_intra_bytes_per_s=300e9,
                         alpha_inter_s=5e-6, bw_inter_bytes_per_s=25e9)
    system = PlannerSystem(gpu=gpu_preset("a100-40gb"), comm=comm,
                           memory=MemoryTiers(dram_gib_per_node=64, ssd_gib_per_node=256))
    workload = workload_from_dict({
        "name": "w", "batch_per_gpu": 64, "dense": {"bottom_mlp": [4, 8], "top_mlp": [1]},
        "tables": [{"name": f"t{i}", "rows": 5000 + 37 * i, "dim": dim, "pooling": 2.3 + i}
                   for i, dim in enumerate((36, 64, 100, 12))],
    })
    cost = CostModel(workload, system)
    world = nodes * g
    classes = set()
    for trial in range(60):
        placer = Placer(workload, system, cost)  # a fresh cache: the class plan is made for this plan
        table = workload.tables[trial % len(workload.tables)]
        kind = ShardingType.COLUMN_WISE if trial % 3 else ShardingType.TABLE_COLUMN_WISE
        m = int(rng.integers(2, min(world, table.dim // 4) + 1))
        ranks = sorted(rng.choice(world, m, replace=False).tolist())
        if trial % 5 == 0:
            ranks = list(range(g, g + min(g, m)))  # a whole node's first ranks
        tp = placer.make(table, kind, ranks)
        assert tp is not None
        if trial % 2:
            tiers = rng.choice(["hbm", "dram", "ssd"], len(tp.shards))
            tp = TablePlan(tp.table, tp.sharding, tuple(replace(s, tier=str(t)) for s, t in zip(tp.shards, tiers)))
        direct = placer._contribution(tp)
        via = placer.contribution(tp)
        assert np.array_equal(via.vec, direct.vec) and via.dp_bytes == direct.dp_bytes, tp
        classes.add(placer._column_class(tp)[0])
    assert len(classes) > 10
    # two column pieces on one rank add up there
    placer = Placer(workload, system, cost)
    tp = placer.make(workload.tables[1], ShardingType.COLUMN_WISE, [1, 2, 9])
    doubled = TablePlan(tp.table, tp.sharding, (tp.shards[0], replace(tp.shards[1], rank=1), tp.shards[2]))
    assert np.array_equal(placer.contribution(doubled).vec, placer._contribution(doubled).vec)


def test_rank_totals_compiled_equal_the_array_formula_bit_for_bit():
    """CostModel.totals (compiled loops over the ranks) gives CostModel.totals_np's figures
    (numpy's array operations), bit for bit, on random states: kernels (and their backward
    sort's keys and rows) on some ranks only,
    empty and full AlltoAll terms, host-tier misses above and below the kernels' time, with
    and without data-parallel bytes; on the system's ranks and on wider states whose ranks do
    not fill the compiler's vectors evenly (a rank's total depends on its own column only)."""
    from planner_cases import skewed_workload, small_system

    from neonic.host.planner import CostModel
    from neonic.host.planner.cost import State

    cost = CostModel(skewed_workload(6), small_system(nodes=2, g=4))
    rng = np.random.default_rng(5)
    for k in range(60):
        n = (cost.world, 13, 1029)[k % 3]
        st = State.empty(n)
        v = st.vec
        v[0:3] = rng.uniform(0, 1e-3, (3, n)) * (rng.uniform(size=(3, n)) < 0.8)
        v[2] *= rng.choice([0.0, 1.0, 4.0], size=n)
        v[3] = rng.integers(0, 3, n)
        v[4:24] = rng.uniform(0, 1e7, (20, n)) * (rng.uniform(size=(20, n)) < 0.6)
        # the backward sort's keys and rows (whole numbers, on both sides of 8-bit steps): the
        # totals leave the sort out (a proxy), whatever they hold
        v[30] = rng.integers(0, 5_000_000, n) * (v[3] > 0.5)
        v[31] = (2.0 ** rng.choice([8, 16, 24, 32], n) + rng.integers(-2, 2, n)) * (v[3] > 0.5)
        st.dp_bytes = float(rng.choice([0.0, 1e8]))
        assert cost.totals(st).tobytes() == cost.totals_np(st).tobytes()


def test_term_aggregates_compiled_equal_the_array_formula_bit_for_bit(rng):
    """A traffic term's bytes per rank (sent / received, inside / across nodes), added in one
    compiled loop, are numpy's array formula's (:func:`_term_aggregates_np`) bit for bit: outer
    products of random, one-hot and constant vectors (whose node and cluster sums numpy adds
    pairwise) and explicit pairs with self-transfers and repeats, into empty and used rows,
    from 8 to 1024 ranks."""
    from neonic.host.planner.work import Pairs, _term_aggregates, _term_aggregates_np

    for world, g in ((8, 4), (16, 8), (128, 8), (136, 8), (1024, 8)):
        node_of = np.arange(world) // g
        for trial in range(8):
            shape = rng.integers(0, 3, 2)
            vecs = []
            for s in shape:
                if s == 0:
                    v = rng.uniform(0, 1e6, world) * 10.0 ** rng.integers(-3, 4, world)
                elif s == 1:
                    v = np.zeros(world)
                    v[rng.choice(world, int(rng.integers(1, 9)), replace=False)] = rng.uniform(1, 1e5)
                else:
                    v = np.full(world, rng.uniform(1, 1e5))
                vecs.append(v)
            k = int(rng.integers(1, 3 * world))
            pairs = Pairs(rng.integers(0, world, k), rng.integers(0, world, k), rng.uniform(0, 1e6, k))
            for term in (Outer(*vecs), pairs):
                start = rng.uniform(0, 1e6, (4, world)) if trial % 2 else np.zeros((4, world))
                fast, ref = start.copy(), start.copy()
                _term_aggregates(fast, term, node_of, g)
                _term_aggregates_np(ref, term, node_of, g)
                assert fast.tobytes() == ref.tobytes(), (world, trial, type(term).__name__)


def test_pooled_pattern_compiled_equals_the_array_formula_bit_for_bit(rng):
    """The pooled AlltoAll's message pattern of every sharding type's table work (table-row-wise
    over whole, half and quarter nodes among them) is numpy's array formula's, bit for bit."""
    from planner_cases import skewed_workload, small_system

    from neonic.host.planner.cost import pooled_pattern, pooled_pattern_np
    from neonic.host.planner.work import table_work

    system = small_system(nodes=2, g=4)
    workload = skewed_workload(6)
    placer = Placer(workload, system)
    world = system.world_size
    seen = set()
    for table in workload.tables:
        for kind in ShardingType:
            options = {ShardingType.TABLE_ROW_WISE: [[4, 5, 6, 7], [0, 1], [6]],
                       ShardingType.TABLE_COLUMN_WISE: [[0, 1, 2, 3]], ShardingType.TABLE_WISE: [[5]]}.get(
                kind, [sorted(rng.choice(world, int(rng.integers(2, world + 1)), replace=False).tolist())])
            for ranks in options:
                tp = placer.make(table, kind, ranks)
                if tp is None:
                    continue
                tw = table_work(table, tp, workload, system)
                fast = pooled_pattern(tw, world, 4)
                ref = pooled_pattern_np(tw, world, 4)
                assert all(a.tobytes() == b.tobytes() for a, b in zip(fast, ref)), (kind, ranks)
                seen.add(kind)
    assert seen == set(ShardingType)


def test_barrier_sums_compiled_equal_the_array_formula_bit_for_bit():
    """CostModel.barrier_sum_batch (each phase's slowest rank in one compiled loop) gives
    CostModel.barrier_sum_batch_np's figures (numpy's array operations), bit for bit, on random
    stacks of states: kernels on some ranks only, host-tier misses that outlast a kernel, empty
    and full AlltoAll terms, with and without data-parallel bytes."""
    from planner_cases import skewed_workload, small_system

    from neonic.host.planner import CostModel

    for nodes, g in ((2, 4), (4, 8)):
        cost = CostModel(skewed_workload(6), small_system(nodes=nodes, g=g))
        rng = np.random.default_rng(7)
        for _ in range(20):
            T = int(rng.integers(1, 9))
            vecs = np.zeros((T, 30, cost.world))
            vecs[:, 0:2] = rng.uniform(0, 1e-3, (T, 2, cost.world)) * (rng.uniform(size=(T, 2, cost.world)) < 0.8)
            vecs[:, 2] = rng.uniform(0, 3e-3, (T, cost.world)) * (rng.uniform(size=(T, cost.world)) < 0.3)
            vecs[:, 3] = rng.integers(0, 3, (T, cost.world))
            vecs[:, 4:24] = rng.uniform(0, 1e7, (T, 20, cost.world)) * (rng.uniform(size=(T, 20, cost.world)) < 0.6)
            dps = rng.choice([0.0, 1e8], T)
            assert cost.barrier_sum_batch(vecs, dps).tobytes() == cost.barrier_sum_batch_np(vecs, dps).tobytes()


def test_plans_built_from_their_arrays_are_the_plans_with_their_shards():
    """The plans the placer keys its cached contributions by (rank-0 table-wise, a replica,
    a column-wise class plan), built from arrays: the same shards, shard arrays and work."""
    from neonic.host.planner import CostModel
    from neonic.host.planner.placer import _plan_of
    from neonic.host.planner.work import compact_work, table_work
    from neonic.host.planner.plan import Shard, TablePlan

    workload = workload_from_dict({
        "name": "w", "batch_per_gpu": 64, "dense": {"bottom_mlp": [4, 8], "top_mlp": [1]},
        "tables": [{"name": "t0", "rows": 5003, "dim": 36, "pooling": 2.5}],
    })
    system = PlannerSystem(gpu=gpu_preset("a100-40gb"), comm=AlphaBetaComm(
        nodes=2, gpus_per_node=4, alpha_intra_s=1e-6, bw_intra_bytes_per_s=300e9, alpha_inter_s=5e-6,
        bw_inter_bytes_per_s=25e9), memory=MemoryTiers(dram_gib_per_node=64, ssd_gib_per_node=256))
    table = workload.tables[0]
    cost = CostModel(workload, system)
    for kind, shards in ((ShardingType.TABLE_WISE, [(0, 0, 5003, 0, 36, "hbm")]),
                         (ShardingType.DATA_PARALLEL, [(0, 0, 5003, 0, 36, "dram")]),
                         (ShardingType.COLUMN_WISE, [(0, 0, 5003, 0, 12, "hbm"), (1, 0, 5003, 0, 12, "ssd"),
                                                     (4, 0, 5003, 0, 12, "hbm")])):
        made = _plan_of("t0", kind, shards)
        spelled = TablePlan("t0", kind, tuple(Shard(*s) for s in shards))
        assert made == spelled and made.shards == spelled.shards
        for a, b in zip(made.shard_arrays(), spelled.shard_arrays()):
            assert a.dtype == b.dtype and np.array_equal(a, b)
        ours = compact_work(table, made, workload, system)
        assert ours.expand().kernels == table_work(table, spelled, workload, system).kernels
        want = cost.contribution(compact_work(table, spelled, workload, system))
        assert np.array_equal(cost.contribution(ours).vec, want.vec)


def test_a_node_bound_plans_base_made_ahead_is_the_one_its_plans_are_relabeled_from():
    """Placer.node_base makes the contribution that a table-row-wise plan over an aligned group
    of a node's ranks, in HBM, is relabeled from: such a plan then finds it made (the same
    object), and its contribution is the plan's own, element for element."""
    workload = workload_from_dict({
        "name": "w", "batch_per_gpu": 64, "dense": {"bottom_mlp": [4, 8], "top_mlp": [1]},
        "tables": [{"name": "t0", "rows": 5003, "dim": 36, "pooling": 2.5}],
    })
    system = PlannerSystem(gpu=gpu_preset("a100-40gb"), comm=AlphaBetaComm(
        nodes=2, gpus_per_node=4, alpha_intra_s=1e-6, bw_intra_bytes_per_s=300e9, alpha_inter_s=5e-6,
        bw_inter_bytes_per_s=25e9), memory=MemoryTiers())
    table = workload.tables[0]
    placer = Placer(workload, system)
    placer.node_base(table, ShardingType.TABLE_ROW_WISE, 2)
    assert len(placer._node_cache) == 1
    made = next(iter(placer._node_cache._d.values()))[0]
    for ranks in ([2, 3], [4, 5], [0, 1]):
        tp = placer.make(table, ShardingType.TABLE_ROW_WISE, ranks)
        base, _ = placer._contribution_base(tp)
        assert base is made and len(placer._node_cache) == 1
        assert np.array_equal(placer.contribution(tp).vec, placer._contribution(tp).vec)
