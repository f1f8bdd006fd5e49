"""The routing op's kernels (kernels/moe_routing.py): one a range of experts, logits dtype and
bias dtype."""

from dataclasses import dataclass

from . import BIAS_DTYPES, OUT_DTYPES, ROUTER_N_RANGES

@dataclass(frozen=True)
class RoutingKernel:
    """The routing op's kernel (kernels/moe_routing.py) for n_min <= N <= n_max experts (a
    lane's share compiled in, as in the fused router), one logits dtype and one bias dtype;
    ROUTING_WARPS tokens a CTA."""

    n_min: int
    n_max: int
    logits_dtype: str
    bias_dtype: str


ROUTING_WARPS = 4
ROUTING_KERNELS = tuple(
    RoutingKernel(lo, hi, logits, bias) for lo, hi in ROUTER_N_RANGES for logits in OUT_DTYPES for bias in BIAS_DTYPES
)
