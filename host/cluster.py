"""A cluster run: one scenario (workload x system x cluster size x schedule) on the engine.

:class:`ClusterRun` orchestrates a run: it builds the topology, plans the embedding sharding
(``host.planner``), derives one iteration's work and payloads from the plan
(``host.iteration``; the SmartNIC system's effects from ``host.nic_effects``), turns them into
an op graph (``host.schedule``) and executes it on one :class:`~sim.engine.Engine` whose
resources are the GPUs (``sim.resources.GPUDevice``: SMs + HBM, with the C3 levers), the PCIe
host links, the CPU sockets (Zion), the SmartNICs' units (``sim.nic``) and the network's links
(``sim.network``); ``host.metrics`` collects what it measured.

Scenarios (schema, loading, presets) live in ``host.scenario``; their names are importable
from here too.

Resource binding (each an ASSUMPTION a user can see in code and docs): a collective's kernel
runs on every rank for its whole network duration and shares the GPU with compute kernels as
``sim.interference`` models it (SMs by block scheduling with ``streams.comm_priority`` and
``sm_partition_comm``, HBM by the bytes it moves, copy engines with ``collectives_on_dma``); its
flows are limited by what its GPU can feed. On the SmartNIC system each
GPU's NIC is a :class:`sim.nic.NIC` on the engine (units ``cache``, ``gather``,
``packetizer``: one timeline track each); the embedding forward runs the GPU kernel, the NIC
units and the PCIe transfers side by side, and every AlltoAll waits for the NICs' packetizers
as well as the network.

Planning: ``[planner] name`` picks the planner (``host.planner.make_plan``); Neo's search ends
at convergence or after ``max_steps`` steps, so a run is deterministic for its seed;
``time_budget_s`` (off by default) adds a wall-clock bound (the plan's notes in the metrics
say how many steps ran). ``metrics["wall_breakdown_s"]`` says where the
simulation's own wall time went (planning, building, engine), ``metrics["wall_stages_s"]``
stage by stage with this process's CPU seconds (:class:`StageClock`; the last progress
message lists them).
"""

from __future__ import annotations

import ctypes
import functools
import gc
import math
import sys
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from neonic.host.iteration import (WIRE_BYTES, Collective, Copy, CPUJob, IterationSpec, NICJob, build_iteration_graph,
                                   dense_costs, iteration_buckets, iteration_payloads)
from neonic.host.metrics import RunResult, collect_metrics, sample_ranks
from neonic.host.nic_effects import NICEffects, nic_config, nic_effects
from neonic.host.scenario import (SCENARIO_PRESETS, Scenario, default_scenario, load_scenario, scenario_from_dict,
                                  scenario_preset, scenario_preset_text)
from neonic.host.schedule import Op, ScheduleRunner
from neonic.sim.engine import Engine, ps_from_s
from neonic.sim.gpu import KernelCost
from neonic.sim.interference import REDUCE_FRACTION, collective_links, comm_begin_all, comm_end_all, couple
from neonic.sim.resources import CPU_PRESETS, GPUDevice, ServerPool

__all__ = [
    "Scenario",
    "ClusterRun",
    "RunResult",
    "SCENARIO_PRESETS",
    "scenario_preset",
    "scenario_preset_text",
    "scenario_from_dict",
    "load_scenario",
    "default_scenario",
    "dense_costs",
]

Progress = Callable[[str, float], None]


