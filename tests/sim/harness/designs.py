"""Tiny designs that exercise the harness (shared by the Amaranth tests and the cocotb benches).

They are deliberately simple but real: FIFOs on every path, so that handshakes are registered
and backpressure propagates with latency, as in the units the harness is for.
"""

from __future__ import annotations

from amaranth.hdl import Module, Shape, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from rtl.streams import MemPortSignature, MemRequest, MemResponseBeat, MemWriteBeat

__all__ = ["PAYLOAD", "StreamPassthrough", "MemInitiator"]

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
