"""Hugging Face transformers models on the router ops, with one call.

    import kimi_router_ops
    kimi_router_ops.integrations.transformers.patch(model)    # every supported router now
                                                              # runs kimi_router_ops' ops
    kimi_router_ops.integrations.transformers.unpatch(model)  # back to transformers' forward

(`from kimi_router_ops.integrations.transformers import patch` works too; importing the
module as `transformers` would shadow Hugging Face's package.) `patch` logs one line on the
`kimi_router_ops` logger and warns when the model has no router it supports; a patched
router's repr ends in "kimi_router_ops".

Each patched forward computes what transformers' forward computes, with the same outputs
(the same tuple, dtypes and logits), in one or two launches instead of a dozen ops:

- Sigmoid routers of the DeepSeek-V3 family (DeepseekV3TopkRouter and the routers that
  share its forward: Kimi-K2/K2.5, GLM-4.5, dots.llm1, ...): fp32 logits on an upcast copy
  of the bf16 weight, sigmoid, score-correction bias, grouped top-k. `ll_bf16_router`.
- DeepSeek-V2 (DeepseekV2TopkRouter and its twins): fp32 logits, softmax, greedy or
  group-limited greedy top-k, no renormalization, routed_scaling_factor.
  `ll_bf16_router(scoring="softmax")`.
- Qwen-MoE, OLMoE, Mixtral, MiniMax and gpt-oss routers: their gate computes the logits in
  the model's dtype (bf16), and they route on those rounded logits (gpt-oss on top of its
  gate's bias). `router_gemm` with bf16 out (the gate's bias added in the same kernel), then
  `moe_routing(scoring="softmax")` on the bf16 logits: the fused router, which routes on
  fp32 logits, could pick differently where two logits round to one bf16 value.
- fp32 gates: the DeepSeek-V3 and V2 families and Hunyuan-v3 (HYV3TopKRouter) with an fp32
  router weight, Ernie-4.5-MoE (its gate is kept in fp32: softmax, the statics' bias for the
  choice, renormalized) and MiniMax-M2 (sigmoid, the bias for the choice; an fp32 gate in one
  launch, a bf16 one on its bf16 logits): `router` on the fp32 weights, never rounded.

A patched router falls back to transformers' forward when a gradient is wanted (the ops
have none: run inference under `torch.no_grad()` or `torch.inference_mode()`), when the
model is not in bf16 (the ops take bf16 inputs, and casting an fp32 model's inputs would
change its numbers; fp32 gates and fp32 models of the fp32-gate families run on the
fp32-weight kernels), and for a DeepSeek-V2 topk_method it does not know; it says so with a
`RuntimeWarning` (shown once per router class and reason), and `patch` warns at once about
routers whose weights are not bf16.

The router is patched by swapping its class for a subclass that overrides `forward` (so
`isinstance`, hooks, output recording, state dicts and `torch.compile` see the same module);
nothing here imports transformers, which stays an optional dependency (tested: 5.23, whose
routers of one family share one forward, word for word).
"""

import logging
import warnings

import torch
from torch import nn

from .. import ops

_log = logging.getLogger("kimi_router_ops")

SOFTMAX = "softmax"


def _sigmoid_grouped(self, hidden_states):
    """DeepseekV3TopkRouter.forward: (router_logits fp32, topk_weights fp32, topk_indices)."""
    weights, ids, logits = ops.router(
        hidden_states.reshape(-1, self.hidden_dim), self.weight, self.e_score_correction_bias,
        self.top_k, self.num_group, self.topk_group, bool(self.norm_topk_prob),
        float(self.routed_scaling_factor),
    )
    return logits, weights, ids.long()


def _deepseek_v2(self, hidden_states):
    """DeepseekV2TopkRouter.forward: (router_logits fp32, topk_weights fp32, topk_indices)."""
    groups = (self.num_group, self.topk_group) if self.topk_method == "group_limited_greedy" else (1, 1)
    weights, ids, logits = ops.router(
        hidden_states.reshape(-1, self.hidden_dim), self.weight, None, self.top_k, *groups, False,
        float(self.routed_scaling_factor), SOFTMAX,
    )
    return logits, weights, ids.long()


def _hy_v3(self, hidden_states, e_score_correction_bias):
    """HYV3TopKRouter.forward (Hunyuan-v3): fp32 logits, sigmoid, the bias for the choice,
    renormalized and scaled: (router_logits fp32, weights fp32, indices)."""
    weights, ids, logits = ops.router(
        hidden_states.reshape(-1, self.hidden_dim), self.weight, e_score_correction_bias, self.top_k,
        routed_scaling_factor=float(self.router_scaling_factor),
    )
    return logits, weights, ids.long()


