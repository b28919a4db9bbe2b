"""CollisionCheck: a read of a ``COLLISION_X_ATTR`` memory that collides with a write is
counted and poisoned; other reads, unmarked memories and defined collisions are left alone."""

from __future__ import annotations

import pytest
from amaranth.back import rtlil
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from neonic.rtl.streams import COLLISION_X_ATTR
from neonic.sim.harness import run_amaranth
from neonic.sim.harness.collisions import CollisionCheck

OLD, NEW = 0x5A, 0xC3


class _RAM(wiring.Component):
    """One memory (16 x 8 bit, every word ``OLD``), one write and one synchronous read port,
    the read data straight out (``q``): the design that uses every read it makes."""

    def __init__(self, *, marked: bool = True, transparent: bool = False):
        self.marked, self.transparent = marked, transparent
        super().__init__({"waddr": In(4), "wdata": In(8), "we": In(1), "raddr": In(4),
                          "re": In(1), "q": Out(8)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.mem = mem = Memory(shape=8, depth=16, init=[OLD] * 16,
                                        attrs={COLLISION_X_ATTR: "1"} if self.marked else {})
        wr = mem.write_port()
        rd = mem.read_port(transparent_for=(wr,) if self.transparent else ())
        m.d.comb += [wr.addr.eq(self.waddr), wr.data.eq(self.wdata), wr.en.eq(self.we),
                     rd.addr.eq(self.raddr), rd.en.eq(self.re), self.q.eq(rd.data)]
        return m


def _run(dut, check, steps):
    """Apply ``steps`` (dicts of the inputs, one per cycle); return ``q`` after each edge."""
    seen = []

    async def tb(ctx):
        for step in steps:
            for name, value in step.items():
                ctx.set(getattr(dut, name), value)
            await ctx.tick()
            seen.append(ctx.get(dut.q))

    run_amaranth(check.design, [tb], background=[check.monitor], max_cycles=100)
    return seen


def test_a_colliding_read_is_counted_and_poisoned_until_the_next_read():
    dut = _RAM()
    check = CollisionCheck(dut)
    assert check.memories == ["mem"]
    q = _run(dut, check, [
        dict(waddr=3, wdata=NEW, we=1, raddr=3, re=1),   # collides: the old word, poisoned
        dict(we=0, re=0),                                # the port holds it, still poisoned
        dict(re=1),                                      # a clean read of the new word
    ])
    assert q == [OLD ^ 0xFF, OLD ^ 0xFF, NEW]
    assert check.collisions == {"mem": 1}


def test_reads_that_do_not_collide_are_untouched():
    dut = _RAM()
    check = CollisionCheck(dut)
    q = _run(dut, check, [
        dict(waddr=3, wdata=NEW, we=1, raddr=4, re=1),   # another address
        dict(waddr=4, wdata=NEW, we=1, raddr=4, re=0),   # same address, read not enabled
        dict(we=0, raddr=3, re=1),
    ])
    assert q == [OLD, OLD, NEW]
    assert check.collisions == {"mem": 0}


def test_counting_only_leaves_the_old_data():
    dut = _RAM()
    check = CollisionCheck(dut, poison=False)
    q = _run(dut, check, [dict(waddr=7, wdata=NEW, we=1, raddr=7, re=1)])
    assert q == [OLD] and check.collisions == {"mem": 1}


def test_a_read_transparent_to_the_write_is_defined_and_not_checked():
    dut = _RAM(transparent=True)
    check = CollisionCheck(dut)
    q = _run(dut, check, [dict(waddr=7, wdata=NEW, we=1, raddr=7, re=1)])
    assert q == [NEW] and check.collisions == {"mem": 0}


def test_a_design_without_marked_memories_is_refused_unless_allowed():
    with pytest.raises(ValueError, match="^dut: .*_RAM"):
        CollisionCheck(_RAM(marked=False))
    check = CollisionCheck(_RAM(marked=False), require_marked=False)
    assert check.memories == [] and check.collisions == {}


def test_the_checked_component_exports_with_the_units_ports_and_the_poison():
    """For a cocotb bench: the Verilog of ``component`` has the unit's ports and the poison."""
    plain = rtlil.convert(_RAM(), name="top")
    checked = rtlil.convert(CollisionCheck(_RAM()).component, name="top")

    def ports(text):                       # the top module's input and output wires
        top = text[text.index("module \\top\n"):]
        top = top[:top.index("\nend\n")]
        return sorted(line.split()[-1] for line in top.splitlines()
                      if line.strip().startswith("wire") and (" input " in line
                                                              or " output " in line))

    assert ports(checked) == ports(plain) and len(ports(plain)) == 8   # with clk and rst
    assert "poisoned" in checked and "poisoned" not in plain
