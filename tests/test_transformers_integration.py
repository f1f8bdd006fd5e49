"""kimi_router_ops.integrations.transformers on a tiny random-weight DeepSeek-V3 model."""

import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed (optional extra)")

from kimi_router_ops.integrations import transformers as kimi_tf  # noqa: E402
from conftest import HAS_CUDA  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])


def tiny_model(device="cpu", dtype=torch.bfloat16, seed=0):
    """2 MoE layers (the first layer is dense), hidden 256, 64 experts in 4 groups, 2 kept,
    top-6, random weights and a random score-correction bias."""
    torch.manual_seed(seed)
    config = transformers.DeepseekV3Config(
        vocab_size=512, hidden_size=256, intermediate_size=512, moe_intermediate_size=64,
        num_hidden_layers=3, first_k_dense_replace=1, num_attention_heads=4,
        num_key_value_heads=4, n_shared_experts=1, n_routed_experts=64, n_group=4,
        topk_group=2, num_experts_per_tok=6, routed_scaling_factor=2.5, kv_lora_rank=32,
        q_lora_rank=64, qk_rope_head_dim=16, v_head_dim=32, qk_nope_head_dim=32,
        max_position_embeddings=256, pad_token_id=0, eos_token_id=1, bos_token_id=0,
    )
    model = transformers.DeepseekV3ForCausalLM(config)
    model.apply(model._init_weights)
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__ == "DeepseekV3TopkRouter":
                module.weight.normal_(0, 0.05)
                module.e_score_correction_bias.uniform_(-0.05, 0.05)
    return model.to(device=device, dtype=dtype).eval()


def routers(model):
    return [m for m in model.modules() if type(m).__name__ == "DeepseekV3TopkRouter"]


@pytest.fixture
def op_calls(monkeypatch):
    """Counts the calls that reach the router op (so a silent fallback cannot pass)."""
    calls = []
    original = kimi_tf.ops.router

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return original(*args, **kwargs)

    monkeypatch.setattr(kimi_tf.ops, "router", counting)
    return calls


@pytest.mark.parametrize("device", DEVICES)
@torch.no_grad()
def test_patched_routers_give_the_same_outputs(device, op_calls):
    model = tiny_model(device)
    hidden = torch.randn(2, 7, 256, device=device).to(torch.bfloat16)
    before = [r(hidden) for r in routers(model)]
    assert kimi_tf.patch(model) == 2
    assert all(type(r).__module__ == kimi_tf.__name__ for r in routers(model))
    after = [r(hidden) for r in routers(model)]
    assert op_calls == [(14, 256), (14, 256)]
    for (logits0, weights0, ids0), (logits1, weights1, ids1) in zip(before, after):
        assert ids1.dtype == ids0.dtype == torch.int64 and weights1.dtype == torch.float32
        torch.testing.assert_close(logits1, logits0, rtol=1e-5, atol=1e-6)
        for t in range(ids0.shape[0]):
            assert set(ids1[t].tolist()) == set(ids0[t].tolist())
            order0, order1 = ids0[t].argsort(), ids1[t].argsort()
            torch.testing.assert_close(weights1[t][order1], weights0[t][order0], rtol=1e-5, atol=1e-7)
    assert kimi_tf.unpatch(model) == 2
    assert all(type(r).__module__.startswith("transformers.") for r in routers(model))


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_generation_is_unchanged(device, op_calls):
    model = tiny_model(device)
    prompt = torch.randint(2, 512, (1, 12), generator=torch.Generator().manual_seed(1)).to(device)
    kwargs = dict(max_new_tokens=20, do_sample=False, min_new_tokens=20)
    with torch.no_grad():
        expected = model.generate(prompt, **kwargs)
        kimi_tf.patch(model)
        patched = model.generate(prompt, **kwargs)
    assert patched.shape == (1, 32)
    assert torch.equal(patched, expected)
    assert len(op_calls) == 2 * 20  # two MoE layers, the prompt and 19 decode steps
    assert op_calls[0] == (12, 256) and op_calls[-1] == (1, 256)


def test_patch_is_idempotent_and_state_dict_unchanged():
    model = tiny_model()
    keys = list(model.state_dict())
    assert kimi_tf.patch(model) == 2
    assert kimi_tf.patch(model) == 0
    assert list(model.state_dict()) == keys
    assert all(isinstance(r, transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3TopkRouter) for r in routers(model))


