"""Workload specs: presets match their published summaries; TOML specs are validated by field."""

from __future__ import annotations

import numpy as np
import pytest

from neonic.host.workloads import PRESET_NAMES, TableSpec, load_workload, preset, preset_text, workload_from_dict


def _minimal(**over):
    data = {
        "name": "m",
        "batch_per_gpu": 64,
        "dense": {"bottom_mlp": [13, 64, 16], "top_mlp": [64, 1]},
        "tables": [{"name": "t0", "rows": 1000, "dim": 16, "pooling": 2.0}],
    }
    data.update(over)
    return data


def test_every_preset_loads_and_documents_its_assumptions():
    for name in PRESET_NAMES:
        spec = preset(name)
        assert spec.name == name and spec.tables
    for name in ("model-a", "model-f", "model-i"):
        assert "ASSUMPTION" in preset_text(name)


@pytest.mark.parametrize(
    "name, tables, params, dim_avg, pooling_avg, layers, batch",
    [
        ("model-a", 1000, 793e9, 93, 15, 20, 512),
        ("model-f", 37, 12e12, 256, 20, 7, 512),
        ("model-i", 146, 332e9, 92, 70, 43, 2048),
    ],
)
def test_neo_models_match_the_paper_summary(name, tables, params, dim_avg, pooling_avg, layers, batch):
    spec = preset(name)
    dims = np.array([t.dim for t in spec.tables])
    pools = np.array([t.pooling for t in spec.tables])
    assert len(spec.tables) == tables
    assert spec.total_params == pytest.approx(params, rel=1e-3)
    assert dims.mean() == pytest.approx(dim_avg, abs=0.5)
    assert pools.mean() == pytest.approx(pooling_avg, rel=0.01)
    assert spec.dense.mlp_layers == layers
    assert spec.batch_per_gpu == batch


#: Neo (Mudigere et al., ISCA 2022) Table 3: forward MFLOP per sample, the published range of
#: the table count ("~1000s", "~10s", "~100s"), dims [min, max], MLP layers and mean width.
TABLE3 = {
    "model-a": {"mflops": 638, "tables": (1000, 9999), "dims": (4, 384), "layers": 20, "width": 3375},
    "model-f": {"mflops": 5, "tables": (10, 99), "dims": (256, 256), "layers": 7, "width": 490},
    "model-i": {"mflops": 60, "tables": (100, 999), "dims": (92, 92), "layers": 43, "width": 682},
}


@pytest.mark.parametrize("name", sorted(TABLE3))
def test_dense_flops_per_sample_follow_table_3(name):
    """MLPs + interaction, forward, within 10% of Table 3; the layer count and mean layer width
    are the published ones; the table count lies in the published order of magnitude and the
    dims in the published range."""
    from neonic.host.workloads.dense import dense_flops_per_sample, dense_layers

    pub = TABLE3[name]
    spec = preset(name)
    flops = dense_flops_per_sample(spec)
    assert flops["total"] / 1e6 == pytest.approx(pub["mflops"], rel=0.10)
    mlp = [layer for layer in dense_layers(spec) if layer.part in ("bottom", "top")]
    assert len(mlp) == pub["layers"]
    assert np.mean([layer.fan_out for layer in mlp]) == pytest.approx(pub["width"], rel=0.01)
    lo, hi = pub["tables"]
    assert lo <= len(spec.tables) <= hi
    dims = [t.dim for t in spec.tables]
    assert (min(dims), max(dims)) == pub["dims"] or (pub["dims"][0] <= min(dims) and max(dims) <= pub["dims"][1])


def test_interactions_do_what_dlrms_do_with_feature_widths():
    """dot: features of another width are projected to the bottom output first (one linear map
    per table), then F x F x D dots, F(F-1)/2 + D outputs; cat: sum of widths + D, no FLOPs."""
    from neonic.host.workloads.dense import dense_flops_per_sample, dense_layers, dense_params, interaction_width

    tables = [{"name": f"t{i}", "rows": 100, "dim": d, "pooling": 1.0} for i, d in enumerate((8, 16, 16, 32))]
    dot = workload_from_dict(_minimal(tables=tables, dense={"bottom_mlp": [4, 16], "top_mlp": [1]}))
    f = 5
    assert interaction_width(dot) == f * (f - 1) // 2 + 16
    proj = [layer for layer in dense_layers(dot) if layer.kind == "linear" and layer.part == "interaction"]
    assert {(p.fan_in, p.count) for p in proj} == {(8, 1), (32, 1)}
    flops = dense_flops_per_sample(dot)
    assert flops["projection"] == 2 * (8 * 16 + 32 * 16)
    assert flops["interaction"] == 2 * f * f * 16
    assert flops["top"] == 2 * interaction_width(dot) * 1
    cat = workload_from_dict(_minimal(tables=tables, dense={"bottom_mlp": [4, 16], "top_mlp": [1], "interaction": "cat"}))
    assert interaction_width(cat) == 8 + 16 + 16 + 32 + 16
    assert dense_flops_per_sample(cat)["interaction"] == 0
    assert dense_params(cat) == (4 * 16 + 16) + (interaction_width(cat) + 1)


