"""DLRM workload specifications: dataclasses and their field-by-field validation.

A :class:`WorkloadSpec` is everything the planner and the runtime need to know about one DLRM:
its embedding tables (:class:`TableSpec`), its dense part (:class:`DenseSpec`), the batch each
GPU trains on, and the sparse optimizer (:class:`OptimizerSpec`), whose per-row state counts
against memory.

Specs are built from plain dicts (parsed TOML) by :func:`workload_from_dict`, which checks every
field and names it by its dotted path in any error (``tables[3].dim: expected an integer >= 1,
got 0``). Tables may be listed one by one (``[[tables]]``) or synthesized deterministically from
summary statistics (``[synthesize]``, see :mod:`host.workloads.synth`), or both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = [
    "DTYPE_BYTES",
    "POOLING_DISTRIBUTIONS",
    "OPTIMIZERS",
    "INTERACTIONS",
    "TableSpec",
    "DenseSpec",
    "OptimizerSpec",
    "WorkloadSpec",
    "workload_from_dict",
]

#: Element types an embedding table may be stored in, and their sizes.
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2}
#: How the number of lookups per bag (the pooling factor) is distributed around its mean.
POOLING_DISTRIBUTIONS = ("constant", "poisson", "lognormal")
#: Sparse optimizers and the fp32 state they keep (row-wise AdaGrad: one per row).
OPTIMIZERS = ("rowwise_adagrad", "adagrad", "sgd")
INTERACTIONS = ("dot", "cat", "dcn")


# ---------------------------------------------------------------------------------- checks
def _where(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# the shared config vocabulary (one wording of every error: neonic.sim.schema)
from neonic.sim.schema import choice as _choice, integer, number, string as _str  # noqa: E402


def _int(path: str, value: Any, minimum: int = 0) -> int:
    """:func:`neonic.sim.schema.integer` with this package's default bound (>= 0)."""
    return integer(path, value, minimum)


def _float(path: str, value: Any, minimum: float = 0.0, strict: bool = False) -> float:
    """:func:`neonic.sim.schema.number` with this package's keywords (``strict``: > minimum)."""
    return number(path, value, minimum, lo_open=strict)


