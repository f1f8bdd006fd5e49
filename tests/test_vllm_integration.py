"""kimi_router_ops.integrations.vllm against the real vLLM (0.33): the plugin loads through
vLLM's own plugin loader, the replaced gate layer and routing functions give vLLM's
outputs, torch.compile of the replaced gate works, the switches turn each hook off.

On a machine without a GPU vLLM's compiled kernels cannot run: there the gate is compared
with vLLM's own fallback (F.linear), grouped_topk with vLLM's torch code, and
fused_topk_bias, whose vLLM implementation is a CUDA kernel only, with the float64 formula
of the routers that call it (DeepseekV3TopkRouter's with one group)."""

import os
import subprocess
import sys

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (the vllm extra)")

from kimi_router_ops.testing import dot_error, near_tie, reference_routing  # noqa: E402
from kimi_router_ops.integrations import vllm as kimi_vllm  # noqa: E402
from test_moe_routing import check_routing  # noqa: E402
from vllm.model_executor.custom_op import op_registry_oot  # noqa: E402
from vllm.model_executor.layers.fused_moe.router import fused_topk_bias_router, grouped_topk_router  # noqa: E402
from vllm.model_executor.layers.fused_moe.router.gate_linear import GateLinear  # noqa: E402

SWITCHES = (kimi_vllm.ENV_ALL, kimi_vllm.ENV_GATE, kimi_vllm.ENV_ROUTING, kimi_vllm.ENV_ATTN_RES)


@pytest.fixture(scope="module", autouse=True)
def vllm_process():
    """A vLLM config and a one-process tensor-parallel group (vLLM's layers ask for both),
    and the plugin registered as vLLM would; then vLLM's own code back."""
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state

    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        if parallel_state._WORLD is None:
            parallel_state.init_distributed_environment(1, 0, "tcp://127.0.0.1:29517", 0, "gloo")
            parallel_state.ensure_model_parallel_initialized(1, 1)
        kimi_vllm.unregister()
        saved = {name: os.environ.pop(name, None) for name in SWITCHES}
        kimi_vllm.register()
        yield
        kimi_vllm.unregister()
        os.environ.update({k: v for k, v in saved.items() if v is not None})


@pytest.fixture
def op_calls(monkeypatch):
    """The calls that reach our ops from the plugin (so a silent fallback cannot pass)."""
    calls = []
    for name in ("router_gemm", "moe_routing", "moe_routing_out", "attn_res"):
        original = getattr(kimi_vllm.ops, name)

        def counting(*args, _name=name, _original=original, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(kimi_vllm.ops, name, counting)
    return calls


def vllm_grouped_topk(*args):
    """vLLM's own grouped_topk, eagerly (it is wrapped in torch.compile)."""
    original = kimi_vllm._originals["grouped_topk"]
    return getattr(original, "_torchdynamo_orig_callable", original)(*args)


def gate(out_dtype=torch.float32, bias=False, n=64, k=256, seed=0, params_dtype=torch.bfloat16):
    layer = GateLinear(k, n, bias=bias, out_dtype=out_dtype, params_dtype=params_dtype)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(n, k, generator=g) * k ** -0.5)
        if bias:
            layer.bias.copy_(torch.randn(n, generator=g) * 0.1)
    return layer


def test_gate_layer_is_replaced_and_gives_vllms_logits(op_calls):
    for out_dtype in (torch.float32, torch.bfloat16, None):
        layer = gate(out_dtype)
        assert type(layer).__name__ == "KimiGateLinear" and isinstance(layer, GateLinear)
        for m in (1, 5, 40, 300):
            x = torch.randn(m, 256).to(torch.bfloat16)
            ours, bias = layer(x)
            theirs, _ = GateLinear.forward(layer, x)  # vLLM's own tiers (here: F.linear)
            assert bias is None and ours.dtype == theirs.dtype == (out_dtype or torch.bfloat16)
            assert ours.shape == theirs.shape == (m, 64)
            if ours.dtype == torch.float32:
                assert dot_error(ours, x, layer.weight) <= 1e-5  # fp32 sums of the exact products
                # vLLM's fallback rounds to bf16 before widening: within one bf16 ulp of ours.
                torch.testing.assert_close(theirs, ours, rtol=2 ** -7, atol=1e-6)
            else:
                torch.testing.assert_close(ours.float(), theirs.float(), rtol=2 ** -7, atol=1e-6)
    assert op_calls == ["router_gemm"] * 12


