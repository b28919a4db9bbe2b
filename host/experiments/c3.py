"""Concurrent computation and communication (C3): how much of the ideal overlap is realized.

For every GEMM, collective and size: ``C`` is the GEMM's time alone on every GPU, ``M`` the
collective's time alone (network plus its GPU-side share), ``serial = C + M``; ``concurrent``
is the time with both started together. Ideal speedup ``(C + M) / max(C, M)``; realized
``serial / concurrent``; fraction of ideal ``(realized - 1) / (ideal - 1)`` (C3's measure).
Each lever setting changes how the collective shares the GPU (``sim.resources.GPUDevice``):
SM-resident collectives hold ``comm_sm_fraction`` of the SMs (taken from a reserved partition
when ``sm_partition_comm`` > 0, which the GEMM then cannot use), collectives on the copy
engines hold HBM bandwidth only; co-running work loses ``interference`` of each capacity.
The isolated times use an unpartitioned GPU. Every figure is a prediction; REFERENCES.md gives
C3's definitions, not figures.
"""

from __future__ import annotations

from typing import Any, Callable

from neonic.host.experiments._common import Checker, ExperimentResult, Timer, item_choice, item_num

TITLE = "Concurrent compute and communication (C3): realized vs ideal overlap"
COLLECTIVES = ("alltoall", "all_gather")
_KNOWN = ("system", "nodes", "collectives", "sizes_mib", "dtype", "gemms", "levers")
_LEVER_FIELDS = ("comm_priority", "sm_partition_comm", "collectives_on_dma", "comm_sm_fraction", "comm_hbm_fraction", "interference")


def check_config(data: dict[str, Any]) -> dict[str, Any]:
    from neonic.host.systems import resolve_system

    c = Checker(data, "c3", _KNOWN)
    system = c.choice("system", ("zionex", "zion", "smartnic"), "zionex")
    gemms = []
    for i, g in enumerate(c.list("gemms", lambda where, v: v)):
        gc = Checker(g, f"c3.gemms[{i}]", ("m", "n", "k", "repeat"))
        gemms.append({"m": gc.int("m", None, 1), "n": gc.int("n", None, 1), "k": gc.int("k", None, 1),
                      "repeat": gc.int("repeat", 1, 1)})
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
        "collectives": c.list("collectives", item_choice(COLLECTIVES)),
        "sizes_mib": c.list("sizes_mib", item_num(0)),
        "dtype": c.choice("dtype", ("fp16", "bf16", "tf32", "fp32"), "fp16"),
        "gemms": gemms,
        "levers": checked,
    }


