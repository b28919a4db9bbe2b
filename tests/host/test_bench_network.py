"""``neonic bench network``: long network runs say where they are, with a rough time estimate."""

from __future__ import annotations

import io

import numpy as np

from neonic.host.bench import BenchContext
from neonic.host.bench.network import _timed, zionex_family
from neonic.sim.network import collectives as coll


def test_long_runs_report_solves_flows_and_an_estimate():
    """Every ``every_s`` of wall time (here: every solve) a line names the run, the solves so far,
    the simulated time and the flows in flight; once 1% of the flows have finished it adds a
    time estimate (none before: it would be a division by almost nothing)."""
    topo = zionex_family(2)
    out = io.StringIO()
    ctx = BenchContext(stream=out)
    sizes = np.random.default_rng(0).integers(1, 1 << 20, (topo.num_gpus, topo.num_gpus))
    wall, sim, net = _timed(topo, lambda net: coll.alltoallv(net, None, sizes), ctx=ctx, label="probe",
                            heartbeat_s=0.0)
    lines = [x for x in out.getvalue().splitlines() if "probe:" in x]
    assert len(lines) == net.solves
    assert all("solves" in x and "ms simulated" in x and "flows in flight" in x for x in lines)
    assert "no estimate yet" in lines[0] and any("s left" in x for x in lines)
    assert sim > 0 and net.cpu_s > 0


def test_beside_case_runs_over_joint_classes_and_agrees_per_flow():
    """The ``alltoallv_1024_beside`` case (a per-destination AlltoAllv beside an intra-node
    group, one node throttled) at 128 GPUs, where its flows are too few for the default
    ``joint_min_flows``: with the threshold lowered, its solves run over joint classes, with the
    per-flow run's collective time within 1e-6; at the default, none does."""
    from neonic.host.bench.network import _beside_throttled
    from neonic.sim.engine import Engine
    from neonic.sim.network import Network

    topo = zionex_family(16)
    runs = {}
    for aggregate, jmin in ((True, 0), (False, 0), (True, None)):
        net = Network(Engine(), topo, aggregate=aggregate)
        if jmin is not None:
            net.joint_min_flows = jmin
        h = _beside_throttled(net)
        net.engine.run()
        runs[aggregate, jmin] = (net, h)
    (joint, hj), (flow, hf), (default, hd) = runs[True, 0], runs[False, 0], runs[True, None]
    assert joint.joint_solves > 0 and joint.solved_classes * 8 < joint.solved_flows
    assert abs(hj.time_ps / hf.time_ps - 1) < 1e-6 and flow.joint_solves == 0 and default.joint_solves == 0


def test_per_node_case_aggregates_and_agrees_per_flow():
    """The ``alltoallv_4096`` case's sizes (one figure per destination node) at 256 GPUs: uneven
    sizes, still solved over classes (about one per pair of nodes, far fewer than the flows),
    with the per-flow run's collective time and link bytes within 1e-6."""
    from neonic.host.bench.network import per_node_sizes

    topo = zionex_family(32)
    sizes = per_node_sizes(topo.num_gpus, topo.gpus_per_node, 3)
    assert np.unique(sizes).size > 16 and np.all(sizes[:, :8] == sizes[0, 0])
    _, sim_a, agg = _timed(topo, lambda net: coll.alltoallv(net, None, sizes))
    _, sim_f, flow = _timed(topo, lambda net: coll.alltoallv(net, None, sizes), aggregate=False)
    assert agg.solved_classes * 20 < agg.solved_flows
    assert abs(sim_a / sim_f - 1) < 1e-6
    np.testing.assert_allclose(agg.link_bytes, flow.link_bytes, rtol=1e-6)
    np.testing.assert_allclose(agg.link_wire_bytes, flow.link_wire_bytes, rtol=1e-6)
