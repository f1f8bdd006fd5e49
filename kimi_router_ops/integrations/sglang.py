"""SGLang plugin: SGLang's MoE gate GEMM, routing and Kimi-K3 AttnRes on kimi_router_ops' ops.

    pip install "kimi_router_ops[sglang]"    # then SGLang loads the plugin in every process

SGLang runs the `register()` of every installed `sglang.srt.plugins` entry point at start-up
(`SGLANG_PLUGINS` may name the ones allowed), then applies the hooks they registered with
its `HookRegistry`. Each hook is an AROUND hook: ours where our op computes exactly what
SGLang's code does, SGLang's own function otherwise.

- The gate GEMM: `MoEGate.forward` (DeepSeek-V2/V3, Kimi-K2/K2.5/K3, GLM and the other
  models built on `sglang.srt.models.deepseek_v2.MoEGate`) becomes `router_gemm` for every
  M, on bf16 gates with bf16 tokens and on fp32 gates (`router_fp32`) with bf16 or fp32
  tokens, giving fp32 logits as SGLang's CUDA path does, outside deterministic inference and
  SGLang's CPU AMX packing.
- The routing: `biased_grouped_topk` (sigmoid, correction bias, groups: DeepSeek-V3,
  Kimi-K2), `grouped_topk` (no bias: DeepSeek-V2's softmax; sigmoid with every group kept)
  and `fused_topk` / `biased_topk_jit_kernel_impl` (no groups: softmax without a bias,
  Qwen3-MoE; sigmoid with or without one, on the CPU and on CUDA) become `moe_routing`,
  where the semantics match (`biased_grouped_topk` with one fused shared expert:
  `moe_routing_out`, its slot expert N): no other fused shared-expert slots, no per-token bias, no packed
  output, no padded-row mask or expert remapping inside the function, top_k within the kept
  groups. SGLang's routed_scaling_factor is applied where SGLang applies it in the function
  (`apply_routed_scaling_factor_on_output`). Expert remapping, padding masks, shared-slot
  columns and the recorder stay SGLang's: they run in `select_experts` around these
  functions.
- DeepSeek-V4: `biased_topk_jit_kernel_impl` with sqrtsoftplus (its `moe_fused_gate`, the
  padded rows past `num_token_non_padded` given weight 0 and id -1 as that kernel gives
  them; not the V4.1 `sqrtsoftplus_log1p` numerics), and the hash-routed layers:
  `HashTopK`'s fused `hash_topk` (sglang.kernels.ops.moe.dsv4) and its torch path
  `HashTopK._forward_torch` become `moe_routing` with `input_ids` and the `tid2eid` table,
  where no fused shared-expert slot is appended.
- Kimi-K3's attention residual on Hopper: `attn_residual._aggregate` (score, softmax over the
  block bank and the prefix, mix, output RMSNorm: a two-kernel Triton pipeline on Hopper;
  SM100 runs SGLang's TMA kernel) becomes `kimi.attn_res` on sm_90 and the CPU, for bf16
  inputs our kernel serves (H % 8 == 0 up to 8192, at most 15 blocks, no fused bank write).

Switches, read by `register()`: KIMI_ROUTER_OPS_SGLANG=0 (nothing),
KIMI_ROUTER_OPS_SGLANG_GATE=0, KIMI_ROUTER_OPS_SGLANG_ROUTING=0,
KIMI_ROUTER_OPS_SGLANG_ATTN_RES=0. One log line says what was replaced. `import kimi_router_ops` never imports SGLang; this module imports it inside
`register()`. Called by hand (outside SGLang's loader), `register()` only registers: call
`HookRegistry.apply_hooks()` after it, as SGLang's loader does.
"""

import logging
import os

import torch

from .. import ops
from ._engines import V4_SCORINGS, gate_served, routes

ENV_ALL, ENV_GATE, ENV_ROUTING = "KIMI_ROUTER_OPS_SGLANG", "KIMI_ROUTER_OPS_SGLANG_GATE", "KIMI_ROUTER_OPS_SGLANG_ROUTING"
ENV_ATTN_RES = "KIMI_ROUTER_OPS_SGLANG_ATTN_RES"
GATE_TARGET = "sglang.srt.models.deepseek_v2.MoEGate.forward"
ATTN_RES_TARGET = "sglang.srt.layers.attn_residual._aggregate"
TOPK_MODULE = "sglang.srt.layers.moe.topk"
# DeepSeek-V4's hash-routed layers: the fused kernel HashTopK.forward imports at call time, and
# its torch path.
HASH_TARGETS = {"sglang.kernels.ops.moe.dsv4.hash_topk": "fused_hash_topk",
                "sglang.srt.layers.moe.hash_topk.HashTopK._forward_torch": "hash_topk_forward_torch"}
