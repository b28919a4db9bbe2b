"""The depacketizer accepts scapy-built frames, writes their payload, completes messages, and
drops each kind of broken frame under its own reason without losing the next good one."""

from __future__ import annotations

import numpy as np
import pytest

from neonic.rtl.depacketizer import Depacketizer
from neonic.rtl.roce import DROP_REASONS
from neonic.sim.harness import AmaranthMemory, run_amaranth, stream_recv, stream_send
from neonic.sim.reference.roce import Completion, Destination, Message, Receiver, frame_beats
from neonic.sim.reference.roce_frames import broken_frames, scapy_message

MEM_BYTES = 1 << 16


class WriteSink:
    """Posted-write memory for 64-byte beats (sim.harness.AmaranthMemory overflows on 64-bit
    masks: reported). Random stalls on both streams; checks beat counts and ``last``."""

    def __init__(self, port, contents, data_bytes, rng, accept_stall):
        self.port, self.contents, self.w, self.rng, self.stall = (port, contents, data_bytes,
                                                                  rng, accept_stall)
        self.reqs: list[list[int]] = []
        self.beats: list[tuple[int, int, int]] = []

    def check_idle(self):
        assert not self.reqs and not self.beats, f"unmatched writes: {self.reqs} {self.beats}"

    async def process(self, ctx):
        req, wdata = self.port.req, self.port.wdata
        while True:
            rr = int(self.rng.random() >= self.stall)
            wr = int(self.rng.random() >= self.stall)
            ctx.set(req.ready, rr)
            ctx.set(wdata.ready, wr)
            _, _, rv, rp, wv, wp = await ctx.tick().sample(req.valid, req.payload, wdata.valid,
                                                           wdata.payload)
            if rr and rv:
                assert rp.write
                self.reqs.append([int(rp.addr), int(rp.beats), 0])
            if wr and wv:   # data may come before its request (posted writes)
                self.beats.append((int(wp.data), int(wp.mask), int(wp.last)))
            while self.reqs and self.beats:
                addr, beats, done = self.reqs[0]
                value, mask, last = self.beats.pop(0)
                assert last == int(done == beats - 1)
                data = value.to_bytes(self.w, "little")
                for i in range(self.w):
                    if mask >> i & 1:
                        self.contents[(addr + done) * self.w + i] = data[i]
                self.reqs[0][2] += 1
                if done + 1 == beats:
                    self.reqs.pop(0)


