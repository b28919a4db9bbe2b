"""cocotb benches that ship with the package: the ones the command line (``neonic rtl sim
UNIT --sim icarus|verilator``) and the co-simulation run on a unit's generated Verilog
(``tb_cache``, ``tb_embedding``, ``tb_packetizer``, ``tb_depacketizer``, ``tb_smartnic``).
``sim.harness.run_cocotb`` starts them by bare module name; they are imported by cocotb inside
the simulator process, never by ordinary code. Test-only benches stay in ``tests/cocotb``."""
