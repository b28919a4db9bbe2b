"""``neonic bench gpu``: the GPU figures behind neonic's GPU presets, measured on this
machine's CUDA device with PyTorch (and Triton, where installed).

neonic's GPU model (``sim.gpu``, ``sim.interference``) prices kernels from data-sheet peaks
times achieved fractions, and concurrent kernels and collectives by block scheduling and HBM
sharing. Most of those fractions come from public figures; this benchmark measures them on a
real GPU, so that a preset can cite a measurement and the mechanisms can be checked against
one. It needs PyTorch with a CUDA device (``pip install torch``); neonic itself does not. The
module imports nothing else of neonic, so a GPU machine without neonic's dependencies runs it
as a file: ``python3 host/bench/gpu.py --json``.

Figures (each a median over repetitions, timed with CUDA events after warm-up):

* ``gemm.<dtype>.<m>x<n>x<k>``: ms and TFLOP/s of one ``torch.matmul`` (cuBLAS) of that shape:
  the large square product (the achievable peak) and Model-A's dense layers at local batches
  512..4096 (``host/workloads/presets/model-a.toml``: width 3696, the 96,696-wide layer after
  the concatenation, and the weight gradients, whose inner dimension is the batch).
* ``hbm_copy_gbytes_per_s``: a device-to-device copy of 2 GiB, bytes read plus written.
* ``embedding_bag.<dtype>.d<dim>``: ``torch.nn.functional.embedding_bag`` (mode ``sum``) over a
  table of 4M rows with uniformly random indices, bags of 15 (Model-A's mean pooling): ms and
  achieved GB/s, counting each row read rounded up to 32-byte sectors, the indices, and the
  pooled output (``sim.gpu.embedding_forward_cost``'s bytes).
* ``row_update.<dtype>.d<dim>``: ``index_add_`` of one gradient row into each of 1M distinct
  sorted rows (the read-modify-write of an embedding backward after its sort and
  de-duplication): GB/s counting the row read, the gradient read and the row written.
* ``tbe.*``: a table-batched embedding (TBE) like FBGEMM's, written here in Triton (FBGEMM is
  not installable on the lent machines): the fused forward and the fused backward + row-wise
  AdaGrad at Model-A's pooling over 4 GiB of tables, FP32 and FP16, dims 32..256 and Model-A's
  dim mix, checked against torch first (``tbe.check.*``), beside torch's ``embedding_bag`` and
  ``sort`` (``measure_tbe``; ``compare_tbe`` gives the efficiencies they imply; ``compare_sort``
  the sorts beside ``sim.gpu.radix_sort_cost`` and ``fit_radix_sort`` its parameters).
* ``pcie.h2d_gbytes_per_s`` / ``d2h`` / ``bidir``: pinned host memory copies of 1 GiB.
* ``cta_copy.<n>``: GB/s of a persistent Triton copy kernel of ``n`` CTAs (how much one
  collective channel, one CTA, can move through HBM), where Triton is installed.
* ``dense.w<width>.b<batch>.*``: Model-A's whole dense part (bottom MLP, concatenation, top MLP)
  forward, and forward + backward eager and as one CUDA graph, with the profiler's split into
  GEMM and other kernels, at the preset's first top width 971 and its aligned neighbour 976;
  ``dense.adam_*``: the dense optimizer over the same parameters (``compare_dense``).
* ``concurrent.*``: two kernels on two streams started together, each one's end (ms from the
  common start) beside its time alone: a GEMM beside an SM copy kernel at equal and at high
  priority, a GEMM beside a persistent 16-CTA copy (NCCL-like), two HBM-bound copies of 66 CTAs
  each, a GEMM beside a pinned host-to-device DMA copy, and an embedding bag beside a GEMM.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any, Callable

SUMMARY = ("GPU figures measured with PyTorch on this machine's CUDA device: GEMM, embedding bag, "
           "Triton TBE kernels, row updates, HBM and PCIe copies, per-CTA copy rate, concurrent kernels")

#: Model-A's dense widths (host/workloads/presets/model-a.toml): the uniform layer width, the
#: width after the concatenation and the concatenation's width (93,000 + 3,696).
MODEL_A_WIDTH, MODEL_A_W1, MODEL_A_CAT = 3696, 971, 96696
SECTOR = 32          # HBM sector bytes (CUDA C++ Best Practices Guide)
POOLING = 15         # Model-A's mean pooling factor (Neo, Table 3)


def _torch():
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise ValueError("gpu: needs PyTorch with a CUDA device (pip install torch); "
                         "PyTorch is not installed here") from exc
    if not torch.cuda.is_available():
        raise ValueError("gpu: needs a CUDA device; torch.cuda.is_available() is False here")
    return torch


class _Timer:
    """Milliseconds per call of a callable on the current stream: ``reps`` calls back to back
    between two events (the queue stays full, as in training, so no call waits for the CPU to
    dispatch it), the median of ``rounds`` such runs, after warm-up."""

    def __init__(self, torch) -> None:
        self.torch = torch

    def __call__(self, fn: Callable[[], Any], reps: int = 10, warmup: int = 3, rounds: int = 5) -> float:
        torch = self.torch
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(rounds):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(reps):
                fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / reps)
        return statistics.median(times)


def _sectors(row_bytes: int) -> int:
    return -(-row_bytes // SECTOR) * SECTOR


def measure_gemm(torch, timer: _Timer, quick: bool) -> dict[str, float]:
    shapes = [("bf16", 8192, 8192, 8192), ("fp16", 8192, 8192, 8192)]
    for batch in ((512, 2048) if quick else (512, 1024, 2048, 4096)):
        shapes += [("fp16", batch, MODEL_A_WIDTH, MODEL_A_WIDTH),          # forward layer
                   ("fp16", MODEL_A_WIDTH, MODEL_A_WIDTH, batch)]          # weight gradient
    shapes += [("fp16", 512, MODEL_A_W1, MODEL_A_CAT), ("fp16", MODEL_A_CAT, MODEL_A_W1, 512)]
    return _time_gemms(torch, timer, shapes)


def _time_gemms(torch, timer: _Timer, shapes: list[tuple[str, int, int, int]]) -> dict[str, float]:
    """ms and TFLOP/s of one ``torch.matmul`` of each ``(dtype, m, n, k)``."""
    out: dict[str, float] = {}
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}
    for dtype, m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=dt[dtype])
        b = torch.randn(k, n, device="cuda", dtype=dt[dtype])
        ms = timer(lambda: torch.matmul(a, b), reps=10 if m * n * k < 1e11 else 5)
        key = f"gemm.{dtype}.{m}x{n}x{k}"
        out[f"{key}.ms"] = ms
        out[f"{key}.tflops"] = 2.0 * m * n * k / (ms * 1e-3) / 1e12
        del a, b
    return out


def measure_gemm_sweep(torch, timer: _Timer, quick: bool) -> dict[str, float]:
    """How a GEMM's efficiency falls with a short inner dimension (weight gradients: K = batch)
    and a thin output (forward layers: M = batch), at Model-A's width."""
    w = MODEL_A_WIDTH
    shapes = [(w, w, k) for k in (128, 256, 512, 1024, 2048, 4096, 8192, 16384)]
    shapes += [(m, w, w) for m in (64, 128, 256, 384, 768, 1536, 3072, 6144)]
    shapes += [(m, 971, 96696) for m in (512, 2048)] + [(8192, 8192, k) for k in (512, 2048)]
    # 971 is odd: its FP16 rows are not 16-byte aligned, which Hopper's TMA-based kernels need
    # (Nsight Compute showed cuBLAS fall back to an SM75 kernel); the aligned neighbours
    shapes += [(512, 968, 96696), (512, 976, 96696)]
    if quick:
        shapes = shapes[::3]
    return _time_gemms(torch, timer, [("fp16", m, n, k) for m, n, k in shapes])


#: Model-A's dense part (host/workloads/presets/model-a.toml): the bottom MLP's widths from its
#: 1024 inputs, and the top MLP's after the concatenation (W1 first, 11 layers of 3696, then 1).
MODEL_A_BOTTOM = (MODEL_A_WIDTH,) * 7
MODEL_A_TOP_TAIL = (MODEL_A_WIDTH,) * 11 + (1,)
MODEL_A_DENSE_IN = 1024
#: GEMM kernels by name in the profiler's trace: cuBLAS's Hopper kernels (nvjet), CUTLASS ones
#: (its SM75 fallback for unaligned rows among them) and the older xmma/ampere families.
GEMM_KERNEL_NAMES = ("gemm", "cutlass", "nvjet", "xmma", "sm90_", "ampere_")


