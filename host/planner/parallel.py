"""Independent pieces of the search computed by two processes, merged in a fixed order.

The search's start plans and the class moves of a step (:mod:`host.planner.search`) are
independent of one another: each is a deterministic function of the state the search is in.
:func:`map_forked` computes such a list of tasks with ``workers`` processes (this one and
forked copies of it, which see its state and caches as they are at the fork) and returns the
results in task order, whichever process computed each. The plan therefore depends neither on
the machine's load nor on the scheduling of the processes, nor on how the tasks were split
(a test plans with one process and with two). A worker that fails (no ``fork`` on the
platform, out of memory, ...) costs time, not the result: its tasks are computed here instead.

What a worker computes is sent back pickled, so tasks return small results (a state's figures,
not the table plans of 1000 tables over 1024 ranks); a caller that needs more of a winning task
computes it again here. What the workers put in their caches is lost with them.
"""

from __future__ import annotations

import os
import pickle
import signal
from typing import Any, Callable, Sequence

__all__ = ["available_workers", "map_forked"]


def available_workers(limit: int = 2) -> int:
    """The CPUs this process may run on, at most ``limit`` (1 where ``fork`` is missing)."""
    if not hasattr(os, "fork"):
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(limit, cpus))


def _split(weights: Sequence[float], workers: int) -> list[list[int]]:
    """Task indices per process: heaviest first onto the least-loaded process (the first on a
    tie), so that the processes finish together. Deterministic."""
    load = [0.0] * workers
    bins: list[list[int]] = [[] for _ in range(workers)]
    for i in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        k = min(range(workers), key=lambda k: (load[k], k))
        bins[k].append(i)
        load[k] += weights[i]
    return [sorted(b) for b in bins]


def map_forked(fn: Callable[[int], Any], n: int, workers: int = 1, weights: Sequence[float] | None = None,
               alongside: Callable[[], None] | None = None) -> list[Any]:
    """``[fn(0), ..., fn(n - 1)]``, computed by ``workers`` processes (this one and
    ``workers - 1`` forked ones; see the module doc). ``weights``: each task's expected cost
    (equal if None), to split them evenly; ``alongside``: work of this process's own run
    while the workers compute (called first, here only: its effects stay in this process).
    ``fn`` must be deterministic and leave this process's state as it found it."""
    if workers < 1:
        raise ValueError(f"workers: expected an integer >= 1, got {workers!r}")
    weights = [1.0] * n if weights is None else list(weights)
    if len(weights) != n:
        raise ValueError(f"weights: expected {n} figures, got {len(weights)}")
    workers = min(workers, n + (alongside is not None), available_workers(workers))
    if workers < 2 or n == 0:
        if alongside is not None:
            alongside()
        return [fn(i) for i in range(n)]
    # this process takes the lightest share when it also runs ``alongside``
    bins = _split(weights, workers)
    if alongside is not None:
        bins.sort(key=lambda b: (sum(weights[i] for i in b), b))
    mine, others = bins[0], bins[1:]
    children: list[tuple[int, int, list[int]]] = []
    try:
        for tasks in others:
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the worker: compute, send back, leave without running this process's exit code
                code = 0
                try:
                    os.close(r)
                    try:
                        data = pickle.dumps(("ok", {i: fn(i) for i in tasks}), protocol=pickle.HIGHEST_PROTOCOL)
                    except BaseException as error:  # noqa: BLE001  (reported, then computed by the parent)
                        data = pickle.dumps(("error", repr(error)))
                    with os.fdopen(w, "wb") as out:
                        out.write(data)
                except BaseException:  # noqa: BLE001
                    code = 1
                finally:
                    os._exit(code)
            os.close(w)
            children.append((pid, r, tasks))
        if alongside is not None:
            alongside()
        results = {i: fn(i) for i in mine}
        while children:
            pid, r, tasks = children.pop(0)
            try:
                with os.fdopen(r, "rb") as f:
                    data = f.read()
            finally:
                os.waitpid(pid, 0)
            got = pickle.loads(data) if data else ("error", "no result")
            if got[0] == "ok" and set(got[1]) == set(tasks):
                results.update(got[1])
            else:  # the same results, computed here
                results.update({i: fn(i) for i in tasks})
        return [results[i] for i in range(n)]
    finally:
        for pid, r, _ in children:  # left by an error here: stop them (none is reaped yet)
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass
            try:
                os.close(r)
            except OSError:
                pass
