"""The simulators a co-simulation runs on: Amaranth's simulator on the design (one simulation
per phase), or the exported Verilog under cocotb (Icarus: both phases in one simulator
process). Verilator runs natively (``sim.cosim.native``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from neonic.rtl.cache import CacheOp
from neonic.rtl.smartnic import SmartNIC, counter_names
from neonic.sim.cosim.stimulus import Stimulus
from neonic.sim.cosim.traffic import endpoint
from neonic.sim.reference.roce import frame_beats

__all__ = ["SIMULATORS", "resolve_sim", "amaranth_phase", "cocotb_cosim"]

SIMULATORS = ("auto", "amaranth", "verilator", "icarus")



def resolve_sim(sim: str) -> str:
    """``"auto"`` -> Verilator when installed, else Amaranth; others are checked."""
    from neonic.sim.harness import available_simulators

    if sim not in SIMULATORS:
        raise ValueError(f"sim: expected one of {', '.join(SIMULATORS)}, got {sim!r}")
    if sim == "auto":
        return "verilator" if "verilator" in available_simulators() else "amaranth"
    if sim != "amaranth" and sim not in available_simulators():
        raise ValueError(f"sim: {sim!r} is not installed here; available: amaranth, "
                         f"{', '.join(available_simulators()) or '(no HDL simulator)'}")
    return sim


def _counters_dict(view) -> dict[str, int]:
    return {name: int(getattr(view, name)) for name in counter_names()}


def amaranth_phase(nic: SmartNIC, stim: Stimulus, phase: str,
                    rx_frames: list[list[bytes]] | None, rx_mem: np.ndarray | None, *,
                    seed: int, idle: float, backpressure: float
                    ) -> tuple[list[dict], np.ndarray | None, dict]:
    """One phase for every NIC in one Amaranth simulation; returns per NIC
    ``{"counters", "frames", "cycles", "completions"}``, the receive memory, and the
    simulation phase's ``{"wall_s", "cycles"}`` (from the testbench's start, after
    elaboration, to its end)."""
    from amaranth.hdl import ResetInserter, Signal

    from neonic.sim.harness import AmaranthMemory, run_amaranth

    W = nic.data_bytes
    rst = Signal()
    top = ResetInserter({"sync": rst})(nic)
    rng = np.random.default_rng([seed, 0 if phase == "tx" else 1])
    mem = AmaranthMemory(nic.mem, stim.mem.copy(), data_bytes=W, rng=rng,
                         latency=(stim.memory_latency, stim.memory_latency), max_outstanding=64)
    rxm = AmaranthMemory(nic.rx_mem, rx_mem if rx_mem is not None
                         else np.zeros(stim.rx_size, np.uint8), data_bytes=W, rng=rng,
                         latency=(1, 1), max_outstanding=64)
    results: list[dict] = []
    total_work = sum(len(t["items"]) * 8 + 40 * t["frames"] for t in stim.tx) + \
        sum(len(f) for fs in (rx_frames or []) for f in fs) // W * 2
    budget = 20000 + 40 * total_work

    async def drive(ctx, sources, sinks, done):
        """Drive several streams from one coroutine: ``sources`` [(stream, payloads)],
        ``sinks`` [(stream, list)]; until ``done()`` with every source sent."""
        pos = [0] * len(sources)
        offered = [False] * len(sources)
        for s, _ in sinks:
            ctx.set(s.ready, 1)
        while True:
            for i, (s, items) in enumerate(sources):
                if not offered[i] and pos[i] < len(items) and not (idle and rng.random() < idle):
                    ctx.set(s.payload, items[pos[i]])
                    ctx.set(s.valid, 1)
                    offered[i] = True
            for s, _ in sinks:
                ctx.set(s.ready, int(not (backpressure and rng.random() < backpressure)))
            sampled = [x for s, _ in sources for x in (s.ready,)] + \
                [x for s, _ in sinks for x in (s.valid, s.ready, s.payload)]
            values = (await ctx.tick().sample(*sampled))[2:]
            k = len(sources)
            for i, (s, _) in enumerate(sources):
                if offered[i] and values[i]:
                    pos[i] += 1
                    offered[i] = False
                    ctx.set(s.valid, 0)
            for j, (s, out) in enumerate(sinks):
                v, r, p = values[k + 3 * j:k + 3 * j + 3]
                if v and r:
                    out.append(p)
            if all(p == len(items) for p, (_, items) in zip(pos, sources)) and done():
                for s, _ in sinks:
                    ctx.set(s.ready, 0)
                return

    async def reset(ctx):
        ctx.set(rst, 1)
        await ctx.tick()
        ctx.set(rst, 0)

    sim_phase = {"wall_s": 0.0, "cycles": 0}

    async def tb(ctx):
        wall0 = time.perf_counter()
        await phase_body(ctx)
        sim_phase["wall_s"] = time.perf_counter() - wall0

    async def phase_body(ctx):
        for k, t in enumerate(stim.tx):
            await reset(ctx)
            mac, ip = endpoint(t["rank"])
            ctx.set(nic.local_mac, mac)
            ctx.set(nic.local_ip, ip)
            if phase == "tx":
                await drive(ctx, [(nic.cache_cmd, [CacheOp.INVALIDATE]), (nic.desc, t["descs"]),
                                  (nic.dest, t["dests"])], [], lambda: True)
                beats: list = []
                frames: list[bytes] = []
                cur = bytearray()

                def collected():
                    nonlocal cur
                    while beats:
                        b = beats.pop(0)
                        cur += int(b.data).to_bytes(W, "little")[:int(b.count)]
                        if b.last:
                            frames.append(bytes(cur))
                            cur = bytearray()
                    return len(frames) >= t["frames"]
                await drive(ctx, [(nic.bags, t["items"]), (nic.send, t["sends"])],
                            [(nic.tx_frame, beats)], collected)
                for _ in range(4):
                    await ctx.tick()
                results.append({"counters": _counters_dict(ctx.get(nic.counters)),
                                "frames": frames})
            else:
                await drive(ctx, [(nic.qp_init, [{"qp": q, "psn": 0}
                                                 for q in range(len(stim.tx))])], [], lambda: True)
                expect = sum(1 for o in stim.tx for s in o["sends"] if s["dest"] == t["rank"])
                comps: list = []
                beats_in = frame_beats(rx_frames[k], W)
                await drive(ctx, [(nic.rx_frame, beats_in)], [(nic.completion, comps)],
                            lambda: len(comps) >= expect)
                for _ in range(4):
                    await ctx.tick()
                results.append({"counters": _counters_dict(ctx.get(nic.counters)),
                                "completions": len(comps)})

    sim_phase["cycles"] = run_amaranth(top, [tb], processes=[mem.process, rxm.process],
                                       max_cycles=budget)
    return results, (rxm.contents if phase == "rx" else None), sim_phase


def cocotb_cosim(stim: Stimulus, sim: str, *, seed: int, idle: float, backpressure: float,
                 workdir: Path) -> tuple[list[dict], list[dict], np.ndarray, dict]:
    """Both phases of every NIC in one cocotb run of the exported top (``tb_smartnic``: send
    side, the frames routed in the bench, receive side). Returns per NIC the send results
    (``{"counters", "frames"}``) and receive results (``{"counters", "completions"}``), the
    receive memory, and the bench's own measure of its NIC loops ``{"wall_s", "cycles"}``. The
    Verilog export is cached by parameters and RTL sources, so a rerun elaborates nothing."""
    from neonic.sim.harness import read_tb_figures, run_cocotb

    workdir.mkdir(parents=True, exist_ok=True)
    params = {k: (list(v) if isinstance(v, tuple) else v) for k, v in stim.params.items()}
    job = {"params": params, "tx": stim.tx, "rx_size": stim.rx_size,
           "memory_latency": stim.memory_latency, "idle": idle, "backpressure": backpressure}
    job_path = workdir / "job.json"
    job_path.write_text(json.dumps(job))
    np.save(workdir / "mem.npy", stim.mem)
    out_path = workdir / "out.json"
    out_path.unlink(missing_ok=True)
    kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in params.items()}
    results_xml = run_cocotb(lambda: SmartNIC(**kw), "smartnic", "tb_smartnic", sim=sim,
                             seed=seed, export_key=params,
                             params={"job": str(job_path), "out": str(out_path),
                                     "mem": str(workdir / "mem.npy")},
                             timeout_s=600)
    read_tb_figures(results_xml)
    out = json.loads(out_path.read_text())
    tx = [{"counters": r["counters"], "frames": [bytes.fromhex(f) for f in r["frames"]]}
          for r in out["tx"]]
    rx = [{"counters": r["counters"], "completions": r["completions"]} for r in out["rx"]]
    return tx, rx, np.load(workdir / "rx.npy"), dict(out["sim_phase"])