class EngineProgress:
    """Where the engine is in a run's op graph (ops and iterations ended) and an estimate of
    the wall time it has left, for progress reports on long runs.

    The estimate: the wall time per ended op times the ops left, which is rough (a collective
    on thousands of GPUs costs far more wall time than a kernel) and said to be so until
    iteration 0 has ended (every op labelled with it); from then on, the smaller of that and
    the wall time per ended iteration times the iterations left (both overestimate a
    pipelined run, whose first iteration ends after the next one has started)."""

    def __init__(self, graph: Any, clock: Callable[[], float] = time.perf_counter) -> None:
        self.n_ops = len(graph.ops)
        self.iterations = graph.iterations
        labels = [op.iteration for op in graph.ops]
        self._left = [0] * (max(labels, default=0) + 1)
        for it in labels:
            self._left[it] += 1
        self.done = 0
        self.iterations_done = 0
        self._clock = clock
        self.t0 = clock()
        self._t_iteration = self.t0

    def start(self) -> float:
        """Start the clock (now); returns the time."""
        self.t0 = self._t_iteration = self._clock()
        return self.t0

    def op_done(self, op: Any) -> None:
        self.done += 1
        self._left[op.iteration] -= 1
        while self.iterations_done < self.iterations and self._left[self.iterations_done] == 0:
            self.iterations_done += 1
            self._t_iteration = self._clock()

    def left_s(self) -> tuple[float | None, str]:
        """Seconds of wall time left (None: no estimate yet) and what the estimate rests on
        (``iterations`` or ``ops``)."""
        spent = self._clock() - self.t0
        if not self.done:
            return None, ""
        by_ops = spent * (self.n_ops - self.done) / self.done
        if self.iterations_done:
            per = (self._t_iteration - self.t0) / self.iterations_done
            return min(by_ops, max(0.0, per * self.iterations - spent)), "iterations"
        return by_ops, "ops"

    def describe(self) -> str:
        """``N s so far, about M s left`` with the estimate's basis."""
        spent = self._clock() - self.t0
        left, basis = self.left_s()
        its = f"{self.iterations_done}/{self.iterations} iterations ended, {spent:.0f} s so far"
        if left is None:
            return f"{its}, no estimate yet"
        if basis == "ops":
            return f"{its}, about {left:.0f} s left (from the ops ended: rough until an iteration has ended)"
        return f"{its}, about {left:.0f} s left"


