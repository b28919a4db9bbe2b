"""The AlltoAll depacketizer as the command line sees it (``neonic rtl export|sim depacketizer``).

``simulate`` sends the reference frames of the packetizer's default message set, with broken
frames interleaved (one per reason in :data:`BROKEN`, plus a corrupted copy of a packet inside
a multi-packet message), and holds the memory written, the completions and the drop counters
to the reference receiver (``sim.reference.roce.Receiver``) and to the drops the broken frames
were built to cause.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import numpy as np

from neonic.sim.units import SimRequest
from neonic.sim.units.packetizer import (LOCAL_IP, LOCAL_MAC, RxRun, _write_pcap,
                                         default_messages, load_messages, memory_written, run_rx)
from neonic.rtl.depacketizer import Depacketizer
from neonic.rtl.roce import DROP_REASONS, check_data_bytes, check_pmtu
from neonic.rtl.streams import check_int
from neonic.sim.reference.roce import PSN_MODULUS, Destination, Message, Receiver, build_frames

__all__ = ["build", "parse_params", "workload", "user_workload", "simulate", "BROKEN"]

DEFAULTS: dict[str, int] = {"data_bytes": 64, "pmtu": 4096, "num_qps": 16}

#: The broken frames interleaved between messages, by the drop reason each must cause.
BROKEN = ("icrc", "udp_port", "psn", "qp")


def parse_params(params: dict[str, str]) -> dict[str, int]:
    """``--param`` strings to constructor arguments, each checked against its range."""
    out: dict[str, int] = {}
    for key, value in params.items():
        if key not in DEFAULTS:
            raise ValueError(f"--param {key}: unknown parameter; expected one of "
                             f"{', '.join(sorted(DEFAULTS))}")
        try:
            out[key] = int(value, 0)
        except ValueError:
            raise ValueError(f"{key}: expected an integer, got {value!r}") from None
    # Checked here too (the constructor checks the same) so that a refused value leaves no
    # half-built component behind.
    check_data_bytes(out.get("data_bytes", DEFAULTS["data_bytes"]))
    check_pmtu(out.get("pmtu", DEFAULTS["pmtu"]))
    check_int("num_qps", out.get("num_qps", DEFAULTS["num_qps"]), minimum=1, maximum=256)
    return out


def build(params: dict[str, str]) -> Depacketizer:
    """A :class:`Depacketizer` from ``--param`` strings (defaults for the rest)."""
    return Depacketizer(**{**DEFAULTS, **parse_params(params)})


def _destination(qp: int) -> Destination:
    return Destination(mac=0x02_4E_45_4F_00_02, ip=0x0A_00_00_02, qpn=qp, udp_sport=0xC000 + qp)


def workload(rng: np.random.Generator, *, num_qps: int, pmtu: int
             ) -> tuple[list[bytes], dict[int, int], Counter]:
    """The frames to send, the initial PSN of each QP used, and the drops they must cause.

    Messages: the packetizer's default set, message ``i`` to QP ``i % num_qps`` (PSNs from a
    random start per QP). After message ``j`` come the broken frames ``BROKEN[k]`` with
    ``k % messages == j``; each is a WRITE ONLY that would otherwise be accepted. The first
    multi-packet message also carries a copy of its second packet with a corrupted ICRC just
    before the real one (a drop inside a message must leave the message's state alone).
    """
    msgs = [m for m, _ in default_messages(rng, min(num_qps, 6), "none")]
    psns = {q: int(rng.integers(PSN_MODULUS)) for q in sorted({i % num_qps
                                                                for i in range(len(msgs))})}
    nxt = dict(psns)
    expected: Counter = Counter()
    frames: list[bytes] = []
    corrupted_inside = False
    for j, m in enumerate(msgs):
        q = j % num_qps
        sent = [f.data for f in build_frames(Message(q, m.va, m.rkey, m.payload, m.imm),
                                             _destination(q), local_mac=LOCAL_MAC,
                                             local_ip=LOCAL_IP, psn=nxt[q], pmtu=pmtu)]
        nxt[q] = (nxt[q] + len(sent)) % PSN_MODULUS
        if len(sent) > 1 and not corrupted_inside:
            corrupted_inside = True
            frames += [sent[0], _flip_icrc(sent[1])] + sent[1:]
            expected["icrc"] += 1
        else:
            frames += sent
        for k in range(j, len(BROKEN), len(msgs)):
            frames.append(_broken(BROKEN[k], q, nxt[q], num_qps, pmtu))
            expected[BROKEN[k]] += 1
    return frames, psns, expected


def _flip_icrc(frame: bytes) -> bytes:
    return frame[:-1] + bytes([frame[-1] ^ 0x40])


def _broken(reason: str, qp: int, psn: int, num_qps: int, pmtu: int) -> bytes:
    """A 40-byte WRITE ONLY for ``qp`` (expecting ``psn``) broken so it is dropped for
    ``reason``."""
    payload = bytes(range(40))

    def only(dest_qp: int, at_psn: int) -> bytes:
        (frame,) = build_frames(Message(0, 0x7F_0000, 1, payload), _destination(dest_qp),
                                local_mac=LOCAL_MAC, local_ip=LOCAL_IP, psn=at_psn, pmtu=pmtu)
        return frame.data

    if reason == "icrc":
        return _flip_icrc(only(qp, psn))
    if reason == "udp_port":
        frame = only(qp, psn)
        return frame[:36] + (4792).to_bytes(2, "big") + frame[38:]
    if reason == "psn":
        return only(qp, (psn + 3) % PSN_MODULUS)
    if reason == "qp":
        return only(num_qps, 0)
    raise ValueError(f"reason: expected one of {', '.join(BROKEN)}, got {reason!r}")


def user_workload(req: SimRequest, *, num_qps: int, pmtu: int
                  ) -> tuple[list[bytes], dict[int, int], Counter]:
    """The frames of a user's own messages (``--messages FILE``, the packetizer's format;
    message ``dest`` is the QP), PSNs from 0, no broken frames."""
    rng = np.random.default_rng(req.seed)
    msgs, _ = load_messages(req.extra["messages"], num_qps, rng)
    psns = {q: 0 for q in sorted({m.dest for m, _ in msgs})}
    nxt = dict(psns)
    frames: list[bytes] = []
    for m, _ in msgs:
        sent = build_frames(m, _destination(m.dest), local_mac=LOCAL_MAC, local_ip=LOCAL_IP,
                            psn=nxt[m.dest], pmtu=pmtu)
        nxt[m.dest] = (nxt[m.dest] + len(sent)) % PSN_MODULUS
        frames += [f.data for f in sent]
    return frames, psns, Counter()


def simulate(req: SimRequest) -> dict:
    """Run the workload (the default one, or ``--messages FILE``) through the depacketizer on
    ``req.sim``; hold memory, completions and counters to the reference receiver; write
    figures.json (the same fields from every simulator; the input frames as a pcap with
    ``--pcap FILE``, a waveform when asked); raise AssertionError on any mismatch."""
    dut = build(req.params)
    if req.extra.get("messages"):
        frames, psns, expected = user_workload(req, num_qps=dut.num_qps, pmtu=dut.pmtu)
    else:
        rng = np.random.default_rng(req.seed)
        frames, psns, expected = workload(rng, num_qps=dut.num_qps, pmtu=dut.pmtu)
    ref = Receiver(num_qps=dut.num_qps, pmtu=dut.pmtu)
    for q, psn in psns.items():
        ref.set_psn(q, psn)
    for f in frames:
        ref.receive(f)
    t0 = time.perf_counter()
    results_xml = None
    if req.sim == "amaranth":
        run = run_rx(dut, frames, psns, vcd=req.vcd)
    elif req.sim in ("icarus", "verilator"):
        run, results_xml = _run_rx_cocotb(req, dut, frames, psns)
    else:
        raise ValueError(f"sim: expected amaranth, icarus or verilator, got {req.sim!r}")
    wall = time.perf_counter() - t0

    want_drops = {r: expected.get(r, 0) for r in DROP_REASONS}
    beats = len(run.beat_cycles)
    cycles = max(run.done_cycle, run.beat_cycles[-1] + 1) - run.beat_cycles[0]
    memory_ok = run.memory == ref.memory
    completions_ok = run.completions == [(c.qp, c.length, c.imm) for c in ref.completions]
    counters_ok = run.counters == {"accepted": ref.accepted, **ref.drops}
    figures: dict[str, Any] = {
        "unit": "depacketizer", "sim": req.sim, "seed": req.seed,
        "params": {"data_bytes": dut.data_bytes, "pmtu": dut.pmtu, "num_qps": dut.num_qps},
        "messages_file": str(req.extra["messages"]) if req.extra.get("messages") else None,
        "frames": len(frames), "beats": beats,
        "accepted": run.counters["accepted"],
        "dropped": {r: n for r, n in run.counters.items() if r != "accepted" and n},
        "completions": len(run.completions),
        "payload_bytes": len(run.memory),
        "cycles": cycles, "bus_occupancy": beats / cycles,
        "memory_matches_reference": memory_ok,
        "completions_match_reference": completions_ok,
        "counters_match_reference": counters_ok,
        "drops_as_built": ref.drops == want_drops,
        "wall_s": wall, "results_xml": results_xml,
    }
    req.out.mkdir(parents=True, exist_ok=True)
    pcap = req.extra.get("pcap")
    if pcap:
        _write_pcap(pcap, frames)
        figures["pcap"] = str(pcap)
    (req.out / "figures.json").write_text(json.dumps(figures, indent=2) + "\n")
    problems = [name for name in ("memory_matches_reference", "completions_match_reference",
                                  "counters_match_reference", "drops_as_built")
                if not figures[name]]
    if problems:
        raise AssertionError(f"depacketizer: {', '.join(problems)} failed (counters "
                             f"{run.counters}, reference accepted {ref.accepted} drops "
                             f"{ref.drops}, built to drop {dict(expected)})")
    return figures


def _run_rx_cocotb(req: SimRequest, dut: Depacketizer, frames: list[bytes],
                   psns: dict[int, int]) -> tuple[RxRun, str]:
    """``--sim icarus|verilator``: the same frames through the cocotb bench's ``stimulus_run``
    (sim/cocotb/tb_depacketizer.py) on the generated Verilog, fed back to back with the memory
    always ready, as the Amaranth run does; the design's memory writes, completions and
    counters come back for the same scoreboard."""
    from neonic.sim.harness import read_tb_figures, run_cocotb
    req.out.mkdir(parents=True, exist_ok=True)
    stimulus = req.out / "stimulus.json"
    stimulus.write_text(json.dumps({"frames": [f.hex() for f in frames],
                                    "psns": {str(q): p for q, p in psns.items()}}))
    name = f"depacketizer_w{dut.data_bytes}_p{dut.pmtu}_q{dut.num_qps}"
    results = run_cocotb(dut, name, "tb_depacketizer", sim=req.sim, seed=req.seed,
                         waves=req.vcd is not None, testcase="stimulus_run",
                         params={"data_bytes": dut.data_bytes, "pmtu": dut.pmtu,
                                 "num_qps": dut.num_qps, "beats_width": dut.beats_width,
                                 "stimulus": str(stimulus.resolve())})
    tb = read_tb_figures(results)
    memory = memory_written(tb["requests"], tb["writes"], dut.data_bytes)
    completions = [(q, n, imm) for q, n, imm in tb["completions"]]
    return RxRun(tb["counters"], tb["beat_cycles"], tb["done_cycle"], memory,
                 completions), str(results)
