"""attn_res (Kimi-K3's attention residual): the formula in float64, its writes into prefix
and blocks, every flag, the kernel's fallbacks, opcheck with the mutations, torch.compile,
CUDA graphs, streams and bad input (clear errors, nothing written)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kimi_router_ops
from conftest import HAS_CUDA, random_bf16, requires_kernel_gpu

DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
H = 7168  # Kimi-K3's hidden size
EPS = 1e-6


def make_inputs(m, h, r, *, delta=True, output_norm=True, device="cpu", scale=1.0, generator=None):
    bf = lambda *s: random_bf16(*s, scale=scale, device=device, generator=generator)  # noqa: E731
    weight = lambda: (torch.rand(h, generator=generator) + 0.5).to(torch.bfloat16).to(device)  # noqa: E731
    return dict(
        prefix=bf(m, h), delta=bf(m, h) if delta else None, blocks=bf(m, r, h), norm_weight=weight(),
        qk_weight=bf(h), output_norm_weight=weight() if output_norm else None,
    )


def call(inputs, num_blocks, block_write_idx, eps=EPS, output_norm_eps=EPS):
    i = inputs
    return kimi_router_ops.attn_res(i["prefix"], i["delta"], i["blocks"], i["norm_weight"], i["qk_weight"],
                                    i["output_norm_weight"], num_blocks, block_write_idx, eps, output_norm_eps)


def clone(inputs):
    return {k: None if v is None else v.clone() for k, v in inputs.items()}


def formula(inputs, num_blocks, block_write_idx, eps=EPS, output_norm_eps=EPS):
    """The documented formula in float64 (p rounded to bf16 once, the output not rounded).
    Returns (out, p, tolerance): the tolerance is one bf16 rounding of out plus what fp32
    sums of the logits may carry into the mix (a few ulps of sum_i |v_i wq_i| each,
    amplified by how far the sources lie from the mix) and through the output norm."""
    d = {k: None if v is None else v.double().cpu() for k, v in inputs.items()}
    p = d["prefix"] if d["delta"] is None else (d["prefix"] + d["delta"]).to(torch.bfloat16).double()
    blocks = d["blocks"].clone()
    if block_write_idx >= 0:
        blocks[:, block_write_idx] = p
    logit_carry = torch.zeros_like(p)
    if num_blocks == 0:
        mixed = p
    else:
        v = torch.cat([blocks[:, :num_blocks], p[:, None]], dim=1)  # [M, S, H]
        wq = d["norm_weight"] * d["qk_weight"]
        r = torch.rsqrt(v.square().mean(-1) + eps)
        weights = torch.softmax((v * wq).sum(-1) * r, dim=1)[..., None]
        mixed = (weights * v).sum(1)
        logit_error = 2.0**-20 * ((v * wq).abs().sum(-1) * r)[..., None]  # [M, S, 1]
        logit_carry = (weights * (v - mixed[:, None]).abs() * logit_error).sum(1)
    if d["output_norm_weight"] is not None:
        scale = torch.rsqrt(mixed.square().mean(-1, keepdim=True) + output_norm_eps) * d["output_norm_weight"]
        mixed, logit_carry = mixed * scale, logit_carry * scale.abs() * 2
    rms = mixed.square().mean().sqrt().item() if mixed.numel() else 0.0
    return mixed, p.to(torch.bfloat16), 2.0**-8 * mixed.abs() + 1e-5 * rms + logit_carry


def assert_close(out, ref, tolerance):
    assert out.dtype == torch.bfloat16
    out = out.double().cpu()
    assert torch.isfinite(out).all()
    excess = (out - ref).abs() - tolerance
    assert (excess <= 0).all(), f"max excess {excess.max().item()}"


def check(inputs, num_blocks, block_write_idx, eps=EPS, output_norm_eps=EPS, call=call):
    """Runs `call` (the op) on a copy of inputs; checks the output and both writes."""
    ref, p, tolerance = formula(inputs, num_blocks, block_write_idx, eps, output_norm_eps)
    run = clone(inputs)
    out = call(run, num_blocks, block_write_idx, eps, output_norm_eps)
    assert out.shape == inputs["prefix"].shape and out.device == inputs["prefix"].device
    assert out.is_contiguous()
    assert_close(out, ref, tolerance)
    expected_prefix = p if inputs["delta"] is not None else inputs["prefix"].cpu()
    assert torch.equal(run["prefix"].cpu(), expected_prefix)
    expected_blocks = inputs["blocks"].clone().cpu()
    if block_write_idx >= 0:
        expected_blocks[:, block_write_idx] = p
    assert torch.equal(run["blocks"].cpu(), expected_blocks)
    return out


# (num_blocks, block_write_idx): K3's layers write the next block (idx == num_blocks) or none;
# a write into a source (idx < num_blocks) makes that source p.
CASES = [(0, -1), (0, 0), (1, -1), (2, 2), (8, -1), (8, 8), (8, 3), (15, -1), (15, 15)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_blocks,block_write_idx", CASES)
@pytest.mark.parametrize("delta,output_norm", [(True, True), (False, True), (True, False), (False, False)])
def test_model_shape(device, num_blocks, block_write_idx, delta, output_norm):
    inputs = make_inputs(3, H, 16, delta=delta, output_norm=output_norm, device=device)
    check(inputs, num_blocks, block_write_idx)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [0, 1, 2, 16, 17, 256, 300])
def test_token_counts(device, m):
    check(make_inputs(m, H, 9, device=device), 8, -1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("h", [8, 64, 1000, 4096, 8192, 100, 8200])
def test_hidden_sizes(device, h):
    """The kernel's range (H % 8 == 0, H <= 8192) and both sides of it."""
    check(make_inputs(4, h, 3, device=device), 2, 2)


