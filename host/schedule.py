"""Per-iteration op graphs of DLRM training and inference, Neo's pipeline, and their execution.

The graph says *what* runs, on which rank and stream, after what; it does not know what an op
costs. Each op carries an opaque ``payload`` (a ``KernelCost``, a collective's size matrix, a
CPU or NIC job...) that the cluster's backend turns into work on the engine's resources
(``host/cluster.py``). This keeps the dependencies testable with simple fixed-duration backends.

Training, per iteration ``i`` and rank (phases, in program order)::

    h2d            input    the batch's dense features and sparse indices to the GPU
    input_a2a      input    AlltoAll of sparse indices to the embedding owners      (collective)
    emb_fwd        emb*     fused embedding lookup + pooling (GPU, or CPU socket / NIC)
    pooled_rs      comm     reduce-scatter of table-row-wise partial pools inside each node (collective)
    pooled_a2a     comm     AlltoAll of pooled embeddings back to the data-parallel ranks
    pooled_h2d     copy     (Zion) pooled embeddings from host memory to the GPU
    bot_fwd        compute  bottom MLP forward
    inter_fwd      compute  feature interaction forward          (needs bot_fwd and pooled_a2a)
    top_fwd        compute  top MLP forward
    top_bwd        compute  top MLP backward
    inter_bwd      compute  interaction backward
    grad_d2h       copy     (Zion) pooled-embedding gradients to host memory
    grad_a2a       comm     AlltoAll of pooled-embedding gradients to the owners    (collective)
    grad_ag        comm     all-gather of table-row-wise gradients inside each node  (collective)
    bot_bwd        compute  bottom MLP backward
    allreduce      comm     AllReduce of the dense gradients                        (collective)
    emb_bwd        emb*     embedding backward fused with the row-wise sparse optimizer
    dense_opt      compute  dense optimizer step (needs the AllReduce)

Neo's pipeline (``pipelined=True``): batch i+1's input AlltoAll runs on its own stream as soon
as batch i's embedding forward has consumed its inputs, so it overlaps batch i's MLPs; the
pooled AlltoAll (comm stream) overlaps the bottom MLP; the gradient AlltoAll overlaps the
bottom MLP backward and the AllReduce overlaps the embedding backward. The baseline
(``pipelined=False``) runs every op of a rank in program order on one stream, so nothing
overlaps. Inference is the forward part (h2d .. top_fwd); pipelined, batch i+1's input
AlltoAll and embedding lookup overlap batch i's MLPs.

Table-row-wise partial pools are reduced inside the node before the reduced pools can leave it
(``pooled_rs`` precedes ``pooled_a2a``); backward, the gradients arrive first and are then
all-gathered to the node's shards (``grad_ag`` follows ``grad_a2a``). Row-wise partials over
all ranks go straight to the samples' owners inside the AlltoAlls.

Streams marked * are ``compute`` when the embedding runs on the GPU; the system decides
(``emb_stream``): ``cpu`` on Zion, ``nic`` on the SmartNIC system.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from neonic.sim.engine import Engine

__all__ = [
    "TRAINING_PHASES",
    "INFERENCE_PHASES",
    "COLLECTIVE_PHASES",
    "COMPUTE_STREAMS",
    "Op",
    "OpGraph",
    "build_graph",
    "ScheduleRunner",
    "PhaseBreakdown",
    "phase_breakdown",
]

TRAINING_PHASES: tuple[str, ...] = (
    "h2d", "input_a2a", "emb_fwd", "pooled_rs", "pooled_a2a", "pooled_h2d", "bot_fwd", "inter_fwd", "top_fwd",
    "top_bwd", "inter_bwd", "grad_d2h", "grad_a2a", "grad_ag", "bot_bwd", "allreduce", "emb_bwd", "dense_opt",
)
INFERENCE_PHASES: tuple[str, ...] = ("h2d", "input_a2a", "emb_fwd", "pooled_rs", "pooled_a2a", "pooled_h2d", "bot_fwd",
                                     "inter_fwd", "top_fwd")
COLLECTIVE_PHASES = frozenset({"input_a2a", "pooled_rs", "pooled_a2a", "grad_a2a", "grad_ag", "allreduce"})
#: Streams whose ops count as computation when attributing exposed time.
COMPUTE_STREAMS = frozenset({"compute", "emb", "cpu", "nic", "main", "opt"})
_COPY_PHASES = frozenset({"h2d", "pooled_h2d", "grad_d2h"})
_EMB_PHASES = frozenset({"emb_fwd", "emb_bwd"})


class OpLinks(dict):
    """An op's deps or dependents: a list in insertion order (iteration, ``len``, ``append``,
    ``remove``) whose membership test and removal are O(1), so that a collective over thousands
    of ranks collects its thousands of per-rank deps in linear time. Removing and re-adding keeps
    the order a list's ``remove`` and ``append`` would give."""

    __slots__ = ()

    def append(self, op: "Op") -> None:
        self[op] = None

    def remove(self, op: "Op") -> None:
        del self[op]

    def __repr__(self) -> str:
        return repr(list(self))


