"""Every op on non-contiguous, offset and expanded inputs: opcheck (the fake kernel's
strides and shapes against the real ones) and torch.compile parity."""

import pytest
import torch

import kimi_router_ops
from conftest import HAS_CUDA, random_bf16

DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])


def layouts(rows, cols, dtype, device):
    """[rows, cols] tensors of `dtype`: transposed (column-major), a view at an offset with a
    row stride of cols + 3, and rows expanded from one (stride 0)."""
    def make(*shape):
        return (torch.randn(*shape) * 2).to(dtype).to(device)

    return {
        "transposed": make(cols, rows).t(),
        "offset": make(rows + 1, cols + 3)[1:, 2:cols + 2],
        "expanded": make(1, cols).expand(rows, cols),
    }


def ops_on(layout, device):
    """(op, args, kwargs) for every op with tensor arguments (kimi_router_ops.ops.OPS), with
    the layout's hidden states, weights or logits; the outputs an op writes are fresh,
    contiguous ones (their strides are the op's contract, not a layout). A new op gets its
    sample call here: test_every_op_has_a_sample_call fails until it does."""
    x = layouts(5, 64, torch.bfloat16, device)[layout]
    w = layouts(16, 64, torch.bfloat16, device)[layout]
    logits = layouts(5, 16, torch.float32, device)[layout]
    bias = torch.randn(32, device=device)[::2]  # strided
    residual = layouts(5, 64, torch.bfloat16, device)["offset"]
    weight = random_bf16(128, device=device)[::2]
    routing = (bias, 4, 4, 2, True, 2.5)
    f32_w = layouts(16, 64, torch.float32, device)[layout]
    gate_bias = torch.randn(32, device=device)[::2]
    blocks = random_bf16(5, 3, 64, device=device)

    def outputs(width, logits_too=False):
        out = dict(topk_weights=torch.empty(5, width, device=device),
                   topk_ids=torch.empty(5, width, dtype=torch.int64, device=device),
                   expert_counts=torch.zeros(16 + width - 4, dtype=torch.int32, device=device))
        if logits_too:
            out["logits"] = torch.empty(5, 16, device=device)
        return out

    calls = {
        "ll_bf16_gemm": ((x, w, torch.float32), {}),
        "router_gemm": ((x, f32_w, gate_bias, torch.float32), {}),
        "router_gemm_with_variant": ((x, w, "cublas", torch.float32), {}),
        "ll_bf16_router": ((x, w, *routing), {}),
        "router": ((x, f32_w, *routing, "sigmoid", gate_bias), {}),
        # A named fused row must serve the call (16-byte rows): the one the dispatch picks.
        "router_with_variant": ((x.contiguous(), w.contiguous(), *routing,
                                 kimi_router_ops.chosen_router_variant(5, 16, 64, 4, 4, 2)), {}),
        "router_and_projection": ((x, w, layouts(24, 64, torch.bfloat16, device)[layout], *routing), {}),
        "router_out": ((x, w, *routing), outputs(4, logits_too=True)),
        "moe_routing": ((logits, *routing), {}),
        "moe_routing_out": ((logits, *routing), dict(outputs(5), num_fused_shared_experts=1)),
        "rms_norm": ((x, weight, 1e-6), {}),
        "fused_add_rms_norm": ((x, residual, weight, 1e-6), {}),
        "rms_norm_router": ((x, weight, 1e-6, w, *routing), {}),
        "fused_add_rms_norm_router": ((x, residual, weight, 1e-6, f32_w, *routing, "sigmoid", gate_bias), {}),
        # Its tensors need a unit stride along H (the contract): an offset view as the delta.
        "attn_res": ((random_bf16(5, 64, device=device), residual, blocks, weight, weight, weight, 2, 2, 1e-6,
                      1e-6), {}),
        "attn_res_router": ((random_bf16(5, 64, device=device), residual, blocks.clone(), weight, weight, None, 3, -1,
                             1e-6, 1e-6, w, *routing), {}),
    }
    return {name: (getattr(torch.ops.kimi, name).default, *call) for name, call in calls.items()}


TENSOR_OPS = [record.schema for record in kimi_router_ops.ops.OPS.values() if record.fake is not None]


def test_every_op_has_a_sample_call():
    assert sorted(ops_on("offset", "cpu")) == sorted(TENSOR_OPS)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["transposed", "offset", "expanded"])
@pytest.mark.parametrize("op", TENSOR_OPS)
def test_opcheck(device, layout, op):
    fn, args, kwargs = ops_on(layout, device)[op]
    torch.library.opcheck(fn, args, kwargs)


def written(args, kwargs, result):
    """What a call produced: its result and every tensor it may write (the _out ops' outputs,
    attn_res's prefix and blocks)."""
    results = result if isinstance(result, tuple) else (result,)
    return [t for t in (*results, *args, *kwargs.values()) if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["transposed", "offset"])
@pytest.mark.parametrize("op", TENSOR_OPS)
def test_compile_parity(device, layout, op):
    torch._dynamo.reset()
    torch.manual_seed(0)
    fn, args, kwargs = ops_on(layout, device)[op]
    eager = written(args, kwargs, fn(*args, **kwargs))
    torch.manual_seed(0)
    fn, args, kwargs = ops_on(layout, device)[op]  # the same inputs, fresh outputs
    compiled = torch.compile(lambda *a, **k: fn(*a, **k), fullgraph=True)
    traced = written(args, kwargs, compiled(*args, **kwargs))
    assert len(eager) == len(traced)
    for a, b in zip(eager, traced):
        assert torch.equal(a, b)
        assert a.stride() == b.stride()
