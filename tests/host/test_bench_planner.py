"""``neonic bench planner``'s verdict on Neo's plan against every other plan it simulated."""

from __future__ import annotations

import pytest

from neonic.host.bench.planner import TIE, neo_against_alternatives


def test_neo_is_measured_against_the_fastest_other_plan():
    v = neo_against_alternatives({"neo": 50.0, "force:table-row-wise": 52.0, "size-greedy": 80.0})
    assert v["best_alternative"] == "force:table-row-wise"
    assert v["neo_below_best_alternative"] == pytest.approx(1 - 50 / 52)
    assert v["neo_lowest_simulated"]


def test_a_tie_in_floating_point_noise_is_not_a_loss_but_a_real_gap_is():
    # model-f: Neo's plan is forced table-row-wise with its nodes renumbered
    tie = neo_against_alternatives({"neo": 4.217145468, "force:table-row-wise": 4.217145467})
    assert tie["neo_lowest_simulated"] and abs(tie["neo_below_best_alternative"]) < TIE
    loss = neo_against_alternatives({"neo": 4.2172, "force:table-row-wise": 4.2171})
    assert not loss["neo_lowest_simulated"] and loss["neo_below_best_alternative"] < 0


def test_no_verdict_without_neo_or_without_an_alternative():
    assert neo_against_alternatives({"size-greedy": 80.0}) == {}
    assert neo_against_alternatives({"neo": 50.0}) == {}
