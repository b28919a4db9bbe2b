"""Flow classes: the exact symmetry of a flow set, for a max-min solve over classes, not flows.

Partition the flows and the links into classes such that (1) every flow of a flow class crosses
the same number of links of each link class, and (2) every link of a link class is crossed by
the same number of flows of each flow class (an *equitable partition* of the bipartite
flow-link graph), starting from flows coloured by size (so a class also finishes together) and
links coloured by capacity and framing (``wire``). Then the max-min fair allocation gives every
flow of a class the same rate, and it is the allocation of the *quotient* problem: one variable
per flow class ``c``, one constraint per link class ``k`` with weight ``n[c, k] * w`` where
``n[c, k]`` is the number of class-``c`` flows on any one link of class ``k`` and ``w`` a flow's
load per unit rate on such a link (proof: the lifted quotient solution is feasible, saturates
the same links, and every flow keeps a saturated bottleneck on which no flow is faster -- the
characterisation of the unique max-min allocation). Deleting whole classes (finished flows)
keeps a partition equitable, so one partition serves a group for its whole life.

The partition is computed by colour refinement, exact: a signature is compared element by
element (a hash only finds the candidates), never identified by its hash alone. Large flow sets
refine in a compiled kernel (numba; 0.3 s CPU for a 1M-flow AlltoAllv beside a 7,168-flow group
with the GPUs' virtual links, against 1.6 s in numpy), small ones and ``NEONIC_NO_NUMBA`` in
numpy; both give the same classes and ids (tested). Where symmetry is broken (uneven AlltoAllv
sizes, a slowed link) the partition is fine and the caller falls back to one class per flow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from neonic.sim.compiled import HAVE_NUMBA, jit

__all__ = ["FlowClasses", "equitable_classes", "identity_classes"]


@dataclass
class FlowClasses:
    """A partition of a group's flows: ``cls[f]`` its class; per class the quotient entries.

    ``members`` / ``starts``: flows of class c are ``members[starts[c]:starts[c+1]]``.
    ``q_links`` (C, Q) link-class index per quotient entry (padded with ``n_lclasses``, the
    infinite pad), ``q_weight`` (C, Q) its multiplicity (flows of that class per link of that link
    class, times hops), ``lclass_capacity`` (K+1,) capacity of each link class (pad: inf),
    ``lclass_wire`` (K+1,) whether it carries framing. ``identity``: one class per flow (the
    per-flow solve). ``vlinks``: with ``ends`` (:func:`equitable_classes`), per endpoint the
    link class of its virtual transmit link and of its receive link (infinite in
    ``lclass_capacity``: the throttled solve gives them their capacities); else None.
    ``link_class``: per link its class (an equitable partition's; None for the identity).
    """

    cls: np.ndarray
    members: np.ndarray
    starts: np.ndarray
    q_links: np.ndarray
    q_weight: np.ndarray | None
    lclass_capacity: np.ndarray
    lclass_wire: np.ndarray
    identity: bool
    vlinks: tuple[np.ndarray, np.ndarray] | None = None
    link_class: np.ndarray | None = None

    @property
    def n_classes(self) -> int:
        return int(self.starts.size - 1)


_COMPILED_MIN_HOPS = 1 << 16  # smaller hop tables refine in numpy (the same ids): the compiled
# kernel's first call in a process loads it from numba's cache (0.15 s), which small groups never repay
_SAMPLE = 8192  # flows looked at before counting the colours of all of them
_DIRECT_KEYS = 1 << 25  # keys below this are ranked by a presence table (O(n), no sort)


def _direct(top: int, n: int) -> bool:
    """Whether a table of ``top`` entries is cheaper than sorting ``n`` keys (a 32M-entry table
    for a few thousand keys cost 0.3 s per call in a 128-GPU cluster run)."""
    return top <= min(_DIRECT_KEYS, 16 * n + 4096)


def _dense(key: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense ids 0..n-1 of ``key`` values, in increasing key order."""
    if key.size and key.min() == key.max():
        return np.zeros(key.size, dtype=np.int64), 1
    if key.size and key.dtype.kind in "iu" and 0 <= key.min() and _direct(int(key.max()) + 1, key.size):
        present = np.zeros(int(key.max()) + 1, dtype=bool)
        present[key] = True
        rank = np.cumsum(present) - 1
        return rank[key].astype(np.int64, copy=False), int(rank[-1] + 1)
    if HAVE_NUMBA and key.size >= _HASHED_MIN and key.ndim == 1 and (
            key.dtype == np.int64 or (key.dtype == np.float64 and np.isfinite(key).all())):
        found = _dense_hashed(key)
        if found is not None:
            return found
    uniq, inv = np.unique(key, return_inverse=True)
    return inv.astype(np.int64, copy=False).ravel(), int(uniq.size)


_HASHED_MIN = 1 << 16  # keys from this many on are ranked through a hash table when few are distinct


def _unique_counts(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(key, return_counts=True)`` of int64 keys; many keys with at most a quarter
    distinct through a hash table (the distinct values sorted, not all keys: an AlltoAllv's
    16.8M (endpoint, class) keys at 4096 GPUs, 2M distinct, cost 1.3 s to sort)."""
    if HAVE_NUMBA and key.size >= _HASHED_MIN and key.ndim == 1 and key.dtype == np.int64:
        ok, uniq, slot = _distinct_kernel(np.ascontiguousarray(key), key.size // 4)
        if ok:
            count = np.bincount(slot, minlength=uniq.size)
            order = np.argsort(uniq, kind="stable")
            return uniq[order], count[order]
    return np.unique(key, return_counts=True)


def _dense_hashed(key: np.ndarray) -> tuple[np.ndarray, int] | None:
    """:func:`_dense` of many int64 or finite float64 keys with few distinct values (an
    AlltoAllv's 16.8M sizes at 4096 GPUs, a few hundred distinct: np.unique's sort of them cost
    3.6 s CPU): the distinct values found through a hash table (by bit pattern, -0.0 taken as
    0.0 so that equal values share one), sorted, and each key's rank looked up: np.unique's
    ids. None where more than ``size // 8`` values are distinct (a sort is as good then)."""
    flt = key.dtype == np.float64
    # floats by bit pattern, -0.0 read as 0.0 in the kernel (what ``key + 0.0`` gives, without
    # a copy of the keys)
    ok, uniq, slot = _distinct_kernel(np.ascontiguousarray(key).view(np.int64), key.size // 8, flt)
    if not ok:
        return None
    values = uniq.view(np.float64) if flt else uniq
    rank = np.empty(uniq.size, dtype=np.int64)
    rank[np.argsort(values, kind="stable")] = np.arange(uniq.size, dtype=np.int64)
    return _ranked(slot, rank), int(uniq.size)


@jit(cache=True, nogil=True)
def _ranked(slot, rank):  # pragma: no cover - compiled
    """``rank[slot]``, written over ``slot`` (a fresh array of the caller's): no second array of
    the keys' size."""
    for i in range(slot.shape[0]):
        slot[i] = rank[slot[i]]
    return slot


def _count_pairs(key: np.ndarray, radix: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct values of ``key`` (sorted) and their counts; a counting pass for small ranges."""
    top = int(key.max()) + 1 if key.size else 0
    if _direct(top, key.size):
        cnt = np.bincount(key, minlength=top)
        uk = np.flatnonzero(cnt)
        return uk, cnt[uk]
    return np.unique(key, return_counts=True)


def _row_ids(cols: list[np.ndarray], radices: list[int]) -> tuple[np.ndarray, int]:
    """Dense ids of the rows of integer columns (mixed radix, compressed when it would overflow)."""
    key = cols[0].astype(np.int64)
    rad = radices[0]
    for c, r in zip(cols[1:], radices[1:]):
        if rad * r >= 2**62:
            key, rad = _dense(key)
        key = key * r + c
        rad *= r
    return _dense(key)


def identity_classes(links_fh: np.ndarray, capacity: np.ndarray, wire: np.ndarray, *,
                     iota: np.ndarray | None = None) -> FlowClasses:
    """One class per flow: the quotient is the per-flow problem itself (link classes = links).

    ``cls``, ``members`` and ``starts`` are views of one int64 ``0, 1, 2, ...`` array (nobody
    writes them); ``iota``: such an array of at least ``F + 1`` entries to take them from (a
    network shares one among its groups: two fewer 134 MB arrays to fill per 16.8M-flow
    group at 4096 GPUs), else a fresh one."""
    F = links_fh.shape[0]
    if iota is None or iota.shape[0] < F + 1:
        iota = np.arange(F + 1, dtype=np.int64)
    ar = iota[:F]
    return FlowClasses(cls=ar, members=ar, starts=iota[:F + 1],
                       q_links=links_fh, q_weight=None, lclass_capacity=capacity,
                       lclass_wire=wire, identity=True)


def equitable_classes(links_fh: np.ndarray, flow_color: np.ndarray, capacity: np.ndarray, wire: np.ndarray,
                      *, max_fraction: float = 0.25, max_rounds: int = 32,
                      ends: tuple[np.ndarray, np.ndarray, int] | None = None) -> FlowClasses:
    """The coarsest equitable partition refining ``flow_color`` (flows) and (capacity, wire) (links).

    links_fh: (F, H) link per hop, padded with the last link (infinite capacity).
    Falls back to :func:`identity_classes` once the flow classes exceed ``max_fraction * F``
    (too little symmetry to pay for the quotient).
    ends: optionally (each flow's source endpoint, destination endpoint, the number of
    endpoints): every flow also crosses its source's virtual transmit link and its
    destination's virtual receive link (the throttled solve's GPU caps), which are partitioned
    with the links (transmit and receive links apart from each other and from the real links);
    the result's ``vlinks`` names their classes, whose capacities it leaves infinite. Two more
    elements, per endpoint an int colour >= 0 of its transmit and of its receive link, start
    those links apart by colour (which GPUs a throttle caps, so that GPUs capped and GPUs left
    unlimited never share a class).
    """
    if ends is not None:
        return _with_ends(links_fh, flow_color, capacity, wire, ends, max_fraction, max_rounds)
    F, H = links_fh.shape
    n_links = capacity.shape[0]  # includes the pad (last)
    pad = n_links - 1
    if F == 0:
        return identity_classes(links_fh, capacity, wire)
    limit = max(1, int(max_fraction * F))
    flow_color = np.asarray(flow_color)
    if F > 16 * _SAMPLE:
        # a cheap look first: when nearly every flow of an evenly spaced sample has its own
        # colour (uneven AlltoAllv sizes), the classes would be about as many as the flows;
        # this only picks the cheaper of two exact solves, never a result
        sample = flow_color[:: F // _SAMPLE]
        if np.unique(sample).size > 0.9 * sample.size:
            return identity_classes(links_fh, capacity, wire)
    fc, nf = _dense(flow_color)
    if nf > limit:
        return identity_classes(links_fh, capacity, wire)
    cap_id, ncap = _dense(np.where(np.isfinite(capacity), capacity, -1.0))
    lc, nl = _row_ids([cap_id, wire.astype(np.int64)], [ncap, 2])
    lc[pad] = nl  # the pad is a class of its own
    nl += 1
    compiled = HAVE_NUMBA and F * H >= _COMPILED_MIN_HOPS
    refine = _refine_compiled if compiled else _refine_np
    out = refine(links_fh, fc, nf, lc, nl, pad, limit, max_rounds)
    if out is None:
        return identity_classes(links_fh, capacity, wire)
    fc, nf, lc, nl = out
    # the pad link class goes last with index K (infinite)
    pad_class = lc[pad]
    remap = np.arange(nl)
    remap[pad_class] = nl - 1
    remap[nl - 1] = pad_class
    lc = remap[lc]
    K = nl - 1
    link_count = np.bincount(lc, minlength=nl)
    lcap = np.empty(nl)
    lwire = np.zeros(nl, dtype=bool)
    lcap[lc] = capacity
    lwire[lc] = wire
    lcap[K] = np.inf
    lwire[K] = False
    # quotient entries: per flow class c, per link class k: hops of class-c flows onto class-k
    # links divided by the links of class k = class-c flows per class-k link; the partition is
    # equitable, so the hops of all class-c flows are its size times those of its first flow
    order = _by_class(fc, nf) if compiled else np.argsort(fc, kind="stable")
    size = np.bincount(fc, minlength=nf)
    starts = np.zeros(nf + 1, dtype=np.int64)
    np.cumsum(size, out=starts[1:])
    first_links = links_fh[order[starts[:-1]]].ravel().astype(np.int64)
    own = first_links != pad
    key = np.repeat(np.arange(nf, dtype=np.int64), H)[own] * nl + lc[first_links[own]]
    uk, cnt = _count_pairs(key, nl)
    qc = uk // nl
    qk = uk % nl
    cnt = cnt * size[qc]
    n_per_link = cnt / link_count[qk]
    per_class = np.bincount(qc, minlength=nf)
    Q = max(int(per_class.max()) if per_class.size else 1, 1)
    q_links = np.full((nf, Q), K, dtype=np.int32)
    q_weight = np.zeros((nf, Q))
    first = np.searchsorted(qc, np.arange(nf))
    slot = np.arange(qc.size) - first[qc]
    q_links[qc, slot] = qk
    q_weight[qc, slot] = n_per_link
    return FlowClasses(cls=fc, members=order.astype(np.int64), starts=starts, q_links=q_links, q_weight=q_weight,
                       lclass_capacity=lcap, lclass_wire=lwire, identity=False, link_class=lc)


def _with_ends(links_fh: np.ndarray, flow_color: np.ndarray, capacity: np.ndarray, wire: np.ndarray,
               ends: tuple[np.ndarray, np.ndarray, int], max_fraction: float, max_rounds: int) -> FlowClasses:
    """:func:`equitable_classes` with two virtual hops per flow: links ``0 .. L-2`` stay, the
    endpoints' transmit links follow, then their receive links, then the pad (coloured by
    negative capacities, which no real link has, so each kind, and each endpoint colour of
    ``ends``, is a class set of its own)."""
    src, dst, E = ends[:3]
    tx_colour, rx_colour = (ends[3], ends[4]) if len(ends) > 3 else (np.zeros(E, dtype=np.int64),) * 2
    L = capacity.shape[0]
    pad = L - 1
    new_pad = L - 1 + 2 * E
    dt = np.int32 if new_pad < 2**31 - 1 else np.int64
    ext = np.empty((links_fh.shape[0], links_fh.shape[1] + 2), dtype=dt)
    if HAVE_NUMBA:  # one pass (16.8M flows at 4096 GPUs), the same integers
        _extend_hops(np.ascontiguousarray(links_fh), pad, new_pad, np.asarray(src), np.asarray(dst), pad, pad + E, ext)
    else:
        ext[:, :-2] = np.where(links_fh == pad, new_pad, links_fh)
        ext[:, -2] = pad + np.asarray(src)
        ext[:, -1] = pad + E + np.asarray(dst)
    # transmit colours -2, -4, ..., receive colours -3, -5, ...: no real link's (>= 0, inf -> -1)
    cap = np.concatenate([capacity[:-1], -2.0 - 2.0 * np.asarray(tx_colour, dtype=np.float64),
                          -3.0 - 2.0 * np.asarray(rx_colour, dtype=np.float64), capacity[-1:]])
    wr = np.concatenate([wire[:-1], np.zeros(2 * E, dtype=bool), wire[-1:]])
    cl = equitable_classes(ext, flow_color, cap, wr, max_fraction=max_fraction, max_rounds=max_rounds)
    if cl.identity:
        return cl
    virtual = cl.lclass_capacity < 0  # the virtual links' classes: infinite until throttled
    cl.lclass_capacity[virtual] = np.inf
    cl.vlinks = (cl.link_class[pad:pad + E], cl.link_class[pad + E:pad + 2 * E])
    return cl


@jit(cache=True, nogil=True)
def _extend_hops(links_fh, pad, new_pad, src, dst, tx0, rx0, ext):  # pragma: no cover - compiled
    """:func:`_with_ends`'s hops: each flow's links (the pad renamed ``new_pad``), then its
    source's transmit link ``tx0 + src`` and its destination's receive link ``rx0 + dst``."""
    F, H = links_fh.shape
    for f in range(F):
        for h in range(H):
            k = links_fh[f, h]
            ext[f, h] = new_pad if k == pad else k
        ext[f, H] = tx0 + src[f]
        ext[f, H + 1] = rx0 + dst[f]


# _STABLE_LINKS: why a round whose links keep their partition ends the refinement, from the
# second round on, without the flows' pass: the flows' colours of the round before already
# separate flows by the sorted colours of their hops under the links' partition of that round;
# the new link colours are a renaming of it, so the flows' pass would give every flow the row
# (its colour, the same hop colours renamed), ranked in its colour's order: the same ids. The
# result is the one the full round gives (the flows' ids unchanged, the links' new ids), a
# flows' pass sooner (16.8M flows at 4096 GPUs).
#
# _STABLE_FLOWS: why a round whose flows keep their partition (as many classes as before: a
# refinement with as many classes is the same partition) ends the refinement there, a links'
# pass sooner (a third of the compiled refinement's time in a joint partition at 4096 GPUs):
# the next round's links would refine this round's link partition L by the multisets of the
# flows' colours, and those multisets split links as the ones of the flows' partition before
# this round did, which L already refines; so the next links' partition is L, their ids (in
# order of first appearance, idle links after by old colour, both orders unchanged) this
# round's ids, and that round would end by _STABLE_LINKS with this round's flows and links.
# Taken only where such a next round would run (not after the last of ``max_rounds``).


def _refine_np(links_fh: np.ndarray, fc: np.ndarray, nf: int, lc: np.ndarray, nl: int, pad: int, limit: int,
               max_rounds: int) -> tuple[np.ndarray, int, np.ndarray, int] | None:
    """Colour refinement in rounds (numpy): per round the links take (old colour, sorted multiset
    of the colours of the flows crossing them; ids in order of first appearance, idle links after
    by old colour), then the flows (old colour, sorted colours of their hops; ids in
    lexicographic order), until neither count grows. None where the flow classes exceed
    ``limit`` or ``max_rounds`` pass without convergence (the caller solves per flow)."""
    F, H = links_fh.shape
    n_links = lc.shape[0]
    flat_links = links_fh.ravel().astype(np.int64)
    real = flat_links != pad  # the pad's hops are no entries
    ent_link = flat_links[real]
    ent_flow = np.repeat(np.arange(F, dtype=np.int64), H)[real]
    for rnd in range(max_rounds):
        # links: (old colour, sorted multiset of flow colours crossing it)
        key = ent_link * nf + fc[ent_flow]
        uk, cnt = _count_pairs(key, nf)
        lk = uk // nf
        fk = uk % nf
        used = np.unique(lk)  # links no flow crosses keep (old colour, nothing)
        bounds = np.searchsorted(lk, np.append(used, n_links))
        sig: dict[tuple[int, bytes], int] = {}
        new_lc = np.empty(n_links, dtype=np.int64)
        pairs = np.stack([fk, cnt], axis=1)
        for i, link in enumerate(used.tolist()):
            s = (int(lc[link]), pairs[bounds[i]:bounds[i + 1]].tobytes())
            new_lc[link] = sig.setdefault(s, len(sig))
        idle = np.ones(n_links, dtype=bool)
        idle[used] = False
        if idle.any():
            ids, n_idle = _dense(lc[idle])
            new_lc[idle] = len(sig) + ids
        else:
            n_idle = 0
        n_new_l = len(sig) + n_idle
        if rnd and n_new_l == nl:  # the links kept their partition: so do the flows (_STABLE_LINKS)
            return fc, nf, new_lc, n_new_l
        # flows: (old colour, sorted link colours of its hops)
        hop_colors = np.sort(new_lc[links_fh], axis=1)
        new_fc, n_new_f = _row_ids([fc] + [hop_colors[:, h] for h in range(H)], [nf] + [n_new_l] * H)
        if n_new_f > limit:
            return None
        # the flows kept their partition: so do the links next round (_STABLE_FLOWS)
        stable = n_new_f == nf and (n_new_l == nl or rnd + 1 < max_rounds)
        fc, nf, lc, nl = new_fc, n_new_f, new_lc, n_new_l
        if stable:
            break
    else:  # pragma: no cover - refinement converges in at most F + L rounds; bounded for safety
        return None
    return fc, nf, lc, nl


# ------------------------------------------------------------------ compiled refinement
# The same rounds as :func:`_refine_np` with the same ids, one pass per round over the link-major
# entries and the flows; signatures are found in an open-addressing table by a hash and then
# compared element by element, so a hash collision never merges two classes.
_MASK = (1 << 63) - 1
_NEG_ZERO = -(1 << 63)  # the int64 view of -0.0's bits
_MUL = 1099511628211  # FNV-1 64-bit prime: a multiplier that spreads the bits; any odd one is exact


@jit(cache=True, nogil=True)
def _hash_seq(head, seq, lo, hi):  # pragma: no cover - compiled (run as Python by NEONIC_NO_NUMBA)
    h = (int(head) * _MUL + (hi - lo)) & _MASK
    for j in range(lo, hi):
        h = ((h ^ int(seq[j])) * _MUL) & _MASK
    return h ^ (h >> 31)


@jit(cache=True, nogil=True)
def _mix(v):  # pragma: no cover - compiled
    h = ((int(v) + 1) * _MUL) & _MASK
    h ^= h >> 29
    return (h * _MUL) & _MASK


@jit(cache=True, nogil=True)
def _lexsort_rows(rows, n):  # pragma: no cover - compiled
    """Order of the first ``n`` rows of ``rows`` in lexicographic order, ties by row index
    (stable LSD radix: one stable sort per column, the last first). A column of one value is
    skipped (a stable sort leaves the order as it is); a column whose range of values is at
    most a few times ``n`` is sorted by counting (O(n + range), no comparisons: 0.05 s against
    0.66 s for a merge sort per column on 300k random rows of 10 columns), others by a stable
    merge sort. Every
    stable sort gives the same order, so the result is the one order of the rows."""
    perm = np.arange(n)
    keys = np.empty(n, dtype=np.int64)
    nxt = np.empty(n, dtype=np.int64)
    for col in range(rows.shape[1] - 1, -1, -1):
        lo = rows[0, col] if n else 0
        hi = lo
        for i in range(n):
            v = rows[perm[i], col]
            keys[i] = v
            if v < lo:
                lo = v
            if v > hi:
                hi = v
        if hi == lo:
            continue
        if hi - lo < 4 * n + 1024:
            count = np.zeros(hi - lo + 2, dtype=np.int64)
            for i in range(n):
                count[keys[i] - lo + 1] += 1
            for v in range(hi - lo + 1):
                count[v + 1] += count[v]
            for i in range(n):
                k = keys[i] - lo
                nxt[count[k]] = perm[i]
                count[k] += 1
            perm, nxt = nxt, perm
        else:
            perm = perm[np.argsort(keys, kind="mergesort")]
    return perm


@jit(cache=True, nogil=True)
def _link_round(fc, lc, nl, used, is_used, seg_starts, seg_flows, sv, tally, t_links):  # pragma: no cover
    """One round's links (:func:`_refine_np`): per link crossed (old colour, multiset of the
    colours of the flows crossing it), ids in order of first appearance, then the idle links by
    old colour. Returns (new link colours, their number). ``sv`` / ``tally``: scratch (per
    entry; per flow colour, all zero and left so)."""
    n_links = lc.shape[0]
    n_used = used.shape[0]
    lhash = np.empty(n_used, dtype=np.int64)
    lid = np.empty(n_used, dtype=np.int64)
    table = np.full(t_links, -1, dtype=np.int64)
    mask = t_links - 1
    n_sig = 0
    new_lc = np.empty(n_links, dtype=np.int64)
    for i in range(n_used):
        lo = seg_starts[i]
        hi = seg_starts[i + 1]
        own = lc[used[i]]
        acc = 0  # an order-free hash of the multiset: a sum of mixed elements
        for j in range(lo, hi):
            v = fc[seg_flows[j]]
            sv[j] = v
            acc = (acc + _mix(v)) & _MASK
        h = _mix(((int(own) * _MUL + (hi - lo)) & _MASK) ^ acc)
        lhash[i] = h
        k = h & mask
        while True:
            r = table[k]
            if r == -1:
                table[k] = i
                lid[i] = n_sig
                n_sig += 1
                break
            if lhash[r] == h and lc[used[r]] == own and seg_starts[r + 1] - seg_starts[r] == hi - lo:
                rlo = seg_starts[r]
                # the same sequence is the same multiset (links of one class often see their
                # flows' colours in one order): one pass, no counting
                same = True
                for j in range(hi - lo):
                    if sv[rlo + j] != sv[lo + j]:
                        same = False
                        break
                if not same:
                    # the same multiset: counts up for one, down for the other, all back to 0
                    for j in range(rlo, rlo + hi - lo):
                        tally[sv[j]] += 1
                    for j in range(lo, hi):
                        tally[sv[j]] -= 1
                    same = True
                    for j in range(rlo, rlo + hi - lo):
                        if tally[sv[j]] != 0:
                            same = False
                        tally[sv[j]] = 0
                    for j in range(lo, hi):
                        tally[sv[j]] = 0
                if same:
                    lid[i] = lid[r]
                    break
            k = (k + 1) & mask
        new_lc[used[i]] = lid[i]
    # idle links (no flow crosses them): after, by old colour
    present = np.zeros(nl, dtype=np.int64)
    for l in range(n_links):
        if not is_used[l]:
            present[lc[l]] = 1
    n_idle = 0
    for c in range(nl):
        if present[c]:
            present[c] = n_idle
            n_idle += 1
    for l in range(n_links):
        if not is_used[l]:
            new_lc[l] = n_sig + present[lc[l]]
    return new_lc, n_sig + n_idle


@jit(cache=True, nogil=True)
def _row_is(rep_rows, r, hop, H):  # pragma: no cover  (compiled; NEONIC_NO_NUMBA: Python)
    """Whether row ``r`` of ``rep_rows`` holds the hops ``hop[:H]`` after its head."""
    for h in range(H):
        if rep_rows[r, h + 1] != hop[h]:
            return False
    return True


@jit(cache=True, nogil=True)
def _flow_round(links_fh, fc, nf, new_lc, limit, prov, rep_rows, rep_hash):  # pragma: no cover
    """One round's flows (:func:`_refine_np`): per flow (old colour, sorted colours of its
    hops), the distinct rows in order of first appearance in ``rep_rows`` and each flow's in
    ``prov``. Returns (the number of distinct rows, or -1 once it exceeds ``limit``; rep_rows;
    rep_hash), the arrays grown as needed. The table holds the distinct rows only (few where
    there is symmetry) and doubles as they come; each old colour remembers its latest row,
    which most flows of it share (a row found there is the one the table would give)."""
    F, H = links_fh.shape
    hop = np.empty(H, dtype=np.int64)
    latest = np.full(nf, -1, dtype=np.int64)
    t_rows = 1024
    table = np.full(t_rows, -1, dtype=np.int64)
    mask = t_rows - 1
    n_rows = 0
    for f in range(F):
        for h in range(H):  # insertion sort: a few hops (numba's sort costs more per call)
            x = new_lc[links_fh[f, h]]
            j = h - 1
            while j >= 0 and hop[j] > x:
                hop[j + 1] = hop[j]
                j -= 1
            hop[j + 1] = x
        own = fc[f]
        r = latest[own]
        if r >= 0 and _row_is(rep_rows, r, hop, H):
            prov[f] = r
            continue
        hh = _hash_seq(own, hop, 0, H)
        k = hh & mask
        while True:
            r = table[k]
            if r == -1:
                if n_rows == rep_rows.shape[0]:
                    grown = np.empty((2 * n_rows, H + 1), dtype=np.int64)
                    grown[:n_rows] = rep_rows
                    rep_rows = grown
                    grown_h = np.empty(2 * n_rows, dtype=np.int64)
                    grown_h[:n_rows] = rep_hash[:n_rows]
                    rep_hash = grown_h
                rep_rows[n_rows, 0] = own
                for h in range(H):
                    rep_rows[n_rows, h + 1] = hop[h]
                rep_hash[n_rows] = hh
                table[k] = n_rows
                r = n_rows
                n_rows += 1
                if 2 * n_rows > t_rows:  # keep the load under one half
                    t_rows *= 4
                    table = np.full(t_rows, -1, dtype=np.int64)
                    mask = t_rows - 1
                    for q in range(n_rows):
                        kq = rep_hash[q] & mask
                        while table[kq] != -1:
                            kq = (kq + 1) & mask
                        table[kq] = q
                break
            if rep_hash[r] == hh and rep_rows[r, 0] == own and _row_is(rep_rows, r, hop, H):
                break
            k = (k + 1) & mask
        prov[f] = r
        latest[own] = r
        if n_rows > limit:
            return -1, rep_rows, rep_hash
    return n_rows, rep_rows, rep_hash


@jit(cache=True, nogil=True)
def _refine_kernel(links_fh, fc, nf, lc, nl, used, seg_starts, seg_flows, limit, max_rounds):  # pragma: no cover
    """Rounds of :func:`_refine_np` (:func:`_link_round`, :func:`_flow_round`, the rows ranked
    by :func:`_lexsort_rows`). Returns (status, fc, nf, lc, nl); status 0 where the flow
    classes exceed ``limit`` or ``max_rounds`` pass without convergence."""
    F, H = links_fh.shape
    n_links = lc.shape[0]
    n_used = used.shape[0]
    is_used = np.zeros(n_links, dtype=np.bool_)
    for i in range(n_used):
        is_used[used[i]] = True
    t_links = 1
    while t_links < 2 * n_used + 2:
        t_links *= 2
    prov = np.empty(F, dtype=np.int64)
    sv = np.empty(seg_flows.shape[0], dtype=np.int32)  # per entry (link-major) its flow's colour (< F)
    rep_rows = np.empty((1024, H + 1), dtype=np.int64)
    rep_hash = np.empty(1024, dtype=np.int64)
    for rnd in range(max_rounds):
        tally = np.zeros(nf, dtype=np.int64)
        new_lc, n_new_l = _link_round(fc, lc, nl, used, is_used, seg_starts, seg_flows, sv, tally, t_links)
        if rnd > 0 and n_new_l == nl:  # the links kept their partition: so do the flows (_STABLE_LINKS)
            return 1, fc, nf, new_lc, n_new_l
        n_rows, rep_rows, rep_hash = _flow_round(links_fh, fc, nf, new_lc, limit, prov, rep_rows, rep_hash)
        if n_rows < 0:
            return 0, fc, nf, lc, nl
        order = _lexsort_rows(rep_rows, n_rows)
        rank = np.empty(n_rows, dtype=np.int64)
        for i in range(n_rows):
            rank[order[i]] = i
        new_fc = np.empty(F, dtype=np.int64)
        for f in range(F):
            new_fc[f] = rank[prov[f]]
        stable = n_rows == nf and (n_new_l == nl or rnd + 1 < max_rounds)  # (_STABLE_FLOWS)
        fc = new_fc
        nf = n_rows
        lc = new_lc
        nl = n_new_l
        if stable:
            return 1, fc, nf, lc, nl
    return 0, fc, nf, lc, nl


def _refine_compiled(links_fh: np.ndarray, fc: np.ndarray, nf: int, lc: np.ndarray, nl: int, pad: int, limit: int,
                     max_rounds: int) -> tuple[np.ndarray, int, np.ndarray, int] | None:
    """:func:`_refine_np`'s rounds and ids, compiled (the entries grouped by link once). ``fc``
    is read, never written (int64 colours are taken as they are: no 134 MB copy at 4096 GPUs),
    and may come back as the result where the first round changes nothing."""
    links_fh = np.ascontiguousarray(links_fh)
    if links_fh.shape[0] >= 2**31:
        return _refine_np(links_fh, fc, nf, lc, nl, pad, limit, max_rounds)
    used, seg_starts, seg_flows = _by_link(links_fh, int(pad), lc.shape[0])
    status, fc, nf, lc, nl = _refine_kernel(links_fh, fc.astype(np.int64, copy=False), int(nf),
                                            lc.astype(np.int64), int(nl), used, seg_starts, seg_flows, int(limit),
                                            int(max_rounds))
    return (fc, int(nf), lc, int(nl)) if status else None


@jit(cache=True, nogil=True)
def _by_link(links_fh, pad, n_links):  # pragma: no cover - compiled
    """The flows' hops grouped by link (a counting sort, stable; the pad's hops left out): the
    links crossed, in increasing order, and per such link its flows
    ``seg_flows[seg_starts[i]:seg_starts[i + 1]]`` (a flow once per hop onto it)."""
    F, H = links_fh.shape
    count = np.zeros(n_links + 1, dtype=np.int64)
    n_ent = 0
    for f in range(F):
        for h in range(H):
            l = links_fh[f, h]
            if l != pad:
                count[l + 1] += 1
                n_ent += 1
    n_used = 0
    for l in range(n_links):
        if count[l + 1] > 0:
            n_used += 1
    used = np.empty(n_used, dtype=np.int64)
    seg_starts = np.zeros(n_used + 1, dtype=np.int64)
    i = 0
    for l in range(n_links):
        if count[l + 1] > 0:
            used[i] = l
            seg_starts[i + 1] = seg_starts[i] + count[l + 1]
            i += 1
        count[l + 1] += count[l]
    seg_flows = np.empty(n_ent, dtype=np.int32)  # flow indices (< 2**31: the caller checks)
    for f in range(F):
        for h in range(H):
            l = links_fh[f, h]
            if l != pad:
                seg_flows[count[l]] = f
                count[l] += 1
    return used, seg_starts, seg_flows


@jit(cache=True, nogil=True)
def _by_class(fc, nf):  # pragma: no cover - compiled
    """``np.argsort(fc, kind="stable")`` for colours ``0 .. nf-1``, by counting (O(F), no sort)."""
    start = np.zeros(nf + 1, dtype=np.int64)
    for f in range(fc.shape[0]):
        start[fc[f] + 1] += 1
    for c in range(nf):
        start[c + 1] += start[c]
    order = np.empty(fc.shape[0], dtype=np.int64)
    for f in range(fc.shape[0]):
        order[start[fc[f]]] = f
        start[fc[f]] += 1
    return order


@jit(cache=True, nogil=True)
def _distinct_kernel(bits, limit, signed_zero=False):  # pragma: no cover - compiled
    """The distinct values of ``bits`` in order of first appearance and, per element, the index
    of its value among them (open addressing, exact comparison); (False, ...) once more than
    ``limit`` are distinct. ``signed_zero``: the bits are float64's, and -0.0's pattern is
    read as 0.0's (one value, as ``x + 0.0`` makes them)."""
    n = bits.shape[0]
    size = 1024
    table = np.full(size, -1, dtype=np.int64)
    uniq = np.empty(256, dtype=np.int64)
    nu = 0
    slot = np.empty(n, dtype=np.int64)
    last = 0
    for i in range(n):
        v = bits[i]
        if signed_zero and v == _NEG_ZERO:
            v = 0
        if nu and uniq[last] == v:  # runs of one value (an AlltoAllv's sizes per destination node)
            slot[i] = last
            continue
        k = _mix(v) & (size - 1)
        while True:
            r = table[k]
            if r == -1:
                if nu == uniq.shape[0]:
                    grown = np.empty(2 * nu, dtype=np.int64)
                    grown[:nu] = uniq
                    uniq = grown
                uniq[nu] = v
                table[k] = nu
                slot[i] = nu
                last = nu
                nu += 1
                if nu > limit:
                    return False, uniq[:0], slot[:0]
                if 2 * nu > size:  # keep the load under one half
                    size *= 4
                    table = np.full(size, -1, dtype=np.int64)
                    for q in range(nu):
                        kq = _mix(uniq[q]) & (size - 1)
                        while table[kq] != -1:
                            kq = (kq + 1) & (size - 1)
                        table[kq] = q
                break
            if uniq[r] == v:
                slot[i] = r
                last = r
                break
            k = (k + 1) & (size - 1)
    return True, uniq[:nu], slot
