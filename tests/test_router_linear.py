"""RouterLinear and the model-shaped example."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import kimi_router_ops
from conftest import HAS_CUDA, random_bf16, reference, relative_error

DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("device", DEVICES)
def test_forward_flattens_and_restores_leading_dims(device):
    gate = kimi_router_ops.RouterLinear(64, 12, device=device)
    x = random_bf16(2, 3, 64, device=device)
    out = gate(x)
    assert out.shape == (2, 3, 12) and out.dtype == torch.float32
    assert relative_error(out.reshape(6, 12), reference(x.reshape(6, 64), gate.weight.detach())) <= 1e-5


def test_state_dict_of_a_linear_gate_loads_unchanged():
    linear = nn.Linear(64, 12, bias=False).to(torch.bfloat16)
    model = nn.Module()
    model.gate = linear
    target = nn.Module()
    target.gate = kimi_router_ops.RouterLinear(64, 12)
    target.load_state_dict(model.state_dict())
    assert torch.equal(target.gate.weight, linear.weight)
    assert list(target.state_dict()) == ["gate.weight"]


@pytest.mark.parametrize("device", DEVICES)
def test_from_linear_matches_the_linear(device):
    linear = nn.Linear(96, 20, bias=False, device=device)
    gate = kimi_router_ops.RouterLinear.from_linear(linear, out_dtype=torch.bfloat16)
    assert gate.weight.dtype == torch.bfloat16 and gate.weight.device == linear.weight.device
    x = random_bf16(5, 96, device=device)
    out = gate(x)
    assert out.dtype == torch.bfloat16
    assert relative_error(out, reference(x, linear.weight.detach().bfloat16())) <= 8e-3


def test_from_linear_refuses_a_bias():
    with pytest.raises(RuntimeError, match="no bias"):
        kimi_router_ops.RouterLinear.from_linear(nn.Linear(8, 4))


def test_gradients_reach_the_gate_weight():
    gate = kimi_router_ops.RouterLinear(32, 6)
    gate(random_bf16(3, 32)).sum().backward()
    assert gate.weight.grad is not None and gate.weight.grad.shape == (6, 32)


@pytest.mark.parametrize("model", ["kimi-k3", "kimi-k2"])
def test_example_runs_and_agrees(model):
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "moe_router.py"), "--model", model, "--tokens", "3", "--small"],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "same as eager: False" not in result.stdout and "torch.compile" in result.stdout


def test_bad_arguments_name_what_was_expected():
    with pytest.raises(RuntimeError, match="RouterLinear: out_dtype must be torch.float32 or torch.bfloat16, got torch.float16"):
        kimi_router_ops.RouterLinear(32, 6, out_dtype=torch.float16)
    with pytest.raises(RuntimeError, match="in_features and num_experts must be >= 1"):
        kimi_router_ops.RouterLinear(0, 6)
    gate = kimi_router_ops.RouterLinear(32, 6)
    with pytest.raises(RuntimeError, match=r"RouterLinear: x must have in_features=32 as its last dimension, got shape \[3, 31\]"):
        gate(random_bf16(3, 31))


def test_example_refuses_zero_tokens():
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "moe_router.py"), "--tokens", "0", "--small"],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 2 and "--tokens must be at least 1" in result.stderr, result.stderr[-2000:]


def test_main_job_on_the_cpu_says_its_times_are_no_results():
    result = subprocess.run([sys.executable, "-m", "kimi_router_ops", "--device", "cpu"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "CPU times, not results" in result.stdout and "speedup" not in result.stdout
