"""Python surface of torch.ops.kimi: typed wrappers, the fake (meta) kernels and autograd.

Each op's schema lives in its csrc/<op>.cpp; the fake kernels here check the same input
contract as the C++ checks (same messages), so torch.compile reports a bad call as eager
mode would, without touching data. Every bad argument is a RuntimeError, whatever the torch:
the stable ABI that _C is built on carries no exception type (csrc/torch_stable.h).

Autograd lives here because torch's stable ABI, which _C is built on, has none:
`ll_bf16_gemm` has a derivative; the routing and norm ops have none, and their outputs never
require grad (a fallthrough: no Python runs on their calls).
"""

import math

import torch
from torch import Tensor

_OUT_DTYPES = (torch.float32, torch.bfloat16)


def ll_bf16_gemm(
    hidden_states: Tensor, router_weight: Tensor, out_dtype: torch.dtype = torch.float32
) -> Tensor:
    """Router logits: hidden_states [M, K] bf16 @ router_weight [N, K]^T bf16 -> [M, N].

    Products and sums are fp32; the result is rounded once to `out_dtype` (float32 or
    bfloat16). On Hopper and datacenter Blackwell GPUs, M <= 16 runs the CuTe DSL kernels
    (a dot product at M == 1, tensor cores above; both load their first weights before the
    PDL wait); larger M and other GPUs use cuBLAS.

    Differentiable. Where nothing needs a gradient this wrapper goes around the op's autograd
    kernel, a Python function that costs several µs an eager call (see the end of this file).
    """
    op = torch.ops.kimi.ll_bf16_gemm.default
    if (
        torch.compiler.is_compiling()  # first: Dynamo cannot trace is_inference_mode_enabled
        or torch.is_inference_mode_enabled()  # autograd kernels do not run at all
        or (torch.is_grad_enabled() and (hidden_states.requires_grad or router_weight.requires_grad))
    ):
        return op(hidden_states, router_weight, out_dtype)
    with torch._C._AutoDispatchBelowAutograd():
        return op(hidden_states, router_weight, out_dtype)


