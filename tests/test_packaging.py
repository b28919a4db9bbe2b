"""Packaging: one ``neonic`` import namespace over the top-level folders rtl/, sim/, host/."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOPS = ("rtl", "sim", "host")


def _packages_on_disk() -> set[str]:
    found = {"neonic"}
    for top in TOPS:
        for init in (ROOT / top).rglob("__init__.py"):
            found.add("neonic." + ".".join(init.parent.relative_to(ROOT).parts))
    return found


def _data_folders(package_data: dict[str, list[str]]) -> set[str]:
    """Folders that package-data ships from below a package, as dotted names."""
    return {f"{pkg}.{'.'.join(pattern.split('/')[:-1])}"
            for pkg, patterns in package_data.items() for pattern in patterns if "/" in pattern}


def test_every_package_and_data_folder_is_listed_in_pyproject():
    """Data-only folders are listed too: setuptools ships a folder reliably only as a package."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    listed = set(config["tool"]["setuptools"]["packages"])
    assert listed == _packages_on_disk() | _data_folders(config["tool"]["setuptools"]["package-data"])
    assert config["tool"]["setuptools"]["package-dir"] == {"neonic": "."}


def test_code_imports_only_through_the_neonic_namespace():
    """A bare ``import sim`` would load a second copy of a module beside ``neonic.sim``."""
    bare = []
    for top in (*TOPS, "tests"):
        for f in (ROOT / top).rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                bare += [f"{f.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                         if n.split(".")[0] in TOPS]
    assert bare == []


def test_the_package_is_importable_by_its_name():
    import neonic
    import neonic.host.cli

    assert neonic.__version__
    assert Path(neonic.host.cli.__file__).resolve().is_relative_to(ROOT)
