"""DLRM workload descriptions: specs, TOML loading and presets.

API
    :class:`WorkloadSpec` (``tables``, ``dense``, ``batch_per_gpu``, ``optimizer``),
    :class:`TableSpec`, :class:`DenseSpec`, :class:`OptimizerSpec`;
    ``load_workload(path)`` (a TOML file), ``workload_from_dict(data, path="", base=None)``
    (parsed TOML, e.g. an inline ``[workload]`` section), ``preset(name)``,
    ``PRESET_NAMES``, ``resolve_workload(value, path)`` (a preset name, a file path or a table).

Schema (TOML; every field checked, errors name the dotted field)::

    name = "my-model"                  # required
    table_dtype = "fp16"               # optional switch: every table in fp32 | fp16 (the
                                       # optimizer state stays FP32); also beside preset = NAME
    description = "..."                # optional
    batch_per_gpu = 512                # required, samples per GPU per iteration
    [dense]                            # required
    bottom_mlp = [13, 512, 256, 64]    # widths, input first
    interaction = "dot"                # "dot" | "dcn" (then dcn_layers, dcn_low_rank)
    top_mlp = [512, 256, 1]            # widths after the interaction
    [optimizer]                        # optional; kind = "rowwise_adagrad" | "adagrad" | "sgd"
    [[tables]]                         # any number of explicit tables ...
    name = "t0"; rows = 1000000; dim = 64; dtype = "fp32"   # dtype "fp32" | "fp16"
    pooling = 20.0                     # mean lookups per sample
    pooling_distribution = "poisson"   # "constant" | "poisson" | "lognormal" (+ pooling_sigma)
    trace = "t0.npz"                   # optional, or locality_stats = "file" + locality_block
    [synthesize]                       # ... and/or tables synthesized from summary statistics
    count = 1000; total_params = 793e9; dim_min = 4; dim_max = 384; dim_avg = 93
    pooling_mean = 15; seed = 1        # see host.workloads.synth for every field

Presets (``host/workloads/presets/*.toml``, package data; each assumption is documented beside
the value it sets): ``model-a``, ``model-f``, ``model-i`` (Neo's three models, synthesized from
the paper's summaries), ``dlrm-kaggle`` (Criteo Kaggle), ``dlrm-dcnv2`` (MLPerf DLRM-DCNv2).
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from neonic.host.workloads.spec import (
    DTYPE_BYTES,
    DenseSpec,
    OptimizerSpec,
    TableSpec,
    WorkloadSpec,
    workload_from_dict,
)
from neonic.host.workloads.synth import synthesize_tables

__all__ = [
    "DTYPE_BYTES",
    "DenseSpec",
    "OptimizerSpec",
    "TableSpec",
    "WorkloadSpec",
    "PRESET_NAMES",
    "load_workload",
    "preset",
    "preset_text",
    "resolve_workload",
    "with_overrides",
    "synthesize_tables",
    "workload_from_dict",
]

PRESET_NAMES: tuple[str, ...] = ("model-a", "model-f", "model-i", "dlrm-kaggle", "dlrm-dcnv2")


def with_overrides(spec: WorkloadSpec, value: Mapping[str, Any], path: str = "workload") -> WorkloadSpec:
    """``spec`` with the scenario's switches applied: ``batch_per_gpu`` and ``table_dtype``
    (every table stored in ``fp32`` or ``fp16``; the sparse optimizer's state stays FP32, as
    Neo keeps it: FP16 tables with FP32 row-wise AdaGrad state, REFERENCES.md)."""
    from dataclasses import replace

    from neonic.host.workloads.spec import _choice, _int

    if "batch_per_gpu" in value:
        spec = replace(spec, batch_per_gpu=_int(f"{path}.batch_per_gpu", value["batch_per_gpu"], 1))
    if "table_dtype" in value:
        dtype = _choice(f"{path}.table_dtype", value["table_dtype"], tuple(DTYPE_BYTES))
        spec = replace(spec, tables=tuple(replace(t, dtype=dtype) for t in spec.tables))
    return spec


def preset_text(name: str) -> str:
    """The TOML text of preset ``name`` (with its documented assumptions)."""
    if name not in PRESET_NAMES:
        raise ValueError(f"workload: unknown preset {name!r}; expected one of {', '.join(PRESET_NAMES)}")
    return resources.files(__name__).joinpath("presets", f"{name}.toml").read_text(encoding="utf-8")


def preset(name: str) -> WorkloadSpec:
    """The workload preset called ``name`` (see :data:`PRESET_NAMES`)."""
    return workload_from_dict(tomllib.loads(preset_text(name)))


def load_workload(path: str | Path) -> WorkloadSpec:
    """Load and validate a workload TOML file; relative trace paths resolve against its folder."""
    path = Path(path)
    with path.open("rb") as f:
        try:
            data = tomllib.load(f)
        except tomllib.TOMLDecodeError as error:
            raise ValueError(f"{path}: not valid TOML: {error}") from None
    return workload_from_dict(data, base=path.parent)


def resolve_workload(value: Any, path: str = "workload", base: Path | None = None) -> WorkloadSpec:
    """A workload given as a preset name, a TOML file path (relative to ``base``) or a table."""
    if isinstance(value, Mapping):
        if "preset" in value:
            extra = set(value) - {"preset", "batch_per_gpu", "table_dtype"}
            if extra:
                raise ValueError(f"{path}.{sorted(extra)[0]}: not allowed beside 'preset' (only batch_per_gpu, table_dtype)")
            spec = resolve_workload(value["preset"], f"{path}.preset", base)
            return with_overrides(spec, value, path)
        spec = workload_from_dict({k: v for k, v in value.items() if k != "table_dtype"}, path, base)
        return with_overrides(spec, value, path)
    if isinstance(value, str) and value:
        if value in PRESET_NAMES:
            return preset(value)
        candidate = Path(value) if base is None or Path(value).is_absolute() else base / value
        if candidate.suffix == ".toml":
            if not candidate.exists():
                raise ValueError(f"{path}: workload file {str(candidate)!r} does not exist")
            return load_workload(candidate)
        raise ValueError(f"{path}: expected a preset ({', '.join(PRESET_NAMES)}), a .toml path or a table, got {value!r}")
    raise ValueError(f"{path}: expected a preset name, a .toml path or a table, got {value!r}")
