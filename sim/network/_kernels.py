"""Per-flow bookkeeping of :class:`sim.network.network.Network`, compiled when numba is present.

Each function has a numpy twin with identical results; the compiled form avoids a dozen O(F)
temporary arrays per recompute, which dominate at a million flows. Per recompute a group costs
one pass over its classes (:func:`step`: drain, credit, predict, and the candidates that may end
by the next recompute); retiring (:func:`retire`) and marking touch only those.
"""

from __future__ import annotations

import math

import numpy as np

from neonic.sim.compiled import jit

from .maxmin import HAVE_NUMBA, first_saturated_level

__all__ = ["account", "components", "drain", "lazy_begin", "lazy_bound", "lazy_end", "lazy_materialize", "mark_cls",
           "void_cls", "finish_cls", "retire", "stable_argsort", "step", "step_one", "step_parts", "step_runs", "step_range",
           "traffic", "disjoint_shares"]


def _credit_np(alive, rem, rate_new, rate_old, span):
    gain = np.maximum(rate_new - rate_old, 0.0) * span
    rem[alive] = np.maximum(rem[alive] - gain[alive], 0.0)


# ------------------------------------------------------------------ flow classes (members)
def _account_np(done_cls, members, starts, links_fh, acct_fh, factor_f, wire, nbytes_f, link_bytes, link_wire):
    """Bytes of the member flows of the classes ``done_cls`` onto their links."""
    if done_cls.size == 0:
        return
    L = link_bytes.size
    lens = starts[done_cls + 1] - starts[done_cls]
    offs = np.repeat(starts[done_cls] - np.cumsum(lens) + lens, lens)
    fl = members[np.arange(int(lens.sum())) + offs]
    lk = np.concatenate([links_fh[fl], acct_fh[fl]], axis=1)
    nb = nbytes_f[fl]
    fac = factor_f[fl]
    for h in range(lk.shape[1]):
        row = lk[:, h]
        link_bytes += np.bincount(row, nb, minlength=L + 1)[:L]
        link_wire += np.bincount(row, np.where(wire[row], fac, 1.0) * nb, minlength=L + 1)[:L]


def _mark_cls_np(alive, pred, horizon, members, starts, lat, orig, finish_ps):
    fin = np.flatnonzero(alive & (pred <= horizon))
    for c in fin:
        fl = members[starts[c]:starts[c + 1]]
        finish_ps[orig[fl]] = int(np.ceil(min(pred[c], horizon))) + lat[fl]
    return int(fin.size)


def _finish_cls_np(done_cls, pred, members, starts, lat, orig, finish_ps):
    """Arrival times of the member flows of classes ``done_cls`` that finished at ``pred``."""
    for c in done_cls:
        fl = members[starts[c]:starts[c + 1]]
        finish_ps[orig[fl]] = int(np.ceil(pred[c])) + lat[fl]


def _void_cls_np(alive, members, starts, orig, finish_ps):
    for c in np.flatnonzero(alive):
        finish_ps[orig[members[starts[c]:starts[c + 1]]]] = -1


def _traffic_np(src, dst, cls, identity, alive, rate, tx, rx):
    """Add each live flow's rate (its class's; 0 where not finite) to ``tx[src]`` and
    ``rx[dst]``, flow by flow in order (the sums of a bincount over the live flows)."""
    c = np.arange(src.size) if identity else cls
    live = alive[c]
    r = rate[c][live]
    r = np.where(np.isfinite(r), r, 0.0)
    np.add.at(tx, src[live], r)  # unbuffered: in flow order, as the compiled loop
    np.add.at(rx, dst[live], r)


def _sequence_reps_py(order, starts, cls):
    """Per endpoint ``e`` the first endpoint whose flows ``order[starts[e]:starts[e + 1]]`` (in
    flow order) have the same classes ``cls`` in the same order (itself where none before): a
    hash of each sequence finds the candidates in an open-addressing table, and an element by
    element comparison decides, so a collision never joins two endpoints."""
    E = starts.shape[0] - 1
    size = 16
    while size < 2 * E + 2:
        size *= 2
    table = np.full(size, -1, dtype=np.int64)
    hashes = np.zeros(E, dtype=np.int64)
    rep = np.empty(E, dtype=np.int64)
    mask = (1 << 62) - 1
    for e in range(E):
        lo = starts[e]
        hi = starts[e + 1]
        h = hi - lo
        for k in range(lo, hi):
            h = ((h * 1000003) ^ (cls[order[k]] + 1)) & mask
        hashes[e] = h
        slot = h & (size - 1)
        while True:
            r = table[slot]
            if r == -1:
                table[slot] = e
                rep[e] = e
                break
            if hashes[r] == h and starts[r + 1] - starts[r] == hi - lo:
                same = True
                off = starts[r] - lo
                for k in range(lo, hi):
                    if cls[order[k]] != cls[order[k + off]]:
                        same = False
                        break
                if same:
                    rep[e] = r
                    break
            slot = (slot + 1) & (size - 1)
    return rep


def _traffic_firsts_np(firsts, bounds, seq, alive, rate, acc):
    """Add to ``acc[e]``, for endpoint ``e = firsts[i]``, the class rates (0 where not finite)
    of its flows' classes ``seq[bounds[i]:bounds[i + 1]]`` (in flow order) one by one, skipping
    dead classes (``_traffic_np``'s sums)."""
    for i, e in enumerate(firsts):
        c = seq[bounds[i]:bounds[i + 1]]
        r = rate[c][alive[c]]
        r = np.where(np.isfinite(r), r, 0.0)
        np.add.at(acc, np.full(r.size, e), r)


