"""vLLM plugin: vLLM's MoE router GEMM and routing on kimi_router_ops' ops.

    pip install "kimi_router_ops[vllm]"    # then vLLM loads the plugin in every process

vLLM calls `register()` through the `vllm.general_plugins` entry point before it builds a
model. What it replaces (each only where our op computes exactly what vLLM's code does;
anything else runs vLLM's own code):

- The router GEMM: `GateLinear` (vLLM's MoE gate layer, a PluggableLayer) is replaced
  through vLLM's out-of-tree layer registry by `KimiGateLinear`, whose forward is
  `router_gemm` for every M, in the gate's `out_dtype` (fp32 or bf16), for an unquantized
  gate outside batch-invariant mode: bf16 weights on bf16 input, or fp32 weights (the
  fp32 tiers: MiniMax-M2/M3, Hunyuan-v3, Step-3.5, ...; any shape) on bf16 or fp32 input,
  with the gate's bias added in the kernel where it has one.
- The routing: vLLM's `grouped_topk` (DeepSeek-V3 and V2 families, GroupedTopKRouter)
  becomes `moe_routing` where the scoring is sigmoid or softmax and vLLM's group score is
  ours: the sum of the two best with a bias (our sigmoid), the best without one (our
  softmax), or no group dropped; so does `fused_grouped_topk` (its CUDA kernel, which
  Kimi-K3's MegaMoE front calls beside the down-projection; the plugin rebinds the name
  the K3 model imported too); `fused_topk_bias` (routers with a bias and no groups:
  sigmoid for Kimi-K2/K3, GLM-4.5, ...; DeepSeek-V4's sqrtsoftplus, its hash-routed
  layers; FusedTopKBiasRouter) likewise. vLLM has no registry for these
  functions, so the plugin rebinds the module attributes its routers call; a vLLM without
  them is left alone (and the log says so).

- Kimi-K3's AttnRes on Hopper: vLLM's `attn_res` (a Triton kernel there, one CTA a token
  that releases the router only after its mix; its native kernel is SM100-only) becomes
  `kimi.attn_res` (a cluster a token, releasing the router at entry) on sm_90 and the CPU,
  for bf16 inputs of a hidden size and block count our kernel serves; the plugin rebinds the
  function in `vllm.models.kimi_k3.nvidia.ops` (when that package is first imported: it
  imports the whole model) and so the name its model module imports. On other GPUs, SM100
  included, vLLM's own function runs.

Everything around them stays vLLM's: tensor and expert parallelism, EPLB's expert mapping,
quantized experts, padding. Switches, read when the plugin loads: KIMI_ROUTER_OPS_VLLM=0
(nothing), KIMI_ROUTER_OPS_VLLM_GATE=0, KIMI_ROUTER_OPS_VLLM_ROUTING=0,
KIMI_ROUTER_OPS_VLLM_ATTN_RES=0. `import
kimi_router_ops` never imports vLLM; this module imports it inside `register()`.
"""

import importlib
import importlib.abc
import importlib.util
import logging
import os
import sys

import torch

from .. import ops
from ._engines import V4_SCORINGS, gate_served, routes

ENV_ALL, ENV_GATE, ENV_ROUTING = "KIMI_ROUTER_OPS_VLLM", "KIMI_ROUTER_OPS_VLLM_GATE", "KIMI_ROUTER_OPS_VLLM_ROUTING"
ENV_ATTN_RES = "KIMI_ROUTER_OPS_VLLM_ATTN_RES"
GATE_LAYER = "GateLinear"  # the key vLLM's PluggableLayer looks an out-of-tree class up by
ROUTING_MODULES = {
    "grouped_topk": "vllm.model_executor.layers.fused_moe.router.grouped_topk_router",
    "fused_grouped_topk": "vllm.model_executor.layers.fused_moe.router.grouped_topk_router",
    "fused_topk_bias": "vllm.model_executor.layers.fused_moe.router.fused_topk_bias_router",
}
# Modules that import a routing function by name (rebound too when loaded before register()):
# Kimi-K3's MegaMoE front routes its gate's logits with fused_grouped_topk beside the
# down-projection.
ROUTING_IMPORTERS = {"fused_grouped_topk": ("vllm.models.kimi_k3.nvidia.model",)}
# Kimi-K3's AttnRes: the function's module, and the model module that imported its name.
ATTN_RES_MODULES = ("vllm.models.kimi_k3.nvidia.ops", "vllm.models.kimi_k3.nvidia.model")
logger = logging.getLogger("vllm.kimi_router_ops")  # a child of vLLM's logger: vLLM's format
_originals: dict[str, object] = {}  # what register() replaced: name -> vLLM's own
_padding_mask = None  # vLLM's fused_topk_bias_router._get_padding_mask, kept by register()
_attn_res_on_cuda = False  # the GPUs are sm_90 (vLLM's platform says, without touching CUDA)


