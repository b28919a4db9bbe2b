"""rtl.fp: every component bit-exact against numpy's IEEE arithmetic, through its pipeline.

Operands are drawn so that the interesting classes (subnormals, signed zeros, infinities,
NaNs, overflow, exact cancellation, large exponent gaps, ties to even) come up often. Each
pipelined component runs with random ``en`` stalls; the driver keeps a model of which operation
sits in which pipeline register, checks every result against numpy, and checks that the
output holds while the pipeline is stalled.
"""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.back import verilog
from amaranth.hdl import ClockDomain, Module, Signal

from neonic.rtl import fp
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from neonic.sim.harness import (available_simulators, read_tb_figures, run_amaranth, run_cocotb,
                         stream_recv, stream_send)
from neonic.sim.reference import fp as ref

pytestmark = pytest.mark.timeout(120)

# --------------------------------------------------------------------------- operand generators

_SPECIAL_EXPS = np.array([0, 0, 1, 2, 23, 24, 25, 103, 112, 113, 126, 127, 128, 142, 143, 150,
                          151, 158, 253, 254, 255, 255])
_SPECIAL_FRACS = np.array([0, 1, 2, 0x3FF, 0x400, 0x1000, 0x400000, 0x7FFFFF, 0x7FFFFE,
                           0x7FE000, 0x1FFF, 0x2000, 0x7F8000, 0x8000, 0x7FFF])


def _pack(sign, exp, frac) -> np.ndarray:
    return ((np.asarray(sign, np.uint32) << 31) | (np.asarray(exp, np.uint32) << 23)
            | np.asarray(frac, np.uint32)).astype(np.uint32)


def _fracs(rng, n) -> np.ndarray:
    """Fractions: uniform, special, or sparse (few set bits: exact results and ties)."""
    uniform = rng.integers(0, 2 ** 23, n)
    special = rng.choice(_SPECIAL_FRACS, n)
    sparse = uniform & rng.integers(0, 2 ** 23, n) & rng.integers(0, 2 ** 23, n)
    top_heavy = uniform & ~((1 << rng.integers(0, 23, n)) - 1)     # low bits cleared
    pick = rng.integers(0, 4, n)
    return np.choose(pick, [uniform, special, sparse, top_heavy]).astype(np.uint32)


def fp32_operands(rng, n) -> np.ndarray:
    """binary32 bit patterns: a quarter raw random bits, the rest with biased exponents."""
    sign = rng.integers(0, 2, n)
    exp = np.where(rng.random(n) < 0.5, rng.choice(_SPECIAL_EXPS, n), rng.integers(0, 256, n))
    out = _pack(sign, exp, _fracs(rng, n))
    raw = rng.random(n) < 0.25
    out[raw] = rng.integers(0, 2 ** 32, raw.sum(), dtype=np.uint64).astype(np.uint32)
    zero = rng.random(n) < 0.04
    out[zero] = rng.choice(np.array([0, 0x80000000], np.uint32), zero.sum())
    edge = rng.random(n) < 0.03
    out[edge] = rng.choice(np.array([0x7F800000, 0xFF800000, 0x7F7FFFFF, 0xFF7FFFFF],
                                    np.uint32), edge.sum())
    return out


def _related(rng, a, exp_offset) -> np.ndarray:
    """Operands whose exponent is ``exp(a) + exp_offset`` (clipped), random sign/fraction."""
    e = np.clip(((a >> 23) & 0xFF).astype(np.int64) + exp_offset, 0, 255)
    return _pack(rng.integers(0, 2, len(a)), e, _fracs(rng, len(a)))


def add_operands(rng, n) -> tuple[np.ndarray, np.ndarray]:
    a = fp32_operands(rng, n)
    b = fp32_operands(rng, n)
    kind = rng.integers(0, 7, n)
    near = _related(rng, a, rng.integers(-3, 4, n))             # cancellation, carries
    tie = _related(rng, a, -rng.choice([23, 24, 25, 26], n))     # half-ulp and sticky cases
    far = _related(rng, a, -rng.integers(26, 60, n))            # large exponent gaps
    negated = a ^ np.uint32(0x80000000)                          # exact cancellation
    zeros = (rng.integers(0, 2, n) << 31).astype(np.uint32)      # signed zeros
    b = np.choose(kind, [b, near, tie, far, negated, a, zeros]).astype(np.uint32)
    a = np.where(kind == 6, (rng.integers(0, 2, n) << 31).astype(np.uint32), a)
    swap = rng.random(n) < 0.5
    return np.where(swap, b, a).astype(np.uint32), np.where(swap, a, b).astype(np.uint32)


def mul_operands(rng, n) -> tuple[np.ndarray, np.ndarray]:
    a = fp32_operands(rng, n)
    b = fp32_operands(rng, n)
    ea = ((a >> 23) & 0xFF).astype(np.int64)
    # Product exponents near the subnormal range and near overflow.
    target = np.where(rng.random(n) < 0.5, rng.integers(-160, -115, n), rng.integers(115, 132, n))
    eb = np.clip(target - (ea - 127) + 127, 0, 254)
    edge = _pack(rng.integers(0, 2, n), eb, _fracs(rng, n))
    b = np.where(rng.random(n) < 0.4, edge, b).astype(np.uint32)
    return a, b


# --------------------------------------------------------------------------- pipeline driver