@dataclass(eq=False, slots=True)
class Op:
    """One op of the graph. A collective op spans ``ranks``; every other op has one rank.
    (Slotted: a run at 4096 GPUs has some 300k of them.)"""

    id: int
    phase: str
    iteration: int
    ranks: tuple[int, ...]
    stream: str
    payload: Any = None
    deps: OpLinks = field(default_factory=OpLinks)
    dependents: OpLinks = field(default_factory=OpLinks)
    start: int | None = None
    end: int | None = None
    _waiting: int = 0

    @property
    def collective(self) -> bool:
        return self.phase in COLLECTIVE_PHASES

    @property
    def rank(self) -> int:
        return self.ranks[0]

    def depends_on(self, other: "Op") -> None:
        if other is self:
            raise ValueError(f"op {self.phase}[{self.iteration}]: cannot depend on itself")
        if other not in self.deps:
            self.deps.append(other)
            other.dependents.append(self)

    def __repr__(self) -> str:
        where = "all" if len(self.ranks) > 1 else str(self.rank)
        return f"Op({self.phase}[{self.iteration}]@{where}/{self.stream})"


@dataclass
class OpGraph:
    """All ops of a run, by (phase, iteration, rank) and in creation order."""

    ops: list[Op] = field(default_factory=list)
    num_ranks: int = 0
    iterations: int = 0
    mode: str = "training"
    pipelined: bool = True
    _index: dict[tuple[str, int, int], Op] = field(default_factory=dict)

    def add(self, phase: str, iteration: int, ranks: Sequence[int], stream: str, payload: Any) -> Op:
        op = Op(len(self.ops), phase, iteration, tuple(ranks), stream, payload)
        self.ops.append(op)
        for r in op.ranks:
            self._index[(phase, iteration, r)] = op
        return op

    def get(self, phase: str, iteration: int, rank: int) -> Op | None:
        return self._index.get((phase, iteration, rank))

    def of_rank(self, rank: int) -> list[Op]:
        """The ops ``rank`` takes part in, in creation order."""
        return [op for op in self.ops if rank in op.ranks]


PayloadFn = Callable[[str, int, int], Any]


#: The phases of a batch's prefetch (Neo's pipeline runs them one batch ahead).
PREFETCH_PHASES = ("h2d", "input_a2a")


