"""``neonic bench planner``: every plan predicted by the planner and simulated, on Neo's cluster.

For model-a, model-i and model-f on 16 ZionEX nodes x 8 A100 (the ``model-a-128`` scenario with
the workload swapped; 2 warm-up and 3 measured iterations, so that the pipeline's steady state
is measured), each plan (Neo's search as ``neo``, every baseline planner, every forced sharding
type) is priced by the planner's fast evaluation (``predicted_ms``: ``host.planner.cost``, the
op graph of the iteration without an event engine) and run on the event-driven cluster
simulator (``simulated_ms``), both in milliseconds per iteration. A plan that cannot be made
(a table fits nowhere under that planner) is listed under ``errors``.

Last line (``--json``), one object: ``planning_s`` (wall time of Neo's search on model-a, 128
GPUs; it depends on the machine's load, the plan does not) and ``planning_cpu_s`` (its CPU
time, the search's worker processes included; ``planning_workers``: how many processes); under each model: ``predicted_ms`` and ``simulated_ms`` (plan name -> ms),
``errors``, ``prediction_error`` (predicted / simulated - 1, per plan),
``best_alternative``, ``neo_below_best_alternative`` (1 - neo / best other plan, simulated) and
``neo_lowest_simulated`` (no other plan simulates faster, ties within :data:`TIE` included).
``--quick``: the models' 2/16 shares on 2 nodes, 1 measured iteration.
"""

from __future__ import annotations

import time

SUMMARY = "planner: every plan predicted vs simulated, model-a/i/f on 16 x 8 ZionEX A100"
MODELS = ("model-a", "model-i", "model-f")
#: Relative difference within which two simulated times are a tie (``neo_lowest_simulated``):
#: the same plan with its nodes numbered differently adds its flows in another order, which
#: moves the simulated time by about 1e-10 (model-f: Neo's plan is forced table-row-wise
#: renumbered, 4.217145468 vs 4.217145467 ms).
TIE = 1e-9


def run(ctx) -> dict:
    import tomllib

    from neonic.host.cluster import ClusterRun, scenario_from_dict, scenario_preset_text
    from neonic.host.experiments._common import scaled_workload
    from neonic.host.planner import PLANNER_NAMES, CostModel, NeoPlanner, make_plan

    nodes = 2 if ctx.quick else 16
    out: dict = {"nodes": nodes, "gpus_per_node": 8, "system": "zionex"}
    if not ctx.quick:
        ctx.progress("warm-up: planning model-a's 2/16 share on 2 nodes (untimed)")
        _warm_up()
    for model in MODELS:
        workload = {"preset": model} if not ctx.quick else scaled_workload(model, nodes / 16)
        data = tomllib.loads(scenario_preset_text("model-a-128"))
        data["workload"] = workload
        data["cluster"]["nodes"] = nodes
        data["scenario"].update({"name": f"bench-planner-{model}", "warmup": 1 if ctx.quick else 2,
                                 "iterations": 1 if ctx.quick else 3})
        try:
            sc = scenario_from_dict(data)
        except ValueError as error:
            out[model] = {"error": str(error)}
            continue
        runner = ClusterRun(sc)
        topo = runner._topology()
        psys = runner.make_planner_system(topo)
        w = sc.workload
        predicted: dict[str, float] = {}
        simulated: dict[str, float] = {}
        errors: dict[str, str] = {}
        cost = None
        for name in PLANNER_NAMES:
            ctx.progress(f"{model}: planning {name}")
            try:
                if name == "neo":
                    # a fresh cost model: the search's time includes building its caches
                    cost = CostModel(w, psys)
                    t0, c0, k0 = time.perf_counter(), time.process_time(), _children_cpu_s()
                    planner = NeoPlanner(w, psys, cost)
                    plan = planner.run()
                    if model == "model-a":
                        out["planning_s"] = time.perf_counter() - t0
                        out["planning_cpu_s"] = time.process_time() - c0 + _children_cpu_s() - k0
                        out["planning_workers"] = planner.workers
                        out["planning_notes"] = list(plan.notes)
                else:
                    plan = make_plan(w, psys, name, cost=cost)
            except ValueError as error:
                errors[name] = str(error)
                ctx.progress(f"{model}: {name}: cannot plan: {error}")
                continue
            predicted[name] = cost.evaluate(plan).iteration_s * 1e3
            ctx.progress(f"{model}: simulating {name} (predicted {predicted[name]:.2f} ms)")
            result = ClusterRun(sc, plan=plan).run()
            simulated[name] = result.metrics["iteration_time_s"] * 1e3
            ctx.progress(f"{model}: {name}: predicted {predicted[name]:.2f} ms, simulated {simulated[name]:.2f} ms")
        entry: dict = {"predicted_ms": predicted, "simulated_ms": simulated, "errors": errors,
                       "prediction_error": {n: predicted[n] / simulated[n] - 1 for n in simulated if simulated[n] > 0}}
        entry.update(neo_against_alternatives(simulated))
        out[model] = entry
    errs = [abs(e) for m in MODELS for e in out.get(m, {}).get("prediction_error", {}).values()]
    out["max_abs_prediction_error"] = max(errs) if errs else None
    return out


def _warm_up() -> None:
    """Neo's search on model-a's 2/16 share on 2 nodes, untimed: the planner's compiled kernels
    are compiled on a fresh checkout (or loaded from numba's cache) here, so that ``planning_s``
    measures the search, not the compiler (some 5 CPU-s on a fresh checkout)."""
    import tomllib

    from neonic.host.cluster import ClusterRun, scenario_from_dict, scenario_preset_text
    from neonic.host.experiments._common import scaled_workload
    from neonic.host.planner import CostModel, NeoPlanner

    data = tomllib.loads(scenario_preset_text("model-a-128"))
    data["workload"] = scaled_workload("model-a", 2 / 16)
    data["cluster"]["nodes"] = 2
    sc = scenario_from_dict(data)
    runner = ClusterRun(sc)
    psys = runner.make_planner_system(runner._topology())
    NeoPlanner(sc.workload, psys, CostModel(sc.workload, psys)).run()


def _children_cpu_s() -> float:
    """CPU seconds of this process's ended children (the search's worker processes)."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def neo_against_alternatives(simulated: dict[str, float]) -> dict:
    """Neo's simulated time against the best other plan's: ``best_alternative``,
    ``neo_below_best_alternative`` (1 - neo / best) and ``neo_lowest_simulated`` (no other
    plan is faster by more than :data:`TIE`); empty without Neo or without another plan."""
    others = {n: v for n, v in simulated.items() if n != "neo"}
    if "neo" not in simulated or not others:
        return {}
    best = min(others, key=others.get)
    return {"best_alternative": best,
            "neo_below_best_alternative": 1 - simulated["neo"] / others[best],
            "neo_lowest_simulated": simulated["neo"] <= others[best] * (1 + TIE)}