if HAVE_NUMBA:
    from numba import njit

    @njit(cache=True, nogil=True)
    def _traffic_nb(src, dst, cls, identity, alive, rate, tx, rx):  # pragma: no cover
        for f in range(src.shape[0]):
            c = f if identity else cls[f]
            if alive[c]:
                r = rate[c]
                if not np.isfinite(r):
                    r = 0.0
                tx[src[f]] += r
                rx[dst[f]] += r


    _sequence_reps_nb = njit(cache=True, nogil=True)(_sequence_reps_py)

    @njit(cache=True, nogil=True)
    def _traffic_firsts_each_nb(firsts, bounds, seq, alive, rate, acc):  # pragma: no cover
        # four endpoints at a time (``firsts`` are distinct), each summed in a register in its
        # own order: the same additions as one endpoint after another, without each addition
        # waiting on the one before (a third of the time at 4096 GPUs)
        n = firsts.shape[0]
        i = 0
        while i + 4 <= n:
            a0, a1, a2, a3, a4 = bounds[i], bounds[i + 1], bounds[i + 2], bounds[i + 3], bounds[i + 4]
            s0, s1, s2, s3 = acc[firsts[i]], acc[firsts[i + 1]], acc[firsts[i + 2]], acc[firsts[i + 3]]
            m = min(min(a1 - a0, a2 - a1), min(a3 - a2, a4 - a3))
            for k in range(m):
                c0, c1, c2, c3 = seq[a0 + k], seq[a1 + k], seq[a2 + k], seq[a3 + k]
                if alive[c0]:
                    r = rate[c0]
                    if not np.isfinite(r):
                        r = 0.0
                    s0 += r
                if alive[c1]:
                    r = rate[c1]
                    if not np.isfinite(r):
                        r = 0.0
                    s1 += r
                if alive[c2]:
                    r = rate[c2]
                    if not np.isfinite(r):
                        r = 0.0
                    s2 += r
                if alive[c3]:
                    r = rate[c3]
                    if not np.isfinite(r):
                        r = 0.0
                    s3 += r
            acc[firsts[i]], acc[firsts[i + 1]], acc[firsts[i + 2]], acc[firsts[i + 3]] = s0, s1, s2, s3
            for j in range(4):  # each one's flows past the common length
                s = acc[firsts[i + j]]
                for k in range(bounds[i + j] + m, bounds[i + j + 1]):
                    c = seq[k]
                    if alive[c]:
                        r = rate[c]
                        if not np.isfinite(r):
                            r = 0.0
                        s += r
                acc[firsts[i + j]] = s
            i += 4
        while i < n:
            s = acc[firsts[i]]
            for k in range(bounds[i], bounds[i + 1]):
                c = seq[k]
                if alive[c]:
                    r = rate[c]
                    if not np.isfinite(r):
                        r = 0.0
                    s += r
            acc[firsts[i]] = s
            i += 1

    @njit(cache=True, nogil=True)
    def _traffic_firsts_nb(firsts, bounds, seq, alive, rate, acc):  # pragma: no cover
        # Each class's term first (its rate where alive and finite, else 0.0: one pass over the
        # classes), then eight endpoints at a time, each summed in a register in its own order,
        # without a branch: adding the 0.0 of a dead class where the loop above skips it gives
        # the same bits (x + 0.0 == x for every x but -0.0, and a sum that does not start at -0.0
        # never becomes -0.0), so where a start is -0.0, or the classes outnumber the terms (the
        # pass over them would cost more than it saves), the loop above runs instead. About twice
        # as fast at 4096 GPUs (512 endpoints x 4095 flows a side).
        n = firsts.shape[0]
        C = alive.shape[0]
        plain = C > seq.shape[0]
        for i in range(n):
            x = acc[firsts[i]]
            if x == 0.0 and math.copysign(1.0, x) < 0.0:
                plain = True
        if plain:
            _traffic_firsts_each_nb(firsts, bounds, seq, alive, rate, acc)
            return
        term = np.empty(C)
        for c in range(C):
            r = rate[c]
            term[c] = r if (alive[c] and np.isfinite(r)) else 0.0
        i = 0
        while i + 8 <= n:
            a0, a1, a2, a3 = bounds[i], bounds[i + 1], bounds[i + 2], bounds[i + 3]
            a4, a5, a6, a7, a8 = bounds[i + 4], bounds[i + 5], bounds[i + 6], bounds[i + 7], bounds[i + 8]
            m = min(min(min(a1 - a0, a2 - a1), min(a3 - a2, a4 - a3)), min(min(a5 - a4, a6 - a5), min(a7 - a6, a8 - a7)))
            s0, s1, s2, s3 = acc[firsts[i]], acc[firsts[i + 1]], acc[firsts[i + 2]], acc[firsts[i + 3]]
            s4, s5, s6, s7 = acc[firsts[i + 4]], acc[firsts[i + 5]], acc[firsts[i + 6]], acc[firsts[i + 7]]
            for k in range(m):
                s0 += term[seq[a0 + k]]
                s1 += term[seq[a1 + k]]
                s2 += term[seq[a2 + k]]
                s3 += term[seq[a3 + k]]
                s4 += term[seq[a4 + k]]
                s5 += term[seq[a5 + k]]
                s6 += term[seq[a6 + k]]
                s7 += term[seq[a7 + k]]
            acc[firsts[i]], acc[firsts[i + 1]], acc[firsts[i + 2]], acc[firsts[i + 3]] = s0, s1, s2, s3
            acc[firsts[i + 4]], acc[firsts[i + 5]], acc[firsts[i + 6]], acc[firsts[i + 7]] = s4, s5, s6, s7
            for j in range(8):  # each one's flows past the common length
                s = acc[firsts[i + j]]
                for k in range(bounds[i + j] + m, bounds[i + j + 1]):
                    s += term[seq[k]]
                acc[firsts[i + j]] = s
            i += 8
        while i < n:
            s = acc[firsts[i]]
            for k in range(bounds[i], bounds[i + 1]):
                s += term[seq[k]]
            acc[firsts[i]] = s
            i += 1

    @njit(cache=True, nogil=True)
    def _done_flows_nb(done_cls, members, starts):  # pragma: no cover
        """The member flows of the classes ``done_cls``, class by class, in one array."""
        n = 0
        for i in range(done_cls.shape[0]):
            c = done_cls[i]
            n += starts[c + 1] - starts[c]
        fl = np.empty(n, dtype=np.int64)
        j = 0
        for i in range(done_cls.shape[0]):
            c = done_cls[i]
            for e in range(starts[c], starts[c + 1]):
                fl[j] = members[e]
                j += 1
        return fl

    @njit(cache=True, nogil=True)
    def _account_nb(done_cls, members, starts, links_fh, acct_fh, factor_f, wire, nbytes_f, link_bytes, link_wire):  # pragma: no cover
        # The finished flows lie scattered over a million-flow group: their sizes, factors and
        # links are gathered first in a loop of independent loads (many cache misses in flight,
        # about twice as fast), then added onto the links flow by flow, hop by hop, in the order
        # of one loop over them (the same additions, the same bits).
        H = links_fh.shape[1]
        A = acct_fh.shape[1]
        L = link_bytes.shape[0]
        fl = _done_flows_nb(done_cls, members, starts)
        n = fl.shape[0]
        nb = np.empty(n)
        fac = np.empty(n)
        lk = np.empty((n, H + A), dtype=links_fh.dtype)
        for j in range(n):
            f = fl[j]
            nb[j] = nbytes_f[f]
            fac[j] = factor_f[f]
            for h in range(H):
                lk[j, h] = links_fh[f, h]
            for h in range(A):
                lk[j, H + h] = acct_fh[f, h]
        for j in range(n):
            b = nb[j]
            for h in range(H + A):
                k = lk[j, h]
                if k < L:
                    link_bytes[k] += b
                    link_wire[k] += b * fac[j] if wire[k] else b

    @njit(cache=True, nogil=True)
    def _mark_cls_nb(alive, pred, horizon, members, starts, lat, orig, finish_ps):  # pragma: no cover
        n = 0
        for c in range(alive.shape[0]):
            if alive[c] and pred[c] <= horizon:
                p = pred[c] if pred[c] < horizon else horizon
                t = np.int64(np.ceil(p))
                for e in range(starts[c], starts[c + 1]):
                    f = members[e]
                    finish_ps[orig[f]] = t + lat[f]
                n += 1
        return n

    @njit(cache=True, nogil=True)
    def _finish_cls_nb(done_cls, pred, members, starts, lat, orig, finish_ps):  # pragma: no cover
        # as _account_nb: the scattered flows' arrival times first (independent loads), then
        # written in the same order
        fl = _done_flows_nb(done_cls, members, starts)
        n = fl.shape[0]
        t = np.empty(n, dtype=np.int64)
        j = 0
        for i in range(done_cls.shape[0]):
            c = done_cls[i]
            tc = np.int64(np.ceil(pred[c]))
            for e in range(starts[c], starts[c + 1]):
                t[j] = tc
                j += 1
        o = np.empty(n, dtype=np.int64)
        for j in range(n):
            f = fl[j]
            o[j] = orig[f]
            t[j] += lat[f]
        for j in range(n):
            finish_ps[o[j]] = t[j]

    @njit(cache=True, nogil=True)
    def _void_cls_nb(alive, members, starts, orig, finish_ps):  # pragma: no cover
        for c in range(alive.shape[0]):
            if alive[c]:
                for e in range(starts[c], starts[c + 1]):
                    finish_ps[orig[members[e]]] = -1

    account, mark_cls, void_cls, finish_cls = _account_nb, _mark_cls_nb, _void_cls_nb, _finish_cls_nb
    traffic = _traffic_nb
    sequence_reps, traffic_firsts = _sequence_reps_nb, _traffic_firsts_nb
