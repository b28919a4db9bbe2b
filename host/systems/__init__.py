"""System presets: the machine a cluster run simulates (ZionEX, Zion, SmartNIC).

A system says where embeddings live (GPU HBM, CPU sockets or GPU + SmartNIC), which network
topology joins the GPUs (a ``sim.network`` preset), which GPU model (a ``sim.gpu`` preset, with
optional efficiency overrides), how the communication streams share the GPU (the C3 levers:
stream priority, SM partitioning, collectives on the copy engines) and, for the SmartNIC
system, the NIC's caches and datapath.

API
    ``PRESET_NAMES``; ``preset(name) -> SystemSpec``; ``preset_text(name)`` (the TOML, with its
    documented assumptions); ``system_from_dict(data, path="system")``;
    ``resolve_system(value, path="system")``: a preset name, or a table with ``preset = NAME``
    whose other fields override the preset's (sub-tables merge field by field).

Schema (TOML; every field checked, errors name the dotted field)::

    name = "zionex"; description = "..."
    embeddings = "gpu"            # gpu | cpu | nic
    network = "zionex"            # sim.network topology preset
    gpu = "a100-40gb"             # sim.gpu preset
    comm_dtype = "fp32"           # fp32 | fp16 (quantized communication)
    [gpu_efficiency]              # optional overrides of sim.gpu.GPUEfficiency fields
    [streams]                     # comm_priority = "high"|"normal", collectives_on_dma = bool,
                                  # comm_sm_fraction, comm_hbm_fraction, sm_partition_comm,
                                  # interference (fractions)
    [host]                        # pcie_gbytes_per_s, cpu (sim.resources preset), sockets_per_node,
                                  # dram_gib_per_node, ssd_gib_per_node, ssd_gbytes_per_s (host tiers),
                                  # cache_load_factor, cache_ways, cache_policy (their HBM cache)
    [nic]                         # SmartNIC only: clock_mhz, datapath_bytes, packetizers, local_cache_mib,
                                  # remote_cache_mib, cache_ways, memory_gbytes_per_s,
                                  # pool_on_nic, reorder, trace_samples, kernels, cores,
                                  # core_rows_per_s

The SmartNIC's mechanisms, each switched alone (``host.nic_effects`` has the model; every
shard or table goes to the NIC only where the simulator's costs say it pays):

``local_cache_mib``   > 0: the owner's NIC holds hot rows of its GPU's shards: behind the HBM
                      cache on the PCIe path for host-tier shards (the rows the HBM cache
                      misses), on the network path for HBM-resident ones (lookups of other
                      nodes); in training the NIC applies the updates of the rows it holds.
``remote_cache_mib``  > 0: the requester's NIC holds hot rows of tables owned on other nodes
                      (inference: warm, their indices never leave; training: invalidated every
                      batch, misses arrive as rows instead of pooled vectors).
``pool_on_nic``       rows served by a NIC are pooled on it (partial pools, not rows, cross
                      PCIe and the network); off, the rows go to the GPU that pools them.
                      Nothing to pool without a cache.
``reorder``           each batch's bags are grouped by their hottest row before an
                      order-dependent cache sees them (``sim.nic.reorder_bags``).
``kernels``           ``rtl`` (FPGA: neonic's RTL units) or ``cores`` (SoC: ``cores`` cores at
                      ``core_rows_per_s`` rows each, a memory-bound roofline; framing by the
                      hardware NIC at line rate).
``trace_samples``     bags traced per table shard to measure hit rates (cost vs accuracy).

With every mechanism off the NIC is a plain RDMA NIC whose packetizer (``clock_mhz`` x
``datapath_bytes``, ``packetizers`` of them side by side) frames the inter-node AlltoAll bytes
alongside the network: enough packetizers to reach the line rate make it the plain NIC.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from typing import Any, Mapping

from neonic.sim.gpu import GPU_PRESETS, GPUEfficiency, GPUSpec, gpu_preset
from neonic.sim.memory_tiers import LINKS
from neonic.sim.resources import CPU_PRESETS

__all__ = [
    "PRESET_NAMES",
    "check_table",
    "check_known_fields",
    "StreamsSpec",
    "HostSpec",
    "NICSpec",
    "SystemSpec",
    "preset",
    "preset_text",
    "system_from_dict",
    "resolve_system",
    "merge_tables",
]

PRESET_NAMES: tuple[str, ...] = ("zionex", "zion", "smartnic", "smartnic-fpga", "smartnic-soc", "gh200", "mi300a")
EMBEDDING_PLACES = ("gpu", "cpu", "nic")


# ------------------------------------------------------------------------------------ checks
def check_table(path: str, value: Any) -> Mapping[str, Any]:
    """``value`` as a TOML table, or an error naming ``path``."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{path}: expected a table, got {type(value).__name__}")
    return value


