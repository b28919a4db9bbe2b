"""Vectorised weighted max-min fair rate allocation (progressive filling).

Problem: flow ``f`` crosses links ``links[f, h]`` (rows padded with a dummy link index whose
capacity is infinite); at payload rate ``r_f`` it loads link ``l`` with ``w[f, h] * r_f`` (``w`` >
1 on links that carry framing overhead). The max-min fair allocation gives every flow a rate such
that each flow crosses at least one saturated link on which no flow has a higher rate.

Algorithm: exact sequential progressive filling, one *level* per round. All unfrozen flows grow
at the same rate; the links with the smallest fair share ``remaining capacity / sum of unfrozen
weights`` saturate first; every unfrozen flow through them is frozen at that share; the other
links they cross lose that capacity and those weights. Rounds = number of distinct rates.

Cost: each round does O(L) work on the link arrays (a few thousand entries) plus work on the
flows it freezes, found through a link -> flow index (CSR) built once per flow set
(:class:`FlowLinkIndex`). Each flow is touched O(H) times per solve, so a solve costs
O(F * H + rounds * L) with small constants; no per-round pass over all flows.
"""

from __future__ import annotations

import numpy as np

__all__ = ["FlowLinkIndex", "FlowMajorIndex", "maxmin_rates", "maxmin_rates_fast", "maxmin_rates_fm", "maxmin_rates_parts", "HAVE_NUMBA"]

_REL_TOL = 1e-12


class FlowLinkIndex:
    """Link -> flow index of a fixed ``links`` matrix of shape (H, F) (a CSR, radix-sorted)."""

    __slots__ = ("order", "starts", "n_links")

    def __init__(self, links: np.ndarray, n_links: int) -> None:
        flat = links.ravel()  # entry k is flow k % F on hop k // F
        keys = flat.astype(np.uint16) if n_links <= 65536 else flat
        order = np.argsort(keys, kind="stable")
        counts = np.bincount(flat, minlength=n_links)
        starts = np.zeros(n_links + 1, dtype=np.int64)
        np.cumsum(counts, out=starts[1:])
        self.order = order % links.shape[1]  # flow of each sorted entry
        self.starts = starts
        self.n_links = n_links

    def flows_of(self, link_ids: np.ndarray) -> np.ndarray:
        """Flows (with repeats) crossing any of ``link_ids``."""
        s = self.starts[link_ids]
        e = self.starts[link_ids + 1]
        if link_ids.size == 1:
            return self.order[s[0] : e[0]]
        lengths = e - s
        total = int(lengths.sum())
        if total == 0:
            return np.empty(0, dtype=np.int64)
        offsets = np.repeat(s - np.cumsum(lengths) + lengths, lengths)
        return self.order[np.arange(total) + offsets]


def _weights(hop_links: np.ndarray, factor: np.ndarray, wire: np.ndarray, mult: np.ndarray | None = None) -> np.ndarray:
    w = np.where(wire[hop_links], factor, 1.0)
    return w if mult is None else w * mult


