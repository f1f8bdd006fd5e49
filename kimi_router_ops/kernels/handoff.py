"""The fused router's handoff buffer: logits published by every CTA, polled by the router CTA.

A handoff buffer is an int32 [M, W] view of a workspace that holds EMPTY in every word
between calls (W: variants.router_handoff_row_words(N)). It is used in one of two ways per
call; both sides decide alike, from the same arguments.

Scores: word [m, n] is expert n's sigmoid score. The GEMM body publishes each logit's sigmoid score there with a relaxed gpu-scope
store as well as writing it to the logits output; the routing CTA polls the words it needs
with relaxed gpu-scope loads (they bypass L1) until none is EMPTY, routes, and writes EMPTY
back. A logit and its "ready" flag are the same 32-bit word, so no fence or counter is
needed between the last GEMM store and the routing: one L2 round trip instead of the
three of a release fence, an atomic and an acquire.

Tile lists (the tensor-core kernels, where one warp holds one token's 32 experts of a tile):
the warp ranks its 32 experts and publishes its best `depth` (an even number) as entries
(key, expert id, score, 0) of 16 bytes: entry [m, tile, j], the tile's j-th best, at words
ENTRY_WORDS * (tile * LIST_ENTRIES + j) of row m. Each of the three used words is its own
flag, as above. One warp's store fills whole 32-byte sectors of the buffer (rows and tiles
start at multiples of 512 bytes, the host aligns the buffer to 128): a sector written in
part by one store and in part by another, into a line not in L2, is read back only after
L2 fills it from DRAM (docs/benchmarks.md, step 36).
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

# aot.py imports kernels/ beside variants.
from variants import ROUTER_HANDOFF_ENTRY_WORDS as ENTRY_WORDS
from variants import ROUTER_MAX_TOP_K as LIST_ENTRIES

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
def canonical_score(logit: Float32) -> Float32:
    """The sigmoid score as published: never the EMPTY bit pattern."""
    bits = sigmoid(logit).bitcast(Int32)
    return Int32(cutlass.select_(bits == Int32(EMPTY), Int32(CANONICAL_NAN), bits)).bitcast(Float32)


@cute.jit
def publish(handoff: cute.Tensor, m, n, logit: Float32):
    """Publish the expert's sigmoid score, not its logit: the GEMM's output threads compute
    it side by side, where the routing warp would compute 8-28 of them one after another
    (two MUFU ops each)."""
    bits = canonical_score(logit).bitcast(Int32)
    cute.arch.store(element_ptr(handoff, m, n), bits, sem="relaxed", scope="gpu")


@cute.jit
def poll(handoff: cute.Tensor, m, n) -> Int32:
    return cute.arch.load(element_ptr(handoff, m, n), Int32, sem="relaxed", scope="gpu")


@cute.jit
def entry_ptr(handoff: cute.Tensor, m, tile, j):
    return element_ptr(handoff, m, ENTRY_WORDS * (tile * LIST_ENTRIES + j))


@dsl_user_op
def publish_entry(ptr, key, expert, score, *, loc=None, ip=None):
    """One 16-byte relaxed gpu-scope store of (key, expert, score, 0)."""
    llvm.inline_asm(
        None,
        [Int64(ptr.toint()).ir_value(loc=loc, ip=ip), Int32(key).ir_value(loc=loc, ip=ip),
         Int32(expert).ir_value(loc=loc, ip=ip), Int32(score).ir_value(loc=loc, ip=ip)],
        "st.relaxed.gpu.global.v4.b32 [$0], {$1, $2, $3, 0};", "l,r,r,r",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)


@dsl_user_op
def empty_entry(ptr, *, loc=None, ip=None):
    """EMPTY into all four words of an entry, for the next call."""
    llvm.inline_asm(
        None, [Int64(ptr.toint()).ir_value(loc=loc, ip=ip)],
        "st.relaxed.gpu.global.v4.b32 [$0], {-1, -1, -1, -1};", "l",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)


@dsl_user_op
def poll_entry(ptr, *, loc=None, ip=None):
    """One 16-byte relaxed gpu-scope load: (key, expert, score) as Int32 words."""
    words = llvm.inline_asm(
        llvm.StructType.get_literal([T.i32()] * 4),
        [Int64(ptr.toint()).ir_value(loc=loc, ip=ip)],
        "ld.relaxed.gpu.global.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)
    return tuple(Int32(llvm.extractvalue(T.i32(), words, [i], loc=loc, ip=ip)) for i in range(3))