def drive_pipeline(dut, inputs: dict[str, np.ndarray], outputs: tuple[str, ...], rng, *,
                   stall: float = 0.3) -> dict[str, np.ndarray]:
    """Push every operand set through ``dut`` (ports named by ``inputs``), one per cycle with
    ``en`` high, random ``en`` stalls in between (with garbage on the inputs), and return the
    outputs that belong to each operand set. Checks that outputs hold while stalled."""
    n = len(next(iter(inputs.values())))
    latency = dut.latency
    en_seq = rng.random(2 * n + latency + 8) >= stall
    garbage = {k: rng.integers(0, 2 ** len(getattr(dut, k)), len(en_seq), dtype=np.uint64)
               for k in inputs}
    got = {k: np.zeros(n, dtype=np.int64) for k in outputs}
    ports = {k: getattr(dut, k) for k in inputs}
    outs = [getattr(dut, k) for k in outputs]
    state = {"done": 0}

    async def testbench(ctx):
        stages: list[int | None] = [None] * latency
        held = None
        nxt = 0
        for cycle, en in enumerate(en_seq):
            feed = nxt if (en and nxt < n) else None
            src = garbage if feed is None else None
            for k, port in ports.items():
                ctx.set(port, int(src[k][cycle]) if src is not None else int(inputs[k][feed]))
            ctx.set(dut.en, int(en))
            if feed is not None:
                nxt += 1
            if latency == 0:
                if feed is not None:
                    for k, sig in zip(outputs, outs):
                        got[k][feed] = ctx.get(sig)
                    state["done"] += 1
                await ctx.tick()
            else:
                await ctx.tick()
                values = tuple(ctx.get(sig) for sig in outs)
                if en:
                    stages = [feed] + stages[:-1]
                    last = stages[-1]
                    if last is not None:
                        for k, v in zip(outputs, values):
                            got[k][last] = v
                        state["done"] += 1
                    held = values
                elif held is not None:
                    assert values == held, f"cycle {cycle}: output changed while en was low"
            if state["done"] == n:
                return
        # Drain: keep en high until every operation came out.
        while state["done"] < n:
            ctx.set(dut.en, 1)
            await ctx.tick()
            stages = [None] + stages[:-1]
            last = stages[-1]
            if last is not None:
                for k, sig in zip(outputs, outs):
                    got[k][last] = ctx.get(sig)
                state["done"] += 1

    run_amaranth(_with_clock(dut), [testbench], max_cycles=len(en_seq) + 4 * n + 64)
    assert state["done"] == n
    return got


def _with_clock(dut):
    """``dut`` inside a module that has a ``sync`` domain even when ``dut`` is combinational."""
    m = Module()
    m.submodules.dut = dut
    toggle = Signal()
    m.d.sync += toggle.eq(~toggle)
    return m


def assert_bits_equal(got, want, operands: dict[str, np.ndarray], what: str, width: int = 32):
    got = np.asarray(got).astype(np.uint64)
    want = np.asarray(want).astype(np.uint64)
    bad = np.flatnonzero(got != want)
    if len(bad):
        i = bad[0]
        desc = ", ".join(f"{k}=0x{int(v[i]):0{width // 4}x}" for k, v in operands.items())
        raise AssertionError(f"{what}: {len(bad)} of {len(got)} wrong; first: {desc}: got "
                             f"0x{int(got[i]):0{width // 4}x}, want 0x{int(want[i]):0{width // 4}x}")


# --------------------------------------------------------------------------- add / sub / mul

def _coverage(a, b, result) -> dict[str, int]:
    """How many cases of each interesting class a run covered (guards the generators)."""
    ra = ref.bits_to_f32(result)
    def sub(x):
        return ((x & 0x7F800000) == 0) & ((x & 0x7FFFFF) != 0)
    return {
        "subnormal_in": int((sub(a) | sub(b)).sum()),
        "subnormal_out": int(sub(result).sum()),
        "zero_out": int((ra == 0).sum()),
        "neg_zero_out": int((result == 0x80000000).sum()),
        "inf_out": int(np.isinf(ra).sum()),
        "nan_out": int((result == ref.FP32_QNAN).sum()),
    }


def test_add_matches_numpy_through_stalled_pipeline(rng):
    a, b = add_operands(rng, 3000)
    want = ref.fp32_add(a, b)
    got = drive_pipeline(fp.FPAdd32(), {"a": a, "b": b}, ("o",), rng)["o"]
    assert_bits_equal(got, want, {"a": a, "b": b}, "FPAdd32")
    cov = _coverage(a, b, want)
    assert min(cov.values()) >= 20, cov
    # Ties to even really occurred: the exact sum lies halfway between two binary32 values.
    with np.errstate(all="ignore"):
        exact = ref.bits_to_f32(a).astype(np.float64) + ref.bits_to_f32(b).astype(np.float64)
        r = ref.bits_to_f32(want).astype(np.float64)
        half = np.abs(exact - r) == np.spacing(np.abs(r).astype(np.float32)) / 2
    assert (half & np.isfinite(exact)).sum() >= 20


