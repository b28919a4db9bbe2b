"""neonic sweep on the command line: results folder, exit status, field-named errors."""

from __future__ import annotations

import csv

from neonic.host.cli import main

SWEEP = """
[sweep]
name = "cli"
scenario = "default"
[set]
"scenario.iterations" = 1
"planner.max_steps" = 50
"workload.synthesize.count" = 6
"workload.synthesize.total_params" = 1e8
[grid]
"cluster.nodes" = [1, 0]
"""


def test_sweep_command_writes_results_and_reports_the_failing_point(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text(SWEEP)
    status = main(["sweep", str(path), "--workers", "1", "--threads", "--quiet", "--out", str(tmp_path / "out")])
    assert status == 1  # one point failed
    with (tmp_path / "out" / "results.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["status"] for r in rows] == ["ok", "error"]
    assert "cluster.nodes" in capsys.readouterr().out


def test_sweep_command_names_the_bad_field(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text('[sweep]\nname = "x"\n[grid]\n"clustr.nodes" = [1]\n')
    assert main(["sweep", str(path)]) == 2
    assert "grid.clustr.nodes" in capsys.readouterr().err


def test_an_interrupted_sweep_writes_the_finished_points(tmp_path):
    """Ctrl-C after the first point: results.csv holds it (the others 'missing'); a rerun
    computes only the rest."""
    import pytest

    from neonic.host.sweep import load_sweep, run_sweep

    path = tmp_path / "s.toml"
    path.write_text(SWEEP.replace("[1, 0]", "[1, 2]"))
    spec = load_sweep(path)

    def stop(record):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec, tmp_path / "out", workers=1, processes=False, on_point=stop)
    with (tmp_path / "out" / "results.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["status"] for r in rows) == ["missing", "ok"]
    again = run_sweep(spec, tmp_path / "out", workers=1, processes=False)
    assert len(again.computed) == 1 and len(again.skipped) == 1 and again.finished == 2


def test_the_sweep_names_the_dask_dashboard(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text(SWEEP.replace("[1, 0]", "[1]"))
    assert main(["sweep", str(path), "--workers", "1", "--threads", "--quiet",
                 "--out", str(tmp_path / "out")]) == 0
    assert "Dask dashboard: " in capsys.readouterr().err


def test_sweep_plots_have_integer_ticks_log_axes_and_a_readable_legend(tmp_path, monkeypatch):
    """Node counts are ticked at the swept integers on a log-2 axis (1..16 spans 16x); the
    legend sits outside the axes at a readable size."""
    import matplotlib.figure

    from neonic.host.sweep import SweepResult, expand_points, sweep_from_dict, write_outputs

    spec = sweep_from_dict({"sweep": {"name": "p", "metrics": ["samples_per_s"]},
                            "grid": {"cluster.nodes": [1, 2, 4, 16],
                                     "system.streams.comm_priority": ["high", "normal"]}})
    points = expand_points(spec)
    records = {p.key: {"status": "ok", "metrics": {"samples_per_s": 1e5 * p.values["cluster.nodes"]
                                                   * (1 if p.index % 2 else 1.1)}}
               for p in points}
    figures = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda self, *a, **k: figures.append(self))
    write_outputs(SweepResult(spec, tmp_path, points, records))
    nodes = next(f for f in figures if "cluster.nodes" in f._suptitle.get_text())
    ax = nodes.axes[0]
    assert ax.get_xscale() == "log"
    assert list(ax.get_xticks()) == [1, 2, 4, 16]
    assert ax.get_yscale() == "linear"  # 16x < 30x
    (legend,) = nodes.legends
    assert all(t.get_fontsize() >= 9 for t in legend.get_texts())
    assert [t.get_text() for t in legend.get_texts()] == ["comm_priority=high", "comm_priority=normal"]