def _kernel_split(torch, fn: Callable[[], Any], calls: int = 5) -> tuple[float, float]:
    """ms per call of GEMM kernels and of every other kernel (elementwise, reductions, copies),
    from the PyTorch profiler's device times: what the GPU executes, without the gaps between
    launches."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    gemm = other = 0.0
    for event in prof.key_averages():
        if event.device_type.name != "CUDA":
            continue
        ms = event.self_device_time_total / calls / 1e3
        if any(k in event.key.lower() for k in GEMM_KERNEL_NAMES):
            gemm += ms
        else:
            other += ms
    return gemm, other


def measure_dense(torch, timer: _Timer, quick: bool) -> dict[str, float]:
    """Model-A's whole dense part on one GPU, FP16, as PyTorch trains it: the bottom MLP, the
    concatenation with 93,000 pooled embedding features, the top MLP (``nn.Linear`` layers with
    bias, ReLU between them); forward, and forward + backward (``torch.autograd.grad`` of the
    output's sum: every weight, bias and the embeddings' gradients, no accumulation), launched
    eagerly and replayed as one CUDA graph (the GPU's time without the CPU's launch gaps), with
    the profiler's split into GEMM and other kernels; at the preset's first top width
    (``dense.w971``) and its 16-byte-aligned neighbour (``dense.w976``); and the dense optimizer
    (``torch.optim.Adam``, FP32, fused and foreach) over the same parameters. Checks
    ``host.iteration.dense_costs``, which sums per-layer GEMM costs (``compare``)."""
    out: dict[str, float] = {}
    dev, half = "cuda", torch.float16
    cat = 93000 + MODEL_A_WIDTH                               # sum of Model-A's embedding dims + D

    def mlp(widths, fan_in):
        layers: list[Any] = []
        for w in widths:
            layers += [torch.nn.Linear(fan_in, w), torch.nn.ReLU()]
            fan_in = w
        return torch.nn.Sequential(*layers[:-1])

    numels: list[int] = []
    for w1 in (MODEL_A_W1, 976):
        bottom = mlp(MODEL_A_BOTTOM, MODEL_A_DENSE_IN).to(dev, half)
        top = mlp((w1,) + MODEL_A_TOP_TAIL, cat).to(dev, half)
        weights = list(bottom.parameters()) + list(top.parameters())
        numels = [p.numel() for p in weights] if w1 == MODEL_A_W1 else numels
        for batch in ((512,) if quick or w1 != MODEL_A_W1 else (512, 2048)):
            x = torch.randn(batch, MODEL_A_DENSE_IN, device=dev, dtype=half)
            emb = torch.randn(batch, 93000, device=dev, dtype=half, requires_grad=True)
            grads_of = weights + [emb]

            def forward():
                with torch.no_grad():
                    return top(torch.cat([bottom(x), emb], 1))

            def step():
                return torch.autograd.grad(top(torch.cat([bottom(x), emb], 1)).sum(), grads_of)

            key = f"dense.w{w1}.b{batch}"
            out[f"{key}.forward_ms"] = timer(forward, reps=5)
            out[f"{key}.forward_backward_ms"] = timer(step, reps=5)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            out[f"{key}.forward_backward_graph_ms"] = timer(graph.replay, reps=5)
            gemm, other = _kernel_split(torch, step)
            out[f"{key}.gemm_kernels_ms"], out[f"{key}.other_kernels_ms"] = gemm, other
            del graph, x, emb
        del bottom, top, weights
    # the optimizer over FP32 copies of the same tensors (one per weight and bias)
    master = [torch.zeros(n, device=dev, dtype=torch.float32, requires_grad=True) for n in numels]
    for p in master:
        p.grad = torch.randn_like(p)
    for kind in ("fused", "foreach"):
        opt = torch.optim.Adam(master, lr=1e-3, **{kind: True})
        out[f"dense.adam_{kind}_fp32_ms"] = timer(opt.step, reps=3)
    out["dense.params"] = float(sum(numels))
    return out


def measure_copies(torch, timer: _Timer, quick: bool) -> dict[str, float]:
    out: dict[str, float] = {}
    n = (1 << 29) // (2 if quick else 1)                  # fp32 elements: 2 GiB (1 GiB quick)
    src = torch.empty(n, device="cuda", dtype=torch.float32).uniform_()
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    out["hbm_copy_gbytes_per_s"] = 2 * 4 * n / (ms * 1e-3) / 1e9
    ms = timer(lambda: torch.mul(src, 1.0, out=dst))    # an SM kernel, whatever copy_ uses
    out["hbm_kernel_copy_gbytes_per_s"] = 2 * 4 * n / (ms * 1e-3) / 1e9
    del src, dst
    pin = torch.empty(1 << 28, dtype=torch.float32).pin_memory()     # 1 GiB
    pin2 = torch.empty(1 << 28, dtype=torch.float32).pin_memory()
    dev = torch.empty(1 << 28, device="cuda", dtype=torch.float32)
    dev2 = torch.empty(1 << 28, device="cuda", dtype=torch.float32)
    nbytes = 4 * (1 << 28)
    out["pcie.h2d_gbytes_per_s"] = nbytes / (timer(lambda: dev.copy_(pin, non_blocking=True), reps=5) * 1e-3) / 1e9
    out["pcie.d2h_gbytes_per_s"] = nbytes / (timer(lambda: pin.copy_(dev, non_blocking=True), reps=5) * 1e-3) / 1e9
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

    def both():
        cur = torch.cuda.current_stream()
        s1.wait_stream(cur)
        s2.wait_stream(cur)
        with torch.cuda.stream(s1):
            dev.copy_(pin, non_blocking=True)
        with torch.cuda.stream(s2):
            pin2.copy_(dev2, non_blocking=True)
        cur.wait_stream(s1)
        cur.wait_stream(s2)
    out["pcie.bidir_gbytes_per_s"] = 2 * nbytes / (timer(both, reps=5) * 1e-3) / 1e9
    del pin, pin2, dev, dev2
    return out


def measure_embedding(torch, timer: _Timer, quick: bool) -> dict[str, float]:
    out: dict[str, float] = {}
    rows = 1 << 22
    bags = 1 << (14 if quick else 16)
    F = torch.nn.functional
    cases = [("fp32", 32), ("fp32", 64), ("fp32", 92), ("fp32", 128), ("fp32", 256),
             ("fp16", 64), ("fp16", 128)]
    if quick:
        cases = [("fp32", 64), ("fp32", 128)]
    dt = {"fp32": (torch.float32, 4), "fp16": (torch.float16, 2)}
    g = torch.Generator(device="cuda")
    g.manual_seed(1)
    for dtype, dim in cases:
        tdt, size = dt[dtype]
        table = torch.empty(rows, dim, device="cuda", dtype=tdt).uniform_()
        n = bags * POOLING
        idx = torch.randint(0, rows, (n,), device="cuda", generator=g)
        offsets = torch.arange(0, n, POOLING, device="cuda")
        ms = timer(lambda: F.embedding_bag(idx, table, offsets, mode="sum"))
        nbytes = n * _sectors(dim * size) + 8 * n + bags * dim * size      # int64 indices
        out[f"embedding_bag.{dtype}.d{dim}.ms"] = ms
        out[f"embedding_bag.{dtype}.d{dim}.gbytes_per_s"] = nbytes / (ms * 1e-3) / 1e9
        uniq = torch.randperm(rows, device="cuda", generator=g)[: 1 << 20].sort().values
        grad = torch.empty(uniq.numel(), dim, device="cuda", dtype=tdt).uniform_()
        ms = timer(lambda: table.index_add_(0, uniq, grad))
        nbytes = uniq.numel() * (2 * _sectors(dim * size) + dim * size + 8)
        out[f"row_update.{dtype}.d{dim}.ms"] = ms
        out[f"row_update.{dtype}.d{dim}.gbytes_per_s"] = nbytes / (ms * 1e-3) / 1e9
        del table, idx, offsets, uniq, grad
    out["embedding_bag.bags"] = float(bags)
    out["embedding_bag.pooling"] = float(POOLING)
    return out


#: Model-A's table dims (``host/workloads/presets/model-a.toml``, as ``host/workloads/synth.py``
#: synthesizes its 1000 tables): the dims at 32 evenly spaced quantiles, mean 93.9 (the
#: preset's 93); the mixed-dim TBE case uses one table of each.
MODEL_A_DIM_QUANTILES = (12, 20, 24, 28, 28, 32, 36, 36, 40, 44, 48, 52, 56, 60, 64, 68, 68, 76, 80,
                         84, 92, 96, 104, 112, 124, 136, 148, 164, 188, 220, 280, 384)
TBE_TABLE_BYTES = 4 << 30   # tables of each case: 4 GiB, far beyond the H100's 50 MB L2
TBE_BAGS = 1 << 16          # bags per launch (tables x bags each), as ``measure_embedding``'s
TBE_L_BLOCK = 16            # lookups of one bag gathered at once (Model-A's pooling 15 fits)
TBE_ADAGRAD = (0.01, 1e-8)  # learning rate and epsilon of the checked and timed updates


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _tbe_warps(l_block: int, width: int) -> int:
    """The forward's default warps for a tile of ``l_block`` lookups by ``width`` columns:
    about 8 elements a thread, 1 to 8 warps."""
    return max(1, min(8, l_block * width // 256))


#: Launch configurations the timed TBE cases try, each case reporting its fastest (a tuned
#: kernel, as FBGEMM's are tuned per shape) and every one's time: the forward's (lookups per
#: step, warps; None = :func:`_tbe_warps`) and the backward's warps.
TBE_FORWARD_CONFIGS = ((16, None), (8, 1), (8, 2), (8, 4), (16, 1), (16, 2), (16, 4), (16, 8), (32, 4), (32, 8))
TBE_BACKWARD_WARPS = (4, 1, 2, 8)


def _tbe_kernels():
    """Triton kernels of a table-batched embedding (TBE) like FBGEMM's, written for this
    benchmark (not FBGEMM's code): ``forward`` sums each bag's rows in registers, one program
    per (bag, table) of a launch over many tables; ``backward`` is the fused backward with
    row-wise AdaGrad, one program per block of unique rows after the sort. Raises ImportError
    where Triton is missing."""
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["t0"])
    def tbe_forward(weights, table_offsets, dims, out_cols, indices, offsets, out, out_stride, B, t0,
                    L_BLOCK: tl.constexpr, D_BLOCK: tl.constexpr):
        b = tl.program_id(0)
        t = t0 + tl.program_id(1)
        start = tl.load(offsets + t * B + b)
        end = tl.load(offsets + t * B + b + 1)
        d = tl.multiple_of(tl.load(dims + t), 4)               # dims are multiples of 4 (16-byte
        woff = tl.multiple_of(tl.load(table_offsets + t), 4)   # FP32 rows): vector loads
        cols = tl.arange(0, D_BLOCK)
        cmask = cols < d
        acc = tl.zeros([D_BLOCK], dtype=tl.float32)
        l0 = start
        # while loops, not ranges: Triton's interpreter (the CPU tests) under NumPy 2.4 cannot
        # take a loaded value as a range's bound
        while l0 < end:
            r = l0 + tl.arange(0, L_BLOCK)
            m = r < end
            idx = tl.load(indices + r, mask=m, other=0).to(tl.int64)
            v = tl.load(weights + woff + idx[:, None] * d + cols[None, :], mask=m[:, None] & cmask[None, :], other=0.0)
            acc += tl.sum(v.to(tl.float32), axis=0)
            l0 += L_BLOCK
        dst = out + b.to(tl.int64) * out_stride + tl.multiple_of(tl.load(out_cols + t), 4) + cols
        tl.store(dst, acc.to(out.dtype.element_ty), mask=cmask)

    @triton.jit(do_not_specialize=["u0", "u1"])
    def tbe_backward_adagrad(weights, momentum, table_offsets, row_bases, dims, out_cols, grad, grad_stride,
                             uniq_rows, seg, sorted_bags, u0, u1, B, lr, eps,
                             U_BLOCK: tl.constexpr, D_BLOCK: tl.constexpr):
        u = u0 + tl.program_id(0) * U_BLOCK + tl.arange(0, U_BLOCK)
        um = u < u1
        s = tl.load(seg + u, mask=um, other=0)
        e = tl.load(seg + u + 1, mask=um, other=0)
        row = tl.load(uniq_rows + u, mask=um, other=0)
        bag = tl.load(sorted_bags + s, mask=um, other=0)
        t = bag // B
        d = tl.multiple_of(tl.load(dims + t, mask=um, other=0), 4)
        col0 = tl.multiple_of(tl.load(out_cols + t, mask=um, other=0).to(tl.int64), 4)
        woff = tl.multiple_of(tl.load(table_offsets + t, mask=um, other=0)
                              + (row - tl.load(row_bases + t, mask=um, other=0)) * d, 4)
        cols = tl.arange(0, D_BLOCK)
        mask = um[:, None] & (cols[None, :] < d[:, None])
        # the segment of each unique row: its first lookup's gradient row, then the rest
        g = tl.load(grad + (bag % B).to(tl.int64)[:, None] * grad_stride + col0[:, None] + cols[None, :],
                    mask=mask, other=0.0).to(tl.float32)
        longest = tl.max(e - s, axis=0)
        k = tl.full([], 1, tl.int32)
        while k < longest:
            mk = um & (s + k < e)
            bk = tl.load(sorted_bags + s + k, mask=mk, other=0)
            g += tl.load(grad + (bk % B).to(tl.int64)[:, None] * grad_stride + col0[:, None] + cols[None, :],
                         mask=mask & mk[:, None], other=0.0).to(tl.float32)
            k += 1
        # row-wise AdaGrad: one FP32 state per row, the mean of the squared gradient
        mom = tl.load(momentum + row, mask=um, other=0.0) + tl.sum(g * g, axis=1) / tl.maximum(d, 1).to(tl.float32)
        tl.store(momentum + row, mom, mask=um)
        ptr = weights + woff[:, None] + cols[None, :]
        w = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
        w -= (lr / (tl.sqrt(mom) + eps))[:, None] * g
        tl.store(ptr, w.to(weights.dtype.element_ty), mask=mask)

    return tbe_forward, tbe_backward_adagrad


class _TBE:
    """One TBE case: ``dims`` (tables sorted by dim) of ``rows`` rows each in one flat weight
    buffer of ``dtype``, row-wise AdaGrad state (FP32 per row), ``bags`` bags per table of
    ``lengths`` lookups (table-major offsets, as FBGEMM's: bag ``t * bags + b``), uniformly
    random int32 indices; the pooled output (and its gradient) is ``[bags, sum(dims)]`` of the
    tables' dtype. Tables are launched in buckets of one power-of-two tile width (one launch
    for uniform dims; a table's tile is its dim rounded up to a power of two)."""

    def __init__(self, torch, device: str, dtype, dims: list[int], rows: int, bags: int, lengths, generator,
                 kernels=None) -> None:
        self.torch, self.device, self.dtype = torch, device, dtype
        self.dims, self.rows, self.bags = list(dims), int(rows), int(bags)
        if self.dims != sorted(self.dims) or any(d <= 0 or d % 4 for d in self.dims):
            raise ValueError(f"tbe: dims: expected positive multiples of 4 (as FBGEMM's), sorted (one tile "
                             f"width a contiguous run of tables), got {self.dims}")
        T, dev, i64 = len(self.dims), device, torch.int64
        d = torch.tensor(self.dims, dtype=i64)
        self.dims_t = d.to(torch.int32).to(dev)
        self.table_offsets = (torch.cumsum(d * rows, 0) - d * rows).to(dev)
        self.row_bases = (torch.arange(T, dtype=i64) * rows).to(dev)
        self.out_cols = (torch.cumsum(d, 0) - d).to(dev)
        self.total_d = int(d.sum())
        self.weights = torch.empty(int((d * rows).sum()), device=dev, dtype=dtype)
        self.weights.uniform_(-0.5, 0.5, generator=generator)
        self.momentum = torch.zeros(T * rows, device=dev, dtype=torch.float32)
        lengths = lengths.to(dev)
        self.offsets = torch.zeros(T * bags + 1, device=dev, dtype=i64)
        self.offsets[1:] = torch.cumsum(lengths, 0)
        self.lookups = int(self.offsets[-1])
        self.indices = torch.randint(0, rows, (self.lookups,), device=dev, generator=generator, dtype=i64)
        self.bag_of = torch.repeat_interleave(torch.arange(T * bags, device=dev, dtype=i64), lengths)
        self.keys = self.indices + self.row_bases[self.bag_of // bags]       # global row ids
        self.indices = self.indices.to(torch.int32)
        self.offsets = self.offsets.to(torch.int32)
        self.bag_of = self.bag_of.to(torch.int32)
        self.out = torch.empty(bags, self.total_d, device=dev, dtype=dtype)
        self.grad = torch.empty(bags, self.total_d, device=dev, dtype=dtype).uniform_(-1, 1, generator=generator)
        self.buckets: list[tuple[int, int, int]] = []          # (first table, end, tile width)
        for t, dim in enumerate(self.dims):
            if self.buckets and self.buckets[-1][2] == _pow2(dim):
                self.buckets[-1] = (self.buckets[-1][0], t + 1, _pow2(dim))
            else:
                self.buckets.append((t, t + 1, _pow2(dim)))
        self.kernels = _tbe_kernels() if kernels is None else kernels
        self.sorted = None
        #: launch configurations: the forward's (lookups per step, warps) and the backward's
        #: warps; None takes :func:`_tbe_warps`' default for each tile width
        self.forward_config: tuple[int, int | None] = (TBE_L_BLOCK, None)
        self.backward_warps: int | None = 4

    def forward(self):
        fwd = self.kernels[0]
        l_block, warps = self.forward_config
        for t0, t1, width in self.buckets:
            fwd[(self.bags, t1 - t0)](self.weights, self.table_offsets, self.dims_t, self.out_cols, self.indices,
                                      self.offsets, self.out, self.total_d, self.bags, t0, L_BLOCK=l_block,
                                      D_BLOCK=width, num_warps=warps or _tbe_warps(l_block, width))
        return self.out

    def sort(self):
        """The backward's sort (torch): lookups by global row, their bags, the unique rows and
        their segments (``seg[u]..seg[u+1]``), and where each bucket's unique rows start."""
        torch = self.torch
        keys, perm = torch.sort(self.keys)
        bags = self.bag_of[perm]
        uniq, counts = torch.unique_consecutive(keys, return_counts=True)
        seg = torch.zeros(uniq.numel() + 1, device=self.device, dtype=torch.int32)
        seg[1:] = torch.cumsum(counts, 0)
        firsts = self.row_bases[[t0 for t0, _, _ in self.buckets]]
        starts = torch.searchsorted(uniq, firsts).tolist() + [uniq.numel()]
        self.sorted = (uniq, seg, bags, starts)
        return self.sorted

    def backward(self):
        uniq, seg, bags, starts = self.sorted
        bwd = self.kernels[1]
        lr, eps = TBE_ADAGRAD
        for (t0, t1, width), u0, u1 in zip(self.buckets, starts, starts[1:]):
            if u1 <= u0:
                continue
            block = max(1, min(64, 2048 // width))
            bwd[(-(-(u1 - u0) // block),)](self.weights, self.momentum, self.table_offsets, self.row_bases,
                                           self.dims_t, self.out_cols, self.grad, self.total_d, uniq, seg, bags,
                                           u0, u1, self.bags, lr, eps, U_BLOCK=block, D_BLOCK=width,
                                           num_warps=self.backward_warps or 4)

    def reference(self):
        """torch's results for this case: the pooled output (``embedding_bag``, mode sum, per
        table) and the weights and state after one row-wise AdaGrad step on ``grad``."""
        torch = self.torch
        F = torch.nn.functional
        lr, eps = TBE_ADAGRAD
        outs, weights, moms = [], self.weights.clone().float(), self.momentum.clone()
        B, rows = self.bags, self.rows
        for t, dim in enumerate(self.dims):
            w0 = int(self.table_offsets[t])
            table = weights[w0: w0 + rows * dim].view(rows, dim)
            lo, hi = int(self.offsets[t * B]), int(self.offsets[(t + 1) * B])
            idx = self.indices[lo:hi].long()
            offs = self.offsets[t * B:(t + 1) * B].long() - lo
            outs.append(F.embedding_bag(idx, table, offs, mode="sum"))
            col = int(self.out_cols[t])
            per_lookup = self.grad[:, col: col + dim].float()[self.bag_of[lo:hi].long() - t * B]
            g = torch.zeros(rows, dim, dtype=torch.float32, device=self.device).index_add_(0, idx, per_lookup)
            touched = torch.unique(idx)
            m = moms[t * rows: (t + 1) * rows]
            m[touched] += (g[touched] ** 2).mean(1)
            table[touched] -= lr * g[touched] / (m[touched].sqrt() + eps)[:, None]
        return torch.cat(outs, 1), weights, moms

    def unique_per_table(self) -> list[int]:
        """Unique rows of each table in the last :meth:`sort`."""
        uniq = self.sorted[0]
        bounds = self.torch.searchsorted(uniq, self.torch.cat([self.row_bases, self.row_bases[-1:] + self.rows]))
        return [int(b - a) for a, b in zip(bounds.tolist(), bounds.tolist()[1:])]

    def lookups_per_table(self) -> list[int]:
        off = self.offsets[:: self.bags].tolist()
        return [b - a for a, b in zip(off, off[1:])]

    def forward_bytes(self) -> tuple[float, float]:
        """``sim.gpu.embedding_forward_cost``'s bytes, (gathered, streamed): every row read
        rounded up to 32-byte sectors; 4-byte indices and the pooled output written (the
        offsets, 4 bytes a bag, are not counted, as the model does not)."""
        size = self.weights.element_size()
        gather = sum(n * _sectors(dim * size) for n, dim in zip(self.lookups_per_table(), self.dims))
        return float(gather), float(4 * self.lookups + self.bags * self.total_d * size)

    def backward_bytes(self) -> tuple[float, float]:
        """``sim.gpu.embedding_backward_cost``'s bytes of the fused kernel, (row traffic,
        streamed): each unique row's weights and FP32 state read and written, each rounded up to
        32-byte sectors; one gradient row read per lookup (the sort's bytes are its own figure)."""
        size = self.weights.element_size()
        rows = sum(u * 2 * (_sectors(dim * size) + _sectors(4)) for u, dim in zip(self.unique_per_table(), self.dims))
        grads = sum(n * dim * size for n, dim in zip(self.lookups_per_table(), self.dims))
        return float(rows), float(grads)


def tbe_check(torch, device: str = "cuda", seed: int = 5) -> dict[str, float]:
    """The TBE kernels against torch on small cases with many duplicate rows, empty bags and
    bags longer than one tile (FP32 and FP16 tables of dims 4..92 in five tile widths): the
    largest absolute difference of the pooled output, and of the weights and AdaGrad state after
    one fused backward step, from :meth:`_TBE.reference`; ``tbe.check.<dtype>.ok`` is 1 when
    each is within rounding (relative 1e-5 for FP32, 2e-3 for FP16 results)."""
    out: dict[str, float] = {}
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    kernels = _tbe_kernels()
    for name, dtype, tol in (("fp32", torch.float32, 1e-5), ("fp16", torch.float16, 2e-3)):
        dims, bags = [4, 12, 20, 64, 92], 24
        lengths = torch.randint(0, 2 * TBE_L_BLOCK, (len(dims) * bags,), device=device, generator=g)
        case = _TBE(torch, device, dtype, dims, 40, bags, lengths, g, kernels)
        ref_out, ref_w, ref_m = case.reference()
        pooled = case.forward().float()
        case.sort()
        case.backward()
        errors = {"forward": ((pooled - ref_out).abs().max(), ref_out.abs().max()),
                  "weights": ((case.weights.float() - ref_w).abs().max(), ref_w.abs().max()),
                  "momentum": ((case.momentum - ref_m).abs().max(), ref_m.abs().max())}
        ok = True
        for what, (err, scale) in errors.items():
            out[f"tbe.check.{name}.{what}_max_abs_error"] = float(err)
            ok = ok and float(err) <= tol * max(1.0, float(scale))
        out[f"tbe.check.{name}.ok"] = 1.0 if ok else 0.0
    return out


def measure_tbe(torch, timer: _Timer, quick: bool) -> dict[str, float]:
    """A TBE-like fused forward and fused backward + row-wise AdaGrad, Triton kernels written
    here (:func:`_tbe_kernels`; FBGEMM itself is not installable on the lent machines): what
    this access pattern achieves on this GPU, between torch's unfused kernels
    (``embedding_bag``, ``row_update``) and the data sheet. Checked against torch first
    (``tbe.check.*``). Each case: 4 GiB of tables (``TBE_TABLE_BYTES``), 65,536 bags of
    Model-A's pooling 15 over 8 tables of one dim (``d<dim>``) or 32 tables of Model-A's dim
    mix (``model_a``, :data:`MODEL_A_DIM_QUANTILES`), uniformly random indices. Figures per
    ``<dtype>.<case>``: ``tbe.forward`` ms and GB/s at the forward model's bytes (with its
    gathered and streamed bytes); ``tbe.embedding_bag``: torch's kernel on the same lookups
    (uniform dims); ``tbe.sort``: ``torch.sort`` of the lookups' int64 row keys with their
    permutation, and ``tbe.sort_unique``: the whole preparation (sort, bags permuted, unique
    rows and segments; it waits on the host twice); ``tbe.backward_adagrad``: the fused kernel
    after the sort, ms and GB/s at the backward model's bytes without the sort's (row traffic
    and gradient reads), with its lookups and unique rows per table."""
    try:
        _tbe_kernels()
    except ImportError:
        return {"tbe.available": 0.0, "tbe.skipped": "Triton is not installed (pip install triton)"}
    cases = [("fp32", d) for d in (32, 64, 92, 128, 256)] + [("fp16", d) for d in (64, 92, 128, 256)]
    cases += [("fp32", "model_a"), ("fp16", "model_a")]
    if quick:
        cases = [("fp32", 92), ("fp16", 128), ("fp32", "model_a")]
    out: dict[str, Any] = {"tbe.available": 1.0}
    out.update(tbe_check(torch, "cuda"))
    out.update(tbe_figures(torch, timer, "cuda", cases, TBE_TABLE_BYTES // (4 if quick else 1), TBE_BAGS))
    return out


def _fastest(timer: Callable[..., float], case, attr: str, fn: Callable[[], Any], configs, out: dict,
             key: str) -> tuple[float, Any]:
    """Time ``fn`` with ``case.<attr>`` set to each of ``configs``; record every config's ms
    (``<key>.configs``: ``[config, ms]`` pairs) and the fastest one (``<key>.config``), and
    return (its ms, it)."""
    timed = []
    for config in configs:
        setattr(case, attr, config)
        timed.append((timer(fn), config))
    ms, best = min(timed, key=lambda item: item[0])
    out[f"{key}.configs"] = [[list(c) if isinstance(c, tuple) else c, t] for t, c in timed]
    out[f"{key}.config"] = list(best) if isinstance(best, tuple) else best
    return ms, best


def tbe_figures(torch, timer: Callable[..., float], device: str, cases: list[tuple[str, Any]],
                table_bytes: int, bags_per_launch: int, seed: int = 2,
                forward_configs=TBE_FORWARD_CONFIGS, backward_warps=TBE_BACKWARD_WARPS) -> dict[str, Any]:
    """:func:`measure_tbe`'s timed figures for ``cases`` of ``(dtype, dim or "model_a")``, each
    with about ``table_bytes`` of tables and ``bags_per_launch`` bags of Model-A's pooling; each
    kernel's figure is its fastest launch configuration of ``forward_configs`` /
    ``backward_warps`` (every configuration's time recorded beside it)."""
    out: dict[str, Any] = {}
    F = torch.nn.functional
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    dts = {"fp32": torch.float32, "fp16": torch.float16}
    kernels = _tbe_kernels()
    for dtype, dim in cases:
        dims = list(MODEL_A_DIM_QUANTILES) if dim == "model_a" else [dim] * 8
        name = f"{dtype}.{dim if dim == 'model_a' else f'd{dim}'}"
        rows = table_bytes // (DTYPE_BYTES[dtype] * sum(dims))
        bags = bags_per_launch // len(dims)
        lengths = torch.full((len(dims) * bags,), POOLING, device=device, dtype=torch.int64)
        case = _TBE(torch, device, dts[dtype], dims, rows, bags, lengths, g, kernels)
        gather, stream = case.forward_bytes()
        ms, case.forward_config = _fastest(timer, case, "forward_config", case.forward, forward_configs,
                                           out, f"tbe.forward.{name}")
        out[f"tbe.forward.{name}.ms"] = ms
        out[f"tbe.forward.{name}.gbytes_per_s"] = (gather + stream) / (ms * 1e-3) / 1e9
        out[f"tbe.forward.{name}.gather_bytes"], out[f"tbe.forward.{name}.stream_bytes"] = gather, stream
        out[f"tbe.{name}.tables"], out[f"tbe.{name}.bags"] = float(len(dims)), float(bags)
        out[f"tbe.{name}.rows"], out[f"tbe.{name}.lookups"] = float(rows), float(case.lookups)
        if dim != "model_a":
            table = case.weights.view(-1, dim)
            keys32, offs = case.keys.to(torch.int32), case.offsets[:-1]
            ms = timer(lambda: F.embedding_bag(keys32, table, offs, mode="sum"))
            out[f"tbe.embedding_bag.{name}.ms"] = ms
            out[f"tbe.embedding_bag.{name}.gbytes_per_s"] = (gather + stream) / (ms * 1e-3) / 1e9
            del table, keys32, offs
        out[f"tbe.sort.{name}.ms"] = timer(lambda: torch.sort(case.keys), reps=5)
        out[f"tbe.sort_unique.{name}.ms"] = timer(case.sort, reps=3, warmup=1, rounds=3)
        case.sort()
        row_bytes, grad_bytes = case.backward_bytes()
        ms, case.backward_warps = _fastest(timer, case, "backward_warps", case.backward, backward_warps,
                                           out, f"tbe.backward_adagrad.{name}")
        out[f"tbe.backward_adagrad.{name}.ms"] = ms
        out[f"tbe.backward_adagrad.{name}.gbytes_per_s"] = (row_bytes + grad_bytes) / (ms * 1e-3) / 1e9
        out[f"tbe.backward_adagrad.{name}.row_bytes"] = row_bytes
        out[f"tbe.backward_adagrad.{name}.grad_bytes"] = grad_bytes
        out[f"tbe.backward_adagrad.{name}.unique_rows_per_table"] = case.unique_per_table()
        del case
        if device == "cuda":
            torch.cuda.empty_cache()
    return out


def _triton_copy():
    """A persistent copy kernel: ``grid`` CTAs stride over the buffer (as a collective's
    channels do), or None where Triton is missing."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def copy_kernel(src, dst, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        step = tl.num_programs(0) * BLOCK
        for start in range(pid * BLOCK, n, step):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)

    def launch(src, dst, ctas: int) -> None:
        copy_kernel[(ctas,)](src, dst, src.numel(), BLOCK=4096, num_warps=8)
    return launch


def _triton_gather():
    """A persistent gather kernel: ``grid`` CTAs copy rows of a table at random indices into a
    dense output (an embedding lookup's memory pattern), or None where Triton is missing."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def gather_kernel(table, idx, out, n, D: tl.constexpr, ROWS: tl.constexpr):
        pid = tl.program_id(0)
        step = tl.num_programs(0) * ROWS
        cols = tl.arange(0, D)[None, :]
        for start in range(pid * ROWS, n, step):
            r = start + tl.arange(0, ROWS)
            m = r < n
            i = tl.load(idx + r, mask=m, other=0)
            v = tl.load(table + i[:, None] * D + cols, mask=m[:, None], other=0.0)
            tl.store(out + r[:, None] * D + cols, v, mask=m[:, None])

    def launch(table, idx, out, ctas: int) -> None:
        gather_kernel[(ctas,)](table, idx, out, idx.numel(), D=table.shape[1], ROWS=64, num_warps=8)
    return launch


_EXCLUSIVE_COPY = r"""
extern "C" __global__ void copy_exclusive(const float4* __restrict__ src, float4* __restrict__ dst,
                                          long long n) {
    extern __shared__ float4 reserve[];          // taken, not used: one CTA per SM, alone
    if (n < 0) reserve[threadIdx.x] = src[0];
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = src[i];
}
"""


def _exclusive_copy(torch):
    """A persistent copy kernel whose CTAs each reserve 200 KiB of shared memory, so that no
    other kernel's CTA (a GEMM's included) can share an SM with one, as NCCL's channels do
    (NVIDIA/nccl#1656); or None where CuPy is missing."""
    try:
        import cupy
    except ImportError:
        return None
    kern = cupy.RawKernel(_EXCLUSIVE_COPY, "copy_exclusive")
    kern.max_dynamic_shared_size_bytes = 200 * 1024

    def launch(src, dst, ctas: int) -> None:
        stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
        with stream:
            kern((ctas,), (512,), (src.data_ptr(), dst.data_ptr(), cupy.int64(src.numel() // 4)),
                 shared_mem=200 * 1024)
    return launch


def measure_cta_copy(torch, timer: _Timer, quick: bool) -> dict[str, float]:
    launch = _triton_copy()
    if launch is None:
        return {"cta_copy.available": 0.0}
    out: dict[str, float] = {"cta_copy.available": 1.0}
    n = 1 << 27                                         # 512 MiB of fp32
    src = torch.empty(n, device="cuda", dtype=torch.float32).uniform_()
    dst = torch.empty_like(src)
    for ctas in ((1, 16, 132) if quick else (1, 2, 4, 8, 16, 32, 66, 132, 264)):
        m = n if ctas >= 8 else n // 16                 # few CTAs: a smaller buffer
        s, d = src[:m], dst[:m]
        ms = timer(lambda: launch(s, d, ctas), reps=5, warmup=2)
        out[f"cta_copy.{ctas}.gbytes_per_s"] = 2 * 4 * m / (ms * 1e-3) / 1e9
    excl = _exclusive_copy(torch)
    if excl is not None:
        for ctas in ((1, 16) if quick else (1, 2, 4, 8, 16, 32, 132)):
            m = n if ctas >= 8 else n // 16
            s, d = src[:m], dst[:m]
            ms = timer(lambda: excl(s, d, ctas), reps=5, warmup=2)
            out[f"cta_copy_exclusive.{ctas}.gbytes_per_s"] = 2 * 4 * m / (ms * 1e-3) / 1e9
    return out


def _together(torch, first: Callable[[], Any], second: Callable[[], Any], s1, s2) -> tuple[float, float]:
    """Start ``first`` on ``s1`` and, about 50 us later, ``second`` on ``s2``, from one common
    event; each one's end in ms after it."""
    torch.cuda.synchronize()
    t0 = torch.cuda.Event(enable_timing=True)
    e1, e2 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gate = torch.cuda.Event()
    cur = torch.cuda.current_stream()
    torch.cuda._sleep(2_000_000)          # hold both streams until both launches are queued
    t0.record(cur)
    gate.record(cur)
    s1.wait_event(gate)
    s2.wait_event(gate)
    with torch.cuda.stream(s1):
        first()
        e1.record(s1)
    with torch.cuda.stream(s2):
        torch.cuda._sleep(100_000)        # ~50 us: the second kernel arrives behind the first
        second()
        e2.record(s2)
    torch.cuda.synchronize()
    return t0.elapsed_time(e1), t0.elapsed_time(e2)


def measure_concurrent(torch, timer: _Timer, quick: bool) -> dict[str, float]:
    out: dict[str, float] = {}
    sz = 12288 if quick else 16384
    a = torch.randn(sz, sz, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(sz, sz, device="cuda", dtype=torch.bfloat16)
    n = 1 << 28                                          # 1 GiB of fp32
    src = torch.empty(n, device="cuda", dtype=torch.float32).uniform_()
    dst = torch.empty_like(src)
    gemm = lambda: torch.matmul(a, b)  # noqa: E731
    kcopy = lambda: torch.mul(src, 1.0, out=dst)  # noqa: E731
    out["concurrent.gemm_alone_ms"] = timer(gemm, reps=5)
    out["concurrent.copy_alone_ms"] = timer(kcopy, reps=5)
    out["concurrent.gemm_flops"] = 2.0 * sz ** 3
    out["concurrent.copy_bytes"] = 8.0 * n
    lo, hi = torch.cuda.Stream(), torch.cuda.Stream()
    top = torch.cuda.Stream(priority=-1)
    reps = 3

    def med(first, second, s1, s2):
        ends = [_together(torch, first, second, s1, s2) for _ in range(reps)]
        return statistics.median(e[0] for e in ends), statistics.median(e[1] for e in ends)

    noop = lambda: None  # noqa: E731
    # each kernel alone in the same harness (clocks and power as in the pairs below)
    out["concurrent.harness.gemm_alone_ms"] = med(gemm, noop, lo, hi)[0]
    out["concurrent.harness.copy_alone_ms"] = med(kcopy, noop, lo, hi)[0]
    excl = _exclusive_copy(torch)
    if excl is not None:
        for ctas in (8, 16, 32):
            out[f"concurrent.excl{ctas}_alone_ms"] = med(lambda: excl(src, dst, ctas), noop, top, lo)[0]
            c, g = med(lambda: excl(src, dst, ctas), gemm, top, lo)
            out[f"concurrent.excl{ctas}_then_gemm.copy_end_ms"] = c
            out[f"concurrent.excl{ctas}_then_gemm.gemm_end_ms"] = g
        out["concurrent.harness.gemm_alone_after_ms"] = med(gemm, noop, lo, hi)[0]

    g, c = med(gemm, kcopy, lo, hi)
    out["concurrent.gemm_then_copy.gemm_end_ms"], out["concurrent.gemm_then_copy.copy_end_ms"] = g, c
    g, c = med(gemm, kcopy, lo, top)
    out["concurrent.gemm_then_copy_high.gemm_end_ms"], out["concurrent.gemm_then_copy_high.copy_end_ms"] = g, c
    # the same with a GEMM that is not a persistent grid (FP32 on the CUDA cores, many waves of
    # short CTAs): does stream priority then let the copy in ahead of the GEMM's tail?
    torch.backends.cuda.matmul.allow_tf32 = False
    a32 = torch.randn(8192, 8192, device="cuda", dtype=torch.float32)
    b32 = torch.randn(8192, 8192, device="cuda", dtype=torch.float32)
    gemm32 = lambda: torch.matmul(a32, b32)  # noqa: E731
    out["concurrent.harness.gemm32_alone_ms"] = med(gemm32, noop, lo, hi)[0]
    g, c = med(gemm32, kcopy, lo, hi)
    out["concurrent.gemm32_then_copy.gemm_end_ms"], out["concurrent.gemm32_then_copy.copy_end_ms"] = g, c
    g, c = med(gemm32, kcopy, lo, top)
    out["concurrent.gemm32_then_copy_high.gemm_end_ms"], out["concurrent.gemm32_then_copy_high.copy_end_ms"] = g, c
    del a32, b32
    launch = _triton_copy()
    if launch is not None:
        out["concurrent.copy16_alone_ms"] = timer(lambda: launch(src, dst, 16), reps=3, warmup=1)
        c, g = med(lambda: launch(src, dst, 16), gemm, top, lo)
        out["concurrent.copy16_then_gemm.copy_end_ms"], out["concurrent.copy16_then_gemm.gemm_end_ms"] = c, g
        src2, dst2 = torch.empty_like(src).uniform_(), torch.empty_like(src)
        out["concurrent.copy66_alone_ms"] = timer(lambda: launch(src, dst, 66), reps=3, warmup=1)
        out["concurrent.copy132_alone_ms"] = timer(lambda: launch(src, dst, 132), reps=3, warmup=1)
        x, y = med(lambda: launch(src, dst, 66), lambda: launch(src2, dst2, 66), lo, hi)
        out["concurrent.copy66_pair.first_end_ms"], out["concurrent.copy66_pair.second_end_ms"] = x, y
        del src2, dst2
    pin = torch.empty(1 << 28, dtype=torch.float32).pin_memory()
    dev = torch.empty(1 << 28, device="cuda", dtype=torch.float32)
    out["concurrent.h2d_alone_ms"] = timer(lambda: dev.copy_(pin, non_blocking=True), reps=3)
    g, h = med(gemm, lambda: dev.copy_(pin, non_blocking=True), lo, hi)
    out["concurrent.gemm_with_h2d.gemm_end_ms"], out["concurrent.gemm_with_h2d.h2d_end_ms"] = g, h
    del pin, dev
    rows, dim = 1 << 22, 128
    table = torch.empty(rows, dim, device="cuda", dtype=torch.float32).uniform_()
    nl = (1 << 18) * POOLING
    idx = torch.randint(0, rows, (nl,), device="cuda")
    offs = torch.arange(0, nl, POOLING, device="cuda")
    emb = lambda: torch.nn.functional.embedding_bag(idx, table, offs, mode="sum")  # noqa: E731
    out["concurrent.embedding_alone_ms"] = timer(emb, reps=5)
    e, g = med(emb, gemm, lo, hi)
    out["concurrent.embedding_then_gemm.embedding_end_ms"], out["concurrent.embedding_then_gemm.gemm_end_ms"] = e, g
    del table, idx, offs
    gather = _triton_gather()
    if launch is not None and gather is not None:
        # HBM sharing between a random gather and a stream, each on half the SMs, against each
        # alone on the whole GPU: time together / (sum of the times alone at full width) - 1
        rows, dim = 1 << 23, 32
        tab = torch.empty(rows, dim, device="cuda", dtype=torch.float32).uniform_()
        gidx = torch.randint(0, rows, (1 << 23,), device="cuda")
        gout = torch.empty(gidx.numel(), dim, device="cuda", dtype=torch.float32)
        out["concurrent.gather_bytes"] = float(gidx.numel() * (dim * 4 * 2 + 8))
        out["concurrent.gather132_alone_ms"] = med(lambda: gather(tab, gidx, gout, 132), noop, lo, hi)[0]
        out["concurrent.gather66_alone_ms"] = med(lambda: gather(tab, gidx, gout, 66), noop, lo, hi)[0]
        out["concurrent.copy132_harness_alone_ms"] = med(lambda: launch(src, dst, 132), noop, lo, hi)[0]
        x, y = med(lambda: gather(tab, gidx, gout, 66), lambda: launch(src, dst, 66), lo, hi)
        out["concurrent.gather66_copy66.gather_end_ms"], out["concurrent.gather66_copy66.copy_end_ms"] = x, y
        del tab, gidx, gout
    return out


SECTIONS: dict[str, Callable] = {"gemm": measure_gemm, "gemm_sweep": measure_gemm_sweep,
                                 "copies": measure_copies,
                                 "embedding": measure_embedding, "tbe": measure_tbe, "cta_copy": measure_cta_copy,
                                 "concurrent": measure_concurrent, "dense": measure_dense}


def measure(quick: bool = False, progress: Callable[[str], None] = print,
            sections: tuple[str, ...] = tuple(SECTIONS)) -> dict[str, Any]:
    """Every section's figures, with the device and software they were measured on. A section
    that fails reports its error under ``<section>.error`` and the others still run."""
    torch = _torch()
    props = torch.cuda.get_device_properties(0)
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0), "sms": props.multi_processor_count,
        "memory_gib": props.total_memory / 2**30, "torch": torch.__version__,
        "cuda": torch.version.cuda, "quick": quick,
    }
    try:
        import triton
        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = None
    timer = _Timer(torch)
    for name in sections:
        t0 = time.perf_counter()
        progress(f"{name} ...")
        try:
            out.update(SECTIONS[name](torch, timer, quick))
        except Exception as exc:  # one failed section must not lose the others' figures
            out[f"{name}.error"] = f"{type(exc).__name__}: {exc}"
        torch.cuda.empty_cache()
        progress(f"{name} done in {time.perf_counter() - t0:.1f} s")
    return out


def recorded(device: str = "nvidia-h200") -> dict[str, Any]:
    """A measurement this benchmark recorded on a lent GPU, kept as a source of the GPU presets
    (``sim/data/<device>.json``; the file says when and on what machine)."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "sim" / "data" / f"{device}.json"
    if not path.is_file():
        raise FileNotFoundError(f"device: no recorded measurement {path.name} in {path.parent}")
    return json.loads(path.read_text())


#: Which GPU preset of ``sim.gpu`` a device's name stands for (the first match wins).
DEVICE_PRESETS: tuple[tuple[str, str], ...] = (("GH200", "gh200-96gb"), ("H200", "h200-141gb"),
                                               ("H100", "h100-sxm-80gb"), ("A100", "a100-40gb"),
                                               ("V100", "v100-32gb"))
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


def preset_for(device: str) -> str | None:
    """The ``sim.gpu`` preset named for a CUDA device (``None`` if neonic has none)."""
    for needle, preset in DEVICE_PRESETS:
        if needle in device:
            return preset
    return None


def compare(measured: dict[str, Any], preset: str) -> dict[str, Any]:
    """neonic's GPU model beside a measurement: for every measured GEMM and embedding bag, the
    time ``sim.gpu`` predicts for the preset, and measured / model (above 1: the model is
    optimistic); the model's streaming copy rate beside the measured one."""
    from neonic.sim.gpu import embedding_forward_cost, gemm_cost, gpu_preset

    spec = gpu_preset(preset)
    out: dict[str, Any] = {}
    for key, value in measured.items():
        parts = key.split(".")
        if parts[0] == "gemm" and parts[-1] == "ms":
            dtype = parts[1]
            m, n, k = (int(x) for x in parts[2].split("x"))
            model_ms = gemm_cost(spec, m, n, k, dtype).time_s * 1e3
        elif parts[0] == "embedding_bag" and parts[-1] == "ms" and "embedding_bag.bags" in measured:
            dtype, dim = parts[1], int(parts[2][1:])
            bags = int(measured["embedding_bag.bags"])
            row = dim * DTYPE_BYTES[dtype]
            lookups = bags * int(measured["embedding_bag.pooling"])
            model_ms = embedding_forward_cost(spec, lookups, row, bags, row).time_s * 1e3
        else:
            continue
        name = ".".join(parts[:-1])
        out[name] = {"measured_ms": value, "model_ms": model_ms, "measured_over_model": value / model_ms}
    out.update(compare_dense(measured, preset))
    out.update(compare_tbe(measured, preset))
    out.update(compare_sort(measured, preset))
    if "hbm_copy_gbytes_per_s" in measured:
        model = spec.hbm_gbytes_per_s * spec.efficiency.hbm_stream
        out["hbm_copy"] = {"measured_gbytes_per_s": measured["hbm_copy_gbytes_per_s"],
                           "model_gbytes_per_s": model,
                           "measured_over_model": measured["hbm_copy_gbytes_per_s"] / model}
    return out


def compare_tbe(measured: dict[str, Any], preset: str) -> dict[str, Any]:
    """``measure_tbe``'s Triton TBE kernels beside ``sim.gpu``'s fused embedding costs: per case,
    the measured and modelled ms (the forward; the backward as the section runs it, ``torch.sort``
    of the case's keys -- priced as ``sim.gpu.radix_sort_cost`` over all 64 bits of 64-bit keys
    and positions -- then the fused kernel, ``embedding_update_cost`` per table in one launch),
    the fraction of the data sheet's HBM bandwidth the kernel reached at the model's bytes, and
    the efficiency that would make the model's time the measured one with every other
    parameter as it is (``implied_embedding_random`` from the forward's gathered bytes,
    ``implied_embedding_backward`` from the fused kernel's row traffic); the sort's measured /
    model as ``sort_measured_over_model``."""
    from neonic.sim.gpu import embedding_forward_cost, embedding_update_cost, gpu_preset, radix_sort_cost

    spec = gpu_preset(preset)
    eff, peak = spec.efficiency, spec.hbm_bytes_per_s
    launch = eff.launch_overhead_s
    out: dict[str, Any] = {}
    for key in measured:
        parts = key.split(".")
        if parts[:2] != ["tbe", "forward"] or parts[-1] != "ms":
            continue
        dtype, case = parts[2], parts[3]
        name = f"{dtype}.{case}"
        if f"tbe.backward_adagrad.{name}.ms" not in measured:
            continue
        tables, bags = int(measured[f"tbe.{name}.tables"]), int(measured[f"tbe.{name}.bags"])
        dims = list(MODEL_A_DIM_QUANTILES) if case == "model_a" else [int(case[1:])] * tables
        size = DTYPE_BYTES[dtype]
        lookups = [int(measured[f"tbe.{name}.lookups"]) // tables] * tables
        uniques = measured[f"tbe.backward_adagrad.{name}.unique_rows_per_table"]
        fwd_model = launch + sum(embedding_forward_cost(spec, n, d * size, bags, d * size).time_s - launch
                                 for n, d in zip(lookups, dims))
        sort_model = radix_sort_cost(spec, sum(lookups), 64, 8, 8).time_s
        bwd_model = sort_model + launch + sum(embedding_update_cost(spec, n, u, d * size, d * size).time_s - launch
                                              for n, u, d in zip(lookups, uniques, dims))
        fwd_s = measured[key] * 1e-3
        sort_s = measured[f"tbe.sort.{name}.ms"] * 1e-3
        bwd_s = measured[f"tbe.backward_adagrad.{name}.ms"] * 1e-3
        gather, stream = (measured[f"tbe.forward.{name}.{k}_bytes"] for k in ("gather", "stream"))
        rows, grads = (measured[f"tbe.backward_adagrad.{name}.{k}_bytes"] for k in ("row", "grad"))
        out[f"tbe.forward.{name}"] = {
            "measured_ms": fwd_s * 1e3, "model_ms": fwd_model * 1e3, "measured_over_model": fwd_s / fwd_model,
            "fraction_of_hbm": (gather + stream) / fwd_s / peak,
            "implied_embedding_random": gather / peak / (fwd_s - launch - stream / (peak * eff.hbm_stream))}
        out[f"tbe.backward_adagrad.{name}"] = {
            "measured_ms": (sort_s + bwd_s) * 1e3, "model_ms": bwd_model * 1e3,
            "measured_over_model": (sort_s + bwd_s) / bwd_model,
            "fraction_of_hbm": (rows + grads) / bwd_s / peak,
            "implied_embedding_backward": rows / peak / (bwd_s - launch - grads / (peak * eff.hbm_stream)),
            "sort_measured_over_model": sort_s / sort_model}
    return out


def _cub_sort_points(measured: dict[str, Any]) -> list[tuple[int, int, int, float]]:
    """The record's ``cub_sort.*`` times: (key bits, value bytes, keys, seconds) per point (64-bit
    keys throughout: ``u64_i32`` has 32-bit values, ``u64_i64`` 64-bit ones)."""
    points = []
    for key, value in measured.items():
        parts = key.split(".")
        if parts[0] != "cub_sort" or parts[-1] != "ms" or len(parts) != 5:
            continue
        values = {"u64_i32": 4, "u64_i64": 8}.get(parts[1])
        if values is None or not parts[2].startswith("bits"):
            continue
        points.append((int(parts[2][4:]), values, int(parts[3]), float(value) * 1e-3))
    return sorted(points)


def fit_radix_sort(measured: dict[str, Any], hbm_gbytes_per_s: float) -> dict[str, float]:
    """``sim.gpu``'s radix-sort parameters that fit a record's CUB ``SortPairs`` times best (the
    derivation of ``GPUEfficiency.radix_sort``, ``radix_sort_fixed_s``, ``radix_sort_pass_s``):
    time = fixed + passes x pass + mechanism bytes (``sim.gpu.radix_sort_bytes``) / (HBM x
    fraction), least squares on relative errors over every point with 32-bit values (FBGEMM's
    sort; the 64-bit-value points are left to check the mechanism's bytes on). Returns the three
    and the largest relative error of the fit."""
    import numpy as np

    from neonic.sim.gpu import radix_sort_bytes, radix_sort_passes

    points = [p for p in _cub_sort_points(measured) if p[1] == 4]
    if len(points) < 3:
        raise ValueError("measured: expected cub_sort.u64_i32.bits*.*.ms points (at least 3)")
    hbm = hbm_gbytes_per_s * 1e9
    x = np.array([[1.0, radix_sort_passes(b), radix_sort_bytes(n, radix_sort_passes(b), 8, v) / hbm]
                  for b, v, n, _ in points])
    t = np.array([p[3] for p in points])
    coef = np.linalg.lstsq(x / t[:, None], np.ones(len(t)), rcond=None)[0]
    err = np.abs(x @ coef / t - 1.0)
    return {"radix_sort": float(1.0 / coef[2]), "radix_sort_fixed_s": float(coef[0]),
            "radix_sort_pass_s": float(coef[1]), "max_relative_error": float(err.max())}


def compare_sort(measured: dict[str, Any], preset: str) -> dict[str, Any]:
    """The record's sorts beside ``sim.gpu.radix_sort_cost`` for the preset: each CUB
    ``SortPairs`` point (``cub_sort.*``: 64-bit keys over their low bits, FBGEMM's) and each
    ``torch.sort`` of 64-bit keys (``sort_scaling.sort.i64.*``: all 64 bits, 64-bit positions),
    measured and model ms and measured / model (the parameters themselves: :func:`fit_radix_sort`)."""
    from neonic.sim.gpu import gpu_preset, radix_sort_cost

    spec = gpu_preset(preset)
    out: dict[str, Any] = {}
    for bits, values, n, t in _cub_sort_points(measured):
        model = radix_sort_cost(spec, n, bits, 8, values).time_s
        out[f"cub_sort.u64_i{8 * values}.bits{bits}.{n}"] = {"measured_ms": t * 1e3, "model_ms": model * 1e3,
                                                             "measured_over_model": t / model}
    for key, value in measured.items():
        parts = key.split(".")
        if parts[:3] == ["sort_scaling", "sort", "i64"] and parts[-1] == "ms":
            model = radix_sort_cost(spec, int(parts[3]), 64, 8, 8).time_s
            out[f"sort_scaling.sort.i64.{parts[3]}"] = {"measured_ms": value, "model_ms": model * 1e3,
                                                        "measured_over_model": value * 1e-3 / model}
    return out


def _dense_ms(d) -> float:
    """Forward + backward of a ``host.iteration.DenseCosts`` in ms (no optimizer step)."""
    return sum(c.time_s for c in (d.bot_fwd, d.inter_fwd, d.top_fwd, d.top_bwd, d.inter_bwd, d.bot_bwd)) * 1e3


def compare_dense(measured: dict[str, Any], preset: str) -> dict[str, Any]:
    """Model-A's dense part as ``host.iteration.dense_costs`` prices it for the preset, beside
    ``measure_dense``'s figures: per measured width and batch, the forward + backward the model
    predicts against the CUDA graph's time (the GPU's, no launch gaps) and against the GEMM
    kernels' time alone (the model prices GEMMs only), and the dense optimizer step against
    the fused Adam's."""
    from dataclasses import replace

    from neonic.host.iteration import dense_costs
    from neonic.host.workloads import preset as workload_preset
    from neonic.sim.gpu import gpu_preset

    spec = gpu_preset(preset)
    base = workload_preset("model-a")
    out: dict[str, Any] = {}
    for key in measured:
        parts = key.split(".")
        if parts[0] != "dense" or len(parts) != 4 or parts[-1] != "forward_backward_graph_ms":
            continue
        width, batch = int(parts[1][1:]), int(parts[2][1:])
        top = (width,) + tuple(base.dense.top_mlp[1:])
        workload = replace(base, batch_per_gpu=batch, dense=replace(base.dense, top_mlp=top))
        d = dense_costs(spec, workload, "fp16")
        model_ms = _dense_ms(d)
        # the GEMM-only figure: no elementwise kernels, and without the concatenation's copy
        cat_ms = sum(lc.forward.time_s + lc.backward.time_s for lc in d.layers if lc.layer.kind == "cat") * 1e3
        gemm_model_ms = _dense_ms(dense_costs(spec, workload, "fp16", elementwise=False)) - cat_ms
        graph = measured[key]
        gemm = measured[f"dense.{parts[1]}.{parts[2]}.gemm_kernels_ms"]
        out[f"dense.{parts[1]}.{parts[2]}"] = {
            "measured_ms": graph, "model_ms": model_ms, "measured_over_model": graph / model_ms,
            "gemm_kernels_ms": gemm, "gemm_model_ms": gemm_model_ms,
            "gemm_kernels_over_model": gemm / gemm_model_ms,
            "other_kernels_ms": measured[f"dense.{parts[1]}.{parts[2]}.other_kernels_ms"],
            "other_model_ms": model_ms - gemm_model_ms}
        if "dense.adam_fused_fp32_ms" in measured and "dense.adam" not in out:
            adam = measured["dense.adam_fused_fp32_ms"]
            out["dense.adam"] = {"measured_ms": adam, "model_ms": d.dense_opt.time_s * 1e3,
                                 "measured_over_model": adam / (d.dense_opt.time_s * 1e3)}
    return out


#: The measured pairs of ``measure_concurrent``, for :func:`compare_concurrency`: name, the
#: first kernel, the second kernel (launched 50 us later), and whether the second's stream has
#: the higher priority (the excl* copies are first and on the high-priority stream).
PAIRS: tuple[tuple[str, str, str, bool], ...] = (
    ("gemm32_then_copy", "gemm32", "copy", False),
    ("gemm32_then_copy_high", "gemm32", "copy", True),
    ("gemm_then_copy", "gemm", "copy", False),
    ("gemm_then_copy_high", "gemm", "copy", True),
    ("embedding_then_gemm", "embedding", "gemm", False),
    ("excl8_then_gemm", "excl8", "gemm", False),
    ("excl16_then_gemm", "excl16", "gemm", False),
    ("excl32_then_gemm", "excl32", "gemm", False),
    ("copy66_pair", "copy66", "copy66", False),
    ("gather66_copy66", "gather66", "copy66", False),
)
#: Each measured pair's end-time keys (first kernel, second kernel).
_ENDS = {"gemm32_then_copy": ("gemm_end_ms", "copy_end_ms"), "gemm_then_copy": ("gemm_end_ms", "copy_end_ms"),
         "embedding_then_gemm": ("embedding_end_ms", "gemm_end_ms"), "copy66_pair": ("first_end_ms", "second_end_ms"),
         "gather66_copy66": ("gather_end_ms", "copy_end_ms")}


def _pair_ends(name: str) -> tuple[str, str]:
    base = name.removesuffix("_high")
    if base.startswith("excl"):
        return "copy_end_ms", "gemm_end_ms"
    return _ENDS[base]


def _kernels(measured: dict[str, Any], spec, gemm_grid: str):
    """Each measured kernel as ``sim.interference`` sees it: ``(KernelCost, ctas)`` with its
    measured time alone (so that only the sharing law is compared), split into SM and HBM time:
    a kernel's HBM time is what its bytes take at the rate the same kind of kernel reaches on
    the whole GPU (a copy's at 132 CTAs, a gather's at 132 CTAs), its SM time its whole time
    when it is SM- or latency-bound (a GEMM; a copy or gather on fewer CTAs).
    ``gemm_grid``: ``"persistent"`` (one CTA per SM, as Hopper's cuBLAS kernels behave) or
    ``"tiles"`` (``sim.gpu.gemm_ctas``'s grid of output tiles)."""
    from neonic.sim.gpu import KernelCost, gemm_cost, gemm_tile

    c = "concurrent."
    ms = 1e-3
    size = int(round((measured[c + "gemm_flops"] / 2) ** (1 / 3)))
    g = gemm_cost(spec, size, size, size, "bf16")
    gemm_t = measured[c + "harness.gemm_alone_ms"] * ms
    out = {"gemm": (KernelCost(compute_s=gemm_t, memory_s=g.memory_s),
                    spec.num_sms if gemm_grid == "persistent" else gemm_tile(spec, size, size)[2])}
    if c + "harness.gemm32_alone_ms" in measured:
        # FP32 on the CUDA cores: a classic grid of 128 x 128 output tiles (ASSUMPTION)
        out["gemm32"] = (KernelCost(compute_s=measured[c + "harness.gemm32_alone_ms"] * ms,
                                    memory_s=3 * 8192 * 8192 * 4 / spec.hbm_bytes_per_s), (8192 // 128) ** 2)
    copy_t = measured[c + "harness.copy_alone_ms"] * ms
    out["copy"] = (KernelCost(memory_s=copy_t), None)                 # a grid of many waves
    out["embedding"] = (KernelCost(memory_s=measured[c + "embedding_alone_ms"] * ms), None)
    full_copy = measured.get(c + "copy132_harness_alone_ms", measured.get(c + "copy132_alone_ms")) * ms
    for n in (8, 16, 32):
        if f"{c}excl{n}_alone_ms" in measured:
            out[f"excl{n}"] = (KernelCost(compute_s=measured[f"{c}excl{n}_alone_ms"] * ms, memory_s=copy_t), n)
    out["copy66"] = (KernelCost(compute_s=measured[c + "copy66_alone_ms"] * ms, memory_s=full_copy), 66)
    if c + "gather66_alone_ms" in measured:
        out["gather66"] = (KernelCost(compute_s=measured[c + "gather66_alone_ms"] * ms,
                                      memory_s=measured[c + "gather132_alone_ms"] * ms), 66)
    return out


def compare_concurrency(measured: dict[str, Any], preset: str, interference: float = 0.0,
                        gemm_grid: str = "persistent") -> dict[str, Any]:
    """``sim.interference``'s end times for each measured pair of concurrent kernels (built from
    the kernels' measured times alone, see :func:`_kernels`) beside the measured ones, in ms
    from the first kernel's start; ``interference`` is the HBM capacity lost while kernels
    overlap (a system preset's ``streams.interference``)."""
    from neonic.sim.engine import Engine, ps_from_s, s_from_ps
    from neonic.sim.gpu import gpu_preset
    from neonic.sim.interference import GPUDevice

    spec = gpu_preset(preset)
    kernels = _kernels(measured, spec, gemm_grid)
    out: dict[str, Any] = {}
    for name, first, second, second_high in PAIRS:
        keys = _pair_ends(name)
        mkeys = [f"concurrent.{name}.{k}" for k in keys]
        if first not in kernels or second not in kernels or any(k not in measured for k in mkeys):
            continue
        engine = Engine()
        gpu = GPUDevice(engine, spec, interference=interference)
        ends: dict[int, float] = {}
        first_high = first.startswith("excl")

        def launch(which: str, slot: int, priority: int) -> None:
            cost, ctas = kernels[which]
            gpu.launch(cost, lambda _s, e, slot=slot: ends.__setitem__(slot, s_from_ps(e) * 1e3),
                       priority=priority, ctas=ctas)

        launch(first, 0, 1 if first_high else 0)
        engine.after(ps_from_s(50e-6), launch, second, 1, 1 if second_high else 0)
        engine.run()
        out[name] = {"measured_ms": [measured[k] for k in mkeys], "model_ms": [ends[0], ends[1]]}
    return out


def run(ctx) -> dict[str, Any]:
    figures = measure(quick=ctx.quick, progress=ctx.progress)
    preset = preset_for(str(figures["device"]))
    if preset is not None:
        figures["model"] = {"preset": preset, **compare(figures, preset)}
    return figures


def main(argv: list[str] | None = None) -> int:
    """Standalone entry for a GPU machine without neonic's dependencies."""
    argv = list(sys.argv[1:] if argv is None else argv)
    quick = "--quick" in argv
    picked = tuple(a.split("=", 1)[1] for a in argv if a.startswith("--sections="))
    sections = tuple(picked[0].split(",")) if picked else tuple(SECTIONS)
    unknown = [name for name in sections if name not in SECTIONS]
    if unknown:
        print(f"gpu.py: error: --sections: unknown {', '.join(unknown)}; expected some of {', '.join(SECTIONS)}",
              file=sys.stderr)
        return 2
    try:
        res = measure(quick=quick, progress=lambda m: print(m, file=sys.stderr, flush=True), sections=sections)
    except ValueError as error:
        print(f"gpu.py: error: {error}", file=sys.stderr)
        return 2
    for key, value in res.items():
        print(f"{key:60s} {value:.4g}" if isinstance(value, float) else f"{key:60s} {value}")
    if "--json" in argv:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
