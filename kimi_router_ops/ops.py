"""Python surface of torch.ops.kimi: typed wrappers, the fake kernels and autograd.

Each wrapper is the record of its schema (`OPS`, by the `_op` decorator: its fake kernel and
whether it has a derivative); the package exports the records' wrappers, the registrations
at the end of this file and the generic tests (opcheck, compile, layouts) read them, so a new
op is its schema in csrc and one decorated wrapper here. Each op's schema and input contract live in its csrc/<op>.cpp, written once. The fake kernels
here give the outputs' shapes and dtypes only: under torch.compile a bad call traces, and the
op raises its clear message when the compiled graph runs. Every bad argument is a
RuntimeError, whatever the torch: the stable ABI that _C is built on carries no exception
type (csrc/torch_stable.h).

Autograd lives here because that ABI has none: `ll_bf16_gemm` and `router_gemm` have a
derivative; the routing and norm ops have none, and their outputs never require grad (a
fallthrough: no Python runs on their calls).
"""

import functools
import inspect
from typing import Callable, NamedTuple

import torch
from torch import Tensor

_ops = torch.ops.kimi


class Op(NamedTuple):
    """One torch.ops.kimi schema as Python sees it (the schema and its contract: csrc)."""

    schema: str  # its name in torch.ops.kimi
    wrapper: Callable  # the typed function, exported as kimi_router_ops.<its name>
    fake: Callable | None  # the outputs' shapes and dtypes; None: a query without tensors
    derivative: bool  # autograd registered below; every other tensor op falls through autograd


OPS: dict = {}  # schema name -> Op: what __init__ exports, the fakes and the generic tests read


def _op(fake=None, schema=None, derivative=False):
    """Records the decorated wrapper as the Python side of torch.ops.kimi.<schema> (default:
    the wrapper's name)."""
    def record(wrapper):
        name = schema or wrapper.__name__
        OPS[name] = Op(name, wrapper, fake, derivative)
        return wrapper
    return record


# -- fake kernels: shapes and dtypes ----------------------------------------------------------


def _rows(t: Tensor) -> int:
    """Rows of a [rows, cols] argument; 1 for one of another rank (the op rejects it when it
    runs)."""
    return t.shape[0] if t.dim() == 2 else 1


def _logits(x, w, out_dtype=torch.float32):
    return x.new_empty((_rows(x), _rows(w)), dtype=out_dtype)


def _choice(like, m, top_k):
    """topk_weights fp32 and topk_ids int32 [M, top_k]."""
    return like.new_empty((m, top_k), dtype=torch.float32), like.new_empty((m, top_k), dtype=torch.int32)


def _router_fake(x, w, bias, top_k, *args, **kwargs):
    return (*_choice(x, _rows(x), top_k), _logits(x, w))


def _router_projection_fake(x, w, p, bias, top_k, *args, **kwargs):
    return (*_router_fake(x, w, bias, top_k), x.new_empty((_rows(x), _rows(p)), dtype=torch.bfloat16))


def _norm_output(x):
    return x.new_empty((_rows(x), x.shape[-1] if x.dim() else 1), dtype=torch.bfloat16)


def _rms_norm_router_fake(x, norm_weight, eps, w, bias, top_k, *args, **kwargs):
    return (_norm_output(x), *_router_fake(x, w, bias, top_k))


def _fused_add_rms_norm_router_fake(x, residual, norm_weight, eps, w, bias, top_k, *args, **kwargs):
    return (_norm_output(x), _norm_output(x), *_router_fake(x, w, bias, top_k))


def _attn_res_router_fake(prefix, delta, blocks, norm_weight, qk_weight, output_norm_weight, num_blocks,
                          block_write_idx, eps, output_norm_eps, w, bias, top_k, *args, **kwargs):
    return (_norm_output(prefix), *_router_fake(prefix, w, bias, top_k))


def _no_output(*args, **kwargs):
    """The _out ops write the caller's tensors and return nothing."""
    return None


# -- the wrappers: one record each (_op) --------------------------------------------------------


