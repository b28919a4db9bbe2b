"""Discrete vs APU nodes: the same models on ZionEX-, GH200- and MI300A-class clusters of equal
GPU count, with the SmartNIC's mechanisms off and on.

The co-design questions of a recommendation model that does not fit HBM change with how a node
joins its CPU memory and GPU (``system.host.link``): over PCIe (ZionEX) a host-tier row costs a
copy at ~25 GB/s into the HBM software cache; over NVLink-C2C (GH200) the same copy runs at
450 GB/s; on one pool of HBM (MI300A) there is no copy and no cache, but also no memory beyond
the HBM. Each row of the table is one run: throughput, exposed communication, the HBM cache's
hit rate, the bytes and shards per tier and the tables that live (partly) in host memory;
``placement.csv`` lists every table's tier shares. A model that a system cannot hold at all is
a row saying how many bytes are missing, not a failure. Every figure is a prediction of the
model (REFERENCES.md publishes none of them).
"""

from __future__ import annotations

import csv
from typing import Any, Callable

from neonic.host.experiments._common import (
    PLANNER_FIELDS,
    Checker,
    ExperimentResult,
    Timer,
    item_choice,
    planner_fields,
    planner_table,
    scaled_workload,
    scenario_data,
    scenario_figures,
)

TITLE = "Discrete vs APU nodes: ZionEX, GH200 and MI300A at equal GPU count, SmartNIC off and on"
SYSTEMS = ("zionex", "gh200", "mi300a")
MODELS = ("model-a", "model-f", "past-hbm")
_KNOWN = ("models", "systems", "gpus", "table_fraction", "params_fraction", "past_hbm_factor", "smartnic",
          "iterations", "warmup", *PLANNER_FIELDS)


def check_config(data: dict[str, Any]) -> dict[str, Any]:
    c = Checker(data, "node_classes", _KNOWN)
    out = {
        "models": c.list("models", item_choice(MODELS)),
        "systems": c.list("systems", item_choice(SYSTEMS), list(SYSTEMS)),
        "gpus": c.int("gpus", 128, 1),
        "table_fraction": c.num("table_fraction", 1.0, 0, 1.0),
        "params_fraction": c.num("params_fraction", 1.0, 0, 1.0),
        "past_hbm_factor": c.num("past_hbm_factor", 1.5, 1.0, lo_open=True),
        "smartnic": c.list("smartnic", lambda where, v: _bool(where, v), [False, True]),
        "iterations": c.int("iterations", 1, 1),
        "warmup": c.int("warmup", 1, 0),
        **planner_fields(c, data),
    }
    for system in out["systems"]:
        gpn = _gpus_per_node(system)
        if out["gpus"] % gpn:
            raise ValueError(f"node_classes.gpus: {out['gpus']} GPUs do not fill whole {system} nodes of {gpn} GPUs; "
                             f"expected a multiple of {gpn}")
    return out


