"""Golden model of table-batched EmbeddingBag forward (the embedding gather/pool unit).

Written from the semantics (torch.nn.EmbeddingBag and FBGEMM's table-batched embedding, see
``shared/REFERENCES.md``), not from the RTL. What a bag computes:

* The rows named by the bag's indices are gathered from its table. An index equal to the
  table's padding index is skipped; an index outside ``[0, rows)`` is dropped (and counted).
  Neither contributes to the pooled vector nor to MEAN's count.
* FP16 and BF16 rows are widened to FP32 first (exact), then everything is FP32.
* SUM: ``acc = ((0 + v0) + v1) + ...`` in index order, one FP32 rounding per addition, where
  ``v_i = r_i`` without per-sample weights and ``v_i = w_i * r_i`` (one FP32 rounding) with.
* MEAN: the SUM above, then ``acc * RNE(1/count)`` (one more rounding; ``1/count`` is the FP32
  nearest to the exact reciprocal). ``count`` is the number of rows that contributed.
* MAX: ``acc = r0``, then ``acc = r_i if r_i > acc else acc`` per element (IEEE ``>``: ties,
  including +0 against -0, keep the earlier row). Per-sample weights are not applied. NaN
  follows from the comparison, as in torch's CPU ``EmbeddingBag`` (whose running maximum takes
  a row only where ``row > max``): a NaN in the first contributing row stays, a NaN in a later
  row is ignored. (``torch.max`` over the gathered rows would propagate any NaN instead.)
* Weighted SUM/MEAN round ``w_i * r_i`` to FP32 before adding it. torch's CPU kernels and
  FBGEMM use a fused multiply-add there (one rounding instead of two), so weighted results may
  differ from theirs in the last bits (both are within :func:`error_bound`).
* A bag with no contributing row (empty, or only padding/out-of-range indices) gives zeros.

:func:`pool` follows that order with ``np.float32`` operations, which makes it the bit-exact
target for the RTL; :func:`pool_f64` computes the same quantities in float64 (the "true"
value) and :func:`error_bound` bounds the FP32 result's distance from it, element-wise:

    |pool - pool_f64| <= gamma(k) * S + (n + 2) * eta,
    gamma(k) = k*u / (1 - k*u),  u = 2**-24,  eta = 2**-149,

with ``k = n + 1`` roundings on any path for SUM (n additions, one product), ``k = n + 3``
for MEAN (plus the reciprocal and the final product) and ``S`` the sum of ``|w_i * r_i|``
(scaled by ``1/count`` for MEAN). The relative term alone holds only while every rounded
result is normal: a product that lands among the subnormals is off by up to half their
spacing (``2**-150``) whatever its size, so each of the ``n`` weight products and MEAN's final
product adds an absolute ``eta`` (with room for the growth of those errors through the sum;
sums and differences that land among the subnormals are exact). MAX selects one of its
inputs, so its error is zero.

The module also builds what a test or a run feeds the unit: the memory image (rows padded to
whole memory beats), the descriptor writes and the input items in the combined lengths
format, as plain field dictionaries matching the RTL's stream layouts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "ELEM_TYPES", "POOLING", "ELEM_BYTES",
    "Table", "Bag", "Placement",
    "widen_rows", "contributing", "pool", "pool_f64", "error_bound",
    "row_stride_beats", "place_tables", "descriptor_payloads", "bag_items",
    "random_table", "zipf_indices",
]

ELEM_TYPES = ("fp32", "fp16", "bf16")
"""Element types of a table, in the order of their hardware codes (0, 1, 2)."""
POOLING = ("sum", "mean", "max")
"""Pooling modes, in the order of their hardware codes (0, 1, 2)."""
ELEM_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}

_STORAGE = {"fp32": np.float32, "fp16": np.float16, "bf16": np.uint16}


@dataclass(frozen=True)
class Table:
    """One embedding table.

    ``rows`` is a 2-D array ``(num_rows, dim)`` in the table's storage type: ``float32`` for
    fp32, ``float16`` for fp16, and ``uint16`` bit patterns for bf16 (numpy has no bfloat16).
    """

    rows: np.ndarray
    elem_type: str = "fp32"
    pooling: str = "sum"
    padding_idx: int | None = None

    def __post_init__(self):
        if self.elem_type not in ELEM_TYPES:
            raise ValueError(f"elem_type: expected one of {ELEM_TYPES}, got {self.elem_type!r}")
        if self.pooling not in POOLING:
            raise ValueError(f"pooling: expected one of {POOLING}, got {self.pooling!r}")
        rows = self.rows
        if not isinstance(rows, np.ndarray) or rows.ndim != 2 or rows.shape[1] < 1:
            raise ValueError(f"rows: expected a 2-D array (num_rows, dim >= 1), got "
                             f"{getattr(rows, 'shape', type(rows).__name__)}")
        if rows.dtype != _STORAGE[self.elem_type]:
            raise ValueError(f"rows: expected dtype {np.dtype(_STORAGE[self.elem_type])} for "
                             f"elem_type {self.elem_type!r}, got {rows.dtype}")
        if self.padding_idx is not None and (isinstance(self.padding_idx, bool)
                                             or not isinstance(self.padding_idx, int)
                                             or self.padding_idx < 0):
            raise ValueError(f"padding_idx: expected None or an integer >= 0, "
                             f"got {self.padding_idx!r}")

    @property
    def num_rows(self) -> int:
        return int(self.rows.shape[0])

    @property
    def dim(self) -> int:
        return int(self.rows.shape[1])


@dataclass(frozen=True)
class Bag:
    """One bag: indices into table ``table``, optional FP32 per-sample weights, a tag."""

    table: int
    indices: np.ndarray
    weights: np.ndarray | None = None
    tag: int = 0

    def __post_init__(self):
        idx = np.asarray(self.indices)
        if idx.ndim != 1 or (idx.size and not np.issubdtype(idx.dtype, np.integer)):
            raise ValueError(f"indices: expected a 1-D integer array, got {idx.dtype}{idx.shape}")
        object.__setattr__(self, "indices", idx.astype(np.int64))
        if self.weights is not None:
            w = np.asarray(self.weights, dtype=np.float32)
            if w.shape != idx.shape:
                raise ValueError(f"weights: expected shape {idx.shape} (one per index), "
                                 f"got {w.shape}")
            object.__setattr__(self, "weights", w)


def widen_rows(table: Table) -> np.ndarray:
    """The table's rows as float32 (exact for every supported element type)."""
    if table.elem_type == "bf16":
        return (table.rows.astype(np.uint32) << 16).view(np.float32)
    return table.rows.astype(np.float32)


