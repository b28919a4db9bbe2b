"""Calibration of the SmartNIC timing models against RTL runs, and its file format.

The units' timing models (``sim.timing.embedding``, ``sim.timing.cache``,
``sim.timing.packetizer``) each describe one unit on its own, fed at full rate. Inside the
SmartNIC top (``rtl/smartnic.py``) they are composed: the gather/pool unit reads through the
cache, the packetizer waits for pooled beats, the depacketizer is fed frames as they arrive.
The composed model (``sim.cosim.model_cycles``) feeds the gather/pool unit's model the
cache's answer to each of its requests: the gather unit's model (``sim.timing.embedding.predict``)
says when each row is requested, a model of the cache (``sim.cosim.cache_request_starts``: the
lookup pipeline, MSHRs, the back port's serialised fills and in-order delivery, with the
reference cache model's hit/miss outcomes, which are exact) says when each request's data can
start, and the two are iterated to a fixed point; each row then waits exactly its own
latency, so misses that cluster behind each other (or behind the MSHR limit) cost what they
cost in the hardware. The figures fitted from RTL runs:

``gather_hit_latency``
    Cycles from a row's request to its first beat at the reducer when the cache can answer at
    once (the cache's documented hit path, ``CacheTiming.hit_latency``, plus whatever the port
    between the units adds). Each row's latency is this plus only the wait the cache model
    adds beyond its own hit path (queueing, fills), so the hit path is counted once.
``gather_miss_cycles``
    Cycles a miss's backing read takes beyond the backing memory's latency (request
    sequencing, the fill's last beat, the refill of the line).
``gather_offset``
    Cycles added to the gather unit's window (start-up and drain the models leave out).
``cache_offset``
    The cache's activity window (first request to last response beat) is the memory stream's
    window in the composed model (first row request to the last beat the reducer takes) plus
    ``cache_offset``.
``packetizer_tail``
    The packetizer is paced by the pooled stream: its window (first send to last frame beat) is
    ``max(estimate_tx, gather + packetizer_tail)``.
``depacketizer_offset``
    The depacketizer's window (first frame beat to last memory write) is
    ``estimate_rx + depacketizer_offset``.

How the fit works (:func:`fit`): the two latencies by a grid search that minimises the largest
relative error of the gather unit over the samples; the offsets are the mean residuals of the
models that use them. :func:`evaluate` gives the relative error of the calibrated model per
unit on any set of samples (``neonic calibrate`` reports it on held-back workloads).

File format (JSON, :func:`save` / :func:`load`)::

    {"format": "neonic-smartnic-calibration", "version": 2,
     "parameters": {"gather_hit_latency": ..., "gather_miss_cycles": ...,
                    "gather_offset": ..., "cache_offset": ...,
                    "packetizer_tail": ..., "depacketizer_offset": ...},
     "context": {...}}     # the NIC parameters, memory latency and fit errors it came from

(Version 1 files, of the earlier per-miss penalty model, are refused: rerun
``neonic calibrate``.)

:func:`find_calibration` looks for a file in ``$NEONIC_CALIBRATION`` and then in
``<build>/calibration/smartnic.json`` (where ``neonic calibrate`` writes by default).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["FORMAT", "VERSION", "Calibration", "Sample", "default_calibration", "fit",
           "evaluate", "save", "load", "default_path", "find_calibration"]

FORMAT = "neonic-smartnic-calibration"
VERSION = 2
UNITS = ("gather", "cache", "packetizer", "depacketizer")


@dataclass(frozen=True)
class Calibration:
    """Fitted parameters of the composed SmartNIC timing model (see the module docstring)."""

    gather_hit_latency: float
    gather_miss_cycles: float
    gather_offset: float
    cache_offset: float
    packetizer_tail: float
    depacketizer_offset: float
    context: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self):
        for f in fields(self):
            if f.name == "context":
                continue
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value):
                raise ValueError(f"parameters.{f.name}: expected a finite number, got {value!r}")
        if self.gather_hit_latency < 1:
            raise ValueError(f"parameters.gather_hit_latency: expected >= 1 cycle, "
                             f"got {self.gather_hit_latency!r}")
        if self.gather_miss_cycles < -20:
            raise ValueError(f"parameters.gather_miss_cycles: expected >= -20, "
                             f"got {self.gather_miss_cycles!r}")

    def parameters(self) -> dict[str, float]:
        return {f.name: float(getattr(self, f.name)) for f in fields(self) if f.name != "context"}


def default_calibration(memory_latency: float, mshrs: int, hit_latency: float | None = None) -> Calibration:
    """Uncalibrated figures from the units' documented pipelines: a hit answers in the cache's
    documented hit latency (``hit_latency``; default ``sim.timing.cache.CacheTiming``'s, from
    its lookup stages and the on-chip line memory's latency: 7 cycles); a miss's fill adds a
    few cycles of sequencing to the backing latency; the cache's window ends with the reducer's
    last take; the packetizer's last beats follow the last pooled beat. ``memory_latency`` and
    ``mshrs`` are the cache's, kept in the context."""
    if hit_latency is None:
        from neonic.sim.timing.cache import CacheTiming

        hit_latency = CacheTiming(row_beats=1).hit_latency  # the same for every row size
    return Calibration(gather_hit_latency=float(hit_latency), gather_miss_cycles=0.0, gather_offset=0.0,
                       cache_offset=0.0, packetizer_tail=3.0, depacketizer_offset=0.0,
                       context={"source": "default (uncalibrated)",
                                "memory_latency": memory_latency, "mshrs": mshrs})


#: ``(hit_latency, miss_cycles) -> (gather cycles, memory window cycles)``: the composed
#: gather + cache model of one run (``sim.cosim.memory_model``).
MemoryModel = Callable[[float, float], "tuple[float, float]"]


@dataclass
class Sample:
    """One RTL run of one NIC: what the models need and what the RTL measured.

    ``rtl``: unit -> measured cycles (absent or 0: the unit had no work);
    ``hit_rate``: the reference cache model's hit rate on the run's requests;
    ``memory_model``: the composed gather + cache model of the run (:data:`MemoryModel`);
    ``tx_alone``: the packetizer's own estimate (``estimate_tx``);
    ``rx_model``: the depacketizer's own estimate (``estimate_rx``).
    """

    rtl: dict[str, float]
    hit_rate: float
    memory_model: MemoryModel
    tx_alone: float
    rx_model: float
    misses: int = 0
    label: str = ""

    def memory(self, hit_latency: float, miss_cycles: float) -> tuple[float, float]:
        """(gather cycles, memory window cycles) of the composed model, uncalibrated offsets."""
        g, w = self.memory_model(hit_latency, miss_cycles)
        return float(g), float(w)

    def predict(self, cal: Calibration) -> dict[str, float]:
        """The composed model's cycles per unit under ``cal``."""
        g0, window = self.memory(cal.gather_hit_latency, cal.gather_miss_cycles)
        g = g0 + cal.gather_offset
        out = {"gather": g, "cache": max(1.0, window + cal.cache_offset),
               "packetizer": max(self.tx_alone, g + cal.packetizer_tail),
               "depacketizer": self.rx_model + cal.depacketizer_offset}
        return {u: v for u, v in out.items() if self.rtl.get(u)}


#: The grid :func:`fit` searches (cycles): hit latency and a miss's extra cycles.
HIT_LATENCIES = tuple(float(x) for x in range(1, 9))
MISS_CYCLES = tuple(float(x) for x in range(-4, 13))


def fit(samples: Sequence[Sample], context: dict[str, Any] | None = None) -> Calibration:
    """Fit the parameters to ``samples`` (see the module docstring): the two latencies by a
    coordinate search over :data:`HIT_LATENCIES` and :data:`MISS_CYCLES` minimising the gather
    unit's largest relative error (with the best offset at each point), the other offsets as
    mean residuals."""
    use = [s for s in samples if s.rtl.get("gather")]
    if not use:
        raise ValueError("samples: expected at least one RTL sample with gather cycles, got none")
    rtl = np.array([s.rtl["gather"] for s in use], dtype=float)

    def score(hit: float, mc: float) -> tuple[float, float]:
        pred = np.array([s.memory(hit, mc)[0] for s in use])
        resid = rtl - pred
        best = (np.inf, 0.0)   # the offset minimising the largest relative error
        for off in np.unique(np.round(np.linspace(resid.min(), resid.max(), 9))):
            err = np.abs(pred + off - rtl) / rtl
            value = float(err.max() + 1e-3 * err.mean() + 1e-6 * abs(off))
            best = min(best, (value, float(off)))
        return best

    # coordinate search (each point runs the composed model on every sample): hit latency and
    # miss cycles in turn, until neither moves (at most 8 passes)
    hit, mc = 2.0, 0.0
    for k in range(8):
        axis = "hit" if k % 2 == 0 else "miss"
        grid = HIT_LATENCIES if axis == "hit" else MISS_CYCLES
        points = [(x, mc) if axis == "hit" else (hit, x) for x in grid]
        before = (hit, mc)
        _, hit, mc = min((score(h, m)[0], h, m) for h, m in points)
        if k and (hit, mc) == before:
            break
    best = (0.0, hit, mc, score(hit, mc)[1])
    _, hit, mc, off = best
    mem = [s.memory(hit, mc) for s in use]
    cache = [s.rtl["cache"] - w for (_, w), s in zip(mem, use) if s.rtl.get("cache")]
    pk = [s.rtl["packetizer"] - (g + off) for (g, _), s in zip(mem, use)
          if s.rtl.get("packetizer") and s.tx_alone < g + off]
    rx = [s.rtl["depacketizer"] - s.rx_model for s in samples if s.rtl.get("depacketizer")]
    mean = lambda xs: float(np.mean(xs)) if xs else 0.0  # noqa: E731
    return Calibration(hit, mc, off, mean(cache), mean(pk), mean(rx), context=dict(context or {}))


def evaluate(cal: Calibration, samples: Sequence[Sample]) -> dict[str, float]:
    """Per unit, the largest relative error ``|model - rtl| / rtl`` of ``cal`` on ``samples``
    (and ``"max"`` over all units)."""
    worst: dict[str, float] = {}
    for s in samples:
        pred = s.predict(cal)
        for unit, value in pred.items():
            rtl = float(s.rtl[unit])
            err = abs(value - rtl) / rtl
            worst[unit] = max(worst.get(unit, 0.0), err)
    worst["max"] = max(worst.values(), default=0.0)
    return worst


def save(cal: Calibration, path: str | Path) -> Path:
    """Write ``cal`` as JSON (see the module docstring); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"format": FORMAT, "version": VERSION, "parameters": cal.parameters(),
           "context": cal.context}
    path.write_text(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")
    return path


def load(path: str | Path) -> Calibration:
    """Read a calibration file; errors name the field."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"calibration: file {str(path)!r} does not exist")
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON: {error}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{path}: format: expected {FORMAT!r}, got "
                         f"{doc.get('format') if isinstance(doc, dict) else doc!r}")
    if doc.get("version") != VERSION:
        raise ValueError(f"{path}: version: expected {VERSION}, got {doc.get('version')!r}")
    params = doc.get("parameters")
    if not isinstance(params, dict):
        raise ValueError(f"{path}: parameters: expected a table, got {params!r}")
    names = [f.name for f in fields(Calibration) if f.name != "context"]
    for key in params:
        if key not in names:
            raise ValueError(f"{path}: parameters.{key}: unknown field; expected one of "
                             f"{', '.join(names)}")
    missing = [n for n in names if n not in params]
    if missing:
        raise ValueError(f"{path}: parameters.{missing[0]}: required field missing")
    return Calibration(**{n: params[n] for n in names}, context=dict(doc.get("context") or {}))


def default_path(build_root: str | Path | None = None) -> Path:
    """``<build>/calibration/smartnic.json`` (``neonic calibrate``'s default output)."""
    from neonic.sim.harness import resolve_build_root
    return resolve_build_root(build_root) / "calibration" / "smartnic.json"


def find_calibration() -> Calibration | None:
    """The calibration named by ``$NEONIC_CALIBRATION``, else the default file, else None (a
    default file of another format version is ignored with a warning: the model changed)."""
    env = os.environ.get("NEONIC_CALIBRATION")
    if env:
        return load(env)
    path = default_path()
    if not path.is_file():
        return None
    try:
        return load(path)
    except ValueError as error:
        if "version" not in str(error):
            raise
        import warnings
        warnings.warn(f"{error}: ignored (an older model's calibration); rerun `neonic calibrate`",
                      stacklevel=2)
        return None
