"""Co-simulation: the SmartNIC RTL (``rtl/smartnic.py``) as the NICs of a small cluster.

One iteration's forward embedding traffic runs through real RTL instances, one per rank:

1. **Send side** (every NIC, one after the other, the design reset in between): the NIC's
   table shards are placed in its memory (the cache's back port), their descriptors and the
   addressing table are written, the cache is invalidated, then the bags (every sample of every
   rank that looks up a shard this NIC owns, ordered by the sample's owner) stream into the
   gather unit while one RDMA WRITE send per destination is posted. The frames leaving
   ``tx_frame`` are collected.
2. **Network**: the frames' payload bytes form an AlltoAllv matrix that the flow-level network
   model (``sim.network``) carries over the cluster's topology (its finish time is reported);
   each destination receives its frames interleaved round-robin across sources (one frame at
   a time, as concurrent flows arrive), a NIC's frames to itself included (loopback).
3. **Receive side** (every NIC): the receive QPs are initialised and the frames fed to
   ``rx_frame``; the depacketizer writes the payloads into the destination's buffer
   (``rx_mem``), one region per source.

Checks: every destination buffer equals the reference (``sim.reference.embedding.pool`` of the
same tables and bags, vectors padded to whole beats) byte for byte; the cache's misses equal the
reference cache model's; and the per-unit cycle counts the top measures (its activity windows)
are set side by side with the composed timing model (:func:`model_cycles`, with the parameters
of ``sim.calibration``).

Simulators: ``"amaranth"`` (one Amaranth simulation per phase for the whole cluster, the design
wrapped in a reset inserter); ``"verilator"`` (the exported Verilog compiled with a C++ harness
of drivers, memories and sinks into one library, driven from Python one NIC and phase at a time,
the NICs in parallel worker processes: ``sim.cosim.native``); ``"icarus"`` (the exported
Verilog under cocotb, both phases in one simulator process through
``sim/cocotb/tb_smartnic.py``). All see the same stimulus. ``"auto"`` picks Verilator when
installed, else Amaranth. The Verilog export is cached by parameters and RTL sources before
conversion (``sim.harness.export_verilog_cached``).

Traffic comes from :func:`synthetic_traffic` (a small table-wise cluster) or from a cluster
run's plan (:func:`traffic_from_plan`, duck-typed so that ``sim`` imports nothing from
``host``). Assumptions: FP32 tables with SUM pooling; a table shard's columns must be a
multiple of the NIC's lanes and its row stride must divide the cache line; data-parallel
tables are skipped (they need no NIC); row-wise shards send their partial pools to the
samples' owners (the reduce is the GPU's).

The package: :mod:`.traffic` (what each NIC does), :mod:`.stimulus` (the traffic laid out for
the simulators, and the reference buffers), :mod:`.network` (frame routing and timing),
:mod:`.runners` (the simulators), :mod:`.models` (the timing models beside the RTL),
:mod:`.report` (the outcome), :mod:`.run` (:func:`run_cosim`, the cluster runtime's backend).
"""

from neonic.sim.cosim.models import (MAX_MEMORY_ITERATIONS, cache_request_starts,
                                     calibration_sample, memory_model, model_cycles,
                                     reference_cache)
from neonic.sim.cosim.network import cluster_topology, network_time_s, route_frames, write_pcaps
from neonic.sim.cosim.report import CosimReport, NICRun, format_report
from neonic.sim.cosim.run import RTLNICBackend, collect_samples, run_cosim
from neonic.sim.cosim.runners import SIMULATORS, amaranth_phase, cocotb_cosim, resolve_sim
from neonic.sim.cosim.stimulus import (DEFAULT_MEMORY_LATENCY, Stimulus, build_stimulus,
                                       check_job, expected_buffers)
from neonic.sim.cosim.traffic import (NICJob, Send, Traffic, endpoint, synthetic_traffic,
                                      traffic_from_plan, varied_traffic)

__all__ = [
    "SIMULATORS", "DEFAULT_MEMORY_LATENCY", "Send", "NICJob", "Traffic", "synthetic_traffic",
    "traffic_from_plan", "varied_traffic", "collect_samples", "RTLNICBackend", "Stimulus",
    "build_stimulus", "check_job", "expected_buffers", "NICRun", "CosimReport", "run_cosim",
    "model_cycles", "calibration_sample", "memory_model", "reference_cache",
    "cache_request_starts", "MAX_MEMORY_ITERATIONS", "resolve_sim", "format_report",
    "endpoint", "route_frames", "network_time_s", "cluster_topology", "amaranth_phase",
    "cocotb_cosim", "write_pcaps",
]