else:  # pragma: no cover
    account, mark_cls, void_cls, finish_cls = _account_np, _mark_cls_np, _void_cls_np, _finish_cls_np
    traffic = _traffic_np
    sequence_reps, traffic_firsts = _sequence_reps_py, _traffic_firsts_np


# ------------------------------------------------ retire candidates, fused advance + predict
def _retire_np(cand, pred, alive, rem, rate, mult, now):
    """Classes among ``cand`` (ascending) predicted to end by ``now``: retired; (done, sr, srt)."""
    c = cand[alive[cand] & (pred[cand] <= now)]
    sr = float((rate[c] * mult[c]).sum()) if c.size else 0.0
    srt = float((rate[c] * pred[c] * mult[c]).sum()) if c.size else 0.0
    alive[c] = False
    rem[c] = 0.0
    rate[c] = 0.0
    return c, sr, srt


def _step_np(alive, rem, rate_old, dt, span, now, rate, pred, coalesce, youngest, has_levels, links, level, order):
    """For the live classes: drain ``rate_old * dt``, credit ``span``, predict; returns (t_min,
    t_max, candidates): a superset of the classes that can end by the next recompute. With
    ``has_levels`` the new rates are first derived from the solver's link levels into ``rate``."""
    if has_levels:
        from .maxmin import rates_from_levels

        rates_from_levels(links, alive, level, order, out=rate)
    if dt:
        rem[alive] -= rate_old[alive] * dt
        np.maximum(rem, 0.0, out=rem)
    if span > 0.0:
        _credit_np(alive, rem, rate, rate_old, span)
    with np.errstate(divide="ignore", invalid="ignore"):
        pred[:] = np.where(alive, now + rem / np.where(alive, rate, 1.0), np.inf)
    if not alive.any():
        return math.inf, -math.inf, np.empty(0, dtype=np.int64)
    t_min = float(pred.min())
    t_max = float(pred[alive].max())
    bound = _horizon(t_min, now, coalesce, youngest)
    return t_min, t_max, np.flatnonzero(alive & (pred <= bound))


def _horizon(t_min, now, coalesce, youngest):
    """The next recompute for an earliest end ``t_min`` (see Network._predict)."""
    if not math.isfinite(t_min):
        return now
    return max(math.ceil(t_min + coalesce * max(t_min - youngest, 0.0)), now + 1)



_STEP_BLOCK = 512  # flows per block of the branch-free steps (a few KiB of each array: in L1)
#: :func:`step` without link levels takes :func:`_step_given` from this many classes on
STEP_GIVEN_MIN = 4096


@jit(cache=True, nogil=True, inline="always")
def _rise_credit_sel(r, old, new, span):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """``_left_nb``'s credit of a rate rise as a select (branch-free): ``r`` less what a rise
    from ``old`` to ``new`` over the last ``span`` already carried, never below 0."""
    if span > 0.0:
        d = new - old
        r2 = r - d * span
        r2 = r2 if r2 > 0.0 else 0.0
        r = r2 if d > 0.0 else r
    return r


@jit(cache=True, nogil=True, inline="always")
def _block_ends(b0, b1, bmin, bmax, bnan, alive, pred, cand, n, t_min, t_max, nan, bound, now, coalesce,
                youngest):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """The branch-free steps' end of a block ``b0:b1``: its earliest, latest and NaN
    predictions (``bmin``, ``bmax``, ``bnan``) into the step's (``_note_nb``: the bound from the
    earliest end so far, as ``_bound_nb``), then the block's live classes within that bound
    appended to ``cand``; returns the updated ``(n, t_min, t_max, nan, bound)``."""
    if bmin < t_min:
        t_min = bmin
        if np.isfinite(t_min):
            bound = max(np.ceil(t_min + coalesce * max(t_min - youngest, 0.0)), now + 1.0)
        else:
            bound = np.inf
    if bmax > t_max:
        t_max = bmax
    nan = nan | bnan
    for c in range(b0, b1):
        if alive[c] and pred[c] <= bound:
            cand[n] = c
            n += 1
    return n, t_min, t_max, nan, bound


