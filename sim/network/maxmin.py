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

:func:`maxmin_rates` is the numpy reference; the simulator uses the link-level form below
(:class:`LinkEntries`, :func:`link_levels`, :func:`rates_from_levels`), the same algorithm
organised so that its inner loops read memory sequentially (tested equal within 1e-9).
"""

from __future__ import annotations

import numpy as np

from neonic.sim.compiled import HAVE_NUMBA, jit

__all__ = ["FlowLinkIndex", "FlowMajorIndex", "LinkEntries", "link_levels", "rates_from_levels", "maxmin_rates", "maxmin_rates_fast",
           "maxmin_rates_fm", "maxmin_rates_parts", "HAVE_NUMBA"]

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


# ------------------------------------------------------------------- compiled (link levels)
#
# The compiled solver is the same progressive filling organised around *link levels*: a flow's
# rate is the share ``s_min`` of the round in which the first of its links saturates, so the
# filling only needs, per link, the level it saturated at and the order it was processed in;
# rates follow in one pass over the flows (``rate = level of its first-processed link``). The
# filling visits each (live flow, hop) entry once through a link -> entry index whose rows copy
# the flow's whole path (so "is this flow frozen?" is a look-up of its other links' flags, and
# every read is sequential), and each round finds its minimum share with a vectorisable scan of
# the live links' shares kept in a dense array. Ties: every live link whose share is within
# ``_REL_TOL`` of the minimum saturates in the same round, at the minimum.
@jit(cache=True, nogil=True, fastmath=True)
def _block_min(a, lo, hi):  # pragma: no cover - compiled
    """min(a[lo:hi]) (exact in any order; eight accumulators so that it vectorises)."""
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = np.inf
    i = lo
    while i + 8 <= hi:
        m0 = min(m0, a[i])
        m1 = min(m1, a[i + 1])
        m2 = min(m2, a[i + 2])
        m3 = min(m3, a[i + 3])
        m4 = min(m4, a[i + 4])
        m5 = min(m5, a[i + 5])
        m6 = min(m6, a[i + 6])
        m7 = min(m7, a[i + 7])
        i += 8
    while i < hi:
        m0 = min(m0, a[i])
        i += 1
    return min(min(min(m0, m1), min(m2, m3)), min(min(m4, m5), min(m6, m7)))


@jit(cache=True, nogil=True)
def _entries_build(links_fh, factor, weight, has_w, capacity, skip):  # pragma: no cover - compiled
    """Counting sort of the (flow, hop) entries on finite-capacity links by link. Per entry: its
    flow, the flow's *other* finite hops (``oth``, padded with the scratch index L), its factor,
    and with weights its multiplicity on this hop (column 0) and on the others; ``pos[f, h]`` is
    the entry of flow f's hop h (-1 on an infinite link)."""
    F, H = links_fh.shape
    L = capacity.shape[0]
    counts = np.zeros(L + 1, dtype=np.int64)
    for f in range(F):
        for h in range(H):
            k = links_fh[f, h]
            if np.isfinite(capacity[k]) and not skip[k]:
                counts[k + 1] += 1
    starts = np.cumsum(counts)
    fill = starts[:-1].copy()
    E = starts[L]
    O = max(H - 1, 1)
    ent_flow = np.empty(E, dtype=np.int32)  # int32: the index holds < 2**31 entries (checked)
    oth = np.full((E, O), L, dtype=np.int32)
    ent_fac = np.empty(E)
    mw = np.ones((E if has_w else 1, H))
    pos = np.full((F, H), -1, dtype=np.int32)
    for f in range(F):
        for h in range(H):
            k = links_fh[f, h]
            if not np.isfinite(capacity[k]) or skip[k]:
                continue
            e = fill[k]
            fill[k] += 1
            ent_flow[e] = f
            ent_fac[e] = factor[f]
            pos[f, h] = e
            if has_w:
                mw[e, 0] = weight[f, h]
            j = 0
            for h2 in range(H):
                if h2 == h:
                    continue
                k2 = links_fh[f, h2]
                if np.isfinite(capacity[k2]):
                    oth[e, j] = k2
                    if has_w:
                        mw[e, j + 1] = weight[f, h2]
                    j += 1
    return starts, ent_flow, oth, ent_fac, mw, pos


@jit(cache=True, nogil=True)
def _entries_kill(pos, flows, ent_alive):  # pragma: no cover - compiled
    for i in range(flows.shape[0]):
        f = flows[i]
        for h in range(pos.shape[1]):
            e = pos[f, h]
            if e >= 0:
                ent_alive[e] = False


@jit(cache=True, nogil=True)
def _add_loads(starts, ent_fac, mw, has_w, ent_alive, wire, cap, load, count):  # pragma: no cover - compiled
    for l in range(starts.shape[0] - 1):
        if cap[l] == np.inf:  # never saturates: its load is never read (a throttle left off)
            continue
        wl = wire[l]
        ld = 0.0
        c = 0
        for e in range(starts[l], starts[l + 1]):
            a = ent_alive[e]
            w = ent_fac[e] if wl else 1.0
            if has_w:
                w *= mw[e, 0]
            ld += w * a  # branch-free: a finished flow adds an exact zero
            c += a
        load[l] += ld
        count[l] += c