def _enabled(name: str) -> bool:
    return os.environ.get(name, "1") != "0"


def register() -> list[str]:
    """Install the replacements the switches allow; returns what was replaced. Safe to call
    more than once (vLLM loads plugins in every process, sometimes twice)."""
    if not _enabled(ENV_ALL):
        logger.info("kimi_router_ops: %s=0, vLLM's router left as it is", ENV_ALL)
        return []
    replaced = []
    if _enabled(ENV_GATE):
        from vllm.model_executor.custom_op import PluggableLayer, op_registry_oot

        if GATE_LAYER not in op_registry_oot:
            PluggableLayer.register_oot(_gate_class(), name=GATE_LAYER)
        if op_registry_oot[GATE_LAYER] is _gate_class():
            replaced.append(f"{GATE_LAYER} (router GEMM: router_gemm, bf16 and fp32 gates)")
    if _enabled(ENV_ROUTING):
        for name, module_name in ROUTING_MODULES.items():
            module = importlib.import_module(module_name)
            current = getattr(module, name, None)
            if current is None:
                logger.warning("kimi_router_ops: this vLLM has no %s.%s; not replaced", module_name, name)
                continue
            if name not in _originals:
                _originals[name] = current
                setattr(module, name, _ROUTING[name])
                for importer in map(sys.modules.get, ROUTING_IMPORTERS.get(name, ())):
                    if getattr(importer, name, None) is current:
                        setattr(importer, name, _ROUTING[name])
            if name == "fused_topk_bias":
                global _padding_mask
                _padding_mask = module._get_padding_mask
            replaced.append(f"{name} (routing: moe_routing)")
    if _enabled(ENV_ATTN_RES):
        replaced += _register_attn_res()
    logger.info("kimi_router_ops: replaced %s", ", ".join(replaced) or "nothing")
    return replaced


def unregister() -> None:
    """Put vLLM's own gate layer and routing functions back."""
    from vllm.model_executor.custom_op import op_registry_oot

    if op_registry_oot.get(GATE_LAYER) is _gate_class():
        del op_registry_oot[GATE_LAYER]
    if _ATTN_RES_HOOK in sys.meta_path:
        sys.meta_path.remove(_ATTN_RES_HOOK)
    for module_name in ATTN_RES_MODULES:
        module = sys.modules.get(module_name)
        if module is not None and getattr(module, "attn_res", None) is attn_res:
            module.attn_res = _originals["attn_res"]
    _originals.pop("attn_res", None)
    for name, original in list(_originals.items()):
        setattr(importlib.import_module(ROUTING_MODULES[name]), name, original)
        for importer in map(sys.modules.get, ROUTING_IMPORTERS.get(name, ())):
            if getattr(importer, name, None) is _ROUTING[name]:
                setattr(importer, name, original)
        del _originals[name]


def _register_attn_res() -> list[str]:
    """Rebind vLLM's Kimi-K3 attn_res in its ops package, and in the model module that
    imported the name if it is loaded already. Importing the package imports the whole K3
    model (seconds), so where it is not loaded yet a hook rebinds it the moment it is: the
    model module, imported after it, then imports ours."""
    global _attn_res_on_cuda
    from vllm.platforms import current_platform

    _attn_res_on_cuda = current_platform.is_cuda() and current_platform.is_device_capability(90)
    if ATTN_RES_MODULES[0] in sys.modules:
        _rebind_attn_res()
    elif _ATTN_RES_HOOK not in sys.meta_path:
        sys.meta_path.insert(0, _ATTN_RES_HOOK)
    return ["Kimi-K3 attn_res (kimi.attn_res on sm_90)"]


