"""Batch-invariant mode (kimi_router_ops.set_batch_invariant): row m of every op's outputs is,
bit for bit, what the same token gives routed alone (M = 1), for any M (a hypothesis
property on the CPU and the GPU), on the kernels, cuBLAS and the reference; the routing
alone is batch-invariant in either mode; the mode's tables sum as M = 1's (the same kernel
parameters, one token a CTA)."""

import os
from contextlib import contextmanager
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kimi_router_ops
from kimi_router_ops import tables
from conftest import HAS_CUDA
from test_moe_routing import make_logits
from test_router import make_case

DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
# (N, K, top_k, n_group, topk_group, scoring): DeepSeek-V3, Kimi-K3, Qwen3-MoE-like softmax, an
# odd K (scalar loads on a GPU) and a size no kernel takes (cuBLAS).
PROBLEMS = [(256, 7168, 8, 8, 4, "sigmoid"), (896, 7168, 16, 1, 1, "sigmoid"), (128, 2048, 8, 1, 1, "softmax"),
            (64, 1001, 6, 1, 1, "sigmoid")]


@contextmanager
def batch_invariant_mode(enabled=True):
    previous = kimi_router_ops.set_batch_invariant(enabled)
    try:
        yield
    finally:
        kimi_router_ops.set_batch_invariant(previous)


def rows_to_check(m):
    return sorted({0, m // 3, m // 2, m - 1})


def assert_rows_alone(op, x, *args):
    """op(x, *args)'s outputs, row by row, against op(x[i:i+1], *args)."""
    together = op(x, *args)
    together = together if isinstance(together, tuple) else (together,)
    for i in rows_to_check(x.shape[0]):
        alone = op(x[i:i + 1], *args)
        alone = alone if isinstance(alone, tuple) else (alone,)
        for a, b in zip(together, alone):
            assert torch.equal(a[i:i + 1], b), (op, x.shape, i)


@settings(max_examples=12, deadline=None)
@given(problem=st.sampled_from(PROBLEMS), m=st.integers(1, 256), fp32_gate=st.booleans(), seed=st.integers(0, 99))
@pytest.mark.parametrize("device", DEVICES)
def test_every_op_is_batch_invariant(device, problem, m, fp32_gate, seed):
    with batch_invariant_mode():
        check_every_op(device, problem, m, fp32_gate, seed)


def check_every_op(device, problem, m, fp32_gate, seed):
    n, k, top_k, n_group, topk_group, scoring = problem
    x, w, bias = make_case(m, n, k, top_k, n_group, topk_group, device=device, seed=seed)
    if fp32_gate:
        w = w.float()
    gate_bias = torch.randn(n, device=device).to(w.dtype) * 0.01
    assert_rows_alone(kimi_router_ops.router_gemm, x, w, gate_bias)
    assert_rows_alone(kimi_router_ops.router, x, w, bias, top_k, n_group, topk_group, True, 2.5, scoring, gate_bias)
    if not fp32_gate:
        assert_rows_alone(kimi_router_ops.ll_bf16_gemm, x, w)
        assert_rows_alone(kimi_router_ops.ll_bf16_gemm, x, w, torch.bfloat16)
        assert_rows_alone(kimi_router_ops.ll_bf16_router, x, w, bias, top_k, n_group, topk_group, True, 2.5, scoring)
        p = w[: max(8, n // 4)].contiguous()
        assert_rows_alone(kimi_router_ops.router_and_projection, x, w, p, bias, top_k, n_group, topk_group)


@settings(max_examples=12, deadline=None)
@given(problem=st.sampled_from(PROBLEMS), m=st.integers(1, 256), seed=st.integers(0, 99))
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", [False, True])
def test_routing_is_batch_invariant_in_either_mode(device, mode, problem, m, seed):
    n, _, top_k, n_group, topk_group, scoring = problem
    logits, bias = make_logits(m, n, device=device, seed=seed)
    with batch_invariant_mode(mode):
        assert_rows_alone(kimi_router_ops.moe_routing, logits, bias, top_k, n_group, topk_group, True, 2.5, scoring)


def test_the_tables_sum_as_m1_does():
    """For every problem CHOICES gives an M = 1 kernel, BATCH_INVARIANT_CHOICES gives its
    token-tiled twin: the same parameters but for the tiles, the experts a CTA of the dot
    product and whether K is compiled in (each expert's sum is its own, in the same order), so
    the same sums (test_every_op_is_batch_invariant checks the bits)."""
    with batch_invariant_mode(False):
        for weight_dtype in (torch.bfloat16, torch.float32):
            for n in (8, 64, 256, 384, 896, 1024, 4096):
                for k in (256, 1024, 2048, 4096, 4100, 7168, 8192, 16384):
                    for aligned in (True, False):
                        args = (1, n, k, torch.float32, 90, aligned, weight_dtype)
                        default = kimi_router_ops.chosen_variant(*args)
                        kimi_router_ops.set_batch_invariant(True)
                        twin = kimi_router_ops.chosen_variant(*args)
                        kimi_router_ops.set_batch_invariant(False)
                        if default == "cublas":
                            assert twin == "cublas", args
                            continue
                        (name, vec), (twin_name, twin_vec) = default.split(":"), twin.split(":")
                        row, twin_row = tables.gemm.variant(name), tables.gemm.variant(twin_name)
                        assert vec == twin_vec and twin_row.kernel.token_tiles, (args, default, twin)
                        rows = dict(rows_per_cta=row.kernel.rows_per_cta, k=row.kernel.k) if hasattr(row.kernel, "k") else {}
                        assert replace(twin_row.kernel, token_tiles=row.kernel.token_tiles, **rows) == row.kernel, args


def test_the_mode_and_what_it_runs():
    with batch_invariant_mode():
        check_the_mode()


def check_the_mode():
    assert kimi_router_ops.is_batch_invariant()
    assert kimi_router_ops.chosen_variant(16, 896, 7168) == "m1_prefetch_r1_t128_k7168_tiles:vec8"
    assert kimi_router_ops.chosen_router_variant(1, 256, 7168, 8, 8, 4) == "gemm+moe_routing"
    assert kimi_router_ops.set_batch_invariant(False) is True
    assert not kimi_router_ops.is_batch_invariant()
    assert kimi_router_ops.chosen_variant(16, 896, 7168) != "m1_prefetch_r1_t128_k7168_tiles:vec8"


def test_environment_turns_it_on_at_import():
    code = "import kimi_router_ops; print(kimi_router_ops.is_batch_invariant())"
    for value, expected in (("1", "True"), ("0", "False")):
        env = {**os.environ, "KIMI_ROUTER_OPS_BATCH_INVARIANT": value}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == expected