def _bool(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{where}: expected true or false, got {value!r}")
    return value


def _gpus_per_node(system: str) -> int:
    from neonic.host.systems import preset
    from neonic.sim.network.config import load_preset

    return load_preset(preset(system).network).cluster.gpus_per_node


def _system_table(system: str, smartnic: bool) -> dict[str, Any]:
    """The system preset, with the SmartNIC preset's NIC and mechanisms when ``smartnic``."""
    from neonic.host.systems import preset_dict

    table: dict[str, Any] = {"preset": system}
    if smartnic:
        table["embeddings"] = "nic"
        table["nic"] = dict(preset_dict("smartnic")["nic"])
    return table


def _table_bytes(workload: dict[str, Any]) -> float:
    from neonic.host.workloads import resolve_workload

    wl = resolve_workload(workload, "workload")
    return float(sum(wl.table_memory_bytes(t) for t in wl.tables))


def _cluster_hbm_bytes(system: str, gpus: int) -> float:
    from neonic.host.systems import preset
    from neonic.sim.gpu import hbm_capacity_bytes

    return float(hbm_capacity_bytes(preset(system).gpu_spec)) * gpus


def _workload(model: str, config: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The model's workload table and a note on how it was sized."""
    tf, pf = config["table_fraction"], config["params_fraction"]
    if model != "past-hbm":
        return scaled_workload(model, 1.0, tf, pf), f"{model}: table_fraction={tf}, params_fraction={pf}."
    # Model-A's tables with rows grown until they need past_hbm_factor x the HBM of the system
    # with the most HBM: every system must use its host memory (or refuse the model)
    hbm = max(_cluster_hbm_bytes(s, config["gpus"]) for s in config["systems"])
    base = scaled_workload("model-a", 1.0, tf, 1.0)
    factor = config["past_hbm_factor"] * hbm / _table_bytes(base)
    wl = scaled_workload("model-a", 1.0, tf, factor)
    wl["name"] = "past-hbm"
    return wl, (f"past-hbm: model-a's tables (table_fraction={tf}) with rows scaled x{factor:.3g} so that tables and "
                f"optimizer state need {config['past_hbm_factor']:g} x the largest cluster HBM here "
                f"({hbm / 2**40:.2f} TiB): {wl['synthesize']['total_params']:.3g} parameters.")


def run(config: dict[str, Any], progress: Callable[[str], None]) -> ExperimentResult:
    from neonic.host.cluster import ClusterRun, scenario_from_dict

    timer = Timer()
    rows: list[dict[str, Any]] = []
    placement: list[dict[str, Any]] = []
    notes = ["Every figure is a prediction of the model; REFERENCES.md publishes none of them.",
             f"Equal GPU count: {config['gpus']} GPUs on every system (ZionEX 8 per node, GH200 and MI300A 4).",
             "host.link: pcie (ZionEX, misses copied into the HBM cache over PCIe 4), c2c (GH200, the same copies "
             "over NVLink-C2C), shared_hbm (MI300A, host-tier rows read in place from the same HBM: no cache, no "
             "copy, and no memory beyond the HBM).",
             "SmartNIC on: the smartnic preset's NIC (local and remote caches, pooling on the NIC, reordering) on "
             "each system's GPUs and host memory."]
    for model in config["models"]:
        workload, note = _workload(model, config)
        notes.append(note)
        need = _table_bytes(workload)
        for system in config["systems"]:
            nodes = config["gpus"] // _gpus_per_node(system)
            for smartnic in config["smartnic"]:
                label = f"{model} on {nodes} {system} node(s), SmartNIC {'on' if smartnic else 'off'}"
                progress(f"node classes: {label}")
                data = scenario_data(f"{system}-{model}", workload, _system_table(system, smartnic), nodes,
                                     iterations=config["iterations"], warmup=config["warmup"],
                                     planner=planner_table(config))
                row: dict[str, Any] = {"model": model, "system": system, "smartnic": smartnic, "nodes": nodes,
                                       "gpus": config["gpus"], "table_tib": need / 2**40}
                try:
                    cr = ClusterRun(scenario_from_dict(data))
                    result = cr.run()
                except ValueError as error:
                    if "missing" not in str(error):
                        raise
                    row.update({"fits": False, "note": str(error)})
                    rows.append(row)
                    progress(f"node classes: {label}: does not fit ({error})")
                    continue
                row.update(_figures(cr, result))
                rows.append(row)
                placement += _placement(cr, model, system, smartnic)
                progress(f"node classes: {label}: {row['samples_per_s']:,.0f} samples/s, "
                         f"host-tier shards {row['host_shards']}, HBM cache hit rate {row['hbm_cache_hit_rate']}")
    metrics = _metrics(rows, config)
    res = ExperimentResult("node_classes", TITLE, config, rows, metrics, notes, wall_s=timer.elapsed)
    res.files = {"placement.csv": lambda path: _write_csv(path, placement)}
    res.plots = {"throughput.png": lambda f: _plot_bars(f, rows, "samples_per_s", "samples/s"),
                 "exposed_comm.png": lambda f: _plot_bars(f, rows, "exposed_comm_ms", "exposed communication ms"),
                 "hit_rate.png": lambda f: _plot_bars(f, rows, "hbm_cache_hit_rate", "HBM cache hit rate"),
                 "tiers.png": lambda f: _plot_tiers(f, rows)}
    return res


def _figures(cr: Any, result: Any) -> dict[str, Any]:
    fig = scenario_figures(result)
    tiers = result.metrics.get("memory_tiers", {})
    cache = tiers.get("cache", {})
    shards = tiers.get("shards", {})
    by_tier = tiers.get("bytes", {})
    host_tables = sum(1 for t in cr.scenario.workload.tables
                      if any(k.tier != "hbm" for k in cr.work.tables[t.name].kernels))
    nic = result.metrics.get("cache_hit_rates") or {}
    return {"fits": True, "samples_per_s": fig["samples_per_s"], "iteration_ms": fig["iteration_ms"],
            "exposed_comm_ms": fig["exposed_comm_ms"], "exposed_compute_ms": fig["exposed_compute_ms"],
            "link": tiers.get("link", cr.scenario.system.host.link),
            "hbm_cache_hit_rate": cache.get("hit_rate"),
            "host_shards": shards.get("dram", 0) + shards.get("ssd", 0), "hbm_shards": shards.get("hbm", 0),
            "host_tables": host_tables,
            "hbm_tib": by_tier.get("hbm", 0.0) / 2**40, "host_tib": (by_tier.get("dram", 0.0) + by_tier.get("ssd", 0.0)) / 2**40,
            "host_link_bytes_per_iteration": tiers.get("pcie", {}).get("bytes", 0.0) / max(1, cr.scenario.iterations + cr.scenario.warmup),
            "nic_local_hit_rate": nic.get("nic_local"), "nic_remote_hit_rate": nic.get("nic_remote")}


def _placement(cr: Any, model: str, system: str, smartnic: bool) -> list[dict[str, Any]]:
    out = []
    for t in cr.scenario.workload.tables:
        ks = cr.work.tables[t.name].kernels
        rows_by_tier = {"hbm": 0.0, "dram": 0.0, "ssd": 0.0}
        total = 0.0
        for k in ks:
            rows_by_tier[k.tier] += k.lookups
            total += k.lookups
        out.append({"model": model, "system": system, "smartnic": smartnic, "table": t.name,
                    "sharding": cr.plan.tables[t.name].sharding.value,
                    "shards": len(ks), "lookup_share_hbm": rows_by_tier["hbm"] / total if total else 0.0,
                    "lookup_share_host": (rows_by_tier["dram"] + rows_by_tier["ssd"]) / total if total else 0.0,
                    "tiers": "+".join(sorted({k.tier for k in ks}))})
    return out


def _metrics(rows: list[dict[str, Any]], config: dict[str, Any]) -> dict[str, Any]:
    metrics: dict[str, Any] = {}
    for r in rows:
        key = f"{r['model']}.{r['system']}.smartnic_{'on' if r['smartnic'] else 'off'}"
        metrics[key] = ({"samples_per_s": r["samples_per_s"], "exposed_comm_ms": r["exposed_comm_ms"],
                         "hbm_cache_hit_rate": r["hbm_cache_hit_rate"], "host_tables": r["host_tables"]}
                        if r.get("fits") else {"fits": False})
    for model in config["models"]:
        by = {(r["system"], r["smartnic"]): r for r in rows if r["model"] == model and r.get("fits")}
        base = by.get(("zionex", False))
        for system in config["systems"]:
            off, on = by.get((system, False)), by.get((system, True))
            if base and off and system != "zionex":
                metrics[f"{model}.{system}_over_zionex"] = off["samples_per_s"] / base["samples_per_s"]
            if off and on:
                metrics[f"{model}.{system}.smartnic_speedup"] = on["samples_per_s"] / off["samples_per_s"]
    return metrics


def _write_csv(path: Any, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        if not rows:
            fh.write("model,system,smartnic,table\n")
            return
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _plot_bars(fig, rows: list[dict[str, Any]], key: str, label: str) -> None:
    """Grouped bars: one group per model, one bar per system and SmartNIC setting; a model a
    system cannot hold shows as a hatched empty bar."""
    import numpy as np

    ax = fig.add_subplot(111)
    models = list(dict.fromkeys(r["model"] for r in rows))
    variants = list(dict.fromkeys((r["system"], r["smartnic"]) for r in rows))
    width = 0.8 / max(1, len(variants))
    x = np.arange(len(models))
    palette = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00"]  # Okabe-Ito
    for i, (system, smartnic) in enumerate(variants):
        values, missing = [], []
        for model in models:
            r = next((r for r in rows if (r["model"], r["system"], r["smartnic"]) == (model, system, smartnic)), None)
            v = r.get(key) if r and r.get("fits") else None
            values.append(v if isinstance(v, (int, float)) else 0.0)
            missing.append(not (r and r.get("fits")))
        bars = ax.bar(x + i * width, values, width, color=palette[SYSTEMS.index(system) % len(palette)],
                      alpha=1.0 if smartnic else 0.55, label=f"{system}, SmartNIC {'on' if smartnic else 'off'}")
        for bar, miss in zip(bars, missing):
            if miss:
                bar.set_hatch("//")
                bar.set_edgecolor("grey")
                ax.annotate("does not fit", (bar.get_x() + bar.get_width() / 2, 0), rotation=90, fontsize=7,
                            ha="center", va="bottom")
    ax.set_xticks(x + width * (len(variants) - 1) / 2, models)
    ax.set_ylabel(label)
    ax.set_title(f"{label} by node class")
    ax.legend(fontsize=7, ncol=2)


def _plot_tiers(fig, rows: list[dict[str, Any]]) -> None:
    """Where the tables live: TiB in HBM and in host memory per run (SmartNIC off)."""
    import numpy as np

    ax = fig.add_subplot(111)
    runs = [r for r in rows if not r["smartnic"]]
    x = np.arange(len(runs))
    hbm = np.array([r.get("hbm_tib", 0.0) if r.get("fits") else 0.0 for r in runs])
    host = np.array([r.get("host_tib", 0.0) if r.get("fits") else 0.0 for r in runs])
    ax.bar(x, hbm, color="#0072B2", label="HBM")
    ax.bar(x, host, bottom=hbm, color="#E69F00", label="host memory (DRAM / LPDDR5X)")
    for i, r in enumerate(runs):
        if not r.get("fits"):
            ax.annotate("does not fit", (i, 0), rotation=90, fontsize=7, ha="center", va="bottom")
    ax.set_xticks(x, [f"{r['model']}\n{r['system']}" for r in runs], fontsize=7)
    ax.set_ylabel("TiB of tables and optimizer state")
    ax.set_title("where the tables live")
    ax.legend(fontsize=8)
