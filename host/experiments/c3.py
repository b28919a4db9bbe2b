"""Concurrent computation and communication (C3): how much of the ideal overlap is realized.

Pairs of a compute stream and a collective, run on every GPU of a small cluster:

* DLRM pairs from the model presets (``models``), as Neo's pipeline overlaps them: the bottom
  MLP's forward GEMMs with the pooled-embedding AlltoAll (each rank sends
  ``batch_per_gpu x tables x dim_avg`` values in the system's ``comm_dtype``; table-wise
  sharding), and the top MLP's backward GEMMs (weight and data gradients) with one gradient
  AllReduce bucket (PyTorch DDP's ``bucket_cap_mb`` = 25, or the whole dense gradient if
  smaller);
* transformer-like shapes (``shapes``): large GEMMs with an AllReduce, AllGather or AlltoAll.

For each pair and lever setting: ``C`` is the compute stream alone, ``M`` the collective alone
(under the lever's own settings: the copy engines change ``M`` too), ``serial = C + M``,
``concurrent`` the time until both end when started together. C3's definitions (arXiv
2412.14335): ideal speedup ``(C + M) / max(C, M)``, realized ``serial / concurrent``, fraction
of ideal ``(realized - 1) / (ideal - 1)``. ``speedup_vs_plain_serial`` divides the plain
lever's serial time by the lever's concurrent time (what moving to the DMA engines buys
against the usual serial execution). Both launch orders are run (``launch_orders``): the
compute stream's kernel launched before the collective's, or after it, at the same instant;
at equal stream priority the block scheduler serves the earlier launch first.

The GPU model is ``sim.interference`` (SMs by block scheduling, priority, partitioning only
while both run, HBM by rate, copy engines; the network flows limited by what the GPUs feed).
Every figure is a prediction; REFERENCES.md gives C3's definitions, not figures to match.
The timeline (``timeline.json``, Perfetto) shows GPU 0 of the first pair under every lever:
the kernels, the collective, and the SM and HBM shares of each side as counters.

Keys for ``neonic validate --json``: :func:`validate_keys` (``c3.plain``,
``c3.priority_partitioning``, ``c3.dma``: mean fraction of ideal; ``c3.dma_max_speedup``: the
largest ``speedup_vs_plain_serial`` under the DMA lever).
"""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path
from typing import Any, Callable

from neonic.host.experiments._common import Checker, ExperimentResult, Timer, item_choice, item_num

TITLE = "Concurrent compute and communication (C3): realized vs ideal overlap"
COLLECTIVES = ("alltoall", "all_gather", "allreduce")
ORDERS = ("compute_first", "comm_first")
MODELS = ("model-a", "model-f", "model-i")
_KNOWN = ("system", "nodes", "models", "bucket_mib", "allreduce", "dtype", "shapes", "levers", "launch_orders",
          "timeline_pair")
_LEVER_FIELDS = ("comm_priority", "sm_partition_comm", "collectives_on_dma", "comm_sm_fraction", "comm_hbm_fraction",
                 "interference")
#: The levers whose mean fraction of ideal `neonic validate --json` reports.
KEY_LEVERS = ("plain", "priority_partitioning", "dma")