@pytest.mark.parametrize("reset_less", [False, True])
def test_add_deep_cancellation(rng, reset_less):
    """Sums that cancel to 12..26 leading zeros (the operands differ only in their low 1..14
    fraction bits, opposite signs, equal exponents or one apart): the normalising shift's
    16-bit part (step 6) and its limit at the subnormal exponent, which random operands
    almost never reach. Both builds: the one without reset makes that part another way."""
    n = 2000
    a = fp32_operands(rng, n)
    flip = (rng.integers(0, 1 << 14, n) >> rng.integers(0, 14, n)).astype(np.uint32)
    b = (a ^ flip) ^ np.uint32(0x80000000)
    ea = (a >> 23) & 0xFF
    b = np.where((ea > 1) & (rng.random(n) < 0.3), b - np.uint32(1 << 23), b).astype(np.uint32)
    want = ref.fp32_add(a, b)
    got = drive_pipeline(fp.FPAdd32(reset_less=reset_less), {"a": a, "b": b}, ("o",), rng)["o"]
    assert_bits_equal(got, want, {"a": a, "b": b}, f"FPAdd32(reset_less={reset_less})")


@pytest.mark.parametrize("latency", [0, 1, 3, 5, 9])
def test_add_every_latency(rng, latency):
    a, b = add_operands(rng, 400)
    dut = fp.FPAdd32(latency=latency)
    assert dut.latency == latency
    got = drive_pipeline(dut, {"a": a, "b": b}, ("o",), rng)["o"]
    assert_bits_equal(got, ref.fp32_add(a, b), {"a": a, "b": b}, f"FPAdd32(latency={latency})")


def test_add_signed_zeros_infinities_and_nan():
    z, nz, inf, ninf = 0x00000000, 0x80000000, 0x7F800000, 0xFF800000
    one, none, big = 0x3F800000, 0xBF800000, 0x7F7FFFFF
    cases = [
        (z, z, z), (nz, nz, nz), (z, nz, z), (nz, z, z),         # RNE: -0 only from -0 + -0
        (one, none, z), (none, one, z),                           # x + (-x) = +0
        (inf, one, inf), (ninf, big, ninf), (inf, inf, inf),
        (inf, ninf, fp.FP32_QNAN), (0xFFC12345, one, fp.FP32_QNAN), (one, 0x7F800001,
                                                                     fp.FP32_QNAN),
        (big, big, inf), (big | 0x80000000, big | 0x80000000, ninf),   # overflow
        (0x00000001, 0x80000002, 0x80000001), (0x007FFFFF, 0x00000001, 0x00800000),
    ]
    a = np.array([c[0] for c in cases], np.uint32)
    b = np.array([c[1] for c in cases], np.uint32)
    want = np.array([c[2] for c in cases], np.uint32)
    assert_bits_equal(ref.fp32_add(a, b), want, {"a": a, "b": b}, "reference")
    got = drive_pipeline(fp.FPAdd32(latency=1), {"a": a, "b": b}, ("o",),
                         np.random.default_rng(0), stall=0.0)["o"]
    assert_bits_equal(got, want, {"a": a, "b": b}, "FPAdd32")


def test_sub_matches_numpy(rng):
    a, b = add_operands(rng, 1500)
    got = drive_pipeline(fp.FPSub32(), {"a": a, "b": b}, ("o",), rng)["o"]
    assert_bits_equal(got, ref.fp32_sub(a, b), {"a": a, "b": b}, "FPSub32")
    # x - x = +0, -0 - +0 = -0
    edge = drive_pipeline(fp.FPSub32(latency=0),
                          {"a": np.array([0x40490FDB, 0x80000000], np.uint32),
                           "b": np.array([0x40490FDB, 0x00000000], np.uint32)}, ("o",), rng)
    assert list(edge["o"]) == [0x00000000, 0x80000000]


def test_mul_matches_numpy_through_stalled_pipeline(rng):
    a, b = mul_operands(rng, 3000)
    want = ref.fp32_mul(a, b)
    got = drive_pipeline(fp.FPMul32(), {"a": a, "b": b}, ("o",), rng)["o"]
    assert_bits_equal(got, want, {"a": a, "b": b}, "FPMul32")
    cov = _coverage(a, b, want)
    assert min(cov.values()) >= 20, cov


@pytest.mark.parametrize("latency", [0, 2, 4, 7, 10, 11])
def test_mul_every_latency(rng, latency):
    a, b = mul_operands(rng, 400)
    got = drive_pipeline(fp.FPMul32(latency=latency), {"a": a, "b": b}, ("o",), rng)["o"]
    assert_bits_equal(got, ref.fp32_mul(a, b), {"a": a, "b": b}, f"FPMul32(latency={latency})")


@pytest.mark.parametrize("latency, three_dsps, narrow_shift",
                         [(3, True, False), (11, True, False), (11, False, True), (3, True, True),
                          (11, True, True)])
def test_mul_compact_builds_match_numpy(rng, latency, three_dsps, narrow_shift):
    """``three_dsps`` (three DSP products and the high parts' 6x6 product in LUTs) and
    ``narrow_shift`` (the right shift on the product's upper 25 bits and one sticky bit), the
    gather's multipliers, give the same bits as the reference, subnormal results and specials
    included, through a stalled pipeline."""
    a, b = mul_operands(rng, 3000)
    want = ref.fp32_mul(a, b)
    dut = fp.FPMul32(latency=latency, reset_less=True, three_dsps=three_dsps,
                     narrow_shift=narrow_shift)
    got = drive_pipeline(dut, {"a": a, "b": b}, ("o",), rng)["o"]
    assert_bits_equal(got, want, {"a": a, "b": b},
                      f"FPMul32(three_dsps={three_dsps}, narrow_shift={narrow_shift})")


