"""Independent pieces of the search computed by two processes, merged in a fixed order.

The search's start plans and the class moves of a step (:mod:`host.planner.search`) are
independent of one another: each is a deterministic function of the state the search is in.
:func:`map_forked` computes such a list of tasks with ``workers`` processes (this one and
forked copies of it, which see its state and caches as they are at the fork) and returns the
results in task order, whichever process computed each. The plan therefore depends neither on
the machine's load nor on the scheduling of the processes, nor on how the tasks were split
(a test plans with one process and with two). A worker that fails (no ``fork`` on the
platform, out of memory, ...) costs time, not the result: its tasks are computed here instead.

A balancing search's steps (also those after each of the regrouping's attempts, which are
made in turn) depend each on the last, so there a forked copy follows this
process step by step instead (:class:`Lockstep`): both make the same candidates, each prices
half of them, and both apply the move this process picks from the two halves' best.

What a worker computes is sent back pickled, so tasks return small results (a state's figures,
not the table plans of 1000 tables over 1024 ranks); a caller that needs more of a winning task
computes it again here. What the workers put in their caches is lost with them.

Page faults (measured on model-a's planning at 1024 GPUs, after a planning at 128 in the same
process). After each fork, this process's first write to each page it shares with the copy
faults: about 280k minor faults in this process with two workers (0.6-1.0 s of system time),
against 8k with one (0.1-0.3 s). They come from the heap the process holds when the search
begins (about 600 MB), rewritten as the search goes, not from the search's growth: one fork at
the start of a one-process search, its copy kept alive, still costs 171k faults (0.7-1.0 s; 154k
and 0.4 s with the copy gone at once), and forking the pricing copy together with the start
plans' worker left the count as it was (287k): the pages written between forks barely overlap.
So one long-lived forked helper instead of the five forks would save at most about 110k faults;
only a helper sharing no pages (spawned, sent the workload and the search's state, rebuilding the
cost model and its caches) would save them all. Releasing the free heap in each copy right
after the fork (``malloc_trim``: 300-400 MB of its 550-590) changed nothing measurable.
"""

from __future__ import annotations

import os
import pickle
import signal
from typing import Any, Callable, Sequence

__all__ = ["available_workers", "map_forked", "ForkedServer", "Lockstep"]


def available_workers(limit: int = 2) -> int:
    """The CPUs this process may run on, at most ``limit``; 1 where ``fork`` is missing or
    where this process runs other Python threads (a forked copy of a threaded process may find
    a lock held by a thread it does not have: a Dask worker's, say)."""
    import threading

    if not hasattr(os, "fork") or threading.active_count() > 1:
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(limit, cpus))


#: Whether this process takes tasks too (tests set it False to have the workers compute all).
_MAIN_TAKES = True


