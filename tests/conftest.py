import os

import pytest
import torch

import kimi_router_ops  # noqa: F401  (registers torch.ops.kimi)
from kimi_router_ops.bench import SHAPES
from kimi_router_ops.testing import dot_error, gemm_row_linked

# Kimi-K3, Kimi-K2, DeepSeek-V3 router shapes, (N experts, K hidden): the benchmark's table.
MODEL_SHAPES = SHAPES

HAS_CUDA = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (none visible)")
CUDA_BUILD = bool(kimi_router_ops.compiled_kernels())
requires_cuda_build = pytest.mark.skipif(
    not CUDA_BUILD, reason="_C was built without CUDA kernels (CPU-only torch)"
)


def kernel_gpu() -> bool:
    """True when the current GPU runs the CuTe DSL kernels (sm_90 or sm_100)."""
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor in (90, 100)


requires_kernel_gpu = pytest.mark.skipif(
    not (HAS_CUDA and CUDA_BUILD and kernel_gpu()),
    reason="needs an sm_90 or sm_100 GPU and a CUDA build of _C",
)


def gemm_rows(rows):
    """GEMM row names as test parameters; a lab row whose kernels this _C lacks is skipped,
    saying so."""
    from kimi_router_ops import tables

    return [pytest.param(row.name, marks=pytest.mark.skipif(
                row in tables.gemm.LAB_VARIANTS and not gemm_row_linked(row.name),
                reason="a lab row: _C was built without KIMI_ROUTER_OPS_LAB=1"))
            for row in rows]


def reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """float64 logits on the CPU: the ground truth every implementation is held to."""
    return x.double().cpu() @ w.double().cpu().t()


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.double().cpu()
    assert torch.isfinite(out).all(), "non-finite output"
    denom = ref.norm().item()
    return (out - ref).norm().item() / (denom if denom > 0 else 1.0)


def assert_gemm_close(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype):
    """fp32 out: each element within fp32 accumulation error of the float64 product, 1e-5
    of sum_k |x_k w_k| (the bound tools/sanitize.py holds every kernel to), which an output
    that nearly cancels does not break, unlike a norm ratio. bf16 out: the norm ratio of
    TOLERANCE (cuBLAS, the fallback, may reduce a bf16 GEMM in reduced precision)."""
    if out_dtype == torch.bfloat16:
        assert relative_error(out, reference(x, w)) <= TOLERANCE[torch.bfloat16]
    else:
        assert dot_error(out, x, w) <= 1e-5


# Tolerances on ||out - ref|| / ||ref||: fp32 accumulation of exact bf16 products lands near
# 1e-7; a bf16 output adds one rounding (relative 2^-9) per element.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 8e-3}


def random_bf16(*shape, scale=1.0, device="cpu", generator=None):
    return (torch.randn(*shape, generator=generator) * scale).to(torch.bfloat16).to(device)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(int(os.environ.get("KIMI_TEST_SEED", "0")))


def call_in(mode: str, op, *args):
    """op(*args) eagerly, or with mode "compiled" under torch.compile: the fake kernels give
    shapes only, so a bad call traces and the op raises its own message when the graph runs."""
    if mode != "compiled":
        return op(*args)
    torch.compiler.reset()  # each case compiles afresh (no recompile limit across cases)
    return torch.compile(lambda *a: op(*a), backend="eager", fullgraph=True)(*args)


def pytest_terminal_summary(terminalreporter):
    """The skipped tests' reasons, once each with a count (pytest -ra lists every test
    function that skipped: dozens of lines saying "no GPU")."""
    reasons = {}
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        reasons[reason] = reasons.get(reason, 0) + 1
    if reasons:
        terminalreporter.section("skipped, by reason")
        for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
            terminalreporter.line(f"{count:5d}  {reason}")