def check_config(data: dict[str, Any]) -> dict[str, Any]:
    from neonic.host.systems import resolve_system

    c = Checker(data, "c3", _KNOWN)
    system = c.choice("system", ("zionex", "zion", "smartnic"), "zionex")
    shapes = []
    for i, g in enumerate(c.list("shapes", lambda where, v: v, default=[], nonempty=False)):
        gc = Checker(g, f"c3.shapes[{i}]", ("m", "n", "k", "repeat", "collective", "size_mib"))
        shapes.append({"m": gc.int("m", None, 1), "n": gc.int("n", None, 1), "k": gc.int("k", None, 1),
                       "repeat": gc.int("repeat", 1, 1), "collective": gc.choice("collective", COLLECTIVES),
                       "size_mib": gc.num("size_mib", None, 0)})
    models = c.list("models", item_choice(MODELS), default=[], nonempty=False)
    if not shapes and not models:
        raise ValueError("c3: expected at least one pair: models or shapes")
    levers = c.table("levers")
    if not levers:
        raise ValueError("c3.levers: expected at least one lever setting")
    checked = {}
    for name, setting in levers.items():
        Checker(setting, f"c3.levers.{name}", _LEVER_FIELDS)
        try:  # the system's own validation of stream settings, so the errors name the field
            resolve_system({"preset": system, "streams": dict(setting)}, f"c3.levers.{name}")
        except ValueError as error:
            raise ValueError(str(error).replace(f"c3.levers.{name}.streams.", f"c3.levers.{name}.")) from None
        checked[name] = dict(setting)
    return {
        "system": system,
        "nodes": c.int("nodes", 2, 1),
        "models": models,
        "bucket_mib": c.num("bucket_mib", 25.0, 0),
        "allreduce": c.choice("allreduce", ("ring", "double_binary_tree", "hierarchical"), "hierarchical"),
        "dtype": c.choice("dtype", ("fp16", "bf16", "tf32", "fp32"), "fp16"),
        "shapes": shapes,
        "levers": checked,
        "launch_orders": c.list("launch_orders", item_choice(ORDERS), default=list(ORDERS)),
        "timeline_pair": c.int("timeline_pair", 0, 0),
    }


# ----------------------------------------------------------------------------------- pairs
def _model_pairs(model: str, world: int, comm_bytes: int, bucket_bytes: float) -> list[dict[str, Any]]:
    """The two overlaps of Neo's pipeline for one model preset (see the module doc)."""
    from neonic.host.workloads import preset_text

    data = tomllib.loads(preset_text(model))
    batch = int(data["batch_per_gpu"])
    synth = data["synthesize"]
    tables = int(synth["count"])
    dim = float(synth.get("dim_avg", synth.get("dim", 64)))
    dense = data["dense"]
    bottom = [int(w) for w in dense["bottom_mlp"]]
    top = [int(w) for w in dense["top_mlp"]]
    fwd = [(batch, o, i) for i, o in zip(bottom[:-1], bottom[1:])]
    bwd = []
    for layer, (i, o) in reversed(list(enumerate(zip(top[:-1], top[1:])))):
        bwd.append((i, o, batch))  # weight gradient
        if layer > 0:
            bwd.append((batch, i, o))  # data gradient
    per_rank = int(batch * tables * dim * comm_bytes)
    params = sum(i * o + o for w in (bottom, top) for i, o in zip(w[:-1], w[1:]))
    bucket = int(min(bucket_bytes, params * comm_bytes))
    return [
        {"pair": f"{model}: bottom MLP fwd + pooled AlltoAll", "short": f"{model} fwd+A2A", "gemms": fwd,
         "collective": "alltoall", "nbytes": per_rank},
        {"pair": f"{model}: top MLP bwd + AllReduce bucket", "short": f"{model} bwd+AR", "gemms": bwd,
         "collective": "allreduce", "nbytes": bucket},
    ]


def _pairs(config: dict[str, Any], world: int, comm_bytes: int) -> list[dict[str, Any]]:
    pairs = []
    for model in config["models"]:
        pairs.extend(_model_pairs(model, world, comm_bytes, config["bucket_mib"] * 2**20))
    for s in config["shapes"]:
        label = f"{s['m']}x{s['n']}x{s['k']}" + (f" x{s['repeat']}" if s["repeat"] > 1 else "")
        pairs.append({"pair": f"GEMM {label} + {s['collective']} {s['size_mib']:g} MiB",
                      "short": f"{label}+{s['collective']} {s['size_mib']:g}M",
                      "gemms": [(s["m"], s["n"], s["k"])] * s["repeat"], "collective": s["collective"],
                      "nbytes": int(s["size_mib"] * 2**20)})
    return pairs