def test_mul_specials():
    z, nz, inf, ninf, one = 0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x3F800000
    min_sub, half = 0x00000001, 0x3F000000
    cases = [
        (z, inf, fp.FP32_QNAN), (ninf, nz, fp.FP32_QNAN), (0x7FA00000, one, fp.FP32_QNAN),
        (nz, one, nz), (z, 0xBF800000, nz), (inf, 0xBF800000, ninf),
        (min_sub, half, z),                  # 2**-150: tie between 0 and 2**-149 -> even (0)
        (0x00000003, half, 0x00000002),       # 1.5 * 2**-149: tie -> even (2 * 2**-149)
        (0x7F000000, 0x40000000, inf),        # 2**127 * 2 overflows
        (0x00800000, half, 0x00400000),       # smallest normal / 2 -> subnormal, exact
    ]
    a = np.array([c[0] for c in cases], np.uint32)
    b = np.array([c[1] for c in cases], np.uint32)
    want = np.array([c[2] for c in cases], np.uint32)
    assert_bits_equal(ref.fp32_mul(a, b), want, {"a": a, "b": b}, "reference")
    got = drive_pipeline(fp.FPMul32(latency=2), {"a": a, "b": b}, ("o",),
                         np.random.default_rng(1), stall=0.0)["o"]
    assert_bits_equal(got, want, {"a": a, "b": b}, "FPMul32")


# --------------------------------------------------------------------------- conversions

@pytest.mark.parametrize("cls", [fp.FPAdd32, fp.FPMul32])
def test_reset_less_pipeline_is_bit_exact_and_keeps_its_contents_through_a_reset(rng, cls):
    """``reset_less=True`` (what the gather unit builds): the same results, and a reset while
    an operation is in flight leaves it in the pipeline (with the default reset, it is lost).
    (The adder's normalising shift is built another way without reset, a rotation: 3,000
    operands, as the default adder's own test.)"""
    add = cls is fp.FPAdd32
    a, b = (add_operands if add else mul_operands)(rng, 3000 if add else 400)
    want = ref.fp32_add(a, b) if add else ref.fp32_mul(a, b)
    got = drive_pipeline(cls(reset_less=True), {"a": a, "b": b}, ("o",), rng)["o"]
    assert_bits_equal(got, want, {"a": a, "b": b}, f"{cls.__name__}(reset_less=True)")

    x, y = (0x3FC00000, 0x40100000)                       # 1.5 and 2.25
    expect = int(ref.fp32_add(np.array([x]), np.array([y]))[0] if add
                 else ref.fp32_mul(np.array([x]), np.array([y]))[0])
    out = {}
    for reset_less in (False, True):
        dut = cls(reset_less=reset_less)
        m = Module()
        m.domains.sync = cd = ClockDomain("sync")
        m.submodules.dut = dut

        async def bench(ctx, dut=dut, cd=cd, reset_less=reset_less):
            ctx.set(dut.a, x)
            ctx.set(dut.b, y)
            await ctx.tick()                               # the operands are in
            ctx.set(dut.a, 0)
            ctx.set(dut.b, 0)
            ctx.set(cd.rst, 1)
            await ctx.tick()                               # a reset while in flight
            ctx.set(cd.rst, 0)
            for _ in range(dut.latency - 2):
                await ctx.tick()
            out[reset_less] = ctx.get(dut.o)

        run_amaranth(m, [bench], max_cycles=64)
    assert out[True] == expect and out[False] == 0


def _half_operands(rng, n, ebits) -> np.ndarray:
    mbits = 15 - ebits
    exp = np.where(rng.random(n) < 0.5, rng.choice([0, 0, 1, 2, 2 ** ebits - 2, 2 ** ebits - 1], n),
                   rng.integers(0, 2 ** ebits, n))
    frac = np.where(rng.random(n) < 0.3, rng.choice([0, 1, 2 ** mbits - 1, 2 ** (mbits - 1)], n),
                    rng.integers(0, 2 ** mbits, n))
    return ((rng.integers(0, 2, n) << 15) | (exp << mbits) | frac).astype(np.uint16)


def test_fp16_to_fp32_exact(rng):
    h = _half_operands(rng, 2500, 5)
    got = drive_pipeline(fp.FP16ToFP32(), {"a": h}, ("o",), rng)["o"]
    assert_bits_equal(got, ref.fp16_to_fp32(h), {"a": h}, "FP16ToFP32")
    finite = ~ref.is_nan_bits(h, 5, 10)
    assert np.array_equal(ref.bits_to_f32(got[finite].astype(np.uint32)),
                          h[finite].view(np.float16).astype(np.float32))


def test_bf16_to_fp32_exact(rng):
    h = _half_operands(rng, 1500, 8)
    got = drive_pipeline(fp.BF16ToFP32(latency=0), {"a": h}, ("o",), rng)["o"]
    assert_bits_equal(got, h.astype(np.uint32) << 16, {"a": h}, "BF16ToFP32")


def _narrowing_operands(rng, n, exp_lo, exp_hi) -> np.ndarray:
    """binary32 operands concentrated on the target format's exponent range and its edges,
    with dropped bits at exactly half often (ties)."""
    a = fp32_operands(rng, n)
    e = rng.integers(exp_lo, exp_hi + 1, n)
    frac = _fracs(rng, n)
    frac = np.where(rng.random(n) < 0.3, (frac & ~np.uint32(0x1FFF)) | 0x1000, frac)   # fp16 tie
    frac = np.where(rng.random(n) < 0.2, (frac & ~np.uint32(0xFFFF)) | 0x8000, frac)   # bf16 tie
    focused = _pack(rng.integers(0, 2, n), e, frac.astype(np.uint32))
    return np.where(rng.random(n) < 0.6, focused, a).astype(np.uint32)