def build_graph(
    num_ranks: int,
    iterations: int,
    payloads: Mapping[str, Any] | PayloadFn,
    mode: str = "training",
    pipelined: bool = True,
    emb_stream: str = "compute",
    phases: Iterable[str] | None = None,
) -> OpGraph:
    """Build the op graph of ``iterations`` batches on ``num_ranks`` ranks (pipelined: and the
    prefetch of the batch after them, :data:`PREFETCH_PHASES` labelled iteration ``iterations``).

    ``payloads`` gives each op's payload: a mapping ``phase -> payload`` (collectives: one
    payload; other phases: a payload or a per-rank sequence), or a function
    ``(phase, iteration, rank) -> payload`` (rank -1 for collectives). A phase is present when
    it is listed in ``phases`` (default: every phase of the mode that has a payload; a payload of
    ``None`` leaves the phase out). ``emb_stream`` is where embedding ops run: ``compute``
    (GPU), ``cpu`` (CPU sockets), ``nic`` (the SmartNIC).
    """
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, int) or num_ranks < 1:
        raise ValueError(f"num_ranks: expected an integer >= 1, got {num_ranks!r}")
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"iterations: expected an integer >= 1, got {iterations!r}")
    if mode not in ("training", "inference"):
        raise ValueError(f"mode: expected 'training' or 'inference', got {mode!r}")
    if emb_stream not in ("compute", "cpu", "nic"):
        raise ValueError(f"emb_stream: expected 'compute', 'cpu' or 'nic', got {emb_stream!r}")
    order = TRAINING_PHASES if mode == "training" else INFERENCE_PHASES

    if callable(payloads):
        get_payload: PayloadFn = payloads
        present = set(phases) if phases is not None else set(order)

        def rank_payloads(phase: str, iteration: int) -> Callable[[int], Any]:
            return lambda rank: get_payload(phase, iteration, rank)
    else:
        table = dict(payloads)
        for phase in table:
            if phase not in order:
                raise ValueError(f"payloads.{phase}: not a {mode} phase; expected one of {', '.join(order)}")

        def get_payload(phase: str, iteration: int, rank: int) -> Any:
            value = table.get(phase)
            if rank >= 0 and isinstance(value, (list, tuple)):
                if len(value) != num_ranks:
                    raise ValueError(f"payloads.{phase}: expected {num_ranks} per-rank payloads, got {len(value)}")
                return value[rank]
            return value

        def rank_payloads(phase: str, iteration: int) -> Callable[[int], Any]:
            value = table.get(phase)
            if isinstance(value, (list, tuple)):
                if len(value) != num_ranks:
                    raise ValueError(f"payloads.{phase}: expected {num_ranks} per-rank payloads, got {len(value)}")
                return value.__getitem__
            return lambda rank: value

        present = set(phases) if phases is not None else {p for p in order if table.get(p) is not None}
    for phase in present:
        if phase not in order:
            raise ValueError(f"phases: {phase!r} is not a {mode} phase")
    active = [p for p in order if p in present]

    def stream_of(phase: str) -> str:
        if not pipelined:
            return "main"
        if phase in ("input_a2a", "h2d"):
            return "input"
        if phase in COLLECTIVE_PHASES:
            return "comm"
        if phase in _COPY_PHASES:
            return "copy"
        if phase in _EMB_PHASES:
            if emb_stream != "compute":
                return emb_stream
            return "emb" if mode == "inference" else "compute"
        return "compute"

    graph = OpGraph(num_ranks=num_ranks, iterations=iterations, mode=mode, pipelined=pipelined)
    all_ranks = range(num_ranks)
    every = tuple(all_ranks)
    ops, index = graph.ops, graph._index
    # per stream, each rank's last op on it
    last_on_stream: dict[str, list[Op | None]] = {}
    # per batch, each phase's op on each rank (a collective: the same op on every rank)
    batches: list[dict[str, list[Op]]] = []

    def add_batch(it: int, phases: Iterable[str], payload_it: int) -> None:
        """Batch ``it``'s ops of ``phases`` (payloads of batch ``payload_it``), each after the
        last op of its stream, then their data dependencies."""
        made: dict[str, list[Op]] = {}
        for phase in phases:
            stream = stream_of(phase)
            last = last_on_stream.setdefault(stream, [None] * num_ranks)
            if phase in COLLECTIVE_PHASES:
                op = graph.add(phase, it, every, stream, get_payload(phase, payload_it, -1))
                for r in all_ranks:
                    prev = last[r]
                    if prev is not None:
                        _link(op, prev)
                    last[r] = op
                made[phase] = [op] * num_ranks
                continue
            per_rank = rank_payloads(phase, payload_it)
            row = []
            for r in all_ranks:
                op = Op(len(ops), phase, it, (r,), stream, per_rank(r))
                ops.append(op)
                index[(phase, it, r)] = op
                prev = last[r]
                if prev is not None:
                    _link(op, prev)
                last[r] = op
                row.append(op)
            made[phase] = row
        batches.append(made)
        _wire_batch(made, batches[it - 1] if it > 0 else None, num_ranks, mode, pipelined)

    for it in range(iterations):
        add_batch(it, active, it)
    if pipelined:
        # the prefetch of the batch after the last (its input copy and index AlltoAll, labelled
        # iteration ``iterations``, part of no iteration's time): without it the last batch would
        # run alone, faster than in the steady state the measured window stands for, and every
        # batch but the last would wait for its successor's prefetch (an input-bound pipeline
        # then measured its tail only)
        add_batch(iterations, [p for p in active if p in PREFETCH_PHASES], iterations - 1)
    return graph