@pytest.mark.parametrize("out_dtype", [torch.float32, None])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
def test_fp32_gate_is_replaced_and_never_rounds_the_weights(out_dtype, x_dtype, op_calls):
    """MiniMax-M2's gate (GateLinear(params_dtype=torch.float32)): fp32 logits within 1e-6 of
    the exact product of the fp32 weights, and of vLLM's own fp32 path (here: F.linear)."""
    layer = gate(out_dtype, n=256, k=3072, params_dtype=torch.float32)
    assert layer.weight.dtype == torch.float32
    for m in (1, 7, 40):
        x = torch.randn(m, 3072).to(x_dtype)
        ours, bias = layer(x)
        assert bias is None and ours.dtype == torch.float32 and ours.shape == (m, 256)
        assert dot_error(ours, x, layer.weight) <= 1e-6
        theirs = torch.nn.functional.linear(x.float(), layer.weight)
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert op_calls == ["router_gemm"] * 3


def test_gate_bias_is_added_in_the_kernel(op_calls):
    layer = gate(bias=True)
    x = torch.randn(3, 256).to(torch.bfloat16)
    ours, theirs = layer(x)[0], GateLinear.forward(layer, x)[0]
    torch.testing.assert_close(ours, theirs, rtol=2 ** -7, atol=1e-5)  # vLLM's F.linear rounds to bf16 first
    assert op_calls == ["router_gemm"]


def test_gate_with_fp32_input_on_bf16_weights_keeps_vllms_forward(op_calls):
    layer = gate()
    x = torch.randn(3, 256)
    assert torch.equal(layer(x)[0], GateLinear.forward(layer, x)[0])
    assert op_calls == []


def test_compiled_gate_matches_eager(op_calls):
    torch._dynamo.reset()
    layer = gate()
    compiled = torch.compile(layer, fullgraph=True, dynamic=True)
    for m in (1, 3, 8, 33):
        x = torch.randn(m, 256).to(torch.bfloat16)
        assert torch.equal(compiled(x)[0], layer(x)[0])
    assert op_calls


# (N, top_k, num_expert_group, topk_group, scoring_func, bias, renormalize, routed_scaling_factor)
GROUPED = {
    "deepseek-v3": (256, 8, 8, 4, "sigmoid", True, True, 2.5),
    "deepseek-v2": (160, 6, 8, 3, "softmax", False, False, 16.0),
    "all groups kept": (64, 6, 4, 4, "sigmoid", True, True, 1.0),
}


@pytest.mark.parametrize("config", list(GROUPED))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_topk_gives_vllms_routing(config, dtype, op_calls):
    n, top_k, n_group, topk_group, scoring, has_bias, renormalize, scale = GROUPED[config]
    g = torch.Generator().manual_seed(n)
    logits = (torch.randn(40, n, generator=g) * 2).to(dtype)
    bias = torch.randn(n, generator=g) * 0.1 if has_bias else None
    args = (logits, logits, top_k, renormalize, n_group, topk_group, scoring, scale, bias)
    weights, ids = grouped_topk_router.grouped_topk(*args)  # what GroupedTopKRouter calls
    assert op_calls == ["moe_routing"]
    theirs_w, theirs_ids = vllm_grouped_topk(*args)
    assert (weights.dtype, ids.dtype) == (theirs_w.dtype, theirs_ids.dtype) == (torch.float32, torch.int32)
    reference = reference_routing(logits, bias, top_k, n_group, topk_group, renormalize, scale, scoring)
    check_routing(weights, ids, logits, bias, top_k, topk_group, reference, scoring)
    if dtype == torch.bfloat16:
        return  # vLLM's torch code scores bf16 logits in bf16; ours widen them to fp32 first
    # vLLM's (in no particular order): the same experts, unless its values tie at a cut,
    # with the same weights.
    _, _, masked, group_scores = reference
    for t in range(logits.shape[0]):
        if set(ids[t].tolist()) != set(theirs_ids[t].tolist()):
            assert near_tie(masked[t], top_k) or near_tie(group_scores[t], topk_group), t
            continue
        torch.testing.assert_close(weights[t][ids[t].argsort()], theirs_w[t][theirs_ids[t].argsort()],
                                   rtol=1e-5, atol=1e-7)