@jit(cache=True, nogil=True, inline="always")
def _unload(k, w, s, load, cap, count, stale, bstale, pos):  # pragma: no cover - compiled
    """Take a frozen flow's weight ``w`` (at level ``s``) off link ``k``; its share is stale
    (recomputed only if it comes near the minimum, :func:`_fill_levels`)."""
    load[k] -= w
    cap[k] -= w * s
    count[k] -= 1
    stale[k] = True
    p = pos[k]
    if p >= 0:
        bstale[p >> _BLOCK_SHIFT] = True


@jit(cache=True, nogil=True, inline="always")
def _freeze(l, s, starts, oth, ent_fac, mw, has_w, ent_alive, wire, proc, load, cap, count, stale, bstale,
            pos):  # pragma: no cover - compiled
    """Freeze the live, unfrozen flows of one part crossing link ``l`` at level ``s``: take their
    load off their other links. Inlined, with a branch for flows of two finite links (one other
    link: the common case)."""
    O = oth.shape[1]
    for e in range(starts[l], starts[l + 1]):
        if not ent_alive[e]:
            continue
        if O == 1:
            k = oth[e, 0]
            if proc[k] or cap[k] == np.inf:
                continue
            w = ent_fac[e] if wire[k] else 1.0
            if has_w:
                w *= mw[e, 1]
            _unload(k, w, s, load, cap, count, stale, bstale, pos)
            continue
        frozen = False
        for j in range(O):
            if proc[oth[e, j]]:
                frozen = True
        if frozen:
            continue
        fac = ent_fac[e]
        for j in range(O):
            k = oth[e, j]
            if cap[k] == np.inf:  # an infinite link's load is never read: skip the update
                continue
            w = fac if wire[k] else 1.0
            if has_w:
                w *= mw[e, j + 1]
            _unload(k, w, s, load, cap, count, stale, bstale, pos)


_BLOCK_SHIFT = 6
_BLOCK = 1 << _BLOCK_SHIFT


@jit(cache=True, nogil=True, inline="always")
def _refresh_block(b, n, psh, plink, stale, proc, cap, load, count):  # pragma: no cover - compiled
    """Recompute the stale shares of block ``b`` of the dense share array; returns (the block's
    minimum, the number of links that left the filling: no unfrozen flow)."""
    dead = 0
    lo = b * _BLOCK
    hi = min(n, lo + _BLOCK)
    for i in range(lo, hi):
        k = plink[i]
        if not stale[k]:
            continue
        stale[k] = False
        if proc[k] or psh[i] == np.inf:
            continue
        if count[k] <= 0:
            psh[i] = np.inf
            dead += 1
        else:
            c = cap[k] if cap[k] > 0.0 else 0.0
            psh[i] = c / (load[k] if load[k] > 1e-300 else 1e-300)
    return _block_min(psh, lo, hi), dead


@jit(cache=True, nogil=True, inline="always")
def _compact(n, psh, plink, pos, bdirty, bstale):  # pragma: no cover - compiled
    """Drop the retired links (share inf) from the first ``n`` places of the dense share array,
    order kept; every block's minimum is to be rescanned and its shares checked. Returns the
    new ``n``."""
    j = 0
    for i in range(n):
        if psh[i] != np.inf:
            psh[j] = psh[i]
            plink[j] = plink[i]
            pos[plink[j]] = j
            j += 1
        else:
            pos[plink[i]] = -1
    bdirty[:] = True
    bstale[:] = True
    return j


@jit(cache=True, nogil=True, inline="always")
def _next_level(n, psh, plink, stale, proc, cap, load, count, bmin, bdirty, bstale,
                picked):  # pragma: no cover - compiled
    """One round of the filling: the least true share ``s_min`` (the block holding the least
    lower bound is refreshed until it is clean), then the links within the tie threshold of
    it (stale blocks in reach refreshed first) written to ``picked``, in position order.
    Returns (``s_min``: inf when no link is left, the number picked, the number of links that
    left the filling while refreshing)."""
    dead = 0
    nb = (n + _BLOCK - 1) // _BLOCK
    while True:
        s_min = np.inf
        bsel = -1
        for b in range(nb):
            if bdirty[b]:
                bmin[b] = _block_min(psh, b * _BLOCK, min(n, (b + 1) * _BLOCK))
                bdirty[b] = False
            if bmin[b] < s_min:
                s_min = bmin[b]
                bsel = b
        if bsel < 0 or not bstale[bsel]:
            break
        m, d = _refresh_block(bsel, n, psh, plink, stale, proc, cap, load, count)
        bmin[bsel] = m
        bstale[bsel] = False
        dead += d
    if s_min == np.inf:
        return s_min, 0, dead
    thr = s_min * (1.0 + _REL_TOL)
    n_pick = 0
    for b in range(nb):
        if bmin[b] <= thr:
            if bstale[b]:
                m, d = _refresh_block(b, n, psh, plink, stale, proc, cap, load, count)
                bmin[b] = m
                bstale[b] = False
                dead += d
                if bmin[b] > thr:
                    continue
            for i in range(b * _BLOCK, min(n, (b + 1) * _BLOCK)):
                if psh[i] <= thr:
                    picked[n_pick] = plink[i]
                    n_pick += 1
    return s_min, n_pick, dead


