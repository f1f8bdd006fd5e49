"""RouterLinear: a bias-free nn.Linear router gate that runs the op."""

import math

import torch
from torch import nn

from .ops import ll_bf16_gemm


class RouterLinear(nn.Module):
    """Drop-in for `nn.Linear(in_features, num_experts, bias=False)` as an MoE router gate.

    `weight` is a bf16 [num_experts, in_features] parameter, so a state_dict with the usual
    `gate.weight` key loads unchanged. `forward(x)` takes bf16 [..., in_features] and returns
    [..., num_experts] logits in `out_dtype` (fp32 by default).

    Feed it from `kimi_router_ops.rms_norm` or `fused_add_rms_norm` (PDL kernels): at one
    token its kernel then loads its weights while the norm still runs. Behind a torch
    kernel, which never lets a dependent start early, it cannot (examples/moe_router.py).
    """

    def __init__(self, in_features: int, num_experts: int, out_dtype=torch.float32, device=None):
        super().__init__()
        # Argument errors are RuntimeErrors, as the ops' are (docs/api.md).
        if out_dtype not in (torch.float32, torch.bfloat16):
            raise RuntimeError(f"RouterLinear: out_dtype must be torch.float32 or torch.bfloat16, got {out_dtype}")
        if in_features < 1 or num_experts < 1:
            raise RuntimeError(f"RouterLinear: in_features and num_experts must be >= 1, got "
                               f"{in_features} and {num_experts}")
        self.in_features = in_features
        self.num_experts = num_experts
        self.out_dtype = out_dtype
        self.weight = nn.Parameter(
            torch.empty(num_experts, in_features, dtype=torch.bfloat16, device=device)
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # nn.Linear's initialization

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch._check(
            x.dim() >= 1 and x.shape[-1] == self.in_features,
            lambda: f"RouterLinear: x must have in_features={self.in_features} as its last dimension, "
            f"got shape {list(x.shape)}",
        )
        logits = ll_bf16_gemm(x.reshape(-1, self.in_features), self.weight, self.out_dtype)
        return logits.reshape(*x.shape[:-1], self.num_experts)

    @classmethod
    def from_linear(cls, linear: nn.Linear, out_dtype=torch.float32) -> "RouterLinear":
        """A RouterLinear with `linear`'s weight (cast to bf16); `linear` must have no bias."""
        if linear.bias is not None:
            raise RuntimeError("RouterLinear.from_linear: the router gate must have no bias")
        gate = cls(linear.in_features, linear.out_features, out_dtype, device=linear.weight.device)
        with torch.no_grad():
            gate.weight.copy_(linear.weight)
        return gate

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, num_experts={self.num_experts}, out_dtype={self.out_dtype}"
