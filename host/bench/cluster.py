"""``neonic bench cluster``: how fast the cluster runtime simulates Model-A, and what it predicts.

Figures (measured when the command runs):

``model_a_128gpu_iteration_wall_s``   wall-clock seconds to simulate one Model-A training
                                      iteration on 16 x 8 GPUs (planning, graph, engine; goal
                                      <= 10 s on 2 cores); one warm-up iteration is simulated
                                      too and the total divided by the iterations simulated
``model_a_128gpu_samples_per_s``      the simulated throughput of that run. Neo reports 1.2M
                                      samples/s for Model-A on 128 GPUs; the GPU efficiency
                                      parameters (sim.gpu.GPUEfficiency: gemm, embedding_random,
                                      embedding_backward) are calibrated to it, so this figure
                                      checks the calibration; every other figure is a prediction
``model_a_128gpu_iteration_ms``       the simulated iteration time
``model_a_1024gpu_iteration_wall_s``  the same on 128 x 8 GPUs (goal <= 120 s); skipped with
                                      ``--quick``
``model_a_1024gpu_samples_per_s``     its simulated throughput (a prediction)
"""

from __future__ import annotations

import time

from host.bench import BenchContext

SUMMARY = "cluster runtime: Model-A on 128 / 1024 simulated GPUs (wall time per iteration, samples/s)"

NEO_MODEL_A_128GPU_SAMPLES_PER_S = 1.2e6  # the published figure the efficiencies are fitted to


def _one(ctx: BenchContext, preset: str, label: str) -> dict[str, float]:
    from host.cluster import ClusterRun, scenario_preset

    scenario = scenario_preset(preset, scenario={"seed": ctx.seed})
    last = [-1.0]

    def progress(message: str, fraction: float) -> None:
        if fraction - last[0] >= 0.1 or fraction >= 1.0:
            last[0] = fraction
            ctx.progress(f"{label}: {message} ({fraction * 100:.0f}%)")

    t0 = time.perf_counter()
    result = ClusterRun(scenario, progress=progress).run()
    wall = time.perf_counter() - t0
    simulated = scenario.warmup + scenario.iterations
    m = result.metrics
    ctx.progress(f"{label}: {m['samples_per_s']:,.0f} samples/s, {m['iteration_time_s'] * 1e3:.2f} ms/iteration, "
                 f"{wall:.1f} s wall for {simulated} iterations")
    return {
        f"{label}_iteration_wall_s": wall / simulated,
        f"{label}_samples_per_s": m["samples_per_s"],
        f"{label}_iteration_ms": m["iteration_time_s"] * 1e3,
    }


def run(ctx: BenchContext) -> dict:
    figures: dict[str, float] = {}
    figures.update(_one(ctx, "model-a-128", "model_a_128gpu"))
    figures["model_a_128gpu_samples_per_s_vs_neo"] = figures["model_a_128gpu_samples_per_s"] / NEO_MODEL_A_128GPU_SAMPLES_PER_S
    if not ctx.quick:
        figures.update(_one(ctx, "model-a-1024", "model_a_1024gpu"))
    return figures