logger = logging.getLogger("sglang.kimi_router_ops")
_registered: list[str] = []  # the targets hooked, once per process


def _enabled(name: str) -> bool:
    return os.environ.get(name, "1") != "0"


def register() -> list[str]:
    """Register the hooks the switches allow; returns what they replace. Idempotent."""
    if not _enabled(ENV_ALL):
        logger.info("kimi_router_ops: %s=0, SGLang's router left as it is", ENV_ALL)
        return []
    import importlib

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    hooks = {}
    if _enabled(ENV_GATE):
        hooks[GATE_TARGET] = (moe_gate_forward, "MoEGate.forward (router GEMM: router_gemm, bf16 and fp32 gates)")
    if _enabled(ENV_ROUTING):
        topk = importlib.import_module(TOPK_MODULE)
        # (Under our hook once SGLang applied it: the function it wraps.)
        if getattr(topk.biased_grouped_topk, "__wrapped__", topk.biased_grouped_topk) is topk.biased_grouped_topk_gpu:
            for name, hook in _ROUTING.items():
                hooks[f"{TOPK_MODULE}.{name}"] = (hook, f"{name} (routing: moe_routing)")
            for target, name in HASH_TARGETS.items():
                hooks[target] = (globals()[name], f"{target.rsplit('.', 1)[-1]} (hash routing: moe_routing)")
        else:  # SGLang's CPU AMX kernels take other arguments
            logger.info("kimi_router_ops: SGLang routes with its CPU AMX kernels here; routing not replaced")
    if _enabled(ENV_ATTN_RES):
        hooks[ATTN_RES_TARGET] = (attn_res_aggregate, "Kimi-K3 attention residual (_aggregate: kimi.attn_res on sm_90)")
    for target, (hook, _) in hooks.items():
        if target not in _registered:
            HookRegistry.register(target, hook, HookType.AROUND)
            _registered.append(target)
    replaced = [what for _, what in hooks.values()]
    logger.info("kimi_router_ops: replaced %s", ", ".join(replaced) or "nothing")
    return replaced


def _deterministic() -> bool:
    from sglang.srt.runtime_context import get_exec

    try:
        return bool(get_exec().deterministic.enable_deterministic_inference)
    except Exception:  # no server context (a model built by hand): SGLang's default, off
        return False


def moe_gate_forward(original, self, hidden_states, *args, **kwargs):
    """MoEGate.forward: router_gemm where the gate is a plain bf16 or fp32 matrix."""
    w = self.weight
    if (gate_served(hidden_states, w)
            and not getattr(self, "use_intel_amx_backend", False) and not _deterministic()):
        # fp32 logits, as SGLang's CUDA path gives at every M (its CPU path rounds a bf16
        # gate's logits to bf16 above its tiny-GEMM size).
        return ops.router_gemm(hidden_states, w, None, torch.float32)
    return original(self, hidden_states, *args, **kwargs)


def _scale(routed_scaling_factor, apply_on_output) -> float:
    return float(routed_scaling_factor) if apply_on_output and routed_scaling_factor is not None else 1.0


def biased_grouped_topk(original, hidden_states, gating_output, correction_bias, topk, renormalize,
                        num_expert_group=None, topk_group=None, num_fused_shared_experts=0,
                        routed_scaling_factor=None, apply_routed_scaling_factor_on_output=False):
    """SGLang's biased_grouped_topk (sigmoid, the bias for the choice, groups scored by their
    two best) on moe_routing; with one fused shared expert (DeepSeek-V3's shared-expert
    fusion) on moe_routing_out, whose last slot is expert N of weight 1, or 1 /
    routed_scaling_factor where SGLang scales the routed output later: what every SGLang
    router writes there. (More shared slots: SGLang's routers differ among themselves.)"""
    n_group, kept = num_expert_group or 1, topk_group or num_expert_group or 1
    shared = num_fused_shared_experts
    scale = _scale(routed_scaling_factor, apply_routed_scaling_factor_on_output)
    if shared == 0 and routes(gating_output, correction_bias, "sigmoid", topk, n_group, kept):
        return ops.moe_routing(gating_output, correction_bias, topk, n_group, kept, renormalize, scale, "sigmoid")
    if shared == 1 and topk > 1 and routes(gating_output, correction_bias, "sigmoid", topk - 1, n_group, kept):
        unscaled = apply_routed_scaling_factor_on_output or not routed_scaling_factor
        m = gating_output.shape[0]
        return ops.moe_routing_out(
            gating_output, correction_bias, topk - 1, n_group, kept, renormalize, scale, "sigmoid",
            topk_weights=gating_output.new_empty((m, topk), dtype=torch.float32),
            topk_ids=gating_output.new_empty((m, topk), dtype=torch.int32), num_fused_shared_experts=1,
            shared_expert_weight=1.0 if unscaled else 1.0 / routed_scaling_factor)
    return original(hidden_states, gating_output, correction_bias, topk, renormalize, num_expert_group, topk_group,
                    num_fused_shared_experts, routed_scaling_factor, apply_routed_scaling_factor_on_output)


