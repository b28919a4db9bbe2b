"""Traffic for the co-simulation: one iteration's forward embedding work per NIC (its
table shards, its bags in send order and its RDMA WRITE sends), synthetic, varied (for a
calibration) or from a cluster run's sharding plan (duck-typed, so that ``sim`` imports nothing
from ``host``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from neonic.sim.reference import embedding as ref

__all__ = ["RX_REGION_ALIGN", "endpoint", "Send", "NICJob", "Traffic", "synthetic_traffic",
           "varied_traffic", "traffic_from_plan", "vector_bytes"]

RX_REGION_ALIGN = 64


def endpoint(rank: int) -> tuple[int, int]:
    """(MAC, IPv4) of rank ``rank``'s NIC: locally administered 02:4e:49:43:xx:xx, 10.0.x.x."""
    return 0x02_4E_49_43_00_00 | rank, 0x0A_00_00_00 | rank

@dataclass(frozen=True)
class Send:
    """One RDMA WRITE a NIC posts: its next ``bags`` pooled vectors to ``dest``."""

    dest: int
    bags: int
    length: int          # payload bytes (bags x padded vector bytes)
    offset: int = 0      # byte offset of this source's region in the destination's buffer


@dataclass
class NICJob:
    """One NIC's work: its table shards, its bags (in send order) and its sends."""

    rank: int
    tables: list[ref.Table]
    bags: list[ref.Bag]
    sends: list[Send]

    @property
    def rows(self) -> int:
        return sum(int(ref.contributing(self.tables[b.table], b).sum()) for b in self.bags)


@dataclass
class Traffic:
    """A cluster's forward embedding traffic: one :class:`NICJob` per rank."""

    world: int
    gpus_per_node: int
    jobs: list[NICJob]
    label: str = "traffic"

    def buffer_bytes(self, rank: int) -> int:
        """Size of rank ``rank``'s receive buffer (every source's region)."""
        end = 0
        for job in self.jobs:
            for s in job.sends:
                if s.dest == rank:
                    end = max(end, s.offset + s.length)
        return end


