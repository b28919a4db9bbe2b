"""The results folder of a cluster run (DESIGN.md) and its summary table.

``write_results(result, out_dir)`` writes:

``config.toml``      the resolved scenario (every default filled in; rerunnable with ``neonic run``)
``metrics.json``     every figure of the run (samples/s, iteration time, phases, utilization, ...)
``breakdown.csv``    per phase: serialized and exposed seconds per iteration
``trace.json``       Chrome trace events (opens in Perfetto / chrome://tracing): see
                     :func:`chrome_trace` (sorted processes, op args, dependency flows,
                     counter time series)
``breakdown.png``    serialized vs exposed time per phase
``timeline.png``     every sampled GPU's streams and NIC's units over the run, warm-up shaded
``utilization.png``  average utilization per resource class; bandwidth per network link class

``summary_table(result)`` renders the same figures as a rich table for the terminal.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["RESULT_FILES", "write_results", "summary_table", "chrome_trace"]

RESULT_FILES = ("config.toml", "metrics.json", "breakdown.csv", "trace.json", "breakdown.png", "timeline.png", "utilization.png")


def _plain(value: Any) -> Any:
    """Numpy scalars/arrays and tuples to plain TOML/JSON values; None dropped by callers."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# Colour-blind-safe palette: Okabe & Ito (2008) then the distinct ones of Paul Tol's "muted"
# scheme; beyond these, colours repeat with a hatch so no two phases look alike.
PALETTE = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7",
           "#000000", "#332288", "#882255", "#44AA99", "#999933", "#DDCC77", "#AA4499")
HATCHES = ("", "///", "...", "xxx")
_STREAM_ORDER = ("compute", "comm", "input", "cpu", "nic", "cache", "gather", "packetizer")


def _process_key(process: str) -> tuple[int, int, str]:
    """Sort order of trace processes: gpu0, nic0, gpu1, nic1, ... (numerically), then the rest
    (``network`` last)."""
    import re

    found = re.fullmatch(r"([a-z]+)(\d+)", process)
    if found and found.group(1) in ("gpu", "nic"):
        return (0, 2 * int(found.group(2)) + (found.group(1) == "nic"), process)
    return (1, 0, process)


def _thread_key(thread: str) -> tuple[int, str]:
    return (_STREAM_ORDER.index(thread) if thread in _STREAM_ORDER else len(_STREAM_ORDER), thread)


def _payload_args(payload: Any, rank: int | None) -> dict[str, Any]:
    """What an op carries, as trace args: bytes (this rank's and the collective's), FLOPs, HBM
    bytes, NIC unit cycles, PCIe bytes."""
    args: dict[str, Any] = {}
    if payload is None:
        return args
    name = type(payload).__name__
    if name == "Copy":
        args["bytes"] = float(payload.nbytes)
    elif name == "Collective":
        args["kind"] = payload.kind
        matrix = getattr(payload, "matrix", None)
        if matrix is not None:
            m = np.asarray(matrix)
            args["bytes_total"] = float(m.sum())
            if rank is not None and 0 <= rank < m.shape[0]:
                args["bytes_sent"] = float(m[rank].sum())
                args["bytes_received"] = float(m[:, rank].sum())
        elif getattr(payload, "nbytes", None) is not None:
            args["bytes"] = float(payload.nbytes)
    elif name == "NICJob":
        for unit, cycles in getattr(payload, "units", ()):
            args[f"nic_{unit}_ps"] = int(cycles)
        args["pcie_bytes"] = float(getattr(payload, "pcie_bytes", 0.0))
        gpu = getattr(payload, "gpu", None)
        if gpu is not None:
            args.update({"flops": float(gpu.flops), "hbm_bytes": float(gpu.hbm_bytes)})
    elif hasattr(payload, "flops") and hasattr(payload, "hbm_bytes"):
        args.update({"flops": float(payload.flops), "hbm_bytes": float(payload.hbm_bytes)})
    return args


