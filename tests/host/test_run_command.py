"""`neonic run`: config errors name the field; a run prints the summary and writes the folder."""

from __future__ import annotations

import pytest

from neonic.host.cli import main
from neonic.host.report import RESULT_FILES

TINY = """
[scenario]
name = "tiny-cli"
iterations = 1
warmup = 1
[cluster]
nodes = 2
[workload]
name = "tiny"
batch_per_gpu = 64
[workload.synthesize]
count = 8
total_params = 1e6
dim_min = 16
dim_max = 32
dim_avg = 24
dim_multiple = 4
pooling_mean = 4
seed = 1
[workload.dense]
bottom_mlp = [32, 64, 16]
interaction = "dot"
top_mlp = [64, 1]
[system]
preset = "zionex"
[planner]
time_budget_s = 0.2
"""


def test_run_config_writes_the_results_folder(tmp_path, capsys):
    config = tmp_path / "tiny.toml"
    config.write_text(TINY)
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "samples/s" in printed and "exposed" in printed
    for name in RESULT_FILES:
        assert (out / name).exists(), name


def test_bad_field_exits_2_naming_it(tmp_path, capsys):
    config = tmp_path / "bad.toml"
    config.write_text(TINY.replace("nodes = 2", "nodes = 0"))
    assert main(["run", str(config), "--quiet"]) == 2
    assert "cluster.nodes: expected an integer >= 1" in capsys.readouterr().err


def test_unknown_preset_is_named(capsys):
    assert main(["run", "--preset", "nope"]) == 2
    assert "--preset: unknown scenario 'nope'" in capsys.readouterr().err


def test_config_and_preset_together_are_refused(tmp_path, capsys):
    config = tmp_path / "tiny.toml"
    config.write_text(TINY)
    assert main(["run", str(config), "--preset", "default"]) == 2
