"""Weak scaling of Neo's models from 1 to 16 nodes: constant per-GPU work, throughput, scaling
efficiency and where the exposed communication time goes.

Weak scaling as Neo measured it keeps the per-GPU batch constant and trains the *same model* at
every node count: the global batch grows with the GPUs, so every GPU looks up the same number
of rows per iteration (``batch_per_gpu x tables x pooling``, spread by the plan) and only the
communication pattern changes. Where the model does not fit the smaller clusters' memory, the
hosts' DRAM holds what HBM cannot (behind the HBM software cache, ``sim.memory_tiers``); where
it does not fit even HBM + DRAM of the smallest cluster, the experiment shrinks every table's
rows by one factor (never the number of tables, so lookups per GPU are unchanged) for every
node count, and says so in its notes. Scaling efficiency is the per-GPU throughput relative to
the smallest cluster of the sweep. Every figure is a prediction of the model (none of them is
published in shared/REFERENCES.md).
"""

from __future__ import annotations

from typing import Any, Callable

from neonic.host.experiments._common import (
    PLANNER_FIELDS,
    COMM_PHASES,
    Checker,
    ExperimentResult,
    Timer,
    item_choice,
    item_int,
    planner_fields,
    planner_table,
    scaled_workload,
    scenario_data,
    scenario_figures,
)

TITLE = "Weak scaling, 1 to 16 ZionEX nodes (same model, fixed per-GPU batch)"
MODELS = ("model-a", "model-f", "model-i")
_KNOWN = ("models", "nodes", "table_fraction", "params_fraction", "system", "iterations", "warmup", "fit_margin",
          *PLANNER_FIELDS)


def check_config(data: dict[str, Any]) -> dict[str, Any]:
    c = Checker(data, "weak_scaling", _KNOWN)
    pf = c.table("params_fraction", {})
    for key, value in pf.items():
        if key not in MODELS:
            raise ValueError(f"weak_scaling.params_fraction.{key}: unknown model; expected one of {', '.join(MODELS)}")
        Checker(pf, "weak_scaling.params_fraction", MODELS).num(key, lo=0, hi=1.0)
    return {
        "models": c.list("models", item_choice(MODELS)),
        "nodes": sorted(set(c.list("nodes", item_int(1)))),
        "table_fraction": c.num("table_fraction", 1.0, 0, 1.0),
        "params_fraction": {k: float(v) for k, v in pf.items()},
        "fit_margin": c.num("fit_margin", 0.9, 0, 1.0),
        "system": c.choice("system", ("zionex", "zion"), "zionex"),
        "iterations": c.int("iterations", 1, 1),
        "warmup": c.int("warmup", 1, 0),
        **planner_fields(c, data),
    }


def fit_rows_fraction(workload: dict[str, Any], system: str, nodes: int, margin: float) -> float:
    """The factor (<= 1) by which every table's rows must shrink for ``workload`` to fit
    ``nodes`` nodes' HBM plus host memory, the HBM caches of host-tier rows counted
    (``host.memory_tiers_plan``); 1.0 when it fits. ``margin`` leaves room for shards
    that do not divide evenly."""
    from neonic.host.cluster import _memory_tiers
    from neonic.host.systems import resolve_system
    from neonic.host.workloads import resolve_workload
    from neonic.sim.gpu import hbm_capacity_bytes
    from neonic.sim.network.config import load_preset
    from neonic.sim.network.topology import Topology

    sys_ = resolve_system(system, "system")
    wl = resolve_workload(workload, "workload")
    topo = Topology(load_preset(sys_.network).with_nodes(nodes))
    mem = _memory_tiers(sys_, topo)
    gpus = nodes * topo.gpus_per_node
    hbm = float(hbm_capacity_bytes(sys_.gpu_spec)) * gpus
    host = (mem.dram_gib_per_node + mem.ssd_gib_per_node) * 2**30 * nodes
    total = float(sum(wl.table_memory_bytes(t) for t in wl.tables))
    weights = float(sum(t.rows * t.dim * t.elem_bytes for t in wl.tables))
    rho = mem.cache_load_factor * weights / total if host > 0 else 0.0
    limit = hbm + host * (1.0 - rho)
    return 1.0 if total <= margin * limit else margin * limit / total