def _shards_by_rank(plan: Any) -> dict[int, list[str]]:
    """``{rank: ["table:sharding rows a-b cols c-d", ...]}`` from a sharding plan."""
    out: dict[int, list[str]] = {}
    if plan is None:
        return out
    for tp in plan:
        kind = getattr(tp.sharding, "value", tp.sharding)
        for sh in tp.shards:
            out.setdefault(sh.rank, []).append(
                f"{tp.table}:{kind} rows {sh.row_start}-{sh.row_end} cols {sh.col_start}-{sh.col_end}"
                + (f" ({sh.tier})" if sh.tier != "hbm" else ""))
    return out


def _op_args(op: Any, rank: int | None, shards: dict[int, list[str]] | None = None) -> dict[str, Any]:
    args = {"op_id": op.id, "phase": op.phase, "iteration": op.iteration, "stream": op.stream,
            "ranks": len(op.ranks), "deps": [d.id for d in op.deps]}
    if rank is not None:
        args["rank"] = rank
    args.update(_payload_args(op.payload, rank))
    if shards and rank is not None and op.phase.startswith("emb_"):
        mine = shards.get(rank, [])
        args["tables"] = len({s.split(":")[0] for s in mine})
        args["shards"] = len(mine)
        args["shard_list"] = mine[:32] + ([f"... {len(mine) - 32} more"] if len(mine) > 32 else [])
    return args


def _sampled_ranks(result: Any) -> list[int]:
    import re

    ranks = {int(m.group(1)) for t in result.tracks if (m := re.match(r"gpu(\d+)/", t))}
    return sorted(ranks)


def _warmup_end_ps(result: Any) -> int:
    warm = int(result.metrics.get("warmup_iterations", 0) or 0)
    ends = [op.end for op in result.graph.ops if op.iteration < warm and op.end is not None]
    return max(ends) if ends else 0


def _step_counter(intervals: list[tuple[int, int, str]]) -> list[tuple[int, dict[str, float]]]:
    """``[(t, {series: value})]``: how many intervals of each series are open after time t."""
    changes: dict[int, dict[str, int]] = {}
    for start, end, series in intervals:
        changes.setdefault(start, {}).setdefault(series, 0)
        changes[start][series] += 1
        changes.setdefault(end, {}).setdefault(series, 0)
        changes[end][series] -= 1
    level: dict[str, float] = {}
    out = []
    for t in sorted(changes):
        for series, delta in changes[t].items():
            level[series] = level.get(series, 0) + delta
        out.append((t, dict(level)))
    return out


