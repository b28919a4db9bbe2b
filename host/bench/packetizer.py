"""``neonic bench packetizer``: line-rate figures of the AlltoAll packetizer/depacketizer.

Back-to-back 4096-byte payloads (one long message: FIRST, MIDDLE..., LAST) at 64 bytes per
beat, frame sink and memory always ready, measured in Amaranth's simulator; the same with
FP16 quantization (input FP32 at 64 bytes per cycle, so the input limits the wire); and the
timing model's largest relative error against these runs.
"""

from __future__ import annotations

import numpy as np

from host.bench import BenchContext
from host.units.packetizer import DESTINATIONS, run_rx, run_tx
from rtl.depacketizer import Depacketizer
from rtl.packetizer import Packetizer
from sim.reference.roce import Message
from sim.timing.packetizer import estimate_rx, estimate_tx

SUMMARY = "packetizer/depacketizer bus occupancy and goodput for back-to-back 4096 B packets"

CLOCK_HZ = 250e6
W = 64
PMTU = 4096


def _figures(ctx: BenchContext, quant: str, packets: int, rng: np.random.Generator) -> dict:
    payload_len = packets * PMTU * (2 if quant != "none" else 1)     # FP32 input bytes
    msg = Message(dest=0, va=0x1000_0000, rkey=1,
                  payload=rng.standard_normal(payload_len // 4).astype(np.float32).tobytes())
    ctx.progress(f"[{quant}] transmit: {packets} packets of {PMTU} B at {W} B/beat")
    tx = run_tx(Packetizer(data_bytes=W, pmtu=PMTU, num_dest=1, quant=quant), [msg])
    # steady state: from the end of the FIRST packet to the end of the LAST
    window = tx.last_beat_cycles[-1] - tx.last_beat_cycles[0]
    beats_in_window = sum(1 for c in tx.beat_cycles if c > tx.last_beat_cycles[0])
    middle = np.diff(tx.last_beat_cycles[:-1]) if packets > 2 else np.diff(tx.last_beat_cycles)
    wire_payload = (packets - 1) * PMTU
    ctx.progress(f"[{quant}] receive: {len(tx.frames)} frames")
    rxd = Depacketizer(data_bytes=W, pmtu=PMTU, num_qps=2)
    rx = run_rx(rxd, tx.frames, {DESTINATIONS[0].qpn: 0})
    if rx.counters["accepted"] != len(tx.frames):
        raise AssertionError(f"receiver accepted {rx.counters['accepted']} of {len(tx.frames)}")
    rx_window = rx.beat_cycles[-1] - rx.beat_cycles[0] + 1
    est_tx = estimate_tx([payload_len], data_bytes=W, pmtu=PMTU, quant=quant)
    est_rx = estimate_rx([payload_len], data_bytes=W, pmtu=PMTU, quant=quant)
    rx_measured = rx.done_cycle - rx.beat_cycles[0]
    errors = [abs(est_tx.cycles - tx.cycles) / tx.cycles, abs(est_rx - rx_measured) / rx_measured]
    return {
        "tx_bus_occupancy": beats_in_window / window,
        "tx_cycles_per_4096B_packet": float(np.mean(middle)),
        "rx_bus_occupancy": len(rx.beat_cycles) / rx_window,
        "goodput_gbps_at_250MHz": 8 * wire_payload * CLOCK_HZ / window / 1e9,
        "embedding_gbps_at_250MHz": 8 * wire_payload * CLOCK_HZ / window / 1e9
        * (2 if quant != "none" else 1),
        "_errors": errors,
    }


def run(ctx: BenchContext) -> dict:
    rng = np.random.default_rng(ctx.seed)
    packets = 4 if ctx.quick else 10
    plain = _figures(ctx, "none", packets, rng)
    fp16 = _figures(ctx, "fp16", packets, rng)
    errors = plain.pop("_errors") + fp16.pop("_errors")
    return {**plain, "fp16": fp16, "timing_model_max_rel_error": max(errors),
            "data_bytes": W, "pmtu": PMTU, "packets": packets}
