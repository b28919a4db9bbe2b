"""``neonic bench cluster``: how fast the cluster runtime simulates Model-A, and what it predicts.

Figures (measured when the command runs):

``model_a_128gpu_iteration_wall_s``   wall-clock seconds to simulate one Model-A training
                                      iteration on 16 x 8 GPUs (goal <= 10 s on 2 cores): the
                                      WHOLE run (imports of the models aside: topology, planning,
                                      work, graph, engine, metrics) divided by the iterations
                                      simulated (one warm-up + one measured), so planning counts
``model_a_128gpu_planning_wall_s``    of which the sharding planner (once per run)
``model_a_128gpu_engine_wall_s_per_iteration``  of which the engine, per simulated iteration
``model_a_128gpu_other_wall_s``       the rest (topology, work, payloads, graph, metrics)
``model_a_128gpu_samples_per_s``      the simulated throughput of that run. Neo reports 1.2M
                                      samples/s for Model-A on 128 GPUs; the GPU efficiency
                                      parameters (sim.gpu.GPUEfficiency: gemm, embedding_random,
                                      embedding_backward) are calibrated to it, so this figure
                                      checks the calibration; every other figure is a prediction
``model_a_128gpu_iteration_ms``       the simulated iteration time
``model_a_1024gpu_iteration_wall_s``  the same on 128 x 8 GPUs (goal <= 10 s, issue 19), with its
                                      planning / engine / other split; skipped with ``--quick``
``model_a_1024gpu_samples_per_s``     its simulated throughput (a prediction)
``model_a_4096gpu_iteration_wall_s``  the same on 512 x 8 GPUs (``model-a-1024`` with 512 nodes; goal <= 60 s), and
``model_a_4096gpu_samples_per_s``     its throughput: run only with ``--large`` (its AlltoAllv
                                      matrices are uneven, so the network solves per flow: 16.8M
                                      flows per AlltoAllv), else null with the reason. Planned
                                      as the 1024-GPU run is, by the preset's planner (Neo's
                                      search, named in ``model_a_4096gpu_planner``), and its
                                      planning counts, as issue 19's goal asks
``*_peak_rss_gib``                    that run's peak resident memory (Linux: the process's
                                      high-water mark, reset before the run; elsewhere the
                                      process's peak so far)
``*_iteration_cpu_s``                 the same run's CPU seconds per simulated iteration (what the
                                      wall time would be on an idle core; a shared machine
                                      inflates wall times)
"""

from __future__ import annotations

import time
from typing import Callable

from neonic.host.bench import BenchContext
from neonic.host.bench.network import _peak_rss_gib

#: at least one progress line this often (seconds of wall time) during a run
PROGRESS_EVERY_S = 15.0

SUMMARY = "cluster runtime: Model-A on 128 / 1024 simulated GPUs (wall time per iteration, samples/s)"

NEO_MODEL_A_128GPU_SAMPLES_PER_S = 1.2e6  # the published figure the efficiencies are fitted to


def _one(ctx: BenchContext, preset: str, label: str, **overrides) -> dict[str, float]:
    from neonic.host.cluster import ClusterRun, scenario_preset

    scenario = scenario_preset(preset, scenario={"seed": ctx.seed}, **overrides)
    progress = _progress_lines(ctx, label)

    import neonic.host.planner.search  # noqa: F401  (imports are not the run's cost)
    import neonic.sim.network.network  # noqa: F401

    _reset_peak_rss()
    t0 = time.perf_counter()
    c0 = time.process_time()
    result = ClusterRun(scenario, progress=progress).run()
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    peak = _run_peak_rss_gib()
    simulated = scenario.warmup + scenario.iterations
    m = result.metrics
    split = m.get("wall_breakdown_s", {})
    planning = split.get("planning_s", 0.0)
    engine = split.get("engine_s", 0.0)
    ctx.progress(f"{label}: {m['samples_per_s']:,.0f} samples/s, {m['iteration_time_s'] * 1e3:.2f} ms/iteration, "
                 f"{wall:.1f} s wall for {simulated} iterations (planning {planning:.1f} s, engine {engine:.1f} s), "
                 f"peak RSS {peak:.2f} GiB")
    return {
        f"{label}_iteration_wall_s": wall / simulated,
        f"{label}_iteration_cpu_s": cpu / simulated,
        f"{label}_planning_wall_s": planning,
        f"{label}_engine_wall_s_per_iteration": engine / simulated,
        f"{label}_other_wall_s": wall - planning - engine,
        f"{label}_samples_per_s": m["samples_per_s"],
        f"{label}_iteration_ms": m["iteration_time_s"] * 1e3,
        f"{label}_peak_rss_gib": peak,
    }


def _progress_lines(ctx: BenchContext, label: str, every_s: float | None = None,
                    clock: Callable[[], float] = time.perf_counter) -> Callable[[str, float], None]:
    """A ``ClusterRun`` progress callback that passes a line to ``ctx.progress`` every tenth of
    the run and, between tenths, whenever ``every_s`` seconds of wall time have passed since
    the last line (default :data:`PROGRESS_EVERY_S`): the engine's time estimates and the
    network's heartbeat on a long collective come through, so a 4096-GPU run does not go quiet
    for minutes."""
    every = PROGRESS_EVERY_S if every_s is None else every_s
    last = [-1.0, clock()]

    def progress(message: str, fraction: float) -> None:
        now = clock()
        if fraction - last[0] >= 0.1 or fraction >= 1.0 or now - last[1] >= every:
            last[0], last[1] = fraction, now
            ctx.progress(f"{label}: {message} ({fraction * 100:.0f}%)")

    return progress


def _reset_peak_rss() -> None:
    """Reset the process's resident-memory high-water mark (Linux: ``/proc/self/clear_refs``),
    so that the next run's peak is its own, not an earlier run's; elsewhere nothing."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _run_peak_rss_gib() -> float:
    """The resident-memory high-water mark since :func:`_reset_peak_rss` (Linux ``VmHWM``), or
    where that cannot be read the process's peak so far (``getrusage``)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / (1 << 20)   # kB
    except (OSError, ValueError, IndexError):
        pass
    return _peak_rss_gib()


def _planner_name(preset: str) -> str:
    """The planner a scenario preset names (what the bench's runs of it plan with)."""
    from neonic.host.cluster import scenario_preset

    return str(scenario_preset(preset).planner)


def run(ctx: BenchContext) -> dict:
    figures: dict[str, float] = {}
    figures.update(_one(ctx, "model-a-128", "model_a_128gpu"))
    figures["model_a_128gpu_samples_per_s_vs_neo"] = figures["model_a_128gpu_samples_per_s"] / NEO_MODEL_A_128GPU_SAMPLES_PER_S
    if not ctx.quick:
        figures.update(_one(ctx, "model-a-1024", "model_a_1024gpu"))
    if ctx.large:
        # the preset's planner (Neo's search), its planning counted: issue 19's goal at 4096 GPUs
        figures.update(_one(ctx, "model-a-1024", "model_a_4096gpu", cluster={"nodes": 512}))
        figures["model_a_4096gpu_planner"] = _planner_name("model-a-1024")
    else:
        figures.update(model_a_4096gpu_iteration_wall_s=None, model_a_4096gpu_samples_per_s=None,
                       model_a_4096gpu_skipped="uneven AlltoAllv matrices are solved per flow (16.8M flows each): "
                                               "run with --large")
    return figures