def test_grouped_topk_where_the_group_rules_differ_keeps_vllms(op_calls):
    """Sigmoid without a bias: vLLM scores a group by its best, our sigmoid by its two best."""
    logits = torch.randn(5, 64)
    args = (logits, logits, 4, True, 8, 2, "sigmoid", 1.0, None)
    for a, b in zip(grouped_topk_router.grouped_topk(*args), kimi_vllm._originals["grouped_topk"](*args)):
        assert torch.equal(a, b)
    assert op_calls == []


@pytest.mark.parametrize("n, top_k, n_group, topk_group, scale", [(896, 16, 1, 1, 2.5), (256, 8, 8, 4, 2.5),
                                                                   (64, 6, 4, 4, 1.0)])
def test_fused_grouped_topk_is_the_biased_sigmoid_routing(n, top_k, n_group, topk_group, scale, op_calls):
    """vLLM's fused_grouped_topk (a CUDA kernel only: compared with the float64 formula):
    Kimi-K3's MegaMoE front (896 experts, top-16, one group), DeepSeek-V3's groups."""
    g = torch.Generator().manual_seed(n)
    logits, bias = torch.randn(9, n, generator=g) * 2, torch.randn(n, generator=g) * 0.1
    weights, ids = grouped_topk_router.fused_grouped_topk(logits, logits, top_k, True, bias, n_group, topk_group,
                                                          "sigmoid", scale)
    assert op_calls == ["moe_routing"] and (weights.dtype, ids.dtype) == (torch.float32, torch.int32)
    check_routing(weights, ids, logits, bias, top_k, topk_group,
                  reference_routing(logits, bias, top_k, n_group, topk_group, True, scale))


def test_fused_grouped_topk_where_the_group_rules_differ_keeps_vllms(monkeypatch, op_calls):
    """Softmax with a bias and groups dropped: vLLM's kernel scores a group by its two best,
    our softmax by its best."""
    monkeypatch.setitem(kimi_vllm._originals, "fused_grouped_topk", lambda *args: "vllm")
    logits = torch.randn(5, 64)
    assert grouped_topk_router.fused_grouped_topk(logits, logits, 4, True, torch.zeros(64), 8, 2, "softmax") == "vllm"
    assert op_calls == []


def test_k3_megamoe_front_routes_on_ours(k3_model):
    """The name Kimi-K3's model imported (its MegaMoE router beside the down-projection) is ours."""
    assert k3_model.fused_grouped_topk is kimi_vllm.fused_grouped_topk


@pytest.mark.parametrize("n, top_k, scale", [(384, 8, 2.827), (896, 16, 1.0), (160, 8, 2.5)])
def test_fused_topk_bias_is_the_biased_sigmoid_routing(n, top_k, scale, op_calls):
    """Kimi-K2, Kimi-K3 and GLM-4.5 shapes: FusedTopKBiasRouter's function."""
    g = torch.Generator().manual_seed(n)
    logits, bias = torch.randn(33, n, generator=g) * 2, torch.randn(n, generator=g) * 0.1
    weights, ids = fused_topk_bias_router.fused_topk_bias(
        logits, logits, "sigmoid", bias, top_k, True, routed_scaling_factor=scale)
    assert op_calls == ["moe_routing"]
    check_routing(weights, ids, logits, bias, top_k, 1,
                  reference_routing(logits, bias, top_k, 1, 1, True, scale))


