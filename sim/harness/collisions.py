"""Checking in simulation that no marked memory uses a read that collides with a write.

``rtl.streams.COLLISION_X_ATTR`` on a memory is a designer's claim: the design never uses the
data of a read of the address written in the same cycle. The FPGA flow acts on the claim (the
block RAM's read data become undefined on such a collision, so yosys drops the compare,
register and LUT that would emulate Amaranth's read-old-data semantics behind the block
RAM). If the claim were false, the synthesised design would differ from the simulated one.

:class:`CollisionCheck` makes the claim checked, not claimed, in any Amaranth test of a unit
with marked memories:

* **Poison.** On every cycle where a read port of a marked memory is enabled and a write port
  of the same memory (in the same clock domain, the read not transparent to it) writes the
  address it reads, the read's data are replaced by their bitwise complement for as long as
  the port holds them (until its next enabled read). That is one of the values an undefined
  collision may give, and never the old data the design would otherwise see: if the design
  uses such a read anywhere (a tag compare, a beat sent out, a word written back), the
  results the test checks (its scoreboard and reference model) change, and the test fails.
  The design itself is not changed: the check rewires the simulated netlist only.
* **Count.** A background testbench counts, per memory, the cycles where an enabled read
  collides with a write, so a test can assert that its traffic exercised collisions at all
  (a check that never fires proves nothing) and the failure of a test can name the memories
  whose collisions it saw (:meth:`CollisionCheck.summary`).

Usage::

    check = CollisionCheck(dut)                 # elaborates dut; finds the marked memories
    run_amaranth(check.design, [...], background=[check.monitor], ...)
    assert check.collisions["line_ram/mem"] > 0

The check reaches into Amaranth's elaborated memory fragments (``MemoryInstance``'s port
records), which are internal to Amaranth 0.5; ``pyproject.toml`` pins ``amaranth<0.6``.
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import Cat, Elaboratable, Fragment, Module, Mux, Signal
from amaranth.hdl._mem import MemoryInstance

from neonic.rtl.streams import COLLISION_X_ATTR

__all__ = ["CollisionCheck", "marked_memories"]


@dataclass(frozen=True)
class _Marked:
    """One marked memory of an elaborated design: its hierarchical name and fragment."""

    path: str
    instance: MemoryInstance


def marked_memories(design: Fragment) -> list[_Marked]:
    """Every memory of the elaborated ``design`` that carries ``COLLISION_X_ATTR``, with its
    hierarchical name (submodule names joined by ``/``)."""
    found: list[_Marked] = []

    def walk(fragment: Fragment, path: tuple[str, ...]) -> None:
        if isinstance(fragment, MemoryInstance) and COLLISION_X_ATTR in fragment._attrs:
            found.append(_Marked("/".join(path), fragment))
        for k, (sub, name, *_rest) in enumerate(fragment.subfragments):
            walk(sub, path + (str(name) if name is not None else f"unnamed{k}",))

    walk(design, ())
    return found


class CollisionCheck:
    """Poisons and counts same-cycle read/write collisions of the marked memories of ``dut``
    (see the module docstring).

    Parameters
    ----------
    dut : the elaboratable under test; it is elaborated here, and :attr:`design` (the
        rewired fragment) is what the simulator must run in its place.
    poison : replace a colliding read's data by their complement (default); ``False`` only
        counts.
    require_marked : raise ``ValueError`` if ``dut`` has no marked memory (default), so a
        test cannot silently check nothing.

    Attributes
    ----------
    design : the ``Fragment`` to simulate (``Simulator(design)``, ``run_amaranth(design, ...)``);
        one elaboration of ``dut``, so a check serves one simulation or one export.
    memories : the hierarchical names of the marked memories found.
    collisions : per memory name, the cycles counted so far where an enabled read of it
        collided with a write (filled by :meth:`monitor`).
    """

    def __init__(self, dut, *, poison: bool = True, require_marked: bool = True):
        self._dut = dut
        self.design = Fragment.get(dut, None)
        marked = marked_memories(self.design)
        if require_marked and not marked:
            raise ValueError(f"dut: expected a design with at least one memory marked "
                             f"{COLLISION_X_ATTR!r}, found none in {type(dut).__name__}")
        self.memories = [mem.path for mem in marked]
        self.collisions = {mem.path: 0 for mem in marked}
        self._probes: list[tuple[str, Signal]] = []
        m = Module()
        for mem in marked:
            self._instrument(m, mem, poison)
        self.design.add_subfragment(Fragment.get(m, None), "collision_check")

    def _instrument(self, m: Module, mem: _Marked, poison: bool) -> None:
        inst = mem.instance
        for r, rp in enumerate(inst._read_ports):
            if rp._domain == "comb":
                continue                        # asynchronous reads see the write next cycle
            hits = []
            for w, wp in enumerate(inst._write_ports):
                if wp._domain != rp._domain or w in rp._transparent_for:
                    continue                    # defined: another clock, or the new data
                hits.append(wp._en.any() & (wp._addr == rp._addr))
            if not hits:
                continue
            name = mem.path.replace("/", "__") + f"__rd{r}"
            collide = Signal(name=f"{name}__collide")
            m.d.comb += collide.eq(rp._en & Cat(*hits).any())
            self._probes.append((mem.path, collide))
            if not poison:
                continue
            # The port's data as the memory drives them (`raw`), and whether the read that
            # produced them collided (`poisoned`, held while the port holds its data).
            data = rp._data
            raw = Signal(len(data), name=f"{name}__raw")
            poisoned = Signal(name=f"{name}__poisoned")
            rp._data = raw
            with m.If(rp._en):
                m.d[rp._domain] += poisoned.eq(collide)
            m.d.comb += data.eq(Mux(poisoned, ~raw, raw))

    @property
    def component(self) -> "_Checked":
        """``dut`` with the check inside, for a Verilog export (``run_cocotb``): the same
        signature and port signals as ``dut``, elaborating to :attr:`design`, so a cocotb
        bench's scoreboard sees the poisoned reads too (the counts are the Amaranth
        simulator's only)."""
        return _Checked(self._dut, self.design)

    async def monitor(self, ctx) -> None:
        """A background testbench: counts the collisions of every marked memory, per cycle
        (the values the flip-flops see at each edge)."""
        if not self._probes:
            return
        signals = [sig for _path, sig in self._probes]
        async for _clk, _rst, *values in ctx.tick().sample(*signals):
            for (path, _sig), value in zip(self._probes, values):
                if value:
                    self.collisions[path] += 1

    def summary(self) -> str:
        """One line per marked memory: its name and the collisions counted."""
        return "; ".join(f"{path}: {n} colliding read(s)" for path, n in self.collisions.items())


class _Checked(Elaboratable):
    """A unit's ports (its signature, its port signals) over its rewired design."""

    def __init__(self, dut, design: Fragment):
        self._dut = dut
        self._design = design
        self.signature = dut.signature

    def __getattr__(self, name):
        return getattr(self._dut, name)

    def elaborate(self, platform):
        return self._design