def _rebind_attn_res() -> None:
    for module_name in ATTN_RES_MODULES:
        module = sys.modules.get(module_name)
        # (The model module may be half-run, before its import of the name: it imports ours.)
        if getattr(module, "attn_res", attn_res) is not attn_res:
            _originals.setdefault("attn_res", module.attn_res)
            module.attn_res = attn_res


class _AttnResHook(importlib.abc.MetaPathFinder):
    """Finds vLLM's Kimi-K3 ops package as the other finders do, and rebinds its attn_res
    once the package has run."""

    def find_spec(self, fullname, path, target=None):
        if fullname != ATTN_RES_MODULES[0]:
            return None
        sys.meta_path.remove(self)  # once, and not for our own lookup below
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                _rebind_attn_res()

            spec.loader.exec_module = exec_module
        return spec


_ATTN_RES_HOOK = _AttnResHook()


_GATE_CLASS = None


def _gate_class():
    """KimiGateLinear, made on first use (it subclasses vLLM's GateLinear)."""
    global _GATE_CLASS
    if _GATE_CLASS is None:
        from vllm import envs
        from vllm.model_executor.layers.fused_moe.router.gate_linear import GateLinear

        class KimiGateLinear(GateLinear):
            """vLLM's GateLinear with `router_gemm` as its GEMM wherever the gate is a plain
            bf16 or fp32 matrix: the same logits (fp32 sums of the exact products; fp32
            weights never rounded) in the dtype vLLM asks for (fp32 for an fp32 gate that
            names none), for every M. The test needs no token count, so a compiled graph
            keeps no Python branch on M."""

            def forward(self, x: torch.Tensor):
                w, bias = self.weight, self.bias
                out_dtype = self.out_dtype or (torch.bfloat16 if w.dtype == torch.bfloat16 else torch.float32)
                if (self.is_unquantized and not envs.VLLM_BATCH_INVARIANT
                        and (bias is None or not self.skip_bias_add) and gate_served(x, w, out_dtype, bias)):
                    return self._return(ops.router_gemm(x, w, bias, out_dtype))
                return super().forward(x)

        _GATE_CLASS = KimiGateLinear
    return _GATE_CLASS


def _grouped_routing(gating_output, bias, topk, renormalize, num_expert_group, topk_group, scoring_func,
                     routed_scaling_factor):
    """moe_routing's (weights, ids) where it computes vLLM's grouped top-k, else None."""
    n_group, kept = num_expert_group or 1, topk_group or num_expert_group or 1
    if routes(gating_output, bias, scoring_func, topk, n_group, kept):
        return ops.moe_routing(gating_output, bias, topk, n_group, kept, renormalize, routed_scaling_factor,
                               scoring_func)
    return None


def grouped_topk(hidden_states, gating_output, topk, renormalize, num_expert_group=0, topk_group=0,
                 scoring_func="softmax", routed_scaling_factor=1.0, e_score_correction_bias=None):
    """vLLM's grouped_topk (its signature; weights fp32, ids int32) on moe_routing."""
    args = (topk, renormalize, num_expert_group, topk_group, scoring_func, routed_scaling_factor)
    return _grouped_routing(gating_output, e_score_correction_bias, *args) or _originals["grouped_topk"](
        hidden_states, gating_output, topk, renormalize, num_expert_group, topk_group, scoring_func,
        routed_scaling_factor, e_score_correction_bias)


def fused_grouped_topk(hidden_states, gating_output, topk, renormalize, e_score_correction_bias,
                       num_expert_group=0, topk_group=0, scoring_func="softmax", routed_scaling_factor=1.0):
    """vLLM's fused_grouped_topk (its signature: its CUDA grouped_topk kernel, which
    grouped_topk calls on CUDA and Kimi-K3's MegaMoE front calls directly) on moe_routing."""
    args = (topk, renormalize, num_expert_group, topk_group, scoring_func, routed_scaling_factor)
    return _grouped_routing(gating_output, e_score_correction_bias, *args) or _originals["fused_grouped_topk"](
        hidden_states, gating_output, *args[:2], e_score_correction_bias, *args[2:])


