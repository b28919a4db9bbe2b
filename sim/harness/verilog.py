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
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from amaranth.back import verilog

__all__ = ["repo_root", "user_cache_dir", "resolve_build_root", "BUILD_DIR_ENV", "export_verilog",
           "export_verilog_cached", "rtl_source_hash", "parameters_only", "write_if_changed",
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


def rtl_source_hash() -> str:
    """A hash of everything a design's Verilog depends on besides its parameters: the text of
    every ``rtl/**/*.py`` source and the Amaranth version (which does the conversion)."""
    import amaranth

    rtl = repo_root() / "rtl"
    h = hashlib.sha256(f"amaranth {amaranth.__version__}\n".encode())
    for f in sorted(rtl.rglob("*.py")):
        h.update(str(f.relative_to(rtl)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def export_verilog_cached(build: Callable[[], object], name: str, params: Mapping, *,
                          build_root: Path | str | None = None, emit_src: bool = False) -> Path:
    """:func:`export_verilog` of ``build()``, cached by ``params`` and :func:`rtl_source_hash`
    *before* conversion: when an export of the same module name, parameters and RTL sources
    exists, its path is returned without constructing or elaborating anything (a SmartNIC's
    conversion costs seconds of CPU). ``params`` must be JSON-serialisable (tuples become
    lists); it stands for every constructor argument of the design."""
    if not isinstance(name, str) or not _IDENT.match(name):
        raise ValueError(f"name: expected a Verilog identifier ([A-Za-z_][A-Za-z0-9_]*), "
                         f"got {name!r}")
    try:
        key_text = json.dumps({"name": name, "params": dict(params), "emit_src": emit_src,
                               "rtl": rtl_source_hash()}, sort_keys=True)
    except TypeError as e:
        raise ValueError(f"params: expected JSON-serialisable parameters ({e})") from None
    key = hashlib.sha256(key_text.encode()).hexdigest()[:20]
    root = resolve_build_root(build_root)
    index = root / "verilog" / "by-params" / f"{name}-{key}.txt"
    try:
        cached = root / "verilog" / index.read_text().strip() / f"{name}.v"
        if cached.is_file():
            return cached
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    out = export_verilog(build(), name, build_root=build_root, emit_src=emit_src)
    write_if_changed(index, out.parent.name + "\n")
    return out


def parameters_only(component) -> None:
    """Mark ``component`` and the sub-components it holds as deliberately never elaborated:
    objects that stand for their parameters and signature while the design itself runs from
    its (cached) Verilog or a compiled model. Amaranth then emits no ``UnusedElaboratable``
    warning when they are collected, at the latest at interpreter exit, after a command's
    output (``neonic bench ... --json`` prints its JSON object last)."""
    from amaranth.hdl import Elaboratable

    seen: set[int] = set()
    stack = [component]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or not isinstance(obj, Elaboratable):
            continue
        seen.add(id(obj))
        obj._MustUse__silence = True
        stack.extend(v for v in vars(obj).values() if isinstance(v, Elaboratable))


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