def _around_autograd(op, tensors, *args):
    """op(*args), going around its autograd kernel (Python, several µs an eager call) where
    nothing needs a gradient."""
    if (
        torch.compiler.is_compiling()  # first: Dynamo cannot trace is_inference_mode_enabled
        or torch.is_inference_mode_enabled()  # autograd kernels do not run at all
        or (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors))
    ):
        return op(*args)
    with torch._C._AutoDispatchBelowAutograd():
        return op(*args)


@_op(lambda x, w, out_dtype=torch.float32, **_: _logits(x, w, out_dtype), derivative=True)
def ll_bf16_gemm(hidden_states: Tensor, router_weight: Tensor, out_dtype: torch.dtype = torch.float32) -> Tensor:
    """Router logits: hidden_states [M, K] bf16 @ router_weight [N, K]^T bf16 -> [M, N].

    Products and sums are fp32; the result is rounded once to `out_dtype` (float32 or
    bfloat16). On Hopper and datacenter Blackwell GPUs the CuTe DSL kernels run where the
    dispatch has one (a dot product at M == 1, tensor cores above; both load their first
    weights before the PDL wait); cuBLAS elsewhere. Differentiable."""
    return _around_autograd(_ops.ll_bf16_gemm.default, (hidden_states, router_weight),
                            hidden_states, router_weight, out_dtype)


@_op(lambda x, w, bias=None, out_dtype=torch.float32, **_: _logits(x, w, out_dtype), derivative=True)
def router_gemm(hidden_states: Tensor, router_weight: Tensor, bias: Tensor | None = None,
                out_dtype: torch.dtype = torch.float32) -> Tensor:
    """Router logits for any gate precision: F.linear(hidden_states, router_weight, bias)
    with fp32 products and sums, rounded once to `out_dtype`.

    router_weight [N, K] is bf16 (then hidden_states [M, K] is bf16: `ll_bf16_gemm`'s
    kernels) or fp32 (hidden_states bf16 or fp32; the weights are never rounded: fp32 FMAs
    of the stored values). `bias` [N] has router_weight's dtype and is added to the logits in
    fp32. The dispatch picks the kernel by dtype, M, N and K; cuBLAS where none serves.
    Differentiable, as `ll_bf16_gemm`."""
    return _around_autograd(_ops.router_gemm.default, (hidden_states, router_weight, bias),
                            hidden_states, router_weight, bias, out_dtype)


@_op(lambda x, w, variant, out_dtype=torch.float32, **_: _logits(x, w, out_dtype))
def router_gemm_with_variant(hidden_states: Tensor, router_weight: Tensor, variant: str,
                             out_dtype: torch.dtype = torch.float32) -> Tensor:
    """`router_gemm` without a bias, with the kernel named (a row of tables.gemm.ALL_VARIANTS
    for router_weight's dtype, or "cublas"). For benchmarks and tests."""
    return _ops.router_gemm_with_variant.default(hidden_states, router_weight, variant, out_dtype)


@_op(schema="ll_bf16_gemm_variant")
def chosen_variant(M: int, N: int, K: int, out_dtype: torch.dtype = torch.float32, sm: int = 90,
                   aligned: bool = True, weight_dtype: torch.dtype = torch.bfloat16) -> str:
    """What the CUDA dispatch runs for a problem on a GPU of compute capability `sm`
    (major * 10 + minor) and router weights of `weight_dtype`: "<variant>:vec<8|4|1>",
    "cublas" or "empty"."""
    return _ops.ll_bf16_gemm_variant.default(M, N, K, out_dtype, sm, aligned, weight_dtype)


@_op()
def compiled_kernels() -> list[str]:
    """Symbols of the CUDA kernels linked into this build (empty for a CPU-only build)."""
    return list(_ops.compiled_kernels.default())


@_op()
def set_batch_invariant(enabled: bool) -> bool:
    """Batch-invariant mode on or off, for every op and thread of the process; returns the
    previous setting. On, a token's logits, ids and weights are the same bits whatever other
    tokens share its call, at any M: every M sums as M = 1 does (the M = 1 kernels one token a
    CTA, cuBLAS or the CPU reference one token at a time; the router as its GEMM, then the
    routing kernel). The routing alone is batch-invariant in either mode. Off by default;
    KIMI_ROUTER_OPS_BATCH_INVARIANT=1 turns it on at import. Calls read it as they run:
    CUDA graphs keep the kernels they captured. docs/api.md has its cost."""
    return _ops.set_batch_invariant.default(bool(enabled))