@jit(cache=True, nogil=True, inline="always")
def _retire(n_pick, picked, pos, psh, bdirty):  # pragma: no cover - compiled
    """Take the ``n_pick`` links just frozen out of the dense share array (share inf, their
    blocks' minima to be rescanned); returns how many left."""
    for i in range(n_pick):
        p = pos[picked[i]]
        psh[p] = np.inf
        bdirty[p >> _BLOCK_SHIFT] = True
    return n_pick


@jit(cache=True, nogil=True)
def _col_sums(M, load, count, base):  # pragma: no cover - compiled
    """``load[base + j]`` += the sum of column ``j`` of ``M`` in row order, and ``count[base +
    j]`` += its positive entries: with ``load`` at 0.0 the same additions in the same order as
    summing row ``j`` of ``M.T`` from 0.0, but every column's running sum is independent, so the
    pass over the rows vectorises (a row's own sum is one chain of dependent additions)."""
    R, C = M.shape
    ld = load[base:base + C]
    ct = count[base:base + C]
    for r in range(R):
        row = M[r]
        for j in range(C):
            w = row[j]
            ld[j] += w
            ct[j] += w > 0.0


@jit(cache=True, nogil=True)
def _row_col_sums(W, load, count, nA):  # pragma: no cover - compiled
    """In one pass over ``W`` (nA x nB; ``load`` and ``count`` at 0 from ``nA`` on): ``load[r]``
    = the sum of row ``r`` in column order from 0.0 and ``load[nA + j]`` += column ``j``'s in
    row order; ``count`` their positive entries. Eight rows at a time: eight independent row
    sums, and each column's running sum takes the eight rows' terms in row order, so every sum
    has the additions of its own loop in its own order (the same bits), and ``W.T`` is not read."""
    R, C = W.shape
    ld = load[nA:nA + C]
    ct = count[nA:nA + C]
    r = 0
    while r + 8 <= R:
        l0 = l1 = l2 = l3 = l4 = l5 = l6 = l7 = 0.0
        c0 = c1 = c2 = c3 = c4 = c5 = c6 = c7 = 0
        for j in range(C):
            w0 = W[r, j]
            w1 = W[r + 1, j]
            w2 = W[r + 2, j]
            w3 = W[r + 3, j]
            w4 = W[r + 4, j]
            w5 = W[r + 5, j]
            w6 = W[r + 6, j]
            w7 = W[r + 7, j]
            l0 += w0
            l1 += w1
            l2 += w2
            l3 += w3
            l4 += w4
            l5 += w5
            l6 += w6
            l7 += w7
            c0 += w0 > 0.0
            c1 += w1 > 0.0
            c2 += w2 > 0.0
            c3 += w3 > 0.0
            c4 += w4 > 0.0
            c5 += w5 > 0.0
            c6 += w6 > 0.0
            c7 += w7 > 0.0
            ld[j] = (((((((ld[j] + w0) + w1) + w2) + w3) + w4) + w5) + w6) + w7
            ct[j] += (int(w0 > 0.0) + int(w1 > 0.0) + int(w2 > 0.0) + int(w3 > 0.0) + int(w4 > 0.0)
                      + int(w5 > 0.0) + int(w6 > 0.0) + int(w7 > 0.0))  # (ints: numpy's bools add as "or")
        load[r] = l0
        load[r + 1] = l1
        load[r + 2] = l2
        load[r + 3] = l3
        load[r + 4] = l4
        load[r + 5] = l5
        load[r + 6] = l6
        load[r + 7] = l7
        count[r] = c0
        count[r + 1] = c1
        count[r + 2] = c2
        count[r + 3] = c3
        count[r + 4] = c4
        count[r + 5] = c5
        count[r + 6] = c6
        count[r + 7] = c7
        r += 8
    while r < R:
        lr = 0.0
        cr = 0
        for j in range(C):
            w = W[r, j]
            lr += w
            cr += w > 0.0
            ld[j] += w
            ct[j] += w > 0.0
        load[r] = lr
        count[r] = cr
        r += 1


@jit(cache=True, nogil=True)
def _dense_loads(Wa, WTa, Wb, WTb, load, count, a0, b0, nA, nB, joint):  # pragma: no cover - compiled
    """Add the loads of the dense flow sets ``Wa`` then ``Wb`` (each (K, nA, nB)) onto links
    ``a0 + r`` and ``b0 + c``, each set's flows in column order, as :func:`_add_loads` sums an
    entry set's flows in flow order: per set a running sum from 0.0, then added (``joint``:
    one running sum over both sets, as one entry set holding both). A link's row of one matrix
    is the column of the other, summed by :func:`_col_sums` (the same additions in the same
    order, vectorised across links)."""
    Ka = Wa.shape[0]
    Kb = Wb.shape[0]
    acc = np.zeros(max(nA, nB))
    cnt = np.zeros(max(nA, nB), dtype=np.int64)
    for side in range(2):
        n = nA if side == 0 else nB
        base = a0 if side == 0 else b0
        acc[:] = 0.0
        cnt[:] = 0
        for k in range(Ka + Kb):
            if k == Ka and not joint:
                for r in range(n):
                    load[base + r] += acc[r]
                    count[base + r] += cnt[r]
                acc[:] = 0.0
                cnt[:] = 0
            if side == 0:  # the A links' rows: columns of the transposes
                _col_sums(WTa[k] if k < Ka else WTb[k - Ka], acc, cnt, 0)
            else:
                _col_sums(Wa[k] if k < Ka else Wb[k - Ka], acc, cnt, 0)
        for r in range(n):
            load[base + r] += acc[r]
            count[base + r] += cnt[r]