def test_model_a_dims_stay_in_the_published_range_and_synthesis_is_deterministic():
    a, b = preset("model-a"), preset("model-a")
    assert a == b
    dims = [t.dim for t in a.tables]
    assert min(dims) >= 4 and max(dims) <= 384 and all(d % 4 == 0 for d in dims)


def test_public_configs():
    kaggle = preset("dlrm-kaggle")
    assert len(kaggle.tables) == 26 and {t.dim for t in kaggle.tables} == {16}
    assert kaggle.dense.bottom_mlp == (13, 512, 256, 64, 16)
    dcn = preset("dlrm-dcnv2")
    assert [t.rows for t in dcn.tables][:3] == [40000000, 39060, 17295]
    assert [t.pooling for t in dcn.tables][20] == 100
    assert dcn.dense.interaction == "dcn" and dcn.dense.dcn_layers == 3 and dcn.dense.dcn_low_rank == 512


def test_optimizer_state_is_one_fp32_per_row_for_rowwise_adagrad():
    spec = workload_from_dict(_minimal())
    t = spec.tables[0]
    assert spec.table_memory_bytes(t) == 1000 * 16 * 4 + 1000 * 4


@pytest.mark.parametrize(
    "patch, field",
    [
        ({"tables": [{"name": "t0", "rows": 1000, "dim": 0}]}, "tables[0].dim"),
        ({"tables": [{"name": "t0", "rows": 10, "dim": 4, "dtype": "int3"}]}, "tables[0].dtype"),
        ({"tables": [{"name": "t0", "rows": 10, "dim": 4, "pooling": -1}]}, "tables[0].pooling"),
        ({"tables": [{"name": "t0", "rows": 10, "dim": 4, "colour": 1}]}, "tables[0].colour"),
        ({"batch_per_gpu": 0}, "batch_per_gpu"),
        ({"dense": {"bottom_mlp": [13, 64], "top_mlp": [1], "interaction": "sum"}}, "dense.interaction"),
        ({"dense": {"bottom_mlp": [13, 64], "top_mlp": [1], "interaction": "dcn"}}, "dense.dcn_layers"),
        ({"optimizer": {"kind": "adam"}}, "optimizer.kind"),
        ({"synthesize": {"count": 3, "total_params": 1e6, "pooling_mean": 2, "seed": 1, "dim_min": 8,
                         "dim_max": 4, "dim_avg": 6}}, "synthesize.dim_max"),
    ],
)
def test_bad_fields_are_named(patch, field):
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        workload_from_dict(_minimal(**patch))


def test_duplicate_table_names_are_refused():
    tables = [{"name": "x", "rows": 10, "dim": 4}, {"name": "x", "rows": 10, "dim": 4}]
    with pytest.raises(ValueError, match="duplicate table name 'x'"):
        workload_from_dict(_minimal(tables=tables))


def test_toml_file_with_explicit_and_synthesized_tables(tmp_path):
    path = tmp_path / "w.toml"
    path.write_text(
        'name = "w"\nbatch_per_gpu = 32\n[dense]\nbottom_mlp = [4, 8]\ntop_mlp = [1]\n'
        '[[tables]]\nname = "big"\nrows = 5000\ndim = 32\npooling = 3\ntrace = "big.npz"\n'
        '[synthesize]\ncount = 5\ntotal_params = 1e6\ndim = 16\npooling_mean = 4\nseed = 3\n'
    )
    spec = load_workload(path)
    assert [t.name for t in spec.tables][:2] == ["big", "t0"] and len(spec.tables) == 6
    assert spec.tables[0].trace == tmp_path / "big.npz"  # relative to the file, loaded lazily
    assert sum(t.params for t in spec.tables[1:]) == pytest.approx(1e6, rel=1e-3)


def test_bag_sizes_follow_the_distribution():
    rng = np.random.default_rng(5)
    t = TableSpec("t", rows=100, dim=4, pooling=20.0, pooling_distribution="poisson")
    bags = t.sample_bag_sizes(rng, 20000)
    assert bags.mean() == pytest.approx(20.0, rel=0.02) and bags.var() == pytest.approx(20.0, rel=0.1)
    c = TableSpec("c", rows=100, dim=4, pooling=3.0)
    assert set(c.sample_bag_sizes(rng, 10)) == {3}
