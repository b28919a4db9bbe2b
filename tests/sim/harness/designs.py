"""Tiny designs that exercise the harness (shared by the Amaranth tests and the cocotb benches).

They are deliberately simple but real: FIFOs on every path, so that handshakes are registered
and backpressure propagates with latency, as in the units the harness is for.
"""

from __future__ import annotations

import numpy as np
from amaranth.hdl import Module, Shape, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from neonic.rtl.streams import MemPortSignature, MemRequest, MemResponseBeat, MemWriteBeat

__all__ = ["PAYLOAD", "StreamPassthrough", "MemInitiator", "HarnessTop", "random_payloads",
           "random_mem_ops"]

# A nested payload: struct with an array and a signed field, to prove packing round-trips.
PAYLOAD = data.StructLayout({
    "tag": unsigned(5),
    "pair": data.ArrayLayout(unsigned(3), 2),
    "value": data.StructLayout({"lo": unsigned(7), "neg": Shape(4, signed=True)}),
    "last": unsigned(1),
})


def _fifo_stage(m: Module, name: str, i, o, depth: int) -> None:
    """``i`` (a stream sink) -> a buffered FIFO -> ``o`` (a stream source)."""
    width = Shape.cast(i.payload.shape()).width
    f = fifo.SyncFIFOBuffered(width=width, depth=depth)
    m.submodules[name] = f
    m.d.comb += [
        f.w_data.eq(i.payload), f.w_en.eq(i.valid), i.ready.eq(f.w_rdy),
        o.payload.eq(f.r_data), o.valid.eq(f.r_rdy), f.r_en.eq(o.ready),
    ]


class StreamPassthrough(wiring.Component):
    """``i`` -> FIFO of ``depth`` -> ``o``; payloads come out unchanged and in order."""

    def __init__(self, layout=PAYLOAD, depth: int = 4):
        self.layout = layout
        self.depth = depth
        super().__init__({"i": In(stream.Signature(layout)), "o": Out(stream.Signature(layout))})

    def elaborate(self, platform):
        m = Module()
        _fifo_stage(m, "fifo", self.i, self.o, self.depth)
        return m


class MemInitiator(wiring.Component):
    """Forwards commands and write data to a memory port and read data back, through FIFOs.

    ``cmd`` carries memory requests, ``wr`` write beats, ``rd`` the read response beats; the
    memory port is ``mem``. A test drives the streams and checks memory contents and read data.
    """

    def __init__(self, *, addr_width: int = 16, beats_width: int = 4, data_bytes: int = 8,
                 depth: int = 4):
        self.port_signature = MemPortSignature(addr_width=addr_width, beats_width=beats_width,
                                               data_bytes=data_bytes)
        self.depth = depth
        super().__init__({
            "cmd": In(stream.Signature(MemRequest(addr_width, beats_width))),
            "wr": In(stream.Signature(MemWriteBeat(data_bytes))),
            "rd": Out(stream.Signature(MemResponseBeat(data_bytes))),
            "mem": Out(self.port_signature),
        })

    def elaborate(self, platform):
        m = Module()
        _fifo_stage(m, "cmd_fifo", self.cmd, self.mem.req, self.depth)
        _fifo_stage(m, "wr_fifo", self.wr, self.mem.wdata, self.depth)
        _fifo_stage(m, "rd_fifo", self.mem.resp, self.rd, self.depth)
        return m


class HarnessTop(wiring.Component):
    """Both designs side by side (ports ``i``/``o`` and ``cmd``/``wr``/``rd``/``mem``), so
    that every cocotb bench of the harness shares one Verilog build per simulator."""

    def __init__(self, *, layout=PAYLOAD, addr_width: int = 16, beats_width: int = 4,
                 data_bytes: int = 8):
        self.passthrough = StreamPassthrough(layout)
        self.initiator = MemInitiator(addr_width=addr_width, beats_width=beats_width,
                                      data_bytes=data_bytes)
        super().__init__({
            **self.passthrough.signature.members,
            **self.initiator.signature.members,
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.passthrough = self.passthrough
        m.submodules.initiator = self.initiator
        for name in self.passthrough.signature.members:
            wiring.connect(m, wiring.flipped(getattr(self, name)),
                           getattr(self.passthrough, name))
        for name in self.initiator.signature.members:
            wiring.connect(m, wiring.flipped(getattr(self, name)),
                           getattr(self.initiator, name))
        return m


def random_payloads(rng, n: int) -> list[dict]:
    """``n`` random PAYLOAD values (as dicts), ``last`` set on the final one."""
    return [{"tag": int(rng.integers(32)),
             "pair": [int(x) for x in rng.integers(8, size=2)],
             "value": {"lo": int(rng.integers(128)), "neg": int(rng.integers(-8, 8))},
             "last": int(i == n - 1)} for i in range(n)]


def random_mem_ops(rng, n: int, beats_total: int, data_bytes: int, max_beats: int = 4):
    """Random reads and masked writes; returns (commands, write beats, expected read beats,
    final memory) from a plain in-order model of the memory."""
    model = rng.integers(0, 256, size=beats_total * data_bytes, dtype=np.uint8)
    initial = model.copy()
    cmds, wbeats, reads = [], [], []
    for _ in range(n):
        beats = int(rng.integers(1, max_beats + 1))
        addr = int(rng.integers(0, beats_total - beats + 1))
        write = bool(rng.random() < 0.5)
        cmds.append({"addr": addr, "beats": beats, "write": int(write)})
        for i in range(beats):
            lo = (addr + i) * data_bytes
            if write:
                data = int.from_bytes(rng.bytes(data_bytes), "little")
                mask = int(rng.integers(0, 2**data_bytes))
                wbeats.append({"data": data, "mask": mask, "last": int(i == beats - 1)})
                new = np.frombuffer(data.to_bytes(data_bytes, "little"), np.uint8)
                enable = [(mask >> b) & 1 == 1 for b in range(data_bytes)]
                model[lo:lo + data_bytes][enable] = new[enable]
            else:
                reads.append({"data": int.from_bytes(model[lo:lo + data_bytes].tobytes(),
                                                     "little"),
                              "last": int(i == beats - 1)})
    return initial, cmds, wbeats, reads, model
