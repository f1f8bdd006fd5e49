"""kimi_router_ops.integrations.transformers on tiny random-weight models of every router
family it patches beyond DeepSeek-V3 (test_transformers_integration.py): the same router
outputs as transformers' own forward and the same greedy tokens."""

import inspect

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed (optional extra)")

from kimi_router_ops.integrations import transformers as kimi_tf  # noqa: E402
from kimi_router_ops.testing import near_tie  # noqa: E402
from conftest import HAS_CUDA  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
COMMON = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
              pad_token_id=0, eos_token_id=1, bos_token_id=0)
# family: (config class, model class, router class, extra config)
FAMILIES = {
    "qwen3-moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", "Qwen3MoeTopKRouter",
                  dict(num_experts=64, num_experts_per_tok=8, moe_intermediate_size=64, norm_topk_prob=True,
                       head_dim=64)),
    "qwen2-moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", "Qwen2MoeTopKRouter",
                  dict(num_experts=60, num_experts_per_tok=4, moe_intermediate_size=64, norm_topk_prob=False,
                       shared_expert_intermediate_size=128)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", "MixtralTopKRouter",
                dict(num_local_experts=8, num_experts_per_tok=2)),
    "gpt-oss": ("GptOssConfig", "GptOssForCausalLM", "GptOssTopKRouter",
                dict(num_local_experts=32, num_experts_per_tok=4, head_dim=64, layer_types=["full_attention"] * 2)),
    "deepseek-v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM", "DeepseekV2TopkRouter",
                    dict(n_routed_experts=64, num_experts_per_tok=6, n_group=8, topk_group=3,
                         topk_method="group_limited_greedy", routed_scaling_factor=16.0, moe_intermediate_size=64,
                         n_shared_experts=1, first_k_dense_replace=0, kv_lora_rank=32, q_lora_rank=64,
                         qk_rope_head_dim=16, v_head_dim=32, qk_nope_head_dim=32)),
    "deepseek-v2-lite": ("DeepseekV2Config", "DeepseekV2ForCausalLM", "DeepseekV2TopkRouter",
                         dict(n_routed_experts=64, num_experts_per_tok=6, n_group=1, topk_group=1,
                              topk_method="greedy", routed_scaling_factor=1.0, moe_intermediate_size=64,
                              n_shared_experts=2, first_k_dense_replace=0, kv_lora_rank=32, q_lora_rank=None,
                              qk_rope_head_dim=16, v_head_dim=32, qk_nope_head_dim=32)),
    "glm4-moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM", "Glm4MoeTopkRouter",
                 dict(n_routed_experts=64, num_experts_per_tok=6, n_group=4, topk_group=2, moe_intermediate_size=64,
                      routed_scaling_factor=2.5, first_k_dense_replace=0, n_shared_experts=1, head_dim=64)),
    # fp32 gates (the router weight kept in fp32, as Ernie-4.5's checkpoints load it).
    "ernie4.5-moe": ("Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM", "Ernie4_5_MoeTopKRouter",
                     dict(num_experts=32, num_experts_per_tok=4, moe_intermediate_size=64, moe_layer_start_index=0)),
    "minimax-m2": ("MiniMaxM2Config", "MiniMaxM2ForCausalLM", "MiniMaxM2TopKRouter",
                   dict(num_local_experts=32, num_experts_per_tok=4, head_dim=64)),
    "minimax-m2-fp32-gate": ("MiniMaxM2Config", "MiniMaxM2ForCausalLM", "MiniMaxM2TopKRouter",
                             dict(num_local_experts=32, num_experts_per_tok=4, head_dim=64)),
    "hy-v3-fp32-gate": ("HYV3Config", "HYV3ForCausalLM", "HYV3TopKRouter",
                        dict(num_experts=32, num_local_experts=32, num_experts_per_tok=4, moe_intermediate_size=64,
                             head_dim=64, mlp_layer_types=["sparse", "sparse"], router_scaling_factor=2.5)),
}
FP32_GATES = ("ernie4.5-moe", "minimax-m2-fp32-gate", "hy-v3-fp32-gate")
# Routers that take the score-correction bias as an argument (it lives in their MoE block).
BIAS_ARGUMENT = ("minimax-m2", "minimax-m2-fp32-gate", "hy-v3-fp32-gate")


def call_router(router, hidden, family):
    if family in BIAS_ARGUMENT:
        bias = torch.linspace(-0.05, 0.05, router.weight.shape[0], device=hidden.device)
        return router(hidden, bias)
    return router(hidden)


def tiny_model(family, device="cpu", seed=0):
    config_class, model_class, router_class, extra = FAMILIES[family]
    torch.manual_seed(seed)
    config = getattr(transformers, config_class)(**COMMON, **extra)
    model = getattr(transformers, model_class)(config)
    with torch.no_grad():
        for module in routers(model, router_class):
            module.weight.normal_(0, 0.05)
            if getattr(module, "e_score_correction_bias", None) is not None:
                module.e_score_correction_bias.uniform_(-0.05, 0.05)
            if family == "gpt-oss":
                module.bias.uniform_(-0.1, 0.1)
            if family == "ernie4.5-moe":
                module.moe_statics.e_score_correction_bias.uniform_(-0.05, 0.05)
    model = model.to(device=device, dtype=torch.bfloat16).eval()
    if family in FP32_GATES:
        for module in routers(model, router_class):
            module.weight.data = module.weight.data.float()
            if family == "ernie4.5-moe":
                module.moe_statics.e_score_correction_bias.data = module.moe_statics.e_score_correction_bias.data.float()
    return model


def routers(model, router_class):
    return [m for m in model.modules() if type(m).__name__ == router_class]


