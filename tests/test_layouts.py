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
    """(op, args) for every op, with the layout's hidden states, logits or norm input."""
    x = layouts(5, 64, torch.bfloat16, device)[layout]
    w = layouts(16, 64, torch.bfloat16, device)[layout]
    logits = layouts(5, 16, torch.float32, device)[layout]
    bias = torch.randn(32, device=device)[::2]  # strided
    residual = layouts(5, 64, torch.bfloat16, device)["offset"]
    weight = random_bf16(128, device=device)[::2]
    return {
        "ll_bf16_gemm": (torch.ops.kimi.ll_bf16_gemm.default, (x, w, torch.float32)),
        "ll_bf16_router": (torch.ops.kimi.ll_bf16_router.default, (x, w, bias, 4, 4, 2, True, 2.5)),
        "router_and_projection": (torch.ops.kimi.router_and_projection.default,
                                  (x, w, layouts(24, 64, torch.bfloat16, device)[layout], bias, 4, 4, 2, True, 2.5)),
        "moe_routing": (torch.ops.kimi.moe_routing.default, (logits, bias, 4, 4, 2, True, 2.5)),
        "rms_norm": (torch.ops.kimi.rms_norm.default, (x, weight, 1e-6)),
        "fused_add_rms_norm": (torch.ops.kimi.fused_add_rms_norm.default, (x, residual, weight, 1e-6)),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["transposed", "offset", "expanded"])
@pytest.mark.parametrize("op", ["ll_bf16_gemm", "ll_bf16_router", "router_and_projection", "moe_routing", "rms_norm",
                                "fused_add_rms_norm"])
def test_opcheck(device, layout, op):
    fn, args = ops_on(layout, device)[op]
    torch.library.opcheck(fn, args)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["transposed", "offset"])
@pytest.mark.parametrize("op", ["ll_bf16_gemm", "ll_bf16_router", "router_and_projection", "moe_routing", "rms_norm",
                                "fused_add_rms_norm"])
def test_compile_parity(device, layout, op):
    torch._dynamo.reset()
    fn, args = ops_on(layout, device)[op]
    compiled = torch.compile(lambda *a: fn(*a), fullgraph=True)
    eager, traced = fn(*args), compiled(*args)
    for a, b in zip(eager if isinstance(eager, tuple) else (eager,), traced if isinstance(traced, tuple) else (traced,)):
        assert torch.equal(a, b)
        assert a.stride() == b.stride()