def _table(path: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{path or 'workload'}: expected a table (mapping), got {type(value).__name__}")
    return value


def _no_unknown(path: str, data: Mapping[str, Any], known: Sequence[str]) -> None:
    for key in data:
        if key not in known:
            raise ValueError(f"{_where(path, key)}: unknown field; expected one of {', '.join(known)}")


def _widths(path: str, value: Any, allow_empty: bool = False) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or (not value and not allow_empty):
        raise ValueError(f"{path}: expected a list of layer widths (integers >= 1), got {value!r}")
    return tuple(_int(f"{path}[{i}]", w, 1) for i, w in enumerate(value))


# ---------------------------------------------------------------------------------- specs
@dataclass(frozen=True)
class TableSpec:
    """One embedding table.

    ``pooling`` is the mean number of lookups per sample (bag) and ``pooling_distribution`` how
    bag sizes spread around it (``lognormal`` uses ``pooling_sigma``, the sigma of the
    underlying normal). ``trace`` (an .npz lookup trace) or ``locality_stats`` +
    ``locality_block`` (a block of a locality-statistics file, e.g. Meta's
    dlrm_datasets_2021_locality_stats.txt) describe which rows are hit; they are loaded lazily
    by :mod:`host.traces` when a consumer asks, never at spec load.
    """

    name: str
    rows: int
    dim: int
    dtype: str = "fp32"
    pooling: float = 1.0
    pooling_distribution: str = "constant"
    pooling_sigma: float = 0.0
    trace: Path | None = None
    locality_stats: Path | None = None
    locality_block: str | None = None

    def __post_init__(self) -> None:
        _str("name", self.name)
        _int("rows", self.rows, 1)
        _int("dim", self.dim, 1)
        _choice("dtype", self.dtype, tuple(DTYPE_BYTES))
        _float("pooling", self.pooling, 0.0, strict=True)
        _choice("pooling_distribution", self.pooling_distribution, POOLING_DISTRIBUTIONS)
        _float("pooling_sigma", self.pooling_sigma)
        if (self.locality_stats is None) != (self.locality_block is None):
            raise ValueError("locality_stats/locality_block: expected both or neither")

    @property
    def elem_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def row_bytes(self) -> int:
        return self.dim * self.elem_bytes

    @property
    def params(self) -> int:
        return self.rows * self.dim

    @property
    def nbytes(self) -> int:
        """Bytes of the weights alone (no optimizer state)."""
        return self.rows * self.row_bytes

    def sample_bag_sizes(self, rng: np.random.Generator, bags: int) -> np.ndarray:
        """Bag sizes (lookups per sample) for ``bags`` samples, drawn from the distribution."""
        if self.pooling_distribution == "constant":
            return np.full(bags, int(round(self.pooling)), dtype=np.int64)
        if self.pooling_distribution == "poisson":
            return rng.poisson(self.pooling, bags).astype(np.int64)
        sigma = self.pooling_sigma
        mu = math.log(self.pooling) - sigma * sigma / 2.0  # mean of the log-normal = pooling
        return np.rint(rng.lognormal(mu, sigma, bags)).astype(np.int64)

    def load_trace(self) -> Any:
        """The table's lookup trace or locality statistics, through :mod:`host.traces`."""
        if self.trace is None and self.locality_stats is None:
            raise ValueError(f"tables.{self.name}: has neither a trace nor locality_stats")
        import neonic.host.traces as traces  # lazy: loading a spec never reads trace files

        if self.trace is not None:
            return traces.load_trace(self.trace)
        return traces.load_locality_stats(self.locality_stats, self.locality_block)


@dataclass(frozen=True)
class DenseSpec:
    """The dense part: bottom MLP (layer widths, input first), the interaction and the top MLP.

    ``interaction`` is ``dot`` (pairwise dots of the pooled embeddings and the bottom MLP's
    output; embeddings of another width are projected to the bottom output's first), ``cat``
    (concatenation) or ``dcn`` (a cross network of ``dcn_layers`` layers of rank
    ``dcn_low_rank``); :mod:`host.workloads.dense` has the layer-by-layer model and its sources.
    The top MLP's input width follows from the interaction, so ``top_mlp`` lists the widths
    after it.
    """

    bottom_mlp: tuple[int, ...]
    top_mlp: tuple[int, ...]
    interaction: str = "dot"
    dcn_layers: int = 0
    dcn_low_rank: int = 0

    def __post_init__(self) -> None:
        _choice("interaction", self.interaction, INTERACTIONS)
        if self.interaction == "dcn":
            _int("dcn_layers", self.dcn_layers, 1)
            _int("dcn_low_rank", self.dcn_low_rank, 1)

    @property
    def mlp_layers(self) -> int:
        return len(self.bottom_mlp) - 1 + len(self.top_mlp)


@dataclass(frozen=True)
class OptimizerSpec:
    """The sparse optimizer of the embedding tables (learning rate, epsilon, kind)."""

    kind: str = "rowwise_adagrad"
    learning_rate: float = 0.01
    eps: float = 1e-8

    def __post_init__(self) -> None:
        _choice("kind", self.kind, OPTIMIZERS)

    def state_bytes_per_row(self, dim: int) -> int:
        """FP32 optimizer state per table row: row-wise AdaGrad keeps one value per row."""
        return {"rowwise_adagrad": 4, "adagrad": 4 * dim, "sgd": 0}[self.kind]


@dataclass(frozen=True)
class WorkloadSpec:
    """A whole DLRM: tables, dense part, per-GPU batch and optimizer."""

    name: str
    tables: tuple[TableSpec, ...]
    dense: DenseSpec
    batch_per_gpu: int
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)
    description: str = ""

    def __post_init__(self) -> None:
        if not self.tables:
            raise ValueError("tables: expected at least one embedding table")
        seen: set[str] = set()
        for i, table in enumerate(self.tables):
            if table.name in seen:
                raise ValueError(f"tables[{i}].name: duplicate table name {table.name!r}")
            seen.add(table.name)
        _int("batch_per_gpu", self.batch_per_gpu, 1)

    @property
    def total_params(self) -> int:
        return sum(t.params for t in self.tables)

    def table_memory_bytes(self, table: TableSpec) -> int:
        """Weights plus optimizer state of one whole table."""
        return table.nbytes + table.rows * self.optimizer.state_bytes_per_row(table.dim)

    def table(self, name: str) -> TableSpec:
        for t in self.tables:
            if t.name == name:
                return t
        raise ValueError(f"table: no table named {name!r} in workload {self.name!r}")


# ---------------------------------------------------------------------------------- loading
_TABLE_FIELDS = ("name", "rows", "dim", "dtype", "pooling", "pooling_distribution", "pooling_sigma",
                 "trace", "locality_stats", "locality_block")
_TOP_FIELDS = ("name", "description", "batch_per_gpu", "tables", "synthesize", "dense", "optimizer")


def _path(path: str, value: Any, base: Path | None) -> Path | None:
    if value is None:
        return None
    p = Path(_str(path, value))
    return p if p.is_absolute() or base is None else base / p


