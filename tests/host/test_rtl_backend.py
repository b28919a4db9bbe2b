"""``neonic run --backend rtl``: the cluster runtime's NIC backend hook and the RTL backend.

The full run (2 nodes x 2 GPUs: 4 RTL NICs) takes most of a minute in Amaranth's simulator; the
default tests check the packaged scenario, the hook with a stand-in backend and the refusals,
and a slow test runs the whole 2 x 2 cluster in RTL (pooled embeddings bit-exact, every unit
within 5% of the timing model)."""

from __future__ import annotations

import argparse
from dataclasses import replace

import pytest

from neonic.host.cluster import ClusterRun
from neonic.host.units.smartnic import rtl_backend, rtl_scenario


def test_rtl_scenario_is_a_2_by_2_smartnic_cluster():
    sc = rtl_scenario()
    assert sc.system.embeddings == "nic" and sc.nodes == 2 and sc.gpus_per_node == 2
    assert all(t.rows <= 4096 and t.dim % 4 == 0 for t in sc.workload.tables)
    topo = ClusterRun(sc)._topology()
    assert (topo.nodes, topo.gpus_per_node, topo.num_gpus) == (2, 2, 4)


def test_gpus_per_node_override_is_validated_by_the_network_config():
    from neonic.host.cluster import scenario_preset
    sc = scenario_preset("rtl-small", cluster={"gpus_per_node": 3})
    assert ClusterRun(sc)._topology().gpus_per_node == 3
    with pytest.raises(ValueError, match="cluster.gpus_per_node"):
        scenario_preset("rtl-small", cluster={"gpus_per_node": 0})


def test_the_hook_replaces_the_nic_unit_times():
    sc = rtl_scenario()
    sc = replace(sc, nodes=1)
    seen = {}

    def backend(run, effects, work):
        seen["ranks"] = work.world_size
        seen["plan"] = run.plan
        units = [(("gather", 123_000_000),) for _ in range(work.world_size)]
        return replace(effects, fwd_units=units, figures={**effects.figures, "stand_in": True})

    result = ClusterRun(sc, nic_backend=backend).run()
    assert seen["ranks"] == 2 and seen["plan"] is not None
    assert result.metrics["nic"]["stand_in"] is True
    # every rank's NIC gather unit was busy for the stand-in's 123 us in the one iteration
    assert result.metrics["utilization"]["nic_gather"] > 0
    assert result.metrics["iteration_time_s"] >= 123e-6


def test_rtl_backend_refuses_a_system_without_smartnics():
    from neonic.host.cluster import scenario_preset
    with pytest.raises(ValueError, match="SmartNIC"):
        rtl_backend(scenario_preset("default"), sim="amaranth")


def test_run_command_has_the_backend_flag():
    from neonic.host.commands import run
    parser = argparse.ArgumentParser()
    run.add_arguments(parser)
    args = parser.parse_args(["--backend", "rtl", "--sim", "amaranth"])
    assert args.backend == "rtl" and args.sim == "amaranth"
    with pytest.raises(SystemExit):
        parser.parse_args(["--backend", "fpga"])


@pytest.mark.slow
def test_a_2_by_2_cluster_of_rtl_nics_receives_the_reference_pools():
    sc = rtl_scenario()
    backend = rtl_backend(sc, sim="amaranth")
    result = ClusterRun(sc, nic_backend=backend).run()
    report = backend.report
    assert report.buffers_match and report.cache_misses_match and report.drops == 0
    assert result.metrics["nic"]["rtl_cosim"]["buffers_match"] is True
    assert result.metrics["utilization"]["nic_gather"] > 0
    assert report.world == 4 and report.gpus_per_node == 2
    assert report.max_rel_error < 0.05
