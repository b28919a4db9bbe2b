"""The results folder of a cluster run (DESIGN.md) and its summary table.

``write_results(result, out_dir)`` writes:

``config.toml``      the resolved scenario (every default filled in; rerunnable with ``neonic run``)
``metrics.json``     every figure of the run (samples/s, iteration time, phases, utilization, ...)
``breakdown.csv``    per phase: serialized and exposed seconds per iteration
``trace.json``       Chrome trace events (opens in Perfetto / chrome://tracing): one process per
                     sampled GPU with one thread per stream, one per NIC unit (SmartNIC system),
                     and a ``network`` process with one thread per collective and a counter per
                     link class (bytes)
``breakdown.png``    serialized vs exposed time per phase
``timeline.png``     the streams of the first sampled GPU over the measured iterations
``utilization.png``  average utilization per resource

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


def chrome_trace(result: Any) -> dict[str, Any]:
    """The run's timeline as a Chrome trace event object (times in microseconds)."""
    events: list[dict[str, Any]] = []
    pids: dict[str, int] = {}
    tids: dict[tuple[str, str], int] = {}

    def ids(process: str, thread: str) -> tuple[int, int]:
        if process not in pids:
            pids[process] = len(pids) + 1
            events.append({"ph": "M", "name": "process_name", "pid": pids[process], "tid": 0, "args": {"name": process}})
        key = (process, thread)
        if key not in tids:
            tids[key] = len([k for k in tids if k[0] == process]) + 1
            events.append({"ph": "M", "name": "thread_name", "pid": pids[process], "tid": tids[key], "args": {"name": thread}})
        return pids[process], tids[key]

    for track in sorted(result.tracks):
        process, _, thread = track.partition("/")
        pid, tid = ids(process, thread)
        for start, end, label in result.tracks[track]:
            events.append({"ph": "X", "name": label, "cat": thread, "pid": pid, "tid": tid,
                           "ts": start / 1e6, "dur": max(end - start, 0) / 1e6})
    for key, series in sorted(getattr(result, "counters", {}).items()):  # GPU SM/HBM shares (sim.interference)
        process, _, name = key.partition("/")
        pid = pids[process] if process in pids else ids(process, "counters")[0]
        events.extend({"ph": "C", "name": name, "pid": pid, "ts": t / 1e6, "args": args} for t, args in series)
    end_us = result.metrics.get("simulated_time_s", 0.0) * 1e6
    for cls, nbytes in sorted(result.link_class_bytes.items()):
        pid, _ = ids("network", "links")
        events.append({"ph": "C", "name": f"bytes.{cls}", "pid": pid, "ts": 0.0, "args": {"bytes": 0}})
        events.append({"ph": "C", "name": f"bytes.{cls}", "pid": pid, "ts": end_us, "args": {"bytes": float(nbytes)}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"scenario": result.metrics.get("scenario"), "system": result.metrics.get("system")}}


def _plots(result: Any, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = result.metrics
    ser = m["phase_serialized_s"]
    exp = m["phase_exposed_s"]
    phases = list(ser)
    x = np.arange(len(phases))
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(phases) + 2), 4))
    ax.bar(x - 0.2, [ser[p] * 1e3 for p in phases], 0.4, label="serialized")
    ax.bar(x + 0.2, [exp.get(p, 0.0) * 1e3 for p in phases], 0.4, label="exposed")
    ax.set_xticks(x, phases, rotation=45, ha="right")
    ax.set_ylabel("ms per iteration")
    ax.set_title(f"{m['scenario']}: {m['system']}, {m['gpus']} GPUs, {m['iteration_time_s'] * 1e3:.2f} ms/iteration")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "breakdown.png", dpi=100)
    plt.close(fig)

    tracks = [t for t in sorted(result.tracks) if t.startswith(next(iter(sorted(result.tracks))).split("/")[0] + "/")]
    tracks += [t for t in sorted(result.tracks) if t.startswith("nic") and t not in tracks][:4]
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(tracks) + 1.5))
    colors = plt.get_cmap("tab20")
    phase_color: dict[str, Any] = {}
    for row, track in enumerate(tracks):
        for start, end, label in result.tracks[track]:
            phase = label.split("[")[0]
            color = phase_color.setdefault(phase, colors(len(phase_color) % 20))
            ax.broken_barh([(start / 1e9, max(end - start, 1) / 1e9)], (row - 0.4, 0.8), color=color)
    ax.set_yticks(range(len(tracks)), tracks)
    ax.set_xlabel("simulated time (ms)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in phase_color.values()]
    ax.legend(handles, list(phase_color), fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    fig.tight_layout()
    fig.savefig(out / "timeline.png", dpi=100)
    plt.close(fig)

    util = m["utilization"]
    fig, ax = plt.subplots(figsize=(6, 3))
    keys = list(util)
    ax.barh(keys, [util[k] * 100 for k in keys])
    ax.set_xlabel("average utilization (%)")
    ax.set_xlim(0, 100)
    fig.tight_layout()
    fig.savefig(out / "utilization.png", dpi=100)
    plt.close(fig)


def write_results(result: Any, out_dir: str | Path) -> Path:
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
    (out / "trace.json").write_text(json.dumps(chrome_trace(result)), encoding="utf-8")
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
