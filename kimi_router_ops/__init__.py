"""kimi_router_ops: the low-latency MoE router GEMM as a PyTorch op.

    logits = kimi_router_ops.ll_bf16_gemm(hidden_states, router_weight)  # fp32 [M, N]
    weights, ids, logits = kimi_router_ops.ll_bf16_router(hidden_states, router_weight, bias, top_k)
    weights, ids = kimi_router_ops.moe_routing(logits, bias, top_k)       # routing alone

Importing the package loads `_C`, which registers torch.ops.kimi.*; run time needs only torch.
"""

import torch  # noqa: F401  (loads libtorch, which _C links against)

from . import _C, ops  # noqa: F401  (_C registers the ops)
from .ops import (
    chosen_router_variant,
    chosen_variant,
    compiled_kernels,
    fused_add_rms_norm,
    ll_bf16_gemm,
    ll_bf16_gemm_with_variant,
    ll_bf16_router,
    ll_bf16_router_with_variant,
    moe_routing,
    rms_norm,
)
from .router_linear import RouterLinear

__all__ = [
    "RouterLinear",
    "chosen_router_variant",
    "chosen_variant",
    "compiled_kernels",
    "fused_add_rms_norm",
    "ll_bf16_gemm",
    "ll_bf16_gemm_with_variant",
    "ll_bf16_router",
    "ll_bf16_router_with_variant",
    "moe_routing",
    "rms_norm",
]