def _minimax_m2(self, hidden_states, e_score_correction_bias):
    """MiniMaxM2TopKRouter.forward: logits in the gate's dtype (the tokens cast to it), sigmoid
    of those, the bias for the choice, renormalized: (router_logits, weights fp32, indices).
    An fp32 gate is one launch; a bf16 gate routes on its bf16 logits, as transformers does."""
    x = hidden_states.reshape(-1, self.hidden_dim)
    if self.weight.dtype == torch.float32:
        weights, ids, logits = ops.router(x, self.weight, e_score_correction_bias, self.top_k)
    else:
        logits = ops.router_gemm(x, self.weight, out_dtype=self.weight.dtype)
        weights, ids = ops.moe_routing(logits, e_score_correction_bias, self.top_k)
    return logits, weights, ids.long()


def _ernie4_5_moe(self, hidden_states):
    """Ernie4_5_MoeTopKRouter.forward: fp32 logits on its fp32 gate, softmax, the statics'
    bias for the choice, renormalized: (router_logits fp32, weights in the tokens' dtype,
    indices)."""
    weights, ids, logits = ops.router(
        hidden_states, self.weight, self.moe_statics.e_score_correction_bias.reshape(-1), self.top_k,
        scoring=SOFTMAX,
    )
    return logits, weights.to(hidden_states.dtype), ids.long()


def _softmax_on_gate_logits(self, hidden_states, renormalize, weights_dtype=None, gate_bias=None):
    """Routers that softmax their gate's logits in the model's dtype: (router_logits,
    router_scores in `weights_dtype` or the logits' dtype, router_indices)."""
    x = hidden_states.reshape(-1, self.hidden_dim)
    # Rounded once, after the bias, as a linear layer with a bias rounds.
    logits = ops.router_gemm(x, self.weight, gate_bias, out_dtype=x.dtype)
    weights, ids = ops.moe_routing(logits, None, self.top_k, renormalize=renormalize, scoring=SOFTMAX)
    return logits, weights.to(weights_dtype or logits.dtype), ids.long()


def _qwen_moe(self, hidden_states):  # Qwen3MoeTopKRouter: renormalized if norm_topk_prob
    return _softmax_on_gate_logits(self, hidden_states, bool(self.norm_topk_prob))


def _qwen3_5_moe(self, hidden_states):  # Qwen3_5MoeTopKRouter: always renormalized
    return _softmax_on_gate_logits(self, hidden_states, True)


def _mixtral(self, hidden_states):  # MixtralTopKRouter: renormalized, fp32 weights
    return _softmax_on_gate_logits(self, hidden_states, True, torch.float32)


def _gpt_oss(self, hidden_states):  # GptOssTopKRouter: softmax over the top-k logits
    return _softmax_on_gate_logits(self, hidden_states, True, gate_bias=self.bias)


# Router class -> (patched forward, the attributes it reads). In transformers 5.23 the classes
# of one entry share their forward word for word.
_FAMILIES = (
    (_sigmoid_grouped, ("weight", "e_score_correction_bias", "top_k", "num_group", "topk_group",
                        "norm_topk_prob", "routed_scaling_factor", "hidden_dim"),
     ("DeepseekV3TopkRouter", "DeepseekV32TopkRouter", "KimiLinearTopkRouter", "Glm4MoeTopkRouter",
      "Glm4MoeLiteTopkRouter", "Glm4vMoeTextTopkRouter", "GlmMoeDsaTopkRouter", "Dots1TopkRouter",
      "ExaoneMoeTopkRouter", "SolarOpenTopkRouter", "MiMoV2FlashTopkRouter", "NemotronHTopkRouter")),
    (_deepseek_v2, ("weight", "top_k", "num_group", "topk_group", "topk_method",
                    "routed_scaling_factor", "hidden_dim"),
     ("DeepseekV2TopkRouter", "DeepseekOcr2TextTopkRouter")),
    (_qwen_moe, ("weight", "top_k", "norm_topk_prob", "hidden_dim"),
     ("Qwen3MoeTopKRouter", "Qwen2MoeTopKRouter", "Qwen3NextTopKRouter", "OlmoeTopKRouter",
      "FlexOlmoTopKRouter", "Qwen3OmniMoeThinkerTextTopKRouter")),
    (_qwen3_5_moe, ("weight", "top_k", "hidden_dim"),
     ("Qwen3_5MoeTopKRouter", "Qwen3VLMoeTextTopKRouter", "Qwen3OmniMoeTextTopKRouter")),
    (_mixtral, ("weight", "top_k", "hidden_dim"), ("MixtralTopKRouter", "MiniMaxTopKRouter")),
    (_gpt_oss, ("weight", "bias", "top_k", "hidden_dim"), ("GptOssTopKRouter",)),
    (_hy_v3, ("weight", "top_k", "router_scaling_factor", "hidden_dim"), ("HYV3TopKRouter",)),
    (_minimax_m2, ("weight", "top_k", "hidden_dim"), ("MiniMaxM2TopKRouter",)),
    (_ernie4_5_moe, ("weight", "moe_statics", "top_k"), ("Ernie4_5_MoeTopKRouter",)),
)
ROUTERS = {name: (forward, attributes) for forward, attributes, names in _FAMILIES for name in names}
ROUTER_CLASSES = tuple(ROUTERS)
_patched_classes: dict[type, type] = {}


