"""What the vLLM and SGLang plugins share: which of an engine's gate and routing calls our ops
compute exactly as the engine does. Both engines score a group by the sum of its two best
biased scores when there is a bias and by its best score otherwise."""

import torch

from .. import ops

ROUTED_DTYPES = (torch.float32, torch.bfloat16)
# The engines' scoring names the ops share; most engine functions know the first two only
# (an unknown one must keep raising the engine's own error).
CLASSIC_SCORINGS = ("sigmoid", "softmax")
V4_SCORINGS = ("sigmoid", "sqrtsoftplus")  # the engines' DeepSeek-V4 routers (no softmax)


def gate_dtypes_served(x_dtype, weight_dtype) -> bool:
    """bf16 gates on bf16 tokens; fp32 gates on bf16 or fp32 tokens (what router_gemm takes)."""
    if weight_dtype == torch.bfloat16:
        return x_dtype == torch.bfloat16
    return weight_dtype == torch.float32 and x_dtype in ROUTED_DTYPES


def routes(gating_output, bias, scoring_func, top_k, n_group, topk_group, scorings=CLASSIC_SCORINGS) -> bool:
    """Whether moe_routing computes what the engine's routing function computes here: a
    scoring of `scorings` (those the engine's function has), arguments moe_routing takes
    (its own contract: ops.routing_misfit), and a group rule that is ours (the two best with
    sigmoid, the best with softmax; with every group kept the rule does not matter, and
    sqrtsoftplus, DeepSeek-V4's, is served only so)."""
    if scoring_func not in scorings or gating_output.dim() != 2:
        return False
    n = gating_output.shape[-1]
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != n):
        return False
    if ops.routing_misfit(n, top_k, n_group, topk_group, scoring_func, gating_output.dtype,
                          None if bias is None else bias.dtype):
        return False
    return topk_group >= n_group or (
        scoring_func != "sqrtsoftplus" and (bias is not None) == (scoring_func == "sigmoid"))