@jit(cache=True, nogil=True, inline="always")
def _share_array(links, count, cap, load):  # pragma: no cover - compiled
    """The dense share array of the live links (flows left and a finite capacity), taken in
    the order of ``links``: each link's position in it (-1: not live; one slot more than links),
    the shares ``cap / load``, the links in that order, and how many are live."""
    L = links.shape[0]
    pos = np.full(L + 1, -1, dtype=np.int64)
    psh = np.empty(L)
    plink = np.empty(L, dtype=np.int64)
    n = 0
    for t in range(L):
        u = links[t]
        if count[u] > 0 and np.isfinite(cap[u]):
            pos[u] = n
            psh[n] = cap[u] / load[u]
            plink[n] = u
            n += 1
    return pos, psh, plink, n


@jit(cache=True, nogil=True, inline="always")
def _first_at_least(plink, lo, n, link):  # pragma: no cover - compiled
    """The first position ``>= lo`` of ``plink[:n]`` (sorted) holding a link id ``>= link``."""
    hi = n
    while lo < hi:
        m = (lo + hi) >> 1
        if plink[m] < link:
            lo = m + 1
        else:
            hi = m
    return lo


@jit(cache=True, nogil=True, inline="always")
def _pos_range(plink, n, lo_link, hi_link):  # pragma: no cover - compiled
    """The positions (first, last) of the live links ``lo_link <= l < hi_link`` in the dense
    share array (ordered by link id): two binary searches; (0, -1) when none is live."""
    first = _first_at_least(plink, 0, n, lo_link)
    return first, _first_at_least(plink, first, n, hi_link) - 1


@jit(cache=True, nogil=True)
def _unload_row_v(row, k0, act, load, cap, count, stale, s, vfar, vnear):  # pragma: no cover - compiled
    """:func:`_unload_row` for dense flows that also cross two more links (unframed: weight 1
    there): the far side's link of each flow (``vfar[t]``, by partner) and one near link
    (``vnear``), taken off flow by flow in partner order (a frozen flow, any of its links
    processed, takes off zeros)."""
    near = cap[vnear] != np.inf  # an unlimited GPU's link is never read: left alone
    for t in range(row.shape[0]):
        x = row[t]
        if x == 0.0:  # no live flow
            continue
        v = vfar[t]
        if act[k0 + t] == 0.0 or act[v] == 0.0:  # frozen already
            continue
        load[k0 + t] -= x
        cap[k0 + t] -= x * s
        count[k0 + t] -= 1
        stale[k0 + t] = True
        if cap[v] != np.inf:
            load[v] -= 1.0
            cap[v] -= s
            count[v] -= 1
            stale[v] = True
        if near:
            load[vnear] -= 1.0
            cap[vnear] -= s
            count[vnear] -= 1
            stale[vnear] = True


@jit(cache=True, nogil=True, inline="always")
def _stale_range(plink, n, lo_link, hi_link, bstale):  # pragma: no cover - compiled
    """Mark the blocks holding the live links ``lo_link <= l < hi_link`` as stale."""
    lo, hi = _pos_range(plink, n, lo_link, hi_link)
    for b in range(lo >> _BLOCK_SHIFT, (hi >> _BLOCK_SHIFT) + 1):
        bstale[b] = True


