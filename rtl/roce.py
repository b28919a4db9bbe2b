"""RoCEv2 (RC RDMA WRITE) framing constants and the layouts shared by the packetizer and the
depacketizer.

A frame as both units see it (byte offsets from the start of the Ethernet header, no FCS):

====== ====== ==============================================================================
offset bytes  field
====== ====== ==============================================================================
0      14     Ethernet: destination MAC, source MAC, Ethertype 0x0800
14     20     IPv4: version 4, IHL 5, DSCP/ECN, total length, id, flags (DF), TTL, protocol
              17, header checksum, source, destination
34     8      UDP: source port, destination port 4791, length, checksum (0: not used)
42     12     BTH: opcode, SE/M/pad count/version, P_Key, FECN/BECN/resv, dest QP, AckReq, PSN
54     16     RETH (WRITE FIRST and ONLY): virtual address, R_Key, DMA length
..     4      immediate data (WRITE LAST/ONLY WITH IMMEDIATE)
..     P+pad  payload, padded with zeros to a multiple of 4 (pad count in the BTH)
..     4      ICRC: CRC-32 (Ethernet) over 8 bytes of ones followed by the frame from the IP
              header on with the variant fields masked to ones, least significant byte first
====== ====== ==============================================================================

Frames travel on a byte stream of ``data_bytes`` bytes per beat (:class:`FrameBeat`): byte ``i``
of a beat is bits ``8i..8i+7`` of ``data``; ``count`` says how many bytes of the beat are valid
(``data_bytes`` on every beat but the last).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Signal, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.crc import Algorithm
from amaranth.lib.wiring import In, Out

from .streams import check_int

__all__ = [
    "ROCE_UDP_PORT", "ETHERTYPE_IPV4", "OP_WRITE_FIRST", "OP_WRITE_MIDDLE", "OP_WRITE_LAST",
    "OP_WRITE_LAST_IMM", "OP_WRITE_ONLY", "OP_WRITE_ONLY_IMM", "ETH_LEN", "IP_LEN", "UDP_LEN",
    "BTH_LEN", "RETH_LEN", "IMM_LEN", "ICRC_LEN", "BASE_HEADER_LEN", "MAX_HEADER_LEN",
    "IP_TTL", "IP_FLAGS_DF", "BTH_PKEY", "DROP_REASONS", "header_len", "check_data_bytes",
    "check_pmtu", "FrameBeat", "ICRC_ALGORITHM", "ICRCEngine", "icrc_step_matrix",
    "HLEN_BY_HTYPE", "header_type",
]

ROCE_UDP_PORT = 4791
ETHERTYPE_IPV4 = 0x0800

OP_WRITE_FIRST = 0x06
OP_WRITE_MIDDLE = 0x07
OP_WRITE_LAST = 0x08
OP_WRITE_LAST_IMM = 0x09
OP_WRITE_ONLY = 0x0A
OP_WRITE_ONLY_IMM = 0x0B

ETH_LEN, IP_LEN, UDP_LEN, BTH_LEN, RETH_LEN, IMM_LEN, ICRC_LEN = 14, 20, 8, 12, 16, 4, 4
BASE_HEADER_LEN = ETH_LEN + IP_LEN + UDP_LEN + BTH_LEN          # 54: MIDDLE and LAST
MAX_HEADER_LEN = BASE_HEADER_LEN + RETH_LEN + IMM_LEN           # 74: ONLY WITH IMMEDIATE

# Constant header fields the packetizer sends (and the reference model reproduces).
IP_TTL = 64
IP_FLAGS_DF = 0x4000
BTH_PKEY = 0xFFFF

#: Why the depacketizer drops a frame, in the priority order it checks them (a frame is
#: counted under the first reason that applies).
DROP_REASONS = (
    "truncated",     # shorter than an IPv4 header, or than the IP total length says
    "ethertype",     # not 0x0800
    "ip_version",    # IPv4 version 4 and IHL 5 expected
    "ip_length",     # frame longer than the IP total length, or a length too small for UDP+BTH
    "ip_checksum",   # IPv4 header checksum wrong
    "udp_port",      # not UDP (protocol 17) to port 4791
    "icrc",          # invariant CRC wrong
    "qp",            # destination QP not served by this receiver
    "opcode",        # not an RC WRITE opcode, or out of FIRST/MIDDLE/LAST sequence for the QP
    "psn",           # PSN is not the next one expected for the QP
    "length",        # payload length disagrees with the RETH DMA length / path MTU
)


#: Header bytes before the payload by header type ``{reth, immf}`` (:func:`header_type`).
HLEN_BY_HTYPE = tuple(BASE_HEADER_LEN + RETH_LEN * (ht >> 1) + IMM_LEN * (ht & 1)
                      for ht in range(4))


def header_type(opcode):
    """The header type of an RC WRITE opcode (an Amaranth value): bit 1, a RETH follows the
    BTH (FIRST, ONLY, ONLY WITH IMMEDIATE); bit 0, an immediate (LAST and ONLY WITH
    IMMEDIATE). Index :data:`HLEN_BY_HTYPE` with it."""
    reth = (opcode == OP_WRITE_FIRST) | (opcode == OP_WRITE_ONLY) | (opcode == OP_WRITE_ONLY_IMM)
    immf = (opcode == OP_WRITE_LAST_IMM) | (opcode == OP_WRITE_ONLY_IMM)
    return Cat(immf, reth)


def header_len(opcode: int) -> int:
    """Bytes before the payload for an RC WRITE opcode."""
    if opcode in (OP_WRITE_FIRST, OP_WRITE_ONLY):
        return BASE_HEADER_LEN + RETH_LEN
    if opcode == OP_WRITE_ONLY_IMM:
        return BASE_HEADER_LEN + RETH_LEN + IMM_LEN
    if opcode == OP_WRITE_LAST_IMM:
        return BASE_HEADER_LEN + IMM_LEN
    if opcode in (OP_WRITE_MIDDLE, OP_WRITE_LAST):
        return BASE_HEADER_LEN
    raise ValueError(f"opcode: expected an RC RDMA WRITE opcode 0x06..0x0b, got {opcode:#x}")


def check_data_bytes(data_bytes: object) -> int:
    """Validate a frame-stream width: 8, 16, 32 or 64 bytes per beat."""
    check_int("data_bytes", data_bytes, minimum=8, maximum=64, power_of_two=True)
    return data_bytes  # type: ignore[return-value]


def check_pmtu(pmtu: object) -> int:
    """Validate a path MTU: 256, 512, 1024, 2048 or 4096 bytes."""
    check_int("pmtu", pmtu, minimum=256, maximum=4096, power_of_two=True)
    return pmtu  # type: ignore[return-value]


class FrameBeat(data.StructLayout):
    """One beat of a frame stream: ``data_bytes`` bytes, valid byte ``count``, ``last``."""

    def __init__(self, data_bytes: int = 64):
        check_data_bytes(data_bytes)
        self.data_bytes = data_bytes
        super().__init__({
            "data": unsigned(8 * data_bytes),
            "count": unsigned((data_bytes).bit_length()),
            "last": unsigned(1),
        })


#: CRC-32 (Ethernet) started from a zero register. Equal to the standard CRC-32 of a stream
#: that begins with four 0xFF bytes (those bytes clear the standard all-ones register), and
#: unchanged by zero bytes in front: the trick that lets both units align the covered bytes
#: freely inside a beat.
ICRC_ALGORITHM = Algorithm(crc_width=32, polynomial=0x04C11DB7, initial_crc=0,
                           reflect_input=True, reflect_output=True, xor_output=0xFFFFFFFF)


def icrc_step_matrix(data_bytes: int) -> tuple[list[int], list[int]]:
    """The linear map of one ``data_bytes``-byte step of the reflected CRC-32 register.

    Returns ``(from_state, from_data)``: bit masks such that new register bit ``k`` is the
    parity of ``state & from_state[k]`` xor ``data & from_data[k]`` (data byte 0 in bits 0..7,
    each byte least significant bit first, as on the wire).
    """
    poly = 0xEDB88320  # 0x04C11DB7 reflected

    def step(state: int, word: int) -> int:
        for i in range(data_bytes):
            state ^= (word >> (8 * i)) & 0xFF
            for _ in range(8):
                state = (state >> 1) ^ (poly if state & 1 else 0)
        return state

    from_state = [0] * 32
    from_data = [0] * 32
    for i in range(32):
        out = step(1 << i, 0)
        for k in range(32):
            if out >> k & 1:
                from_state[k] |= 1 << i
    for j in range(8 * data_bytes):
        out = step(0, 1 << j)
        for k in range(32):
            if out >> k & 1:
                from_data[k] |= 1 << j
    return from_state, from_data


class ICRCEngine(wiring.Component):
    """:data:`ICRC_ALGORITHM` over ``data_bytes`` bytes per cycle (the ports of
    ``amaranth.lib.crc.Processor``: ``start``, ``data``, ``valid``, registered ``crc``).

    ``amaranth.lib.crc.Processor`` computes the same function, but builds each register bit as
    a chain of hundreds of nested XORs at 512 bits per word, which overflows Python's recursion
    limit in the simulator; here each bit is one parity reduction. The tests hold this engine to
    ``ICRC_ALGORITHM``'s own software model (``Parameters.compute``).

    The register's next value is linear: ``A·register xor B·word``. ``stages`` splits it for
    the clock:

    * 1: one cycle, ``crc`` shows a word the cycle after it was given;
    * 2: the word is registered first (``data``, ``valid``, ``start``: whatever selects and
      masks the covered bytes ends there), then folded in (a parity of at most 32 register bits
      and the word's bits per register bit);
    * 3: the word is registered, then its contribution ``B·word`` (per register bit, one
      parity of the word, or one per ``group_bits`` bits of it; no feedback), then the
      register takes ``A·register xor contribution``: the feedback loop is a parity of about
      20 register bits and the contribution's parities.

    ``en`` (one bit per stage, all set unless driven) lets a stage hold: stage ``i`` takes
    its input only when ``en[i]`` is set, so a caller can move the engine in lockstep with the
    registers its beats travel through (the packetizer's output registers, which stall on
    backpressure). As in such a chain, a stage may take a new word only when it holds none or
    its word moves on in the same cycle (``en[i + 1]``); the register (the last stage) takes
    its word when ``en[-1]`` is set. With ``en`` all set, ``crc`` shows a word ``stages``
    cycles after it was given.
    """

    def __init__(self, data_bytes: int, *, stages: int = 1, group_bits: int | None = None):
        """``group_bits`` (three stages): word bits per partial parity of the contribution,
        registered one parity per group per register bit and folded in by the update beside
        the register's terms; ``None``: one parity over the whole word. In the packetizer one
        parity over the word (about 64 of 128 bits at 16 bytes) mapped to five LUT levels and
        was the critical path (121.3 MHz; 32-bit groups: 124.8 MHz, another path). In the
        depacketizer the same groups changed yosys's mapping of the whole unit (7,529 LUT4
        against 5,574): it keeps one parity."""
        if stages not in (1, 2, 3):
            raise ValueError(f"stages: expected 1, 2 or 3, got {stages!r}")
        if group_bits is not None and (stages != 3 or group_bits < 1):
            raise ValueError(f"group_bits: expected None, or a positive integer with stages=3, "
                             f"got {group_bits!r} with stages={stages}")
        self.data_bytes = data_bytes
        self.stages = stages
        self.group_bits = group_bits
        super().__init__({
            "start": In(1), "valid": In(1), "data": In(8 * data_bytes), "crc": Out(32),
            "en": In(stages, init=(1 << stages) - 1),
        })

    def elaborate(self, platform):
        m = Module()
        from_state, from_data = icrc_step_matrix(self.data_bytes)
        nbits = 8 * self.data_bytes

        def word_terms(word, k):
            return [word[j] for j in range(nbits) if from_data[k] >> j & 1]

        word, valid, start = self.data, self.valid, self.start
        if self.stages >= 2:
            r_word, r_valid, r_start = Signal(nbits, reset_less=True), Signal(), Signal()
            with m.If(self.en[0]):
                m.d.sync += [r_word.eq(word), r_valid.eq(valid), r_start.eq(start)]
            word, valid, start = r_word, r_valid, r_start
        group_bits = self.group_bits or nbits
        groups = -(-nbits // group_bits)
        if self.stages == 3:
            # the contribution as ``groups`` partial parities per register bit, one per
            # ``GROUP_BITS`` bits of the word, which the update then folds in
            part = Signal(32 * groups, reset_less=True)
            p_valid, p_start = Signal(), Signal()
            parts = []
            for k in range(32):
                for g in range(groups):
                    lo, hi = g * group_bits, (g + 1) * group_bits
                    sub = [word[j] for j in range(lo, min(hi, nbits)) if from_data[k] >> j & 1]
                    parts.append(Cat(*sub).xor() if sub else Const(0, 1))
            with m.If(self.en[1]):
                m.d.sync += [part.eq(Cat(*parts)), p_valid.eq(valid), p_start.eq(start)]
            valid, start = p_valid, p_start
        state = Signal(32)
        source = Signal(32)
        m.d.comb += source.eq(state & ~start.replicate(32))
        nxt = Signal(32)
        for k in range(32):
            terms = [source[i] for i in range(32) if from_state[k] >> i & 1]
            terms += ([part[k * groups + g] for g in range(groups)] if self.stages == 3
                      else word_terms(word, k))
            m.d.comb += nxt[k].eq(Cat(*terms).xor())
        with m.If(self.en[-1]):
            with m.If(valid):
                m.d.sync += state.eq(nxt)
            with m.Elif(start):
                m.d.sync += state.eq(0)
        m.d.comb += self.crc.eq(~state)
        return m