def test_fused_topk_bias_with_int64_ids(op_calls):
    """indices_type=torch.int64 (DeepSeek-V4's MegaMoE): the same routing, its ids written as
    int64 by moe_routing_out."""
    g = torch.Generator().manual_seed(0)
    logits, bias = torch.randn(17, 384, generator=g) * 2, torch.randn(384, generator=g) * 0.1
    for scoring in ("sigmoid", "sqrtsoftplus"):
        weights, ids = fused_topk_bias_router.fused_topk_bias(logits, logits, scoring, bias, 6, True,
                                                              indices_type=torch.int64, routed_scaling_factor=2.5)
        ref_weights, ref_ids = fused_topk_bias_router.fused_topk_bias(logits, logits, scoring, bias, 6, True,
                                                                      routed_scaling_factor=2.5)
        assert ids.dtype == torch.int64 and weights.dtype == torch.float32
        assert torch.equal(ids, ref_ids.long()) and torch.equal(weights, ref_weights)
    assert op_calls == ["moe_routing_out", "moe_routing"] * 2


def test_fused_topk_bias_with_token_hashes_keeps_vllms(monkeypatch, op_calls):
    """vLLM's sigmoid kernel ignores a hash table and its softmax is not ours: vLLM's own."""
    seen = []
    monkeypatch.setitem(kimi_vllm._originals, "fused_topk_bias", lambda *a, **k: seen.append(k) or "vllm")
    logits = torch.randn(2, 64)
    hashes = torch.zeros(10, 6, dtype=torch.int32)
    assert fused_topk_bias_router.fused_topk_bias(
        logits, logits, "sigmoid", torch.zeros(64), 6, True, input_tokens=torch.zeros(2, dtype=torch.long),
        hash_indices_table=hashes) == "vllm"
    assert fused_topk_bias_router.fused_topk_bias(logits, logits, "softmax", torch.zeros(64), 6, True) == "vllm"
    assert fused_topk_bias_router.fused_topk_bias(
        logits, logits, "sqrtsoftplus", torch.zeros(64), 6, True, input_tokens=torch.zeros(2, dtype=torch.long),
        bias_vl=torch.zeros(64), image_sentinel_lo=5) == "vllm"  # image routing
    assert len(seen) == 3 and op_calls == []


@pytest.mark.parametrize("n", [256, 384])
@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
def test_fused_topk_bias_serves_deepseek_v4s_hash_layers(n, ids_dtype, op_calls):
    """A hash-routed layer (tid2eid int32, vLLM's input ids int64 or int32): ids from the
    table, weights the scores at them, as vLLM's formula (its kernel is CUDA only)."""
    g = torch.Generator().manual_seed(n)
    logits, bias = torch.randn(9, n, generator=g) * 3, torch.randn(n, generator=g) * 0.1
    table = torch.stack([torch.randperm(n, generator=g)[:6] for _ in range(50)]).int()
    tokens = torch.randint(0, 50, (9,), generator=g).to(ids_dtype)
    weights, ids = fused_topk_bias_router.fused_topk_bias(
        logits, logits, "sqrtsoftplus", bias, 6, True, input_tokens=tokens, hash_indices_table=table,
        routed_scaling_factor=1.5)
    assert op_calls == ["moe_routing"]
    scores = torch.nn.functional.softplus(logits.double()).sqrt()
    expected_ids = table[tokens.long()]
    expected = scores.gather(1, expected_ids.long())
    expected = expected / expected.sum(-1, keepdim=True) * 1.5
    assert ids.dtype == torch.int32 and torch.equal(ids, expected_ids)
    torch.testing.assert_close(weights.double(), expected, rtol=1e-5, atol=0)


def attn_res_hooked() -> bool:
    """Whether vLLM's K3 attn_res is ours, or will be once its package is imported."""
    module = sys.modules.get(kimi_vllm.ATTN_RES_MODULES[0])
    return kimi_vllm._ATTN_RES_HOOK in sys.meta_path if module is None else module.attn_res is kimi_vllm.attn_res


