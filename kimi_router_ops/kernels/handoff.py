"""The fused router's handoff buffer: logits published by every CTA, polled by the router CTA.

A handoff buffer is an int32 [M, N] view of a workspace that holds EMPTY in every word
between calls. The GEMM body publishes each logit's sigmoid score (or, for softmax routing,
the logit itself) there with a relaxed gpu-scope
store as well as writing it to the logits output; the routing CTA polls the words it needs
with relaxed gpu-scope loads (they bypass L1) until none is EMPTY, routes, and writes EMPTY
back. A logit and its "ready" flag are the same 32-bit word, so no fence or counter is
needed between the last GEMM store and the routing: one L2 round trip instead of the
three of a release fence, an atomic and an acquire.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from ..tables import Scoring

SIGMOID = int(Scoring.SIGMOID)  # the kernels' `scoring` values
SOFTMAX = int(Scoring.SOFTMAX)
SQRTSOFTPLUS = int(Scoring.SQRTSOFTPLUS)
SOFTPLUS_THRESHOLD = 20.0  # torch.nn.functional.softplus's: x itself above it
# All bits set: a NaN that floating-point arithmetic never produces (a NaN result is the
# canonical 0x7FFFFFFF), and publish() maps it to that anyway, so EMPTY means "not yet".
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
def sqrt_softplus(v: Float32) -> Float32:
    """sqrt(softplus(v)) with softplus(v) = max(v, 0) + log1p(e^-|v|): no overflow for large
    v, and full relative precision for very negative v (where log(1 + e^v) would round to 0),
    v itself above the threshold, as torch computes it. log1p(y), y in (0, 1], is a series
    below 1/32 (where 1 + y would drop y's digits), lg2.approx(1 + y) above: a handful of
    instructions (libdevice's exact log1p tripled the routing kernel's code), within 3e-6."""
    y = cute.arch.exp2(cute.math.abs(v) * Float32(-1.4426950408889634))  # e^-|v|
    series = y * (Float32(1.0) - y * (Float32(0.5) - y * (Float32(1.0 / 3.0) - y * Float32(0.25))))
    logged = cute.math.log2(Float32(1.0) + y, fastmath=True) * Float32(0.6931471805599453)
    sp = cute.math.max(v, Float32(0.0)) + Float32(cutlass.select_(y < Float32(1.0 / 32.0), series, logged))
    sp = Float32(cutlass.select_(v > Float32(SOFTPLUS_THRESHOLD), v, sp))
    return cute.math.sqrt(sp, fastmath=True)


@cute.jit
def _word(v: Float32) -> Int32:
    """v as a published word: its bits, with EMPTY (a NaN) made the canonical NaN."""
    bits = v.bitcast(Int32)
    return Int32(cutlass.select_(bits == Int32(EMPTY), Int32(CANONICAL_NAN), bits))


@cute.jit
def score_bits(logit: Float32, scoring: Int32) -> Int32:
    """The word published for a logit (never EMPTY): its score, or for softmax routing the
    logit itself (a softmax needs all of a token's logits at once). The routing op computes
    its scores with this too, so that it routes as the fused router does."""
    word = Int32(0)
    if scoring == SIGMOID:
        word = _word(sigmoid(logit))
    elif scoring == SOFTMAX:
        word = _word(logit)
    else:
        word = _word(sqrt_softplus(logit))
    return word


@cute.jit
def score_all(values: cute.Tensor, count: cutlass.Constexpr, scoring: Int32):
    """score_bits of values[0..count), in place, as floats: one branch on the scoring for all
    of them, sigmoid's code first and sqrtsoftplus's last. The routing kernel runs cold after
    the layer, and the code a call skips still costs it instruction fetches: with an exact
    log1p inlined per expert between the others, the routing op measured 3-8 us slower."""
    if scoring == SIGMOID:
        for j in cutlass.range_constexpr(count):
            values[j] = _word(sigmoid(values[j])).bitcast(Float32)
    elif scoring == SOFTMAX:
        for j in cutlass.range_constexpr(count):
            values[j] = _word(values[j]).bitcast(Float32)
    else:
        for j in cutlass.range_constexpr(count):
            values[j] = _word(sqrt_softplus(values[j])).bitcast(Float32)


@cute.jit
def publish(handoff: cute.Tensor, m, n, logit: Float32, scoring: Int32):
    """Publish the expert's score, not its logit, for elementwise scoring: the GEMM's
    output threads compute it side by side, where the routing warp would compute 8-28 of
    them one after another."""
    cute.arch.store(element_ptr(handoff, m, n), score_bits(logit, scoring), sem="relaxed", scope="gpu")


@cute.jit
def poll(handoff: cute.Tensor, m, n) -> Int32:
    return cute.arch.load(element_ptr(handoff, m, n), Int32, sem="relaxed", scope="gpu")