def vector_bytes(dim: int, lanes: int) -> int:
    return -(-dim // lanes) * lanes * 4


def _assign_offsets(world: int, jobs: list[NICJob]) -> None:
    """Give every (source, destination) message its region of the destination's buffer."""
    at = [0] * world
    for job in sorted(jobs, key=lambda j: j.rank):
        new = []
        for s in job.sends:
            off = at[s.dest]
            at[s.dest] += -(-s.length // RX_REGION_ALIGN) * RX_REGION_ALIGN
            new.append(Send(s.dest, s.bags, s.length, off))
        job.sends = new


def _sends_for(bags_by_dest: dict[int, list[ref.Bag]], tables: list[ref.Table],
               lanes: int) -> tuple[list[ref.Bag], list[Send]]:
    bags, sends = [], []
    for dest in sorted(bags_by_dest):
        group = bags_by_dest[dest]
        if not group:
            continue
        length = sum(vector_bytes(tables[b.table].dim, lanes) for b in group)
        bags += group
        sends.append(Send(dest, len(group), length))
    return bags, sends


def synthetic_traffic(*, world: int = 4, gpus_per_node: int = 2, tables_per_rank: int = 1,
                      rows: int = 64, dim: int = 16, batch_per_gpu: int = 2, pooling: int = 4,
                      alpha: float = 1.15, lanes: int = 4, seed: int = 1) -> Traffic:
    """A small table-wise cluster: rank ``r`` owns ``tables_per_rank`` tables of ``rows`` x
    ``dim`` FP32; every sample of every rank looks up every table with ``pooling`` Zipf(``alpha``)
    indices (bag lengths vary by +-1 around ``pooling``)."""
    if world < 1 or gpus_per_node < 1 or world % gpus_per_node:
        raise ValueError(f"world: expected a multiple of gpus_per_node={gpus_per_node}, "
                         f"got {world}")
    rng = np.random.default_rng(seed)
    jobs = []
    for r in range(world):
        tables = [ref.random_table(rng, rows, dim) for _ in range(tables_per_rank)]
        by_dest: dict[int, list[ref.Bag]] = {}
        tag = 0
        for q in range(world):
            for sample in range(batch_per_gpu):
                for t in range(tables_per_rank):
                    n = max(0, pooling + int(rng.integers(-1, 2)))
                    idx = ref.zipf_indices(rng, alpha, rows, n)
                    by_dest.setdefault(q, []).append(ref.Bag(t, idx, tag=tag & 0xFF))
                    tag += 1
        bags, sends = _sends_for(by_dest, tables, lanes)
        jobs.append(NICJob(r, tables, bags, sends))
    _assign_offsets(world, jobs)
    return Traffic(world, gpus_per_node, jobs,
                   label=f"synthetic {world // gpus_per_node}x{gpus_per_node}, "
                         f"{tables_per_rank} table(s)/rank, batch {batch_per_gpu}")


def varied_traffic(specs: Sequence[dict[str, Any]], *, batch_per_gpu: int = 2,
                   lanes: int = 4, seed: int = 1, label: str = "varied") -> Traffic:
    """One rank per spec, each owning one table of its own shape: ``rows``, ``dim``,
    ``pooling`` (lookups per bag) and ``alpha`` (Zipf); every sample of every rank looks it up.
    The NICs' workloads differ (cache hit rates from near 0 to near 1), which is what a
    calibration needs from one co-simulation (``neonic calibrate``)."""
    world = len(specs)
    if world < 1:
        raise ValueError("specs: expected at least one workload spec, got none")
    rng = np.random.default_rng(seed)
    jobs = []
    for r, spec in enumerate(specs):
        rows, dim = int(spec["rows"]), int(spec["dim"])
        pooling, alpha = int(spec.get("pooling", 4)), float(spec.get("alpha", 1.15))
        table = ref.random_table(rng, rows, dim)
        by_dest: dict[int, list[ref.Bag]] = {}
        tag = 0
        for q in range(world):
            for _ in range(batch_per_gpu):
                n = max(0, pooling + int(rng.integers(-1, 2)))
                by_dest.setdefault(q, []).append(
                    ref.Bag(0, ref.zipf_indices(rng, alpha, rows, n), tag=tag & 0xFF))
                tag += 1
        bags, sends = _sends_for(by_dest, [table], lanes)
        jobs.append(NICJob(r, [table], bags, sends))
    _assign_offsets(world, jobs)
    return Traffic(world, 1, jobs, label=label)


def traffic_from_plan(plan: Any, tables: Sequence[Any], *, batch_per_gpu: int, world: int,
                      gpus_per_node: int, lanes: int, seed: int = 1, alpha: float = 1.15,
                      max_rows: int = 1 << 14, lookups: Any = None) -> Traffic:
    """One iteration's forward traffic under a sharding plan.

    ``plan.tables[name]`` gives ``sharding`` (its ``.value``) and ``shards`` (``rank``,
    ``row_start``/``row_end``, ``col_start``/``col_end``); ``tables`` are the workload's tables
    (``name``, ``rows``, ``dim``, ``pooling``: mean lookups per bag). Every rank owns
    ``batch_per_gpu`` samples; each sample looks up every table (Poisson bag lengths, Zipf row
    popularity); each shard's owner pools the lookups that fall in its rows over its columns
    and sends them to the samples' owners. Data-parallel tables are skipped.

    ``lookups``: the iteration's :class:`~sim.lookups.LookupBatch` (the cluster run's own, so
    the RTL runs the lookups the timing models ran); None draws the default one for ``seed``
    and ``alpha`` (:func:`sim.lookups.draw_lookups`). It must hold the whole batch.
    """
    from neonic.sim.lookups import draw_lookups

    if lookups is None:
        lookups = draw_lookups(tables, world=world, batch_per_gpu=batch_per_gpu, seed=seed, alpha=alpha)
    rng = np.random.default_rng(seed)
    per_rank_tables: list[list[ref.Table]] = [[] for _ in range(world)]
    per_rank_bags: list[dict[int, list[ref.Bag]]] = [{} for _ in range(world)]
    tags = [0] * world
    for t in tables:
        tp = plan.tables[t.name]
        if getattr(tp.sharding, "value", tp.sharding) == "data_parallel":
            continue
        if t.rows > max_rows:
            raise ValueError(f"workload.tables.{t.name}.rows: the RTL backend holds whole tables "
                             f"in simulated memory: expected <= {max_rows}, got {t.rows}")
        full = (rng.standard_normal((t.rows, t.dim))).astype(np.float32)
        tl = lookups[t.name]
        if tl.scale != 1.0 or tl.bags != world * batch_per_gpu:
            raise ValueError(f"workload.tables.{t.name}: the RTL backend needs the whole batch of "
                             f"{world * batch_per_gpu} bags, the lookups hold {tl.bags}")
        ends = np.cumsum(tl.lengths)
        flat = np.split(tl.indices, ends[:-1])
        indices = [flat[q * batch_per_gpu:(q + 1) * batch_per_gpu] for q in range(world)]
        for shard in tp.shards:
            cols = shard.col_end - shard.col_start
            if cols % lanes:
                raise ValueError(f"workload.tables.{t.name}: a shard of {cols} columns is not a "
                                 f"multiple of the NIC's {lanes} lanes")
            r = shard.rank
            sub = ref.Table(np.ascontiguousarray(full[shard.row_start:shard.row_end,
                                                      shard.col_start:shard.col_end]))
            ti = len(per_rank_tables[r])
            per_rank_tables[r].append(sub)
            for q in range(world):
                for s in range(batch_per_gpu):
                    idx = indices[q][s]
                    keep = idx[(idx >= shard.row_start) & (idx < shard.row_end)] - shard.row_start
                    per_rank_bags[r].setdefault(q, []).append(
                        ref.Bag(ti, keep, tag=tags[r] & 0xFF))
                    tags[r] += 1
    jobs = []
    for r in range(world):
        bags, sends = _sends_for(per_rank_bags[r], per_rank_tables[r], lanes)
        jobs.append(NICJob(r, per_rank_tables[r], bags, sends))
    _assign_offsets(world, jobs)
    return Traffic(world, gpus_per_node, jobs, label="plan")