def maxmin_rates(
    links: np.ndarray,
    factor: np.ndarray,
    wire: np.ndarray,
    capacity: np.ndarray,
    *,
    alive: np.ndarray | None = None,
    index: FlowLinkIndex | None = None,
    weight: np.ndarray | None = None,
) -> np.ndarray:
    """Max-min fair rates.

    links: (H, F) int link indices (hop-major), padded with a link whose capacity is ``inf``.
    factor: (F,) float >= 1: a flow's load per unit rate on links marked ``wire`` (framing).
    wire: (L,) bool. capacity: (L,) float >= 0.
    alive: optional (F,) bool; flows not alive get rate 0 and load nothing.
    index: optional prebuilt :class:`FlowLinkIndex` of ``links``.
    weight: optional (H, F) multiplicity of each hop (a flow *class* standing for several flows
    per link of a link class, :mod:`sim.network.classes`); 1 when left out.
    Returns (F,) rates in capacity units (``inf`` for a flow on infinite links only).
    """
    n_flows = links.shape[1]
    n_links = capacity.shape[0]
    rates = np.zeros(n_flows, dtype=np.float64)
    if n_flows == 0:
        return rates
    if index is None:
        index = FlowLinkIndex(links, n_links)
    if alive is None:
        frozen = np.zeros(n_flows, dtype=bool)
        la, fa, ma = links, factor, weight
    else:
        frozen = ~alive
        la, fa = links[:, alive], factor[alive]
        ma = None if weight is None else weight[:, alive]
    load = np.bincount(la.ravel(), _weights(la, fa, wire, ma).ravel(), minlength=n_links)
    count = np.bincount(la.ravel(), minlength=n_links)
    del la, fa, ma
    stamp = np.empty(n_flows, dtype=np.int64)
    cap = capacity.astype(np.float64, copy=True)
    active = (count > 0) & np.isfinite(cap)
    share = np.full(n_links, np.inf)
    share[active] = cap[active] / load[active]
    while active.any():
        s_min = share[active].min()
        bn = np.flatnonzero(active & (share <= s_min * (1.0 + _REL_TOL)))
        rows = index.flows_of(bn)
        rows = rows[~frozen[rows]]
        active[bn] = False
        if rows.size == 0:  # numerical residue: only frozen flows left on these links
            continue
        # de-duplicate (a flow may cross several bottleneck links) in O(len(rows)), no sort
        pos = np.arange(rows.size)
        stamp[rows] = pos
        rows = rows[stamp[rows] == pos]
        frozen[rows] = True
        rates[rows] = s_min
        fl = links[:, rows]
        mw = None if weight is None else weight[:, rows]
        dw = np.bincount(fl.ravel(), _weights(fl, factor[rows], wire, mw).ravel(), minlength=n_links)
        dc = np.bincount(fl.ravel(), minlength=n_links)
        load -= dw
        cap -= dw * s_min
        count -= dc
        active &= count > 0
        upd = (dc > 0) & active
        np.maximum(cap, 0.0, out=cap)
        share[upd] = cap[upd] / np.maximum(load[upd], 1e-300)
    left = ~frozen  # flows crossing only infinite-capacity links
    if left.any():
        rates[left] = np.inf
    return rates


# ------------------------------------------------------------------- compiled (optional)
import os

try:  # numba is optional: the same algorithm compiled, ~100x fewer interpreter round trips
    if os.environ.get("NEONIC_NO_NUMBA"):
        raise ImportError("disabled by NEONIC_NO_NUMBA")
    from numba import njit as _njit
except ImportError:  # pragma: no cover - exercised only without numba
    _njit = None

HAVE_NUMBA = _njit is not None