# ----------------------------------------------------------------------------------- runs
def _measure(system, topo, pair: dict[str, Any], config: dict[str, Any], *, compute: bool, comm: bool,
             order: str = "compute_first", record: bool = False) -> dict[str, Any]:
    """One run on every GPU; returns the compute and communication end times (s) and, with
    ``record``, GPU 0's kernel spans and counters."""
    from neonic.sim.engine import Engine, s_from_ps
    from neonic.sim.gpu import gemm_cost
    from neonic.sim.interference import REDUCE_FRACTION, GPUDevice, collective_links, couple, gemm_ctas
    from neonic.sim.network import collectives as coll
    from neonic.sim.network.network import Network

    st = system.streams
    spec = system.gpu_spec
    engine = Engine()
    world = topo.num_gpus
    net = Network(engine, topo)
    gpus = [GPUDevice(engine, spec, name=f"gpu{r}", comm_priority=1 if st.comm_priority == "high" else 0,
                      sm_partition_comm=st.sm_partition_comm, collectives_on_dma=st.collectives_on_dma,
                      interference=st.interference, record=record and r == 0) for r in range(world)]
    couple(net, gpus)
    out: dict[str, Any] = {"compute_end": 0.0, "comm_end": 0.0, "spans": []}
    kernels = [(gemm_cost(spec, m, n, k, config["dtype"]), gemm_ctas(spec, m, n)) for m, n, k in pair["gemms"]]

    def start_compute() -> None:
        for r, g in enumerate(gpus):
            _chain(engine, g, kernels, 0, r, out)

    def start_comm() -> None:
        ranks = list(range(world))
        links = collective_links(topo, ranks)
        kind = pair["collective"]
        handles = [g.comm_begin(float(links[r]), REDUCE_FRACTION[kind]) for r, g in enumerate(gpus)]
        t0 = engine.now

        def done(_h) -> None:
            for g, h in zip(gpus, handles):
                g.comm_end(h)
            out["comm_end"] = s_from_ps(engine.now)
            out["spans"].append(("comm", kind, t0, engine.now))

        n = pair["nbytes"]
        if kind == "alltoall":
            coll.alltoall(net, ranks, max(1, n // world), on_done=done)
        elif kind == "all_gather":
            coll.all_gather(net, ranks, n, on_done=done)
        else:
            coll.allreduce(net, ranks, n, algorithm=config["allreduce"], on_done=done)

    parts = [(start_compute, compute), (start_comm, comm)]
    if order == "comm_first":
        parts.reverse()
    for start, on in parts:  # both at t = 0; the launch order sets the block scheduler's order
        if on:
            start()
    engine.run()
    out["counters"] = gpus[0].counters
    return out


def _chain(engine, gpu, kernels, i: int, rank: int, out: dict[str, Any]) -> None:
    """Launch kernel ``i`` of the compute stream; the next one when it ends (stream order)."""
    from neonic.sim.engine import s_from_ps

    if i == len(kernels):
        out["compute_end"] = max(out["compute_end"], s_from_ps(engine.now))
        return
    cost, ctas = kernels[i]

    def done(start: int, end: int) -> None:
        if rank == 0:
            out["spans"].append(("compute", f"gemm {i}", start, end))
        _chain(engine, gpu, kernels, i + 1, rank, out)

    gpu.launch(cost, done, ctas=ctas)


def run(config: dict[str, Any], progress: Callable[[str], None]) -> ExperimentResult:
    from neonic.host.systems import resolve_system
    from neonic.sim.network.topology import Topology

    timer = Timer()
    base = resolve_system(config["system"])
    topo = Topology.from_preset(base.network, nodes=config["nodes"])
    comm_bytes = 2 if base.comm_dtype == "fp16" else 4
    pairs = _pairs(config, topo.num_gpus, comm_bytes)
    systems = {lever: resolve_system({"preset": config["system"], "streams": setting})
               for lever, setting in config["levers"].items()}
    rows: list[dict[str, Any]] = []
    timeline: dict[str, Any] = {}
    for index, pair in enumerate(pairs):
        progress(f"c3: {pair['pair']}")
        c_alone = _measure(base, topo, pair, config, compute=True, comm=False)["compute_end"]
        serial_plain = None
        for lever, system in systems.items():
            m_alone = _measure(system, topo, pair, config, compute=False, comm=True)["comm_end"]
            serial = c_alone + m_alone
            if serial_plain is None or lever == "plain":
                serial_plain = serial
            for order in config["launch_orders"]:
                record = index == config["timeline_pair"] and order == config["launch_orders"][0]
                both = _measure(system, topo, pair, config, compute=True, comm=True, order=order, record=record)
                if record:
                    timeline[lever] = both
                concurrent = max(both["compute_end"], both["comm_end"])
                ideal = serial / max(c_alone, m_alone)
                realized = serial / concurrent
                fraction = (realized - 1) / (ideal - 1) if ideal > 1 + 1e-9 else float("nan")
                rows.append({"pair": pair["pair"], "short": pair["short"], "collective": pair["collective"], "size_mib": pair["nbytes"] / 2**20,
                             "gemms": len(pair["gemms"]), "lever": lever, "order": order,
                             "compute_ms": c_alone * 1e3, "comm_ms": m_alone * 1e3, "serial_ms": serial * 1e3,
                             "concurrent_ms": concurrent * 1e3, "compute_overlapped_ms": both["compute_end"] * 1e3,
                             "comm_overlapped_ms": both["comm_end"] * 1e3, "first_to_finish":
                             "compute" if both["compute_end"] <= both["comm_end"] else "comm",
                             "ideal_speedup": ideal, "realized_speedup": realized, "fraction_of_ideal": fraction})
        plain_serial = next((r["serial_ms"] for r in rows if r["pair"] == pair["pair"] and r["lever"] == "plain"), None)
        for r in rows:
            if r["pair"] == pair["pair"]:
                r["speedup_vs_plain_serial"] = (plain_serial / r["concurrent_ms"]) if plain_serial else float("nan")
    metrics: dict[str, Any] = {}
    for lever in config["levers"]:
        mine = [r for r in rows if r["lever"] == lever]
        frac = [r["fraction_of_ideal"] for r in mine if r["fraction_of_ideal"] == r["fraction_of_ideal"]]
        metrics[lever] = {
            "mean_fraction_of_ideal": sum(frac) / len(frac) if frac else None,
            "min_fraction_of_ideal": min(frac) if frac else None,
            "max_fraction_of_ideal": max(frac) if frac else None,
            "mean_realized_speedup": sum(r["realized_speedup"] for r in mine) / max(1, len(mine)),
            "max_speedup_vs_plain_serial": max((r["speedup_vs_plain_serial"] for r in mine), default=None),
            "points": len(mine),
        }
    notes = [
        "Every figure is a prediction from the mechanisms of sim.interference; REFERENCES.md gives C3's definitions "
        "(ideal speedup, fraction of ideal), not figures.",
        "Isolated times: C on a GPU alone; M under each lever's own settings (copy engines and channel counts change M).",
        "Both launch orders count in each lever's mean; at equal priority the block scheduler serves the earlier launch "
        "first, so a collective launched behind a GEMM waits for its last wave.",
        f"Partitioning applies only while both sides run; interference (HBM loss while kernels co-run) is the system "
        f"preset's {base.streams.interference:g} unless a lever sets it.",
        "streams.comm_sm_fraction and comm_hbm_fraction are no longer read: a collective's SMs are its channels "
        "(from the links it drives) and its HBM follows its bytes.",
        "ASSUMPTIONs of sim.interference that these figures rest on: 12.5 GB/s per NCCL channel (2 CTAs per 25 GB/s "
        "NVLink, NVIDIA/nccl#1703), at most 32 channels; copy engines at the GPU's NVLink bandwidth each "
        "(GPUSpec.copy_engines of them); cuBLAS-like GEMM tiles; SM hand-overs in 4 steps as CTAs retire.",
        "DMA lever: copy engines cannot reduce, so an offloaded AllReduce keeps an SM kernel for its reductions "
        "(channels for its reduced receive rate), scheduled with the collective's priority.",
    ]
    res = ExperimentResult("c3", TITLE, config, rows, metrics, notes, wall_s=timer.elapsed)
    res.plots = {"fraction_of_ideal.png": lambda f: _plot(f, rows, config)}
    if timeline:
        res.files = {"timeline.json": lambda path: _write_timeline(path, timeline, pairs[config["timeline_pair"]])}
    return res


def validate_keys(result: ExperimentResult) -> dict[str, float | None]:
    """The figures `neonic validate --json` reports for C3 (None where a lever was not run)."""
    m = result.metrics
    out: dict[str, float | None] = {f"c3.{lever}": (m.get(lever) or {}).get("mean_fraction_of_ideal") for lever in KEY_LEVERS}
    out["c3.dma_max_speedup"] = (m.get("dma") or {}).get("max_speedup_vs_plain_serial")
    return out


# ------------------------------------------------------------------------ plots, timeline
def _plot(fig, rows, config) -> None:
    levers = list(config["levers"])
    pairs = list(dict.fromkeys(r["pair"] for r in rows))
    ax = fig.add_subplot(1, 2, 1)
    for i, lever in enumerate(levers):
        vals = [r["fraction_of_ideal"] for r in rows if r["lever"] == lever and r["fraction_of_ideal"] == r["fraction_of_ideal"]]
        if not vals:
            continue
        mean = sum(vals) / len(vals)
        ax.bar(i, mean, color=f"C{i}")
        ax.plot([i, i], [min(vals), max(vals)], color="black", lw=1.5)
        ax.scatter([i] * len(vals), vals, s=6, color="black", alpha=0.4, zorder=3)
    ax.set_xticks(range(len(levers)))
    ax.set_xticklabels(levers, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("fraction of ideal speedup (mean, range)")
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_title("per lever", fontsize=9)
    ax2 = fig.add_subplot(1, 2, 2)
    width = 0.8 / max(1, len(levers))
    for i, lever in enumerate(levers):
        ys = []
        for p in pairs:
            vals = [r["fraction_of_ideal"] for r in rows if r["lever"] == lever and r["pair"] == p
                    and r["fraction_of_ideal"] == r["fraction_of_ideal"]]
            ys.append(sum(vals) / len(vals) if vals else math.nan)
        ax2.bar([j + i * width for j in range(len(pairs))], ys, width, label=lever, color=f"C{i}")
    ax2.set_xticks([j + 0.4 - width / 2 for j in range(len(pairs))])
    short = {r["pair"]: r["short"] for r in rows}
    ax2.set_xticklabels([short[p] for p in pairs], rotation=45, ha="right", fontsize=5)
    ax2.set_title("per pair (mean over launch orders)", fontsize=9)
    ax2.axhline(0, color="grey", lw=0.5)
    ax2.legend(fontsize=6)


def _write_timeline(path: Path, timeline: dict[str, Any], pair: dict[str, Any]) -> None:
    """Chrome trace events: one process per lever (GPU 0), kernel slices, SM/HBM counters."""
    events: list[dict[str, Any]] = []
    for pid, (lever, run) in enumerate(timeline.items(), start=1):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"{lever}: gpu0 ({pair['pair']})"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}})
        for tid, side in ((1, "compute"), (2, "comm")):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": side}})
        for side, name, start, end in run["spans"]:
            events.append({"ph": "X", "name": name, "pid": pid, "tid": 1 if side == "compute" else 2,
                           "ts": start / 1e6, "dur": (end - start) / 1e6, "cat": side})
        for t, sm_c, hbm_c, sm_m, hbm_m in run["counters"]:
            events.append({"ph": "C", "name": "SM share", "pid": pid, "ts": t / 1e6, "args": {"compute": sm_c, "comm": sm_m}})
            events.append({"ph": "C", "name": "HBM share", "pid": pid, "ts": t / 1e6,
                           "args": {"compute": hbm_c, "comm": hbm_m}})
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ns"}), encoding="utf-8")
