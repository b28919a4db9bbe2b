"""The timing models set beside the RTL in a co-simulation: the reference cache's outcomes,
the cache's request-level timing (``sim.timing.cache``) at the gather model's issue times,
the composed gather + cache model iterated to a fixed point, and the calibration sample of
one NIC's run (``sim.calibration``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from neonic.rtl.smartnic import SmartNIC
from neonic.sim.calibration import Calibration, Sample
from neonic.sim.cosim.stimulus import DEFAULT_MEMORY_LATENCY
from neonic.sim.cosim.traffic import NICJob
from neonic.sim.reference import embedding as ref
from neonic.sim.reference.cache import HIT, MISS, CacheConfig, CacheModel, Request
from neonic.sim.timing.cache import CacheTiming
from neonic.sim.timing.embedding import predict, shapes_from_bags
from neonic.sim.timing.packetizer import estimate_rx, estimate_tx

__all__ = ["reference_cache", "cache_request_starts", "memory_model", "calibration_sample",
           "model_cycles", "MAX_MEMORY_ITERATIONS"]


def _requests(nic: SmartNIC, job: NICJob, bases: list[int]) -> list[tuple[int, int]]:
    W = nic.data_bytes
    out = []
    for b in job.bags:
        t = job.tables[b.table]
        stride = ref.row_stride_beats(t.dim, t.elem_type, W)
        keep = ref.contributing(t, b)
        for idx in b.indices[keep]:
            out.append((bases[b.table] + int(idx) * stride, stride))
    return out


def reference_cache(nic: SmartNIC, job: NICJob, bases: list[int]) -> dict[str, float]:
    """Hits (merged misses included) and misses of the reference cache model on the job's
    requests, from a cold cache."""
    model = CacheModel(_cache_config(nic))
    hits = misses = 0
    for addr, beats in _requests(nic, job, bases):
        out = model.request(addr, beats, False, nic.line_beats, nic.cache.row_beats)
        hits += out.kind == HIT
        misses += out.kind == MISS
    n = hits + misses
    return {"hits": hits, "misses": misses, "hit_rate": hits / n if n else 0.0}


def _cache_config(nic: SmartNIC) -> CacheConfig:
    p = nic.params
    return CacheConfig(sets=p["cache_sets"], ways=p["cache_ways"], policy=p["cache_policy"],
                       index=p["cache_index"])


def cache_request_starts(nic: SmartNIC, requests: Sequence[tuple[int, int]],
                         offers: Sequence[float], *, memory_latency: float) -> list[float]:
    """When the SmartNIC's cache can start delivering each read request ``(address, beats)``
    (in order) offered at ``offers`` (cycles), from a cold cache: the cache timing model
    (``sim.timing.cache.CacheTiming.schedule``) at the NIC's cache parameters, with each
    request's own offer time and the first beat of a fill ``memory_latency`` cycles (at least
    one) after its request. Outcomes come from the reference cache model."""
    if len(offers) != len(requests):
        raise ValueError(f"offers: expected one per request ({len(requests)}), got {len(offers)}")
    cache = nic.cache
    timing = CacheTiming(row_beats=cache.row_beats, mshrs=cache.mshrs,
                         queue_depth=cache.queue_depth, latency=max(1.0, float(memory_latency)))
    reqs = [Request(int(addr), int(beats), False) for addr, beats in requests]
    return [float(s) for s in timing.schedule(reqs, _cache_config(nic), line_beats=nic.line_beats,
                                              offers=offers).starts]


#: Fixed-point iterations of :func:`memory_model` before it settles for the mean of the last two.
MAX_MEMORY_ITERATIONS = 40


def memory_model(nic: SmartNIC, job: NICJob, bases: list[int],
                 memory_latency: float) -> Callable[[float, float], tuple[float, float]]:
    """The composed gather + cache model of one NIC's job: ``(hit_latency, miss_cycles) ->
    (gather cycles, memory window cycles)`` (see ``sim.calibration``).

    Each row's latency is ``hit_latency`` plus the wait the cache adds beyond its own hit path
    (:func:`cache_request_starts` at ``memory_latency + miss_cycles``, from the cycle the gather
    model issues it: queueing behind other requests, fills); the gather model (``sim.timing.embedding.predict``) and the cache model
    are iterated until the issue times stop changing. The memory window runs from the first
    request to the last beat the reducer takes."""
    timing = nic.gather.timing
    shapes = shapes_from_bags(job.tables, job.bags)
    reqs = _requests(nic, job, bases)
    path = CacheTiming(row_beats=nic.cache.row_beats).hit_latency
    memo: dict[tuple[float, float], tuple[float, float]] = {}

    def run(hit_latency: float, miss_cycles: float) -> tuple[float, float]:
        key = (round(hit_latency, 3), round(miss_cycles, 3))
        if key in memo:
            return memo[key]
        if not shapes:
            memo[key] = (0.0, 0.0)
            return memo[key]
        hit = max(1.0, hit_latency)
        lats: list[float] | float = hit
        history: list[tuple[float, float]] = []
        for _ in range(MAX_MEMORY_ITERATIONS):
            pr = predict(timing, shapes, latency=lats)
            window = float(pr.last_take - pr.issue[0] + 1) if pr.issue else 0.0
            history.append((float(pr.cycles), window))
            if not reqs:
                break
            starts = cache_request_starts(nic, reqs, pr.issue,
                                          memory_latency=memory_latency + miss_cycles)
            # a start already holds the cache's own hit path (an unqueued hit starts at
            # offer + path - 1): only the wait beyond it is added to the hit latency
            new = [max(1.0, hit + s + 1 - o - path) for s, o in zip(starts, pr.issue)]
            if new == lats:
                break
            lats = new
        else:   # no fixed point (an oscillation): the mean of the last two
            history[-1] = tuple((a + b) / 2 for a, b in zip(history[-1], history[-2]))
        memo[key] = history[-1]
        return memo[key]
    return run


def _row_dims(job: NICJob) -> list[int]:
    out = []
    for b in job.bags:
        t = job.tables[b.table]
        out += [t.dim] * int(ref.contributing(t, b).sum())
    return out


def calibration_sample(nic: SmartNIC, job: NICJob, stim_tx: dict, rx_lengths: list[int],
                       rtl: dict[str, float], label: str = "",
                       memory_latency: float = DEFAULT_MEMORY_LATENCY) -> Sample:
    """The calibration/model view of one NIC's run (see ``sim.calibration.Sample``)."""
    bases = [d["base"] for d in stim_tx["descs"]]
    cref = reference_cache(nic, job, bases)
    lengths = [s.length for s in job.sends]
    tx = estimate_tx(lengths, data_bytes=nic.data_bytes, pmtu=nic.pmtu,
                     with_imm=[True] * len(lengths)).cycles if lengths else 0
    rx = estimate_rx(rx_lengths, data_bytes=nic.data_bytes, pmtu=nic.pmtu,
                     with_imm=[True] * len(rx_lengths)) if rx_lengths else 0
    return Sample(rtl=dict(rtl), hit_rate=cref["hit_rate"],
                  memory_model=memory_model(nic, job, bases, memory_latency),
                  tx_alone=float(tx), rx_model=float(rx), misses=int(cref["misses"]),
                  label=label)


def model_cycles(sample: Sample, cal: Calibration) -> dict[str, float]:
    """The timing-model backend's cycles per unit for one NIC's run (``sample.predict``)."""
    return sample.predict(cal)