if HAVE_NUMBA:

    @_njit(cache=True, nogil=True, inline="always")
    def _load_part(links_fh, factor, frozen, weight, has_w, wire, load, count):  # pragma: no cover
        F, H = links_fh.shape
        for f in range(F):
            if frozen[f]:
                continue
            fac = factor[f]
            for h in range(H):
                k = links_fh[f, h]
                w = fac if wire[k] else 1.0
                if has_w:
                    w *= weight[f, h]
                load[k] += w
                count[k] += 1

    @_njit(cache=True, nogil=True, inline="always")
    def _freeze_link(l, s_min, ent_links, factor, frozen, starts, order, rates, weight, has_w, wire, load, cap, count, share):  # pragma: no cover
        """Freeze every unfrozen flow of one part on bottleneck link ``l`` at ``s_min``.
        ``ent_links[e]`` is the hop list of entry e's flow, stored in index order so that this
        loop reads the links sequentially (the flows of a link are scattered in memory)."""
        H = ent_links.shape[1]
        for e in range(starts[l], starts[l + 1]):
            f = order[e] // H
            if frozen[f]:
                continue
            frozen[f] = True
            rates[f] = s_min
            fac = factor[f]
            for h in range(H):
                k = ent_links[e, h]
                w = fac if wire[k] else 1.0
                if has_w:
                    w *= weight[f, h]
                load[k] -= w
                cap[k] -= w * s_min
                count[k] -= 1
                if k != l and np.isfinite(share[k]):
                    if count[k] <= 0:
                        share[k] = np.inf
                    else:
                        c = cap[k] if cap[k] > 0.0 else 0.0
                        share[k] = c / (load[k] if load[k] > 1e-300 else 1e-300)

    @_njit(cache=True, nogil=True)
    def _maxmin_parts(links_a, factor_a, frozen_a, starts_a, order_a, ent_a, rates_a, weight_a, has_w,
                      links_b, factor_b, frozen_b, starts_b, order_b, ent_b, rates_b, wire, capacity):  # pragma: no cover
        """Sequential progressive filling over two flow sets sharing the links (part ``b`` has no
        weights; it may be empty): each keeps its own (F, H) links and link -> entry index
        (entries f*H+h), so a large set's index is built once and reused across solves."""
        L = capacity.shape[0]
        load = np.zeros(L)
        count = np.zeros(L, dtype=np.int64)
        _load_part(links_a, factor_a, frozen_a, weight_a, has_w, wire, load, count)
        _load_part(links_b, factor_b, frozen_b, weight_a, False, wire, load, count)
        cap = capacity.copy()
        share = np.full(L, np.inf)
        live = np.empty(L, dtype=np.int64)  # links that still carry unfrozen flows
        n_live = 0
        for k in range(L):
            if count[k] > 0 and np.isfinite(cap[k]):
                share[k] = cap[k] / load[k]
                live[n_live] = k
                n_live += 1
        picked = np.empty(L, dtype=np.int64)
        while n_live > 0:
            # one pass: drop dead links, find the minimum share and the links at it
            s_min = np.inf
            n_pick = 0
            j = 0
            for i in range(n_live):
                k = live[i]
                sk = share[k]
                if not np.isfinite(sk):
                    continue
                live[j] = k
                j += 1
                if sk < s_min * (1.0 - 1e-12):
                    s_min = sk
                    n_pick = 0
                    picked[n_pick] = k
                    n_pick += 1
                elif sk <= s_min * (1.0 + 1e-12):
                    picked[n_pick] = k
                    n_pick += 1
            n_live = j
            if n_pick == 0:
                break
            for i in range(n_pick):
                l = picked[i]
                share[l] = np.inf
                _freeze_link(l, s_min, ent_a, factor_a, frozen_a, starts_a, order_a, rates_a, weight_a, has_w,
                             wire, load, cap, count, share)
                _freeze_link(l, s_min, ent_b, factor_b, frozen_b, starts_b, order_b, rates_b, weight_a, False,
                             wire, load, cap, count, share)
        for f in range(frozen_a.shape[0]):
            if not frozen_a[f]:
                rates_a[f] = np.inf
        for f in range(frozen_b.shape[0]):
            if not frozen_b[f]:
                rates_b[f] = np.inf

    @_njit(cache=True, nogil=True)
    def _maxmin_compiled(links_fh, factor, wire, capacity, frozen, starts, order, ent_links, rates, weight, has_w):  # pragma: no cover
        """Sequential progressive filling; ``links_fh`` is (F, H), ``order`` lists entries f*H+h;
        ``weight`` (F, H) hop multiplicities when ``has_w`` (else ignored)."""
        H = links_fh.shape[1]
        L = capacity.shape[0]
        eb = np.empty((0, H), dtype=links_fh.dtype)
        _maxmin_parts(links_fh, factor, frozen, starts, order, ent_links, rates, weight, has_w,
                      eb, np.empty(0), np.empty(0, dtype=np.bool_), np.zeros(L + 1, dtype=np.int64),
                      np.empty(0, dtype=np.int64), eb, np.empty(0), wire, capacity)
        return rates

    @_njit(cache=True, nogil=True)
    def _csr_compiled(links_fh, n_links):  # pragma: no cover
        F, H = links_fh.shape
        counts = np.zeros(n_links + 1, dtype=np.int64)
        for f in range(F):
            for h in range(H):
                counts[links_fh[f, h] + 1] += 1
        starts = np.cumsum(counts)
        fill = starts[:-1].copy()
        order = np.empty(F * H, dtype=np.int64)
        ent = np.empty((F * H, H), dtype=links_fh.dtype)
        for f in range(F):
            for h in range(H):
                k = links_fh[f, h]
                e = fill[k]
                order[e] = f * H + h
                for j in range(H):
                    ent[e, j] = links_fh[f, j]
                fill[k] += 1
        return starts, order, ent


