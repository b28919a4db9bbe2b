"""The dense part of a DLRM as a list of layers, and its FLOPs per sample.

A DLRM's dense part is its bottom MLP (dense features -> a vector of width D), the feature
interaction (the bottom output and the T pooled embeddings) and the top MLP (the interaction's
output -> the prediction). This module lays it out layer by layer, in forward order, so that
costs can be given per layer (the gradient buckets of the data-parallel AllReduce are filled
layer by layer in the backward) and so that a workload's FLOPs per sample can be held to a
published figure (Neo's Table 3 gives MFLOP per sample for each model).

Interactions (the operators of the DLRM reference implementation, Naumov et al. 2019,
"Deep Learning Recommendation Model for Personalization and Recommendation Systems": Op is
Sum, Dot or Cat):

``dot``  pairwise dot products of the F = T + 1 feature vectors (DLRM's default). A dot
         product needs vectors of one width: features whose width differs from the bottom
         output D are first projected to D by a per-table linear map, the remedy of
         mixed-dimension embeddings (Ginart, Naumov, Mudigere, Yang, Zou, "Mixed Dimension
         Embeddings with Application to Memory-Efficient Recommendation Systems", ISIT 2021:
         smaller embeddings are projected up to a base dimension). The interaction is the
         batched GEMM Z Z^T over the F x D feature matrix (2 F^2 D FLOPs per sample, as DLRM
         computes it) and its output is the F(F-1)/2 distinct dots concatenated with the
         bottom output: F(F-1)/2 + D wide.
``cat``  concatenation of the bottom output and the pooled embeddings (DLRM's Cat): defined
         for unequal widths, no FLOPs, sum(dims) + D wide.
``dcn``  a low-rank cross network (DCN-v2, MLPerf DLRM-DCNv2) over the concatenation:
         ``dcn_layers`` layers x -> x0 * (U (V x)) + x of rank ``dcn_low_rank``.

API
    :class:`DenseLayer`; ``dense_layers(workload)`` (forward order); ``interaction_width(workload)``;
    ``dense_flops_per_sample(workload)`` -> dict of forward FLOPs per part (``bottom``,
    ``projection``, ``interaction``, ``top``, ``total``); ``dense_params(workload)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from neonic.host.workloads.spec import WorkloadSpec

__all__ = ["DenseLayer", "dense_layers", "interaction_width", "dense_flops_per_sample", "dense_params"]


@dataclass(frozen=True)
class DenseLayer:
    """One dense layer (or a group of identical per-table layers, ``count`` of them).

    ``kind``: ``linear`` (a fully connected layer fan_in -> fan_out with bias), ``dot`` (the
    pairwise-dot GEMM over ``features`` vectors of width ``fan_in``; no parameters), ``cat``
    (a concatenation; no FLOPs, no parameters), ``cross`` (one low-rank DCN layer of width
    ``fan_in`` and rank ``fan_out``). ``part``: ``bottom``, ``interaction`` or ``top``.
    """

    name: str
    part: str
    kind: str
    fan_in: int
    fan_out: int
    count: int = 1
    features: int = 0

    @property
    def params(self) -> int:
        if self.kind == "linear":
            return self.count * (self.fan_in * self.fan_out + self.fan_out)
        if self.kind == "cross":
            return self.count * (2 * self.fan_in * self.fan_out + self.fan_in)
        return 0

    @property
    def flops_per_sample(self) -> float:
        """Forward FLOPs per sample (a multiply-add counts 2)."""
        if self.kind == "linear":
            return 2.0 * self.count * self.fan_in * self.fan_out
        if self.kind == "dot":
            return 2.0 * self.features * self.features * self.fan_in
        if self.kind == "cross":
            return self.count * (4.0 * self.fan_in * self.fan_out + 2.0 * self.fan_in)
        return 0.0


def interaction_width(workload: "WorkloadSpec") -> int:
    """Width of the interaction's output (the top MLP's input)."""
    d = workload.dense
    d_out = d.bottom_mlp[-1]
    dims = sum(t.dim for t in workload.tables)
    if d.interaction == "dot":
        f = len(workload.tables) + 1
        return f * (f - 1) // 2 + d_out
    return dims + d_out


def dense_layers(workload: "WorkloadSpec") -> list[DenseLayer]:
    """Every dense layer of ``workload`` in forward order (see the module doc)."""
    d = workload.dense
    layers: list[DenseLayer] = []
    bottom = list(d.bottom_mlp)
    for i, (a, b) in enumerate(zip(bottom[:-1], bottom[1:])):
        layers.append(DenseLayer(f"bottom{i}", "bottom", "linear", a, b))
    d_out = bottom[-1]
    if d.interaction == "dot":
        # features of another width than D are projected to D (one linear map per table)
        by_dim: dict[int, int] = {}
        for t in workload.tables:
            if t.dim != d_out:
                by_dim[t.dim] = by_dim.get(t.dim, 0) + 1
        for dim, count in sorted(by_dim.items()):
            layers.append(DenseLayer(f"project{dim}", "interaction", "linear", dim, d_out, count=count))
        layers.append(DenseLayer("dot", "interaction", "dot", d_out, interaction_width(workload),
                                 features=len(workload.tables) + 1))
    elif d.interaction == "cat":
        layers.append(DenseLayer("cat", "interaction", "cat", interaction_width(workload), interaction_width(workload)))
    else:
        width = interaction_width(workload)
        for i in range(d.dcn_layers):
            layers.append(DenseLayer(f"cross{i}", "interaction", "cross", width, d.dcn_low_rank))
    top = [interaction_width(workload), *d.top_mlp]
    for i, (a, b) in enumerate(zip(top[:-1], top[1:])):
        layers.append(DenseLayer(f"top{i}", "top", "linear", a, b))
    return layers


def dense_flops_per_sample(workload: "WorkloadSpec") -> dict[str, float]:
    """Forward FLOPs per sample of the dense part, by part (``projection`` is the per-table
    projections of the dot interaction; ``interaction`` the dot or cross layers)."""
    out = {"bottom": 0.0, "projection": 0.0, "interaction": 0.0, "top": 0.0}
    for layer in dense_layers(workload):
        key = layer.part
        if layer.part == "interaction" and layer.kind == "linear":
            key = "projection"
        out[key] += layer.flops_per_sample
    out["total"] = sum(out.values())
    return out


def dense_params(workload: "WorkloadSpec") -> int:
    """Parameters of the dense part (data-parallel: all-reduced every iteration)."""
    return sum(layer.params for layer in dense_layers(workload))


@dataclass(frozen=True)
class LayerCost:
    """One dense layer's kernels on one GPU for one local batch: forward, backward (data and
    weight gradients) and its parameter count (what its gradient bucket carries)."""

    layer: DenseLayer
    forward: object
    backward: object

    @property
    def params(self) -> int:
        return self.layer.params


#: Bytes that the elementwise kernels around an MLP layer move, in units of the layer's output
#: (batch x fan_out elements): the activation forward reads its input and writes its output
#: (2); its gradient reads the output's gradient and the saved activation and writes the
#: input's gradient (3); the bias gradient, a column sum over the batch, reads the output's
#: gradient once (1). SOURCES for which kernels run: the DLRM reference implementation
#: (facebookresearch/dlrm, ``create_mlp``: every MLP layer is an ``nn.Linear`` with a bias,
#: followed by an activation, ReLU or the top's final sigmoid), and PyTorch's kernels as its
#: profiler lists them (``neonic bench gpu``'s dense section on an H200 and an H100,
#: sim/data/nvidia-h*.json ``dense.*``): the bias add is fused into cuBLAS's GEMM epilogue, and
#: the activation, its gradient and the bias gradient are one kernel each.
ACTIVATION_FWD_PASSES, ACTIVATION_BWD_PASSES, BIAS_GRAD_PASSES = 2, 3, 1


def layer_costs(gpu, workload: "WorkloadSpec", dtype: str = "fp16", elementwise: bool = True) -> list[LayerCost]:
    """Per-layer ``sim.gpu.KernelCost`` of the dense part (forward order) on ``gpu`` for one
    local batch in GEMM datatype ``dtype``. Linear layers: one GEMM forward, a weight-gradient
    GEMM and a data-gradient GEMM backward (none for the first bottom layer: nothing consumes
    the gradient of the dense input); the dot: ``sim.gpu.interaction_cost``; the concatenation:
    a streaming copy forward and backward; cross layers: two low-rank GEMMs each way.
    ``elementwise``: the MLP layers (bottom and top) also pay their activation, its gradient and
    their bias gradient, one streaming kernel each (:data:`ACTIVATION_FWD_PASSES`, ``sim.gpu.stream_cost``); ``False``
    prices their GEMMs alone (to set beside a GEMM-only measurement)."""
    from neonic.sim.gpu import DTYPE_BYTES, gemm_cost, interaction_cost, mlp_cost, stream_cost

    b = workload.batch_per_gpu
    out: list[LayerCost] = []
    first = True
    for layer in dense_layers(workload):
        if layer.kind == "linear":
            fwd = gemm_cost(gpu, b, layer.fan_out, layer.fan_in, dtype).scaled(layer.count)
            bwd = gemm_cost(gpu, layer.fan_in, layer.fan_out, b, dtype).scaled(layer.count)
            if not (first and layer.part == "bottom"):
                bwd = bwd + gemm_cost(gpu, b, layer.fan_in, layer.fan_out, dtype).scaled(layer.count)
            if elementwise and layer.part in ("bottom", "top"):
                out_bytes = float(b) * layer.fan_out * DTYPE_BYTES[dtype] * layer.count
                fwd = fwd + stream_cost(gpu, ACTIVATION_FWD_PASSES * out_bytes)
                bwd = bwd + stream_cost(gpu, ACTIVATION_BWD_PASSES * out_bytes) + stream_cost(gpu, BIAS_GRAD_PASSES * out_bytes)
        elif layer.kind == "dot":
            fwd = interaction_cost(gpu, b, layer.features, layer.fan_in, dtype)
            bwd = interaction_cost(gpu, b, layer.features, layer.fan_in, dtype, backward=True)
        elif layer.kind == "cat":
            nbytes = 2.0 * b * layer.fan_out * DTYPE_BYTES[dtype]  # read the pieces, write the whole
            fwd = bwd = stream_cost(gpu, nbytes)
        else:  # cross
            fwd = mlp_cost(gpu, b, [layer.fan_in, layer.fan_out, layer.fan_in], dtype)
            bwd = mlp_cost(gpu, b, [layer.fan_in, layer.fan_out, layer.fan_in], dtype, backward=True)
        first = first and layer.part != "bottom"
        out.append(LayerCost(layer, fwd, bwd))
    return out