def chrome_trace(result: Any, plan: Any = None) -> dict[str, Any]:
    """The run's timeline as a Chrome trace event object (times in microseconds).

    Processes are the sampled GPUs and their NICs (sorted gpu0, nic0, gpu1, ... by
    ``process_sort_index``) and ``network`` (one thread per collective phase, last); threads are
    the streams (compute, comm, input) and NIC units. Every slice carries its op's args (op id,
    phase, iteration, ranks, dependencies, bytes / FLOPs / HBM bytes / NIC cycles; with the
    sharding ``plan``, the embedding ops also name the tables and shards of their rank). Flow arrows
    run from each op to the collectives that depend on it. Counters are time series: collectives
    in flight per phase and the network payload rate (each collective's bytes spread over its
    duration), busy streams per sampled GPU, busy units per NIC. The link-class byte totals are
    in ``otherData``.
    """
    events: list[dict[str, Any]] = []
    pids: dict[str, int] = {}
    tids: dict[tuple[str, str], int] = {}

    def ids(process: str, thread: str | None = None) -> tuple[int, int]:
        if process not in pids:
            pids[process] = len(pids) + 1
        if thread is None:
            return pids[process], 0
        key = (process, thread)
        if key not in tids:
            tids[key] = len([k for k in tids if k[0] == process]) + 1
        return pids[process], tids[key]

    def us(ps: int | float) -> float:
        return ps / 1e6

    graph = result.graph
    shards = _shards_by_rank(plan if plan is not None else getattr(result, "plan", None))
    sampled = _sampled_ranks(result)
    keep = set(sampled)
    slices: list[dict[str, Any]] = []
    for op in graph.ops:
        if op.start is None or op.end is None:
            continue
        dur = us(max(op.end - op.start, 0))
        label = f"{op.phase}[{op.iteration}]"
        if op.collective:
            pid, tid = ids("network", op.phase)
            slices.append({"ph": "X", "name": label, "cat": "collective", "pid": pid, "tid": tid,
                           "ts": us(op.start), "dur": dur, "args": _op_args(op, None)})
            ranks = sampled
        else:
            ranks = [op.rank] if op.rank in keep else []
        for r in ranks:
            pid, tid = ids(f"gpu{r}", op.stream)
            slices.append({"ph": "X", "name": label, "cat": op.stream, "pid": pid, "tid": tid,
                           "ts": us(op.start), "dur": dur, "args": _op_args(op, r, shards)})
    nic_busy: dict[str, list[tuple[int, int, str]]] = {}
    for track in sorted(result.tracks):
        process, _, thread = track.partition("/")
        if not process.startswith("nic"):
            continue
        pid, tid = ids(process, thread)
        for start, end, label in result.tracks[track]:
            slices.append({"ph": "X", "name": label, "cat": thread, "pid": pid, "tid": tid,
                           "ts": us(start), "dur": us(max(end - start, 0)),
                           "args": {"unit": thread, "nic": process}})
            nic_busy.setdefault(process, []).append((start, end, "busy units"))

    # flows: each sampled op a collective depends on -> the collective
    flow_id = 0
    flows: list[dict[str, Any]] = []
    for op in graph.ops:
        if not op.collective or op.start is None:
            continue
        for dep in op.deps:
            if dep.collective or dep.rank not in keep or dep.end is None:
                continue
            flow_id += 1
            src_pid, src_tid = ids(f"gpu{dep.rank}", dep.stream)
            dst_pid, dst_tid = ids("network", op.phase)
            mid = dep.start + (dep.end - dep.start) / 2
            flows.append({"ph": "s", "id": flow_id, "name": "dependency", "cat": "dependency",
                          "pid": src_pid, "tid": src_tid, "ts": us(mid)})
            flows.append({"ph": "f", "bp": "e", "id": flow_id, "name": "dependency",
                          "cat": "dependency", "pid": dst_pid, "tid": dst_tid,
                          "ts": us(op.start)})

    # counters (time series)
    counters: list[dict[str, Any]] = []
    net_pid, _ = ids("network")
    coll = [(op.start, op.end, op.phase) for op in graph.ops
            if op.collective and op.start is not None and op.end is not None and op.end > op.start]
    for t, level in _step_counter(coll):
        counters.append({"ph": "C", "name": "collectives in flight", "pid": net_pid, "ts": us(t),
                         "args": level})
    rate_changes: dict[int, float] = {}
    for op in graph.ops:
        if not op.collective or op.start is None or op.end is None or op.end <= op.start:
            continue
        nbytes = _payload_args(op.payload, None)
        total = nbytes.get("bytes_total", nbytes.get("bytes", 0.0))
        rate = total / ((op.end - op.start) * 1e-12) / 1e9  # GB/s
        rate_changes[op.start] = rate_changes.get(op.start, 0.0) + rate
        rate_changes[op.end] = rate_changes.get(op.end, 0.0) - rate
    level_rate = 0.0
    for t in sorted(rate_changes):
        level_rate += rate_changes[t]
        counters.append({"ph": "C", "name": "network payload rate (GB/s)", "pid": net_pid,
                         "ts": us(t), "args": {"GB/s": max(0.0, round(level_rate, 6))}})
    for r in sampled:
        spans = [(op.start, op.end, "busy streams") for op in graph.ops
                 if op.start is not None and op.end is not None and op.end > op.start
                 and (op.collective or op.rank == r)]
        pid, _ = ids(f"gpu{r}")
        for t, level in _step_counter(spans):
            counters.append({"ph": "C", "name": "busy streams", "pid": pid, "ts": us(t), "args": level})
    for nic, spans in sorted(nic_busy.items()):
        pid, _ = ids(nic)
        for t, level in _step_counter([s for s in spans if s[1] > s[0]]):
            counters.append({"ph": "C", "name": "busy units", "pid": pid, "ts": us(t), "args": level})
    for key, series in sorted(getattr(result, "counters", {}).items()):  # GPU SM/HBM shares (sim.interference)
        process, _, name = key.partition("/")
        pid, _ = ids(process)
        counters.extend({"ph": "C", "name": name, "pid": pid, "ts": us(t), "args": args} for t, args in series)

    meta: list[dict[str, Any]] = []
    for process, pid in pids.items():
        meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": process}})
    for index, process in enumerate(sorted(pids, key=_process_key)):
        meta.append({"ph": "M", "name": "process_sort_index", "pid": pids[process], "tid": 0,
                     "args": {"sort_index": index}})
    for (process, thread), tid in tids.items():
        pid = pids[process]
        meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": thread}})
    for process in pids:
        threads = sorted((t for p, t in tids if p == process), key=_thread_key)
        for index, thread in enumerate(threads):
            meta.append({"ph": "M", "name": "thread_sort_index", "pid": pids[process],
                         "tid": tids[(process, thread)], "args": {"sort_index": index}})
    warm = _warmup_end_ps(result)
    if warm:
        meta.append({"ph": "i", "s": "g", "name": "end of warm-up", "pid": net_pid, "tid": 0,
                     "ts": us(warm)})
    return {"traceEvents": meta + slices + flows + counters, "displayTimeUnit": "ms",
            "otherData": {"scenario": result.metrics.get("scenario"),
                          "system": result.metrics.get("system"),
                          "link_class_bytes": {k: float(v) for k, v in result.link_class_bytes.items()},
                          "warmup_end_us": us(warm), "sampled_gpus": sampled}}