def test_fp32_to_fp16_rne(rng):
    # binary16 exponents (biased 1..30) are binary32 113..142; subnormals reach down to 103.
    a = _narrowing_operands(rng, 3000, 98, 145)
    want = ref.fp32_to_fp16(a)
    got = drive_pipeline(fp.FP32ToFP16(), {"a": a}, ("o",), rng)["o"]
    assert_bits_equal(got, want, {"a": a}, "FP32ToFP16", width=16)
    sub = ((want & 0x7C00) == 0) & ((want & 0x3FF) != 0)
    assert sub.sum() >= 50 and (want == 0x7C00).sum() + (want == 0xFC00).sum() >= 50
    assert (want == 0x7E00).sum() >= 20


def test_fp32_to_bf16_rne(rng):
    a = _narrowing_operands(rng, 2500, 0, 255)
    want = ref.fp32_to_bf16(a)
    got = drive_pipeline(fp.FP32ToBF16(), {"a": a}, ("o",), rng)["o"]
    assert_bits_equal(got, want, {"a": a}, "FP32ToBF16", width=16)


@pytest.mark.slow
@pytest.mark.parametrize("cls,ebits", [(fp.FP16ToFP32, 5), (fp.BF16ToFP32, 8)])
def test_widening_is_exact_for_every_16_bit_pattern(cls, ebits):
    h = np.arange(2 ** 16, dtype=np.uint32).astype(np.uint16)
    got = drive_pipeline(cls(latency=0), {"a": h}, ("o",), np.random.default_rng(0),
                         stall=0.0)["o"]
    want = ref.fp16_to_fp32(h) if ebits == 5 else ref.bf16_to_fp32(h)
    assert_bits_equal(got, want, {"a": h}, cls.__name__)


@pytest.mark.slow
def test_fp32_to_fp16_on_every_boundary_and_midpoint():
    # Every binary16 value, the binary32 midpoints between neighbours (ties) and one ulp
    # either side of them: all the rounding decisions there are.
    h = np.arange(2 ** 15, dtype=np.uint32).astype(np.uint16)
    finite = h[~ref.is_nan_bits(h, 5, 10) & (h < 0x7C00)]
    lo = ref.fp16_to_fp32(finite[:-1]).astype(np.int64)
    hi = ref.fp16_to_fp32(finite[1:]).astype(np.int64)
    mid = (lo + hi) // 2
    a = np.concatenate([lo, mid, mid - 1, mid + 1]).astype(np.uint32)
    a = np.concatenate([a, a | np.uint32(0x80000000)])
    got = drive_pipeline(fp.FP32ToFP16(latency=0), {"a": a}, ("o",), np.random.default_rng(0),
                         stall=0.0)["o"]
    assert_bits_equal(got, ref.fp32_to_fp16(a), {"a": a}, "FP32ToFP16", width=16)


def test_bf16_reference_follows_the_definition():
    # Written-out cases of the reference itself: ties to even, carry into the exponent,
    # overflow to infinity, subnormal rounding up to the smallest normal, NaN.
    a = np.array([0x3F808000, 0x3F818000, 0x3F80C000, 0x7F7FFFFF, 0x007FFFFF, 0x7F800001,
                  0xFF800000, 0x80008000, 0x80008001], np.uint32)
    want = np.array([0x3F80, 0x3F82, 0x3F81, 0x7F80, 0x0080, 0x7FC0, 0xFF80, 0x8000, 0x8001],
                    np.uint16)
    assert np.array_equal(ref.fp32_to_bf16(a), want)


# --------------------------------------------------------------------------- max / min

def _select_operands(rng, n):
    a, b = add_operands(rng, n)
    kind = rng.integers(0, 4, n)
    zeros = rng.choice(np.array([0, 0x80000000], np.uint32), n)
    b = np.choose(kind, [b, a, zeros, b]).astype(np.uint32)          # ties, ±0
    a = np.where(kind == 2, rng.choice(np.array([0, 0x80000000], np.uint32), n), a)
    return a.astype(np.uint32), b


@pytest.mark.parametrize("cls,ref_fn", [(fp.FPMax32, ref.fp32_max), (fp.FPMin32, ref.fp32_min)])
def test_select_matches_reference(rng, cls, ref_fn):
    a, b = _select_operands(rng, 1500)
    want, want_sel = ref_fn(a, b)
    got = drive_pipeline(cls(latency=1), {"a": a, "b": b}, ("o", "sel_b"), rng)
    assert_bits_equal(got["o"], want, {"a": a, "b": b}, cls.__name__)
    assert np.array_equal(got["sel_b"].astype(bool), want_sel)
    # Against plain numpy where the order is unambiguous (no NaN, not both zero).
    fa, fb = ref.bits_to_f32(a), ref.bits_to_f32(b)
    plain = ~np.isnan(fa) & ~np.isnan(fb) & ~((fa == 0) & (fb == 0))
    np_result = np.maximum(fa, fb) if cls is fp.FPMax32 else np.minimum(fa, fb)
    assert np.array_equal(ref.bits_to_f32(got["o"].astype(np.uint32))[plain], np_result[plain])


