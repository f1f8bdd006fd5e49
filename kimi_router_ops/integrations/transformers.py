"""Hugging Face transformers models on the router op, with one call.

    from kimi_router_ops.integrations import transformers as kimi_tf
    kimi_tf.patch(model)    # every DeepseekV3TopkRouter now runs kimi_router_ops.ll_bf16_router
    kimi_tf.unpatch(model)  # back to transformers' own forward

DeepseekV3TopkRouter (DeepSeek-V3, Kimi-K2, and Kimi-K2.5's text model, which is built on
it) computes its logits with `F.linear` in fp32 on an upcast copy of the bf16 weight, then
a dozen torch ops of routing; `ll_bf16_router` computes the same three outputs in one op
(the same formula, fp32 sums of the exact bf16 products). A patched router falls back to
transformers' forward when a gradient is wanted (the op has none: run inference under
`torch.no_grad()` or `torch.inference_mode()`) and when the model is not in bf16 (the op
takes bf16 inputs, and casting an fp32 model's inputs would change its numbers).

The router is patched by swapping its class for a subclass that overrides `forward` (so
`isinstance`, hooks, output recording, state dicts and `torch.compile` see the same module);
nothing here imports transformers, which stays an optional dependency (tested: 5.23).
"""

import torch
from torch import nn

from .. import ops

ROUTER_CLASSES = ("DeepseekV3TopkRouter",)
# What forward reads from the router module (transformers 5.x attribute names).
_ATTRIBUTES = ("weight", "e_score_correction_bias", "top_k", "num_group", "topk_group",
               "norm_topk_prob", "routed_scaling_factor", "hidden_dim")
_patched_classes: dict[type, type] = {}


def _router_forward(self, hidden_states: torch.Tensor):
    needs_grad = torch.is_grad_enabled() and (self.weight.requires_grad or hidden_states.requires_grad)
    if needs_grad or self.weight.dtype != torch.bfloat16 or hidden_states.dtype != torch.bfloat16:
        # Training (the op has no derivative) or a model not in bf16: transformers' forward.
        return self._kimi_original_class.forward(self, hidden_states)
    weights, ids, logits = ops.ll_bf16_router(
        hidden_states.reshape(-1, self.hidden_dim),
        self.weight,
        self.e_score_correction_bias,
        self.top_k,
        self.num_group,
        self.topk_group,
        bool(self.norm_topk_prob),
        float(self.routed_scaling_factor),
    )
    # transformers returns (router_logits, topk_weights, topk_indices), indices as int64.
    return logits, weights, ids.long()


def _is_router(module: nn.Module) -> bool:
    cls = type(module)
    return cls.__name__ in ROUTER_CLASSES and cls.__module__.startswith("transformers.")


def _patched_class(cls: type) -> type:
    if cls not in _patched_classes:
        _patched_classes[cls] = type(
            cls.__name__, (cls,),
            {"forward": _router_forward, "_kimi_original_class": cls, "__module__": __name__},
        )
    return _patched_classes[cls]


def patch(model: nn.Module) -> int:
    """Route every DeepseekV3TopkRouter in `model` through `ll_bf16_router`; returns how
    many routers were patched (already patched ones are left as they are)."""
    count = 0
    for name, module in model.named_modules():
        if not _is_router(module):
            continue
        missing = [a for a in _ATTRIBUTES if not hasattr(module, a)]
        if missing:
            raise TypeError(
                f"{name}: this {type(module).__name__} lacks {missing}; kimi_router_ops supports "
                "the transformers 5.x router (tested with 5.23)"
            )
        module.__class__ = _patched_class(type(module))
        count += 1
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
