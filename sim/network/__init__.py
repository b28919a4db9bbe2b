"""Flow-level network model and the collectives of DLRM training.

Public API::

    from neonic.sim.engine import Engine
    from neonic.sim.network import Topology, Network, collectives as coll
    topo = Topology.from_preset("zionex")             # presets: zionex, zion, dgx-h100
    topo = Topology.from_config("my.toml")            # or a dict; validated field by field
    topo.num_gpus, topo.nodes, topo.gpus_per_node, topo.host_endpoint(node), topo.link_names
    eng = Engine(); net = Network(eng, topo)          # coalesce_rel=0.02, aggregate=True (see network.py)
    g = net.start_flow(src, dst, nbytes, on_done=cb, tag="x")   # cb(group) at arrival
    g = net.start_flows(srcs, dsts, nbytes_array, on_done=cb)   # one group, vectorised
    g.end_ps, g.finish_ps                             # int ps
    net.link_bytes, net.link_wire_bytes               # per link (numpy), delivered so far
    net.link_class_bytes()                            # {"nvlink": .., "pcie": .., "nic": .., ...}

    h = coll.alltoallv(net, ranks, sizes, algorithm="direct" | "hierarchical", on_done=cb)
    h = coll.alltoall(net, ranks, nbytes_per_pair, ...)
    h = coll.allreduce(net, ranks, nbytes, algorithm="ring" | "double_binary_tree" | "hierarchical",
                       chunks=1, on_done=cb)     # chunks: the tree's pipeline; rings are streamed
    h = coll.reduce_scatter(net, ranks, nbytes); h = coll.all_gather(net, ranks, nbytes)
    eng.run(); h.end_ps, h.time_ps, h.time_s, h.link_bytes, h.link_class_bytes()
    # ranks=None means all GPUs; collectives start at the engine's current time and share links
    # with everything else in flight.

    # closed-form (alpha-beta) estimates, no engine, for planners' cost models:
    estimate_alltoallv_time_s(topo, sizes, ranks=None, algorithm="direct")
    estimate_allreduce_time_s(topo, nbytes, ranks=None, algorithm="ring", chunks=1)
    estimate_reduce_scatter_time_s / estimate_all_gather_time_s(topo, nbytes, ranks=None)

Model assumptions (details in each module's docstring):
- Flows are fluids on fixed routes; no packets, queues, losses, congestion-control dynamics or
  slow start. Concurrent flows share links max-min fairly (exact progressive filling), rates
  recomputed when flows start or finish (finishes within 2% of flow age coalesced into one
  recompute, with a first-order credit for the capacity they free; exact with coalesce_rel=0).
- Solve by flow class: flows that max-min sharing must treat alike (same size, same numbers of
  each kind of link, on a symmetric topology) are solved as one variable with a multiplicity
  (sim.network.classes); exact, so results do not depend on it (aggregate=False: per flow).
  Uneven sizes, slowed links and overlapping groups fall back to per-flow where they must.
- Latency (links + switches + TCP per-message overhead) is added once per message.
- Links are directional, each with bandwidth and latency; RoCEv2 / TCP framing inflates the
  bytes on NIC and spine links; ECMP over spines is a perfect even split (one bundle per leaf).
- GPUDirect RDMA with NICs on GPUs bypasses the host PCIe link; NICs on hosts or TCP cross
  PCIe (and, for TCP, one host-memory copy link per node at each end).
- Collectives are DAGs of phases (a phase ends with its last message); ring collectives are
  streamed: one phase of concurrent hop flows per ring stage, each hop carrying all of its ring
  steps' bytes, plus the pipeline fill (sim.network.collectives). Reductions cost no time.
"""

from .collectives import CollectiveHandle
from .config import NetworkConfig, load_config, load_preset, preset_names
from .estimate import (
    estimate_all_gather_time_s,
    estimate_allreduce_time_s,
    estimate_alltoallv_time_s,
    estimate_reduce_scatter_time_s,
)
from .network import FlowGroup, Network
from .topology import LINK_CLASSES, Topology
from . import collectives

__all__ = [
    "CollectiveHandle",
    "FlowGroup",
    "LINK_CLASSES",
    "Network",
    "NetworkConfig",
    "Topology",
    "collectives",
    "estimate_all_gather_time_s",
    "estimate_allreduce_time_s",
    "estimate_alltoallv_time_s",
    "estimate_reduce_scatter_time_s",
    "load_config",
    "load_preset",
    "preset_names",
]
