"""Where SmartNIC offload wins and where it loses, and the resource that decides each cell.

The regime of the SmartNIC system (Guo et al., ICS 2023): embedding tables that may exceed the
cluster's HBM (host DRAM holds them behind the HBM software cache, ``sim.memory_tiers``), so
lookups of rows the HBM cache misses cross PCIe and lookups of other nodes' rows cross the
network. Each cell runs the same cluster twice, with the plain RDMA NIC (``zionex``) and with
the SmartNIC (``preset``, every mechanism on, the NIC/GPU split by cost: ``host.nic_effects``),
and reports the SmartNIC's speedup: training throughput (SmartNIC / plain) and unloaded
inference latency (plain / SmartNIC, one batch alone in the system).

Three maps, each a 2-D slice through the regime around one centre point:

``size_vs_skew``      model size relative to the cluster's HBM x the lookups' Zipf exponent;
``nic_memory``        the NIC memory's size (its local and remote caches share it) x its
                      bandwidth (the sourced points: BlueField-2 DDR4 25.6, U280 DDR4 38.4,
                      U280 HBM2 460 GB/s);
``line_rate_vs_skew`` the NICs' line rate x the Zipf exponent (the FPGA NIC gets as many
                      packetizers as the line rate needs, each framing
                      ``sim.timing.packetizer.payload_gbps`` at the preset's datapath, so
                      framing is not the question here).

Each cell is labelled with its deciding resource (``host.nic_effects``' figures):
``wins: relieves R`` when the SmartNIC shortened the baseline's bound R (PCIe, network, GPU),
``even: R`` when no offload paid and R refused the best one (the NIC's memory, its datapath or
cores, PCIe for partial pools, the network), ``loses: R`` when the run is slower and R is what
bounds it. Every figure is a prediction of the model; no published SmartNIC figure exists to
compare (REFERENCES.md).
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, Callable

from neonic.host.experiments._common import (
    PLANNER_FIELDS,
    Checker,
    ExperimentResult,
    Timer,
    item_num,
    planner_fields,
    planner_table,
    run_scenario,
    scenario_figures,
)

TITLE = "SmartNIC win/lose map: model size vs HBM, skew, NIC memory, line rate; the deciding resource"
MODES = ("training", "inference")
MAPS = ("size_vs_skew", "nic_memory", "line_rate_vs_skew")
_KNOWN = ("preset", "nodes", "gpus_per_node", "batch_per_gpu", "tables", "dim", "table_dtype", "pooling", "sizes_x_hbm",
          "alphas", "nic_memory_gib", "nic_memory_gbytes_per_s", "line_gbps", "modes", "maps", "even_within",
          *PLANNER_FIELDS)


def check_config(data: dict[str, Any]) -> dict[str, Any]:
    c = Checker(data, "smartnic_map", _KNOWN)
    cfg = {
        "preset": c.choice("preset", ("smartnic", "smartnic-fpga", "smartnic-soc"), "smartnic-fpga"),
        "nodes": c.int("nodes", 2, 2),
        "gpus_per_node": c.int("gpus_per_node", 2, 1),
        "batch_per_gpu": c.int("batch_per_gpu", 2048, 1),
        "tables": c.int("tables", 8, 1),
        "dim": c.int("dim", 64, 1),
        "table_dtype": c.choice("table_dtype", ("fp32", "fp16"), "fp32"),
        "pooling": c.num("pooling", 20.0, 0),
        "sizes_x_hbm": c.list("sizes_x_hbm", item_num(0.0), [0.5, 2.0, 8.0]),
        "alphas": c.list("alphas", item_num(0.0), [0.6, 0.9, 1.2]),
        "nic_memory_gib": c.list("nic_memory_gib", item_num(0.0), [1.0, 4.0, 16.0]),
        "nic_memory_gbytes_per_s": c.list("nic_memory_gbytes_per_s", item_num(0.0), [25.6, 38.4, 460.0]),
        "line_gbps": c.list("line_gbps", item_num(0.0), [100.0, 200.0, 400.0]),
        "modes": c.list("modes", _mode, list(MODES)),
        "maps": c.list("maps", _map, list(MAPS)),
        "even_within": c.num("even_within", 0.01, 0),
        **planner_fields(c, data),
    }
    return cfg


def _mode(where: str, value: Any) -> str:
    if value not in MODES:
        raise ValueError(f"{where}: expected one of {', '.join(MODES)}, got {value!r}")
    return value


def _map(where: str, value: Any) -> str:
    if value not in MAPS:
        raise ValueError(f"{where}: expected one of {', '.join(MAPS)}, got {value!r}")
    return value


def _centre(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def workload(config: dict[str, Any], size_x_hbm: float) -> dict[str, Any]:
    """``tables`` equal tables whose rows and row-wise optimizer state need ``size_x_hbm`` x the
    HBM the cluster's GPUs give tables (``sim.gpu.hbm_capacity_bytes``)."""
    from neonic.host.systems import preset
    from neonic.sim.gpu import hbm_capacity_bytes

    gpus = config["nodes"] * config["gpus_per_node"]
    hbm = float(hbm_capacity_bytes(preset("zionex").gpu_spec)) * gpus
    eb = 4 if config["table_dtype"] == "fp32" else 2
    row = config["dim"] * eb + 4          # the row and its row-wise AdaGrad state (one FP32)
    rows = max(1000, int(size_x_hbm * hbm / (config["tables"] * row)))
    return {"name": f"map-x{size_x_hbm:g}", "batch_per_gpu": config["batch_per_gpu"],
            "tables": [{"name": f"t{i}", "rows": rows, "dim": config["dim"], "dtype": config["table_dtype"],
                        "pooling": config["pooling"]} for i in range(config["tables"])],
            "dense": {"bottom_mlp": [256, 512, config["dim"]], "interaction": "dot", "top_mlp": [512, 256, 1]},
            "optimizer": {"kind": "rowwise_adagrad"}}


