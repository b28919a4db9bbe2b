"""The machine a plan is made for: ranks, memory tiers, the GPU model and the network's figures.

Communication enters the planner through :class:`AlphaBetaComm`, a per-rank alpha-beta view of
a direct (pairwise, all transfers concurrent) AlltoAllv: rank ``r`` is busy for

    max( alpha_intra + max(sent_intra, received_intra) / bw_intra,
         alpha_inter + max(sent_inter, received_inter) / bw_inter )

(a term only when that class of traffic is non-zero): inside a node a GPU's NVSwitch port and
between nodes its own NIC are separate full-duplex links, so the two classes overlap. The
figures come from the network model (:mod:`sim.network`) for the chosen topology:
:meth:`AlphaBetaComm.from_topology` probes ``estimate_alltoallv_time_s`` with one intra-node and
one inter-node transfer of two sizes and solves for alpha and bandwidth, and AllReduce times are
``estimate_allreduce_time_s`` itself. The collective's time is the slowest rank's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from neonic.host.iteration import IterationSpec
from neonic.sim.gpu import GPUSpec, hbm_capacity_bytes

__all__ = ["AlphaBetaComm", "MemoryTiers", "PlannerSystem"]

GIB = 2**30


@dataclass(frozen=True)
class AlphaBetaComm:
    """Per-rank AlltoAllv times and AllReduce times for one topology (see module doc).

    ``allreduce`` (optional) is ``f(nbytes, ranks) -> seconds`` from the network model; without
    it a flat ring over the slower class is used: ``2 (n-1) (alpha + nbytes / (n bw))``, the
    uncontended time of the network's streamed ring (every hop carries ``2 (n-1)/n`` of the
    bytes at once, and the pipeline fill is the ``2 (n-1)`` hop latencies).
    """

    nodes: int
    gpus_per_node: int
    alpha_intra_s: float
    bw_intra_bytes_per_s: float
    alpha_inter_s: float
    bw_inter_bytes_per_s: float
    allreduce: Any = None
    source: str = "explicit"
    #: flows a collective keeps open from one GPU through its NIC (``alltoallv``, ``allreduce``:
    #: ``sim.network.collectives.nic_flows_per_gpu`` for the run's algorithms): concurrent
    #: collectives share a NIC in proportion to them (max-min fairness per flow); empty: equally
    nic_flows: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("bw_intra_bytes_per_s", "bw_inter_bytes_per_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"network.{name}: expected > 0, got {value!r}")
        for name in ("alpha_intra_s", "alpha_inter_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"network.{name}: expected >= 0, got {getattr(self, name)!r}")

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @classmethod
    def from_topology(cls, topology: Any, nodes: int | None = None, allreduce_algorithm: str = "hierarchical",
                      alltoall_algorithm: str = "direct") -> "AlphaBetaComm":
        """Calibrate from ``sim.network``'s closed-form estimates for ``topology``. AllReduce
        times are the network model's closed form for ``allreduce_algorithm`` (the algorithm the
        simulator runs), fitted as alpha + bytes / bandwidth per rank count from two probes
        (1 MiB, 1 GiB; the closed forms are affine in the bytes above their chunk rounding)."""
        import neonic.sim.network as network

        g = int(topology.gpus_per_node)
        n_nodes = int(topology.nodes)
        world = n_nodes * g
        if not hasattr(network, "estimate_alltoallv_time_s"):
            return cls._from_config(topology)

        def probe(dst: int, nbytes: float) -> float:
            m = np.zeros((world, world))
            m[0, dst] = nbytes
            return float(network.estimate_alltoallv_time_s(topology, m))

        def fit(dst: int) -> tuple[float, float]:
            small, large = 1 << 20, 1 << 26
            t1, t2 = probe(dst, small), probe(dst, large)
            bw = (large - small) / (t2 - t1)
            return max(t1 - small / bw, 0.0), bw

        a_intra, bw_intra = fit(1) if g > 1 else (0.0, 1e15)
        a_inter, bw_inter = fit(g) if n_nodes > 1 else (a_intra, bw_intra)
        fits: dict[int, tuple[float, float]] = {}

        def allreduce(nbytes: float, ranks: int) -> float:
            if ranks not in fits:
                small, large = 1 << 20, 1 << 30
                members = list(range(ranks))
                t1 = float(network.estimate_allreduce_time_s(topology, small, members, algorithm=allreduce_algorithm))
                t2 = float(network.estimate_allreduce_time_s(topology, large, members, algorithm=allreduce_algorithm))
                slope = (t2 - t1) / (large - small)
                fits[ranks] = (max(t1 - small * slope, 0.0), slope)
            alpha, slope = fits[ranks]
            return alpha + slope * nbytes

        from neonic.sim.network.collectives import nic_flows_per_gpu

        flows = {"alltoallv": nic_flows_per_gpu(topology, "alltoallv", alltoall_algorithm),
                 "allreduce": nic_flows_per_gpu(topology, "allreduce", allreduce_algorithm)}
        return cls(nodes=nodes or n_nodes, gpus_per_node=g, alpha_intra_s=a_intra, bw_intra_bytes_per_s=bw_intra,
                   alpha_inter_s=a_inter, bw_inter_bytes_per_s=bw_inter, allreduce=allreduce,
                   source=f"sim.network:{getattr(topology, 'name', 'topology')} (allreduce {allreduce_algorithm})",
                   nic_flows=flows)

    @classmethod
    def _from_config(cls, topology: Any) -> "AlphaBetaComm":
        """Fallback while the network model offers no closed forms: the topology's configured
        per-GPU figures (intra-node bandwidth and latency; the GPU's share of NIC line rate)."""
        c = topology.config
        intra_bw = c.intra_node.bandwidth_gbps * 1e9 / 8
        inter_bw = c.nic.bandwidth_gbps * 1e9 / 8 * c.nic.per_node / c.cluster.gpus_per_node
        alpha_intra = (2 * c.intra_node.link_latency_ns + c.intra_node.switch_latency_ns) * 1e-9
        alpha_inter = (2 * c.nic.latency_ns + c.inter_node.switch_latency_ns + c.transport.message_overhead_ns) * 1e-9
        return cls(nodes=topology.nodes, gpus_per_node=topology.gpus_per_node, alpha_intra_s=alpha_intra,
                   bw_intra_bytes_per_s=intra_bw, alpha_inter_s=alpha_inter, bw_inter_bytes_per_s=inter_bw,
                   source=f"config:{c.name}")

    def rank_times_s(self, agg: np.ndarray) -> np.ndarray:
        """Per-rank AlltoAllv busy time from ``agg[..., 4, N]`` = (sent_intra, sent_inter,
        received_intra, received_inter) bytes; leading axes are kept (one per collective)."""
        # both classes at once (intra, inter): the same arithmetic as one class at a time, in
        # half the array operations (the search calls this some 30k times per plan)
        ab = self.__dict__.get("_alpha_bw")
        if ab is None:
            ab = (np.array([[self.alpha_intra_s], [self.alpha_inter_s]]),
                  np.array([[self.bw_intra_bytes_per_s], [self.bw_inter_bytes_per_s]]))
            object.__setattr__(self, "_alpha_bw", ab)
        busiest = np.maximum(agg[..., 0:2, :], agg[..., 2:4, :])    # (..., [intra, inter], N)
        return np.where(busiest > 0, ab[0] + busiest / ab[1], 0.0).max(axis=-2)

    def alltoallv_time_s(self, sizes: np.ndarray) -> float:
        """The whole collective's time for a full size matrix (bytes, ``sizes[src, dst]``)."""
        from neonic.host.planner.work import matrix_aggregates

        return float(self.rank_times_s(matrix_aggregates(sizes, self.gpus_per_node)).max(initial=0.0))

    def allreduce_time_s(self, nbytes: float, ranks: int) -> float:
        """AllReduce of ``nbytes`` over the first ``ranks`` ranks."""
        if nbytes <= 0 or ranks <= 1:
            return 0.0
        if self.allreduce is not None:
            return self.allreduce(nbytes, ranks)
        bw = self.bw_inter_bytes_per_s if ranks > self.gpus_per_node else self.bw_intra_bytes_per_s
        alpha = self.alpha_inter_s if ranks > self.gpus_per_node else self.alpha_intra_s
        return 2 * (ranks - 1) * (alpha + nbytes / (ranks * bw))


@dataclass(frozen=True)
class MemoryTiers:
    """Capacity per tier. HBM per GPU comes from the GPU model (minus its reserve);
    ``dram_gib_per_node`` and ``ssd_gib_per_node`` are what the hosts give to embeddings (shared
    by the node's GPUs). Shards in DRAM/SSD are served through an HBM cache holding
    ``cache_load_factor`` of their rows (FBGEMM's default 0.2), with ``cache_hit_rate`` of
    lookups hitting it (an assumption unless measured from traces); misses move rows over the
    GPU's PCIe link (DRAM) or at ``ssd_gbytes_per_s`` (SSD)."""

    dram_gib_per_node: float = 0.0
    ssd_gib_per_node: float = 0.0
    cache_load_factor: float = 0.2
    cache_hit_rate: float = 0.9
    ssd_gbytes_per_s: float = 3.0
    #: the HBM cache's organisation (hit rates from the run's lookups: ``sim.memory_tiers``)
    cache_ways: int = 32
    cache_policy: str = "lru"
    #: the node's GPU-host link per GPU (the topology's ``[host_link]``); None: the GPU model's PCIe
    host_link_gbytes_per_s: float | None = None
    #: what joins CPU memory and GPU (``sim.memory_tiers.LINKS``); on ``shared_hbm`` host-tier
    #: rows are read in place: no HBM cache, no misses
    link: str = "pcie"

    def __post_init__(self) -> None:
        for name in ("dram_gib_per_node", "ssd_gib_per_node"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"memory.{name}: expected >= 0, got {getattr(self, name)!r}")
        if not 0 < self.cache_load_factor <= 1:
            raise ValueError(f"memory.cache_load_factor: expected in (0, 1], got {self.cache_load_factor!r}")
        if not 0 <= self.cache_hit_rate <= 1:
            raise ValueError(f"memory.cache_hit_rate: expected in [0, 1], got {self.cache_hit_rate!r}")
        if not self.ssd_gbytes_per_s > 0:
            raise ValueError(f"memory.ssd_gbytes_per_s: expected > 0, got {self.ssd_gbytes_per_s!r}")
        from neonic.sim.memory_tiers import uses_cache
        uses_cache(self.link)   # checks the name

    @property
    def cached(self) -> bool:
        """Whether host-tier shards are served through an HBM cache (not on shared HBM)."""
        from neonic.sim.memory_tiers import uses_cache
        return uses_cache(self.link)


@dataclass(frozen=True)
class PlannerSystem:
    """Ranks, GPU model, network figures and memory tiers, plus wire formats of the AlltoAlls:
    ``index_bytes`` per lookup index and ``length_bytes`` per bag length in the input AlltoAll,
    ``comm_dtype`` of pooled embeddings (the forward's wire precision, ``[comm_precision] forward``;
    ``fp16``/``bf16`` = quantized comms; the backward's and the AllReduce's are the iteration's), and
    the iteration the plan is for (``host.iteration.IterationSpec``: schedule, algorithms)."""

    gpu: GPUSpec
    comm: AlphaBetaComm
    memory: MemoryTiers = field(default_factory=MemoryTiers)
    index_bytes: int = 8
    length_bytes: int = 4
    comm_dtype: str = "fp32"
    iteration: IterationSpec = field(default_factory=IterationSpec)
    #: the run's lookups (``sim.lookups.LookupBatch``) or None: where they are given, they
    #: decide each row shard's share of a table's lookups and a traced table's pooling
    #: (``host.lookups``); None: lookups spread over row shards by rows, pooling from the spec
    lookups: Any = None
    _hit_memo: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.comm_dtype not in ("fp32", "fp16", "bf16"):
            raise ValueError(f"comm_dtype: expected fp32, fp16 or bf16, got {self.comm_dtype!r}")
        for name in ("index_bytes", "length_bytes"):
            if getattr(self, name) not in (4, 8):
                raise ValueError(f"{name}: expected 4 or 8, got {getattr(self, name)!r}")

    @property
    def world_size(self) -> int:
        return self.comm.world_size

    @property
    def host_link_bytes_per_s(self) -> float:
        """The GPU-host link's bandwidth (bytes/s) that host-tier misses cross."""
        gbs = self.memory.host_link_gbytes_per_s
        return (gbs if gbs is not None else self.gpu.pcie_gbytes_per_s) * 1e9

    def tier_hit_rate(self, table: Any) -> float:
        """Hit rate of the HBM cache in front of ``table``'s host-tier shards: from the run's
        lookups through ``sim.memory_tiers.cache_hit_rate`` where given, else the configured
        ``memory.cache_hit_rate``."""
        tl = None if self.lookups is None else self.lookups.tables.get(table.name)
        if tl is None:
            return self.memory.cache_hit_rate
        key = table.name
        if key not in self._hit_memo:
            from neonic.sim.memory_tiers import cache_hit_rate

            self._hit_memo[key] = cache_hit_rate(tl, table.rows, self.memory.cache_load_factor,
                                                 self.memory.cache_policy)
        return self._hit_memo[key]

    def pooling_of(self, table: Any) -> float:
        """Mean lookups per bag of ``table``: its trace file's when the run's lookups come from
        one, else the workload's figure (a locality fit reproduces reuse, not volume)."""
        tl = None if self.lookups is None else self.lookups.tables.get(table.name)
        if tl is None or not tl.source.startswith("trace:"):
            return float(table.pooling)
        return tl.mean_pooling

    def row_shares(self, table: Any, bounds: list[tuple[int, int]]) -> np.ndarray:
        """Share of ``table``'s lookups falling in each row range: a traced (or locality-fitted)
        table's measured shares; otherwise in proportion to rows (hashed ids; the Zipf default
        keeps this expectation rather than the noise of a sampled batch)."""
        tl = None if self.lookups is None else self.lookups.tables.get(table.name)
        if tl is None or tl.source.startswith("zipf"):
            return np.array([(b - a) / table.rows for a, b in bounds])
        return tl.row_share(bounds)

    def row_shares_of(self, table: Any, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """:meth:`row_shares` of the row ranges ``[starts[i], ends[i])`` given as arrays
        (the same figures: in proportion to rows, ``(end - start) / rows`` divided as doubles,
        exact as Python's division of the integers, all below 2**53; a traced table's from its trace)."""
        tl = None if self.lookups is None else self.lookups.tables.get(table.name)
        if tl is None or tl.source.startswith("zipf"):
            return (np.asarray(ends, dtype=np.int64) - np.asarray(starts, dtype=np.int64)) / table.rows
        return tl.row_share(list(zip(np.asarray(starts).tolist(), np.asarray(ends).tolist())))

    @property
    def nodes(self) -> int:
        return self.comm.nodes

    @property
    def gpus_per_node(self) -> int:
        return self.comm.gpus_per_node

    @property
    def comm_bytes(self) -> int:
        return 4 if self.comm_dtype == "fp32" else 2

    @property
    def hbm_capacity(self) -> float:
        """Bytes of HBM per GPU usable for embeddings (the GPU model's reserve removed)."""
        return float(hbm_capacity_bytes(self.gpu))

    @property
    def dram_capacity(self) -> float:
        return self.memory.dram_gib_per_node * GIB / self.gpus_per_node

    @property
    def ssd_capacity(self) -> float:
        return self.memory.ssd_gib_per_node * GIB / self.gpus_per_node

    def node_of(self) -> np.ndarray:
        return np.arange(self.world_size) // self.gpus_per_node
