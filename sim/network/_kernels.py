"""Per-flow bookkeeping of :class:`sim.network.network.Network`, compiled when numba is present.

Each function has a numpy twin with identical results; the compiled form avoids a dozen O(F)
temporary arrays per recompute, which dominate at a million flows.
"""

from __future__ import annotations

import math

import numpy as np

from .maxmin import HAVE_NUMBA

__all__ = ["advance", "predict", "mark", "void", "credit", "account", "advance_cls", "mark_cls", "void_cls",
           "finish_cls"]


def _advance_np(pred, alive, rem, rate, now, dt, links_fh, acct_fh, factor, wire, nbytes, link_bytes, link_wire):
    done = alive & (pred <= now)
    n = int(done.sum())
    sr = float(rate[done].sum()) if n else 0.0
    srt = float((rate[done] * pred[done]).sum()) if n else 0.0
    if n:
        L = link_bytes.size
        lk = np.concatenate([links_fh[done], acct_fh[done]], axis=1)
        nb = nbytes[done]
        fac = factor[done]
        for h in range(lk.shape[1]):
            row = lk[:, h]
            link_bytes += np.bincount(row, nb, minlength=L + 1)[:L]
            link_wire += np.bincount(row, np.where(wire[row], fac, 1.0) * nb, minlength=L + 1)[:L]
        alive[done] = False
        rem[done] = 0.0
        rate[done] = 0.0
    if dt:
        rem[alive] -= rate[alive] * dt
        np.maximum(rem, 0.0, out=rem)
    return n, sr, srt


def _credit_np(alive, rem, rate_new, rate_old, span):
    gain = np.maximum(rate_new - rate_old, 0.0) * span
    rem[alive] = np.maximum(rem[alive] - gain[alive], 0.0)


def _predict_np(alive, rem, rate, now, pred, rate_old, span):
    if span > 0.0:
        _credit_np(alive, rem, rate, rate_old, span)
    with np.errstate(divide="ignore", invalid="ignore"):
        pred[:] = np.where(alive, now + rem / np.where(alive, rate, 1.0), np.inf)
    if not alive.any():
        return math.inf, -math.inf
    return float(pred.min()), float(pred[alive].max())


def _mark_np(alive, pred, horizon, lat, orig, finish_ps):
    fin = alive & (pred <= horizon)
    if fin.any():
        finish_ps[orig[fin]] = np.ceil(np.minimum(pred[fin], horizon)).astype(np.int64) + lat[fin]
    return int(fin.sum())


def _void_np(alive, orig, finish_ps):
    finish_ps[orig[alive]] = -1


if HAVE_NUMBA:
    from numba import njit

    @njit(cache=True, nogil=True)
    def _advance_nb(pred, alive, rem, rate, now, dt, links_fh, acct_fh, factor, wire, nbytes, link_bytes, link_wire):  # pragma: no cover
        F, H = links_fh.shape
        A = acct_fh.shape[1]
        L = link_bytes.shape[0]
        n = 0
        sr = 0.0
        srt = 0.0
        for f in range(F):
            if not alive[f]:
                continue
            if pred[f] <= now:
                n += 1
                sr += rate[f]
                srt += rate[f] * pred[f]
                nb = nbytes[f]
                for h in range(H):
                    k = links_fh[f, h]
                    if k < L:
                        link_bytes[k] += nb
                        link_wire[k] += nb * factor[f] if wire[k] else nb
                for h in range(A):
                    k = acct_fh[f, h]
                    if k < L:
                        link_bytes[k] += nb
                        link_wire[k] += nb * factor[f] if wire[k] else nb
                alive[f] = False
                rem[f] = 0.0
                rate[f] = 0.0
            elif dt != 0:
                r = rem[f] - rate[f] * dt
                rem[f] = r if r > 0.0 else 0.0
        return n, sr, srt

    @njit(cache=True, nogil=True)
    def _credit_nb(alive, rem, rate_new, rate_old, span):  # pragma: no cover
        for f in range(alive.shape[0]):
            if alive[f]:
                d = rate_new[f] - rate_old[f]
                if d > 0.0:
                    r = rem[f] - d * span
                    rem[f] = r if r > 0.0 else 0.0

    @njit(cache=True, nogil=True)
    def _predict_nb(alive, rem, rate, now, pred, rate_old, span):  # pragma: no cover
        """Credit (see Network) when ``span`` > 0, then predicted ends; returns the earliest and
        the latest."""
        t_min = np.inf
        t_max = -np.inf
        for f in range(alive.shape[0]):
            if alive[f]:
                if span > 0.0:
                    d = rate[f] - rate_old[f]
                    if d > 0.0:
                        r = rem[f] - d * span
                        rem[f] = r if r > 0.0 else 0.0
                p = now + rem[f] / rate[f]
                pred[f] = p
                if p < t_min:
                    t_min = p
                if p > t_max or p != p:  # NaN (0 / 0) stays: such a flow never counts as ending
                    t_max = p
            else:
                pred[f] = np.inf
        return t_min, t_max

    @njit(cache=True, nogil=True)
    def _mark_nb(alive, pred, horizon, lat, orig, finish_ps):  # pragma: no cover
        n = 0
        for f in range(alive.shape[0]):
            if alive[f] and pred[f] <= horizon:
                p = pred[f] if pred[f] < horizon else horizon
                finish_ps[orig[f]] = np.int64(np.ceil(p)) + lat[f]
                n += 1
        return n

    @njit(cache=True, nogil=True)
    def _void_nb(alive, orig, finish_ps):  # pragma: no cover
        for f in range(alive.shape[0]):
            if alive[f]:
                finish_ps[orig[f]] = -1

    advance, predict, mark, void, credit = _advance_nb, _predict_nb, _mark_nb, _void_nb, _credit_nb