@jit(cache=True, nogil=True)
def _fill_levels(sa, oa, ca, ma, has_w, aa, sb, ob, cb, ab, wire, capacity, dWa, dWTa, dWb, dWTb, a0,
                 b0, va, vb):  # pragma: no cover - compiled
    """Progressive filling over two parts (``s`` starts, ``o`` other hops, ``c`` factors, ``m``
    multiplicities of part a when ``has_w``, ``a`` entry alive) sharing the links. Returns per
    link its level (inf: never saturated) and its processing order.

    Dense flow sets (``dWa``, ``dWb``: (K, nA, nB), K = 0 for none, with ``dWTa``/``dWTb`` their
    transposes): flow (r, c) of a set crosses link ``a0 + r`` and link ``b0 + c`` (no other
    finite link) with weight ``W[r, c]`` on both (0: no live flow); no entry of parts a and b is
    on those links. The sets of ``dWa`` belong to part a, those of ``dWb`` to part b: each
    link's load is part a's running sum then part b's, and a saturated link unloads part a's
    flows then part b's, as if those flows were entries (with each link's flows in order of
    their partner), so levels and order are those of the same flows given as entries.
    With ``va`` / ``vb`` (per row / column, a link id; empty for none) every flow (r, c) also
    crosses links ``va[r]`` and ``vb[c]``, which part a's entries cover (their flows list the
    dense links among their other links, the dense links get no entries); ``dWa`` and ``dWb``
    are then both part a's, in that order (one running sum per link).

    Shares are refreshed lazily: freezing a flow only marks its other links stale (a link's share
    only rises when a flow frozen at the current level leaves it: ``(c - w s) / (l - w) >= c / l``
    since ``c / l >= s``), so a stale share is a lower bound of the true one. A round refreshes
    the stale shares of the blocks whose lower bound reaches the minimum until the minimum is a
    true share, then those of the blocks within the tie threshold; each share is computed from
    the same link capacity and load as an eager refresh after every round would, so levels and
    order are identical to that."""
    L = capacity.shape[0]
    wx = np.zeros(L + 1, dtype=np.bool_)  # index L: the scratch link of padded hops
    wx[:L] = wire
    load = np.zeros(L + 1)
    count = np.zeros(L + 1, dtype=np.int64)
    cap = np.empty(L + 1)
    cap[:L] = capacity
    cap[L] = np.inf
    _add_loads(sa, ca, ma, has_w, aa, wx, cap, load, count)
    _add_loads(sb, cb, ma, False, ab, wx, cap, load, count)
    nA = dWa.shape[1] if dWa.shape[0] > 0 else dWb.shape[1]
    nB = dWa.shape[2] if dWa.shape[0] > 0 else dWb.shape[2]
    dense = dWa.shape[0] + dWb.shape[0] > 0
    act = np.ones(L + 1 if dense else 1)  # 1.0 while a link is not processed (dense unloads)
    if dense:
        _dense_loads(dWa, dWTa, dWb, dWTb, load, count, a0, b0, nA, nB, va.shape[0] > 0)
    # position of a live link in the dense share array, the shares, the links in that order
    pos, psh, plink, n = _share_array(np.arange(L), count, cap, load)
    level = np.full(L, np.inf)
    big = np.iinfo(np.int64).max
    porder = np.full(L + 1, big, dtype=np.int64)
    proc = np.zeros(L + 1, dtype=np.bool_)
    stale = np.zeros(L + 1, dtype=np.bool_)
    picked = np.empty(L, dtype=np.int64)
    nblk = L // _BLOCK + 1
    bmin = np.empty(nblk)  # per block of positions: the minimum of its (lower-bound) shares
    bdirty = np.ones(nblk, dtype=np.bool_)  # blocks whose minimum must be rescanned
    bstale = np.zeros(nblk, dtype=np.bool_)  # blocks with a stale share
    dead = 0
    seq = 0
    while n > 0:
        if 2 * dead > n:  # compact the dense array (order kept; stale shares stay stale)
            n = _compact(n, psh, plink, pos, bdirty, bstale)
            dead = 0
            if n == 0:
                break
        s_min, n_pick, d = _next_level(n, psh, plink, stale, proc, cap, load, count, bmin, bdirty,
                                       bstale, picked)
        dead += d
        if s_min == np.inf:
            break
        for i in range(n_pick):
            l = picked[i]
            proc[l] = True
            level[l] = s_min
            porder[l] = seq
            seq += 1
            _freeze(l, s_min, sa, oa, ca, ma, has_w, aa, wx, proc, load, cap, count, stale, bstale, pos)
            _freeze(l, s_min, sb, ob, cb, ma, False, ab, wx, proc, load, cap, count, stale, bstale, pos)
            if dense:
                act[l] = 0.0
                if va.shape[0] > 0 and a0 <= l < a0 + nA:  # with their rows' and columns' links
                    _unload_dense_v(dWa, dWb, l - a0, b0, nB, vb, va[l - a0], act, load, cap, count, stale,
                                    s_min, plink, n, bstale, pos)
                elif va.shape[0] > 0 and b0 <= l < b0 + nB:
                    _unload_dense_v(dWTa, dWTb, l - b0, a0, nA, va, vb[l - b0], act, load, cap, count, stale,
                                    s_min, plink, n, bstale, pos)
                elif a0 <= l < a0 + nA:  # a dense A link: its flows leave their B links
                    _unload_dense(dWa, dWb, l - a0, b0, b0 + nB, act, load, cap, count, stale, s_min)
                    _stale_range(plink, n, b0, b0 + nB, bstale)
                elif b0 <= l < b0 + nB:
                    _unload_dense(dWTa, dWTb, l - b0, a0, a0 + nA, act, load, cap, count, stale, s_min)
                    _stale_range(plink, n, a0, a0 + nA, bstale)
        dead += _retire(n_pick, picked, pos, psh, bdirty)
    return level[:L], porder[:L]


@jit(cache=True, nogil=True)
def _side_ranges(plink, n, nA, plo, phi):  # pragma: no cover - compiled
    """The first and last position of side A's (local id < nA) and side B's links in the dense
    share array (a side with no live link: an empty range)."""
    plo[0] = plo[1] = n
    phi[0] = phi[1] = -1
    for i in range(n):
        s = 0 if plink[i] < nA else 1
        if i < plo[s]:
            plo[s] = i
        phi[s] = i


@jit(cache=True, nogil=True, inline="always")
def _unload_dense(W1, W2, r, lo, hi, act, load, cap, count, stale, s):  # pragma: no cover - compiled
    """Freeze at level ``s`` the flows of a dense link (row ``r`` of each matrix, in ``W1``'s
    then ``W2``'s order) onto the other side's links ``lo <= l < hi``."""
    for k in range(W1.shape[0]):
        _unload_row(W1[k, r], act[lo:hi], load[lo:hi], cap[lo:hi], count[lo:hi], stale[lo:hi], s)
    for k in range(W2.shape[0]):
        _unload_row(W2[k, r], act[lo:hi], load[lo:hi], cap[lo:hi], count[lo:hi], stale[lo:hi], s)


