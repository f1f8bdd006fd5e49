"""Test oracles, shared by the tests and tools/sanitize.py (a user's tests may use them too):
how far a GEMM output is from the exact product, on the scale of fp32 rounding (every kernel
is held to 1e-5 of sum_k |x_k w_k| for fp32 outputs), and the router's float64 reference
with the near-ties that may change which experts it picks; and which GEMM rows this build
links.
"""

import torch

import kimi_router_ops


def gemm_row_linked(name: str) -> bool:
    """Whether _C has the kernels of the GEMM row `name`: every product row of a CUDA build;
    a lab row (tables.gemm.LAB_VARIANTS) only where it was built with KIMI_ROUTER_OPS_LAB=1."""
    return any(s.startswith(f"kimi_{name}_v") for s in kimi_router_ops.compiled_kernels())


def dot_error(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> float:
    """The worst |out - x wᵀ| over sum_k |x_k w_k|, element by element, in float64 on the
    CPU: the scale of a dot product's rounding error, which a result that nearly cancels (a
    logit near 0 from large terms) does not shrink. A non-finite output fails an assertion."""
    out = out.double().cpu()
    assert torch.isfinite(out).all(), "non-finite output"
    if not out.numel():
        return 0.0
    x, w = x.double().cpu(), w.double().cpu()
    magnitude = x.abs() @ w.abs().t()
    return ((out - x @ w.t()).abs() / magnitude.clamp_min(1e-300)).max().item()


NEAR = 1e-6  # two candidates closer than this at a cut may be chosen either way


def reference_router(x, w, bias, top_k, n_group, topk_group, renormalize, scale, scoring="sigmoid"):
    """DeepseekV3TopkRouter.forward (transformers 5.x; with scoring="softmax",
    DeepseekV2TopkRouter's softmax and group-limited greedy) in float64: weights, ids,
    logits, and the masked choice values and group scores (for judging near-ties)."""
    logits = x.double().cpu() @ w.double().cpu().t()
    weights, ids, masked, group_scores = reference_routing(
        logits, bias, top_k, n_group, topk_group, renormalize, scale, scoring
    )
    return weights, ids, logits, masked, group_scores


def reference_routing(logits, bias, top_k, n_group, topk_group, renormalize, scale, scoring="sigmoid"):
    """The routing after the logits, in float64: weights, ids, and the masked choice values
    and group scores."""
    logits = logits.double().cpu()
    softmax = scoring == "softmax"
    scores = {"softmax": lambda: logits.softmax(-1), "sigmoid": logits.sigmoid,
              "sqrtsoftplus": lambda: torch.nn.functional.softplus(logits).sqrt()}[scoring]()
    choice = scores + (bias.double().cpu() if bias is not None else 0.0)
    m, n = logits.shape
    grouped = choice.view(m, n_group, n // n_group)
    group_scores = grouped.topk(1 if softmax else min(2, n // n_group), dim=-1)[0].sum(-1)
    group_idx = group_scores.topk(topk_group, dim=-1)[1]
    kept = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, group_idx, True)
    masked = grouped.masked_fill(~kept.unsqueeze(-1), float("-inf")).view(m, n)
    ids = masked.topk(top_k, dim=-1)[1]
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * scale, ids, masked, group_scores


def near_tie(values, k):
    """True when the k-th and (k+1)-th largest of `values` are closer than NEAR."""
    if k >= values.numel():
        return False
    top = values.topk(k + 1)[0]
    return bool(top[k - 1] - top[k] < NEAR)
