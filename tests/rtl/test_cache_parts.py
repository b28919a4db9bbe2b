"""The cache's lookup parts on their own: the way selection (hit, victim) and the
replacement-state update, driven with random set words and checked against a plain Python
statement of the rules in ``rtl/cache.py``'s docstring."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.hdl import Module
from amaranth.lib import data
from amaranth.sim import Simulator

from neonic.rtl.cache import StateUpdate, WayChoose, WayMatch, WaySelect

WAYS, TAG_BITS, LFU_BITS = 4, 5, 3


def _layout(policy):
    return data.StructLayout({"valid": 1, "dirty": 1, "tag": TAG_BITS,
                              "repl": 2 if policy == "lru" else LFU_BITS})


def _random_word(rng, policy):
    ranks = rng.permutation(WAYS)
    return [{"valid": int(rng.random() < 0.75), "dirty": int(rng.random() < 0.5),
             "tag": int(rng.integers(0, 4)),          # few tags: hits and duplicate misses
             "repl": int(ranks[w]) if policy == "lru" else int(rng.integers(0, 2 ** LFU_BITS))}
            for w in range(WAYS)]


def _expected_select(word, tag, policy):
    hits = [w for w in range(WAYS) if word[w]["valid"] and word[w]["tag"] == tag]
    invalid = [w for w in range(WAYS) if not word[w]["valid"]]
    if invalid:
        victim = invalid[0]
    elif policy == "lru":
        victim = next(w for w in range(WAYS) if word[w]["repl"] == WAYS - 1)
    else:
        counts = [word[w]["repl"] for w in range(WAYS)]
        victim = counts.index(min(counts))
    return bool(hits), (hits[0] if hits else None), victim


def _expected_update(word, hit, sel, write, tag, policy):
    new = [dict(w) for w in word]
    if policy == "lru":
        for w in range(WAYS):
            if w == sel:
                new[w]["repl"] = 0
            elif word[w]["repl"] < word[sel]["repl"]:
                new[w]["repl"] = word[w]["repl"] + 1
    elif hit:
        halve = word[sel]["repl"] == 2 ** LFU_BITS - 1
        for w in range(WAYS):
            aged = word[w]["repl"] >> 1 if halve else word[w]["repl"]
            new[w]["repl"] = aged + 1 if w == sel else aged
    else:
        new[sel]["repl"] = 1
    if hit:
        new[sel]["dirty"] = word[sel]["dirty"] | write
    else:
        new[sel].update(valid=1, dirty=write, tag=tag)
    return new


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_way_select_and_state_update_follow_the_rules(policy, rng):
    layout = _layout(policy)
    sel_dut = WaySelect(way_layout=layout, ways=WAYS, policy=policy)
    upd_dut = StateUpdate(way_layout=layout, ways=WAYS, policy=policy, lfu_bits=LFU_BITS)
    # the same update with the selected way given one-hot and its state registered ahead
    given = StateUpdate(way_layout=layout, ways=WAYS, policy=policy, lfu_bits=LFU_BITS,
                        given_sel=True)
    # the two halves of the choice, as two compare stages use them
    match = WayMatch(way_layout=layout, ways=WAYS, policy=policy)
    choose = WayChoose(way_layout=layout, ways=WAYS, policy=policy)
    cases = [(_random_word(rng, policy), int(rng.integers(0, 4)), int(rng.integers(0, 2)))
             for _ in range(150)]
    for word, tag, write in cases[:2]:            # a full set with a saturated LFU count
        for w in word:
            w["valid"] = 1
        if policy == "lfu":
            word[0]["repl"] = 2 ** LFU_BITS - 1
    set_layout = data.ArrayLayout(layout, WAYS)
    seen = []

    async def bench(ctx):
        for word, tag, write in cases:
            ctx.set(sel_dut.word, set_layout.const(word))
            ctx.set(sel_dut.tag, tag)
            hit, hit_way, victim = (ctx.get(sel_dut.hit), ctx.get(sel_dut.hit_way),
                                    ctx.get(sel_dut.victim))
            exp_hit, exp_way, exp_victim = _expected_select(word, tag, policy)
            assert bool(hit) == exp_hit
            if exp_hit:
                assert hit_way == exp_way
            assert victim == exp_victim
            assert ctx.get(sel_dut.victim_state.tag) == word[victim]["tag"]
            sel = hit_way if hit else victim
            ctx.set(match.word, set_layout.const(word))
            ctx.set(match.tag, tag)
            ctx.set(choose.word, set_layout.const(word))
            for vec in ("hit_vec", "inv_vec", "old_vec"):
                ctx.set(getattr(choose, vec), ctx.get(getattr(match, vec)))
            assert (ctx.get(choose.hit), ctx.get(choose.victim)) == (hit, victim)
            assert ctx.get(choose.victim_oh) == 1 << victim
            assert ctx.get(choose.hit_oh) == (1 << hit_way if hit else 0)
            for dut in (upd_dut, given):
                ctx.set(dut.word, set_layout.const(word))
                ctx.set(dut.hit, hit)
                ctx.set(dut.sel, sel)
                ctx.set(dut.write, write)
                ctx.set(dut.tag, tag)
            ctx.set(given.sel_oh, 1 << sel)
            ctx.set(given.sel_repl, word[sel]["repl"])
            for dut in (upd_dut, given):
                got = [{k: ctx.get(getattr(dut.new_word[w], k))
                        for k in ("valid", "dirty", "tag", "repl")} for w in range(WAYS)]
                assert got == _expected_update(word, bool(hit), sel, write, tag, policy)
            seen.append((bool(hit), policy))

    top = Module()
    top.submodules.sel = sel_dut
    top.submodules.upd = upd_dut
    top.submodules.given = given
    top.submodules.match = match
    top.submodules.choose = choose
    sim = Simulator(top)
    sim.add_testbench(bench)
    sim.run()
    assert {h for h, _ in seen} == {True, False}


def test_bad_policy_is_refused():
    with pytest.raises(ValueError, match=r"^policy:"):
        WaySelect(way_layout=_layout("lru"), ways=WAYS, policy="fifo")


def test_the_set_wide_helpers_follow_their_rules(rng):
    """``lowest_one`` (the lowest set bit alone), ``at_least_two`` and ``one_hot_index`` over
    every 5-bit vector and random 16- and 32-bit ones (odd widths: the trees' leftovers)."""
    from amaranth.hdl import Signal

    from neonic.rtl.cache import at_least_two, lowest_one, one_hot_index
    cases = {n: [int(v) for v in rng.integers(0, 2 ** n, 60)] for n in (16, 32)}
    cases[5] = list(range(32))
    top = Module()
    probes = {}
    for n in cases:
        vec, low, two, idx = Signal(n), Signal(n), Signal(), Signal(range(n))
        top.d.comb += [low.eq(lowest_one(vec)), two.eq(at_least_two(vec)),
                       idx.eq(one_hot_index(low, (n - 1).bit_length()))]
        probes[n] = (vec, low, two, idx)

    async def bench(ctx):
        for n, values in cases.items():
            vec, low, two, idx = probes[n]
            for v in values:
                ctx.set(vec, v)
                assert ctx.get(low) == (v & -v)
                assert ctx.get(two) == (bin(v).count("1") >= 2)
                assert ctx.get(idx) == ((v & -v).bit_length() - 1 if v else 0)

    sim = Simulator(top)
    sim.add_testbench(bench)
    sim.run()
