"""The network between the co-simulated NICs: the frames' arrival order at each destination,
their AlltoAllv finish time on the flow-level network model (``sim.network``), and packet
captures of what each NIC sent and received."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["route_frames", "network_time_s", "cluster_topology", "write_pcaps"]


def route_frames(frames: list[list[bytes]], world: int) -> list[list[bytes]]:
    """Each destination's frames in arrival order: round-robin across sources, one frame at a
    time, each source's frames in their own order (the PSN order of its QP)."""
    per: list[list[list[bytes]]] = [[[] for _ in range(world)] for _ in range(world)]
    for src, fs in enumerate(frames):
        for f in fs:
            dest = int.from_bytes(f[30:34], "big") & 0xFFFF  # IPv4 destination: 10.0.x.x
            per[dest][src].append(f)
    out = []
    for dest in range(world):
        queues = [list(q) for q in per[dest]]
        order = []
        while any(queues):
            for q in queues:
                if q:
                    order.append(q.pop(0))
        out.append(order)
    return out


def write_pcaps(folder: Path | str, sent: list[list[bytes]], received: list[list[bytes]]) -> list[Path]:
    """One capture per NIC, ``nic<r>.pcap``: the frames NIC r sent (in order), then the frames
    it received (in arrival order), as Ethernet frames (Wireshark decodes RoCEv2 on UDP 4791).
    Timestamps are the frames' order (1 us apart): the co-simulation does not time single
    frames on the wire."""
    from scapy.layers.l2 import Ether
    from scapy.utils import wrpcap
    import scapy.contrib.roce  # noqa: F401  (binds UDP 4791 to BTH for readers)

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in range(max(len(sent), len(received))):
        packets = []
        for i, frame in enumerate([*(sent[r] if r < len(sent) else []),
                                   *(received[r] if r < len(received) else [])]):
            pkt = Ether(frame)
            pkt.time = i * 1e-6
            packets.append(pkt)
        path = folder / f"nic{r}.pcap"
        wrpcap(str(path), packets)
        paths.append(path)
    return paths


def network_time_s(frames: list[list[bytes]], world: int, topology: Any) -> float | None:
    """Finish time (s) of the frames' payload as an AlltoAllv on the flow-level network model
    (``topology``: a ``sim.network`` topology of at least ``world`` GPUs; None: not timed)."""
    if topology is None:
        return None
    from neonic.sim.engine import Engine, s_from_ps
    from neonic.sim.network import collectives as coll
    from neonic.sim.network.network import Network

    sizes = np.zeros((world, world), dtype=np.int64)
    for src, fs in enumerate(frames):
        for f in fs:
            dest = int.from_bytes(f[30:34], "big") & 0xFFFF
            if dest != src:
                sizes[src, dest] += len(f)
    engine = Engine()
    net = Network(engine, topology)
    done: list[int] = []
    coll.alltoallv(net, list(range(world)), sizes, on_done=lambda h: done.append(h.end_ps))
    engine.run()
    return s_from_ps(done[0]) if done else 0.0


def cluster_topology(world: int, gpus_per_node: int, preset: str = "zionex") -> Any:
    """A ``sim.network`` topology of ``world / gpus_per_node`` nodes of ``gpus_per_node`` GPUs
    (the preset's links, one NIC per GPU)."""
    from neonic.sim.network.config import NetworkConfig, load_preset
    from neonic.sim.network.topology import Topology

    d = load_preset(preset).to_dict()
    d["cluster"]["nodes"] = world // gpus_per_node
    d["cluster"]["gpus_per_node"] = gpus_per_node
    if "nic" in d and "per_node" in d["nic"]:
        d["nic"]["per_node"] = gpus_per_node
    d["name"] = f"{preset}-{world // gpus_per_node}x{gpus_per_node}"
    return Topology(NetworkConfig.from_dict(d))
