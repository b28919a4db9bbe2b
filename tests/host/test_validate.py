"""neonic validate: published figures only where REFERENCES.md has them; Markdown + CSV written."""

from __future__ import annotations

import csv
import math

from neonic.host.validate import PUBLISHED, published_rows, validate


def test_only_figures_from_references_are_published():
    assert set(PUBLISHED) == {"model_a_128gpu_samples_per_s", "roce_goodput_4096", "model_f_fp16_table_bytes"}
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