@jit(cache=True, nogil=True, inline="always")
def _unload_dense_v(W1, W2, r, o0, n_o, vo, vself, act, load, cap, count, stale, s, plink, n, bstale,
                    pos):  # pragma: no cover - compiled
    """As :func:`_unload_dense` where each dense flow also crosses its GPUs' virtual links: row
    ``r``'s flows leave the other side's links ``o0 <= l < o0 + n_o`` and their virtual links
    ``vo``, unless this side's virtual link ``vself`` froze them already; the blocks of every
    link touched become stale."""
    if act[vself] == 0.0:
        return
    for k in range(W1.shape[0]):
        _unload_row_v(W1[k, r], o0, act, load, cap, count, stale, s, vo, vself)
    for k in range(W2.shape[0]):
        _unload_row_v(W2[k, r], o0, act, load, cap, count, stale, s, vo, vself)
    _stale_range(plink, n, o0, o0 + n_o, bstale)
    _stale_range(plink, n, vo.min(), vo.max() + 1, bstale)
    p = pos[vself]
    if p >= 0:
        bstale[p >> _BLOCK_SHIFT] = True


@jit(cache=True, nogil=True)
def _unload_row(row, act, load, cap, count, stale, s):  # pragma: no cover - compiled
    """Freeze at level ``s`` the live flows of one link (``row``: their weights on the other
    side's links, 0 for none) onto the other side's links not yet processed (``act`` 1.0),
    branch-free: a masked or absent flow takes off exact zeros."""
    for t in range(row.shape[0]):
        w = row[t] * act[t]
        load[t] -= w
        cap[t] -= w * s
        hit = w > 0.0
        count[t] -= hit
        stale[t] |= hit


@jit(cache=True, nogil=True)
def _fill_dense(W, WT, la, lb, capacity):  # pragma: no cover - compiled
    """:func:`_fill_levels` for a bipartite flow set given densely: flow (i, j) crosses link
    ``la[i]`` and link ``lb[j]`` (no others with finite capacity) with weight ``W[i, j]`` on
    both (0: no live flow); ``WT`` is ``W.T`` (contiguous). Local link ``u``: ``la[u]`` for
    ``u < nA``, else ``lb[u - nA]``. The loads are summed in column order, the rounds, ties
    (in link id order), lazy shares and unloads are those of :func:`_fill_levels`, so with each
    link's flows in that order the levels and the processing order are the same. Returns per
    local link its level (inf: never saturated) and order."""
    nA, nB = W.shape
    N = nA + nB
    lid = np.empty(N, dtype=np.int64)
    lid[:nA] = la
    lid[nA:] = lb
    load = np.zeros(N + 1)
    count = np.zeros(N + 1, dtype=np.int64)
    cap = np.empty(N + 1)
    for u in range(N):
        cap[u] = capacity[lid[u]]
    cap[N] = np.inf
    _row_col_sums(W, load, count, nA)  # each link's flows in partner order
    srt = np.argsort(lid)
    pos, psh, plink, n = _share_array(srt, count, cap, load)
    level = np.full(N, np.inf)
    big = np.iinfo(np.int64).max
    porder = np.full(N, big, dtype=np.int64)
    proc = np.zeros(N + 1, dtype=np.bool_)
    act = np.ones(N)  # 1.0 while a link is not processed: unloads onto it are multiplied by it
    stale = np.zeros(N + 1, dtype=np.bool_)
    picked = np.empty(N, dtype=np.int64)
    plo = np.zeros(2, dtype=np.int64)  # per side (A, B): the range of its links' positions
    phi = np.zeros(2, dtype=np.int64)
    _side_ranges(plink, n, nA, plo, phi)
    nblk = N // _BLOCK + 1
    bmin = np.empty(nblk)
    bdirty = np.ones(nblk, dtype=np.bool_)
    bstale = np.zeros(nblk, dtype=np.bool_)
    dead = 0
    seq = 0
    while n > 0:
        if 2 * dead > n:
            n = _compact(n, psh, plink, pos, bdirty, bstale)
            dead = 0
            _side_ranges(plink, n, nA, plo, phi)
            if n == 0:
                break
        s_min, n_pick, d = _next_level(n, psh, plink, stale, proc, cap, load, count, bmin, bdirty,
                                       bstale, picked)
        dead += d
        if s_min == np.inf:
            break
        for i in range(n_pick):
            u = picked[i]
            proc[u] = True
            act[u] = 0.0
            level[u] = s_min
            porder[u] = seq
            seq += 1
            if u < nA:
                _unload_row(W[u], act[nA:N], load[nA:N], cap[nA:N], count[nA:N], stale[nA:N], s_min)
                lo, hi = plo[1], phi[1]
            else:
                _unload_row(WT[u - nA], act[:nA], load[:nA], cap[:nA], count[:nA], stale[:nA], s_min)
                lo, hi = plo[0], phi[0]
            for b in range(lo >> _BLOCK_SHIFT, (hi >> _BLOCK_SHIFT) + 1):  # the other side's blocks
                bstale[b] = True
        dead += _retire(n_pick, picked, pos, psh, bdirty)
    return level, porder