@_op()
def is_batch_invariant() -> bool:
    """Whether batch-invariant mode is on (`set_batch_invariant`)."""
    return _ops.is_batch_invariant.default()


def _required(top_k, op):
    """top_k follows e_score_correction_bias, which defaults to None (Qwen, Mixtral: no bias):
    so it has a default too, and this says it is required."""
    if top_k is None:
        raise TypeError(f"{op}() missing required argument: 'top_k'")
    return top_k


@_op(_router_fake)
def ll_bf16_router(hidden_states: Tensor, router_weight: Tensor, e_score_correction_bias: Tensor | None = None,
                   top_k: int | None = None, n_group: int = 1, topk_group: int = 1, renormalize: bool = True,
                   routed_scaling_factor: float = 1.0, scoring: str = "sigmoid") -> tuple[Tensor, Tensor, Tensor]:
    """The whole MoE router in one op: logits = hidden_states @ router_weight^T (fp32),
    scores = sigmoid(logits) (DeepSeek-V3 family: DeepseekV3TopkRouter.forward in
    transformers 5.x) or, with scoring="softmax", softmax(logits) over the N experts
    (DeepSeek-V2, Qwen-MoE, Mixtral families), the score-correction bias for the choice
    only, grouped top-k, weights gathered from the unbiased scores, renormalized and scaled.

    Returns (topk_weights fp32 [M, top_k], topk_ids int32 [M, top_k], logits fp32 [M, N]).
    Ids are sorted by biased score, descending; equal scores go to the lower expert id (and
    equal group scores to the lower group). A group's score is the sum of its two best
    biased scores with sigmoid, its best one with softmax (DeepSeek-V2's group-limited
    greedy). `e_score_correction_bias` is fp32 or bf16 [N], or None for no correction."""
    return _ops.ll_bf16_router.default(hidden_states, router_weight, e_score_correction_bias,
                                       _required(top_k, "ll_bf16_router"), n_group,
                                       topk_group, renormalize, routed_scaling_factor, scoring)


