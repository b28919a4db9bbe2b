"""Every field of a scenario, documented once: meaning, unit, default (``neonic config``).

The loaders (``host.cluster``, ``host.systems``, ``host.workloads``) validate with the shared
checks of :mod:`neonic.sim.schema`; this module says what each field *means*, so that
``neonic config show SCENARIO`` can print a fully resolved scenario with every field explained
and the README's field tables can be generated from (and checked against) one place. Defaults
are read from the spec dataclasses where they live (``StreamsSpec()``, ``NICSpec()``, ...), and
a test holds the literal ones here to what the loaders actually fill in.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import fields as dc_fields
from typing import Any, Iterable

from neonic.sim.schema import Field

__all__ = ["scenario_fields", "field_index", "markdown_table", "annotated_toml", "resolved_scenario"]


def _gpu_efficiency_docs() -> dict[str, str]:
    """The first sentence of each ``GPUEfficiency`` attribute docstring (sim/gpu.py)."""
    from neonic.sim import gpu

    tree = ast.parse(inspect.getsource(gpu.GPUEfficiency))
    cls = tree.body[0]
    docs: dict[str, str] = {}
    body = getattr(cls, "body", [])
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            text = " ".join(nxt.value.value.split())
            docs[node.target.id] = text.split(". ")[0].rstrip(".")
    return docs


def scenario_fields() -> list[Field]:
    """The documented fields of a scenario file, in file order."""
    from neonic.host.gradients import DDP_BUCKET_CAP_MIB, DDP_FIRST_BUCKET_MIB
    from neonic.host.lookups import DEFAULT_MAX_LOOKUPS
    from neonic.host.systems import PRESET_NAMES, HostSpec, NICSpec, StreamsSpec
    from neonic.host.workloads.spec import OptimizerSpec
    from neonic.sim.gpu import GPUEfficiency

    streams, host, nic, opt = StreamsSpec(), HostSpec(), NICSpec(), OptimizerSpec()
    F = Field
    out = [
        F("scenario.name", "name of the run; prefix of its results folder", "", "scenario"),
        F("scenario.mode", "what one iteration is", "", "training",
          choices=("training", "inference")),
        F("scenario.pipelined", "Neo's pipeline (embedding AlltoAlls overlap the dense part) "
          "or the serialized baseline", "", True),
        F("scenario.iterations", "measured iterations (batches)", "iterations", 2),
        F("scenario.warmup", "iterations simulated first and not measured", "iterations", 1),
        F("scenario.seed", "random seed of the run (lookups, synthetic traces)", "", 1),
        F("cluster.nodes", "nodes of the system's topology", "nodes", 2),
        F("cluster.gpus_per_node", "GPUs per node", "GPUs", None,
          derived="the network preset's value"),
        F("workload.preset", "a packaged workload (model-a, model-f, model-i, dlrm-kaggle, "
          "dlrm-dcnv2) whose fields the others override", ""),
        F("workload.name", "workload name", "", derived="required (or the preset's)"),
        F("workload.description", "free text", ""),
        F("workload.batch_per_gpu", "samples per GPU per iteration (local batch)", "samples",
          derived="required (or the preset's)"),
        F("workload.tables", "embedding tables: name, rows, dim, dtype, pooling, "
          "pooling_distribution, pooling_sigma, trace or locality_stats", "", derived="or synthesize"),
        F("workload.synthesize", "generate the tables from published summaries: count, "
          "total_params, dim_min/max/avg, pooling_mean, ... (host.workloads.synth)", ""),
        F("workload.dense.bottom_mlp", "bottom MLP widths, input first", "features"),
        F("workload.dense.top_mlp", "top MLP widths after the interaction", "features"),
        F("workload.table_dtype", "every table's precision (a Neo optimisation switch; FP16 tables keep "
          "FP32 optimizer state)", "", None, derived="each table's own", choices=("fp32", "fp16")),
        F("workload.dense.interaction", "feature interaction (dot projects unequal widths to one "
          "first; cat concatenates; dcn cross layers)", "", "dot", choices=("dot", "cat", "dcn")),
        F("workload.dense.dcn_layers", "cross layers (interaction = dcn)", "layers", 0),
        F("workload.dense.dcn_low_rank", "rank of each cross layer (interaction = dcn)", "", 0),
        F("workload.optimizer.kind", "sparse optimizer of the tables", "", opt.kind,
          choices=("rowwise_adagrad", "adagrad", "sgd")),
        F("workload.optimizer.learning_rate", "learning rate", "", opt.learning_rate),
        F("workload.optimizer.eps", "epsilon of Adagrad", "", opt.eps),
        F("system.preset", f"a packaged system ({', '.join(PRESET_NAMES)}) whose fields the "
          "others override", "", "zionex"),
        F("system.name", "system name", ""),
        F("system.description", "free text (the preset's sources)", ""),
        F("system.embeddings", "where the embedding tables live", "", None,
          derived="the preset's", choices=("gpu", "cpu", "nic")),
        F("system.network", "network topology preset (sim/network/presets)", "", None,
          derived="the preset's"),
        F("system.gpu", "GPU model (sim.gpu presets)", "", None, derived="the preset's"),
        F("system.comm_dtype", "datatype of the gradient AllReduce and AlltoAll payloads", "",
          "fp32", choices=("fp32", "fp16")),
        F("system.streams.comm_priority", "priority of the communication stream's kernels",
          "", streams.comm_priority, choices=("high", "normal")),
        F("system.streams.collectives_on_dma", "collectives run on the copy engines instead of "
          "SMs", "", streams.collectives_on_dma),
        F("system.streams.comm_sm_fraction", "share of SMs a collective holds while it runs",
          "fraction", streams.comm_sm_fraction),
        F("system.streams.comm_hbm_fraction", "share of HBM bandwidth a collective holds",
          "fraction", streams.comm_hbm_fraction),
        F("system.streams.sm_partition_comm", "SMs reserved for communication (0: shared)",
          "fraction", streams.sm_partition_comm),
        F("system.streams.interference", "HBM capacity lost while kernels and collectives "
          "overlap on a GPU (measured on an H200: `neonic bench gpu`)", "fraction", streams.interference),
        F("system.host.link", "what joins CPU memory and GPU: pcie (ZionEX), c2c (GH200's "
          "NVLink-C2C) or shared_hbm (MI300A: one HBM pool, host-tier rows read in place)", "",
          host.link, choices=("pcie", "c2c", "shared_hbm")),
        F("system.host.pcie_gbytes_per_s", "PCIe bandwidth per GPU, each direction (the host "
          "link when link = pcie)", "GB/s", host.pcie_gbytes_per_s),
        F("system.host.link_gbytes_per_s", "the host link's bandwidth per GPU, each direction, "
          "when link = c2c (required) or shared_hbm (default: half the GPU's HBM bandwidth)",
          "GB/s", None, derived="the preset's"),
        F("system.host.dram_gib_per_node", "host DRAM per node given to embedding shards behind "
          "an HBM software cache (0: no DRAM tier)", "GiB", None, derived="the preset's"),
        F("system.host.ssd_gib_per_node", "SSD per node given to embedding shards (0: no SSD tier)",
          "GiB", host.ssd_gib_per_node),
        F("system.host.ssd_gbytes_per_s", "SSD read bandwidth per node", "GB/s", host.ssd_gbytes_per_s),
        F("system.host.cache_load_factor", "HBM cache lines per host-tier row (FBGEMM's "
          "cache_load_factor)", "fraction", None, derived="the preset's"),
        F("system.host.cache_ways", "associativity of the HBM software cache", "ways", host.cache_ways),
        F("system.host.cache_policy", "replacement policy of the HBM software cache", "",
          host.cache_policy, choices=("lru", "lfu")),
        F("system.host.cpu", "CPU socket model (sim.resources presets)", "", host.cpu),
        F("system.host.sockets_per_node", "CPU sockets per node", "sockets",
          host.sockets_per_node),
        F("system.nic.clock_mhz", "SmartNIC datapath clock", "MHz", nic.clock_mhz),
        F("system.nic.datapath_bytes", "SmartNIC datapath width", "bytes", nic.datapath_bytes),
        F("system.nic.packetizers", "RoCEv2 packetizers side by side on the NIC (each frames "
          "clock_mhz x datapath_bytes)", "units", nic.packetizers),
        F("system.nic.local_cache_mib", "NIC cache of the owner's hot rows (0: off)", "MiB",
          nic.local_cache_mib),
        F("system.nic.remote_cache_mib", "NIC cache of remote tables' rows (0: off)", "MiB",
          nic.remote_cache_mib),
        F("system.nic.cache_ways", "associativity of the NIC caches", "ways", nic.cache_ways),
        F("system.nic.memory_gbytes_per_s", "bandwidth of the NIC's cache memory", "GB/s",
          nic.memory_gbytes_per_s),
        F("system.nic.pool_on_nic", "rows a NIC serves are pooled on it", "", nic.pool_on_nic),
        F("system.nic.reorder", "group each batch's bags by their hottest row", "", nic.reorder),
        F("system.nic.trace_samples", "bags traced per table shard to measure hit rates",
          "bags", nic.trace_samples),
        F("system.nic.kernels", "how the NIC runs its embedding kernels: rtl (FPGA, neonic's RTL "
          "units) or cores (SoC, a memory-bound roofline of its cores)", "", nic.kernels,
          choices=("rtl", "cores")),
        F("system.nic.cores", "cores running the embedding kernels (kernels = cores)", "cores",
          None, derived="required with cores"),
        F("system.nic.core_rows_per_s", "rows one core gathers per second (kernels = cores)",
          "rows/s", None, derived="required with cores"),
        F("planner.name", "the sharding planner: neo, a baseline (size-greedy, ...) or "
          "force:<type>", "", "neo"),
        F("planner.max_steps", "Neo's refinement steps at most (deterministic plans)", "steps",
          200),
        F("planner.time_budget_s", "optional wall-clock bound of Neo's search (a plan it cuts "
          "short is not reproducible)", "s", None, derived="none"),
        F("planner.allreduce", "algorithm of the dense AllReduce", "", "hierarchical",
          choices=("ring", "double_binary_tree", "hierarchical")),
        F("planner.alltoall", "algorithm of the embedding AlltoAlls", "", "direct",
          choices=("direct", "hierarchical")),
        F("dense.dtype", "GEMM datatype of the MLPs (mixed precision)", "", "fp16",
          choices=("fp16", "bf16", "tf32", "fp32")),
        F("dense.bucket_mib", "DDP gradient bucket cap (0: one AllReduce after the backward)",
          "MiB", DDP_BUCKET_CAP_MIB),
        F("dense.first_bucket_mib", "DDP's first-bucket cap", "MiB", DDP_FIRST_BUCKET_MIB),
        F("dense.optimizer", "when the dense optimizer steps", "", "after_last",
          choices=("after_last", "per_bucket")),
        F("dense.next_batch", "when the next batch's compute may start: after the optimizer step "
          "(PyTorch DDP's program order on one stream) or when the data it reads is ready", "",
          "after_step", choices=("after_step", "when_ready")),
        F("comm_precision.forward", "wire precision of the pooled AlltoAll and the row-wise "
          "reduce-scatter", "", None, derived="system.comm_dtype", choices=("fp32", "fp16", "bf16")),
        F("comm_precision.backward", "wire precision of the gradient AlltoAll and the all-gather",
          "", None, derived="system.comm_dtype", choices=("fp32", "fp16", "bf16")),
        F("comm_precision.allreduce", "wire precision of the dense gradients' AllReduce", "",
          None, derived="system.comm_dtype", choices=("fp32", "fp16", "bf16")),
        F("lookups.max_lookups", "lookups drawn per iteration at most (the rest scaled)",
          "lookups", DEFAULT_MAX_LOOKUPS),
        F("lookups.zipf", "every table draws Zipf lookups (the default source)", "", None,
          derived="true unless trace or locality_stats"),
        F("lookups.alpha", "Zipf exponent of the default source", "", None,
          derived="sim.lookups' default"),
        F("lookups.trace", "a trace file (.npz, host.traces format) for every table", ""),
        F("lookups.locality_stats", "locality statistics to fit traces to (host.traces)", ""),
        F("lookups.locality_block", "which block of the statistics file to fit", ""),
        F("lookups.tables", "per-table sources: [lookups.tables.NAME] trace | locality_stats | zipf",
          ""),
    ]
    docs = _gpu_efficiency_docs()
    eff = GPUEfficiency()
    for f in dc_fields(GPUEfficiency):
        unit = "s" if f.name.endswith("_s") else "bytes" if "bytes" in f.name else "fraction"
        out.append(F(f"system.gpu_efficiency.{f.name}", docs.get(f.name, f.name), unit,
                     getattr(eff, f.name), derived="the GPU preset's"))
    return out


def field_index() -> dict[str, Field]:
    return {f.name: f for f in scenario_fields()}


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return f"{value:g}" if isinstance(value, float) else str(value)


def _default_text(f: Field) -> str:
    if f.default is not None:
        return _cell(f.default)
    return f.derived


def markdown_table(section: str | None = None) -> str:
    """The README's field table (``section``: only fields under it, e.g. ``system``)."""
    rows = ["| field | meaning | unit | default |", "| --- | --- | --- | --- |"]
    for f in scenario_fields():
        if section and not f.name.startswith(section + "."):
            continue
        bar = " \\| "
        meaning = f.meaning + (f" ({bar.join(f.choices)})" if f.choices else "")
        rows.append(f"| `{f.name}` | {meaning} | {f.unit} | {_default_text(f)} |")
    return "\n".join(rows) + "\n"


