"""Calibration of the SmartNIC timing models against RTL runs, and its file format.

The units' timing models (``sim.timing.embedding``, ``sim.timing.cache``,
``sim.timing.packetizer``) each describe one unit on its own, fed at full rate. Inside the
SmartNIC top (``rtl/smartnic.py``) they are composed: the gather/pool unit reads through the
cache, the packetizer waits for pooled beats, the depacketizer is fed frames as they arrive.
The composed model (``sim.cosim.model_cycles``) needs a few figures the unit models do not
give, and this module fits them from RTL runs:

``gather_hit_latency``, ``gather_miss_cycles``, ``gather_memory_tail``
    The gather/pool unit behind the cache: its own pipeline (``sim.timing.embedding.predict``
    at the cache's hit latency) plus, for each miss, the part of the miss's service time
    (``gather_miss_cycles``: the cache fetches a few misses at a time, one per MSHR) that the
    reducer's time for that row (``steady_state_row_cycles``) does not hide, plus
    ``gather_memory_tail`` once (the first miss's latency). Misses come from the reference
    cache model (``sim.reference.cache``) on the run's requests, so they are exact. This is a
    first-order model: misses that cluster cost more than misses spread between hits.
``cache_tail``
    The cache serves the gather unit, so its activity window (first request to last response)
    is the gather unit's window minus the pipeline behind the last response (reducer, adder,
    drain): ``cache = gather - cache_tail``.
``packetizer_tail``
    The packetizer is paced by the pooled stream: its window (first send to last frame beat) is
    ``max(estimate_tx, gather + packetizer_tail)``.
``depacketizer_offset``
    The depacketizer's window (first frame beat to last memory write) is
    ``estimate_rx + depacketizer_offset``.

How the fit works (:func:`fit`): the three gather parameters by a grid search that minimises the
largest relative error over the samples; the three offsets are the mean residuals of the
models that use them. :func:`evaluate` gives the
relative error of the calibrated model per unit on any set of samples (``neonic calibrate``
reports it on held-back workloads).

File format (JSON, :func:`save` / :func:`load`)::

    {"format": "neonic-smartnic-calibration", "version": 1,
     "parameters": {"gather_hit_latency": ..., "gather_miss_cycles": ...,
                    "gather_memory_tail": ..., "cache_tail": ...,
                    "packetizer_tail": ..., "depacketizer_offset": ...},
     "context": {...}}     # the NIC parameters, memory latency and fit errors it came from

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
VERSION = 1
UNITS = ("gather", "cache", "packetizer", "depacketizer")


@dataclass(frozen=True)
class Calibration:
    """Fitted parameters of the composed SmartNIC timing model (see the module docstring)."""

    gather_hit_latency: float
    gather_miss_cycles: float
    gather_memory_tail: float
    cache_tail: float
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
        if self.gather_miss_cycles < 0:
            raise ValueError(f"parameters.gather_miss_cycles: expected >= 0, "
                             f"got {self.gather_miss_cycles!r}")

    def parameters(self) -> dict[str, float]:
        return {f.name: float(getattr(self, f.name)) for f in fields(self) if f.name != "context"}


def default_calibration(memory_latency: float, mshrs: int) -> Calibration:
    """Uncalibrated figures from the units' documented pipelines: a hit answers in 2 cycles
    (plus the request register); misses are fetched ``mshrs`` at a time, each taking the
    backing latency plus a few cycles of sequencing; the tails are the reducer/drain pipeline
    (about 12 cycles) and the packetizer's last beats."""
    return Calibration(gather_hit_latency=3.0,
                       gather_miss_cycles=float(memory_latency + 4) / max(1, mshrs),
                       gather_memory_tail=float(memory_latency + 12), cache_tail=12.0,
                       packetizer_tail=4.0, depacketizer_offset=0.0,
                       context={"source": "default (uncalibrated)"})