def contributing(table: Table, bag: Bag) -> np.ndarray:
    """Boolean mask over the bag's indices: which ones contribute a row."""
    idx = bag.indices
    keep = (idx >= 0) & (idx < table.num_rows)
    if table.padding_idx is not None:
        keep &= idx != table.padding_idx
    return keep


def _check_bag(tables: list[Table], bag: Bag) -> Table:
    if not 0 <= bag.table < len(tables):
        raise ValueError(f"bag.table: expected 0 <= table < {len(tables)}, got {bag.table}")
    return tables[bag.table]


def pool(tables: list[Table], bags: list[Bag]) -> list[np.ndarray]:
    """Pooled float32 vector of each bag, in the documented order (bit-exact target)."""
    out = []
    for bag in bags:
        table = _check_bag(tables, bag)
        rows = widen_rows(table)
        keep = contributing(table, bag)
        sel = rows[bag.indices[keep]]
        acc = np.zeros(table.dim, dtype=np.float32)
        if len(sel):
            if table.pooling == "max":
                acc = sel[0].copy()
                for r in sel[1:]:
                    take = r > acc                  # False where either is NaN
                    acc = np.where(take, r, acc)
            else:
                w = None if bag.weights is None else bag.weights[keep]
                for i, r in enumerate(sel):
                    v = r if w is None else np.float32(w[i]) * r
                    acc = (acc + v).astype(np.float32)
                if table.pooling == "mean":
                    acc = acc * (np.float32(1.0) / np.float32(len(sel)))
        out.append(acc.astype(np.float32))
    return out


def pool_f64(tables: list[Table], bags: list[Bag]) -> list[np.ndarray]:
    """The same pooled vectors computed in float64 from the same (widened) inputs."""
    out = []
    for bag in bags:
        table = _check_bag(tables, bag)
        rows = widen_rows(table).astype(np.float64)
        keep = contributing(table, bag)
        sel = rows[bag.indices[keep]]
        if not len(sel):
            out.append(np.zeros(table.dim))
        elif table.pooling == "max":
            acc = sel[0].copy()                     # the same NaN rule as :func:`pool`
            for r in sel[1:]:
                acc = np.where(r > acc, r, acc)
            out.append(acc)
        else:
            w = np.ones(len(sel)) if bag.weights is None else bag.weights[keep].astype(np.float64)
            acc = (w[:, None] * sel).sum(axis=0)
            out.append(acc / len(sel) if table.pooling == "mean" else acc)
    return out


def error_bound(tables: list[Table], bags: list[Bag]) -> list[np.ndarray]:
    """Element-wise bound on ``|pool - pool_f64|`` (see the module docstring)."""
    u = 2.0 ** -24
    eta = 2.0 ** -149
    out = []
    for bag in bags:
        table = _check_bag(tables, bag)
        rows = widen_rows(table).astype(np.float64)
        keep = contributing(table, bag)
        sel = rows[bag.indices[keep]]
        n = len(sel)
        if not n or table.pooling == "max":
            out.append(np.zeros(table.dim))
            continue
        w = np.ones(n) if bag.weights is None else bag.weights[keep].astype(np.float64)
        s = np.abs(w[:, None] * sel).sum(axis=0)
        k = n + 1
        if table.pooling == "mean":
            k, s = n + 3, s / n
        out.append(k * u / (1 - k * u) * s + (n + 2) * eta)
    return out


