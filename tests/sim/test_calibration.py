"""Calibration of the composed SmartNIC timing model: the fit on synthetic samples recovers
known parameters, the file round-trips and rejects bad content by field, and a fit on RTL runs
of a couple of workloads (Amaranth) predicts a held-back workload."""

from __future__ import annotations

import json

import pytest

from neonic.sim.calibration import Calibration, Sample, evaluate, fit, load, save
from neonic.sim.timing.cache import CacheTiming


def _sample(hit_rate: float, true: Calibration, rows: int) -> Sample:
    """A sample whose 'RTL' figures come from a known calibration (a linear memory model:
    every row pays the hit latency, every miss the miss cycles)."""
    misses = int(rows * (1 - hit_rate))

    def model(hit: float, miss: float) -> tuple[float, float]:
        g = 10.0 + rows * (5 + 0.5 * hit) + misses * (20 + miss)
        return g, g - 12.0
    s = Sample(rtl={}, hit_rate=hit_rate, memory_model=model, tx_alone=10.0, rx_model=100.0,
               misses=misses)
    g, window = s.memory(true.gather_hit_latency, true.gather_miss_cycles)
    g += true.gather_offset
    s.rtl = {"gather": g, "cache": window + true.cache_offset, "packetizer": g + true.packetizer_tail,
             "depacketizer": 100 + true.depacketizer_offset}
    return s


def test_fit_recovers_known_parameters():
    true = Calibration(4.0, 8.0, 3.0, -11.0, 5.0, -2.0)
    samples = [_sample(h, true, rows) for h, rows in
               [(0.05, 50), (0.95, 80), (0.9, 60), (0.1, 40), (0.5, 70)]]
    cal = fit(samples)
    for name, value in true.parameters().items():
        assert cal.parameters()[name] == pytest.approx(value, abs=0.05), name
    assert evaluate(cal, samples)["max"] < 1e-3


def test_file_round_trip_and_field_named_errors(tmp_path):
    cal = Calibration(3.5, 6.0, 1.0, -2.0, 4.0, 1.0, context={"source": "test"})
    path = save(cal, tmp_path / "cal.json")
    back = load(path)
    assert back == cal and back.context["source"] == "test"
    doc = json.loads(path.read_text())
    doc["parameters"]["cache_offset"] = "twelve"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="cache_offset"):
        load(path)
    doc["parameters"].pop("cache_offset")
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="cache_offset"):
        load(path)
    path.write_text(json.dumps({**doc, "version": 1}))
    with pytest.raises(ValueError, match="version"):
        load(path)
    path.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ValueError, match="format"):
        load(path)
    with pytest.raises(ValueError, match="gather_hit_latency"):
        Calibration(0.5, 6.0, 30.0, 1.0, 1.0, 1.0)


def test_fit_on_rtl_runs_predicts_held_back_workloads():
    from neonic.host.commands.calibrate import calibrate

    workloads = [{"rows": 24, "dim": 16, "pooling": 3, "alpha": 1.1},
                 {"rows": 1024, "dim": 16, "pooling": 3, "alpha": 0.8},
                 {"rows": 2048, "dim": 16, "pooling": 3, "alpha": 0.9}]
    cal, fit_err, held_err, report = calibrate(sim="amaranth", batch=1, workloads=workloads)
    assert report.buffers_match
    # the cache's documented hit path (lookup stages, line memory), give or take the two
    # registers of the port between the units: more would be a mechanism the model misses
    path = CacheTiming(row_beats=1).hit_latency
    assert path - 2 <= cal.gather_hit_latency <= path + 2
    assert fit_err["max"] < 0.05
    assert held_err["max"] < 0.05