def map_forked(fn: Callable[[int], Any], n: int, workers: int = 1, weights: Sequence[float] | None = None,
               alongside: Callable[[], None] | None = None) -> list[Any]:
    """``[fn(0), ..., fn(n - 1)]``, computed by ``workers`` processes (this one and
    ``workers - 1`` forked ones; see the module doc). Each process takes the next task not yet
    taken (a counter in shared memory), heaviest first by ``weights`` (each task's expected
    cost; equal if None), so the processes finish together whatever the load; which process
    computes a task changes nothing in its result. ``alongside``: work of this process's own,
    run while the workers compute (first, here only: its effects stay in this process).
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
    import multiprocessing

    order = sorted(range(n), key=lambda i: (-weights[i], i))
    ticket = multiprocessing.Value("i", 0)  # the next place in ``order`` to take, shared

    def take() -> int | None:
        with ticket.get_lock():
            k = ticket.value
            ticket.value = k + 1
        return order[k] if k < n else None

    def work() -> dict[int, Any]:
        out: dict[int, Any] = {}
        while (i := take()) is not None:
            out[i] = fn(i)
        return out

    children: list[tuple[int, int]] = []
    try:
        for _ in range(workers - 1):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the worker: compute, send back, leave without running this process's exit code
                code = 0
                try:
                    os.close(r)
                    try:
                        data = pickle.dumps(("ok", work()), protocol=pickle.HIGHEST_PROTOCOL)
                    except BaseException as error:  # noqa: BLE001  (its tasks are computed by the parent)
                        data = pickle.dumps(("error", repr(error)))
                    with os.fdopen(w, "wb") as out:
                        out.write(data)
                except BaseException:  # noqa: BLE001
                    code = 1
                finally:
                    os._exit(code)
            os.close(w)
            children.append((pid, r))
        if alongside is not None:
            alongside()
        results = work() if _MAIN_TAKES else {}
        while children:
            pid, r = children.pop(0)
            try:
                with os.fdopen(r, "rb") as f:
                    data = f.read()
            finally:
                os.waitpid(pid, 0)
            got = pickle.loads(data) if data else ("error", "no result")
            if got[0] == "ok":
                results.update(got[1])
        # what a failed worker took: the same results, computed here
        results.update({i: fn(i) for i in range(n) if i not in results})
        return [results[i] for i in range(n)]
    finally:
        for pid, r in children:  # left by an error here: stop them (none is reaped yet)
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass
            try:
                os.close(r)
            except OSError:
                pass


def _reap(pid: int, kill: bool) -> None:
    """Wait for a forked copy to end, killing it first where it may not be listening."""
    if kill:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        os.waitpid(pid, 0)
    except OSError:
        pass


class ForkedServer:
    """A forked copy of this process that answers ``fn(*request)`` for requests sent one at a
    time (:meth:`ask`, then :meth:`answer`), so that a step's work can be split between two
    processes without a fork per step (a fork of a process holding 0.5 GB costs about 60 ms
    in page faults: more than half of what a refinement step's split saves). The copy sees
    this process's state as it was at the fork: ``fn`` must depend on its arguments and on
    what does not change after it (the search's cost model). Whatever goes wrong in the copy
    (no ``fork``, a failed call, a lost pipe) makes :meth:`answer` return None: the caller
    computes the request itself, so a result never depends on the copy. :meth:`close` stops it
    (an explicit message: the copy's pipe may also be held by other forked children)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self._pid: int | None = None
        self._to = self._from = None
        self._waiting = False
        if not hasattr(os, "fork"):
            return
        req_r, req_w = os.pipe()
        res_r, res_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the copy: answer until told to stop, leave without this process's exit code
            code = 0
            try:
                os.close(req_w)
                os.close(res_r)
                with os.fdopen(req_r, "rb") as inp, os.fdopen(res_w, "wb") as out:
                    while True:
                        try:
                            request = pickle.load(inp)
                        except EOFError:
                            break
                        if request is None:
                            break
                        try:
                            reply = ("ok", fn(*request))
                        except BaseException as error:  # noqa: BLE001  (the caller computes it)
                            reply = ("error", repr(error))
                        pickle.dump(reply, out, protocol=pickle.HIGHEST_PROTOCOL)
                        out.flush()
            except BaseException:  # noqa: BLE001
                code = 1
            finally:
                os._exit(code)
        os.close(req_r)
        os.close(res_w)
        self._pid = pid
        self._to = os.fdopen(req_w, "wb")
        self._from = os.fdopen(res_r, "rb")

    def ask(self, *request: Any) -> bool:
        """Send ``request`` (its answer comes from :meth:`answer`); False if the copy is gone."""
        if self._pid is None:
            return False
        try:
            pickle.dump(request, self._to, protocol=pickle.HIGHEST_PROTOCOL)
            self._to.flush()
            self._waiting = True
            return True
        except (OSError, pickle.PicklingError, ValueError):
            self.close()
            return False

    def answer(self) -> Any:
        """The answer to the last request, or None if the copy could not give it."""
        if self._pid is None or not self._waiting:
            return None
        self._waiting = False
        try:
            got = pickle.load(self._from)
        except (OSError, EOFError, pickle.UnpicklingError, ValueError):
            self.close()
            return None
        return got[1] if got[0] == "ok" else None

    def close(self) -> None:
        """Stop the copy and wait for it."""
        pid, self._pid = self._pid, None
        if pid is None:
            return
        for f, stop in ((self._to, True), (self._from, False)):
            try:
                if stop and not self._waiting:
                    pickle.dump(None, f)
                    f.flush()
            except (OSError, ValueError):
                pass
            try:
                f.close()
            except OSError:
                pass
        _reap(pid, kill=self._waiting)  # mid-request: it is not listening for the stop

    def __enter__(self) -> "ForkedServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Lockstep:
    """One end of a pipe pair between this process and a forked copy that follows it step by
    step (:meth:`fork`): each step, the copy :meth:`tell`\\ s its share of the work and
    :meth:`hear`\\ s what this process decided, so both apply the same decision. The copy
    must end with ``os._exit`` (it never returns past the caller's loop). Whatever goes wrong
    with the copy (no ``fork``, a failed step, a lost pipe) makes :meth:`hear` here return
    :data:`LOST` (the end closed, the copy stopped): the caller does the copy's share itself,
    so a result never depends on the copy."""

    #: what :meth:`hear` returns here where the copy could not answer
    LOST = object()

    def __init__(self, pid: int | None, out, inp) -> None:
        self._pid, self._out, self._in = pid, out, inp

    @classmethod
    def fork(cls) -> "tuple[Lockstep | None, Lockstep | None]":
        """``(this process's end, None)`` here and ``(None, the copy's end)`` in the copy;
        ``(None, None)`` where no copy could be made (the caller then works alone)."""
        if not hasattr(os, "fork"):
            return None, None
        up_r, up_w = os.pipe()      # copy -> here
        down_r, down_w = os.pipe()  # here -> copy
        try:
            pid = os.fork()
        except OSError:
            for fd in (up_r, up_w, down_r, down_w):
                os.close(fd)
            return None, None
        if pid == 0:
            os.close(up_r)
            os.close(down_w)
            return None, cls(None, os.fdopen(up_w, "wb"), os.fdopen(down_r, "rb"))
        os.close(up_w)
        os.close(down_r)
        return cls(pid, os.fdopen(down_w, "wb"), os.fdopen(up_r, "rb")), None

    def tell(self, message: Any) -> bool:
        """Send ``message`` to the other end; False (the end closed) if it is gone."""
        try:
            pickle.dump(message, self._out, protocol=pickle.HIGHEST_PROTOCOL)
            self._out.flush()
            return True
        except (OSError, pickle.PicklingError, ValueError):
            self.close()
            return False

    def hear(self) -> Any:
        """The other end's next message: here :data:`LOST` where the copy could not give it
        (the end then closed); in the copy None where this process is gone (stop)."""
        try:
            return pickle.load(self._in)
        except (OSError, EOFError, pickle.UnpicklingError, ValueError):
            self.close()
            return self.LOST if self._pid is not None else None

    def close(self) -> None:
        """Close this end; here, also stop the copy and wait for it."""
        for f in (self._out, self._in):
            try:
                f.close()
            except OSError:
                pass
        pid, self._pid = self._pid, None
        if pid is not None:
            _reap(pid, kill=True)
