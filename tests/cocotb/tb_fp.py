"""cocotb bench of rtl.fp on its generated Verilog: a bank of pipelined units sharing ``en``.

Started from tests/rtl/test_fp.py (``test_fp_bank_on_verilog``) through
``sim.harness.run_cocotb``; ``tb_params()`` carries ``n`` (operations), ``stall`` (probability
of ``en`` low on a cycle) and ``latencies`` (output port -> pipeline latency). Each cycle the
bench drives fresh operands (garbage while stalled), keeps a model of which operation sits in
which pipeline register of each unit, and checks every result bit for bit against
``sim.reference.fp``, and that every output holds while ``en`` is low.
"""

from __future__ import annotations

import cocotb
import numpy as np
from cocotb.triggers import FallingEdge, ReadOnly, RisingEdge

from neonic.sim.harness.cocotb_streams import start_clock_and_reset, tb_params, tb_record, tb_rng
from neonic.sim.reference import fp as ref
from tests.rtl.test_fp import _half_operands, add_operands, fp32_operands, mul_operands


def _stimulus(rng: np.random.Generator, n: int):
    add_a, add_b = add_operands(rng, n)
    mul_a, mul_b = mul_operands(rng, n)
    cvt = fp32_operands(rng, n)
    half = _half_operands(rng, n, 5)
    inputs = {"add_a": add_a, "add_b": add_b, "mul_a": mul_a, "mul_b": mul_b, "cvt": cvt,
              "half": half}
    expected = {
        "add": ref.fp32_add(add_a, add_b), "mul": ref.fp32_mul(mul_a, mul_b),
        "f16": ref.fp32_to_fp16(cvt), "bf16": ref.fp32_to_bf16(cvt),
        "u8": ref.fp32_to_int(cvt, 8, False), "h32": ref.fp16_to_fp32(half),
    }
    return inputs, expected


@cocotb.test()
async def fp_bank_bit_exact(dut):
    """Every unit's results equal the numpy reference, through random en stalls."""
    p = tb_params()
    n, stall, latencies = int(p.get("n", 1000)), float(p.get("stall", 0.3)), p["latencies"]
    rng = tb_rng()
    inputs, expected = _stimulus(rng, n)
    widths = {k: len(getattr(dut, k)) for k in inputs}
    await start_clock_and_reset(dut)
    stages = {k: [None] * latency for k, latency in latencies.items()}
    got = {k: np.full(n, -1, dtype=np.int64) for k in latencies}
    held: dict[str, int] = {}
    fed = 0
    cycles = 0
    while any((g < 0).any() for g in got.values()):
        cycles += 1
        assert cycles < 4 * n + 100, "bench deadline: results missing"
        en = fed >= n or rng.random() >= stall
        feed = fed if (en and fed < n) else None
        for k, values in inputs.items():
            getattr(dut, k).value = (int(values[feed]) if feed is not None
                                     else int(rng.integers(0, 2 ** widths[k])))
        dut.en.value = int(en)
        await RisingEdge(dut.clk)
        await ReadOnly()
        for k in latencies:
            value = int(getattr(dut, k).value)
            if en:
                stages[k] = [feed] + stages[k][:-1]
                if stages[k][-1] is not None:
                    got[k][stages[k][-1]] = value
                held[k] = value
            elif k in held:
                assert value == held[k], f"{k}: output changed while en was low"
        await FallingEdge(dut.clk)
        if feed is not None:
            fed += 1
    for k, want in expected.items():
        bad = np.flatnonzero(got[k] != np.asarray(want).astype(np.int64))
        assert not bad.size, (f"{k}: {bad.size} of {n} wrong; first at {bad[0]}: inputs "
                              f"{ {i: hex(int(v[bad[0]])) for i, v in inputs.items()} }, got "
                              f"{got[k][bad[0]]:#x}, want {int(want[bad[0]]):#x}")
    tb_record(operations=n, cycles=cycles)
