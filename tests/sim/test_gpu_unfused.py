"""The unfused embedding baseline: what Neo's fused kernels save (launches, HBM round trips)."""

from __future__ import annotations

import pytest

from neonic.sim.gpu import (UNFUSED_BACKWARD_KERNELS, embedding_backward_cost, embedding_forward_cost,
                            embedding_unfused_backward_cost, embedding_unfused_forward_cost, gpu_preset)

GPU = gpu_preset("a100-40gb")


def test_unfused_forward_pays_one_launch_per_table():
    tables = [(20000, 128, 1000, 256), (300, 64, 300, 128), (5000, 32, 1000, 64)]
    unfused = sum(embedding_unfused_forward_cost(GPU, *t).time_s for t in tables)
    work = sum((embedding_forward_cost(GPU, *t) for t in tables[1:]), embedding_forward_cost(GPU, *tables[0]))
    fused = max(work.compute_s, work.memory_s) + GPU.efficiency.launch_overhead_s
    assert unfused - fused >= (len(tables) - 1) * GPU.efficiency.launch_overhead_s * 0.999


def test_unfused_backward_materialises_gradients_and_runs_a_separate_optimizer():
    lookups, unique, row, grad, state = 100000, 20000, 256, 256, 4
    fused = embedding_backward_cost(GPU, lookups, unique, row, grad, state, total_rows=1 << 20)
    unfused = embedding_unfused_backward_cost(GPU, lookups, unique, row, grad, state)
    # the per-lookup gradient rows are written and read back (at least 2 x lookups x grad more bytes)
    assert unfused.hbm_bytes - fused.hbm_bytes >= 2 * lookups * grad
    # PyTorch's sparse path: EmbeddingBag's backward, coalesce, Adagrad's sparse-branch passes
    assert len(UNFUSED_BACKWARD_KERNELS) == 12
    # one launch per kernel, but the sort's kernels (torch.sort: all 64 key bits, 8 passes) have
    # their own fixed times; the fused backward sorts FBGEMM's way (21 bits of 2^20 rows: 3 passes)
    eff = GPU.efficiency
    torch_sort = eff.radix_sort_fixed_s + 8 * eff.radix_sort_pass_s
    assert unfused.overhead_s == pytest.approx((len(UNFUSED_BACKWARD_KERNELS) - 1) * eff.launch_overhead_s + torch_sort)
    assert fused.overhead_s == pytest.approx(eff.launch_overhead_s + eff.radix_sort_fixed_s + 3 * eff.radix_sort_pass_s)
    assert unfused.time_s > fused.time_s
    assert embedding_unfused_backward_cost(GPU, 0, 0, row, grad).time_s == 0
    with pytest.raises(ValueError, match="unique_rows"):
        embedding_unfused_backward_cost(GPU, 10, 11, row, grad)


def test_unfused_forward_copies_its_output_into_the_alltoall_buffer():
    """torch.cat of the tables' outputs: each table's pooled output read and written once more."""
    t = (20000, 128, 1000, 256)
    assert embedding_unfused_forward_cost(GPU, *t).hbm_bytes == pytest.approx(
        embedding_forward_cost(GPU, *t).hbm_bytes + 2 * 1000 * 256)
