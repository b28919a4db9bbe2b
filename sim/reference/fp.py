"""Bit-level numpy reference for IEEE-754 arithmetic and the formats neonic moves around.

Everything here works on raw bit patterns (``uint32`` for binary32, ``uint16`` for binary16 and
bfloat16) so that tests compare hardware output bit for bit. The arithmetic relies on numpy's
``float32`` operations, which are IEEE-754 binary32 operations rounded to nearest even with
subnormals (numpy does not enable flush-to-zero); conversions that numpy lacks (bfloat16) are
written from the definition of rounding to nearest even.

NaN conventions follow :mod:`rtl.fp`: arithmetic and narrowing return one canonical quiet NaN,
widening keeps the NaN's bits, selection passes the NaN operand through.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "FP32_QNAN", "FP16_QNAN", "BF16_QNAN",
    "f32_to_bits", "bits_to_f32", "is_nan_bits",
    "fp32_add", "fp32_sub", "fp32_mul", "fp32_div", "fp32_max", "fp32_min",
    "fp16_to_fp32", "bf16_to_fp32", "fp32_to_fp16", "fp32_to_bf16",
    "fp32_to_int", "int_to_fp32",
    "int8_rowwise_quantize", "int8_rowwise_dequantize", "int8_rowwise_error_bound",
]

FP32_QNAN = np.uint32(0x7FC00000)
FP16_QNAN = np.uint16(0x7E00)
BF16_QNAN = np.uint16(0x7FC0)


def f32_to_bits(x) -> np.ndarray:
    """binary32 values -> their ``uint32`` bit patterns."""
    return np.ascontiguousarray(np.asarray(x, dtype=np.float32)).view(np.uint32)


def bits_to_f32(u) -> np.ndarray:
    """``uint32`` bit patterns -> binary32 values."""
    return np.ascontiguousarray(np.asarray(u, dtype=np.uint32)).view(np.float32)


def is_nan_bits(u, ebits: int = 8, mbits: int = 23) -> np.ndarray:
    """Whether bit patterns of a binary format with ``ebits``/``mbits`` encode NaN."""
    u = np.asarray(u).astype(np.uint64)
    exp = (u >> np.uint64(mbits)) & np.uint64(2 ** ebits - 1)
    return (exp == 2 ** ebits - 1) & ((u & np.uint64(2 ** mbits - 1)) != 0)


def _canonical(result: np.ndarray) -> np.ndarray:
    bits = f32_to_bits(result).copy()
    bits[np.isnan(result)] = FP32_QNAN
    return bits


def _binary(op, a_bits, b_bits) -> np.ndarray:
    with np.errstate(all="ignore"):
        return _canonical(op(bits_to_f32(a_bits), bits_to_f32(b_bits)))


def fp32_add(a_bits, b_bits) -> np.ndarray:
    """``a + b``, RNE; NaN results are ``0x7FC00000``."""
    return _binary(np.add, a_bits, b_bits)


def fp32_sub(a_bits, b_bits) -> np.ndarray:
    """``a - b``, RNE; NaN results are ``0x7FC00000``."""
    return _binary(np.subtract, a_bits, b_bits)


def fp32_mul(a_bits, b_bits) -> np.ndarray:
    """``a * b``, RNE; NaN results are ``0x7FC00000``."""
    return _binary(np.multiply, a_bits, b_bits)


def fp32_div(a_bits, b_bits) -> np.ndarray:
    """``a / b``, RNE; NaN results are ``0x7FC00000``."""
    return _binary(np.divide, a_bits, b_bits)


def _select(a_bits, b_bits, b_wins: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a_bits = np.asarray(a_bits, dtype=np.uint32)
    b_bits = np.asarray(b_bits, dtype=np.uint32)
    a_nan, b_nan = is_nan_bits(a_bits), is_nan_bits(b_bits)
    sel_b = ~a_nan & (b_nan | b_wins)
    return np.where(sel_b, b_bits, a_bits).astype(np.uint32), sel_b


def fp32_max(a_bits, b_bits) -> tuple[np.ndarray, np.ndarray]:
    """(result bits, took b): ``b`` only if ``b > a`` (IEEE order, so ``±0`` and equal values keep
    ``a``) or ``b`` is NaN and ``a`` is not; a NaN ``a`` is returned as is."""
    with np.errstate(invalid="ignore"):
        return _select(a_bits, b_bits, bits_to_f32(b_bits) > bits_to_f32(a_bits))


def fp32_min(a_bits, b_bits) -> tuple[np.ndarray, np.ndarray]:
    """Mirror of :func:`fp32_max`: ``b`` only if ``b < a`` or ``b`` is the only NaN."""
    with np.errstate(invalid="ignore"):
        return _select(a_bits, b_bits, bits_to_f32(b_bits) < bits_to_f32(a_bits))


def fp16_to_fp32(h_bits) -> np.ndarray:
    """binary16 -> binary32 bits, exact; a NaN keeps its sign and payload (fraction << 13)."""
    h = np.asarray(h_bits, dtype=np.uint16)
    out = f32_to_bits(h.view(np.float16).astype(np.float32)).copy()
    nan = is_nan_bits(h, 5, 10)
    h32 = h.astype(np.uint32)
    out[nan] = ((h32[nan] & 0x8000) << 16) | 0x7F800000 | ((h32[nan] & 0x3FF) << 13)
    return out


def bf16_to_fp32(b_bits) -> np.ndarray:
    """bfloat16 -> binary32 bits: the bfloat16 pattern is the upper half, exactly."""
    return np.asarray(b_bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)


def fp32_to_fp16(a_bits) -> np.ndarray:
    """binary32 -> binary16 bits, RNE (numpy's cast); NaN -> ``0x7E00``."""
    a = np.asarray(a_bits, dtype=np.uint32)
    with np.errstate(all="ignore"):
        out = bits_to_f32(a).astype(np.float16).view(np.uint16).copy()
    out[is_nan_bits(a)] = FP16_QNAN
    return out


def fp32_to_bf16(a_bits) -> np.ndarray:
    """binary32 -> bfloat16 bits, RNE from the definition: drop the low 16 bits, rounding up
    when they exceed half, or equal half and the kept part is odd. A carry ripples into the
    exponent (largest finite -> infinity; largest subnormal -> smallest normal), which is the
    right answer because the encoding is monotonic in magnitude. NaN -> ``0x7FC0``."""
    a = np.asarray(a_bits, dtype=np.uint32).astype(np.uint64)
    kept = a >> np.uint64(16)
    rest = a & np.uint64(0xFFFF)
    up = (rest > 0x8000) | ((rest == 0x8000) & ((kept & np.uint64(1)) == 1))
    out = (kept + up.astype(np.uint64)).astype(np.uint16)
    out[is_nan_bits(a.astype(np.uint32))] = BF16_QNAN
    return out


def fp32_to_int(a_bits, width: int = 8, signed: bool = False) -> np.ndarray:
    """binary32 -> integer, RNE, saturated to the ``width``-bit signed/unsigned range; NaN -> 0.
    Returned as ``int64`` values (not wrapped to ``width`` bits)."""
    lo, hi = (-2 ** (width - 1), 2 ** (width - 1) - 1) if signed else (0, 2 ** width - 1)
    with np.errstate(invalid="ignore"):
        x = bits_to_f32(a_bits).astype(np.float64)
        r = np.clip(np.rint(np.nan_to_num(x, nan=0.0, posinf=np.inf, neginf=-np.inf)), lo, hi)
    return r.astype(np.int64)


def int_to_fp32(values) -> np.ndarray:
    """Integers -> binary32 bits, RNE (exact below ``2**24`` in magnitude)."""
    return f32_to_bits(np.asarray(values, dtype=np.int64).astype(np.float32)).copy()


def int8_rowwise_quantize(rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """INT8 row-wise quantization exactly as :func:`rtl.fp.int8_rowwise_formula` states.

    ``rows``: ``(R, D)`` binary32 values (finite). Returns ``(codes uint8 (R, D), scale
    float32 (R,), bias float32 (R,))``.
    """
    x = np.asarray(rows, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"rows: expected a 2-D array (rows, dim), got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("rows: expected finite values (NaN/inf rows have no INT8 encoding)")
    with np.errstate(all="ignore"):
        lo = x.min(axis=1) if x.shape[1] else np.zeros(x.shape[0], np.float32)
        hi = x.max(axis=1) if x.shape[1] else np.zeros(x.shape[0], np.float32)
        rng = (hi - lo).astype(np.float32)
        scale = (rng / np.float32(255)).astype(np.float32)
        inv = np.where(rng > 0, np.float32(255) / np.where(rng > 0, rng, np.float32(1)),
                       np.float32(0)).astype(np.float32)
        t = (x - lo[:, None]).astype(np.float32)
        u = (t * inv[:, None]).astype(np.float32)
    # FP32ToInt(8, unsigned): RNE, saturating; NaN (0 * inf when range is tiny) gives 0.
    codes = fp32_to_int(f32_to_bits(u), 8, False).astype(np.uint8)
    return codes, scale, lo.astype(np.float32)


def int8_rowwise_dequantize(codes, scale, bias) -> np.ndarray:
    """``x_hat = fl(fl(q * scale) + bias)`` in binary32."""
    q = np.asarray(codes, dtype=np.uint8).astype(np.float32)
    s = np.asarray(scale, dtype=np.float32)[:, None]
    b = np.asarray(bias, dtype=np.float32)[:, None]
    with np.errstate(all="ignore"):
        return ((q * s).astype(np.float32) + b).astype(np.float32)


def int8_rowwise_error_bound(rows) -> np.ndarray:
    """Per-row bound on ``|x_hat - x|`` (float64), as documented in
    :func:`rtl.fp.int8_rowwise_formula`: ``range/510 + 2**-22 * range + ulp(max(|lo|, |hi|))``
    when ``range >= 2**-118`` (a normal ``scale``), else ``range + 2**-142 + ulp(...)``."""
    x = np.asarray(rows, dtype=np.float32)
    lo, hi = x.min(axis=1).astype(np.float64), x.max(axis=1).astype(np.float64)
    rng = hi - lo
    mag = np.maximum(np.abs(lo), np.abs(hi)).astype(np.float32)
    ulp = np.spacing(mag).astype(np.float64)
    return np.where(rng >= 2.0 ** -118, rng / 510 + rng * 2.0 ** -22, rng + 2.0 ** -142) + ulp
