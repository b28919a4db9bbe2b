"""What a sharding plan is: per table, a sharding type and its shards (rank, rows, columns, tier)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Iterator, Mapping

import numpy as np

__all__ = ["ShardingType", "Shard", "TablePlan", "Plan", "TIERS"]

#: Memory tiers a shard's weights and optimizer state may live in. ``dram`` and ``ssd`` shards
#: are served through a software cache of their rows in HBM.
TIERS = ("hbm", "dram", "ssd")


class ShardingType(str, Enum):
    """How one table is split over ranks (Neo's "4D" sharding and its hierarchical forms)."""

    TABLE_WISE = "table_wise"              # the whole table on one rank
    ROW_WISE = "row_wise"                  # row ranges over ranks anywhere in the cluster
    COLUMN_WISE = "column_wise"            # column ranges over ranks anywhere
    DATA_PARALLEL = "data_parallel"        # a replica on every rank; gradients AllReduced
    TABLE_ROW_WISE = "table_row_wise"      # table-wise to one node, then row-wise inside it
    TABLE_COLUMN_WISE = "table_column_wise"  # table-wise to one node, then column-wise inside it

    @property
    def short(self) -> str:
        return {"table_wise": "TW", "row_wise": "RW", "column_wise": "CW", "data_parallel": "DP",
                "table_row_wise": "TWRW", "table_column_wise": "TWCW"}[self.value]


@dataclass(frozen=True, slots=True)
class Shard:
    """One piece of a table: rows ``[row_start, row_end)`` and columns ``[col_start, col_end)`` on
    ``rank``, its weights and optimizer state stored in ``tier``. (Slots: a plan of 1000 tables
    row-wise over 1024 ranks holds a million of them; 184 bytes each with their integers
    instead of 431 with a dict, measured with ``tracemalloc`` on CPython 3.11.)"""

    rank: int
    row_start: int
    row_end: int
    col_start: int
    col_end: int
    tier: str = "hbm"

    def __post_init__(self) -> None:
        if self.rank < 0 or not (0 <= self.row_start < self.row_end) or not (0 <= self.col_start < self.col_end):
            raise ValueError(f"shard: invalid rank/row/column ranges {self}")
        if self.tier not in TIERS:
            raise ValueError(f"shard.tier: expected one of {', '.join(TIERS)}, got {self.tier!r}")

    @property
    def rows(self) -> int:
        return self.row_end - self.row_start

    @property
    def cols(self) -> int:
        return self.col_end - self.col_start


@dataclass(frozen=True)
class TablePlan:
    """The placement of one table: its type and shards (for DP, one full replica per rank)."""

    table: str
    sharding: ShardingType
    shards: tuple[Shard, ...]

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(s.rank for s in self.shards)

    @property
    def shard_count(self) -> int:
        """How many shards (``len(shards)``; a planner's plan answers without building them)."""
        return len(self.shards)

    def shard_arrays(self) -> "tuple[np.ndarray, np.ndarray, np.ndarray]":
        """The shards as arrays, in shard order: ranks (int64), ``(row_start, row_end,
        col_start, col_end)`` as a ``(4, shards)`` int64 array, and each tier's index in
        :data:`TIERS` (int8): what ``host.planner.work.compact_work`` reads (a planner's plan
        gives them without building a shard object per rank)."""
        shards = self.shards
        n = len(shards)
        ranks = np.fromiter((s.rank for s in shards), dtype=np.int64, count=n)
        pieces = np.array([(s.row_start, s.row_end, s.col_start, s.col_end) for s in shards], dtype=np.int64).reshape(n, 4).T
        tiers = np.fromiter((TIERS.index(s.tier) for s in shards), dtype=np.int8, count=n)
        return ranks, pieces, tiers

    def __hash__(self) -> int:
        """The fields' hash, computed once: the planner keys its contribution caches by table
        plans, and a row-wise plan over 128 ranks hashes 128 shards (immutable, so the hash
        cannot change)."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.table, self.sharding, self.shards))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict:
        # a string's hash differs between processes: a pickled plan recomputes its own (and
        # the planner's note of what built it, ``_made``, stays with the planner)
        return {k: v for k, v in self.__dict__.items() if k not in ("_hash", "_made")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)


@dataclass(frozen=True)
class Plan:
    """A complete sharding plan for ``world_size`` ranks, ``gpus_per_node`` per node.

    ``tables`` maps every table name to its :class:`TablePlan`, in the workload's order.
    ``planner`` names who made it (``neo``, ``size-greedy``, ...).
    """

    world_size: int
    gpus_per_node: int
    tables: Mapping[str, TablePlan]
    planner: str = "neo"
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __iter__(self) -> Iterator[TablePlan]:
        return iter(self.tables.values())

    def __getitem__(self, name: str) -> TablePlan:
        return self.tables[name]

    def sharding_counts(self) -> dict[str, int]:
        """How many tables use each sharding type."""
        counts: dict[str, int] = {}
        for tp in self.tables.values():
            counts[tp.sharding.value] = counts.get(tp.sharding.value, 0) + 1
        return counts
