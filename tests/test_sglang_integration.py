"""kimi_router_ops.integrations.sglang against the real SGLang (0.5.23), on the CPU: SGLang's
plugin loader finds and runs the plugin, each switch, the replaced gate gives SGLang's
logits, the replaced routing functions give SGLang's routing through its own
select_experts, torch.compile of the replaced gate works.

On a machine without a GPU SGLang's CUDA kernels cannot run: there the gate is compared with
SGLang's CPU path (F.linear) and the exact product, the routing with SGLang's torch code and
the float64 formula. No GPU run of SGLang was made."""

import os
import subprocess
import sys
import types

import pytest
import torch

sglang = pytest.importorskip("sglang", reason="SGLang is not installed (the sglang extra, CI's torch 2.14.1 venv)")

from sglang.srt.layers.moe import topk as sgl_topk  # noqa: E402
from sglang.srt.models.deepseek_v2 import MoEGate  # noqa: E402
from sglang.srt.plugins.hook_registry import HookRegistry  # noqa: E402
from sglang.test.test_utils import published_topology  # noqa: E402

from kimi_router_ops.testing import dot_error, near_tie, reference_routing  # noqa: E402
from kimi_router_ops.integrations import sglang as kimi_sglang  # noqa: E402

SWITCHES = (kimi_sglang.ENV_ALL, kimi_sglang.ENV_GATE, kimi_sglang.ENV_ROUTING, kimi_sglang.ENV_ATTN_RES)


@pytest.fixture(scope="module", autouse=True)
def hooks_applied():
    """The plugin registered and SGLang's hooks applied, as SGLang's loader does; an SGLang
    runtime context published (SGLang's own gate reads it)."""
    saved = {name: os.environ.pop(name, None) for name in SWITCHES}
    kimi_sglang.register()
    HookRegistry.apply_hooks()
    with published_topology(device="cpu"):
        yield
    os.environ.update({k: v for k, v in saved.items() if v is not None})