def _scenario(config: dict[str, Any], wl: dict[str, Any], system: Any, alpha: float, mode: str) -> dict[str, Any]:
    alone = mode == "inference"   # inference: one batch alone in the system (unloaded latency)
    return {"scenario": {"name": f"smartnic-map-{mode}", "mode": mode, "pipelined": True, "seed": 1,
                         "iterations": 1, "warmup": 0 if alone else 1},
            "cluster": {"nodes": config["nodes"], "gpus_per_node": config["gpus_per_node"]},
            "workload": wl, "system": system, "planner": planner_table(config), "lookups": {"alpha": alpha}}


A2A_PHASES = ("input_a2a", "pooled_a2a", "grad_a2a")


def _figure(result: Any, mode: str) -> tuple[float, float]:
    """The cell's figure (samples/s or unloaded latency, ms) and its AlltoAlls' serialized ms."""
    fig = scenario_figures(result)
    a2a = sum(fig.get(f"serialized_{p}_ms", 0.0) for p in A2A_PHASES)
    return (fig["samples_per_s"] if mode == "training" else fig["latency_mean_ms"]), a2a


def reason(speedup: float, figures: dict[str, Any], even_within: float, framing_slower: bool = False) -> str:
    """The cell's label: who wins and the resource that decides it (see the module doc).
    ``framing_slower``: the SmartNIC's AlltoAlls took longer than the plain NIC's without
    carrying more inter-node bytes, so its packetizers (one message per destination each)
    fell short of the line rate."""
    if speedup > 1 + even_within:
        return f"wins: relieves {figures.get('bottleneck_before', '?')}"
    if speedup < 1 - even_within:
        return "loses: NIC packetizers" if framing_slower else f"loses: {figures.get('bottleneck_after', '?')}"
    refused = figures.get("local_cache_refused_by") or figures.get("remote_cache_refused_by")
    return f"even: {refused or figures.get('bottleneck_before', '?')}"


def _packetizer_gbps(preset_name: str) -> float:
    """Payload Gb/s one RTL packetizer of the preset's datapath frames (its width, clock and
    the NIC's path MTU: ``sim.timing.packetizer.payload_gbps``, 126 Gb/s at 64 B x 250 MHz)."""
    from neonic.host.nic_effects import nic_config
    from neonic.host.systems import preset
    from neonic.sim.timing.packetizer import payload_gbps

    cfg = nic_config(preset(preset_name).nic)
    return payload_gbps(cfg.datapath_bytes, cfg.pmtu, cfg.clock_hz)