def _link(op: Op, dep: Op) -> None:
    """``op.depends_on(dep)`` for the graph's builders (``dep`` is not ``op``)."""
    deps = op.deps
    if dep not in deps:
        deps[dep] = None
        dep.dependents[op] = None


#: A batch's data dependencies, in the order they are wired: (phase, the phases it reads).
_DATA_DEPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("input_a2a", ("h2d",)),
    ("emb_fwd", ("input_a2a",)),
    ("pooled_rs", ("emb_fwd",)),
    ("pooled_a2a", ("emb_fwd", "pooled_rs")),
    ("pooled_h2d", ("pooled_a2a",)),
    ("bot_fwd", ("h2d",)),
    ("inter_fwd", ("bot_fwd", "pooled_a2a", "pooled_h2d")),
    ("top_fwd", ("inter_fwd",)),
    ("top_bwd", ("top_fwd",)),
    ("inter_bwd", ("top_bwd",)),
    ("grad_d2h", ("inter_bwd",)),
    ("grad_a2a", ("inter_bwd", "grad_d2h")),
    ("bot_bwd", ("inter_bwd",)),
    ("allreduce", ("bot_bwd", "top_bwd")),
    ("grad_ag", ("grad_a2a",)),
    ("emb_bwd", ("grad_a2a", "grad_ag", "emb_fwd")),
    ("dense_opt", ("allreduce",)),
)


def _first_of(batch: Mapping[str, list[Op]], *phases: str) -> list[Op] | None:
    for p in phases:
        if p in batch:
            return batch[p]
    return None


def _wire_batch(cur: Mapping[str, list[Op]], prev: Mapping[str, list[Op]] | None, num_ranks: int, mode: str,
                pipelined: bool) -> None:
    """A batch's dependencies, rank by rank: its data dependencies (:data:`_DATA_DEPS`), then
    those on the batch before (``prev``; None for the first). ``cur`` and ``prev`` give each
    phase's op on each rank. Rank by rank, so that a collective's deps and dependents are in
    rank order."""
    rules = []
    for phase, inputs in _DATA_DEPS:
        if phase in cur:
            reads = [cur[name] for name in inputs if name in cur]
            if reads:
                rules.append((cur[phase], reads))
    later: list[tuple[list[Op], list[Op]]] = []  # (ops, each one's dependency), one per rank
    if prev is not None:
        if "input_a2a" in cur and pipelined and "emb_fwd" in prev:
            # prefetch depth one: batch i's indices land once batch i-1's lookup consumed its own
            later.append((cur["input_a2a"], prev["emb_fwd"]))
        if mode == "training":
            # synchronous training: batch i reads the tables and weights batch i-1 updated
            if "emb_fwd" in cur and "emb_bwd" in prev:
                later.append((cur["emb_fwd"], prev["emb_bwd"]))
            step = _first_of(prev, "dense_opt", "allreduce", "bot_bwd")
            if "bot_fwd" in cur and step is not None:
                later.append((cur["bot_fwd"], step))
        ahead = _first_of(prev, "input_a2a", "emb_fwd")
        if "h2d" in cur and pipelined and ahead is not None:
            # one batch of staging buffers ahead
            later.append((cur["h2d"], ahead))
    for r in range(num_ranks):
        for ops, reads in rules:
            op = ops[r]
            for row in reads:
                dep = row[r]
                if dep is not op:
                    _link(op, dep)
        for ops, deps in later:
            _link(ops[r], deps[r])