@jit(cache=True, nogil=True, error_model="numpy")
def _step_given(alive, rem, rate_old, dt, span, now, rate, pred, coalesce, youngest):  # pragma: no cover
    """:func:`step` with the new rates given (``has_levels`` False), bit for bit, branch-free
    (compiled; NEONIC_NO_NUMBA: Python): block by block, every class's bytes left and
    prediction are computed and a dead class's discarded by a select (its bytes kept, its
    prediction inf), then the block's candidates against the bound of the earliest end so far;
    the final bound then filters them (as ``_due_nb``). The bound only tightens, so that
    superset holds every class the one-class-at-a-time loop keeps: the same candidates in the
    same order, the same earliest end (NaN ignored) and latest (NaN if any live one is), and the
    loop's ZeroDivisionError for a live class's rate of 0 (after the pass). At a
    million classes, about half of them dead (an AlltoAllv's, throttled), the branchy loop
    mispredicts on every other class; this runs 10-35% faster on the 1024-GPU run's groups."""
    C = alive.shape[0]
    cand = np.empty(C, dtype=np.int64)
    n = 0
    t_min = np.inf
    t_max = -np.inf
    nan = False
    zero = False
    bound = np.inf
    for b0 in range(0, C, _STEP_BLOCK):
        b1 = min(b0 + _STEP_BLOCK, C)
        bmin = np.inf
        bmax = -np.inf
        bnan = False
        for c in range(b0, b1):
            a = alive[c]
            old = rate_old[c]
            new = rate[c]
            z = a & (new == 0.0)
            zero = zero | z
            r0 = rem[c]
            r = r0
            if dt != 0:  # _left_nb, its credit a select
                r = r - old * dt
                r = r if r > 0.0 else 0.0
            r = _rise_credit_sel(r, old, new, span)
            r = r if a else r0
            rem[c] = r
            p = now + r / (new if a and not z else 1.0)  # (a dead class's rate is 0: never divided by)
            p = p if a else np.inf
            pred[c] = p
            bmin = p if p < bmin else bmin
            bmax = p if (p > bmax and a) else bmax
            bnan = bnan | (p != p)
        n, t_min, t_max, nan, bound = _block_ends(b0, b1, bmin, bmax, bnan, alive, pred, cand, n, t_min, t_max, nan,
                                                  bound, now, coalesce, youngest)
    if zero:  # (the loop's division by a live class's rate of 0 raises: so does this)
        raise ZeroDivisionError("division by zero")
    if nan:  # _note_nb: a NaN prediction is the latest end
        t_max = np.nan
    j = 0  # _due_nb: the candidates within the final bound
    for i in range(n):
        if pred[cand[i]] <= bound:
            cand[j] = cand[i]
            j += 1
    return t_min, t_max, cand[:j].copy()


if HAVE_NUMBA:

    @njit(cache=True, nogil=True)
    def _retire_nb(cand, pred, alive, rem, rate, mult, now):  # pragma: no cover
        out = np.empty(cand.shape[0], dtype=np.int64)
        n = 0
        sr = 0.0
        srt = 0.0
        for i in range(cand.shape[0]):
            c = cand[i]
            if alive[c] and pred[c] <= now:
                out[n] = c
                n += 1
                sr += rate[c] * mult[c]
                srt += rate[c] * pred[c] * mult[c]
                alive[c] = False
                rem[c] = 0.0
                rate[c] = 0.0
        return out[:n], sr, srt

    @njit(cache=True, nogil=True)
    def _bound_nb(t, now, coalesce, youngest):  # pragma: no cover
        if not np.isfinite(t):
            return np.inf  # no end known yet: everything is a candidate
        return max(np.ceil(t + coalesce * max(t - youngest, 0.0)), now + 1.0)

    @njit(cache=True, nogil=True, inline="always")
    def _left_nb(r, old, new, dt, span):  # pragma: no cover
        """A flow's bytes left: ``r`` less ``dt`` at its old rate, less what a rate rise to
        ``new`` over the last ``span`` already carried (never below 0)."""
        if dt != 0:
            r = r - old * dt
            r = r if r > 0.0 else 0.0
        if span > 0.0:
            d = new - old
            if d > 0.0:
                r = r - d * span
                r = r if r > 0.0 else 0.0
        return r

    @njit(cache=True, nogil=True, inline="always")
    def _note_nb(p, c, t_min, t_max, bound, cand, n, now, coalesce, youngest):  # pragma: no cover
        """Take flow ``c``'s predicted end ``p`` into the step's earliest and latest ends (a NaN
        counts as latest) and, if it falls within the coalescing bound, among the candidates;
        returns the updated ``(t_min, t_max, bound, n)``."""
        if p < t_min:
            t_min = p
            bound = _bound_nb(t_min, now, coalesce, youngest)
        if p > t_max or p != p:
            t_max = p
        if p <= bound:
            cand[n] = c
            n += 1
        return t_min, t_max, bound, n

    @njit(cache=True, nogil=True)
    def _due_nb(cand, n, pred, t_min, now, coalesce, youngest):  # pragma: no cover
        """The first ``n`` candidates whose prediction is within the final bound (the bound
        tightens as earlier predictions are found, so early candidates may fall out of it)."""
        bound = _bound_nb(t_min, now, coalesce, youngest)
        j = 0
        for i in range(n):
            if pred[cand[i]] <= bound:
                cand[j] = cand[i]
                j += 1
        return cand[:j].copy()

    @njit(cache=True, nogil=True)
    def _step_nb(alive, rem, rate_old, dt, span, now, rate, pred, coalesce, youngest, has_levels, links, level,
                 order):  # pragma: no cover
        C = alive.shape[0]
        if not has_levels and C >= STEP_GIVEN_MIN:
            return _step_given(alive, rem, rate_old, dt, span, now, rate, pred, coalesce, youngest)
        cand = np.empty(C, dtype=np.int64)
        n = 0
        t_min = np.inf
        t_max = -np.inf
        bound = np.inf
        for c in range(C):
            if not alive[c]:
                pred[c] = np.inf
                if has_levels:
                    rate[c] = 0.0
                continue
            if has_levels:  # the rate: the level of the first of its links to saturate
                rate[c] = first_saturated_level(links, c, order, level)
            r = _left_nb(rem[c], rate_old[c], rate[c], dt, span)
            rem[c] = r
            p = now + r / rate[c]
            pred[c] = p
            t_min, t_max, bound, n = _note_nb(p, c, t_min, t_max, bound, cand, n, now, coalesce, youngest)
        return t_min, t_max, _due_nb(cand, n, pred, t_min, now, coalesce, youngest)

    retire, step = _retire_nb, _step_nb
else:  # pragma: no cover
    retire, step = _retire_np, _step_np


def step_one(alive, rem, rate_old, dt, span, now, rate, pred, coalesce, youngest):
    """:func:`step` for a group of one class, without link levels, in plain Python: the same
    operations in the same order as the compiled loop (IEEE doubles either way), so the same
    bits. A lone message's group (a rank's copy) costs a compiled call's overhead per solve,
    more than its work, and a solve at 1024 GPUs can carry a thousand of them."""
    if not alive[0]:
        pred[0] = math.inf
        return math.inf, -math.inf, _NONE
    old = float(rate_old[0])
    new = float(rate[0])
    r = float(rem[0])
    if dt != 0:  # _left_nb
        r = r - old * dt
        r = r if r > 0.0 else 0.0
    if span > 0.0:
        d = new - old
        if d > 0.0:
            r = r - d * span
            r = r if r > 0.0 else 0.0
    rem[0] = r
    p = now + r / new
    pred[0] = p
    t_min, t_max = math.inf, -math.inf  # _note_nb from the loop's start values, then _due_nb
    if p < t_min:
        t_min = p
    if p > t_max or p != p:
        t_max = p
    if not math.isfinite(t_min):  # _bound_nb in plain Python (a float, as there)
        bound = math.inf
    else:
        age = t_min - youngest
        bound = float(math.ceil(t_min + coalesce * (age if age > 0.0 else 0.0)))
        if bound < now + 1.0:
            bound = now + 1.0
    return t_min, t_max, _FIRST if p <= bound else _NONE


