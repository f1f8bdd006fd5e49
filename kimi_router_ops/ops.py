"""Python surface of torch.ops.kimi: typed wrappers and the fake (meta) kernels.

The schema and autograd live in csrc/ll_bf16_gemm.cpp; the fake kernels here check the same input
contract as csrc's check_inputs (same exception types, same messages), so torch.compile
reports a bad call as eager mode would, without touching data.
"""

import torch
from torch import Tensor

_OUT_DTYPES = (torch.float32, torch.bfloat16)


def ll_bf16_gemm(
    hidden_states: Tensor, router_weight: Tensor, out_dtype: torch.dtype = torch.float32
) -> Tensor:
    """Router logits: hidden_states [M, K] bf16 @ router_weight [N, K]^T bf16 -> [M, N].

    Products and sums are fp32; the result is rounded once to `out_dtype` (float32 or
    bfloat16). On Hopper and datacenter Blackwell GPUs, M <= 16 runs the CuTe DSL kernels
    (M == 1 with weight prefetch across the PDL wait); larger M and other GPUs use cuBLAS.
    """
    return torch.ops.kimi.ll_bf16_gemm.default(hidden_states, router_weight, out_dtype)


def ll_bf16_gemm_with_variant(
    hidden_states: Tensor,
    router_weight: Tensor,
    variant: str,
    out_dtype: torch.dtype = torch.float32,
) -> Tensor:
    """The same computation with the kernel named (a row of variants.VARIANTS, or "cublas")."""
    return torch.ops.kimi.ll_bf16_gemm_with_variant.default(
        hidden_states, router_weight, variant, out_dtype
    )


def chosen_variant(
    M: int,
    N: int,
    K: int,
    out_dtype: torch.dtype = torch.float32,
    sm: int = 90,
    aligned: bool = True,
) -> str:
    """What the CUDA dispatch runs for a problem on a GPU of compute capability `sm`
    (major * 10 + minor): "<variant>:vec8", "<variant>:vec1", "cublas" or "empty"."""
    return torch.ops.kimi.ll_bf16_gemm_variant.default(M, N, K, out_dtype, sm, aligned)


def compiled_kernels() -> list[str]:
    """Symbols of the CUDA kernels linked into this build (empty for a CPU-only build)."""
    return list(torch.ops.kimi.compiled_kernels.default())


def _check_inputs(x: Tensor, w: Tensor, out_dtype: torch.dtype) -> None:
    """csrc's check_inputs, for the fake kernels."""
    torch._check_type(
        x.dtype == torch.bfloat16,
        lambda: f"ll_bf16_gemm: hidden_states must be torch.bfloat16, got {x.dtype}",
    )
    torch._check_type(
        w.dtype == torch.bfloat16,
        lambda: f"ll_bf16_gemm: router_weight must be torch.bfloat16, got {w.dtype}",
    )
    torch._check_value(
        x.dim() == 2,
        lambda: f"ll_bf16_gemm: hidden_states must be 2-D [M, K], got shape {list(x.shape)}",
    )
    torch._check_value(
        w.dim() == 2,
        lambda: f"ll_bf16_gemm: router_weight must be 2-D [N, K], got shape {list(w.shape)}",
    )
    torch._check_value(
        x.shape[1] == w.shape[1],
        lambda: "ll_bf16_gemm: hidden_states [M, K] and router_weight [N, K] must have the same "
        f"K, got hidden_states {list(x.shape)} and router_weight {list(w.shape)}",
    )
    torch._check_value(
        x.shape[1] > 0, lambda: f"ll_bf16_gemm: K must be at least 1, got hidden_states {list(x.shape)}"
    )
    torch._check_value(
        w.shape[0] > 0,
        lambda: f"ll_bf16_gemm: router_weight must have N >= 1 rows, got {list(w.shape)}",
    )
    torch._check(
        x.device == w.device,
        lambda: "ll_bf16_gemm: hidden_states and router_weight must be on the same device, "
        f"got {x.device} and {w.device}",
    )
    torch._check_value(
        out_dtype in _OUT_DTYPES,
        lambda: f"ll_bf16_gemm: out_dtype must be torch.float32 or torch.bfloat16, got {out_dtype}",
    )


@torch.library.register_fake("kimi::ll_bf16_gemm")
def _ll_bf16_gemm_fake(hidden_states, router_weight, out_dtype=torch.float32):
    _check_inputs(hidden_states, router_weight, out_dtype)
    return hidden_states.new_empty((hidden_states.shape[0], router_weight.shape[0]), dtype=out_dtype)


@torch.library.register_fake("kimi::ll_bf16_gemm_with_variant")
def _ll_bf16_gemm_with_variant_fake(hidden_states, router_weight, variant, out_dtype=torch.float32):
    return _ll_bf16_gemm_fake(hidden_states, router_weight, out_dtype)
