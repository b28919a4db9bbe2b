"""SmartNIC offload vs a plain RDMA NIC: inference latency and training throughput, and what
each mechanism contributes, in the regime the SmartNIC system was built for.

The regime: the model's tables (Model-A's share for the cluster, its parameters grown to
``size_x_hbm`` x the cluster's HBM) live in host DRAM behind the HBM software cache, so the HBM
cache's misses cross PCIe and other nodes' rows cross the network; the SmartNIC sits on both
paths and takes a shard or a table only where the simulator's costs say it pays
(``host.nic_effects``). ``size_x_hbm = 0`` keeps Model-A's own size (GPU-resident tables).

Variants: ``rdma`` (the zionex system: a plain RDMA NIC per GPU), ``smartnic:none`` (the
SmartNIC with every mechanism off), ``smartnic:+M`` for each mechanism M alone, and
``smartnic:all``. Mechanisms map to the smartnic system's ``[nic]`` fields: ``local_cache``
(``local_cache_mib``), ``remote_cache`` (``remote_cache_mib``), ``pool_on_nic`` and ``reorder``.
The SmartNIC runs need the NIC model (``sim/nic.py``); until the cluster runtime accepts the
smartnic system the experiment raises :class:`ExperimentUnavailable` with the runtime's reason.
Every figure is a prediction (REFERENCES.md publishes no SmartNIC figure).

Latency as a service measures it: ``latency_unloaded_ms`` is one query batch alone in the
system (nothing else in flight); ``latency_at_load_<pct>_ms`` adds the queueing of batches
offered at that share of the pipeline's capacity (Poisson arrivals, ASSUMPTION, served at the
pipeline's deterministic rate, one batch per iteration time: the M/D/1 waiting time
``rho / (2 mu (1 - rho))``); ``latency_back_to_back_ms`` is the mean latency of batches fed
back to back by the pipelined run (full load, queueing included).
"""

from __future__ import annotations

from typing import Any, Callable

from neonic.host.experiments._common import (
    PLANNER_FIELDS,
    Checker,
    ExperimentResult,
    Timer,
    item_choice,
    planner_fields,
    planner_table,
    run_scenario,
    scaled_workload,
    scenario_data,
    scenario_figures,
)

TITLE = "SmartNIC offload vs plain RDMA NIC: latency, throughput, each mechanism alone"
MECHANISMS = ("local_cache", "remote_cache", "pool_on_nic", "reorder")
_KNOWN = ("model", "nodes", "gpus_per_node", "reference_nodes", "table_fraction", "size_x_hbm", "preset", "alpha",
          "batch_per_gpu", "mechanisms", "modes", "local_cache_mib", "remote_cache_mib", "iterations", "warmup", "loads",
          *PLANNER_FIELDS)


#: What decides the SmartNIC's figures here: consequences of documented parameters (the preset
#: says where each comes from) and of the split by cost, not modelling errors.
GENUINE_EFFECTS: tuple[str, ...] = (
    "The split by cost: a shard goes to the NIC's local cache, a table to the requesters' remote caches, only "
    "where the simulator's own costs (GPU kernels, PCIe at the host link's bandwidth, the NIC units, inter-node "
    "bytes at the line rate) say it shortens the slowest rank; the metrics' nic.*_on_nic and nic.*_refused_by "
    "say how many went and which resource refused the rest.",
    "Behind the HBM cache, the NIC's local cache only catches the rows the HBM cache misses: with skewed lookups "
    "(Zipf ~1.1, FBGEMM's defaults) the HBM cache already serves most, and the NIC's share is small.",
    "A NIC's partial pool is one FP32 vector per bag with a hit: it saves PCIe bytes only when a bag has more "
    "than about one NIC hit (rows of FP16 tables are half a partial's size).",
    "The NIC's datapath (64 B x 250 MHz = 16 GB/s) and memory (DDR4 38.4 / HBM2 460 GB/s) are far slower than "
    "GPU HBM (1555 GB/s): GPU-resident rows stay on the GPU.",
    "Training: the NIC owns the rows it caches and applies their updates (gradients cross PCIe instead of "
    "write-backs); the remote cache is invalidated every batch and its misses travel as rows, not pooled vectors.",
)


