"""One co-simulated iteration (:func:`run_cosim`) and the cluster runtime's RTL backend
(:class:`RTLNICBackend`)."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from neonic.rtl.roce import DROP_REASONS
from neonic.rtl.smartnic import SmartNIC
from neonic.sim.calibration import Calibration, Sample, default_calibration
from neonic.sim.cosim.models import calibration_sample, model_cycles, reference_cache
from neonic.sim.cosim.network import cluster_topology, network_time_s, route_frames, write_pcaps
from neonic.sim.cosim.report import CosimReport, NICRun, unit_window
from neonic.sim.cosim.runners import amaranth_phase, cocotb_cosim, resolve_sim
from neonic.sim.cosim.stimulus import DEFAULT_MEMORY_LATENCY, build_stimulus, expected_buffers
from neonic.sim.cosim.traffic import Traffic, traffic_from_plan
from neonic.sim.harness.verilog import parameters_only

__all__ = ["run_cosim", "collect_samples", "RTLNICBackend", "default_processes",
           "PARALLEL_MIN_ITEMS"]


#: Bag items per worker process below which the NICs run in this process: starting workers
#: (fork, loading the model, cold caches) costs more than a small cluster's whole loop (a 2 x 2
#: cluster of a few hundred cycles per NIC: 0.15 s in one process, 0.22 s in two, measured).
PARALLEL_MIN_ITEMS = 20_000


def default_processes(stim) -> int:
    """Worker processes for a Verilator co-simulation of ``stim``: one per NIC, at most one
    per CPU, and 1 (this process) when the work per process is small."""
    items = sum(len(t["items"]) for t in stim.tx)
    cpus = os.cpu_count() or 1
    procs = max(1, min(len(stim.tx), cpus, items // PARALLEL_MIN_ITEMS))
    return procs


def run_cosim(traffic: Traffic, *, sim: str = "auto", nic: SmartNIC | None = None,
              calibration: Calibration | None = None, topology: Any = None,
              memory_latency: int = DEFAULT_MEMORY_LATENCY, seed: int = 1, idle: float = 0.0,
              backpressure: float = 0.0, workdir: Path | None = None,
              processes: int | None = None,
              progress: Callable[[str], None] | None = None,
              pcap_dir: Path | str | None = None) -> CosimReport:
    """Run ``traffic`` through one RTL SmartNIC per rank (see the module docstring).

    ``idle``/``backpressure`` add random idle cycles on the inputs and backpressure on the
    outputs (functional checks; cycle comparisons want both 0). ``topology``: a ``sim.network``
    topology that times the frames (default: the ZionEX links at the traffic's shape).
    ``processes``: worker processes for the NICs on Verilator (default
    :func:`default_processes`; 1 runs them in this process). ``pcap_dir``: write each NIC's
    frames there (:func:`~neonic.sim.cosim.network.write_pcaps`: sent, then received in arrival
    order).
    """
    say = progress or (lambda message: None)
    sim = resolve_sim(sim)
    nic = nic or SmartNIC()
    if sim != "amaranth":
        parameters_only(nic)       # the design runs from its (cached) Verilog
    if topology is None:
        topology = cluster_topology(traffic.world, traffic.gpus_per_node)
    stim = build_stimulus(nic, traffic, memory_latency=memory_latency)
    t0 = time.perf_counter()
    world = traffic.world
    say(f"cosim: {world} NICs on {sim}, send side, network, receive side")
    if sim == "verilator":
        from neonic.sim.cosim.native import build_library, run_phases

        lib = build_library(stim.params)
        procs = processes if processes is not None else default_processes(stim)
        tx_res, rx_res, rx_mem = run_phases(lib, stim, seed=seed, idle=idle,
                                            backpressure=backpressure, processes=procs,
                                            route=lambda frames: route_frames(frames, world))
        tx = [{"counters": r.counters, "frames": r.frames} for r in tx_res]
        rx = [{"counters": r.counters, "completions": r.completions} for r in rx_res]
        # the simulation loops alone (in C++), summed over the NICs and processes
        sim_phase = {"wall_s": sum(r.loop_s for r in (*tx_res, *rx_res)),
                     "cpu_s": sum(r.loop_cpu_s for r in (*tx_res, *rx_res)),
                     "cycles": sum(r.cycles for r in (*tx_res, *rx_res))}
    elif sim == "icarus":
        from neonic.sim.harness import resolve_build_root

        key = hashlib.sha256(json.dumps(stim.tx, sort_keys=True).encode()).hexdigest()[:12]
        workdir = workdir or resolve_build_root() / "cosim" / key
        tx, rx, rx_mem, sim_phase = cocotb_cosim(stim, sim, seed=seed, idle=idle,
                                                 backpressure=backpressure, workdir=workdir)
    else:
        tx, _, tx_phase = amaranth_phase(nic, stim, "tx", None, None, seed=seed, idle=idle,
                                         backpressure=backpressure)
        arrivals = route_frames([r["frames"] for r in tx], world)
        rx, rx_mem, rx_phase = amaranth_phase(nic, stim, "rx", arrivals, None, seed=seed,
                                              idle=idle, backpressure=backpressure)
        sim_phase = {"wall_s": tx_phase["wall_s"] + rx_phase["wall_s"],
                     "cycles": int(tx_phase["cycles"] + rx_phase["cycles"])}
    frames = [r["frames"] for r in tx]
    say(f"cosim: {sum(len(f) for f in frames)} frames through the network model")
    net_s = network_time_s(frames, world, topology)
    wall = time.perf_counter() - t0
    if pcap_dir is not None:
        say(f"cosim: captures in {pcap_dir}")
        write_pcaps(pcap_dir, frames, route_frames(frames, world))

    expected = expected_buffers(nic, traffic, stim)
    diff = int(np.count_nonzero(rx_mem != expected))
    cal = calibration or default_calibration(memory_latency, nic.params["mshrs"])
    runs = []
    misses_ok = True
    drops = 0
    cycles = 0
    for job, t, tr, rr in zip(traffic.jobs, stim.tx, tx, rx):
        rtl = {u: unit_window(tr["counters"], u) for u in ("gather", "cache", "packetizer")}
        rtl["depacketizer"] = unit_window(rr["counters"], "depacketizer")
        rx_lengths = [s.length for j in traffic.jobs for s in j.sends if s.dest == job.rank]
        sample = calibration_sample(nic, job, t, rx_lengths, rtl, label=f"nic{job.rank}",
                                    memory_latency=memory_latency)
        cref = reference_cache(nic, job, [d["base"] for d in t["descs"]])
        misses_ok &= tr["counters"]["cache_misses"] == cref["misses"]
        drops += sum(rr["counters"][f"rx_{r}"] for r in DROP_REASONS)
        cycles += tr["counters"]["cycles"] + rr["counters"]["cycles"]
        runs.append(NICRun(job.rank, rtl, model_cycles(sample, cal), tr["counters"],
                           rr["counters"], cref, len(tr["frames"]), rr["completions"]))
    return CosimReport(sim, traffic.label, traffic.world, traffic.gpus_per_node, runs,
                       diff == 0, diff, misses_ok, drops, net_s, cycles, wall,
                       sim_wall_s=sim_phase["wall_s"], sim_cycles=sim_phase["cycles"],
                       sim_cpu_s=sim_phase.get("cpu_s"),
                       calibration={"parameters": cal.parameters(),
                                    "source": cal.context.get("source", "file")})


def collect_samples(report: CosimReport, traffic: Traffic, nic: SmartNIC,
                    memory_latency: int = DEFAULT_MEMORY_LATENCY) -> list[Sample]:
    """Calibration samples (one per NIC) from a finished co-simulation."""
    stim = build_stimulus(nic, traffic, memory_latency=memory_latency)
    out = []
    for job, t, run in zip(traffic.jobs, stim.tx, report.nics):
        rx_lengths = [s.length for j in traffic.jobs for s in j.sends if s.dest == job.rank]
        out.append(calibration_sample(nic, job, t, rx_lengths, run.rtl,
                                      label=f"{traffic.label}/nic{job.rank}",
                                      memory_latency=memory_latency))
    return out


class RTLNICBackend:
    """The RTL backend of the cluster runtime's SmartNICs (``neonic run --backend rtl``).

    ``host.cluster.ClusterRun(..., nic_backend=RTLNICBackend(...))`` calls it once per run with
    the run (its ``scenario``, ``plan`` and ``topology``), the timing-model backend's NIC effects
    and the iteration's work. It co-simulates the iteration's forward embedding traffic on one
    RTL SmartNIC per rank (:func:`run_cosim`, traffic from :func:`traffic_from_plan`) and
    returns the effects with the NICs' forward unit times (``cache``, ``gather``) taken from
    the RTL's cycle counts at the NIC clock; the co-simulation's report (RTL and model cycles
    side by side, the bit-exact check) goes to ``figures["rtl_cosim"]`` (the run's
    ``metrics["nic"]``) and to :attr:`report`. Everything else (caches' hit rates at the
    configured capacity, PCIe, AlltoAll matrices) stays the model's: the RTL instances are
    small (``rtl.smartnic.SmartNIC`` defaults) and hold whole tables in simulated memory.
    """

    def __init__(self, *, sim: str = "auto", calibration: Calibration | None = None,
                 nic: SmartNIC | None = None, memory_latency: int = DEFAULT_MEMORY_LATENCY,
                 progress: Callable[[str], None] | None = None,
                 pcap_dir: Path | str | None = None):
        self.sim = resolve_sim(sim)
        self.pcap_dir = pcap_dir
        self.calibration = calibration
        self.nic = nic
        self.memory_latency = memory_latency
        self.progress = progress
        self.report: CosimReport | None = None

    def __call__(self, run: Any, effects: Any, work: Any) -> Any:
        from dataclasses import replace

        sc = run.scenario
        if effects is None:
            raise ValueError("--backend rtl: the system has no SmartNICs (system.embeddings must "
                             "be \"nic\", e.g. system preset \"smartnic\")")
        world = work.world_size
        nic = self.nic or SmartNIC(num_dest=max(16, world), num_qps=max(16, world))
        traffic = traffic_from_plan(run.plan, sc.workload.tables,
                                    batch_per_gpu=sc.workload.batch_per_gpu, world=world,
                                    gpus_per_node=work.gpus_per_node, lanes=nic.lanes,
                                    seed=sc.seed, lookups=effects.lookups)
        traffic.label = f"{sc.name} (iteration traffic of the plan)"
        if not any(job.bags for job in traffic.jobs):
            raise ValueError("--backend rtl: the plan leaves the NICs no embedding traffic "
                             "(every table data-parallel)")
        self.report = run_cosim(traffic, sim=self.sim, nic=nic, calibration=self.calibration,
                                topology=getattr(run, "topology", None),
                                memory_latency=self.memory_latency, seed=sc.seed,
                                progress=self.progress, pcap_dir=self.pcap_dir)
        hz = effects.cfg.clock_hz
        units = []
        for n in self.report.nics:
            units.append(tuple((u, int(round(n.rtl[u] * 1e12 / hz)))
                               for u in ("cache", "gather") if n.rtl.get(u)))
        figures = dict(effects.figures)
        figures["rtl_cosim"] = self.report.as_dict()
        return replace(effects, fwd_units=units, figures=figures)
