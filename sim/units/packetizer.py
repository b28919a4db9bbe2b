"""The AlltoAll packetizer as the command line sees it (``neonic rtl export|sim packetizer``).

Also holds what the benchmark shares: building from ``--param`` strings, a default message
set, and runs of the packetizer (and of the depacketizer on its frames) in Amaranth's
simulator that record the cycle of every frame beat.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from neonic.sim.units import SimRequest
from neonic.rtl.depacketizer import Depacketizer
from neonic.rtl.packetizer import QUANT_FORMATS, Packetizer
from neonic.rtl.roce import DROP_REASONS
from neonic.sim.harness import run_amaranth, stream_recv, stream_send
from neonic.sim.reference.roce import Destination, Message, Receiver, build_frames, frame_beats, quantize, wire_length
from neonic.sim.timing.packetizer import estimate_tx

__all__ = ["build", "parse_params", "TxRun", "RxRun", "run_tx", "run_rx",
           "default_messages", "load_messages", "simulate", "LOCAL_MAC", "LOCAL_IP",
           "DESTINATIONS"]

LOCAL_MAC, LOCAL_IP = 0x02_4E_45_4F_00_01, 0x0A_00_00_01
DESTINATIONS = [Destination(mac=0x02_4E_45_4F_01_00 + i, ip=0x0A_00_01_00 + i, qpn=i + 1,
                            udp_sport=0xC000 + i) for i in range(8)]
DEFAULTS: dict[str, Any] = {"data_bytes": 64, "pmtu": 4096, "num_dest": 8, "quant": "none"}


def parse_params(params: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key in ("data_bytes", "pmtu", "num_dest"):
            try:
                out[key] = int(value, 0)
            except ValueError:
                raise ValueError(f"{key}: expected an integer, got {value!r}") from None
        elif key == "quant":
            if value not in QUANT_FORMATS:
                raise ValueError(f"quant: expected one of {', '.join(QUANT_FORMATS)}, got {value!r}")
            out[key] = value
        else:
            raise ValueError(f"--param {key}: unknown parameter; expected one of "
                             f"{', '.join(sorted(DEFAULTS))}")
    return out


def build(params: dict[str, str]) -> Packetizer:
    """A :class:`Packetizer` from ``--param`` strings (defaults for the rest)."""
    return Packetizer(**{**DEFAULTS, **parse_params(params)})


@dataclass
class TxRun:
    frames: list[bytes]
    beat_cycles: list[int]          # cycle of each frame beat's transfer
    last_beat_cycles: list[int]     # cycle of each frame's last beat
    cycles: int                     # first descriptor offered .. last beat

    @property
    def beats(self) -> int:
        return len(self.beat_cycles)


@dataclass
class RxRun:
    counters: dict[str, int]
    beat_cycles: list[int]
    done_cycle: int                 # last memory write beat
    memory: dict[int, int] = field(default_factory=dict)
    completions: list[tuple[int, int, int | None]] = field(default_factory=list)  # (qp, length, imm)


DEFAULT_DIM = 32  # elements per pooled-embedding row of the default messages


def default_messages(rng: np.random.Generator, num_dest: int, quant: str) -> list[tuple[Message, np.ndarray]]:
    """A small AlltoAll: each destination gets a block of pooled FP32 embeddings (rows of
    :data:`DEFAULT_DIM` elements)."""
    out = []
    for i, rows in enumerate([4, 33, 2, 70, 16, 8][:max(1, num_dest)]):
        values = rng.standard_normal((rows, DEFAULT_DIM)).astype(np.float32)
        out.append((Message(dest=i % num_dest, va=0x10_0000 * (i + 1), rkey=0x1000 + i,
                            payload=values.tobytes(), imm=(i << 16) | rows), values))
    return out


def load_messages(path: Path | str, num_dest: int, rng: np.random.Generator
                  ) -> tuple[list[tuple[Message, np.ndarray | None]], int]:
    """A user's own messages from a TOML file, and the row width ``dim`` they declare.

    The file holds an optional ``dim`` (FP32 elements per pooled row; default
    :data:`DEFAULT_DIM`; INT8 quantizes per row of ``dim``) and one ``[[message]]`` table per
    message with ``dest`` (destination index, 0..num_dest-1), ``va`` and ``rkey`` (the remote
    buffer), an optional ``imm`` (32-bit immediate) and exactly one payload: ``payload`` (a hex
    string of bytes), ``values`` (FP32 numbers) or ``rows`` (that many rows of ``dim``
    standard-normal FP32 values drawn from the run's seed). Every error names the message and
    the field.
    """
    from neonic.sim import schema

    data = schema.load_toml(path, "--messages")
    schema.known_fields("--messages", data, ("dim", "message"))
    dim = schema.integer("dim", data.get("dim", DEFAULT_DIM), 1, 1 << 16)
    entries = data.get("message")
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"--messages {path}: expected one or more [[message]] tables")
    out: list[tuple[Message, np.ndarray | None]] = []
    for i, entry in enumerate(entries):
        where = f"message[{i}]"
        schema.table(where, entry)
        schema.known_fields(where, entry, ("dest", "va", "rkey", "imm", "payload", "values",
                                           "rows"))
        for key in ("dest", "va", "rkey"):
            if key not in entry:
                raise ValueError(f"{where}.{key}: missing; expected an integer")
        dest = schema.integer(f"{where}.dest", entry["dest"], 0, num_dest - 1)
        va = schema.integer(f"{where}.va", entry["va"], 0, (1 << 64) - 1)
        rkey = schema.integer(f"{where}.rkey", entry["rkey"], 0, (1 << 32) - 1)
        imm = (schema.integer(f"{where}.imm", entry["imm"], 0, (1 << 32) - 1)
               if "imm" in entry else None)
        given = [k for k in ("payload", "values", "rows") if k in entry]
        if len(given) != 1:
            raise ValueError(f"{where}: expected exactly one of payload, values, rows; "
                             f"got {', '.join(given) or 'none'}")
        values: np.ndarray | None = None
        if given[0] == "payload":
            text = schema.string(f"{where}.payload", entry["payload"])
            try:
                payload = bytes.fromhex(text)
            except ValueError:
                raise ValueError(f"{where}.payload: expected a hex string of bytes, "
                                 f"got {text[:40]!r}") from None
        elif given[0] == "values":
            raw = entry["values"]
            if not isinstance(raw, list) or not raw:
                raise ValueError(f"{where}.values: expected a non-empty list of numbers")
            values = np.array([schema.number(f"{where}.values[{j}]", v)
                               for j, v in enumerate(raw)], np.float32)
            payload = values.tobytes()
        else:
            rows = schema.integer(f"{where}.rows", entry["rows"], 1, 1 << 20)
            values = rng.standard_normal((rows, dim)).astype(np.float32)
            payload = values.tobytes()
        if not payload:
            raise ValueError(f"{where}.payload: expected at least one byte")
        out.append((Message(dest=dest, va=va, rkey=rkey, payload=payload, imm=imm), values))
    return out, dim


def _messages(req: SimRequest, dut: Packetizer) -> tuple[list[tuple[Message, np.ndarray | None]], int]:
    """The run's messages (``--messages FILE``, else the default set) and the INT8 row width
    (0 unless the packetizer quantizes to INT8)."""
    rng = np.random.default_rng(req.seed)
    if req.extra.get("messages"):
        msgs, dim = load_messages(req.extra["messages"], dut.num_dest, rng)
    else:
        msgs, dim = default_messages(rng, dut.num_dest, dut.quant), DEFAULT_DIM
    if dut.quant == "int8":
        for i, (m, _) in enumerate(msgs):
            if len(m.payload) % (4 * dim):
                raise ValueError(f"message[{i}]: quant=int8 quantizes rows of dim={dim} FP32 "
                                 f"values; expected a payload of a multiple of {4 * dim} bytes, "
                                 f"got {len(m.payload)}")
        return msgs, dim
    if dut.quant in ("fp16", "bf16"):
        for i, (m, _) in enumerate(msgs):
            if len(m.payload) % 4:
                raise ValueError(f"message[{i}]: quant={dut.quant} converts FP32 values; "
                                 f"expected a payload of a multiple of 4 bytes, got "
                                 f"{len(m.payload)}")
    return msgs, 0


def run_tx(dut: Packetizer, messages: list[Message], *, psns: dict[int, int] | None = None,
           rng: np.random.Generator | None = None, idle: float = 0.0, backpressure: float = 0.0,
           vcd: Path | None = None, dim: int = 0) -> TxRun:
    """Send ``messages`` (payload = FP32 input bytes) through ``dut`` in Amaranth's simulator."""
    W = dut.data_bytes
    psns = psns or {}
    expected_frames = sum(len(build_frames(
        Message(m.dest, m.va, m.rkey, bytes(wire_length(len(m.payload), dut.quant, dim=dim,
                                                        pmtu=dut.pmtu)), m.imm),
        DESTINATIONS[m.dest], local_mac=0, local_ip=0, psn=0, pmtu=dut.pmtu)) for m in messages)
    frames: list[bytes] = []
    beat_cycles: list[int] = []
    last_cycles: list[int] = []
    clock = {"n": 0, "start": None}

    async def host(ctx):
        ctx.set(dut.local_mac, LOCAL_MAC)
        ctx.set(dut.local_ip, LOCAL_IP)
        await stream_send(ctx, dut.table, [
            {"index": i, "mac": d.mac, "ip": d.ip, "qpn": d.qpn, "udp_sport": d.udp_sport,
             "psn": psns.get(i, 0)} for i, d in enumerate(DESTINATIONS[:dut.num_dest])])
        clock["start"] = clock["n"]
        await stream_send(ctx, dut.desc, [
            {"dest": m.dest, "va": m.va, "rkey": m.rkey, "length": len(m.payload),
             "imm": m.imm or 0, "has_imm": int(m.imm is not None), "dim": dim}
            for m in messages],
            rng=rng, idle=idle)

    async def payload(ctx):
        beats = []
        for m in messages:
            raw = m.payload + bytes(-len(m.payload) % W)
            beats += [int.from_bytes(raw[i:i + W], "little") for i in range(0, len(raw), W)]
        await stream_send(ctx, dut.payload, beats, rng=rng, idle=idle)

    async def counter(ctx):
        while True:
            await ctx.tick()
            clock["n"] += 1

    async def sink(ctx):
        current = b""
        while len(frames) < expected_frames:
            (beat,) = await stream_recv(ctx, dut.frame, 1, rng=rng, backpressure=backpressure)
            beat_cycles.append(clock["n"])
            data = int(beat.data).to_bytes(W, "little")
            if beat.last:
                frames.append(current + data[:int(beat.count)])
                last_cycles.append(clock["n"])
                current = b""
            else:
                current += data

    total = sum(len(m.payload) for m in messages)
    run_amaranth(dut, [host, payload, sink], background=[counter], vcd=vcd,
                 max_cycles=5000 + 8 * (total // W + 20 * expected_frames)
                 + (60 * total // max(1, 4 * dim) if dut.quant == "int8" else 0))
    return TxRun(frames, beat_cycles, last_cycles, last_cycles[-1] - (clock["start"] or 0))


def run_rx(dut: Depacketizer, frames: list[bytes], psns: dict[int, int], *,
           quant: str = "none", dim: int = 0, vcd: Path | None = None) -> RxRun:
    """Feed ``frames`` back to back (memory always ready, completions always taken) and time
    the depacketizer; its QPs are set to receive ``quant`` (rows of ``dim`` for INT8)."""
    from neonic.rtl.depacketizer import QUANT_FORMATS as RX_FORMATS
    W = dut.data_bytes
    beats = frame_beats(frames, W)
    clock = {"n": 0}
    beat_cycles: list[int] = []
    writes = {"last": 0}
    memory: dict[int, int] = {}
    counters: dict[str, int] = {}
    done: list[tuple[int, int, int | None]] = []

    async def counter(ctx):
        while True:
            await ctx.tick()
            clock["n"] += 1

    reqs: list[tuple[int, int]] = []
    beats_written: list[tuple[int, int]] = []

    async def memory_sink(ctx):
        ctx.set(dut.mem.req.ready, 1)
        ctx.set(dut.mem.wdata.ready, 1)
        while True:
            _, _, rv, rp, wv, wp = await ctx.tick().sample(dut.mem.req.valid, dut.mem.req.payload,
                                                           dut.mem.wdata.valid, dut.mem.wdata.payload)
            if rv:
                reqs.append((int(rp.addr), int(rp.beats)))
            if wv:
                beats_written.append((int(wp.data), int(wp.mask)))
                writes["last"] = clock["n"] + 1

    async def source(ctx):
        await stream_send(ctx, dut.qp_init, [{"qp": q, "psn": p, "dim": dim,
                                              "format": RX_FORMATS.index(quant)}
                                             for q, p in psns.items()])
        for beat in beats:
            ctx.set(dut.frame.payload, beat)
            ctx.set(dut.frame.valid, 1)
            while True:
                _, _, ready = await ctx.tick().sample(dut.frame.ready)
                if ready:
                    beat_cycles.append(clock["n"])
                    break
        ctx.set(dut.frame.valid, 0)
        quiet = 2 * dut.pmtu // W + 40      # until the memory writes have stopped that long
        while clock["n"] - max(writes["last"], beat_cycles[-1] if beat_cycles else 0) < quiet:
            await ctx.tick()
        for name in ("accepted",) + DROP_REASONS:
            counters[name] = ctx.get(getattr(dut.counters, name))

    async def completions(ctx):
        ctx.set(dut.completion.ready, 1)
        while True:
            _, _, valid, c = await ctx.tick().sample(dut.completion.valid, dut.completion.payload)
            if valid:
                done.append((int(c.qp), int(c.length), int(c.imm) if c.has_imm else None))

    run_amaranth(dut, [source], background=[counter, completions], processes=[memory_sink],
                 vcd=vcd,
                 max_cycles=10000 + 4 * len(beats) + (40 * len(beats) if quant == "int8" else 0))
    memory.update(memory_written(reqs, beats_written, W))
    return RxRun(counters, beat_cycles, writes["last"], memory, done)


def memory_written(requests: list[tuple[int, int]], beats: list[tuple[int, int]], data_bytes: int
                   ) -> dict[int, int]:
    """The bytes a memory port's writes leave, by address: write requests ``(addr in beats,
    beats)`` take the write beats ``(data, byte mask)`` in order (the port contract of
    ``rtl.streams``); masked-off bytes are not written."""
    memory: dict[int, int] = {}
    it = iter(beats)
    for addr, n in requests:
        for k in range(n):
            value, mask = next(it)
            data = int(value).to_bytes(data_bytes, "little")
            for i in range(data_bytes):
                if mask >> i & 1:
                    memory[(addr + k) * data_bytes + i] = data[i]
    return memory


def simulate(req: SimRequest) -> dict:
    """Send the run's messages (``--messages FILE``, else the default set) on ``req.sim``;
    check every frame against the reference model; write figures.json (the same fields from
    every simulator), the frames as a pcap with ``--pcap FILE``, a waveform when asked."""
    dut = build(req.params)
    msgs, dim = _messages(req, dut)
    messages = [m for m, _ in msgs]
    # the reference frames of the same (quantized) messages
    golden: list[bytes] = []
    psn: dict[int, int] = {}
    for m, values in msgs:
        if dut.quant == "none":
            wire_payload = m.payload
        else:
            vals = values if values is not None else np.frombuffer(m.payload, np.float32)
            wire_payload = quantize(vals, dut.quant, dim=dim or None, pmtu=dut.pmtu)
        fr = build_frames(Message(m.dest, m.va, m.rkey, wire_payload, m.imm),
                          DESTINATIONS[m.dest], local_mac=LOCAL_MAC, local_ip=LOCAL_IP,
                          psn=psn.get(m.dest, 0), pmtu=dut.pmtu)
        psn[m.dest] = psn.get(m.dest, 0) + len(fr)
        golden += [f.data for f in fr]
    t0 = time.perf_counter()
    results_xml = None
    if req.sim == "amaranth":
        run = run_tx(dut, messages, vcd=req.vcd, dim=dim)
    elif req.sim in ("icarus", "verilator"):
        run, results_xml = _run_tx_cocotb(req, dut, messages)
    else:
        raise ValueError(f"sim: expected amaranth, icarus or verilator, got {req.sim!r}")
    wall = time.perf_counter() - t0
    rx = Receiver(num_qps=len(DESTINATIONS) + 1, pmtu=dut.pmtu)
    for f in run.frames:
        rx.receive(f)
    est = estimate_tx([len(m.payload) for m in messages], data_bytes=dut.data_bytes,
                      pmtu=dut.pmtu, with_imm=[m.imm is not None for m in messages],
                      quant=dut.quant, dim=dim or None)
    figures = {
        "unit": "packetizer", "sim": req.sim, "seed": req.seed,
        "params": {"data_bytes": dut.data_bytes, "pmtu": dut.pmtu, "num_dest": dut.num_dest,
                   "quant": dut.quant},
        **({"dim": dim} if dim else {}),
        "messages": len(messages), "messages_file": (str(req.extra["messages"])
                                                     if req.extra.get("messages") else None),
        "frames": len(run.frames), "beats": run.beats,
        "cycles": run.cycles, "bus_occupancy": run.beats / run.cycles,
        "frames_match_reference": run.frames == golden,
        "reference_receiver_accepted": rx.accepted,
        "timing_model_cycles": est.cycles,
        "wall_s": wall, "results_xml": results_xml,
    }
    req.out.mkdir(parents=True, exist_ok=True)
    pcap = req.extra.get("pcap")
    if pcap:
        _write_pcap(pcap, run.frames)
        figures["pcap"] = str(pcap)
    (req.out / "figures.json").write_text(json.dumps(figures, indent=2) + "\n")
    if not figures["frames_match_reference"]:
        raise AssertionError("packetizer frames differ from the reference model")
    return figures


def _write_pcap(path, frames: list[bytes]) -> None:
    from scapy.layers.l2 import Ether
    from scapy.utils import wrpcap
    import scapy.contrib.roce  # noqa: F401  (binds UDP 4791 to BTH for readers)
    wrpcap(str(path), [Ether(f) for f in frames])


def _run_tx_cocotb(req: SimRequest, dut: Packetizer, messages: list[Message]) -> tuple[TxRun, str]:
    """``--sim icarus|verilator``: the same messages through the cocotb bench
    (sim/cocotb/tb_packetizer.py) on the generated Verilog, with the Amaranth run's
    destination table and no idle or backpressure, so the two simulators run one workload."""
    from neonic.sim.harness import read_tb_figures, run_cocotb
    if dut.quant != "none":
        raise ValueError(f"--sim {req.sim}: the cocotb bench sends raw payload bytes; use "
                         f"--param quant=none (or --sim amaranth for {dut.quant!r})")
    req.out.mkdir(parents=True, exist_ok=True)
    stimulus = req.out / "stimulus.json"
    stimulus.write_text(json.dumps({
        "local_mac": LOCAL_MAC, "local_ip": LOCAL_IP,
        "destinations": [{"mac": d.mac, "ip": d.ip, "qpn": d.qpn, "udp_sport": d.udp_sport,
                          "psn": 0} for d in DESTINATIONS[:dut.num_dest]],
        "messages": [{"dest": m.dest, "va": m.va, "rkey": m.rkey, "imm": m.imm,
                      "payload": m.payload.hex()} for m in messages]}))
    name = f"packetizer_w{dut.data_bytes}_p{dut.pmtu}_d{dut.num_dest}"
    results = run_cocotb(dut, name, "tb_packetizer", sim=req.sim, seed=req.seed,
                         waves=req.vcd is not None,
                         params={"data_bytes": dut.data_bytes, "pmtu": dut.pmtu,
                                 "num_dest": dut.num_dest, "stimulus": str(stimulus.resolve()),
                                 "idle": 0.0, "backpressure": 0.0, "record_frames": True})
    tb = read_tb_figures(results)
    frames = [bytes.fromhex(h) for h in tb.get("frames", [])]
    return TxRun(frames, tb["beat_cycles"], tb["last_beat_cycles"], tb["cycles"]), str(results)