def run(config: dict[str, Any], progress: Callable[[str], None]) -> ExperimentResult:
    from neonic.host.cluster import ClusterRun, scenario_from_dict

    timer = Timer()
    rows: list[dict[str, Any]] = []
    notes = [
        "Every figure is a prediction of the model; REFERENCES.md publishes no weak-scaling figure.",
        "Every node count trains the same model with the model's published per-GPU batch (the global batch grows "
        f"with the GPUs); table_fraction={config['table_fraction']} of each model's tables hold all its parameters.",
        "Scaling efficiency: per-GPU throughput relative to the smallest node count of the run.",
        "Per-GPU work: lookup_bytes_per_gpu and emb_fwd_kernel_ms (each rank's fused embedding forward alone on its "
        "GPU) hold the work (lookups_per_gpu counts a column-wise shard's row pieces apart, so it grows when the plan "
        "splits a table's columns); tier_miss_ms is the forward's host-tier miss traffic alone on the host link (it overlaps the "
        "kernel); emb_fwd_ms is the simulated op, which also pays for sharing the GPU's SMs and HBM with any "
        "collective running beside it (sim.interference; the next batch's forward starts after the optimizer step, "
        "so the dense AllReduce no longer runs beside it).",
    ]
    smallest = min(config["nodes"])
    for model in config["models"]:
        pf = config["params_fraction"].get(model, 1.0)
        workload = scaled_workload(model, 1.0, config["table_fraction"], pf)
        shrink = fit_rows_fraction(workload, config["system"], smallest, config["fit_margin"])
        if shrink < 1.0:
            workload = scaled_workload(model, 1.0, config["table_fraction"], pf * shrink)
            notes.append(f"{model}: does not fit {smallest} node(s)' HBM + DRAM; every table's rows shrink to "
                         f"{shrink:.3g} of the preset's (the same tables, pooling and batch, so the same lookups per "
                         f"GPU) at every node count: {workload['synthesize']['total_params']:.3g} parameters.")
        elif pf < 1.0:
            notes.append(f"{model}: params_fraction={pf} of its parameters (rows shrunk, tables kept).")
        base = None
        for nodes in config["nodes"]:
            data = scenario_data(f"weak-{model}-{nodes}", workload, config["system"], nodes,
                                 iterations=config["iterations"], warmup=config["warmup"],
                                 planner=planner_table(config))
            progress(f"weak scaling: {model} on {nodes} node(s)")
            cr = ClusterRun(scenario_from_dict(data))
            result = cr.run()
            fig = scenario_figures(result)
            m = result.metrics
            per_gpu = fig["samples_per_s"] / fig["gpus"]
            if base is None:
                base = per_gpu
            tiers = m.get("memory_tiers", {})
            row = {"model": model, "nodes": nodes, "gpus": fig["gpus"], "tables": workload["synthesize"]["count"],
                   "params": workload["synthesize"]["total_params"], "batch_per_gpu": result.scenario.workload.batch_per_gpu,
                   "global_batch": m["global_batch"],
                   "samples_per_s": fig["samples_per_s"], "samples_per_s_per_gpu": per_gpu,
                   "scaling_efficiency": per_gpu / base, "iteration_ms": fig["iteration_ms"],
                   "emb_fwd_ms": _mean_op_ms(result, "emb_fwd"),
                   "emb_fwd_kernel_ms": _kernel_ms(cr, "fwd"), "emb_bwd_kernel_ms": _kernel_ms(cr, "bwd"),
                   "lookups_per_gpu": _lookups_per_gpu(cr), "lookup_bytes_per_gpu": _lookup_bytes_per_gpu(cr),
                   "tier_miss_ms": _tier_miss_ms(cr),
                   "emb_fwd_max_ms": _mean_op_ms(result, "emb_fwd", worst=True),
                   "emb_bwd_ms": _mean_op_ms(result, "emb_bwd"),
                   "dram_shards": tiers.get("shards", {}).get("dram", 0),
                   "tier_hit_rate": tiers.get("cache", {}).get("hit_rate"),
                   "exposed_comm_ms": fig["exposed_comm_ms"], "exposed_compute_ms": fig["exposed_compute_ms"],
                   "idle_ms": fig["idle_ms"]}
            for phase in COMM_PHASES:
                if f"exposed_{phase}_ms" in fig:
                    row[f"exposed_{phase}_ms"] = fig[f"exposed_{phase}_ms"]
            rows.append(row)
            progress(f"weak scaling: {model} on {nodes} node(s): {fig['samples_per_s']:,.0f} samples/s, "
                     f"efficiency {row['scaling_efficiency']:.3f}, embedding forward {row['emb_fwd_ms']:.3f} ms")
    metrics: dict[str, Any] = {}
    for model in config["models"]:
        mine = [r for r in rows if r["model"] == model]
        last = mine[-1]
        fwd = [r["emb_fwd_ms"] for r in mine]
        work = [r["emb_fwd_kernel_ms"] for r in mine]
        looks = [r["lookup_bytes_per_gpu"] for r in mine]
        metrics[model] = {"samples_per_s_at_max_nodes": last["samples_per_s"], "max_nodes": last["nodes"],
                          "scaling_efficiency_at_max_nodes": last["scaling_efficiency"],
                          "exposed_comm_share_at_max_nodes": last["exposed_comm_ms"] / last["iteration_ms"],
                          "emb_fwd_ms_spread": (max(fwd) - min(fwd)) / min(fwd) if min(fwd) > 0 else 0.0,
                          "emb_fwd_kernel_ms_spread": (max(work) - min(work)) / min(work) if min(work) > 0 else 0.0,
                          "lookup_bytes_per_gpu_spread": (max(looks) - min(looks)) / min(looks) if min(looks) > 0 else 0.0}
    res = ExperimentResult("weak_scaling", TITLE, config, rows, metrics, notes, wall_s=timer.elapsed)
    res.plots = {"throughput.png": lambda f: _plot_lines(f, rows, "samples_per_s", "samples/s"),
                 "efficiency.png": lambda f: _plot_lines(f, rows, "scaling_efficiency", "scaling efficiency"),
                 "emb_fwd.png": lambda f: _plot_lines(f, rows, "emb_fwd_ms", "embedding forward ms per GPU"),
                 "exposed_comm.png": lambda f: _plot_exposed(f, rows)}
    return res


