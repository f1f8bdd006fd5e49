"""Bad input gets a clear error naming the argument; the next valid call still works."""

import pytest
import torch

import kimi_router_ops
from conftest import HAS_CUDA, call_in, random_bf16, reference, relative_error, requires_cuda

DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])


def bad_calls(device):
    bf = lambda *s: random_bf16(*s, device=device)  # noqa: E731
    return {
        "x float32": ((bf(2, 64).float(), bf(8, 64)), RuntimeError, "hidden_states must be torch.bfloat16, got torch.float32"),
        "x float16": ((bf(2, 64).half(), bf(8, 64)), RuntimeError, "hidden_states must be torch.bfloat16"),
        "w float32": ((bf(2, 64), bf(8, 64).float()), RuntimeError, "router_weight must be torch.bfloat16, got torch.float32"),
        "w int8": ((bf(2, 64), torch.zeros(8, 64, dtype=torch.int8, device=device)), RuntimeError, "router_weight must be torch.bfloat16"),
        "x 1-D": ((bf(64), bf(8, 64)), RuntimeError, "hidden_states must be 2-D"),
        "x 3-D": ((bf(1, 2, 64), bf(8, 64)), RuntimeError, "hidden_states must be 2-D"),
        "w 1-D": ((bf(2, 64), bf(64)), RuntimeError, "router_weight must be 2-D"),
        "w 3-D": ((bf(2, 64), bf(2, 8, 64)), RuntimeError, "router_weight must be 2-D"),
        "K mismatch": ((bf(2, 64), bf(8, 63)), RuntimeError, "must have the same K"),
        "K zero": ((bf(2, 0), bf(8, 0)), RuntimeError, "K must be at least 1"),
        "N zero": ((bf(2, 64), bf(0, 64)), RuntimeError, "N >= 1"),
        "out int32": ((bf(2, 64), bf(8, 64), torch.int32), RuntimeError, "out_dtype must be torch.float32 or torch.bfloat16, got torch.int32"),
        "out float16": ((bf(2, 64), bf(8, 64), torch.float16), RuntimeError, "out_dtype must be torch.float32 or torch.bfloat16"),
        "out float64": ((bf(2, 64), bf(8, 64), torch.float64), RuntimeError, "out_dtype must be"),
        "out bool": ((bf(2, 64), bf(8, 64), torch.bool), RuntimeError, "out_dtype must be"),
        "out complex64": ((bf(2, 64), bf(8, 64), torch.complex64), RuntimeError, "out_dtype must be"),
        "x int32": ((torch.ones(2, 64, dtype=torch.int32, device=device), bf(8, 64)), RuntimeError, "hidden_states must be torch.bfloat16, got torch.int32"),
        "x bool": ((torch.ones(2, 64, dtype=torch.bool, device=device), bf(8, 64)), RuntimeError, "hidden_states must be torch.bfloat16"),
        "w float64": ((bf(2, 64), bf(8, 64).double()), RuntimeError, "router_weight must be torch.bfloat16"),
        "x 0-D": ((bf(1).reshape(()), bf(8, 64)), RuntimeError, "hidden_states must be 2-D"),
        "w 0-D": ((bf(2, 64), bf(1).reshape(())), RuntimeError, "router_weight must be 2-D"),
        "x 4-D": ((bf(1, 1, 2, 64), bf(8, 64)), RuntimeError, "hidden_states must be 2-D"),
        "K mismatch by one": ((bf(1, 7168), bf(896, 7169)), RuntimeError, "same K"),
        "K zero and N zero": ((bf(2, 0), bf(0, 0)), RuntimeError, "K must be at least 1"),
        "transposed weight": ((bf(2, 64), bf(64, 8)), RuntimeError, "same K"),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(bad_calls("cpu")))
def test_bad_input(device, case):
    args, error, message = bad_calls(device)[case]
    with pytest.raises(error, match=message):
        kimi_router_ops.ll_bf16_gemm(*args)
    # The process (and the CUDA context) is still fine.
    x, w = random_bf16(3, 64, device=device), random_bf16(8, 64, device=device)
    assert relative_error(kimi_router_ops.ll_bf16_gemm(x, w), reference(x, w)) <= 1e-5


@pytest.mark.parametrize("case", list(bad_calls("cpu")))
def test_a_compiled_bad_call_raises_the_same(case):
    """The fake kernel gives shapes only; the compiled graph's call raises the op's error."""
    args, error, message = bad_calls("cpu")[case]
    with pytest.raises(error, match=message):
        call_in("compiled", kimi_router_ops.ll_bf16_gemm, *args)


@requires_cuda
def test_device_mix_is_an_error():
    with pytest.raises(RuntimeError, match="must be on the same device"):
        kimi_router_ops.ll_bf16_gemm(random_bf16(2, 64, device="cuda"), random_bf16(8, 64))
    with pytest.raises(RuntimeError, match="must be on the same device"):
        kimi_router_ops.ll_bf16_gemm(random_bf16(2, 64), random_bf16(8, 64, device="cuda"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "case",
    ["huge N", "huge K", "requires grad", "offset views", "row-strided views", "transposed input", "expanded input", "M zero"],
)
def test_supported_edge_inputs(device, case):
    """Inputs that look odd but are supported: each gives the right answer."""
    bf = lambda *s: random_bf16(*s, device=device)  # noqa: E731
    x, w = {
        "huge N": lambda: (bf(1, 64), bf(65537, 64)),
        "huge K": lambda: (bf(2, 65541), bf(3, 65541)),
        "requires grad": lambda: (bf(2, 64).requires_grad_(), bf(8, 64).requires_grad_()),
        "offset views": lambda: (bf(3, 70)[:, 3:67], bf(9, 71)[:, 5:69]),
        "row-strided views": lambda: (bf(6, 64)[::2], bf(18, 64)[::3]),
        "transposed input": lambda: (bf(64, 3).t(), bf(64, 9).t()),
        "expanded input": lambda: (bf(1, 64).expand(5, 64), bf(9, 64)),
        "M zero": lambda: (bf(0, 64), bf(9, 64)),
    }[case]()
    out = kimi_router_ops.ll_bf16_gemm(x, w)
    assert out.shape == (x.shape[0], w.shape[0])
    if x.shape[0]:
        assert relative_error(out.detach(), reference(x.detach(), w.detach())) <= 1e-5


@pytest.mark.parametrize("op", ["ll_bf16_gemm", "moe_routing", "rms_norm"])
def test_a_bad_call_under_torch_compile_names_the_argument(op):
    """The fake kernels give shapes only: the call traces, and the op raises its own message
    when the compiled graph runs (docs/api.md)."""
    torch._dynamo.reset()
    calls = {
        "ll_bf16_gemm": (lambda: kimi_router_ops.ll_bf16_gemm(random_bf16(2, 64), random_bf16(16, 63)),
                         "ll_bf16_gemm: hidden_states .* must have the same K"),
        "moe_routing": (lambda: kimi_router_ops.moe_routing(torch.zeros(2, 16), None, 17),
                        r"moe_routing: top_k must be in \[1, experts in the kept groups=16\]"),
        "rms_norm": (lambda: kimi_router_ops.rms_norm(random_bf16(2, 64), random_bf16(63)),
                     r"rms_norm: weight must have shape \[K\]=\[64\]"),
    }
    call, message = calls[op]
    with pytest.raises(RuntimeError, match=message):
        call()
    with pytest.raises(RuntimeError, match=message):
        torch.compile(call, fullgraph=True)()
