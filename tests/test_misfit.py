"""The contract queries (routing_misfit, router_gemm_misfit, attn_res_kernel_misfit): each answers as the op it
describes does, so a caller that asks them (the engines' plugins) never restates a check."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kimi_router_ops
from kimi_router_ops import tables
from conftest import random_bf16, requires_kernel_gpu

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 48), top_k=st.integers(-1, 50), n_group=st.integers(0, 9), topk_group=st.integers(0, 10),
       scoring=st.sampled_from(["sigmoid", "softmax", "sqrtsoftplus", "relu"]), logits_dtype=st.sampled_from(DTYPES),
       bias_dtype=st.sampled_from((None, *DTYPES)))
def test_routing_misfit_is_moe_routings_error(n, top_k, n_group, topk_group, scoring, logits_dtype, bias_dtype):
    """"" exactly where moe_routing runs the problem; else the message it raises."""
    misfit = kimi_router_ops.routing_misfit(n, top_k, n_group, topk_group, scoring, logits_dtype, bias_dtype)
    logits = torch.randn(3, n).to(logits_dtype)
    bias = None if bias_dtype is None else torch.randn(n).to(bias_dtype)
    try:
        kimi_router_ops.moe_routing(logits, bias, top_k, n_group, topk_group, scoring=scoring)
    except RuntimeError as error:
        assert misfit and misfit in str(error)
    else:
        assert misfit == ""


@pytest.mark.parametrize("x_dtype", DTYPES)
@pytest.mark.parametrize("weight_dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("bias_dtype", (None, *DTYPES))
def test_router_gemm_misfit_is_router_gemms_error(x_dtype, weight_dtype, out_dtype, bias_dtype):
    """"" exactly where router_gemm takes the dtypes; else the message it raises."""
    misfit = kimi_router_ops.router_gemm_misfit(x_dtype, weight_dtype, out_dtype, bias_dtype)
    x, w = torch.randn(2, 16).to(x_dtype), torch.randn(8, 16).to(weight_dtype)
    bias = None if bias_dtype is None else torch.randn(8).to(bias_dtype)
    try:
        kimi_router_ops.router_gemm(x, w, bias, out_dtype)
    except RuntimeError as error:
        assert misfit and misfit in str(error)
    else:
        assert misfit == ""


def test_attn_res_kernel_misfit_names_the_kernels_range():
    kernel = tables.attn_res.ATTN_RES_KERNEL
    served = kimi_router_ops.attn_res_kernel_misfit
    assert served(7168, 8) == served(kernel.max_hidden, kernel.max_blocks) == served(8, 0) == ""
    assert served(7168, 8, 100) == ""
    assert "num_blocks" in served(7168, kernel.max_blocks + 1)
    for hidden in (0, 7164, kernel.max_hidden + 8):
        assert "H a multiple of 8" in served(hidden, 8)
    assert "sm_80" in served(7168, 8, 80)


def test_queries_are_constants_under_compile():
    """A plugin's choice inside a compiled graph: no graph break, the answer baked in."""
    def choose(logits, bias):
        if kimi_router_ops.routing_misfit(logits.shape[-1], 8, 8, 4, "sigmoid", logits.dtype, bias.dtype):
            return logits * 0
        return logits + (1 if kimi_router_ops.attn_res_kernel_misfit(logits.shape[-1] * 28, 8) == "" else 2)

    logits, bias = torch.randn(4, 256), torch.randn(256)
    compiled = torch.compile(choose, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(logits, bias), logits + 1)
    tokens = torch.randn(6, 256)
    torch._dynamo.mark_dynamic(tokens, 0)  # M dynamic, as engines compile; N and H static
    torch.testing.assert_close(compiled(tokens, bias), tokens + 1)
    with torch._dynamo.config.patch(automatic_dynamic_shapes=False):  # another N: a new, static trace
        torch.testing.assert_close(compiled(logits[:, :255], bias[:255]), logits[:, :255] * 0)


@requires_kernel_gpu
@pytest.mark.parametrize("hidden, num_blocks", [(7168, 8), (7168, 15), (7168, 16), (1028, 2), (8192, 1), (8200, 1)])
def test_attn_res_kernel_misfit_is_the_dispatch(hidden, num_blocks):
    """Where the query says the kernel serves, the op is one launch (its kernel); elsewhere
    the reference's several ATen kernels run."""
    m, r = 2, max(num_blocks, 1)
    args = (random_bf16(m, hidden, device="cuda"), None, random_bf16(m, r, hidden, device="cuda"),
            random_bf16(hidden, device="cuda"), random_bf16(hidden, device="cuda"), None, num_blocks, -1, 1e-6, 1e-6)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        kimi_router_ops.attn_res(*args)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    major, minor = torch.cuda.get_device_capability()
    assert (len(kernels) == 1) == (kimi_router_ops.attn_res_kernel_misfit(hidden, num_blocks, major * 10 + minor) == ""), kernels
