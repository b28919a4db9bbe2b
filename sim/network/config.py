"""Network configuration: TOML schema, field-by-field validation, presets.

Schema (every section required unless marked optional; unknown keys are errors)::

    name = "zionex"                       # optional, free text
    [cluster]
    nodes = 16                            # int >= 1   (or give `gpus`, the total, instead)
    gpus_per_node = 8                     # int >= 1
    [intra_node]
    fabric = "switch"                     # "switch" (NVSwitch-like) | "p2p" (full mesh of links)
    bandwidth_gbps = 2400                 # per GPU, each direction (p2p: split evenly over peers)
    link_latency_ns = 250                 # per GPU-switch link (p2p: per GPU-GPU link)
    switch_latency_ns = 100               # "switch" only
    [host_link]                           # GPU <-> host memory (PCIe), one per GPU, each direction
    bandwidth_gbps = 256
    latency_ns = 500
    [nic]
    attach = "gpu"                        # "gpu": one NIC per GPU (GPUDirect) | "host": on CPUs
    per_node = 8                          # "gpu": must equal gpus_per_node; "host": divides it
    bandwidth_gbps = 200                  # line rate, each direction
    latency_ns = 1000                     # NIC processing + cable, each end
    [inter_node]
    topology = "switch"                   # "switch" (one non-blocking switch) | "leaf_spine"
    switch_latency_ns = 500               # per switch crossed
    nodes_per_leaf = 4                    # leaf_spine: divides nodes
    oversubscription = 1.0                # leaf_spine: leaf down-link : up-link bandwidth, >= 1
    [transport]
    protocol = "rdma"                     # "rdma" (RoCEv2) | "tcp"
    mtu_bytes = 4096                      # rdma: 256..4096 power of two; tcp: 576..9216
    message_overhead_ns = 0               # tcp: host (kernel/socket) cost per message
    host_copy_gbps = 400                  # tcp: host memory copy bandwidth per node

Errors are :class:`ValueError` naming the dotted field, e.g.
``nic.bandwidth_gbps: expected a number > 0, got -5``.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from neonic.sim import schema

from .transport import ROCE_MTUS

__all__ = [
    "ClusterConfig",
    "IntraNodeConfig",
    "HostLinkConfig",
    "NicConfig",
    "InterNodeConfig",
    "TransportConfig",
    "NetworkConfig",
    "load_config",
    "load_preset",
    "preset_names",
]


@dataclass(frozen=True)
class ClusterConfig:
    nodes: int
    gpus_per_node: int


@dataclass(frozen=True)
class IntraNodeConfig:
    fabric: str
    bandwidth_gbps: float
    link_latency_ns: float
    switch_latency_ns: float = 0.0


@dataclass(frozen=True)
class HostLinkConfig:
    bandwidth_gbps: float
    latency_ns: float


@dataclass(frozen=True)
class NicConfig:
    attach: str
    per_node: int
    bandwidth_gbps: float
    latency_ns: float


@dataclass(frozen=True)
class InterNodeConfig:
    topology: str
    switch_latency_ns: float
    nodes_per_leaf: int = 0
    oversubscription: float = 1.0


@dataclass(frozen=True)
class TransportConfig:
    protocol: str
    mtu_bytes: int
    message_overhead_ns: float = 0.0
    host_copy_gbps: float = math.inf


@dataclass(frozen=True)
class NetworkConfig:
    """A validated network description (see the module docstring for the TOML schema)."""

    cluster: ClusterConfig
    intra_node: IntraNodeConfig
    host_link: HostLinkConfig
    nic: NicConfig
    inter_node: InterNodeConfig
    transport: TransportConfig
    name: str = "custom"

    @property
    def num_gpus(self) -> int:
        return self.cluster.nodes * self.cluster.gpus_per_node

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (TOML-serialisable: infinite values are dropped)."""
        out: dict[str, Any] = {"name": self.name}
        for key, value in asdict(self).items():
            if isinstance(value, dict):
                out[key] = {k: v for k, v in value.items() if not (isinstance(v, float) and math.isinf(v))}
        if self.inter_node.topology != "leaf_spine":
            for k in ("nodes_per_leaf", "oversubscription"):
                out["inter_node"].pop(k)
        if self.transport.protocol != "tcp":
            for k in ("message_overhead_ns", "host_copy_gbps"):
                out["transport"].pop(k, None)
        if self.intra_node.fabric == "p2p":
            out["intra_node"].pop("switch_latency_ns")
        return out

    def with_nodes(self, nodes: int) -> "NetworkConfig":
        """The same configuration with another node count (re-validated)."""
        d = self.to_dict()
        d["cluster"]["nodes"] = nodes
        d["name"] = f"{self.name}x{nodes}"
        return NetworkConfig.from_dict(d)

    def with_gpus_per_node(self, gpus_per_node: int) -> "NetworkConfig":
        """The same configuration with another GPU count per node (re-validated): a NIC per
        GPU stays one per GPU; host-attached NICs keep their count, which must divide it."""
        if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or gpus_per_node < 1:
            raise ValueError(f"cluster.gpus_per_node: expected an integer >= 1, got {gpus_per_node!r}")
        if gpus_per_node == self.cluster.gpus_per_node:
            return self
        d = self.to_dict()
        d["cluster"]["gpus_per_node"] = gpus_per_node
        if self.nic.attach == "gpu":
            d["nic"]["per_node"] = gpus_per_node
        d["name"] = f"{self.name}-{gpus_per_node}gpn"
        return NetworkConfig.from_dict(d)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "NetworkConfig":
        return _parse(data)