@jit(cache=True, nogil=True, inline="always")
def first_saturated_level(links, f, porder, level):  # pragma: no cover - compiled
    """Flow ``f``'s rate: the level of the first of its links (row ``f`` of ``links``) to
    saturate in the filling order ``porder`` (inf if none does). Inlined into its callers: a
    call per flow cost three times the rest of the per-class pass at a million flows."""
    best = np.iinfo(np.int64).max
    r = np.inf
    for h in range(links.shape[1]):
        k = links[f, h]
        o = porder[k]
        if o < best:
            best = o
            r = level[k]
    return r


@jit(cache=True, nogil=True)
def _rates_from_levels(links_fh, alive, level, porder, rates):  # pragma: no cover - compiled
    """Each live flow's rate: the level of the first of its links to saturate (inf if none)."""
    for f in range(links_fh.shape[0]):
        rates[f] = first_saturated_level(links_fh, f, porder, level) if alive[f] else 0.0


_NO_W = np.ones((1, 1))


class LinkEntries:
    """Link -> entry index of a flow-major (F, H) ``links`` matrix, for repeated solves.

    Entries ``starts[l]:starts[l+1]`` are the (flow, hop) pairs on finite link ``l``; each keeps
    its flow (``flow``), the flow's other finite links (``oth``), its factor (``fac``), its hop
    multiplicities with ``weight`` (``mw``) and whether the flow is still in the solve
    (``alive``; :meth:`kill` drops finished flows in O(their hops)). ``pos[f, h]``: the entry of
    flow ``f``'s hop ``h`` (-1 on an infinite link). Built for one capacity vector (which links
    are infinite) and one ``weight``.
    """

    __slots__ = ("starts", "flow", "oth", "fac", "mw", "has_w", "pos", "alive", "_flows_alive")

    def __init__(self, links_fh: np.ndarray, factor: np.ndarray, capacity: np.ndarray,
                 weight: np.ndarray | None = None, skip: np.ndarray | None = None) -> None:
        links_fh = np.ascontiguousarray(links_fh)
        if links_fh.size >= 2**31:
            raise ValueError(f"links: expected fewer than 2**31 (flow, hop) entries, got {links_fh.size}")
        self.has_w = weight is not None
        w = np.ascontiguousarray(weight, dtype=np.float64) if self.has_w else _NO_W
        # skip: finite links that get no entries but stay among the flows' other links (links
        # whose flows a dense set of the filling stands for, _fill_levels)
        sk = np.zeros(capacity.shape[0], dtype=np.bool_) if skip is None else np.ascontiguousarray(skip, dtype=np.bool_)
        self.starts, self.flow, self.oth, self.fac, self.mw, self.pos = _entries_build(
            links_fh, np.ascontiguousarray(factor, dtype=np.float64), w, self.has_w,
            np.ascontiguousarray(capacity, dtype=np.float64), sk)
        self.alive = np.ones(self.flow.size, dtype=np.bool_)
        self._flows_alive: np.ndarray | None = None  # per flow, once set_alive has been called

    def kill(self, flows: np.ndarray) -> None:
        """Drop flows (indices) from later solves."""
        flows = np.asarray(flows, dtype=np.int64)
        _entries_kill(self.pos, flows, self.alive)
        if self._flows_alive is not None:
            self._flows_alive[flows] = False

    def set_alive(self, alive: np.ndarray) -> None:
        """Make exactly the flows ``alive`` (F,) bool take part."""
        self.alive = np.ascontiguousarray(alive[self.flow])
        self._flows_alive = np.array(alive, dtype=np.bool_)

    def update_alive(self, alive: np.ndarray) -> None:
        """:meth:`set_alive`, in O(flows) plus the hops of the flows that left since the last
        call when none came back (between solves flows only finish): the same entry flags."""
        last = self._flows_alive
        if last is None or last.shape != alive.shape or np.any(alive & ~last):
            self.set_alive(alive)
            return
        gone = np.flatnonzero(last & ~alive)
        if gone.size:
            self.kill(gone)


def _widen(oth: np.ndarray, width: int, pad: int) -> np.ndarray:
    out = np.full((oth.shape[0], width), pad, dtype=np.int32)
    out[:, : oth.shape[1]] = oth
    return out


_NO_DENSE = np.zeros((0, 1, 1))
_NO_V = np.zeros(0, dtype=np.int64)


