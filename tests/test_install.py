"""Installing neonic as a user does: a wheel holds everything the command line needs, a normal
(non-editable) ``pip install .`` works from any directory, build outputs go to a per-user cache.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from neonic.sim.harness.verilog import resolve_build_root, user_cache_dir

ROOT = Path(__file__).resolve().parent.parent


def _source_copy(dest: Path) -> Path:
    """The checkout's tracked and untracked-but-not-ignored files, as a clean clone has them
    (building in the checkout itself would leave setuptools' build/ and egg-info there)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def _benches_the_code_runs() -> set[str]:
    """Bench modules named by code that runs outside the tests (the CLI's units, the
    co-simulation, the benches): every one must ship in the wheel."""
    names: set[str] = set()
    for top in ("host", "sim"):
        for f in (ROOT / top).rglob("*.py"):
            if "cocotb" in f.parent.parts:
                continue
            names |= set(re.findall(r"""["'](tb_[a-z0-9_]+)["']""", f.read_text()))
    # names of recorded figures and helper keys, not modules
    return {n for n in names if any(next((ROOT / d).rglob(f"{n}.py"), None) is not None
                                    for d in ("sim", "tests/cocotb"))}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    tmp = tmp_path_factory.mktemp("wheel")
    src = _source_copy(tmp / "src")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                    str(tmp / "dist"), str(src)], check=True, capture_output=True, timeout=300)
    (path,) = (tmp / "dist").glob("neonic-*.whl")
    with zipfile.ZipFile(path) as zf:
        yield zf


def test_the_wheel_holds_one_neonic_namespace_with_its_data(wheel):
    names = wheel.namelist()
    tops = {n.split("/")[0] for n in names if not n.startswith("neonic-")}
    assert tops == {"neonic"}
    for required in ("neonic/__init__.py", "neonic/host/cli.py",
                     "neonic/host/systems/scenarios/default.toml",
                     "neonic/host/workloads/presets/model-a.toml",
                     "neonic/sim/network/presets/zionex.toml",
                     "neonic/sim/cosim/smartnic_harness.cpp"):
        assert required in names
    assert not any(n.startswith("neonic/tests/") for n in names)


def test_the_wheel_does_not_need_the_test_tools_at_run_time(wheel):
    (meta,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    requires = [line for line in wheel.read(meta).decode().splitlines()
                if line.startswith("Requires-Dist:")]
    runtime = [r for r in requires if "extra ==" not in r]
    assert not [r for r in runtime if re.search(r"\bpytest", r)]
    assert any("pytest-xdist" in r and 'extra == "test"' in r for r in requires)


def test_the_wheel_ships_every_bench_the_command_line_runs(wheel):
    shipped = {Path(n).stem for n in wheel.namelist()
               if re.fullmatch(r"neonic/.*/tb_[a-z0-9_]+\.py", n)}
    needed = _benches_the_code_runs()
    assert {"tb_packetizer", "tb_embedding", "tb_smartnic"} <= needed
    assert needed <= shipped


def test_build_outputs_go_to_a_per_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("NEONIC_BUILD_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert resolve_build_root() == tmp_path / "xdg" / "neonic" / "build"
    monkeypatch.setenv("NEONIC_BUILD_DIR", str(tmp_path / "mine"))
    assert resolve_build_root() == tmp_path / "mine"
    assert resolve_build_root(tmp_path / "arg") == tmp_path / "arg"
    home = {"HOME": "/home/u"}
    assert user_cache_dir(home, "linux") == Path("/home/u/.cache/neonic")
    assert user_cache_dir({**home, "XDG_CACHE_HOME": "relative"}, "linux") == Path(
        "/home/u/.cache/neonic")
    assert user_cache_dir(home, "darwin") == Path("/home/u/Library/Caches/neonic")
    assert user_cache_dir({**home, "LOCALAPPDATA": "C:/L"}, "win32") == Path("C:/L/neonic/Cache")


def test_the_cli_prints_its_version():
    from neonic import __version__

    out = subprocess.run([sys.executable, "-m", "neonic.host.cli", "--version"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"neonic {__version__}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``pip install .`` (not editable) of a clean copy into a new venv; a run helper that calls
    its ``neonic`` from an unrelated directory with a private cache directory."""
    tmp = tmp_path_factory.mktemp("install")
    src = _source_copy(tmp / "src")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(src)],
                   check=True, capture_output=True, timeout=900)
    work = tmp / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "NEONIC_BUILD_DIR", "VIRTUAL_ENV")}
    env["XDG_CACHE_HOME"] = str(tmp / "cache")
    neonic = str(venv / "bin" / "neonic")

    def run(*argv: str) -> str:
        done = subprocess.run([neonic, *argv], cwd=work, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    site = next((venv / "lib").glob("python3*/site-packages"))
    return {"run": run, "work": work, "site": site, "cache": tmp / "cache"}


@pytest.mark.slow
def test_a_fresh_venv_install_runs_from_another_directory(installed):
    """``neonic --version`` and ``neonic run`` from an installed wheel, elsewhere."""
    run, work, site = installed["run"], installed["work"], installed["site"]
    assert run("--version").strip().startswith("neonic ")
    run("run", "--quiet", "--out", "run-out")
    assert (work / "run-out" / "metrics.json").is_file()
    assert (site / "neonic" / "host" / "cli.py").is_file()
    assert not (site / "build").exists()
    assert not any(site.glob("host")) and not any(site.glob("sim"))  # one namespace only


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("iverilog") is None, reason="needs Icarus Verilog")
def test_an_installed_neonic_runs_a_cocotb_bench(installed):
    run, work, site = installed["run"], installed["work"], installed["site"]
    run("rtl", "sim", "packetizer", "--sim", "icarus", "--out", "rtl-out")
    assert (work / "rtl-out" / "figures.json").is_file()
    assert any((installed["cache"] / "neonic" / "build").rglob("*.v"))
    assert not (site / "build").exists()