def test_switches_turn_each_hook_off(monkeypatch):
    try:
        for switch, gate_replaced, routing_replaced in [
            (kimi_vllm.ENV_GATE, False, True), (kimi_vllm.ENV_ROUTING, True, False), (kimi_vllm.ENV_ALL, False, False),
            (kimi_vllm.ENV_ATTN_RES, True, True),
        ]:
            kimi_vllm.unregister()
            monkeypatch.setenv(switch, "0")
            kimi_vllm.register()
            monkeypatch.delenv(switch)
            assert (op_registry_oot.get("GateLinear") is not None) == gate_replaced, switch
            assert (grouped_topk_router.grouped_topk is kimi_vllm.grouped_topk) == routing_replaced, switch
            assert (fused_topk_bias_router.fused_topk_bias is kimi_vllm.fused_topk_bias) == routing_replaced, switch
            assert (grouped_topk_router.fused_grouped_topk is kimi_vllm.fused_grouped_topk) == routing_replaced
            assert type(gate()).__name__ == ("KimiGateLinear" if gate_replaced else "GateLinear")
            assert attn_res_hooked() == (switch not in (kimi_vllm.ENV_ATTN_RES, kimi_vllm.ENV_ALL)), switch
    finally:
        kimi_vllm.unregister()
        kimi_vllm.register()


def test_register_twice_replaces_once():
    first = kimi_vllm.register()
    assert kimi_vllm.register() == first and len(first) == 5
    assert kimi_vllm._originals["grouped_topk"] is not kimi_vllm.grouped_topk


# Kimi-K3's AttnRes. Importing vLLM's K3 ops package imports the whole model (about 15 s on
# two cores): the plugin rebinds it when that happens; these tests import it once.
K3_OPS, K3_MODEL = kimi_vllm.ATTN_RES_MODULES




def test_plugin_in_fresh_processes():
    """Three fresh processes, run side by side (each imports vLLM: tens of seconds):
    - vLLM's loader finds the entry point of the installed package and registers it, which
      imports nothing of Kimi-K3; importing its model later (as vLLM's registry does) binds
      our attn_res in the model and the ops package and our fused_grouped_topk in the model,
      and unregister() puts vLLM's back;
    - with KIMI_ROUTER_OPS_VLLM=0 the loader replaces nothing;
    - importing the package (and the plugin module) imports no vLLM."""
    on = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO)  # a vLLM engine configures its logger before this\n"
        "from vllm.plugins import load_general_plugins\n"
        "load_general_plugins()\n"
        "from vllm.model_executor.custom_op import op_registry_oot\n"
        "from vllm.model_executor.layers.fused_moe.router import grouped_topk_router as g\n"
        "from kimi_router_ops.integrations import vllm as kimi_vllm\n"
        "layer = op_registry_oot.get('GateLinear')\n"
        "print('gate', getattr(layer, '__name__', None), 'routing', g.grouped_topk.__module__)\n"
        f"assert {K3_OPS!r} not in sys.modules and {K3_MODEL!r} not in sys.modules\n"
        "import vllm.models.kimi_k3  # what vLLM's model registry imports\n"
        f"ops, model = sys.modules[{K3_OPS!r}], sys.modules[{K3_MODEL!r}]\n"
        "assert ops.attn_res is kimi_vllm.attn_res and model.attn_res is kimi_vllm.attn_res\n"
        "assert model.fused_grouped_topk is kimi_vllm.fused_grouped_topk\n"
        "kimi_vllm.unregister()\n"
        "assert ops.attn_res is model.attn_res and ops.attn_res.__module__.startswith('vllm.'), ops.attn_res\n"
        "assert model.fused_grouped_topk is g.fused_grouped_topk and g.fused_grouped_topk.__module__.startswith('vllm.')\n"
        "print('ok')\n"
    )
    off = on.split("layer = ")[0] + "print('gate', op_registry_oot.get('GateLinear'), 'routing', g.grouped_topk.__module__)\n"
    bare = "import sys, kimi_router_ops, kimi_router_ops.integrations.vllm\nassert 'vllm' not in sys.modules\nprint('ok')"
    env = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    runs = [subprocess.Popen([sys.executable, "-c", code], env={**env, **extra}, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
            for code, extra in ((on, {}), (off, {kimi_vllm.ENV_ALL: "0"}), (bare, {}))]
    (on, _), (off, _), (bare, _) = (run.communicate(timeout=600) for run in runs)
    assert runs[0].returncode == 0 and "gate KimiGateLinear routing kimi_router_ops.integrations.vllm" in on, on[-3000:]
    assert "kimi_router_ops: replaced GateLinear" in on and "Kimi-K3 attn_res" in on and "ok" in on, on[-3000:]
    assert runs[1].returncode == 0 and "gate None routing vllm." in off, off[-3000:]
    assert runs[2].returncode == 0 and "ok" in bare, bare[-2000:]


@pytest.fixture(scope="module")
def k3_model():
    import importlib

    return importlib.import_module(K3_MODEL)


def k3_inputs(m, h, r, seed=0):
    g = torch.Generator().manual_seed(seed)
    bf = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16)  # noqa: E731
    weight = lambda: (torch.rand(h, generator=g) + 0.5).to(torch.bfloat16)  # noqa: E731
    return dict(prefix=bf(m, h), delta=bf(m, h), blocks=bf(m, r, h), norm_weight=weight(),
                qk_weight=bf(h) * 0.05, output_norm_weight=weight())