def _is_compute(op: Op) -> bool:
    return op.stream in COMPUTE_STREAMS and not op.collective and op.phase not in _COPY_PHASES


Backend = Callable[[Op, Callable[[int, int], None]], None]


class ScheduleRunner:
    """Executes an :class:`OpGraph` on an engine: an op starts when all its deps have ended.

    ``backend(op, done)`` starts the op's work on the engine's resources and must eventually
    call ``done(start_ps, end_ps)``. A collective starts once it is ready on every rank.
    """

    def __init__(self, engine: Engine, graph: OpGraph, backend: Backend, on_op_done: Callable[[Op], None] | None = None) -> None:
        self.engine = engine
        self.graph = graph
        self.backend = backend
        self.on_op_done = on_op_done
        self.done_count = 0

    def start(self) -> None:
        """Release every op without dependencies (at ``engine.now``)."""
        for op in self.graph.ops:
            op._waiting = len(op.deps)
            op.start = op.end = None
        for op in self.graph.ops:
            if op._waiting == 0:
                self.engine.after(0, self._launch, op)

    def run(self, until_ps: int | None = None) -> int:
        self.start()
        end = self.engine.run(until_ps)
        self.check_complete()
        return end

    def check_complete(self) -> None:
        left = [op for op in self.graph.ops if op.end is None]
        if left:
            raise RuntimeError(f"schedule stalled: {len(left)} ops never ran, first {left[0]!r} waiting on "
                               f"{[d for d in left[0].deps if d.end is None]!r}")

    def _launch(self, op: Op) -> None:
        op.start = self.engine.now
        self.backend(op, lambda start, end, op=op: self._finish(op, end))

    def _finish(self, op: Op, end: int) -> None:
        op.end = self.engine.now if end is None else end
        self.done_count += 1
        if self.on_op_done is not None:
            self.on_op_done(op)
        for child in op.dependents:
            child._waiting -= 1
            if child._waiting == 0:
                self._launch(child)


@dataclass
class PhaseBreakdown:
    """Per-phase time, averaged over the ranks and iterations measured (seconds).

    ``serialized``: the ops' own durations (start to end), what the phase would add if nothing
    overlapped. ``exposed``: the share of wall time attributed to the phase: at each instant the
    time goes to the active computation ops (split evenly), or, if none runs, to the active
    communication/copy ops, or to ``idle``. Exposed times (plus idle) sum to the iteration time.
    """

    serialized: dict[str, float]
    exposed: dict[str, float]
    idle: float
    window_s: float


