"""The GPU device model: presets match the data sheets, costs follow the roofline."""

from __future__ import annotations

import pytest

from neonic.sim.gpu import (
    GPU_PRESETS,
    GPUEfficiency,
    GPUSpec,
    KernelCost,
    embedding_backward_cost,
    embedding_forward_cost,
    fits_in_hbm,
    gemm_cost,
    gemm_wave_efficiency,
    gpu_preset,
    hbm_capacity_bytes,
    interaction_cost,
    mlp_cost,
)


def test_presets_match_reference_figures():
    a100 = gpu_preset("a100-40gb")
    assert a100.peak_flops("fp16") == 312e12
    assert a100.peak_flops("tf32") == 156e12
    assert a100.peak_flops("fp32") == 19.5e12
    assert a100.hbm_bytes_per_s == 1555e9
    assert a100.hbm_bytes == 40 * 2**30
    h100 = gpu_preset("h100-sxm-80gb")
    assert h100.peak_flops("bf16") == 990e12
    assert h100.hbm_bytes_per_s == 3350e9
    assert h100.hbm_bytes == 81559 * 2**20   # nvidia-smi on an H100 80GB HBM3 (sim/data/nvidia-h100.json)


def test_unknown_preset_and_dtype_are_named():
    with pytest.raises(ValueError, match="gpu: unknown preset 'b200'"):
        gpu_preset("b200")
    with pytest.raises(ValueError, match="dtype"):
        gemm_cost(gpu_preset("a100-40gb"), 8, 8, 8, "fp64")
    with pytest.raises(ValueError, match="fp8"):
        gpu_preset("a100-40gb").peak_flops("fp8")


def test_bad_spec_fields_are_named():
    with pytest.raises(ValueError, match="gpu.hbm_gbytes_per_s"):
        GPUSpec(name="x", peak_tflops={"fp16": 1.0}, hbm_gbytes_per_s=0, hbm_gib=1, num_sms=1)
    with pytest.raises(ValueError, match="gpu.peak_tflops.fp64"):
        GPUSpec(name="x", peak_tflops={"fp64": 1.0}, hbm_gbytes_per_s=1, hbm_gib=1, num_sms=1)
    with pytest.raises(ValueError, match="efficiency.gemm"):
        GPUEfficiency(gemm=1.5)


def test_large_gemm_is_compute_bound_at_efficiency_times_peak():
    gpu = gpu_preset("a100-40gb")
    c = gemm_cost(gpu, 8192, 8192, 8192, "fp16")
    assert c.flops == 2 * 8192**3
    assert c.compute_s > c.memory_s
    # 2048 tiles of 256x128 fill 19 waves of 108 SMs all but 4 slots
    assert gemm_wave_efficiency(gpu, 8192, 8192) == pytest.approx(2048 / (19 * 108))
    expected = c.flops / (312e12 * gpu.efficiency.gemm * 2048 / (19 * 108)) + gpu.efficiency.launch_overhead_s
    assert c.time_s == pytest.approx(expected)


def test_gemm_efficiency_starts_from_the_published_large_gemm_fraction():
    """A100 SXM BF16: 271.2 of 312 TFLOP/s (the MAMF table cited in GPUEfficiency.gemm); the
    H100's measured fraction (sim/data/nvidia-h100.json) agrees with that table's 794.5 of 989."""
    assert gpu_preset("a100-40gb").efficiency.gemm == pytest.approx(271.2 / 312, abs=1e-3)
    assert gpu_preset("h100-sxm-80gb").efficiency.gemm == pytest.approx(794.5 / 989, abs=5e-3)


def test_thin_gemms_lose_to_wave_quantization():
    """A DLRM layer at local batch 512: 512 x 3696 outputs are 116 tiles of 128x128 on 108 SMs,
    two waves of which the second is nearly empty (NVIDIA DU-09799-001, section 3.2)."""
    gpu = gpu_preset("a100-40gb")
    tile = 3696 / 3712  # the last column of tiles is partly padding
    assert gemm_wave_efficiency(gpu, 512, 3696) == pytest.approx(tile * 116 / 216)
    # exactly one full wave: 108 tiles of 256x128 (a 27 x 4 grid)
    assert gemm_wave_efficiency(gpu, 27 * 256, 4 * 128) == pytest.approx(1.0)
    thin = gemm_cost(gpu, 512, 3696, 3696)
    assert thin.compute_s == pytest.approx(thin.flops / (312e12 * gpu.efficiency.gemm * tile * 116 / 216))


def test_skinny_gemm_is_memory_bound():
    gpu = gpu_preset("a100-40gb")
    c = gemm_cost(gpu, 1, 8192, 8192, "fp16")  # a matrix-vector product
    assert c.memory_s > c.compute_s
    assert c.hbm_bytes == 2 * (8192 + 8192 * 8192 + 8192)


def test_h100_is_faster_than_a100_for_the_same_mlp():
    widths = [512, 2048, 2048, 2048, 1]
    a = mlp_cost(gpu_preset("a100-40gb"), 2048, widths).time_s
    h = mlp_cost(gpu_preset("h100-sxm-80gb"), 2048, widths).time_s
    assert h < a