def link_levels(index: LinkEntries, wire: np.ndarray, capacity: np.ndarray,
                other: LinkEntries | None = None, dense: tuple | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(level, order) of every link for the live flows of ``index`` (and of ``other``, a second
    flow set on the same links, without weights): the progressive filling described above.

    ``dense``: optionally ``(Wa, WTa, Wb, WTb, a0, b0)``, bipartite flow sets given as weight
    matrices (:func:`_fill_levels`) that belong to ``index`` (``Wa``, (K, nA, nB)) and to
    ``other`` (``Wb``), on links ``a0 .. a0 + nA - 1`` and ``b0 .. b0 + nB - 1`` which no entry
    of either index crosses (they were built with those links infinite); or ``(Wa, WTa, Wb,
    WTb, a0, b0, va, vb)``: every dense flow also crosses link ``va[row]`` and ``vb[column]``
    (ranges of link ids), where ``index`` (built with the dense links in ``skip``) has their
    entries, and ``Wa`` then ``Wb`` are all ``index``'s (``other`` is None)."""
    L = capacity.shape[0]
    if dense is None:
        dense = (_NO_DENSE, _NO_DENSE, _NO_DENSE, _NO_DENSE, -1, -1)
    if len(dense) == 6:
        dense = tuple(dense) + (_NO_V, _NO_V)
    width = index.oth.shape[1]
    if other is None:
        ob = (np.zeros(L + 1, dtype=np.int64), np.empty((0, width), dtype=np.int32), np.empty(0),
              np.empty(0, dtype=np.bool_))
    else:
        if other.has_w:
            raise ValueError("other: expected a flow set without weights")
        width = max(width, other.oth.shape[1])
        ob = (other.starts, other.oth if other.oth.shape[1] == width else _widen(other.oth, width, L), other.fac,
              other.alive)
        if index.oth.shape[1] < width:
            index.oth = _widen(index.oth, width, L)
    return _fill_levels(index.starts, index.oth, index.fac, index.mw, index.has_w, index.alive, *ob,
                        np.ascontiguousarray(wire, dtype=np.bool_), np.ascontiguousarray(capacity, dtype=np.float64),
                        *dense)


def rates_from_levels(links_fh: np.ndarray, alive: np.ndarray, level: np.ndarray, order: np.ndarray,
                      out: np.ndarray | None = None) -> np.ndarray:
    """Rates of flows ``links_fh`` (0 where not ``alive``) from :func:`link_levels`."""
    rates = np.empty(links_fh.shape[0]) if out is None else out
    _rates_from_levels(links_fh, alive, level, order, rates)
    return rates


# kept under its former name: the flow-major index
FlowMajorIndex = LinkEntries


def maxmin_rates_fm(
    links_fh: np.ndarray,
    factor: np.ndarray,
    wire: np.ndarray,
    capacity: np.ndarray,
    *,
    alive: np.ndarray | None = None,
    index: LinkEntries | None = None,
    weight: np.ndarray | None = None,
    dense: tuple | None = None,
) -> np.ndarray:
    """:func:`maxmin_rates` for a flow-major (F, H) ``links`` matrix (and (F, H) ``weight``)
    through the link-level solver (compiled; plain Python under NEONIC_NO_NUMBA). A given
    ``index`` must have been built from the same links, factors, capacities and weights.
    ``dense``: flows given as weight matrices (:func:`link_levels`; ``index`` leaves their
    links out)."""
    n_flows = links_fh.shape[0]
    if n_flows == 0:
        return np.zeros(0)
    if index is None:
        index = LinkEntries(links_fh, factor, capacity, weight)
    a = np.ones(n_flows, dtype=bool) if alive is None else np.ascontiguousarray(alive, dtype=bool)
    index.update_alive(a)
    level, order = link_levels(index, wire, capacity, dense=dense)
    return rates_from_levels(np.ascontiguousarray(links_fh), a, level, order)


def maxmin_rates_parts(
    big_links: np.ndarray,
    big_factor: np.ndarray,
    big_alive: np.ndarray,
    big_index: LinkEntries | None,
    links_fh: np.ndarray,
    factor: np.ndarray,
    wire: np.ndarray,
    capacity: np.ndarray,
    *,
    index: LinkEntries | None = None,
    alive: np.ndarray | None = None,
    dense: tuple | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Max-min rates of two flow sets solved together (same result as one concatenated solve):
    a large one (``big_*``, its :class:`LinkEntries` reused across solves, ``big_alive``
    marking its live flows) and a second one, built on the fly unless its ``index`` (of the
    same ``links_fh``, ``factor`` and capacities) is given, ``alive`` marking its live flows
    (default: all). ``dense``: bipartite flow sets of both as weight matrices (:func:`link_levels`;
    the indexes then leave their links out). Returns (rates big, rates second); dead flows get 0."""
    if big_index is None:
        big_index = LinkEntries(big_links, big_factor, capacity)
    big_index.update_alive(np.ascontiguousarray(big_alive, dtype=bool))
    links_fh = np.ascontiguousarray(links_fh.astype(big_links.dtype, copy=False))
    small = LinkEntries(links_fh, factor, capacity) if index is None else index
    live = np.ones(links_fh.shape[0], dtype=bool) if alive is None else np.ascontiguousarray(alive, dtype=bool)
    if alive is not None:
        small.update_alive(live)
    level, order = link_levels(big_index, wire, capacity, other=small, dense=dense)
    ra = rates_from_levels(big_links, np.ascontiguousarray(big_alive, dtype=bool), level, order)
    rb = rates_from_levels(links_fh, live, level, order)
    return ra, rb


def maxmin_rates_fast(links, factor, wire, capacity, *, alive=None, index=None):
    """:func:`maxmin_rates` (hop-major input) through the compiled solver."""
    return maxmin_rates_fm(np.ascontiguousarray(links.T), factor, wire, capacity, alive=alive)
