"""The fused-embedding experiment: Neo's fused kernels against the unfused baseline."""

from __future__ import annotations

import json

import pytest

from neonic.host.experiments import experiment_config, run_experiment


def test_fused_embedding_tiny_measures_a_speedup_per_gpu(tmp_path):
    result = run_experiment("fused_embedding", tmp_path, size="tiny")
    m = result.metrics
    assert m["speedup"] > 1 and m["speedup_backward"] > 1 and m["speedup_forward"] >= 1
    # the launches' share of the unfused time: what decides how much fusion can gain
    assert 0 < m["unfused_launch_share_slowest_gpu"] < 1 and m["lookups_per_shard_mean"] > 0
    for row in result.rows:
        if row["shards"]:
            assert row["unfused_ms"] > row["fused_ms"] > 0
    meta = json.loads((tmp_path / "metrics.json").read_text())
    assert meta["metrics"]["speedup"] == pytest.approx(m["speedup"])
    assert (tmp_path / "speedup.png").stat().st_size > 1000


def test_fused_embedding_config_is_checked():
    assert experiment_config("fused_embedding", "validate")["nodes"] == 16
    with pytest.raises(ValueError, match="fused_embedding.table_dtype"):
        experiment_config("fused_embedding", overrides={"table_dtype": "fp8"})