def test_mlp_backward_costs_about_twice_forward():
    gpu = gpu_preset("a100-40gb")
    widths = [1024, 4096, 4096, 4096, 4096]
    fwd = mlp_cost(gpu, 4096, widths)
    bwd = mlp_cost(gpu, 4096, widths, backward=True)
    assert 1.6 < bwd.flops / fwd.flops < 2.0  # the first layer's data gradient is skipped
    assert bwd.time_s > fwd.time_s


def test_embedding_forward_scales_with_lookups_and_rounds_rows_to_sectors():
    gpu = gpu_preset("a100-40gb")
    small = embedding_forward_cost(gpu, 1000, 8, 100, 8)
    sector = embedding_forward_cost(gpu, 1000, 32, 100, 8)
    assert small.hbm_bytes - 4000 - 800 == sector.hbm_bytes - 4000 - 800 == 1000 * 32
    big = embedding_forward_cost(gpu, 1_000_000, 256, 10_000, 256)
    bigger = embedding_forward_cost(gpu, 2_000_000, 256, 10_000, 256)
    assert bigger.time_s > 1.9 * (big.time_s - big.overhead_s)
    assert big.memory_s > big.compute_s  # gathers are bandwidth bound


def test_embedding_backward_touches_each_unique_row_once():
    gpu = gpu_preset("a100-40gb")
    few = embedding_backward_cost(gpu, 100_000, 1_000, 256, 256, total_rows=1 << 20)
    many = embedding_backward_cost(gpu, 100_000, 100_000, 256, 256, total_rows=1 << 20)
    assert many.hbm_bytes - few.hbm_bytes == pytest.approx(99_000 * 2 * (256 + 32))
    assert many.time_s > few.time_s
    with pytest.raises(ValueError, match="unique_rows"):
        embedding_backward_cost(gpu, 10, 11, 256, 256, total_rows=100)


def test_interaction_backward_doubles_forward():
    gpu = gpu_preset("a100-40gb")
    f = interaction_cost(gpu, 512, 27, 128)
    b = interaction_cost(gpu, 512, 27, 128, backward=True)
    assert b.flops == 2 * f.flops


def test_kernel_costs_add_back_to_back():
    gpu = gpu_preset("a100-40gb")
    a = gemm_cost(gpu, 4096, 4096, 4096)
    b = gemm_cost(gpu, 1, 4096, 4096)
    assert (a + b).time_s == pytest.approx(a.time_s + b.time_s)
    assert (a + b).scaled(1.0).time_s == pytest.approx(a.time_s + b.time_s)
    assert KernelCost().time_s == 0


def test_capacity_reserves_a_share_of_hbm():
    gpu = gpu_preset("a100-40gb")
    assert hbm_capacity_bytes(gpu) < gpu.hbm_bytes
    assert fits_in_hbm(gpu, 30 * 2**30)
    assert not fits_in_hbm(gpu, 40 * 2**30)
    assert set(GPU_PRESETS) >= {"a100-40gb", "h100-sxm-80gb"}



@pytest.mark.parametrize("preset, record, peak_tflops, hbm_gbytes_per_s, smi_mib", [
    ("h200-141gb", "nvidia-h200.json", 989.5, 4800, 143771),
    ("h100-sxm-80gb", "nvidia-h100.json", 990.0, 3350, 81559),
])
def test_measured_presets_are_their_data_sheet_and_the_recorded_measurement(preset, record, peak_tflops,
                                                                            hbm_gbytes_per_s, smi_mib):
    """sim/data/<record> (`neonic bench gpu` on a lent GPU) is the preset's source: its SMs, HBM
    size (nvidia-smi's MiB), the large BF16 GEMM's and the HBM copy's fractions of the data
    sheet, and that a high-priority copy behind a tensor-core GEMM waits for the GEMM (a
    persistent grid) while one behind an FP32 GEMM does not."""
    import json
    from pathlib import Path

    import neonic.sim

    m = json.loads((Path(neonic.sim.__file__).parent / "data" / record).read_text())
    spec = gpu_preset(preset)
    assert spec.num_sms == m["sms"]
    assert spec.hbm_gib == smi_mib / 1024
    assert spec.hbm_bytes_per_s == hbm_gbytes_per_s * 1e9 and spec.peak_flops("bf16") == peak_tflops * 1e12
    assert spec.efficiency.gemm == pytest.approx(m["gemm.bf16.8192x8192x8192.tflops"] / peak_tflops, abs=5e-4)
    assert spec.efficiency.hbm_stream == pytest.approx(m["hbm_copy_gbytes_per_s"] / hbm_gbytes_per_s, abs=5e-4)
    alone, behind_bf16 = m["concurrent.copy_alone_ms"], m["concurrent.gemm_then_copy_high.copy_end_ms"]
    assert spec.persistent_gemm == (behind_bf16 > 0.9 * m["concurrent.gemm_then_copy_high.gemm_end_ms"])
    assert m["concurrent.gemm32_then_copy_high.copy_end_ms"] < 0.5 * m["concurrent.harness.gemm32_alone_ms"]
    assert behind_bf16 > 10 * alone