# step_one's candidate arrays, shared: a group's candidates are only read, then replaced (left
# writeable so that the compiled retire sees the array type it always has)
_NONE = np.empty(0, dtype=np.int64)
_FIRST = np.zeros(1, dtype=np.int64)


# ------------------------------------------------------------ link-disjoint components
def _components_np(links_fh, finite):
    """Per flow, the id of its connected component of the flow-link graph over ``finite``
    links (flows sharing a finite link, transitively); ids dense in order of first flow. A flow
    on no finite link is a component of its own."""
    F, H = links_fh.shape
    parent = list(range(finite.shape[0]))

    def root(k):
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for f in range(F):
        first = -1
        for h in range(H):
            k = int(links_fh[f, h])
            if not finite[k]:
                continue
            r = root(k)
            if first < 0:
                first = r
            elif r != first:
                parent[r] = first
    out = np.empty(F, dtype=np.int64)
    ids: dict[int, int] = {}
    for f in range(F):
        key = -1 - f
        for h in range(H):
            k = int(links_fh[f, h])
            if finite[k]:
                key = root(k)
                break
        out[f] = ids.setdefault(key, len(ids))
    return out


def _drain_np(alive, rem, rate, dts, lo, hi):
    """For the live classes ``lo:hi``: ``rem -= rate * dt`` (clamped at 0) for each window
    ``dt`` of ``dts`` in turn (the drains :func:`step` would have made window by window)."""
    for c in range(lo, hi):
        if alive[c]:
            r = rem[c]
            for dt in dts:
                if dt != 0:
                    r = r - rate[c] * dt
                    r = r if r > 0.0 else 0.0
            rem[c] = r


def _step_range_np(alive, rem, rate, dts, span, now, pred, coalesce, youngest, links, level, order, lo, hi):
    """:func:`step` with link levels for the classes ``lo:hi`` only, the rates updated in place
    (each class's old rate read before its new one is written); candidates as global indices.
    ``dts``: the windows since the classes were last brought up to date, drained at the old
    rates one after the other (:func:`drain`), the last one in the step itself."""
    from .maxmin import rates_from_levels

    sl = slice(lo, hi)
    if dts.size > 1:
        _drain_np(alive, rem, rate, dts[:-1], lo, hi)
    dt = float(dts[-1]) if dts.size else 0.0
    old = rate[sl].copy()
    new = rates_from_levels(links[sl], alive[sl], level, order)
    t_min, t_max, cand = _step_np(alive[sl], rem[sl], old, dt, span, now, new, pred[sl], coalesce, youngest, False,
                                  links[sl], level, order)
    rate[sl] = new
    return t_min, t_max, cand + lo


if HAVE_NUMBA:

    @njit(cache=True, nogil=True)
    def _root_nb(parent, k):  # pragma: no cover
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    @njit(cache=True, nogil=True)
    def _components_nb(links_fh, finite):  # pragma: no cover
        F, H = links_fh.shape
        parent = np.arange(finite.shape[0])
        for f in range(F):
            first = -1
            for h in range(H):
                k = links_fh[f, h]
                if not finite[k]:
                    continue
                r = _root_nb(parent, k)
                if first < 0:
                    first = r
                elif r != first:
                    parent[r] = first
        out = np.empty(F, dtype=np.int64)
        rid = np.full(finite.shape[0], -1, dtype=np.int64)  # dense id of each root
        n = 0
        for f in range(F):
            r = -1
            for h in range(H):
                k = links_fh[f, h]
                if finite[k]:
                    r = _root_nb(parent, k)
                    break
            if r < 0:
                out[f] = n
                n += 1
            else:
                if rid[r] < 0:
                    rid[r] = n
                    n += 1
                out[f] = rid[r]
        return out

    @njit(cache=True, nogil=True)
    def _drain_nb(alive, rem, rate, dts, lo, hi):  # pragma: no cover
        for c in range(lo, hi):
            if alive[c]:
                r = rem[c]
                x = rate[c]
                for i in range(dts.shape[0]):
                    dt = dts[i]
                    if dt != 0:
                        r = r - x * dt
                        r = r if r > 0.0 else 0.0
                rem[c] = r

    @njit(cache=True, nogil=True, error_model="numpy")
    def _step_range_nb(alive, rem, rate, dts, span, now, pred, coalesce, youngest, links, level, order, lo,
                       hi):  # pragma: no cover
        # Block by block: first every flow's rate, bytes left (drained window by window over
        # ``dts``, as _drain_nb then _left_nb would, in one pass) and prediction, branch-free (a
        # finished flow's values are computed and discarded by a select), then the block's
        # candidates against the bound of the earliest end so far. The per-flow arithmetic is
        # _left_nb's and first_saturated_level's; the candidates are those of _step_nb (a
        # superset filtered by _due_nb's final bound), so the results are the same bits. At a
        # million flows this runs about a third faster than one branchy loop.
        cand = np.empty(hi - lo, dtype=np.int64)
        n = 0
        t_min = np.inf
        t_max = -np.inf
        nan = False
        bound = np.inf
        H = links.shape[1]
        big = np.iinfo(np.int64).max
        for b0 in range(lo, hi, _STEP_BLOCK):
            b1 = min(b0 + _STEP_BLOCK, hi)
            bmin = np.inf
            bmax = -np.inf
            bnan = False
            for c in range(b0, b1):
                a = alive[c]
                old = rate[c]
                if H == 2:  # first_saturated_level over two links, as selects
                    k0 = links[c, 0]
                    k1 = links[c, 1]
                    o0 = order[k0]
                    new = level[k0] if o0 < big else np.inf
                    new = level[k1] if order[k1] < o0 else new
                else:
                    new = first_saturated_level(links, c, order, level)
                new = new if a else 0.0
                rate[c] = new
                r0 = rem[c]
                r = r0
                for w in range(dts.shape[0]):  # _drain_nb's windows, then _left_nb (its credit a select)
                    dt = dts[w]
                    if dt != 0:
                        r = r - old * dt
                        r = r if r > 0.0 else 0.0
                r = _rise_credit_sel(r, old, new, span)
                r = r if a else r0
                rem[c] = r
                p = now + r / new
                p = p if a else np.inf
                pred[c] = p
                bmin = p if p < bmin else bmin
                bmax = p if (p > bmax and a) else bmax
                bnan = bnan | (p != p)
            n, t_min, t_max, nan, bound = _block_ends(b0, b1, bmin, bmax, bnan, alive, pred, cand, n, t_min, t_max,
                                                      nan, bound, now, coalesce, youngest)
        if nan:  # _note_nb: a NaN prediction is the latest end
            t_max = np.nan
        return t_min, t_max, _due_nb(cand, n, pred, t_min, now, coalesce, youngest)

    @njit(cache=True, nogil=True)
    def _step_parts_nb(alive, rem, rate, recomputes, t_ref, t, running, span, now, pred, coalesce, youngest, links,
                       level, order, los, his):  # pragma: no cover
        """:func:`step_range` for several parts in one call (a lone group's small link-disjoint
        parts: a call each cost more than their work): part ``i`` is flows ``los[i]:his[i]``,
        stepped with the windows ``Network._predict_parts`` gives it -- while ``running``, the
        lengths between consecutive ``recomputes`` (int ps, ascending) from its ``t_ref[i]`` to
        ``t``, then ``now - max(t, t_ref[i])``, at ``span``; else one zero window and no credit
        -- so each part gets the same bits as in a call of its own. Returns per part its earliest
        and latest predicted end, and its candidates concatenated with their counts per part."""
        n = los.shape[0]
        tmin = np.empty(n)
        tmax = np.empty(n)
        counts = np.zeros(n, dtype=np.int64)
        total = 0
        for i in range(n):
            total += his[i] - los[i]
        buf = np.empty(total, dtype=np.int64)
        pos = 0
        fnow = float(now)
        for i in range(n):
            if running:
                tr = t_ref[i]
                last = float(now - max(t, tr))
                if t > tr:  # Network._windows(tr, t): bisect_left of both, then the differences
                    a = np.searchsorted(recomputes, tr)
                    b = np.searchsorted(recomputes, t)
                    dts = np.empty(b - a + 1)
                    for k in range(b - a):
                        dts[k] = float(recomputes[a + k + 1]) - float(recomputes[a + k])
                    dts[b - a] = last
                else:
                    dts = np.full(1, last)
                sp = span
            else:
                dts = np.zeros(1)
                sp = 0.0
            r = _step_range_nb(alive, rem, rate, dts, sp, fnow, pred, coalesce, youngest, links, level, order,
                               los[i], his[i])
            tmin[i] = r[0]
            tmax[i] = r[1]
            c = r[2]
            buf[pos:pos + c.shape[0]] = c
            counts[i] = c.shape[0]
            pos += c.shape[0]
        return tmin, tmax, buf[:pos], counts

    components, drain, step_range, step_parts = _components_nb, _drain_nb, _step_range_nb, _step_parts_nb