class FlowMajorIndex:
    """Link -> entry index of a (F, H) links matrix (counting sort); entries are ``f * H + h``."""

    __slots__ = ("starts", "order", "ent_links")

    def __init__(self, links_fh: np.ndarray, n_links: int) -> None:
        if HAVE_NUMBA:
            self.starts, self.order, self.ent_links = _csr_compiled(links_fh, n_links)
        else:
            flat = links_fh.ravel()
            self.order = np.argsort(flat, kind="stable").astype(np.int64)
            self.ent_links = links_fh[self.order // max(links_fh.shape[1], 1)]
            self.starts = np.zeros(n_links + 1, dtype=np.int64)
            np.cumsum(np.bincount(flat, minlength=n_links), out=self.starts[1:])


def maxmin_rates_fm(
    links_fh: np.ndarray,
    factor: np.ndarray,
    wire: np.ndarray,
    capacity: np.ndarray,
    *,
    alive: np.ndarray | None = None,
    index: FlowMajorIndex | None = None,
    weight: np.ndarray | None = None,
) -> np.ndarray:
    """:func:`maxmin_rates` for a flow-major (F, H) ``links`` matrix (and (F, H) ``weight``);
    compiled when numba is installed (same algorithm, same results), else the numpy one."""
    n_flows = links_fh.shape[0]
    if not HAVE_NUMBA:
        wt = None if weight is None else np.ascontiguousarray(weight.T)
        rates = maxmin_rates(np.ascontiguousarray(links_fh.T), factor, wire, capacity, alive=alive, weight=wt)
        return rates
    rates = np.zeros(n_flows, dtype=np.float64)
    if n_flows == 0:
        return rates
    if index is None:
        index = FlowMajorIndex(links_fh, capacity.shape[0])
    frozen = np.zeros(n_flows, dtype=bool) if alive is None else ~alive
    has_w = weight is not None
    w = np.ascontiguousarray(weight, dtype=np.float64) if has_w else np.ones((1, 1))
    _maxmin_compiled(links_fh, factor, wire, capacity, frozen, index.starts, index.order, index.ent_links, rates, w, has_w)
    if alive is not None:
        rates[~alive] = 0.0
    return rates


def maxmin_rates_parts(
    big_links: np.ndarray,
    big_factor: np.ndarray,
    big_alive: np.ndarray,
    big_index: FlowMajorIndex | None,
    links_fh: np.ndarray,
    factor: np.ndarray,
    wire: np.ndarray,
    capacity: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Max-min rates of two flow sets solved together (same result as one concatenated solve):
    a large one (``big_*``, its :class:`FlowMajorIndex` reused across solves, ``big_alive``
    marking its live flows) and a small one built on the fly. Returns (rates big, rates small);
    dead flows of the big set get 0."""
    if not HAVE_NUMBA:
        n = int(big_alive.sum())
        rates = maxmin_rates_fm(np.concatenate([big_links[big_alive], links_fh]),
                                np.concatenate([big_factor[big_alive], factor]), wire, capacity)
        ra = np.zeros(big_alive.size)
        ra[big_alive] = rates[:n]
        return ra, rates[n:]
    L = capacity.shape[0]
    if big_index is None:
        big_index = FlowMajorIndex(big_links, L)
    links_fh = links_fh.astype(big_links.dtype, copy=False)
    small = FlowMajorIndex(links_fh, L)
    ra = np.zeros(big_alive.size)
    rb = np.zeros(links_fh.shape[0])
    _maxmin_parts(big_links, big_factor, ~big_alive, big_index.starts, big_index.order, big_index.ent_links, ra,
                  np.ones((1, 1)), False, links_fh, factor, np.zeros(links_fh.shape[0], dtype=bool), small.starts,
                  small.order, small.ent_links, rb, wire, capacity)
    ra[~big_alive] = 0.0
    return ra, rb


def maxmin_rates_fast(links, factor, wire, capacity, *, alive=None, index=None):
    """:func:`maxmin_rates` (hop-major input) through the compiled solver when available."""
    if not HAVE_NUMBA:
        return maxmin_rates(links, factor, wire, capacity, alive=alive, index=index)
    return maxmin_rates_fm(np.ascontiguousarray(links.T), factor, wire, capacity, alive=alive)
