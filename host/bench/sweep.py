"""``neonic bench sweep``: how well a sweep spreads over Dask workers.

Runs the same sweep of small scenario points (the default scenario with few tables; a grid
over nodes, stream priority, interference and the dense datatype) on a local Dask cluster of
worker processes, once with one worker and once with two, each into a fresh folder so that
every point is computed. Figures (measured when the command runs):

``points``               points in the sweep (>= 16)
``wall_s_1_worker``      wall-clock seconds of the sweep (points, result files, CSV and plots) on a
                         started cluster of one worker that has already run one warm-up point
                         (start-up is reported apart)
``wall_s_2_workers``     the same with two workers
``startup_s_1_worker``, ``startup_s_2_workers``  starting the local cluster and the warm-up point
``speedup``              wall_s_1_worker / wall_s_2_workers
``parallel_efficiency``  speedup / 2 (1 = perfect use of the second worker)
``point_s_mean``         mean seconds one point takes on a worker
``identical_csv``        whether both runs wrote byte-identical results.csv
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from neonic.host.bench import BenchContext

SUMMARY = "sweep on Dask: >= 16 small points with 1 and 2 local worker processes (wall time, parallel efficiency)"


def _spec(quick: bool, seed: int):
    from neonic.host.sweep import sweep_from_dict

    grid = {"cluster.nodes": [1, 2], "system.streams.comm_priority": ["high", "normal"],
            "system.streams.interference": [0.05, 0.15], "dense.dtype": ["fp16", "fp32"]}
    return sweep_from_dict({
        "sweep": {"name": "bench", "scenario": "default"},
        "set": {"scenario.iterations": 1, "scenario.seed": seed, "planner.max_steps": 50,
                "workload.synthesize.count": 8 if quick else 100, "workload.synthesize.total_params": 2e8 if quick else 5e9},
        "grid": grid,
    })


def _warm(config: dict, base_dir: str | None) -> None:
    """Run one point on a worker before the clock starts, so the timed sweep measures points,
    not a worker's imports and first-call costs (loading the network solver's compiled
    kernels; importing matplotlib, which the workers use to draw the sweep's plots)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401

    from neonic.host.sweep import evaluate_point
    evaluate_point(config, base_dir)


def run(ctx: BenchContext) -> dict:
    from dask.distributed import Client, LocalCluster

    from neonic.host.sweep import expand_points, run_sweep

    spec = _spec(ctx.quick, ctx.seed)
    spec_points = expand_points(spec)
    figures: dict = {}
    csvs = []
    with tempfile.TemporaryDirectory(prefix="neonic-bench-sweep-") as tmp:
        for workers in (1, 2):
            out = Path(tmp) / f"w{workers}"
            last = [0.0]

            def progress(done: int, total: int, record: dict, workers=workers) -> None:
                now = time.perf_counter()
                if record and (now - last[0] >= 2.0 or done == total):
                    last[0] = now
                    ctx.progress(f"{workers} worker(s): {done}/{total} points")

            ctx.progress(f"{workers} worker(s): starting a local Dask cluster")
            t0 = time.perf_counter()
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None)
            client = Client(cluster)
            try:
                warm = spec_points[0]
                client.run(_warm, warm.config, spec.base_dir)
                suffix = f"{workers}_worker" + ("s" if workers > 1 else "")
                figures[f"startup_s_{suffix}"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                result = run_sweep(spec, out, client=client, progress=progress)
                wall = time.perf_counter() - t0
            finally:
                client.close()
                cluster.close()
            if result.failed:
                raise RuntimeError(f"bench sweep: {len(result.failed)} points failed: {result.records[result.failed[0].key]['error']}")
            figures["points"] = len(result.points)
            figures[f"wall_s_{suffix}"] = wall
            if workers == 1:
                walls = [r.get("wall_s", 0.0) for r in result.records.values()]
                figures["point_s_mean"] = sum(walls) / len(walls)
            csvs.append((out / "results.csv").read_text())
            ctx.progress(f"{workers} worker(s): {len(result.points)} points in {wall:.1f} s")
    figures["speedup"] = figures["wall_s_1_worker"] / figures["wall_s_2_workers"]
    figures["parallel_efficiency"] = figures["speedup"] / 2
    figures["identical_csv"] = csvs[0] == csvs[1]
    return figures
