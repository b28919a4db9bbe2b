"""The AlltoAll depacketizer as the command line sees it (``neonic rtl export|sim depacketizer``).

``simulate`` sends the reference frames of the packetizer's default message set, with broken
frames interleaved (one per reason in :data:`BROKEN`, plus a corrupted copy of a packet inside
a multi-packet message), and holds the memory written, the completions and the drop counters
to the reference receiver (``sim.reference.roce.Receiver``) and to the drops the broken frames
were built to cause.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import numpy as np

from neonic.sim.units import SimRequest
from neonic.sim.units.packetizer import LOCAL_IP, LOCAL_MAC, _write_pcap, default_messages, run_rx
from neonic.rtl.depacketizer import Depacketizer
from neonic.rtl.roce import DROP_REASONS, check_data_bytes, check_pmtu
from neonic.rtl.streams import check_int
from neonic.sim.reference.roce import PSN_MODULUS, Destination, Message, Receiver, build_frames

__all__ = ["build", "parse_params", "workload", "simulate", "BROKEN"]

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


def simulate(req: SimRequest) -> dict:
    """Run the workload through the depacketizer; write figures.json (the input frames as a
    pcap with ``--pcap FILE``, a VCD when asked); raise AssertionError on any mismatch."""
    if req.sim != "amaranth":
        return _simulate_cocotb(req)
    dut = build(req.params)
    rng = np.random.default_rng(req.seed)
    frames, psns, expected = workload(rng, num_qps=dut.num_qps, pmtu=dut.pmtu)
    ref = Receiver(num_qps=dut.num_qps, pmtu=dut.pmtu)
    for q, psn in psns.items():
        ref.set_psn(q, psn)
    for f in frames:
        ref.receive(f)
    run = run_rx(dut, frames, psns, vcd=req.vcd)

    want_drops = {r: expected.get(r, 0) for r in DROP_REASONS}
    beats = len(run.beat_cycles)
    cycles = max(run.done_cycle, run.beat_cycles[-1] + 1) - run.beat_cycles[0]
    memory_ok = run.memory == ref.memory
    completions_ok = run.completions == [(c.qp, c.length, c.imm) for c in ref.completions]
    counters_ok = run.counters == {"accepted": ref.accepted, **ref.drops}
    figures: dict[str, Any] = {
        "unit": "depacketizer", "sim": req.sim,
        "params": {"data_bytes": dut.data_bytes, "pmtu": dut.pmtu, "num_qps": dut.num_qps},
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
    }
    req.out.mkdir(parents=True, exist_ok=True)
    pcap = req.extra.get("pcap")
    if pcap:
        _write_pcap(pcap, frames)
        figures["pcap"] = str(pcap)
    if req.vcd is not None:
        figures["vcd"] = str(req.vcd)
    (req.out / "figures.json").write_text(json.dumps(figures, indent=2) + "\n")
    problems = [name for name in ("memory_matches_reference", "completions_match_reference",
                                  "counters_match_reference", "drops_as_built")
                if not figures[name]]
    if problems:
        raise AssertionError(f"depacketizer: {', '.join(problems)} failed (counters "
                             f"{run.counters}, reference accepted {ref.accepted} drops "
                             f"{ref.drops}, built to drop {dict(expected)})")
    return figures


def _simulate_cocotb(req: SimRequest) -> dict:
    """``--sim icarus|verilator``: the cocotb bench (sim/cocotb/tb_depacketizer.py) on the
    generated Verilog; it sends its own scapy-built workload (good messages on QPs 0..3 with
    broken frames interleaved, random idle and stalls) and asserts memory, completions and
    counters against the reference receiver."""
    from neonic.sim.harness import read_tb_figures, run_cocotb
    num_qps = {**DEFAULTS, **parse_params(req.params)}["num_qps"]
    if num_qps < 4:
        raise ValueError(f"num_qps: the cocotb bench (--sim {req.sim}) uses QPs 0..3; expected "
                         f">= 4, got {num_qps} (or use --sim amaranth)")
    if req.extra.get("pcap"):
        raise ValueError(f"--pcap: the cocotb bench (--sim {req.sim}) does not hand its frames "
                         "back; use --sim amaranth")
    dut = build(req.params)
    name = f"depacketizer_w{dut.data_bytes}_p{dut.pmtu}_q{dut.num_qps}"
    results = run_cocotb(dut, name, "tb_depacketizer", sim=req.sim, seed=req.seed,
                         waves=req.vcd is not None,
                         params={"data_bytes": dut.data_bytes, "pmtu": dut.pmtu,
                                 "num_qps": dut.num_qps, "beats_width": dut.beats_width,
                                 "sizes": [1, 7, 64, 127, 300, 777, 40, 5], "idle": 0.25,
                                 "backpressure": 0.25, "accept_stall": 0.25})
    tb = read_tb_figures(results)
    figures: dict[str, Any] = {
        "unit": "depacketizer", "sim": req.sim,
        "params": {"data_bytes": dut.data_bytes, "pmtu": dut.pmtu, "num_qps": dut.num_qps},
        "frames": tb.get("frames"), "accepted": tb.get("accepted"),
        "dropped": tb.get("dropped"),
        "memory_matches_reference": True,   # the bench asserts memory, completions, counters
        "results_xml": str(results),
        "sim_time_ns": sum(t["sim_time_ns"] for t in tb["tests"].values()),
    }
    if req.vcd is not None:
        figures["waves"] = str(results.parent)
    req.out.mkdir(parents=True, exist_ok=True)
    (req.out / "figures.json").write_text(json.dumps(figures, indent=2) + "\n")
    return figures
