"""Experiments that reproduce what the Neo, SmartNIC and C3 studies report.

Each experiment is a module of this package with a preset config beside it (``NAME.toml``,
package data). The preset's top level is the default size (quick on a laptop); its
``[sizes.tiny]`` table (used by the tests) and ``[sizes.validate]`` table (used by
``neonic validate``) are merged over it. Every experiment writes a results folder:

``table.csv``     one row per measured configuration (the experiment's table)
``metrics.json``  headline figures, the resolved config, notes (which figure is a prediction)
``config.toml``   the resolved config (rerunnable through ``run_experiment(overrides=...)``)
``*.png``         plots (matplotlib, Agg backend)

API
    ``EXPERIMENTS`` (names); ``experiment_config(name, size="default", overrides=None)``;
    ``run_experiment(name, out=None, size="default", overrides=None, progress=None)
    -> ExperimentResult``; ``write_experiment(result, out)``.
    A module defines ``TITLE``, ``check_config(config) -> dict`` (validates field by field,
    errors name the dotted field) and ``run(config, progress) -> ExperimentResult``.
"""

from __future__ import annotations

import importlib
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Mapping

from neonic.host.experiments._common import ExperimentResult, ExperimentUnavailable, write_experiment
from neonic.host.systems import merge_tables

__all__ = [
    "EXPERIMENTS",
    "VALIDATED",
    "SIZES",
    "ExperimentResult",
    "ExperimentUnavailable",
    "experiment_config",
    "experiment_module",
    "run_experiment",
    "write_experiment",
]

#: Every experiment, in the order ``neonic validate`` runs them.
EXPERIMENTS: tuple[str, ...] = ("calibration", "weak_scaling", "zion_vs_zionex", "smartnic", "c3", "sharding", "ablation",
                                "fused_embedding", "node_classes", "smartnic_map")
SIZES: tuple[str, ...] = ("default", "tiny", "validate")
#: What ``neonic validate`` runs unless told (``--only``): the experiments with published figures
#: to compare or keys it reports. ``node_classes`` (minutes at 128 GPUs, no published figure)
#: runs with ``neonic validate --only node_classes`` or on its own; so does ``smartnic_map``
#: (the SmartNIC's win/lose map: predictions, no published figure).
VALIDATED: tuple[str, ...] = tuple(e for e in EXPERIMENTS if e not in ("node_classes", "smartnic_map"))


def experiment_module(name: str):
    if name not in EXPERIMENTS:
        raise ValueError(f"experiment: unknown {name!r}; expected one of {', '.join(EXPERIMENTS)}")
    return importlib.import_module(f"{__name__}.{name}")


def experiment_config(name: str, size: str = "default", overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The validated config of experiment ``name`` at ``size``, with ``overrides`` merged last."""
    module = experiment_module(name)
    if size not in SIZES:
        raise ValueError(f"size: expected one of {', '.join(SIZES)}, got {size!r}")
    text = resources.files(__name__).joinpath(f"{name}.toml").read_text(encoding="utf-8")
    data = tomllib.loads(text)
    sizes = data.pop("sizes", {})
    if size != "default":
        data = merge_tables(data, sizes.get(size, {}))
    if overrides:
        data = merge_tables(data, overrides)
    return module.check_config(data)


def run_experiment(
    name: str,
    out: str | Path | None = None,
    size: str = "default",
    overrides: Mapping[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
) -> ExperimentResult:
    """Run experiment ``name``; write its results folder to ``out`` when given."""
    module = experiment_module(name)
    config = experiment_config(name, size, overrides)
    result = module.run(config, progress or (lambda message: None))
    result.size = size
    if out is not None:
        write_experiment(result, out)
    return result