def grouped_topk(original, hidden_states, gating_output, topk, renormalize, num_expert_group=None, topk_group=None,
                 num_fused_shared_experts=0, routed_scaling_factor=None, apply_routed_scaling_factor_on_output=False,
                 scoring_func="softmax"):
    """SGLang's grouped_topk (no bias; groups scored by their best) on moe_routing."""
    n_group, kept = num_expert_group or 1, topk_group or num_expert_group or 1
    if num_fused_shared_experts == 0 and routes(gating_output, None, scoring_func, topk, n_group, kept):
        return ops.moe_routing(gating_output, None, topk, n_group, kept, renormalize,
                               _scale(routed_scaling_factor, apply_routed_scaling_factor_on_output), scoring_func)
    return original(hidden_states, gating_output, topk, renormalize, num_expert_group, topk_group,
                    num_fused_shared_experts, routed_scaling_factor, apply_routed_scaling_factor_on_output,
                    scoring_func)


def fused_topk(original, hidden_states, gating_output, topk, renormalize, correction_bias=None,
               scoring_func="softmax", routed_scaling_factor=None, apply_routed_scaling_factor_on_output=False,
               num_fused_shared_experts=0, packed_out=None, num_token_non_padded=None):
    """SGLang's fused_topk (no groups) on moe_routing: softmax without a bias (SGLang's
    softmax ignores one), sigmoid with or without one; no packed output."""
    plain = num_fused_shared_experts == 0 and packed_out is None
    if plain and (scoring_func == "sigmoid" or correction_bias is None) \
            and routes(gating_output, correction_bias, scoring_func, topk, 1, 1):
        return ops.moe_routing(gating_output, correction_bias, topk, 1, 1, renormalize,
                               _scale(routed_scaling_factor, apply_routed_scaling_factor_on_output), scoring_func)
    return original(hidden_states, gating_output, topk, renormalize, correction_bias, scoring_func,
                    routed_scaling_factor, apply_routed_scaling_factor_on_output, num_fused_shared_experts,
                    **({} if packed_out is None else dict(packed_out=packed_out, num_token_non_padded=num_token_non_padded)))


def biased_topk_jit_kernel_impl(original, hidden_states, gating_output, correction_bias, topk, renormalize,
                                scoring_func="sigmoid", num_fused_shared_experts=0, routed_scaling_factor=None,
                                num_token_non_padded=None, expert_location_dispatch_info=None,
                                apply_routed_scaling_factor_on_output=False, packed_out=None,
                                sqrtsoftplus_log1p=False, router_logits_partials=None, num_shared_append=0):
    """SGLang's CUDA router without groups (its JIT kernel moe_fused_gate) on moe_routing:
    sigmoid, and DeepSeek-V4's sqrtsoftplus, whose padded rows (from num_token_non_padded on)
    get weight 0 and id -1 as moe_fused_gate gives them; where it neither remaps experts nor
    writes packed ids."""
    extras = dict(packed_out=packed_out, sqrtsoftplus_log1p=sqrtsoftplus_log1p,
                  router_logits_partials=router_logits_partials, num_shared_append=num_shared_append)
    plain = (num_fused_shared_experts == 0 and expert_location_dispatch_info is None and packed_out is None
             and router_logits_partials is None and num_shared_append == 0 and not sqrtsoftplus_log1p)
    padded = num_token_non_padded is not None
    if (plain and (scoring_func == "sqrtsoftplus" or not padded)
            and routes(gating_output, correction_bias, scoring_func, topk, 1, 1, V4_SCORINGS)):
        weights, ids = ops.moe_routing(gating_output, correction_bias, topk, 1, 1, renormalize,
                                       _scale(routed_scaling_factor, apply_routed_scaling_factor_on_output),
                                       scoring_func)
        if padded:
            _mask_padded_rows(weights, ids, num_token_non_padded)
        return weights, ids
    return original(hidden_states, gating_output, correction_bias, topk, renormalize, scoring_func,
                    num_fused_shared_experts, routed_scaling_factor, num_token_non_padded,
                    expert_location_dispatch_info, apply_routed_scaling_factor_on_output, **extras)