@_op(_router_fake)
def router(hidden_states: Tensor, router_weight: Tensor, e_score_correction_bias: Tensor | None = None,
           top_k: int | None = None, n_group: int = 1, topk_group: int = 1, renormalize: bool = True, routed_scaling_factor: float = 1.0,
           scoring: str = "sigmoid", gate_bias: Tensor | None = None, input_ids: Tensor | None = None,
           hash_table: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """`ll_bf16_router` for any gate precision: logits = `router_gemm(hidden_states,
    router_weight, gate_bias)` (bf16 or fp32 weights; the gate bias, of the weights' dtype,
    is part of the logits, as gpt-oss's router adds it), then the same routing. Returns
    (topk_weights fp32 [M, top_k], topk_ids int32 [M, top_k], logits fp32 [M, N]); one launch
    where a fused kernel serves the problem (bf16 hidden_states). A hash-routed layer passes
    `input_ids` and `hash_table`, as `moe_routing`."""
    return _ops.router.default(hidden_states, router_weight, e_score_correction_bias, _required(top_k, "router"),
                               n_group, topk_group, renormalize, routed_scaling_factor, scoring, gate_bias,
                               input_ids, hash_table)


@_op(_router_fake)
def router_with_variant(hidden_states: Tensor, router_weight: Tensor, e_score_correction_bias: Tensor | None,
                        top_k: int, n_group: int, topk_group: int, renormalize: bool, routed_scaling_factor: float,
                        variant: str, scoring: str = "sigmoid", gate_bias: Tensor | None = None,
                        input_ids: Tensor | None = None,
                        hash_table: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """`router` with the fused kernel named: a row of tables.router.ROUTER_VARIANTS, which must
    serve the problem on this GPU (`RuntimeError` otherwise). The CPU checks the name and
    runs the reference. For benchmarks and tests."""
    return _ops.router_with_variant.default(hidden_states, router_weight, e_score_correction_bias, top_k, n_group,
                                            topk_group, renormalize, routed_scaling_factor, variant, scoring,
                                            gate_bias, input_ids, hash_table)


@_op(_router_projection_fake)
def router_and_projection(hidden_states: Tensor, router_weight: Tensor, projection_weight: Tensor,
                          e_score_correction_bias: Tensor | None = None, top_k: int | None = None, n_group: int = 1,
                          topk_group: int = 1, renormalize: bool = True, routed_scaling_factor: float = 1.0,
                          scoring: str = "sigmoid",
                          gate_bias: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`router` and a second projection of the same tokens, one weight stream for both:
    Kimi-K3's gate and its latent MoE's down-projection, which read the same AttnRes output.

    Returns (topk_weights, topk_ids, logits) exactly as `router(hidden_states, router_weight,
    ...)` and projection = hidden_states @ projection_weight^T, bf16 [M, L] (fp32 products and
    sums, one rounding). hidden_states and projection_weight [L, K] are bf16. On sm_90 /
    sm_100 at M <= 2 (bf16 gate, K <= 8192, 16-byte aligned rows) one persistent kernel
    streams both weights, its first tile loaded before the PDL wait, then the routing
    kernel; elsewhere the router op, then the GEMM op."""
    return _ops.router_and_projection.default(hidden_states, router_weight, projection_weight,
                                              e_score_correction_bias, _required(top_k, "router_and_projection"),
                                              n_group, topk_group, renormalize,
                                              routed_scaling_factor, scoring, gate_bias)


@_op(schema="ll_bf16_router_variant")
def chosen_router_variant(M: int, N: int, K: int, top_k: int, n_group: int = 1, topk_group: int = 1, sm: int = 90,
                          aligned: bool = True, scoring: str = "sigmoid", weight_dtype: torch.dtype = torch.bfloat16,
                          x_dtype: torch.dtype = torch.bfloat16) -> str:
    """What the CUDA router ops run for a problem on a GPU of compute capability `sm`: the
    name of a fused router row (one launch), "gemm+moe_routing" (the GEMM op, then the
    routing op's kernel) or "reference" (the GEMM op, then the routing as torch ops). A
    problem the op rejects raises the op's error."""
    return _ops.ll_bf16_router_variant.default(M, N, K, top_k, n_group, topk_group, sm, aligned, scoring,
                                               weight_dtype, x_dtype)


def _constant_query(query):
    """A query of sizes and names, asked once for each: under torch.compile its answer is a
    constant of the trace (its arguments must be static there, as N and H are)."""
    answers, signature = {}, inspect.signature(query)

    @torch.compiler.assume_constant_result
    @functools.wraps(query)
    def ask(*args, **kwargs):
        call = signature.bind(*args, **kwargs)
        call.apply_defaults()
        key = tuple(call.arguments.values())
        if key not in answers:
            answers[key] = query(*key)
        return answers[key]
    return ask


@_op()
@_constant_query
def routing_misfit(num_experts: int, top_k: int, n_group: int = 1, topk_group: int = 1, scoring: str = "sigmoid",
                   logits_dtype: torch.dtype = torch.float32, bias_dtype: torch.dtype | None = None) -> str:
    """"" where `moe_routing` (and the routers' routing) takes `num_experts` experts with these
    arguments and dtypes; otherwise the error it would raise. For callers choosing between
    our ops and another implementation (the engines' plugins)."""
    return _ops.routing_misfit.default(num_experts, top_k, n_group, topk_group, scoring, logits_dtype, bias_dtype)


@_op()
@_constant_query
def router_gemm_misfit(x_dtype: torch.dtype, weight_dtype: torch.dtype, out_dtype: torch.dtype = torch.float32,
                       bias_dtype: torch.dtype | None = None) -> str:
    """"" where `router_gemm` takes hidden states, weights, logits and a bias of these dtypes;
    otherwise the error it would raise. For callers choosing between it and another GEMM (the
    engines' plugins)."""
    return _ops.router_gemm_misfit.default(x_dtype, weight_dtype, out_dtype, bias_dtype)


@_op()
@_constant_query
def attn_res_kernel_misfit(hidden: int, num_blocks: int, sm: int = 90) -> str:
    """"" where `attn_res`'s kernel serves hidden size `hidden` and `num_blocks` blocks on a GPU
    of compute capability `sm`; otherwise why not (the op then runs its reference there)."""
    return _ops.attn_res_kernel_misfit.default(hidden, num_blocks, sm)


@_op(lambda logits, bias, top_k, *args, **kwargs: _choice(logits, _rows(logits), top_k))
def moe_routing(logits: Tensor, e_score_correction_bias: Tensor | None = None, top_k: int | None = None,
                n_group: int = 1,
                topk_group: int = 1, renormalize: bool = True, routed_scaling_factor: float = 1.0,
                scoring: str = "sigmoid", input_ids: Tensor | None = None,
                hash_table: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The routing of `ll_bf16_router` on logits you already have (fp32 or bf16 [M, N]):
    sigmoid, softmax or sqrtsoftplus scores, the score-correction bias for the choice only,
    grouped top-k, weights from the unbiased scores, renormalized and scaled.

    Returns (topk_weights fp32 [M, top_k], topk_ids int32 [M, top_k]), in the order and with
    the tie rule of `ll_bf16_router`; given that op's logits, its ids and weights bit for
    bit. On sm_90 / sm_100 GPUs (N <= 1024, top_k <= 32) one PDL-launched kernel, one warp
    a token; elsewhere the routing as torch ops.

    A hash-routed layer (DeepSeek-V4's first layers) passes `input_ids` [M] and `hash_table`
    [V, top_k] (int32 or int64): ids = hash_table[input_ids] in the table's order, weights
    the scores at those ids (renormalized, scaled), the bias and groups unused. An index out
    of range is an error on the CPU; on a GPU that slot gets expert 0 and a NaN weight."""
    return _ops.moe_routing.default(logits, e_score_correction_bias, _required(top_k, "moe_routing"), n_group,
                                    topk_group, renormalize, routed_scaling_factor, scoring, input_ids,
                                    hash_table)


@_op(_no_output)
def moe_routing_out(logits: Tensor, e_score_correction_bias: Tensor | None = None, top_k: int | None = None,
                    n_group: int = 1, topk_group: int = 1, renormalize: bool = True,
                    routed_scaling_factor: float = 1.0, scoring: str = "sigmoid", input_ids: Tensor | None = None,
                    hash_table: Tensor | None = None, *, topk_weights: Tensor, topk_ids: Tensor,
                    expert_counts: Tensor | None = None, num_fused_shared_experts: int = 0,
                    shared_expert_weight: float = 1.0) -> tuple[Tensor, Tensor]:
    """`moe_routing` into tensors you own (CUDA graphs' static buffers: no allocation on the
    kernel paths), returned for convenience.

    topk_weights fp32 and topk_ids int32 or int64 [M, top_k + num_fused_shared_experts], each
    with a unit stride along its last dimension: the top_k picks as `moe_routing` gives them,
    then the fused shared experts' slots, ids N, N + 1, ... of weight `shared_expert_weight`
    (SGLang's moe_fused_gate: 1.0 where the routed scaling is already in the weights, else
    1 / routed_scaling_factor). `expert_counts`, int32 [N + num_fused_shared_experts], gets
    one added per stored id (bincount of topk_ids: an MoE dispatch's histogram); zero it
    first for this call's counts alone."""
    _ops.moe_routing_out.default(logits, e_score_correction_bias, _required(top_k, "moe_routing_out"), n_group,
                                 topk_group, renormalize, routed_scaling_factor, scoring, input_ids, hash_table,
                                 topk_weights=topk_weights, topk_ids=topk_ids, expert_counts=expert_counts,
                                 num_fused_shared_experts=num_fused_shared_experts,
                                 shared_expert_weight=shared_expert_weight)
    return topk_weights, topk_ids


@_op(_no_output)
def router_out(hidden_states: Tensor, router_weight: Tensor, e_score_correction_bias: Tensor | None = None,
               top_k: int | None = None, n_group: int = 1, topk_group: int = 1, renormalize: bool = True,
               routed_scaling_factor: float = 1.0, scoring: str = "sigmoid", gate_bias: Tensor | None = None,
               input_ids: Tensor | None = None, hash_table: Tensor | None = None, *, topk_weights: Tensor,
               topk_ids: Tensor, logits: Tensor, expert_counts: Tensor | None = None,
               num_fused_shared_experts: int = 0,
               shared_expert_weight: float = 1.0) -> tuple[Tensor, Tensor, Tensor]:
    """`router` into tensors you own: `moe_routing_out`'s outputs and arguments, and logits
    fp32 [M, N] (unit stride along N), which the kernels write on the way. Returns
    (topk_weights, topk_ids, logits), the tensors given."""
    _ops.router_out.default(hidden_states, router_weight, e_score_correction_bias, _required(top_k, "router_out"),
                            n_group, topk_group, renormalize, routed_scaling_factor, scoring, gate_bias,
                            input_ids, hash_table, topk_weights=topk_weights, topk_ids=topk_ids,
                            expert_counts=expert_counts, num_fused_shared_experts=num_fused_shared_experts,
                            shared_expert_weight=shared_expert_weight, logits=logits)
    return topk_weights, topk_ids, logits


@_op(lambda x, *args, **kwargs: _norm_output(x))
def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """bf16 ((x * rsqrt(mean(x^2) + eps)) * weight), fp32 math, one rounding; x bf16 [M, K],
    weight bf16 [K]. The producer of a router's hidden_states."""
    return _ops.rms_norm.default(x, weight, eps)


@_op(lambda x, *args, **kwargs: (_norm_output(x), _norm_output(x)))
def fused_add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """(rms_norm(s, weight, eps), s) with s = bf16(x + residual): the residual add and the
    norm in front of an MoE layer. Functional: neither input is written."""
    return _ops.fused_add_rms_norm.default(x, residual, weight, eps)


@_op(_rms_norm_router_fake)
def rms_norm_router(hidden_states: Tensor, norm_weight: Tensor, eps: float, router_weight: Tensor,
                    e_score_correction_bias: Tensor | None = None, top_k: int | None = None, n_group: int = 1,
                    topk_group: int = 1, renormalize: bool = True, routed_scaling_factor: float = 1.0,
                    scoring: str = "sigmoid", gate_bias: Tensor | None = None, input_ids: Tensor | None = None,
                    hash_table: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The norm in front of an MoE layer and its router in one op: normed =
    `rms_norm(hidden_states, norm_weight, eps)`, then `router(normed, router_weight, ...)`.

    Returns (normed bf16 [M, K], topk_weights, topk_ids, logits), each exactly what the two ops
    give on the same device: on a GPU the norm op's PDL kernel, then the router op's dispatch
    (one op for an engine to call; docs/kernel-notes.md says why not one kernel)."""
    return _ops.rms_norm_router.default(hidden_states, norm_weight, eps, router_weight, e_score_correction_bias,
                                        _required(top_k, "rms_norm_router"), n_group, topk_group, renormalize,
                                        routed_scaling_factor, scoring, gate_bias, input_ids, hash_table)


@_op(_fused_add_rms_norm_router_fake)
def fused_add_rms_norm_router(hidden_states: Tensor, residual: Tensor, norm_weight: Tensor, eps: float,
                              router_weight: Tensor, e_score_correction_bias: Tensor | None = None,
                              top_k: int | None = None, n_group: int = 1, topk_group: int = 1,
                              renormalize: bool = True, routed_scaling_factor: float = 1.0, scoring: str = "sigmoid",
                              gate_bias: Tensor | None = None, input_ids: Tensor | None = None,
                              hash_table: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """`rms_norm_router` after the residual add: (normed, residual_out) =
    `fused_add_rms_norm(hidden_states, residual, norm_weight, eps)`, then `router(normed, ...)`.
    Returns (normed, residual_out, topk_weights, topk_ids, logits), exactly the two ops'.
    Functional: neither input is written."""
    return _ops.fused_add_rms_norm_router.default(hidden_states, residual, norm_weight, eps, router_weight,
                                                  e_score_correction_bias,
                                                  _required(top_k, "fused_add_rms_norm_router"), n_group,
                                                  topk_group, renormalize, routed_scaling_factor, scoring,
                                                  gate_bias, input_ids, hash_table)


@_op(lambda prefix, *args, **kwargs: _norm_output(prefix))
def attn_res(prefix: Tensor, delta: Tensor | None, blocks: Tensor, norm_weight: Tensor, qk_weight: Tensor,
             output_norm_weight: Tensor | None, num_blocks: int, block_write_idx: int, eps: float,
             output_norm_eps: float) -> Tensor:
    """Kimi-K3's attention residual, vLLM 0.33's `attn_res` with the same arguments in the
    same order: p = bf16(prefix + delta) (prefix without a delta) is written into `prefix`
    (with a delta) and `blocks[:, block_write_idx]` (when >= 0); the sources
    blocks[:, :num_blocks] and p are mixed by a softmax over their normalized projections on
    norm_weight * qk_weight, then RMS-normed by output_norm_weight (if given). Returns a new
    bf16 [M, H]. prefix [M, H], delta [M, H] or None, blocks [M, R, H], all bf16 with a
    contiguous last dimension; the weights bf16 [H]. docs/api.md has the formula."""
    return _ops.attn_res.default(prefix, delta, blocks, norm_weight, qk_weight, output_norm_weight, num_blocks,
                                 block_write_idx, eps, output_norm_eps)


@_op(_attn_res_router_fake)
def attn_res_router(prefix: Tensor, delta: Tensor | None, blocks: Tensor, norm_weight: Tensor, qk_weight: Tensor,
                    output_norm_weight: Tensor | None, num_blocks: int, block_write_idx: int, eps: float,
                    output_norm_eps: float, router_weight: Tensor, e_score_correction_bias: Tensor | None = None,
                    top_k: int | None = None, n_group: int = 1, topk_group: int = 1, renormalize: bool = True,
                    routed_scaling_factor: float = 1.0, scoring: str = "sigmoid",
                    gate_bias: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Kimi-K3's pre-MoE front in one op: hidden = `attn_res(prefix, ..., output_norm_eps)`
    (its writes into prefix and blocks included), then `router(hidden, router_weight, ...)`.

    Returns (hidden bf16 [M, H], topk_weights, topk_ids, logits), each exactly what the two ops
    give on the same device: on a GPU the AttnRes kernel, then the router op's dispatch behind
    it through PDL (docs/kernel-notes.md says why not one kernel)."""
    return _ops.attn_res_router.default(prefix, delta, blocks, norm_weight, qk_weight, output_norm_weight,
                                        num_blocks, block_write_idx, eps, output_norm_eps, router_weight,
                                        e_score_correction_bias, _required(top_k, "attn_res_router"), n_group,
                                        topk_group, renormalize, routed_scaling_factor, scoring, gate_bias)


# -- autograd ---------------------------------------------------------------------------------
# logits = x w^T (+ b): dx = dlogits w, dw = dlogits^T x, db = the sum of dlogits over tokens,
# in fp32, returned in the inputs' dtypes. torch runs these autograd kernels in Python on every
# eager call outside inference_mode, needed or not; the wrappers above skip them.
def _gemm_setup_context(ctx, inputs, output):
    x, w, *rest = inputs  # router_gemm's third input is its bias, ll_bf16_gemm's out_dtype
    bias = rest[0] if rest and isinstance(rest[0], Tensor) else None
    ctx.bias_dtype = None if bias is None else bias.dtype
    ctx.inputs = len(inputs)
    ctx.save_for_backward(x, w)


def _gemm_backward(ctx, grad):
    x, w = ctx.saved_tensors
    grad, needs = grad.float(), ctx.needs_input_grad
    grads = [(grad @ w.float()).to(x.dtype) if needs[0] else None,
             (grad.t() @ x.float()).to(w.dtype) if needs[1] else None]
    if ctx.bias_dtype is not None:
        grads.append(grad.sum(0).to(ctx.bias_dtype) if needs[2] else None)
    return (*grads, *[None] * (ctx.inputs - len(grads)))


# Every record registered: its fake kernel, and its derivative or, for the ops that pick
# discrete experts or serve inference only, a fallthrough (no cost per call; their outputs do
# not require grad).
_autograd_lib = torch.library.Library("kimi", "IMPL")
for _record in OPS.values():
    if _record.fake is None:
        continue
    torch.library.register_fake(f"kimi::{_record.schema}")(_record.fake)
    if _record.derivative:
        torch.library.register_autograd(f"kimi::{_record.schema}", _gemm_backward, setup_context=_gemm_setup_context)
    else:
        _autograd_lib.impl(_record.schema, torch.library.fallthrough_kernel, "Autograd")

__all__ = [_record.wrapper.__name__ for _record in OPS.values()]
