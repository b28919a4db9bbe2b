"""Shared resources on the discrete-event engine: GPUs (SMs + HBM), copy engines, host links,
fixed-function units.

Everything here advances a :class:`sim.engine.Engine` (integer picoseconds) and calls back when a
piece of work finishes, so that the pipeline schedule (``host/schedule.py``) can start what
depends on it.

Model
    :class:`SharedPool` is processor sharing over several capacities at once (a *multi-resource
    progressive-filling* allocation). A task declares, per capacity, the share it uses when it
    runs at full (isolated) speed, e.g. a GEMM that keeps 90% of the SMs and 20% of HBM busy.
    Concurrent tasks all slow down by the same factor until some capacity saturates (max-min
    fair rates); tasks of a higher priority class are served first and lower classes share
    what is left (CUDA stream priority). A task's rate can also be capped (SM partitioning).
    While more than one task runs, every capacity loses ``interference`` of itself (cache and
    scheduler interference between co-running kernels; C3, arXiv 2412.14335, shows realized
    overlap falls short of ideal; the default fraction is an assumption).

    :class:`GPUDevice` (defined in :mod:`sim.interference`, re-exported here) is one GPU:
    SMs handed out by block scheduling with stream priority and partitioning, HBM shared by
    rate, collectives as persistent channel kernels or on the copy engines, their network
    flows limited by what the GPU can feed (the levers C3 studies; see that module).

    :class:`BandwidthLink` is a link shared by concurrent transfers (PCIe host links, CPU-GPU
    copies); :class:`ServerPool` is k identical FIFO servers (copy engines, NIC units, CPU
    sockets).

API
    ``pool = SharedPool(engine, {"sm": 1.0, "hbm": 1.0}, interference=0.1, name=...)``;
    ``pool.submit(duration_ps, demand={"sm": 0.9}, on_done=fn, priority=0, max_rate=1.0)``;
    ``pool.reserve(demand) -> handle``, ``pool.release(handle)``; ``pool.busy_ps(capacity)``.
    ``gpu = GPUDevice(engine, spec, name="gpu0", comm_priority=1, sm_partition_comm=0.1)``;
    ``gpu.launch(cost, on_done, priority=0, ctas=None)``;
    ``gpu.comm_begin(link_gbytes_per_s, reduce_fraction) -> handle``; ``gpu.comm_end(h)``;
    ``gpu.utilization(elapsed_ps) -> {"sm": .., "hbm": ..}`` (see :mod:`sim.interference`).
    ``link = BandwidthLink(engine, gbytes_per_s, name)``; ``link.transfer(nbytes, on_done)``.
    ``srv = ServerPool(engine, servers, name)``; ``srv.submit(duration_ps, on_done)``.
    Every ``on_done`` is called as ``on_done(start_ps, end_ps)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping

from neonic.sim.engine import Engine, EventHandle, ps_from_s
from neonic.sim.interference import GPUDevice

__all__ = [
    "Done",
    "SharedPool",
    "GPUDevice",
    "BandwidthLink",
    "ServerPool",
    "CPUSocketSpec",
    "CPU_PRESETS",
    "cpu_embedding_forward_s",
    "cpu_embedding_backward_s",
]

Done = Callable[[int, int], None]
_EPS = 1e-12


@dataclass(eq=False)
class _Task:
    demand: dict[str, float]
    remaining: float  # picoseconds of work at rate 1
    on_done: Done | None
    priority: int
    max_rate: float
    start: int
    seq: int
    rate: float = 0.0


@dataclass(eq=False)
class Reservation:
    """A fixed share of a pool's capacities held until released."""

    demand: dict[str, float]
    start: int


