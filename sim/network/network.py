"""Flow-level network simulation on the shared discrete-event engine.

A message (a *flow*) is a fluid of ``nbytes`` payload bytes along a fixed route. Concurrent flows
share every link max-min fairly (:mod:`sim.network.maxmin`); rates are recomputed when the set
of active flows changes. A flow finishes transmitting when its bytes are drained and *arrives*
one route latency later (latency is added once per message, not per packet).

Recompute coalescing (``coalesce_rel``, default 0.02): after each solve the rates stay fixed
until the next recompute, which happens at ``t_min + coalesce_rel * age``, where ``t_min`` is the
earliest predicted completion and ``age`` is how long the youngest active flow has been running.
Flows predicted to finish before that instant finish at their exact predicted times. The
capacity they free would sit idle until the recompute; instead, the flows that were running get
credited with the extra progress their new rates would have made since the rate-weighted mean
time that capacity was freed (a first-order correction; new flows get no credit). The number of
solves grows with the logarithm of the spread of completion times instead of with the number of
flows; on skewed AlltoAllv the end time stays within 1% of the exact fluid model (tested).
``coalesce_rel = 0`` is the exact fluid model: a recompute at every distinct completion
picosecond. New flows always trigger a recompute at their start time; flows started at the same
picosecond are solved together.

Flow classes (``aggregate``, default on): at its first solve a group's flows are partitioned into
classes that max-min fair sharing must treat identically (same size, and the same number of
links of each kind of link, :mod:`sim.network.classes`); a group alone in the network is solved
over its classes (cost grows with the classes, not the flows) and all per-flow state lives per
class. With other groups in flight the solve is per flow (or over joint classes, below), and a
group one of whose classes got different rates goes on per flow (its state moves over), so
results never depend on the aggregation. A group that starts beside another large group is not
partitioned at all: that group would split its classes at once. ``aggregate=False`` keeps one
class per flow (the reference).

Link-disjoint parts (``components``, default on): a lone per-flow group (no other group, no
throttle) is split at its first solve into the parts of its flow-link graph that share no
finite link (an AlltoAllv: each node's NVLink flows, and the NIC flows). The max-min rates of
a part depend on its own flows only, so a recompute re-solves only the parts where flows
finished; the others keep their rates, predictions and candidates, drain their bytes window by
window when they are next solved (the same arithmetic as a drain at every recompute), and
their candidates are re-predicted as at the last recompute before they may retire. A part that
is a dense bipartite flow set (an AlltoAllv's NIC flows with one NIC per GPU) is filled from a
weight matrix (``maxmin._fill_dense``, levels and order bit-identical to the sparse filling);
once its live flows' rows and columns span half the matrix or less, the matrix keeps only
those (the same levels). A part of ``step_split_flows`` flows or more is stepped in two threads,
one half each (the same bits).
Lazy rows (``lazy_rows``, default on): a dense part whose flows are stored row by row (each
source NIC's flows contiguous: an AlltoAllv's) steps a row as a whole while every live flow of
it is limited by the row's own link (that link saturates before each column link its flows
cross): they share one rate, so the row keeps one sum of the bytes each has drained (its
windows at the old rate, then the credit) and its flows sorted by their bytes left when it went
lazy; its earliest and latest ends are its first and last live flow's, its candidates a prefix
(``_kernels.lazy_begin`` / ``lazy_end``). The other rows are stepped flow by flow. At 1024 GPUs
(bench network's skewed AlltoAllv) about three quarters of the NIC part's flow steps become
row steps.
Subtracting the row's sum once instead of each window in turn rounds differently in the last
bits, so a flow's arrival may move by 1 ps; ``lazy_rows = False`` steps every flow (the
reference). Measured against it (session 14): the same collective times and link bytes, to the
bit, on bench network's cases and on every preset at 16..256 GPUs (uneven AlltoAllv, per flow
and aggregated, dense parts from 16 flows), arrivals within 1 ps.
Collective times and link bytes are those of solving every part at every recompute; a flow's
arrival may move by 1 ps where its prediction is mathematically a whole picosecond (a tie
between parts in the filling's 1e-12 tolerance, or a last-bit difference, rounds it the other
way). ``components=False`` solves the group whole (the reference).

Dense parts beside other traffic (``components``): in a solve of several groups, and in the
throttled solve, a large per-flow group's bipartite part (an AlltoAllv's NIC flows, one NIC per
GPU) joins the one filling as a weight matrix over two whole blocks of links (every NIC's
transmit and receive link), when no other flow crosses those blocks; in the throttled solve its
flows keep their entries on the GPUs' virtual links. The filling's rounds, ties, load sums and
unload order are those of the same flows given as entries, so every rate is bit-identical to
``components=False`` (tested), unlike the lone group's parts above.

Throttled recomputes: a recompute requested because the GPUs' scales changed, with no flow
finished or started and no group changed since the last solve, reuses that solve's unthrottled
rates and the GPUs' sums of them (the same problem) and solves only the throttled problem.
A lone aggregated group's throttled problem is solved over its classes: at its first
throttled solve they are refined once with the GPUs' virtual links in the flow-link graph
(``equitable_classes(..., ends=...)``), and wherever every class of virtual links has one
capacity (the GPUs of a class capped alike) that partition is equitable for the throttled
problem, so the quotient's rates are the per-flow rates (within rounding: the per-GPU caps of
one class, sums of equal rates, may differ in their last bits and are taken at their minimum).
Where GPUs of one class are capped differently, or the refinement finds too little symmetry,
the throttled solve is per flow and splits the classes whose flows get different rates. The
GPUs' sums of the unthrottled rates (the throttle's input) add each GPU's flows' rates in flow
order; for a large aggregated group they are added once per set of GPUs whose flows have the
same classes in the same order (the GPUs of a node, in an AlltoAllv sized by destination node),
the others taking that sum: the same additions, bit for bit (``_class_traffic``).

Joint classes of several groups (solves of ``joint_min_flows`` flows or more, with
``aggregate``): large groups that start together (model-a's million-flow AlltoAllv beside an
intra-node group at 1024 GPUs) are never partitioned at their start, and each solve of them was
per flow. At their first throttled solve that caps some GPUs, their flows are partitioned
together, with every GPU's virtual links, those of capped and unlimited GPUs apart
(``equitable_classes(..., ends=...)`` with endpoint colours); a class never spans two groups,
and is kept only where its flows' state agrees (so no flow's bytes, rates or arrival change
when it moves over). Each group then holds its part as its classes, and while the groups run
together (or one of them alone) every solve, throttled or not, runs over their quotient, one
problem over all their classes; each virtual link class takes one capacity as in the lone
group's case (within ``endpoint_cap_rel``), else that solve is per flow and splits the classes.
The rates are the per-flow solve's within rounding (1e-11 relative at a million flows); collective
times and link bytes agree within 1e-6 (tested; a tie broken the other way can move a
recompute). A group takes part in at most ``joint_max_tries`` tries, and a failed try is not
repeated for the same partitions and cap pattern.
The links' solve partitions them too (``_shared_joint``, at most ``shared_joint_max_groups``
groups): at the second solve of the same groups together, where the first was per flow and
left them as they were (no throttled solve partitioned them, no class split), with the GPUs'
virtual links coloured by the latest throttled solve's cap pattern; a later throttled solve
whose caps differ within one of its virtual link classes partitions them again with its own.
At 4096 GPUs this takes two pairs of model-a's collectives (5.56M flows: 631,280 classes; 2.1M
flows: 262,146) and the pairs they leave, 250 per-flow solves a run, onto joint classes; the
run's collective times move by at most 1 ps (4.4e-12 relative), its iteration not at all
(session 19). The network's solve functions took 58.3 -> 48.8 CPU-s per run in a pair on a
quiet machine (62.3 -> 61.3 in one under heavy load): the per-flow solves lose about 10 s,
the partitions cost 4.8-6.3 s (one of them a try with too little symmetry, 1.1-1.3 s). The latest ``joint_memo_entries`` joint refinements are kept by a digest of
their inputs: the next iteration's same pairs take them again.
"""

from __future__ import annotations

import bisect
import math
import threading
import dataclasses
import hashlib
from typing import Any, Callable

import numpy as np

from neonic.sim.compiled import jit
from neonic.sim.engine import Engine, EventHandle

from . import _kernels as K
from .classes import FlowClasses, _by_class, _dense, _unique_counts, equitable_classes, identity_classes
from .maxmin import _REL_TOL, HAVE_NUMBA, LinkEntries, _fill_dense, link_levels, maxmin_rates_fm, maxmin_rates_parts, rates_from_levels
from .topology import Route, Topology

__all__ = ["Network", "FlowGroup"]


_NO_CLS = np.zeros(0, dtype=np.int64)  # the class array of a one-class-per-flow call (unread)


@jit(cache=True, nogil=True)
def _traffic_runs(src, dst, cls, identity, alive, rate, tx, rx):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """``_kernels.traffic``, bit for bit: each live flow's rate (its class's; 0 where not
    finite) added to ``tx[src]`` and ``rx[dst]``, flow by flow in order. A run of flows from
    one source (an AlltoAllv's, stored source-major) adds into a register and stores once: the
    same additions in the same order, without each waiting on the store of the one before
    (about half the time of the per-flow loop on a million-flow AlltoAllv)."""
    F = src.shape[0]
    f = 0
    while f < F:
        s = src[f]
        acc = tx[s]
        while f < F and src[f] == s:
            c = f if identity else cls[f]
            if alive[c]:
                r = rate[c]
                if not np.isfinite(r):
                    r = 0.0
                acc += r
                rx[dst[f]] += r
            f += 1
        tx[s] = acc



def _throttle_caps_np(scale, tx, rx, endpoints):
    """The throttled solve's GPU caps from the throttle's ``scale`` (R,) and the links-alone
    send/receive sums ``tx``, ``rx`` (R,): the scales clipped to [1e-9, 1] (a stalled GPU keeps
    a trickle, so that no rate is 0: predictions divide by it), and for each of ``endpoints``
    the send and receive cap ``scale * tx`` / ``scale * rx`` where the scale is below 1 and
    the sum above 0 (else unlimited); returns (cap_tx, cap_rx, which are finite (two masks),
    whether any scale is below 1 (NaN counts as below))."""
    R = scale.shape[0]
    scale = np.minimum(np.maximum(scale, 1e-9), 1.0)
    below = scale < 1.0
    cap_tx = np.full(endpoints, np.inf)
    cap_rx = np.full(endpoints, np.inf)
    cap_tx[:R] = np.where(below & (tx > 0), scale * tx, np.inf)
    cap_rx[:R] = np.where(below & (rx > 0), scale * rx, np.inf)
    return cap_tx, cap_rx, np.isfinite(cap_tx), np.isfinite(cap_rx), not bool((scale >= 1.0).all())


@jit(cache=True, nogil=True)
def _throttle_caps_nb(scale, tx, rx, endpoints):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """:func:`_throttle_caps_np` in one pass, bit for bit (np.maximum and np.minimum keep a
    NaN; the products are the same IEEE ones): a thousand GPUs' caps in 4 us a call, numba's
    dispatch included, where the numpy form's dozen small calls took 27 (once per throttled
    solve, about 6,000 a 1024-GPU run)."""
    R = scale.shape[0]
    cap_tx = np.full(endpoints, np.inf)
    cap_rx = np.full(endpoints, np.inf)
    fin_tx = np.zeros(endpoints, dtype=np.bool_)
    fin_rx = np.zeros(endpoints, dtype=np.bool_)
    capped = False
    for i in range(R):
        s = scale[i]
        s = s if (s != s or s > 1e-9) else 1e-9
        s = s if (s != s or s < 1.0) else 1.0
        if not s >= 1.0:
            capped = True
        if s < 1.0:
            t = tx[i]
            if t > 0:
                c = s * t
                cap_tx[i] = c
                fin_tx[i] = np.isfinite(c)
            r = rx[i]
            if r > 0:
                c = s * r
                cap_rx[i] = c
                fin_rx[i] = np.isfinite(c)
    return cap_tx, cap_rx, fin_tx, fin_rx, capped


class FlowGroup:
    """Messages started together by one :meth:`Network.start_flows` call.

    ``finish_ps[i]`` is message ``i``'s arrival time (int ps; -1 until known); ``end_ps`` the
    last arrival; ``on_done(group)`` runs on the engine at ``end_ps``.
    """

    __slots__ = (
        "src", "dst", "nbytes", "tag", "start_ps", "finish_ps", "end_ps", "on_done",
        "_links", "_factor", "_lat", "_rem", "_rate", "_pred", "_alive", "_orig", "_index", "_nb",
        "_event", "_remaining", "_acct", "_cls", "_mult", "_nbf", "_factorf", "_findex", "_cand", "_agg", "_comp",
        "_dense", "_dindex", "_span", "_ends", "_vends", "_jtries", "_trep",
    )

    def __init__(self, src, dst, nbytes, tag, start_ps, on_done) -> None:
        self.src = src
        self.dst = dst
        self.nbytes = nbytes
        self.tag = tag
        self.start_ps = start_ps
        self.finish_ps = np.full(src.size, -1, dtype=np.int64)
        self.end_ps: int | None = None
        self.on_done = on_done
        self._event: EventHandle | None = None
        self._findex = None  # per-flow link index, for solves shared with other groups
        self._cand = np.empty(0, dtype=np.int64)  # classes that may end by the next recompute
        self._comp: _Components | None | bool = None  # link-disjoint parts (None: not looked for; False: none)
        self._dense: _SharedDense | None | bool = None  # its dense part in shared solves (as _comp)
        self._dindex = None  # its link index without the dense part's links (shared solves)
        self._span: tuple | None = None  # (spans, links, whether its flows cross them)
        self._ends: tuple | None = None  # (links, its flows' int32 sources, destinations): throttled solves
        self._vends: tuple | None = None  # (classes, their throttled index or None: none found): throttled solves
        self._jtries = 0  # joint partitions it took part in, found or not (Network._throttled_joint)
        self._trep: tuple | None = None  # (classes, endpoints arrays, per side its plan): _class_traffic

    @property
    def size(self) -> int:
        return int(self.src.size)

    @property
    def done(self) -> bool:
        return self.end_ps is not None

    @property
    def time_ps(self) -> int | None:
        return None if self.end_ps is None else self.end_ps - self.start_ps

    def __repr__(self) -> str:
        return f"FlowGroup(tag={self.tag!r}, flows={self.size}, start={self.start_ps}, end={self.end_ps})"


def g_comp_mode(g: "FlowGroup", throttle) -> bool:
    """Whether ``g`` (alone in the network) is solved by its link-disjoint parts."""
    return bool(g._comp) and throttle is None


