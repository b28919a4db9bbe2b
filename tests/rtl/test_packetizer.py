"""The packetizer's frames equal scapy's, byte for byte, under random idle and backpressure."""

from __future__ import annotations

import numpy as np
import pytest

from neonic.rtl.packetizer import Packetizer
from neonic.sim.harness import run_amaranth, stream_recv, stream_send
from neonic.sim.reference.roce import Destination, Message, segment
from neonic.sim.reference.roce_frames import LOCAL_IP, LOCAL_MAC, scapy_message

DESTS = [Destination(mac=0x02_00_00_00_10_00 + i, ip=0x0A_00_01_00 + i, qpn=0x100 + 3 * i,
                     udp_sport=0xC000 + i) for i in range(4)]


def descriptor(msg: Message) -> dict:
    """The packetizer's descriptor of ``msg``."""
    return {"dest": msg.dest, "va": msg.va, "rkey": msg.rkey, "length": len(msg.payload),
            "imm": msg.imm or 0, "has_imm": int(msg.imm is not None)}


def payload_beats(messages: list[Message], W: int) -> list[int]:
    """The messages' payloads as ``W``-byte beats, each message padded to whole beats."""
    beats = []
    for msg in messages:
        padded = msg.payload + bytes(-len(msg.payload) % W)
        beats += [int.from_bytes(padded[i:i + W], "little") for i in range(0, len(padded), W)]
    return beats


def frame_sink(dut: Packetizer, frames: list[bytes], n_frames: int, *, rng=None,
               backpressure=0.0):
    """A process that receives ``n_frames`` frames from ``dut.frame`` into ``frames`` (with
    random backpressure), checking that only a frame's last beat is partial."""
    W = dut.data_bytes

    async def sink(ctx):
        current = b""
        while len(frames) < n_frames:
            (beat,) = await stream_recv(ctx, dut.frame, 1, rng=rng, backpressure=backpressure)
            data = int(beat.data).to_bytes(W, "little")
            if beat.last:
                assert 1 <= beat.count <= W
                frames.append(current + data[:beat.count])
                current = b""
            else:
                assert beat.count == W
                current += data
    return sink