# Routers whose gate multiplies in fp32 (F.linear(x.float(), w.float())): an fp32 gate and
# bf16 tokens are our fp32-weight kernels' problem exactly.
_FP32_GATES = (_sigmoid_grouped, _deepseek_v2, _hy_v3, _minimax_m2, _ernie4_5_moe)


def _dtype_fallback(forward, weight_dtype, x_dtype):
    """Why the ops cannot take these dtypes for this family (None: they can)."""
    if weight_dtype == x_dtype == torch.bfloat16:
        return None
    if forward in _FP32_GATES and weight_dtype == torch.float32 and x_dtype in (torch.bfloat16, torch.float32):
        return None
    return (f"the ops take bf16 weights and inputs{' or an fp32 gate' if forward in _FP32_GATES else ''}, got "
            f"{weight_dtype} and {x_dtype} (load the model in torch.bfloat16)")


def _fallback_reason(router, hidden_states: torch.Tensor):
    """Why a patched router runs transformers' forward (None: it runs ours)."""
    forward, _ = ROUTERS[router._kimi_original_class.__name__]
    if torch.is_grad_enabled() and (router.weight.requires_grad or hidden_states.requires_grad):
        return ("gradients are enabled and the ops have no derivative (run inference under "
                "torch.no_grad() or torch.inference_mode())")
    reason = _dtype_fallback(forward, router.weight.dtype, hidden_states.dtype)
    if reason is not None:
        return reason
    if forward is _deepseek_v2 and router.topk_method not in ("greedy", "group_limited_greedy"):
        return f"topk_method {router.topk_method!r} is not one the ops compute"
    if forward is _ernie4_5_moe and router.moe_statics.e_score_correction_bias.shape[0] != 1:
        return "more than one group of expert statistics (Ernie-4.5-VL) is not one the ops compute"
    return None


def _warn_fallback(router_class: type, reason: str) -> None:
    # One message per class and reason: Python's default filter shows it once, not per layer.
    warnings.warn(f"kimi_router_ops: patched {router_class.__name__} routers run transformers' forward: {reason}",
                  RuntimeWarning, stacklevel=3)


def _router_forward(self, hidden_states: torch.Tensor, *args):
    reason = _fallback_reason(self, hidden_states)
    if reason is not None:
        _warn_fallback(self._kimi_original_class, reason)
        return self._kimi_original_class.forward(self, hidden_states, *args)
    return ROUTERS[self._kimi_original_class.__name__][0](self, hidden_states, *args)


def _is_router(module: nn.Module) -> bool:
    cls = type(module)
    return cls.__name__ in ROUTER_CLASSES and cls.__module__.startswith("transformers.")


def _patched_extra_repr(self) -> str:
    original = self._kimi_original_class.extra_repr(self)
    return f"{original}, kimi_router_ops" if original else "kimi_router_ops"


def _patched_class(cls: type) -> type:
    if cls not in _patched_classes:
        _patched_classes[cls] = type(
            cls.__name__, (cls,),
            {"forward": _router_forward, "_kimi_original_class": cls, "__module__": __name__,
             "extra_repr": _patched_extra_repr},
        )
    return _patched_classes[cls]


def patch(model: nn.Module) -> int:
    """Route every router of ROUTER_CLASSES in `model` through kimi_router_ops' ops; returns
    how many routers were patched (already patched ones are left as they are). Warns about
    routers whose weights are not bf16: those will run transformers' forward."""
    count = 0
    for name, module in model.named_modules():
        if not _is_router(module):
            continue
        missing = [a for a in ROUTERS[type(module).__name__][1] if not hasattr(module, a)]
        if missing:
            raise TypeError(
                f"{name}: this {type(module).__name__} lacks {missing}; kimi_router_ops supports "
                "the transformers 5.x router (tested with 5.23)"
            )
        forward = ROUTERS[type(module).__name__][0]
        if module.weight.dtype != torch.bfloat16 and not (forward in _FP32_GATES and module.weight.dtype == torch.float32):
            _warn_fallback(type(module), _dtype_fallback(forward, module.weight.dtype, module.weight.dtype))
        module.__class__ = _patched_class(type(module))
        count += 1
    if count:
        _log.info("kimi_router_ops: %d routers of %s run kimi_router_ops' ops", count,
                  type(model).__name__)
    elif not any(getattr(type(m), "_kimi_original_class", None) for m in model.modules()):
        warnings.warn(f"kimi_router_ops.integrations.transformers.patch: no router of a supported family in "
                      f"{type(model).__name__} (supported: {', '.join(sorted(ROUTERS))}); nothing changed",
                      RuntimeWarning, stacklevel=2)
    return count


def unpatch(model: nn.Module) -> int:
    """Undo `patch`; returns how many routers were restored."""
    count = 0
    for module in model.modules():
        original = getattr(type(module), "_kimi_original_class", None)
        if original is not None:
            module.__class__ = original
            count += 1
    return count
