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
