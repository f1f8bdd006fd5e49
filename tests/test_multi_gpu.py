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


@pytest.mark.parametrize("m", [1, 8, 16, 40, 256])
def test_router_and_norm_on_cuda1_run_on_cuda1(m):
    """The router (fused up to 16 tokens, its handoff buffers per device and stream; the GEMM
    then the routing kernel above), the routing op and the norm kernel, with inputs on the
    second GPU while the first is current: the same results on both."""
    x, residual, norm_weight = random_bf16(m, 7168), random_bf16(m, 7168), random_bf16(7168)
    w, bias = random_bf16(256, 7168, scale=0.02), torch.randn(256) * 0.05
    torch.cuda.set_device(0)
    outs = []
    for device in ("cuda:0", "cuda:1"):
        normed, summed = kimi_router_ops.fused_add_rms_norm(
            x.to(device), residual.to(device), norm_weight.to(device), 1e-6)
        routed = kimi_router_ops.ll_bf16_router(normed, w.to(device), bias.to(device), 8, 8, 4, True, 2.5)
        alone = kimi_router_ops.moe_routing(routed[2], bias.to(device), 8, 8, 4, True, 2.5)
        assert all(t.device == torch.device(device) for t in (normed, summed, *routed, *alone))
        outs.append([t.cpu() for t in (normed, summed, *routed, *alone)])
    assert torch.cuda.current_device() == 0
    assert all(torch.equal(a, b) for a, b in zip(*outs))


@pytest.mark.parametrize("m", [4, 40])
def test_router_captured_on_cuda1(m):
    """The router's first call on cuda:1 inside a graph captured there (its handoff buffer is
    the captured call's own), replayed after an input update."""
    w, bias = random_bf16(384, 7168, scale=0.02, device="cuda:1"), torch.randn(384, device="cuda:1") * 0.05
    x = random_bf16(m, 7168, device="cuda:1")
    with torch.cuda.device(1):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=torch.cuda.Stream(device=1)):
            out = kimi_router_ops.ll_bf16_router(x, w, bias, 8)
        x.copy_(random_bf16(m, 7168, device="cuda:1"))
        graph.replay()
        torch.cuda.synchronize()
    expected = kimi_router_ops.ll_bf16_router(x, w, bias, 8)
    assert all(torch.equal(a, b) for a, b in zip(out, expected))


def test_two_gpus_route_at_the_same_time():
    """Both GPUs busy with the router at once (a stream each, no synchronization between them)
    give each its own right answers."""
    cases = []
    for device in ("cuda:0", "cuda:1"):
        x, w = random_bf16(16, 7168, device=device), random_bf16(896, 7168, scale=0.02, device=device)
        bias = torch.randn(896, device=device) * 0.05
        cases.append((x, w, bias, kimi_router_ops.ll_bf16_router(x, w, bias, 16)))
    torch.cuda.synchronize(0), torch.cuda.synchronize(1)
    streams = [torch.cuda.Stream(device=0), torch.cuda.Stream(device=1)]
    for _ in range(20):
        outs = []
        for stream, (x, w, bias, _) in zip(streams, cases):
            with torch.cuda.stream(stream):
                outs.append(kimi_router_ops.ll_bf16_router(x, w, bias, 16))
        torch.cuda.synchronize(0), torch.cuda.synchronize(1)
        for out, (_, _, _, expected) in zip(outs, cases):
            assert all(torch.equal(a, b) for a, b in zip(out, expected))
