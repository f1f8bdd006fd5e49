"""kimi_router_ops: the low-latency MoE router GEMM as a PyTorch op.

    logits = kimi_router_ops.ll_bf16_gemm(hidden_states, router_weight)  # fp32 [M, N]
    logits = kimi_router_ops.router_gemm(hidden_states, fp32_or_bf16_weight, bias)
    weights, ids, logits = kimi_router_ops.ll_bf16_router(hidden_states, router_weight, bias, top_k)
    weights, ids = kimi_router_ops.moe_routing(logits, bias, top_k)       # routing alone

Importing the package loads `_C`, which registers torch.ops.kimi.*; run time needs only torch.
"""

import os
from pathlib import Path

import torch

# The build (setup.py: python -m kimi_router_ops.aot) reads the kernel tables from this
# package before _C exists; it says so with KIMI_ROUTER_OPS_BUILD=1.
if os.environ.get("KIMI_ROUTER_OPS_BUILD") != "1":
    # _C is a plain shared library on torch's stable ABI (not a Python module): loading it
    # runs the registrations of the ops' schemas and kernels.
    torch.ops.load_library(Path(__file__).with_name("_C.abi3.so"))

    from . import ops  # noqa: F401  (fake kernels, the derivative)
    from .ops import (
        attn_res,
        chosen_router_variant,
        chosen_variant,
        compiled_kernels,
        fused_add_rms_norm,
        ll_bf16_gemm,
        ll_bf16_router,
        moe_routing,
        rms_norm,
        router,
        router_and_projection,
        router_gemm,
        router_gemm_with_variant,
        router_with_variant,
    )
    from .router_linear import RouterLinear

__all__ = [
    "RouterLinear",
    "attn_res",
    "chosen_router_variant",
    "chosen_variant",
    "compiled_kernels",
    "fused_add_rms_norm",
    "ll_bf16_gemm",
    "ll_bf16_router",
    "moe_routing",
    "rms_norm",
    "router",
    "router_and_projection",
    "router_gemm",
    "router_gemm_with_variant",
    "router_with_variant",
]