class StageClock:
    """Wall and CPU seconds of a run's stages, in the order they first ran (a run's
    ``metrics["wall_stages_s"]``): where a large run's time goes, stage by stage. The CPU
    seconds are this process's: the planner's forked workers (``host.planner.parallel``) are
    not in them."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter,
                 cpu: Callable[[], float] = time.process_time) -> None:
        self._clock = clock
        self._cpu = cpu
        self._spent: dict[str, list[float]] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        """Time the block as stage ``name`` (a stage timed twice adds up)."""
        wall, cpu = self._clock(), self._cpu()
        try:
            yield
        finally:
            spent = self._spent.setdefault(name, [0.0, 0.0])
            spent[0] += self._clock() - wall
            spent[1] += self._cpu() - cpu

    def as_dict(self) -> dict[str, dict[str, float]]:
        return {name: {"wall_s": w, "cpu_s": c} for name, (w, c) in self._spent.items()}

    def describe(self) -> str:
        """``stage wall/CPU s, ...`` in order."""
        return ", ".join(f"{name} {w:.1f}/{c:.1f}" for name, (w, c) in self._spent.items()) + " s wall/CPU"


class ClusterRun:
    """Plan, build and execute one scenario. ``progress(message, fraction)`` reports along.

    ``nic_backend`` (SmartNIC systems): a callable ``(run, nic_effects, work) -> nic_effects``
    that replaces the timing-model backend's NIC figures, e.g. ``sim.cosim.RTLNICBackend``
    (the NICs co-simulated in RTL; ``neonic run --backend rtl``); None: the timing models.
    ``line_gbps``: the NICs' line rate per port (Gb/s each way) in place of the network
    preset's (a sweep over line rates; None: the preset's).
    """

    def __init__(self, scenario: Scenario, progress: Progress | None = None,
                 nic_backend: Callable[[Any, Any, Any], Any] | None = None, plan: Any = None,
                 line_gbps: float | None = None) -> None:
        if line_gbps is not None and not (isinstance(line_gbps, (int, float)) and line_gbps > 0):
            raise ValueError(f"line_gbps: expected a line rate > 0 Gb/s, got {line_gbps!r}")
        self.line_gbps = line_gbps
        self.scenario = scenario
        self.progress = progress or (lambda message, fraction: None)
        self.nic_backend = nic_backend
        self.given_plan = plan
        self.stages = StageClock()

    # -------------------------------------------------------------------------- preparation
    def _topology(self):
        from neonic.sim.network.topology import Topology

        sc = self.scenario
        from neonic.sim.network.config import load_preset

        try:
            cfg = load_preset(sc.system.network).with_nodes(sc.nodes)
        except ValueError as error:
            raise ValueError(f"system.network: {error}") from None
        if sc.gpus_per_node is not None:
            # a smaller (or larger) node of the same links: validated by the network config
            try:
                cfg = cfg.with_gpus_per_node(sc.gpus_per_node)
            except ValueError as error:
                raise ValueError(f"cluster.gpus_per_node: {error}") from None
        # the node's host-memory link (system.host: PCIe on ZionEX, NVLink-C2C on GH200) is the
        # bandwidth of the topology's GPU-host links: one figure for copies, host-tier misses,
        # the planner's tier cost and the metrics
        from dataclasses import replace as _replace

        cfg = _replace(cfg, host_link=_replace(cfg.host_link, bandwidth_gbps=sc.system.host_link_gbytes_per_s * 8))
        if self.line_gbps is not None:
            cfg = _replace(cfg, nic=_replace(cfg.nic, bandwidth_gbps=float(self.line_gbps)))
        return Topology(cfg)

    def make_planner_system(self, topo) -> Any:
        """The planner's view of this scenario's cluster (``host.planner.PlannerSystem``): the
        network's figures for the run's algorithms, the memory tiers, the iteration's schedule."""
        from neonic.host.lookups import LookupsSpec, build_lookups
        from neonic.host.planner.system import PlannerSystem

        sc = self.scenario
        comm = _planner_comm(topo, sc.allreduce, sc.alltoall)
        memory = _memory_tiers(sc.system, topo)
        # the run's one lookup batch (drawn once: planner, SmartNIC caches, RTL backend)
        self.lookups = build_lookups(sc.workload, sc.lookups or LookupsSpec(), world=topo.nodes * topo.gpus_per_node,
                                     mode=sc.mode, seed=sc.seed,
                                     min_bags=sc.system.nic.trace_samples if sc.system.embeddings == "nic" else 0)
        from dataclasses import replace

        from neonic.host.iteration import allreduce_terms, comm_sm_share

        spec = replace(IterationSpec.from_scenario(sc), comm_sm_share=comm_sm_share(sc.system, topo),
                       **allreduce_terms(topo, sc.allreduce))
        return PlannerSystem(gpu=sc.system.gpu_spec, comm=comm, memory=memory, comm_dtype=sc.precision("forward"),
                             iteration=spec, lookups=self.lookups)

    def _plan(self, topo):
        """The plan the run executes: the one given (``plan=``), the scenario's plan file
        (``[planner] plan``), or the named planner's."""
        self.progress("the lookup batch and the planner's view of the cluster", 0.05)
        with self.stages("planner_system"):
            psys = self.make_planner_system(topo)
        with self.stages("planning"):
            plan = self._planned(psys)
        self.planner_system = psys
        return plan, psys

    def _planned(self, psys) -> Any:
        """:meth:`_plan`'s plan for the planner's system ``psys``."""
        from neonic.host.planner.api import make_plan
        from neonic.host.planner.cache import active_plan_cache
        from neonic.host.planner.plan_io import load_plan, plan_from_dict, plan_to_dict

        sc = self.scenario
        if self.given_plan is not None:
            # checked like a file: the same errors for a plan made elsewhere
            plan = plan_from_dict(plan_to_dict(self.given_plan), sc.workload, psys, source="plan")
            plan = type(plan)(plan.world_size, plan.gpus_per_node, plan.tables, self.given_plan.planner,
                              self.given_plan.notes)
        elif sc.plan_path is not None:
            plan = load_plan(sc.plan_path, sc.workload, psys)
        else:
            self.progress(f"planning the sharding ({sc.planner})", 0.1)

            def make() -> Any:
                return make_plan(sc.workload, psys, sc.planner, max_steps=sc.planner_max_steps,
                                 time_budget_s=sc.planner_budget_s,
                                 progress=lambda m: self.progress(f"planning the sharding ({sc.planner}): {m}", 0.1))

            # runs that share their planning inputs plan once (``neonic validate``, ``sweep``)
            cache = active_plan_cache()
            plan = make() if cache is None else cache.plan(sc.workload, psys, sc.planner, sc.planner_max_steps,
                                                            sc.planner_budget_s, make)
        return plan

    def run(self) -> RunResult:
        from neonic.host.planner.search import collector_paused
        from neonic.host.planner.work import derive_iteration

        t0 = time.perf_counter()
        sc = self.scenario
        self.stages = stages = StageClock()
        self.progress("topology", 0.02)
        with stages("topology"):
            topo = self._topology()
        self.progress("planning the sharding", 0.05)
        t_plan = time.perf_counter()
        plan, psys = self._plan(topo)
        t_built = time.perf_counter()
        with stages("planner_garbage"):
            # the planner leaves no reference cycles of its own (tested in test_planner); the
            # cost model's schedule templates leave about 1,500 objects (Op links) at 1024 GPUs.
            # One collection here (0.07 CPU-s) stays as the guard: the build runs with the
            # collector paused and the engine freezes what exists when it starts, so a cycle
            # a future planner change made would otherwise live through the whole run
            if gc.isenabled():
                gc.collect()
            release_heap()  # the planner's temporaries (gigabytes at 4096 GPUs) are freed by now
        self.progress(f"deriving one iteration's work (planned in {t_built - t_plan:.1f} s)", 0.2)
        # the work, the payloads, the op graph and the resources make hundreds of thousands of
        # objects that live through the engine (more at 4096 GPUs) and no garbage cycles; the
        # cyclic collector's passes over them found nothing and cost a quarter of building at
        # 1024 GPUs (gc.callbacks), so it sits out (collector_paused); the SmartNIC backend's
        # effects (an RTL co-simulation can make cycles) run with it
        with collector_paused(), stages("work"):
            work = derive_iteration(plan, sc.workload, psys)
        world = work.world_size
        self.plan, self.work, self.topology = plan, work, topo
        with stages("nic_effects"):
            dense = dense_costs(sc.system, sc.workload, sc.dense_dtype)
            nic = self._nic_effects(work, psys)
        with collector_paused():
            with stages("payloads"):
                payloads = iteration_payloads(sc, work, dense, psys, nic)
            self.tier_miss_bytes = payloads.pop("tier_miss_bytes")
            total_its = sc.warmup + sc.iterations
            emb_stream = {"gpu": "compute", "cpu": "cpu", "nic": "nic"}[sc.system.embeddings]
            if sc.system.embeddings == "nic":
                emb_stream = "compute"  # the NIC works inside the op; the remaining kernel is the GPU's
            self.progress("building the op graph", 0.3)
            spec = IterationSpec.from_scenario(sc)
            wire = WIRE_BYTES[spec.allreduce_dtype(psys.comm_dtype)]  # wire bytes per gradient element
            # PyTorch DDP's gradient buckets (host.gradients): the AllReduce overlaps the backward;
            # the planner's template builds the same graph (host.iteration.build_iteration_graph)
            with stages("graph"):
                buckets = iteration_buckets(spec, dense, work.dp_allreduce_bytes, lambda n: Collective(
                    "allreduce", nbytes=int(math.ceil(n * wire)), estimate_s=psys.comm.allreduce_time_s(n * wire, world)))
                graph = build_iteration_graph(spec, world, payloads, emb_stream, buckets)
            self.graph = graph
            self.progress(f"simulating {total_its} iterations on {world} GPUs ({len(graph.ops):,} ops; work, payloads "
                          f"and graph built in {time.perf_counter() - t_built:.1f} s)", 0.35)
            with stages("resources"):
                engine, backend, resources_ = self._build_resources(topo, world)
                clock = EngineProgress(graph)

        def report(message: str) -> None:
            self.progress(f"{message}; {clock.describe()}", 0.35 + 0.55 * clock.done / max(1, clock.n_ops))

        def on_op_done(op: Op) -> None:
            clock.op_done(op)
            if clock.done % max(1, clock.n_ops // 20) == 0:
                report(f"simulated {clock.done}/{clock.n_ops} ops")

        # one collective on thousands of GPUs can take minutes between op completions: every
        # 15 s of wall time, say where the network is (flows in flight, solves, simulated time)
        heartbeat = [time.perf_counter()]

        def on_solve(net) -> None:
            now = time.perf_counter()
            if now - heartbeat[0] >= 15.0:
                heartbeat[0] = now
                report(f"simulated {clock.done}/{clock.n_ops} ops, {engine.now * 1e-9:.3f} ms simulated; network: "
                       f"{net.active_flows:,} flows in flight, {net.solves:,} solves")

        resources_["net"].on_solve = on_solve
        runner = ScheduleRunner(engine, graph, backend, on_op_done)
        release_heap()  # the work's and the payloads' temporaries
        with stages("engine"):
            t_engine = clock.start()
            end_ps = runner.run()
            t_end = time.perf_counter()
        # where the wall time went: the planner, everything else before the engine (topology,
        # work, payloads, SmartNIC traces, graph), the engine (all iterations), metrics
        self.wall = {"setup_s": t_plan - t0, "planning_s": t_built - t_plan, "build_s": t_engine - t_built,
                     "engine_s": t_end - t_engine}
        self.progress(f"collecting metrics (the engine ran {t_end - t_engine:.1f} s)", 0.92)
        with stages("metrics"):
            result = collect_metrics(sc, graph, engine, end_ps, resources_, dense, plan, topo.gpus_per_node,
                                     self.nic_stats, self.nic_metrics, time.perf_counter() - t0, work=work, psys=psys,
                                     tier_miss_bytes=self.tier_miss_bytes, lookups=self.lookups)
        result.metrics["wall_breakdown_s"] = {**self.wall, "collect_s": time.perf_counter() - t_end}
        # stage by stage, wall and this process's CPU seconds (the planner's workers aside)
        result.metrics["wall_stages_s"] = stages.as_dict()
        self.progress(f"done in {time.perf_counter() - t0:.1f} s ({stages.describe()})", 1.0)
        return result

    def _nic_effects(self, work, psys) -> NICEffects | None:
        """The SmartNIC effects (timing models, or the NIC backend's figures); None off the
        SmartNIC system."""
        sc = self.scenario
        self.nic_stats: dict[str, float] = {}
        self.nic_metrics: dict[str, Any] = {}
        nic: NICEffects | None = None
        if sc.system.embeddings == "nic":
            self.progress("SmartNIC: cache hit rates on the lookup traces", 0.22)
            nic = nic_effects(sc, self.plan, work, psys)
            if self.nic_backend is not None:
                self.progress("SmartNIC: the NIC backend (e.g. RTL co-simulation)", 0.25)
                nic = self.nic_backend(self, nic, work)
            self.nic_stats = dict(nic.hit_rates)
            self.nic_metrics = dict(nic.figures)
        self.nic_effects = nic
        return nic

    def _build_resources(self, topo, world: int):
        from neonic.sim.network import collectives as coll
        from neonic.sim.network.network import Network

        sc = self.scenario
        sys_ = sc.system
        st = sys_.streams
        engine = Engine()
        net = Network(engine, topo)
        sampled = set(sample_ranks(world))  # their SM and HBM shares go to the timeline as counters
        gpus = [GPUDevice(engine, sys_.gpu_spec, name=f"gpu{r}", comm_priority=1 if st.comm_priority == "high" else 0,
                          sm_partition_comm=st.sm_partition_comm, collectives_on_dma=st.collectives_on_dma,
                          interference=st.interference, record=r in sampled) for r in range(world)]
        couple(net, gpus)  # the GPUs limit the flows their collective kernels feed (sim.interference)
        comm_links = collective_links(topo, list(range(world)))  # GB/s each rank's collectives drive
        from neonic.sim.memory_tiers import HostLink

        # the one PCIe model: copies, host-tier misses and NIC fills are flows on the topology's
        # GPU-host links, sharing them (and their counters) with everything else there
        host_link = HostLink(net, topo, record=set(sample_ranks(world)))
        nodes = (world + topo.gpus_per_node - 1) // topo.gpus_per_node
        sockets = [ServerPool(engine, sys_.host.sockets_per_node, name=f"cpu{n}") for n in range(nodes)]
        ranks = list(range(world))
        nics: list[Any] = []
        if sys_.embeddings == "nic":
            from neonic.sim.nic import NIC

            cfg = self.nic_effects.cfg if getattr(self, "nic_effects", None) is not None else nic_config(sys_.nic)
            keep = set(sample_ranks(world))
            nics = [NIC(engine, cfg, name=f"nic{r}", record=r in keep) for r in range(world)]

        trim_due = [False]  # a large collective ended (_let_go): trim the heap before the next starts

        def all_of(parts: int, done: Callable[[int, int], None]) -> Callable[[int, int], None]:
            """A completion that fires ``done(start, end)`` once ``parts`` pieces have ended."""
            start = engine.now
            left = [parts]

            def piece(_s: int, _e: int) -> None:
                left[0] -= 1
                if left[0] == 0:
                    done(start, engine.now)
            return piece

        def backend(op: Op, done: Callable[[int, int], None]) -> None:
            payload = op.payload
            start = engine.now
            if isinstance(payload, KernelCost):
                gpus[op.rank].launch(payload, done)
            elif isinstance(payload, Copy):
                host_link.transfer(op.rank, payload.nbytes, payload.to_gpu, done, kind=payload.kind,
                                   label=f"{op.phase}[{op.iteration}]")
            elif isinstance(payload, CPUJob):
                sockets[payload.node].submit(ps_from_s(payload.seconds), done)
            elif isinstance(payload, Collective):
                if trim_due[0]:  # a large collective's arrays were freed since it ended
                    trim_due[0] = False
                    release_heap()
                # the collective's kernel runs on every rank from its start until the network
                # delivers its last byte: channels (SMs) or copy engines, HBM by the bytes it moves
                rf = REDUCE_FRACTION["alltoallv" if payload.kind == "alltoallv" else "allreduce"]
                on = [gpus[r] for r in op.ranks]
                held = comm_begin_all(on, [float(comm_links[r]) for r in op.ranks], rf)

                finish = done
                if payload.nic_ps is not None and nics:
                    # the NICs on the path packetize their inter-node bytes while the network
                    # carries them; the collective ends when both are through
                    busy = [(r, d) for r, d in enumerate(payload.nic_ps) if d > 0]
                    finish = all_of(1 + len(busy), done)
                    for r, d in busy:
                        nics[r].run({"packetizer": d}, finish, label=f"{op.phase}[{op.iteration}]")

                def net_done(coll_handle: Any) -> None:
                    trim_due[0] |= _let_go(coll_handle)  # (before the ops it frees start)
                    comm_end_all(on, held)
                    finish(start, engine.now)

                if payload.kind == "alltoallv":
                    coll.alltoallv(net, ranks, payload.matrix, algorithm=sc.alltoall, on_done=net_done)
                else:
                    coll.allreduce(net, ranks, payload.nbytes, algorithm=sc.allreduce, on_done=net_done)
            elif isinstance(payload, NICJob):
                # the GPU kernel, the NIC units and the PCIe transfers run side by side
                units = {u: d for u, d in payload.units if d > 0}
                parts = 1 + (1 if units else 0) + (1 if payload.pcie_bytes > 0 else 0)
                finish = all_of(parts, done)
                gpus[op.rank].launch(payload.gpu, finish)
                if units:
                    nics[op.rank].run(units, finish, label=f"{op.phase}[{op.iteration}]")
                if payload.pcie_bytes > 0:
                    host_link.transfer(op.rank, payload.pcie_bytes, payload.to_gpu, finish, kind=payload.kind,
                                       label=f"{op.phase}[{op.iteration}]")
            else:
                raise TypeError(f"op {op!r}: no backend for payload {type(payload).__name__}")

        self.net = net
        return engine, backend, {"gpus": gpus, "host_link": host_link, "sockets": sockets, "net": net, "nics": nics}

    # ------------------------------------------------------------------------------ metrics


def _let_go(handle: Any) -> bool:
    """Drop a finished collective's flow groups (``CollectiveHandle.groups``) once the run has
    taken its end: nothing here reads them again. Each group names its handle (``tag``,
    ``on_done``) and the handle its groups, a reference cycle that only the cyclic collector
    breaks, so without this an AlltoAllv's per-flow arrays (its 16.8M flows at 4096 GPUs) stay
    resident until a full collection happens to run, possibly beside the next AlltoAllv's
    solve. Returns whether it was a large collective (``_RELEASE_MIN_FLOWS`` flows or more),
    whose freed pages the C heap should give back (:func:`release_heap`) once they are free."""
    groups = getattr(handle, "groups", None)
    if not isinstance(groups, list):
        return False
    large = sum(g.size for g in groups if g is not None) >= _RELEASE_MIN_FLOWS
    groups[:] = [None] * len(groups)
    return large


#: a finished collective of at least this many flows gives the C heap's free pages back
_RELEASE_MIN_FLOWS = 1 << 20


@functools.lru_cache(maxsize=1)
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (None elsewhere: other C libraries, other systems)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def release_heap() -> bool:
    """Give the C heap's free pages back to the system (glibc: ``malloc_trim(0)``); True where
    it could be asked. Numpy's arrays of a few MiB come from the heap (glibc raises its mmap
    threshold as mmapped arrays are freed), and the pages of those freed stay resident, on top
    of every later peak: at 4096 GPUs (measured 2026-11-26) 0.15 GiB after planning, 1.13 GiB
    after the work, payloads and graph (2.99 -> 1.86 GiB), 0.4-0.8 GiB after each large
    AlltoAllv. Results do not change: only where free memory sits."""
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True


def _memory_tiers(system, topo):
    """The planner's memory tiers from the system's ``[host]`` (the host-memory tier and its
    HBM cache) and the topology's GPU-host link (``sim.memory_tiers``). Zion keeps its
    embeddings in the CPU sockets' DRAM."""
    from neonic.host.planner.system import MemoryTiers

    h = system.host
    dram = h.dram_gib_per_node
    if system.embeddings == "cpu":
        dram = CPU_PRESETS[h.cpu].dram_gib * h.sockets_per_node
    return MemoryTiers(dram_gib_per_node=dram, ssd_gib_per_node=h.ssd_gib_per_node,
                       cache_load_factor=h.cache_load_factor, ssd_gbytes_per_s=h.ssd_gbytes_per_s,
                       cache_ways=h.cache_ways, cache_policy=h.cache_policy,
                       host_link_gbytes_per_s=topo.config.host_link.bandwidth_gbps / 8, link=h.link)


def _planner_comm(topo, allreduce: str = "hierarchical", alltoall: str = "direct"):
    """The planner's alpha-beta view of the topology (``host.planner``'s one home of it: the
    network model's closed-form estimates for the algorithms the run uses, or the topology's
    configured figures)."""
    from neonic.host.planner.system import AlphaBetaComm

    return AlphaBetaComm.from_topology(topo, allreduce_algorithm=allreduce, alltoall_algorithm=alltoall)
