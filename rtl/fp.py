"""IEEE-754 arithmetic and format conversions as pipelined Amaranth components.

Every datapath that touches embedding values (the gather/pool unit's SUM/MEAN/MAX pooling, the
packetizer's on-the-fly quantization, the depacketizer's dequantization) computes with these
components, so that one set of carefully tested rounding logic serves the whole NIC.

Conventions shared by every pipelined component here
====================================================

Ports
    Operands are ``a`` (and ``b``), the result is ``o``; all are raw IEEE bit patterns
    (``binary32`` unless the name says otherwise). ``en`` (input, reset value 1) advances the
    pipeline: every pipeline register loads only on a cycle where ``en`` is high, so a consumer
    stalls the whole pipeline, result included, by holding ``en`` low. Leaving ``en``
    unconnected gives a free-running pipeline that accepts one operation per cycle.
Latency
    ``latency`` (a constructor argument and an attribute) is the number of pipeline registers
    between the operands and ``o``: operands present on a cycle with ``en`` high appear on ``o``
    after ``latency`` more cycles with ``en`` high. ``latency=0`` makes the component purely
    combinational. The last register always sits at the output, so ``o`` is driven straight
    from a flip-flop whenever ``latency >= 1``; further registers are spread evenly over the
    internal steps.
Reset
    The pipeline registers take the domain's reset (to zero) unless the component is built
    with ``reset_less=True`` (:class:`FPAdd32`, :class:`FPMul32`), as a caller whose own valid
    flags ignore the results until its operands have passed (the gather unit) builds them:
    then no register has a reset, which takes the reset net off every flip-flop of the
    pipeline (28,053 of the 16-lane gather's) and leaves its set/reset input to the data
    logic. The results are the same on every cycle after the operands of that cycle.
Rounding
    Round to nearest, ties to even (RNE), the IEEE default, everywhere. Subnormal operands are
    honoured and subnormal results are produced (no flush to zero); results that round beyond
    the largest finite number become infinity of the right sign.
NaN
    Arithmetic with a NaN operand, and invalid operations (``inf - inf``, ``0 * inf``,
    ``0 / 0``, ``inf / inf``), return the canonical quiet NaN ``0x7FC00000`` (binary16:
    ``0x7E00``, bfloat16: ``0x7FC0``). The payload and sign of an incoming NaN are not
    propagated. Widening conversions are exact and keep the NaN's sign and payload bits.
    Selection (:class:`FPMax32`, :class:`FPMin32`) passes a NaN operand through unchanged.
    No exception flags are produced.

Components
==========

=====================  ================================================  ================
component              computes                                          default latency
=====================  ================================================  ================
:class:`FPAdd32`       ``a + b`` (``negate_b=True``: ``a - b``)          9
:class:`FPSub32`       ``a - b``                                         9
:class:`FPMul32`       ``a * b``                                         11
:class:`FPDiv32`       ``a / b``, iterative, stream handshake            ``FPDiv32.LATENCY``
:class:`FPMax32`       ``max(a, b)``, ties and ``±0`` go to ``a``        0
:class:`FPMin32`       ``min(a, b)``, ties and ``±0`` go to ``a``        0
:class:`FP16ToFP32`    binary16 -> binary32, exact                       1
:class:`BF16ToFP32`    bfloat16 -> binary32, exact                       1
:class:`FP32ToFP16`    binary32 -> binary16, RNE                         1
:class:`FP32ToBF16`    binary32 -> bfloat16, RNE                         1
:class:`FP32ToInt`     binary32 -> integer, RNE, saturating              2
:class:`IntToFP32`     integer -> binary32, RNE (exact below 2**24)      2
=====================  ================================================  ================

INT8 row-wise quantization
==========================

:func:`int8_rowwise_formula` documents (and :mod:`sim.reference.fp` implements in numpy) the exact
sequence of binary32 operations a quantizing datapath builds from these components, so that a
numpy model and the RTL agree bit for bit.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for

__all__ = [
    "FP32_QNAN", "FP16_QNAN", "BF16_QNAN",
    "FPAdd32", "FPSub32", "FPMul32", "FPDiv32", "FPMax32", "FPMin32",
    "FP16ToFP32", "BF16ToFP32", "FP32ToFP16", "FP32ToBF16", "FP32ToInt", "IntToFP32",
    "fp32_greater", "fp32_greater_terms", "fp32_greater_halves", "fp32_less", "count_leading_zeros",
    "int8_rowwise_formula",
]

#: Canonical quiet NaN produced by binary32 arithmetic.
FP32_QNAN = 0x7FC00000
#: Canonical quiet NaN produced by conversion to binary16.
FP16_QNAN = 0x7E00
#: Canonical quiet NaN produced by conversion to bfloat16.
BF16_QNAN = 0x7FC0

_EXP_MAX = 0xFF
_FP32_INF = 0x7F800000


def _refuse(component: object, error: ValueError) -> ValueError:
    """``error`` for a constructor that refuses its parameters; the half-built component is
    marked used so that Amaranth does not also warn that it was never elaborated."""
    component._MustUse__used = True
    return error


def _check_latency(latency: object, steps: int) -> int:
    if isinstance(latency, bool) or not isinstance(latency, int) or not 0 <= latency <= steps:
        raise ValueError(f"latency: expected an integer in 0..{steps}, got {latency!r}")
    return latency


class _Pipeline:
    """Pipeline registers at some of the boundaries after ``steps`` combinational steps.

    Boundary ``k`` (1..steps) follows step ``k``; boundary ``steps`` is the output. With
    latency ``L``, registers sit at boundaries ``round(i * steps / L)`` for ``i = 1..L``: evenly
    spread, always including the output. Every register loads only when ``en`` is high.
    """

    def __init__(self, m: Module, en: Value, steps: int, latency: int,
                 reset_less: bool = False):
        self._m = m
        self._en = en
        self._reset_less = reset_less
        self.cuts = {(i * steps + latency // 2) // latency for i in range(1, latency + 1)} \
            if latency else set()
        assert len(self.cuts) == latency

    def boundary(self, k: int, *, reset_less: bool = False, **values: Value) -> _Stage:
        """The values after step ``k``: registers if ``k`` is a cut, else wires.
        ``reset_less``: registers without reset, for those that the FPGA flow moves into a
        DSP block (``host.bench.timing.absorb_dsp_registers`` takes only registers without a
        reset in use); their contents after a reset are the pipeline's, whose results are
        ignored until the operands of that cycle arrive, as with the others. A pipeline
        built with ``reset_less`` (the component's) has no reset on any register."""
        reset_less = reset_less or self._reset_less
        regs = {}
        for name, v in values.items():
            v = Value.cast(v)
            if k in self.cuts:
                # (with reset: without it, synth_ecp5 maps more of the steps' logic into
                # the flip-flops' set/reset inputs, and the standalone adder and multiplier
                # measured 4-7% slower on every placement seed)
                reg = Signal(v.shape(), name=f"p{k}_{name}", reset_less=reset_less)
                with self._m.If(self._en):
                    self._m.d.sync += reg.eq(v)
            else:
                reg = _wire(self._m, v, f"w{k}_{name}")
            regs[name] = reg
        return _Stage(regs)


class _Stage:
    def __init__(self, values: dict[str, Value]):
        self.__dict__.update(values)


def _wire(m: Module, value: Value, name: str) -> Signal:
    """A named combinational signal carrying ``value`` (keeps shared expressions shared)."""
    value = Value.cast(value)
    sig = Signal(value.shape(), name=name)
    m.d.comb += sig.eq(value)
    return sig


def count_leading_zeros(m: Module, v: Value, name: str = "lzc") -> Signal:
    """Leading zeros of ``v`` (``len(v)`` when ``v`` is zero): a log-depth tree of
    combinational logic added to ``m``, returned as a signal."""
    v = Value.cast(v)
    width = len(v)
    size = 1
    while size < max(width, 2):
        size *= 2
    padded = Cat(Const(0, size - width), v)

    def tree(x: Value) -> tuple[Value, Value]:
        # (count of leading zeros, all zero) for a power-of-two width >= 2.
        if len(x) == 2:
            return ~x[1], ~(x[0] | x[1])
        half = len(x) // 2
        c_hi, z_hi = tree(x[half:])
        c_lo, z_lo = tree(x[:half])
        z_hi = _wire(m, z_hi, f"{name}_z{len(x)}")
        count = _wire(m, Mux(z_hi, Cat(c_lo, Const(1, 1)), Cat(c_hi, Const(0, 1))),
                      f"{name}_c{len(x)}")
        return count, z_hi & z_lo

    count, _ = tree(padded)
    return _wire(m, Mux(v == 0, width, count), name)


def leading_zero_chunks(m: Module, v: Value, name: str = "lzk", chunk: int = 8) -> dict:
    """The first half of :func:`count_leading_zeros` of ``v``, for a pipeline register
    between the halves: per ``chunk``-bit share of ``v`` from the top, whether it is zero
    (``z0``, ``z1``, ... for all but the last share) and its own leading zeros (``c0``,
    ``c1``, ...: the last share's is its width when it is zero, the others' are only used
    where the share is not zero). :func:`leading_zeros_from_chunks` combines them into the
    count, the same value as :func:`count_leading_zeros` gives for every ``v``. Why: a
    23-bit count and its zero test in one step were the gather's critical path (8.3 ns,
    six LUTs, in the multipliers' first step); a share's count and zero test are about two."""
    v = Value.cast(v)
    width = len(v)
    n = -(-width // chunk)
    out = {}
    for j in range(n):
        hi = width - j * chunk
        part = v[max(0, hi - chunk):hi]
        c = count_leading_zeros(m, part, f"{name}{j}")
        if j < n - 1:
            out[f"z{j}"] = part == 0
            c = c[:bits_for(chunk - 1)]
        out[f"c{j}"] = c
    return out


def leading_zeros_from_chunks(chunks: dict, width: int, chunk: int = 8) -> Value:
    """The leading zeros of a ``width``-bit value from the fields of
    :func:`leading_zero_chunks` (``chunks[name]``, e.g. after a pipeline register): the first
    non-zero share's count plus ``chunk`` per zero share before it (``width`` when all are
    zero)."""
    n = -(-width // chunk)
    count = chunks[f"c{n - 1}"] + (n - 1) * chunk
    for j in reversed(range(n - 1)):
        count = Mux(chunks[f"z{j}"], count, chunks[f"c{j}"] + j * chunk)
    return count


def _fp32_fields(x: Value):
    """(sign, biased exponent, fraction, significand with hidden bit, effective exponent)."""
    sign, exp, frac = x[31], x[23:31], x[0:23]
    mant = Cat(frac, exp != 0)
    # ``max(exp, 1)``: only bit 0 differs from ``exp`` (set where bits 1..7 are zero), so
    # that a subtraction of effective exponents has one LUT in front of one bit of its carry
    # chain, not a zero test in front of every bit
    eff = Cat(exp[0] | ~exp[1:].any(), exp[1:])
    return sign, exp, frac, mant, eff


def _is_nan(exp: Value, frac: Value, exp_max: int) -> Value:
    return (exp == exp_max) & (frac != 0)


def _is_inf(exp: Value, frac: Value, exp_max: int) -> Value:
    return (exp == exp_max) & (frac == 0)


def _shift_right_sticky(m: Module, x: Value, amount: Value, max_shift: int,
                        name: str = "srs") -> tuple[Value, Value]:
    """``x >> amount`` (same width) and whether any shifted-out bit was one.

    ``amount`` (unsigned) is clamped to ``max_shift``, which must be >= ``len(x)``, so that any
    larger shift empties ``x`` into the sticky bit.
    """
    width = len(x)
    assert max_shift >= width
    amt = Mux(amount > max_shift, max_shift, amount)
    wide = _wire(m, Cat(Const(0, max_shift), x) >> amt, name)
    return wide[max_shift:max_shift + width], wide[:max_shift].any()


def _coarse_right_shift(m: Module, s7, width: int) -> tuple[Signal, Signal]:
    """The multiplier's first right-shift step: ``s7.prod`` (``width`` bits) shifted right by
    eight times ``s7.right[3:6]``, and whether a shifted-out bit was one (the fine shift by
    ``s7.right[:3]`` follows a pipeline register later)."""
    coarse = Signal(width, name="rs_coarse")
    lost = Signal(name="rs_coarse_lost")
    with m.Switch(s7.right[3:6]):
        for k in range(8):
            with m.Case(k):
                m.d.comb += [coarse.eq(s7.prod >> (8 * k)),
                             lost.eq(s7.prod[:8 * k].any() if k else 0)]
    return coarse, lost


def _round_pack(m: Module, exp: Value, mant: Value, guard: Value, sticky: Value, mbits: int,
                exp_max: int) -> tuple[Value, Value]:
    """Round a significand to nearest even and pack it with its exponent.

    ``mant`` holds ``mbits + 1`` bits (hidden bit first) of a value whose biased exponent is
    ``exp >= 1``; a subnormal has ``exp == 1`` and a zero hidden bit. ``guard`` is the first
    dropped bit, ``sticky`` the OR of the rest. Returns the packed magnitude (without sign) and
    whether it overflowed to infinity. Adding the significand to ``(exp - 1) << mbits`` lets the
    hidden bit carry into the exponent field, so a rounding carry and a subnormal that rounds
    up to the smallest normal number come out right with no special case.
    """
    exp = Value.cast(exp)
    if not exp.shape().signed:
        exp = Cat(exp, Const(0, 1)).as_signed()
    round_up = guard & (sticky | mant[0])
    packed = _wire(m, ((exp - 1) << mbits) + mant + round_up, "packed")
    overflow = packed >= (exp_max << mbits)
    return packed[:mbits + exp_max.bit_length()], overflow


def _round_steps(m: Module, pipe: "_Pipeline", k: int, *, exp: Value, mant: Value, guard: Value,
                 sticky: Value, sign: Value, fixed: Value, use_fixed: Value) -> Value:
    """Round to nearest even and pack over two pipeline steps, ``k`` and ``k + 1`` (the last).

    The same arithmetic as :func:`_round_pack` for binary32, split so that no step holds more
    than one carry chain: step ``k`` forms the exponent field (``exp - 1`` plus the hidden bit,
    so a subnormal's zero hidden bit leaves it at 0), the rounding decision and the two ways the
    result can overflow (already, or by the rounding carry); step ``k + 1`` adds the rounding
    increment and selects infinity on overflow, or ``fixed`` (a special result decided
    earlier: NaN, infinity, zero) where ``use_fixed``. Returns step ``k + 1``'s output.
    """
    exp = Value.cast(exp)
    if not exp.shape().signed:
        exp = Cat(exp, Const(0, 1)).as_signed()
    hi = Signal(signed(len(exp) + 1), name="round_hi")
    m.d.comb += hi.eq(exp - 1 + mant[23])
    inf = Cat(Const(_FP32_INF, 31), sign)
    # ``hi >= 255`` and ``hi == 254`` as compares of ``exp`` with constants, beside the
    # sum (not after its carry chain): ``hi = exp - 1 + mant[23]``, so ``hi >= 255`` is
    # ``exp >= 256``, or ``exp == 255`` with the hidden bit; ``hi == 254`` is ``exp == 255``
    # without it, or ``exp == 254`` with it.
    w = len(exp)
    exp_ge_256 = ~exp[w - 1] & exp[8:w - 1].any() if w > 9 else Const(0, 1)
    ovf_now = exp_ge_256 | ((exp[:w] == _EXP_MAX) & mant[23])
    hi_is_254 = Mux(mant[23], exp[:w] == _EXP_MAX - 1, exp[:w] == _EXP_MAX)
    s = pipe.boundary(
        k,
        lo=mant[:23], hi=hi[:9], sign=sign,
        round_up=guard & (sticky | mant[0]),
        ovf_if_round=hi_is_254 & mant[:23].all(),
        use_fixed=use_fixed | ovf_now,
        fixed=Mux(use_fixed, fixed, inf),
    )
    packed = _wire(m, Cat(s.lo, s.hi) + s.round_up, "packed")
    result = Signal(32, name="result")
    with m.If(s.use_fixed):
        m.d.comb += result.eq(s.fixed)
    with m.Elif(s.ovf_if_round & s.round_up):
        m.d.comb += result.eq(Cat(Const(_FP32_INF, 31), s.sign))
    with m.Else():
        m.d.comb += result.eq(Cat(packed[:31], s.sign))
    return pipe.boundary(k + 1, o=result).o


class _Binary32(wiring.Component):
    """Shared signature of the two-operand pipelined binary32 components."""

    def __init__(self, latency: int, steps: int, reset_less: bool = False):
        try:
            self.latency = _check_latency(latency, steps)
        except ValueError as error:
            raise _refuse(self, error) from None
        self._steps = steps
        self.reset_less = bool(reset_less)
        super().__init__({
            "a": In(32),
            "b": In(32),
            "o": Out(32),
            "en": In(1, init=1),
        })


class FPAdd32(_Binary32):
    """binary32 addition ``o = a + b`` (or ``a - b`` with ``negate_b``), pipelined.

    Ports: ``a``, ``b`` (in, 32): operands; ``o`` (out, 32): result; ``en`` (in, init 1):
    advance the pipeline. One operation per cycle; ``latency`` (0..9, default 9) registers.

    Nine internal steps, each a few LUT levels deep so that the full-latency pipeline closes
    timing on a slow FPGA (like the 8-11 stage adders of vendor IP): (1) classify the operands
    (NaN, infinity) and compare the magnitudes; (2) resolve the special results, order the
    operands by magnitude and clamp the exponent difference; (3) align the smaller significand
    (3 extra bits: guard, round, sticky) by a multiple of 8 bits, collecting lost bits into a
    sticky bit, and form the normalising shift's limit from the exponent; (4) the remaining
    0..7 bits of alignment; (5) add or subtract the significands;
    (6) count leading zeros and choose the normalising shift (limited so the exponent never goes
    below the subnormal exponent; or a one-bit right shift on carry), and make its first 16 bits
    where it has them; (7) normalise (the rest of the shift, 0..15 bits); (8) decide
    the rounding and the overflow; (9) round to nearest even, pack, and select the special
    result where there is one.

    Results: RNE with subnormal inputs and outputs; an exact zero sum is ``+0`` unless both
    operands are ``-0`` (so ``x + (-x) = +0``); ``inf + x = inf``; ``inf - inf`` and any NaN
    operand give ``0x7FC00000``; overflow gives a signed infinity.
    """

    STEPS = 9

    def __init__(self, *, latency: int = 9, negate_b: bool = False, reset_less: bool = False):
        self.negate_b = bool(negate_b)
        super().__init__(latency, self.STEPS, reset_less)

    def elaborate(self, platform):
        m = Module()
        pipe = _Pipeline(m, self.en, self.STEPS, self.latency, self.reset_less)

        # Step 1: classify, special results, magnitude compare.
        b = Cat(self.b[:31], self.b[31] ^ self.negate_b)
        sa, ea, fa, ma, xa = _fp32_fields(self.a)
        sb, eb, fb, mb, xb = _fp32_fields(b)
        # (each operand's class in step 1, the special result from the classes in step 2:
        # both in step 1 were 7.8 ns in the gather)
        s1 = pipe.boundary(
            1,
            a_nan=_is_nan(ea, fa, _EXP_MAX), b_nan=_is_nan(eb, fb, _EXP_MAX),
            a_inf=_is_inf(ea, fa, _EXP_MAX), b_inf=_is_inf(eb, fb, _EXP_MAX),
            zero_sign=sa & sb,
            subtract=sa != sb,
            swap=b[:31] > self.a[:31],
            sa=sa, sb=sb, xa=xa, xb=xb, ma=ma, mb=mb,
            d_ab=(xa - xb)[:8], d_ba=(xb - xa)[:8],
        )
        nan = s1.a_nan | s1.b_nan | (s1.a_inf & s1.b_inf & s1.subtract)

        # Step 2: order by magnitude; the alignment shift, clamped to 32 (all sticky).
        diff = Mux(s1.swap, s1.d_ba, s1.d_ab)
        s2 = pipe.boundary(
            2,
            sign=Mux(s1.swap, s1.sb, s1.sa),
            exp=Mux(s1.swap, s1.xb, s1.xa),
            shift=Mux(diff > 32, 32, diff)[:6],
            m_big=Mux(s1.swap, s1.mb, s1.ma),
            m_small=Mux(s1.swap, s1.ma, s1.mb),
            special=nan | s1.a_inf | s1.b_inf,
            special_o=Mux(nan, FP32_QNAN,
                          Cat(Const(_FP32_INF, 31), Mux(s1.a_inf, s1.sa, s1.sb))),
            zero_sign=s1.zero_sign,
            subtract=s1.subtract,
        )

        # Steps 3 and 4: align with guard, round and sticky bits, 8 bits at a time then 0..7.
        x = Cat(Const(0, 3), s2.m_small)                          # 27 bits
        coarse = s2.shift[3:6]                                    # 0..4 bytes
        shifted = Signal(27, name="align_coarse")
        lost = Signal(name="align_coarse_lost")
        with m.Switch(coarse):
            for k in range(5):
                with m.Case(k):
                    m.d.comb += [shifted.eq(x >> (8 * k)),
                                 lost.eq(x[:8 * k].any() if k else 0)]
        limit = Signal(9, name="norm_limit")
        m.d.comb += limit.eq(s2.exp - 1)
        limit5 = Mux(limit > 26, 31, limit)[:5]
        s3 = pipe.boundary(3, x=shifted, sticky=lost, fine=s2.shift[:3], m_big=s2.m_big,
                           limit=limit5,
                           exp=s2.exp, sign=s2.sign, special=s2.special,
                           special_o=s2.special_o, zero_sign=s2.zero_sign, subtract=s2.subtract)
        fine_shifted = Signal(27, name="align_fine")
        fine_lost = Signal(name="align_fine_lost")
        with m.Switch(s3.fine):
            for k in range(8):
                with m.Case(k):
                    m.d.comb += [fine_shifted.eq(s3.x >> k),
                                 fine_lost.eq(s3.x[:k].any() if k else 0)]
        s4 = pipe.boundary(4, aligned=fine_shifted | fine_lost | s3.sticky, m_big=s3.m_big,
                           limit=s3.limit, exp=s3.exp, sign=s3.sign, special=s3.special,
                           special_o=s3.special_o, zero_sign=s3.zero_sign, subtract=s3.subtract)

        # Step 5: add or subtract; beside it, the normalising shift's limit (the exponent may
        # not go below the subnormal one) as a one-hot bit at position ``26 - limit``: OR-ed
        # into the sum it caps the leading-zero count at ``limit`` with no compare. The limit
        # (``exp - 1``, or 31 where it is 27 or more and caps nothing) is formed in step 3
        # from the exponent, which steps 3 and 4 do not change, so that step 5 decodes five
        # flip-flops (its subtraction and 9-bit compares there were 8.2 ns in the gather).
        big = Cat(Const(0, 3), s4.m_big)
        total = Mux(s4.subtract, big - s4.aligned, big + s4.aligned)[:28]
        cap = Signal(27, name="norm_cap")
        with m.Switch(s4.limit):
            for k in range(27):
                with m.Case(k):
                    m.d.comb += cap.eq(1 << (26 - k))
        extra5 = {"cap_hi": s4.limit <= 15} if self.reset_less else {}
        s5 = pipe.boundary(5, total=total, cap=cap, exp=s4.exp, sign=s4.sign,
                           special=s4.special, special_o=s4.special_o, zero_sign=s4.zero_sign,
                           **extra5)

        # Step 6: leading zeros of the sum, capped: the normalising shift (to a hidden bit at
        # position 26, or to the subnormal exponent); beside the count, the shift's first 16
        # bits (the count's bit 4: the capped sum's top 16 bits are zero), so that step 7
        # shifts by 0..15 only (the whole 0..31 shift there was 8.1 ns in the gather). With a
        # carry out (bit 27) the low 27 bits pass unshifted, for the right shift by one.
        capped = s5.total[:27] | s5.cap
        lz = count_leading_zeros(m, capped)
        if self.reset_less:
            # (without a reset the registers' set/reset input is free, and synthesis put
            # ``by16`` there to zero the low 16 bits, a LUT more on the step's longest path
            # once the FPGA flow gives a small set/reset net back as LUTs (8.04 ns in the
            # gather); a rotation by 16 moves ``total[11:27]`` there instead, which are zero
            # wherever ``by16`` is set: the same value, a 2:1 choice of two bits per bit.
            # ``cap_hi``, the cap among the top 16 bits, is a flip-flop made in step 5.)
            by16 = _wire(m, (s5.total[11:28] == 0) & ~s5.cap_hi, "norm_by16")
            low = Mux(by16, Cat(s5.total[11:27], s5.total[:11]), s5.total[:27])
        else:
            by16 = _wire(m, (capped[11:27] == 0) & ~s5.total[27], "norm_by16")
            low = Mux(by16, s5.total[:27] << 16, s5.total[:27])[:27]
        s6 = pipe.boundary(6, low=low,
                           carry=s5.total[27], shift=lz[:5],
                           exp=s5.exp, sign=s5.sign, is_zero=s5.total == 0,
                           special=s5.special, special_o=s5.special_o, zero_sign=s5.zero_sign)

        # Step 7: normalise.
        carry = s6.carry
        norm = Mux(carry, Cat(s6.low[0] | s6.low[1], s6.low[2:27], carry),
                   (s6.low << s6.shift[:4])[:27])
        exp = Mux(carry, s6.exp + 1, s6.exp - s6.shift)[:9]
        s7 = pipe.boundary(7, norm=norm, exp=exp, sign=s6.sign, is_zero=s6.is_zero,
                           special=s6.special, special_o=s6.special_o, zero_sign=s6.zero_sign)

        # Steps 8 and 9: round, pack, select.
        o = _round_steps(m, pipe, 8, exp=s7.exp, mant=s7.norm[3:27], guard=s7.norm[2],
                         sticky=s7.norm[:2].any(), sign=s7.sign,
                         fixed=Mux(s7.special, s7.special_o, Cat(Const(0, 31), s7.zero_sign)),
                         use_fixed=s7.special | s7.is_zero)
        m.d.comb += self.o.eq(o)
        return m


class FPSub32(FPAdd32):
    """binary32 subtraction ``o = a - b``: :class:`FPAdd32` with ``negate_b=True``.

    ``x - x = +0``; ``(-0) - (+0) = -0``; ``inf - inf`` is NaN. Otherwise as :class:`FPAdd32`.
    """

    def __init__(self, *, latency: int = 9):
        super().__init__(latency=latency, negate_b=True)


class FPMul32(_Binary32):
    """binary32 multiplication ``o = a * b``, pipelined.

    Ports and conventions as :class:`FPAdd32`; ``latency`` 0..11, default 11.

    Eleven internal steps. A subnormal operand is normalised on its way in (its significand
    shifted to a leading one and its exponent lowered), so that the product of two normalised
    24-bit significands has its leading one at bit 47 or 46 and the result needs at most a
    one-bit normalisation; only results below the normal range take the separate right-shift
    path. (1) classify each operand's fields, count the leading zeros of each byte of the
    subnormal significands; (2) and (3) combine the bytes' counts, normalise the significands
    (shifted left by multiples of 8 bits, then by 0..7 bits), sum the exponents and the leading
    zeros, classify each operand (NaN, infinity, zero) and then resolve the special results;
    (4) the product's exponent and four 12x12-bit partial products (each fits one 18x18 DSP
    block, and the step's register is the DSP's output register); (5) add the two middle
    partial products and compare the exponent for both positions of the product's leading
    one; (6) the 48-bit product; (7) one-bit normalisation and the right shift of
    a result below the subnormal exponent; (8) and (9) that right shift with sticky bits, by
    multiples of 8 bits and then 0..7 bits; (10) decide the rounding and the overflow; (11)
    round to nearest even, pack, and select the special result where there is one.

    ``three_dsps``: the partial products of step 4 as 18x18, 18x6 and 6x18 bits (three 18x18
    DSP blocks) and the 6x6-bit product of the high parts in LUTs (two sums of three rows in
    step 4, added in step 5), instead of four 12x12 DSP products: the same results, 25% fewer
    DSP blocks (the gather's 16 lanes have two multipliers each; the ECP5-85F has 156).
    ``narrow_shift``: the product's low 23 bits (below the guard bit of every right shift)
    ORed into one sticky bit in step 7, so that the right shift of steps 8 and 9 and its
    registers are 26 bits wide instead of 48: the same results, fewer LUTs and flip-flops.

    Results: RNE with subnormal inputs and outputs; the sign of a zero or infinite result is the
    XOR of the operands' signs; ``0 * inf`` and any NaN operand give ``0x7FC00000``; overflow
    gives a signed infinity; underflow rounds to a subnormal or a signed zero.
    """

    STEPS = 11

    def __init__(self, *, latency: int = STEPS, reset_less: bool = False,
                 three_dsps: bool = False, narrow_shift: bool = False):
        self.three_dsps = bool(three_dsps)
        self.narrow_shift = bool(narrow_shift)
        super().__init__(latency, self.STEPS, reset_less)

    def elaborate(self, platform):
        m = Module()
        pipe = _Pipeline(m, self.en, self.STEPS, self.latency, self.reset_less)

        sa, ea, fa, ma, xa = _fp32_fields(self.a)
        sb, eb, fb, mb, xb = _fp32_fields(self.b)
        # Step 1: per-operand field flags (each a function of at most 23 bits) and the
        # leading zeros of the (possibly subnormal) significands, per byte; the flags are
        # combined into the special result in step 2, so that step 1 holds only the counts.
        # (a subnormal's leading zeros are one more than its fraction's; a normal significand
        # has none: the count is gated by the exponent's zero test in step 2, so that the test
        # (which synthesis had put on the count registers' reset input) is not in series with
        # the count, 8.2 ns in the gather. The count is made in two halves, each byte's count
        # and zero test in step 1 and their combination in step 2: the whole 24-bit count
        # and its zero test were still the gather's critical path, 8.3 ns, six LUTs deep.)
        lka = leading_zero_chunks(m, Cat(fa, Const(0, 1)), "lza")
        lkb = leading_zero_chunks(m, Cat(fb, Const(0, 1)), "lzb")
        s1 = pipe.boundary(
            1,
            a_emax=ea == _EXP_MAX, b_emax=eb == _EXP_MAX,
            a_ezero=ea == 0, b_ezero=eb == 0,
            a_fzero=fa == 0, b_fzero=fb == 0,
            sign=sa ^ sb, ma=ma, mb=mb, xa=xa, xb=xb,
            **{f"a_{k}": v for k, v in lka.items()}, **{f"b_{k}": v for k, v in lkb.items()},
        )
        lza = _wire(m, Mux(s1.a_ezero, leading_zeros_from_chunks(
            {k: getattr(s1, f"a_{k}") for k in lka}, 24)[:5], 0), "lza_g")
        lzb = _wire(m, Mux(s1.b_ezero, leading_zeros_from_chunks(
            {k: getattr(s1, f"b_{k}") for k in lkb}, 24)[:5], 0), "lzb_g")
        # (each operand's class in step 2, the special result from the classes in step 3:
        # both in step 2 were 8.2 ns in the gather's drain multipliers)
        a_nan, b_nan = s1.a_emax & ~s1.a_fzero, s1.b_emax & ~s1.b_fzero
        a_inf, b_inf = s1.a_emax & s1.a_fzero, s1.b_emax & s1.b_fzero
        a_zero, b_zero = s1.a_ezero & s1.a_fzero, s1.b_ezero & s1.b_fzero

        # Steps 2 and 3: normalised significands (shifted by multiples of 8 bits, then by 0..7
        # bits: one shift of 0..23 bits with its 5-bit amount fanned out to every bit was the
        # longest step in the gather unit); exponent of the product with its leading one at
        # bit 47 (value = P / 2**47 * 2**(E - 127)).
        # (the exponent's two sums in step 2, their difference in step 4: one carry chain each)
        # (no reset on the partial products' registers, which are the DSP blocks' output
        # registers on an FPGA, nor on the significands', which can be their input
        # registers: `host.bench.timing.absorb_dsp_registers`)
        # (the counts' sum in step 3: their combination in step 2 goes first)
        s2 = pipe.boundary(2, x_sum=s1.xa + s1.xb, lza=lza, lzb=lzb, sign=s1.sign,
                           a_nan=a_nan, b_nan=b_nan, a_inf=a_inf, b_inf=b_inf,
                           a_zero=a_zero, b_zero=b_zero)
        nan = s2.a_nan | s2.b_nan | (s2.a_inf & s2.b_zero) | (s2.b_inf & s2.a_zero)
        special = nan | s2.a_inf | s2.b_inf | s2.a_zero | s2.b_zero
        special_o = Mux(nan, FP32_QNAN,
                        Cat(Mux(s2.a_inf | s2.b_inf, Const(_FP32_INF, 31), Const(0, 31)),
                            s2.sign))
        s2n = pipe.boundary(2, reset_less=True, na=(s1.ma << (lza[3:5] * 8))[:24],
                            nb=(s1.mb << (lzb[3:5] * 8))[:24],
                            fa=lza[:3], fb=lzb[:3])
        s3 = pipe.boundary(3, x_sum=s2.x_sum, lz_sum=s2.lza + s2.lzb, sign=s2.sign,
                           special=special, special_o=special_o)
        s3n = pipe.boundary(3, reset_less=True, na=(s2n.na << s2n.fa)[:24],
                            nb=(s2n.nb << s2n.fb)[:24])

        # Step 4: partial products, 12 x 12 bits each (``three_dsps``: 18 x 18, 18 x 6 and
        # 6 x 18 bits in three DSP blocks, and the 6 x 6 bits of the high halves in LUTs).
        split = 18 if self.three_dsps else 12
        a_lo, a_hi, b_lo, b_hi = (s3n.na[:split], s3n.na[split:], s3n.nb[:split],
                                  s3n.nb[split:])
        exp0 = Signal(signed(12), name="exp0")
        m.d.comb += exp0.eq(s3.x_sum - 126 - s3.lz_sum)
        s4 = pipe.boundary(4, exp0=exp0, sign=s3.sign, special=s3.special,
                           special_o=s3.special_o)
        if self.three_dsps:
            # (the 6 x 6 product as two sums of three shifted rows each, added in step 5:
            # written as ANDs and sums, not a product, which synthesis would give a DSP)
            rows = [Mux(b_hi[i], a_hi, 0) for i in range(6)]
            s4p = pipe.boundary(4, reset_less=True, ll=a_lo * b_lo, lh=a_lo * b_hi,
                                hl=a_hi * b_lo)
            s4h = pipe.boundary(4, hh0=(rows[0] + (rows[1] << 1) + (rows[2] << 2))[:9],
                                hh1=(rows[3] + (rows[4] << 1) + (rows[5] << 2))[:9])
            hh = (s4h.hh0 + (s4h.hh1 << 3))[:12]
        else:
            s4p = pipe.boundary(4, reset_less=True, ll=a_lo * b_lo, lh=a_lo * b_hi,
                                hl=a_hi * b_lo, hh=a_hi * b_hi)
            hh = s4p.hh
        # Step 5: the middle terms; beside them, what the result's exponent and right shift
        # need for either position of the product's leading one (``exp0`` and ``exp0 - 1``):
        # ``1 - exp`` and its two compares, made on ``exp0`` itself, so that step 6 only
        # selects (``1 - exp > 0`` is ``exp <= 0``, ``> 56`` is ``exp < -55``).
        u_hi = Signal(signed(13), name="u_hi")
        u_lo = Signal(signed(13), name="u_lo")
        m.d.comb += [u_hi.eq(1 - s4.exp0), u_lo.eq(2 - s4.exp0)]
        s5m = pipe.boundary(5, outer=Cat(s4p.ll[:2 * split], hh[:48 - 2 * split]),
                            mid=(s4p.lh + s4p.hl)[:25],
                            exp0=s4.exp0, exp0m1=s4.exp0 - 1,
                            under_hi=u_hi[:6], under_lo=u_lo[:6],
                            below_hi=s4.exp0 <= 0, below_lo=s4.exp0 <= 1,
                            deep_hi=s4.exp0 < -55, deep_lo=s4.exp0 < -54,
                            sign=s4.sign, special=s4.special, special_o=s4.special_o)
        # Step 6: the product (its leading one at bit 47 or 46); beside it, the result's
        # exponent and right shift for either position of the leading one.
        right_hi = Mux(s5m.below_hi, Mux(s5m.deep_hi, 56, s5m.under_hi), 0)[:6]
        exp_hi = Mux(s5m.below_hi, 1, s5m.exp0)
        right_lo = Mux(s5m.below_lo, Mux(s5m.deep_lo, 56, s5m.under_lo), 0)[:6]
        exp_lo = Mux(s5m.below_lo, 1, s5m.exp0m1)
        s6 = pipe.boundary(6, product=(s5m.outer + (s5m.mid << split))[:48], right_hi=right_hi,
                           exp_hi=exp_hi, right_lo=right_lo, exp_lo=exp_lo,
                           sign=s5m.sign, special=s5m.special, special_o=s5m.special_o)

        # Step 7: one-bit normalisation; pick the exponent and right shift.
        top = s6.product[47]
        normed = Mux(top, s6.product, Cat(Const(0, 1), s6.product[:47]))
        if self.narrow_shift:
            # (``narrow_shift``: the low 23 bits, below the guard bit of every shift, only
            # ever reach the sticky bit: their OR in one bit below the upper 25, so that the
            # right shift of steps 8 and 9 moves 26 bits, not 48)
            normed = Cat(Mux(top, s6.product[:23].any(), s6.product[:22].any()), normed[23:])
        s7 = pipe.boundary(7, prod=normed,
                           right=Mux(top, s6.right_hi, s6.right_lo),
                           exp=Mux(top, s6.exp_hi, s6.exp_lo),
                           sign=s6.sign, special=s6.special, special_o=s6.special_o)

        # Steps 8 and 9: the right shift with sticky bits.
        if self.narrow_shift:
            o = self._narrow_right_shift(m, pipe, s7)
            m.d.comb += self.o.eq(o)
            return m
        coarse, lost = _coarse_right_shift(m, s7, 48)
        s8 = pipe.boundary(8, prod=coarse, sticky=lost, fine=s7.right[:3], exp=s7.exp,
                           sign=s7.sign, special=s7.special, special_o=s7.special_o)
        # (the sticky bit of a shift by ``k`` is the OR of the product's low ``23 + k`` bits:
        # its low 23 bits, which every shift loses, OR-ed beside the shift, and bits
        # ``23 .. 22 + k`` chosen by ``k``, so that no OR tree follows the shift's multiplexer)
        fine = Signal(48, name="rs_fine")
        fine_lost = Signal(name="rs_fine_lost")
        with m.Switch(s8.fine):
            for k in range(8):
                with m.Case(k):
                    m.d.comb += [fine.eq(s8.prod >> k),
                                 fine_lost.eq(s8.prod[23:23 + k].any() if k else 0)]
        s9 = pipe.boundary(9, mant=fine[24:48], guard=fine[23],
                           sticky=s8.prod[:23].any() | fine_lost | s8.sticky, exp=s8.exp,
                           sign=s8.sign, special=s8.special, special_o=s8.special_o)

        # Steps 10 and 11: round, pack, select.
        o = _round_steps(m, pipe, 10, exp=s9.exp, mant=s9.mant, guard=s9.guard,
                         sticky=s9.sticky, sign=s9.sign, fixed=s9.special_o,
                         use_fixed=s9.special)
        m.d.comb += self.o.eq(o)
        return m

    def _narrow_right_shift(self, m: Module, pipe: _Pipeline, s7: _Stage) -> Value:
        """Steps 8 to 11 with ``narrow_shift``: ``s7.prod`` is the product's upper 25 bits
        above the OR of its low 23 (bit 0). Shifted right by ``r``, its bits 2.. are the
        significand, bit 1 the guard bit, and bit 0 with every bit shifted out the sticky bit:
        the same three values as the 48-bit shift gives."""
        coarse, lost = _coarse_right_shift(m, s7, 26)
        s8 = pipe.boundary(8, prod=coarse, sticky=lost, fine=s7.right[:3], exp=s7.exp,
                           sign=s7.sign, special=s7.special, special_o=s7.special_o)
        fine = Signal(26, name="rs_fine")
        fine_sticky = Signal(name="rs_fine_sticky")
        with m.Switch(s8.fine):
            for k in range(8):
                with m.Case(k):
                    m.d.comb += [fine.eq(s8.prod >> k),
                                 fine_sticky.eq(s8.prod[:k + 1].any())]
        s9 = pipe.boundary(9, mant=fine[2:26], guard=fine[1], sticky=fine_sticky | s8.sticky,
                           exp=s8.exp, sign=s8.sign, special=s8.special,
                           special_o=s8.special_o)
        return _round_steps(m, pipe, 10, exp=s9.exp, mant=s9.mant, guard=s9.guard,
                            sticky=s9.sticky, sign=s9.sign, fixed=s9.special_o,
                            use_fixed=s9.special)


def _order_key(x: Value) -> Value:
    """An unsigned key whose order is the floating-point order of non-NaN binary32 values
    (``-0`` sorts just below ``+0``)."""
    return Mux(x[31], ~x, x | 0x80000000)[:32]


def fp32_greater_terms(a: Value, b: Value) -> tuple[Value, Value]:
    """The two independent terms of ``a > b`` in IEEE order: ``(ordered, comparable)``, where
    ``ordered`` compares the bit patterns as ordered keys (a carry chain) and ``comparable``
    is false when either is NaN or both are zeros; ``a > b`` is ``ordered & comparable``. A
    pipelined caller registers the two apart so that neither waits for the other."""
    a, b = Value.cast(a), Value.cast(b)
    nan = _is_nan(a[23:31], a[:23], _EXP_MAX) | _is_nan(b[23:31], b[:23], _EXP_MAX)
    both_zero = (a[:31] == 0) & (b[:31] == 0)
    return _order_key(a) > _order_key(b), ~nan & ~both_zero


def fp32_greater_halves(a: Value, b: Value) -> tuple[Value, Value, Value, Value]:
    """:func:`fp32_greater_terms` with the ordered-key compare in two 16-bit halves:
    ``(gt_hi, ge_hi, gt_lo, comparable)``, where ``ordered`` is ``gt_hi | (ge_hi & gt_lo)``.
    Three carry chains of half the length instead of one; a pipelined caller registers the
    four terms and combines them on the next cycle (the gather's max selector: the 32-bit
    chain from its operands' registers was 8.3 ns on the ECP5 flow)."""
    a, b = Value.cast(a), Value.cast(b)
    ka, kb = _order_key(a), _order_key(b)
    _, comparable = fp32_greater_terms(a, b)
    return ka[16:] > kb[16:], ka[16:] >= kb[16:], ka[:16] > kb[:16], comparable


def fp32_greater(a: Value, b: Value) -> Value:
    """``a > b`` in IEEE order: false if either is NaN; ``+0 > -0`` is false."""
    ordered, comparable = fp32_greater_terms(a, b)
    return comparable & ordered


def fp32_less(a: Value, b: Value) -> Value:
    """``a < b`` in IEEE order: false if either is NaN; ``-0 < +0`` is false."""
    return fp32_greater(b, a)


_NAN_RULES = ("propagate", "compare")


class _Select32(wiring.Component):
    def __init__(self, latency: int, take_b_if_greater: bool, nan: str = "propagate"):
        try:
            self.latency = _check_latency(latency, 1)
            if nan not in _NAN_RULES:
                raise ValueError(f"nan: expected one of {_NAN_RULES}, got {nan!r}")
        except ValueError as error:
            raise _refuse(self, error) from None
        self.nan = nan
        self._greater = take_b_if_greater
        super().__init__({
            "a": In(32),
            "b": In(32),
            "o": Out(32),
            "sel_b": Out(1),
            "en": In(1, init=1),
        })

    def elaborate(self, platform):
        m = Module()
        pipe = _Pipeline(m, self.en, 1, self.latency)
        a_nan = _is_nan(self.a[23:31], self.a[:23], _EXP_MAX)
        b_nan = _is_nan(self.b[23:31], self.b[:23], _EXP_MAX)
        better = fp32_greater(self.b, self.a) if self._greater else fp32_less(self.b, self.a)
        sel_b = ~a_nan & (b_nan | better) if self.nan == "propagate" else better
        s1 = pipe.boundary(1, o=Mux(sel_b, self.b, self.a), sel_b=sel_b)
        m.d.comb += [self.o.eq(s1.o), self.sel_b.eq(s1.sel_b)]
        return m


class FPMax32(_Select32):
    """binary32 maximum with first-operand tie-breaking, for MAX pooling.

    Ports: ``a``, ``b`` (in, 32); ``o`` (out, 32) = the chosen operand, bits unchanged;
    ``sel_b`` (out, 1): ``o`` came from ``b`` (lets a pooling unit track the arg-max);
    ``en`` (in, init 1). ``latency`` 0 (default, combinational) or 1.

    ``o = b`` exactly when ``b > a`` in IEEE order or ``b`` is NaN while ``a`` is not;
    otherwise ``o = a``. So equal values, including ``-0`` vs ``+0`` (equal in IEEE), keep the
    first operand (``max(-0, +0) = -0``, ``max(+0, -0) = +0``), matching "max ties go to the
    first index" when ``a`` is the running maximum and ``b`` the next row.

    NaN, chosen by ``nan``: ``"propagate"`` (default, like ``torch.max`` of two tensors): if
    ``a`` is NaN, ``a``; else if ``b`` is NaN, ``b``. ``"compare"``: ``o = b`` exactly when
    ``b > a`` in IEEE order, which is false whenever either is NaN, so a NaN ``a`` stays and a
    NaN ``b`` is ignored - the rule of torch's CPU ``EmbeddingBag`` MAX pooling, whose running
    maximum takes a row only where ``row > max``.
    """

    def __init__(self, *, latency: int = 0, nan: str = "propagate"):
        super().__init__(latency, take_b_if_greater=True, nan=nan)


class FPMin32(_Select32):
    """binary32 minimum, the mirror of :class:`FPMax32`: ``o = b`` exactly when ``b < a`` or
    ``b`` is NaN while ``a`` is not; ties (and ``±0``) keep ``a``; NaN propagates."""

    def __init__(self, *, latency: int = 0):
        super().__init__(latency, take_b_if_greater=False)


class _Unary(wiring.Component):
    def __init__(self, in_width: int, out_width: int, latency: int, steps: int):
        try:
            self.latency = _check_latency(latency, steps)
        except ValueError as error:
            raise _refuse(self, error) from None
        self._steps = steps
        super().__init__({
            "a": In(in_width),
            "o": Out(out_width),
            "en": In(1, init=1),
        })


class _Widen(_Unary):
    def __init__(self, ebits: int, mbits: int, latency: int):
        self._ebits, self._mbits = ebits, mbits
        super().__init__(1 + ebits + mbits, 32, latency, 1)

    def elaborate(self, platform):
        m = Module()
        pipe = _Pipeline(m, self.en, 1, self.latency)
        eb, mb = self._ebits, self._mbits
        sign, exp, frac = self.a[eb + mb], self.a[mb:mb + eb], self.a[:mb]
        bias_diff = 127 - (2 ** (eb - 1) - 1)
        result = Signal(32)
        if eb == 8:
            # Same exponent range: append zeros to the fraction.
            m.d.comb += result.eq(Cat(Const(0, 23 - mb), frac, exp, sign))
        else:
            lz = count_leading_zeros(m, frac)              # for subnormals: frac != 0
            with m.If(exp == 2 ** eb - 1):
                m.d.comb += result.eq(Cat(Const(0, 23 - mb), frac, Const(0xFF, 8), sign))
            with m.Elif(exp != 0):
                m.d.comb += result.eq(Cat(Const(0, 23 - mb), frac, exp + bias_diff, sign))
            with m.Elif(frac == 0):
                m.d.comb += result.eq(Cat(Const(0, 31), sign))
            with m.Else():
                # value = frac * 2**(1 - bias - mb): move the leading one out as the hidden bit.
                norm = (frac << (lz + 1))[:mb]
                m.d.comb += result.eq(Cat(Const(0, 23 - mb), norm,
                                          (Const(bias_diff, 8) - lz)[:8], sign))
        s1 = pipe.boundary(1, o=result)
        m.d.comb += self.o.eq(s1.o)
        return m


class FP16ToFP32(_Widen):
    """IEEE binary16 -> binary32, exact (every binary16 value is representable).

    Ports: ``a`` (in, 16), ``o`` (out, 32), ``en`` (in, init 1); ``latency`` 0 or 1 (default).
    Subnormal binary16 values become normal binary32 values; zeros and infinities keep their
    sign; a NaN keeps its sign and payload (the fraction shifted left by 13).
    """

    def __init__(self, *, latency: int = 1):
        super().__init__(5, 10, latency)


class BF16ToFP32(_Widen):
    """bfloat16 -> binary32, exact: the bfloat16 bits become the upper half (``o = a << 16``).

    Ports: ``a`` (in, 16), ``o`` (out, 32), ``en`` (in, init 1); ``latency`` 0 or 1 (default).
    Every value, NaN payloads included, is preserved.
    """

    def __init__(self, *, latency: int = 1):
        super().__init__(8, 7, latency)


class _Narrow(_Unary):
    def __init__(self, ebits: int, mbits: int, qnan: int, latency: int):
        self._ebits, self._mbits, self._qnan = ebits, mbits, qnan
        super().__init__(32, 1 + ebits + mbits, latency, 1)

    def elaborate(self, platform):
        m = Module()
        pipe = _Pipeline(m, self.en, 1, self.latency)
        eb, mb = self._ebits, self._mbits
        exp_max = 2 ** eb - 1
        sign, exp, frac, mant, eff = _fp32_fields(self.a)
        # Biased exponent in the target format; below 1 the value is (or rounds to) subnormal.
        target = Signal(signed(10))
        m.d.comb += target.eq(eff - (127 - (2 ** (eb - 1) - 1)))
        drop = 23 - mb                                   # fraction bits that are rounded away
        right = Signal(8)
        with m.If(target < 1):
            m.d.comb += right.eq(Mux(target < -63, 64, 1 - target)[:8])
        shifted, lost = _shift_right_sticky(m, mant, right, 64)
        packed, overflow = _round_pack(m, Mux(target < 1, 1, target), shifted[drop:24],
                                       shifted[drop - 1], shifted[:drop - 1].any() | lost,
                                       mb, exp_max)
        result = Signal(1 + eb + mb)
        with m.If(_is_nan(exp, frac, _EXP_MAX)):
            m.d.comb += result.eq(self._qnan)
        with m.Elif(_is_inf(exp, frac, _EXP_MAX) | overflow):
            m.d.comb += result.eq(Cat(Const(exp_max << mb, eb + mb), sign))
        with m.Else():
            m.d.comb += result.eq(Cat(packed[:eb + mb], sign))
        s1 = pipe.boundary(1, o=result)
        m.d.comb += self.o.eq(s1.o)
        return m


class FP32ToFP16(_Narrow):
    """binary32 -> IEEE binary16, round to nearest even.

    Ports: ``a`` (in, 32), ``o`` (out, 16), ``en`` (in, init 1); ``latency`` 0 or 1 (default).
    Values beyond the binary16 range (``>= 65520`` in magnitude) become signed infinity; small
    values round to binary16 subnormals or a signed zero; NaN becomes ``0x7E00``.
    """

    def __init__(self, *, latency: int = 1):
        super().__init__(5, 10, FP16_QNAN, latency)


class FP32ToBF16(_Narrow):
    """binary32 -> bfloat16, round to nearest even on the upper 16 bits.

    Ports: ``a`` (in, 32), ``o`` (out, 16), ``en`` (in, init 1); ``latency`` 0 or 1 (default).
    Rounding past the largest finite bfloat16 gives signed infinity; binary32 subnormals round
    to bfloat16 subnormals or a signed zero; NaN becomes ``0x7FC0``.
    """

    def __init__(self, *, latency: int = 1):
        super().__init__(8, 7, BF16_QNAN, latency)


def _check_int_format(width: object, signed_: object) -> tuple[int, bool]:
    if isinstance(width, bool) or not isinstance(width, int) or not 2 <= width <= 32:
        raise ValueError(f"width: expected an integer in 2..32, got {width!r}")
    if not isinstance(signed_, bool):
        raise ValueError(f"signed: expected a bool, got {signed_!r}")
    return width, signed_


class FP32ToInt(_Unary):
    """binary32 -> integer, round to nearest even, saturating.

    Ports: ``a`` (in, 32); ``o`` (out, ``width``): two's complement if ``signed`` else
    unsigned; ``en`` (in, init 1). ``latency`` 0..2 (default 2).

    ``o = clamp(rne(a), lo, hi)`` with ``[lo, hi] = [-2**(width-1), 2**(width-1) - 1]`` when
    ``signed``, else ``[0, 2**width - 1]`` (the INT8 quantizer uses ``width=8, signed=False``).
    Infinities saturate; NaN gives 0. ``rne(0.5) = 0``, ``rne(1.5) = rne(2.5) = 2``.
    """

    STEPS = 2

    def __init__(self, *, width: int = 8, signed: bool = False, latency: int = 2):
        try:
            self.width, self.signed = _check_int_format(width, signed)
        except ValueError as error:
            raise _refuse(self, error) from None
        self.lo = -2 ** (width - 1) if signed else 0
        self.hi = 2 ** (width - 1) - 1 if signed else 2 ** width - 1
        super().__init__(32, width, latency, self.STEPS)

    def elaborate(self, platform):
        m = Module()
        pipe = _Pipeline(m, self.en, self.STEPS, self.latency)
        sign, exp, frac, mant, eff = _fp32_fields(self.a)
        nan = _is_nan(exp, frac, _EXP_MAX)
        # value = mant * 2**(eff - 150). Any magnitude >= 2**33 saturates every format here.
        huge = eff >= 150 + 10
        left = Mux(eff > 150, eff - 150, 0)[:4]
        right = Mux(eff < 150, 150 - eff, 0)[:8]
        s1 = pipe.boundary(1, wide=(mant << left)[:34], right=right, huge=huge, nan=nan,
                           sign=sign)
        shifted, lost = _shift_right_sticky(m, Cat(Const(0, 1), s1.wide), s1.right, 64)
        integer, guard = shifted[1:], shifted[0]
        magnitude = integer + (guard & (lost | integer[0]))
        result = Signal(self.width)
        with m.If(s1.nan):
            m.d.comb += result.eq(0)
        with m.Elif(~s1.sign & (s1.huge | (magnitude > self.hi))):
            m.d.comb += result.eq(self.hi)
        with m.Elif(s1.sign & (s1.huge | (magnitude > -self.lo))):
            m.d.comb += result.eq(self.lo)
        with m.Elif(s1.sign):
            m.d.comb += result.eq(-magnitude)
        with m.Else():
            m.d.comb += result.eq(magnitude)
        s2 = pipe.boundary(2, o=result)
        m.d.comb += self.o.eq(s2.o)
        return m


class IntToFP32(_Unary):
    """Integer -> binary32, round to nearest even (exact for magnitudes below ``2**24``).

    Ports: ``a`` (in, ``width``): two's complement if ``signed`` else unsigned; ``o`` (out,
    32); ``en`` (in, init 1). ``latency`` 0..2 (default 2). Zero gives ``+0``.
    """

    STEPS = 2

    def __init__(self, *, width: int = 8, signed: bool = False, latency: int = 2):
        try:
            self.width, self.signed = _check_int_format(width, signed)
        except ValueError as error:
            raise _refuse(self, error) from None
        super().__init__(width, 32, latency, self.STEPS)

    def elaborate(self, platform):
        m = Module()
        pipe = _Pipeline(m, self.en, self.STEPS, self.latency)
        w = self.width
        if self.signed:
            sign = self.a[w - 1]
            magnitude = Mux(sign, -self.a.as_signed(), self.a)[:w]
        else:
            sign = Const(0, 1)
            magnitude = self.a
        lz = count_leading_zeros(m, magnitude)
        # Leading one to bit 31 of a 32-bit field; value = norm/2**31 * 2**(31 - lz).
        norm = (Cat(Const(0, 32 - w), magnitude) << lz)[:32]
        s1 = pipe.boundary(1, norm=norm, exp=126 + w - lz, zero=magnitude == 0, sign=sign)
        packed, _ = _round_pack(m, s1.exp, s1.norm[8:32], s1.norm[7], s1.norm[:7].any(), 23,
                                _EXP_MAX)
        result = Mux(s1.zero, 0, Cat(packed[:31], s1.sign))
        s2 = pipe.boundary(2, o=result)
        m.d.comb += self.o.eq(s2.o)
        return m


class FPDiv32(wiring.Component):
    """binary32 division ``a / b``, iterative, stream interface.

    Ports: ``i`` (in, stream of ``{a, b}``), ``o`` (out, stream of 32-bit results). One
    division at a time. A result appears on ``o`` exactly ``latency`` cycles after its operands
    were accepted and stays until taken (``o.ready``); the next operands are accepted on the
    cycle the result is taken (or any later cycle), so with ``o.ready`` held high the unit
    completes one division every ``latency`` cycles.

    ``bits_per_cycle`` (1..27, default 1) quotient bits are developed per cycle:
    ``latency = ceil(27 / bits_per_cycle) + 2`` (29 by default; 5 with 9 bits a cycle). More
    bits a cycle cost a longer combinational chain of subtract-and-select steps.

    The significands are first normalised (so subnormal operands cost nothing extra), then at
    least 27 quotient bits are developed by restoring division; the remainder supplies the
    sticky bit, so the result is correctly rounded to nearest even, subnormal results included.

    Specials: NaN operand, ``0/0`` and ``inf/inf`` give ``0x7FC00000``; ``x/0`` (``x`` not 0 or
    NaN) and ``inf/y`` give a signed infinity; ``0/y`` and ``x/inf`` a signed zero. The sign of
    every non-NaN result is the XOR of the operand signs.
    """

    MIN_QUOTIENT_BITS = 27          # 24 significand bits, one for normalisation, guard, round
    #: ``latency`` with the default ``bits_per_cycle=1``.
    LATENCY = MIN_QUOTIENT_BITS + 2

    def __init__(self, *, bits_per_cycle: int = 1):
        if (isinstance(bits_per_cycle, bool) or not isinstance(bits_per_cycle, int)
                or not 1 <= bits_per_cycle <= self.MIN_QUOTIENT_BITS):
            raise _refuse(self, ValueError(
                f"bits_per_cycle: expected an integer in 1..{self.MIN_QUOTIENT_BITS}, got "
                f"{bits_per_cycle!r}"))
        self.bits_per_cycle = bits_per_cycle
        self.iterations = -(-self.MIN_QUOTIENT_BITS // bits_per_cycle)
        self.quotient_bits = self.iterations * bits_per_cycle
        self.latency = self.iterations + 2
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({"a": 32, "b": 32}))),
            "o": Out(stream.Signature(32)),
        })

    def elaborate(self, platform):
        m = Module()
        qb = self.quotient_bits
        a, b = self.i.payload.a, self.i.payload.b
        sa, ea, fa, ma, xa = _fp32_fields(a)
        sb, eb, fb, mb, xb = _fp32_fields(b)
        lza, lzb = count_leading_zeros(m, ma, "lza"), count_leading_zeros(m, mb, "lzb")

        sign = Signal()
        special = Signal()
        special_value = Signal(32)
        exp0 = Signal(signed(12))          # biased exponent if the quotient is in [1, 2)
        divisor = Signal(24)
        remainder = Signal(25)
        quotient = Signal(qb)
        count = Signal(range(self.iterations + 1))
        result = Signal(32)

        a_nan, b_nan = _is_nan(ea, fa, _EXP_MAX), _is_nan(eb, fb, _EXP_MAX)
        a_inf, b_inf = _is_inf(ea, fa, _EXP_MAX), _is_inf(eb, fb, _EXP_MAX)
        a_zero, b_zero = a[:31] == 0, b[:31] == 0
        s = sa ^ sb
        classify = Signal(32)
        is_special = Signal()
        m.d.comb += is_special.eq(1)
        with m.If(a_nan | b_nan | (a_zero & b_zero) | (a_inf & b_inf)):
            m.d.comb += classify.eq(FP32_QNAN)
        with m.Elif(a_inf | b_zero):
            m.d.comb += classify.eq(Cat(Const(_FP32_INF, 31), s))
        with m.Elif(a_zero | b_inf):
            m.d.comb += classify.eq(Cat(Const(0, 31), s))
        with m.Else():
            m.d.comb += is_special.eq(0)

        # Restoring division, bits_per_cycle steps: each develops one quotient bit.
        rem = remainder
        new_bits = []
        for k in range(self.bits_per_cycle):
            fits = rem >= divisor
            rem = _wire(m, (Mux(fits, (rem - divisor)[:25], rem) << 1)[:25], f"rem{k}")
            new_bits.append(fits)
        step_quotient = Cat(*reversed(new_bits), quotient)[:qb]

        # Final rounding (combinational from the registered quotient and remainder).
        # quotient = floor(A * 2**(qb - 1) / B) with A, B normalised: in [2**(qb-2), 2**qb).
        top = quotient[qb - 1]
        q_norm = Mux(top, quotient, quotient << 1)[:qb]
        exp = Signal(signed(12))
        m.d.comb += exp.eq(Mux(top, exp0, exp0 - 1))
        right = Signal(8)
        with m.If(exp < 1):
            m.d.comb += right.eq(Mux(exp < -63, 64, 1 - exp)[:8])
        shifted, lost = _shift_right_sticky(m, q_norm, right, 64)
        packed, overflow = _round_pack(m, Mux(exp < 1, 1, exp), shifted[qb - 24:qb],
                                       shifted[qb - 25], shifted[:qb - 25].any() | lost
                                       | (remainder != 0), 23, _EXP_MAX)
        with m.If(overflow):
            m.d.comb += result.eq(Cat(Const(_FP32_INF, 31), sign))
        with m.Else():
            m.d.comb += result.eq(Cat(packed[:31], sign))

        accept = Signal()
        with m.If(accept & self.i.valid):
            m.d.sync += [
                sign.eq(s),
                special.eq(is_special),
                special_value.eq(classify),
                exp0.eq((xa - lza) - (xb - lzb) + 127),
                remainder.eq((ma << lza)[:24]),
                divisor.eq((mb << lzb)[:24]),
                quotient.eq(0),
                count.eq(self.iterations),
            ]
        m.d.comb += self.i.ready.eq(accept)

        with m.FSM(name="div"):
            with m.State("IDLE"):
                m.d.comb += accept.eq(1)
                with m.If(self.i.valid):
                    m.next = "DIVIDE"
            with m.State("DIVIDE"):
                m.d.sync += [quotient.eq(step_quotient), remainder.eq(rem), count.eq(count - 1)]
                with m.If(count == 1):
                    m.next = "ROUND"
            with m.State("ROUND"):
                m.d.sync += self.o.payload.eq(Mux(special, special_value, result))
                m.next = "OUTPUT"
            with m.State("OUTPUT"):
                m.d.comb += self.o.valid.eq(1)
                with m.If(self.o.ready):
                    # The result leaves; new operands may enter on the same cycle.
                    m.d.comb += accept.eq(1)
                    m.next = "IDLE"
                    with m.If(self.i.valid):
                        m.next = "DIVIDE"
        return m