def run(config: dict[str, Any], progress: Callable[[str], None]) -> ExperimentResult:
    from neonic.host.cluster import ClusterRun

    timer = Timer()
    sizes, alphas = config["sizes_x_hbm"], config["alphas"]
    mems, bws, lines = config["nic_memory_gib"], config["nic_memory_gbytes_per_s"], config["line_gbps"]
    c_size, c_alpha, c_line = _centre(sizes), _centre(alphas), 200.0 if 200.0 in lines else _centre(lines)
    per_packetizer = _packetizer_gbps(config["preset"])
    base_cache: dict[tuple, float] = {}
    rows: list[dict[str, Any]] = []

    def cell(map_name: str, mode: str, size: float, alpha: float, line: float, mem_gib: float | None,
             bw: float | None, x: float, y: float) -> None:
        wl = workload(config, size)
        run_cls = partial(ClusterRun, line_gbps=line)
        key = (size, alpha, line, mode)
        if key not in base_cache:
            progress(f"smartnic_map: rdma, {mode}, x{size:g} HBM, alpha {alpha:g}, {line:g} Gb/s")
            base_cache[key] = _figure(run_scenario(_scenario(config, wl, {"preset": "zionex"}, alpha, mode), run_cls), mode)
        nic: dict[str, Any] = {"packetizers": max(2, min(16, math.ceil(line / per_packetizer)))}
        if mem_gib is not None:
            nic["local_cache_mib"] = nic["remote_cache_mib"] = mem_gib * 1024 / 2
        if bw is not None:
            nic["memory_gbytes_per_s"] = bw
        progress(f"smartnic_map: {map_name}, {mode}, x{size:g} HBM, alpha {alpha:g}, {line:g} Gb/s, "
                 f"NIC {mem_gib} GiB at {bw} GB/s")
        holder: dict[str, Any] = {}

        def make(scenario):
            holder["run"] = ClusterRun(scenario, line_gbps=line)
            return holder["run"]

        res = run_scenario(_scenario(config, wl, {"preset": config["preset"], "nic": nic}, alpha, mode), make)
        value, a2a = _figure(res, mode)
        base, base_a2a = base_cache[key]
        speedup = value / base if mode == "training" else base / value
        cr = holder["run"]
        figs = cr.nic_effects.figures
        more_bytes = any(cr.nic_effects.matrices[k].sum() > cr.work.matrices[k].sum() * (1 + 1e-9)
                         for k in ("input", "pooled", "grad"))
        framing_slower = a2a > base_a2a * (1 + config["even_within"]) and not more_bytes
        hits = res.metrics.get("cache_hit_rates", {})
        tiers = res.metrics.get("memory_tiers", {})
        rows.append({"map": map_name, "mode": mode, "x": x, "y": y, "size_x_hbm": size, "alpha": alpha,
                     "line_gbps": line, "nic_memory_gib": mem_gib, "nic_memory_gbytes_per_s": bw,
                     "speedup": speedup, "reason": reason(speedup, figs, config["even_within"], framing_slower),
                     "a2a_ms": a2a, "a2a_ms_rdma": base_a2a,
                     "rdma": base, "smartnic": value, "unit": "samples/s" if mode == "training" else "ms",
                     "hbm_cache_hit_rate": (tiers.get("cache") or {}).get("hit_rate"),
                     "hit_rate_nic_local": hits.get("nic_local"), "hit_rate_nic_remote": hits.get("nic_remote"),
                     "local_shards_on_nic": figs.get("local_cache_shards_on_nic"),
                     "remote_tables_on_nic": figs.get("remote_cache_tables_on_nic"),
                     "bottleneck_before": figs.get("bottleneck_before"), "bottleneck_after": figs.get("bottleneck_after")})

    for mode in config["modes"]:
        if "size_vs_skew" in config["maps"]:
            for s in sizes:
                for a in alphas:
                    cell("size_vs_skew", mode, s, a, c_line, None, None, s, a)
        if "nic_memory" in config["maps"]:
            for g in mems:
                for b in bws:
                    cell("nic_memory", mode, c_size, c_alpha, c_line, g, b, g, b)
        if "line_rate_vs_skew" in config["maps"]:
            for ln in lines:
                for a in alphas:
                    cell("line_rate_vs_skew", mode, c_size, a, ln, None, None, ln, a)
    metrics: dict[str, Any] = {}
    for r in rows:
        key = f"{r['map']}/{r['mode']}"
        m = metrics.setdefault(key, {"cells": 0, "wins": 0, "loses": 0, "best_speedup": 0.0, "worst_speedup": math.inf})
        m["cells"] += 1
        m["wins"] += r["reason"].startswith("wins")
        m["loses"] += r["reason"].startswith("loses")
        m["best_speedup"] = max(m["best_speedup"], r["speedup"])
        m["worst_speedup"] = min(m["worst_speedup"], r["speedup"])
    notes = [
        "Every figure is a prediction of the model; REFERENCES.md publishes no SmartNIC figure to compare.",
        f"SmartNIC: the {config['preset']} preset with every mechanism on; the plain NIC: zionex. Same cluster "
        f"({config['nodes']} nodes x {config['gpus_per_node']} GPUs), line rate and memory placement (host DRAM "
        "behind the HBM cache when the tables exceed HBM).",
        "speedup: training throughput SmartNIC / plain; inference unloaded latency plain / SmartNIC (one batch alone).",
        "reason: 'wins: relieves R' (the SmartNIC shortened the baseline's bound R), 'even: R' (no offload paid; R "
        "refused the best one), 'loses: R' (R bounds the slower run). host.nic_effects prices each offload with the "
        "simulator's own cost functions and keeps only those that shorten the slowest rank.",
        f"Centre point of the slices: x{c_size:g} HBM, Zipf {c_alpha:g}, {c_line:g} Gb/s; nic_memory: the local and "
        "remote caches share the NIC memory half and half.",
        "nic_memory: an FPGA preset's gather runs on its RTL datapath (64 B x 250 MHz = 16 GB/s), so NIC memory "
        "faster than that cannot show; preset = 'smartnic-soc' (Arm cores, a memory-bound roofline) shows the "
        "memory-bound cells.",
        f"line_rate_vs_skew: the FPGA NIC gets ceil(line / {per_packetizer:.0f} Gb/s) packetizers (at least the "
        "preset's two; one packetizer's payload rate at the preset's datapath width and clock); a "
        "message (one per destination) is framed by one packetizer, so with few destinations per rank the framing "
        "can still fall short of the line: such cells read 'loses: NIC packetizers'.",
    ]
    res = ExperimentResult("smartnic_map", TITLE, config, rows, metrics, notes, wall_s=timer.elapsed)
    res.plots = {f"{m}_{mode}.png": partial(_plot, rows=[r for r in rows if r["map"] == m and r["mode"] == mode],
                                             title=f"{m}, {mode}")
                 for m in config["maps"] for mode in config["modes"]}
    return res


