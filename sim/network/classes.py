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

The partition is computed by colour refinement (vectorised, exact: signatures are compared as
sorted integer sequences, never hashed). Where symmetry is broken (uneven AlltoAllv sizes, a
slowed link) the partition is fine and the caller falls back to one class per flow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
    uniq, inv = np.unique(key, return_inverse=True)
    return inv.astype(np.int64, copy=False).ravel(), int(uniq.size)


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


def identity_classes(links_fh: np.ndarray, capacity: np.ndarray, wire: np.ndarray) -> FlowClasses:
    """One class per flow: the quotient is the per-flow problem itself (link classes = links)."""
    F = links_fh.shape[0]
    ar = np.arange(F, dtype=np.int64)
    return FlowClasses(cls=ar, members=ar, starts=np.arange(F + 1, dtype=np.int64),
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
    the result's ``vlinks`` names their classes, whose capacities it leaves infinite.
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
    flat_links = links_fh.ravel().astype(np.int64)
    real = flat_links != pad
    ent_link = flat_links[real]
    ent_flow = np.repeat(np.arange(F, dtype=np.int64), H)[real]
    for _ in range(max_rounds):
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
        # flows: (old colour, sorted link colours of its hops)
        hop_colors = np.sort(new_lc[links_fh], axis=1)
        new_fc, n_new_f = _row_ids([fc] + [hop_colors[:, h] for h in range(H)], [nf] + [n_new_l] * H)
        if n_new_f > limit:
            return identity_classes(links_fh, capacity, wire)
        stable = n_new_f == nf and n_new_l == nl
        fc, nf, lc, nl = new_fc, n_new_f, new_lc, n_new_l
        if stable:
            break
    else:  # pragma: no cover - refinement converges in at most F + L rounds; bounded for safety
        return identity_classes(links_fh, capacity, wire)
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
    # links divided by the links of class k = class-c flows per class-k link
    order = np.argsort(fc, kind="stable")
    starts = np.zeros(nf + 1, dtype=np.int64)
    np.cumsum(np.bincount(fc, minlength=nf), out=starts[1:])
    key = fc[ent_flow] * nl + lc[ent_link]
    uk, cnt = _count_pairs(key, nl)
    qc = uk // nl
    qk = uk % nl
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
    endpoints' transmit links follow, then their receive links, then the pad (coloured by the
    capacities -2 and -3, which no real link has, so each kind is a class set of its own)."""
    src, dst, E = ends
    L = capacity.shape[0]
    pad = L - 1
    new_pad = L - 1 + 2 * E
    dt = np.int32 if new_pad < 2**31 - 1 else np.int64
    ext = np.empty((links_fh.shape[0], links_fh.shape[1] + 2), dtype=dt)
    ext[:, :-2] = np.where(links_fh == pad, new_pad, links_fh)
    ext[:, -2] = pad + np.asarray(src)
    ext[:, -1] = pad + E + np.asarray(dst)
    cap = np.concatenate([capacity[:-1], np.full(E, -2.0), np.full(E, -3.0), capacity[-1:]])
    wr = np.concatenate([wire[:-1], np.zeros(2 * E, dtype=bool), wire[-1:]])
    cl = equitable_classes(ext, flow_color, cap, wr, max_fraction=max_fraction, max_rounds=max_rounds)
    if cl.identity:
        return cl
    virtual = cl.lclass_capacity < 0  # the virtual links' classes: infinite until throttled
    cl.lclass_capacity[virtual] = np.inf
    cl.vlinks = (cl.link_class[pad:pad + E], cl.link_class[pad + E:pad + 2 * E])
    return cl