class _Components:
    """The link-disjoint parts of a lone per-flow group (its flows sorted by part, stably).

    Parts share no finite link, so the max-min rates of one part do not depend on the others:
    while a group runs alone, a recompute re-solves only the parts where flows finished
    (``dirty``); the others keep their rates, predictions and candidates, and their remaining
    bytes are drained lazily from ``t_ref`` (the time they were last brought up to date) when
    they are next solved.
    """

    __slots__ = ("starts", "cflow", "link_comp", "dirty", "t_ref", "tmin", "tlast", "cand", "level", "order", "dense",
                 "cell", "live", "nlive", "lazy")

    def __init__(self, starts: np.ndarray, cflow: np.ndarray, link_comp: np.ndarray, now: int) -> None:
        C = starts.size - 1
        self.starts = starts  # flows of part c: starts[c]:starts[c + 1]
        self.cflow = cflow  # part of each flow
        self.link_comp = link_comp  # part of each link (-1: no flow of the group crosses it)
        self.dirty = np.ones(C, dtype=bool)
        self.nlive = np.bincount(cflow, minlength=C)  # live flows per part (all, at the start)
        self.t_ref = np.full(C, now, dtype=np.int64)
        self.tmin = np.full(C, np.inf)
        self.tlast = np.full(C, -np.inf)
        self.cand: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * C
        self.level = np.full(link_comp.size, np.inf)
        # per part, its dense form (maxmin._fill_dense: W, W.T, A links, B links) or None; per
        # flow its cell (row, column) in its part's W (-1: not in a dense part)
        self.dense: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None] = [None] * C
        self.cell = np.full((cflow.size, 2), -1, dtype=np.int32)
        # per dense part, the live flows in each row and each column of its W
        self.live: list[tuple[np.ndarray, np.ndarray] | None] = [None] * C
        self.order = np.full(link_comp.size, np.iinfo(np.int64).max, dtype=np.int64)  # never saturated
        # per dense part, its rows' lazy state (_LazyRows; None: not built yet; False: its flows
        # are not stored row by row, or lazy rows are off)
        self.lazy: list = [None] * C

    def materialize(self, g: "FlowGroup") -> None:
        """Every lazy row's flows get their bytes left and rate written back (before anything
        reads or reorders the group's per-flow arrays), and the lazy states are dropped (they
        are built again at the part's next step)."""
        for i, lz in enumerate(self.lazy):
            if lz:
                lz.write_back(g)
            self.lazy[i] = None


class _LazyRows:
    """The lazy state of a dense part's rows (``_kernels.lazy_begin``): per row of its matrix,
    its flows' range ``rlo:rhi`` (the part's flows are stored row by row), whether it is lazy
    (``on``), the bytes each of its flows drained since (``D``) and their common rate (``L``),
    the position of its first live flow in ``perm`` (``head``); per flow of the part (from
    flow ``lo``), ``perm``: each row's flows (finished first, then the live ones by ``key``),
    and ``key``: its bytes left when its row went lazy."""

    __slots__ = ("lo", "rlo", "rhi", "on", "D", "L", "head", "perm", "key")

    def __init__(self, lo: int, rlo: np.ndarray, rhi: np.ndarray, size: int) -> None:
        n = rlo.size
        self.lo = lo
        self.rlo = rlo
        self.rhi = rhi
        self.on = np.zeros(n, dtype=bool)
        self.D = np.zeros(n)
        self.L = np.zeros(n)
        self.head = np.zeros(n, dtype=np.int64)
        self.perm = np.arange(lo, lo + size, dtype=np.int64)
        self.key = np.zeros(size)

    @staticmethod
    def build(g: "FlowGroup", comp: "_Components", i: int) -> "_LazyRows | bool":
        """Part ``i``'s lazy state, or False where its flows are not stored row by row (each
        row's flows one contiguous range, rows in order) or a live flow has no weight in ``W``."""
        lo, hi = int(comp.starts[i]), int(comp.starts[i + 1])
        W = comp.dense[i][0]
        cell = comp.cell[lo:hi]
        on = cell[:, 0] >= 0
        live = g._alive[lo:hi]
        if np.any(live & ~on):
            return False
        idx = np.flatnonzero(on)
        rows = cell[idx, 0].astype(np.int64)
        if rows.size == 0 or np.any(np.diff(rows) < 0):
            return False
        nA = W.shape[0]
        first = np.searchsorted(rows, np.arange(nA))
        last = np.searchsorted(rows, np.arange(nA), side="right")
        rlo = np.where(last > first, idx[np.minimum(first, idx.size - 1)] + lo, 0).astype(np.int64)
        rhi = np.where(last > first, idx[np.maximum(last - 1, 0)] + 1 + lo, 0).astype(np.int64)
        if np.any(rhi - rlo != last - first):  # a row's flows interleaved with another's
            return False
        if np.any(W[cell[live, 0], cell[live, 1]] <= 0.0):
            return False
        return _LazyRows(lo, rlo, rhi, hi - lo)

    def take(self, r: np.ndarray) -> None:
        """Keep rows ``r`` only (the part's matrix was cut to them: ``Network._dense_finished``)."""
        for name in ("rlo", "rhi", "on", "D", "L", "head"):
            setattr(self, name, getattr(self, name)[r])

    def write_back(self, g: "FlowGroup") -> None:
        K.lazy_materialize(g._alive, g._rem, g._rate, self.rlo, self.rhi, self.on, self.D, self.L, self.head,
                           self.perm, self.key, self.lo)


class _SharedDense:
    """A group's bipartite part (an AlltoAllv's NIC flows with one NIC per GPU) as a weight
    matrix, for the solves it shares with other groups or a throttle: flow ``f`` of the part
    crosses link ``a0 + cell[f, 0]`` and link ``b0 + cell[f, 1]`` with weight ``W[0][cell[f]]``
    (0 once it has finished; ``cell[f] = -1`` for the group's other flows, which cross neither
    range). ``W`` and ``WT`` are (1, nA, nB) and (1, nB, nA) (``maxmin._fill_levels``'s dense sets)."""

    __slots__ = ("W", "WT", "a0", "b0", "cell")

    def __init__(self, W: np.ndarray, a0: int, b0: int, cell: np.ndarray) -> None:
        self.W = W
        self.WT = K.transposed(W) if HAVE_NUMBA else np.ascontiguousarray(W.transpose(0, 2, 1))
        self.a0 = a0
        self.b0 = b0
        self.cell = cell

    @property
    def spans(self) -> tuple[int, int, int, int]:
        return self.a0, self.W.shape[1], self.b0, self.W.shape[2]

    def drop(self, flows: np.ndarray) -> None:
        """Finished flows leave the matrix."""
        cells = self.cell[flows]
        cells = cells[cells[:, 0] >= 0]
        if cells.size:
            self.W[0][cells[:, 0], cells[:, 1]] = 0.0
            self.WT[0][cells[:, 1], cells[:, 0]] = 0.0


