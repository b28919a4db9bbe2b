"""The one simulation harness of neonic (see the module docstrings for details)."""
from .amaranth_sim import SimulationTimeout, run_amaranth, stream_recv, stream_send
from .memory import AmaranthMemory, MemoryCore, MemoryModelError, MemoryStats
