"""GPU device model: hardware presets and kernel cost functions.

A GPU is described by a :class:`GPUSpec` (peak throughput per datatype, HBM bandwidth and
capacity, SM count, copy engines, links) plus the *efficiency parameters* that turn peak figures
into achieved ones. Every efficiency parameter states where its value comes from; the ones the
calibration scales say so (``neonic validate``'s calibration fits one factor on Neo's Model-A
result, 1.2M samples/s on 128 A100 GPUs, and reports it beside these starting values; every
other figure the cluster runtime reports is a prediction).

Kernel costs are returned as a :class:`KernelCost`: the work a kernel does (FLOPs, HBM bytes)
and its *isolated* duration split into a compute part (at the whole GPU's SMs) and a memory part
(at the whole HBM bandwidth). The shared-resource model (``sim/resources.py``) uses the split to
slow kernels down when they overlap; a kernel alone on the GPU takes ``cost.time_s``.

API (stable; the planner and the schedule code against it)
    ``GPU_PRESETS`` (``"a100-40gb"``, ``"h100-sxm-80gb"``, ``"h200-141gb"``, ``"v100-32gb"``, ...);
    ``gpu_preset(name)``.
    ``GPUSpec.peak_flops(dtype)``, ``.hbm_bytes``, ``.hbm_bytes_per_s``, ``.num_sms``.
    ``gemm_cost(spec, m, n, k, dtype="fp16")`` -> KernelCost (one GEMM, C[m,n] = A[m,k] B[k,n]);
    ``gemm_tile`` / ``gemm_ctas`` / ``gemm_wave_efficiency`` (its tile grid on the SMs).
    ``mlp_cost(spec, batch, widths, dtype, backward=False)`` -> KernelCost (a stack of layers).
    ``interaction_cost(spec, batch, num_features, dim, dtype)`` -> KernelCost (pairwise dots).
    ``embedding_forward_cost(spec, lookups, row_bytes, pooled_rows, out_row_bytes)``.
    ``embedding_backward_cost(spec, lookups, unique_rows, row_bytes, grad_row_bytes,
    optimizer_state_bytes_per_row, total_rows=...)`` (one table's sort + fused row-wise AdaGrad);
    ``embedding_update_cost`` (the fused update alone) and ``embedding_sort_cost(spec, keys,
    total_rows)`` (the one sort of a GPU's fused backward, FBGEMM's); ``radix_sort_cost(spec,
    keys, key_bits, key_bytes, value_bytes)`` (a CUB radix sort by its passes);
    ``embedding_unfused_forward_cost`` / ``embedding_unfused_backward_cost`` (one table, no
    fusion: the baseline that Neo's fused kernels are measured against).
    ``fits_in_hbm(spec, nbytes)`` / ``hbm_capacity_bytes(spec)`` (usable capacity).
    ``KernelCost.time_s`` (isolated duration), ``.compute_s``, ``.memory_s``, ``.overhead_s``,
    ``.flops``, ``.hbm_bytes``; ``KernelCost.__add__`` for kernels run back to back.

All sizes are in bytes, times in seconds (floats; the engine converts to picoseconds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

__all__ = [
    "DTYPE_BYTES",
    "GPUEfficiency",
    "GPUSpec",
    "GPU_PRESETS",
    "KernelCost",
    "gpu_preset",
    "gemm_cost",
    "gemm_tile",
    "gemm_ctas",
    "gemm_wave_efficiency",
    "GEMM_TILES",
    "mlp_cost",
    "interaction_cost",
    "stream_cost",
    "embedding_forward_cost",
    "embedding_backward_cost",
    "embedding_update_cost",
    "embedding_sort_cost",
    "radix_sort_cost",
    "radix_sort_bytes",
    "radix_sort_passes",
    "hash_size_bits",
    "RADIX_SORT_BITS",
    "embedding_unfused_forward_cost",
    "embedding_unfused_backward_cost",
    "UNFUSED_BACKWARD_KERNELS",
    "hbm_capacity_bytes",
    "fits_in_hbm",
]

#: Bytes per element of each datatype the model knows.
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}


def _positive(name: str, value: float) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}: expected a finite number > 0, got {value!r}")
    return float(value)


def _fraction(name: str, value: float) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not (0 < value <= 1):
        raise ValueError(f"{name}: expected a number in (0, 1], got {value!r}")
    return float(value)


def _count(name: str, value: int, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class GPUEfficiency:
    """Achieved fractions of peak, and fixed overheads, for the kernel cost functions.

    Each field's docstring gives its source or says ASSUMPTION. These are the *starting values*
    of ``neonic validate``'s calibration (``host/experiments/calibration.py``): the fit moves
    one common factor over ``embedding_random`` and ``embedding_backward`` on Model-A's
    published throughput and reports every fitted value beside these starts; the other fields
    are never fitted. None of them was chosen to reach a published figure with this model.
    """

    gemm: float = 0.869
    """Fraction of dense tensor-core peak reached by a GEMM large enough to fill every SM with
    whole waves of tiles. SOURCE (A100 SXM): 271.2 of 312 TFLOP/s BF16, 86.9%, the Maximum
    Achievable Matmul FLOPS table of S. Bekman's *Machine Learning Engineering*
    (github.com/stas00/ml-engineering, compute/accelerator/README.md; mean of 100 matmuls, best
    shape 1024x10240x5120, torch 2.6 / CUDA 12.6). The GEMMs of a DLRM are thinner (M = the local
    batch): :func:`gemm_cost` multiplies this by :func:`gemm_wave_efficiency`, the share of SM
    slots a GEMM's tile grid keeps busy (tile and wave quantization, NVIDIA *Matrix
    Multiplication Background User's Guide*, DU-09799-001, sections 3.1-3.2). Other presets:
    their own row of the same table (:data:`GPU_PRESETS`). Not fitted."""

    hbm_stream: float = 0.90
    """Fraction of HBM bandwidth reached by streaming (sequential) kernels. SOURCE: NVIDIA
    developer forum, "Trouble to reach peak bandwidth of A100" (forums.developer.nvidia.com,
    topic 339083): a read kernel reaches 88% of an A100 80GB's data-sheet bandwidth (1.80 of
    2.04 TB/s, confirmed by Nsight Compute), and the thread cites a GTC talk in which no kernel
    exceeded ~90%. FBGEMM's gather/scatter benchmarks on H100 SXM reach 76-83% (FBGEMM pull
    request 3993: gather_scale_dense_tokens 2771 GB/s, scatter_add_along_first_dim 2536 GB/s of
    3350). 0.90 is the top of that range (a plain stream). Not fitted."""

    embedding_random: float = 0.55
    """Fraction of HBM bandwidth reached by the fused embedding gather (random row reads, each
    rounded up to 32-byte sectors by ``sector_bytes``). ASSUMPTION: no public achieved-bandwidth
    figure of FBGEMM's table-batched forward on A100 at Model-A's row sizes was found (searched:
    FBGEMM and TorchRec issues and pull requests, FBGEMM's benchmark scripts, MLPerf DLRM notes).
    Bounds from public figures: FBGEMM's row gathers of long rows on H100 reach 79% of HBM
    (pull request 3993, gather_along_first_dim 2646 GB/s of 3350); short rows (Model-A averages
    93 dims) reach less, as each row is a separate burst. The calibration's fitted factor scales
    it (and reports how far it moves)."""

    embedding_backward: float = 0.45
    """Fraction of HBM bandwidth reached by the fused backward's row updates (read-modify-write
    of rows and optimizer state after the sort). ASSUMPTION (no public achieved-bandwidth figure
    of FBGEMM's fused backward + row-wise AdaGrad on A100 was found): below ``embedding_random``
    as every row is read and written and the writes are scattered; FBGEMM's scatter-add on H100
    reaches 76% with long rows (pull request 3993), an upper bound. Scaled by the calibration's
    fitted factor with ``embedding_random``."""

    sector_bytes: int = 32
    """HBM access granularity: NVIDIA GPUs fetch DRAM in 32-byte sectors, so a row read costs
    its size rounded up to a sector. SOURCE: CUDA C++ Best Practices Guide, "Coalesced Access to
    Global Memory" (32-byte segments). Architecture fact."""

    launch_overhead_s: float = 4e-6
    """Fixed per-kernel cost (launch + tail). SOURCES for the range: asynchronous launches of an
    empty kernel measured at ~3 us each (up to ~334,000 calls/s; M. Boyer, University of Virginia,
    "CUDA Kernel Overhead", cs.virginia.edu/~mwb7w/cuda_support/kernel_overhead.html, older GPUs);
    NVIDIA's Nsight Systems user guide shows ~20 us from a PyTorch element-wise op's call to its
    kernel's start on a V100 (framework dispatch included). 4 us: ASSUMPTION within that range
    for a kernel issued ahead by a framework that keeps the GPU's queue full."""

    radix_sort: float = 0.651
    """Fraction of HBM bandwidth reached by a GPU radix sort of key-value pairs at its
    mechanism's bytes (the keys read once for the digit histograms, then every key and value
    read and written per pass of 8 key bits). Bytes: :func:`radix_sort_bytes`; bits a pass:
    :data:`RADIX_SORT_BITS`. MEASURED (sim/data/nvidia-h100.json, ``cub_sort.*``, session 21):
    CUB's ``DeviceRadixSort::SortPairs`` as FBGEMM's backward calls it (64-bit keys, 32-bit values,
    16-64 key bits, 2^18-2^26 keys) on one H100 SXM; this, ``radix_sort_fixed_s`` and
    ``radix_sort_pass_s`` are the least-squares fit (relative errors) of that record,
    ``host.bench.gpu.fit_radix_sort``, within 7.5% of each of its 40 points (a test ties the
    three to the record); the same mechanism with 64-bit values is within 8% of the record's
    ``cub_sort.u64_i64.*`` and 10% of its ``torch.sort`` (``sort_scaling.sort.i64.*``,
    ``host.bench.gpu.compare_sort``). Other presets: ASSUMPTION, the same fraction of their own
    HBM bandwidth (the same CUB sort; unmeasured there). Not fitted by the calibration."""

    radix_sort_fixed_s: float = 7.30e-6
    """Fixed time of one radix sort (its histogram and scan kernels, besides the passes).
    MEASURED on an H100 (see ``radix_sort``); other presets: ASSUMPTION, the same."""

    radix_sort_pass_s: float = 11.4e-6
    """Fixed time of each pass of a radix sort (one kernel per pass, its ramp and tail).
    MEASURED on an H100 (see ``radix_sort``); other presets: ASSUMPTION, the same."""

    def __post_init__(self) -> None:
        _fraction("efficiency.gemm", self.gemm)
        _fraction("efficiency.hbm_stream", self.hbm_stream)
        _fraction("efficiency.embedding_random", self.embedding_random)
        _fraction("efficiency.embedding_backward", self.embedding_backward)
        _count("efficiency.sector_bytes", self.sector_bytes, 1)
        if not isinstance(self.launch_overhead_s, (int, float)) or self.launch_overhead_s < 0:
            raise ValueError(f"efficiency.launch_overhead_s: expected a number >= 0, got {self.launch_overhead_s!r}")
        _fraction("efficiency.radix_sort", self.radix_sort)
        for name in ("radix_sort_fixed_s", "radix_sort_pass_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"efficiency.{name}: expected a finite number >= 0 (seconds), got {value!r}")


@dataclass(frozen=True)
class GPUSpec:
    """One GPU model: data-sheet figures (sources in :data:`GPU_PRESETS`) plus efficiencies.

    ``peak_tflops`` maps a datatype to dense tensor (or FP32 core) peak in TFLOP/s;
    ``hbm_gbytes_per_s`` and ``hbm_gib`` describe HBM; ``num_sms`` the streaming
    multiprocessors; ``copy_engines`` the DMA engines usable for asynchronous copies and
    DMA-driven collectives; ``nvlink_gbytes_per_s`` is per direction; ``pcie_gbytes_per_s`` per
    direction; ``hbm_reserved_fraction`` the share of HBM kept for activations, workspace and
    the framework (not available to embedding tables).
    """

    name: str
    peak_tflops: Mapping[str, float]
    hbm_gbytes_per_s: float
    hbm_gib: float
    num_sms: int
    copy_engines: int = 2
    nvlink_gbytes_per_s: float = 300.0
    pcie_gbytes_per_s: float = 32.0
    hbm_reserved_fraction: float = 0.15
    efficiency: GPUEfficiency = field(default_factory=GPUEfficiency)
    persistent_gemm: bool = False
    """Tensor-core GEMMs run as persistent grids, one CTA per SM taking output tiles in turn,
    so they release no SM before they end (stream priority cannot let another kernel in).
    SOURCE: CUTLASS 3's SM90 kernels are persistent (CUTLASS documentation, "Blackwell Cluster
    Launch Control": persistent CTAs "stay on the GPU throughout kernel execution" and cannot
    know which SMs another kernel occupies); MEASURED on an H200 (sim/data/nvidia-h200.json):
    a copy kernel launched 50 us behind a 16384^3 BF16 GEMM ended with the GEMM at equal and at
    high stream priority (12.53 and 12.56 ms; 0.51 ms alone), while behind an FP32 GEMM on the
    CUDA cores, a classic grid of many waves, the high-priority copy ended at 1.87 ms; Nsight
    Compute showed the BF16 and FP16 GEMMs' cuBLAS kernels (nvjet_sm90_*) launch 120 or 132
    CTAs whatever their tiles, and the FP32 one (sm80_xmma_gemm) 2,048. True for
    the Hopper presets (H100 and GH200: the same die and libraries, ASSUMPTION); False for
    Ampere and Volta, whose cuBLAS kernels launch one CTA per output tile (ASSUMPTION)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"gpu.name: expected a non-empty string, got {self.name!r}")
        if not self.peak_tflops:
            raise ValueError("gpu.peak_tflops: expected at least one datatype")
        for dtype, value in self.peak_tflops.items():
            if dtype not in DTYPE_BYTES:
                raise ValueError(f"gpu.peak_tflops.{dtype}: unknown datatype; expected one of {', '.join(DTYPE_BYTES)}")
            _positive(f"gpu.peak_tflops.{dtype}", value)
        object.__setattr__(self, "peak_tflops", dict(self.peak_tflops))
        _positive("gpu.hbm_gbytes_per_s", self.hbm_gbytes_per_s)
        _positive("gpu.hbm_gib", self.hbm_gib)
        _count("gpu.num_sms", self.num_sms, 1)
        _count("gpu.copy_engines", self.copy_engines, 0)
        _positive("gpu.nvlink_gbytes_per_s", self.nvlink_gbytes_per_s)
        _positive("gpu.pcie_gbytes_per_s", self.pcie_gbytes_per_s)
        if not isinstance(self.hbm_reserved_fraction, (int, float)) or not 0 <= self.hbm_reserved_fraction < 1:
            raise ValueError(f"gpu.hbm_reserved_fraction: expected a number in [0, 1), got {self.hbm_reserved_fraction!r}")
        if not isinstance(self.persistent_gemm, bool):
            raise ValueError(f"gpu.persistent_gemm: expected true or false, got {self.persistent_gemm!r}")
        if not isinstance(self.efficiency, GPUEfficiency):
            raise ValueError(f"gpu.efficiency: expected a GPUEfficiency, got {type(self.efficiency).__name__}")

    # ----------------------------------------------------------------------------- figures
    def peak_flops(self, dtype: str) -> float:
        """Dense peak in FLOP/s for ``dtype`` (bf16 falls back to fp16 and vice versa)."""
        table = self.peak_tflops
        if dtype in table:
            return table[dtype] * 1e12
        alias = {"bf16": "fp16", "fp16": "bf16"}.get(dtype)
        if alias in table:
            return table[alias] * 1e12
        raise ValueError(f"dtype: {self.name} has no peak for {dtype!r}; expected one of {', '.join(sorted(table))}")

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_gbytes_per_s * 1e9

    @property
    def hbm_bytes(self) -> int:
        return int(self.hbm_gib * 2**30)

    def with_efficiency(self, **changes: float) -> "GPUSpec":
        """A copy with some efficiency parameters changed (used by calibration and configs)."""
        return replace(self, efficiency=replace(self.efficiency, **changes))


#: Data-sheet presets. A100 and H100 figures: shared/REFERENCES.md (NVIDIA data sheets);
#: H100 TF32/FP32 and the V100 figures: NVIDIA data sheets. SM counts: NVIDIA architecture
#: white papers (A100 108, H100 SXM 132, V100 80). Copy engines: 2 usable concurrent DMA
#: directions is an assumption (the hardware has more engines, exposed through 2 queues here).
GPU_PRESETS: dict[str, GPUSpec] = {
    "a100-40gb": GPUSpec(
        name="a100-40gb",
        peak_tflops={"fp16": 312.0, "bf16": 312.0, "tf32": 156.0, "fp32": 19.5},
        hbm_gbytes_per_s=1555.0,
        hbm_gib=40.0,
        num_sms=108,
        nvlink_gbytes_per_s=300.0,
        pcie_gbytes_per_s=32.0,
    ),
    "h100-sxm-80gb": GPUSpec(
        name="h100-sxm-80gb",
        peak_tflops={"fp16": 990.0, "bf16": 990.0, "tf32": 495.0, "fp32": 67.0, "fp8": 1979.0},
        hbm_gbytes_per_s=3350.0,
        hbm_gib=81559 / 1024,
        num_sms=132,
        nvlink_gbytes_per_s=450.0,
        pcie_gbytes_per_s=64.0,
        # MEASURED (sim/data/nvidia-h100.json, `neonic bench gpu` three times on one H100 80GB
        # HBM3 SXM, 700 W, torch 2.11 / CUDA 13.0, 2026-11-26; medians): 132 SMs; 81,559 MiB of
        # HBM (nvidia-smi); efficiency.gemm is the measured 8192^3 BF16 product, 791.7 of 990
        # TFLOP/s (the MAMF table, see GPUEfficiency.gemm, has 794.5 of 989 for H100 SXM);
        # efficiency.hbm_stream the measured device-to-device copy, 3,024 of 3,350 GB/s;
        # persistent_gemm: a high-priority copy kernel behind a 16384^3 BF16 GEMM ended with it
        # (12.46 and 12.40 ms; 0.72 ms alone), behind an FP32 GEMM at 3.38 ms. Not fitted to any
        # result of neonic. PyTorch's embedding_bag reached 1,350 GB/s (0.40 of HBM) at FP32,
        # D=92, and index_add_'s row updates 1,600 GB/s: lower bounds for FBGEMM's fused kernels.
        # MEASURED (sim/data/nvidia-h100.json, tbe.*, session 21, one run; compare_tbe):
        # embedding_random and embedding_backward are what a table-batched Triton forward and a
        # fused backward + row-wise AdaGrad (kernels like FBGEMM's, written for `neonic bench gpu
        # --sections=tbe`; FBGEMM's own could not be carried to the lent machine) imply at the
        # model's bytes for Model-A's dim mix (32 tables at its dim quantiles, FP32, pooling 15,
        # uniformly random rows over 4 GiB): forward 0.191 ms, backward kernel 0.496 ms.
        # radix_sort, radix_sort_fixed_s, radix_sort_pass_s: MEASURED on this H100 (cub_sort.*,
        # session 21; host.bench.gpu.fit_radix_sort), the GPUEfficiency defaults.
        persistent_gemm=True,
        efficiency=GPUEfficiency(gemm=0.800, hbm_stream=0.903, embedding_random=0.635,
                                 embedding_backward=0.634),
    ),
    # GH200's Hopper GPU: the H100's SMs and tensor peaks (NVIDIA GH200 Grace Hopper Superchip data
    # sheet / H100 data sheet: FP16/BF16 dense 990 TFLOP/s, FP8 1,979), with 96 GB of HBM3 at
    # 4 TB/s (GH200 data sheet, the HBM3 variant; the HBM3e variant has 144 GB at 4.9 TB/s).
    # NVLink 4: 900 GB/s total, 450 GB/s each way. Its CPU memory is reached over NVLink-C2C,
    # not PCIe (the system preset's host.link); pcie_gbytes_per_s keeps the PCIe 5 x16 figure.
    "gh200-96gb": GPUSpec(
        name="gh200-96gb",
        peak_tflops={"fp16": 990.0, "bf16": 990.0, "tf32": 495.0, "fp32": 67.0, "fp8": 1979.0},
        hbm_gbytes_per_s=4000.0,
        hbm_gib=96.0,              # 6 HBM3 stacks of 16 GiB
        num_sms=132,
        nvlink_gbytes_per_s=450.0,
        pcie_gbytes_per_s=64.0,
        # MAMF table (see GPUEfficiency.gemm): GH200 SXM BF16 828.6 of 989 TFLOP/s (the 900 W,
        # 141 GiB HBM3e part; the 96 GB part's figure is not published)
        persistent_gemm=True,
        efficiency=GPUEfficiency(gemm=0.838),
    ),
    # H200 SXM (NVIDIA H200 Tensor Core GPU data sheet): the H100's GH100 die and tensor peaks
    # (FP16/BF16 dense 989.5 TFLOP/s, FP8 1,979, TF32 494.5, FP32 67), 141 GB of HBM3e at
    # 4.8 TB/s, NVLink 4 at 900 GB/s (450 each way), PCIe Gen5 x16 at 128 GB/s (64 each way).
    # MEASURED (sim/data/nvidia-h200.json, `neonic bench gpu` on one H200 SXM, 700 W, torch 2.11 /
    # CUDA 13.0, 2026-11-26): 132 SMs; 143,771 MiB of HBM (nvidia-smi); efficiency.gemm is the
    # measured 8192^3 BF16 product, 800.4 of 989.5 TFLOP/s (MAMF's H100 SXM figure is 0.803);
    # efficiency.hbm_stream the measured device-to-device copy, 4,272 of 4,800 GB/s. Not fitted
    # to any result of neonic. PyTorch's own embedding_bag reached 1,477 GB/s (0.31 of HBM) at
    # FP32, D=92, and index_add_'s row updates 1,718 GB/s (0.36), lower bounds for FBGEMM's fused
    # kernels. MEASURED (sim/data/nvidia-h200.json, tbe.*, session 21, one run; compare_tbe):
    # embedding_random and embedding_backward as for the H100 above (Triton TBE-like kernels at
    # Model-A's dim mix, FP32): forward 0.141 ms, backward kernel 0.436 ms.
    "h200-141gb": GPUSpec(
        name="h200-141gb",
        peak_tflops={"fp16": 989.5, "bf16": 989.5, "tf32": 494.5, "fp32": 67.0, "fp8": 1979.0},
        hbm_gbytes_per_s=4800.0,
        hbm_gib=143771 / 1024,
        num_sms=132,
        nvlink_gbytes_per_s=450.0,
        pcie_gbytes_per_s=64.0,
        persistent_gemm=True,
        efficiency=GPUEfficiency(gemm=0.809, hbm_stream=0.890, embedding_random=0.605,
                                 embedding_backward=0.473),
    ),
    # AMD Instinct MI300A (AMD data sheet): 228 CDNA 3 compute units, FP16/BF16 dense matrix
    # 980.6 TFLOP/s, FP8 1,961.2, TF32 490.3, FP32 122.6; 128 GB of HBM3 at 5.3 TB/s shared with
    # the package's 24 Zen 4 cores (one pool: the system preset's host.link = "shared_hbm").
    # nvlink_gbytes_per_s stands for the APU-to-APU Infinity Fabric of a 4-APU node, per peer
    # group and direction (ASSUMPTION: 128 GB/s, four x16 links at 32 GB/s each way). The
    # reserve is larger than a discrete GPU's: the CPU side's OS, runtime and input pipeline
    # live in the same 128 GB (ASSUMPTION: 25%).
    "mi300a": GPUSpec(
        name="mi300a",
        peak_tflops={"fp16": 980.6, "bf16": 980.6, "tf32": 490.3, "fp32": 122.6, "fp8": 1961.2},
        hbm_gbytes_per_s=5300.0,
        hbm_gib=128.0,             # 8 HBM3 stacks of 16 GiB
        num_sms=228,
        nvlink_gbytes_per_s=128.0,
        pcie_gbytes_per_s=64.0,
        hbm_reserved_fraction=0.25,
        # MAMF table (see GPUEfficiency.gemm) has MI300X, not MI300A: 668.4 of 1300 TFLOP/s BF16
        # (51.4%, PYTORCH_TUNABLEOP_ENABLED=1). ASSUMPTION: the same CDNA 3 compute dies reach the
        # same fraction on MI300A.
        efficiency=GPUEfficiency(gemm=0.514),
    ),
    "v100-32gb": GPUSpec(
        name="v100-32gb",
        peak_tflops={"fp16": 125.0, "fp32": 15.7},
        hbm_gbytes_per_s=900.0,
        hbm_gib=32.0,
        num_sms=80,
        nvlink_gbytes_per_s=150.0,
        pcie_gbytes_per_s=16.0,
        # ASSUMPTION: V100 is not in the MAMF table; the A100 fraction is kept
    ),
}


def gpu_preset(name: str) -> GPUSpec:
    """The preset called ``name`` (see :data:`GPU_PRESETS`)."""
    if name not in GPU_PRESETS:
        raise ValueError(f"gpu: unknown preset {name!r}; expected one of {', '.join(GPU_PRESETS)}")
    return GPU_PRESETS[name]


@dataclass(frozen=True)
class KernelCost:
    """Work and isolated duration of one kernel (or kernels run back to back).

    ``compute_s`` is the time the FLOPs take on all SMs at achieved efficiency; ``memory_s`` the
    time the HBM bytes take at achieved bandwidth; a kernel alone on the GPU is limited by the
    larger (roofline), plus ``overhead_s``. For a sum of kernels the parts add per kernel, so
    ``time_s`` is the sum of the kernels' times.
    """

    flops: float = 0.0
    hbm_bytes: float = 0.0
    compute_s: float = 0.0
    memory_s: float = 0.0
    overhead_s: float = 0.0
    _time_s: float | None = None

    @property
    def time_s(self) -> float:
        """Isolated duration in seconds."""
        if self._time_s is not None:
            return self._time_s
        return max(self.compute_s, self.memory_s) + self.overhead_s

    @property
    def compute_fraction(self) -> float:
        """Share of the roofline time that is compute-bound work (0..1), used for interference."""
        busy = self.compute_s + self.memory_s
        return self.compute_s / busy if busy > 0 else 0.0

    def __add__(self, other: "KernelCost") -> "KernelCost":
        if not isinstance(other, KernelCost):
            return NotImplemented
        return KernelCost(
            flops=self.flops + other.flops,
            hbm_bytes=self.hbm_bytes + other.hbm_bytes,
            compute_s=self.compute_s + other.compute_s,
            memory_s=self.memory_s + other.memory_s,
            overhead_s=self.overhead_s + other.overhead_s,
            _time_s=self.time_s + other.time_s,
        )

    def scaled(self, factor: float) -> "KernelCost":
        """The same kernel doing ``factor`` times the work (overhead unchanged)."""
        if factor < 0:
            raise ValueError(f"factor: expected >= 0, got {factor!r}")
        return KernelCost(
            flops=self.flops * factor,
            hbm_bytes=self.hbm_bytes * factor,
            compute_s=self.compute_s * factor,
            memory_s=self.memory_s * factor,
            overhead_s=self.overhead_s,
            _time_s=None if self._time_s is None else (self._time_s - self.overhead_s) * factor + self.overhead_s,
        )


ZERO_COST = KernelCost()


def _dtype_bytes(dtype: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype: expected one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    return DTYPE_BYTES[dtype]


#: Output tiles cuBLAS picks among, largest first (NVIDIA DU-09799-001 section 2.3 lists 256x128,
#: 128x256, 128x128, 64x128, 128x64 and 64x64 as typical on A100).
GEMM_TILES: tuple[tuple[int, int], ...] = ((256, 128), (128, 128), (128, 64), (64, 64))


def gemm_tile(spec: GPUSpec, m: int, n: int) -> tuple[int, int, int]:
    """``(tile_m, tile_n, ctas)`` of a GEMM ``C[m, n]``: the largest tile of :data:`GEMM_TILES`
    whose grid still gives every SM a tile, else the smallest (ASSUMPTION: cuBLAS-like tile
    heuristics; cuBLAS's real choice also weighs split-K and per-tile efficiency)."""
    for tm, tn in GEMM_TILES:
        ctas = math.ceil(m / tm) * math.ceil(n / tn)
        if ctas >= spec.num_sms:
            return tm, tn, ctas
    tm, tn = GEMM_TILES[-1]
    return tm, tn, math.ceil(m / tm) * math.ceil(n / tn)


def gemm_ctas(spec: GPUSpec, m: int, n: int) -> int:
    """CTAs of a GEMM ``C[m, n]``: one per output tile (:func:`gemm_tile`), or at most one per SM
    where the GPU's GEMMs are persistent (:attr:`GPUSpec.persistent_gemm`)."""
    tiles = gemm_tile(spec, m, n)[2]
    return min(tiles, spec.num_sms) if spec.persistent_gemm else tiles


def gemm_wave_efficiency(spec: GPUSpec, m: int, n: int) -> float:
    """Share of the GPU's tile slots that a GEMM ``C[m, n]`` keeps doing useful work: tile
    quantization (the last row and column of tiles are partly padding) times wave quantization
    (tiles run in waves of one per SM; a last, partial wave leaves SMs idle). NVIDIA *Matrix
    Multiplication Background User's Guide* (DU-09799-001), sections 3.1 and 3.2. Example: on
    A100's 108 SMs, a 512 x 3696 output takes 116 tiles of 128x128, two waves, 54% busy."""
    if m <= 0 or n <= 0:
        return 1.0
    tm, tn, ctas = gemm_tile(spec, m, n)
    # a dimension thinner than the tile runs in a narrower kernel (cuBLAS's small-M / GEMV paths),
    # padded to the tensor cores' 16-wide MMA shape (ASSUMPTION)
    tm, tn = min(tm, 16 * math.ceil(m / 16)), min(tn, 16 * math.ceil(n / 16))
    tile = (m * n) / (math.ceil(m / tm) * tm * math.ceil(n / tn) * tn)
    waves = math.ceil(ctas / spec.num_sms)
    return tile * ctas / (waves * spec.num_sms)


def gemm_cost(spec: GPUSpec, m: int, n: int, k: int, dtype: str = "fp16") -> KernelCost:
    """One GEMM ``C[m,n] = A[m,k] @ B[k,n]``: 2mnk FLOPs against peak x ``efficiency.gemm`` (the
    large-GEMM fraction) x :func:`gemm_wave_efficiency` (the share of SM slots its tile grid
    fills); reading A, B and writing C once against HBM at ``efficiency.hbm_stream``."""
    for name, value in (("m", m), ("n", n), ("k", k)):
        _count(name, value, 0)
    if m == 0 or n == 0 or k == 0:
        return ZERO_COST
    eff = spec.efficiency
    flops = 2.0 * m * n * k
    nbytes = float(_dtype_bytes(dtype) * (m * k + k * n + m * n))
    return KernelCost(
        flops=flops,
        hbm_bytes=nbytes,
        compute_s=flops / (spec.peak_flops(dtype) * eff.gemm * gemm_wave_efficiency(spec, m, n)),
        memory_s=nbytes / (spec.hbm_bytes_per_s * eff.hbm_stream),
        overhead_s=eff.launch_overhead_s,
    )


def mlp_cost(spec: GPUSpec, batch: int, widths: Sequence[int], dtype: str = "fp16", backward: bool = False) -> KernelCost:
    """A stack of fully connected layers ``widths[0] -> widths[1] -> ... -> widths[-1]`` on
    ``batch`` samples. Forward: one GEMM per layer. Backward: two per layer (data gradient and
    weight gradient; the first layer's data gradient is skipped, as nothing consumes it)."""
    _count("batch", batch, 0)
    widths = [int(w) for w in widths]
    if len(widths) < 2:
        return ZERO_COST
    for i, w in enumerate(widths):
        _count(f"widths[{i}]", w, 1)
    total = ZERO_COST
    for layer, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
        if not backward:
            total = total + gemm_cost(spec, batch, fan_out, fan_in, dtype)
        else:
            total = total + gemm_cost(spec, fan_in, fan_out, batch, dtype)  # weight gradient
            if layer > 0:
                total = total + gemm_cost(spec, batch, fan_in, fan_out, dtype)  # data gradient
    return total


def stream_cost(spec: GPUSpec, nbytes: float) -> KernelCost:
    """One memory-bound kernel that streams ``nbytes`` through HBM (a copy, an elementwise
    operation, a reduction, an optimizer pass): HBM at ``efficiency.hbm_stream``, plus one
    launch (``efficiency.launch_overhead_s``)."""
    eff = spec.efficiency
    return KernelCost(hbm_bytes=nbytes, memory_s=nbytes / (spec.hbm_bytes_per_s * eff.hbm_stream),
                      overhead_s=eff.launch_overhead_s)


def interaction_cost(spec: GPUSpec, batch: int, num_features: int, dim: int, dtype: str = "fp16", backward: bool = False) -> KernelCost:
    """DLRM's dot interaction: per sample, all pairwise dots of ``num_features`` vectors of
    ``dim`` (a batched F x D x F GEMM); the backward costs twice the forward."""
    _count("batch", batch, 0)
    _count("num_features", num_features, 0)
    _count("dim", dim, 0)
    if batch == 0 or num_features == 0 or dim == 0:
        return ZERO_COST
    eff = spec.efficiency
    flops = 2.0 * batch * num_features * num_features * dim
    nbytes = float(_dtype_bytes(dtype) * batch * (num_features * dim + num_features * num_features))
    cost = KernelCost(
        flops=flops,
        hbm_bytes=nbytes,
        compute_s=flops / (spec.peak_flops(dtype) * eff.gemm),
        memory_s=nbytes / (spec.hbm_bytes_per_s * eff.hbm_stream),
        overhead_s=eff.launch_overhead_s,
    )
    if backward:
        return KernelCost(flops=2 * flops, hbm_bytes=2 * nbytes, compute_s=2 * cost.compute_s, memory_s=2 * cost.memory_s, overhead_s=cost.overhead_s)
    return cost


def _sectors(spec: GPUSpec, row_bytes: float) -> float:
    sector = spec.efficiency.sector_bytes
    return math.ceil(row_bytes / sector) * sector


def embedding_forward_cost(spec: GPUSpec, lookups: int, row_bytes: float, pooled_rows: int, out_row_bytes: float) -> KernelCost:
    """The fused table-batched embedding forward on one GPU.

    ``lookups`` rows of ``row_bytes`` are gathered (each rounded up to whole HBM sectors) at the
    random-access efficiency ``efficiency.embedding_random``; indices (4 B each) are read and
    ``pooled_rows`` pooled vectors of ``out_row_bytes`` are written at streaming efficiency.
    Pooling is a sum in registers: its FLOPs (one add per element looked up) never bound.
    All lookups on a GPU are one kernel (Neo), so one launch overhead.
    """
    _count("lookups", lookups, 0)
    _count("pooled_rows", pooled_rows, 0)
    if row_bytes < 0 or out_row_bytes < 0:
        raise ValueError(f"row_bytes/out_row_bytes: expected >= 0, got {row_bytes!r}/{out_row_bytes!r}")
    if lookups == 0 and pooled_rows == 0:
        return ZERO_COST
    eff = spec.efficiency
    gather_bytes = lookups * _sectors(spec, row_bytes)
    stream_bytes = 4.0 * lookups + pooled_rows * out_row_bytes
    flops = lookups * row_bytes / 2.0  # one add per (16-bit) element
    return KernelCost(
        flops=flops,
        hbm_bytes=gather_bytes + stream_bytes,
        compute_s=flops / (spec.peak_flops("fp32") * eff.gemm),
        memory_s=gather_bytes / (spec.hbm_bytes_per_s * eff.embedding_random)
        + stream_bytes / (spec.hbm_bytes_per_s * eff.hbm_stream),
        overhead_s=eff.launch_overhead_s,
    )


#: Key bits a radix sort pass orders (its digit width). SOURCE: CUB's onesweep radix sort, which
#: ``DeviceRadixSort::SortPairs`` runs, sorts 8 bits a pass on these key types; MEASURED on an H100
#: (sim/data/nvidia-h100.json, ``cub_sort.*``): the time steps at 8-bit boundaries (20 and 24
#: bits take the same time, as do 28 and 32; each step of 8 bits adds the same time a key).
RADIX_SORT_BITS = 8


def hash_size_bits(total_rows: int) -> int:
    """The key bits FBGEMM's table-batched backward sorts: ``total_hash_size_bits`` of a TBE
    whose tables have ``total_rows`` rows in all, ``int(log2(total_rows) + 1)`` (0 for no
    rows; FBGEMM's ``SplitTableBatchedEmbeddingBagsCodegen``, in
    split_table_batched_embeddings_ops_training.py): the bit length of the number of rows, which
    bounds every linearized index ``hash_size_cumsum[t] + row``."""
    _count("total_rows", total_rows, 0)
    return int(total_rows).bit_length()


def radix_sort_passes(key_bits: int) -> int:
    """Passes of a radix sort over ``key_bits`` bits: one per :data:`RADIX_SORT_BITS`."""
    _count("key_bits", key_bits, 0)
    return -(-int(key_bits) // RADIX_SORT_BITS)


def radix_sort_bytes(keys: float, passes: int, key_bytes: int, value_bytes: int) -> float:
    """HBM bytes a radix sort of ``keys`` key-value pairs moves in ``passes`` passes, by its
    mechanism: the keys read once for the digit histograms, then each pass reads and writes every
    key and value (``keys * (key_bytes + passes * 2 * (key_bytes + value_bytes))``)."""
    if passes <= 0:
        return 0.0
    return float(keys) * (key_bytes + passes * 2.0 * (key_bytes + value_bytes))


def radix_sort_cost(spec: GPUSpec, keys: int, key_bits: int, key_bytes: int = 8, value_bytes: int = 4) -> KernelCost:
    """A GPU radix sort of ``keys`` pairs (``key_bytes`` keys, ``value_bytes`` values) over the
    low ``key_bits`` bits of the keys (CUB's ``DeviceRadixSort::SortPairs`` with ``end_bit``):
    :func:`radix_sort_passes` passes, :func:`radix_sort_bytes` at ``efficiency.radix_sort`` of
    HBM, plus ``radix_sort_fixed_s`` and ``radix_sort_pass_s`` per pass (its kernels' fixed
    times, launches included: the ``overhead_s``). No keys or no bits: nothing to sort."""
    _count("keys", keys, 0)
    passes = radix_sort_passes(key_bits)
    for name, value in (("key_bytes", key_bytes), ("value_bytes", value_bytes)):
        _count(name, value, 1)
    if keys == 0 or passes == 0:
        return ZERO_COST
    eff = spec.efficiency
    nbytes = radix_sort_bytes(keys, passes, key_bytes, value_bytes)
    return KernelCost(hbm_bytes=nbytes, memory_s=nbytes / (spec.hbm_bytes_per_s * eff.radix_sort),
                      overhead_s=eff.radix_sort_fixed_s + passes * eff.radix_sort_pass_s)


def embedding_sort_cost(spec: GPUSpec, keys: int, total_rows: int) -> KernelCost:
    """The sort that opens FBGEMM's table-batched backward on one GPU
    (``transpose_embedding_input``: the ``keys`` linearized indices of all the TBE's tables,
    64-bit, with their 32-bit positions, sorted over :func:`hash_size_bits` of the tables'
    ``total_rows``): one sort per fused backward, whatever its number of tables."""
    return radix_sort_cost(spec, keys, hash_size_bits(total_rows), 8, 4)


def embedding_update_cost(
    spec: GPUSpec,
    lookups: int,
    unique_rows: int,
    row_bytes: float,
    grad_row_bytes: float,
    optimizer_state_bytes_per_row: float = 4.0,
) -> KernelCost:
    """One table's share of the fused backward + row-wise sparse optimizer kernel that follows
    the sort (Neo / FBGEMM): the per-lookup gradients (``grad_row_bytes``, one per lookup, read
    once) are aggregated on chip, and each of the ``unique_rows`` touched rows is updated exactly
    once: its weights are read and written (``row_bytes`` each way) and its optimizer state read
    and written (row-wise AdaGrad: one FP32 per row, ``optimizer_state_bytes_per_row``). Row
    traffic runs at ``efficiency.embedding_backward``, the gradient reads at streaming
    efficiency; one launch."""
    _count("lookups", lookups, 0)
    _count("unique_rows", unique_rows, 0)
    if unique_rows > lookups:
        raise ValueError(f"unique_rows: expected <= lookups ({lookups}), got {unique_rows}")
    if row_bytes < 0 or grad_row_bytes < 0 or optimizer_state_bytes_per_row < 0:
        raise ValueError("row_bytes, grad_row_bytes, optimizer_state_bytes_per_row: expected >= 0")
    if lookups == 0:
        return ZERO_COST
    eff = spec.efficiency
    stream_bytes = lookups * float(grad_row_bytes)
    row_traffic = unique_rows * 2.0 * (_sectors(spec, row_bytes) + _sectors(spec, optimizer_state_bytes_per_row))
    flops = 4.0 * unique_rows * row_bytes / 2.0 + lookups * grad_row_bytes / 2.0
    return KernelCost(
        flops=flops,
        hbm_bytes=stream_bytes + row_traffic,
        compute_s=flops / (spec.peak_flops("fp32") * eff.gemm),
        memory_s=stream_bytes / (spec.hbm_bytes_per_s * eff.hbm_stream)
        + row_traffic / (spec.hbm_bytes_per_s * eff.embedding_backward),
        overhead_s=eff.launch_overhead_s,
    )


def embedding_backward_cost(
    spec: GPUSpec,
    lookups: int,
    unique_rows: int,
    row_bytes: float,
    grad_row_bytes: float,
    optimizer_state_bytes_per_row: float = 4.0,
    *,
    total_rows: int,
) -> KernelCost:
    """The embedding backward fused with a row-wise sparse optimizer of one table of
    ``total_rows`` rows in a TBE of its own: the sort of its ``lookups`` keys
    (:func:`embedding_sort_cost`) then the fused update (:func:`embedding_update_cost`). A GPU
    holding several tables sorts once over all of them (``host.iteration.fused_embedding_costs``)."""
    update = embedding_update_cost(spec, lookups, unique_rows, row_bytes, grad_row_bytes, optimizer_state_bytes_per_row)
    if lookups == 0:
        return update
    return embedding_sort_cost(spec, lookups, total_rows) + update


def hbm_capacity_bytes(spec: GPUSpec) -> int:
    """HBM available to embedding tables and their optimizer state (the rest is reserved)."""
    return int(spec.hbm_bytes * (1.0 - spec.hbm_reserved_fraction))


def fits_in_hbm(spec: GPUSpec, nbytes: float) -> bool:
    """Whether ``nbytes`` of tables + optimizer state fit in the usable HBM of one GPU."""
    if nbytes < 0:
        raise ValueError(f"nbytes: expected >= 0, got {nbytes!r}")
    return nbytes <= hbm_capacity_bytes(spec)


# ----------------------------------------------------------------- unfused embedding baseline
def embedding_unfused_forward_cost(spec: GPUSpec, lookups: int, row_bytes: float, pooled_rows: int,
                                   out_row_bytes: float) -> KernelCost:
    """One table's embedding-bag forward as its own kernel (PyTorch ``nn.EmbeddingBag`` per
    table, no table batching): the same HBM traffic as its share of the fused kernel, a launch
    of its own, and the copy of its pooled output into the one buffer that the pooled AlltoAll
    sends (``torch.cat`` of the tables' outputs: read and written once; the fused kernel writes
    its output in place). A model's unfused forward is the sum over its tables, so it pays one
    ``launch_overhead_s`` per table where the fused kernel pays one in all."""
    lookup = embedding_forward_cost(spec, lookups, row_bytes, pooled_rows, out_row_bytes)
    if lookup.hbm_bytes == 0:
        return lookup
    copy = 2.0 * pooled_rows * out_row_bytes
    return lookup + KernelCost(hbm_bytes=copy, memory_s=copy / (spec.hbm_bytes_per_s * spec.efficiency.hbm_stream))


#: Kernels of the unfused backward of one table, in order (see :func:`embedding_unfused_backward_cost`).
UNFUSED_BACKWARD_KERNELS: tuple[str, ...] = (
    "bag_backward_gather", "bag_backward_indices",          # nn.EmbeddingBag(sparse=True) backward
    "coalesce_sort", "coalesce_unique", "coalesce_reduce",  # grad.coalesce()
    "grad_square", "state_add", "state_mask", "std_sqrt", "std_add_eps", "grad_div_std",
    "param_add",                                            # the Adagrad step's sparse branch
)


def embedding_unfused_backward_cost(
    spec: GPUSpec,
    lookups: int,
    unique_rows: int,
    row_bytes: float,
    grad_row_bytes: float,
    optimizer_state_bytes_per_row: float = 4.0,
) -> KernelCost:
    """One table's embedding backward and sparse optimizer as separate PyTorch operators, without
    Neo's fusion (``embedding_backward_cost`` is the fused one). It follows PyTorch's sparse path
    pass by pass (``nn.EmbeddingBag(sparse=True)``'s backward, then the sparse branch of
    ``torch.optim.Adagrad``'s step in torch/optim/adagrad.py: ``grad.coalesce()``, the squared
    values added into the state, the state masked to the gradient's rows, its square root plus
    eps, the values divided by it, and the sparse add into the weights), with the same row-wise
    state as the fused kernel so that only the fusion differs (``g`` = ``grad_row_bytes``,
    ``s`` = ``optimizer_state_bytes_per_row``, ``u`` = ``unique_rows``):

    1. bag backward: each lookup's gradient row is materialised (its bag's pooled gradient read,
       the row written: ``2 g`` per lookup) and the indices copied (8 B per lookup, int64);
    2. coalesce: the indices sorted (``torch.sort``'s radix sort, :func:`radix_sort_cost`, of
       64-bit keys over all 64 bits with 64-bit positions: MEASURED on an H100 within 11% of
       ``sort_scaling.sort.i64.*``, 2^18-2^26 keys), duplicates found (an index read per lookup)
       and summed (every gradient row read once more, ``u`` written);
    3. step: square (``u g`` read and written), state add (``u g`` read, ``u s`` read and
       written), mask (``u s`` read and written), square root and eps (``u s`` read and written
       twice), divide (``u g + u s`` read, ``u g`` written): all streaming;
    4. the sparse add into the weights: ``u g`` read, each touched row read and written (the
       same scattered row traffic as the fused kernel, at ``embedding_backward``); the state
       updates of step 3 touch the state rows at the same scattered efficiency.

    Streams run at ``hbm_stream``; one launch per kernel of :data:`UNFUSED_BACKWARD_KERNELS` but
    the sort, whose kernels' fixed times are its own."""
    _count("lookups", lookups, 0)
    _count("unique_rows", unique_rows, 0)
    if unique_rows > lookups:
        raise ValueError(f"unique_rows: expected <= lookups ({lookups}), got {unique_rows}")
    if row_bytes < 0 or grad_row_bytes < 0 or optimizer_state_bytes_per_row < 0:
        raise ValueError("row_bytes, grad_row_bytes, optimizer_state_bytes_per_row: expected >= 0")
    if lookups == 0:
        return ZERO_COST
    eff = spec.efficiency
    g, s, u = float(grad_row_bytes), float(optimizer_state_bytes_per_row), float(unique_rows)
    materialise = lookups * (2.0 * g + 8.0 + 8.0)                              # rows; indices read and written
    coalesce = lookups * (8.0 + g) + u * g                                      # unique, reduce
    sort = radix_sort_cost(spec, lookups, 64, 8, 8)
    step_stream = 2 * u * g + u * g + 2 * u * s + 4 * u * s + (u * g + u * s + u * g) + u * g
    stream_bytes = materialise + coalesce + step_stream
    row_traffic = u * 2.0 * _sectors(spec, row_bytes) + u * 2.0 * _sectors(spec, s)   # weights; state add
    flops = 4.0 * u * row_bytes / 2.0 + lookups * g / 2.0
    return sort + KernelCost(
        flops=flops,
        hbm_bytes=stream_bytes + row_traffic,
        compute_s=flops / (spec.peak_flops("fp32") * eff.gemm),
        memory_s=stream_bytes / (spec.hbm_bytes_per_s * eff.hbm_stream)
        + row_traffic / (spec.hbm_bytes_per_s * eff.embedding_backward),
        overhead_s=(len(UNFUSED_BACKWARD_KERNELS) - 1) * eff.launch_overhead_s,
    )
