"""How compute kernels and collectives share one GPU: SMs by block scheduling, HBM by rate.

The model behind C3's questions (concurrent computation and communication, arXiv 2412.14335):
how much of the ideal overlap a GPU realizes when a GEMM and a collective run at once, and what
stream priority, SM partitioning and the copy (DMA) engines change. Everything here is a
mechanism with a stated source or an ASSUMPTION; nothing is fitted to C3's figures.

SMs (block scheduling, not preemptive)
    A compute kernel occupies ``want`` SMs (its grid's CTAs, at most every SM) for ``waves``
    waves of CTAs of equal lifetime ``tau = isolated time / waves``. A collective's kernel is a
    persistent grid of ``channels`` CTAs (NCCL: one CTA per channel, never sharing an SM with a
    compute kernel [NVIDIA/nccl#1656]) that holds its SMs until the collective ends. Kernels are
    ordered by (stream priority, launch order); the block scheduler gives every kernel, in that
    order, the SMs it wants out of what is left ("left-over" policy: a later kernel of the same
    priority gets only what earlier kernels leave, Pai et al., ASPLOS 2013). Free SMs are taken
    at once; SMs held by a kernel that should yield them are handed over as its CTAs retire:
    CTAs of a running multi-wave grid are staggered uniformly, so ``n`` of the donor's ``H`` SMs
    retire uniformly over ``[0, n tau / H]``: the hand-over happens in 4 equal steps, each at the
    middle of its quarter of that span (ASSUMPTION: the fluid model moves SMs in steps). A
    grid in its last wave (remaining work <= one CTA lifetime) dispatches nothing more: it keeps
    its speed while its SMs are released to whoever waits (the tail effect). A one-wave grid
    releases nothing before it ends. Persistent collective CTAs are never handed over.

Priority (``comm_priority``)
    Higher-priority kernels come first in the order above, so a high-priority collective
    launched behind a GEMM gets its SMs after a fraction of one GEMM CTA lifetime, and the GEMM
    runs on the rest; at equal priority the collective waits for the GEMM's last wave.

Partitioning (``sm_partition_comm = p``)
    Only while both a compute kernel and a collective are resident: compute kernels may hold at
    most ``(1 - p)`` of the SMs and collectives at most ``p`` (SMs over those caps are handed
    over as CTAs retire, like any other); otherwise each side may use the whole GPU. SMs of the
    collective's share that its channels do not use stay idle. A collective wholly on the copy
    engines runs no SM kernel and does not start the partition.

Compute throughput (roofline per kernel)
    A kernel with isolated compute time ``C``, memory time ``M`` and total ``T`` needs
    ``d_sm = C / T`` of its SMs' throughput and ``d_hbm = M / T`` of the achievable HBM
    bandwidth at full speed; holding ``h`` of its ``want`` SMs it runs at most at
    ``(h / want) / d_sm`` of its isolated speed (compute time ``C * want / h``), and at most at
    ``b / d_hbm`` with HBM share ``b``.

Communication as GPU work
    The network model gives each GPU's summed send rate ``tx`` and receive rate ``rx`` as the
    links alone allow (``sim.network.Network.set_throttle``). Moving those bytes costs HBM: each
    byte sent is read once and each byte received written once (NVLink/RDMA copies read the
    source and write the destination); a received byte that is reduced is also read again with
    the local operand and the result written (a reduction reads two operands and writes one),
    so HBM bytes per second are ``tx + rx * (1 + 3 * reduce_fraction)``. A channel (one CTA)
    feeds at most ``channel_gbytes_per_s`` each way, so SM-resident collectives move at most
    ``channels_held * channel_gbytes_per_s``. NCCL launches 2 CTAs per NVLink to saturate it
    for large messages [NVIDIA/nccl#1703; DGX A100: 12 NVLinks, 24 CTAs, NVIDIA/nccl#1225]: one
    NVLink 3/4 carries 25 GB/s each way, so a channel feeds 12.5 GB/s; a collective gets enough
    channels for the links it drives from this GPU (first-hop capacities of its messages), at
    most NCCL's 32 channels. The collective's fraction of its link-allowed speed
    ``r = min(1, feed / max(tx, rx), HBM share / HBM demand)`` scales its flows in the network.

HBM sharing
    Memory controllers do not know stream priorities: every kernel (and the GPU's collectives
    as one client) is slowed by the same factor until its own SM limit or HBM saturates
    (progressive filling; each gets HBM in proportion to its demand). While more than one client
    runs, HBM loses ``interference`` of its capacity (row-buffer and L2 interference between
    co-running kernels; the fraction is the system preset's ASSUMPTION).

DMA offload (``collectives_on_dma``)
    Data movement runs on the copy engines: ``GPUSpec.copy_engines`` servers of
    ``copy_engine_gbytes_per_s`` each (default: the GPU's NVLink bandwidth each way; copy engines
    drive peer copies at line rate with 256 B payloads, SMs with 128 B [NVIDIA/nccl-tests#149]).
    It takes no SMs but the same HBM bytes. Copy engines cannot reduce: an offloaded collective
    with reductions runs its reductions as an SM kernel with enough channels for its reduced
    receive rate (``ceil(reduce_fraction * link rate / channel rate)`` CTAs), scheduled like any
    SM kernel (priority, partitioning).

API
    ``gpu = GPUDevice(engine, spec, name, comm_priority=0, sm_partition_comm=0.0,
    collectives_on_dma=False, interference=0.0, comm=CommEngineSpec(), record=False)``;
    ``gpu.launch(cost, on_done, priority=0, ctas=None) -> isolated ps``;
    ``h = gpu.comm_begin(link_gbytes_per_s, reduce_fraction=0.0)``; ``gpu.comm_end(h)``;
    ``hs = comm_begin_all(gpus, links, reduce_fraction)``; ``comm_end_all(gpus, hs)`` (a collective's
    ranks at once: exactly the calls on each GPU in turn);
    ``gpu.set_traffic(tx_bytes_per_s, rx_bytes_per_s)`` (what the network reports);
    ``couple(net, gpus, batched=True, shared=True)`` installs the network throttle (and lets GPUs
    in the same state share their re-plans); ``gpu.utilization(elapsed_ps)``;
    ``gpu.counters`` (time series of SM and HBM shares by side when ``record``);
    ``gemm_ctas(spec, m, n)``; ``collective_links(topo, ranks)`` (link GB/s per rank);
    ``REDUCE_FRACTION`` per collective kind.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from neonic.sim.compiled import jit
from neonic.sim.engine import Engine, EventHandle, ps_from_s
from neonic.sim.gpu import GPUSpec, KernelCost, gemm_ctas  # noqa: F401  (gemm_ctas: re-exported)

__all__ = [
    "CommEngineSpec",
    "GPUDevice",
    "CommHandle",
    "comm_begin_all",
    "comm_end_all",
    "couple",
    "gemm_ctas",
    "collective_links",
    "REDUCE_FRACTION",
    "comm_hbm_bytes",
    "comm_channels",
    "kernel_comm_hbm_rate",
    "kernel_sm_rate",
]

Done = Callable[[int, int], None]
_EPS = 1e-9
_copysign = math.copysign
_chain = itertools.chain.from_iterable
#: A GPU re-plans its rates when the network changes its traffic by more than this fraction (the
#: network itself coalesces rate changes within 2% of a flow's age; see sim.network.network).
_RETUNE = 0.01
#: SM hand-overs happen in this many equal steps (the fluid model moves SMs in steps).
_STEPS = 4

#: Share of the bytes a GPU receives that it reduces, per collective: ring AllReduce is a
#: reduce-scatter (p - 1 reduce steps) then an all-gather (p - 1 copy steps) of equal sizes; the
#: double binary tree reduces one half of its steps and broadcasts the other; the hierarchical
#: AllReduce is a reduce-scatter, an AllReduce and an all-gather of matching sizes.
REDUCE_FRACTION: dict[str, float] = {"alltoallv": 0.0, "alltoall": 0.0, "all_gather": 0.0, "allreduce": 0.5,
                                     "reduce_scatter": 1.0}


@dataclass(frozen=True)
class CommEngineSpec:
    """How a GPU runs communication (sources in the module doc).

    ``channel_gbytes_per_s``: what one NCCL channel (a CTA on one SM) moves each way (2 CTAs per
    25 GB/s NVLink saturate it: 12.5). ``max_channels``: NCCL's channel limit (32).
    ``copy_engine_gbytes_per_s``: per copy engine; None = the GPU's NVLink bandwidth each way.
    ``default_waves``: CTA waves of a kernel launched without a grid size (ASSUMPTION: 8; the
    cost functions' kernels are large and fill every SM).
    """

    channel_gbytes_per_s: float = 12.5
    max_channels: int = 32
    copy_engine_gbytes_per_s: float | None = None
    default_waves: int = 8

    def __post_init__(self) -> None:
        if not (isinstance(self.channel_gbytes_per_s, (int, float)) and self.channel_gbytes_per_s > 0):
            raise ValueError(f"comm.channel_gbytes_per_s: expected a number > 0, got {self.channel_gbytes_per_s!r}")
        if isinstance(self.max_channels, bool) or not isinstance(self.max_channels, int) or self.max_channels < 1:
            raise ValueError(f"comm.max_channels: expected an integer >= 1, got {self.max_channels!r}")
        if self.copy_engine_gbytes_per_s is not None and not (
                isinstance(self.copy_engine_gbytes_per_s, (int, float)) and self.copy_engine_gbytes_per_s > 0):
            raise ValueError(f"comm.copy_engine_gbytes_per_s: expected a number > 0 or None, got {self.copy_engine_gbytes_per_s!r}")
        if isinstance(self.default_waves, bool) or not isinstance(self.default_waves, int) or self.default_waves < 1:
            raise ValueError(f"comm.default_waves: expected an integer >= 1, got {self.default_waves!r}")


def collective_links(topology, ranks: Sequence[int]) -> np.ndarray:
    """Per rank of ``ranks``: GB/s of the distinct first-hop links its messages to the other
    ranks cross (its NVLink port when a peer shares its node, its NIC port when one does not)."""
    r = np.asarray(ranks, dtype=np.int64)
    p = r.size
    out = np.zeros(p)
    if p < 2:
        return out
    node = r // topology.gpus_per_node
    src, dst = [], []
    for i in range(p):
        same = np.flatnonzero((node == node[i]) & (r != r[i]))
        other = np.flatnonzero(node != node[i])
        for group in (same, other):
            if group.size:
                src.append(r[i])
                dst.append(r[group[0]])
    route = topology.route(np.array(src), np.array(dst))
    first = route.links[0]
    cap = topology.capacity[first] * 1e3  # bytes/ps -> GB/s
    seen: dict[int, set[int]] = {}
    index = {int(x): k for k, x in enumerate(r)}
    for s, link, c in zip(src, first, cap):
        links = seen.setdefault(int(s), set())
        if int(link) not in links and math.isfinite(c):
            links.add(int(link))
            out[index[int(s)]] += c
    return out


@dataclass(eq=False, slots=True)
class _Kernel:
    kind: str  # "compute" | "comm"
    priority: int
    seq: int
    want: float  # SMs it can occupy
    start: int
    on_done: Done | None = None
    remaining: float = 0.0  # compute: ps of work at isolated speed
    d_sm: float = 0.0
    d_hbm: float = 0.0
    tau: float = math.inf  # CTA lifetime at isolated speed (ps); inf: persistent
    waves: int = 1
    held: float = 0.0
    incoming: float = 0.0
    outgoing: float = 0.0
    draining: bool = False
    drain_rate: float = 1.0
    rate: float = 0.0
    reduce_fraction: float = 0.0
    alive: bool = True
    target: float = 0.0  # SMs it should hold (set by GPUDevice._rebalance)


def _order_key(k: _Kernel) -> tuple[int, int]:
    """Scheduling order: higher stream priority first, then launch order."""
    return (-k.priority, k.seq)


CommHandle = _Kernel


@dataclass(eq=False, slots=True)
class _Transfer:
    donor: _Kernel
    taker: _Kernel | None
    n: float
    event: EventHandle | None = None


class GPUDevice:
    """One GPU on the engine (see the module doc for the model).

    Its fields are slots: at thousands of GPUs the network's traffic updates, re-plans and
    hand-over steps each touch a few fields of hundreds of GPUs in turn, and fields stored in
    the object itself (no per-instance dict to probe) are quicker to reach."""

    __slots__ = ("engine", "spec", "name", "comm_priority", "partition", "on_dma", "interference", "comm", "sms",
                 "channel_bps", "copy_engines", "copy_engine_bps", "hbm_bps", "record", "counters", "kernels",
                 "collectives", "_ks", "_order", "_targets_stale", "_transfers", "_seq", "_last", "_timer", "_tx",
                 "_rx", "_comm_rate", "_comm_hbm", "_sm_busy", "_hbm_busy", "_net", "_ncomm", "_board", "_brate",
                 "_slot", "_plan", "_memo", "_tok", "_cls")

    def __init__(self, engine: Engine, spec: GPUSpec, name: str = "gpu", *, comm_priority: int = 0,
                 sm_partition_comm: float = 0.0, collectives_on_dma: bool = False, interference: float = 0.0,
                 comm: CommEngineSpec | None = None, record: bool = False) -> None:
        if not (isinstance(sm_partition_comm, (int, float)) and 0 <= sm_partition_comm < 1):
            raise ValueError(f"sm_partition_comm: expected a fraction in [0, 1), got {sm_partition_comm!r}")
        if not (isinstance(interference, (int, float)) and 0 <= interference < 1):
            raise ValueError(f"interference: expected a number in [0, 1), got {interference!r}")
        if isinstance(comm_priority, bool) or not isinstance(comm_priority, int):
            raise ValueError(f"comm_priority: expected an integer, got {comm_priority!r}")
        self.engine = engine
        self.spec = spec
        self.name = name
        self.comm_priority = comm_priority
        self.partition = float(sm_partition_comm)
        self.on_dma = bool(collectives_on_dma)
        self.interference = float(interference)
        self.comm = comm or CommEngineSpec()
        self.sms = float(spec.num_sms)
        self.channel_bps = self.comm.channel_gbytes_per_s * 1e9
        ce_gbps = self.comm.copy_engine_gbytes_per_s
        if ce_gbps is None:
            ce_gbps = spec.nvlink_gbytes_per_s
        self.copy_engines = spec.copy_engines
        self.copy_engine_bps = ce_gbps * 1e9
        self.hbm_bps = spec.hbm_bytes_per_s * spec.efficiency.hbm_stream  # achievable streaming
        self.record = record
        self.counters: list[tuple[int, float, float, float, float]] = []  # t, sm/hbm compute, sm/hbm comm
        self.kernels = 0
        self.collectives = 0
        self._ks: list[_Kernel] = []  # in launch order (seq): the order of every sum over kernels
        self._order: list[_Kernel] = []  # the same kernels in scheduling order (_order_key)
        # the kernels' targets depend only on which kernels run, in what order, and which drain:
        # _set_targets runs again only after one of those changed
        self._targets_stale = False
        self._transfers: list[_Transfer] = []
        self._seq = 0
        self._last = engine.now
        self._timer = engine.timer(self._on_event)  # the next kernel event (a wave's end or a kernel's)
        self._tx = 0.0
        self._rx = 0.0
        self._comm_rate = 1.0
        self._comm_hbm = 0.0
        self._sm_busy = 0.0
        self._hbm_busy = 0.0
        self._net = None
        self._ncomm = 0
        # set by couple(): the rows of a (2, n) array the network's throttle reads without
        # visiting every GPU, as memoryviews (a store is a third of a numpy item store's cost, and
        # every re-plan makes one): _board row 0, this GPU's running collectives; _brate row 1,
        # its collectives' fraction (_comm_rate); both at index _slot
        self._board: memoryview | None = None
        self._brate: memoryview | None = None
        self._slot = 0
        self._plan: tuple[bool, float, float, float, float] = (True, 0.0, 0, 0.0, 0.0)
        # shared transitions (set by couple(), see _Memo): the memo and this GPU's state token
        # (None: this GPU computes every transition itself)
        self._memo: _Memo | None = None
        self._tok: int | None = None
        # what, besides its state, a GPU's transitions depend on (GPUs share them only if equal)
        self._cls = (self.sms, self.partition, self.on_dma, self.interference, self.comm, self.channel_bps,
                     self.copy_engines, self.copy_engine_bps, self.hbm_bps, self.comm_priority)

    # ---------------------------------------------------------------------------- public API
    def launch(self, cost: KernelCost, on_done: Done | None = None, priority: int = 0, ctas: int | None = None) -> int:
        """Run a compute kernel; returns its isolated duration in ps (under sharing it takes longer).
        ``ctas``: its grid size (default: ``default_waves`` waves over every SM)."""
        duration = ps_from_s(cost.time_s)
        if ctas is not None and (isinstance(ctas, bool) or not isinstance(ctas, int) or ctas < 1):
            raise ValueError(f"ctas: expected an integer >= 1, got {ctas!r}")
        if duration == 0:  # nothing to run: it holds no SMs and ends now
            self.kernels += 1
            if on_done is not None:
                start = self.engine.now
                self.engine.after(0, on_done, start, start)
            return 0
        if ctas is None:
            want, waves = self.sms, self.comm.default_waves
        else:
            want, waves = min(self.sms, float(ctas)), math.ceil(ctas / self.sms)
        total = cost.time_s
        k = _Kernel("compute", int(priority), self._next_seq(), want, self.engine.now, on_done,
                    remaining=float(duration), d_sm=cost.compute_s / total if total > 0 else 0.0,
                    d_hbm=cost.memory_s / total if total > 0 else 0.0, tau=duration / waves, waves=waves)
        self.kernels += 1
        self._advance()
        self._add(k)
        if self._tok is not None:
            self._replan((self._tok, "L", k.remaining, k.d_sm, k.d_hbm, k.want, k.waves, k.priority))
        else:
            self._update()
        return duration

    def comm_begin(self, link_gbytes_per_s: float, reduce_fraction: float = 0.0) -> CommHandle:
        """A collective's kernel starts on this GPU. ``link_gbytes_per_s``: the links it drives
        from here (sets its channels); ``reduce_fraction``: share of received bytes it reduces."""
        if not (isinstance(link_gbytes_per_s, (int, float)) and link_gbytes_per_s >= 0):
            raise ValueError(f"link_gbytes_per_s: expected a number >= 0, got {link_gbytes_per_s!r}")
        if not (isinstance(reduce_fraction, (int, float)) and 0 <= reduce_fraction <= 1):
            raise ValueError(f"reduce_fraction: expected a number in [0, 1], got {reduce_fraction!r}")
        return self._begin(self._comm_want(link_gbytes_per_s, reduce_fraction), float(reduce_fraction))

    def _comm_want(self, link_gbytes_per_s: float, reduce_fraction: float) -> float:
        """The SMs a collective's kernel occupies here: its channels (at least one on SMs)."""
        rate = link_gbytes_per_s * (reduce_fraction if self.on_dma else 1.0)
        channels = comm_channels(rate, self.comm)
        if not self.on_dma:
            channels = max(1, channels)
        return float(min(channels, self.sms))

    def _begin(self, want: float, reduce_fraction: float) -> CommHandle:
        """:meth:`comm_begin` once its figures are checked and its SMs known."""
        self._seq += 1
        k = _Kernel("comm", self.comm_priority, self._seq, want, self.engine.now, reduce_fraction=reduce_fraction)
        self.collectives += 1
        self._ncomm += 1
        if self._board is not None:
            self._board[self._slot] = self._ncomm
        self._advance()
        self._add(k)
        if self._tok is not None:
            self._replan((self._tok, "B", k.want, k.priority, k.reduce_fraction))
        else:
            self._update()
        return k

    def comm_end(self, handle: CommHandle) -> None:
        if not handle.alive:
            return
        self._advance()
        i = self._ks.index(handle) if self._tok is not None else -1
        self._remove(handle)
        if self._tok is not None:
            self._replan((self._tok, "E", i))
        else:
            self._update()

    def set_traffic(self, tx_bytes_per_s: float, rx_bytes_per_s: float) -> float:
        """The network's send/receive rates at this GPU (links alone); returns the collectives'
        achievable fraction of them (1 when the GPU does not limit them)."""
        self._advance()
        tx, rx = float(tx_bytes_per_s), float(rx_bytes_per_s)
        self._tx = tx if tx > 0.0 else 0.0  # max(0.0, tx)
        self._rx = rx if rx > 0.0 else 0.0
        if self._tok is not None:
            self._retoken((self._tok, "T", self._tx, self._rx))
            self._shared(False)
            return self._comm_rate
        if self._fast_traffic():
            if self.record:
                self._record()
            return self._comm_rate
        self._rates()  # SMs do not depend on traffic: only the rates change
        self._schedule()
        if self.record:
            self._record()
        return self._comm_rate

    @property
    def comm_rate(self) -> float:
        return self._comm_rate

    @property
    def active(self) -> int:
        return len(self._ks)

    def held(self) -> dict[str, float]:
        """SMs held now by compute kernels and by collectives."""
        return {"compute": sum(k.held for k in self._ks if k.kind == "compute"),
                "comm": sum(k.held for k in self._ks if k.kind == "comm")}

    def utilization(self, elapsed_ps: int) -> dict[str, float]:
        """Average share of SMs held and of achievable HBM bandwidth used over ``elapsed_ps``."""
        self._advance()
        if self._tok is not None:  # the kernels' work left moved to now: a change of state
            self._retoken((self._tok, "A"))
        if elapsed_ps <= 0:
            return {"sm": 0.0, "hbm": 0.0}
        return {"sm": self._sm_busy / (self.sms * elapsed_ps), "hbm": self._hbm_busy / elapsed_ps}

    # ------------------------------------------------------------------------------ internals
    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _add(self, k: _Kernel) -> None:
        """Add the newest kernel (the largest seq) to ``_ks`` and, by :func:`_order_key`, to
        ``_order``: after every kernel of its priority or higher (what sorting would give)."""
        self._ks.append(k)
        self._targets_stale = True
        order = self._order
        i = len(order)
        while i and order[i - 1].priority < k.priority:
            i -= 1
        order.insert(i, k)

    def _advance(self) -> None:
        now = self.engine.now
        dt = now - self._last
        if dt > 0:
            # the same sums in the same order as one kernel at a time (locals: a hot path)
            hbm = self._comm_hbm * self._comm_rate
            sm = self._sm_busy
            for k in self._ks:
                sm += k.held * dt
                if k.kind == "compute":
                    rate = k.rate
                    k.remaining -= rate * dt
                    hbm += rate * k.d_hbm
            self._sm_busy = sm
            self._hbm_busy += hbm * dt
        self._last = now

    def _set_targets(self, order: list[_Kernel]) -> None:
        """The SMs each kernel should hold (``k.target``), given in scheduling ``order``: the
        caps (partitioning only while both sides run), then each kernel in order takes what it
        wants of what is left (runs at every change of every GPU: plain locals, no dicts)."""
        sms = self.sms
        cap_compute = cap_comm = sms
        if self.partition > 0:  # a collective wholly on the copy engines does not start it
            has_compute = has_comm = False
            for k in self._ks:
                if k.kind == "compute":
                    has_compute = True
                elif k.want > 0:
                    has_comm = True
            if has_compute and has_comm:
                cap_compute, cap_comm = (1 - self.partition) * sms, self.partition * sms
        avail = sms
        used_compute = used_comm = 0.0
        for k in order:  # t = max(0.0, min(want, avail, cap - used)), as comparisons (the same value)
            t = 0.0 if k.draining else k.want
            if avail < t:
                t = avail
            if k.kind == "compute":
                x = cap_compute - used_compute
                if x < t:
                    t = x
                if not t > 0.0:
                    t = 0.0
                used_compute += t
            else:
                x = cap_comm - used_comm
                if x < t:
                    t = x
                if not t > 0.0:
                    t = 0.0
                used_comm += t
            k.target = t
            avail -= t

    def _rebalance(self) -> None:
        """Move SMs toward each kernel's target: free SMs at once, the rest as donors' CTAs retire."""
        ks = self._ks
        if not ks:
            return
        order = self._order  # sorted(ks, key=_order_key), kept as kernels come and go
        if self._targets_stale:
            self._set_targets(order)
            self._targets_stale = False
        held_sum = 0
        for k in ks:
            held_sum += k.held
        free = self.sms - held_sum
        if free > _EPS:  # (free SMs only shrink below: with none, nothing is given)
            for k in order:  # free SMs go at once, in scheduling order
                need = k.target - k.held - k.incoming
                if need > _EPS and free > _EPS:
                    g = free if free < need else need  # min(need, free)
                    k.held += g
                    free -= g
        donors = []
        over_any = False  # no donor over its target: nothing below would move an SM
        for k in reversed(order):
            if k.kind == "compute" and k.tau != math.inf and (k.waves > 1 or k.draining):
                donors.append(k)
                if k.held - k.outgoing - k.target > _EPS:
                    over_any = True
        if not over_any:
            return
        for k in order:  # the rest as the donors' CTAs retire
            need = k.target - k.held - k.incoming
            for d in donors:
                if need <= _EPS:
                    break
                if d is k:
                    continue
                over = d.held - d.outgoing - d.target
                if over > _EPS:
                    n = min(need, over)
                    self._transfer(d, k, n)
                    need -= n
        for d in donors:  # SMs over a donor's target that nobody takes are released as well
            over = d.held - d.outgoing - d.target
            if over > _EPS:
                self._transfer(d, None, over)

    def _transfer(self, donor: _Kernel, taker: _Kernel | None, n: float) -> None:
        """Hand ``n`` of ``donor``'s SMs over as its CTAs retire: they retire at ``H / tau`` SMs
        per ps, so the SMs arrive over ``n tau / H``; in :data:`_STEPS` equal steps, each at
        the middle of its share of that span."""
        speed = donor.drain_rate if donor.draining else max(donor.rate, 1e-6)
        span = n * (donor.tau / max(speed, 1e-6)) / max(donor.held, _EPS)
        steps = _STEPS if n > _STEPS * _EPS else 1
        eng = self.engine
        bundled = eng._bundled  # (after_bundled without its checks: the delays below are ints >= 0)
        now = eng.now
        for j in range(steps):
            t = _Transfer(donor, taker, n / steps)
            donor.outgoing += t.n
            if taker is not None:
                taker.incoming += t.n
            delay = (j + 0.5) * span / steps
            t.event = bundled(now + max(0, int(math.ceil(delay))), self._on_transfer, (t,))
            self._transfers.append(t)

    def _on_transfer(self, t: _Transfer) -> None:
        self._advance()
        if self._tok is not None:
            transfers = self._transfers
            i = transfers.index(t)
            del transfers[i]
            # a GPU whose token made this step at this picosecond before: the step's token and
            # that token's re-plan are both known, and applying the re-plan sets every kernel's
            # SMs (the donor's and taker's included) as the steps below and _update would
            memo = self._memo
            now = self.engine.now
            trans = memo.trans if memo.now == now else memo.at(now)
            tok = trans.get((self._tok, "X", i))
            if tok is not None:
                hit = trans.get(tok)
                if hit is not None:  # (_apply sets the token: the re-plan's, after this step's)
                    self._apply(hit)
                    return
        else:
            self._transfers.remove(t)
        t.donor.held = max(0.0, t.donor.held - t.n)
        t.donor.outgoing -= t.n
        if t.taker is not None and t.taker.alive:
            t.taker.incoming -= t.n
            t.taker.held += t.n
        if self._tok is not None:
            self._replan((self._tok, "X", i))
        else:
            self._update()

    def _remove(self, k: _Kernel) -> None:
        k.alive = False
        if k.kind == "comm":
            self._ncomm -= 1
            if self._board is not None:
                self._board[self._slot] = self._ncomm
        self._ks.remove(k)
        self._order.remove(k)
        self._targets_stale = True
        for t in list(self._transfers):
            if t.donor is k:
                t.event.cancel()
                self._transfers.remove(t)
                if t.taker is not None:
                    t.taker.incoming -= t.n
            elif t.taker is k:
                t.taker = None
        k.held = 0.0

    def _comm_terms(self, held: float, rf: float) -> tuple[float, float]:
        """(fraction of the traffic the collectives can feed, their HBM demand at full speed)."""
        tx, rx = self._tx, self._rx
        need = rx if rx > tx else tx  # max(tx, rx)
        if self.on_dma:
            ce = self.copy_engines * self.copy_engine_bps
            cap = min(1.0, ce / need) if ce > 0 else 0.0
            if rf > 0 and rx > 0:
                cap = min(cap, held * self.channel_bps / (rf * rx))
        else:
            x = held * self.channel_bps / need
            cap = x if x < 1.0 else 1.0  # min(1.0, x)
        return cap, comm_hbm_bytes(self._tx, self._rx, rf) / self.hbm_bps

    def _rates(self) -> None:
        """Roofline rates of the compute kernels and the collectives' fraction (HBM filling)."""
        held = weight = rf = 0.0
        compute_use = 0  # sum(cap * demand) over the compute clients, in their order (as sum())
        compute_busy = 0
        computes: list[_Kernel] = []
        for k in self._ks:
            if k.kind != "compute":
                held += k.held
                w = k.want
                if 1.0 > w:  # max(k.want, 1.0)
                    w = 1.0
                weight += w
                rf += k.reduce_fraction * w
                continue
            if k.draining:
                cap = k.drain_rate
            elif k.held <= _EPS:
                cap = 0.0
            elif k.d_sm <= _EPS:
                cap = 1.0
            else:
                cap = k.held / k.want / k.d_sm  # min(1.0, frac / d_sm)
                if not cap < 1.0:
                    cap = 1.0
            d = k.d_hbm
            k.rate = cap  # each kernel's cap; below, the rate where HBM binds
            computes.append(k)
            compute_use += cap * d
            if cap > 0 and d > 0:
                compute_busy += 1
        rf = rf / weight if weight else 0.0
        self._comm_hbm = 0.0
        comm_cap = 1.0
        moving = self._ncomm > 0 and (self._tx > 0 or self._rx > 0)  # max(tx, rx) > 0 (both >= 0)
        use = compute_use
        if moving:
            comm_cap, self._comm_hbm = self._comm_terms(held, rf)
            use = compute_use + comm_cap * self._comm_hbm
        busy = compute_busy + (1 if moving and comm_cap > 0 and self._comm_hbm > 0 else 0)
        capacity = 1.0 - self.interference if busy > 1 else 1.0
        if use <= capacity + 1e-12:  # _water_level's first test: HBM does not bind, every rate is its cap
            level = math.inf
        else:  # (cap, hbm demand, kernel or None = the collectives), in the order of the sums above
            clients: list[tuple[float, float, _Kernel | None]] = [(k.rate, k.d_hbm, k) for k in computes]
            if moving:
                clients.append((comm_cap, self._comm_hbm, None))
            level = _water_level(clients, capacity, use)
            for cap, _, k in clients:
                r = level if level < cap else cap  # min(cap, level)
                if k is None:
                    comm_cap = r
                else:
                    k.rate = r
        self._comm_rate = comm_cap if moving else 1.0
        if self._brate is not None:
            self._brate[self._slot] = self._comm_rate
        # what set_traffic needs to skip a re-plan while HBM does not bind
        self._plan = (math.isinf(level), compute_use, compute_busy, held, rf)

    def _fast_traffic(self) -> bool:
        """New traffic that changes no kernel's rate (HBM still not binding, the collectives
        still fed): only the collectives' HBM demand changes."""
        free, compute_use, compute_busy, held, rf = self._plan
        tx, rx = self._tx, self._rx
        need = rx if rx > tx else tx  # max(tx, rx)
        if not free or self._ncomm == 0 or need <= 0:
            return False
        if self.on_dma:
            cap, hbm = self._comm_terms(held, rf)
            if cap < 1.0:
                return False
        else:  # _comm_terms inlined (the same expressions): most calls end here
            if held * self.channel_bps / need < 1.0:
                return False
            hbm = (tx + rx * (1 + 3 * rf)) / self.hbm_bps  # comm_hbm_bytes(tx, rx, rf) / hbm_bps
        capacity = 1.0 - self.interference if compute_busy + (1 if hbm > 0 else 0) > 1 else 1.0
        if compute_use + hbm > capacity + 1e-12:
            return False
        self._comm_hbm = hbm
        self._comm_rate = 1.0
        if self._brate is not None:
            self._brate[self._slot] = 1.0
        return True

    def _update(self) -> None:
        """Re-plan SMs, rates and the next event after any change (the engine is at ``now``)."""
        if self._tok is not None:
            self._shared(True)
            return
        before = self._comm_rate
        self._rebalance()
        self._rates()
        self._schedule()
        if self.record:
            self._record()
        if self._net is not None and abs(self._comm_rate - before) > 1e-9:
            self._net.request_recompute()

    def _retoken(self, key: tuple) -> None:
        """This GPU's state changed by ``key`` (its token, then what changed: a launch, a
        collective's begin or end, a hand-over step, kernel events, new traffic, a clock moved
        to now): its token becomes the one every GPU of its token gets for the same change at
        this picosecond; an empty GPU's token is its state's own."""
        memo = self._memo
        if not self._ks:
            self._tok = memo.canon(self)
            return
        trans = memo.at(self.engine.now)
        tok = trans.get(key)
        if tok is None:
            tok = trans[key] = memo.fresh()
        self._tok = tok

    def _replan(self, key: tuple) -> None:
        """:meth:`_retoken` by ``key`` then :meth:`_update`, for a GPU with a token (the pair
        every change but new traffic makes): this picosecond's transitions looked up once, and a
        re-plan another GPU of the new token already computed applied at once."""
        memo = self._memo
        now = self.engine.now
        trans = memo.trans if memo.now == now else memo.at(now)
        if not self._ks:
            tok = memo.canon(self)
        else:
            tok = trans.get(key)
            if tok is None:
                tok = trans[key] = memo.fresh()
        self._tok = tok
        hit = trans.get(tok)  # (_shared's key for an update: the token itself)
        if hit is None:
            self._shared(True)
        else:
            self._apply(hit)

    def _shared(self, update: bool) -> None:
        """:meth:`_update` (``update``) or the rest of :meth:`set_traffic` for a GPU with a
        token: the first GPU of its token at this picosecond computes it and leaves what it
        changed (SMs, rates, new hand-overs, its timer, whether the network must re-solve);
        the others of that token apply the same (see :class:`_Memo`)."""
        memo = self._memo
        now = self.engine.now
        trans = memo.trans if memo.now == now else memo.at(now)
        key = self._tok if update else -self._tok  # (tokens are ints >= 1; _retoken's keys tuples)
        hit = trans.get(key)
        ks = self._ks
        if hit is None:
            ntr = len(self._transfers)
            sched: int | None = None
            recompute = False
            if update:
                before = self._comm_rate
                self._rebalance()
                self._rates()
                self._schedule()
                sched = self._timer.time
                if sched is None:
                    sched = -1
                recompute = self._net is not None and abs(self._comm_rate - before) > 1e-9
            elif not self._fast_traffic():
                self._rates()
                self._schedule()
                sched = self._timer.time
                if sched is None:
                    sched = -1
            transfers = () if len(self._transfers) == ntr else tuple(
                (ks.index(t.donor), -1 if t.taker is None else ks.index(t.taker), t.n, t.event.time - now)
                for t in self._transfers[ntr:])
            tok = memo.canon(self) if not ks else memo.fresh()
            trans[key] = (tok, tuple([(k.held, k.incoming, k.outgoing, k.rate, k.target) for k in ks]),
                          self._targets_stale, self._comm_rate, self._comm_hbm, self._plan, transfers, sched, recompute)
            self._tok = tok
            if recompute:
                self._net.request_recompute()
            return
        self._apply(hit)

    def _apply(self, hit: tuple) -> None:
        """Apply a re-plan another GPU of the same token computed at this picosecond (``hit``:
        what :meth:`_shared` left): the values, hand-overs, timer and re-solve request."""
        self._memo.hits += 1
        ks = self._ks
        tok, kvals, self._targets_stale, rate, self._comm_hbm, self._plan, transfers, sched, recompute = hit
        for k, v in zip(ks, kvals):
            k.held, k.incoming, k.outgoing, k.rate, k.target = v
        self._comm_rate = rate
        if self._brate is not None:
            self._brate[self._slot] = rate
        if transfers:
            eng = self.engine
            bundled = eng._bundled  # (after_bundled without its checks: the delays were made by _transfer)
            now = eng.now
            on_transfer = self._on_transfer
            own = self._transfers
            for di, ti, n, delay in transfers:
                t = _Transfer(ks[di], None if ti < 0 else ks[ti], n)
                t.event = bundled(now + delay, on_transfer, (t,))
                own.append(t)
        if sched is not None:
            if sched < 0:
                self._timer.clear()
            else:
                self._timer._set(sched)  # (Timer.set without its checks: made by _schedule at now or later)
        self._tok = tok
        if recompute:
            self._net.request_recompute()

    def _record(self) -> None:
        sm_c = sum(k.held for k in self._ks if k.kind == "compute") / self.sms
        sm_m = sum(k.held for k in self._ks if k.kind == "comm") / self.sms
        hbm_c = sum(k.rate * k.d_hbm for k in self._ks if k.kind == "compute")
        hbm_m = self._comm_hbm * self._comm_rate if any(k.kind == "comm" for k in self._ks) else 0.0
        row = (self.engine.now, sm_c, hbm_c, sm_m, hbm_m)
        if self.counters and self.counters[-1][0] == row[0]:
            self.counters[-1] = row
        elif not self.counters or self.counters[-1][1:] != row[1:]:
            self.counters.append(row)

    def _schedule(self) -> None:
        best: int | None = None
        now = self.engine.now
        ceil = math.ceil
        for k in self._ks:  # builtin max/min as comparisons below (the same integers)
            rate = k.rate
            if k.kind != "compute" or rate <= 0:
                continue
            c = ceil(k.remaining / rate - 1e-6)
            t = now + c if c > 0 else now
            if not k.draining and k.waves > 1 and k.remaining > k.tau:
                c = ceil((k.remaining - k.tau) / rate)
                c = now + c if c > 1 else now + 1
                if c < t:
                    t = c
            if best is None or t < best:
                best = t
        if best is not None:
            self._timer._set(best)  # (an int >= now: Timer.set without its checks)
        else:
            self._timer.clear()

    def _on_event(self) -> None:
        self._advance()
        now = self.engine.now
        finished = []  # in launch (seq) order, as _ks is
        for k in self._ks:
            if k.kind != "compute":
                continue
            rate = k.rate
            if rate > 0 and k.remaining <= (0.5 if not rate * 1e-6 > 0.5 else rate * 1e-6):  # max(0.5, rate * 1e-6)
                finished.append(k)
            elif not k.draining and k.waves > 1 and k.remaining <= k.tau + 0.5:
                k.draining = True  # last wave: nothing left to dispatch
                self._targets_stale = True
                k.drain_rate = rate if rate > 1e-6 else 1e-6  # max(rate, 1e-6)
        for k in finished:
            self._remove(k)
        if self._tok is not None:
            self._replan((self._tok, "V"))
        else:
            self._update()
        for k in finished:
            if k.on_done is not None:
                k.on_done(k.start, now)


def comm_begin_all(gpus: Sequence[GPUDevice], links: Sequence[float], reduce_fraction: float = 0.0) -> list[CommHandle]:
    """A collective's kernel starts on each of ``gpus`` (``links[i]``: the GB/s of the links it
    drives from ``gpus[i]``): exactly ``[g.comm_begin(l, reduce_fraction) for g, l in zip(gpus,
    links)]``, the same effects in the same order (each GPU's re-plan, hand-overs, timer and
    re-solve request in turn), with the checks made and the channels counted once per distinct
    link figure (a collective's ranks drive a handful of distinct ones)."""
    if len(links) != len(gpus):
        raise ValueError(f"links: expected one figure per GPU ({len(gpus)}), got {len(links)}")
    if not (isinstance(reduce_fraction, (int, float)) and 0 <= reduce_fraction <= 1):
        raise ValueError(f"reduce_fraction: expected a number in [0, 1], got {reduce_fraction!r}")
    rf = float(reduce_fraction)
    wants: dict = {}  # (link, comm spec, on_dma, SMs) -> SMs the kernel occupies
    out = []
    for g, link in zip(gpus, links):
        key = (link, id(g.comm), g.on_dma, g.sms)  # (the specs live as long as their GPUs)
        want = wants.get(key)
        if want is None:
            if not (isinstance(link, (int, float)) and link >= 0):
                raise ValueError(f"links: expected numbers >= 0, got {link!r}")
            want = wants[key] = g._comm_want(link, rf)
        out.append(g._begin(want, rf))
    return out


def comm_end_all(gpus: Sequence[GPUDevice], handles: Sequence[CommHandle]) -> None:
    """A collective's kernel ends on each of ``gpus``: exactly ``g.comm_end(h)`` for each pair in
    order (the counterpart of :func:`comm_begin_all`)."""
    if len(handles) != len(gpus):
        raise ValueError(f"handles: expected one per GPU ({len(gpus)}), got {len(handles)}")
    for g, h in zip(gpus, handles):
        g.comm_end(h)


def comm_channels(link_gbytes_per_s: float, comm: CommEngineSpec | None = None) -> int:
    """NCCL channels (one CTA, one SM each) a collective launches for the links it drives from
    a GPU (module doc: enough to feed them, at most ``max_channels``)."""
    comm = comm or CommEngineSpec()
    if link_gbytes_per_s <= 0:
        return 0
    return min(comm.max_channels, math.ceil(link_gbytes_per_s / comm.channel_gbytes_per_s - 1e-9))


def kernel_sm_rate(sm_demand: "float | np.ndarray", sm_share_taken: float) -> "float | np.ndarray":
    """Fraction of its isolated speed a compute kernel keeps while a higher-priority collective
    holds ``sm_share_taken`` of the SMs (``sm_demand``: its compute time over its time; module
    doc, roofline per kernel). Vectorised; the planner's fast evaluation uses it."""
    d = np.asarray(sm_demand, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(d > 0, np.minimum(1.0, (1.0 - sm_share_taken) / d), 1.0)


def comm_hbm_bytes(tx: "float | np.ndarray", rx: "float | np.ndarray",
                   reduce_fraction: "float | np.ndarray") -> "float | np.ndarray":
    """HBM bytes (or bytes per second) a GPU's collectives move for ``tx`` sent and ``rx``
    received (module doc: each byte sent read once, each received written once, a reduced one
    also read with its local operand and the result written)."""
    return tx + rx * (1 + 3 * reduce_fraction)


def kernel_comm_hbm_rate(kernel_demand: "float | np.ndarray", comm_demand: "float | np.ndarray",
                         interference: float) -> "float | np.ndarray":
    """The common rate (fraction of isolated speed, <= 1) of one compute kernel and the GPU's
    collectives while they share HBM and neither is limited by anything else: the two-client
    case of the progressive filling :class:`GPUDevice` runs (``kernel_demand``: the kernel's
    memory time over its time, ``comm_demand``: the collectives' HBM bytes per second over the
    achievable streaming bandwidth). While both run, HBM loses ``interference`` of its capacity.
    Vectorised over numpy arrays; the planner's fast evaluation (``host.iteration``) prices the
    overlap of kernels and collectives with it."""
    a = np.asarray(kernel_demand, float)
    b = np.asarray(comm_demand, float)
    both = (a > 0) & (b > 0)
    cap = np.where(both, 1.0 - interference, 1.0)
    total = a + b
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total > cap, cap / total, 1.0)


def _water_level(clients: list[tuple[float, float, object]], capacity: float, use: float | None = None) -> float:
    """The common rate ``x`` with ``sum(min(cap_i, x) * d_i) = capacity`` (inf if never binding).
    ``use``: ``sum(cap_i * d_i)`` in the clients' order, when the caller has it."""
    if (sum(c * d for c, d, _ in clients) if use is None else use) <= capacity + 1e-12:
        return math.inf
    pts = sorted(clients, key=lambda c: c[0])
    used = 0.0
    rest = sum(d for _, d, _ in pts)
    for cap, d, _ in pts:
        if rest <= 0:
            break
        level = (capacity - used) / rest
        if level <= cap:
            return max(level, 0.0)
        used += cap * d
        rest -= d
    return math.inf


@jit(cache=True, nogil=True)
def _changed_traffic(tx, rx, last, retune):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """The GPUs (``last.shape[1]`` of them, the first endpoints of ``tx``/``rx``) whose send or
    receive rate (bytes/ps, here in bytes/s) moved by more than ``retune`` of the larger of
    the new rate and ``last`` (the one they last took, row 0 send, row 1 receive; updated for
    them): their indices, new send and receive rates. The element-wise arithmetic of
    ``abs(t - last) > retune * maximum(t, last)``."""
    n = last.shape[1]
    idx = np.empty(n, np.int64)
    ts = np.empty(n)
    rs = np.empty(n)
    m = 0
    for i in range(n):
        t = tx[i] * 1e12
        r = rx[i] * 1e12
        a = last[0, i]
        b = last[1, i]
        ma = t if t > a else a  # (NaN: the comparison below is False either way)
        mb = r if r > b else b
        if abs(t - a) > retune * ma or abs(r - b) > retune * mb:
            idx[m] = i
            ts[m] = t
            rs[m] = r
            last[0, i] = t
            last[1, i] = r
            m += 1
    return idx[:m], ts[:m], rs[:m]


@jit(cache=True, nogil=True)
def _comm_scale(board, size):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """Per network endpoint (``size``): the fraction of its link-allowed rate its flows get,
    ``board[1]`` for a GPU running collectives (``board[0] > 0``), else 1; and whether any is
    below 1."""
    scale = np.ones(size)
    low = False
    for i in range(board.shape[1]):
        if board[0, i] > 0:
            f = board[1, i]
            scale[i] = f
            if f < 1.0:
                low = True
    return scale, low


class _Memo:
    """Transitions shared by GPUs whose state is the same (ranks with identical work and
    timing: at 1024 GPUs most updates of a GPU's SMs and rates happen at a picosecond where
    dozens of GPUs make the same one).

    A GPU's state (its kernels' SMs, rates, work left, the SM hand-overs in flight, its timer,
    the traffic it was told and what it derived) is named by a token: GPUs with equal tokens
    have equal states. Every change of a state maps ``(token, change)`` to the new token, the
    same one for every GPU making that change at that picosecond (``trans``, kept for the
    current picosecond only); an empty GPU's token is that of its state's value (``canon``:
    GPUs whose work diverged meet again once idle). The SM and rate re-plan after a change
    (``GPUDevice._update``, and the rate part of ``set_traffic``) is computed by the first GPU
    of a token and applied by the others: the same values, the same hand-over events and timer
    settings in the same order on each GPU's own objects, so every GPU runs exactly the events
    it would have run on its own (the engine's order is unchanged)."""

    __slots__ = ("now", "trans", "canon_of", "_next", "hits")

    def __init__(self) -> None:
        self.hits = 0  # re-plans applied from another GPU's (a count, for tests and profiles)
        self.now = -1
        self.trans: dict = {}
        self.canon_of: dict = {}
        self._next = 0

    def at(self, now: int) -> dict:
        """The transitions of picosecond ``now`` (those of an earlier one are dropped)."""
        if self.now != now:
            self.now = now
            self.trans = {}
        return self.trans

    def fresh(self) -> int:
        self._next += 1
        return self._next

    def canon(self, g: GPUDevice) -> int:
        """The token of an empty GPU's state (no kernels, no hand-overs, no timer: all that is
        left is the traffic it was told and what it derived from it)."""
        tx, rx, hbm = g._tx, g._rx, g._comm_hbm
        key = (g._cls, tx, rx, g._comm_rate, hbm, g._plan, g._targets_stale,
               _copysign(1.0, tx), _copysign(1.0, rx), _copysign(1.0, hbm))  # (-0.0 == 0.0: the signs too)
        tok = self.canon_of.get(key)
        if tok is None:
            tok = self.canon_of[key] = self.fresh()
        return tok


def couple(net, gpus: Sequence[GPUDevice], batched: bool = True, shared: bool = True) -> None:
    """Let ``gpus`` (indexed by network rank) limit the flows they feed in ``net``.

    After every solve the network reports each GPU's traffic; the GPUs whose traffic changed
    take it in index order. ``batched``: first decide for all of them at once (numpy, the same
    arithmetic as :meth:`GPUDevice.set_traffic`) which ones the new traffic leaves every rate
    alone (HBM still not binding, the collectives still fed); those only advance their clocks
    and note the collectives' new HBM demand, the others re-plan their rates as
    ``set_traffic`` does. False: ``set_traffic`` on each (the reference the batched path is
    tested against). ``shared``: GPUs whose state is the same share their re-plans (see
    :class:`_Memo`; the same results, computed once per state and picosecond); False: every
    GPU computes its own (the reference the shared path is tested against). GPUs that record
    counters always compute their own."""
    gpus = list(gpus)
    if len(gpus) > net.topology.num_gpus:
        raise ValueError(f"gpus: expected at most {net.topology.num_gpus} GPUs for this topology, got {len(gpus)}")
    n = len(gpus)
    last = np.zeros((2, n))
    board = np.zeros((2, n))  # per GPU: running collectives, their fraction (kept by the GPUs)
    # per GPU, what the batched decision needs (fixed at construction)
    channel_bps = np.array([g.channel_bps for g in gpus])
    hbm_bps = np.array([g.hbm_bps for g in gpus])
    room = np.array([1.0 - g.interference for g in gpus])  # HBM left while several clients run
    on_dma = np.array([g.on_dma for g in gpus], dtype=bool)

    def fast_traffic(idx: np.ndarray, t: np.ndarray, r: np.ndarray, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """GPUDevice._fast_traffic for the GPUs ``idx[cand]`` at once: (fast?, their HBM demand)
        over ``idx`` (False / 0 outside ``cand``)."""
        fast = np.zeros(idx.size, dtype=bool)
        hbm = np.zeros(idx.size)
        pos = np.flatnonzero(cand)
        if not pos.size:
            return fast, hbm
        sel = idx[pos]
        plan = np.fromiter(_chain([gpus[i]._plan for i in sel.tolist()]), np.float64, 5 * sel.size).reshape(-1, 5)
        free, use, busy, held, rf = plan.T
        tx, rx = t[pos], r[pos]
        need = np.where(rx > tx, rx, tx)  # max(tx, rx)
        with np.errstate(divide="ignore", invalid="ignore"):
            ok = (free != 0) & (need > 0) & ~(held * channel_bps[sel] / need < 1.0)
        h = comm_hbm_bytes(tx, rx, rf) / hbm_bps[sel]
        capacity = np.where(busy + (h > 0) > 1, room[sel], 1.0)
        ok &= ~(use + h > capacity + 1e-12)
        fast[pos] = ok
        hbm[pos] = h
        return fast, hbm

    def throttle(tx: np.ndarray, rx: np.ndarray) -> np.ndarray | None:
        idx, ti, ri = _changed_traffic(tx, rx, last, _RETUNE)  # (bytes/s; ``last`` updated)
        if idx.size:
            ci = board[0, idx] > 0
            if batched:
                tc = np.where(ti > 0.0, ti, 0.0)  # max(0.0, tx), as set_traffic takes it
                rc = np.where(ri > 0.0, ri, 0.0)
                fast, hbm = fast_traffic(idx, tc, rc, ci & ~on_dma[idx])
                rows = zip(idx.tolist(), ti.tolist(), ri.tolist(), ci.tolist(), fast.tolist(), hbm.tolist(),
                           tc.tolist(), rc.tolist())
            else:
                none = [0.0] * idx.size
                rows = zip(idx.tolist(), ti.tolist(), ri.tolist(), ci.tolist(), [False] * idx.size, none, none, none)
            trans = None  # the memo's transitions at this picosecond (looked up once: now stays)
            for i, ti_, ri_, ci_, fast_, hbm_, tc_, rc_ in rows:
                g = gpus[i]
                if not ci_:  # traffic costs nothing on a GPU without a collective kernel: remember it
                    g._tx, g._rx = ti_, ri_
                    if g._tok is not None:
                        g._retoken((g._tok, "N", ti_, ri_, _copysign(1.0, ti_), _copysign(1.0, ri_)))
                elif fast_:  # set_traffic's fast path, decided above (board[1]: below)
                    g._advance()
                    g._comm_hbm = hbm_
                    g._tx = tc_
                    g._rx = rc_
                    g._comm_rate = 1.0
                    tok = g._tok
                    if tok is not None:
                        if g._memo is memo:  # _retoken inlined (the GPU runs a collective: _ks is not empty)
                            if trans is None:
                                trans = memo.at(g.engine.now)
                            key = (tok, "F", hbm_, tc_, rc_)
                            tok = trans.get(key)
                            if tok is None:
                                tok = trans[key] = memo.fresh()
                            g._tok = tok
                        else:
                            g._retoken((tok, "F", hbm_, tc_, rc_))
                    if g.record:
                        g._record()
                else:
                    g.set_traffic(ti_, ri_)
            if batched:
                board[1, idx[fast]] = 1.0
        scale, low = _comm_scale(board, tx.size)
        return scale if low else None

    memo = _Memo()
    counts, rates = memoryview(board[0]), memoryview(board[1])  # (the GPUs' stores: see GPUDevice)
    for i, g in enumerate(gpus):
        g._net = net
        g._board, g._brate, g._slot = counts, rates, i
        board[0, i], board[1, i] = g._ncomm, g._comm_rate
        if shared and not g.record and not g._ks and not g._transfers and g._timer.time is None:
            g._memo = memo  # (a recorded GPU keeps its counters: it computes every transition)
            g._tok = memo.canon(g)
    net.set_throttle(throttle)