@settings(max_examples=60, deadline=None)
@given(m=st.integers(0, 6), h=st.integers(1, 600), r=st.integers(0, 18), data=st.data(),
       delta=st.booleans(), output_norm=st.booleans(), scale=st.floats(1e-2, 1e2),
       eps=st.sampled_from([1e-6, 1e-5, 0.0]), seed=st.integers(0, 2**31 - 1))
def test_property(m, h, r, data, delta, output_norm, scale, eps, seed):
    h = data.draw(st.sampled_from([h, 8 * (h // 8 + 1)]))  # the kernel's H and the others
    num_blocks = data.draw(st.integers(0, r))
    block_write_idx = data.draw(st.integers(-1, r - 1))
    g = torch.Generator().manual_seed(seed)
    inputs = make_inputs(m, h, r, delta=delta, output_norm=output_norm, scale=scale, generator=g)
    for device in DEVICES:
        check({k: None if v is None else v.to(device) for k, v in inputs.items()}, num_blocks, block_write_idx,
              eps, 1e-5)


@requires_kernel_gpu
def test_gpu_matches_cpu_and_repeats():
    inputs = make_inputs(5, H, 10)
    ref, _, tolerance = formula(inputs, 9, 9)
    cpu = call(clone(inputs), 9, 9)
    gpu_inputs = {k: v.cuda() for k, v in inputs.items()}
    first = call(clone(gpu_inputs), 9, 9)
    assert_close(first, ref, tolerance)
    # The kernel's fp32 sums differ from the CPU's in order only: apart by a bf16 rounding at
    # most, or fp32 noise against the row's size where the mix cancels.
    diff = (first.cpu().double() - cpu.double()).abs()
    assert (diff <= 2.0**-7 * cpu.double().abs() + 1e-4 * ref.square().mean().sqrt()).all()
    for _ in range(3):
        assert torch.equal(call(clone(gpu_inputs), 9, 9), first)


@requires_kernel_gpu
def test_strided_and_misaligned_inputs():
    """Row strides, a blocks slice of a larger buffer, unaligned views (the reference path)."""
    base = make_inputs(4, H + 8, 12, device="cuda")
    inputs = dict(base, prefix=base["prefix"][:, 8:], delta=base["delta"][:, :H], blocks=base["blocks"][:, 2:11, 8:],
                  norm_weight=base["norm_weight"][:H], qk_weight=base["qk_weight"][8:],
                  output_norm_weight=torch.stack([base["output_norm_weight"][:H]] * 2, 1)[:, 0])
    check(inputs, 8, 8)
    odd = dict(base, prefix=base["prefix"][:, 1:H + 1], delta=base["delta"][:, 3:H + 3],
               blocks=base["blocks"][:, :, 1:H + 1], norm_weight=base["norm_weight"][:H],
               qk_weight=base["qk_weight"][:H], output_norm_weight=base["output_norm_weight"][:H])
    check(odd, 8, -1)


@requires_kernel_gpu
def test_side_stream_and_cuda_graph():
    inputs = make_inputs(2, H, 9, device="cuda")
    expected = call(clone(inputs), 8, -1)
    stream = torch.cuda.Stream()
    run = clone(inputs)
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = call(run, 8, -1)
    torch.cuda.current_stream().wait_stream(stream)
    assert torch.equal(out, expected)

    graph_inputs = clone(inputs)
    call(clone(inputs), 8, -1)  # load outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call(graph_inputs, 8, -1)
    for src in (inputs, make_inputs(2, H, 9, device="cuda")):
        for k, v in src.items():
            graph_inputs[k].copy_(v)
        graph.replay()
        ref = clone(src)
        assert torch.equal(captured, call(ref, 8, -1))
        assert torch.equal(graph_inputs["prefix"], ref["prefix"])


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_with_mutations(device):
    for m, h, r, nb, idx, delta, norm in [(1, H, 9, 8, -1, True, True), (3, 100, 4, 2, 2, True, False),
                                           (2, 64, 3, 3, 1, False, True), (0, 16, 2, 1, -1, True, True)]:
        i = make_inputs(m, h, r, delta=delta, output_norm=norm, device=device)
        torch.library.opcheck(
            torch.ops.kimi.attn_res.default,
            (i["prefix"], i["delta"], i["blocks"], i["norm_weight"], i["qk_weight"], i["output_norm_weight"],
             nb, idx, EPS, EPS),
        )


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_dynamic_parity(device):
    torch._dynamo.reset()

    def layer(prefix, delta, blocks, norm_weight, qk_weight, output_norm_weight):
        out = kimi_router_ops.attn_res(prefix, delta, blocks, norm_weight, qk_weight, output_norm_weight,
                                       3, 3, EPS, EPS)
        return out.float().sum(-1)

    compiled = torch.compile(layer, fullgraph=True, dynamic=True)
    for m in (1, 3, 2):
        inputs = make_inputs(m, 512, 5, device=device)
        a, b = clone(inputs), clone(inputs)
        assert torch.equal(compiled(**a), layer(**b))
        assert torch.equal(a["prefix"], b["prefix"]) and torch.equal(a["blocks"], b["blocks"])


@pytest.mark.parametrize("device", DEVICES)
def test_no_derivative(device):
    inputs = make_inputs(2, 64, 2, device=device)
    inputs["qk_weight"].requires_grad_()
    out = call(inputs, 1, -1)
    assert not out.requires_grad


def bad_calls(device):
    i = make_inputs(2, 64, 4, device=device)
    bf = lambda *s: random_bf16(*s, device=device)  # noqa: E731
    cases = {
        "prefix float32": (dict(prefix=i["prefix"].float()), 2, -1, "prefix must be torch.bfloat16, got torch.float32"),
        "prefix 1-D": (dict(prefix=bf(64)), 2, -1, r"prefix must be 2-D \[M, H\]"),
        "H zero": (dict(prefix=bf(2, 0), delta=None, blocks=bf(2, 4, 0), norm_weight=bf(0), qk_weight=bf(0),
                        output_norm_weight=None), 2, -1, "H must be at least 1"),
        "prefix strided": (dict(prefix=bf(64, 2).t()), 2, -1, "prefix must have stride 1 along its last dimension"),
        "delta float32": (dict(delta=i["delta"].float()), 2, -1, "delta must be torch.bfloat16"),
        "delta shape": (dict(delta=bf(3, 64)), 2, -1, r"delta must have the shape of prefix \[2, 64\], got \[3, 64\]"),
        "blocks 2-D": (dict(blocks=bf(2, 64)), 2, -1, r"blocks must have shape \[M, R, H\]=\[2, R, 64\]"),
        "blocks H": (dict(blocks=bf(2, 4, 32)), 2, -1, "blocks must have shape"),
        "blocks M": (dict(blocks=bf(1, 4, 64)), 0, -1, "blocks must have shape"),
        "blocks float16": (dict(blocks=i["blocks"].half()), 2, -1, "blocks must be torch.bfloat16, got torch.float16"),
        "blocks strided": (dict(blocks=bf(2, 64, 4).transpose(1, 2)), 2, -1, "blocks must have stride 1"),
        "norm_weight length": (dict(norm_weight=bf(63)), 2, -1, r"norm_weight must have shape \[H\]=\[64\], got \[63\]"),
        "qk_weight float32": (dict(qk_weight=i["qk_weight"].float()), 2, -1, "qk_weight must be torch.bfloat16"),
        "output_norm_weight 2-D": (dict(output_norm_weight=bf(1, 64)), 2, -1, "output_norm_weight must have shape"),
        "num_blocks > R": ({}, 5, -1, r"num_blocks must be in \[0, R\] = \[0, 4\], got 5"),
        "num_blocks negative": ({}, -1, -1, "num_blocks must be in"),
        "block_write_idx = R": ({}, 2, 4, r"block_write_idx must be -1 or in \[0, R\) = \[0, 4\), got 4"),
        "block_write_idx < -1": ({}, 2, -2, "block_write_idx must be -1 or in"),
        "eps negative": ({}, 2, -1, "eps must be finite and >= 0, got -1"),
    }
    if device == "cuda":
        cases["blocks on the CPU"] = (dict(blocks=i["blocks"].cpu()), 2, -1, "prefix and blocks must be on the same device")
        cases["qk_weight on the CPU"] = (dict(qk_weight=i["qk_weight"].cpu()), 2, -1, "prefix and qk_weight must be on")
    return i, cases


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs_raise_and_write_nothing(device):
    base, cases = bad_calls(device)
    for name, (changes, num_blocks, block_write_idx, message) in cases.items():
        inputs = clone(base)
        inputs.update(changes)
        before = clone(inputs)
        eps = -1.0 if name == "eps negative" else EPS
        with pytest.raises(RuntimeError, match=message):
            call(inputs, num_blocks, block_write_idx, eps=eps)
        for k, v in inputs.items():
            if v is not None:
                assert torch.equal(v, before[k]), (name, k)
    # The process and the device stay usable.
    check(make_inputs(2, 64, 4, device=device), 4, -1)
