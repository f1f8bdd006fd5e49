"""The producer -> router pair at M = 1 for ncu (tools/device_run.sh does not run it):

    ncu --clock-control none -k regex:RmsNorm --launch-skip 3 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats python3 tools/profile_pair.py kimi-k3

Warm-up and measured calls alike: rms_norm [1, K], then ll_bf16_gemm on a fresh weight copy.
"""

import sys

import torch

import kimi_router_ops
from kimi_router_ops.bench import SHAPES

n, k = SHAPES[sys.argv[1] if len(sys.argv) > 1 else "kimi-k3"]
x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
gamma = torch.rand(k, device="cuda").to(torch.bfloat16)
weights = [torch.randn(n, k, device="cuda").to(torch.bfloat16) for _ in range(6)]
torch.cuda.synchronize()
for w in weights:
    kimi_router_ops.ll_bf16_gemm(kimi_router_ops.rms_norm(x, gamma, 1e-6), w)
torch.cuda.synchronize()