def resolved_scenario(scenario) -> dict[str, Any]:
    """The scenario's resolved table with the workload preset expanded into its fields."""
    import tomllib

    data = scenario.resolved()
    workload = dict(data.get("workload") or {})
    if "preset" in workload:
        from neonic.host.workloads import preset_text

        table = tomllib.loads(preset_text(workload["preset"]))
        rest = {k: v for k, v in workload.items() if k != "preset"}
        workload = {**table, **rest, "preset": workload["preset"]}
    workload.setdefault("batch_per_gpu", scenario.workload.batch_per_gpu)
    data["workload"] = workload
    return data


def annotated_toml(data: dict[str, Any]) -> str:
    """``data`` as TOML with each documented field's meaning, unit and default beside it."""
    import tomli_w

    index = field_index()
    lines: list[str] = []

    def emit(prefix: str, table: dict[str, Any]) -> None:
        scalars = {k: v for k, v in table.items() if not isinstance(v, dict)
                   and not (isinstance(v, list) and v and isinstance(v[0], dict))}
        subs = {k: v for k, v in table.items() if k not in scalars}
        if prefix:
            lines.append("")
            lines.append(f"[{prefix}]")
        whole = index.get(prefix)
        if prefix and whole is not None:
            lines.append(f"# {prefix}: {whole.meaning}")
        for key, value in scalars.items():
            if isinstance(value, list):
                import json
                text = f"{tomli_w.dumps({key: 0}).split('=')[0].strip()} = {json.dumps(value)}"
            else:
                text = tomli_w.dumps({key: value}).strip()
            f = index.get(f"{prefix}.{key}" if prefix else key)
            if f is None:
                lines.append(text)
                continue
            note = f.meaning + (f" [{f.unit}]" if f.unit else "")
            d = _default_text(f)
            if d:
                note += f"; default {d}"
            if f.choices:
                note += f"; one of {', '.join(f.choices)}"
            lines.append(f"{text:<40} # {note}")
        for key, value in subs.items():
            path = f"{prefix}.{key}" if prefix else key
            if isinstance(value, dict):
                emit(path, value)
            else:  # an array of tables (workload.tables): as written
                f = index.get(path)
                lines.append("")
                if f is not None:
                    lines.append(f"# {path}: {f.meaning}")
                lines.append(tomli_w.dumps({path.split('.')[-1]: value}).strip()
                             if not prefix else tomli_w.dumps({prefix: {key: value}}).strip())

    emit("", data)
    return "\n".join(lines).lstrip("\n") + "\n"


def undocumented(data: dict[str, Any], prefix: str = "") -> Iterable[str]:
    """Dotted names of fields in ``data`` that no :class:`Field` documents."""
    index = field_index()
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and path not in index:
            yield from undocumented(value, path)
        elif path not in index:
            yield path