def _measure(system, topo, gemm, collective: str | None, nbytes: int, with_compute: bool, partitioned: bool) -> tuple[float, float]:
    """(compute end, communication end) in seconds for one setting; None parts give 0."""
    from neonic.sim.engine import Engine, s_from_ps
    from neonic.sim.network import collectives as coll
    from neonic.sim.network.network import Network
    from neonic.sim.resources import GPUDevice

    st = system.streams
    engine = Engine()
    world = topo.num_gpus
    parts = {"comm": st.sm_partition_comm} if partitioned and st.sm_partition_comm > 0 else None
    gpus = [GPUDevice(engine, system.gpu_spec, name=f"gpu{r}", sm_partitions=parts, interference=st.interference,
                      comm_sm_fraction=st.comm_sm_fraction) for r in range(world)]
    ends = {"compute": 0, "comm": 0}

    def compute_done(_start: int, end: int) -> None:
        ends["compute"] = max(ends["compute"], end)

    if collective is not None:
        held = [g.comm_begin(st.comm_hbm_fraction * system.gpu_spec.hbm_bytes_per_s, on_dma=st.collectives_on_dma,
                             partition="comm" if parts else None) for g in gpus]
        net = Network(engine, topo)

        def comm_done(handle) -> None:
            for g, h in zip(gpus, held):
                g.comm_end(h)
            ends["comm"] = engine.now

        ranks = list(range(world))
        if collective == "alltoall":
            coll.alltoall(net, ranks, max(1, nbytes // world), on_done=comm_done)
        else:
            coll.all_gather(net, ranks, nbytes, on_done=comm_done)
    if with_compute:
        priority = 0
        for g in gpus:
            g.launch(gemm, compute_done, priority=priority)
    engine.run()
    return s_from_ps(ends["compute"]), s_from_ps(ends["comm"])


def run(config: dict[str, Any], progress: Callable[[str], None]) -> ExperimentResult:
    from neonic.sim.gpu import KernelCost, gemm_cost
    from neonic.sim.network.topology import Topology

    from neonic.host.systems import resolve_system

    timer = Timer()
    topo = Topology.from_preset(resolve_system(config["system"]).network, nodes=config["nodes"])
    base = resolve_system(config["system"])
    rows: list[dict[str, Any]] = []
    for g in config["gemms"]:
        one = gemm_cost(base.gpu_spec, g["m"], g["n"], g["k"], config["dtype"])
        gemm = KernelCost()
        for _ in range(g["repeat"]):
            gemm = gemm + one
        label = f"{g['m']}x{g['n']}x{g['k']}" + (f" x{g['repeat']}" if g["repeat"] > 1 else "")
        c_alone, _ = _measure(base, topo, gemm, None, 0, True, False)
        for collective in config["collectives"]:
            for mib in config["sizes_mib"]:
                nbytes = int(mib * 2**20)
                progress(f"c3: GEMM {label} with {collective} of {mib:g} MiB")
                for lever, setting in config["levers"].items():
                    system = resolve_system({"preset": config["system"], "streams": setting})
                    _, m_alone = _measure(system, topo, gemm, collective, nbytes, False, True)
                    c_end, m_end = _measure(system, topo, gemm, collective, nbytes, True, True)
                    concurrent = max(c_end, m_end)
                    serial = c_alone + m_alone
                    ideal = serial / max(c_alone, m_alone)
                    realized = serial / concurrent
                    fraction = (realized - 1) / (ideal - 1) if ideal > 1 + 1e-12 else float("nan")
                    rows.append({"gemm": label, "collective": collective, "size_mib": mib, "lever": lever,
                                 "compute_ms": c_alone * 1e3, "comm_ms": m_alone * 1e3, "serial_ms": serial * 1e3,
                                 "concurrent_ms": concurrent * 1e3, "compute_overlapped_ms": c_end * 1e3,
                                 "ideal_speedup": ideal, "realized_speedup": realized, "fraction_of_ideal": fraction})
    metrics: dict[str, Any] = {}
    for lever in config["levers"]:
        mine = [r["fraction_of_ideal"] for r in rows if r["lever"] == lever and r["fraction_of_ideal"] == r["fraction_of_ideal"]]
        metrics[lever] = {"mean_fraction_of_ideal": sum(mine) / len(mine) if mine else None,
                          "mean_realized_speedup": sum(r["realized_speedup"] for r in rows if r["lever"] == lever)
                          / max(1, sum(1 for r in rows if r["lever"] == lever))}
    notes = [
        "Every figure is a prediction; REFERENCES.md gives C3's definitions (ideal speedup, fraction of ideal), not figures.",
        "Stream priority orders kernels between streams; here the collective holds a reservation of SMs/HBM rather than "
        "running as a kernel, so comm_priority alone does not change these figures (the cluster runtime's modelling choice).",
        "Isolated times use an unpartitioned GPU; with sm_partition_comm the GEMM runs on the remaining SMs while overlapped.",
        "The network model does not slow a collective when its GPU is busy (the cluster runtime's modelling choice), so "
        "where the collective dominates (M > C) the overlap comes out ideal; C3 measures communication slowed too.",
    ]
    res = ExperimentResult("c3", TITLE, config, rows, metrics, notes, wall_s=timer.elapsed)
    res.plots = {"fraction_of_ideal.png": lambda f: _plot(f, rows, config)}
    return res


def _plot(fig, rows, config) -> None:
    for i, collective in enumerate(config["collectives"]):
        ax = fig.add_subplot(1, len(config["collectives"]), i + 1)
        for lever in config["levers"]:
            for gemm in dict.fromkeys(r["gemm"] for r in rows):
                mine = [r for r in rows if r["lever"] == lever and r["collective"] == collective and r["gemm"] == gemm]
                ax.plot([r["size_mib"] for r in mine], [r["fraction_of_ideal"] for r in mine], marker="o",
                        label=f"{lever}, {gemm}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"{collective} size (MiB)")
        ax.set_ylabel("fraction of ideal speedup")
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(collective)
        ax.legend(fontsize=6)
