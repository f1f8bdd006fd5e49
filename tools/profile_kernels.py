"""One call of each named kernel variant, for Nsight Compute.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \\
        python3 tools/profile_kernels.py kimi-k3:8:mma8_t2c4w8u7 deepseek-v3:1:m1_prefetch_r4_t256

Each case is shape:M:variant (a row of tables.gemm.ALL_VARIANTS, cublas, or vllm0 / vllm1:
vLLM's ll_bf16 peer without / with its weight prefetch, where built, kimi_router_ops.bench.peers). Every case runs once
outside the profiled region (module load, allocator), then once inside it; ncu's default
cache control flushes L2 before each profiled kernel, so the weights come from HBM.
"""

import sys

import torch

import kimi_router_ops
from kimi_router_ops.bench import SHAPES


def gemm(x, w, variant):
    if variant.startswith("vllm"):
        return torch.ops.vllm_ll.gemm(x, w, int(variant[4:]))
    return kimi_router_ops.router_gemm_with_variant(x, w, variant)


def main(cases):
    if any(case.endswith((":vllm0", ":vllm1")) for case in cases):
        from kimi_router_ops.bench.peers import vllm_gate

        if vllm_gate() is None:
            raise SystemExit("vLLM's ll_bf16 peer is not built")
    calls = []
    for case in cases:
        shape, m, variant = case.split(":")
        n, k = SHAPES[shape]
        x = torch.randn(int(m), k, device="cuda").to(torch.bfloat16)
        w = torch.randn(n, k, device="cuda").to(torch.bfloat16)
        gemm(x, w, variant)
        calls.append((case, x, w, variant))
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for case, x, w, variant in calls:
        gemm(x, w, variant)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print("profiled, in order:", " ".join(case for case, *_ in calls))


if __name__ == "__main__":
    main(sys.argv[1:])