def router_gemm(
    hidden_states: Tensor,
    router_weight: Tensor,
    bias: Tensor | None = None,
    out_dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Router logits for any gate precision: F.linear(hidden_states, router_weight, bias)
    with fp32 products and sums, rounded once to `out_dtype`.

    router_weight [N, K] is bf16 (then hidden_states [M, K] is bf16: `ll_bf16_gemm`'s
    kernels) or fp32 (hidden_states bf16 or fp32; the weights are never rounded: fp32 FMAs
    of the stored values). `bias` [N] has router_weight's dtype and is added to the logits in
    fp32. The dispatch picks the kernel by dtype, M, N and K; cuBLAS where none serves.
    Differentiable, as `ll_bf16_gemm`.
    """
    op = torch.ops.kimi.router_gemm.default
    if (
        torch.compiler.is_compiling()
        or torch.is_inference_mode_enabled()
        or (torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                            for t in (hidden_states, router_weight, bias)))
    ):
        return op(hidden_states, router_weight, bias, out_dtype)
    with torch._C._AutoDispatchBelowAutograd():
        return op(hidden_states, router_weight, bias, out_dtype)


def ll_bf16_gemm_with_variant(
    hidden_states: Tensor,
    router_weight: Tensor,
    variant: str,
    out_dtype: torch.dtype = torch.float32,
) -> Tensor:
    """`router_gemm` without a bias, with the kernel named (a row of variants.VARIANTS for
    router_weight's dtype, or "cublas")."""
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
    weight_dtype: torch.dtype = torch.bfloat16,
) -> str:
    """What the CUDA dispatch runs for a problem on a GPU of compute capability `sm`
    (major * 10 + minor) and router weights of `weight_dtype`: "<variant>:vec<8|4|1>",
    "cublas" or "empty"."""
    return torch.ops.kimi.ll_bf16_gemm_variant.default(M, N, K, out_dtype, sm, aligned, weight_dtype)


def compiled_kernels() -> list[str]:
    """Symbols of the CUDA kernels linked into this build (empty for a CPU-only build)."""
    return list(torch.ops.kimi.compiled_kernels.default())


def _check_inputs(x: Tensor, w: Tensor, out_dtype: torch.dtype, op: str = "ll_bf16_gemm") -> None:
    """csrc's check_inputs, for the fake kernels."""
    torch._check(
        x.dtype == torch.bfloat16,
        lambda: f"{op}: hidden_states must be torch.bfloat16, got {x.dtype}",
    )
    torch._check(
        w.dtype == torch.bfloat16,
        lambda: f"{op}: router_weight must be torch.bfloat16, got {w.dtype}",
    )
    torch._check(
        x.dim() == 2,
        lambda: f"{op}: hidden_states must be 2-D [M, K], got shape {list(x.shape)}",
    )
    torch._check(
        w.dim() == 2,
        lambda: f"{op}: router_weight must be 2-D [N, K], got shape {list(w.shape)}",
    )
    torch._check(
        x.shape[1] == w.shape[1],
        lambda: f"{op}: hidden_states [M, K] and router_weight [N, K] must have the same "
        f"K, got hidden_states {list(x.shape)} and router_weight {list(w.shape)}",
    )
    torch._check(
        x.shape[1] > 0, lambda: f"{op}: K must be at least 1, got hidden_states {list(x.shape)}"
    )
    torch._check(
        w.shape[0] > 0,
        lambda: f"{op}: router_weight must have N >= 1 rows, got {list(w.shape)}",
    )
    torch._check(
        x.device == w.device,
        lambda: f"{op}: hidden_states and router_weight must be on the same device, "
        f"got {x.device} and {w.device}",
    )
    torch._check(
        out_dtype in _OUT_DTYPES,
        lambda: f"{op}: out_dtype must be torch.float32 or torch.bfloat16, got {out_dtype}",
    )


@torch.library.register_fake("kimi::ll_bf16_gemm")
def _ll_bf16_gemm_fake(hidden_states, router_weight, out_dtype=torch.float32):
    _check_inputs(hidden_states, router_weight, out_dtype)
    return hidden_states.new_empty((hidden_states.shape[0], router_weight.shape[0]), dtype=out_dtype)


# The newer ops' fakes give shapes and dtypes only: the contract is checked in csrc, when the
# op runs.
@torch.library.register_fake("kimi::ll_bf16_gemm_with_variant")
def _ll_bf16_gemm_with_variant_fake(hidden_states, router_weight, variant, out_dtype=torch.float32):
    return hidden_states.new_empty((hidden_states.shape[0], router_weight.shape[0]), dtype=out_dtype)


@torch.library.register_fake("kimi::router_gemm")
def _router_gemm_fake(hidden_states, router_weight, bias=None, out_dtype=torch.float32):
    return hidden_states.new_empty((hidden_states.shape[0], router_weight.shape[0]), dtype=out_dtype)


def ll_bf16_router(
    hidden_states: Tensor,
    router_weight: Tensor,
    e_score_correction_bias: Tensor | None,
    top_k: int,
    n_group: int = 1,
    topk_group: int = 1,
    renormalize: bool = True,
    routed_scaling_factor: float = 1.0,
    scoring: str = "sigmoid",
) -> tuple[Tensor, Tensor, Tensor]:
    """The whole MoE router in one op: logits = hidden_states @ router_weight^T (fp32),
    scores = sigmoid(logits) (DeepSeek-V3 family: DeepseekV3TopkRouter.forward in
    transformers 5.x) or, with scoring="softmax", softmax(logits) over the N experts
    (DeepSeek-V2, Qwen-MoE, Mixtral families), the score-correction bias for the choice
    only, grouped top-k, weights gathered from the unbiased scores, renormalized and scaled.

    Returns (topk_weights fp32 [M, top_k], topk_ids int32 [M, top_k], logits fp32 [M, N]).
    Ids are sorted by biased score, descending; equal scores go to the lower expert id (and
    equal group scores to the lower group). A group's score is the sum of its two best
    biased scores with sigmoid, its best one with softmax (DeepSeek-V2's group-limited
    greedy). `e_score_correction_bias` is fp32 or bf16 [N], or None for no correction.
    """
    return torch.ops.kimi.ll_bf16_router.default(
        hidden_states, router_weight, e_score_correction_bias, top_k, n_group, topk_group,
        renormalize, routed_scaling_factor, scoring,
    )


def router(
    hidden_states: Tensor,
    router_weight: Tensor,
    e_score_correction_bias: Tensor | None,
    top_k: int,
    n_group: int = 1,
    topk_group: int = 1,
    renormalize: bool = True,
    routed_scaling_factor: float = 1.0,
    scoring: str = "sigmoid",
    gate_bias: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """`ll_bf16_router` for any gate precision: logits = `router_gemm(hidden_states,
    router_weight, gate_bias)` (bf16 or fp32 weights; the gate bias, of the weights' dtype,
    is part of the logits, as gpt-oss's router adds it), then the same routing. Returns
    (topk_weights fp32 [M, top_k], topk_ids int32 [M, top_k], logits fp32 [M, N]); one launch
    where a fused kernel serves the problem (bf16 hidden_states)."""
    return torch.ops.kimi.router.default(
        hidden_states, router_weight, e_score_correction_bias, top_k, n_group, topk_group,
        renormalize, routed_scaling_factor, scoring, gate_bias,
    )


@torch.library.register_fake("kimi::router")
def _router_fake(hidden_states, router_weight, e_score_correction_bias, top_k, n_group=1, topk_group=1,
                 renormalize=True, routed_scaling_factor=1.0, scoring="sigmoid", gate_bias=None):
    m, n = hidden_states.shape[0], router_weight.shape[0]
    return (
        hidden_states.new_empty((m, top_k), dtype=torch.float32),
        hidden_states.new_empty((m, top_k), dtype=torch.int32),
        hidden_states.new_empty((m, n), dtype=torch.float32),
    )


def ll_bf16_router_with_variant(
    hidden_states: Tensor,
    router_weight: Tensor,
    e_score_correction_bias: Tensor | None,
    top_k: int,
    n_group: int,
    topk_group: int,
    renormalize: bool,
    routed_scaling_factor: float,
    variant: str,
    scoring: str = "sigmoid",
) -> tuple[Tensor, Tensor, Tensor]:
    """`ll_bf16_router` with the fused kernel named: a row of
    `kimi_router_ops.variants.ROUTER_VARIANTS`, which must serve the problem on this GPU
    (`RuntimeError` otherwise). The CPU checks the name and runs the reference. For
    benchmarks and tests."""
    return torch.ops.kimi.ll_bf16_router_with_variant.default(
        hidden_states, router_weight, e_score_correction_bias, top_k, n_group, topk_group,
        renormalize, routed_scaling_factor, variant, scoring,
    )


def chosen_router_variant(
    M: int,
    N: int,
    K: int,
    top_k: int,
    n_group: int = 1,
    topk_group: int = 1,
    sm: int = 90,
    aligned: bool = True,
    scoring: str = "sigmoid",
    weight_dtype: torch.dtype = torch.bfloat16,
    x_dtype: torch.dtype = torch.bfloat16,
) -> str:
    """What the CUDA router ops run for a problem on a GPU of compute capability `sm`: the
    name of a fused router row (one launch), "gemm+moe_routing" (the GEMM op, then the
    routing op's kernel) or "reference" (the GEMM op, then the routing as torch ops). A
    problem the op rejects raises the op's error."""
    return torch.ops.kimi.ll_bf16_router_variant.default(
        M, N, K, top_k, n_group, topk_group, sm, aligned, scoring, weight_dtype, x_dtype
    )


def _check_scoring(op, scoring) -> None:
    """csrc's parse_scoring, for the fake kernels."""
    torch._check(
        scoring in ("sigmoid", "softmax"),
        lambda: f"{op}: scoring must be 'sigmoid' or 'softmax', got '{scoring}'",
    )


def _check_routing_args(op, n, device, device_of, bias, top_k, n_group, topk_group, scoring) -> None:
    """csrc's parse_scoring and check_routing_args, for the fake kernels."""
    _check_scoring(op, scoring)
    torch._check(
        n_group >= 1 and n % n_group == 0,
        lambda: f"{op}: n_group must divide the number of experts, got n_group={n_group} and N={n}",
    )
    torch._check(
        1 <= topk_group <= n_group,
        lambda: f"{op}: topk_group must be in [1, n_group={n_group}], got {topk_group}",
    )
    torch._check(
        n_group == 1 or n // n_group >= 2 or scoring == "softmax",
        lambda: f"{op}: with n_group > 1 and sigmoid scoring each group needs at least 2 experts "
        f"(a group's score is the sum of its two best), got N={n} and n_group={n_group}",
    )
    kept = topk_group * (n // n_group)
    torch._check(
        1 <= top_k <= kept,
        lambda: f"{op}: top_k must be in [1, experts in the kept groups={kept}], got {top_k}",
    )
    if bias is not None:
        torch._check(
            bias.dtype in (torch.float32, torch.bfloat16),
            lambda: f"{op}: e_score_correction_bias must be torch.float32 or torch.bfloat16, "
            f"got {bias.dtype}",
        )
        torch._check(
            bias.dim() == 1 and bias.shape[0] == n,
            lambda: f"{op}: e_score_correction_bias must have shape [N]=[{n}], got {list(bias.shape)}",
        )
        torch._check(
            bias.device == device,
            lambda: f"{op}: e_score_correction_bias must be on the device of {device_of}, got "
            f"{bias.device} and {device}",
        )


def _check_router_inputs(x, w, bias, top_k, n_group, topk_group, scoring) -> None:
    """csrc's check_router_inputs, for the fake kernel."""
    op = "ll_bf16_router"
    _check_scoring(op, scoring)
    _check_inputs(x, w, torch.float32, op)
    _check_routing_args(op, w.shape[0], w.device, "router_weight", bias, top_k, n_group, topk_group,
                        scoring)


@torch.library.register_fake("kimi::ll_bf16_router")
def _ll_bf16_router_fake(
    hidden_states, router_weight, e_score_correction_bias, top_k, n_group=1, topk_group=1,
    renormalize=True, routed_scaling_factor=1.0, scoring="sigmoid",
):
    _check_router_inputs(hidden_states, router_weight, e_score_correction_bias, top_k, n_group, topk_group,
                         scoring)
    m, n = hidden_states.shape[0], router_weight.shape[0]
    return (
        hidden_states.new_empty((m, top_k), dtype=torch.float32),
        hidden_states.new_empty((m, top_k), dtype=torch.int32),
        hidden_states.new_empty((m, n), dtype=torch.float32),
    )


def moe_routing(
    logits: Tensor,
    e_score_correction_bias: Tensor | None,
    top_k: int,
    n_group: int = 1,
    topk_group: int = 1,
    renormalize: bool = True,
    routed_scaling_factor: float = 1.0,
    scoring: str = "sigmoid",
) -> tuple[Tensor, Tensor]:
    """The routing of `ll_bf16_router` on logits you already have (fp32 or bf16 [M, N]):
    sigmoid or (scoring="softmax") softmax scores, the score-correction bias for the choice
    only, grouped top-k, weights from the unbiased scores, renormalized and scaled.

    Returns (topk_weights fp32 [M, top_k], topk_ids int32 [M, top_k]), in the order and with
    the tie rule of `ll_bf16_router`; given that op's logits, its ids and weights bit for
    bit. On sm_90 / sm_100 GPUs (N <= 1024, top_k <= 32) one PDL-launched kernel, one warp
    a token; elsewhere the routing as torch ops.
    """
    return torch.ops.kimi.moe_routing.default(
        logits, e_score_correction_bias, top_k, n_group, topk_group, renormalize, routed_scaling_factor,
        scoring,
    )


@torch.library.register_fake("kimi::moe_routing")
def _moe_routing_fake(
    logits, e_score_correction_bias, top_k, n_group=1, topk_group=1, renormalize=True,
    routed_scaling_factor=1.0, scoring="sigmoid",
):
    op = "moe_routing"
    _check_scoring(op, scoring)
    torch._check(
        logits.dtype in (torch.float32, torch.bfloat16),
        lambda: f"{op}: logits must be torch.float32 or torch.bfloat16, got {logits.dtype}",
    )
    torch._check(
        logits.dim() == 2, lambda: f"{op}: logits must be 2-D [M, N], got shape {list(logits.shape)}"
    )
    torch._check(
        logits.shape[1] >= 1, lambda: f"{op}: logits must have N >= 1 experts, got shape {list(logits.shape)}"
    )
    _check_routing_args(op, logits.shape[1], logits.device, "logits", e_score_correction_bias, top_k,
                        n_group, topk_group, scoring)
    m = logits.shape[0]
    return (
        logits.new_empty((m, top_k), dtype=torch.float32),
        logits.new_empty((m, top_k), dtype=torch.int32),
    )


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """bf16 ((x * rsqrt(mean(x^2) + eps)) * weight), fp32 math, one rounding; x bf16 [M, K],
    weight bf16 [K]. The producer of a router's hidden_states."""
    return torch.ops.kimi.rms_norm.default(x, weight, eps)


def fused_add_rms_norm(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6
) -> tuple[Tensor, Tensor]:
    """(rms_norm(s, weight, eps), s) with s = bf16(x + residual): the residual add and the
    norm in front of an MoE layer. Functional: neither input is written."""
    return torch.ops.kimi.fused_add_rms_norm.default(x, residual, weight, eps)


def _check_norm_inputs(op: str, x: Tensor, weight: Tensor, eps: float) -> None:
    """csrc's check_norm_inputs, for the fake kernels."""
    torch._check(x.dtype == torch.bfloat16, lambda: f"{op}: x must be torch.bfloat16, got {x.dtype}")
    torch._check(
        weight.dtype == torch.bfloat16, lambda: f"{op}: weight must be torch.bfloat16, got {weight.dtype}"
    )
    torch._check(x.dim() == 2, lambda: f"{op}: x must be 2-D [M, K], got shape {list(x.shape)}")
    torch._check(x.shape[1] >= 1, lambda: f"{op}: K must be at least 1, got x {list(x.shape)}")
    torch._check(
        weight.dim() == 1 and weight.shape[0] == x.shape[1],
        lambda: f"{op}: weight must have shape [K]=[{x.shape[1]}], got {list(weight.shape)}",
    )
    torch._check(
        weight.device == x.device,
        lambda: f"{op}: x and weight must be on the same device, got {x.device} and {weight.device}",
    )
    torch._check(
        math.isfinite(eps) and eps >= 0, lambda: f"{op}: eps must be finite and >= 0, got {eps}"
    )


@torch.library.register_fake("kimi::rms_norm")
def _rms_norm_fake(x, weight, eps):
    _check_norm_inputs("rms_norm", x, weight, eps)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("kimi::fused_add_rms_norm")
def _fused_add_rms_norm_fake(x, residual, weight, eps):
    op = "fused_add_rms_norm"
    _check_norm_inputs(op, x, weight, eps)
    torch._check(
        residual.dtype == torch.bfloat16,
        lambda: f"{op}: residual must be torch.bfloat16, got {residual.dtype}",
    )
    torch._check(
        residual.shape == x.shape,
        lambda: f"{op}: residual must have the shape of x {list(x.shape)}, got {list(residual.shape)}",
    )
    torch._check(
        residual.device == x.device,
        lambda: f"{op}: x and residual must be on the same device, got {x.device} and {residual.device}",
    )
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    return out, torch.empty_like(out)


def attn_res(
    prefix: Tensor,
    delta: Tensor | None,
    blocks: Tensor,
    norm_weight: Tensor,
    qk_weight: Tensor,
    output_norm_weight: Tensor | None,
    num_blocks: int,
    block_write_idx: int,
    eps: float,
    output_norm_eps: float,
) -> Tensor:
    """Kimi-K3's attention residual, vLLM 0.33's `attn_res` with the same arguments in the
    same order: p = bf16(prefix + delta) (prefix without a delta) is written into `prefix`
    (with a delta) and `blocks[:, block_write_idx]` (when >= 0); the sources
    blocks[:, :num_blocks] and p are mixed by a softmax over their normalized projections on
    norm_weight * qk_weight, then RMS-normed by output_norm_weight (if given). Returns a new
    bf16 [M, H]. prefix [M, H], delta [M, H] or None, blocks [M, R, H], all bf16 with a
    contiguous last dimension; the weights bf16 [H]. docs/api.md has the formula."""
    return torch.ops.kimi.attn_res.default(
        prefix, delta, blocks, norm_weight, qk_weight, output_norm_weight, num_blocks,
        block_write_idx, eps, output_norm_eps,
    )


@torch.library.register_fake("kimi::attn_res")
def _attn_res_fake(prefix, delta, blocks, norm_weight, qk_weight, output_norm_weight, num_blocks,
                   block_write_idx, eps, output_norm_eps):
    # The shape and dtype only; the op checks its inputs when it runs (csrc/attn_res.cpp).
    torch._check(prefix.dim() == 2, lambda: f"attn_res: prefix must be 2-D [M, H], got shape {list(prefix.shape)}")
    return torch.empty_like(prefix, memory_format=torch.contiguous_format)


@torch.library.register_fake("kimi::ll_bf16_router_with_variant")
def _ll_bf16_router_with_variant_fake(
    hidden_states, router_weight, e_score_correction_bias, top_k, n_group, topk_group,
    renormalize, routed_scaling_factor, variant, scoring="sigmoid",
):
    return _ll_bf16_router_fake(
        hidden_states, router_weight, e_score_correction_bias, top_k, n_group, topk_group,
        renormalize, routed_scaling_factor, scoring,
    )


# ll_bf16_gemm's derivative. logits = x w^T: dx = dlogits w and dw = dlogits^T x, in fp32,
# returned in the inputs' dtype (bf16). torch runs this autograd kernel in Python on every
# eager call of the op outside inference_mode, needed or not; the wrapper above skips it.
def _ll_bf16_gemm_setup_context(ctx, inputs, output):
    hidden_states, router_weight, _ = inputs
    ctx.save_for_backward(hidden_states, router_weight)


def _ll_bf16_gemm_backward(ctx, grad):
    x, w = ctx.saved_tensors
    grad = grad.float()
    grad_x = (grad @ w.float()).to(x.dtype) if ctx.needs_input_grad[0] else None
    grad_w = (grad.t() @ x.float()).to(w.dtype) if ctx.needs_input_grad[1] else None
    return grad_x, grad_w, None


torch.library.register_autograd(
    "kimi::ll_bf16_gemm", _ll_bf16_gemm_backward, setup_context=_ll_bf16_gemm_setup_context
)


def _router_gemm_setup_context(ctx, inputs, output):
    hidden_states, router_weight, bias, _ = inputs
    ctx.has_bias = bias is not None
    ctx.bias_dtype = bias.dtype if bias is not None else None
    ctx.save_for_backward(hidden_states, router_weight)


def _router_gemm_backward(ctx, grad):
    grad_x, grad_w, _ = _ll_bf16_gemm_backward(ctx, grad)
    grad_b = None
    if ctx.has_bias and ctx.needs_input_grad[2]:
        grad_b = grad.float().sum(0).to(ctx.bias_dtype)
    return grad_x, grad_w, grad_b, None


torch.library.register_autograd(
    "kimi::router_gemm", _router_gemm_backward, setup_context=_router_gemm_setup_context
)

# The other ops pick discrete experts or serve inference only: no derivative. A fallthrough
# skips autograd at no cost per call; their outputs do not require grad.
_autograd_lib = torch.library.Library("kimi", "IMPL")
for _op in (
    "ll_bf16_gemm_with_variant",
    "ll_bf16_router",
    "ll_bf16_router_with_variant",
    "router",
    "moe_routing",
    "rms_norm",
    "fused_add_rms_norm",
    "attn_res",
):
    _autograd_lib.impl(_op, torch.library.fallthrough_kernel, "Autograd")