def test_hopper_gemms_are_persistent_grids_and_ampere_gemms_are_tile_grids():
    from neonic.sim.gpu import gemm_ctas, gemm_tile

    for name in ("h100-sxm-80gb", "h200-141gb", "gh200-96gb"):
        spec = gpu_preset(name)
        assert spec.persistent_gemm
        assert gemm_ctas(spec, 8192, 8192) == spec.num_sms < gemm_tile(spec, 8192, 8192)[2]
        assert gemm_ctas(spec, 256, 512) == gemm_tile(spec, 256, 512)[2] < spec.num_sms
    a100 = gpu_preset("a100-40gb")
    assert not a100.persistent_gemm and gemm_ctas(a100, 8192, 8192) == 32 * 64
    with pytest.raises(ValueError, match="gpu.persistent_gemm"):
        GPUSpec(name="x", peak_tflops={"fp16": 1.0}, hbm_gbytes_per_s=1.0, hbm_gib=1.0, num_sms=1,
                persistent_gemm=1)


def test_the_backward_sort_takes_one_pass_per_8_key_bits_of_the_tbes_rows():
    """FBGEMM sorts its linearized indices over ``total_hash_size_bits`` = int(log2(rows) + 1) of
    the TBE's rows; CUB's radix sort takes one pass per 8 of those bits, and a pass costs its
    fixed time plus every key and value read and written (the H100 record: the time steps at
    16/17, 24/25 and 32/33 bits, and is flat within a step)."""
    from neonic.sim.gpu import (RADIX_SORT_BITS, embedding_sort_cost, hash_size_bits, radix_sort_bytes,
                                radix_sort_cost, radix_sort_passes)

    assert RADIX_SORT_BITS == 8
    assert [hash_size_bits(r) for r in (0, 1, 2, 255, 256, 65535, 65536, 2**24 - 1, 2**24)] == [0, 1, 2, 8, 9, 16, 17, 24, 25]
    assert [radix_sort_passes(b) for b in (0, 1, 8, 9, 16, 17, 24, 25, 64)] == [0, 1, 1, 2, 2, 3, 3, 4, 8]
    gpu = gpu_preset("a100-40gb")
    eff = gpu.efficiency
    keys = 1 << 20
    t = {rows: embedding_sort_cost(gpu, keys, rows) for rows in (2**16 - 1, 2**16, 2**24 - 1, 2**24, 2**32)}
    assert t[2**16].time_s > t[2**16 - 1].time_s                       # 16 -> 17 bits: a third pass
    assert embedding_sort_cost(gpu, keys, 2**17).time_s == t[2**16].time_s   # same pass count, same time
    assert t[2**24 - 1].time_s == t[2**16].time_s
    assert t[2**24].time_s > t[2**24 - 1].time_s
    for rows, passes in ((2**16 - 1, 2), (2**16, 3), (2**24, 4), (2**32, 5)):
        c = t[rows]
        # the mechanism: 8-byte keys read once for the histograms, then 8 + 4 bytes read and written a pass
        assert c.hbm_bytes == radix_sort_bytes(keys, passes, 8, 4) == keys * (8 + passes * 24)
        assert c.memory_s == pytest.approx(c.hbm_bytes / (gpu.hbm_bytes_per_s * eff.radix_sort), rel=1e-15)
        assert c.overhead_s == pytest.approx(eff.radix_sort_fixed_s + passes * eff.radix_sort_pass_s, rel=1e-15)
    # torch.sort (the unfused path): 64-bit keys and positions over all 64 bits, 8 passes
    assert radix_sort_cost(gpu, keys, 64, 8, 8).hbm_bytes == keys * (8 + 8 * 32)
    assert embedding_sort_cost(gpu, 0, 2**20).time_s == 0 and embedding_sort_cost(gpu, 10, 0).time_s == 0
    # about 1M keys of 20-32 bits: 78-103 us on the H100 (cub_sort.*), not the 5 us of 16 B a key
    h100 = gpu_preset("h100-sxm-80gb")
    assert 70e-6 < embedding_sort_cost(h100, 2**20, 2**20).time_s < 90e-6
    assert 90e-6 < embedding_sort_cost(h100, 2**20, 2**31).time_s < 115e-6
    with pytest.raises(ValueError, match="total_rows"):
        embedding_sort_cost(gpu, 10, -1)
    with pytest.raises(ValueError, match="key_bits"):
        radix_sort_cost(gpu, 10, -1)


@pytest.mark.parametrize("field, value", [("radix_sort", 0.0), ("radix_sort", 1.5), ("radix_sort_fixed_s", -1e-6),
                                          ("radix_sort_pass_s", float("nan")), ("radix_sort_pass_s", True)])
def test_bad_radix_sort_efficiencies_are_refused_by_name(field, value):
    from neonic.sim.gpu import GPUEfficiency

    with pytest.raises(ValueError, match=f"efficiency.{field}"):
        GPUEfficiency(**{field: value})