else:  # pragma: no cover
    components, drain, step_range, step_parts = _components_np, _drain_np, _step_range_np, None


# ------------------------------------------------------- a dense part's rows drained lazily
# A dense part (an AlltoAllv's NIC flows, one NIC per GPU) whose flows are stored row by row
# (each source NIC's flows contiguous) steps a row *lazily* while every live flow of it is
# limited by the row's own link (that link saturates before every column link the row's flows
# cross): those flows share one rate, so the row keeps one sum ``D`` of the bytes each of them
# has drained since it went lazy (its windows at the old rate, then the credit), and each flow
# its bytes left at that moment (``key``); a flow's bytes left are ``max(key - D, 0)``. Its flows
# are kept sorted by ``key``, so the row's earliest and latest predicted ends are those of its
# first and last live flow, and its candidates a prefix. A step then costs the row O(1) plus
# its candidates, not O(flows). The sum ``D`` rounds differently from draining each flow window
# by window: the bytes left agree to the last bits, not bit for bit (module doc of network).


@jit(cache=True, nogil=True)
def lazy_bound(t, now, coalesce, youngest):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """The candidates' bound for an earliest end ``t`` (``_bound_nb``'s formula)."""
    if not np.isfinite(t):
        return np.inf
    return max(np.ceil(t + coalesce * max(t - youngest, 0.0)), now + 1.0)


@jit(cache=True, nogil=True)
def _write_back(r, alive, rem, rate, rhi, on, D, L, head, perm, key, lo):  # pragma: no cover
    """Lazy row ``r``'s live flows get their bytes left (``max(key - D, 0)``: as of the part's
    last step) and their rate ``L`` in the group's arrays; the row is no longer lazy."""
    d = D[r]
    x = L[r]
    for k in range(head[r], rhi[r] - lo):
        f = perm[k]
        if alive[f]:
            v = key[f - lo] - d
            rem[f] = v if v > 0.0 else 0.0
            rate[f] = x
    on[r] = False


@jit(cache=True, nogil=True)
def lazy_materialize(alive, rem, rate, rlo, rhi, on, D, L, head, perm, key, lo):  # pragma: no cover
    """Every lazy row's live flows get their bytes left (``max(key - D, 0)``: as of the part's
    last step) and their rate in the group's arrays; the rows are no longer lazy."""
    for r in range(rlo.shape[0]):
        if on[r]:
            _write_back(r, alive, rem, rate, rhi, on, D, L, head, perm, key, lo)


@jit(cache=True, nogil=True)
def lazy_begin(alive, rem, rate, dts, span, now, level, order, A, W, colsort, ocs, rlo, rhi, on, D, L, head, perm,
               key, lo, mode):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """First pass of a lazy dense part's step (after its levels are solved): per row, whether its
    live flows are all limited by its own link now (``mode`` 3 or 1: a finite positive level,
    and no live flow in a column whose link saturated first: ``colsort`` orders the columns by
    their links' saturation order ``ocs``), else ``mode`` 2 (stepped flow by flow; 0: no flows).
    A lazy row that still is steps lazily (``mode`` 1: ``D`` takes its windows at the old rate
    ``L`` and the credit, ``L`` the new level) and gives its first and last live flow's
    predicted ends; a lazy row that no longer is is written back to the flows' arrays first.
    Returns the earliest and latest predicted ends of the lazily stepped rows."""
    big = np.iinfo(np.int64).max
    t_min = np.inf
    t_max = -np.inf
    nB = colsort.shape[0]
    for r in range(rlo.shape[0]):
        if rlo[r] == rhi[r]:
            mode[r] = 0
            continue
        a = A[r]
        o = order[a]
        lv = level[a]
        pure = o < big and lv > 0.0 and lv < np.inf
        if pure:
            for s in range(nB):
                if ocs[s] >= o:
                    break
                if W[r, colsort[s]] > 0.0:
                    pure = False
                    break
        if not (on[r] and pure):
            mode[r] = 3 if pure else 2
            if on[r]:  # back to per flow: its flows' bytes left and (old) rate
                _write_back(r, alive, rem, rate, rhi, on, D, L, head, perm, key, lo)
            continue
        mode[r] = 1
        old = L[r]
        d = D[r]
        for w in range(dts.shape[0]):  # the windows at the old rate, as each flow's drain
            dt = dts[w]
            if dt != 0:
                d = d + old * dt
        if span > 0.0:  # the credit of a rate rise
            dd = lv - old
            if dd > 0.0:
                d = d + dd * span
        D[r] = d
        L[r] = lv
        k = head[r]
        e = rhi[r] - lo
        while k < e and not alive[perm[k]]:
            k += 1
        head[r] = k
        if k < e:
            v = key[perm[k] - lo] - d
            p = now + (v if v > 0.0 else 0.0) / lv
            t_min = p if p < t_min else t_min
            m = e - 1
            while not alive[perm[m]]:
                m -= 1
            v = key[perm[m] - lo] - d
            p = now + (v if v > 0.0 else 0.0) / lv
            t_max = p if p > t_max else t_max
    return t_min, t_max