def fused_topk_bias(hidden_states, gating_output, scoring_func, e_score_correction_bias, topk, renormalize,
                    indices_type=None, input_tokens=None, hash_indices_table=None, routed_scaling_factor=1.0,
                    bias_vl=None, image_sentinel_lo=0):
    """vLLM's fused_topk_bias (its signature) on moe_routing, for sigmoid routers and
    DeepSeek-V4's sqrtsoftplus ones, its hash-routed layers included (ids from
    hash_indices_table[input_tokens]), with no image routing and no padding rows to mask
    (vLLM's kernel masks them when VLLM_MOE_SKIP_PADDING is on); int64 ids (indices_type,
    DeepSeek-V4's MegaMoE) written by moe_routing_out, no conversion after."""
    # Without a table (or image routing) vLLM's result does not depend on input_tokens; its
    # sigmoid kernel ignores a table, its sqrtsoftplus one routes by it.
    hashed = hash_indices_table is not None
    served = not hashed or (input_tokens is not None and scoring_func == "sqrtsoftplus")
    if served and bias_vl is None \
            and indices_type in (None, torch.int32, torch.int64) and _padding_mask(gating_output.shape[0]) is None \
            and routes(gating_output, e_score_correction_bias, scoring_func, topk, 1, 1,
                       scorings=V4_SCORINGS):
        args = (gating_output, e_score_correction_bias, topk, 1, 1, renormalize, routed_scaling_factor,
                scoring_func, input_tokens if hashed else None, hash_indices_table)
        if indices_type == torch.int64:
            m = gating_output.shape[0]
            return ops.moe_routing_out(*args, topk_weights=gating_output.new_empty((m, topk), dtype=torch.float32),
                                       topk_ids=gating_output.new_empty((m, topk), dtype=torch.int64))
        return ops.moe_routing(*args)
    return _originals["fused_topk_bias"](
        hidden_states, gating_output, scoring_func, e_score_correction_bias, topk, renormalize,
        indices_type=indices_type, input_tokens=input_tokens, hash_indices_table=hash_indices_table,
        routed_scaling_factor=routed_scaling_factor, bias_vl=bias_vl, image_sentinel_lo=image_sentinel_lo)


_ROUTING = {"grouped_topk": grouped_topk, "fused_grouped_topk": fused_grouped_topk,
            "fused_topk_bias": fused_topk_bias}


def _attn_res_served(prefix, delta, blocks, norm_weight, qk_weight, output_norm_weight, num_blocks) -> bool:
    """Our op on the CPU and sm_90 for the inputs our kernel serves; vLLM's own elsewhere
    (its native op on SM100, its Triton kernel on other GPUs)."""
    if prefix.device.type != "cpu" and not (prefix.is_cuda and _attn_res_on_cuda):
        return False
    tensors = [t for t in (prefix, delta, blocks, norm_weight, qk_weight, output_norm_weight) if t is not None]
    h = prefix.shape[-1]
    # sm_90's kernel on either device (the CPU's calls choose as the GPU's would).
    return (all(t.dtype == torch.bfloat16 for t in tensors) and prefix.dim() == 2 and blocks.dim() == 3
            and not ops.attn_res_kernel_misfit(h, num_blocks, 90))


def attn_res(prefix, delta, blocks, norm_weight, qk_weight, output_norm_weight, num_blocks, block_write_idx,
             eps, output_norm_eps):
    """vLLM's Kimi-K3 attn_res (its signature and semantics) on kimi.attn_res."""
    if _attn_res_served(prefix, delta, blocks, norm_weight, qk_weight, output_norm_weight, num_blocks):
        return ops.attn_res(prefix, delta, blocks, norm_weight, qk_weight, output_norm_weight, num_blocks,
                            block_write_idx, eps, output_norm_eps)
    return _originals["attn_res"](prefix, delta, blocks, norm_weight, qk_weight, output_norm_weight, num_blocks,
                                  block_write_idx, eps, output_norm_eps)