@pytest.mark.parametrize("m,num_blocks,block_write_idx,delta,norm", [
    (1, 8, -1, True, True), (3, 2, 2, True, True), (4, 8, 8, False, True), (2, 0, 0, True, False), (5, 5, 1, True, True),
])
def test_k3_attn_res_is_ours_and_the_formula(k3_model, op_calls, m, num_blocks, block_write_idx, delta, norm):
    """The model module's attn_res is ours; on the CPU it runs kimi.attn_res (the float64
    formula's result, and both writes)."""
    from test_attn_res import check

    assert k3_model.attn_res is kimi_vllm.attn_res
    inputs = k3_inputs(m, 7168, 9)
    inputs["delta"] = inputs["delta"] if delta else None
    inputs["output_norm_weight"] = inputs["output_norm_weight"] if norm else None

    def through_the_model(i, num_blocks, block_write_idx, eps, output_norm_eps):
        return k3_model.attn_res(i["prefix"], i["delta"], i["blocks"], i["norm_weight"], i["qk_weight"],
                                 i["output_norm_weight"], num_blocks=num_blocks, block_write_idx=block_write_idx,
                                 eps=eps, output_norm_eps=output_norm_eps)

    check(inputs, num_blocks, block_write_idx, call=through_the_model)
    assert op_calls == ["attn_res"]


def test_k3_attn_res_outside_our_kernel_range_is_vllms(k3_model, monkeypatch, op_calls):
    """Inputs the kernel does not serve (H % 8, more than 15 blocks, fp32) go to vLLM's own."""
    seen = []
    monkeypatch.setitem(kimi_vllm._originals, "attn_res", lambda *args: seen.append(args) or "vllm")
    for m, h, r, nb in ((1, 7170, 3, 2), (1, 64, 20, 16)):
        i = k3_inputs(m, h, r)
        assert k3_model.attn_res(*i.values(), nb, -1, 1e-6, 1e-6) == "vllm"
    i = {k: v.float() for k, v in k3_inputs(1, 64, 3).items()}
    assert k3_model.attn_res(*i.values(), 2, -1, 1e-6, 1e-6) == "vllm"
    assert len(seen) == 3 and op_calls == []