def table_from_dict(data: Mapping[str, Any], path: str, base: Path | None = None) -> TableSpec:
    """One ``[[tables]]`` entry; errors name ``path.field``."""
    _table(path, data)
    _no_unknown(path, data, _TABLE_FIELDS)
    for key in ("name", "rows", "dim"):
        if key not in data:
            raise ValueError(f"{_where(path, key)}: required field missing")
    kwargs: dict[str, Any] = {
        "name": _str(_where(path, "name"), data["name"]),
        "rows": _int(_where(path, "rows"), data["rows"], 1),
        "dim": _int(_where(path, "dim"), data["dim"], 1),
        "dtype": _choice(_where(path, "dtype"), data.get("dtype", "fp32"), tuple(DTYPE_BYTES)),
        "pooling": _float(_where(path, "pooling"), data.get("pooling", 1.0), 0.0, strict=True),
        "pooling_distribution": _choice(_where(path, "pooling_distribution"),
                                        data.get("pooling_distribution", "constant"), POOLING_DISTRIBUTIONS),
        "pooling_sigma": _float(_where(path, "pooling_sigma"), data.get("pooling_sigma", 0.0)),
        "trace": _path(_where(path, "trace"), data.get("trace"), base),
        "locality_stats": _path(_where(path, "locality_stats"), data.get("locality_stats"), base),
        "locality_block": None,
    }
    if "locality_block" in data:
        kwargs["locality_block"] = _str(_where(path, "locality_block"), data["locality_block"])
    if (kwargs["locality_stats"] is None) != (kwargs["locality_block"] is None):
        raise ValueError(f"{_where(path, 'locality_block')}: locality_stats and locality_block go together")
    if kwargs["pooling_distribution"] == "lognormal" and kwargs["pooling_sigma"] <= 0:
        raise ValueError(f"{_where(path, 'pooling_sigma')}: expected > 0 for a lognormal distribution")
    return TableSpec(**kwargs)


def dense_from_dict(data: Mapping[str, Any], path: str = "dense") -> DenseSpec:
    _table(path, data)
    _no_unknown(path, data, ("bottom_mlp", "top_mlp", "interaction", "dcn_layers", "dcn_low_rank"))
    for key in ("bottom_mlp", "top_mlp"):
        if key not in data:
            raise ValueError(f"{_where(path, key)}: required field missing")
    interaction = _choice(_where(path, "interaction"), data.get("interaction", "dot"), INTERACTIONS)
    layers = low_rank = 0
    if interaction == "dcn":
        layers = _int(_where(path, "dcn_layers"), data.get("dcn_layers"), 1)
        low_rank = _int(_where(path, "dcn_low_rank"), data.get("dcn_low_rank"), 1)
    bottom = _widths(_where(path, "bottom_mlp"), data["bottom_mlp"])
    if len(bottom) < 2:
        raise ValueError(f"{_where(path, 'bottom_mlp')}: expected at least an input and an output width")
    return DenseSpec(bottom_mlp=bottom, top_mlp=_widths(_where(path, "top_mlp"), data["top_mlp"]),
                     interaction=interaction, dcn_layers=layers, dcn_low_rank=low_rank)


def optimizer_from_dict(data: Mapping[str, Any], path: str = "optimizer") -> OptimizerSpec:
    _table(path, data)
    _no_unknown(path, data, ("kind", "learning_rate", "eps"))
    return OptimizerSpec(
        kind=_choice(_where(path, "kind"), data.get("kind", "rowwise_adagrad"), OPTIMIZERS),
        learning_rate=_float(_where(path, "learning_rate"), data.get("learning_rate", 0.01), 0.0, strict=True),
        eps=_float(_where(path, "eps"), data.get("eps", 1e-8), 0.0, strict=True),
    )


def workload_from_dict(data: Mapping[str, Any], path: str = "", base: Path | None = None) -> WorkloadSpec:
    """Build and validate a :class:`WorkloadSpec` from parsed TOML.

    ``path`` prefixes every field name in errors (e.g. ``workload``); ``base`` resolves relative
    trace paths (the TOML file's folder).
    """
    from neonic.host.workloads.synth import synthesize_tables  # local: synth imports this module

    _table(path, data)
    _no_unknown(path, data, _TOP_FIELDS)
    for key in ("name", "batch_per_gpu", "dense"):
        if key not in data:
            raise ValueError(f"{_where(path, key)}: required field missing")
    tables: list[TableSpec] = []
    listed = data.get("tables", [])
    if not isinstance(listed, list):
        raise ValueError(f"{_where(path, 'tables')}: expected an array of tables ([[tables]])")
    for i, entry in enumerate(listed):
        tables.append(table_from_dict(entry, f"{_where(path, 'tables')}[{i}]", base))
    if "synthesize" in data:
        tables.extend(synthesize_tables(data["synthesize"], _where(path, "synthesize")))
    if not tables:
        raise ValueError(f"{_where(path, 'tables')}: expected [[tables]] entries or a [synthesize] section")
    names = [t.name for t in tables]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"{_where(path, 'tables')}: duplicate table name {dup!r}")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ValueError(f"{_where(path, 'description')}: expected a string")
    return WorkloadSpec(
        name=_str(_where(path, "name"), data["name"]),
        tables=tuple(tables),
        dense=dense_from_dict(data["dense"], _where(path, "dense")),
        batch_per_gpu=_int(_where(path, "batch_per_gpu"), data["batch_per_gpu"], 1),
        optimizer=optimizer_from_dict(data.get("optimizer", {}), _where(path, "optimizer")),
        description=description,
    )