# ------------------------------------------------------------------------------- validation
class _Section:
    """Reads one TOML table, tracking which keys were consumed."""

    def __init__(self, data: Mapping[str, Any], path: str) -> None:
        if not isinstance(data, Mapping):
            raise ValueError(f"{path}: expected a table, got {type(data).__name__}")
        self.data = data
        self.path = path
        self.used: set[str] = set()

    def _field(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str, default: Any = ...) -> Any:
        self.used.add(key)
        if key not in self.data:
            if default is ...:
                raise ValueError(f"{self._field(key)}: required field is missing")
            return default
        return self.data[key]

    def int_(self, key: str, *, minimum: int, default: Any = ...) -> int:
        return schema.integer(self._field(key), self.raw(key, default), minimum)

    def num(self, key: str, *, minimum: float = 0.0, strict: bool = False, default: Any = ...) -> float:
        v = self.raw(key, default)
        if key == "host_copy_gbps" and isinstance(v, float) and v == math.inf:
            return v  # "no host copy limit"
        return schema.number(self._field(key), v, float(minimum), lo_open=strict)

    def choice(self, key: str, options: tuple[str, ...], default: Any = ...) -> str:
        return schema.choice(self._field(key), self.raw(key, default), options)

    def done(self) -> None:
        extra = sorted(set(self.data) - self.used)
        if extra:
            raise ValueError(f"{self._field(extra[0])}: unknown field")