def test_k3_attn_res_matches_vllms_triton_kernel_interpreted():
    """vLLM's Triton kernel, run by Triton's interpreter on the CPU (TRITON_INTERPRET=1, in a
    fresh process: the flag is read when the kernel is defined), against ours. The
    interpreter truncates fp32 to bf16 where a GPU rounds to nearest: delta is prefix, so
    that p = 2 prefix needs no rounding and the writes are equal bit for bit; the outputs are
    then within that truncation (a bf16 ulp), or fp32 noise against the row's size where the
    mix cancels."""
    code = """
import importlib.util, sys, types
import torch, triton, triton.language as tl
import vllm, vllm.triton_utils
import kimi_router_ops
# vLLM's Triton helpers stand in a placeholder where no GPU driver is active: load its
# attn_res file with the real triton beside it.
stub = types.ModuleType("vllm.triton_utils"); stub.triton, stub.tl = triton, tl
real, sys.modules["vllm.triton_utils"] = sys.modules["vllm.triton_utils"], stub
spec = importlib.util.spec_from_file_location("vllm_attn_res", vllm.__path__[0] + "/models/kimi_k3/nvidia/ops/attn_res.py")
theirs = importlib.util.module_from_spec(spec); spec.loader.exec_module(theirs)
sys.modules["vllm.triton_utils"] = real
g = torch.Generator().manual_seed(0)
bf = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16)
for m, h, r, nb, idx, with_delta, with_norm in [(1, 7168, 9, 8, -1, True, True), (3, 7168, 9, 2, 2, True, True),
                                                 (2, 7168, 9, 8, 8, False, True), (2, 1024, 4, 3, -1, True, False),
                                                 (1, 512, 2, 0, 0, True, True)]:
    prefix, blocks = bf(m, h), bf(m, r, h)
    delta = prefix.clone() if with_delta else None
    nw, qw, ow = (torch.rand(h, generator=g) + 0.5).to(torch.bfloat16), bf(h) * 0.05, bf(h) if with_norm else None
    p1, b1, p2, b2 = prefix.clone(), blocks.clone(), prefix.clone(), blocks.clone()
    a = theirs.attn_res(p1, delta, b1, nw, qw, ow, nb, idx, 1e-6, 1e-5)
    b = kimi_router_ops.attn_res(p2, delta, b2, nw, qw, ow, nb, idx, 1e-6, 1e-5)
    assert torch.equal(p1, p2) and torch.equal(b1, b2), (m, h, nb, idx)
    assert torch.equal(b1, blocks) == (idx < 0) and torch.equal(p1, prefix) == (delta is None)
    diff = (a.double() - b.double()).abs()
    bound = 2.0**-7 * b.double().abs() + 1e-4 * b.double().square().mean().sqrt()
    assert (diff <= bound).all(), (m, h, nb, idx, (diff - bound).max().item())
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "TRITON_INTERPRET": "1"})
    assert result.returncode == 0 and "ok" in result.stdout, (result.stdout + result.stderr)[-3000:]


@pytest.mark.parametrize("n", [256, 384])  # DeepSeek-V4-Flash's and V4-Pro's experts
def test_fused_topk_bias_serves_deepseek_v4s_sqrtsoftplus(n, op_calls):
    """vLLM's sqrtsoftplus kernels are CUDA only: judged by the float64 formula of vLLM's test."""
    g = torch.Generator().manual_seed(n)
    logits, bias = torch.randn(17, n, generator=g) * 3, torch.randn(n, generator=g) * 0.1
    weights, ids = fused_topk_bias_router.fused_topk_bias(
        logits, logits, "sqrtsoftplus", bias, 6, True, routed_scaling_factor=1.5)
    assert op_calls == ["moe_routing"]
    check_routing(weights, ids, logits, bias, 6, 1,
                  reference_routing(logits, bias, 6, 1, 1, True, 1.5, "sqrtsoftplus"), "sqrtsoftplus")


def test_grouped_topk_keeps_vllms_error_for_sqrtsoftplus(op_calls):
    """vLLM's grouped_topk has no sqrtsoftplus: its own error, not our routing."""
    logits = torch.randn(2, 64)
    with pytest.raises(ValueError, match="Unsupported scoring function"):
        grouped_topk_router.grouped_topk(logits, logits, 4, True, 8, 4, "sqrtsoftplus", 1.0, torch.zeros(64))
    assert op_calls == []