def phase_breakdown(graph: OpGraph, ranks: Sequence[int], iterations: Sequence[int], ps_per_unit: float = 1e12) -> PhaseBreakdown:
    """Serialized vs exposed time per phase on ``ranks`` over ``iterations`` (a contiguous
    range of completed iterations; the window runs from the end of the iteration before the
    first to the end of the last)."""
    if not ranks or not iterations:
        raise ValueError("ranks, iterations: expected non-empty sequences")
    its = set(iterations)
    serialized: dict[str, float] = {}
    exposed: dict[str, float] = {}
    idle_total = 0.0
    window_total = 0.0
    rank_set = set(ranks)
    per_rank: dict[int, list[Op]] = {r: [] for r in ranks}
    for op in graph.ops:
        if op.end is None or op.start is None:
            raise ValueError(f"phase_breakdown: {op!r} has not run")
        if len(op.ranks) == 1:
            if op.ranks[0] in rank_set:
                per_rank[op.ranks[0]].append(op)
        else:
            for r in ranks:
                per_rank[r].append(op)
    first, last = min(its), max(its)
    for r in ranks:
        ops = per_rank[r]
        end_of = {}
        for op in ops:
            end_of[op.iteration] = max(end_of.get(op.iteration, 0), op.end)
        lo = end_of.get(first - 1, min(op.start for op in ops if op.iteration == first))
        hi = end_of[last]
        window_total += hi - lo
        for op in ops:
            if op.iteration in its:
                serialized[op.phase] = serialized.get(op.phase, 0.0) + (op.end - op.start)
        # sweep over the window
        points: list[tuple[int, int, Op]] = []
        for op in ops:
            s, e = max(op.start, lo), min(op.end, hi)
            if e > s:
                points.append((s, 1, op))
                points.append((e, -1, op))
        points.sort(key=lambda p: (p[0], p[1]))
        active_c: list[Op] = []
        active_o: list[Op] = []
        t = lo
        for time, kind, op in points:
            if time > t:
                dt = time - t
                if active_c:
                    share = dt / len(active_c)
                    for a in active_c:
                        exposed[a.phase] = exposed.get(a.phase, 0.0) + share
                elif active_o:
                    share = dt / len(active_o)
                    for a in active_o:
                        exposed[a.phase] = exposed.get(a.phase, 0.0) + share
                else:
                    idle_total += dt
                t = time
            target = active_c if _is_compute(op) else active_o
            if kind == 1:
                target.append(op)
            else:
                target.remove(op)
        if hi > t:
            idle_total += hi - t
    scale = 1.0 / (len(ranks) * len(its) * ps_per_unit)
    return PhaseBreakdown(
        serialized={k: v * scale for k, v in serialized.items()},
        exposed={k: v * scale for k, v in exposed.items()},
        idle=idle_total * scale,
        window_s=window_total * scale,
    )


# ------------------------------------------------------------------- gradient buckets (DDP)
@dataclass(frozen=True)
class GradientBuckets:
    """The data-parallel gradient AllReduce as PyTorch DDP runs it, for one iteration.

    ``segments``: the backward in the order it runs, as ``(phase, payload, closes)`` pieces:
    ``phase`` is ``top_bwd``, ``inter_bwd`` or ``bot_bwd`` (the ops it splits), ``payload`` the
    piece's work (the layers between two bucket boundaries) and ``closes`` the index of the
    bucket whose last gradient the piece produces (or None). ``buckets``: one AllReduce
    payload per bucket, in launch order; ``parts``: the dense parts (``bottom``,
    ``interaction``, ``top``, or ``tables`` for the data-parallel embedding tables) whose
    parameters each bucket holds. ``tables_bucket``: index of a bucket closed by the embedding
    backward (data-parallel tables' gradients), or None. ``optimizer``: ``per_bucket`` (the
    dense optimizer steps a bucket's parameters as soon as its AllReduce ends) or
    ``after_last`` (one step after the last bucket, as ``optimizer.step()`` after the backward);
    ``opt_payloads``: one per bucket (per_bucket) or a single one (after_last).
    ``next_batch``: ``after_step`` (the next batch's first compute op waits for the last
    optimizer step: PyTorch's program order, ``host.gradients``) or ``when_ready`` (only for the
    steps of the parameters each op reads).
    """

    segments: tuple[tuple[str, Any, int | None], ...]
    buckets: tuple[Any, ...]
    parts: tuple[frozenset[str], ...]
    opt_payloads: tuple[Any, ...]
    optimizer: str = "per_bucket"
    tables_bucket: int | None = None
    next_batch: str = "after_step"

    def __post_init__(self) -> None:
        if self.optimizer not in ("per_bucket", "after_last"):
            raise ValueError(f"optimizer: expected 'per_bucket' or 'after_last', got {self.optimizer!r}")
        if self.next_batch not in ("after_step", "when_ready"):
            raise ValueError(f"next_batch: expected 'after_step' or 'when_ready', got {self.next_batch!r}")
        if not self.buckets:
            raise ValueError("buckets: expected at least one gradient bucket")
        if len(self.parts) != len(self.buckets):
            raise ValueError(f"parts: expected one per bucket ({len(self.buckets)}), got {len(self.parts)}")
        want = len(self.buckets) if self.optimizer == "per_bucket" else 1
        if len(self.opt_payloads) != want:
            raise ValueError(f"opt_payloads: expected {want} for optimizer {self.optimizer!r}, got {len(self.opt_payloads)}")
        closed = [c for _, _, c in self.segments if c is not None]
        if self.tables_bucket is not None:
            closed.append(self.tables_bucket)
        if sorted(closed) != list(range(len(self.buckets))):
            raise ValueError("segments/tables_bucket: every bucket must be closed exactly once")
        for phase, _, _ in self.segments:
            if phase not in _BWD_PHASES:
                raise ValueError(f"segments: phase {phase!r} is not one of {', '.join(_BWD_PHASES)}")


