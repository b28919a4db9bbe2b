"""Cluster topology: directed links with capacity and latency, and vectorised routing.

Links are directional (a full-duplex cable is two links). Link classes:

``nvlink``    intra-node: GPU -> NVSwitch and NVSwitch -> GPU (``fabric = "switch"``), or one link
              per ordered GPU pair (``fabric = "p2p"``, capacity = per-GPU bandwidth / (G - 1)).
``pcie``      GPU -> host memory and host memory -> GPU, one pair per GPU.
``host_mem``  TCP's extra copy through host memory: one link per node, shared by sends and
              receives of that node (capacity ``transport.host_copy_gbps``).
``nic``       NIC -> first switch and switch -> NIC, one pair per NIC.
``spine``     leaf/spine only: per leaf, the bundle of up-links (leaf -> spine layer) and of
              down-links (spine layer -> leaf); each bundle's capacity is the leaf's NIC capacity
              divided by the oversubscription ratio. ECMP is modelled as a perfect even split of
              every flow over the spines, so a bundle behaves as one link (no hash collisions).

Routes (GPU ``s`` to GPU ``d``): same node: ``nvlink`` (s -> switch -> d, or s -> d). Other node:
with NICs on GPUs and RDMA (GPUDirect through a PCIe switch, which is assumed never to be the
bottleneck and is not a separate link): nic_tx(s), [up(leaf s), down(leaf d)], nic_rx(d). With
NICs on hosts, or with TCP: pcie_up(s), [host_mem(node s) if TCP], nic_tx, [spine], nic_rx,
[host_mem(node d) if TCP], pcie_down(d). A GPU uses NIC ``local // (G / per_node)`` of its node.
Host endpoints (``topo.host_endpoint(node)``) reach the GPUs of their own node over ``pcie``.

Latency of a route = sum of its links' latencies + switch latencies (NVSwitch once; one switch,
or leaf / leaf-spine-leaf) + TCP's per-message overhead; it is added once per message.
"""

from __future__ import annotations

import bisect

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from neonic.sim.compiled import HAVE_NUMBA, jit

from .config import NetworkConfig, load_config, load_preset
from .transport import framing_factor

__all__ = ["Topology", "LINK_CLASSES", "gbps_to_bytes_per_ps", "Route"]

LINK_CLASSES = ("nvlink", "pcie", "host_mem", "nic", "spine")
WIRE_CLASSES = ("nic", "spine")


def gbps_to_bytes_per_ps(gbps: float) -> float:
    """10^9 bit/s -> bytes per picosecond."""
    return gbps / 8000.0


@dataclass(frozen=True)
class Route:
    """Routes of a batch of messages: ``links`` (H, F) padded with ``topology.pad_link``.

    ``acct`` (A, F): links the messages also cross whose capacity can never bind (see
    ``Topology.spine_redundant``); they carry bytes but are left out of the max-min solve.
    """

    links: np.ndarray
    latency_ps: np.ndarray
    factor: np.ndarray
    acct: np.ndarray