def check_config(data: dict[str, Any]) -> dict[str, Any]:
    c = Checker(data, "smartnic", _KNOWN)
    return {
        "model": c.choice("model", ("model-a", "model-f", "model-i"), "model-a"),
        "nodes": c.int("nodes", 2, 1),
        "gpus_per_node": c.int("gpus_per_node", 8, 1),
        "reference_nodes": c.int("reference_nodes", 16, 1),
        "table_fraction": c.num("table_fraction", 1.0, 0, 1.0),
        "size_x_hbm": c.num("size_x_hbm", 4.0, 0, lo_open=False),
        "preset": c.choice("preset", ("smartnic", "smartnic-fpga", "smartnic-soc"), "smartnic-fpga"),
        "alpha": c.num("alpha", None, 0) if data.get("alpha") is not None else None,
        "batch_per_gpu": c.int("batch_per_gpu", None, 1) if data.get("batch_per_gpu") is not None else None,
        "mechanisms": c.list("mechanisms", item_choice(MECHANISMS), list(MECHANISMS), nonempty=False),
        "modes": c.list("modes", item_choice(("inference", "training")), ["inference", "training"]),
        "local_cache_mib": c.num("local_cache_mib", 3072.0, 0),
        "remote_cache_mib": c.num("remote_cache_mib", 3072.0, 0),
        "iterations": c.int("iterations", 2, 1),
        "loads": c.list("loads", _load, [0.5, 0.8, 0.9]),
        "warmup": c.int("warmup", 1, 0),
        **planner_fields(c, data),
    }


