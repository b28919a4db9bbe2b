"""``neonic bench packetizer``: line-rate figures of the AlltoAll packetizer/depacketizer.

Back-to-back 4096-byte payloads (one long message: FIRST, MIDDLE..., LAST) at 64 bytes per
beat, frame sink and memory always ready, measured in Amaranth's simulator; the same with
FP16 quantization (input FP32 at 64 bytes per cycle, so the input limits the wire); the same
with INT8 row-wise quantization (rows of 128 elements, 8 input beats a row: the input limits
the rate, about 240 cycles a packet); and the timing model's largest relative error against
these runs.
"""

from __future__ import annotations

import time

import numpy as np

from neonic.host.bench import BenchContext
from neonic.sim.units.packetizer import DESTINATIONS, run_rx, run_tx
from neonic.rtl.depacketizer import Depacketizer
from neonic.rtl.packetizer import Packetizer
from neonic.rtl.roce import header_len
from neonic.sim.reference.roce import Message, int8_rows_per_packet
from neonic.sim.timing.packetizer import INT8_DIV_BITS, estimate_rx, estimate_tx

SUMMARY = "packetizer/depacketizer bus occupancy and goodput for back-to-back 4096 B packets"

CLOCK_HZ = 250e6
W = 64
PMTU = 4096


INT8_DIM = 128
#: INT8 packets measured (``--quick``: 3).
INT8_PACKETS = 4


def _figures(ctx: BenchContext, quant: str, packets: int, rng: np.random.Generator) -> dict:
    if quant == "int8":
        rows = packets * int8_rows_per_packet(INT8_DIM, PMTU)
        payload_len = rows * INT8_DIM * 4
    else:
        payload_len = packets * PMTU * (2 if quant != "none" else 1)     # FP32 input bytes
    dim = INT8_DIM if quant == "int8" else 0
    msg = Message(dest=0, va=0x1000_0000, rkey=1,
                  payload=rng.standard_normal(payload_len // 4).astype(np.float32).tobytes())
    ctx.progress(f"[{quant}] transmit: {packets} packets of {PMTU} B at {W} B/beat")
    dut = Packetizer(data_bytes=W, pmtu=PMTU, num_dest=1, quant=quant,
                     div_bits_per_cycle=INT8_DIV_BITS)
    tx = run_tx(dut, [msg], dim=dim)
    # steady state: from the end of the FIRST packet to the end of the LAST
    window = tx.last_beat_cycles[-1] - tx.last_beat_cycles[0]
    beats_in_window = sum(1 for c in tx.beat_cycles if c > tx.last_beat_cycles[0])
    middle = np.diff(tx.last_beat_cycles[:-1]) if packets > 2 else np.diff(tx.last_beat_cycles)
    ctx.progress(f"[{quant}] receive: {len(tx.frames)} frames")
    rxd = Depacketizer(data_bytes=W, pmtu=PMTU, num_qps=2, formats=(quant,))
    rx = run_rx(rxd, tx.frames, {DESTINATIONS[0].qpn: 0}, quant=quant, dim=dim)
    if rx.counters["accepted"] != len(tx.frames):
        raise AssertionError(f"receiver accepted {rx.counters['accepted']} of {len(tx.frames)}")
    rx_window = rx.beat_cycles[-1] - rx.beat_cycles[0] + 1
    wire_payload = sum(_payload_len(f) for f in tx.frames[1:])
    est_tx = estimate_tx([payload_len], data_bytes=W, pmtu=PMTU, quant=quant, dim=dim,
                         div_bits_per_cycle=INT8_DIV_BITS)
    est_rx = estimate_rx([payload_len], data_bytes=W, pmtu=PMTU, quant=quant, dim=dim)
    rx_measured = rx.done_cycle - rx.beat_cycles[0]
    errors = [abs(est_tx.cycles - tx.cycles) / tx.cycles, abs(est_rx - rx_measured) / rx_measured]
    embedding_bytes = payload_len * (packets - 1) / packets      # FP32 bytes in the window
    return {
        "tx_bus_occupancy": beats_in_window / window,
        "tx_cycles_per_4096B_packet": float(np.mean(middle)),
        "rx_bus_occupancy": len(rx.beat_cycles) / rx_window,
        "goodput_gbps_at_250MHz": 8 * wire_payload * CLOCK_HZ / window / 1e9,
        "embedding_gbps_at_250MHz": 8 * embedding_bytes * CLOCK_HZ / window / 1e9,
        "_errors": errors,
    }


def _payload_len(frame: bytes) -> int:
    return len(frame) - header_len(frame[42]) - ((frame[43] >> 4) & 3) - 4


def run(ctx: BenchContext) -> dict:
    rng = np.random.default_rng(ctx.seed)
    packets = 4 if ctx.quick else 10
    plain = _figures(ctx, "none", packets, rng)
    fp16 = _figures(ctx, "fp16", packets, rng)
    # INT8 streams at the input rate but is slow to simulate (16 lanes of FP arithmetic and
    # the row restore every cycle, about 10 s a packet each way in Amaranth's simulator).
    int8_packets = 3 if ctx.quick else INT8_PACKETS
    t0 = time.perf_counter()
    int8 = _figures(ctx, "int8", int8_packets, rng)
    errors = plain.pop("_errors") + fp16.pop("_errors")
    int8_errors = int8.pop("_errors")
    int8.update(dim=INT8_DIM, packets=int8_packets, timing_model_rel_error=max(int8_errors),
                div_bits_per_cycle=INT8_DIV_BITS,
                tx_cycles_per_row=int8["tx_cycles_per_4096B_packet"]
                / int8_rows_per_packet(INT8_DIM, PMTU),
                sim_seconds=round(time.perf_counter() - t0, 1))
    return {**plain, "fp16": fp16, "int8": int8,
            "timing_model_max_rel_error": max(errors + int8_errors),
            "data_bytes": W, "pmtu": PMTU, "packets": packets}
