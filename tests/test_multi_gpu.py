"""Inputs on a second GPU run there, whatever the current device is."""

import pytest
import torch

import kimi_router_ops
from conftest import random_bf16, reference, relative_error, requires_kernel_gpu

pytestmark = [
    requires_kernel_gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (fewer visible)"),
]


@pytest.mark.parametrize("m", [1, 2, 4, 16])
def test_inputs_on_cuda1_run_on_cuda1(m):
    x, w = random_bf16(m, 7168), random_bf16(896, 7168)
    torch.cuda.set_device(0)
    expected = kimi_router_ops.ll_bf16_gemm(x.to("cuda:0"), w.to("cuda:0"))
    out = kimi_router_ops.ll_bf16_gemm(x.to("cuda:1"), w.to("cuda:1"))
    assert out.device == torch.device("cuda:1")
    assert torch.cuda.current_device() == 0
    assert torch.equal(out.cpu(), expected.cpu())


def test_first_call_on_cuda1_inside_graph_capture():
    x, w = random_bf16(1, 7168, device="cuda:1"), random_bf16(256, 7168, device="cuda:1")
    with torch.cuda.device(1):
        graph = torch.cuda.CUDAGraph()
        # An explicit stream: torch.cuda.graph's default capture stream is created once per
        # process on the device current at first use, and later captures on cuda:0 need it there.
        with torch.cuda.graph(graph, stream=torch.cuda.Stream(device=1)):
            out = kimi_router_ops.ll_bf16_gemm(x, w)
        graph.replay()
        torch.cuda.synchronize()
    assert relative_error(out, reference(x, w)) <= 1e-5


def test_mixed_devices_is_an_error():
    with pytest.raises(RuntimeError, match="must be on the same device"):
        kimi_router_ops.ll_bf16_gemm(random_bf16(2, 64, device="cuda:0"), random_bf16(8, 64, device="cuda:1"))


@pytest.mark.parametrize("m", [1, 8, 16])
def test_router_and_norm_on_cuda1_run_on_cuda1(m):
    """The fused router (its handoff buffers are per device and stream) and the norm kernel, with
    inputs on the second GPU while the first is current: the same results on both."""
    x, residual, norm_weight = random_bf16(m, 7168), random_bf16(m, 7168), random_bf16(7168)
    w, bias = random_bf16(256, 7168, scale=0.02), torch.randn(256) * 0.05
    torch.cuda.set_device(0)
    outs = []
    for device in ("cuda:0", "cuda:1"):
        normed, summed = kimi_router_ops.fused_add_rms_norm(
            x.to(device), residual.to(device), norm_weight.to(device), 1e-6)
        routed = kimi_router_ops.ll_bf16_router(normed, w.to(device), bias.to(device), 8, 8, 4, True, 2.5)
        assert all(t.device == torch.device(device) for t in (normed, summed, *routed))
        outs.append([t.cpu() for t in (normed, summed, *routed)])
    assert torch.cuda.current_device() == 0
    assert all(torch.equal(a, b) for a, b in zip(*outs))