def same_routing(before, after, family):
    """The same outputs: logits and weights in the original dtypes, the logits within fp32
    rounding (or one bf16 ulp: the two sums may round apart), the same expert sets unless transformers' values tie at the
    cut (there either choice is transformers' formula), the same weights by expert."""
    logits0, weights0, ids0 = before
    logits1, weights1, ids1 = after
    assert (logits1.dtype, weights1.dtype, ids1.dtype) == (logits0.dtype, weights0.dtype, ids0.dtype)
    assert logits1.shape == logits0.shape and weights1.shape == weights0.shape
    if logits0.dtype == torch.bfloat16:
        torch.testing.assert_close(logits1.float(), logits0.float(), rtol=2 ** -7, atol=1e-6)
    else:
        torch.testing.assert_close(logits1, logits0, rtol=1e-5, atol=1e-6)
    bf16_weights = weights0.dtype == torch.bfloat16
    compared = 0
    for t in range(ids0.shape[0]):
        if set(ids1[t].tolist()) != set(ids0[t].tolist()):
            # A tie at the cut in the values transformers chose on (gpt-oss: its bf16 logits).
            chosen_on = logits0[t].float() if family == "gpt-oss" else logits0[t].float().softmax(-1)
            assert near_tie(chosen_on, ids0.shape[1]) or logits0.dtype == torch.bfloat16 and near_tie(
                logits0[t].float(), ids0.shape[1]), t
            continue
        order0, order1 = ids0[t].argsort(), ids1[t].argsort()
        torch.testing.assert_close(weights1[t][order1].float(), weights0[t][order0].float(),
                                   rtol=2 ** -8 if bf16_weights else 1e-5, atol=1e-7)
        compared += 1
    assert compared >= 0.75 * ids0.shape[0]


@pytest.fixture
def op_calls(monkeypatch):
    """Counts the calls that reach the ops (so a silent fallback cannot pass)."""
    calls = []
    for name in ("router", "moe_routing"):
        original = getattr(kimi_tf.ops, name)

        def counting(*args, _original=original, **kwargs):
            calls.append(args[0].shape[0])  # tokens
            return _original(*args, **kwargs)

        monkeypatch.setattr(kimi_tf.ops, name, counting)
    return calls


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", list(FAMILIES))
@torch.no_grad()
def test_patched_routers_give_the_same_outputs(device, family, op_calls):
    model = tiny_model(family, device)
    router_class = FAMILIES[family][2]
    hidden = torch.randn(40, 256, device=device).to(torch.bfloat16)
    before = [call_router(r, hidden, family) for r in routers(model, router_class)]
    assert kimi_tf.patch(model) == 2
    after = [call_router(r, hidden, family) for r in routers(model, router_class)]
    assert op_calls == [40, 40]
    for b, a in zip(before, after):
        same_routing(b, a, family)
    assert kimi_tf.unpatch(model) == 2
    assert all(type(r).__module__.startswith("transformers.") for r in routers(model, router_class))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_generation_is_unchanged(device, family, op_calls):
    model = tiny_model(family, device)
    prompt = torch.randint(2, 512, (1, 12), generator=torch.Generator().manual_seed(1)).to(device)
    kwargs = dict(max_new_tokens=20, do_sample=False, min_new_tokens=20)
    with torch.no_grad():
        expected = model.generate(prompt, **kwargs)
        kimi_tf.patch(model)
        patched = model.generate(prompt, **kwargs)
    assert torch.equal(patched, expected)
    assert len(op_calls) == 2 * 20  # two MoE layers, the prompt and 19 decode steps


@pytest.mark.parametrize("family", ["qwen3-moe", "deepseek-v2"])
@torch.no_grad()
def test_compiled_patched_router_matches_eager(family, op_calls):
    torch._dynamo.reset()
    model = tiny_model(family)
    kimi_tf.patch(model)
    router = routers(model, FAMILIES[family][2])[0]
    compiled = torch.compile(router, fullgraph=True, dynamic=True)
    for tokens in (1, 3, 8):
        hidden = torch.randn(tokens, 256).to(torch.bfloat16)
        for a, b in zip(compiled(hidden), router(hidden)):
            assert torch.equal(a, b)
    assert op_calls


def test_unknown_deepseek_v2_method_keeps_transformers_forward(op_calls):
    model = tiny_model("deepseek-v2")
    router = routers(model, "DeepseekV2TopkRouter")[0]
    kimi_tf.patch(model)
    router.topk_method = "something_new"
    with torch.no_grad(), pytest.raises(Exception):  # transformers' own forward knows it neither
        router(torch.randn(3, 256).to(torch.bfloat16))
    assert op_calls == []


def test_each_patched_class_shares_its_familys_forward():
    """The classes patched as one family have one forward, word for word, in the installed
    transformers (a release that changes one must be looked at before it is patched)."""
    import importlib
    import pkgutil

    import transformers.models as models

    found = {}
    for module in pkgutil.iter_modules(models.__path__):
        try:
            modeling = importlib.import_module(f"transformers.models.{module.name}.modeling_{module.name}")
        except Exception:  # a model whose optional dependency is missing
            continue
        for name in kimi_tf.ROUTER_CLASSES:
            if isinstance(getattr(modeling, name, None), type) and getattr(modeling, name).__module__ == modeling.__name__:
                found[name] = getattr(modeling, name)
    assert set(found) == set(kimi_tf.ROUTER_CLASSES)
    by_forward = {}
    for name, cls in found.items():
        by_forward.setdefault(kimi_tf.ROUTERS[name][0], set()).add(inspect.getsource(cls.forward))
    assert all(len(sources) == 1 for sources in by_forward.values()), by_forward.keys()