@jit(cache=True, nogil=True)
def stable_argsort(vals):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """``np.argsort(vals, kind="mergesort")`` (stable: equal values keep their order) of a
    float64 array. Where every value is a non-negative number (no NaN, no -0.0: bytes left), an
    LSD radix sort of their bit patterns, eight bits a pass, skipping passes whose byte is the
    same for all: for such values the bit order is the numeric order and equal values have equal
    bits, and a radix sort is stable, so the permutation is the mergesort's. About four times
    faster on a lazy row's ~1,000 flows (``lazy_end``: 3,300 rows per 1024-GPU AlltoAllv);
    other values go to the mergesort itself."""
    n = vals.shape[0]
    keys = np.ascontiguousarray(vals).view(np.uint64)
    hist = np.zeros((8, 256), dtype=np.int64)
    for i in range(n):
        if not vals[i] >= 0.0 or keys[i] >> np.uint64(63):  # negative, NaN or -0.0
            return np.argsort(vals, kind="mergesort")
        k = keys[i]
        for d in range(8):
            hist[d, (k >> np.uint64(8 * d)) & np.uint64(255)] += 1
    idx = np.arange(n)
    if n < 2:
        return idx
    tmp = np.empty(n, dtype=np.int64)
    off = np.empty(256, dtype=np.int64)
    for d in range(8):
        sh = np.uint64(8 * d)
        h = hist[d]
        if h[(keys[0] >> sh) & np.uint64(255)] == n:  # the same byte in every value: order kept
            continue
        s = 0
        for b in range(256):
            off[b] = s
            s += h[b]
        for i in range(n):
            j = idx[i]
            b = (keys[j] >> sh) & np.uint64(255)
            tmp[off[b]] = j
            off[b] += 1
        idx, tmp = tmp, idx
    return idx


@jit(cache=True, nogil=True)
def lazy_end(alive, rem, rate, pred, now, bound, mode, level, A, rlo, rhi, on, D, L, head, perm, key, lo,
             make_lazy):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """Last pass of a lazy dense part's step, after its per-flow rows were stepped and the
    candidates' ``bound`` is known: a row stepped flow by flow whose flows are all limited by
    its link (``mode`` 3) goes lazy (with ``make_lazy``): its live flows sorted by bytes left,
    which become their keys, ``D`` 0 and ``L`` their common rate; a lazily stepped row (``mode``
    1) writes its flows' bytes left, rate and predicted end from its first live flow on while
    the prediction is within ``bound``, and those flows are its candidates (returned)."""
    cand = np.empty(perm.shape[0], dtype=np.int64)
    n = 0
    for r in range(rlo.shape[0]):
        md = mode[r]
        if md == 3 and make_lazy:
            s = rlo[r] - lo
            e = rhi[r] - lo
            nd = 0
            for f in range(rlo[r], rhi[r]):  # finished flows first, then the live ones by key
                if not alive[f]:
                    perm[s + nd] = f
                    nd += 1
            ids = np.empty(e - s - nd, dtype=np.int64)
            vals = np.empty(e - s - nd)
            j = 0
            for f in range(rlo[r], rhi[r]):
                if alive[f]:
                    ids[j] = f
                    vals[j] = rem[f]
                    key[f - lo] = rem[f]
                    j += 1
            srt = stable_argsort(vals)
            for j in range(srt.shape[0]):
                perm[s + nd + j] = ids[srt[j]]
            head[r] = s + nd
            D[r] = 0.0
            L[r] = level[A[r]]
            on[r] = True
        elif md == 1:
            d = D[r]
            x = L[r]
            for k in range(head[r], rhi[r] - lo):
                f = perm[k]
                if not alive[f]:
                    continue
                v = key[f - lo] - d
                v = v if v > 0.0 else 0.0
                p = now + v / x
                if p > bound:
                    break
                rem[f] = v
                rate[f] = x
                pred[f] = p
                cand[n] = f
                n += 1
    return cand[:n].copy()


def _step_runs_np(alive, rem, rate, dts, span, now, pred, coalesce, youngest, links, level, order, run_lo, run_hi):
    """:func:`step_range` over the flow ranges ``run_lo[i]:run_hi[i]`` in turn (each with the same
    windows): the earliest and latest ends over all (NaN if any is), and the candidates of all,
    kept where within the bound of the earliest end."""
    t_min, t_max, nan = math.inf, -math.inf, False
    cands = []
    for lo, hi in zip(run_lo.tolist(), run_hi.tolist()):
        a, b, c = step_range(alive, rem, rate, dts, span, now, pred, coalesce, youngest, links, level, order, lo, hi)
        t_min = min(t_min, a)
        if b != b:
            nan = True
        elif b > t_max:
            t_max = b
        cands.append(c)
    cand = np.concatenate(cands) if cands else np.empty(0, dtype=np.int64)
    bound = lazy_bound(t_min, now, coalesce, youngest)
    return t_min, (math.nan if nan else t_max), cand[pred[cand] <= bound]


if HAVE_NUMBA:

    @njit(cache=True, nogil=True)
    def _step_runs_nb(alive, rem, rate, dts, span, now, pred, coalesce, youngest, links, level, order, run_lo,
                      run_hi):  # pragma: no cover
        total = 0
        for i in range(run_lo.shape[0]):
            total += run_hi[i] - run_lo[i]
        buf = np.empty(total, dtype=np.int64)
        pos = 0
        t_min = np.inf
        t_max = -np.inf
        nan = False
        for i in range(run_lo.shape[0]):
            r = _step_range_nb(alive, rem, rate, dts, span, now, pred, coalesce, youngest, links, level, order,
                               run_lo[i], run_hi[i])
            if r[0] < t_min:
                t_min = r[0]
            if r[1] != r[1]:
                nan = True
            elif r[1] > t_max:
                t_max = r[1]
            c = r[2]
            buf[pos:pos + c.shape[0]] = c
            pos += c.shape[0]
        if nan:
            t_max = np.nan
        return t_min, t_max, _due_nb(buf, pos, pred, t_min, now, coalesce, youngest)

    step_runs = _step_runs_nb
else:  # pragma: no cover
    step_runs = _step_runs_np


@jit(cache=True, nogil=True)
def _finite_ends(links, f, finite, a, b, i):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """Flow ``f``'s count of finite links; its first and last of them written to ``a[i]`` and
    ``b[i]`` (left as they were where it has none)."""
    n = 0
    for h in range(links.shape[1]):
        k = links[f, h]
        if finite[k]:
            if n == 0:
                a[i] = k
            b[i] = k
            n += 1
    return n