else:  # pragma: no cover
    advance, predict, mark, void, credit = _advance_np, _predict_np, _mark_np, _void_np, _credit_np


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


def _advance_cls_np(pred, alive, rem, rate, mult, now, dt):
    """Class-level :func:`advance` without the byte accounting: returns (done classes, sr, srt)."""
    done = alive & (pred <= now)
    idx = np.flatnonzero(done)
    sr = float((rate[idx] * mult[idx]).sum()) if idx.size else 0.0
    srt = float((rate[idx] * pred[idx] * mult[idx]).sum()) if idx.size else 0.0
    if idx.size:
        alive[idx] = False
        rem[idx] = 0.0
        rate[idx] = 0.0
    if dt:
        rem[alive] -= rate[alive] * dt
        np.maximum(rem, 0.0, out=rem)
    return idx, sr, srt


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


if HAVE_NUMBA:

    @njit(cache=True, nogil=True)
    def _account_nb(done_cls, members, starts, links_fh, acct_fh, factor_f, wire, nbytes_f, link_bytes, link_wire):  # pragma: no cover
        H = links_fh.shape[1]
        A = acct_fh.shape[1]
        L = link_bytes.shape[0]
        for i in range(done_cls.shape[0]):
            c = done_cls[i]
            for e in range(starts[c], starts[c + 1]):
                f = members[e]
                nb = nbytes_f[f]
                for h in range(H):
                    k = links_fh[f, h]
                    if k < L:
                        link_bytes[k] += nb
                        link_wire[k] += nb * factor_f[f] if wire[k] else nb
                for h in range(A):
                    k = acct_fh[f, h]
                    if k < L:
                        link_bytes[k] += nb
                        link_wire[k] += nb * factor_f[f] if wire[k] else nb

    @njit(cache=True, nogil=True)
    def _advance_cls_nb(pred, alive, rem, rate, mult, now, dt):  # pragma: no cover
        C = alive.shape[0]
        out = np.empty(C, dtype=np.int64)
        n = 0
        sr = 0.0
        srt = 0.0
        for c in range(C):
            if not alive[c]:
                continue
            if pred[c] <= now:
                out[n] = c
                n += 1
                sr += rate[c] * mult[c]
                srt += rate[c] * pred[c] * mult[c]
                alive[c] = False
                rem[c] = 0.0
                rate[c] = 0.0
            elif dt != 0:
                r = rem[c] - rate[c] * dt
                rem[c] = r if r > 0.0 else 0.0
        return out[:n], sr, srt

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
        for i in range(done_cls.shape[0]):
            c = done_cls[i]
            t = np.int64(np.ceil(pred[c]))
            for e in range(starts[c], starts[c + 1]):
                f = members[e]
                finish_ps[orig[f]] = t + lat[f]

    @njit(cache=True, nogil=True)
    def _void_cls_nb(alive, members, starts, orig, finish_ps):  # pragma: no cover
        for c in range(alive.shape[0]):
            if alive[c]:
                for e in range(starts[c], starts[c + 1]):
                    finish_ps[orig[members[e]]] = -1

    account, advance_cls, mark_cls, void_cls, finish_cls = (_account_nb, _advance_cls_nb, _mark_cls_nb, _void_cls_nb,
                                                            _finish_cls_nb)
else:  # pragma: no cover
    account, advance_cls, mark_cls, void_cls, finish_cls = (_account_np, _advance_cls_np, _mark_cls_np, _void_cls_np,
                                                            _finish_cls_np)