_BWD_PHASES = ("top_bwd", "inter_bwd", "bot_bwd")
#: Stream of the bucketed gradient AllReduce (DDP runs it on its own NCCL stream) and of the
#: dense optimizer steps (a side stream, so the next batch's embedding work never waits on it).
GRAD_STREAM = "grad"
OPT_STREAM = "opt"


def _split_op(graph: OpGraph, op: Op, payloads: Sequence[Any]) -> list[Op]:
    """Split ``op`` into ``len(payloads)`` ops run one after the other on its stream: the
    first keeps its deps, the last takes over its dependents."""
    op.payload = payloads[0]
    if len(payloads) == 1:
        return [op]
    children = list(op.dependents)
    ops, phase, it, ranks, stream = graph.ops, op.phase, op.iteration, op.ranks, op.stream
    pieces = [op]
    for payload in payloads[1:]:
        new = Op(len(ops), phase, it, ranks, stream, payload)
        ops.append(new)
        _link(new, pieces[-1])
        pieces.append(new)
    last = pieces[-1]
    dependents = op.dependents
    for child in children:
        del child.deps[op]
        del dependents[child]
        _link(child, last)
    index = graph._index
    for r in ranks:
        index[(phase, it, r)] = last
    return pieces


def _detach(op: Op) -> None:
    """Remove ``op`` from the graph's dependency lists (it will not run)."""
    for dep in op.deps:
        dep.dependents.remove(op)
    for child in op.dependents:
        child.deps.remove(op)
    op.deps.clear()
    op.dependents.clear()


