"""The one simulation harness of neonic.

* Amaranth simulator: :func:`run_amaranth`, :func:`stream_send`, :func:`stream_recv`
  (:mod:`.amaranth_sim`).
* Memory model for ``rtl.streams.MemPortSignature`` ports: :class:`AmaranthMemory` here and
  ``CocotbMemory`` in cocotb benches, both on :class:`MemoryCore` (:mod:`.memory`).
* Verilog export cached by content: :func:`export_verilog`, and by parameters and RTL source
  hash before conversion: :func:`export_verilog_cached` (:mod:`.verilog`).
* cocotb on the exported Verilog: :func:`run_cocotb`, :func:`available_simulators`
  (:mod:`.cocotb_runner`).
* Inside cocotb benches: ``tb_params``, ``start_clock_and_reset``, ``StreamDriver``,
  ``StreamMonitor``, ``CocotbMemory`` ... (:mod:`.cocotb_streams`). They are importable from
  here too, lazily, so that plain tests never import cocotb's simulator-side modules.
"""

from .amaranth_sim import SimulationTimeout, run_amaranth, stream_recv, stream_send
from .cocotb_runner import available_simulators, read_tb_figures, run_cocotb
from .memory import AmaranthMemory, MemoryCore, MemoryModelError, MemoryStats
from .verilog import export_verilog, export_verilog_cached, resolve_build_root

__all__ = [
    "SimulationTimeout", "run_amaranth", "stream_send", "stream_recv",
    "AmaranthMemory", "MemoryCore", "MemoryModelError", "MemoryStats",
    "export_verilog", "export_verilog_cached", "resolve_build_root",
    "available_simulators", "run_cocotb", "read_tb_figures",
    # cocotb side (lazy)
    "tb_params", "tb_seed", "tb_rng", "tb_record", "start_clock_and_reset", "pack", "unpack",
    "StreamDriver", "StreamMonitor", "CocotbMemory",
]

_COCOTB_SIDE = {"tb_params", "tb_seed", "tb_rng", "tb_record", "start_clock_and_reset",
                "pack", "unpack", "StreamDriver", "StreamMonitor", "CocotbMemory"}


def __getattr__(name):
    if name in _COCOTB_SIDE:
        from . import cocotb_streams
        return getattr(cocotb_streams, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