def _mask_padded_rows(weights, ids, num_token_non_padded):
    """Rows from num_token_non_padded (a device scalar) on: weight 0, id -1, in place."""
    padded = (torch.arange(ids.shape[0], device=ids.device) >= num_token_non_padded).unsqueeze(1)
    weights.masked_fill_(padded, 0.0)
    ids.masked_fill_(padded, -1)


def _hash_routes(router_logits, input_ids, tid2eid, scoring_func) -> bool:
    """Whether moe_routing's hash routing computes what SGLang's hash router does: a scoring
    both renormalize (sigmoid, sqrtsoftplus; SGLang leaves softmax's weights unnormalized) and
    a table [V, top_k] of int32 or int64 ids."""
    return (isinstance(tid2eid, torch.Tensor) and tid2eid.dim() == 2 and tid2eid.dtype in (torch.int32, torch.int64)
            and isinstance(input_ids, torch.Tensor) and input_ids.dim() == 1
            and input_ids.dtype in (torch.int32, torch.int64)
            and routes(router_logits, None, scoring_func, tid2eid.shape[1], 1, 1, V4_SCORINGS))


def _hash_routing(router_logits, input_ids, tid2eid, scoring_func):
    return ops.moe_routing(router_logits, None, tid2eid.shape[1], 1, 1, True, 1.0, scoring_func,
                           input_ids, tid2eid)


def fused_hash_topk(original, router_logits, input_ids, tid2eid, num_fused_shared_experts=0,
                    routed_scaling_factor=1.0, scoring_func="sqrtsoftplus"):
    """SGLang's fused hash router (DeepSeek-V4's hash-routed layers) on moe_routing where it
    appends no shared-expert slot: ids = tid2eid[input_ids], weights the scores there,
    renormalized (the scaling is HashTopK's, after this)."""
    if num_fused_shared_experts == 0 and _hash_routes(router_logits, input_ids, tid2eid, scoring_func):
        return _hash_routing(router_logits, input_ids, tid2eid, scoring_func)
    return original(router_logits, input_ids, tid2eid, num_fused_shared_experts, routed_scaling_factor, scoring_func)


def hash_topk_forward_torch(original, self, router_logits, input_ids):
    """HashTopK's torch path (where the fused kernel is off or absent) on moe_routing, where it
    appends no shared-expert slot."""
    if self.num_shared_topk_slots == 0 and _hash_routes(router_logits, input_ids, self.tid2eid, self.score_func):
        return _hash_routing(router_logits, input_ids, self.tid2eid, self.score_func)
    return original(self, router_logits, input_ids)


def _attn_res_served(prefix_sum, bank, nvb, score_proj, score_norm, out_norm, write_bank_row) -> bool:
    """Our kernel's inputs, on the CPU and sm_90 (SM100 runs SGLang's TMA kernel)."""
    if prefix_sum.device.type != "cpu" and not (prefix_sum.is_cuda and torch.cuda.get_device_capability(prefix_sum.device)
                                                == (9, 0)):
        return False
    weights = [getattr(score_proj, "weight", None), getattr(score_norm, "weight", None),
               getattr(out_norm, "weight", None)]
    h = prefix_sum.shape[-1] if prefix_sum.dim() == 2 else 0
    # sm_90's kernel on either device (the CPU's calls choose as the GPU's would).
    return (not write_bank_row and nvb >= 1 and not ops.attn_res_kernel_misfit(h, nvb, 90) and bank.dim() == 3
            and getattr(score_proj, "bias", None) is None
            and all(isinstance(w, torch.Tensor) and w.dtype == torch.bfloat16 for w in (prefix_sum, bank, *weights))
            and weights[0].numel() == h and weights[1].shape == weights[2].shape == (h,))


def attn_res_aggregate(original, prefix_sum, bank, nvb, score_proj, score_norm, out_norm, write_bank_row=False):
    """SGLang's Kimi-K3 aggregation (score, softmax over bank[:, :nvb] and the prefix, mix,
    output RMSNorm) on kimi.attn_res, which takes the same weights: the score norm's and
    projection's (SGLang multiplies them into one vector too) and the output norm's."""
    if _attn_res_served(prefix_sum, bank, nvb, score_proj, score_norm, out_norm, write_bank_row):
        return ops.attn_res(prefix_sum, None, bank, score_norm.weight, score_proj.weight.reshape(-1), out_norm.weight,
                            nvb, -1, float(score_norm.variance_epsilon), float(out_norm.variance_epsilon))
    return original(prefix_sum, bank, nvb, score_proj, score_norm, out_norm, write_bank_row)


# SGLang's module-level names that select_experts calls (it looks each up at call time).
_ROUTING = {"biased_grouped_topk": biased_grouped_topk, "grouped_topk": grouped_topk, "fused_topk": fused_topk,
            "biased_topk_jit_kernel_impl": biased_topk_jit_kernel_impl}