def run_packetizer(dut: Packetizer, messages: list[Message], psns: dict[int, int], *,
                   rng=None, idle=0.0, backpressure=0.0, max_cycles=None, vcd=None):
    """Drive ``messages`` through ``dut``; returns (frames as bytes, cycles, beat count)."""
    W = dut.data_bytes
    n_frames = sum(len(segment(len(msg.payload), dut.pmtu, msg.imm is not None))
                   for msg in messages)

    async def setup_and_descs(ctx):
        ctx.set(dut.local_mac, LOCAL_MAC)
        ctx.set(dut.local_ip, LOCAL_IP)
        rows = [{"index": i, "mac": d.mac, "ip": d.ip, "qpn": d.qpn, "udp_sport": d.udp_sport,
                 "psn": psns.get(i, 0)} for i, d in enumerate(DESTS[:dut.num_dest])]
        await stream_send(ctx, dut.table, rows)
        await stream_send(ctx, dut.desc, [descriptor(m) for m in messages], rng=rng, idle=idle)

    async def payload(ctx):
        await stream_send(ctx, dut.payload, payload_beats(messages, W), rng=rng, idle=idle)

    frames: list[bytes] = []
    sink = frame_sink(dut, frames, n_frames, rng=rng, backpressure=backpressure)

    total = sum(len(msg.payload) for msg in messages)
    limit = max_cycles or 2000 + 4 * (total // W + 10 * n_frames) * (1 + int(idle + backpressure > 0))
    cycles = run_amaranth(dut, [setup_and_descs, payload, sink], max_cycles=limit, vcd=vcd)
    return frames, cycles


def expected(messages, psns, pmtu):
    out = []
    next_psn = dict(psns)
    for msg in messages:
        psn = next_psn.get(msg.dest, 0)
        fr = scapy_message(msg, DESTS[msg.dest], psn, pmtu)
        next_psn[msg.dest] = (psn + len(fr)) % (1 << 24)
        out += fr
    return out


def make_messages(rng, sizes, imms, num_dest=4):
    return [Message(dest=int(rng.integers(num_dest)), va=int(rng.integers(1 << 63)),
                    rkey=int(rng.integers(1 << 32)),
                    payload=rng.integers(0, 256, n, dtype=np.uint8).tobytes(),
                    imm=(int(rng.integers(1 << 32)) if imm else None))
            for n, imm in zip(sizes, imms)]


def check(dut, messages, psns, rng, idle=0.25, backpressure=0.25):
    frames, _ = run_packetizer(dut, messages, psns, rng=rng, idle=idle, backpressure=backpressure)
    golden = expected(messages, psns, dut.pmtu)
    assert len(frames) == len(golden)
    for i, (got, want) in enumerate(zip(frames, golden)):
        assert got == want, f"frame {i}: got {got.hex()} want {want.hex()}"


@pytest.mark.parametrize("width", [8, 16, 32, 64])
def test_small_payloads_match_scapy(width, rng):
    """ONLY packets with and without immediate, sampled payload sizes 1..127."""
    sizes = sorted(set(rng.choice(np.arange(1, 128), 10, replace=False).tolist()) | {1, 4, 127})
    msgs = make_messages(rng, sizes, [i % 2 for i in range(len(sizes))])
    check(Packetizer(data_bytes=width, pmtu=256, num_dest=4), msgs, {0: 5, 1: 0, 2: 77, 3: 1},
          rng)


@pytest.mark.parametrize("width", [8, 64])
def test_multi_packet_and_psn_wrap(width, rng):
    """FIRST/MIDDLE/LAST (with and without immediate) with PSNs wrapping at 2**24; 512, 1500
    and 4096-byte messages at a 1024-byte path MTU."""
    sizes = [512, 1500, 4096, 1025, 3 * 1024]
    msgs = make_messages(rng, sizes, [0, 1, 0, 1, 1], num_dest=2)
    check(Packetizer(data_bytes=width, pmtu=1024, num_dest=2), msgs,
          {0: (1 << 24) - 3, 1: (1 << 24) - 1}, rng)


def test_back_to_back_4096_at_64_bytes(rng):
    """With no idle and no backpressure, 4096-byte MIDDLE packets take 65 cycles each."""
    dut = Packetizer(data_bytes=64, pmtu=4096, num_dest=1)
    msgs = make_messages(rng, [4 * 4096], [0], num_dest=1)
    frames, cycles = run_packetizer(dut, msgs, {})
    assert frames == expected(msgs, {}, 4096)
    beats = sum(-(-len(f) // 64) for f in frames)
    assert [-(-len(f) // 64) for f in frames[1:]] == [65] * 3
    # setup: table write, descriptor, the destination row's read, three plan stages and three
    # output registers; then one beat per cycle
    assert cycles - beats <= 10, (cycles, beats)


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
@pytest.mark.parametrize("kw,match", [({"data_bytes": 12}, "data_bytes"), ({"pmtu": 100}, "pmtu"),
                                      ({"num_dest": 0}, "num_dest"), ({"quant": "int4"}, "quant"),
                                      ({"quant": "int8", "max_dim": 250}, "max_dim"),
                                      ({"quant": "int8", "div_bits_per_cycle": 0},
                                       "div_bits_per_cycle"),
                                      ({"div_bits_per_cycle": 28}, "div_bits_per_cycle")])
def test_bad_parameters(kw, match):
    with pytest.raises(ValueError, match=match):
        Packetizer(**kw)


@pytest.mark.slow
@pytest.mark.parametrize("width", [8, 16, 32, 64])
def test_all_small_sizes(width, rng):
    sizes = list(range(1, 128))
    msgs = make_messages(rng, sizes, [i % 2 for i in range(len(sizes))])
    check(Packetizer(data_bytes=width, pmtu=256, num_dest=4), msgs, {0: (1 << 24) - 40}, rng)


@pytest.mark.parametrize("width", [8, 64])
@pytest.mark.parametrize("stages,group_bits", [(1, None), (2, None), (3, None), (3, 32),
                                               (3, 24)])
def test_icrc_engine_matches_lib_crc(width, stages, group_bits, rng):
    """The parallel ICRC engine computes amaranth.lib.crc's algorithm (its software model),
    ``stages`` cycles after each word (two: the feed is registered first; three: then the
    word's contribution, as one parity or one per ``group_bits`` bits of the word); a restart
    between words starts a new CRC."""
    from neonic.rtl.roce import ICRC_ALGORITHM, ICRCEngine
    words = [int.from_bytes(rng.integers(0, 256, width, dtype=np.uint8).tobytes(), "little")
             for _ in range(5)] + [(1 << (8 * width)) - 1]
    starts = [True, False, False, True, False, False]
    dut = ICRCEngine(width, stages=stages, group_bits=group_bits)
    got = []

    async def tb(ctx):
        for i, w in enumerate(words + [0] * (stages - 1)):
            ctx.set(dut.start, i < len(words) and starts[i])
            ctx.set(dut.valid, i < len(words))
            ctx.set(dut.data, w)
            await ctx.tick()
            got.append(ctx.get(dut.crc))

    run_amaranth(dut, [tb], max_cycles=100)
    params = ICRC_ALGORITHM(8 * width)
    want = [params.compute(words[:i + 1]) if i < 3 else params.compute(words[3:i + 1])
            for i in range(len(words))]
    assert got[stages - 1:] == want


@pytest.mark.parametrize("stages", [2, 3])
def test_icrc_engine_stages_hold_with_en(stages, rng):
    """Stages moved by ``en`` like a chain of registers with valid/ready (a stage takes a new
    word when it holds none or its word moves on; the last one under random backpressure,
    words offered at random): the register still ends at the CRC of the words in order, and
    ``crc`` changes exactly once per word, to the CRC of the words so far."""
    from neonic.rtl.roce import ICRC_ALGORITHM, ICRCEngine
    width = 8
    words = [int(x) for x in rng.integers(0, 1 << 62, 12)]
    dut = ICRCEngine(width, stages=stages)
    seen = []

    async def tb(ctx):
        i = 0
        full = [False] * (stages - 1)      # stages before the register hold a word
        for _ in range(300):
            offer = i < len(words) and bool(rng.integers(0, 2))
            en = [False] * stages
            en[-1] = bool(rng.integers(0, 2))
            for s in reversed(range(stages - 1)):
                en[s] = not full[s] or en[s + 1]
            for s in reversed(range(stages - 1)):
                if en[s]:
                    full[s] = offer if s == 0 else full[s - 1]
            ctx.set(dut.en, sum(int(e) << s for s, e in enumerate(en)))
            ctx.set(dut.valid, offer)
            ctx.set(dut.start, offer and i == 0)
            ctx.set(dut.data, words[i] if offer else 0)
            await ctx.tick()
            if offer and en[0]:
                i += 1
            seen.append(ctx.get(dut.crc))
        assert i == len(words)
        ctx.set(dut.en, (1 << stages) - 1)
        ctx.set(dut.valid, 0)
        for _ in range(stages):
            await ctx.tick()
        seen.append(ctx.get(dut.crc))

    run_amaranth(dut, [tb], max_cycles=400)
    params = ICRC_ALGORITHM(8 * width)
    prefixes = [params.compute(words[:n]) for n in range(1, len(words) + 1)]
    changes = [c for a, c in zip(seen, seen[1:]) if c != a]
    assert changes == prefixes


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_icrc_engine_stages_are_checked():
    from neonic.rtl.roce import ICRCEngine
    with pytest.raises(ValueError, match="stages"):
        ICRCEngine(8, stages=4)
    with pytest.raises(ValueError, match="group_bits"):
        ICRCEngine(8, stages=2, group_bits=32)


@pytest.mark.parametrize("width,quant,dim,rows", [(8, "int8", 6, [2, 23]), (32, "int8", 16, [12, 3]),
                                                  (16, "fp16", 5, [3, 7])])
def test_quantized_frames_match_reference(width, quant, dim, rows, rng):
    """Quantized on the fly: the frames carry the reference model's wire image (INT8: scale,
    bias and codes per row, whole rows per packet with zero fill; FP16: lengths that are not
    a multiple of two beats), byte for byte, under idle and backpressure."""
    from neonic.sim.reference.roce import build_frames, quantize
    dut = Packetizer(data_bytes=width, pmtu=256, num_dest=1, quant=quant, max_dim=max(8, dim))
    values = [rng.standard_normal((n, dim)).astype(np.float32) for n in rows]
    frames = []

    async def host(ctx):
        ctx.set(dut.local_mac, LOCAL_MAC)
        ctx.set(dut.local_ip, LOCAL_IP)
        d = DESTS[0]
        await stream_send(ctx, dut.table, [{"index": 0, "mac": d.mac, "ip": d.ip, "qpn": d.qpn,
                                            "udp_sport": d.udp_sport, "psn": (1 << 24) - 1}])
        await stream_send(ctx, dut.desc, [{"dest": 0, "va": 64 * i, "rkey": 3, "imm": i,
                                           "length": v.nbytes, "has_imm": 1, "dim": dim}
                                          for i, v in enumerate(values)], rng=rng, idle=0.25)

    async def payload(ctx):
        raw = [v.tobytes() + bytes(-v.nbytes % width) for v in values]
        await stream_send(ctx, dut.payload, [int.from_bytes(r[i:i + width], "little")
                                             for r in raw for i in range(0, len(r), width)],
                          rng=rng, idle=0.25)

    golden, psn = [], (1 << 24) - 1
    for i, v in enumerate(values):
        msg = Message(0, 64 * i, 3, quantize(v, quant, dim=dim, pmtu=256), imm=i)
        fr = build_frames(msg, DESTS[0], local_mac=LOCAL_MAC, local_ip=LOCAL_IP, psn=psn,
                          pmtu=256)
        psn = (psn + len(fr)) % (1 << 24)
        golden += [f.data for f in fr]

    sink = frame_sink(dut, frames, len(golden), rng=rng, backpressure=0.25)
    run_amaranth(dut, [host, payload, sink], max_cycles=20000)
    assert len(golden) == (3 if quant == "int8" else 2)
    assert frames == golden


def test_a_row_rewritten_between_messages_is_used_by_the_next(rng):
    """The destination row is read a cycle after the descriptor, into registers of its own:
    a message after a rewrite of its row (new addresses and PSN) carries the new row, and one
    after a message to the same row continues its PSN. The rewrite is offered while the
    message before it is still in the plan, so it waits for that message's end."""
    W = 16
    dut = Packetizer(data_bytes=W, pmtu=256, num_dest=4)
    msgs = make_messages(rng, [300, 40, 100, 64], [0, 1, 0, 1], num_dest=1)
    new = Destination(mac=0x02_AA_00_00_00_01, ip=0x0A_00_09_09, qpn=0x777, udp_sport=0xC0DE)
    rows = [{"index": i, "mac": d.mac, "ip": d.ip, "qpn": d.qpn, "udp_sport": d.udp_sport,
             "psn": 10 * i} for i, d in enumerate(DESTS)]
    frames: list[bytes] = []

    async def host(ctx):
        ctx.set(dut.local_mac, LOCAL_MAC)
        ctx.set(dut.local_ip, LOCAL_IP)
        await stream_send(ctx, dut.table, rows)
        await stream_send(ctx, dut.desc, [descriptor(msgs[0]), descriptor(msgs[1])])
        # the rewrite is offered while message 1 is still being planned
        await stream_send(ctx, dut.table, [{"index": 0, "mac": new.mac, "ip": new.ip,
                                            "qpn": new.qpn, "udp_sport": new.udp_sport,
                                            "psn": 5000}])
        await stream_send(ctx, dut.desc, [descriptor(msgs[2]), descriptor(msgs[3])])

    async def payload(ctx):
        await stream_send(ctx, dut.payload, payload_beats(msgs, W), rng=rng, idle=0.2)

    want = (scapy_message(msgs[0], DESTS[0], 0, 256) + scapy_message(msgs[1], DESTS[0], 2, 256)
            + scapy_message(msgs[2], new, 5000, 256) + scapy_message(msgs[3], new, 5001, 256))

    sink = frame_sink(dut, frames, len(want), rng=rng, backpressure=0.2)
    run_amaranth(dut, [host, payload, sink], max_cycles=5000)
    assert len(frames) == len(want)
    for i, (got, exp) in enumerate(zip(frames, want)):
        assert got == exp, f"frame {i}: got {got.hex()} want {exp.hex()}"


@pytest.mark.parametrize("width", [8, 64])
def test_back_to_back_messages_to_one_row_continue_its_psn(width, rng):
    """Messages to one row with no idle and no backpressure: each descriptor is taken the
    cycle after the previous message's last packet is planned, while that message's PSN is
    still on its way back to the row (written a cycle later, from registers); every frame's
    PSN continues the row's count."""
    msgs = make_messages(rng, [1, 40, 300, 8, 600, 2], [0, 1, 0, 0, 1, 1], num_dest=1)
    check(Packetizer(data_bytes=width, pmtu=256, num_dest=2), msgs, {0: (1 << 24) - 2}, rng,
          idle=0.0, backpressure=0.0)