def run_depacketizer(dut: Depacketizer, frames: list[bytes], psns: dict[int, int], *,
                     n_completions: int, rng, idle=0.0, backpressure=0.0, accept_stall=0.0):
    """Feed ``frames``; returns (memory bytes, completions, counters dict, cycles)."""
    W = dut.data_bytes
    if W < 64:
        mem = AmaranthMemory(dut.mem, np.zeros(MEM_BYTES, np.uint8), data_bytes=W, rng=rng,
                             accept_stall=accept_stall)
    else:
        mem = WriteSink(dut.mem, np.zeros(MEM_BYTES, np.uint8), W, rng, accept_stall)
    beats = frame_beats(frames, W)
    completions: list[Completion] = []
    counters: dict[str, int] = {}

    async def source(ctx):
        await stream_send(ctx, dut.qp_init, [{"qp": q, "psn": p} for q, p in psns.items()])
        await stream_send(ctx, dut.frame, beats, rng=rng, idle=idle)
        # let the last verdicts and writes drain
        for _ in range(3 * dut.pmtu // W + 40):
            await ctx.tick()
        for name in ("accepted",) + DROP_REASONS:
            counters[name] = ctx.get(getattr(dut.counters, name))

    async def sink(ctx):
        got = await stream_recv(ctx, dut.completion, n_completions, rng=rng,
                                backpressure=backpressure) if n_completions else []
        for c in got:
            completions.append(Completion(int(c.qp), int(c.length),
                                          int(c.imm) if c.has_imm else None))

    overruns = []

    async def queue_contract(ctx):
        """The payload and verdict queues have no full check in their write paths: the
        input's registered room test must keep every write to a cycle with room."""
        while True:
            for name, q in dut.queues.items():
                if ctx.get(q.w_en) and not ctx.get(q.w_rdy):
                    overruns.append(name)
            await ctx.tick()

    cycles = run_amaranth(dut, [source, sink], processes=[mem.process],
                          background=[queue_contract], max_cycles=20000 + 8 * len(beats))
    assert not overruns, f"writes into a full queue: {overruns[:5]}"
    mem.check_idle()
    return mem.contents, completions, counters, cycles


def reference(frames, psns, num_qps, pmtu):
    rx = Receiver(num_qps=num_qps, pmtu=pmtu)
    for q, p in psns.items():
        rx.set_psn(q, p)
    for f in frames:
        rx.receive(f)
    return rx


def check_against_reference(dut, frames, psns, rng, **kw):
    rx = reference(frames, psns, dut.num_qps, dut.pmtu)
    memory, completions, counters, _ = run_depacketizer(
        dut, frames, psns, n_completions=len(rx.completions), rng=rng, **kw)
    assert completions == rx.completions
    assert counters == {"accepted": rx.accepted, **rx.drops}
    want = np.zeros(MEM_BYTES, np.uint8)
    for addr, value in rx.memory.items():
        want[addr] = value
    assert np.array_equal(memory, want)
    return rx


def good_messages(rng, W, sizes, pmtu):
    dests = [Destination(mac=0x0200_0000_0002, ip=0x0A000002, qpn=q) for q in range(4)]
    frames, psns = [], {}
    va = 0
    for i, n in enumerate(sizes):
        q = i % 4
        psns.setdefault(q, int(rng.integers(1 << 24)) if i < 4 else 0)
        msg = Message(dest=q, va=va, rkey=7, payload=rng.integers(0, 256, n, np.uint8).tobytes(),
                      imm=(i * 17 if i % 2 else None))
        va += -(-n // W) * W + W
        psn = psns[q] if i < 4 else None
        frames.append((msg, dests[q]))
    # PSNs continue per QP
    out, nxt = [], dict(psns)
    for msg, dest in frames:
        fr = scapy_message(msg, dest, nxt[msg.dest], pmtu)
        nxt[msg.dest] = (nxt[msg.dest] + len(fr)) % (1 << 24)
        out += fr
    return out, psns


@pytest.mark.parametrize("width", [8, 16, 32, 64])
def test_good_messages_written_and_completed(width, rng):
    sizes = [1, 5, 64, 127, 256, 300, 600, 1025] if width >= 32 else [1, 3, 127, 257, 600]
    frames, psns = good_messages(rng, width, sizes, 256)
    rx = check_against_reference(Depacketizer(data_bytes=width, pmtu=256, num_qps=4), frames,
                                 psns, rng, idle=0.25, backpressure=0.25, accept_stall=0.25)
    assert rx.accepted == len(frames)


@pytest.mark.parametrize("width", [8, 64])
def test_broken_frames_dropped_by_reason(width, rng):
    """Each broken frame is followed by a good one, which must pass."""
    dest = Destination(mac=0x0200_0000_0002, ip=0x0A000002, qpn=1)
    frames = []
    psn = 0
    for i in range(len(DROP_REASONS)):
        reason, bad = broken_frames(rng, dest, va=0x100, psn=psn)[i]
        frames.append(bad)
        msg = Message(dest=1, va=0x1000 + 0x100 * psn, rkey=1,
                      payload=rng.integers(0, 256, 20 + psn, np.uint8).tobytes(), imm=psn)
        frames += scapy_message(msg, dest, psn, 256)
        psn += 1
    rx = check_against_reference(Depacketizer(data_bytes=width, pmtu=256, num_qps=4), frames,
                                 {1: 0}, rng, idle=0.25, backpressure=0.25)
    assert all(rx.drops[r] == 1 for r in DROP_REASONS), rx.drops
    assert rx.accepted == len(DROP_REASONS)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("kw,match", [({"data_bytes": 4}, "data_bytes"), ({"pmtu": 8192}, "pmtu"),
                                      ({"num_qps": 300}, "num_qps")])
def test_bad_parameters(kw, match):
    with pytest.raises(ValueError, match=match):
        Depacketizer(**kw)


# ---- path MTU 4096 (the default): verdicts that wait for room in the verdict FIFO ----------

def _dest(q):
    return Destination(mac=0x0200_0000_0002, ip=0x0A000002, qpn=q)


def _broken(rng, q, psn, reason):
    return dict(broken_frames(rng, _dest(q), va=0x100, psn=psn))[reason]


def _flip_icrc(frame):
    bad = bytearray(frame)
    bad[-1] ^= 0x40
    return bytes(bad)


def pmtu4096_psn_gap_sequence(rng):
    """The sequence of issue 4: a 4 KiB message (a copy of its LAST with a bad ICRC before the
    real one), a wrong-UDP-port frame, a WRITE ONLY, a WRITE ONLY with a PSN gap, and the FIRST
    of another message. The short frames' verdicts queue behind the 4 KiB drain, and the PSN-gap
    frame's verdict is still waiting when the next FIRST starts."""
    big = Message(dest=0, va=0, rkey=7, payload=rng.integers(0, 256, 4096 + 132, np.uint8)
                  .tobytes())
    first, last = scapy_message(big, _dest(0), 10, 4096)
    only = Message(dest=1, va=0x2000, rkey=7, payload=rng.integers(0, 256, 260, np.uint8)
                   .tobytes())
    nxt = Message(dest=2, va=0x3000, rkey=7, payload=rng.integers(0, 256, 4096 + 64, np.uint8)
                  .tobytes())
    frames = [first, _flip_icrc(last), last, _broken(rng, 3, 0, "udp_port"),
              *scapy_message(only, _dest(1), 20, 4096), _broken(rng, 3, 0, "psn"),
              scapy_message(nxt, _dest(2), 30, 4096)[0]]
    assert [len(f) for f in frames] == [4170, 190, 190, 114, 334, 114, 4170]
    return frames, {0: 10, 1: 20, 2: 30, 3: 0}


def test_psn_gap_after_a_4k_message_dropped_as_psn(rng):
    """Regression (issue 4): the ICRC verdict of a frame belongs to that frame, even when its
    verdict waits and the next frame's first beats restart the CRC engine."""
    frames, psns = pmtu4096_psn_gap_sequence(rng)
    rx = check_against_reference(Depacketizer(data_bytes=64, pmtu=4096, num_qps=4), frames,
                                 psns, rng)
    assert rx.drops["psn"] == 1 and rx.drops["icrc"] == 1 and rx.drops["udp_port"] == 1
    assert rx.accepted == 4


def mixed_sequence(rng, pmtu, n_messages, va_step):
    """Messages of random sizes (short, and longer than the path MTU) on four QPs, with broken
    frames (bad ICRC copies, frames broken in one random way) and some lost frames among them."""
    nxt = {q: int(rng.integers(1 << 24)) for q in range(4)}
    psns = dict(nxt)
    reasons = list(DROP_REASONS)
    out = []
    for i in range(n_messages):
        q = int(rng.integers(4))
        n = int(rng.integers(1, 300) if rng.random() < 0.4 else rng.integers(pmtu, 2 * pmtu))
        msg = Message(dest=q, va=i * va_step, rkey=7,
                      payload=rng.integers(0, 256, n, np.uint8).tobytes(),
                      imm=int(rng.integers(1 << 32)) if rng.random() < 0.5 else None)
        frames = scapy_message(msg, _dest(q), nxt[q], pmtu)
        nxt[q] = (nxt[q] + len(frames)) % (1 << 24)
        for fr in frames:
            if rng.random() < 0.3:
                out.append(_flip_icrc(fr))
            for _ in range(int(rng.integers(0, 5))):   # bursts of short frames fill the FIFOs
                other = int(rng.integers(4))
                out.append(_broken(rng, other, nxt[other], reasons[int(rng.integers(len(reasons)))]))
            if rng.random() >= 0.05:      # else lost: the rest of its message is dropped
                out.append(fr)
    return out, psns


@pytest.mark.parametrize("stall", [0.0, 0.3])
def test_mixed_good_and_broken_frames_at_pmtu_4096(stall, rng):
    frames, psns = mixed_sequence(rng, 4096, 6, 0x2000 + 0x40)
    rx = check_against_reference(Depacketizer(data_bytes=64, pmtu=4096, num_qps=4), frames,
                                 psns, rng, idle=stall, backpressure=stall, accept_stall=stall)
    assert rx.accepted > 0 and sum(rx.drops.values()) > 0


@pytest.mark.parametrize("width", [8, 64])
def test_frames_longer_than_the_path_mtu_are_dropped_and_the_next_passes(width, rng):
    """WRITE ONLY frames carrying 4 KiB and 1 KiB to a receiver at a 256 B path MTU (16x and
    4x what its payload FIFO holds at 8 B a beat) are dropped as ``length`` without filling the
    FIFO, and the frames after them pass, under idle and backpressure."""
    frames = []
    for i, n in enumerate((4096, 100, 1024, 200)):
        msg = Message(dest=1, va=0x1000 * (i + 1), rkey=1,
                      payload=rng.integers(0, 256, n, np.uint8).tobytes(), imm=i)
        frames += scapy_message(msg, _dest(1), i // 2, 4096)    # a dropped frame uses no PSN
    rx = check_against_reference(Depacketizer(data_bytes=width, pmtu=256, num_qps=4), frames,
                                 {1: 0}, rng, idle=0.25, backpressure=0.25, accept_stall=0.25)
    assert rx.drops["length"] == 2 and rx.accepted == 2


@pytest.mark.parametrize("stall", [0.0, 0.25])
def test_back_to_back_one_and_two_beat_frames_on_one_qp(stall, rng):
    """WRITE ONLY messages of 1..60 bytes on one QP at 64 B a beat: two- and three-beat frames
    (the shortest a WRITE ONLY can be) whose verdicts follow each other as closely as the input
    allows, each checked against the PSN and address the previous one left (the verdict's
    update forwarded to the next frame's read)."""
    frames, va = [], 0x400
    for psn in range(24):
        n = int(rng.integers(1, 61))
        msg = Message(dest=2, va=va, rkey=3, payload=rng.integers(0, 256, n, np.uint8).tobytes(),
                      imm=psn if psn % 3 else None)
        frames += scapy_message(msg, _dest(2), psn, 256)
        va += 64 * (-(-n // 64) + 1)
    assert {-(-len(f) // 64) for f in frames} == {2, 3}
    rx = check_against_reference(Depacketizer(data_bytes=64, pmtu=256, num_qps=4), frames,
                                 {2: 0}, rng, idle=stall, backpressure=stall, accept_stall=stall)
    assert rx.accepted == len(frames)


def test_a_slow_memory_fills_the_payload_queue_without_overrunning_it(rng):
    """Frames back to back into a memory that takes a write one cycle in five: the payload
    queue runs full, the input's registered room test holds the frames back, and no write
    reaches a full queue (``run_depacketizer`` checks every cycle; with three entries less in
    reserve, ``_PFIFO_RESERVE`` = 5, this sequence overruns it)."""
    frames, psns = mixed_sequence(rng, 256, 6, 0x2000 + 0x40)
    rx = check_against_reference(Depacketizer(data_bytes=16, pmtu=256, num_qps=4), frames,
                                 psns, rng, accept_stall=0.8)
    assert rx.accepted > 0