_AXES = {"size_vs_skew": ("model size / cluster HBM", "Zipf exponent"),
         "nic_memory": ("NIC memory (GiB)", "NIC memory bandwidth (GB/s)"),
         "line_rate_vs_skew": ("line rate (Gb/s)", "Zipf exponent")}


def _plot(fig, rows: list[dict[str, Any]], title: str) -> None:
    """A heatmap of the speedup (green wins, red loses), each cell labelled with its figure and
    its deciding resource."""
    import numpy as np

    if not rows:
        return
    xs = sorted({r["x"] for r in rows})
    ys = sorted({r["y"] for r in rows})
    grid = np.full((len(ys), len(xs)), np.nan)
    ax = fig.add_subplot(1, 1, 1)
    for r in rows:
        grid[ys.index(r["y"]), xs.index(r["x"])] = r["speedup"]
    span = max(0.05, float(np.nanmax(np.abs(np.log2(grid)))))
    im = ax.imshow(np.log2(grid), cmap="RdYlGn", vmin=-span, vmax=span, origin="lower", aspect="auto")
    for r in rows:
        ax.text(xs.index(r["x"]), ys.index(r["y"]), f"{r['speedup']:.2f}x\n{r['reason']}", ha="center", va="center",
                fontsize=6)
    ax.set_xticks(range(len(xs)), [f"{x:g}" for x in xs])
    ax.set_yticks(range(len(ys)), [f"{y:g}" for y in ys])
    xl, yl = _AXES[rows[0]["map"]]
    ax.set_xlabel(xl)
    ax.set_ylabel(yl)
    ax.set_title(f"SmartNIC speedup ({title})", fontsize=9)
    fig.colorbar(im, ax=ax, label="log2 speedup")