def _load(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ValueError(f"{where}: expected an offered load in (0, 1) of the pipeline's capacity, got {value!r}")
    return float(value)


def queueing_latency_ms(unloaded_ms: float, iteration_ms: float, load: float) -> float:
    """Mean latency of query batches arriving as a Poisson stream at ``load`` of the capacity of
    a pipeline that completes one batch per ``iteration_ms`` (M/D/1): the unloaded latency plus
    the mean wait ``rho / (2 mu (1 - rho))``."""
    if not 0 <= load < 1:
        raise ValueError(f"load: expected in [0, 1), got {load!r}")
    return unloaded_ms + load * iteration_ms / (2 * (1 - load))


def nic_fields(config: dict[str, Any], on: set[str]) -> dict[str, Any]:
    """The smartnic system's ``[nic]`` overrides with exactly the mechanisms ``on`` enabled."""
    return {
        "local_cache_mib": config["local_cache_mib"] if "local_cache" in on else 0.0,
        "remote_cache_mib": config["remote_cache_mib"] if "remote_cache" in on else 0.0,
        "pool_on_nic": "pool_on_nic" in on,
        "reorder": "reorder" in on,
    }


def variants(config: dict[str, Any]) -> list[tuple[str, Any]]:
    """(label, system) for every variant, the plain RDMA NIC first."""
    p = config["preset"]
    out: list[tuple[str, Any]] = [("rdma", "zionex"), ("smartnic:none", {"preset": p, "nic": nic_fields(config, set())})]
    for mech in config["mechanisms"]:
        out.append((f"smartnic:+{mech}", {"preset": p, "nic": nic_fields(config, {mech})}))
    out.append(("smartnic:all", {"preset": p, "nic": nic_fields(config, set(MECHANISMS))}))
    return out


def regime_workload(config: dict[str, Any]) -> dict[str, Any]:
    """Model-A's share for the cluster (``nodes / reference_nodes`` of its tables, times
    ``table_fraction``) with its parameters scaled so that tables and row-wise optimizer state
    need ``size_x_hbm`` x the HBM the cluster's GPUs give tables (0: Model-A's own size)."""
    from neonic.host.systems import preset
    from neonic.host.workloads import workload_from_dict
    from neonic.sim.gpu import hbm_capacity_bytes

    fraction = config["nodes"] / config["reference_nodes"]
    wl = scaled_workload(config["model"], fraction, config["table_fraction"], batch_per_gpu=config["batch_per_gpu"])
    if config["size_x_hbm"] > 0:
        spec = workload_from_dict(wl)
        need = float(sum(spec.table_memory_bytes(t) for t in spec.tables))
        hbm = float(hbm_capacity_bytes(preset("zionex").gpu_spec)) * config["nodes"] * config["gpus_per_node"]
        wl = scaled_workload(config["model"], fraction, config["table_fraction"], config["size_x_hbm"] * hbm / need,
                             batch_per_gpu=config["batch_per_gpu"])
    return wl


def _scenario(config: dict[str, Any], name: str, workload: dict[str, Any], system: Any, mode: str, iterations: int,
              warmup: int) -> dict[str, Any]:
    data = scenario_data(name, workload, system, config["nodes"], mode=mode, iterations=iterations, warmup=warmup,
                         planner=planner_table(config))
    data["cluster"]["gpus_per_node"] = config["gpus_per_node"]
    if config["alpha"] is not None:
        data["lookups"] = {"alpha": config["alpha"]}
    return data


def run(config: dict[str, Any], progress: Callable[[str], None]) -> ExperimentResult:
    timer = Timer()
    workload = regime_workload(config)
    rows: list[dict[str, Any]] = []
    # the SmartNIC first: if the runtime refuses it, say so before spending time on the rest
    order = variants(config)
    order = order[1:] + order[:1]
    for label, system in order:
        for mode in config["modes"]:
            progress(f"smartnic: {label}, {mode}")
            result = run_scenario(_scenario(config, f"smartnic-{mode}", workload, system, mode, config["iterations"],
                                            config["warmup"]))
            fig = scenario_figures(result)
            row = {"variant": label, "mode": mode, "samples_per_s": fig["samples_per_s"], "iteration_ms": fig["iteration_ms"],
                   "latency_back_to_back_ms": fig.get("latency_mean_ms"), "exposed_comm_ms": fig["exposed_comm_ms"]}
            if mode == "inference":
                # one batch alone in the system: the latency without queueing
                alone = run_scenario(_scenario(config, f"smartnic-{mode}-alone", workload, system, mode, 1, 0))
                row["latency_unloaded_ms"] = scenario_figures(alone)["latency_mean_ms"]
                for load in config["loads"]:
                    row[f"latency_at_load_{round(load * 100)}_ms"] = queueing_latency_ms(
                        row["latency_unloaded_ms"], fig["iteration_ms"], load)
            for name, rate in result.metrics.get("cache_hit_rates", {}).items():
                row[f"hit_rate_{name}"] = rate
            tiers = result.metrics.get("memory_tiers", {})
            row["hbm_cache_hit_rate"] = (tiers.get("cache") or {}).get("hit_rate")
            row["host_tier_shards"] = (tiers.get("shards") or {}).get("dram")
            nic = result.metrics.get("nic") or {}
            for key in ("local_cache_shards_on_nic", "local_cache_shards", "remote_cache_tables_on_nic",
                        "remote_cache_tables", "local_cache_refused_by", "remote_cache_refused_by", "bottleneck_before",
                        "bottleneck_after"):
                if key in nic:
                    row[key] = nic[key]
            rows.append(row)
    rows.sort(key=lambda r: ([v for v, _ in variants(config)].index(r["variant"]), r["mode"]))
    base = {r["mode"]: r for r in rows if r["variant"] == "rdma"}
    for r in rows:
        b = base.get(r["mode"])
        if b:
            r["throughput_vs_rdma"] = r["samples_per_s"] / b["samples_per_s"]
            if r.get("latency_unloaded_ms") and b.get("latency_unloaded_ms"):
                r["latency_vs_rdma"] = r["latency_unloaded_ms"] / b["latency_unloaded_ms"]
    metrics = {f"{r['variant']}/{r['mode']}": {k: r[k] for k in ("samples_per_s", "latency_unloaded_ms", "latency_back_to_back_ms",
                                                                 "throughput_vs_rdma", "latency_vs_rdma")
                                               if r.get(k) is not None} for r in rows}
    notes = ["Every figure is a prediction; REFERENCES.md publishes no SmartNIC figure.",
             f"Regime: {workload['description']}; tables need {config['size_x_hbm']:g} x the HBM of "
             f"{config['nodes']} x {config['gpus_per_node']} GPUs (host DRAM behind the HBM cache); SmartNIC preset "
             f"{config['preset']}.",
             "Each smartnic:+M row switches on mechanism M alone; smartnic:none has every mechanism off.",
             *GENUINE_EFFECTS]
    res = ExperimentResult("smartnic", TITLE, config, rows, metrics, notes, wall_s=timer.elapsed)
    res.plots = {"smartnic.png": lambda f: _plot(f, rows)}
    return res


def validate_keys(result: ExperimentResult) -> dict[str, float]:
    """``inference_latency_speedup`` (unloaded latency, plain NIC / SmartNIC) and
    ``training_throughput_speedup`` (SmartNIC / plain NIC) with every mechanism on, and the same
    as ``<mechanism>.<key>`` for each mechanism alone (the keys under ``smartnic.`` in
    ``neonic validate --json``)."""
    by = {(r["variant"], r["mode"]): r for r in result.rows}
    out: dict[str, float] = {}
    for label, prefix in [("smartnic:all", ""), *((f"smartnic:+{m}", f"{m}.") for m in MECHANISMS)]:
        inf, train = by.get((label, "inference")), by.get((label, "training"))
        if inf and inf.get("latency_vs_rdma"):
            out[f"{prefix}inference_latency_speedup"] = 1.0 / inf["latency_vs_rdma"]
        if train and train.get("throughput_vs_rdma"):
            out[f"{prefix}training_throughput_speedup"] = train["throughput_vs_rdma"]
    return out


def _plot(fig, rows) -> None:
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    for i, mode in enumerate(modes):
        ax = fig.add_subplot(1, len(modes), i + 1)
        mine = [r for r in rows if r["mode"] == mode]
        if mode == "inference":
            ax.barh([r["variant"] for r in mine], [r.get("latency_unloaded_ms") or 0.0 for r in mine])
            ax.set_xlabel("unloaded latency per query batch (ms)")
        else:
            ax.barh([r["variant"] for r in mine], [r["samples_per_s"] for r in mine])
            ax.set_xlabel("training samples/s")
        ax.tick_params(axis="y", labelsize=7)
        ax.set_title(mode)
