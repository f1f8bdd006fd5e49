"""How far a GEMM output is from the exact product, on the scale of fp32 rounding.

The tests (tests/conftest.py) and tools/sanitize.py hold every kernel to one bound with it:
1e-5 of sum_k |x_k w_k| for fp32 outputs.
"""

import torch


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
