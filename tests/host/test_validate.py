"""neonic validate: published figures only where REFERENCES.md has them; Markdown + CSV written."""

from __future__ import annotations

import csv
import math

import json

import pytest

from neonic.host.validate import KEYS, PUBLISHED, published_rows, register_key, validate

REQUIRED_KEYS = ("qps.model-a", "qps.model-f", "qps.model-i", "weak_scaling_efficiency.model-a",
                 "weak_scaling_efficiency.model-i", "zionex_over_zion", "fused_embedding_speedup",
                 "dense_mflops_per_sample.model-a", "dense_mflops_per_sample.model-f", "dense_mflops_per_sample.model-i")


def test_only_figures_from_references_are_published():
    assert set(PUBLISHED) == {"model_a_128gpu_samples_per_s", "roce_goodput_4096", "model_f_fp16_table_bytes",
                              "model_a_mflops", "model_f_mflops", "model_i_mflops", "fused_embedding_speedup"}
    assert PUBLISHED["model_a_128gpu_samples_per_s"].value == 1.2e6


def test_model_arithmetic_rows_match_the_published_facts():
    rows = {r.figure: r for r in published_rows()}
    for r in rows.values():
        assert r.kind == "model arithmetic"
        assert abs(r.relative_difference) < 0.01, r


def test_quick_validate_writes_markdown_and_csv_and_marks_unpublished(tmp_path):
    summary = validate(tmp_path, quick=True, experiments=("zion_vs_zionex", "c3"))
    md = (tmp_path / "validation.md").read_text()
    assert "ours vs published" in md and "not published" in md and "Quick run" in md
    assert (tmp_path / "c3" / "table.csv").exists() and (tmp_path / "zion_vs_zionex" / "throughput.png").exists()
    with (tmp_path / "validation.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["experiment"] for r in rows} >= {"network", "workloads", "zion_vs_zionex", "c3"}
    for r in rows:
        if r["published"]:
            assert r["kind"] in ("model arithmetic", "calibration target")
            assert math.isclose(float(r["relative_difference"]), float(r["ours"]) / float(r["published"]) - 1, rel_tol=1e-9,
                                abs_tol=1e-12)
        else:
            assert r["source"] in ("not published", "not comparable") and r["relative_difference"] == ""
    assert [run["status"] for run in summary["runs"]] == ["ok", "ok"]


def test_every_headline_key_is_registered_and_read_from_an_experiment_that_exists():
    from neonic.host.experiments import EXPERIMENTS

    for key in (*REQUIRED_KEYS, "ablation"):
        assert key in KEYS
        assert KEYS[key].experiment is None or KEYS[key].experiment in EXPERIMENTS
    with pytest.raises(ValueError, match="registered already"):
        register_key("qps.model-a", "calibration", "again", "samples/s", lambda r: 0)
    with pytest.raises(ValueError, match="key: expected"):
        register_key("Bad Key", None, "x", "", lambda r: 0)


def test_dense_mflops_keys_hold_table_3():
    rows = {r.key: r for r in published_rows()}
    for model, pub in (("model-a", 638), ("model-f", 5), ("model-i", 60)):
        row = rows[f"dense_mflops_per_sample.{model}"]
        assert row.published == pub and abs(row.ours / pub - 1) < 0.10


def test_validate_json_prints_every_key_last(tmp_path, capsys):
    """`neonic validate --json`: the last line is one JSON object of stable keys; every row of
    validation.json carries its key (experiments that were not run give null figures)."""
    import argparse

    from neonic.host.commands import validate as command

    args = argparse.Namespace(quick=True, out=tmp_path, only=["zion_vs_zionex", "fused_embedding"], json=True)
    assert command.main(args) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    figures = json.loads(last)
    assert figures["zionex_over_zion"] > 0 and figures["fused_embedding_speedup"] > 1
    for model in ("model-a", "model-f", "model-i"):
        assert figures[f"dense_mflops_per_sample.{model}"] > 0
    rows = json.loads((tmp_path / "validation.json").read_text())["rows"]
    keys = [r["key"] for r in rows]
    assert all(keys) and len(set(keys)) == len(keys) and set(keys) == set(figures)


def test_experiments_side_by_side_give_the_same_figures(tmp_path):
    """`--jobs 2` runs experiments in worker processes: the same figures, in the same order,
    and every experiment's folder (plots included) written."""
    one = validate(tmp_path / "one", quick=True, experiments=("c3", "fused_embedding"), jobs=1)
    two = validate(tmp_path / "two", quick=True, experiments=("c3", "fused_embedding"), jobs=2)
    assert two["figures"] == one["figures"]
    assert [r["key"] for r in two["rows"]] == [r["key"] for r in one["rows"]]
    assert [run["experiment"] for run in two["runs"]] == ["c3", "fused_embedding"]
    assert [run["plots"] for run in two["runs"]] == [run["plots"] for run in one["runs"]]
    assert (tmp_path / "two" / "fused_embedding" / "speedup.png").exists()
    with pytest.raises(ValueError, match="jobs"):
        validate(tmp_path / "bad", quick=True, experiments=("c3",), jobs=0)


def test_validate_plans_through_the_plan_cache_and_a_rerun_plans_nothing(tmp_path):
    """The experiments' runs keep their plans in ``plan_dir``; a second validate finds them
    all there and gives the same figures."""
    plans = tmp_path / "plans"
    first = validate(tmp_path / "one", quick=True, experiments=("zion_vs_zionex",), plan_dir=plans)
    kept = sorted(p.name for p in plans.glob("*.json"))
    assert kept  # ZionEX and Zion plan differently: at least one plan each
    stamps = {p.name: p.stat().st_mtime_ns for p in plans.glob("*.json")}
    second = validate(tmp_path / "two", quick=True, experiments=("zion_vs_zionex",), plan_dir=plans)
    assert {p.name: p.stat().st_mtime_ns for p in plans.glob("*.json")} == stamps  # nothing re-planned
    assert first["figures"] == second["figures"]