class Network:
    """Flows over a :class:`Topology`, advanced by an :class:`Engine`.

    ``link_bytes`` / ``link_wire_bytes``: payload / on-the-wire bytes delivered over each link
    (counted when each message finishes transmitting); ``link_class_bytes()`` sums them by class.
    """

    def __init__(self, engine: Engine, topology: Topology, *, coalesce_rel: float = 0.02, aggregate: bool = True,
                 components: bool = True) -> None:
        if not isinstance(engine, Engine):
            raise ValueError(f"engine: expected a sim.engine.Engine, got {type(engine).__name__}")
        if not isinstance(topology, Topology):
            raise ValueError(f"topology: expected a Topology, got {type(topology).__name__}")
        if not (isinstance(coalesce_rel, (int, float)) and 0 <= coalesce_rel <= 0.5):
            raise ValueError(f"coalesce_rel: expected a number in [0, 0.5], got {coalesce_rel!r}")
        if not isinstance(aggregate, bool):
            raise ValueError(f"aggregate: expected True or False, got {aggregate!r}")
        self.engine = engine
        self.topology = topology
        self.coalesce_rel = float(coalesce_rel)
        self.aggregate = aggregate
        if not isinstance(components, bool):
            raise ValueError(f"components: expected True or False, got {components!r}")
        # a lone per-flow group re-solves only its link-disjoint parts where flows finished
        self.components = components
        self.dense_min_flows = 4096  # parts this large get a dense form where they are bipartite
        self.dense_max_cells = 1 << 25  # ... of at most this many flow slots (2 x 256 MiB)
        # groups with fewer flows than this are solved per flow: one solve of them costs about
        # what finding their classes does (collective steps of one message per rank, e.g.)
        self.aggregate_min_flows = 4 * topology.num_endpoints
        self.solved_flows = 0  # sum over solves of the flows they covered
        self.solved_classes = 0  # ... and of the variables the solver saw (classes or flows)
        self.splits = 0  # classes refined because other traffic broke their symmetry
        self.throttled_by_class = 0  # throttled solves of an aggregated group over its classes
        self.throttled_per_flow = 0  # ... and those solved per flow (GPU caps differ within a class)
        self.throttled_disjoint = 0  # throttled per-flow solves of link-disjoint flows (_disjoint_rates)
        self.traffic_by_sequence = 0  # groups' GPU traffic sums taken by endpoint sequence (_class_traffic)
        # joint classes of several groups (_throttled_joint): tried for throttled solves of at
        # least this many flows in all; each group takes part in at most joint_max_tries tries
        self.joint_min_flows = 1 << 16
        self.joint_max_tries = 3
        self.joint_partitions = 0  # joint partitions installed
        self.shared_partitions = 0  # ... of them by the links' solve (_shared_joint)
        # the links' solve of at most this many groups, of at least this many flows in all,
        # may partition them (_shared_joint). Below it their per-flow solves are cheap (the
        # 1024-GPU run's pairs of 0.25-1.2M flows: 3-20 ms a solve), and a partition that finds
        # too little symmetry costs 0.1-0.3 s; at 4096 GPUs pairs of 2.1M and 5.6M flows find
        # 12.5% and 11%. Measured at 1024 (session 20, this threshold at 1M, joint_max_tries
        # unlimited and the refinement's max_fraction at 0.6 so that it is not refused): the
        # 1.05M-flow AlltoAllv beside the 130k-flow group (87 sizes) partitions into 490,624
        # classes of 1.18M flows (41%; 41% with the links alone, without the GPUs' virtual
        # links: the two collectives' mix on shared links breaks the symmetry), 1.1-1.3 CPU-s;
        # the pair's later solves over them (520k+130k flows: 203,250 + 81,280 classes) take
        # 9.7 ms against 11 ms per flow (dense parts), and the 130k group's solves beside a
        # thousand lone messages get slower: the network's solves and predictions took 1.2 CPU-s
        # more per run, the same rates bit for bit. So 1024's pairs stay per flow.
        self.shared_joint_max_groups = 4
        self.shared_joint_min_flows = 1 << 21
        self._shared_seen: list | None = None  # the classes of the groups of the latest per-flow shared solve
        self._caps_seen: tuple[np.ndarray, np.ndarray] | None = None  # the latest throttled solve's finite caps
        self._joint_shared = False  # whether the latest joint partition was made by _shared_joint
        self.joint_solves = 0  # solves of several groups over their joint classes (throttled or not)
        self._joint_lc: np.ndarray | None = None  # the latest joint partition's link classes (its token)
        self._joint_index: tuple | None = None  # (the groups' classes, their quotient's arrays and index)
        self._joint_fail: tuple | None = None  # (groups' classes, cap pattern) whose caps differed in a class
        # the latest joint refinements (_joint_classes), by their inputs' digest, oldest first
        # (None: too little symmetry); the same collectives side by side in the next iteration
        # find them again
        self._joint_memo: dict[bytes, FlowClasses | None] = {}
        self.joint_memo_entries = 4
        self.joint_memo_hits = 0  # joint refinements taken from _joint_memo
        L = topology.num_links
        self.link_bytes = np.zeros(L)
        self.link_wire_bytes = np.zeros(L)
        self.solves = 0
        self.lazy_row_steps = 0  # rows of dense parts stepped lazily (_step_lazy), summed over steps
        self.compact_min_flows = 4096  # groups larger than this drop finished flows ...
        self.compact_at = 0.5  # ... once fewer than this fraction of their classes are left
        self.flows_started = 0
        self._routes: dict[tuple[int, int], Route] = {}  # single messages' routes (_route)
        self._groups: list[FlowGroup] = []  # groups with flows in the solver
        self._pending: list[FlowGroup] = []
        self._t_last = engine.now
        self._recomputes: list[int] = []  # the times of every recompute (parts sitting out catch up)
        self._dt = 0.0  # length of the window that ended at the last recompute
        self._levels: tuple[np.ndarray, np.ndarray] | None = None  # a lone group's link levels
        self._recompute_event: EventHandle | None = None
        self._recompute_at: int | None = None
        self._throttle: Callable[[np.ndarray, np.ndarray], np.ndarray | None] | None = None
        self._tcache: dict[str, Any] | None = None  # the throttled solve's flows (_throttle_flows)
        self._rcache: dict[str, Any] | None = None  # the groups solved beside the largest (_rest_problem)
        # the flow set's version: bumped whenever a flow finishes or starts, or a group's arrays
        # or classes change. A throttled recompute at an unchanged version (only the GPUs'
        # scales moved) reuses the unthrottled rates of the last solve: the same problem
        self._flow_set = 0
        self._base: tuple[int, list[np.ndarray], int, int] | None = None  # (version, rates, counts)
        self.base_reused = 0  # solves that reused them
        self._sums: tuple | None = None  # (version, tx, rx): the GPUs' sums of those rates
        # called with the network after every solve (progress reports on long runs; None: off)
        self.on_solve: Callable[["Network"], Any] | None = None
        # 0, 1, 2, ... and 1.0, 1.0, ...: the groups' one-class-per-flow arrays are views of
        # these (_iota, _ones), never written, grown to the largest group
        self._iota_buf = np.arange(1, dtype=np.int64)
        self._ones_buf = np.ones(0)

    # ------------------------------------------------------------- GPU-side feed (issue 16)
    def set_throttle(self, fn: Callable[[np.ndarray, np.ndarray], np.ndarray | None] | None) -> None:
        """Let the GPUs' communication kernels limit the flows they feed (``sim.interference``).

        After every solve, ``fn(tx, rx)`` gets each GPU's summed send and receive rates (bytes per
        ps, as the links alone allow) and returns one scale in [0, 1] per GPU (or None: no
        limit); the flows are then re-solved with each GPU's sends and receives capped at that
        scale times those rates (two virtual links per GPU): over a lone aggregated group's
        classes where its GPUs' caps allow (module doc), else per flow, where a flow class
        whose flows got different rates is split as with other traffic. Call
        :meth:`request_recompute` when the scales change between solves.
        """
        if fn is not None and not callable(fn):
            raise ValueError(f"fn: expected a callable or None, got {fn!r}")
        self._throttle = fn

    def request_recompute(self) -> None:
        """Re-solve the rates at the current time (after a throttle's scales changed)."""
        if self._groups or self._pending:
            self._request_recompute(self.engine.now)

    # --------------------------------------------------------------------------- public API
    def start_flow(
        self, src: int, dst: int, nbytes: int, on_done: Callable[[FlowGroup], Any] | None = None, *, tag: Any = None
    ) -> FlowGroup:
        """One message ``src -> dst`` of ``nbytes`` payload bytes, starting now."""
        return self.start_flows([src], [dst], [nbytes], on_done, tag=tag)

    def start_flows(
        self,
        src,
        dst,
        nbytes,
        on_done: Callable[[FlowGroup], Any] | None = None,
        *,
        tag: Any = None,
        route: Route | None = None,
    ) -> FlowGroup:
        """Messages ``src[i] -> dst[i]`` of ``nbytes[i]`` bytes, all starting now; one callback.

        ``route``: optionally ``topology.route(src, dst, nbytes)`` computed by the caller. The
        group keeps the route's arrays where it takes every message (no copies: 16.8M messages
        at 4096 GPUs); the network never writes them, and the caller must not either.
        """
        src = np.asarray(src, dtype=np.int64).ravel()
        dst = np.asarray(dst, dtype=np.int64).ravel()
        nb = np.asarray(nbytes)
        if nb.ndim == 0:
            nb = np.full(src.size, nb)
        nb = nb.ravel()
        if nb.size != src.size or dst.size != src.size:
            raise ValueError(f"nbytes: expected {src.size} sizes matching src/dst, got {nb.size} (dst {dst.size})")
        if nb.size and (not np.all(np.isfinite(nb)) or nb.min() < 0):
            raise ValueError("nbytes: expected finite sizes >= 0")
        nb = nb.astype(np.float64)
        if on_done is not None and not callable(on_done):
            raise ValueError(f"on_done: expected a callable or None, got {on_done!r}")
        now = self.engine.now
        if route is None or route.factor.shape != nb.shape:
            route = self._route(src, dst, nb)
        g = FlowGroup(src, dst, nb, tag, now, on_done)
        self.flows_started += src.size
        # messages that need no bandwidth (empty, or to self) arrive after their latency alone
        moving = nb > 0
        moving &= route.links[0] != self.topology.pad_link
        every = bool(moving.all())
        if not every:
            g.finish_ps[~moving] = now + route.latency_ps[~moving]
        if every:  # (no gathers: an AlltoAllv's 16.8M flows at 4096 GPUs)
            idx = self._iota(src.size)[:src.size]  # (a view: never written)
            g._links = np.ascontiguousarray(route.links.T)  # (F, H), flow-major
            g._acct = np.ascontiguousarray(route.acct.T)  # (F, A) bytes only, never binding
            g._factorf = route.factor
            g._lat = route.latency_ps
            g._nbf = nb
        else:
            idx = np.flatnonzero(moving)
            g._links = np.ascontiguousarray(route.links[:, idx].T)
            g._acct = np.ascontiguousarray(route.acct[:, idx].T)
            g._factorf = route.factor[idx]
            g._lat = route.latency_ps[idx]
            g._nbf = nb[idx]
        g._orig = idx
        topo = self.topology
        # its classes are found at its first solve, when it is known what runs beside it
        g._agg = self.aggregate and idx.size >= self.aggregate_min_flows
        if g._agg:  # its state is set at its first solve (_classes_at_start): by class, or per flow
            g._cls = None
            g._remaining = idx.size
        else:
            self._set_classes(g, identity_classes(g._links, topo.capacity, topo.wire, iota=self._iota(src.size + 1)),
                              None)
            g._remaining = g._alive.size
        if idx.size == 0:
            self._schedule_done(g)
        else:
            self._pending.append(g)
            self._request_recompute(now)
        return g

    #: single messages' routes kept per (source, destination) pair, at most this many (0: none)
    route_cache_max = 1 << 14

    def _route(self, src: np.ndarray, dst: np.ndarray, nb: np.ndarray) -> Route:
        """``topology.route(src, dst, nb)``; a single message's links, accounted links and
        latency are kept per (source, destination) pair, its framing factor (which depends on
        its size) taken afresh. A rank's copies to and from host memory (a thousand single
        messages per step at 1024 GPUs) repeat their pairs every step, and routing one cost
        about as much as the rest of its start. The arrays are those the topology gave (never
        written: a group copies what it changes)."""
        topo = self.topology
        if src.size != 1 or not self.route_cache_max:
            return topo.route(src, dst, nb)
        key = (int(src[0]), int(dst[0]))
        r = self._routes.get(key)
        if r is None:
            r = topo.route(src, dst, nb)
            if len(self._routes) < self.route_cache_max:
                self._routes[key] = r
            return r
        return Route(links=r.links, latency_ps=r.latency_ps, factor=topo._factors(1, nb), acct=r.acct)

    def link_class_bytes(self, *, wire: bool = False) -> dict[str, float]:
        """Bytes delivered per link class (payload, or on-the-wire with ``wire=True``)."""
        return self.topology.class_totals(self.link_wire_bytes if wire else self.link_bytes)

    @property
    def active_flows(self) -> int:
        return sum(int(g._mult[g._alive].sum()) for g in self._groups) + sum(g._links.shape[0] for g in self._pending)

    # ---------------------------------------------------------------------------- internals
    def _iota(self, n: int) -> np.ndarray:
        """An int64 array ``0, 1, 2, ...`` of at least ``n`` entries, shared by the groups: their
        one-class-per-flow ids and flow indices are views of it (:func:`identity_classes`), and
        nobody writes them."""
        if self._iota_buf.shape[0] < n:
            self._iota_buf = np.arange(n, dtype=np.int64)
        return self._iota_buf

    def _flow_ends(self, g: FlowGroup) -> tuple[np.ndarray, np.ndarray]:
        """Each flow's source and destination endpoint (``g.src[g._orig]``, ``g.dst[g._orig]``;
        not to be written): the group's own arrays while its flows are all its messages in
        their order (``_orig`` the shared ``0, 1, ...``), else gathered."""
        o = g._orig
        if o.base is self._iota_buf and o.size == g.src.size:
            return g.src, g.dst
        return g.src[o], g.dst[o]

    def _ends32(self, g: FlowGroup) -> tuple[np.ndarray, np.ndarray]:
        """Each flow's source and destination endpoint as int32 (the per-solve traffic sums read
        them for every flow), kept by the group while its arrays stay the same (and carried
        over a compaction, :meth:`_compact`)."""
        e = g._ends
        if e is None or e[0] is not g._links:
            src, dst = self._flow_ends(g)
            e = g._ends = (g._links, src.astype(np.int32), dst.astype(np.int32))
        return e[1], e[2]

    def _ones(self, n: int) -> np.ndarray:
        """``n`` ones (float64), a view of one shared array (a group's multiplicities, one flow
        per class; never written)."""
        if self._ones_buf.shape[0] < n:
            self._ones_buf = np.ones(n)
        return self._ones_buf[:n]

    def _set_classes(self, g: FlowGroup, cl: FlowClasses, old: FlowClasses | None) -> None:
        """Install a partition; with ``old`` the class state moves over (new classes refine old)."""
        if old is None and cl.identity:  # each flow its own class: the flows' arrays
            # (sizes and factors shared with the per-flow arrays, multiplicities a view of ones:
            # none is ever written in place, and a change replaces the array)
            g._nb = g._nbf
            g._factor = g._factorf
            g._rem = g._nb.copy()
            g._rate = np.zeros(g._nb.size)
            g._pred = np.full(g._nb.size, np.inf)
            g._alive = np.ones(g._nb.size, dtype=bool)
            g._mult = self._ones(g._nb.size)
            g._cls = cl
            g._index = None
            return
        rep = None if cl.identity else cl.members[cl.starts[:-1]]  # one member flow of each class
        if old is None:
            g._nb = g._nbf[rep]
            g._factor = g._factorf[rep]
            g._rem = g._nb.copy()
            g._rate = np.zeros(rep.size)
            g._pred = np.full(rep.size, np.inf)
            g._alive = np.ones(rep.size, dtype=bool)
        else:
            o = old.cls if rep is None else old.cls[rep]  # (one class per flow: flow f is class f)
            g._nb, g._factor, g._rem = g._nb[o], g._factor[o], g._rem[o]
            g._rate, g._pred, g._alive = g._rate[o], g._pred[o], g._alive[o]
        g._mult = self._ones(cl.cls.size) if rep is None else np.diff(cl.starts).astype(np.float64)
        g._cls = cl
        g._index = None

    def _request_recompute(self, t: int) -> None:
        if self._recompute_at is not None and self._recompute_at <= t:
            return
        if self._recompute_event is not None:
            self._recompute_event.cancel()
        self._recompute_at = t
        self._recompute_event = self.engine.schedule(t, self._recompute)

    def _schedule_done(self, g: FlowGroup) -> None:
        end = int(g.finish_ps.max()) if g.finish_ps.size else self.engine.now
        end = max(end, self.engine.now)
        if g._event is not None:
            g._event.cancel()
        g._event = self.engine.schedule(end, self._finish_group, g, end)

    def _finish_group(self, g: FlowGroup, end: int) -> None:
        g.end_ps = end
        g._event = None
        if g.on_done is not None:
            g.on_done(g)

    def _recompute(self) -> None:
        now = self.engine.now
        self._recompute_event = None
        self._recompute_at = None
        dt = now - self._t_last
        self._t_last = now
        self._recomputes.append(now)
        survivors: list[FlowGroup] = []
        topo = self.topology
        freed = 0.0
        freed_t = 0.0
        fnow = float(now)
        for g in self._groups:
            cl = g._cls
            # the classes predicted to end by now retire (the others drain in _predict)
            if g._comp and g._cand.size:
                self._recheck_candidates(g)
            cand = g._cand
            if cand.size == 1 and not (g._alive[cand[0]] and g._pred[cand[0]] <= fnow):
                # one candidate, not due: what K.retire would find, without a compiled call (a
                # lone message's group is always its own candidate; a thousand such per solve)
                done, sr, srt = cand[:0], 0.0, 0.0
                g._cand = done
            elif cand.size:
                done, sr, srt = K.retire(cand, g._pred, g._alive, g._rem, g._rate, g._mult, fnow)
                g._cand = done[:0]
            else:  # no candidate: nothing retires (skips a compiled call per group and solve)
                done, sr, srt = cand, 0.0, 0.0
            if done.size:
                K.account(done, cl.members, cl.starts, g._links, g._acct, g._factorf, topo.wire, g._nbf,
                          self.link_bytes, self.link_wire_bytes)
                if g._index is not None:  # finished classes leave the solver's index
                    g._index.kill(done)
                if g._dense:
                    g._dense.drop(done)
                if g._comp:  # their parts are re-solved (dense parts lose their cells)
                    c = g._comp
                    parts = c.cflow[done]
                    c.dirty[parts] = True
                    c.nlive -= np.bincount(parts, minlength=c.nlive.size)
                    cells = c.cell[done]
                    dense = cells[:, 0] >= 0
                    if dense.any():
                        for i in np.flatnonzero(np.bincount(parts[dense], minlength=c.dirty.size)):
                            sel = cells[dense & (parts == i)]
                            c.dense[i][0][sel[:, 0], sel[:, 1]] = 0.0
                            c.dense[i][1][sel[:, 1], sel[:, 0]] = 0.0
                            self._dense_finished(c, i, sel)
                # they arrive one route latency after their predicted end (pred <= now <= the
                # horizon they were predicted under)
                K.finish_cls(done, g._pred, cl.members, cl.starts, g._lat, g._orig, g.finish_ps)
            g._remaining -= done.size
            freed += sr
            freed_t += srt
            if done.size:
                self._flow_set += 1
            if g._remaining:
                if g._event is not None:  # its completion prediction is void: rates change now
                    g._event.cancel()
                    g._event = None
                    K.void_cls(g._alive, cl.members, cl.starts, g._orig, g.finish_ps)
                if g._remaining < self.compact_at * g._alive.size and g._alive.size > self.compact_min_flows:
                    self._compact(g)
                    self._flow_set += 1
                survivors.append(g)
        if len(survivors) < len(self._groups):
            self._forget([g for g in self._groups if not g._remaining])
        old = survivors
        if self._pending:
            self._flow_set += 1
        survivors = survivors + self._pending
        for g in self._pending:
            if g._agg:
                self._classes_at_start(g, survivors)
        lone = len(survivors) == 1 and self._throttle is None
        for g in old:
            if g._comp and not lone:  # solved with others from now on: every part up to date
                self._leave_components(g, now - int(dt))
        if lone and self._pending and self.components:
            self._find_components(survivors[0], now)
        self._pending = []
        self._groups = survivors
        if not survivors:
            return
        previous = {id(g): g._rate for g in old}
        self._solve(now, previous)
        self._dt = float(dt)
        # Coalescing left the capacity freed inside the last window idle until now. Credit the
        # flows that existed then with the extra progress their new rates would have made since
        # the (rate-weighted) mean time that capacity was freed; new flows get no credit.
        span = 0.0
        if self.coalesce_rel and freed > 0.0:
            span = max(now - freed_t / freed, 0.0)
        self._predict(now, previous, span)

    def _forget(self, gone: list[FlowGroup]) -> None:
        """Drop the solve caches that name a group which has left the solver (``gone``): their
        keys ask for that very group (or its classes), so they can never match again, and until
        the next solve of their kind replaced them they would keep its arrays and, through its
        callback, its collective's (an AlltoAllv's at 4096 GPUs: gigabytes, beside the next
        one's solve). A cache that cannot match is rebuilt either way: the same results."""
        ids = {id(g) for g in gone}
        classes = {id(g._cls) for g in gone}
        for name in ("_tcache", "_rcache"):
            c = getattr(self, name)
            if c is not None and any(id(h) in ids for h, _ in c["key"]):
                setattr(self, name, None)
        if self._joint_index is not None and any(id(k) in classes for k in self._joint_index[0]):
            self._joint_index = None
        if self._joint_fail is not None and any(id(k) in classes for k in self._joint_fail[0]):
            self._joint_fail = None
        if self._shared_seen is not None and any(id(k) in classes for k in self._shared_seen):
            self._shared_seen = None

    def _classes_at_start(self, g: FlowGroup, groups: list[FlowGroup]) -> None:
        """Before a new group's first solve: its flow classes, unless another large group
        (``aggregate_min_flows`` flows or more) runs beside it. The shared solve is per flow, and
        in the collectives DLRM runs such a group crosses the same links, so the classes would
        be split at once; finding them costs seconds at a million flows. A cost decision only:
        the per-flow and the class solve give the same rates."""
        g._agg = False
        topo = self.topology
        cl = None
        for h in groups:
            flows = h._links.shape[0] if h._cls is None else int(h._mult[h._alive].sum())  # (None: not set yet)
            if h is not g and flows >= self.aggregate_min_flows:
                break
        else:
            cl = equitable_classes(g._links, g._nbf, topo.capacity, topo.wire)
        if cl is None or cl.identity:  # one class per flow
            cl = identity_classes(g._links, topo.capacity, topo.wire, iota=self._iota(g._links.shape[0] + 1))
        self._set_classes(g, cl, None)  # nothing has moved yet: the classes start from the flows' sizes
        g._remaining = g._alive.size

    def _find_components(self, g: FlowGroup, now: int) -> None:
        """Before a lone per-flow group's first solve: its link-disjoint parts (e.g. an
        AlltoAllv's intra-node flows per node, on NVLink, and its inter-node flows, on the NICs).
        The flows are sorted by part, stably, so that each link's flows keep their order (its
        loads are summed as before). Groups of one part, aggregated groups and small groups are
        left as they are (``g._comp = False``)."""
        g._comp = False
        cl = g._cls
        if not cl.identity or g._alive.size < self.aggregate_min_flows:
            return
        topo = self.topology
        finite = np.isfinite(topo.capacity)
        cflow = K.components(g._links, finite)
        C = int(cflow.max()) + 1 if cflow.size else 0
        if C < 2:
            return
        order = np.argsort(cflow, kind="stable")
        cflow = cflow.astype(np.int32)
        for name in ("_orig", "_links", "_acct", "_factorf", "_lat", "_nbf", "_factor", "_nb", "_rem", "_rate", "_pred",
                     "_alive", "_mult"):
            setattr(g, name, np.ascontiguousarray(getattr(g, name)[order]))
        cflow = cflow[order]
        g._cls = identity_classes(g._links, cl.lclass_capacity, cl.lclass_wire, iota=self._iota(g._links.shape[0] + 1))
        g._index = None
        g._findex = None
        g._dense, g._dindex, g._span = None, None, None
        starts = np.zeros(C + 1, dtype=np.int64)
        np.cumsum(np.bincount(cflow, minlength=C), out=starts[1:])
        link_comp = np.full(topo.capacity.size, -1, dtype=np.int64)
        for h in range(g._links.shape[1]):  # hop by hop (no (flows x hops) temporaries)
            on = finite[g._links[:, h]]
            link_comp[g._links[on, h]] = cflow[on]
        del on
        g._comp = comp = _Components(starts, cflow, link_comp, now)
        for i in range(C):
            if starts[i + 1] - starts[i] >= self.dense_min_flows:
                self._dense_part(g, comp, i)

    def _dense_part(self, g: FlowGroup, comp: _Components, i: int) -> None:
        """Give part ``i`` its dense form when it is bipartite (:meth:`_bipartite`). The dense
        filling (``maxmin._fill_dense``) gives the same levels at a fraction of the cost."""
        lo, hi = int(comp.starts[i]), int(comp.starts[i + 1])
        f = self._bipartite(g._links[lo:hi], g._factorf[lo:hi], g._alive[lo:hi])
        if f is None:
            return
        W, A, B, ia, jb = f
        comp.dense[i] = (W[0], np.ascontiguousarray(W[0].T), A, B)
        comp.cell[lo:hi, 0] = ia
        comp.cell[lo:hi, 1] = jb
        live = g._alive[lo:hi]
        comp.live[i] = (np.bincount(ia[live], minlength=A.size), np.bincount(jb[live], minlength=B.size))

    #: a dense part's matrix is cut down to its live rows and columns once they span at most this
    #: fraction of it (0: never)
    dense_shrink_at = 0.5

    def _dense_finished(self, comp: _Components, i: int, cells: np.ndarray) -> None:
        """Flows of dense part ``i`` at ``cells`` (row, column) finished (their weights are 0
        now). Once the rows and columns that still hold a live flow span at most
        ``dense_shrink_at`` of the matrix, the matrix keeps only those: every other link of the
        part has no live flow, so it never takes part in the filling (``maxmin._fill_dense``
        leaves a link without flows out, at level inf), and a sum that skips exact zeros is the
        same sum. The levels and orders are those of the whole matrix, at a fraction of the cost
        (an AlltoAllv's last solves have a few sources left)."""
        rows, cols = comp.live[i]
        rows -= np.bincount(cells[:, 0], minlength=rows.size)
        cols -= np.bincount(cells[:, 1], minlength=cols.size)
        W, WT, A, B = comp.dense[i]
        r, k = np.flatnonzero(rows), np.flatnonzero(cols)
        if r.size == 0 or k.size == 0 or r.size * k.size > self.dense_shrink_at * W.size:
            return
        rmap = np.full(A.size, -1, dtype=np.int32)
        rmap[r] = np.arange(r.size, dtype=np.int32)
        kmap = np.full(B.size, -1, dtype=np.int32)
        kmap[k] = np.arange(k.size, dtype=np.int32)
        lo, hi = int(comp.starts[i]), int(comp.starts[i + 1])
        cell = comp.cell[lo:hi]
        on = cell[:, 0] >= 0
        nr = np.where(on, rmap[np.where(on, cell[:, 0], 0)], -1)
        nk = np.where(on, kmap[np.where(on, cell[:, 1], 0)], -1)
        gone = (nr < 0) | (nk < 0)  # finished flows of the rows and columns left out
        nr[gone] = -1
        nk[gone] = -1
        cell[:, 0] = nr
        cell[:, 1] = nk
        out = np.concatenate([A[rows == 0], B[cols == 0]])
        comp.level[out] = np.inf
        comp.order[out] = np.iinfo(np.int64).max
        W2 = np.ascontiguousarray(W[np.ix_(r, k)])
        if comp.lazy[i]:
            comp.lazy[i].take(r)
        comp.dense[i] = (W2, np.ascontiguousarray(W2.T), A[r], B[k])
        comp.live[i] = (rows[r].copy(), cols[k].copy())

    def _bipartite(self, links: np.ndarray | None, factorf: np.ndarray, live: np.ndarray, found: tuple | None = None):
        """The dense form of a part (its flows' ``links``, factors, live flags) when it is
        bipartite (every flow crosses exactly two finite links, a first one from a set A and a
        second from a set B disjoint from A, both framed alike), has at most one flow per pair,
        fills at least a quarter of the A x B pairs, and every link's flows, in flow order, go
        to increasing partners (its load is then summed in the sparse solve's order): an
        AlltoAllv's NIC flows with one NIC per GPU. Returns (W (1, |A|, |B|) of the live flows'
        weights, A, B, each flow's row, each flow's column) or None. ``found``: ``K.two_finite``'s
        (a, b, in_a, in_b) of the flows, found already (``links`` is not read then)."""
        topo = self.topology
        finite = np.isfinite(topo.capacity)
        L = topo.capacity.size
        if found is not None:
            a, b, in_a, in_b = found
        elif HAVE_NUMBA:  # each flow's two finite links in one compiled pass (16.8M flows at 4096 GPUs)
            ok, a, b, in_a, in_b = K.two_finite(links, finite, L)
            if not ok:
                return None
        else:
            # (a million-flow part: int32 and per-hop temporaries, no (flows x hops) int64 arrays)
            n_fin = np.zeros(links.shape[0], dtype=np.uint8)
            for h in range(links.shape[1]):
                n_fin += finite[links[:, h]]
            if np.any(n_fin != 2):
                return None
            del n_fin
            if links.shape[1] == 2:
                a, b = links[:, 0], links[:, 1]
            else:
                fin = finite[links]
                rows = np.arange(links.shape[0])
                a = links[rows, np.argmax(fin, axis=1)]
                b = links[rows, fin.shape[1] - 1 - np.argmax(fin[:, ::-1], axis=1)]
                del fin, rows
            in_a = np.bincount(a, minlength=L) > 0
            in_b = np.bincount(b, minlength=L) > 0
        if np.any(in_a & in_b):
            return None
        A, B = np.flatnonzero(in_a), np.flatnonzero(in_b)
        framed = topo.wire[A[0]]
        if np.any(topo.wire[A] != framed) or np.any(topo.wire[B] != framed):  # all framed alike
            return None
        if a.size < 0.25 * A.size * B.size or A.size * B.size > self.dense_max_cells:
            return None
        slot = np.full(L, -1, dtype=np.int32)
        slot[A] = np.arange(A.size, dtype=np.int32)
        slot[B] = np.arange(B.size, dtype=np.int32)  # (A and B are disjoint)
        W = np.zeros((1, A.size, B.size))
        if HAVE_NUMBA:  # the cells, their order, and (in order) the weights in one compiled pass
            ia, jb, ordered = K.dense_cells(a, b, slot, live, factorf, framed, W[0])
        else:
            ia, jb = slot[a], slot[b]
            ordered = bool(np.all((ia[1:] > ia[:-1]) | ((ia[1:] == ia[:-1]) & (jb[1:] > jb[:-1]))))
        del slot
        if ordered and HAVE_NUMBA:
            return W, A, B, ia, jb
        # flows in increasing (A, B) order (an AlltoAllv's, source-major) are one per pair and
        # every link's flows go to increasing partners; otherwise check both directly
        if not ordered:
            key = ia.astype(np.int64) * B.size + jb
            if np.bincount(key, minlength=A.size * B.size).max() > 1:  # one flow per pair
                return None
            del key
            for x, y in ((ia, jb), (jb, ia)):  # per link, partners increasing in flow order
                o = np.argsort(x, kind="stable")
                xs, ys = x[o], y[o]
                if np.any((xs[1:] == xs[:-1]) & (ys[1:] <= ys[:-1])):
                    return None
        W[0, ia[live], jb[live]] = factorf[live] if framed else 1.0
        return W, A, B, ia, jb

    def _shared_dense(self, g: FlowGroup) -> _SharedDense | None | bool:
        """A large per-flow group's largest link-disjoint part in dense form (:meth:`_bipartite`)
        over the two blocks of links (``Topology.link_block``, e.g. every NIC's transmit and
        every NIC's receive link) that hold its two link sets, when no other flow of the group
        crosses them, for the solves it shares (None: not per flow, look again later; False:
        none). Spanning whole blocks, the dense parts of different groups share their spans."""
        if not g._cls.identity:
            return None
        if not self.components or g._alive.size < self.dense_min_flows:
            return False
        finite = np.isfinite(self.topology.capacity)
        cflow = K.components(g._links, finite)
        counts = np.bincount(cflow)
        part = int(np.argmax(counts))
        if counts[part] < self.dense_min_flows:
            return False
        if HAVE_NUMBA:  # the part's two finite links, factors and live flags in one pass, no row copies
            ok, a, b, in_a, in_b, fac, live, idx = K.part_two_finite(g._links, cflow, part, int(counts[part]), finite,
                                                                     finite.size, g._factorf, g._alive)
            f = self._bipartite(None, fac, live, (a, b, in_a, in_b)) if ok else None
            del a, b, fac, live
        else:
            inpart = cflow == part
            idx = np.flatnonzero(inpart)
            f = self._bipartite(g._links[idx], g._factorf[idx], g._alive[idx])
        if f is None:
            return False
        W, A, B, ia, jb = f
        topo = self.topology
        a0, nA = topo.link_block(int(A[0]))
        b0, nB = topo.link_block(int(B[0]))
        if A[-1] >= a0 + nA or B[-1] >= b0 + nB or a0 == b0 or nA * nB > self.dense_max_cells:
            return False
        inspan = np.zeros(topo.capacity.size, dtype=bool)
        inspan[a0:a0 + nA] = True
        inspan[b0:b0 + nB] = True
        # the group's other flows stay off both blocks
        if HAVE_NUMBA:
            if K.rest_in_span(g._links, cflow, part, inspan):
                return False
        else:
            rest = ~inpart
            for h in range(g._links.shape[1]):
                if inspan[g._links[rest, h]].any():
                    return False
        del cflow
        if nA != A.size or nB != B.size:  # the part's matrix within the blocks' (zero elsewhere)
            Wf = np.zeros((1, nA, nB))
            Wf[0][np.ix_(A - a0, B - b0)] = W[0]
            W = Wf
            ia = (A - a0)[ia].astype(np.int32)
            jb = (B - b0)[jb].astype(np.int32)
        if HAVE_NUMBA:
            cell = K.cells_of(g._alive.size, idx, ia, jb)
        else:
            cell = np.full((g._alive.size, 2), -1, dtype=np.int32)
            cell[idx, 0] = ia
            cell[idx, 1] = jb
        return _SharedDense(W, a0, b0, cell)

    def _windows(self, t0: int, t1: int) -> np.ndarray:
        """Lengths of the windows between consecutive recomputes from ``t0`` to ``t1``."""
        r = self._recomputes
        i, j = bisect.bisect_left(r, t0), bisect.bisect_left(r, t1)
        return np.diff(np.asarray(r[i:j + 1], dtype=np.float64))

    def _catch_up(self, g: FlowGroup, i: int, t: int) -> None:
        """Drain part ``i`` of ``g`` window by window from its ``t_ref`` to ``t`` (the same
        arithmetic as a drain at every recompute)."""
        c = g._comp
        if t > c.t_ref[i]:
            K.drain(g._alive, g._rem, g._rate, self._windows(int(c.t_ref[i]), t), int(c.starts[i]),
                    int(c.starts[i + 1]))
            c.t_ref[i] = t

    def _recheck_candidates(self, g: FlowGroup) -> None:
        """Before retiring: the candidates of parts that sat out the last recomputes get the
        predictions a re-solve at the last recompute would have made (their remaining bytes
        drained window by window; the rates are the same), so that they retire and arrive at
        the same picoseconds as when every part is solved at every recompute."""
        c = g._comp
        t = self._recomputes[-2]
        now = self._recomputes[-1]
        # a part whose earliest prediction is clearly after now retires nothing (the two
        # predictions differ in their last bits only)
        for i in np.flatnonzero((c.t_ref < t) & (c.tmin <= now * (1.0 + 1e-9) + 1.0)):
            cand = c.cand[i]
            if cand.size:
                rate = g._rate[cand]
                r = g._rem[cand]  # its remaining bytes stay at t_ref: only the predictions move
                for dt in self._windows(int(c.t_ref[i]), t):
                    if dt != 0:
                        r = r - rate * dt
                        r = np.where(r > 0.0, r, 0.0)
                g._pred[cand] = float(t) + r / rate

    def _leave_components(self, g: FlowGroup, t: int) -> None:
        """Bring every part's remaining bytes up to ``t`` (the last recompute) and solve the
        group as a whole from now on."""
        g._comp.materialize(g)
        for i in range(g._comp.starts.size - 1):
            self._catch_up(g, i, t)
        if any(d is not None for d in g._comp.dense):  # its index leaves the dense parts out
            g._index = None
            g._findex = None
        g._comp = False

    def _compact(self, g: FlowGroup) -> None:
        """Drop finished classes (and their flows) from a group's arrays (the index is rebuilt)."""
        if g._comp:  # the lazy rows' flows written back (the flows move)
            g._comp.materialize(g)
        a = g._alive
        cl = g._cls
        keep = a if cl.identity else a[cl.cls]  # flows of live classes
        g._orig = g._orig[keep]
        e_old = g._ends
        e = None
        if e_old is not None and e_old[0] is g._links:  # its flows' int32 ends, without gathering them anew
            e = (e_old[1][keep], e_old[2][keep])
        g._links = np.ascontiguousarray(g._links[keep])
        if e is not None:
            g._ends = (g._links,) + e
        g._acct = np.ascontiguousarray(g._acct[keep])
        g._factorf = g._factorf[keep]
        g._nbf = g._nbf[keep]
        g._lat = g._lat[keep]
        for name in ("_factor", "_nb", "_rem", "_rate", "_pred", "_mult"):
            setattr(g, name, getattr(g, name)[a])
        g._alive = np.ones(int(a.sum()), dtype=bool)
        g._index = None
        g._findex = None
        g._dindex = None
        if g._dense:
            g._dense.cell = g._dense.cell[keep]
        c = g._comp
        if c:  # the parts keep their flows' order; each is brought up to date at its next solve
            c.cflow = c.cflow[keep]
            c.cell = c.cell[keep]
            np.cumsum(np.bincount(c.cflow, minlength=c.dirty.size), out=c.starts[1:])
            c.dirty[:] = True
            c.cand = [np.empty(0, dtype=np.int64)] * c.dirty.size
        if cl.identity:
            g._cls = identity_classes(g._links, cl.lclass_capacity, cl.lclass_wire, iota=self._iota(g._links.shape[0] + 1))
            return
        failed = g._vends is not None and g._vends[0] is cl and g._vends[1] is None
        new_id = np.cumsum(a) - 1
        c = new_id[cl.cls[keep]]
        # the flows by class, stably (a counting pass where compiled: 16.8M flows at 4096 GPUs)
        order = _by_class(c, g._alive.size) if HAVE_NUMBA else np.argsort(c, kind="stable").astype(np.int64)
        starts = np.zeros(g._alive.size + 1, dtype=np.int64)
        np.cumsum(np.bincount(c, minlength=g._alive.size), out=starts[1:])
        g._cls = FlowClasses(cls=c, members=order, starts=starts, q_links=np.ascontiguousarray(cl.q_links[a]),
                             q_weight=np.ascontiguousarray(cl.q_weight[a]), lclass_capacity=cl.lclass_capacity,
                             lclass_wire=cl.lclass_wire, identity=False, vlinks=cl.vlinks,
                             link_class=cl.link_class)
        g._vends = (g._cls, None) if failed else None
        t = g._trep
        if t is not None and t[0] is cl and e is not None and t[1] is e_old[1] and t[2] is e_old[2]:
            g._trep = (g._cls, g._ends[1], g._ends[2], [self._compact_plan(p, a, new_id) for p in t[3]])
        else:
            g._trep = None

    @staticmethod
    def _compact_plan(plan: tuple, alive: np.ndarray, new_id: np.ndarray) -> tuple:
        """A :meth:`_class_traffic` plan carried over a compaction (classes ``alive`` kept, class
        ``c`` renamed ``new_id[c]``): each first endpoint's sequence keeps its live classes, in
        order, renamed. Two endpoints with the same sequence before have the same after, so the
        sets stay sound (perhaps finer than a new search would find: the sums are the same
        additions either way), and a first's sum adds the same rates in the same order (the
        dead classes it skips were skipped before)."""
        rep, first, bounds, seq = plan
        live = alive[seq]
        pos = np.zeros(seq.size + 1, dtype=np.int64)
        np.cumsum(live, out=pos[1:])
        return rep, first, pos[bounds], new_id[seq[live]].astype(seq.dtype)

    def _solve(self, now: int, previous: dict[int, np.ndarray]) -> None:
        groups = self._groups
        base = self._base
        if self._throttle is not None and base is not None and base[0] == self._flow_set:
            # only the throttle's scales changed since the last solve: the unthrottled rates are
            # those of the same problem (the throttled solve gave the groups new arrays)
            self.solves += 1
            self.base_reused += 1
            for g, r in zip(groups, base[1]):
                g._rate = r
            self.solved_classes += base[2]
            self.solved_flows += base[3]
        else:
            counts = (self.solved_classes, self.solved_flows)
            self._solve_links(now, previous)
            self._base = None
            if self._throttle is not None:
                self._base = (self._flow_set, [g._rate for g in groups], self.solved_classes - counts[0],
                              self.solved_flows - counts[1])
        if self._throttle is not None:
            self._throttled_solve(previous)
        if self.on_solve is not None:
            self.on_solve(self)

    def _solve_links(self, now: int, previous: dict[int, np.ndarray]) -> None:
        """The solve of the links alone (unthrottled): rates into each group's ``_rate``."""
        topo = self.topology
        groups = self._groups
        self.solves += 1
        if len(groups) == 1 and g_comp_mode(groups[0], self._throttle):
            g = groups[0]
            c = g._comp
            if g._index is None:  # over the sparse parts' links only (the dense parts keep their W)
                is_dense = np.array([d is not None for d in c.dense])
                dense_link = (c.link_comp >= 0) & is_dense[np.maximum(c.link_comp, 0)]
                g._index = LinkEntries(g._links, g._factor, np.where(dense_link, np.inf, topo.capacity))
                g._index.set_alive(g._alive)
            sparse = c.dirty & np.array([d is None for d in c.dense])
            use = c.link_comp >= 0
            use[use] = sparse[c.link_comp[use]]  # the links of the sparse parts to re-solve
            if use.any():
                level, order = link_levels(g._index, topo.wire, np.where(use, topo.capacity, np.inf))
                c.level[use] = level[use]
                c.order[use] = order[use]
            for i in np.flatnonzero(c.dirty & ~sparse):
                W, WT, A, B = c.dense[i]
                level, order = _fill_dense(W, WT, A, B, topo.capacity)
                c.level[A], c.level[B] = level[:A.size], level[A.size:]
                c.order[A], c.order[B] = order[:A.size], order[A.size:]
            # every live flow's rate is known after it; the solver saw those of the re-solved parts
            self.solved_classes += int(c.nlive[c.dirty].sum())
            self.solved_flows += g._remaining
        elif len(groups) == 1:
            g = groups[0]
            cl = g._cls
            if g._index is None:
                g._index = LinkEntries(cl.q_links, g._factor, cl.lclass_capacity, cl.q_weight)
                g._index.set_alive(g._alive)  # afterwards kept by kill() as classes finish
            level, order = link_levels(g._index, cl.lclass_wire, cl.lclass_capacity)
            if self._throttle is None:  # the rates are derived in _predict's pass over the classes
                g._rate = np.empty(g._alive.size)
                self._levels = (level, order)
            else:
                g._rate = rates_from_levels(cl.q_links, g._alive, level, order)
            self.solved_classes += g._remaining
            self.solved_flows += int(g._mult[g._alive].sum()) if not cl.identity else g._remaining
        elif self._joint_ok(groups) or self._shared_joint(groups, previous):
            self._solve_joint(groups, None)
        else:
            self._solve_shared(previous)

    def _shared_joint(self, groups: list[FlowGroup], previous: dict[int, np.ndarray]) -> bool:
        """Partition several groups' flows together (:meth:`_joint_partition`) for the solve of
        the links alone, where the groups' previous solve was per flow and left them as they
        were (no throttled solve partitioned them, no class split): groups that run together
        for many solves (at 4096 GPUs pairs of 5.6M and 2.1M flows, 250 per-flow solves a run)
        are then solved over their quotient. Their first solve stays per flow, so that a
        throttled solve that caps GPUs partitions them with its caps (as before). The GPUs'
        virtual links are coloured by the latest throttled solve's cap pattern (all unlimited
        where none capped). Returns False, partitioning nothing, without ``aggregate``, below
        ``joint_min_flows`` or ``shared_joint_min_flows`` flows, above
        ``shared_joint_max_groups`` groups, for a group that has taken part in
        ``joint_max_tries`` tries, and where the partition fails (too little symmetry; not
        repeated for the same partitions and pattern)."""
        key = [g._cls for g in groups]
        seen = self._shared_seen
        self._shared_seen = key
        if not self.aggregate or len(groups) > self.shared_joint_max_groups:
            return False
        if seen is None or len(seen) != len(key) or any(a is not b for a, b in zip(seen, key)):
            return False  # their first solve together (or they changed since)
        if sum(g._links.shape[0] for g in groups) < max(self.joint_min_flows, self.shared_joint_min_flows):
            return False
        if any(g._jtries >= self.joint_max_tries for g in groups):
            return False
        E = self.topology.num_endpoints
        if self._caps_seen is None:
            cap_tx = cap_rx = np.full(E, np.inf)
        else:  # (only which are finite matters to the partition)
            cap_tx, cap_rx = (np.where(m, 1.0, np.inf) for m in self._caps_seen)
        pattern = (np.isfinite(cap_tx).tobytes(), np.isfinite(cap_rx).tobytes())
        f = self._joint_fail
        if f is not None and f[1] == pattern and len(f[0]) == len(key) and all(a is b for a, b in zip(f[0], key)):
            return False
        for g in groups:
            g._jtries += 1
        if not self._joint_partition(groups, cap_tx, cap_rx, previous):
            self._joint_fail = (key, pattern)
            return False
        self._shared_seen = None
        self._joint_shared = True
        self.shared_partitions += 1
        return True

    @staticmethod
    def _live_flows(groups: list[FlowGroup]) -> list[np.ndarray]:
        """Per group, the mask over its flows (rows of ``_links``) whose class is still alive."""
        return [g._alive if g._cls.identity else g._alive[g._cls.cls] for g in groups]

    def _solve_shared(self, previous: dict[int, np.ndarray]) -> None:
        topo = self.topology
        groups = self._groups
        # several groups: one per-flow solve over every live flow (their classes were found
        # within each group; other traffic may break that symmetry). The largest group keeps
        # its link index across solves; the others are gathered afresh.
        masks = self._live_flows(groups)
        sizes = [g._links.shape[0] for g in groups]
        big = sizes.index(max(sizes))  # the first of the largest
        gb = groups[big]
        rest = [i for i in range(len(groups)) if i != big]
        # dense parts (an AlltoAllv's NIC flows) join the filling as weight matrices
        dense = self._dense_sets(groups, big) if self.components else None
        if dense is None:
            bindex = self._full_index(gb)
            rc = self._rest_problem([groups[i] for i in rest], None)
        else:  # the indexes leave out the dense links (no other flow crosses them)
            bindex, rc = dense.pop(), self._rest_problem([groups[i] for i in rest], dense[-2:])
            dense = tuple(dense[:4]) + (dense[4][0], dense[4][2])
        alive = np.concatenate([masks[i] for i in rest])
        rb, rates = maxmin_rates_parts(gb._links, gb._factorf, masks[big], bindex, rc["links"], rc["factor"],
                                       topo.wire, topo.capacity, index=rc["index"], alive=alive, dense=dense)
        n_live = int(alive.sum()) + int(masks[big].sum())
        self.solved_classes += n_live
        self.solved_flows += n_live
        full = []  # each group's rates over all its flows (0 where not live)
        pos = 0
        for i, g in enumerate(groups):
            if i == big:
                full.append(rb)
            else:
                full.append(rates[pos : pos + g._links.shape[0]])
                pos += g._links.shape[0]
        self._set_flow_rates(masks, full, previous)

    def _full_index(self, g: FlowGroup) -> LinkEntries:
        """The largest group's per-flow link index for shared solves, kept across them."""
        if g._findex is None:
            same = g._cls.identity and g._index is not None  # its own index is per flow already
            g._findex = g._index if same else LinkEntries(g._links, g._factorf, self.topology.capacity)
        return g._findex

    def _rest_problem(self, groups: list[FlowGroup], dense: tuple | None) -> dict[str, Any]:
        """Every flow (live or not) of the groups solved beside the largest one, with its link
        index, kept while those groups and their arrays stay the same: between solves only
        which flows are live changes, and an index's dead flows add exact zeros and are skipped,
        so the rates equal those of a problem built from the live flows alone. ``dense``: (the
        dense links' spans, whether a group of ``groups`` has a dense part); the index then
        leaves those links out."""
        key = [(g, g._links) for g in groups]
        c = self._rcache
        if c is not None and c["dense"] == dense and len(c["key"]) == len(key) and all(
                a is b and x is y for (a, x), (b, y) in zip(c["key"], key)):
            return c
        topo = self.topology
        links = np.ascontiguousarray(np.concatenate([g._links for g in groups], axis=0))
        factor = np.concatenate([g._factorf for g in groups])
        cap = self._without_spans(dense[0]) if dense is not None and dense[1] else topo.capacity
        self._rcache = {"key": key, "dense": dense, "links": links, "factor": factor,
                        "index": LinkEntries(links, factor, cap)}
        return self._rcache

    def _without_spans(self, spans: tuple[int, int, int, int]) -> np.ndarray:
        """The capacities with the links of two ranges ``(a0, nA, b0, nB)`` taken as infinite."""
        a0, nA, b0, nB = spans
        cap = self.topology.capacity.copy()
        cap[a0:a0 + nA] = np.inf
        cap[b0:b0 + nB] = np.inf
        return cap

    def _dense_forms(self, groups: list[FlowGroup]) -> tuple[list, tuple[int, int, int, int]] | None:
        """Each group's dense part (:class:`_SharedDense`, or None) and their common link spans,
        when every dense part spans the same two link ranges and no other flow crosses them;
        else None (the solve is all sparse, with the same result)."""
        for g in groups:
            if g._dense is None and g._alive.size >= self.dense_min_flows:
                g._dense = self._shared_dense(g)
        forms = [g._dense if g._dense else None for g in groups]
        have = [f for f in forms if f is not None]
        if not have:
            return None
        spans = have[0].spans
        if any(f.spans != spans for f in have):
            return None
        a0, nA, b0, nB = spans
        for g, f in zip(groups, forms):
            if f is not None:
                continue
            if g._span is None or g._span[0] != spans or g._span[1] is not g._links:
                inspan = np.zeros(self.topology.capacity.size, dtype=bool)
                inspan[a0:a0 + nA] = True
                inspan[b0:b0 + nB] = True
                hit = False
                for h in range(g._links.shape[1]):
                    if inspan[g._links[:, h]].any():
                        hit = True
                        break
                g._span = (spans, g._links, hit)
            if g._span[2]:
                return None
        return forms, spans

    def _dense_sets(self, groups: list[FlowGroup], big: int) -> list | None:
        """For a solve of several groups: their dense parts (:class:`_SharedDense`) as the
        filling's dense sets, when every dense part spans the same two link ranges and no
        other flow crosses them (else None: the solve is all sparse, with the same result).
        Returns [Wa, WTa, Wb, WTb, spans, whether the others have a dense part, the largest
        group's index without the dense links]."""
        found = self._dense_forms(groups)
        if found is None:
            return None
        forms, spans = found
        a0, nA, b0, nB = spans
        gb = groups[big]
        fb = forms[big]
        none = np.zeros((0, nA, nB))
        rest = [f for i, f in enumerate(forms) if i != big and f is not None]
        if len(rest) > 1:
            Wb, WTb = np.concatenate([f.W for f in rest]), np.concatenate([f.WT for f in rest])
        elif rest:
            Wb, WTb = rest[0].W, rest[0].WT
        else:
            Wb, WTb = none, np.zeros((0, nB, nA))
        if fb is None:  # its flows cross no dense link: its usual index
            bindex = self._full_index(gb)
        else:
            if gb._dindex is None:
                gb._dindex = LinkEntries(gb._links, gb._factorf, self._without_spans(spans))
            bindex = gb._dindex
        Wa, WTa = (fb.W, fb.WT) if fb is not None else (none, np.zeros((0, nB, nA)))
        return [Wa, WTa, Wb, WTb, spans, bool(rest), bindex]

    def _set_flow_rates(self, masks: list[np.ndarray], full: list[np.ndarray], previous: dict[int, np.ndarray]) -> None:
        """Install per-flow rates ``full[i]`` (over every flow of group ``i``, 0 where not live;
        ``masks[i]`` its live flows); a class whose flows got different rates is refined by
        (class, rate), its state moving over."""
        topo = self.topology
        for g, m, ff in zip(self._groups, masks, full):
            cl = g._cls
            a = g._alive
            if cl.identity:  # one class per flow: the solve's rates as they are (0 for the dead)
                g._rate = ff
                continue
            fr = ff[m]
            c = cl.cls[m]
            rate = np.zeros(a.size)
            rate[c] = fr
            if np.array_equal(rate[c], fr):
                g._rate = rate
                continue
            # the class's flows got different rates: the group goes on per flow (its state moves
            # over; refining again costs more than it saves while other traffic keeps breaking it)
            self.splits += 1
            self._flow_set += 1
            flow_rate = np.full(cl.cls.size, -1.0)
            flow_rate[m] = fr
            new = identity_classes(g._links, topo.capacity, topo.wire, iota=self._iota(g._links.shape[0] + 1))
            old_rate = previous.get(id(g))
            rep_old = cl.cls  # (the new classes are the flows)
            self._set_classes(g, new, cl)
            g._remaining = int(g._alive.sum())
            g._rate = flow_rate.clip(min=0.0)
            if old_rate is not None:
                previous[id(g)] = old_rate[rep_old]

    def _throttled_solve(self, previous: dict[int, np.ndarray]) -> None:
        """Second, per-flow solve with each GPU's sends/receives capped by the throttle's scale."""
        topo = self.topology
        R = topo.num_gpus
        groups = self._groups
        flows = self._throttle_flows(groups)
        same = self._base is not None and self._base[0] == self._flow_set  # the unthrottled rates' problem
        if same and self._sums is not None and self._sums[0] == self._flow_set:
            tx, rx = self._sums[1].copy(), self._sums[2].copy()  # sums of the same rates
        else:
            tx = np.zeros(topo.num_endpoints)
            rx = np.zeros(topo.num_endpoints)
            self._traffic_sums(groups, flows, tx, rx)
            tx, rx = tx[:R], rx[:R]
            self._sums = (self._flow_set, tx.copy(), rx.copy()) if same else None
        scale = self._throttle(tx, rx)
        self._caps_seen = None
        if scale is None:
            return
        scale = np.asarray(scale, dtype=np.float64)
        if scale.shape != (R,):
            raise ValueError(f"throttle: expected {R} scales, got shape {scale.shape}")
        # (clipped to [1e-9, 1]: a stalled GPU, no SMs yet, keeps a trickle)
        cap_tx, cap_rx, fin_tx, fin_rx, capped = (_throttle_caps_nb if HAVE_NUMBA else _throttle_caps_np)(
            scale, tx, rx, topo.num_endpoints)
        if not capped:
            return
        self._caps_seen = (fin_tx, fin_rx)
        if len(groups) == 1 and not groups[0]._cls.identity:
            if self._throttled_classes(groups[0], cap_tx, cap_rx, previous):
                self.throttled_by_class += 1
                return
            self.throttled_per_flow += 1
        elif len(groups) > 1 and self.aggregate:
            if self._throttled_joint(groups, cap_tx, cap_rx, previous):
                self.throttled_by_class += 1
                return
        masks = self._live_flows(groups)
        capacity = np.concatenate([topo.capacity, cap_tx, cap_rx])
        dense = self._throttle_dense(flows, groups) if self.components else None
        if "index" not in flows:
            self._throttle_index(flows, groups, dense)
        alive = np.concatenate(masks)
        rates = self._disjoint_rates(flows, capacity, alive) if dense is None else None
        if rates is None:
            rates = maxmin_rates_fm(flows["links"], flows["factor"], flows["wire"], capacity, alive=alive,
                                    index=flows["index"], dense=None if dense is None else self._dense_args(*dense))
        else:
            self.throttled_disjoint += 1
        n_live = int(alive.sum())
        self.solved_classes += n_live
        self.solved_flows += n_live
        full, pos = [], 0
        for g in groups:
            full.append(rates[pos : pos + g._links.shape[0]])
            pos += g._links.shape[0]
        self._set_flow_rates(masks, full, previous)

    def _disjoint_rates(self, flows: dict[str, Any], capacity: np.ndarray, alive: np.ndarray) -> np.ndarray | None:
        """The throttled per-flow solve's rates (``maxmin_rates_fm``'s, bit for bit) where its
        flows are link-disjoint: no link that can saturate (a finite topology link, a GPU's
        virtual link) holds two (flow, hop) entries (a hierarchical AllReduce's ring step at
        1024 GPUs: each GPU sends one message on a link of its own; 5,776 of the 6,867
        throttled solves of model-a-1024's two iterations). None where that does not hold, or
        where two distinct shares tie: the general filling runs then.

        Why this is the filling's result: a link's load is its one flow's weight (the factor on
        a framed link, else 1), so its share is ``capacity / weight``, and it changes only when
        its own flow freezes (it then has no flow left). A round of the filling freezes, at the
        least share ``s`` left, every link within ``s * (1 + 1e-12)`` of it; where no two
        distinct shares of live flows are that close, each round holds one share value, and
        every flow freezes at its least share: its rate. Structure found once per flow set
        (kept with ``flows``)."""
        d = flows.get("disjoint")
        if d is None:
            topo = self.topology
            links = flows["links"]
            can = np.concatenate([np.isfinite(topo.capacity), np.ones(2 * topo.num_endpoints, dtype=bool)])
            d = False
            if np.bincount(links[can[links]], minlength=can.size).max(initial=0) <= 1:
                lt = np.ascontiguousarray(links.T)  # (H, F): a hop's links and weights contiguous
                d = (lt, np.where(flows["wire"][lt], flows["factor"][None, :], 1.0))
            flows["disjoint"] = d
        if d is False:
            return None
        lt, wt = d
        if lt.shape[0]:  # shares, their least per flow, the tie check: one compiled pass
            tie, rates = K.disjoint_shares(lt, wt, capacity, alive, _REL_TOL)
            return None if tie else rates
        share = capacity[lt]  # each entry's link's share (inf: unlimited), hop by hop
        share /= wt
        m = share.min(axis=0)
        s = m[alive]
        s.sort()
        lo, hi = s[:-1], s[1:]
        if ((hi > lo) & (hi <= lo * (1.0 + _REL_TOL))).any():  # a tie between distinct shares
            return None
        return np.where(alive, m, 0.0)

    #: virtual links of one class whose capacities agree within this relative difference are
    #: solved at the smallest (the GPUs' sums of equal class rates differ in rounding only)
    endpoint_cap_rel = 1e-9

    def _with_endpoints(self, g: FlowGroup) -> FlowClasses | None:
        """An aggregated group's classes with the endpoints' virtual links added, when they need
        no refinement: endpoints that send (receive) the same number of flows of each class form
        a class of virtual links, and every flow class must send from (receive at) one such class
        -- then the partition is already equitable with them (what ``equitable_classes(...,
        ends=...)`` would return, found in one pass over the flows; a symmetric AlltoAll). None
        where a class spans two endpoint classes (the refinement is needed)."""
        cl = g._cls
        C = cl.n_classes
        E = self.topology.num_endpoints
        K1 = cl.lclass_capacity.size  # the link classes and the pad; the virtual classes follow
        cols, weights, per_end = [], [], []
        base = K1
        for ends in self._flow_ends(g):
            uk, cnt = _unique_counts(ends.astype(np.int64) * C + cl.cls)
            ep, c = uk // C, uk % C  # per endpoint (ascending), its classes and their flows
            bounds = np.searchsorted(ep, np.arange(E + 1))
            pairs = np.stack([c, cnt], axis=1)
            sig: dict[bytes, int] = {}
            of = np.empty(E, dtype=np.int64)
            for i in range(E):  # endpoints with the same (class, flows) pairs share a class
                of[i] = sig.setdefault(pairs[bounds[i]:bounds[i + 1]].tobytes(), len(sig))
            per_flow = of[ends]
            v = np.zeros(C, dtype=np.int64)
            v[cl.cls] = per_flow
            if not np.array_equal(v[cl.cls], per_flow):  # a class spans two endpoint classes
                return None
            w = np.zeros(C)
            w[c] = cnt  # the same at every endpoint of the class's endpoint class
            cols.append(base + v)
            weights.append(w)
            per_end.append(base + of)
            base += len(sig)
        n_v = base - K1
        q_links = np.concatenate([cl.q_links, cols[0][:, None], cols[1][:, None]], axis=1).astype(cl.q_links.dtype)
        return FlowClasses(cls=cl.cls, members=cl.members, starts=cl.starts, q_links=np.ascontiguousarray(q_links),
                           q_weight=np.concatenate([cl.q_weight, weights[0][:, None], weights[1][:, None]], axis=1),
                           lclass_capacity=np.concatenate([cl.lclass_capacity, np.full(n_v, np.inf)]),
                           lclass_wire=np.concatenate([cl.lclass_wire, np.zeros(n_v, dtype=bool)]), identity=False,
                           vlinks=(per_end[0], per_end[1]), link_class=cl.link_class)

    def _throttled_classes(self, g: FlowGroup, cap_tx: np.ndarray, cap_rx: np.ndarray,
                           previous: dict[int, np.ndarray]) -> bool:
        """The throttled solve of a lone aggregated group over its classes (``cap_tx``,
        ``cap_rx``: each endpoint's virtual link capacities, inf where unlimited).

        Its classes are first refined with the endpoints' virtual links in the flow-link graph
        (``equitable_classes(..., ends=...)``, once per partition; the state moves over as when
        other traffic splits a class). They are then an equitable partition of the throttled
        problem wherever each virtual link class has one capacity, and its quotient gives every
        flow its max-min rate (:mod:`sim.network.classes`). Returns False, solving nothing, when
        the refinement finds too little symmetry (``max_fraction``) or the capacities within a
        virtual link class differ (GPUs of one class capped differently): the per-flow solve
        runs then, and splits the classes whose flows get different rates."""
        cl = g._cls
        if cl.vlinks is None:
            if g._vends is not None and g._vends[0] is cl:  # refined before: too little symmetry
                return False
            topo = self.topology
            new = self._with_endpoints(g)
            if new is None:
                new = equitable_classes(g._links, cl.cls, topo.capacity, topo.wire,
                                        ends=(*self._flow_ends(g), topo.num_endpoints))
            if new.identity:
                g._vends = (cl, None)
                return False
            old_rate = previous.get(id(g))
            rep_old = cl.cls[new.members[new.starts[:-1]]]
            self._set_classes(g, new, cl)
            g._remaining = int(g._alive.sum())
            if old_rate is not None:
                previous[id(g)] = old_rate[rep_old]
            self._flow_set += 1
            cl = new
        capacity = self._class_caps(cl, cap_tx, cap_rx)
        if capacity is None:
            return False
        if g._vends is None or g._vends[0] is not cl or g._vends[1] is None:
            g._vends = (cl, LinkEntries(cl.q_links, g._factor, self._finite_vlinks(cl), cl.q_weight))
        index = g._vends[1]
        index.update_alive(g._alive)
        level, order = link_levels(index, cl.lclass_wire, capacity)
        g._rate = rates_from_levels(cl.q_links, g._alive, level, order)
        self.solved_classes += g._remaining
        self.solved_flows += int(g._mult[g._alive].sum())
        return True

    def _class_caps(self, cl: FlowClasses, cap_tx: np.ndarray, cap_rx: np.ndarray) -> np.ndarray | None:
        """The capacity of every link class of ``cl`` (classes with ``vlinks``) under the
        endpoints' virtual link capacities ``cap_tx``, ``cap_rx`` (inf: unlimited): a virtual
        link class takes the smallest of its links' (they agree within ``endpoint_cap_rel``:
        sums of equal class rates may differ in rounding). None where two links of one class
        differ by more (GPUs of one class capped differently): the partition is not equitable
        for that problem."""
        capacity = cl.lclass_capacity.copy()
        for cap, of in zip((cap_tx, cap_rx), cl.vlinks):
            lo = np.full(capacity.size, np.inf)
            hi = np.full(capacity.size, -np.inf)
            np.minimum.at(lo, of, cap)
            np.maximum.at(hi, of, cap)
            if np.any(hi > lo * (1.0 + self.endpoint_cap_rel)):  # (inf > inf is False: unlimited agree)
                return None
            used = np.isfinite(lo)
            capacity[used] = lo[used]
        return capacity

    @staticmethod
    def _finite_vlinks(cl: FlowClasses) -> np.ndarray:
        """``cl``'s link class capacities with every virtual link class taken as finite: an index
        built on them has entries on every virtual link; one left unlimited in a solve is never
        processed and only collects load nobody reads (the same rates)."""
        finite = cl.lclass_capacity.copy()
        finite[cl.vlinks[0]] = 1.0
        finite[cl.vlinks[1]] = 1.0
        return finite

    # ------------------------------------------------------------ joint classes of groups
    def _joint_ok(self, groups: list[FlowGroup]) -> bool:
        """Whether every group of ``groups`` holds classes of the latest joint partition
        (:meth:`_joint_partition`): whole classes of one equitable partition of their flows
        together, so that their quotient is the problem of these groups together."""
        lc = self._joint_lc
        return lc is not None and all(not g._cls.identity and g._cls.link_class is lc for g in groups)

    def _solve_joint(self, groups: list[FlowGroup], capacity: np.ndarray | None) -> None:
        """Rates of several groups over their joint classes (:meth:`_joint_ok`): one quotient
        problem over all their classes (their link classes are shared), its index kept while
        the groups' partitions stay the same. ``capacity``: per link class (the throttled
        problem, :meth:`_class_caps`); None: the links alone (virtual link classes unlimited)."""
        key = [g._cls for g in groups]
        j = self._joint_index
        if j is None or len(j[0]) != len(key) or any(a is not b for a, b in zip(j[0], key)):
            q_links = np.ascontiguousarray(np.concatenate([c.q_links for c in key]))
            weight = np.concatenate([c.q_weight for c in key])
            factor = np.concatenate([g._factor for g in groups])
            j = self._joint_index = (key, q_links, LinkEntries(q_links, factor, self._finite_vlinks(key[0]), weight))
        _, q_links, index = j
        alive = np.concatenate([g._alive for g in groups])
        index.update_alive(alive)
        cl = key[0]
        level, order = link_levels(index, cl.lclass_wire, cl.lclass_capacity if capacity is None else capacity)
        rates = rates_from_levels(q_links, alive, level, order)
        pos = 0
        for g in groups:
            n = g._alive.size
            g._rate = rates[pos:pos + n]
            pos += n
            self.solved_flows += int(g._mult[g._alive].sum())
        self.solved_classes += int(alive.sum())
        self.joint_solves += 1

    def _throttled_joint(self, groups: list[FlowGroup], cap_tx: np.ndarray, cap_rx: np.ndarray,
                         previous: dict[int, np.ndarray]) -> bool:
        """The throttled solve of several groups over joint classes: a partition of their flows
        together (:meth:`_joint_partition`, found at the first throttled solve that needs it and
        kept while the groups run together; the unthrottled solves use it too), whose virtual
        link classes must each have one capacity (:meth:`_class_caps`). Returns False, solving
        nothing, where that fails (the per-flow solve runs then, and splits classes whose flows
        get different rates): too few flows to pay for a partition (``joint_min_flows``), a group
        that has taken part in ``joint_max_tries`` attempts, too little symmetry, or GPUs of
        one class capped differently (an attempt that failed is not repeated for the same
        partitions and cap pattern). A partition the links' solve made (:meth:`_shared_joint`,
        for the latest caps it had seen) whose virtual link classes need two capacities under
        these caps is partitioned again with them (its classes refined)."""
        pattern = (np.isfinite(cap_tx).tobytes(), np.isfinite(cap_rx).tobytes())
        if self._joint_ok(groups):
            capacity = self._class_caps(groups[0]._cls, cap_tx, cap_rx)
            if capacity is not None:
                self._solve_joint(groups, capacity)
                return True
            if not self._joint_shared:
                return False
            # the links' solve partitioned them for other caps (_shared_joint): again for these
        if sum(g._links.shape[0] for g in groups) < self.joint_min_flows:
            return False
        if any(g._jtries >= self.joint_max_tries for g in groups):
            return False
        key = [g._cls for g in groups]
        f = self._joint_fail
        if f is not None and f[1] == pattern and len(f[0]) == len(key) and all(a is b for a, b in zip(f[0], key)):
            return False  # tried for these partitions and this cap pattern
        for g in groups:
            g._jtries += 1
        if not self._joint_partition(groups, cap_tx, cap_rx, previous):
            self._joint_fail = (key, pattern)
            return False
        capacity = self._class_caps(groups[0]._cls, cap_tx, cap_rx)
        if capacity is None:
            return False
        self._solve_joint(groups, capacity)
        return True

    def _joint_partition(self, groups: list[FlowGroup], cap_tx: np.ndarray, cap_rx: np.ndarray,
                         previous: dict[int, np.ndarray]) -> bool:
        """Partition the flows of ``groups`` together, with the endpoints' virtual links
        (``equitable_classes(..., ends=...)``, the links of capped and of unlimited GPUs apart),
        and install each group's part as its classes, its state moving over. Flows start
        coloured by group and class (a per-flow group: by size, and whether live), so no class
        spans two groups; a class is installed only where all its flows have the same state
        (bytes left, size, factor, the rate of the last window, live), else the flows are
        coloured by their state too and partitioned again. Returns False, installing nothing,
        where the partition finds too little symmetry or a virtual link class would need two
        capacities (:meth:`_class_caps`). At a million flows this costs about a quarter of a
        CPU second, a few of the per-flow throttled solves it replaces."""
        topo = self.topology
        E = topo.num_endpoints
        sizes = [g._links.shape[0] for g in groups]
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        colour, off = np.empty(int(bounds[-1]), dtype=np.int64), 0
        checks = []  # (group, its per-flow state) where flows start coloured by size, not class
        for i, g in enumerate(groups):
            part = colour[bounds[i]:bounds[i + 1]]  # (written in place: no flow-sized temporaries)
            if g._cls.identity:
                np.multiply(_dense(g._nbf)[0], 2, out=part)
                part += g._alive
                prev = previous.get(id(g))
                checks.append((i, [g._rem, g._factorf] + ([prev] if prev is not None else [])))
            else:  # a class's flows share their state already
                part[:] = g._cls.cls
            part += off
            off = int(part.max()) + 1
        links = np.ascontiguousarray(np.concatenate([g._links for g in groups]))
        ends32 = [self._ends32(g) for g in groups]  # (int32: the same endpoint ids)
        src = np.concatenate([s for s, _ in ends32])
        dst = np.concatenate([d for _, d in ends32])
        del ends32
        ends = (src, dst, E, np.isfinite(cap_tx).astype(np.int64), np.isfinite(cap_rx).astype(np.int64))
        for attempt in range(2):
            cl = self._joint_classes(links, colour, ends)
            if cl.identity or self._class_caps(cl, cap_tx, cap_rx) is None:
                return False
            rep = cl.members[cl.starts[:-1]]  # a flow of each class
            agree = True
            for i, state in checks:
                r = rep[cl.cls[bounds[i]:bounds[i + 1]]] - bounds[i]  # each flow's class's flow
                agree = all(np.array_equal(a, a[r]) for a in state)
                if not agree:
                    break
            if agree:
                break
            if attempt:  # pragma: no cover - the state is in the colours: every class agrees
                return False
            cols = [colour]
            for i, state in checks:
                for k, a in enumerate(state):
                    while len(cols) <= k + 1:
                        cols.append(np.zeros(colour.size, dtype=np.int64))
                    cols[k + 1][bounds[i]:bounds[i + 1]] = a.view(np.int64)
            colour = np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)[1].ravel()
        group_of = np.searchsorted(bounds, rep, side="right") - 1  # each class's group
        for i, g in enumerate(groups):
            ids = np.flatnonzero(group_of == i)  # its classes, in order
            local = np.full(cl.n_classes, -1, dtype=np.int64)
            local[ids] = np.arange(ids.size)
            c = local[cl.cls[bounds[i]:bounds[i + 1]]]
            members = _by_class(c, ids.size) if HAVE_NUMBA else np.argsort(c, kind="stable")
            starts = np.zeros(ids.size + 1, dtype=np.int64)
            np.cumsum(np.bincount(c, minlength=ids.size), out=starts[1:])
            new = FlowClasses(cls=c, members=members, starts=starts, q_links=np.ascontiguousarray(cl.q_links[ids]),
                              q_weight=np.ascontiguousarray(cl.q_weight[ids]), lclass_capacity=cl.lclass_capacity,
                              lclass_wire=cl.lclass_wire, identity=False, vlinks=cl.vlinks, link_class=cl.link_class)
            old = g._cls
            o = old.cls[members[starts[:-1]]]
            self._set_classes(g, new, old)
            g._remaining = int(g._alive.sum())
            if id(g) in previous:
                previous[id(g)] = previous[id(g)][o]
            g._findex = g._dindex = g._span = g._vends = None
            g._dense = None
            g._comp = False
        self._joint_lc = cl.link_class
        self._joint_shared = False
        self._flow_set += 1
        self.joint_partitions += 1
        return True

    def _joint_classes(self, links: np.ndarray, colour: np.ndarray, ends: tuple) -> FlowClasses:
        """``equitable_classes(links, colour, capacity, wire, ends=ends)`` over the topology's
        links, taken from one of the latest ``joint_memo_entries`` calls where every input is
        the same: a training iteration repeats its collectives side by side, so the joint
        partitions of a run's second iteration (at 4096 GPUs: the input AlltoAllv beside an
        intra-node one, 3.5-4 CPU-s; two pairs of about 5.6M and 2.1M flows, and one pair
        that has too little symmetry, about 4.5 CPU-s together) would refine the same colours
        again. The inputs are compared by a SHA-256 digest of their dtypes, shapes and bytes
        (0.2-0.3 s for the 16.8M flows at 4096 GPUs, where keeping them to compare would hold
        about 0.5 GB); the refinement is a function of them alone. A result with too little
        symmetry is kept as None (no arrays) and given again as one class per flow (its
        caller reads only that). A reused result is a new :class:`FlowClasses` over the same
        arrays (never written: a change replaces an array) with its own ``link_class`` array:
        that array is the token by which :meth:`_joint_ok` tells a partition's groups apart
        from an earlier one's."""
        topo = self.topology
        h = hashlib.sha256()
        for a in (links, colour, topo.capacity, topo.wire, *ends):
            a = np.ascontiguousarray(a)
            h.update(f"{a.dtype.str}{a.shape};".encode())
            h.update(a.view(np.uint8).ravel() if a.ndim else a.tobytes())
        key = h.digest()
        memo = self._joint_memo
        if key in memo:
            self.joint_memo_hits += 1
            cl = memo.pop(key)
            memo[key] = cl  # (the latest used last)
            if cl is None:
                return identity_classes(links, topo.capacity, topo.wire, iota=self._iota(links.shape[0] + 1))
            return dataclasses.replace(cl, link_class=None if cl.link_class is None else cl.link_class.copy())
        cl = equitable_classes(links, colour, topo.capacity, topo.wire, ends=ends)
        memo[key] = None if cl.identity else cl
        while len(memo) > self.joint_memo_entries:
            del memo[next(iter(memo))]
        return cl

    #: groups of at most this many flows, one class per flow, are summed together by
    #: :meth:`_traffic_sums` when they follow one another
    small_group_flows = 64

    def _traffic_sums(self, groups: list[FlowGroup], flows: dict[str, Any], tx: np.ndarray, rx: np.ndarray) -> None:
        """Add every live flow's rate to ``tx[src]`` and ``rx[dst]``, flow by flow in group order.
        A run of small one-class-per-flow groups (a rank's lone copy each) is summed by one
        compiled call over their flows in the same order: the same sums, without a call per
        group (a thousand per solve at 1024 GPUs)."""
        small = self.small_group_flows
        run: list[tuple[FlowGroup, np.ndarray, np.ndarray]] = []

        def flush() -> None:
            if len(run) == 1:
                g, s, d = run[0]
                K.traffic(s, d, g._cls.cls, True, g._alive, g._rate, tx, rx)
            elif run:
                K.traffic(np.concatenate([s for _, s, _ in run]), np.concatenate([d for _, _, d in run]), _NO_CLS,
                          True, np.concatenate([g._alive for g, _, _ in run]),
                          np.concatenate([g._rate for g, _, _ in run]), tx, rx)
            run.clear()

        for g, (s, d) in zip(groups, flows["parts"]):
            n = s.size
            if g._cls.identity and n <= small:
                run.append((g, s, d))
                continue
            flush()
            if g._cls.identity or n < self.class_traffic_min_flows or not self._class_traffic(g, s, d, tx, rx):
                (_traffic_runs if HAVE_NUMBA else K.traffic)(s, d, g._cls.cls, g._cls.identity, g._alive, g._rate,
                                                             tx, rx)
        flush()

    #: aggregated groups of at least this many flows sum their traffic by endpoint sequence
    #: (:meth:`_class_traffic`); fewer, or without numba: flow by flow
    class_traffic_min_flows = 1 << 16 if HAVE_NUMBA else 1 << 62

    def _class_traffic(self, g: FlowGroup, s: np.ndarray, d: np.ndarray, tx: np.ndarray, rx: np.ndarray) -> bool:
        """``K.traffic`` of an aggregated group, bit for bit, at a fraction of the cost: each
        endpoint's sum adds its flows' class rates in flow order, so endpoints whose flows, in
        flow order, are of the same classes (the GPUs of one node in an AlltoAllv whose sizes go
        by destination node: a class per pair of nodes) and whose sums start equal end equal;
        one endpoint of each such set (its first) is summed flow by flow and the others take its
        sum. The sets are found once per partition (a hash of each endpoint's class sequence,
        then an element-by-element comparison) and carried over its compactions
        (:meth:`_compact_plan`). Returns False, adding nothing, where two
        endpoints of a set start from different sums (other groups' traffic came first): the
        caller sums flow by flow."""
        cl = g._cls
        t = g._trep
        if t is None or t[0] is not cl or t[1] is not s or t[2] is not d:
            E = tx.size
            plans = []
            for ends in (s, d):
                order = _by_class(ends.astype(np.int64), E)
                starts = np.zeros(E + 1, dtype=np.int64)
                np.cumsum(np.bincount(ends, minlength=E), out=starts[1:])
                rep = K.sequence_reps(order, starts, cl.cls)
                first = np.flatnonzero(rep == np.arange(E))
                # the first endpoints' flows' classes, endpoint by endpoint in flow order (read in turn)
                count = starts[first + 1] - starts[first]
                bounds = np.zeros(first.size + 1, dtype=np.int64)
                np.cumsum(count, out=bounds[1:])
                at = np.repeat(starts[first] - bounds[:-1], count) + np.arange(bounds[-1])
                seq = cl.cls[order[at]]
                plans.append((rep, first, bounds, seq.astype(np.int32) if cl.n_classes < 2**31 else seq))
            t = g._trep = (cl, s, d, plans)
        for acc, (rep, first, bounds, seq) in zip((tx, rx), t[3]):
            if not np.array_equal(acc, acc[rep]):
                return False
        for acc, (rep, first, bounds, seq) in zip((tx, rx), t[3]):
            K.traffic_firsts(first, bounds, seq, g._alive, g._rate, acc)
            acc[:] = acc[rep]
        self.traffic_by_sequence += 1
        return True

    def _throttle_flows(self, groups: list[FlowGroup]) -> dict[str, Any]:
        """Sources and destinations of every flow of ``groups`` (live or not), per group
        (``parts``), kept while the groups and their arrays stay the same (later solves differ
        only in the live flows)."""
        key = [(g, g._links) for g in groups]
        c = self._tcache
        if c is not None and len(c["key"]) == len(key) and all(
                a is b and x is y for (a, x), (b, y) in zip(c["key"], key)):
            return c
        # int32 (endpoint ids): the per-solve traffic sums read them for every flow. Each
        # group keeps its own while its arrays stay the same (lone messages come and go at
        # every solve at 1024 GPUs: the set changes, the groups in it mostly do not)
        parts = [self._ends32(g) for g in groups]
        # (their concatenation only where a per-flow throttled solve needs it, _throttle_index:
        # two copies of an AlltoAllv's 16.8M ends at every change of the set, at 4096 GPUs)
        self._tcache = {"key": key, "parts": parts}
        return self._tcache

    def _throttle_dense(self, flows: dict[str, Any], groups: list[FlowGroup]) -> tuple | None:
        """The throttled solve's dense sets (``maxmin.link_levels``): the groups' dense parts
        (:meth:`_dense_forms`) in group order, each flow also on its source GPU's transmit and
        its destination GPU's receive link, when every row of the matrices has one source GPU
        and every column one destination (one NIC per GPU). Kept with ``flows``; None: sparse."""
        if "dense" in flows:
            return flows["dense"]
        flows["dense"] = None
        found = self._dense_forms(groups)
        if found is None:
            return None
        forms, spans = found
        a0, nA, b0, nB = spans
        topo = self.topology
        base = topo.capacity.size
        endpoints = topo.num_endpoints
        va = np.full(nA, -1, dtype=np.int64)
        vb = np.full(nB, -1, dtype=np.int64)
        for g, f in zip(groups, forms):
            if f is None:
                continue
            on = f.cell[:, 0] >= 0
            src = g.src[g._orig[on]] + base
            dst = g.dst[g._orig[on]] + base + endpoints
            for v, c, x in ((va, f.cell[on, 0], src), (vb, f.cell[on, 1], dst)):
                prev = v[c]
                v[c] = x
                if np.any(v[c] != x) or np.any((prev >= 0) & (prev != x)):  # a row (column) with
                    return None  # two source (destination) GPUs
        # a row or column without flows (a NIC the parts leave idle) names the scratch link:
        # its cells are 0, so it only ever takes off exact zeros there
        va[va < 0] = base + 2 * endpoints
        vb[vb < 0] = base + 2 * endpoints
        flows["dense"] = ([f for f in forms if f is not None], a0, b0, va, vb)
        return flows["dense"]

    @staticmethod
    def _dense_args(forms: list[_SharedDense], a0: int, b0: int, va: np.ndarray, vb: np.ndarray) -> tuple:
        """``maxmin.link_levels``'s dense sets for the throttled solve: the first part, then the
        others (copied together when there are more than two; the matrices change between
        solves as flows finish, so a copy is never kept)."""
        Wa, WTa = forms[0].W, forms[0].WT
        if len(forms) == 1:
            Wb, WTb = np.zeros((0,) + Wa.shape[1:]), np.zeros((0,) + WTa.shape[1:])
        elif len(forms) == 2:
            Wb, WTb = forms[1].W, forms[1].WT
        else:
            Wb, WTb = np.concatenate([f.W for f in forms[1:]]), np.concatenate([f.WT for f in forms[1:]])
        return Wa, WTa, Wb, WTb, a0, b0, va, vb

    def _throttle_index(self, flows: dict[str, Any], groups: list[FlowGroup], dense: tuple | None = None) -> None:
        """The throttled solve's problem over ``flows`` (:meth:`_throttle_flows`): each flow's
        links plus its two virtual links (GPU ``i``'s transmit at ``L + 1 + i``, receive at
        ``L + 1 + endpoints + i``), its factor, and their link index. The index takes every
        virtual link as finite; one left unlimited (capacity inf) in a solve is never processed
        and only collects load nobody reads, so the rates equal those of an index built for
        that solve's capacities and live flows alone."""
        topo = self.topology
        endpoints = topo.num_endpoints
        base = topo.capacity.size
        dt = groups[0]._links.dtype
        src = np.concatenate([s for s, _ in flows["parts"]])
        dst = np.concatenate([d for _, d in flows["parts"]])
        links = np.ascontiguousarray(np.concatenate([np.concatenate([g._links for g in groups], axis=0),
                                                     (base + src)[:, None].astype(dt),
                                                     (base + endpoints + dst)[:, None].astype(dt)], axis=1))
        factor = np.concatenate([g._factorf for g in groups])
        finite = np.concatenate([topo.capacity, np.ones(2 * endpoints)])
        skip = None
        if dense is not None:  # the dense links get no entries (the matrices stand for them)
            skip = np.zeros(finite.size, dtype=bool)
            forms, a0, b0 = dense[:3]
            skip[a0:a0 + forms[0].W.shape[1]] = True
            skip[b0:b0 + forms[0].W.shape[2]] = True
        flows.update(links=links, factor=factor, index=LinkEntries(links, factor, finite, skip=skip),
                     wire=np.concatenate([topo.wire, np.zeros(2 * endpoints, dtype=bool)]))

    #: parts of at least this many flows are stepped in two threads, one half each (the compiled
    #: step holds no lock); fewer: in one call
    step_split_flows = 1 << 16

    @staticmethod
    def _step_halves(args: tuple, lo: int, hi: int) -> tuple[float, float, np.ndarray]:
        """``K.step_range(*args, lo, hi)`` as two calls on the halves of ``lo:hi``, the second in
        a thread of its own (:meth:`_in_two`): each flow's arithmetic is its own, so the arrays
        get the same bits, and the merge is the step's own rule."""
        mid = (lo + hi) // 2
        return Network._in_two(lambda a, b: K.step_range(*args, a, b), (lo, mid), (mid, hi), args)

    #: a dense part whose flows are stored row by row (an AlltoAllv's NIC flows) steps its rows
    #: lazily where every live flow of a row is limited by the row's link (``_kernels.lazy_begin``);
    #: False: every flow is stepped at every step of its part (the reference)
    lazy_rows = True

    def _part_windows(self, c: _Components, i: int, now: int, running: bool, t: int) -> np.ndarray:
        """The windows part ``i`` drains at its step: while it was running, those it sat out
        since its ``t_ref`` and the last one; else one zero window."""
        if not running:
            return np.zeros(1)
        t_ref = int(c.t_ref[i])
        last = np.array([float(now - max(t, t_ref))])
        return np.concatenate([self._windows(t_ref, t), last]) if t > t_ref else last

    def _step_lazy(self, g: FlowGroup, i: int, now: int, running: bool, t: int, span: float, youngest: float) -> None:
        """Step dense part ``i`` of ``g`` with its rows lazy where they can be (``_LazyRows``):
        the rows that cannot are stepped flow by flow (``K.step_range``'s arithmetic, in two
        threads when they hold ``step_split_flows`` flows or more), the lazy ones per row; the
        candidates are both's, within the bound of the part's earliest end, in flow order."""
        c = g._comp
        lz: _LazyRows = c.lazy[i]
        W, _, A, B = c.dense[i]
        dts = self._part_windows(c, i, now, running, t)
        sp = span if running else 0.0
        fnow = float(now)
        ob = c.order[B]
        colsort = np.argsort(ob, kind="stable")
        mode = np.empty(lz.rlo.size, dtype=np.int8)
        lmin, lmax = K.lazy_begin(g._alive, g._rem, g._rate, dts, sp, fnow, c.level, c.order, A, W, colsort,
                                  ob[colsort], lz.rlo, lz.rhi, lz.on, lz.D, lz.L, lz.head, lz.perm, lz.key, lz.lo,
                                  mode)
        eager = mode >= 2
        self.lazy_row_steps += int(np.count_nonzero(mode == 1))
        run_lo, run_hi = lz.rlo[eager], lz.rhi[eager]
        if run_lo.size > 1:  # adjacent rows in one run
            new = np.ones(run_lo.size, dtype=bool)
            new[1:] = run_lo[1:] != run_hi[:-1]
            ends = np.append(np.flatnonzero(new)[1:], run_lo.size) - 1
            run_lo, run_hi = run_lo[new], run_hi[ends]
        args = (g._alive, g._rem, g._rate, dts, sp, fnow, g._pred, self.coalesce_rel, youngest, g._links, c.level,
                c.order)
        flows = int((run_hi - run_lo).sum())
        if flows >= self.step_split_flows and K.step_runs is not K._step_runs_np and run_lo.size > 1:
            cut = int(np.searchsorted(np.cumsum(run_hi - run_lo), flows // 2)) + 1
            cut = min(cut, run_lo.size - 1)
            emin, emax, ecand = self._in_two(
                lambda a, b: K.step_runs(*args, run_lo[a:b], run_hi[a:b]), (0, cut), (cut, run_lo.size), args)
        elif run_lo.size:
            emin, emax, ecand = K.step_runs(*args, run_lo, run_hi)
        else:
            emin, emax, ecand = math.inf, -math.inf, _NO_CLS
        t_min = min(emin, lmin)
        t_max = math.nan if emax != emax else max(emax, lmax)
        bound = K.lazy_bound(t_min, fnow, self.coalesce_rel, youngest)
        lcand = K.lazy_end(g._alive, g._rem, g._rate, g._pred, fnow, bound, mode, c.level, A, lz.rlo, lz.rhi, lz.on,
                           lz.D, lz.L, lz.head, lz.perm, lz.key, lz.lo, True)
        cand = np.concatenate([ecand[g._pred[ecand] <= bound], lcand])
        cand.sort()
        c.tmin[i], c.tlast[i], c.cand[i] = t_min, t_max, cand
        c.t_ref[i] = now

    @staticmethod
    def _in_two(fn, first: tuple, second: tuple, args: tuple) -> tuple[float, float, np.ndarray]:
        """``fn(*first)`` and ``fn(*second)`` (each a step's (earliest end, latest end,
        candidates)), the second in a thread of its own, merged as one step's: the smaller
        earliest end, the larger latest (NaN if either is), the candidates of both within the
        bound of the earliest end, in order."""
        box: list = []

        def run_second() -> None:
            try:
                box.append(fn(*second))
            except BaseException as e:  # raised again in the caller's thread
                box.append(e)

        th = threading.Thread(target=run_second, name="neonic-step-half")
        th.start()
        try:
            a = fn(*first)
        finally:
            th.join()
        b = box[0]
        if isinstance(b, BaseException):
            raise b
        t_min = min(a[0], b[0])
        t_max = math.nan if (a[1] != a[1] or b[1] != b[1]) else max(a[1], b[1])
        now, pred, coalesce, youngest = args[5], args[6], args[7], args[8]
        bound = K.lazy_bound(t_min, now, coalesce, youngest)
        cand = np.concatenate([a[2], b[2]])
        return t_min, t_max, cand[pred[cand] <= bound]

    def _predict_parts(self, g: FlowGroup, now: int, previous: dict[int, np.ndarray], span: float,
                       youngest: float) -> tuple[float, float]:
        """:meth:`_predict`'s pass for a lone group by parts: the re-solved parts drain from
        their ``t_ref``, get the credit, and predict; the others keep their predictions. Parts
        under ``step_split_flows`` flows are stepped together in one compiled call
        (``K.step_parts``: an AlltoAllv's 128 per-node NVLink parts cost a call each before)."""
        c = g._comp
        running = id(g) in previous
        t = self._recomputes[-2] if running else now
        none = np.zeros(1)
        dirty = np.flatnonzero(c.dirty)
        if self.lazy_rows:  # dense parts stored row by row: their rows stepped lazily where they can
            for i in dirty.tolist():
                if c.dense[i] is not None and c.lazy[i] is None:
                    c.lazy[i] = _LazyRows.build(g, c, i)
            lazy = np.array([bool(c.lazy[i]) for i in dirty], dtype=bool)
            for i in dirty[lazy].tolist():
                self._step_lazy(g, i, now, running, t, span, youngest)
            dirty = dirty[~lazy]
        if K.step_parts is not None:  # the small parts in one compiled call (the same bits each)
            small = dirty[c.starts[dirty + 1] - c.starts[dirty] < self.step_split_flows]
            dirty = dirty[c.starts[dirty + 1] - c.starts[dirty] >= self.step_split_flows]
            if small.size:
                r = self._recomputes
                if running:  # the recompute times from the earliest t_ref on (bisect_left: the same windows)
                    r = r[bisect.bisect_left(r, int(c.t_ref[small].min())):]
                tmin, tmax, cand, counts = K.step_parts(
                    g._alive, g._rem, g._rate, np.asarray(r if running else r[-1:], dtype=np.int64), c.t_ref[small],
                    int(t), running, span if running else 0.0, int(now), g._pred, self.coalesce_rel, youngest, g._links,
                    c.level, c.order, c.starts[small], c.starts[small + 1])
                c.tmin[small] = tmin
                c.tlast[small] = tmax
                for i, part in zip(small.tolist(), np.split(cand, np.cumsum(counts)[:-1])):
                    c.cand[i] = part
                c.t_ref[small] = now
        for i in dirty:
            lo, hi = int(c.starts[i]), int(c.starts[i + 1])
            if running:  # the windows it sat out, then the last one, drained in the step's pass
                t_ref = int(c.t_ref[i])
                last = np.array([float(now - max(t, t_ref))])
                dts = np.concatenate([self._windows(t_ref, t), last]) if t > t_ref else last
            else:
                dts = none
            args = (g._alive, g._rem, g._rate, dts, span if running else 0.0, float(now), g._pred, self.coalesce_rel,
                    youngest, g._links, c.level, c.order)
            if hi - lo >= self.step_split_flows and K.step_range is not K._step_range_np:
                c.tmin[i], c.tlast[i], c.cand[i] = self._step_halves(args, lo, hi)
            else:
                c.tmin[i], c.tlast[i], c.cand[i] = K.step_range(*args, lo, hi)
            c.t_ref[i] = now
        c.dirty[:] = False
        g._cand = np.concatenate(c.cand) if len(c.cand) > 1 else c.cand[0]
        return float(c.tmin.min()), float(np.max(c.tlast))

    def _predict(self, now: int, previous: dict[int, np.ndarray], span: float) -> None:
        """Credit, predicted ends, the next recompute, and group completions due before it."""
        groups = self._groups
        t_min = math.inf
        last: list[float] = []
        youngest = float(max(g.start_ps for g in groups))
        levels, self._levels = self._levels, None
        no = np.zeros(1, dtype=np.int64)
        # (loop invariants bound once: a shared solve at 1024 GPUs steps a thousand lone groups)
        lone = len(groups) == 1
        dt, fnow, coalesce, step_one, get = self._dt, float(now), self.coalesce_rel, K.step_one, previous.get
        for g in groups:
            if lone and g_comp_mode(g, self._throttle):
                t, t_last = self._predict_parts(g, now, previous, span, youngest)
                last.append(t_last)
                t_min = min(t_min, t)
                continue
            # the groups that were running drain their past window at their old rates, get the
            # credit, and predict; new groups only predict
            old = get(id(g))
            if levels is None and g._alive.size == 1:  # a lone message: no compiled call
                if old is None:
                    t, t_last, g._cand = step_one(g._alive, g._rem, g._rate, 0.0, 0.0, fnow, g._rate, g._pred,
                                                  coalesce, youngest)
                else:
                    t, t_last, g._cand = step_one(g._alive, g._rem, old, dt, span, fnow, g._rate, g._pred,
                                                  coalesce, youngest)
                last.append(t_last)
                if t < t_min:
                    t_min = t
                continue
            t, t_last, g._cand = K.step(g._alive, g._rem, g._rate if old is None else old,
                                        dt if old is not None else 0.0, span if old is not None else 0.0,
                                        fnow, g._rate, g._pred, coalesce, youngest,
                                        levels is not None, g._cls.q_links if levels else g._links,
                                        levels[0] if levels else g._pred, levels[1] if levels else no)
            last.append(t_last)
            if t < t_min:
                t_min = t
        if not math.isfinite(t_min):  # only flows on infinite-capacity links: finish now
            horizon = now
        else:
            age = max(t_min - youngest, 0.0)
            horizon = max(math.ceil(t_min + self.coalesce_rel * age), now + 1)
        # Flows predicted to end before the horizon get their arrival times when the next
        # recompute retires them (K.finish_cls); a group whose every flow ends before it is
        # marked now, so that its completion can be scheduled.
        for g, t_last in zip(groups, last):
            if t_last <= horizon:
                cl = g._cls
                K.mark_cls(g._alive, g._pred, float(horizon), cl.members, cl.starts, g._lat, g._orig, g.finish_ps)
                self._schedule_done(g)
        self._request_recompute(horizon)
