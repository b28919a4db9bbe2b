"""Data-parallel gradient buckets as PyTorch DDP forms them, for the op graph.

Neo trains its dense part data-parallel in PyTorch (REFERENCES.md). PyTorch's
DistributedDataParallel (DDP) packs gradients into buckets in the reverse order of the
parameters (about the order the backward produces them) and all-reduces a bucket as soon as
its last gradient is ready, on its own NCCL stream, so the AllReduce overlaps the rest of the
backward. Facts used (PyTorch ``torch.nn.parallel.DistributedDataParallel``):

* ``bucket_cap_mb`` = 25 by default, in MiB (``int(bucket_cap_mb * 1024 * 1024)`` bytes);
* the first bucket is capped at ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`` = 1 MiB, so
  that communication starts early in the backward;
* a bucket is closed once its size reaches the cap (a tensor is never split: a layer larger
  than the cap is a bucket of its own);
* gradients are bucketed in their parameter dtype (FP32 parameters: 4 bytes each); what goes
  on the wire depends on the communication hook (an FP16/BF16 compression hook halves it).

Scenarios set it in ``[dense]``: ``bucket_mib`` (25; 0 = one AllReduce after the backward),
``first_bucket_mib`` (1), ``optimizer`` (``after_last``, PyTorch's ``optimizer.step()`` after
``backward()``, or ``per_bucket``) and ``next_batch``:

* ``after_step`` (default): the next batch's first compute kernel waits for the optimizer step,
  as in PyTorch's training loop on one compute stream. DDP's backward does not finish until
  every bucket's AllReduce has (PyTorch's DDP design note, "Internal Design": "When all buckets
  are ready, the Reducer will block waiting for all allreduce operations to finish"; the wait
  makes the compute stream wait for the NCCL stream), ``optimizer.step()`` is issued after
  ``backward()``, and the next batch's forward, embedding lookups included, is issued after the
  step on the same stream (CUDA: a stream runs its operations in issue order). Neo's pipeline
  runs only the next batch's *input* AlltoAll ahead on its own stream (REFERENCES.md).
* ``when_ready``: each op of the next batch waits only for the data it reads (its own
  parameters' optimizer step; the embedding lookups for the embedding backward), as a runtime
  with the embedding work on its own stream could schedule it. Only Neo's pipelined training graph is bucketed; the
serialized baseline (``pipelined = false``) keeps one AllReduce in program order.

:func:`assign_buckets` applies those rules to a list of parameter counts; :func:`gradient_buckets`
turns a model's per-layer dense costs into the :class:`host.schedule.GradientBuckets` of one
iteration (backward split at bucket boundaries, one AllReduce payload and one optimizer step
per bucket).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from neonic.host.schedule import GradientBuckets

__all__ = ["BucketConfig", "NEXT_BATCH", "DDP_BUCKET_CAP_MIB", "DDP_FIRST_BUCKET_MIB", "assign_buckets", "gradient_buckets"]

#: When the next batch's compute may start (see the module docstring).
NEXT_BATCH = ("after_step", "when_ready")
#: PyTorch DDP's default ``bucket_cap_mb`` (MiB).
DDP_BUCKET_CAP_MIB = 25.0
#: PyTorch DDP's first-bucket cap, ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB).
DDP_FIRST_BUCKET_MIB = 1.0

_PHASE_OF = {"top": "top_bwd", "interaction": "inter_bwd", "bottom": "bot_bwd"}


@dataclass(frozen=True)
class BucketConfig:
    """How the dense gradients are all-reduced: ``bucket_mib`` (0: one AllReduce of every
    gradient after the backward, no bucketing), ``first_bucket_mib``, ``optimizer``
    (``after_last``: one optimizer step after the last bucket, as ``optimizer.step()`` after
    ``backward()``; ``per_bucket``: each bucket's parameters are stepped as soon as their
    AllReduce ends) and ``grad_bytes`` (bytes per gradient element in the bucket)."""

    bucket_mib: float = DDP_BUCKET_CAP_MIB
    first_bucket_mib: float = DDP_FIRST_BUCKET_MIB
    optimizer: str = "after_last"
    grad_bytes: int = 4
    next_batch: str = "after_step"

    def __post_init__(self) -> None:
        for name in ("bucket_mib", "first_bucket_mib"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"dense.{name}: expected a number >= 0, got {value!r}")
        if self.optimizer not in ("after_last", "per_bucket"):
            raise ValueError(f"dense.optimizer: expected 'after_last' or 'per_bucket', got {self.optimizer!r}")
        if self.next_batch not in NEXT_BATCH:
            raise ValueError(f"dense.next_batch: expected one of {', '.join(NEXT_BATCH)}, got {self.next_batch!r}")
        if self.grad_bytes not in (2, 4):
            raise ValueError(f"grad_bytes: expected 2 or 4, got {self.grad_bytes!r}")

    @property
    def bucketed(self) -> bool:
        return self.bucket_mib > 0


def assign_buckets(params_reverse: Sequence[int], cap_bytes: float, first_cap_bytes: float, grad_bytes: int = 4) -> list[list[int]]:
    """Bucket the tensors ``params_reverse`` (element counts, in the order their gradients are
    produced) as DDP does; returns each bucket's tensor indices. Tensors without elements are
    left out."""
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0.0
    for i, n in enumerate(params_reverse):
        if n <= 0:
            continue
        current.append(i)
        size += n * grad_bytes
        limit = first_cap_bytes if not buckets else cap_bytes
        if size >= limit:
            buckets.append(current)
            current, size = [], 0.0
    if current:
        buckets.append(current)
    return buckets


def gradient_buckets(
    layers: Sequence[Any],
    config: BucketConfig,
    make_allreduce: Callable[[float], Any],
    step_cost: Callable[[float], Any],
    tables_bytes: float = 0.0,
) -> GradientBuckets:
    """One iteration's :class:`GradientBuckets` from per-layer dense costs.

    ``layers``: ``host.workloads.dense.LayerCost`` in forward order; ``make_allreduce(params)``
    the AllReduce payload of a bucket of ``params`` elements (the caller knows the wire
    precision); ``step_cost(params)`` the optimizer step's cost for that many parameters;
    ``tables_bytes``: data-parallel embedding tables' gradient bytes (a last bucket, produced by
    the embedding backward; 0: none).
    """
    order = list(reversed(layers))
    params = [lc.params for lc in order]
    cap = config.bucket_mib * 2**20
    first = config.first_bucket_mib * 2**20 if config.first_bucket_mib > 0 else cap
    groups = assign_buckets(params, cap, first, config.grad_bytes)
    closes_at = {max(group): k for k, group in enumerate(groups)}
    segments: list[tuple[str, Any, int | None]] = []
    piece = None
    phase = None
    for i, lc in enumerate(order):
        ph = _PHASE_OF[lc.layer.part]
        if phase is not None and ph != phase and piece is not None:
            segments.append((phase, piece, None))
            piece = None
        phase = ph
        piece = lc.backward if piece is None else piece + lc.backward
        if i in closes_at:
            segments.append((phase, piece, closes_at[i]))
            piece = None
    if piece is not None:
        segments.append((phase, piece, None))
    bucket_params = [float(sum(params[i] for i in group)) for group in groups]
    parts = [frozenset(order[i].layer.part for i in group) for group in groups]
    payloads = [make_allreduce(p) for p in bucket_params]
    steps = bucket_params
    tables_bucket = None
    if tables_bytes > 0:
        tables_params = tables_bytes / config.grad_bytes
        tables_bucket = len(payloads)
        payloads.append(make_allreduce(tables_params))
        parts.append(frozenset({"tables"}))
        steps = [*steps, tables_params]
    if config.optimizer == "per_bucket":
        opt = tuple(step_cost(p) for p in steps)
    else:
        opt = (step_cost(sum(steps)),)
    return GradientBuckets(tuple(segments), tuple(payloads), tuple(parts), opt, config.optimizer, tables_bucket,
                           next_batch=config.next_batch)