@pytest.fixture
def op_calls(monkeypatch):
    """The calls that reach our ops from the plugin (so a silent fallback cannot pass)."""
    calls = []
    for name in ("router_gemm", "moe_routing", "moe_routing_out", "attn_res"):
        original = getattr(kimi_sglang.ops, name)

        def counting(*args, _name=name, _original=original, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(kimi_sglang.ops, name, counting)
    return calls


def sglang_own(fn):
    """SGLang's function under our AROUND hook (and under torch.compile, eagerly)."""
    original = fn.__wrapped__
    return getattr(original, "_torchdynamo_orig_callable", original)


def moe_gate(n=64, k=256, fp32=False, seed=0):
    config = types.SimpleNamespace(n_routed_experts=n, hidden_size=k, topk_method="noaux_tc", router_fp32=fp32)
    gate = MoEGate(config, quant_config=None)  # the weight in the default dtype unless router_fp32
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(n, k, generator=g) * k ** -0.5
    # A bf16 model's gate (SGLang builds the model under its dtype as the default).
    gate.weight = torch.nn.Parameter(weight if fp32 else weight.to(torch.bfloat16), requires_grad=False)
    return gate


def test_hooks_are_applied():
    from sglang.srt.layers import attn_residual

    assert MoEGate.forward.__wrapped__ is not None and attn_residual._aggregate.__wrapped__ is not None
    for name in kimi_sglang._ROUTING:
        assert getattr(sgl_topk, name).__wrapped__ is not None, name


@pytest.mark.parametrize("m", [1, 5, 40, 300])
def test_bf16_gate_gives_sglangs_logits(m, op_calls):
    gate = moe_gate()
    x = torch.randn(m, 256).to(torch.bfloat16)
    ours = gate(x)
    theirs = sglang_own(MoEGate.forward)(gate, x)  # SGLang's CPU path: fp32, or bf16 above its tiny GEMM
    assert ours.dtype == torch.float32 and ours.shape == (m, 64)
    assert dot_error(ours, x, gate.weight) <= 1e-5  # fp32 sums of the exact products
    torch.testing.assert_close(ours, theirs.float(), rtol=2 ** -7, atol=1e-6)  # within one bf16 ulp
    assert op_calls == ["router_gemm"]


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
def test_fp32_gate_gives_the_exact_product(x_dtype, op_calls):
    """router_fp32 gates: fp32 logits within 1e-6 of the exact product (SGLang: cuBLAS fp32)."""
    gate = moe_gate(n=256, k=3072, fp32=True)
    assert gate.weight.dtype == torch.float32
    for m in (1, 7, 40):
        x = torch.randn(m, 3072).to(x_dtype)
        ours, theirs = gate(x), sglang_own(MoEGate.forward)(gate, x)
        assert ours.dtype == theirs.dtype == torch.float32
        assert dot_error(ours, x, gate.weight) <= 1e-6
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert op_calls == ["router_gemm"] * 3


def test_gate_outside_our_dtypes_is_sglangs(op_calls):
    """fp32 tokens on a bf16 gate run SGLang's own forward (which rejects them, as it does
    without the plugin)."""
    gate = moe_gate()
    x = torch.randn(3, 256)
    for forward in (gate, lambda t: sglang_own(MoEGate.forward)(gate, t)):
        with pytest.raises(RuntimeError, match="same dtype"):
            forward(x)
    assert op_calls == []


def test_compiled_gate_matches_eager(op_calls):
    torch._dynamo.reset()
    gate = moe_gate()
    compiled = torch.compile(gate, fullgraph=True, dynamic=True)
    for m in (1, 3, 8, 33):
        x = torch.randn(m, 256).to(torch.bfloat16)
        assert torch.equal(compiled(x), gate(x))
    assert op_calls


# name: (N, top_k, use_grouped_topk, num_expert_group, topk_group, scoring, bias, renormalize, scale, on_output)
CONFIGS = {
    "deepseek-v3": (256, 8, True, 8, 4, "sigmoid", True, True, 2.5, True),
    "kimi-k2": (384, 8, True, 1, 1, "sigmoid", True, True, 2.827, False),
    "deepseek-v2": (160, 6, True, 8, 3, "softmax", False, False, 16.0, False),
    "qwen3-moe": (128, 8, False, None, None, "softmax", False, True, 1.0, False),
    "sigmoid, no groups": (64, 6, False, None, None, "sigmoid", True, True, 1.5, True),
}


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("m", [1, 7, 64])
def test_select_experts_routes_on_moe_routing(config, m, op_calls):
    """Through SGLang's own select_experts: SGLang's routing (its functions, unhooked) and
    the float64 formula, expert sets and weights by expert."""
    n, top_k, grouped, n_group, topk_group, scoring, has_bias, renormalize, scale, on_output = CONFIGS[config]
    g = torch.Generator().manual_seed(m)
    logits = torch.randn(m, n, generator=g) * 2
    bias = (torch.randn(n, generator=g) * 0.1) if has_bias else None
    topk_config = sgl_topk.TopKConfig(
        top_k=top_k, use_grouped_topk=grouped, num_expert_group=n_group, topk_group=topk_group,
        renormalize=renormalize, correction_bias=bias, routed_scaling_factor=scale,
        apply_routed_scaling_factor_on_output=on_output, scoring_func=scoring)
    hidden = torch.randn(m, 32)
    ours = sgl_topk.select_experts(hidden, logits, topk_config)
    assert op_calls == ["moe_routing"]
    assert ours.topk_weights.dtype == torch.float32 and ours.topk_ids.dtype == torch.int32
    # SGLang's own function for the same call.
    if grouped and bias is not None:
        theirs = sglang_own(sgl_topk.biased_grouped_topk)(hidden, logits, bias, top_k, renormalize, n_group,
                                                         topk_group, 0, scale, on_output)
    elif grouped:
        theirs = sglang_own(sgl_topk.grouped_topk)(hidden, logits, top_k, renormalize, n_group, topk_group, 0,
                                                  scale, on_output, scoring)
    else:
        theirs = sgl_topk.fused_topk_torch_native(hidden, logits, top_k, renormalize, bias, scoring) \
            if scoring == "softmax" else sgl_topk.biased_topk_impl(hidden, logits, bias, top_k, renormalize)
        if scoring == "softmax" and on_output:
            theirs = (theirs[0] * scale, theirs[1])
    if scoring == "sigmoid" and not grouped and on_output:
        theirs = (theirs[0] * scale, theirs[1])
    ref_w, ref_ids, masked, group_scores = reference_routing(
        logits, bias, top_k, n_group or 1, topk_group or 1, renormalize, scale if on_output else 1.0, scoring)
    for t in range(m):
        for weights, ids in ((theirs[0][t], theirs[1][t]), (ref_w[t], ref_ids[t])):
            if set(ids.tolist()) != set(ours.topk_ids[t].tolist()):
                assert near_tie(masked[t], top_k), (config, t)
                continue
            mine = dict(zip(ours.topk_ids[t].tolist(), ours.topk_weights[t].tolist()))
            for i, w in zip(ids.tolist(), weights.tolist()):
                assert abs(mine[i] - w) <= 1e-5 * max(1.0, abs(w)), (config, t, i)


@pytest.mark.parametrize("on_output", [False, True])
@pytest.mark.parametrize("m", [1, 7, 64])
def test_one_fused_shared_expert_is_ours(on_output, m, op_calls):
    """DeepSeek-V3 with its shared expert fused (top_k 8 + 1): the routed slots as SGLang's
    own function gives them, the last one expert 256 with SGLang's weight."""
    n, top_k, scale = 256, 9, 2.5
    g = torch.Generator().manual_seed(m)
    logits, bias = torch.randn(m, n, generator=g) * 2, torch.randn(n, generator=g) * 0.1
    args = (torch.empty(m, 32), logits, bias, top_k, True, 8, 4, 1, scale, on_output)
    ours = kimi_sglang.biased_grouped_topk(None, *args)
    theirs = sglang_own(sgl_topk.biased_grouped_topk)(*args)
    assert op_calls == ["moe_routing_out"]
    assert ours[0].shape == ours[1].shape == (m, top_k) and ours[1].dtype == torch.int32
    assert (ours[1][:, -1] == n).all() and torch.equal(ours[1][:, -1], theirs[1][:, -1].to(torch.int32))
    torch.testing.assert_close(ours[0][:, -1], theirs[0][:, -1].float(), rtol=1e-5, atol=0)
    _, _, masked, _ = reference_routing(logits, bias, top_k - 1, 8, 4, True, 1.0, "sigmoid")
    for t in range(m):
        mine = dict(zip(ours[1][t, :-1].tolist(), ours[0][t, :-1].tolist()))
        if set(mine) != set(theirs[1][t, :-1].tolist()):
            assert near_tie(masked[t], top_k - 1), t
            continue
        for i, w in zip(theirs[1][t, :-1].tolist(), theirs[0][t, :-1].tolist()):
            assert abs(mine[i] - w) <= 1e-5 * max(1.0, abs(w)), (t, i)


def test_routing_outside_our_semantics_is_sglangs():
    """Fused shared-expert slots, a per-token bias, sigmoid groups scored without a bias,
    softmax with a bias, a packed output: SGLang's own function runs."""
    called = []

    def original(*args, **kwargs):
        called.append(len(args))
        return "sglang"

    logits, bias = torch.randn(2, 64), torch.randn(64)
    assert kimi_sglang.biased_grouped_topk(original, None, logits, bias, 6, True, 8, 4, 2) == "sglang"
    assert kimi_sglang.biased_grouped_topk(original, None, logits, bias.expand(2, 64), 6, True, 8, 4) == "sglang"
    assert kimi_sglang.grouped_topk(original, None, logits, 6, True, 8, 4, scoring_func="sigmoid") == "sglang"
    assert kimi_sglang.fused_topk(original, None, logits, 6, True, bias, "softmax") == "sglang"
    assert kimi_sglang.fused_topk(original, None, logits, 6, True, packed_out=torch.empty(2, 6)) == "sglang"
    assert kimi_sglang.fused_topk(original, None, logits.half(), 6, True) == "sglang"
    assert kimi_sglang.biased_topk_jit_kernel_impl(original, None, logits, bias, 6, True,
                                                   num_token_non_padded=torch.tensor(1)) == "sglang"
    assert kimi_sglang.biased_topk_jit_kernel_impl(original, None, logits, bias, 6, True,
                                                   packed_out=torch.empty(2, 6)) == "sglang"
    assert len(called) == 8
    # Where they match, ours: sigmoid without a bias but every group kept; the JIT router's plain call.
    weights, ids = kimi_sglang.grouped_topk(original, None, logits, 6, True, 8, 8, scoring_func="sigmoid")
    assert ids.shape == (2, 6)
    weights, ids = kimi_sglang.biased_topk_jit_kernel_impl(original, None, logits, bias, 6, True)
    assert len(called) == 8 and ids.shape == (2, 6)


def _same_routing(ours, theirs, masked, top_k, rows, tol=1e-5):
    """Row by row: the same expert set (or a near tie) and the same weight for each expert."""
    for t in rows:
        weights, ids = theirs[0][t], theirs[1][t]
        if set(ids.tolist()) != set(ours[1][t].tolist()):
            assert masked is not None and near_tie(masked[t], top_k), t
            continue
        mine = dict(zip(ours[1][t].tolist(), ours[0][t].tolist()))
        for i, w in zip(ids.tolist(), weights.tolist()):
            assert abs(mine[i] - w) <= tol * max(1.0, abs(w)), (t, i)


@pytest.mark.parametrize("n, scale, on_output", [(384, 2.5, True), (256, 1.5, False)])  # V4-Pro, V4-Flash
@pytest.mark.parametrize("m", [1, 5, 64])
def test_v4_sqrtsoftplus_jit_router_is_ours(n, scale, on_output, m, op_calls):
    """DeepSeek-V4's CUDA router call (biased_topk_jit_kernel_impl with sqrtsoftplus, a bf16
    bias as V4 stores it, the padded-row count moe_fused_gate takes): SGLang's torch router
    and the float64 formula on the live rows, weight 0 and id -1 on the padded ones."""
    g = torch.Generator().manual_seed(m + n)
    logits = torch.randn(m, n, generator=g) * 3
    bias = (torch.randn(n, generator=g) * 0.1).to(torch.bfloat16)
    live = max(1, m - 2)
    hidden = torch.randn(m, 16)
    ours = sgl_topk.biased_topk_jit_kernel_impl(hidden, logits, bias, 6, True, "sqrtsoftplus",
                                                routed_scaling_factor=scale, num_token_non_padded=torch.tensor(live),
                                                apply_routed_scaling_factor_on_output=on_output)
    assert op_calls == ["moe_routing"]
    assert ours[0].dtype == torch.float32 and ours[1].dtype == torch.int32 and ours[1].shape == (m, 6)
    theirs = sgl_topk.biased_topk_impl(hidden, logits, bias.float(), 6, True, "sqrtsoftplus", 0, scale, None, None,
                                       on_output)
    ref_w, ref_ids, masked, _ = reference_routing(logits, bias.float(), 6, 1, 1, True, scale if on_output else 1.0,
                                                  "sqrtsoftplus")
    _same_routing(ours, theirs, masked, 6, range(live))
    _same_routing(ours, (ref_w, ref_ids), masked, 6, range(live))
    assert (ours[1][live:] == -1).all() and (ours[0][live:] == 0).all()


def test_v4_routing_outside_our_semantics_is_sglangs():
    """V4.1's log1p numerics, fused shared-expert slots, a padded-row count with sigmoid
    (moe_fused_gate is not given one there): SGLang's own function."""
    called = []

    def original(*args, **kwargs):
        called.append(args)
        return "sglang"

    logits, bias = torch.randn(3, 256), torch.randn(256)
    jit = kimi_sglang.biased_topk_jit_kernel_impl
    assert jit(original, None, logits, bias, 6, True, "sqrtsoftplus", sqrtsoftplus_log1p=True) == "sglang"
    assert jit(original, None, logits, bias, 6, True, "sqrtsoftplus", 1) == "sglang"
    assert jit(original, None, logits, bias, 6, True, "sigmoid", num_token_non_padded=torch.tensor(2)) == "sglang"
    assert jit(original, None, logits, bias, 6, True, "softmax") == "sglang"
    assert len(called) == 4


def _hash_layer(n=256, vocab=1000, top_k=6, dtype=torch.int32, score_func="sqrtsoftplus", shared=0, seed=0):
    """What HashTopK._forward_torch reads of its module: the table [vocab, top_k] of distinct
    experts a token, the scoring, the slot counts."""
    g = torch.Generator().manual_seed(seed)
    table = torch.rand(vocab, n, generator=g).argsort(1)[:, :top_k].to(dtype)
    return types.SimpleNamespace(tid2eid=table, score_func=score_func, topk=top_k + shared,
                                 num_shared_topk_slots=shared, routed_scaling_factor=1.5, num_experts=n)


@pytest.mark.parametrize("table_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("m", [1, 9])
def test_v4_hash_layers_are_ours(table_dtype, m, op_calls):
    """DeepSeek-V4's hash-routed layers, both of HashTopK's paths (the fused hash_topk it calls
    on CUDA, its torch path elsewhere): ids tid2eid[input_ids] in the table's order, weights
    SGLang's torch path gives (sqrt(softplus) there, renormalized)."""
    from sglang.srt.layers.moe.hash_topk import HashTopK

    layer = _hash_layer(dtype=table_dtype, seed=m)
    g = torch.Generator().manual_seed(m)
    logits = torch.randn(m, 256, generator=g) * 3
    input_ids = torch.randint(0, 1000, (m,), generator=g)
    theirs = sglang_own(HashTopK._forward_torch)(layer, logits, input_ids)
    torch_path = HashTopK._forward_torch(layer, logits, input_ids)
    fused = kimi_sglang.fused_hash_topk(lambda *a: pytest.fail("SGLang's kernel ran"), logits, input_ids,
                                        layer.tid2eid, 0, 1.5, "sqrtsoftplus")
    assert op_calls == ["moe_routing", "moe_routing"]
    for weights, ids in (torch_path, fused):
        assert torch.equal(ids, theirs[1]) and ids.dtype == torch.int32
        torch.testing.assert_close(weights, theirs[0], rtol=1e-5, atol=1e-7)


def test_v4_hash_layers_outside_our_semantics_are_sglangs(op_calls):
    """A fused shared-expert slot (SGLang appends it with a random shared expert), softmax
    (SGLang does not renormalize it): SGLang's own code."""
    from sglang.srt.layers.moe.hash_topk import HashTopK

    logits, input_ids = torch.randn(2, 256), torch.tensor([3, 7])
    shared = _hash_layer(shared=1)
    ids = HashTopK._forward_torch(shared, logits, input_ids)[1]
    assert ids.shape == (2, 7) and (ids[:, -1] >= 256).all()
    HashTopK._forward_torch(_hash_layer(score_func="softmax"), logits, input_ids)
    assert kimi_sglang.fused_hash_topk(lambda *a: "sglang", logits, input_ids, shared.tid2eid, 1) == "sglang"
    assert op_calls == []


def attn_res_layers(h, eps=1e-6, seed=0):
    """Kimi-K3's score projection and norms as SGLang builds them, bf16 (the model's dtype)."""
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.layers.linear import ReplicatedLinear

    g = torch.Generator().manual_seed(seed)
    proj = ReplicatedLinear(h, 1, bias=False, params_dtype=torch.bfloat16)
    norms = [RMSNorm(h, eps=eps) for _ in range(2)]
    with torch.no_grad():
        proj.weight.copy_(torch.randn(1, h, generator=g) * 0.05)
        for norm in norms:
            norm.weight = torch.nn.Parameter((torch.rand(h, generator=g) + 0.5).to(torch.bfloat16), requires_grad=False)
    return proj, *norms


def attn_res_float64(prefix, bank, nvb, proj, score_norm, out_norm):
    """The aggregation's formula in float64: RMS-normed rows scored on norm ⊙ projection,
    softmax, mix, output RMSNorm."""
    rows = torch.cat([bank[:, :nvb], prefix.unsqueeze(1)], 1).double()
    cw = score_norm.weight.double() * proj.weight.double().reshape(-1)
    normed = rows * torch.rsqrt(rows.pow(2).mean(-1, keepdim=True) + score_norm.variance_epsilon)
    probs = (normed * cw).sum(-1).softmax(-1)
    mixed = (probs.unsqueeze(-1) * rows).sum(1)
    return mixed * torch.rsqrt(mixed.pow(2).mean(-1, keepdim=True) + out_norm.variance_epsilon) * out_norm.weight.double()


@pytest.mark.parametrize("m, nvb", [(1, 8), (5, 3), (40, 1)])
def test_k3_attn_res_is_ours(m, nvb, op_calls):
    """SGLang's _aggregate (as AttnResidual.forward calls it) runs kimi.attn_res: the float64
    formula within bf16 rounding."""
    from sglang.srt.layers import attn_residual

    h = 7168
    proj, score_norm, out_norm = attn_res_layers(h)
    g = torch.Generator().manual_seed(m)
    prefix = torch.randn(m, h, generator=g).to(torch.bfloat16)
    bank = torch.randn(m, 9, h, generator=g).to(torch.bfloat16)
    ours = attn_residual._aggregate(prefix, bank, nvb, proj, score_norm, out_norm)
    assert op_calls == ["attn_res"] and ours.dtype == torch.bfloat16 and ours.shape == (m, h)
    exact = attn_res_float64(prefix, bank, nvb, proj, score_norm, out_norm)
    torch.testing.assert_close(ours.double(), exact, rtol=2 ** -7, atol=1e-2)
    # SGLang's eager reference rounds the normed rows and the scores to bf16: ours is at least
    # as close to the formula as it is.
    theirs = out_norm(attn_residual.aggregate_stream_torch(prefix, bank, nvb, proj, score_norm))
    assert (ours.double() - exact).abs().max() <= (theirs.double() - exact).abs().max() + 1e-3


def test_k3_attn_res_outside_our_kernel_is_sglangs():
    called = []

    def original(*args):
        called.append(args)
        return "sglang"

    proj, score_norm, out_norm = attn_res_layers(64)
    prefix, bank = torch.randn(2, 64).to(torch.bfloat16), torch.randn(2, 20, 64).to(torch.bfloat16)
    cases = [dict(write_bank_row=True), dict(nvb=16), dict(prefix=prefix.float()), dict(h=60)]
    for case in cases:
        h = case.get("h", 64)
        p = case.get("prefix", prefix)[:, :h].contiguous()
        layers = attn_res_layers(h) if h != 64 else (proj, score_norm, out_norm)
        assert kimi_sglang.attn_res_aggregate(original, p, bank[:, :, :h].contiguous(), case.get("nvb", 3), *layers,
                                              case.get("write_bank_row", False)) == "sglang", case
    assert len(called) == len(cases)


def test_register_twice_registers_once():
    before = {t: len(HookRegistry._hooks[t]) for t in kimi_sglang._registered}
    assert kimi_sglang.register() == kimi_sglang.register()
    assert {t: len(HookRegistry._hooks[t]) for t in kimi_sglang._registered} == before


LOADER = (
    "import logging\n"
    "logging.basicConfig(level=logging.INFO)\n"
    "from sglang.srt.plugins import load_plugins\n"
    "load_plugins()\n"
    "from sglang.srt.models.deepseek_v2 import MoEGate\n"
    "from sglang.srt.layers.moe import topk\n"
    "from sglang.srt.layers import attn_residual\n"
    "print('gate', hasattr(MoEGate.forward, '__wrapped__'), 'routing', hasattr(topk.biased_grouped_topk, '__wrapped__'),\n"
    "      'attn_res', hasattr(attn_residual._aggregate, '__wrapped__'))\n"
)


def test_plugin_loads_through_sglangs_loader():
    """SGLang's loader finds the installed package's entry point and runs it, and importing
    the package imports no SGLang. (Two fresh processes, run side by side.)"""
    from importlib.metadata import entry_points

    if not any(ep.value.startswith("kimi_router_ops.") for ep in entry_points(group="sglang.srt.plugins")):
        pytest.skip("kimi_router_ops is not installed with its entry points here (a source checkout on PYTHONPATH)")
    env = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    bare = "import sys, kimi_router_ops, kimi_router_ops.integrations.sglang; print('sglang' in sys.modules)"
    runs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True) for code in (LOADER, bare)]
    (loaded, _), (bare, _) = (run.communicate(timeout=900) for run in runs)
    assert runs[0].returncode == 0 and "gate True routing True attn_res True" in loaded, loaded[-3000:]
    assert "kimi_router_ops: replaced MoEGate.forward" in loaded, loaded[-3000:]
    assert runs[1].returncode == 0 and bare.strip().endswith("False"), bare[-2000:]


def test_each_switch_leaves_its_part_to_sglang(monkeypatch):
    """register() under each switch replaces all but that part (what it returns is what it
    registers; the hooks this process registered already stay)."""
    parts = {"MoEGate.forward": kimi_sglang.ENV_GATE, "(routing: moe_routing)": kimi_sglang.ENV_ROUTING,
             "(hash routing: moe_routing)": kimi_sglang.ENV_ROUTING, "attention residual": kimi_sglang.ENV_ATTN_RES}
    for switch in (None, *SWITCHES):
        for name in SWITCHES:
            monkeypatch.delenv(name, raising=False)
        if switch:
            monkeypatch.setenv(switch, "0")
        replaced = " ".join(kimi_sglang.register())
        for what, own in parts.items():
            assert (what in replaced) == (switch not in (kimi_sglang.ENV_ALL, own)), (switch, what, replaced)