@jit(cache=True, nogil=True)
def two_finite(links, finite, n_links):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """Per flow (row of ``links``) its first and its last link of finite capacity, and which
    links are some flow's first (``in_a``) and some flow's last (``in_b``); ``ok`` False (the
    rest unset) where a flow crosses other than exactly two finite links. One pass, where the
    numpy form takes a dozen over a million-flow part (``Network._bipartite``)."""
    F = links.shape[0]
    a = np.empty(F, dtype=links.dtype)
    b = np.empty(F, dtype=links.dtype)
    in_a = np.zeros(n_links, dtype=np.bool_)
    in_b = np.zeros(n_links, dtype=np.bool_)
    for f in range(F):
        n = _finite_ends(links, f, finite, a, b, f)
        if n != 2:
            return False, a, b, in_a, in_b
        in_a[a[f]] = True
        in_b[b[f]] = True
    return True, a, b, in_a, in_b


@jit(cache=True, nogil=True)
def dense_cells(a, b, slot, live, factorf, framed, W):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """Each flow's cell ``(slot[a], slot[b])`` in a dense matrix (int32), whether the flows are
    in strictly increasing (row, column) order, and, when they are (one flow per cell), ``W``
    (rows x columns, zeros) holding each live flow's weight: its factor where ``framed``, else
    1 (``Network._bipartite``)."""
    F = a.shape[0]
    ia = np.empty(F, dtype=np.int32)
    jb = np.empty(F, dtype=np.int32)
    inc = True
    for f in range(F):
        i = slot[a[f]]
        j = slot[b[f]]
        ia[f] = i
        jb[f] = j
        if f and not (i > ia[f - 1] or (i == ia[f - 1] and j > jb[f - 1])):
            inc = False
    if inc:
        for f in range(F):
            if live[f]:
                W[ia[f], jb[f]] = factorf[f] if framed else 1.0
    return ia, jb, inc


@jit(cache=True, nogil=True)
def part_two_finite(links, cflow, part, n_part, finite, n_links, factorf, alive):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """:func:`two_finite` of the flows of component ``part`` (``cflow[f] == part``, ``n_part``
    of them), in flow order, without gathering their rows first; also their factors and live
    flags and their indices (``Network._shared_dense``: 16.8M flows at 4096 GPUs)."""
    F = links.shape[0]
    a = np.empty(n_part, dtype=links.dtype)
    b = np.empty(n_part, dtype=links.dtype)
    fac = np.empty(n_part, dtype=factorf.dtype)
    live = np.empty(n_part, dtype=np.bool_)
    idx = np.empty(n_part, dtype=np.int64)
    in_a = np.zeros(n_links, dtype=np.bool_)
    in_b = np.zeros(n_links, dtype=np.bool_)
    i = 0
    for f in range(F):
        if cflow[f] != part:
            continue
        n = _finite_ends(links, f, finite, a, b, i)
        if n != 2:
            return False, a, b, in_a, in_b, fac, live, idx
        in_a[a[i]] = True
        in_b[b[i]] = True
        fac[i] = factorf[f]
        live[i] = alive[f]
        idx[i] = f
        i += 1
    return True, a, b, in_a, in_b, fac, live, idx


@jit(cache=True, nogil=True)
def rest_in_span(links, cflow, part, inspan):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """Whether a flow outside component ``part`` crosses a link of ``inspan``."""
    F, H = links.shape
    for f in range(F):
        if cflow[f] != part:
            for h in range(H):
                if inspan[links[f, h]]:
                    return True
    return False


@jit(cache=True, nogil=True)
def cells_of(F, idx, ia, jb):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """(F, 2) int32 cells: ``(ia[i], jb[i])`` for flow ``idx[i]``, -1 for the other flows."""
    cell = np.full((F, 2), -1, dtype=np.int32)
    for i in range(idx.shape[0]):
        cell[idx[i], 0] = ia[i]
        cell[idx[i], 1] = jb[i]
    return cell


@jit(cache=True, nogil=True)
def transposed(W):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """``np.ascontiguousarray(W.transpose(0, 2, 1))`` of a (1, n, m) matrix, copied in 64 x 64
    tiles (a 4096 x 4096 matrix: numpy's element-wise copy misses the cache at every store)."""
    S, n, m = W.shape
    out = np.empty((S, m, n), dtype=W.dtype)
    for s in range(S):
        for i0 in range(0, n, 64):
            i1 = min(i0 + 64, n)
            for j0 in range(0, m, 64):
                j1 = min(j0 + 64, m)
                for j in range(j0, j1):
                    for i in range(i0, i1):
                        out[s, j, i] = W[s, i, j]
    return out


@jit(cache=True, nogil=True)
def disjoint_shares(lt, wt, capacity, alive, tol):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """``Network._disjoint_rates``'s per-solve pass in one call, bit for bit its numpy form:
    each flow's least share ``capacity[lt[h, f]] / wt[h, f]`` over its hops ``h`` (a NaN share
    wins, as in ``min``), and whether two distinct neighbours among the live flows' sorted
    shares lie within ``tol`` (relative) of each other. Returns ``(tie, rates)``: the least
    shares of the live flows, 0 for the others. Several numpy calls over a thousand flows,
    5,776 times in a 1024-GPU run's two iterations (the ring steps), cost more in overhead
    than their work.

    The distinct neighbours of the sorted shares are those of the sorted distinct shares (equal
    neighbours never tie; a NaN, sorted last, compares false), and a ring step's thousand shares
    take a handful of values: up to ``_DISTINCT`` distinct values are collected and sorted
    alone; more, and every share is sorted."""
    H, F = lt.shape
    out = np.zeros(F)
    s = np.empty(F)
    u = np.empty(_DISTINCT)
    nu = 0
    last = 0
    n = 0
    for f in range(F):
        m = capacity[lt[0, f]] / wt[0, f]
        for h in range(1, H):
            v = capacity[lt[h, f]] / wt[h, f]
            if v < m or v != v:
                if m == m:
                    m = v
        if alive[f]:
            out[f] = m
            s[n] = m
            n += 1
            if m == m and nu <= _DISTINCT and not (nu and u[last] == m):
                k = 0
                while k < nu and u[k] != m:
                    k += 1
                if k < nu:
                    last = k
                elif nu < _DISTINCT:
                    u[nu] = m
                    last = nu
                    nu += 1
                else:
                    nu = _DISTINCT + 1  # too many: sort them all
    if nu > _DISTINCT:
        v = np.sort(s[:n])
    else:
        v = np.sort(u[:nu])
    up = 1.0 + tol
    for i in range(v.size - 1):
        lo = v[i]
        hi = v[i + 1]
        if hi > lo and hi <= lo * up:
            return True, out
    return False, out


#: distinct shares :func:`disjoint_shares` sorts alone (a ring step's take four or five)
_DISTINCT = 32
