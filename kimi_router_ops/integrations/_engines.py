"""What the vLLM and SGLang plugins share: which of an engine's gate and routing calls our ops
compute exactly as the engine does. Both engines score a group by the sum of its two best
biased scores when there is a bias and by its best score otherwise."""

import torch

from .. import ops

# The engines' scoring names the ops share; most engine functions know the first two only
# (an unknown one must keep raising the engine's own error).
CLASSIC_SCORINGS = ("sigmoid", "softmax")
V4_SCORINGS = ("sigmoid", "sqrtsoftplus")  # the engines' DeepSeek-V4 routers (no softmax)


def gate_served(x, weight, out_dtype=torch.float32, bias=None) -> bool:
    """Whether router_gemm takes this gate call: 2-D hidden states, and dtypes it takes (its
    own contract: ops.router_gemm_misfit)."""
    return x.dim() == 2 and not ops.router_gemm_misfit(x.dtype, weight.dtype, out_dtype,
                                                        None if bias is None else bias.dtype)


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