def test_fp32_model_runs_the_fp32_gate_kernels(op_calls):
    """An fp32 model's router is an fp32 gate: the op computes it in fp32, no fallback."""
    model = tiny_model(dtype=torch.float32)
    hidden = torch.randn(5, 256)
    router = routers(model)[0]
    with torch.no_grad():
        expected = router(hidden)
        kimi_tf.patch(model)
        logits, weights, ids = router(hidden)
    assert op_calls
    torch.testing.assert_close(logits, expected[0], rtol=1e-5, atol=1e-6)
    assert torch.equal(ids.sort(-1)[0], expected[2].sort(-1)[0])


def test_fp16_model_keeps_transformers_forward_and_says_so():
    model = tiny_model(dtype=torch.float16)
    hidden = torch.randn(5, 256).half()
    router = routers(model)[0]
    with torch.no_grad():
        expected = router(hidden)
    with pytest.warns(RuntimeWarning, match="DeepseekV3TopkRouter routers run transformers' forward: the ops take "
                                            "bf16 weights and inputs or an fp32 gate, got torch.float16"):
        kimi_tf.patch(model)
    with torch.no_grad(), pytest.warns(RuntimeWarning, match="got torch.float16 and torch.float16"):
        for a, b in zip(router(hidden), expected):
            assert torch.equal(a, b)


@torch.no_grad()
def test_compiled_patched_router_matches_eager(op_calls):
    torch._dynamo.reset()
    model = tiny_model()
    kimi_tf.patch(model)
    router = routers(model)[0]
    compiled = torch.compile(router, fullgraph=True, dynamic=True)
    for tokens in (1, 3, 8):
        hidden = torch.randn(tokens, 256).to(torch.bfloat16)
        for a, b in zip(compiled(hidden), router(hidden)):
            assert torch.equal(a, b)
    assert op_calls  # eager calls reach the op (the compiled graph calls it directly)


def test_training_keeps_transformers_forward_and_its_gradients(op_calls):
    model = tiny_model()
    router = routers(model)[0]
    hidden = torch.randn(4, 256).to(torch.bfloat16)
    kimi_tf.patch(model)
    with pytest.warns(RuntimeWarning, match="gradients are enabled and the ops have no derivative"):
        logits, weights, ids = router(hidden)
    weights.sum().backward()  # transformers' differentiable path
    assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0
    assert op_calls == []


def test_importing_the_package_does_not_import_transformers():
    code = "import sys, kimi_router_ops; assert 'transformers' not in sys.modules; print('ok')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


@pytest.mark.parametrize("device", DEVICES)
def test_static_cache_compiled_generation_is_unchanged(device, op_calls):
    """Generation with a static cache and a compiled forward (on a GPU, inductor's CUDA graphs
    for decode): the patched model makes the same tokens as the unpatched eager one."""
    torch._dynamo.reset()
    model = tiny_model(device)
    prompt = torch.randint(2, 512, (1, 12), generator=torch.Generator().manual_seed(1)).to(device)
    kwargs = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False)
    with torch.no_grad():
        expected = model.generate(prompt, **kwargs)
        kimi_tf.patch(model)
        model.forward = torch.compile(model.forward, fullgraph=True)
        out = model.generate(prompt, cache_implementation="static", **kwargs)
    assert torch.equal(out, expected)
    assert op_calls  # the op is what the compiled graphs call


def test_example_runs_on_the_cpu():
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "examples" / "transformers_decode.py"
    for model in ("deepseek-v3", "qwen3-moe"):
        result = subprocess.run([sys.executable, str(script), "--model", model, "--device", "cpu", "--tokens", "4"],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "same tokens: True" in result.stdout and "no speed is reported" in result.stdout


def test_the_readme_call_works_verbatim_and_says_what_it_did(caplog):
    """README: `import kimi_router_ops; kimi_router_ops.integrations.transformers.patch(model)`;
    patch logs one line, and a patched router's repr says it is ours."""
    import kimi_router_ops

    model = tiny_model()
    with caplog.at_level("INFO", logger="kimi_router_ops"):
        assert kimi_router_ops.integrations.transformers.patch(model) == 2
    assert "2 routers of DeepseekV3ForCausalLM run kimi_router_ops' ops" in caplog.text
    assert all(repr(r).endswith("kimi_router_ops)") for r in routers(model))
    assert kimi_router_ops.integrations.transformers.unpatch(model) == 2
    assert all("kimi_router_ops" not in repr(r) for r in routers(model))


def test_a_model_without_a_supported_router_is_a_warning():
    with pytest.warns(RuntimeWarning, match="no router of a supported family in Sequential"):
        assert kimi_tf.patch(torch.nn.Sequential(torch.nn.Linear(4, 4))) == 0