# -- what the unit is fed ------------------------------------------------------------------


def row_stride_beats(dim: int, elem_type: str, data_bytes: int) -> int:
    """Memory beats per row: rows start on a beat boundary, the last beat is zero-padded."""
    return -(-dim * ELEM_BYTES[elem_type] // data_bytes)


@dataclass(frozen=True)
class Placement:
    """Tables laid out in one memory image: ``contents`` (bytes) and each table's base beat."""

    contents: np.ndarray
    bases: tuple[int, ...]
    data_bytes: int


def place_tables(tables: list[Table], data_bytes: int, *, base: int = 0,
                 spare_beats: int = 0) -> Placement:
    """Lay the tables out one after the other from beat ``base``, rows padded to whole beats."""
    bases, chunks, at = [], [np.zeros(base * data_bytes, dtype=np.uint8)], base
    for table in tables:
        stride = row_stride_beats(table.dim, table.elem_type, data_bytes)
        raw = np.zeros((table.num_rows, stride * data_bytes), dtype=np.uint8)
        row_bytes = np.ascontiguousarray(table.rows).view(np.uint8).reshape(table.num_rows, -1)
        raw[:, :row_bytes.shape[1]] = row_bytes
        bases.append(at)
        chunks.append(raw.reshape(-1))
        at += table.num_rows * stride
    chunks.append(np.zeros(max(spare_beats, 1) * data_bytes, dtype=np.uint8))
    return Placement(np.concatenate(chunks), tuple(bases), data_bytes)


def descriptor_payloads(tables: list[Table], placement: Placement) -> list[dict]:
    """One descriptor write per table (field names of the unit's descriptor layout)."""
    return [{
        "table": t,
        "base": placement.bases[t],
        "rows": table.num_rows,
        "dim": table.dim,
        "elem_type": ELEM_TYPES.index(table.elem_type),
        "pooling": POOLING.index(table.pooling),
        "pad_valid": int(table.padding_idx is not None),
        "pad_index": 0 if table.padding_idx is None else table.padding_idx,
    } for t, table in enumerate(tables)]


def _f32_bits(x) -> int:
    return int(np.asarray(x, dtype=np.float32).view(np.uint32))


def bag_items(bags: list[Bag], index_width: int = 32) -> list[dict]:
    """The input stream in the combined lengths format: a header item per bag, then one item
    per index (with its FP32 weight when the bag is weighted). Negative indices are sent as
    their ``index_width``-bit two's complement (huge, so out of range)."""
    items = []
    mask = (1 << index_width) - 1
    for bag in bags:
        items.append({"header": 1, "body": {"bag": {
            "table": bag.table, "length": len(bag.indices),
            "weighted": int(bag.weights is not None), "tag": bag.tag}}})
        for i, index in enumerate(bag.indices):
            weight = 0 if bag.weights is None else _f32_bits(bag.weights[i])
            items.append({"header": 0, "body": {"item": {
                "index": int(index) & mask, "weight": weight}}})
    return items


# -- random workloads ------------------------------------------------------------------------


def random_table(rng: np.random.Generator, num_rows: int, dim: int, elem_type: str = "fp32",
                 pooling: str = "sum", padding_idx: int | None = None,
                 scale: float = 1.0) -> Table:
    """A table of normally distributed finite values (with a few exact ties and zeros)."""
    vals = (rng.standard_normal((num_rows, dim)) * scale).astype(np.float32)
    if num_rows > 1 and dim > 1:  # ties and signed zeros exercise MAX's tie rule
        vals[rng.integers(0, num_rows), :] = vals[0]
        vals[rng.integers(0, num_rows), rng.integers(0, dim)] = -0.0
    if elem_type == "fp16":
        rows = vals.astype(np.float16)
    elif elem_type == "bf16":
        rows = (vals.view(np.uint32) >> 16).astype(np.uint16)
    else:
        rows = vals
    return Table(rows, elem_type, pooling, padding_idx)


def zipf_indices(rng: np.random.Generator, alpha: float, num_rows: int, size: int) -> np.ndarray:
    """``size`` Zipf(``alpha``) row ids of a table of ``num_rows`` rows: the one generator,
    :func:`neonic.sim.lookups.zipf_rows` (hot rows scattered by a keyed permutation drawn from
    ``rng``), under the argument order the unit tests use."""
    from neonic.sim.lookups import zipf_rows

    return zipf_rows(rng, size, num_rows, alpha)
