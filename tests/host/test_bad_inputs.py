"""Every bad input a user can give is answered with exit status 2 and a message that names the
field or argument; nothing ends in a traceback, runs without end, or is silently ignored."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from neonic.host.cli import main
from neonic.host.cluster import scenario_preset_text

DEFAULT = scenario_preset_text("default")


def _exit(argv: list[str], capsys) -> tuple[int, str]:
    """(status, stderr) of ``neonic ARGV`` whether argparse or the command refused it."""
    try:
        status = main(argv)
    except SystemExit as stop:
        status = stop.code
    return status, capsys.readouterr().err


def _scenario(tmp_path: Path, old: str, new: str) -> Path:
    assert old in DEFAULT
    path = tmp_path / "s.toml"
    path.write_text(DEFAULT.replace(old, new))
    return path


# --------------------------------------------------------------------------- scenario sizes
def test_a_cluster_too_big_for_memory_is_refused_at_load(tmp_path, capsys):
    path = _scenario(tmp_path, "nodes = 2", "nodes = 100000")
    status, err = _exit(["run", str(path), "--quiet", "--out", str(tmp_path / "o")], capsys)
    assert status == 2
    assert "cluster.nodes" in err and "800000 GPUs" in err and "expected at most" in err
    assert not (tmp_path / "o").exists()


def test_the_memory_bound_uses_the_given_memory():
    from neonic.host.cluster import scenario_preset
    from neonic.host.limits import check_scenario_size

    sc = scenario_preset("default", cluster={"nodes": 64})  # 512 GPUs: 4 MiB of matrices
    check_scenario_size(sc, memory_bytes=1 << 30)
    with pytest.raises(ValueError, match=r"cluster.nodes: 64 nodes x 8 GPUs .* at most 8 nodes"):
        check_scenario_size(sc, memory_bytes=1 << 16)


def test_an_endless_run_is_refused_with_an_estimate(tmp_path, capsys):
    path = _scenario(tmp_path, "iterations = 2", "iterations = 10000000")
    t0 = time.perf_counter()
    status, err = _exit(["run", str(path), "--quiet", "--out", str(tmp_path / "o")], capsys)
    assert time.perf_counter() - t0 < 30
    assert status == 2
    assert "scenario.iterations" in err and "ops in the op graph" in err
    assert "expected at most 12499 iterations" in err


def test_a_batch_whose_activations_exceed_hbm_is_refused(tmp_path, capsys):
    path = _scenario(tmp_path, "batch_per_gpu = 512", "batch_per_gpu = 1000000000")
    status, err = _exit(["run", str(path), "--quiet", "--out", str(tmp_path / "o")], capsys)
    assert status == 2
    assert "workload.batch_per_gpu" in err and "HBM" in err and "expected at most" in err


def test_a_float_batch_is_refused(tmp_path, capsys):
    path = _scenario(tmp_path, "batch_per_gpu = 512", "batch_per_gpu = 1e9")
    status, err = _exit(["run", str(path), "--quiet"], capsys)
    assert status == 2 and "batch_per_gpu" in err


# ------------------------------------------------------------------------------ run's files
def test_a_folder_as_the_scenario_is_refused(tmp_path, capsys):
    status, err = _exit(["run", str(tmp_path)], capsys)
    assert status == 2 and "CONFIG.toml" in err and "is a folder" in err


def test_a_binary_scenario_file_is_refused_by_name(tmp_path, capsys):
    path = tmp_path / "bin.toml"
    path.write_bytes(b"\x7fELF\x02\x01\x01\x00\xd0\xff\xfe" * 20)
    status, err = _exit(["run", str(path)], capsys)
    assert status == 2 and str(path) in err and "not a UTF-8 text file" in err
    path.write_bytes(b"a = 1\n\x00\x00")
    status, err = _exit(["run", str(path)], capsys)
    assert status == 2 and "binary data" in err


def test_out_naming_an_existing_file_is_refused_before_the_run(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    status, err = _exit(["run", "--quiet", "--out", str(afile)], capsys)
    assert status == 2 and "--out" in err and "not a folder" in err
    assert afile.read_text() == "keep me"


def test_out_that_cannot_be_created_is_named(tmp_path, capsys):
    status, err = _exit(["run", "--quiet", "--out", "/proc/neonic-x/y"], capsys)
    assert status == 2 and "--out /proc/neonic-x/y" in err and "cannot create" in err


def test_calibration_without_the_rtl_backend_is_refused(tmp_path, capsys):
    status, err = _exit(["run", "--quiet", "--calibration", str(tmp_path / "missing.json")], capsys)
    assert status == 2 and "--calibration" in err and "no such file" in err
    cal = tmp_path / "cal.json"
    cal.write_text("{}")
    status, err = _exit(["run", "--quiet", "--calibration", str(cal)], capsys)
    assert status == 2 and "--calibration" in err and "--backend rtl" in err


def test_plan_csv_naming_a_folder_is_refused_before_planning(tmp_path, capsys):
    status, err = _exit(["plan", "--preset", "default", "--csv", str(tmp_path)], capsys)
    assert status == 2 and "--csv" in err and "is a folder" in err
    status, err = _exit(["plan", "--export", str(tmp_path)], capsys)
    assert status == 2 and "--export" in err and "is a folder" in err
    status, err = _exit(["plan", str(tmp_path)], capsys)  # a folder as the scenario
    assert status == 2 and "SCENARIO.toml" in err and "is a folder" in err


# ----------------------------------------------------------------------------------- sweeps
SWEEP = """
[sweep]
name = "bad"
{extra}
[set]
"scenario.iterations" = 1
[grid]
"{field}" = [1, 2]
"""


def test_a_sweep_metric_typo_is_refused_with_a_suggestion(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text(SWEEP.format(extra='metrics = ["samples_per_sec"]', field="cluster.nodes"))
    status, err = _exit(["sweep", str(path)], capsys)
    assert status == 2 and "sweep.metrics[0]" in err and "did you mean 'samples_per_s'" in err


def test_a_sweep_grid_field_typo_is_caught_at_load(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text(SWEEP.format(extra="", field="cluster.nodez"))
    status, err = _exit(["sweep", str(path), "--out", str(tmp_path / "o")], capsys)
    assert status == 2 and "grid.cluster.nodez" in err and "unknown field" in err
    assert not (tmp_path / "o" / "points").exists()


def test_an_unreachable_scheduler_fails_fast(tmp_path, capsys, monkeypatch):
    import neonic.host.sweep as sweep

    monkeypatch.setattr(sweep, "SCHEDULER_TIMEOUT_S", 2)
    path = tmp_path / "s.toml"
    path.write_text(SWEEP.format(extra="", field="cluster.nodes"))
    t0 = time.perf_counter()
    status, err = _exit(["sweep", str(path), "--scheduler", "tcp://127.0.0.1:1",
                         "--out", str(tmp_path / "o"), "--quiet"], capsys)
    assert time.perf_counter() - t0 < 25  # (dask import and file load included)
    assert status == 2 and "--scheduler tcp://127.0.0.1:1" in err
    assert "no Dask scheduler answered within 2 s" in err


# ------------------------------------------------------------------------------ rtl units
@pytest.mark.parametrize("value", ["0", "-5", "abc"])
def test_cache_requests_must_be_a_positive_integer(value, tmp_path, capsys):
    status, err = _exit(["rtl", "sim", "cache", f"--requests={value}", "--out", str(tmp_path)],
                        capsys)
    assert status == 2 and f"--requests: expected an integer >= 1, got '{value}'" in err


def test_a_repeated_param_is_refused(tmp_path, capsys):
    status, err = _exit(["rtl", "sim", "packetizer", "--param", "quant=int8", "--param",
                         "quant=none", "--out", str(tmp_path)], capsys)
    assert status == 2 and "--param quant: given twice" in err
    status, err = _exit(["rtl", "export", "packetizer", "--param", "pmtu=1024", "--param",
                         "pmtu=4096", "-o", str(tmp_path / "p.v")], capsys)
    assert status == 2 and "--param pmtu: given twice" in err


@pytest.mark.parametrize("argv", [["rtl", "sim", "packetizer"], ["bench", "cache"]])
def test_a_negative_seed_is_refused(argv, capsys):
    status, err = _exit([*argv, "--seed", "-1"], capsys)
    assert status == 2 and "--seed" in err and "expected an integer >= 0" in err


def test_rtl_sim_out_that_cannot_be_created_is_named(capsys):
    status, err = _exit(["rtl", "sim", "packetizer", "--out", "/proc/neonic-x"], capsys)
    assert status == 2 and "--out /proc/neonic-x" in err


def test_int8_packetizer_runs_with_the_default_rows(tmp_path, capsys):
    assert main(["rtl", "sim", "packetizer", "--param", "quant=int8", "--out", str(tmp_path)]) == 0
    figures = json.loads((tmp_path / "figures.json").read_text())
    assert figures["frames_match_reference"] is True
    assert figures["params"]["quant"] == "int8" and figures["dim"] == 32


# ----------------------------------------------------------------------------------- bench
def test_bench_json_is_the_last_line_even_with_exit_time_warnings(tmp_path):
    """A bench that leaves an unsimulated Amaranth design in a reference cycle would have its
    UnusedElaboratable warning printed at exit, after the JSON; stdout and stderr merged."""
    script = textwrap.dedent("""
        import sys, types
        from amaranth.hdl import Elaboratable, Fragment, Module
        import neonic.host.commands.bench as bench

        class Unit(Elaboratable):
            def elaborate(self, platform):
                return Module()

        def run(ctx):
            Fragment.get(Unit(), None)   # once something elaborated, Amaranth warns ...
            Unit()                       # ... for a design never used, when it is collected
            return {"figure": 1.5}

        fake = types.SimpleNamespace(SUMMARY="fake", run=run)
        bench.get_bench = lambda name: fake
        from neonic.host.cli import main
        sys.exit(main(["bench", "fake", "--json"]))
    """)
    done = subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=120)
    assert done.returncode == 0, done.stdout
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"figure": 1.5}