class SharedPool:
    """Processor sharing over named capacities with priority classes and per-task rate caps."""

    def __init__(self, engine: Engine, capacities: Mapping[str, float], interference: float = 0.0, name: str = "pool") -> None:
        if not capacities:
            raise ValueError("capacities: expected at least one capacity")
        for key, value in capacities.items():
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"capacities.{key}: expected a number > 0, got {value!r}")
        if not (isinstance(interference, (int, float)) and 0 <= interference < 1):
            raise ValueError(f"interference: expected a number in [0, 1), got {interference!r}")
        self.engine = engine
        self.name = name
        self.capacities = dict(capacities)
        self.interference = float(interference)
        self._tasks: list[_Task] = []
        self._reservations: list[Reservation] = []
        self._last = engine.now
        self._event: EventHandle | None = None
        self._seq = 0
        self._busy: dict[str, float] = {k: 0.0 for k in capacities}  # capacity-ps used
        self._use: dict[str, float] = {k: 0.0 for k in capacities}   # current use per capacity
        self.tasks_done = 0

    # ---------------------------------------------------------------------------- public API
    def submit(
        self,
        duration_ps: int,
        demand: Mapping[str, float],
        on_done: Done | None = None,
        priority: int = 0,
        max_rate: float = 1.0,
    ) -> None:
        """Start a task that takes ``duration_ps`` alone; ``demand`` is its share of each
        capacity at full speed; higher ``priority`` is served first; ``max_rate`` caps its
        speed (1 = isolated speed)."""
        if not isinstance(duration_ps, int) or duration_ps < 0:
            raise ValueError(f"duration_ps: expected an integer >= 0, got {duration_ps!r}")
        if not (0 < max_rate <= 1):
            raise ValueError(f"max_rate: expected a number in (0, 1], got {max_rate!r}")
        for key, value in demand.items():
            if key not in self.capacities:
                raise ValueError(f"demand.{key}: {self.name} has no such capacity; expected one of {', '.join(self.capacities)}")
            if value < 0:
                raise ValueError(f"demand.{key}: expected >= 0, got {value!r}")
        self._advance()
        task = _Task({k: float(v) for k, v in demand.items() if v > 0}, float(duration_ps), on_done, int(priority), float(max_rate), self.engine.now, self._seq)
        self._seq += 1
        self._tasks.append(task)
        self._reallocate()

    def reserve(self, demand: Mapping[str, float]) -> Reservation:
        """Hold a fixed share of capacities (e.g. a collective's SMs) until :meth:`release`."""
        for key, value in demand.items():
            if key not in self.capacities:
                raise ValueError(f"demand.{key}: {self.name} has no such capacity")
            if value < 0:
                raise ValueError(f"demand.{key}: expected >= 0, got {value!r}")
        self._advance()
        res = Reservation({k: float(v) for k, v in demand.items() if v > 0}, self.engine.now)
        self._reservations.append(res)
        self._reallocate()
        return res

    def release(self, reservation: Reservation) -> None:
        self._advance()
        self._reservations.remove(reservation)
        self._reallocate()

    @property
    def active(self) -> int:
        return len(self._tasks)

    def busy_ps(self, capacity: str) -> float:
        """Integral of the capacity in use, in capacity-picoseconds, up to ``engine.now``."""
        self._advance()
        return self._busy[capacity]

    # ------------------------------------------------------------------------------ internals
    def _advance(self) -> None:
        now = self.engine.now
        dt = now - self._last
        if dt > 0:
            for task in self._tasks:
                task.remaining -= task.rate * dt
            for key, use in self._use.items():
                self._busy[key] += use * dt
        self._last = now

    def _effective_capacities(self) -> dict[str, float]:
        factor = 1.0 - self.interference if (len(self._tasks) + len(self._reservations)) > 1 else 1.0
        caps = {k: v * factor for k, v in self.capacities.items()}
        for res in self._reservations:
            for key, value in res.demand.items():
                caps[key] = max(0.0, caps[key] - value)
        return caps

    def _reallocate(self) -> None:
        tasks = self._tasks
        caps = self._effective_capacities()
        for priority in sorted({t.priority for t in tasks}, reverse=True):
            _progressive_fill([t for t in tasks if t.priority == priority], caps)
        use = {k: 0.0 for k in self.capacities}
        for res in self._reservations:
            for key, value in res.demand.items():
                use[key] += value
        for task in tasks:
            for key, value in task.demand.items():
                use[key] += value * task.rate
        self._use = {k: min(v, self.capacities[k]) for k, v in use.items()}
        self._schedule_next()

    def _schedule_next(self) -> None:
        if self._event is not None:
            self._event.cancel()
            self._event = None
        best: int | None = None
        for task in self._tasks:
            if task.rate <= 0:
                continue
            finish = self.engine.now + max(0, math.ceil(task.remaining / task.rate - 1e-6))
            if best is None or finish < best:
                best = finish
        if best is not None:
            self._event = self.engine.schedule(best, self._on_event)

    def _on_event(self) -> None:
        self._event = None
        self._advance()
        now = self.engine.now
        finished = [t for t in self._tasks if t.rate > 0 and t.remaining <= max(0.5, t.rate * 1e-6)]
        finished.sort(key=lambda t: t.seq)
        if finished:
            done = set(map(id, finished))
            self._tasks = [t for t in self._tasks if id(t) not in done]
        self._reallocate()
        for task in finished:
            self.tasks_done += 1
            if task.on_done is not None:
                task.on_done(task.start, now)