def _kernel_ms(cr: Any, direction: str) -> float:
    """Per-GPU embedding work (ms): each rank's fused forward (or backward) kernel alone on the
    GPU, the cost function both evaluators use (``host.iteration.fused_embedding_costs``); the
    mean over ranks. Host-tier misses are apart (``tier_miss_ms``: they overlap the kernel). The
    simulated op (``emb_fwd_ms``) adds what sharing the GPU with collectives costs
    (``sim.interference``) and any miss transfer longer than the kernel."""
    import numpy as np

    from neonic.host.iteration import fused_embedding_costs

    sc = cr.scenario
    gpu = sc.system.gpu_spec
    link = sc.system.host_link_gbytes_per_s * 1e9
    ssd = sc.system.host.ssd_gbytes_per_s * 1e9
    times = [fused_embedding_costs(gpu, ks, link, ssd, host_in_kernel=False)[0 if direction == "fwd" else 1].time_s
             for ks in cr.work.kernels]
    return float(np.mean(times)) * 1e3


def _tier_miss_ms(cr: Any) -> float:
    """Per-GPU host-tier miss traffic of one forward (half the iteration's fetch + write-back
    bytes) alone on the node's host link (ms), the mean over ranks."""
    link = cr.scenario.system.host_link_gbytes_per_s * 1e9
    return float(cr.tier_miss_bytes.mean()) / 2 / link * 1e3


def _lookups_per_gpu(cr: Any) -> float:
    """Rows (or row pieces: a column-wise shard looks up its columns of every lookup of its
    table) looked up per GPU per iteration, the mean over ranks."""
    return float(sum(k.lookups for ks in cr.work.kernels for k in ks)) / len(cr.work.kernels)


def _lookup_bytes_per_gpu(cr: Any) -> float:
    """Bytes of rows gathered per GPU per iteration (lookups x row bytes), the mean over ranks:
    the same whichever way the plan splits a table's columns."""
    return float(sum(k.lookups * k.row_bytes for ks in cr.work.kernels for k in ks)) / len(cr.work.kernels)


def _mean_op_ms(result: Any, phase: str, worst: bool = False) -> float:
    """Per-GPU duration of ``phase`` (ms), over every rank and measured iteration: the mean,
    or the slowest rank's mean (``worst``)."""
    import numpy as np

    sc = result.scenario
    graph = result.graph
    its = range(sc.warmup, sc.warmup + sc.iterations)
    per_rank = []
    for r in range(graph.num_ranks):
        d = [op.end - op.start for op in (graph.get(phase, it, r) for it in its) if op is not None]
        if d:
            per_rank.append(np.mean(d) * 1e-9)
    if not per_rank:
        return 0.0
    return float(max(per_rank) if worst else np.mean(per_rank))


def _plot_lines(fig, rows, key: str, label: str) -> None:
    ax = fig.add_subplot(111)
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        ax.plot([r["gpus"] for r in mine], [r[key] for r in mine], marker="o", label=model)
    ax.set_xscale("log", base=2)
    gpus = sorted({r["gpus"] for r in rows})
    ax.set_xticks(gpus, [str(g) for g in gpus])  # the measured GPU counts, as integers
    ax.minorticks_off()
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float)) and r[key] > 0]
    if values and max(values) / min(values) >= 8:  # on log-log axes linear scaling is a straight line
        ax.set_yscale("log")
    ax.set_xlabel("GPUs")
    ax.set_ylabel(label)
    ax.set_title(f"weak scaling: {label}")
    ax.legend(fontsize=9)


def _plot_exposed(fig, rows) -> None:
    import numpy as np

    ax = fig.add_subplot(111)
    labels = [f"{r['model']}\n{r['nodes']}n" for r in rows]
    x = np.arange(len(rows))
    bottom = np.zeros(len(rows))
    for phase in COMM_PHASES:
        values = np.array([r.get(f"exposed_{phase}_ms", 0.0) for r in rows])
        if values.any():
            ax.bar(x, values, bottom=bottom, label=phase)
            bottom += values
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("exposed ms per iteration")
    ax.set_title("exposed communication per iteration")
    ax.legend(fontsize=7)
