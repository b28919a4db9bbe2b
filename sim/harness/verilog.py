"""Verilog export of components, cached by content.

Every exported design lands in ``<build>/verilog/<name>-<hash>/<name>.v``, where ``hash`` is
taken over the Verilog text. One design with one parameter set therefore always maps to the
same directory, a different parameter set to another one, and a file is only (re)written when
it is missing or differs, so downstream builds (Icarus, Verilator) can rely on file times to
skip work. Writes are atomic (temporary file + rename): several pytest-xdist workers may
export the same design at the same time.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sys
import tempfile
from pathlib import Path

from amaranth.back import verilog

__all__ = ["repo_root", "user_cache_dir", "resolve_build_root", "BUILD_DIR_ENV", "export_verilog", "write_if_changed",
           "icarus_time_zero_fix"]

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# yosys's Verilog backend declares one dummy register per module, initialised to 0, and reads
# it in every ``always @*`` block so that simulators evaluate those blocks at time zero.
_DUMP_MODULE_REG = re.compile(r"^(\s*)reg (\\\$auto\$verilog_backend\.cc:\d+:dump_module\$\d+)\s*=\s*0;$",
                              re.MULTILINE)


BUILD_DIR_ENV = "NEONIC_BUILD_DIR"


def repo_root() -> Path:
    """The ``neonic`` package's root directory (the one holding ``rtl/``, ``sim/``, ``host/``;
    in a checkout also ``tests/``; in an installed wheel it is ``site-packages/neonic``)."""
    return Path(__file__).resolve().parents[2]


def user_cache_dir(environ: dict[str, str] | None = None, platform: str | None = None) -> Path:
    """The per-user cache directory of neonic, as platformdirs lays it out:
    ``$XDG_CACHE_HOME/neonic`` (default ``~/.cache/neonic``) on Linux and other Unixes,
    ``~/Library/Caches/neonic`` on macOS, ``%LOCALAPPDATA%\\neonic\\Cache`` on Windows."""
    env = os.environ if environ is None else environ
    platform = sys.platform if platform is None else platform
    home = Path(env.get("HOME") or Path.home())
    if platform == "darwin":
        return home / "Library" / "Caches" / "neonic"
    if platform.startswith("win"):
        base = env.get("LOCALAPPDATA") or str(home / "AppData" / "Local")
        return Path(base) / "neonic" / "Cache"
    xdg = env.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else home / ".cache"
    return base / "neonic"


def resolve_build_root(override: Path | str | None = None) -> Path:
    """Where generated files (Verilog, simulator builds, co-simulation work folders, synthesis
    and calibration caches) go: ``override``, else ``$NEONIC_BUILD_DIR``, else
    :func:`user_cache_dir` ``/build``. Never inside the package: an installed package's folder
    is ``site-packages`` and may be read-only or shared by several users."""
    if override is not None:
        return Path(override)
    env = os.environ.get(BUILD_DIR_ENV)
    return Path(env) if env else user_cache_dir() / "build"


def write_if_changed(path: Path, text: str) -> bool:
    """Atomically write ``text`` to ``path`` unless it already holds exactly that text.
    Returns whether the file was written."""
    try:
        if path.read_text() == text:
            return False
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return True


def export_verilog(component, name: str, *, build_root: Path | str | None = None,
                   emit_src: bool = False) -> Path:
    """Convert ``component`` to Verilog (top module ``name``, ports from its signature) and
    return the path of ``<build>/verilog/<name>-<hash>/<name>.v``.

    Port names join the signature path with ``__`` (``mem__req__payload``); ``clk`` and
    ``rst`` (synchronous, active high) are added for the ``sync`` domain. ``build_root``
    overrides the build directory (see :func:`resolve_build_root`). ``emit_src=True`` keeps
    Amaranth's ``src`` attributes (Python file:line of each signal); they are off by default
    because they change the text, hence the hash and the simulator builds, whenever unrelated
    lines of the source files move.
    """
    if not isinstance(name, str) or not _IDENT.match(name):
        raise ValueError(f"name: expected a Verilog identifier ([A-Za-z_][A-Za-z0-9_]*), "
                         f"got {name!r}")
    text = verilog.convert(component, name=name, emit_src=emit_src)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    out = resolve_build_root(build_root) / "verilog" / f"{name}-{digest}" / f"{name}.v"
    write_if_changed(out, text)
    return out


def icarus_time_zero_fix(verilog_path: Path) -> Path:
    """A copy of an exported design that Icarus Verilog evaluates correctly at time zero.

    yosys relies on the initialisation of a dummy register (``dump_module$N = 0``) to run every
    ``always @*`` block once at time zero. Icarus 11 raises no event for an initialiser, so a
    block whose inputs never change after reset (constants, registers that keep their reset
    value) never runs and its outputs stay X. The copy (``<name>.icarus.v`` beside the
    original) adds ``initial #0 dump_module$N = 1;`` after each declaration: the change reaches
    every such block after all processes have started. The register is read only by those
    empty ``if`` statements, so the design's behaviour is unchanged; Verilator, which evaluates
    combinational logic at start-up anyway, keeps the original file.
    """
    text = Path(verilog_path).read_text()
    fixed = _DUMP_MODULE_REG.sub(lambda m: f"{m.group(0)}\n{m.group(1)}initial #0 {m.group(2)} = 1'b1;",
                                 text)
    out = Path(verilog_path).with_suffix(".icarus.v")
    write_if_changed(out, fixed)
    return out