def _parse(data: Mapping[str, Any]) -> NetworkConfig:
    top = _Section(data, "")
    name = top.raw("name", "custom")
    if not isinstance(name, str):
        raise ValueError(f"name: expected a string, got {name!r}")

    c = _Section(top.raw("cluster"), "cluster")
    gpn = c.int_("gpus_per_node", minimum=1)
    if c.has("gpus") and c.has("nodes"):
        raise ValueError("cluster.gpus: give either cluster.nodes or cluster.gpus, not both")
    if c.has("gpus"):
        total = c.int_("gpus", minimum=1)
        if total % gpn:
            raise ValueError(
                f"cluster.gpus: expected a multiple of cluster.gpus_per_node ({gpn}), got {total}"
            )
        nodes = total // gpn
    else:
        nodes = c.int_("nodes", minimum=1)
    c.done()
    cluster = ClusterConfig(nodes=nodes, gpus_per_node=gpn)

    s = _Section(top.raw("intra_node"), "intra_node")
    fabric = s.choice("fabric", ("switch", "p2p"))
    intra = IntraNodeConfig(
        fabric=fabric,
        bandwidth_gbps=s.num("bandwidth_gbps", strict=True),
        link_latency_ns=s.num("link_latency_ns"),
        switch_latency_ns=s.num("switch_latency_ns", default=0.0),
    )
    if fabric == "p2p" and intra.switch_latency_ns:
        raise ValueError("intra_node.switch_latency_ns: a p2p fabric has no switch; expected 0 or absent")
    s.done()

    h = _Section(top.raw("host_link"), "host_link")
    host = HostLinkConfig(bandwidth_gbps=h.num("bandwidth_gbps", strict=True), latency_ns=h.num("latency_ns"))
    h.done()

    n = _Section(top.raw("nic"), "nic")
    attach = n.choice("attach", ("gpu", "host"))
    per_node = n.int_("per_node", minimum=1)
    if attach == "gpu" and per_node != gpn:
        raise ValueError(
            f"nic.per_node: with nic.attach = 'gpu' expected one NIC per GPU ({gpn}), got {per_node}"
        )
    if attach == "host" and gpn % per_node:
        raise ValueError(
            f"nic.per_node: expected a divisor of cluster.gpus_per_node ({gpn}), got {per_node}"
        )
    nic = NicConfig(
        attach=attach,
        per_node=per_node,
        bandwidth_gbps=n.num("bandwidth_gbps", strict=True),
        latency_ns=n.num("latency_ns"),
    )
    n.done()

    i = _Section(top.raw("inter_node"), "inter_node")
    topo = i.choice("topology", ("switch", "leaf_spine"))
    sw_lat = i.num("switch_latency_ns")
    if topo == "leaf_spine":
        npl = i.int_("nodes_per_leaf", minimum=1)
        if nodes % npl:
            raise ValueError(f"inter_node.nodes_per_leaf: expected a divisor of cluster.nodes ({nodes}), got {npl}")
        over = i.num("oversubscription", minimum=1.0, default=1.0)
    else:
        for key in ("nodes_per_leaf", "oversubscription"):
            if i.has(key):
                raise ValueError(f"inter_node.{key}: only valid with inter_node.topology = 'leaf_spine'")
        npl, over = 0, 1.0
    inter = InterNodeConfig(topology=topo, switch_latency_ns=sw_lat, nodes_per_leaf=npl, oversubscription=over)
    i.done()

    t = _Section(top.raw("transport"), "transport")
    protocol = t.choice("protocol", ("rdma", "tcp"))
    mtu = t.int_("mtu_bytes", minimum=1)
    if protocol == "rdma" and mtu not in ROCE_MTUS:
        raise ValueError(f"transport.mtu_bytes: RoCE path MTU must be one of {ROCE_MTUS}, got {mtu}")
    if protocol == "tcp" and not 576 <= mtu <= 9216:
        raise ValueError(f"transport.mtu_bytes: TCP MTU expected in 576..9216, got {mtu}")
    if protocol == "tcp":
        overhead = t.num("message_overhead_ns", default=0.0)
        copy = t.num("host_copy_gbps", strict=True, default=math.inf)
    else:
        for key in ("message_overhead_ns", "host_copy_gbps"):
            if t.has(key):
                raise ValueError(f"transport.{key}: only valid with transport.protocol = 'tcp'")
        overhead, copy = 0.0, math.inf
    transport = TransportConfig(protocol=protocol, mtu_bytes=mtu, message_overhead_ns=overhead, host_copy_gbps=copy)
    t.done()
    top.done()
    return NetworkConfig(
        cluster=cluster, intra_node=intra, host_link=host, nic=nic, inter_node=inter, transport=transport, name=name
    )


# ---------------------------------------------------------------------------------- loading
def load_config(source: str | Path | Mapping[str, Any]) -> NetworkConfig:
    """A validated config from a dict, a TOML file path, or a preset name."""
    if isinstance(source, Mapping):
        return _parse(source)
    if isinstance(source, str) and source in preset_names():
        return load_preset(source)
    path = Path(source)
    if not path.is_file():
        raise ValueError(
            f"config: {str(source)!r} is neither a TOML file nor a preset ({', '.join(preset_names())})"
        )
    with path.open("rb") as fh:
        try:
            data = tomllib.load(fh)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"config: {path}: invalid TOML: {exc}") from exc
    return _parse(data)


def preset_names() -> list[str]:
    """Names of the presets shipped in ``sim/network/presets/*.toml``."""
    root = resources.files(__package__).joinpath("presets")
    return sorted(p.name[: -len(".toml")] for p in root.iterdir() if p.name.endswith(".toml"))


def load_preset(name: str) -> NetworkConfig:
    names = preset_names()
    if name not in names:
        raise ValueError(f"preset: unknown preset {name!r}; expected one of {', '.join(names)}")
    text = resources.files(__package__).joinpath("presets", f"{name}.toml").read_text(encoding="utf-8")
    return _parse(tomllib.loads(text))
