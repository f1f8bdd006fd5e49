"""Every kernel variant over odd shapes, for compute-sanitizer (tools/device_run.sh sanitize).

    compute-sanitizer --tool memcheck --error-exitcode 1 python3 tools/sanitize.py

Inputs are made on the CPU and copied over, so the GPU work under the tool is our kernels
plus copies; each result is checked against the CPU reference as well.
"""

import argparse
import sys

import torch

import kimi_router_ops
from kimi_router_ops import variants

N_LIST = (1, 3, 17, 895)
# Odd K for the scalar-load kernels; multiples of 8 (chunk and split tails) for all of them.
K_LIST = (1, 7, 8, 40, 1000, 7169, 7176)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="variants whose name starts with this")
    parser.add_argument("--shapes", nargs="+", help="N,K pairs instead of the full list")
    args = parser.parse_args()
    shapes = [(n, k) for n in N_LIST for k in K_LIST] + [(896, 7168)]
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split(",")) for s in args.shapes]
    calls = 0
    worst = 0.0
    for v in variants.VARIANTS:
        if not v.name.startswith(args.only):
            continue
        for m in sorted({1, v.m_hi}):
            for n, k in shapes:
                if k % 8 and 1 not in v.kernel.vecs:
                    continue  # 16-byte loads only (tests/test_cuda.py checks the error)
                x = torch.randn(m, k).to(torch.bfloat16)
                w = torch.randn(n, k).to(torch.bfloat16)
                # bf16 output changes only the final store: check it on a subset of shapes.
                out_dtypes = (torch.float32, torch.bfloat16) if n in (17, 896) else (torch.float32,)
                for out_dtype in out_dtypes:
                    out = kimi_router_ops.ll_bf16_gemm_with_variant(x.cuda(), w.cuda(), v.name, out_dtype)
                    ref = x.double() @ w.double().t()
                    err = ((out.cpu().double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
                    worst = max(worst, err if out_dtype == torch.float32 else err / 800)
                    calls += 1
    torch.cuda.synchronize()
    print(f"{calls} kernel calls, worst fp32 relative error {worst:.2e}")
    if worst > 1e-5:
        sys.exit(1)


if __name__ == "__main__":
    main()
