#!/usr/bin/env bash
# Build a wheel of the current tree, install it into a fresh virtual environment that has
# torch and nothing else of ours (no nvidia-cutlass-dsl, no compiler needed), and run both
# ops on the CPU there. Run it where the package's own build works (after the README's
# install command); CI does.
set -euo pipefail
cd "$(dirname "$0")/.."
torch_version=$(python3 -c 'import torch; print(torch.__version__.split("+")[0])')
rm -rf dist
python3 -m pip wheel --no-build-isolation --no-deps -w dist . >/tmp/kimi-wheel.log 2>&1 \
  || { tail -40 /tmp/kimi-wheel.log; exit 1; }
wheel=$(ls dist/kimi_router_ops-*.whl)
echo "built $wheel ($(du -h "$wheel" | cut -f1))"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT  # a venv with torch is gigabytes: never leave one behind
venv=$scratch/venv
python3 -m venv "$venv"
"$venv/bin/pip" install -q "torch==$torch_version" "$wheel"
cd "$venv"  # away from the source tree, so the installed package is the one imported
"$venv/bin/python" - <<'PY'
import importlib.util

import torch

import kimi_router_ops

assert importlib.util.find_spec("cutlass") is None, "nvidia-cutlass-dsl must not be needed"
assert "site-packages" in kimi_router_ops.__file__, kimi_router_ops.__file__
x = torch.randn(3, 7168).to(torch.bfloat16)
w = torch.randn(256, 7168).to(torch.bfloat16)
logits = kimi_router_ops.ll_bf16_gemm(x, w)
ref = x.double() @ w.double().t()
assert ((logits.double() - ref).norm() / ref.norm()).item() < 1e-5
weights, ids, _ = kimi_router_ops.ll_bf16_router(x, w, torch.zeros(256), 8, 8, 4, True, 2.5)
assert ids.shape == (3, 8) and torch.allclose(weights.sum(-1), torch.full((3,), 2.5))
normed, summed = kimi_router_ops.fused_add_rms_norm(x, x, torch.ones(7168).to(torch.bfloat16))
assert normed.shape == x.shape and torch.equal(summed, (2 * x.float()).to(torch.bfloat16))
print(f"wheel ok: torch {torch.__version__}, {len(kimi_router_ops.compiled_kernels())} CUDA kernels linked")
PY
