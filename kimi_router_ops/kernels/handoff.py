"""The fused router's handoff buffer: scores published by every CTA, polled by the routing warps.

A handoff buffer is an [M, N] view of a workspace that holds EMPTY (every bit set) in every
word between calls. The GEMM body publishes each expert's sigmoid score there with a relaxed
gpu-scope store as well as writing the logit to the logits output; the routing warp polls the
words it needs with relaxed gpu-scope loads (they bypass L1) until none is EMPTY, routes, and
writes EMPTY back. A score and its "ready" flag are the same word, so no fence or counter is
needed between the last GEMM store and the routing: one L2 round trip instead of the three of
a release fence, an atomic and an acquire.

A word is 64 bits, (choice key, score): the publisher also adds the expert's bias and turns
the choice value into its order key, so the routing warp loads no bias and computes no key.
(Words of the score alone, 32 bits, are the older format, kept while the two are measured.)
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32, const_expr

# All bits set: a NaN that floating-point arithmetic never produces (a NaN result is the
# canonical 0x7FFFFFFF), and publish() maps it to that anyway, so EMPTY means "not yet". In a
# 64-bit word the score is the low half, so a published word is never all ones either.
EMPTY = -1
CANONICAL_NAN = 0x7FFFFFFF


@cute.jit
def element_ptr(t: cute.Tensor, m, n):
    return t.iterator + cute.crd2idx((m, n), t.layout)


@cute.jit
def sigmoid(v: Float32) -> Float32:
    # ex2.approx and rcp.approx: about 3e-7 relative error, a handful of instructions
    # instead of IEEE exp and divide.
    e = cute.arch.exp2(v * Float32(-1.4426950408889634))  # 2^(-v log2 e) = e^-v
    return cute.arch.rcp_approx(Float32(1.0) + e)


@cute.jit
def order_key(v: Float32) -> Uint32:
    """An unsigned key that orders like the float (finite values and infinities): the sign
    bit set for positives, every bit flipped for negatives."""
    bits = v.bitcast(Int32)
    flip = (bits >> 31) | Int32(-(2**31))
    return (bits ^ flip).bitcast(Uint32)


def publishes_keys(handoff: cute.Tensor) -> bool:
    """Whether the buffer's words are (choice key, score), 64 bits, or the score alone."""
    return handoff.element_type.width == 64


@cute.jit
def bias_of(handoff: cute.Tensor, bias: cute.Tensor, has_bias: Int32, expert) -> Float32:
    """The expert's bias as a float, for publish(): 0 without one, or where the buffer takes
    no keys. The GEMM body asks before its PDL wait: the bias is a parameter, like the
    weights, and this keeps its load off the publisher's tail."""
    value = Float32(0.0)
    if const_expr(publishes_keys(handoff)):
        if has_bias != 0:
            value = bias[0, expert].to(Float32)
    return value


@cute.jit
def publish(handoff: cute.Tensor, m, n, logit: Float32, bias_value: Float32):
    """Publish the expert's score (and choice key): the GEMM's output threads compute them
    side by side, where the routing warp would one after another."""
    bits = sigmoid(logit).bitcast(Int32)
    bits = Int32(cutlass.select_(bits == Int32(EMPTY), Int32(CANONICAL_NAN), bits))
    ptr = element_ptr(handoff, m, n)
    if const_expr(publishes_keys(handoff)):
        key = order_key(bits.bitcast(Float32) + bias_value)
        word = (Int64(key.bitcast(Int32)) << 32) | (Int64(bits) & Int64(0xFFFFFFFF))
        cute.arch.store(ptr, word, sem="relaxed", scope="gpu")
    else:
        cute.arch.store(ptr, bits, sem="relaxed", scope="gpu")


@cute.jit
def poll(handoff: cute.Tensor, m, n):
    return cute.arch.load(element_ptr(handoff, m, n), handoff.element_type, sem="relaxed", scope="gpu")