def _progressive_fill(tasks: list[_Task], caps: dict[str, float]) -> None:
    """Max-min fair rates for ``tasks`` within ``caps`` (updated in place with what they use)."""
    for t in tasks:
        t.rate = 0.0
    unfrozen = list(tasks)
    # tasks that use nothing run at their cap
    for t in list(unfrozen):
        if not t.demand:
            t.rate = t.max_rate
            unfrozen.remove(t)
    while unfrozen:
        load: dict[str, float] = {}
        for t in unfrozen:
            for key, value in t.demand.items():
                load[key] = load.get(key, 0.0) + value
        delta = min(t.max_rate - t.rate for t in unfrozen)
        for key, total in load.items():
            if total > 0:
                delta = min(delta, caps[key] / total)
        delta = max(delta, 0.0)
        for t in unfrozen:
            t.rate += delta
        for key, total in load.items():
            caps[key] -= delta * total
        saturated = {k for k, v in caps.items() if v <= _EPS}
        still = []
        for t in unfrozen:
            if t.rate >= t.max_rate - 1e-12 or any(k in saturated for k in t.demand):
                continue
            still.append(t)
        if len(still) == len(unfrozen):  # numerical safety: nothing froze
            break
        unfrozen = still
    # a task left at rate 0 is starved by a higher priority class; it resumes when that ends


class BandwidthLink:
    """A link whose bandwidth is shared equally by the transfers in flight. Cluster runs do
    not model PCIe with it: GPU-host transfers are flows on the topology's GPU-host links
    (``sim.memory_tiers.HostLink``), the one PCIe model of a run."""

    def __init__(self, engine: Engine, gbytes_per_s: float, name: str = "link") -> None:
        if not (isinstance(gbytes_per_s, (int, float)) and gbytes_per_s > 0):
            raise ValueError(f"gbytes_per_s: expected a number > 0, got {gbytes_per_s!r}")
        self.gbytes_per_s = float(gbytes_per_s)
        self.name = name
        self.pool = SharedPool(engine, {"bw": 1.0}, name=name)
        self.bytes = 0

    def transfer(self, nbytes: float, on_done: Done | None = None) -> int:
        """Move ``nbytes``; returns the duration alone on the link (ps)."""
        if nbytes < 0:
            raise ValueError(f"nbytes: expected >= 0, got {nbytes!r}")
        self.bytes += nbytes
        duration = ps_from_s(nbytes / (self.gbytes_per_s * 1e9))
        self.pool.submit(duration, {"bw": 1.0}, on_done)
        return duration

    def utilization(self, elapsed_ps: int) -> float:
        return self.pool.busy_ps("bw") / elapsed_ps if elapsed_ps > 0 else 0.0