def int8_rowwise_formula() -> str:
    """The INT8 row-wise quantization that a datapath built from these components computes.

    Every operation is one binary32 operation, rounded to nearest even (``fl(.)``)::

        lo, hi     = min(row), max(row)          # FPMin32 / FPMax32 over the row
        range      = fl(hi - lo)                 # FPSub32
        scale      = fl(range / 255)             # FPDiv32            (sent with the row)
        bias       = lo                          #                    (sent with the row)
        inv_scale  = fl(255 / range) if range > 0 else 0      # FPDiv32
        q[i]       = sat_u8(rne(fl(fl(x[i] - bias) * inv_scale)))   # FPSub32, FPMul32,
                                                                    # FP32ToInt(8, unsigned)
        x_hat[i]   = fl(fl(q[i] * scale) + bias)  # IntToFP32 (exact), FPMul32, FPAdd32

    When ``hi == lo`` (``range == 0``, so ``scale == 0``) every code is 0 and ``x_hat == lo``
    exactly. The row must be finite (a NaN or infinite element makes ``range`` NaN/inf and
    the codes meaningless).

    Error bound: ``|x_hat[i] - x[i]| <= range / 510 + 2**-22 * range + ulp(max(|lo|, |hi|))``
    whenever ``range >= 2**-118`` (so that ``scale`` is a normal number). The first term is
    half a quantization step; the second covers the rounding of ``range``, ``scale``,
    ``inv_scale`` and the products (a few units in the last place relative to ``range``); the
    third is the final rounding of ``q * scale + bias`` to binary32 (and of ``x - bias``),
    which only matters when ``range`` is within a few hundred ulps of ``|lo|``.

    Tiny ranges (``0 < range < 2**-118``, rows of magnitude ~1e-36 and below) follow the same
    steps, but ``scale`` is subnormal (imprecise) and ``inv_scale`` may overflow to infinity
    (``0 * inf`` is NaN, which ``FP32ToInt`` turns into code 0): the error is then only bounded
    by ``range + 2**-142 + ulp(max(|lo|, |hi|))``.
    :func:`sim.reference.fp.int8_rowwise_quantize` implements exactly these steps in numpy and
    :func:`sim.reference.fp.int8_rowwise_error_bound` the bound.
    """
    return int8_rowwise_formula.__doc__ or ""
