"""Kimi-K3's front kernels once each, for Nsight Compute: router_and_projection at the given M
(its Projection kernel and the routing kernel), cuBLAS's projection, and a plain read of the
same 64 MB (torch.sum).

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis python3 tools/profile_front.py 1
"""

import sys

import torch
import torch.nn.functional as F

import kimi_router_ops

N, K, LATENT = 896, 7168, 3584


def main(m):
    bf = lambda *s: torch.randn(*s, device="cuda").to(torch.bfloat16)  # noqa: E731
    x, w, p = bf(m, K), bf(N, K) * 0.01, bf(LATENT, K) * 0.01
    both = torch.cat([w, p])
    calls = [lambda: kimi_router_ops.router_and_projection(x, w, p, None, 16), lambda: F.linear(x, p),
             lambda: both.sum()]
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