@dataclass
class Sample:
    """One RTL run of one NIC: what the models need and what the RTL measured.

    ``rtl``: unit -> measured cycles (absent or 0: the unit had no work);
    ``hit_rate``: the reference cache model's hit rate on the run's requests;
    ``gather_model``: cycles of ``sim.timing.embedding.predict`` at a given latency;
    ``tx_alone``: the packetizer's own estimate (``estimate_tx``);
    ``rx_model``: the depacketizer's own estimate (``estimate_rx``).
    """

    rtl: dict[str, float]
    hit_rate: float
    gather_model: Callable[[float], float]
    tx_alone: float
    rx_model: float
    misses: int = 0
    hit_beats: int = 0
    miss_row_cycles: tuple[int, ...] = ()
    label: str = ""

    def gather(self, hit_latency: float, miss_cycles: float, memory_tail: float) -> float:
        """The gather unit's cycles: its pipeline (the timing model at the cache's hit latency)
        plus, per miss, the part of the miss's service time (``miss_cycles``) its row's
        reducer time does not hide, plus ``memory_tail`` once when there are misses."""
        extra = sum(max(0.0, miss_cycles - rc) for rc in self.miss_row_cycles)
        return float(self.gather_model(hit_latency)) + extra + (memory_tail if self.misses else 0.0)

    def predict(self, cal: Calibration) -> dict[str, float]:
        """The composed model's cycles per unit under ``cal``."""
        g = self.gather(cal.gather_hit_latency, cal.gather_miss_cycles, cal.gather_memory_tail)
        out = {"gather": g, "cache": max(1.0, g - cal.cache_tail),
               "packetizer": max(self.tx_alone, g + cal.packetizer_tail),
               "depacketizer": self.rx_model + cal.depacketizer_offset}
        return {u: v for u, v in out.items() if self.rtl.get(u)}


def fit(samples: Sequence[Sample], context: dict[str, Any] | None = None) -> Calibration:
    """Fit the parameters to ``samples`` (see the module docstring): the gather unit's three by
    a grid search minimising the largest relative error, the offsets as mean residuals."""
    use = [s for s in samples if s.rtl.get("gather")]
    if not use:
        raise ValueError("samples: expected at least one RTL sample with gather cycles, got none")
    rtl = np.array([s.rtl["gather"] for s in use], dtype=float)
    lats = np.arange(1.0, 65.0)
    pipe = np.array([[s.gather_model(l) for s in use] for l in lats])      # (L, S)
    mcs = np.arange(0.0, 24.01, 0.25)
    tails = np.arange(-40.0, 80.01, 1.0)
    extra = np.array([[sum(max(0.0, c - rc) for rc in s.miss_row_cycles) for s in use]
                      for c in mcs])                                          # (M, S)
    has_miss = np.array([1.0 if s.misses else 0.0 for s in use])
    best = (np.inf, 0, 0, 0)
    for i, row in enumerate(pipe):
        pred = row[None, None, :] + extra[:, None, :] + tails[None, :, None] * has_miss
        err = np.abs(pred - rtl) / rtl
        score = err.max(axis=2) + 1e-3 * err.mean(axis=2)
        k = np.unravel_index(np.argmin(score), score.shape)
        if score[k] < best[0]:
            best = (float(score[k]), i, k[0], k[1])
    _, i, j, k = best
    hit, mc, tail = float(lats[i]), float(mcs[j]), float(tails[k])
    g_model = [s.gather(hit, mc, tail) for s in use]
    cache = [g - s.rtl["cache"] for g, s in zip(g_model, use) if s.rtl.get("cache")]
    pk = [s.rtl["packetizer"] - g for g, s in zip(g_model, use)
          if s.rtl.get("packetizer") and s.tx_alone < g]
    rx = [s.rtl["depacketizer"] - s.rx_model for s in samples if s.rtl.get("depacketizer")]
    mean = lambda xs: float(np.mean(xs)) if xs else 0.0  # noqa: E731
    return Calibration(hit, mc, tail, mean(cache), mean(pk), mean(rx), context=dict(context or {}))


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
    from sim.harness import resolve_build_root
    return resolve_build_root(build_root) / "calibration" / "smartnic.json"


def find_calibration() -> Calibration | None:
    """The calibration named by ``$NEONIC_CALIBRATION``, else the default file, else None."""
    env = os.environ.get("NEONIC_CALIBRATION")
    if env:
        return load(env)
    path = default_path()
    return load(path) if path.is_file() else None
