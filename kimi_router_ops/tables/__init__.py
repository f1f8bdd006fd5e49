"""The kernel tables: the one place that says which kernels exist and which runs where.

One module a kernel family, each its row type and its table: `gemm` (the GEMM kernels, the
automatic choice by M, N and K, the batch-invariant choice), `router` (the fused routers),
`routing` (the routing op's kernels), `projection`, `norm` and `attn_res`; here the values
they share. The ahead-of-time build (kimi_router_ops.aot, one family record each) compiles
every row for each vector width, dtype and GPU architecture; the rows and the choices go
into a generated C++ header that the CUDA dispatch (csrc/) includes, and the tests read
them from here. Standard library only: the build reads it before anything is built.

A new kernel is one row of its family's table; a new choice is one line of
`gemm.CHOICES`, with the benchmark that justifies it (`python -m kimi_router_ops.bench
--sweep`, docs/benchmarks.md).
"""

from enum import IntEnum

INT32_MAX = 2**31 - 1
# Where a kernel lets the next one launch (PDL's griddepcontrol.launch_dependents): once its
# first step's loads are issued ("after_x"), right after its weight prefetch, before its
# own grid-dependency wait ("before_wait"), at kernel entry, before that prefetch
# ("at_entry"), or after its stores ("at_exit", the dot product only). Each is safe: the next
# kernel reads nothing of ours before its own wait returns, after our grid has finished.
# Results do not change; only what the next kernel's weight stream overlaps
# (docs/kernel-notes.md).
TRIGGERS = ("after_x", "before_wait", "at_entry", "at_exit")


def check_trigger(row):
    if row.trigger not in TRIGGERS:
        raise ValueError(f"{row.name}: trigger must be one of {TRIGGERS}, got {row.trigger!r}")


# (CuTe DSL target, compute capability major*10+minor it serves)
ARCHS = (("sm_90a", 90), ("sm_100a", 100))
OUT_DTYPES = ("float32", "bfloat16")
BIAS_DTYPES = ("float32", "bfloat16")  # e_score_correction_bias, fp32 or the model's bf16

# A lane's share of the experts is a chain of instructions in one warp, so each N range gets
# its own kernels: 4 experts a lane for Qwen3-MoE, 8 for DeepSeek-V3, 12 for Kimi-K2, 28 for
# Kimi-K3, 32 up to 1024 experts (docs/kernel-notes.md).
ROUTER_N_RANGES = ((1, 128), (129, 256), (257, 384), (385, 896), (897, 1024))
# The router's top_k ids are spread over the lanes of a warp, its group scores too.
ROUTER_MAX_TOP_K = 32
ROUTER_MAX_GROUPS = 32


class Scoring(IntEnum):
    """How logits become routing scores: the ops' `scoring` argument (the member's name in
    lower case) and the kernels' `scoring` value. Each is an elementwise function of the
    logit (its formula in kernels/handoff.py's score_bits and in csrc/moe_routing.cpp's
    reference) except SOFTMAX, over a token's N logits; a group's score is the sum of its two
    best choice values, with SOFTMAX its best one.
    - SIGMOID: 1 / (1 + e^-x) (DeepSeek-V3, Kimi, GLM)
    - SOFTMAX: e^x / sum e^x over the experts (DeepSeek-V2, Qwen-MoE, Mixtral, gpt-oss)
    - SQRTSOFTPLUS: sqrt(softplus(x)), softplus(x) = x above 20, else log(1 + e^x)
      (DeepSeek-V4)"""

    SIGMOID = 0
    SOFTMAX = 1
    SQRTSOFTPLUS = 2


# The routing arguments every routing kernel takes after its tensors, in order: one C struct
# (RoutingScalars) carries them to the fused router and the routing op's kernels. A hash-routed
# call (DeepSeek-V4's first layers: ids = hash_table[input_ids]) gives the int32 words an
# element of input_ids and of hash_table spans (1 for int32, 2 for int64); 0: not hashed.
# The outputs: `shared_experts` fused shared-expert slots after the top_k (ids N, N + 1, ...,
# weight `shared_weight`), topk_ids as int32 words (`id_words` 2: int64), and expert counts
# (`has_counts`: one atomic add a routed slot into the `counts` tensor).
ROUTING_SCALARS = (
    ("top_k", "int32"), ("n_group", "int32"), ("topk_group", "int32"), ("renormalize", "int32"),
    ("has_bias", "int32"), ("scoring", "int32"), ("scaling", "float32"),
    ("ids_words", "int32"), ("table_words", "int32"),
    ("shared_experts", "int32"), ("shared_weight", "float32"), ("id_words", "int32"), ("has_counts", "int32"),
)


# The families' tables (after the values they import from here).
from . import attn_res, gemm, norm, projection, router, routing  # noqa: E402,F401