def _phase_styles(phases: list[str]) -> dict[str, tuple[str, str]]:
    """(colour, hatch) per phase: distinct for up to len(PALETTE) x len(HATCHES) phases."""
    return {p: (PALETTE[i % len(PALETTE)], HATCHES[(i // len(PALETTE)) % len(HATCHES)])
            for i, p in enumerate(phases)}


def _title(m: dict[str, Any]) -> str:
    return (f"{m['scenario']}: {m.get('workload', '')} on {m['system']}, {m['gpus']} GPUs "
            f"({'pipelined' if m.get('pipelined') else 'serialized'} {m.get('mode', '')})")


def _plots(result: Any, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = result.metrics
    ser = m["phase_serialized_s"]
    exp = m["phase_exposed_s"]
    phases = list(ser)
    styles = _phase_styles(phases)
    x = np.arange(len(phases))
    fig, ax = plt.subplots(figsize=(max(7, 0.6 * len(phases) + 2), 4.5))
    ax.bar(x - 0.2, [ser[p] * 1e3 for p in phases], 0.4, label="serialized", color=PALETTE[4])
    ax.bar(x + 0.2, [exp.get(p, 0.0) * 1e3 for p in phases], 0.4, label="exposed", color=PALETTE[0])
    ax.set_xticks(x, phases, rotation=45, ha="right")
    ax.set_ylabel("time per iteration (ms)")
    ax.set_title(f"{_title(m)}\n{m['iteration_time_s'] * 1e3:.2f} ms per iteration", fontsize=10)
    ax.legend(fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "breakdown.png", dpi=150)
    plt.close(fig)

    _timeline_png(result, out, plt, styles)
    _utilization_png(result, out, plt)


def _timeline_png(result: Any, out: Path, plt, styles: dict[str, tuple[str, str]]) -> None:
    """Every sampled GPU (its streams as lanes) and NIC (its units as lanes), the warm-up shaded."""
    m = result.metrics
    ranks = _sampled_ranks(result)
    shown = ranks if len(ranks) <= 16 else [ranks[round(i * (len(ranks) - 1) / 15)] for i in range(16)]
    rows: list[tuple[str, list[str]]] = []
    for r in shown:
        streams = sorted({t.split("/", 1)[1] for t in result.tracks if t.startswith(f"gpu{r}/")},
                         key=_thread_key)
        rows.append((f"gpu{r}", [f"gpu{r}/{s}" for s in streams]))
        units = sorted({t.split("/", 1)[1] for t in result.tracks if t.startswith(f"nic{r}/")},
                       key=_thread_key)
        if units:
            rows.append((f"nic{r}", [f"nic{r}/{u}" for u in units]))
    height = max(3.0, 0.42 * len(rows) + 2.2)
    fig, ax = plt.subplots(figsize=(12, height))
    used: dict[str, tuple[str, str]] = {}
    for row, (_, lanes) in enumerate(rows):
        lane_h = 0.84 / max(1, len(lanes))
        for k, track in enumerate(lanes):
            y = row - 0.42 + k * lane_h
            for start, end, label in result.tracks[track]:
                phase = label.split("[")[0]
                if phase not in styles:
                    styles[phase] = (PALETTE[len(styles) % len(PALETTE)],
                                     HATCHES[(len(styles) // len(PALETTE)) % len(HATCHES)])
                color, hatch = styles[phase]
                used[phase] = (color, hatch)
                ax.broken_barh([(start / 1e9, max(end - start, 1) / 1e9)], (y, lane_h * 0.9),
                               facecolors=color, hatch=hatch, edgecolor="white" if not hatch else "black",
                               linewidth=0.2)
    warm = _warmup_end_ps(result)
    if warm:
        ax.axvspan(0, warm / 1e9, color="0.85", zorder=0)
        ax.axvline(warm / 1e9, color="0.3", linestyle="--", linewidth=0.8)
        ax.text(warm / 2e9, -0.5, "warm-up (not measured)", ha="center", va="top",
                fontsize=8, color="0.25")
    ax.set_yticks(range(len(rows)), [name for name, _ in rows], fontsize=8)
    ax.set_ylim(-0.75, len(rows) - 0.1)
    ax.invert_yaxis()
    ax.set_xlabel("simulated time (ms)")
    lanes_note = "lanes: " + ", ".join(sorted({t.split('/', 1)[1] for _, ls in rows for t in ls},
                                              key=_thread_key))
    sub = "" if len(shown) == len(ranks) else f"; {len(shown)} of {len(ranks)} sampled GPUs"
    ax.set_title(f"{_title(m)}\ntimeline ({lanes_note}{sub})", fontsize=10)
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=c, hatch=h, edgecolor="black", linewidth=0.3)
               for c, h in used.values()]
    ncol = min(7, max(1, len(used)))
    legend_in = 0.25 * math.ceil(len(used) / ncol) + 0.55
    fig.set_size_inches(12, height + legend_in)
    fig.legend(handles, list(used), fontsize=8, ncol=ncol, loc="lower center",
               bbox_to_anchor=(0.5, 0.0), frameon=False, title="phase", title_fontsize=8)
    fig.tight_layout(rect=(0, legend_in / (height + legend_in), 1, 1))
    fig.savefig(out / "timeline.png", dpi=150)
    plt.close(fig)


def _utilization_png(result: Any, out: Path, plt) -> None:
    """Average utilization of every resource class (GPU SMs/HBM, PCIe, CPU, NIC units, network
    link classes) and the bytes and mean bandwidth per link class."""
    m = result.metrics
    util = m["utilization"]
    links = {k: float(v) for k, v in result.link_class_bytes.items()}
    sim_s = float(m.get("simulated_time_s") or 0.0)
    fig, axs = plt.subplots(1, 2, figsize=(12, max(3.5, 0.32 * len(util) + 1.8)),
                            gridspec_kw={"width_ratios": [3, 2]})
    ax = axs[0]
    keys = list(util)
    groups = {"gpu": PALETTE[4], "pcie": PALETTE[1], "cpu": PALETTE[6], "nic": PALETTE[0],
              "net": PALETTE[2]}
    colors = [next((c for g, c in groups.items() if k.startswith(g)), PALETTE[7]) for k in keys]
    ax.barh(keys, [util[k] * 100 for k in keys], color=colors)
    for y, k in enumerate(keys):
        ax.text(min(util[k] * 100 + 1, 92), y, f"{util[k] * 100:.1f}%", va="center", fontsize=8)
    ax.set_xlabel("average utilization over the run (%)")
    ax.set_xlim(0, 100)
    ax.invert_yaxis()
    ax.set_title("resources", fontsize=10)
    ax = axs[1]
    names = list(links)
    if names and sim_s > 0:
        bw = [links[n] / sim_s / 1e9 for n in names]
        ax.barh(names, bw, color=PALETTE[2])
        for y, (n, b) in enumerate(zip(names, bw)):
            ax.text(b, y, f" {b:.1f} GB/s ({links[n] / 1e9:.1f} GB)", va="center", fontsize=8)
        ax.set_xlabel("mean bandwidth per link class (GB/s, all links)")
        ax.set_xlim(0, max(bw) * 1.6 if max(bw) > 0 else 1)
        ax.invert_yaxis()
    else:
        ax.text(0.5, 0.5, "no network traffic", ha="center", va="center")
        ax.set_axis_off()
    ax.set_title("network links", fontsize=10)
    fig.suptitle(_title(m), fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "utilization.png", dpi=150)
    plt.close(fig)


def write_results(result: Any, out_dir: str | Path, plan: Any = None) -> Path:
    """Write every file of :data:`RESULT_FILES` into ``out_dir`` (created); returns it."""
    import tomli_w

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.toml").write_text(tomli_w.dumps(_plain(result.scenario.resolved())), encoding="utf-8")
    (out / "metrics.json").write_text(json.dumps(_plain(result.metrics), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    m = result.metrics
    with (out / "breakdown.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["phase", "serialized_s", "exposed_s"])
        for phase, ser in m["phase_serialized_s"].items():
            writer.writerow([phase, f"{ser:.9g}", f"{m['phase_exposed_s'].get(phase, 0.0):.9g}"])
        writer.writerow(["idle", "", f"{m['idle_s']:.9g}"])
        writer.writerow(["iteration", "", f"{m['iteration_time_s']:.9g}"])
    (out / "trace.json").write_text(json.dumps(chrome_trace(result, plan)), encoding="utf-8")
    _plots(result, out)
    return out


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def summary_table(result: Any):
    """A rich renderable summarising the run."""
    from rich.console import Group
    from rich.table import Table

    m = result.metrics
    head = Table(title=f"{m['scenario']}: {m['workload']} on {m['system']} ({m['gpus']} GPUs, "
                       f"{'pipelined' if m['pipelined'] else 'serialized'} {m['mode']})", show_header=False)
    head.add_column("figure")
    head.add_column("value", justify="right")
    head.add_row("samples/s", f"{m['samples_per_s']:,.0f}")
    head.add_row("iteration time", f"{m['iteration_time_s'] * 1e3:.3f} ms")
    head.add_row("global batch", f"{m['global_batch']:,}")
    if "latency_s" in m:
        head.add_row("latency per query batch (mean / max)", f"{m['latency_s']['mean'] * 1e3:.3f} / {m['latency_s']['max'] * 1e3:.3f} ms")
    head.add_row("simulation wall time", f"{m['wall_s']:.2f} s ({m['events']:,} events)")
    split = m.get("wall_breakdown_s")
    if split:
        head.add_row("  of which planning / engine", f"{split.get('planning_s', 0.0):.2f} / {split.get('engine_s', 0.0):.2f} s")
    for name, rate in m.get("cache_hit_rates", {}).items():
        head.add_row(f"cache hit rate: {name}", f"{rate * 100:.1f} %")
    nic = m.get("nic")
    if nic:
        on = [k for k in ("pool_on_nic", "reorder") if nic.get(k)]
        on += [k for k in ("local_cache_mib", "remote_cache_mib") if nic.get(k)]
        head.add_row("SmartNIC mechanisms on", ", ".join(on) or "none")
        if "adjacent_reuse" in nic:
            head.add_row(f"reuse within {nic.get('reuse_window', 8)} lookups (as is / reordered)",
                         f"{nic['adjacent_reuse'] * 100:.1f} / {nic['adjacent_reuse_reordered'] * 100:.1f} %")
    phases = Table(title="per phase, per iteration (serialized vs exposed)")
    phases.add_column("phase")
    phases.add_column("serialized ms", justify="right")
    phases.add_column("exposed ms", justify="right")
    for phase, ser in m["phase_serialized_s"].items():
        phases.add_row(phase, f"{ser * 1e3:.3f}", f"{m['phase_exposed_s'].get(phase, 0.0) * 1e3:.3f}")
    phases.add_row("idle", "", f"{m['idle_s'] * 1e3:.3f}")
    res = Table(title="resources")
    res.add_column("resource")
    res.add_column("value", justify="right")
    for key, value in m["utilization"].items():
        res.add_row(f"utilization {key}", f"{value * 100:.1f} %")
    for key, value in m["link_class_bytes"].items():
        res.add_row(f"bytes on {key} links", _fmt_bytes(value))
    return Group(head, phases, res)
