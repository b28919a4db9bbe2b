"""Collectives as DAGs of phases of messages, run on a :class:`Network`.

A *phase* is a set of messages started together; it completes when its last message arrives.
A phase starts when all the phases it depends on have completed (at that engine time), so
independent phases (pipelined chunks, the two trees of a double binary tree) overlap and share
links with each other and with any other traffic on the network. Reductions are assumed to be
computed faster than the links deliver (no compute time). Data a rank keeps for itself is not
sent. Sizes are in bytes; a buffer of ``n`` bytes split into ``k`` parts gives parts of
``floor`` / ``ceil`` (n / k) bytes that sum to ``n`` exactly.

Streamed rings
    NCCL runs a ring collective as a pipeline of small chunks: every rank sends, receives (and
    reduces) at once, and forwards a chunk as soon as it has it; no ring step waits for the
    whole ring (``runRing`` in NVIDIA/nccl ``src/device/all_reduce.h``: per chunk a ``send``,
    ``recvReduceSend`` steps, ``directRecvReduceCopySend``, ``directRecvCopySend`` steps and a
    final ``directRecv``, with the chunks of a loop in flight through every hop). A ring of
    ``p`` ranks over a buffer of ``S`` bytes (split into ``p`` segments) is therefore ONE phase
    of ``p`` concurrent hop flows (rank ``i`` -> rank ``i + 1``), each carrying the bytes all of
    that hop's ring steps carry: a reduce-scatter or all-gather step ``s`` (0..p-2) has rank
    ``i`` send segment ``(i - s) mod p``, so a hop carries every segment but ``(i + 1) mod p``,
    ``S - seg[(i + 1) mod p]`` bytes ((p-1)/p of S; NCCL-tests' bus-bandwidth factor (n-1)/n,
    NVIDIA/nccl-tests ``doc/PERFORMANCE.md``); an all-reduce (reduce-scatter, then all-gather
    of the reduced segments) carries ``2 S - seg[(i + 1) mod p] - seg[(i + 2) mod p]`` (2(p-1)/p
    of S, the factor 2(n-1)/n). On the wire a hop is framed as the step messages it stands for
    (``p - 1`` resp. ``2 (p - 1)`` messages of one segment each), so every link carries the
    same payload and wire bytes as a ring run step by step.
    Pipeline fill: the last byte through a hop has crossed the ``p - 1`` (all-reduce: ``2 (p -
    1)``) consecutive hops of the ring that end there, so a hop's message arrives that many
    hops' route latencies after its last byte leaves (each hop's latency is what the network
    applies to one message on that route). This is NCCL's ring latency model, per-step
    latencies summed along the ring's ``nsteps`` steps, its ``nInterSteps`` at the network's
    latency (``src/graph/tuning.cc``). The form is the limit of a ring pipelined in ``c`` chunks
    as ``c`` grows, with each chunk's latency hidden behind the chunks in flight but the fill's:
    the bandwidth term is the hops' bytes at their max-min rates, the latency term the fill. On
    an uncontended ring of equal segments and equal hop latencies it equals the step form,
    ``steps * (latency + segment / bandwidth)``. Each hop's flow gets its own max-min rate, so a
    hop faster than the ring's slowest finishes early and frees its links; the ring ends with
    its slowest hop (in a real pipeline every hop runs at the slowest hop's rate throughout).

Connections: how concurrent collectives share a NIC
    Flows share every link max-min fairly per flow (:mod:`.network`). What a real NIC shares
    fairly is its send queues: NCCL gives every channel of a collective its own connection to
    each peer, an RDMA queue pair (QP) on the NIC (``NCCL_IB_QPS_PER_CONNECTION`` of them,
    default 1), and the NIC serves its backlogged QPs in turn. So a message that crosses
    nodes is run as :data:`NCCL_CONNECTIONS`'s count of equal flows (each with its share of
    the bytes; ``Phase.conns``): a ring or tree hop as the ring channels that cross one NIC,
    an AlltoAll's message to an off-node peer as the point-to-point channels per network
    peer. Alone a collective runs exactly as before (its flows split a link between them);
    beside another it gets the NIC in proportion to its QPs. :func:`nic_flows_per_gpu` counts
    them for the planner's fast evaluation: one definition for both views. Node-local
    messages (NVLink) stay one flow each: NVLink traffic is moved by the channels' thread
    blocks, not served by QP arbitration, and its sharing is not modelled here (ASSUMPTION:
    per message).

Algorithms
    alltoallv ``direct``: every rank sends each peer its block at once (one phase).
    alltoallv ``hierarchical``: (1) inside each node, every GPU sends each local peer the data
      that peer will forward across nodes, plus the peer's own intra-node block; (2) for each
      pair of nodes (n, m) one message carries all of n's data for m, sent by local rank
      ``(i_n + i_m) mod k`` of node n to the same local rank of node m (this spreads senders
      and receivers evenly over the NICs); (3) inside each node, that GPU scatters the data to
      its final owners. It needs the same number of participating ranks on every node.
    allreduce ``ring``: a streamed ring all-reduce over ``ranks``. ``double_binary_tree``: two
      complementary binary trees (NCCL-style: a rank that is interior in one is a leaf in the
      other) each reduce then broadcast half of the buffer, level by level; ``chunks=c`` splits
      each half into c pipelined chunks: phase (chunk j, level step s) waits for (j, s-1) and
      (j-1, s). ``hierarchical``: a streamed ring reduce-scatter inside each node, a streamed
      ring all-reduce of each 1/k slice among the same local ranks of all nodes (the k rings
      side by side in one phase), a streamed ring all-gather inside each node.
    reduce_scatter / all_gather: a streamed ring. ``nbytes`` is the full buffer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from neonic.sim.compiled import HAVE_NUMBA, jit

from .network import FlowGroup, Network
from .transport import wire_bytes
from .topology import Route, Topology

__all__ = [
    "Phase",
    "phase_route",
    "CollectiveHandle",
    "alltoallv",
    "alltoall",
    "allreduce",
    "reduce_scatter",
    "all_gather",
    "build_phases",
    "nic_flows_per_gpu",
    "double_binary_trees",
    "split_bytes",
    "NicConnections",
    "NCCL_CONNECTIONS",
    "split_connections",
]


@dataclass(frozen=True)
class NicConnections:
    """The connections (RDMA queue pairs, QPs) a collective keeps open on a NIC for each of its
    messages that crosses nodes: concurrent collectives share the NIC in proportion to them
    (module doc). The defaults are NCCL 2.10.3's (tag ``v2.10.3-1``, commit 7e51592, of github.com/NVIDIA/nccl;
    ASSUMPTION: the NCCL a 2021-22 ZionEX training job ran, Neo's era) on a node with one NIC
    per GPU (ZionEX: one 200 Gb/s RoCE NIC per A100).

    ``ring_channels_per_nic``: the ring (and tree) channels that cross one NIC. NCCL's
    topology search builds one ring channel per NIC when each channel runs at the NIC's speed
    (``src/graph/search.cc``; as reported for a node with 8 ConnectX-6 NICs and 8 GPUs, 8
    channels: github.com/NVIDIA/nccl/issues/977), and ``ncclTopoPostset`` then doubles the
    channels (``src/graph/connect.cc``: ``nChannels = min(MAXCHANNELS, nChannels*2)``): 2.

    ``p2p_channels_per_net_peer``: the channels a send/recv (an AlltoAll's message) to an
    off-node peer uses: ``ncclTopoComputeP2pChannels`` (``src/graph/paths.cc``) sets
    ``p2pnChannelsPerPeer`` to the next power of two of the fewest channels over all peers,
    and a remote (network) peer has 1 (``ncclTopoGetNchannels``); ``src/group.cc`` puts every
    chunk of a peer's send on ``p2pChannels[chunk % p2pnChannelsPerPeer]``: 1. Every peer's
    send is in flight at once: the peers go round the ``p2pnChannels`` channels by ``delta``
    and each channel's work runs up to ``NCCL_MAX_WORK_ELEMENTS`` (8) of them side by side
    (``src/enqueue.cc``, ``src/collectives/device/sendrecv.h``); 127 peers on 16 channels is
    8 per channel.

    ``qps_per_connection``: ``NCCL_IB_QPS_PER_CONNECTION``, default 1
    (``src/transport/net_ib.cc``).

    ASSUMPTION: the NIC serves its backlogged QPs round-robin with equal shares (one traffic
    class); no public ConnectX document of its send-queue arbitration was found."""

    ring_channels_per_nic: int = 2
    p2p_channels_per_net_peer: int = 1
    qps_per_connection: int = 1

    def __post_init__(self) -> None:
        for name in ("ring_channels_per_nic", "p2p_channels_per_net_peer", "qps_per_connection"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")

    @property
    def ring(self) -> int:
        """QPs on a NIC per ring or tree hop that crosses it."""
        return int(self.ring_channels_per_nic * self.qps_per_connection)

    @property
    def p2p(self) -> int:
        """QPs on a NIC per AlltoAll message to an off-node peer."""
        return int(self.p2p_channels_per_net_peer * self.qps_per_connection)


#: NCCL 2.10.3's defaults (:class:`NicConnections`): what the network and the planner use.
NCCL_CONNECTIONS = NicConnections()


@dataclass
class Phase:
    """Messages ``src[i] -> dst[i]`` of ``nbytes[i]`` payload bytes started together, after the
    phases ``deps`` (indices in the collective's phase list) have completed.

    ``ring`` = 0: plain messages, each framed as one message and arriving one route latency
    after its last byte. ``ring`` = p >= 2: a streamed ring phase; the messages are the hops of
    rings of ``p`` ranks, listed ring by ring in ring order (hop ``h`` of a ring goes from its
    member ``h`` to member ``(h + 1) mod p``); a hop that carries bytes arrives ``fill``
    consecutive hops' route latencies (those ending at it) after its last byte, and is framed as
    the step messages whose on-the-wire bytes ``wire_bytes`` gives (module doc).

    ``conns``: the connections (NIC queue pairs) each message is carried on (None: one each);
    the network runs message ``i`` as ``conns[i]`` equal flows (:func:`split_connections`).
    """

    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    deps: list[int] = field(default_factory=list)
    label: str = ""
    ring: int = 0
    fill: int = 1
    wire_bytes: np.ndarray | None = None
    conns: np.ndarray | None = None


def phase_route(topology: Topology, phase: Phase, route: Route | None = None) -> Route:
    """The route of ``phase``'s messages as the network runs them: ``route`` (or
    ``topology.route``) of its pairs, with a streamed ring's pipeline-fill latencies and
    step-message framing."""
    if route is None:
        route = topology.route(phase.src, phase.dst, phase.nbytes)
    elif route.factor.shape != phase.nbytes.shape:
        raise ValueError(f"route: expected the route of the phase's {phase.nbytes.size} messages")
    if not phase.ring:
        return route
    p = phase.ring
    lat = route.latency_ps.reshape(-1, p)
    # the fill hops ending at hop h: q whole turns of the ring, then the r hops h, h-1, .., h-r+1
    q, r = divmod(int(phase.fill), p)
    turns = np.cumsum(np.concatenate([np.zeros((lat.shape[0], 1), dtype=np.int64), lat, lat], axis=1), axis=1)
    h = np.arange(p)
    fill = q * turns[:, p:p + 1] + turns[:, h + p + 1] - turns[:, h + p + 1 - r]
    moving = phase.nbytes > 0
    latency = np.where(moving, fill.ravel(), 0)  # a hop with nothing to carry arrives at once
    factor = route.factor
    if phase.wire_bytes is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            factor = np.where(moving, phase.wire_bytes / phase.nbytes, 1.0)
    return Route(links=route.links, latency_ps=latency, factor=factor, acct=route.acct)


class CollectiveHandle:
    """A running (or finished) collective: ``end_ps``, ``time_ps``, ``link_bytes``."""

    def __init__(self, net: Network, name: str, algorithm: str, ranks: np.ndarray, phases: list[Phase],
                 on_done: Callable[["CollectiveHandle"], Any] | None) -> None:
        self.net = net
        self.name = name
        self.algorithm = algorithm
        self.ranks = ranks
        self.phases = phases
        self.on_done = on_done
        self.start_ps = net.engine.now
        self.end_ps: int | None = None
        topo = net.topology
        self.link_bytes = np.zeros(topo.num_links)  # payload bytes over each link
        self.link_wire_bytes = np.zeros(topo.num_links)
        self.phase_end_ps = np.full(len(phases), -1, dtype=np.int64)
        self.groups: list[FlowGroup | None] = [None] * len(phases)
        self._waiting = np.array([len(p.deps) for p in phases], dtype=np.int64)
        self._children: list[list[int]] = [[] for _ in phases]
        for i, p in enumerate(phases):
            for d in p.deps:
                self._children[d].append(i)
        self._left = len(phases)
        self._routes: dict[tuple[bytes, bytes], Any] = {}  # routes by (src, dst) of its phases

    @property
    def done(self) -> bool:
        return self.end_ps is not None

    @property
    def time_ps(self) -> int | None:
        return None if self.end_ps is None else self.end_ps - self.start_ps

    @property
    def time_s(self) -> float | None:
        return None if self.end_ps is None else (self.end_ps - self.start_ps) * 1e-12

    def link_class_bytes(self, *, wire: bool = False) -> dict[str, float]:
        return self.net.topology.class_totals(self.link_wire_bytes if wire else self.link_bytes)

    def __repr__(self) -> str:
        return f"CollectiveHandle({self.name}/{self.algorithm}, ranks={self.ranks.size}, time_ps={self.time_ps})"

    # ------------------------------------------------------------------------------ running
    def _start(self) -> None:
        if not self.phases:
            self.net.engine.after(0, self._finish)
            return
        for i, p in enumerate(self.phases):
            if not p.deps:
                self._start_phase(i)

    def _start_phase(self, i: int) -> None:
        p = self.phases[i]
        topo = self.net.topology
        L = topo.num_links
        route = None
        if p.src.size and len(self.phases) == 1:  # nothing to share (a direct AlltoAllv: 16.8M pairs
            route = topo.route(p.src, p.dst, p.nbytes)  # at 4096 GPUs, 0.8 GB of routes and keys)
        elif p.src.size:
            # phases of one collective often repeat their pairs (a tree's pipelined chunks): route them once
            key = (p.src.tobytes(), p.dst.tobytes())
            known = self._routes.get(key)
            if known is None:
                route = self._routes[key] = topo.route(p.src, p.dst, p.nbytes)
            else:
                route = topo.resized(known, p.nbytes)
        if p.src.size:
            route = phase_route(topo, p, route)
            pay, wire = topo.both_loads(route, p.nbytes)
            self.link_bytes += pay[:L]
            self.link_wire_bytes += wire[:L]
            src, dst, nbytes, route = split_connections(p, route)
        else:
            src, dst, nbytes = p.src, p.dst, p.nbytes
        self.groups[i] = self.net.start_flows(src, dst, nbytes, self._phase_done, tag=(self, i), route=route)

    def _phase_done(self, g: FlowGroup) -> None:
        i = g.tag[1]
        self.phase_end_ps[i] = g.end_ps
        self._left -= 1
        for c in self._children[i]:
            self._waiting[c] -= 1
            if self._waiting[c] == 0:
                self._start_phase(c)
        if self._left == 0:
            self._finish()

    def _finish(self) -> None:
        self.end_ps = self.net.engine.now
        if self.on_done is not None:
            self.on_done(self)


# ------------------------------------------------------------------------------- helpers
def split_bytes(n: int, k: int) -> np.ndarray:
    """``n`` bytes in ``k`` parts (the first ``n % k`` one byte larger); sums to ``n``."""
    base, extra = divmod(int(n), int(k))
    out = np.full(k, base, dtype=np.int64)
    out[:extra] += 1
    return out


def split_connections(phase: Phase, route: Route) -> tuple[np.ndarray, np.ndarray, np.ndarray, Route]:
    """``phase``'s messages as the flows the network runs (``src``, ``dst``, ``nbytes``,
    ``route``): message ``i`` as ``phase.conns[i]`` flows on its route with its latency and
    framing, its bytes split as :func:`split_bytes` splits them (module doc, "Connections")."""
    c = None if phase.conns is None else np.asarray(phase.conns, dtype=np.int64)
    if c is None or not np.any(c > 1):
        return phase.src, phase.dst, phase.nbytes, route
    idx = np.repeat(np.arange(c.size), c)
    first = np.repeat(np.cumsum(c) - c, c)
    k = np.arange(idx.size) - first                      # the flow's place among its message's
    nb = np.asarray(phase.nbytes, dtype=np.int64)[idx]
    cc = c[idx]
    parts = nb // cc + (k < nb % cc)
    return (phase.src[idx], phase.dst[idx], parts,
            Route(links=route.links[:, idx], latency_ps=route.latency_ps[idx], factor=route.factor[idx],
                  acct=route.acct[:, idx]))


def _conns(topology: Topology, src: np.ndarray, dst: np.ndarray, per_nic: int) -> np.ndarray | None:
    """``per_nic`` connections for the messages that cross nodes, one for the others (None:
    one each)."""
    if per_nic == 1:  # (before the node test: 16.8M messages at 4096 GPUs)
        return None
    off = topology.node_of(src) != topology.node_of(dst)
    if not off.any():
        return None
    return np.where(off, per_nic, 1).astype(np.int64)


def _ranks(topology: Topology, ranks: Sequence[int] | np.ndarray | None) -> np.ndarray:
    if ranks is None:
        return np.arange(topology.num_gpus, dtype=np.int64)
    r = np.asarray(ranks, dtype=np.int64).ravel()
    if r.size == 0:
        raise ValueError("ranks: expected at least one rank")
    if r.min() < 0 or r.max() >= topology.num_gpus:
        raise ValueError(f"ranks: expected GPU ranks in 0..{topology.num_gpus - 1}")
    if np.unique(r).size != r.size:
        raise ValueError("ranks: expected distinct ranks")
    return r


def _chunks(chunks: int) -> int:
    if isinstance(chunks, bool) or not isinstance(chunks, (int, np.integer)) or chunks < 1:
        raise ValueError(f"chunks: expected an integer >= 1, got {chunks!r}")
    return int(chunks)


def _nbytes(nbytes) -> int:
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
        raise ValueError(f"nbytes: expected an integer >= 0, got {nbytes!r}")
    return int(nbytes)


def _node_groups(topology: Topology, ranks: np.ndarray, what: str) -> np.ndarray:
    """(nodes, k) matrix of positions in ``ranks``, grouped by node, in rank order."""
    node = ranks // topology.gpus_per_node
    uniq, counts = np.unique(node, return_counts=True)
    if np.any(counts != counts[0]):
        raise ValueError(f"ranks: {what} needs the same number of ranks on every node, got {sorted(set(counts.tolist()))}")
    order = np.lexsort((ranks, node))
    return order.reshape(uniq.size, counts[0])


# ---------------------------------------------------------------------------- ring phases
def _ring_phase(topology: Topology, rings: np.ndarray, sizes: np.ndarray, kind: str,
                deps: list[int]) -> list[Phase]:
    """One streamed ring reduce-scatter (``kind`` "rs"), all-gather ("ag") or all-reduce ("ar")
    phase of the rings ``rings`` (R, p) of global ranks side by side, ring ``j`` over a buffer
    of ``sizes[j]`` bytes (module doc); no phase when there is nothing to send."""
    R, p = rings.shape
    sizes = np.asarray(sizes, dtype=np.int64)
    if p < 2 or not sizes.any():
        return []
    base, extra = np.divmod(sizes, p)
    seg = base[:, None] + (np.arange(p)[None, :] < extra[:, None])  # (R, p), as split_bytes
    wseg = wire_bytes(seg, topology.protocol, topology.mtu)
    h = np.arange(p)
    # hop h (member h -> h + 1) sends segment (h - s) mod p at reduce-scatter / all-gather step
    # s = 0..p-2: every segment but (h + 1) mod p. In an all-reduce's all-gather half it
    # forwards the segment it completed last, (h + 1 - t) mod p at t = 0..p-2: all but (h + 2).
    nb = sizes[:, None] - seg[:, (h + 1) % p]
    wb = wseg.sum(axis=1)[:, None] - wseg[:, (h + 1) % p]
    fill = p - 1
    if kind == "ar":
        nb = nb + sizes[:, None] - seg[:, (h + 2) % p]
        wb = wb + wseg.sum(axis=1)[:, None] - wseg[:, (h + 2) % p]
        fill = 2 * (p - 1)
    label = {"rs": "ring reduce-scatter", "ag": "ring all-gather", "ar": "ring all-reduce"}[kind]
    src, dst = rings.ravel(), np.roll(rings, -1, axis=1).ravel()
    return [Phase(src, dst, nb.ravel(), list(deps),
                  f"{label} (streamed, {R} ring{'s' if R > 1 else ''} of {p})", ring=p, fill=fill,
                  wire_bytes=wb.ravel(), conns=_conns(topology, src, dst, NCCL_CONNECTIONS.ring))]


def _terminal(phases: list[Phase], base: int) -> list[int]:
    """Indices of phases nobody depends on."""
    used = {d for p in phases for d in p.deps}
    return [base + i for i in range(len(phases)) if base + i not in used]


# --------------------------------------------------------------------------- tree phases
def _binary_tree(p: int) -> np.ndarray:
    """Parent of each position 0..p-1 (-1 at the root) of a balanced binary tree in which the
    positions x = i + 1 with lowest set bit b have children x - b/2 and x + b/2 (the right one
    descending while beyond p): odd x are leaves, as in NCCL's double binary tree."""
    parent = np.full(p, -1, dtype=np.int64)
    for x in range(1, p + 1):
        b = x & -x
        if b == 1:
            continue
        parent[x - b // 2 - 1] = x - 1
        half = b // 2
        while half >= 1 and x + half > p:
            half //= 2
        if half >= 1:
            parent[x + half - 1] = x - 1
    return parent


def double_binary_trees(p: int) -> tuple[np.ndarray, np.ndarray]:
    """Parents (position -> position, -1 at root) of two complementary binary trees over p ranks.

    Tree B is tree A on the positions mirrored (p even) or shifted by one (p odd), so that most
    ranks that are interior in one tree are leaves in the other.
    """
    a = _binary_tree(p)
    perm = (p - 1 - np.arange(p)) if p % 2 == 0 else (np.arange(p) + 1) % p
    b = np.full(p, -1, dtype=np.int64)
    # node perm[x] in tree B plays the role of x in tree A
    has = a >= 0
    b[perm[has]] = perm[a[has]]
    return a, b


def _depths(parent: np.ndarray) -> np.ndarray:
    d = np.zeros(parent.size, dtype=np.int64)
    for i in range(parent.size):
        x, k = i, 0
        while parent[x] >= 0:
            x = parent[x]
            k += 1
        d[i] = k
    return d


def _tree_phases(topology: Topology, ranks: np.ndarray, nbytes: int, chunks: int) -> list[Phase]:
    p = ranks.size
    if p < 2 or nbytes == 0:
        return []
    trees = double_binary_trees(p)
    halves = split_bytes(nbytes, 2)
    phases: list[Phase] = []
    for t, parent in enumerate(trees):
        depth = _depths(parent)
        D = int(depth.max())
        parts = split_bytes(int(halves[t]), chunks)
        # steps: reduce depth D..1 (child -> parent), then broadcast depth 1..D (parent -> child)
        steps = [("reduce", d) for d in range(D, 0, -1)] + [("bcast", d) for d in range(1, D + 1)]
        idx = {}
        for j in range(chunks):
            for s, (kind, d) in enumerate(steps):
                kids = np.flatnonzero(depth == d)
                par = parent[kids]
                if kind == "reduce":
                    src, dst = ranks[kids], ranks[par]
                else:
                    src, dst = ranks[par], ranks[kids]
                deps = []
                if s > 0:
                    deps.append(idx[(j, s - 1)])
                if j > 0:
                    deps.append(idx[(j - 1, s)])
                idx[(j, s)] = len(phases)
                phases.append(Phase(src, dst, np.full(src.size, parts[j], dtype=np.int64), deps,
                                    f"tree {t} chunk {j} {kind} depth {d}",
                                    conns=_conns(topology, src, dst, NCCL_CONNECTIONS.ring)))
    return phases


# ------------------------------------------------------------------------ phase builders
def _whole(sz: np.ndarray) -> bool:
    """Whether every element is a whole number (``np.mod(sz, 1) == 0`` everywhere: finite and
    integral). For floats, whether no ``x - floor(x)`` is nonzero (NaN for inf and NaN): the
    same answer without np.mod's division (a 4096-GPU AlltoAllv's 16.8M sizes: 0.25 s); for
    float64 with numba in one compiled pass that stops at the first fraction (no two 134 MB
    temporaries per AlltoAllv at 4096 GPUs: 0.3 s -> 0.02 s where they are freshly allocated)."""
    if sz.dtype.kind == "f":
        if HAVE_NUMBA and sz.dtype == np.float64:
            return bool(_whole_f64(np.ravel(sz, order="K")))  # (a view of C- or F-ordered sizes: no copy)
        with np.errstate(invalid="ignore"):  # (inf - inf)
            return not np.any(sz - np.floor(sz))
    return bool(np.all(np.mod(sz, 1) == 0))


@jit(cache=True, nogil=True)
def _whole_f64(a):  # pragma: no cover - compiled (run as Python by NEONIC_NO_NUMBA)
    """:func:`_whole` of a flat float64 array: False at the first ``x - floor(x)`` that is not
    0 (a fraction; NaN for inf and NaN, which compares unequal to 0)."""
    for i in range(a.shape[0]):
        x = a[i]
        if x - np.floor(x) != 0.0:
            return False
    return True


@jit(cache=True, nogil=True)
def _off_diagonal(sizes):  # pragma: no cover - compiled (run as Python by NEONIC_NO_NUMBA)
    """``np.nonzero`` of ``sizes`` with its diagonal left out (row-major order, as np.nonzero),
    and the sizes there: two passes over the matrix, no boolean matrix or fancy gather."""
    p, q = sizes.shape
    n = 0
    for a in range(p):
        for b in range(q):
            if a != b and sizes[a, b] != 0:
                n += 1
    i = np.empty(n, dtype=np.int64)
    j = np.empty(n, dtype=np.int64)
    nb = np.empty(n, dtype=np.int64)
    k = 0
    for a in range(p):
        for b in range(q):
            if a != b and sizes[a, b] != 0:
                i[k] = a
                j[k] = b
                nb[k] = sizes[a, b]
                k += 1
    return i, j, nb


def _alltoallv_phases(topology: Topology, ranks: np.ndarray, sizes: np.ndarray, algorithm: str) -> list[Phase]:
    p = ranks.size
    if algorithm == "direct":
        if HAVE_NUMBA:  # (a 4096-GPU AlltoAllv: 16.8M pairs, one compiled pass)
            i, j, nb = _off_diagonal(np.ascontiguousarray(sizes, dtype=np.int64))
        else:
            nonzero = sizes != 0  # (the diagonal left out before, not after: 16.8M pairs at 4096 GPUs)
            np.fill_diagonal(nonzero, False)
            i, j = np.nonzero(nonzero)
            del nonzero
            nb = sizes[i, j].astype(np.int64, copy=False)
        if not np.array_equal(ranks, np.arange(p)):
            i, j = ranks[i], ranks[j]
        return [Phase(i, j, nb, [], "direct", conns=_conns(topology, i, j, NCCL_CONNECTIONS.p2p))]
    if algorithm != "hierarchical":
        raise ValueError(f"algorithm: expected 'direct' or 'hierarchical', got {algorithm!r}")
    groups = _node_groups(topology, ranks, "hierarchical alltoallv")  # (M nodes, k) positions
    M, k = groups.shape
    # reorder the matrix by (node, local): S[n, a, m, c]
    flat = groups.ravel()
    S = sizes[np.ix_(flat, flat)].reshape(M, k, M, k).astype(np.int64)
    gr = ranks[groups]  # (M, k) global ranks
    n_idx = np.arange(M)
    relay = (n_idx[:, None] + n_idx[None, :]) % k  # relay local rank for node pair (n, m)
    offnode = n_idx[:, None] != n_idx[None, :]
    node_pair = S.sum(axis=(1, 3))  # (M, M) bytes from node n to node m
    # phase 1: (n, a) -> (n, b): S[n,a,n,b] + sum_{m != n, relay(n,m) = b} sum_c S[n,a,m,c]
    out_by_m = S.sum(axis=3)  # (M, k, M): from (n, a) to node m
    p1 = np.zeros((M, k, k), dtype=np.int64)
    for b in range(k):
        sel = offnode & (relay == b)  # (M, M)
        p1[:, :, b] = (out_by_m * sel[:, None, :]).sum(axis=2)
    p1 += np.einsum("nanb->nab", S)
    # phase 3: (m, r) -> (m, c): sum_{n != m, relay(n,m) = r} sum_a S[n,a,m,c]
    in_by_n = S.sum(axis=1)  # (M(n), M(m), k(c))
    p3 = np.zeros((M, k, k), dtype=np.int64)  # [m, r, c]
    for r in range(k):
        sel = offnode & (relay == r)  # (n, m)
        p3[:, r, :] = (in_by_n * sel[:, :, None]).sum(axis=0)
    phases: list[Phase] = []

    def intra(mat: np.ndarray, label: str, deps: list[int]) -> None:
        n, a, b = np.nonzero(mat)
        keep = a != b
        n, a, b = n[keep], a[keep], b[keep]
        phases.append(Phase(gr[n, a], gr[n, b], mat[n, a, b], deps, label))

    intra(p1, "hierarchical: intra-node gather", [])
    n, m = np.nonzero(offnode & (node_pair > 0))
    r = relay[n, m]
    phases.append(Phase(gr[n, r], gr[m, r], node_pair[n, m], [0], "hierarchical: inter-node",
                        conns=_conns(topology, gr[n, r], gr[m, r], NCCL_CONNECTIONS.p2p)))
    intra(p3, "hierarchical: intra-node scatter", [1])
    return phases


def _allreduce_phases(topology: Topology, ranks: np.ndarray, nbytes: int, algorithm: str, chunks: int) -> list[Phase]:
    if algorithm == "double_binary_tree":
        return _tree_phases(topology, ranks, nbytes, chunks)
    if algorithm not in ("ring", "hierarchical"):
        raise ValueError(f"algorithm: expected 'ring', 'double_binary_tree' or 'hierarchical', got {algorithm!r}")
    _streamed(chunks, algorithm)
    if algorithm == "ring":
        return _ring_phase(topology, ranks[None, :], np.array([nbytes]), "ar", [])
    groups = _node_groups(topology, ranks, "hierarchical allreduce")
    M, k = groups.shape
    gr = ranks[groups]  # (M, k): node n's ranks in order
    whole = np.full(M, nbytes, dtype=np.int64)
    phases = _ring_phase(topology, gr, whole, "rs", [])
    if M > 1:
        # after the reduce-scatter, local rank i owns segment (i + 1) mod k of its node's buffer;
        # the k rings of equal local ranks all-reduce their slices side by side
        seg = split_bytes(nbytes, k)
        phases += _ring_phase(topology, gr.T, seg[(np.arange(k) + 1) % k], "ar", _terminal(phases, 0))
    phases += _ring_phase(topology, gr, whole, "ag", _terminal(phases, 0))
    return phases


def _streamed(chunks: int, algorithm: str) -> None:
    if chunks != 1:
        raise ValueError(f"chunks: the {algorithm!r} algorithm streams its rings (the limit of ever smaller "
                         f"chunks, module doc); chunks applies to 'double_binary_tree' only, got {chunks}")


def build_phases(topology: Topology, kind: str, ranks=None, *, sizes=None, nbytes=None,
                 algorithm: str = "ring", chunks: int = 1) -> tuple[np.ndarray, list[Phase]]:
    """The phases of a collective (used by the runners here and by the estimates); ``chunks``
    pipelines the double binary tree (the rings are streamed)."""
    r = _ranks(topology, ranks)
    chunks = _chunks(chunks)
    if kind == "alltoallv":
        sz = np.asarray(sizes)
        if sz.shape != (r.size, r.size):
            raise ValueError(f"sizes: expected a ({r.size}, {r.size}) matrix of bytes, got shape {sz.shape}")
        if not np.issubdtype(sz.dtype, np.integer) and not _whole(sz):
            raise ValueError("sizes: expected whole numbers of bytes")
        if sz.size and sz.min() < 0:
            raise ValueError("sizes: expected sizes >= 0")
        return r, _alltoallv_phases(topology, r, sz.astype(np.int64, copy=False), algorithm)  # (never written)
    n = _nbytes(nbytes)
    if kind == "allreduce":
        return r, _allreduce_phases(topology, r, n, algorithm, chunks)
    if kind in ("reduce_scatter", "all_gather"):
        if algorithm != "ring":
            raise ValueError(f"algorithm: expected 'ring', got {algorithm!r}")
        _streamed(chunks, algorithm)
        return r, _ring_phase(topology, r[None, :], np.array([n]), "rs" if kind == "reduce_scatter" else "ag", [])
    raise ValueError(f"kind: unknown collective {kind!r}")


def _run(net: Network, kind: str, ranks, on_done, algorithm: str, **kw) -> CollectiveHandle:
    if not isinstance(net, Network):
        raise ValueError(f"net: expected a Network, got {type(net).__name__}")
    r, phases = build_phases(net.topology, kind, ranks, algorithm=algorithm, **kw)
    h = CollectiveHandle(net, kind, algorithm, r, phases, on_done)
    h._start()
    return h


# --------------------------------------------------------------------------------- API
def alltoallv(net: Network, ranks, sizes, *, algorithm: str = "direct",
              on_done: Callable[[CollectiveHandle], Any] | None = None) -> CollectiveHandle:
    """AlltoAllv: ``sizes[i, j]`` bytes from ``ranks[i]`` to ``ranks[j]``; starts now."""
    return _run(net, "alltoallv", ranks, on_done, algorithm, sizes=sizes)


def alltoall(net: Network, ranks, nbytes_per_pair: int, *, algorithm: str = "direct",
             on_done: Callable[[CollectiveHandle], Any] | None = None) -> CollectiveHandle:
    """AlltoAll with the same block size between every pair."""
    r = _ranks(net.topology, ranks)
    sizes = np.full((r.size, r.size), _nbytes(nbytes_per_pair), dtype=np.int64)
    return alltoallv(net, r, sizes, algorithm=algorithm, on_done=on_done)


def allreduce(net: Network, ranks, nbytes: int, *, algorithm: str = "ring", chunks: int = 1,
              on_done: Callable[[CollectiveHandle], Any] | None = None) -> CollectiveHandle:
    """AllReduce of an ``nbytes`` buffer on every rank (``chunks``: the double binary tree's
    pipeline; the ring algorithms are streamed)."""
    return _run(net, "allreduce", ranks, on_done, algorithm, nbytes=nbytes, chunks=chunks)


def reduce_scatter(net: Network, ranks, nbytes: int, *, algorithm: str = "ring",
                   on_done: Callable[[CollectiveHandle], Any] | None = None) -> CollectiveHandle:
    """ReduceScatter of an ``nbytes`` buffer (each rank ends with its n/p slice): a streamed ring."""
    return _run(net, "reduce_scatter", ranks, on_done, algorithm, nbytes=nbytes)


def all_gather(net: Network, ranks, nbytes: int, *, algorithm: str = "ring",
               on_done: Callable[[CollectiveHandle], Any] | None = None) -> CollectiveHandle:
    """AllGather into an ``nbytes`` buffer (each rank contributes its n/p slice): a streamed ring."""
    return _run(net, "all_gather", ranks, on_done, algorithm, nbytes=nbytes)


def nic_flows_per_gpu(topology: Topology, kind: str, algorithm: str, ranks=None) -> int:
    """How many flows -- connections, the NIC's queue pairs (:class:`NicConnections`) -- a
    collective keeps open at once from one GPU to other nodes (through its NIC), at most over
    its phases and GPUs: a direct AlltoAll(v) ``NCCL_CONNECTIONS.p2p`` per off-node peer, a
    ring hop that crosses nodes ``NCCL_CONNECTIONS.ring``, a hierarchical AllReduce's
    inter-node rings one hop each. The network runs a message as that many flows
    (:func:`split_connections`), so under max-min fair sharing two collectives on the same NIC
    get its bandwidth in proportion to these counts (the planner's fast evaluation weighs
    concurrent collectives with them). Every pair of ranks is taken to exchange bytes in an
    AlltoAll(v)."""
    r = _ranks(topology, ranks)
    if kind in ("alltoallv", "alltoall"):
        return _alltoall_nic_flows(topology, r, algorithm)
    _, phases = build_phases(topology, kind, r, nbytes=1 << 20, algorithm=algorithm)
    return busiest_nic_flows(topology, phases)


def busiest_nic_flows(topology: Topology, phases) -> int:
    """The most off-node connections one GPU opens in any of ``phases`` (built phases: what
    :func:`nic_flows_per_gpu` counts for a collective other than an AlltoAll(v))."""
    most = 0
    for ph in phases:
        off = topology.node_of(ph.src) != topology.node_of(ph.dst)
        if off.any():
            conns = np.ones(ph.src.size, dtype=np.int64) if ph.conns is None else np.asarray(ph.conns)
            most = max(most, int(np.bincount(ph.src[off], weights=conns[off]).max()))
    return most


def _alltoall_nic_flows(topology: Topology, r: np.ndarray, algorithm: str) -> int:
    """:func:`nic_flows_per_gpu` of an AlltoAll(v) among ranks ``r`` (every pair exchanging
    bytes), counted from the phases' form rather than built (at 4096 GPUs the build is 16.8M
    messages): the count its phases give (tested against them).

    ``direct``: a rank sends one message to each rank on another node, each on
    ``NCCL_CONNECTIONS.p2p`` connections. ``hierarchical``: only the inter-node phase crosses
    nodes, one message per ordered pair of nodes (n, m), sent by local rank ``(n + m) mod k`` of
    node n; of the M - 1 other nodes m, local rank a of node n sends to those with
    ``(n + m) mod k == a``: the residues of M consecutive integers from n, each ``M // k``
    times and the first ``M mod k`` once more, less node n itself (residue ``2n mod k``)."""
    p2p = NCCL_CONNECTIONS.p2p
    if algorithm == "direct":
        _, inv, count = np.unique(topology.node_of(r), return_inverse=True, return_counts=True)
        return int((r.size - count[inv.ravel()]).max()) * p2p
    if algorithm != "hierarchical":
        raise ValueError(f"algorithm: expected 'direct' or 'hierarchical', got {algorithm!r}")
    M, k = _node_groups(topology, r, "hierarchical alltoallv").shape
    if M < 2:
        return 0
    n = np.arange(M)[:, None]
    a = np.arange(k)[None, :]
    sends = M // k + ((a - n) % k < M % k) - (a == (2 * n) % k)  # (M, k): messages per (node, local rank)
    return int(sends.max()) * p2p