def bucket_gradients(graph: OpGraph, spec: GradientBuckets) -> OpGraph:
    """Replace each iteration's single ``allreduce`` (and ``dense_opt``) of a pipelined training
    graph with DDP's gradient buckets (see :class:`GradientBuckets`).

    Per iteration: the backward ops are split at bucket boundaries; bucket k's AllReduce (a
    collective on its own stream, :data:`GRAD_STREAM`, in launch order) starts as soon as the
    piece that produces its last gradient ends, so it overlaps the rest of the backward; the
    dense optimizer runs on :data:`OPT_STREAM` per bucket or after the last bucket. The next
    iteration needs only what it reads: its bottom MLP forward waits for the steps of the
    buckets holding bottom-MLP parameters, its interaction and top MLP forward for theirs, and
    its embedding forward for the embedding backward alone (no longer for the AllReduce or the
    dense optimizer). Returns ``graph`` (changed in place).
    """
    if graph.mode != "training" or not graph.pipelined:
        raise ValueError("bucket_gradients: expected a pipelined training graph")
    world = tuple(range(graph.num_ranks))
    removed: set[int] = set()
    get = graph._index.get
    ops = graph.ops
    # the backward's pieces, phase by phase: (phase, their payloads, the bucket each closes)
    by_phase: dict[str, list[tuple[Any, int | None]]] = {}
    for phase, payload, closes in spec.segments:
        by_phase.setdefault(phase, []).append((payload, closes))
    splits = [(phase, [p for p, _ in pieces], [c for _, c in pieces]) for phase, pieces in by_phase.items()]
    # the parts each next-batch forward op reads, and the buckets holding them
    reads = [(phase, [k for k, bparts in enumerate(spec.parts) if bparts & parts])
             for phase, parts in (("bot_fwd", {"bottom"}), ("inter_fwd", {"interaction"}), ("top_fwd", {"top"}),
                                  ("emb_fwd", {"tables"}))]
    for it in range(graph.iterations):
        ar_old = get(("allreduce", it, 0))
        opt_old = [get(("dense_opt", it, r)) for r in world]
        bucket_ops: list[Op] = []
        closers: dict[int, list[Op]] = {}
        for r in world:
            for phase, payloads, closes in splits:
                op = get((phase, it, r))
                if op is None:
                    raise ValueError(f"bucket_gradients: the graph has no {phase} op")
                for piece, k in zip(_split_op(graph, op, payloads), closes):
                    if k is not None:
                        closers.setdefault(k, []).append(piece)
            if spec.tables_bucket is not None:
                emb = get(("emb_bwd", it, r))
                if emb is None:
                    raise ValueError("bucket_gradients: data-parallel tables need an emb_bwd op")
                closers.setdefault(spec.tables_bucket, []).append(emb)
        # the buckets' AllReduces, in launch order on their own stream
        for k, payload in enumerate(spec.buckets):
            op = graph.add("allreduce", it, world, GRAD_STREAM, payload)
            for producer in closers[k]:
                _link(op, producer)
            if bucket_ops:
                _link(op, bucket_ops[-1])
            elif it > 0:
                prev_last = get(("allreduce", it - 1, 0))
                if prev_last is not None:
                    _link(op, prev_last)
            bucket_ops.append(op)
        # the dense optimizer
        step_ops: list[list[Op]] = []
        for r in world:
            prev_step = None if it == 0 else get(("dense_opt", it - 1, r))
            steps: list[Op] = []
            if spec.optimizer == "per_bucket":
                for k, bop in enumerate(bucket_ops):
                    s = Op(len(ops), "dense_opt", it, (r,), OPT_STREAM, spec.opt_payloads[k])
                    ops.append(s)
                    _link(s, bop)
                    if steps:
                        _link(s, steps[-1])
                    elif prev_step is not None:
                        _link(s, prev_step)
                    steps.append(s)
            else:
                s = Op(len(ops), "dense_opt", it, (r,), OPT_STREAM, spec.opt_payloads[0])
                ops.append(s)
                _link(s, bucket_ops[-1])
                if prev_step is not None:
                    _link(s, prev_step)
                steps = [s] * len(bucket_ops)
            graph._index[("dense_opt", it, r)] = s
            step_ops.append(steps)
        # retire the single AllReduce and the old optimizer op; the next iteration's forward
        # waits for exactly the steps of the parameters it reads
        for old in [ar_old, *opt_old]:
            if old is None:
                continue
            _detach(old)
            removed.add(old.id)
        if it + 1 < graph.iterations:
            for r in world:
                steps = step_ops[r]
                for phase, buckets in reads:
                    nxt = get((phase, it + 1, r))
                    if nxt is None:
                        continue
                    for k in buckets:
                        _link(nxt, steps[k])
                # the compute stream's program order: the next batch's first compute op came
                # after the old optimizer step; it now follows the embedding backward
                emb_bwd = get(("emb_bwd", it, r))
                first = get(("emb_fwd", it + 1, r)) or get(("bot_fwd", it + 1, r))
                if emb_bwd is not None and first is not None and emb_bwd.stream == first.stream:
                    _link(first, emb_bwd)
                if spec.next_batch == "after_step" and first is not None:
                    # PyTorch's loop on one compute stream: the next batch is issued after the
                    # step, which follows DDP's wait for every bucket (host.gradients)
                    _link(first, steps[-1])
    graph.ops = [op for op in graph.ops if op.id not in removed]
    for i, op in enumerate(graph.ops):
        op.id = i
    return graph