def test_max_ties_and_nan_rules():
    pz, nz, one, nan_a, nan_b = 0x00000000, 0x80000000, 0x3F800000, 0x7FC00001, 0xFFC00002
    a = np.array([nz, pz, one, nan_a, one, nan_a], np.uint32)
    b = np.array([pz, nz, one, one, nan_b, nan_b], np.uint32)
    got = drive_pipeline(fp.FPMax32(), {"a": a, "b": b}, ("o", "sel_b"),
                         np.random.default_rng(2), stall=0.0)
    assert list(got["o"]) == [nz, pz, one, nan_a, nan_b, nan_a]   # ties keep a; NaN propagates
    assert list(got["sel_b"]) == [0, 0, 0, 0, 1, 0]
    # nan="compare" (torch CPU EmbeddingBag MAX): b only where b > a; a NaN b is ignored.
    two = 0x40000000
    a = np.array([nz, one, nan_a, one, nan_a, one], np.uint32)
    b = np.array([pz, two, one, nan_b, nan_b, one], np.uint32)
    got = drive_pipeline(fp.FPMax32(nan="compare"), {"a": a, "b": b}, ("o", "sel_b"),
                         np.random.default_rng(2), stall=0.0)
    assert list(got["o"]) == [nz, two, nan_a, one, nan_a, one]
    assert list(got["sel_b"]) == [0, 1, 0, 0, 0, 0]


def test_greater_in_halves_is_the_ieee_compare(rng):
    """``fp32_greater_halves``'s terms combine into ``fp32_greater``: ``gt_hi | (ge_hi &
    gt_lo)`` and ``comparable``, on operands whose upper halves are often equal."""
    n = 3000
    a = fp32_operands(rng, n)
    b = np.where(rng.random(n) < 0.4, (a & 0xFFFF0000) | (fp32_operands(rng, n) & 0xFFFF),
                 fp32_operands(rng, n)).astype(np.uint32)
    b = np.where(rng.random(n) < 0.05, a, b).astype(np.uint32)
    m = Module()
    sa, sb = Signal(32), Signal(32)
    want, got = Signal(), Signal()
    gt_hi, ge_hi, gt_lo, comparable = fp.fp32_greater_halves(sa, sb)
    m.d.comb += [want.eq(fp.fp32_greater(sa, sb)),
                 got.eq(comparable & (gt_hi | (ge_hi & gt_lo)))]
    seen = {"n": 0, "true": 0}

    async def bench(ctx):
        for x, y in zip(a.tolist(), b.tolist()):
            ctx.set(sa, x)
            ctx.set(sb, y)
            assert ctx.get(got) == ctx.get(want), (hex(x), hex(y))
            seen["n"] += 1
            seen["true"] += ctx.get(want)

    from amaranth.sim import Simulator
    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert seen["n"] == n and 0 < seen["true"] < n


@pytest.mark.parametrize("width", [5, 8, 24, 27])
def test_leading_zeros_in_two_halves_is_the_count(rng, width):
    """``leading_zero_chunks`` then ``leading_zeros_from_chunks`` give ``count_leading_zeros``
    (``width`` for zero) on zero and on every position of the leading one, lower bits random."""
    top = np.arange(width)
    values = [0] + [(1 << int(k)) | int(rng.integers(0, 1 << int(k))) if k else 1 for k in top]
    values += [int(v) for v in rng.integers(0, 1 << width, 64)]
    m = Module()
    v = Signal(width)
    want, got = Signal(range(width + 1)), Signal(range(width + 1))
    chunks = fp.leading_zero_chunks(m, v, "t")
    m.d.comb += [want.eq(fp.count_leading_zeros(m, v)),
                 got.eq(fp.leading_zeros_from_chunks(chunks, width))]
    seen = []

    async def bench(ctx):
        for x in values:
            ctx.set(v, x)
            assert ctx.get(got) == ctx.get(want) == (width - x.bit_length()), hex(x)
            seen.append(ctx.get(got))

    from amaranth.sim import Simulator
    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert len(seen) == len(values) and set(range(width + 1)) <= set(seen)


# --------------------------------------------------------------------------- integers

@pytest.mark.parametrize("width,signed", [(8, False), (8, True), (16, True), (32, True)])
def test_fp32_to_int_rne_saturating(rng, width, signed):
    n = 1500
    scale = 2.0 ** rng.uniform(-3, width + 2, n)
    x = (rng.uniform(-1, 1, n) * scale).astype(np.float32)
    halves = (rng.integers(-(2 ** (width - 1)), 2 ** (width - 1), n) + 0.5).astype(np.float32)
    x = np.where(rng.random(n) < 0.3, halves, x)
    a = ref.f32_to_bits(x).copy()
    a = np.where(rng.random(n) < 0.2, fp32_operands(rng, n), a).astype(np.uint32)
    want = ref.fp32_to_int(a, width, signed) & (2 ** width - 1)
    got = drive_pipeline(fp.FP32ToInt(width=width, signed=signed), {"a": a}, ("o",), rng)["o"]
    assert_bits_equal(got, want, {"a": a}, f"FP32ToInt({width}, {signed})")


def test_fp32_to_int_examples():
    x = np.array([0.5, 1.5, 2.5, -0.5, 254.5, 255.5, 1e30, -3.0, np.inf, np.nan], np.float32)
    want = [0, 2, 2, 0, 254, 255, 255, 0, 255, 0]
    assert list(ref.fp32_to_int(ref.f32_to_bits(x), 8, False)) == want
    got = drive_pipeline(fp.FP32ToInt(latency=0), {"a": ref.f32_to_bits(x).copy()}, ("o",),
                         np.random.default_rng(3))["o"]
    assert list(got) == want