class Topology:
    """Links and routes of a cluster described by a :class:`NetworkConfig`."""

    def __init__(self, config: NetworkConfig) -> None:
        self.config = config
        c = config
        self.nodes = c.cluster.nodes
        self.gpus_per_node = c.cluster.gpus_per_node
        self.num_gpus = self.nodes * self.gpus_per_node
        self.protocol = c.transport.protocol
        self.mtu = c.transport.mtu_bytes
        self.tcp = self.protocol == "tcp"
        G, N, R = self.gpus_per_node, self.nodes, self.num_gpus

        names: list[str] = []
        cap: list[np.ndarray] = []
        lat: list[np.ndarray] = []
        cls: list[np.ndarray] = []
        self._base: dict[str, int] = {}
        self._block_starts: list[int] = []  # the first link of each block, in order

        def block(key: str, count: int, klass: str, gbps: float, latency_ns: float, label) -> None:
            self._base[key] = sum(len(x) for x in cap)
            self._block_starts.append(self._base[key])
            cap.append(np.full(count, gbps_to_bytes_per_ps(gbps)))
            lat.append(np.full(count, int(round(latency_ns * 1000)), dtype=np.int64))
            cls.append(np.full(count, LINK_CLASSES.index(klass), dtype=np.int8))
            names.extend(label(i) for i in range(count))

        intra = c.intra_node
        if intra.fabric == "switch":
            block("gpu_tx", R, "nvlink", intra.bandwidth_gbps, intra.link_latency_ns, lambda i: f"nvlink.tx[{i}]")
            block("gpu_rx", R, "nvlink", intra.bandwidth_gbps, intra.link_latency_ns, lambda i: f"nvlink.rx[{i}]")
        elif G > 1:
            per = intra.bandwidth_gbps / (G - 1)
            block(
                "p2p", R * G, "nvlink", per, intra.link_latency_ns,
                lambda i: f"nvlink.p2p[{i // G}->{(i // G) // G * G + i % G}]",
            )
        hl = c.host_link
        block("pcie_up", R, "pcie", hl.bandwidth_gbps, hl.latency_ns, lambda i: f"pcie.up[{i}]")
        block("pcie_down", R, "pcie", hl.bandwidth_gbps, hl.latency_ns, lambda i: f"pcie.down[{i}]")
        if self.tcp:
            copy = c.transport.host_copy_gbps
            block("host_mem", N, "host_mem", copy, 0.0, lambda i: f"host_mem[{i}]")
        nic = c.nic
        n_nics = N * nic.per_node
        block("nic_tx", n_nics, "nic", nic.bandwidth_gbps, nic.latency_ns, lambda i: f"nic.tx[{i}]")
        block("nic_rx", n_nics, "nic", nic.bandwidth_gbps, nic.latency_ns, lambda i: f"nic.rx[{i}]")
        inter = c.inter_node
        self.leaf_spine = inter.topology == "leaf_spine"
        if self.leaf_spine:
            leaves = N // inter.nodes_per_leaf
            bundle = inter.nodes_per_leaf * nic.per_node * nic.bandwidth_gbps / inter.oversubscription
            block("leaf_up", leaves, "spine", bundle, 0.0, lambda i: f"spine.up[{i}]")
            block("leaf_down", leaves, "spine", bundle, 0.0, lambda i: f"spine.down[{i}]")
        self.num_links = sum(len(x) for x in cap)
        self.pad_link = self.num_links
        # arrays include the pad link (infinite capacity, never counted)
        self.capacity = np.concatenate(cap + [np.array([np.inf])])  # bytes / ps
        self.link_latency_ps = np.concatenate(lat + [np.zeros(1, dtype=np.int64)])
        self.link_class = np.concatenate(cls + [np.array([-1], dtype=np.int8)])
        self.wire = np.isin(self.link_class, [LINK_CLASSES.index(k) for k in WIRE_CLASSES])
        self.link_names = names
        self.nic_per_node = nic.per_node
        self.gpus_per_nic = G // nic.per_node
        self.nic_attach = nic.attach
        self.intra_switch_ps = int(round(intra.switch_latency_ns * 1000)) if intra.fabric == "switch" else 0
        self.inter_switch_ps = int(round(inter.switch_latency_ns * 1000))
        self.message_overhead_ps = int(round(c.transport.message_overhead_ns * 1000)) if self.tcp else 0
        self.nodes_per_leaf = inter.nodes_per_leaf if self.leaf_spine else N
        self.via_host = nic.attach == "host" or self.tcp
        # A non-blocking leaf bundle (oversubscription 1) has exactly the capacity of the NIC links
        # of its leaf, and every flow on it also crosses one of those NIC links with the same
        # framing weight, so its constraint is implied by theirs: leaving it out of the max-min
        # solve changes no rate (it is still counted in per-link bytes).
        self.spine_redundant = self.leaf_spine and inter.oversubscription <= 1.0
        self.max_hops = self._max_hops()

    # ------------------------------------------------------------------------- construction
    @classmethod
    def from_preset(cls, name: str, *, nodes: int | None = None) -> "Topology":
        cfg = load_preset(name)
        return cls(cfg if nodes is None else cfg.with_nodes(nodes))

    @classmethod
    def from_config(cls, source: str | Path | Mapping[str, Any] | NetworkConfig) -> "Topology":
        return cls(source if isinstance(source, NetworkConfig) else load_config(source))

    def __fingerprint__(self) -> tuple:
        """What identifies this topology by value (``host.planner.cache``): its config and its
        links' capacities and latencies (which a study may change after construction)."""
        return (self.config, self.capacity, self.link_latency_ps)

    def __repr__(self) -> str:
        return f"Topology({self.config.name}: {self.nodes} nodes x {self.gpus_per_node} GPUs, {self.num_links} links)"

    def _max_hops(self) -> int:
        intra = 2 if self.config.intra_node.fabric == "switch" else 1
        inter = 2 + (2 if self.leaf_spine and not self.spine_redundant else 0)
        if self.via_host:
            inter += 2 + (2 if self.tcp else 0)
        return max(intra, inter, 1)

    # ---------------------------------------------------------------------------- endpoints
    @property
    def num_endpoints(self) -> int:
        return self.num_gpus + self.nodes

    def host_endpoint(self, node: int) -> int:
        """Endpoint id of node ``node``'s host memory."""
        if not 0 <= node < self.nodes:
            raise ValueError(f"node: expected 0..{self.nodes - 1}, got {node}")
        return self.num_gpus + node

    def node_of(self, endpoint: np.ndarray | int) -> np.ndarray:
        """The node of each endpoint id (a GPU's, or a host's: ids ``num_gpus + node``)."""
        e = np.asarray(endpoint)
        G = self.gpus_per_node
        if e.ndim and e.size > 4096 and e.dtype.kind in "iu" and (G & (G - 1)) == 0 and 0 <= e.min() \
                and e.max() < self.num_gpus:  # GPUs only (an AlltoAll's million ids): one shift
            return e >> (G.bit_length() - 1)
        return np.where(e < self.num_gpus, e // G, e - self.num_gpus)

    def link_class_names(self) -> list[str]:
        return [LINK_CLASSES[k] for k in self.link_class[: self.num_links]]

    def link_block(self, link: int) -> tuple[int, int]:
        """(first link id, number of links) of the block of links built together with ``link``
        (e.g. every NIC's transmit link, or every GPU's PCIe uplink): ids are consecutive."""
        if not 0 <= link < self.num_links:
            raise ValueError(f"link: expected an id in 0..{self.num_links - 1}, got {link}")
        i = bisect.bisect_right(self._block_starts, link) - 1
        end = self._block_starts[i + 1] if i + 1 < len(self._block_starts) else self.num_links
        return self._block_starts[i], end - self._block_starts[i]

    def class_totals(self, per_link: np.ndarray) -> dict[str, float]:
        """Sum a per-link array by link class (classes absent from the topology are left out)."""
        per_link = np.asarray(per_link)[: self.num_links]
        sums = np.bincount(self.link_class[: self.num_links], per_link, minlength=len(LINK_CLASSES))
        present = np.bincount(self.link_class[: self.num_links], minlength=len(LINK_CLASSES)) > 0
        return {k: float(sums[i]) for i, k in enumerate(LINK_CLASSES) if present[i]}

    # ------------------------------------------------------------------------------ routing
    def route(self, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray | None = None) -> Route:
        """Routes of messages ``src[i] -> dst[i]`` (endpoint ids), vectorised.

        ``nbytes`` (payload per message) sets each message's framing factor on wire links;
        without it the factor is that of an infinitely long message (MTU-sized packets).
        """
        src = np.asarray(src, dtype=np.int64).ravel()
        dst = np.asarray(dst, dtype=np.int64).ravel()
        if src.shape != dst.shape:
            raise ValueError(f"dst: expected the shape of src {src.shape}, got {dst.shape}")
        F = src.size
        R, G = self.num_gpus, self.gpus_per_node
        ne = self.num_endpoints
        if F and (src.min() < 0 or src.max() >= ne):
            raise ValueError(f"src: endpoint ids must be in 0..{ne - 1}")
        if F and (dst.min() < 0 or dst.max() >= ne):
            raise ValueError(f"dst: endpoint ids must be in 0..{ne - 1}")
        H = self.max_hops
        A = 2 if self.spine_redundant else 0
        latency = np.zeros(F, dtype=np.int64)
        if F >= self.compiled_route_min and src.max() < R and dst.max() < R:
            # stored flow-major ((F, H), the (H, F) arrays are their transposed views): the
            # network keeps each flow's hops together (FlowGroup._links), so a large batch (an
            # AlltoAllv's 16.8M messages at 4096 GPUs) is not transposed again there
            links = np.full((F, H), self.pad_link, dtype=np.int32).T
            acct = np.full((F, A), self.pad_link, dtype=np.int32).T
            self._route_gpus(src, dst, links, acct, latency)
            return Route(links=links, latency_ps=latency, factor=self._factors(F, nbytes), acct=acct)
        links = np.full((H, F), self.pad_link, dtype=np.int32)
        acct = np.full((A, F), self.pad_link, dtype=np.int32)
        sg, dg = src < R, dst < R
        sn, dn = self.node_of(src), self.node_of(dst)
        b = self._base
        ll = self.link_latency_ps

        def put(mask: np.ndarray, hop: int, link: np.ndarray) -> None:
            links[hop, mask] = link
            latency[mask] += ll[link]

        # host <-> GPU (same node only), host <-> host refused
        hs = ~sg
        hd = ~dg
        if hs.any() or hd.any():
            bad = (hs | hd) & ((sn != dn) | (hs & hd))
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise ValueError(
                    f"dst: host endpoints only exchange data with GPUs of their own node "
                    f"(message {i}: {int(src[i])} -> {int(dst[i])})"
                )
            m = hs & dg
            put(m, 0, b["pcie_down"] + dst[m])
            m = sg & hd
            put(m, 0, b["pcie_up"] + src[m])
        gg = sg & dg & (src != dst)
        intra = gg & (sn == dn)
        if intra.any():
            if self.config.intra_node.fabric == "switch":
                put(intra, 0, b["gpu_tx"] + src[intra])
                put(intra, 1, b["gpu_rx"] + dst[intra])
                latency[intra] += self.intra_switch_ps
            else:
                put(intra, 0, b["p2p"] + src[intra] * G + dst[intra] % G)
        inter = gg & (sn != dn)
        if inter.any():
            s, d = src[inter], dst[inter]
            snic = sn[inter] * self.nic_per_node + (s % G) // self.gpus_per_nic
            dnic = dn[inter] * self.nic_per_node + (d % G) // self.gpus_per_nic
            hop_links: list[np.ndarray] = []
            if self.via_host:
                hop_links.append(b["pcie_up"] + s)
                if self.tcp:
                    hop_links.append(b["host_mem"] + sn[inter])
            hop_links.append(b["nic_tx"] + snic)
            switches = np.ones(s.size, dtype=np.int64)
            cross = None
            if self.leaf_spine:
                sl = sn[inter] // self.nodes_per_leaf
                dl = dn[inter] // self.nodes_per_leaf
                cross = sl != dl
                spine = [np.where(cross, b["leaf_up"] + sl, self.pad_link),
                         np.where(cross, b["leaf_down"] + dl, self.pad_link)]
                if self.spine_redundant:
                    acct[:, inter] = spine
                else:
                    hop_links.extend(spine)
                switches = np.where(cross, 3, 1)
            hop_links.append(b["nic_rx"] + dnic)
            if self.via_host:
                if self.tcp:
                    hop_links.append(b["host_mem"] + dn[inter])
                hop_links.append(b["pcie_down"] + d)
            lat_sum = sum(ll[lk] for lk in hop_links)  # spine bundles have no latency of their own
            for h, lk in enumerate(hop_links):
                links[h, inter] = lk
            latency[inter] += lat_sum + switches * self.inter_switch_ps
        # TCP per-message host overhead applies to every message that goes through sockets
        if self.message_overhead_ps:
            latency[gg & (sn != dn)] += self.message_overhead_ps
        return Route(links=links, latency_ps=latency, factor=self._factors(F, nbytes), acct=acct)

    #: batches of at least this many messages between GPUs are routed by one compiled pass
    #: (:meth:`_route_gpus`: the same links and latencies; 16.8M messages of an AlltoAllv at
    #: 4096 GPUs took 7.4 s CPU in the array operations above); fewer: by those operations
    #: (without numba, always: the pass runs as Python)
    compiled_route_min = 1 << 16 if HAVE_NUMBA else 1 << 62

    def _loads(self, route: Route, nb: np.ndarray, wire: bool) -> np.ndarray:
        """:meth:`link_loads` (``wire``) or :meth:`payload_loads` of a large batch in one compiled
        pass: each hop's sums message by message in order (np.bincount's), added to the total
        hop by hop (the route's hops, then its accounted links), as those methods add them (the
        same bits). The routes' arrays are read in their own layout (flow-major from
        :meth:`route`'s compiled pass: no copy)."""
        return _loads_kernel(route.links, route.acct, np.ascontiguousarray(route.factor), np.ascontiguousarray(nb),
                             self.wire, wire, self.num_links + 1)

    def _factors(self, F: int, nbytes: np.ndarray | None) -> np.ndarray:
        if nbytes is None:
            return np.full(F, self._asymptotic_factor())
        nb = np.broadcast_to(np.asarray(nbytes, dtype=np.float64), (F,))
        return framing_factor(nb, self.protocol, self.mtu)

    def _route_gpus(self, src: np.ndarray, dst: np.ndarray, links: np.ndarray, acct: np.ndarray,
                    latency: np.ndarray) -> None:
        """:meth:`route`'s links, accounted links and latencies of messages between GPUs, message
        by message in one compiled pass (``links``, ``acct``: filled with the pad link; ``latency``
        zeros), by the same rules (integer sums: the same values)."""
        b = self._base
        _route_gpus_kernel(src, dst, self.link_latency_ps, self.num_gpus, self.gpus_per_node, self.pad_link,
                           self.config.intra_node.fabric == "switch", b.get("gpu_tx", -1), b.get("gpu_rx", -1),
                           b.get("p2p", -1), self.via_host, self.tcp, b["pcie_up"], b["pcie_down"], b.get("host_mem", -1),
                           b["nic_tx"], b["nic_rx"], self.leaf_spine, self.spine_redundant, b.get("leaf_up", -1),
                           b.get("leaf_down", -1), self.nic_per_node, self.gpus_per_nic, self.nodes_per_leaf,
                           self.intra_switch_ps, self.inter_switch_ps, self.message_overhead_ps, links, acct, latency)

    def resized(self, route: Route, nbytes: np.ndarray) -> Route:
        """``route`` (of the same messages, from :meth:`route`) for new payload sizes: only the
        framing factors depend on the sizes."""
        nb = np.broadcast_to(np.asarray(nbytes, dtype=np.float64), route.factor.shape)
        return Route(links=route.links, latency_ps=route.latency_ps, factor=framing_factor(nb, self.protocol, self.mtu),
                     acct=route.acct)

    def _asymptotic_factor(self) -> float:
        big = np.array([self.mtu * 10**6 if self.protocol == "rdma" else (self.mtu - 40) * 10**6], dtype=np.float64)
        return float(framing_factor(big, self.protocol, self.mtu)[0])

    def link_loads(self, route: Route, nbytes: np.ndarray) -> np.ndarray:
        """Bytes each link carries for the routed messages (wire bytes on wire links), length L+1."""
        nb = np.broadcast_to(np.asarray(nbytes, dtype=np.float64), route.factor.shape)
        if nb.size >= self.compiled_route_min:
            return self._loads(route, nb, True)
        out = np.zeros(self.num_links + 1)
        for lk in list(route.links) + list(route.acct):
            w = np.where(self.wire[lk], route.factor, 1.0) * nb
            out += np.bincount(lk, w, minlength=self.num_links + 1)
        return out

    def both_loads(self, route: Route, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(:meth:`payload_loads`, :meth:`link_loads`) of the same messages: for a large batch one
        compiled pass computes both (each sum's additions those of its own method, in its order:
        the same bits) and reads integer sizes as they are (each converted to float64 as it is
        read), so a 16.8M-message AlltoAllv at 4096 GPUs is not read twice nor its sizes copied."""
        nb = np.asarray(nbytes)
        if nb.size >= self.compiled_route_min and nb.shape == route.factor.shape and nb.dtype.kind in "iuf":
            return _both_loads_kernel(route.links, route.acct, np.ascontiguousarray(route.factor),
                                      np.ascontiguousarray(nb), self.wire, self.num_links + 1)
        return self.payload_loads(route, nbytes), self.link_loads(route, nbytes)

    def payload_loads(self, route: Route, nbytes: np.ndarray) -> np.ndarray:
        """Payload bytes each link carries for the routed messages, length L+1."""
        nb = np.broadcast_to(np.asarray(nbytes, dtype=np.float64), route.factor.shape)
        if nb.size >= self.compiled_route_min:
            return self._loads(route, nb, False)
        out = np.zeros(self.num_links + 1)
        for lk in list(route.links) + list(route.acct):
            out += np.bincount(lk, nb, minlength=self.num_links + 1)
        return out


@jit(cache=True, nogil=True)
def _route_gpus_kernel(src, dst, ll, R, G, pad, switch_fabric, b_gpu_tx, b_gpu_rx, b_p2p, via_host, tcp, b_pcie_up,
                       b_pcie_down, b_host_mem, b_nic_tx, b_nic_rx, leaf_spine, spine_redundant, b_leaf_up,
                       b_leaf_down, nic_per_node, gpus_per_nic, nodes_per_leaf, intra_switch_ps, inter_switch_ps,
                       overhead_ps, links, acct, latency):  # pragma: no cover - compiled
    """:meth:`Topology.route` for GPU endpoints (``0 .. R - 1``), message by message
    (``Topology._route_gpus``). Each GPU's node, leaf, local index and NIC links are taken from
    tables built first (one pass over the GPUs): the same integers as dividing per message,
    without its six integer divisions (about 3/4 of the pass at 4096 GPUs' 16.8M messages)."""
    node = np.empty(R, dtype=np.int64)
    local = np.empty(R, dtype=np.int64)
    leaf = np.empty(R, dtype=np.int64)
    ntx = np.empty(R, dtype=np.int64)
    nrx = np.empty(R, dtype=np.int64)
    for g in range(R):
        n = g // G
        node[g] = n
        local[g] = g % G
        leaf[g] = n // nodes_per_leaf if leaf_spine else 0
        ntx[g] = b_nic_tx + n * nic_per_node + (g % G) // gpus_per_nic
        nrx[g] = b_nic_rx + n * nic_per_node + (g % G) // gpus_per_nic
    for f in range(src.shape[0]):
        s = src[f]
        d = dst[f]
        if s == d:
            continue
        sn = node[s]
        dn = node[d]
        if sn == dn:
            if switch_fabric:
                l0 = b_gpu_tx + s
                l1 = b_gpu_rx + d
                links[0, f] = l0
                links[1, f] = l1
                latency[f] = ll[l0] + ll[l1] + intra_switch_ps
            else:
                l0 = b_p2p + s * G + local[d]
                links[0, f] = l0
                latency[f] = ll[l0]
            continue
        h = 0
        lat = 0
        if via_host:
            links[h, f] = b_pcie_up + s
            lat += ll[b_pcie_up + s]
            h += 1
            if tcp:
                links[h, f] = b_host_mem + sn
                lat += ll[b_host_mem + sn]
                h += 1
        k = ntx[s]
        links[h, f] = k
        lat += ll[k]
        h += 1
        switches = 1
        if leaf_spine:
            sl = leaf[s]
            dl = leaf[d]
            up = pad
            down = pad
            if sl != dl:
                up = b_leaf_up + sl
                down = b_leaf_down + dl
                switches = 3
            if spine_redundant:
                acct[0, f] = up
                acct[1, f] = down
            else:
                links[h, f] = up
                links[h + 1, f] = down
                lat += ll[up] + ll[down]
                h += 2
        k = nrx[d]
        links[h, f] = k
        lat += ll[k]
        h += 1
        if via_host:
            if tcp:
                links[h, f] = b_host_mem + dn
                lat += ll[b_host_mem + dn]
                h += 1
            links[h, f] = b_pcie_down + d
            lat += ll[b_pcie_down + d]
        latency[f] = lat + switches * inter_switch_ps + overhead_ps


@jit(cache=True, nogil=True)
def _loads_kernel(links, acct, factor, nb, wire_link, wire, n):  # pragma: no cover - compiled
    """Per-link sums of ``nb`` (times ``factor`` on wire links where ``wire``) over each row of
    ``links`` then of ``acct`` (a hop's links), each row's into a zeroed array of its own
    (message by message in order), those added to the total row by row. One pass over the
    messages, reading each one's hops together."""
    H = links.shape[0]
    A = acct.shape[0]
    hop = np.zeros((H + A, n))
    for f in range(links.shape[1]):
        x = nb[f]
        wf = factor[f] * x
        for h in range(H):
            k = links[h, f]
            hop[h, k] += wf if (wire and wire_link[k]) else 1.0 * x
        for a in range(A):
            k = acct[a, f]
            hop[H + a, k] += wf if (wire and wire_link[k]) else 1.0 * x
    out = np.zeros(n)
    for h in range(H + A):
        for k in range(n):
            out[k] += hop[h, k]
    return out


@jit(cache=True, nogil=True)
def _both_loads_kernel(links, acct, factor, nb, wire_link, n):  # pragma: no cover - compiled
    """:func:`_loads_kernel`'s payload sums and its wire sums in one pass over the messages
    (each with its own per-hop arrays and additions, in the same order: the same bits as two
    calls); ``nb`` of any numeric type, each size taken as float64 (as ``np.asarray(nb,
    dtype=np.float64)`` converts it)."""
    H = links.shape[0]
    A = acct.shape[0]
    pay = np.zeros((H + A, n))
    wir = np.zeros((H + A, n))
    for f in range(links.shape[1]):
        x = np.float64(nb[f])
        wf = factor[f] * x
        for h in range(H):
            k = links[h, f]
            pay[h, k] += 1.0 * x
            wir[h, k] += wf if wire_link[k] else 1.0 * x
        for a in range(A):
            k = acct[a, f]
            pay[H + a, k] += 1.0 * x
            wir[H + a, k] += wf if wire_link[k] else 1.0 * x
    out_p = np.zeros(n)
    out_w = np.zeros(n)
    for h in range(H + A):
        for k in range(n):
            out_p[k] += pay[h, k]
            out_w[k] += wir[h, k]
    return out_p, out_w