class ServerPool:
    """``servers`` identical FIFO servers (copy engines, NIC units, CPU sockets)."""

    def __init__(self, engine: Engine, servers: int = 1, name: str = "server") -> None:
        if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
            raise ValueError(f"servers: expected an integer >= 1, got {servers!r}")
        self.engine = engine
        self.servers = servers
        self.name = name
        self._free = servers
        self._queue: list[tuple[int, Done | None]] = []
        self._head = 0
        self._busy = 0
        self.jobs = 0

    def submit(self, duration_ps: int, on_done: Done | None = None) -> None:
        if not isinstance(duration_ps, int) or duration_ps < 0:
            raise ValueError(f"duration_ps: expected an integer >= 0, got {duration_ps!r}")
        self._queue.append((duration_ps, on_done))
        self._dispatch()

    def _dispatch(self) -> None:
        while self._free > 0 and self._head < len(self._queue):
            duration, on_done = self._queue[self._head]
            self._head += 1
            self._free -= 1
            self._busy += duration
            self.jobs += 1
            self.engine.after(duration, self._finish, self.engine.now, on_done)
        if self._head > 1024 and self._head * 2 > len(self._queue):
            self._queue = self._queue[self._head:]
            self._head = 0

    def _finish(self, start: int, on_done: Done | None) -> None:
        self._free += 1
        if on_done is not None:
            on_done(start, self.engine.now)
        self._dispatch()

    @property
    def queued(self) -> int:
        return len(self._queue) - self._head

    def utilization(self, elapsed_ps: int) -> float:
        """Average share of the servers busy (work dispatched so far / capacity)."""
        return self._busy / (elapsed_ps * self.servers) if elapsed_ps > 0 else 0.0


# ------------------------------------------------------------------------------ CPU sockets
@dataclass(frozen=True)
class CPUSocketSpec:
    """A CPU socket holding embedding tables in DRAM (the Zion system).

    ``dram_gbytes_per_s`` is the socket's DRAM bandwidth; ``random_efficiency`` the fraction of
    it reached by scattered embedding-row reads (64-byte lines); ``update_efficiency`` the same
    for the read-modify-write of the sparse optimizer. Figures for a 6-channel DDR4-2933 socket
    (6 x 23.5 GB/s = 141 GB/s, data-sheet arithmetic); efficiencies are assumptions.
    """

    name: str = "xeon-ddr4-6ch"
    dram_gbytes_per_s: float = 141.0
    dram_gib: float = 384.0
    random_efficiency: float = 0.35
    update_efficiency: float = 0.25
    line_bytes: int = 64
    overhead_s: float = 20e-6

    def __post_init__(self) -> None:
        for key in ("dram_gbytes_per_s", "dram_gib"):
            value = getattr(self, key)
            if not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"cpu.{key}: expected a number > 0, got {value!r}")
        for key in ("random_efficiency", "update_efficiency"):
            value = getattr(self, key)
            if not (isinstance(value, (int, float)) and 0 < value <= 1):
                raise ValueError(f"cpu.{key}: expected a number in (0, 1], got {value!r}")


CPU_PRESETS: dict[str, CPUSocketSpec] = {"xeon-ddr4-6ch": CPUSocketSpec()}


def _lines(spec: CPUSocketSpec, nbytes: float) -> float:
    return math.ceil(nbytes / spec.line_bytes) * spec.line_bytes


def cpu_embedding_forward_s(spec: CPUSocketSpec, lookups: int, row_bytes: float) -> float:
    """Seconds for a socket to gather and pool ``lookups`` rows of ``row_bytes``."""
    if lookups < 0:
        raise ValueError(f"lookups: expected >= 0, got {lookups!r}")
    if lookups == 0:
        return 0.0
    return lookups * _lines(spec, row_bytes) / (spec.dram_gbytes_per_s * 1e9 * spec.random_efficiency) + spec.overhead_s


def cpu_embedding_backward_s(spec: CPUSocketSpec, lookups: int, unique_rows: int, row_bytes: float) -> float:
    """Seconds for a socket's sparse row-wise AdaGrad update (read + write each unique row)."""
    if lookups < 0 or unique_rows < 0:
        raise ValueError("lookups, unique_rows: expected >= 0")
    if lookups == 0:
        return 0.0
    nbytes = lookups * _lines(spec, row_bytes) + 2 * unique_rows * _lines(spec, row_bytes + 4)
    return nbytes / (spec.dram_gbytes_per_s * 1e9 * spec.update_efficiency) + spec.overhead_s
