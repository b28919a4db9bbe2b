"""Packing of stream payloads for cocotb: the layout is the single source of truth, and the
fast codec agrees with ``layout.const(...).as_bits()`` / ``layout.from_bits(...)``."""

from __future__ import annotations



import numpy as np
import pytest
from amaranth.hdl import signed, unsigned
from amaranth.lib import data, enum

from neonic.sim.harness.cocotb_streams import Codec, pack, unpack
from tests.sim.harness.designs import PAYLOAD, random_payloads

NESTED = data.StructLayout({
    "hdr": data.StructLayout({"kind": unsigned(2), "delta": signed(6)}),
    "lanes": data.ArrayLayout(data.StructLayout({"v": signed(5), "ok": unsigned(1)}), 3),
    "wide": unsigned(70),
})


def random_nested(rng):
    return {"hdr": {"kind": int(rng.integers(4)), "delta": int(rng.integers(-32, 32))},
            "lanes": [{"v": int(rng.integers(-16, 16)), "ok": int(rng.integers(2))}
                      for _ in range(3)],
            "wide": int.from_bytes(rng.bytes(9), "little") >> 2}


@pytest.mark.parametrize("layout,make", [
    (PAYLOAD, lambda rng: random_payloads(rng, 1)[0]),
    (NESTED, random_nested),
])
def test_codec_agrees_with_the_layout_both_ways(rng, layout, make):
    codec = Codec(layout)
    for _ in range(200):
        value = make(rng)
        bits = codec.pack(value)
        assert bits == layout.const(value).as_bits() == pack(layout, value)
        assert codec.unpack(bits) == value == unpack(layout, bits)
        assert layout.from_bits(bits) == layout.const(value)


def test_raw_bits_and_consts_pass_through(rng):
    codec = Codec(NESTED)
    const = NESTED.const(random_nested(rng))
    assert codec.pack(const) == const.as_bits()
    assert codec.pack(const.as_bits()) == const.as_bits()


def test_plain_shapes_are_ints_with_sign():
    assert Codec(signed(8)).pack(-1) == 0xFF
    assert Codec(signed(8)).unpack(0xFF) == -1
    assert unpack(unsigned(8), 0xFF) == 255
    with pytest.raises(ValueError, match="payload"):
        Codec(unsigned(4)).pack(16)


def test_out_of_range_field_is_refused_not_truncated():
    with pytest.raises(ValueError, match=r"field value 9 does not fit unsigned\(3\)"):
        Codec(PAYLOAD).pack({"tag": 0, "pair": [9, 0], "value": {"lo": 0, "neg": 0},
                             "last": 0})


def test_missing_fields_and_other_layouts_use_the_layout_itself():
    # A dict that leaves fields out: the layout fills in their init values.
    partial = {"tag": 3, "last": 1}
    assert Codec(PAYLOAD).pack(partial) == PAYLOAD.const(partial).as_bits()

    class Kind(enum.Enum, shape=unsigned(2)):
        A = 1
        B = 2

    with_enum = data.StructLayout({"kind": Kind, "x": unsigned(4)})
    codec = Codec(with_enum)
    bits = codec.pack({"kind": Kind.B, "x": 5})
    assert bits == with_enum.const({"kind": Kind.B, "x": 5}).as_bits()
    assert codec.unpack(bits) == {"kind": 2, "x": 5}
    union = data.UnionLayout({"a": unsigned(8), "b": signed(4)})
    assert Codec(union).pack({"b": -1}) == union.const({"b": -1}).as_bits()