@pytest.mark.parametrize("width,signed", [(8, False), (8, True), (32, False), (32, True)])
def test_int_to_fp32(rng, width, signed, n=800):
    lo, hi = (-2 ** (width - 1), 2 ** (width - 1)) if signed else (0, 2 ** width)
    v = rng.integers(lo, hi, n, dtype=np.int64)
    if width == 8:
        v = np.arange(lo, hi, dtype=np.int64)          # exhaustive
    else:
        v[: n // 2] >>= rng.integers(0, width, n // 2)  # every magnitude class
        v[:4] = [lo, hi - 1, 0, 1]
    want = ref.int_to_fp32(v)
    a = (v & (2 ** width - 1)).astype(np.uint64)
    got = drive_pipeline(fp.IntToFP32(width=width, signed=signed), {"a": a}, ("o",), rng)["o"]
    assert_bits_equal(got, want, {"a": a}, f"IntToFP32({width}, {signed})")


# --------------------------------------------------------------------------- division

@pytest.mark.parametrize("bits_per_cycle", [1, 4, 27])
def test_div_matches_numpy_under_idle_and_backpressure(rng, bits_per_cycle):
    n = 200 if bits_per_cycle == 1 else 400
    a, b = mul_operands(rng, n)
    b = np.where(rng.random(n) < 0.3, fp32_operands(rng, n), b).astype(np.uint32)
    a[:8] = [0x3F800000, 0, 0x7F800000, 0x7F800000, 0x00000001, 0x7F7FFFFF, 0x437F0000, 0]
    b[:8] = [0x437F0000, 0, 0x7F800000, 0x3F800000, 0x4B000000, 0x00000001, 0x00000001, 0x80000001]
    want = ref.fp32_div(a, b)
    dut = fp.FPDiv32(bits_per_cycle=bits_per_cycle)
    got: list[int] = []

    async def producer(ctx):
        await stream_send(ctx, dut.i, [{"a": int(x), "b": int(y)} for x, y in zip(a, b)],
                          rng=rng, idle=0.3)

    async def consumer(ctx):
        got.extend(await stream_recv(ctx, dut.o, n, rng=rng, backpressure=0.3))

    run_amaranth(dut, [producer, consumer], max_cycles=n * (dut.latency + 12) + 100)
    assert_bits_equal(np.array(got), want, {"a": a, "b": b}, "FPDiv32")
    assert _coverage(a, b, want)["subnormal_out"] >= 5


@pytest.mark.parametrize("bits_per_cycle,latency", [(1, 29), (3, 11), (9, 5), (27, 3)])
def test_div_latency_and_throughput_are_as_documented(bits_per_cycle, latency):
    dut = fp.FPDiv32(bits_per_cycle=bits_per_cycle)
    assert dut.latency == latency and fp.FPDiv32.LATENCY == 29
    seen = {"valid_at": [], "results": []}

    async def testbench(ctx):
        # Two divisions back to back with o.ready and i.valid held high.
        ctx.set(dut.o.ready, 1)
        ctx.set(dut.i.valid, 1)
        ctx.set(dut.i.payload, {"a": 0x40400000, "b": 0x40000000})    # 3 / 2
        for cycle in range(1, 3 * latency + 3):
            _, _, i_ready, o_valid, o_payload = await ctx.tick().sample(
                dut.i.ready, dut.o.valid, dut.o.payload)
            if cycle == 1:          # 3 / 2 was accepted at the first edge
                assert i_ready
                ctx.set(dut.i.payload, {"a": 0x3F800000, "b": 0x40400000})   # 1 / 3
            if o_valid:
                seen["valid_at"].append(cycle - 1)
                seen["results"].append(o_payload)
            if len(seen["results"]) == 2:
                ctx.set(dut.i.valid, 0)
                return

    run_amaranth(dut, [testbench], max_cycles=200)
    # Accepted on cycle 0, result valid `latency` cycles later; the next operands enter on
    # the cycle the result is taken, so the next result follows `latency` cycles after that.
    assert seen["valid_at"] == [latency, 2 * latency]
    assert seen["results"] == [0x3FC00000, 0x3EAAAAAB]


# --------------------------------------------------------------------------- INT8 formula

def test_int8_rowwise_reference_meets_its_bound(rng):
    rows = (rng.standard_normal((400, 64)) * 10 ** rng.uniform(-3, 3, (400, 1))
            + rng.uniform(-5, 5, (400, 1)) * 10 ** rng.uniform(-2, 4, (400, 1))).astype(np.float32)
    rows[0] = 1.25                                   # max == min: codes 0, exact
    rows[1, :] = 1e6
    rows[1, 1] = np.nextafter(np.float32(1e6), np.float32(2e6))   # range of one ulp
    rows[2:40] *= np.float32(1e-38)                                # tiny: subnormal scale
    with np.errstate(all="raise"):                                 # the reference never
        codes, scale, bias = ref.int8_rowwise_quantize(rows)       # relies on NaN casts
    with np.errstate(over="ignore"):
        assert np.isinf(np.float32(255) / (rows[2:40].max(1) - rows[2:40].min(1))).any()
    x_hat = ref.int8_rowwise_dequantize(codes, scale, bias)
    err = np.abs(x_hat.astype(np.float64) - rows.astype(np.float64)).max(axis=1)
    assert (err <= ref.int8_rowwise_error_bound(rows)).all()
    assert (codes[0] == 0).all() and (x_hat[0] == 1.25).all()
    assert (codes.max(axis=1)[40:] == 255).all() and (codes.min(axis=1) == 0).all()


def test_int8_rowwise_formula_in_rtl_steps(rng):
    """The RTL building blocks, chained as the documented formula, reproduce the numpy
    reference's codes bit for bit (scale and inverse from FPDiv32)."""
    rows = (rng.standard_normal((3, 16)) * 3).astype(np.float32)
    codes, scale, bias = ref.int8_rowwise_quantize(rows)
    lo, hi = rows.min(axis=1), rows.max(axis=1)
    rng_bits = drive_pipeline(fp.FPSub32(latency=0), {"a": ref.f32_to_bits(hi).copy(),
                                                      "b": ref.f32_to_bits(lo).copy()},
                              ("o",), rng)["o"].astype(np.uint32)
    k255 = np.full(3, 0x437F0000, np.uint32)
    dut = fp.FPDiv32()
    quotients: list[int] = []
    ops = [{"a": int(r), "b": int(k)} for r, k in zip(rng_bits, k255)]
    ops += [{"a": int(k), "b": int(r)} for r, k in zip(rng_bits, k255)]

    async def producer(ctx):
        await stream_send(ctx, dut.i, ops)

    async def consumer(ctx):
        quotients.extend(await stream_recv(ctx, dut.o, len(ops)))

    run_amaranth(dut, [producer, consumer], max_cycles=len(ops) * 40)
    hw_scale, hw_inv = np.array(quotients[:3], np.uint32), np.array(quotients[3:], np.uint32)
    assert np.array_equal(hw_scale, ref.f32_to_bits(scale))
    x = ref.f32_to_bits(rows).reshape(-1).copy()
    t = drive_pipeline(fp.FPSub32(latency=0), {"a": x, "b": np.repeat(ref.f32_to_bits(bias), 16)},
                       ("o",), rng)["o"]
    u = drive_pipeline(fp.FPMul32(latency=0), {"a": t, "b": np.repeat(hw_inv, 16)}, ("o",),
                       rng)["o"]
    q = drive_pipeline(fp.FP32ToInt(latency=0), {"a": u}, ("o",), rng)["o"]
    assert np.array_equal(q.reshape(3, 16), codes.astype(np.int64))


# --------------------------------------------------------------------------- construction

@pytest.mark.parametrize("make", [
    lambda: fp.FPAdd32(latency=10), lambda: fp.FPMul32(latency=12), lambda: fp.FPMul32(latency=-1), lambda: fp.FPMax32(latency=2),
    lambda: fp.FPMax32(nan="ignore"),
    lambda: fp.FP16ToFP32(latency=True), lambda: fp.FP32ToInt(width=1),
    lambda: fp.IntToFP32(width=8, signed=1), lambda: fp.FPDiv32(bits_per_cycle=0),
])
def test_bad_parameters_are_refused(make):
    with pytest.raises(ValueError, match=r"^(latency|width|signed|bits_per_cycle|nan):"):
        make()


def test_components_outside_the_bank_export_to_verilog():
    # The units in FPBank are exported and simulated by test_fp_bank_on_verilog.
    for dut in [fp.FPSub32(latency=2), fp.FPDiv32(bits_per_cycle=3), fp.FPMax32(), fp.FPMin32(latency=1),
                fp.BF16ToFP32(), fp.IntToFP32(width=16, signed=True)]:
        text = verilog.convert(dut, name=type(dut).__name__)
        assert f"module {type(dut).__name__}" in text


# --------------------------------------------------------------------------- generated Verilog

class FPBank(wiring.Component):
    """The pipelined units side by side, one ``en``: the top of the cocotb bench (tb_fp.py)."""

    def __init__(self):
        super().__init__({
            "add_a": In(32), "add_b": In(32), "mul_a": In(32), "mul_b": In(32), "cvt": In(32),
            "half": In(16), "en": In(1, init=1),
            "add": Out(32), "mul": Out(32), "f16": Out(16), "bf16": Out(16), "u8": Out(8),
            "h32": Out(32),
        })
        self.units = {"add": fp.FPAdd32(), "mul": fp.FPMul32(), "f16": fp.FP32ToFP16(),
                      "bf16": fp.FP32ToBF16(), "u8": fp.FP32ToInt(width=8, signed=False),
                      "h32": fp.FP16ToFP32()}
        self.latencies = {k: u.latency for k, u in self.units.items()}

    def elaborate(self, platform):
        m = Module()
        inputs = {"add": ("add_a", "add_b"), "mul": ("mul_a", "mul_b"), "f16": ("cvt",),
                  "bf16": ("cvt",), "u8": ("cvt",), "h32": ("half",)}
        for name, unit in self.units.items():
            m.submodules[name] = unit
            m.d.comb += [unit.en.eq(self.en), getattr(self, name).eq(unit.o)]
            for port, src in zip("ab", inputs[name]):
                m.d.comb += getattr(unit, port).eq(getattr(self, src))
        return m


def _sims():
    sims = available_simulators()
    if not sims:
        return [pytest.param("icarus", marks=pytest.mark.skip(reason="no simulator installed"))]
    return [pytest.param(s, marks=pytest.mark.slow) if s == "verilator" else s for s in sims]


@pytest.mark.parametrize("sim", _sims())
def test_fp_bank_on_verilog(sim, seed):
    bank = FPBank()
    results = run_cocotb(bank, "fp_bank", "tb_fp", sim=sim, seed=seed,
                         params={"n": 1500, "stall": 0.3, "latencies": bank.latencies})
    assert read_tb_figures(results)["operations"] == 1500