def check_known_fields(path: str, data: Mapping[str, Any], known: tuple[str, ...]) -> None:
    """Refuse a key of ``data`` outside ``known``, naming it by its dotted path (``path`` ""
    for the top level)."""
    for key in data:
        if key not in known:
            where = f"{path}.{key}" if path else key
            raise ValueError(f"{where}: unknown field; expected one of {', '.join(known)}")


# the shared config vocabulary (one wording of every error: neonic.sim.schema)
from neonic.sim.schema import boolean as _bool, choice as _choice, integer as _int, number as _num  # noqa: E402


def merge_tables(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``override``; sub-tables merge key by key."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_tables(out[key], value)
        else:
            out[key] = value
    return out


# ------------------------------------------------------------------------------------- specs
@dataclass(frozen=True)
class StreamsSpec:
    """How communication shares a GPU with computation (the levers C3 studies)."""

    comm_priority: str = "high"
    collectives_on_dma: bool = False
    comm_sm_fraction: float = 0.08
    comm_hbm_fraction: float = 0.05
    sm_partition_comm: float = 0.0
    interference: float = 0.01


@dataclass(frozen=True)
class HostSpec:
    """Host side of a node: PCIe per GPU, CPU sockets (Zion's embeddings live there), and the
    host-memory tiers of embedding shards (``sim.memory_tiers``): ``dram_gib_per_node`` /
    ``ssd_gib_per_node`` given to embeddings (0: no such tier), served through an HBM software
    cache of ``cache_load_factor`` lines per row, ``cache_ways``-way, ``cache_policy`` lru|lfu.
    ``link`` is what joins the node's CPU memory and GPUs (``sim.memory_tiers.LINKS``): ``pcie``
    (ZionEX), ``c2c`` (GH200's NVLink-C2C) or ``shared_hbm`` (MI300A: one pool of HBM, host-tier
    rows read in place, no software cache). ``pcie_gbytes_per_s`` is the PCIe link per GPU and
    direction; ``link_gbytes_per_s`` a ``c2c`` link's (or, on ``shared_hbm``, the rate of a
    copy within the HBM: the GPU's HBM bandwidth halved, read plus write, when not given).
    :meth:`SystemSpec.host_link_gbytes_per_s` resolves the figure a run gives the topology's
    GPU-host links (the network preset's ``[host_link]`` keeps its latency), so copies,
    host-tier misses and the planner's tier cost see one figure."""

    pcie_gbytes_per_s: float = 25.0
    link: str = "pcie"
    link_gbytes_per_s: float | None = None
    cpu: str = "xeon-ddr4-6ch"
    sockets_per_node: int = 4
    dram_gib_per_node: float = 0.0
    ssd_gib_per_node: float = 0.0
    ssd_gbytes_per_s: float = 3.0
    cache_load_factor: float = 0.2
    cache_ways: int = 32
    cache_policy: str = "lru"


@dataclass(frozen=True)
class NICSpec:
    """The SmartNIC: datapath, caches and the features of the SmartNIC system."""

    clock_mhz: float = 250.0
    datapath_bytes: int = 64
    packetizers: int = 1
    local_cache_mib: float = 64.0
    remote_cache_mib: float = 64.0
    cache_ways: int = 32
    memory_gbytes_per_s: float = 38.4
    pool_on_nic: bool = True
    reorder: bool = True
    trace_samples: int = 4096
    kernels: str = "rtl"           # rtl (FPGA: neonic's RTL units) | cores (SoC: Arm cores, a memory-bound roofline)
    cores: int = 0                 # kernels = "cores": cores running the embedding kernels
    core_rows_per_s: float = 0.0   # kernels = "cores": rows one core gathers per second


@dataclass(frozen=True)
class SystemSpec:
    """One system (see module doc). ``gpu_spec`` is the resolved GPU model with overrides."""

    name: str
    embeddings: str
    network: str
    gpu: str
    gpu_spec: GPUSpec
    comm_dtype: str = "fp32"
    description: str = ""
    streams: StreamsSpec = field(default_factory=StreamsSpec)
    host: HostSpec = field(default_factory=HostSpec)
    nic: NICSpec | None = None
    gpu_efficiency: Mapping[str, float] = field(default_factory=dict)

    @property
    def host_link_gbytes_per_s(self) -> float:
        """The node's CPU-memory-to-GPU link per GPU and direction (GB/s): PCIe's figure, a
        c2c link's, or on shared HBM a copy within the HBM (half its bandwidth unless given)."""
        h = self.host
        if h.link == "pcie":
            return h.pcie_gbytes_per_s
        if h.link_gbytes_per_s is not None:
            return h.link_gbytes_per_s
        return self.gpu_spec.hbm_gbytes_per_s / 2   # shared_hbm: read + write in the same HBM

    def to_dict(self) -> dict[str, Any]:
        """The resolved system as a TOML-ready table (for the results folder)."""
        out: dict[str, Any] = {
            "name": self.name, "description": self.description, "embeddings": self.embeddings,
            "network": self.network, "gpu": self.gpu, "comm_dtype": self.comm_dtype,
            "gpu_efficiency": {f.name: getattr(self.gpu_spec.efficiency, f.name) for f in fields(GPUEfficiency)},
            "streams": {f.name: getattr(self.streams, f.name) for f in fields(StreamsSpec)},
            "host": {f.name: getattr(self.host, f.name) for f in fields(HostSpec)
                     if getattr(self.host, f.name) is not None},
        }
        if self.nic is not None:
            out["nic"] = {f.name: getattr(self.nic, f.name) for f in fields(NICSpec)}
        return out


_TOP = ("name", "description", "embeddings", "network", "gpu", "comm_dtype", "gpu_efficiency", "streams", "host", "nic", "preset")


def _streams(path: str, data: Mapping[str, Any]) -> StreamsSpec:
    check_known_fields(path, data, tuple(f.name for f in fields(StreamsSpec)))
    d = StreamsSpec()
    spec = StreamsSpec(
        comm_priority=_choice(f"{path}.comm_priority", data.get("comm_priority", d.comm_priority), ("high", "normal")),
        collectives_on_dma=_bool(f"{path}.collectives_on_dma", data.get("collectives_on_dma", d.collectives_on_dma)),
        comm_sm_fraction=_num(f"{path}.comm_sm_fraction", data.get("comm_sm_fraction", d.comm_sm_fraction), 0, 1, hi_open=True),
        comm_hbm_fraction=_num(f"{path}.comm_hbm_fraction", data.get("comm_hbm_fraction", d.comm_hbm_fraction), 0, 1, hi_open=True),
        sm_partition_comm=_num(f"{path}.sm_partition_comm", data.get("sm_partition_comm", d.sm_partition_comm), 0, 0.9),
        interference=_num(f"{path}.interference", data.get("interference", d.interference), 0, 1, hi_open=True),
    )
    return spec


def _host(path: str, data: Mapping[str, Any]) -> HostSpec:
    check_known_fields(path, data, tuple(f.name for f in fields(HostSpec)))
    d = HostSpec()
    link = _choice(f"{path}.link", data.get("link", d.link), LINKS)
    if link == "c2c" and data.get("link_gbytes_per_s") is None:
        raise ValueError(f"{path}.link_gbytes_per_s: a c2c link needs its bandwidth per GPU and direction "
                         "(GB/s, e.g. 450 for GH200's NVLink-C2C); got none")
    if link == "pcie" and data.get("link_gbytes_per_s") is not None:
        raise ValueError(f"{path}.link_gbytes_per_s: a pcie link takes its bandwidth from "
                         f"{path}.pcie_gbytes_per_s; expected no link_gbytes_per_s")
    return HostSpec(
        pcie_gbytes_per_s=_num(f"{path}.pcie_gbytes_per_s", data.get("pcie_gbytes_per_s", d.pcie_gbytes_per_s), 0, lo_open=True),
        link=link,
        link_gbytes_per_s=(None if data.get("link_gbytes_per_s") is None else
                           _num(f"{path}.link_gbytes_per_s", data["link_gbytes_per_s"], 0, lo_open=True)),
        cpu=_choice(f"{path}.cpu", data.get("cpu", d.cpu), tuple(CPU_PRESETS)),
        sockets_per_node=_int(f"{path}.sockets_per_node", data.get("sockets_per_node", d.sockets_per_node), 1),
        dram_gib_per_node=_num(f"{path}.dram_gib_per_node", data.get("dram_gib_per_node", d.dram_gib_per_node), 0),
        ssd_gib_per_node=_num(f"{path}.ssd_gib_per_node", data.get("ssd_gib_per_node", d.ssd_gib_per_node), 0),
        ssd_gbytes_per_s=_num(f"{path}.ssd_gbytes_per_s", data.get("ssd_gbytes_per_s", d.ssd_gbytes_per_s), 0, lo_open=True),
        cache_load_factor=_num(f"{path}.cache_load_factor", data.get("cache_load_factor", d.cache_load_factor), 0, 1,
                               lo_open=True),
        cache_ways=_int(f"{path}.cache_ways", data.get("cache_ways", d.cache_ways), 1),
        cache_policy=_choice(f"{path}.cache_policy", data.get("cache_policy", d.cache_policy), ("lru", "lfu")),
    )


def _nic(path: str, data: Mapping[str, Any]) -> NICSpec:
    check_known_fields(path, data, tuple(f.name for f in fields(NICSpec)))
    d = NICSpec()
    ways = _int(f"{path}.cache_ways", data.get("cache_ways", d.cache_ways), 1)
    return NICSpec(
        clock_mhz=_num(f"{path}.clock_mhz", data.get("clock_mhz", d.clock_mhz), 0, lo_open=True),
        datapath_bytes=_int(f"{path}.datapath_bytes", data.get("datapath_bytes", d.datapath_bytes), 1),
        packetizers=_int(f"{path}.packetizers", data.get("packetizers", d.packetizers), 1, 16),
        local_cache_mib=_num(f"{path}.local_cache_mib", data.get("local_cache_mib", d.local_cache_mib), 0),
        remote_cache_mib=_num(f"{path}.remote_cache_mib", data.get("remote_cache_mib", d.remote_cache_mib), 0),
        cache_ways=ways,
        memory_gbytes_per_s=_num(f"{path}.memory_gbytes_per_s", data.get("memory_gbytes_per_s", d.memory_gbytes_per_s), 0, lo_open=True),
        pool_on_nic=_bool(f"{path}.pool_on_nic", data.get("pool_on_nic", d.pool_on_nic)),
        reorder=_bool(f"{path}.reorder", data.get("reorder", d.reorder)),
        trace_samples=_int(f"{path}.trace_samples", data.get("trace_samples", d.trace_samples), 16),
        **_nic_kernels(path, data, d),
    )


def _nic_kernels(path: str, data: Mapping[str, Any], d: NICSpec) -> dict[str, Any]:
    """``kernels`` and, for ``cores``, the cores and their row rate (both required then)."""
    from neonic.sim.nic import KERNEL_MODELS

    kernels = _choice(f"{path}.kernels", data.get("kernels", d.kernels), KERNEL_MODELS)
    if kernels != "cores":
        return {"kernels": kernels}
    for key in ("cores", "core_rows_per_s"):
        if key not in data:
            raise ValueError(f"{path}.{key}: required when kernels = 'cores'")
    return {"kernels": kernels, "cores": _int(f"{path}.cores", data["cores"], 1),
            "core_rows_per_s": _num(f"{path}.core_rows_per_s", data["core_rows_per_s"], 0, lo_open=True)}


def system_from_dict(data: Mapping[str, Any], path: str = "system") -> SystemSpec:
    """Validate a system table field by field (errors name the dotted field)."""
    data = check_table(path, data)
    check_known_fields(path, data, _TOP)
    for key in ("name", "embeddings", "network", "gpu"):
        if key not in data:
            raise ValueError(f"{path}.{key}: required field missing")
    name = data["name"]
    if not isinstance(name, str) or not name:
        raise ValueError(f"{path}.name: expected a non-empty string, got {name!r}")
    embeddings = _choice(f"{path}.embeddings", data["embeddings"], EMBEDDING_PLACES)
    network = data["network"]
    if not isinstance(network, str) or not network:
        raise ValueError(f"{path}.network: expected a sim.network preset name, got {network!r}")
    gpu_name = _choice(f"{path}.gpu", data["gpu"], tuple(GPU_PRESETS))
    eff_data = dict(check_table(f"{path}.gpu_efficiency", data.get("gpu_efficiency", {})))
    known_eff = tuple(f.name for f in fields(GPUEfficiency))
    check_known_fields(f"{path}.gpu_efficiency", eff_data, known_eff)
    for key, value in eff_data.items():
        _num(f"{path}.gpu_efficiency.{key}", value, 0)
    gpu = gpu_preset(gpu_name)
    if eff_data:
        try:
            gpu = gpu.with_efficiency(**eff_data)
        except ValueError as error:
            raise ValueError(f"{path}.gpu_efficiency: {error}") from None
    nic = None
    if "nic" in data:
        nic = _nic(f"{path}.nic", check_table(f"{path}.nic", data["nic"]))
    elif embeddings == "nic":
        nic = NICSpec()
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ValueError(f"{path}.description: expected a string, got {description!r}")
    return SystemSpec(
        name=name,
        description=description,
        embeddings=embeddings,
        network=network,
        gpu=gpu_name,
        gpu_spec=gpu,
        comm_dtype=_choice(f"{path}.comm_dtype", data.get("comm_dtype", "fp32"), ("fp32", "fp16")),
        streams=_streams(f"{path}.streams", check_table(f"{path}.streams", data.get("streams", {}))),
        host=_host(f"{path}.host", check_table(f"{path}.host", data.get("host", {}))),
        nic=nic,
        gpu_efficiency=eff_data,
    )


def preset_text(name: str) -> str:
    if name not in PRESET_NAMES:
        raise ValueError(f"system: unknown preset {name!r}; expected one of {', '.join(PRESET_NAMES)}")
    return resources.files(__name__).joinpath("presets", f"{name}.toml").read_text(encoding="utf-8")


def preset_dict(name: str) -> dict[str, Any]:
    return tomllib.loads(preset_text(name))


def preset(name: str) -> SystemSpec:
    """The system preset ``name`` (see :data:`PRESET_NAMES`)."""
    return system_from_dict(preset_dict(name), "system")


def resolve_system(value: Any, path: str = "system") -> SystemSpec:
    """A preset name, or a table (``preset = NAME`` plus overrides, or a full system)."""
    if isinstance(value, str):
        if value not in PRESET_NAMES:
            raise ValueError(f"{path}: unknown system preset {value!r}; expected one of {', '.join(PRESET_NAMES)}")
        return preset(value)
    data = dict(check_table(path, value))
    if "preset" in data:
        name = data.pop("preset")
        if name not in PRESET_NAMES:
            raise ValueError(f"{path}.preset: unknown system preset {name!r}; expected one of {', '.join(PRESET_NAMES)}")
        data = merge_tables(preset_dict(name), data)
    return system_from_dict(data, path)
